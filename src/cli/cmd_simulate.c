/* plexus simulate: serves a load on a plan in the discrete-event simulator. */
#include "cli/cli.h"

#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

const char px__cmd_simulate_summary[] =
    "simulate a plan under a load and faults (latency, throughput, energy, failures)";

/* The command line, read by the table below. */
typedef struct sim_args {
    const char *plan_path, *load_spec, *faults_path, *inv_path, *trace_path, *model_spec;
    bool heal, no_hysteresis, reactive_thermal, no_random_failures;
    px_plan_slo slo;
    px_cli_format fmt;
    px_sim_options opt;
} sim_args;

static sim_args A;

static px_status parse_slo(const char *v, void *dest, px_err *err)
{
    return px_plan_slo_parse(v, dest, err);
}

static const px_cli_opt opts[] = {
    PX_CLI_OPT("plan", 'p', PX_CLI_STR, &A.plan_path, "FILE",
               "plexus.plan/1 JSON (plexus plan --out FILE)", .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("load", 'l', PX_CLI_STR, &A.load_spec, "SPEC",
               "poisson:rate=5,prompt=128,gen=64\n"
               "bursty:rate=5,burst=4,period=10s,prompt=...,gen=...\n"
               "trace:FILE (JSON Lines of {\"t\",\"prompt_tokens\",\"gen_tokens\"})\n"
               "lengths: N, uniform:A-B or exp:MEAN (docs/formats/load.md)",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("faults", 'f', PX_CLI_STR, &A.faults_path, "FILE",
               "plexus.faults/1 JSON (docs/formats/faults.md; data/faults/)"),
    PX_CLI_OPT("inventory", 'i', PX_CLI_STR, &A.inv_path, "FILE",
               "the inventory the plan was made on: power, thermal, MTBF,\n"
               "price, failure domains and links (recommended; another\n"
               "inventory is refused)"),
    PX_CLI_OPT("seed", 0, PX_CLI_U64, &A.opt.seed, "S", "base seed (default 1)"),
    PX_CLI_OPT("replications", 'n', PX_CLI_U32, &A.opt.replications, "N",
               "independent replications (default 5)", .lo = 1, .hi = 1000),
    PX_CLI_OPT("duration", 0, PX_CLI_TIME, &A.opt.duration_s, "T",
               "simulated time per replication (default 60s)"),
    PX_CLI_OPT("warmup", 0, PX_CLI_TIME, &A.opt.warmup_s, "T",
               "leave out requests arriving earlier (default 0s)"),
    PX_CLI_OPT("no-random-failures", 0, PX_CLI_FLAG, &A.no_random_failures, NULL,
               "draw no failures from MTBFs (faults file only)"),
    PX_CLI_OPT("failure-accel", 0, PX_CLI_NUM, &A.opt.failure_accel, "F",
               "multiply every failure rate by F (default 1)", .lo = 0, .hi = 1e12),
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &A.fmt, "FORMAT",
               "report format: text (default) or json"),
    PX_CLI_OPT("trace", 0, PX_CLI_STR, &A.trace_path, "FILE",
               "record inputs, the decision and outcomes for plexus replay"),
    PX_CLI_OPT("heal", 0, PX_CLI_FLAG, &A.heal, NULL,
               "(needs --inventory) detect faults from what an operator\n"
               "could observe (heartbeats, step and transfer times,\n"
               "temperatures), plan and validate mitigations, switch\n"
               "plans, canary and roll back; prints one incident per\n"
               "fault (json: \"incidents\")"),
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &A.model_spec, "FILE|PRESET",
               "with --heal: the model, to plan candidates (default: the\nplan's preset)"),
    PX_CLI_OPT("slo", 0, PX_CLI_CALL, &A.slo, "LIMITS",
               "with --heal: what a candidate must meet, e.g.\ntpot=50ms,ttft=1s",
               .parse = parse_slo),
    PX_CLI_OPT("no-hysteresis", 0, PX_CLI_FLAG, &A.no_hysteresis, NULL,
               "with --heal: adapt and revert on one threshold"),
    PX_CLI_OPT("reactive-thermal", 0, PX_CLI_FLAG, &A.reactive_thermal, NULL,
               "with --heal: act on heat only once a device throttles"),
    {0},
};

static const px_cli_spec spec = {
    .name = "simulate",
    .synopsis = "--plan FILE --load SPEC [options]",
    .about = "Serves a load on a plan in the discrete-event simulator and reports time to\n"
             "first token and per output token (p50/p95/p99), throughput, utilization,\n"
             "stranded capacity, energy, cost and failed or dropped requests, each with a\n"
             "95% confidence interval over independent replications (Student t).\n"
             "The same inputs and seed give byte-identical JSON.  A load that offers more\n"
             "tokens per second than the plan serves is called an overload in the report.",
    .opts = opts,
    .examples = "plexus plan -m llama-3-8b -i data/scenarios/faulted-cluster.json --out plan.json\n"
                "plexus simulate --plan plan.json -i data/scenarios/faulted-cluster.json \\\n"
                "    --load poisson:rate=4,prompt=128,gen=64 -n 20\n"
                "plexus simulate -p plan.json -i data/scenarios/faulted-cluster.json \\\n"
                "    --load=poisson:rate=4,prompt=128,gen=64 \\\n"
                "    --faults data/faults/rack-b-power.json --heal    # incidents, healed\n",
};
const px_cli_spec *const px__cmd_simulate_specs[] = {&spec, NULL};

/* Replications done, on a terminal. */
static void show_progress(void *ctx, uint32_t done, uint32_t total)
{
    (void)ctx;
    if (done < total)
        px__cli_progress("simulate", "replication %u of %u", done + 1, total);
    else
        px__cli_progress_done();
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

/* A warning when the load offers more output tokens per second than the
 * plan serves at full batch: queues then grow for the whole run and time
 * to first token measures the queue.  Returns false when none is due. */
static bool overload_warning(const px_sim_load *load, const json_t *plan_doc, char *buf, size_t n)
{
    double offered = px_sim_load_offered_tokens(load);
    const json_t *tp =
        json_object_get(json_object_get(plan_doc, "predictions"), "throughput_tokens_per_s");
    double served = json_number_value(json_object_get(tp, "p50"));
    if (!(offered > 0) || !(served > 0) || offered <= served)
        return false;
    snprintf(buf, n,
             "warning: overload: the load offers %.4g tokens/s but the plan serves about %.4g "
             "tokens/s at full batch; queues grow for the whole run and time to first token "
             "measures the queue (lower the rate, or plan for throughput or more replicas)",
             offered, served);
    return true;
}

/* Adds the warning, if any, to a JSON report and says it on stderr. */
static px_status add_warning(json_t *doc, const char *warning)
{
    if (!warning)
        return PX_OK;
    fprintf(stderr, "plexus simulate: %s\n", warning);
    json_t *arr = json_pack("[s]", warning);
    return arr ? px_json_set(doc, "warnings", arr) : PX_ENOMEM;
}

/* Everything one simulation holds; sim_release frees it. */
typedef struct sim_run {
    const sim_args *a;
    px_sim_options opt;
    px_err err;
    json_t *plan_doc, *inv_doc, *doc;
    px_hw_graph *graph;
    px_sim_load load;
    px_sim_faults faults;
    const px_sim_faults *fp; /* &faults when --faults was given */
    px_sim_result res;
    char warning[400];
    const char *warn; /* the overload warning, or NULL */
    px_sim_plan plan; /* without --heal */
    /* With --heal: */
    px_ir_model *model;
    char ref[512];
    px_heal_sim_opts ho;
    px_heal_sim *h;
    px_trace_writer *w;
} sim_run;

/* The plan and, when given, the inventory, checked against each other;
 * false (with r->err set or the diagnostics printed) when one is refused. */
static bool load_plan(sim_run *r)
{
    const sim_args *a = r->a;
    if (px_json_load_file(a->plan_path, NULL, &r->plan_doc, &r->err) != PX_OK)
        return false;
    if (a->inv_path) {
        px_diags diags;
        px_diags_init(&diags);
        if (px_json_load_file(a->inv_path, NULL, &r->inv_doc, &r->err) != PX_OK ||
            px_hw_graph_from_value(r->inv_doc, a->inv_path, NULL, &r->graph, &diags, &r->err) !=
                PX_OK) {
            char *text = px_diags_format(&diags, a->inv_path);
            if (text && text[0])
                fputs(text, stderr);
            free(text);
            px_diags_release(&diags);
            return false;
        }
        px_diags_release(&diags);
    }
    if (px_sim_plan_check_inventory(r->plan_doc, r->graph, a->inv_path, &r->err) != PX_OK) {
        px_err_prefix(&r->err, r->err.code, "%s: ", a->plan_path);
        return false;
    }
    return true;
}

/* The load, the faults and the overload warning. */
static bool load_load(sim_run *r)
{
    const sim_args *a = r->a;
    if (px_sim_load_parse(a->load_spec, &r->load, &r->err) != PX_OK ||
        (a->faults_path && px_sim_faults_load(a->faults_path, &r->faults, &r->err) != PX_OK))
        return false;
    r->fp = a->faults_path ? &r->faults : NULL;
    r->warn =
        overload_warning(&r->load, r->plan_doc, r->warning, sizeof r->warning) ? r->warning : NULL;
    return true;
}

/* Prints a text report built by `build`, with the warning first. */
static bool print_text(sim_run *r, bool (*build)(sim_run *, px_strbuf *))
{
    px_strbuf sb = PX_STRBUF_INIT;
    if ((r->warn && px_strbuf_addf(&sb, "%s\n", r->warn) != PX_OK) || !build(r, &sb)) {
        px_strbuf_release(&sb);
        px_err_set(&r->err, PX_ENOMEM, "out of memory");
        return false;
    }
    fputs(sb.buf, stdout);
    px_strbuf_release(&sb);
    return true;
}

/* Prints r->doc with the warning; false when out of memory. */
static bool print_json(sim_run *r, int *rc)
{
    if (add_warning(r->doc, r->warn) != PX_OK) {
        px_err_set(&r->err, PX_ENOMEM, "out of memory");
        return false;
    }
    *rc = px__cli_print_json(r->doc);
    return true;
}

/* --heal: the model the plan was made for, the trace and the healer. */
static bool heal_prepare(sim_run *r)
{
    const sim_args *a = r->a;
    const char *from_plan = plan_model(r->plan_doc);
    if (!a->model_spec && !from_plan) {
        px_err_set(&r->err, PX_EINVAL,
                   "%s: the plan's model is not a preset; give it with --model FILE", a->plan_path);
        return false;
    }
    snprintf(r->ref, sizeof r->ref, "%s", a->model_spec ? a->model_spec : from_plan);
    const char *ref = r->ref;
    if (px_ir_model_open_any(!strncmp(ref, "preset:", 7) ? ref + 7 : ref, NULL, &r->model,
                             &r->err) != PX_OK)
        return false;
    px_heal_sim_opts *ho = &r->ho;
    ho->ctx.graph = r->graph;
    ho->ctx.model = r->model;
    ho->ctx.request.graph = r->graph;
    ho->ctx.request.model = r->model;
    ho->plan = r->plan_doc;
    ho->model_ref = r->ref;
    if (a->trace_path) {
        if (px_trace_writer_open(a->trace_path, "simulate", &r->w, &r->err) != PX_OK)
            return false;
        ho->trace = r->w;
    }
    return load_load(r) && px_heal_sim_new(ho, &r->h, &r->err) == PX_OK;
}

/* --heal: the run, recorded in the trace. */
static bool heal_start(sim_run *r)
{
    if ((r->w && px_heal_sim_trace_begin(r->h, r->w, r->inv_doc, &r->load, r->fp, &r->opt,
                                         &r->err) != PX_OK) ||
        px_heal_sim_run(r->h, &r->load, r->fp, &r->opt, &r->res, &r->err) != PX_OK ||
        (r->w && px_heal_sim_trace_end(r->h, r->w, &r->res, &r->err) != PX_OK))
        return false;
    if (r->w) {
        px_status cst = px_trace_writer_close(r->w, &r->err);
        r->w = NULL;
        if (cst != PX_OK)
            return false;
    }
    return true;
}

static bool heal_report(sim_run *r, px_strbuf *sb)
{
    px_heal_sim_summary sum;
    px_heal_sim_get_summary(r->h, &sum);
    return px_sim_result_report(&r->res, px_heal_sim_plan(r->h), sb) == PX_OK &&
           px_strbuf_addf(sb, "\nincidents: %u (%u mitigated, %u rolled back)\n", sum.incidents,
                          sum.mitigated, sum.rollbacks) == PX_OK &&
           px_heal_sim_report(r->h, sb) == PX_OK;
}

/* --heal: the result, the incidents and the healer's report. */
static bool heal_print(sim_run *r, int *rc)
{
    if (r->a->fmt != PX_CLI_JSON) {
        *rc = PX_EXIT_OK;
        return print_text(r, heal_report);
    }
    r->doc = px_sim_result_to_json(&r->res, px_heal_sim_plan(r->h));
    if (!r->doc || px_json_set(r->doc, "incidents", px_heal_sim_incidents(r->h)) != PX_OK) {
        px_err_set(&r->err, PX_ENOMEM, "out of memory");
        return false;
    }
    return print_json(r, rc);
}

/* Without --heal: the simulator's plan, the run and its result. */
static bool sim_start(sim_run *r)
{
    if (px_sim_plan_from_json(r->plan_doc, r->graph, &r->plan, &r->err) != PX_OK) {
        px_err_prefix(&r->err, r->err.code, "%s: ", r->a->plan_path);
        return false;
    }
    if (!load_load(r) || px_sim_run(&r->plan, &r->load, r->fp, &r->opt, &r->res, &r->err) != PX_OK)
        return false;
    r->doc = px_sim_result_to_json(&r->res, &r->plan);
    if (!r->doc) {
        px_err_set(&r->err, PX_ENOMEM, "out of memory");
        return false;
    }
    const char *trace = r->a->trace_path;
    if (trace && write_trace(trace, r->plan_doc, r->inv_doc, &r->load, r->fp, &r->opt, r->doc,
                             &r->err) != PX_OK)
        return false;
    if (trace)
        px__cli_wrote("simulate", trace, "the trace");
    return true;
}

static bool sim_report(sim_run *r, px_strbuf *sb)
{
    return px_sim_result_report(&r->res, &r->plan, sb) == PX_OK;
}

static bool sim_print(sim_run *r, int *rc)
{
    if (r->a->fmt == PX_CLI_JSON)
        return print_json(r, rc);
    *rc = PX_EXIT_OK;
    return print_text(r, sim_report);
}

/* Frees what the simulation holds; a trace that cannot be closed fails it. */
static int sim_release(sim_run *r, int rc)
{
    if (r->w && px_trace_writer_close(r->w, &r->err) != PX_OK && rc == PX_EXIT_OK)
        rc = px__cli_fail("simulate", &r->err);
    json_decref(r->doc);
    px_sim_result_release(&r->res);
    px_heal_sim_free(r->h);
    px_sim_faults_release(&r->faults);
    px_sim_load_release(&r->load);
    px_sim_plan_release(&r->plan);
    px_ir_model_free(r->model);
    px_hw_graph_free(r->graph);
    json_decref(r->inv_doc);
    json_decref(r->plan_doc);
    return rc;
}

int px__cmd_simulate(int argc, char **argv)
{
    memset(&A, 0, sizeof A);
    px_sim_options_default(&A.opt);
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc;
    if (!A.plan_path || !A.load_spec)
        return px__cli_usage_error("simulate", "--plan FILE and --load SPEC are required");
    if (A.heal && !A.inv_path)
        return px__cli_usage_error("simulate",
                                   "--heal needs --inventory FILE: candidates are planned on it");
    if (!A.heal && (A.model_spec || A.no_hysteresis || A.reactive_thermal || A.slo.tpot_s > 0 ||
                    A.slo.ttft_s > 0))
        return px__cli_usage_error("simulate",
                                   "--model, --slo, --no-hysteresis and --reactive-thermal go "
                                   "with --heal");
    sim_run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "plexus simulate: out of memory\n");
        return PX_EXIT_FAIL;
    }
    r->a = &A;
    r->opt = A.opt;
    r->opt.random_failures = !A.no_random_failures;
    r->opt.progress = show_progress;
    px_err_clear(&r->err);
    px_heal_sim_opts_default(&r->ho);
    r->ho.hysteresis = !A.no_hysteresis;
    r->ho.thermal_predictive = !A.reactive_thermal;
    r->ho.ctx.slo = A.slo;
    rc = PX_EXIT_FAIL;
    bool ok = load_plan(r) && (A.heal ? heal_prepare(r) && heal_start(r) && heal_print(r, &rc)
                                      : sim_start(r) && sim_print(r, &rc));
    if (!ok)
        rc = px__cli_fail("simulate", &r->err);
    rc = sim_release(r, rc);
    free(r);
    return rc;
}
