/* Units and sequences: tensor-parallel groups inside fast-link islands,
 * and the device sequences the layer search runs on, chosen by class and
 * criterion rather than by enumerating subsets. */
#include "base/common.h"

#include "plan/plan_impl.h"

/* ------------------------------------------------------------------ */
/* Units                                                               */
/* ------------------------------------------------------------------ */

typedef struct dev_order {
    uint32_t dev, island, klass;
} dev_order;

static int cmp_dev_order(const void *pa, const void *pb)
{
    const dev_order *a = pa, *b = pb;
    if (a->island != b->island)
        return a->island < b->island ? -1 : 1;
    if (a->klass != b->klass)
        return a->klass < b->klass ? -1 : 1;
    return a->dev < b->dev ? -1 : (a->dev > b->dev);
}

static bool tp_divides(const px_cost_model *m, uint32_t p)
{
    if (m->n_heads % p)
        return false;
    return m->n_kv_heads == 0 || m->n_kv_heads % p == 0;
}

void px__plan_fill_unit(const px__plan_ctx *ctx, px__plan_unit *u)
{
    u->speed = u->mem = u->usd_h = u->watts = 0;
    for (uint32_t k = 0; k < u->tp; k++) {
        const px_cost_device *d = &ctx->fleet->devices[u->devices[k]];
        u->speed += d->mem_bw;
        u->mem += d->mem_free * (1.0 - ctx->cp->headroom);
        u->usd_h += d->cost_rate;
        u->watts += d->power_active;
    }
    const px_cost_device *d0 = &ctx->fleet->devices[u->devices[0]];
    u->klass = d0->klass;
    u->node = d0->node;
    u->island = d0->island;
}

/* Whether the contract lets this group split a reduction; asked once per
 * group on the first block's regions. */
static bool split_allowed(px__plan_ctx *ctx, const uint32_t *devs, uint32_t p)
{
    px_cost_pipeline probe;
    memset(&probe, 0, sizeof probe);
    probe.n_stages = 1;
    probe.stages[0].tp = p;
    probe.stages[0].first = 0;
    probe.stages[0].last = 0;
    memcpy(probe.stages[0].devices, devs, p * sizeof *devs);
    char msg[320];
    if (px__plan_check_structure(ctx, &probe, msg, sizeof msg) == PX_VERDICT_FORBIDDEN) {
        px__plan_reject_add(ctx, PX__REJ_CONTRACT, px_hash64("tensor-split", 12), "", NULL,
                            "tensor parallelism: %s", msg);
        return false;
    }
    return true;
}

px_status px__plan_units(px__plan_ctx *ctx, const bool *excluded, px__plan_unit **out, size_t *n,
                         px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    dev_order *ord = malloc(f->n_devices * sizeof *ord);
    px__plan_unit *units = malloc(2 * f->n_devices * sizeof *units + sizeof *units);
    if (!ord || !units) {
        free(ord);
        free(units);
        return px_err_set(err, PX_ENOMEM, "out of memory listing device groups");
    }
    size_t m = 0, nu = 0;
    for (uint32_t i = 0; i < f->n_devices; i++)
        if (ctx->usable[i] && !(excluded && excluded[i]))
            ord[m++] =
                (dev_order){.dev = i, .island = f->devices[i].island, .klass = f->devices[i].klass};
    qsort(ord, m, sizeof *ord, cmp_dev_order);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && ord[j].island == ord[i].island && ord[j].klass == ord[i].klass)
            j++;
        uint32_t c = (uint32_t)(j - i);
        for (size_t k = i; k < j; k++) {
            px__plan_unit *u = &units[nu++];
            memset(u, 0, sizeof *u);
            u->tp = 1;
            u->devices[0] = ord[k].dev;
            px__plan_fill_unit(ctx, u);
        }
        /* Tensor-parallel groups only inside an island of fast links, and
         * only degrees that divide the heads evenly. */
        bool checked = false, allowed = false;
        for (uint32_t p = 2; p <= PX_MIN(c, (uint32_t)PX_COST_MAX_TP); p *= 2) {
            if (!tp_divides(ctx->model, p) || f->devices[ord[i].dev].cls == PX_HW_CLASS_CPU)
                continue;
            bool island = false;
            for (size_t k = i; k < j; k++)
                if (f->devices[ord[k].dev].island == ord[i].island && c > 1)
                    island = true;
            if (!island)
                continue;
            if (!checked) {
                uint32_t devs[PX_COST_MAX_TP];
                for (uint32_t k = 0; k < p; k++)
                    devs[k] = ord[i + k].dev;
                allowed = split_allowed(ctx, devs, p);
                checked = true;
            }
            if (!allowed)
                break;
            for (size_t k = i; k + p <= j && nu < 2 * f->n_devices; k += p) {
                px__plan_unit *u = &units[nu++];
                memset(u, 0, sizeof *u);
                u->tp = p;
                for (uint32_t q = 0; q < p; q++)
                    u->devices[q] = ord[k + q].dev;
                px__plan_fill_unit(ctx, u);
            }
        }
        i = j;
    }
    free(ord);
    *out = units;
    *n = nu;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Sequences                                                           */
/* ------------------------------------------------------------------ */

typedef enum crit {
    CRIT_SPEED = 0,
    CRIT_SPEED_PER_USD,
    CRIT_SPEED_PER_W,
    CRIT_MEMORY,
    CRIT_COUNT_
} crit;

typedef px__plan_seq seq;
typedef px__plan_seq_set seq_set;

static const px__plan_unit *g_units; /* for qsort: set per call under one thread */
static crit g_crit;

static double crit_value(const px__plan_unit *u, crit c)
{
    switch (c) {
    case CRIT_SPEED_PER_USD:
        return u->usd_h > 0 ? u->speed / u->usd_h : u->speed * 1e6;
    case CRIT_SPEED_PER_W:
        return u->speed / PX_MAX(u->watts, 1.0);
    case CRIT_MEMORY:
        return u->mem;
    default:
        return u->speed;
    }
}

static int cmp_units(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    double va = crit_value(&g_units[a], g_crit), vb = crit_value(&g_units[b], g_crit);
    if (va != vb)
        return va > vb ? -1 : 1;
    if (g_units[a].tp != g_units[b].tp)
        return g_units[a].tp > g_units[b].tp ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static bool seq_same(const seq *a, const seq *b)
{
    return a->n == b->n && a->force_first == b->force_first &&
           !memcmp(a->units, b->units, a->n * sizeof a->units[0]);
}

px_status px__plan_seq_push(seq_set *s, const seq *q, px_err *err)
{
    if (q->n == 0)
        return PX_OK;
    for (size_t i = 0; i < s->n; i++)
        if (seq_same(&s->items[i], q))
            return PX_OK;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 32;
        seq *r = realloc(s->items, nc * sizeof *r);
        if (!r)
            return px_err_set(err, PX_ENOMEM, "out of memory listing device sequences");
        s->items = r;
        s->cap = nc;
    }
    s->items[s->n++] = *q;
    return PX_OK;
}

/* Orders the picked units node by node (nodes in order of first pick), so a
 * pipeline crosses each slow link at most once. */
static void group_by_node(const px__plan_unit *units, seq *q)
{
    uint32_t out[PX__PLAN_SEQ_UNITS];
    bool taken[PX__PLAN_SEQ_UNITS] = {false};
    uint32_t n = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        if (taken[i])
            continue;
        uint32_t node = units[q->units[i]].node;
        for (uint32_t j = i; j < q->n; j++)
            if (!taken[j] && units[q->units[j]].node == node) {
                out[n++] = q->units[j];
                taken[j] = true;
            }
    }
    memcpy(q->units, out, n * sizeof out[0]);
}

static bool overlaps(const px__plan_unit *a, const px__plan_unit *b)
{
    for (uint32_t i = 0; i < a->tp; i++)
        for (uint32_t j = 0; j < b->tp; j++)
            if (a->devices[i] == b->devices[j])
                return true;
    return false;
}

/* Greedy pick along a sorted order: disjoint units until the memory need
 * is met, then `extra` more. */
static void greedy(const px__plan_unit *units, const uint32_t *order, size_t n, double need,
                   uint32_t extra, bool tp_only_max, seq *q)
{
    q->n = 0;
    double mem = 0;
    uint32_t after = 0;
    for (size_t i = 0; i < n && q->n < PX__PLAN_SEQ_UNITS; i++) {
        const px__plan_unit *u = &units[order[i]];
        if (tp_only_max != (u->tp > 1))
            continue;
        bool clash = false;
        for (uint32_t k = 0; k < q->n && !clash; k++)
            clash = overlaps(&units[q->units[k]], u);
        if (clash)
            continue;
        q->units[q->n++] = order[i];
        mem += u->mem;
        if (mem >= need && ++after > extra)
            break;
    }
    /* A selection short of memory still goes to the DP, which says so. */
    group_by_node(units, q);
}

px_status px__plan_make_sequences(px__plan_ctx *ctx, const px__plan_unit *units, size_t nu,
                                  seq_set *out, px_err *err)
{
    uint32_t *order = malloc((nu ? nu : 1) * sizeof *order);
    if (!order)
        return px_err_set(err, PX_ENOMEM, "out of memory ordering devices");
    double need = ctx->model->total_bytes;
    px_status st = PX_OK;
    g_units = units;
    for (int c = 0; c < CRIT_COUNT_ && st == PX_OK; c++) {
        for (size_t i = 0; i < nu; i++)
            order[i] = (uint32_t)i;
        g_crit = (crit)c;
        qsort(order, nu, sizeof *order, cmp_units);
        for (int tpmode = 0; tpmode < 2 && st == PX_OK; tpmode++) {
            seq q;
            memset(&q, 0, sizeof q);
            greedy(units, order, nu, need, 0, tpmode, &q);
            st = px__plan_seq_push(out, &q, err);
            greedy(units, order, nu, need, 3, tpmode, &q);
            if (st == PX_OK)
                st = px__plan_seq_push(out, &q, err);
            if (c == CRIT_SPEED && st == PX_OK) {
                /* Fastest last: the head (the classifier, often the
                 * heaviest stage) then lands on the fastest device. */
                px__plan_seq rev = q;
                for (uint32_t i = 0; i < q.n; i++)
                    rev.units[i] = q.units[q.n - 1 - i];
                st = px__plan_seq_push(out, &rev, err);
            }
            if (c == CRIT_SPEED && st == PX_OK) {
                /* The fastest unit first, whatever its links: the DP must
                 * use it, so its cost is on record if it loses. */
                greedy(units, order, nu, need, 1, tpmode, &q);
                if (q.n > 0) {
                    uint32_t first = order[0];
                    for (size_t i = 0; i < nu; i++)
                        if ((units[order[i]].tp > 1) == (tpmode == 1)) {
                            first = order[i];
                            break;
                        }
                    uint32_t k = 0;
                    seq f = {.force_first = true};
                    f.units[f.n++] = first;
                    for (k = 0; k < q.n && f.n < PX__PLAN_SEQ_UNITS; k++)
                        if (!overlaps(&units[q.units[k]], &units[first]))
                            f.units[f.n++] = q.units[k];
                    st = px__plan_seq_push(out, &f, err);
                }
            }
            /* Each of the best units alone, one per class. */
            uint32_t seen_klass[8];
            uint32_t n_seen = 0;
            for (size_t i = 0; i < nu && n_seen < 8 && st == PX_OK; i++) {
                const px__plan_unit *u = &units[order[i]];
                if ((u->tp > 1) != (tpmode == 1))
                    continue;
                bool dup = false;
                for (uint32_t k = 0; k < n_seen; k++)
                    dup |= seen_klass[k] == u->klass;
                if (dup)
                    continue;
                seen_klass[n_seen++] = u->klass;
                seq one = {.n = 1};
                one.units[0] = order[i];
                st = px__plan_seq_push(out, &one, err);
            }
        }
    }
    free(order);
    return st;
}

void px__plan_order_by_speed(const px__plan_unit *units, size_t nu, uint32_t *order)
{
    for (size_t i = 0; i < nu; i++)
        order[i] = (uint32_t)i;
    g_units = units;
    g_crit = CRIT_SPEED;
    qsort(order, nu, sizeof *order, cmp_units);
}
