/* Units and sequences: tensor-parallel groups of identical devices over
 * any link the cost model prices, and the device sequences the layer
 * search runs on, chosen by class, tensor-parallel degree per class and
 * criterion rather than by enumerating subsets.  One sequence may mix
 * groups of one class with single devices of another. */
#include "base/common.h"

#include "plan/plan_impl.h"

/* ------------------------------------------------------------------ */
/* Units                                                               */
/* ------------------------------------------------------------------ */

typedef struct dev_order {
    uint32_t dev, island, node, klass;
} dev_order;

/* Devices of one class together; inside a class, island by island and node
 * by node, so consecutive devices share the fastest link there is. */
static int cmp_dev_order(const void *pa, const void *pb)
{
    const dev_order *a = pa, *b = pb;
    if (a->klass != b->klass)
        return a->klass < b->klass ? -1 : 1;
    if (a->island != b->island)
        return a->island < b->island ? -1 : 1;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
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
    /* A group whose members are not all in one island gets an island of
     * its own (past every real one), so the layer search does not share
     * its figures with a group on faster links. */
    for (uint32_t k = 1; k < u->tp; k++)
        if (ctx->fleet->devices[u->devices[k]].island != d0->island) {
            u->island = (uint32_t)ctx->fleet->n_islands + u->devices[0];
            break;
        }
}

/* The largest group the request allows. */
static uint32_t max_tp(const px__plan_ctx *ctx)
{
    uint32_t m = ctx->req ? ctx->req->max_tp : 0;
    return m ? PX_MIN(m, (uint32_t)PX_COST_MAX_TP) : (uint32_t)PX_COST_MAX_TP;
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

static int cmp_by_bandwidth(const void *pa, const void *pb, void *fleet)
{
    const px_cost_fleet *f = fleet;
    const dev_order *a = pa, *b = pb;
    double x = f->devices[a->dev].mem_bw, y = f->devices[b->dev].mem_bw;
    if (x != y)
        return x > y ? -1 : 1;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    return a->dev < b->dev ? -1 : (a->dev > b->dev);
}

/* Groups of devices of different classes: equal shards run at the pace of
 * the slowest member, so neighbours in memory bandwidth are grouped (the
 * fastest two, the next two, ...).  Only groups that mix classes are
 * added; the others are already there. */
static size_t mixed_groups(px__plan_ctx *ctx, dev_order *ord, size_t m, px__plan_unit *units,
                           size_t nu, size_t cap)
{
    const px_cost_fleet *f = ctx->fleet;
    size_t k = 0;
    for (size_t i = 0; i < m; i++)
        if (f->devices[ord[i].dev].cls != PX_HW_CLASS_CPU)
            ord[k++] = ord[i];
    qsort_r(ord, k, sizeof *ord, cmp_by_bandwidth, (void *)f);
    bool checked = false;
    for (uint32_t p = 2; p <= PX_MIN((uint32_t)k, max_tp(ctx)); p *= 2) {
        if (!tp_divides(ctx->model, p))
            continue;
        for (size_t i = 0; i + p <= k && nu < cap; i += p) {
            bool mixed = false;
            for (uint32_t q = 1; q < p; q++)
                mixed |= ord[i + q].klass != ord[i].klass;
            if (!mixed)
                continue;
            uint32_t devs[PX_COST_MAX_TP];
            for (uint32_t q = 0; q < p; q++)
                devs[q] = ord[i + q].dev;
            if (!checked && !split_allowed(ctx, devs, p))
                return nu;
            checked = true;
            px__plan_unit *u = &units[nu++];
            memset(u, 0, sizeof *u);
            u->tp = p;
            memcpy(u->devices, devs, p * sizeof devs[0]);
            px__plan_fill_unit(ctx, u);
            /* An island of its own: the layer search keys a group's
             * figures by its first device's class and its island. */
            u->island = (uint32_t)(f->n_islands + f->n_devices) + u->devices[0];
        }
    }
    return nu;
}

px_status px__plan_units(px__plan_ctx *ctx, const bool *excluded, px__plan_unit **out, size_t *n,
                         px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    dev_order *ord = malloc(f->n_devices * sizeof *ord);
    px__plan_unit *units = malloc(3 * f->n_devices * sizeof *units + sizeof *units);
    if (!ord || !units) {
        free(ord);
        free(units);
        return px_err_set(err, PX_ENOMEM, "out of memory listing device groups");
    }
    size_t m = 0, nu = 0;
    for (uint32_t i = 0; i < f->n_devices; i++)
        if (ctx->usable[i] && !(excluded && excluded[i]))
            ord[m++] = (dev_order){.dev = i,
                                   .island = f->devices[i].island,
                                   .node = f->devices[i].node,
                                   .klass = f->devices[i].klass};
    qsort(ord, m, sizeof *ord, cmp_dev_order);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && ord[j].klass == ord[i].klass)
            j++;
        uint32_t c = (uint32_t)(j - i);
        for (size_t k = i; k < j; k++) {
            px__plan_unit *u = &units[nu++];
            memset(u, 0, sizeof *u);
            u->tp = 1;
            u->devices[0] = ord[k].dev;
            px__plan_fill_unit(ctx, u);
        }
        /* Tensor-parallel groups of identical devices over whatever links
         * join them (the cost model prices the ring: NVLink inside an
         * island, PCIe through the host, or the network), only degrees
         * that divide the heads evenly.  Consecutive devices in the order
         * share an island or a node where they can. */
        bool checked = false, allowed = false;
        for (uint32_t p = 2; p <= PX_MIN(c, max_tp(ctx)); p *= 2) {
            if (!tp_divides(ctx->model, p) || f->devices[ord[i].dev].cls == PX_HW_CLASS_CPU)
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
    nu = mixed_groups(ctx, ord, m, units, nu, 3 * f->n_devices);
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

/* Greedy pick along a sorted order: disjoint allowed units until the
 * memory need is met, then `extra` more. */
static void greedy(const px__plan_unit *units, const uint32_t *order, size_t n, double need,
                   uint32_t extra, const bool *allow, seq *q)
{
    q->n = 0;
    double mem = 0;
    uint32_t after = 0;
    for (size_t i = 0; i < n && q->n < PX__PLAN_SEQ_UNITS; i++) {
        const px__plan_unit *u = &units[order[i]];
        if (!allow[order[i]])
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

/* The sequences of one criterion's order over the allowed units. */
static px_status sequences_of(const px__plan_unit *units, size_t nu, const uint32_t *order,
                              const bool *allow, crit c, double need, seq_set *out, px_err *err)
{
    seq q;
    memset(&q, 0, sizeof q);
    greedy(units, order, nu, need, 0, allow, &q);
    px_status st = px__plan_seq_push(out, &q, err);
    greedy(units, order, nu, need, 3, allow, &q);
    if (st == PX_OK)
        st = px__plan_seq_push(out, &q, err);
    if (c == CRIT_SPEED && st == PX_OK) {
        /* Fastest last: the head (the classifier, often the heaviest
         * stage) then lands on the fastest device, and a slow unit may
         * take the first blocks of a fast group. */
        px__plan_seq rev = q;
        for (uint32_t i = 0; i < q.n; i++)
            rev.units[i] = q.units[q.n - 1 - i];
        st = px__plan_seq_push(out, &rev, err);
    }
    if (c == CRIT_SPEED && st == PX_OK) {
        /* The fastest unit first, whatever its links: the DP must use it,
         * so its cost is on record if it loses. */
        greedy(units, order, nu, need, 1, allow, &q);
        uint32_t first = UINT32_MAX;
        for (size_t i = 0; i < nu && first == UINT32_MAX; i++)
            if (allow[order[i]])
                first = order[i];
        if (q.n > 0 && first != UINT32_MAX) {
            seq f = {.force_first = true};
            f.units[f.n++] = first;
            for (uint32_t k = 0; k < q.n && f.n < PX__PLAN_SEQ_UNITS; k++)
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
        if (!allow[order[i]])
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
    return st;
}

/* Tensor-parallel degree choices: one degree per device class in a
 * sequence, so its units never overlap, and a pipeline may mix groups of
 * one class with single devices of another. */
#define MAX_COMBOS     48
#define DEGREE_OPTIONS 5 /* 1, 2, 4, 8, 16 */

typedef struct degree_combo {
    uint8_t log2[64]; /* per class (classes past 64 take degree 1) */
} degree_combo;

static void push_combo(degree_combo *combos, size_t *n, const degree_combo *c, size_t n_cls)
{
    for (size_t i = 0; i < *n; i++)
        if (!memcmp(combos[i].log2, c->log2, n_cls))
            return;
    if (*n < MAX_COMBOS)
        combos[(*n)++] = *c;
}

/* The largest available degree of a class not above 2^cap. */
static uint8_t degree_at_most(uint8_t avail, uint8_t cap)
{
    for (int k = cap; k > 0; k--)
        if (avail & (1u << k))
            return (uint8_t)k;
    return 0;
}

static size_t degree_combos(const px__plan_unit *units, size_t nu, degree_combo *combos,
                            size_t *n_cls_out)
{
    uint8_t avail[64] = {0};
    size_t n_cls = 0;
    for (size_t i = 0; i < nu; i++) {
        if (units[i].klass >= 64)
            continue;
        uint8_t k = 0;
        while ((1u << k) < units[i].tp && k < DEGREE_OPTIONS - 1)
            k++;
        avail[units[i].klass] |= (uint8_t)(1u << k);
        n_cls = PX_MAX(n_cls, (size_t)units[i].klass + 1);
    }
    size_t n = 0;
    degree_combo c;
    /* Uniform caps: every class at its largest degree up to 2^cap (the
     * all-single and all-groups sequences of before among them). */
    for (uint8_t cap = 0; cap < DEGREE_OPTIONS; cap++) {
        memset(&c, 0, sizeof c);
        for (size_t k = 0; k < n_cls; k++)
            c.log2[k] = degree_at_most(avail[k], cap);
        push_combo(combos, &n, &c, n_cls);
    }
    /* Every combination when there are few; else each class's degrees
     * with the others single, and with the others at their largest. */
    double product = 1;
    for (size_t k = 0; k < n_cls; k++)
        product *= (double)__builtin_popcount(avail[k] | 1u);
    if (product <= MAX_COMBOS - DEGREE_OPTIONS) {
        uint8_t idx[64] = {0};
        for (;;) {
            memset(&c, 0, sizeof c);
            for (size_t k = 0; k < n_cls; k++) {
                uint8_t seen = 0;
                for (uint8_t b = 0; b < DEGREE_OPTIONS; b++)
                    if ((avail[k] | 1u) & (1u << b)) {
                        if (seen == idx[k])
                            c.log2[k] = b;
                        seen++;
                    }
            }
            push_combo(combos, &n, &c, n_cls);
            size_t k = 0;
            for (; k < n_cls; k++) {
                if (++idx[k] < (uint8_t)__builtin_popcount(avail[k] | 1u))
                    break;
                idx[k] = 0;
            }
            if (k == n_cls)
                break;
        }
    } else {
        for (int base = 0; base < 2; base++)
            for (size_t k = 0; k < n_cls; k++)
                for (uint8_t b = 0; b < DEGREE_OPTIONS; b++) {
                    if (!((avail[k] | 1u) & (1u << b)))
                        continue;
                    for (size_t o = 0; o < n_cls; o++)
                        c.log2[o] = base ? degree_at_most(avail[o], DEGREE_OPTIONS) : 0;
                    c.log2[k] = b;
                    push_combo(combos, &n, &c, n_cls);
                }
    }
    *n_cls_out = n_cls;
    return n;
}

px_status px__plan_make_sequences(px__plan_ctx *ctx, const px__plan_unit *units, size_t nu,
                                  seq_set *out, px_err *err)
{
    uint32_t *order = malloc((nu ? nu : 1) * sizeof *order * CRIT_COUNT_);
    bool *allow = malloc((nu ? nu : 1) * sizeof *allow);
    degree_combo *combos = malloc(MAX_COMBOS * sizeof *combos);
    if (!order || !allow || !combos) {
        free(order);
        free(allow);
        free(combos);
        return px_err_set(err, PX_ENOMEM, "out of memory ordering devices");
    }
    double need = ctx->model->total_bytes;
    px_status st = PX_OK;
    g_units = units;
    for (int c = 0; c < CRIT_COUNT_; c++) {
        uint32_t *o = order + (size_t)c * nu;
        for (size_t i = 0; i < nu; i++)
            o[i] = (uint32_t)i;
        g_crit = (crit)c;
        qsort(o, nu, sizeof *o, cmp_units);
    }
    size_t n_cls = 0;
    size_t n_combos = degree_combos(units, nu, combos, &n_cls);
    for (size_t ci = 0; ci < n_combos && st == PX_OK; ci++) {
        for (size_t i = 0; i < nu; i++) {
            uint32_t k = units[i].klass;
            uint32_t want = k < 64 ? 1u << combos[ci].log2[k] : 1u;
            allow[i] = units[i].tp == want;
        }
        for (int c = 0; c < CRIT_COUNT_ && st == PX_OK; c++)
            st = sequences_of(units, nu, order + (size_t)c * nu, allow, (crit)c, need, out, err);
    }
    free(order);
    free(allow);
    free(combos);
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
