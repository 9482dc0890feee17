/*
 * px_rt_quantize_file: a GGUF model rewritten with its matrices quantized
 * by one of llama.cpp's recipes, tensor by tensor, row by row (memory
 * stays at one row of each, whatever the model's size).
 */
#include "base/common.h"

#include "plexus/rt.h"
#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

typedef struct recipe {
    const char *name;
    px_dtype base;
    uint32_t file_type; /* llama.cpp's general.file_type */
    bool more_bits;     /* Q6_K for attn_v / ffn_down in some layers */
} recipe;

static const recipe k_recipes[] = {
    {"q8_0", PX_DTYPE_Q8_0, 7, false},   {"q4_0", PX_DTYPE_Q4_0, 2, false},
    {"q4_k_m", PX_DTYPE_Q4_K, 15, true}, {"q5_k_m", PX_DTYPE_Q5_K, 17, true},
    {"q6_k", PX_DTYPE_Q6_K, 18, false},
};

/* The layers of n that the _M mixes give more bits: the first and last
 * eighth, and every third layer between. */
static bool more_bits_layer(uint32_t i, uint32_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The layer of "blk.N.<...>", or -1. */
static int64_t layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(name + 4, &end, 10);
    return errno || end == name + 4 || *end != '.' || v < 0 ? -1 : v;
}

/* The dtype a tensor gets, before the row-length fallback. */
static px_dtype tensor_type(const recipe *r, const px_ir_model *m, const px_ir_tensor *t)
{
    bool has_output = px_ir_model_find_tensor(m, "output.weight") != NULL;
    const char *n = t->name;
    if (!strcmp(n, "output.weight") || (!has_output && !strcmp(n, "token_embd.weight"))) {
        if (r->base == PX_DTYPE_Q8_0)
            return PX_DTYPE_Q8_0;
        return t->ne[0] % PX__RT_QK ? PX_DTYPE_Q8_0 : PX_DTYPE_Q6_K;
    }
    int64_t layer = layer_of(n);
    uint32_t n_layers = px_ir_model_hparams(m)->n_layers;
    if (r->more_bits && layer >= 0 && (uint64_t)layer < n_layers &&
        (has_suffix(n, ".attn_v.weight") || has_suffix(n, ".ffn_down.weight")) &&
        more_bits_layer((uint32_t)layer, n_layers))
        return PX_DTYPE_Q6_K;
    return r->base;
}

/* Row lengths that do not fill whole blocks fall back to a smaller block,
 * then to f16. */
static px_dtype fit_rows(px_dtype t, uint64_t k)
{
    if (k % px_dtype_block_elems(t) == 0)
        return t;
    px_dtype next = t == PX_DTYPE_Q4_K ? PX_DTYPE_Q5_0 : PX_DTYPE_Q8_0;
    if (t != next && k % px_dtype_block_elems(next) == 0)
        return next;
    return PX_DTYPE_F16;
}

static bool quantizable(const px_ir_tensor *t)
{
    return t->n_dims >= 2 && has_suffix(t->name, ".weight");
}

static px_status write_f16_row(px_ir_gguf_writer *w, const float *x, uint64_t k, uint8_t *buf,
                               px_err *err)
{
    for (uint64_t j = 0; j < k; j++) {
        uint16_t h = px_f32_to_f16(x[j]);
        buf[2 * j] = (uint8_t)h;
        buf[2 * j + 1] = (uint8_t)(h >> 8);
    }
    return px_ir_gguf_writer_write(w, buf, 2 * k, err);
}

/* Quantizes tensor t (rows of k values) into dtype q, writing it and
 * adding its squared error to *sq. */
static px_status write_quantized(px_ir_gguf_writer *w, const px_ir_tensor *t, px_dtype q,
                                 const char *path, double *sq, px_err *err)
{
    uint64_t k = t->ne[0], rows = t->n_elems / k, out_bytes;
    if (k > UINT32_MAX || !px_dtype_nbytes(q, k, &out_bytes))
        return px_err_set(err, PX_EUNSUPPORTED, "%s: tensor %s: rows of %" PRIu64 " values", path,
                          t->name, k);
    float *x = malloc(k * sizeof(float)), *back = malloc(k * sizeof(float));
    uint8_t *buf = malloc(PX_MAX(out_bytes, 2 * k));
    px_status st = PX_OK;
    if (!x || !back || !buf) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory quantizing %s", path, t->name);
        goto done;
    }
    for (uint64_t r = 0; r < rows && st == PX_OK; r++) {
        px__rt_dequant_row(t->dtype, (const uint8_t *)t->data + r * t->nb[1], x, (uint32_t)k);
        for (uint64_t j = 0; j < k; j++)
            if (!isfinite(x[j])) {
                st = px_err_set(err, PX_EVALIDATE,
                                "%s: tensor %s: row %" PRIu64 " value %" PRIu64
                                " is %g; a model with non-finite weights cannot be quantized",
                                path, t->name, r, j, (double)x[j]);
                goto done;
            }
        if (q == PX_DTYPE_F16) {
            st = write_f16_row(w, x, k, buf, err);
            continue;
        }
        px__rt_quantize_row(q, x, buf, k);
        px__rt_dequant_row(q, buf, back, (uint32_t)k);
        for (uint64_t j = 0; j < k; j++)
            *sq += ((double)back[j] - x[j]) * ((double)back[j] - x[j]);
        st = px_ir_gguf_writer_write(w, buf, out_bytes, err);
    }
done:
    free(x);
    free(back);
    free(buf);
    return st;
}

px_status px_rt_quantize_file(const char *in_path, const char *out_path, const char *recipe_name,
                              px_rt_quantize_stats *stats, px_err *err)
{
    const recipe *r = NULL;
    for (size_t i = 0; i < PX_ARRAY_LEN(k_recipes); i++)
        if (recipe_name && !strcmp(recipe_name, k_recipes[i].name))
            r = &k_recipes[i];
    if (!r)
        return px_err_set(err, PX_EINVAL,
                          "unknown quantization type \"%.40s\"; known: q8_0, q4_0, q4_k_m, "
                          "q5_k_m, q6_k",
                          recipe_name ? recipe_name : "(null)");
    px_rt_quantize_stats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    px_ir_model *m = NULL;
    px_ir_gguf_writer *w = NULL;
    px_dtype *types = NULL;
    px_status st = px_ir_model_open(in_path, NULL, &m, err);
    if (st)
        return st;
    if (px_ir_model_source(m) != PX_IR_SOURCE_GGUF) {
        st = px_err_set(err, PX_EUNSUPPORTED, "%s: not a GGUF file; quantize reads GGUF models",
                        in_path);
        goto fail;
    }
    size_t n = px_ir_model_n_tensors(m);
    types = calloc(n ? n : 1, sizeof *types);
    if (!types) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", in_path);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const px_ir_tensor *t = px_ir_model_tensor(m, i);
        types[i] = t->dtype;
        if (!quantizable(t))
            continue;
        if (t->dtype != PX_DTYPE_F32 && t->dtype != PX_DTYPE_F16 && t->dtype != PX_DTYPE_BF16) {
            st = px_err_set(err, PX_EUNSUPPORTED,
                            "%s: tensor %s is already %s; quantize the f32, f16 or bf16 "
                            "model instead (quantizing twice loses accuracy)",
                            in_path, t->name, px_dtype_name(t->dtype));
            goto fail;
        }
        types[i] = fit_rows(tensor_type(r, m, t), t->ne[0]);
    }
    static const char *const replaced[] = {"general.file_type", "general.quantization_version"};
    if ((st = px_ir_gguf_writer_new(out_path, &w, err)) ||
        (st = px_ir_gguf_writer_copy_meta(w, m, replaced, PX_ARRAY_LEN(replaced), err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "general.file_type", r->file_type, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "general.quantization_version", 2, err)))
        goto fail;
    for (size_t i = 0; i < n; i++) {
        const px_ir_tensor *t = px_ir_model_tensor(m, i);
        if ((st = px_ir_gguf_writer_add_tensor(w, t->name, types[i], t->n_dims, t->ne, err)))
            goto fail;
    }
    if ((st = px_ir_gguf_writer_begin_data(w, err)))
        goto fail;
    double sq = 0;
    for (size_t i = 0; i < n; i++) {
        const px_ir_tensor *t = px_ir_model_tensor(m, i);
        uint64_t nbytes = 0;
        px_dtype_nbytes(types[i], t->n_elems, &nbytes);
        if (types[i] == t->dtype) {
            st = px_ir_gguf_writer_write(w, t->data, t->n_bytes, err);
        } else {
            st = write_quantized(w, t, types[i], in_path, &sq, err);
            stats->n_quantized++;
            if (types[i] != PX_DTYPE_F16)
                stats->n_values += t->n_elems;
        }
        if (st)
            goto fail;
        stats->n_tensors++;
        stats->n_by_dtype[types[i]]++;
        stats->bytes_in += t->n_bytes;
        stats->bytes_out += nbytes;
    }
    st = px_ir_gguf_writer_finish(w, err);
    w = NULL;
    if (st)
        goto fail;
    stats->rmse = stats->n_values ? sqrt(sq / (double)stats->n_values) : 0;
    free(types);
    px_ir_model_free(m);
    return PX_OK;
fail:
    px_ir_gguf_writer_abort(w);
    free(types);
    px_ir_model_free(m);
    return st;
}
