/* Healing real runs: the supervisor of one generation through the
 * executor.  Before each step it injects the faults that are due and sets
 * the step's deadline; after each decode step it feeds the detector, runs
 * the canary of the last change and audits a step now and then; when a
 * step fails it localizes the failure and hands the generation a new
 * executor.  Starting a plan (heal_run_plan.c), deciding what to run
 * (heal_run_act.c), detecting (heal_run_detect.c), auditing
 * (heal_run_audit.c) and recording (heal_run_record.c) live in their own
 * files, which never call back into this one. */
#include "heal/heal_run_impl.h"

#include <signal.h>
#include <sys/types.h>

/* Forward declarations of the supervisor's slots. */
static px_status before_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *next, px_err *err);
static px_status after_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                            px_rt_step_verdict *v, px_err *err);
static px_status recover(void *ud, px_rt_executor *failed, px_status st, const px_err *why,
                         px_rt_executor **replacement, px_err *err);
static void switched(void *ud, px_rt_executor *before, px_rt_executor *now,
                     const px_rt_rebuild_info *info);
static void retracted(void *ud, uint32_t prompt, uint32_t kept);

void px_heal_run_opts_default(px_heal_run_opts *o)
{
    memset(o, 0, sizeof *o);
    px_plan_request_default(&o->request);
    o->heal = true;
    o->audit_tolerance = 1e-3;
    o->seed = 1;
    px_heal_detector_opts_default(&o->detector);
    o->detector.confirm = 4;
    o->step_deadline_floor_s = 0.25;
    o->canary_steps = 4;
    o->canary_tolerance = 3.0;
}

px_status px_heal_run_new(const px_heal_run_opts *o, px_heal_run **out, px_err *err)
{
    *out = NULL;
    if (!o || !o->model || !o->model_path || !o->plan)
        return px_err_set(err, PX_EINVAL, "heal: the run needs a model, its path and a plan");
    if (o->n_prompts > HR_MAX_PROMPTS)
        return px_err_set(err, PX_EINVAL, "heal: at most %d prompts", HR_MAX_PROMPTS);
    /* A plan written by hand may lack the figures validation sizes its
     * load from; the run would then stop at its first fault. */
    if (o->heal && !px__heal_plan_sizes_load(o->plan))
        px_log_warn("heal: the plan has no predicted tpot_s and ttft_s (/predictions/tpot_s/p50, "
                    "/predictions/ttft_s/p50), which healing sizes its checks from: a fault will "
                    "stop the run; plan with plexus plan --out, or give them");
    px_heal_run *h = calloc(1, sizeof *h);
    if (!h)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    h->o = *o;
    h->t0_ns = px_now_ns();
    h->chosen = -1;
    h->last_fault_t_s = -1;
    h->sum.last_detect_s = -1;
    h->sum.last_recover_s = -1;
    h->ctx.graph = o->graph;
    h->ctx.model = o->model;
    h->ctx.contract = o->contract;
    h->ctx.request = o->request;
    h->ctx.request.graph = o->graph;
    h->ctx.request.model = o->model;
    h->ctx.request.contract = o->contract;
    /* A candidate is run, not kept as a plan of record: its own fallbacks
     * and baselines would only cost recovery time. */
    h->ctx.request.fallbacks = false;
    h->ctx.request.compare_baselines = false;
    h->ctx.seed = o->seed;
    /* Short simulations: they stand between a failure and the first token
     * on the new plan (2 x 2 s of simulated serving tell the candidates
     * apart; the planner's intervals already carry the uncertainty). */
    h->ctx.replications = 2;
    h->ctx.duration_s = 2;
    h->sup = (px_rt_supervisor){.before_step = before_step,
                                .after_step = after_step,
                                .recover = recover,
                                .switched = switched,
                                .retracted = retracted,
                                .ud = h};
    px_status st = PX_ENOMEM;
    h->incidents = json_array();
    h->recent_faults = json_array();
    h->plan = json_deep_copy(o->plan);
    h->applied = calloc(o->n_injects ? o->n_injects : 1, sizeof *h->applied);
    if (!h->incidents || !h->recent_faults || !h->plan || !h->applied) {
        px_err_set(err, PX_ENOMEM, "heal: out of memory");
        goto fail;
    }
    if ((st = px_rt_pipeline_spec_from_plan_replica(h->plan, o->graph, "plan", o->replica, &h->spec,
                                                    err)) != PX_OK)
        goto fail;
    /* Every inject must name something of the first plan: a typo is
     * refused before any worker starts. */
    for (size_t i = 0; i < o->n_injects; i++) {
        px_rt_fault f;
        if ((st = px_heal_inject_resolve(&o->injects[i], &h->spec, &f, err)) != PX_OK) {
            char msg[sizeof err->msg];
            px_strlcpy(msg, err ? err->msg : "", sizeof msg);
            px_err_set(err, st,
                       "%s (the plan runs %u stage%s; for a pipeline over several devices pass "
                       "--plan with one from `plexus plan --objective throughput -o json`)",
                       msg, h->spec.n_stages, h->spec.n_stages == 1 ? "" : "s");
            goto fail;
        }
    }
    px_heal_envelope_from_spec(&h->spec, &h->raw_env);
    h->canary_ratio = NAN;
    if (o->audit_every && (st = px__hr_shadow_new(o->model_path, PX_MAX(o->n_prompts, 1u),
                                                  o->executor.context, &h->shadow, err)) != PX_OK)
        goto fail;
    if (o->trace && (st = px__hr_record_inputs(h, err)) != PX_OK)
        goto fail;
    if ((st = px_rt_executor_new(&h->spec, &h->o.executor, &h->ex, err)) != PX_OK)
        goto fail;
    *out = h;
    return PX_OK;
fail:
    px_heal_run_free(h);
    return st;
}

void px_heal_run_free(px_heal_run *h)
{
    if (!h)
        return;
    if (h->pending && h->pending != h->ex)
        px_rt_executor_free(h->pending);
    px_rt_executor_free(h->ex);
    json_decref(h->pending_plan);
    json_decref(h->plan);
    json_decref(h->prev_plan);
    px_heal_detector_free(h->det);
    px_heal_candidates_free(h->cands, h->n_cands);
    json_decref(h->canary_samples);
    json_decref(h->incident);
    json_decref(h->timeline);
    json_decref(h->incidents);
    json_decref(h->recent_faults);
    px__hr_shadow_free(h->shadow);
    free(h->win);
    free(h->applied);
    free(h);
}

const px_rt_supervisor *px_heal_run_supervisor(px_heal_run *h)
{
    return &h->sup;
}

px_rt_executor *px_heal_run_executor(px_heal_run *h)
{
    return h->ex;
}

const json_t *px_heal_run_plan(const px_heal_run *h)
{
    return h->plan;
}

json_t *px_heal_run_incidents(const px_heal_run *h)
{
    return json_deep_copy(h->incidents);
}

void px_heal_run_get_summary(const px_heal_run *h, px_heal_run_summary *out)
{
    *out = h->sum;
}

px_status px_heal_run_report(const px_heal_run *h, px_strbuf *out)
{
    size_t i;
    json_t *inc;
    json_array_foreach(h->incidents, i, inc)
    {
        px_status st = px__hr_incident_text(inc, out);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

/* ---- before a step: injections and the deadline ---- */

static void remember_condition(px_heal_run *h, const px_rt_fault *f)
{
    const px_rt_pipeline_spec *spec = &h->spec;
    if (f->stage >= spec->n_stages)
        return;
    const char *dev = spec->stages[f->stage].device;
    if (f->kind == PX_RT_FAULT_CLEAR) {
        size_t k = 0;
        for (size_t i = 0; i < h->n_conds; i++)
            if (strcmp(h->conds[i].device, dev) != 0)
                h->conds[k++] = h->conds[i];
        h->n_conds = k;
        return;
    }
    if (f->kind != PX_RT_FAULT_LINK && f->kind != PX_RT_FAULT_SLOW &&
        f->kind != PX_RT_FAULT_CORRUPT && f->kind != PX_RT_FAULT_MEMORY)
        return;
    if (h->n_conds == HR_MAX_CONDS)
        return;
    hr_cond *c = &h->conds[h->n_conds++];
    memset(c, 0, sizeof *c);
    c->fault = *f;
    px_strlcpy(c->device, dev, sizeof c->device);
    bool last = f->stage + 1 == spec->n_stages;
    px_strlcpy(c->link_to, last ? "executor" : spec->stages[f->stage + 1].device,
               sizeof c->link_to);
}

static px_status inject_due(px_heal_run *h, px_rt_executor *ex, uint64_t step, px_err *err)
{
    for (size_t i = 0; i < h->o.n_injects; i++) {
        const px_heal_inject *in = &h->o.injects[i];
        if (h->applied[i] || in->at_token > h->tokens_out)
            continue;
        h->applied[i] = true;
        px_rt_fault f;
        px_err e;
        px_status st = px_heal_inject_resolve(in, &h->spec, &f, &e);
        bool resolved = st == PX_OK;
        if (st == PX_OK)
            st = px_rt_executor_inject(ex, &f, &e);
        double t = px__hr_now(h);
        const char *dev =
            st == PX_OK && f.stage < h->spec.n_stages ? h->spec.stages[f.stage].device : "";
        json_t *rec = json_pack("{s:o, s:s, s:s, s:I, s:I, s:f, s:s}", "inject",
                                px_heal_inject_to_json(in), "spec", in->text, "device", dev, "step",
                                (json_int_t)step, "tokens_out", (json_int_t)h->tokens_out, "t_s", t,
                                "result", st == PX_OK ? "injected" : e.msg);
        if (rec && st == PX_OK) {
            px_json_set(rec, "stage", json_integer(f.stage));
            json_array_append(h->recent_faults, rec);
        }
        if (h->o.trace && rec) {
            h->last_fault_seq = px_trace_writer_count(h->o.trace) + 1;
            px_status ts = px_trace_fault(h->o.trace, "inject", rec, err);
            if (ts != PX_OK) {
                json_decref(rec);
                return ts;
            }
        }
        json_decref(rec);
        if (st != PX_OK) {
            /* A target the plan no longer has (it moved away) is not an
             * error of the run: the fault is reported as not applied.  A
             * stage that failed to apply it (a memory fault its device
             * cannot hold) has ended: the failure of the next step is
             * blamed on it. */
            if (resolved && f.kind == PX_RT_FAULT_MEMORY && f.stage < h->spec.n_stages) {
                px_strlcpy(h->inject_error, e.msg, sizeof h->inject_error);
                h->inject_error_stage = (int)f.stage;
            }
            px_log_warn("heal: %s not injected: %s", in->text, e.msg);
            continue;
        }
        h->sum.injected++;
        h->last_fault_t_s = t;
        remember_condition(h, &f);
    }
    return PX_OK;
}

static px_status before_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *next, px_err *err)
{
    px_heal_run *h = ud;
    h->tokens_out = next->tokens_out;
    if (h->shadow)
        px__hr_shadow_note(h->shadow, next);
    px_status st = inject_due(h, ex, next->index, err);
    if (st != PX_OK)
        return st;
    px_rt_executor_set_step_timeout(ex, h->deadline_ms > 0 ? h->deadline_ms : 0);
    return PX_OK;
}

/* ---- changing executors ---- */

/* Kills every worker of a failed executor that still runs (a stopped one
 * never answers a shutdown), so that freeing it does not wait. */
static void kill_workers(px_rt_executor *ex)
{
    px_rt_executor_kill_stages(ex);
}

static void reset_window(px_heal_run *h)
{
    /* A new plan has its own pace: its deadline waits for its baseline
     * (until then the executor's own timeout holds). */
    h->deadline_ms = 0;
    h->n_win = 0;
    h->calibrated = false;
    px_heal_detector_free(h->det);
    h->det = NULL;
}

/* The envelope holds for the rows per step it was calibrated with: when
 * a serving batch grows or shrinks past a factor of two every stage's
 * time changes, and no fault is to blame.  Such a step (*s, just
 * recorded) leaves the window, so the detector never sees it; once the
 * new batch has lasted a baseline's worth of steps the window starts over
 * with it and the envelope is calibrated again.  Returns whether *s stays
 * in the window (*s is moved when the window starts over). */
static bool keep_in_window(px_heal_run *h, uint32_t rows, hr_step **s)
{
    if (h->n_win == 1 || !h->win_rows || !rows) {
        if (h->n_win == 1)
            h->win_rows = rows;
        h->off_rows_steps = 0;
        return true;
    }
    if (rows <= 2 * h->win_rows && 2 * rows >= h->win_rows) {
        h->off_rows_steps = 0;
        return true;
    }
    h->n_win--;
    if (++h->off_rows_steps < PX_MAX(h->o.detector.baseline_steps, 1u))
        return false;
    hr_step last = h->win[h->n_win];
    px_log_info("heal: %u rows per step since step %" PRIu64 " (the envelope's were %u): "
                "calibrating again",
                rows, last.s.step, h->win_rows);
    reset_window(h);
    h->win[0] = last;
    h->n_win = 1;
    h->win_rows = rows;
    h->off_rows_steps = 0;
    *s = &h->win[0];
    return true;
}

static void switched(void *ud, px_rt_executor *before, px_rt_executor *now,
                     const px_rt_rebuild_info *info)
{
    px_heal_run *h = ud;
    if (before && before != now) {
        if (before == h->ex) {
            /* A healthy executor left for another shuts down cleanly; a
             * failed one's workers are killed first. */
            bool failed = px_rt_executor_culprit(before) >= 0;
            if (failed)
                kill_workers(before);
        }
        px_rt_executor_free(before);
    }
    h->ex = now;
    if (h->pending == now) {
        h->pending = NULL;
        json_decref(h->plan);
        h->plan = h->pending_plan;
        h->pending_plan = NULL;
        px_err e;
        if (h->o.trace && h->plan && px_trace_input(h->o.trace, "heal.plan", h->plan, NULL, &e))
            px_log_warn("heal: recording the new plan: %s", e.msg);
    }
    const px_rt_pipeline_spec *spec = px_rt_executor_spec(now);
    if (spec)
        h->spec = *spec;
    px_heal_envelope_from_spec(&h->spec, &h->raw_env);
    reset_window(h);
    if (h->incident && info) {
        json_t *rb = json_pack(
            "{s:I, s:I, s:I, s:I, s:f, s:b}", "steps_replayed", (json_int_t)info->steps_replayed,
            "tokens_replayed", (json_int_t)info->tokens_replayed, "steps_dropped",
            (json_int_t)info->steps_dropped, "tokens_dropped", (json_int_t)info->tokens_dropped,
            "seconds", (double)info->ns / 1e9, "identical", info->identical);
        if (rb && !info->identical)
            px_json_set(rb, "first_mismatch_step",
                        json_integer((json_int_t)info->first_mismatch_step));
        px_json_set(h->incident, "rebuild", rb);
        px__hr_incident_event(h, "KV caches rebuilt on the new executor");
    }
    h->sum.switches++;
    h->awaiting_first = true;
}

static void retracted(void *ud, uint32_t prompt, uint32_t kept)
{
    px_heal_run *h = ud;
    if (h->shadow)
        px__hr_shadow_retract(h->shadow, prompt, kept);
    if (h->o.on_retract)
        h->o.on_retract(prompt, kept, h->o.ud);
}

/* ---- a step failed ---- */

static px_status recover(void *ud, px_rt_executor *failed, px_status st, const px_err *why,
                         px_rt_executor **replacement, px_err *err)
{
    px_heal_run *h = ud;
    *replacement = NULL;
    h->t_detect_s = px__hr_now(h);
    /* A fault that follows the run from plan to plan must not make it
     * recover forever. */
    if (h->sum.incidents >= HR_MAX_RECOVERIES)
        return px_err_set(err, st, "%s (giving up after %u incidents)",
                          why ? why->msg : px_status_str(st), h->sum.incidents);
    /* A change handed to the generation and not switched to yet (an
     * adaptation whose new executor waited for the steps in flight) is
     * superseded: the generation dropped it (px_rt_supervisor), and the
     * recovery plans from what runs now, the lost device known.  Its
     * workers may sit on the lost node too: they are killed, not asked
     * to stop. */
    if (h->pending && h->pending != failed && h->pending != h->ex) {
        kill_workers(h->pending);
        px_rt_executor_free(h->pending);
        h->pending = NULL;
        json_decref(h->pending_plan);
        h->pending_plan = NULL;
        if (h->incident)
            px__hr_incident_event(h, "the new executor was dropped before the switch: a step "
                                     "failed on the one that ran");
    }
    if (h->incident)
        px__hr_incident_close(h, "superseded by a failure before its canary ended", NAN);
    json_t *obs = px__hr_failure_json(failed, st, why);
    kill_workers(failed);
    if (!obs)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    char mem_msg[256] = "";
    if (h->inject_error[0]) {
        px_json_set(
            obs, "memory_fault",
            json_pack("{s:i, s:s}", "stage", h->inject_error_stage, "message", h->inject_error));
        px_strlcpy(mem_msg, h->inject_error, sizeof mem_msg);
        h->inject_error[0] = 0;
    }
    px_heal_fault_class cls;
    px_heal_locus where;
    px__hr_classify_failure(obs, &cls, &where);
    h->sum.findings++;
    if (h->o.trace) {
        px_status ts = px_trace_observation(h->o.trace, "heal.failure", obs, err);
        if (ts != PX_OK) {
            json_decref(obs);
            return ts;
        }
    }
    char evidence[320];
    if (mem_msg[0])
        px__heal_textf(evidence, sizeof evidence,
                       "the step failed after a stage ran out of memory: %s", mem_msg);
    else
        px__heal_textf(evidence, sizeof evidence, "the step failed: %s",
                       why ? why->msg : px_status_str(st));
    json_decref(obs);
    if (!h->o.heal) {
        px__hr_incident_open(h, "recovery", cls, &where, NULL, evidence);
        px__hr_incident_close(h, "not mitigated: healing is off (--no-heal)", NAN);
        return px_err_set(err, st, "%s", why ? why->msg : px_status_str(st));
    }
    if (cls == PX_HEAL_DEVICE_LOSS)
        px__hr_add_name(h->lost, &h->n_lost, where.device);
    px_rt_executor *ex =
        px__hr_mitigate(h, "recovery", cls, &where, NULL, "heal.failure", evidence, err);
    if (!ex)
        return px_err_prefix(err, err->code ? err->code : st, "%s; ", why ? why->msg : "");
    /* A recovery never goes back to the plan that failed. */
    json_decref(h->prev_plan);
    h->prev_plan = NULL;
    h->prev_viable = false;
    *replacement = ex;
    return PX_OK;
}

/* ---- after a step ---- */

static px_status record_step(px_heal_run *h, const px_rt_step_obs *obs, hr_step **out, px_err *err)
{
    if (h->n_win == h->cap_win) {
        size_t cap = h->cap_win ? 2 * h->cap_win : 64;
        hr_step *w = realloc(h->win, cap * sizeof *w);
        if (!w)
            return px_err_set(err, PX_ENOMEM, "heal: out of memory");
        h->win = w;
        h->cap_win = cap;
    }
    hr_step *s = &h->win[h->n_win++];
    memset(s, 0, sizeof *s);
    double t = (double)(obs->t_send_ns - h->t0_ns) / 1e9;
    px_heal_sample_from_obs(obs, t, &s->s);
    s->wall_s = (double)obs->wall_ns / 1e9;
    snprintf(s->name, sizeof s->name, "heal.step.%" PRIu64, h->n_steps_recorded++);
    *out = s;
    if (!h->o.trace)
        return PX_OK;
    json_t *j = px__hr_sample_json(&s->s, s->wall_s);
    if (!j)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    px_status st = px_trace_observation(h->o.trace, s->name, j, err);
    json_decref(j);
    return st;
}

static json_t *window_names(const px_heal_run *h)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < h->n_win; i++)
        json_array_append_new(a, json_string(h->win[i].name));
    return a;
}

/* Feeds the step to the detector (made once the baseline is known).
 * Returns true with *f filled on a finding. */
static bool detect(px_heal_run *h, px_heal_finding *f)
{
    if (!h->det) {
        if (h->n_win < h->o.detector.baseline_steps)
            return false;
        px_heal_sample *s = malloc(h->n_win * sizeof *s);
        double *walls = malloc(h->n_win * sizeof *walls);
        if (!s || !walls) {
            free(s);
            free(walls);
            return false;
        }
        for (size_t i = 0; i < h->n_win; i++) {
            s[i] = h->win[i].s;
            walls[i] = h->win[i].wall_s;
        }
        h->calib = px__hr_calibrate(&h->raw_env, s, h->n_win);
        h->baseline_wall_s = px__heal_median(walls, h->n_win);
        px_heal_envelope env;
        px__hr_envelope_scale(&h->raw_env, h->calib, s, h->n_win, &env);
        free(s);
        free(walls);
        /* Worker processes share the machine's cores with everything
         * else: a departure must also exceed one baseline step to count,
         * so that the floor follows the build and the machine's load. */
        h->det_opts = h->o.detector;
        if (h->baseline_wall_s > h->det_opts.floor_s)
            h->det_opts.floor_s = h->baseline_wall_s;
        if (px_heal_detector_new(&env, &h->det_opts, &h->det, NULL) != PX_OK)
            return false;
        h->calibrated = true;
        /* The deadline of a step: ten baseline steps, at least the floor. */
        double dl = PX_MAX(10 * h->baseline_wall_s, h->o.step_deadline_floor_s);
        h->deadline_ms = (int)ceil(dl * 1000);
        bool any = false;
        for (size_t i = 0; i < h->n_win; i++) {
            px_heal_finding tmp;
            if (px_heal_detector_observe(h->det, &h->win[i].s, &tmp)) {
                *f = tmp;
                any = i + 1 == h->n_win;
            }
        }
        return any;
    }
    return px_heal_detector_observe(h->det, &h->win[h->n_win - 1].s, f);
}

static px_heal_hysteresis *hysteresis_for(px_heal_run *h, const char *key)
{
    for (size_t i = 0; i < h->n_hyst; i++)
        if (!strcmp(h->hyst[i].key, key))
            return &h->hyst[i].h;
    size_t i = h->n_hyst < HR_MAX_HYST ? h->n_hyst++ : HR_MAX_HYST - 1;
    px_strlcpy(h->hyst[i].key, key, sizeof h->hyst[i].key);
    px_heal_hysteresis_init(&h->hyst[i].h, h->o.detector.ratio, 0.5 * (1 + h->o.detector.ratio),
                            2.0);
    return &h->hyst[i].h;
}

/* The finding's decision in the trace; then, when it calls for a change
 * the hysteresis lets through, the mitigation. */
static px_status on_finding(px_heal_run *h, const px_heal_finding *live, px_rt_step_verdict *v,
                            px_err *err)
{
    h->sum.findings++;
    h->t_detect_s = px__hr_now(h);
    /* The finding acted on is the one replay recomputes from the
     * recorded steps (the live detector only says when to look). */
    json_t *out = NULL;
    px_heal_finding f;
    px_heal_sample *s = malloc((h->n_win ? h->n_win : 1) * sizeof *s);
    if (!s)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    for (size_t i = 0; i < h->n_win; i++)
        s[i] = h->win[i].s;
    px_status st = px__hr_detect(&h->raw_env, &h->det_opts, s, h->n_win, &f, &out, err);
    free(s);
    if (st != PX_OK)
        return st;
    if (f.cls == PX_HEAL_NONE)
        f = *live;
    if (h->o.trace) {
        json_t *inputs =
            json_pack("{s:o, s:o, s:o}", "envelope", px__hr_envelope_json(&h->raw_env), "detector",
                      px__hr_detector_opts_json(&h->det_opts), "samples", window_names(h));
        st = inputs ? px_trace_decision(h->o.trace, "heal.detect", inputs, out, NULL, err)
                    : px_err_set(err, PX_ENOMEM, "heal: out of memory");
        json_decref(inputs);
    }
    json_decref(out);
    if (st != PX_OK)
        return st;
    px_log_info("heal: %s", f.evidence);
    if (!h->o.heal || f.cls == PX_HEAL_NONE || h->incident)
        return PX_OK;
    char key[160];
    snprintf(key, sizeof key, "%s@%s", px_heal_fault_class_name(f.cls), f.locus.device);
    px_heal_hysteresis *hy = hysteresis_for(h, key);
    if (px_heal_hysteresis_update(hy, h->t_detect_s, f.ratio) != PX_HEAL_HYST_ADAPT) {
        px_log_info("heal: %s: held back by hysteresis", f.evidence);
        return PX_OK;
    }
    json_t *prev = json_deep_copy(h->plan);
    px_rt_executor *ex =
        px__hr_mitigate(h, "adaptation", f.cls, &f.locus, &f, "heal.detect", f.evidence, err);
    if (!ex) {
        json_decref(prev);
        if (err->code != PX_OK)
            px_log_warn("heal: %s", err->msg);
        px_err_clear(err);
        return PX_OK; /* the run goes on as it is */
    }
    json_decref(h->prev_plan);
    h->prev_plan = prev;
    h->prev_viable = true;
    v->switch_to = ex;
    v->keep_steps = UINT64_MAX;
    return PX_OK;
}

static px_status after_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                            px_rt_step_verdict *v, px_err *err)
{
    px_heal_run *h = ud;
    (void)ex;
    if (obs->replay)
        return PX_OK;
    h->steps_seen = obs->index + 1;
    if (h->awaiting_first) {
        h->awaiting_first = false;
        double now = px__hr_now(h);
        h->sum.last_recover_s = now - h->t_detect_s;
        if (h->incident) {
            /* rto_s counts from the fault (the format's definition);
             * recover_s from its detection. */
            px__heal_set_num(h->incident, "rto_s", now - h->t_inject_s);
            px__heal_set_num(h->incident, "recover_s", now - h->t_detect_s);
            px__hr_incident_event(h, "first token on the new executor");
        }
        px__hr_canary_begin(h);
    }
    if (obs->prefill)
        return PX_OK;
    h->decode_steps++;
    hr_step *s = NULL;
    px_status st = record_step(h, obs, &s, err);
    if (st != PX_OK)
        return st;
    bool in_window = keep_in_window(h, obs->n_rows, &s);
    if (obs->audit[0] && h->shadow) {
        h->audit_pending = false;
        if ((st = px__hr_on_audit(h, obs, v, err)) != PX_OK || v->switch_to)
            return st;
    }
    if (h->canary_on) {
        if ((st = px__hr_canary_step(h, s, v, err)) != PX_OK || v->switch_to)
            return st;
    }
    px_heal_finding f;
    if (in_window && detect(h, &f)) {
        if ((st = on_finding(h, &f, v, err)) != PX_OK || v->switch_to)
            return st;
    }
    if (h->o.audit_every && h->shadow && h->decode_steps % h->o.audit_every == 0) {
        v->audit_next = true;
        h->audit_pending = true;
    }
    return PX_OK;
}
