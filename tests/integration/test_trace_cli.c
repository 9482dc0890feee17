/* `plexus plan --trace`, `plexus simulate --trace` and `plexus replay`:
 * identical replays, refused tampering, reported divergence. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace_impl.h"

static char *tmp_path(const char *name)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", px_test_tmpdir(), name) < 0)
        fail_msg("asprintf");
    return path;
}

static char *scenario(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "data/scenarios/%s", name);
    return px_test_source_path(rel);
}

/* Runs plexus with up to 20 arguments; returns the exit status and keeps
 * stdout and stderr in *out and *err (may be NULL). */
static int plexus(const char *const *args, char **out, char **err)
{
    const char *argv[24] = {px_test_plexus_bin()};
    size_t n = 1;
    for (; args[n - 1] && n < 22; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return px_test_run((char *const *)argv, 240, out, err);
}

static void expect_identical(const char *trace, const char *what)
{
    char *out = NULL, *err = NULL;
    int rc = plexus((const char *[]){"replay", trace, NULL}, &out, &err);
    if (rc != 0)
        fail_msg("replay of %s exited %d:\n%s%s", what, rc, out, err);
    px_assert_contains(out, "identical: 1 decisions recomputed, 0 not replayable");
    free(out);
    free(err);
}

static void plan_traced(const char *model, const char *inventory, const char *trace,
                        const char *out_json, const char *const *extra)
{
    const char *args[22] = {"plan",  "--model", model,     "--inventory", inventory,
                            "--out", out_json,  "--trace", trace};
    size_t n = 9;
    for (size_t i = 0; extra && extra[i] && n < 20; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = plexus(args, &out, &err);
    if (rc != 0)
        fail_msg("plan --trace exited %d: %s", rc, err);
    free(out);
    free(err);
}

static void test_plan_trace_with_preset_replays_identical(void **state)
{
    (void)state;
    char *inv = scenario("hetero-pair-h100-l4.json");
    char *trace = tmp_path("preset.trace"), *plan = tmp_path("preset.json");
    plan_traced("llama-3-8b", inv, trace, plan, NULL);

    /* The trace holds the inputs, and the decision's output is the plan
     * document --out wrote. */
    char *text = NULL, *doc = NULL;
    size_t len = 0, doc_len = 0;
    px_err e;
    px_assert_ok(px_read_file(trace, 1u << 26, &text, &len, &e), &e);
    px_assert_ok(px_read_file(plan, 1u << 26, &doc, &doc_len, &e), &e);
    px_assert_contains(text, "\"command\":\"plan\"");
    px_assert_contains(text, "\"name\":\"inventory\"");
    px_assert_contains(text, "\"preset\":\"llama-3-8b\"");
    px_assert_contains(text, "\"kind\":\"decision\",\"name\":\"plan\"");
    json_t *plan_doc = json_loads(doc, 0, NULL);
    assert_non_null(plan_doc);
    px_assert_contains(text, json_string_value(json_object_get(plan_doc, "id")));
    json_decref(plan_doc);
    free(doc);
    free(text);

    expect_identical(trace, "a preset plan");
    free(trace);
    free(plan);
    free(inv);
}

static void test_plan_trace_with_options_and_contract_file_replays_identical(void **state)
{
    (void)state;
    char *inv = scenario("hetero-pair-h100-l4.json");
    char *contract = px_test_source_path("data/contracts/relaxed.json");
    char *trace = tmp_path("options.trace"), *plan = tmp_path("options.json");
    const char *extra[] = {"--contract", contract,    "--objective", "throughput",
                           "--slo",      "tpot=80ms", "--budget",    "20$/h",
                           "--context",  "2048",      NULL};
    plan_traced("llama-3-8b", inv, trace, plan, extra);
    char *text = NULL;
    size_t len = 0;
    px_err e;
    px_assert_ok(px_read_file(trace, 1u << 26, &text, &len, &e), &e);
    px_assert_contains(text, "\"objective\":\"throughput\"");
    px_assert_contains(text, "\"document\":{");
    free(text);
    expect_identical(trace, "a plan with a contract file and options");
    free(trace);
    free(plan);
    free(contract);
    free(inv);
}

static void test_plan_trace_with_gguf_file_replays_identical(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = scenario("emu-small.json");
    char *trace = tmp_path("gguf.trace"), *plan = tmp_path("gguf.json");
    plan_traced(model, inv, trace, plan, NULL);
    char *text = NULL;
    size_t len = 0;
    px_err e;
    px_assert_ok(px_read_file(trace, 1u << 26, &text, &len, &e), &e);
    px_assert_contains(text, "\"sha256\":\"");
    free(text);
    expect_identical(trace, "a GGUF plan");
    free(trace);
    free(plan);
    free(inv);
    free(model);
}

static void test_replay_refuses_a_changed_or_missing_model_file(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = scenario("emu-small.json");
    char *copy = tmp_path("copy.gguf"), *trace = tmp_path("copy.trace"),
         *plan = tmp_path("copy.json");
    char *bytes = NULL;
    size_t len = 0;
    px_err e;
    px_assert_ok(px_read_file(model, 1u << 26, &bytes, &len, &e), &e);
    px_assert_ok(px_write_file(copy, bytes, len, &e), &e);
    plan_traced(copy, inv, trace, plan, NULL);

    bytes[len - 1] ^= 1; /* a different file at the same path */
    px_assert_ok(px_write_file(copy, bytes, len, &e), &e);
    char *out = NULL, *err = NULL;
    assert_int_equal(plexus((const char *[]){"replay", trace, NULL}, &out, &err), 3);
    px_assert_contains(out, "has changed since the trace was written");
    px_assert_contains(out, copy);
    free(out);
    free(err);

    assert_int_equal(remove(copy), 0);
    assert_int_equal(plexus((const char *[]){"replay", trace, NULL}, &out, &err), 3);
    px_assert_contains(out, "cannot re-open the model file");
    free(out);
    free(err);
    free(bytes);
    free(plan);
    free(trace);
    free(copy);
    free(inv);
    free(model);
}

static void test_simulate_trace_replays_identical(void **state)
{
    (void)state;
    char *inv = scenario("hetero-pair-h100-l4.json");
    char *trace = tmp_path("sim.trace"), *plan = tmp_path("sim-plan.json"),
         *plan_trace = tmp_path("sim-plan.trace");
    plan_traced("llama-3-8b", inv, plan_trace, plan, NULL);
    char *out = NULL, *err = NULL;
    int rc = plexus((const char *[]){"simulate", "--plan", plan, "--inventory", inv, "--load",
                                     "poisson:rate=2,prompt=64,gen=16", "--duration", "10s",
                                     "--replications", "2", "--trace", trace, NULL},
                    &out, &err);
    if (rc != 0)
        fail_msg("simulate --trace exited %d: %s", rc, err);
    free(out);
    free(err);
    expect_identical(trace, "a simulation");

    rc = plexus((const char *[]){"replay", "-o", "json", trace, NULL}, &out, &err);
    assert_int_equal(rc, 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    assert_true(json_is_true(json_object_get(doc, "identical")));
    assert_int_equal(json_integer_value(json_object_get(doc, "recomputed")), 1);
    assert_int_equal(json_integer_value(json_object_get(doc, "not_replayable")), 0);
    json_decref(doc);
    free(out);
    free(err);
    free(plan_trace);
    free(plan);
    free(trace);
    free(inv);
}

/* Writes a preset plan's trace and returns its text. */
static char *preset_trace(const char *name, size_t *len)
{
    char *inv = scenario("hetero-pair-h100-l4.json");
    char *trace = tmp_path(name), *plan = tmp_path("tamper.json");
    plan_traced("llama-3-8b", inv, trace, plan, NULL);
    char *text = NULL;
    px_err e;
    px_assert_ok(px_read_file(trace, 1u << 26, &text, len, &e), &e);
    free(plan);
    free(trace);
    free(inv);
    return text;
}

static void test_replay_refuses_a_trace_with_one_edited_byte(void **state)
{
    (void)state;
    size_t len = 0;
    char *text = preset_trace("edited.trace", &len);
    /* Change one digit inside the plan decision's output (the last line). */
    char *last = strstr(text, "\"kind\":\"decision\"");
    assert_non_null(last);
    while (last > text && last[-1] != '\n')
        last--;
    char *data = strstr(last, "\"data\":");
    assert_non_null(data);
    char *digit = strpbrk(data, "123456789");
    assert_non_null(digit);
    *digit = *digit == '9' ? '8' : (char)(*digit + 1);
    char *path = tmp_path("edited-out.trace");
    px_err e;
    px_assert_ok(px_write_file(path, text, len, &e), &e);
    char *out = NULL, *err = NULL;
    assert_int_equal(plexus((const char *[]){"replay", path, NULL}, &out, &err), 1);
    /* The decision is the sixth line: header, four inputs, the plan. */
    char want[512];
    snprintf(want, sizeof want, "%s:6: hash chain broken", path);
    px_assert_contains(err, want);
    free(out);
    free(err);
    free(path);
    free(text);
}

/* Rewrites every line's chain, altering the plan decision's output on the
 * way, as someone rewriting the whole file would. */
static char *rewrite_with_altered_plan(const char *text, size_t len)
{
    px_strbuf sb = PX_STRBUF_INIT;
    char chain[PX_TRACE_ID_LEN] = "";
    bool altered = false;
    for (const char *p = text; p < text + len;) {
        const char *nl = memchr(p, '\n', (size_t)(text + len - p));
        assert_non_null(nl);
        json_t *obj = json_loadb(p, (size_t)(nl - p), 0, NULL);
        assert_non_null(obj);
        json_object_del(obj, "chain");
        const char *kind = json_string_value(json_object_get(obj, "kind"));
        if (kind && !strcmp(kind, "decision")) {
            json_t *batching = json_object_get(json_object_get(obj, "data"), "batching");
            json_t *replicas = json_object_get(batching, "replicas");
            assert_true(json_is_integer(replicas));
            json_object_set_new(batching, "replicas",
                                json_integer(json_integer_value(replicas) + 1));
            altered = true;
        }
        char *line = px_json_dump_line(obj);
        char next[PX_TRACE_ID_LEN];
        px__trace_chain(chain, line, strlen(line), next);
        memcpy(chain, next, sizeof next);
        free(line);
        json_object_set_new(obj, "chain", json_string(chain));
        line = px_json_dump_line(obj);
        px_strbuf_addf(&sb, "%s\n", line);
        free(line);
        json_decref(obj);
        p = nl + 1;
    }
    assert_true(altered);
    return px_strbuf_detach(&sb, NULL);
}

static void test_replay_reports_a_consistently_altered_plan_as_divergent(void **state)
{
    (void)state;
    size_t len = 0;
    char *text = preset_trace("altered.trace", &len);
    char *forged = rewrite_with_altered_plan(text, len);
    char *path = tmp_path("altered-out.trace");
    px_err e;
    px_assert_ok(px_write_file(path, forged, strlen(forged), &e), &e);
    char *out = NULL, *err = NULL;
    assert_int_equal(plexus((const char *[]){"replay", path, NULL}, &out, &err), 3);
    px_assert_contains(out, "diverged at event 5");
    px_assert_contains(out, "decision \"plan\"");
    px_assert_contains(out, "came out different");
    free(out);
    free(err);

    assert_int_equal(plexus((const char *[]){"replay", "-o", "json", path, NULL}, &out, &err), 3);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    assert_false(json_is_true(json_object_get(doc, "identical")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "divergence"), "seq")),
                     5);
    json_decref(doc);
    free(out);
    free(err);
    free(path);
    free(forged);
    free(text);
}

static void test_replay_usage_errors_exit_2(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(plexus((const char *[]){"replay", NULL}, &out, &err), 2);
    px_assert_contains(err, "FILE is required");
    free(out);
    free(err);
    assert_int_equal(plexus((const char *[]){"replay", "a", "b", NULL}, &out, &err), 2);
    free(out);
    free(err);
    assert_int_equal(plexus((const char *[]){"replay", "-o", "xml", "a", NULL}, &out, &err), 2);
    free(out);
    free(err);
    char *missing = tmp_path("missing.trace");
    assert_int_equal(plexus((const char *[]){"replay", missing, NULL}, &out, &err), 1);
    px_assert_contains(err, missing);
    free(out);
    free(err);
    free(missing);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_trace_with_preset_replays_identical),
        cmocka_unit_test(test_plan_trace_with_options_and_contract_file_replays_identical),
        cmocka_unit_test(test_plan_trace_with_gguf_file_replays_identical),
        cmocka_unit_test(test_replay_refuses_a_changed_or_missing_model_file),
        cmocka_unit_test(test_simulate_trace_replays_identical),
        cmocka_unit_test(test_replay_refuses_a_trace_with_one_edited_byte),
        cmocka_unit_test(test_replay_reports_a_consistently_altered_plan_as_divergent),
        cmocka_unit_test(test_replay_usage_errors_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
