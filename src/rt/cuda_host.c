/*
 * The cuda backend's host side that needs no GPU and no CUDA headers:
 * which ops and dtypes it runs, the checks made before anything is
 * queued, the scratch each op needs, the memory accounting, the refusal
 * when no GPU is there, the cross-check of discovery against the runtime
 * and the key of a captured step.  Built with or without CUDA, so that
 * its tests run everywhere.
 */
#include "base/common.h"

#include <ctype.h>

#include "rt/cuda_impl.h"
#include "rt/rt_impl.h"

bool px__rt_cuda_dtype(px_dtype t, px__cuda_dtype *out)
{
    static const struct {
        px_dtype t;
        px__cuda_dtype c;
    } map[] = {
        {PX_DTYPE_F32, PX__CUDA_F32},   {PX_DTYPE_F16, PX__CUDA_F16},
        {PX_DTYPE_BF16, PX__CUDA_BF16}, {PX_DTYPE_Q8_0, PX__CUDA_Q8_0},
        {PX_DTYPE_Q4_0, PX__CUDA_Q4_0}, {PX_DTYPE_Q5_0, PX__CUDA_Q5_0},
        {PX_DTYPE_Q2_K, PX__CUDA_Q2_K}, {PX_DTYPE_Q3_K, PX__CUDA_Q3_K},
        {PX_DTYPE_Q4_K, PX__CUDA_Q4_K}, {PX_DTYPE_Q5_K, PX__CUDA_Q5_K},
        {PX_DTYPE_Q6_K, PX__CUDA_Q6_K},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(map); i++)
        if (map[i].t == t) {
            if (out)
                *out = map[i].c;
            return true;
        }
    return false;
}

bool px__rt_cuda_supports(px_ir_op_kind op, px_dtype t)
{
    /* The cpu's ops and formats, each of which has a kernel here. */
    return px__rt_cpu_supports(op, t) && px__rt_cuda_dtype(t, NULL);
}

static bool is_matmul(const px_rt_op *op)
{
    return op->kind == PX_IR_OP_MATMUL || op->kind == PX_IR_OP_CLASSIFIER;
}

uint32_t px__rt_cuda_op_rows(const px_rt_op *op)
{
    return op->select ? op->n_select : (uint32_t)op->src[0]->ne[1];
}

bool px__rt_cuda_use_gemm(const px_rt_op *op)
{
    return is_matmul(op) && px__rt_cuda_op_rows(op) > PX__CUDA_MV_MAX_ROWS;
}

uint32_t px__rt_cuda_tile_rows(const px_rt_op *op)
{
    const px_rt_tensor *w = op->src[1];
    uint64_t row = (uint64_t)w->ne[0] * sizeof(float);
    uint64_t n = row ? PX__CUDA_TILE_BYTES / row : 1;
    /* At least one row; at most a grid's 65535 rows. */
    n = PX_MIN(PX_MAX(n, 1), 65535);
    return (uint32_t)PX_MIN(n, (uint64_t)w->ne[1]);
}

size_t px__rt_cuda_work_size(const px_rt_op *op)
{
    if (!px__rt_cuda_use_gemm(op))
        return 0;
    const px_rt_tensor *w = op->src[1];
    size_t k = (size_t)w->ne[0], n = 0;
    if (op->select)
        n += (size_t)op->n_select * k * sizeof(float);
    if (w->dtype != PX_DTYPE_F32) {
        /* Tiles start aligned for cuBLAS. */
        n = (n + PX__CUDA_ALLOC_ALIGN - 1) / PX__CUDA_ALLOC_ALIGN * PX__CUDA_ALLOC_ALIGN;
        n += (size_t)px__rt_cuda_tile_rows(op) * k * sizeof(float);
    }
    return n;
}

uint32_t px__rt_cuda_ordinal(const char *device)
{
    const char *g = device ? strstr(device, "gpu") : NULL;
    const char *last = NULL;
    for (; g; g = strstr(g + 1, "gpu"))
        last = g;
    if (!last || !isdigit((unsigned char)last[3]))
        return 0;
    char *end;
    unsigned long n = strtoul(last + 3, &end, 10);
    return *end || n > 65535 ? 0 : (uint32_t)n;
}

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

static px_status op_error(px_err *err, const char *dev, const px_rt_op *op, const char *what)
{
    return px_err_set(err, PX_EINVAL, "%s: %s op (layer %d): %s", dev, px_ir_op_kind_name(op->kind),
                      op->layer, what);
}

/* A contiguous f32 matrix on a device (any buffer). */
static bool dense_f32(const px_rt_tensor *t)
{
    return t && t->buffer && t->dtype == PX_DTYPE_F32 && t->nb[0] == sizeof(float) &&
           t->nb[1] == (size_t)t->ne[0] * sizeof(float);
}

static bool positions_ok(const px_rt_op *op, size_t limit)
{
    for (uint32_t r = 0; r < op->rows->n_rows; r++)
        if (op->rows->pos[r] < 0 || (size_t)op->rows->pos[r] >= limit)
            return false;
    return true;
}

static px_status check_attention(const char *dev, const px_rt_op *op, px_err *err)
{
    const px_rt_tensor *x = op->src[0], *k = op->src[1], *v = op->src[2], *kc = op->src[3],
                       *vc = op->src[4], *y = op->dst;
    uint64_t kv_dim = (uint64_t)op->n_kv_heads * op->head_dim;
    if (!dense_f32(x) || !dense_f32(k) || !dense_f32(v) || !dense_f32(kc) || !dense_f32(vc) ||
        !op->rows)
        return op_error(err, dev, op, "needs f32 q, k, v, both caches and the row layout");
    if (op->n_kv_heads == 0 || op->n_heads % op->n_kv_heads ||
        (uint64_t)x->ne[0] != (uint64_t)op->n_heads * op->head_dim ||
        (uint64_t)k->ne[0] != kv_dim || (uint64_t)v->ne[0] != kv_dim ||
        (uint64_t)kc->ne[0] != kv_dim || (uint64_t)vc->ne[0] != kv_dim || kc->ne[1] != vc->ne[1] ||
        kc->ne[2] != vc->ne[2] || y->ne[0] != x->ne[0] || op->rows->n_rows != x->ne[1] ||
        k->ne[1] < x->ne[1] || v->ne[1] < x->ne[1])
        return op_error(err, dev, op, "heads and tensor shapes disagree");
    if (op->head_dim == 0 || op->head_dim > PX__CUDA_MAX_HEAD_DIM)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: attention (layer %d): heads of %u values; the kernel takes 1 to %u",
                          dev, op->layer, op->head_dim, PX__CUDA_MAX_HEAD_DIM);
    const px_rt_rows *rw = op->rows;
    size_t block = (size_t)kc->ne[1];
    size_t positions = rw->block_table ? block * rw->blocks_per_slot : block;
    for (uint32_t r = 0; r < rw->n_rows; r++) {
        int32_t slot = rw->slot[r], pos = rw->pos[r];
        if (pos < 0 || (size_t)pos >= positions || slot < 0 ||
            (!rw->block_table && slot >= kc->ne[2]))
            return op_error(err, dev, op, "a row's position or slot lies outside the cache");
        if (!rw->block_table)
            continue;
        for (size_t i = 0; i <= (size_t)pos / block; i++) {
            int32_t b = rw->block_table[(size_t)slot * rw->blocks_per_slot + i];
            if (b < 0 || b >= kc->ne[2])
                return op_error(err, dev, op, "a row reads a KV-cache block that is not held");
        }
    }
    return PX_OK;
}

px_status px__rt_cuda_check_op(const char *dev, const px_rt_op *op, px_err *err)
{
    const px_rt_tensor *x = op->src[0], *y = op->dst;
    if (!x || !y || !x->buffer || !y->buffer)
        return op_error(err, dev, op, "missing input or output tensor");
    if (!px__rt_cuda_supports(op->kind, x->dtype))
        return px_err_set(err, PX_EUNSUPPORTED, "%s: cannot run %s on %s input", dev,
                          px_ir_op_kind_name(op->kind), px_dtype_name(x->dtype));
    if (!dense_f32(y))
        return op_error(err, dev, op, "output must be a contiguous f32 tensor");
    if (op->select) {
        for (uint32_t r = 0; r < op->n_select; r++)
            if (op->select[r] >= (uint64_t)x->ne[1])
                return op_error(err, dev, op, "a selected row lies outside the input");
    }
    switch (op->kind) {
    case PX_IR_OP_EMBEDDING: {
        const px_rt_tensor *ids = op->src[1];
        if (!ids || ids->dtype != PX_DTYPE_I32 || !ids->buffer)
            return op_error(err, dev, op, "src[1] must hold i32 token ids");
        if (y->ne[0] != x->ne[0] || y->ne[1] < ids->ne[0])
            return op_error(err, dev, op, "output shape does not match the table and the ids");
        /* The ids live on the device: the session checked them against
         * the vocabulary. */
        return PX_OK;
    }
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER: {
        const px_rt_tensor *w = op->src[1], *b = op->src[2];
        if (!dense_f32(x) || !w || !w->buffer)
            return op_error(err, dev, op, "needs f32 activations and a weight");
        if (!px__rt_cuda_supports(op->kind, w->dtype))
            return px_err_set(err, PX_EUNSUPPORTED, "%s: cannot multiply by %s weights (%s)", dev,
                              px_dtype_name(w->dtype), w->name ? w->name : "weight");
        if (w->ne[0] != x->ne[0] || y->ne[0] != w->ne[1] || y->ne[1] < px__rt_cuda_op_rows(op))
            return op_error(err, dev, op, "shapes of activations, weight and output disagree");
        uint32_t be = px_dtype_block_elems(w->dtype);
        if (be > 1 && w->ne[0] % be)
            return op_error(err, dev, op, "weight rows are not a whole number of blocks");
        if (w->dtype == PX_DTYPE_F32 && w->nb[1] % sizeof(float))
            return op_error(err, dev, op, "f32 weight rows must be 4-byte aligned");
        if (b && (!dense_f32(b) || b->ne[0] != w->ne[1]))
            return op_error(err, dev, op, "bias must be f32 of the output width");
        break;
    }
    case PX_IR_OP_RMSNORM: {
        const px_rt_tensor *w = op->src[1];
        if (!dense_f32(x) || !dense_f32(w) || w->ne[0] != x->ne[0] || y->ne[0] != x->ne[0] ||
            y->ne[1] < px__rt_cuda_op_rows(op))
            return op_error(err, dev, op, "shapes of input, weight and output disagree");
        break;
    }
    case PX_IR_OP_ROPE: {
        const px_rt_tensor *tab = op->src[1];
        if (y != x || !dense_f32(x) || !dense_f32(tab) || !op->rows)
            return op_error(err, dev, op,
                            "rotates src[0] in place and needs the table and row positions");
        if (op->rope_dim == 0 || op->rope_dim % 2 || op->rope_dim > op->head_dim ||
            (uint64_t)op->n_heads * op->head_dim != (uint64_t)x->ne[0] ||
            tab->ne[0] != op->rope_dim || op->rows->n_rows != x->ne[1])
            return op_error(err, dev, op,
                            "heads, rotated dimensions or rows disagree with the tensors");
        if (!positions_ok(op, (size_t)tab->ne[1]))
            return op_error(err, dev, op, "a position lies outside the rotation table");
        break;
    }
    case PX_IR_OP_ATTENTION:
        return check_attention(dev, op, err);
    case PX_IR_OP_SWIGLU:
    case PX_IR_OP_ADD: {
        const px_rt_tensor *b = op->src[1];
        if (!dense_f32(x) || !dense_f32(b) || b->ne[0] != x->ne[0] || b->ne[1] < x->ne[1] ||
            y->ne[0] != x->ne[0] || y->ne[1] < x->ne[1])
            return op_error(err, dev, op, "input and output shapes disagree");
        break;
    }
    default:
        return px_err_set(err, PX_EUNSUPPORTED, "%s: cannot run %s ops", dev,
                          px_ir_op_kind_name(op->kind));
    }
    size_t need = px__rt_cuda_work_size(op);
    if (need && (!op->work || !op->work->buffer || px_rt_tensor_nbytes(op->work) < need))
        return op_error(err, dev, op, "needs a work buffer (px_rt_device_work_size)");
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Memory accounting                                                   */
/* ------------------------------------------------------------------ */

uint64_t px__rt_cuda_mem_round(uint64_t n)
{
    uint64_t a = PX__CUDA_ALLOC_ALIGN;
    if (n > UINT64_MAX - (a - 1))
        return UINT64_MAX;
    return (n + a - 1) / a * a;
}

static void fmt_bytes(char *buf, size_t cap, uint64_t n)
{
    if (n >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)n / (double)(1ull << 30));
    else if (n >= (1ull << 20))
        snprintf(buf, cap, "%.1f MiB", (double)n / (double)(1ull << 20));
    else
        snprintf(buf, cap, "%" PRIu64 " bytes", n);
}

px_status px__rt_cuda_mem_reserve(px__rt_cuda_mem *m, const char *dev, uint64_t n, px_err *err)
{
    uint64_t r = px__rt_cuda_mem_round(n);
    uint64_t limit = m->limit ? m->limit : m->total;
    if (limit && (m->used > limit || r > limit - m->used)) {
        char want[32], used[32], lim[32];
        fmt_bytes(want, sizeof want, r);
        fmt_bytes(used, sizeof used, m->used);
        fmt_bytes(lim, sizeof lim, limit);
        return px_err_set(err, PX_ENOMEM,
                          "%s: cannot allocate %s: %s in use of %s (%" PRIu64
                          " buffers); hold fewer layers or a shorter KV cache on this GPU",
                          dev, want, used, lim, m->n_buffers);
    }
    m->used += r;
    m->n_buffers++;
    m->peak = PX_MAX(m->peak, m->used);
    return PX_OK;
}

void px__rt_cuda_mem_release(px__rt_cuda_mem *m, uint64_t n)
{
    uint64_t r = px__rt_cuda_mem_round(n);
    m->used -= PX_MIN(m->used, r);
    if (m->n_buffers)
        m->n_buffers--;
}

/* ------------------------------------------------------------------ */
/* Messages                                                            */
/* ------------------------------------------------------------------ */

px_status px__rt_cuda_refuse(px_err *err, uint32_t ordinal, int count, int cuda_error,
                             const char *cuda_text)
{
    /* Short enough for a px_err with a worker's prefix. */
    if (count < 0)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "cuda:%u: this plexus was built without the cuda backend (no nvcc at "
                          "configure time); install the CUDA toolkit and rebuild, or place the "
                          "stage on a cpu device",
                          ordinal);
    if (cuda_error)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "cuda:%u: no usable NVIDIA GPU (CUDA error %d: %.64s); check the driver "
                          "with nvidia-smi, or place the stage on a cpu device (plexus never "
                          "falls back)",
                          ordinal, cuda_error, cuda_text ? cuda_text : "unknown");
    if (count == 0)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "cuda:%u: no NVIDIA GPU on this machine; run the stage where one is, "
                          "or place it on a cpu device (plexus never falls back)",
                          ordinal);
    return px_err_set(err, PX_ENOTFOUND,
                      "cuda:%u: this machine has %d GPU%s (cuda:0 to cuda:%d); name one of "
                      "them in the plan or the inventory",
                      ordinal, count, count == 1 ? "" : "s", count - 1);
}

static bool far_apart(double a, double b, double rel, double abs_slack)
{
    if (isnan(a) || isnan(b))
        return false;
    double d = fabs(a - b);
    return d > abs_slack && d > rel * PX_MAX(fabs(a), fabs(b));
}

static void warn(px_diags *w, uint32_t ordinal, const char *field, const char *fix, const char *fmt,
                 ...) PX_PRINTF(5, 6);
static void warn(px_diags *w, uint32_t ordinal, const char *field, const char *fix, const char *fmt,
                 ...)
{
    char msg[384], ptr[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ptr, sizeof ptr, "/gpu%u/%s", ordinal, field);
    (void)px_diags_add(w, PX_SEV_WARNING, ptr, fix, "%s", msg);
}

size_t px_rt_cuda_crosscheck(const px_rt_cuda_info *smi, const px_rt_cuda_info *rt,
                             uint32_t ordinal, px_diags *w)
{
    size_t before = w->n_warnings;
    static const char fix[] = "check CUDA_VISIBLE_DEVICES and MIG settings: nvidia-smi and the "
                              "CUDA runtime must number the same GPUs";
    if (smi->name[0] && rt->name[0] && strcmp(smi->name, rt->name))
        warn(w, ordinal, "model", fix,
             "GPU %u: nvidia-smi names it \"%s\", the CUDA runtime \"%s\"", ordinal, smi->name,
             rt->name);
    if (smi->capability[0] && rt->capability[0] && strcmp(smi->capability, rt->capability))
        warn(w, ordinal, "capability", fix,
             "GPU %u: compute capability %s by nvidia-smi, %s by the CUDA runtime", ordinal,
             smi->capability, rt->capability);
    if (far_apart(smi->memory_total, rt->memory_total, 0.01, 64.0 * (1 << 20)))
        warn(w, ordinal, "memory_total", fix,
             "GPU %u: %.0f MiB of memory by nvidia-smi, %.0f MiB by the CUDA runtime", ordinal,
             smi->memory_total / (1 << 20), rt->memory_total / (1 << 20));
    if (far_apart(smi->clock_max_sm, rt->clock_max_sm, 0.05, 0))
        warn(w, ordinal, "clock_max_sm", fix,
             "GPU %u: SM clock %.0f MHz by nvidia-smi, %.0f MHz by the CUDA runtime", ordinal,
             smi->clock_max_sm / 1e6, rt->clock_max_sm / 1e6);
    if (smi->multiprocessors && rt->multiprocessors && smi->multiprocessors != rt->multiprocessors)
        warn(w, ordinal, "multiprocessors", fix,
             "GPU %u: %d multiprocessors by discovery, %d by the CUDA runtime", ordinal,
             smi->multiprocessors, rt->multiprocessors);
    return w->n_warnings - before;
}

/* ------------------------------------------------------------------ */
/* Graph keys                                                          */
/* ------------------------------------------------------------------ */

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

#define MIX(h, v) ((h) = mix((h), &(v), sizeof(v)))

static uint64_t mix_tensor(uint64_t h, const px_rt_tensor *t,
                           uint64_t (*addr)(const px_rt_tensor *t, void *ud), void *ud)
{
    uint64_t a = t ? addr(t, ud) : 0;
    MIX(h, a);
    if (t) {
        int32_t dt = (int32_t)t->dtype;
        MIX(h, dt);
        for (int i = 0; i < PX_RT_MAX_DIMS; i++) {
            MIX(h, t->ne[i]);
            MIX(h, t->nb[i]);
        }
    }
    return h;
}

uint64_t px__rt_cuda_ops_key(const px_rt_op *ops, size_t n,
                             uint64_t (*addr)(const px_rt_tensor *t, void *ud), void *ud)
{
    uint64_t h = 14695981039346656037ull;
    MIX(h, n);
    for (size_t i = 0; i < n; i++) {
        const px_rt_op *op = &ops[i];
        int32_t kind = (int32_t)op->kind, style = (int32_t)op->rope_style;
        uint32_t n_select = op->select ? op->n_select : UINT32_MAX;
        uint32_t n_rows = op->rows ? op->rows->n_rows : UINT32_MAX;
        uint32_t bps = op->rows ? op->rows->blocks_per_slot : 0;
        uint8_t paged = op->rows && op->rows->block_table;
        MIX(h, kind);
        MIX(h, op->layer);
        MIX(h, n_select);
        MIX(h, n_rows);
        MIX(h, bps);
        MIX(h, paged);
        MIX(h, op->eps);
        MIX(h, op->n_heads);
        MIX(h, op->n_kv_heads);
        MIX(h, op->head_dim);
        MIX(h, op->rope_dim);
        MIX(h, style);
        MIX(h, op->window);
        for (int s = 0; s < 5; s++)
            h = mix_tensor(h, op->src[s], addr, ud);
        h = mix_tensor(h, op->dst, addr, ud);
        h = mix_tensor(h, op->work, addr, ud);
    }
    return h;
}
