/*
 * Private declarations shared by the files of the ir module.
 */
#ifndef PX_IR_IMPL_H
#define PX_IR_IMPL_H

#include "base/common.h"
#include "plexus/ir.h"

/* Bounds applied to every model file (they are far above any real model
 * and far below what would exhaust memory). */
#define PX__IR_MAX_TENSORS     (1u << 20)
#define PX__IR_MAX_KV          (1u << 16)
#define PX__IR_MAX_KEY_LEN     65535u
#define PX__IR_MAX_STRING      (16u << 20)
#define PX__IR_MAX_ARRAY       (1u << 26)
#define PX__IR_MAX_ARRAY_DEPTH 4
#define PX__IR_MAX_ALIGNMENT   (1u << 20)
#define PX__IR_MAX_ELEMS       (UINT64_C(1) << 50)
#define PX__IR_MAX_TOKEN_LEN   65536u
#define PX__IR_MAX_VOCAB       (1u << 22)

/* Hyper-parameter bounds: beyond these a file is refused as absurd. */
#define PX__IR_MAX_DIM      (1u << 17)
#define PX__IR_MAX_HIDDEN   (1u << 20)
#define PX__IR_MAX_LAYERS   4096u
#define PX__IR_MAX_HEADS    4096u
#define PX__IR_MAX_HEAD_DIM 4096u
#define PX__IR_MAX_CONTEXT  (1u << 24)
#define PX__IR_MAX_EXPERTS  1024u

/* ---- expressions ---- */

typedef enum px__expr_op {
    PX__E_CONST = 0,
    PX__E_B,
    PX__E_S,
    PX__E_T,
    PX__E_ADD,
    PX__E_SUB,
    PX__E_MUL,
    PX__E_DIV,
    PX__E_CDIV,
    PX__E_MIN,
    PX__E_MAX,
    PX__E_PAIRS, /* attention pairs of (S, T); k = window; causal flag in k2 */
    PX__E_MOE,   /* experts touched: k = n_experts, k2 = used, a = tokens */
} px__expr_op;

struct px_ir_expr {
    px__expr_op op;
    uint64_t k, k2;
    const px_ir_expr *a, *b;
};

/* Builders: allocate from arena; NULL in, or out of memory, gives NULL
 * (callers check once at the end).  Constants fold. */
const px_ir_expr *px__e_const(px_arena *a, uint64_t k);
const px_ir_expr *px__e_var(px_arena *a, px__expr_op var);
const px_ir_expr *px__e_bin(px_arena *a, px__expr_op op, const px_ir_expr *x, const px_ir_expr *y);
const px_ir_expr *px__e_pairs(px_arena *a, uint32_t window, bool causal);
const px_ir_expr *px__e_moe(px_arena *a, uint32_t n_experts, uint32_t n_used,
                            const px_ir_expr *tokens);
/* Sum of terms k_tok*B*S + k_pair*B*pairs + k_seq*B + k_const, skipping
 * zero coefficients (0 when all are zero). */
const px_ir_expr *px__e_cost(px_arena *a, uint64_t k_tok, uint64_t k_seq, uint64_t k_const,
                             uint64_t k_pair, const px_ir_expr *pairs);

/* Exact attention pair counts. */
bool px__attention_pairs(uint64_t S, uint64_t T, uint32_t window, bool causal, uint64_t *out);

/* ---- GGUF metadata ---- */

typedef struct px__gguf_kv {
    const char *key; /* NUL-terminated copy */
    px_gguf_type type;
    px_gguf_type elem_type; /* arrays: element type */
    uint64_t n;             /* arrays: element count */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } v;             /* scalars (bool in u) */
    const char *str; /* strings: NUL-terminated copy */
    uint64_t str_len;
    const uint8_t *arr; /* arrays: first element in the image */
    uint64_t offset;    /* byte offset of the value in the file */
    const char *text;   /* short rendering for listings */
} px__gguf_kv;

/* Adds a pair whose value is already serialized (len bytes as GGUF
 * stores a value of type t, e.g. copied from another file) (gguf_write.c). */
px_status px__ir_gguf_writer_add_raw(px_ir_gguf_writer *w, const char *key, px_gguf_type t,
                                     const void *value, size_t len, px_err *err);

/* ---- the model ---- */

#define PX__IR_NO_TENSOR UINT32_MAX

struct px_ir_model {
    px_arena *arena;
    const char *path; /* in arena */
    px_ir_source source;
    uint32_t gguf_version;
    bool has_weights;

    /* The file image: mapped (map != NULL) or borrowed memory. */
    void *map;
    size_t map_len;
    const uint8_t *image;
    size_t image_len;

    px__gguf_kv *kvs;
    size_t n_kvs;

    px_ir_tensor *tensors;
    size_t n_tensors;
    uint32_t *name_index;  /* open addressing, PX__IR_NO_TENSOR empty */
    size_t name_index_cap; /* power of two */

    px_ir_hparams hp;
    px_dtype act_dtype, kv_dtype;
    bool kv_dtype_given; /* kv_dtype came from px_ir_open_opts */
    /* (n_layers + 1) * PX_IR_ROLE_COUNT_ tensor ids; row 0 holds the
     * global roles, row 1 + i layer i's. */
    uint32_t *roles;

    px_ir_vocab vocab;
    bool has_vocab;

    /* The graph. */
    px_ir_value *values;
    size_t n_values, cap_values;
    px_ir_op *ops;
    size_t n_ops, cap_ops;
    px_ir_region *regions;
    size_t n_regions, cap_regions;
    px_ir_kv_desc *kv;
    size_t n_kv;

    px_ir_layer_cost *rows;
    uint32_t n_rows;
};

/* Allocates an empty model with its arena. */
px_status px__ir_model_alloc(const char *path, px_ir_source source, px_ir_model **out, px_err *err);
/* Tensor table: allocate n entries, then index names (refusing
 * duplicates). */
px_status px__ir_index_tensors(px_ir_model *m, px_err *err);
uint32_t px__ir_find_tensor_id(const px_ir_model *m, const char *name);
/* Expected shape of a role's tensor for the hyper-parameters; false when
 * the role does not apply. */
bool px__ir_role_shape(const px_ir_hparams *hp, px_ir_role r, uint32_t *n_dims,
                       uint64_t ne[PX_IR_MAX_DIMS]);
/* The GGUF-style name of a role's tensor ("blk.3.attn_q.weight"). */
const char *px__ir_role_tensor_name(px_arena *a, px_ir_role r, uint32_t layer);
/* Whether the architecture needs the role (false: optional or absent). */
bool px__ir_role_required(const px_ir_hparams *hp, px_ir_role r);
/* Checks hyper-parameters for absurd values. */
px_status px__ir_check_hparams(const px_ir_model *m, px_err *err);
/* Binds roles to tensors by name, checks required tensors and shapes,
 * sets the tied flag, builds the graph and the cost summary. */
px_status px__ir_finish(px_ir_model *m, const px_ir_open_opts *opts, px_err *err);

/* Readers (fill an allocated model). */
/* Bytes of one value of a GGUF scalar type; 0 for strings, arrays and
 * unknown types.  Shared by the reader and the writer. */
uint32_t px__gguf_scalar_size(uint32_t t);
px_status px__ir_gguf_parse(px_ir_model *m, const px_ir_open_opts *opts, px_err *err);
px_status px__ir_gguf_read_vocab(px_ir_model *m, px_err *err);
px_status px__ir_llama2c_parse(px_ir_model *m, const px_ir_open_opts *opts, px_err *err);
const px__gguf_kv *px__ir_meta_find(const px_ir_model *m, const char *key);

/* Graph and summary. */
px_status px__ir_build_graph(px_ir_model *m, px_err *err);
px_status px__ir_build_graph_dit(px_ir_model *m, px_err *err);
px_status px__ir_build_summary(px_ir_model *m, px_err *err);

/* Graph-building helpers shared by the llama and DiT builders. */
typedef struct px__gb {
    px_ir_model *m;
    px_arena *a;
    uint64_t act;            /* bytes per activation value */
    const px_ir_expr *pairs; /* attended pairs P for the model's attention */
    uint32_t region;
    uint32_t row; /* summary row of the current region */
    int32_t layer;
    uint32_t *weight_value; /* tensor id -> value id */
    bool oom;
    px_ir_op scratch; /* handed out after a failed allocation */
} px__gb;

/* FLOPs of an op: per new token, per sequence, per attended pair. */
typedef struct px__flops {
    uint64_t tok, seq, pair;
} px__flops;

px_status px__gb_begin(px__gb *g, px_ir_model *m, px_err *err);
px_status px__gb_end(px__gb *g, px_err *err);
uint32_t px__gb_value(px__gb *g, const char *name, px_ir_value_kind kind, px_dtype dtype,
                      px_ir_layout layout, uint32_t n_dims, const px_ir_expr *const shape[]);
/* The value of a stored tensor (created once). */
uint32_t px__gb_weight(px__gb *g, const px_ir_tensor *t);
/* An activation [width, S, B], or [width, B] when per_seq. */
uint32_t px__gb_act(px__gb *g, const char *name, uint64_t width, bool per_seq);
void px__gb_region(px__gb *g, const char *name, px_ir_region_kind kind, int32_t layer,
                   uint32_t row);
/* Appends an op; its FLOPs also accumulate into the current summary row.
 * Weight inputs add their bytes to the region's weight bytes. */
px_ir_op *px__gb_op(px__gb *g, px_ir_op_kind kind, const char *name, const uint32_t *in,
                    uint32_t n_in, const uint32_t *outs, uint32_t n_out, px__flops f,
                    const px_ir_expr *bytes_read, const px_ir_expr *bytes_written);
/* k*B*S, k*B, k*B*T and sums, for byte expressions. */
const px_ir_expr *px__gb_tok(px__gb *g, uint64_t k);
const px_ir_expr *px__gb_seq(px__gb *g, uint64_t k);
const px_ir_expr *px__gb_ctx(px__gb *g, uint64_t k);
const px_ir_expr *px__gb_add(px__gb *g, const px_ir_expr *x, const px_ir_expr *y);
/* A projection of d_in to d_out through weight w (+ bias b): appends the
 * op and returns its output value. */
uint32_t px__gb_matmul(px__gb *g, const char *name, uint32_t x, const px_ir_tensor *w,
                       const px_ir_tensor *b, uint64_t d_in, uint64_t d_out, bool per_seq,
                       uint32_t rewrites);

/* Stored bytes of a tensor, 0 for NULL. */
static inline uint64_t px__tbytes(const px_ir_tensor *t)
{
    return t ? t->n_bytes : 0;
}

#endif
