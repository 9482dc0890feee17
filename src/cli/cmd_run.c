/* plexus run: a model through a plan, one worker process per stage. */
#include "cli/cli.h"

#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/rt.h"

const char px__cmd_run_summary[] = "run a model through a plan: one worker process per stage";

static const char usage_text[] =
    "usage: plexus run --model FILE (--plan FILE | --inventory FILE [--objective NAME]\n"
    "                  [--contract FILE|NAME]) [--inventory FILE]\n"
    "                  (--prompt TEXT ... | --prompts FILE) [-n N] [--temp T] [--top-p P]\n"
    "                  [--seed S] [--threads N] [--transport unix|tcp] [--timeout-ms T]\n"
    "                  [--tokenizer FILE] [-o text|json]\n"
    "\n"
    "Starts one `plexus worker` process per stage of the plan, each holding its layers,\n"
    "its KV cache and its backend (cpu, or emu for an emulated device), joined by framed\n"
    "connections; streams the tokens as they are produced, then prints, per stage, the\n"
    "observed decode time per token and prefill time against the plan's predicted\n"
    "intervals, end to end, and tokens/s.  Without --plan the planner chooses one for\n"
    "the inventory.  Emulated devices are marked as such on every line.\n"
    "\n"
    "options:\n"
    "  --plan FILE        a plexus.plan/1 document (from `plexus plan -o json`)\n"
    "  --inventory FILE   the inventory: devices' backends and emulation profiles; with\n"
    "                     no --plan, what the planner places the model on\n"
    "  --objective NAME   planner objective (default latency)\n"
    "  --contract SPEC    numerical contract for the planner\n"
    "  --prompt TEXT      text to continue (repeat: the prompts decode together)\n"
    "  --prompts FILE     one prompt per line\n"
    "  -n N               new tokens per prompt (default 64)\n"
    "  --temp T           temperature, 0 for greedy (default 0)\n"
    "  --top-p P          nucleus threshold (default 0.9)\n"
    "  --seed S           random seed; prompt i uses S + i (default 42)\n"
    "  --threads N        threads per worker (default 1)\n"
    "  --transport KIND   unix sockets (default) or tcp on 127.0.0.1\n"
    "  --timeout-ms T     limit of every wait on a worker (default 10000)\n"
    "  -o text|json       text streams tokens; json prints one document at the end\n";

#define MAX_PROMPTS 64

typedef struct run_opts {
    const char *model, *plan, *inventory, *objective, *contract, *tokenizer, *prompts_file;
    const char *prompts[MAX_PROMPTS];
    uint32_t n_prompts, n_new, threads, timeout_ms;
    double temp, top_p;
    uint64_t seed;
    px_rt_transport transport;
    px_cli_format format;
    char *file_text; /* --prompts contents; prompts point into it */
} run_opts;

static bool num_u32(const char *v, const char *opt, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x > max) {
        px__cli_usage_error("run", "%s takes a whole number from 0 to %u, not \"%s\"", opt, max, v);
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

static bool num_real(const char *v, const char *opt, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        px__cli_usage_error("run", "%s takes a number from %g to %g, not \"%s\"", opt, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

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

static int parse_args(int argc, char **argv, run_opts *o)
{
    *o = (run_opts){.n_new = 64, .top_p = 0.9, .seed = 42, .threads = 1, .timeout_ms = 10000};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            return px__cli_usage_error("run", "%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--plan")) {
            o->plan = v;
        } else if (!strcmp(a, "--inventory")) {
            o->inventory = v;
        } else if (!strcmp(a, "--objective")) {
            o->objective = v;
        } else if (!strcmp(a, "--contract")) {
            o->contract = v;
        } else if (!strcmp(a, "--tokenizer")) {
            o->tokenizer = v;
        } else if (!strcmp(a, "--prompt")) {
            if (o->n_prompts == MAX_PROMPTS)
                return px__cli_usage_error("run", "at most %d prompts", MAX_PROMPTS);
            o->prompts[o->n_prompts++] = v;
        } else if (!strcmp(a, "--prompts")) {
            o->prompts_file = v;
        } else if (!strcmp(a, "-n")) {
            if (!num_u32(v, a, 1u << 24, &o->n_new))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--temp")) {
            if (!num_real(v, a, 0, 100, &o->temp))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--top-p")) {
            if (!num_real(v, a, 0, 1, &o->top_p))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-')
                return px__cli_usage_error("run", "--seed takes a whole number, not \"%s\"", v);
        } else if (!strcmp(a, "--threads")) {
            if (!num_u32(v, a, 1024, &o->threads))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--timeout-ms")) {
            if (!num_u32(v, a, 86400000, &o->timeout_ms))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--transport")) {
            if (!strcmp(v, "unix"))
                o->transport = PX_RT_TRANSPORT_UNIX;
            else if (!strcmp(v, "tcp"))
                o->transport = PX_RT_TRANSPORT_TCP;
            else
                return px__cli_usage_error("run", "--transport takes unix or tcp, not \"%s\"", v);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!px__cli_parse_format("run", v, &o->format))
                return PX_EXIT_USAGE;
        } else {
            return px__cli_usage_error("run", "unexpected argument \"%s\"", a);
        }
    }
    if (!o->model)
        return px__cli_usage_error("run", "--model FILE is required");
    if (!o->plan && !o->inventory)
        return px__cli_usage_error("run", "give --plan FILE, or --inventory FILE for the planner "
                                          "to make one");
    if (o->prompts_file) {
        int rc = read_prompts(o);
        if (rc)
            return rc;
    }
    if (o->n_prompts == 0)
        return px__cli_usage_error("run", "--prompt TEXT or --prompts FILE is required");
    return PX_EXIT_OK;
}

/* The vocabulary: --tokenizer, the model's, or tok512.bin beside it. */
static px_status find_vocab(const run_opts *o, const px_ir_model *ir, px_arena *arena,
                            px_ir_vocab *file_vocab, const px_ir_vocab **vocab, px_err *err)
{
    uint32_t n = px_ir_model_hparams(ir)->vocab_size;
    if (o->tokenizer) {
        *vocab = file_vocab;
        return px_ir_vocab_read_llama2c(o->tokenizer, n, arena, file_vocab, err);
    }
    if ((*vocab = px_ir_model_vocab(ir)) != NULL)
        return PX_OK;
    const char *slash = strrchr(o->model, '/');
    char *path = slash ? px_asprintf("%.*s/tok512.bin", (int)(slash - o->model), o->model)
                       : px_strdup("tok512.bin");
    if (!path)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    *vocab = file_vocab;
    px_status st = px_ir_vocab_read_llama2c(path, n, arena, file_vocab, err);
    if (st)
        px_err_prefix(err, st, "%s carries no vocabulary; pass --tokenizer FILE: ", o->model);
    free(path);
    return st;
}

/* Asks the planner, for this run's workload. */
static px_status make_plan(const run_opts *o, const px_hw_graph *g, const px_ir_model *ir,
                           uint32_t prompt_tokens, json_t **out, px_err *err)
{
    px_plan_request req;
    px_plan_request_default(&req);
    px_contract *contract = NULL;
    px_status st = PX_OK;
    if (o->objective && (st = px_plan_objective_parse(o->objective, &req.objective, err)))
        return st;
    if (o->contract && (st = px_contract_load(o->contract, NULL, &contract, err)))
        return px_err_prefix(err, st, "contract %s: ", o->contract);
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    req.graph = g;
    req.model = ir;
    req.contract = contract;
    req.workload.batch = o->n_prompts;
    req.workload.context = hp->context_length ? hp->context_length : 2048;
    req.workload.prompt_tokens = PX_MAX(prompt_tokens, 1u);
    req.workload.gen_tokens = PX_MAX(o->n_new, 1u);
    px_plan *plan = NULL;
    st = px_plan_search(&req, &plan, err);
    if (st == PX_OK) {
        *out = px_plan_to_json(plan);
        if (!*out)
            st = px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px_plan_free(plan);
    px_contract_free(contract);
    return st;
}

typedef struct run_out {
    const run_opts *o;
    px_strbuf text[MAX_PROMPTS];
    json_t *ids[MAX_PROMPTS];
    bool echoed;
} run_out;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    run_out *r = ud;
    if (len == 1 && (unsigned char)piece[0] < 0x20 && piece[0] != '\n' && piece[0] != '\t')
        len = 0;
    px_strbuf_add(&r->text[prompt], piece, len);
    json_array_append_new(r->ids[prompt], json_integer(token));
    if (r->o->format == PX_CLI_TEXT && r->o->n_prompts == 1) {
        if (!r->echoed) {
            fputs(r->o->prompts[0], stdout);
            r->echoed = true;
        }
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
    }
}

int px__cmd_run(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return PX_EXIT_OK;
    }
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != PX_EXIT_OK) {
        free(o.file_text);
        return rc;
    }
    px_err err;
    px_err_clear(&err);
    px_hw_graph *graph = NULL;
    px_ir_model *ir = NULL;
    px_arena *arena = NULL;
    px_rt_tokenizer *tok = NULL;
    json_t *plan = NULL;
    px_rt_executor *ex = NULL;
    px_rt_pipeline_spec spec;
    px_rt_pipeline_stats stats;
    memset(&stats, 0, sizeof stats);
    run_out ro = {.o = &o};
    for (uint32_t i = 0; i < o.n_prompts; i++) {
        px_strbuf_init(&ro.text[i]);
        ro.ids[i] = json_array();
    }
    px_ir_vocab file_vocab;
    const px_ir_vocab *vocab = NULL;
    rc = PX_EXIT_FAIL;
    if (o.inventory) {
        px_diags diags;
        px_diags_init(&diags);
        if (px_hw_graph_load(o.inventory, NULL, &graph, &diags, &err) != PX_OK) {
            char *report = px_diags_format(&diags, o.inventory);
            fprintf(stderr, "plexus run: refusing the inventory %s:\n%s", o.inventory,
                    report ? report : err.msg);
            free(report);
            px_diags_release(&diags);
            goto done;
        }
        px_diags_release(&diags);
    }
    if (px_ir_model_open_any(o.model, NULL, &ir, &err) != PX_OK ||
        px_arena_new(0, &arena, &err) != PX_OK ||
        find_vocab(&o, ir, arena, &file_vocab, &vocab, &err) != PX_OK ||
        px_rt_tokenizer_new(vocab, &tok, &err) != PX_OK) {
        px__cli_fail("run", &err);
        goto done;
    }
    if (o.plan) {
        if (px_json_load_file(o.plan, NULL, &plan, &err) != PX_OK) {
            px__cli_fail("run", &err);
            goto done;
        }
    } else {
        /* Plan for the longest prompt of this run. */
        size_t longest = 1;
        for (uint32_t i = 0; i < o.n_prompts; i++) {
            size_t n = 0;
            int32_t ids[1];
            (void)px_rt_tokenizer_encode(tok, o.prompts[i], strlen(o.prompts[i]), PX_RT_ENCODE_BOS,
                                         ids, 1, &n, NULL);
            longest = PX_MAX(longest, n);
        }
        if (make_plan(&o, graph, ir, (uint32_t)PX_MIN(longest, (size_t)1 << 24), &plan, &err) !=
            PX_OK) {
            px__cli_fail("run", &err);
            goto done;
        }
    }
    if (px_rt_pipeline_spec_from_plan(plan, graph, o.plan ? o.plan : "plan", &spec, &err) !=
        PX_OK) {
        px__cli_fail("run", &err);
        goto done;
    }
    if (spec.emulated && o.format == PX_CLI_TEXT)
        fprintf(stderr, "plexus run: the plan uses EMULATED devices: their speed comes from "
                        "emulation profiles on this machine, not from real hardware\n");
    px_rt_executor_opts xo = {.model_path = o.model,
                              .transport = o.transport,
                              .n_threads = o.threads,
                              .timeout_ms = (int)o.timeout_ms,
                              .max_seqs = o.n_prompts};
    if (px_rt_executor_new(&spec, &xo, &ex, &err) != PX_OK) {
        px__cli_fail("run", &err);
        goto done;
    }
    px_rt_generate_opts go = {
        .prompts = o.prompts,
        .n_prompts = o.n_prompts,
        .max_new_tokens = o.n_new,
        .sampling = {.temperature = (float)o.temp, .top_p = (float)o.top_p, .seed = o.seed},
        .on_token = on_token,
        .ud = &ro,
    };
    if (px_rt_executor_generate(ex, tok, &go, &stats, &err) != PX_OK) {
        if (ro.echoed)
            printf("\n");
        fflush(stdout);
        px__cli_fail("run", &err);
        goto done;
    }
    if (o.format == PX_CLI_JSON) {
        json_t *doc = px_rt_pipeline_report_json(&spec, ex, &stats);
        json_t *results = json_array();
        for (uint32_t i = 0; i < o.n_prompts; i++)
            px_json_push(results, json_pack("{s:s, s:s%, s:O}", "prompt", o.prompts[i], "text",
                                            ro.text[i].buf ? ro.text[i].buf : "", ro.text[i].len,
                                            "tokens", ro.ids[i]));
        px_json_set(doc, "schema", json_string("plexus.run/1"));
        px_json_set(doc, "model", json_string(o.model));
        px_json_set(doc, "results", results);
        rc = px__cli_print_json(doc);
        json_decref(doc);
        goto done;
    }
    if (o.n_prompts == 1) {
        if (!ro.echoed)
            fputs(o.prompts[0], stdout);
        printf("\n");
    } else {
        for (uint32_t i = 0; i < o.n_prompts; i++)
            printf("--- prompt %u ---\n%s%s\n", i + 1, o.prompts[i],
                   ro.text[i].buf ? ro.text[i].buf : "");
    }
    px_strbuf sb = PX_STRBUF_INIT;
    px_rt_pipeline_report(&spec, ex, &stats, &sb);
    printf("\n%s", sb.buf ? sb.buf : "");
    px_strbuf_release(&sb);
    rc = PX_EXIT_OK;
done:
    fflush(stdout);
    px_rt_pipeline_stats_release(&stats);
    px_rt_executor_free(ex);
    json_decref(plan);
    px_rt_tokenizer_free(tok);
    px_arena_free(arena);
    px_ir_model_free(ir);
    px_hw_graph_free(graph);
    for (uint32_t i = 0; i < o.n_prompts; i++) {
        px_strbuf_release(&ro.text[i]);
        json_decref(ro.ids[i]);
    }
    free(o.file_text);
    return rc;
}
