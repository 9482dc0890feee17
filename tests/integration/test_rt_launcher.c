/* Stages started by a launcher: the executor starts the last stage first
 * through px_rt_launcher, reaches each worker at the address it announced
 * over authenticated TCP, and produces the same tokens as its own
 * workers; a stage killed through the launcher is seen by its health and
 * blamed, also when the launcher learns of its end only after its
 * neighbours saw the connection close; a stage holding another
 * deployment's secret is refused. */
#include "pipeline_fixture.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

static int setup(void **state)
{
    (void)state;
    return pipeline_fixture_setup(9);
}

static void make_spec(px_rt_pipeline_spec *spec)
{
    static const uint32_t cut[] = {0, 1, 3, 4};
    memset(spec, 0, sizeof *spec);
    spec->n_stages = 3;
    for (uint32_t i = 0; i < 3; i++) {
        px_rt_stage_spec *s = &spec->stages[i];
        s->layer_begin = cut[i];
        s->layer_end = cut[i + 1];
        s->embedding = i == 0;
        s->head = i == 2;
        snprintf(s->device, sizeof s->device, "n%u.emu-a", i);
        px_strlcpy(s->backend, "emu", sizeof s->backend);
        s->emulated = true;
        s->emu = (px_rt_emu_profile){.compute_slowdown = 1, .memory_slowdown = 1, .seed = i};
        px_strlcpy(s->emu.name, s->device, sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->emulated = true;
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

/* A launcher whose workers listen on 127.0.0.2 (not the executor's own
 * loopback address). */
static px_rt_local_launcher *new_launcher(void)
{
    px_err err;
    px_rt_local_launcher *l;
    px_assert_ok(px_rt_local_launcher_new(px_test_plexus_bin(), "127.0.0.2", 10000, &l, &err),
                 &err);
    return l;
}

typedef struct collected {
    int32_t tokens[2][64];
    uint32_t n[2];
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    collected *c = ud;
    if (prompt < 2 && c->n[prompt] < 64)
        c->tokens[prompt][c->n[prompt]++] = token;
}

static px_status generate(px_rt_executor *ex, collected *out, px_err *err)
{
    px_ir_model *ir;
    px_assert_ok(px_ir_model_open(synth_path, NULL, &ir, err), err);
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, err), err);
    const char *prompts[] = {"Once upon a time", "The cat sat"};
    memset(out, 0, sizeof *out);
    px_rt_generate_opts go = {.prompts = prompts,
                              .n_prompts = 2,
                              .max_new_tokens = 24,
                              .ignore_eos = true,
                              .on_token = on_token,
                              .ud = out};
    px_status st = px_rt_executor_generate(ex, t, &go, NULL, err);
    px_rt_tokenizer_free(t);
    px_ir_model_free(ir);
    return st;
}

static px_rt_executor_opts exec_opts(void)
{
    return (px_rt_executor_opts){.model_path = synth_path,
                                 .worker_bin = px_test_plexus_bin(),
                                 .n_threads = 1,
                                 .timeout_ms = 5000,
                                 .max_seqs = 2};
}

static void test_launched_stages_produce_the_executors_own_tokens(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    px_err err;
    px_rt_executor *ex;
    px_rt_executor_opts xo = exec_opts();
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    collected own, launched;
    px_assert_ok(generate(ex, &own, &err), &err);
    px_rt_executor_free(ex);
    assert_int_equal(own.n[0], 24);

    /* Workers on another address than the executor's own loopback one,
     * started by the launcher, reached where they announced. */
    px_rt_local_launcher *l = new_launcher();
    xo.launcher = px_rt_local_launcher_iface(l);
    xo.listen = "tcp:127.0.0.3:0";
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    for (uint32_t i = 0; i < 3; i++) {
        /* Not this executor's processes to signal. */
        assert_int_equal(px_rt_executor_stage_pid(ex, i), -1);
        assert_true(px_rt_local_launcher_pid(l, px_rt_executor_stage_handle(ex, i)) > 0);
        assert_int_equal(px_rt_executor_stage_health(ex, i, NULL, 0), PX_RT_STAGE_RUNNING);
    }
    px_assert_ok(generate(ex, &launched, &err), &err);
    assert_memory_equal(&own, &launched, sizeof own);
    /* One launcher serves a second executor while the first runs (a heal
     * loop's next pipeline starts before the last one ends). */
    px_rt_executor *ex2;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex2, &err), &err);
    px_assert_ok(generate(ex2, &launched, &err), &err);
    assert_memory_equal(&own, &launched, sizeof own);
    px_rt_executor_free(ex2);
    /* Freeing the executor ends its workers and releases their handles. */
    int pids[3];
    for (uint32_t i = 0; i < 3; i++)
        pids[i] = px_rt_local_launcher_pid(l, px_rt_executor_stage_handle(ex, i));
    px_rt_executor_free(ex);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(kill(pids[i], 0), -1);
        assert_int_equal(errno, ESRCH);
    }
    px_rt_local_launcher_free(l);
}

static void test_killed_launched_stage_is_seen_and_blamed(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    px_err err;
    px_rt_local_launcher *l = new_launcher();
    px_rt_executor_opts xo = exec_opts();
    xo.launcher = px_rt_local_launcher_iface(l);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    px_rt_fault f = {.kind = PX_RT_FAULT_KILL, .stage = 1};
    px_assert_ok(px_rt_executor_inject(ex, &f, &err), &err);
    char detail[96];
    assert_int_equal(px_rt_executor_stage_health(ex, 1, detail, sizeof detail), PX_RT_STAGE_KILLED);
    px_assert_contains(detail, "killed by signal 9");
    collected c;
    /* Found from the process's end, not by waiting out the step timeout
     * (that would be PX_ETIMEOUT and name no signal). */
    px_status st = generate(ex, &c, &err);
    assert_int_not_equal(st, PX_OK);
    assert_int_not_equal(st, PX_ETIMEOUT);
    px_assert_contains(err.msg, "stage 1 (n1.emu-a, emulated");
    px_assert_contains(err.msg, "killed by signal 9");
    assert_int_equal(px_rt_executor_culprit(ex), 1);
    px_rt_executor_free(ex);
    px_rt_local_launcher_free(l);
}

/* A launcher that hands one stage another secret than the executor's. */
typedef struct wrong_secret {
    const px_rt_launcher *inner;
    uint32_t stage;
    void *handle; /* the wrong stage's */
    px_rt_stage_state state_at_stop;
} wrong_secret;

static px_status ws_start(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                          const uint8_t *secret, size_t secret_len, char *addr, size_t cap,
                          void **handle, px_err *err)
{
    wrong_secret *w = ctx;
    uint8_t other[PX_RT_SECRET_MAX];
    memcpy(other, secret, secret_len);
    if (stage == w->stage)
        other[0] ^= 0x5a;
    px_status st =
        w->inner->start(w->inner->ctx, stage, argv, other, secret_len, addr, cap, handle, err);
    if (st == PX_OK && stage == w->stage)
        w->handle = *handle;
    return st;
}

static px_rt_stage_state ws_health(void *ctx, void *handle, int *code, char *detail, size_t cap)
{
    wrong_secret *w = ctx;
    return w->inner->health(w->inner->ctx, handle, code, detail, cap);
}

static void ws_stop(void *ctx, void *handle)
{
    wrong_secret *w = ctx;
    if (handle == w->handle) {
        int code;
        char detail[64];
        w->state_at_stop = w->inner->health(w->inner->ctx, handle, &code, detail, sizeof detail);
    }
    w->inner->stop(w->inner->ctx, handle);
}

static void test_stage_with_another_secret_is_refused(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    px_err err;
    px_rt_local_launcher *l = new_launcher();
    wrong_secret ws = {
        .inner = px_rt_local_launcher_iface(l), .stage = 2, .state_at_stop = PX_RT_STAGE_RUNNING};
    px_rt_launcher li = {.ctx = &ws, .start = ws_start, .health = ws_health, .stop = ws_stop};
    px_rt_executor_opts xo = exec_opts();
    xo.launcher = &li;
    px_rt_executor *ex = NULL;
    /* Refused by the hello (PX_EAUTH), not found by a timeout. */
    assert_int_equal(px_rt_executor_new(&spec, &xo, &ex, &err), PX_EAUTH);
    assert_null(ex);
    px_assert_contains(err.msg, "authentication failed");
    /* The refused stage had ended on its own before it was stopped. */
    assert_int_equal(ws.state_at_stop, PX_RT_STAGE_EXITED);
    px_rt_local_launcher_free(l);
}

static void test_launcher_refuses_a_command_line_that_is_not_a_workers(void **state)
{
    (void)state;
    px_err err;
    px_rt_local_launcher *l;
    assert_int_equal(px_rt_local_launcher_new(NULL, "example.org", 1000, &l, &err), PX_EINVAL);
    px_assert_contains(err.msg, "numeric IPv4");
    px_assert_ok(px_rt_local_launcher_new(px_test_plexus_bin(), "127.0.0.2", 1000, &l, &err), &err);
    const px_rt_launcher *li = px_rt_local_launcher_iface(l);
    px_rt_worker_argv av = {.argc = 3, .argv = {"plexus", "run", "--evil"}};
    char addr[128];
    void *h = (void *)1;
    assert_int_equal(li->start(li->ctx, 0, &av, NULL, 0, addr, sizeof addr, &h, &err), PX_EINVAL);
    px_assert_contains(err.msg, "not a worker's command line");
    assert_null(h);
    px_rt_worker_argv av2 = {.argc = 4, .argv = {"plexus", "worker", "--exec", "/bin/sh"}};
    assert_int_equal(li->start(li->ctx, 0, &av2, NULL, 0, addr, sizeof addr, &h, &err), PX_EINVAL);
    px_assert_contains(err.msg, "unexpected argument \"--exec\"");
    assert_null(h);
    px_rt_local_launcher_free(l);
}

/* A launcher that learns of a worker's end late, as a fleet does of a
 * node lost while its agent was between polls: until `known_at` the
 * health of stage `stage` says it runs, and lag_ns says how long that may
 * last. */
typedef struct late_news {
    const px_rt_launcher *inner;
    uint32_t stage;
    void *handle;
    uint64_t known_at; /* 0: health is current */
    int hidden;        /* readings that hid the end */
} late_news;

static px_status ln_start(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                          const uint8_t *secret, size_t secret_len, char *addr, size_t cap,
                          void **handle, px_err *err)
{
    late_news *n = ctx;
    px_status st =
        n->inner->start(n->inner->ctx, stage, argv, secret, secret_len, addr, cap, handle, err);
    if (st == PX_OK && stage == n->stage)
        n->handle = *handle;
    return st;
}

static px_rt_stage_state ln_health(void *ctx, void *handle, int *code, char *detail, size_t cap)
{
    late_news *n = ctx;
    px_rt_stage_state s = n->inner->health(n->inner->ctx, handle, code, detail, cap);
    if (handle == n->handle && s != PX_RT_STAGE_RUNNING && px_now_ns() < n->known_at) {
        n->hidden++;
        *code = 0;
        if (cap)
            detail[0] = 0;
        return PX_RT_STAGE_RUNNING;
    }
    return s;
}

static uint64_t ln_lag(void *ctx, void *handle)
{
    late_news *n = ctx;
    uint64_t now = px_now_ns();
    return handle == n->handle && now < n->known_at ? n->known_at - now : 0;
}

static void ln_stop(void *ctx, void *handle)
{
    late_news *n = ctx;
    n->inner->stop(n->inner->ctx, handle);
}

static void test_worker_whose_end_is_known_late_is_blamed_not_its_link(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    px_err err;
    px_rt_local_launcher *l = new_launcher();
    late_news n = {.inner = px_rt_local_launcher_iface(l), .stage = 1};
    px_rt_launcher li = {
        .ctx = &n, .start = ln_start, .health = ln_health, .stop = ln_stop, .lag_ns = ln_lag};
    px_rt_executor_opts xo = exec_opts();
    xo.launcher = &li;
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    /* Stage 1 dies outside the executor; its launcher hears of it a
     * second later, long after its neighbours saw the connection close. */
    int pid = px_rt_local_launcher_pid(l, n.handle);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    n.known_at = px_now_ns() + 1000000000ull;
    collected c;
    px_status st = generate(ex, &c, &err);
    assert_int_equal(st, PX_EPEER);
    px_assert_contains(err.msg, "stage 1 (n1.emu-a, emulated");
    px_assert_contains(err.msg, "killed by signal 9");
    assert_int_equal(px_rt_executor_culprit(ex), 1);
    assert_true(n.hidden > 0);
    px_rt_executor_free(ex);
    px_rt_local_launcher_free(l);
}

/* A launched worker that fails after it listened (here: the emulated
 * device of a one-stage pipeline cannot hold its layers) says why
 * through its launcher: the executor's error carries the worker's own
 * message, which is in the log of another machine when a fleet's agent
 * launched it. */
static void test_launched_stage_that_fails_is_named_with_its_own_message(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    make_spec(&spec);
    spec.n_stages = 1;
    spec.stages[0].layer_end = 4;
    spec.stages[0].head = true;
    spec.stages[0].emu.memory_bytes = 4096;
    px_err err;
    px_rt_local_launcher *l = new_launcher();
    px_rt_executor_opts xo = exec_opts();
    xo.launcher = px_rt_local_launcher_iface(l);
    px_rt_executor *ex = NULL;
    assert_int_equal(px_rt_executor_new(&spec, &xo, &ex, &err), PX_EPEER);
    assert_null(ex);
    px_assert_contains(err.msg, "stage 0 (n0.emu-a, emulated, launched");
    px_assert_contains(err.msg, "exited with status 1: ");
    px_assert_contains(err.msg, "emu device n0.emu-a (emulated): cannot allocate");
    px_assert_contains(err.msg, "while the pipeline was starting");
    assert_null(strstr(err.msg, "its message is above"));
    px_rt_local_launcher_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launched_stages_produce_the_executors_own_tokens),
        cmocka_unit_test(test_killed_launched_stage_is_seen_and_blamed),
        cmocka_unit_test(test_stage_with_another_secret_is_refused),
        cmocka_unit_test(test_worker_whose_end_is_known_late_is_blamed_not_its_link),
        cmocka_unit_test(test_launcher_refuses_a_command_line_that_is_not_a_workers),
        cmocka_unit_test(test_launched_stage_that_fails_is_named_with_its_own_message),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
