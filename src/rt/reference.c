/*
 * The scalar reference forward pass: one sequence, one token at a time,
 * in double precision, reading every weight value by value.  It shares
 * nothing with the backends but the model's resolved tensors and, for
 * q8_0 weights, the definition of the activations' quantization (the
 * q8_0 kernels multiply quantized activations, as the field's runtimes
 * do), and is
 * written to read like the model's definition (llama2.c's run.c), so
 * that it can be trusted as the yardstick for every backend.
 */
#include "base/common.h"

#include "rt/rt_impl.h"

struct px_rt_ref {
    const px_rt_model *m;
    uint32_t context;
    uint32_t n_pos;            /* positions in the cache */
    double *x;                 /* residual stream [dim] */
    double *xb;                /* normed input [dim] */
    double *q;                 /* [q_dim] */
    double *k, *v;             /* [kv_dim] */
    double *att;               /* attention output [q_dim] */
    double *tmp;               /* projection output [dim] */
    double *hb, *hb2;          /* [hidden] */
    double *scores;            /* [context] */
    double *qx;                /* a matrix's input as quantized [max width] */
    double *k_cache, *v_cache; /* [n_layers][context][kv_dim] */
};

px_status px_rt_ref_new(const px_rt_model *m, uint32_t context, px_rt_ref **out, px_err *err)
{
    *out = NULL;
    const px_ir_hparams *hp = &m->hp;
    if (context == 0)
        context = hp->context_length ? hp->context_length : 2048;
    if (context > (1u << 20))
        return px_err_set(err, PX_EINVAL, "reference: context %u is too long", context);
    px_rt_ref *r = calloc(1, sizeof *r);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "reference: out of memory");
    r->m = m;
    r->context = context;
    size_t cache = (size_t)hp->n_layers * context * m->kv_dim;
    r->x = calloc(hp->dim, sizeof(double));
    r->xb = calloc(hp->dim, sizeof(double));
    r->q = calloc(m->q_dim, sizeof(double));
    r->k = calloc(m->kv_dim, sizeof(double));
    r->v = calloc(m->kv_dim, sizeof(double));
    r->att = calloc(m->q_dim, sizeof(double));
    r->tmp = calloc(hp->dim, sizeof(double));
    r->hb = calloc(hp->hidden_dim, sizeof(double));
    r->hb2 = calloc(hp->hidden_dim, sizeof(double));
    r->scores = calloc(context, sizeof(double));
    r->qx = calloc(PX_MAX(PX_MAX(hp->dim, m->q_dim), hp->hidden_dim), sizeof(double));
    r->k_cache = calloc(cache, sizeof(double));
    r->v_cache = calloc(cache, sizeof(double));
    if (!r->x || !r->xb || !r->q || !r->k || !r->v || !r->att || !r->tmp || !r->hb || !r->hb2 ||
        !r->qx || !r->scores || !r->k_cache || !r->v_cache) {
        px_rt_ref_free(r);
        return px_err_set(err, PX_ENOMEM, "reference: out of memory for a context of %u", context);
    }
    *out = r;
    return PX_OK;
}

void px_rt_ref_free(px_rt_ref *r)
{
    if (!r)
        return;
    free(r->x);
    free(r->xb);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->att);
    free(r->tmp);
    free(r->hb);
    free(r->hb2);
    free(r->scores);
    free(r->qx);
    free(r->k_cache);
    free(r->v_cache);
    free(r);
}

/* What a matrix of dtype t multiplies: x itself, or for q8_0 weights x
 * quantized to q8_0 blocks as the kernels define it (the activations in
 * f32, then px__rt_quantize_q8_act), each value its block's scale times
 * its int8.  Returns x or q. */
static const double *matmul_input(px_dtype t, const double *x, uint32_t n, double *q)
{
    if (t != PX_DTYPE_Q8_0)
        return x;
    for (uint32_t b = 0; b < n / 32; b++) {
        float xf[32], d;
        int8_t qb[32];
        for (uint32_t j = 0; j < 32; j++)
            xf[j] = (float)x[b * 32 + j];
        px__rt_quantize_q8_act(xf, 32, qb, &d);
        for (uint32_t j = 0; j < 32; j++)
            q[b * 32 + j] = (double)d * qb[j];
    }
    return q;
}

/* out = W x (+ bias), W stored as ne[1] rows of ne[0] values; q holds
 * ne[0] values of scratch. */
static void matvec(double *out, const double *x, const px_ir_tensor *w, const px_ir_tensor *bias,
                   double *q)
{
    const uint8_t *base = w->data;
    x = matmul_input(w->dtype, x, (uint32_t)w->ne[0], q);
    for (uint64_t i = 0; i < w->ne[1]; i++) {
        const uint8_t *row = base + i * w->nb[1];
        double sum = bias ? ((const float *)bias->data)[i] : 0.0;
        for (uint64_t j = 0; j < w->ne[0]; j++)
            sum += px__rt_weight_at(w->dtype, row, (uint32_t)j) * x[j];
        out[i] = sum;
    }
}

static void rmsnorm(double *out, const double *x, const px_ir_tensor *w, uint32_t n, float eps)
{
    double ss = 0;
    for (uint32_t j = 0; j < n; j++)
        ss += x[j] * x[j];
    double scale = 1.0 / sqrt(ss / n + (double)eps);
    const float *g = w->data;
    for (uint32_t j = 0; j < n; j++)
        out[j] = (double)g[j] * (x[j] * scale);
}

/* Rotates each head of v (n_heads heads) by position pos. */
static void rope(double *v, uint32_t n_heads, const px_ir_hparams *hp, uint32_t pos)
{
    uint32_t half = hp->rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        double *head = v + (size_t)h * hp->head_dim;
        for (uint32_t i = 0; i < half; i++) {
            double freq = pow((double)hp->rope_theta, -2.0 * i / (double)hp->rope_dim);
            double c = cos(pos * freq), s = sin(pos * freq);
            uint32_t a = hp->rope_style == PX_IR_ROPE_HALVES ? i : 2 * i;
            uint32_t b = hp->rope_style == PX_IR_ROPE_HALVES ? i + half : 2 * i + 1;
            double v0 = head[a], v1 = head[b];
            head[a] = v0 * c - v1 * s;
            head[b] = v0 * s + v1 * c;
        }
    }
}

px_status px_rt_ref_forward(px_rt_ref *r, int32_t token, uint32_t pos, float *logits, px_err *err)
{
    const px_rt_model *m = r->m;
    const px_ir_hparams *hp = &m->hp;
    if (token < 0 || (uint32_t)token >= hp->vocab_size)
        return px_err_set(err, PX_EINVAL, "reference: token %d is outside the vocabulary [0, %u)",
                          token, hp->vocab_size);
    if (pos > r->n_pos)
        return px_err_set(err, PX_EINVAL, "reference: position %u would leave a gap (%u run)", pos,
                          r->n_pos);
    if (pos >= r->context)
        return px_err_set(err, PX_ELIMIT, "reference: position %u is past the context of %u", pos,
                          r->context);
    uint32_t dim = hp->dim, hd = hp->head_dim, kv_dim = m->kv_dim;
    uint32_t group = hp->n_heads / hp->n_kv_heads;

    const px_ir_tensor *emb = m->tok_embd;
    const uint8_t *erow = (const uint8_t *)emb->data + (size_t)token * emb->nb[1];
    for (uint32_t j = 0; j < dim; j++)
        r->x[j] = px__rt_weight_at(emb->dtype, erow, j);

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const px__rt_layer_weights *w = &m->layers[l];
        rmsnorm(r->xb, r->x, w->attn_norm, dim, hp->rms_eps);
        matvec(r->q, r->xb, w->wq, w->bq, r->qx);
        matvec(r->k, r->xb, w->wk, w->bk, r->qx);
        matvec(r->v, r->xb, w->wv, w->bv, r->qx);
        rope(r->q, hp->n_heads, hp, pos);
        rope(r->k, hp->n_kv_heads, hp, pos);
        double *kc = r->k_cache + (size_t)l * r->context * kv_dim;
        double *vc = r->v_cache + (size_t)l * r->context * kv_dim;
        memcpy(kc + (size_t)pos * kv_dim, r->k, kv_dim * sizeof(double));
        memcpy(vc + (size_t)pos * kv_dim, r->v, kv_dim * sizeof(double));

        uint32_t first = 0;
        if (hp->sliding_window && pos >= hp->sliding_window)
            first = pos - hp->sliding_window + 1;
        for (uint32_t h = 0; h < hp->n_heads; h++) {
            const double *q = r->q + (size_t)h * hd;
            size_t kv_off = (size_t)(h / group) * hd;
            double max = -INFINITY, sum = 0;
            for (uint32_t t = first; t <= pos; t++) {
                double s = 0;
                for (uint32_t d = 0; d < hd; d++)
                    s += q[d] * kc[(size_t)t * kv_dim + kv_off + d];
                r->scores[t] = s / sqrt((double)hd);
                max = r->scores[t] > max ? r->scores[t] : max;
            }
            for (uint32_t t = first; t <= pos; t++) {
                r->scores[t] = exp(r->scores[t] - max);
                sum += r->scores[t];
            }
            double *o = r->att + (size_t)h * hd;
            for (uint32_t d = 0; d < hd; d++) {
                double acc = 0;
                for (uint32_t t = first; t <= pos; t++)
                    acc += r->scores[t] / sum * vc[(size_t)t * kv_dim + kv_off + d];
                o[d] = acc;
            }
        }
        matvec(r->tmp, r->att, w->wo, NULL, r->qx);
        for (uint32_t j = 0; j < dim; j++)
            r->x[j] += r->tmp[j];

        rmsnorm(r->xb, r->x, w->ffn_norm, dim, hp->rms_eps);
        matvec(r->hb, r->xb, w->w1, NULL, r->qx);
        matvec(r->hb2, r->xb, w->w3, NULL, r->qx);
        for (uint32_t j = 0; j < hp->hidden_dim; j++)
            r->hb[j] = r->hb[j] / (1.0 + exp(-r->hb[j])) * r->hb2[j];
        matvec(r->tmp, r->hb, w->w2, NULL, r->qx);
        for (uint32_t j = 0; j < dim; j++)
            r->x[j] += r->tmp[j];
    }
    rmsnorm(r->xb, r->x, m->output_norm, dim, hp->rms_eps);
    const px_ir_tensor *out = m->output;
    const double *xo = matmul_input(out->dtype, r->xb, dim, r->qx);
    for (uint32_t i = 0; i < hp->vocab_size; i++) {
        const uint8_t *row = (const uint8_t *)out->data + (size_t)i * out->nb[1];
        double sum = 0;
        for (uint32_t j = 0; j < dim; j++)
            sum += px__rt_weight_at(out->dtype, row, j) * xo[j];
        logits[i] = (float)sum;
    }
    r->n_pos = pos + 1;
    return PX_OK;
}
