/*
 * plexus/rt_session.h: models, sessions and the forward pass, the scalar
 * reference, tokenizers, sampling, px_rt_generate, profiling and
 * quantizing model files.  Part of plexus/rt.h, which includes it and
 * opens with the overview and a usage example.
 */
#ifndef PLEXUS_RT_SESSION_H
#define PLEXUS_RT_SESSION_H

#include "plexus/rt_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    /* Matrices held in a layout of the device's own (px_rt_layout: Q4_K sixteen rows to a
     * group for the avx512 cpu kernels), repacked from the file once for all the sessions of
     * the model, and their bytes (host memory beside the file's). */
    uint32_t weights_repacked;
    uint64_t repacked_bytes;
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
    const char *const *prompts; /* borrowed */
    uint32_t n_prompts;         /* at most the session's max_seqs */
    /* The prompts already encoded (BOS first, as px_rt_tokenizer_encode
     * with PX_RT_ENCODE_BOS gives them), n_prompts arrays of
     * n_prompt_tokens[i] ids, borrowed; NULL: the prompts are encoded here.
     * A caller that has encoded them already (to size a plan) passes them
     * so that no prompt is encoded twice. */
    const int32_t *const *prompt_tokens;
    const size_t *n_prompt_tokens;
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
#endif /* PLEXUS_RT_SESSION_H */
