/*
 * Presets: models too large to keep at hand, built from their published
 * hyper-parameters.  Each has tensors of the right names, shapes and
 * dtypes but no data, so planning and simulation work and execution is
 * refused.
 */
#include "ir/ir_impl.h"

typedef struct preset {
    px_ir_preset_info info;
    px_ir_hparams hp;
} preset;

/* Sources: the config.json each model's publisher ships on Hugging Face
 * (hidden_size = dim, intermediate_size = hidden_dim, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, vocab_size,
 * max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings,
 * sliding_window, num_local_experts, num_experts_per_tok); for DiT the
 * paper's Table 1 and the DiT_XL_2 definition in facebookresearch/DiT
 * models.py (hidden 1152, depth 28, 16 heads, patch 2, mlp_ratio 4,
 * 256x256 images as 32x32x4 latents, learn_sigma so 8 output channels,
 * 1000 classes plus the null class for guidance, 256 frequencies, 250
 * sampling steps as in the paper's evaluation). */
static const preset k_presets[] = {
    {{"llama-3-8b", "Llama 3 8B", "meta-llama/Meta-Llama-3-8B config.json (Hugging Face)",
      PX_IR_ARCH_LLAMA},
     {.arch = PX_IR_ARCH_LLAMA,
      .dim = 4096,
      .hidden_dim = 14336,
      .n_layers = 32,
      .n_heads = 32,
      .n_kv_heads = 8,
      .head_dim = 128,
      .vocab_size = 128256,
      .context_length = 8192,
      .rope_dim = 128,
      .rope_theta = 500000.0f,
      .rms_eps = 1e-5f}},
    {{"llama-3-70b", "Llama 3 70B", "meta-llama/Meta-Llama-3-70B config.json (Hugging Face)",
      PX_IR_ARCH_LLAMA},
     {.arch = PX_IR_ARCH_LLAMA,
      .dim = 8192,
      .hidden_dim = 28672,
      .n_layers = 80,
      .n_heads = 64,
      .n_kv_heads = 8,
      .head_dim = 128,
      .vocab_size = 128256,
      .context_length = 8192,
      .rope_dim = 128,
      .rope_theta = 500000.0f,
      .rms_eps = 1e-5f}},
    {{"mistral-7b", "Mistral 7B v0.1", "mistralai/Mistral-7B-v0.1 config.json (Hugging Face)",
      PX_IR_ARCH_MISTRAL},
     {.arch = PX_IR_ARCH_MISTRAL,
      .dim = 4096,
      .hidden_dim = 14336,
      .n_layers = 32,
      .n_heads = 32,
      .n_kv_heads = 8,
      .head_dim = 128,
      .vocab_size = 32000,
      .context_length = 32768,
      .rope_dim = 128,
      .rope_theta = 10000.0f,
      .rms_eps = 1e-5f,
      .sliding_window = 4096}},
    {{"mixtral-8x7b", "Mixtral 8x7B", "mistralai/Mixtral-8x7B-v0.1 config.json (Hugging Face)",
      PX_IR_ARCH_MIXTRAL},
     {.arch = PX_IR_ARCH_MIXTRAL,
      .dim = 4096,
      .hidden_dim = 14336,
      .n_layers = 32,
      .n_heads = 32,
      .n_kv_heads = 8,
      .head_dim = 128,
      .vocab_size = 32000,
      .context_length = 32768,
      .rope_dim = 128,
      .rope_theta = 1000000.0f,
      .rms_eps = 1e-5f,
      .n_experts = 8,
      .n_experts_used = 2}},
    {{"qwen2.5-7b", "Qwen2.5 7B", "Qwen/Qwen2.5-7B config.json (Hugging Face)", PX_IR_ARCH_QWEN2},
     {.arch = PX_IR_ARCH_QWEN2,
      .dim = 3584,
      .hidden_dim = 18944,
      .n_layers = 28,
      .n_heads = 28,
      .n_kv_heads = 4,
      .head_dim = 128,
      .vocab_size = 152064,
      .context_length = 131072,
      .rope_dim = 128,
      .rope_theta = 1000000.0f,
      .rms_eps = 1e-6f,
      .qkv_bias = true}},
    {{"dit-xl-2", "DiT-XL/2 (256x256, class-conditional)",
      "Peebles and Xie, Scalable Diffusion Models with Transformers (ICCV 2023), Table 1; "
      "facebookresearch/DiT models.py DiT_XL_2",
      PX_IR_ARCH_DIT},
     {.arch = PX_IR_ARCH_DIT,
      .dim = 1152,
      .hidden_dim = 4608,
      .n_layers = 28,
      .n_heads = 16,
      .n_kv_heads = 16,
      .head_dim = 72,
      .context_length = 256,
      .rms_eps = 1e-6f,
      .dit_input_size = 32,
      .dit_patch_size = 2,
      .dit_in_channels = 4,
      .dit_out_channels = 8,
      .dit_n_classes = 1001,
      .dit_freq_dim = 256,
      .dit_steps = 250}},
};

size_t px_ir_preset_count(void)
{
    return PX_ARRAY_LEN(k_presets);
}

const px_ir_preset_info *px_ir_preset_at(size_t i)
{
    return i < PX_ARRAY_LEN(k_presets) ? &k_presets[i].info : NULL;
}

/* Appends a tensor without data. */
static px_status add(px_ir_model *m, size_t *n, const char *name, px_dtype dt, uint32_t n_dims,
                     const uint64_t *ne, px_err *err)
{
    px_ir_tensor *t = &m->tensors[(*n)++];
    t->name = name;
    if (!name)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    /* A vector is never quantized. */
    if (n_dims < 2)
        dt = PX_DTYPE_F32;
    if (ne[0] % px_dtype_block_elems(dt))
        return px_err_set(err, PX_EINVAL,
                          "preset %s: tensor %s has rows of %" PRIu64 " values, not a "
                          "multiple of %s's block of %u; pick another dtype",
                          m->path, name, ne[0], px_dtype_name(dt), px_dtype_block_elems(dt));
    t->dtype = dt;
    t->n_dims = n_dims;
    uint64_t elems = 1;
    for (uint32_t i = 0; i < PX_IR_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        elems *= t->ne[i];
    }
    t->n_elems = elems;
    px_dtype_nbytes(dt, elems, &t->n_bytes);
    t->nb[0] = px_dtype_block_bytes(dt);
    t->nb[1] = t->nb[0] * (t->ne[0] / px_dtype_block_elems(dt));
    for (int i = 2; i < PX_IR_MAX_DIMS; i++)
        t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
    return PX_OK;
}

static px_status add_role(px_ir_model *m, size_t *n, px_ir_role r, uint32_t layer, px_dtype dt,
                          px_err *err)
{
    uint32_t n_dims;
    uint64_t ne[PX_IR_MAX_DIMS];
    if (!px__ir_role_shape(&m->hp, r, &n_dims, ne))
        return PX_OK;
    return add(m, n, px__ir_role_tensor_name(m->arena, r, layer), dt, n_dims, ne, err);
}

/* A bias named by pattern, as wide as the output of a role's matrix. */
static px_status add_bias(px_ir_model *m, size_t *n, const char *pattern, uint32_t layer,
                          px_ir_role of, px_err *err)
{
    uint32_t n_dims;
    uint64_t ne[PX_IR_MAX_DIMS];
    if (!px__ir_role_shape(&m->hp, of, &n_dims, ne))
        return PX_OK;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    const char *name = px_arena_printf(m->arena, pattern, layer);
#pragma GCC diagnostic pop
    uint64_t w[1] = {ne[1]};
    return add(m, n, name, PX_DTYPE_F32, 1, w, err);
}

static px_status build_tensors(px_ir_model *m, px_dtype dt, px_err *err)
{
    const px_ir_hparams *hp = &m->hp;
    size_t cap = 16 + (size_t)hp->n_layers * 24, n = 0;
    m->tensors = px_arena_calloc(m->arena, cap, sizeof *m->tensors);
    if (!m->tensors)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = PX_OK;
    if (hp->arch == PX_IR_ARCH_DIT) {
        static const px_ir_role global[] = {PX_IR_ROLE_DIT_PATCH_EMBD, PX_IR_ROLE_DIT_T_EMBD_1,
                                            PX_IR_ROLE_DIT_T_EMBD_2, PX_IR_ROLE_DIT_Y_EMBD};
        for (size_t i = 0; i < PX_ARRAY_LEN(global) && !st; i++)
            st = add_role(m, &n, global[i], 0, dt, err);
        if (!st)
            st = add_bias(m, &n, "patch_embd.bias", 0, PX_IR_ROLE_DIT_PATCH_EMBD, err);
        if (!st)
            st = add_bias(m, &n, "t_embd.fc1.bias", 0, PX_IR_ROLE_DIT_T_EMBD_1, err);
        if (!st)
            st = add_bias(m, &n, "t_embd.fc2.bias", 0, PX_IR_ROLE_DIT_T_EMBD_2, err);
        static const struct {
            px_ir_role role;
            const char *bias;
        } blk[] = {
            {PX_IR_ROLE_DIT_ADALN, "blk.%u.adaln.bias"},
            {PX_IR_ROLE_DIT_QKV, "blk.%u.attn_qkv.bias"},
            {PX_IR_ROLE_DIT_PROJ, "blk.%u.attn_output.bias"},
            {PX_IR_ROLE_DIT_FC1, "blk.%u.ffn_up.bias"},
            {PX_IR_ROLE_DIT_FC2, "blk.%u.ffn_down.bias"},
        };
        for (uint32_t l = 0; l < hp->n_layers && !st; l++)
            for (size_t i = 0; i < PX_ARRAY_LEN(blk) && !st; i++) {
                st = add_role(m, &n, blk[i].role, l, dt, err);
                if (!st)
                    st = add_bias(m, &n, blk[i].bias, l, blk[i].role, err);
            }
        if (!st)
            st = add_role(m, &n, PX_IR_ROLE_DIT_FINAL_ADALN, 0, dt, err);
        if (!st)
            st = add_bias(m, &n, "final.adaln.bias", 0, PX_IR_ROLE_DIT_FINAL_ADALN, err);
        if (!st)
            st = add_role(m, &n, PX_IR_ROLE_DIT_FINAL_PROJ, 0, dt, err);
        if (!st)
            st = add_bias(m, &n, "final.proj.bias", 0, PX_IR_ROLE_DIT_FINAL_PROJ, err);
    } else {
        st = add_role(m, &n, PX_IR_ROLE_TOKEN_EMBD, 0, dt, err);
        if (!st)
            st = add_role(m, &n, PX_IR_ROLE_OUTPUT_NORM, 0, dt, err);
        if (!st && !hp->tied_classifier)
            st = add_role(m, &n, PX_IR_ROLE_OUTPUT, 0, dt, err);
        for (uint32_t l = 0; l < hp->n_layers && !st; l++)
            for (int r = PX_IR_ROLE_ATTN_NORM; r <= PX_IR_ROLE_MOE_UP_EXPS && !st; r++) {
                bool is_bias = r == PX_IR_ROLE_BQ || r == PX_IR_ROLE_BK || r == PX_IR_ROLE_BV;
                if (is_bias && !hp->qkv_bias)
                    continue;
                st = add_role(m, &n, (px_ir_role)r, l, dt, err);
            }
    }
    PX_ASSERT(n <= cap);
    m->n_tensors = n;
    if (st != PX_OK)
        return st;
    return px__ir_index_tensors(m, err);
}

px_status px_ir_preset_new(const char *name, px_dtype weight_dtype, const px_ir_open_opts *opts,
                           px_ir_model **out, px_err *err)
{
    *out = NULL;
    const preset *p = NULL;
    for (size_t i = 0; i < PX_ARRAY_LEN(k_presets); i++)
        if (!strcmp(k_presets[i].info.name, name))
            p = &k_presets[i];
    if (!p) {
        px_strbuf sb = PX_STRBUF_INIT;
        for (size_t i = 0; i < PX_ARRAY_LEN(k_presets); i++)
            px_strbuf_addf(&sb, "%s%s", i ? ", " : "", k_presets[i].info.name);
        px_err_set(err, PX_ENOTFOUND, "no preset named \"%.60s\"; presets: %s", name, sb.buf);
        px_strbuf_release(&sb);
        return PX_ENOTFOUND;
    }
    if ((unsigned)weight_dtype >= PX_DTYPE_COUNT_)
        weight_dtype = PX_DTYPE_BF16;
    px_ir_model *m;
    px_status st = px__ir_model_alloc(name, PX_IR_SOURCE_PRESET, &m, err);
    if (st != PX_OK)
        return st;
    m->hp = p->hp;
    /* The KV cache is kept in the weights' dtype when they are 16-bit, as
     * the deployments the presets' sources describe keep it (their
     * torch_dtype); opts->kv_dtype still chooses another. */
    if (weight_dtype == PX_DTYPE_BF16 || weight_dtype == PX_DTYPE_F16)
        m->kv_dtype = weight_dtype;
    px_strlcpy(m->hp.arch_name, px_ir_arch_name(m->hp.arch), sizeof m->hp.arch_name);
    px_strlcpy(m->hp.name, p->info.title, sizeof m->hp.name);
    m->hp.rope_style = m->hp.arch == PX_IR_ARCH_DIT     ? PX_IR_ROPE_NONE
                       : m->hp.arch == PX_IR_ARCH_QWEN2 ? PX_IR_ROPE_HALVES
                                                        : PX_IR_ROPE_ADJACENT;
    if ((st = build_tensors(m, weight_dtype, err)) == PX_OK)
        st = px__ir_finish(m, opts, err);
    if (st != PX_OK) {
        px_ir_model_free(m);
        return st;
    }
    *out = m;
    return PX_OK;
}
