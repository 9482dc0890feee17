/*
 * plexus/rt.h: the runtime.  Runs the models the IR describes: tensors,
 * the backend interface (device, buffer, stream), the cpu backend, the
 * transformer forward pass over a batch of sequences and a range of
 * layers, a plain scalar reference pass, tokenizers and sampling.
 *
 * Usage (greedy generation with the cpu backend):
 *
 *     px_err err;
 *     px_rt_model *model;
 *     px_rt_session *s;
 *     px_rt_model_open("stories260K.gguf", &model, &err);
 *     px_rt_session_opts so = {.n_threads = 2, .max_seqs = 1};
 *     px_rt_session_new(model, &so, &s, &err);
 *     int32_t seq;
 *     px_rt_seq_add(s, &seq, &err);
 *     int32_t prompt[] = {1, 403, 407, 261, 378};
 *     px_rt_seq_step step = {.seq = seq, .pos = 0, .n_tokens = 5, .tokens = prompt};
 *     px_rt_batch batch = {.n_seqs = 1, .seqs = &step};
 *     px_rt_output out;
 *     px_rt_forward(s, &batch, NULL, &out, &err);   // logits of the last token
 *     int32_t next = px_rt_argmax(out.data, out.row_len);
 *     ...
 *     px_rt_session_free(s);
 *     px_rt_model_free(model);
 *
 * px_rt_generate does the whole loop (tokenize, prefill, decode, sample,
 * detokenize) for one or several prompts.
 *
 * Layers.  A session holds a contiguous range of layers [layer_begin,
 * layer_end) of a model and the KV cache of those layers only, so that a
 * pipeline stage can run its part: the first stage takes token ids and
 * embeds them; every other stage takes the hidden states (the residual
 * stream) the previous stage produced; the last stage applies the final
 * norm and the classifier.  A stage may also hold no layer at all: only
 * the embedding (it passes the embedded rows on) or only the head (see
 * px_rt_session_opts.explicit_parts).
 *
 * Batches.  A step carries several sequences, each with its own position
 * and KV-cache slot, and any number of new tokens each (a prefill
 * micro-batch or one decode token).  Sequences join (px_rt_seq_add) and
 * leave (px_rt_seq_remove) between steps.
 *
 * Backends.  Three layers of function tables, as in ggml: a device says
 * what it is and what it supports, a buffer owns memory on a device, a
 * stream runs ops.  Every table starts with abi_version and size; a slot
 * exists only if it lies within size, new slots are only ever added at the
 * end, and optional slots are marked "(optional) ... defaults to ...":
 * the public wrappers supply the default.  Nothing outside a backend
 * touches tensor memory except through the buffer interface, unless the
 * buffer says it is host-visible (px_rt_buffer_base is not NULL).
 *
 * Determinism.  The cpu backend splits work by output rows (matrix rows,
 * attention heads, activation rows), never along a reduction, and every
 * output element is computed by the same code in the same order whatever
 * thread computes it: results are bit-identical from run to run, for
 * any thread count, and for any rows beside a row in a step (a prompt
 * alone, batched with others, or in chunks gives the same bits; no
 * environment variable changes them).  f32, f16 and bf16 results are the
 * same on AVX2 and AVX-512 machines but not on the portable path; q8_0
 * results (activations quantized to q8_0, integer dot products) are the
 * same on every path.  They differ from the scalar reference by float
 * rounding only (the tests bound logits to 1e-4; q8_0 models to 1e-2,
 * where an activation may round to the other quantization step).
 *
 * Thread safety: a model is immutable and may be shared by any number of
 * sessions and threads.  A session, a stream, a sampler are used by one
 * thread at a time.  The backend registry is thread-safe.
 */
#ifndef PLEXUS_RT_H
#define PLEXUS_RT_H

#include "plexus/base.h"
#include "plexus/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Tensors                                                             */
/* ------------------------------------------------------------------ */

#define PX_RT_MAX_DIMS 4

typedef struct px_rt_buffer px_rt_buffer;

/* A view of memory in a buffer.  ne[0] is the innermost (contiguous)
 * dimension; nb[i] is the byte stride of dimension i (nb[0] is the size of
 * one element or block).  Unused dimensions have ne = 1.  A matrix of
 * `rows` rows of `cols` values has ne = {cols, rows}.  Tensors do not own
 * their buffer. */
typedef struct px_rt_tensor {
    px_dtype dtype;
    int64_t ne[PX_RT_MAX_DIMS];
    size_t nb[PX_RT_MAX_DIMS];
    px_rt_buffer *buffer; /* borrowed; the memory owner */
    size_t offset;        /* byte offset of element 0 in the buffer */
    const char *name;     /* borrowed; for messages ("blk.3.attn_q.weight") */
} px_rt_tensor;

/* Clears t, then sets dtype, ne (innermost first, n_dims <= 4, the rest 1)
 * and contiguous strides; buffer, offset and name are left for the caller.
 * Returns PX_EINVAL when a row is not a whole number of blocks, PX_ERANGE
 * when the size overflows. */
PX_NODISCARD px_status px_rt_tensor_init(px_rt_tensor *t, px_dtype dtype, uint32_t n_dims,
                                         const int64_t *ne, px_err *err);
/* Bytes spanned by the tensor (ne[3]*nb[3] for contiguous tensors). */
size_t px_rt_tensor_nbytes(const px_rt_tensor *t);
/* Host address of element 0, or NULL when the buffer is not host-visible. */
void *px_rt_tensor_data(const px_rt_tensor *t);

/* ------------------------------------------------------------------ */
/* Ops                                                                 */
/* ------------------------------------------------------------------ */

/* Which sequence, KV-cache slot and position each activation row of a
 * step belongs to.  Arrays have n_rows entries, host memory. */
typedef struct px_rt_rows {
    uint32_t n_rows;
    const int32_t *slot; /* KV-cache slot of the row's sequence */
    const int32_t *pos;  /* position of the row's token in its sequence */
    /* The paged KV cache (ATTENTION).  The caches are [kv_dim, block_size,
     * n_blocks]; position p of slot s lives in block
     * block_table[s * blocks_per_slot + p / block_size], at p % block_size.
     * NULL: slot s owns block s whole (block_size is then the context). */
    const int32_t *block_table;
    uint32_t blocks_per_slot;
} px_rt_rows;

/* One op of a step.  Kinds are the IR's (px_ir_op_kind); the runtime
 * uses these, with activations f32 and row-major ([width, rows]):
 *
 *   EMBEDDING   dst[r] = src[0] row ids[r], src[1] the ids (i32 [rows]);
 *               src[0] any supported dtype.
 *   RMSNORM     dst[r] = src[0][r] / rms(src[0][r]) * src[1]; eps.
 *   MATMUL      dst[r] = src[1] * src[0][r] (+ src[2]); src[1] is the
 *               weight [d_in, d_out] in any supported dtype, src[2] an
 *               optional f32 bias [d_out].
 *   CLASSIFIER  as MATMUL (the logits).
 *   ROPE        rotates src[0] in place (dst == src[0]) at rows->pos;
 *               src[1] the table [rope_dim, context] holding, for position
 *               p and pair i, cos(p * theta^(-2i/rope_dim)) at 2i and the
 *               sine at 2i+1 (sessions compute it once, in double);
 *               n_heads, head_dim, rope_dim, rope_style.
 *   ATTENTION   stores src[1] (k) and src[2] (v) at (slot, pos) of the
 *               caches src[3] (K) and src[4] (V), each
 *               [n_kv_heads*head_dim, block_size, n_blocks] (paged through
 *               rows->block_table), then attends each row of src[0] (q)
 *               causally over its slot's positions
 *               [max(0, pos-window+1), pos]; dst [n_heads*head_dim, rows].
 *               Each row's result depends only on its own q and its slot's
 *               cached positions, never on the other rows of the step.
 *   SWIGLU      dst = silu(src[0]) * src[1]; dst may be src[0].
 *   ADD         dst = src[0] + src[1]; dst may be src[0].
 *
 * When `select` is set, RMSNORM, MATMUL and CLASSIFIER read only rows
 * select[0..n_select) of src[0] and write n_select rows (the head reads the
 * last row of each sequence only). */
typedef struct px_rt_op {
    px_ir_op_kind kind;
    int32_t layer; /* -1 outside the blocks */
    const px_rt_tensor *src[5];
    const px_rt_tensor *dst;
    const px_rt_rows *rows; /* host memory */
    const uint32_t *select;
    uint32_t n_select;
    float eps;                              /* RMSNORM */
    uint32_t n_heads, n_kv_heads, head_dim; /* ROPE (n_heads of src[0]), ATTENTION */
    uint32_t rope_dim;                      /* ROPE: dimensions rotated per head */
    px_ir_rope_style rope_style;            /* ROPE */
    uint32_t window;                        /* ATTENTION: sliding window, 0: none */
    /* Scratch of px_rt_device_work_size(op) bytes, or NULL when that is 0:
     * the caller allocates it once, so running an op allocates nothing. */
    const px_rt_tensor *work;
} px_rt_op;

/* FLOPs and bytes an op moves (the IR's conventions: weights read once,
 * attention reads the K and V of every attended position). */
void px_rt_op_cost(const px_rt_op *op, uint64_t *flops, uint64_t *bytes);
/* "embedding", "matmul", ... (the IR's op names). */
const char *px_rt_op_name(const px_rt_op *op);

/* ------------------------------------------------------------------ */
/* Backend interface                                                   */
/* ------------------------------------------------------------------ */

/* ABI of the tables below: major in the high 16 bits.  A table whose major
 * differs is refused; a smaller minor simply has fewer slots (size says
 * which). */
#define PX_RT_ABI_MAJOR   1u
#define PX_RT_ABI_MINOR   0u
#define PX_RT_ABI_VERSION ((PX_RT_ABI_MAJOR << 16) | PX_RT_ABI_MINOR)

typedef struct px_rt_device px_rt_device;
typedef struct px_rt_stream px_rt_stream;

typedef enum px_rt_device_kind {
    PX_RT_DEVICE_CPU = 0,
    PX_RT_DEVICE_GPU = 1,
    PX_RT_DEVICE_ACCEL = 2, /* NPU or other accelerator */
} px_rt_device_kind;

/* Capability flags. */
enum {
    PX_RT_CAP_HOST_MEMORY = 1 << 0, /* its buffers are host-visible */
    PX_RT_CAP_HOST_PTR = 1 << 1,    /* can wrap host memory (mmapped weights) */
    PX_RT_CAP_ASYNC = 1 << 2,       /* streams return before ops complete */
    PX_RT_CAP_OP_TIMING = 1 << 3,   /* a run of many ops times each on the device, so
                                       telemetry needs no run per op */
};

typedef struct px_rt_device_props {
    char name[64];         /* "cpu", "emu:a100-like" */
    char description[128]; /* "cpu: 2 threads, avx512 kernels" */
    px_rt_device_kind kind;
    uint64_t memory_total; /* bytes the device may allocate; 0: unknown */
    uint64_t memory_free;  /* bytes still free; 0: unknown */
    uint32_t caps;         /* PX_RT_CAP_* */
    uint32_t n_threads;    /* execution threads (cpu), 0 elsewhere */
    bool emulated;         /* an emulated device: never hardware results */
    uint64_t memory_used;  /* bytes this device's buffers hold; 0: not tracked */
    uint64_t memory_peak;  /* the most they held at once; 0: not tracked */
} px_rt_device_props;

/* Options for opening a device. */
typedef struct px_rt_device_opts {
    uint32_t n_threads;    /* cpu: worker threads, 0: online CPUs */
    bool portable_kernels; /* cpu: skip the AVX2/FMA kernels */
    const char *profile;   /* emulated backends: profile name or path */
    uint32_t ordinal;      /* cuda: the GPU, in the CUDA runtime's order */
    uint64_t memory_limit; /* cuda: most bytes its buffers may hold; 0: the GPU's */
} px_rt_device_opts;

/* A buffer's table.  `buf` is the backend's context for the buffer. */
typedef struct px_rt_buffer_iface {
    uint32_t abi_version;
    size_t size; /* sizeof the table the backend was built with */
    /* Frees the memory. */
    void (*free)(void *buf);
    /* (optional) Host address of byte 0, or NULL.  Defaults to NULL: the
     * memory is reached only through set/get. */
    void *(*base)(void *buf);
    /* Copies n bytes from host memory to byte `offset`.  Required unless
     * base returns non-NULL (the default then is memcpy). */
    px_status (*set)(void *buf, size_t offset, const void *src, size_t n, px_err *err);
    /* Copies n bytes at `offset` to host memory.  Required unless base. */
    px_status (*get)(void *buf, size_t offset, void *dst, size_t n, px_err *err);
    /* (optional) Fills n bytes at offset with value.  Defaults to set
     * from a host staging buffer. */
    px_status (*fill)(void *buf, size_t offset, uint8_t value, size_t n, px_err *err);
    /* (optional) Copies from another buffer (of any device).  Defaults to
     * get into a host staging buffer, then set. */
    px_status (*copy_from)(void *buf, size_t offset, const px_rt_buffer *src, size_t src_offset,
                           size_t n, px_err *err);
} px_rt_buffer_iface;

/* What a stream measured for one op. */
typedef struct px_rt_op_timing {
    uint64_t ns; /* device time of the op; 0: unknown (the wrapper then
                    reports host time around the call) */
} px_rt_op_timing;

/* A stream's table.  `stream` is the backend's context. */
typedef struct px_rt_stream_iface {
    uint32_t abi_version;
    size_t size;
    void (*free)(void *stream);
    /* Runs ops in order.  timing has n_ops entries or is NULL.  A
     * synchronous stream returns when they are done. */
    px_status (*run)(void *stream, const px_rt_op *ops, size_t n_ops, px_rt_op_timing *timing,
                     px_err *err);
    /* (optional) Waits until every op queued is done.  Defaults to nothing
     * (synchronous streams). */
    px_status (*synchronize)(void *stream, px_err *err);
    /* (optional, reserved for fault injection) Applies the fault hook
     * after op, the backend's way (on the device, at the right point of an
     * asynchronous queue).  Defaults to the wrapper calling the hook on
     * the host after the op completed (px_rt_stream_set_fault_hook). */
    px_status (*fault)(void *stream, const px_rt_op *op,
                       px_status (*hook)(const px_rt_op *op, void *ud, px_err *err), void *ud,
                       px_err *err);
} px_rt_stream_iface;

/* A device's table.  `dev` is the backend's context. */
typedef struct px_rt_device_iface {
    uint32_t abi_version;
    size_t size;
    void (*free)(void *dev);
    void (*props)(void *dev, px_rt_device_props *out);
    /* Whether the device can run `op` with weights (or its main input) of
     * dtype `dtype`.  (optional) Defaults to: nothing is supported. */
    bool (*supports_op)(void *dev, px_ir_op_kind op, px_dtype dtype);
    /* Allocates size bytes (zero-filled). */
    px_status (*buffer_alloc)(void *dev, size_t size, const px_rt_buffer_iface **iface, void **buf,
                              px_err *err);
    /* Creates a stream. */
    px_status (*stream_new)(void *dev, const px_rt_stream_iface **iface, void **stream,
                            px_err *err);
    /* (optional) Wraps host memory (borrowed, must outlive the buffer)
     * without copying.  Defaults to PX_EUNSUPPORTED: callers allocate and
     * copy. */
    px_status (*buffer_from_host)(void *dev, void *ptr, size_t size,
                                  const px_rt_buffer_iface **iface, void **buf, px_err *err);
    /* (optional) Bytes of scratch op needs (its `work` tensor), for the
     * largest shapes it will run with.  Defaults to 0. */
    size_t (*work_size)(void *dev, const px_rt_op *op);
} px_rt_device_iface;

/* A backend as registered by name. */
typedef struct px_rt_backend_iface {
    uint32_t abi_version;
    size_t size;
    const char *name; /* "cpu", "emu", "cuda" */
    const char *description;
    /* Opens a device; opts is never NULL. */
    px_status (*device_open)(const px_rt_device_opts *opts, const px_rt_device_iface **iface,
                             void **dev, px_err *err);
} px_rt_backend_iface;

/* Registers a backend (the table is borrowed and must stay valid: use a
 * static table).  "cpu" is built in.  Errors: PX_EEXIST for a name already
 * taken, PX_EUNSUPPORTED for an unknown ABI major or a table missing
 * required slots, PX_ELIMIT past 32 backends. */
PX_NODISCARD px_status px_rt_backend_register(const px_rt_backend_iface *b, px_err *err);
/* Registered backends, in registration order ("cpu" first). */
size_t px_rt_backend_count(void);
const px_rt_backend_iface *px_rt_backend_at(size_t i);

/* Opens a device of the backend `name`.  opts may be NULL.  Returns an
 * owned device (px_rt_device_free).  Errors: PX_ENOTFOUND naming the
 * registered backends, PX_EUNSUPPORTED (ABI), the backend's own. */
PX_NODISCARD px_status px_rt_device_open(const char *name, const px_rt_device_opts *opts,
                                         px_rt_device **out, px_err *err);
/* NULL is a no-op.  Buffers and streams must be freed first. */
void px_rt_device_free(px_rt_device *d);
void px_rt_device_props_get(const px_rt_device *d, px_rt_device_props *out);
bool px_rt_device_supports_op(const px_rt_device *d, px_ir_op_kind op, px_dtype dtype);
/* Scratch bytes op needs on the device (see px_rt_op.work). */
size_t px_rt_device_work_size(const px_rt_device *d, const px_rt_op *op);

/* Allocates a zero-filled buffer.  Returns owned memory
 * (px_rt_buffer_free).  Errors: PX_ENOMEM, the backend's. */
PX_NODISCARD px_status px_rt_buffer_alloc(px_rt_device *d, size_t size, px_rt_buffer **out,
                                          px_err *err);
/* Wraps host memory (borrowed) if the device can, else allocates a buffer
 * and copies the bytes in.  *copied says which. */
PX_NODISCARD px_status px_rt_buffer_from_host(px_rt_device *d, const void *ptr, size_t size,
                                              px_rt_buffer **out, bool *copied, px_err *err);
void px_rt_buffer_free(px_rt_buffer *b); /* NULL is a no-op */
size_t px_rt_buffer_size(const px_rt_buffer *b);
/* Host address, or NULL when the memory is not host-visible. */
void *px_rt_buffer_base(const px_rt_buffer *b);
px_rt_device *px_rt_buffer_device(const px_rt_buffer *b);
/* Byte transfers; PX_ERANGE outside the buffer. */
PX_NODISCARD px_status px_rt_buffer_set(px_rt_buffer *b, size_t offset, const void *src, size_t n,
                                        px_err *err);
PX_NODISCARD px_status px_rt_buffer_get(const px_rt_buffer *b, size_t offset, void *dst, size_t n,
                                        px_err *err);
PX_NODISCARD px_status px_rt_buffer_fill(px_rt_buffer *b, size_t offset, uint8_t value, size_t n,
                                         px_err *err);
PX_NODISCARD px_status px_rt_buffer_copy(px_rt_buffer *dst, size_t dst_offset,
                                         const px_rt_buffer *src, size_t src_offset, size_t n,
                                         px_err *err);

/* Telemetry of one op, reported after it ran. */
typedef struct px_rt_op_record {
    px_ir_op_kind kind;
    int32_t layer;
    uint64_t flops;
    uint64_t bytes;
    uint64_t ns; /* measured */
} px_rt_op_record;

typedef void (*px_rt_telemetry_fn)(const px_rt_op_record *rec, void *ud);
/* Called on the host after each op; may corrupt the op's output through
 * the buffer interface or sleep to inject a delay.  A status other than
 * PX_OK fails the run with that status. */
typedef px_status (*px_rt_fault_hook)(const px_rt_op *op, void *ud, px_err *err);

/* Creates a stream on the device.  Returns owned (px_rt_stream_free). */
PX_NODISCARD px_status px_rt_stream_new(px_rt_device *d, px_rt_stream **out, px_err *err);
void px_rt_stream_free(px_rt_stream *s); /* NULL is a no-op */
px_rt_device *px_rt_stream_device(const px_rt_stream *s);
/* Runs ops in order and waits for them.  With a fault hook set, or a
 * telemetry sink on a device without PX_RT_CAP_OP_TIMING, ops are issued
 * one at a time; with a sink, each is reported.  Errors:
 * the backend's (PX_EUNSUPPORTED for an op it cannot run, PX_EINVAL for
 * inconsistent shapes), the hook's. */
PX_NODISCARD px_status px_rt_stream_run(px_rt_stream *s, const px_rt_op *ops, size_t n_ops,
                                        px_err *err);
PX_NODISCARD px_status px_rt_stream_synchronize(px_rt_stream *s, px_err *err);
/* Sets or clears (fn NULL) the telemetry sink. */
void px_rt_stream_set_telemetry(px_rt_stream *s, px_rt_telemetry_fn fn, void *ud);
void px_rt_stream_set_fault_hook(px_rt_stream *s, px_rt_fault_hook hook, void *ud);

/* ------------------------------------------------------------------ */
/* The cuda backend                                                    */
/* ------------------------------------------------------------------ */

/* "cuda" is registered beside "cpu" in every build.  Its devices are the
 * GPUs, in the CUDA runtime's order (px_rt_device_opts.ordinal).  Where
 * the build had no nvcc, or the machine has no GPU or driver, opening one
 * fails with PX_EUNSUPPORTED naming the device and the fix; a stage is
 * never moved to the cpu unasked. */

/* Whether this build holds the cuda kernels (nvcc was found). */
bool px_rt_cuda_built(void);

/* One GPU as seen by discovery (nvidia-smi) or by the CUDA runtime. */
typedef struct px_rt_cuda_info {
    char name[96];       /* "NVIDIA H200" */
    char capability[16]; /* "9.0" */
    double memory_total; /* bytes; NAN: unknown */
    double clock_max_sm; /* Hz; NAN: unknown */
    int multiprocessors; /* 0: unknown */
} px_rt_cuda_info;

/* What the CUDA runtime says of GPU `ordinal` (cudaGetDeviceProperties).
 * Errors: PX_EUNSUPPORTED (no GPU, no driver, no cuda build),
 * PX_ENOTFOUND (an ordinal past the GPUs). */
PX_NODISCARD px_status px_rt_cuda_query(uint32_t ordinal, px_rt_cuda_info *out, px_err *err);

/* Compares discovery's figures with the runtime's for one GPU: a model
 * name, compute capability, memory (beyond 1 % and 64 MiB), SM clock
 * (beyond 5 %) or multiprocessor count that differ each add a warning to
 * w naming both figures.  Unknown figures are not compared.  Returns the
 * number of warnings added. */
size_t px_rt_cuda_crosscheck(const px_rt_cuda_info *discovered, const px_rt_cuda_info *runtime,
                             uint32_t ordinal, px_diags *w);

/* ------------------------------------------------------------------ */
/* Models                                                              */
/* ------------------------------------------------------------------ */

/* A model the runtime can execute: an IR model checked for what the
 * runtime supports (llama-family architectures, qwen2's biases, sliding
 * windows; matrices in f32, f16, bf16 or q8_0; norms and biases in f32). */
typedef struct px_rt_model px_rt_model;

/* Checks `ir` (borrowed; must outlive the model).  Errors:
 * PX_EUNSUPPORTED (a preset without weights, an architecture or dtype the
 * runtime cannot run, naming it), PX_EVALIDATE (a missing tensor or a
 * wrong shape, naming the tensor). */
PX_NODISCARD px_status px_rt_model_new(const px_ir_model *ir, px_rt_model **out, px_err *err);
/* Opens a model file (GGUF or llama2.c) and checks it; the model owns the
 * IR.  Errors: px_ir_model_open's and px_rt_model_new's. */
PX_NODISCARD px_status px_rt_model_open(const char *path, px_rt_model **out, px_err *err);
void px_rt_model_free(px_rt_model *m); /* NULL is a no-op */
const px_ir_model *px_rt_model_ir(const px_rt_model *m);
const px_ir_hparams *px_rt_model_hparams(const px_rt_model *m);

/* ------------------------------------------------------------------ */
/* Sessions and the forward pass                                       */
/* ------------------------------------------------------------------ */

typedef struct px_rt_session px_rt_session;

/* Activation rows the portable and AVX2 matrix kernels take at once (a
 * step of more rows runs in groups of this many; results do not depend
 * on the grouping). */
#define PX_RT_SMALL_BATCH 4

typedef struct px_rt_session_opts {
    px_rt_device *device;      /* borrowed; NULL: open `backend` */
    const char *backend;       /* registry name; NULL: "cpu" */
    uint32_t n_threads;        /* when opening a device; 0: the online CPUs,
                                  but no more than one per 16 MiB of weights
                                  held (small models run best on one) */
    bool portable_kernels;     /* when opening a cpu device */
    uint32_t max_seqs;         /* sequences at once (KV-cache slots); 0: 1 */
    uint32_t context;          /* positions per sequence; 0: the model's */
    uint32_t max_batch_tokens; /* rows per step; 0: min(context, 512) */
    uint32_t max_logit_rows;   /* logit rows per step; 0: max_seqs */
    uint32_t layer_begin;      /* layers held: [layer_begin, layer_end) */
    uint32_t layer_end;        /* 0: the model's last (unless explicit_parts) */
    /* false (the default): layer_end 0 means the model's last layer, the
     * session holds the embedding when layer_begin is 0 and the head when
     * layer_end is the model's last.  true: layer_end is taken as given,
     * so the range may be empty ([n, n)), and the session holds the
     * embedding and the head only as `embedding` and `head` say.  The
     * embedding needs layer_begin 0, the head layer_end n_layers, and an
     * empty range one of them: an embedding-only stage is {0, 0,
     * .embedding = true}, a head-only stage {n, n, .head = true}. */
    bool explicit_parts;
    bool embedding, head; /* with explicit_parts */
    /* The KV cache is paged: blocks of kv_block_size positions (0: 16),
     * kv_blocks of them shared by every sequence (0: enough for max_seqs
     * sequences of the whole context).  A sequence takes blocks as its
     * positions grow and gives them back when removed; a step that needs
     * more blocks than are free fails with PX_ELIMIT before it runs. */
    uint32_t kv_block_size;
    uint32_t kv_blocks;
} px_rt_session_opts;

/* Sets up a session: opens or borrows the device, wraps or uploads the
 * weights of its layers, allocates the KV cache, the activations and the
 * scratch of every step, all at once.  model is borrowed (must outlive
 * the session); opts may be NULL.  Returns owned (px_rt_session_free).
 * Errors: PX_EINVAL (bad options, naming them), PX_EUNSUPPORTED (an op or
 * dtype the device cannot run), PX_ENOMEM. */
PX_NODISCARD px_status px_rt_session_new(const px_rt_model *model, const px_rt_session_opts *opts,
                                         px_rt_session **out, px_err *err);
void px_rt_session_free(px_rt_session *s); /* NULL is a no-op */

/* What a session holds. */
typedef struct px_rt_session_info {
    uint32_t layer_begin, layer_end;
    uint32_t context, max_seqs, max_batch_tokens, max_logit_rows;
    uint32_t n_threads;
    uint64_t weight_bytes;  /* weights of its layers */
    uint64_t kv_bytes;      /* KV cache of all slots */
    uint64_t scratch_bytes; /* activations and scratch */
    bool weights_copied;    /* weights were copied to the device */
    px_rt_device_props device;
    uint32_t kv_block_size; /* positions per KV-cache block */
    uint32_t kv_blocks;     /* blocks in all */
    uint32_t kv_blocks_free;
} px_rt_session_info;

void px_rt_session_info_get(const px_rt_session *s, px_rt_session_info *out);
/* The session's stream (borrowed), for telemetry and fault hooks. */
px_rt_stream *px_rt_session_stream(px_rt_session *s);

/* Takes a free KV-cache slot for a new sequence and returns its id (the
 * lowest free slot, so that stages adding sequences in the same order
 * agree on ids).  Errors: PX_ELIMIT when max_seqs are active. */
PX_NODISCARD px_status px_rt_seq_add(px_rt_session *s, int32_t *seq, px_err *err);
/* Frees the sequence's slot.  PX_ENOTFOUND for an unknown id. */
PX_NODISCARD px_status px_rt_seq_remove(px_rt_session *s, int32_t seq, px_err *err);
/* Positions cached for the sequence, or -1 for an unknown id. */
int64_t px_rt_seq_len(const px_rt_session *s, int32_t seq);
/* KV-cache blocks a sequence of n positions holds: ceil(n / block_size).
 * A caller that schedules sequences counts blocks with it. */
uint32_t px_rt_kv_blocks_for(uint32_t n_positions, uint32_t block_size);

/* One sequence's part of a step. */
typedef struct px_rt_seq_step {
    int32_t seq;           /* id from px_rt_seq_add */
    uint32_t pos;          /* position of its first new token; at most the
                              sequence's length (less rewinds it) */
    uint32_t n_tokens;     /* new tokens (>= 1) */
    const int32_t *tokens; /* n_tokens ids when the step embeds tokens */
} px_rt_seq_step;

/* A step: sequences in order; rows are numbered sequence by sequence,
 * token by token. */
typedef struct px_rt_batch {
    uint32_t n_seqs;
    const px_rt_seq_step *seqs;
    /* Input hidden states [rows x dim], row-major, host memory, when the
     * step starts after the embedding (every seqs[i].tokens NULL). */
    const float *hidden;
} px_rt_batch;

typedef enum px_rt_output_kind {
    PX_RT_OUTPUT_HIDDEN = 0,      /* residual stream after layer_end-1 */
    PX_RT_OUTPUT_LOGITS_LAST = 1, /* logits of each sequence's last row */
    PX_RT_OUTPUT_LOGITS_ALL = 2,  /* logits of every row */
} px_rt_output_kind;

typedef struct px_rt_forward_opts {
    uint32_t layer_begin, layer_end; /* within the session's range */
    px_rt_output_kind output;
} px_rt_forward_opts;

/* Outputs of a step: host memory owned by the session, valid until its
 * next forward or free. */
typedef struct px_rt_output {
    const float *data; /* n_rows x row_len, row-major */
    uint32_t n_rows, row_len;
} px_rt_output;

/* Runs one step: embeds the batch's tokens (when the range starts at layer
 * 0 and tokens are given) or takes its hidden states, runs layers
 * [layer_begin, layer_end), and returns hidden states or logits (which
 * need layer_end = n_layers).  opts NULL runs the session's whole range
 * and returns the last logits (or hidden states if the session does not
 * hold the head).  Allocates nothing.  On success every sequence's length
 * becomes pos + n_tokens.  Errors: PX_EINVAL (unknown or repeated
 * sequence, a gap in positions, a token id out of range, a range outside
 * the session's, missing inputs, tokens to a session without the
 * embedding, logits from one without the head), PX_ELIMIT (more rows than
 * max_batch_tokens or max_logit_rows, a position past the context), the
 * backend's.  On failure sequence lengths are unchanged but their caches
 * past those lengths may have been overwritten. */
PX_NODISCARD px_status px_rt_forward(px_rt_session *s, const px_rt_batch *batch,
                                     const px_rt_forward_opts *opts, px_rt_output *out,
                                     px_err *err);

/* Index of the largest value (the first on ties); -1 when n is 0. */
int32_t px_rt_argmax(const float *x, size_t n);

/* ------------------------------------------------------------------ */
/* Scalar reference                                                    */
/* ------------------------------------------------------------------ */

/* The plain forward pass every backend is checked against: one sequence,
 * one token at a time, no threads, no BLAS, double accumulation, weights
 * dequantized value by value.  Slow by design. */
typedef struct px_rt_ref px_rt_ref;

/* model is borrowed.  context 0: the model's.  Returns owned. */
PX_NODISCARD px_status px_rt_ref_new(const px_rt_model *model, uint32_t context, px_rt_ref **out,
                                     px_err *err);
void px_rt_ref_free(px_rt_ref *r); /* NULL is a no-op */
/* Runs token at pos (pos at most the positions already run) and writes
 * vocab_size logits.  Errors: PX_EINVAL, PX_ELIMIT (pos past context). */
PX_NODISCARD px_status px_rt_ref_forward(px_rt_ref *r, int32_t token, uint32_t pos, float *logits,
                                         px_err *err);

/* ------------------------------------------------------------------ */
/* Tokenizer                                                           */
/* ------------------------------------------------------------------ */

/* llama2.c / sentencepiece-style BPE over a vocabulary with scores: the
 * text (with a leading space as dummy prefix) is split into code points,
 * unknown ones into byte tokens <0xXX>, then the adjacent pair whose merge
 * scores highest is merged until none can be.  Vocabularies that write
 * spaces as U+2581 (GGUF from sentencepiece) are handled both ways. */
typedef struct px_rt_tokenizer px_rt_tokenizer;

/* Builds a tokenizer from a vocabulary (copied; vocab may be freed
 * after).  Where two tokens have the same text, the lower id is used.
 * Errors: PX_EINVAL (no vocabulary), PX_EUNSUPPORTED (a tokenizer model
 * other than llama, such as gpt2), PX_ELIMIT (more than 4M tokens, a token
 * over 64 KiB), PX_ENOMEM. */
PX_NODISCARD px_status px_rt_tokenizer_new(const px_ir_vocab *vocab, px_rt_tokenizer **out,
                                           px_err *err);
void px_rt_tokenizer_free(px_rt_tokenizer *t); /* NULL is a no-op */
uint32_t px_rt_tokenizer_n_tokens(const px_rt_tokenizer *t);
int32_t px_rt_tokenizer_bos(const px_rt_tokenizer *t);
int32_t px_rt_tokenizer_eos(const px_rt_tokenizer *t);

enum {
    PX_RT_ENCODE_BOS = 1 << 0, /* start with the BOS token */
    PX_RT_ENCODE_EOS = 1 << 1, /* end with the EOS token */
    /* The text of a control or user-defined token (GGUF token_type 3 or
     * 4: "<|im_start|>", "<s>", "[INST]" where the vocabulary marks it so)
     * becomes that token's id instead of being spelled out in ordinary
     * tokens.  Texts are matched leftmost first, the longest at a place;
     * the ordinary text between them is encoded piece by piece, each
     * piece with its own dummy-prefix space (llama.cpp's parse_special).
     * For prompts the server builds (a rendered chat template), not for
     * text that must stay literal. */
    PX_RT_ENCODE_SPECIAL = 1 << 2,
};

/* Encodes len bytes of text (any bytes; invalid UTF-8 falls back to byte
 * tokens) into at most cap ids.  Without PX_RT_ENCODE_SPECIAL every byte
 * of text is ordinary text, whatever tokens the vocabulary has.
 * Thread-safe.  Errors: PX_ELIMIT when the ids do not fit in cap (*n_ids
 * then says how many were needed) or the text is longer than 16 MiB,
 * PX_EUNSUPPORTED when a byte has no token (a vocabulary without byte
 * fallback), PX_ENOMEM. */
PX_NODISCARD px_status px_rt_tokenizer_encode(const px_rt_tokenizer *t, const char *text,
                                              size_t len, unsigned flags, int32_t *ids, size_t cap,
                                              size_t *n_ids, px_err *err);
/* The bytes token stands for when it follows prev: byte tokens become
 * their byte, U+2581 becomes a space, control and unknown tokens yield no
 * bytes (so "<|im_end|>" or "</s>" never shows in generated text), and the
 * leading space of a piece right after BOS is dropped (llama2.c's
 * decoding).  *piece is owned by the tokenizer.  Errors: PX_EINVAL for an
 * id out of range. */
PX_NODISCARD px_status px_rt_tokenizer_decode(const px_rt_tokenizer *t, int32_t prev, int32_t token,
                                              const char **piece, size_t *len, px_err *err);
/* The id of the token whose text is exactly len bytes of text, as the
 * vocabulary writes it ("<|im_end|>", "</s>"), or -1.  A control or
 * user-defined token is preferred to an ordinary one of the same text.
 * Used to turn a chat template's end-of-turn texts into stop tokens.
 * Thread-safe. */
int32_t px_rt_tokenizer_find(const px_rt_tokenizer *t, const char *text, size_t len);
/* The type of token (GGUF tokenizer.ggml.token_type; PX_TOKEN_NORMAL when
 * the vocabulary has none), PX_TOKEN_UNDEFINED for an id out of range. */
px_token_type px_rt_tokenizer_token_type(const px_rt_tokenizer *t, int32_t token);
/* The text of token as a person reads it: like px_rt_tokenizer_decode
 * (byte tokens as their byte, U+2581 as a space, no dropped prefix), except
 * that control and unknown tokens show their text ("<|im_end|>") where
 * decode yields nothing.  For logprobs and diagnostics; streamed text uses
 * decode, so that control tokens never reach a client.  *text is owned by
 * the tokenizer.  Errors: PX_EINVAL for an id out of range. */
PX_NODISCARD px_status px_rt_tokenizer_token_text(const px_rt_tokenizer *t, int32_t token,
                                                  const char **text, size_t *len, px_err *err);

/* ------------------------------------------------------------------ */
/* Sampling                                                            */
/* ------------------------------------------------------------------ */

typedef struct px_rt_sampler_opts {
    float temperature; /* 0: greedy (argmax) */
    float top_p;       /* nucleus sampling when in (0, 1); else all tokens */
    uint64_t seed;     /* px_rng: the same seed gives the same choices */
    uint32_t top_k;    /* only the k most likely tokens; 0: all */
    float min_p;       /* drop tokens below min_p x the likeliest's probability; 0: off */
} px_rt_sampler_opts;

typedef struct px_rt_sampler px_rt_sampler;

/* Errors: PX_EINVAL (negative or non-finite temperature, top_p outside
 * [0, 1], vocab 0).  Returns owned (px_rt_sampler_free). */
PX_NODISCARD px_status px_rt_sampler_new(uint32_t vocab_size, const px_rt_sampler_opts *o,
                                         px_rt_sampler **out, px_err *err);
void px_rt_sampler_free(px_rt_sampler *s); /* NULL is a no-op */
/* Picks a token from vocab_size logits, which it overwrites (scaled and
 * turned into probabilities).  Allocates nothing. */
int32_t px_rt_sampler_sample(px_rt_sampler *s, float *logits);

/* ------------------------------------------------------------------ */
/* Generation                                                          */
/* ------------------------------------------------------------------ */

/* Called for each token produced (prompt is the index of its prompt);
 * piece is the decoded text (not NUL-terminated). */
typedef void (*px_rt_token_fn)(uint32_t prompt, int32_t token, const char *piece, size_t len,
                               void *ud);

typedef struct px_rt_supervisor px_rt_supervisor; /* below, with the executor */

typedef struct px_rt_generate_opts {
    const char *const *prompts;  /* borrowed */
    uint32_t n_prompts;          /* at most the session's max_seqs */
    uint32_t max_new_tokens;     /* per prompt */
    px_rt_sampler_opts sampling; /* prompt i samples with seed + i */
    bool ignore_eos;             /* keep going after BOS/EOS */
    px_rt_token_fn on_token;     /* may be NULL */
    void *ud;
    /* px_rt_executor_generate only (borrowed; may be NULL). */
    const px_rt_supervisor *supervisor;
} px_rt_generate_opts;

typedef struct px_rt_generate_stats {
    uint64_t prompt_tokens; /* prefilled (BOS included) */
    uint64_t prefill_ns;
    uint64_t decode_tokens; /* tokens produced by decode steps */
    uint64_t decode_ns;
    uint64_t new_tokens;           /* tokens produced in all */
    uint32_t n_stopped_at_context; /* prompts cut short by the context */
} px_rt_generate_stats;

/* Generates text for each prompt, the prompts decoding together as one
 * batch: encodes (with BOS), prefills in micro-batches of at most
 * max_batch_tokens rows, then decodes one token per prompt per step until
 * max_new_tokens, EOS/BOS, or the context ends.  The session must hold the
 * whole model; its sequences are added and removed here.  stats may be
 * NULL.  Errors: PX_EINVAL (options; a session without all layers),
 * PX_ELIMIT (a prompt longer than the context, naming it), the
 * forward pass's. */
PX_NODISCARD px_status px_rt_generate(px_rt_session *s, const px_rt_tokenizer *t,
                                      const px_rt_generate_opts *opts, px_rt_generate_stats *stats,
                                      px_err *err);

/* ================================================================== */
/* Pipelined execution: the emu backend, the framed transport, stage   */
/* workers and the executor                                            */
/* ================================================================== */
/*
 * A plan runs as one stage worker process per stage (`plexus worker`),
 * each holding its layer range, its KV cache and its backend.  The
 * executor starts them (fork and exec of the plexus binary) and joins
 * them in a ring of framed connections over Unix sockets (default) or TCP
 * on 127.0.0.1:
 *
 *     executor -> stage 0 -> stage 1 -> ... -> stage n-1 -> executor
 *
 * Every message travels the whole ring: a step's tokens go to stage 0,
 * hidden states from stage to stage, the logits from the last stage back
 * to the executor; control messages (sequences joining or leaving, the
 * telemetry request, shutdown) are applied by each stage and passed on,
 * so that their return to the executor is the acknowledgement.  A stage
 * that fails sends an error frame on (naming itself) and exits; a stage
 * that dies or stops answering is found by the executor's timeout and
 * named by its stage index, device and pid.
 *
 *     px_rt_pipeline_spec spec;
 *     px_rt_pipeline_spec_from_plan(plan_json, graph, "plan.json", &spec, &err);
 *     px_rt_executor_opts xo = {.model_path = "stories260K.gguf"};
 *     px_rt_executor *ex;
 *     px_rt_executor_new(&spec, &xo, &ex, &err);
 *     px_rt_pipeline_stats stats;
 *     px_rt_executor_generate(ex, tokenizer, &gen_opts, &stats, &err);
 *     px_rt_executor_free(ex);   // shuts the workers down
 *
 * Threads.  One executor is driven by one thread at a time: its calls
 * (generate, the step and sequence calls, free) must not overlap; distinct
 * executors are independent.  Each executor runs one receive thread of its
 * own, started by px_rt_executor_new and joined by px_rt_executor_free.
 *
 * Process side effects.  px_rt_executor_new forks and execs one child per
 * stage (the plexus binary, or worker_bin) with an empty signal mask and
 * PR_SET_PDEATHSIG = SIGKILL: a worker dies when the *thread* that created
 * it exits, so create an executor from a thread that outlives it.  The
 * children are reaped by px_rt_executor_free (SIGKILL after a 2 s grace);
 * nothing else in the process should wait for them (no waitpid(-1) and no
 * SIGCHLD = SIG_IGN while an executor lives).  Over Unix sockets the
 * executor makes a private folder $TMPDIR/plexus-run-XXXXXX (/tmp when
 * TMPDIR is unset; mode 0700; TMPDIR must leave room for a socket path,
 * about 45 characters) holding one socket per stage, and removes it on
 * free; over TCP it listens on ephemeral ports of 127.0.0.1.  Every
 * descriptor is close-on-exec; writes use MSG_NOSIGNAL, so no SIGPIPE.
 * stdout and stderr are flushed before each fork, and the workers inherit
 * them.
 */

/* The hardware graph (plexus/hw.h) the executor reads emu profiles from. */
typedef struct px_hw_graph px_hw_graph;

/* ------------------------------------------------------------------ */
/* The emu backend                                                     */
/* ------------------------------------------------------------------ */

/* An emulated accelerator: it runs the cpu kernels, then waits until each
 * op has taken its real time times the slowdown of its class (compute-
 * or memory-bound, from the op's FLOPs per byte), with optional seeded
 * jitter.  It never consults the planner's cost model.  Its buffers count
 * against memory_bytes.  Devices it opens always say emulated. */
typedef struct px_rt_emu_profile {
    double compute_slowdown; /* >= 1: an emulated device is never faster */
    double memory_slowdown;  /* >= 1 */
    double jitter;           /* in [0, 1): each op's stretch is scaled by a
                                uniform factor in [1 - jitter, 1 + jitter]
                                (never below the real time) */
    uint64_t seed;           /* of the jitter */
    uint64_t memory_bytes;   /* capacity; 0: unlimited */
    char name[64];           /* device name in messages ("local.emu-a") */
} px_rt_emu_profile;

/* Ops with at least this many FLOPs per byte moved are compute-bound;
 * the rest (matrix-vector products, elementwise ops, decode attention)
 * are memory-bound. */
#define PX_RT_EMU_COMPUTE_INTENSITY 4.0

/* Parses a profile from JSON text (the inventory's "emu" member, plus the
 * optional "memory_bytes" and "name"): {"compute_slowdown": 3,
 * "memory_slowdown": 2, "jitter": 0.02, "seed": 1}.  Missing slowdowns
 * are 1.  Errors: PX_EPARSE (not JSON), PX_EINVAL (a slowdown below 1 or
 * not finite, jitter outside [0, 1), an unknown member; naming it). */
PX_NODISCARD px_status px_rt_emu_profile_parse(const char *json, px_rt_emu_profile *out,
                                               px_err *err);
/* Writes the profile as the JSON text px_rt_emu_profile_parse reads.
 * PX_ENOMEM. */
PX_NODISCARD px_status px_rt_emu_profile_format(const px_rt_emu_profile *p, px_strbuf *out,
                                                px_err *err);
/* Registers the "emu" backend (idempotent, thread-safe).  Its devices
 * take the profile's JSON text in px_rt_device_opts.profile (NULL: all
 * slowdowns 1, unlimited memory). */
PX_NODISCARD px_status px_rt_emu_register(px_err *err);
/* The class the emu backend gives an op: true when compute-bound. */
bool px_rt_emu_op_compute_bound(const px_rt_op *op);

/* ------------------------------------------------------------------ */
/* The framed transport                                                */
/* ------------------------------------------------------------------ */

/* A frame: a 24-byte header, then `length` bytes of payload.  The header
 * is little-endian: magic "PXFR" (u32), version (u16), type (u8), flags
 * (u8), sequence number (u64), payload length (u32), CRC-32 (IEEE) of the
 * payload (u32). */
#define PX_RT_FRAME_MAGIC        0x52465850u /* "PXFR" read as little-endian */
#define PX_RT_FRAME_VERSION      1u
#define PX_RT_FRAME_HEADER_BYTES 24u
/* Largest payload any connection accepts; the hello agrees on a lower
 * bound per connection. */
#define PX_RT_FRAME_MAX_PAYLOAD (256u << 20)

typedef enum px_rt_frame_type {
    PX_RT_FRAME_HELLO = 1,     /* connection set-up (JSON) */
    PX_RT_FRAME_HELLO_ACK = 2, /* its answer (JSON) */
    PX_RT_FRAME_STEP = 3,      /* a step: tokens or hidden states */
    PX_RT_FRAME_RESULT = 4,    /* the logits of a step */
    PX_RT_FRAME_SEQ = 5,       /* a sequence joins or leaves */
    PX_RT_FRAME_INFO = 6,      /* each stage appends what it holds */
    PX_RT_FRAME_STATS = 7,     /* each stage appends its op telemetry */
    PX_RT_FRAME_SHUTDOWN = 8,  /* each stage passes it on and exits */
    PX_RT_FRAME_ERROR = 9,     /* a stage failed: the message (text) */
    PX_RT_FRAME_FAULT = 10,    /* a fault to inject (px_rt_fault); the
                                  stage it names applies it */
    PX_RT_FRAME_AUTH = 11,     /* the hello's third message: the connecting
                                  side's proof of the secret (32 bytes) */
} px_rt_frame_type;

/* Flags of a STEP frame: with AUDIT every stage appends its output's
 * first row (see px_rt_step_obs.audit). */
#define PX_RT_STEP_AUDIT 0x01u

typedef struct px_rt_frame_header {
    uint32_t magic;
    uint16_t version;
    uint8_t type;
    uint8_t flags;
    uint64_t seq;
    uint32_t length;
    uint32_t checksum;
} px_rt_frame_header;

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of n bytes, continuing
 * from crc (0 to start). */
uint32_t px_rt_crc32(uint32_t crc, const void *data, size_t n);
/* Writes the header's 24 bytes. */
void px_rt_frame_header_encode(const px_rt_frame_header *h, uint8_t out[PX_RT_FRAME_HEADER_BYTES]);
/* Reads and checks a header: magic, version, a known type, length at
 * most max_payload.  `peer` names the sender in messages.  Errors:
 * PX_EPARSE (wrong magic, unknown type), PX_EUNSUPPORTED (version),
 * PX_ELIMIT (length). */
PX_NODISCARD px_status px_rt_frame_header_decode(const uint8_t in[PX_RT_FRAME_HEADER_BYTES],
                                                 uint32_t max_payload, const char *peer,
                                                 px_rt_frame_header *out, px_err *err);

/* A transport address: "unix:PATH" or "tcp:A.B.C.D:PORT" (a numeric
 * IPv4 address, "localhost" for 127.0.0.1; port 0 when listening picks a
 * free one; 0.0.0.0 listens on every interface).  A connection that leaves
 * the machine must be authenticated: see px_rt_conn_set_secret. */
typedef struct px_rt_listener px_rt_listener;
typedef struct px_rt_conn px_rt_conn;

/* Listens on addr.  Returns owned (px_rt_listener_free, which also
 * removes a Unix socket file).  Errors: PX_EINVAL (a malformed address,
 * naming the accepted forms), PX_EIO (the system's refusal). */
PX_NODISCARD px_status px_rt_listener_new(const char *addr, px_rt_listener **out, px_err *err);
void px_rt_listener_free(px_rt_listener *l); /* NULL is a no-op */
/* The address the listener bound ("tcp:10.0.0.2:41234": the chosen port
 * for "tcp:...:0"); borrowed. */
const char *px_rt_listener_address(const px_rt_listener *l);
/* Waits at most timeout_ms for a peer.  peer names it in messages
 * (copied).  Returns owned (px_rt_conn_free).  PX_ETIMEOUT, PX_EIO. */
PX_NODISCARD px_status px_rt_listener_accept(px_rt_listener *l, int timeout_ms, const char *peer,
                                             px_rt_conn **out, px_err *err);
/* Connects to addr, retrying while nobody listens yet, for at most
 * timeout_ms.  Returns owned.  PX_EINVAL, PX_ETIMEOUT, PX_EIO. */
PX_NODISCARD px_status px_rt_conn_connect(const char *addr, int timeout_ms, const char *peer,
                                          px_rt_conn **out, px_err *err);
void px_rt_conn_free(px_rt_conn *c); /* NULL is a no-op */
/* Checks an address's form.  PX_EINVAL naming it and the accepted forms. */
PX_NODISCARD px_status px_rt_addr_check(const char *addr, px_err *err);
/* Whether addr is well formed and stays on this machine: a Unix socket,
 * or TCP in 127.0.0.0/8. */
bool px_rt_addr_is_local(const char *addr);

/* The secret of a deployment, shared by its executor and stage workers:
 * with one set, the hello is a challenge and response (HMAC-SHA256 over
 * both sides' random nonces and hellos), and a peer without the same
 * secret is refused with PX_EAUTH.  Both ends must have one, or neither.
 * Copied (and wiped when the connection is freed); len 0 clears it.
 * PX_EINVAL for a length outside [PX_RT_SECRET_MIN, PX_RT_SECRET_MAX]. */
#define PX_RT_SECRET_MIN 16
#define PX_RT_SECRET_MAX 64
PX_NODISCARD px_status px_rt_conn_set_secret(px_rt_conn *c, const uint8_t *secret, size_t len,
                                             px_err *err);

/* Every read and write waits at most this long (default 10 s). */
void px_rt_conn_set_timeout(px_rt_conn *c, int timeout_ms);
/* The largest payload this side accepts (default and ceiling
 * PX_RT_FRAME_MAX_PAYLOAD). */
void px_rt_conn_set_max_payload(px_rt_conn *c, uint32_t max_payload);
uint32_t px_rt_conn_max_payload(const px_rt_conn *c);
/* Renames the peer in messages ("stage 2 (local.emu-b, pid 4242)"). */
void px_rt_conn_set_peer(px_rt_conn *c, const char *peer);

/* Faults a connection applies to what it sends, for fault injection:
 * added latency per frame, a bandwidth cap, and a cut (every later send
 * fails and the socket is shut down, as when a link goes away). */
typedef struct px_rt_link_faults {
    uint64_t latency_ns;  /* waited before each frame */
    double bandwidth_bps; /* bytes per second; 0: unlimited */
    bool cut;             /* drop the connection */
    uint64_t cut_after;   /* cut once this many frames were sent (0: off) */
    bool cut_mid_frame;   /* send half of the next frame, then cut */
    /* Intermittent degradation: latency and bandwidth apply only during
     * the first duty * period_s of every period (wall clock, counted from
     * when the faults were set); period_s 0: always. */
    double period_s, duty;
    /* A lost frame is sent again after resend_ns (0: 200 ms), as a
     * retransmission would: loss is the probability per frame. */
    double loss;
    uint64_t resend_ns;
    /* Probability per frame that one payload byte is flipped after the
     * checksum was computed: the receiver must refuse the frame. */
    double flip;
    uint64_t seed; /* of loss and flip */
} px_rt_link_faults;

void px_rt_conn_set_faults(px_rt_conn *c, const px_rt_link_faults *f);

/* Sends one frame (header and payload; payload may be NULL when len is
 * 0).  Errors: PX_ETIMEOUT (the peer stopped reading), PX_EPEER (the
 * connection is closed or cut), PX_ELIMIT (len above the agreed maximum),
 * each naming the peer. */
PX_NODISCARD px_status px_rt_conn_send(px_rt_conn *c, px_rt_frame_type type, uint8_t flags,
                                       const void *payload, uint32_t len, px_err *err);
/* Sends a frame whose payload is the concatenation of n parts. */
PX_NODISCARD px_status px_rt_conn_sendv(px_rt_conn *c, px_rt_frame_type type, uint8_t flags,
                                        const void *const *parts, const uint32_t *lens, uint32_t n,
                                        px_err *err);
/* Receives one frame.  *payload points into the connection's buffer,
 * valid until its next receive.  Errors: PX_ETIMEOUT (nothing within the
 * timeout), PX_EPEER (the peer closed, possibly mid-frame: "truncated
 * frame"), PX_EPARSE (bad magic or checksum), PX_EUNSUPPORTED (version),
 * PX_ELIMIT (length), each naming the peer. */
PX_NODISCARD px_status px_rt_conn_recv(px_rt_conn *c, px_rt_frame_header *h,
                                       const uint8_t **payload, px_err *err);
/* Frames and bytes sent and received so far. */
void px_rt_conn_counters(const px_rt_conn *c, uint64_t *frames_out, uint64_t *bytes_out,
                         uint64_t *frames_in, uint64_t *bytes_in);

/* What one side of a connection says in its hello. */
typedef struct px_rt_hello {
    uint32_t stage;                  /* the sender's stage; UINT32_MAX: the executor */
    uint32_t layer_begin, layer_end; /* the sender's layers */
    uint32_t dim;                    /* hidden size of the model */
    uint32_t max_payload;            /* largest payload the sender accepts */
    char model[80];                  /* "sha256:<hex>" of the model file */
} px_rt_hello;

/* The connecting side: sends its hello, reads the answer, checks the
 * protocol and model, and sets the connection's maximum payload to the
 * lower of both.  With a secret on the connection the hello takes three
 * messages: HELLO (with the client's nonce), HELLO_ACK (the server's
 * nonce and its proof), AUTH (the client's proof); each proof is an
 * HMAC-SHA256 of the other side's hello under the secret, compared in
 * constant time.  Errors: PX_EVALIDATE (another model), PX_EAUTH (a
 * wrong secret, or one side has a secret and the other none), the
 * transport's. */
PX_NODISCARD px_status px_rt_hello_client(px_rt_conn *c, const px_rt_hello *mine,
                                          px_rt_hello *theirs, px_err *err);
/* The accepting side: reads the peer's hello, checks it, answers, and
 * with a secret checks the peer's proof.  Errors: as the client's. */
PX_NODISCARD px_status px_rt_hello_server(px_rt_conn *c, const px_rt_hello *mine,
                                          px_rt_hello *theirs, px_err *err);

/* ------------------------------------------------------------------ */
/* Stage workers                                                       */
/* ------------------------------------------------------------------ */

typedef struct px_rt_worker_opts {
    uint32_t stage;
    const char *model_path;
    uint32_t layer_begin, layer_end; /* [begin, end); may be empty with
                                        embedding or head */
    bool embedding, head;            /* embedding needs begin 0, head end
                                        n_layers (a stage starting at 0
                                        without it follows an embedding-only
                                        stage) */
    const char *backend;             /* "cpu", "emu" or "cuda" */
    const char *emu_profile;         /* JSON text for emu */
    const char *device_name;         /* for messages; may be NULL */
    uint32_t n_threads;
    const char *listen;                           /* where the previous hop connects */
    const char *next;                             /* the next stage, or the executor */
    int timeout_ms;                               /* set-up and every write, and reads
                                                     within a frame; 0: 10 s.  The wait
                                                     for the next frame from upstream is
                                                     10 minutes (an idle executor); a
                                                     dead upstream is seen at once */
    uint32_t max_seqs, context, max_batch_tokens; /* 0: defaults */
    uint32_t kv_blocks, kv_block_size;            /* the session's; 0: defaults */
    /* The deployment's secret (PX_RT_SECRET_MIN to PX_RT_SECRET_MAX
     * bytes; borrowed): both of the worker's connections authenticate
     * with it.  Required to listen on an address that is not local
     * (px_rt_addr_is_local); len 0: none. */
    const uint8_t *secret;
    size_t secret_len;
    /* Once listening, write "listening ADDRESS\n" (the bound address) to
     * standard output, for a launcher that let the worker pick its port. */
    bool announce;
} px_rt_worker_opts;

/* The worker's command line, built and parsed in one place (the
 * executor, launchers and `plexus worker` share it).  argv[0] is the
 * binary, argv[1] "worker"; a secret is never in it: with one,
 * "--secret-stdin" says the worker reads it (hex, one line) from its
 * standard input. */
#define PX_RT_WORKER_MAX_ARGS 48
typedef struct px_rt_worker_argv {
    int argc;
    char *argv[PX_RT_WORKER_MAX_ARGS + 1]; /* owned; NULL-terminated */
} px_rt_worker_argv;

/* Builds the command line of o (bin NULL: "plexus").  Release with
 * px_rt_worker_args_release.  PX_EINVAL (a required field missing),
 * PX_ELIMIT, PX_ENOMEM. */
PX_NODISCARD px_status px_rt_worker_args_build(const px_rt_worker_opts *o, const char *bin,
                                               px_rt_worker_argv *out, px_err *err);
void px_rt_worker_args_release(px_rt_worker_argv *a); /* NULL is a no-op */
/* Parses the options after "worker" (argc, argv: the options only) into
 * o, whose strings borrow argv; *secret_stdin says whether the secret is
 * to be read from standard input.  PX_EINVAL naming the option and the
 * fix (an unknown option, a missing value, a number out of range, a
 * malformed address, a backend other than cpu, emu or cuda). */
PX_NODISCARD px_status px_rt_worker_args_parse(int argc, char *const *argv, px_rt_worker_opts *o,
                                               bool *secret_stdin, px_err *err);

/* A deployment's secret: PX_RT_SECRET_BYTES random bytes (OpenSSL's
 * RAND_bytes).  PX_EINTERNAL. */
#define PX_RT_SECRET_BYTES 32
PX_NODISCARD px_status px_rt_secret_new(uint8_t out[PX_RT_SECRET_BYTES], px_err *err);
/* Writes len bytes as 2*len hex digits and a NUL. */
void px_rt_secret_hex(const uint8_t *secret, size_t len, char *out);
/* Reads a secret from fd: hex digits on one line (up to the newline or
 * the end), PX_RT_SECRET_MIN to PX_RT_SECRET_MAX bytes.  PX_EINVAL
 * (length, a character that is not a hex digit: the secret itself is
 * never quoted), PX_EIO. */
PX_NODISCARD px_status px_rt_secret_read_fd(int fd, uint8_t out[PX_RT_SECRET_MAX], size_t *len,
                                            px_err *err);

/* Runs a stage worker until shutdown: opens the model and a session of
 * its layers, listens, connects to the next hop, accepts the previous
 * one, then serves frames.  A failure is also sent on as an error frame
 * naming the stage.  Errors: the model's, the session's, the
 * transport's. */
PX_NODISCARD px_status px_rt_worker_run(const px_rt_worker_opts *o, px_err *err);

/* ------------------------------------------------------------------ */
/* The executor                                                        */
/* ------------------------------------------------------------------ */

#define PX_RT_MAX_STAGES 16

/* A prediction interval of the plan (seconds); NAN when absent. */
typedef struct px_rt_interval {
    double p50, lo, hi;
} px_rt_interval;

typedef struct px_rt_stage_spec {
    uint32_t layer_begin, layer_end; /* [begin, end); empty for a stage that
                                        holds only the embedding or the head */
    bool embedding, head;            /* the first stage, the last stage */
    char device[64];                 /* inventory global id ("local.emu-a"), or "" */
    char backend[16];                /* "cpu", "emu" or "cuda" */
    bool emulated;
    px_rt_emu_profile emu;        /* for backend "emu" */
    px_rt_interval pred_decode_s; /* per token */
    px_rt_interval pred_prefill_s;
} px_rt_stage_spec;

typedef struct px_rt_pipeline_spec {
    uint32_t n_stages;
    px_rt_stage_spec stages[PX_RT_MAX_STAGES];
    char plan_id[72];            /* may be "" */
    char model_id[80];           /* the plan's "sha256:<hex>", or "" */
    uint32_t model_blocks;       /* the plan's count, 0 when absent */
    bool emulated;               /* some stage runs on an emulated device */
    uint32_t plan_prompt_tokens; /* the workload the plan predicted for */
    px_rt_interval pred_tpot_s, pred_ttft_s;
} px_rt_pipeline_spec;

/* Reads the stages of a `plexus.plan/1` document (borrowed): layers
 * {first, last} (inclusive blocks; last = first - 1 for a stage with no
 * block, allowed only for the first stage, which holds the embedding, or
 * the last, which holds the head), embedding, head, devices, backend,
 * emulated, predicted; replica 0 only.  With an inventory (borrowed; may
 * be NULL) each device's backend and emu profile come from it; without,
 * an emu stage must carry its profile as "emu".  name labels messages.
 * Errors: PX_EVALIDATE naming the member (JSON pointer) and the fix:
 * gaps or overlaps between stages, an empty stage in the middle, the
 * embedding on a stage other than the first or the head on one other than
 * the last, a device missing from the inventory,
 * an emu device without a profile, more than PX_RT_MAX_STAGES stages. */
PX_NODISCARD px_status px_rt_pipeline_spec_from_plan(const json_t *plan,
                                                     const px_hw_graph *inventory, const char *name,
                                                     px_rt_pipeline_spec *out, px_err *err);

/* The replicas a plan serves (its "replicas" array; 1 without one). */
uint32_t px_rt_plan_replicas(const json_t *plan);
/* The batch replica `replica` of a plan runs at: its own "batch", else the
 * plan's "batching"."batch_per_replica"; 0 when the plan says neither or
 * gives a value outside 1..65536. */
uint32_t px_rt_plan_replica_batch(const json_t *plan, uint32_t replica);
/* The stages of one replica, read as px_rt_pipeline_spec_from_plan reads
 * the first's (replica 0 is exactly that); other replicas carry no
 * per-stage predictions.  Errors: as px_rt_pipeline_spec_from_plan's,
 * and PX_EVALIDATE for a replica the plan does not have. */
PX_NODISCARD px_status px_rt_pipeline_spec_from_plan_replica(const json_t *plan,
                                                             const px_hw_graph *inventory,
                                                             const char *name, uint32_t replica,
                                                             px_rt_pipeline_spec *out, px_err *err);

typedef enum px_rt_transport {
    PX_RT_TRANSPORT_UNIX = 0,
    PX_RT_TRANSPORT_TCP = 1,
} px_rt_transport;

typedef enum px_rt_stage_state {
    PX_RT_STAGE_RUNNING = 0,
    PX_RT_STAGE_STOPPED, /* stopped by a signal (it answers nothing) */
    PX_RT_STAGE_EXITED,  /* exited with a status */
    PX_RT_STAGE_KILLED,  /* killed by a signal */
} px_rt_stage_state;

/* Who starts the stage workers.  By default the executor forks and execs
 * them itself; a launcher lets someone else start them (on other
 * machines: a fleet's agents) while the executor reaches them over TCP
 * and watches them through `health`, which feeds the same fault detection
 * as the process table does for its own workers. */
typedef struct px_rt_launcher {
    void *ctx;
    /* Starts the worker of `stage`.  argv is its command line
     * (px_rt_worker_args_build's, with "--announce"; its "--listen" value
     * is for the launcher to set to an address of the machine it starts
     * the worker on); secret (hex on one line) goes to the worker's
     * standard input.  Returns once the worker listens, with the address
     * it bound ("tcp:A.B.C.D:PORT") in addr and, in *handle, what names
     * this worker to the other calls (one launcher may serve several
     * executors at once: a heal loop's next executor starts before the
     * last one ends).  The executor starts the last stage first: each
     * worker's next hop already listens.  On failure *handle is NULL. */
    px_status (*start)(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                       const uint8_t *secret, size_t secret_len, char *addr, size_t addr_cap,
                       void **handle, px_err *err);
    /* The worker's state, without waiting; for EXITED its status and for
     * KILLED its signal in *code, and what happened in detail. */
    px_rt_stage_state (*health)(void *ctx, void *handle, int *code, char *detail, size_t cap);
    /* Sends SIGKILL or SIGSTOP to the worker (fault injection).  May be
     * NULL: such faults are then PX_EUNSUPPORTED. */
    px_status (*signal)(void *ctx, void *handle, int sig, px_err *err);
    /* Ends the worker if it still runs and releases the handle. */
    void (*stop)(void *ctx, void *handle);
} px_rt_launcher;

/* A launcher that starts workers on this machine (thread-safe: the
 * executors of several replicas may share one; fork and exec with
 * --announce, the secret on a pipe to their standard input) listening on
 * tcp:HOST:0: what an agent runs for the stages placed on its node.  bin
 * NULL: this process's binary; timeout_ms: the wait for a worker to
 * announce (0: 30 s). */
typedef struct px_rt_local_launcher px_rt_local_launcher;
PX_NODISCARD px_status px_rt_local_launcher_new(const char *bin, const char *host, int timeout_ms,
                                                px_rt_local_launcher **out, px_err *err);
/* Stops every worker it started and frees it.  NULL is a no-op. */
void px_rt_local_launcher_free(px_rt_local_launcher *l);
/* Its interface (borrowed; valid while l lives). */
const px_rt_launcher *px_rt_local_launcher_iface(px_rt_local_launcher *l);
/* The process id of the worker a handle names, or -1. */
int px_rt_local_launcher_pid(px_rt_local_launcher *l, const void *handle);

typedef struct px_rt_executor_opts {
    const char *model_path; /* borrowed; required */
    const char *worker_bin; /* the plexus binary; NULL: /proc/self/exe */
    px_rt_transport transport;
    uint32_t n_threads;        /* per worker; 0: 1 */
    int timeout_ms;            /* per read or write; 0: 10 s */
    uint32_t max_seqs;         /* sequences at once; 0: 8 */
    uint32_t context;          /* 0: the model's */
    uint32_t max_batch_tokens; /* prefill micro-batch rows; 0: the session default */
    uint32_t kv_blocks;        /* each stage's KV cache, as px_rt_session_opts; 0: default */
    uint32_t kv_block_size;    /* 0: default */
    /* Stages started by a launcher (borrowed; NULL: the executor's own
     * processes).  The transport is then TCP, and authenticated. */
    const px_rt_launcher *launcher;
    /* With a launcher: where the last stage connects back, "tcp:A.B.C.D:0"
     * on an interface it reaches (NULL: tcp:127.0.0.1:0). */
    const char *listen;
    /* The deployment's secret (borrowed, copied); NULL: over TCP the
     * executor draws one of its own. */
    const uint8_t *secret;
    size_t secret_len;
} px_rt_executor_opts;

/* An executor runs a pipeline of stage workers and is driven by one thread
 * at a time (the engine's, px_rt_engine, or the caller's); separate
 * executors may run on separate threads at once.  What it does to the
 * process, from px_rt_executor_new to px_rt_executor_free:
 *
 *   - Children: without a launcher it forks and execs one worker per
 *     stage (worker_bin, else this process's binary resolved once from
 *     /proc/self/exe), each with PR_SET_PDEATHSIG = SIGKILL (a worker
 *     dies with the thread that forked it), an empty signal mask, and the
 *     secret on a pipe to its standard input, never in its argv or
 *     environment.  It waits for and reaps only the process ids it
 *     started (never waitpid(-1)); free ends the workers, SIGKILL after
 *     the timeout, and reaps them.  stdio is flushed before each fork.
 *   - Files: the unix transport makes a private folder (mode 0700, by
 *     mkdtemp) under $TMPDIR, or /tmp when TMPDIR is unset or empty, for
 *     the workers' sockets; free removes the sockets and the folder.  The
 *     tcp transport listens on 127.0.0.1 (or opts.listen) instead.
 *   - Threads: one receiver thread per executor reads the last stage's
 *     frames; free joins it.
 *   - Signals: none installed or changed; writes never raise SIGPIPE
 *     (MSG_NOSIGNAL).
 *
 * A process that forks the executor's thread away, or exits without
 * px_rt_executor_free, leaves the workers to PR_SET_PDEATHSIG and the
 * socket folder behind. */
typedef struct px_rt_executor px_rt_executor;

/* Checks the model against the plan (digest and block count), starts one
 * worker per stage and joins them.  spec and opts are copied.  Returns
 * owned (px_rt_executor_free).  Errors: PX_EVALIDATE (the model does not
 * match the plan), PX_EIO (a worker cannot start), the workers' (their
 * error frames), PX_ETIMEOUT / PX_EPEER naming the stage. */
PX_NODISCARD px_status px_rt_executor_new(const px_rt_pipeline_spec *spec,
                                          const px_rt_executor_opts *opts, px_rt_executor **out,
                                          px_err *err);
/* Shuts the workers down (killing any that do not exit within the
 * timeout) and reaps them.  NULL is a no-op. */
void px_rt_executor_free(px_rt_executor *ex);
/* Sets (or clears, f NULL) the faults of the executor's connection to
 * stage 0, for fault injection. */
void px_rt_executor_set_faults(px_rt_executor *ex, const px_rt_link_faults *f);
/* Process id of stage i's worker, or -1 (also for a stage a launcher
 * started: its process is not this machine's to signal). */
int px_rt_executor_stage_pid(const px_rt_executor *ex, uint32_t i);
/* The launcher's handle of stage i's worker, NULL when the executor
 * started it itself. */
void *px_rt_executor_stage_handle(const px_rt_executor *ex, uint32_t i);
/* What stage i reported when the ring was set up: its device's
 * properties (borrowed; NULL for i out of range). */
const px_rt_device_props *px_rt_executor_stage_device(const px_rt_executor *ex, uint32_t i);

/* ------------------------------------------------------------------ */
/* Fault injection, health and supervision                             */
/* ------------------------------------------------------------------ */

/* Faults a running pipeline can be given, for fault injection.  Each
 * names one stage.  KILL and STOP are signals the executor sends to the
 * stage's worker; the rest travel the ring as a FAULT frame (its return
 * is the acknowledgement) and the named stage's worker applies them. */
typedef enum px_rt_fault_kind {
    PX_RT_FAULT_CLEAR = 0, /* the stage clears every fault it applies */
    PX_RT_FAULT_LINK,      /* the stage's outgoing link (to the next stage,
                              or the last stage's to the executor): `link` */
    PX_RT_FAULT_SLOW,      /* every op of the stage slows down towards
                              `factor` with time constant tau_s, as a
                              device throttling when it heats up */
    PX_RT_FAULT_CORRUPT,   /* silent corruption: after each op of `layer`
                              (-1: every op) one output element is moved by
                              `magnitude` times the row's RMS */
    PX_RT_FAULT_CRASH,     /* the worker aborts at its next step */
    PX_RT_FAULT_MEMORY,    /* the worker takes `bytes` more of its device's
                              memory (memory pressure) */
    PX_RT_FAULT_KILL,      /* SIGKILL: the device is lost */
    PX_RT_FAULT_STOP,      /* SIGSTOP: the device hangs */
    PX_RT_FAULT_KIND_COUNT_
} px_rt_fault_kind;

/* "clear", "link", "slow", "corrupt", "crash", "memory", "kill", "stop". */
const char *px_rt_fault_kind_name(px_rt_fault_kind k);

typedef struct px_rt_fault {
    px_rt_fault_kind kind;
    uint32_t stage;
    px_rt_link_faults link; /* LINK */
    double factor;          /* SLOW: final slowdown, >= 1 */
    double tau_s;           /* SLOW: time constant; 0: at once */
    int32_t layer;          /* CORRUPT: the layer, -1: every op */
    double magnitude;       /* CORRUPT: > 0 */
    uint64_t bytes;         /* MEMORY */
    uint64_t seed;          /* CORRUPT: which element */
} px_rt_fault;

/* Injects a fault into the running pipeline.  KILL and STOP return once
 * the process table shows the signal took effect (at most 1 s); the other
 * kinds once the FAULT frame came back around the ring.  A LINK fault
 * replaces the stage's link faults; MEMORY faults add up (at most 8 per
 * stage) until CLEAR, and after MEMORY and CLEAR the stages' descriptions
 * are read again, so px_rt_executor_stage_device shows the new
 * memory_free.  SLOW's extra time shows in the stage's compute and op
 * telemetry.  A stage that cannot hold a MEMORY fault's bytes fails (its
 * error names the device and the bytes) and the pipeline with it.  Call
 * between steps (between generations, or from a supervisor's
 * before_step).  Errors: PX_EINVAL (a stage out of
 * range, a bad parameter, naming it), PX_ESTATE (the pipeline failed
 * before, or the stage already ended), the transport's naming the
 * stage. */
PX_NODISCARD px_status px_rt_executor_inject(px_rt_executor *ex, const px_rt_fault *f, px_err *err);

/* The health of stage i's worker, from the process table (the
 * executor's heartbeat: it never waits).  *detail (may be NULL) gets "killed by
 * signal 9 (Killed)" or "" .  PX_RT_STAGE_RUNNING for i out of range. */
px_rt_stage_state px_rt_executor_stage_health(px_rt_executor *ex, uint32_t i, char *detail,
                                              size_t cap);
/* Kills every stage worker that still runs (its own processes with
 * SIGKILL, launched ones through the launcher), so that freeing a failed
 * executor does not wait for a stopped worker. */
void px_rt_executor_kill_stages(px_rt_executor *ex);
/* The stage a failure of the ring is blamed on (killed or exited first,
 * else stopped), or -1 when none is known. */
int px_rt_executor_culprit(px_rt_executor *ex);
/* Limits each wait for a step's result to ms (0: the executor's timeout),
 * so that a hung stage is found within a deadline the caller derives from
 * the predicted step time. */
void px_rt_executor_set_step_timeout(px_rt_executor *ex, int ms);
/* The spec the executor runs (borrowed). */
const px_rt_pipeline_spec *px_rt_executor_spec(const px_rt_executor *ex);

/* One step of a generation, as the supervisor sees it.  Pointers are
 * valid during the callback only. */
typedef struct px_rt_step_obs {
    uint64_t index; /* steps of this generation so far, from 0 */
    bool prefill;   /* a prefill micro-batch (else one decode token) */
    bool replay;    /* re-run while rebuilding KV caches */
    uint32_t n_seqs, n_rows;
    const uint32_t *prompt;   /* n_seqs: the prompt index of each entry */
    const uint32_t *pos;      /* n_seqs: its first position */
    const uint32_t *n_tokens; /* n_seqs */
    const int32_t *tokens;    /* n_rows: the tokens the step embedded */
    uint64_t tokens_out;      /* tokens produced before this step, all prompts */
    uint64_t t_send_ns;       /* CLOCK_MONOTONIC when the step was sent */
    uint64_t wall_ns;         /* send to result */
    uint32_t n_stages;
    uint64_t compute_ns[PX_RT_MAX_STAGES];
    uint64_t xfer_in_ns[PX_RT_MAX_STAGES]; /* the hop into stage i */
    uint64_t xfer_out_ns;                  /* the last stage to the executor */
    const float *logits;                   /* n_seqs rows of vocab values */
    uint32_t vocab;
    /* Audited steps (PX_RT_STEP_AUDIT): audit[i] is stage i's output row
     * for the step's first row (hidden states, dim values; the last
     * stage's is its logits row, vocab values); NULL otherwise. */
    const float *audit[PX_RT_MAX_STAGES];
    uint32_t audit_len[PX_RT_MAX_STAGES];
} px_rt_step_obs;

/* What a supervisor asks for after a step. */
typedef struct px_rt_step_verdict {
    /* Continue on this executor from now on (the supervisor owns it): the
     * generation rebuilds its state on it (see px_rt_supervisor) and the
     * old one is handed back through `switched`. */
    px_rt_executor *switch_to;
    /* With switch_to: keep only the first `keep_steps` steps (the rest are
     * taken back and generated again: rollback after corruption);
     * UINT64_MAX keeps every step. */
    uint64_t keep_steps;
    /* Audit the next step. */
    bool audit_next;
} px_rt_step_verdict;

/* How a rebuild went. */
typedef struct px_rt_rebuild_info {
    uint64_t steps_replayed;  /* steps re-run to rebuild the KV caches */
    uint64_t tokens_replayed; /* rows those steps carried */
    uint64_t steps_dropped;   /* steps taken back (rollback) */
    uint64_t tokens_dropped;  /* tokens produced by them, taken back */
    uint64_t ns;              /* wall time of the rebuild */
    /* Every replayed step produced the token recorded the first time
     * (the rebuild is bit for bit; when false, the recorded tokens were
     * kept and first_mismatch_step says where they parted). */
    bool identical;
    uint64_t first_mismatch_step;
} px_rt_rebuild_info;

/* A supervisor of one generation (px_rt_generate_opts.supervisor).  Every
 * slot is optional.  Recovery: the generation keeps a log of its steps
 * and the tokens each produced; on a new executor it re-adds its
 * sequences and re-runs the logged steps in the same order and shapes (so
 * that with the same kernels every KV cache is rebuilt bit for bit),
 * forcing the recorded tokens and emitting nothing, then goes on.  An
 * executor to continue on must run the same model with at least the
 * generation's sequences, context and rows per step (else PX_EINVAL).
 * Every executor the generation leaves, the caller's included, comes back
 * through `switched` exactly once (one left during a rebuild comes back
 * when the next rebuild begins); when the generation fails, the ones not
 * handed back stay with whoever made them.  A switch asked for (switch_to)
 * and not made when a step fails is dropped before `recover` is called:
 * that executor never comes back through `switched` and stays the
 * supervisor's, which recover may free. */
struct px_rt_supervisor {
    /* Before each step (obs has index, prefill, the entries and tokens;
     * no timings): inject faults, set deadlines.  Not called for replayed
     * steps.  A status other than PX_OK ends the generation with it. */
    px_status (*before_step)(void *ud, px_rt_executor *ex, const px_rt_step_obs *next, px_err *err);
    /* After each step, replayed ones included (obs.replay).  Fill *v to
     * switch executors or audit the next step. */
    px_status (*after_step)(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                            px_rt_step_verdict *v, px_err *err);
    /* A step failed with st (why says how; ex is unusable).  Return PX_OK
     * with *replacement set to go on there, or an error to end the
     * generation (st and why are kept when it returns st). */
    px_status (*recover)(void *ud, px_rt_executor *failed, px_status st, const px_err *why,
                         px_rt_executor **replacement, px_err *err);
    /* The state was rebuilt on `now` (after recover or switch_to);
     * `before` is the executor left (the supervisor may free it). */
    void (*switched)(void *ud, px_rt_executor *before, px_rt_executor *now,
                     const px_rt_rebuild_info *info);
    /* Tokens of prompt i past its first `kept` were taken back (rollback);
     * they will be produced again through on_token. */
    void (*retracted)(void *ud, uint32_t prompt, uint32_t kept);
    void *ud;
};

/* Per-op telemetry of one stage: totals per (layer, op kind). */
typedef struct px_rt_op_total {
    int32_t layer;
    px_ir_op_kind kind;
    uint64_t count, ns, flops, bytes;
} px_rt_op_total;

typedef struct px_rt_stage_stats {
    uint64_t prefill_steps, prefill_rows, prefill_ns; /* compute in prefill */
    uint64_t decode_steps, decode_ns;                 /* compute in decode */
    uint64_t xfer_in_prefill_ns, xfer_in_decode_ns;   /* into this stage */
    px_rt_op_total *ops; /* owned by the stats (px_rt_pipeline_stats_release) */
    size_t n_ops;
} px_rt_stage_stats;

typedef struct px_rt_pipeline_stats {
    uint32_t n_stages;
    px_rt_stage_stats stages[PX_RT_MAX_STAGES];
    uint64_t xfer_out_prefill_ns, xfer_out_decode_ns; /* last stage -> executor */
    px_rt_generate_stats gen;                         /* end to end, as px_rt_generate's */
    uint64_t ttft_ns;                                 /* first prompt's first token */
    uint64_t decode_steps;
    uint32_t n_prompts;
} px_rt_pipeline_stats;

void px_rt_pipeline_stats_release(px_rt_pipeline_stats *st); /* NULL is a no-op */

/* Generates like px_rt_generate, through the pipeline: prefill in
 * micro-batches of max_batch_tokens rows, then one token per unfinished
 * prompt per step; prompts decode together.  stats (may be NULL) gets the
 * telemetry (release it with px_rt_pipeline_stats_release).  With a
 * supervisor (o->supervisor) the generation may move to other executors
 * (recovery, adaptation): the stats then describe the stages of the last
 * one, and gen totals count every token once (replayed steps are not
 * counted).  On failure the pipeline is unusable; free it.  Errors:
 * px_rt_generate's, and the transport's naming the stage (stage index,
 * device, pid) that died, stopped answering or failed. */
PX_NODISCARD px_status px_rt_executor_generate(px_rt_executor *ex, const px_rt_tokenizer *t,
                                               const px_rt_generate_opts *o,
                                               px_rt_pipeline_stats *stats, px_err *err);

/* The predicted-versus-observed report: per stage, decode time per token
 * and prefill time against the plan's intervals (inside or outside), end
 * to end, and tokens/s; every line naming an emulated device says so.
 * Appends to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_rt_pipeline_report(const px_rt_pipeline_spec *spec,
                                             const px_rt_executor *ex,
                                             const px_rt_pipeline_stats *st, px_strbuf *out);
/* The same as a JSON object (new reference; NULL on allocation
 * failure). */
json_t *px_rt_pipeline_report_json(const px_rt_pipeline_spec *spec, const px_rt_executor *ex,
                                   const px_rt_pipeline_stats *st);

/* ================================================================== */
/* The generation engine: continuous batching                          */
/* ================================================================== */
/*
 * One engine runs every generation: `plexus generate` (a session in this
 * process), `plexus run` (stage workers through an executor) and `plexus
 * serve` (requests arriving over HTTP).  It schedules at the granularity
 * of steps (Orca's iteration-level scheduling): requests join at a step
 * boundary and leave when done.  Each step carries one token for every
 * running sequence that decodes, then chunks of the prompts of sequences
 * still prefilling, up to a budget of rows per step (Sarathi-Serve's
 * chunked prefill mixed with decode).  The KV cache is paged (vLLM's
 * blocks, see px_rt_session_opts.kv_blocks): a request is admitted when
 * the cache has the blocks its tokens need, and when a running sequence
 * needs a block that is not free, the youngest running sequence is
 * preempted: its blocks are freed and it waits at the head of the queue,
 * to be prefilled again with every token it had (recompute), emitting
 * nothing twice.  Through a pipeline of S stages up to S micro-batches are
 * in flight, each with its own sequences, so that the stages work at the
 * same time.
 *
 * Because a row's result never depends on the other rows of its step
 * (see the ops above), a request's tokens do not depend on what runs
 * beside it, on how its prompt was chunked, or on preemptions: its greedy
 * output is the same alone or among many, in one process or through a
 * pipeline.  The same property rebuilds the KV caches after a fault: on a
 * new executor every sequence is prefilled again, and the engine checks
 * bit for bit that the logits that produced each sequence's last token
 * come out the same.
 *
 *     px_rt_engine_opts eo = {.session = s, .tokenizer = t};
 *     px_rt_engine *e;
 *     px_rt_engine_new(&eo, &e, &err);
 *     px_rt_request r = {.prompt = ids, .n_prompt = n, .max_new_tokens = 64,
 *                        .on_token = print_token, .ud = NULL};
 *     uint64_t id;
 *     px_rt_engine_submit(e, &r, &id, &err);
 *     px_rt_engine_run(e, &err);          // until every request is done
 *     px_rt_engine_free(e);
 *
 * Threads: px_rt_engine_submit, px_rt_engine_cancel, px_rt_engine_wait
 * and px_rt_engine_metrics_get may be called from any thread; step and
 * run from one thread at a time (the engine's thread), and the requests'
 * callbacks run on it, inside step.
 */

typedef struct px_rt_engine px_rt_engine;

/* Why a request ended. */
typedef enum px_rt_finish {
    PX_RT_FINISH_STOP = 1,  /* an end token (EOS, BOS or a stop token), or on_token said stop */
    PX_RT_FINISH_LENGTH,    /* max_new_tokens produced */
    PX_RT_FINISH_CONTEXT,   /* the context is full */
    PX_RT_FINISH_CANCELLED, /* px_rt_engine_cancel */
    PX_RT_FINISH_ERROR,     /* the engine failed */
} px_rt_finish;

/* "stop", "length", "context", "cancelled", "error". */
const char *px_rt_finish_name(px_rt_finish f);

#define PX_RT_MAX_LOGPROBS 20

/* A token produced for a request. */
typedef struct px_rt_token_event {
    uint64_t id;    /* the request's */
    uint32_t index; /* tokens the request produced before this one */
    int32_t token;
    const char *piece; /* its text after the previous token (not NUL-terminated) */
    size_t len;
    float logprob;  /* ln p(token) under the model's distribution (the
                       logits' softmax at temperature 1); NAN unless asked */
    uint32_t n_top; /* alternatives asked for, most likely first */
    int32_t top_token[PX_RT_MAX_LOGPROBS];
    float top_logprob[PX_RT_MAX_LOGPROBS];
} px_rt_token_event;

/* What a request cost, at its end. */
typedef struct px_rt_request_stats {
    uint32_t prompt_tokens, new_tokens;
    uint32_t preemptions;
    uint64_t queue_ns; /* submission to first admission */
    uint64_t ttft_ns;  /* submission to the first token; 0 when none */
    uint64_t total_ns; /* submission to the end */
} px_rt_request_stats;

typedef struct px_rt_request {
    const int32_t *prompt; /* token ids, BOS included when wanted (copied) */
    uint32_t n_prompt;     /* >= 1, at most the context */
    /* Tokens to produce at most; 0: none (the prompt is only prefilled);
     * UINT32_MAX: until an end token or the context. */
    uint32_t max_new_tokens;
    px_rt_sampler_opts sampling;
    bool ignore_eos;            /* EOS and BOS do not end the request */
    const int32_t *stop_tokens; /* more end tokens (copied), at most 16 */
    uint32_t n_stop_tokens;
    bool logprobs;         /* fill px_rt_token_event.logprob */
    uint32_t top_logprobs; /* alternatives per token, at most PX_RT_MAX_LOGPROBS */
    /* On the engine's thread.  on_token returns false to end the request
     * (finish STOP: the caller found a stop string). */
    bool (*on_token)(void *ud, const px_rt_token_event *ev);
    /* Exactly once per request, after its last token; err is NULL unless
     * why is PX_RT_FINISH_ERROR. */
    void (*on_finish)(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err);
    /* (optional) The request's tokens past the first `kept` were taken
     * back (a rollback after silent corruption); they come again through
     * on_token. */
    void (*on_retract)(void *ud, uint64_t id, uint32_t kept);
    void *ud;
} px_rt_request;

typedef struct px_rt_engine_opts {
    /* The runner: a session holding the whole model (borrowed), or an
     * executor (borrowed; with a supervisor, the engine may move to the
     * executors it hands over).  Exactly one. */
    px_rt_session *session;
    px_rt_executor *executor;
    const px_rt_tokenizer *tokenizer; /* borrowed; required */
    uint32_t max_running;   /* sequences running at once; 0 (or more): the runner's max_seqs */
    uint32_t step_tokens;   /* rows per step; 0 (or more): the runner's max_batch_tokens */
    uint32_t max_waiting;   /* requests queued; 0: 1024.  More: PX_ELIMIT */
    uint32_t micro_batches; /* steps in flight; 0: the pipeline's stages (1 for a session) */
    const px_rt_supervisor *supervisor; /* borrowed; executor only; may be NULL */
    /* (optional) Filled as steps run: the generation's totals and, through
     * a pipeline, every stage's compute and transfers (borrowed). */
    px_rt_pipeline_stats *stats;
} px_rt_engine_opts;

/* Checks the options.  Returns owned (px_rt_engine_free).  Errors:
 * PX_EINVAL (no runner or two, a session without the whole model, a
 * tokenizer of another vocabulary), PX_ENOMEM. */
PX_NODISCARD px_status px_rt_engine_new(const px_rt_engine_opts *o, px_rt_engine **out,
                                        px_err *err);
/* Requests still queued or running end with PX_RT_FINISH_CANCELLED
 * (their callbacks run here, on the caller's thread).  The runner is
 * left to its owner.  NULL is a no-op. */
void px_rt_engine_free(px_rt_engine *e);

/* Queues a request (thread-safe); *id names it.  Errors: PX_EINVAL (an
 * empty prompt, a token outside the vocabulary, too many stop tokens or
 * logprobs, naming the field), PX_ELIMIT (a prompt longer than the
 * context or than the KV cache holds, naming both; the queue is full:
 * retry later), PX_ESTATE (the engine failed), PX_ENOMEM.  A request that
 * fails here never calls its callbacks. */
PX_NODISCARD px_status px_rt_engine_submit(px_rt_engine *e, const px_rt_request *r, uint64_t *id,
                                           px_err *err);
/* Asks for a request to end (thread-safe): it finishes with
 * PX_RT_FINISH_CANCELLED at the next step boundary, its KV blocks freed.
 * An unknown or finished id is ignored. */
void px_rt_engine_cancel(px_rt_engine *e, uint64_t id);

/* Runs one step: takes in new requests and cancellations, schedules,
 * sends steps until `micro_batches` are in flight, then takes the oldest
 * step's result and produces its tokens.  *busy (may be NULL) says
 * whether requests remain.  Errors: the runner's, when no supervisor
 * recovered it; every request then ends with PX_RT_FINISH_ERROR and the
 * engine accepts no more. */
PX_NODISCARD px_status px_rt_engine_step(px_rt_engine *e, bool *busy, px_err *err);
/* Steps until no request is queued or running. */
PX_NODISCARD px_status px_rt_engine_run(px_rt_engine *e, px_err *err);
/* Waits up to timeout_ms for a new request or cancellation (thread-safe);
 * returns at once when requests are queued or running. */
void px_rt_engine_wait(px_rt_engine *e, int timeout_ms);
/* Wakes a px_rt_engine_wait (thread-safe), e.g. to shut a server down. */
void px_rt_engine_wake(px_rt_engine *e);

/* What the engine is doing, for metrics (thread-safe snapshot). */
typedef struct px_rt_engine_metrics {
    uint32_t running, waiting, in_flight;
    uint32_t kv_block_size, kv_blocks, kv_blocks_used;
    uint64_t submitted, finished, cancelled, failed, rejected;
    uint64_t steps, prompt_tokens, new_tokens, recomputed_tokens;
    uint64_t preemptions;
    uint64_t busy_ns; /* time spent in steps */
    uint64_t recoveries;
} px_rt_engine_metrics;

void px_rt_engine_metrics_get(px_rt_engine *e, px_rt_engine_metrics *out);
/* The executor the engine runs on now (it may have moved), or NULL. */
px_rt_executor *px_rt_engine_executor(const px_rt_engine *e);
/* Asks every stage for its telemetry (executor only) into stats, which
 * must be the engine's stats.  Errors: the transport's. */
PX_NODISCARD px_status px_rt_engine_gather_stats(px_rt_engine *e, px_err *err);

/* ------------------------------------------------------------------ */
/* Profiling (microbenchmarks for calibration)                         */
/* ------------------------------------------------------------------ */
/*
 * Times the work a stage worker does, in this process, on a device of a
 * backend: prefill and decode steps of a session at the model's own shapes
 * and dtypes (matrix-vector and matrix-matrix products, attention at a
 * growing context), each step split by op class from the stream's
 * telemetry, and copies through the kind of link the transport uses (a
 * Unix socket to a peer thread).  The cost model's calibration
 * (plexus/cost.h) turns these timings into corrections.
 *
 *     px_rt_profile_opts po = {.backend = "emu", .emu = &profile, .decode_steps = 32};
 *     px_rt_profile_result r;
 *     px_rt_profile_run(model, &po, &r, &err);
 *     ... r.decode[i].ns, r.decode[i].attention_ns ...
 *     px_rt_profile_result_release(&r);
 */

typedef struct px_rt_profile_opts {
    const char *backend;          /* "cpu" (NULL), "emu" or "cuda" */
    const px_rt_emu_profile *emu; /* backend "emu": its profile (borrowed) */
    uint32_t n_threads;           /* 0: 1, as a stage worker by default */
    uint32_t layer_begin;         /* layers held: [layer_begin, layer_end) */
    uint32_t layer_end;           /* 0: the model's last */
    uint32_t prompt_tokens;       /* rows of the prefill step; 0: 8 */
    uint32_t decode_steps;        /* decode steps timed; 0: 32 */
    uint32_t warmup_steps;        /* untimed steps first; 0: 4 */
    /* Idle time before each timed step, as a stage worker waits for its
     * next step while the rest of the ring runs (caches cool down, the
     * core may sleep); 0: none. */
    uint32_t idle_us;
} px_rt_profile_opts;

/* One timed step. */
typedef struct px_rt_profile_step {
    uint32_t rows;         /* rows of the step */
    uint32_t context;      /* positions cached after the step */
    uint64_t ns;           /* px_rt_forward, wall time */
    uint64_t attention_ns; /* attention ops */
    uint64_t matmul_ns;    /* matrix products and the classifier */
    uint64_t other_ns;     /* norms, rope, activations, residuals, embedding */
} px_rt_profile_step;

typedef struct px_rt_profile_result {
    px_rt_profile_step prefill; /* the prompt after the warm-up */
    px_rt_profile_step *decode; /* owned (px_rt_profile_result_release) */
    size_t n_decode;
    px_rt_device_props device; /* what ran it */
    uint32_t layer_begin, layer_end;
    bool embedding, head;
} px_rt_profile_result;

/* Opens a device of o->backend, a session holding the layers asked for
 * (the embedding with layer 0, the head with the last; a session that
 * starts after layer 0 is fed hidden states), warms it up, then times one
 * prefill of prompt_tokens rows and decode_steps decode steps of one
 * sequence.  model is borrowed.  Errors: PX_EINVAL (options, naming
 * them), the session's and the backend's. */
PX_NODISCARD px_status px_rt_profile_run(const px_rt_model *model, const px_rt_profile_opts *o,
                                         px_rt_profile_result *out, px_err *err);
void px_rt_profile_result_release(px_rt_profile_result *r); /* NULL is a no-op */

/* Times n_reps one-way copies of `bytes` bytes (at most 64 MiB) through a
 * Unix stream socket to a peer thread that sends them back; ns gets
 * n_reps one-way times (half of each round trip).  Errors: PX_EINVAL,
 * PX_EIO, PX_ENOMEM. */
PX_NODISCARD px_status px_rt_profile_copy(size_t bytes, uint32_t n_reps, uint64_t *ns, px_err *err);

/* ------------------------------------------------------------------ */
/* Quantizing model files                                              */
/* ------------------------------------------------------------------ */

/* What px_rt_quantize_file did. */
typedef struct px_rt_quantize_stats {
    uint32_t n_tensors;                   /* tensors written */
    uint32_t n_quantized;                 /* of them, quantized here */
    uint32_t n_by_dtype[PX_DTYPE_COUNT_]; /* tensors written per dtype */
    uint64_t bytes_in, bytes_out;         /* tensor data */
    uint64_t n_values;                    /* values quantized */
    double rmse;                          /* root mean square of (dequantized - source) over them */
} px_rt_quantize_stats;

/* Writes the GGUF model at in_path (f32, f16 or bf16 tensors) to out_path
 * with its matrices quantized by `recipe`, llama.cpp's mixes as its
 * quantize tool makes them without an importance matrix: "q8_0", "q4_0"
 * (output.weight Q6_K), "q4_k_m" and "q5_k_m" (Q4_K / Q5_K, with Q6_K
 * for output.weight and for attn_v and ffn_down in the layers that get
 * more bits), "q6_k".  Blocks are made as ggml's reference quantizer
 * makes them.  A matrix whose rows do not fill whole blocks falls back
 * (Q4_K: Q5_0; Q5_K, Q6_K: Q8_0; then f16); vectors (norms) are kept.
 * Metadata is copied, with general.file_type and
 * general.quantization_version set.  out_path is written through a
 * temporary file.  stats may be NULL.  Errors: PX_EINVAL (unknown
 * recipe, naming the known ones), PX_EUNSUPPORTED (a tensor already
 * quantized, or not a GGUF file), PX_EVALIDATE (a NaN or infinite weight,
 * naming the tensor and row), the reader's and the writer's. */
PX_NODISCARD px_status px_rt_quantize_file(const char *in_path, const char *out_path,
                                           const char *recipe, px_rt_quantize_stats *stats,
                                           px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_RT_H */
