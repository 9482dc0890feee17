/* The model object: opening files, the tensor table, roles, accessors. */
#include "ir/ir_impl.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const k_arch_names[PX_IR_ARCH_COUNT_] = {
    [PX_IR_ARCH_LLAMA] = "llama", [PX_IR_ARCH_MISTRAL] = "mistral",
    [PX_IR_ARCH_QWEN2] = "qwen2", [PX_IR_ARCH_MIXTRAL] = "mixtral",
    [PX_IR_ARCH_DIT] = "dit",
};

const char *px_ir_arch_name(px_ir_arch a)
{
    return (unsigned)a < PX_IR_ARCH_COUNT_ ? k_arch_names[a] : "?";
}

/* Role names and the GGUF tensor name pattern of each ("%u" is the block). */
static const struct {
    const char *name;
    const char *tensor;
    bool per_layer;
} k_roles[PX_IR_ROLE_COUNT_] = {
    [PX_IR_ROLE_TOKEN_EMBD] = {"token_embd", "token_embd.weight", false},
    [PX_IR_ROLE_OUTPUT_NORM] = {"output_norm", "output_norm.weight", false},
    [PX_IR_ROLE_OUTPUT] = {"output", "output.weight", false},
    [PX_IR_ROLE_ATTN_NORM] = {"attn_norm", "blk.%u.attn_norm.weight", true},
    [PX_IR_ROLE_WQ] = {"wq", "blk.%u.attn_q.weight", true},
    [PX_IR_ROLE_WK] = {"wk", "blk.%u.attn_k.weight", true},
    [PX_IR_ROLE_WV] = {"wv", "blk.%u.attn_v.weight", true},
    [PX_IR_ROLE_WO] = {"wo", "blk.%u.attn_output.weight", true},
    [PX_IR_ROLE_BQ] = {"bq", "blk.%u.attn_q.bias", true},
    [PX_IR_ROLE_BK] = {"bk", "blk.%u.attn_k.bias", true},
    [PX_IR_ROLE_BV] = {"bv", "blk.%u.attn_v.bias", true},
    [PX_IR_ROLE_FFN_NORM] = {"ffn_norm", "blk.%u.ffn_norm.weight", true},
    [PX_IR_ROLE_W1_GATE] = {"w1_gate", "blk.%u.ffn_gate.weight", true},
    [PX_IR_ROLE_W2_DOWN] = {"w2_down", "blk.%u.ffn_down.weight", true},
    [PX_IR_ROLE_W3_UP] = {"w3_up", "blk.%u.ffn_up.weight", true},
    [PX_IR_ROLE_MOE_ROUTER] = {"moe_router", "blk.%u.ffn_gate_inp.weight", true},
    [PX_IR_ROLE_MOE_GATE_EXPS] = {"moe_gate_exps", "blk.%u.ffn_gate_exps.weight", true},
    [PX_IR_ROLE_MOE_DOWN_EXPS] = {"moe_down_exps", "blk.%u.ffn_down_exps.weight", true},
    [PX_IR_ROLE_MOE_UP_EXPS] = {"moe_up_exps", "blk.%u.ffn_up_exps.weight", true},
    [PX_IR_ROLE_DIT_PATCH_EMBD] = {"dit_patch_embd", "patch_embd.weight", false},
    [PX_IR_ROLE_DIT_T_EMBD_1] = {"dit_t_embd_1", "t_embd.fc1.weight", false},
    [PX_IR_ROLE_DIT_T_EMBD_2] = {"dit_t_embd_2", "t_embd.fc2.weight", false},
    [PX_IR_ROLE_DIT_Y_EMBD] = {"dit_y_embd", "y_embd.weight", false},
    [PX_IR_ROLE_DIT_ADALN] = {"dit_adaln", "blk.%u.adaln.weight", true},
    [PX_IR_ROLE_DIT_QKV] = {"dit_qkv", "blk.%u.attn_qkv.weight", true},
    [PX_IR_ROLE_DIT_PROJ] = {"dit_proj", "blk.%u.attn_output.weight", true},
    [PX_IR_ROLE_DIT_FC1] = {"dit_fc1", "blk.%u.ffn_up.weight", true},
    [PX_IR_ROLE_DIT_FC2] = {"dit_fc2", "blk.%u.ffn_down.weight", true},
    [PX_IR_ROLE_DIT_FINAL_ADALN] = {"dit_final_adaln", "final.adaln.weight", false},
    [PX_IR_ROLE_DIT_FINAL_PROJ] = {"dit_final_proj", "final.proj.weight", false},
};

const char *px_ir_role_name(px_ir_role r)
{
    return (unsigned)r < PX_IR_ROLE_COUNT_ ? k_roles[r].name : "?";
}

bool px_ir_role_is_per_layer(px_ir_role r)
{
    return (unsigned)r < PX_IR_ROLE_COUNT_ && k_roles[r].per_layer;
}

const char *px__ir_role_tensor_name(px_arena *a, px_ir_role r, uint32_t layer)
{
    if (!k_roles[r].per_layer)
        return k_roles[r].tensor;
        /* The pattern is a constant from the table above. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    return px_arena_printf(a, k_roles[r].tensor, layer);
#pragma GCC diagnostic pop
}

static bool is_dit(const px_ir_hparams *hp)
{
    return hp->arch == PX_IR_ARCH_DIT;
}

static bool is_dit_role(px_ir_role r)
{
    return r >= PX_IR_ROLE_DIT_PATCH_EMBD;
}

/* Whether the role exists at all for the architecture. */
static bool role_applies(const px_ir_hparams *hp, px_ir_role r)
{
    if (is_dit(hp))
        return is_dit_role(r);
    if (is_dit_role(r))
        return false;
    bool moe = hp->n_experts > 0;
    switch (r) {
    case PX_IR_ROLE_W1_GATE:
    case PX_IR_ROLE_W2_DOWN:
    case PX_IR_ROLE_W3_UP:
        return !moe;
    case PX_IR_ROLE_MOE_ROUTER:
    case PX_IR_ROLE_MOE_GATE_EXPS:
    case PX_IR_ROLE_MOE_DOWN_EXPS:
    case PX_IR_ROLE_MOE_UP_EXPS:
        return moe;
    default:
        return true;
    }
}

bool px__ir_role_required(const px_ir_hparams *hp, px_ir_role r)
{
    if (!role_applies(hp, r))
        return false;
    switch (r) {
    case PX_IR_ROLE_OUTPUT:
        return false; /* absent means tied */
    case PX_IR_ROLE_BQ:
    case PX_IR_ROLE_BK:
    case PX_IR_ROLE_BV:
        return hp->arch == PX_IR_ARCH_QWEN2;
    default:
        return true;
    }
}

bool px__ir_role_shape(const px_ir_hparams *hp, px_ir_role r, uint32_t *n_dims,
                       uint64_t ne[PX_IR_MAX_DIMS])
{
    if (!role_applies(hp, r))
        return false;
    uint64_t d = hp->dim, h = hp->hidden_dim, v = hp->vocab_size;
    uint64_t q = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kv = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t e = hp->n_experts, p = hp->dit_patch_size;
    uint64_t a = 0, b = 0, c = 0;
    switch (r) {
    case PX_IR_ROLE_TOKEN_EMBD:
        a = d, b = v;
        break;
    case PX_IR_ROLE_OUTPUT:
        a = d, b = v;
        break;
    case PX_IR_ROLE_OUTPUT_NORM:
    case PX_IR_ROLE_ATTN_NORM:
    case PX_IR_ROLE_FFN_NORM:
        a = d;
        break;
    case PX_IR_ROLE_WQ:
        a = d, b = q;
        break;
    case PX_IR_ROLE_WK:
    case PX_IR_ROLE_WV:
        a = d, b = kv;
        break;
    case PX_IR_ROLE_WO:
        a = q, b = d;
        break;
    case PX_IR_ROLE_BQ:
        a = q;
        break;
    case PX_IR_ROLE_BK:
    case PX_IR_ROLE_BV:
        a = kv;
        break;
    case PX_IR_ROLE_W1_GATE:
    case PX_IR_ROLE_W3_UP:
        a = d, b = h;
        break;
    case PX_IR_ROLE_W2_DOWN:
        a = h, b = d;
        break;
    case PX_IR_ROLE_MOE_ROUTER:
        a = d, b = e;
        break;
    case PX_IR_ROLE_MOE_GATE_EXPS:
    case PX_IR_ROLE_MOE_UP_EXPS:
        a = d, b = h, c = e;
        break;
    case PX_IR_ROLE_MOE_DOWN_EXPS:
        a = h, b = d, c = e;
        break;
    case PX_IR_ROLE_DIT_PATCH_EMBD:
        a = (uint64_t)hp->dit_in_channels * p * p, b = d;
        break;
    case PX_IR_ROLE_DIT_T_EMBD_1:
        a = hp->dit_freq_dim, b = d;
        break;
    case PX_IR_ROLE_DIT_T_EMBD_2:
        a = d, b = d;
        break;
    case PX_IR_ROLE_DIT_Y_EMBD:
        a = d, b = hp->dit_n_classes;
        break;
    case PX_IR_ROLE_DIT_ADALN:
        a = d, b = 6 * d;
        break;
    case PX_IR_ROLE_DIT_QKV:
        a = d, b = 3 * d;
        break;
    case PX_IR_ROLE_DIT_PROJ:
        a = d, b = d;
        break;
    case PX_IR_ROLE_DIT_FC1:
        a = d, b = h;
        break;
    case PX_IR_ROLE_DIT_FC2:
        a = h, b = d;
        break;
    case PX_IR_ROLE_DIT_FINAL_ADALN:
        a = d, b = 2 * d;
        break;
    case PX_IR_ROLE_DIT_FINAL_PROJ:
        a = d, b = p * p * hp->dit_out_channels;
        break;
    default:
        return false;
    }
    ne[0] = a, ne[1] = b ? b : 1, ne[2] = c ? c : 1, ne[3] = 1;
    *n_dims = c ? 3 : b ? 2 : 1;
    return true;
}

px_status px__ir_model_alloc(const char *path, px_ir_source source, px_ir_model **out, px_err *err)
{
    px_ir_model *m = calloc(1, sizeof *m);
    if (!m)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    px_status st = px_arena_new(0, &m->arena, err);
    if (st != PX_OK) {
        free(m);
        return st;
    }
    m->path = px_arena_strdup(m->arena, path);
    if (!m->path) {
        px_ir_model_free(m);
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    }
    m->source = source;
    m->act_dtype = m->kv_dtype = PX_DTYPE_F32;
    m->vocab.bos_id = m->vocab.eos_id = m->vocab.unk_id = m->vocab.pad_id = -1;
    *out = m;
    return PX_OK;
}

void px_ir_model_free(px_ir_model *m)
{
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->map_len);
    free(m->values);
    free(m->ops);
    free(m->regions);
    px_arena_free(m->arena);
    free(m);
}

static uint64_t name_hash(const char *s)
{
    return px_hash64(s, strlen(s));
}

px_status px__ir_index_tensors(px_ir_model *m, px_err *err)
{
    size_t cap = 16;
    while (cap < m->n_tensors * 2)
        cap *= 2;
    m->name_index = px_arena_alloc(m->arena, cap * sizeof *m->name_index);
    if (!m->name_index)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory indexing tensors", m->path);
    memset(m->name_index, 0xff, cap * sizeof *m->name_index);
    m->name_index_cap = cap;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const char *name = m->tensors[i].name;
        size_t h = (size_t)name_hash(name) & (cap - 1);
        while (m->name_index[h] != PX__IR_NO_TENSOR) {
            if (!strcmp(m->tensors[m->name_index[h]].name, name))
                return px_err_set(err, PX_EPARSE,
                                  "%s: tensor %zu: name \"%s\" is used twice (also by "
                                  "tensor %u); each tensor needs a unique name",
                                  m->path, i, name, m->name_index[h]);
            h = (h + 1) & (cap - 1);
        }
        m->name_index[h] = (uint32_t)i;
    }
    return PX_OK;
}

uint32_t px__ir_find_tensor_id(const px_ir_model *m, const char *name)
{
    if (!m->name_index_cap)
        return PX__IR_NO_TENSOR;
    size_t cap = m->name_index_cap;
    size_t h = (size_t)name_hash(name) & (cap - 1);
    while (m->name_index[h] != PX__IR_NO_TENSOR) {
        if (!strcmp(m->tensors[m->name_index[h]].name, name))
            return m->name_index[h];
        h = (h + 1) & (cap - 1);
    }
    return PX__IR_NO_TENSOR;
}

static void shape_text(char *buf, size_t n, uint32_t n_dims, const uint64_t *ne)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n_dims && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%" PRIu64, i ? " x " : "[", ne[i]);
        if (w < 0)
            return;
        used += (size_t)w;
    }
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static bool shape_equal(const px_ir_tensor *t, uint32_t n_dims, const uint64_t *ne)
{
    for (uint32_t i = 0; i < PX_IR_MAX_DIMS; i++) {
        uint64_t want = i < n_dims ? ne[i] : 1;
        uint64_t have = i < t->n_dims ? t->ne[i] : 1;
        if (want != have)
            return false;
    }
    return true;
}

/* Refuses "blk.N.*" tensors whose N is not a block of the model: a sign of
 * a wrong block_count. */
static px_status check_block_numbers(const px_ir_model *m, px_err *err)
{
    for (size_t i = 0; i < m->n_tensors; i++) {
        const char *name = m->tensors[i].name;
        if (strncmp(name, "blk.", 4) != 0)
            continue;
        char *end;
        errno = 0;
        unsigned long long b = strtoull(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || errno)
            continue;
        if (b >= m->hp.n_layers)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: tensor \"%s\" belongs to block %llu but the model "
                              "declares %u blocks; fix block_count or remove the tensor",
                              m->path, name, b, m->hp.n_layers);
    }
    return PX_OK;
}

static px_status bind_roles(px_ir_model *m, const px_ir_open_opts *opts, px_err *err)
{
    const px_ir_hparams *hp = &m->hp;
    size_t n = ((size_t)hp->n_layers + 1) * PX_IR_ROLE_COUNT_;
    m->roles = px_arena_alloc(m->arena, n * sizeof *m->roles);
    if (!m->roles)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
    memset(m->roles, 0xff, n * sizeof *m->roles);
    bool check = !(opts && opts->no_shape_check);
    for (int r = 0; r < PX_IR_ROLE_COUNT_; r++) {
        uint32_t n_dims;
        uint64_t ne[PX_IR_MAX_DIMS];
        if (!px__ir_role_shape(hp, (px_ir_role)r, &n_dims, ne))
            continue;
        uint32_t layers = k_roles[r].per_layer ? hp->n_layers : 1;
        for (uint32_t l = 0; l < layers; l++) {
            const char *name = px__ir_role_tensor_name(m->arena, (px_ir_role)r, l);
            if (!name)
                return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
            uint32_t id = px__ir_find_tensor_id(m, name);
            char want[96];
            shape_text(want, sizeof want, n_dims, ne);
            if (id == PX__IR_NO_TENSOR) {
                if (px__ir_role_required(hp, (px_ir_role)r))
                    return px_err_set(err, PX_EVALIDATE,
                                      "%s: tensor \"%s\" is missing; a %s model with dim %u "
                                      "and %u blocks needs it with shape %s",
                                      m->path, name, px_ir_arch_name(hp->arch), hp->dim,
                                      hp->n_layers, want);
                continue;
            }
            const px_ir_tensor *t = &m->tensors[id];
            if (check && !shape_equal(t, n_dims, ne)) {
                char have[96];
                shape_text(have, sizeof have, t->n_dims, t->ne);
                return px_err_set(err, PX_EVALIDATE,
                                  "%s: tensor \"%s\" has shape %s but the hyper-parameters "
                                  "(dim %u, hidden %u, heads %u/%u, vocab %u) need %s",
                                  m->path, name, have, hp->dim, hp->hidden_dim, hp->n_heads,
                                  hp->n_kv_heads, hp->vocab_size, want);
            }
            size_t row = k_roles[r].per_layer ? (size_t)l + 1 : 0;
            m->roles[row * PX_IR_ROLE_COUNT_ + (size_t)r] = id;
        }
    }
    if (!is_dit(hp)) {
        m->hp.tied_classifier = m->roles[PX_IR_ROLE_OUTPUT] == PX__IR_NO_TENSOR;
        if (m->hp.tied_classifier)
            m->roles[PX_IR_ROLE_OUTPUT] = m->roles[PX_IR_ROLE_TOKEN_EMBD];
        if (hp->n_layers && m->roles[PX_IR_ROLE_COUNT_ + PX_IR_ROLE_BQ] != PX__IR_NO_TENSOR)
            m->hp.qkv_bias = true;
    }
    return PX_OK;
}

#define HP_CHECK(cond, fmt, ...)                                                    \
    do {                                                                            \
        if (!(cond))                                                                \
            return px_err_set(err, PX_EVALIDATE, "%s: " fmt, m->path, __VA_ARGS__); \
    } while (0)

px_status px__ir_check_hparams(const px_ir_model *m, px_err *err)
{
    const px_ir_hparams *hp = &m->hp;
    HP_CHECK(hp->dim >= 1 && hp->dim <= PX__IR_MAX_DIM, "embedding width %u is outside 1..%u",
             hp->dim, PX__IR_MAX_DIM);
    HP_CHECK(hp->hidden_dim >= 1 && hp->hidden_dim <= PX__IR_MAX_HIDDEN,
             "feed-forward width %u is outside 1..%u", hp->hidden_dim, PX__IR_MAX_HIDDEN);
    HP_CHECK(hp->n_layers >= 1 && hp->n_layers <= PX__IR_MAX_LAYERS,
             "block count %u is outside 1..%u", hp->n_layers, PX__IR_MAX_LAYERS);
    HP_CHECK(hp->n_heads >= 1 && hp->n_heads <= PX__IR_MAX_HEADS, "head count %u is outside 1..%u",
             hp->n_heads, PX__IR_MAX_HEADS);
    HP_CHECK(hp->n_kv_heads >= 1 && hp->n_kv_heads <= hp->n_heads &&
                 hp->n_heads % hp->n_kv_heads == 0,
             "%u key/value heads do not divide %u query heads; head_count_kv must "
             "divide head_count",
             hp->n_kv_heads, hp->n_heads);
    HP_CHECK(hp->head_dim >= 1 && hp->head_dim <= PX__IR_MAX_HEAD_DIM,
             "head size %u is outside 1..%u (dim %u / %u heads)", hp->head_dim, PX__IR_MAX_HEAD_DIM,
             hp->dim, hp->n_heads);
    HP_CHECK(hp->context_length >= 1 && hp->context_length <= PX__IR_MAX_CONTEXT,
             "context length %u is outside 1..%u", hp->context_length, PX__IR_MAX_CONTEXT);
    HP_CHECK(isfinite(hp->rms_eps) && hp->rms_eps > 0.0f && hp->rms_eps < 1.0f,
             "norm epsilon %g is not in (0, 1)", (double)hp->rms_eps);
    if (is_dit(hp)) {
        HP_CHECK(hp->dit_patch_size >= 1 && hp->dit_input_size >= hp->dit_patch_size &&
                     hp->dit_input_size % hp->dit_patch_size == 0 && hp->dit_input_size <= 4096,
                 "latent size %u is not a multiple of patch size %u (or over 4096)",
                 hp->dit_input_size, hp->dit_patch_size);
        HP_CHECK(hp->dit_in_channels >= 1 && hp->dit_in_channels <= 1024 &&
                     hp->dit_out_channels >= 1 && hp->dit_out_channels <= 1024 &&
                     hp->dit_freq_dim >= 2 && hp->dit_freq_dim <= 65536 && hp->dit_n_classes >= 1 &&
                     hp->dit_n_classes <= PX__IR_MAX_VOCAB && hp->dit_steps >= 1 &&
                     hp->dit_steps <= 100000,
                 "DiT parameters out of range (channels %u/%u, freq %u, classes %u, "
                 "steps %u)",
                 hp->dit_in_channels, hp->dit_out_channels, hp->dit_freq_dim, hp->dit_n_classes,
                 hp->dit_steps);
        return PX_OK;
    }
    HP_CHECK(hp->vocab_size >= 1 && hp->vocab_size <= PX__IR_MAX_VOCAB,
             "vocabulary size %u is outside 1..%u", hp->vocab_size, PX__IR_MAX_VOCAB);
    HP_CHECK(isfinite(hp->rope_theta) && hp->rope_theta > 0.0f,
             "rope frequency base %g is not a positive number", (double)hp->rope_theta);
    HP_CHECK(hp->rope_dim >= 2 && hp->rope_dim <= hp->head_dim && hp->rope_dim % 2 == 0,
             "rope dimension count %u must be even and at most the head size %u", hp->rope_dim,
             hp->head_dim);
    HP_CHECK(hp->n_experts <= PX__IR_MAX_EXPERTS && hp->n_experts_used <= hp->n_experts &&
                 (hp->n_experts == 0 || hp->n_experts_used >= 1),
             "%u experts with %u used per token: need 1 <= used <= experts <= %u", hp->n_experts,
             hp->n_experts_used, PX__IR_MAX_EXPERTS);
    HP_CHECK(hp->n_experts != 1, "%s",
             "an expert count of 1 is not a mixture; "
             "drop expert_count for a dense model");
    return PX_OK;
}

px_status px__ir_finish(px_ir_model *m, const px_ir_open_opts *opts, px_err *err)
{
    px_status st;
    if (opts) {
        if (opts->act_dtype != PX_DTYPE_F32 && (unsigned)opts->act_dtype < PX_DTYPE_COUNT_)
            m->act_dtype = opts->act_dtype;
        if (opts->kv_dtype_given && (unsigned)opts->kv_dtype >= PX_DTYPE_COUNT_)
            return px_err_set(err, PX_EINVAL,
                              "%s: KV-cache dtype %d is not a known dtype; pass one that "
                              "px_dtype_parse accepts (f32, f16, bf16, q8_0, ...)",
                              m->path, (int)opts->kv_dtype);
        /* F32 is also the zero of an unset field: it overrides (a preset's
         * 16-bit cache) only when the caller says it was given. */
        if ((opts->kv_dtype_given || opts->kv_dtype != PX_DTYPE_F32) &&
            (unsigned)opts->kv_dtype < PX_DTYPE_COUNT_) {
            m->kv_dtype = opts->kv_dtype;
            m->kv_dtype_given = true;
        }
    }
    if ((st = px__ir_check_hparams(m, err)) != PX_OK ||
        (st = check_block_numbers(m, err)) != PX_OK || (st = bind_roles(m, opts, err)) != PX_OK)
        return st;
    if (m->has_vocab && m->vocab.n_tokens > m->hp.vocab_size)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: the tokenizer has %u tokens but the embedding has only %u "
                          "rows; ids past the table could not be embedded",
                          m->path, m->vocab.n_tokens, m->hp.vocab_size);
    st = is_dit(&m->hp) ? px__ir_build_graph_dit(m, err) : px__ir_build_graph(m, err);
    if (st != PX_OK)
        return st;
    return px__ir_build_summary(m, err);
}

/* ---- opening ---- */

static px_status map_file(const char *path, void **map, size_t *len, px_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return px_err_set(err, PX_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return px_err_set(err, PX_EINVAL, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return px_err_set(err, PX_EPARSE,
                          "%s: the file is empty; expected a GGUF file "
                          "or a llama2.c checkpoint",
                          path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return px_err_set(err, PX_ELIMIT, "%s: too large to map", path);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return px_err_set(err, PX_EIO, "%s: cannot map: %s", path, strerror(e));
    *map = p;
    *len = (size_t)sb.st_size;
    return PX_OK;
}

/* Whether the file opens as text: its first bytes are printable or
 * white space.  A llama2.c checkpoint opens with small int32s, so with
 * zero bytes. */
static bool looks_like_text(const unsigned char *p, size_t len)
{
    size_t n = PX_MIN(len, (size_t)512);
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 && p[i] != '\n' && p[i] != '\r' && p[i] != '\t')
            return false;
    return n > 0;
}

/* A text file given as a model: named as what it is (a plexus document
 * by its schema, JSON, or text), with the fix. */
static px_status text_is_not_a_model(const char *path, const unsigned char *p, size_t len,
                                     px_err *err)
{
    char head[4097];
    size_t n = PX_MIN(len, sizeof head - 1);
    memcpy(head, p, n);
    head[n] = 0;
    const char *s = head;
    while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')
        s++;
    char kind[96] = "a text file";
    if (*s == '{' || *s == '[') {
        px_strlcpy(kind, "a JSON document", sizeof kind);
        const char *schema = strstr(head, "\"schema\"");
        const char *q = schema ? strchr(schema + 8, '"') : NULL;
        const char *e = q ? strchr(q + 1, '"') : NULL;
        if (e && e - q < 64)
            snprintf(kind, sizeof kind, "a %.*s document", (int)(e - q - 1), q + 1);
    }
    return px_err_set(err, PX_EINVAL,
                      "%s is %s, not a model: give a GGUF file, a llama2.c checkpoint or a "
                      "preset name (plexus model presets lists them)",
                      path, kind);
}

px_status px_ir_model_open(const char *path, const px_ir_open_opts *opts, px_ir_model **out,
                           px_err *err)
{
    *out = NULL;
    void *map = NULL;
    size_t len = 0;
    px_status st = map_file(path, &map, &len, err);
    if (st != PX_OK)
        return st;
    bool gguf = len >= 4 && !memcmp(map, "GGUF", 4);
    if (!gguf && looks_like_text(map, len)) {
        st = text_is_not_a_model(path, map, len, err);
        munmap(map, len);
        return st;
    }
    px_ir_model *m;
    st = px__ir_model_alloc(path, gguf ? PX_IR_SOURCE_GGUF : PX_IR_SOURCE_LLAMA2C, &m, err);
    if (st != PX_OK) {
        munmap(map, len);
        return st;
    }
    m->map = map;
    m->map_len = len;
    m->image = map;
    m->image_len = len;
    m->has_weights = true;
    st = gguf ? px__ir_gguf_parse(m, opts, err) : px__ir_llama2c_parse(m, opts, err);
    if (st == PX_OK)
        st = px__ir_finish(m, opts, err);
    if (st != PX_OK) {
        px_ir_model_free(m);
        return st;
    }
    *out = m;
    return PX_OK;
}

px_status px_ir_gguf_open_memory(const void *data, size_t len, const char *name,
                                 const px_ir_open_opts *opts, px_ir_model **out, px_err *err)
{
    *out = NULL;
    px_ir_model *m;
    px_status st = px__ir_model_alloc(name ? name : "(memory)", PX_IR_SOURCE_GGUF, &m, err);
    if (st != PX_OK)
        return st;
    m->image = data;
    m->image_len = len;
    m->has_weights = true;
    st = px__ir_gguf_parse(m, opts, err);
    if (st == PX_OK)
        st = px__ir_finish(m, opts, err);
    if (st != PX_OK) {
        px_ir_model_free(m);
        return st;
    }
    *out = m;
    return PX_OK;
}

px_status px_ir_model_open_any(const char *spec, const px_ir_open_opts *opts, px_ir_model **out,
                               px_err *err)
{
    for (size_t i = 0; i < px_ir_preset_count(); i++)
        if (!strcmp(px_ir_preset_at(i)->name, spec))
            return px_ir_preset_new(spec, PX_DTYPE_COUNT_, opts, out, err);
    px_status st = px_ir_model_open(spec, opts, out, err);
    if (st != PX_ENOTFOUND || strchr(spec, '/'))
        return st;
    /* Neither a file nor a preset: the presets, the nearest first when a
     * name is close (a shared prefix up to its size). */
    char list[1024] = "";
    size_t used = 0, best = 0;
    const char *near = NULL;
    for (size_t i = 0; i < px_ir_preset_count(); i++) {
        const char *name = px_ir_preset_at(i)->name;
        size_t k = 0;
        while (name[k] && name[k] == spec[k])
            k++;
        if (k > best && k >= 4 && k + 2 >= strlen(spec)) {
            best = k;
            near = name;
        }
        int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", name);
        if (w > 0 && (size_t)w < sizeof list - used)
            used += (size_t)w;
    }
    if (near)
        return px_err_set(err, PX_ENOTFOUND,
                          "%s: no such file, and no preset of that name; did you mean %s? "
                          "(presets: %s)",
                          spec, near, list);
    return px_err_set(err, PX_ENOTFOUND,
                      "%s: no such file, and no preset of that name (presets: %s)", spec, list);
}

/* ---- accessors ---- */

const px_ir_hparams *px_ir_model_hparams(const px_ir_model *m)
{
    return &m->hp;
}

px_ir_source px_ir_model_source(const px_ir_model *m)
{
    return m->source;
}

const char *px_ir_model_path(const px_ir_model *m)
{
    return m->path;
}

bool px_ir_model_has_weights(const px_ir_model *m)
{
    return m->has_weights;
}

bool px_ir_model_kv_dtype_given(const px_ir_model *m)
{
    return m->kv_dtype_given;
}

uint32_t px_ir_model_gguf_version(const px_ir_model *m)
{
    return m->gguf_version;
}

size_t px_ir_model_n_tensors(const px_ir_model *m)
{
    return m->n_tensors;
}

const px_ir_tensor *px_ir_model_tensor(const px_ir_model *m, size_t i)
{
    return i < m->n_tensors ? &m->tensors[i] : NULL;
}

const px_ir_tensor *px_ir_model_find_tensor(const px_ir_model *m, const char *name)
{
    uint32_t id = px__ir_find_tensor_id(m, name);
    return id == PX__IR_NO_TENSOR ? NULL : &m->tensors[id];
}

const px_ir_tensor *px_ir_model_weight(const px_ir_model *m, uint32_t layer, px_ir_role role)
{
    if ((unsigned)role >= PX_IR_ROLE_COUNT_ || !m->roles)
        return NULL;
    size_t row = 0;
    if (k_roles[role].per_layer) {
        if (layer >= m->hp.n_layers)
            return NULL;
        row = (size_t)layer + 1;
    }
    uint32_t id = m->roles[row * PX_IR_ROLE_COUNT_ + (size_t)role];
    return id == PX__IR_NO_TENSOR ? NULL : &m->tensors[id];
}

const px_ir_vocab *px_ir_model_vocab(const px_ir_model *m)
{
    return m->has_vocab ? &m->vocab : NULL;
}

const px__gguf_kv *px__ir_meta_find(const px_ir_model *m, const char *key)
{
    for (size_t i = 0; i < m->n_kvs; i++)
        if (!strcmp(m->kvs[i].key, key))
            return &m->kvs[i];
    return NULL;
}

static bool is_int_type(px_gguf_type t)
{
    return t == PX_GGUF_U8 || t == PX_GGUF_U16 || t == PX_GGUF_U32 || t == PX_GGUF_U64 ||
           t == PX_GGUF_I8 || t == PX_GGUF_I16 || t == PX_GGUF_I32 || t == PX_GGUF_I64 ||
           t == PX_GGUF_BOOL;
}

static bool is_signed_type(px_gguf_type t)
{
    return t == PX_GGUF_I8 || t == PX_GGUF_I16 || t == PX_GGUF_I32 || t == PX_GGUF_I64;
}

bool px_ir_model_meta_u64(const px_ir_model *m, const char *key, uint64_t *out)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    if (!kv || !is_int_type(kv->type))
        return false;
    if (is_signed_type(kv->type) && kv->v.i < 0)
        return false;
    *out = kv->v.u;
    return true;
}

bool px_ir_model_meta_f64(const px_ir_model *m, const char *key, double *out)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    if (!kv)
        return false;
    if (kv->type == PX_GGUF_F32 || kv->type == PX_GGUF_F64)
        *out = kv->v.f;
    else if (is_signed_type(kv->type))
        *out = (double)kv->v.i;
    else if (is_int_type(kv->type))
        *out = (double)kv->v.u;
    else
        return false;
    return true;
}

bool px_ir_model_meta_str(const px_ir_model *m, const char *key, const char **out)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    if (!kv || kv->type != PX_GGUF_STRING)
        return false;
    *out = kv->str;
    return true;
}

size_t px_ir_model_n_meta(const px_ir_model *m)
{
    return m->n_kvs;
}

void px_ir_model_meta_at(const px_ir_model *m, size_t i, const char **key, const char **value_text)
{
    if (i >= m->n_kvs) {
        *key = *value_text = NULL;
        return;
    }
    *key = m->kvs[i].key;
    *value_text = m->kvs[i].text;
}
