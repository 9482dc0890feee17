/* The event queue, processor-sharing link domains and the thermal model:
 * the small mechanisms the engine is built from. */
#include "base/common.h"

#include "sim/sim_impl.h"

/* ---- the event queue ---- */

px_status px__sim_queue_init(px__sim_queue *q, size_t cap)
{
    memset(q, 0, sizeof *q);
    if (cap < 16)
        cap = 16;
    q->heap = malloc(cap * sizeof *q->heap);
    if (!q->heap)
        return PX_ENOMEM;
    q->cap = cap;
    return PX_OK;
}

void px__sim_queue_release(px__sim_queue *q)
{
    free(q->heap);
    memset(q, 0, sizeof *q);
}

static inline bool before(const px__sim_event *x, const px__sim_event *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

px_status px__sim_queue_push(px__sim_queue *q, double t, uint32_t type, uint32_t a, uint32_t b)
{
    if (q->n == q->cap) {
        size_t cap;
        if (!px__mul_size(q->cap, 2, &cap) || cap > SIZE_MAX / sizeof *q->heap)
            return PX_ENOMEM;
        px__sim_event *h = realloc(q->heap, cap * sizeof *h);
        if (!h)
            return PX_ENOMEM;
        q->heap = h;
        q->cap = cap;
    }
    px__sim_event ev = {.t = t, .seq = q->next_seq++, .type = type, .a = a, .b = b};
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&ev, &q->heap[parent]))
            break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = ev;
    return PX_OK;
}

bool px__sim_queue_pop(px__sim_queue *q, px__sim_event *out)
{
    if (q->n == 0)
        return false;
    *out = q->heap[0];
    px__sim_event last = q->heap[--q->n];
    size_t i = 0, n = q->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(&q->heap[c + 1], &q->heap[c]))
            c++;
        if (!before(&q->heap[c], &last))
            break;
        q->heap[i] = q->heap[c];
        i = c;
    }
    if (n)
        q->heap[i] = last;
    return true;
}

/* ---- processor sharing ---- */

px_status px__sim_ps_init(px__sim_ps *d, double bandwidth, uint32_t cap)
{
    memset(d, 0, sizeof *d);
    if (cap == 0)
        cap = 1;
    d->flow = calloc(cap, sizeof *d->flow);
    d->remaining = calloc(cap, sizeof *d->remaining);
    if (!d->flow || !d->remaining) {
        px__sim_ps_release(d);
        return PX_ENOMEM;
    }
    d->cap = cap;
    d->bandwidth = bandwidth;
    return PX_OK;
}

void px__sim_ps_release(px__sim_ps *d)
{
    free(d->flow);
    free(d->remaining);
    memset(d, 0, sizeof *d);
}

void px__sim_ps_advance(px__sim_ps *d, double t)
{
    if (t <= d->t_last) {
        return;
    }
    if (d->n > 0 && d->bandwidth > 0) {
        double served = (t - d->t_last) * d->bandwidth / d->n;
        for (uint32_t i = 0; i < d->n; i++) {
            d->remaining[i] -= served;
            if (d->remaining[i] < 0)
                d->remaining[i] = 0;
        }
    }
    d->t_last = t;
}

px_status px__sim_ps_add(px__sim_ps *d, double t, uint32_t flow, double bytes)
{
    px__sim_ps_advance(d, t);
    if (d->n == d->cap)
        return PX_ELIMIT;
    d->flow[d->n] = flow;
    d->remaining[d->n] = bytes > 0 ? bytes : 0;
    d->n++;
    d->version++;
    return PX_OK;
}

void px__sim_ps_remove(px__sim_ps *d, uint32_t flow)
{
    for (uint32_t i = 0; i < d->n; i++) {
        if (d->flow[i] == flow) {
            /* Keep insertion order so ties complete first-in first-out. */
            memmove(&d->flow[i], &d->flow[i + 1], (d->n - i - 1) * sizeof *d->flow);
            memmove(&d->remaining[i], &d->remaining[i + 1], (d->n - i - 1) * sizeof *d->remaining);
            d->n--;
            d->version++;
            return;
        }
    }
}

bool px__sim_ps_next(const px__sim_ps *d, double *t, uint32_t *flow)
{
    if (d->n == 0 || !(d->bandwidth > 0))
        return false;
    uint32_t best = 0;
    for (uint32_t i = 1; i < d->n; i++)
        if (d->remaining[i] < d->remaining[best])
            best = i;
    *t = d->t_last + d->remaining[best] * d->n / d->bandwidth;
    *flow = d->flow[best];
    return true;
}

void px__sim_ps_set_bandwidth(px__sim_ps *d, double t, double bandwidth)
{
    px__sim_ps_advance(d, t);
    d->bandwidth = bandwidth;
    d->version++;
}

/* ---- thermal ---- */

void px__sim_thermal_advance(px__sim_thermal *th, double t, double ambient_k, double r_k_per_w,
                             double tau_s)
{
    double dt = t - th->t_last;
    if (dt <= 0)
        return;
    th->t_last = t;
    if (!(tau_s > 0))
        return;
    double t_ss = ambient_k + th->power_w * r_k_per_w;
    th->temp_k = t_ss + (th->temp_k - t_ss) * exp(-dt / tau_s);
    if (th->temp_k > th->max_k)
        th->max_k = th->temp_k;
}

double px__sim_thermal_r(const px_sim_device *d)
{
    if (d->thermal_r_k_per_w > 0)
        return d->thermal_r_k_per_w;
    if (!(d->power_active_w > 0) || !(d->thermal_limit_k > 0))
        return 0;
    double r = (d->thermal_limit_k - 10.0 - 298.15) / d->power_active_w;
    return r > 0 ? r : 0;
}
