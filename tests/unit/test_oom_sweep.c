/* Out-of-memory sweep, after SQLite's malloc tests: every allocation of
 * the library passes through one seam (src/base/alloc.h), and each
 * scenario below is run again and again with its 1st, 2nd, ... Nth
 * allocation failing, once alone and once with every later allocation
 * failing too.  Each run must end in PX_OK (the code coped) or PX_ENOMEM
 * with a message, never another error, a crash or a
 * leak (make check-asan runs this with LeakSanitizer).  Scenarios: the
 * parsers of untrusted input (inventory, contract, GGUF, llama2.c, OpenAI
 * request bodies, traces, the fleet's node registrations and job
 * specifications), the planner, the session set-up and the report of
 * `plexus run` (text and -o json).  Inside jansson's
 * parser a refusal is counted but not handed over (src/base/alloc.h):
 * jansson 2.14 corrupts its heap on one. */
#include "px_test.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PX_ALLOC_NO_MACROS
#include "base/alloc.h"
#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/fleet.h"
#include "plexus/rt.h"
#include "plexus/serve.h"
#include "plexus/trace.h"

/* At most this many fault positions per scenario and mode: a scenario with
 * more allocations is swept with a stride, always including the first
 * allocations, where set-up paths concentrate. */
#define MAX_RUNS 400

typedef px_status (*scenario_fn)(const void *ctx, px_err *err);

static void sweep(const char *name, scenario_fn fn, const void *ctx)
{
    px_err err;
    px_err_clear(&err);
    /* Count the allocations of a clean run. */
    px__alloc_fault_set(ULONG_MAX, false);
    px_status st = fn(ctx, &err);
    unsigned long total = px__alloc_fault_seen();
    px__alloc_fault_set(0, false);
    if (st != PX_OK)
        fail_msg("%s: the clean run failed: %s: %s", name, px_status_name(st), err.msg);
    assert_true(total > 0);
    unsigned long stride = total / MAX_RUNS + 1;
    for (int persistent = 0; persistent < 2; persistent++) {
        for (unsigned long n = 1; n <= total; n += n < 64 ? 1 : stride) {
            px_err_clear(&err);
            px__alloc_fault_set(n, persistent);
            st = fn(ctx, &err);
            unsigned long fired = px__alloc_fault_fired();
            px__alloc_fault_set(0, false);
            if (!fired)
                break;
            if (st == PX_OK)
                continue;
            if (st != PX_ENOMEM)
                fail_msg("%s: allocation %lu of %lu failed%s: got %s, expected PX_ENOMEM: %s", name,
                         n, total, persistent ? " (and every later one)" : "", px_status_name(st),
                         err.msg);
            if (!err.msg[0])
                fail_msg("%s: allocation %lu failed: PX_ENOMEM without a message", name, n);
        }
    }
    printf("%s: %lu allocations swept\n", name, total);
}

static char *slurp(const char *rel, size_t *len)
{
    char *path = px_test_source_path(rel);
    char *text = NULL;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 24, &text, len, &err), &err);
    free(path);
    return text;
}

/* ------------------------------------------------------------------ */

typedef struct text_ctx {
    const char *text;
    size_t len;
} text_ctx;

static px_status inventory(const void *ctx, px_err *err)
{
    const text_ctx *t = ctx;
    px_hw_graph *g = NULL;
    px_diags d;
    px_diags_init(&d);
    px_status st = px_hw_graph_from_json(t->text, t->len, "emu-small.json", NULL, &g, &d, err);
    px_hw_graph_free(g);
    px_diags_release(&d);
    return st;
}

static void test_inventory_reader_survives_every_allocation_failure(void **state)
{
    (void)state;
    text_ctx t;
    char *text = slurp("data/scenarios/emu-small.json", &t.len);
    t.text = text;
    sweep("inventory", inventory, &t);
    free(text);
}

static px_status contract(const void *ctx, px_err *err)
{
    const text_ctx *t = ctx;
    px_contract *c = NULL;
    px_diags d;
    px_diags_init(&d);
    px_status st = px_contract_parse(t->text, t->len, "strict.json", &d, &c, err);
    px_contract_free(c);
    px_diags_release(&d);
    return st;
}

static void test_contract_parser_survives_every_allocation_failure(void **state)
{
    (void)state;
    text_ctx t;
    char *text = slurp("data/contracts/strict.json", &t.len);
    t.text = text;
    sweep("contract", contract, &t);
    free(text);
}

static px_status model(const void *ctx, px_err *err)
{
    const char *path = ctx;
    px_ir_model *m = NULL;
    px_status st = px_ir_model_open(path, NULL, &m, err);
    px_ir_model_free(m);
    return st;
}

static char *synth_model(void)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 32;
    o.hidden_dim = 64;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.vocab_size = 300;
    o.context_length = 64;
    char *path = px_asprintf("%s/sweep.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    return path;
}

static void test_gguf_reader_survives_every_allocation_failure(void **state)
{
    (void)state;
    char *path = synth_model();
    sweep("gguf", model, path);
    free(path);
}

static void test_llama2c_reader_survives_every_allocation_failure(void **state)
{
    (void)state;
    char *path = px_test_require_shared_model("stories260K.bin");
    sweep("llama2.c", model, path);
    free(path);
}

typedef struct plan_ctx {
    const char *inventory;
    size_t len;
    const char *model;
} plan_ctx;

static px_status plan(const void *ctx, px_err *err)
{
    const plan_ctx *c = ctx;
    px_hw_graph *g = NULL;
    px_ir_model *m = NULL;
    px_plan *p = NULL;
    px_status st =
        px_hw_graph_from_json(c->inventory, c->len, "emu-small.json", NULL, &g, NULL, err);
    if (st == PX_OK)
        st = px_ir_model_open(c->model, NULL, &m, err);
    if (st == PX_OK) {
        px_plan_request req;
        px_plan_request_default(&req);
        req.graph = g;
        req.model = m;
        st = px_plan_search(&req, &p, err);
    }
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    return st;
}

static void test_planner_survives_every_allocation_failure(void **state)
{
    (void)state;
    plan_ctx c;
    char *text = slurp("data/scenarios/emu-small.json", &c.len);
    c.inventory = text;
    char *path = synth_model();
    c.model = path;
    sweep("planner", plan, &c);
    free(path);
    free(text);
}

static px_status session(const void *ctx, px_err *err)
{
    const char *path = ctx;
    px_rt_model *m = NULL;
    px_rt_session *s = NULL;
    px_status st = px_rt_model_open(path, &m, err);
    if (st == PX_OK) {
        px_rt_session_opts so = {.n_threads = 1, .max_seqs = 2};
        st = px_rt_session_new(m, &so, &s, err);
    }
    px_rt_session_free(s);
    px_rt_model_free(m);
    return st;
}

static void test_session_set_up_survives_every_allocation_failure(void **state)
{
    (void)state;
    char *path = synth_model();
    sweep("session", session, path);
    free(path);
}

/* OpenAI request bodies, as the server receives them: escapes, unicode,
 * content parts, stops, sampling options and a prompt of token ids. */
typedef struct body_ctx {
    px_serve_api api;
    const char *body;
} body_ctx;

static px_status request_body(const void *ctx, px_err *err)
{
    const body_ctx *b = ctx;
    px_serve_request req;
    px_serve_error e = {0};
    px_status st = px_serve_request_parse(b->api, b->body, strlen(b->body), NULL, &req, &e);
    if (st != PX_OK)
        px_err_set(err, st, "%s", e.message);
    px_serve_request_release(&req);
    return st;
}

static void test_openai_request_bodies_survive_every_allocation_failure(void **state)
{
    (void)state;
    static const body_ctx chat = {
        PX_SERVE_API_CHAT,
        "{\"model\": \"stories-260k\", \"messages\": ["
        "{\"role\": \"developer\", \"content\": \"You answer \\\"briefly\\\",\\nin one line.\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Once upon a time "
        "\\u00e9t\\u00e9 \\ud83d\\ude00 there was\"}, {\"type\": \"text\", \"text\": \"a cat\"}]},"
        "{\"role\": \"assistant\", \"content\": \"a dog named \\\\Rex\\/Max\\t\"},"
        "{\"role\": \"user\", \"content\": \"and then?\"}],"
        " \"max_tokens\": 32, \"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": 40,"
        " \"seed\": 1234, \"stop\": [\"\\n\\n\", \"The end\"], \"stream\": true,"
        " \"stream_options\": {\"include_usage\": true}, \"logprobs\": true, \"top_logprobs\": 3,"
        " \"x-unknown-member\": {\"nested\": [1, 2.5, null, false]}}"};
    static const body_ctx completion = {
        PX_SERVE_API_COMPLETIONS,
        "{\"model\": \"stories-260k\", \"prompt\": [1, 307, 4299, 29892, 727, 471, 263],"
        " \"max_tokens\": 16, \"min_p\": 0.05, \"stop\": \"\\u0021\\u0021\", \"logprobs\": 2,"
        " \"ignore_eos\": true}"};
    sweep("chat completion body", request_body, &chat);
    sweep("completion body", request_body, &completion);
}

/* The trace reader over a trace written here: inputs, decisions with
 * their recomputed ids, observations and an outcome. */
static px_status trace(const void *ctx, px_err *err)
{
    const text_ctx *t = ctx;
    px_trace_reader *r = NULL;
    px_status st = px_trace_reader_open_memory(t->text, t->len, "sweep.trace", NULL, &r, err);
    size_t events = 0;
    for (bool done = false; st == PX_OK && !done;) {
        px_trace_event ev;
        st = px_trace_next(r, &ev, &done, err);
        events += st == PX_OK && !done;
    }
    px_trace_reader_free(r);
    if (st == PX_OK && events != 5)
        return px_err_set(err, PX_EINTERNAL, "read %zu events of 5", events);
    return st;
}

static char *write_trace(size_t *len)
{
    char *path = px_asprintf("%s/sweep.trace", px_test_tmpdir());
    px_trace_writer *w;
    px_err err;
    px_assert_ok(px_trace_writer_open(path, "plexus plan --model \"m\\u00e9\"", &w, &err), &err);
    json_t *inv = json_pack("{s:s, s:[{s:s, s:f}, {s:s, s:f}]}", "name", "two-gpu node", "devices",
                            "id", "gpu0", "tflops", 989.5, "id", "gpu1", "tflops", 989.5);
    json_t *in = json_pack("{s:s, s:i}", "model", "llama-3-8b", "layers", 32);
    json_t *out = json_pack("{s:[i, i], s:f, s:s}", "split", 16, 16, "cost_ms", 12.25, "why",
                            "balanced \"halves\"\n");
    json_t *obs = json_pack("{s:[f, f, f]}", "step_ms", 12.0, 12.5, 11.75);
    px_assert_ok(px_trace_input(w, "inventory", inv, NULL, &err), &err);
    px_assert_ok(px_trace_decision(w, "placement", in, out, NULL, &err), &err);
    px_assert_ok(px_trace_observation(w, "timings", obs, &err), &err);
    px_assert_ok(px_trace_mitigation(w, "rebalance", obs, out, NULL, &err), &err);
    px_assert_ok(px_trace_outcome(w, "done", out, &err), &err);
    px_assert_ok(px_trace_writer_close(w, &err), &err);
    json_decref(inv);
    json_decref(in);
    json_decref(out);
    json_decref(obs);
    char *text = NULL;
    px_assert_ok(px_read_file(path, 1 << 20, &text, len, &err), &err);
    free(path);
    return text;
}

static void test_trace_reader_survives_every_allocation_failure(void **state)
{
    (void)state;
    text_ctx t;
    char *text = write_trace(&t.len);
    t.text = text;
    sweep("trace", trace, &t);
    free(text);
}

/* The fleet's parsers of what agents and users send: a node's
 * registration (its inventory) and a job specification, each read from
 * its JSON text as the server reads a request body. */
static px_status registration(const void *ctx, px_err *err)
{
    const char *text = ctx;
    json_t *reg = NULL;
    px_fleet_sched *s = NULL;
    px_status st = px_json_parse(text, strlen(text), "registration", NULL, &reg, err);
    if (st == PX_OK)
        st = px_fleet_sched_new(&s, err);
    size_t index = 0;
    if (st == PX_OK)
        st = px_fleet_sched_add_node(s, reg, &index, err);
    if (st == PX_OK)
        st = px_fleet_sched_find_node(s, "gpu-node-01", &index, err);
    px_fleet_sched_free(s);
    json_decref(reg);
    return st;
}

static px_status job_spec(const void *ctx, px_err *err)
{
    const char *text = ctx;
    json_t *spec = NULL;
    px_fleet_request *r = NULL;
    px_status st = px_json_parse(text, strlen(text), "job", NULL, &spec, err);
    if (st == PX_OK)
        st = px_fleet_request_compile(spec, &r, err);
    if (st == PX_OK && px_fleet_request_members(r) != 2)
        st = px_err_set(err, PX_EINTERNAL, "the job has %d members, not 2",
                        px_fleet_request_members(r));
    px_fleet_request_free(r);
    json_decref(spec);
    return st;
}

static void test_fleet_parsers_survive_every_allocation_failure(void **state)
{
    (void)state;
    static const char reg[] = "{\"name\": \"gpu-node-01\", \"cpus\": 16, \"memory\": \"64 GiB\", "
                              "\"node\": {\"devices\": ["
                              "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"nvidia\", "
                              "\"model\": \"H100 80GB HBM3\","
                              " \"capability\": \"9.0\", \"memory\": [{\"capacity\": \"80 GB\"}]},"
                              "{\"id\": \"gpu1\", \"class\": \"gpu\", \"vendor\": \"nvidia\", "
                              "\"model\": \"H100 80GB HBM3\","
                              " \"capability\": \"9.0\", \"memory\": [{\"capacity\": \"80 GB\"}]}],"
                              " \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.3.1\"},"
                              " {\"name\": \"vllm\", \"version\": \"0.5.4\"}]}}";
    static const char job[] =
        "{\"name\": \"train-\\u00e9t\\u00e9\", \"command\": [\"python3\", \"train.py\", "
        "\"--lr=3e-4\"], \"nodes\": 2, \"launcher\": \"torchrun\", \"max_attempts\": 3,"
        " \"env\": {\"NCCL_DEBUG\": \"INFO\", \"OMP_NUM_THREADS\": \"8\"},"
        " \"resources\": {\"gpus\": 2, \"gpu_memory\": \"40 GB\", \"vendor\": \"nvidia\","
        " \"capability\": \">=8.0\", \"cpus\": 8, \"memory\": \"32 GiB\"},"
        " \"frameworks\": [\"torch>=2.1\"], \"x-team\": \"ml\"}";
    sweep("fleet registration", registration, reg);
    sweep("fleet job specification", job_spec, job);
}

/* The report `plexus run` prints (text, and -o json through the printer's
 * canonical form) of a two-stage emulated run with per-op telemetry.  A
 * run that copes must print the whole report, the same as a clean run: a
 * report missing a member or a line is a failure (PX_EINVAL here). */
typedef struct report_ctx {
    px_rt_pipeline_spec spec;
    px_rt_pipeline_stats stats;
    char *clean_json, *clean_text; /* the reports of a run without faults */
} report_ctx;

static px_status run_report(const report_ctx *c, char **json_text, char **text, px_err *err)
{
    *json_text = *text = NULL;
    json_t *doc = px_rt_pipeline_report_json(&c->spec, NULL, &c->stats);
    if (!doc)
        return px_err_set(err, PX_ENOMEM, "the run report (-o json): out of memory");
    *json_text = px_json_dump_canonical(doc);
    json_decref(doc);
    if (!*json_text)
        return px_err_set(err, PX_ENOMEM, "printing the run report: out of memory");
    px_strbuf sb = PX_STRBUF_INIT;
    if (px_rt_pipeline_report(&c->spec, NULL, &c->stats, &sb) != PX_OK) {
        px_strbuf_release(&sb);
        return px_err_set(err, PX_ENOMEM, "the run report: out of memory");
    }
    *text = px_strbuf_detach(&sb, NULL);
    return *text ? PX_OK : px_err_set(err, PX_ENOMEM, "the run report: out of memory");
}

static px_status report(const void *ctx, px_err *err)
{
    const report_ctx *c = ctx;
    char *json_text, *text;
    px_status st = run_report(c, &json_text, &text, err);
    if (st == PX_OK && strcmp(json_text, c->clean_json))
        st = px_err_set(err, PX_EINVAL, "a partial -o json report:\n%.600s", json_text);
    else if (st == PX_OK && strcmp(text, c->clean_text))
        st = px_err_set(err, PX_EINVAL, "a partial text report:\n%.600s", text);
    free(json_text);
    free(text);
    return st;
}

static void test_run_report_survives_every_allocation_failure(void **state)
{
    (void)state;
    static report_ctx c; /* large: not on the stack */
    memset(&c, 0, sizeof c);
    px_rt_interval iv = {0.002, 0.001, 0.004};
    c.spec.n_stages = c.stats.n_stages = 2;
    snprintf(c.spec.plan_id, sizeof c.spec.plan_id, "0123456789abcdef");
    c.spec.emulated = true;
    c.spec.plan_prompt_tokens = 8;
    c.spec.pred_tpot_s = c.spec.pred_ttft_s = iv;
    static px_rt_op_total ops[2][3];
    for (uint32_t i = 0; i < 2; i++) {
        px_rt_stage_spec *s = &c.spec.stages[i];
        s->layer_begin = i * 2;
        s->layer_end = i * 2 + 2;
        s->embedding = i == 0;
        s->head = i == 1;
        snprintf(s->device, sizeof s->device, "local.emu-%c", 'a' + (int)i);
        snprintf(s->backend, sizeof s->backend, "emu");
        s->emulated = true;
        s->pred_decode_s = s->pred_prefill_s = iv;
        px_rt_stage_stats *ss = &c.stats.stages[i];
        ss->prefill_steps = 1;
        ss->prefill_ns = 3000000;
        ss->decode_steps = 10;
        ss->decode_ns = 25000000;
        ss->xfer_in_decode_ns = 100000;
        for (int e = 0; e < 3; e++)
            ops[i][e] = (px_rt_op_total){(int32_t)(i * 2 + (uint32_t)e / 2),
                                         e ? PX_IR_OP_MATMUL : PX_IR_OP_ATTENTION,
                                         10,
                                         1000000,
                                         4000000,
                                         800000};
        ss->ops = ops[i];
        ss->n_ops = 3;
    }
    c.stats.gen.prompt_tokens = 16;
    c.stats.gen.decode_tokens = 20;
    c.stats.gen.prefill_ns = 6000000;
    c.stats.gen.decode_ns = 50000000;
    c.stats.ttft_ns = 7000000;
    c.stats.decode_steps = 10;
    c.stats.n_prompts = 1;
    px_err err;
    px_assert_ok(run_report(&c, &c.clean_json, &c.clean_text, &err), &err);
    px_assert_contains(c.clean_json, "\"matmul\"");
    px_assert_contains(c.clean_text, "prefill: 16 tokens");
    sweep("run report", report, &c);
    free(c.clean_json);
    free(c.clean_text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inventory_reader_survives_every_allocation_failure),
        cmocka_unit_test(test_contract_parser_survives_every_allocation_failure),
        cmocka_unit_test(test_gguf_reader_survives_every_allocation_failure),
        cmocka_unit_test(test_llama2c_reader_survives_every_allocation_failure),
        cmocka_unit_test(test_planner_survives_every_allocation_failure),
        cmocka_unit_test(test_session_set_up_survives_every_allocation_failure),
        cmocka_unit_test(test_openai_request_bodies_survive_every_allocation_failure),
        cmocka_unit_test(test_trace_reader_survives_every_allocation_failure),
        cmocka_unit_test(test_fleet_parsers_survive_every_allocation_failure),
        cmocka_unit_test(test_run_report_survives_every_allocation_failure),
    };
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
