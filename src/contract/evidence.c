/*
 * Discharging obligations: checking what a validation run measured against
 * a clause, with the margin by which each requirement passed or failed.
 */
#include "contract/contract_impl.h"

/* |x - r| with NaN and infinities handled as "equal when identical". */
static double elem_error(double x, double r)
{
    if (isnan(x) || isnan(r))
        return isnan(x) && isnan(r) ? 0 : INFINITY;
    if (isinf(x) || isinf(r))
        return x == r ? 0 : INFINITY;
    return fabs(x - r);
}

void px_contract_measure_tolerance(const float *x, const float *r, size_t n, double atol,
                                   double rtol, px_contract_evidence *ev)
{
    double max_abs = 0, max_rel = 0, max_ratio = 0;
    for (size_t i = 0; i < n; i++) {
        double ri = r[i];
        double diff = elem_error(x[i], ri);
        double mag = isfinite(ri) ? fabs(ri) : 0;
        double rel = diff == 0 ? 0 : (mag > 0 ? diff / mag : INFINITY);
        double bound = atol + rtol * mag;
        double ratio = diff == 0 ? 0 : (bound > 0 ? diff / bound : INFINITY);
        max_abs = PX_MAX(max_abs, diff);
        max_rel = PX_MAX(max_rel, rel);
        max_ratio = PX_MAX(max_ratio, ratio);
    }
    ev->max_abs_err = max_abs;
    ev->max_rel_err = max_rel;
    ev->tol_ratio = max_ratio;
    ev->measured |= PX_CONTRACT_TOLERANCE;
}

static void item_text(px_contract_check_item *it, const char *fmt, ...) PX_PRINTF(2, 3);
static void item_text(px_contract_check_item *it, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->text, sizeof it->text, fmt, ap);
    va_end(ap);
}

static void check_flag(px_contract_check_item *it, bool measured, bool equal, const char *ok,
                       const char *bad)
{
    it->measured = measured;
    it->bound = 1;
    it->value = measured && equal ? 1 : 0;
    it->margin = 0;
    it->pass = measured && equal;
    if (!measured)
        item_text(it, "not measured");
    else
        item_text(it, "%s", equal ? ok : bad);
}

static double ratio_of(double err, double bound)
{
    if (isnan(err))
        return NAN;
    if (err == 0)
        return 0;
    return bound > 0 ? err / bound : INFINITY;
}

static void check_tolerance(const px_contract_clause *cl, const px_contract_evidence *ev,
                            px_contract_check_item *it)
{
    it->bound = 1;
    if (!(ev->measured & PX_CONTRACT_TOLERANCE)) {
        item_text(it, "not measured");
        return;
    }
    it->measured = true;
    bool exact_ratio = !isnan(ev->tol_ratio);
    double ratio;
    if (exact_ratio) {
        ratio = ev->tol_ratio;
    } else {
        /* From the maxima alone the combined bound is only known to hold
         * when one of its terms covers every element by itself. */
        double ra = ratio_of(ev->max_abs_err, cl->atol);
        double rr = ratio_of(ev->max_rel_err, cl->rtol);
        ratio = isnan(ra) || isnan(rr) ? NAN : PX_MIN(ra, rr);
    }
    it->value = ratio;
    if (isnan(ratio) || ratio < 0) {
        item_text(it, "the measured error is not a number");
        return;
    }
    it->margin = 1 - ratio;
    it->pass = ratio <= 1;
    if (it->pass)
        item_text(it,
                  "max |x - r| = %g, max rel = %g: within atol %g + rtol %g |r| (%.1f%% of the "
                  "bound used)",
                  ev->max_abs_err, ev->max_rel_err, cl->atol, cl->rtol, 100 * ratio);
    else if (exact_ratio)
        item_text(it,
                  "max |x - r| = %g, max rel = %g: exceeds atol %g + rtol %g |r| by a factor of %g",
                  ev->max_abs_err, ev->max_rel_err, cl->atol, cl->rtol, ratio);
    else
        item_text(it,
                  "max |x - r| = %g > atol %g and max rel = %g > rtol %g; without the per-element "
                  "ratio the combined bound cannot be shown to hold",
                  ev->max_abs_err, cl->atol, ev->max_rel_err, cl->rtol);
}

static void check_divergence(const px_contract_clause *cl, const px_contract_evidence *ev,
                             px_contract_check_item *it)
{
    it->bound = cl->kl_max;
    if (!(ev->measured & PX_CONTRACT_DIVERGENCE)) {
        item_text(it, "not measured");
        return;
    }
    it->measured = true;
    it->value = ev->kl;
    if (isnan(ev->kl)) {
        item_text(it, "the measured KL divergence is not a number");
        return;
    }
    it->margin = cl->kl_max - ev->kl;
    it->pass = ev->kl <= cl->kl_max;
    item_text(it, "KL %g nats %s kl_max %g (margin %g)", ev->kl, it->pass ? "<=" : ">", cl->kl_max,
              it->margin);
}

static void check_agreement(const px_contract_clause *cl, const px_contract_evidence *ev,
                            px_contract_check_item *it)
{
    it->bound = cl->top1_min;
    if (!(ev->measured & PX_CONTRACT_AGREEMENT)) {
        item_text(it, "not measured");
        return;
    }
    it->measured = true;
    it->value = ev->top1;
    if (isnan(ev->top1) || ev->top1 < 0 || ev->top1 > 1) {
        item_text(it, "the measured agreement %g is not a fraction in [0, 1]", ev->top1);
        return;
    }
    it->margin = ev->top1 - cl->top1_min;
    if (cl->positions && ev->positions < cl->positions) {
        item_text(it, "measured over %" PRIu64 " positions; the clause requires %" PRIu64,
                  ev->positions, cl->positions);
        return;
    }
    it->pass = ev->top1 >= cl->top1_min;
    item_text(it, "top-1 agreement %g %s top1_min %g (margin %g)", ev->top1, it->pass ? ">=" : "<",
              cl->top1_min, it->margin);
}

void px_contract_check_evidence(const px_contract_clause *cl, const px_contract_evidence *ev,
                                px_contract_check *out)
{
    memset(out, 0, sizeof *out);
    out->pass = true;
    for (int i = 0; i < PX_CONTRACT_REQ_COUNT; i++) {
        px_contract_req req = (px_contract_req)(1u << i);
        if (!(cl->reqs & req))
            continue;
        px_contract_check_item *it = &out->items[out->n_items++];
        it->req = req;
        switch (req) {
        case PX_CONTRACT_BITWISE:
            check_flag(it, ev->measured & PX_CONTRACT_BITWISE, ev->bitwise_equal,
                       "outputs are bit-identical to the reference",
                       "outputs differ from the reference");
            break;
        case PX_CONTRACT_DETERMINISTIC:
            check_flag(it, ev->measured & PX_CONTRACT_DETERMINISTIC, ev->replay_equal,
                       "two runs with the same inputs and seed gave the same bits",
                       "two runs with the same inputs and seed differed");
            break;
        case PX_CONTRACT_TOLERANCE:
            check_tolerance(cl, ev, it);
            break;
        case PX_CONTRACT_DIVERGENCE:
            check_divergence(cl, ev, it);
            break;
        case PX_CONTRACT_AGREEMENT:
            check_agreement(cl, ev, it);
            break;
        case PX_CONTRACT_EXACT_LOGITS:
            check_flag(it, ev->measured & PX_CONTRACT_EXACT_LOGITS, ev->exact_logits_equal,
                       "logits equal the reference's on every listed path",
                       "logits differ from the reference's on a listed path");
            break;
        }
        if (!it->pass)
            out->pass = false;
    }
}
