/*
 * plexus/ir.h: the workload IR, and the readers that build it from model
 * files (GGUF v2/v3, llama2.c checkpoints) or from presets.
 *
 * One description of a model serves the planner, the cost model, the
 * contract checker, the simulator and the executor (docs/adr/0001).  A
 * px_ir_model holds:
 *
 *   - the architecture's hyper-parameters (px_ir_hparams);
 *   - the stored weight tensors (px_ir_tensor): name, dtype, shape, and a
 *     const pointer into the read-only memory map of the file (weights are
 *     never copied; a preset has tensors without data);
 *   - the tokenizer vocabulary when the file carries one (px_ir_vocab);
 *   - the graph: values (tensors of the graph, with shapes that are
 *     expressions of B, S and T), ops with their FLOPs and bytes as
 *     expressions, annotations, regions, phases and KV-cache descriptors;
 *   - a per-layer cost summary, precomputed, for the planner's inner loops.
 *
 * Usage:
 *
 *     px_err err;
 *     px_ir_model *m;
 *     if (px_ir_model_open("stories260K.gguf", NULL, &m, &err) != PX_OK) {
 *         fprintf(stderr, "plexus: %s\n", err.msg);
 *         return 1;
 *     }
 *     const px_ir_hparams *hp = px_ir_model_hparams(m);
 *     const px_ir_tensor *wq = px_ir_model_weight(m, 0, PX_IR_ROLE_WQ);
 *     // wq->data points at hp->dim * hp->n_heads * hp->head_dim values of
 *     // wq->dtype, row-major, wq->ne[0] (= hp->dim) values per row.
 *     px_ir_layer_cost lc;
 *     px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(0), &lc);
 *     uint64_t flops = px_ir_decode_flops(&lc, 512);   // layer 0, one token, T=512
 *     px_ir_model_free(m);
 *
 * Conventions (the cost model relies on them; docs/formats/model-ir.md):
 *
 *   Variables.  B: sequences in the batch; S: new tokens per sequence in
 *   this step; T: context length after the step (cached plus new), so
 *   S <= T.  Prefill of a prompt of n tokens is S = T = n; a decode step at
 *   context T is S = 1.  A DiT denoising step over n latent tokens is
 *   S = T = n.
 *
 *   FLOPs.  A multiply-add counts 2 FLOPs.  A projection of d_in to d_out
 *   costs 2*d_in*d_out per token (+ d_out with a bias).  Causal attention:
 *   the new token at position p attends to p+1 positions, so over a step
 *   the number of (query, key) pairs per sequence and head is
 *   P = S*T - S*(S-1)/2 (decode: T; prefill of n: n*(n+1)/2); QK^T costs
 *   2*head_dim*P and AV costs 2*head_dim*P per head, softmax 5*P per head.
 *   Bidirectional attention (DiT) has P = S*T.  Element-wise ops: RMSNorm
 *   4 per element, LayerNorm 8, RoPE 6 per rotated pair (3 per element),
 *   SwiGLU 5 per hidden element, GELU 8, residual add 1, adaLN modulate 2,
 *   gate 2, softmax 5.  Lookups (embedding) cost 0 FLOPs.  The final norm,
 *   the classifier and sampling act on one row per sequence (the last new
 *   token), not on every new token.
 *
 *   Bytes.  Each op reads each weight it uses once per step, whatever B and
 *   S are (weights are streamed once and reused across the batch); it reads
 *   and writes activations at the activation dtype (f32 unless the build
 *   options say otherwise).  Attention reads the K and V of all T positions
 *   once per sequence and writes (appends) S new positions.  An embedding
 *   lookup reads one row per token.  MoE experts: a step touches
 *   E*(1-(1-k/E)^(B*S)) distinct experts on average under uniform routing,
 *   rounded up; this is an assumption, marked as such in the IR.
 *
 *   RoPE pairing.  llama2.c checkpoints and llama-architecture GGUF files
 *   rotate pairs of adjacent dimensions (2i, 2i+1) ("normal" RoPE in
 *   llama.cpp); llama.cpp's converter for Hugging Face checkpoints permutes
 *   the rows of wq and wk so that adjacent pairing matches Hugging Face's
 *   rotate-half.  The tiny models in the shared test folder were converted
 *   from llama2.c checkpoints without any permutation: every tensor of
 *   stories260K.gguf and aidreams260K.gguf equals the corresponding
 *   tensor of the .bin byte for byte (their output.weight is a copy of the
 *   token embedding), so the same adjacent-pair RoPE runs both.  qwen2
 *   GGUF files keep Hugging Face's row order and pair dimension i with
 *   i + head_dim/2 ("neox" RoPE).  px_ir_hparams.rope_style says which.
 *
 * Thread safety: a px_ir_model is immutable after it is built; any number
 * of threads may read it (and the mapped weights) at once.
 */
#ifndef PLEXUS_IR_H
#define PLEXUS_IR_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Data types                                                          */
/* ------------------------------------------------------------------ */

/* Element types.  Block-quantized types store blocks of block_elems values
 * in block_bytes bytes (scales included); a row's length must be a multiple
 * of block_elems.  Values only ever get added at the end. */
typedef enum px_dtype {
    PX_DTYPE_F32 = 0,
    PX_DTYPE_F16,
    PX_DTYPE_BF16,
    PX_DTYPE_F64,
    PX_DTYPE_FP8_E4M3, /* not a GGUF type: for planning lowered precision */
    PX_DTYPE_FP8_E5M2, /* likewise */
    PX_DTYPE_I8,
    PX_DTYPE_I16,
    PX_DTYPE_I32,
    PX_DTYPE_I64,
    PX_DTYPE_Q4_0, /* 32 values in 18 bytes */
    PX_DTYPE_Q4_1, /* 32 in 20 */
    PX_DTYPE_Q5_0, /* 32 in 22 */
    PX_DTYPE_Q5_1, /* 32 in 24 */
    PX_DTYPE_Q8_0, /* 32 in 34: one f16 scale, 32 int8 */
    PX_DTYPE_Q2_K, /* 256 in 84 */
    PX_DTYPE_Q3_K, /* 256 in 110 */
    PX_DTYPE_Q4_K, /* 256 in 144 */
    PX_DTYPE_Q5_K, /* 256 in 176 */
    PX_DTYPE_Q6_K, /* 256 in 210 */
    PX_DTYPE_Q8_K, /* 256 in 292 */
    PX_DTYPE_IQ2_XXS,
    PX_DTYPE_IQ2_XS,
    PX_DTYPE_IQ3_XXS,
    PX_DTYPE_IQ1_S,
    PX_DTYPE_IQ4_NL,
    PX_DTYPE_IQ3_S,
    PX_DTYPE_IQ2_S,
    PX_DTYPE_IQ4_XS,
    PX_DTYPE_IQ1_M,
    PX_DTYPE_TQ1_0,
    PX_DTYPE_TQ2_0,
    PX_DTYPE_COUNT_
} px_dtype;

/* Lower-case name ("f32", "q8_0", "fp8_e4m3"); "?" for an invalid value. */
const char *px_dtype_name(px_dtype t);
/* Parses a name (case-insensitive; "fp8" means fp8_e4m3).  PX_EINVAL with
 * the list of known names when unknown. */
PX_NODISCARD px_status px_dtype_parse(const char *name, px_dtype *out, px_err *err);
/* Values per block and bytes per block (1 and the element size for plain
 * types).  0 for an invalid value. */
uint32_t px_dtype_block_elems(px_dtype t);
uint32_t px_dtype_block_bytes(px_dtype t);
/* Average bytes per value (block_bytes / block_elems). */
double px_dtype_bytes_per_elem(px_dtype t);
/* Whether t is block-quantized (block_elems > 1). */
bool px_dtype_is_quantized(px_dtype t);
/* Bytes of n values: false when n is not a multiple of the block size or
 * the result overflows. */
bool px_dtype_nbytes(px_dtype t, uint64_t n, uint64_t *out);
/* The GGML type id stored in GGUF files, or -1 (fp8 has none). */
int px_dtype_to_ggml(px_dtype t);
/* The dtype of a GGML type id; false for unknown or unsupported ids. */
bool px_dtype_from_ggml(uint32_t ggml_type, px_dtype *out);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float px_f16_to_f32(uint16_t h);
uint16_t px_f32_to_f16(float f);
float px_bf16_to_f32(uint16_t h);
uint16_t px_f32_to_bf16(float f);

/* ------------------------------------------------------------------ */
/* Hyper-parameters                                                    */
/* ------------------------------------------------------------------ */

typedef enum px_ir_arch {
    PX_IR_ARCH_LLAMA = 0, /* llama, llama2.c, Llama 3: RMSNorm, RoPE, GQA, SwiGLU */
    PX_IR_ARCH_MISTRAL,   /* llama family with a sliding attention window */
    PX_IR_ARCH_QWEN2,     /* llama family with q/k/v biases and neox RoPE */
    PX_IR_ARCH_MIXTRAL,   /* llama family with a mixture of experts in the FFN */
    PX_IR_ARCH_DIT,       /* diffusion transformer: patches, adaLN, no KV cache */
    PX_IR_ARCH_COUNT_
} px_ir_arch;

/* "llama", "mistral", "qwen2", "mixtral", "dit". */
const char *px_ir_arch_name(px_ir_arch a);

/* How RoPE pairs dimensions (see the conventions above). */
typedef enum px_ir_rope_style {
    PX_IR_ROPE_NONE = 0,     /* no rotary embedding (DiT) */
    PX_IR_ROPE_ADJACENT = 1, /* pairs (2i, 2i+1): llama2.c, llama.cpp "normal" */
    PX_IR_ROPE_HALVES = 2,   /* pairs (i, i+head_dim/2): neox, HF rotate-half */
} px_ir_rope_style;

/* Where a model came from. */
typedef enum px_ir_source {
    PX_IR_SOURCE_GGUF = 0,
    PX_IR_SOURCE_LLAMA2C = 1,
    PX_IR_SOURCE_PRESET = 2,
} px_ir_source;

typedef struct px_ir_hparams {
    px_ir_arch arch;
    char arch_name[32];      /* general.architecture as written ("llama") */
    char name[64];           /* general.name, the preset name, or "" */
    uint32_t dim;            /* embedding width (embedding_length) */
    uint32_t hidden_dim;     /* FFN width (feed_forward_length); per expert for MoE */
    uint32_t n_layers;       /* transformer blocks (block_count) */
    uint32_t n_heads;        /* query heads */
    uint32_t n_kv_heads;     /* key/value heads (grouped-query attention) */
    uint32_t head_dim;       /* dim / n_heads unless the file says otherwise */
    uint32_t vocab_size;     /* rows of token_embd (0 for DiT) */
    uint32_t context_length; /* longest context the model was trained for */
    uint32_t rope_dim;       /* dimensions rotated per head (rope.dimension_count) */
    float rope_theta;        /* rope.freq_base; 10000 when absent */
    float rms_eps;           /* layer_norm_rms_epsilon (or layer_norm_epsilon) */
    px_ir_rope_style rope_style;
    bool tied_classifier;    /* classifier is token_embd (no output.weight) */
    bool qkv_bias;           /* attention q/k/v projections have biases (qwen2) */
    uint32_t sliding_window; /* attention window, 0: none */
    uint32_t n_experts;      /* MoE experts per layer, 0: dense */
    uint32_t n_experts_used; /* experts per token */
    /* Diffusion transformer only (0 elsewhere). */
    uint32_t dit_input_size;   /* latent height = width */
    uint32_t dit_patch_size;   /* patch edge */
    uint32_t dit_in_channels;  /* latent channels */
    uint32_t dit_out_channels; /* channels predicted (noise and variance) */
    uint32_t dit_n_classes;    /* class-label table rows (incl. the null class) */
    uint32_t dit_freq_dim;     /* sinusoidal timestep embedding width */
    uint32_t dit_steps;        /* denoising steps of one sample */
} px_ir_hparams;

/* ------------------------------------------------------------------ */
/* Stored tensors (weights)                                            */
/* ------------------------------------------------------------------ */

#define PX_IR_MAX_DIMS 4

/* A weight tensor as stored.  Shapes follow GGUF/ggml: ne[0] is the
 * innermost (contiguous) dimension, the row length; a matrix that maps
 * d_in to d_out has ne = {d_in, d_out}, i.e. d_out rows of d_in values,
 * which is the layout of llama2.c's (d_out, d_in) row-major arrays too.
 * nb[i] is the byte stride of dimension i (nb[0] is the size of one block
 * or element).  Unused dimensions have ne = 1.  All memory belongs to the
 * model. */
typedef struct px_ir_tensor {
    const char *name; /* GGUF name ("blk.3.attn_q.weight"); llama2.c
                         tensors get the same names */
    px_dtype dtype;
    uint32_t n_dims;
    uint64_t ne[PX_IR_MAX_DIMS];
    uint64_t nb[PX_IR_MAX_DIMS];
    uint64_t n_elems;
    uint64_t n_bytes;
    uint64_t offset;  /* byte offset of the data in the file */
    const void *data; /* read-only, in the file's mapping; NULL for presets */
} px_ir_tensor;

/* The role a weight plays.  Global roles ignore the layer argument. */
typedef enum px_ir_role {
    PX_IR_ROLE_TOKEN_EMBD = 0, /* [dim x vocab] token_embd.weight */
    PX_IR_ROLE_OUTPUT_NORM,    /* [dim] output_norm.weight */
    PX_IR_ROLE_OUTPUT,         /* [dim x vocab] output.weight, or token_embd when tied */
    PX_IR_ROLE_ATTN_NORM,      /* [dim] blk.N.attn_norm.weight */
    PX_IR_ROLE_WQ,             /* [dim x n_heads*head_dim] blk.N.attn_q.weight */
    PX_IR_ROLE_WK,             /* [dim x n_kv_heads*head_dim] blk.N.attn_k.weight */
    PX_IR_ROLE_WV,             /* [dim x n_kv_heads*head_dim] blk.N.attn_v.weight */
    PX_IR_ROLE_WO,             /* [n_heads*head_dim x dim] blk.N.attn_output.weight */
    PX_IR_ROLE_BQ,             /* [n_heads*head_dim] blk.N.attn_q.bias (qwen2) */
    PX_IR_ROLE_BK,             /* [n_kv_heads*head_dim] blk.N.attn_k.bias */
    PX_IR_ROLE_BV,             /* [n_kv_heads*head_dim] blk.N.attn_v.bias */
    PX_IR_ROLE_FFN_NORM,       /* [dim] blk.N.ffn_norm.weight */
    PX_IR_ROLE_W1_GATE,        /* [dim x hidden] blk.N.ffn_gate.weight (llama2.c w1) */
    PX_IR_ROLE_W2_DOWN,        /* [hidden x dim] blk.N.ffn_down.weight (w2) */
    PX_IR_ROLE_W3_UP,          /* [dim x hidden] blk.N.ffn_up.weight (w3) */
    PX_IR_ROLE_MOE_ROUTER,     /* [dim x n_experts] blk.N.ffn_gate_inp.weight */
    PX_IR_ROLE_MOE_GATE_EXPS,  /* [dim x hidden x n_experts] blk.N.ffn_gate_exps.weight */
    PX_IR_ROLE_MOE_DOWN_EXPS,  /* [hidden x dim x n_experts] blk.N.ffn_down_exps.weight */
    PX_IR_ROLE_MOE_UP_EXPS,    /* [dim x hidden x n_experts] blk.N.ffn_up_exps.weight */
    /* Diffusion transformer (names in docs/formats/model-ir.md). */
    PX_IR_ROLE_DIT_PATCH_EMBD,  /* [C*p*p x dim] patch projection (+ bias) */
    PX_IR_ROLE_DIT_T_EMBD_1,    /* [freq_dim x dim] timestep MLP, first layer */
    PX_IR_ROLE_DIT_T_EMBD_2,    /* [dim x dim] timestep MLP, second layer */
    PX_IR_ROLE_DIT_Y_EMBD,      /* [dim x n_classes] class-label table */
    PX_IR_ROLE_DIT_ADALN,       /* [dim x 6*dim] blk.N adaLN modulation */
    PX_IR_ROLE_DIT_QKV,         /* [dim x 3*dim] blk.N fused q/k/v */
    PX_IR_ROLE_DIT_PROJ,        /* [dim x dim] blk.N attention output */
    PX_IR_ROLE_DIT_FC1,         /* [dim x hidden] blk.N MLP in */
    PX_IR_ROLE_DIT_FC2,         /* [hidden x dim] blk.N MLP out */
    PX_IR_ROLE_DIT_FINAL_ADALN, /* [dim x 2*dim] final adaLN modulation */
    PX_IR_ROLE_DIT_FINAL_PROJ,  /* [dim x p*p*out_channels] final projection */
    PX_IR_ROLE_COUNT_
} px_ir_role;

/* "wq", "ffn_norm", ...; "?" for an invalid value. */
const char *px_ir_role_name(px_ir_role r);
/* Whether a role is per layer (false: global). */
bool px_ir_role_is_per_layer(px_ir_role r);

/* ------------------------------------------------------------------ */
/* Tokenizer vocabulary (reading only; encoding belongs to the runtime) */
/* ------------------------------------------------------------------ */

/* Token types, with GGUF's values. */
typedef enum px_token_type {
    PX_TOKEN_UNDEFINED = 0,
    PX_TOKEN_NORMAL = 1,
    PX_TOKEN_UNKNOWN = 2,
    PX_TOKEN_CONTROL = 3,
    PX_TOKEN_USER_DEFINED = 4,
    PX_TOKEN_UNUSED = 5,
    PX_TOKEN_BYTE = 6,
} px_token_type;

/* A vocabulary.  All arrays have n_tokens entries and belong to whoever
 * built the vocabulary (the model, or the arena passed to a reader).
 * Tokens are byte strings (they may hold any byte but are also
 * NUL-terminated for convenience).  Ids absent from the file are -1.
 *
 * Texts are as stored, not normalised: GGUF "llama" (SentencePiece)
 * vocabularies spell a space as U+2581 ("\xe2\x96\x81"), llama2.c tokenizer
 * files as a plain space, and llama2.c's exporter wrote BOS and EOS as
 * "\n<s>\n" and "\n</s>\n".  The shared tok512.bin and the vocabulary in
 * stories260K.gguf are otherwise identical (ids, scores, byte tokens). */
typedef struct px_ir_vocab {
    uint32_t n_tokens;
    const char *const *text; /* token bytes */
    const uint32_t *len;     /* token lengths in bytes */
    const float *scores;     /* merge scores; all 0 when the file has none */
    const uint8_t *types;    /* px_token_type; NORMAL when the file has none */
    uint32_t max_token_len;  /* llama2.c's header value, or the longest token */
    int32_t bos_id, eos_id, unk_id, pad_id;
    char model[32];    /* tokenizer.ggml.model ("llama", "gpt2"); "llama" for llama2.c */
    uint32_t n_merges; /* BPE merges (tokenizer.ggml.merges), 0 for llama */
    const char *const *merges;
} px_ir_vocab;

/* Reads a llama2.c tokenizer file (tok512.bin format: int32
 * max_token_length, then per token a float32 score, an int32 length and
 * the bytes).  n_tokens is the vocabulary size, which the file does not
 * record (take it from the model); the file must end exactly after the
 * last token.  bos/eos are 1 and 2, unk 0, as in llama2.c; byte tokens
 * "<0xXX>" get PX_TOKEN_BYTE, ids 1 and 2 PX_TOKEN_CONTROL.  Memory comes
 * from arena (borrowed; free it to free the vocabulary).
 * Errors: PX_ENOTFOUND/PX_EIO (file), PX_EPARSE (malformed, with the byte
 * offset), PX_ELIMIT (token longer than 64 KiB, more than 4M tokens). */
PX_NODISCARD px_status px_ir_vocab_read_llama2c(const char *path, uint32_t n_tokens,
                                                px_arena *arena, px_ir_vocab *out, px_err *err);

/* ------------------------------------------------------------------ */
/* Models: opening, presets, access                                    */
/* ------------------------------------------------------------------ */

typedef struct px_ir_model px_ir_model;

typedef struct px_ir_open_opts {
    /* llama2.c checkpoints: the tokenizer file to attach (NULL: none). */
    const char *tokenizer_path;
    /* Dtype of activations and of the KV cache in the graph (F32 when 0
     * is left in place: both default to f32, the runtime's compute type,
     * and a preset keeps its cache in its 16-bit weights' dtype).  A
     * kv_dtype other than F32 always applies; F32 applies only with
     * kv_dtype_given, since 0 also means "not given".  A given dtype that
     * is not a px_dtype is refused (PX_EINVAL). */
    px_dtype act_dtype;
    px_dtype kv_dtype;
    bool kv_dtype_given;
    /* Skip checking tensor shapes against the hyper-parameters (for tools
     * that only list a file's contents).  Bounds are always checked. */
    bool no_shape_check;
} px_ir_open_opts;

/* Opens a model file: GGUF (by its magic) or a llama2.c checkpoint
 * (legacy 7 x int32 header, or the "ak42" version 1 float32 export).  The
 * file is mapped read-only; tensors point into the mapping, which lives
 * until px_ir_model_free.  opts may be NULL.  Returns an owned model
 * (px_ir_model_free).
 * Errors: PX_ENOTFOUND, PX_EIO (file), PX_EPARSE (malformed file, naming
 * the byte offset or tensor), PX_ELIMIT (a bound passed), PX_EUNSUPPORTED
 * (GGUF v1, big-endian files, unknown architecture or tensor type),
 * PX_EVALIDATE (missing tensors or wrong shapes for the hyper-parameters,
 * absurd hyper-parameters). */
PX_NODISCARD px_status px_ir_model_open(const char *path, const px_ir_open_opts *opts,
                                        px_ir_model **out, px_err *err);

/* Reads a GGUF image in memory.  data is borrowed and must outlive the
 * model (tensors point into it); name is used in messages.  Same errors as
 * px_ir_model_open.  This is the entry point the fuzzer uses. */
PX_NODISCARD px_status px_ir_gguf_open_memory(const void *data, size_t len, const char *name,
                                              const px_ir_open_opts *opts, px_ir_model **out,
                                              px_err *err);

/* Frees the model and unmaps its file.  NULL is a no-op. */
void px_ir_model_free(px_ir_model *m);

/* Presets: models from hyper-parameters alone, with tensors of the right
 * shapes and dtypes but no data.  The runtime must refuse them
 * (px_ir_model_has_weights is false). */
typedef struct px_ir_preset_info {
    const char *name;   /* "llama-3-8b" */
    const char *title;  /* "Llama 3 8B" */
    const char *source; /* where the hyper-parameters come from */
    px_ir_arch arch;
} px_ir_preset_info;

/* Number of presets and the i-th (i < count). */
size_t px_ir_preset_count(void);
const px_ir_preset_info *px_ir_preset_at(size_t i);
/* Builds a preset's model.  weight_dtype is the dtype of the matrices
 * (norms stay f32); pass PX_DTYPE_COUNT_ for the published dtype (bf16).
 * opts may be NULL.  Returns an owned model.
 * Errors: PX_ENOTFOUND naming the known presets; PX_EINVAL for a dtype
 * whose blocks do not divide the rows. */
PX_NODISCARD px_status px_ir_preset_new(const char *name, px_dtype weight_dtype,
                                        const px_ir_open_opts *opts, px_ir_model **out,
                                        px_err *err);

/* Opens `spec` as a preset name if it is one, else as a file. */
PX_NODISCARD px_status px_ir_model_open_any(const char *spec, const px_ir_open_opts *opts,
                                            px_ir_model **out, px_err *err);

/* Accessors; the model keeps ownership of everything returned. */
const px_ir_hparams *px_ir_model_hparams(const px_ir_model *m);
px_ir_source px_ir_model_source(const px_ir_model *m);
/* The path, the memory name, or the preset name. */
const char *px_ir_model_path(const px_ir_model *m);
/* False for presets: there is nothing to execute. */
bool px_ir_model_has_weights(const px_ir_model *m);
/* True when the KV cache's dtype came from px_ir_open_opts (--kv-dtype),
 * not from the file or the preset. */
bool px_ir_model_kv_dtype_given(const px_ir_model *m);
/* GGUF version (2 or 3), 0 for other sources. */
uint32_t px_ir_model_gguf_version(const px_ir_model *m);

/* All stored tensors in file order. */
size_t px_ir_model_n_tensors(const px_ir_model *m);
const px_ir_tensor *px_ir_model_tensor(const px_ir_model *m, size_t i);
/* The tensor with this exact name, or NULL. */
const px_ir_tensor *px_ir_model_find_tensor(const px_ir_model *m, const char *name);
/* The tensor playing `role` in `layer` (ignored for global roles), or NULL
 * when the architecture has no such tensor (biases of llama, ...).  For
 * PX_IR_ROLE_OUTPUT with a tied classifier this returns token_embd. */
const px_ir_tensor *px_ir_model_weight(const px_ir_model *m, uint32_t layer, px_ir_role role);

/* The vocabulary the file carries (GGUF tokenizer.ggml.* keys, or the
 * tokenizer attached to a llama2.c checkpoint), or NULL. */
const px_ir_vocab *px_ir_model_vocab(const px_ir_model *m);

/* GGUF metadata, read-only.  Keys are looked up exactly.  Each getter
 * returns false when the key is absent or of an incompatible type;
 * integers convert between widths when the value fits. */
bool px_ir_model_meta_u64(const px_ir_model *m, const char *key, uint64_t *out);
bool px_ir_model_meta_f64(const px_ir_model *m, const char *key, double *out);
/* The string (not NUL-terminated in the file: copied into the model). */
bool px_ir_model_meta_str(const px_ir_model *m, const char *key, const char **out);
size_t px_ir_model_n_meta(const px_ir_model *m);
/* The i-th key and a short rendering of its value ("u32 128",
 * "array<string>[512]"); pointers owned by the model. */
void px_ir_model_meta_at(const px_ir_model *m, size_t i, const char **key, const char **value_text);

/* ------------------------------------------------------------------ */
/* Symbolic expressions of B, S, T                                     */
/* ------------------------------------------------------------------ */

/* Values bound to the variables.  Valid when B >= 1, 1 <= S <= T. */
typedef struct px_ir_dims {
    uint64_t B, S, T;
} px_ir_dims;

/* An expression tree (constants, B, S, T, +, -, *, /, ceil-div, min, max,
 * and the expected number of MoE experts touched).  Owned by its model. */
typedef struct px_ir_expr px_ir_expr;

/* Evaluates with checked 64-bit arithmetic.  Errors: PX_EINVAL (dims
 * invalid), PX_ERANGE (overflow or a negative intermediate), naming the
 * expression. */
PX_NODISCARD px_status px_ir_expr_eval(const px_ir_expr *e, px_ir_dims d, uint64_t *out,
                                       px_err *err);
/* Writes the expression as text ("2*B*S*64*64"); returns the length it
 * needed, like snprintf. */
size_t px_ir_expr_format(const px_ir_expr *e, char *buf, size_t n);
/* Whether the expression mentions no variable (then it evaluates the same
 * for every dims). */
bool px_ir_expr_is_const(const px_ir_expr *e);

/* ------------------------------------------------------------------ */
/* The graph                                                           */
/* ------------------------------------------------------------------ */

typedef enum px_ir_value_kind {
    PX_IR_VALUE_WEIGHT = 0, /* a stored tensor */
    PX_IR_VALUE_ACTIVATION, /* produced and consumed within a step */
    PX_IR_VALUE_KV_CACHE,   /* state that outlives the step */
    PX_IR_VALUE_INPUT,      /* token ids, latents, timesteps, labels */
    PX_IR_VALUE_OUTPUT,     /* logits, sampled tokens, predicted noise */
} px_ir_value_kind;

typedef enum px_ir_layout {
    PX_IR_LAYOUT_ROW_MAJOR = 0,  /* ne[0] contiguous */
    PX_IR_LAYOUT_BLOCKED,        /* quantized blocks along ne[0] */
    PX_IR_LAYOUT_KV_TOKEN_MAJOR, /* cache: [head_dim x n_kv_heads x T x B] */
} px_ir_layout;

/* A tensor of the graph.  shape[i] are expressions in B, S, T (innermost
 * first, like px_ir_tensor.ne); weights have constant shapes and point at
 * their stored tensor. */
typedef struct px_ir_value {
    const char *name; /* "layer.3.attention.q", "token_embd.weight" */
    px_ir_value_kind kind;
    px_dtype dtype;
    px_ir_layout layout;
    uint32_t n_dims;
    const px_ir_expr *shape[PX_IR_MAX_DIMS];
    const px_ir_tensor *weight; /* WEIGHT: the stored tensor */
    int32_t alias_of;           /* id of the value whose memory this is, -1:
                                   none (a tied classifier aliases token_embd) */
} px_ir_value;

typedef enum px_ir_op_kind {
    PX_IR_OP_EMBEDDING = 0, /* row lookup by token id */
    PX_IR_OP_RMSNORM,
    PX_IR_OP_LAYERNORM,
    PX_IR_OP_MATMUL, /* activation x weight^T (+ bias) */
    PX_IR_OP_ROPE,
    PX_IR_OP_ATTENTION, /* reads and appends the KV cache (causal), or
                           bidirectional without cache (DiT) */
    PX_IR_OP_SWIGLU,    /* silu(gate) * up */
    PX_IR_OP_GELU,
    PX_IR_OP_ADD,            /* residual */
    PX_IR_OP_MOE_ROUTER,     /* router logits, softmax, top-k */
    PX_IR_OP_MOE_EXPERTS,    /* k expert FFNs per token, weighted sum */
    PX_IR_OP_CLASSIFIER,     /* logits of the last token of each sequence */
    PX_IR_OP_SAMPLING,       /* logits to a token id */
    PX_IR_OP_PATCH_EMBED,    /* DiT: latent patches to tokens (+ position) */
    PX_IR_OP_TIMESTEP_EMBED, /* DiT: sinusoidal timestep through an MLP, + label */
    PX_IR_OP_ADALN,          /* DiT: conditioning to shift/scale/gate vectors */
    PX_IR_OP_MODULATE,       /* DiT: x*(1+scale)+shift */
    PX_IR_OP_GATE,           /* DiT: residual + gate*x (gate per sequence) */
    PX_IR_OP_UNPATCHIFY,     /* DiT: tokens back to the latent grid */
    PX_IR_OP_COUNT_
} px_ir_op_kind;

const char *px_ir_op_kind_name(px_ir_op_kind k);

/* Numerical sensitivity (flags). */
enum {
    PX_IR_SENS_REDUCTION_ORDER = 1 << 0, /* result depends on summation order */
    PX_IR_SENS_PRECISION = 1 << 1,       /* must accumulate in f32 (norms,
                                            softmax, logits) */
    PX_IR_SENS_DISCONTINUOUS = 1 << 2,   /* a tiny change can flip a discrete
                                            choice (top-k routing, argmax) */
};

/* Determinism of an op. */
typedef enum px_ir_determinism {
    PX_IR_DET_EXACT = 0,  /* element-wise: same bits on any schedule */
    PX_IR_DET_ORDER = 1,  /* reductions: same bits only with the same order */
    PX_IR_DET_SEEDED = 2, /* random: same result only with the same seed */
} px_ir_determinism;

/* Rewrites that are legal for an op (flags).  Whether a run may use them
 * is the contract's decision. */
enum {
    PX_IR_RW_LOWER_PRECISION = 1 << 0, /* compute in f16/bf16/fp8 */
    PX_IR_RW_QUANTIZE = 1 << 1,        /* store its weight in a block type */
    PX_IR_RW_RECOMPUTE = 1 << 2,       /* recompute instead of keeping */
    PX_IR_RW_OFFLOAD = 1 << 3,         /* keep its weight in a slower tier */
    PX_IR_RW_PAGE = 1 << 4,            /* page its KV cache */
    PX_IR_RW_QUANTIZE_KV = 1 << 5,     /* store its KV cache in a lower dtype */
    PX_IR_RW_FUSE_NEXT = 1 << 6,       /* fuse with the next op */
    PX_IR_RW_SHARD = 1 << 7,           /* split across devices (tensor parallel) */
};

typedef struct px_ir_op {
    px_ir_op_kind kind;
    const char *name; /* "layer.3.attention.wq" */
    uint32_t region;  /* index of its region */
    int32_t layer;    /* -1 outside the blocks */
    uint32_t n_inputs, n_outputs;
    const uint32_t *inputs; /* value ids */
    const uint32_t *outputs;
    const px_ir_expr *flops; /* per step, in B, S, T */
    const px_ir_expr *bytes_read;
    const px_ir_expr *bytes_written;
    uint32_t sensitivity; /* PX_IR_SENS_* */
    px_ir_determinism determinism;
    uint32_t rewrites;     /* PX_IR_RW_* */
    bool observable_order; /* its outputs leave the system in order
                              (sampled tokens): may not be reordered */
    bool assumption;       /* its cost rests on a stated assumption
                              (MoE uniform routing) */
} px_ir_op;

typedef enum px_ir_region_kind {
    PX_IR_REGION_EMBEDDING = 0, /* "embedding" */
    PX_IR_REGION_ATTENTION,     /* "layer.<i>.attention" */
    PX_IR_REGION_FFN,           /* "layer.<i>.ffn" */
    PX_IR_REGION_HEAD,          /* "head": final norm + classifier (+ sampling) */
} px_ir_region_kind;

/* A contiguous run of ops.  Pipeline cuts fall only between regions;
 * contracts and plans name regions exactly as `name`. */
typedef struct px_ir_region {
    const char *name;
    px_ir_region_kind kind;
    int32_t layer; /* -1 for embedding and head */
    uint32_t first_op, n_ops;
    uint64_t weight_bytes; /* stored bytes of the weights its ops read */
    uint32_t sensitivity;  /* union of its ops' */
} px_ir_region;

typedef enum px_ir_phase {
    PX_IR_PHASE_PREFILL = 0, /* S = T = prompt length */
    PX_IR_PHASE_DECODE,      /* S = 1, T = context */
    PX_IR_PHASE_DENOISE,     /* DiT: S = T = latent tokens, once per step */
} px_ir_phase;

const char *px_ir_phase_name(px_ir_phase p);

/* The K and V cache of one attention layer. */
typedef struct px_ir_kv_desc {
    uint32_t layer;
    uint32_t n_kv_heads, head_dim;
    px_dtype dtype;
    uint32_t max_context;     /* the model's context length */
    uint32_t window;          /* sliding window, 0: none */
    uint64_t bytes_per_token; /* 2 * n_kv_heads * head_dim * bytes(dtype) */
} px_ir_kv_desc;

size_t px_ir_model_n_values(const px_ir_model *m);
const px_ir_value *px_ir_model_value(const px_ir_model *m, size_t i);
size_t px_ir_model_n_ops(const px_ir_model *m);
const px_ir_op *px_ir_model_op(const px_ir_model *m, size_t i);
size_t px_ir_model_n_regions(const px_ir_model *m);
const px_ir_region *px_ir_model_region(const px_ir_model *m, size_t i);
/* The region with this name, or NULL. */
const px_ir_region *px_ir_model_find_region(const px_ir_model *m, const char *name);
/* The phases the model runs (prefill+decode, or denoise) and how many. */
size_t px_ir_model_phases(const px_ir_model *m, px_ir_phase out[3]);
/* KV-cache descriptors, one per attention layer (none for DiT). */
size_t px_ir_model_n_kv(const px_ir_model *m);
const px_ir_kv_desc *px_ir_model_kv(const px_ir_model *m, size_t i);
/* KV bytes per token summed over all layers, at dtype kv_dtype. */
uint64_t px_ir_model_kv_bytes_per_token(const px_ir_model *m, px_dtype kv_dtype);

/* Bindings for a phase: prefill of `tokens` (S = T = tokens), a decode step
 * at context `tokens` (S = 1, T = tokens), a denoise step over the model's
 * latent tokens (tokens ignored). */
px_ir_dims px_ir_model_phase_dims(const px_ir_model *m, px_ir_phase p, uint64_t batch,
                                  uint64_t tokens);

/* Evaluated cost of an op, a region or the whole graph for one step. */
typedef struct px_ir_cost {
    uint64_t flops;
    uint64_t bytes_read;
    uint64_t bytes_written;
} px_ir_cost;

PX_NODISCARD px_status px_ir_op_cost(const px_ir_model *m, size_t op, px_ir_dims d, px_ir_cost *out,
                                     px_err *err);
PX_NODISCARD px_status px_ir_region_cost(const px_ir_model *m, size_t region, px_ir_dims d,
                                         px_ir_cost *out, px_err *err);
PX_NODISCARD px_status px_ir_graph_cost(const px_ir_model *m, px_ir_dims d, px_ir_cost *out,
                                        px_err *err);

/* ------------------------------------------------------------------ */
/* Layer cost summary (precomputed; cheap enough for inner loops)      */
/* ------------------------------------------------------------------ */

/* Index of the summary rows: 0 is the embedding, 1..n_layers the blocks,
 * n_layers+1 the head.  Use these helpers rather than raw numbers. */
#define PX_IR_ROW_EMBEDDING      0u
#define PX_IR_ROW_LAYER(i)       ((uint32_t)(i) + 1u)
#define PX_IR_ROW_HEAD(n_layers) ((uint32_t)(n_layers) + 1u)

/* What one row costs, per token and per sequence.  FLOPs of a step of
 * B sequences with S new tokens each at context T (see the conventions):
 *
 *   flops = B*S*flops_token + B*P*flops_pair + B*flops_seq
 *
 * with P = S*T - S*(S-1)/2 causal pairs (S*T for DiT).  px_ir_decode_flops
 * and px_ir_prefill_flops evaluate it for one sequence. */
typedef struct px_ir_layer_cost {
    uint32_t row;                              /* PX_IR_ROW_* */
    uint64_t n_params;                         /* values of its weights */
    uint64_t weight_bytes;                     /* at the stored dtypes */
    uint64_t weight_bytes_at[PX_DTYPE_COUNT_]; /* if its matrices were stored
                                     at each dtype (norms and biases keep
                                     theirs); UINT64_MAX where the dtype's
                                     blocks do not divide the rows */
    uint64_t expert_bytes;                     /* MoE: bytes of one expert (stored dtype) */
    uint32_t n_experts, n_experts_used;
    uint64_t flops_token;     /* FLOPs per new token, context-free */
    uint64_t flops_pair;      /* FLOPs per attended (query, key) pair */
    uint64_t flops_seq;       /* FLOPs per sequence (head rows, adaLN) */
    uint64_t kv_bytes_token;  /* KV cache per token at the model's KV dtype */
    uint64_t act_bytes_token; /* activation bytes per token crossing the
                                 row's output boundary (act dtype); the
                                 head's is the sampled token id (4) */
    uint32_t window;          /* attention window (0: none) */
    bool causal;              /* false for DiT's bidirectional attention */
} px_ir_layer_cost;

/* Number of rows (n_layers + 2). */
uint32_t px_ir_model_n_rows(const px_ir_model *m);
/* The precomputed row.  PX_EINVAL for row >= n_rows. */
PX_NODISCARD px_status px_ir_model_layer_cost(const px_ir_model *m, uint32_t row,
                                              px_ir_layer_cost *out);
/* Direct pointer to the precomputed rows (n_rows of them). */
const px_ir_layer_cost *px_ir_model_layer_costs(const px_ir_model *m);
/* FLOPs of one decode token at context T, and of a prefill of S tokens on
 * an empty cache, for one sequence. */
uint64_t px_ir_decode_flops(const px_ir_layer_cost *c, uint64_t T);
uint64_t px_ir_prefill_flops(const px_ir_layer_cost *c, uint64_t S);
/* Weight bytes a step of n_tokens tokens (B*S) reads: all weights for
 * dense rows; for MoE the non-expert weights plus the expected distinct
 * experts touched under uniform routing (an assumption). */
uint64_t px_ir_step_weight_bytes(const px_ir_layer_cost *c, uint64_t n_tokens);
/* Attended (query, key) pairs of one sequence and head for a step with S
 * new tokens at context T: causal S*T - S*(S-1)/2 (each position limited
 * to `window` keys when window > 0), bidirectional S*T.  Saturates at
 * UINT64_MAX. */
uint64_t px_ir_attention_pairs(uint64_t S, uint64_t T, uint32_t window, bool causal);
/* Expected distinct experts touched by n_tokens tokens, E*(1-(1-k/E)^n),
 * rounded up. */
uint64_t px_ir_moe_experts_touched(uint32_t n_experts, uint32_t n_used, uint64_t n_tokens);

/* Totals over the model (sums of the rows). */
typedef struct px_ir_totals {
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t params_by_dtype[PX_DTYPE_COUNT_];
    uint64_t bytes_by_dtype[PX_DTYPE_COUNT_];
    uint64_t kv_bytes_token;
} px_ir_totals;

void px_ir_model_totals(const px_ir_model *m, px_ir_totals *out);

/* ------------------------------------------------------------------ */
/* Description, content id                                             */
/* ------------------------------------------------------------------ */

typedef struct px_ir_describe_opts {
    uint64_t context;  /* T for per-token figures; 0: the model's context */
    uint64_t batch;    /* B; 0: 1 */
    bool with_ops;     /* include every op with its cost expressions */
    bool with_tensors; /* include every stored tensor */
} px_ir_describe_opts;

/* A JSON description ("schema": "plexus.model/1"): architecture,
 * hyper-parameters, parameters and bytes by dtype, per-row weight bytes,
 * FLOPs per token for prefill and decode, KV bytes per token, activation
 * bytes per boundary, regions.  opts may be NULL.  Returns a new
 * reference, NULL when memory runs out. */
json_t *px_ir_model_describe(const px_ir_model *m, const px_ir_describe_opts *opts);

/* ------------------------------------------------------------------ */
/* GGUF writer and synthetic models                                    */
/* ------------------------------------------------------------------ */

/* A streaming GGUF v3 writer: declare metadata and tensors first, then
 * write each tensor's bytes in declaration order.  Nothing of the tensor
 * data is held in memory.
 *
 *     px_ir_gguf_writer *w;
 *     px_ir_gguf_writer_new("m.gguf", &w, &err);
 *     px_ir_gguf_writer_add_str(w, "general.architecture", "llama", &err);
 *     uint64_t ne[2] = {64, 512};
 *     px_ir_gguf_writer_add_tensor(w, "token_embd.weight", PX_DTYPE_F32, 2, ne, &err);
 *     px_ir_gguf_writer_begin_data(w, &err);
 *     px_ir_gguf_writer_write(w, bytes, n, &err);   // any number of calls
 *     px_ir_gguf_writer_finish(w, &err);            // frees w
 */
typedef struct px_ir_gguf_writer px_ir_gguf_writer;

/* GGUF metadata value types, with the file's numbering. */
typedef enum px_gguf_type {
    PX_GGUF_U8 = 0,
    PX_GGUF_I8 = 1,
    PX_GGUF_U16 = 2,
    PX_GGUF_I16 = 3,
    PX_GGUF_U32 = 4,
    PX_GGUF_I32 = 5,
    PX_GGUF_F32 = 6,
    PX_GGUF_BOOL = 7,
    PX_GGUF_STRING = 8,
    PX_GGUF_ARRAY = 9,
    PX_GGUF_U64 = 10,
    PX_GGUF_I64 = 11,
    PX_GGUF_F64 = 12,
} px_gguf_type;

/* Creates the file (through a temporary name, renamed on finish).
 * Returns an owned writer (finish or abort it). */
PX_NODISCARD px_status px_ir_gguf_writer_new(const char *path, px_ir_gguf_writer **out,
                                             px_err *err);
/* Metadata.  Keys must be unique (PX_EEXIST). */
PX_NODISCARD px_status px_ir_gguf_writer_add_u32(px_ir_gguf_writer *w, const char *key, uint32_t v,
                                                 px_err *err);
PX_NODISCARD px_status px_ir_gguf_writer_add_u64(px_ir_gguf_writer *w, const char *key, uint64_t v,
                                                 px_err *err);
PX_NODISCARD px_status px_ir_gguf_writer_add_i32(px_ir_gguf_writer *w, const char *key, int32_t v,
                                                 px_err *err);
PX_NODISCARD px_status px_ir_gguf_writer_add_f32(px_ir_gguf_writer *w, const char *key, float v,
                                                 px_err *err);
PX_NODISCARD px_status px_ir_gguf_writer_add_bool(px_ir_gguf_writer *w, const char *key, bool v,
                                                  px_err *err);
PX_NODISCARD px_status px_ir_gguf_writer_add_str(px_ir_gguf_writer *w, const char *key,
                                                 const char *v, px_err *err);
/* An array of n scalars of type t (not STRING or ARRAY), copied. */
PX_NODISCARD px_status px_ir_gguf_writer_add_array(px_ir_gguf_writer *w, const char *key,
                                                   px_gguf_type t, const void *values, size_t n,
                                                   px_err *err);
/* An array of n strings with lengths (lens may be NULL: NUL-terminated). */
PX_NODISCARD px_status px_ir_gguf_writer_add_str_array(px_ir_gguf_writer *w, const char *key,
                                                       const char *const *values,
                                                       const uint32_t *lens, size_t n, px_err *err);
/* Copies every metadata pair of GGUF model m, in order, except the keys
 * listed in skip (n_skip of them).  Errors: PX_EINVAL when m was not read
 * from a GGUF file, and those of the adders. */
PX_NODISCARD px_status px_ir_gguf_writer_copy_meta(px_ir_gguf_writer *w, const px_ir_model *m,
                                                   const char *const *skip, size_t n_skip,
                                                   px_err *err);
/* Declares a tensor; ne innermost first.  Names must be unique. */
PX_NODISCARD px_status px_ir_gguf_writer_add_tensor(px_ir_gguf_writer *w, const char *name,
                                                    px_dtype t, uint32_t n_dims, const uint64_t *ne,
                                                    px_err *err);
/* Writes the header, metadata and tensor table. */
PX_NODISCARD px_status px_ir_gguf_writer_begin_data(px_ir_gguf_writer *w, px_err *err);
/* Appends tensor bytes; crossing into the next tensor adds its alignment
 * padding automatically. */
PX_NODISCARD px_status px_ir_gguf_writer_write(px_ir_gguf_writer *w, const void *data, size_t len,
                                               px_err *err);
/* Checks every tensor got all its bytes, syncs, renames into place and
 * frees the writer (also on failure). */
PX_NODISCARD px_status px_ir_gguf_writer_finish(px_ir_gguf_writer *w, px_err *err);
/* Removes the temporary file and frees the writer.  NULL is a no-op. */
void px_ir_gguf_writer_abort(px_ir_gguf_writer *w);

/* A synthetic llama-family model: deterministic random weights
 * (N(0, 0.02) matrices, norms 1) and a byte-level vocabulary (<unk>, <s>,
 * </s>, the 256 bytes, then filler tokens up to vocab). */
typedef struct px_ir_synth_opts {
    px_ir_arch arch; /* llama, qwen2 (adds q/k/v biases) or mixtral */
    uint32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads;
    uint32_t vocab_size; /* >= 259 with the tokenizer */
    uint32_t context_length;
    uint32_t n_experts, n_experts_used; /* mixtral only */
    px_dtype dtype;                     /* f32, f16 or q8_0 for the matrices */
    uint64_t seed;
    bool tied_classifier; /* omit output.weight */
    bool no_tokenizer;    /* omit the vocabulary (then vocab may be < 259) */
} px_ir_synth_opts;

/* Fills opts with a small valid default (dim 64, ...). */
void px_ir_synth_defaults(px_ir_synth_opts *o);
/* Writes the model to path, streaming.  Errors: PX_EINVAL naming the bad
 * option (with the fix), PX_EIO. */
PX_NODISCARD px_status px_ir_synth_write(const px_ir_synth_opts *o, const char *path, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_IR_H */
