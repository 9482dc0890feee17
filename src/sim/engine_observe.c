/* Observation for version 2 hooks: what an operator could see every tick
 * (step and transfer times against the plan's predictions, temperatures,
 * heartbeats, link probes), and plans installed while the run goes on.
 *
 * Nothing here runs unless the hook table asks for ticks, so runs without
 * self-healing keep their speed and their exact event sequence. */
#include "base/common.h"

#include "sim/sim_impl.h"

/* Probes are this large: big enough that bandwidth, not latency, shows. */
#define PROBE_BYTES (1024.0 * 1024.0)

static uint32_t plan_stages(const px_sim_plan *p)
{
    uint32_t n = 0;
    for (size_t r = 0; r < p->n_replicas; r++)
        n += p->replicas[r].n_stages;
    return n;
}

static bool grow_obs(px_sim *s, const px_sim_plan *p)
{
    uint32_t ns = plan_stages(p);
    if (ns > s->cap_obs_stages) {
        px_sim_obs_stage *a = realloc(s->obs_stages, ns * sizeof *a);
        if (!a)
            return false;
        s->obs_stages = a;
        s->cap_obs_stages = ns;
    }
    uint32_t nl = (uint32_t)(s->plans[0]->n_links + p->n_links);
    if (nl > s->cap_obs_links) {
        px_sim_obs_link *a = realloc(s->obs_links, (nl ? nl : 1) * sizeof *a);
        if (!a)
            return false;
        s->obs_links = a;
        s->cap_obs_links = nl;
    }
    return true;
}

px_status px__sim_observe_init(px_sim *s)
{
    size_t nd = s->plans[0]->n_devices ? s->plans[0]->n_devices : 1;
    s->obs_devices = calloc(nd, sizeof *s->obs_devices);
    if (!s->obs_devices)
        return PX_ENOMEM;
    for (uint32_t k = 0; k < s->n_plans; k++)
        if (!grow_obs(s, s->plans[k]))
            return PX_ENOMEM;
    for (uint32_t ri = 0; ri < s->n_replicas; ri++)
        for (uint32_t i = 0; i < s->replicas[ri].spec->n_stages; i++)
            s->replicas[ri].stages[i].last_step_t = -1;
    return PX_OK;
}

void px__sim_observe_release(px_sim *s)
{
    free(s->obs_stages);
    free(s->obs_devices);
    free(s->obs_links);
    s->obs_stages = NULL;
    s->obs_devices = NULL;
    s->obs_links = NULL;
}

/* ---- plans installed during the run ---- */

uint32_t px__sim_install_plan(px_sim *s, const px_sim_plan *p)
{
    for (uint32_t k = 0; k < s->n_plans; k++)
        if (s->plans[k] == p)
            return k;
    if (s->n_plans >= PX_ARRAY_LEN(s->plans) || p->n_devices != s->plans[0]->n_devices ||
        p->n_replicas == 0)
        return PX_SIM_NONE;
    uint32_t add_grp = 0, add_cap = 0, add_rep = (uint32_t)p->n_replicas;
    for (size_t r = 0; r < p->n_replicas; r++) {
        uint32_t m = p->replicas[r].micro_batches ? p->replicas[r].micro_batches : 1;
        if (m > p->replicas[r].batch)
            m = p->replicas[r].batch;
        if (m == 0 || p->replicas[r].n_stages == 0)
            return PX_SIM_NONE;
        add_grp += m;
        add_cap += p->replicas[r].batch;
    }
    /* Grow every pool first; the counts change only once all succeeded. */
    uint32_t nr = s->n_replicas + add_rep, ng = s->n_groups + add_grp;
    uint32_t np = s->n_ps + (uint32_t)p->n_links;
    px__sim_replica_rt *reps = realloc(s->replicas, nr * sizeof *reps);
    if (!reps)
        return PX_SIM_NONE;
    s->replicas = reps;
    px__sim_group *grps = realloc(s->groups, ng * sizeof *grps);
    if (!grps)
        return PX_SIM_NONE;
    s->groups = grps;
    uint32_t *stack = realloc(s->idle_stack, ng * sizeof *stack);
    if (!stack)
        return PX_SIM_NONE;
    s->idle_stack = stack;
    px__sim_ps_rt *ps = realloc(s->ps, (np ? np : 1) * sizeof *ps);
    if (!ps)
        return PX_SIM_NONE;
    s->ps = ps;
    px__sim_req *reqs = realloc(s->reqs, (s->n_reqs + add_cap) * sizeof *reqs);
    if (!reqs)
        return PX_SIM_NONE;
    s->reqs = reqs;
    uint32_t *fifo = malloc((s->fifo_cap + add_cap) * sizeof *fifo);
    if (!fifo || !grow_obs(s, p)) {
        free(fifo);
        return PX_SIM_NONE;
    }
    memset(&s->replicas[s->n_replicas], 0, add_rep * sizeof *s->replicas);
    memset(&s->groups[s->n_groups], 0, add_grp * sizeof *s->groups);
    memset(&s->ps[s->n_ps], 0, p->n_links * sizeof *s->ps);
    uint32_t k = s->n_plans;
    for (size_t l = 0; l < p->n_links; l++) {
        px__sim_ps_rt *x = &s->ps[s->n_ps + l];
        x->base_bw = p->links[l].bandwidth;
        x->factor = 1;
        if (px__sim_ps_init(&x->ps, x->base_bw, add_grp) != PX_OK)
            goto fail;
    }
    uint32_t gi = s->n_groups;
    for (size_t r = 0; r < p->n_replicas; r++) {
        const px_sim_replica *rs = &p->replicas[r];
        px__sim_replica_rt *rp = &s->replicas[s->n_replicas + r];
        uint32_t m = rs->micro_batches ? rs->micro_batches : 1;
        if (m > rs->batch)
            m = rs->batch;
        rp->plan = k;
        rp->spec = rs;
        rp->first_group = gi;
        rp->n_groups = m;
        rp->ps_base = s->n_ps;
        rp->stages = calloc(rs->n_stages, sizeof *rp->stages);
        if (!rp->stages)
            goto fail;
        for (uint32_t i = 0; i < rs->n_stages; i++) {
            rp->stages[i].busy = PX_SIM_NONE;
            rp->stages[i].cap = m;
            rp->stages[i].last_step_t = -1;
            rp->stages[i].waiting = calloc(m, sizeof *rp->stages[i].waiting);
            if (!rp->stages[i].waiting)
                goto fail;
        }
        for (uint32_t j = 0; j < m; j++, gi++) {
            px__sim_group *g = &s->groups[gi];
            g->plan = k;
            g->replica = s->n_replicas + (uint32_t)r;
            g->cap = (rs->batch + m - 1) / m;
            g->members = calloc(g->cap, sizeof *g->members);
            if (!g->members)
                goto fail;
        }
    }
    /* The request pool and the queue grow by the new plan's capacity. */
    for (uint32_t i = s->n_reqs; i < s->n_reqs + add_cap; i++)
        s->reqs[i].next_free = i + 1 < s->n_reqs + add_cap ? i + 1 : s->free_head;
    if (add_cap)
        s->free_head = s->n_reqs;
    s->n_reqs += add_cap;
    for (uint32_t i = 0; i < s->fifo_n; i++)
        fifo[i] = s->fifo[(s->fifo_head + i) % s->fifo_cap];
    free(s->fifo);
    s->fifo = fifo;
    s->fifo_head = 0;
    s->fifo_cap += add_cap;
    s->n_replicas = nr;
    s->n_groups = ng;
    s->n_ps = np;
    s->plans[s->n_plans++] = p;
    return k;
fail:
    /* Undo the new plan's allocations; the grown arrays stay, unused. */
    for (size_t r = 0; r < p->n_replicas; r++) {
        px__sim_replica_rt *rp = &s->replicas[s->n_replicas + r];
        if (rp->stages)
            for (uint32_t i = 0; i < p->replicas[r].n_stages; i++)
                free(rp->stages[i].waiting);
        free(rp->stages);
    }
    for (uint32_t g = s->n_groups; g < ng; g++)
        free(s->groups[g].members);
    for (size_t l = 0; l < p->n_links; l++)
        px__sim_ps_release(&s->ps[s->n_ps + l].ps);
    free(fifo);
    return PX_SIM_NONE;
}

/* ---- one tick ---- */

static double median(const double *v, uint32_t n_seen)
{
    uint32_t n = n_seen < PX__SIM_OBS_RING ? n_seen : PX__SIM_OBS_RING;
    if (n == 0)
        return NAN;
    double a[PX__SIM_OBS_RING];
    memcpy(a, v, n * sizeof *a);
    for (uint32_t i = 1; i < n; i++) {
        double x = a[i];
        uint32_t j = i;
        for (; j > 0 && a[j - 1] > x; j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
    return n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
}

static uint32_t plan_ps_base(const px_sim *s, uint32_t k)
{
    for (uint32_t ri = 0; ri < s->n_replicas; ri++)
        if (s->replicas[ri].plan == k)
            return s->replicas[ri].ps_base;
    return 0;
}

static void add_links(px_sim *s, uint32_t k, uint32_t *n)
{
    const px_sim_plan *p = s->plans[k];
    uint32_t base = plan_ps_base(s, k);
    for (uint32_t l = 0; l < p->n_links && *n < s->cap_obs_links; l++) {
        const px__sim_ps_rt *x = &s->ps[base + l];
        double share = x->base_bw * x->factor / (x->ps.n + 1);
        s->obs_links[(*n)++] = (px_sim_obs_link){
            .plan = k,
            .link = l,
            .probe_s = x->latency_add + (share > 0 ? PROBE_BYTES / share : INFINITY),
            .nominal_s = x->base_bw > 0 ? PROBE_BYTES / x->base_bw : INFINITY,
            .n_flows = x->ps.n,
        };
    }
}

void px__sim_tick(px_sim *s)
{
    const px_sim_hooks *h = s->opt->hooks;
    uint32_t ns = 0;
    for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
        px__sim_replica_rt *rp = &s->replicas[ri];
        uint32_t first = 0;
        for (uint32_t rj = 0; rj < ri; rj++)
            first += s->replicas[rj].plan == rp->plan;
        for (uint32_t i = 0; i < rp->spec->n_stages; i++) {
            px__sim_stage_rt *st = &rp->stages[i];
            if (rp->plan == s->active && ns < s->cap_obs_stages)
                s->obs_stages[ns++] = (px_sim_obs_stage){
                    .replica = first,
                    .stage = i,
                    .n_steps = st->n_steps,
                    .step_p50_s = median(st->step_s, st->n_steps),
                    .step_ratio_p50 = median(st->step_ratio, st->n_steps),
                    .last_step_t = st->last_step_t,
                    .n_xfers = st->n_xfers,
                    .xfer_p50_s = median(st->xfer_s, st->n_xfers),
                    .xfer_ratio_p50 = median(st->xfer_ratio, st->n_xfers),
                    .link = i + 1 < rp->spec->n_stages ? rp->spec->stages[i].link : PX_SIM_NONE,
                };
            st->n_steps = 0;
            st->n_xfers = 0;
        }
    }
    uint32_t nd = (uint32_t)s->plans[0]->n_devices;
    for (uint32_t d = 0; d < nd; d++) {
        px__sim_device_rt *v = &s->dev[d];
        const px_sim_device *spec = &s->plans[0]->devices[d];
        px__sim_dev_touch(s, d);
        double clock = v->th.throttled ? s->opt->throttle_clock : 1.0;
        if (v->cap_w > 0 && spec->power_active_w > spec->power_idle_w) {
            double f =
                (v->cap_w - spec->power_idle_w) / (spec->power_active_w - spec->power_idle_w);
            clock = f < clock ? f : clock;
        }
        s->obs_devices[d] = (px_sim_obs_device){
            .temp_k = v->th.temp_k,
            .power_w = v->th.power_w,
            .clock = clock < 0.05 ? 0.05 : clock,
            .throttled = v->th.throttled,
            .last_heartbeat_t = v->dead ? v->lost_at : s->now,
        };
    }
    uint32_t nl = 0;
    add_links(s, 0, &nl);
    if (s->active != 0)
        add_links(s, s->active, &nl);
    px_sim_obs obs = {
        .t = s->now,
        .tick_s = h->tick_s,
        .plan = s->plans[s->active],
        .stages = s->obs_stages,
        .n_stages = ns,
        .devices = s->obs_devices,
        .n_devices = nd,
        .links = s->obs_links,
        .n_links = nl,
        .probe_bytes = PROBE_BYTES,
        .tokens = s->tokens,
        .completed = s->completed,
        .failed = s->failed,
        .requeued = s->requeued,
        .tokens_lost = s->tokens_lost,
        .arrivals = s->arrivals,
        .queued = s->fifo_n,
        .in_flight = s->n_active,
    };
    px_sim_action act = {.kind = PX_SIM_ACT_NONE};
    s->in_hook = true;
    h->on_tick(h->ctx, s, &obs, &act);
    s->in_hook = false;
    px__sim_apply_action(s, &act);
    px__sim_wake_idle(s);
    if (s->now + h->tick_s < s->end)
        (void)px__sim_push(s, s->now + h->tick_s, PX__SIM_EV_TICK, 0, 0);
}
