/* Healing real runs: what a failure is, and what to run instead.  The
 * classification of a failed step and the decision (candidates, their
 * validation in the simulator, the choice) are functions of recorded
 * data only, so that replay recomputes them through this same code;
 * then the chosen plan's executor is started (on to the next accepted
 * candidate when it does not start). */
#include "heal/heal_run_impl.h"

static const char *state_name(px_rt_stage_state s)
{
    switch (s) {
    case PX_RT_STAGE_STOPPED:
        return "stopped";
    case PX_RT_STAGE_EXITED:
        return "exited";
    case PX_RT_STAGE_KILLED:
        return "killed";
    case PX_RT_STAGE_RUNNING:
    default:
        return "running";
    }
}

json_t *px__hr_failure_json(px_rt_executor *failed, px_status st, const px_err *why)
{
    const px_rt_pipeline_spec *spec = px_rt_executor_spec(failed);
    json_t *stages = json_array();
    for (uint32_t i = 0; stages && spec && i < spec->n_stages; i++) {
        char detail[160] = "";
        px_rt_stage_state s = px_rt_executor_stage_health(failed, i, detail, sizeof detail);
        json_array_append_new(stages, json_pack("{s:i, s:s, s:s, s:s}", "stage", (int)i, "device",
                                                spec->stages[i].device, "state", state_name(s),
                                                "detail", detail));
    }
    return json_pack("{s:s, s:s, s:i, s:o}", "status", px_status_name(st), "message",
                     why ? why->msg : px_status_str(st), "culprit", px_rt_executor_culprit(failed),
                     "stages", stages ? stages : json_array());
}

static const json_t *stage_at(const json_t *failure, int i)
{
    const json_t *stages = json_object_get(failure, "stages");
    return i >= 0 ? json_array_get(stages, (size_t)i) : NULL;
}

/* The receiving stage a transport message names ("stage 2 (...)"), or -1. */
static int stage_named(const char *msg)
{
    const char *p = msg ? strstr(msg, "stage ") : NULL;
    if (!p)
        return -1;
    char *end;
    long v = strtol(p + 6, &end, 10);
    return end != p + 6 && v >= 0 && v < PX_RT_MAX_STAGES ? (int)v : -1;
}

void px__hr_classify_failure(const json_t *failure, px_heal_fault_class *cls, px_heal_locus *where)
{
    memset(where, 0, sizeof *where);
    *cls = PX_HEAL_CRASH;
    const json_t *stages = json_object_get(failure, "stages");
    size_t n = json_array_size(stages);
    json_int_t culprit = json_integer_value(json_object_get(failure, "culprit"));
    const char *status = json_string_value(json_object_get(failure, "status"));
    const char *msg = json_string_value(json_object_get(failure, "message"));
    /* A stage that could not hold a memory fault ended the run: memory
     * pressure on its device, whatever the transport saw after. */
    const json_t *mem = json_object_get(failure, "memory_fault");
    if (json_is_object(mem)) {
        json_int_t s = json_integer_value(json_object_get(mem, "stage"));
        const char *dev = json_string_value(json_object_get(stage_at(failure, (int)s), "device"));
        if (s >= 0 && (size_t)s < n && dev) {
            *cls = PX_HEAL_MEMORY_PRESSURE;
            where->kind = PX_HEAL_AT_DEVICE;
            where->stage = (uint32_t)s;
            px_strlcpy(where->device, dev, sizeof where->device);
            return;
        }
    }
    /* No culprit named: the first stage that is not running. */
    if (culprit < 0 || (size_t)culprit >= n) {
        culprit = -1;
        for (size_t i = 0; i < n; i++) {
            const char *s = json_string_value(json_object_get(json_array_get(stages, i), "state"));
            if (s && strcmp(s, "running") != 0) {
                culprit = (json_int_t)i;
                break;
            }
        }
    }
    if (culprit >= 0) {
        const json_t *st = stage_at(failure, (int)culprit);
        const char *state = json_string_value(json_object_get(st, "state"));
        const char *detail = json_string_value(json_object_get(st, "detail"));
        const char *dev = json_string_value(json_object_get(st, "device"));
        where->kind = PX_HEAL_AT_DEVICE;
        where->stage = (uint32_t)culprit;
        px_strlcpy(where->device, dev ? dev : "", sizeof where->device);
        if (state && !strcmp(state, "killed") && detail && strstr(detail, "signal 9"))
            *cls = PX_HEAL_DEVICE_LOSS; /* SIGKILL: the device went away */
        else if (state && !strcmp(state, "stopped"))
            *cls = PX_HEAL_HANG;
        else if (state && !strcmp(state, "running"))
            *cls = PX_HEAL_HANG; /* blamed, yet alive: it answers nothing */
        else
            *cls = PX_HEAL_CRASH; /* an abort or an exit */
        return;
    }
    /* Every worker runs: the ring itself failed. */
    if (status && !strcmp(status, "PX_ETIMEOUT")) {
        *cls = PX_HEAL_HANG;
        where->kind = PX_HEAL_AT_NOTHING;
        return;
    }
    bool checksum = msg && (strstr(msg, "checksum") || strstr(msg, "CRC"));
    bool cut = msg && (strstr(msg, "cut") || strstr(msg, "closed") || strstr(msg, "truncated"));
    if (checksum || cut || (status && !strcmp(status, "PX_EPEER"))) {
        *cls = checksum ? PX_HEAL_LINK_DEGRADE : PX_HEAL_LINK_LOSS;
        int to = stage_named(msg);
        where->kind = PX_HEAL_AT_LINK;
        if (to < 0 || (size_t)to >= n) {
            /* The executor received it: the last hop. */
            where->stage = n ? (uint32_t)(n - 1) : 0;
            where->to = (uint32_t)n;
        } else {
            where->stage = to == 0 ? (uint32_t)n : (uint32_t)(to - 1);
            where->to = (uint32_t)to;
        }
        const char *a =
            where->stage < n
                ? json_string_value(json_object_get(stage_at(failure, (int)where->stage), "device"))
                : "executor";
        const char *b =
            where->to < n
                ? json_string_value(json_object_get(stage_at(failure, (int)where->to), "device"))
                : "executor";
        snprintf(where->device, sizeof where->device, "%s>%s", a ? a : "?", b ? b : "?");
        return;
    }
    where->kind = PX_HEAL_AT_NOTHING;
}

px_heal_fault_class px__hr_class_from_name(const char *name)
{
    for (int c = 0; name && c < PX_HEAL_FAULT_CLASS_COUNT_; c++)
        if (!strcmp(px_heal_fault_class_name((px_heal_fault_class)c), name))
            return (px_heal_fault_class)c;
    return PX_HEAL_NONE;
}

void px__hr_locus_from_json(const json_t *j, px_heal_locus *l)
{
    memset(l, 0, sizeof *l);
    const char *kind = json_string_value(json_object_get(j, "kind"));
    static const px_heal_locus_kind kinds[] = {PX_HEAL_AT_NOTHING, PX_HEAL_AT_DEVICE,
                                               PX_HEAL_AT_COMPUTE, PX_HEAL_AT_LINK,
                                               PX_HEAL_AT_DOMAIN};
    for (size_t i = 0; kind && i < PX_ARRAY_LEN(kinds); i++)
        if (!strcmp(px_heal_locus_kind_name(kinds[i]), kind))
            l->kind = kinds[i];
    json_int_t s = json_integer_value(json_object_get(j, "stage"));
    json_int_t t = json_integer_value(json_object_get(j, "to"));
    l->stage = s >= 0 && s <= PX_RT_MAX_STAGES ? (uint32_t)s : 0;
    l->to = t >= 0 && t <= PX_RT_MAX_STAGES ? (uint32_t)t : 0;
    const char *dev = json_string_value(json_object_get(j, "device"));
    px_strlcpy(l->device, dev ? dev : "", sizeof l->device);
}

/* ---- the decision ---- */

/* What the candidates are judged under: the degraded link as observed
 * (its added latency), so that a candidate keeping it pays for it. */
static px_status conditions(px_heal_fault_class cls, const px_heal_locus *where,
                            const px_heal_finding *f, px_sim_faults *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (cls != PX_HEAL_LINK_DEGRADE || !f || where->kind != PX_HEAL_AT_LINK ||
        strstr(where->device, "executor"))
        return PX_OK;
    out->items = calloc(1, sizeof *out->items);
    if (!out->items)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    out->n = 1;
    px_sim_fault *x = &out->items[0];
    x->kind = PX_SIM_FAULT_LINK_DEGRADE;
    px_strlcpy(x->target, where->device, sizeof x->target);
    double added = f->observed_s - f->baseline_s;
    x->latency_s = isfinite(added) && added > 0 ? added : 0;
    x->bandwidth_factor = 1;
    return PX_OK;
}

px_status px__hr_decide(const px_heal_context *ctx, const json_t *plan, px_heal_fault_class cls,
                        const px_heal_locus *where, const json_t *lost,
                        const px_heal_finding *finding, json_t **decision,
                        px_heal_candidate **cands, size_t *n_cands, int *chosen, px_err *err)
{
    *decision = NULL;
    const char *names[2 * HR_MAX_LOST];
    size_t n_lost = 0;
    for (size_t i = 0; i < json_array_size(lost) && n_lost < PX_ARRAY_LEN(names); i++) {
        const char *s = json_string_value(json_array_get(lost, i));
        if (s)
            names[n_lost++] = s;
    }
    px_heal_candidate *c = NULL;
    size_t n = 0;
    int pick = -1;
    px_sim_faults cond;
    px_heal_context cx = *ctx;
    cx.current_plan = plan;
    px_status st = px_heal_candidates(&cx, plan, cls, where, names, n_lost, &c, &n, err);
    if (st != PX_OK)
        return st;
    /* Without a finding this is a recovery: the step failed and the
     * pipeline's workers are gone, so keeping the plan as it is (or pacing
     * it) restores nothing. */
    for (size_t i = 0; !finding && i < n; i++)
        if ((c[i].action == PX_HEAL_ACT_NONE || c[i].action == PX_HEAL_ACT_PACE) &&
            !c[i].infeasible_at_generation) {
            c[i].feasible = false;
            c[i].infeasible_at_generation = true;
            px_strlcpy(c[i].reject_code, "infeasible", sizeof c[i].reject_code);
            px_strlcpy(c[i].reject_reason,
                       "the step failed and the pipeline's workers are gone: keeping the plan "
                       "restores nothing",
                       sizeof c[i].reject_reason);
        }
    if ((st = conditions(cls, where, finding, &cond, err)) != PX_OK)
        goto done;
    st = px_heal_validate(&cx, c, n, cond.n ? &cond : NULL, &pick, err);
    if (st != PX_OK)
        goto done;
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        json_array_append_new(list, px_heal_candidate_to_json(&c[i]));
    *decision =
        json_pack("{s:s, s:o, s:o, s:i, s:s, s:o}", "class", px_heal_fault_class_name(cls), "locus",
                  px_heal_locus_to_json(where), "candidates", list ? list : json_array(), "chosen",
                  pick, "action", pick >= 0 ? px_heal_action_name(c[pick].action) : "none",
                  "conditions", cond.n ? px_sim_faults_to_json(&cond) : json_null());
    if (!*decision)
        st = px_err_set(err, PX_ENOMEM, "heal: out of memory");
done:
    free(cond.items);
    if (st == PX_OK && cands) {
        *cands = c;
        *n_cands = n;
        *chosen = pick;
    } else {
        px_heal_candidates_free(c, n);
        if (chosen)
            *chosen = pick;
    }
    return st;
}

/* ---- starting the choice ---- */

/* Observed over predicted step time on the plan that runs now, from the
 * first (baseline) steps of its window; NAN with fewer than 3. */
static double observed_ratio(const px_heal_run *h)
{
    size_t n = PX_MIN(h->n_win, (size_t)h->o.detector.baseline_steps);
    double pred = px__hr_pred_step(&h->spec, false);
    if (n < 3 || !(pred > 0))
        return NAN;
    double w[64];
    n = PX_MIN(n, PX_ARRAY_LEN(w));
    for (size_t i = 0; i < n; i++)
        w[i] = h->win[i].wall_s;
    return px__heal_median(w, n) / pred;
}

/* Starts the chosen candidate (or, when it does not start, the next
 * accepted one).  Returns the executor, or NULL with *err set. */
px_rt_executor *px__hr_start_choice(px_heal_run *h, px_err *err)
{
    for (int pass = 0; pass < (int)h->n_cands + 1; pass++) {
        int i = h->chosen;
        if (i < 0 || (size_t)i >= h->n_cands)
            return NULL;
        h->tried[i] = true;
        const json_t *plan = h->cands[i].plan ? h->cands[i].plan : h->plan;
        px_rt_executor *ex = NULL;
        if (px__hr_start_plan(h, plan, &ex, err) == PX_OK) {
            json_decref(h->pending_plan);
            h->pending_plan = json_deep_copy(plan);
            h->pending = ex;
            return ex;
        }
        px__hr_incident_event(h, err->msg);
        h->chosen = -1;
        for (size_t k = 0; k < h->n_cands && k < PX_ARRAY_LEN(h->tried); k++)
            if (h->cands[k].accepted && !h->tried[k]) {
                h->chosen = (int)k;
                break;
            }
    }
    return NULL;
}

/* The JSON array of devices kept out of new plans. */
static json_t *lost_json(const px_heal_run *h)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < h->n_lost; i++)
        json_array_append_new(a, json_string(h->lost[i]));
    for (size_t i = 0; a && i < h->n_excluded; i++)
        json_array_append_new(a, json_string(h->excluded[i]));
    return a;
}

void px__hr_add_name(char list[][96], size_t *n, const char *dev)
{
    if (!dev[0] || *n == HR_MAX_LOST)
        return;
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(list[i], dev))
            return;
    px_strlcpy(list[(*n)++], dev, 96);
}

/* Plans, validates and chooses a mitigation for (cls, where) and starts
 * it.  cause names the trace event the decision derives from.  Returns
 * the new executor (owned by the run until switched), or NULL when
 * nothing can be started (err says why). */
px_rt_executor *px__hr_mitigate(px_heal_run *h, const char *kind, px_heal_fault_class cls,
                                const px_heal_locus *where, const px_heal_finding *finding,
                                const char *cause, const char *evidence, px_err *err)
{
    if (!h->o.graph && cls != PX_HEAL_CRASH && cls != PX_HEAL_HANG) {
        px_err_set(err, PX_ESTATE,
                   "heal: a %s at %s needs another plan, and planning one needs the inventory: "
                   "run with --inventory FILE",
                   px_heal_fault_class_name(cls),
                   where->device[0] ? where->device : "the pipeline");
        px__hr_incident_open(h, kind, cls, where, NULL, evidence);
        px__hr_incident_close(h, "not mitigated: no inventory to plan with", NAN);
        return NULL;
    }
    /* The canary's calibration: how this plan's steps compared with its
     * prediction before the fault. */
    double r = observed_ratio(h);
    if (isfinite(r))
        h->canary_ratio = r;
    px_heal_candidates_free(h->cands, h->n_cands);
    h->cands = NULL;
    h->n_cands = 0;
    memset(h->tried, 0, sizeof h->tried);
    json_t *lost = lost_json(h);
    json_t *decision = NULL;
    px_status st = PX_OK;
    double t_plan = px__hr_now(h);
    if (h->o.graph) {
        st = px__hr_decide(&h->ctx, h->plan, cls, where, lost, finding, &decision, &h->cands,
                           &h->n_cands, &h->chosen, err);
    } else {
        /* No inventory: the only mitigation is a fresh worker on the same
         * plan. */
        h->cands = calloc(1, sizeof *h->cands);
        if (!h->cands) {
            st = px_err_set(err, PX_ENOMEM, "heal: out of memory");
        } else {
            h->n_cands = 1;
            h->cands[0].action = PX_HEAL_ACT_RESTART_WORKER;
            snprintf(h->cands[0].label, sizeof h->cands[0].label,
                     "restart the worker of stage %u on the same plan", where->stage);
            h->cands[0].accepted = h->cands[0].validated = h->cands[0].feasible = true;
            h->cands[0].contract_ok = h->cands[0].slo_ok = true;
            h->chosen = 0;
            decision = json_pack(
                "{s:s, s:o, s:[o], s:i, s:s}", "class", px_heal_fault_class_name(cls), "locus",
                px_heal_locus_to_json(where), "candidates", px_heal_candidate_to_json(&h->cands[0]),
                "chosen", 0, "note", "no inventory: restart only");
        }
    }
    if (st == PX_OK && h->o.trace && h->o.graph) {
        json_t *inputs = json_pack("{s:s, s:s, s:s, s:O}", "context", "heal.context", "plan",
                                   "heal.plan", "cause", cause, "lost", lost);
        if (inputs)
            st = px_trace_mitigation(h->o.trace, "heal.mitigation", inputs, decision, NULL, err);
        json_decref(inputs);
    }
    json_decref(lost);
    px__hr_incident_open(h, kind, cls, where, decision, evidence);
    json_decref(decision);
    char note[160], took[32];
    px__heal_fmt_s(px__hr_now(h) - t_plan, took, sizeof took);
    snprintf(note, sizeof note, "%zu candidate(s) planned and validated in the simulator in %s",
             h->n_cands, took);
    px__hr_incident_event(h, note);
    if (st != PX_OK) {
        px__hr_incident_close(h, "not mitigated: no plan could be made", NAN);
        return NULL;
    }
    if (h->chosen < 0) {
        px_err_set(err, PX_EINFEASIBLE,
                   "heal: no candidate for the %s at %s was accepted (see the incident)",
                   px_heal_fault_class_name(cls), where->device);
        px__hr_incident_close(h, "not mitigated: no candidate accepted", NAN);
        return NULL;
    }
    px_heal_action act = h->cands[h->chosen].action;
    if (act == PX_HEAL_ACT_NONE || act == PX_HEAL_ACT_PACE) {
        /* Keeping the plan (one sequence at a time leaves nothing to
         * pace) changes nothing that runs. */
        px_err_set(err, PX_OK, "kept the plan: %s", h->cands[h->chosen].label);
        px__hr_incident_close(h, "tolerated: the plan was kept", NAN);
        return NULL;
    }
    px_rt_executor *ex = px__hr_start_choice(h, err);
    if (!ex) {
        px__hr_incident_close(h, "not mitigated: the chosen plan did not start", NAN);
        return NULL;
    }
    char line[256];
    snprintf(line, sizeof line, "started %s", h->cands[h->chosen].label);
    px__hr_incident_event(h, line);
    return ex;
}
