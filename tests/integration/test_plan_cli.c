/* `plexus plan` end to end: reports, JSON, files, refusals, usage. */
#include "px_test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int run(char **out, char **err, const char *a1, const char *a2, const char *a3,
               const char *a4, const char *a5, const char *a6, const char *a7, const char *a8)
{
    char *argv[12] = {(char *)px_test_plexus_bin(),
                      "plan",
                      (char *)a1,
                      (char *)a2,
                      (char *)a3,
                      (char *)a4,
                      (char *)a5,
                      (char *)a6,
                      (char *)a7,
                      (char *)a8,
                      NULL};
    return px_test_run(argv, 120, out, err);
}

static void test_plan_cli_prints_a_readable_report(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", "llama-3-8b", "--inventory", inv, "--compare-baselines",
                 NULL, NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "stage");
    px_assert_contains(out, "time per token");
    px_assert_contains(out, "lower bound");
    px_assert_contains(out, "why:");
    px_assert_contains(out, "baselines");
    px_assert_contains(out, "llamacpp");
    free(out);
    free(err);
    free(inv);
}

static void test_plan_cli_json_is_deterministic_and_written(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/irregular-4dev.json");
    char *plan_path = px_asprintf("%s/plan.json", px_test_tmpdir());
    char *svg_path = px_asprintf("%s/plan.svg", px_test_tmpdir());
    char *a = NULL, *b = NULL, *err = NULL;
    int rc = run(&a, &err, "--model", "qwen2.5-7b", "--inventory", inv, "-o", "json", "--out",
                 plan_path);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    free(err);
    rc =
        run(&b, &err, "--model", "qwen2.5-7b", "--inventory", inv, "-o", "json", "--svg", svg_path);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    assert_string_equal(a, b);
    json_t *doc;
    px_err perr;
    px_assert_ok(px_json_parse(a, strlen(a), "plan", NULL, &doc, &perr), &perr);
    assert_string_equal(json_string_value(json_object_get(doc, "schema")), "plexus.plan/1");
    assert_int_equal(strlen(json_string_value(json_object_get(doc, "id"))), 64);
    json_decref(doc);
    char *file;
    size_t len;
    px_assert_ok(px_read_file(plan_path, 1 << 24, &file, &len, &perr), &perr);
    assert_string_equal(file, a);
    free(file);
    px_assert_ok(px_read_file(svg_path, 1 << 24, &file, &len, &perr), &perr);
    assert_true(!strncmp(file, "<svg", 4));
    px_assert_contains(file, "stage 0");
    free(file);
    free(a);
    free(b);
    free(err);
    free(inv);
    free(plan_path);
    free(svg_path);
}

static void test_plan_cli_refuses_malicious_inventories(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/malicious/link-to-undefined-device.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", "llama-3-8b", "--inventory", inv, NULL, NULL, NULL, NULL);
    assert_int_equal(rc, 1);
    px_assert_contains(err, "refusing the inventory");
    px_assert_contains(err, "/links");
    free(out);
    free(err);
    free(inv);
}

static void test_plan_cli_refuses_bad_usage(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(run(&out, &err, "--inventory", "x.json", NULL, NULL, NULL, NULL, NULL, NULL),
                     2);
    px_assert_contains(err, "--model");
    free(out);
    free(err);
    out = err = NULL;
    assert_int_equal(run(&out, &err, "--model", "llama-3-8b", "--inventory", "x.json",
                         "--objective", "fastest", NULL, NULL),
                     2);
    px_assert_contains(err, "tokens_per_dollar");
    free(out);
    free(err);
    out = err = NULL;
    assert_int_equal(run(&out, &err, "--model", "llama-3-8b", "--inventory", "x.json", "--batch",
                         "-3", NULL, NULL),
                     2);
    free(out);
    free(err);
}

static void test_plan_cli_plans_a_real_model_on_emulated_devices(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", model, "--inventory", inv, "-o", "json", NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "\"source\": \"gguf\"");
    px_assert_contains(out, "sha256:");
    free(out);
    free(err);
    free(inv);
    free(model);
}

/* Each replica says what it predicts of each part of its step (its
 * stages' served steps and hops, the logits' way back, the executor's
 * work per micro-batch),
 * so that a served step can be compared part by part: one trip of a
 * micro-batch round the ring, and each stage once per micro-batch, fit
 * in the step it predicts. */
static void test_plan_cli_says_what_each_replica_predicts_of_each_part(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", model, "--inventory", inv, "-o", "json", "--objective",
                 "throughput");
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    const json_t *reps = json_object_get(doc, "replicas");
    assert_true(json_array_size(reps) >= 1);
    size_t i;
    const json_t *rep;
    json_array_foreach(reps, i, rep)
    {
        const json_t *pred = json_object_get(rep, "predicted");
        double step = json_number_value(json_object_get(pred, "step_s"));
        double exec = json_number_value(json_object_get(pred, "executor_s_per_micro_batch"));
        double mb = (double)json_integer_value(json_object_get(rep, "micro_batches"));
        double batch = (double)json_integer_value(json_object_get(rep, "batch"));
        assert_true(step > 0 && exec > 0 && mb >= 1);
        assert_true(json_number_value(json_object_get(pred, "host_cores_s")) <= step * 1.001);
        /* The logits' way back: over a link with two stages, none with one. */
        double back = json_number_value(json_object_get(pred, "return_s_per_micro_batch"));
        size_t n_st = json_array_size(json_object_get(rep, "stages"));
        assert_true(n_st > 1 ? back > 0 : back == 0);
        double trip = exec + back, slowest = back;
        size_t k;
        const json_t *st;
        json_array_foreach(json_object_get(rep, "stages"), k, st)
        {
            const json_t *sp = json_object_get(st, "predicted");
            double served = json_number_value(json_object_get(sp, "served_step_s"));
            assert_true(served > 0);
            assert_true(json_is_number(json_object_get(sp, "transfer_s")));
            trip += served + json_number_value(json_object_get(sp, "transfer_s"));
            slowest = served > slowest ? served : slowest;
        }
        if (trip > step * 1.001 || mb * slowest > step * 1.001)
            fail_msg(
                "replica %zu: a step of %g s holds neither a trip of %g s nor %g micro-batches "
                "of its slowest stage (%g s)",
                i, step, trip, mb, slowest);
        double thr = json_number_value(json_object_get(rep, "throughput"));
        assert_true(fabs(thr - batch / step) <= 0.002 * thr);
    }
    json_decref(doc);
    free(out);
    free(err);
    free(inv);
    free(model);
}

static void test_plan_cli_lists_link_fallbacks_under_device_fallbacks(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/irregular-4dev.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", "llama-3-70b", "--inventory", inv, NULL, NULL, NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    const char *dev = strstr(out, "fallbacks if one device is lost:");
    const char *link = strstr(out, "fallbacks if a link degrades:");
    assert_non_null(dev);
    assert_non_null(link);
    assert_true(link > dev);
    px_assert_contains(link, "hop        ws1.cpu0>");
    free(out);
    free(err);
    char *a = NULL, *b = NULL;
    rc = run(&a, &err, "--model", "llama-3-70b", "--inventory", inv, "-o", "json", NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    free(err);
    rc = run(&b, &err, "--model", "llama-3-70b", "--inventory", inv, "-o", "json", NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    assert_string_equal(a, b);
    json_t *doc;
    px_err perr;
    px_assert_ok(px_json_parse(a, strlen(a), "plan", NULL, &doc, &perr), &perr);
    /* One answer per hop of the pipeline and per tensor-parallel group. */
    size_t n_stages = json_array_size(json_object_get(doc, "stages"));
    assert_true(n_stages >= 2);
    size_t hops = n_stages - 1, k;
    const json_t *stage;
    json_array_foreach(json_object_get(doc, "stages"), k, stage) hops +=
        json_integer_value(json_object_get(stage, "tensor_parallel")) > 1;
    assert_int_equal(json_array_size(json_object_get(doc, "link_fallbacks")), hops);
    json_decref(doc);
    free(a);
    free(b);
    free(err);
    free(inv);
}

/* --max-tp 1: one device per stage, as the stage workers of `plexus run`
 * and `plexus serve` run them (irregular-4dev's 70B plan otherwise
 * splits a stage two ways). */
static void test_plan_cli_max_tp_keeps_one_device_per_stage(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/irregular-4dev.json");
    size_t widest[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, *err = NULL;
        int rc = run(&out, &err, "--model", "llama-3-70b", "--inventory", inv, "-o", "json",
                     i ? "--max-tp" : NULL, i ? "1" : NULL);
        if (rc != 0)
            fail_msg("exit %d: %s", rc, err);
        json_t *doc = json_loads(out, 0, NULL);
        assert_non_null(doc);
        size_t k;
        const json_t *stage;
        json_array_foreach(json_object_get(doc, "stages"), k, stage)
        {
            size_t tp = (size_t)json_integer_value(json_object_get(stage, "tensor_parallel"));
            widest[i] = tp > widest[i] ? tp : widest[i];
            assert_int_equal(json_array_size(json_object_get(stage, "devices")), tp);
        }
        json_decref(doc);
        free(out);
        free(err);
    }
    assert_true(widest[0] > 1);
    assert_int_equal(widest[1], 1);
    char *out = NULL, *err = NULL;
    assert_int_equal(
        run(&out, &err, "--model", "llama-3-70b", "--inventory", inv, "--max-tp", "0", NULL, NULL),
        2);
    px_assert_contains(err, "--max-tp");
    free(out);
    free(err);
    free(inv);
}

/* Lengths the model cannot hold are refused with the model's context and
 * the fix; unset lengths follow the model (a 128-token model plans 64 +
 * 64). */
static void test_plan_cli_refuses_lengths_beyond_the_context(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *out = NULL, *err = NULL;
    int rc = run(&out, &err, "--model", model, "--inventory", inv, "--context", "256", NULL, NULL);
    assert_int_equal(rc, 2);
    px_assert_contains(err, "--context 256 exceeds");
    px_assert_contains(err, "context of 128 tokens: give --context 128 or less");
    free(out);
    free(err);
    rc = run(&out, &err, "--model", model, "--inventory", inv, "--prompt-tokens", "100",
             "--gen-tokens", "100");
    assert_int_equal(rc, 2);
    px_assert_contains(err, "a prompt of 100 tokens and 100 generated make 200, longer than the "
                            "context of 128");
    free(out);
    free(err);
    rc = run(&out, &err, "--model", model, "--inventory", inv, "-o", "json", NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "\"context\": 128");
    px_assert_contains(out, "\"gen_tokens\": 64");
    px_assert_contains(out, "\"prompt_tokens\": 64");
    free(out);
    free(err);
    free(inv);
    free(model);
}

/* The KV-cache dtype the plan assumes for a preset: bf16 by default, f32
 * when --kv-dtype f32 says so (an f32 that used to read as "not given").
 * A trace, which replay re-opens without the option, refuses it; so does
 * plexus run for a dtype its workers do not keep. */
static const char *kv_assumption(json_t *plan, const char **source)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(plan, "assumptions"), i, a)
    {
        if (!strcmp(json_string_value(json_object_get(a, "name")), "KV-cache dtype")) {
            *source = json_string_value(json_object_get(a, "source"));
            return json_string_value(json_object_get(a, "value"));
        }
    }
    fail_msg("the plan states no KV-cache dtype");
    return NULL;
}

static void test_plan_cli_kv_dtype_overrides_the_presets_cache(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *out = NULL, *err = NULL;
    const char *source;
    int rc = run(&out, &err, "-m", "llama-3-8b", "-i", inv, "-o", "json", NULL, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    json_t *plan = json_loads(out, 0, NULL);
    assert_non_null(plan);
    assert_string_equal(kv_assumption(plan, &source), "bf16");
    px_assert_contains(source, "model preset");
    json_decref(plan);
    free(out);
    free(err);
    rc = run(&out, &err, "-m", "llama-3-8b", "-i", inv, "-o", "json", "--kv-dtype", "f32");
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    plan = json_loads(out, 0, NULL);
    assert_non_null(plan);
    assert_string_equal(kv_assumption(plan, &source), "f32");
    px_assert_contains(source, "--kv-dtype");
    json_decref(plan);
    free(out);
    free(err);
    assert_int_equal(
        run(&out, &err, "-m", "llama-3-8b", "-i", inv, "--kv-dtype", "f32", "--trace", "/dev/null"),
        2);
    px_assert_contains(err, "drop --kv-dtype or --trace");
    free(out);
    free(err);
    char *rv[] = {(char *)px_test_plexus_bin(),
                  "run",
                  "-m",
                  "llama-3-8b",
                  "-i",
                  inv,
                  "--prompt",
                  "hi",
                  "--kv-dtype",
                  "bf16",
                  NULL};
    assert_int_equal(px_test_run(rv, 60, &out, &err), 2);
    px_assert_contains(err, "the stage workers keep the KV cache in f32");
    free(out);
    free(err);
    free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_cli_prints_a_readable_report),
        cmocka_unit_test(test_plan_cli_json_is_deterministic_and_written),
        cmocka_unit_test(test_plan_cli_lists_link_fallbacks_under_device_fallbacks),
        cmocka_unit_test(test_plan_cli_max_tp_keeps_one_device_per_stage),
        cmocka_unit_test(test_plan_cli_refuses_malicious_inventories),
        cmocka_unit_test(test_plan_cli_refuses_bad_usage),
        cmocka_unit_test(test_plan_cli_plans_a_real_model_on_emulated_devices),
        cmocka_unit_test(test_plan_cli_says_what_each_replica_predicts_of_each_part),
        cmocka_unit_test(test_plan_cli_refuses_lengths_beyond_the_context),
        cmocka_unit_test(test_plan_cli_kv_dtype_overrides_the_presets_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
