/* Acting in the simulator: a trigger becomes a finding (classified and
 * localized), its candidates are planned and validated under the
 * conditions observed, the choice goes to the engine (a plan switch after
 * the switch time, or pacing), the new plan is canaried and rolled back
 * when it departs, and an adaptation to a slow link is reverted through
 * hysteresis when the link's probes show it healed. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

/* ---- the conditions observed, as faults for the validation ---- */

static void add_fault(px_sim_faults *f, size_t cap, px_sim_fault x)
{
    if (f->n < cap)
        f->items[f->n++] = x;
}

static const json_t *trig_get(const json_t *tr, const char *k)
{
    return json_object_get(tr, k);
}

/* The faults that reproduce what was observed, for px_heal_validate. */
static void conditions(px_heal_sim *h, px_heal_fault_class cls, const px_heal_locus *where,
                       const json_t *tr, px_sim_faults *f, size_t cap)
{
    const px_sim_plan *p = &h->plans[0]->sim;
    f->n = 0;
    for (uint32_t i = 0; i < h->n_known; i++)
        add_fault(f, cap, h->known[i]);
    for (size_t d = 0; d < h->n_devices; d++)
        if (h->lost[d]) {
            px_sim_fault x = {.kind = PX_SIM_FAULT_DEVICE_LOSS};
            px_strlcpy(x.target, p->devices[d].id, sizeof x.target);
            add_fault(f, cap, x);
        }
    if (cls == PX_HEAL_LINK_DEGRADE || cls == PX_HEAL_INTERFERENCE) {
        /* The extra time per transfer, as latency: what the hop costs now. */
        double base = json_number_value(trig_get(tr, "baseline"));
        const json_t *w = trig_get(tr, "window");
        double last =
            json_number_value(json_array_get(json_array_get(w, json_array_size(w) - 1), 1));
        const px_sim_plan *cur = &h->plans[h->active]->sim;
        uint32_t r = (uint32_t)json_integer_value(trig_get(tr, "replica"));
        if (r < cur->n_replicas && where->stage + 1 < cur->replicas[r].n_stages) {
            const px_sim_stage *s = &cur->replicas[r].stages[where->stage];
            double pred = s->xfer_latency_s;
            if (s->link < cur->n_links && cur->links[s->link].bandwidth > 0)
                pred += s->xfer_bytes / cur->links[s->link].bandwidth;
            px_sim_fault x = {.kind = PX_SIM_FAULT_LINK_DEGRADE,
                              .latency_s = last > base ? (last - base) * pred : 0,
                              .bandwidth_factor = 1};
            px_strlcpy(x.target, where->device, sizeof x.target);
            add_fault(f, cap, x);
        }
    } else if (cls == PX_HEAL_THERMAL) {
        uint32_t d = PX_SIM_NONE;
        for (size_t i = 0; i < p->n_devices; i++)
            if (!strcmp(p->devices[i].id, where->device))
                d = (uint32_t)i;
        const char *sig = json_string_value(trig_get(tr, "signal"));
        if (d != PX_SIM_NONE && sig && !strcmp(sig, "temperature")) {
            /* The ambient that explains the steady state the device heads
             * for at the power it draws. */
            const json_t *samples = trig_get(tr, "samples");
            uint32_t n = (uint32_t)json_array_size(samples);
            double t[PX__HS_TEMPS], k[PX__HS_TEMPS], ss, hit;
            for (uint32_t i = 0; i < n && i < PX__HS_TEMPS; i++) {
                t[i] = json_number_value(json_array_get(json_array_get(samples, i), 0));
                k[i] = json_number_value(json_array_get(json_array_get(samples, i), 1));
            }
            px__hs_thermal_fit(t, k, n < PX__HS_TEMPS ? n : PX__HS_TEMPS,
                               json_number_value(trig_get(tr, "tau_s")), INFINITY, &ss, &hit);
            double amb = ss - json_number_value(trig_get(tr, "power_w")) *
                                  json_number_value(trig_get(tr, "r_k_per_w"));
            if (isfinite(amb) && amb > 173 && amb < 473) {
                px_sim_fault x = {.kind = PX_SIM_FAULT_THERMAL, .ambient_k = amb};
                px_strlcpy(x.target, where->device, sizeof x.target);
                add_fault(f, cap, x);
            }
        } else if (d != PX_SIM_NONE && sig && !strcmp(sig, "step")) {
            /* A stage computing k times slower: a clock held at 1/k. */
            const px_sim_device *dev = &p->devices[d];
            const json_t *w = trig_get(tr, "window");
            double last =
                json_number_value(json_array_get(json_array_get(w, json_array_size(w) - 1), 1));
            double base = json_number_value(trig_get(tr, "baseline"));
            double k = base > 0 ? last / base : 1;
            if (k > 1 && dev->power_active_w > dev->power_idle_w) {
                px_sim_fault x = {.kind = PX_SIM_FAULT_POWER_CAP,
                                  .power_limit_w = dev->power_idle_w +
                                                   (dev->power_active_w - dev->power_idle_w) / k};
                px_strlcpy(x.target, where->device, sizeof x.target);
                add_fault(f, cap, x);
            }
        }
    }
}

/* ---- candidates, cached by what determines them ---- */

static const px__hs_cached *candidates(px_heal_sim *h, px_heal_fault_class cls,
                                       const px_heal_locus *where, const px_sim_faults *cond,
                                       px_err *err)
{
    const px_sim_plan *p = &h->plans[0]->sim;
    px_strbuf key = PX_STRBUF_INIT;
    px_strbuf_addf(&key, "%s|%s|%d|%u|%u|%s", px_heal_fault_class_name(cls), where->device,
                   (int)where->kind, where->stage, where->to,
                   json_string_value(json_object_get(h->plans[h->active]->doc, "id")));
    const char *lost[256];
    size_t n_lost = 0;
    for (size_t d = 0; d < h->n_devices; d++)
        if (h->lost[d] && n_lost < PX_ARRAY_LEN(lost)) {
            lost[n_lost++] = p->devices[d].id;
            px_strbuf_addf(&key, "|%s", p->devices[d].id);
        }
    /* Conditions rounded to two digits: the same fault seen twice plans
     * the same way. */
    for (size_t i = 0; i < cond->n; i++)
        px_strbuf_addf(&key, "|%d:%s:%.2g:%.2g:%.2g", (int)cond->items[i].kind,
                       cond->items[i].target, cond->items[i].latency_s, cond->items[i].ambient_k,
                       cond->items[i].power_limit_w);
    if (!key.buf) {
        px_err_set(err, PX_ENOMEM, "heal: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < h->n_cache; i++)
        if (!strcmp(h->cache[i].key, key.buf)) {
            px_strbuf_release(&key);
            return &h->cache[i];
        }
    if (h->n_cache == h->cap_cache) {
        size_t c = h->cap_cache ? 2 * h->cap_cache : 16;
        px__hs_cached *a = realloc(h->cache, c * sizeof *a);
        if (!a) {
            px_strbuf_release(&key);
            px_err_set(err, PX_ENOMEM, "heal: out of memory");
            return NULL;
        }
        h->cache = a;
        h->cap_cache = c;
    }
    px_heal_context ctx = h->o.ctx;
    ctx.current_plan = h->plans[h->active]->doc;
    px__hs_cached *e = &h->cache[h->n_cache];
    memset(e, 0, sizeof *e);
    e->chosen = -1;
    px_status st =
        px_heal_candidates(&ctx, ctx.current_plan, cls, where, lost, n_lost, &e->c, &e->n, err);
    if (st == PX_OK)
        st = px_heal_validate(&ctx, e->c, e->n, cond, &e->chosen, err);
    if (st != PX_OK) {
        px_heal_candidates_free(e->c, e->n);
        px_strbuf_release(&key);
        return NULL;
    }
    e->key = px_strbuf_detach(&key, NULL);
    h->n_cache++;
    return e;
}

/* The devices a candidate runs on: its plan's, or the current plan's. */
static json_t *devices_json(const px_heal_sim *h, const px_heal_candidate *c)
{
    json_t *a = json_array();
    const json_t *doc = c->plan ? c->plan : h->plans[h->active]->doc;
    size_t i, k;
    const json_t *st, *d;
    json_array_foreach(json_object_get(doc, "stages"), i, st)
    {
        json_array_foreach(json_object_get(st, "devices"), k, d) json_array_append(a, (json_t *)d);
    }
    return a;
}

static json_t *candidates_json(const px_heal_sim *h, const px_heal_candidate *c, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        json_t *o = px_heal_candidate_to_json(&c[i]);
        if (o)
            px_json_set(o, "devices", devices_json(h, &c[i]));
        json_array_append_new(a, o);
    }
    return a;
}

/* Marks the candidates the heat rule rejected in the recorded array. */
static void apply_codes(json_t *cands, char (*codes)[32], const char *hot)
{
    size_t i;
    json_t *c;
    json_array_foreach(cands, i, c)
    {
        if (strcmp(codes[i], "unstable") || !json_is_true(json_object_get(c, "accepted")))
            continue;
        char why[256];
        snprintf(why, sizeof why,
                 "it keeps %s busy, and at the power it draws the device heads past its "
                 "thermal limit",
                 hot);
        px_json_set(c, "accepted", json_false());
        px_json_set(c, "reject_code", json_string("unstable"));
        px_json_set(c, "reject_reason", json_string(why));
    }
}

/* ---- switching ---- */

static void switch_to(px_heal_sim *h, size_t k, bool rollback, px_sim_action *act)
{
    act->kind = PX_SIM_ACT_SWITCH_PLAN;
    act->install = &h->plans[k]->sim;
    act->delay_s = h->o.switch_s;
    act->requeue = true;
    h->left = h->active;
    h->target = k;
    h->phase = PX__HS_SWITCHING;
    h->switch_at = h->now + h->o.switch_s;
    h->rollback_pending = rollback;
    h->sum.switches++;
    if (h->inc)
        px_json_set(h->inc, "served_at_s", json_real(h->switch_at));
}

/* Installs candidate i of the open incident.  False when its plan cannot
 * be added (recorded). */
static bool install_candidate(px_heal_sim *h, size_t i, px_sim_action *act)
{
    px_err e;
    px_err_clear(&e);
    size_t k;
    if (px__hs_add_plan(h, json_deep_copy(h->inc_c[i].plan), &k, &e) != PX_OK) {
        px__hs_incident_event(h, "the chosen plan cannot be installed: %s", e.msg);
        return false;
    }
    h->inc_tried[i] = true;
    if (k == h->active) {
        px__hs_incident_event(h, "%s is the plan running already", h->inc_c[i].label);
        return false;
    }
    h->inc_current = (int)i;
    switch_to(h, k, false, act);
    px__hs_incident_event(h, "switching to %s (serving from t=%.3f s)", h->inc_c[i].label,
                          h->switch_at);
    return true;
}

static bool is_link_class(const char *cls)
{
    return cls && (!strcmp(cls, "link-degrade") || !strcmp(cls, "interference"));
}

static void record_decision(px_heal_sim *h, const json_t *trigger, const json_t *cands,
                            const char *hot, px_heal_fault_class cls, const px_heal_locus *where,
                            bool intermittent, int chosen, char (*codes)[32], size_t n)
{
    if (!h->o.trace)
        return;
    json_t *code_arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(code_arr, json_string(codes[i]));
    json_t *in = json_pack("{s:i, s:f, s:O, s:O, s:s, s:f}", "replication", (int)h->replication,
                           "t_s", h->now, "trigger", trigger, "candidates", cands, "hot",
                           hot ? hot : "", "slo_tpot_s", h->o.ctx.slo.tpot_s);
    json_t *out = json_pack("{s:s, s:o, s:b, s:i, s:o}", "class", px_heal_fault_class_name(cls),
                            "locus", px_heal_locus_to_json(where), "intermittent", intermittent,
                            "chosen", chosen, "codes", code_arr);
    px_err e;
    px_err_clear(&e);
    if (!in || !out ||
        px_trace_mitigation(h->o.trace, "heal-sim.decision", in, out, NULL, &e) != PX_OK) {
        if (e.code == PX_OK)
            px_err_set(&e, PX_ENOMEM, "heal: out of memory recording a decision");
        px__hs_note_error(h, &e);
    }
    json_decref(in);
    json_decref(out);
}

void px__hs_handle(px_heal_sim *h, const px_sim_obs *obs, json_t *trigger, px_sim_action *act)
{
    (void)obs;
    px_heal_fault_class cls;
    px_heal_locus where;
    bool intermittent;
    char evidence[320];
    px__hs_classify(trigger, &cls, &where, &intermittent, evidence, sizeof evidence);
    if (cls == PX_HEAL_NONE)
        return;
    h->sum.findings++;
    if (h->inc)
        px__hs_incident_close(h, "superseded by a new finding", false);
    if (h->phase == PX__HS_CANARY || h->phase == PX__HS_SWITCHING)
        h->phase = PX__HS_NORMAL;
    px__hs_incident_open(h, cls, &where, intermittent, evidence, trigger);
    if (!h->inc)
        return;
    if (!h->o.heal) {
        px__hs_incident_close(h, "not mitigated: healing is off", false);
        return;
    }
    px_sim_fault items[300];
    px_sim_faults cond = {.items = items};
    conditions(h, cls, &where, trigger, &cond, PX_ARRAY_LEN(items));
    /* What this finding adds (not a loss: those come from the heartbeats)
     * stays in force for the findings after it. */
    for (size_t i = h->n_known; i < cond.n; i++)
        if (cond.items[i].kind != PX_SIM_FAULT_DEVICE_LOSS && h->n_known < PX_ARRAY_LEN(h->known))
            h->known[h->n_known++] = cond.items[i];
    px_err e;
    px_err_clear(&e);
    const px__hs_cached *cc = candidates(h, cls, &where, &cond, &e);
    if (!cc) {
        px__hs_incident_event(h, "no candidates: %s", e.msg);
        px__hs_incident_close(h, "not mitigated: the candidates could not be planned", false);
        if (e.code == PX_ENOMEM)
            px__hs_note_error(h, &e);
        return;
    }
    const char *sig = json_string_value(json_object_get(trigger, "signal"));
    const char *hot =
        cls == PX_HEAL_THERMAL && sig && (!strcmp(sig, "temperature") || !strcmp(sig, "throttle"))
            ? where.device
            : NULL;
    json_t *cands = candidates_json(h, cc->c, cc->n);
    char(*codes)[32] = calloc(cc->n ? cc->n : 1, sizeof *codes);
    bool *tried = realloc(h->inc_tried, (cc->n ? cc->n : 1) * sizeof *tried);
    if (!cands || !codes || !tried) {
        free(codes);
        if (tried)
            h->inc_tried = tried;
        json_decref(cands);
        px__hs_note_error(h, &(px_err){.code = PX_ENOMEM, .msg = "heal: out of memory"});
        px__hs_incident_close(h, "not mitigated: out of memory", false);
        return;
    }
    h->inc_tried = tried;
    memset(tried, 0, (cc->n ? cc->n : 1) * sizeof *tried);
    int chosen = px__hs_choose(cands, hot, h->o.ctx.slo.tpot_s, codes, cc->n);
    record_decision(h, trigger, cands, hot, cls, &where, intermittent, chosen, codes, cc->n);
    apply_codes(cands, codes, hot ? hot : "");
    h->inc_c = cc->c;
    h->inc_n = cc->n;
    h->inc_current = chosen;
    const px_heal_candidate *c = chosen >= 0 ? &cc->c[chosen] : NULL;
    char why[256];
    if (c)
        snprintf(why, sizeof why,
                 "accepted, and the safest: simulated p99 time per token %.4g s, %.4g tokens/s "
                 "under the conditions observed",
                 c->tpot_p99_s, c->throughput);
    else
        snprintf(why, sizeof why, "no candidate was accepted");
    px_json_set(h->inc, "candidates", cands);
    px_json_set(h->inc, "choice",
                json_pack("{s:i, s:s, s:s, s:s}", "index", chosen, "action",
                          px_heal_action_name(c ? c->action : PX_HEAL_ACT_NONE), "label",
                          c ? c->label : "nothing chosen", "why", why));
    px_json_set(h->inc, "predicted",
                json_pack("{s:o}", "tpot_s", px__heal_num(c ? c->tpot_p50_s : NAN)));
    free(codes);
    if (!c) {
        px__hs_incident_close(h, "not mitigated: no candidate accepted", false);
        return;
    }
    if (c->action == PX_HEAL_ACT_PACE) {
        act->kind = PX_SIM_ACT_PACE;
        act->max_batch = c->max_batch;
        px__hs_incident_close(h, "mitigated: admission paced", true);
        return;
    }
    if (!c->plan) {
        px__hs_incident_close(h, "kept the plan: the fault is tolerable", true);
        return;
    }
    if (!install_candidate(h, (size_t)chosen, act)) {
        px__hs_incident_close(
            h, "not mitigated: the chosen plan runs already or cannot be installed", false);
        return;
    }
    /* An adaptation away from a slow link of the primary plan: watch the
     * link's probes to come back when it heals. */
    if (is_link_class(px_heal_fault_class_name(cls)) && h->left == 0) {
        const char *link = json_string_value(json_object_get(trigger, "link"));
        const px_sim_plan *p0 = &h->plans[0]->sim;
        for (uint32_t l = 0; link && l < p0->n_links; l++)
            if (!strcmp(p0->links[l].id, link)) {
                h->adapted = true;
                h->adapt_link = l;
                memset(&h->probe_win, 0, sizeof h->probe_win);
                px_heal_hysteresis_init(&h->hyst, h->o.ratio,
                                        h->o.hysteresis ? h->o.exit_ratio : h->o.ratio,
                                        h->o.hysteresis ? h->o.min_dwell_s : 0);
                (void)px_heal_hysteresis_update(&h->hyst, h->now, 1e300);
            }
    }
}

/* ---- the canary ---- */

void px__hs_canary_tick(px_heal_sim *h, const px_sim_obs *obs, px_sim_action *act)
{
    double worst = NAN;
    for (uint32_t i = 0; i < obs->n_stages; i++)
        if (obs->stages[i].n_steps && isfinite(obs->stages[i].step_ratio_p50) &&
            !(obs->stages[i].step_ratio_p50 <= worst))
            worst = obs->stages[i].step_ratio_p50;
    if (!isfinite(worst))
        return;
    px_heal_canary_verdict v = px_heal_canary_observe(&h->canary, worst);
    if (v == PX_HEAL_CANARY_PENDING)
        return;
    const px_heal_candidate *c = h->inc_c && h->inc_current >= 0 ? &h->inc_c[h->inc_current] : NULL;
    double pred = c ? c->tpot_p50_s : NAN;
    double med = px_heal_canary_median(&h->canary);
    if (h->inc) {
        px_json_set(h->inc, "canary",
                    json_pack("{s:i, s:o, s:o, s:s, s:f, s:f, s:f}", "steps", (int)h->canary.seen,
                              "predicted_p50_s", px__heal_num(pred), "observed_p50_s",
                              px__heal_num(pred * med), "verdict",
                              v == PX_HEAL_CANARY_PASS ? "pass" : "fail", "observed_over_predicted",
                              med, "predicted_hi_ratio", h->canary.pred_hi_s, "tolerance",
                              h->canary.tolerance));
        px_json_set(h->inc, "realized", json_pack("{s:o}", "tpot_s", px__heal_num(pred * med)));
    }
    if (v == PX_HEAL_CANARY_PASS) {
        h->sum.canaries_passed++;
        h->phase = PX__HS_NORMAL;
        px__hs_incident_event(h, "canary passed: steps at %.3gx the prediction", med);
        px__hs_incident_close(h, "mitigated", true);
        return;
    }
    h->sum.canaries_failed++;
    h->sum.rollbacks++;
    px__hs_incident_event(h,
                          "canary failed: steps at %.3gx the prediction, over %.3g x %.3g; "
                          "the planner's figures for this plan do not hold",
                          med, h->canary.pred_hi_s, h->canary.tolerance);
    /* On to the next accepted candidate with a plan, the safest first. */
    int next = -1;
    for (size_t i = 0; h->inc_c && i < h->inc_n; i++) {
        const px_heal_candidate *x = &h->inc_c[i];
        if (!x->accepted || !x->plan || h->inc_tried[i])
            continue;
        if (next < 0 || x->tpot_p99_s < h->inc_c[next].tpot_p99_s)
            next = (int)i;
    }
    size_t back = h->left;
    const char *to = json_string_value(json_object_get(h->plans[back]->doc, "id"));
    if (h->inc)
        px_json_set(h->inc, "rollback",
                    json_pack("{s:s, s:s}", "why", "the canary departed from the prediction", "to",
                              next >= 0 ? h->inc_c[next].label
                              : to      ? to
                                        : "the plan left"));
    if (next >= 0 && install_candidate(h, (size_t)next, act)) {
        h->left = back;
        return;
    }
    px__hs_incident_event(h, "rolling back to the plan left");
    switch_to(h, back, true, act);
}

/* ---- reverting an adaptation ---- */

void px__hs_adapt_tick(px_heal_sim *h, const px_sim_obs *obs, px_sim_action *act)
{
    if (!h->adapted || h->active == 0)
        return;
    const px_sim_obs_link *probe = NULL;
    for (uint32_t i = 0; i < obs->n_links; i++)
        if (obs->links[i].plan == 0 && obs->links[i].link == h->adapt_link)
            probe = &obs->links[i];
    if (!probe || !(probe->nominal_s > 0))
        return;
    double r = probe->probe_s / probe->nominal_s;
    /* The primary plan is idle now: a healthy probe shares with nothing. */
    double signal = r;
    if (h->o.hysteresis) {
        /* The worst probe of the last hold_s: a link that comes and goes
         * counts as slow until it stayed healthy that long. */
        if (h->probe_win.n == PX__HS_PROBES ||
            (h->probe_win.n && h->now - h->probe_win.t[0] > h->o.hold_s)) {
            memmove(h->probe_win.t, h->probe_win.t + 1, (h->probe_win.n - 1) * sizeof(double));
            memmove(h->probe_win.v, h->probe_win.v + 1, (h->probe_win.n - 1) * sizeof(double));
            h->probe_win.n--;
        }
        h->probe_win.t[h->probe_win.n] = h->now;
        h->probe_win.v[h->probe_win.n++] = r;
        for (uint32_t i = 0; i < h->probe_win.n; i++)
            signal = h->probe_win.v[i] > signal ? h->probe_win.v[i] : signal;
    }
    if (px_heal_hysteresis_update(&h->hyst, h->now, signal) != PX_HEAL_HYST_REVERT)
        return;
    h->adapted = false;
    h->sum.reverts++;
    /* The link healed: validations no longer assume it slow. */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < h->n_known; i++)
        if (h->known[i].kind != PX_SIM_FAULT_LINK_DEGRADE)
            h->known[kept++] = h->known[i];
    h->n_known = kept;
    switch_to(h, 0, true, act);
}
