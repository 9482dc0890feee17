/*
 * Models the runtime can execute: an IR model checked once for what the
 * kernels support, with each layer's weights resolved by role.
 */
#include "base/common.h"

#include <sys/mman.h>

#include "rt/rt_impl.h"

static px_status check_weight(const px_ir_model *ir, const px_ir_tensor *t, const char *role,
                              int32_t layer, uint64_t ne0, uint64_t ne1, bool matrix, px_err *err)
{
    const char *path = px_ir_model_path(ir);
    if (!t) {
        if (layer >= 0)
            return px_err_set(err, PX_EVALIDATE, "%s: layer %d has no %s tensor", path, layer,
                              role);
        return px_err_set(err, PX_EVALIDATE, "%s: the model has no %s tensor", path, role);
    }
    if (!t->data)
        return px_err_set(err, PX_EUNSUPPORTED, "%s: tensor %s has no data", path, t->name);
    if (t->ne[0] != ne0 || (matrix ? t->ne[1] != ne1 : t->n_elems != ne0) ||
        (matrix && t->n_elems != ne0 * ne1))
        return px_err_set(err, PX_EVALIDATE,
                          "%s: tensor %s has shape [%" PRIu64 ", %" PRIu64
                          "]; the hyper-parameters need [%" PRIu64 ", %" PRIu64 "]",
                          path, t->name, t->ne[0], t->ne[1], ne0, matrix ? ne1 : 1);
    if (matrix ? !px__rt_dtype_supported(t->dtype) : t->dtype != PX_DTYPE_F32)
        return px_err_set(
            err, PX_EUNSUPPORTED, "%s: tensor %s is %s; the runtime runs %s", path, t->name,
            px_dtype_name(t->dtype),
            matrix ? "f32, f16, bf16, q8_0, q4_0, q5_0, q2_k, q3_k, q4_k, q5_k and q6_k matrices"
                   : "f32 norms and biases");
    /* The kernels index rows by nb[1]; make sure they stay in the data. */
    uint64_t need;
    if (matrix && (__builtin_mul_overflow(t->nb[1], t->ne[1], &need) || need > t->n_bytes))
        return px_err_set(err, PX_EVALIDATE, "%s: tensor %s: rows overrun its data", path, t->name);
    if (!matrix && t->n_bytes < ne0 * sizeof(float))
        return px_err_set(err, PX_EVALIDATE, "%s: tensor %s is too short", path, t->name);
    return PX_OK;
}

static px_status check_hparams(const char *path, const px_ir_hparams *hp, px_err *err)
{
    switch (hp->arch) {
    case PX_IR_ARCH_LLAMA:
    case PX_IR_ARCH_MISTRAL:
    case PX_IR_ARCH_QWEN2:
        break;
    default:
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: architecture %s is not executable by the "
                          "runtime yet (it runs llama, mistral and qwen2 models); plan and "
                          "simulate it instead",
                          path, px_ir_arch_name(hp->arch));
    }
    if (!hp->dim || !hp->hidden_dim || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads ||
        !hp->head_dim || !hp->vocab_size || hp->n_heads % hp->n_kv_heads)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: inconsistent hyper-parameters (dim %u, "
                          "hidden %u, layers %u, heads %u, kv heads %u, head size %u, vocab %u)",
                          path, hp->dim, hp->hidden_dim, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                          hp->head_dim, hp->vocab_size);
    uint32_t rope_dim = hp->rope_dim ? hp->rope_dim : hp->head_dim;
    if (rope_dim % 2 || rope_dim > hp->head_dim)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: rotary dimensions %u must be even and at most "
                          "the head size %u",
                          path, rope_dim, hp->head_dim);
    if (hp->rope_style != PX_IR_ROPE_ADJACENT && hp->rope_style != PX_IR_ROPE_HALVES)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: the model has no rotary embedding style "
                          "the runtime knows",
                          path);
    if (!(hp->rms_eps > 0) || !isfinite(hp->rope_theta) || hp->rope_theta <= 0)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: rms epsilon %g or rope theta %g is not "
                          "positive",
                          path, (double)hp->rms_eps, (double)hp->rope_theta);
    return PX_OK;
}

px_status px_rt_model_new(const px_ir_model *ir, px_rt_model **out, px_err *err)
{
    *out = NULL;
    const char *path = px_ir_model_path(ir);
    if (!px_ir_model_has_weights(ir))
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s is a preset (hyper-parameters only, no "
                          "weights): the runtime needs a model file (.gguf or a llama2.c "
                          ".bin)",
                          path);
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    px_status st = check_hparams(path, hp, err);
    if (st)
        return st;
    px_rt_model *m = calloc(1, sizeof *m);
    if (!m)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    m->ir = ir;
    m->hp = *hp;
    if (!m->hp.rope_dim)
        m->hp.rope_dim = hp->head_dim;
    m->q_dim = hp->n_heads * hp->head_dim;
    m->kv_dim = hp->n_kv_heads * hp->head_dim;
    m->layers = calloc(hp->n_layers, sizeof *m->layers);
    m->repacked = calloc(1, sizeof *m->repacked);
    if (m->repacked)
        pthread_mutex_init(&m->repacked->lock, NULL);
    if (!m->layers || !m->repacked) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    uint64_t dim = hp->dim, hid = hp->hidden_dim, vocab = hp->vocab_size;
    m->tok_embd = px_ir_model_weight(ir, 0, PX_IR_ROLE_TOKEN_EMBD);
    m->output_norm = px_ir_model_weight(ir, 0, PX_IR_ROLE_OUTPUT_NORM);
    m->output = px_ir_model_weight(ir, 0, PX_IR_ROLE_OUTPUT);
    if ((st = check_weight(ir, m->tok_embd, "token_embd", -1, dim, vocab, true, err)) ||
        (st = check_weight(ir, m->output_norm, "output_norm", -1, dim, 1, false, err)) ||
        (st = check_weight(ir, m->output, "output", -1, dim, vocab, true, err)))
        goto fail;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        px__rt_layer_weights *w = &m->layers[l];
        int32_t li = (int32_t)l;
        w->attn_norm = px_ir_model_weight(ir, l, PX_IR_ROLE_ATTN_NORM);
        w->wq = px_ir_model_weight(ir, l, PX_IR_ROLE_WQ);
        w->wk = px_ir_model_weight(ir, l, PX_IR_ROLE_WK);
        w->wv = px_ir_model_weight(ir, l, PX_IR_ROLE_WV);
        w->wo = px_ir_model_weight(ir, l, PX_IR_ROLE_WO);
        w->ffn_norm = px_ir_model_weight(ir, l, PX_IR_ROLE_FFN_NORM);
        w->w1 = px_ir_model_weight(ir, l, PX_IR_ROLE_W1_GATE);
        w->w2 = px_ir_model_weight(ir, l, PX_IR_ROLE_W2_DOWN);
        w->w3 = px_ir_model_weight(ir, l, PX_IR_ROLE_W3_UP);
        if ((st = check_weight(ir, w->attn_norm, "attn_norm", li, dim, 1, false, err)) ||
            (st = check_weight(ir, w->wq, "attn_q", li, dim, m->q_dim, true, err)) ||
            (st = check_weight(ir, w->wk, "attn_k", li, dim, m->kv_dim, true, err)) ||
            (st = check_weight(ir, w->wv, "attn_v", li, dim, m->kv_dim, true, err)) ||
            (st = check_weight(ir, w->wo, "attn_output", li, m->q_dim, dim, true, err)) ||
            (st = check_weight(ir, w->ffn_norm, "ffn_norm", li, dim, 1, false, err)) ||
            (st = check_weight(ir, w->w1, "ffn_gate", li, dim, hid, true, err)) ||
            (st = check_weight(ir, w->w2, "ffn_down", li, hid, dim, true, err)) ||
            (st = check_weight(ir, w->w3, "ffn_up", li, dim, hid, true, err)))
            goto fail;
        if (hp->qkv_bias) {
            w->bq = px_ir_model_weight(ir, l, PX_IR_ROLE_BQ);
            w->bk = px_ir_model_weight(ir, l, PX_IR_ROLE_BK);
            w->bv = px_ir_model_weight(ir, l, PX_IR_ROLE_BV);
            if ((st = check_weight(ir, w->bq, "attn_q.bias", li, m->q_dim, 1, false, err)) ||
                (st = check_weight(ir, w->bk, "attn_k.bias", li, m->kv_dim, 1, false, err)) ||
                (st = check_weight(ir, w->bv, "attn_v.bias", li, m->kv_dim, 1, false, err)))
                goto fail;
        }
    }
    *out = m;
    return PX_OK;
fail:
    px_rt_model_free(m);
    return st;
}

px_status px_rt_model_open(const char *path, px_rt_model **out, px_err *err)
{
    *out = NULL;
    px_ir_model *ir;
    px_status st = px_ir_model_open(path, NULL, &ir, err);
    if (st)
        return st;
    if ((st = px_rt_model_new(ir, out, err)) != PX_OK) {
        px_ir_model_free(ir);
        return st;
    }
    (*out)->owned_ir = ir;
    return PX_OK;
}

void px_rt_model_free(px_rt_model *m)
{
    if (!m)
        return;
    if (m->repacked) {
        for (size_t i = 0; i < m->repacked->n_chunks; i++)
            free(m->repacked->chunks[i]);
        free(m->repacked->chunks);
        free(m->repacked->items);
        pthread_mutex_destroy(&m->repacked->lock);
        free(m->repacked);
    }
    free(m->layers);
    px_ir_model_free(m->owned_ir);
    free(m);
}

/* Repacked matrices lie in chunks of at least this many bytes, aligned to and asked for in
 * huge pages: one fault for 2 MiB rather than one for 4 KiB (repacking a 70 MB model took 0.27
 * s with small pages, 0.13 s with huge ones), and no page of the chunk taken before it is
 * written, so that a chunk's unused tail costs no memory. */
#define REPACK_CHUNK ((size_t)64 << 20)
#define HUGE_PAGE    ((size_t)2 << 20)

/* n bytes (64-byte aligned) of c's chunks, under its lock. */
static void *chunk_bytes(px__rt_repack_cache *c, size_t n)
{
    n = (n + 63) / 64 * 64;
    if (!c->n_chunks || c->used + n > c->size) {
        if (c->n_chunks == c->cap_chunks) {
            size_t cap = c->cap_chunks ? 2 * c->cap_chunks : 8;
            uint8_t **chunks = realloc(c->chunks, cap * sizeof *chunks);
            if (!chunks)
                return NULL;
            c->chunks = chunks;
            c->cap_chunks = cap;
        }
        size_t size = PX_MAX(REPACK_CHUNK, (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
        uint8_t *chunk = aligned_alloc(HUGE_PAGE, size);
        if (!chunk)
            return NULL;
        madvise(chunk, size, MADV_HUGEPAGE); /* a hint: small pages where it is refused */
        c->chunks[c->n_chunks++] = chunk;
        c->size = size;
        c->used = 0;
    }
    void *p = c->chunks[c->n_chunks - 1] + c->used;
    c->used += n;
    return p;
}

px_status px__rt_model_repacked(const px_rt_model *m, const px_ir_tensor *src, px_rt_layout layout,
                                const void **out, px_err *err)
{
    px__rt_repack_cache *c = m->repacked;
    px_status st = PX_OK;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->n; i++)
        if (c->items[i].src == src && c->items[i].layout == layout) {
            *out = c->items[i].data;
            goto done;
        }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        px__rt_repacked *items = realloc(c->items, cap * sizeof *items);
        if (!items) {
            st = px_err_set(err, PX_ENOMEM, "weight %s: out of memory", src->name);
            goto done;
        }
        c->items = items;
        c->cap = cap;
    }
    void *data = chunk_bytes(c, (size_t)src->n_bytes);
    if (!data) {
        st = px_err_set(err, PX_ENOMEM, "weight %s: cannot allocate %" PRIu64 " bytes to repack it",
                        src->name, src->n_bytes);
        goto done;
    }
    st = px_rt_weights_repack(layout, src->dtype, src->data, (size_t)src->nb[1], src->ne[1],
                              src->ne[0], data, err);
    if (st) {
        /* The bytes stay in the chunk, unused: a refusal is the caller's error, not a loop. */
        px_err_prefix(err, st, "weight %s: ", src->name);
        goto done;
    }
    c->items[c->n++] = (px__rt_repacked){src, layout, data};
    *out = data;
done:
    pthread_mutex_unlock(&c->lock);
    return st;
}

const px_ir_model *px_rt_model_ir(const px_rt_model *m)
{
    return m->ir;
}

const px_ir_hparams *px_rt_model_hparams(const px_rt_model *m)
{
    return &m->hp;
}

void px__rt_rope_table(float *table, uint32_t context, uint32_t rope_dim, float theta)
{
    for (uint32_t p = 0; p < context; p++)
        for (uint32_t i = 0; i < rope_dim / 2; i++) {
            double freq = pow((double)theta, -2.0 * (double)i / (double)rope_dim);
            double a = (double)p * freq;
            table[(size_t)p * rope_dim + 2 * i] = (float)cos(a);
            table[(size_t)p * rope_dim + 2 * i + 1] = (float)sin(a);
        }
}

int32_t px_rt_argmax(const float *x, size_t n)
{
    if (n == 0)
        return -1;
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}
