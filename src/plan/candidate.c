/* Candidates: scoring, the pool of the best, rejections with reasons, and
 * the contract's verdict on a pipeline's cuts and splits. */
#include "base/common.h"

#include "plan/plan_impl.h"

const char *px__plan_reason_name(px__plan_reason r)
{
    switch (r) {
    case PX__REJ_MEMORY:
        return "memory";
    case PX__REJ_CONTRACT:
        return "contract";
    case PX__REJ_CAPABILITY:
        return "capability";
    case PX__REJ_NO_PATH:
        return "no-path";
    case PX__REJ_SLO:
        return "slo";
    case PX__REJ_BUDGET:
        return "budget";
    case PX__REJ_DOMINATED:
        return "dominated";
    default:
        return "unknown";
    }
}

void px__plan_fmt_bytes(double b, char *buf, size_t n)
{
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (fabs(b) >= gib)
        snprintf(buf, n, "%.3g GiB", b / gib);
    else
        snprintf(buf, n, "%.3g MiB", b / (1024.0 * 1024.0));
}

px_status px__plan_layout_push_wl(px__plan_layout *l, const px_cost_pipeline *p,
                                  const px_cost_workload *wl, px_err *err)
{
    if (l->n_replicas == l->cap) {
        uint32_t ncap = l->cap ? l->cap * 2 : 4;
        px_cost_pipeline *r = realloc(l->replicas, ncap * sizeof *r);
        if (!r)
            return px_err_set(err, PX_ENOMEM, "out of memory building a layout");
        l->replicas = r;
        px_cost_workload *w = realloc(l->wls, ncap * sizeof *w);
        if (!w)
            return px_err_set(err, PX_ENOMEM, "out of memory building a layout");
        l->wls = w;
        l->cap = ncap;
    }
    l->wls[l->n_replicas] = *wl;
    l->replicas[l->n_replicas++] = *p;
    return PX_OK;
}

px_status px__plan_layout_push(px__plan_layout *l, const px_cost_pipeline *p, px_err *err)
{
    px_cost_workload wl = l->wl;
    return px__plan_layout_push_wl(l, p, &wl, err);
}

void px__plan_layout_set_wl(px__plan_layout *l, const px_cost_workload *wl)
{
    l->wl = *wl;
    for (uint32_t i = 0; i < l->n_replicas; i++)
        l->wls[i] = *wl;
}

void px__plan_layout_release(px__plan_layout *l)
{
    free(l->replicas);
    free(l->wls);
    l->replicas = NULL;
    l->wls = NULL;
    l->n_replicas = l->cap = 0;
}

uint64_t px__plan_pipe_key(const px_cost_pipeline *p)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < p->n_stages; i++) {
        const px_cost_stage *s = &p->stages[i];
        int32_t v[6 + PX_COST_MAX_TP];
        size_t n = 0;
        v[n++] = s->first;
        v[n++] = s->last;
        v[n++] = (int32_t)s->tp;
        v[n++] = (int32_t)s->kv;
        v[n++] = (int32_t)s->prec.ffn_weights * 64 + (int32_t)s->prec.weights;
        v[n++] = (int32_t)s->prec.kv * 64 + (int32_t)s->prec.activations;
        for (uint32_t k = 0; k < s->tp; k++)
            v[n++] = (int32_t)s->devices[k];
        h ^= px_hash64(v, n * sizeof v[0]);
        h *= 1099511628211ull;
    }
    return h;
}

void px__plan_pipe_devices(const px__plan_ctx *ctx, const px_cost_pipeline *p, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < p->n_stages && len + 1 < n; i++) {
        const px_cost_stage *s = &p->stages[i];
        for (uint32_t k = 0; k < s->tp && len + 1 < n; k++) {
            int w = snprintf(buf + len, n - len, "%s%s%s", len ? (k ? "+" : " > ") : "",
                             ctx->fleet->devices[s->devices[k]].id, "");
            if (w < 0)
                break;
            len += (size_t)w;
        }
    }
    if (len >= n && n > 4)
        memcpy(buf + n - 4, "...", 4);
}

double px__plan_replica_capacity(const px__plan_ctx *ctx, const px_cost_pipeline *p)
{
    uint32_t used[64], klass[64];
    size_t n = 0;
    for (uint32_t s = 0; s < p->n_stages; s++)
        for (uint32_t k = 0; k < p->stages[s].tp; k++) {
            uint32_t c = ctx->fleet->devices[p->stages[s].devices[k]].klass;
            size_t i = 0;
            while (i < n && klass[i] != c)
                i++;
            if (i == n) {
                if (n == PX_ARRAY_LEN(klass))
                    return 1;
                klass[n] = c;
                used[n++] = 0;
            }
            used[i]++;
        }
    double r = INFINITY;
    for (size_t i = 0; i < n; i++)
        r = PX_MIN(r, floor((double)ctx->class_avail[klass[i]] / used[i]));
    return isfinite(r) && r >= 1 ? r : 1;
}

double px__plan_score(const px__plan_ctx *ctx, const px_cost_estimate *e, const px_cost_pipeline *p)
{
    switch (ctx->req->objective) {
    case PX_PLAN_OBJ_TTFT:
        return e->ttft_s;
    case PX_PLAN_OBJ_THROUGHPUT:
        return -e->throughput * px__plan_replica_capacity(ctx, p);
    case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
        /* Free devices cost nothing: then more tokens per second wins. */
        return e->usd_per_hour > 0 ? e->usd_per_token : -1e-30 * e->throughput;
    case PX_PLAN_OBJ_JOULES_PER_TOKEN:
        return e->joules_per_token;
    case PX_PLAN_OBJ_LATENCY:
    default:
        return e->tpot_s;
    }
}

void px__plan_reject_add(px__plan_ctx *ctx, px__plan_reason r, uint64_t key, const char *devices,
                         const char *cause, const char *fmt, ...)
{
    for (size_t i = 0; i < ctx->n_rej; i++)
        if (ctx->rej[i].reason == r && ctx->rej[i].key == key)
            return;
    if (ctx->n_rej >= PX__PLAN_MAX_REJECT)
        return;
    px__plan_reject *x = &ctx->rej[ctx->n_rej++];
    memset(x, 0, sizeof *x);
    x->reason = r;
    x->key = key;
    px_strlcpy(x->devices, devices ? devices : "", sizeof x->devices);
    px_strlcpy(x->cause, cause ? cause : "", sizeof x->cause);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->message, sizeof x->message, fmt, ap);
    va_end(ap);
}

static bool split_checked(const px_contract_clause **seen, size_t n, const px_contract_clause *c)
{
    for (size_t i = 0; i < n; i++)
        if (seen[i] == c)
            return true;
    return false;
}

px_verdict px__plan_check_structure(px__plan_ctx *ctx, const px_cost_pipeline *p, char *msg,
                                    size_t n)
{
    px_verdict worst = PX_VERDICT_ALLOWED;
    char region[64];
    for (uint32_t i = 0; i + 1 < p->n_stages; i++) {
        const px_cost_stage *next = &p->stages[i + 1];
        px_contract_device pair[2] = {ctx->cdev[p->stages[i].devices[0]],
                                      ctx->cdev[next->devices[0]]};
        if (next->last >= next->first)
            snprintf(region, sizeof region, "layer.%d.attention", next->first);
        else
            snprintf(region, sizeof region, "head");
        px_transform t = {.kind = PX_TRANSFORM_PIPELINE_CUT, .devices = pair, .n_devices = 2};
        px_contract_decision d;
        if (px_contract_evaluate(ctx->contract, region, &t, NULL, 0, &d, NULL) != PX_OK)
            continue;
        if (d.verdict > worst)
            worst = d.verdict;
        if (d.verdict == PX_VERDICT_FORBIDDEN) {
            snprintf(msg, n, "%s: %s (%s)", region, d.message, px_contract_reason_name(d.reason));
            px_contract_decision_release(&d);
            return worst;
        }
        px_contract_decision_release(&d);
    }
    for (uint32_t i = 0; i < p->n_stages; i++) {
        const px_cost_stage *s = &p->stages[i];
        if (s->tp < 2)
            continue;
        px_contract_device group[PX_COST_MAX_TP];
        for (uint32_t k = 0; k < s->tp; k++)
            group[k] = ctx->cdev[s->devices[k]];
        const px_contract_clause *seen[8];
        size_t n_seen = 0;
        for (int32_t l = s->first; l <= s->last; l++) {
            for (int part = 0; part < 2; part++) {
                snprintf(region, sizeof region, "layer.%d.%s", l, part ? "ffn" : "attention");
                const px_contract_clause *cl;
                if (px_contract_lookup(ctx->contract, region, &cl, NULL) != PX_OK ||
                    split_checked(seen, n_seen, cl))
                    continue;
                if (n_seen < PX_ARRAY_LEN(seen))
                    seen[n_seen++] = cl;
                px_transform t = {.kind = PX_TRANSFORM_TENSOR_SPLIT,
                                  .split = PX_SPLIT_REDUCTION,
                                  .devices = group,
                                  .n_devices = s->tp};
                px_contract_decision d;
                if (px_contract_evaluate(ctx->contract, region, &t, NULL, 0, &d, NULL) != PX_OK)
                    continue;
                if (d.verdict > worst)
                    worst = d.verdict;
                if (d.verdict == PX_VERDICT_FORBIDDEN) {
                    snprintf(msg, n, "%s: %s (%s)", region, d.message,
                             px_contract_reason_name(d.reason));
                    px_contract_decision_release(&d);
                    return worst;
                }
                px_contract_decision_release(&d);
            }
        }
    }
    return worst;
}

static int cand_cmp(const px__plan_cand *a, const px__plan_cand *b)
{
    bool oka = a->meets_slo && a->within_budget, okb = b->meets_slo && b->within_budget;
    if (oka != okb)
        return oka ? -1 : 1;
    /* Scores within 1e-9 relative count as equal; then fewer devices and
     * lower latency break the tie, and the key makes it total. */
    double tol = 1e-9 * PX_MAX(fabs(a->score), fabs(b->score));
    if (a->score < b->score - tol)
        return -1;
    if (a->score > b->score + tol)
        return 1;
    if (a->tpot_s != b->tpot_s)
        return a->tpot_s < b->tpot_s ? -1 : 1;
    if (a->usd_per_hour != b->usd_per_hour)
        return a->usd_per_hour < b->usd_per_hour ? -1 : 1;
    return a->key < b->key ? -1 : (a->key > b->key);
}

static void pool_insert(px__plan_ctx *ctx, const px__plan_cand *c)
{
    size_t pos = ctx->n_pool;
    while (pos > 0 && cand_cmp(c, &ctx->pool[pos - 1]) < 0)
        pos--;
    if (pos >= PX__PLAN_POOL)
        return;
    size_t n_move = ctx->n_pool - pos;
    if (ctx->n_pool == PX__PLAN_POOL)
        n_move--;
    memmove(&ctx->pool[pos + 1], &ctx->pool[pos], n_move * sizeof *c);
    ctx->pool[pos] = *c;
    if (ctx->n_pool < PX__PLAN_POOL)
        ctx->n_pool++;
}

static void reject_infeasible(px__plan_ctx *ctx, const px_cost_pipeline *p, uint64_t key,
                              const px_cost_estimate *e, const char *devices)
{
    const px_cost_stage *s = &p->stages[e->why_stage < p->n_stages ? e->why_stage : 0];
    const char *dev = ctx->fleet->devices[s->devices[0]].id;
    char need[32], lim[32];
    switch (e->why) {
    case PX_COST_NO_MEMORY: {
        if (e->why_host) {
            px__plan_fmt_bytes(e->why_bytes, need, sizeof need);
            px__plan_reject_add(ctx, PX__REJ_MEMORY, key, devices, NULL,
                                "the host KV cache of the stages on %s's node exceeds its host "
                                "memory after headroom by %s",
                                dev, need);
            break;
        }
        const px_cost_mem *m = &e->stages[e->why_stage].mem;
        px__plan_fmt_bytes(m->total, need, sizeof need);
        px__plan_fmt_bytes(m->limit, lim, sizeof lim);
        px__plan_reject_add(ctx, PX__REJ_MEMORY, key, devices, NULL,
                            "stage %u on %s needs %s per device but %s is free after "
                            "headroom",
                            e->why_stage, dev, need, lim);
        break;
    }
    case PX_COST_NO_PATH:
        px__plan_reject_add(ctx, PX__REJ_NO_PATH, key, devices, NULL,
                            "stage %u on %s has no route to its neighbour", e->why_stage, dev);
        break;
    case PX_COST_NO_CAPABILITY:
        px__plan_reject_add(ctx, PX__REJ_CAPABILITY, key, devices, NULL,
                            "%s lacks an op or compute dtype the model needs", dev);
        break;
    default:
        break;
    }
}

static void fill_cand(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                      uint32_t prec_index, uint64_t key, const px_cost_estimate *e,
                      px__plan_cand *c)
{
    memset(c, 0, sizeof *c);
    c->pipe = *p;
    c->wl = *wl;
    c->tpot_s = e->tpot_s;
    c->ttft_s = e->ttft_s;
    c->throughput = e->throughput;
    c->joules_per_token = e->joules_per_token;
    c->usd_per_hour = e->usd_per_hour;
    c->tokens_per_usd = e->tokens_per_usd;
    c->transfer_s = e->transfer_s;
    c->host_node = e->host_node;
    c->host_use = e->step_s > 0 ? e->host_cores_s / e->step_s : 0;
    c->score = px__plan_score(ctx, e, p);
    c->prec_index = prec_index;
    c->key = key;
    const px_plan_slo *slo = &ctx->req->slo;
    c->meets_slo = (slo->tpot_s <= 0 || e->tpot_s <= slo->tpot_s) &&
                   (slo->ttft_s <= 0 || e->ttft_s <= slo->ttft_s);
    c->within_budget = slo->budget_usd_h <= 0 || e->usd_per_hour <= slo->budget_usd_h;
}

static uint64_t cand_key(const px_cost_pipeline *p, const px_cost_workload *wl)
{
    return px__plan_pipe_key(p) ^ ((uint64_t)wl->batch << 40) ^ ((uint64_t)wl->micro_batches << 52);
}

/* Whether a stage of p has more devices than the request allows. */
static bool over_max_tp(const px__plan_ctx *ctx, const px_cost_pipeline *p)
{
    uint32_t m = ctx->req ? ctx->req->max_tp : 0;
    for (uint32_t i = 0; m && i < p->n_stages; i++)
        if (p->stages[i].tp > m)
            return true;
    return false;
}

bool px__plan_evaluate(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                       uint32_t prec_index, px__plan_cand *out)
{
    if (over_max_tp(ctx, p))
        return false;
    char msg[320];
    if (px__plan_check_structure(ctx, p, msg, sizeof msg) == PX_VERDICT_FORBIDDEN)
        return false;
    px_cost_estimate *e = ctx->scratch;
    ctx->n_evaluated++;
    if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, wl, p, NULL, e, NULL) != PX_OK ||
        e->why != PX_COST_OK)
        return false;
    fill_cand(ctx, p, wl, prec_index, cand_key(p, wl), e, out);
    return true;
}

bool px__plan_consider(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                       uint32_t prec_index, const char *origin)
{
    if (over_max_tp(ctx, p))
        return false;
    uint64_t key = cand_key(p, wl);
    for (size_t i = 0; i < ctx->n_pool; i++)
        if (ctx->pool[i].key == key)
            return false;
    char devices[160];
    px__plan_pipe_devices(ctx, p, devices, sizeof devices);
    char msg[320];
    if (px__plan_check_structure(ctx, p, msg, sizeof msg) == PX_VERDICT_FORBIDDEN) {
        px__plan_reject_add(ctx, PX__REJ_CONTRACT, key, devices, NULL, "%s", msg);
        return false;
    }
    px_cost_estimate *e = ctx->scratch;
    ctx->n_evaluated++;
    if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, wl, p, NULL, e, NULL) != PX_OK)
        return false;
    if (e->why != PX_COST_OK) {
        reject_infeasible(ctx, p, key, e, devices);
        return false;
    }
    px__plan_cand c;
    fill_cand(ctx, p, wl, prec_index, key, e, &c);
    px_strlcpy(c.origin, origin, sizeof c.origin);
    if (!c.within_budget)
        px__plan_reject_add(ctx, PX__REJ_BUDGET, key, devices, NULL,
                            "costs %.3g $/h, over the budget of %.3g $/h", e->usd_per_hour,
                            ctx->req->slo.budget_usd_h);
    pool_insert(ctx, &c);
    return true;
}
