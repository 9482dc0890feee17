/* Hysteresis: separate enter and exit thresholds and a minimum dwell, so
 * that a signal hovering around one threshold causes one change. */
#include "base/common.h"

#include "heal/heal_impl.h"

void px_heal_hysteresis_init(px_heal_hysteresis *h, double enter, double exit, double min_dwell_s)
{
    memset(h, 0, sizeof *h);
    h->enter = enter;
    h->exit = exit > enter ? enter : exit;
    h->min_dwell_s = min_dwell_s > 0 ? min_dwell_s : 0;
}

px_heal_hyst_verdict px_heal_hysteresis_update(px_heal_hysteresis *h, double t_s, double signal)
{
    if (!isfinite(signal) || !isfinite(t_s))
        return PX_HEAL_HYST_STAY;
    if (!h->adapted) {
        if (signal > h->enter) {
            h->adapted = true;
            h->last_change_s = t_s;
            h->changes++;
            return PX_HEAL_HYST_ADAPT;
        }
        return PX_HEAL_HYST_STAY;
    }
    if (signal < h->exit && t_s - h->last_change_s >= h->min_dwell_s) {
        h->adapted = false;
        h->last_change_s = t_s;
        h->changes++;
        return PX_HEAL_HYST_REVERT;
    }
    return PX_HEAL_HYST_STAY;
}
