/* Pipelines with stages that hold no transformer block, as the llama.cpp
 * baseline plans them: a hand-written plan with an embedding-only first
 * stage on the cpu, blocks on emu devices and a head-only last stage
 * produces output bitwise identical to one process, on a synthetic model
 * and on the real tiny one; and `plexus plan --policy llamacpp` followed
 * by `plexus run --plan` runs and reports predicted against observed. */
#include "pipeline_fixture.h"

#include <math.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

static int setup(void **state)
{
    (void)state;
    return pipeline_fixture_setup(9);
}

typedef struct collected {
    int32_t tokens[4][64];
    uint32_t n[4];
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    collected *c = ud;
    if (prompt < 4 && c->n[prompt] < 64)
        c->tokens[prompt][c->n[prompt]++] = token;
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

static px_rt_generate_opts gen_opts(const char *const *prompts, uint32_t n, float temp,
                                    collected *out)
{
    memset(out, 0, sizeof *out);
    return (px_rt_generate_opts){.prompts = prompts,
                                 .n_prompts = n,
                                 .max_new_tokens = 32,
                                 .sampling = {.temperature = temp, .top_p = 0.9f, .seed = 3},
                                 .on_token = on_token,
                                 .ud = out};
}

static void run_single(const char *path, const char *const *prompts, uint32_t n, float temp,
                       collected *out)
{
    px_err err;
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    px_rt_tokenizer *t = tokenizer_of(path);
    px_rt_session_opts so = {.n_threads = 1, .max_seqs = n};
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    px_rt_generate_opts go = gen_opts(prompts, n, temp, out);
    px_assert_ok(px_rt_generate(s, t, &go, NULL, &err), &err);
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
}

#define EMU(seed)                                                                           \
    "\"backend\": \"emu\", \"emu\": {\"compute_slowdown\": 1.5, \"memory_slowdown\": 1.2, " \
    "\"jitter\": 0.1, \"seed\": " #seed "}"

/* The plan: embedding on the cpu, blocks [0, cut) and [cut, n) on two emu
 * devices, the head alone on the cpu. */
static void read_plan(uint32_t n_layers, uint32_t cut, px_rt_pipeline_spec *spec)
{
    char *doc = px_asprintf(
        "{\"schema\": \"plexus.plan/1\", \"id\": \"empty-ends\", \"model\": {\"blocks\": %u},"
        "\"stages\": ["
        "{\"devices\": [\"local.cpu0\"], \"backend\": \"cpu\", "
        "\"layers\": {\"first\": 0, \"last\": -1}, \"embedding\": true, \"head\": false},"
        "{\"devices\": [\"local.emu-a\"], " EMU(
            1) ", \"layers\": {\"first\": 0, \"last\": %u},"
               " \"embedding\": false},"
               "{\"devices\": [\"local.emu-b\"], " EMU(
                   2) ", \"layers\": {\"first\": %u, \"last\": %u}},"
                      "{\"devices\": [\"local.cpu1\"], \"backend\": \"cpu\", "
                      "\"layers\": {\"first\": %u, \"last\": %u}, \"head\": true}]}",
        n_layers, cut - 1, cut, n_layers - 1, n_layers, n_layers - 1);
    json_error_t je;
    json_t *plan = json_loads(doc, 0, &je);
    if (!plan)
        fail_msg("test plan is not JSON: %s\n%s", je.text, doc);
    px_err err;
    px_assert_ok(px_rt_pipeline_spec_from_plan(plan, NULL, "empty-ends.json", spec, &err), &err);
    json_decref(plan);
    free(doc);
    assert_int_equal(spec->n_stages, 4);
    assert_true(spec->stages[0].embedding);
    assert_int_equal(spec->stages[0].layer_end, 0);
    assert_true(spec->stages[3].head);
    assert_int_equal(spec->stages[3].layer_begin, n_layers);
}

static void run_pipeline(const char *path, const px_rt_pipeline_spec *spec,
                         const char *const *prompts, uint32_t n, float temp,
                         px_rt_transport transport, collected *out)
{
    px_err err;
    px_rt_executor_opts xo = {.model_path = path,
                              .worker_bin = px_test_plexus_bin(),
                              .transport = transport,
                              .n_threads = 1,
                              .timeout_ms = 5000,
                              .max_seqs = n};
    px_rt_executor *ex;
    px_assert_ok(px_rt_executor_new(spec, &xo, &ex, &err), &err);
    for (uint32_t i = 0; i < spec->n_stages; i++)
        assert_true(px_rt_executor_stage_pid(ex, i) > 0);
    px_rt_tokenizer *t = tokenizer_of(path);
    px_rt_generate_opts go = gen_opts(prompts, n, temp, out);
    px_rt_pipeline_stats st;
    px_assert_ok(px_rt_executor_generate(ex, t, &go, &st, &err), &err);
    /* Every stage ran ops, the empty ones included. */
    for (uint32_t i = 0; i < spec->n_stages; i++) {
        assert_true(st.stages[i].prefill_steps > 0);
        assert_true(st.stages[i].n_ops > 0);
    }
    px_strbuf sb = PX_STRBUF_INIT;
    px_assert_ok(px_rt_pipeline_report(spec, ex, &st, &sb), NULL);
    px_assert_contains(sb.buf, "end to end");
    px_assert_contains(sb.buf, " embd ");
    px_assert_contains(sb.buf, " head ");
    px_strbuf_release(&sb);
    px_rt_pipeline_stats_release(&st);
    px_rt_tokenizer_free(t);
    px_rt_executor_free(ex);
}

static void check(const char *path, uint32_t n_layers, uint32_t cut, float temp)
{
    const char *prompts[] = {"Once upon a time", "The cat sat"};
    collected single, piped;
    run_single(path, prompts, 1, temp, &single);
    assert_true(single.n[0] > 0);
    px_rt_pipeline_spec spec;
    read_plan(n_layers, cut, &spec);
    run_pipeline(path, &spec, prompts, 1, temp, PX_RT_TRANSPORT_UNIX, &piped);
    assert_int_equal(piped.n[0], single.n[0]);
    assert_memory_equal(piped.tokens[0], single.tokens[0], single.n[0] * sizeof(int32_t));
    /* Two prompts together, over TCP. */
    run_single(path, prompts, 2, temp, &single);
    run_pipeline(path, &spec, prompts, 2, temp, PX_RT_TRANSPORT_TCP, &piped);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(piped.n[i], single.n[i]);
        assert_memory_equal(piped.tokens[i], single.tokens[i], single.n[i] * sizeof(int32_t));
    }
}

static void test_synthetic_model_with_empty_end_stages_matches_one_process(void **state)
{
    (void)state;
    check(synth_path, 4, 2, 0);
}

static void test_real_model_with_empty_end_stages_matches_one_process(void **state)
{
    (void)state;
    char *path = px_test_require_shared_model("stories260K.gguf");
    check(path, 5, 3, 0);    /* greedy */
    check(path, 5, 3, 0.8f); /* sampled: any difference in logits shows */
    free(path);
}

static void test_llamacpp_plan_runs_with_its_embedding_only_stage(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *plan = px_asprintf("%s/llamacpp.json", px_test_tmpdir());
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "plan",
                    "--policy",
                    "llamacpp",
                    "--model",
                    model,
                    "--inventory",
                    inv,
                    "--context",
                    "128",
                    "--out",
                    plan,
                    NULL};
    char *out = NULL, *errs = NULL;
    int rc = px_test_run(argv, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus plan exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    free(out);
    free(errs);
    /* The baseline keeps the embedding alone on the host. */
    px_err err;
    json_t *doc = NULL;
    px_assert_ok(px_json_load_file(plan, NULL, &doc, &err), &err);
    json_t *st0 = json_array_get(json_object_get(doc, "stages"), 0);
    assert_true(json_is_true(json_object_get(st0, "embedding")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(st0, "layers"), "last")),
                     -1);
    json_decref(doc);

    char *argv2[] = {(char *)px_test_plexus_bin(),
                     "run",
                     "--plan",
                     plan,
                     "--inventory",
                     inv,
                     "--model",
                     model,
                     "--prompt",
                     "Once upon a time",
                     "-n",
                     "20",
                     NULL};
    rc = px_test_run(argv2, 60, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    px_assert_contains(out, "Once upon a time, there was a little girl named Lily.");
    px_assert_contains(out, "decode/token predicted");
    px_assert_contains(out, "local.cpu0 (cpu)");
    px_assert_contains(out, " embd ");
    px_assert_contains(out, "end to end: time per token predicted");
    free(out);
    free(errs);
    free(plan);
    free(inv);
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_model_with_empty_end_stages_matches_one_process),
        cmocka_unit_test(test_real_model_with_empty_end_stages_matches_one_process),
        cmocka_unit_test(test_llamacpp_plan_runs_with_its_embedding_only_stage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
