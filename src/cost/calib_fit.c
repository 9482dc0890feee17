/* Fitting corrections from observations (Student-t intervals, validity
 * ranges), and the predicted-versus-observed report. */
#include "base/common.h"

#include "cost/cost_impl.h"

static bool same_group(const px_cost_calib_sample *a, const px_cost_calib_sample *b)
{
    /* Step samples with and without a sourced prediction fit apart. */
    return a->cls == b->cls && a->dtype == b->dtype && !strcmp(a->device, b->device) &&
           (a->cls != PX_COST_CLASS_STEP || (a->predicted_s > 0) == (b->predicted_s > 0));
}

static int cmp_size(const void *a, const void *b)
{
    const px_cost_calib_sample *x = *(const px_cost_calib_sample *const *)a;
    const px_cost_calib_sample *y = *(const px_cost_calib_sample *const *)b;
    return x->size < y->size ? -1 : x->size > y->size;
}

typedef struct fit_ctx {
    double conf, slack, src_rel;
    uint32_t min_n;
    const char *dataset;
    char stamp[32];
} fit_ctx;

/* The prediction interval's relative half-width for k samples whose
 * relative residuals have sum of squared deviations m2, with `params`
 * fitted parameters; with few samples the spread itself is unknown, so the
 * sourced uncertainty is the floor. */
static double half_width(const fit_ctx *fc, size_t k, size_t params, double m2)
{
    double half = 0;
    if (k > params) {
        double sd = sqrt(m2 / (double)(k - params));
        half = px_stat_t_quantile(0.5 + fc->conf / 2.0, (double)(k - params)) * sd *
               sqrt(1.0 + 1.0 / (double)k);
    }
    if (k < fc->min_n || k <= params)
        half = PX_MAX(half, fc->src_rel);
    /* A spread of exactly zero is a clock's resolution, not certainty. */
    return PX_MIN(PX_MAX(half, 0.01), 9.0);
}

static void fill_correction(px_cost_correction *c, const fit_ctx *fc,
                            const px_cost_calib_sample *const *g, size_t k, double valid_lo,
                            double valid_hi)
{
    memset(c, 0, sizeof *c);
    px_strlcpy(c->device, g[0]->device, sizeof c->device);
    c->cls = g[0]->cls;
    c->dtype = g[0]->dtype;
    c->n_samples = (uint32_t)k;
    c->confidence = fc->conf;
    c->valid_lo = valid_lo;
    c->valid_hi = valid_hi;
    px_strlcpy(c->dataset, fc->dataset ? fc->dataset : "", sizeof c->dataset);
    px_strlcpy(c->timestamp, fc->stamp, sizeof c->timestamp);
}

/* The step class from samples without a sourced prediction (0): the
 * correction is a fixed time, the mean observed, with factor 1 and the
 * relative prediction interval of one new observation around it.  Samples
 * that carry the sourced per-row prediction are fitted like every other
 * class (a fixed time plus a time per row). */
static px_status fit_step(px_cost_calibration *cal, const fit_ctx *fc,
                          const px_cost_calib_sample *const *g, size_t k, double valid_lo,
                          double valid_hi, px_err *err)
{
    double mean = 0;
    for (size_t j = 0; j < k; j++)
        mean += g[j]->observed_s;
    mean /= (double)k;
    if (!(mean > 0 && mean <= 1e3))
        return PX_OK;
    double rm = 0, m2 = 0;
    for (size_t j = 0; j < k; j++) {
        double r = g[j]->observed_s / mean;
        double d = r - rm;
        rm += d / (double)(j + 1);
        m2 += d * (r - rm);
    }
    double half = half_width(fc, k, 1, m2);
    px_cost_correction c;
    fill_correction(&c, fc, g, k, valid_lo, valid_hi);
    c.factor = 1.0;
    c.offset_s = mean;
    c.lo = PX_MAX(1.0 - half, 0.05);
    c.hi = 1.0 + half;
    return px_cost_calibration_add(cal, &c, err);
}

/* One correction from the samples g[0..k) of one regime: observed =
 * offset + factor x predicted by least squares where the samples' sizes
 * differ enough to tell a fixed cost from a proportional one (at least 3
 * samples whose predictions span 25%), else the mean ratio. */
static px_status fit_regime(px_cost_calibration *cal, const fit_ctx *fc,
                            const px_cost_calib_sample *const *g, size_t k, double valid_lo,
                            double valid_hi, px_err *err)
{
    if (g[0]->cls == PX_COST_CLASS_STEP && !(g[0]->predicted_s > 0))
        return fit_step(cal, fc, g, k, valid_lo, valid_hi, err);
    double xm = 0, ym = 0, xmin = INFINITY, xmax = 0;
    for (size_t j = 0; j < k; j++) {
        xm += g[j]->predicted_s;
        ym += g[j]->observed_s;
        xmin = PX_MIN(xmin, g[j]->predicted_s);
        xmax = PX_MAX(xmax, g[j]->predicted_s);
    }
    xm /= (double)k;
    ym /= (double)k;
    double factor = 0, offset = 0;
    size_t params = 1;
    if (k >= 3 && xmax > 1.25 * xmin) {
        double sxx = 0, sxy = 0;
        for (size_t j = 0; j < k; j++) {
            sxx += (g[j]->predicted_s - xm) * (g[j]->predicted_s - xm);
            sxy += (g[j]->predicted_s - xm) * (g[j]->observed_s - ym);
        }
        factor = sxy / sxx;
        offset = ym - factor * xm;
        params = 2;
        /* A cost that does not grow with the size at all (a link's fixed
         * cost per hop) keeps the smallest slope a correction may have. */
        if (factor > 0 && factor < 1e-6) {
            factor = 1e-6;
            offset = ym - factor * xm;
        }
        /* A negative fixed cost or slope is noise, not a model. */
        if (!(factor > 0) || offset < 0 || !isfinite(offset) || offset > 1e3) {
            factor = 0;
            offset = 0;
            params = 1;
        }
    }
    if (params == 1) {
        for (size_t j = 0; j < k; j++)
            factor += g[j]->observed_s / g[j]->predicted_s;
        factor /= (double)k;
    }
    /* Spread of the relative residuals (Welford). */
    double mean = 0, m2 = 0;
    for (size_t j = 0; j < k; j++) {
        double r = g[j]->observed_s / (offset + factor * g[j]->predicted_s);
        double d = r - mean;
        mean += d / (double)(j + 1);
        m2 += d * (r - mean);
    }
    /* Beyond what a correction can state: no correction, the sourced
     * figure stays. */
    if (!(factor >= 1e-6 && factor <= 1e6) || !isfinite(offset))
        return PX_OK;
    px_cost_correction c;
    fill_correction(&c, fc, g, k, valid_lo, valid_hi);
    c.factor = factor;
    c.offset_s = offset;
    double half = half_width(fc, k, params, m2);
    c.lo = factor * PX_MAX(1.0 - half, 0.05);
    c.hi = factor * (1.0 + half);
    return px_cost_calibration_add(cal, &c, err);
}

px_status px_cost_calibration_fit(px_cost_calibration *cal, const px_cost_calib_sample *samples,
                                  size_t n, const px_cost_fit_opts *opts, px_err *err)
{
    px_cost_fit_opts o = {0};
    if (opts)
        o = *opts;
    fit_ctx fc = {.conf = o.confidence > 0 && o.confidence < 1 ? o.confidence : 0.95,
                  .slack = o.range_slack >= 1 ? o.range_slack : 2.0,
                  .src_rel = o.sourced_rel > 0 ? o.sourced_rel : 0.5,
                  .min_n = o.min_samples ? o.min_samples : 3,
                  .dataset = o.dataset};
    if (o.timestamp)
        px_strlcpy(fc.stamp, o.timestamp, sizeof fc.stamp);
    else
        px_time_format(px_wall_time(), fc.stamp);
    for (size_t i = 0; i < n; i++) {
        const px_cost_calib_sample *s = &samples[i];
        if (!s->device || !s->device[0] || strlen(s->device) >= 64)
            return px_err_set(err, PX_EINVAL, "calibration sample %zu: no device (or too long)", i);
        /* A step sample may come without a sourced prediction (0). */
        bool step = s->cls == PX_COST_CLASS_STEP && s->predicted_s == 0;
        if (!isfinite(s->predicted_s) || !(step || s->predicted_s > 0) ||
            !isfinite(s->observed_s) || !(s->observed_s > 0) || !isfinite(s->size) || s->size < 0 ||
            (unsigned)s->cls >= PX_COST_CLASS_COUNT_ || (unsigned)s->dtype > PX_DTYPE_COUNT_)
            return px_err_set(err, PX_EINVAL,
                              "calibration sample %zu (%s, %s): predicted %g s, observed %g s, "
                              "size %g; times must be finite and positive",
                              i, s->device, px_cost_op_class_name(s->cls), s->predicted_s,
                              s->observed_s, s->size);
    }
    bool *done = calloc(n ? n : 1, sizeof *done);
    const px_cost_calib_sample **g = malloc((n ? n : 1) * sizeof *g);
    px_status st = PX_OK;
    if (!done || !g) {
        st = px_err_set(err, PX_ENOMEM, "out of memory fitting corrections");
        goto done;
    }
    for (size_t i = 0; i < n && st == PX_OK; i++) {
        if (done[i])
            continue;
        size_t k = 0;
        for (size_t j = i; j < n; j++) {
            if (!done[j] && same_group(&samples[i], &samples[j])) {
                done[j] = true;
                g[k++] = &samples[j];
            }
        }
        qsort(g, k, sizeof *g, cmp_size);
        /* Regimes: runs of sizes without a gap wider than the slack. */
        double prev_hi = 0;
        for (size_t a = 0; a < k && st == PX_OK;) {
            size_t b = a + 1;
            while (b < k && g[b]->size <= g[b - 1]->size * fc.slack)
                b++;
            double lo = g[a]->size / fc.slack, hi = g[b - 1]->size * fc.slack;
            if (a > 0)
                lo = PX_MAX(lo, prev_hi);
            if (b < k) {
                double mid = sqrt(PX_MAX(g[b - 1]->size, 1e-300) * g[b]->size);
                hi = PX_MIN(hi, mid);
                /* The next regime starts just above this one's end. */
                prev_hi = nextafter(hi, INFINITY);
            }
            st = fit_regime(cal, &fc, g + a, b - a, lo, hi, err);
            a = b;
        }
    }
done:
    free(done);
    free(g);
    return st;
}

/* ---- the report ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bool inside(const px_cost_interval *iv, double x)
{
    return x >= iv->lo && x <= iv->hi;
}

static void fmt_iv(const px_cost_interval *iv, char *buf, size_t n)
{
    char a[24], b[24], c[24];
    px_format_seconds(iv->p50, a, sizeof a);
    px_format_seconds(iv->lo, b, sizeof b);
    px_format_seconds(iv->hi, c, sizeof c);
    snprintf(buf, n, "%s [%s, %s]", a, b, c);
}

px_status px_cost_calib_report(const px_cost_calib_obs *obs, size_t n, px_cost_calib_summary *sum,
                               px_strbuf *out)
{
    px_cost_calib_summary s = {.n = n};
    double *eb = malloc((n ? n : 1) * sizeof *eb);
    double *ea = malloc((n ? n : 1) * sizeof *ea);
    if (!eb || !ea) {
        free(eb);
        free(ea);
        return PX_ENOMEM;
    }
    size_t in_b = 0, in_a = 0;
    if (out)
        px_strbuf_addf(out, "%-40s %-10s %-32s %-7s %-32s %-7s\n", "observation", "observed",
                       "sourced p50 [lo, hi]", "error", "calibrated p50 [lo, hi]", "error");
    for (size_t i = 0; i < n; i++) {
        const px_cost_calib_obs *o = &obs[i];
        eb[i] = fabs(o->before.p50 - o->observed_s) / o->observed_s;
        ea[i] = fabs(o->after.p50 - o->observed_s) / o->observed_s;
        bool ib = inside(&o->before, o->observed_s), ia = inside(&o->after, o->observed_s);
        in_b += ib;
        in_a += ia;
        if (out) {
            char ob[24], b[80], a[80];
            px_format_seconds(o->observed_s, ob, sizeof ob);
            fmt_iv(&o->before, b, sizeof b);
            fmt_iv(&o->after, a, sizeof a);
            px_strbuf_addf(out, "%-40.40s %-10s %-32s %5.1f%%%s %-32s %5.1f%%%s\n", o->label, ob, b,
                           100 * eb[i], ib ? " " : "!", a, 100 * ea[i], ia ? " " : "!");
        }
    }
    s.mae_before = median(eb, n);
    s.mae_after = median(ea, n);
    s.coverage_before = n ? (double)in_b / (double)n : NAN;
    s.coverage_after = n ? (double)in_a / (double)n : NAN;
    if (out)
        px_strbuf_addf(out,
                       "median absolute error: sourced %.1f%%, calibrated %.1f%%; observations "
                       "inside the interval: sourced %zu/%zu (%.0f%%), calibrated %zu/%zu "
                       "(%.0f%%)  (! marks an observation outside)\n",
                       100 * s.mae_before, 100 * s.mae_after, in_b, n, 100 * s.coverage_before,
                       in_a, n, 100 * s.coverage_after);
    free(eb);
    free(ea);
    if (sum)
        *sum = s;
    return PX_OK;
}
