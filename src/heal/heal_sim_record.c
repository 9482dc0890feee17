/* Incident records of healing in the simulator (plexus.incident/1,
 * docs/formats/incident.md): opened at a finding, filled in by the
 * decision, the switch and the canary, closed with the outcome, the time
 * to detect and to recover and the work lost; and read back as text. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

static const char *detector_of(const json_t *trigger)
{
    const char *sig = json_string_value(json_object_get(trigger, "signal"));
    if (!sig)
        return "observation";
    if (!strcmp(sig, "heartbeat"))
        return "heartbeat-timeout";
    if (!strcmp(sig, "temperature"))
        return "thermal-trajectory";
    if (!strcmp(sig, "throttle"))
        return "throttle";
    return "timing";
}

/* Whether a ground-truth fault explains a finding of this class here. */
static bool truth_fits(const px_heal_sim *h, const px__hs_truth *t, px_heal_fault_class cls,
                       const px_heal_locus *where)
{
    const px_sim_plan *p = &h->plans[0]->sim;
    uint32_t dev = PX_SIM_NONE;
    for (size_t d = 0; d < p->n_devices; d++)
        if (!strcmp(p->devices[d].id, where->device) ||
            (where->kind == PX_HEAL_AT_LINK &&
             !strncmp(p->devices[d].id, where->device, strlen(p->devices[d].id)) &&
             where->device[strlen(p->devices[d].id)] == '>'))
            dev = (uint32_t)d;
    switch (cls) {
    case PX_HEAL_DEVICE_LOSS:
        return (t->kind == PX_SIM_FAULT_DEVICE_LOSS || t->kind == PX_SIM_FAULT_DOMAIN_LOSS) &&
               (t->device == dev || t->kind == PX_SIM_FAULT_DOMAIN_LOSS);
    case PX_HEAL_DOMAIN_LOSS:
        return t->kind == PX_SIM_FAULT_DOMAIN_LOSS || t->kind == PX_SIM_FAULT_DEVICE_LOSS;
    case PX_HEAL_LINK_DEGRADE:
    case PX_HEAL_INTERFERENCE:
        return t->kind == PX_SIM_FAULT_LINK_DEGRADE;
    case PX_HEAL_THERMAL:
        return (t->kind == PX_SIM_FAULT_THERMAL || t->kind == PX_SIM_FAULT_POWER_CAP) &&
               (t->device == dev || t->device == PX_SIM_NONE);
    default:
        return false;
    }
}

static json_t *event_json(double t, const char *what)
{
    return json_pack("{s:f, s:s}", "t_s", t, "event", what);
}

void px__hs_incident_open(px_heal_sim *h, px_heal_fault_class cls, const px_heal_locus *where,
                          bool intermittent, const char *evidence, const json_t *trigger)
{
    /* The fault that explains it: the earliest one not yet explained, or
     * (a fault that comes and goes) one explained before. */
    int match = -1;
    for (int pass = 0; pass < 2 && match < 0; pass++)
        for (uint32_t i = 0; i < h->n_truth; i++)
            if (h->truth[i].t <= h->now && (pass ? true : !h->truth[i].matched) &&
                truth_fits(h, &h->truth[i], cls, where)) {
                match = (int)i;
                break;
            }
    if (match >= 0 && !h->truth[match].matched) {
        h->truth[match].matched = true;
        h->sum.faults_detected++;
    } else if (match < 0) {
        h->sum.false_alarms++;
    }
    h->inc_truth = match;
    h->inc_detect_t = h->now;
    h->inc_onset_t = match >= 0 ? h->truth[match].t : h->now;
    h->inc_failed = match >= 0 ? h->truth[match].failed : h->c_failed;
    h->inc_requeued = match >= 0 ? h->truth[match].requeued : h->c_requeued;
    h->inc_tokens_lost = match >= 0 ? h->truth[match].tokens_lost : h->c_tokens_lost;
    h->inc_recovery = cls == PX_HEAL_DEVICE_LOSS || cls == PX_HEAL_DOMAIN_LOSS;
    const px__hs_truth *t = match >= 0 ? &h->truth[match] : NULL;
    json_t *inject = json_null();
    if (t) {
        const px_sim_plan *p = &h->plans[0]->sim;
        const char *target = t->kind == PX_SIM_FAULT_DOMAIN_LOSS && t->domain < p->n_domains
                                 ? p->domains[t->domain].id
                             : t->device < p->n_devices ? p->devices[t->device].id
                                                        : "*";
        inject = json_pack("{s:s, s:s, s:f, s:b}", "kind", px_sim_fault_kind_name(t->kind),
                           "target", target, "t_s", t->t, "injected", t->injected);
    }
    char id[48];
    snprintf(id, sizeof id, "sim-r%u-%u", h->replication, (unsigned)json_array_size(h->incidents));
    bool staged = where->kind == PX_HEAL_AT_DEVICE || where->kind == PX_HEAL_AT_COMPUTE ||
                  where->kind == PX_HEAL_AT_LINK;
    json_t *timeline = json_array();
    if (t) {
        char line[160];
        snprintf(line, sizeof line, "%s starts (ground truth, not seen by the healer)",
                 px_sim_fault_kind_name(t->kind));
        json_array_append_new(timeline, event_json(t->t, line));
    }
    char line[400];
    snprintf(line, sizeof line, "detected: %s", evidence);
    json_array_append_new(timeline, event_json(h->now, line));
    json_decref(h->inc);
    h->inc = json_pack(
        "{s:s, s:s, s:s, s:s, s:i, s:{s:s, s:o}, s:{s:s, s:o, s:s, s:{s:f, s:n}, s:b},"
        " s:{s:s, s:f, s:f}, s:{s:s, s:o, s:o, s:s, s:s}, s:o, s:{s:i, s:s, s:s, s:s},"
        " s:{s:i, s:n, s:n, s:s}, s:n, s:{s:n}, s:{s:n}, s:o, s:n, s:n,"
        " s:{s:i, s:i, s:f}, s:{s:n, s:n, s:n, s:s}}",
        "schema", PX_HEAL_INCIDENT_SCHEMA, "id", id, "source", "simulator", "kind",
        h->inc_recovery ? "recovery" : "adaptation", "replication", (int)h->replication, "cause",
        "class", px_heal_fault_class_name(cls), "inject", inject, "signature", "class",
        px_heal_fault_class_name(cls), "locus", px_heal_locus_to_json(where), "evidence", evidence,
        "onset", "t_s", h->inc_onset_t, "step", "intermittent", intermittent, "detection",
        "detector", detector_of(trigger), "detected_at_s", h->now, "time_to_detect_s",
        h->now - h->inc_onset_t, "localization", "kind", px_heal_locus_kind_name(where->kind),
        "stage", staged ? json_integer(where->stage) : json_null(), "to",
        where->kind == PX_HEAL_AT_LINK ? json_integer(where->to) : json_null(), "device",
        where->device[0] ? where->device : "", "evidence", evidence, "candidates", json_array(),
        "choice", "index", -1, "action", "none", "label", "nothing chosen yet", "why",
        "not decided", "canary", "steps", 0, "predicted_p50_s", "observed_p50_s", "verdict", "none",
        "rollback", "predicted", "tpot_s", "realized", "tpot_s", "timeline", timeline, "rto_s",
        "rpo_tokens", "lost_work", "tokens", 0, "steps", 0, "seconds", 0.0, "reproducer", "trace",
        "first_seq", "last_seq", "command",
        "plexus simulate --heal (the same plan, inventory, load, faults and seed)");
    if (!h->inc)
        px__hs_note_error(h, &(px_err){.code = PX_ENOMEM, .msg = "heal: out of memory"});
}

void px__hs_incident_event(px_heal_sim *h, const char *fmt, ...)
{
    if (!h->inc)
        return;
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    json_array_append_new(json_object_get(h->inc, "timeline"), event_json(h->now, line));
}

void px__hs_incident_close(px_heal_sim *h, const char *outcome, bool mitigated)
{
    if (!h->inc)
        return;
    json_t *inc = h->inc;
    h->inc = NULL;
    px_json_set(inc, "outcome", json_string(outcome));
    json_array_append_new(json_object_get(inc, "timeline"), event_json(h->now, outcome));
    /* Recovered (or mitigated) when the new plan served; the time from the
     * fault's onset to then is the recovery time. */
    double served = json_number_value(json_object_get(inc, "served_at_s"));
    bool has_served = json_is_number(json_object_get(inc, "served_at_s"));
    if (mitigated) {
        double done = has_served ? served : h->now;
        h->sum.mitigated++;
        h->sum.mitigate_s_sum += done - h->inc_onset_t;
        px__heal_set_num(inc, "time_to_mitigate_s", done - h->inc_onset_t);
        if (h->inc_recovery) {
            h->sum.recovered++;
            px__heal_set_num(inc, "rto_s", done - h->inc_onset_t);
        }
    }
    double failed = h->c_failed - h->inc_failed, requeued = h->c_requeued - h->inc_requeued;
    double tokens = h->c_tokens_lost - h->inc_tokens_lost;
    h->sum.requests_failed += failed;
    h->sum.requests_requeued += requeued;
    h->sum.tokens_lost += tokens;
    px_json_set(inc, "rpo_tokens",
                h->inc_recovery ? json_integer((json_int_t)tokens) : json_null());
    px_json_set(inc, "lost_work",
                json_pack("{s:I, s:I, s:f, s:I, s:I}", "tokens", (json_int_t)tokens, "steps",
                          (json_int_t)0, "seconds",
                          has_served ? served - h->inc_onset_t : h->now - h->inc_onset_t,
                          "requests_failed", (json_int_t)failed, "requests_requeued",
                          (json_int_t)requeued));
    if (h->inc_truth >= 0)
        h->sum.detect_s_sum += h->inc_detect_t - h->inc_onset_t;
    px_err e;
    if (px_heal_incident_complete(inc, &e))
        h->sum.complete++;
    h->sum.incidents++;
    json_array_append_new(h->incidents, inc);
}

static const char *s_or(const json_t *o, const char *k, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s && s[0] ? s : dflt;
}

px_status px__hs_incident_text(const json_t *inc, px_strbuf *out)
{
    const json_t *sig = json_object_get(inc, "signature");
    const json_t *det = json_object_get(inc, "detection");
    const json_t *choice = json_object_get(inc, "choice");
    const json_t *canary = json_object_get(inc, "canary");
    const json_t *lw = json_object_get(inc, "lost_work");
    const json_t *cands = json_object_get(inc, "candidates");
    px_strbuf_addf(
        out, "incident %s (%s, replication %lld): %s at %s. %s.\n", s_or(inc, "id", "?"),
        s_or(inc, "kind", "?"), (long long)json_integer_value(json_object_get(inc, "replication")),
        s_or(sig, "class", "?"), s_or(json_object_get(sig, "locus"), "device", "an unknown place"),
        s_or(sig, "evidence", "no evidence"));
    px_strbuf_addf(out, "  detected at %.3f s by %s, %.3f s after the onset",
                   json_number_value(json_object_get(det, "detected_at_s")),
                   s_or(det, "detector", "?"),
                   json_number_value(json_object_get(det, "time_to_detect_s")));
    size_t i, n_rej = 0;
    const json_t *c;
    json_array_foreach(cands, i, c) n_rej += !json_is_true(json_object_get(c, "accepted"));
    px_strbuf_addf(out, "; %zu candidates, %zu rejected", json_array_size(cands), n_rej);
    json_array_foreach(cands, i, c)
    {
        if (!json_is_true(json_object_get(c, "accepted")))
            px_strbuf_addf(out, " (%s: %s, %s)", s_or(c, "action", "?"),
                           s_or(c, "reject_code", "?"), s_or(c, "reject_reason", ""));
    }
    px_strbuf_addf(out, "; chose %s: %s (%s)", s_or(choice, "action", "none"),
                   s_or(choice, "label", "nothing"), s_or(choice, "why", ""));
    px_strbuf_addf(out, "; canary %s", s_or(canary, "verdict", "none"));
    const json_t *rto = json_object_get(inc, "rto_s");
    if (json_is_number(rto))
        px_strbuf_addf(out, "; recovered in %.3f s", json_number_value(rto));
    px_strbuf_addf(out, "; lost %lld tokens, %lld requests failed, %lld requeued. Outcome: %s.\n",
                   (long long)json_integer_value(json_object_get(lw, "tokens")),
                   (long long)json_integer_value(json_object_get(lw, "requests_failed")),
                   (long long)json_integer_value(json_object_get(lw, "requests_requeued")),
                   s_or(inc, "outcome", "open"));
    return out->buf ? PX_OK : PX_ENOMEM;
}
