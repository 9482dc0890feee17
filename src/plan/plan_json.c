/* The plan document (plexus.plan/1): stages, predictions with intervals,
 * bounds, binding constraints, rejected alternatives with reasons,
 * fallbacks, baselines, the explanation, and its content id. */
#include "base/common.h"

#include "plan/plan_impl.h"

#define SIG 4 /* significant digits of every prediction */

double px__plan_round(double x, int digits)
{
    if (!isfinite(x) || x == 0)
        return isfinite(x) ? 0 : 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%.*g", digits, x);
    return strtod(buf, NULL);
}

static json_t *num(double x)
{
    return json_real(px__plan_round(x, SIG));
}

static json_t *interval(px_cost_interval v)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "p50", num(v.p50)) || px_json_set(o, "p99", num(v.p99)) ||
        px_json_set(o, "lo", num(v.lo)) || px_json_set(o, "hi", num(v.hi))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Shortens every real number of the canonical dump to the fewest digits
 * that keep SIG significant ones, outside strings.  Deterministic. */
char *px__plan_dump_json(const json_t *doc)
{
    char *text = px_json_dump_canonical(doc);
    if (!text)
        return NULL;
    px_strbuf sb = PX_STRBUF_INIT;
    bool in_str = false;
    for (const char *p = text; *p;) {
        char c = *p;
        if (in_str) {
            if (c == '\\' && p[1]) {
                px_strbuf_add(&sb, p, 2);
                p += 2;
                continue;
            }
            if (c == '"')
                in_str = false;
            px_strbuf_addch(&sb, c);
            p++;
            continue;
        }
        if (c == '"') {
            in_str = true;
            px_strbuf_addch(&sb, c);
            p++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            const char *start = p;
            bool real = false;
            while (*p && strchr("+-0123456789.eE", *p)) {
                if (*p == '.' || *p == 'e' || *p == 'E')
                    real = true;
                p++;
            }
            if (!real) {
                px_strbuf_add(&sb, start, (size_t)(p - start));
                continue;
            }
            double v = strtod(start, NULL);
            char buf[48];
            snprintf(buf, sizeof buf, "%.*g", SIG, v);
            if (!strpbrk(buf, ".eE")) /* keep it a JSON real */
                px_strbuf_adds(&sb, buf), px_strbuf_adds(&sb, ".0");
            else
                px_strbuf_adds(&sb, buf);
            continue;
        }
        px_strbuf_addch(&sb, c);
        p++;
    }
    free(text);
    px_strbuf_addch(&sb, '\n');
    return px_strbuf_detach(&sb, NULL);
}

static const char *dtype_or_stored(const px__plan_ctx *ctx, px_dtype dt)
{
    return px_dtype_name(dt < PX_DTYPE_COUNT_ ? dt : ctx->model->weight_dtype);
}

static json_t *precision_json(const px__plan_ctx *ctx, const px_cost_precision *p)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "weights", json_string(dtype_or_stored(ctx, p->weights))) ||
        px_json_set(o, "ffn_weights", json_string(dtype_or_stored(ctx, p->ffn_weights))) ||
        px_json_set(o, "activations", json_string(px_dtype_name(p->activations))) ||
        px_json_set(o, "kv", json_string(px_dtype_name(p->kv)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *device_ids(const px__plan_ctx *ctx, const px_cost_stage *s)
{
    json_t *a = json_array();
    for (uint32_t k = 0; a && k < s->tp; k++)
        if (px_json_push(a, json_string(ctx->fleet->devices[s->devices[k]].id))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *mem_json(const px_cost_mem *m, double capacity)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "weights", num(m->weights)) || px_json_set(o, "kv", num(m->kv)) ||
        px_json_set(o, "activations", num(m->activations)) ||
        px_json_set(o, "workspace", num(m->workspace)) ||
        px_json_set(o, "runtime", num(m->runtime)) || px_json_set(o, "total", num(m->total)) ||
        px_json_set(o, "limit", num(m->limit)) || px_json_set(o, "capacity", num(capacity))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static bool any_accel(const px__plan_ctx *ctx, const px_cost_pipeline *p)
{
    for (uint32_t i = 0; i < p->n_stages; i++)
        if (ctx->fleet->devices[p->stages[i].devices[0]].cls != PX_HW_CLASS_CPU)
            return true;
    return false;
}

/* Hands v over (its new parent takes it, even when it fails to) and
 * forgets it here, so that what was never handed over is freed on a
 * failure and nothing twice. */
static json_t *take(json_t **v)
{
    json_t *t = *v;
    *v = NULL;
    return t;
}

static json_t *stage_json(const px__plan_ctx *ctx, const px_cost_pipeline *p, uint32_t i,
                          const px_cost_estimate *e, const px_cost_uncertain *mc)
{
    const px_cost_stage *s = &p->stages[i];
    const px_cost_stage_est *se = &e->stages[i];
    const px_cost_device *d0 = &ctx->fleet->devices[s->devices[0]];
    bool emulated = false;
    for (uint32_t k = 0; k < s->tp; k++)
        emulated |= ctx->fleet->devices[s->devices[k]].emulated;
    json_t *o = json_object(), *layers = json_object(), *pred = json_object();
    if (!o || !layers || !pred)
        goto fail;
    if (px_json_set(layers, "first", json_integer(s->first)) ||
        px_json_set(layers, "last", json_integer(s->last)))
        goto fail;
    px_cost_interval dec = {se->decode_s, se->decode_s, se->decode_s, se->decode_s};
    px_cost_interval pf = {se->prefill_s, se->prefill_s, se->prefill_s, se->prefill_s};
    if (mc && i < mc->n_stages) {
        dec = mc->decode_s[i];
        pf = mc->prefill_s[i];
    }
    if (px_json_set(pred, "decode_s_per_token", interval(dec)) ||
        px_json_set(pred, "prefill_s", interval(pf)) ||
        px_json_set(pred, "transfer_s_per_token", num(se->xfer_s)) ||
        px_json_set(pred, "attention_s_per_position", num(se->attention_pos_s)) ||
        (se->host_core_s > 0 &&
         px_json_set(pred, "host_core_s_per_micro_batch", num(se->host_core_s))))
        goto fail;
    bool offload = d0->cls == PX_HW_CLASS_CPU && any_accel(ctx, p);
    if (px_json_set(o, "index", json_integer(i)) || px_json_set(o, "devices", device_ids(ctx, s)) ||
        px_json_set(o, "backend", json_string(d0->backend)) ||
        px_json_set(o, "emulated", json_boolean(emulated)) ||
        px_json_set(o, "layers", take(&layers)))
        goto fail;
    if (px_json_set(o, "embedding", json_boolean(s->embedding)) ||
        px_json_set(o, "head", json_boolean(s->head)) ||
        px_json_set(o, "tensor_parallel", json_integer(s->tp)) ||
        px_json_set(o, "precision", precision_json(ctx, &s->prec)) ||
        px_json_set(o, "kv_placement", json_string(px_cost_kv_place_name(s->kv))) ||
        px_json_set(o, "offload", json_boolean(offload)) ||
        px_json_set(o, "compute_dtype", json_string(px_hw_dtype_name(se->compute_dtype))) ||
        px_json_set(o, "compute_dtype_fallback", json_boolean(se->dtype_fallback)) ||
        px_json_set(o, "bound_by", json_string(px_cost_bind_name(se->bind))) ||
        px_json_set(o, "memory_per_device", mem_json(&se->mem, d0->mem_capacity))) {
        goto fail;
    }
    if (se->host_bytes > 0 && px_json_set(o, "host_kv_bytes", num(se->host_bytes)))
        goto fail;
    if (px_json_set(o, "predicted", pred)) {
        pred = NULL;
        goto fail;
    }
    return o;
fail:
    json_decref(o);
    json_decref(layers);
    json_decref(pred);
    return NULL;
}

static json_t *reject_json(const px__plan_reject *x)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "reason", json_string(px__plan_reason_name(x->reason))) ||
        px_json_set(o, "devices", json_string(x->devices)) ||
        px_json_set(o, "message", json_string(x->message)) ||
        (x->cause[0] && px_json_set(o, "cause", json_string(x->cause))) ||
        (x->reason == PX__REJ_DOMINATED && px_json_set(o, "margin", num(x->margin))) ||
        (x->has_figures && (px_json_set(o, "tpot_s", num(x->tpot_s)) ||
                            px_json_set(o, "throughput", num(x->throughput))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int reason_rank(px__plan_reason r)
{
    switch (r) {
    case PX__REJ_DOMINATED:
        return 0;
    case PX__REJ_SLO:
        return 1;
    case PX__REJ_CONTRACT:
        return 2;
    case PX__REJ_MEMORY:
        return 3;
    default:
        return 4;
    }
}

/* Index of the next entry of this rank not yet picked: dominated ones by
 * margin, the rest in order of discovery.  -1 when none is left. */
static ssize_t next_of_rank(const px__plan_ctx *ctx, const bool *picked, int rank)
{
    ssize_t pick = -1;
    for (size_t i = 0; i < ctx->n_rej; i++) {
        if (picked[i] || reason_rank(ctx->rej[i].reason) != rank)
            continue;
        if (pick < 0 || (rank == 0 && ctx->rej[i].margin < ctx->rej[pick].margin))
            pick = (ssize_t)i;
    }
    return pick;
}

static json_t *rejected_json(px__plan_ctx *ctx)
{
    size_t max = ctx->req->max_rejected ? ctx->req->max_rejected : 12;
    bool *picked = calloc(ctx->n_rej ? ctx->n_rej : 1, sizeof *picked);
    json_t *arr = json_array();
    if (!picked || !arr) {
        free(picked);
        json_decref(arr);
        return NULL;
    }
    /* First up to two of every reason, so no kind of rejection is hidden
     * behind many close alternatives; then fill by rank. */
    size_t taken = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int rank = 0; rank <= 4 && taken < max; rank++)
            for (size_t k = 0; (pass || k < 2) && taken < max; k++) {
                ssize_t i = next_of_rank(ctx, picked, rank);
                if (i < 0)
                    break;
                picked[i] = true;
                taken++;
            }
    /* Emit by rank, dominated ones closest first. */
    for (int rank = 0; rank <= 4; rank++) {
        bool *left = calloc(ctx->n_rej ? ctx->n_rej : 1, sizeof *left);
        if (!left)
            break;
        for (size_t i = 0; i < ctx->n_rej; i++)
            left[i] = !picked[i];
        ssize_t i;
        while ((i = next_of_rank(ctx, left, rank)) >= 0) {
            left[i] = true;
            if (px_json_push(arr, reject_json(&ctx->rej[i])))
                break;
        }
        free(left);
    }
    free(picked);
    return arr;
}

/* ------------------------------------------------------------------ */
/* Explanation, bounds, binding constraints                            */
/* ------------------------------------------------------------------ */

static json_t *binding_json(px__plan_ctx *ctx, const px__plan_result *r)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    const px_cost_pipeline *p = &r->layout.replicas[0];
    const px_cost_estimate *e = &r->est[0];
    for (uint32_t i = 0; i < p->n_stages; i++) {
        const px_cost_mem *m = &e->stages[i].mem;
        if (m->limit > 0 && m->total >= 0.9 * m->limit) {
            json_t *o = json_pack("{s:s, s:s, s:o, s:o}", "kind", "memory", "device",
                                  ctx->fleet->devices[p->stages[i].devices[0]].id, "used",
                                  num(m->total), "limit", num(m->limit));
            if (px_json_push(arr, o))
                goto fail;
        }
    }
    uint32_t s = e->bind_stage < p->n_stages ? e->bind_stage : 0;
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:o}", "kind", "decode-term", "term",
                          px_cost_bind_name(e->bind), "stage", (json_int_t)s, "device",
                          ctx->fleet->devices[p->stages[s].devices[0]].id, "seconds",
                          num(e->stages[s].decode_s));
    if (px_json_push(arr, o))
        goto fail;
    /* Host cores: the replicas' stages on one host's cores (cpu and
     * emulated devices, the executor) ask for most of them. */
    for (uint32_t i = 0; i < r->layout.n_replicas; i++) {
        const px_cost_estimate *ei = &r->est[i];
        if (ei->host_node == PX_HW_NONE || ei->host_cores_s < 0.8 * ei->step_s)
            continue;
        const px_hw_view *v = px_hw_graph_view(ctx->fleet->graph);
        if (px_json_push(arr,
                         json_pack("{s:s, s:s, s:i, s:o, s:o, s:o}", "kind", "host-cores", "node",
                                   v->nodes[ei->host_node].id, "replica", (json_int_t)i, "cores",
                                   num(v->nodes[ei->host_node].cpu_cores.value), "floor_s",
                                   num(ei->host_cores_s), "step_s", num(ei->step_s))))
            goto fail;
        break;
    }
    const px_plan_slo *slo = &ctx->req->slo;
    if (slo->tpot_s > 0 && r->tpot_p99 >= 0.8 * slo->tpot_s &&
        px_json_push(arr, json_pack("{s:s, s:o, s:o}", "kind", "slo-tpot", "p99", num(r->tpot_p99),
                                    "limit", num(slo->tpot_s))))
        goto fail;
    if (slo->ttft_s > 0 && r->ttft_p99 >= 0.8 * slo->ttft_s &&
        px_json_push(arr, json_pack("{s:s, s:o, s:o}", "kind", "slo-ttft", "p99", num(r->ttft_p99),
                                    "limit", num(slo->ttft_s))))
        goto fail;
    if (slo->budget_usd_h > 0 && r->usd_per_hour >= 0.8 * slo->budget_usd_h &&
        px_json_push(arr, json_pack("{s:s, s:o, s:o}", "kind", "budget", "usd_per_hour",
                                    num(r->usd_per_hour), "limit", num(slo->budget_usd_h))))
        goto fail;
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* The document                                                        */
/* ------------------------------------------------------------------ */

static json_t *model_json(const px__plan_ctx *ctx)
{
    const px_cost_model *m = ctx->model;
    const char *src = "preset";
    if (m->ir)
        src = px_ir_model_source(m->ir) == PX_IR_SOURCE_GGUF      ? "gguf"
              : px_ir_model_source(m->ir) == PX_IR_SOURCE_LLAMA2C ? "llama2c"
                                                                  : "preset";
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:s}", "name", m->name, "id", m->id,
                     "arch", px_ir_arch_name(m->arch), "source", src, "blocks",
                     (json_int_t)m->n_layers, "parameters", num(m->total_params), "weight_bytes",
                     num(m->total_bytes), "weight_dtype", px_dtype_name(m->weight_dtype));
}

static json_t *predictions_json(const px__plan_ctx *ctx, const px__plan_result *r)
{
    px_cost_interval tpot = r->mc.tpot_s, ttft = r->mc.ttft_s, thr = r->mc.throughput;
    tpot.p50 = r->tpot_p50;
    tpot.p99 = r->tpot_p99;
    ttft.p50 = r->ttft_p50;
    ttft.p99 = r->ttft_p99;
    double jpt = r->throughput > 0 ? r->power_w / r->throughput : 0;
    double tpd = r->usd_per_hour > 0 ? 3600.0 * r->throughput / r->usd_per_hour : 0;
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "tpot_s", interval(tpot)) || px_json_set(o, "ttft_s", interval(ttft)) ||
        px_json_set(o, "throughput_tokens_per_s", interval(thr)) ||
        px_json_set(o, "decode_only_tpot_s", num(r->est[0].decode_step_s)) ||
        px_json_set(o, "energy_joules_per_token", interval(r->mc.joules_per_token)) ||
        px_json_set(o, "joules_per_token", num(jpt)) ||
        px_json_set(o, "power_w", num(r->power_w)) ||
        px_json_set(o, "usd_per_hour", num(r->usd_per_hour)) ||
        px_json_set(o, "usd_per_million_tokens",
                    num(r->throughput > 0 ? r->usd_per_hour / 3600.0 / r->throughput * 1e6 : 0)) ||
        px_json_set(o, "tokens_per_dollar", num(tpd)) ||
        px_json_set(o, "failure_probability", num(r->p_fail)) ||
        px_json_set(o, "failure_window_s", num(ctx->cp->reliability_window_s)) ||
        px_json_set(o, "p_meet_slo", num(r->mc.p_meet_slo)) ||
        px_json_set(o, "samples", json_integer(r->mc.n_samples))) {
        json_decref(o);
        return NULL;
    }
    if (ctx->model->dit &&
        (px_json_set(o, "unit",
                     json_string("DiT: tpot is one denoising step of the batch, ttft "
                                 "one whole sample, throughput samples per second")))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *bound_json(const px__plan_result *r)
{
    double frac = r->tpot_p50 > 0 ? r->bound.tpot_s / r->tpot_p50 : 0;
    double placed = r->tpot_p50 > 0 ? r->placed_bound_s / r->tpot_p50 : 0;
    double tfrac = r->bound.throughput > 0 ? r->throughput / r->bound.throughput : 0;
    return json_pack(
        "{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s}", "tpot_s", num(r->bound.tpot_s),
        "tpot_memory_s", num(r->bound.tpot_mem_s), "tpot_compute_s", num(r->bound.tpot_compute_s),
        "throughput_tokens_per_s", num(r->bound.throughput), "throughput_fraction", num(tfrac),
        "fraction", num(frac), "placed_tpot_s", num(r->placed_bound_s), "placed_fraction",
        num(placed), "note",
        "fleet bound: the bytes a step reads over the attainable bandwidth of the memories that "
        "can hold them (device memory first, host memory over host links past its capacity, "
        "every device reading at once) and 2 x active parameters x batch over the aggregate "
        "peak; throughput bound: the same at the largest batch the fleet's memory holds, each "
        "request's prefill FLOPs spread over the tokens it generates; placed "
        "bound: the same stages and hops at the best efficiencies");
}

/* Appends a fallback o (taken; NULL is out of memory) to arr, with the
 * answer's figures when it is feasible. */
static px_status push_answer(json_t *arr, json_t *o, bool feasible, double tpot_s,
                             double throughput, uint32_t n_replicas, const char *devices)
{
    if (!o)
        return PX_ENOMEM;
    if (feasible &&
        (px_json_set(o, "tpot_s", num(tpot_s)) || px_json_set(o, "throughput", num(throughput)) ||
         px_json_set(o, "replicas", json_integer(n_replicas)) ||
         (devices[0] && px_json_set(o, "devices", json_string(devices))))) {
        json_decref(o);
        return PX_ENOMEM;
    }
    return px_json_push(arr, o);
}

static json_t *fallbacks_json(const px__plan_ctx *ctx, const px__plan_result *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < r->n_fb; i++) {
        const px__plan_fallback *f = &r->fb[i];
        json_t *o = json_pack("{s:s, s:b, s:s}", "lost", ctx->fleet->devices[f->lost].id,
                              "feasible", f->feasible, "note", f->note);
        if (push_answer(arr, o, f->feasible, f->tpot_s, f->throughput, f->n_replicas, f->devices) !=
            PX_OK)
            goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

static json_t *link_fallbacks_json(const px__plan_ctx *ctx, const px__plan_result *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < r->n_lfb; i++) {
        const px__plan_link_fallback *f = &r->lfb[i];
        char link[160];
        snprintf(link, sizeof link, "%s>%s", ctx->fleet->devices[f->from].id,
                 ctx->fleet->devices[f->to].id);
        json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:s, s:s, s:b, s:s, s:{s:o, s:o}}", "link",
                              link, "kind", f->allreduce ? "allreduce" : "pipeline", "replica",
                              (json_int_t)f->replica, "stage", (json_int_t)f->stage, "via", f->via,
                              "action", px__plan_link_action_name(f->action), "feasible",
                              f->feasible, "note", f->note, "degraded", "tpot_s",
                              num(f->degraded_tpot_s), "throughput", num(f->degraded_throughput));
        if (push_answer(arr, o, f->feasible, f->tpot_s, f->throughput, f->n_replicas, f->devices) !=
            PX_OK)
            goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

static json_t *baselines_json(const px__plan_result *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < r->n_bl; i++) {
        const px__plan_baseline *b = &r->bl[i];
        json_t *o = json_pack("{s:s, s:b, s:b}", "policy", b->name, "feasible", b->feasible,
                              "contract_ok", b->contract_ok);
        if (!o)
            goto fail;
        if (b->why[0] && px_json_set(o, "note", json_string(b->why))) {
            json_decref(o);
            goto fail;
        }
        if (b->feasible &&
            (px_json_set(o, "devices", json_string(b->devices)) ||
             px_json_set(o, "replicas", json_integer(b->n_replicas)) ||
             px_json_set(o, "stages", json_integer(b->n_stages)) ||
             px_json_set(o, "batch", json_integer(b->batch)) ||
             px_json_set(o, "tpot_s", num(b->tpot_s)) || px_json_set(o, "ttft_s", num(b->ttft_s)) ||
             px_json_set(o, "throughput", num(b->throughput)) ||
             px_json_set(o, "usd_per_hour", num(b->usd_per_hour)) ||
             px_json_set(o, "plexus_speedup_tpot", num(b->tpot_s / r->est[0].tpot_s)) ||
             px_json_set(o, "plexus_speedup_throughput", num(r->throughput / b->throughput)))) {
            json_decref(o);
            goto fail;
        }
        if (px_json_push(arr, o))
            goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

static json_t *replicas_json(const px__plan_ctx *ctx, const px__plan_result *r)
{
    json_t *arr = json_array();
    for (uint32_t i = 0; arr && i < r->layout.n_replicas; i++) {
        const px_cost_pipeline *p = &r->layout.replicas[i];
        json_t *stages = json_array();
        for (uint32_t s = 0; stages && s < p->n_stages; s++) {
            const px_cost_device *d0 = &ctx->fleet->devices[p->stages[s].devices[0]];
            /* What the healing loop of this replica expects of a stage as
             * its sequences lengthen. */
            const px_cost_stage_est *se = &r->est[i].stages[s];
            json_t *st = json_pack(
                "{s:i, s:o, s:{s:i, s:i}, s:i, s:o, s:{s:o, s:o, s:o}}", "index", (json_int_t)s,
                "devices", device_ids(ctx, &p->stages[s]), "layers", "first",
                (json_int_t)p->stages[s].first, "last", (json_int_t)p->stages[s].last,
                "tensor_parallel", (json_int_t)p->stages[s].tp, "memory_per_device",
                mem_json(&se->mem, d0->mem_capacity), "predicted", "attention_s_per_position",
                num(se->attention_pos_s), "served_step_s", num(se->serve_s), "transfer_s",
                num(se->xfer_s));
            if (px_json_push(stages, st)) {
                json_decref(stages);
                stages = NULL;
            }
        }
        const px_cost_workload *w = &r->layout.wls[i];
        const px_cost_estimate *e = &r->est[i];
        json_t *o = json_pack("{s:i, s:o, s:i, s:i, s:o, s:o, s:{s:o, s:o, s:o, s:o}}", "index",
                              (json_int_t)i, "stages", stages, "batch", (json_int_t)w->batch,
                              "micro_batches", (json_int_t)PX_MAX(w->micro_batches, 1u), "tpot_s",
                              num(e->tpot_s), "throughput", num(e->throughput), "predicted",
                              "step_s", num(e->step_s), "executor_s_per_micro_batch",
                              num(e->executor_s), "return_s_per_micro_batch", num(e->return_s),
                              "host_cores_s", num(e->host_cores_s));
        if (px_json_push(arr, o)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

json_t *px__plan_document(px__plan_ctx *ctx, px__plan_result *r)
{
    px__plan_add_dominated(ctx, r);
    json_t *doc = json_object();
    if (!doc)
        return NULL;
    const px_hw_view *v = px_hw_graph_view(ctx->fleet->graph);
    const px_cost_pipeline *p0 = &r->layout.replicas[0];
    json_t *stages = json_array();
    for (uint32_t i = 0; stages && i < p0->n_stages; i++)
        if (px_json_push(stages, stage_json(ctx, p0, i, &r->est[0], &r->mc))) {
            json_decref(stages);
            stages = NULL;
        }
    json_t *prec_labels = json_array();
    for (uint32_t i = 0; prec_labels && i < ctx->n_prec; i++)
        px_json_push(prec_labels, json_string(ctx->prec[i].label));
    json_t *objective = json_pack("{s:s}", "name", px_plan_objective_name(ctx->req->objective));
    if (objective && ctx->req->slo.tpot_s > 0)
        px_json_set(objective, "slo_tpot_s", num(ctx->req->slo.tpot_s));
    if (objective && ctx->req->slo.ttft_s > 0)
        px_json_set(objective, "slo_ttft_s", num(ctx->req->slo.ttft_s));
    if (objective && ctx->req->slo.budget_usd_h > 0)
        px_json_set(objective, "budget_usd_per_hour", num(ctx->req->slo.budget_usd_h));
    const px_cost_workload *wl = &r->layout.wl;
    json_int_t in_flight = 0;
    bool uniform = true;
    for (uint32_t i = 0; i < r->layout.n_replicas; i++) {
        in_flight += r->layout.wls[i].batch;
        uniform &= r->layout.wls[i].batch == wl->batch &&
                   r->layout.wls[i].micro_batches == wl->micro_batches;
    }
    json_t *cc = r->contract;
    r->contract = NULL;
    if (px_json_set(doc, "schema", json_string(PX_PLAN_SCHEMA)) ||
        px_json_set(doc, "policy", json_string(r->policy)) ||
        px_json_set(doc, "emulated", json_boolean(px__plan_layout_emulated(ctx, &r->layout))) ||
        px_json_set(doc, "model", model_json(ctx)) ||
        px_json_set(doc, "inventory",
                    json_pack("{s:s, s:s, s:i, s:b}", "name", v->name ? v->name : "", "digest",
                              ctx->fleet->digest, "devices", (json_int_t)ctx->fleet->n_devices,
                              "emulated", ctx->fleet->emulated)) ||
        px_json_set(doc, "contract", take(&cc)) ||
        px_json_set(doc, "objective", take(&objective)) ||
        px_json_set(doc, "workload",
                    json_pack("{s:i, s:i, s:i, s:i, s:i, s:f}", "batch", (json_int_t)wl->batch,
                              "micro_batches", (json_int_t)PX_MAX(wl->micro_batches, 1u), "context",
                              (json_int_t)wl->context, "prompt_tokens",
                              (json_int_t)wl->prompt_tokens, "gen_tokens",
                              (json_int_t)wl->gen_tokens, "attended_positions",
                              px_cost_attended(wl))) ||
        px_json_set(doc, "batching",
                    json_pack("{s:i, s:i, s:i, s:i, s:b}", "batch_per_replica",
                              (json_int_t)wl->batch, "micro_batches",
                              (json_int_t)PX_MAX(wl->micro_batches, 1u), "replicas",
                              (json_int_t)r->layout.n_replicas, "sequences_in_flight",
                              (json_int_t)in_flight, "uniform", uniform)) ||
        px_json_set(doc, "precision", precision_json(ctx, &ctx->prec[r->layout.prec_index].prec)) ||
        px_json_set(doc, "stages", take(&stages)) ||
        px_json_set(doc, "replicas", replicas_json(ctx, r)) ||
        px_json_set(doc, "predictions", predictions_json(ctx, r)) ||
        px_json_set(doc, "lower_bound", bound_json(r)) ||
        px_json_set(doc, "binding", binding_json(ctx, r)) ||
        px_json_set(doc, "assumptions",
                    px_cost_assumptions_json(ctx->fleet, ctx->model, ctx->cp)) ||
        px_json_set(doc, "explanation", px__plan_explanation(ctx, r)) ||
        px_json_set(doc, "rejected", rejected_json(ctx)) ||
        px_json_set(doc, "fallbacks", fallbacks_json(ctx, r)) ||
        px_json_set(doc, "link_fallbacks", link_fallbacks_json(ctx, r)) ||
        px_json_set(doc, "search",
                    json_pack("{s:i, s:o}", "candidates_evaluated", (json_int_t)ctx->n_evaluated,
                              "precision_options", take(&prec_labels)))) {
        json_decref(cc);
        json_decref(objective);
        json_decref(stages);
        json_decref(prec_labels);
        json_decref(doc);
        return NULL;
    }
    if (px__plan_layout_emulated(ctx, &r->layout) &&
        px_json_set(doc, "notice",
                    json_string("plan for emulated or simulated devices: no claim "
                                "about real hardware"))) {
        json_decref(doc);
        return NULL;
    }
    json_t *assumptions = json_object_get(doc, "assumptions");
    json_t *extra =
        json_pack("{s:s, s:s, s:s}", "name", "kernel determinism", "value", "deterministic",
                  "source", "assumed: the plexus backends run fixed-order kernels");
    if (!assumptions || px_json_push(assumptions, extra)) {
        json_decref(doc);
        return NULL;
    }
    if (r->n_bl && px_json_set(doc, "baselines", baselines_json(r))) {
        json_decref(doc);
        return NULL;
    }
    /* The id: SHA-256 of the canonical text without the id. */
    char *text = px__plan_dump_json(doc);
    if (!text) {
        json_decref(doc);
        return NULL;
    }
    px_digest d;
    char hex[65];
    px_sha256(text, strlen(text), &d);
    px_digest_hex(&d, hex);
    free(text);
    if (px_json_set(doc, "id", json_string(hex))) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}
