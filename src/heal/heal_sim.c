/* Healing in the simulator: the healer's life cycle and its hook table.
 * on_begin starts each replication over from the primary plan, on_tick
 * observes, detects and acts, on_fault records the ground truth (for
 * scoring only), on_end closes what is open. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

void px_heal_sim_opts_default(px_heal_sim_opts *o)
{
    memset(o, 0, sizeof *o);
    px_plan_request_default(&o->ctx.request);
    o->ctx.seed = 1;
    o->ctx.replications = 1;
    o->ctx.duration_s = 20;
    o->tick_s = 0.5;
    o->heartbeat_timeout_s = 1.5;
    o->switch_s = 2.0;
    o->baseline_ticks = 4;
    o->ratio = 2.0;
    o->confirm = 2;
    o->hysteresis = true;
    o->exit_ratio = 1.3;
    o->min_dwell_s = 20;
    o->hold_s = 10;
    o->thermal_predictive = true;
    o->thermal_horizon_s = 60;
    o->thermal_margin_k = 1;
    o->canary_ticks = 3;
    o->canary_tolerance = 1.5;
    o->heal = true;
}

/* ---- the hooks ---- */

static void reset_replication(px_heal_sim *h, uint32_t replication)
{
    h->replication = replication;
    h->now = 0;
    h->active = h->left = h->target = 0;
    h->phase = PX__HS_NORMAL;
    h->switch_at = -1;
    h->rollback_pending = false;
    memset(h->base, 0, h->n_plans * sizeof *h->base);
    memset(h->step_win, 0, sizeof h->step_win);
    memset(h->xfer_win, 0, sizeof h->xfer_win);
    memset(h->step_dep, 0, sizeof h->step_dep);
    memset(h->xfer_dep, 0, sizeof h->xfer_dep);
    memset(h->lost, 0, h->n_devices * sizeof *h->lost);
    memset(h->hot, 0, h->n_devices * sizeof *h->hot);
    memset(h->n_temp, 0, h->n_devices * sizeof *h->n_temp);
    h->adapted = false;
    memset(&h->probe_win, 0, sizeof h->probe_win);
    h->probe_base = NAN;
    h->n_truth = 0;
    h->n_known = 0;
    h->c_failed = h->c_requeued = h->c_tokens_lost = h->c_tokens = 0;
    json_decref(h->inc);
    h->inc = NULL;
    h->inc_c = NULL;
    h->inc_n = 0;
    h->sum.replications++;
}

static void on_begin(void *ctx, const px_sim *sim, uint32_t replication, uint64_t seed)
{
    (void)sim;
    (void)seed;
    reset_replication(ctx, replication);
}

static void on_fault(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                     px_sim_action *action)
{
    px_heal_sim *h = ctx;
    /* The ground truth, for scoring and for the record of what was
     * injected; decisions come from observation.  Requeueing the requests
     * a lost replica held is the front end's retry policy, not a
     * decision about the fault. */
    action->requeue = true;
    if (h->n_truth < PX__HS_TRUTH)
        h->truth[h->n_truth++] = (px__hs_truth){
            .t = px_sim_now(sim),
            .kind = ev->kind,
            .device = ev->device,
            .domain = ev->domain,
            .injected = ev->injected,
            .failed = h->c_failed,
            .requeued = h->c_requeued,
            .tokens_lost = h->c_tokens_lost,
        };
    h->sum.faults_seen++;
}

static void on_tick(void *ctx, const px_sim *sim, const px_sim_obs *obs, px_sim_action *act)
{
    (void)sim;
    px_heal_sim *h = ctx;
    h->now = obs->t;
    size_t running = px__hs_plan_index(h, obs->plan);
    if (h->phase == PX__HS_SWITCHING && running == h->target) {
        /* The new plan serves: start its windows over and canary it
         * (a rollback to a plan that ran before is not canaried). */
        h->active = running;
        memset(h->step_win, 0, sizeof h->step_win);
        memset(h->xfer_win, 0, sizeof h->xfer_win);
        memset(h->step_dep, 0, sizeof h->step_dep);
        memset(h->xfer_dep, 0, sizeof h->xfer_dep);
        h->phase = h->rollback_pending ? PX__HS_NORMAL : PX__HS_CANARY;
        if (h->inc)
            px__hs_incident_event(h, "the new plan serves from t=%.3f s", h->switch_at);
        if (h->phase == PX__HS_CANARY) {
            const px_sim_plan *p = &h->plans[running]->sim;
            double hi = 1;
            for (size_t r = 0; r < p->n_replicas; r++)
                for (uint32_t i = 0; i < p->replicas[r].n_stages; i++) {
                    const px_sim_stage *s = &p->replicas[r].stages[i];
                    if (s->decode_s > 0 && s->decode_p99_s / s->decode_s > hi)
                        hi = s->decode_p99_s / s->decode_s;
                }
            px_heal_canary_begin(&h->canary, 1.0, hi, h->o.canary_ticks, h->o.canary_tolerance);
        } else if (h->inc) {
            px__hs_incident_close(h, "rolled back: the plan left serves again", false);
        }
        h->rollback_pending = false;
    }
    px__hs_observe(h, obs);
    json_t *tr = px__hs_detect(h, obs);
    if (tr)
        px__hs_handle(h, obs, tr, act);
    else if (h->phase == PX__HS_CANARY)
        px__hs_canary_tick(h, obs, act);
    else if (h->phase == PX__HS_NORMAL)
        px__hs_adapt_tick(h, obs, act);
    json_decref(tr);
    h->c_failed = obs->failed;
    h->c_requeued = obs->requeued;
    h->c_tokens_lost = obs->tokens_lost;
    h->c_tokens = obs->tokens;
}

static void on_end(void *ctx, const px_sim *sim, const px_sim_metrics *m)
{
    (void)m;
    px_heal_sim *h = ctx;
    h->now = px_sim_now(sim);
    if (h->inc)
        px__hs_incident_close(h,
                              h->phase == PX__HS_SWITCHING
                                  ? "the run ended before the new plan served"
                                  : "the run ended during the canary",
                              false);
}

/* ---- life cycle ---- */

px_status px_heal_sim_new(const px_heal_sim_opts *o, px_heal_sim **out, px_err *err)
{
    *out = NULL;
    if (!o || !o->plan || !o->ctx.graph || !o->ctx.model)
        return px_err_set(err, PX_EINVAL,
                          "heal: healing in the simulator needs the plan, the inventory's graph "
                          "and the model (to plan candidates)");
    if (!(o->tick_s > 0 && isfinite(o->tick_s)) || !(o->heartbeat_timeout_s >= o->tick_s) ||
        !(o->switch_s >= 0) || o->baseline_ticks < 1 || o->confirm < 1 || !(o->ratio > 1) ||
        !(o->canary_tolerance > 0) || o->canary_ticks < 1)
        return px_err_set(err, PX_EINVAL,
                          "heal: tick %g s, heartbeat timeout %g s (>= the tick), ratio %g (> 1), "
                          "baseline %u and confirm %u ticks (>= 1): one is out of range",
                          o->tick_s, o->heartbeat_timeout_s, o->ratio, o->baseline_ticks,
                          o->confirm);
    px_heal_sim *h = calloc(1, sizeof *h);
    if (!h)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    h->o = *o;
    /* Candidates are planned as the plan was: its policy, objective and
     * workload, read from the document (so a replay plans the same). */
    h->o.ctx.request.graph = o->ctx.graph;
    h->o.ctx.request.model = o->ctx.model;
    h->o.ctx.request.contract = o->ctx.contract;
    px__hs_request_from_plan(o->plan, &h->o.ctx.request);
    h->incidents = json_array();
    if (!h->incidents)
        goto fail_nomem;
    size_t idx;
    px_status st = px__hs_add_plan(h, json_deep_copy(o->plan), &idx, err);
    if (st != PX_OK) {
        px_heal_sim_free(h);
        return st;
    }
    h->n_devices = h->plans[0]->sim.n_devices;
    size_t nd = h->n_devices ? h->n_devices : 1;
    h->lost = calloc(nd, sizeof *h->lost);
    h->hot = calloc(nd, sizeof *h->hot);
    h->n_temp = calloc(nd, sizeof *h->n_temp);
    h->temp_t = calloc(nd * PX__HS_TEMPS, sizeof *h->temp_t);
    h->temp_k = calloc(nd * PX__HS_TEMPS, sizeof *h->temp_k);
    h->power_w = calloc(nd * PX__HS_TEMPS, sizeof *h->power_w);
    if (!h->lost || !h->hot || !h->n_temp || !h->temp_t || !h->temp_k || !h->power_w)
        goto fail_nomem;
    h->hooks = (px_sim_hooks){.version = PX_SIM_HOOKS_VERSION,
                              .on_fault = on_fault,
                              .ctx = h,
                              .tick_s = o->tick_s,
                              .on_begin = on_begin,
                              .on_tick = on_tick,
                              .on_end = on_end};
    *out = h;
    return PX_OK;
fail_nomem:
    px_heal_sim_free(h);
    return px_err_set(err, PX_ENOMEM, "heal: out of memory");
}

void px_heal_sim_free(px_heal_sim *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n_plans; i++) {
        px_sim_plan_release(&h->plans[i]->sim);
        json_decref(h->plans[i]->doc);
        free(h->plans[i]);
    }
    for (size_t i = 0; i < h->n_cache; i++) {
        free(h->cache[i].key);
        px_heal_candidates_free(h->cache[i].c, h->cache[i].n);
    }
    free(h->cache);
    free(h->base);
    free(h->lost);
    free(h->hot);
    free(h->n_temp);
    free(h->temp_t);
    free(h->temp_k);
    free(h->power_w);
    free(h->inc_tried);
    json_decref(h->inc);
    json_decref(h->incidents);
    free(h);
}

const px_sim_plan *px_heal_sim_plan(const px_heal_sim *h)
{
    return &h->plans[0]->sim;
}

const px_sim_hooks *px_heal_sim_hooks(px_heal_sim *h)
{
    return &h->hooks;
}

px_status px_heal_sim_run(px_heal_sim *h, const px_sim_load *load, const px_sim_faults *faults,
                          const px_sim_options *opt, px_sim_result *out, px_err *err)
{
    px_sim_options o = *opt;
    o.hooks = &h->hooks;
    o.fallbacks = NULL;
    o.n_fallbacks = 0;
    h->failed = false;
    px_err_clear(&h->first_err);
    px_status st = px_sim_run(&h->plans[0]->sim, load, faults, &o, out, err);
    if (st == PX_OK && h->failed) {
        px_sim_result_release(out);
        if (err)
            *err = h->first_err;
        return h->first_err.code;
    }
    return st;
}

json_t *px_heal_sim_incidents(const px_heal_sim *h)
{
    return json_deep_copy(h->incidents);
}

px_status px_heal_sim_report(const px_heal_sim *h, px_strbuf *out)
{
    size_t i;
    const json_t *inc;
    json_array_foreach(h->incidents, i, inc)
    {
        px_status st = px__hs_incident_text(inc, out);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

void px_heal_sim_get_summary(const px_heal_sim *h, px_heal_sim_summary *out)
{
    *out = h->sum;
}
