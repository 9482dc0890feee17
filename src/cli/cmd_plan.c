/* plexus plan: places a model on an inventory and prints the plan. */
#include "cli/cli.h"

#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/trace.h"

const char px__cmd_plan_summary[] =
    "plan a model onto an inventory (stages, precision, predictions)";

/* The command line, read by the table below. */
typedef struct plan_args {
    const char *model_spec, *inv_path, *contract_spec, *out_path, *svg_path, *trace_path, *mode,
        *calib_path, *policy;
    bool compare_baselines, no_fallbacks;
    px_cli_format fmt;
    px_plan_request req;
    px_ir_open_opts open;
} plan_args;

static plan_args A;

static px_status parse_objective(const char *v, void *dest, px_err *err)
{
    return px_plan_objective_parse(v, dest, err);
}

static px_status parse_slo(const char *v, void *dest, px_err *err)
{
    return px_plan_slo_parse(v, dest, err);
}

static px_status parse_budget(const char *v, void *dest, px_err *err)
{
    return px_plan_budget_parse(v, dest, err);
}

static const px_cli_opt opts[] = {
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &A.model_spec, "FILE|PRESET",
               "GGUF or llama2.c file, or a preset name (llama-3-8b, ...)",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("inventory", 'i', PX_CLI_STR, &A.inv_path, "FILE",
               "plexus.inventory/1 JSON (data/scenarios/*.json)", .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("contract", 0, PX_CLI_STR, &A.contract_spec, "FILE|NAME",
               "numerical contract: a file or strict, deterministic,\n"
               "relaxed (default: stored precision, deterministic)"),
    PX_CLI_OPT("objective", 0, PX_CLI_CALL, &A.req.objective, "NAME",
               "latency (default), ttft, throughput, tokens_per_dollar,\njoules_per_token",
               .parse = parse_objective),
    PX_CLI_OPT("slo", 0, PX_CLI_CALL, &A.req.slo, "LIMITS", "e.g. tpot=50ms,ttft=500ms",
               .parse = parse_slo),
    PX_CLI_OPT("budget", 0, PX_CLI_CALL, &A.req.slo.budget_usd_h, "RATE", "e.g. 10$/h",
               .parse = parse_budget),
    PX_CLI_OPT("policy", 0, PX_CLI_CHOICE, &A.policy, "NAME",
               "plexus (default), llamacpp, exo, gpustack, single-type",
               .choices = "plexus|llamacpp|exo|gpustack|single-type"),
    PX_CLI_OPT("context", 0, PX_CLI_U32, &A.req.workload.context, "T",
               "context length planned for (default: the model's, at most\n4096)", .lo = 1,
               .hi = 1u << 24),
    PX_CLI_OPT("batch", 0, PX_CLI_U32, &A.req.workload.batch, "B",
               "sequences per replica (default: chosen by the objective)", .lo = 1, .hi = 65536),
    PX_CLI_OPT("prompt-tokens", 0, PX_CLI_U32, &A.req.workload.prompt_tokens, "P",
               "prompt length (default 512, at most half the context)", .lo = 1, .hi = 1u << 24),
    PX_CLI_OPT("gen-tokens", 0, PX_CLI_U32, &A.req.workload.gen_tokens, "N",
               "tokens generated per request (default 256, at most what\nthe context leaves)",
               .lo = 1, .hi = 1u << 24),
    PX_CLI_OPT("max-tp", 0, PX_CLI_U32, &A.req.max_tp, "N",
               "the largest tensor-parallel degree of a stage (default:\n"
               "any); 1 for a plan to run or serve (their stage workers\n"
               "run one device per stage)",
               .lo = 1, .hi = 65536),
    PX_CLI_OPT("kv-dtype", 0, PX_CLI_CALL, &A.open, "DTYPE",
               "cost the KV cache in another dtype (default: f32 for\n"
               "files, the weights' 16-bit dtype for presets)",
               .parse = px__cli_parse_kv_dtype),
    PX_CLI_OPT("compare-baselines", 0, PX_CLI_FLAG, &A.compare_baselines, NULL,
               "cost every baseline policy on the same inputs"),
    PX_CLI_OPT("no-fallbacks", 0, PX_CLI_FLAG, &A.no_fallbacks, NULL,
               "skip the fallback plans for device loss and link degradation"),
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &A.fmt, "FORMAT",
               "report format on stdout: text (default) or json"),
    PX_CLI_OPT("out", 0, PX_CLI_STR, &A.out_path, "FILE", "write the plan JSON to FILE"),
    PX_CLI_OPT("svg", 0, PX_CLI_STR, &A.svg_path, "FILE",
               "draw the stages on the devices and links"),
    PX_CLI_OPT("trace", 0, PX_CLI_STR, &A.trace_path, "FILE",
               "record the inputs and the plan for plexus replay"),
    PX_CLI_OPT("mode", 0, PX_CLI_CHOICE, &A.mode, "MODE",
               "sourced (default: datasheet, discovered and assumed\n"
               "figures) or calibrated (plus --calibration)",
               .choices = "sourced|calibrated"),
    PX_CLI_OPT("calibration", 0, PX_CLI_STR, &A.calib_path, "FILE",
               "plexus.calibration/1 overlay (plexus calibrate); the\n"
               "plan lists each correction, applied or refused"),
    {0},
};

static const px_cli_spec spec = {
    .name = "plan",
    .synopsis = "--model FILE|PRESET --inventory FILE [options]",
    .about = "Cuts the model into stages, places them on the inventory's devices and prints\n"
             "the plan: stages, predicted latency, throughput, memory, energy and cost with\n"
             "their uncertainty, the lower bound, what binds, the rejected alternatives and\n"
             "the fallbacks for the loss of each device.",
    .opts = opts,
    .examples =
        "plexus plan --model llama-3-8b --inventory data/scenarios/hetero-pair-h100-l4.json\n"
        "plexus plan -m llama-3-8b -i data/scenarios/faulted-cluster.json --out plan.json \\\n"
        "    --svg plan.svg                      # the plan as a file and a picture\n"
        "plexus plan -m model.gguf -i inv.json --objective throughput --context=2048 -o json\n"
        "plexus plan -m llama-3-8b -i inv.json --compare-baselines   # llama.cpp, exo, ...\n",
};
const px_cli_spec *const px__cmd_plan_specs[] = {&spec, NULL};

static int print_diags(px_diags *d, const char *name, const px_err *err)
{
    char *text = px_diags_format(d, name);
    if (text && text[0])
        fputs(text, stderr);
    else
        fprintf(stderr, "plexus plan: %s\n", err->msg);
    free(text);
    return PX_EXIT_FAIL;
}

/* Records what the run read and decided, for `plexus replay`.  The
 * inventory and a contract file are re-read as documents: the trace holds
 * them as they were, not the path. */
static px_status write_trace(const char *path, const px_plan_request *req, const char *inv_path,
                             const char *model_spec, const char *contract_spec, const px_plan *plan,
                             px_err *err)
{
    json_t *inv_doc = NULL, *contract_doc = NULL;
    px_trace_writer *w = NULL;
    px_status st = px_json_load_file(inv_path, NULL, &inv_doc, err);
    if (st != PX_OK)
        goto done;
    FILE *f = contract_spec ? fopen(contract_spec, "rb") : NULL;
    if (f) {
        fclose(f);
        if ((st = px_json_load_file(contract_spec, NULL, &contract_doc, err)) != PX_OK)
            goto done;
    }
    px_plan_trace_inputs in = {
        .inventory = inv_doc,
        .model_spec = model_spec,
        .contract_doc = contract_doc,
        .contract_name = contract_doc ? NULL : contract_spec,
    };
    if ((st = px_trace_writer_open(path, "plan", &w, err)) != PX_OK)
        goto done;
    st = px_plan_trace_record(w, req, &in, plan, err);
    px_status cst = px_trace_writer_close(w, st == PX_OK ? err : NULL);
    if (st == PX_OK)
        st = cst;
done:
    json_decref(contract_doc);
    json_decref(inv_doc);
    return st;
}

/* The context, prompt and generation the plan is for, checked against the
 * model: a context beyond what the model was trained for, or a prompt and
 * generation that do not fit the context, are refused.  Lengths left
 * unset follow the model: the context at most 4096, a prompt of at most
 * half of it, and a generation of at most 256 that fits what is left. */
static px_status check_workload(const char *model_spec, const px_ir_model *model,
                                px_cost_workload *w, px_err *err)
{
    const px_ir_hparams *hp = px_ir_model_hparams(model);
    uint32_t trained = hp && hp->context_length ? hp->context_length : 0;
    if (w->context && trained && w->context > trained)
        return px_err_set(err, PX_EINVAL,
                          "--context %u exceeds %s's context of %u tokens: give --context %u "
                          "or less",
                          w->context, model_spec, trained, trained);
    uint32_t context = w->context ? w->context : PX_MIN(4096u, trained ? trained : 4096u);
    uint32_t prompt = w->prompt_tokens ? w->prompt_tokens : PX_MIN(512u, PX_MAX(context / 2, 1u));
    if (!w->gen_tokens) {
        if (prompt >= context)
            return px_err_set(err, PX_EINVAL,
                              "--prompt-tokens %u leaves no room to generate in a context of %u: "
                              "give a shorter prompt or a longer --context",
                              prompt, context);
        w->gen_tokens = PX_MIN(256u, context - prompt);
    }
    if ((uint64_t)prompt + w->gen_tokens > context)
        return px_err_set(err, PX_EINVAL,
                          "a prompt of %u tokens and %u generated make %u, longer than the "
                          "context of %u: shorten --prompt-tokens or --gen-tokens, or give a "
                          "longer --context (at most %u for this model)",
                          prompt, w->gen_tokens, prompt + w->gen_tokens, context,
                          trained ? trained : context);
    return PX_OK;
}

/* What a plan run holds; released by plan_release. */
typedef struct plan_run {
    px_hw_graph *graph;
    px_ir_model *model;
    px_contract *contract;
    px_cost_calibration *calibration;
    px_plan *plan;
    px_diags diags;
} plan_run;

static void plan_release(plan_run *r)
{
    px_plan_free(r->plan);
    px_cost_calibration_free(r->calibration);
    px_contract_free(r->contract);
    px_ir_model_free(r->model);
    px_hw_graph_free(r->graph);
    px_diags_release(&r->diags);
}

/* Reads and checks the inputs: the inventory, the model, the lengths, the
 * contract and the calibration overlay.  Returns PX_EXIT_OK or the exit
 * status after printing why. */
static int plan_prepare(plan_args *a, plan_run *r)
{
    px_err err;
    px_err_clear(&err);
    bool calibrated = a->mode && !strcmp(a->mode, "calibrated");
    if (calibrated != (a->calib_path != NULL))
        return px__cli_usage_error("plan", "%s",
                                   calibrated ? "--mode calibrated needs --calibration FILE"
                                              : "--calibration goes with --mode calibrated");
    if (calibrated && a->trace_path)
        return px__cli_usage_error("plan", "--trace records sourced plans only; drop --trace or "
                                           "plan in the sourced mode");
    if (a->open.kv_dtype_given && a->trace_path)
        return px__cli_usage_error("plan", "--trace records plans of the model's own KV-cache "
                                           "dtype, which replay re-opens; drop --kv-dtype or "
                                           "--trace");
    px_cost_workload *w = &a->req.workload;
    if (w->context && w->prompt_tokens > w->context)
        return px__cli_usage_error("plan", "--prompt-tokens (%u) exceeds --context (%u)",
                                   w->prompt_tokens, w->context);
    if (a->policy)
        a->req.policy = a->policy;
    a->req.compare_baselines = a->compare_baselines;
    a->req.fallbacks = !a->no_fallbacks;
    if (px__cli_load_inventory("plan", a->inv_path, NULL, &r->graph, &r->diags, &err) != PX_OK)
        return PX_EXIT_FAIL;
    if (px__cli_open_model("plan", a->model_spec, &a->open, &r->model, &err) != PX_OK)
        return PX_EXIT_FAIL;
    if (check_workload(a->model_spec, r->model, w, &err) != PX_OK)
        return px__cli_usage_error("plan", "%s", err.msg);
    if (a->contract_spec) {
        px_diags_release(&r->diags);
        px_diags_init(&r->diags);
        if (px_contract_load(a->contract_spec, &r->diags, &r->contract, &err) != PX_OK) {
            fprintf(stderr, "plexus plan: refusing the contract %s:\n", a->contract_spec);
            return print_diags(&r->diags, a->contract_spec, &err);
        }
    }
    if (a->calib_path) {
        if (px_cost_calibration_load(a->calib_path, &r->calibration, &err) != PX_OK) {
            fprintf(stderr, "plexus plan: refusing the calibration overlay: %s\n", err.msg);
            return PX_EXIT_FAIL;
        }
        a->req.cost.mode = PX_COST_CALIBRATED;
        a->req.cost.calibration = r->calibration;
    }
    a->req.graph = r->graph;
    a->req.model = r->model;
    a->req.contract = r->contract;
    return PX_EXIT_OK;
}

/* Searches for the plan. */
static int plan_start(plan_args *a, plan_run *r)
{
    px_err err;
    px_err_clear(&err);
    if (px_plan_search(&a->req, &r->plan, &err) != PX_OK)
        return px__cli_fail("plan", &err);
    return PX_EXIT_OK;
}

/* Writes the files asked for (each announced on stderr) and prints the
 * report. */
static int plan_print(plan_args *a, plan_run *r)
{
    px_err err;
    px_err_clear(&err);
    char *json = px_plan_dump(r->plan);
    if (!json) {
        fprintf(stderr, "plexus plan: out of memory\n");
        return PX_EXIT_FAIL;
    }
    int rc = PX_EXIT_FAIL;
    if (a->out_path) {
        if (px_write_file(a->out_path, json, strlen(json), &err) != PX_OK)
            goto fail;
        px__cli_wrote("plan", a->out_path, "the plan");
    }
    if (a->trace_path) {
        if (write_trace(a->trace_path, &a->req, a->inv_path, a->model_spec, a->contract_spec,
                        r->plan, &err) != PX_OK)
            goto fail;
        px__cli_wrote("plan", a->trace_path, "the trace");
    }
    if (a->svg_path) {
        px_strbuf svg = PX_STRBUF_INIT;
        px_status st = px_plan_svg(r->plan, &svg);
        if (st != PX_OK)
            px_err_set(&err, st, "%s: cannot draw the plan", a->svg_path);
        else
            st = px_write_file(a->svg_path, svg.buf, svg.len, &err);
        px_strbuf_release(&svg);
        if (st != PX_OK)
            goto fail;
        px__cli_wrote("plan", a->svg_path, "the picture");
    }
    if (a->fmt == PX_CLI_JSON) {
        fputs(json, stdout);
    } else {
        px_strbuf sb = PX_STRBUF_INIT;
        if (px_plan_report(r->plan, &sb) != PX_OK) {
            px_strbuf_release(&sb);
            px_err_set(&err, PX_ENOMEM, "the report cannot be written: out of memory");
            goto fail;
        }
        fputs(sb.buf, stdout);
        px_strbuf_release(&sb);
    }
    free(json);
    return PX_EXIT_OK;
fail:
    free(json);
    rc = px__cli_fail("plan", &err);
    return rc;
}

int px__cmd_plan(int argc, char **argv)
{
    memset(&A, 0, sizeof A);
    px_plan_request_default(&A.req);
    A.req.workload.gen_tokens = 0; /* unset: follows the model (check_workload) */
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc;
    plan_run r = {0};
    px_diags_init(&r.diags);
    if ((rc = plan_prepare(&A, &r)) == PX_EXIT_OK && (rc = plan_start(&A, &r)) == PX_EXIT_OK)
        rc = plan_print(&A, &r);
    plan_release(&r);
    return rc;
}
