/* The canary: a change's first steps against its prediction. */
#include "base/common.h"

#include "heal/heal_impl.h"

#define CANARY_MAX ((uint32_t)PX_ARRAY_LEN(((px_heal_canary *)0)->samples))

void px_heal_canary_begin(px_heal_canary *c, double pred_p50_s, double pred_hi_s, uint32_t need,
                          double tolerance)
{
    memset(c, 0, sizeof *c);
    c->pred_p50_s = pred_p50_s;
    c->pred_hi_s = pred_hi_s;
    c->need = need < 1 ? 1 : need > CANARY_MAX ? CANARY_MAX : need;
    c->tolerance = tolerance > 0 && isfinite(tolerance) ? tolerance : 1;
}

/* The last `need` observations, kept in a ring of CANARY_MAX. */
double px_heal_canary_median(const px_heal_canary *c)
{
    uint32_t n = PX_MIN(c->seen, c->need);
    double last[CANARY_MAX];
    for (uint32_t k = 0; k < n; k++)
        last[k] = c->samples[(c->seen - n + k) % CANARY_MAX];
    return px__heal_median(last, n);
}

px_heal_canary_verdict px_heal_canary_observe(px_heal_canary *c, double observed_s)
{
    if (isfinite(observed_s)) {
        c->samples[c->seen % CANARY_MAX] = observed_s;
        c->seen++;
    }
    if (c->seen < c->need)
        return PX_HEAL_CANARY_PENDING;
    double limit = isfinite(c->pred_hi_s) && c->pred_hi_s > 0     ? c->pred_hi_s
                   : isfinite(c->pred_p50_s) && c->pred_p50_s > 0 ? c->pred_p50_s
                                                                  : NAN;
    if (!isfinite(limit))
        return PX_HEAL_CANARY_PASS;
    return px_heal_canary_median(c) <= limit * c->tolerance ? PX_HEAL_CANARY_PASS
                                                            : PX_HEAL_CANARY_FAIL;
}
