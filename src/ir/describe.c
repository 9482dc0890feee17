/* The JSON description of a model ("plexus.model/1"). */
#include "ir/ir_impl.h"

static const char *source_name(px_ir_source s)
{
    switch (s) {
    case PX_IR_SOURCE_GGUF:
        return "gguf";
    case PX_IR_SOURCE_LLAMA2C:
        return "llama2c";
    case PX_IR_SOURCE_PRESET:
        return "preset";
    }
    return "?";
}

static const char *rope_name(px_ir_rope_style s)
{
    switch (s) {
    case PX_IR_ROPE_NONE:
        return "none";
    case PX_IR_ROPE_ADJACENT:
        return "adjacent";
    case PX_IR_ROPE_HALVES:
        return "halves";
    }
    return "?";
}

static const char *region_kind_name(px_ir_region_kind k)
{
    switch (k) {
    case PX_IR_REGION_EMBEDDING:
        return "embedding";
    case PX_IR_REGION_ATTENTION:
        return "attention";
    case PX_IR_REGION_FFN:
        return "ffn";
    case PX_IR_REGION_HEAD:
        return "head";
    }
    return "?";
}

const char *px_ir_op_kind_name(px_ir_op_kind k)
{
    static const char *const names[PX_IR_OP_COUNT_] = {
        "embedding",   "rmsnorm",    "layernorm", "matmul",      "rope",
        "attention",   "swiglu",     "gelu",      "add",         "moe_router",
        "moe_experts", "classifier", "sampling",  "patch_embed", "timestep_embed",
        "adaln",       "modulate",   "gate",      "unpatchify",
    };
    return (unsigned)k < PX_IR_OP_COUNT_ ? names[k] : "?";
}

/* A JSON string of text that came from a file: bytes that are not valid
 * UTF-8 become '?', so a hostile name cannot drop the key. */
static json_t *str(const char *s)
{
    json_t *v = json_string(s);
    if (v)
        return v;
    char *copy = px_strdup(s);
    if (!copy)
        return NULL;
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
            *p = '?';
    v = json_string(copy);
    free(copy);
    return v;
}

/* Integers go out as JSON integers (exact up to 2^63). */
static json_t *num(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *flag_list(uint32_t flags, const char *const *names, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (flags & (1u << i))
            px_json_push(a, json_string(names[i]));
    return a;
}

static const char *const k_sens[] = {"reduction_order", "precision", "discontinuous"};
static const char *const k_rw[] = {"lower_precision", "quantize",  "recompute", "offload", "page",
                                   "quantize_kv",     "fuse_next", "shard"};

static json_t *hparams_json(const px_ir_hparams *hp)
{
    json_t *o = json_object();
    px_json_set(o, "dim", num(hp->dim));
    px_json_set(o, "hidden_dim", num(hp->hidden_dim));
    px_json_set(o, "n_layers", num(hp->n_layers));
    px_json_set(o, "n_heads", num(hp->n_heads));
    px_json_set(o, "n_kv_heads", num(hp->n_kv_heads));
    px_json_set(o, "head_dim", num(hp->head_dim));
    px_json_set(o, "context_length", num(hp->context_length));
    px_json_set(o, "norm_eps", json_real(hp->rms_eps));
    if (hp->arch == PX_IR_ARCH_DIT) {
        px_json_set(o, "latent_size", num(hp->dit_input_size));
        px_json_set(o, "patch_size", num(hp->dit_patch_size));
        px_json_set(o, "in_channels", num(hp->dit_in_channels));
        px_json_set(o, "out_channels", num(hp->dit_out_channels));
        px_json_set(o, "n_classes", num(hp->dit_n_classes));
        px_json_set(o, "freq_dim", num(hp->dit_freq_dim));
        px_json_set(o, "denoise_steps", num(hp->dit_steps));
        return o;
    }
    px_json_set(o, "vocab_size", num(hp->vocab_size));
    px_json_set(o, "rope_theta", json_real(hp->rope_theta));
    px_json_set(o, "rope_dim", num(hp->rope_dim));
    px_json_set(o, "rope_style", json_string(rope_name(hp->rope_style)));
    px_json_set(o, "tied_classifier", json_boolean(hp->tied_classifier));
    px_json_set(o, "qkv_bias", json_boolean(hp->qkv_bias));
    if (hp->sliding_window)
        px_json_set(o, "sliding_window", num(hp->sliding_window));
    if (hp->n_experts) {
        px_json_set(o, "n_experts", num(hp->n_experts));
        px_json_set(o, "n_experts_used", num(hp->n_experts_used));
    }
    return o;
}

static const char *row_name(const px_ir_model *m, uint32_t r, char buf[32])
{
    if (r == PX_IR_ROW_EMBEDDING)
        return "embedding";
    if (r == PX_IR_ROW_HEAD(m->hp.n_layers))
        return "head";
    snprintf(buf, 32, "layer.%u", r - 1);
    return buf;
}

static json_t *op_json(const px_ir_model *m, const px_ir_op *op)
{
    json_t *o = json_object();
    char buf[512];
    px_json_set(o, "name", json_string(op->name));
    px_json_set(o, "kind", json_string(px_ir_op_kind_name(op->kind)));
    px_json_set(o, "region", json_string(m->regions[op->region].name));
    px_ir_expr_format(op->flops, buf, sizeof buf);
    px_json_set(o, "flops", json_string(buf));
    px_ir_expr_format(op->bytes_read, buf, sizeof buf);
    px_json_set(o, "bytes_read", json_string(buf));
    px_ir_expr_format(op->bytes_written, buf, sizeof buf);
    px_json_set(o, "bytes_written", json_string(buf));
    px_json_set(o, "sensitivity", flag_list(op->sensitivity, k_sens, PX_ARRAY_LEN(k_sens)));
    static const char *const det[] = {"exact", "order", "seeded"};
    px_json_set(o, "determinism", json_string(det[op->determinism]));
    px_json_set(o, "rewrites", flag_list(op->rewrites, k_rw, PX_ARRAY_LEN(k_rw)));
    if (op->observable_order)
        px_json_set(o, "observable_order", json_true());
    if (op->assumption)
        px_json_set(o, "assumption", json_string("uniform expert routing"));
    json_t *in = json_array(), *out = json_array();
    for (uint32_t i = 0; i < op->n_inputs; i++)
        px_json_push(in, str(m->values[op->inputs[i]].name));
    for (uint32_t i = 0; i < op->n_outputs; i++)
        px_json_push(out, str(m->values[op->outputs[i]].name));
    px_json_set(o, "inputs", in);
    px_json_set(o, "outputs", out);
    return o;
}

json_t *px_ir_model_describe(const px_ir_model *m, const px_ir_describe_opts *opts)
{
    px_ir_describe_opts dflt = {0};
    if (!opts)
        opts = &dflt;
    const px_ir_hparams *hp = &m->hp;
    bool dit = hp->arch == PX_IR_ARCH_DIT;
    uint64_t T = opts->context ? opts->context : hp->context_length;
    uint64_t B = opts->batch ? opts->batch : 1;
    json_t *o = json_object();
    if (!o)
        return NULL;
    px_json_set(o, "schema", json_string("plexus.model/1"));
    px_json_set(o, "source", json_string(source_name(m->source)));
    px_json_set(o, "path", str(m->path));
    if (m->gguf_version)
        px_json_set(o, "gguf_version", num(m->gguf_version));
    px_json_set(o, "architecture", json_string(px_ir_arch_name(hp->arch)));
    px_json_set(o, "name", str(hp->name));
    px_json_set(o, "has_weights", json_boolean(m->has_weights));
    px_json_set(o, "hparams", hparams_json(hp));

    px_ir_totals tot;
    px_ir_model_totals(m, &tot);
    px_json_set(o, "params", num(tot.n_params));
    px_json_set(o, "weight_bytes", num(tot.weight_bytes));
    json_t *by = json_object();
    for (int d = 0; d < PX_DTYPE_COUNT_; d++) {
        if (!tot.params_by_dtype[d])
            continue;
        json_t *e = json_object();
        px_json_set(e, "params", num(tot.params_by_dtype[d]));
        px_json_set(e, "bytes", num(tot.bytes_by_dtype[d]));
        px_json_set(by, px_dtype_name((px_dtype)d), e);
    }
    px_json_set(o, "by_dtype", by);
    px_json_set(o, "n_tensors", num(m->n_tensors));
    px_json_set(o, "activation_dtype", json_string(px_dtype_name(m->act_dtype)));

    px_json_set(o, "context", num(T));
    px_json_set(o, "batch", num(B));
    if (!dit) {
        json_t *kv = json_object();
        px_json_set(kv, "dtype", json_string(px_dtype_name(m->kv_dtype)));
        px_json_set(kv, "bytes_per_token", num(tot.kv_bytes_token));
        px_json_set(kv, "bytes_per_token_per_layer", num(m->n_kv ? m->kv[0].bytes_per_token : 0));
        uint64_t at = 0;
        if (__builtin_mul_overflow(tot.kv_bytes_token, T, &at) ||
            __builtin_mul_overflow(at, B, &at))
            at = UINT64_MAX;
        px_json_set(kv, "bytes_at_context", num(at));
        px_json_set(o, "kv_cache", kv);
    }

    /* Per row and totals: decode one token at context T; prefill T tokens
     * (DiT: one denoising step over its latent tokens). */
    uint64_t prefill_total = 0, decode_total = 0;
    json_t *rows = json_array();
    px_ir_dims dd = px_ir_model_phase_dims(m, PX_IR_PHASE_DENOISE, 1, 0);
    for (uint32_t r = 0; r < m->n_rows; r++) {
        const px_ir_layer_cost *c = &m->rows[r];
        char buf[32];
        json_t *e = json_object();
        px_json_set(e, "name", json_string(row_name(m, r, buf)));
        px_json_set(e, "params", num(c->n_params));
        px_json_set(e, "weight_bytes", num(c->weight_bytes));
        uint64_t pf = dit ? px_ir_prefill_flops(c, dd.S) : px_ir_prefill_flops(c, T);
        px_json_set(e, dit ? "step_flops" : "prefill_flops", num(pf));
        if (!dit) {
            uint64_t df = px_ir_decode_flops(c, T);
            px_json_set(e, "decode_flops", num(df));
            px_json_set(e, "kv_bytes_per_token", num(c->kv_bytes_token));
            if (__builtin_add_overflow(decode_total, df, &decode_total))
                decode_total = UINT64_MAX;
        }
        px_json_set(e, "act_bytes_per_token", num(c->act_bytes_token));
        if (c->n_experts)
            px_json_set(e, "expert_bytes", num(c->expert_bytes));
        if (__builtin_add_overflow(prefill_total, pf, &prefill_total))
            prefill_total = UINT64_MAX;
        px_json_push(rows, e);
    }
    px_json_set(o, "rows", rows);
    json_t *fl = json_object();
    if (dit) {
        px_json_set(fl, "latent_tokens", num(dd.S));
        px_json_set(fl, "denoise_step", num(prefill_total));
        uint64_t sample;
        if (__builtin_mul_overflow(prefill_total, (uint64_t)hp->dit_steps, &sample))
            sample = UINT64_MAX;
        px_json_set(fl, "sample", num(sample));
    } else {
        px_json_set(fl, "decode_per_token", num(decode_total));
        px_json_set(fl, "prefill_total", num(prefill_total));
        px_json_set(fl, "prefill_per_token", num(prefill_total / (T ? T : 1)));
    }
    px_json_set(o, "flops", fl);

    json_t *regions = json_array();
    for (size_t i = 0; i < m->n_regions; i++) {
        const px_ir_region *r = &m->regions[i];
        json_t *e = json_object();
        px_json_set(e, "name", json_string(r->name));
        px_json_set(e, "kind", json_string(region_kind_name(r->kind)));
        px_json_set(e, "ops", num(r->n_ops));
        px_json_set(e, "weight_bytes", num(r->weight_bytes));
        px_json_set(e, "sensitivity", flag_list(r->sensitivity, k_sens, PX_ARRAY_LEN(k_sens)));
        px_json_push(regions, e);
    }
    px_json_set(o, "regions", regions);
    json_t *phases = json_array();
    px_ir_phase ph[3];
    size_t n_ph = px_ir_model_phases(m, ph);
    for (size_t i = 0; i < n_ph; i++)
        px_json_push(phases, json_string(px_ir_phase_name(ph[i])));
    px_json_set(o, "phases", phases);

    if (m->has_vocab) {
        json_t *v = json_object();
        px_json_set(v, "n_tokens", num(m->vocab.n_tokens));
        px_json_set(v, "model", str(m->vocab.model));
        px_json_set(v, "bos_id", json_integer(m->vocab.bos_id));
        px_json_set(v, "eos_id", json_integer(m->vocab.eos_id));
        px_json_set(o, "vocab", v);
    }
    if (opts->with_ops) {
        json_t *ops = json_array();
        for (size_t i = 0; i < m->n_ops; i++)
            px_json_push(ops, op_json(m, &m->ops[i]));
        px_json_set(o, "ops", ops);
    }
    if (opts->with_tensors) {
        json_t *ts = json_array();
        for (size_t i = 0; i < m->n_tensors; i++) {
            const px_ir_tensor *t = &m->tensors[i];
            json_t *e = json_object(), *shape = json_array();
            for (uint32_t d = 0; d < t->n_dims; d++)
                px_json_push(shape, num(t->ne[d]));
            px_json_set(e, "name", str(t->name));
            px_json_set(e, "dtype", json_string(px_dtype_name(t->dtype)));
            px_json_set(e, "shape", shape);
            px_json_set(e, "bytes", num(t->n_bytes));
            if (m->has_weights)
                px_json_set(e, "offset", num(t->offset));
            px_json_push(ts, e);
        }
        px_json_set(o, "tensors", ts);
    }
    return o;
}
