/*
 * Synthetic models: llama-family GGUF files of any size with deterministic
 * random weights and a byte-level vocabulary, for tests and benchmarks.
 * Weights are generated and written a chunk at a time.
 */
#include "ir/ir_impl.h"

void px_ir_synth_defaults(px_ir_synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->arch = PX_IR_ARCH_LLAMA;
    o->dim = 64;
    o->hidden_dim = 172;
    o->n_layers = 2;
    o->n_heads = 8;
    o->n_kv_heads = 4;
    o->vocab_size = 512;
    o->context_length = 256;
    o->dtype = PX_DTYPE_F32;
    o->seed = 1;
}

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond))                                                  \
            return px_err_set(err, PX_EINVAL, "synth: " __VA_ARGS__); \
    } while (0)

static px_status check_opts(const px_ir_synth_opts *o, px_err *err)
{
    CHECK(o->arch == PX_IR_ARCH_LLAMA || o->arch == PX_IR_ARCH_QWEN2 ||
              o->arch == PX_IR_ARCH_MIXTRAL,
          "--arch must be llama, qwen2 or mixtral, not %s", px_ir_arch_name(o->arch));
    CHECK(o->dim >= 2 && o->dim <= PX__IR_MAX_DIM, "--dim %u is outside 2..%u", o->dim,
          PX__IR_MAX_DIM);
    CHECK(o->hidden_dim >= 1 && o->hidden_dim <= PX__IR_MAX_HIDDEN, "--hidden %u is outside 1..%u",
          o->hidden_dim, PX__IR_MAX_HIDDEN);
    CHECK(o->n_layers >= 1 && o->n_layers <= PX__IR_MAX_LAYERS, "--layers %u is outside 1..%u",
          o->n_layers, PX__IR_MAX_LAYERS);
    CHECK(o->n_heads >= 1 && o->dim % o->n_heads == 0, "--heads %u must divide --dim %u",
          o->n_heads, o->dim);
    CHECK(o->n_kv_heads >= 1 && o->n_heads % o->n_kv_heads == 0,
          "--kv-heads %u must divide --heads %u", o->n_kv_heads, o->n_heads);
    CHECK((o->dim / o->n_heads) % 2 == 0,
          "the head size %u (dim / heads) must be even for rotary embeddings", o->dim / o->n_heads);
    uint32_t min_vocab = o->no_tokenizer ? 1 : 259;
    CHECK(o->vocab_size >= min_vocab && o->vocab_size <= PX__IR_MAX_VOCAB,
          "--vocab %u is outside %u..%u (3 special tokens and 256 bytes come first; "
          "--no-tokenizer allows fewer)",
          o->vocab_size, min_vocab, PX__IR_MAX_VOCAB);
    CHECK(o->context_length >= 1 && o->context_length <= PX__IR_MAX_CONTEXT,
          "--context %u is outside 1..%u", o->context_length, PX__IR_MAX_CONTEXT);
    CHECK(o->dtype == PX_DTYPE_F32 || o->dtype == PX_DTYPE_F16 || o->dtype == PX_DTYPE_BF16 ||
              o->dtype == PX_DTYPE_Q8_0,
          "--dtype must be f32, f16, bf16 or q8_0, not %s", px_dtype_name(o->dtype));
    if (o->arch == PX_IR_ARCH_MIXTRAL)
        CHECK(o->n_experts >= 2 && o->n_experts <= PX__IR_MAX_EXPERTS && o->n_experts_used >= 1 &&
                  o->n_experts_used <= o->n_experts,
              "mixtral needs 2..%u --experts and 1..experts --experts-used (got %u, %u)",
              PX__IR_MAX_EXPERTS, o->n_experts, o->n_experts_used);
    return PX_OK;
}

/* The tensors of the model in llama.cpp's order. */
typedef struct stensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    px_dtype dtype;
    bool is_norm, is_bias;
} stensor;

static void push(stensor *ts, size_t *n, const char *name, uint32_t n_dims, uint64_t a, uint64_t b,
                 uint64_t c, px_dtype want)
{
    stensor *t = &ts[(*n)++];
    px_strlcpy(t->name, name, sizeof t->name);
    t->n_dims = n_dims;
    t->ne[0] = a, t->ne[1] = b, t->ne[2] = c;
    t->is_norm = strstr(name, "norm") != NULL;
    t->is_bias = px_str_ends_with(name, ".bias");
    /* Vectors stay f32; rows that do not fill the blocks fall back to f16,
     * as llama.cpp's quantizer does. */
    if (n_dims < 2)
        t->dtype = PX_DTYPE_F32;
    else if (a % px_dtype_block_elems(want))
        t->dtype = PX_DTYPE_F16;
    else
        t->dtype = want;
}

static size_t plan_tensors(const px_ir_synth_opts *o, stensor *ts)
{
    size_t n = 0;
    uint64_t d = o->dim, h = o->hidden_dim, hd = o->dim / o->n_heads;
    uint64_t q = d, kv = (uint64_t)o->n_kv_heads * hd, E = o->n_experts;
    char name[64];
    push(ts, &n, "token_embd.weight", 2, d, o->vocab_size, 1, o->dtype);
    push(ts, &n, "output_norm.weight", 1, d, 1, 1, o->dtype);
    if (!o->tied_classifier)
        push(ts, &n, "output.weight", 2, d, o->vocab_size, 1, o->dtype);
    for (uint32_t l = 0; l < o->n_layers; l++) {
#define T(suffix, nd, a, b, c) \
    (snprintf(name, sizeof name, "blk.%u." suffix, l), push(ts, &n, name, nd, a, b, c, o->dtype))
        T("attn_norm.weight", 1, d, 1, 1);
        T("attn_q.weight", 2, d, q, 1);
        T("attn_k.weight", 2, d, kv, 1);
        T("attn_v.weight", 2, d, kv, 1);
        if (o->arch == PX_IR_ARCH_QWEN2) {
            T("attn_q.bias", 1, q, 1, 1);
            T("attn_k.bias", 1, kv, 1, 1);
            T("attn_v.bias", 1, kv, 1, 1);
        }
        T("attn_output.weight", 2, q, d, 1);
        T("ffn_norm.weight", 1, d, 1, 1);
        if (o->arch == PX_IR_ARCH_MIXTRAL) {
            T("ffn_gate_inp.weight", 2, d, E, 1);
            T("ffn_gate_exps.weight", 3, d, h, E);
            T("ffn_down_exps.weight", 3, h, d, E);
            T("ffn_up_exps.weight", 3, d, h, E);
        } else {
            T("ffn_gate.weight", 2, d, h, 1);
            T("ffn_down.weight", 2, h, d, 1);
            T("ffn_up.weight", 2, d, h, 1);
        }
#undef T
    }
    return n;
}

static px_status write_vocab(px_ir_gguf_writer *w, uint32_t n, px_err *err)
{
    char **text = calloc(n, sizeof *text);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    px_status st = PX_OK;
    if (!text || !scores || !types) {
        st = px_err_set(err, PX_ENOMEM, "synth: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (i < 3) {
            static const char *const special[3] = {"<unk>", "<s>", "</s>"};
            text[i] = px_strdup(special[i]);
            types[i] = i == 0 ? PX_TOKEN_UNKNOWN : PX_TOKEN_CONTROL;
        } else if (i < 259) {
            text[i] = px_asprintf("<0x%02X>", i - 3);
            types[i] = PX_TOKEN_BYTE;
        } else {
            text[i] = px_asprintf("<extra_%u>", i - 259);
            types[i] = PX_TOKEN_UNUSED;
            scores[i] = -1.0f;
        }
        if (!text[i]) {
            st = px_err_set(err, PX_ENOMEM, "synth: out of memory");
            goto done;
        }
    }
    if ((st = px_ir_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", err)) ||
        (st = px_ir_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)text,
                                              NULL, n, err)) ||
        (st = px_ir_gguf_writer_add_array(w, "tokenizer.ggml.scores", PX_GGUF_F32, scores, n,
                                          err)) ||
        (st = px_ir_gguf_writer_add_array(w, "tokenizer.ggml.token_type", PX_GGUF_I32, types, n,
                                          err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2, err)))
        goto done;
done:
    if (text)
        for (uint32_t i = 0; i < n; i++)
            free(text[i]);
    free(text);
    free(scores);
    free(types);
    return st;
}

/* Quantizes a row to Q8_0 as ggml's reference does: per block of 32 a
 * scale amax/127 (stored as f16) and rounded int8 values. */
static void quantize_q8_0(const float *x, uint64_t n, uint8_t *out)
{
    for (uint64_t b = 0; b < n / 32; b++) {
        const float *v = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(v[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = px_f32_to_f16(d);
        uint8_t *blk = out + 34 * b;
        blk[0] = (uint8_t)h;
        blk[1] = (uint8_t)(h >> 8);
        for (int i = 0; i < 32; i++)
            blk[2 + i] = (uint8_t)(int8_t)roundf(v[i] * id);
    }
}

/* Generates a tensor row by row into buf (row values) and enc (encoded). */
static px_status write_tensor(px_ir_gguf_writer *w, const stensor *t, uint64_t seed, uint64_t index,
                              float *vals, uint8_t *enc, px_err *err)
{
    px_rng rng = px_rng_derive(seed, index);
    uint64_t row = t->ne[0], rows = t->ne[1] * t->ne[2];
    uint64_t row_bytes;
    px_dtype_nbytes(t->dtype, row, &row_bytes);
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t i = 0; i < row; i++)
            vals[i] = t->is_norm ? 1.0f : (float)(0.02 * px_rng_normal(&rng));
        switch (t->dtype) {
        case PX_DTYPE_F32:
            memcpy(enc, vals, row * 4);
            break;
        case PX_DTYPE_F16:
        case PX_DTYPE_BF16:
            for (uint64_t i = 0; i < row; i++) {
                uint16_t h =
                    t->dtype == PX_DTYPE_F16 ? px_f32_to_f16(vals[i]) : px_f32_to_bf16(vals[i]);
                enc[2 * i] = (uint8_t)h;
                enc[2 * i + 1] = (uint8_t)(h >> 8);
            }
            break;
        default:
            quantize_q8_0(vals, row, enc);
            break;
        }
        px_status st = px_ir_gguf_writer_write(w, enc, (size_t)row_bytes, err);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

px_status px_ir_synth_write(const px_ir_synth_opts *o, const char *path, px_err *err)
{
    px_status st = check_opts(o, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "%s: ", path);
    size_t max_tensors = 3 + (size_t)o->n_layers * 12;
    stensor *ts = calloc(max_tensors, sizeof *ts);
    uint64_t widest = PX_MAX(PX_MAX(o->dim, o->hidden_dim), 32u);
    float *vals = calloc(widest, sizeof *vals);
    uint8_t *enc = calloc(widest, 4);
    px_ir_gguf_writer *w = NULL;
    if (!ts || !vals || !enc) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t n = plan_tensors(o, ts);
    const char *arch = o->arch == PX_IR_ARCH_QWEN2 ? "qwen2" : "llama";
    char key[96];
#define K(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    if ((st = px_ir_gguf_writer_new(path, &w, err)) ||
        (st = px_ir_gguf_writer_add_str(w, "general.architecture", arch, err)) ||
        (st = px_ir_gguf_writer_add_str(w, "general.name", "plexus synthetic model", err)) ||
        (st = px_ir_gguf_writer_add_u64(w, "plexus.synth.seed", o->seed, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("context_length"), o->context_length, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("embedding_length"), o->dim, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("feed_forward_length"), o->hidden_dim, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("block_count"), o->n_layers, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("attention.head_count"), o->n_heads, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("attention.head_count_kv"), o->n_kv_heads, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("rope.dimension_count"), o->dim / o->n_heads, err)) ||
        (st = px_ir_gguf_writer_add_f32(w, K("rope.freq_base"), 10000.0f, err)) ||
        (st = px_ir_gguf_writer_add_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, K("vocab_size"), o->vocab_size, err)))
        goto done;
    if (o->arch == PX_IR_ARCH_MIXTRAL &&
        ((st = px_ir_gguf_writer_add_u32(w, K("expert_count"), o->n_experts, err)) ||
         (st = px_ir_gguf_writer_add_u32(w, K("expert_used_count"), o->n_experts_used, err))))
        goto done;
#undef K
    if (!o->no_tokenizer && (st = write_vocab(w, o->vocab_size, err)))
        goto done;
    for (size_t i = 0; i < n; i++)
        if ((st = px_ir_gguf_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].n_dims, ts[i].ne,
                                               err)))
            goto done;
    if ((st = px_ir_gguf_writer_begin_data(w, err)))
        goto done;
    for (size_t i = 0; i < n; i++)
        if ((st = write_tensor(w, &ts[i], o->seed, i, vals, enc, err)))
            goto done;
    st = px_ir_gguf_writer_finish(w, err);
    w = NULL;
done:
    px_ir_gguf_writer_abort(w);
    free(ts);
    free(vals);
    free(enc);
    return st;
}
