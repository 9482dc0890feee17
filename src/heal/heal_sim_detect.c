/* Detection in the simulator from what an operator could observe:
 * heartbeats that stop, step and transfer times that depart from the
 * run's own baseline, temperatures heading for a device's limit.  Each
 * departure becomes a trigger (JSON: the observation window and the
 * thresholds), and the trigger is classified by a pure function so that
 * replay recomputes the class and the locus from what was recorded. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

/* ---- pure parts: the thermal fit, classification, the choice ---- */

void px__hs_thermal_fit(const double *t, const double *temp, uint32_t n, double tau, double limit,
                        double *t_ss, double *t_hit)
{
    *t_ss = NAN;
    *t_hit = INFINITY;
    if (n < 2 || !(tau > 0))
        return;
    /* T(t1) = T_ss + (T(t0) - T_ss) e^(-dt/tau), solved for T_ss, over
     * the widest span (the samples' end points) to damp the ripple of
     * steps starting and ending. */
    double dt = t[n - 1] - t[0];
    if (!(dt > 0))
        return;
    double e = exp(-dt / tau);
    double ss = (temp[n - 1] - temp[0] * e) / (1 - e);
    *t_ss = ss;
    double now = temp[n - 1];
    if (now >= limit)
        *t_hit = 0;
    else if (ss > limit)
        *t_hit = tau * log((ss - now) / (ss - limit));
}

static double num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void locus_stage(const json_t *tr, px_heal_locus_kind kind, px_heal_locus *where)
{
    where->kind = kind;
    where->stage = (uint32_t)json_integer_value(json_object_get(tr, "stage"));
    where->to = (uint32_t)json_integer_value(json_object_get(tr, "to"));
    px_strlcpy(where->device, str(tr, kind == PX_HEAL_AT_LINK ? "hop" : "device"),
               sizeof where->device);
}

/* Whether the last `confirm` values of the window lie above limit, and
 * how often the window crossed it. */
static bool departs(const json_t *window, double limit, uint32_t confirm, uint32_t *crossings,
                    double *last)
{
    size_t n = json_array_size(window);
    *crossings = 0;
    *last = NAN;
    if (n < confirm || confirm == 0)
        return false;
    bool prev = false;
    for (size_t i = 0; i < n; i++) {
        double v = json_number_value(json_array_get(json_array_get(window, i), 1));
        bool above = v > limit;
        if (i && above != prev)
            (*crossings)++;
        prev = above;
        *last = v;
    }
    for (size_t i = n - confirm; i < n; i++)
        if (!(json_number_value(json_array_get(json_array_get(window, i), 1)) > limit))
            return false;
    return true;
}

static void classify_heartbeat(const json_t *tr, px_heal_fault_class *cls, px_heal_locus *where,
                               char *evidence, size_t cap)
{
    double now = num(tr, "now"), timeout = num(tr, "timeout_s");
    const json_t *hb = json_object_get(tr, "heartbeats");
    const json_t *known = json_object_get(tr, "known_lost");
    const json_t *in_plan = json_object_get(tr, "plan_devices");
    const char *first = NULL;
    size_t n_silent = 0;
    const char *id;
    const json_t *v;
    json_object_foreach((json_t *)in_plan, id, v)
    {
        double t = num(hb, id);
        bool was = false;
        size_t k;
        const json_t *x;
        json_array_foreach(known, k, x) was |=
            !strcmp(json_string_value(x) ? json_string_value(x) : "", id);
        if (!was && isfinite(t) && now - t >= timeout) {
            n_silent++;
            if (!first)
                first = id;
        }
    }
    if (!first)
        return;
    /* A failure domain whose members all went silent together, the
     * smallest one holding the first silent device.  Domains nested with
     * the same members (a rack with one power feed) cannot be told apart
     * by what is observed: the outermost is named, as the wider cause,
     * and the evidence names the inner one too. */
    size_t i, best_n = SIZE_MAX;
    const json_t *dom, *best = NULL, *inner = NULL;
    json_array_foreach(json_object_get(tr, "domains"), i, dom)
    {
        const json_t *members = json_object_get(dom, "members");
        size_t n = json_array_size(members), k;
        if (n < 2 || n > best_n)
            continue;
        bool all = true, holds = false;
        const json_t *m;
        json_array_foreach(members, k, m)
        {
            const char *mid = json_string_value(m) ? json_string_value(m) : "";
            double t = num(hb, mid);
            all &= isfinite(t) && now - t >= timeout;
            holds |= !strcmp(mid, first);
        }
        if (!all || !holds)
            continue;
        if (n == best_n) {
            /* The same size and all silent: the same members.  Keep the
             * enclosing one. */
            if (!strcmp(str(best, "parent"), str(dom, "id"))) {
                inner = best;
                best = dom;
            } else if (!strcmp(str(dom, "parent"), str(best, "id"))) {
                inner = dom;
            }
            continue;
        }
        best = dom;
        best_n = n;
        inner = NULL;
    }
    if (best) {
        *cls = PX_HEAL_DOMAIN_LOSS;
        where->kind = PX_HEAL_AT_DOMAIN;
        px_strlcpy(where->device, str(best, "id"), sizeof where->device);
        char within[160] = "";
        if (inner)
            snprintf(within, sizeof within, " (%s within it holds the same devices)",
                     str(inner, "id"));
        snprintf(evidence, cap,
                 "every one of the %zu devices of failure domain %s%s stopped answering "
                 "heartbeats (silent for %.3g s or more at t=%.3f s)",
                 best_n, where->device, within, timeout, now);
        return;
    }
    *cls = PX_HEAL_DEVICE_LOSS;
    where->kind = PX_HEAL_AT_DEVICE;
    where->stage = (uint32_t)json_integer_value(json_object_get(in_plan, first));
    px_strlcpy(where->device, first, sizeof where->device);
    snprintf(evidence, cap,
             "%s (stage %u) stopped answering heartbeats: silent for %.3g s at t=%.3f s "
             "(timeout %.3g s)%s",
             first, where->stage, now - num(hb, first), now, timeout,
             n_silent > 1 ? "; other devices of the plan are silent too" : "");
}

void px__hs_classify(const json_t *tr, px_heal_fault_class *cls, px_heal_locus *where,
                     bool *intermittent, char *evidence, size_t cap)
{
    *cls = PX_HEAL_NONE;
    memset(where, 0, sizeof *where);
    *intermittent = false;
    snprintf(evidence, cap, "nothing departs");
    const char *sig = str(tr, "signal");
    if (!strcmp(sig, "heartbeat")) {
        classify_heartbeat(tr, cls, where, evidence, cap);
        return;
    }
    if (!strcmp(sig, "transfer") || !strcmp(sig, "step")) {
        bool xfer = sig[0] == 't';
        double base = num(tr, "baseline"), ratio = num(tr, "ratio");
        uint32_t confirm = (uint32_t)json_integer_value(json_object_get(tr, "confirm"));
        uint32_t crossings;
        double last;
        if (!(base > 0) ||
            !departs(json_object_get(tr, "window"), base * ratio, confirm, &crossings, &last))
            return;
        *intermittent = crossings >= 2;
        if (xfer) {
            *cls = json_is_true(json_object_get(tr, "shared")) ? PX_HEAL_INTERFERENCE
                                                               : PX_HEAL_LINK_DEGRADE;
            locus_stage(tr, PX_HEAL_AT_LINK, where);
            snprintf(evidence, cap,
                     "transfers on hop %s (stage %u to %u, %s) took %.3gx the plan's time, "
                     "against a baseline of %.3gx, for %u ticks%s%s",
                     where->device, where->stage, where->to, str(tr, "link"), last, base, confirm,
                     *intermittent ? "; the departures come and go" : "",
                     *cls == PX_HEAL_INTERFERENCE
                         ? "; the hop crosses a contention domain other traffic shares, "
                           "while the stages' compute keeps its pace"
                         : "");
        } else {
            *cls = PX_HEAL_THERMAL;
            locus_stage(tr, PX_HEAL_AT_COMPUTE, where);
            snprintf(evidence, cap,
                     "steps of stage %u (%s) took %.3gx the plan's time against a baseline "
                     "of %.3gx, for %u ticks, while its transfers kept their pace",
                     where->stage, where->device, last, base, confirm);
        }
        return;
    }
    if (!strcmp(sig, "temperature")) {
        const json_t *samples = json_object_get(tr, "samples");
        uint32_t n = (uint32_t)json_array_size(samples);
        double t[PX__HS_TEMPS], temp[PX__HS_TEMPS];
        if (n > PX__HS_TEMPS)
            n = PX__HS_TEMPS;
        for (uint32_t i = 0; i < n; i++) {
            t[i] = json_number_value(json_array_get(json_array_get(samples, i), 0));
            temp[i] = json_number_value(json_array_get(json_array_get(samples, i), 1));
        }
        double limit = num(tr, "limit_k") - num(tr, "margin_k"), ss, hit;
        px__hs_thermal_fit(t, temp, n, num(tr, "tau_s"), limit, &ss, &hit);
        if (!(ss > limit) || !(hit <= num(tr, "horizon_s")))
            return;
        *cls = PX_HEAL_THERMAL;
        locus_stage(tr, PX_HEAL_AT_COMPUTE, where);
        snprintf(evidence, cap,
                 "%s heats toward %.1f K (time constant %.3g s), over its limit of %.1f K: "
                 "at %.1f K now, it would reach the limit (less a %.3g K margin) in %.3g s",
                 where->device, ss, num(tr, "tau_s"), num(tr, "limit_k"), temp[n - 1],
                 num(tr, "margin_k"), hit);
        return;
    }
    if (!strcmp(sig, "throttle")) {
        if (!json_is_true(json_object_get(tr, "throttled")))
            return;
        *cls = PX_HEAL_THERMAL;
        locus_stage(tr, PX_HEAL_AT_COMPUTE, where);
        snprintf(evidence, cap, "%s throttles: its clock is held at %.3g of full by heat",
                 where->device, num(tr, "clock"));
    }
}

int px__hs_choose(const json_t *cands, const char *hot, double slo, char (*codes)[32],
                  size_t n_codes)
{
    int best = -1;
    double best_margin = -INFINITY, best_p99 = INFINITY;
    size_t i;
    const json_t *c;
    json_array_foreach(cands, i, c)
    {
        bool accepted = json_is_true(json_object_get(c, "accepted"));
        const char *code = accepted ? "" : str(c, "reject_code");
        if (accepted && hot && hot[0]) {
            size_t k;
            const json_t *d;
            json_array_foreach(json_object_get(c, "devices"), k, d)
            {
                if (json_string_value(d) && !strcmp(json_string_value(d), hot)) {
                    accepted = false;
                    code = "unstable";
                }
            }
        }
        if (i < n_codes)
            px_strlcpy(codes[i], code[0] || accepted ? code : "rejected", sizeof codes[i]);
        if (!accepted)
            continue;
        double p99 = num(c, "tpot_p99_s");
        double margin = slo > 0 ? (slo - p99) / slo : 0;
        if (margin > best_margin || (margin == best_margin && p99 < best_p99)) {
            best = (int)i;
            best_margin = margin;
            best_p99 = p99;
        }
    }
    return best;
}

/* ---- the live side: windows, baselines and triggers ---- */

static void ring_push(px__hs_ring *r, double t, double v)
{
    if (r->n == PX__HS_WINDOW) {
        memmove(r->t, r->t + 1, (PX__HS_WINDOW - 1) * sizeof *r->t);
        memmove(r->v, r->v + 1, (PX__HS_WINDOW - 1) * sizeof *r->v);
        r->n--;
    }
    r->t[r->n] = t;
    r->v[r->n] = v;
    r->n++;
}

static json_t *ring_json(const px__hs_ring *r)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < r->n; i++)
        json_array_append_new(a, json_pack("[f, f]", r->t[i], r->v[i]));
    return a;
}

void px__hs_observe(px_heal_sim *h, const px_sim_obs *obs)
{
    px__hs_base *b = &h->base[h->active];
    uint32_t ns = obs->n_stages < PX__HS_MAX_STAGES ? obs->n_stages : PX__HS_MAX_STAGES;
    for (uint32_t i = 0; i < ns; i++) {
        const px_sim_obs_stage *st = &obs->stages[i];
        if (st->n_steps && isfinite(st->step_ratio_p50)) {
            ring_push(&h->step_win[i], obs->t, st->step_ratio_p50);
            if (b->n_step[i] < h->o.baseline_ticks && b->n_step[i] < 8)
                b->step[i][b->n_step[i]++] = st->step_ratio_p50;
        }
        if (st->n_xfers && isfinite(st->xfer_ratio_p50)) {
            ring_push(&h->xfer_win[i], obs->t, st->xfer_ratio_p50);
            if (b->n_xfer[i] < h->o.baseline_ticks && b->n_xfer[i] < 8)
                b->xfer[i][b->n_xfer[i]++] = st->xfer_ratio_p50;
        }
    }
    for (uint32_t d = 0; d < obs->n_devices && d < h->n_devices; d++) {
        uint32_t n = h->n_temp[d];
        double *tt = &h->temp_t[d * PX__HS_TEMPS], *tk = &h->temp_k[d * PX__HS_TEMPS],
               *pw = &h->power_w[d * PX__HS_TEMPS];
        if (n == PX__HS_TEMPS) {
            memmove(tt, tt + 1, (PX__HS_TEMPS - 1) * sizeof *tt);
            memmove(tk, tk + 1, (PX__HS_TEMPS - 1) * sizeof *tk);
            memmove(pw, pw + 1, (PX__HS_TEMPS - 1) * sizeof *pw);
            n--;
        }
        tt[n] = obs->t;
        tk[n] = obs->devices[d].temp_k;
        pw[n] = obs->devices[d].power_w;
        h->n_temp[d] = n + 1;
    }
}

static json_t *heartbeat_trigger(px_heal_sim *h, const px_sim_obs *obs, bool *any)
{
    const px_sim_plan *p = &h->plans[h->active]->sim;
    *any = false;
    for (uint32_t d = 0; d < obs->n_devices; d++)
        if (!h->lost[d] && obs->t - obs->devices[d].last_heartbeat_t >= h->o.heartbeat_timeout_s &&
            px__hs_plan_uses(p, d))
            *any = true;
    if (!*any)
        return NULL;
    json_t *hb = json_object(), *known = json_array(), *in_plan = json_object(),
           *domains = json_array();
    for (uint32_t d = 0; d < obs->n_devices; d++) {
        json_object_set_new(hb, p->devices[d].id, json_real(obs->devices[d].last_heartbeat_t));
        if (h->lost[d])
            json_array_append_new(known, json_string(p->devices[d].id));
    }
    for (size_t r = 0; r < p->n_replicas; r++)
        for (uint32_t i = 0; i < p->replicas[r].n_stages; i++)
            for (uint32_t j = 0; j < p->replicas[r].stages[i].n_devices; j++)
                json_object_set_new(in_plan, p->devices[p->replicas[r].stages[i].devices[j]].id,
                                    json_integer(i));
    for (size_t k = 0; k < p->n_domains; k++) {
        json_t *members = json_array();
        for (size_t d = 0; d < p->n_devices; d++)
            for (uint32_t m = 0; m < p->devices[d].n_domains; m++)
                if (p->devices[d].domains[m] == k)
                    json_array_append_new(members, json_string(p->devices[d].id));
        json_array_append_new(domains,
                              json_pack("{s:s, s:s, s:o}", "id", p->domains[k].id, "parent",
                                        p->domains[k].parent, "members", members));
    }
    /* Every silent device is known lost from now on, reported once. */
    for (uint32_t d = 0; d < obs->n_devices; d++)
        if (obs->t - obs->devices[d].last_heartbeat_t >= h->o.heartbeat_timeout_s)
            h->lost[d] = true;
    return json_pack("{s:s, s:f, s:f, s:o, s:o, s:o, s:o}", "signal", "heartbeat", "now", obs->t,
                     "timeout_s", h->o.heartbeat_timeout_s, "heartbeats", hb, "known_lost", known,
                     "plan_devices", in_plan, "domains", domains);
}

/* The stage of the running plan a device serves, or -1. */
static int stage_of(const px_sim_plan *p, uint32_t d, uint32_t *replica)
{
    for (size_t r = 0; r < p->n_replicas; r++)
        for (uint32_t i = 0; i < p->replicas[r].n_stages; i++)
            for (uint32_t j = 0; j < p->replicas[r].stages[i].n_devices; j++)
                if (p->replicas[r].stages[i].devices[j] == d) {
                    *replica = (uint32_t)r;
                    return (int)i;
                }
    return -1;
}

/* The device's thermal resistance: its own, or the one the simulator
 * assumes (docs/formats/faults.md: the steady state at full power 10 K
 * under the limit at 25 C ambient). */
static double thermal_r(const px_sim_device *d)
{
    if (d->thermal_r_k_per_w > 0)
        return d->thermal_r_k_per_w;
    double span = d->thermal_limit_k - 10.0 - 298.15;
    return d->power_active_w > 0 && span > 0 ? span / d->power_active_w : 0.1;
}

static json_t *thermal_trigger(px_heal_sim *h, const px_sim_obs *obs)
{
    const px_sim_plan *p = &h->plans[h->active]->sim;
    for (uint32_t d = 0; d < obs->n_devices && d < h->n_devices; d++) {
        const px_sim_device *dev = &p->devices[d];
        uint32_t replica;
        int stage;
        if (h->hot[d] || h->lost[d] || !(dev->thermal_limit_k > 0 && dev->thermal_tau_s > 0) ||
            (stage = stage_of(p, d, &replica)) < 0)
            continue;
        if (!h->o.thermal_predictive) {
            if (!obs->devices[d].throttled)
                continue;
            h->hot[d] = true;
            return json_pack("{s:s, s:b, s:f, s:s, s:i, s:i}", "signal", "throttle", "throttled", 1,
                             "clock", obs->devices[d].clock, "device", dev->id, "stage", stage,
                             "replica", replica);
        }
        uint32_t n = h->n_temp[d];
        const double *tt = &h->temp_t[d * PX__HS_TEMPS], *tk = &h->temp_k[d * PX__HS_TEMPS];
        if (n < PX__HS_TEMPS)
            continue;
        double limit = dev->thermal_limit_k - h->o.thermal_margin_k, ss, hit;
        px__hs_thermal_fit(tt, tk, n, dev->thermal_tau_s, limit, &ss, &hit);
        if (!(ss > limit) || !(hit <= h->o.thermal_horizon_s))
            continue;
        h->hot[d] = true;
        json_t *samples = json_array();
        double pw = 0;
        for (uint32_t i = 0; i < n; i++) {
            json_array_append_new(samples, json_pack("[f, f]", tt[i], tk[i]));
            pw += h->power_w[d * PX__HS_TEMPS + i] / n;
        }
        return json_pack("{s:s, s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:i, s:i}", "signal",
                         "temperature", "samples", samples, "tau_s", dev->thermal_tau_s, "limit_k",
                         dev->thermal_limit_k, "margin_k", h->o.thermal_margin_k, "horizon_s",
                         h->o.thermal_horizon_s, "power_w", pw, "r_k_per_w", thermal_r(dev),
                         "device", dev->id, "stage", stage, "replica", replica);
    }
    return NULL;
}

static double base_median(const double *v, uint32_t n)
{
    return px__heal_median(v, n);
}

/* The stage of obs index i: its device (of a tensor-parallel stage, the
 * one whose clock is lowest now: what slows the stage) and, for a hop,
 * the next stage's. */
static void stage_ids(const px_sim_plan *p, const px_sim_obs *obs, const px_sim_obs_stage *st,
                      const char **dev, const char **next)
{
    const px_sim_stage *s = &p->replicas[st->replica].stages[st->stage];
    uint32_t pick = s->devices[0];
    for (uint32_t j = 1; j < s->n_devices; j++)
        if (s->devices[j] < obs->n_devices &&
            obs->devices[s->devices[j]].clock < obs->devices[pick].clock)
            pick = s->devices[j];
    *dev = p->devices[pick].id;
    *next = st->stage + 1 < p->replicas[st->replica].n_stages
                ? p->devices[p->replicas[st->replica].stages[st->stage + 1].devices[0]].id
                : "";
}

static json_t *departure_trigger(px_heal_sim *h, const px_sim_obs *obs)
{
    const px_sim_plan *p = &h->plans[h->active]->sim;
    const px__hs_base *b = &h->base[h->active];
    uint32_t ns = obs->n_stages < PX__HS_MAX_STAGES ? obs->n_stages : PX__HS_MAX_STAGES;
    for (int pass = 0; pass < 2; pass++) {
        bool xfer = pass == 0; /* a slow hop first: it slows the stages after it too */
        for (uint32_t i = 0; i < ns; i++) {
            const px_sim_obs_stage *st = &obs->stages[i];
            uint32_t nb = xfer ? b->n_xfer[i] : b->n_step[i];
            uint32_t fresh = xfer ? st->n_xfers : st->n_steps;
            if (nb < h->o.baseline_ticks || !fresh)
                continue;
            double base = base_median(xfer ? b->xfer[i] : b->step[i], nb);
            const px__hs_ring *w = xfer ? &h->xfer_win[i] : &h->step_win[i];
            uint32_t *dep = xfer ? &h->xfer_dep[i] : &h->step_dep[i];
            double v = w->v[w->n - 1];
            if (v > base * h->o.ratio)
                (*dep)++;
            else
                *dep = 0;
            if (*dep != h->o.confirm)
                continue; /* once per onset: the counter passes confirm once */
            const char *dev, *next;
            stage_ids(p, obs, st, &dev, &next);
            char hop[2 * PX_SIM_ID_LEN + 2];
            snprintf(hop, sizeof hop, "%s>%s", dev, next);
            const char *link = xfer && st->link < p->n_links ? p->links[st->link].id : "";
            return json_pack("{s:s, s:o, s:f, s:f, s:i, s:i, s:i, s:i, s:s, s:s, s:s, s:b}",
                             "signal", xfer ? "transfer" : "step", "window", ring_json(w),
                             "baseline", base, "ratio", h->o.ratio, "confirm", h->o.confirm,
                             "stage", st->stage, "to", st->stage + 1, "replica", st->replica,
                             "device", dev, "hop", xfer ? hop : "", "link", link, "shared",
                             xfer && !strncmp(link, "contention:", 11));
        }
    }
    return NULL;
}

json_t *px__hs_detect(px_heal_sim *h, const px_sim_obs *obs)
{
    bool any;
    json_t *tr = heartbeat_trigger(h, obs, &any);
    if (tr || any)
        return tr;
    if (h->phase != PX__HS_NORMAL)
        return NULL;
    if ((tr = thermal_trigger(h, obs)) != NULL)
        return tr;
    return departure_trigger(h, obs);
}
