/* Failures, injected faults and plan switches: how the engine takes
 * devices and links out of service, tells the hook, and carries out its
 * action. */
#include "base/common.h"

#include "sim/sim_impl.h"

/* ---- failures, faults and plan switches ---- */

static bool replica_uses(const px__sim_replica_rt *rp, uint32_t d)
{
    for (uint32_t i = 0; i < rp->spec->n_stages; i++)
        for (uint32_t j = 0; j < rp->spec->stages[i].n_devices; j++)
            if (rp->spec->stages[i].devices[j] == d)
                return true;
    return false;
}

static bool replica_healthy(const px_sim *s, const px__sim_replica_rt *rp)
{
    for (uint32_t i = 0; i < rp->spec->n_stages; i++)
        for (uint32_t j = 0; j < rp->spec->stages[i].n_devices; j++)
            if (s->dev[rp->spec->stages[i].devices[j]].dead)
                return false;
    return true;
}

/* Stops a replica's work: its requests fail or go back to the front of
 * the queue, its groups' pending events turn stale. */
static void replica_stop(px_sim *s, uint32_t ri, bool requeue, bool reset_progress)
{
    px__sim_replica_rt *rp = &s->replicas[ri];
    px__sim_occ_touch(s);
    for (uint32_t k = 0; k < rp->n_groups; k++) {
        uint32_t gi = rp->first_group + k;
        px__sim_group *g = &s->groups[gi];
        for (uint32_t i = g->n; i-- > 0;) {
            uint32_t id = g->members[i];
            s->n_active--;
            if (requeue && px__sim_fifo_push(s, id, true)) {
                s->requeued++;
                if (reset_progress) {
                    s->tokens_lost += s->reqs[id].done;
                    s->reqs[id].done = 0;
                }
                continue;
            }
            s->tokens_lost += s->reqs[id].done;
            s->failed++;
            px__sim_free_req(s, id);
        }
        g->n = 0;
        g->gen++;
        g->idle = false;
        for (uint32_t i = 0; i < rp->spec->n_stages; i++) {
            uint32_t link = rp->spec->stages[i].link;
            if (link != PX_SIM_NONE && i + 1 < rp->spec->n_stages) {
                px__sim_ps *d = &s->ps[rp->ps_base + link].ps;
                uint32_t before_n = d->n;
                px__sim_ps_advance(d, s->now);
                px__sim_ps_remove(d, gi);
                if (d->n != before_n)
                    px__sim_ps_reschedule(s, rp->ps_base + link);
            }
        }
    }
    for (uint32_t i = 0; i < rp->spec->n_stages; i++) {
        px__sim_stage_rt *st = &rp->stages[i];
        if (st->busy != PX_SIM_NONE) {
            /* Release the devices the interrupted computation held. */
            const px_sim_stage *ps = &rp->spec->stages[i];
            for (uint32_t j = 0; j < ps->n_devices; j++) {
                uint32_t d = ps->devices[j];
                px__sim_dev_touch(s, d);
                if (s->dev[d].busy)
                    s->dev[d].busy--;
                px__sim_dev_set_power(s, d);
            }
        }
        st->busy = PX_SIM_NONE;
        st->n = 0;
        st->head = 0;
    }
    if (rp->plan == s->active && rp->alive)
        s->live_capacity -= rp->spec->batch;
}

void px__sim_replica_start(px_sim *s, uint32_t ri)
{
    px__sim_replica_rt *rp = &s->replicas[ri];
    px__sim_occ_touch(s);
    s->live_capacity += rp->spec->batch;
    for (uint32_t k = 0; k < rp->n_groups; k++)
        px__sim_start_step(s, rp->first_group + k);
}

static uint32_t in_flight_on(const px_sim *s, uint32_t ri)
{
    uint32_t n = 0;
    const px__sim_replica_rt *rp = &s->replicas[ri];
    for (uint32_t k = 0; k < rp->n_groups; k++)
        n += s->groups[rp->first_group + k].n;
    return n;
}

/* Takes devices out of service at once (a domain loss takes all its
 * members), tells the hook, and stops the replicas that used them. */
void px__sim_lose_devices(px_sim *s, const uint32_t *devs, uint32_t n, uint32_t domain,
                          bool injected)
{
    bool any = false;
    for (uint32_t i = 0; i < n; i++) {
        px__sim_device_rt *v = &s->dev[devs[i]];
        if (v->dead)
            continue;
        px__sim_dev_touch(s, devs[i]);
        v->dead = true;
        v->lost_at = s->now;
        px__sim_dev_set_power(s, devs[i]);
        s->losses++;
        any = true;
    }
    if (!any)
        return;
    px_sim_fault_event ev = {.t = s->now,
                             .kind = domain == PX_SIM_NONE ? PX_SIM_FAULT_DEVICE_LOSS
                                                           : PX_SIM_FAULT_DOMAIN_LOSS,
                             .device = devs[0],
                             .domain = domain,
                             .injected = injected};
    for (uint32_t ri = 0; ri < s->n_replicas; ri++)
        if (s->replicas[ri].alive && s->replicas[ri].plan == s->active &&
            !replica_healthy(s, &s->replicas[ri]))
            ev.n_in_flight += in_flight_on(s, ri);
    px_sim_action act = {.kind = PX_SIM_ACT_NONE};
    if (s->opt->hooks && s->opt->hooks->on_fault && !s->in_hook) {
        s->in_hook = true;
        s->opt->hooks->on_fault(s->opt->hooks->ctx, s, &ev, &act);
        s->in_hook = false;
    }
    for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
        px__sim_replica_rt *rp = &s->replicas[ri];
        if (!rp->alive || replica_healthy(s, rp))
            continue;
        if (rp->plan == s->active)
            replica_stop(s, ri, act.requeue, true);
        rp->alive = false;
    }
    px__sim_apply_action(s, &act);
    px__sim_wake_idle(s);
}

void px__sim_switch_plan(px_sim *s, uint32_t k)
{
    if (k == s->active || k >= s->n_plans)
        return;
    for (uint32_t ri = 0; ri < s->n_replicas; ri++)
        if (s->replicas[ri].plan == s->active && s->replicas[ri].alive)
            replica_stop(s, ri, true, true);
    s->active = k;
    s->switches++;
    for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
        px__sim_replica_rt *rp = &s->replicas[ri];
        if (rp->plan != k)
            continue;
        for (uint32_t i = 0; i < rp->spec->n_stages; i++)
            for (uint32_t j = 0; j < rp->spec->stages[i].n_devices; j++) {
                uint32_t d = rp->spec->stages[i].devices[j];
                if (!s->dev[d].allocated) {
                    px__sim_dev_touch(s, d);
                    s->dev[d].allocated = true;
                    px__sim_dev_set_power(s, d);
                }
            }
        rp->alive = replica_healthy(s, rp);
    }
    for (uint32_t ri = 0; ri < s->n_replicas; ri++)
        if (s->replicas[ri].plan == k && s->replicas[ri].alive)
            px__sim_replica_start(s, ri);
}

void px__sim_apply_action(px_sim *s, const px_sim_action *act)
{
    switch (act->kind) {
    case PX_SIM_ACT_SWITCH_PLAN:
        if (act->install && s->opt->hooks && s->opt->hooks->version >= 2) {
            uint32_t k = px__sim_install_plan(s, act->install);
            if (k != PX_SIM_NONE)
                (void)px__sim_push(s, s->now + (act->delay_s > 0 ? act->delay_s : 0),
                                   PX__SIM_EV_SWITCH, k, 0);
        } else if (act->plan < s->opt->n_fallbacks && act->plan + 1 < s->n_plans)
            (void)px__sim_push(s, s->now + (act->delay_s > 0 ? act->delay_s : 0), PX__SIM_EV_SWITCH,
                               act->plan + 1, 0);
        break;
    case PX_SIM_ACT_DROP_DEVICE:
        if (act->device < s->plans[0]->n_devices) {
            s->in_hook = true; /* a drop is not a new fault to react to */
            px__sim_lose_devices(s, &act->device, 1, PX_SIM_NONE, true);
            s->in_hook = false;
        }
        break;
    case PX_SIM_ACT_PACE:
        s->pace = act->max_batch ? act->max_batch : UINT32_MAX;
        break;
    default:
        break;
    }
}

static void recover_device(px_sim *s, uint32_t d)
{
    px__sim_device_rt *v = &s->dev[d];
    if (!v->dead)
        return;
    px__sim_dev_touch(s, d);
    v->dead = false;
    px__sim_dev_set_power(s, d);
    for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
        px__sim_replica_rt *rp = &s->replicas[ri];
        if (rp->alive || !replica_uses(rp, d) || !replica_healthy(s, rp))
            continue;
        rp->alive = true;
        if (rp->plan == s->active)
            px__sim_replica_start(s, ri);
    }
}

/* Calls fn on every device a thermal or power-cap target names. */
static void set_device_figure(px_sim *s, const px_sim_fault *f, bool on)
{
    uint32_t n = (uint32_t)s->plans[0]->n_devices;
    bool all = !strcmp(f->target, "*");
    for (uint32_t d = 0; d < n; d++) {
        if (!all && strcmp(s->plans[0]->devices[d].id, f->target))
            continue;
        px__sim_dev_touch(s, d);
        if (f->kind == PX_SIM_FAULT_THERMAL)
            s->dev[d].ambient_k = on ? f->ambient_k : s->opt->ambient_k;
        else
            s->dev[d].cap_w = on ? f->power_limit_w : 0;
        px__sim_dev_set_power(s, d);
    }
}

/* Degradation on or off for every hop the link target names. */
static void set_link(px_sim *s, const px_sim_fault *f, bool on)
{
    char a[PX_SIM_ID_LEN];
    const char *gt = strchr(f->target, '>');
    if (!gt)
        return;
    size_t la = (size_t)(gt - f->target);
    if (la >= sizeof a)
        return;
    memcpy(a, f->target, la);
    a[la] = 0;
    uint32_t da = px__sim_find_device(s->plans[0], a);
    uint32_t db = px__sim_find_device(s->plans[0], gt + 1);
    for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
        px__sim_replica_rt *rp = &s->replicas[ri];
        for (uint32_t i = 0; i + 1 < rp->spec->n_stages; i++) {
            const px_sim_stage *st = &rp->spec->stages[i];
            if (st->link == PX_SIM_NONE || st->next_device != db)
                continue;
            bool has = false;
            for (uint32_t j = 0; j < st->n_devices; j++)
                has |= st->devices[j] == da;
            if (!has)
                continue;
            px__sim_ps_rt *p = &s->ps[rp->ps_base + st->link];
            p->factor = on ? f->bandwidth_factor : 1.0;
            p->latency_add = on ? f->latency_s : 0;
            px__sim_ps_set_bandwidth(&p->ps, s->now, p->base_bw * p->factor);
            px__sim_ps_reschedule(s, rp->ps_base + st->link);
        }
    }
}

/* The device a FROM>TO target starts at. */
static uint32_t link_source(const px_sim *s, const px_sim_fault *f)
{
    char a[PX_SIM_ID_LEN];
    const char *gt = strchr(f->target, '>');
    size_t la = gt ? (size_t)(gt - f->target) : 0;
    if (!gt || la >= sizeof a)
        return PX_SIM_NONE;
    memcpy(a, f->target, la);
    a[la] = 0;
    return px__sim_find_device(s->plans[0], a);
}

/* Tells the hook about a fault that stops nothing (a degradation) and
 * carries out its action. */
static void notify(px_sim *s, px_sim_fault_kind kind, uint32_t device, bool injected)
{
    if (!s->opt->hooks || !s->opt->hooks->on_fault || s->in_hook)
        return;
    px_sim_fault_event ev = {
        .t = s->now, .kind = kind, .device = device, .domain = PX_SIM_NONE, .injected = injected};
    px_sim_action act = {.kind = PX_SIM_ACT_NONE};
    s->in_hook = true;
    s->opt->hooks->on_fault(s->opt->hooks->ctx, s, &ev, &act);
    s->in_hook = false;
    px__sim_apply_action(s, &act);
}

void px__sim_lose_domain(px_sim *s, uint32_t dom, bool injected)
{
    uint32_t n = 0;
    for (uint32_t d = 0; d < s->plans[0]->n_devices; d++)
        for (uint32_t k = 0; k < s->plans[0]->devices[d].n_domains; k++)
            if (s->plans[0]->devices[d].domains[k] == dom) {
                s->scratch[n++] = d;
                break;
            }
    if (n)
        px__sim_lose_devices(s, s->scratch, n, dom, injected);
}

void px__sim_fault_start(px_sim *s, uint32_t fi)
{
    const px_sim_fault *f = &s->faults->items[fi];
    double until = f->duration_s > 0 ? s->now + f->duration_s : INFINITY;
    switch (f->kind) {
    case PX_SIM_FAULT_DEVICE_LOSS: {
        uint32_t d = px__sim_find_device(s->plans[0], f->target);
        px__sim_lose_devices(s, &d, 1, PX_SIM_NONE, true);
        break;
    }
    case PX_SIM_FAULT_DOMAIN_LOSS: {
        px__sim_lose_domain(s, px__sim_find_domain(s->plans[0], f->target), true);
        break;
    }
    case PX_SIM_FAULT_LINK_DEGRADE:
        set_link(s, f, true);
        if (f->period_s > 0 && f->duty < 1)
            (void)px__sim_push(s, s->now + f->period_s * f->duty, PX__SIM_EV_LINK_TOGGLE, fi, 0);
        notify(s, f->kind, link_source(s, f), true);
        break;
    default:
        set_device_figure(s, f, true);
        notify(s, f->kind, px__sim_find_device(s->plans[0], f->target), true);
        break;
    }
    if (until < s->end)
        (void)px__sim_push(s, until, PX__SIM_EV_FAULT_END, fi, 0);
}

void px__sim_fault_end(px_sim *s, uint32_t fi)
{
    const px_sim_fault *f = &s->faults->items[fi];
    switch (f->kind) {
    case PX_SIM_FAULT_DEVICE_LOSS:
        recover_device(s, px__sim_find_device(s->plans[0], f->target));
        break;
    case PX_SIM_FAULT_DOMAIN_LOSS: {
        uint32_t dom = px__sim_find_domain(s->plans[0], f->target);
        for (uint32_t d = 0; d < s->plans[0]->n_devices; d++)
            for (uint32_t k = 0; k < s->plans[0]->devices[d].n_domains; k++)
                if (s->plans[0]->devices[d].domains[k] == dom)
                    recover_device(s, d);
        break;
    }
    case PX_SIM_FAULT_LINK_DEGRADE:
        set_link(s, f, false);
        break;
    default:
        set_device_figure(s, f, false);
        break;
    }
}

void px__sim_link_toggle(px_sim *s, uint32_t fi, bool on)
{
    const px_sim_fault *f = &s->faults->items[fi];
    double fault_end_t = f->duration_s > 0 ? f->at_s + f->duration_s : INFINITY;
    if (s->now >= fault_end_t)
        return;
    set_link(s, f, on);
    double next = s->now + f->period_s * (on ? f->duty : 1 - f->duty);
    if (next < fault_end_t && next < s->end)
        (void)px__sim_push(s, next, PX__SIM_EV_LINK_TOGGLE, fi, on ? 0 : 1);
}
