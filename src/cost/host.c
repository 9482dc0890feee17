/* A node's host as the stages on it share it: its memory, holding every
 * stage's host KV cache (px__cost_host_over), and its cores, a floor
 * under a replica's step (px__cost_host_cores_floor) and shared between
 * the replicas placed on it (px_cost_host_shares). */
#include "base/common.h"

#include "cost/cost_impl.h"

/* The slot of node id among the n in node[], added at the end (*fresh)
 * when it is not there yet; the caller's arrays hold room for it. */
static size_t node_slot(uint32_t *node, size_t *n, uint32_t id, bool *fresh)
{
    size_t at = 0;
    while (at < *n && node[at] != id)
        at++;
    *fresh = at == *n;
    if (*fresh)
        node[(*n)++] = id;
    return at;
}

/* Host memory is a node's, not a stage's: the host KV of every stage on one
 * node (each device's share on its own node) is summed against that node's
 * memory.  True when a node is over its limit: *stage gets the last stage
 * on it and *over the excess. */
bool px__cost_host_over(const px_cost_fleet *f, const px_cost_params *p,
                        const px_cost_stage *stages, const px_cost_stage_est *ests,
                        uint32_t n_stages, uint32_t *stage, double *over)
{
    enum { CAP = PX_COST_MAX_STAGES * PX_COST_MAX_TP };
    uint32_t node[CAP], last[CAP];
    double bytes[CAP], limit[CAP];
    size_t n = 0;
    for (uint32_t i = 0; i < n_stages; i++) {
        const px_cost_stage *st = &stages[i];
        double share = ests[i].host_bytes / st->tp;
        if (share <= 0)
            continue;
        for (uint32_t k = 0; k < st->tp; k++) {
            const px_cost_device *d = &f->devices[st->devices[k]];
            bool fresh;
            size_t at = node_slot(node, &n, d->node, &fresh);
            if (fresh) {
                bytes[at] = 0;
                limit[at] = d->host_mem * (1.0 - p->headroom);
            }
            bytes[at] += share;
            last[at] = i;
        }
    }
    for (size_t j = 0; j < n; j++)
        if (bytes[j] > limit[j]) {
            *stage = last[j];
            *over = bytes[j] - limit[j];
            return true;
        }
    return false;
}

/* The floor host cores put under a step (est->host_cores_s, host_node):
 * per node that declares its cores, the core-seconds of every micro-batch
 * of every stage device on it, and of the executor's round trip (a host
 * thread beside the first stage), over its cores.  The busiest node sets
 * it; 0 when no node declares its cores. */
void px__cost_host_cores_floor(const px_cost_fleet *f, const px_cost_pipeline *pipe, uint32_t mb,
                               double exec, px_cost_estimate *est)
{
    enum { CAP = PX_COST_MAX_STAGES * PX_COST_MAX_TP };
    uint32_t node[CAP];
    double demand[CAP], cores[CAP];
    size_t n = 0;
    est->host_cores_s = 0;
    est->host_node = PX_HW_NONE;
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage *st = &pipe->stages[i];
        px_cost_stage_est *e = &est->stages[i];
        e->host_core_s = 0;
        for (uint32_t k = 0; k < st->tp; k++) {
            const px_cost_device *d = &f->devices[st->devices[k]];
            double busy = e->compute_s > e->mem_s ? d->host_busy_compute : d->host_busy_mem;
            e->host_core_s += e->serve_s * busy;
            double need = mb * e->serve_s * busy + (i == 0 && k == 0 ? exec : 0);
            if (d->host_cores <= 0 || need <= 0)
                continue;
            bool fresh;
            size_t at = node_slot(node, &n, d->node, &fresh);
            if (fresh) {
                demand[at] = 0;
                cores[at] = d->host_cores;
            }
            demand[at] += need;
        }
    }
    for (size_t j = 0; j < n; j++)
        if (demand[j] / cores[j] > est->host_cores_s) {
            est->host_cores_s = demand[j] / cores[j];
            est->host_node = node[j];
        }
}

void px_cost_host_shares(const uint32_t *node, const double *use, size_t n, double *k)
{
    for (size_t i = 0; i < n; i++)
        k[i] = 1.0;
    for (size_t i = 0; i < n; i++) {
        if (node[i] == PX_HW_NONE)
            continue;
        bool first = true;
        double sum = 0;
        for (size_t j = 0; j < n; j++) {
            if (node[j] != node[i])
                continue;
            first &= j >= i;
            sum += use[j];
        }
        if (!first || sum <= 1.0)
            continue;
        for (size_t j = i; j < n; j++)
            if (node[j] == node[i])
                k[j] = sum;
    }
}
