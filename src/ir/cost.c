/*
 * The layer cost summary (precomputed per row), cost evaluation of ops,
 * regions and the graph, and the graph accessors.
 */
#include "ir/ir_impl.h"

/* Summary row a stored tensor belongs to: blocks by their number, the
 * final norm, classifier and DiT final layer to the head, everything else
 * (embeddings, conditioning, shared tables) to the embedding row. */
static uint32_t tensor_row(const px_ir_model *m, const px_ir_tensor *t)
{
    const char *name = t->name;
    if (!strncmp(name, "blk.", 4)) {
        char *end;
        unsigned long long b = strtoull(name + 4, &end, 10);
        if (end != name + 4 && *end == '.' && b < m->hp.n_layers)
            return PX_IR_ROW_LAYER(b);
    }
    if (!strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight") ||
        !strncmp(name, "final.", 6))
        return PX_IR_ROW_HEAD(m->hp.n_layers);
    return PX_IR_ROW_EMBEDDING;
}

static void add_sat(uint64_t *acc, uint64_t v)
{
    if (__builtin_add_overflow(*acc, v, acc))
        *acc = UINT64_MAX;
}

/* Adds a tensor's values and bytes, and its bytes at every dtype, to a row. */
static void add_tensor(px_ir_layer_cost *r, const px_ir_tensor *t)
{
    r->n_params += t->n_elems;
    r->weight_bytes += t->n_bytes;
    uint64_t rows = t->n_elems / t->ne[0];
    for (int d = 0; d < PX_DTYPE_COUNT_; d++) {
        uint64_t b;
        if (t->n_dims < 2) {
            b = t->n_bytes; /* norms and biases keep their dtype */
        } else {
            uint64_t row;
            if (!px_dtype_nbytes((px_dtype)d, t->ne[0], &row) ||
                __builtin_mul_overflow(row, rows, &b))
                b = UINT64_MAX;
        }
        if (r->weight_bytes_at[d] != UINT64_MAX)
            add_sat(&r->weight_bytes_at[d], b);
    }
}

px_status px__ir_build_summary(px_ir_model *m, px_err *err)
{
    (void)err;
    const px_ir_hparams *hp = &m->hp;
    uint32_t head = PX_IR_ROW_HEAD(hp->n_layers);
    for (size_t i = 0; i < m->n_tensors; i++)
        add_tensor(&m->rows[tensor_row(m, &m->tensors[i])], &m->tensors[i]);
    /* A stage holding the head needs the classifier even when it is the
     * embedding table. */
    if (hp->tied_classifier && hp->arch != PX_IR_ARCH_DIT)
        add_tensor(&m->rows[head], px_ir_model_weight(m, 0, PX_IR_ROLE_TOKEN_EMBD));
    uint64_t act = px_dtype_block_bytes(m->act_dtype);
    for (uint32_t r = 0; r < m->n_rows; r++) {
        px_ir_layer_cost *c = &m->rows[r];
        c->window = hp->sliding_window;
        c->causal = hp->arch != PX_IR_ARCH_DIT;
        c->act_bytes_token = (uint64_t)hp->dim * act;
        if (r >= 1 && r <= hp->n_layers) {
            uint32_t l = r - 1;
            if (l < m->n_kv)
                c->kv_bytes_token = m->kv[l].bytes_per_token;
            if (hp->n_experts) {
                c->n_experts = hp->n_experts;
                c->n_experts_used = hp->n_experts_used;
                c->expert_bytes = (px__tbytes(px_ir_model_weight(m, l, PX_IR_ROLE_MOE_GATE_EXPS)) +
                                   px__tbytes(px_ir_model_weight(m, l, PX_IR_ROLE_MOE_UP_EXPS)) +
                                   px__tbytes(px_ir_model_weight(m, l, PX_IR_ROLE_MOE_DOWN_EXPS))) /
                                  hp->n_experts;
            }
        }
    }
    m->rows[head].act_bytes_token =
        hp->arch == PX_IR_ARCH_DIT
            ? (uint64_t)hp->dit_patch_size * hp->dit_patch_size * hp->dit_out_channels * act
            : 4;
    for (size_t r = 0; r < m->n_regions; r++) {
        px_ir_region *reg = &m->regions[r];
        for (uint32_t i = 0; i < reg->n_ops; i++)
            reg->sensitivity |= m->ops[reg->first_op + i].sensitivity;
    }
    return PX_OK;
}

uint32_t px_ir_model_n_rows(const px_ir_model *m)
{
    return m->n_rows;
}

px_status px_ir_model_layer_cost(const px_ir_model *m, uint32_t row, px_ir_layer_cost *out)
{
    if (row >= m->n_rows)
        return PX_EINVAL;
    *out = m->rows[row];
    return PX_OK;
}

const px_ir_layer_cost *px_ir_model_layer_costs(const px_ir_model *m)
{
    return m->rows;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t row_flops(const px_ir_layer_cost *c, uint64_t S, uint64_t T)
{
    uint64_t total = mul_sat(S, c->flops_token);
    add_sat(&total, mul_sat(px_ir_attention_pairs(S, T, c->window, c->causal), c->flops_pair));
    add_sat(&total, c->flops_seq);
    return total;
}

uint64_t px_ir_decode_flops(const px_ir_layer_cost *c, uint64_t T)
{
    return row_flops(c, 1, T ? T : 1);
}

uint64_t px_ir_prefill_flops(const px_ir_layer_cost *c, uint64_t S)
{
    return row_flops(c, S, S);
}

uint64_t px_ir_step_weight_bytes(const px_ir_layer_cost *c, uint64_t n_tokens)
{
    if (!c->n_experts)
        return c->weight_bytes;
    uint64_t experts = mul_sat(c->expert_bytes, c->n_experts);
    uint64_t fixed = c->weight_bytes > experts ? c->weight_bytes - experts : 0;
    uint64_t touched = px_ir_moe_experts_touched(c->n_experts, c->n_experts_used, n_tokens);
    uint64_t total = fixed;
    add_sat(&total, mul_sat(touched, c->expert_bytes));
    return total;
}

void px_ir_model_totals(const px_ir_model *m, px_ir_totals *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const px_ir_tensor *t = &m->tensors[i];
        out->n_params += t->n_elems;
        out->weight_bytes += t->n_bytes;
        out->params_by_dtype[t->dtype] += t->n_elems;
        out->bytes_by_dtype[t->dtype] += t->n_bytes;
    }
    for (size_t i = 0; i < m->n_kv; i++)
        out->kv_bytes_token += m->kv[i].bytes_per_token;
}

uint64_t px_ir_model_kv_bytes_per_token(const px_ir_model *m, px_dtype kv_dtype)
{
    uint64_t total = 0;
    for (size_t i = 0; i < m->n_kv; i++) {
        uint64_t b;
        if (!px_dtype_nbytes(kv_dtype, m->kv[i].head_dim, &b))
            return UINT64_MAX;
        add_sat(&total, mul_sat(2 * (uint64_t)m->kv[i].n_kv_heads, b));
    }
    return total;
}

/* ---- graph accessors ---- */

size_t px_ir_model_n_values(const px_ir_model *m)
{
    return m->n_values;
}

const px_ir_value *px_ir_model_value(const px_ir_model *m, size_t i)
{
    return i < m->n_values ? &m->values[i] : NULL;
}

size_t px_ir_model_n_ops(const px_ir_model *m)
{
    return m->n_ops;
}

const px_ir_op *px_ir_model_op(const px_ir_model *m, size_t i)
{
    return i < m->n_ops ? &m->ops[i] : NULL;
}

size_t px_ir_model_n_regions(const px_ir_model *m)
{
    return m->n_regions;
}

const px_ir_region *px_ir_model_region(const px_ir_model *m, size_t i)
{
    return i < m->n_regions ? &m->regions[i] : NULL;
}

const px_ir_region *px_ir_model_find_region(const px_ir_model *m, const char *name)
{
    for (size_t i = 0; i < m->n_regions; i++)
        if (!strcmp(m->regions[i].name, name))
            return &m->regions[i];
    return NULL;
}

size_t px_ir_model_phases(const px_ir_model *m, px_ir_phase out[3])
{
    if (m->hp.arch == PX_IR_ARCH_DIT) {
        out[0] = PX_IR_PHASE_DENOISE;
        return 1;
    }
    out[0] = PX_IR_PHASE_PREFILL;
    out[1] = PX_IR_PHASE_DECODE;
    return 2;
}

const char *px_ir_phase_name(px_ir_phase p)
{
    switch (p) {
    case PX_IR_PHASE_PREFILL:
        return "prefill";
    case PX_IR_PHASE_DECODE:
        return "decode";
    case PX_IR_PHASE_DENOISE:
        return "denoise";
    }
    return "?";
}

size_t px_ir_model_n_kv(const px_ir_model *m)
{
    return m->n_kv;
}

const px_ir_kv_desc *px_ir_model_kv(const px_ir_model *m, size_t i)
{
    return i < m->n_kv ? &m->kv[i] : NULL;
}

px_ir_dims px_ir_model_phase_dims(const px_ir_model *m, px_ir_phase p, uint64_t batch,
                                  uint64_t tokens)
{
    px_ir_dims d = {batch ? batch : 1, 1, tokens ? tokens : 1};
    if (p == PX_IR_PHASE_PREFILL)
        d.S = d.T;
    if (p == PX_IR_PHASE_DENOISE) {
        uint64_t side = m->hp.dit_patch_size ? m->hp.dit_input_size / m->hp.dit_patch_size : 1;
        d.S = d.T = side * side;
    }
    return d;
}

px_status px_ir_op_cost(const px_ir_model *m, size_t op, px_ir_dims d, px_ir_cost *out, px_err *err)
{
    if (op >= m->n_ops)
        return px_err_set(err, PX_EINVAL, "%s: op %zu does not exist (%zu ops)", m->path, op,
                          m->n_ops);
    const px_ir_op *o = &m->ops[op];
    px_status st;
    if ((st = px_ir_expr_eval(o->flops, d, &out->flops, err)) != PX_OK ||
        (st = px_ir_expr_eval(o->bytes_read, d, &out->bytes_read, err)) != PX_OK ||
        (st = px_ir_expr_eval(o->bytes_written, d, &out->bytes_written, err)) != PX_OK)
        return px_err_prefix(err, st, "%s: op %s: ", m->path, o->name);
    return PX_OK;
}

static px_status sum_ops(const px_ir_model *m, size_t first, size_t n, px_ir_dims d,
                         px_ir_cost *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    for (size_t i = first; i < first + n; i++) {
        px_ir_cost c;
        px_status st = px_ir_op_cost(m, i, d, &c, err);
        if (st != PX_OK)
            return st;
        if (__builtin_add_overflow(out->flops, c.flops, &out->flops) ||
            __builtin_add_overflow(out->bytes_read, c.bytes_read, &out->bytes_read) ||
            __builtin_add_overflow(out->bytes_written, c.bytes_written, &out->bytes_written))
            return px_err_set(err, PX_ERANGE, "%s: cost overflows 64 bits; use smaller dims",
                              m->path);
    }
    return PX_OK;
}

px_status px_ir_region_cost(const px_ir_model *m, size_t region, px_ir_dims d, px_ir_cost *out,
                            px_err *err)
{
    if (region >= m->n_regions)
        return px_err_set(err, PX_EINVAL, "%s: region %zu does not exist", m->path, region);
    return sum_ops(m, m->regions[region].first_op, m->regions[region].n_ops, d, out, err);
}

px_status px_ir_graph_cost(const px_ir_model *m, px_ir_dims d, px_ir_cost *out, px_err *err)
{
    return sum_ops(m, 0, m->n_ops, d, out, err);
}
