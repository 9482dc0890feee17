/* px_plan_search: the request, the policy table, baselines, and the plan
 * object (replicas: replicas.c; fallbacks: fallback.c). */
#include "base/common.h"

#include "plan/plan_impl.h"

static const char *const objective_names[] = {"latency", "ttft", "throughput", "tokens_per_dollar",
                                              "joules_per_token"};

const char *px_plan_objective_name(px_plan_objective o)
{
    return (unsigned)o < PX_PLAN_OBJ_COUNT_ ? objective_names[o] : "unknown";
}

px_status px_plan_objective_parse(const char *text, px_plan_objective *out, px_err *err)
{
    for (int i = 0; i < PX_PLAN_OBJ_COUNT_; i++)
        if (!strcmp(text, objective_names[i])) {
            *out = (px_plan_objective)i;
            return PX_OK;
        }
    return px_err_set(err, PX_EINVAL,
                      "unknown objective \"%.64s\"; use latency, ttft, throughput, "
                      "tokens_per_dollar or joules_per_token",
                      text);
}

px_status px_plan_slo_parse(const char *text, px_plan_slo *slo, px_err *err)
{
    char buf[256];
    if (strlen(text) >= sizeof buf)
        return px_err_set(err, PX_EINVAL, "--slo: text too long (at most 255 bytes)");
    px_strlcpy(buf, text, sizeof buf);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            return px_err_set(err, PX_EINVAL,
                              "--slo: \"%.64s\" is not KEY=VALUE (use tpot=50ms,ttft=500ms)", item);
        *eq = 0;
        px_qty q;
        px_err qerr;
        if (!strcmp(item, "tpot") || !strcmp(item, "ttft")) {
            if (px_qty_parse(eq + 1, PX_DIM_TIME, &q, &qerr) != PX_OK)
                return px_err_set(err, PX_EINVAL, "--slo: %s: %s", item, qerr.msg);
            if (!(q.value > 0))
                return px_err_set(err, PX_EINVAL, "--slo: %s must be positive", item);
            if (item[1] == 'p')
                slo->tpot_s = q.value;
            else
                slo->ttft_s = q.value;
        } else if (!strcmp(item, "budget")) {
            px_status st = px_plan_budget_parse(eq + 1, &slo->budget_usd_h, err);
            if (st != PX_OK)
                return st;
        } else {
            return px_err_set(err, PX_EINVAL,
                              "--slo: unknown limit \"%.32s\"; use tpot, ttft or budget", item);
        }
    }
    return PX_OK;
}

px_status px_plan_budget_parse(const char *text, double *usd_per_hour, px_err *err)
{
    px_qty q;
    px_err qerr;
    if (px_qty_parse(text, PX_DIM_MONEY_RATE, &q, &qerr) != PX_OK)
        return px_err_set(err, PX_EINVAL, "budget \"%.64s\": %s (write it as 10$/h)", text,
                          qerr.msg);
    if (!(q.value > 0))
        return px_err_set(err, PX_EINVAL, "budget must be positive");
    *usd_per_hour = q.value;
    return PX_OK;
}

void px_plan_request_default(px_plan_request *req)
{
    memset(req, 0, sizeof *req);
    req->objective = PX_PLAN_OBJ_LATENCY;
    req->workload = px_cost_workload_default();
    req->workload.batch = 0;
    req->workload.micro_batches = 0;
    req->workload.context = 0;
    req->workload.prompt_tokens = 0;
    req->policy = "plexus";
    px_cost_params_default(&req->cost);
    req->fallbacks = true;
    req->max_rejected = 12;
}

/* ------------------------------------------------------------------ */
/* Policies                                                            */
/* ------------------------------------------------------------------ */

static const struct {
    const char *name, *summary;
    px__plan_place_fn fn;
} policies[] = {
    {"plexus", "hierarchical search: classes, DP cuts, tensor parallel, precision, replicas",
     px__plan_search_plexus},
    {"llamacpp", "llama.cpp default: layers by free memory, embedding on the host",
     px__plan_llamacpp},
    {"exo", "exo: smallest ring of nodes holding the model, layers by memory", px__plan_exo},
    {"gpustack", "GPUStack: one GPU, one machine, several machines, offload, CPU",
     px__plan_gpustack},
    {"single-type", "Melange-like: one device type per replica, no model split",
     px__plan_single_type},
};

size_t px_plan_policy_count(void)
{
    return PX_ARRAY_LEN(policies);
}

const char *px_plan_policy_name(size_t i)
{
    return i < PX_ARRAY_LEN(policies) ? policies[i].name : NULL;
}

const char *px_plan_policy_summary(size_t i)
{
    return i < PX_ARRAY_LEN(policies) ? policies[i].summary : NULL;
}

bool px_plan_policy_exists(const char *name)
{
    return px__plan_policy_fn(name) != NULL;
}

px__plan_place_fn px__plan_policy_fn(const char *name)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(policies); i++)
        if (!strcmp(policies[i].name, name))
            return policies[i].fn;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Context                                                             */
/* ------------------------------------------------------------------ */

/* Unset context and prompt follow the model: at most its trained context
 * (4096 by default), a prompt of at most half of it. */
static void resolve_request(const px_plan_request *req, px_plan_request *rq)
{
    *rq = *req;
    if (rq->workload.context == 0) {
        const px_ir_hparams *hp = px_ir_model_hparams(req->model);
        uint32_t trained = hp && hp->context_length ? hp->context_length : 4096;
        rq->workload.context = PX_MIN(4096u, trained);
    }
    if (rq->workload.prompt_tokens == 0)
        rq->workload.prompt_tokens = PX_MIN(512u, PX_MAX(rq->workload.context / 2, 1u));
    if (rq->workload.gen_tokens == 0)
        rq->workload.gen_tokens = 256;
}

static void ctx_release(px__plan_ctx *ctx)
{
    free(ctx->cdev);
    free(ctx->usable);
    free(ctx->class_avail);
    free(ctx->pool);
    free(ctx->rej);
    free(ctx->scratch);
    px_contract_free(ctx->owned_contract);
    px_strbuf_release(&ctx->notes);
}

static px_status ctx_init(px__plan_ctx *ctx, const px_plan_request *req, px_cost_fleet *f,
                          const px_cost_model *m, px_err *err)
{
    memset(ctx, 0, sizeof *ctx);
    px_strbuf_init(&ctx->notes);
    resolve_request(req, &ctx->resolved);
    ctx->req = &ctx->resolved;
    req = ctx->req;
    ctx->fleet = f;
    ctx->model = m;
    ctx->cp = &req->cost;
    ctx->cdev = calloc(f->n_devices, sizeof *ctx->cdev);
    ctx->usable = calloc(f->n_devices, sizeof *ctx->usable);
    ctx->class_avail = calloc(f->n_classes ? f->n_classes : 1, sizeof *ctx->class_avail);
    ctx->pool = calloc(PX__PLAN_POOL, sizeof *ctx->pool);
    ctx->rej = calloc(PX__PLAN_MAX_REJECT, sizeof *ctx->rej);
    ctx->scratch = malloc(sizeof *ctx->scratch);
    if (!ctx->cdev || !ctx->usable || !ctx->class_avail || !ctx->pool || !ctx->rej || !ctx->scratch)
        return px_err_set(err, PX_ENOMEM, "out of memory starting the search");
    if (req->contract) {
        ctx->contract = req->contract;
    } else {
        px_status st = px_contract_builtin("deterministic", &ctx->owned_contract, err);
        if (st != PX_OK)
            return st;
        ctx->contract = ctx->owned_contract;
        ctx->implied_contract = true;
    }
    const px_hw_view *v = px_hw_graph_view(f->graph);
    for (uint32_t i = 0; i < f->n_devices; i++) {
        const px_cost_device *d = &f->devices[i];
        const px_hw_device *hd = &v->devices[d->hw_index];
        /* The plexus backends run fixed-order kernels, so devices count as
         * deterministic (listed among the assumptions). */
        ctx->cdev[i] = (px_contract_device){.id = d->id,
                                            .backend = d->backend,
                                            .vendor = hd->vendor,
                                            .arch = hd->capability ? hd->capability : d->model,
                                            .deterministic = true,
                                            .emulated = d->emulated};
        bool compute = false;
        for (int t = 0; t < PX_HW_DTYPE_COUNT; t++)
            compute |= d->peak[t] > 0;
        ctx->usable[i] = d->mem_free > 0 && compute;
        if (ctx->usable[i] && !(req->excluded && req->excluded[i]))
            ctx->class_avail[d->klass]++;
        if (!compute)
            px__plan_reject_add(ctx, PX__REJ_CAPABILITY, px_hash64(d->id, strlen(d->id)), d->id,
                                NULL, "%s states no compute rate in any dtype", d->id);
    }
    return px__plan_precisions(ctx, err);
}

px_status px__plan_open(const px_plan_request *req, px_cost_fleet **f, px_cost_model **m,
                        px__plan_ctx *ctx, px_err *err)
{
    *f = NULL;
    *m = NULL;
    memset(ctx, 0, sizeof *ctx);
    px_status st = px_cost_params_check(&req->cost, err);
    if (st == PX_OK)
        st = px_cost_fleet_new(req->graph, &req->cost, f, err);
    if (st == PX_OK)
        st = px_cost_model_new(req->model, m, err);
    if (st == PX_OK)
        st = ctx_init(ctx, req, *f, *m, err);
    if (st != PX_OK)
        px__plan_close(*f, *m, ctx);
    return st;
}

void px__plan_close(px_cost_fleet *f, px_cost_model *m, px__plan_ctx *ctx)
{
    ctx_release(ctx);
    memset(ctx, 0, sizeof *ctx);
    px_cost_model_free(m);
    px_cost_fleet_free(f);
}

/* ------------------------------------------------------------------ */
/* Evaluation of the final layout                                      */
/* ------------------------------------------------------------------ */

/* Replicas the layout's Monte Carlo evaluates jointly; past them the
 * throughput interval is scaled by the point estimates (the slowest of
 * them sets the time per token, as the rest are clones or alike). */
#define MC_REPLICAS 64

/* Replicas on one host share its cores (px_cost_host_shares): each one's
 * step stretches and its throughput drops by the factor. */
static px_status share_host_cores(px_cost_estimate *est, uint32_t n, px_err *err)
{
    uint32_t *node = malloc((n ? n : 1) * sizeof *node);
    double *use = malloc((n ? n : 1) * 2 * sizeof *use);
    if (!node || !use) {
        free(node);
        free(use);
        return px_err_set(err, PX_ENOMEM, "out of memory evaluating the plan");
    }
    for (uint32_t i = 0; i < n; i++) {
        node[i] = est[i].host_node;
        use[i] = est[i].step_s > 0 ? est[i].host_cores_s / est[i].step_s : 0;
    }
    double *k = use + n;
    px_cost_host_shares(node, use, n, k);
    for (uint32_t i = 0; i < n; i++) {
        est[i].step_s *= k[i];
        est[i].tpot_s *= k[i];
        est[i].throughput /= k[i];
        est[i].usd_per_token *= k[i];
        est[i].tokens_per_usd /= k[i];
    }
    free(node);
    free(use);
    return PX_OK;
}

static px_status evaluate_layout(px__plan_ctx *ctx, px__plan_result *r, px_err *err)
{
    px__plan_layout *l = &r->layout;
    r->est = calloc(l->n_replicas, sizeof *r->est);
    if (!r->est)
        return px_err_set(err, PX_ENOMEM, "out of memory evaluating the plan");
    double p_ok = 1.0;
    for (uint32_t i = 0; i < l->n_replicas; i++) {
        px_status st = px_cost_eval_pipeline(ctx->fleet, ctx->model, ctx->cp, &l->wls[i],
                                             &l->replicas[i], NULL, &r->est[i], err);
        if (st != PX_OK)
            return st;
        if (r->est[i].why != PX_COST_OK)
            return px_err_set(err, PX_EINFEASIBLE, "%s placement does not fit (%s in stage %u)",
                              r->policy, px_cost_infeasible_name(r->est[i].why),
                              r->est[i].why_stage);
    }
    px_status hs = share_host_cores(r->est, l->n_replicas, err);
    if (hs != PX_OK)
        return hs;
    for (uint32_t i = 0; i < l->n_replicas; i++) {
        r->throughput += r->est[i].throughput;
        r->usd_per_hour += r->est[i].usd_per_hour;
        r->power_w += r->est[i].power_w;
        p_ok *= 1.0 - r->est[i].p_fail;
    }
    r->p_fail = 1.0 - p_ok;
    /* One Monte Carlo over the replicas together: each sample's time per
     * token is its slowest replica's and its throughput their sum, so the
     * two intervals describe the same draws. */
    uint32_t n_mc = PX_MIN(l->n_replicas, (uint32_t)MC_REPLICAS);
    px_status st =
        px_cost_uncertainty_layout(ctx->fleet, ctx->model, ctx->cp, l->wls, l->replicas, n_mc,
                                   ctx->req->slo.tpot_s, ctx->req->slo.ttft_s, &r->mc, err);
    if (st != PX_OK)
        return st;
    double part = 0, k_tpot = 1, k_ttft = 1;
    double slow_tpot = 0, slow_ttft = 0;
    for (uint32_t i = 0; i < n_mc; i++) {
        part += r->est[i].throughput;
        slow_tpot = PX_MAX(slow_tpot, r->est[i].tpot_s);
        slow_ttft = PX_MAX(slow_ttft, r->est[i].ttft_s);
    }
    for (uint32_t i = n_mc; i < l->n_replicas; i++) {
        k_tpot = PX_MAX(k_tpot, r->est[i].tpot_s / slow_tpot);
        k_ttft = PX_MAX(k_ttft, r->est[i].ttft_s / slow_ttft);
    }
    double k_thr = part > 0 ? r->throughput / part : 1;
    /* Scale whole intervals, so p50 and p99 stay inside [lo, hi]. */
    r->mc.tpot_s.lo *= k_tpot;
    r->mc.tpot_s.hi *= k_tpot;
    r->mc.ttft_s.lo *= k_ttft;
    r->mc.ttft_s.hi *= k_ttft;
    r->mc.throughput.p50 *= k_thr;
    r->mc.throughput.p99 *= k_thr;
    r->mc.throughput.lo *= k_thr;
    r->mc.throughput.hi *= k_thr;
    r->tpot_p50 = r->mc.tpot_s.p50 * k_tpot;
    r->tpot_p99 = r->mc.tpot_s.p99 * k_tpot;
    r->ttft_p50 = r->mc.ttft_s.p50 * k_ttft;
    r->ttft_p99 = r->mc.ttft_s.p99 * k_ttft;
    /* Compute at the rate of the most aggressive precision the contract
     * allowed (the last option), so the bound holds for every plan the
     * search could have made. */
    px_cost_lower_bound_at(ctx->fleet, ctx->model, ctx->cp, &l->wl,
                           &ctx->prec[ctx->n_prec - 1].prec, NULL, 0, &r->bound);
    r->placed_bound_s =
        px_cost_pipeline_bound(ctx->fleet, ctx->model, ctx->cp, &l->wl, &l->replicas[0]);
    r->contract = px__plan_contract_json(ctx, l, &r->verdict);
    if (!r->contract)
        return px_err_set(err, PX_ENOMEM, "out of memory judging the plan");
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Baselines                                                           */
/* ------------------------------------------------------------------ */

/* Costs one baseline layout at batch w->batch; false when a replica does
 * not fit (b->why says why).  A baseline is judged by its own rule: it
 * placed by its own memory estimate, so it fails only where the memory
 * itself runs out (no plexus headroom). */
static bool cost_baseline(px__plan_ctx *ctx, const px__plan_layout *lay, const px_cost_workload *w,
                          px__plan_baseline *b)
{
    b->tpot_s = b->ttft_s = b->throughput = b->usd_per_hour = b->joules_per_token = 0;
    px_cost_params own = *ctx->cp;
    own.headroom = 0;
    /* Per replica: its host node's use, time per token, throughput, J/token. */
    uint32_t n = lay->n_replicas;
    uint32_t *node = malloc((n ? n : 1) * sizeof *node);
    double *fig = malloc((n ? n : 1) * 5 * sizeof *fig);
    if (!node || !fig) {
        free(node);
        free(fig);
        snprintf(b->why, sizeof b->why, "out of memory costing it");
        return false;
    }
    double *use = fig, *k = fig + n, *tpot = fig + 2 * n, *thr = fig + 3 * n, *jpt = fig + 4 * n;
    for (uint32_t i = 0; i < lay->n_replicas; i++) {
        px_cost_estimate *e = ctx->scratch;
        if (px_cost_eval_pipeline(ctx->fleet, ctx->model, &own, w, &lay->replicas[i], NULL, e,
                                  NULL) != PX_OK ||
            e->why != PX_COST_OK) {
            if (e->why == PX_COST_NO_MEMORY) {
                char over[32];
                px__plan_fmt_bytes(e->why_bytes, over, sizeof over);
                snprintf(b->why, sizeof b->why,
                         "its placement runs out of %smemory on %s (%s over its capacity)",
                         e->why_host ? "host " : "",
                         ctx->fleet->devices[lay->replicas[i].stages[e->why_stage].devices[0]].id,
                         over);
            } else {
                snprintf(b->why, sizeof b->why, "its placement is infeasible (%s)",
                         px_cost_infeasible_name(e->why));
            }
            free(node);
            free(fig);
            return false;
        }
        node[i] = e->host_node;
        use[i] = e->step_s > 0 ? e->host_cores_s / e->step_s : 0;
        tpot[i] = e->tpot_s;
        thr[i] = e->throughput;
        jpt[i] = e->joules_per_token;
        b->ttft_s = PX_MAX(b->ttft_s, e->ttft_s);
        b->usd_per_hour += e->usd_per_hour;
    }
    /* Its replicas share hosts' cores as plexus's do. */
    px_cost_host_shares(node, use, n, k);
    for (uint32_t i = 0; i < n; i++) {
        b->tpot_s = PX_MAX(b->tpot_s, tpot[i] * k[i]);
        b->throughput += thr[i] / k[i];
        b->joules_per_token += jpt[i] * thr[i] / k[i];
    }
    free(node);
    free(fig);
    if (b->throughput > 0)
        b->joules_per_token /= b->throughput;
    return true;
}

static void run_baseline(px__plan_ctx *ctx, const char *name, const px_cost_workload *wl,
                         px__plan_baseline *b)
{
    memset(b, 0, sizeof *b);
    px_strlcpy(b->name, name, sizeof b->name);
    px__plan_layout lay = {0};
    px_err err;
    px__plan_place_fn fn = px__plan_policy_fn(name);
    if (!fn || fn(ctx, &lay, &err) != PX_OK) {
        px_textf(b->why, sizeof b->why, "%s", fn ? err.msg : "unknown policy");
        px__plan_layout_release(&lay);
        return;
    }
    b->n_replicas = lay.n_replicas;
    b->n_stages = lay.replicas[0].n_stages;
    px__plan_pipe_devices(ctx, &lay.replicas[0], b->devices, sizeof b->devices);
    b->contract_ok = true;
    char cmsg[320] = "";
    for (uint32_t i = 0; i < lay.n_replicas && b->contract_ok; i++)
        if (px__plan_check_structure(ctx, &lay.replicas[i], cmsg, sizeof cmsg) ==
            PX_VERDICT_FORBIDDEN)
            b->contract_ok = false;
    /* The plan's batch first; a baseline whose cache does not fit at it
     * gets the largest halving that does, as its operator would choose. */
    px_cost_workload w = *wl;
    w.micro_batches = 1;
    for (;;) {
        if (cost_baseline(ctx, &lay, &w, b)) {
            b->feasible = true;
            b->batch = w.batch;
            break;
        }
        if (w.batch <= 1)
            break;
        w.batch /= 2;
    }
    if (b->feasible) {
        if (!b->contract_ok)
            snprintf(b->why, sizeof b->why, "violates the contract: %.290s", cmsg);
        else if (b->batch != wl->batch)
            snprintf(b->why, sizeof b->why, "runs at batch %u: batch %u does not fit its memory",
                     b->batch, wl->batch);
        else
            b->why[0] = 0;
    }
    px__plan_layout_release(&lay);
}

/* ------------------------------------------------------------------ */
/* px_plan_search                                                      */
/* ------------------------------------------------------------------ */

static px_status infeasible_error(px__plan_ctx *ctx, px_status st, px_err *err)
{
    /* Only "nothing fits" is explained here; an SLO or budget refusal
     * already says why. */
    if (st != PX_EINFEASIBLE || ctx->n_pool > 0)
        return st;
    double free_total = 0, largest = 0;
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++)
        if (ctx->usable[i])
            free_total += ctx->fleet->devices[i].mem_free * (1.0 - ctx->cp->headroom);
    for (uint32_t i = 0; i < ctx->model->n_layers; i++)
        largest =
            PX_MAX(largest, ctx->model->layers[i].attn_bytes + ctx->model->layers[i].ffn_bytes);
    char need[32], have[32], blk[32];
    px__plan_fmt_bytes(ctx->model->total_bytes, need, sizeof need);
    px__plan_fmt_bytes(free_total, have, sizeof have);
    px__plan_fmt_bytes(largest, blk, sizeof blk);
    const char *first = "";
    for (size_t i = 0; i < ctx->n_rej; i++)
        if (ctx->rej[i].reason == PX__REJ_MEMORY || ctx->rej[i].reason == PX__REJ_CONTRACT) {
            first = ctx->rej[i].message;
            break;
        }
    if (ctx->model->total_bytes <= free_total)
        return px_err_set(err, PX_EINFEASIBLE,
                          "%s (%s of weights) fits in the fleet's total free memory (%s after "
                          "headroom) but in no feasible cut: each stage must hold whole blocks "
                          "(the largest is %s) with its KV cache and runtime overhead on one "
                          "device group%s%s",
                          ctx->model->name, need, have, blk, first[0] ? "; " : "", first);
    return px_err_set(err, PX_EINFEASIBLE,
                      "%s needs %s of weights but the fleet has %s of free memory after "
                      "headroom%s%s",
                      ctx->model->name, need, have, first[0] ? "; " : "", first);
}

static void fill_summary(px_plan *plan, const px__plan_ctx *ctx, const px__plan_result *r)
{
    px_plan_summary *s = &plan->summary;
    memset(s, 0, sizeof *s);
    s->policy = plan->policy;
    s->objective = ctx->req->objective;
    s->n_replicas = r->layout.n_replicas;
    s->n_stages = r->layout.replicas[0].n_stages;
    for (uint32_t i = 0; i < r->layout.n_replicas; i++)
        for (uint32_t k = 0; k < r->layout.replicas[i].n_stages; k++)
            s->n_devices += r->layout.replicas[i].stages[k].tp;
    s->batch = r->layout.wl.batch;
    for (uint32_t i = 0; i < r->layout.n_replicas; i++)
        s->batch_total += r->layout.wls[i].batch;
    s->micro_batches = r->layout.wl.micro_batches;
    s->tpot_s = r->mc.tpot_s;
    s->tpot_s.p50 = r->tpot_p50;
    s->tpot_s.p99 = r->tpot_p99;
    s->ttft_s = r->mc.ttft_s;
    s->ttft_s.p50 = r->ttft_p50;
    s->ttft_s.p99 = r->ttft_p99;
    s->throughput = r->mc.throughput;
    for (uint32_t i = 0; i < r->layout.n_replicas; i++)
        s->tpot_point_s = PX_MAX(s->tpot_point_s, r->est[i].tpot_s);
    s->throughput_point = r->throughput;
    s->joules_per_token = r->throughput > 0 ? r->power_w / r->throughput : 0;
    s->usd_per_hour = r->usd_per_hour;
    s->tokens_per_usd = r->usd_per_hour > 0 ? 3600.0 * r->throughput / r->usd_per_hour : 0;
    s->bound_fraction = r->tpot_p50 > 0 ? r->bound.tpot_s / r->tpot_p50 : 0;
    s->p_meet_slo = r->mc.p_meet_slo;
    s->emulated = json_is_true(json_object_get(plan->doc, "emulated"));
    s->n_fallbacks = r->n_fb;
    s->n_link_fallbacks = r->n_lfb;
    s->n_candidates = ctx->n_evaluated;
}

static void result_release(px__plan_result *r)
{
    free(r->est);
    free(r->fb);
    free(r->lfb);
    json_decref(r->contract);
}

px_status px_plan_search(const px_plan_request *req, px_plan **out, px_err *err)
{
    *out = NULL;
    if (!req || !req->graph || !req->model)
        return px_err_set(err, PX_EINVAL, "plan: a hardware graph and a model are required");
    const char *policy = req->policy ? req->policy : "plexus";
    px__plan_place_fn fn = px__plan_policy_fn(policy);
    if (!fn)
        return px_err_set(err, PX_EINVAL,
                          "unknown policy \"%.64s\"; use plexus, llamacpp, exo, gpustack or "
                          "single-type",
                          policy);
    if ((unsigned)req->objective >= PX_PLAN_OBJ_COUNT_)
        return px_err_set(err, PX_EINVAL, "unknown objective %d", (int)req->objective);
    px_plan_request rq;
    resolve_request(req, &rq);
    req = &rq;
    const px_cost_workload *w = &req->workload;
    if (w->context == 0 || w->context > (1u << 24) || w->prompt_tokens > w->context ||
        w->batch > 65536 || w->micro_batches > 4096 || w->gen_tokens > (1u << 24))
        return px_err_set(err, PX_EINVAL,
                          "plan: workload out of range (context 1..16M, prompt <= context, "
                          "batch <= 65536, micro-batches <= 4096)");
    px_status st = px_cost_params_check(&req->cost, err);
    if (st != PX_OK)
        return st;

    px_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_strlcpy(plan->policy, policy, sizeof plan->policy);
    px__plan_ctx ctx;
    px__plan_result r;
    memset(&r, 0, sizeof r);
    memset(&ctx, 0, sizeof ctx);
    r.policy = plan->policy;
    st = px_cost_fleet_new(req->graph, &req->cost, &plan->fleet, err);
    if (st == PX_OK)
        st = px_cost_model_new(req->model, &plan->model, err);
    if (st == PX_OK)
        st = ctx_init(&ctx, req, plan->fleet, plan->model, err);
    if (st != PX_OK)
        goto fail;

    st = fn(&ctx, &r.layout, err);
    st = infeasible_error(&ctx, st, err);
    if (st != PX_OK)
        goto fail;
    if (strcmp(policy, "plexus")) {
        /* Baselines run the workload as given (batch 1 when unset). */
        px_cost_workload bw = req->workload;
        if (bw.batch == 0)
            bw.batch = 1;
        bw.micro_batches = 1;
        px__plan_layout_set_wl(&r.layout, &bw);
        r.layout.prec_index = 0;
    } else {
        st = px__plan_add_replicas(&ctx, &r.layout, err);
        if (st == PX_OK)
            st = px__plan_best_layout(&ctx, &r.layout, err);
        if (st != PX_OK)
            goto fail;
    }
    st = evaluate_layout(&ctx, &r, err);
    if (st == PX_OK && req->fallbacks)
        st = px__plan_fallbacks(&ctx, &r, err);
    if (st != PX_OK)
        goto fail;
    if (req->compare_baselines) {
        for (size_t i = 1; i < PX_ARRAY_LEN(policies) && r.n_bl < PX_ARRAY_LEN(r.bl); i++)
            if (strcmp(policies[i].name, policy))
                run_baseline(&ctx, policies[i].name, &r.layout.wl, &r.bl[r.n_bl++]);
    }
    plan->doc = px__plan_document(&ctx, &r);
    if (!plan->doc) {
        st = px_err_set(err, PX_ENOMEM, "out of memory writing the plan");
        goto fail;
    }
    px_strlcpy(plan->id, json_string_value(json_object_get(plan->doc, "id")), sizeof plan->id);
    fill_summary(plan, &ctx, &r);
    plan->summary.n_rejected = json_array_size(json_object_get(plan->doc, "rejected"));
    plan->layout = r.layout;
    r.layout.replicas = NULL;
    r.layout.wls = NULL;
    result_release(&r);
    ctx_release(&ctx);
    *out = plan;
    return PX_OK;
fail:
    px__plan_layout_release(&r.layout);
    result_release(&r);
    ctx_release(&ctx);
    px_plan_free(plan);
    return st;
}

void px_plan_free(px_plan *p)
{
    if (!p)
        return;
    json_decref(p->doc);
    px__plan_layout_release(&p->layout);
    px_cost_model_free(p->model);
    px_cost_fleet_free(p->fleet);
    free(p);
}

json_t *px_plan_to_json(const px_plan *p)
{
    return json_deep_copy(p->doc);
}

char *px_plan_dump(const px_plan *p)
{
    return px__plan_dump_json(p->doc);
}

const char *px_plan_id(const px_plan *p)
{
    return p->id;
}

void px_plan_get_summary(const px_plan *p, px_plan_summary *out)
{
    *out = p->summary;
}

const px_cost_pipeline *px_plan_pipeline(const px_plan *p, uint32_t replica)
{
    return replica < p->layout.n_replicas ? &p->layout.replicas[replica] : NULL;
}

const px_cost_workload *px_plan_replica_workload(const px_plan *p, uint32_t replica)
{
    return replica < p->layout.n_replicas ? &p->layout.wls[replica] : NULL;
}

const px_cost_fleet *px_plan_fleet(const px_plan *p)
{
    return p->fleet;
}
