/* Explanations: why an alternative lost (the term that made the
 * difference), the dominated alternatives of the pool, and the sentences of
 * a plan's explanation. */
#include "base/common.h"

#include "plan/plan_impl.h"

/* ------------------------------------------------------------------ */
/* Why an alternative lost                                             */
/* ------------------------------------------------------------------ */

static double sum_compute(const px_cost_estimate *e)
{
    double s = 0;
    for (uint32_t i = 0; i < e->n_stages; i++)
        s += e->stages[i].decode_s - e->stages[i].allreduce_s - e->stages[i].kv_host_s;
    return s;
}

static double sum_field(const px_cost_estimate *e, size_t off)
{
    double s = 0;
    for (uint32_t i = 0; i < e->n_stages; i++)
        s += *(const double *)((const char *)&e->stages[i] + off);
    return s;
}

static void cause_of(px__plan_ctx *ctx, const px_cost_pipeline *wp, const px_cost_estimate *w,
                     const px_cost_pipeline *lp, const px_cost_estimate *l, char *buf, size_t n)
{
    char a[32], b[32];
    px_plan_objective obj = ctx->req->objective;
    if (obj == PX_PLAN_OBJ_TOKENS_PER_DOLLAR && l->usd_per_hour > 0 && w->usd_per_hour > 0) {
        snprintf(buf, n, "it costs %.3g $/h for %.3g tokens/s, against %.3g $/h for %.3g tokens/s",
                 l->usd_per_hour, l->throughput, w->usd_per_hour, w->throughput);
        return;
    }
    if (obj == PX_PLAN_OBJ_JOULES_PER_TOKEN) {
        snprintf(buf, n, "it draws %.3g W for %.3g tokens/s (%.3g J/token), against %.3g J/token",
                 l->power_w, l->throughput, l->joules_per_token, w->joules_per_token);
        return;
    }
    double d_comp = sum_compute(l) - sum_compute(w);
    double d_xfer = l->transfer_s - w->transfer_s;
    double d_ar = sum_field(l, offsetof(px_cost_stage_est, allreduce_s)) -
                  sum_field(w, offsetof(px_cost_stage_est, allreduce_s));
    double d_kv = sum_field(l, offsetof(px_cost_stage_est, kv_host_s)) -
                  sum_field(w, offsetof(px_cost_stage_est, kv_host_s));
    double top = PX_MAX(PX_MAX(d_comp, d_xfer), PX_MAX(d_ar, d_kv));
    if (top <= 0) {
        if (obj == PX_PLAN_OBJ_THROUGHPUT) {
            snprintf(buf, n, "it serves %.3g tokens/s against %.3g", l->throughput, w->throughput);
        } else {
            px_format_seconds(l->tpot_s, a, sizeof a);
            px_format_seconds(w->tpot_s, b, sizeof b);
            snprintf(buf, n, "its step takes %s against %s", a, b);
        }
        return;
    }
    if (top == d_xfer) {
        /* Name the slowest hop of the loser. */
        uint32_t hop = 0;
        for (uint32_t i = 0; i + 1 < l->n_stages; i++)
            if (l->stages[i].xfer_s > l->stages[hop].xfer_s)
                hop = i;
        if (lp->n_stages > 1) {
            uint32_t da = lp->stages[hop].devices[0], db = lp->stages[hop + 1].devices[0];
            px_cost_path pa = px_cost_fleet_path(ctx->fleet, da, db);
            px_format_seconds(l->stages[hop].xfer_s, a, sizeof a);
            px_format_seconds(d_xfer, b, sizeof b);
            const char *kind = px_hw_link_kind_name(pa.kind);
            snprintf(buf, n,
                     "%s %s hop %s -> %s costs %s per token (%s more transfer than the plan)",
                     strchr("aeiou", kind[0]) ? "an" : "a", kind, ctx->fleet->devices[da].id,
                     ctx->fleet->devices[db].id, a, b);
            return;
        }
    }
    if (top == d_ar) {
        px_format_seconds(d_ar, a, sizeof a);
        snprintf(buf, n, "tensor-parallel all-reduce adds %s per token", a);
        return;
    }
    if (top == d_kv) {
        px_format_seconds(d_kv, a, sizeof a);
        snprintf(buf, n, "its KV cache in host memory, read over the host link, adds %s per token",
                 a);
        return;
    }
    uint32_t s = l->bind_stage < l->n_stages ? l->bind_stage : 0;
    px_format_seconds(sum_compute(l), a, sizeof a);
    px_format_seconds(sum_compute(w), b, sizeof b);
    snprintf(buf, n, "its stages compute for %s per token against %s (slowest: %s, %s-bound)", a, b,
             ctx->fleet->devices[lp->stages[s].devices[0]].id,
             px_cost_bind_name(l->stages[s].bind));
    (void)wp;
}

static double margin_of(double loser, double winner)
{
    double den = fabs(winner) > 0 ? fabs(winner) : 1;
    return (loser - winner) / den;
}

/* The pool's runners-up become dominated (or SLO) rejections. */
void px__plan_add_dominated(px__plan_ctx *ctx, const px__plan_result *r)
{
    const px_cost_pipeline *wp = &r->layout.replicas[0];
    const px_cost_estimate *w = &r->est[0];
    px_cost_estimate *l = malloc(sizeof *l);
    if (!l)
        return;
    double wscore = px__plan_score(ctx, w, wp);
    char win_devs[160];
    px__plan_pipe_devices(ctx, wp, win_devs, sizeof win_devs);
    for (size_t i = 0; i < ctx->n_pool; i++) {
        const px__plan_cand *c = &ctx->pool[i];
        char devs[160];
        px__plan_pipe_devices(ctx, &c->pipe, devs, sizeof devs);
        if (!strcmp(devs, win_devs) && c->wl.batch == r->layout.wl.batch)
            continue;
        if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &c->wl, &c->pipe, NULL, l,
                                  NULL) != PX_OK ||
            l->why != PX_COST_OK)
            continue;
        char cause[200];
        px__plan_reason reason = PX__REJ_DOMINATED;
        const px_plan_slo *slo = &ctx->req->slo;
        if (!c->meets_slo) {
            reason = PX__REJ_SLO;
            char a[32], b[32];
            bool tp = slo->tpot_s > 0 && l->tpot_s > slo->tpot_s;
            px_format_seconds(tp ? l->tpot_s : l->ttft_s, a, sizeof a);
            px_format_seconds(tp ? slo->tpot_s : slo->ttft_s, b, sizeof b);
            snprintf(cause, sizeof cause, "its %s of %s misses the limit of %s",
                     tp ? "time per token" : "time to first token", a, b);
        } else {
            cause_of(ctx, wp, w, &c->pipe, l, cause, sizeof cause);
        }
        size_t before = ctx->n_rej;
        /* One entry per distinct description: candidates that differ only
         * in what the text does not show add nothing. */
        char msg[200];
        snprintf(msg, sizeof msg, "batch %u (%u micro-batch%s), %u stage%s, %s", c->wl.batch,
                 PX_MAX(c->wl.micro_batches, 1u), PX_MAX(c->wl.micro_batches, 1u) == 1 ? "" : "es",
                 c->pipe.n_stages, c->pipe.n_stages == 1 ? "" : "s",
                 ctx->prec[c->prec_index].label);
        uint64_t key = px_hash64(devs, strlen(devs)) ^ px_hash64(msg, strlen(msg));
        px__plan_reject_add(ctx, reason, key, devs, cause, "%s: %.1f%% worse on %s", msg,
                            100.0 * margin_of(px__plan_score(ctx, l, &c->pipe), wscore),
                            px_plan_objective_name(ctx->req->objective));
        if (ctx->n_rej > before) {
            px__plan_reject *x = &ctx->rej[ctx->n_rej - 1];
            x->margin = margin_of(px__plan_score(ctx, l, &c->pipe), wscore);
            x->tpot_s = l->tpot_s;
            x->throughput = l->throughput;
            x->has_figures = true;
        }
    }
    free(l);
}

static px_status say(json_t *arr, const char *fmt, ...) PX_PRINTF(2, 3);
static px_status say(json_t *arr, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return px_json_push(arr, json_string(buf));
}

static bool pipe_uses(const px_cost_pipeline *p, uint32_t d)
{
    for (uint32_t i = 0; i < p->n_stages; i++)
        for (uint32_t k = 0; k < p->stages[i].tp; k++)
            if (p->stages[i].devices[k] == d)
                return true;
    return false;
}

bool px__plan_layout_emulated(const px__plan_ctx *ctx, const px__plan_layout *l)
{
    for (uint32_t i = 0; i < l->n_replicas; i++)
        for (uint32_t s = 0; s < l->replicas[i].n_stages; s++)
            for (uint32_t k = 0; k < l->replicas[i].stages[s].tp; k++)
                if (ctx->fleet->devices[l->replicas[i].stages[s].devices[k]].emulated)
                    return true;
    return false;
}

json_t *px__plan_explanation(px__plan_ctx *ctx, const px__plan_result *r)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    const px_cost_pipeline *wp = &r->layout.replicas[0];
    const px_cost_estimate *w = &r->est[0];
    char devs[160], a[32], b[32];
    px__plan_pipe_devices(ctx, wp, devs, sizeof devs);
    px_format_seconds(r->tpot_p50, a, sizeof a);
    say(arr,
        "objective %s: %s in %u stage%s, %u replica%s, batch %u, %s precision; %s per token "
        "(p50), %.4g tokens/s",
        px_plan_objective_name(ctx->req->objective), devs, wp->n_stages,
        wp->n_stages == 1 ? "" : "s", r->layout.n_replicas, r->layout.n_replicas == 1 ? "" : "s",
        r->layout.wl.batch, ctx->prec[r->layout.prec_index].label, a, r->throughput);
    /* What the prefill of new requests costs the decode steps it joins. */
    if (w->tpot_s > 1.05 * w->decode_step_s) {
        char t[32], d[32];
        px_format_seconds(w->tpot_s - w->decode_step_s, t, sizeof t);
        px_format_seconds(w->decode_step_s, d, sizeof d);
        say(arr,
            "the prompts of new requests are prefilled inside decode steps (continuous "
            "batching): %s per token on top of %s of decode alone, at %u-token prompts per "
            "%u new tokens; the throughput counts it too",
            t, d, r->layout.wl.prompt_tokens, r->layout.wl.gen_tokens);
    }
    /* Replicas at batches of their own: each at the batch it serves best. */
    for (uint32_t i = 1; i < r->layout.n_replicas; i++) {
        if (r->layout.wls[i].batch == r->layout.wl.batch)
            continue;
        char rd[160], t[32];
        px__plan_pipe_devices(ctx, &r->layout.replicas[i], rd, sizeof rd);
        px_format_seconds(r->est[i].tpot_s, t, sizeof t);
        say(arr,
            "replica %u (%s) runs at batch %u, the batch it serves best: %s per token, %.4g "
            "tokens/s",
            i, rd, r->layout.wls[i].batch, t, r->est[i].throughput);
    }
    if (ctx->precision_note[0])
        say(arr, "%s", ctx->precision_note);
    if (px__plan_layout_emulated(ctx, &r->layout))
        say(arr, "runs on emulated or simulated devices: the figures describe the emulated "
                 "hardware, not real hardware");
    /* Against the closest alternative on other devices: the terms that
     * made the difference. */
    px_cost_estimate *l = malloc(sizeof *l);
    for (size_t i = 0; l && i < ctx->n_pool; i++) {
        const px__plan_cand *c = &ctx->pool[i];
        char cd[160];
        px__plan_pipe_devices(ctx, &c->pipe, cd, sizeof cd);
        if (!strcmp(cd, devs))
            continue;
        if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &c->wl, &c->pipe, NULL, l,
                                  NULL) != PX_OK ||
            l->why != PX_COST_OK)
            continue;
        char terms[256] = "";
        size_t len = 0;
        if (l->tpot_s < w->tpot_s * 0.999) {
            px_format_seconds(l->tpot_s, a, sizeof a);
            px_format_seconds(w->tpot_s, b, sizeof b);
            len +=
                (size_t)snprintf(terms + len, sizeof terms - len,
                                 "%s it is faster per token (%s against %s)", len ? ";" : "", a, b);
        }
        if (l->throughput > w->throughput * 1.001 && len < sizeof terms)
            len += (size_t)snprintf(terms + len, sizeof terms - len,
                                    "%s it serves more tokens/s (%.4g against %.4g)",
                                    len ? ";" : "", l->throughput, w->throughput);
        if (l->usd_per_hour < w->usd_per_hour * 0.999 && len < sizeof terms)
            len += (size_t)snprintf(terms + len, sizeof terms - len,
                                    "%s it costs less per hour (%.3g $/h against %.3g $/h)",
                                    len ? ";" : "", l->usd_per_hour, w->usd_per_hour);
        char cause[200];
        cause_of(ctx, wp, w, &c->pipe, l, cause, sizeof cause);
        say(arr, "chosen over %s because %s (%s: %.1f%% worse)%s%s", cd, cause,
            px_plan_objective_name(ctx->req->objective),
            100.0 * margin_of(px__plan_score(ctx, l, &c->pipe), px__plan_score(ctx, w, wp)),
            terms[0] ? "; the alternative is better on other terms:" : "", terms);
        break;
    }
    /* The fastest device, when it is left out. */
    uint32_t fastest = UINT32_MAX;
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++)
        if (ctx->usable[i] && !(ctx->req->excluded && ctx->req->excluded[i]) &&
            (fastest == UINT32_MAX ||
             ctx->fleet->devices[i].mem_bw > ctx->fleet->devices[fastest].mem_bw))
            fastest = i;
    bool used = false;
    for (uint32_t k = 0; k < r->layout.n_replicas; k++)
        used |= fastest != UINT32_MAX && pipe_uses(&r->layout.replicas[k], fastest);
    if (fastest != UINT32_MAX && !used) {
        const char *why = NULL;
        for (size_t i = 0; i < ctx->n_pool && l && !why; i++) {
            const px__plan_cand *c = &ctx->pool[i];
            if (!pipe_uses(&c->pipe, fastest))
                continue;
            if (px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &c->wl, &c->pipe, NULL, l,
                                      NULL) != PX_OK ||
                l->why != PX_COST_OK)
                continue;
            char cause[200];
            cause_of(ctx, wp, w, &c->pipe, l, cause, sizeof cause);
            say(arr, "the fastest device %s is not used: with it, %s (%.1f%% worse on %s)",
                ctx->fleet->devices[fastest].id, cause,
                100.0 * margin_of(px__plan_score(ctx, l, &c->pipe), px__plan_score(ctx, w, wp)),
                px_plan_objective_name(ctx->req->objective));
            why = "said";
        }
        if (!why)
            say(arr,
                "the fastest device %s is not used: no candidate with it fits or meets the "
                "contract (see rejected)",
                ctx->fleet->devices[fastest].id);
    }
    free(l);
    uint32_t s = w->bind_stage < wp->n_stages ? w->bind_stage : 0;
    px_format_seconds(w->stages[s].decode_s, a, sizeof a);
    if (w->bind == PX_COST_BIND_TRANSFER) {
        px_format_seconds(w->transfer_s, b, sizeof b);
        say(arr, "decode is bound by transfers between stages (%s per token)", b);
    } else {
        say(arr, "decode is bound by %s on stage %u (%s, %s per step)",
            px_cost_bind_name(w->stages[s].bind), s,
            ctx->fleet->devices[wp->stages[s].devices[0]].id, a);
    }
    if (r->layout.n_replicas == 1 &&
        (ctx->req->objective == PX_PLAN_OBJ_LATENCY || ctx->req->objective == PX_PLAN_OBJ_TTFT))
        say(arr, "one replica: no spare devices of the same classes to copy it onto without "
                 "changing its latency");
    if (r->verdict == PX_VERDICT_ALLOWED_AFTER_VALIDATION)
        say(arr, "the contract allows this plan after validation: discharge the obligations "
                 "listed under contract before running it");
    return arr;
}
