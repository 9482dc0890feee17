/*
 * The graph of a diffusion transformer (DiT, Peebles and Xie 2023): latent
 * patches become tokens, a timestep and class label become a conditioning
 * vector, each block modulates LayerNorm with shifts, scales and gates
 * computed from that vector (adaLN-Zero), attention is bidirectional over
 * the latent tokens and there is no KV cache.  One denoising step runs the
 * whole graph with S = T = latent tokens; a sample repeats it dit_steps
 * times over the same weights.
 */
#include "ir/ir_impl.h"

static const char *nm(px__gb *g, const char *region, const char *what)
{
    return px_arena_printf(g->a, "%s.%s", region, what);
}

static const px_ir_tensor *bias(const px_ir_model *m, const char *fmt, uint32_t l)
{
    char name[96];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(name, sizeof name, fmt, l);
#pragma GCC diagnostic pop
    return px_ir_model_find_tensor(m, name);
}

#define RW_MATMUL                                                                       \
    (PX_IR_RW_LOWER_PRECISION | PX_IR_RW_QUANTIZE | PX_IR_RW_OFFLOAD | PX_IR_RW_SHARD | \
     PX_IR_RW_FUSE_NEXT)

/* adaLN: silu(c) through a linear layer to n_vec vectors of width d, once
 * per sequence. */
static uint32_t adaln(px__gb *g, const char *region, uint32_t c, const px_ir_tensor *w,
                      const px_ir_tensor *b, uint64_t d, uint64_t n_vec)
{
    const char *name = nm(g, region, "adaln");
    uint32_t out = px__gb_act(g, name, n_vec * d, true);
    uint32_t in[3] = {c, px__gb_weight(g, w), 0};
    uint32_t n_in = 2;
    if (b)
        in[n_in++] = px__gb_weight(g, b);
    uint64_t k = 5 * d + 2 * d * n_vec * d + (b ? n_vec * d : 0);
    px_ir_op *op = px__gb_op(
        g, PX_IR_OP_ADALN, name, in, n_in, &out, 1, (px__flops){0, k, 0},
        px__gb_add(g, px__e_const(g->a, px__tbytes(w) + px__tbytes(b)), px__gb_seq(g, d * g->act)),
        px__gb_seq(g, n_vec * d * g->act));
    op->sensitivity = PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = RW_MATMUL;
    return out;
}

/* LayerNorm without affine parameters, then x*(1+scale)+shift. */
static uint32_t norm_modulate(px__gb *g, const char *region, const char *what, uint32_t x,
                              uint32_t mod, uint64_t d)
{
    const char *name = nm(g, region, what);
    uint32_t xn = px__gb_act(g, name, d, false);
    px_ir_op *op = px__gb_op(g, PX_IR_OP_LAYERNORM, name, &x, 1, &xn, 1, (px__flops){8 * d, 0, 0},
                             px__gb_tok(g, d * g->act), px__gb_tok(g, d * g->act));
    op->sensitivity = PX_IR_SENS_PRECISION | PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_RECOMPUTE;
    const char *mname = px_arena_printf(g->a, "%s.%s_modulate", region, what);
    uint32_t out = px__gb_act(g, mname, d, false);
    uint32_t in[2] = {xn, mod};
    op = px__gb_op(g, PX_IR_OP_MODULATE, mname, in, 2, &out, 1, (px__flops){2 * d, 0, 0},
                   px__gb_add(g, px__gb_tok(g, d * g->act), px__gb_seq(g, 2 * d * g->act)),
                   px__gb_tok(g, d * g->act));
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_LOWER_PRECISION;
    return out;
}

/* x + gate * y, gate per sequence. */
static uint32_t gate(px__gb *g, const char *region, uint32_t x, uint32_t y, uint32_t mod,
                     uint64_t d)
{
    const char *name = nm(g, region, "gate");
    uint32_t out = px__gb_act(g, name, d, false);
    uint32_t in[3] = {x, y, mod};
    px_ir_op *op =
        px__gb_op(g, PX_IR_OP_GATE, name, in, 3, &out, 1, (px__flops){2 * d, 0, 0},
                  px__gb_add(g, px__gb_tok(g, 2 * d * g->act), px__gb_seq(g, d * g->act)),
                  px__gb_tok(g, d * g->act));
    op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_LOWER_PRECISION;
    return out;
}

px_status px__ir_build_graph_dit(px_ir_model *m, px_err *err)
{
    px__gb g;
    px_status st = px__gb_begin(&g, m, err);
    if (st != PX_OK)
        return st;
    const px_ir_hparams *hp = &m->hp;
    uint64_t d = hp->dim, h = hp->hidden_dim, p = hp->dit_patch_size;
    uint64_t C = hp->dit_in_channels, cpp = C * p * p;
    uint64_t out_w = p * p * hp->dit_out_channels, hd = hp->head_dim;
    g.pairs = px__e_pairs(g.a, 0, false);

    /* Embedding: patches to tokens (+ fixed sin-cos positions), and the
     * conditioning vector from the timestep and the class label. */
    px__gb_region(&g, "embedding", PX_IR_REGION_EMBEDDING, -1, PX_IR_ROW_EMBEDDING);
    const px_ir_expr *lat_shape[4] = {px__e_const(g.a, C), px__e_const(g.a, hp->dit_input_size),
                                      px__e_const(g.a, hp->dit_input_size),
                                      px__e_var(g.a, PX__E_B)};
    uint32_t latents = px__gb_value(&g, "latents", PX_IR_VALUE_INPUT, m->act_dtype,
                                    PX_IR_LAYOUT_ROW_MAJOR, 4, lat_shape);
    const px_ir_tensor *pw = px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_PATCH_EMBD);
    const px_ir_tensor *pb = px_ir_model_find_tensor(m, "patch_embd.bias");
    uint32_t x = px__gb_act(&g, "embedding.x", d, false);
    uint32_t pin[3] = {latents, px__gb_weight(&g, pw), 0};
    uint32_t n_in = 2;
    if (pb)
        pin[n_in++] = px__gb_weight(&g, pb);
    px_ir_op *op = px__gb_op(&g, PX_IR_OP_PATCH_EMBED, "embedding.patch", pin, n_in, &x, 1,
                             (px__flops){2 * cpp * d + (pb ? d : 0) + d, 0, 0},
                             px__gb_add(&g, px__e_const(g.a, px__tbytes(pw) + px__tbytes(pb)),
                                        px__gb_tok(&g, cpp * g.act)),
                             px__gb_tok(&g, d * g.act));
    op->sensitivity = PX_IR_SENS_REDUCTION_ORDER;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = RW_MATMUL;

    const px_ir_expr *seq_shape[1] = {px__e_var(g.a, PX__E_B)};
    uint32_t t_in = px__gb_value(&g, "timestep", PX_IR_VALUE_INPUT, PX_DTYPE_F32,
                                 PX_IR_LAYOUT_ROW_MAJOR, 1, seq_shape);
    uint32_t y_in = px__gb_value(&g, "label", PX_IR_VALUE_INPUT, PX_DTYPE_I32,
                                 PX_IR_LAYOUT_ROW_MAJOR, 1, seq_shape);
    const px_ir_tensor *t1 = px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_T_EMBD_1);
    const px_ir_tensor *t2 = px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_T_EMBD_2);
    const px_ir_tensor *b1 = px_ir_model_find_tensor(m, "t_embd.fc1.bias");
    const px_ir_tensor *b2 = px_ir_model_find_tensor(m, "t_embd.fc2.bias");
    const px_ir_tensor *ye = px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_Y_EMBD);
    uint32_t c = px__gb_act(&g, "embedding.c", d, true);
    uint32_t tin[7] = {
        t_in, y_in, px__gb_weight(&g, t1), px__gb_weight(&g, t2), px__gb_weight(&g, ye), 0, 0};
    n_in = 5;
    if (b1)
        tin[n_in++] = px__gb_weight(&g, b1);
    if (b2)
        tin[n_in++] = px__gb_weight(&g, b2);
    uint64_t fq = hp->dit_freq_dim;
    /* Sinusoids (2 per frequency value), fc1, SiLU, fc2, plus the label row. */
    uint64_t tk = 2 * fq + 2 * fq * d + (b1 ? d : 0) + 5 * d + 2 * d * d + (b2 ? d : 0) + d;
    op = px__gb_op(
        &g, PX_IR_OP_TIMESTEP_EMBED, "embedding.condition", tin, n_in, &c, 1, (px__flops){0, tk, 0},
        px__gb_add(
            &g, px__e_const(g.a, px__tbytes(t1) + px__tbytes(t2) + px__tbytes(b1) + px__tbytes(b2)),
            px__gb_seq(&g, ye->nb[1] + 8)),
        px__gb_seq(&g, d * g.act));
    op->sensitivity = PX_IR_SENS_PRECISION;
    op->determinism = PX_IR_DET_ORDER;
    op->rewrites = PX_IR_RW_OFFLOAD;

    for (uint32_t l = 0; l < hp->n_layers && !g.oom; l++) {
        const char *region = px_arena_printf(g.a, "layer.%u.attention", l);
        px__gb_region(&g, region, PX_IR_REGION_ATTENTION, (int32_t)l, PX_IR_ROW_LAYER(l));
        uint32_t mod = adaln(&g, region, c, px_ir_model_weight(m, l, PX_IR_ROLE_DIT_ADALN),
                             bias(m, "blk.%u.adaln.bias", l), d, 6);
        uint32_t xm = norm_modulate(&g, region, "norm1", x, mod, d);
        uint32_t qkv = px__gb_matmul(
            &g, nm(&g, region, "qkv"), xm, px_ir_model_weight(m, l, PX_IR_ROLE_DIT_QKV),
            bias(m, "blk.%u.attn_qkv.bias", l), d, 3 * d, false, RW_MATMUL);
        uint32_t o = px__gb_act(&g, nm(&g, region, "attn"), d, false);
        op = px__gb_op(&g, PX_IR_OP_ATTENTION, nm(&g, region, "attention"), &qkv, 1, &o, 1,
                       (px__flops){0, 0, (uint64_t)hp->n_heads * (4 * hd + 5)},
                       px__gb_tok(&g, 3 * d * g.act), px__gb_tok(&g, d * g.act));
        op->sensitivity = PX_IR_SENS_PRECISION | PX_IR_SENS_REDUCTION_ORDER;
        op->determinism = PX_IR_DET_ORDER;
        op->rewrites = PX_IR_RW_SHARD | PX_IR_RW_LOWER_PRECISION | PX_IR_RW_RECOMPUTE;
        uint32_t proj = px__gb_matmul(
            &g, nm(&g, region, "proj"), o, px_ir_model_weight(m, l, PX_IR_ROLE_DIT_PROJ),
            bias(m, "blk.%u.attn_output.bias", l), d, d, false, RW_MATMUL);
        x = gate(&g, region, x, proj, mod, d);

        region = px_arena_printf(g.a, "layer.%u.ffn", l);
        px__gb_region(&g, region, PX_IR_REGION_FFN, (int32_t)l, PX_IR_ROW_LAYER(l));
        xm = norm_modulate(&g, region, "norm2", x, mod, d);
        uint32_t up = px__gb_matmul(&g, nm(&g, region, "fc1"), xm,
                                    px_ir_model_weight(m, l, PX_IR_ROLE_DIT_FC1),
                                    bias(m, "blk.%u.ffn_up.bias", l), d, h, false, RW_MATMUL);
        uint32_t act = px__gb_act(&g, nm(&g, region, "gelu"), h, false);
        op = px__gb_op(&g, PX_IR_OP_GELU, nm(&g, region, "gelu"), &up, 1, &act, 1,
                       (px__flops){8 * h, 0, 0}, px__gb_tok(&g, h * g.act),
                       px__gb_tok(&g, h * g.act));
        op->rewrites = PX_IR_RW_FUSE_NEXT | PX_IR_RW_RECOMPUTE | PX_IR_RW_LOWER_PRECISION;
        uint32_t down = px__gb_matmul(&g, nm(&g, region, "fc2"), act,
                                      px_ir_model_weight(m, l, PX_IR_ROLE_DIT_FC2),
                                      bias(m, "blk.%u.ffn_down.bias", l), h, d, false, RW_MATMUL);
        x = gate(&g, region, x, down, mod, d);
    }

    px__gb_region(&g, "head", PX_IR_REGION_HEAD, -1, PX_IR_ROW_HEAD(hp->n_layers));
    uint32_t mod = adaln(&g, "head", c, px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_FINAL_ADALN),
                         px_ir_model_find_tensor(m, "final.adaln.bias"), d, 2);
    uint32_t xm = norm_modulate(&g, "head", "norm", x, mod, d);
    uint32_t y =
        px__gb_matmul(&g, "head.proj", xm, px_ir_model_weight(m, 0, PX_IR_ROLE_DIT_FINAL_PROJ),
                      px_ir_model_find_tensor(m, "final.proj.bias"), d, out_w, false, RW_MATMUL);
    const px_ir_expr *out_shape[4] = {
        px__e_const(g.a, hp->dit_out_channels), px__e_const(g.a, hp->dit_input_size),
        px__e_const(g.a, hp->dit_input_size), px__e_var(g.a, PX__E_B)};
    uint32_t noise = px__gb_value(&g, "head.prediction", PX_IR_VALUE_OUTPUT, m->act_dtype,
                                  PX_IR_LAYOUT_ROW_MAJOR, 4, out_shape);
    op = px__gb_op(&g, PX_IR_OP_UNPATCHIFY, "head.unpatchify", &y, 1, &noise, 1,
                   (px__flops){0, 0, 0}, px__gb_tok(&g, out_w * g.act),
                   px__gb_tok(&g, out_w * g.act));
    op->observable_order = false;
    return px__gb_end(&g, err);
}
