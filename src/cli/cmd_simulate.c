/* plexus simulate: serves a load on a plan in the discrete-event simulator. */
#include "cli/cli.h"

#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

const char px__cmd_simulate_summary[] =
    "simulate a plan under a load and faults (latency, throughput, energy, failures)";

static void usage(void)
{
    printf("usage: plexus simulate --plan FILE --load SPEC [options]\n"
           "\n"
           "Serves a load on a plan in the discrete-event simulator and reports time to\n"
           "first token and per output token (p50/p95/p99), throughput, utilization,\n"
           "stranded capacity, energy, cost and failed or dropped requests, each with a\n"
           "95%% confidence interval over independent replications (Student t).\n"
           "The same inputs and seed give byte-identical JSON.\n"
           "\n"
           "options:\n"
           "  --plan FILE          plexus.plan/1 JSON (plexus plan --out FILE)\n"
           "  --load SPEC          poisson:rate=5,prompt=128,gen=64\n"
           "                       bursty:rate=5,burst=4,period=10s,prompt=...,gen=...\n"
           "                       trace:FILE (JSON Lines of "
           "{\"t\",\"prompt_tokens\",\"gen_tokens\"})\n"
           "                       lengths: N, uniform:A-B or exp:MEAN (docs/formats/load.md)\n"
           "  --faults FILE        plexus.faults/1 JSON (docs/formats/faults.md)\n"
           "  --inventory FILE     the inventory the plan was made on: power, thermal, MTBF,\n"
           "                       price, failure domains and links (recommended)\n"
           "  --seed S             base seed (default 1)\n"
           "  --replications N     independent replications (default 5)\n"
           "  --duration T         simulated time per replication (default 60s)\n"
           "  --warmup T           leave out requests arriving earlier (default 0s)\n"
           "  --no-random-failures draw no failures from MTBFs (faults file only)\n"
           "  --failure-accel F    multiply every failure rate by F (default 1)\n"
           "  -o text|json         report format (default text)\n"
           "  --trace FILE         record inputs, the decision and outcomes for plexus replay\n"
           "\n"
           "self-healing (needs --inventory):\n"
           "  --heal               detect faults from what an operator could observe (heartbeats,\n"
           "                       step and transfer times, temperatures), plan and validate\n"
           "                       mitigations, switch plans, canary and roll back; prints one\n"
           "                       incident per fault (json: \"incidents\")\n"
           "  --model FILE|PRESET  the model, to plan candidates (default: the plan's preset)\n"
           "  --slo LIMITS         what a candidate must meet, e.g. tpot=50ms,ttft=1s\n"
           "  --no-hysteresis      adapt and revert on one threshold (for comparison)\n"
           "  --reactive-thermal   act on heat only once a device throttles\n");
}

static bool parse_time(const char *opt, const char *arg, double *out)
{
    px_qty q;
    if (px_qty_parse(arg, PX_DIM_TIME, &q, NULL) != PX_OK || !(q.value >= 0)) {
        px__cli_usage_error("simulate", "%s takes a time such as 60s, not \"%s\"", opt, arg);
        return false;
    }
    *out = q.value;
    return true;
}

static bool parse_uint(const char *opt, const char *arg, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v < lo || v > hi) {
        px__cli_usage_error("simulate",
                            "%s takes a whole number from %" PRIu64 " to %" PRIu64 ", not \"%s\"",
                            opt, lo, hi, arg);
        return false;
    }
    *out = v;
    return true;
}

/* Records the inputs and the decision so `plexus replay` can re-derive it. */
static px_status write_trace(const char *path, const json_t *plan_doc, const json_t *inv_doc,
                             const px_sim_load *load, const px_sim_faults *faults,
                             const px_sim_options *opt, const json_t *result, px_err *err)
{
    px_trace_writer *w;
    px_status st = px_trace_writer_open(path, "simulate", &w, err);
    if (st != PX_OK)
        return st;
    json_t *load_doc = px_sim_load_to_json(load);
    json_t *faults_doc = faults ? px_sim_faults_to_json(faults) : json_null();
    json_t *opt_doc = px_sim_options_to_json(opt);
    json_t *inputs = json_pack("{s:s, s:O, s:O, s:O}", "plan",
                               json_string_value(json_object_get(plan_doc, "id"))
                                   ? json_string_value(json_object_get(plan_doc, "id"))
                                   : "",
                               "load", load_doc, "faults", faults_doc, "options", opt_doc);
    if (!load_doc || !faults_doc || !opt_doc || !inputs) {
        st = px_err_set(err, PX_ENOMEM, "trace: out of memory");
        goto done;
    }
    if ((st = px_trace_input(w, "plan", plan_doc, NULL, err)) != PX_OK ||
        (inv_doc && (st = px_trace_input(w, "inventory", inv_doc, NULL, err)) != PX_OK) ||
        (st = px_trace_input(w, "load", load_doc, NULL, err)) != PX_OK ||
        (st = px_trace_input(w, "faults", faults_doc, NULL, err)) != PX_OK ||
        (st = px_trace_input(w, "options", opt_doc, NULL, err)) != PX_OK)
        goto done;
    for (size_t i = 0; faults && i < faults->n; i++) {
        json_t *f = json_array_get(json_object_get(faults_doc, "faults"), i);
        if ((st = px_trace_fault(w, "injected", f, err)) != PX_OK)
            goto done;
    }
    if ((st = px_trace_decision(w, "simulate", inputs, result, NULL, err)) != PX_OK)
        goto done;
    st = px_trace_outcome(w, "simulate", json_object_get(result, "metrics"), err);
done:
    json_decref(inputs);
    json_decref(load_doc);
    json_decref(faults_doc);
    json_decref(opt_doc);
    px_status cst = px_trace_writer_close(w, st == PX_OK ? err : NULL);
    return st != PX_OK ? st : cst;
}

/* The model a plan was made for: "preset:NAME" names a preset. */
static const char *plan_model(const json_t *plan_doc)
{
    const char *id = json_string_value(json_object_get(json_object_get(plan_doc, "model"), "id"));
    return id && !strncmp(id, "preset:", 7) ? id : NULL;
}

/* --heal: the run with the healer, its incidents, and its trace. */
static int run_healed(const char *plan_path, const char *load_spec, const char *faults_path,
                      const char *inv_path, const char *trace_path, const char *model_spec,
                      px_cli_format fmt, const px_sim_options *opt, px_heal_sim_opts *ho)
{
    int rc = PX_EXIT_FAIL;
    px_err err;
    px_err_clear(&err);
    json_t *plan_doc = NULL, *inv_doc = NULL, *doc = NULL;
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_heal_sim *h = NULL;
    px_trace_writer *w = NULL;
    px_sim_load load = {0};
    px_sim_faults faults = {0};
    px_sim_result res = {0};
    px_diags diags;
    px_diags_init(&diags);
    if (px_json_load_file(plan_path, NULL, &plan_doc, &err) != PX_OK ||
        px_json_load_file(inv_path, NULL, &inv_doc, &err) != PX_OK)
        goto fail;
    if (px_hw_graph_from_value(inv_doc, inv_path, NULL, &graph, &diags, &err) != PX_OK) {
        char *text = px_diags_format(&diags, inv_path);
        if (text && text[0])
            fputs(text, stderr);
        free(text);
        goto fail;
    }
    char ref[512];
    const char *from_plan = plan_model(plan_doc);
    if (!model_spec && !from_plan) {
        px_err_set(&err, PX_EINVAL,
                   "%s: the plan's model is not a preset; give it with --model FILE", plan_path);
        goto fail;
    }
    if (model_spec)
        snprintf(ref, sizeof ref, "%s", model_spec);
    else
        snprintf(ref, sizeof ref, "%s", from_plan);
    if (px_ir_model_open_any(!strncmp(ref, "preset:", 7) ? ref + 7 : ref, NULL, &model, &err) !=
        PX_OK)
        goto fail;
    ho->ctx.graph = graph;
    ho->ctx.model = model;
    ho->ctx.request.graph = graph;
    ho->ctx.request.model = model;
    ho->plan = plan_doc;
    ho->model_ref = ref;
    if (trace_path) {
        if (px_trace_writer_open(trace_path, "simulate", &w, &err) != PX_OK)
            goto fail;
        ho->trace = w;
    }
    if (px_sim_load_parse(load_spec, &load, &err) != PX_OK ||
        (faults_path && px_sim_faults_load(faults_path, &faults, &err) != PX_OK) ||
        px_heal_sim_new(ho, &h, &err) != PX_OK)
        goto fail;
    const px_sim_faults *fp = faults_path ? &faults : NULL;
    if ((w && px_heal_sim_trace_begin(h, w, inv_doc, &load, fp, opt, &err) != PX_OK) ||
        px_heal_sim_run(h, &load, fp, opt, &res, &err) != PX_OK ||
        (w && px_heal_sim_trace_end(h, w, &res, &err) != PX_OK))
        goto fail;
    if (w) {
        px_status cst = px_trace_writer_close(w, &err);
        w = NULL;
        if (cst != PX_OK)
            goto fail;
    }
    if (fmt == PX_CLI_JSON) {
        doc = px_sim_result_to_json(&res, px_heal_sim_plan(h));
        if (!doc || px_json_set(doc, "incidents", px_heal_sim_incidents(h)) != PX_OK) {
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        rc = px__cli_print_json(doc);
    } else {
        px_strbuf sb = PX_STRBUF_INIT;
        px_heal_sim_summary sum;
        px_heal_sim_get_summary(h, &sum);
        if (px_sim_result_report(&res, px_heal_sim_plan(h), &sb) != PX_OK ||
            px_strbuf_addf(&sb, "\nincidents: %u (%u mitigated, %u rolled back)\n", sum.incidents,
                           sum.mitigated, sum.rollbacks) != PX_OK ||
            px_heal_sim_report(h, &sb) != PX_OK) {
            px_strbuf_release(&sb);
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        fputs(sb.buf, stdout);
        px_strbuf_release(&sb);
        rc = PX_EXIT_OK;
    }
    goto done;
fail:
    rc = px__cli_fail("simulate", &err);
done:
    if (w && px_trace_writer_close(w, &err) != PX_OK && rc == PX_EXIT_OK)
        rc = px__cli_fail("simulate", &err);
    json_decref(doc);
    px_sim_result_release(&res);
    px_heal_sim_free(h);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    json_decref(inv_doc);
    json_decref(plan_doc);
    px_diags_release(&diags);
    return rc;
}

int px__cmd_simulate(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage();
        return PX_EXIT_OK;
    }
    const char *plan_path = NULL, *load_spec = NULL, *faults_path = NULL, *inv_path = NULL,
               *trace_path = NULL, *model_spec = NULL;
    bool heal = false, hysteresis = true, predictive = true;
    px_plan_slo slo = {0};
    px_cli_format fmt = PX_CLI_TEXT;
    px_sim_options opt;
    px_sim_options_default(&opt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        uint64_t u;
        if (!strcmp(a, "--no-random-failures")) {
            opt.random_failures = false;
            takes = false;
        } else if (!strcmp(a, "--heal")) {
            heal = true;
            takes = false;
        } else if (!strcmp(a, "--no-hysteresis")) {
            hysteresis = false;
            takes = false;
        } else if (!strcmp(a, "--reactive-thermal")) {
            predictive = false;
            takes = false;
        } else if (!v && a[0] == '-') {
            return px__cli_usage_error("simulate", "%s needs a value", a);
        } else if (!strcmp(a, "--plan")) {
            plan_path = v;
        } else if (!strcmp(a, "--load")) {
            load_spec = v;
        } else if (!strcmp(a, "--faults")) {
            faults_path = v;
        } else if (!strcmp(a, "--inventory")) {
            inv_path = v;
        } else if (!strcmp(a, "--trace")) {
            trace_path = v;
        } else if (!strcmp(a, "--model")) {
            model_spec = v;
        } else if (!strcmp(a, "--slo")) {
            px_err e;
            if (px_plan_slo_parse(v, &slo, &e) != PX_OK)
                return px__cli_usage_error("simulate", "--slo: %s", e.msg);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!px__cli_parse_format("simulate", v, &fmt))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_uint(a, v, 0, UINT64_MAX, &u))
                return PX_EXIT_USAGE;
            opt.seed = u;
        } else if (!strcmp(a, "--replications")) {
            if (!parse_uint(a, v, 1, 1000, &u))
                return PX_EXIT_USAGE;
            opt.replications = (uint32_t)u;
        } else if (!strcmp(a, "--duration")) {
            if (!parse_time(a, v, &opt.duration_s))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_time(a, v, &opt.warmup_s))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--failure-accel")) {
            char *end;
            opt.failure_accel = strtod(v, &end);
            if (*end || end == v || !(opt.failure_accel >= 0) || !isfinite(opt.failure_accel))
                return px__cli_usage_error("simulate", "--failure-accel takes a number >= 0");
        } else {
            return px__cli_usage_error("simulate", "unknown argument \"%s\"", a);
        }
        if (takes)
            i++;
    }
    if (!plan_path || !load_spec)
        return px__cli_usage_error("simulate", "--plan FILE and --load SPEC are required");
    if (heal && !inv_path)
        return px__cli_usage_error("simulate",
                                   "--heal needs --inventory FILE: candidates are planned on it");
    if (!heal && (model_spec || !hysteresis || !predictive || slo.tpot_s > 0 || slo.ttft_s > 0))
        return px__cli_usage_error("simulate",
                                   "--model, --slo, --no-hysteresis and --reactive-thermal go "
                                   "with --heal");
    if (heal) {
        px_heal_sim_opts ho;
        px_heal_sim_opts_default(&ho);
        ho.hysteresis = hysteresis;
        ho.thermal_predictive = predictive;
        ho.ctx.slo = slo;
        return run_healed(plan_path, load_spec, faults_path, inv_path, trace_path, model_spec, fmt,
                          &opt, &ho);
    }

    int rc = PX_EXIT_FAIL;
    px_err err;
    px_err_clear(&err);
    json_t *plan_doc = NULL, *inv_doc = NULL, *result = NULL;
    px_hw_graph *graph = NULL;
    px_sim_plan plan = {0};
    px_sim_load load = {0};
    px_sim_faults faults = {0};
    px_sim_result res = {0};
    px_diags diags;
    px_diags_init(&diags);
    if (px_json_load_file(plan_path, NULL, &plan_doc, &err) != PX_OK)
        goto fail;
    if (inv_path) {
        if (px_json_load_file(inv_path, NULL, &inv_doc, &err) != PX_OK)
            goto fail;
        if (px_hw_graph_from_value(inv_doc, inv_path, NULL, &graph, &diags, &err) != PX_OK) {
            char *text = px_diags_format(&diags, inv_path);
            if (text && text[0])
                fputs(text, stderr);
            free(text);
            goto fail;
        }
    }
    if (px_sim_plan_from_json(plan_doc, graph, &plan, &err) != PX_OK) {
        px_err_prefix(&err, err.code, "%s: ", plan_path);
        goto fail;
    }
    if (px_sim_load_parse(load_spec, &load, &err) != PX_OK ||
        (faults_path && px_sim_faults_load(faults_path, &faults, &err) != PX_OK) ||
        px_sim_run(&plan, &load, faults_path ? &faults : NULL, &opt, &res, &err) != PX_OK)
        goto fail;
    result = px_sim_result_to_json(&res, &plan);
    if (!result) {
        px_err_set(&err, PX_ENOMEM, "out of memory");
        goto fail;
    }
    if (trace_path && write_trace(trace_path, plan_doc, inv_doc, &load,
                                  faults_path ? &faults : NULL, &opt, result, &err) != PX_OK)
        goto fail;
    if (fmt == PX_CLI_JSON) {
        rc = px__cli_print_json(result);
    } else {
        px_strbuf sb = PX_STRBUF_INIT;
        if (px_sim_result_report(&res, &plan, &sb) != PX_OK) {
            px_strbuf_release(&sb);
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        fputs(sb.buf, stdout);
        px_strbuf_release(&sb);
        rc = PX_EXIT_OK;
    }
    goto done;
fail:
    rc = px__cli_fail("simulate", &err);
done:
    json_decref(result);
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    px_sim_plan_release(&plan);
    px_hw_graph_free(graph);
    json_decref(inv_doc);
    json_decref(plan_doc);
    px_diags_release(&diags);
    return rc;
}
