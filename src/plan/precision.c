/* Precision per region under the contract: which lowered precisions the
 * contract allows (and on which regions), and the full verdict of a plan. */
#include "base/common.h"

#include "plan/plan_impl.h"

/* Region kinds a precision step touches. */
enum {
    R_EMBED = 1 << 0,
    R_ATTN = 1 << 1,
    R_FFN = 1 << 2,
    R_HEAD = 1 << 3,
    R_ALL = R_EMBED | R_ATTN | R_FFN | R_HEAD,
};

static unsigned kind_bit(px_ir_region_kind k)
{
    switch (k) {
    case PX_IR_REGION_EMBEDDING:
        return R_EMBED;
    case PX_IR_REGION_ATTENTION:
        return R_ATTN;
    case PX_IR_REGION_FFN:
        return R_FFN;
    default:
        return R_HEAD;
    }
}

/* Region names of the given kinds (borrowed from the IR), malloc'd array. */
static const char **region_names(const px_cost_model *m, unsigned kinds, size_t *n)
{
    *n = 0;
    if (!m->ir)
        return NULL;
    size_t total = px_ir_model_n_regions(m->ir);
    const char **names = malloc((total ? total : 1) * sizeof *names);
    if (!names)
        return NULL;
    for (size_t i = 0; i < total; i++) {
        const px_ir_region *r = px_ir_model_region(m->ir, i);
        if (kind_bit(r->kind) & kinds)
            names[(*n)++] = r->name;
    }
    return names;
}

static const char *kinds_text(unsigned kinds)
{
    switch (kinds) {
    case R_ALL:
        return "every region";
    case R_ATTN:
        return "layer.*.attention";
    case R_FFN:
        return "layer.*.ffn";
    case R_ATTN | R_EMBED | R_HEAD:
        return "embedding, layer.*.attention, head";
    default:
        return "some regions";
    }
}

/* Judges one transformation on every region of the kinds.  Returns the
 * verdict (FORBIDDEN when evaluation fails) and fills msg when forbidden. */
static px_verdict judge(px__plan_ctx *ctx, const px_transform *t, unsigned kinds, char *msg,
                        size_t n, json_t **decision_json)
{
    size_t n_names;
    const char **names = region_names(ctx->model, kinds, &n_names);
    px_verdict v = PX_VERDICT_FORBIDDEN;
    if (!names || n_names == 0) {
        free(names);
        snprintf(msg, n, "the model lists no %s regions", kinds_text(kinds));
        return PX_VERDICT_ALLOWED;
    }
    px_contract_decision d;
    px_err err;
    if (px_contract_evaluate_all(ctx->contract, names, n_names, t, 1, NULL, 0, &d, &err) != PX_OK) {
        px_textf(msg, n, "%s", err.msg);
        free(names);
        return v;
    }
    v = d.verdict;
    px_strlcpy(msg, d.message, n);
    if (decision_json)
        *decision_json = px_contract_decision_to_json(&d);
    px_contract_decision_release(&d);
    free(names);
    return v;
}

typedef struct step {
    const char *label;
    unsigned tensors, kinds;
    px_dtype to;
} step;

static bool lowers(px_dtype from, px_dtype to)
{
    return px_dtype_bytes_per_elem(to) < px_dtype_bytes_per_elem(from);
}

/* Whether some usable device multiplies 16-bit operands of this dtype
 * markedly faster than f32 (tensor cores, matrix engines). */
static bool fleet_computes_faster_in(const px__plan_ctx *ctx, px_dtype dt)
{
    px_hw_dtype hw = dt == PX_DTYPE_F16 ? PX_HW_DTYPE_F16 : PX_HW_DTYPE_BF16;
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++) {
        const px_cost_device *d = &ctx->fleet->devices[i];
        if (ctx->usable[i] && d->peak[hw] > 1.5 * d->peak[PX_HW_DTYPE_F32])
            return true;
    }
    return false;
}

/* Without a contract: the stored precision, and where the weights are
 * 16-bit and some device computes faster in that dtype than in f32, the
 * option to feed the products in the weights' dtype (f32 accumulation) as
 * such devices do, when the implied contract allows it.  The search costs
 * both and keeps the better; the plan's precision says which. */
static px_status compute_precision(px__plan_ctx *ctx, const px_cost_precision *stored)
{
    const px_cost_model *m = ctx->model;
    px_dtype wdt = m->weight_dtype;
    if ((wdt != PX_DTYPE_BF16 && wdt != PX_DTYPE_F16) || !lowers(stored->activations, wdt) ||
        !fleet_computes_faster_in(ctx, wdt) || ctx->n_prec >= PX__PLAN_MAX_PREC)
        return PX_OK;
    px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                      .tensors = PX_TENSORS_ACTIVATIONS,
                      .from_dtype = px_dtype_name(stored->activations),
                      .to_dtype = px_dtype_name(wdt)};
    char msg[320];
    px_verdict v = judge(ctx, &t, R_ALL, msg, sizeof msg, NULL);
    if (v == PX_VERDICT_FORBIDDEN) {
        px__plan_reject_add(ctx, PX__REJ_CONTRACT, px_hash64("compute-16", 10), "", NULL,
                            "%s compute on every region: %s", px_dtype_name(wdt), msg);
        snprintf(ctx->precision_note, sizeof ctx->precision_note,
                 "products are costed at %s rates: the implied contract (stored precision, "
                 "deterministic) forbids feeding them in %s, the dtype these devices compute "
                 "fastest in; a contract that allows it (--contract relaxed) costs them at the "
                 "%s rate",
                 px_dtype_name(stored->activations), px_dtype_name(wdt), px_dtype_name(wdt));
        return PX_OK;
    }
    snprintf(ctx->precision_note, sizeof ctx->precision_note,
             "products may be fed in %s, the dtype these devices compute fastest in: the implied "
             "contract allows it; the plan's precision says whether the search chose it",
             px_dtype_name(wdt));
    px__plan_prec *o = &ctx->prec[ctx->n_prec++];
    o->prec = *stored;
    o->prec.activations = wdt;
    o->verdict = v;
    snprintf(o->label, sizeof o->label,
             "%s compute (the devices' %s rate; stored weights, %s activations)",
             px_dtype_name(wdt), px_dtype_name(wdt), px_dtype_name(wdt));
    return PX_OK;
}

px_status px__plan_precisions(px__plan_ctx *ctx, px_err *err)
{
    (void)err;
    const px_cost_model *m = ctx->model;
    px_cost_precision cur = {.weights = PX_DTYPE_COUNT_,
                             .ffn_weights = PX_DTYPE_COUNT_,
                             .activations = m->act_dtype,
                             .kv = m->kv_dtype};
    ctx->n_prec = 0;
    ctx->prec[ctx->n_prec++] =
        (px__plan_prec){.prec = cur, .label = "stored", .verdict = PX_VERDICT_ALLOWED};
    if (ctx->implied_contract)
        return compute_precision(ctx, &cur);
    const step steps[] = {
        {"bf16 activations", PX_TENSORS_ACTIVATIONS, R_ALL, PX_DTYPE_BF16},
        {"f16 KV cache", PX_TENSORS_KV, R_ATTN, PX_DTYPE_F16},
        {"fp8 FFN weights", PX_TENSORS_WEIGHTS, R_FFN, PX_DTYPE_FP8_E4M3},
        {"fp8 attention weights", PX_TENSORS_WEIGHTS, R_ATTN | R_EMBED | R_HEAD, PX_DTYPE_FP8_E4M3},
        {"fp8 KV cache", PX_TENSORS_KV, R_ATTN, PX_DTYPE_FP8_E4M3},
    };
    px_verdict worst = PX_VERDICT_ALLOWED;
    char label[128] = "";
    for (size_t i = 0; i < PX_ARRAY_LEN(steps); i++) {
        const step *s = &steps[i];
        px_dtype from;
        if (s->tensors == PX_TENSORS_ACTIVATIONS)
            from = cur.activations;
        else if (s->tensors == PX_TENSORS_KV)
            from = cur.kv;
        else if (s->kinds == R_FFN)
            from = cur.ffn_weights < PX_DTYPE_COUNT_ ? cur.ffn_weights : m->weight_dtype;
        else
            from = cur.weights < PX_DTYPE_COUNT_ ? cur.weights : m->weight_dtype;
        if (m->dit && s->tensors == PX_TENSORS_KV)
            continue;
        if (!lowers(from, s->to))
            continue;
        px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                          .tensors = s->tensors,
                          .from_dtype = px_dtype_name(from),
                          .to_dtype = px_dtype_name(s->to)};
        char msg[320];
        px_verdict v = judge(ctx, &t, s->kinds, msg, sizeof msg, NULL);
        if (v == PX_VERDICT_FORBIDDEN) {
            px__plan_reject_add(ctx, PX__REJ_CONTRACT, px_hash64(s->label, strlen(s->label)), "",
                                NULL, "%s on %s: %s", s->label, kinds_text(s->kinds), msg);
            continue;
        }
        if (v > worst)
            worst = v;
        if (s->tensors == PX_TENSORS_ACTIVATIONS)
            cur.activations = s->to;
        else if (s->tensors == PX_TENSORS_KV)
            cur.kv = s->to;
        else if (s->kinds == R_FFN)
            cur.ffn_weights = s->to;
        else
            cur.weights = s->to;
        snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", label[0] ? ", " : "",
                 s->label);
        /* Keep the lossless-leaning state (16-bit activations and KV) as an
         * option of its own, and the most aggressive one at the end. */
        if (i == 1 || i + 1 == PX_ARRAY_LEN(steps)) {
            px__plan_prec *last = &ctx->prec[ctx->n_prec - 1];
            if (memcmp(&last->prec, &cur, sizeof cur) && ctx->n_prec < PX__PLAN_MAX_PREC) {
                px__plan_prec *o = &ctx->prec[ctx->n_prec++];
                o->prec = cur;
                o->verdict = worst;
                px_strlcpy(o->label, label, sizeof o->label);
            }
        }
    }
    px__plan_prec *last = &ctx->prec[ctx->n_prec - 1];
    if (memcmp(&last->prec, &cur, sizeof cur) && ctx->n_prec < PX__PLAN_MAX_PREC) {
        px__plan_prec *o = &ctx->prec[ctx->n_prec++];
        o->prec = cur;
        o->verdict = worst;
        px_strlcpy(o->label, label, sizeof o->label);
    }
    return PX_OK;
}

static px_status add_decision(json_t *arr, const char *what, const char *regions, json_t *decision,
                              px_verdict *worst, px_verdict v)
{
    json_t *o = json_object();
    if (!o || !decision) {
        json_decref(o);
        json_decref(decision);
        return PX_ENOMEM;
    }
    if (px_json_set(o, "transformation", json_string(what)) ||
        px_json_set(o, "regions", json_string(regions)) || px_json_set(o, "decision", decision)) {
        json_decref(o);
        return PX_ENOMEM;
    }
    if (v > *worst)
        *worst = v;
    return px_json_push(arr, o);
}

static px_status judge_precision(px__plan_ctx *ctx, json_t *arr, px_verdict *worst,
                                 const char *what, unsigned tensors, unsigned kinds, px_dtype from,
                                 px_dtype to)
{
    if (to >= PX_DTYPE_COUNT_ || from == to)
        return PX_OK;
    px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                      .tensors = tensors,
                      .from_dtype = px_dtype_name(from),
                      .to_dtype = px_dtype_name(to)};
    char msg[320];
    json_t *dj = NULL;
    px_verdict v = judge(ctx, &t, kinds, msg, sizeof msg, &dj);
    if (!dj)
        return PX_OK;
    return add_decision(arr, what, kinds_text(kinds), dj, worst, v);
}

json_t *px__plan_contract_json(px__plan_ctx *ctx, const px__plan_layout *l, px_verdict *verdict)
{
    json_t *o = json_object();
    json_t *arr = json_array();
    px_verdict worst = PX_VERDICT_ALLOWED;
    char digest[65] = "";
    if (!o || !arr)
        goto fail;
    const px_cost_model *m = ctx->model;
    const px_cost_precision *pr = &ctx->prec[l->prec_index].prec;
    if (judge_precision(ctx, arr, &worst, "activations", PX_TENSORS_ACTIVATIONS, R_ALL,
                        m->act_dtype, pr->activations) ||
        judge_precision(ctx, arr, &worst, "kv-cache", PX_TENSORS_KV, R_ATTN, m->kv_dtype, pr->kv) ||
        judge_precision(ctx, arr, &worst, "ffn-weights", PX_TENSORS_WEIGHTS, R_FFN, m->weight_dtype,
                        pr->ffn_weights) ||
        judge_precision(ctx, arr, &worst, "weights", PX_TENSORS_WEIGHTS, R_ATTN | R_EMBED | R_HEAD,
                        m->weight_dtype, pr->weights))
        goto fail;
    /* Cuts and splits of every replica. */
    for (uint32_t r = 0; r < l->n_replicas; r++) {
        char msg[320];
        px_verdict v = px__plan_check_structure(ctx, &l->replicas[r], msg, sizeof msg);
        if (v > worst)
            worst = v;
    }
    bool has_cut = false, has_split = false, host_kv = false;
    for (uint32_t r = 0; r < l->n_replicas; r++)
        for (uint32_t i = 0; i < l->replicas[r].n_stages; i++) {
            has_cut |= i > 0;
            has_split |= l->replicas[r].stages[i].tp > 1;
            host_kv |= l->replicas[r].stages[i].kv == PX_COST_KV_HOST;
        }
    if (px_json_set(o, "pipeline_cuts", json_boolean(has_cut)) ||
        px_json_set(o, "tensor_parallel", json_boolean(has_split)) ||
        px_json_set(o, "kv_offload", json_boolean(host_kv)))
        goto fail;
    if (ctx->implied_contract) {
        bool computes16 = pr->activations != m->act_dtype;
        if (px_json_set(o, "name", json_string("implied")) ||
            px_json_set(o, "note",
                        json_string(computes16
                                        ? "no contract given: stored weights and KV cache, "
                                          "products fed in the weights' 16-bit dtype as the "
                                          "devices compute (the implied deterministic contract "
                                          "allows it), deterministic runs"
                                        : "no contract given: stored precision everywhere, "
                                          "deterministic runs")))
            goto fail;
    } else {
        const char *name = px_contract_name(ctx->contract);
        if (px_json_set(o, "name", json_string(name ? name : "unnamed")))
            goto fail;
    }
    if (px_contract_digest(ctx->contract, digest) != PX_OK ||
        px_json_set(o, "digest", json_string(digest)) ||
        px_json_set(o, "verdict", json_string(px_verdict_name(worst))))
        goto fail;
    if (px_json_set(o, "decisions", arr))
        goto fail_obj;
    if (verdict)
        *verdict = worst;
    return o;
fail:
    json_decref(arr);
fail_obj:
    json_decref(o);
    return NULL;
}
