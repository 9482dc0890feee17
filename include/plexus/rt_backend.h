/*
 * plexus/rt_backend.h: tensors, ops and the backend interface of the
 * runtime (device, buffer and stream tables, the registry), the cuda
 * backend and the emu backend.  Part of plexus/rt.h, which includes it and
 * opens with the overview (layers, batches, backends, determinism, thread
 * safety); a user of the backend tables alone may include this header
 * by itself.
 */
#ifndef PLEXUS_RT_BACKEND_H
#define PLEXUS_RT_BACKEND_H

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
    uint32_t layout;      /* px_rt_layout of a matrix of weights; 0 (rows) for the rest */
} px_rt_tensor;

/* How a matrix of weights lies in its buffer.  Every layout takes the bytes of the rows as
 * stored, so that ne and nb keep their meaning for sizes and row strides. */
typedef enum px_rt_layout {
    PX_RT_LAYOUT_ROWS = 0, /* rows one after another, as the model file stores them */
    /* Q4_K rows repacked sixteen to a group, a super-block of every row of the group at a
     * time (the AVX-512 cpu kernels' decode reads them one register a row); rows a multiple of
     * sixteen.  px_rt_weights_repack writes it. */
    PX_RT_LAYOUT_Q4_K_X16 = 1,
} px_rt_layout;

/* Writes the matrix of `rows` rows (row_bytes apart, of dtype) at src in `layout` at dst (the
 * same bytes).  Errors: PX_EINVAL when the layout does not take such a matrix, naming why. */
PX_NODISCARD px_status px_rt_weights_repack(px_rt_layout layout, px_dtype dtype, const void *src,
                                            size_t row_bytes, uint64_t rows, uint64_t cols,
                                            void *dst, px_err *err);

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
#define PX_RT_ABI_MINOR   1u
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
    /* (optional) The layout (px_rt_layout) the device runs a matrix of weights of dtype, of
     * `rows` rows of `cols` values, fastest in; the session repacks the weights into it once.
     * Defaults to PX_RT_LAYOUT_ROWS. */
    uint32_t (*weight_layout)(void *dev, px_dtype dtype, uint64_t cols, uint64_t rows);
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
/* The layout the device takes a matrix of weights in (its weight_layout, or rows). */
px_rt_layout px_rt_device_weight_layout(const px_rt_device *d, px_dtype dtype, uint64_t cols,
                                        uint64_t rows);

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
 * are memory-bound.  Block-quantized weights count one byte per value. */
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

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_RT_BACKEND_H */
