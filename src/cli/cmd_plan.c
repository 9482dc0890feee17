/* plexus plan: places a model on an inventory and prints the plan. */
#include "cli/cli.h"

#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/trace.h"

const char px__cmd_plan_summary[] =
    "plan a model onto an inventory (stages, precision, predictions)";

static void usage(void)
{
    printf("usage: plexus plan --model FILE|PRESET --inventory FILE [options]\n"
           "\n"
           "Cuts the model into stages, places them on the inventory's devices and prints\n"
           "the plan: stages, predicted latency, throughput, memory, energy and cost with\n"
           "their uncertainty, the lower bound, what binds, the rejected alternatives and\n"
           "the fallbacks for the loss of each device.\n"
           "\n"
           "options:\n"
           "  --model FILE|PRESET    GGUF or llama2.c file, or a preset name (llama-3-8b, ...)\n"
           "  --inventory FILE       plexus.inventory/1 JSON (data/scenarios/*.json)\n"
           "  --contract FILE|NAME   numerical contract: a file or strict, deterministic,\n"
           "                         relaxed (default: stored precision, deterministic)\n"
           "  --objective NAME       latency (default), ttft, throughput, tokens_per_dollar,\n"
           "                         joules_per_token\n"
           "  --slo LIMITS           e.g. tpot=50ms,ttft=500ms\n"
           "  --budget RATE          e.g. 10$/h\n"
           "  --policy NAME          plexus (default), llamacpp, exo, gpustack, single-type\n"
           "  --context T            context length planned for (default 4096)\n"
           "  --batch B              sequences per replica (default: chosen by the objective)\n"
           "  --prompt-tokens P      prompt length (default 512)\n"
           "  --gen-tokens N         tokens generated per request (default 256)\n"
           "  --compare-baselines    cost every baseline policy on the same inputs\n"
           "  --no-fallbacks         skip the fallback plans for device loss and link degradation\n"
           "  -o text|json           report format on stdout (default text)\n"
           "  --out FILE             write the plan JSON to FILE\n"
           "  --svg FILE             draw the stages on the devices and links\n"
           "  --trace FILE           record the inputs and the plan for plexus replay\n"
           "  --mode MODE            sourced (default: datasheet, discovered and assumed\n"
           "                         figures) or calibrated (plus --calibration)\n"
           "  --calibration FILE     plexus.calibration/1 overlay (plexus calibrate); the\n"
           "                         plan lists each correction, applied or refused\n");
}

static bool parse_u32(const char *opt, const char *arg, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v < lo || v > hi) {
        px__cli_usage_error("plan", "%s takes a whole number from %u to %u, not \"%s\"", opt, lo,
                            hi, arg);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

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

int px__cmd_plan(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage();
        return PX_EXIT_OK;
    }
    const char *model_spec = NULL, *inv_path = NULL, *contract_spec = NULL, *out_path = NULL,
               *svg_path = NULL, *trace_path = NULL, *mode = NULL, *calib_path = NULL;
    px_cli_format fmt = PX_CLI_TEXT;
    px_plan_request req;
    px_plan_request_default(&req);
    px_err err;
    px_err_clear(&err);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_arg = i + 1 < argc;
        const char *v = has_arg ? argv[i + 1] : NULL;
#define NEED_ARG()                                                     \
    do {                                                               \
        if (!has_arg)                                                  \
            return px__cli_usage_error("plan", "%s needs a value", a); \
        i++;                                                           \
    } while (0)
        if (!strcmp(a, "--model")) {
            NEED_ARG();
            model_spec = v;
        } else if (!strcmp(a, "--inventory")) {
            NEED_ARG();
            inv_path = v;
        } else if (!strcmp(a, "--contract")) {
            NEED_ARG();
            contract_spec = v;
        } else if (!strcmp(a, "--objective")) {
            NEED_ARG();
            if (px_plan_objective_parse(v, &req.objective, &err) != PX_OK)
                return px__cli_usage_error("plan", "%s", err.msg);
        } else if (!strcmp(a, "--slo")) {
            NEED_ARG();
            if (px_plan_slo_parse(v, &req.slo, &err) != PX_OK)
                return px__cli_usage_error("plan", "%s", err.msg);
        } else if (!strcmp(a, "--budget")) {
            NEED_ARG();
            if (px_plan_budget_parse(v, &req.slo.budget_usd_h, &err) != PX_OK)
                return px__cli_usage_error("plan", "%s", err.msg);
        } else if (!strcmp(a, "--policy")) {
            NEED_ARG();
            if (!px_plan_policy_exists(v))
                return px__cli_usage_error("plan",
                                           "unknown policy \"%s\"; use plexus, llamacpp, exo, "
                                           "gpustack or single-type",
                                           v);
            req.policy = v;
        } else if (!strcmp(a, "--context")) {
            NEED_ARG();
            if (!parse_u32(a, v, 1, 1u << 24, &req.workload.context))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--batch")) {
            NEED_ARG();
            if (!parse_u32(a, v, 1, 65536, &req.workload.batch))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--prompt-tokens")) {
            NEED_ARG();
            if (!parse_u32(a, v, 1, 1u << 24, &req.workload.prompt_tokens))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--gen-tokens")) {
            NEED_ARG();
            if (!parse_u32(a, v, 1, 1u << 24, &req.workload.gen_tokens))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--compare-baselines")) {
            req.compare_baselines = true;
        } else if (!strcmp(a, "--no-fallbacks")) {
            req.fallbacks = false;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            NEED_ARG();
            if (!px__cli_parse_format("plan", v, &fmt))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--out")) {
            NEED_ARG();
            out_path = v;
        } else if (!strcmp(a, "--svg")) {
            NEED_ARG();
            svg_path = v;
        } else if (!strcmp(a, "--trace")) {
            NEED_ARG();
            trace_path = v;
        } else if (!strcmp(a, "--mode")) {
            NEED_ARG();
            if (strcmp(v, "sourced") && strcmp(v, "calibrated"))
                return px__cli_usage_error("plan", "--mode takes sourced or calibrated, not \"%s\"",
                                           v);
            mode = v;
        } else if (!strcmp(a, "--calibration")) {
            NEED_ARG();
            calib_path = v;
        } else {
            return px__cli_usage_error("plan", "unexpected argument \"%s\"", a);
        }
#undef NEED_ARG
    }
    if (!model_spec || !inv_path)
        return px__cli_usage_error("plan", "--model and --inventory are required");
    bool calibrated = mode && !strcmp(mode, "calibrated");
    if (calibrated != (calib_path != NULL))
        return px__cli_usage_error("plan", "%s",
                                   calibrated ? "--mode calibrated needs --calibration FILE"
                                              : "--calibration goes with --mode calibrated");
    if (calibrated && trace_path)
        return px__cli_usage_error("plan", "--trace records sourced plans only; drop --trace or "
                                           "plan in the sourced mode");
    if (req.workload.prompt_tokens > req.workload.context)
        return px__cli_usage_error("plan", "--prompt-tokens (%u) exceeds --context (%u)",
                                   req.workload.prompt_tokens, req.workload.context);

    int rc = PX_EXIT_FAIL;
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_contract *contract = NULL;
    px_cost_calibration *calibration = NULL;
    px_plan *plan = NULL;
    px_diags diags;
    px_diags_init(&diags);
    if (px_hw_graph_load(inv_path, NULL, &graph, &diags, &err) != PX_OK) {
        fprintf(stderr, "plexus plan: refusing the inventory %s:\n", inv_path);
        rc = print_diags(&diags, inv_path, &err);
        goto done;
    }
    if (px_ir_model_open_any(model_spec, NULL, &model, &err) != PX_OK) {
        rc = px__cli_fail("plan", &err);
        goto done;
    }
    if (contract_spec) {
        px_diags_release(&diags);
        px_diags_init(&diags);
        if (px_contract_load(contract_spec, &diags, &contract, &err) != PX_OK) {
            fprintf(stderr, "plexus plan: refusing the contract %s:\n", contract_spec);
            rc = print_diags(&diags, contract_spec, &err);
            goto done;
        }
    }
    if (calib_path) {
        if (px_cost_calibration_load(calib_path, &calibration, &err) != PX_OK) {
            fprintf(stderr, "plexus plan: refusing the calibration overlay: %s\n", err.msg);
            goto done;
        }
        req.cost.mode = PX_COST_CALIBRATED;
        req.cost.calibration = calibration;
    }
    req.graph = graph;
    req.model = model;
    req.contract = contract;
    if (px_plan_search(&req, &plan, &err) != PX_OK) {
        rc = px__cli_fail("plan", &err);
        goto done;
    }
    char *json = px_plan_dump(plan);
    if (!json) {
        fprintf(stderr, "plexus plan: out of memory\n");
        goto done;
    }
    if (out_path && px_write_file(out_path, json, strlen(json), &err) != PX_OK) {
        free(json);
        rc = px__cli_fail("plan", &err);
        goto done;
    }
    if (trace_path &&
        write_trace(trace_path, &req, inv_path, model_spec, contract_spec, plan, &err) != PX_OK) {
        free(json);
        rc = px__cli_fail("plan", &err);
        goto done;
    }
    if (svg_path) {
        px_strbuf svg = PX_STRBUF_INIT;
        if (px_plan_svg(plan, &svg) != PX_OK ||
            px_write_file(svg_path, svg.buf, svg.len, &err) != PX_OK) {
            px_strbuf_release(&svg);
            free(json);
            rc = px__cli_fail("plan", &err);
            goto done;
        }
        px_strbuf_release(&svg);
    }
    if (fmt == PX_CLI_JSON) {
        fputs(json, stdout);
    } else {
        px_strbuf sb = PX_STRBUF_INIT;
        if (px_plan_report(plan, &sb) != PX_OK) {
            px_strbuf_release(&sb);
            free(json);
            px_err_set(&err, PX_ENOMEM, "the report cannot be written: out of memory");
            rc = px__cli_fail("plan", &err);
            goto done;
        }
        fputs(sb.buf, stdout);
        px_strbuf_release(&sb);
    }
    free(json);
    rc = PX_EXIT_OK;
done:
    px_plan_free(plan);
    px_cost_calibration_free(calibration);
    px_contract_free(contract);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    px_diags_release(&diags);
    return rc;
}
