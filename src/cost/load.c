/* What a stage's blocks weigh, read and compute for one step (the
 * stage load the evaluation prices), from the model's layers or from
 * prefix sums over them, which the planner's search builds once per
 * precision and workload. */
#include "base/common.h"

#include "cost/cost_impl.h"

static double kv_scale(const px_cost_model *m, px_dtype kv)
{
    return px__cost_bpe(kv, 4.0) / px__cost_bpe(m->kv_dtype, 4.0);
}

double px__cost_act_scale(const px_cost_model *m, px_dtype act)
{
    return px__cost_bpe(act, 4.0) / px__cost_bpe(m->act_dtype, 4.0);
}

static double moe_read(const px_cost_layer *l, double ffn_at, uint64_t tokens)
{
    if (l->n_experts == 0 || l->expert_bytes <= 0 || l->ffn_bytes <= 0)
        return ffn_at;
    double scale = ffn_at / l->ffn_bytes;
    double experts = l->expert_bytes * l->n_experts * scale;
    double touched = (double)px_ir_moe_experts_touched(l->n_experts, l->n_experts_used, tokens);
    return ffn_at - experts + touched * l->expert_bytes * scale;
}

/* Adds the embedding and head of a stage and sets its output width. */
static void finish_load(const px_cost_model *m, const px_cost_stage *st, px__cost_stage_load *ld)
{
    ld->kv_token *= kv_scale(m, st->prec.kv);
    ld->act_out = st->last >= st->first ? m->layers[st->last].act_bytes_token : 0;
    if (st->embedding) {
        double e = px_cost_edge_bytes(m, false, st->prec.weights);
        ld->w_mem += e;
        if (ld->n_blocks == 0)
            ld->act_out = m->embedding.act_bytes_token;
    }
    if (st->head) {
        double h = px_cost_edge_bytes(m, true, st->prec.weights);
        /* A tied classifier shares the embedding's table when both are here. */
        if (!(m->tied_head && st->embedding))
            ld->w_mem += h;
        ld->w_decode += h;
        ld->w_prefill += h;
        ld->flops_tok += m->head.flops_token;
        ld->flops_seq += m->head.flops_seq;
    }
    if (ld->act_out <= 0)
        ld->act_out = (double)m->dim * px__cost_bpe(m->act_dtype, 4.0);
    ld->act_out *= px__cost_act_scale(m, st->prec.activations);
}

void px__cost_stage_load_of(const px_cost_model *m, const px_cost_stage *st, uint64_t dec_tokens,
                            uint64_t pf_tokens, px__cost_stage_load *ld)
{
    memset(ld, 0, sizeof *ld);
    for (int32_t i = st->first; i <= st->last; i++) {
        const px_cost_layer *l = &m->layers[i];
        double a = px_cost_region_bytes(m, (uint32_t)i, false, st->prec.weights);
        double f = px_cost_region_bytes(m, (uint32_t)i, true, st->prec.ffn_weights);
        ld->w_mem += a + f;
        ld->w_decode += a + moe_read(l, f, dec_tokens);
        ld->w_prefill += a + moe_read(l, f, pf_tokens);
        ld->kv_token += l->kv_bytes_token;
        ld->flops_tok += l->flops_token;
        ld->flops_pair += l->flops_pair;
        ld->flops_seq += l->flops_seq;
        ld->n_blocks++;
    }
    finish_load(m, st, ld);
}

void px__cost_load_from_prefix(const px_cost_prefix *pre, const px_cost_stage *st,
                               px__cost_stage_load *ld)
{
    memset(ld, 0, sizeof *ld);
    if (st->last >= st->first) {
        size_t a = (size_t)st->first, b = (size_t)st->last + 1;
        ld->w_mem = pre->w_mem[b] - pre->w_mem[a];
        ld->w_decode = pre->w_decode[b] - pre->w_decode[a];
        ld->w_prefill = pre->w_prefill[b] - pre->w_prefill[a];
        ld->kv_token = pre->kv_token[b] - pre->kv_token[a];
        ld->flops_tok = pre->flops_tok[b] - pre->flops_tok[a];
        ld->flops_pair = pre->flops_pair[b] - pre->flops_pair[a];
        ld->flops_seq = pre->flops_seq[b] - pre->flops_seq[a];
        ld->n_blocks = (uint32_t)(b - a);
    }
    finish_load(pre->model, st, ld);
}

uint32_t px__cost_micro_batch(const px_cost_workload *wl)
{
    uint32_t mb = PX_MAX(wl->micro_batches, 1u);
    uint32_t batch = PX_MAX(wl->batch, 1u);
    return (batch + mb - 1) / mb;
}

px_status px_cost_prefix_init(px_cost_prefix *pre, const px_cost_model *m,
                              const px_cost_precision *prec, const px_cost_workload *wl,
                              px_err *err)
{
    memset(pre, 0, sizeof *pre);
    size_t n = (size_t)m->n_layers + 1;
    double *all = calloc(7 * n, sizeof *all);
    if (!all)
        return px_err_set(err, PX_ENOMEM, "out of memory building layer sums");
    pre->prec = *prec;
    pre->wl = *wl;
    pre->n_layers = m->n_layers;
    pre->model = m;
    pre->w_mem = all;
    pre->w_decode = all + n;
    pre->w_prefill = all + 2 * n;
    pre->kv_token = all + 3 * n;
    pre->flops_tok = all + 4 * n;
    pre->flops_pair = all + 5 * n;
    pre->flops_seq = all + 6 * n;
    uint64_t b = px__cost_micro_batch(wl);
    double S = m->dit ? m->dit_tokens : 1.0;
    double P = m->dit ? m->dit_tokens : PX_MAX(wl->prompt_tokens, 1u);
    for (uint32_t i = 0; i < m->n_layers; i++) {
        const px_cost_layer *l = &m->layers[i];
        double a = px_cost_region_bytes(m, i, false, prec->weights);
        double f = px_cost_region_bytes(m, i, true, prec->ffn_weights);
        pre->w_mem[i + 1] = pre->w_mem[i] + a + f;
        pre->w_decode[i + 1] = pre->w_decode[i] + a + moe_read(l, f, b * (uint64_t)S);
        pre->w_prefill[i + 1] = pre->w_prefill[i] + a + moe_read(l, f, b * (uint64_t)P);
        pre->kv_token[i + 1] = pre->kv_token[i] + l->kv_bytes_token;
        pre->flops_tok[i + 1] = pre->flops_tok[i] + l->flops_token;
        pre->flops_pair[i + 1] = pre->flops_pair[i] + l->flops_pair;
        pre->flops_seq[i + 1] = pre->flops_seq[i] + l->flops_seq;
    }
    return PX_OK;
}

void px_cost_prefix_release(px_cost_prefix *pre)
{
    if (!pre)
        return;
    free(pre->w_mem);
    memset(pre, 0, sizeof *pre);
}
