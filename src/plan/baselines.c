/* Baseline placement policies, implemented from what each system does
 * (docs/formats/plan.md, "Baselines"): llama.cpp's split by free memory,
 * exo's smallest ring, GPUStack's strategy order, and one device type per
 * replica (Melange).  Each returns a layout that the same cost model then
 * evaluates, so comparisons are like for like. */
#include "base/common.h"

#include "plan/plan_impl.h"

#define MIB (1024.0 * 1024.0)

px_cost_stage px__plan_stage(const px__plan_ctx *ctx, const uint32_t *devices, uint32_t tp,
                             int32_t first, int32_t last, uint32_t prec_index)
{
    px_cost_stage s;
    memset(&s, 0, sizeof s);
    memcpy(s.devices, devices, tp * sizeof *devices);
    s.tp = tp;
    s.first = first;
    s.last = last;
    s.prec = ctx->prec[prec_index].prec;
    s.kv = PX_COST_KV_DEVICE;
    return s;
}

void px__plan_split_layers(const double *weights, size_t n, uint32_t n_layers, uint32_t min_each,
                           uint32_t *counts)
{
    double total = 0;
    for (size_t i = 0; i < n; i++)
        total += weights[i] > 0 ? weights[i] : 0;
    if (n == 0)
        return;
    if (total <= 0) {
        for (size_t i = 0; i < n; i++)
            counts[i] = (uint32_t)(n_layers / n + (i < n_layers % n));
        return;
    }
    uint32_t given = 0;
    bool guard = (uint64_t)min_each * n <= n_layers;
    for (size_t i = 0; i < n; i++) {
        double exact = n_layers * (weights[i] > 0 ? weights[i] : 0) / total;
        counts[i] = (uint32_t)floor(exact);
        given += counts[i];
    }
    /* Largest remainder: the shares with the biggest fractions get the rest;
     * ties go to the earlier device. */
    while (given < n_layers) {
        size_t best = 0;
        double best_frac = -1;
        for (size_t i = 0; i < n; i++) {
            double exact = n_layers * (weights[i] > 0 ? weights[i] : 0) / total;
            double frac = exact - counts[i];
            if (frac > best_frac) {
                best_frac = frac;
                best = i;
            }
        }
        counts[best]++;
        given++;
    }
    if (!guard)
        return;
    /* At least min_each each, taken from the largest shares. */
    for (size_t i = 0; i < n; i++) {
        while (counts[i] < min_each) {
            size_t big = 0;
            for (size_t k = 0; k < n; k++)
                if (counts[k] > counts[big])
                    big = k;
            if (counts[big] <= min_each)
                break;
            counts[big]--;
            counts[i]++;
        }
    }
}

void px__plan_pipeline_from_counts(const px__plan_ctx *ctx, const uint32_t *devices,
                                   const uint32_t *counts, size_t n, uint32_t prec_index,
                                   px_cost_pipeline *out)
{
    memset(out, 0, sizeof *out);
    int32_t next = 0;
    for (size_t i = 0; i < n && out->n_stages < PX_COST_MAX_STAGES; i++) {
        if (counts[i] == 0)
            continue;
        out->stages[out->n_stages++] =
            px__plan_stage(ctx, &devices[i], 1, next, next + (int32_t)counts[i] - 1, prec_index);
        next += (int32_t)counts[i];
    }
    if (out->n_stages) {
        out->stages[0].embedding = true;
        out->stages[out->n_stages - 1].head = true;
    }
}

static bool is_accel(const px_cost_device *d)
{
    return d->cls != PX_HW_CLASS_CPU;
}

/* The node's CPU device, or UINT32_MAX. */
static uint32_t node_cpu(const px__plan_ctx *ctx, uint32_t node)
{
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++)
        if (ctx->usable[i] && ctx->fleet->devices[i].node == node &&
            ctx->fleet->devices[i].cls == PX_HW_CLASS_CPU)
            return i;
    return UINT32_MAX;
}

/* llama.cpp's default split over devs (in order): cumulative fractions of
 * free memory; block il goes to the first device whose cumulative share
 * exceeds il / (n_layers + 1) (the output layer counts as one more); the
 * input embedding stays on the host CPU. */
static px_status llamacpp_split(px__plan_ctx *ctx, const uint32_t *devs, size_t n,
                                px__plan_layout *out, px_err *err)
{
    uint32_t L = ctx->model->n_layers;
    double total = 0;
    double *split = malloc(n * sizeof *split);
    uint32_t *counts = calloc(n, sizeof *counts);
    if (!split || !counts) {
        free(split);
        free(counts);
        return px_err_set(err, PX_ENOMEM, "out of memory in the llama.cpp baseline");
    }
    for (size_t i = 0; i < n; i++)
        total += ctx->fleet->devices[devs[i]].mem_free;
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += ctx->fleet->devices[devs[i]].mem_free;
        split[i] = total > 0 ? acc / total : (double)(i + 1) / n;
    }
    for (uint32_t il = 0; il < L; il++) {
        float x = (float)il / (float)(L + 1);
        size_t d = 0;
        while (d < n && !((float)split[d] > x))
            d++;
        counts[d < n ? d : n - 1]++;
    }
    px_cost_pipeline pipe;
    px__plan_pipeline_from_counts(ctx, devs, counts, n, 0, &pipe);
    free(split);
    free(counts);
    if (pipe.n_stages == 0)
        return px_err_set(err, PX_EINFEASIBLE, "llama.cpp baseline: no device");
    uint32_t host = node_cpu(ctx, ctx->fleet->devices[devs[0]].node);
    if (host != UINT32_MAX && is_accel(&ctx->fleet->devices[devs[0]]) &&
        pipe.n_stages < PX_COST_MAX_STAGES) {
        memmove(&pipe.stages[1], &pipe.stages[0], pipe.n_stages * sizeof pipe.stages[0]);
        pipe.stages[0] = px__plan_stage(ctx, &host, 1, 0, -1, 0);
        pipe.stages[0].embedding = true;
        pipe.stages[1].embedding = false;
        pipe.n_stages++;
    }
    return px__plan_layout_push(out, &pipe, err);
}

px_status px__plan_llamacpp(px__plan_ctx *ctx, px__plan_layout *out, px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    uint32_t *devs = malloc(f->n_devices * sizeof *devs);
    if (!devs)
        return px_err_set(err, PX_ENOMEM, "out of memory in the llama.cpp baseline");
    size_t n = 0;
    /* Every accelerator it can see, local or over RPC, in inventory order. */
    for (uint32_t i = 0; i < f->n_devices && n < PX_COST_MAX_STAGES - 1; i++)
        if (ctx->usable[i] && is_accel(&f->devices[i]) &&
            !(ctx->req->excluded && ctx->req->excluded[i]))
            devs[n++] = i;
    if (n == 0)
        for (uint32_t i = 0; i < f->n_devices && n == 0; i++)
            if (ctx->usable[i] && !(ctx->req->excluded && ctx->req->excluded[i]))
                devs[n++] = i;
    px_status st = n ? llamacpp_split(ctx, devs, n, out, err)
                     : px_err_set(err, PX_EINFEASIBLE, "llama.cpp baseline: no device");
    free(devs);
    return st;
}

/* ------------------------------------------------------------------ */
/* exo                                                                 */
/* ------------------------------------------------------------------ */

typedef struct exo_node {
    uint32_t node;
    double mem;
    uint32_t devs[PX_COST_MAX_TP];
    uint32_t n_devs;
} exo_node;

static int cmp_exo_mem(const void *pa, const void *pb)
{
    const exo_node *a = pa, *b = pb;
    if (a->mem != b->mem)
        return a->mem > b->mem ? -1 : 1;
    return a->node < b->node ? -1 : (a->node > b->node);
}

static int cmp_exo_node(const void *pa, const void *pb)
{
    const exo_node *a = pa, *b = pb;
    return a->node < b->node ? -1 : (a->node > b->node);
}

px_status px__plan_exo(px__plan_ctx *ctx, px__plan_layout *out, px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    const px_hw_view *v = px_hw_graph_view(f->graph);
    exo_node *nodes = calloc(v->n_nodes ? v->n_nodes : 1, sizeof *nodes);
    if (!nodes)
        return px_err_set(err, PX_ENOMEM, "out of memory in the exo baseline");
    size_t nn = 0;
    for (uint32_t j = 0; j < v->n_nodes; j++) {
        exo_node en = {.node = j};
        bool accel = false;
        for (uint32_t i = 0; i < f->n_devices; i++)
            if (f->devices[i].node == j && ctx->usable[i] && is_accel(&f->devices[i]) &&
                !(ctx->req->excluded && ctx->req->excluded[i]))
                accel = true;
        for (uint32_t i = 0; i < f->n_devices && en.n_devs < PX_COST_MAX_TP; i++) {
            const px_cost_device *d = &f->devices[i];
            if (d->node != j || !ctx->usable[i] || is_accel(d) != accel ||
                (ctx->req->excluded && ctx->req->excluded[i]))
                continue;
            en.devs[en.n_devs++] = i;
            en.mem += d->mem_free;
            if (!accel)
                break; /* one CPU per node */
        }
        if (en.n_devs)
            nodes[nn++] = en;
    }
    /* The smallest ring whose free memory holds the model; among rings of
     * that size, the one with the most memory. */
    qsort(nodes, nn, sizeof *nodes, cmp_exo_mem);
    double need = ctx->model->total_bytes, acc = 0;
    size_t k = 0;
    while (k < nn && acc < need)
        acc += nodes[k++].mem;
    if (acc < need) {
        free(nodes);
        return px_err_set(err, PX_EINFEASIBLE,
                          "exo baseline: the nodes' free memory does not hold the model");
    }
    qsort(nodes, k, sizeof *nodes, cmp_exo_node); /* ring order */
    if (k > PX_COST_MAX_STAGES)
        k = PX_COST_MAX_STAGES;
    double w[PX_COST_MAX_STAGES];
    uint32_t counts[PX_COST_MAX_STAGES];
    for (size_t i = 0; i < k; i++)
        w[i] = nodes[i].mem;
    px__plan_split_layers(w, k, ctx->model->n_layers, 1, counts);
    px_cost_pipeline pipe;
    memset(&pipe, 0, sizeof pipe);
    int32_t next = 0;
    for (size_t i = 0; i < k; i++) {
        if (counts[i] == 0)
            continue;
        exo_node *en = &nodes[i];
        /* Tensor parallel inside a node only when the heads divide evenly;
         * otherwise the node's largest device takes the shard. */
        uint32_t tp = en->n_devs;
        bool even = ctx->model->n_heads % tp == 0 &&
                    (ctx->model->n_kv_heads == 0 || ctx->model->n_kv_heads % tp == 0);
        uint32_t devs[PX_COST_MAX_TP];
        if (tp > 1 && !even) {
            uint32_t big = en->devs[0];
            for (uint32_t q = 1; q < en->n_devs; q++)
                if (f->devices[en->devs[q]].mem_free > f->devices[big].mem_free)
                    big = en->devs[q];
            devs[0] = big;
            tp = 1;
        } else {
            memcpy(devs, en->devs, tp * sizeof *devs);
        }
        pipe.stages[pipe.n_stages++] =
            px__plan_stage(ctx, devs, tp, next, next + (int32_t)counts[i] - 1, 0);
        next += (int32_t)counts[i];
    }
    free(nodes);
    if (pipe.n_stages == 0)
        return px_err_set(err, PX_EINFEASIBLE, "exo baseline: no node");
    pipe.stages[0].embedding = true;
    pipe.stages[pipe.n_stages - 1].head = true;
    return px__plan_layout_push(out, &pipe, err);
}

/* ------------------------------------------------------------------ */
/* GPUStack                                                            */
/* ------------------------------------------------------------------ */

/* GPUStack's estimate for `layers` blocks on one GPU: weights by split,
 * KV = head_dim x n_kv_heads x context x 2 bytes (f16) x layers x 2, plus
 * compute buffers and a fixed platform footprint. */
static double gpustack_estimate(const px__plan_ctx *ctx, uint32_t layers, bool output)
{
    const px_cost_model *m = ctx->model;
    double per_layer = 0;
    for (uint32_t i = 0; i < m->n_layers; i++)
        per_layer += m->layers[i].attn_bytes + m->layers[i].ffn_bytes;
    per_layer /= PX_MAX(m->n_layers, 1u);
    double kv = (double)m->head_dim * m->n_kv_heads * ctx->req->workload.context * 2.0 * 2.0;
    double w = layers * (per_layer + kv);
    if (output)
        w += m->head.attn_bytes;
    return w + 512.0 * MIB + 256.0 * MIB;
}

/* Splits L blocks over devs by free memory and checks each device's
 * estimate against its free memory. */
static bool gpustack_fits(const px__plan_ctx *ctx, const uint32_t *devs, size_t n)
{
    uint32_t L = ctx->model->n_layers;
    double w[PX_COST_MAX_STAGES];
    uint32_t counts[PX_COST_MAX_STAGES];
    if (n == 0 || n > PX_COST_MAX_STAGES)
        return false;
    for (size_t i = 0; i < n; i++)
        w[i] = ctx->fleet->devices[devs[i]].mem_free;
    px__plan_split_layers(w, n, L, 0, counts);
    for (size_t i = 0; i < n; i++)
        if (gpustack_estimate(ctx, counts[i], i + 1 == n) > w[i])
            return false;
    return true;
}

static int cmp_free_desc_ctx(const px__plan_ctx *ctx, uint32_t a, uint32_t b)
{
    double fa = ctx->fleet->devices[a].mem_free, fb = ctx->fleet->devices[b].mem_free;
    if (fa != fb)
        return fa > fb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static void sort_by_free(const px__plan_ctx *ctx, uint32_t *d, size_t n)
{
    for (size_t i = 1; i < n; i++) /* insertion sort: n is small per node */
        for (size_t j = i; j > 0 && cmp_free_desc_ctx(ctx, d[j], d[j - 1]) < 0; j--) {
            uint32_t t = d[j];
            d[j] = d[j - 1];
            d[j - 1] = t;
        }
}

/* The usable GPUs of the fleet, and room for a selection of them. */
typedef struct gpustack {
    px__plan_ctx *ctx;
    const px_cost_fleet *f;
    uint32_t n_nodes;
    const uint32_t *gpus;
    size_t ng;
    uint32_t *sel; /* n_devices entries */
} gpustack;

/* The first `max` GPUs of node j (in fleet order) into sel, most free
 * memory first.  Returns how many. */
static size_t node_gpus(const gpustack *g, uint32_t node, size_t max, uint32_t *sel)
{
    size_t n = 0;
    for (size_t i = 0; i < g->ng && n < max; i++)
        if (g->f->devices[g->gpus[i]].node == node)
            sel[n++] = g->gpus[i];
    sort_by_free(g->ctx, sel, n);
    return n;
}

/* The node with the most free GPU memory (the first of equals); with
 * need_cpu, among the nodes with a CPU.  UINT32_MAX when none. */
static uint32_t richest_node(const gpustack *g, bool need_cpu)
{
    double best_mem = -1;
    uint32_t best = UINT32_MAX;
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        double mem = 0;
        for (size_t i = 0; i < g->ng; i++)
            if (g->f->devices[g->gpus[i]].node == j)
                mem += g->f->devices[g->gpus[i]].mem_free;
        if (mem > best_mem && (!need_cpu || node_cpu(g->ctx, j) != UINT32_MAX)) {
            best_mem = mem;
            best = j;
        }
    }
    return best;
}

/* GPUStack's strategies, tried in its order.  Each returns false when it
 * does not apply, else true with the outcome in *st. */

/* 1. One GPU with every layer: binpack picks the smallest that fits. */
static bool gpustack_one_gpu(const gpustack *g, px__plan_layout *out, px_status *st, px_err *err)
{
    int64_t one = -1;
    for (size_t i = 0; i < g->ng; i++)
        if (gpustack_estimate(g->ctx, g->ctx->model->n_layers, true) <=
                g->f->devices[g->gpus[i]].mem_free &&
            (one < 0 || g->f->devices[g->gpus[i]].mem_free < g->f->devices[one].mem_free))
            one = g->gpus[i];
    if (one < 0)
        return false;
    uint32_t d = (uint32_t)one;
    *st = llamacpp_split(g->ctx, &d, 1, out, err);
    return true;
}

/* 2. Several GPUs of one machine: the fewest that fit. */
static bool gpustack_one_machine(const gpustack *g, px__plan_layout *out, px_status *st,
                                 px_err *err)
{
    size_t best_n = SIZE_MAX;
    uint32_t best_node = 0;
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        size_t n = node_gpus(g, j, SIZE_MAX, g->sel);
        for (size_t k = 2; k <= n && k < best_n && k <= PX_COST_MAX_STAGES - 1; k++)
            if (gpustack_fits(g->ctx, g->sel, k)) {
                best_n = k;
                best_node = j;
                break;
            }
    }
    if (best_n == SIZE_MAX)
        return false;
    node_gpus(g, best_node, SIZE_MAX, g->sel);
    *st = llamacpp_split(g->ctx, g->sel, best_n, out, err);
    return true;
}

/* 3. Several machines: the main worker's GPUs plus 1 to 8 remote GPUs,
 * the fewest remote ones that fit. */
static bool gpustack_machines(const gpustack *g, px__plan_layout *out, px_status *st, px_err *err)
{
    if (g->n_nodes < 2 || g->ng == 0)
        return false;
    uint32_t main = richest_node(g, false);
    size_t n_main = node_gpus(g, main, SIZE_MAX, g->sel);
    size_t n_remote = 0;
    uint32_t *remote = g->sel + n_main;
    for (size_t i = 0; i < g->ng; i++)
        if (g->f->devices[g->gpus[i]].node != main)
            remote[n_remote++] = g->gpus[i];
    sort_by_free(g->ctx, remote, n_remote);
    for (size_t k = 1; k <= 8 && k <= n_remote; k++)
        if (n_main + k <= PX_COST_MAX_STAGES - 1 && gpustack_fits(g->ctx, g->sel, n_main + k)) {
            *st = llamacpp_split(g->ctx, g->sel, n_main + k, out, err);
            return true;
        }
    return false;
}

/* 4. Partial offload: the GPUs of the machine with the most GPU memory
 * take what fits, the rest of the layers run on its CPU. */
static bool gpustack_partial_offload(const gpustack *g, px__plan_layout *out, px_status *st,
                                     px_err *err)
{
    px__plan_ctx *ctx = g->ctx;
    uint32_t L = ctx->model->n_layers;
    uint32_t node = g->ng > 0 ? richest_node(g, true) : UINT32_MAX;
    if (node == UINT32_MAX)
        return false;
    uint32_t cpu = node_cpu(ctx, node);
    size_t n = node_gpus(g, node, PX_COST_MAX_STAGES - 2, g->sel);
    uint32_t counts[PX_COST_MAX_STAGES] = {0};
    uint32_t placed = 0;
    for (size_t i = 0; i < n; i++) {
        while (placed < L &&
               gpustack_estimate(ctx, counts[i] + 1, false) <= g->f->devices[g->sel[i]].mem_free) {
            counts[i]++;
            placed++;
        }
    }
    if (placed == 0)
        return false;
    /* llama.cpp offloads the last layers: the CPU runs the first. */
    uint32_t order[PX_COST_MAX_STAGES];
    uint32_t oc[PX_COST_MAX_STAGES];
    order[0] = cpu;
    oc[0] = L - placed;
    for (size_t i = 0; i < n; i++) {
        order[i + 1] = g->sel[i];
        oc[i + 1] = counts[i];
    }
    px_cost_pipeline pipe;
    px__plan_pipeline_from_counts(ctx, order, oc, n + 1, 0, &pipe);
    if (oc[0] == 0 && pipe.n_stages < PX_COST_MAX_STAGES) {
        memmove(&pipe.stages[1], &pipe.stages[0], pipe.n_stages * sizeof pipe.stages[0]);
        pipe.stages[0] = px__plan_stage(ctx, &cpu, 1, 0, -1, 0);
        pipe.stages[0].embedding = true;
        pipe.stages[1].embedding = false;
        pipe.n_stages++;
    }
    *st = px__plan_layout_push(out, &pipe, err);
    return true;
}

/* 5. CPU only: the CPU with the most memory. */
static bool gpustack_cpu_only(const gpustack *g, px__plan_layout *out, px_status *st, px_err *err)
{
    px__plan_ctx *ctx = g->ctx;
    int64_t cpu = -1;
    for (uint32_t i = 0; i < g->f->n_devices; i++)
        if (ctx->usable[i] && !is_accel(&g->f->devices[i]) &&
            !(ctx->req->excluded && ctx->req->excluded[i]) &&
            (cpu < 0 || g->f->devices[i].mem_free > g->f->devices[cpu].mem_free))
            cpu = i;
    if (cpu < 0)
        return false;
    px_cost_pipeline pipe;
    memset(&pipe, 0, sizeof pipe);
    uint32_t d = (uint32_t)cpu;
    pipe.n_stages = 1;
    pipe.stages[0] = px__plan_stage(ctx, &d, 1, 0, (int32_t)ctx->model->n_layers - 1, 0);
    pipe.stages[0].embedding = pipe.stages[0].head = true;
    *st = px__plan_layout_push(out, &pipe, err);
    return true;
}

/* 6. With no CPU to fall back to, every GPU, the layers split by free
 * memory (the split its llama.cpp workers make when given them all). */
static bool gpustack_every_gpu(const gpustack *g, px__plan_layout *out, px_status *st, px_err *err)
{
    if (g->ng == 0)
        return false;
    memcpy(g->sel, g->gpus, g->ng * sizeof *g->sel);
    sort_by_free(g->ctx, g->sel, g->ng);
    *st = llamacpp_split(g->ctx, g->sel, PX_MIN(g->ng, (size_t)PX_COST_MAX_STAGES - 1), out, err);
    return true;
}

px_status px__plan_gpustack(px__plan_ctx *ctx, px__plan_layout *out, px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    uint32_t *gpus = malloc(f->n_devices * sizeof *gpus);
    uint32_t *sel = malloc(f->n_devices * sizeof *sel);
    if (!gpus || !sel) {
        free(gpus);
        free(sel);
        return px_err_set(err, PX_ENOMEM, "out of memory in the GPUStack baseline");
    }
    size_t ng = 0;
    for (uint32_t i = 0; i < f->n_devices; i++)
        if (ctx->usable[i] && is_accel(&f->devices[i]) &&
            !(ctx->req->excluded && ctx->req->excluded[i]))
            gpus[ng++] = i;
    gpustack g = {ctx, f, px_hw_graph_view(f->graph)->n_nodes, gpus, ng, sel};
    px_status st;
    if (!gpustack_one_gpu(&g, out, &st, err) && !gpustack_one_machine(&g, out, &st, err) &&
        !gpustack_machines(&g, out, &st, err) && !gpustack_partial_offload(&g, out, &st, err) &&
        !gpustack_cpu_only(&g, out, &st, err) && !gpustack_every_gpu(&g, out, &st, err))
        st = px_err_set(err, PX_EINFEASIBLE, "GPUStack baseline: no strategy fits");
    free(gpus);
    free(sel);
    return st;
}

/* ------------------------------------------------------------------ */
/* One device type per replica (Melange)                               */
/* ------------------------------------------------------------------ */

px_status px__plan_single_type(px__plan_ctx *ctx, px__plan_layout *out, px_err *err)
{
    const px_cost_fleet *f = ctx->fleet;
    px_cost_workload wl = ctx->req->workload;
    if (wl.batch == 0)
        wl.batch = 1;
    wl.micro_batches = 1;
    bool any_accel = false;
    for (uint32_t i = 0; i < f->n_devices; i++)
        any_accel |= ctx->usable[i] && is_accel(&f->devices[i]);
    bool *used = calloc(f->n_devices, sizeof *used);
    if (!used)
        return px_err_set(err, PX_ENOMEM, "out of memory in the single-type baseline");
    double best_score = INFINITY;
    px__plan_layout best = {0};
    px_status st = PX_OK;
    for (uint32_t k = 0; k < f->n_classes && st == PX_OK; k++) {
        /* The smallest group of this type inside one island that holds the
         * whole model; then as many such groups as the fleet has. */
        px__plan_layout lay = {0};
        memset(used, 0, f->n_devices * sizeof *used);
        for (uint32_t p = 1; p <= PX_COST_MAX_TP && lay.n_replicas == 0; p *= 2) {
            if (p > 1 &&
                (ctx->model->n_heads % p || (ctx->model->n_kv_heads && ctx->model->n_kv_heads % p)))
                continue;
            for (uint32_t i = 0; i < f->n_devices; i++) {
                const px_cost_device *d = &f->devices[i];
                if (d->klass != k || used[i] || !ctx->usable[i] || is_accel(d) != any_accel ||
                    (ctx->req->excluded && ctx->req->excluded[i]))
                    continue;
                uint32_t grp[PX_COST_MAX_TP];
                uint32_t n = 0;
                for (uint32_t j = i; j < f->n_devices && n < p; j++)
                    if (f->devices[j].klass == k && !used[j] && ctx->usable[j] &&
                        f->devices[j].island == d->island &&
                        !(ctx->req->excluded && ctx->req->excluded[j]))
                        grp[n++] = j;
                if (n < p)
                    continue;
                px_cost_pipeline pipe;
                memset(&pipe, 0, sizeof pipe);
                pipe.n_stages = 1;
                pipe.stages[0] =
                    px__plan_stage(ctx, grp, p, 0, (int32_t)ctx->model->n_layers - 1, 0);
                pipe.stages[0].embedding = pipe.stages[0].head = true;
                if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &wl, &pipe, NULL,
                                          ctx->scratch, NULL) != PX_OK ||
                    ctx->scratch->why != PX_COST_OK) {
                    if (lay.n_replicas == 0)
                        break; /* this degree does not fit: try a larger one */
                    continue;
                }
                for (uint32_t q = 0; q < p; q++)
                    used[grp[q]] = true;
                st = px__plan_layout_push(&lay, &pipe, err);
                if (st != PX_OK)
                    break;
            }
        }
        if (lay.n_replicas == 0 || st != PX_OK) {
            px__plan_layout_release(&lay);
            continue;
        }
        /* Melange minimises cost for the load under the SLO: rank types by
         * money per token, or by time per token where nothing is priced. */
        if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &wl, &lay.replicas[0], NULL,
                                  ctx->scratch, NULL) != PX_OK) {
            px__plan_layout_release(&lay);
            continue;
        }
        const px_cost_estimate *e = ctx->scratch;
        bool meets = ctx->req->slo.tpot_s <= 0 || e->tpot_s <= ctx->req->slo.tpot_s;
        double score =
            (meets ? 0 : 1e6) + (e->usd_per_hour > 0 ? e->usd_per_token * 1e3 : e->tpot_s);
        if (score < best_score) {
            best_score = score;
            px__plan_layout_release(&best);
            best = lay;
        } else {
            px__plan_layout_release(&lay);
        }
    }
    free(used);
    if (st != PX_OK) {
        px__plan_layout_release(&best);
        return st;
    }
    if (best.n_replicas == 0)
        return px_err_set(err, PX_EINFEASIBLE,
                          "single-type baseline: no device type holds the whole model");
    *out = best;
    return PX_OK;
}
