/* Stages that hold no transformer block: an embedding-only session, a
 * session of blocks alone and a head-only session compose into the whole
 * model bit for bit; explicit parts are checked (the embedding needs layer
 * 0, the head the last layer, an empty range one of them) and a session
 * refuses tokens without the embedding and logits without the head; the
 * default options still mean the whole model; and the plan reader accepts
 * an embedding-only first stage and a head-only last stage while still
 * refusing empty middle stages, gaps, overlaps and a misplaced embedding. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define VOCAB  300
#define DIM    64
#define LAYERS 4

static px_rt_model *synth_model(void)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = DIM;
    o.hidden_dim = 96;
    o.n_layers = LAYERS;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.vocab_size = VOCAB;
    o.context_length = 64;
    o.seed = 11;
    char *path = px_asprintf("%s/empty-synth.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    free(path);
    return m;
}

static px_rt_session *open_parts(const px_rt_model *m, uint32_t begin, uint32_t end, bool embd,
                                 bool head)
{
    px_rt_session_opts so = {.n_threads = 1,
                             .max_seqs = 2,
                             .context = 32,
                             .layer_begin = begin,
                             .layer_end = end,
                             .explicit_parts = true,
                             .embedding = embd,
                             .head = head};
    px_rt_session *s;
    px_err err;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    int32_t id;
    px_assert_ok(px_rt_seq_add(s, &id, &err), &err);
    px_assert_ok(px_rt_seq_add(s, &id, &err), &err);
    return s;
}

/* Runs hidden states through a session that takes them (no tokens) and
 * returns a malloc'd copy of its output. */
static float *pass_on(px_rt_session *s, const px_rt_seq_step *steps, const float *hidden,
                      px_rt_output *out)
{
    px_rt_seq_step hs[2] = {steps[0], steps[1]};
    hs[0].tokens = hs[1].tokens = NULL;
    px_rt_batch b = {.n_seqs = 2, .seqs = hs, .hidden = hidden};
    px_err err;
    px_assert_ok(px_rt_forward(s, &b, NULL, out, &err), &err);
    size_t n = (size_t)out->n_rows * out->row_len;
    float *copy = malloc(n * sizeof(float));
    memcpy(copy, out->data, n * sizeof(float));
    return copy;
}

static void test_embedding_only_blocks_and_head_only_compose_bit_for_bit(void **state)
{
    (void)state;
    px_rt_model *m = synth_model();
    px_err err;
    px_rt_session_opts wo = {.n_threads = 1, .max_seqs = 2, .context = 32};
    px_rt_session *whole;
    px_assert_ok(px_rt_session_new(m, &wo, &whole, &err), &err);
    int32_t id;
    px_assert_ok(px_rt_seq_add(whole, &id, &err), &err);
    px_assert_ok(px_rt_seq_add(whole, &id, &err), &err);
    px_rt_session *embd = open_parts(m, 0, 0, true, false);
    px_rt_session *lo = open_parts(m, 0, 2, false, false);
    px_rt_session *hi = open_parts(m, 2, LAYERS, false, false);
    px_rt_session *head = open_parts(m, LAYERS, LAYERS, false, true);

    /* An embedding-only or head-only session keeps no KV cache. */
    px_rt_session_info info;
    px_rt_session_info_get(embd, &info);
    assert_int_equal(info.layer_begin, 0);
    assert_int_equal(info.layer_end, 0);
    assert_int_equal(info.kv_bytes, 0);
    assert_true(info.weight_bytes >= (uint64_t)VOCAB * DIM * sizeof(float));
    px_rt_session_info_get(head, &info);
    assert_int_equal(info.layer_begin, LAYERS);
    assert_int_equal(info.kv_bytes, 0);
    assert_true(info.weight_bytes > 0);
    /* A session of blocks alone holds neither end's weights: fewer bytes
     * than the same range with the default parts (embedding included). */
    px_rt_session_info lo_info, auto_info;
    px_rt_session_info_get(lo, &lo_info);
    assert_true(lo_info.kv_bytes > 0);
    px_rt_session_opts ao = {.n_threads = 1, .max_seqs = 2, .context = 32, .layer_end = 2};
    px_rt_session *auto_lo;
    px_assert_ok(px_rt_session_new(m, &ao, &auto_lo, &err), &err);
    px_rt_session_info_get(auto_lo, &auto_info);
    assert_true(auto_info.weight_bytes > lo_info.weight_bytes);
    px_rt_session_free(auto_lo);

    int32_t a[5] = {1, 2, 3, 4, 5}, b[2] = {7, 8};
    for (int step = 0; step < 3; step++) {
        uint32_t na = step == 0 ? 5 : 1, nb = step == 0 ? 2 : 1;
        uint32_t pa = step == 0 ? 0 : 4 + (uint32_t)step, pb = step == 0 ? 0 : 1 + (uint32_t)step;
        px_rt_seq_step steps[2] = {{.seq = 0, .pos = pa, .n_tokens = na, .tokens = a},
                                   {.seq = 1, .pos = pb, .n_tokens = nb, .tokens = b}};
        px_rt_batch batch = {.n_seqs = 2, .seqs = steps};
        px_rt_output want, got;
        px_assert_ok(px_rt_forward(whole, &batch, NULL, &want, &err), &err);
        assert_int_equal(want.row_len, VOCAB);

        /* The embedding-only stage hands on one row of dim per token. */
        px_assert_ok(px_rt_forward(embd, &batch, NULL, &got, &err), &err);
        assert_int_equal(got.n_rows, na + nb);
        assert_int_equal(got.row_len, DIM);
        float *h0 = malloc((size_t)got.n_rows * DIM * sizeof(float));
        memcpy(h0, got.data, (size_t)got.n_rows * DIM * sizeof(float));
        float *h1 = pass_on(lo, steps, h0, &got);
        assert_int_equal(got.row_len, DIM);
        float *h2 = pass_on(hi, steps, h1, &got);
        assert_int_equal(got.row_len, DIM);
        assert_int_equal(got.n_rows, na + nb);
        float *logits = pass_on(head, steps, h2, &got);
        assert_int_equal(got.n_rows, 2);
        assert_int_equal(got.row_len, VOCAB);
        assert_memory_equal(logits, want.data, 2 * VOCAB * sizeof(float));
        /* Every session advanced its sequences, cache or not. */
        assert_int_equal(px_rt_seq_len(embd, 0), pa + na);
        assert_int_equal(px_rt_seq_len(head, 1), pb + nb);
        free(h0);
        free(h1);
        free(h2);
        free(logits);
        a[0] = 9 + step;
        b[0] = 20 + step;
    }
    px_rt_session_free(whole);
    px_rt_session_free(embd);
    px_rt_session_free(lo);
    px_rt_session_free(hi);
    px_rt_session_free(head);
    px_rt_model_free(m);
}

static void expect_new_error(const px_rt_model *m, const px_rt_session_opts *so, const char *needle)
{
    px_rt_session *s = (px_rt_session *)1;
    px_err err;
    assert_int_equal(px_rt_session_new(m, so, &s, &err), PX_EINVAL);
    assert_null(s);
    px_assert_contains(err.msg, needle);
}

static void test_explicit_parts_are_checked_against_the_range(void **state)
{
    (void)state;
    px_rt_model *m = synth_model();
    px_rt_session_opts so = {.max_seqs = 1, .context = 16, .explicit_parts = true};
    /* [0, 0) holding nothing would do nothing. */
    expect_new_error(m, &so, "neither the embedding nor the head");
    so.layer_begin = so.layer_end = 2;
    expect_new_error(m, &so, "neither the embedding nor the head");
    /* The embedding needs layer 0, the head the last layer. */
    so.embedding = true;
    expect_new_error(m, &so, "embedding goes with a range that starts at layer 0");
    so.embedding = false;
    so.head = true;
    expect_new_error(m, &so, "head goes with a range that ends");
    /* Past the model. */
    so.layer_begin = so.layer_end = LAYERS + 1;
    expect_new_error(m, &so, "not a range");
    px_rt_model_free(m);
}

static void test_sessions_refuse_tokens_without_embedding_and_logits_without_head(void **state)
{
    (void)state;
    px_rt_model *m = synth_model();
    px_err err;
    px_rt_session *mid = open_parts(m, 0, LAYERS, false, false);
    int32_t toks[2] = {3, 4};
    px_rt_seq_step steps[1] = {{.seq = 0, .pos = 0, .n_tokens = 2, .tokens = toks}};
    px_rt_batch batch = {.n_seqs = 1, .seqs = steps};
    px_rt_output out;
    assert_int_equal(px_rt_forward(mid, &batch, NULL, &out, &err), PX_EINVAL);
    px_assert_contains(err.msg, "does not hold the embedding");
    float hidden[2 * DIM] = {0};
    steps[0].tokens = NULL;
    batch.hidden = hidden;
    px_rt_forward_opts fo = {
        .layer_begin = 0, .layer_end = LAYERS, .output = PX_RT_OUTPUT_LOGITS_LAST};
    assert_int_equal(px_rt_forward(mid, &batch, &fo, &out, &err), PX_EINVAL);
    px_assert_contains(err.msg, "does not hold the head");
    /* Nothing was advanced by the refused steps; hidden states pass. */
    assert_int_equal(px_rt_seq_len(mid, 0), 0);
    px_assert_ok(px_rt_forward(mid, &batch, NULL, &out, &err), &err);
    assert_int_equal(out.row_len, DIM);
    px_rt_session_free(mid);

    /* The default options still mean the whole model, head included. */
    px_rt_session_opts so = {.max_seqs = 1, .context = 16};
    px_rt_session *whole;
    px_assert_ok(px_rt_session_new(m, &so, &whole, &err), &err);
    px_rt_session_info info;
    px_rt_session_info_get(whole, &info);
    assert_int_equal(info.layer_end, LAYERS);
    int32_t id;
    px_assert_ok(px_rt_seq_add(whole, &id, &err), &err);
    steps[0].tokens = toks;
    batch.hidden = NULL;
    px_assert_ok(px_rt_forward(whole, &batch, NULL, &out, &err), &err);
    assert_int_equal(out.row_len, VOCAB);
    px_rt_session_free(whole);
    px_rt_model_free(m);
}

/* ------------------------------------------------------------------ */
/* The plan reader                                                     */
/* ------------------------------------------------------------------ */

static px_status parse_plan(const char *stages, px_rt_pipeline_spec *spec, px_err *err)
{
    char *doc = px_asprintf("{\"schema\": \"plexus.plan/1\", \"model\": {\"blocks\": 4}, "
                            "\"stages\": [%s]}",
                            stages);
    json_error_t je;
    json_t *plan = json_loads(doc, 0, &je);
    if (!plan)
        fail_msg("test plan is not JSON: %s\n%s", je.text, doc);
    px_status st = px_rt_pipeline_spec_from_plan(plan, NULL, "p.json", spec, err);
    json_decref(plan);
    free(doc);
    return st;
}

static void expect_plan_error(const char *stages, const char *where, const char *what)
{
    px_rt_pipeline_spec spec;
    px_err err;
    assert_int_equal(parse_plan(stages, &spec, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "p.json");
    px_assert_contains(err.msg, where);
    px_assert_contains(err.msg, what);
}

#define EMBD "{\"layers\": {\"first\": 0, \"last\": -1}, \"embedding\": true}"
#define HEAD "{\"layers\": {\"first\": 4, \"last\": 3}, \"head\": true}"

static void test_plan_reader_accepts_embedding_only_and_head_only_stages(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    px_err err;
    px_assert_ok(parse_plan(EMBD
                            ", {\"layers\": {\"first\": 0, \"last\": 1}, \"embedding\": false},"
                            "{\"layers\": {\"first\": 2, \"last\": 3}}," HEAD,
                            &spec, &err),
                 &err);
    assert_int_equal(spec.n_stages, 4);
    assert_int_equal(spec.stages[0].layer_begin, 0);
    assert_int_equal(spec.stages[0].layer_end, 0);
    assert_true(spec.stages[0].embedding);
    assert_false(spec.stages[0].head);
    assert_false(spec.stages[1].embedding);
    assert_int_equal(spec.stages[1].layer_end, 2);
    assert_false(spec.stages[2].head);
    assert_int_equal(spec.stages[3].layer_begin, 4);
    assert_int_equal(spec.stages[3].layer_end, 4);
    assert_true(spec.stages[3].head);
    assert_false(spec.stages[3].embedding);
    /* The last stage holds the head even when the plan does not say. */
    px_assert_ok(parse_plan(EMBD ", {\"layers\": {\"first\": 0, \"last\": 3}}", &spec, &err), &err);
    assert_true(spec.stages[1].head);
    /* One stage that holds everything still works. */
    px_assert_ok(parse_plan("{\"layers\": {\"first\": 0, \"last\": 3}}", &spec, &err), &err);
    assert_true(spec.stages[0].embedding && spec.stages[0].head);
}

/* Each replica's batch: its own, else the plan's batch per replica; 0
 * for none or one out of range (the server then uses its default). */
static void test_plan_reader_gives_each_replica_its_batch(void **state)
{
    (void)state;
    json_t *plan =
        json_pack("{s:{s:i}, s:[{s:i}, {s:i}, {}, {s:i}]}", "batching", "batch_per_replica", 32,
                  "replicas", "index", 0, "batch", 8, "batch", 0);
    assert_non_null(plan);
    assert_int_equal(px_rt_plan_replicas(plan), 4);
    assert_int_equal(px_rt_plan_replica_batch(plan, 0), 32);
    assert_int_equal(px_rt_plan_replica_batch(plan, 1), 8);
    assert_int_equal(px_rt_plan_replica_batch(plan, 2), 32);
    assert_int_equal(px_rt_plan_replica_batch(plan, 3), 0);
    json_t *none = json_object();
    assert_int_equal(px_rt_plan_replica_batch(none, 0), 0);
    json_decref(none);
    json_decref(plan);
}

/* Each replica's micro-batches (its own, else the plan's batching) and
 * each stage's time per attended position; a time per position that is
 * not one is refused by name. */
static void test_plan_reader_gives_micro_batches_and_time_per_position(void **state)
{
    (void)state;
    const char *stage = "{\"layers\": {\"first\": 0, \"last\": 3}, \"devices\": [\"n.cpu0\"], "
                        "\"predicted\": {\"attention_s_per_position\": 2.5e-7}}";
    char *doc = px_asprintf(
        "{\"schema\": \"plexus.plan/1\", \"model\": {\"blocks\": 4}, \"stages\": [%s], "
        "\"batching\": {\"micro_batches\": 2}, \"replicas\": [{\"index\": 0, \"stages\": [%s], "
        "\"micro_batches\": 1}, {\"index\": 1, \"stages\": [%s]}, {\"index\": 2, "
        "\"stages\": [%s], \"micro_batches\": 99}]}",
        stage, stage, stage, stage);
    json_t *plan = json_loads(doc, 0, NULL);
    free(doc);
    assert_non_null(plan);
    px_rt_pipeline_spec spec;
    px_err err;
    px_assert_ok(px_rt_pipeline_spec_from_plan_replica(plan, NULL, "p.json", 0, &spec, &err), &err);
    assert_int_equal(spec.micro_batches, 1);
    assert_float_equal(spec.stages[0].pred_attention_pos_s, 2.5e-7, 0);
    px_assert_ok(px_rt_pipeline_spec_from_plan_replica(plan, NULL, "p.json", 1, &spec, &err), &err);
    assert_int_equal(spec.micro_batches, 2);
    assert_float_equal(spec.stages[0].pred_attention_pos_s, 2.5e-7, 0);
    /* More than the engine can keep in flight: not said. */
    px_assert_ok(px_rt_pipeline_spec_from_plan_replica(plan, NULL, "p.json", 2, &spec, &err), &err);
    assert_int_equal(spec.micro_batches, 0);
    json_decref(plan);
    /* A plan without them: not said. */
    px_assert_ok(parse_plan("{\"layers\": {\"first\": 0, \"last\": 3}}", &spec, &err), &err);
    assert_int_equal(spec.micro_batches, 0);
    assert_true(isnan(spec.stages[0].pred_attention_pos_s));
    expect_plan_error("{\"layers\": {\"first\": 0, \"last\": 3}, \"predicted\": "
                      "{\"attention_s_per_position\": -1}}",
                      "/stages/0/predicted/attention_s_per_position", "from 0 to 1");
    expect_plan_error("{\"layers\": {\"first\": 0, \"last\": 3}, \"predicted\": "
                      "{\"attention_s_per_position\": \"fast\"}}",
                      "/stages/0/predicted/attention_s_per_position", "from 0 to 1");
}

static void test_plan_reader_refuses_empty_middle_stages_gaps_and_overlaps(void **state)
{
    (void)state;
    /* An empty stage that holds neither end. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 0, \"last\": -1}},"
                           "{\"layers\": {\"first\": 0, \"last\": 3}}",
                      "/stages/1", "neither the embedding nor the head");
    /* last below first - 1. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 2, \"last\": 0}}", "/stages/1/layers",
                      "not a range");
    expect_plan_error("{\"layers\": {\"first\": -1, \"last\": -2}}", "/stages/0/layers",
                      "not a range");
    /* A gap after the embedding-only stage. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 1, \"last\": 3}}", "/stages/1",
                      "ends at block -1");
    /* An overlap. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 0, \"last\": 2}},"
                           "{\"layers\": {\"first\": 2, \"last\": 3}}",
                      "/stages/2", "without gaps or overlaps");
    /* The embedding elsewhere than the first stage. */
    expect_plan_error("{\"layers\": {\"first\": 0, \"last\": 1}},"
                      "{\"layers\": {\"first\": 2, \"last\": 3}, \"embedding\": true}",
                      "/stages/1", "holds the embedding but is not the first");
    /* The head before the last stage, even an empty one. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 0, \"last\": -1}, \"head\": true},"
                           "{\"layers\": {\"first\": 0, \"last\": 3}}",
                      "/stages", "holds the head but is not the last");
    /* Stages that stop short of the model's blocks. */
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 0, \"last\": 2}}," HEAD, "/stages/2",
                      "stage 1 ends at block 2");
    expect_plan_error(EMBD ", {\"layers\": {\"first\": 0, \"last\": 2}}", "/stages",
                      "the model has 4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_only_blocks_and_head_only_compose_bit_for_bit),
        cmocka_unit_test(test_explicit_parts_are_checked_against_the_range),
        cmocka_unit_test(test_sessions_refuse_tokens_without_embedding_and_logits_without_head),
        cmocka_unit_test(test_plan_reader_accepts_embedding_only_and_head_only_stages),
        cmocka_unit_test(test_plan_reader_refuses_empty_middle_stages_gaps_and_overlaps),
        cmocka_unit_test(test_plan_reader_gives_each_replica_its_batch),
        cmocka_unit_test(test_plan_reader_gives_micro_batches_and_time_per_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
