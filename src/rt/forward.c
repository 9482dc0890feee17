/*
 * The forward pass of a llama-family transformer over a batch of
 * sequences and a range of layers, as a list of ops the session's stream
 * runs.  Per layer (llama2.c's forward, batched over rows):
 *
 *     xb  = rmsnorm(x, attn_norm)
 *     q, k, v = xb * wq, wk, wv (+ biases)     rope(q), rope(k)
 *     att = attention(q, k, v, cache)          (stores k, v first)
 *     x  += att * wo
 *     xb  = rmsnorm(x, ffn_norm)
 *     x  += (silu(xb * w1) * (xb * w3)) * w2
 *
 * then, on the last stage, logits = rmsnorm(x, output_norm) * output for
 * the rows asked for.  Nothing here allocates: the ops, the activations
 * and the step's layout live in the session.
 */
#include "base/common.h"

#include "rt/rt_impl.h"

static void set_rows(px_rt_tensor *t, uint32_t rows)
{
    t->ne[1] = rows;
}

static px_rt_op *next_op(px_rt_session *s, size_t *n, px_ir_op_kind kind, int32_t layer)
{
    PX_ASSERT(*n < s->ops_cap);
    px_rt_op *op = &s->ops[(*n)++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->layer = layer;
    op->rows = &s->rows;
    op->work = s->has_work ? &s->work : NULL;
    return op;
}

static void matmul(px_rt_session *s, size_t *n, int32_t layer, const px_rt_tensor *x,
                   const px_rt_tensor *w, const px_rt_tensor *bias, px_rt_tensor *y)
{
    px_rt_op *op = next_op(s, n, PX_IR_OP_MATMUL, layer);
    op->src[0] = x;
    op->src[1] = w;
    op->src[2] = bias && bias->buffer ? bias : NULL;
    op->dst = y;
}

static void binary(px_rt_session *s, size_t *n, px_ir_op_kind kind, int32_t layer,
                   const px_rt_tensor *a, const px_rt_tensor *b, px_rt_tensor *y)
{
    px_rt_op *op = next_op(s, n, kind, layer);
    op->src[0] = a;
    op->src[1] = b;
    op->dst = y;
}

size_t px__rt_build_ops(px_rt_session *s, bool embed, uint32_t lb, uint32_t le, uint32_t rows,
                        uint32_t n_logits, bool select)
{
    const px_rt_model *m = s->model;
    const px_ir_hparams *hp = &m->hp;
    px_rt_tensor *acts[] = {&s->x, &s->xb, &s->xb2, &s->q, &s->k, &s->v, &s->att, &s->hb, &s->hb2};
    for (size_t i = 0; i < PX_ARRAY_LEN(acts); i++)
        set_rows(acts[i], rows);
    s->ids.ne[0] = rows;
    s->rows.n_rows = rows;
    size_t n = 0;
    if (embed)
        binary(s, &n, PX_IR_OP_EMBEDDING, -1, &s->tok_embd, &s->ids, &s->x);
    for (uint32_t l = lb; l < le; l++) {
        px__rt_layer_state *ls = &s->layers[l - s->layer_begin];
        int32_t li = (int32_t)l;
        px_rt_op *op = next_op(s, &n, PX_IR_OP_RMSNORM, li);
        op->src[0] = &s->x;
        op->src[1] = &ls->attn_norm;
        op->dst = &s->xb;
        op->eps = hp->rms_eps;
        matmul(s, &n, li, &s->xb, &ls->wq, &ls->bq, &s->q);
        matmul(s, &n, li, &s->xb, &ls->wk, &ls->bk, &s->k);
        matmul(s, &n, li, &s->xb, &ls->wv, &ls->bv, &s->v);
        px_rt_tensor *rot[2] = {&s->q, &s->k};
        uint32_t heads[2] = {hp->n_heads, hp->n_kv_heads};
        for (int i = 0; i < 2; i++) {
            op = next_op(s, &n, PX_IR_OP_ROPE, li);
            op->src[0] = rot[i];
            op->src[1] = &s->rope;
            op->dst = rot[i];
            op->n_heads = heads[i];
            op->head_dim = hp->head_dim;
            op->rope_dim = hp->rope_dim;
            op->rope_style = hp->rope_style;
        }
        op = next_op(s, &n, PX_IR_OP_ATTENTION, li);
        op->src[0] = &s->q;
        op->src[1] = &s->k;
        op->src[2] = &s->v;
        op->src[3] = &ls->k_cache;
        op->src[4] = &ls->v_cache;
        op->dst = &s->att;
        op->n_heads = hp->n_heads;
        op->n_kv_heads = hp->n_kv_heads;
        op->head_dim = hp->head_dim;
        op->window = hp->sliding_window;
        matmul(s, &n, li, &s->att, &ls->wo, NULL, &s->xb2);
        binary(s, &n, PX_IR_OP_ADD, li, &s->x, &s->xb2, &s->x);
        op = next_op(s, &n, PX_IR_OP_RMSNORM, li);
        op->src[0] = &s->x;
        op->src[1] = &ls->ffn_norm;
        op->dst = &s->xb;
        op->eps = hp->rms_eps;
        matmul(s, &n, li, &s->xb, &ls->w1, NULL, &s->hb);
        matmul(s, &n, li, &s->xb, &ls->w3, NULL, &s->hb2);
        binary(s, &n, PX_IR_OP_SWIGLU, li, &s->hb, &s->hb2, &s->hb);
        matmul(s, &n, li, &s->hb, &ls->w2, NULL, &s->xb2);
        binary(s, &n, PX_IR_OP_ADD, li, &s->x, &s->xb2, &s->x);
    }
    if (n_logits) {
        set_rows(&s->xn, n_logits);
        set_rows(&s->logits, n_logits);
        px_rt_op *op = next_op(s, &n, PX_IR_OP_RMSNORM, -1);
        op->src[0] = &s->x;
        op->src[1] = &s->output_norm;
        op->dst = &s->xn;
        op->eps = hp->rms_eps;
        if (select) {
            op->select = s->select;
            op->n_select = n_logits;
        }
        op = next_op(s, &n, PX_IR_OP_CLASSIFIER, -1);
        op->src[0] = &s->xn;
        op->src[1] = &s->output;
        op->dst = &s->logits;
    }
    return n;
}

/* Checks the batch against the session and lays out its rows. */
static px_status layout_batch(px_rt_session *s, const px_rt_batch *b, bool embed, uint32_t *n_rows,
                              px_err *err)
{
    *n_rows = 0;
    if (!b || b->n_seqs == 0 || !b->seqs)
        return px_err_set(err, PX_EINVAL, "forward: the batch has no sequences");
    if (b->n_seqs > s->max_seqs)
        return px_err_set(err, PX_ELIMIT,
                          "forward: %u sequences in a batch; the session holds "
                          "%u",
                          b->n_seqs, s->max_seqs);
    uint32_t rows = 0;
    px_status st = PX_OK;
    uint32_t i = 0;
    for (; i < b->n_seqs; i++) {
        const px_rt_seq_step *q = &b->seqs[i];
        int64_t len = px_rt_seq_len(s, q->seq);
        if (len < 0) {
            st = px_err_set(err, PX_EINVAL,
                            "forward: seqs[%u]: no sequence %d in the session "
                            "(add it with px_rt_seq_add)",
                            i, q->seq);
            break;
        }
        if (s->seq_mark[q->seq]) {
            st = px_err_set(err, PX_EINVAL,
                            "forward: seqs[%u]: sequence %d appears twice in "
                            "the batch",
                            i, q->seq);
            break;
        }
        s->seq_mark[q->seq] = 1;
        if (q->n_tokens == 0) {
            st = px_err_set(err, PX_EINVAL, "forward: seqs[%u]: n_tokens is 0", i);
            break;
        }
        if ((int64_t)q->pos > len) {
            st = px_err_set(err, PX_EINVAL,
                            "forward: seqs[%u]: position %u would leave a gap "
                            "(sequence %d holds %" PRId64 " positions)",
                            i, q->pos, q->seq, len);
            break;
        }
        if ((uint64_t)q->pos + q->n_tokens > s->context) {
            st = px_err_set(err, PX_ELIMIT,
                            "forward: seqs[%u]: positions %u to %" PRIu64 " pass the context of %u",
                            i, q->pos, (uint64_t)q->pos + q->n_tokens - 1, s->context);
            break;
        }
        if ((uint64_t)rows + q->n_tokens > s->max_rows) {
            st = px_err_set(err, PX_ELIMIT,
                            "forward: the batch has more than %u rows "
                            "(max_batch_tokens); split it into smaller steps",
                            s->max_rows);
            break;
        }
        if (embed != (q->tokens != NULL)) {
            st = px_err_set(err, PX_EINVAL, "forward: seqs[%u]: %s", i,
                            embed ? "tokens are missing (this step starts at the embedding)"
                                  : "tokens given to a step that starts from hidden states");
            break;
        }
        for (uint32_t t = 0; t < q->n_tokens; t++) {
            if (embed && (q->tokens[t] < 0 || (uint32_t)q->tokens[t] >= s->model->hp.vocab_size)) {
                st = px_err_set(err, PX_EINVAL,
                                "forward: seqs[%u].tokens[%u]: id %d is outside "
                                "the vocabulary [0, %u)",
                                i, t, q->tokens[t], s->model->hp.vocab_size);
                break;
            }
            s->row_slot[rows + t] = q->seq;
            s->row_pos[rows + t] = (int32_t)(q->pos + t);
        }
        if (st)
            break;
        rows += q->n_tokens;
        s->select[i] = rows - 1;
    }
    for (uint32_t j = 0; j <= i && j < b->n_seqs; j++)
        if (px_rt_seq_len(s, b->seqs[j].seq) >= 0)
            s->seq_mark[b->seqs[j].seq] = 0;
    *n_rows = rows;
    if (st)
        return st;
    /* The KV-cache blocks the new positions need, all or nothing. */
    uint64_t missing = 0;
    for (uint32_t j = 0; j < b->n_seqs; j++)
        missing += px__rt_seq_blocks_missing(s, b->seqs[j].seq,
                                             (uint64_t)b->seqs[j].pos + b->seqs[j].n_tokens);
    if (missing > s->n_free)
        return px_err_set(err, PX_ELIMIT,
                          "forward: the step needs %" PRIu64 " more KV-cache blocks of %u "
                          "positions; %u of %u are free (remove finished sequences, or "
                          "give the session more kv_blocks)",
                          missing, s->kv_block_size, s->n_free, s->kv_blocks);
    for (uint32_t j = 0; j < b->n_seqs; j++)
        px__rt_seq_blocks_take(s, b->seqs[j].seq, (uint64_t)b->seqs[j].pos + b->seqs[j].n_tokens);
    return PX_OK;
}

static px_status load_inputs(px_rt_session *s, const px_rt_batch *b, bool embed, uint32_t rows,
                             px_err *err)
{
    if (!embed)
        return px_rt_buffer_set(s->act_buf, s->x.offset, b->hidden,
                                (size_t)rows * s->model->hp.dim * sizeof(float), err);
    int32_t *ids = px_rt_tensor_data(&s->ids);
    if (ids) {
        uint32_t r = 0;
        for (uint32_t i = 0; i < b->n_seqs; i++) {
            memcpy(ids + r, b->seqs[i].tokens, b->seqs[i].n_tokens * sizeof(int32_t));
            r += b->seqs[i].n_tokens;
        }
        return PX_OK;
    }
    size_t off = s->ids.offset;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        size_t nb = b->seqs[i].n_tokens * sizeof(int32_t);
        px_status st = px_rt_buffer_set(s->act_buf, off, b->seqs[i].tokens, nb, err);
        if (st)
            return st;
        off += nb;
    }
    return PX_OK;
}

static px_status read_output(px_rt_session *s, const px_rt_tensor *t, uint32_t rows, uint32_t width,
                             px_rt_output *out, px_err *err)
{
    out->n_rows = rows;
    out->row_len = width;
    const float *data = px_rt_tensor_data(t);
    if (data) {
        out->data = data;
        return PX_OK;
    }
    px_status st = px_rt_buffer_get(s->act_buf, t->offset, s->out_host,
                                    (size_t)rows * width * sizeof(float), err);
    out->data = st ? NULL : s->out_host;
    return st;
}

px_status px_rt_forward(px_rt_session *s, const px_rt_batch *batch, const px_rt_forward_opts *opts,
                        px_rt_output *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    px_rt_forward_opts o;
    if (opts) {
        o = *opts;
    } else {
        o.layer_begin = s->layer_begin;
        o.layer_end = s->layer_end;
        o.output = s->has_head ? PX_RT_OUTPUT_LOGITS_LAST : PX_RT_OUTPUT_HIDDEN;
    }
    if (o.layer_begin < s->layer_begin || o.layer_end > s->layer_end || o.layer_begin > o.layer_end)
        return px_err_set(err, PX_EINVAL,
                          "forward: layers [%u, %u) are outside the session's "
                          "[%u, %u)",
                          o.layer_begin, o.layer_end, s->layer_begin, s->layer_end);
    bool logits = o.output != PX_RT_OUTPUT_HIDDEN;
    if (o.output > PX_RT_OUTPUT_LOGITS_ALL)
        return px_err_set(err, PX_EINVAL, "forward: unknown output kind %d", (int)o.output);
    if (logits && o.layer_end != s->model->hp.n_layers)
        return px_err_set(err, PX_EINVAL,
                          "forward: logits need the layers up to the last (%u); "
                          "this step ends at %u",
                          s->model->hp.n_layers, o.layer_end);
    if (logits && !s->has_head)
        return px_err_set(err, PX_EINVAL,
                          "forward: logits asked of a session that does not hold the head");
    if (!batch || batch->n_seqs == 0 || !batch->seqs)
        return px_err_set(err, PX_EINVAL, "forward: the batch has no sequences");
    bool embed = batch->seqs[0].tokens != NULL;
    if (embed && !s->has_embedding)
        return px_err_set(err, PX_EINVAL,
                          "forward: tokens given to a session that does not hold the "
                          "embedding (pass hidden states)");
    if (embed && o.layer_begin != 0)
        return px_err_set(err, PX_EINVAL,
                          "forward: a step starting at layer %u takes hidden "
                          "states, not tokens",
                          o.layer_begin);
    if (!embed && !batch->hidden)
        return px_err_set(err, PX_EINVAL,
                          "forward: the batch has neither tokens nor hidden "
                          "states");
    uint32_t rows = 0;
    px_status st = layout_batch(s, batch, embed, &rows, err);
    if (st)
        return st;
    uint32_t n_logits = 0;
    if (logits) {
        n_logits = o.output == PX_RT_OUTPUT_LOGITS_ALL ? rows : batch->n_seqs;
        if (n_logits > s->max_logit_rows)
            return px_err_set(err, PX_ELIMIT,
                              "forward: %u rows of logits asked; the session "
                              "keeps at most %u (max_logit_rows)",
                              n_logits, s->max_logit_rows);
    }
    if ((st = load_inputs(s, batch, embed, rows, err)) != PX_OK)
        return st;
    size_t n_ops = px__rt_build_ops(s, embed, o.layer_begin, o.layer_end, rows, n_logits,
                                    o.output == PX_RT_OUTPUT_LOGITS_LAST);
    if ((st = px_rt_stream_run(s->stream, s->ops, n_ops, err)) != PX_OK)
        return st;
    if (logits)
        st = read_output(s, &s->logits, n_logits, s->model->hp.vocab_size, out, err);
    else
        st = read_output(s, &s->x, rows, s->model->hp.dim, out, err);
    if (st)
        return st;
    for (uint32_t i = 0; i < batch->n_seqs; i++)
        s->seq_len[batch->seqs[i].seq] = (int64_t)batch->seqs[i].pos + batch->seqs[i].n_tokens;
    return PX_OK;
}
