/* The plexus search: pipeline cuts by dynamic programming over layers on
 * each device sequence (units.c), the loop over precision and batch, the
 * Monte Carlo ranking of the finalists, and DP sessions for the
 * yardsticks. */
#include "base/common.h"

#include "plan/plan_impl.h"

typedef px__plan_seq seq;
typedef px__plan_seq_set seq_set;

/* ------------------------------------------------------------------ */
/* Dynamic programming over layers                                     */
/* ------------------------------------------------------------------ */

typedef struct stage_cell {
    double decode, serve, prefill; /* served steps: one sequence's, the replica's */
    int8_t state; /* 0 unknown, 1 fits in device memory, 2 fits with KV on host, -1 no */
} stage_cell;

/* Stage figures of one unit shape for every [a, b), computed lazily. */
typedef struct shape_cache {
    uint32_t klass, tp;
    double mem_free;
    uint32_t island;
    stage_cell *cells; /* (L+1) x (L+1) */
} shape_cache;

typedef struct dp_cache {
    const px_cost_prefix *pre;
    shape_cache *shapes;
    size_t n, cap;
} dp_cache;

static void dp_cache_release(dp_cache *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->shapes[i].cells);
    free(c->shapes);
    memset(c, 0, sizeof *c);
}

static stage_cell *shape_cells(px__plan_ctx *ctx, dp_cache *c, const px__plan_unit *u)
{
    const px_cost_device *d = &ctx->fleet->devices[u->devices[0]];
    for (size_t i = 0; i < c->n; i++) {
        shape_cache *s = &c->shapes[i];
        /* Groups larger than one are keyed by island too: ring links differ. */
        if (s->klass == u->klass && s->tp == u->tp && s->mem_free == d->mem_free &&
            (u->tp == 1 || s->island == u->island))
            return s->cells;
    }
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 8;
        shape_cache *r = realloc(c->shapes, nc * sizeof *r);
        if (!r)
            return NULL;
        c->shapes = r;
        c->cap = nc;
    }
    size_t L = ctx->model->n_layers + 1;
    stage_cell *cells = calloc(L * L, sizeof *cells);
    if (!cells)
        return NULL;
    c->shapes[c->n++] = (shape_cache){.klass = u->klass,
                                      .tp = u->tp,
                                      .mem_free = d->mem_free,
                                      .island = u->island,
                                      .cells = cells};
    return cells;
}

static px_cost_stage unit_stage(const px__plan_ctx *ctx, const px_cost_prefix *pre,
                                const px__plan_unit *u, uint32_t a, uint32_t b)
{
    px_cost_stage st;
    memset(&st, 0, sizeof st);
    memcpy(st.devices, u->devices, u->tp * sizeof u->devices[0]);
    st.tp = u->tp;
    st.first = (int32_t)a;
    st.last = (int32_t)b - 1;
    st.embedding = a == 0;
    st.head = b == ctx->model->n_layers;
    st.prec = pre->prec;
    st.kv = PX_COST_KV_DEVICE;
    return st;
}

static const stage_cell *cell_of(px__plan_ctx *ctx, dp_cache *c, const px__plan_unit *u, uint32_t a,
                                 uint32_t b)
{
    stage_cell *cells = shape_cells(ctx, c, u);
    if (!cells)
        return NULL;
    stage_cell *x = &cells[(size_t)a * (ctx->model->n_layers + 1) + b];
    if (x->state != 0)
        return x;
    px_cost_stage st = unit_stage(ctx, c->pre, u, a, b);
    px_cost_stage_est e;
    px_cost_infeasible r = px_cost_stage_quick(ctx->fleet, c->pre, ctx->cp, &st, &e);
    if (r == PX_COST_NO_MEMORY && !ctx->model->dit) {
        st.kv = PX_COST_KV_HOST;
        r = px_cost_stage_quick(ctx->fleet, c->pre, ctx->cp, &st, &e);
        if (r == PX_COST_OK) {
            x->state = 2;
            x->decode = e.serve_tpot_s;
            x->serve = e.serve_s;
            x->prefill = e.prefill_s;
            return x;
        }
    }
    if (r != PX_COST_OK) {
        x->state = -1;
        return x;
    }
    x->state = 1;
    x->decode = e.serve_tpot_s;
    x->serve = e.serve_s;
    x->prefill = e.prefill_s;
    return x;
}

#define DP_BACK 3 /* a stage may follow any of the 3 previous units */

/* Minimises the sum (latency) or the maximum (throughput) of stage times
 * plus hops over contiguous cuts of the layers onto a subsequence of the
 * units, every used unit holding at least one block. */
static px_status run_dp(px__plan_ctx *ctx, dp_cache *cache, const px__plan_unit *units,
                        const seq *q, bool bottleneck, bool ttft, px_cost_pipeline *out,
                        double *value, px_err *err)
{
    uint32_t L = ctx->model->n_layers, U = q->n;
    size_t W = (size_t)L + 1;
    double *f = malloc((size_t)U * W * sizeof *f);
    int32_t *pj = malloc((size_t)U * W * sizeof *pj);
    int32_t *pa = malloc((size_t)U * W * sizeof *pa);
    if (!f || !pj || !pa) {
        free(f);
        free(pj);
        free(pa);
        return px_err_set(err, PX_ENOMEM, "out of memory in the layer search");
    }
    for (size_t i = 0; i < (size_t)U * W; i++) {
        f[i] = INFINITY;
        pj[i] = pa[i] = -1;
    }
    uint32_t start_max = q->force_first ? 0 : U - 1;
    for (uint32_t j = 0; j < U; j++) {
        const px__plan_unit *u = &units[q->units[j]];
        for (uint32_t b = 1; b <= L; b++) {
            for (int32_t a = (int32_t)b - 1; a >= 0; a--) {
                const stage_cell *x = cell_of(ctx, cache, u, (uint32_t)a, b);
                if (!x)
                    goto oom;
                if (x->state < 0)
                    break; /* more blocks only need more memory */
                double t = ttft ? x->prefill : bottleneck ? x->serve : x->decode;
                size_t at = (size_t)j * W + b;
                if (a == 0) {
                    if (j <= start_max && t < f[at]) {
                        f[at] = t;
                        pj[at] = -1;
                        pa[at] = 0;
                    }
                    continue;
                }
                for (uint32_t back = 1; back <= DP_BACK && back <= j; back++) {
                    uint32_t jp = j - back;
                    double prev = f[(size_t)jp * W + (size_t)a];
                    if (!isfinite(prev))
                        continue;
                    const px__plan_unit *up = &units[q->units[jp]];
                    double h = px_cost_hop_s(ctx->fleet, cache->pre, ctx->cp, up->devices[0],
                                             u->devices[0], a - 1);
                    if (!isfinite(h))
                        continue;
                    double v = bottleneck ? PX_MAX(prev, PX_MAX(h, t)) : prev + h + t;
                    if (v < f[at]) {
                        f[at] = v;
                        pj[at] = (int32_t)jp;
                        pa[at] = a;
                    }
                }
            }
        }
    }
    int32_t best_j = -1;
    double best = INFINITY;
    for (uint32_t j = 0; j < U; j++)
        if (f[(size_t)j * W + L] < best) {
            best = f[(size_t)j * W + L];
            best_j = (int32_t)j;
        }
    px_status st = PX_OK;
    if (best_j < 0) {
        st = PX_EINFEASIBLE;
    } else {
        /* Walk back, then reverse into stage order. */
        px_cost_pipeline tmp;
        memset(&tmp, 0, sizeof tmp);
        int32_t j = best_j;
        uint32_t b = L;
        while (j >= 0 && tmp.n_stages < PX_COST_MAX_STAGES) {
            size_t at = (size_t)j * W + b;
            uint32_t a = (uint32_t)pa[at];
            const px__plan_unit *u = &units[q->units[j]];
            px_cost_stage s = unit_stage(ctx, cache->pre, u, a, b);
            const stage_cell *x = cell_of(ctx, cache, u, a, b);
            if (x && x->state == 2)
                s.kv = PX_COST_KV_HOST;
            tmp.stages[tmp.n_stages++] = s;
            int32_t jn = pj[at];
            b = a;
            j = jn;
            if (a == 0)
                break;
        }
        memset(out, 0, sizeof *out);
        out->n_stages = tmp.n_stages;
        for (uint32_t i = 0; i < tmp.n_stages; i++)
            out->stages[i] = tmp.stages[tmp.n_stages - 1 - i];
        *value = best;
    }
    free(f);
    free(pj);
    free(pa);
    return st;
oom:
    free(f);
    free(pj);
    free(pa);
    return px_err_set(err, PX_ENOMEM, "out of memory in the layer search");
}

/* ------------------------------------------------------------------ */
/* The search                                                          */
/* ------------------------------------------------------------------ */

static void seq_devices(const px__plan_ctx *ctx, const px__plan_unit *units, const seq *q,
                        char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < q->n && len + 1 < n; i++) {
        const px__plan_unit *u = &units[q->units[i]];
        for (uint32_t k = 0; k < u->tp && len + 1 < n; k++) {
            int w = snprintf(buf + len, n - len, "%s%s", len ? (k ? "+" : ", ") : "",
                             ctx->fleet->devices[u->devices[k]].id);
            if (w < 0)
                break;
            len += (size_t)w;
        }
    }
}

static void reject_sequence(px__plan_ctx *ctx, const px__plan_unit *units, const seq *q,
                            const px_cost_prefix *pre)
{
    char devs[160], need[32], have[32];
    seq_devices(ctx, units, q, devs, sizeof devs);
    double mem = 0;
    for (uint32_t i = 0; i < q->n; i++)
        mem += units[q->units[i]].mem;
    px__plan_fmt_bytes(pre->w_mem[pre->n_layers], need, sizeof need);
    px__plan_fmt_bytes(mem, have, sizeof have);
    uint64_t key = px_hash64(q->units, q->n * sizeof q->units[0]) ^ 0x5eULL;
    px__plan_reject_add(ctx, PX__REJ_MEMORY, key, devs, NULL,
                        "no cut fits: the blocks need %s of weights (plus KV cache and "
                        "overheads), these devices hold %s after headroom",
                        need, have);
}

/* Runs the DP on every sequence for one workload and precision and offers
 * the results to the pool (consider) or to *best (when best is set). */
static px_status search_one(px__plan_ctx *ctx, const px__plan_unit *units, const seq_set *seqs,
                            const px_cost_workload *wl, uint32_t prec_index, bool record,
                            px__plan_cand *best, bool *found, px_err *err)
{
    px_cost_prefix pre;
    px_status st = px_cost_prefix_init(&pre, ctx->model, &ctx->prec[prec_index].prec, wl, err);
    if (st != PX_OK)
        return st;
    dp_cache cache = {.pre = &pre};
    bool ttft = ctx->req->objective == PX_PLAN_OBJ_TTFT;
    for (size_t i = 0; i < seqs->n && st == PX_OK; i++) {
        bool any = false;
        for (int mode = 0; mode < 2 && st == PX_OK; mode++) {
            px_cost_pipeline pipe;
            double v;
            st = run_dp(ctx, &cache, units, &seqs->items[i], mode == 1, ttft && mode == 0, &pipe,
                        &v, err);
            if (st == PX_EINFEASIBLE) {
                st = PX_OK;
                continue;
            }
            if (st != PX_OK)
                break;
            any = true;
            for (int mb = 0; mb < 2; mb++) {
                px_cost_workload w = *wl;
                if (mb == 1) {
                    if (pipe.n_stages < 2 || wl->batch < 2)
                        break;
                    w.micro_batches = PX_MIN(wl->batch, pipe.n_stages);
                }
                if (record) {
                    px__plan_consider(ctx, &pipe, &w, prec_index,
                                      mode ? "dp-throughput" : "dp-latency");
                } else {
                    px__plan_cand c;
                    if (px__plan_evaluate(ctx, &pipe, &w, prec_index, &c) &&
                        (!*found || c.score < best->score)) {
                        *best = c;
                        *found = true;
                    }
                }
            }
        }
        if (!any && record && prec_index == 0)
            reject_sequence(ctx, units, &seqs->items[i], &pre);
    }
    dp_cache_release(&cache);
    px_cost_prefix_release(&pre);
    return st;
}

void px__plan_batches(const px__plan_ctx *ctx, uint32_t *b, size_t *n)
{
    const px_plan_request *req = ctx->req;
    *n = 0;
    if (req->workload.batch > 0) {
        b[(*n)++] = req->workload.batch;
        return;
    }
    if (req->objective == PX_PLAN_OBJ_LATENCY || req->objective == PX_PLAN_OBJ_TTFT) {
        b[(*n)++] = 1;
        return;
    }
    static const uint32_t llm[] = {1, 8, 32, 128};
    static const uint32_t dit[] = {1, 4, 16};
    const uint32_t *src = ctx->model->dit ? dit : llm;
    size_t k = ctx->model->dit ? PX_ARRAY_LEN(dit) : PX_ARRAY_LEN(llm);
    for (size_t i = 0; i < k; i++)
        b[(*n)++] = src[i];
}

static const char *const baseline_names[] = {"llamacpp", "exo", "gpustack", "single-type"};

px_status px__plan_best_on(px__plan_ctx *ctx, const bool *excluded, const px_cost_workload *wl,
                           uint32_t prec_index, px__plan_cand *out, px_err *err)
{
    px__plan_unit *units = NULL;
    size_t nu = 0;
    seq_set seqs = {0};
    px_status st = px__plan_units(ctx, excluded, &units, &nu, err);
    if (st == PX_OK)
        st = px__plan_make_sequences(ctx, units, nu, &seqs, err);
    bool found = false;
    if (st == PX_OK) {
        px_cost_workload w = *wl;
        w.micro_batches = 1;
        st = search_one(ctx, units, &seqs, &w, prec_index, false, out, &found, err);
    }
    free(units);
    free(seqs.items);
    if (st == PX_OK && !found)
        st = px_err_set(err, PX_EINFEASIBLE, "no placement fits on the remaining devices");
    return st;
}

px_status px__plan_search_plexus(px__plan_ctx *ctx, px__plan_layout *out, px_err *err)
{
    px__plan_unit *units = NULL;
    size_t nu = 0;
    seq_set seqs = {0};
    px_status st = px__plan_units(ctx, ctx->req->excluded, &units, &nu, err);
    if (st == PX_OK)
        st = px__plan_make_sequences(ctx, units, nu, &seqs, err);
    uint32_t batches[8];
    size_t n_batches;
    px__plan_batches(ctx, batches, &n_batches);
    for (size_t bi = 0; bi < n_batches && st == PX_OK; bi++) {
        px_cost_workload wl = ctx->req->workload;
        wl.batch = batches[bi];
        wl.micro_batches = 1;
        for (uint32_t k = 0; k < ctx->n_prec && st == PX_OK; k++)
            st = search_one(ctx, units, &seqs, &wl, k, true, NULL, NULL, err);
        /* The baselines' placements are candidates too, so plexus never
         * returns a plan its own model ranks below theirs. */
        for (size_t b = 0; b < PX_ARRAY_LEN(baseline_names) && st == PX_OK; b++) {
            px__plan_layout bl = {0};
            px_err berr;
            px__plan_place_fn fn = px__plan_policy_fn(baseline_names[b]);
            if (fn && fn(ctx, &bl, &berr) == PX_OK && bl.n_replicas > 0) {
                char origin[32];
                snprintf(origin, sizeof origin, "baseline:%s", baseline_names[b]);
                px__plan_consider(ctx, &bl.replicas[0], &wl, 0, origin);
            }
            px__plan_layout_release(&bl);
        }
    }
    free(units);
    free(seqs.items);
    if (st != PX_OK)
        return st;
    if (ctx->n_pool == 0)
        return px_err_set(err, PX_EINFEASIBLE, "no candidate fits");
    /* Rank the finalists by Monte Carlo: the probability of meeting the SLO
     * first, then, among those whose point value of the objective is the
     * best (to 0.01%), the pessimistic (p99) value.  A finalist worse at
     * the point never wins on its spread alone: the point is what plexus
     * and the baselines are compared on. */
    size_t n_final = PX_MIN(ctx->n_pool, (size_t)5);
    size_t best = 0;
    double best_meet = -1, best_val = INFINITY;
    bool best_near = false;
    const px_plan_request *req = ctx->req;
    double best_score = INFINITY;
    for (size_t i = 0; i < n_final; i++)
        if (ctx->pool[i].within_budget)
            best_score = PX_MIN(best_score, ctx->pool[i].score);
    for (size_t i = 0; i < n_final; i++) {
        px__plan_cand *c = &ctx->pool[i];
        if (!c->within_budget)
            continue;
        px_cost_uncertain u;
        if (px_cost_uncertainty(ctx->fleet, ctx->model, ctx->cp, &c->wl, &c->pipe, req->slo.tpot_s,
                                req->slo.ttft_s, &u, NULL) != PX_OK)
            continue;
        double val;
        switch (req->objective) {
        case PX_PLAN_OBJ_TTFT:
            val = u.ttft_s.p99;
            break;
        case PX_PLAN_OBJ_THROUGHPUT:
            val = -u.throughput.p99 * px__plan_replica_capacity(ctx, &c->pipe);
            break;
        case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
            val = c->usd_per_hour > 0 ? u.usd_per_token.p99 : -1e-30 * u.throughput.p99;
            break;
        case PX_PLAN_OBJ_JOULES_PER_TOKEN:
            val = u.joules_per_token.p99;
            break;
        default:
            val = u.tpot_s.p99;
            break;
        }
        bool slo = req->slo.tpot_s > 0 || req->slo.ttft_s > 0;
        double meet = slo ? u.p_meet_slo : 1.0;
        bool near = c->score <= best_score + 1e-4 * fabs(best_score);
        bool tie = fabs(meet - best_meet) <= 1e-12;
        if (meet > best_meet + 1e-12 ||
            (tie && ((near && !best_near) || (near == best_near && val < best_val)))) {
            best_meet = meet;
            best_val = val;
            best_near = near;
            best = i;
        }
    }
    if (best != 0) {
        /* Move the winner to the front; the rest keep their order. */
        px__plan_cand w = ctx->pool[best];
        memmove(&ctx->pool[1], &ctx->pool[0], best * sizeof w);
        ctx->pool[0] = w;
    }
    const px__plan_cand *win = &ctx->pool[0];
    if (!win->meets_slo) {
        char a[32], b[32], c[32], d[32];
        px_format_seconds(win->tpot_s, a, sizeof a);
        px_format_seconds(req->slo.tpot_s, b, sizeof b);
        px_format_seconds(win->ttft_s, c, sizeof c);
        px_format_seconds(req->slo.ttft_s, d, sizeof d);
        return px_err_set(err, PX_EINFEASIBLE,
                          "no placement meets the SLO: the best predicts %s per token (limit "
                          "%s) and %s to the first token (limit %s); relax --slo or add faster "
                          "devices",
                          a, req->slo.tpot_s > 0 ? b : "none", c, req->slo.ttft_s > 0 ? d : "none");
    }
    if (!win->within_budget)
        return px_err_set(err, PX_EINFEASIBLE,
                          "every feasible placement costs more than the budget of %.3g $/h "
                          "(the cheapest costs %.3g $/h)",
                          req->slo.budget_usd_h, win->usd_per_hour);
    out->wl = win->wl;
    out->prec_index = win->prec_index;
    return px__plan_layout_push(out, &win->pipe, err);
}

/* ------------------------------------------------------------------ */
/* DP sessions for the yardstick                                       */
/* ------------------------------------------------------------------ */

struct px__plan_dp_session {
    px__plan_ctx *ctx;
    px_cost_prefix pre;
    dp_cache cache;
    px__plan_unit *units; /* one single-device unit per fleet device */
};

px_status px__plan_dp_session_new(px__plan_ctx *ctx, const px_cost_workload *wl,
                                  px__plan_dp_session **out, px_err *err)
{
    px__plan_dp_session *s = calloc(1, sizeof *s);
    if (!s)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    s->ctx = ctx;
    s->units = calloc(ctx->fleet->n_devices, sizeof *s->units);
    px_status st = s->units ? px_cost_prefix_init(&s->pre, ctx->model, &ctx->prec[0].prec, wl, err)
                            : px_err_set(err, PX_ENOMEM, "out of memory");
    if (st != PX_OK) {
        free(s->units);
        free(s);
        return st;
    }
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++) {
        s->units[i].tp = 1;
        s->units[i].devices[0] = i;
        px__plan_fill_unit(ctx, &s->units[i]);
    }
    s->cache.pre = &s->pre;
    *out = s;
    return PX_OK;
}

void px__plan_dp_session_free(px__plan_dp_session *s)
{
    if (!s)
        return;
    dp_cache_release(&s->cache);
    px_cost_prefix_release(&s->pre);
    free(s->units);
    free(s);
}

px_status px__plan_dp_units(px__plan_dp_session *s, const px__plan_unit *units, size_t n,
                            bool bottleneck, px_cost_pipeline *out, double *value, px_err *err)
{
    seq q = {.force_first = true};
    for (size_t i = 0; i < n && q.n < PX__PLAN_SEQ_UNITS; i++)
        q.units[q.n++] = (uint32_t)i;
    px_status st = run_dp(s->ctx, &s->cache, units, &q, bottleneck, false, out, value, err);
    if (st == PX_OK && out->n_stages != q.n)
        st = PX_EINFEASIBLE; /* every unit must hold a block, in this order */
    return st;
}

/* The heuristic's pipeline for the yardstick: single-device units, stored
 * precision, the best DP answer over the generated sequences. */
px_status px__plan_heuristic_pipe(px__plan_ctx *ctx, const px_cost_workload *wl, bool bottleneck,
                                  px_cost_pipeline *out, px_err *err)
{
    px__plan_unit *units = NULL;
    size_t nu = 0;
    seq_set seqs = {0};
    px_status st = px__plan_units(ctx, NULL, &units, &nu, err);
    size_t k = 0;
    for (size_t i = 0; st == PX_OK && i < nu; i++)
        if (units[i].tp == 1)
            units[k++] = units[i];
    nu = k;
    if (st == PX_OK)
        st = px__plan_make_sequences(ctx, units, nu, &seqs, err);
    if (st == PX_OK && bottleneck) {
        /* Every device, fastest first: the bottleneck split may use all. */
        uint32_t *order = malloc((nu ? nu : 1) * sizeof *order);
        if (!order) {
            st = px_err_set(err, PX_ENOMEM, "out of memory");
        } else {
            px__plan_order_by_speed(units, nu, order);
            seq all = {0};
            for (size_t i = 0; i < nu && all.n < PX__PLAN_SEQ_UNITS; i++)
                all.units[all.n++] = order[i];
            st = px__plan_seq_push(&seqs, &all, err);
            seq rev = all;
            for (uint32_t i = 0; i < all.n; i++)
                rev.units[i] = all.units[all.n - 1 - i];
            if (st == PX_OK)
                st = px__plan_seq_push(&seqs, &rev, err);
            free(order);
        }
    }
    px_cost_prefix pre;
    double best = INFINITY;
    if (st == PX_OK)
        st = px_cost_prefix_init(&pre, ctx->model, &ctx->prec[0].prec, wl, err);
    if (st == PX_OK) {
        dp_cache cache = {.pre = &pre};
        for (size_t i = 0; i < seqs.n && st == PX_OK; i++) {
            px_cost_pipeline pipe;
            double v;
            st = run_dp(ctx, &cache, units, &seqs.items[i], bottleneck, false, &pipe, &v, err);
            if (st == PX_EINFEASIBLE) {
                st = PX_OK;
                continue;
            }
            if (st == PX_OK && v < best) {
                best = v;
                *out = pipe;
            }
        }
        dp_cache_release(&cache);
        px_cost_prefix_release(&pre);
    }
    free(units);
    free(seqs.items);
    if (st == PX_OK && !isfinite(best))
        st = px_err_set(err, PX_EINFEASIBLE, "no placement fits");
    return st;
}
