/* plexus run: a model through a plan, one worker process per stage. */
#include "cli/cli.h"

#include "plexus/contract.h"
#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/rt.h"
#include "plexus/trace.h"

const char px__cmd_run_summary[] = "run a model through a plan: one worker process per stage";

#define MAX_PROMPTS PX_CLI_LIST_MAX
#define MAX_INJECTS 32

typedef struct run_opts {
    const char *model, *plan, *inventory, *objective, *contract, *tokenizer, *prompts_file;
    const char *prompts[MAX_PROMPTS];
    uint32_t n_prompts, n_new, threads, timeout_ms;
    px_heal_inject injects[MAX_INJECTS];
    uint32_t n_injects, audit_every;
    bool no_heal;
    const char *trace, *incidents;
    double temp, top_p;
    uint64_t seed;
    px_rt_transport transport;
    const char *stage_host; /* --transport tcp:A.B.C.D */
    px_cli_format format;
    px_ir_open_opts open; /* --kv-dtype */
    char *file_text;      /* --prompts contents; prompts point into it */
} run_opts;

static int read_prompts(run_opts *o)
{
    px_err err;
    size_t len;
    if (px_read_file(o->prompts_file, 1u << 20, &o->file_text, &len, &err) != PX_OK)
        return px__cli_fail("run", &err);
    char *line = o->file_text;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (nl && nl > line && nl[-1] == '\r')
            nl[-1] = 0;
        if (line[0]) {
            if (o->n_prompts == MAX_PROMPTS)
                return px__cli_usage_error("run", "%s: at most %d prompts", o->prompts_file,
                                           MAX_PROMPTS);
            o->prompts[o->n_prompts++] = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    return PX_EXIT_OK;
}

static px__cli_sampling R;
static run_opts RO;
static px_cli_list injects;
static px__cli_transport transport;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &RO.model, "FILE", ".gguf or llama2.c .bin",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("plan", 0, PX_CLI_STR, &RO.plan, "FILE",
               "a plexus.plan/1 document (plexus plan --out FILE)"),
    PX_CLI_OPT("inventory", 'i', PX_CLI_STR, &RO.inventory, "FILE",
               "the inventory: devices' backends and emulation\n"
               "profiles; with no --plan, what the planner places the\n"
               "model on"),
    PX_CLI_OPT("objective", 0, PX_CLI_STR, &RO.objective, "NAME",
               "planner objective (default latency)"),
    PX_CLI_OPT("contract", 0, PX_CLI_STR, &RO.contract, "FILE|NAME",
               "numerical contract for the planner"),
    PX_CLI_OPT("kv-dtype", 0, PX_CLI_CALL, &RO.open, "DTYPE",
               "the KV cache's dtype for the planner: f32, the one the\n"
               "stage workers keep (plexus plan --kv-dtype costs others)",
               .parse = px__cli_parse_kv_dtype),
    PX__CLI_SAMPLING_OPTS(R),
    PX_CLI_OPT("prompts", 0, PX_CLI_STR, &RO.prompts_file, "FILE", "one prompt per line"),
    PX_CLI_OPT("threads", 0, PX_CLI_U32, &RO.threads, "N", "threads per worker (default 1)",
               .lo = 1, .hi = 1024),
    PX_CLI_OPT("transport", 0, PX_CLI_CALL, &transport, "KIND",
               "unix sockets (default), tcp on 127.0.0.1, or\n"
               "tcp:A.B.C.D: workers started by a launcher, listening\n"
               "on that address, every connection authenticated with\n"
               "the run's secret",
               .parse = px__cli_parse_transport),
    PX_CLI_OPT("timeout-ms", 0, PX_CLI_U32, &RO.timeout_ms, "T",
               "limit of every wait on a worker (default 10000)", .hi = 86400000),
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &RO.format, "FORMAT",
               "text streams tokens; json prints one document at the end"),
    PX_CLI_OPT("inject", 0, PX_CLI_LIST, &injects, "SPEC",
               "inject a fault (repeat): KIND:TARGET[:PARAM=VALUE,...]@tokenN,\n"
               "e.g. kill:stage1@token20, stop:stage1@token20,\n"
               "crash:stage0@token5, slow:stage1:factor=4,tau=500ms@token5,\n"
               "link:stage0>stage1:latency=5ms,period=100ms,duty=0.5@token10,\n"
               "corrupt:stage1:magnitude=0.5@token12"),
    PX_CLI_OPT("no-heal", 0, PX_CLI_FLAG, &RO.no_heal, NULL,
               "inject, detect and report, but change nothing"),
    PX_CLI_OPT("audit-every", 0, PX_CLI_U32, &RO.audit_every, "N",
               "recompute every Nth decode step in this process on the\n"
               "cpu backend and compare each stage's output (silent\n"
               "corruption); text is then printed at the end",
               .hi = 1u << 24),
    PX_CLI_OPT("trace", 0, PX_CLI_STR, &RO.trace, "FILE",
               "record inputs, observations and decisions (plexus replay)"),
    PX_CLI_OPT("incidents", 0, PX_CLI_STR, &RO.incidents, "FILE",
               "write the incident records (plexus.incident/1) as a JSON\narray"),
    {0},
};

static const px_cli_spec run_spec = {
    .name = "run",
    .synopsis = "--model FILE (--plan FILE | --inventory FILE) (--prompt TEXT ... | --prompts "
                "FILE) [options]",
    .about = "Starts one plexus worker process per stage of the plan, each holding its layers,\n"
             "its KV cache and its backend (cpu, or emu for an emulated device), joined by\n"
             "framed connections; streams the tokens as they are produced, then prints, per\n"
             "stage, the observed decode time per token and prefill time against the plan's\n"
             "predicted intervals, end to end, and tokens/s.  Without --plan the planner\n"
             "chooses one for the inventory.  Emulated devices are marked as such on every\n"
             "line.  The prompts and sampling options, and their defaults, are those of\n"
             "plexus generate.",
    .opts = opts,
    .more = "Self-healing: --inject, --no-heal, --audit-every and --trace put the run under\n"
            "supervision.  Healing plans alternatives on the inventory: without --inventory\n"
            "only a crashed or hung worker can be restarted.  Each incident is printed after\n"
            "the report.",
    .examples = "plexus run -m stories260K.gguf -i data/scenarios/hetero-pair-h100-l4.json \\\n"
                "    --prompt \"Once upon a time\" -n 32\n"
                "plexus run -m model.gguf --plan plan.json --prompts prompts.txt -o json\n"
                "plexus run -m model.gguf -i inv.json --prompt hi --inject kill:stage1@token20\n",
};
const px_cli_spec *const px__cmd_run_specs[] = {&run_spec, NULL};

static int parse_args(int argc, char **argv, run_opts *o)
{
    R = PX__CLI_SAMPLING_DEFAULTS;
    RO = (run_opts){.threads = 1, .timeout_ms = 10000};
    memset(&injects, 0, sizeof injects);
    transport = (px__cli_transport){0};
    *o = RO;
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&run_spec, argc, argv, &args, &rc))
        return rc == PX_EXIT_OK ? -1 : rc;
    *o = RO;
    o->tokenizer = R.tokenizer;
    o->n_new = R.n_new;
    o->temp = R.temp;
    o->top_p = R.top_p;
    o->seed = R.seed;
    for (size_t i = 0; i < R.prompts.n; i++)
        o->prompts[o->n_prompts++] = R.prompts.v[i];
    if (!px__cli_parse_injects("run", &injects, o->injects, MAX_INJECTS, &o->n_injects))
        return PX_EXIT_USAGE;
    o->transport = transport.kind;
    o->stage_host = transport.host;
    /* The workers keep the cache in f32 whatever the plan says: a plan
     * costed in another dtype would predict memory and time for a cache
     * that does not run. */
    if (o->open.kv_dtype_given && o->open.kv_dtype != PX_DTYPE_F32)
        return px__cli_usage_error("run",
                                   "--kv-dtype %s: the stage workers keep the KV cache in f32, "
                                   "so a plan for another dtype would not be what runs; pass "
                                   "f32 here, and cost others with plexus plan --kv-dtype",
                                   px_dtype_name(o->open.kv_dtype));
    if (!o->plan && !o->inventory)
        return px__cli_usage_error("run", "give --plan FILE, or --inventory FILE for the planner "
                                          "to make one");
    if (o->prompts_file) {
        rc = read_prompts(o);
        if (rc)
            return rc;
    }
    if (o->n_prompts == 0)
        return px__cli_usage_error("run", "--prompt TEXT or --prompts FILE is required");
    return PX_EXIT_OK;
}

/* The planner's request for this run's workload (the contract, owned by
 * the caller, in *contract). */
static px_status run_request(const run_opts *o, const px_hw_graph *g, const px_ir_model *ir,
                             uint32_t prompt_tokens, px_plan_request *req, px_contract **contract,
                             px_err *err)
{
    px_plan_request_default(req);
    /* The stage workers run one device per stage. */
    req->max_tp = 1;
    *contract = NULL;
    px_status st = PX_OK;
    if (o->objective && (st = px_plan_objective_parse(o->objective, &req->objective, err)))
        return st;
    if (o->contract && (st = px_contract_load(o->contract, NULL, contract, err)))
        return px_err_prefix(err, st, "contract %s: ", o->contract);
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    req->graph = g;
    req->model = ir;
    req->contract = *contract;
    req->workload.batch = o->n_prompts;
    req->workload.context = hp->context_length ? hp->context_length : 2048;
    req->workload.prompt_tokens = PX_MAX(prompt_tokens, 1u);
    req->workload.gen_tokens = PX_MAX(o->n_new, 1u);
    return PX_OK;
}

/* A given plan was made for its own workload and objective: healing
 * plans its alternatives for the same, so that they compare. */
static void request_from_plan(const json_t *plan, px_plan_request *req)
{
    const json_t *wl = json_object_get(plan, "workload");
    const char *obj =
        json_string_value(json_object_get(json_object_get(plan, "objective"), "name"));
    px_plan_objective o;
    if (obj && px_plan_objective_parse(obj, &o, NULL) == PX_OK)
        req->objective = o;
    struct {
        const char *key;
        uint32_t *field;
    } f[] = {{"batch", &req->workload.batch},
             {"micro_batches", &req->workload.micro_batches},
             {"context", &req->workload.context},
             {"prompt_tokens", &req->workload.prompt_tokens},
             {"gen_tokens", &req->workload.gen_tokens}};
    for (size_t i = 0; i < PX_ARRAY_LEN(f); i++) {
        const json_t *v = json_object_get(wl, f[i].key);
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= (1 << 24))
            *f[i].field = (uint32_t)json_integer_value(v);
    }
}

/* Asks the planner; with a trace, records the planning decision. */
static px_status make_plan(const run_opts *o, const px_plan_request *req, px_trace_writer *w,
                           const json_t *inventory_doc, json_t **out, px_err *err)
{
    px_plan *plan = NULL;
    json_t *contract_doc = NULL;
    px_status st = px_plan_search(req, &plan, err);
    if (st == PX_OK && w) {
        px_plan_trace_inputs in = {.inventory = inventory_doc, .model_spec = o->model};
        px_contract *builtin = NULL;
        if (o->contract && px_contract_builtin(o->contract, &builtin, NULL) == PX_OK)
            in.contract_name = o->contract;
        else if (o->contract && px_json_load_file(o->contract, NULL, &contract_doc, NULL) == PX_OK)
            in.contract_doc = contract_doc;
        px_contract_free(builtin);
        st = px_plan_trace_record(w, req, &in, plan, err);
    }
    if (st == PX_OK) {
        *out = px_plan_to_json(plan);
        if (!*out)
            st = px_err_set(err, PX_ENOMEM, "out of memory");
    }
    json_decref(contract_doc);
    px_plan_free(plan);
    return st;
}

typedef struct run_out {
    const run_opts *o;
    px_strbuf text[MAX_PROMPTS];
    json_t *ids[MAX_PROMPTS];
    /* Byte length of text[i] before each token, for taking tokens back. */
    size_t *ends[MAX_PROMPTS];
    size_t n_ends[MAX_PROMPTS], cap_ends[MAX_PROMPTS];
    bool echoed, stream;
} run_out;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    run_out *r = ud;
    if (len == 1 && (unsigned char)piece[0] < 0x20 && piece[0] != '\n' && piece[0] != '\t')
        len = 0;
    if (r->n_ends[prompt] == r->cap_ends[prompt]) {
        size_t cap = r->cap_ends[prompt] ? 2 * r->cap_ends[prompt] : 64;
        size_t *e = realloc(r->ends[prompt], cap * sizeof *e);
        if (e) {
            r->ends[prompt] = e;
            r->cap_ends[prompt] = cap;
        }
    }
    if (r->n_ends[prompt] < r->cap_ends[prompt])
        r->ends[prompt][r->n_ends[prompt]++] = r->text[prompt].len;
    px_strbuf_add(&r->text[prompt], piece, len);
    json_array_append_new(r->ids[prompt], json_integer(token));
    if (r->stream) {
        if (!r->echoed) {
            fputs(r->o->prompts[0], stdout);
            r->echoed = true;
        }
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
    }
}

/* A rollback took tokens of a prompt back: forget them. */
static void on_retract(uint32_t prompt, uint32_t kept, void *ud)
{
    run_out *r = ud;
    if (prompt >= MAX_PROMPTS || kept >= r->n_ends[prompt])
        return;
    r->text[prompt].len = r->ends[prompt][kept];
    if (r->text[prompt].buf)
        r->text[prompt].buf[r->text[prompt].len] = 0;
    r->n_ends[prompt] = kept;
    while (json_array_size(r->ids[prompt]) > kept)
        json_array_remove(r->ids[prompt], json_array_size(r->ids[prompt]) - 1);
}

/* What a supervised run adds: the trace, the healing supervisor. */
typedef struct run_heal {
    bool on;
    json_t *inventory_doc;
    px_trace_writer *trace;
    px_plan_request req;
    px_contract *contract;
    px_heal_run *run;
    char command[1024];
} run_heal;

static void command_line(int argc, char **argv, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < argc && n + 4 < cap; i++) {
        bool quote = strpbrk(argv[i], " '\"><;&|*?") != NULL;
        int w = snprintf(out + n, cap - n, "%s%s%s%s", i ? " " : "plexus ", quote ? "'" : "",
                         argv[i], quote ? "'" : "");
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
}

static px_status start_heal(const run_opts *o, run_heal *rh, const px_hw_graph *graph,
                            const px_ir_model *ir, const json_t *plan,
                            const px_rt_executor_opts *xo, run_out *ro, px_err *err)
{
    px_heal_run_opts ho;
    px_heal_run_opts_default(&ho);
    ho.graph = graph;
    ho.inventory_doc = rh->inventory_doc;
    ho.model = ir;
    ho.model_path = o->model;
    ho.contract = rh->contract;
    ho.contract_spec = o->contract;
    ho.request = rh->req;
    ho.plan = plan;
    ho.planned = !o->plan;
    ho.executor = *xo;
    ho.injects = o->injects;
    ho.n_injects = o->n_injects;
    ho.trace = rh->trace;
    ho.command = rh->command;
    ho.trace_path = o->trace;
    ho.heal = !o->no_heal;
    ho.audit_every = o->audit_every;
    ho.seed = o->seed;
    ho.prompts = o->prompts;
    ho.n_prompts = o->n_prompts;
    ho.max_new_tokens = o->n_new;
    ho.on_retract = on_retract;
    ho.ud = ro;
    return px_heal_run_new(&ho, &rh->run, err);
}

/* After the report: each incident as a paragraph, and the records. */
static int finish_heal(const run_opts *o, run_heal *rh, run_out *ro, bool print, px_err *err)
{
    const char *texts[MAX_PROMPTS];
    for (uint32_t i = 0; i < o->n_prompts; i++)
        texts[i] = ro->text[i].buf ? ro->text[i].buf : "";
    if (px_heal_run_finish(rh->run, texts, o->n_prompts, err) != PX_OK)
        return px__cli_fail("run", err);
    if (print) {
        px_strbuf sb = PX_STRBUF_INIT;
        if (px_heal_run_report(rh->run, &sb) != PX_OK) {
            px_strbuf_release(&sb);
            px_err_set(err, PX_ENOMEM, "the incident report cannot be written: out of memory");
            return px__cli_fail("run", err);
        }
        if (sb.len)
            printf("\nincidents:%s", sb.buf);
        else if (o->n_injects)
            printf("\nincidents: none\n");
        px_strbuf_release(&sb);
    }
    if (o->incidents) {
        json_t *inc = px_heal_run_incidents(rh->run);
        char *text = inc ? json_dumps(inc, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        px_status st = text ? px_write_file(o->incidents, text, strlen(text), err)
                            : px_err_set(err, PX_ENOMEM, "out of memory");
        free(text);
        json_decref(inc);
        if (st != PX_OK)
            return px__cli_fail("run", err);
        px__cli_wrote("run", o->incidents, "the incidents");
    }
    if (rh->trace) {
        px_status st = px_trace_writer_close(rh->trace, err);
        rh->trace = NULL;
        if (st != PX_OK)
            return px__cli_fail("run", err);
        px__cli_wrote("run", o->trace, "the trace");
    }
    return PX_EXIT_OK;
}

/* Everything one run holds; run_release frees it. */
typedef struct run_ctx {
    run_opts o;
    px_err err;
    px_hw_graph *graph;
    px_ir_model *ir;
    px_arena *arena;
    px_ir_vocab file_vocab;
    px_rt_tokenizer *tok;
    /* Each prompt encoded once (BOS first): its length sizes the plan, and
     * the executor generates from it. */
    int32_t *prompt_ids[MAX_PROMPTS];
    size_t n_prompt_ids[MAX_PROMPTS];
    json_t *plan;
    px_rt_pipeline_spec spec;
    px_rt_executor_opts xo;
    char ret_addr[96];
    px_rt_local_launcher *launcher;
    px_rt_executor *ex;
    px_rt_pipeline_stats stats;
    run_out ro;
    run_heal rh;
} run_ctx;

/* The inventory (and its document, for a supervised run), the model, its
 * tokenizer and the trace. */
static int run_load(run_ctx *c)
{
    const run_opts *o = &c->o;
    if (o->inventory) {
        px_diags diags;
        px_diags_init(&diags);
        if (px_hw_graph_load(o->inventory, NULL, &c->graph, &diags, &c->err) != PX_OK) {
            char *report = px_diags_format(&diags, o->inventory);
            fprintf(stderr, "plexus run: refusing the inventory %s:\n%s", o->inventory,
                    report ? report : c->err.msg);
            free(report);
            px_diags_release(&diags);
            return PX_EXIT_FAIL;
        }
        px_diags_release(&diags);
        if (c->rh.on &&
            px_json_load_file(o->inventory, NULL, &c->rh.inventory_doc, &c->err) != PX_OK)
            return px__cli_fail("run", &c->err);
    }
    if (c->rh.on && !o->inventory && (o->n_injects || o->audit_every) && !o->no_heal)
        fprintf(stderr, "plexus run: healing needs --inventory FILE to plan alternatives; "
                        "without it faults are injected, detected and reported, and only a "
                        "crashed or hung worker is restarted\n");
    const px_ir_vocab *vocab = NULL;
    if (px_ir_model_open_any(o->model, &o->open, &c->ir, &c->err) != PX_OK ||
        px_arena_new(0, &c->arena, &c->err) != PX_OK ||
        px__cli_find_vocab(o->model, o->tokenizer, c->ir, c->arena, &c->file_vocab, &vocab,
                           &c->err) != PX_OK ||
        px_rt_tokenizer_new(vocab, &c->tok, &c->err) != PX_OK)
        return px__cli_fail("run", &c->err);
    if (o->trace && px_trace_writer_open(o->trace, "run", &c->rh.trace, &c->err) != PX_OK)
        return px__cli_fail("run", &c->err);
    return PX_EXIT_OK;
}

/* Encodes prompt i (BOS first) into *ids (owned: free()).  A byte-level
 * fallback gives at most one token a byte, so the first guess fits all
 * but vocabularies with a dummy prefix; PX_ELIMIT then says how many. */
static px_status encode_prompt(const px_rt_tokenizer *t, const char *text, uint32_t i,
                               int32_t **ids, size_t *n, px_err *err)
{
    size_t len = strlen(text), cap = len + 2;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(*ids);
        if (!(*ids = malloc(cap * sizeof **ids)))
            return px_err_set(err, PX_ENOMEM, "prompt %u: out of memory", i + 1);
        px_status st = px_rt_tokenizer_encode(t, text, len, PX_RT_ENCODE_BOS, *ids, cap, n, err);
        if (st != PX_ELIMIT || *n <= cap)
            return st == PX_OK ? PX_OK : px_err_prefix(err, st, "prompt %u: ", i + 1);
        cap = *n;
    }
    return px_err_set(err, PX_EINTERNAL, "prompt %u: the tokenizer's count changed", i + 1);
}

/* The plan (given, or made for the longest prompt) and its pipeline. */
static int run_prepare_plan(run_ctx *c)
{
    const run_opts *o = &c->o;
    size_t longest = 1;
    for (uint32_t i = 0; i < o->n_prompts; i++) {
        if (encode_prompt(c->tok, o->prompts[i], i, &c->prompt_ids[i], &c->n_prompt_ids[i],
                          &c->err) != PX_OK)
            return px__cli_fail("run", &c->err);
        longest = PX_MAX(longest, c->n_prompt_ids[i]);
    }
    if ((!o->plan || (c->rh.on && c->graph)) &&
        run_request(o, c->graph, c->ir, (uint32_t)PX_MIN(longest, (size_t)1 << 24), &c->rh.req,
                    &c->rh.contract, &c->err) != PX_OK)
        return px__cli_fail("run", &c->err);
    if (o->plan) {
        if (px_json_load_file(o->plan, NULL, &c->plan, &c->err) != PX_OK)
            return px__cli_fail("run", &c->err);
        if (c->rh.on && c->graph)
            request_from_plan(c->plan, &c->rh.req);
    } else if (make_plan(o, &c->rh.req, c->rh.trace, c->rh.inventory_doc, &c->plan, &c->err) !=
               PX_OK) {
        return px__cli_fail("run", &c->err);
    }
    if (px_rt_pipeline_spec_from_plan(c->plan, c->graph, o->plan ? o->plan : "plan", &c->spec,
                                      &c->err) != PX_OK)
        return px__cli_fail("run", &c->err);
    if (c->spec.emulated && o->format == PX_CLI_TEXT)
        fprintf(stderr, "plexus run: the plan uses EMULATED devices: their speed comes from "
                        "emulation profiles on this machine, not from real hardware\n");
    return PX_EXIT_OK;
}

/* The stage workers: an executor, or a supervised run that owns one. */
static int run_start(run_ctx *c)
{
    const run_opts *o = &c->o;
    c->xo = (px_rt_executor_opts){.model_path = o->model,
                                  .transport = o->transport,
                                  .n_threads = o->threads,
                                  .timeout_ms = (int)o->timeout_ms,
                                  .max_seqs = o->n_prompts};
    if (o->stage_host) {
        if (px_rt_local_launcher_new(NULL, o->stage_host, (int)o->timeout_ms, &c->launcher,
                                     &c->err) != PX_OK)
            return px__cli_fail("run", &c->err);
        snprintf(c->ret_addr, sizeof c->ret_addr, "tcp:%s:0", o->stage_host);
        c->xo.launcher = px_rt_local_launcher_iface(c->launcher);
        c->xo.listen = c->ret_addr;
    }
    px_status st = c->rh.on
                       ? start_heal(o, &c->rh, c->graph, c->ir, c->plan, &c->xo, &c->ro, &c->err)
                       : px_rt_executor_new(&c->spec, &c->xo, &c->ex, &c->err);
    return st == PX_OK ? PX_EXIT_OK : px__cli_fail("run", &c->err);
}

/* Generates every prompt's text; on failure, the incidents so far. */
static int run_generate(run_ctx *c)
{
    const run_opts *o = &c->o;
    px_heal_run *run = c->rh.run;
    px_rt_generate_opts go = {
        .prompts = o->prompts,
        .n_prompts = o->n_prompts,
        .prompt_tokens = (const int32_t *const *)c->prompt_ids,
        .n_prompt_tokens = c->n_prompt_ids,
        .max_new_tokens = o->n_new,
        .sampling = {.temperature = (float)o->temp, .top_p = (float)o->top_p, .seed = o->seed},
        .on_token = on_token,
        .ud = &c->ro,
        .supervisor = run ? px_heal_run_supervisor(run) : NULL,
    };
    if (px_rt_executor_generate(run ? px_heal_run_executor(run) : c->ex, c->tok, &go, &c->stats,
                                &c->err) == PX_OK)
        return PX_EXIT_OK;
    if (c->ro.echoed)
        printf("\n");
    fflush(stdout);
    int rc = px__cli_fail("run", &c->err);
    if (run) {
        px_err e2;
        finish_heal(o, &c->rh, &c->ro, false, &e2);
        px_strbuf sb = PX_STRBUF_INIT;
        if (px_heal_run_report(run, &sb) != PX_OK)
            fprintf(stderr, "plexus run: the incident report cannot be written: out of memory\n");
        else if (sb.len)
            fprintf(stderr, "incidents:%s", sb.buf);
        px_strbuf_release(&sb);
    }
    return rc;
}

/* -o json: the pipeline's report, every prompt's text and tokens, and the
 * incidents of a supervised run. */
static int run_print_json(run_ctx *c, const px_rt_executor *last,
                          const px_rt_pipeline_spec *last_spec)
{
    const run_opts *o = &c->o;
    json_t *doc = px_rt_pipeline_report_json(last_spec, last, &c->stats);
    json_t *results = json_array();
    /* A member that cannot be added fails the command: a report missing
     * part of the run must not print as if it were whole. */
    px_status st = doc ? PX_OK : PX_ENOMEM;
    for (uint32_t i = 0; st == PX_OK && i < o->n_prompts; i++)
        st = px_json_push(results,
                          json_pack("{s:o, s:o, s:O}", "prompt",
                                    px_json_text(o->prompts[i], strlen(o->prompts[i])), "text",
                                    px_json_text(c->ro.text[i].buf, c->ro.text[i].len), "tokens",
                                    c->ro.ids[i]));
    if (st == PX_OK)
        st = px_json_set(doc, "schema", json_string("plexus.run/1"));
    if (st == PX_OK)
        st = px_json_set(doc, "model", json_string(o->model));
    if (st == PX_OK)
        st = px_json_set(doc, "results", json_incref(results));
    json_decref(results);
    if (st == PX_OK && c->rh.run) {
        int rc = finish_heal(o, &c->rh, &c->ro, false, &c->err);
        if (rc != PX_EXIT_OK) {
            json_decref(doc);
            return rc;
        }
        st = px_json_set(doc, "incidents", px_heal_run_incidents(c->rh.run));
    }
    if (st != PX_OK) {
        json_decref(doc);
        px_err_set(&c->err, PX_ENOMEM, "the run report (-o json) cannot be written: out of memory");
        return px__cli_fail("run", &c->err);
    }
    int rc = px__cli_print_json(doc);
    json_decref(doc);
    return rc;
}

/* The texts, the pipeline's report, and the incidents. */
static int run_print(run_ctx *c)
{
    const run_opts *o = &c->o;
    const run_out *ro = &c->ro;
    const px_rt_executor *last = c->rh.run ? px_heal_run_executor(c->rh.run) : c->ex;
    const px_rt_pipeline_spec *last_spec = c->rh.run ? px_rt_executor_spec(last) : &c->spec;
    if (o->format == PX_CLI_JSON)
        return run_print_json(c, last, last_spec);
    if (o->n_prompts == 1) {
        if (!ro->echoed)
            printf("%s%s", o->prompts[0],
                   ro->stream ? "" : (ro->text[0].buf ? ro->text[0].buf : ""));
        printf("\n");
    } else {
        for (uint32_t i = 0; i < o->n_prompts; i++)
            printf("--- prompt %u ---\n%s%s\n", i + 1, o->prompts[i],
                   ro->text[i].buf ? ro->text[i].buf : "");
    }
    px_strbuf sb = PX_STRBUF_INIT;
    if (px_rt_pipeline_report(last_spec, last, &c->stats, &sb) != PX_OK) {
        px_strbuf_release(&sb);
        px_err_set(&c->err, PX_ENOMEM, "the run report cannot be written: out of memory");
        return px__cli_fail("run", &c->err);
    }
    printf("\n%s", sb.buf);
    px_strbuf_release(&sb);
    return c->rh.run ? finish_heal(o, &c->rh, &c->ro, true, &c->err) : PX_EXIT_OK;
}

/* Frees what the run holds; a trace that cannot be closed fails it. */
static int run_release(run_ctx *c, int rc)
{
    fflush(stdout);
    px_rt_pipeline_stats_release(&c->stats);
    px_rt_executor_free(c->ex);
    px_heal_run_free(c->rh.run);
    px_rt_local_launcher_free(c->launcher);
    if (c->rh.trace && px_trace_writer_close(c->rh.trace, &c->err) != PX_OK && rc == PX_EXIT_OK)
        rc = px__cli_fail("run", &c->err);
    px_contract_free(c->rh.contract);
    json_decref(c->rh.inventory_doc);
    json_decref(c->plan);
    px_rt_tokenizer_free(c->tok);
    px_arena_free(c->arena);
    px_ir_model_free(c->ir);
    px_hw_graph_free(c->graph);
    for (uint32_t i = 0; i < c->o.n_prompts; i++) {
        px_strbuf_release(&c->ro.text[i]);
        json_decref(c->ro.ids[i]);
        free(c->ro.ends[i]);
        free(c->prompt_ids[i]);
    }
    free(c->o.file_text);
    return rc;
}

int px__cmd_run(int argc, char **argv)
{
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0)
        return PX_EXIT_OK; /* --help */
    if (rc != PX_EXIT_OK) {
        free(o.file_text);
        return rc;
    }
    run_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        free(o.file_text);
        fprintf(stderr, "plexus run: out of memory\n");
        return PX_EXIT_FAIL;
    }
    c->o = o;
    c->ro.o = &c->o;
    c->rh.on = o.n_injects || o.audit_every || o.trace || o.incidents;
    command_line(argc, argv, c->rh.command, sizeof c->rh.command);
    for (uint32_t i = 0; i < o.n_prompts; i++) {
        px_strbuf_init(&c->ro.text[i]);
        c->ro.ids[i] = json_array();
    }
    /* Tokens may be taken back after an audit: print the text at the end. */
    c->ro.stream = o.format == PX_CLI_TEXT && o.n_prompts == 1 && !o.audit_every;
    if ((rc = run_load(c)) == PX_EXIT_OK && (rc = run_prepare_plan(c)) == PX_EXIT_OK &&
        (rc = run_start(c)) == PX_EXIT_OK && (rc = run_generate(c)) == PX_EXIT_OK)
        rc = run_print(c);
    rc = run_release(c, rc);
    free(c);
    return rc;
}
