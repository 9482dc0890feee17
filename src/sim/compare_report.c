/* The comparison as a document (`plexus.compare/1`) and as readable
 * tables. */
#include "base/common.h"

#include "sim/compare_impl.h"

/* Numbers rounded to 10 significant digits so the text is stable across
 * compilers' last-bit differences; NaN and infinities become null. */
static json_t *num(double v)
{
    if (!isfinite(v))
        return json_null();
    char text[32];
    snprintf(text, sizeof text, "%.10g", v);
    return json_real(strtod(text, NULL));
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *paired_json(const px_sim_paired *d)
{
    return json_pack("{s:o, s:o, s:o, s:I, s:b}", "mean", num(d->mean), "lo", num(d->lo), "hi",
                     num(d->hi), "n", (json_int_t)d->n, "significant", d->significant);
}

static json_t *policy_json(const px_sim_comparison *c, const px_sim_policy_outcome *o)
{
    if (!o->feasible)
        return json_pack("{s:s, s:b, s:o}", "policy", o->policy, "feasible", 0, "reason",
                         str_or_null(o->reason));
    json_t *metrics = json_object();
    for (int m = 0; metrics && m < PX_SIM_CMP_COUNT_; m++) {
        json_t *samples = json_array();
        for (size_t s = 0; samples && s < c->seeds; s++)
            if (px_json_push(samples, num(o->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m])) !=
                PX_OK) {
                json_decref(samples);
                samples = NULL;
            }
        json_t *entry = samples
                            ? json_pack("{s:o, s:o, s:o, s:o, s:o}", "mean", num(o->stats[m].mean),
                                        "lo", num(o->stats[m].lo), "hi", num(o->stats[m].hi),
                                        "samples", samples, "diff", paired_json(&o->diff[m]))
                            : NULL;
        if (px_json_set(metrics, px_sim_cmp_metric_name((px_sim_cmp_metric)m), entry) != PX_OK) {
            json_decref(metrics);
            metrics = NULL;
        }
    }
    if (!metrics)
        return NULL;
    return json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:{s:o, s:o}, s:o, s:{s:o}, s:{s:o, "
                     "s:o}}",
                     "policy", o->policy, "feasible", 1, "plan_id", o->plan_id, "devices",
                     (json_int_t)o->n_devices, "stages", (json_int_t)o->n_stages, "replicas",
                     (json_int_t)o->n_replicas, "batch", (json_int_t)o->batch, "predicted",
                     "tpot_p50_s", num(o->predicted_tpot_p50_s), "tokens_per_s",
                     num(o->predicted_tokens_per_s), "metrics", metrics, "model_error",
                     "tpot_p50_relative", num(o->model_error), "policy_error", "regret",
                     num(o->regret), "exact_gap", num(o->exact_gap));
}

static json_t *scenario_json(const px_sim_comparison *c, const px_sim_scenario_outcome *so)
{
    json_t *list = json_array();
    for (size_t p = 0; list && p < c->n_policies; p++)
        if (px_json_push(list, policy_json(c, &so->policies[p])) != PX_OK) {
            json_decref(list);
            list = NULL;
        }
    if (!list)
        return NULL;
    return json_pack("{s:s, s:s, s:o, s:s, s:I, s:o, s:o, s:s, s:o, s:o}", "name", so->name, "load",
                     so->load ? so->load : "", "faults", str_or_null(so->faults), "objective",
                     so->objective, "devices", (json_int_t)so->n_devices, "duration_s",
                     num(so->duration_s), "exact_tpot_s", num(so->exact_tpot_s), "metric",
                     px_sim_cmp_metric_name(so->metric), "best", str_or_null(so->best), "policies",
                     list);
}

static json_t *overall_json(const px_sim_policy_overall *ov)
{
    json_t *rel = json_object();
    for (int m = 0; rel && m < PX_SIM_CMP_COUNT_; m++)
        if (px_json_set(rel, px_sim_cmp_metric_name((px_sim_cmp_metric)m),
                        paired_json(&ov->rel_diff[m])) != PX_OK) {
            json_decref(rel);
            rel = NULL;
        }
    if (!rel)
        return NULL;
    return json_pack("{s:s, s:I, s:I, s:o, s:o}", "policy", ov->policy, "feasible_scenarios",
                     (json_int_t)ov->n_feasible, "wins", (json_int_t)ov->wins, "mean_regret",
                     num(ov->mean_regret), "relative_diff", rel);
}

json_t *px_sim_comparison_to_json(const px_sim_comparison *c)
{
    json_t *policies = json_array(), *scenarios = json_array(), *ov = json_array();
    bool ok = policies && scenarios && ov;
    for (size_t p = 0; ok && p < c->n_policies; p++)
        ok = px_json_push(policies, json_string(c->policies[p])) == PX_OK &&
             px_json_push(ov, overall_json(&c->overall[p])) == PX_OK;
    for (size_t i = 0; ok && i < c->n_scenarios; i++)
        ok = px_json_push(scenarios, scenario_json(c, &c->scenarios[i])) == PX_OK;
    if (!ok || c->n_policies == 0) {
        json_decref(policies);
        json_decref(scenarios);
        json_decref(ov);
        return NULL;
    }
    return json_pack("{s:s, s:o, s:s, s:I, s:s, s:o, s:o}", "schema", PX_SIM_COMPARE_SCHEMA,
                     "policies", policies, "reference", c->policies[0], "seeds",
                     (json_int_t)c->seeds, "metric", px_sim_cmp_metric_name(c->metric), "scenarios",
                     scenarios, "overall", ov);
}

/* ---- text ---- */

/* Times print in milliseconds; the rest in their own units. */
static double shown(px_sim_cmp_metric m, double v)
{
    return !strcmp(px__sim_cmp_metric_unit(m), "s") ? v * 1e3 : v;
}

static const char *const short_names[PX_SIM_CMP_COUNT_] = {
    "tpot p50 ms", "tpot p99 ms", "ttft p99 ms", "tok/s", "J/token", "$/Mtoken", "failed",
};

static void add_value(px_strbuf *sb, double v, int width)
{
    if (isfinite(v))
        px_strbuf_addf(sb, " %*.4g", width, v);
    else
        px_strbuf_addf(sb, " %*s", width, "-");
}

static void add_signed(px_strbuf *sb, double v, int width)
{
    if (isfinite(v))
        px_strbuf_addf(sb, " %+*.3g", width, v);
    else
        px_strbuf_addf(sb, " %*s", width, "-");
}

static void add_percent(px_strbuf *sb, double v)
{
    if (isfinite(v))
        px_strbuf_addf(sb, " %+9.1f%%", 100 * v);
    else
        px_strbuf_addf(sb, " %10s", "-");
}

static void add_interval(px_strbuf *sb, px_sim_cmp_metric m, double lo, double hi, bool sign)
{
    char text[64];
    if (isfinite(lo) && isfinite(hi))
        snprintf(text, sizeof text, sign ? "[%+.3g, %+.3g]" : "[%.4g, %.4g]", shown(m, lo),
                 shown(m, hi));
    else
        snprintf(text, sizeof text, "[-inf, +inf]");
    px_strbuf_addf(sb, " %-22s", text);
}

static void scenario_report(const px_sim_comparison *c, const px_sim_scenario_outcome *so,
                            px_strbuf *sb)
{
    px_sim_cmp_metric key = so->metric;
    px_strbuf_addf(sb, "\nscenario %s: %zu devices, objective %s, load %s, %g s x %u seeds%s%s",
                   so->name, so->n_devices, so->objective, so->load, so->duration_s, c->seeds,
                   so->faults ? ", faults " : "", so->faults ? so->faults : "");
    if (isfinite(so->exact_tpot_s))
        px_strbuf_addf(sb, ", exact TPOT %.4g ms", so->exact_tpot_s * 1e3);
    px_strbuf_addf(sb, "\n  %-12s %12s %-22s", "policy", short_names[key], "95% CI");
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
        if (m != (int)key)
            px_strbuf_addf(sb, " %11s", short_names[m]);
    px_strbuf_addf(sb, " %10s\n", "pred tpot");
    for (size_t p = 0; p < c->n_policies; p++) {
        const px_sim_policy_outcome *o = &so->policies[p];
        px_strbuf_addf(sb, "  %-12s", o->policy);
        if (!o->feasible) {
            px_strbuf_addf(sb, " not compared: %s\n", o->reason ? o->reason : "");
            continue;
        }
        add_value(sb, shown(key, o->stats[key].mean), 12);
        add_interval(sb, key, o->stats[key].lo, o->stats[key].hi, false);
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
            if (m != (int)key)
                add_value(sb, shown((px_sim_cmp_metric)m, o->stats[m].mean), 11);
        px_strbuf_addf(sb, " %7.4g ms\n", o->predicted_tpot_p50_s * 1e3);
    }
    px_strbuf_addf(sb, "  %-12s %12s %-22s", "vs reference", "diff", "95% CI");
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
        if (m != (int)key)
            px_strbuf_addf(sb, " %11s", "diff");
    px_strbuf_addf(sb, " %10s %10s %10s\n", "model err", "regret", "exact gap");
    for (size_t p = 0; p < c->n_policies; p++) {
        const px_sim_policy_outcome *o = &so->policies[p];
        if (!o->feasible)
            continue;
        px_strbuf_addf(sb, "  %-12s", o->policy);
        add_signed(sb, shown(key, o->diff[key].mean), 11);
        px_strbuf_addch(sb, o->diff[key].significant ? '*' : ' ');
        add_interval(sb, key, o->diff[key].lo, o->diff[key].hi, true);
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
            if (m != (int)key) {
                add_signed(sb, shown((px_sim_cmp_metric)m, o->diff[m].mean), 10);
                px_strbuf_addch(sb, o->diff[m].significant ? '*' : ' ');
            }
        add_percent(sb, o->model_error);
        add_percent(sb, o->regret);
        add_percent(sb, o->exact_gap);
        px_strbuf_addch(sb, '\n');
    }
    px_strbuf_addf(sb, "  best on %s: %s\n", px_sim_cmp_metric_name(so->metric),
                   so->best ? so->best : "none");
}

px_status px_sim_comparison_report(const px_sim_comparison *c, px_strbuf *sb)
{
    if (c->n_policies == 0)
        return px_strbuf_adds(sb, "no comparison\n");
    px_strbuf_addf(sb,
                   "%zu policies x %zu scenarios x %u seeds; reference %s; metric %s (each "
                   "scenario: the figure its line says \"best on\")\n"
                   "means with 95%% Student-t intervals over seeds; differences are paired by "
                   "seed (this - reference, * significant: the interval excludes 0);\n"
                   "model err = simulated / predicted TPOT p50 - 1; regret = distance to the "
                   "scenario's best policy; exact gap = predicted TPOT / exact optimum - 1\n",
                   c->n_policies, c->n_scenarios, c->seeds, c->policies[0],
                   px_sim_cmp_metric_name(c->metric));
    for (size_t i = 0; i < c->n_scenarios; i++)
        scenario_report(c, &c->scenarios[i], sb);
    px_strbuf_addf(sb,
                   "\noverall (relative paired differences vs %s over every scenario and "
                   "seed, in %%)\n",
                   c->policies[0]);
    px_strbuf_addf(sb, "  %-12s %6s %9s %10s", "policy", "wins", "feasible", "regret");
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
        px_strbuf_addf(sb, " %12.12s", px_sim_cmp_metric_name((px_sim_cmp_metric)m));
    px_strbuf_addch(sb, '\n');
    for (size_t p = 0; p < c->n_policies; p++) {
        const px_sim_policy_overall *ov = &c->overall[p];
        px_strbuf_addf(sb, "  %-12s %6u %6u/%-2zu", ov->policy, ov->wins, ov->n_feasible,
                       c->n_scenarios);
        add_percent(sb, ov->mean_regret);
        for (int m = 0; m < PX_SIM_CMP_COUNT_; m++) {
            if (isfinite(ov->rel_diff[m].mean))
                px_strbuf_addf(sb, " %+10.1f%%%c", 100 * ov->rel_diff[m].mean,
                               ov->rel_diff[m].significant ? '*' : ' ');
            else
                px_strbuf_addf(sb, " %12s", "-");
        }
        px_strbuf_addch(sb, '\n');
    }
    return sb->buf == px__strbuf_empty ? PX_ENOMEM : PX_OK;
}
