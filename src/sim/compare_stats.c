/* The statistics of a policy comparison: the compared figures, means with
 * Student-t intervals, and paired differences. */
#include "base/common.h"

#include "sim/compare_impl.h"

static const struct {
    const char *name, *unit;
    bool higher;
} metrics[PX_SIM_CMP_COUNT_] = {
#define PX__SIM_CMP_ROW(e, name, unit, higher) {name, unit, higher},
    PX_SIM_CMP_METRICS(PX__SIM_CMP_ROW)
#undef PX__SIM_CMP_ROW
};

const char *px_sim_cmp_metric_name(px_sim_cmp_metric m)
{
    return (unsigned)m < PX_SIM_CMP_COUNT_ ? metrics[m].name : "unknown";
}

const char *px__sim_cmp_metric_unit(px_sim_cmp_metric m)
{
    return (unsigned)m < PX_SIM_CMP_COUNT_ ? metrics[m].unit : "";
}

bool px_sim_cmp_metric_higher_is_better(px_sim_cmp_metric m)
{
    return (unsigned)m < PX_SIM_CMP_COUNT_ && metrics[m].higher;
}

px_status px_sim_cmp_metric_parse(const char *text, px_sim_cmp_metric *out, px_err *err)
{
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++)
        if (text && !strcmp(text, metrics[m].name)) {
            *out = (px_sim_cmp_metric)m;
            return PX_OK;
        }
    return px_err_set(err, PX_EINVAL,
                      "unknown metric \"%.40s\"; use tpot_p50_s, tpot_p99_s, ttft_p99_s, "
                      "tokens_per_s, joules_per_token, usd_per_mtoken or failed",
                      text ? text : "");
}

double px__sim_cmp_value(const px_sim_metrics *run, px_sim_cmp_metric m)
{
    switch (m) {
    case PX_SIM_CMP_TPOT_P50:
        return run->tpot_p50_s;
    case PX_SIM_CMP_TPOT_P99:
        return run->tpot_p99_s;
    case PX_SIM_CMP_TTFT_P99:
        return run->ttft_p99_s;
    case PX_SIM_CMP_TOKENS_PER_S:
        return run->tokens_per_s;
    case PX_SIM_CMP_JOULES_PER_TOKEN:
        return run->joules_per_token;
    case PX_SIM_CMP_USD_PER_MTOKEN:
        return run->usd_per_token * 1e6;
    case PX_SIM_CMP_FAILED:
        return run->failed;
    default:
        return NAN;
    }
}

void px__sim_cmp_ci(const double *v, size_t n, size_t stride, px_sim_ci *out)
{
    double sum = 0, sq = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i * stride])) {
            sum += v[i * stride];
            k++;
        }
    double mean = k ? sum / (double)k : NAN;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i * stride]))
            sq += (v[i * stride] - mean) * (v[i * stride] - mean);
    double half = k > 1 ? px_sim_t975((uint32_t)PX_MIN(k - 1, (size_t)UINT32_MAX)) *
                              sqrt(sq / (double)(k - 1) / (double)k)
                        : 0;
    out->mean = mean;
    out->lo = mean - half;
    out->hi = mean + half;
}

void px_sim_paired_diff(const double *a, const double *b, size_t n, px_sim_paired *out)
{
    memset(out, 0, sizeof *out);
    double sum = 0, sq = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(a[i]) && isfinite(b[i])) {
            sum += a[i] - b[i];
            k++;
        }
    out->n = (uint32_t)PX_MIN(k, (size_t)UINT32_MAX);
    if (k == 0) {
        out->mean = out->lo = out->hi = NAN;
        return;
    }
    double mean = sum / (double)k;
    for (size_t i = 0; i < n; i++)
        if (isfinite(a[i]) && isfinite(b[i]))
            sq += (a[i] - b[i] - mean) * (a[i] - b[i] - mean);
    out->mean = mean;
    if (k < 2) {
        out->lo = mean == 0 ? 0 : -INFINITY;
        out->hi = mean == 0 ? 0 : INFINITY;
    } else if (sq == 0) {
        /* No spread: identical inputs give exactly the point 0. */
        out->lo = out->hi = mean;
    } else {
        double half = px_sim_t975(out->n - 1) * sqrt(sq / (double)(k - 1) / (double)k);
        out->lo = mean - half;
        out->hi = mean + half;
    }
    out->significant = out->lo > 0 || out->hi < 0;
}
