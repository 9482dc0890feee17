/*
 * llama2.c checkpoints (Karpathy's run.c and export.py).
 *
 * Legacy (version 0): 7 x int32 dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size (negative: the classifier is not shared),
 * seq_len; then float32 arrays in this order, each for all layers at once:
 * token_embedding_table [vocab x dim], rms_att_weight [L x dim], wq
 * [L x dim x dim], wk and wv [L x kv_dim x dim], wo [L x dim x dim],
 * rms_ffn_weight [L x dim], w1 [L x hidden x dim], w2 [L x dim x hidden],
 * w3 [L x hidden x dim], rms_final_weight [dim], freq_cis_real and
 * freq_cis_imag [seq_len x head_size/2 each, unused], then wcls
 * [vocab x dim] when unshared.
 *
 * Version 1 (export.py --version 1): u32 magic "ak42" (0x616b3432), i32
 * version 1, the same 7 x int32, u8 shared_classifier, zero padding to 256
 * bytes; then float32: rms_att (all layers), rms_ffn (all layers),
 * rms_final, token embedding, wq, wk, wv, wo, w1, w2, w3 (each all layers),
 * then wcls when unshared.
 *
 * The file size must equal what the header implies, exactly.  Each tensor
 * gets its GGUF name and points into the mapping; (d_out x d_in) row-major
 * arrays are GGUF's ne = {d_in, d_out}.
 */
#include "ir/ir_impl.h"

typedef struct l2c_part {
    px_ir_role role;
    uint64_t ne0, ne1; /* per layer (or global) shape; ne1 = 1 for vectors */
    bool per_layer;
} l2c_part;

static int32_t rd_i32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)u;
}

/* Adds the tensors of one part at *off; checks the file holds them. */
static px_status add_part(px_ir_model *m, const l2c_part *pt, uint64_t *off, size_t *next,
                          px_err *err)
{
    uint32_t n = pt->per_layer ? m->hp.n_layers : 1;
    uint64_t elems = pt->ne0 * pt->ne1; /* bounded by the hparam limits */
    for (uint32_t l = 0; l < n; l++) {
        px_ir_tensor *t = &m->tensors[(*next)++];
        t->name = px__ir_role_tensor_name(m->arena, pt->role, l);
        if (!t->name)
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
        t->dtype = PX_DTYPE_F32;
        t->n_dims = pt->ne1 > 1 ? 2 : 1;
        t->ne[0] = pt->ne0;
        t->ne[1] = pt->ne1;
        t->ne[2] = t->ne[3] = 1;
        t->n_elems = elems;
        t->n_bytes = elems * 4;
        t->nb[0] = 4;
        t->nb[1] = 4 * pt->ne0;
        t->nb[2] = t->nb[3] = t->nb[1] * pt->ne1;
        t->offset = *off;
        if (*off > m->image_len || t->n_bytes > m->image_len - *off)
            return px_err_set(err, PX_EPARSE, "%s: tensor %s ends past the file", m->path, t->name);
        t->data = m->image + *off;
        *off += t->n_bytes;
    }
    return PX_OK;
}

px_status px__ir_llama2c_parse(px_ir_model *m, const px_ir_open_opts *opts, px_err *err)
{
    const uint8_t *p = m->image;
    size_t len = m->image_len;
    uint64_t header = 28;
    int version = 0;
    bool shared;
    if (len >= 8 && rd_i32(p) == 0x616b3432) {
        version = rd_i32(p + 4);
        if (version != 1)
            return px_err_set(err, PX_EUNSUPPORTED,
                              "%s: byte 4: llama2.c export version %d; only versions 0 "
                              "(legacy) and 1 (float32) are read",
                              m->path, version);
        if (len < 256)
            return px_err_set(err, PX_EPARSE,
                              "%s: the file is %zu bytes, shorter than the "
                              "256-byte llama2.c version 1 header",
                              m->path, len);
        p += 8;
        header = 256;
    } else if (len < 28) {
        return px_err_set(err, PX_EPARSE,
                          "%s: %zu bytes: not a GGUF file and too short for a llama2.c "
                          "checkpoint (28-byte header)",
                          m->path, len);
    }
    int32_t h[7];
    for (int i = 0; i < 7; i++)
        h[i] = rd_i32(p + 4 * i);
    if (version == 1) {
        uint8_t flag = p[28];
        if (flag > 1)
            return px_err_set(err, PX_EPARSE,
                              "%s: byte 36: shared_classifier flag %u is "
                              "neither 0 nor 1",
                              m->path, flag);
        shared = flag == 1;
        if (h[5] <= 0)
            return px_err_set(err, PX_EPARSE,
                              "%s: byte 28: vocabulary size %d is not "
                              "positive",
                              m->path, h[5]);
    } else {
        shared = h[5] > 0;
        if (h[5] == INT32_MIN)
            h[5] = 0;
        h[5] = h[5] < 0 ? -h[5] : h[5];
    }
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (h[i] <= 0)
            return px_err_set(err, PX_EPARSE,
                              "%s: byte %d: %s is %d; not a GGUF file, and not a llama2.c "
                              "checkpoint (its header holds 7 positive int32 values)",
                              m->path, (version ? 8 : 0) + 4 * i, names[i], h[i]);
    px_ir_hparams *hp = &m->hp;
    hp->arch = PX_IR_ARCH_LLAMA;
    px_strlcpy(hp->arch_name, "llama", sizeof hp->arch_name);
    hp->dim = (uint32_t)h[0];
    hp->hidden_dim = (uint32_t)h[1];
    hp->n_layers = (uint32_t)h[2];
    hp->n_heads = (uint32_t)h[3];
    hp->n_kv_heads = (uint32_t)h[4];
    hp->vocab_size = (uint32_t)h[5];
    hp->context_length = (uint32_t)h[6];
    hp->head_dim = hp->dim / hp->n_heads;
    hp->rope_dim = hp->head_dim;
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->rope_style = PX_IR_ROPE_ADJACENT;
    if (hp->dim % hp->n_heads)
        return px_err_set(err, PX_EVALIDATE, "%s: dim %u is not a multiple of n_heads %u", m->path,
                          hp->dim, hp->n_heads);
    px_status st = px__ir_check_hparams(m, err);
    if (st != PX_OK)
        return st;

    uint64_t d = hp->dim, hd = hp->hidden_dim, v = hp->vocab_size;
    uint64_t kv = (uint64_t)hp->n_kv_heads * hp->head_dim, L = hp->n_layers;
    /* Every size below is bounded by the hyper-parameter limits, far from
     * overflowing 64 bits. */
    uint64_t per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * d * hd;
    uint64_t floats = v * d + L * per_layer + d + (shared ? 0 : v * d);
    if (version == 0)
        floats += (uint64_t)hp->context_length * (hp->head_dim / 2) * 2;
    uint64_t expect = header + floats * 4;
    if (expect != len)
        return px_err_set(err, PX_EPARSE,
                          "%s: the llama2.c header (dim %u, hidden %u, %u layers, %u heads, "
                          "%u kv heads, vocab %u%s, seq_len %u) implies %" PRIu64
                          " bytes but the file has %zu; it is truncated, padded, or not a "
                          "llama2.c checkpoint",
                          m->path, hp->dim, hp->hidden_dim, hp->n_layers, hp->n_heads,
                          hp->n_kv_heads, hp->vocab_size, shared ? "" : " unshared",
                          hp->context_length, expect, len);

    const l2c_part emb = {PX_IR_ROLE_TOKEN_EMBD, d, v, false};
    const l2c_part att_norm = {PX_IR_ROLE_ATTN_NORM, d, 1, true};
    const l2c_part ffn_norm = {PX_IR_ROLE_FFN_NORM, d, 1, true};
    const l2c_part fin_norm = {PX_IR_ROLE_OUTPUT_NORM, d, 1, false};
    const l2c_part mats[7] = {
        {PX_IR_ROLE_WQ, d, d, true},       {PX_IR_ROLE_WK, d, kv, true},
        {PX_IR_ROLE_WV, d, kv, true},      {PX_IR_ROLE_WO, d, d, true},
        {PX_IR_ROLE_W1_GATE, d, hd, true}, {PX_IR_ROLE_W2_DOWN, hd, d, true},
        {PX_IR_ROLE_W3_UP, d, hd, true},
    };
    const l2c_part cls = {PX_IR_ROLE_OUTPUT, d, v, false};
    m->n_tensors = 2 + 9 * L + (shared ? 0 : 1);
    m->tensors = px_arena_calloc(m->arena, m->n_tensors, sizeof *m->tensors);
    if (!m->tensors)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
    uint64_t off = header;
    size_t next = 0;
    if (version == 0) {
        if ((st = add_part(m, &emb, &off, &next, err)) ||
            (st = add_part(m, &att_norm, &off, &next, err)))
            return st;
        for (int i = 0; i < 4; i++)
            if ((st = add_part(m, &mats[i], &off, &next, err)))
                return st;
        if ((st = add_part(m, &ffn_norm, &off, &next, err)))
            return st;
        for (int i = 4; i < 7; i++)
            if ((st = add_part(m, &mats[i], &off, &next, err)))
                return st;
        if ((st = add_part(m, &fin_norm, &off, &next, err)))
            return st;
        off += (uint64_t)hp->context_length * (hp->head_dim / 2) * 2 * 4;
    } else {
        if ((st = add_part(m, &att_norm, &off, &next, err)) ||
            (st = add_part(m, &ffn_norm, &off, &next, err)) ||
            (st = add_part(m, &fin_norm, &off, &next, err)) ||
            (st = add_part(m, &emb, &off, &next, err)))
            return st;
        for (int i = 0; i < 7; i++)
            if ((st = add_part(m, &mats[i], &off, &next, err)))
                return st;
    }
    if (!shared && (st = add_part(m, &cls, &off, &next, err)))
        return st;
    PX_ASSERT(next == m->n_tensors && off == len);
    if ((st = px__ir_index_tensors(m, err)) != PX_OK)
        return st;
    if (opts && opts->tokenizer_path) {
        if ((st = px_ir_vocab_read_llama2c(opts->tokenizer_path, hp->vocab_size, m->arena,
                                           &m->vocab, err)) != PX_OK)
            return st;
        m->has_vocab = true;
    }
    return PX_OK;
}
