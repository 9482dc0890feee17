/*
 * The graph of the llama family (llama, mistral, qwen2, mixtral): values,
 * ops with cost expressions and annotations, regions, KV descriptors.
 * Also the graph-building helpers the DiT builder shares.
 */
#include "ir/ir_impl.h"

/* ---- helpers ---- */

static bool grow(void **items, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 64;
    void *p = realloc(*items, ncap * size);
    if (!p)
        return false;
    *items = p;
    *cap = ncap;
    return true;
}

px_status px__gb_begin(px__gb *g, px_ir_model *m, px_err *err)
{
    memset(g, 0, sizeof *g);
    g->m = m;
    g->a = m->arena;
    g->act = px_dtype_block_bytes(m->act_dtype);
    if (px_dtype_is_quantized(m->act_dtype))
        return px_err_set(err, PX_EINVAL, "%s: activations cannot be %s; use a plain dtype",
                          m->path, px_dtype_name(m->act_dtype));
    m->n_rows = m->hp.n_layers + 2;
    m->rows = px_arena_calloc(m->arena, m->n_rows, sizeof *m->rows);
    g->weight_value =
        px_arena_alloc(m->arena, (m->n_tensors ? m->n_tensors : 1) * sizeof(uint32_t));
    if (!m->rows || !g->weight_value)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory building the graph", m->path);
    memset(g->weight_value, 0xff, (m->n_tensors ? m->n_tensors : 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < m->n_rows; i++)
        m->rows[i].row = i;
    return PX_OK;
}

px_status px__gb_end(px__gb *g, px_err *err)
{
    if (g->oom)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory building the graph", g->m->path);
    return PX_OK;
}

uint32_t px__gb_value(px__gb *g, const char *name, px_ir_value_kind kind, px_dtype dtype,
                      px_ir_layout layout, uint32_t n_dims, const px_ir_expr *const shape[])
{
    px_ir_model *m = g->m;
    if (!name || !grow((void **)&m->values, &m->cap_values, m->n_values, sizeof *m->values)) {
        g->oom = true;
        return 0;
    }
    px_ir_value *v = &m->values[m->n_values];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->kind = kind;
    v->dtype = dtype;
    v->layout = layout;
    v->n_dims = n_dims;
    v->alias_of = -1;
    for (uint32_t i = 0; i < n_dims && i < PX_IR_MAX_DIMS; i++) {
        v->shape[i] = shape[i];
        if (!shape[i])
            g->oom = true;
    }
    return (uint32_t)m->n_values++;
}

uint32_t px__gb_weight(px__gb *g, const px_ir_tensor *t)
{
    px_ir_model *m = g->m;
    size_t id = (size_t)(t - m->tensors);
    if (g->weight_value[id] != UINT32_MAX)
        return g->weight_value[id];
    const px_ir_expr *shape[PX_IR_MAX_DIMS];
    for (uint32_t i = 0; i < t->n_dims; i++)
        shape[i] = px__e_const(g->a, t->ne[i]);
    uint32_t v = px__gb_value(g, t->name, PX_IR_VALUE_WEIGHT, t->dtype,
                              px_dtype_is_quantized(t->dtype) ? PX_IR_LAYOUT_BLOCKED
                                                              : PX_IR_LAYOUT_ROW_MAJOR,
                              t->n_dims, shape);
    if (!g->oom)
        m->values[v].weight = t;
    g->weight_value[id] = v;
    return v;
}

uint32_t px__gb_act(px__gb *g, const char *name, uint64_t width, bool per_seq)
{
    const px_ir_expr *shape[3] = {px__e_const(g->a, width),
                                  px__e_var(g->a, per_seq ? PX__E_B : PX__E_S),
                                  px__e_var(g->a, PX__E_B)};
    return px__gb_value(g, name, PX_IR_VALUE_ACTIVATION, g->m->act_dtype, PX_IR_LAYOUT_ROW_MAJOR,
                        per_seq ? 2 : 3, shape);
}

void px__gb_region(px__gb *g, const char *name, px_ir_region_kind kind, int32_t layer, uint32_t row)
{
    px_ir_model *m = g->m;
    if (!name || !grow((void **)&m->regions, &m->cap_regions, m->n_regions, sizeof *m->regions)) {
        g->oom = true;
        return;
    }
    px_ir_region *r = &m->regions[m->n_regions];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->kind = kind;
    r->layer = layer;
    r->first_op = (uint32_t)m->n_ops;
    g->region = (uint32_t)m->n_regions++;
    g->layer = layer;
    g->row = row;
}

px_ir_op *px__gb_op(px__gb *g, px_ir_op_kind kind, const char *name, const uint32_t *in,
                    uint32_t n_in, const uint32_t *outs, uint32_t n_out, px__flops f,
                    const px_ir_expr *bytes_read, const px_ir_expr *bytes_written)
{
    px_ir_model *m = g->m;
    if (g->oom || !name || !grow((void **)&m->ops, &m->cap_ops, m->n_ops, sizeof *m->ops)) {
        g->oom = true;
        memset(&g->scratch, 0, sizeof g->scratch);
        return &g->scratch;
    }
    px_ir_op *op = &m->ops[m->n_ops];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->name = name;
    op->region = g->region;
    op->layer = g->layer;
    uint32_t *ins = px_arena_calloc(g->a, n_in ? n_in : 1, sizeof *ins);
    uint32_t *os = px_arena_calloc(g->a, n_out ? n_out : 1, sizeof *os);
    op->flops = px__e_cost(g->a, f.tok, f.seq, 0, f.pair, g->pairs);
    op->bytes_read = bytes_read;
    op->bytes_written = bytes_written;
    if (!ins || !os || !op->flops || !bytes_read || !bytes_written) {
        g->oom = true;
        memset(&g->scratch, 0, sizeof g->scratch);
        return &g->scratch;
    }
    memcpy(ins, in, n_in * sizeof *ins);
    memcpy(os, outs, n_out * sizeof *os);
    op->inputs = ins;
    op->outputs = os;
    op->n_inputs = n_in;
    op->n_outputs = n_out;
    op->determinism = PX_IR_DET_EXACT;
    px_ir_region *r = &m->regions[g->region];
    for (uint32_t i = 0; i < n_in; i++) {
        const px_ir_value *v = &m->values[in[i]];
        if (v->kind == PX_IR_VALUE_WEIGHT && v->weight)
            r->weight_bytes += v->weight->n_bytes;
    }
    r->n_ops++;
    px_ir_layer_cost *row = &m->rows[g->row];
    row->flops_token += f.tok;
    row->flops_seq += f.seq;
    row->flops_pair += f.pair;
    m->n_ops++;
    return op;
}

const px_ir_expr *px__gb_tok(px__gb *g, uint64_t k)
{
    return px__e_cost(g->a, k, 0, 0, 0, NULL);
}

const px_ir_expr *px__gb_seq(px__gb *g, uint64_t k)
{
    return px__e_cost(g->a, 0, k, 0, 0, NULL);
}

const px_ir_expr *px__gb_ctx(px__gb *g, uint64_t k)
{
    px_arena *a = g->a;
    return px__e_bin(a, PX__E_MUL, px__e_const(a, k),
                     px__e_bin(a, PX__E_MUL, px__e_var(a, PX__E_B), px__e_var(a, PX__E_T)));
}

const px_ir_expr *px__gb_add(px__gb *g, const px_ir_expr *x, const px_ir_expr *y)
{
    return px__e_bin(g->a, PX__E_ADD, x, y);
}

/* Weight bytes as a constant expression. */
static const px_ir_expr *wbytes(px__gb *g, const px_ir_tensor *w, const px_ir_tensor *b)
{
    return px__e_const(g->a, px__tbytes(w) + px__tbytes(b));
}

uint32_t px__gb_matmul(px__gb *g, const char *name, uint32_t x, const px_ir_tensor *w,
                       const px_ir_tensor *b, uint64_t d_in, uint64_t d_out, bool per_seq,
                       uint32_t rewrites)
{
    uint32_t out = px__gb_act(g, name, d_out, per_seq);
    uint32_t in[3] = {x, px__gb_weight(g, w), 0};
    uint32_t n_in = 2;
    if (b)
        in[n_in++] = px__gb_weight(g, b);
    uint64_t k = 2 * d_in * d_out + (b ? d_out : 0);
    px__flops f = {per_seq ? 0 : k, per_seq ? k : 0, 0};
    const px_ir_expr *rd_act =
        per_seq ? px__gb_seq(g, d_in * g->act) : px__gb_tok(g, d_in * g->act);
    const px_ir_expr *wr = per_seq ? px__gb_seq(g, d_out * g->act) : px__gb_tok(g, d_out * g->act);
    px_ir_op *op = px__gb_op(g, PX_IR_OP_MATMUL, name, in, n_in, &out, 1, f,
                             px__gb_add(g, wbytes(g, w, b), rd_act), wr);
    op->sensitivity = PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = rewrites;
    return out;
}

/* ---- the llama family ---- */

#define RW_MATMUL                                                                       \
    (PX_IR_RW_LOWER_PRECISION | PX_IR_RW_QUANTIZE | PX_IR_RW_OFFLOAD | PX_IR_RW_SHARD | \
     PX_IR_RW_FUSE_NEXT)

static const char *nm(px__gb *g, const char *region, const char *what)
{
    return px_arena_printf(g->a, "%s.%s", region, what);
}

static uint32_t rmsnorm(px__gb *g, const char *region, const char *what, uint32_t x,
                        const px_ir_tensor *w, uint64_t d, bool per_seq)
{
    const char *name = nm(g, region, what);
    uint32_t out = px__gb_act(g, name, d, per_seq);
    uint32_t in[2] = {x, px__gb_weight(g, w)};
    px__flops f = {per_seq ? 0 : 4 * d, per_seq ? 4 * d : 0, 0};
    const px_ir_expr *act = per_seq ? px__gb_seq(g, d * g->act) : px__gb_tok(g, d * g->act);
    px_ir_op *op = px__gb_op(g, PX_IR_OP_RMSNORM, name, in, 2, &out, 1, f,
                             px__gb_add(g, px__e_const(g->a, px__tbytes(w)), act), act);
    op->sensitivity = PX_IR_SENS_PRECISION | PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_RECOMPUTE;
    return out;
}

static uint32_t residual(px__gb *g, const char *name, uint32_t x, uint32_t y, uint64_t d)
{
    uint32_t out = px__gb_act(g, name, d, false);
    uint32_t in[2] = {x, y};
    px__flops f = {d, 0, 0};
    px_ir_op *op = px__gb_op(g, PX_IR_OP_ADD, name, in, 2, &out, 1, f,
                             px__gb_tok(g, 2 * d * g->act), px__gb_tok(g, d * g->act));
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_LOWER_PRECISION;
    return out;
}

static uint64_t kv_head_bytes(const px_ir_model *m)
{
    uint64_t b = 0;
    px_dtype_nbytes(m->kv_dtype, m->hp.head_dim, &b);
    return b;
}

static uint32_t attention_block(px__gb *g, uint32_t l, uint32_t x)
{
    px_ir_model *m = g->m;
    const px_ir_hparams *hp = &m->hp;
    uint64_t d = hp->dim, hd = hp->head_dim;
    uint64_t qd = (uint64_t)hp->n_heads * hd, kvd = (uint64_t)hp->n_kv_heads * hd;
    const char *region = px_arena_printf(g->a, "layer.%u.attention", l);
    px__gb_region(g, region, PX_IR_REGION_ATTENTION, (int32_t)l, PX_IR_ROW_LAYER(l));

    uint32_t xn = rmsnorm(g, region, "attn_norm", x, px_ir_model_weight(m, l, PX_IR_ROLE_ATTN_NORM),
                          d, false);
    uint32_t q = px__gb_matmul(g, nm(g, region, "wq"), xn, px_ir_model_weight(m, l, PX_IR_ROLE_WQ),
                               px_ir_model_weight(m, l, PX_IR_ROLE_BQ), d, qd, false, RW_MATMUL);
    uint32_t k = px__gb_matmul(g, nm(g, region, "wk"), xn, px_ir_model_weight(m, l, PX_IR_ROLE_WK),
                               px_ir_model_weight(m, l, PX_IR_ROLE_BK), d, kvd, false, RW_MATMUL);
    uint32_t v = px__gb_matmul(g, nm(g, region, "wv"), xn, px_ir_model_weight(m, l, PX_IR_ROLE_WV),
                               px_ir_model_weight(m, l, PX_IR_ROLE_BV), d, kvd, false, RW_MATMUL);

    /* RoPE rotates rope_dim of each head's dimensions of q and k. */
    const char *rname = nm(g, region, "rope");
    uint32_t qr = px__gb_act(g, nm(g, region, "q_rot"), qd, false);
    uint32_t kr = px__gb_act(g, nm(g, region, "k_rot"), kvd, false);
    uint64_t rotated = (uint64_t)(hp->n_heads + hp->n_kv_heads) * hp->rope_dim;
    uint32_t rin[2] = {q, k}, rout[2] = {qr, kr};
    px_ir_op *op =
        px__gb_op(g, PX_IR_OP_ROPE, rname, rin, 2, rout, 2, (px__flops){3 * rotated, 0, 0},
                  px__gb_tok(g, (qd + kvd) * g->act), px__gb_tok(g, (qd + kvd) * g->act));
    op->sensitivity = PX_IR_SENS_PRECISION;
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_RECOMPUTE;

    /* The cache of this layer: [head_dim, n_kv_heads, T, B] for K and V. */
    const px_ir_expr *kv_shape[4] = {px__e_const(g->a, hd), px__e_const(g->a, hp->n_kv_heads),
                                     px__e_var(g->a, PX__E_T), px__e_var(g->a, PX__E_B)};
    uint32_t kc = px__gb_value(g, px_arena_printf(g->a, "%s.k_cache", region), PX_IR_VALUE_KV_CACHE,
                               m->kv_dtype, PX_IR_LAYOUT_KV_TOKEN_MAJOR, 4, kv_shape);
    uint32_t vc = px__gb_value(g, px_arena_printf(g->a, "%s.v_cache", region), PX_IR_VALUE_KV_CACHE,
                               m->kv_dtype, PX_IR_LAYOUT_KV_TOKEN_MAJOR, 4, kv_shape);
    uint64_t kvb = (uint64_t)hp->n_kv_heads * kv_head_bytes(m); /* one of K, V per token */
    uint32_t o = px__gb_act(g, nm(g, region, "attn"), qd, false);
    uint32_t ain[5] = {qr, kr, v, kc, vc}, aout[3] = {o, kc, vc};
    op = px__gb_op(g, PX_IR_OP_ATTENTION, nm(g, region, "attention"), ain, 5, aout, 3,
                   (px__flops){0, 0, (uint64_t)hp->n_heads * (4 * hd + 5)},
                   px__gb_add(g, px__gb_tok(g, (qd + 2 * kvd) * g->act), px__gb_ctx(g, 2 * kvb)),
                   px__gb_tok(g, qd * g->act + 2 * kvb));
    op->sensitivity = PX_IR_SENS_PRECISION | PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = PX_IR_RW_PAGE | PX_IR_RW_QUANTIZE_KV | PX_IR_RW_OFFLOAD | PX_IR_RW_SHARD |
                   PX_IR_RW_LOWER_PRECISION;

    uint32_t proj =
        px__gb_matmul(g, nm(g, region, "wo"), o, px_ir_model_weight(m, l, PX_IR_ROLE_WO), NULL, qd,
                      d, false, RW_MATMUL);
    return residual(g, nm(g, region, "residual"), x, proj, d);
}

static uint32_t ffn_block(px__gb *g, uint32_t l, uint32_t x)
{
    px_ir_model *m = g->m;
    const px_ir_hparams *hp = &m->hp;
    uint64_t d = hp->dim, h = hp->hidden_dim;
    const char *region = px_arena_printf(g->a, "layer.%u.ffn", l);
    px__gb_region(g, region, PX_IR_REGION_FFN, (int32_t)l, PX_IR_ROW_LAYER(l));
    uint32_t xn =
        rmsnorm(g, region, "ffn_norm", x, px_ir_model_weight(m, l, PX_IR_ROLE_FFN_NORM), d, false);
    uint32_t y;
    if (hp->n_experts == 0) {
        uint32_t gate = px__gb_matmul(g, nm(g, region, "w1_gate"), xn,
                                      px_ir_model_weight(m, l, PX_IR_ROLE_W1_GATE), NULL, d, h,
                                      false, RW_MATMUL);
        uint32_t up =
            px__gb_matmul(g, nm(g, region, "w3_up"), xn, px_ir_model_weight(m, l, PX_IR_ROLE_W3_UP),
                          NULL, d, h, false, RW_MATMUL);
        uint32_t act = px__gb_act(g, nm(g, region, "swiglu"), h, false);
        uint32_t in[2] = {gate, up};
        px_ir_op *op = px__gb_op(g, PX_IR_OP_SWIGLU, nm(g, region, "swiglu"), in, 2, &act, 1,
                                 (px__flops){5 * h, 0, 0}, px__gb_tok(g, 2 * h * g->act),
                                 px__gb_tok(g, h * g->act));
        op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_RECOMPUTE | PX_IR_RW_LOWER_PRECISION;
        y = px__gb_matmul(g, nm(g, region, "w2_down"), act,
                          px_ir_model_weight(m, l, PX_IR_ROLE_W2_DOWN), NULL, h, d, false,
                          RW_MATMUL);
    } else {
        uint64_t E = hp->n_experts, k = hp->n_experts_used;
        const px_ir_tensor *router = px_ir_model_weight(m, l, PX_IR_ROLE_MOE_ROUTER);
        uint32_t logits = px__gb_act(g, nm(g, region, "router"), E, false);
        uint32_t rin[2] = {xn, px__gb_weight(g, router)};
        px_ir_op *op = px__gb_op(
            g, PX_IR_OP_MOE_ROUTER, nm(g, region, "router"), rin, 2, &logits, 1,
            (px__flops){2 * d * E + 5 * E, 0, 0},
            px__gb_add(g, px__e_const(g->a, px__tbytes(router)), px__gb_tok(g, d * g->act)),
            px__gb_tok(g, E * g->act));
        op->sensitivity =
            PX_IR_SENS_PRECISION | PX_IR_SENS_DISCONTINUOUS | PX_IR_SENS_REDUCTION_ORDER;
        op->determinism = PX_IR_DET_ORDER;
        op->rewrites = PX_IR_RW_OFFLOAD;
        const px_ir_tensor *eg = px_ir_model_weight(m, l, PX_IR_ROLE_MOE_GATE_EXPS);
        const px_ir_tensor *eu = px_ir_model_weight(m, l, PX_IR_ROLE_MOE_UP_EXPS);
        const px_ir_tensor *ed = px_ir_model_weight(m, l, PX_IR_ROLE_MOE_DOWN_EXPS);
        uint64_t expert_bytes = (px__tbytes(eg) + px__tbytes(eu) + px__tbytes(ed)) / E;
        y = px__gb_act(g, nm(g, region, "experts"), d, false);
        uint32_t ein[5] = {xn, logits, px__gb_weight(g, eg), px__gb_weight(g, eu),
                           px__gb_weight(g, ed)};
        /* Weight bytes: the distinct experts a step touches, not all E. */
        const px_ir_expr *tokens =
            px__e_bin(g->a, PX__E_MUL, px__e_var(g->a, PX__E_B), px__e_var(g->a, PX__E_S));
        const px_ir_expr *touched =
            px__e_bin(g->a, PX__E_MUL, px__e_const(g->a, expert_bytes),
                      px__e_moe(g->a, hp->n_experts, hp->n_experts_used, tokens));
        op = px__gb_op(g, PX_IR_OP_MOE_EXPERTS, nm(g, region, "experts"), ein, 5, &y, 1,
                       (px__flops){k * (6 * d * h + 5 * h + 2 * d), 0, 0},
                       px__gb_add(g, touched, px__gb_tok(g, (d + E) * g->act)),
                       px__gb_tok(g, d * g->act));
        op->sensitivity = PX_IR_SENS_REDUCTION_ORDER;
        op->determinism = PX_IR_DET_ORDER;
        op->rewrites = RW_MATMUL;
        op->assumption = true;
    }
    return residual(g, nm(g, region, "residual"), x, y, d);
}

px_status px__ir_build_graph(px_ir_model *m, px_err *err)
{
    px__gb g;
    px_status st = px__gb_begin(&g, m, err);
    if (st != PX_OK)
        return st;
    const px_ir_hparams *hp = &m->hp;
    uint64_t d = hp->dim, V = hp->vocab_size;
    uint64_t kvh_bytes = kv_head_bytes(m);
    if (!kvh_bytes)
        return px_err_set(err, PX_EINVAL,
                          "%s: a KV cache in %s needs a head size that is a multiple of %u, "
                          "not %u; pick another KV dtype",
                          m->path, px_dtype_name(m->kv_dtype), px_dtype_block_elems(m->kv_dtype),
                          hp->head_dim);
    g.pairs = px__e_pairs(g.a, hp->sliding_window, true);

    /* Embedding: one row of the table per token. */
    px__gb_region(&g, "embedding", PX_IR_REGION_EMBEDDING, -1, PX_IR_ROW_EMBEDDING);
    const px_ir_expr *tok_shape[2] = {px__e_var(g.a, PX__E_S), px__e_var(g.a, PX__E_B)};
    uint32_t tokens = px__gb_value(&g, "tokens", PX_IR_VALUE_INPUT, PX_DTYPE_I32,
                                   PX_IR_LAYOUT_ROW_MAJOR, 2, tok_shape);
    const px_ir_tensor *emb = px_ir_model_weight(m, 0, PX_IR_ROLE_TOKEN_EMBD);
    uint32_t x = px__gb_act(&g, "embedding.x", d, false);
    uint32_t ein[2] = {tokens, px__gb_weight(&g, emb)};
    px_ir_op *op =
        px__gb_op(&g, PX_IR_OP_EMBEDDING, "embedding.lookup", ein, 2, &x, 1, (px__flops){0, 0, 0},
                  px__gb_tok(&g, emb->nb[1] + 4), px__gb_tok(&g, d * g.act));
    op->rewrites = PX_IR_RW_QUANTIZE | PX_IR_RW_OFFLOAD;
    /* The lookup reads rows, not the table: the region's bytes are what it
     * must hold, so they stay counted. */

    for (uint32_t l = 0; l < hp->n_layers && !g.oom; l++) {
        x = attention_block(&g, l, x);
        x = ffn_block(&g, l, x);
        px_ir_kv_desc *kv = NULL;
        if (!m->kv)
            m->kv = px_arena_calloc(g.a, hp->n_layers, sizeof *m->kv);
        if (!m->kv) {
            g.oom = true;
            break;
        }
        kv = &m->kv[m->n_kv++];
        kv->layer = l;
        kv->n_kv_heads = hp->n_kv_heads;
        kv->head_dim = hp->head_dim;
        kv->dtype = m->kv_dtype;
        kv->max_context = hp->context_length;
        kv->window = hp->sliding_window;
        kv->bytes_per_token = 2 * (uint64_t)hp->n_kv_heads * kvh_bytes;
    }

    /* Head: final norm, classifier and sampling on the last new token of
     * each sequence. */
    px__gb_region(&g, "head", PX_IR_REGION_HEAD, -1, PX_IR_ROW_HEAD(hp->n_layers));
    uint32_t xn = rmsnorm(&g, "head", "output_norm", x,
                          px_ir_model_weight(m, 0, PX_IR_ROLE_OUTPUT_NORM), d, true);
    const px_ir_tensor *cls = px_ir_model_weight(m, 0, PX_IR_ROLE_OUTPUT);
    uint32_t cls_value;
    if (hp->tied_classifier) {
        /* The classifier is the embedding table, read a second way. */
        const px_ir_expr *shape[2] = {px__e_const(g.a, cls->ne[0]), px__e_const(g.a, cls->ne[1])};
        cls_value = px__gb_value(
            &g, "output.weight (tied to token_embd.weight)", PX_IR_VALUE_WEIGHT, cls->dtype,
            px_dtype_is_quantized(cls->dtype) ? PX_IR_LAYOUT_BLOCKED : PX_IR_LAYOUT_ROW_MAJOR, 2,
            shape);
        if (!g.oom) {
            m->values[cls_value].weight = cls;
            m->values[cls_value].alias_of = (int32_t)px__gb_weight(&g, emb);
        }
    } else {
        cls_value = px__gb_weight(&g, cls);
    }
    const px_ir_expr *logit_shape[2] = {px__e_const(g.a, V), px__e_var(g.a, PX__E_B)};
    uint32_t logits = px__gb_value(&g, "head.logits", PX_IR_VALUE_OUTPUT, m->act_dtype,
                                   PX_IR_LAYOUT_ROW_MAJOR, 2, logit_shape);
    uint32_t cin[2] = {xn, cls_value};
    op = px__gb_op(&g, PX_IR_OP_CLASSIFIER, "head.classifier", cin, 2, &logits, 1,
                   (px__flops){0, 2 * d * V, 0},
                   px__gb_add(&g, px__e_const(g.a, cls->n_bytes), px__gb_seq(&g, d * g.act)),
                   px__gb_seq(&g, V * g.act));
    op->sensitivity = PX_IR_SENS_PRECISION | PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = PX_IR_RW_QUANTIZE | PX_IR_RW_OFFLOAD | PX_IR_RW_SHARD;
    const px_ir_expr *next_shape[1] = {px__e_var(g.a, PX__E_B)};
    uint32_t next = px__gb_value(&g, "head.next_token", PX_IR_VALUE_OUTPUT, PX_DTYPE_I32,
                                 PX_IR_LAYOUT_ROW_MAJOR, 1, next_shape);
    op = px__gb_op(&g, PX_IR_OP_SAMPLING, "head.sampling", &logits, 1, &next, 1,
                   (px__flops){0, 5 * V, 0}, px__gb_seq(&g, V * g.act), px__gb_seq(&g, 4));
    op->sensitivity = PX_IR_SENS_DISCONTINUOUS;
    op->determinism = PX_IR_DET_SEEDED;
    op->observable_order = true;
    return px__gb_end(&g, err);
}
