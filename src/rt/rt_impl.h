/*
 * Private declarations shared by the files of the runtime module: the
 * objects behind the backend wrappers, the cpu backend's thread pool and
 * kernels, and the model's resolved weights.
 */
#ifndef PX_RT_IMPL_H
#define PX_RT_IMPL_H

#include "base/common.h"

#include <pthread.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

/* Whether a versioned table has a (non-NULL) slot: the slot must lie
 * within the size the backend declared. */
#define PX__RT_HAS(tbl, type, field) \
    ((tbl)->size >= offsetof(type, field) + sizeof((tbl)->field) && (tbl)->field != NULL)

/* ------------------------------------------------------------------ */
/* Objects behind the wrappers (backend.c)                             */
/* ------------------------------------------------------------------ */

struct px_rt_device {
    const px_rt_backend_iface *backend;
    const px_rt_device_iface *iface;
    void *ctx;
    uint32_t caps; /* props' caps, read once at open */
};

struct px_rt_buffer {
    const px_rt_buffer_iface *iface;
    void *ctx;
    px_rt_device *device;
    size_t size;
    void *base; /* cached iface->base(), NULL when not host-visible */
};

struct px_rt_stream {
    const px_rt_stream_iface *iface;
    void *ctx;
    px_rt_device *device;
    px_rt_telemetry_fn telemetry;
    void *telemetry_ud;
    px_rt_fault_hook fault_hook;
    void *fault_ud;
};

/* The built-in cpu backend's table (cpu_backend.c). */
extern const px_rt_backend_iface px__rt_cpu_backend;
/* The built-in cuda backend's table (cuda_backend.c; without nvcc its
 * devices refuse to open, saying why). */
extern const px_rt_backend_iface px__rt_cuda_backend;
/* The GPU ordinal of an inventory device id: N of a trailing "gpuN"
 * ("n1.gpu3" is 3), else 0 (cuda_host.c). */
uint32_t px__rt_cuda_ordinal(const char *device);

/* ------------------------------------------------------------------ */
/* Thread pool (cpu_pool.c)                                            */
/* ------------------------------------------------------------------ */

/* Persistent workers.  px__rt_pool_run calls fn(arg, part, n_parts,
 * thread) once for every part in [0, n_parts), on whichever thread claims
 * it first (the caller is thread 0, workers 1 .. size - 1), and returns
 * when all are done: a barrier per call, no allocation.  A part's result
 * must not depend on the thread that runs it; `thread` is for scratch
 * space only.  Workers spin briefly, then sleep. */
typedef struct px__rt_pool px__rt_pool;
typedef void (*px__rt_pool_fn)(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread);

px_status px__rt_pool_new(uint32_t n_threads, px__rt_pool **out, px_err *err);
void px__rt_pool_free(px__rt_pool *p);
uint32_t px__rt_pool_size(const px__rt_pool *p);
void px__rt_pool_run(px__rt_pool *p, px__rt_pool_fn fn, void *arg, uint32_t n_parts);

/* Static partition of n items into nth parts: part ith gets
 * [*begin, *end).  Depends only on (n, nth, ith). */
static inline void px__rt_split(size_t n, uint32_t ith, uint32_t nth, size_t *begin, size_t *end)
{
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

/* ------------------------------------------------------------------ */
/* Kernels (cpu_kernels.c, cpu_kernels_x86.c)                          */
/* ------------------------------------------------------------------ */

/* Kernels that have a vectorised variant.  Every variant computes each
 * output with one fixed order of operations, whatever the row range, the
 * number of x rows beside it or the thread: splitting rows among threads
 * and batching rows never changes a result.
 *
 * The order per dtype (docs/adr/0010-batch-invariant-kernels.md):
 * - f32, f16, bf16: sixteen partial sums, lane j % 16 taking the fused
 *   multiply-add of value j (j < k rounded down to 8), reduced as
 *   hsum8(lane l + lane l+8), then the remaining values added in turn.
 *   The avx2 and avx512 variants share it; the portable variant keeps
 *   eight partial sums without fusing (processors without FMA).
 * - q8_0: the activations are quantized to 32-value blocks first
 *   (px__rt_quantize_q8_act); per block, the exact int32 sums of four
 *   int8 products each (8 lanes), scaled by (weight scale * activation
 *   scale) and added, not fused, into partial sum (block % 2) * 8 + lane;
 *   reduced like f32.  Every variant gives the same bits. */
typedef struct px__rt_kernels {
    const char *name; /* "avx512", "avx2" or "portable" */
    /* y[r*ldy + i] = dot(row i of w, x + r*ldx) for i in [i0, i1) and
     * r < n_x (any number).  Rows are row_bytes apart and k values long,
     * of dtype t (f32, f16, bf16). */
    void (*matmul)(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                   uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy);
    /* The same for q8_0 weights (k a multiple of 32) and activations
     * quantized by px__rt_quantize_q8_act: row r's values at xq + r*k,
     * its block scales at xd + r*(k/32). */
    void (*matmul_q8_0)(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                        const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy);
    /* px__rt_quantize_q8_act: k activations (a multiple of 32) as the
     * q8_0 products take them, byte for byte the portable function's. */
    void (*quant_q8_0)(const float *x, uint32_t k, int8_t *q, float *d);
    /* The same for weights of a block format (px__rt_quant_handles) and
     * activation rows quantized for it by px__rt_quant_act over all k
     * values, row r at xq + r*ldxq (px__rt_quant_gemm). */
    void (*matmul_quant)(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy);
    /* (NULL where the variant has none) matmul_quant for a Q4_K matrix in
     * PX_RT_LAYOUT_Q4_K_X16, rows [i0, i1) in whole groups of sixteen, bit for bit its
     * products of the rows as stored (px__rt_quant_gemm_x16_x512). */
    void (*matmul_q4_k16)(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                          const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y, size_t ldy);
    /* px__rt_quant_act: the activation blocks of n values for weights of
     * dtype t, byte for byte the portable function's. */
    void (*quant_act)(px_dtype t, const float *x, uint8_t *out, uint32_t n);
    /* Converts k values of a row of dtype t to f32. */
    void (*dequant)(px_dtype t, const void *row, float *dst, uint32_t k);
    float (*dot_f32)(const float *a, const float *b, uint32_t n);
    /* y += a * x */
    void (*axpy_f32)(float a, const float *x, float *y, uint32_t n);
    /* Attention over cached rows, row p of n at base + rows[p] * stride
     * (hd values each), one call per query head instead of one per
     * position.  Scores: out[p] = dot_f32(q, row p) * scale, each in
     * dot_f32's order. */
    void (*attn_scores)(const float *q, const float *base, size_t stride, const uint32_t *rows,
                        size_t n, uint32_t hd, float scale, float *out);
    /* Values: out[0..hd) += w[p] * row p for p = 0, 1, ... n-1 in turn
     * (axpy_f32's order). */
    void (*attn_values)(const float *w, const float *base, size_t stride, const uint32_t *rows,
                        size_t n, uint32_t hd, float *out);
    /* x[p] = exp(x[p] - max) for p < n (x[p] <= max), and their sum: the
     * same operations, unfused, in every variant (px__rt_exp_sum_ref), so
     * the bits do not depend on the processor. */
    float (*exp_sum)(float *x, size_t n, float max);
    /* Attention for n_q query heads that share a KV head (q holds them hd
     * values apart), in one pass over the cached rows: each K and V row is
     * read once for the heads.  Scores: out[g * ld + p] is attn_scores'
     * out[p] for head g, the same bits. */
    void (*attn_scores_group)(const float *q, uint32_t n_q, const float *base, size_t stride,
                              const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out,
                              size_t ld);
    /* Values: out[g * hd + i] for head g, the weights of row p at
     * w[g * ld + p]: the bits attn_values leaves in a zeroed out (the
     * products added in turn from 0), without the stores between rows. */
    void (*attn_values_group)(const float *w, size_t ld, uint32_t n_q, const float *base,
                              size_t stride, const uint32_t *rows, size_t n, uint32_t hd,
                              float *out);
} px__rt_kernels;

/* The portable exp_sum: exp by range reduction to [-ln2/2, ln2/2] and a
 * degree-5 polynomial (Cephes' expf, about 1 ulp), arguments below -87
 * taken as -87; the sum in 8 lanes (value p into lane p % 8 for the
 * multiples of 8), reduced pairwise, then the rest added in turn. */
float px__rt_exp_sum_ref(float *x, size_t n, float max);

/* Weight rows per tile of a product of n_x activation rows: more than
 * PX_RT_SMALL_BATCH rows run in tiles of about 128 KiB of weights, which
 * stay in the second-level cache while every group of activation rows
 * passes over them, so the weights come from memory once per product,
 * not once per group.  Speed only: each output is the same row kernel's
 * whatever the tile. */
static inline uint32_t px__rt_tile_rows(size_t row_bytes, uint32_t n_x)
{
    if (n_x <= PX_RT_SMALL_BATCH)
        return UINT32_MAX;
    return (uint32_t)PX_MAX(((size_t)128 << 10) / PX_MAX(row_bytes, 1), 4);
}

extern const px__rt_kernels px__rt_kernels_portable;
/* The AVX2+FMA+F16C variant, or NULL when the build or the processor
 * lacks it. */
const px__rt_kernels *px__rt_kernels_avx2(void);
/* The AVX-512 (F, BW, DQ, VL, VNNI) variant, or NULL when the build or
 * the processor lacks it.  Its results equal the avx2 variant's. */
const px__rt_kernels *px__rt_kernels_avx512(void);
/* The fastest variant this processor runs: avx512, avx2 or portable. */
const px__rt_kernels *px__rt_kernels_native(void);

/* Quantizes k activations (k a multiple of 32) to q8_0 blocks for
 * matmul_q8_0: per block of 32, d = max|x| / 127 and q = x * (127 /
 * max|x|) rounded to nearest even (0 for a zero block; a block holding a
 * NaN gets d = NaN, so that the products stay NaN).  Runs the native
 * kernels' variant (px__rt_kernels_native()->quant_q8_0); every variant
 * writes the bytes of px__rt_quantize_q8_act_ref.  Thread-safe. */
void px__rt_quantize_q8_act(const float *x, uint32_t k, int8_t *q, float *d);
/* The portable scalar code that defines px__rt_quantize_q8_act's bytes. */
void px__rt_quantize_q8_act_ref(const float *x, uint32_t k, int8_t *q, float *d);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Its AVX2 and AVX-512 variants (cpu_quant_x86.c, cpu_quant_avx512.c),
 * callable where px__rt_kernels_avx2() (px__rt_kernels_avx512()) is not
 * NULL. */
void px__rt_quantize_q8_act_x86(const float *x, uint32_t k, int8_t *q, float *d);
void px__rt_quantize_q8_act_x512(const float *x, uint32_t k, int8_t *q, float *d);
#endif

/* The portable q8_0 dot product: the definition the vectorised ones
 * reproduce bit for bit. */
float px__rt_dot_q8_0(const uint8_t *w, const int8_t *xq, const float *xd, uint32_t k);

/* ------------------------------------------------------------------ */
/* The cpu backend's ops (cpu_ops.c), reusable by backends that run    */
/* the cpu kernels (an emulated device)                                */
/* ------------------------------------------------------------------ */

typedef struct px__rt_cpu_exec {
    px__rt_pool *pool;
    const px__rt_kernels *k;
} px__rt_cpu_exec;

/* Work (values touched, roughly) below which an op runs on the calling
 * thread alone: smaller ops cost less than waking the pool.  Which thread
 * computes an output never changes it, so this only affects speed. */
#define PX__RT_PAR_MIN_WORK 16384u

/* Weight rows of a matrix product are shared among threads in units of
 * this many, a multiple of every kernel's tile, so that no thread runs a
 * partial tile that a whole one could cover.  Speed only: results do not
 * depend on it. */
#define PX__RT_ROW_UNIT 12u
/* The unit of matrices in PX_RT_LAYOUT_Q4_K_X16: whole groups of sixteen rows. */
#define PX__RT_ROW_UNIT_X16 48u
/* Most parts per thread an op is cut into: threads claim parts as they
 * come, so that one the system runs late (a busy machine) leaves its
 * share to the others.  Speed only. */
#define PX__RT_PARTS_PER_THREAD 4u
/* Least weight bytes (times activation rows) a part of a matrix product
 * covers, beyond one part per thread.  Each part costs a claim and a done
 * count on lines both threads write, and starts a new stream from
 * memory: a 256 x 1024 Q4_K product (147 KB) cut into 8 parts took longer
 * on two threads than on one.  Speed only. */
#define PX__RT_PART_MIN_BYTES ((size_t)128 << 10)
/* Most products px__rt_cpu_run_products runs as one group. */
#define PX__RT_MAX_PRODUCTS 4u

/* The parts a matrix product (or a group of them) of `units` row units,
 * reading `bytes` of weights times activation rows, is cut into on nth
 * threads: one per thread at least, one per PX__RT_PART_MIN_BYTES beyond
 * that, PX__RT_PARTS_PER_THREAD per thread at most, no more than units. */
static inline uint32_t px__rt_matmul_parts(size_t units, size_t bytes, uint32_t nth)
{
    size_t parts = bytes / PX__RT_PART_MIN_BYTES;
    parts = parts > nth ? parts : nth;
    if (parts > (size_t)nth * PX__RT_PARTS_PER_THREAD)
        parts = (size_t)nth * PX__RT_PARTS_PER_THREAD;
    return (uint32_t)(parts < units ? parts : units);
}

/* Whether the cpu kernels run op with weights (or main input) of dtype t. */
bool px__rt_cpu_supports(px_ir_op_kind op, px_dtype t);
/* Scratch bytes op needs with n_threads threads. */
size_t px__rt_cpu_work_size(uint32_t n_threads, const px_rt_op *op);
/* What a device that runs the cpu kernels on host threads holds first
 * (the cpu device, and the emulated one, whose struct begins with it):
 * the threads of its streams' pools and the kernels they run. */
typedef struct px__rt_host_device {
    uint32_t n_threads;
    const px__rt_kernels *kernels;
} px__rt_host_device;
/* Fills h from opts for the backend called `name`: opts->n_threads (0:
 * the online processors, at most 256) and the native kernels unless
 * opts->portable_kernels asks for the portable ones.  Errors: PX_EINVAL
 * (more than 1024 threads), naming the backend. */
PX_NODISCARD px_status px__rt_host_device_init(px__rt_host_device *h, const char *name,
                                               const px_rt_device_opts *opts, px_err *err);
/* A device table's supports_op and work_size, for any device whose struct
 * begins with a px__rt_host_device. */
bool px__rt_host_supports_op(void *dev, px_ir_op_kind op, px_dtype dtype);
size_t px__rt_host_work_size(void *dev, const px_rt_op *op);
/* Checks op's shapes and runs it; host-visible tensors only.  Errors:
 * PX_EUNSUPPORTED, PX_EINVAL (shapes, ids, positions, naming them). */
px_status px__rt_cpu_run_op(const px__rt_cpu_exec *x, const px_rt_op *op, px_err *err);
/* How many of the first ops (at most n_ops and PX__RT_MAX_PRODUCTS; 1
 * when the first is no plain product) are matrix products that can run
 * as one group: MATMUL ops of the same input tensor and work buffer,
 * without a selection, whose weights take their activation rows in the
 * same form, and whose outputs overlap neither that input nor each other
 * (a layer's q, k and v; its gate and up).  0 when n_ops is 0. */
size_t px__rt_cpu_products(const px_rt_op *ops, size_t n_ops);
/* Checks and runs the n_ops products (px__rt_cpu_products' count, at
 * least 1) as one group: their activation rows prepared once, their
 * weight rows shared among the threads in one pool call.  The outputs are
 * those of px__rt_cpu_run_op on each op in turn, bit for bit.  Errors:
 * those of px__rt_cpu_run_op, for the first op that fails its checks
 * (then none has run). */
px_status px__rt_cpu_run_products(const px__rt_cpu_exec *x, const px_rt_op *ops, size_t n_ops,
                                  px_err *err);

/* Whether the runtime has kernels for weights of dtype t. */
bool px__rt_dtype_supported(px_dtype t);
/* Converts k values of a row of dtype t to f32. */
void px__rt_dequant_row(px_dtype t, const void *row, float *dst, uint32_t k);
/* One value of a row of dtype t (the reference pass reads weights so). */
double px__rt_weight_at(px_dtype t, const void *row, uint32_t i);

/* IEEE half to float without the ir module's table (exact). */
static inline float px__rt_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            /* Subnormal: normalise. */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float px__rt_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Q8_0: 32 values in 34 bytes, an f16 scale then 32 int8. */
#define PX__RT_Q8_0_ELEMS 32u
#define PX__RT_Q8_0_BYTES 34u

/* Puts the sampler back to where it was after n samples from its seed
 * (every sample at a temperature draws one number): a rollback samples
 * the tokens it took back again, the same way (sampler.c). */
void px__rt_sampler_rewind(px_rt_sampler *s, uint32_t n);

/* ------------------------------------------------------------------ */
/* Models (model.c)                                                    */
/* ------------------------------------------------------------------ */

typedef struct px__rt_layer_weights {
    const px_ir_tensor *attn_norm, *wq, *wk, *wv, *wo;
    const px_ir_tensor *bq, *bk, *bv; /* NULL unless qkv_bias */
    const px_ir_tensor *ffn_norm, *w1, *w2, *w3;
} px__rt_layer_weights;

/* A matrix of the model's weights in a layout other than its rows (px_rt_weights_repack). */
typedef struct px__rt_repacked {
    const px_ir_tensor *src;
    px_rt_layout layout;
    void *data; /* in one of the cache's chunks */
} px__rt_repacked;

/* The repacked matrices a model keeps for all its sessions: each made once, by the first
 * session whose device asks for it, and kept until the model is freed, in chunks of memory
 * taken as they fill (model.c). */
typedef struct px__rt_repack_cache {
    pthread_mutex_t lock;
    px__rt_repacked *items;
    size_t n, cap;
    uint8_t **chunks; /* owned */
    size_t n_chunks, cap_chunks;
    size_t size, used; /* of the last chunk */
} px__rt_repack_cache;

struct px_rt_model {
    const px_ir_model *ir;
    px_ir_model *owned_ir; /* set when the model opened the file */
    px_ir_hparams hp;
    uint32_t q_dim, kv_dim; /* n_heads*head_dim, n_kv_heads*head_dim */
    const px_ir_tensor *tok_embd, *output_norm, *output;
    px__rt_layer_weights *layers; /* n_layers */
    px__rt_repack_cache *repacked;
};

/* The bytes of the matrix src (a weight of m) in layout, repacked on the first call for them
 * (any thread).  Errors: PX_ENOMEM, px_rt_weights_repack's (naming src). */
PX_NODISCARD px_status px__rt_model_repacked(const px_rt_model *m, const px_ir_tensor *src,
                                             px_rt_layout layout, const void **out, px_err *err);

/* ------------------------------------------------------------------ */
/* Sessions (session.c, forward.c)                                     */
/* ------------------------------------------------------------------ */

typedef struct px__rt_layer_state {
    px_rt_tensor attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;
    px_rt_tensor bq, bk, bv;       /* dtype F32 and buffer NULL when absent */
    px_rt_tensor k_cache, v_cache; /* [kv_dim, kv_block_size, kv_blocks] */
} px__rt_layer_state;

struct px_rt_session {
    const px_rt_model *model;
    px_rt_device *device;
    bool own_device;
    px_rt_stream *stream;
    uint32_t layer_begin, layer_end;
    uint32_t context, max_seqs, max_rows, max_logit_rows;
    bool has_embedding, has_head;
    bool weights_copied;
    uint64_t weight_bytes;
    uint32_t weights_repacked;
    uint64_t repacked_bytes;

    /* Weights: one buffer per distinct stored tensor. */
    px_rt_buffer **weight_bufs;
    const px_ir_tensor **weight_src; /* the stored tensor of each buffer */
    px_rt_layout *weight_layout;     /* and the layout it holds it in */
    size_t n_weight_bufs;
    px_rt_tensor tok_embd, output_norm, output;
    px__rt_layer_state *layers; /* layer_end - layer_begin */

    /* Activations, sized for max_rows rows (the head: max_logit_rows). */
    px_rt_buffer *act_buf, *kv_buf;
    px_rt_tensor x, xb, xb2, q, k, v, att, hb, hb2, xn, logits, ids, rope, work;
    bool has_work;

    /* Host memory for the step's layout and outputs. */
    int32_t *row_slot, *row_pos;
    uint32_t *select;
    px_rt_rows rows;
    float *out_host;   /* outputs copied here when buffers are not host-visible */
    int64_t *seq_len;  /* per slot; -1 when free */
    uint8_t *seq_mark; /* per slot; duplicate detection within a step */

    /* The paged KV cache: block_table[slot * blocks_per_slot + i] is the
     * block holding the slot's positions [i * kv_block_size, ...), or -1;
     * free_blocks[0..n_free) the blocks nobody holds (a stack). */
    uint32_t kv_block_size, kv_blocks, blocks_per_slot;
    int32_t *block_table;
    int32_t *free_blocks;
    uint32_t n_free;
    px_rt_op *ops;
    size_t ops_cap;
};

/* Builds the ops of a step of `rows` rows over layers [lb, le), with the
 * head when n_logits > 0 (selecting `select` rows when set), into s->ops.
 * Returns the number of ops.  Sets the row counts of the activation
 * tensors. */
size_t px__rt_build_ops(px_rt_session *s, bool embed, uint32_t lb, uint32_t le, uint32_t rows,
                        uint32_t n_logits, bool select);

/* KV-cache blocks sequence seq lacks to hold positions [0, end)
 * (session.c). */
uint32_t px__rt_seq_blocks_missing(const px_rt_session *s, int32_t seq, uint64_t end);
/* The KV cache's block size and count for a context and max_seqs, from
 * what was asked (0: the defaults: blocks of 16, enough for every
 * sequence's whole context). */
void px__rt_kv_defaults(uint32_t context, uint32_t max_seqs, uint32_t block_size, uint32_t blocks,
                        uint32_t *out_size, uint32_t *out_blocks);
/* Gives seq the blocks it lacks for [0, end); there must be enough free. */
void px__rt_seq_blocks_take(px_rt_session *s, int32_t seq, uint64_t end);

/* Bytes between rows of a 2-D weight tensor. */
static inline size_t px__rt_row_bytes(const px_ir_tensor *t)
{
    return (size_t)t->nb[1];
}

/* Fills cos/sin for every position < context: table[p*rope_dim + 2i] =
 * cos(p * theta^(-2i/rope_dim)), [.. + 2i + 1] = sin(...), computed in
 * double. */
void px__rt_rope_table(float *table, uint32_t context, uint32_t rope_dim, float theta);

#endif
