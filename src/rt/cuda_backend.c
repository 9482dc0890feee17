/*
 * The cuda backend: NVIDIA GPUs through the CUDA runtime and cuBLAS.
 *
 * - Devices: one per GPU ordinal ("cuda:0").  Opening one without a GPU,
 *   without a driver or in a build without nvcc fails with a message that
 *   names the device and the fix; nothing falls back to the cpu.
 * - Buffers: device memory (cudaMalloc, zero-filled), never host-visible.
 *   Transfers go through two pinned staging chunks per device: the host
 *   copy into one overlaps the DMA of the other, so weights uploaded once
 *   per stage worker stream at the link's speed.  Every byte is accounted
 *   (cuda_host.c), and the device's props report what is in use.
 * - Streams: a CUDA stream and a cuBLAS handle.  A run uploads the step's
 *   row layout (slots, positions, block table, row selections) into a
 *   device area at fixed places, queues the ops, and waits.  Matrix
 *   products of up to PX__CUDA_MV_MAX_ROWS rows run the own matrix-vector
 *   kernels; larger ones convert weight tiles to f32 and call cuBLAS.  A
 *   step made only of own kernels (the decode step) is captured once as a
 *   CUDA graph and replayed while its ops, shapes and addresses stay the
 *   same (PLEXUS_CUDA_GRAPHS=0 turns graphs off).
 */
#include "base/common.h"

#include <pthread.h>

#include "rt/cuda_impl.h"
#include "rt/rt_impl.h"

#if PX_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#define STAGE_BYTES ((size_t)8 << 20)
#define MAX_GRAPHS  16

typedef struct cuda_device {
    int ordinal;
    char name[32];   /* "cuda:0" */
    char model[128]; /* "NVIDIA H200" */
    int cc_major, cc_minor, sms;
    uint64_t total;
    px__rt_cuda_mem mem;
    pthread_mutex_t lock; /* staging and accounting */
    cudaStream_t xfer;
    void *stage[2];
    cudaEvent_t stage_done[2];
} cuda_device;

typedef struct cuda_buffer {
    cuda_device *dev;
    void *ptr;
    size_t size;
} cuda_buffer;

typedef struct graph_entry {
    uint64_t key;
    uint64_t used; /* tick of the last replay; 0: empty */
    cudaGraphExec_t exec;
} graph_entry;

typedef struct cuda_stream {
    cuda_device *dev;
    cudaStream_t s;
    cublasHandle_t blas;
    /* The row layout: slot[cap_rows], pos[cap_rows], block table[cap_bt],
     * selections[cap_sel], int32 each, on the device and pinned. */
    int32_t *meta_dev, *meta_host;
    size_t cap_rows, cap_bt, cap_sel;
    graph_entry graphs[MAX_GRAPHS];
    uint64_t tick;
    bool use_graphs;
    cudaEvent_t *events;
    size_t n_events;
} cuda_stream;

static const px_rt_buffer_iface cuda_buffer_iface;

/* ------------------------------------------------------------------ */
/* cuBLAS, opened with the first stream                                */
/* ------------------------------------------------------------------ */

#define STR_(x) #x
#define STR(x)  STR_(x)

static struct {
    cublasStatus_t (*create)(cublasHandle_t *h);
    cublasStatus_t (*destroy)(cublasHandle_t h);
    cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
    cublasStatus_t (*set_math_mode)(cublasHandle_t h, cublasMath_t mode);
    cublasStatus_t (*sgemm)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const float *alpha, const float *a, int lda,
                            const float *b, int ldb, const float *beta, float *c, int ldc);
    const char *(*status)(cublasStatus_t s);
    char error[200];
} blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_load(void)
{
    static const char *const names[] = {"libcublas.so." STR(CUBLAS_VER_MAJOR),
                                        PX_CUBLAS_DIR "/libcublas.so." STR(CUBLAS_VER_MAJOR)};
    void *h = NULL;
    for (size_t i = 0; i < PX_ARRAY_LEN(names) && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(blas.error, sizeof blas.error, "cannot open cuBLAS: %.150s", dlerror());
        return;
    }
    *(void **)&blas.create = dlsym(h, "cublasCreate_v2");
    *(void **)&blas.destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&blas.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&blas.set_math_mode = dlsym(h, "cublasSetMathMode");
    *(void **)&blas.sgemm = dlsym(h, "cublasSgemm_v2");
    *(void **)&blas.status = dlsym(h, "cublasGetStatusString");
    if (!blas.create || !blas.destroy || !blas.set_stream || !blas.set_math_mode || !blas.sgemm ||
        !blas.status) {
        snprintf(blas.error, sizeof blas.error, "cuBLAS lacks a function plexus calls");
        blas.create = NULL;
    }
}

static px_status cuda_fail(px_err *err, const cuda_device *d, cudaError_t e, const char *what)
{
    return px_err_set(err, e == cudaErrorMemoryAllocation ? PX_ENOMEM : PX_EIO, "%s (%s): %s: %s",
                      d->name, d->model, what, cudaGetErrorString(e));
}

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

static void buffer_free(void *b)
{
    cuda_buffer *cb = b;
    cudaSetDevice(cb->dev->ordinal);
    cudaFree(cb->ptr);
    pthread_mutex_lock(&cb->dev->lock);
    px__rt_cuda_mem_release(&cb->dev->mem, cb->size);
    pthread_mutex_unlock(&cb->dev->lock);
    free(cb);
}

/* Host -> device or back through the pinned chunks: chunk i's host copy
 * runs while chunk i-1 is in flight.  Caller holds d->lock. */
static px_status staged(cuda_device *d, char *dev_ptr, char *host, size_t n, bool to_device,
                        px_err *err)
{
    cudaError_t e = cudaSuccess;
    if (!to_device) {
        for (size_t done = 0; done < n && !e;) {
            size_t c = PX_MIN(n - done, STAGE_BYTES);
            e = cudaMemcpyAsync(d->stage[0], dev_ptr + done, c, cudaMemcpyDeviceToHost, d->xfer);
            if (!e)
                e = cudaStreamSynchronize(d->xfer);
            if (!e)
                memcpy(host + done, d->stage[0], c);
            done += c;
        }
        return e ? cuda_fail(err, d, e, "copy to the host") : PX_OK;
    }
    int k = 0;
    for (size_t done = 0; done < n && !e; k ^= 1) {
        size_t c = PX_MIN(n - done, STAGE_BYTES);
        e = cudaEventSynchronize(d->stage_done[k]); /* the chunk's last DMA */
        if (e)
            break;
        memcpy(d->stage[k], host + done, c);
        e = cudaMemcpyAsync(dev_ptr + done, d->stage[k], c, cudaMemcpyHostToDevice, d->xfer);
        if (!e)
            e = cudaEventRecord(d->stage_done[k], d->xfer);
        done += c;
    }
    if (!e)
        e = cudaStreamSynchronize(d->xfer);
    return e ? cuda_fail(err, d, e, "copy to the device") : PX_OK;
}

static px_status buffer_set(void *b, size_t offset, const void *src, size_t n, px_err *err)
{
    cuda_buffer *cb = b;
    cudaSetDevice(cb->dev->ordinal);
    pthread_mutex_lock(&cb->dev->lock);
    px_status st = staged(cb->dev, (char *)cb->ptr + offset, (char *)(uintptr_t)src, n, true, err);
    pthread_mutex_unlock(&cb->dev->lock);
    return st;
}

static px_status buffer_get(void *b, size_t offset, void *dst, size_t n, px_err *err)
{
    cuda_buffer *cb = b;
    cudaSetDevice(cb->dev->ordinal);
    pthread_mutex_lock(&cb->dev->lock);
    px_status st = staged(cb->dev, (char *)cb->ptr + offset, dst, n, false, err);
    pthread_mutex_unlock(&cb->dev->lock);
    return st;
}

static px_status buffer_fill(void *b, size_t offset, uint8_t value, size_t n, px_err *err)
{
    cuda_buffer *cb = b;
    cudaSetDevice(cb->dev->ordinal);
    cudaError_t e = cudaMemset((char *)cb->ptr + offset, value, n);
    return e ? cuda_fail(err, cb->dev, e, "fill") : PX_OK;
}

static px_status buffer_copy_from(void *b, size_t offset, const px_rt_buffer *src,
                                  size_t src_offset, size_t n, px_err *err)
{
    cuda_buffer *cb = b;
    cudaSetDevice(cb->dev->ordinal);
    cudaError_t e;
    if (src->iface == &cuda_buffer_iface) {
        const cuda_buffer *sb = src->ctx;
        e = cudaMemcpy((char *)cb->ptr + offset, (const char *)sb->ptr + src_offset, n,
                       cudaMemcpyDefault);
    } else if (src->base) {
        return buffer_set(b, offset, (const char *)src->base + src_offset, n, err);
    } else {
        /* Another device's memory that the host cannot see: through the
         * host, as the default does. */
        void *tmp = malloc(n ? n : 1);
        if (!tmp)
            return px_err_set(err, PX_ENOMEM, "%s: out of host memory", cb->dev->name);
        px_status st = px_rt_buffer_get(src, src_offset, tmp, n, err);
        if (st == PX_OK)
            st = buffer_set(b, offset, tmp, n, err);
        free(tmp);
        return st;
    }
    return e ? cuda_fail(err, cb->dev, e, "device copy") : PX_OK;
}

static const px_rt_buffer_iface cuda_buffer_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_buffer_iface),
    .free = buffer_free,
    .set = buffer_set,
    .get = buffer_get,
    .fill = buffer_fill,
    .copy_from = buffer_copy_from,
};

static px_status buffer_alloc(void *dev, size_t size, const px_rt_buffer_iface **iface, void **buf,
                              px_err *err)
{
    cuda_device *d = dev;
    cudaSetDevice(d->ordinal);
    pthread_mutex_lock(&d->lock);
    px_status st = px__rt_cuda_mem_reserve(&d->mem, d->name, size, err);
    pthread_mutex_unlock(&d->lock);
    if (st)
        return st;
    cuda_buffer *cb = calloc(1, sizeof *cb);
    void *ptr = NULL;
    cudaError_t e = cb ? cudaMalloc(&ptr, size ? size : 1) : cudaErrorMemoryAllocation;
    if (!e)
        e = cudaMemset(ptr, 0, size);
    if (e) {
        cudaFree(ptr);
        free(cb);
        pthread_mutex_lock(&d->lock);
        px__rt_cuda_mem_release(&d->mem, size);
        pthread_mutex_unlock(&d->lock);
        char what[64];
        snprintf(what, sizeof what, "allocate %zu bytes", size);
        return cuda_fail(err, d, e, what);
    }
    cb->dev = d;
    cb->ptr = ptr;
    cb->size = size;
    *iface = &cuda_buffer_iface;
    *buf = cb;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

static void drop_graphs(cuda_stream *cs)
{
    for (size_t i = 0; i < MAX_GRAPHS; i++)
        if (cs->graphs[i].used) {
            cudaGraphExecDestroy(cs->graphs[i].exec);
            cs->graphs[i].used = 0;
        }
}

static void stream_free(void *s)
{
    cuda_stream *cs = s;
    cudaSetDevice(cs->dev->ordinal);
    drop_graphs(cs);
    for (size_t i = 0; i < cs->n_events; i++)
        cudaEventDestroy(cs->events[i]);
    free(cs->events);
    cudaFree(cs->meta_dev);
    cudaFreeHost(cs->meta_host);
    if (cs->blas)
        blas.destroy(cs->blas);
    if (cs->s)
        cudaStreamDestroy(cs->s);
    free(cs);
}

/* The device address of a tensor of this device, or NULL. */
static void *dev_ptr(const cuda_stream *cs, const px_rt_tensor *t)
{
    if (!t || !t->buffer || t->buffer->iface != &cuda_buffer_iface)
        return NULL;
    const cuda_buffer *cb = t->buffer->ctx;
    return cb->dev == cs->dev ? (char *)cb->ptr + t->offset : NULL;
}

static uint64_t key_addr(const px_rt_tensor *t, void *ud)
{
    return (uint64_t)(uintptr_t)dev_ptr(ud, t);
}

/* Where a run's row layout lives on the device. */
typedef struct meta_view {
    px__cuda_rows rows;
    const uint32_t *select[64]; /* per op of the run with a selection, in order */
} meta_view;

static px_status grow_meta(cuda_stream *cs, size_t rows, size_t bt, size_t sel, px_err *err)
{
    if (rows <= cs->cap_rows && bt <= cs->cap_bt && sel <= cs->cap_sel)
        return PX_OK;
    drop_graphs(cs); /* they hold the old addresses */
    cudaFree(cs->meta_dev);
    cudaFreeHost(cs->meta_host);
    cs->meta_dev = cs->meta_host = NULL;
    cs->cap_rows = PX_MAX(rows, 2 * cs->cap_rows);
    cs->cap_bt = PX_MAX(bt, 2 * cs->cap_bt);
    cs->cap_sel = PX_MAX(sel, 2 * cs->cap_sel);
    size_t n = (2 * cs->cap_rows + cs->cap_bt + cs->cap_sel) * sizeof(int32_t);
    cudaError_t e = cudaMalloc((void **)&cs->meta_dev, n ? n : 4);
    if (!e)
        e = cudaHostAlloc((void **)&cs->meta_host, n ? n : 4, cudaHostAllocDefault);
    if (e) {
        cs->cap_rows = cs->cap_bt = cs->cap_sel = 0;
        return cuda_fail(err, cs->dev, e, "allocate the row layout");
    }
    return PX_OK;
}

/* Copies the run's row layout and selections to the device (queued on
 * the stream, before the ops). */
static px_status upload_meta(cuda_stream *cs, const px_rt_op *ops, size_t n_ops, meta_view *mv,
                             px_err *err)
{
    const px_rt_rows *rw = NULL;
    size_t n_sel = 0, n_sel_ops = 0;
    for (size_t i = 0; i < n_ops; i++) {
        if (ops[i].rows && (ops[i].kind == PX_IR_OP_ROPE || ops[i].kind == PX_IR_OP_ATTENTION)) {
            if (rw && rw != ops[i].rows)
                return px_err_set(err, PX_EINVAL,
                                  "%s: the ops of one run must share their row layout",
                                  cs->dev->name);
            rw = ops[i].rows;
        }
        if (ops[i].select) {
            if (n_sel_ops == PX_ARRAY_LEN(mv->select))
                return px_err_set(err, PX_ELIMIT, "%s: more than %zu row selections in one run",
                                  cs->dev->name, PX_ARRAY_LEN(mv->select));
            n_sel += ops[i].n_select;
            n_sel_ops++;
        }
    }
    size_t rows = rw ? rw->n_rows : 0, bt = 0;
    if (rw && rw->block_table) {
        int32_t max_slot = -1;
        for (size_t r = 0; r < rows; r++)
            max_slot = PX_MAX(max_slot, rw->slot[r]);
        bt = (size_t)(max_slot + 1) * rw->blocks_per_slot;
    }
    px_status st = grow_meta(cs, rows, bt, n_sel, err);
    if (st)
        return st;
    int32_t *h = cs->meta_host;
    int32_t *d = cs->meta_dev;
    size_t o_pos = cs->cap_rows, o_bt = 2 * cs->cap_rows, o_sel = o_bt + cs->cap_bt;
    memset(&mv->rows, 0, sizeof mv->rows);
    if (rw) {
        memcpy(h, rw->slot, rows * sizeof *h);
        memcpy(h + o_pos, rw->pos, rows * sizeof *h);
        if (bt)
            memcpy(h + o_bt, rw->block_table, bt * sizeof *h);
        mv->rows = (px__cuda_rows){.slot = d,
                                   .pos = d + o_pos,
                                   .block_table = rw->block_table ? d + o_bt : NULL,
                                   .blocks_per_slot = rw->blocks_per_slot,
                                   .n_rows = rw->n_rows};
    }
    size_t at = o_sel, k = 0;
    for (size_t i = 0; i < n_ops; i++)
        if (ops[i].select) {
            memcpy(h + at, ops[i].select, ops[i].n_select * sizeof *h);
            mv->select[k++] = (const uint32_t *)(d + at);
            at += ops[i].n_select;
        }
    size_t used = at * sizeof *h;
    cudaError_t e = used ? cudaMemcpyAsync(d, h, used, cudaMemcpyHostToDevice, cs->s) : cudaSuccess;
    return e ? cuda_fail(err, cs->dev, e, "upload the row layout") : PX_OK;
}

static px_status gemm(cuda_stream *cs, const px_rt_op *op, px__cuda_dtype t, const float *x,
                      const uint32_t *sel, float *y, px_err *err)
{
    const px_rt_tensor *w = op->src[1];
    uint32_t k = (uint32_t)w->ne[0], n_out = (uint32_t)w->ne[1], rows = px__rt_cuda_op_rows(op);
    char *work = dev_ptr(cs, op->work);
    int ce = 0;
    if (sel) {
        ce = px__cuda_gather(cs->s, x, sel, rows, k, (float *)(void *)work);
        x = (const float *)(void *)work;
        size_t g = (size_t)rows * k * sizeof(float);
        work += (g + PX__CUDA_ALLOC_ALIGN - 1) / PX__CUDA_ALLOC_ALIGN * PX__CUDA_ALLOC_ALIGN;
    }
    const float one = 1.0f, zero = 0.0f;
    const char *wd = dev_ptr(cs, w);
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    if (!ce && t == PX__CUDA_F32) {
        bs = blas.sgemm(cs->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)rows, (int)k, &one,
                        (const float *)(const void *)wd, (int)(w->nb[1] / sizeof(float)), x, (int)k,
                        &zero, y, (int)n_out);
    } else {
        uint32_t tile = px__rt_cuda_tile_rows(op);
        float *wt = (float *)(void *)work;
        for (uint32_t i0 = 0; i0 < n_out && !ce && !bs; i0 += tile) {
            uint32_t n = PX_MIN(tile, n_out - i0);
            ce = px__cuda_dequant(cs->s, t, wd, w->nb[1], k, i0, n, wt);
            if (!ce)
                bs = blas.sgemm(cs->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k, &one,
                                wt, (int)k, x, (int)k, &zero, y + i0, (int)n_out);
        }
    }
    if (bs)
        return px_err_set(err, PX_EIO, "%s (%s): %s (layer %d): cuBLAS: %s", cs->dev->name,
                          cs->dev->model, px_ir_op_kind_name(op->kind), op->layer, blas.status(bs));
    if (!ce && op->src[2])
        ce = px__cuda_add_bias(cs->s, y, dev_ptr(cs, op->src[2]), rows, n_out);
    return ce ? cuda_fail(err, cs->dev, (cudaError_t)ce, px_ir_op_kind_name(op->kind)) : PX_OK;
}

/* Queues one op (checked).  *sel_i walks the run's selections. */
static px_status enqueue(cuda_stream *cs, const px_rt_op *op, const meta_view *mv, size_t *sel_i,
                         px_err *err)
{
    const px_rt_tensor *x = op->src[0], *y = op->dst;
    void *xp = dev_ptr(cs, x), *yp = dev_ptr(cs, y);
    const uint32_t *sel = op->select ? mv->select[(*sel_i)++] : NULL;
    int ce = 0;
    switch (op->kind) {
    case PX_IR_OP_EMBEDDING: {
        px__cuda_dtype t;
        (void)px__rt_cuda_dtype(x->dtype, &t);
        ce = px__cuda_embedding(cs->s, t, xp, x->nb[1], (uint32_t)x->ne[0], dev_ptr(cs, op->src[1]),
                                (uint32_t)op->src[1]->ne[0], yp);
        break;
    }
    case PX_IR_OP_RMSNORM:
        ce = px__cuda_rmsnorm(cs->s, xp, dev_ptr(cs, op->src[1]), sel, px__rt_cuda_op_rows(op),
                              (uint32_t)x->ne[0], op->eps, yp);
        break;
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER: {
        const px_rt_tensor *w = op->src[1];
        px__cuda_dtype t;
        (void)px__rt_cuda_dtype(w->dtype, &t);
        if (px__rt_cuda_use_gemm(op))
            return gemm(cs, op, t, xp, sel, yp, err);
        ce = px__cuda_matvec(cs->s, t, dev_ptr(cs, w), w->nb[1], (uint32_t)w->ne[0],
                             (uint32_t)w->ne[1], xp, sel, px__rt_cuda_op_rows(op),
                             op->src[2] ? dev_ptr(cs, op->src[2]) : NULL, yp);
        break;
    }
    case PX_IR_OP_ROPE:
        ce = px__cuda_rope(cs->s, yp, dev_ptr(cs, op->src[1]), mv->rows.pos, op->rows->n_rows,
                           (uint32_t)y->ne[0], op->n_heads, op->head_dim, op->rope_dim,
                           op->rope_style == PX_IR_ROPE_HALVES);
        break;
    case PX_IR_OP_ATTENTION:
        ce = px__cuda_attention(cs->s, xp, dev_ptr(cs, op->src[1]), dev_ptr(cs, op->src[2]),
                                dev_ptr(cs, op->src[3]), dev_ptr(cs, op->src[4]), yp, &mv->rows,
                                (uint32_t)op->src[3]->ne[1], op->n_heads, op->n_kv_heads,
                                op->head_dim, op->window);
        break;
    case PX_IR_OP_SWIGLU:
        ce = px__cuda_swiglu(cs->s, xp, dev_ptr(cs, op->src[1]), yp, (size_t)x->ne[0] * x->ne[1]);
        break;
    case PX_IR_OP_ADD:
        ce = px__cuda_add(cs->s, xp, dev_ptr(cs, op->src[1]), yp, (size_t)x->ne[0] * x->ne[1]);
        break;
    default:
        return px_err_set(err, PX_EUNSUPPORTED, "%s: cannot run %s ops", cs->dev->name,
                          px_ir_op_kind_name(op->kind));
    }
    if (ce) {
        char what[96];
        snprintf(what, sizeof what, "%s (layer %d)", px_ir_op_kind_name(op->kind), op->layer);
        return cuda_fail(err, cs->dev, (cudaError_t)ce, what);
    }
    return PX_OK;
}

/* Every tensor of an op must be memory of this device. */
static px_status check_placement(const cuda_stream *cs, const px_rt_op *op, px_err *err)
{
    const px_rt_tensor *ts[] = {op->src[0], op->src[1], op->src[2], op->src[3],
                                op->src[4], op->dst,    op->work};
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++)
        if (ts[i] && ts[i]->buffer && !dev_ptr(cs, ts[i]))
            return px_err_set(err, PX_EINVAL,
                              "%s: %s op (layer %d): tensor %s is not in this GPU's memory",
                              cs->dev->name, px_ir_op_kind_name(op->kind), op->layer,
                              ts[i]->name ? ts[i]->name : "?");
    return PX_OK;
}

static px_status enqueue_all(cuda_stream *cs, const px_rt_op *ops, size_t n_ops,
                             const meta_view *mv, px_err *err)
{
    size_t sel_i = 0;
    for (size_t i = 0; i < n_ops; i++) {
        px_status st = enqueue(cs, &ops[i], mv, &sel_i, err);
        if (st)
            return st;
    }
    return PX_OK;
}

/* Replays the step's graph, capturing it first when it is new. */
static px_status run_graph(cuda_stream *cs, const px_rt_op *ops, size_t n_ops, const meta_view *mv,
                           px_err *err)
{
    uint64_t key =
        px__rt_cuda_ops_key(ops, n_ops, key_addr, cs) ^ (uint64_t)(uintptr_t)cs->meta_dev;
    graph_entry *g = NULL, *victim = &cs->graphs[0];
    for (size_t i = 0; i < MAX_GRAPHS; i++) {
        if (cs->graphs[i].used && cs->graphs[i].key == key)
            g = &cs->graphs[i];
        if (cs->graphs[i].used < victim->used)
            victim = &cs->graphs[i];
    }
    cudaError_t e;
    if (!g) {
        if (victim->used)
            cudaGraphExecDestroy(victim->exec);
        victim->used = 0;
        cudaGraph_t graph = NULL;
        e = cudaStreamBeginCapture(cs->s, cudaStreamCaptureModeThreadLocal);
        if (e)
            return cuda_fail(err, cs->dev, e, "capture the step");
        px_status st = enqueue_all(cs, ops, n_ops, mv, err);
        e = cudaStreamEndCapture(cs->s, &graph);
        if (st) {
            if (graph)
                cudaGraphDestroy(graph);
            return st;
        }
        if (!e)
            e = cudaGraphInstantiate(&victim->exec, graph, 0);
        if (graph)
            cudaGraphDestroy(graph);
        if (e)
            return cuda_fail(err, cs->dev, e, "capture the step");
        victim->key = key;
        g = victim;
    }
    g->used = ++cs->tick;
    e = cudaGraphLaunch(g->exec, cs->s);
    return e ? cuda_fail(err, cs->dev, e, "replay the step") : PX_OK;
}

static px_status ensure_events(cuda_stream *cs, size_t n, px_err *err)
{
    if (cs->n_events >= n)
        return PX_OK;
    cudaEvent_t *ev = realloc(cs->events, n * sizeof *ev);
    if (!ev)
        return px_err_set(err, PX_ENOMEM, "%s: out of host memory", cs->dev->name);
    cs->events = ev;
    for (; cs->n_events < n; cs->n_events++) {
        cudaError_t e = cudaEventCreate(&cs->events[cs->n_events]);
        if (e)
            return cuda_fail(err, cs->dev, e, "create timing events");
    }
    return PX_OK;
}

static px_status stream_run(void *s, const px_rt_op *ops, size_t n_ops, px_rt_op_timing *timing,
                            px_err *err)
{
    cuda_stream *cs = s;
    cudaSetDevice(cs->dev->ordinal);
    bool graphable = cs->use_graphs && !timing && n_ops > 1;
    for (size_t i = 0; i < n_ops; i++) {
        px_status st = px__rt_cuda_check_op(cs->dev->name, &ops[i], err);
        if (st == PX_OK)
            st = check_placement(cs, &ops[i], err);
        if (st)
            return st;
        graphable &= !px__rt_cuda_use_gemm(&ops[i]);
    }
    meta_view mv;
    px_status st = upload_meta(cs, ops, n_ops, &mv, err);
    if (st)
        return st;
    if (graphable) {
        st = run_graph(cs, ops, n_ops, &mv, err);
    } else if (timing) {
        if ((st = ensure_events(cs, 2 * n_ops, err)) != PX_OK)
            return st;
        size_t sel_i = 0;
        for (size_t i = 0; i < n_ops && !st; i++) {
            cudaEventRecord(cs->events[2 * i], cs->s);
            st = enqueue(cs, &ops[i], &mv, &sel_i, err);
            cudaEventRecord(cs->events[2 * i + 1], cs->s);
        }
    } else {
        st = enqueue_all(cs, ops, n_ops, &mv, err);
    }
    cudaError_t e = cudaStreamSynchronize(cs->s);
    if (st)
        return st;
    if (e)
        return cuda_fail(err, cs->dev, e, "run the step");
    for (size_t i = 0; timing && i < n_ops; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, cs->events[2 * i], cs->events[2 * i + 1]) == cudaSuccess)
            timing[i].ns = PX_MAX((uint64_t)((double)ms * 1e6), 1);
    }
    return PX_OK;
}

static px_status stream_synchronize(void *s, px_err *err)
{
    cuda_stream *cs = s;
    cudaError_t e = cudaStreamSynchronize(cs->s);
    return e ? cuda_fail(err, cs->dev, e, "synchronize") : PX_OK;
}

static const px_rt_stream_iface cuda_stream_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_stream_iface),
    .free = stream_free,
    .run = stream_run,
    .synchronize = stream_synchronize,
};

static px_status stream_new(void *dev, const px_rt_stream_iface **iface, void **stream, px_err *err)
{
    cuda_device *d = dev;
    cudaSetDevice(d->ordinal);
    cuda_stream *cs = calloc(1, sizeof *cs);
    if (!cs)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", d->name);
    cs->dev = d;
    const char *g = getenv("PLEXUS_CUDA_GRAPHS");
    cs->use_graphs = !(g && !strcmp(g, "0"));
    cudaError_t e = cudaStreamCreateWithFlags(&cs->s, cudaStreamNonBlocking);
    if (e) {
        free(cs);
        return cuda_fail(err, d, e, "create a stream");
    }
    pthread_once(&blas_once, blas_load);
    if (!blas.create) {
        stream_free(cs);
        return px_err_set(err, PX_EUNSUPPORTED, "%s (%s): %s; install cuBLAS %d", d->name, d->model,
                          blas.error, CUBLAS_VER_MAJOR);
    }
    cublasStatus_t bs = blas.create(&cs->blas);
    if (!bs)
        bs = blas.set_stream(cs->blas, cs->s);
    if (!bs)
        bs = blas.set_math_mode(cs->blas, CUBLAS_PEDANTIC_MATH); /* f32, no TF32 */
    if (bs) {
        stream_free(cs);
        return px_err_set(err, PX_EIO, "%s (%s): cuBLAS: %s", d->name, d->model, blas.status(bs));
    }
    *iface = &cuda_stream_iface;
    *stream = cs;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

static void device_free(void *dev)
{
    cuda_device *d = dev;
    cudaSetDevice(d->ordinal);
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(d->stage[i]);
        if (d->stage_done[i])
            cudaEventDestroy(d->stage_done[i]);
    }
    if (d->xfer)
        cudaStreamDestroy(d->xfer);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void device_props(void *dev, px_rt_device_props *out)
{
    cuda_device *d = dev;
    px_strlcpy(out->name, d->name, sizeof out->name);
    snprintf(out->description, sizeof out->description, "%s: %.60s, sm_%d%d, %d SMs, %.1f GiB",
             d->name, d->model, d->cc_major, d->cc_minor, d->sms,
             (double)d->total / (double)(1ull << 30));
    out->kind = PX_RT_DEVICE_GPU;
    out->memory_total = d->total;
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(d->ordinal);
    out->memory_free = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? free_b : 0;
    pthread_mutex_lock(&d->lock);
    out->memory_used = d->mem.used;
    out->memory_peak = d->mem.peak;
    pthread_mutex_unlock(&d->lock);
    out->caps = PX_RT_CAP_OP_TIMING;
    out->emulated = false;
}

static bool device_supports_op(void *dev, px_ir_op_kind op, px_dtype dtype)
{
    (void)dev;
    return px__rt_cuda_supports(op, dtype);
}

static size_t device_work_size(void *dev, const px_rt_op *op)
{
    (void)dev;
    return px__rt_cuda_work_size(op);
}

static const px_rt_device_iface cuda_device_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_device_iface),
    .free = device_free,
    .props = device_props,
    .supports_op = device_supports_op,
    .buffer_alloc = buffer_alloc,
    .stream_new = stream_new,
    .work_size = device_work_size,
};

static px_status device_open(const px_rt_device_opts *opts, const px_rt_device_iface **iface,
                             void **dev, px_err *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e || count <= 0 || opts->ordinal >= (uint32_t)count)
        return px__rt_cuda_refuse(err, opts->ordinal, e ? 0 : count, (int)e,
                                  e ? cudaGetErrorString(e) : NULL);
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, (int)opts->ordinal);
    if (e)
        return px__rt_cuda_refuse(err, opts->ordinal, 0, (int)e, cudaGetErrorString(e));
    cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return px_err_set(err, PX_ENOMEM, "cuda: out of memory");
    pthread_mutex_init(&d->lock, NULL);
    d->ordinal = (int)opts->ordinal;
    snprintf(d->name, sizeof d->name, "cuda:%u", opts->ordinal);
    px_strlcpy(d->model, p.name, sizeof d->model);
    d->cc_major = p.major;
    d->cc_minor = p.minor;
    d->sms = p.multiProcessorCount;
    d->total = p.totalGlobalMem;
    d->mem.total = p.totalGlobalMem;
    d->mem.limit = opts->memory_limit;
    e = cudaSetDevice(d->ordinal);
    if (!e)
        e = cudaStreamCreateWithFlags(&d->xfer, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && !e; i++) {
        e = cudaHostAlloc(&d->stage[i], STAGE_BYTES, cudaHostAllocDefault);
        if (!e)
            e = cudaEventCreateWithFlags(&d->stage_done[i], cudaEventDisableTiming);
    }
    if (e) {
        px_status st = cuda_fail(err, d, e, "set up the device");
        device_free(d);
        return st;
    }
    *iface = &cuda_device_iface;
    *dev = d;
    return PX_OK;
}

bool px_rt_cuda_built(void)
{
    return true;
}

px_status px_rt_cuda_query(uint32_t ordinal, px_rt_cuda_info *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e || count <= 0 || ordinal >= (uint32_t)count)
        return px__rt_cuda_refuse(err, ordinal, e ? 0 : count, (int)e,
                                  e ? cudaGetErrorString(e) : NULL);
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, (int)ordinal)) != cudaSuccess)
        return px__rt_cuda_refuse(err, ordinal, 0, (int)e, cudaGetErrorString(e));
    px_strlcpy(out->name, p.name, sizeof out->name);
    snprintf(out->capability, sizeof out->capability, "%d.%d", p.major, p.minor);
    out->memory_total = (double)p.totalGlobalMem;
    int khz = 0;
    out->clock_max_sm =
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, (int)ordinal) ? NAN : khz * 1e3;
    out->multiprocessors = p.multiProcessorCount;
    return PX_OK;
}

#else /* no nvcc at configure time */

static px_status device_open(const px_rt_device_opts *opts, const px_rt_device_iface **iface,
                             void **dev, px_err *err)
{
    (void)iface;
    (void)dev;
    return px__rt_cuda_refuse(err, opts->ordinal, -1, 0, NULL);
}

bool px_rt_cuda_built(void)
{
    return false;
}

px_status px_rt_cuda_query(uint32_t ordinal, px_rt_cuda_info *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    return px__rt_cuda_refuse(err, ordinal, -1, 0, NULL);
}

#endif

const px_rt_backend_iface px__rt_cuda_backend = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_backend_iface),
    .name = "cuda",
    .description = "NVIDIA GPUs: CUDA runtime, cuBLAS, own kernels",
    .device_open = device_open,
};
