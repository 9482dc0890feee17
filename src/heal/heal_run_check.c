/* Healing real runs: the checks of a change and of the numbers.  The
 * canary compares the first steps on a new plan with its prediction,
 * calibrated by how the plan left compared with its own, and rolls back
 * (on to the next accepted candidate, or back to the plan left when that
 * one still runs) when they depart; the audit compares a step's rows
 * with the shadow computation and, when a stage departs, plans without
 * its device and takes back the steps after the last good audit. */
#include "heal/heal_run_impl.h"

/* The canary of the change that runs now: its prediction scaled by what
 * the plan left observed against its own prediction. */
void px__hr_canary_begin(px_heal_run *h)
{
    double pred = px__hr_pred_step(&h->spec, false), hi = px__hr_pred_step(&h->spec, true);
    if (!(hi >= pred))
        hi = pred;
    double ratio = h->canary_ratio;
    h->canary_on = pred > 0 && isfinite(pred) && ratio > 0 && isfinite(ratio);
    json_decref(h->canary_samples);
    h->canary_samples = json_array();
    if (!h->canary_on) {
        px__hr_incident_event(h, "no canary: the plan left had no baseline to calibrate with");
        return;
    }
    px_heal_canary_begin(&h->canary, pred * ratio, hi * ratio, h->o.canary_steps,
                         h->o.canary_tolerance);
}

static px_status rollback(px_heal_run *h, px_rt_step_verdict *v, px_err *err, double med)
{
    h->sum.rollbacks++;
    int next = -1;
    for (size_t k = 0; k < h->n_cands && k < PX_ARRAY_LEN(h->tried); k++)
        if (h->cands[k].accepted && !h->tried[k]) {
            next = (int)k;
            break;
        }
    json_t *out = json_pack("{s:s, s:i}", "to",
                            next >= 0                        ? "next-candidate"
                            : h->prev_viable && h->prev_plan ? "previous-plan"
                                                             : "stay",
                            "candidate", next);
    if (h->o.trace && out) {
        json_t *tried = json_array();
        for (size_t k = 0; k < h->n_cands && k < PX_ARRAY_LEN(h->tried); k++)
            if (h->tried[k])
                json_array_append_new(tried, json_integer((json_int_t)k));
        json_t *inputs = json_pack("{s:s, s:s, s:o, s:b}", "mitigation", "heal.mitigation",
                                   "canary", "heal.canary", "tried", tried, "previous_viable",
                                   h->prev_viable && h->prev_plan);
        px_status st = px_trace_mitigation(h->o.trace, "heal.rollback", inputs, out, NULL, err);
        json_decref(inputs);
        if (st != PX_OK) {
            json_decref(out);
            return st;
        }
    }
    if (h->incident) {
        char why[200], a[32], b[32];
        px__heal_fmt_s(med, a, sizeof a);
        px__heal_fmt_s(h->canary.pred_hi_s * h->canary.tolerance, b, sizeof b);
        snprintf(why, sizeof why,
                 "the canary's median step took %s, above the calibrated prediction's limit %s", a,
                 b);
        px_json_set(h->incident, "rollback",
                    json_pack("{s:s, s:s}", "why", why, "to",
                              json_string_value(json_object_get(out, "to"))));
    }
    json_decref(out);
    px_rt_executor *ex = NULL;
    if (next >= 0) {
        h->chosen = next;
        px__hr_incident_event(h, "canary failed: rolling on to the next accepted candidate");
        ex = px__hr_start_choice(h, err);
    } else if (h->prev_viable && h->prev_plan) {
        px__hr_incident_event(h, "canary failed: rolling back to the plan left");
        if (px__hr_start_plan(h, h->prev_plan, &ex, err) == PX_OK) {
            json_decref(h->pending_plan);
            h->pending_plan = json_deep_copy(h->prev_plan);
            h->pending = ex;
        }
    } else {
        px__hr_incident_event(h, "canary failed, and nothing better is left: staying");
    }
    if (ex) {
        v->switch_to = ex;
        v->keep_steps = UINT64_MAX;
        return PX_OK;
    }
    /* Nothing will judge this change again: the incident is over, and
     * recorded (left open, it never would be, and it would hold back
     * every later adaptation). */
    px__hr_incident_close(h, "kept: the canary failed and nothing better could be started", med);
    return PX_OK;
}

px_status px__hr_canary_step(px_heal_run *h, const hr_step *s, px_rt_step_verdict *v, px_err *err)
{
    json_array_append_new(h->canary_samples, json_string(s->name));
    px_heal_canary_verdict cv = px_heal_canary_observe(&h->canary, s->wall_s);
    if (cv == PX_HEAL_CANARY_PENDING)
        return PX_OK;
    h->canary_on = false;
    double med = px_heal_canary_median(&h->canary);
    if (h->o.trace) {
        size_t n = json_array_size(h->canary_samples);
        double *o = calloc(n ? n : 1, sizeof *o);
        if (!o)
            return px_err_set(err, PX_ENOMEM, "heal: out of memory");
        for (size_t i = 0; i < n; i++)
            o[i] = h->win[h->n_win - n + i].wall_s;
        px_heal_canary_verdict again;
        json_t *out = px__hr_canary_json(h->canary.pred_p50_s / h->canary_ratio,
                                         h->canary.pred_hi_s / h->canary_ratio, h->canary_ratio,
                                         h->canary.need, h->canary.tolerance, o, n, &again);
        free(o);
        json_t *inputs = json_pack(
            "{s:f, s:f, s:f, s:i, s:f, s:O}", "pred_p50_s", h->canary.pred_p50_s / h->canary_ratio,
            "pred_hi_s", h->canary.pred_hi_s / h->canary_ratio, "ratio", h->canary_ratio, "need",
            (int)h->canary.need, "tolerance", h->canary.tolerance, "samples", h->canary_samples);
        px_status st = inputs && out
                           ? px_trace_decision(h->o.trace, "heal.canary", inputs, out, NULL, err)
                           : px_err_set(err, PX_ENOMEM, "heal: out of memory");
        json_decref(inputs);
        json_decref(out);
        if (st != PX_OK)
            return st;
    }
    if (h->incident) {
        json_t *c = json_pack("{s:s, s:f, s:f, s:f, s:f, s:i}", "verdict",
                              cv == PX_HEAL_CANARY_PASS ? "pass" : "fail", "predicted_p50_s",
                              h->canary.pred_p50_s, "predicted_hi_s", h->canary.pred_hi_s,
                              "calibration_ratio", h->canary_ratio, "observed_p50_s", med, "steps",
                              (int)h->canary.seen);
        px_json_set(h->incident, "canary", c);
    }
    if (cv == PX_HEAL_CANARY_PASS) {
        h->sum.canaries_passed++;
        px__hr_incident_close(h, "mitigated", med);
        return PX_OK;
    }
    h->sum.canaries_failed++;
    return rollback(h, v, err, med);
}

px_status px__hr_on_audit(px_heal_run *h, const px_rt_step_obs *obs, px_rt_step_verdict *v,
                          px_err *err)
{
    int bad = -1;
    json_t *rec = NULL;
    h->sum.audits++;
    px_status st =
        px__hr_shadow_audit(h->shadow, &h->spec, obs, h->o.audit_tolerance, &bad, &rec, err);
    if (st != PX_OK) {
        px_log_warn("heal: audit of step %" PRIu64 " skipped: %s", obs->index, err->msg);
        return PX_OK;
    }
    if (h->o.trace && rec)
        st = px_trace_observation(h->o.trace, "heal.audit", rec, err);
    json_decref(rec);
    if (st != PX_OK)
        return st;
    if (bad < 0) {
        h->last_good_keep = obs->index + 1;
        return PX_OK;
    }
    h->sum.audit_departures++;
    h->sum.findings++;
    h->t_detect_s = px__hr_now(h);
    px_heal_locus where = {.kind = PX_HEAL_AT_DEVICE, .stage = (uint32_t)bad};
    px_strlcpy(where.device, h->spec.stages[bad].device, sizeof where.device);
    char evidence[320];
    snprintf(evidence, sizeof evidence,
             "the audit of step %" PRIu64 " found stage %d (%s) departing from the cpu shadow "
             "computation beyond the tolerance %g",
             obs->index, bad, where.device, h->o.audit_tolerance);
    if (!h->o.heal || h->incident)
        return PX_OK;
    px__hr_add_name(h->excluded, &h->n_excluded, where.device);
    px_rt_executor *ex = px__hr_mitigate(h, "recovery", PX_HEAL_CORRUPTION, &where, NULL,
                                         "heal.audit", evidence, err);
    if (!ex) {
        px_log_warn("heal: %s", err->msg);
        return PX_OK;
    }
    json_decref(h->prev_plan);
    h->prev_plan = NULL;
    h->prev_viable = false;
    v->switch_to = ex;
    v->keep_steps = h->last_good_keep;
    return PX_OK;
}
