/* Healing real runs: what is written down.  The trace's inputs (so that
 * replay can rebuild every decision), the incident records
 * (`plexus.incident/1`, docs/formats/incident.md) and their readable
 * paragraphs, and the outcome. */
#include "heal/heal_run_impl.h"

/* ---- the context of the decisions: written with the inputs, read back
 * by replay ---- */

json_t *px__hr_context_json(const px_heal_context *ctx)
{
    const px_plan_request *r = &ctx->request;
    const px_cost_workload *wl = &r->workload;
    return json_pack("{s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:{s:f, s:f, s:f}, s:I, s:I, s:f, "
                     "s:b, s:I}",
                     "objective", px_plan_objective_name(r->objective), "policy",
                     r->policy ? r->policy : "plexus", "workload", "batch", (json_int_t)wl->batch,
                     "micro_batches", (json_int_t)wl->micro_batches, "context",
                     (json_int_t)wl->context, "prompt_tokens", (json_int_t)wl->prompt_tokens,
                     "gen_tokens", (json_int_t)wl->gen_tokens, "slo", "tpot_s", ctx->slo.tpot_s,
                     "ttft_s", ctx->slo.ttft_s, "budget_usd_h", ctx->slo.budget_usd_h, "seed",
                     (json_int_t)ctx->seed, "replications", (json_int_t)ctx->replications,
                     "duration_s", ctx->duration_s, "fallbacks", r->fallbacks, "max_tp",
                     (json_int_t)r->max_tp);
}

static px_status ctx_u32(const json_t *o, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                         px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded context lacks a whole number from %u to %u at "
                          "\"%s\"",
                          lo, hi, key);
    *out = (uint32_t)json_integer_value(v);
    return PX_OK;
}

static px_status ctx_real(const json_t *o, const char *key, double hi, double *out, px_err *err)
{
    const json_t *v = json_object_get(o, key);
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < 0 || x > hi)
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded context lacks a number from 0 to %g at \"%s\"", hi,
                          key);
    *out = x;
    return PX_OK;
}

px_status px__hr_context_from_json(const json_t *doc, px_heal_context *ctx, px_err *err)
{
    memset(ctx, 0, sizeof *ctx);
    px_plan_request_default(&ctx->request);
    const json_t *wl = json_object_get(doc, "workload");
    const json_t *slo = json_object_get(doc, "slo");
    const char *obj = json_string_value(json_object_get(doc, "objective"));
    const char *policy = json_string_value(json_object_get(doc, "policy"));
    if (!json_is_object(wl) || !json_is_object(slo) || !obj || !policy)
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded context lacks \"objective\", \"policy\", "
                          "\"workload\" or \"slo\"");
    px_status st = px_plan_objective_parse(obj, &ctx->request.objective, err);
    if (st != PX_OK)
        return st;
    if (!px_plan_policy_exists(policy))
        return px_err_set(err, PX_EPARSE, "heal: the recorded policy \"%s\" is unknown", policy);
    ctx->request.policy = policy;
    px_cost_workload *w = &ctx->request.workload;
    uint32_t seed = 0, reps = 0;
    if ((st = ctx_u32(wl, "batch", 0, 65536, &w->batch, err)) ||
        (st = ctx_u32(wl, "micro_batches", 0, 65536, &w->micro_batches, err)) ||
        (st = ctx_u32(wl, "context", 0, 1u << 24, &w->context, err)) ||
        (st = ctx_u32(wl, "prompt_tokens", 0, 1u << 24, &w->prompt_tokens, err)) ||
        (st = ctx_u32(wl, "gen_tokens", 1, 1u << 24, &w->gen_tokens, err)) ||
        (st = ctx_real(slo, "tpot_s", 1e6, &ctx->slo.tpot_s, err)) ||
        (st = ctx_real(slo, "ttft_s", 1e6, &ctx->slo.ttft_s, err)) ||
        (st = ctx_real(slo, "budget_usd_h", 1e9, &ctx->slo.budget_usd_h, err)) ||
        (st = ctx_u32(doc, "seed", 0, UINT32_MAX, &seed, err)) ||
        (st = ctx_u32(doc, "replications", 1, 100, &reps, err)) ||
        (st = ctx_real(doc, "duration_s", 3600, &ctx->duration_s, err)))
        return st;
    /* Traces written before the cap was recorded planned without one. */
    if (json_object_get(doc, "max_tp") &&
        (st = ctx_u32(doc, "max_tp", 0, 65536, &ctx->request.max_tp, err)))
        return st;
    if (w->context && w->prompt_tokens > w->context)
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded prompt_tokens (%u) exceeds the context (%u)",
                          w->prompt_tokens, w->context);
    ctx->seed = seed;
    ctx->replications = reps;
    ctx->request.fallbacks = json_is_true(json_object_get(doc, "fallbacks"));
    return PX_OK;
}

static px_status model_input(const px_heal_run *h, json_t **out, px_err *err)
{
    px_digest d;
    char hex[65];
    px_status st = px_sha256_file(h->o.model_path, &d, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "trace: hashing the model %s: ", h->o.model_path);
    px_digest_hex(&d, hex);
    *out = json_pack("{s:s, s:s, s:s}", "source", "file", "path", h->o.model_path, "sha256", hex);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "trace: out of memory");
}

/* The contract as the planner's trace records it: implied, built in by
 * name, or the file's document. */
static json_t *contract_input(const px_heal_run *h)
{
    const char *spec = h->o.contract_spec;
    if (!spec)
        return json_pack("{s:s}", "source", "implied");
    px_contract *c = NULL;
    if (px_contract_builtin(spec, &c, NULL) == PX_OK) {
        px_contract_free(c);
        return json_pack("{s:s, s:s}", "source", "builtin", "name", spec);
    }
    json_t *doc = NULL;
    if (px_json_load_file(spec, NULL, &doc, NULL) != PX_OK)
        return json_pack("{s:s, s:s}", "source", "builtin", "name", spec);
    return json_pack("{s:s, s:o}", "source", "file", "document", doc);
}

static json_t *options_input(const px_heal_run *h)
{
    const px_heal_run_opts *o = &h->o;
    json_t *injects = json_array();
    for (size_t i = 0; injects && i < o->n_injects; i++)
        json_array_append_new(injects, px_heal_inject_to_json(&o->injects[i]));
    json_t *prompts = json_array();
    for (uint32_t i = 0; prompts && o->prompts && i < o->n_prompts; i++)
        json_array_append_new(prompts, json_string(o->prompts[i]));
    return json_pack("{s:b, s:i, s:f, s:o, s:f, s:i, s:f, s:o, s:o, s:i, s:I}", "heal", o->heal,
                     "audit_every", (int)o->audit_every, "audit_tolerance", o->audit_tolerance,
                     "detector", px__hr_detector_opts_json(&o->detector), "deadline_floor_s",
                     o->step_deadline_floor_s, "canary_steps", (int)o->canary_steps,
                     "canary_tolerance", o->canary_tolerance, "injects",
                     injects ? injects : json_array(), "prompts", prompts ? prompts : json_array(),
                     "max_new_tokens", (int)o->max_new_tokens, "seed", (json_int_t)o->seed);
}

px_status px__hr_record_inputs(px_heal_run *h, px_err *err)
{
    px_trace_writer *w = h->o.trace;
    px_status st = PX_OK;
    json_t *model = NULL, *contract = NULL, *ctx = NULL, *opts = NULL;
    if (!h->o.planned) {
        /* Without a planning decision the planner's inputs are recorded
         * here, as the heal decisions need them. */
        if (h->o.inventory_doc &&
            (st = px_trace_input(w, "inventory", h->o.inventory_doc, NULL, err)) != PX_OK)
            goto done;
        if ((st = model_input(h, &model, err)) != PX_OK ||
            (st = px_trace_input(w, "model", model, NULL, err)) != PX_OK)
            goto done;
        contract = contract_input(h);
        if (!contract || (st = px_trace_input(w, "contract", contract, NULL, err)) != PX_OK)
            goto done;
    }
    ctx = px__hr_context_json(&h->ctx);
    opts = options_input(h);
    if (!ctx || !opts) {
        st = px_err_set(err, PX_ENOMEM, "trace: out of memory");
        goto done;
    }
    if ((st = px_trace_input(w, "heal.context", ctx, NULL, err)) != PX_OK ||
        (st = px_trace_input(w, "heal.options", opts, NULL, err)) != PX_OK ||
        (st = px_trace_input(w, "heal.plan", h->plan, NULL, err)) != PX_OK)
        goto done;
done:
    if (st == PX_OK && !contract && !h->o.planned)
        st = px_err_set(err, PX_ENOMEM, "trace: out of memory");
    json_decref(model);
    json_decref(contract);
    json_decref(ctx);
    json_decref(opts);
    return st;
}

/* ---- incidents ---- */

/* The injected fault the incident is most likely about: the latest one
 * on the device (or link) found, else the latest of all. */
static const json_t *matching_fault(const px_heal_run *h, const px_heal_locus *where)
{
    const json_t *best = NULL;
    size_t n = json_array_size(h->recent_faults);
    for (size_t i = n; i-- > 0;) {
        const json_t *f = json_array_get(h->recent_faults, i);
        const char *dev = json_string_value(json_object_get(f, "device"));
        if (dev && dev[0] && where->device[0] && strstr(where->device, dev))
            return f;
        if (!best)
            best = f;
    }
    return best;
}

static json_t *timeline_event(double t, const char *what)
{
    return json_pack("{s:f, s:s}", "t_s", t, "event", what);
}

void px__hr_incident_event(px_heal_run *h, const char *what)
{
    if (h->timeline)
        json_array_append_new(h->timeline, timeline_event(px__hr_now(h), what));
}

static const char *detector_of(px_heal_fault_class cls, const char *kind)
{
    if (cls == PX_HEAL_CORRUPTION)
        return "audit";
    if (strcmp(kind, "recovery") != 0)
        return "envelope";
    return cls == PX_HEAL_HANG ? "step-timeout" : "heartbeat";
}

void px__hr_incident_open(px_heal_run *h, const char *kind, px_heal_fault_class cls,
                          const px_heal_locus *where, const json_t *decision, const char *evidence)
{
    json_decref(h->incident);
    json_decref(h->timeline);
    h->timeline = json_array();
    h->sum.incidents++;
    char id[32];
    snprintf(id, sizeof id, "incident-%u", ++h->n_incident_ids);
    const json_t *fault = matching_fault(h, where);
    double t_inj = fault ? json_number_value(json_object_get(fault, "t_s")) : h->t_detect_s;
    json_int_t inj_step = fault ? json_integer_value(json_object_get(fault, "step")) : -1;
    double ttd = h->t_detect_s - t_inj;
    h->sum.last_detect_s = ttd;
    if (fault) {
        char line[320];
        snprintf(line, sizeof line, "injected %s",
                 json_string_value(json_object_get(fault, "spec")));
        json_array_append_new(h->timeline, timeline_event(t_inj, line));
    }
    json_array_append_new(h->timeline, timeline_event(h->t_detect_s, evidence));
    const json_t *cands = json_object_get(decision, "candidates");
    json_int_t pick = decision ? json_integer_value(json_object_get(decision, "chosen")) : -1;
    if (!json_is_integer(json_object_get(decision, "chosen")))
        pick = -1;
    const json_t *c = pick >= 0 ? json_array_get(cands, (size_t)pick) : NULL;
    const char *action = c ? json_string_value(json_object_get(c, "action")) : "none";
    const char *label = c ? json_string_value(json_object_get(c, "label")) : "nothing chosen";
    char why[256];
    if (c)
        snprintf(why, sizeof why,
                 "the safest accepted candidate: it met the contract and the limits under the "
                 "conditions observed, with the largest simulated margin");
    else
        snprintf(why, sizeof why, "no candidate was accepted or none could be made");
    bool staged = where->kind == PX_HEAL_AT_DEVICE || where->kind == PX_HEAL_AT_COMPUTE ||
                  where->kind == PX_HEAL_AT_LINK;
    uint64_t first_seq = fault && h->o.trace ? h->last_fault_seq
                                             : (h->o.trace ? px_trace_writer_count(h->o.trace) : 0);
    h->trace_seq_first = first_seq;
    h->t_inject_s = t_inj;
    h->incident = json_pack(
        "{s:s, s:s, s:s, s:{s:s, s:O}, s:{s:s, s:o, s:s, s:{s:f, s:o}}, s:{s:s, s:f, s:f}, "
        "s:{s:s, s:o, s:o, s:s, s:s}, s:o, s:{s:I, s:s, s:s, s:s}, s:{s:i, s:n, s:n, s:s}, s:n, "
        "s:{s:n}, s:{s:n}, s:n, s:n}",
        "schema", PX_HEAL_INCIDENT_SCHEMA, "id", id, "kind", kind, "cause", "class",
        px_heal_fault_class_name(cls), "inject",
        fault ? json_object_get(fault, "inject") : json_null(), "signature", "class",
        px_heal_fault_class_name(cls), "locus", px_heal_locus_to_json(where), "evidence", evidence,
        "onset", "t_s", t_inj, "step", inj_step >= 0 ? json_integer(inj_step) : json_null(),
        "detection", "detector", detector_of(cls, kind), "detected_at_s", h->t_detect_s,
        "time_to_detect_s", ttd, "localization", "kind", px_heal_locus_kind_name(where->kind),
        "stage", staged ? json_integer(where->stage) : json_null(), "to",
        where->kind == PX_HEAL_AT_LINK ? json_integer(where->to) : json_null(), "device",
        where->device[0] ? where->device : "", "evidence", evidence, "candidates",
        cands ? json_deep_copy(cands) : json_array(), "choice", "index", (json_int_t)pick, "action",
        action ? action : "none", "label", label && label[0] ? label : "unnamed", "why", why,
        "canary", "steps", 0, "predicted_p50_s", "observed_p50_s", "verdict", "none", "rollback",
        "predicted", "tpot_s", "realized", "tpot_s", "rto_s", "rpo_tokens");
    if (h->incident) {
        px_json_set(h->incident, "timeline", json_incref(h->timeline));
        px_json_set(h->incident, "lost_work",
                    json_pack("{s:i, s:i, s:f}", "tokens", 0, "steps", 0, "seconds", 0.0));
    }
}

void px__hr_incident_close(px_heal_run *h, const char *outcome, double realized_s)
{
    if (!h->incident)
        return;
    json_t *inc = h->incident;
    h->incident = NULL;
    px__hr_incident_event(h, outcome);
    px_json_set(inc, "outcome", json_string(outcome));
    const json_t *c = json_object_get(inc, "canary");
    if (json_is_number(json_object_get(c, "predicted_p50_s")))
        px__heal_set_num(json_object_get(inc, "predicted"), "tpot_s",
                         json_number_value(json_object_get(c, "predicted_p50_s")));
    px__heal_set_num(json_object_get(inc, "realized"), "tpot_s", realized_s);
    /* Lost work and RPO from the rebuild: replayed steps are work done
     * again; dropped tokens were shown and taken back (the RPO). */
    const json_t *rb = json_object_get(inc, "rebuild");
    json_int_t rs = json_integer_value(json_object_get(rb, "steps_replayed"));
    json_int_t rt = json_integer_value(json_object_get(rb, "tokens_replayed"));
    json_int_t ds = json_integer_value(json_object_get(rb, "steps_dropped"));
    json_int_t dt = json_integer_value(json_object_get(rb, "tokens_dropped"));
    double secs = json_number_value(json_object_get(rb, "seconds"));
    double stalled = h->t_detect_s - h->t_inject_s;
    if (rb) {
        /* The generation's step log is the durable point: every token
         * kept was replayed and every token taken back was produced
         * again, so none is lost for good (RPO 0); what was taken back
         * and recomputed is lost work. */
        px_json_set(inc, "rpo_tokens", json_integer(0));
        px_json_set(inc, "taken_back_tokens", json_integer(dt));
        px_json_set(inc, "lost_work",
                    json_pack("{s:I, s:I, s:f}", "tokens", rt + dt, "steps", rs + ds, "seconds",
                              secs + (stalled > 0 ? stalled : 0)));
    }
    json_t *tl = json_object_get(inc, "timeline");
    if (!json_array_size(tl))
        json_array_append_new(tl, timeline_event(px__hr_now(h), outcome));
    const char *trace = h->o.trace_path;
    char cmd[512];
    if (trace)
        snprintf(cmd, sizeof cmd, "plexus replay %s", trace);
    else
        snprintf(cmd, sizeof cmd, "%s --trace FILE",
                 h->o.command ? h->o.command : "plexus run ... (with the same --inject)");
    px_json_set(
        inc, "reproducer",
        json_pack("{s:s?, s:o, s:o, s:s}", "trace", trace, "first_seq",
                  trace ? json_integer((json_int_t)h->trace_seq_first) : json_null(), "last_seq",
                  trace && h->o.trace ? json_integer((json_int_t)px_trace_writer_count(h->o.trace))
                                      : json_null(),
                  "command", cmd));
    if (!trace)
        px_json_set(json_object_get(inc, "reproducer"), "trace", json_null());
    json_array_append_new(h->incidents, inc);
    h->sum.recorded = (uint32_t)json_array_size(h->incidents);
    json_decref(h->timeline);
    h->timeline = NULL;
    h->canary_on = false;
}

void px_heal_run_idle(px_heal_run *h)
{
    if (!h->incident || h->pending)
        return;
    px__hr_incident_close(h, "mitigated; the generation went idle before the canary could judge",
                          NAN);
}

px_status px_heal_run_finish(px_heal_run *h, const char *const *texts, size_t n_texts, px_err *err)
{
    if (h->incident) {
        const json_t *c = json_object_get(h->incident, "canary");
        const char *v = json_string_value(json_object_get(c, "verdict"));
        bool passed = v && !strcmp(v, "pass");
        px__hr_incident_close(
            h, passed ? "mitigated" : "mitigated; the run ended before the canary could judge",
            NAN);
    }
    if (!h->o.trace)
        return PX_OK;
    json_t *t = json_array();
    for (size_t i = 0; t && i < n_texts; i++)
        json_array_append_new(t, json_string(texts[i] ? texts[i] : ""));
    json_t *outcome =
        json_pack("{s:o, s:O}", "texts", t ? t : json_array(), "incidents", h->incidents);
    if (!outcome)
        return px_err_set(err, PX_ENOMEM, "trace: out of memory");
    px_status st = px_trace_outcome(h->o.trace, "heal.run", outcome, err);
    json_decref(outcome);
    return st;
}

/* ---- paragraphs ---- */

static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static double num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void add_s(px_strbuf *out, const char *label, double s)
{
    char b[32];
    if (!isfinite(s)) {
        px_strbuf_addf(out, "%s n/a", label);
        return;
    }
    px__heal_fmt_s(s, b, sizeof b);
    px_strbuf_addf(out, "%s %s", label, b);
}

px_status px__hr_incident_text(const json_t *inc, px_strbuf *out)
{
    const json_t *sig = json_object_get(inc, "signature");
    const json_t *det = json_object_get(inc, "detection");
    const json_t *cause = json_object_get(inc, "cause");
    const json_t *loc = json_object_get(inc, "localization");
    const json_t *inj = json_object_get(cause, "inject");
    px_strbuf_addf(out, "\n%s (%s): %s", str(inc, "id"), str(inc, "kind"), str(sig, "class"));
    if (str(loc, "device")[0])
        px_strbuf_addf(out, " at %s", str(loc, "device"));
    if (json_is_integer(json_object_get(loc, "stage")))
        px_strbuf_addf(out, " (stage %lld)", json_integer_value(json_object_get(loc, "stage")));
    px_strbuf_adds(out, ".\n  ");
    if (json_is_object(inj))
        px_strbuf_addf(out, "Injected as %s; ", str(inj, "text")[0] ? str(inj, "text") : "a fault");
    px_strbuf_addf(out, "detected by the %s check ", str(det, "detector"));
    add_s(out, "after", json_number_value(json_object_get(det, "time_to_detect_s")));
    px_strbuf_addf(out, ": %s.\n", str(sig, "evidence"));
    const json_t *cands = json_object_get(inc, "candidates");
    size_t i, acc = 0;
    const json_t *c;
    json_array_foreach(cands, i, c) acc += json_is_true(json_object_get(c, "accepted"));
    const json_t *choice = json_object_get(inc, "choice");
    px_strbuf_addf(out, "  %zu candidate(s), %zu accepted; chosen: %s (%s).\n",
                   json_array_size(cands), acc, str(choice, "label"), str(choice, "action"));
    json_array_foreach(cands, i, c)
    {
        if (json_is_true(json_object_get(c, "accepted")))
            continue;
        px_strbuf_addf(out, "    rejected %s: %s\n", str(c, "label"), str(c, "reject_reason"));
    }
    px_strbuf_adds(out, "  ");
    add_s(out, "Recovered (detection to the first token on the new executor) in",
          num(inc, "recover_s"));
    add_s(out, "; RTO (fault to service restored)", num(inc, "rto_s"));
    const json_t *rpo = json_object_get(inc, "rpo_tokens");
    if (json_is_integer(rpo))
        px_strbuf_addf(out, "; RPO %lld token(s) lost, %lld taken back and produced again",
                       json_integer_value(rpo),
                       json_integer_value(json_object_get(inc, "taken_back_tokens")));
    const json_t *lw = json_object_get(inc, "lost_work");
    px_strbuf_addf(out, "; lost work %lld step(s), %lld token(s), ",
                   json_integer_value(json_object_get(lw, "steps")),
                   json_integer_value(json_object_get(lw, "tokens")));
    add_s(out, "", json_number_value(json_object_get(lw, "seconds")));
    const json_t *rb = json_object_get(inc, "rebuild");
    if (rb)
        px_strbuf_addf(out, "; KV caches rebuilt %s",
                       json_is_true(json_object_get(rb, "identical")) ? "bit for bit"
                                                                      : "with a mismatch");
    px_strbuf_adds(out, ".\n  ");
    const json_t *can = json_object_get(inc, "canary");
    add_s(out, "Predicted (calibrated)", num(json_object_get(inc, "predicted"), "tpot_s"));
    add_s(out, " per token, realized", num(json_object_get(inc, "realized"), "tpot_s"));
    px_strbuf_addf(out, "; canary %s.", str(can, "verdict"));
    const json_t *rbk = json_object_get(inc, "rollback");
    if (json_is_object(rbk))
        px_strbuf_addf(out, " Rolled back (%s): %s.", str(rbk, "to"), str(rbk, "why"));
    px_strbuf_addf(out, " Outcome: %s.\n", str(inc, "outcome"));
    const json_t *rep = json_object_get(inc, "reproducer");
    if (json_is_string(json_object_get(rep, "trace")))
        px_strbuf_addf(out, "  Reproduce: %s (events %lld to %lld).\n", str(rep, "command"),
                       json_integer_value(json_object_get(rep, "first_seq")),
                       json_integer_value(json_object_get(rep, "last_seq")));
    else
        px_strbuf_addf(out, "  Reproduce: %s.\n", str(rep, "command"));
    return PX_OK;
}
