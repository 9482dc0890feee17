/* Validation of mitigation candidates: each simulated under the observed
 * conditions on the same load, checked against the contract and the SLO,
 * accepted or rejected with a reason; the safest accepted one chosen. */
#include "base/common.h"

#include "heal/heal_impl.h"

/* Share of the current plan's sequences kept in flight by the load. */
#define LOAD_OCCUPANCY 0.8

static double num_at(const json_t *o, const char *a, const char *b, const char *c)
{
    const json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    if (c)
        v = json_object_get(v, c);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

bool px__heal_plan_sizes_load(const json_t *plan)
{
    return num_at(plan, "predictions", "tpot_s", "p50") > 0 &&
           num_at(plan, "predictions", "ttft_s", "p50") >= 0;
}

/* Poisson arrivals at the rate that keeps LOAD_OCCUPANCY of the reference
 * plan's sequences in flight: by Little's law, in flight = rate x time in
 * the system, and a request stays about TTFT + gen x TPOT. */
static px_status make_load(const px_heal_context *ctx, const json_t *ref, px_sim_load *load,
                           px_err *err)
{
    memset(load, 0, sizeof *load);
    const px_cost_workload *w = &ctx->request.workload;
    double batch = num_at(ref, "workload", "batch", NULL);
    double prompt = num_at(ref, "workload", "prompt_tokens", NULL);
    double gen = num_at(ref, "workload", "gen_tokens", NULL);
    double replicas = num_at(ref, "batching", "replicas", NULL);
    double tpot = num_at(ref, "predictions", "tpot_s", "p50");
    double ttft = num_at(ref, "predictions", "ttft_s", "p50");
    if (!(batch >= 1))
        batch = w->batch ? w->batch : 1;
    if (!(prompt >= 1))
        prompt = w->prompt_tokens ? w->prompt_tokens : 512;
    if (!(gen >= 1))
        gen = w->gen_tokens ? w->gen_tokens : 256;
    if (!(replicas >= 1))
        replicas = 1;
    if (!px__heal_plan_sizes_load(ref))
        return px_err_set(err, PX_EINVAL,
                          "heal: the reference plan has no predicted tpot_s/ttft_s to size the "
                          "validation load from (/predictions)");
    load->kind = PX_SIM_LOAD_POISSON;
    load->rate = LOAD_OCCUPANCY * batch * replicas / (ttft + gen * tpot);
    load->prompt = (px_sim_len){.kind = PX_SIM_LEN_FIXED, .a = (uint32_t)PX_MIN(prompt, 1e6)};
    load->gen = (px_sim_len){.kind = PX_SIM_LEN_FIXED, .a = (uint32_t)PX_MIN(gen, 1e6)};
    px__heal_textf(load->source, sizeof load->source, "heal validation: poisson %.4g/s",
                   load->rate);
    return PX_OK;
}

static bool has_device(const px_sim_plan *p, const char *id)
{
    for (size_t i = 0; i < p->n_devices; i++)
        if (!strcmp(p->devices[i].id, id))
            return true;
    return false;
}

static bool knows_target(const px_sim_plan *p, const px_sim_fault *f)
{
    if (f->kind == PX_SIM_FAULT_DOMAIN_LOSS) {
        for (size_t i = 0; i < p->n_domains; i++)
            if (!strcmp(p->domains[i].id, f->target))
                return true;
        return false;
    }
    if (f->kind == PX_SIM_FAULT_LINK_DEGRADE) {
        const char *gt = strchr(f->target, '>');
        char a[PX_SIM_ID_LEN];
        size_t la = gt ? (size_t)(gt - f->target) : sizeof a;
        if (la >= sizeof a)
            return false;
        memcpy(a, f->target, la);
        a[la] = 0;
        return has_device(p, a) && has_device(p, gt + 1);
    }
    return !strcmp(f->target, "*") || has_device(p, f->target);
}

/* The conditions whose targets the plan knows (items borrowed; free the
 * array only). */
static px_status filter(const px_sim_plan *p, const px_sim_faults *all, px_sim_faults *out)
{
    out->items = NULL;
    out->n = 0;
    if (!all || !all->n)
        return PX_OK;
    out->items = malloc(all->n * sizeof *out->items);
    if (!out->items)
        return PX_ENOMEM;
    for (size_t i = 0; i < all->n; i++)
        if (knows_target(p, &all->items[i]))
            out->items[out->n++] = all->items[i];
    return PX_OK;
}

static void reject(px_heal_candidate *c, const char *code, const char *fmt, ...) PX_PRINTF(3, 4);
static void reject(px_heal_candidate *c, const char *code, const char *fmt, ...)
{
    c->accepted = false;
    px_strlcpy(c->reject_code, code, sizeof c->reject_code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reject_reason, sizeof c->reject_reason, fmt, ap);
    va_end(ap);
}

/* Region names of the model for one tensor class of the plan's precision. */
static size_t regions_for(const px_ir_model *m, const char *tensors, const char **names, size_t cap)
{
    size_t n = 0, total = px_ir_model_n_regions(m);
    for (size_t i = 0; i < total && n < cap; i++) {
        const px_ir_region *r = px_ir_model_region(m, i);
        bool take;
        if (!strcmp(tensors, "ffn_weights"))
            take = r->kind == PX_IR_REGION_FFN;
        else if (!strcmp(tensors, "kv"))
            take = r->kind == PX_IR_REGION_ATTENTION;
        else if (!strcmp(tensors, "weights"))
            take = r->kind != PX_IR_REGION_FFN;
        else
            take = true;
        if (take)
            names[n++] = r->name;
    }
    return n;
}

/* Whether the plan's precisions keep the context's contract, for a plan
 * made under another contract: every precision that differs from the
 * current plan's is judged on the regions it touches. */
static px_status judge_precision(const px_heal_context *ctx, const json_t *doc, bool *ok, char *why,
                                 size_t cap, px_err *err)
{
    *ok = true;
    const json_t *now = json_object_get(doc, "precision");
    const json_t *was = ctx->current_plan ? json_object_get(ctx->current_plan, "precision") : NULL;
    if (!was) {
        *ok = false;
        px__heal_textf(why, cap,
                       "it was planned under another contract and there is no current plan "
                       "to compare its precision with");
        return PX_OK;
    }
    static const char *const classes[] = {"weights", "ffn_weights", "activations", "kv"};
    static const unsigned tensors[] = {PX_TENSORS_WEIGHTS, PX_TENSORS_WEIGHTS,
                                       PX_TENSORS_ACTIVATIONS, PX_TENSORS_KV};
    for (size_t k = 0; k < PX_ARRAY_LEN(classes); k++) {
        const char *to = json_string_value(json_object_get(now, classes[k]));
        const char *from = json_string_value(json_object_get(was, classes[k]));
        if (!to || (from && !strcmp(to, from)))
            continue;
        if (!ctx->contract) {
            *ok = false;
            px__heal_textf(why, cap, "%s %s -> %s: the implied contract keeps the stored precision",
                           classes[k], from ? from : "?", to);
            return PX_OK;
        }
        size_t total = px_ir_model_n_regions(ctx->model);
        const char **names = malloc((total ? total : 1) * sizeof *names);
        if (!names)
            return px_err_set(err, PX_ENOMEM, "out of memory judging a precision");
        size_t n = regions_for(ctx->model, classes[k], names, total);
        px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                          .tensors = tensors[k],
                          .from_dtype = from && px_contract_dtype_known(from) ? from : NULL,
                          .to_dtype = to};
        px_contract_decision d;
        px_err e;
        px_status st =
            n ? px_contract_evaluate_all(ctx->contract, names, n, &t, 1, NULL, 0, &d, &e) : PX_OK;
        free(names);
        if (st == PX_ENOMEM)
            return px_err_set(err, st, "%s", e.msg);
        if (st != PX_OK) {
            *ok = false;
            px__heal_textf(why, cap, "%s %s -> %s cannot be judged: %.160s", classes[k],
                           from ? from : "?", to, e.msg);
            return PX_OK;
        }
        if (n && d.verdict == PX_VERDICT_FORBIDDEN) {
            *ok = false;
            px__heal_textf(why, cap, "%s %s -> %s is forbidden by contract \"%s\" (%s): %.120s",
                           classes[k], from ? from : "?", to,
                           px_contract_name(ctx->contract) ? px_contract_name(ctx->contract) : "?",
                           px_contract_reason_name(d.reason), d.message);
        }
        if (n)
            px_contract_decision_release(&d);
        if (!*ok)
            return PX_OK;
    }
    return PX_OK;
}

static px_status check_contract(const px_heal_context *ctx, const json_t *doc, bool *ok, char *why,
                                size_t cap, px_err *err)
{
    *ok = false;
    const json_t *k = json_object_get(doc, "contract");
    const char *verdict = json_string_value(json_object_get(k, "verdict"));
    const char *name = json_string_value(json_object_get(k, "name"));
    const char *digest = json_string_value(json_object_get(k, "digest"));
    if (!verdict) {
        px__heal_textf(why, cap, "the plan has no contract verdict (/contract/verdict)");
        return PX_OK;
    }
    if (strcmp(verdict, "allowed") && strcmp(verdict, "allowed-after-validation")) {
        px__heal_textf(why, cap, "the plan's contract verdict is \"%.40s\"", verdict);
        return PX_OK;
    }
    bool same;
    if (ctx->contract) {
        char hex[65];
        same = px_contract_digest(ctx->contract, hex) == PX_OK && digest && !strcmp(hex, digest);
    } else {
        same = name && !strcmp(name, "implied");
    }
    if (same) {
        *ok = true;
        return PX_OK;
    }
    return judge_precision(ctx, doc, ok, why, cap, err);
}

typedef struct figures {
    double p50, p99, ttft_p99, tput, completed;
} figures;

/* Simulates doc (with the batch capped at max_batch when not 0). */
static px_status simulate(const px_heal_context *ctx, const json_t *doc, uint32_t max_batch,
                          const px_sim_load *load, const px_sim_faults *conditions, figures *out,
                          px_err *err)
{
    px_sim_plan plan;
    px_status st = px_sim_plan_from_json(doc, ctx->graph, &plan, err);
    if (st != PX_OK)
        return st;
    for (size_t r = 0; max_batch && r < plan.n_replicas; r++)
        if (plan.replicas[r].batch > max_batch)
            plan.replicas[r].batch = max_batch;
    px_sim_faults f;
    if (filter(&plan, conditions, &f) != PX_OK) {
        px_sim_plan_release(&plan);
        return px_err_set(err, PX_ENOMEM, "out of memory filtering conditions");
    }
    px_sim_options opt;
    px_sim_options_default(&opt);
    opt.seed = ctx->seed;
    opt.replications = ctx->replications ? ctx->replications : 3;
    opt.duration_s = ctx->duration_s > 0 ? ctx->duration_s : 30;
    opt.random_failures = false;
    px_sim_result res;
    st = px_sim_run(&plan, load, f.n ? &f : NULL, &opt, &res, err);
    free(f.items);
    px_sim_plan_release(&plan);
    if (st != PX_OK)
        return st;
    *out = (figures){.p50 = res.mean.tpot_p50_s,
                     .p99 = res.mean.tpot_p99_s,
                     .ttft_p99 = res.mean.ttft_p99_s,
                     .tput = res.mean.tokens_per_s,
                     .completed = res.mean.completed};
    px_sim_result_release(&res);
    return PX_OK;
}

static bool uses_current(px_heal_action a)
{
    return a == PX_HEAL_ACT_NONE || a == PX_HEAL_ACT_PACE || a == PX_HEAL_ACT_RESTART_WORKER;
}

static px_status judge(const px_heal_context *ctx, px_heal_candidate *c, const px_sim_load *load,
                       const px_sim_faults *conditions, double current_tput, px_err *err)
{
    const json_t *doc = c->plan ? c->plan : uses_current(c->action) ? ctx->current_plan : NULL;
    if (!doc) {
        c->feasible = false;
        reject(c, "infeasible",
               c->plan || uses_current(c->action)
                   ? "no current plan was given to validate it on (px_heal_context.current_plan)"
                   : "it has no plan");
        return PX_OK;
    }
    char why[256];
    px_status st = check_contract(ctx, doc, &c->contract_ok, why, sizeof why, err);
    if (st != PX_OK)
        return st;
    if (!c->contract_ok) {
        reject(c, "contract", "%s", why);
        return PX_OK;
    }
    figures f;
    px_err e;
    px_err_clear(&e);
    st = simulate(ctx, doc, c->action == PX_HEAL_ACT_PACE ? c->max_batch : 0, load, conditions, &f,
                  &e);
    if (st == PX_ENOMEM)
        return px_err_set(err, st, "%s", e.msg);
    if (st != PX_OK) {
        c->feasible = false;
        reject(c, "infeasible", "the simulator refuses it: %.200s", e.msg);
        return PX_OK;
    }
    c->validated = true;
    c->tpot_p50_s = f.p50;
    c->tpot_p99_s = f.p99;
    c->throughput = f.tput;
    if (!(f.completed > 0) || !(f.tput > 0) || !isfinite(f.p99)) {
        c->feasible = false;
        reject(c, "infeasible", "under the observed conditions it completes no request");
        return PX_OK;
    }
    c->feasible = true;
    double slo = ctx->slo.tpot_s;
    char p99[32], lim[32];
    px__heal_fmt_s(f.p99, p99, sizeof p99);
    px__heal_fmt_s(slo, lim, sizeof lim);
    if (slo > 0 && f.p99 > slo) {
        if (isfinite(current_tput) && f.tput > current_tput)
            reject(c, "tail-latency",
                   "%.4g tokens/s beats the current %.4g, but its p99 time per token %s breaks "
                   "the SLO of %s",
                   f.tput, current_tput, p99, lim);
        else
            reject(c, "slo", "its p99 time per token %s breaks the SLO of %s", p99, lim);
        return PX_OK;
    }
    c->slo_ok = true;
    if (ctx->slo.ttft_s > 0 && f.ttft_p99 > ctx->slo.ttft_s) {
        char t[32], tl[32];
        px__heal_fmt_s(f.ttft_p99, t, sizeof t);
        px__heal_fmt_s(ctx->slo.ttft_s, tl, sizeof tl);
        c->slo_ok = false;
        reject(c, "slo", "its p99 time to first token %s breaks the SLO of %s", t, tl);
        return PX_OK;
    }
    c->accepted = true;
    c->reject_code[0] = c->reject_reason[0] = 0;
    return PX_OK;
}

px_status px_heal_validate(const px_heal_context *ctx, px_heal_candidate *c, size_t n,
                           const px_sim_faults *conditions, int *chosen, px_err *err)
{
    *chosen = -1;
    if (!ctx || !ctx->graph || !ctx->model || (n && !c))
        return px_err_set(err, PX_EINVAL,
                          "heal: validation needs a context with a graph and a "
                          "model, and the candidates");
    /* The yardstick: the current plan's load and its throughput under the
     * same conditions; without a current plan, the first candidate's. */
    const json_t *ref = ctx->current_plan;
    for (size_t i = 0; !ref && i < n; i++)
        ref = c[i].plan;
    if (!ref) {
        for (size_t i = 0; i < n; i++) {
            c[i].accepted = c[i].validated = false;
            if (!c[i].infeasible_at_generation)
                reject(&c[i], "infeasible", "neither it nor the current plan has a plan document");
        }
        return PX_OK;
    }
    px_sim_load load;
    px_status st = make_load(ctx, ref, &load, err);
    if (st != PX_OK)
        return st;
    double current_tput = NAN;
    if (ctx->current_plan) {
        figures f;
        px_err e;
        px_err_clear(&e);
        st = simulate(ctx, ctx->current_plan, 0, &load, conditions, &f, &e);
        if (st == PX_ENOMEM)
            return px_err_set(err, st, "%s", e.msg);
        if (st == PX_OK)
            current_tput = f.tput;
    }
    for (size_t i = 0; i < n; i++) {
        px_heal_candidate *x = &c[i];
        x->validated = x->accepted = x->contract_ok = x->slo_ok = false;
        x->tpot_p50_s = x->tpot_p99_s = x->throughput = NAN;
        /* Rejected when generated (no placement): keep that reason. */
        if (x->infeasible_at_generation)
            continue;
        x->feasible = true;
        x->reject_code[0] = x->reject_reason[0] = 0;
        st = judge(ctx, x, &load, conditions, current_tput, err);
        if (st != PX_OK)
            return st;
    }
    double slo = ctx->slo.tpot_s;
    int best = -1;
    double best_margin = -INFINITY, best_p99 = INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!c[i].accepted)
            continue;
        double margin = slo > 0 ? (slo - c[i].tpot_p99_s) / slo : 0;
        if (margin > best_margin || (margin == best_margin && c[i].tpot_p99_s < best_p99)) {
            best = (int)i;
            best_margin = margin;
            best_p99 = c[i].tpot_p99_s;
        }
    }
    *chosen = best;
    return PX_OK;
}
