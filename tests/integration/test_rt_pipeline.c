/* Pipelined execution: plans split into 2, 3 and 4 worker processes (cpu
 * and emu devices mixed) produce output bitwise identical to one process
 * with the same kernels, on the real tiny model and on a synthetic one;
 * several prompts decode together; a worker killed mid-generation, a
 * truncated frame, a model that does not match the plan and a prompt
 * longer than the context each give a clear error within seconds;
 * `plexus run` plans on the emu-small inventory and reports predicted
 * against observed; and the executor's receiving thread measures its own
 * wait for a core on the hop back. */
#include "pipeline_fixture.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/rt.h"
#include "rt/executor_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define LIMIT_S 10.0

static int setup(void **state)
{
    (void)state;
    return pipeline_fixture_setup(5);
}

typedef struct collected {
    int32_t tokens[8][256];
    uint32_t n[8];
    int kill_pid; /* killed after kill_after tokens of prompt 0 */
    uint32_t kill_after;
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    collected *c = ud;
    if (prompt < 8 && c->n[prompt] < 256)
        c->tokens[prompt][c->n[prompt]++] = token;
    if (c->kill_pid > 0 && prompt == 0 && c->n[0] == c->kill_after) {
        kill(c->kill_pid, SIGKILL);
        c->kill_pid = 0;
    }
}

static px_rt_tokenizer *tokenizer_of(const char *path)
{
    px_ir_model *ir;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &ir, &err), &err);
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, &err), &err);
    px_ir_model_free(ir);
    return t;
}

/* Single process: px_rt_generate on the cpu backend. */
static void run_single(const char *path, const char *const *prompts, uint32_t n, uint32_t n_new,
                       float temp, collected *out)
{
    px_err err;
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    px_rt_tokenizer *t = tokenizer_of(path);
    px_rt_session_opts so = {.n_threads = 1, .max_seqs = n};
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    memset(out, 0, sizeof *out);
    px_rt_generate_opts go = {.prompts = prompts,
                              .n_prompts = n,
                              .max_new_tokens = n_new,
                              .sampling = {.temperature = temp, .top_p = 0.9f, .seed = 3},
                              .on_token = on_token,
                              .ud = out};
    px_assert_ok(px_rt_generate(s, t, &go, NULL, &err), &err);
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
}

/* A plan over the given cuts: stage i holds blocks [cut[i], cut[i+1]);
 * backends alternate cpu, emu, cpu, emu... */
static void make_spec(uint32_t n_stages, const uint32_t *cut, px_rt_pipeline_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_stages = n_stages;
    for (uint32_t i = 0; i < n_stages; i++) {
        px_rt_stage_spec *s = &spec->stages[i];
        s->layer_begin = cut[i];
        s->layer_end = cut[i + 1];
        s->embedding = i == 0;
        s->head = i == n_stages - 1;
        bool emu = i % 2 == 1;
        snprintf(s->device, sizeof s->device, "local.%s%u", emu ? "emu" : "cpu", i);
        px_strlcpy(s->backend, emu ? "emu" : "cpu", sizeof s->backend);
        s->emulated = emu;
        s->emu = (px_rt_emu_profile){
            .compute_slowdown = 1.5, .memory_slowdown = 1.2, .jitter = 0.1, .seed = i};
        px_strlcpy(s->emu.name, s->device, sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

static px_rt_executor_opts exec_opts(const char *path, uint32_t max_seqs)
{
    return (px_rt_executor_opts){.model_path = path,
                                 .worker_bin = px_test_plexus_bin(),
                                 .n_threads = 1,
                                 .timeout_ms = 5000 * PX_TEST_SLOWDOWN,
                                 .max_seqs = max_seqs};
}

static void run_pipeline(const char *path, const px_rt_pipeline_spec *spec,
                         const char *const *prompts, uint32_t n, uint32_t n_new, float temp,
                         px_rt_transport transport, collected *out)
{
    px_err err;
    px_rt_executor_opts xo = exec_opts(path, n);
    xo.transport = transport;
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(spec, &xo, &ex, &err), &err);
    for (uint32_t i = 0; i < spec->n_stages; i++) {
        const px_rt_device_props *p = px_rt_executor_stage_device(ex, i);
        assert_non_null(p);
        assert_int_equal(p->emulated, spec->stages[i].emulated);
        assert_true(px_rt_executor_stage_pid(ex, i) > 0);
    }
    px_rt_tokenizer *t = tokenizer_of(path);
    memset(out, 0, sizeof *out);
    px_rt_generate_opts go = {.prompts = prompts,
                              .n_prompts = n,
                              .max_new_tokens = n_new,
                              .sampling = {.temperature = temp, .top_p = 0.9f, .seed = 3},
                              .on_token = on_token,
                              .ud = out};
    px_rt_pipeline_stats st;
    px_assert_ok(px_rt_executor_generate(ex, t, &go, &st, &err), &err);
    /* Telemetry came back from every stage. */
    for (uint32_t i = 0; i < spec->n_stages; i++) {
        assert_true(st.stages[i].prefill_steps > 0);
        assert_true(st.stages[i].n_ops > 0);
        if (st.gen.decode_tokens)
            assert_true(st.stages[i].decode_ns > 0);
    }
    px_strbuf sb = PX_STRBUF_INIT;
    px_assert_ok(px_rt_pipeline_report(spec, ex, &st, &sb), NULL);
    px_assert_contains(sb.buf, "end to end");
    if (spec->n_stages > 1)
        px_assert_contains(sb.buf, "emulated");
    px_strbuf_release(&sb);
    px_rt_pipeline_stats_release(&st);
    /* The pipeline serves another generation with the same slots. */
    collected again;
    memset(&again, 0, sizeof again);
    go.ud = &again;
    px_assert_ok(px_rt_executor_generate(ex, t, &go, NULL, &err), &err);
    assert_memory_equal(again.tokens, out->tokens, sizeof out->tokens);
    px_rt_tokenizer_free(t);
    px_rt_executor_free(ex);
}

static void expect_same(const collected *a, const collected *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(a->n[i], b->n[i]);
        assert_memory_equal(a->tokens[i], b->tokens[i], a->n[i] * sizeof(int32_t));
    }
}

static void check_splits(const char *path, uint32_t n_layers, float temp)
{
    const char *prompts[] = {"Once upon a time", "The cat sat", "A big red ball"};
    collected single, piped;
    run_single(path, prompts, 1, 40, temp, &single);
    assert_true(single.n[0] > 0);
    uint32_t cuts[3][5] = {
        {0, n_layers / 2, n_layers}, {0, 1, n_layers - 1, n_layers}, {0, 1, 2, 3, n_layers}};
    for (uint32_t k = 0; k < 3; k++) {
        px_rt_pipeline_spec spec;
        make_spec(k + 2, cuts[k], &spec);
        run_pipeline(path, &spec, prompts, 1, 40, temp, PX_RT_TRANSPORT_UNIX, &piped);
        expect_same(&single, &piped, 1);
    }
    /* Several prompts decode together, over TCP too. */
    run_single(path, prompts, 3, 24, temp, &single);
    px_rt_pipeline_spec spec;
    make_spec(3, cuts[1], &spec);
    run_pipeline(path, &spec, prompts, 3, 24, temp, PX_RT_TRANSPORT_TCP, &piped);
    expect_same(&single, &piped, 3);
}

static void test_real_model_split_matches_one_process_bitwise(void **state)
{
    (void)state;
    char *path = px_test_require_shared_model("stories260K.gguf");
    check_splits(path, 5, 0);    /* greedy */
    check_splits(path, 5, 0.8f); /* sampled: any difference in logits shows */
    free(path);
}

static void test_synthetic_model_split_matches_one_process_bitwise(void **state)
{
    (void)state;
    check_splits(synth_path, 4, 0);
}

static double since(uint64_t t0)
{
    return (double)(px_now_ns() - t0) / 1e9;
}

static void test_killed_worker_is_named_within_the_timeout(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 1, 3, 4};
    px_rt_pipeline_spec spec;
    make_spec(3, cut, &spec);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    px_rt_tokenizer *t = tokenizer_of(synth_path);
    collected c;
    memset(&c, 0, sizeof c);
    c.kill_pid = px_rt_executor_stage_pid(ex, 1);
    c.kill_after = 5;
    const char *prompt = "Once upon a time";
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = 100,
                              .ignore_eos = true,
                              .on_token = on_token,
                              .ud = &c};
    uint64_t t0 = px_now_ns();
    assert_int_not_equal(px_rt_executor_generate(ex, t, &go, NULL, &err), PX_OK);
    assert_true(since(t0) < LIMIT_S);
    px_assert_contains(err.msg, "stage 1 (local.emu1, emulated, pid");
    px_assert_contains(err.msg, "killed by signal 9");
    /* A failed pipeline says so rather than hanging. */
    assert_int_equal(px_rt_executor_generate(ex, t, &go, NULL, &err), PX_ESTATE);
    px_rt_executor_free(ex);
    px_rt_tokenizer_free(t);
}

static void test_stopped_worker_is_named_within_the_timeout(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 1, 3, 4};
    px_rt_pipeline_spec spec;
    make_spec(3, cut, &spec);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    /* The set-up keeps the transport's generous timeout (workers start
     * slowly on a loaded machine); the wait for a step is the short one. */
    px_rt_executor_set_step_timeout(ex, 1500);
    px_rt_tokenizer *t = tokenizer_of(synth_path);
    int pid = px_rt_executor_stage_pid(ex, 1);
    kill(pid, SIGSTOP);
    const char *prompt = "Once upon a time";
    px_rt_generate_opts go = {.prompts = &prompt, .n_prompts = 1, .max_new_tokens = 10};
    uint64_t t0 = px_now_ns();
    assert_int_equal(px_rt_executor_generate(ex, t, &go, NULL, &err), PX_ETIMEOUT);
    assert_true(since(t0) < LIMIT_S);
    px_assert_contains(err.msg, "stage 1 (local.emu1, emulated, pid");
    px_assert_contains(err.msg, "is stopped");
    kill(pid, SIGCONT);
    px_rt_executor_free(ex);
    px_rt_tokenizer_free(t);
}

static void test_truncated_frame_is_reported_by_the_stage_that_got_it(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 2, 4};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    px_rt_link_faults f = {.cut_mid_frame = true};
    px_rt_executor_set_faults(ex, &f);
    px_rt_tokenizer *t = tokenizer_of(synth_path);
    const char *prompt = "Once upon a time";
    px_rt_generate_opts go = {.prompts = &prompt, .n_prompts = 1, .max_new_tokens = 10};
    uint64_t t0 = px_now_ns();
    assert_int_not_equal(px_rt_executor_generate(ex, t, &go, NULL, &err), PX_OK);
    assert_true(since(t0) < LIMIT_S);
    px_assert_contains(err.msg, "stage 0 (local.cpu0, pid");
    px_assert_contains(err.msg, "truncated frame from the executor");
    px_rt_executor_free(ex);
    px_rt_tokenizer_free(t);
}

static void test_model_that_does_not_match_the_plan_is_refused(void **state)
{
    (void)state;
    /* The plan's digest names another file. */
    uint32_t cut[] = {0, 2, 4};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_strlcpy(spec.model_id,
               "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
               sizeof spec.model_id);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex = NULL;
    uint64_t t0 = px_now_ns();
    assert_int_equal(px_rt_executor_new(&spec, &xo, &ex, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "is not the model the plan was made for");
    assert_null(ex);
    /* Its blocks do not match. */
    uint32_t cut6[] = {0, 3, 6};
    make_spec(2, cut6, &spec);
    assert_int_equal(px_rt_executor_new(&spec, &xo, &ex, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "has 4 blocks");
    /* A plan document with a gap between stages. */
    json_t *plan;
    const char *doc = "{\"schema\": \"plexus.plan/1\", \"stages\": ["
                      "{\"layers\": {\"first\": 0, \"last\": 1}, \"backend\": \"cpu\"},"
                      "{\"layers\": {\"first\": 3, \"last\": 3}, \"backend\": \"cpu\"}]}";
    px_assert_ok(px_json_parse(doc, strlen(doc), "plan.json", NULL, &plan, &err), &err);
    assert_int_equal(px_rt_pipeline_spec_from_plan(plan, NULL, "plan.json", &spec, &err),
                     PX_EVALIDATE);
    px_assert_contains(err.msg, "plan.json: /stages/1: starts at block 3");
    json_decref(plan);
    /* An emu stage without a profile. */
    doc = "{\"stages\": [{\"layers\": {\"first\": 0, \"last\": 3}, \"backend\": \"emu\", "
          "\"devices\": [\"n.e\"]}]}";
    px_assert_ok(px_json_parse(doc, strlen(doc), "plan.json", NULL, &plan, &err), &err);
    assert_int_equal(px_rt_pipeline_spec_from_plan(plan, NULL, "plan.json", &spec, &err),
                     PX_EVALIDATE);
    px_assert_contains(err.msg, "no emulation profile");
    json_decref(plan);
    assert_true(since(t0) < LIMIT_S);
}

/* The pipeline spec of a one-stage plan over blocks 0..3 whose stage's other members are
 * `stage` (JSON members), read against the inventory g (may be NULL). */
static void one_stage_spec(const char *stage, const px_hw_graph *g, px_rt_pipeline_spec *spec)
{
    char *doc = px_asprintf("{\"stages\": [{\"layers\": {\"first\": 0, \"last\": 3}, %s}]}", stage);
    px_err err;
    json_t *plan;
    px_assert_ok(px_json_parse(doc, strlen(doc), "plan.json", NULL, &plan, &err), &err);
    px_assert_ok(px_rt_pipeline_spec_from_plan(plan, g, "plan.json", spec, &err), &err);
    json_decref(plan);
    free(doc);
}

/* A stage on an emulated device whose backend needs the real hardware (an L4 of an emulated
 * inventory: cuda) runs on the emu backend, as emulated: the device's memory, no slowdown
 * without a profile of its own; so does a plan's stage marked emulated without an inventory. */
static void test_stage_on_an_emulated_gpu_runs_on_the_emu_backend(void **state)
{
    (void)state;
    const char *inv =
        "{\"schema\": \"plexus.inventory/1\", \"name\": \"e\", \"emulated\": true, \"nodes\": "
        "[{\"id\": \"n\", \"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": "
        "\"64 GiB\", \"bandwidth\": \"100 GB/s\"}], \"devices\": [{\"id\": \"gpu0\", \"class\": "
        "\"gpu\", \"vendor\": \"nvidia\", \"model\": \"L4\", \"catalog\": \"nvidia-l4\", "
        "\"capability\": \"8.9\"}]}]}";
    px_err err;
    px_hw_graph *g = NULL;
    px_assert_ok(px_hw_graph_from_json(inv, strlen(inv), "e.json", NULL, &g, NULL, &err), &err);
    px_rt_pipeline_spec spec;
    one_stage_spec("\"backend\": \"cuda\", \"devices\": [\"n.gpu0\"]", g, &spec);
    assert_string_equal(spec.stages[0].backend, "emu");
    assert_true(spec.stages[0].emulated && spec.emulated);
    assert_true(spec.stages[0].emu.compute_slowdown == 1 &&
                spec.stages[0].emu.memory_slowdown == 1);
    assert_true(spec.stages[0].emu.memory_bytes > 20e9 && spec.stages[0].emu.memory_bytes < 30e9);
    one_stage_spec("\"backend\": \"cuda\", \"emulated\": true, \"devices\": [\"n.gpu0\"]", NULL,
                   &spec);
    assert_string_equal(spec.stages[0].backend, "emu");
    assert_int_equal(spec.stages[0].emu.memory_bytes, 0);
    /* A real one keeps its backend. */
    one_stage_spec("\"backend\": \"cuda\", \"devices\": [\"n.gpu0\"]", NULL, &spec);
    assert_string_equal(spec.stages[0].backend, "cuda");
    assert_false(spec.stages[0].emulated);
    px_hw_graph_free(g);
}

static void test_prompt_longer_than_the_context_is_refused(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 2, 4};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    xo.context = 16;
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    px_rt_tokenizer *t = tokenizer_of(synth_path);
    const char *prompt = "Once upon a time there was a very long prompt that goes on and on "
                         "well past the sixteen positions of this context";
    px_rt_generate_opts go = {.prompts = &prompt, .n_prompts = 1, .max_new_tokens = 10};
    uint64_t t0 = px_now_ns();
    assert_int_equal(px_rt_executor_generate(ex, t, &go, NULL, &err), PX_ELIMIT);
    assert_true(since(t0) < LIMIT_S);
    px_assert_contains(err.msg, "prompt 1 is");
    px_assert_contains(err.msg, "the context holds 16");
    /* The pipeline is still usable with a short prompt. */
    const char *short_prompt = "Hi";
    go.prompts = &short_prompt;
    px_assert_ok(px_rt_executor_generate(ex, t, &go, NULL, &err), &err);
    px_rt_executor_free(ex);
    px_rt_tokenizer_free(t);
}

static void test_run_command_plans_on_emu_small_and_reports(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *argv[] = {
        (char *)px_test_plexus_bin(), "run", "--model", model, "--inventory", inv, "--prompt",
        "Once upon a time",           "-n",  "20",      NULL};
    char *out = NULL, *errs = NULL;
    int rc = px_test_run(argv, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    px_assert_contains(out, "Once upon a time, there was a little girl named Lily.");
    px_assert_contains(out, "end to end: time per token predicted");
    px_assert_contains(out, "decode/token predicted");
    px_assert_contains(out, "tokens/s");
    if (strstr(out, "emu-a") || strstr(out, "emu-b"))
        px_assert_contains(out, "emulated");
    free(out);
    free(errs);

    /* A hand-written plan, JSON output, TCP. */
    char *plan = px_asprintf("%s/plan2.json", px_test_tmpdir());
    const char *doc = "{\"schema\": \"plexus.plan/1\", \"id\": \"hand\", \"stages\": ["
                      "{\"devices\": [\"local.cpu0\"], \"layers\": {\"first\": 0, \"last\": 2}},"
                      "{\"devices\": [\"local.emu-b\"], \"layers\": {\"first\": 3, \"last\": 4}}"
                      "]}";
    px_err err;
    px_assert_ok(px_write_file(plan, doc, strlen(doc), &err), &err);
    char *argv2[] = {(char *)px_test_plexus_bin(),
                     "run",
                     "--model",
                     model,
                     "--plan",
                     plan,
                     "--inventory",
                     inv,
                     "--prompt",
                     "Once upon a time",
                     "-n",
                     "8",
                     "--transport",
                     "tcp",
                     "-o",
                     "json",
                     NULL};
    rc = px_test_run(argv2, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    px_assert_contains(out, "\"schema\": \"plexus.run/1\"");
    px_assert_contains(out, "\"emulated\": true");
    px_assert_contains(out, "(emulated)");
    free(out);
    free(errs);

    /* Prompts from a file decode together. */
    const char *prompts_text = "Once upon a time\n\nThe little dog\n";
    char *prompts = px_asprintf("%s/prompts.txt", px_test_tmpdir());
    px_assert_ok(px_write_file(prompts, prompts_text, strlen(prompts_text), &err), &err);
    char *argv3[] = {(char *)px_test_plexus_bin(),
                     "run",
                     "--model",
                     model,
                     "--plan",
                     plan,
                     "--inventory",
                     inv,
                     "--prompts",
                     prompts,
                     "-n",
                     "6",
                     NULL};
    rc = px_test_run(argv3, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    px_assert_contains(out, "--- prompt 1 ---\nOnce upon a time");
    px_assert_contains(out, "--- prompt 2 ---\nThe little dog");
    px_assert_contains(out, "local.emu-b (emu, emulated)");
    free(out);
    free(errs);
    free(prompts);
    free(plan);
    free(inv);
    free(model);
}

/* Two emulated GPUs joined by NVLink, slow in compute: the planner's best
 * stage for the tiny model would be a tensor-parallel pair, which the
 * stage workers cannot run.  `plexus run` plans one device per stage. */
static void test_run_command_plans_one_device_per_stage(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_asprintf("%s/nvlink-pair.json", px_test_tmpdir());
#define GPU(id)                                                                                    \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"backend\": \"emu\", "      \
    "\"emulated\": true, \"emu\": {\"compute_slowdown\": 3, \"seed\": 1}, \"compute\": {\"f32\": " \
    "\"10 GFLOP/s\"}, \"memory\": [{\"id\": "                                                      \
    "\"hbm\", \"kind\": \"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"
    const char *doc =
        "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"local\", \"devices\": [" GPU(
            "gpu0") ", " GPU("gpu1") "]}], \"links\": [{\"from\": \"local.gpu0\", \"to\": "
                                     "\"local.gpu1\", "
                                     "\"kind\": \"nvlink4\", \"bandwidth\": \"90 GB/s\", "
                                     "\"latency\": \"1 us\", \"bidirectional\": true}]}";
#undef GPU
    px_err err;
    px_assert_ok(px_write_file(inv, doc, strlen(doc), &err), &err);
    char *argv[] = {
        (char *)px_test_plexus_bin(), "run", "--model", model, "--inventory", inv, "--prompt",
        "Once upon a time",           "-n",  "8",       "-o",  "json",        NULL};
    char *out = NULL, *errs = NULL;
    int rc = px_test_run(argv, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    px_assert_contains(out, "\"schema\": \"plexus.run/1\"");
    px_assert_contains(out, "\"emulated\": true");
    free(out);
    free(errs);
    free(inv);
    free(model);
}

static size_t run_folders_in(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, "plexus-run-", 11);
    closedir(d);
    return n;
}

/* The sockets' folder is made under $TMPDIR and goes with the executor; a
 * TMPDIR too long for a socket path is refused by name. */
static void test_socket_folder_is_under_tmpdir_and_removed(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 2, 4};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    char *tmp = px_asprintf("%s/tmpdir-run", px_test_tmpdir());
    assert_int_equal(mkdir(tmp, 0700), 0);
    char *saved = getenv("TMPDIR") ? px_strdup(getenv("TMPDIR")) : NULL;
    assert_int_equal(setenv("TMPDIR", tmp, 1), 0);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    assert_int_equal(run_folders_in(tmp), 1);
    px_rt_executor_free(ex);
    assert_int_equal(run_folders_in(tmp), 0);
    char longdir[120];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = 0;
    assert_int_equal(setenv("TMPDIR", longdir, 1), 0);
    assert_int_equal(px_rt_executor_new(&spec, &xo, &ex, &err), PX_EINVAL);
    px_assert_contains(err.msg, "TMPDIR");
    if (saved)
        assert_int_equal(setenv("TMPDIR", saved, 1), 0);
    else
        assert_int_equal(unsetenv("TMPDIR"), 0);
    free(saved);
    rmdir(tmp);
    free(tmp);
}

/* What a generation's steps said of the waits for a core. */
typedef struct waits_seen {
    uint64_t steps, waited, wait_ns, over;
} waits_seen;

static px_status count_waits(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                             px_rt_step_verdict *v, px_err *err)
{
    (void)ex;
    (void)v;
    (void)err;
    waits_seen *w = ud;
    w->steps++;
    w->waited += obs->xfer_out_wait_ns > 0;
    w->wait_ns += obs->xfer_out_wait_ns;
    /* A wait is part of the time it is measured in. */
    w->over += obs->xfer_out_wait_ns > obs->xfer_out_ns;
    for (uint32_t i = 0; i < obs->n_stages; i++)
        w->over +=
            obs->xfer_wait_ns[i] > obs->xfer_in_ns[i] || obs->wait_ns[i] > obs->compute_ns[i];
    return PX_OK;
}

static atomic_bool spinning;

static void *spin(void *arg)
{
    (void)arg;
    while (atomic_load_explicit(&spinning, memory_order_relaxed))
        ;
    return NULL;
}

/* Spins until the calling thread has run for 40 ms of CPU time, and
 * returns its wait for a core meanwhile. */
static void *spin_and_wait(void *arg)
{
    int fd = -2;
    uint64_t w0 = px__rt_thread_wait_ns(&fd);
    struct timespec ts;
    do
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    while (ts.tv_sec == 0 && ts.tv_nsec < 40000000);
    *(uint64_t *)arg = px__rt_thread_wait_ns(&fd) - w0;
    px__rt_thread_wait_close(&fd);
    return NULL;
}

/* Two threads that each need 40 ms of one shared core: while one runs
 * the other waits, so the reader must see a wait in at least one. */
static void test_thread_wait_reads_a_wait_for_a_shared_core(void **state)
{
    (void)state;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) {
        int fd = -2;
        assert_int_equal(px__rt_thread_wait_ns(&fd), 0);
        skip();
    }
    fclose(f);
    cpu_set_t mine, one;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_attr_t attr;
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setaffinity_np(&attr, sizeof one, &one), 0);
    uint64_t wait[2] = {0, 0};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], &attr, spin_and_wait, &wait[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_attr_destroy(&attr);
    print_message("waits for the shared core: %.3f and %.3f ms\n", (double)wait[0] / 1e6,
                  (double)wait[1] / 1e6);
    assert_true(wait[0] + wait[1] > 0);
}

/* The executor's receiving thread shares one core with a thread that
 * spins for the whole generation (the stage workers keep theirs), so it
 * may wait for that core when results come in (the scheduler often lets
 * a thread woken from its receive run at once): whatever the hop back
 * carries lies within the hop's time. */
static void test_hop_back_wait_lies_within_its_time(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 2, 4};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_err err;
    px_rt_executor_opts xo = exec_opts(synth_path, 1);
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    cpu_set_t mine, one;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_true(ex->rx_started);
    assert_int_equal(pthread_setaffinity_np(ex->rx, sizeof one, &one), 0);
    atomic_store(&spinning, true);
    pthread_t spinner;
    assert_int_equal(pthread_create(&spinner, NULL, spin, NULL), 0);
    assert_int_equal(pthread_setaffinity_np(spinner, sizeof one, &one), 0);

    px_rt_tokenizer *t = tokenizer_of(synth_path);
    waits_seen w = {0};
    px_rt_supervisor sv = {.after_step = count_waits, .ud = &w};
    const char *prompt = "Once upon a time";
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = 24,
                              .ignore_eos = true,
                              .supervisor = &sv};
    px_status st = px_rt_executor_generate(ex, t, &go, NULL, &err);
    atomic_store(&spinning, false);
    pthread_join(spinner, NULL);
    px_assert_ok(st, &err);
    px_rt_tokenizer_free(t);
    px_rt_executor_free(ex);

    assert_true(w.steps >= 24);
    assert_int_equal(w.over, 0);
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) {
        print_message("no /proc/thread-self/schedstat here: waits are not known (0)\n");
        assert_int_equal(w.wait_ns, 0);
        return;
    }
    fclose(f);
    print_message("hop back: %" PRIu64 " of %" PRIu64 " steps waited, %.3f ms in all\n", w.waited,
                  w.steps, (double)w.wait_ns / 1e6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_model_split_matches_one_process_bitwise),
        cmocka_unit_test(test_synthetic_model_split_matches_one_process_bitwise),
        cmocka_unit_test(test_killed_worker_is_named_within_the_timeout),
        cmocka_unit_test(test_stopped_worker_is_named_within_the_timeout),
        cmocka_unit_test(test_truncated_frame_is_reported_by_the_stage_that_got_it),
        cmocka_unit_test(test_model_that_does_not_match_the_plan_is_refused),
        cmocka_unit_test(test_stage_on_an_emulated_gpu_runs_on_the_emu_backend),
        cmocka_unit_test(test_prompt_longer_than_the_context_is_refused),
        cmocka_unit_test(test_run_command_plans_on_emu_small_and_reports),
        cmocka_unit_test(test_run_command_plans_one_device_per_stage),
        cmocka_unit_test(test_socket_folder_is_under_tmpdir_and_removed),
        cmocka_unit_test(test_thread_wait_reads_a_wait_for_a_shared_core),
        cmocka_unit_test(test_hop_back_wait_lies_within_its_time),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
