/* A box and strip plot of each policy's figures over seeds, one panel per
 * scenario: plain SVG written by hand, deterministic to the byte. */
#include "base/common.h"

#include "base/svg.h"
#include "sim/compare_impl.h"

#define WIDTH    760
#define LABEL_W  150
#define PLOT_X0  (LABEL_W + 10)
#define PLOT_X1  (WIDTH - 30)
#define ROW_H    26
#define HEADER_H 34
#define AXIS_H   34

/* A tick step of 1, 2 or 5 times a power of ten giving about five ticks
 * over range (> 0). */
static double nice_step(double range)
{
    double raw = range / 5, mag = pow(10, floor(log10(raw))), norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted v[0..n-1] by linear interpolation. */
static double quantile(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n)
        return v[n - 1];
    return v[i] + (pos - (double)i) * (v[i + 1] - v[i]);
}

static double scale_of(px_sim_cmp_metric m)
{
    return !strcmp(px__sim_cmp_metric_unit(m), "s") ? 1e3 : 1;
}

static const char *unit_of(px_sim_cmp_metric m)
{
    const char *u = px__sim_cmp_metric_unit(m);
    return !strcmp(u, "s") ? "ms" : u;
}

static void panel(const px_sim_comparison *c, const px_sim_scenario_outcome *so,
                  px_sim_cmp_metric m, double y0, double *vals, px_strbuf *sb)
{
    double k = scale_of(m);
    double lo = INFINITY, hi = -INFINITY;
    for (size_t p = 0; p < c->n_policies; p++)
        for (size_t s = 0; so->policies[p].feasible && s < c->seeds; s++) {
            double v = so->policies[p].samples[s * PX_SIM_CMP_COUNT_ + (size_t)m] * k;
            if (isfinite(v)) {
                lo = PX_MIN(lo, v);
                hi = PX_MAX(hi, v);
            }
        }
    if (!isfinite(lo)) {
        lo = 0;
        hi = 1;
    }
    double pad = hi > lo ? 0.05 * (hi - lo) : (lo != 0 ? 0.05 * fabs(lo) : 1);
    /* The axis runs between ticks at round values, all written with the
     * same number of decimals, in the unit the header names. */
    double step = nice_step(hi - lo + 2 * pad);
    lo = floor((lo - pad) / step) * step;
    hi = ceil((hi + pad) / step) * step;
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
#define X(v) (PLOT_X0 + ((v)-lo) / (hi - lo) * (PLOT_X1 - PLOT_X0))
    px_strbuf_addf(sb, "<text x=\"10\" y=\"%.1f\" font-weight=\"bold\">", y0 + 20);
    px_svg_escape(sb, so->name);
    /* The metric's name without the unit its JSON key carries ("_s"):
     * the picture draws it in the unit said here. */
    const char *mname = px_sim_cmp_metric_name(m);
    size_t mlen = strlen(mname);
    if (!strcmp(unit_of(m), "ms") && mlen > 2 && !strcmp(mname + mlen - 2, "_s"))
        mlen -= 2;
    px_strbuf_addf(sb, ": %.*s (%s), %u seeds</text>\n", (int)mlen, mname, unit_of(m), c->seeds);
    double rows_y = y0 + HEADER_H;
    for (size_t p = 0; p < c->n_policies; p++) {
        const px_sim_policy_outcome *o = &so->policies[p];
        double cy = rows_y + (double)p * ROW_H + ROW_H / 2.0;
        px_strbuf_addf(sb, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", LABEL_W, cy + 4);
        px_svg_escape(sb, o->policy);
        px_strbuf_adds(sb, "</text>\n");
        size_t n = 0;
        for (size_t s = 0; o->feasible && s < c->seeds; s++) {
            double v = o->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m] * k;
            if (isfinite(v))
                vals[n++] = v;
        }
        if (n == 0) {
            px_strbuf_addf(sb, "<text x=\"%d\" y=\"%.1f\" fill=\"#888\">%s</text>\n", PLOT_X0,
                           cy + 4, o->feasible ? "no value" : "infeasible");
            continue;
        }
        qsort(vals, n, sizeof *vals, cmp_double);
        double q1 = quantile(vals, n, 0.25), med = quantile(vals, n, 0.5),
               q3 = quantile(vals, n, 0.75);
        px_strbuf_addf(sb,
                       "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#555\"/>\n",
                       X(vals[0]), cy, X(vals[n - 1]), cy);
        px_strbuf_addf(sb,
                       "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"#cfe0f3\" "
                       "stroke=\"#2b5d8a\"/>\n",
                       X(q1), cy - 8, X(q3) - X(q1), 16);
        px_strbuf_addf(sb,
                       "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#2b5d8a\" "
                       "stroke-width=\"2\"/>\n",
                       X(med), cy - 8, X(med), cy + 8);
        /* The strip: every seed's value, spread vertically by a fixed
         * pattern (no random jitter, so the file is reproducible). */
        for (size_t s = 0; s < c->seeds; s++) {
            double v = o->samples[s * PX_SIM_CMP_COUNT_ + (size_t)m] * k;
            if (!isfinite(v))
                continue;
            px_strbuf_addf(sb,
                           "<circle cx=\"%.2f\" cy=\"%.1f\" r=\"2.5\" fill=\"#d9480f\" "
                           "fill-opacity=\"0.7\"/>\n",
                           X(v), cy + (double)((int)(s % 5) - 2) * 2.5);
        }
    }
    double ay = rows_y + (double)c->n_policies * ROW_H + 6;
    px_strbuf_addf(sb, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#000\"/>\n",
                   PLOT_X0, ay, PLOT_X1, ay);
    int n_ticks = (int)lround((hi - lo) / step);
    for (int t = 0; t <= n_ticks; t++) {
        double v = lo + step * t;
        if (fabs(v) < step * 1e-9)
            v = 0; /* no "-0" */
        px_strbuf_addf(sb,
                       "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#000\"/>\n"
                       "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n",
                       X(v), ay, X(v), ay + 4, X(v), ay + 16, decimals, v);
    }
    /* The unit left of the first tick's label (centred on the axis' start). */
    char first[32];
    snprintf(first, sizeof first, "%.*f", decimals, fabs(lo) < step * 1e-9 ? 0 : lo);
    px_strbuf_addf(sb, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
                   PLOT_X0 - 6 - px_svg_text_width(first, 12) / 2, ay + 16);
    px_svg_escape(sb, unit_of(m));
    px_strbuf_adds(sb, "</text>\n");
#undef X
}

px_status px_sim_comparison_svg(const px_sim_comparison *c, px_sim_cmp_metric m, px_strbuf *sb)
{
    if ((unsigned)m >= PX_SIM_CMP_COUNT_)
        m = c->metric;
    double panel_h = HEADER_H + (double)c->n_policies * ROW_H + AXIS_H;
    double height = 10 + (double)c->n_scenarios * panel_h;
    double *vals = malloc((c->seeds ? c->seeds : 1) * sizeof *vals);
    if (!vals)
        return PX_ENOMEM;
    px_strbuf_addf(sb,
                   "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
                   "viewBox=\"0 0 %d %.0f\" font-family=\"%s\" font-size=\"12\">\n"
                   "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
                   WIDTH, height, WIDTH, height, PX_SVG_FONT);
    for (size_t i = 0; i < c->n_scenarios; i++)
        panel(c, &c->scenarios[i], m, 10 + (double)i * panel_h, vals, sb);
    px_strbuf_adds(sb, "</svg>\n");
    free(vals);
    return sb->buf == px__strbuf_empty ? PX_ENOMEM : PX_OK;
}
