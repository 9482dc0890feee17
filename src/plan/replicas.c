/* Replicas: a layout grows copies of its pipeline on devices left unused
 * (same classes, nodes kept together, host cores shared), and at the
 * throughput objective the best of a few layouts grown from the pool is
 * kept. */
#include "base/common.h"

#include "plan/plan_impl.h"

/* Places a copy of pipe on unused devices of the same classes, keeping
 * devices that shared a node together.  False when none is left. */
static bool clone_pipeline(const px__plan_ctx *ctx, const px_cost_pipeline *pipe, bool *used,
                           px_cost_pipeline *out)
{
    const px_cost_fleet *f = ctx->fleet;
    uint32_t orig_node[PX_COST_MAX_STAGES * 2], new_node[PX_COST_MAX_STAGES * 2];
    size_t n_map = 0;
    *out = *pipe;
    uint32_t taken[PX_COST_MAX_STAGES * PX_COST_MAX_TP];
    size_t n_taken = 0;
    for (uint32_t s = 0; s < pipe->n_stages; s++) {
        for (uint32_t k = 0; k < pipe->stages[s].tp; k++) {
            const px_cost_device *d = &f->devices[pipe->stages[s].devices[k]];
            uint32_t want_node = UINT32_MAX;
            for (size_t i = 0; i < n_map; i++)
                if (orig_node[i] == d->node)
                    want_node = new_node[i];
            uint32_t pick = UINT32_MAX;
            uint32_t island = k > 0 ? f->devices[out->stages[s].devices[0]].island : UINT32_MAX;
            for (uint32_t i = 0; i < f->n_devices; i++) {
                const px_cost_device *c = &f->devices[i];
                if (used[i] || !ctx->usable[i] || c->klass != d->klass ||
                    c->mem_free < d->mem_free || (ctx->req->excluded && ctx->req->excluded[i]))
                    continue;
                if (want_node != UINT32_MAX && c->node != want_node)
                    continue;
                if (island != UINT32_MAX && c->island != island)
                    continue;
                bool node_taken = false;
                if (want_node == UINT32_MAX)
                    for (size_t q = 0; q < n_map; q++)
                        node_taken |= new_node[q] == c->node;
                if (node_taken)
                    continue;
                pick = i;
                break;
            }
            if (pick == UINT32_MAX) {
                for (size_t q = 0; q < n_taken; q++)
                    used[taken[q]] = false;
                return false;
            }
            used[pick] = true;
            taken[n_taken++] = pick;
            out->stages[s].devices[k] = pick;
            if (want_node == UINT32_MAX && n_map < PX_ARRAY_LEN(orig_node)) {
                orig_node[n_map] = d->node;
                new_node[n_map++] = f->devices[pick].node;
            }
        }
    }
    return true;
}

static void mark_used(bool *used, const px_cost_pipeline *p)
{
    for (uint32_t s = 0; s < p->n_stages; s++)
        for (uint32_t k = 0; k < p->stages[s].tp; k++)
            used[p->stages[s].devices[k]] = true;
}

/* Host memory belongs to the node, whichever replica uses it: adds the
 * host KV of pipeline p under wl to node_used (bytes per hw node) unless a
 * node would exceed its host memory after headroom.  False (nothing
 * added) then, or when p does not fit at all. */
static bool host_take(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                      double *node_used)
{
    px_cost_estimate *e = ctx->scratch;
    if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, wl, p, NULL, e, NULL) != PX_OK ||
        e->why != PX_COST_OK)
        return false;
    size_t n_nodes = px_hw_graph_view(ctx->fleet->graph)->n_nodes;
    double add[PX_COST_MAX_STAGES * PX_COST_MAX_TP];
    uint32_t node[PX_COST_MAX_STAGES * PX_COST_MAX_TP];
    size_t n = 0;
    for (uint32_t i = 0; i < p->n_stages; i++) {
        double share = e->stages[i].host_bytes / p->stages[i].tp;
        for (uint32_t k = 0; share > 0 && k < p->stages[i].tp; k++) {
            const px_cost_device *d = &ctx->fleet->devices[p->stages[i].devices[k]];
            if (d->node >= n_nodes)
                continue;
            size_t at = 0;
            while (at < n && node[at] != d->node)
                at++;
            if (at == n) {
                node[n] = d->node;
                add[n++] = 0;
            }
            add[at] += share;
            if (node_used[d->node] + add[at] > d->host_mem * (1.0 - ctx->cp->headroom))
                return false;
        }
    }
    for (size_t j = 0; j < n; j++)
        node_used[node[j]] += add[j];
    return true;
}

/* The best fresh pipeline on the devices not used, each batch size of the
 * search tried (a slow replica serves best at a smaller batch than a fast
 * one), within the nodes' host memory.  False when none meets the SLO. */
static bool fresh_replica(px__plan_ctx *ctx, const bool *used, const px__plan_layout *l,
                          const double *node_used, px__plan_cand *out, px_status *st, px_err *err)
{
    uint32_t batches[8];
    size_t n_batches;
    px__plan_batches(ctx, batches, &n_batches);
    size_t n_nodes = px_hw_graph_view(ctx->fleet->graph)->n_nodes;
    double *trial = malloc((n_nodes ? n_nodes : 1) * sizeof *trial);
    if (!trial) {
        *st = px_err_set(err, PX_ENOMEM, "out of memory placing replicas");
        return false;
    }
    bool found = false;
    for (size_t bi = 0; bi < n_batches; bi++) {
        px_cost_workload w = l->wl;
        w.batch = batches[bi];
        px__plan_cand c;
        px_err e2;
        px_status s2 = px__plan_best_on(ctx, used, &w, l->prec_index, &c, &e2);
        if (s2 == PX_ENOMEM) {
            *st = px_err_set(err, s2, "%s", e2.msg);
            break;
        }
        if (s2 != PX_OK || !c.meets_slo)
            continue;
        memcpy(trial, node_used, n_nodes * sizeof *trial);
        if (!host_take(ctx, &c.pipe, &c.wl, trial))
            continue;
        if (!found || c.score < out->score) {
            *out = c;
            found = true;
        }
    }
    free(trial);
    return found;
}

/* Whether replica c still adds throughput on a host whose cores the
 * replicas placed so far use (use[n], their throughput thr[n] before
 * sharing): replicas on one host share its cores (px_cost_host_shares).
 * Takes its share when it does. */
static bool cores_help(const px__plan_cand *c, double *use, double *thr)
{
    uint32_t n = c->host_node;
    if (n == PX_HW_NONE)
        return true;
    double before = thr[n] / PX_MAX(1.0, use[n]);
    double after = (thr[n] + c->throughput) / PX_MAX(1.0, use[n] + c->host_use);
    if (after <= before * 1.0001)
        return false;
    use[n] += c->host_use;
    thr[n] += c->throughput;
    return true;
}

/* Adds replicas while they help the objective: clones of the first for
 * every objective (they keep its latency and batch), fresh searches on
 * what is left for throughput, tokens per dollar and energy, each at the
 * batch that serves it best.  Host memory is counted per node across all
 * replicas. */
px_status px__plan_add_replicas(px__plan_ctx *ctx, px__plan_layout *l, px_err *err)
{
    const px_plan_request *req = ctx->req;
    size_t nd = ctx->fleet->n_devices;
    size_t n_nodes = px_hw_graph_view(ctx->fleet->graph)->n_nodes;
    bool *used = calloc(nd, sizeof *used);
    double *node_used = calloc(n_nodes ? n_nodes : 1, sizeof *node_used);
    double *core_use = calloc(n_nodes ? 2 * n_nodes : 1, sizeof *core_use);
    if (!used || !node_used || !core_use) {
        free(used);
        free(node_used);
        free(core_use);
        return px_err_set(err, PX_ENOMEM, "out of memory placing replicas");
    }
    double *core_thr = core_use + n_nodes;
    for (size_t i = 0; i < nd; i++)
        used[i] = req->excluded && req->excluded[i];
    mark_used(used, &l->replicas[0]);
    px__plan_cand first;
    if (!px__plan_evaluate(ctx, &l->replicas[0], &l->wl, l->prec_index, &first) ||
        !host_take(ctx, &l->replicas[0], &l->wl, node_used)) {
        free(used);
        free(node_used);
        free(core_use);
        return PX_OK;
    }
    cores_help(&first, core_use, core_thr);
    double thr = first.throughput, usd = first.usd_per_hour;
    double watts = first.joules_per_token * first.throughput;
    bool fresh_ok = req->objective == PX_PLAN_OBJ_THROUGHPUT ||
                    req->objective == PX_PLAN_OBJ_TOKENS_PER_DOLLAR ||
                    req->objective == PX_PLAN_OBJ_JOULES_PER_TOKEN;
    uint32_t fresh = 0;
    px_status st = PX_OK;
    while (l->n_replicas < 4096 && st == PX_OK) {
        px_cost_pipeline next;
        px__plan_cand c;
        if (clone_pipeline(ctx, &l->replicas[0], used, &next)) {
            /* A clone that is slower, or that would overfill a node's host
             * memory, keeps its devices out of further clones. */
            if (!px__plan_evaluate(ctx, &next, &l->wl, l->prec_index, &c) ||
                c.tpot_s > first.tpot_s * 1.0001 || c.ttft_s > first.ttft_s * 1.0001 ||
                !cores_help(&c, core_use, core_thr) || !host_take(ctx, &next, &l->wl, node_used))
                continue;
        } else if (fresh_ok && fresh < 8) {
            fresh++;
            if (!fresh_replica(ctx, used, l, node_used, &c, &st, err))
                break;
            next = c.pipe;
            mark_used(used, &next);
            if (!cores_help(&c, core_use, core_thr) || !host_take(ctx, &next, &c.wl, node_used))
                break;
        } else {
            break;
        }
        if (req->slo.budget_usd_h > 0 && usd + c.usd_per_hour > req->slo.budget_usd_h)
            break;
        /* A replica must not make the objective worse. */
        if (req->objective == PX_PLAN_OBJ_TOKENS_PER_DOLLAR && usd > 0 && c.usd_per_hour > 0 &&
            c.throughput / c.usd_per_hour < thr / usd * 0.999)
            break;
        if (req->objective == PX_PLAN_OBJ_JOULES_PER_TOKEN &&
            c.joules_per_token > watts / thr * 1.001)
            break;
        st = px__plan_layout_push_wl(l, &next, &c.wl, err);
        thr += c.throughput;
        usd += c.usd_per_hour;
        watts += c.joules_per_token * c.throughput;
    }
    free(used);
    free(node_used);
    free(core_use);
    return st;
}

/* The layout's total throughput under its replicas' own batches. */
static double layout_throughput(px__plan_ctx *ctx, const px__plan_layout *l)
{
    size_t n_nodes = px_hw_graph_view(ctx->fleet->graph)->n_nodes;
    double *use = calloc(n_nodes ? 2 * n_nodes : 1, sizeof *use);
    double thr = 0;
    for (uint32_t i = 0; i < l->n_replicas; i++) {
        px__plan_cand c;
        if (!px__plan_evaluate(ctx, &l->replicas[i], &l->wls[i], l->prec_index, &c))
            continue;
        if (c.host_node == PX_HW_NONE || !use) {
            thr += c.throughput;
        } else {
            use[c.host_node] += c.host_use;
            use[n_nodes + c.host_node] += c.throughput;
        }
    }
    /* Replicas on one host share its cores. */
    for (size_t j = 0; use && j < n_nodes; j++)
        thr += use[n_nodes + j] / PX_MAX(1.0, use[j]);
    free(use);
    return thr;
}

/* Throughput is the layout's, not its first replica's: a pipeline that
 * ranks first alone may leave less for the replicas after it than a
 * runner-up on other devices.  The next candidates of the pool on other
 * device sets are grown into layouts too, and the layout that serves most
 * is kept. */
#define LAYOUT_TRIES 3

px_status px__plan_best_layout(px__plan_ctx *ctx, px__plan_layout *l, px_err *err)
{
    if (ctx->req->objective != PX_PLAN_OBJ_THROUGHPUT)
        return PX_OK;
    double best = layout_throughput(ctx, l);
    char seen[LAYOUT_TRIES + 1][160];
    size_t n_seen = 0;
    px__plan_pipe_devices(ctx, &l->replicas[0], seen[n_seen++], sizeof seen[0]);
    for (size_t i = 1; i < ctx->n_pool && n_seen <= LAYOUT_TRIES; i++) {
        const px__plan_cand *c = &ctx->pool[i];
        if (!c->meets_slo || !c->within_budget)
            continue;
        char devs[160];
        px__plan_pipe_devices(ctx, &c->pipe, devs, sizeof devs);
        bool dup = false;
        for (size_t k = 0; k < n_seen; k++)
            dup |= !strcmp(seen[k], devs);
        if (dup)
            continue;
        memcpy(seen[n_seen++], devs, sizeof devs);
        px__plan_layout alt = {.wl = c->wl, .prec_index = c->prec_index};
        px_status st = px__plan_layout_push(&alt, &c->pipe, err);
        if (st == PX_OK)
            st = px__plan_add_replicas(ctx, &alt, err);
        if (st != PX_OK) {
            px__plan_layout_release(&alt);
            return st;
        }
        double thr = layout_throughput(ctx, &alt);
        if (thr > best * 1.0001) {
            best = thr;
            px__plan_layout_release(l);
            *l = alt;
        } else {
            px__plan_layout_release(&alt);
        }
    }
    return PX_OK;
}
