/*
 * The engine: one replication of a plan under a load and faults.
 *
 * Requests wait in one global FIFO.  Each replica runs `micro_batches`
 * groups; a group starts a step at the first stage by admitting waiting
 * requests up to its share of the batch (continuous batching: sequences
 * join and leave at step boundaries), then passes through the stages in
 * order.  A stage computes one group at a time (others wait in FIFO), so
 * groups pipeline.  Between stages the group's activations cross a hop:
 * fixed latency, then processor sharing of the hop's contention domain.
 * A new sequence's first step is its prefill and yields its first token;
 * every later step yields one token.
 *
 * Everything lives in arrays sized before the run; the event loop
 * allocates nothing (the latency sample arrays grow geometrically, which
 * is amortized and rare).
 */
#include "base/common.h"

#include "sim/sim_impl.h"

double px_sim_now(const px_sim *sim)
{
    return sim ? sim->now : 0;
}

uint32_t px__sim_len_draw(const px_sim_len *len, px_rng *r)
{
    uint64_t v;
    switch (len->kind) {
    case PX_SIM_LEN_UNIFORM:
        v = len->a + px_rng_below(r, (uint64_t)(len->b - len->a) + 1);
        break;
    case PX_SIM_LEN_EXPONENTIAL: {
        double x = px_rng_exponential(r, 1.0 / len->a);
        v = x > 1e6 ? 1000000 : (uint64_t)llround(x);
        break;
    }
    default:
        v = len->a;
    }
    return v < 1 ? 1 : (uint32_t)v;
}

/* ---- bookkeeping ---- */

void px__sim_occ_touch(px_sim *s)
{
    double dt = s->now - s->occ_t;
    if (dt > 0 && s->now > s->opt->warmup_s) {
        if (s->occ_t < s->opt->warmup_s)
            dt = s->now - s->opt->warmup_s;
        s->occ_area += dt * s->n_active;
        s->cap_area += dt * s->live_capacity;
    }
    s->occ_t = s->now;
}

/* Brings a device's temperature, energy and throttled time to now. */
void px__sim_dev_touch(px_sim *s, uint32_t d)
{
    px__sim_device_rt *v = &s->dev[d];
    double dt = s->now - v->th.t_last;
    if (dt <= 0)
        return;
    v->energy_j += v->th.power_w * dt;
    if (v->th.throttled)
        v->throttled_s += dt;
    const px_sim_device *spec = &s->plans[0]->devices[d];
    px__sim_thermal_advance(&v->th, s->now, v->ambient_k, v->r_th, spec->thermal_tau_s);
    v->th.t_last = s->now;
    /* A device that cooled while idle runs at its full clock again: the
     * release does not wait for its next step. */
    if (v->th.throttled && !v->busy && v->th.temp_k < spec->thermal_limit_k - 3.0)
        v->th.throttled = false;
}

/* The clock fraction a device runs at: throttling and power caps, with
 * power linear in clock between idle and active. */
static double dev_clock(const px_sim *s, uint32_t d)
{
    const px__sim_device_rt *v = &s->dev[d];
    const px_sim_device *spec = &s->plans[0]->devices[d];
    double clock = v->th.throttled ? s->opt->throttle_clock : 1.0;
    if (v->cap_w > 0 && spec->power_active_w > spec->power_idle_w) {
        double f = (v->cap_w - spec->power_idle_w) / (spec->power_active_w - spec->power_idle_w);
        if (f < clock)
            clock = f;
    }
    return clock < 0.05 ? 0.05 : clock;
}

void px__sim_dev_set_power(px_sim *s, uint32_t d)
{
    px__sim_device_rt *v = &s->dev[d];
    const px_sim_device *spec = &s->plans[0]->devices[d];
    if (v->dead || !v->allocated)
        v->th.power_w = 0;
    else if (v->busy)
        v->th.power_w =
            spec->power_idle_w + (spec->power_active_w - spec->power_idle_w) * dev_clock(s, d);
    else
        v->th.power_w = spec->power_idle_w;
}

px_status px__sim_push(px_sim *s, double t, uint32_t type, uint32_t a, uint32_t b)
{
    return px__sim_queue_push(&s->q, t, type, a, b);
}

void px__sim_ps_reschedule(px_sim *s, uint32_t p)
{
    double t;
    uint32_t flow;
    if (px__sim_ps_next(&s->ps[p].ps, &t, &flow))
        (void)px__sim_push(s, t < s->now ? s->now : t, PX__SIM_EV_PS_DONE, p, s->ps[p].ps.version);
}

static px__sim_req *new_req(px_sim *s, uint32_t *id)
{
    if (s->free_head == PX_SIM_NONE)
        return NULL;
    *id = s->free_head;
    px__sim_req *r = &s->reqs[*id];
    s->free_head = r->next_free;
    return r;
}

void px__sim_free_req(px_sim *s, uint32_t id)
{
    s->reqs[id].next_free = s->free_head;
    s->free_head = id;
}

bool px__sim_fifo_push(px_sim *s, uint32_t id, bool front)
{
    if (s->fifo_n == s->fifo_cap)
        return false;
    if (front) {
        s->fifo_head = (s->fifo_head + s->fifo_cap - 1) % s->fifo_cap;
        s->fifo[s->fifo_head] = id;
    } else {
        s->fifo[(s->fifo_head + s->fifo_n) % s->fifo_cap] = id;
    }
    s->fifo_n++;
    return true;
}

static uint32_t fifo_pop(px_sim *s)
{
    uint32_t id = s->fifo[s->fifo_head];
    s->fifo_head = (s->fifo_head + 1) % s->fifo_cap;
    s->fifo_n--;
    return id;
}

static px_status grow_push(double **arr, size_t *n, size_t *cap, double v)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        double *a = realloc(*arr, c * sizeof *a);
        if (!a)
            return PX_ENOMEM;
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = v;
    return PX_OK;
}

static double lognormal(px_rng *r, double p50, double p99)
{
    if (!(p99 > p50) || !(p50 > 0))
        return 1.0;
    double sigma = log(p99 / p50) / 2.3263478740408408;
    if (sigma > 2)
        sigma = 2;
    return exp(sigma * px_rng_normal(r));
}

/* ---- the pipeline ---- */

static void begin_compute(px_sim *s, uint32_t gi);

static void request_stage(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    px__sim_stage_rt *st = &s->replicas[g->replica].stages[g->stage];
    if (st->busy == PX_SIM_NONE) {
        begin_compute(s, gi);
        return;
    }
    /* The ring holds every group of the replica at most once. */
    st->waiting[(st->head + st->n) % st->cap] = gi;
    st->n++;
}

static void begin_compute(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    px__sim_replica_rt *rp = &s->replicas[g->replica];
    const px_sim_plan *plan = s->plans[rp->plan];
    const px_sim_stage *ps = &rp->spec->stages[g->stage];
    px__sim_stage_rt *st = &rp->stages[g->stage];
    st->busy = gi;
    double cap = g->cap, ctx = plan->context ? plan->context : 1;
    double prompt = plan->prompt_tokens ? plan->prompt_tokens : 1;
    double dur = 0;
    if (g->n_decode > 0) {
        double wf = ps->weight_fraction;
        double ratio = g->sum_ctx / (cap * ctx);
        dur += ps->decode_s * (wf + (1 - wf) * ratio) *
               lognormal(&s->rng_service, ps->decode_s, ps->decode_p99_s);
    }
    if (g->prefill_tokens > 0)
        dur += ps->prefill_s * g->prefill_tokens / (cap * prompt) *
               lognormal(&s->rng_service, ps->prefill_s, ps->prefill_p99_s);
    if (s->observe) {
        /* What the plan predicts for this batch: the same terms without the
         * random factor, throttling or caps. */
        double pred = 0;
        if (g->n_decode > 0)
            pred += ps->decode_s *
                    (ps->weight_fraction + (1 - ps->weight_fraction) * g->sum_ctx / (cap * ctx));
        if (g->prefill_tokens > 0)
            pred += ps->prefill_s * g->prefill_tokens / (cap * prompt);
        g->pred_s = pred;
    }
    double slow = 1.0;
    for (uint32_t i = 0; i < ps->n_devices; i++) {
        uint32_t d = ps->devices[i];
        px__sim_device_rt *v = &s->dev[d];
        const px_sim_device *spec = &plan->devices[d];
        px__sim_dev_touch(s, d);
        /* Throttle above the limit; release 3 K under it (hysteresis). */
        if (spec->thermal_limit_k > 0 && spec->thermal_tau_s > 0) {
            if (v->th.temp_k >= spec->thermal_limit_k)
                v->th.throttled = true;
            else if (v->th.throttled && v->th.temp_k < spec->thermal_limit_k - 3.0)
                v->th.throttled = false;
        }
        double f = 1.0 / dev_clock(s, d);
        if (f > slow)
            slow = f;
        v->busy++;
        px__sim_dev_set_power(s, d);
    }
    g->t_start = s->now;
    (void)px__sim_push(s, s->now + dur * slow, PX__SIM_EV_STAGE_DONE, gi, g->gen);
}

static void finish_step(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    bool measure_tokens = s->now >= s->opt->warmup_s;
    px__sim_occ_touch(s);
    for (uint32_t i = 0; i < g->n;) {
        uint32_t id = g->members[i];
        px__sim_req *r = &s->reqs[id];
        bool measured = r->t_arrival >= s->opt->warmup_s;
        if (r->done == 0) {
            r->t_first = s->now;
            if (measured) {
                (void)grow_push(&s->ttft, &s->n_ttft, &s->cap_ttft, s->now - r->t_arrival);
                s->ttft_sum += s->now - r->t_arrival;
            }
        }
        r->done++;
        if (measure_tokens)
            s->tokens++;
        if (r->done >= r->gen) {
            if (measured && r->gen > 1)
                (void)grow_push(&s->tpot, &s->n_tpot, &s->cap_tpot,
                                (s->now - r->t_first) / (r->gen - 1));
            if (measure_tokens)
                s->completed++;
            px__sim_free_req(s, id);
            g->members[i] = g->members[--g->n];
            s->n_active--;
            continue;
        }
        i++;
    }
    px__sim_start_step(s, gi);
}

void px__sim_start_step(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    px__sim_replica_rt *rp = &s->replicas[g->replica];
    if (!rp->alive || rp->plan != s->active)
        return;
    uint32_t cap = g->cap < s->pace ? g->cap : s->pace;
    if (g->n < cap && s->fifo_n)
        px__sim_occ_touch(s);
    while (g->n < cap && s->fifo_n) {
        g->members[g->n++] = fifo_pop(s);
        s->n_active++;
    }
    g->stage = 0;
    if (g->n == 0) {
        g->idle = true;
        /* Each group is on the stack at most once, so it never overflows. */
        if (!g->in_stack) {
            g->in_stack = true;
            s->idle_stack[s->n_idle++] = gi;
        }
        return;
    }
    g->idle = false;
    g->n_decode = 0;
    g->prefill_tokens = 0;
    g->sum_ctx = 0;
    for (uint32_t i = 0; i < g->n; i++) {
        const px__sim_req *r = &s->reqs[g->members[i]];
        if (r->done == 0) {
            g->prefill_tokens += r->prompt;
        } else {
            g->n_decode++;
            g->sum_ctx += (double)r->prompt + r->done;
        }
    }
    request_stage(s, gi);
}

void px__sim_stage_done(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    px__sim_replica_rt *rp = &s->replicas[g->replica];
    const px_sim_stage *ps = &rp->spec->stages[g->stage];
    px__sim_stage_rt *st = &rp->stages[g->stage];
    for (uint32_t i = 0; i < ps->n_devices; i++) {
        uint32_t d = ps->devices[i];
        px__sim_dev_touch(s, d);
        s->dev[d].busy--;
        s->dev[d].busy_s += s->now - g->t_start;
        px__sim_dev_set_power(s, d);
    }
    if (s->observe) {
        double dur = s->now - g->t_start;
        uint32_t k = st->n_steps++ % PX__SIM_OBS_RING;
        st->step_s[k] = dur;
        st->step_ratio[k] = g->pred_s > 0 ? dur / g->pred_s : 1.0;
        st->last_step_t = s->now;
        g->t_xfer = s->now;
    }
    st->busy = PX_SIM_NONE;
    if (st->n) {
        uint32_t next = st->waiting[st->head];
        st->head = (st->head + 1) % st->cap;
        st->n--;
        begin_compute(s, next);
    }
    if (g->stage + 1 < rp->spec->n_stages) {
        if (ps->link != PX_SIM_NONE) {
            double lat = ps->xfer_latency_s + s->ps[rp->ps_base + ps->link].latency_add;
            (void)px__sim_push(s, s->now + lat, PX__SIM_EV_XFER_START, gi, g->gen);
            return;
        }
        g->stage++;
        request_stage(s, gi);
        return;
    }
    finish_step(s, gi);
}

void px__sim_xfer_start(px_sim *s, uint32_t gi)
{
    px__sim_group *g = &s->groups[gi];
    px__sim_replica_rt *rp = &s->replicas[g->replica];
    const px_sim_stage *ps = &rp->spec->stages[g->stage];
    uint32_t p = rp->ps_base + ps->link;
    double tokens = (double)g->n_decode + g->prefill_tokens;
    double bytes = ps->xfer_bytes * tokens / g->cap;
    if (s->observe) {
        const px_sim_plan *plan = s->plans[rp->plan];
        double bw = ps->link < plan->n_links ? plan->links[ps->link].bandwidth : 0;
        g->xfer_pred_s = ps->xfer_latency_s + (bw > 0 ? bytes / bw : 0);
    }
    if (px__sim_ps_add(&s->ps[p].ps, s->now, gi, bytes) != PX_OK) {
        /* Cannot happen: a domain holds one flow per group at most. */
        g->stage++;
        request_stage(s, gi);
        return;
    }
    px__sim_ps_reschedule(s, p);
}

void px__sim_ps_done(px_sim *s, uint32_t p, uint32_t version)
{
    px__sim_ps *d = &s->ps[p].ps;
    if (version != d->version)
        return;
    px__sim_ps_advance(d, s->now);
    double t;
    uint32_t gi;
    if (!px__sim_ps_next(d, &t, &gi))
        return;
    px__sim_ps_remove(d, gi);
    px__sim_ps_reschedule(s, p);
    if (s->observe) {
        px__sim_group *g = &s->groups[gi];
        px__sim_stage_rt *st = &s->replicas[g->replica].stages[g->stage];
        double dur = s->now - g->t_xfer;
        uint32_t k = st->n_xfers++ % PX__SIM_OBS_RING;
        st->xfer_s[k] = dur;
        st->xfer_ratio[k] = g->xfer_pred_s > 0 ? dur / g->xfer_pred_s : 1.0;
    }
    s->groups[gi].stage++;
    request_stage(s, gi);
}

/* ---- arrivals ---- */

void px__sim_schedule_arrival(px_sim *s, double t)
{
    const px_sim_load *l = s->load;
    if (l->kind == PX_SIM_LOAD_TRACE) {
        if (s->next_trace < l->n_arrivals && l->arrivals[s->next_trace].t < s->end)
            (void)px__sim_push(s, l->arrivals[s->next_trace].t, PX__SIM_EV_ARRIVAL, 0, 0);
        return;
    }
    if (!(l->rate > 0))
        return;
    if (l->kind == PX_SIM_LOAD_POISSON) {
        t += px_rng_exponential(&s->rng_arrivals, l->rate);
    } else {
        /* On/off modulated: on a fraction 1/burst of the time at
         * rate * burst.  Memorylessness lets a draw that overshoots the
         * phase be discarded and redrawn in the next on phase. */
        double on_rate = l->rate * l->burst, mean_on = l->period_s / l->burst;
        double mean_off = l->period_s - mean_on;
        for (int guard = 0; guard < 1000000; guard++) {
            if (s->burst_on) {
                double c = t + px_rng_exponential(&s->rng_arrivals, on_rate);
                if (c < s->burst_phase_end) {
                    t = c;
                    break;
                }
                t = s->burst_phase_end;
                s->burst_on = false;
                s->burst_phase_end = t + px_rng_exponential(&s->rng_arrivals, 1.0 / mean_off);
            } else {
                t = s->burst_phase_end;
                s->burst_on = true;
                s->burst_phase_end = t + px_rng_exponential(&s->rng_arrivals, 1.0 / mean_on);
            }
            if (t >= s->end)
                return;
        }
    }
    if (t < s->end)
        (void)px__sim_push(s, t, PX__SIM_EV_ARRIVAL, 0, 0);
}

void px__sim_wake_idle(px_sim *s)
{
    while (s->n_idle && s->fifo_n) {
        uint32_t gi = s->idle_stack[--s->n_idle];
        s->groups[gi].in_stack = false;
        px__sim_group *g = &s->groups[gi];
        if (!g->idle)
            continue;
        g->idle = false;
        px__sim_start_step(s, gi);
    }
}

void px__sim_arrival(px_sim *s)
{
    const px_sim_load *l = s->load;
    uint32_t prompt, gen;
    if (l->kind == PX_SIM_LOAD_TRACE) {
        const px_sim_arrival *a = &l->arrivals[s->next_trace++];
        prompt = a->prompt_tokens;
        gen = a->gen_tokens;
    } else {
        prompt = px__sim_len_draw(&l->prompt, &s->rng_lengths);
        gen = px__sim_len_draw(&l->gen, &s->rng_lengths);
    }
    if (s->now >= s->opt->warmup_s)
        s->arrivals++;
    uint32_t id;
    px__sim_req *r = s->fifo_n < s->opt->queue_limit ? new_req(s, &id) : NULL;
    if (!r || !px__sim_fifo_push(s, id, false)) {
        if (r)
            px__sim_free_req(s, id);
        if (s->now >= s->opt->warmup_s)
            s->dropped++;
    } else {
        *r = (px__sim_req){.t_arrival = s->now, .t_first = -1, .prompt = prompt, .gen = gen};
    }
    px__sim_wake_idle(s);
    px__sim_schedule_arrival(s, s->now);
}
