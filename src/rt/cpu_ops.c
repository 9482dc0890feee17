/*
 * The cpu backend's ops: shape checks, then the kernels, cut into parts
 * by output rows (matrix rows, attention heads, activation rows) that the
 * pool's threads claim as they come; a part is a fixed range of outputs,
 * each computed by the same code in the same order whatever the thread
 * that claims it and the number of threads.
 *
 * Matrix products of any number of rows run the own kernels, each thread
 * on its own weight rows against every activation row: the weights stream
 * from memory once per step, and a row's result is the same whatever the
 * rows beside it (the serving engine relies on it) and whatever the
 * thread count.  With q8_0 weights the activation rows are quantized to
 * q8_0 first, once per op, for the integer dot products; with the other
 * block formats to their activation blocks (Q8_0 or Q8_K), once per op.
 *
 * Products that read the same activation rows one after the other (a
 * layer's q, k and v; its gate and up) can run as one group
 * (px__rt_cpu_run_products): the rows are prepared once and the weight
 * rows of all of them are shared among the threads in one pool call, so
 * that the small ones (k and v) pay no wake-up and barrier of their own.
 * Each output row is still computed by the same code alone, so a group
 * gives the outputs its products give one at a time.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

bool px__rt_cpu_supports(px_ir_op_kind op, px_dtype t)
{
    switch (op) {
    case PX_IR_OP_EMBEDDING:
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER:
        return px__rt_dtype_supported(t);
    case PX_IR_OP_RMSNORM:
    case PX_IR_OP_ROPE:
    case PX_IR_OP_ATTENTION:
    case PX_IR_OP_SWIGLU:
    case PX_IR_OP_ADD:
        return t == PX_DTYPE_F32;
    default:
        return false;
    }
}

/* Rows an op reads from src[0] (its selection, or all). */
static uint32_t op_out_rows(const px_rt_op *op)
{
    return op->select ? op->n_select : (uint32_t)op->src[0]->ne[1];
}

static bool is_matmul(const px_rt_op *op)
{
    return op->kind == PX_IR_OP_MATMUL || op->kind == PX_IR_OP_CLASSIFIER;
}

/* The most positions a row of an attention op can attend: a slot's
 * blocks. */
static size_t attention_positions(const px_rt_op *op)
{
    size_t block = (size_t)op->src[3]->ne[1];
    if (op->rows && op->rows->block_table)
        return block * op->rows->blocks_per_slot;
    return block;
}

/* Where position pos of slot lives in a cache of `block`-position blocks:
 * the row index [block index * block + offset]. */
static size_t cache_row(const px_rt_rows *rows, size_t block, int32_t slot, int32_t pos)
{
    if (!rows->block_table)
        return (size_t)slot * block + (size_t)pos;
    int32_t b = rows->block_table[(size_t)slot * rows->blocks_per_slot + (size_t)pos / block];
    return (size_t)b * block + (size_t)pos % block;
}

/* Matmul scratch: gathered rows (with a selection), then for q8_0
 * weights the quantized rows (block scales, then values), for the other
 * block formats the rows quantized for them (px__rt_quant_act). */
static size_t gather_bytes(const px_rt_op *op)
{
    return op->select ? (size_t)op->n_select * (size_t)op->src[1]->ne[0] * sizeof(float) : 0;
}

static size_t quant_bytes(const px_rt_op *op, uint32_t rows)
{
    const px_rt_tensor *w = op->src[1];
    size_t k = (size_t)w->ne[0];
    if (px__rt_quant_handles(w->dtype))
        return (size_t)rows * px__rt_quant_act_bytes(w->dtype, (uint32_t)k);
    if (w->dtype != PX_DTYPE_Q8_0)
        return 0;
    return (size_t)rows * (k / PX__RT_Q8_0_ELEMS * sizeof(float) + k);
}

size_t px__rt_cpu_work_size(uint32_t n_threads, const px_rt_op *op)
{
    if (is_matmul(op))
        return gather_bytes(op) + quant_bytes(op, op_out_rows(op));
    if (op->kind == PX_IR_OP_ATTENTION && op->n_kv_heads) {
        /* Per thread: the scores of a group of query heads, then the
         * cache rows they attend (uint32_t, the size of a float). */
        size_t group = op->n_heads / op->n_kv_heads;
        return (size_t)n_threads * (group + 1) * attention_positions(op) * sizeof(float);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

static px_status op_error(px_err *err, const px_rt_op *op, const char *what)
{
    return px_err_set(err, PX_EINVAL, "cpu: %s op (layer %d): %s", px_ir_op_kind_name(op->kind),
                      op->layer, what);
}

static bool host_f32(const px_rt_tensor *t)
{
    return t && t->dtype == PX_DTYPE_F32 && px_rt_tensor_data(t) && t->nb[0] == sizeof(float) &&
           t->nb[1] == (size_t)t->ne[0] * sizeof(float);
}

static px_status check_op(const px_rt_op *op, px_err *err)
{
    const px_rt_tensor *x = op->src[0], *y = op->dst;
    if (!x || !y || !px_rt_tensor_data(x) || !px_rt_tensor_data(y))
        return op_error(err, op, "missing input or output tensor, or not in host memory");
    if (!px__rt_cpu_supports(op->kind, x->dtype))
        return px_err_set(err, PX_EUNSUPPORTED, "cpu: cannot run %s on %s input",
                          px_ir_op_kind_name(op->kind), px_dtype_name(x->dtype));
    if (!host_f32(y))
        return op_error(err, op, "output must be a contiguous f32 host tensor");
    switch (op->kind) {
    case PX_IR_OP_EMBEDDING: {
        const px_rt_tensor *ids = op->src[1];
        if (!ids || ids->dtype != PX_DTYPE_I32 || !px_rt_tensor_data(ids))
            return op_error(err, op, "src[1] must hold i32 token ids");
        if (y->ne[0] != x->ne[0] || y->ne[1] < ids->ne[0])
            return op_error(err, op, "output shape does not match the table and the ids");
        const int32_t *id = px_rt_tensor_data(ids);
        for (int64_t r = 0; r < ids->ne[0]; r++)
            if (id[r] < 0 || id[r] >= x->ne[1])
                return px_err_set(err, PX_EINVAL,
                                  "cpu: embedding: token id %d at row %" PRId64
                                  " is outside the vocabulary [0, %" PRId64 ")",
                                  id[r], r, x->ne[1]);
        return PX_OK;
    }
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER: {
        const px_rt_tensor *w = op->src[1], *b = op->src[2];
        if (!host_f32(x) || !w || !px_rt_tensor_data(w))
            return op_error(err, op, "needs f32 activations and a host weight");
        if (!px__rt_cpu_supports(op->kind, w->dtype))
            return px_err_set(err, PX_EUNSUPPORTED, "cpu: cannot multiply by %s weights (%s)",
                              px_dtype_name(w->dtype), w->name ? w->name : "weight");
        if (w->ne[0] != x->ne[0] || y->ne[0] != w->ne[1] || y->ne[1] < op_out_rows(op))
            return op_error(err, op, "shapes of activations, weight and output disagree");
        if (w->dtype == PX_DTYPE_Q8_0 && w->ne[0] % PX__RT_Q8_0_ELEMS)
            return op_error(err, op, "q8_0 weight rows must hold a multiple of 32 values");
        if (b && (!host_f32(b) || b->ne[0] != w->ne[1]))
            return op_error(err, op, "bias must be f32 of the output width");
        break;
    }
    case PX_IR_OP_RMSNORM: {
        const px_rt_tensor *w = op->src[1];
        if (!host_f32(x) || !host_f32(w) || w->ne[0] != x->ne[0] || y->ne[0] != x->ne[0] ||
            y->ne[1] < op_out_rows(op))
            return op_error(err, op, "shapes of input, weight and output disagree");
        break;
    }
    case PX_IR_OP_ROPE: {
        const px_rt_tensor *tab = op->src[1];
        if (y != x || !host_f32(x) || !host_f32(tab) || !op->rows)
            return op_error(err, op,
                            "rotates src[0] in place and needs the table and row positions");
        if (op->rope_dim == 0 || op->rope_dim % 2 || op->rope_dim > op->head_dim ||
            (uint64_t)op->n_heads * op->head_dim != (uint64_t)x->ne[0] ||
            tab->ne[0] != op->rope_dim || op->rows->n_rows != x->ne[1])
            return op_error(err, op, "heads, rotated dimensions or rows disagree with the tensors");
        for (uint32_t r = 0; r < op->rows->n_rows; r++)
            if (op->rows->pos[r] < 0 || op->rows->pos[r] >= tab->ne[1])
                return op_error(err, op, "a position lies outside the rotation table");
        break;
    }
    case PX_IR_OP_ATTENTION: {
        const px_rt_tensor *k = op->src[1], *v = op->src[2], *kc = op->src[3], *vc = op->src[4];
        uint64_t kv_dim = (uint64_t)op->n_kv_heads * op->head_dim;
        if (!host_f32(x) || !host_f32(k) || !host_f32(v) || !host_f32(kc) || !host_f32(vc) ||
            !op->rows)
            return op_error(err, op, "needs f32 q, k, v, both caches and the row layout");
        if (op->n_kv_heads == 0 || op->n_heads % op->n_kv_heads ||
            (uint64_t)x->ne[0] != (uint64_t)op->n_heads * op->head_dim ||
            (uint64_t)k->ne[0] != kv_dim || (uint64_t)v->ne[0] != kv_dim ||
            (uint64_t)kc->ne[0] != kv_dim || (uint64_t)vc->ne[0] != kv_dim ||
            kc->ne[1] != vc->ne[1] || kc->ne[2] != vc->ne[2] || y->ne[0] != x->ne[0] ||
            op->rows->n_rows != x->ne[1] || k->ne[1] < x->ne[1] || v->ne[1] < x->ne[1])
            return op_error(err, op, "heads and tensor shapes disagree");
        const px_rt_rows *rw = op->rows;
        for (uint32_t r = 0; r < rw->n_rows; r++) {
            int32_t slot = rw->slot[r], pos = rw->pos[r];
            if (pos < 0 || (size_t)pos >= attention_positions(op) || slot < 0 ||
                (!rw->block_table && slot >= kc->ne[2]))
                return op_error(err, op, "a row's position or slot lies outside the cache");
            if (!rw->block_table)
                continue;
            /* Every block the row reads must exist. */
            size_t block = (size_t)kc->ne[1];
            for (size_t i = 0; i <= (size_t)pos / block; i++) {
                int32_t b = rw->block_table[(size_t)slot * rw->blocks_per_slot + i];
                if (b < 0 || b >= kc->ne[2])
                    return op_error(err, op, "a row reads a KV-cache block that is not held");
            }
        }
        break;
    }
    case PX_IR_OP_SWIGLU:
    case PX_IR_OP_ADD: {
        const px_rt_tensor *b = op->src[1];
        if (!host_f32(x) || !host_f32(b) || b->ne[0] != x->ne[0] || b->ne[1] < x->ne[1] ||
            y->ne[0] != x->ne[0] || y->ne[1] < x->ne[1])
            return op_error(err, op, "input and output shapes disagree");
        break;
    }
    default:
        return px_err_set(err, PX_EUNSUPPORTED, "cpu: cannot run %s ops",
                          px_ir_op_kind_name(op->kind));
    }
    size_t need = px__rt_cpu_work_size(1, op);
    if (need && (!op->work || !px_rt_tensor_data(op->work)))
        return op_error(err, op, "needs a work buffer (px_rt_device_work_size)");
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Kernels                                                             */
/* ------------------------------------------------------------------ */

typedef struct task {
    const px_rt_op *op;
    const px__rt_kernels *k;
    const float *x; /* matmul input rows (gathered when selected) */
    int8_t *xq;     /* ... quantized for q8_0 weights, and their block scales */
    float *xd;
    uint8_t *xb; /* ... quantized for the other block formats, xb_stride apart */
    size_t xb_stride;
    uint32_t rows;
    float *scratch; /* per-thread scratch, stride `scratch_stride` floats */
    size_t scratch_stride;
    uint32_t n_sub; /* attention: units of query heads per KV head */
} task;

/* Matrix products run as one pool call: their tasks, and where each one's
 * units of weight rows end in the units of the group. */
typedef struct product_group {
    task t[PX__RT_MAX_PRODUCTS];
    size_t unit_end[PX__RT_MAX_PRODUCTS];
    uint32_t n;
} product_group;

/* Runs fn over `items` independent items (rows, units of rows, heads) in
 * parts, on the pool when the op is worth it. */
static void run_split(const px__rt_cpu_exec *ex, px__rt_pool_fn fn, task *t, size_t items,
                      size_t work)
{
    uint32_t nth = px__rt_pool_size(ex->pool);
    if (work < PX__RT_PAR_MIN_WORK || nth == 1 || items <= 1) {
        fn(t, 0, 1, 0);
        return;
    }
    size_t parts = PX_MIN(items, (size_t)nth * PX__RT_PARTS_PER_THREAD);
    px__rt_pool_run(ex->pool, fn, t, (uint32_t)parts);
}

static void embedding(const px__rt_cpu_exec *ex, const px_rt_op *op)
{
    const px_rt_tensor *tab = op->src[0];
    const int32_t *ids = px_rt_tensor_data(op->src[1]);
    const uint8_t *base = px_rt_tensor_data(tab);
    float *y = px_rt_tensor_data(op->dst);
    uint32_t dim = (uint32_t)tab->ne[0];
    for (int64_t r = 0; r < op->src[1]->ne[0]; r++)
        ex->k->dequant(tab->dtype, base + (size_t)ids[r] * tab->nb[1], y + (size_t)r * dim, dim);
}

static void rmsnorm_rows(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    task *t = arg;
    const px_rt_op *op = t->op;
    uint32_t n = (uint32_t)op->src[0]->ne[0];
    const float *x = px_rt_tensor_data(op->src[0]), *w = px_rt_tensor_data(op->src[1]);
    float *y = px_rt_tensor_data(op->dst);
    size_t r0, r1;
    px__rt_split(t->rows, part, n_parts, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        const float *xr = x + (size_t)(op->select ? op->select[r] : r) * n;
        float *yr = y + r * n;
        float ss = t->k->dot_f32(xr, xr, n) / (float)n + op->eps;
        float scale = 1.0f / sqrtf(ss);
        for (uint32_t j = 0; j < n; j++)
            yr[j] = w[j] * (scale * xr[j]);
    }
}

static void quantize_rows(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    task *t = arg;
    size_t k = (size_t)t->op->src[1]->ne[0], nb = k / PX__RT_Q8_0_ELEMS, r0, r1;
    px__rt_split(t->rows, part, n_parts, &r0, &r1);
    px_dtype wt = t->op->src[1]->dtype;
    for (size_t r = r0; r < r1; r++) {
        if (t->xb)
            t->k->quant_act(wt, t->x + r * k, t->xb + r * t->xb_stride, (uint32_t)k);
        else
            t->k->quant_q8_0(t->x + r * k, (uint32_t)k, t->xq + r * k, t->xd + r * nb);
    }
}

/* Output rows [i0, i1) of t's product. */
static void matmul_range(const task *t, uint32_t i0, uint32_t i1)
{
    const px_rt_op *op = t->op;
    const px_rt_tensor *w = op->src[1];
    const uint8_t *wd = px_rt_tensor_data(w);
    uint32_t k = (uint32_t)w->ne[0], n = (uint32_t)w->ne[1];
    float *y = px_rt_tensor_data(op->dst);
    if (w->layout == PX_RT_LAYOUT_Q4_K_X16)
        t->k->matmul_q4_k16(wd, w->nb[1], k, i0, i1, t->xb, t->xb_stride, t->rows, y, n);
    else if (w->dtype == PX_DTYPE_Q8_0)
        t->k->matmul_q8_0(wd, w->nb[1], k, i0, i1, t->xq, t->xd, t->rows, y, n);
    else if (t->xb)
        t->k->matmul_quant(w->dtype, wd, w->nb[1], k, i0, i1, t->xb, t->xb_stride, t->rows, y, n);
    else
        t->k->matmul(w->dtype, wd, w->nb[1], k, i0, i1, t->x, k, t->rows, y, n);
}

/* Rows of op's weights a unit of its work holds. */
static size_t row_unit(const px_rt_op *op)
{
    return op->src[1]->layout == PX_RT_LAYOUT_Q4_K_X16 ? PX__RT_ROW_UNIT_X16 : PX__RT_ROW_UNIT;
}

static size_t row_units(const px_rt_op *op)
{
    return ((size_t)op->src[1]->ne[1] + row_unit(op) - 1) / row_unit(op);
}

/* A part of a group: a range of its units, which may cross from one
 * product into the next. */
static void group_rows(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    const product_group *g = arg;
    size_t u0, u1, first = 0;
    px__rt_split(g->unit_end[g->n - 1], part, n_parts, &u0, &u1);
    for (uint32_t j = 0; j < g->n && u0 < u1; first = g->unit_end[j++]) {
        if (u0 >= g->unit_end[j])
            continue;
        size_t end = PX_MIN(u1, g->unit_end[j]);
        uint32_t n = (uint32_t)g->t[j].op->src[1]->ne[1];
        size_t unit = row_unit(g->t[j].op);
        uint32_t i0 = (uint32_t)PX_MIN((u0 - first) * unit, n);
        uint32_t i1 = (uint32_t)PX_MIN((end - first) * unit, n);
        if (i1 > i0)
            matmul_range(&g->t[j], i0, i1);
        u0 = end;
    }
}

/* Gathers (with a selection) and quantizes op's activation rows into its
 * work buffer, as its weights need them; fills t. */
static void matmul_prepare(const px__rt_cpu_exec *ex, const px_rt_op *op, task *t)
{
    const px_rt_tensor *w = op->src[1];
    uint32_t k = (uint32_t)w->ne[0];
    *t = (task){.op = op, .k = ex->k, .rows = op_out_rows(op)};
    const float *x = px_rt_tensor_data(op->src[0]);
    uint8_t *work = op->work ? px_rt_tensor_data(op->work) : NULL;
    if (op->select) {
        float *g = (float *)(void *)work;
        for (uint32_t r = 0; r < op->n_select; r++)
            memcpy(g + (size_t)r * k, x + (size_t)op->select[r] * k, (size_t)k * sizeof(float));
        t->x = g;
        work += gather_bytes(op);
    } else {
        t->x = x;
    }
    if (w->dtype == PX_DTYPE_Q8_0) {
        t->xd = (float *)(void *)work;
        t->xq = (int8_t *)(work + (size_t)t->rows * (k / PX__RT_Q8_0_ELEMS) * sizeof(float));
        run_split(ex, quantize_rows, t, t->rows, (size_t)t->rows * k * 4);
    } else if (px__rt_quant_handles(w->dtype)) {
        t->xb = work;
        t->xb_stride = px__rt_quant_act_bytes(w->dtype, k);
        run_split(ex, quantize_rows, t, t->rows, (size_t)t->rows * k * 4);
    }
}

static void matmul_bias(const task *t)
{
    const px_rt_op *op = t->op;
    if (!op->src[2])
        return;
    uint32_t n = (uint32_t)op->src[1]->ne[1];
    const float *b = px_rt_tensor_data(op->src[2]);
    float *y = px_rt_tensor_data(op->dst);
    for (uint32_t r = 0; r < t->rows; r++)
        for (uint32_t i = 0; i < n; i++)
            y[(size_t)r * n + i] += b[i];
}

/* Runs the products of g (prepared) in one call of the pool, cut by the
 * bytes of weights they read (px__rt_matmul_parts). */
static void run_group(const px__rt_cpu_exec *ex, product_group *g)
{
    size_t work = 0, bytes = 0, units = 0;
    for (uint32_t j = 0; j < g->n; j++) {
        const px_rt_tensor *w = g->t[j].op->src[1];
        size_t n = (size_t)w->ne[1];
        work += (size_t)w->nb[1] * n / 4 + (size_t)g->t[j].rows * n;
        bytes += (size_t)w->nb[1] * n * g->t[j].rows;
        g->unit_end[j] = units += row_units(g->t[j].op);
    }
    uint32_t nth = px__rt_pool_size(ex->pool);
    if (work < PX__RT_PAR_MIN_WORK || nth == 1 || units <= 1)
        group_rows(g, 0, 1, 0);
    else
        px__rt_pool_run(ex->pool, group_rows, g, px__rt_matmul_parts(units, bytes, nth));
    for (uint32_t j = 0; j < g->n; j++)
        matmul_bias(&g->t[j]);
}

static void matmul(const px__rt_cpu_exec *ex, const px_rt_op *op)
{
    product_group g = {.n = 1};
    matmul_prepare(ex, op, &g.t[0]);
    run_group(ex, &g);
}

static void rope_rows(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    task *t = arg;
    const px_rt_op *op = t->op;
    float *x = px_rt_tensor_data(op->dst);
    const float *tab = px_rt_tensor_data(op->src[1]);
    uint32_t width = (uint32_t)op->dst->ne[0], half = op->rope_dim / 2;
    size_t r0, r1;
    px__rt_split(t->rows, part, n_parts, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        const float *cs = tab + (size_t)op->rows->pos[r] * op->rope_dim;
        for (uint32_t h = 0; h < op->n_heads; h++) {
            float *v = x + r * width + (size_t)h * op->head_dim;
            for (uint32_t i = 0; i < half; i++) {
                uint32_t a = op->rope_style == PX_IR_ROPE_HALVES ? i : 2 * i;
                uint32_t b = op->rope_style == PX_IR_ROPE_HALVES ? i + half : 2 * i + 1;
                float c = cs[2 * i], s = cs[2 * i + 1], v0 = v[a], v1 = v[b];
                v[a] = v0 * c - v1 * s;
                v[b] = v0 * s + v1 * c;
            }
        }
    }
}

/* Attention is cut into units of (row, KV head, subgroup of the query
 * heads that share the KV head): the heads of a unit run together, each
 * K and V row read once for them.  A unit's outputs are the same bits
 * whatever the units beside it, so the split is free to follow the
 * threads: subgroups are made only when whole groups would leave a
 * thread without a part (a decode step of one sequence with fewer KV
 * heads than threads).  Smaller units cost more than they balance: half
 * groups on 2 threads (8 parts for 4 KV heads) made a decode step's
 * attention slower than whole ones (4 parts). */
static uint32_t attention_subgroups(const px_rt_op *op, uint32_t rows, uint32_t n_threads)
{
    uint32_t group = op->n_heads / op->n_kv_heads, sub = 1;
    size_t want = n_threads;
    while (sub < group && (size_t)rows * op->n_kv_heads * sub < want) {
        sub++;
        while (group % sub)
            sub++;
    }
    return sub;
}

/* The cache rows of positions first .. first + n - 1 of slot, as
 * cache_row finds them, a block at a time. */
static void attended_rows(const px_rt_rows *rows, size_t block, int32_t slot, int32_t first,
                          size_t n, uint32_t *at)
{
    if (!rows->block_table) {
        for (size_t p = 0; p < n; p++)
            at[p] = (uint32_t)((size_t)slot * block + (size_t)first + p);
        return;
    }
    const int32_t *table = rows->block_table + (size_t)slot * rows->blocks_per_slot;
    size_t b = (size_t)first / block, off = (size_t)first % block;
    for (size_t p = 0; p < n; b++, off = 0) {
        size_t row = (size_t)table[b] * block;
        for (; off < block && p < n; off++, p++)
            at[p] = (uint32_t)(row + off);
    }
}

/* The largest of x[0..n): in eight lanes, so that the comparisons need
 * not wait for each other (the largest is the same in any order). */
static float scores_max(const float *x, size_t n)
{
    float m[8];
    for (int l = 0; l < 8; l++)
        m[l] = -INFINITY;
    size_t p = 0;
    for (; p + 8 <= n; p += 8)
        for (int l = 0; l < 8; l++)
            m[l] = x[p + l] > m[l] ? x[p + l] : m[l];
    for (; p < n; p++)
        m[0] = x[p] > m[0] ? x[p] : m[0];
    float max = m[0];
    for (int l = 1; l < 8; l++)
        max = m[l] > max ? m[l] : max;
    return max;
}

/* Asks for the cache lines of unit j's K and V rows (its KV head's
 * values at every position it attends), or of its whole rows (every KV
 * head's) with `whole`, ahead of their use.  A sequence's rows are
 * scattered over the cache's blocks and a unit reads a few values of
 * each: taken by the loads, one row's miss after another's, they leave
 * the memory idle. */
static void prefetch_unit(const task *t, size_t j, uint32_t sub, bool whole)
{
    const px_rt_op *op = t->op;
    size_t kv_dim = (size_t)op->n_kv_heads * op->head_dim, block = (size_t)op->src[3]->ne[1];
    size_t r = j / ((size_t)op->n_kv_heads * sub), h = j / sub % op->n_kv_heads;
    size_t row_bytes = kv_dim * sizeof(float), bytes = (size_t)op->head_dim * sizeof(float);
    size_t off = whole ? 0 : h * bytes;
    bytes = whole ? row_bytes : bytes;
    const char *kc = (const char *)px_rt_tensor_data(op->src[3]) + off;
    const char *vc = (const char *)px_rt_tensor_data(op->src[4]) + off;
    int32_t pos = op->rows->pos[r], slot = op->rows->slot[r];
    int32_t first = op->window && (uint32_t)pos >= op->window ? pos - (int32_t)op->window + 1 : 0;
    for (int32_t p = first; p <= pos;) {
        /* A block's positions are consecutive rows. */
        size_t at = cache_row(op->rows, block, slot, p), n = block - (size_t)p % block;
        n = PX_MIN(n, (size_t)(pos - p + 1));
        for (size_t i = 0; i < n; i++)
            for (size_t b = 0; b < bytes; b += 64) {
                __builtin_prefetch(kc + (at + i) * row_bytes + b);
                __builtin_prefetch(vc + (at + i) * row_bytes + b);
            }
        p += (int32_t)n;
    }
}

static void attention_tasks(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    task *t = arg;
    const px_rt_op *op = t->op;
    uint32_t hd = op->head_dim, group = op->n_heads / op->n_kv_heads;
    uint32_t sub = t->n_sub, per = group / sub;
    size_t q_dim = (size_t)op->n_heads * hd, kv_dim = (size_t)op->n_kv_heads * hd;
    size_t ctx = attention_positions(op), block = (size_t)op->src[3]->ne[1];
    const float *q = px_rt_tensor_data(op->src[0]);
    const float *kc = px_rt_tensor_data(op->src[3]), *vc = px_rt_tensor_data(op->src[4]);
    float *out = px_rt_tensor_data(op->dst);
    float *scores = t->scratch + thread * t->scratch_stride;
    /* The cache rows a row attends, found once for the unit's heads. */
    uint32_t *at = (uint32_t *)(void *)(scores + (size_t)group * ctx);
    float scale = 1.0f / sqrtf((float)hd);
    size_t j0, j1;
    px__rt_split((size_t)t->rows * op->n_kv_heads * sub, part, n_parts, &j0, &j1);
    /* Heads smaller than a cache line share their lines with the heads
     * beside them: their rows are asked for whole, a row ahead; larger
     * ones a unit ahead. */
    size_t units = (size_t)op->n_kv_heads * sub;
    bool whole = (size_t)hd * sizeof(float) < 64;
    if (j0 < j1)
        prefetch_unit(t, j0, sub, whole);
    for (size_t j = j0; j < j1; j++) {
        size_t r = j / units, h = j / sub % op->n_kv_heads;
        if (!whole && j + 1 < j1)
            prefetch_unit(t, j + 1, sub, false);
        else if (whole && (j == j0 || j % units == 0) && (r + 1) * units < j1)
            prefetch_unit(t, (r + 1) * units, sub, true);
        size_t hq = h * group + j % sub * per; /* the unit's first query head */
        int32_t pos = op->rows->pos[r];
        int32_t first =
            op->window && (uint32_t)pos >= op->window ? pos - (int32_t)op->window + 1 : 0;
        size_t n_att = (size_t)(pos - first + 1);
        int32_t slot = op->rows->slot[r];
        /* A row's units (its KV heads) attend the same cache rows. */
        if (j == j0 || j % units == 0)
            attended_rows(op->rows, block, slot, first, n_att, at);
        t->k->attn_scores_group(q + r * q_dim + hq * hd, per, kc + h * hd, kv_dim, at, n_att, hd,
                                scale, scores, ctx);
        for (uint32_t g = 0; g < per; g++) {
            float *sc = scores + (size_t)g * ctx;
            float max = scores_max(sc, n_att);
            float inv = 1.0f / t->k->exp_sum(sc, n_att, max);
            for (size_t p = 0; p < n_att; p++)
                sc[p] *= inv;
        }
        t->k->attn_values_group(scores, ctx, per, vc + h * hd, kv_dim, at, n_att, hd,
                                out + r * q_dim + hq * hd);
    }
}

static void attention(const px__rt_cpu_exec *ex, const px_rt_op *op)
{
    const px_rt_tensor *k = op->src[1], *v = op->src[2], *kc = op->src[3], *vc = op->src[4];
    size_t kv_dim = (size_t)k->ne[0], block = (size_t)kc->ne[1];
    const float *kd = px_rt_tensor_data(k), *vd = px_rt_tensor_data(v);
    float *kcd = px_rt_tensor_data(kc), *vcd = px_rt_tensor_data(vc);
    uint32_t rows = op->rows->n_rows;
    /* Store every new row first: later rows of a sequence attend to
     * earlier rows of the same step. */
    for (uint32_t r = 0; r < rows; r++) {
        size_t at = cache_row(op->rows, block, op->rows->slot[r], op->rows->pos[r]) * kv_dim;
        memcpy(kcd + at, kd + r * kv_dim, kv_dim * sizeof(float));
        memcpy(vcd + at, vd + r * kv_dim, kv_dim * sizeof(float));
    }
    size_t pairs = 0;
    for (uint32_t r = 0; r < rows; r++)
        pairs += (size_t)op->rows->pos[r] + 1;
    task t = {.op = op,
              .k = ex->k,
              .rows = rows,
              .n_sub = attention_subgroups(op, rows, px__rt_pool_size(ex->pool)),
              .scratch = px_rt_tensor_data(op->work),
              .scratch_stride =
                  (size_t)(op->n_heads / op->n_kv_heads + 1) * attention_positions(op)};
    run_split(ex, attention_tasks, &t, (size_t)rows * op->n_kv_heads * t.n_sub,
              pairs * op->n_heads * op->head_dim);
}

static void elementwise_rows(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    task *t = arg;
    const px_rt_op *op = t->op;
    size_t n = (size_t)op->src[0]->ne[0], i0, i1;
    px__rt_split(t->rows, part, n_parts, &i0, &i1);
    const float *a = px_rt_tensor_data(op->src[0]), *b = px_rt_tensor_data(op->src[1]);
    float *y = px_rt_tensor_data(op->dst);
    for (size_t i = i0 * n; i < i1 * n; i++) {
        if (op->kind == PX_IR_OP_ADD)
            y[i] = a[i] + b[i];
        else
            y[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
    }
}

/* A weight in a layout other than its rows: only a product's Q4_K matrix in the layout the
 * kernels have a decode for. */
static px_status check_layout(const px__rt_cpu_exec *ex, const px_rt_op *op, px_err *err)
{
    const px_rt_tensor *w = op->src[op->kind == PX_IR_OP_EMBEDDING ? 0 : 1];
    if (!w || w->layout == PX_RT_LAYOUT_ROWS)
        return PX_OK;
    bool product = op->kind == PX_IR_OP_MATMUL || op->kind == PX_IR_OP_CLASSIFIER;
    if (!product || w->layout != PX_RT_LAYOUT_Q4_K_X16 || !ex->k->matmul_q4_k16)
        return px_err_set(
            err, PX_EUNSUPPORTED, "cpu: %s cannot read weight %s in layout %u with the %s kernels",
            px_ir_op_kind_name(op->kind), w->name ? w->name : "?", w->layout, ex->k->name);
    if (w->dtype != PX_DTYPE_Q4_K || w->ne[1] % PX__RT_Q4K16_ROWS ||
        w->nb[1] != (size_t)w->ne[0] / PX__RT_QK * px_dtype_block_bytes(w->dtype))
        return op_error(err, op,
                        "a weight in the q4_k x16 layout must be a contiguous q4_k "
                        "matrix whose rows are a multiple of 16");
    return PX_OK;
}

/* The checks every op passes before it runs. */
static px_status check_run(const px__rt_cpu_exec *ex, const px_rt_op *op, px_err *err)
{
    px_status st = check_op(op, err);
    if (st || (st = check_layout(ex, op, err)))
        return st;
    if (op->work) {
        size_t need = px__rt_cpu_work_size(px__rt_pool_size(ex->pool), op);
        if (px_rt_tensor_nbytes(op->work) < need)
            return op_error(err, op, "work buffer smaller than px_rt_device_work_size says");
    }
    return PX_OK;
}

px_status px__rt_cpu_run_op(const px__rt_cpu_exec *ex, const px_rt_op *op, px_err *err)
{
    px_status st = check_run(ex, op, err);
    if (st)
        return st;
    task t = {.op = op, .k = ex->k, .rows = op_out_rows(op)};
    size_t width = (size_t)op->src[0]->ne[0];
    switch (op->kind) {
    case PX_IR_OP_EMBEDDING:
        embedding(ex, op);
        break;
    case PX_IR_OP_RMSNORM:
        run_split(ex, rmsnorm_rows, &t, t.rows, t.rows * width);
        break;
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER:
        matmul(ex, op);
        break;
    case PX_IR_OP_ROPE:
        run_split(ex, rope_rows, &t, t.rows, t.rows * width);
        break;
    case PX_IR_OP_ATTENTION:
        attention(ex, op);
        break;
    case PX_IR_OP_SWIGLU:
        run_split(ex, elementwise_rows, &t, t.rows, t.rows * width * 8);
        break;
    case PX_IR_OP_ADD:
        run_split(ex, elementwise_rows, &t, t.rows, t.rows * width);
        break;
    default:
        return px_err_set(err, PX_EUNSUPPORTED, "cpu: cannot run %s ops",
                          px_ir_op_kind_name(op->kind));
    }
    return PX_OK;
}

/* How a product's activation rows are prepared: as they are (float
 * weights), split into values and scales (q8_0 weights), or in the
 * activation blocks of the other block formats (Q8_0 or Q8_K). */
static int activation_kind(px_dtype t)
{
    if (t == PX_DTYPE_Q8_0)
        return -1;
    if (px__rt_quant_handles(t))
        return (int)px__rt_quant_act_dtype(t);
    return -2;
}

static bool overlaps(const px_rt_tensor *a, const px_rt_tensor *b)
{
    const uint8_t *pa = px_rt_tensor_data(a), *pb = px_rt_tensor_data(b);
    return pa && pb && pa < pb + px_rt_tensor_nbytes(b) && pb < pa + px_rt_tensor_nbytes(a);
}

size_t px__rt_cpu_products(const px_rt_op *ops, size_t n_ops)
{
    if (n_ops == 0)
        return 0;
    const px_rt_op *a = &ops[0];
    if (a->kind != PX_IR_OP_MATMUL || a->select || !a->src[1] || !a->dst)
        return 1;
    size_t n = 1;
    for (; n < n_ops && n < PX__RT_MAX_PRODUCTS; n++) {
        const px_rt_op *b = &ops[n];
        if (b->kind != PX_IR_OP_MATMUL || b->select || b->src[0] != a->src[0] || !b->src[1] ||
            !b->dst || b->work != a->work ||
            activation_kind(b->src[1]->dtype) != activation_kind(a->src[1]->dtype))
            break;
        /* Every product reads the input of the first: none may write it,
         * nor an output another one writes. */
        bool clash = false;
        for (size_t j = 0; j <= n && !clash; j++)
            clash = overlaps(ops[j].dst, a->src[0]) || (j < n && overlaps(ops[j].dst, b->dst));
        if (clash)
            break;
    }
    return n;
}

px_status px__rt_cpu_run_products(const px__rt_cpu_exec *ex, const px_rt_op *ops, size_t n_ops,
                                  px_err *err)
{
    PX_ASSERT(n_ops >= 1 && n_ops <= PX__RT_MAX_PRODUCTS);
    for (size_t j = 0; j < n_ops; j++) {
        px_status st = check_run(ex, &ops[j], err);
        if (st)
            return st;
    }
    product_group g = {.n = (uint32_t)n_ops};
    matmul_prepare(ex, &ops[0], &g.t[0]);
    for (uint32_t j = 1; j < g.n; j++) {
        /* The first product's rows, prepared as every other one needs. */
        g.t[j] = g.t[0];
        g.t[j].op = &ops[j];
    }
    run_group(ex, &g);
    return PX_OK;
}
