/*
 * Sessions: everything a forward step needs, set up once (llama2.c's
 * RunState): the device and its stream, the weights of the session's
 * layers (wrapped in place when the device can read host memory, else
 * copied), the KV cache of every slot, the activations of the largest step
 * and the kernels' scratch.  Also the sequences' slots and lengths.
 */
#include "base/common.h"

#include <unistd.h>

#include "rt/rt_impl.h"

/* Activation tensors start at multiples of this many bytes. */
#define ACT_ALIGN 64u

/* ------------------------------------------------------------------ */
/* Weights                                                             */
/* ------------------------------------------------------------------ */

/* Binds the stored tensor src (NULL: none) as dst.  A matrix (a product's weights) goes in the
 * layout the device asks for, repacked once for all the model's sessions; the rest as stored. */
static px_status bind_weight(px_rt_session *s, const px_ir_tensor *src, bool matrix,
                             px_rt_tensor *dst, px_err *err)
{
    memset(dst, 0, sizeof *dst);
    if (!src)
        return PX_OK;
    matrix = matrix && src->ne[2] == 1 && src->ne[3] == 1;
    px_rt_layout layout =
        matrix ? px_rt_device_weight_layout(s->device, src->dtype, src->ne[0], src->ne[1])
               : PX_RT_LAYOUT_ROWS;
    px_rt_buffer *buf = NULL;
    for (size_t i = 0; i < s->n_weight_bufs; i++)
        if (s->weight_src[i] == src && s->weight_layout[i] == layout)
            buf = s->weight_bufs[i];
    if (!buf) {
        const void *data = src->data;
        bool copied = false;
        px_status st = PX_OK;
        if (layout != PX_RT_LAYOUT_ROWS)
            st = px__rt_model_repacked(s->model, src, layout, &data, err);
        if (!st)
            st = px_rt_buffer_from_host(s->device, data, (size_t)src->n_bytes, &buf, &copied, err);
        if (st)
            return px_err_prefix(err, st, "weight %s: ", src->name);
        s->weight_bufs[s->n_weight_bufs] = buf;
        s->weight_layout[s->n_weight_bufs] = layout;
        s->weight_src[s->n_weight_bufs++] = src;
        s->weights_copied |= copied || layout != PX_RT_LAYOUT_ROWS;
        s->weight_bytes += src->n_bytes;
        if (layout != PX_RT_LAYOUT_ROWS) {
            s->weights_repacked++;
            s->repacked_bytes += src->n_bytes;
        }
    }
    dst->dtype = src->dtype;
    for (int i = 0; i < PX_RT_MAX_DIMS; i++) {
        dst->ne[i] = (int64_t)src->ne[i];
        dst->nb[i] = (size_t)src->nb[i];
    }
    dst->buffer = buf;
    dst->offset = 0;
    dst->name = src->name;
    dst->layout = layout;
    return PX_OK;
}

static px_status check_supported(const px_rt_session *s, px_ir_op_kind op, const px_rt_tensor *w,
                                 px_err *err)
{
    if (px_rt_device_supports_op(s->device, op, w->dtype))
        return PX_OK;
    px_rt_device_props p;
    px_rt_device_props_get(s->device, &p);
    return px_err_set(err, PX_EUNSUPPORTED, "device %s cannot run %s with %s weights (%s)", p.name,
                      px_ir_op_kind_name(op), px_dtype_name(w->dtype), w->name ? w->name : "?");
}

static px_status bind_weights(px_rt_session *s, px_err *err)
{
    const px_rt_model *m = s->model;
    size_t n_layers = s->layer_end - s->layer_begin;
    size_t cap = 3 + 12 * n_layers;
    s->weight_bufs = calloc(cap, sizeof *s->weight_bufs);
    s->weight_src = calloc(cap, sizeof *s->weight_src);
    s->weight_layout = calloc(cap, sizeof *s->weight_layout);
    s->layers = calloc(n_layers ? n_layers : 1, sizeof *s->layers);
    if (!s->weight_bufs || !s->weight_src || !s->weight_layout || !s->layers)
        return px_err_set(err, PX_ENOMEM, "session: out of memory");
    px_status st;
    if (s->has_embedding) {
        if ((st = bind_weight(s, m->tok_embd, false, &s->tok_embd, err)) ||
            (st = check_supported(s, PX_IR_OP_EMBEDDING, &s->tok_embd, err)))
            return st;
    }
    if (s->has_head) {
        if ((st = bind_weight(s, m->output_norm, false, &s->output_norm, err)) ||
            (st = bind_weight(s, m->output, true, &s->output, err)) ||
            (st = check_supported(s, PX_IR_OP_CLASSIFIER, &s->output, err)))
            return st;
    }
    for (uint32_t l = s->layer_begin; l < s->layer_end; l++) {
        const px__rt_layer_weights *w = &m->layers[l];
        px__rt_layer_state *ls = &s->layers[l - s->layer_begin];
        if ((st = bind_weight(s, w->attn_norm, false, &ls->attn_norm, err)) ||
            (st = bind_weight(s, w->wq, true, &ls->wq, err)) ||
            (st = bind_weight(s, w->wk, true, &ls->wk, err)) ||
            (st = bind_weight(s, w->wv, true, &ls->wv, err)) ||
            (st = bind_weight(s, w->wo, true, &ls->wo, err)) ||
            (st = bind_weight(s, w->ffn_norm, false, &ls->ffn_norm, err)) ||
            (st = bind_weight(s, w->w1, true, &ls->w1, err)) ||
            (st = bind_weight(s, w->w2, true, &ls->w2, err)) ||
            (st = bind_weight(s, w->w3, true, &ls->w3, err)) ||
            (st = bind_weight(s, w->bq, false, &ls->bq, err)) ||
            (st = bind_weight(s, w->bk, false, &ls->bk, err)) ||
            (st = bind_weight(s, w->bv, false, &ls->bv, err)))
            return st;
        const px_rt_tensor *mats[] = {&ls->wq, &ls->wk, &ls->wv, &ls->wo,
                                      &ls->w1, &ls->w2, &ls->w3};
        for (size_t i = 0; i < PX_ARRAY_LEN(mats); i++)
            if ((st = check_supported(s, PX_IR_OP_MATMUL, mats[i], err)))
                return st;
    }
    static const px_ir_op_kind f32_ops[] = {PX_IR_OP_RMSNORM, PX_IR_OP_ROPE, PX_IR_OP_ATTENTION,
                                            PX_IR_OP_SWIGLU, PX_IR_OP_ADD};
    px_rt_tensor f32 = {.dtype = PX_DTYPE_F32, .name = "activations"};
    for (size_t i = 0; i < PX_ARRAY_LEN(f32_ops); i++)
        if ((st = check_supported(s, f32_ops[i], &f32, err)))
            return st;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Activations, cache, scratch                                         */
/* ------------------------------------------------------------------ */

typedef struct layout {
    size_t size;
    bool overflow;
} layout;

/* Places a tensor of ne0 x ne1 x ne2 values of dtype t in the layout. */
static void place(layout *lo, px_rt_tensor *t, px_dtype dtype, int64_t ne0, int64_t ne1,
                  int64_t ne2, const char *name)
{
    int64_t ne[3] = {ne0, ne1, ne2};
    if (px_rt_tensor_init(t, dtype, 3, ne, NULL) != PX_OK) {
        lo->overflow = true;
        return;
    }
    size_t at = (lo->size + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    if (at < lo->size || !px__add_size(at, px_rt_tensor_nbytes(t), &lo->size))
        lo->overflow = true;
    t->offset = at;
    t->name = name;
}

static px_status alloc_state(px_rt_session *s, px_err *err)
{
    const px_rt_model *m = s->model;
    const px_ir_hparams *hp = &m->hp;
    int64_t R = s->max_rows, L = s->max_logit_rows;
    layout lo = {0};
    place(&lo, &s->x, PX_DTYPE_F32, hp->dim, R, 1, "x");
    place(&lo, &s->xb, PX_DTYPE_F32, hp->dim, R, 1, "xb");
    place(&lo, &s->xb2, PX_DTYPE_F32, hp->dim, R, 1, "xb2");
    place(&lo, &s->q, PX_DTYPE_F32, m->q_dim, R, 1, "q");
    place(&lo, &s->k, PX_DTYPE_F32, m->kv_dim, R, 1, "k");
    place(&lo, &s->v, PX_DTYPE_F32, m->kv_dim, R, 1, "v");
    place(&lo, &s->att, PX_DTYPE_F32, m->q_dim, R, 1, "att");
    place(&lo, &s->hb, PX_DTYPE_F32, hp->hidden_dim, R, 1, "hb");
    place(&lo, &s->hb2, PX_DTYPE_F32, hp->hidden_dim, R, 1, "hb2");
    place(&lo, &s->ids, PX_DTYPE_I32, R, 1, 1, "ids");
    place(&lo, &s->rope, PX_DTYPE_F32, hp->rope_dim, s->context, 1, "rope");
    if (s->has_head) {
        place(&lo, &s->xn, PX_DTYPE_F32, hp->dim, L, 1, "xn");
        place(&lo, &s->logits, PX_DTYPE_F32, hp->vocab_size, L, 1, "logits");
    }
    layout kv = {0};
    for (uint32_t l = s->layer_begin; l < s->layer_end; l++) {
        px__rt_layer_state *ls = &s->layers[l - s->layer_begin];
        place(&kv, &ls->k_cache, PX_DTYPE_F32, m->kv_dim, s->kv_block_size, s->kv_blocks,
              "k_cache");
        place(&kv, &ls->v_cache, PX_DTYPE_F32, m->kv_dim, s->kv_block_size, s->kv_blocks,
              "v_cache");
    }
    /* The block table first: attention's scratch depends on it. */
    s->block_table = malloc((size_t)s->max_seqs * s->blocks_per_slot * sizeof *s->block_table);
    s->free_blocks = malloc((size_t)s->kv_blocks * sizeof *s->free_blocks);
    if (!s->block_table || !s->free_blocks)
        return px_err_set(err, PX_ENOMEM, "session: out of memory");
    s->rows.block_table = s->block_table;
    s->rows.blocks_per_slot = s->blocks_per_slot;
    /* The kernels' scratch: the most any op of the largest step needs. */
    size_t n_ops = px__rt_build_ops(s, s->has_embedding, s->layer_begin, s->layer_end, s->max_rows,
                                    s->has_head ? s->max_logit_rows : 0, true);
    size_t work = 0;
    for (size_t i = 0; i < n_ops; i++)
        work = PX_MAX(work, px_rt_device_work_size(s->device, &s->ops[i]));
    s->has_work = work > 0;
    if (s->has_work)
        place(&lo, &s->work, PX_DTYPE_I8, (int64_t)work, 1, 1, "work");

    if (lo.overflow || kv.overflow)
        return px_err_set(err, PX_ELIMIT,
                          "session: the activations or the KV cache (%u blocks of %u "
                          "positions) overflow the address space",
                          s->kv_blocks, s->kv_block_size);
    px_status st = px_rt_buffer_alloc(s->device, lo.size, &s->act_buf, err);
    if (st == PX_OK && kv.size)
        st = px_rt_buffer_alloc(s->device, kv.size, &s->kv_buf, err);
    if (st)
        return px_err_prefix(
            err, st, "session (%zu bytes of activations, %zu of KV cache): ", lo.size, kv.size);
    px_rt_tensor *acts[] = {&s->x,  &s->xb,  &s->xb2, &s->q,    &s->k,  &s->v,      &s->att,
                            &s->hb, &s->hb2, &s->ids, &s->rope, &s->xn, &s->logits, &s->work};
    for (size_t i = 0; i < PX_ARRAY_LEN(acts); i++)
        acts[i]->buffer = s->act_buf;
    for (uint32_t l = s->layer_begin; l < s->layer_end; l++) {
        s->layers[l - s->layer_begin].k_cache.buffer = s->kv_buf;
        s->layers[l - s->layer_begin].v_cache.buffer = s->kv_buf;
    }

    /* The rotation table, computed once on the host. */
    size_t tab_bytes = px_rt_tensor_nbytes(&s->rope);
    float *tab = malloc(tab_bytes);
    if (!tab)
        return px_err_set(err, PX_ENOMEM, "session: out of memory");
    px__rt_rope_table(tab, s->context, hp->rope_dim, hp->rope_theta);
    st = px_rt_buffer_set(s->act_buf, s->rope.offset, tab, tab_bytes, err);
    free(tab);
    if (st)
        return st;

    s->row_slot = calloc(s->max_rows, sizeof *s->row_slot);
    s->row_pos = calloc(s->max_rows, sizeof *s->row_pos);
    s->select = calloc(PX_MAX(s->max_logit_rows, s->max_seqs), sizeof *s->select);
    s->seq_len = malloc(s->max_seqs * sizeof *s->seq_len);
    s->seq_mark = calloc(s->max_seqs, 1);

    size_t out_floats = (size_t)s->max_rows * hp->dim;
    if (s->has_head)
        out_floats = PX_MAX(out_floats, (size_t)s->max_logit_rows * hp->vocab_size);
    if (!px_rt_buffer_base(s->act_buf))
        s->out_host = malloc(out_floats * sizeof(float));
    if (!s->row_slot || !s->row_pos || !s->select || !s->seq_len || !s->seq_mark ||
        !s->block_table || !s->free_blocks || (!px_rt_buffer_base(s->act_buf) && !s->out_host))
        return px_err_set(err, PX_ENOMEM, "session: out of memory");
    for (uint32_t i = 0; i < s->max_seqs; i++)
        s->seq_len[i] = -1;
    for (size_t i = 0; i < (size_t)s->max_seqs * s->blocks_per_slot; i++)
        s->block_table[i] = -1;
    /* A stack popped from the end: the lowest blocks are taken first. */
    for (uint32_t i = 0; i < s->kv_blocks; i++)
        s->free_blocks[i] = (int32_t)(s->kv_blocks - 1 - i);
    s->n_free = s->kv_blocks;
    s->rows.slot = s->row_slot;
    s->rows.pos = s->row_pos;
    s->rows.block_table = s->block_table;
    s->rows.blocks_per_slot = s->blocks_per_slot;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Public                                                              */
/* ------------------------------------------------------------------ */

static px_status check_opts(const px_rt_model *m, const px_rt_session_opts *o, px_rt_session *s,
                            px_err *err)
{
    const px_ir_hparams *hp = &m->hp;
    s->layer_begin = o->layer_begin;
    s->layer_end = o->layer_end || o->explicit_parts ? o->layer_end : hp->n_layers;
    if (s->layer_begin > s->layer_end || s->layer_end > hp->n_layers)
        return px_err_set(err, PX_EINVAL,
                          "session: layers [%u, %u) are not a range of the "
                          "model's %u layers",
                          s->layer_begin, s->layer_end, hp->n_layers);
    if (o->explicit_parts) {
        if (o->embedding && s->layer_begin != 0)
            return px_err_set(err, PX_EINVAL,
                              "session: the embedding goes with a range that starts at "
                              "layer 0, not [%u, %u)",
                              s->layer_begin, s->layer_end);
        if (o->head && s->layer_end != hp->n_layers)
            return px_err_set(err, PX_EINVAL,
                              "session: the head goes with a range that ends at the "
                              "model's last layer (%u), not [%u, %u)",
                              hp->n_layers, s->layer_begin, s->layer_end);
        if (s->layer_begin == s->layer_end && !o->embedding && !o->head)
            return px_err_set(err, PX_EINVAL,
                              "session: layers [%u, %u) are empty and the session holds "
                              "neither the embedding nor the head: it would do nothing",
                              s->layer_begin, s->layer_end);
        s->has_embedding = o->embedding;
        s->has_head = o->head;
    } else {
        s->has_embedding = s->layer_begin == 0;
        s->has_head = s->layer_end == hp->n_layers;
    }
    s->max_seqs = o->max_seqs ? o->max_seqs : 1;
    if (s->max_seqs > 65536)
        return px_err_set(err, PX_EINVAL, "session: max_seqs %u is above 65536", s->max_seqs);
    uint32_t model_ctx = hp->context_length ? hp->context_length : 2048;
    s->context = o->context ? o->context : model_ctx;
    if (s->context > model_ctx || s->context > (1u << 24))
        return px_err_set(err, PX_EINVAL, "session: context %u exceeds the model's %u positions",
                          s->context, model_ctx);
    s->max_rows = o->max_batch_tokens ? o->max_batch_tokens : PX_MIN(s->context, 512u);
    if (s->max_rows > (1u << 20))
        return px_err_set(err, PX_EINVAL, "session: max_batch_tokens %u is above 2^20",
                          s->max_rows);
    px__rt_kv_defaults(s->context, s->max_seqs, o->kv_block_size, o->kv_blocks, &s->kv_block_size,
                       &s->kv_blocks);
    s->blocks_per_slot = px_rt_kv_blocks_for(s->context, s->kv_block_size);
    uint64_t all = (uint64_t)s->blocks_per_slot * s->max_seqs;
    if (all > INT32_MAX || s->kv_blocks > INT32_MAX)
        return px_err_set(err, PX_EINVAL,
                          "session: %u sequences of %u positions need more than 2^31 "
                          "KV-cache blocks of %u; lower max_seqs or the context",
                          s->max_seqs, s->context, s->kv_block_size);
    s->max_logit_rows = o->max_logit_rows ? o->max_logit_rows : s->max_seqs;
    if (s->max_logit_rows < s->max_seqs)
        return px_err_set(err, PX_EINVAL,
                          "session: max_logit_rows %u is below max_seqs %u "
                          "(each sequence's last row needs one)",
                          s->max_logit_rows, s->max_seqs);
    return PX_OK;
}

/* Bytes of stored weights one step of the session reads at most. */
static uint64_t held_weight_bytes(const px_rt_model *m, const px_rt_session *s)
{
    uint64_t n = 0;
    for (uint32_t l = s->layer_begin; l < s->layer_end; l++) {
        const px__rt_layer_weights *w = &m->layers[l];
        const px_ir_tensor *ts[] = {w->wq, w->wk, w->wv, w->wo, w->w1, w->w2, w->w3};
        for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++)
            n += ts[i]->n_bytes;
    }
    if (s->has_head)
        n += m->output->n_bytes;
    return n;
}

/* The default thread count: the online CPUs, but one per 16 MiB of
 * weights at most, because splitting the ops of a small model among
 * threads costs more (a barrier per op) than it gains. */
static uint32_t auto_threads(const px_rt_model *m, const px_rt_session *s)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t by_size = held_weight_bytes(m, s) / (16u << 20) + 1;
    uint64_t n = PX_MIN((uint64_t)(online > 0 ? online : 1), by_size);
    return (uint32_t)PX_MIN(n, 256u);
}

px_status px_rt_session_new(const px_rt_model *model, const px_rt_session_opts *opts,
                            px_rt_session **out, px_err *err)
{
    *out = NULL;
    px_rt_session_opts defaults = {0};
    const px_rt_session_opts *o = opts ? opts : &defaults;
    px_rt_session *s = calloc(1, sizeof *s);
    if (!s)
        return px_err_set(err, PX_ENOMEM, "session: out of memory");
    s->model = model;
    px_status st = check_opts(model, o, s, err);
    if (st)
        goto fail;
    if (o->device) {
        s->device = o->device;
    } else {
        px_rt_device_opts dopts = {.n_threads =
                                       o->n_threads ? o->n_threads : auto_threads(model, s),
                                   .portable_kernels = o->portable_kernels};
        if ((st = px_rt_device_open(o->backend, &dopts, &s->device, err)) != PX_OK)
            goto fail;
        s->own_device = true;
    }
    if ((st = px_rt_stream_new(s->device, &s->stream, err)) != PX_OK)
        goto fail;
    s->ops_cap = 4 + 16 * (size_t)(s->layer_end - s->layer_begin);
    s->ops = calloc(s->ops_cap, sizeof *s->ops);
    if (!s->ops) {
        st = px_err_set(err, PX_ENOMEM, "session: out of memory");
        goto fail;
    }
    if ((st = bind_weights(s, err)) != PX_OK || (st = alloc_state(s, err)) != PX_OK)
        goto fail;
    *out = s;
    return PX_OK;
fail:
    px_rt_session_free(s);
    return st;
}

void px_rt_session_free(px_rt_session *s)
{
    if (!s)
        return;
    px_rt_stream_free(s->stream);
    px_rt_buffer_free(s->act_buf);
    px_rt_buffer_free(s->kv_buf);
    for (size_t i = 0; i < s->n_weight_bufs; i++)
        px_rt_buffer_free(s->weight_bufs[i]);
    if (s->own_device)
        px_rt_device_free(s->device);
    free(s->weight_bufs);
    free(s->weight_src);
    free(s->weight_layout);
    free(s->layers);
    free(s->row_slot);
    free(s->row_pos);
    free(s->select);
    free(s->out_host);
    free(s->seq_len);
    free(s->seq_mark);
    free(s->block_table);
    free(s->free_blocks);
    free(s->ops);
    free(s);
}

void px_rt_session_info_get(const px_rt_session *s, px_rt_session_info *out)
{
    memset(out, 0, sizeof *out);
    out->layer_begin = s->layer_begin;
    out->layer_end = s->layer_end;
    out->context = s->context;
    out->max_seqs = s->max_seqs;
    out->max_batch_tokens = s->max_rows;
    out->max_logit_rows = s->max_logit_rows;
    out->weight_bytes = s->weight_bytes;
    out->kv_bytes = s->kv_buf ? px_rt_buffer_size(s->kv_buf) : 0;
    out->scratch_bytes = px_rt_buffer_size(s->act_buf);
    out->weights_copied = s->weights_copied;
    out->weights_repacked = s->weights_repacked;
    out->repacked_bytes = s->repacked_bytes;
    px_rt_device_props_get(s->device, &out->device);
    out->n_threads = out->device.n_threads;
    out->kv_block_size = s->kv_block_size;
    out->kv_blocks = s->kv_blocks;
    out->kv_blocks_free = s->n_free;
}

px_rt_stream *px_rt_session_stream(px_rt_session *s)
{
    return s->stream;
}

px_status px_rt_seq_add(px_rt_session *s, int32_t *seq, px_err *err)
{
    for (uint32_t i = 0; i < s->max_seqs; i++)
        if (s->seq_len[i] < 0) {
            s->seq_len[i] = 0;
            *seq = (int32_t)i;
            return PX_OK;
        }
    return px_err_set(err, PX_ELIMIT,
                      "session: all %u sequence slots are in use (raise "
                      "max_seqs or remove a finished sequence)",
                      s->max_seqs);
}

px_status px_rt_seq_remove(px_rt_session *s, int32_t seq, px_err *err)
{
    if (seq < 0 || (uint32_t)seq >= s->max_seqs || s->seq_len[seq] < 0)
        return px_err_set(err, PX_ENOTFOUND, "session: no sequence %d", seq);
    s->seq_len[seq] = -1;
    /* Its blocks go back in reverse, so that the next sequence takes them
     * in the same order. */
    int32_t *tab = s->block_table + (size_t)seq * s->blocks_per_slot;
    for (uint32_t i = s->blocks_per_slot; i-- > 0;)
        if (tab[i] >= 0) {
            s->free_blocks[s->n_free++] = tab[i];
            tab[i] = -1;
        }
    return PX_OK;
}

void px__rt_kv_defaults(uint32_t context, uint32_t max_seqs, uint32_t block_size, uint32_t blocks,
                        uint32_t *out_size, uint32_t *out_blocks)
{
    uint32_t bs = block_size ? block_size : 16;
    if (bs > context)
        bs = context;
    *out_size = bs;
    uint64_t all = (uint64_t)px_rt_kv_blocks_for(context, bs) * max_seqs;
    *out_blocks = blocks ? blocks : (uint32_t)PX_MIN(all, (uint64_t)INT32_MAX);
}

uint32_t px_rt_kv_blocks_for(uint32_t n_positions, uint32_t block_size)
{
    return block_size ? (uint32_t)(((uint64_t)n_positions + block_size - 1) / block_size) : 0;
}

uint32_t px__rt_seq_blocks_missing(const px_rt_session *s, int32_t seq, uint64_t end)
{
    const int32_t *tab = s->block_table + (size_t)seq * s->blocks_per_slot;
    uint32_t need = px_rt_kv_blocks_for((uint32_t)end, s->kv_block_size), n = 0;
    for (uint32_t i = 0; i < need; i++)
        n += tab[i] < 0;
    return n;
}

void px__rt_seq_blocks_take(px_rt_session *s, int32_t seq, uint64_t end)
{
    int32_t *tab = s->block_table + (size_t)seq * s->blocks_per_slot;
    uint32_t need = px_rt_kv_blocks_for((uint32_t)end, s->kv_block_size);
    for (uint32_t i = 0; i < need; i++)
        if (tab[i] < 0) {
            PX_ASSERT(s->n_free > 0);
            tab[i] = s->free_blocks[--s->n_free];
        }
}

int64_t px_rt_seq_len(const px_rt_session *s, int32_t seq)
{
    if (seq < 0 || (uint32_t)seq >= s->max_seqs)
        return -1;
    return s->seq_len[seq];
}
