/* Recording a planning run in a trace and re-deriving it: identical
 * replays, hostile recorded inputs, an altered output with a rewritten
 * chain. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/plan.h"
#include "trace/trace_impl.h"

static char *tmp_path(const char *name)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", px_test_tmpdir(), name) < 0)
        fail_msg("asprintf");
    return path;
}

static json_t *load_scenario(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "data/scenarios/%s", name);
    char *path = px_test_source_path(rel);
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_json_load_file(path, NULL, &doc, &err), &err);
    free(path);
    return doc;
}

static const px_trace_deriver *plan_derivers(size_t *n)
{
    const px_trace_deriver *d = px_plan_replay_derivers(n);
    assert_int_equal(*n, 1);
    assert_string_equal(d[0].name, "plan");
    return d;
}

/* Plans llama-3-8b on the hetero pair with the given built-in contract and
 * objective and records the run at path. */
static void record_plan(const char *path, const char *contract_name, px_plan_objective obj)
{
    px_err err;
    json_t *inv = load_scenario("hetero-pair-h100-l4.json");
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_contract *contract = NULL;
    px_plan *plan = NULL;
    px_assert_ok(px_hw_graph_from_value(inv, "inv", NULL, &graph, NULL, &err), &err);
    px_assert_ok(px_ir_model_open_any("llama-3-8b", NULL, &model, &err), &err);
    if (contract_name)
        px_assert_ok(px_contract_builtin(contract_name, &contract, &err), &err);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = graph;
    req.model = model;
    req.contract = contract;
    req.objective = obj;
    req.slo.tpot_s = 0.08;
    req.workload.context = 2048;
    px_assert_ok(px_plan_search(&req, &plan, &err), &err);
    px_trace_writer *w = NULL;
    px_assert_ok(px_trace_writer_open(path, "plan", &w, &err), &err);
    px_plan_trace_inputs in = {
        .inventory = inv, .model_spec = "llama-3-8b", .contract_name = contract_name};
    px_assert_ok(px_plan_trace_record(w, &req, &in, plan, &err), &err);
    assert_int_equal(px_trace_writer_count(w), 5);
    px_assert_ok(px_trace_writer_close(w, &err), &err);
    px_plan_free(plan);
    px_contract_free(contract);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    json_decref(inv);
}

static void test_plan_replay_recomputes_the_recorded_plan(void **state)
{
    (void)state;
    char *path = tmp_path("plan.trace");
    size_t n;
    const px_trace_deriver *d = plan_derivers(&n);
    const char *contracts[] = {NULL, "deterministic"};
    for (size_t i = 0; i < PX_ARRAY_LEN(contracts); i++) {
        record_plan(path, contracts[i], i ? PX_PLAN_OBJ_THROUGHPUT : PX_PLAN_OBJ_LATENCY);
        px_trace_replay_report rep;
        px_err err;
        px_assert_ok(px_trace_replay(path, d, n, NULL, &rep, &err), &err);
        assert_int_equal(rep.n_events, 5);
        assert_int_equal(rep.n_decisions, 1);
        assert_int_equal(rep.n_identical, 1);
        assert_false(rep.diverged);
    }
    free(path);
}

static void test_plan_trace_record_rejects_missing_arguments(void **state)
{
    (void)state;
    px_plan_request req;
    px_plan_request_default(&req);
    px_plan_trace_inputs in = {0};
    px_err err;
    assert_int_equal(px_plan_trace_record(NULL, &req, &in, NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "missing argument");
}

/* Writes a trace whose plan inputs are the given documents (NULL: left
 * out) and replays it; returns the replay's status and report. */
static px_status replay_inputs(const char *model, const char *contract, const char *request,
                               px_trace_replay_report *rep, px_err *err)
{
    char *path = tmp_path("hostile.trace");
    px_trace_writer *w = NULL;
    px_err e;
    px_assert_ok(px_trace_writer_open(path, "plan", &w, &e), &e);
    json_t *inv = load_scenario("hetero-pair-h100-l4.json");
    px_assert_ok(px_trace_input(w, "inventory", inv, NULL, &e), &e);
    json_decref(inv);
    const char *names[] = {"model", "contract", "request"};
    const char *docs[] = {model, contract, request};
    for (size_t i = 0; i < 3; i++) {
        if (!docs[i])
            continue;
        json_t *v = json_loads(docs[i], 0, NULL);
        assert_non_null(v);
        px_assert_ok(px_trace_input(w, names[i], v, NULL, &e), &e);
        json_decref(v);
    }
    json_t *inputs = json_object(), *output = json_object();
    px_assert_ok(px_trace_decision(w, "plan", inputs, output, NULL, &e), &e);
    json_decref(inputs);
    json_decref(output);
    px_assert_ok(px_trace_writer_close(w, &e), &e);
    size_t n;
    const px_trace_deriver *d = plan_derivers(&n);
    px_status st = px_trace_replay(path, d, n, NULL, rep, err);
    free(path);
    return st;
}

static void test_plan_replay_refuses_hostile_recorded_inputs(void **state)
{
    (void)state;
    static const char preset[] = "{\"source\":\"preset\",\"preset\":\"llama-3-8b\"}";
    static const char implied[] = "{\"source\":\"implied\"}";
    static const char request[] =
        "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
        "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"fallbacks\":true,"
        "\"workload\":{\"batch\":0,\"micro_batches\":0,\"context\":4096,\"prompt_tokens\":512,"
        "\"gen_tokens\":256}}";
    const struct {
        const char *model, *contract, *request, *expect;
    } cases[] = {
        {preset, implied, NULL, "lacks the inventory, model, contract or request"},
        {"{\"source\":\"preset\",\"preset\":\"no-such-model\"}", implied, request, "no-such-model"},
        {"{\"source\":\"url\",\"path\":\"x\"}", implied, request, "neither a preset nor a file"},
        {"{\"source\":\"file\",\"path\":\"/nonexistent/m.gguf\",\"sha256\":\"00\"}", implied,
         request, "cannot re-open the model file"},
        {preset, "{\"source\":\"builtin\",\"name\":\"lenient\"}", request, "lenient"},
        {preset, "{\"source\":\"file\",\"document\":[1]}", request, "recorded contract"},
        {preset, "{\"source\":\"magic\"}", request, "neither implied, built in nor a document"},
        {preset, implied, "{\"objective\":\"latency\",\"policy\":\"nope\",\"workload\":{}}",
         "policy \"nope\" is unknown"},
        {preset, implied, "{\"objective\":\"fastest\",\"policy\":\"plexus\",\"workload\":{}}",
         "fastest"},
        {preset, implied, "{\"objective\":\"latency\",\"policy\":\"plexus\",\"workload\":{}}",
         "slo_tpot_s"},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":-1,\"workload\":{}}",
         "slo_tpot_s"},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
         "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"workload\":{\"batch\":-4}}",
         "\"batch\""},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
         "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"workload\":{\"batch\":1,"
         "\"micro_batches\":1,\"context\":4294967295,\"prompt_tokens\":1,\"gen_tokens\":1}}",
         "\"context\""},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
         "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"workload\":{\"batch\":1,"
         "\"micro_batches\":1,\"context\":64,\"prompt_tokens\":65,\"gen_tokens\":1}}",
         "exceeds its context"},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
         "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"max_tp\":-1,\"workload\":{\"batch\":1,"
         "\"micro_batches\":1,\"context\":64,\"prompt_tokens\":1,\"gen_tokens\":1}}",
         "\"max_tp\""},
        {preset, implied,
         "{\"objective\":\"latency\",\"policy\":\"plexus\",\"slo_tpot_s\":0,\"slo_ttft_s\":0,"
         "\"budget_usd_per_hour\":0,\"max_rejected\":12,\"max_tp\":\"one\",\"workload\":{"
         "\"batch\":1,\"micro_batches\":1,\"context\":64,\"prompt_tokens\":1,\"gen_tokens\":1}}",
         "\"max_tp\""},
        {preset, implied, "[]", "lacks \"objective\""},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        px_trace_replay_report rep;
        px_err err;
        px_err_clear(&err);
        px_status st =
            replay_inputs(cases[i].model, cases[i].contract, cases[i].request, &rep, &err);
        if (st != PX_EDIVERGED)
            fail_msg("case %zu: expected a refusal, got %s: %s", i, px_status_name(st), err.msg);
        assert_true(rep.diverged);
        assert_int_equal(rep.n_identical, 0);
        px_assert_contains(rep.divergence, "could not be recomputed");
        px_assert_contains(rep.divergence, cases[i].expect);
    }
}

/* Rewrites the chain of every line after altering the plan's output, as
 * whoever rewrites a whole file can. */
static void test_plan_replay_reports_a_consistently_altered_plan(void **state)
{
    (void)state;
    char *path = tmp_path("altered.trace");
    record_plan(path, NULL, PX_PLAN_OBJ_LATENCY);
    char *text = NULL;
    size_t len = 0;
    px_err err;
    px_assert_ok(px_read_file(path, 1u << 26, &text, &len, &err), &err);
    px_strbuf sb = PX_STRBUF_INIT;
    char chain[PX_TRACE_ID_LEN] = "";
    for (const char *p = text; p < text + len;) {
        const char *nl = memchr(p, '\n', (size_t)(text + len - p));
        assert_non_null(nl);
        json_t *obj = json_loadb(p, (size_t)(nl - p), 0, NULL);
        assert_non_null(obj);
        json_object_del(obj, "chain");
        if (json_object_get(obj, "inputs")) /* the decision: claim another policy */
            json_object_set_new(json_object_get(obj, "data"), "policy", json_string("exo"));
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
    px_assert_ok(px_write_file(path, sb.buf, sb.len, &err), &err);
    size_t n;
    const px_trace_deriver *d = plan_derivers(&n);
    px_trace_replay_report rep;
    assert_int_equal(px_trace_replay(path, d, n, NULL, &rep, &err), PX_EDIVERGED);
    assert_true(rep.diverged);
    assert_int_equal(rep.divergence_seq, 5);
    px_assert_contains(rep.divergence, "decision \"plan\"");
    px_assert_contains(rep.divergence, "came out different");
    px_strbuf_release(&sb);
    free(text);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_replay_recomputes_the_recorded_plan),
        cmocka_unit_test(test_plan_trace_record_rejects_missing_arguments),
        cmocka_unit_test(test_plan_replay_refuses_hostile_recorded_inputs),
        cmocka_unit_test(test_plan_replay_reports_a_consistently_altered_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
