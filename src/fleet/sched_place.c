/* Placement: filter every node (keeping each one's reason for not fitting),
 * score the rest (memory headroom, then locality, then load, then
 * topology), allocate the best, and record the explanation.
 *
 * Static requirements (frameworks, vendor, capability, GPU capacity) depend
 * only on a node's class, so they are checked once per class and the
 * per-node loop only compares numbers: that keeps a decision over 10,000
 * nodes within a few tens of microseconds. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

/* Static verdict of a class for one request. */
typedef struct class_verdict {
    uint8_t computed;
    uint8_t reason; /* PX__R_COUNT_ when it may fit */
    uint8_t fw;
    float have, need;
    uint64_t eligible;         /* devices meeting vendor, capability and capacity */
    const px__sched_node *rep; /* the class's first node: device capacities */
    uint32_t count;            /* nodes of the class seen in this decision */
    uint32_t static_ok;        /* bit per requirement (PX__Q_*) met statically */
} class_verdict;

/* Branch-free bit count: the builtin becomes a library call on baseline
 * x86-64, and this runs for every node of every GPU decision. */
static inline int popcount64(uint64_t x)
{
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
}

static bool ensure_scratch(px_fleet_sched *s, size_t n_feasible_cap)
{
    if (s->cap_class_scratch < s->n_classes) {
        size_t cap = s->n_classes * 2;
        class_verdict *v = realloc(s->class_verdict, cap * sizeof *v);
        if (!v)
            return false;
        s->class_verdict = v;
        s->cap_class_scratch = cap;
    }
    if (s->cap_scratch < n_feasible_cap) {
        px__scored *sc = realloc(s->scratch, n_feasible_cap * sizeof *sc);
        if (!sc)
            return false;
        s->scratch = sc;
        s->cap_scratch = n_feasible_cap;
    }
    return true;
}

static void class_static(const px__sched_node *n, const px_fleet_request *r, class_verdict *v)
{
    v->computed = 1;
    v->rep = n;
    v->reason = PX__R_COUNT_;
    v->static_ok = 0;
    v->eligible = 0;
    /* Frameworks: the first unmet requirement decides the reason. */
    for (int j = 0; j < r->n_fws; j++) {
        const px__sched_framework *have = NULL;
        for (int k = 0; k < n->n_fws && !have; k++)
            if (strcmp(n->fws[k].name, r->fws[j].name) == 0)
                have = &n->fws[k];
        bool ok = false;
        if (have && px_fleet_version_match(have->version, r->fws[j].spec, &ok, NULL) != PX_OK)
            ok = false;
        if (ok)
            v->static_ok |= 1u << (PX__Q_FRAMEWORK0 + j);
        else if (v->reason == PX__R_COUNT_) {
            v->reason = have ? PX__R_FRAMEWORK_VERSION : PX__R_FRAMEWORK;
            v->fw = (uint8_t)j;
        }
    }
    if (r->gpus == 0) {
        v->static_ok |= 1u << PX__Q_VENDOR | 1u << PX__Q_CAPABILITY | 1u << PX__Q_GPUS;
        return;
    }
    int n_vendor = 0, n_cap = 0, n_gpu = 0;
    float best_mem = 0;
    for (int d = 0; d < n->n_devs; d++) {
        const px__sched_device *dv = &n->devs[d];
        if (!dv->gpu)
            continue;
        n_gpu++;
        if (r->vendor && strcmp(dv->vendor, r->vendor) != 0)
            continue;
        n_vendor++;
        if (r->capability) {
            bool ok = false;
            if (px_fleet_version_match(dv->capability, r->capability, &ok, NULL) != PX_OK || !ok)
                continue;
        }
        n_cap++;
        if ((float)dv->mem_total > best_mem)
            best_mem = (float)dv->mem_total;
        if (r->gpu_memory > 0 && dv->mem_total < r->gpu_memory)
            continue;
        v->eligible |= 1ull << d;
    }
    int n_elig = popcount64(v->eligible);
    if (n_vendor > 0)
        v->static_ok |= 1u << PX__Q_VENDOR;
    if (n_cap > 0)
        v->static_ok |= 1u << PX__Q_CAPABILITY;
    if (v->reason != PX__R_COUNT_)
        return;
    if (n_gpu == 0) {
        /* A node without GPUs lacks GPUs, whatever vendor was asked for. */
        v->reason = PX__R_GPUS;
        v->have = 0;
        v->need = (float)r->gpus;
    } else if (n_vendor == 0) {
        v->reason = PX__R_VENDOR;
        v->have = (float)n_gpu;
        v->need = (float)r->gpus;
    } else if (n_cap == 0) {
        v->reason = PX__R_CAPABILITY;
    } else if (n_elig < r->gpus && n_cap >= r->gpus) {
        v->reason = PX__R_GPU_MEMORY;
        v->have = best_mem;
        v->need = (float)r->gpu_memory;
    } else if (n_elig < r->gpus) {
        v->reason = PX__R_GPUS;
        v->have = (float)n_elig;
        v->need = (float)r->gpus;
    }
}

/* Free memory of device d of n: the live figure when the node reports
 * one, else the capacity, read from the class's first node (same devices). */
static double dev_free(const px__sched_node *n, const px__sched_node *rep, int d)
{
    if (n->has_live_dev && n->devs[d].mem_free >= 0)
        return n->devs[d].mem_free;
    return rep->devs[d].mem_total;
}

/* Picks r->gpus devices out of cand: the single one with most free memory,
 * or for several the subset whose slowest link is fastest. */
static uint64_t pick_devices(const px__sched_node *n, const px__sched_node *rep,
                             const px_fleet_request *r, uint64_t cand, double fastest,
                             float *topology)
{
    *topology = 1;
    if (r->gpus == 1) {
        int best = -1;
        double best_free = -1;
        for (uint64_t c = cand; c; c &= c - 1) {
            int d = __builtin_ctzll(c);
            double f = dev_free(n, rep, d);
            if (f > best_free) {
                best = d;
                best_free = f;
            }
        }
        return 1ull << best;
    }
    int idx[PX__SCHED_MAX_DEVICES], k = 0;
    for (int d = 0; d < n->n_devs; d++)
        if (cand >> d & 1)
            idx[k++] = d;
    if (!n->link_bw || fastest <= 0 || k > 12) {
        uint64_t m = 0;
        for (int i = 0; i < r->gpus; i++)
            m |= 1ull << idx[i];
        *topology = n->link_bw ? 0.5f : 0;
        return m;
    }
    /* Enumerate subsets of size gpus among at most 12 candidates (<= 924). */
    uint64_t best = 0;
    double best_bw = -1;
    for (uint32_t sub = 0; sub < (1u << k); sub++) {
        if (popcount64(sub) != r->gpus)
            continue;
        double bw = INFINITY;
        for (int a = 0; a < k && bw > best_bw; a++)
            if (sub >> a & 1)
                for (int b = 0; b < k; b++)
                    if (a != b && (sub >> b & 1)) {
                        double l = n->link_bw[idx[a] * n->n_devs + idx[b]];
                        if (l < bw)
                            bw = l;
                    }
        if (bw > best_bw) {
            best_bw = bw;
            best = 0;
            for (int a = 0; a < k; a++)
                if (sub >> a & 1)
                    best |= 1ull << idx[a];
        }
    }
    *topology = (float)PX_MIN(1.0, best_bw / fastest);
    return best;
}

bool px__sched_node_resident(const px__sched_node *n, const px_digest *d)
{
    size_t lo = 0, hi = n->n_resident;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = memcmp(&n->resident[mid], d, sizeof *d);
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static void score_node(const px_fleet_sched *s, const px_fleet_request *r, uint32_t i,
                       const px__sched_node *rep, uint64_t cand, px__scored *out)
{
    const px__sched_node *n = &s->nodes[i];
    out->node = i;
    out->topology = 1;
    out->devices = 0;
    double head;
    if (r->gpus > 0) {
        out->devices = pick_devices(n, rep, r, cand, s->fastest_link, &out->topology);
        head = 1;
        for (uint64_t c = out->devices; c; c &= c - 1) {
            int d = __builtin_ctzll(c);
            double total = rep->devs[d].mem_total;
            double h = total > 0 ? (dev_free(n, rep, d) - r->gpu_memory) / total : 0;
            if (h < head)
                head = h;
        }
    } else {
        double free_mem = n->memory - n->memory_used;
        if (n->mem_free_live >= 0 && n->mem_free_live < free_mem)
            free_mem = n->mem_free_live;
        head = n->memory > 0 ? (free_mem - r->memory) / n->memory : 0;
    }
    head = head < 0 ? 0 : head > 1 ? 1 : head;
    double loc = 0;
    if (r->n_inputs) {
        int hits = 0;
        for (int k = 0; k < r->n_inputs; k++)
            hits += px__sched_node_resident(n, &r->inputs[k]);
        loc = (double)hits / r->n_inputs;
    }
    double used = n->cpus > 0 ? n->cpus_used / n->cpus : 1;
    double load = PX_MAX(used, n->load);
    load = 1 - PX_MIN(1.0, load);
    out->headroom = (float)head;
    out->locality = (float)loc;
    out->load = (float)load;
    out->score = (float)(100.0 * (int)(head * 10 + 1e-9) + 100 * loc + 10 * load + out->topology);
}

/* Better first: higher score, then lower node index (deterministic). */
static int scored_cmp(const void *a, const void *b)
{
    const px__scored *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->node < y->node ? -1 : x->node > y->node;
}

/* Keeps the best `cap` candidates in top[], best first. */
static inline void top_insert(px__scored *top, uint32_t *n_top, uint32_t cap, const px__scored *c)
{
    uint32_t n = *n_top;
    if (n == cap && scored_cmp(c, &top[n - 1]) >= 0)
        return;
    uint32_t pos = n < cap ? n : n - 1;
    while (pos > 0 && scored_cmp(c, &top[pos - 1]) < 0) {
        top[pos] = top[pos - 1];
        pos--;
    }
    top[pos] = *c;
    if (n < cap)
        *n_top = n + 1;
}

static void reject(px_fleet_explanation *e, px__rejected *buf, uint32_t node, int reason, int fw,
                   double have, double need)
{
    e->reason_count[reason]++;
    if (e->n_rejected_total++ < PX__SCHED_MAX_REJECTED)
        buf[e->n_rejected++] =
            (px__rejected){node, (uint8_t)reason, (uint8_t)fw, (float)have, (float)need};
}

px_status px_fleet_sched_place(px_fleet_sched *s, const px_fleet_request *r, const char *owner,
                               px_fleet_explanation **out, px_err *err)
{
    *out = NULL;
    bool gang = r->members > 1;
    if (!ensure_scratch(s, (size_t)r->members))
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_fleet_explanation *e = calloc(1, sizeof *e);
    px__rejected rej[PX__SCHED_MAX_REJECTED];
    if (!e)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    e->req = (px_fleet_request *)r;
    e->req->refs++;
    class_verdict *cv = s->class_verdict;
    if (cv)
        memset(cv, 0, s->n_classes * sizeof *cv);
    uint32_t n_state = 0, n_cpus = 0, n_mem = 0, n_gpus = 0;
    uint32_t n_feasible = 0, n_gang = 0, n_scored = 0;
    /* Every node is filtered (each keeps its reason); on large fleets only
     * a window of the feasible ones is scored, rotating between decisions,
     * plus every node holding the job's model, as kube-scheduler's
     * percentageOfNodesToScore does.  Small fleets are scored whole. */
    uint32_t nn = (uint32_t)s->n_nodes;
    uint32_t limit = s->score_limit ? s->score_limit : PX__SCHED_SCORE_ALL;
    if (nn > limit)
        limit = PX_MAX(limit / 2, nn / 20);
    else
        limit = nn;
    limit = PX_MAX(limit, (uint32_t)r->members);
    uint32_t start = nn > limit ? s->rr % nn : 0;
    for (uint32_t k = 0; k < nn; k++) {
        uint32_t i = start + k < nn ? start + k : start + k - nn;
        const px__sched_node *n = &s->nodes[i];
        class_verdict *v = &cv[n->class_id];
        if (!v->computed)
            class_static(n, r, v);
        v->count++;
        bool state_ok = n->state == PX_FLEET_NODE_ONLINE;
        bool cpus_ok = n->cpus - n->cpus_used >= r->cpus - 1e-9;
        bool mem_ok = r->memory <= 0 || n->memory - n->memory_used >= r->memory;
        uint64_t cand = 0;
        bool gpus_ok = true;
        int free_static = 0;
        if (r->gpus > 0) {
            uint64_t avail = v->eligible & ~n->busy;
            free_static = popcount64(avail);
            cand = avail;
            if (r->gpu_memory > 0 && n->has_live_dev && n->min_dev_free < r->gpu_memory)
                for (int d = 0; d < n->n_devs; d++)
                    if ((avail >> d & 1) && n->devs[d].mem_free >= 0 &&
                        n->devs[d].mem_free < r->gpu_memory)
                        cand &= ~(1ull << d);
            gpus_ok = popcount64(cand) >= r->gpus;
        }
        n_state += state_ok;
        n_cpus += cpus_ok;
        n_mem += mem_ok;
        n_gpus += gpus_ok;
        if (n->state == PX_FLEET_NODE_OFFLINE)
            reject(e, rej, i, PX__R_OFFLINE, 0, 0, 0);
        else if (n->state == PX_FLEET_NODE_DRAINING)
            reject(e, rej, i, PX__R_DRAINING, 0, 0, 0);
        else if (v->reason != PX__R_COUNT_)
            reject(e, rej, i, v->reason, v->fw, v->have, v->need);
        else if (!gpus_ok && free_static >= r->gpus) {
            double best = 0;
            for (int d = 0; d < n->n_devs; d++)
                if ((v->eligible & ~n->busy) >> d & 1)
                    best = PX_MAX(best, n->devs[d].mem_free);
            reject(e, rej, i, PX__R_GPU_MEMORY, 1, best, r->gpu_memory);
        } else if (!gpus_ok)
            reject(e, rej, i, PX__R_GPUS, 0, free_static, r->gpus);
        else if (!cpus_ok)
            reject(e, rej, i, PX__R_CPUS, 0, n->cpus - n->cpus_used, r->cpus);
        else if (!mem_ok)
            reject(e, rej, i, PX__R_MEMORY, 0, n->memory - n->memory_used, r->memory);
        else {
            n_feasible++;
            if (n_scored >= limit &&
                !(r->n_inputs && n->n_resident && px__sched_node_resident(n, &r->inputs[0])))
                continue;
            n_scored++;
            px__scored sc;
            score_node(s, r, i, v->rep, cand, &sc);
            top_insert(e->top, &e->n_top, PX__SCHED_TOP, &sc);
            if (gang)
                top_insert(s->scratch, &n_gang, (uint32_t)r->members, &sc);
        }
    }
    s->rr = start + limit;
    uint32_t per_class_static[PX__Q_FRAMEWORK0 + PX__SCHED_MAX_FRAMEWORKS] = {0};
    for (size_t c = 0; c < s->n_classes; c++)
        for (uint32_t q = PX__Q_VENDOR; q < (uint32_t)PX__Q_FRAMEWORK0 + (uint32_t)r->n_fws; q++)
            if (cv[c].static_ok >> q & 1)
                per_class_static[q] += cv[c].count;
    e->n_scored = n_scored;
    e->n_considered = (uint32_t)s->n_nodes;
    e->n_feasible = n_feasible;
    e->req_meeting[PX__Q_STATE] = n_state;
    e->req_meeting[PX__Q_CPUS] = n_cpus;
    e->req_meeting[PX__Q_MEMORY] = n_mem;
    e->req_meeting[PX__Q_GPUS] = n_gpus;
    for (int q = PX__Q_VENDOR; q < PX__Q_FRAMEWORK0 + r->n_fws; q++)
        if (q != PX__Q_GPUS)
            e->req_meeting[q] = per_class_static[q];
    if (e->n_rejected) {
        e->rejected = malloc(e->n_rejected * sizeof *e->rejected);
        if (!e->rejected)
            goto fail_oom;
        memcpy(e->rejected, rej, e->n_rejected * sizeof *rej);
    }
    if (n_gang >= (uint32_t)r->members || (!gang && e->n_top > 0)) {
        e->members = malloc((size_t)r->members * sizeof *e->members);
        if (!e->members)
            goto fail_oom;
        const px__scored *best = gang ? s->scratch : e->top;
        for (int m = 0; m < r->members; m++) {
            e->members[m] = best[m];
            if (px__sched_alloc_add(s, best[m].node, owner, m, r->cpus, r->memory,
                                    best[m].devices) != PX_OK) {
                px_fleet_sched_release(s, owner);
                goto fail_oom;
            }
        }
        e->n_members = (uint32_t)r->members;
        e->placed = true;
    }
    *out = e;
    return PX_OK;
fail_oom:
    px_fleet_explanation_free(e);
    return px_err_set(err, PX_ENOMEM, "out of memory");
}

bool px_fleet_explanation_placed(const px_fleet_explanation *e)
{
    return e->placed;
}

size_t px_fleet_explanation_n_members(const px_fleet_explanation *e)
{
    return e->n_members;
}

size_t px_fleet_explanation_node(const px_fleet_explanation *e, size_t rank)
{
    return rank < e->n_members ? e->members[rank].node : SIZE_MAX;
}

json_t *px_fleet_explanation_devices(const px_fleet_explanation *e, const px_fleet_sched *s,
                                     size_t rank)
{
    json_t *a = json_array();
    if (!a || rank >= e->n_members)
        return a;
    const px__sched_node *n = &s->nodes[e->members[rank].node];
    for (int d = 0; d < n->n_devs; d++)
        if (e->members[rank].devices >> d & 1)
            json_array_append_new(a, json_string(n->devs[d].id));
    return a;
}

void px_fleet_explanation_free(px_fleet_explanation *e)
{
    if (!e)
        return;
    px_fleet_request_free(e->req);
    free(e->rejected);
    free(e->members);
    free(e);
}
