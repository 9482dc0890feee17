/* Fallbacks: precomputed answers to the loss of each device of a plan and
 * to the degradation of each link its hops use (docs/formats/plan.md,
 * section Fallbacks). */
#include "base/common.h"

#include "plan/plan_impl.h"

/* Searches for device losses, and further searches for link fallbacks
 * whose endpoints the device searches did not cover: each bounded so that
 * big plans stay cheap to make. */
#define MAX_FALLBACK_SEARCHES 16
#define MAX_LINK_SEARCHES     16
/* A degraded link is costed at this fraction of its bandwidth. */
#define LINK_SLOWDOWN 10.0
/* Re-placing a pipeline reloads weights, so an alternative must beat the
 * plan on the slowed link by this fraction of the objective to be worth it. */
#define LINK_MARGIN 0.05

static const char *const action_names[] = {"keep", "avoid-sender", "avoid-receiver",
                                           "drop-replica"};

const char *px__plan_link_action_name(px__plan_link_action a)
{
    return (unsigned)a < PX_ARRAY_LEN(action_names) ? action_names[a] : "keep";
}

/* ------------------------------------------------------------------ */
/* Searches without one device, shared by both kinds of fallback        */
/* ------------------------------------------------------------------ */

typedef struct without {
    uint32_t device;
    bool feasible;
    px__plan_cand cand;
} without;

typedef struct search_cache {
    without items[MAX_FALLBACK_SEARCHES + MAX_LINK_SEARCHES];
    size_t n;
    bool *excl; /* per fleet device */
} search_cache;

/* The best single pipeline without device d: from the cache, or searched
 * when *used < limit.  *out is NULL when the budget is spent. */
static px_status best_without(px__plan_ctx *ctx, const px__plan_layout *l, search_cache *c,
                              uint32_t d, size_t *used, size_t limit, const without **out,
                              px_err *err)
{
    *out = NULL;
    for (size_t i = 0; i < c->n; i++)
        if (c->items[i].device == d) {
            *out = &c->items[i];
            return PX_OK;
        }
    if (*used >= limit || c->n >= PX_ARRAY_LEN(c->items))
        return PX_OK;
    (*used)++;
    size_t nd = ctx->fleet->n_devices;
    for (size_t q = 0; q < nd; q++)
        c->excl[q] = (ctx->req->excluded && ctx->req->excluded[q]) || q == d;
    without *w = &c->items[c->n];
    memset(w, 0, sizeof *w);
    w->device = d;
    px_err e2;
    px_status st = px__plan_best_on(ctx, c->excl, &l->wl, l->prec_index, &w->cand, &e2);
    if (st == PX_ENOMEM)
        return px_err_set(err, st, "%s", e2.msg);
    w->feasible = st == PX_OK;
    c->n++;
    *out = w;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Device losses                                                       */
/* ------------------------------------------------------------------ */

static px_status device_fallbacks(px__plan_ctx *ctx, px__plan_result *r, search_cache *c,
                                  px_err *err)
{
    const px__plan_layout *l = &r->layout;
    size_t total = 0;
    for (uint32_t i = 0; i < l->n_replicas; i++)
        for (uint32_t s = 0; s < l->replicas[i].n_stages; s++)
            total += l->replicas[i].stages[s].tp;
    r->fb = calloc(total ? total : 1, sizeof *r->fb);
    if (!r->fb)
        return px_err_set(err, PX_ENOMEM, "out of memory planning fallbacks");
    size_t searches = 0;
    for (uint32_t i = 0; i < l->n_replicas; i++) {
        for (uint32_t s = 0; s < l->replicas[i].n_stages; s++) {
            for (uint32_t k = 0; k < l->replicas[i].stages[s].tp; k++) {
                uint32_t d = l->replicas[i].stages[s].devices[k];
                px__plan_fallback *fb = &r->fb[r->n_fb++];
                fb->lost = d;
                if (l->n_replicas > 1) {
                    /* The other replicas keep serving. */
                    fb->feasible = true;
                    fb->n_replicas = l->n_replicas - 1;
                    fb->tpot_s = r->est[i == 0 ? 1 : 0].tpot_s;
                    fb->throughput = r->throughput - r->est[i].throughput;
                    snprintf(fb->note, sizeof fb->note,
                             "drop replica %u; the other %u keep serving", i, l->n_replicas - 1);
                    continue;
                }
                const without *w;
                px_status st =
                    best_without(ctx, l, c, d, &searches, MAX_FALLBACK_SEARCHES, &w, err);
                if (st != PX_OK)
                    return st;
                if (!w) {
                    snprintf(fb->note, sizeof fb->note,
                             "not precomputed (more than %d devices); plan again without it",
                             MAX_FALLBACK_SEARCHES);
                    continue;
                }
                if (!w->feasible) {
                    snprintf(fb->note, sizeof fb->note, "no placement fits without %s",
                             ctx->fleet->devices[d].id);
                    continue;
                }
                fb->feasible = true;
                fb->n_replicas = 1;
                fb->tpot_s = w->cand.tpot_s;
                fb->throughput = w->cand.throughput;
                px__plan_pipe_devices(ctx, &w->cand.pipe, fb->devices, sizeof fb->devices);
                snprintf(fb->note, sizeof fb->note, "re-planned without %s",
                         ctx->fleet->devices[d].id);
            }
        }
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Link degradation                                                    */
/* ------------------------------------------------------------------ */

/* A hop the layout uses: between consecutive stages (from the first
 * device of one to the first of the next, as the cost model routes it),
 * or the slowest ring link of a tensor-parallel group's all-reduce. */
typedef struct hop {
    uint32_t from, to, replica, stage;
    bool allreduce;
    px_cost_path path;
} hop;

/* What a layout delivers, in the terms the objectives compare. */
typedef struct figures {
    double tpot, ttft, thr, usd, watts;
} figures;

typedef struct link_state {
    px__plan_ctx *ctx;
    const px__plan_result *r;
    double *link_bw;     /* per hw link: 1, or 1 / LINK_SLOWDOWN for the one slowed */
    int32_t *uses;       /* per replica, the bottleneck links of its routes */
    size_t *uses_at;     /* n_replicas + 1 offsets into uses */
    px_cost_estimate *e; /* scratch */
} link_state;

static void add_figures(figures *f, const px_cost_estimate *e)
{
    f->tpot = PX_MAX(f->tpot, e->tpot_s);
    f->ttft = PX_MAX(f->ttft, e->ttft_s);
    f->thr += e->throughput;
    f->usd += e->usd_per_hour;
    f->watts += e->power_w;
}

/* Lower is better, as px__plan_score ranks candidates. */
static double metric(const px__plan_ctx *ctx, const figures *f)
{
    switch (ctx->req->objective) {
    case PX_PLAN_OBJ_TTFT:
        return f->ttft;
    case PX_PLAN_OBJ_THROUGHPUT:
        return -f->thr;
    case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
        return f->usd > 0 && f->thr > 0 ? f->usd / (3600.0 * f->thr) : -1e-30 * f->thr;
    case PX_PLAN_OBJ_JOULES_PER_TOKEN:
        return f->thr > 0 ? f->watts / f->thr : INFINITY;
    case PX_PLAN_OBJ_LATENCY:
    default:
        return f->tpot;
    }
}

static bool clearly_better(const px__plan_ctx *ctx, const figures *alt, const figures *cur)
{
    double a = metric(ctx, alt), c = metric(ctx, cur);
    return a < c - LINK_MARGIN * fabs(c);
}

/* The figure the objective looks at, for notes. */
static void fmt_objective(const px__plan_ctx *ctx, const figures *f, char *buf, size_t n)
{
    char t[32];
    switch (ctx->req->objective) {
    case PX_PLAN_OBJ_TTFT:
        px_format_seconds(f->ttft, t, sizeof t);
        snprintf(buf, n, "%s to the first token", t);
        break;
    case PX_PLAN_OBJ_THROUGHPUT:
        snprintf(buf, n, "%.4g tokens/s", f->thr);
        break;
    case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
        if (f->usd > 0)
            snprintf(buf, n, "%.4g tokens/$", 3600.0 * f->thr / f->usd);
        else
            snprintf(buf, n, "%.4g tokens/s", f->thr);
        break;
    case PX_PLAN_OBJ_JOULES_PER_TOKEN:
        snprintf(buf, n, "%.3g J/token", f->thr > 0 ? f->watts / f->thr : INFINITY);
        break;
    case PX_PLAN_OBJ_LATENCY:
    default:
        px_format_seconds(f->tpot, t, sizeof t);
        snprintf(buf, n, "%s per token", t);
        break;
    }
}

/* A route the inventory does not declare (an assumed host link) has no
 * link to slow, so the hop's own term is slowed instead: its transfer
 * (less the latency), or the group's all-reduce, and the step is summed
 * again as px_cost_eval_pipeline sums it. */
static void slow_undeclared(px_cost_estimate *e, const hop *h, uint32_t micro_batches)
{
    px_cost_stage_est *s = &e->stages[h->stage];
    double k = LINK_SLOWDOWN - 1.0;
    if (h->allreduce) {
        s->decode_s += k * s->allreduce_s;
        s->allreduce_s *= LINK_SLOWDOWN;
    } else {
        double dx = k * PX_MAX(s->xfer_s - h->path.latency, 0.0);
        s->xfer_s += dx;
        e->transfer_s += dx;
        e->ttft_s += k * PX_MAX(s->xfer_prefill_s - h->path.latency, 0.0);
    }
    double sum = e->transfer_s + e->executor_s, cycle = 0;
    for (uint32_t i = 0; i < e->n_stages; i++) {
        sum += e->stages[i].decode_s;
        cycle = PX_MAX(cycle, PX_MAX(e->stages[i].decode_s, e->stages[i].xfer_s));
    }
    double step = PX_MAX(sum, PX_MAX(micro_batches, 1u) * cycle);
    if (e->step_s > 0 && step > e->step_s) {
        e->tpot_s *= step / e->step_s;
        e->throughput *= e->step_s / step;
        e->step_s = step;
    }
}

static bool replica_uses(const link_state *ls, uint32_t j, int32_t link)
{
    for (size_t q = ls->uses_at[j]; q < ls->uses_at[j + 1]; q++)
        if (ls->uses[q] == link)
            return true;
    return false;
}

/* The layout with the hop's link slowed, leaving out replica skip
 * (UINT32_MAX: none).  Replicas whose routes do not cross the link keep
 * their figures. */
static void degraded_layout(const link_state *ls, const hop *h, uint32_t skip, figures *out)
{
    const px__plan_layout *l = &ls->r->layout;
    int32_t link = h->path.bottleneck;
    px_cost_sample smp = {.link_bw = ls->link_bw,
                          .eff_mem = ls->ctx->cp->eff_mem,
                          .eff_compute = ls->ctx->cp->eff_compute};
    memset(out, 0, sizeof *out);
    for (uint32_t j = 0; j < l->n_replicas; j++) {
        if (j == skip)
            continue;
        const px_cost_estimate *e = &ls->r->est[j];
        if (link >= 0 && replica_uses(ls, j, link)) {
            if (px_cost_eval_pipeline(ls->ctx->fleet, ls->ctx->model, ls->ctx->cp, &l->wls[j],
                                      &l->replicas[j], &smp, ls->e, NULL) == PX_OK &&
                ls->e->why == PX_COST_OK)
                e = ls->e;
        } else if (link < 0 && j == h->replica) {
            memcpy(ls->e, e, sizeof *e);
            slow_undeclared(ls->e, h, l->wls[j].micro_batches);
            e = ls->e;
        }
        add_figures(out, e);
    }
}

/* An alternative pipeline's figures while the link is slow: it may cross
 * the same link through other devices. */
static void degraded_cand(const link_state *ls, const hop *h, const px__plan_cand *c, figures *out)
{
    px_cost_sample smp = {.link_bw = ls->link_bw,
                          .eff_mem = ls->ctx->cp->eff_mem,
                          .eff_compute = ls->ctx->cp->eff_compute};
    memset(out, 0, sizeof *out);
    if (h->path.bottleneck >= 0 &&
        px_cost_eval_pipeline(ls->ctx->fleet, ls->ctx->model, ls->ctx->cp, &c->wl, &c->pipe, &smp,
                              ls->e, NULL) == PX_OK &&
        ls->e->why == PX_COST_OK) {
        add_figures(out, ls->e);
        return;
    }
    *out = (figures){.tpot = c->tpot_s,
                     .ttft = c->ttft_s,
                     .thr = c->throughput,
                     .usd = c->usd_per_hour,
                     .watts = c->joules_per_token * c->throughput};
}

/* The hops of the layout, in replica and stage order: a stage's
 * all-reduce before the hop that leaves it. */
static px_status collect_hops(link_state *ls, hop **out, size_t *n_out, px_err *err)
{
    px__plan_ctx *ctx = ls->ctx;
    const px__plan_layout *l = &ls->r->layout;
    size_t cap = 0, n_uses = 0;
    for (uint32_t i = 0; i < l->n_replicas; i++)
        for (uint32_t s = 0; s < l->replicas[i].n_stages; s++) {
            cap += 2;
            n_uses += 1 + l->replicas[i].stages[s].tp;
        }
    hop *hops = calloc(cap ? cap : 1, sizeof *hops);
    ls->uses = calloc(n_uses ? n_uses : 1, sizeof *ls->uses);
    ls->uses_at = calloc(l->n_replicas + 1, sizeof *ls->uses_at);
    if (!hops || !ls->uses || !ls->uses_at) {
        free(hops);
        return px_err_set(err, PX_ENOMEM, "out of memory planning link fallbacks");
    }
    size_t n = 0, u = 0;
    for (uint32_t i = 0; i < l->n_replicas; i++) {
        const px_cost_pipeline *p = &l->replicas[i];
        ls->uses_at[i] = u;
        for (uint32_t s = 0; s < p->n_stages; s++) {
            const px_cost_stage *st = &p->stages[s];
            if (st->tp > 1) {
                /* Every ring link carries the same bytes, so the slowest binds. */
                hop best = {.replica = i, .stage = s, .allreduce = true};
                for (uint32_t k = 0; k < st->tp; k++) {
                    uint32_t a = st->devices[k], b = st->devices[(k + 1) % st->tp];
                    px_cost_path pa = px_cost_fleet_path(ctx->fleet, a, b);
                    if (!pa.reachable)
                        continue;
                    if (pa.bottleneck >= 0)
                        ls->uses[u++] = pa.bottleneck;
                    if (!best.path.reachable || pa.bw < best.path.bw) {
                        best.from = a;
                        best.to = b;
                        best.path = pa;
                    }
                }
                if (best.path.reachable)
                    hops[n++] = best;
            }
            if (s + 1 < p->n_stages) {
                hop h = {.from = st->devices[0],
                         .to = p->stages[s + 1].devices[0],
                         .replica = i,
                         .stage = s};
                h.path = px_cost_fleet_path(ctx->fleet, h.from, h.to);
                if (!h.path.reachable || h.from == h.to)
                    continue;
                if (h.path.bottleneck >= 0)
                    ls->uses[u++] = h.path.bottleneck;
                hops[n++] = h;
            }
        }
    }
    ls->uses_at[l->n_replicas] = u;
    *out = hops;
    *n_out = n;
    return PX_OK;
}

static void hop_via(const px__plan_ctx *ctx, const hop *h, char *buf, size_t n)
{
    const px_hw_view *v = px_hw_graph_view(ctx->fleet->graph);
    if (h->path.bottleneck < 0 || (size_t)h->path.bottleneck >= v->n_links) {
        snprintf(buf, n, "assumed host link");
        return;
    }
    const px_hw_link *lk = &v->links[h->path.bottleneck];
    snprintf(buf, n, "%s", lk->id ? lk->id : px_hw_link_kind_name(lk->kind));
}

static void set_answer(px__plan_link_fallback *lf, px__plan_link_action a, const figures *f,
                       uint32_t n_replicas)
{
    lf->action = a;
    lf->feasible = true;
    lf->tpot_s = f->tpot;
    lf->throughput = f->thr;
    lf->n_replicas = n_replicas;
}

/* One replica: re-plan without either end of the hop, or keep. */
static px_status answer_single(link_state *ls, search_cache *c, size_t *searches, const hop *h,
                               const figures *cur, px__plan_link_fallback *lf, px_err *err)
{
    px__plan_ctx *ctx = ls->ctx;
    const px__plan_layout *l = &ls->r->layout;
    const uint32_t ends[2] = {h->from, h->to};
    const px__plan_link_action acts[2] = {PX__LINK_AVOID_SENDER, PX__LINK_AVOID_RECEIVER};
    char what[2][64], cur_s[64];
    fmt_objective(ctx, cur, cur_s, sizeof cur_s);
    const without *best = NULL;
    int best_k = 0;
    figures best_f = {0};
    for (int k = 0; k < 2; k++) {
        const without *w;
        px_status st = best_without(ctx, l, c, ends[k], searches, MAX_LINK_SEARCHES, &w, err);
        if (st != PX_OK)
            return st;
        if (!w) {
            snprintf(what[k], sizeof what[k], "not searched (budget spent)");
            continue;
        }
        if (!w->feasible) {
            snprintf(what[k], sizeof what[k], "nothing fits");
            continue;
        }
        figures f;
        degraded_cand(ls, h, &w->cand, &f);
        fmt_objective(ctx, &f, what[k], sizeof what[k]);
        if (!best || metric(ctx, &f) < metric(ctx, &best_f)) {
            best = w;
            best_k = k;
            best_f = f;
        }
    }
    if (best && clearly_better(ctx, &best_f, cur)) {
        set_answer(lf, acts[best_k], &best_f, 1);
        px__plan_pipe_devices(ctx, &best->cand.pipe, lf->devices, sizeof lf->devices);
        snprintf(lf->note, sizeof lf->note,
                 "re-plan without %s: %s against %s with the link %gx slower",
                 ctx->fleet->devices[ends[best_k]].id, what[best_k], cur_s, LINK_SLOWDOWN);
        return PX_OK;
    }
    set_answer(lf, PX__LINK_KEEP, cur, 1);
    px__plan_pipe_devices(ctx, &l->replicas[h->replica], lf->devices, sizeof lf->devices);
    snprintf(lf->note, sizeof lf->note,
             "keep: with the link %gx slower the plan gives %s; without %s: %s; without %s: %s",
             LINK_SLOWDOWN, cur_s, ctx->fleet->devices[ends[0]].id, what[0],
             ctx->fleet->devices[ends[1]].id, what[1]);
    return PX_OK;
}

/* Several replicas: drop the one that uses the hop, or keep. */
static void answer_replicas(link_state *ls, const hop *h, const figures *cur,
                            px__plan_link_fallback *lf)
{
    px__plan_ctx *ctx = ls->ctx;
    const px__plan_layout *l = &ls->r->layout;
    figures drop;
    degraded_layout(ls, h, h->replica, &drop);
    char cur_s[64], drop_s[64];
    fmt_objective(ctx, cur, cur_s, sizeof cur_s);
    fmt_objective(ctx, &drop, drop_s, sizeof drop_s);
    if (clearly_better(ctx, &drop, cur)) {
        set_answer(lf, PX__LINK_DROP_REPLICA, &drop, l->n_replicas - 1);
        snprintf(lf->note, sizeof lf->note,
                 "drop replica %u; the other %u keep serving: %s against %s with the link %gx "
                 "slower",
                 h->replica, l->n_replicas - 1, drop_s, cur_s, LINK_SLOWDOWN);
        return;
    }
    set_answer(lf, PX__LINK_KEEP, cur, l->n_replicas);
    px__plan_pipe_devices(ctx, &l->replicas[h->replica], lf->devices, sizeof lf->devices);
    snprintf(lf->note, sizeof lf->note,
             "keep: with the link %gx slower the plan gives %s; dropping replica %u gives %s",
             LINK_SLOWDOWN, cur_s, h->replica, drop_s);
}

static px_status link_fallbacks(px__plan_ctx *ctx, px__plan_result *r, search_cache *c, px_err *err)
{
    const px_hw_view *v = px_hw_graph_view(ctx->fleet->graph);
    link_state ls = {.ctx = ctx, .r = r};
    hop *hops = NULL;
    size_t n_hops = 0, searches = 0;
    px_status st = PX_OK;
    ls.link_bw = malloc((v->n_links ? v->n_links : 1) * sizeof *ls.link_bw);
    ls.e = malloc(sizeof *ls.e);
    if (!ls.link_bw || !ls.e) {
        st = px_err_set(err, PX_ENOMEM, "out of memory planning link fallbacks");
        goto done;
    }
    for (size_t i = 0; i < v->n_links; i++)
        ls.link_bw[i] = 1.0;
    st = collect_hops(&ls, &hops, &n_hops, err);
    if (st != PX_OK)
        goto done;
    r->lfb = calloc(n_hops ? n_hops : 1, sizeof *r->lfb);
    if (!r->lfb) {
        st = px_err_set(err, PX_ENOMEM, "out of memory planning link fallbacks");
        goto done;
    }
    for (size_t i = 0; i < n_hops && st == PX_OK; i++) {
        const hop *h = &hops[i];
        px__plan_link_fallback *lf = &r->lfb[r->n_lfb++];
        lf->from = h->from;
        lf->to = h->to;
        lf->replica = h->replica;
        lf->stage = h->stage;
        lf->allreduce = h->allreduce;
        hop_via(ctx, h, lf->via, sizeof lf->via);
        if (h->path.bottleneck >= 0)
            ls.link_bw[h->path.bottleneck] = 1.0 / LINK_SLOWDOWN;
        figures cur;
        degraded_layout(&ls, h, UINT32_MAX, &cur);
        lf->degraded_tpot_s = cur.tpot;
        lf->degraded_throughput = cur.thr;
        if (r->layout.n_replicas > 1)
            answer_replicas(&ls, h, &cur, lf);
        else
            st = answer_single(&ls, c, &searches, h, &cur, lf, err);
        if (h->path.bottleneck >= 0)
            ls.link_bw[h->path.bottleneck] = 1.0;
        if (st == PX_OK && h->path.bottleneck < 0) {
            size_t len = strlen(lf->note);
            snprintf(lf->note + len, sizeof lf->note - len,
                     " (the route rests on an assumed host link, so the hop's own transfer was "
                     "slowed)");
        }
    }
done:
    free(hops);
    free(ls.uses);
    free(ls.uses_at);
    free(ls.link_bw);
    free(ls.e);
    return st;
}

px_status px__plan_fallbacks(px__plan_ctx *ctx, px__plan_result *r, px_err *err)
{
    search_cache *c = calloc(1, sizeof *c);
    if (c)
        c->excl = calloc(ctx->fleet->n_devices ? ctx->fleet->n_devices : 1, sizeof *c->excl);
    if (!c || !c->excl) {
        free(c);
        return px_err_set(err, PX_ENOMEM, "out of memory planning fallbacks");
    }
    px_status st = device_fallbacks(ctx, r, c, err);
    if (st == PX_OK)
        st = link_fallbacks(ctx, r, c, err);
    free(c->excl);
    free(c);
    return st;
}
