/* The model view: per-block costs flattened out of the IR's layer summary. */
#include "base/common.h"

#include "cost/cost_impl.h"

static double tensor_elems(const px_ir_model *ir, uint32_t layer, px_ir_role role)
{
    const px_ir_tensor *t = px_ir_model_weight(ir, layer, role);
    return t ? (double)t->n_elems : 0.0;
}

static double region_bytes(const px_ir_model *ir, const char *name)
{
    const px_ir_region *r = px_ir_model_find_region(ir, name);
    return r ? (double)r->weight_bytes : -1.0;
}

static void split_block(const px_ir_model *ir, const px_ir_hparams *hp, uint32_t i,
                        const px_ir_layer_cost *row, px_cost_layer *l)
{
    static const px_ir_role attn_roles[] = {
        PX_IR_ROLE_WQ,      PX_IR_ROLE_WK,       PX_IR_ROLE_WV,       PX_IR_ROLE_WO,
        PX_IR_ROLE_DIT_QKV, PX_IR_ROLE_DIT_PROJ, PX_IR_ROLE_DIT_ADALN};
    static const px_ir_role ffn_roles[] = {
        PX_IR_ROLE_W1_GATE,     PX_IR_ROLE_W2_DOWN,       PX_IR_ROLE_W3_UP,
        PX_IR_ROLE_MOE_ROUTER,  PX_IR_ROLE_MOE_GATE_EXPS, PX_IR_ROLE_MOE_DOWN_EXPS,
        PX_IR_ROLE_MOE_UP_EXPS, PX_IR_ROLE_DIT_FC1,       PX_IR_ROLE_DIT_FC2};
    bool dit = hp->arch == PX_IR_ARCH_DIT;
    for (size_t k = 0; k < PX_ARRAY_LEN(attn_roles); k++) {
        bool dit_role = attn_roles[k] >= PX_IR_ROLE_DIT_PATCH_EMBD;
        if (dit_role == dit)
            l->attn_params += tensor_elems(ir, i, attn_roles[k]);
    }
    for (size_t k = 0; k < PX_ARRAY_LEN(ffn_roles); k++) {
        bool dit_role = ffn_roles[k] >= PX_IR_ROLE_DIT_PATCH_EMBD;
        if (dit_role == dit)
            l->ffn_params += tensor_elems(ir, i, ffn_roles[k]);
    }
    char name[64];
    snprintf(name, sizeof name, "layer.%u.attention", i);
    double ab = region_bytes(ir, name);
    snprintf(name, sizeof name, "layer.%u.ffn", i);
    double fb = region_bytes(ir, name);
    double total = (double)row->weight_bytes;
    if (ab >= 0 && fb >= 0 && ab + fb > 0) {
        /* Scale so that the two regions add up to the row exactly. */
        double s = total / (ab + fb);
        l->attn_bytes = ab * s;
        l->ffn_bytes = fb * s;
    } else {
        double pa = l->attn_params, pf = l->ffn_params;
        double share = pa + pf > 0 ? pa / (pa + pf) : 0.5;
        l->attn_bytes = total * share;
        l->ffn_bytes = total - l->attn_bytes;
    }
    if (l->attn_params + l->ffn_params <= 0) {
        l->attn_params = (double)row->n_params * (l->attn_bytes / (total > 0 ? total : 1));
        l->ffn_params = (double)row->n_params - l->attn_params;
    }
}

static void fill_row(const px_ir_layer_cost *row, px_cost_layer *l)
{
    l->flops_token = (double)row->flops_token;
    l->flops_pair = (double)row->flops_pair;
    l->flops_seq = (double)row->flops_seq;
    l->kv_bytes_token = (double)row->kv_bytes_token;
    l->act_bytes_token = (double)row->act_bytes_token;
    l->expert_bytes = (double)row->expert_bytes;
    l->n_experts = row->n_experts;
    l->n_experts_used = row->n_experts_used;
}

static px_status model_id(const px_ir_model *ir, px_cost_model *m, px_err *err)
{
    if (px_ir_model_source(ir) == PX_IR_SOURCE_PRESET) {
        snprintf(m->id, sizeof m->id, "preset:%s", px_ir_model_path(ir));
        return PX_OK;
    }
    px_digest d;
    char hex[65];
    px_status st = px_sha256_file(px_ir_model_path(ir), &d, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "model digest: ");
    px_digest_hex(&d, hex);
    snprintf(m->id, sizeof m->id, "sha256:%s", hex);
    return PX_OK;
}

px_status px_cost_model_new(const px_ir_model *ir, px_cost_model **out, px_err *err)
{
    *out = NULL;
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    uint32_t n_rows = px_ir_model_n_rows(ir);
    const px_ir_layer_cost *rows = px_ir_model_layer_costs(ir);
    if (!hp || hp->n_layers == 0 || n_rows != hp->n_layers + 2 || !rows)
        return px_err_set(err, PX_EINVAL, "model %s has no transformer blocks to place",
                          px_ir_model_path(ir));
    px_cost_model *m = calloc(1, sizeof *m);
    if (!m)
        return px_err_set(err, PX_ENOMEM, "out of memory building the model view");
    m->layers = calloc(hp->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return px_err_set(err, PX_ENOMEM, "out of memory building the model view");
    }
    m->ir = ir;
    m->name = hp->name[0] ? hp->name : px_ir_model_path(ir);
    m->arch = hp->arch;
    m->dit = hp->arch == PX_IR_ARCH_DIT;
    m->tied_head = hp->tied_classifier;
    m->n_layers = hp->n_layers;
    m->dim = hp->dim;
    m->hidden_dim = hp->hidden_dim;
    m->n_heads = hp->n_heads;
    m->n_kv_heads = hp->n_kv_heads;
    m->head_dim = hp->head_dim;
    m->vocab = hp->vocab_size;
    m->dit_steps = hp->dit_steps;
    if (m->dit && hp->dit_patch_size > 0) {
        uint32_t side = hp->dit_input_size / hp->dit_patch_size;
        m->dit_tokens = side * side;
    }
    m->act_dtype = PX_DTYPE_F32;
    m->kv_dtype = PX_DTYPE_F32;
    if (px_ir_model_n_kv(ir) > 0)
        m->kv_dtype = px_ir_model_kv(ir, 0)->dtype;
    const px_ir_tensor *probe =
        px_ir_model_weight(ir, 0, m->dit ? PX_IR_ROLE_DIT_QKV : PX_IR_ROLE_WQ);
    m->weight_dtype = probe ? probe->dtype : PX_DTYPE_F32;

    for (uint32_t i = 0; i < hp->n_layers; i++) {
        const px_ir_layer_cost *row = &rows[PX_IR_ROW_LAYER(i)];
        fill_row(row, &m->layers[i]);
        split_block(ir, hp, i, row, &m->layers[i]);
        m->total_params += (double)row->n_params;
        m->total_bytes += (double)row->weight_bytes;
    }
    const px_ir_layer_cost *er = &rows[PX_IR_ROW_EMBEDDING];
    const px_ir_layer_cost *hr = &rows[PX_IR_ROW_HEAD(hp->n_layers)];
    fill_row(er, &m->embedding);
    fill_row(hr, &m->head);
    m->embedding.attn_params = (double)er->n_params;
    m->embedding.attn_bytes = (double)er->weight_bytes;
    m->head.attn_params = (double)hr->n_params;
    m->head.attn_bytes = (double)hr->weight_bytes;
    m->total_params += (double)(er->n_params + hr->n_params);
    m->total_bytes += (double)(er->weight_bytes + hr->weight_bytes);

    px_status st = model_id(ir, m, err);
    if (st != PX_OK) {
        px_cost_model_free(m);
        return st;
    }
    *out = m;
    return PX_OK;
}

void px_cost_model_free(px_cost_model *m)
{
    if (!m)
        return;
    free(m->layers);
    free(m);
}

/* Bytes of `params` matrix values stored as `bytes` if re-stored at dt:
 * the matrices change size, whatever else the region holds (norms,
 * biases) keeps its bytes. */
static double at_dtype(double params, double bytes, px_dtype stored, px_dtype dt)
{
    if (dt >= PX_DTYPE_COUNT_ || dt == stored || params <= 0)
        return bytes;
    double matrices = params * px__cost_bpe(stored, 4.0);
    double rest = bytes > matrices ? bytes - matrices : 0;
    return params * px__cost_bpe(dt, 4.0) + rest;
}

double px_cost_region_bytes(const px_cost_model *m, uint32_t layer, bool ffn, px_dtype dt)
{
    if (layer >= m->n_layers)
        return 0;
    const px_cost_layer *l = &m->layers[layer];
    return ffn ? at_dtype(l->ffn_params, l->ffn_bytes, m->weight_dtype, dt)
               : at_dtype(l->attn_params, l->attn_bytes, m->weight_dtype, dt);
}

double px_cost_edge_bytes(const px_cost_model *m, bool head, px_dtype dt)
{
    const px_cost_layer *l = head ? &m->head : &m->embedding;
    return at_dtype(l->attn_params, l->attn_bytes, m->weight_dtype, dt);
}
