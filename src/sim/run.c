/* Replications, confidence intervals and the result document. */
#include "base/common.h"

#include "sim/sim_impl.h"

void px_sim_options_default(px_sim_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->duration_s = 60;
    opt->seed = 1;
    opt->replications = 5;
    opt->queue_limit = 100000;
    opt->random_failures = true;
    opt->failure_accel = 1;
    opt->ambient_k = 298.15;
    opt->throttle_clock = 0.7;
}

double px_sim_t975(uint32_t df)
{
    return px_stat_t_quantile(0.975, (double)df);
}

static px_status check_options(const px_sim_options *o, px_err *err)
{
    if (!(o->duration_s > 0 && o->duration_s <= 1e7))
        return px_err_set(err, PX_EINVAL, "simulate: duration %g s: use 0 < duration <= 1e7 s",
                          o->duration_s);
    if (!(o->warmup_s >= 0 && o->warmup_s < o->duration_s))
        return px_err_set(err, PX_EINVAL, "simulate: warm-up %g s must be in [0, duration)",
                          o->warmup_s);
    if (o->replications < 1 || o->replications > 1000)
        return px_err_set(err, PX_EINVAL, "simulate: %u replications: use 1 to 1000",
                          o->replications);
    if (o->queue_limit < 1 || o->queue_limit > 10000000)
        return px_err_set(err, PX_EINVAL, "simulate: queue limit %u: use 1 to 10,000,000",
                          o->queue_limit);
    if (!(o->failure_accel >= 0 && isfinite(o->failure_accel)) ||
        !(o->ambient_k > 0 && o->ambient_k < 1000) ||
        !(o->throttle_clock > 0 && o->throttle_clock <= 1))
        return px_err_set(err, PX_EINVAL,
                          "simulate: failure acceleration, ambient temperature "
                          "or throttle clock out of range");
    if (o->n_fallbacks > 64)
        return px_err_set(err, PX_EINVAL, "simulate: at most 64 fallback plans");
    if (o->hooks && (o->hooks->version < 1 || o->hooks->version > PX_SIM_HOOKS_VERSION))
        return px_err_set(err, PX_EINVAL, "simulate: hooks version %d; this library speaks 1 to %d",
                          o->hooks->version, PX_SIM_HOOKS_VERSION);
    if (o->hooks && o->hooks->version >= 2 && o->hooks->on_tick &&
        !(o->hooks->tick_s > 0 && isfinite(o->hooks->tick_s)))
        return px_err_set(err, PX_EINVAL,
                          "simulate: hooks.tick_s %g: on_tick needs a positive tick",
                          o->hooks->tick_s);
    return PX_OK;
}

static px_status check_load(const px_sim_load *l, px_err *err)
{
    if (l->kind == PX_SIM_LOAD_TRACE)
        return l->n_arrivals && l->arrivals
                   ? PX_OK
                   : px_err_set(err, PX_EINVAL, "load: a trace load without arrivals");
    if (!(l->rate > 0 && l->rate < 1e9))
        return px_err_set(err, PX_EINVAL, "load: rate %g requests/s out of range", l->rate);
    if (l->kind == PX_SIM_LOAD_BURSTY && !(l->burst > 1 && l->period_s > 0))
        return px_err_set(err, PX_EINVAL, "load: bursty needs burst > 1 and period > 0");
    const px_sim_len *lens[2] = {&l->prompt, &l->gen};
    for (int i = 0; i < 2; i++)
        if (lens[i]->a < 1 || (lens[i]->kind == PX_SIM_LEN_UNIFORM && lens[i]->b < lens[i]->a))
            return px_err_set(err, PX_EINVAL, "load: %s length out of range", i ? "gen" : "prompt");
    return PX_OK;
}

/* Fault targets must name what the plan's inventory holds. */
static px_status bind_faults(const px_sim_plan *p, const px_sim_faults *f, px_err *err)
{
    for (size_t i = 0; f && i < f->n; i++) {
        const px_sim_fault *x = &f->items[i];
        if (x->kind == PX_SIM_FAULT_DOMAIN_LOSS) {
            if (px__sim_find_domain(p, x->target) == PX_SIM_NONE)
                return px_err_set(err, PX_ENOTFOUND,
                                  "faults[%zu].target: failure domain "
                                  "\"%.80s\" is not in the plan's inventory",
                                  i, x->target);
            continue;
        }
        if (x->kind == PX_SIM_FAULT_LINK_DEGRADE) {
            char a[PX_SIM_ID_LEN];
            const char *gt = strchr(x->target, '>');
            size_t la = gt ? (size_t)(gt - x->target) : 0;
            if (!gt || la >= sizeof a)
                return px_err_set(err, PX_EINVAL, "faults[%zu].target: not FROM>TO", i);
            memcpy(a, x->target, la);
            a[la] = 0;
            const char *bad = px__sim_find_device(p, a) == PX_SIM_NONE        ? a
                              : px__sim_find_device(p, gt + 1) == PX_SIM_NONE ? gt + 1
                                                                              : NULL;
            if (bad)
                return px_err_set(err, PX_ENOTFOUND,
                                  "faults[%zu].target: device \"%.80s\" is "
                                  "not in the plan's inventory",
                                  i, bad);
            continue;
        }
        if (strcmp(x->target, "*") && px__sim_find_device(p, x->target) == PX_SIM_NONE)
            return px_err_set(err, PX_ENOTFOUND,
                              "faults[%zu].target: device \"%.80s\" is not in "
                              "the plan's inventory",
                              i, x->target);
    }
    return PX_OK;
}

px_status px_sim_run(const px_sim_plan *plan, const px_sim_load *load, const px_sim_faults *faults,
                     const px_sim_options *options, px_sim_result *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    px_sim_options dflt;
    if (!options) {
        px_sim_options_default(&dflt);
        options = &dflt;
    }
    if (!plan || !load)
        return px_err_set(err, PX_EINVAL, "simulate: no plan or no load");
    px_status st;
    if ((st = check_options(options, err)) != PX_OK || (st = check_load(load, err)) != PX_OK ||
        (st = px_sim_plan_check(plan, err)) != PX_OK || (st = bind_faults(plan, faults, err)))
        return st;
    for (size_t k = 0; k < options->n_fallbacks; k++) {
        const px_sim_plan *fb = &options->fallbacks[k];
        if ((st = px_sim_plan_check(fb, err)) != PX_OK)
            return px_err_prefix(err, st, "fallback %zu: ", k);
        bool same = fb->n_devices == plan->n_devices;
        for (size_t d = 0; same && d < plan->n_devices; d++)
            same = !strcmp(fb->devices[d].id, plan->devices[d].id);
        if (!same)
            return px_err_set(err, PX_EINVAL,
                              "fallback %zu: its device table differs from the "
                              "plan's; make both from the same inventory",
                              k);
    }
    uint32_t n = options->replications;
    out->runs = calloc(n, sizeof *out->runs);
    out->devices = calloc((size_t)n * plan->n_devices, sizeof *out->devices);
    if (!out->runs || !out->devices) {
        px_sim_result_release(out);
        return px_err_set(err, PX_ENOMEM, "simulate: out of memory");
    }
    out->n_replications = n;
    out->n_devices = plan->n_devices;
    out->duration_s = options->duration_s;
    out->seed = options->seed;
    out->emulated = plan->emulated;
    px_strlcpy(out->plan_id, plan->id, sizeof out->plan_id);
    for (uint32_t r = 0; r < n; r++) {
        /* Replication r's seed: an independent stream of the base seed. */
        px_rng rr = px_rng_derive(options->seed, PX__SIM_STREAM_REPLICATION + r);
        st = px__sim_run_one_at(plan, load, faults, options, r, px_rng_next(&rr), &out->runs[r],
                                &out->devices[(size_t)r * plan->n_devices], err);
        if (st != PX_OK) {
            px_sim_result_release(out);
            return st;
        }
        if (options->progress)
            options->progress(options->progress_ctx, r + 1, n);
    }
    /* Mean and 95% Student-t interval per metric, over the replications
     * where the metric is defined (a run with no completion has no TPOT);
     * every figure is non-negative, so intervals are cut at 0. */
#define PX__SIM_AGG(f, name, unit)                                             \
    {                                                                          \
        double sum = 0, sq = 0;                                                \
        uint32_t k = 0;                                                        \
        for (uint32_t r = 0; r < n; r++)                                       \
            if (isfinite(out->runs[r].f)) {                                    \
                sum += out->runs[r].f;                                         \
                k++;                                                           \
            }                                                                  \
        double mean = k ? sum / k : NAN;                                       \
        for (uint32_t r = 0; r < n; r++)                                       \
            if (isfinite(out->runs[r].f))                                      \
                sq += (out->runs[r].f - mean) * (out->runs[r].f - mean);       \
        double half = k > 1 ? px_sim_t975(k - 1) * sqrt(sq / (k - 1) / k) : 0; \
        out->mean.f = mean;                                                    \
        out->lo.f = mean - half < 0 ? 0 : mean - half;                         \
        out->hi.f = mean + half;                                               \
    }
    PX_SIM_METRICS(PX__SIM_AGG)
#undef PX__SIM_AGG
    return PX_OK;
}

void px_sim_result_release(px_sim_result *res)
{
    if (!res)
        return;
    free(res->runs);
    free(res->devices);
    memset(res, 0, sizeof *res);
}

/* Numbers rounded to 10 significant digits so the text is stable across
 * compilers' last-bit differences; NaN (undefined) becomes null. */
static json_t *num(double v)
{
    if (!isfinite(v))
        return json_null();
    char buf[64];
    snprintf(buf, sizeof buf, "%.10g", v);
    return json_real(strtod(buf, NULL));
}

json_t *px_sim_result_to_json(const px_sim_result *res, const px_sim_plan *plan)
{
    json_t *metrics = json_object();
    json_t *doc = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s, s:b, s:o}", "schema", "plexus.sim/1",
                            "plan", res->plan_id, "duration_s", num(res->duration_s), "seed",
                            (json_int_t)res->seed, "replications", (json_int_t)res->n_replications,
                            "interval", "95% Student t over replication means", "emulated",
                            res->emulated, "metrics", metrics);
    if (!doc)
        return NULL;
    bool ok = true;
#define PX__SIM_JSON(f, name, unit)                                                              \
    {                                                                                            \
        json_t *runs = json_array();                                                             \
        for (uint32_t r = 0; runs && r < res->n_replications; r++)                               \
            ok &= px_json_push(runs, num(res->runs[r].f)) == PX_OK;                              \
        ok &= px_json_set(metrics, name,                                                         \
                          json_pack("{s:o, s:o, s:o, s:s, s:o}", "mean", num(res->mean.f), "lo", \
                                    num(res->lo.f), "hi", num(res->hi.f), "unit", unit, "runs",  \
                                    runs)) == PX_OK;                                             \
    }
    PX_SIM_METRICS(PX__SIM_JSON)
#undef PX__SIM_JSON
    json_t *devs = json_array();
    ok &= px_json_set(doc, "devices", devs) == PX_OK;
    for (size_t d = 0; ok && d < res->n_devices; d++) {
        double u = 0, e = 0, t = 0, th = 0, lost = 0;
        uint32_t n_lost = 0;
        for (uint32_t r = 0; r < res->n_replications; r++) {
            const px_sim_device_stats *s = &res->devices[(size_t)r * res->n_devices + d];
            u += s->utilization;
            e += s->energy_j;
            th += s->throttled_s;
            if (s->max_temp_k > t)
                t = s->max_temp_k;
            if (s->lost_at_s >= 0) {
                lost += s->lost_at_s;
                n_lost++;
            }
        }
        double k = res->n_replications;
        json_t *o =
            json_pack("{s:s, s:o, s:o, s:o, s:o, s:I}", "id", plan ? plan->devices[d].id : "",
                      "utilization", num(u / k), "energy_j", num(e / k), "max_temp_k", num(t),
                      "throttled_s", num(th / k), "lost_in_runs", (json_int_t)n_lost);
        ok &= o && px_json_push(devs, o) == PX_OK;
        if (o && n_lost)
            ok &= px_json_set(o, "mean_lost_at_s", num(lost / n_lost)) == PX_OK;
    }
    if (plan && plan->predicted_throughput > 0)
        ok &= px_json_set(doc, "predicted_tokens_per_s", num(plan->predicted_throughput)) == PX_OK;
    if (res->emulated)
        ok &= px_json_set(doc, "notice",
                          json_string("simulated on a plan for emulated or "
                                      "simulated devices: no claim about real "
                                      "hardware")) == PX_OK;
    if (!ok) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

/* Four significant digits in the largest unit that keeps the number at
 * least 1: a report line, not a record. */
static void fmt4(double v, px_dim dim, char *buf, size_t n)
{
    typedef struct unit {
        double scale;
        const char *name;
    } unit;
    static const unit time_units[] = {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}};
    static const unit energy_units[] = {
        {1e9, "GJ"}, {1e6, "MJ"}, {1e3, "kJ"}, {1, "J"}, {1e-3, "mJ"}};
    const unit *u = dim == PX_DIM_TIME ? time_units : energy_units;
    size_t count = dim == PX_DIM_TIME ? PX_ARRAY_LEN(time_units) : PX_ARRAY_LEN(energy_units);
    size_t i = 0;
    while (i + 1 < count && fabs(v) < u[i].scale)
        i++;
    snprintf(buf, n, "%.4g %s", v / u[i].scale, u[i].name);
}

static void line(px_strbuf *sb, const char *label, const px_sim_result *r, double m, double lo,
                 double hi, px_dim dim, double scale)
{
    char a[48], b[48], c[48];
    if (!isfinite(m)) {
        px_strbuf_addf(sb, "  %-24s -\n", label);
        return;
    }
    if (dim == PX_DIM_NONE) {
        snprintf(a, sizeof a, "%.4g", m * scale);
        snprintf(b, sizeof b, "%.4g", lo * scale);
        snprintf(c, sizeof c, "%.4g", hi * scale);
    } else {
        fmt4(m, dim, a, sizeof a);
        fmt4(lo > 0 ? lo : 0, dim, b, sizeof b);
        fmt4(hi, dim, c, sizeof c);
    }
    if (r->n_replications > 1)
        px_strbuf_addf(sb, "  %-24s %-12s [%s, %s]\n", label, a, b, c);
    else
        px_strbuf_addf(sb, "  %-24s %s\n", label, a);
}

px_status px_sim_result_report(const px_sim_result *r, const px_sim_plan *plan, px_strbuf *out)
{
    size_t before = out->len;
    px_strbuf_addf(out, "simulated plan %.12s for %g s x %u replication(s), seed %" PRIu64 "\n",
                   r->plan_id[0] ? r->plan_id : "(no id)", r->duration_s, r->n_replications,
                   r->seed);
    if (r->n_replications > 1)
        px_strbuf_adds(out, "  (mean [95% confidence interval, Student t over replications])\n");
#define L(label, f, dim, scale) line(out, label, r, r->mean.f, r->lo.f, r->hi.f, dim, scale)
    L("time to first token p50", ttft_p50_s, PX_DIM_TIME, 1);
    L("time to first token p99", ttft_p99_s, PX_DIM_TIME, 1);
    L("time per token p50", tpot_p50_s, PX_DIM_TIME, 1);
    L("time per token p99", tpot_p99_s, PX_DIM_TIME, 1);
    L("tokens/s", tokens_per_s, PX_DIM_NONE, 1);
    L("requests/s", requests_per_s, PX_DIM_NONE, 1);
    L("completed", completed, PX_DIM_NONE, 1);
    L("failed", failed, PX_DIM_NONE, 1);
    L("dropped", dropped, PX_DIM_NONE, 1);
    L("energy", energy_j, PX_DIM_ENERGY, 1);
    L("energy per token", joules_per_token, PX_DIM_ENERGY, 1);
    L("cost ($)", usd, PX_DIM_NONE, 1);
    L("utilization (%)", mean_utilization, PX_DIM_NONE, 100);
    L("stranded KV (%)", stranded_kv_fraction, PX_DIM_NONE, 100);
    L("device losses", device_losses, PX_DIM_NONE, 1);
    L("throttled device-s", throttled_s, PX_DIM_NONE, 1);
#undef L
    /* Per device: the ones that worked or were lost, at most 32 lines. */
    uint32_t shown = 0;
    for (size_t d = 0; plan && d < r->n_devices && d < plan->n_devices && shown < 32; d++) {
        double u = 0, th = 0, t = 0;
        uint32_t lost = 0;
        for (uint32_t k = 0; k < r->n_replications; k++) {
            const px_sim_device_stats *s = &r->devices[(size_t)k * r->n_devices + d];
            u += s->utilization / r->n_replications;
            th += s->throttled_s / r->n_replications;
            t = s->max_temp_k > t ? s->max_temp_k : t;
            lost += s->lost_at_s >= 0;
        }
        if (u <= 0 && !lost)
            continue;
        if (!shown++)
            px_strbuf_adds(out,
                           "  device                   busy   max temp  throttled  lost in runs\n");
        px_strbuf_addf(out, "  %-24.24s %5.1f%%  %6.1f C  %7.1f s  %u/%u\n", plan->devices[d].id,
                       100 * u, t - 273.15, th, lost, r->n_replications);
    }
    if (plan && plan->predicted_throughput > 0)
        px_strbuf_addf(out, "  plan predicted %.4g tokens/s at full batch\n",
                       plan->predicted_throughput);
    if (r->emulated)
        px_strbuf_adds(out, "  notice: emulated or simulated devices; no claim about real "
                            "hardware\n");
    return out->len > before ? PX_OK : PX_ENOMEM;
}

json_t *px_sim_options_to_json(const px_sim_options *o)
{
    return json_pack("{s:f, s:f, s:I, s:I, s:I, s:b, s:f, s:f, s:f}", "duration_s", o->duration_s,
                     "warmup_s", o->warmup_s, "seed", (json_int_t)o->seed, "replications",
                     (json_int_t)o->replications, "queue_limit", (json_int_t)o->queue_limit,
                     "random_failures", o->random_failures, "failure_accel", o->failure_accel,
                     "ambient_k", o->ambient_k, "throttle_clock", o->throttle_clock);
}

px_status px_sim_options_from_json(const json_t *v, px_sim_options *o, px_err *err)
{
    px_sim_options_default(o);
    json_int_t seed, reps, ql;
    int rf;
    if (json_unpack((json_t *)v, "{s:F, s:F, s:I, s:I, s:I, s:b, s:F, s:F, s:F}", "duration_s",
                    &o->duration_s, "warmup_s", &o->warmup_s, "seed", &seed, "replications", &reps,
                    "queue_limit", &ql, "random_failures", &rf, "failure_accel", &o->failure_accel,
                    "ambient_k", &o->ambient_k, "throttle_clock", &o->throttle_clock) ||
        reps < 1 || reps > 1000 || ql < 1 || ql > 10000000)
        return px_err_set(err, PX_EPARSE, "recorded options: malformed");
    o->seed = (uint64_t)seed;
    o->replications = (uint32_t)reps;
    o->queue_limit = (uint32_t)ql;
    o->random_failures = rf;
    return check_options(o, err);
}
