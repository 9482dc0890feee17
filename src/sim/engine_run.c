/* One replication: sizing the pools, the event loop, and the figures it
 * ends with. */
#include "base/common.h"

#include "sim/sim_impl.h"

/* ---- setup and the loop ---- */

static void sim_free(px_sim *s)
{
    if (s->replicas)
        for (uint32_t ri = 0; ri < s->n_replicas; ri++) {
            px__sim_replica_rt *rp = &s->replicas[ri];
            if (rp->stages)
                for (uint32_t i = 0; i < rp->spec->n_stages; i++)
                    free(rp->stages[i].waiting);
            free(rp->stages);
        }
    free(s->replicas);
    if (s->groups)
        for (uint32_t gi = 0; gi < s->n_groups; gi++)
            free(s->groups[gi].members);
    free(s->groups);
    if (s->ps)
        for (uint32_t p = 0; p < s->n_ps; p++)
            px__sim_ps_release(&s->ps[p].ps);
    free(s->ps);
    free(s->idle_stack);
    free(s->dev);
    free(s->scratch);
    free(s->reqs);
    free(s->fifo);
    free(s->ttft);
    free(s->tpot);
    px__sim_observe_release(s);
    px__sim_queue_release(&s->q);
}

static px_status sim_setup(px_sim *s, px_err *err)
{
    uint32_t n_rep = 0, n_grp = 0, n_ps = 0, total_cap = 0;
    for (uint32_t k = 0; k < s->n_plans; k++) {
        const px_sim_plan *p = s->plans[k];
        n_rep += (uint32_t)p->n_replicas;
        n_ps += (uint32_t)p->n_links;
        for (size_t r = 0; r < p->n_replicas; r++) {
            const px_sim_replica *rs = &p->replicas[r];
            uint32_t m = rs->micro_batches ? rs->micro_batches : 1;
            if (m > rs->batch)
                m = rs->batch;
            n_grp += m;
            total_cap += rs->batch;
        }
    }
    s->n_replicas = n_rep;
    s->n_groups = n_grp;
    s->n_ps = n_ps;
    s->replicas = calloc(n_rep ? n_rep : 1, sizeof *s->replicas);
    s->groups = calloc(n_grp ? n_grp : 1, sizeof *s->groups);
    s->idle_stack = calloc(n_grp ? n_grp : 1, sizeof *s->idle_stack);
    s->ps = calloc(n_ps ? n_ps : 1, sizeof *s->ps);
    s->dev = calloc(s->plans[0]->n_devices ? s->plans[0]->n_devices : 1, sizeof *s->dev);
    s->scratch = calloc(s->plans[0]->n_devices ? s->plans[0]->n_devices : 1, sizeof *s->scratch);
    s->n_reqs = s->opt->queue_limit + total_cap + 1;
    s->reqs = calloc(s->n_reqs, sizeof *s->reqs);
    s->fifo_cap = s->opt->queue_limit + total_cap + 1;
    s->fifo = calloc(s->fifo_cap, sizeof *s->fifo);
    if (!s->replicas || !s->groups || !s->idle_stack || !s->ps || !s->dev || !s->scratch ||
        !s->reqs || !s->fifo)
        goto fail_nomem;
    for (uint32_t i = 0; i < s->n_reqs; i++)
        s->reqs[i].next_free = i + 1 < s->n_reqs ? i + 1 : PX_SIM_NONE;
    s->free_head = 0;
    uint32_t ri = 0, gi = 0, pb = 0;
    for (uint32_t k = 0; k < s->n_plans; k++) {
        const px_sim_plan *p = s->plans[k];
        for (size_t l = 0; l < p->n_links; l++) {
            px__sim_ps_rt *x = &s->ps[pb + l];
            x->base_bw = p->links[l].bandwidth;
            x->factor = 1;
            if (px__sim_ps_init(&x->ps, x->base_bw, n_grp) != PX_OK)
                goto fail_nomem;
        }
        for (size_t r = 0; r < p->n_replicas; r++, ri++) {
            const px_sim_replica *rs = &p->replicas[r];
            px__sim_replica_rt *rp = &s->replicas[ri];
            uint32_t m = rs->micro_batches ? rs->micro_batches : 1;
            if (m > rs->batch)
                m = rs->batch;
            rp->plan = k;
            rp->spec = rs;
            rp->first_group = gi;
            rp->n_groups = m;
            rp->ps_base = pb;
            rp->stages = calloc(rs->n_stages, sizeof *rp->stages);
            if (!rp->stages)
                goto fail_nomem;
            for (uint32_t i = 0; i < rs->n_stages; i++) {
                rp->stages[i].busy = PX_SIM_NONE;
                rp->stages[i].cap = m;
                rp->stages[i].waiting = calloc(m, sizeof *rp->stages[i].waiting);
                if (!rp->stages[i].waiting)
                    goto fail_nomem;
            }
            for (uint32_t j = 0; j < m; j++, gi++) {
                px__sim_group *g = &s->groups[gi];
                g->plan = k;
                g->replica = ri;
                g->cap = (rs->batch + m - 1) / m;
                g->members = calloc(g->cap, sizeof *g->members);
                if (!g->members)
                    goto fail_nomem;
            }
        }
        pb += (uint32_t)p->n_links;
    }
    size_t q_cap = 64 +
                   4 * (size_t)(n_grp + n_ps + s->plans[0]->n_devices + s->plans[0]->n_domains) +
                   (s->faults ? 4 * s->faults->n : 0);
    if (px__sim_queue_init(&s->q, q_cap) != PX_OK)
        goto fail_nomem;
    double expect = s->load->kind == PX_SIM_LOAD_TRACE ? (double)s->load->n_arrivals
                                                       : s->load->rate * s->end * 1.3 + 1024;
    s->cap_ttft = s->cap_tpot = expect > 4e6 ? 4000000 : (size_t)expect;
    s->ttft = malloc(s->cap_ttft * sizeof *s->ttft);
    s->tpot = malloc(s->cap_tpot * sizeof *s->tpot);
    if (!s->ttft || !s->tpot)
        goto fail_nomem;
    return PX_OK;
fail_nomem:
    return px_err_set(err, PX_ENOMEM, "simulator: out of memory sizing the run");
}

static double percentile(double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(q * (double)n);
    if (i < 1)
        i = 1;
    if (i > n)
        i = n;
    return v[i - 1];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void finish(px_sim *s, px_sim_metrics *m, px_sim_device_stats *devs)
{
    s->now = s->end;
    px__sim_occ_touch(s);
    const px_sim_plan *p0 = s->plans[0];
    double span = s->end - s->opt->warmup_s;
    if (span <= 0)
        span = s->end > 0 ? s->end : 1;
    memset(m, 0, sizeof *m);
    qsort(s->ttft, s->n_ttft, sizeof *s->ttft, cmp_double);
    qsort(s->tpot, s->n_tpot, sizeof *s->tpot, cmp_double);
    m->ttft_mean_s = s->n_ttft ? s->ttft_sum / (double)s->n_ttft : NAN;
    m->ttft_p50_s = percentile(s->ttft, s->n_ttft, 0.50);
    m->ttft_p95_s = percentile(s->ttft, s->n_ttft, 0.95);
    m->ttft_p99_s = percentile(s->ttft, s->n_ttft, 0.99);
    m->tpot_p50_s = percentile(s->tpot, s->n_tpot, 0.50);
    m->tpot_p95_s = percentile(s->tpot, s->n_tpot, 0.95);
    m->tpot_p99_s = percentile(s->tpot, s->n_tpot, 0.99);
    m->tokens_per_s = s->tokens / span;
    m->requests_per_s = s->completed / span;
    m->arrivals = s->arrivals;
    m->completed = s->completed;
    m->failed = s->failed;
    m->dropped = s->dropped;
    m->in_flight_at_end = (double)s->n_active + s->fifo_n;
    double energy = 0, usd = 0, util = 0, kv = 0, thr = 0;
    uint32_t n_alloc = 0;
    for (uint32_t d = 0; d < p0->n_devices; d++) {
        px__sim_device_rt *v = &s->dev[d];
        px__sim_dev_touch(s, d);
        double alive = v->dead ? v->lost_at : s->end;
        devs[d] = (px_sim_device_stats){
            .utilization = alive > 0 ? v->busy_s / alive : 0,
            .energy_j = v->energy_j,
            .max_temp_k = v->th.max_k,
            .throttled_s = v->throttled_s,
            .lost_at_s = v->dead ? v->lost_at : -1,
        };
        if (!v->allocated)
            continue;
        n_alloc++;
        energy += v->energy_j;
        usd += p0->devices[d].usd_per_hour * alive / 3600.0;
        util += devs[d].utilization;
        kv += p0->devices[d].mem_kv_reserved;
        thr += v->throttled_s;
    }
    m->energy_j = energy;
    m->joules_per_token = s->tokens > 0 ? energy / s->tokens : NAN;
    m->usd = usd;
    m->usd_per_token = s->tokens > 0 ? usd / s->tokens : NAN;
    m->mean_utilization = n_alloc ? util / n_alloc : 0;
    m->stranded_compute = n_alloc ? 1 - m->mean_utilization : 0;
    m->stranded_kv_fraction = s->cap_area > 0 ? 1 - s->occ_area / s->cap_area : 1;
    m->stranded_kv_bytes = m->stranded_kv_fraction * kv;
    m->device_losses = s->losses;
    m->plan_switches = s->switches;
    m->throttled_s = thr;
    m->events = s->events;
}

px_status px__sim_run_one(const px_sim_plan *plan, const px_sim_load *load,
                          const px_sim_faults *faults, const px_sim_options *opt, uint64_t seed,
                          px_sim_metrics *m, px_sim_device_stats *devs, px_err *err)
{
    return px__sim_run_one_at(plan, load, faults, opt, 0, seed, m, devs, err);
}

px_status px__sim_run_one_at(const px_sim_plan *plan, const px_sim_load *load,
                             const px_sim_faults *faults, const px_sim_options *opt,
                             uint32_t replication, uint64_t seed, px_sim_metrics *m,
                             px_sim_device_stats *devs, px_err *err)
{
    px_sim s;
    memset(&s, 0, sizeof s);
    const px_sim_hooks *hooks = opt->hooks;
    bool v2 = hooks && hooks->version >= 2;
    s.replication = replication;
    s.observe = v2 && hooks->on_tick && hooks->tick_s > 0;
    s.opt = opt;
    s.load = load;
    s.faults = faults;
    s.end = opt->duration_s;
    s.pace = UINT32_MAX;
    s.plans[0] = plan;
    s.n_plans = 1;
    for (size_t k = 0; k < opt->n_fallbacks && k < 64; k++)
        s.plans[s.n_plans++] = &opt->fallbacks[k];
    s.rng_arrivals = px_rng_derive(seed, PX__SIM_STREAM_ARRIVALS);
    s.rng_lengths = px_rng_derive(seed, PX__SIM_STREAM_LENGTHS);
    s.rng_service = px_rng_derive(seed, PX__SIM_STREAM_SERVICE);
    s.rng_failures = px_rng_derive(seed, PX__SIM_STREAM_FAILURES);
    px_status st = sim_setup(&s, err);
    if (st != PX_OK)
        goto done;
    if (s.observe && px__sim_observe_init(&s) != PX_OK)
        goto fail_nomem;
    for (uint32_t d = 0; d < plan->n_devices; d++) {
        px__sim_device_rt *v = &s.dev[d];
        v->ambient_k = opt->ambient_k;
        v->r_th = px__sim_thermal_r(&plan->devices[d]);
        v->th.temp_k = v->th.max_k = opt->ambient_k;
        v->lost_at = -1;
    }
    /* The primary plan's devices are allocated from the start. */
    for (uint32_t ri = 0; ri < s.n_replicas; ri++) {
        px__sim_replica_rt *rp = &s.replicas[ri];
        if (rp->plan != 0)
            continue;
        for (uint32_t i = 0; i < rp->spec->n_stages; i++)
            for (uint32_t j = 0; j < rp->spec->stages[i].n_devices; j++)
                s.dev[rp->spec->stages[i].devices[j]].allocated = true;
        rp->alive = true;
    }
    for (uint32_t d = 0; d < plan->n_devices; d++)
        px__sim_dev_set_power(&s, d);
    for (uint32_t ri = 0; ri < s.n_replicas; ri++)
        if (s.replicas[ri].plan == 0)
            px__sim_replica_start(&s, ri);
    /* Random failures, drawn from their own stream. */
    if (opt->random_failures && opt->failure_accel > 0) {
        for (uint32_t d = 0; d < plan->n_devices; d++) {
            double t = plan->devices[d].mtbf_s > 0
                           ? px_rng_exponential(&s.rng_failures,
                                                opt->failure_accel / plan->devices[d].mtbf_s)
                           : INFINITY;
            if (t < s.end && px__sim_push(&s, t, PX__SIM_EV_FAIL_DEVICE, d, 0) != PX_OK)
                goto fail_nomem;
        }
        for (uint32_t k = 0; k < plan->n_domains; k++) {
            double t = plan->domains[k].mtbf_s > 0
                           ? px_rng_exponential(&s.rng_failures,
                                                opt->failure_accel / plan->domains[k].mtbf_s)
                           : INFINITY;
            if (t < s.end && px__sim_push(&s, t, PX__SIM_EV_FAIL_DOMAIN, k, 0) != PX_OK)
                goto fail_nomem;
        }
    }
    if (faults)
        for (size_t i = 0; i < faults->n; i++)
            if (faults->items[i].at_s < s.end &&
                px__sim_push(&s, faults->items[i].at_s, PX__SIM_EV_FAULT_START, (uint32_t)i, 0) !=
                    PX_OK)
                goto fail_nomem;
    px__sim_schedule_arrival(&s, 0);
    if (px__sim_push(&s, s.end, PX__SIM_EV_END, 0, 0) != PX_OK)
        goto fail_nomem;
    if (s.observe && hooks->tick_s < s.end &&
        px__sim_push(&s, hooks->tick_s, PX__SIM_EV_TICK, 0, 0) != PX_OK)
        goto fail_nomem;
    if (v2 && hooks->on_begin) {
        s.in_hook = true;
        hooks->on_begin(hooks->ctx, &s, replication, seed);
        s.in_hook = false;
    }

    px__sim_event ev;
    while (px__sim_queue_pop(&s.q, &ev)) {
        s.now = ev.t;
        s.events++;
        if (ev.type == PX__SIM_EV_END)
            break;
        switch (ev.type) {
        case PX__SIM_EV_ARRIVAL:
            px__sim_arrival(&s);
            break;
        case PX__SIM_EV_STAGE_DONE:
            if (s.groups[ev.a].gen == ev.b)
                px__sim_stage_done(&s, ev.a);
            break;
        case PX__SIM_EV_XFER_START:
            if (s.groups[ev.a].gen == ev.b)
                px__sim_xfer_start(&s, ev.a);
            break;
        case PX__SIM_EV_PS_DONE:
            px__sim_ps_done(&s, ev.a, ev.b);
            break;
        case PX__SIM_EV_FAIL_DEVICE:
            px__sim_lose_devices(&s, &ev.a, 1, PX_SIM_NONE, false);
            break;
        case PX__SIM_EV_FAIL_DOMAIN:
            px__sim_lose_domain(&s, ev.a, false);
            break;
        case PX__SIM_EV_FAULT_START:
            px__sim_fault_start(&s, ev.a);
            break;
        case PX__SIM_EV_FAULT_END:
            px__sim_fault_end(&s, ev.a);
            break;
        case PX__SIM_EV_LINK_TOGGLE:
            px__sim_link_toggle(&s, ev.a, ev.b != 0);
            break;
        case PX__SIM_EV_SWITCH:
            px__sim_switch_plan(&s, ev.a);
            break;
        case PX__SIM_EV_TICK:
            px__sim_tick(&s);
            break;
        default:
            break;
        }
    }
    finish(&s, m, devs);
    if (v2 && hooks->on_end) {
        s.in_hook = true;
        hooks->on_end(hooks->ctx, &s, m);
        s.in_hook = false;
    }
    st = PX_OK;
    goto done;
fail_nomem:
    st = px_err_set(err, PX_ENOMEM, "simulator: out of memory queueing events");
done:
    sim_free(&s);
    return st;
}
