/* Mitigation candidates: typed plan changes for a finding, each planned
 * with the planner on the same inventory (devices excluded, the batch
 * paced, the precision lowered where a relaxed contract would allow it). */
#include "base/common.h"

#include "heal/heal_impl.h"

#define MAX_CANDIDATES 16
#define MAX_SINGLES    16 /* single-device plans tried for FALLBACK_PLAN */

typedef struct gen {
    const px_heal_context *ctx;
    const px_hw_view *view;
    size_t nd;
    bool *lost; /* devices already lost, and the locus's */
    bool *excl; /* scratch */
    px_heal_candidate *items;
    size_t n;
    px_contract *relaxed;
} gen;

/* "a > b+c": the stages of a plan document, group members joined by '+'. */
static void plan_devices(const json_t *plan, char *buf, size_t cap)
{
    px_strbuf sb = PX_STRBUF_INIT;
    const json_t *stages = json_object_get(plan, "stages");
    size_t i;
    const json_t *st;
    json_array_foreach(stages, i, st)
    {
        const json_t *devs = json_object_get(st, "devices");
        if (i)
            px_strbuf_adds(&sb, " > ");
        size_t k;
        const json_t *d;
        json_array_foreach(devs, k, d)
        {
            if (k)
                px_strbuf_addch(&sb, '+');
            px_strbuf_adds(&sb, json_is_string(d) ? json_string_value(d) : "?");
        }
    }
    px_strlcpy(buf, sb.len ? sb.buf : "no stages", cap);
    px_strbuf_release(&sb);
}

static px_heal_candidate *add(gen *g, px_heal_action action)
{
    PX_ASSERT(g->n < MAX_CANDIDATES);
    px_heal_candidate *c = &g->items[g->n++];
    memset(c, 0, sizeof *c);
    c->action = action;
    c->tpot_p50_s = c->tpot_p99_s = c->throughput = NAN;
    c->feasible = true;
    return c;
}

static void mark_infeasible(px_heal_candidate *c, const char *why)
{
    c->feasible = false;
    c->infeasible_at_generation = true;
    px_strlcpy(c->reject_code, "infeasible", sizeof c->reject_code);
    px_strlcpy(c->reject_reason, why, sizeof c->reject_reason);
}

/* Plans with g->excl (and the contract given, or the context's).  *plan
 * gets the document on success; a planner failure other than PX_ENOMEM
 * and PX_EINVAL is returned as PX_EINFEASIBLE with its message in err. */
static px_status plan_on(gen *g, const px_contract *contract, json_t **plan, px_err *err)
{
    *plan = NULL;
    px_plan_request req = g->ctx->request;
    req.graph = g->ctx->graph;
    req.model = g->ctx->model;
    req.contract = contract;
    req.excluded = g->excl;
    req.fallbacks = false;
    req.compare_baselines = false;
    px_plan *p = NULL;
    px_status st = px_plan_search(&req, &p, err);
    if (st == PX_ENOMEM || st == PX_EINVAL)
        return st;
    if (st != PX_OK)
        return PX_EINFEASIBLE;
    *plan = px_plan_to_json(p);
    px_plan_free(p);
    return *plan ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory writing a plan");
}

/* A candidate planned without the lost devices and `drop`. */
static px_status add_planned(gen *g, px_heal_action action, const char *what, const bool *drop,
                             const px_contract *contract, px_heal_candidate **out, px_err *err)
{
    for (size_t i = 0; i < g->nd; i++)
        g->excl[i] = g->lost[i] || (drop && drop[i]);
    px_heal_candidate *c = add(g, action);
    if (out)
        *out = c;
    json_t *plan;
    px_err e;
    px_err_clear(&e);
    px_status st = plan_on(g, contract, &plan, &e);
    if (st == PX_ENOMEM || st == PX_EINVAL) {
        g->n--;
        return px_err_set(err, st, "%s", e.msg);
    }
    if (st != PX_OK) {
        px__heal_textf(c->label, sizeof c->label, "%s: no placement", what);
        char why[256];
        px__heal_textf(why, sizeof why, "the planner finds no placement: %s", e.msg);
        mark_infeasible(c, why);
        return PX_OK;
    }
    char devs[128];
    plan_devices(plan, devs, sizeof devs);
    px__heal_textf(c->label, sizeof c->label, "%s, plan again: %s", what, devs);
    c->plan = plan;
    return PX_OK;
}

static bool find_device(const gen *g, const char *id, uint32_t *idx)
{
    return id && id[0] && px_hw_graph_find_device(g->ctx->graph, id, idx);
}

static px_status need_device(const gen *g, const char *id, uint32_t *idx, px_err *err)
{
    if (!find_device(g, id, idx))
        return px_err_set(err, PX_EINVAL,
                          "heal: device \"%.80s\" is not in the inventory the plan was made on",
                          id ? id : "");
    return PX_OK;
}

/* Whether device i is in domain dom or in a domain under it. */
static bool in_domain(const px_hw_view *v, size_t i, uint32_t dom)
{
    const px_hw_device *d = &v->devices[i];
    for (size_t k = 0; k < d->n_domains; k++) {
        uint32_t x = d->domains[k];
        for (int depth = 0; x != PX_HW_NONE && x < v->n_domains && depth < 64; depth++) {
            if (x == dom)
                return true;
            x = v->domains[x].parent;
        }
    }
    return false;
}

/* The best plan on one device among those neither lost nor dropped. */
static px_status add_fallback(gen *g, const bool *drop, px_err *err)
{
    px_heal_candidate *c = add(g, PX_HEAL_ACT_FALLBACK_PLAN);
    json_t *best = NULL;
    double best_tpot = INFINITY;
    char last_why[200] = "no device is left";
    size_t tried = 0;
    for (size_t i = 0; i < g->nd && tried < MAX_SINGLES; i++) {
        if (g->lost[i] || (drop && drop[i]))
            continue;
        tried++;
        for (size_t k = 0; k < g->nd; k++)
            g->excl[k] = k != i;
        json_t *plan;
        px_err e;
        px_err_clear(&e);
        px_status st = plan_on(g, g->ctx->contract, &plan, &e);
        if (st == PX_ENOMEM) {
            json_decref(best);
            g->n--;
            return px_err_set(err, st, "%s", e.msg);
        }
        if (st != PX_OK) {
            px__heal_textf(last_why, sizeof last_why, "%s", e.msg);
            continue;
        }
        double tpot = json_number_value(json_object_get(
            json_object_get(json_object_get(plan, "predictions"), "tpot_s"), "p50"));
        if (tpot < best_tpot) {
            json_decref(best);
            best = plan;
            best_tpot = tpot;
        } else {
            json_decref(plan);
        }
    }
    if (!best) {
        px__heal_textf(c->label, sizeof c->label, "fall back to one device: none fits");
        char why[256];
        px__heal_textf(why, sizeof why,
                       "no single remaining device holds the model (%zu tried): %s", tried,
                       last_why);
        mark_infeasible(c, why);
        return PX_OK;
    }
    char devs[128];
    plan_devices(best, devs, sizeof devs);
    px__heal_textf(c->label, sizeof c->label, "fall back to one device, a slower verified plan: %s",
                   devs);
    c->plan = best;
    return PX_OK;
}

static px_status add_lower_precision(gen *g, const json_t *current, px_err *err)
{
    if (!g->relaxed) {
        px_status st = px_contract_builtin("relaxed", &g->relaxed, err);
        if (st != PX_OK)
            return st;
    }
    px_heal_candidate *c;
    px_status st =
        add_planned(g, PX_HEAL_ACT_LOWER_PRECISION, "lower precision", NULL, g->relaxed, &c, err);
    if (st != PX_OK || !c->plan)
        return st;
    const json_t *prec = json_object_get(c->plan, "precision");
    const json_t *was = current ? json_object_get(current, "precision") : NULL;
    if (was && json_equal((json_t *)prec, (json_t *)was)) {
        /* The relaxed planner keeps the precision: no lower one helps. */
        json_decref(c->plan);
        g->n--;
        return PX_OK;
    }
    char devs[128];
    plan_devices(c->plan, devs, sizeof devs);
    const char *w = json_string_value(json_object_get(prec, "weights"));
    const char *fw = json_string_value(json_object_get(prec, "ffn_weights"));
    const char *a = json_string_value(json_object_get(prec, "activations"));
    const char *kv = json_string_value(json_object_get(prec, "kv"));
    px__heal_textf(c->label, sizeof c->label,
                   "lower precision (weights %s, ffn %s, activations %s, kv %s), plan again: %s",
                   w ? w : "?", fw ? fw : "?", a ? a : "?", kv ? kv : "?", devs);
    return PX_OK;
}

static uint32_t current_batch(const json_t *current, const px_heal_context *ctx)
{
    json_int_t b =
        json_integer_value(json_object_get(json_object_get(current, "workload"), "batch"));
    if (b <= 0)
        b = ctx->request.workload.batch;
    return b > 0 && b < UINT32_MAX ? (uint32_t)b : 1;
}

static const char *locus_stage_text(const px_heal_locus *where, char *buf, size_t cap)
{
    if (where && where->device[0])
        px__heal_textf(buf, cap, "stage%u (%s)", where->stage, where->device);
    else if (where)
        px__heal_textf(buf, cap, "stage%u", where->stage);
    else
        px__heal_textf(buf, cap, "the failed stage");
    return buf;
}

/* The two ends of a link locus ("a>b"); "executor" ends are left empty. */
static void link_ends(const px_heal_locus *where, char a[96], char b[96])
{
    a[0] = b[0] = 0;
    if (!where)
        return;
    const char *gt = strchr(where->device, '>');
    if (!gt) {
        px_strlcpy(a, where->device, 96);
        return;
    }
    size_t la = (size_t)(gt - where->device);
    if (la < 96) {
        memcpy(a, where->device, la);
        a[la] = 0;
    }
    px_strlcpy(b, gt + 1, 96);
    if (!strcmp(a, "executor"))
        a[0] = 0;
    if (!strcmp(b, "executor"))
        b[0] = 0;
}

/* One planned candidate per end of a link locus (a device locus has one
 * end): the plan without that device.  A reroute avoids the link; a stale
 * report drops the device whose figures do not hold. */
static px_status plan_without_each_end(gen *g, const px_heal_locus *where, px_heal_action act,
                                       bool *drop, const px_contract *contract, px_err *err)
{
    char a[96], b[96], what[192];
    link_ends(where, a, b);
    const char *ends[2] = {a, b};
    for (int e = 0; e < 2; e++) {
        if (!ends[e][0])
            continue;
        uint32_t idx;
        px_status st = need_device(g, ends[e], &idx, err);
        if (st != PX_OK)
            return st;
        memset(drop, 0, g->nd * sizeof *drop);
        drop[idx] = true;
        if (act == PX_HEAL_ACT_REROUTE)
            px__heal_textf(what, sizeof what, "avoid %.90s: drop its %s %s", where->device,
                           e ? "receiver" : "sender", ends[e]);
        else
            px__heal_textf(what, sizeof what, "drop %s, whose reported figures do not hold",
                           ends[e]);
        if ((st = add_planned(g, act, what, drop, contract, NULL, err)) != PX_OK)
            return st;
    }
    return PX_OK;
}

static px_status gen_by_class(gen *g, const json_t *current, px_heal_fault_class cls,
                              const px_heal_locus *where, bool *drop, px_err *err)
{
    const px_heal_context *ctx = g->ctx;
    char what[192], stage[128];
    uint32_t idx;
    px_status st = PX_OK;
    switch (cls) {
    case PX_HEAL_DEVICE_LOSS:
    case PX_HEAL_CORRUPTION:
    case PX_HEAL_CRASH:
    case PX_HEAL_HANG: {
        /* The locus's device counts as lost; when it is unknown the
         * devices already lost stand alone. */
        const char *dev = where && where->kind != PX_HEAL_AT_NOTHING ? where->device : NULL;
        if (dev && dev[0]) {
            if ((st = need_device(g, dev, &idx, err)) != PX_OK)
                return st;
            drop[idx] = true;
            px__heal_textf(what, sizeof what, "drop %s", dev);
        } else {
            px__heal_textf(what, sizeof what, "drop the lost devices");
        }
        if ((st = add_planned(g, PX_HEAL_ACT_REPARTITION, what, drop, ctx->contract, NULL, err)) ||
            (st = add_fallback(g, drop, err)))
            return st;
        if (cls == PX_HEAL_CRASH || cls == PX_HEAL_HANG) {
            /* A fresh worker on the same device; never for corruption,
             * whose device would compute the same wrong numbers. */
            px_heal_candidate *c = add(g, PX_HEAL_ACT_RESTART_WORKER);
            px__heal_textf(c->label, sizeof c->label, "restart the worker of %s with the same plan",
                           locus_stage_text(where, stage, sizeof stage));
        }
        return PX_OK;
    }
    case PX_HEAL_DOMAIN_LOSS: {
        const char *dom = where ? where->device : "";
        if (!dom[0] || !px_hw_graph_find_domain(ctx->graph, dom, &idx))
            return px_err_set(err, PX_EINVAL,
                              "heal: failure domain \"%.80s\" is not in the inventory the plan "
                              "was made on",
                              dom);
        size_t members = 0;
        for (size_t i = 0; i < g->nd; i++)
            if (in_domain(g->view, i, idx)) {
                drop[i] = true;
                members++;
            }
        px__heal_textf(what, sizeof what, "drop %s (%zu devices)", dom, members);
        if ((st = add_planned(g, PX_HEAL_ACT_REPARTITION, what, drop, ctx->contract, NULL, err)))
            return st;
        return add_fallback(g, drop, err);
    }
    case PX_HEAL_LINK_DEGRADE:
    case PX_HEAL_LINK_LOSS:
    case PX_HEAL_INTERFERENCE: {
        if ((st = plan_without_each_end(g, where, PX_HEAL_ACT_REROUTE, drop, ctx->contract, err)) !=
            PX_OK)
            return st;
        if (cls == PX_HEAL_LINK_LOSS)
            return PX_OK;
        px_heal_candidate *c = add(g, PX_HEAL_ACT_NONE);
        px__heal_textf(c->label, sizeof c->label, "keep the plan: tolerate the slower hop %.90s",
                       where ? where->device : "");
        return add_lower_precision(g, current, err);
    }
    case PX_HEAL_THERMAL:
    case PX_HEAL_MEMORY_PRESSURE: {
        uint32_t batch = current_batch(current, ctx);
        px_heal_candidate *c = add(g, PX_HEAL_ACT_PACE);
        c->max_batch = batch > 1 ? batch / 2 : 1;
        px__heal_textf(c->label, sizeof c->label,
                       "pace: admit at most %u sequences (from %u) for %s", c->max_batch, batch,
                       cls == PX_HEAL_THERMAL ? "thermal headroom" : "memory headroom");
        if (batch <= 1)
            mark_infeasible(c, "the plan admits one sequence at a time already; pacing cannot "
                               "admit fewer");
        const char *dev = where ? where->device : "";
        if (dev[0] && find_device(g, dev, &idx)) {
            drop[idx] = true;
            px__heal_textf(what, sizeof what, "move off %s", dev);
            if ((st =
                     add_planned(g, PX_HEAL_ACT_REPARTITION, what, drop, ctx->contract, NULL, err)))
                return st;
        } else if (dev[0]) {
            return need_device(g, dev, &idx, err);
        }
        return add_lower_precision(g, current, err);
    }
    case PX_HEAL_STALE_TOPOLOGY: {
        if ((st = plan_without_each_end(g, where, PX_HEAL_ACT_REPARTITION, drop, ctx->contract,
                                        err)) != PX_OK)
            return st;
        px_heal_candidate *c = add(g, PX_HEAL_ACT_NONE);
        px__heal_textf(c->label, sizeof c->label, "keep the plan: it runs, slower than predicted");
        return PX_OK;
    }
    default: {
        px_heal_candidate *c = add(g, PX_HEAL_ACT_NONE);
        px__heal_textf(c->label, sizeof c->label, "keep the plan");
        return PX_OK;
    }
    }
}

px_status px_heal_candidates(const px_heal_context *ctx, const json_t *current_plan,
                             const px_heal_fault_class cls, const px_heal_locus *where,
                             const char *const *lost, size_t n_lost, px_heal_candidate **out,
                             size_t *n_out, px_err *err)
{
    *out = NULL;
    *n_out = 0;
    if (!ctx || !ctx->graph || !ctx->model)
        return px_err_set(err, PX_EINVAL, "heal: the context needs a graph and a model");
    if ((unsigned)cls >= PX_HEAL_FAULT_CLASS_COUNT_)
        return px_err_set(err, PX_EINVAL, "heal: fault class %d is unknown", (int)cls);
    gen g = {.ctx = ctx, .view = px_hw_graph_view(ctx->graph)};
    g.nd = g.view->n_devices;
    size_t nb = g.nd ? g.nd : 1;
    g.lost = calloc(nb, sizeof *g.lost);
    g.excl = calloc(nb, sizeof *g.excl);
    bool *drop = calloc(nb, sizeof *drop);
    g.items = calloc(MAX_CANDIDATES, sizeof *g.items);
    px_status st = PX_OK;
    if (!g.lost || !g.excl || !drop || !g.items) {
        st = px_err_set(err, PX_ENOMEM, "out of memory for candidates");
        goto fail_alloc;
    }
    for (size_t i = 0; i < n_lost; i++) {
        uint32_t idx;
        if ((st = need_device(&g, lost ? lost[i] : NULL, &idx, err)) != PX_OK)
            goto fail_alloc;
        g.lost[idx] = true;
    }
    if (ctx->request.excluded)
        for (size_t i = 0; i < g.nd; i++)
            g.lost[i] |= ctx->request.excluded[i];
    st = gen_by_class(&g, current_plan, cls, where, drop, err);
    if (st != PX_OK)
        goto fail_alloc;
    *out = g.items;
    *n_out = g.n;
    g.items = NULL;
fail_alloc:
    px_heal_candidates_free(g.items, g.n);
    px_contract_free(g.relaxed);
    free(drop);
    free(g.excl);
    free(g.lost);
    return st;
}
