/*
 * The cuda backend's private declarations, shared by its host side
 * (cuda_host.c: checks, sizes, memory accounting, the messages, built with
 * or without CUDA; cuda_backend.c: devices, buffers, streams, cuBLAS,
 * graphs) and its kernels (cuda_kernels.cu, compiled by nvcc as C++).
 * Only plain C types cross between them.
 *
 * Weights keep the cpu's byte layouts (ggml's blocks, quant.c), uploaded
 * once as stored.  Activations are f32, row-major, as on the cpu.  The
 * KV cache is f32 in the same fixed-size blocks as the cpu's.
 */
#ifndef PX_RT_CUDA_IMPL_H
#define PX_RT_CUDA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Weight formats as the kernels know them. */
typedef enum px__cuda_dtype {
    PX__CUDA_F32 = 0,
    PX__CUDA_F16,
    PX__CUDA_BF16,
    PX__CUDA_Q8_0,
    PX__CUDA_Q4_0,
    PX__CUDA_Q5_0,
    PX__CUDA_Q2_K,
    PX__CUDA_Q3_K,
    PX__CUDA_Q4_K,
    PX__CUDA_Q5_K,
    PX__CUDA_Q6_K,
    PX__CUDA_N_DTYPES
} px__cuda_dtype;

/* Activation rows up to which a matrix product runs the own
 * matrix-vector kernel (weights read once for all rows); above, the
 * weights are converted to f32 in tiles and cuBLAS multiplies. */
#define PX__CUDA_MV_MAX_ROWS 8u
/* Bytes of one f32 weight tile of the cuBLAS path. */
#define PX__CUDA_TILE_BYTES (64u << 20)
/* Attention: threads per (row, head) (a warp per share of the
 * positions) and the largest head. */
#define PX__CUDA_ATT_THREADS  512u
#define PX__CUDA_MAX_HEAD_DIM 512u
/* Device allocations are rounded up to this many bytes (cudaMalloc's
 * alignment) in the accounting. */
#define PX__CUDA_ALLOC_ALIGN 256u

#ifdef __cplusplus
extern "C" {
#endif

/* The row layout of a step, in device memory. */
typedef struct px__cuda_rows {
    const int32_t *slot, *pos;
    const int32_t *block_table; /* NULL: slot s owns block s */
    uint32_t blocks_per_slot;
    uint32_t n_rows;
} px__cuda_rows;

/* Kernel launchers (cuda_kernels.cu).  `stream` is a cudaStream_t; each
 * returns the launch's cudaError_t (0: queued). */
int px__cuda_embedding(void *stream, px__cuda_dtype t, const void *tab, size_t row_bytes,
                       uint32_t dim, const int32_t *ids, uint32_t rows, float *y);
int px__cuda_rmsnorm(void *stream, const float *x, const float *w, const uint32_t *select,
                     uint32_t rows, uint32_t n, float eps, float *y);
/* y[r*n_out + i] = dot(row i of w, x row (select ? select[r] : r)) (+
 * bias[i]) for r < n_x <= PX__CUDA_MV_MAX_ROWS. */
int px__cuda_matvec(void *stream, px__cuda_dtype t, const void *w, size_t row_bytes, uint32_t k,
                    uint32_t n_out, const float *x, const uint32_t *select, uint32_t n_x,
                    const float *bias, float *y);
/* dst[i*k + j] = value j of weight row (row0 + i), i < n. */
int px__cuda_dequant(void *stream, px__cuda_dtype t, const void *w, size_t row_bytes, uint32_t k,
                     uint32_t row0, uint32_t n, float *dst);
/* dst[r*k + j] = x[select[r]*k + j], r < n. */
int px__cuda_gather(void *stream, const float *x, const uint32_t *select, uint32_t n, uint32_t k,
                    float *dst);
/* y[r*n + i] += b[i]. */
int px__cuda_add_bias(void *stream, float *y, const float *b, uint32_t rows, uint32_t n);
int px__cuda_rope(void *stream, float *x, const float *tab, const int32_t *pos, uint32_t rows,
                  uint32_t width, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                  bool halves);
/* Stores k and v rows at their (slot, pos) of the caches, then attends. */
int px__cuda_attention(void *stream, const float *q, const float *k, const float *v, float *kc,
                       float *vc, float *out, const px__cuda_rows *rows, uint32_t block,
                       uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t window);
int px__cuda_swiglu(void *stream, const float *a, const float *b, float *y, size_t n);
int px__cuda_add(void *stream, const float *a, const float *b, float *y, size_t n);

#ifdef __cplusplus
}

#else /* the host side, C only */

#include "base/common.h"

#include "plexus/rt.h"

/* The kernels' code for a weight dtype; false when there is none. */
bool px__rt_cuda_dtype(px_dtype t, px__cuda_dtype *out);
/* Whether the cuda kernels run op with weights (or main input) of t. */
bool px__rt_cuda_supports(px_ir_op_kind op, px_dtype t);
/* Rows a matrix product or norm reads (its selection, or all). */
uint32_t px__rt_cuda_op_rows(const px_rt_op *op);
/* Whether a matrix product goes to cuBLAS (more than
 * PX__CUDA_MV_MAX_ROWS rows). */
bool px__rt_cuda_use_gemm(const px_rt_op *op);
/* Weight rows per f32 tile of the cuBLAS path (at least 1, at most the
 * weight's rows). */
uint32_t px__rt_cuda_tile_rows(const px_rt_op *op);
/* Scratch bytes op needs: the gathered rows and the f32 weight tile of the
 * cuBLAS path, 0 otherwise. */
size_t px__rt_cuda_work_size(const px_rt_op *op);
/* Checks an op's shapes, parameters and row layout (host memory) before
 * anything is queued.  Errors: PX_EUNSUPPORTED, PX_EINVAL naming the op,
 * its layer and what disagrees. */
px_status px__rt_cuda_check_op(const char *dev, const px_rt_op *op, px_err *err);

/* Memory accounting of one device: what its buffers hold. */
typedef struct px__rt_cuda_mem {
    uint64_t total; /* the GPU's memory */
    uint64_t limit; /* most this device may hold; 0: total */
    uint64_t used;  /* rounded bytes of live buffers */
    uint64_t peak;
    uint64_t n_buffers;
} px__rt_cuda_mem;

/* n rounded up to PX__CUDA_ALLOC_ALIGN (saturating). */
uint64_t px__rt_cuda_mem_round(uint64_t n);
/* Accounts n more bytes, or PX_ENOMEM naming the device, the request and
 * the figures (in use, limit) when they would pass the limit. */
px_status px__rt_cuda_mem_reserve(px__rt_cuda_mem *m, const char *dev, uint64_t n, px_err *err);
void px__rt_cuda_mem_release(px__rt_cuda_mem *m, uint64_t n);

/* The error for a cuda device that cannot be opened: no GPU (count 0 or a
 * CUDA error `cuda_error`, its text `cuda_text`), an ordinal past the
 * count, or a build without the backend (count < 0).  Names the device
 * and says what to do. */
px_status px__rt_cuda_refuse(px_err *err, uint32_t ordinal, int count, int cuda_error,
                             const char *cuda_text);

/* A key of everything a captured step bakes in: the ops, their tensors'
 * device addresses (addr(t)), shapes, parameters and row count.  Steps
 * with equal keys replay the same graph. */
uint64_t px__rt_cuda_ops_key(const px_rt_op *ops, size_t n,
                             uint64_t (*addr)(const px_rt_tensor *t, void *ud), void *ud);

#endif

#endif
