/* Policy comparison: every policy plans every scenario of a pack once,
 * every plan is simulated under the same load, faults and seeds (common
 * random numbers), and the figures are compared pair by pair. */
#include "base/common.h"

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "sim/compare_impl.h"

/* The default load keeps the slowest policy's plan half busy, so every
 * policy serves it and differences show the plans, not an overload. */
#define LOAD_UTILIZATION 0.5
/* Default duration: long enough for this many arrivals, within bounds. */
#define DURATION_REQUESTS 60.0
#define DURATION_MIN_S    30.0
#define DURATION_MAX_S    600.0

void px_sim_compare_options_default(px_sim_compare_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->seeds = 10;
    opt->metric = PX_SIM_CMP_TPOT_P50;
    opt->metric_by_objective = true;
    opt->random_failures = true;
    opt->exact_max_devices = 6;
}

void px_sim_comparison_release(px_sim_comparison *c)
{
    if (!c)
        return;
    px_arena_free(c->arena);
    memset(c, 0, sizeof *c);
}

static px_status check_options(const px_sim_compare_options *opt, px_err *err)
{
    if (!opt->policies || opt->n_policies == 0 || opt->n_policies > PX_SIM_COMPARE_MAX_POLICIES)
        return px_err_set(err, PX_EINVAL, "compare: give 1 to %d policies",
                          PX_SIM_COMPARE_MAX_POLICIES);
    for (size_t i = 0; i < opt->n_policies; i++) {
        const char *p = opt->policies[i];
        if (!p || !px_plan_policy_exists(p))
            return px_err_set(err, PX_EINVAL,
                              "compare: unknown policy \"%.40s\"; use plexus, llamacpp, exo, "
                              "gpustack or single-type",
                              p ? p : "");
    }
    if (opt->seeds < 1 || opt->seeds > PX_SIM_COMPARE_MAX_SEEDS)
        return px_err_set(err, PX_EINVAL, "compare: %u seeds; use 1 to %d", opt->seeds,
                          PX_SIM_COMPARE_MAX_SEEDS);
    if (!(opt->duration_s >= 0 && opt->duration_s <= 1e7))
        return px_err_set(err, PX_EINVAL, "compare: duration %g s; use 0 (sized) to 1e7 s",
                          opt->duration_s);
    if (opt->exact_max_devices > 8)
        return px_err_set(err, PX_EINVAL,
                          "compare: exact yardstick on %u devices; px_plan_exact stops at 8",
                          opt->exact_max_devices);
    if ((unsigned)opt->metric >= PX_SIM_CMP_COUNT_)
        return px_err_set(err, PX_EINVAL, "compare: unknown metric");
    return PX_OK;
}

/* Everything one scenario holds while it runs; released by scenario_done. */
typedef struct scenario_run {
    px_hw_graph *graph;
    px_ir_model *model;
    px_sim_faults faults;
    bool has_faults;
    px_sim_load load;
    px_plan **plans;        /* n_policies; NULL when infeasible */
    px_sim_plan *sim_plans; /* n_policies */
    px_plan_request req;
} scenario_run;

static void scenario_done(scenario_run *r, size_t n_policies)
{
    for (size_t p = 0; r->plans && p < n_policies; p++) {
        px_plan_free(r->plans[p]);
        px_sim_plan_release(&r->sim_plans[p]);
    }
    free(r->plans);
    free(r->sim_plans);
    px_sim_load_release(&r->load);
    px_sim_faults_release(&r->faults);
    px_ir_model_free(r->model);
    px_hw_graph_free(r->graph);
}

/* The first diagnostic of a refused inventory, as one message. */
static px_status inventory_error(const px_diags *d, const char *path, px_status st, px_err *err)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->items[i].severity == PX_SEV_ERROR)
            return px_err_set(err, st, "inventory %s: %s: %s%s%s", path, d->items[i].pointer,
                              d->items[i].message, d->items[i].fix ? " (fix: " : "",
                              d->items[i].fix ? d->items[i].fix : "");
    return px_err_prefix(err, st, "inventory %s: ", path);
}

static px_status open_inputs(const px_sim_scenario *sc, const px_sim_compare_options *opt,
                             scenario_run *r, px_err *err)
{
    px_diags diags;
    px_diags_init(&diags);
    px_status st = px_hw_graph_load(sc->inventory, NULL, &r->graph, &diags, err);
    if (st != PX_OK)
        st = inventory_error(&diags, sc->inventory, st, err);
    px_diags_release(&diags);
    if (st != PX_OK)
        return st;
    if ((st = px_ir_model_open_any(sc->model, NULL, &r->model, err)) != PX_OK)
        return st;
    const char *faults = opt->faults ? opt->faults : sc->faults;
    if (faults) {
        if ((st = px_sim_faults_load(faults, &r->faults, err)) != PX_OK)
            return st;
        r->has_faults = true;
    }
    px_plan_request_default(&r->req);
    r->req.graph = r->graph;
    r->req.model = r->model;
    r->req.fallbacks = false;
    r->req.workload.context = sc->context;
    r->req.workload.prompt_tokens = sc->prompt_tokens;
    r->req.workload.gen_tokens = sc->gen_tokens;
    r->req.workload.batch = sc->batch;
    if ((st = px_plan_objective_parse(sc->objective, &r->req.objective, err)) != PX_OK ||
        (sc->slo && (st = px_plan_slo_parse(sc->slo, &r->req.slo, err)) != PX_OK))
        return st;
    r->plans = calloc(opt->n_policies, sizeof *r->plans);
    r->sim_plans = calloc(opt->n_policies, sizeof *r->sim_plans);
    if (!r->plans || !r->sim_plans)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    return PX_OK;
}

/* Plans with one policy.  Infeasibility (or any refusal of the planner
 * short of running out of memory) is an outcome, not an error. */
static px_status plan_policy(scenario_run *r, size_t p, const char *policy, px_arena *a,
                             px_sim_policy_outcome *o, px_err *err)
{
    px_plan_request req = r->req;
    req.policy = policy;
    px_err perr;
    px_err_clear(&perr);
    px_status st = px_plan_search(&req, &r->plans[p], &perr);
    if (st == PX_ENOMEM)
        return px_err_set(err, st, "%s", perr.msg);
    if (st != PX_OK) {
        o->feasible = false;
        o->reason = px_arena_strdup(a, perr.msg);
        return o->reason ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px_plan_summary s;
    px_plan_get_summary(r->plans[p], &s);
    o->feasible = true;
    o->plan_id = px_arena_strdup(a, px_plan_id(r->plans[p]));
    o->n_devices = s.n_devices;
    o->n_stages = s.n_stages;
    o->n_replicas = s.n_replicas;
    o->batch = s.batch;
    o->predicted_tpot_p50_s = s.tpot_s.p50;
    o->predicted_tokens_per_s = s.throughput.p50;
    json_t *doc = px_plan_to_json(r->plans[p]);
    if (!doc || !o->plan_id) {
        json_decref(doc);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px_err serr;
    px_err_clear(&serr);
    st = px_sim_plan_from_json(doc, r->graph, &r->sim_plans[p], &serr);
    json_decref(doc);
    if (st == PX_ENOMEM)
        return px_err_set(err, st, "%s", serr.msg);
    if (st != PX_OK) {
        /* A plan the simulator cannot take is reported with the policy,
         * like an infeasible one: the other policies still compare. */
        px_plan_free(r->plans[p]);
        r->plans[p] = NULL;
        o->feasible = false;
        o->reason = px_arena_printf(a, "the simulator refused the plan: %s", serr.msg);
        return o->reason ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    }
    return PX_OK;
}

/* The scenario's load: its own spec, or Poisson at LOAD_UTILIZATION of the
 * slowest feasible plan's predicted throughput, at the planned lengths. */
static px_status choose_load(const px_sim_scenario *sc, const px_sim_scenario_outcome *so,
                             size_t n_policies, px_arena *a, scenario_run *r, const char **spec,
                             px_err *err)
{
    if (sc->load) {
        /* A copy: the outcome outlives the pack. */
        if (!(*spec = px_arena_strdup(a, sc->load)))
            return px_err_set(err, PX_ENOMEM, "out of memory");
    } else {
        double slowest = INFINITY;
        for (size_t p = 0; p < n_policies; p++)
            if (so->policies[p].feasible && so->policies[p].predicted_tokens_per_s > 0)
                slowest = PX_MIN(slowest, so->policies[p].predicted_tokens_per_s);
        if (!isfinite(slowest))
            slowest = sc->gen_tokens; /* nothing runs; any valid rate will do */
        double rate = LOAD_UTILIZATION * slowest / sc->gen_tokens;
        *spec = px_arena_printf(a, "poisson:rate=%.4g,prompt=%u,gen=%u", rate, sc->prompt_tokens,
                                sc->gen_tokens);
        if (!*spec)
            return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    return px_sim_load_parse(*spec, &r->load, err);
}

/* Long enough for the arrivals wanted and, whatever the objective, for
 * requests of the slowest plan to finish many times over (a request takes
 * its prefill plus gen_tokens decode steps): a throughput scenario whose
 * requests never finish measures nothing. */
#define DURATION_REQUEST_TIMES 10.0

static double choose_duration(const px_sim_compare_options *opt, const px_sim_load *load,
                              double slowest_request_s)
{
    if (opt->duration_s > 0)
        return opt->duration_s;
    double d = load->rate > 0 ? DURATION_REQUESTS / load->rate : DURATION_MIN_S;
    if (load->kind == PX_SIM_LOAD_TRACE && load->n_arrivals)
        d = load->arrivals[load->n_arrivals - 1].t + 1;
    double need = isfinite(slowest_request_s) ? DURATION_REQUEST_TIMES * slowest_request_s : 0;
    double cap = PX_MAX(DURATION_MAX_S, need);
    return PX_MIN(PX_MAX(PX_MAX(d, need), DURATION_MIN_S), cap);
}

/* The figure a scenario's objective is judged on. */
static px_sim_cmp_metric objective_metric(const char *objective, px_sim_cmp_metric fallback)
{
    px_plan_objective o;
    if (!objective || px_plan_objective_parse(objective, &o, NULL) != PX_OK)
        return fallback;
    switch (o) {
    case PX_PLAN_OBJ_TTFT:
        return PX_SIM_CMP_TTFT_P99;
    case PX_PLAN_OBJ_THROUGHPUT:
        return PX_SIM_CMP_TOKENS_PER_S;
    case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
        return PX_SIM_CMP_USD_PER_MTOKEN;
    case PX_PLAN_OBJ_JOULES_PER_TOKEN:
        return PX_SIM_CMP_JOULES_PER_TOKEN;
    default:
        return PX_SIM_CMP_TPOT_P50;
    }
}

static px_status simulate_policy(const scenario_run *r, size_t p, const px_sim_compare_options *opt,
                                 double duration_s, px_arena *a, px_sim_policy_outcome *o,
                                 px_err *err)
{
    o->samples = px_arena_calloc(a, (size_t)opt->seeds * PX_SIM_CMP_COUNT_, sizeof(double));
    if (!o->samples)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_sim_options so;
    px_sim_options_default(&so);
    so.duration_s = duration_s;
    so.replications = 1;
    so.random_failures = opt->random_failures;
    for (uint32_t s = 0; s < opt->seeds; s++) {
        /* Seed s+1 for every policy: the same arrivals, lengths, service
         * noise and failure draws, so differences are the plans'. */
        so.seed = (uint64_t)s + 1;
        px_sim_result res;
        px_status st = px_sim_run(&r->sim_plans[p], &r->load, r->has_faults ? &r->faults : NULL,
                                  &so, &res, err);
        if (st != PX_OK)
            return px_err_prefix(err, st, "policy %s: ", o->policy);
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
            o->samples[(size_t)s * PX_SIM_CMP_COUNT_ + (size_t)m] =
                px__sim_cmp_value(&res.runs[0], (px_sim_cmp_metric)m);
        px_sim_result_release(&res);
    }
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
        px__sim_cmp_ci(o->samples + m, opt->seeds, PX_SIM_CMP_COUNT_, &o->stats[m]);
    o->model_error = o->predicted_tpot_p50_s > 0
                         ? o->stats[PX_SIM_CMP_TPOT_P50].mean / o->predicted_tpot_p50_s - 1
                         : NAN;
    return PX_OK;
}

static void progress(const px_sim_compare_options *opt, const char *fmt, ...) PX_PRINTF(2, 3);

/* Tells opt->progress what comes next. */
static void progress(const px_sim_compare_options *opt, const char *fmt, ...)
{
    if (!opt->progress)
        return;
    char step[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(step, sizeof step, fmt, ap);
    va_end(ap);
    opt->progress(opt->progress_ctx, step);
}

/* The exact optimum (latency objective, small fleets) and each plan's
 * predicted gap to it. */
static void exact_yardstick(scenario_run *r, const px_sim_compare_options *opt,
                            px_sim_scenario_outcome *so)
{
    so->exact_tpot_s = NAN;
    for (size_t p = 0; p < opt->n_policies; p++)
        so->policies[p].exact_gap = NAN;
    if (r->req.objective != PX_PLAN_OBJ_LATENCY || opt->exact_max_devices == 0 ||
        so->n_devices > opt->exact_max_devices)
        return;
    double best = 0;
    px_err e;
    if (px_plan_exact(&r->req, (uint32_t)so->n_devices, &best, &e) != PX_OK || !(best > 0))
        return;
    so->exact_tpot_s = best;
    for (size_t p = 0; p < opt->n_policies; p++)
        if (r->plans[p]) {
            px_plan_summary s;
            px_plan_get_summary(r->plans[p], &s);
            so->policies[p].exact_gap = s.tpot_point_s / best - 1;
        }
}

/* Paired differences against the reference (policy 0), the best policy
 * on the metric and each policy's regret. */
static void score_scenario(const px_sim_compare_options *opt, px_sim_scenario_outcome *so)
{
    px_sim_policy_outcome *ref = &so->policies[0];
    size_t n = opt->seeds;
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t p = 0; p < opt->n_policies; p++) {
        px_sim_policy_outcome *o = &so->policies[p];
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++) {
            if (!a || !b || !o->feasible || !ref->feasible) {
                o->diff[m] = (px_sim_paired){NAN, NAN, NAN, 0, false};
                continue;
            }
            for (size_t s = 0; s < n; s++) {
                a[s] = o->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m];
                b[s] = ref->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m];
            }
            px_sim_paired_diff(a, b, n, &o->diff[m]);
        }
    }
    free(a);
    free(b);
    px_sim_cmp_metric metric = so->metric;
    bool higher = px_sim_cmp_metric_higher_is_better(metric);
    double best = NAN;
    for (size_t p = 0; p < opt->n_policies; p++) {
        double v = so->policies[p].stats[metric].mean;
        if (!so->policies[p].feasible || !isfinite(v))
            continue;
        if (!isfinite(best) || (higher ? v > best : v < best)) {
            best = v;
            so->best = so->policies[p].policy;
        }
    }
    for (size_t p = 0; p < opt->n_policies; p++) {
        px_sim_policy_outcome *o = &so->policies[p];
        double v = o->stats[metric].mean;
        if (!o->feasible || !isfinite(v) || !isfinite(best)) {
            o->regret = NAN;
            continue;
        }
        double gap = higher ? best - v : v - best;
        o->regret = best != 0 ? gap / fabs(best) : gap;
    }
}

static px_status run_scenario(const px_sim_scenario *sc, const px_sim_compare_options *opt,
                              px_arena *a, px_sim_scenario_outcome *so, px_err *err)
{
    scenario_run r;
    memset(&r, 0, sizeof r);
    so->name = sc->name;
    so->objective = sc->objective;
    so->metric =
        opt->metric_by_objective ? objective_metric(sc->objective, opt->metric) : opt->metric;
    so->faults = opt->faults ? opt->faults : sc->faults;
    so->policies = px_arena_calloc(a, opt->n_policies, sizeof *so->policies);
    px_status st =
        so->policies ? open_inputs(sc, opt, &r, err) : px_err_set(err, PX_ENOMEM, "out of memory");
    if (st != PX_OK)
        goto done;
    so->n_devices = px_hw_graph_view(r.graph)->n_devices;
    for (size_t p = 0; p < opt->n_policies; p++) {
        so->policies[p].policy = opt->policies[p];
        if ((st = plan_policy(&r, p, opt->policies[p], a, &so->policies[p], err)) != PX_OK)
            goto done;
    }
    if ((st = choose_load(sc, so, opt->n_policies, a, &r, &so->load, err)) != PX_OK)
        goto done;
    double slowest = 0;
    for (size_t p = 0; p < opt->n_policies; p++)
        if (so->policies[p].feasible && r.plans[p]) {
            px_plan_summary s;
            px_plan_get_summary(r.plans[p], &s);
            slowest = PX_MAX(slowest, s.ttft_s.p50 + (double)sc->gen_tokens * s.tpot_s.p50);
        }
    so->duration_s = choose_duration(opt, &r.load, slowest);
    for (size_t p = 0; p < opt->n_policies; p++) {
        progress(opt, "scenario %s: policy %s (%zu of %zu), %u seeds", sc->name, opt->policies[p],
                 p + 1, opt->n_policies, opt->seeds);
        if (so->policies[p].feasible &&
            (st = simulate_policy(&r, p, opt, so->duration_s, a, &so->policies[p], err)) != PX_OK)
            goto done;
    }
    if (opt->exact_max_devices && so->n_devices <= opt->exact_max_devices)
        progress(opt, "scenario %s: the exact optimum on %zu devices", sc->name,
                 (size_t)so->n_devices);
    exact_yardstick(&r, opt, so);
    score_scenario(opt, so);
done:
    scenario_done(&r, opt->n_policies);
    if (st != PX_OK)
        px_err_prefix(err, st, "scenario \"%s\": ", sc->name);
    return st;
}

/* Relative paired differences pooled over every scenario and seed. */
static px_status overall(px_sim_comparison *c, px_err *err)
{
    size_t cap = c->n_scenarios * c->seeds;
    double *rel = malloc(cap * sizeof *rel), *zero = calloc(cap, sizeof *zero);
    if (!rel || !zero) {
        free(rel);
        free(zero);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    for (size_t p = 0; p < c->n_policies; p++) {
        px_sim_policy_overall *ov = &c->overall[p];
        ov->policy = c->policies[p];
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++) {
            size_t k = 0;
            for (size_t i = 0; i < c->n_scenarios; i++) {
                const px_sim_policy_outcome *o = &c->scenarios[i].policies[p];
                const px_sim_policy_outcome *ref = &c->scenarios[i].policies[0];
                if (!o->feasible || !ref->feasible)
                    continue;
                for (size_t s = 0; s < c->seeds; s++) {
                    double x = o->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m];
                    double y = ref->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m];
                    /* A pair whose reference is 0 (no failures) has no
                     * ratio; equal values still count as no difference. */
                    if (isfinite(x) && isfinite(y) && (y != 0 || x == 0))
                        rel[k++] = y != 0 ? x / y - 1 : 0;
                }
            }
            px_sim_paired_diff(rel, zero, k, &ov->rel_diff[m]);
        }
        double sum = 0;
        for (size_t i = 0; i < c->n_scenarios; i++) {
            const px_sim_policy_outcome *o = &c->scenarios[i].policies[p];
            if (!o->feasible)
                continue;
            ov->n_feasible++;
            if (isfinite(o->regret)) {
                sum += o->regret;
                ov->wins += o->regret == 0;
            }
        }
        ov->mean_regret = ov->n_feasible ? sum / ov->n_feasible : NAN;
    }
    free(rel);
    free(zero);
    return PX_OK;
}

px_status px_sim_compare(const px_sim_pack *pack, const px_sim_compare_options *opt,
                         px_sim_comparison *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!pack || !opt || pack->n_scenarios == 0)
        return px_err_set(err, PX_EINVAL, "compare: a pack with at least one scenario is needed");
    px_status st = check_options(opt, err);
    if (st != PX_OK || (st = px_arena_new(0, &out->arena, err)) != PX_OK)
        return st;
    out->n_policies = opt->n_policies;
    out->seeds = opt->seeds;
    out->metric = opt->metric;
    out->policies = px_arena_calloc(out->arena, opt->n_policies, sizeof *out->policies);
    out->overall = px_arena_calloc(out->arena, opt->n_policies, sizeof *out->overall);
    out->scenarios = px_arena_calloc(out->arena, pack->n_scenarios, sizeof *out->scenarios);
    if (!out->policies || !out->overall || !out->scenarios) {
        st = px_err_set(err, PX_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t p = 0; p < opt->n_policies; p++)
        if (!(out->policies[p] = px_arena_strdup(out->arena, opt->policies[p]))) {
            st = px_err_set(err, PX_ENOMEM, "out of memory");
            goto fail;
        }
    /* Outcomes point at the comparison's own copies of the names. */
    px_sim_compare_options own = *opt;
    own.policies = out->policies;
    if (opt->faults && !(own.faults = px_arena_strdup(out->arena, opt->faults))) {
        st = px_err_set(err, PX_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < pack->n_scenarios; i++) {
        px_sim_scenario sc = pack->scenarios[i];
        if (!(sc.name = px_arena_strdup(out->arena, sc.name)) ||
            !(sc.objective = px_arena_strdup(out->arena, sc.objective)) ||
            (sc.faults && !(sc.faults = px_arena_strdup(out->arena, sc.faults)))) {
            st = px_err_set(err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        if ((st = run_scenario(&sc, &own, out->arena, &out->scenarios[i], err)) != PX_OK)
            goto fail;
        out->n_scenarios = i + 1;
    }
    if ((st = overall(out, err)) != PX_OK)
        goto fail;
    return PX_OK;
fail:
    px_sim_comparison_release(out);
    return st;
}
