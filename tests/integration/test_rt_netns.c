/*
 * Stage links across real network boundaries: the three stage workers of
 * stories260K run in three network namespaces (tests/support/netns.h),
 * each started by a local launcher listening on its namespace's veth
 * address, the executor in the hub; every hop crosses a veth pair and the
 * bridge, never a loopback.  The greedy tokens equal those of the
 * executor's own workers on this machine's loopback.  A node whose link
 * goes down mid-run is blamed within the executor's timeout, and the
 * pipeline runs again, with the same tokens, once the link is back, and
 * over a delayed, lossy link where tc's netem is available.
 * Skips, saying why, where namespaces cannot be made (not root, no
 * CAP_NET_ADMIN, no `ip`) or the shared model is absent.
 */
#include "px_test.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "netns.h"
#include "plexus/ir.h"
#include "plexus/rt.h"
#include "px_slowdown.h"

#define N_NODES  3
#define N_TOKENS 24

static px_netns net;
static char *model_path;
static uint32_t n_layers;

/* ---- a launcher that starts stage i in namespace i ---- */

typedef struct ns_handle {
    int node;
    void *inner;
} ns_handle;

typedef struct ns_launcher {
    px_rt_local_launcher *local[N_NODES];
    px_rt_launcher iface;
    int started_in[N_NODES]; /* the node each stage was started in */
    pid_t pid[N_NODES];      /* its worker */
} ns_launcher;

static px_status nl_start(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                          const uint8_t *secret, size_t secret_len, char *addr, size_t cap,
                          void **handle, px_err *err)
{
    ns_launcher *l = ctx;
    int node = (int)(stage % N_NODES);
    *handle = NULL;
    ns_handle *h = calloc(1, sizeof *h);
    if (!h)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    h->node = node;
    /* The local launcher forks on this thread: its worker is born in the
     * namespace this thread is in. */
    if (px_netns_join(&net, node) != 0) {
        free(h);
        return px_err_set(err, PX_EIO, "setns into %s: %s", net.node[node], strerror(errno));
    }
    const px_rt_launcher *in = px_rt_local_launcher_iface(l->local[node]);
    px_status st = in->start(in->ctx, stage, argv, secret, secret_len, addr, cap, &h->inner, err);
    if (px_netns_join(&net, -1) != 0)
        fail_msg("cannot return to the hub namespace: %s", strerror(errno));
    if (st != PX_OK) {
        free(h);
        return st;
    }
    l->started_in[stage % N_NODES] = node;
    l->pid[stage % N_NODES] = px_rt_local_launcher_pid(l->local[node], h->inner);
    *handle = h;
    return PX_OK;
}

static px_rt_stage_state nl_health(void *ctx, void *handle, int *code, char *detail, size_t cap)
{
    ns_launcher *l = ctx;
    ns_handle *h = handle;
    const px_rt_launcher *in = px_rt_local_launcher_iface(l->local[h->node]);
    return in->health(in->ctx, h->inner, code, detail, cap);
}

static px_status nl_signal(void *ctx, void *handle, int sig, px_err *err)
{
    ns_launcher *l = ctx;
    ns_handle *h = handle;
    const px_rt_launcher *in = px_rt_local_launcher_iface(l->local[h->node]);
    return in->signal(in->ctx, h->inner, sig, err);
}

static void nl_stop(void *ctx, void *handle)
{
    ns_launcher *l = ctx;
    ns_handle *h = handle;
    const px_rt_launcher *in = px_rt_local_launcher_iface(l->local[h->node]);
    in->stop(in->ctx, h->inner);
    free(h);
}

static void nl_new(ns_launcher *l)
{
    memset(l, 0, sizeof *l);
    px_err err;
    for (int i = 0; i < N_NODES; i++)
        px_assert_ok(px_rt_local_launcher_new(px_test_plexus_bin(), net.addr[i],
                                              (int)(20000 * PX_TEST_SLOWDOWN), &l->local[i], &err),
                     &err);
    l->iface = (px_rt_launcher){
        .ctx = l, .start = nl_start, .health = nl_health, .signal = nl_signal, .stop = nl_stop};
}

static void nl_free(ns_launcher *l)
{
    for (int i = 0; i < N_NODES; i++)
        px_rt_local_launcher_free(l->local[i]);
}

/* ---- the pipeline ---- */

static void make_spec(px_rt_pipeline_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_stages = N_NODES;
    for (uint32_t i = 0; i < N_NODES; i++) {
        px_rt_stage_spec *s = &spec->stages[i];
        s->layer_begin = n_layers * i / N_NODES;
        s->layer_end = n_layers * (i + 1) / N_NODES;
        s->embedding = i == 0;
        s->head = i == N_NODES - 1;
        snprintf(s->device, sizeof s->device, "n%u.cpu", i);
        px_strlcpy(s->backend, "cpu", sizeof s->backend);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

typedef struct collected {
    int32_t tokens[2][N_TOKENS];
    uint32_t n[2];
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    collected *c = ud;
    if (prompt < 2 && c->n[prompt] < N_TOKENS)
        c->tokens[prompt][c->n[prompt]++] = token;
}

static px_status generate(px_rt_executor *ex, collected *out, px_err *err)
{
    px_ir_model *ir;
    px_assert_ok(px_ir_model_open(model_path, NULL, &ir, err), err);
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, err), err);
    const char *prompts[] = {"Once upon a time", "The little dog"};
    memset(out, 0, sizeof *out);
    px_rt_generate_opts go = {.prompts = prompts,
                              .n_prompts = 2,
                              .max_new_tokens = N_TOKENS,
                              .ignore_eos = true,
                              .on_token = on_token,
                              .ud = out};
    px_status st = px_rt_executor_generate(ex, t, &go, NULL, err);
    px_rt_tokenizer_free(t);
    px_ir_model_free(ir);
    return st;
}

static px_rt_executor_opts exec_opts(int timeout_ms)
{
    return (px_rt_executor_opts){.model_path = model_path,
                                 .worker_bin = px_test_plexus_bin(),
                                 .n_threads = 1,
                                 .timeout_ms = timeout_ms,
                                 .max_seqs = 2};
}

/* Whether pid runs inside node i's namespace. */
static bool runs_in(int node, pid_t pid)
{
    pid_t pids[64];
    int n = px_netns_pids(&net, node, pids, 64);
    for (int k = 0; k < n; k++)
        if (pids[k] == pid)
            return true;
    return false;
}

/* Sets up the namespaces once, or skips saying why they cannot be made. */
static void need_namespaces(void)
{
    static int ready; /* 0 not tried, 1 up, -1 impossible */
    if (ready == 0) {
        ready = px_netns_setup(&net, N_NODES) ? 1 : -1;
        if (ready > 0 && !px_netns_enter_hub(&net))
            fail_msg("%s", net.why);
    }
    if (ready < 0) {
        print_message("skipped: %s\n", net.why);
        skip();
    }
}

static void test_stages_in_three_namespaces_produce_the_local_tokens(void **state)
{
    (void)state;
    free(px_test_require_shared_model("stories260K.gguf"));
    need_namespaces();
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    px_err err;

    /* The reference: the executor's own workers, on this namespace's
     * loopback (the hub's). */
    px_rt_executor *ex;
    px_rt_executor_opts xo = exec_opts((int)(10000 * PX_TEST_SLOWDOWN));
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    collected local, remote;
    px_assert_ok(generate(ex, &local, &err), &err);
    px_rt_executor_free(ex);
    assert_int_equal(local.n[0], N_TOKENS);
    assert_int_equal(local.n[1], N_TOKENS);

    /* The stages in three namespaces, the last one connecting back to the
     * hub's address on the bridge. */
    ns_launcher l;
    nl_new(&l);
    xo.launcher = &l.iface;
    char back[40];
    snprintf(back, sizeof back, "tcp:%s:0", net.hub_addr);
    xo.listen = back;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    for (int i = 0; i < N_NODES; i++) {
        assert_int_equal(l.started_in[i], i);
        assert_true(l.pid[i] > 0);
        if (!runs_in(i, l.pid[i]))
            fail_msg("the worker of stage %d (pid %d) is not in %s", i, (int)l.pid[i], net.node[i]);
        assert_int_equal(px_rt_executor_stage_health(ex, (uint32_t)i, NULL, 0),
                         PX_RT_STAGE_RUNNING);
    }
    px_assert_ok(generate(ex, &remote, &err), &err);
    assert_memory_equal(&local, &remote, sizeof local);

    /* Node 1 cut off: the next run fails within the timeout, and says
     * which stage; no token of a wrong state is produced. */
    if (!px_netns_link(&net, 1, false))
        fail_msg("%s", net.why);
    collected cut;
    px_status st = generate(ex, &cut, &err);
    assert_int_not_equal(st, PX_OK);
    print_message("with node 1 cut off: %s\n", err.msg);
    px_assert_contains(err.msg, "stage");
    px_rt_executor_free(ex);

    /* The link back: a new pipeline over the same namespaces gives the
     * same tokens. */
    if (!px_netns_link(&net, 1, true))
        fail_msg("%s", net.why);
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    px_assert_ok(generate(ex, &remote, &err), &err);
    assert_memory_equal(&local, &remote, sizeof local);

    /* A slow, lossy link (netem on node 0's interface, where the kernel
     * has it) changes the timing, never the tokens. */
    if (px_netns_shape(&net, 0, "delay 3ms 1ms loss 1%")) {
        px_assert_ok(generate(ex, &remote, &err), &err);
        assert_memory_equal(&local, &remote, sizeof local);
        if (!px_netns_shape(&net, 0, NULL))
            fail_msg("%s", net.why);
    } else {
        print_message("the run over a shaped link is left out: %s\n", net.why);
    }
    px_rt_executor_free(ex);
    nl_free(&l);
}

static int setup(void **state)
{
    (void)state;
    model_path = px_test_shared_model("stories260K.gguf");
    if (model_path && access(model_path, R_OK) == 0) {
        px_ir_model *ir;
        px_err err;
        if (px_ir_model_open(model_path, NULL, &ir, &err) != PX_OK) {
            fprintf(stderr, "%s: %s\n", model_path, err.msg);
            return -1;
        }
        n_layers = px_ir_model_hparams(ir)->n_layers;
        px_ir_model_free(ir);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    px_netns_teardown(&net);
    free(model_path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_in_three_namespaces_produce_the_local_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
