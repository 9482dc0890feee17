/* Healing real runs: replay.  Each decision a healing run records is
 * recomputed from the trace alone: the detector over the recorded steps,
 * the mitigation (localization, candidates planned on the recorded
 * inventory and model, validated in the simulator with the recorded
 * seed), the canary over the recorded steps, and the rollback's target.
 * Observations are taken from the trace by the names the decision's
 * inputs list, so that a changed observation changes the decision. */
#include "heal/heal_run_impl.h"

#define MAX_SAMPLES 100000

static const json_t *need(const json_t *history, const char *name, px_err *err)
{
    const json_t *v = name ? json_object_get(history, name) : NULL;
    if (!v)
        px_err_set(err, PX_EPARSE, "heal: the trace lacks \"%s\" before this decision",
                   name ? name : "(unnamed)");
    return v;
}

/* The samples the names in `names` refer to; *walls (may be NULL) gets
 * their wall times.  Returns owned arrays (free). */
static px_status samples_of(const json_t *history, const json_t *names, px_heal_sample **out,
                            double **walls, size_t *n, px_err *err)
{
    *out = NULL;
    if (walls)
        *walls = NULL;
    *n = json_array_size(names);
    if (!json_is_array(names) || *n == 0 || *n > MAX_SAMPLES)
        return px_err_set(err, PX_EPARSE,
                          "heal: the decision's \"samples\" is not a list of 1 to %d names",
                          MAX_SAMPLES);
    px_heal_sample *s = calloc(*n, sizeof *s);
    double *w = calloc(*n, sizeof *w);
    if (!s || !w) {
        free(s);
        free(w);
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    }
    for (size_t i = 0; i < *n; i++) {
        const char *name = json_string_value(json_array_get(names, i));
        const json_t *obs = need(history, name, err);
        px_status st = obs ? px__hr_sample_from_json(obs, name, &s[i], &w[i], err) : PX_EPARSE;
        if (st != PX_OK) {
            free(s);
            free(w);
            return st;
        }
    }
    *out = s;
    if (walls)
        *walls = w;
    else
        free(w);
    return PX_OK;
}

static px_status derive_detect(void *ctx, const px_trace_event *rec, const json_t *history,
                               json_t **out, px_err *err)
{
    (void)ctx;
    *out = NULL;
    px_heal_envelope env;
    px_heal_detector_opts o;
    px_status st;
    if ((st = px__hr_envelope_from_json(json_object_get(rec->inputs, "envelope"), &env, err)) ||
        (st = px__hr_detector_opts_from_json(json_object_get(rec->inputs, "detector"), &o, err)))
        return st;
    px_heal_sample *s;
    size_t n;
    if ((st = samples_of(history, json_object_get(rec->inputs, "samples"), &s, NULL, &n, err)))
        return st;
    px_heal_finding f;
    st = px__hr_detect(&env, &o, s, n, &f, out, err);
    free(s);
    return st;
}

static px_status derive_canary(void *ctx, const px_trace_event *rec, const json_t *history,
                               json_t **out, px_err *err)
{
    (void)ctx;
    *out = NULL;
    const json_t *in = rec->inputs;
    double p50 = json_number_value(json_object_get(in, "pred_p50_s"));
    double hi = json_number_value(json_object_get(in, "pred_hi_s"));
    double ratio = json_number_value(json_object_get(in, "ratio"));
    double tol = json_number_value(json_object_get(in, "tolerance"));
    json_int_t need_steps = json_integer_value(json_object_get(in, "need"));
    if (!isfinite(p50) || !isfinite(hi) || !(ratio > 0) || !isfinite(ratio) || !(tol > 0) ||
        need_steps < 1 || need_steps > 64)
        return px_err_set(err, PX_EPARSE,
                          "heal: the canary's recorded inputs are out of range (pred_p50_s, "
                          "pred_hi_s, ratio > 0, tolerance > 0, need 1..64)");
    px_heal_sample *s;
    double *w;
    size_t n;
    px_status st = samples_of(history, json_object_get(in, "samples"), &s, &w, &n, err);
    if (st != PX_OK)
        return st;
    px_heal_canary_verdict v;
    *out = px__hr_canary_json(p50, hi, ratio, (uint32_t)need_steps, tol, w, n, &v);
    free(s);
    free(w);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "heal: out of memory");
}

static px_status derive_rollback(void *ctx, const px_trace_event *rec, const json_t *history,
                                 json_t **out, px_err *err)
{
    (void)ctx;
    *out = NULL;
    const json_t *m = need(history, "heal.mitigation", err);
    if (!m)
        return PX_EPARSE;
    const json_t *tried = json_object_get(rec->inputs, "tried");
    const json_t *cands = json_object_get(m, "candidates");
    int next = -1;
    for (size_t k = 0; k < json_array_size(cands) && k < 32; k++) {
        if (!json_is_true(json_object_get(json_array_get(cands, k), "accepted")))
            continue;
        bool was = false;
        for (size_t j = 0; j < json_array_size(tried); j++)
            was |= json_integer_value(json_array_get(tried, j)) == (json_int_t)k;
        if (!was) {
            next = (int)k;
            break;
        }
    }
    bool prev = json_is_true(json_object_get(rec->inputs, "previous_viable"));
    *out = json_pack("{s:s, s:i}", "to",
                     next >= 0 ? "next-candidate"
                     : prev    ? "previous-plan"
                               : "stay",
                     "candidate", next);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "heal: out of memory");
}

/* ---- the mitigation: the recorded world rebuilt ---- */

/* The class and place of the cause the mitigation names. */
static px_status cause_of(const json_t *history, const char *cause, px_heal_fault_class *cls,
                          px_heal_locus *where, px_heal_finding *f, bool *has_finding, px_err *err)
{
    *has_finding = false;
    const json_t *c = need(history, cause, err);
    if (!c)
        return PX_EPARSE;
    if (!strcmp(cause, "heal.failure")) {
        px__hr_classify_failure(c, cls, where);
        return PX_OK;
    }
    if (!strcmp(cause, "heal.audit")) {
        json_int_t bad = json_integer_value(json_object_get(c, "first_bad"));
        const json_t *stages = json_object_get(c, "stages");
        const json_t *st = NULL;
        for (size_t i = 0; i < json_array_size(stages); i++)
            if (json_integer_value(json_object_get(json_array_get(stages, i), "stage")) == bad)
                st = json_array_get(stages, i);
        const char *dev = json_string_value(json_object_get(st, "device"));
        if (bad < 0 || !dev)
            return px_err_set(err, PX_EPARSE, "heal: the recorded audit names no departing stage");
        memset(where, 0, sizeof *where);
        where->kind = PX_HEAL_AT_DEVICE;
        where->stage = (uint32_t)bad;
        px_strlcpy(where->device, dev, sizeof where->device);
        *cls = PX_HEAL_CORRUPTION;
        return PX_OK;
    }
    if (!strcmp(cause, "heal.detect")) {
        *cls = px__hr_class_from_name(json_string_value(json_object_get(c, "class")));
        px__hr_locus_from_json(json_object_get(c, "locus"), where);
        const json_t *fj = json_object_get(c, "finding");
        memset(f, 0, sizeof *f);
        f->cls = *cls;
        f->locus = *where;
        f->baseline_s = json_number_value(json_object_get(fj, "baseline_s"));
        f->observed_s = json_number_value(json_object_get(fj, "observed_s"));
        if (!json_is_number(json_object_get(fj, "baseline_s")))
            f->baseline_s = NAN;
        if (!json_is_number(json_object_get(fj, "observed_s")))
            f->observed_s = NAN;
        *has_finding = true;
        return PX_OK;
    }
    return px_err_set(err, PX_EPARSE, "heal: the mitigation's cause \"%s\" is unknown", cause);
}

static px_status derive_mitigation(void *ctxp, const px_trace_event *rec, const json_t *history,
                                   json_t **out, px_err *err)
{
    (void)ctxp;
    *out = NULL;
    const json_t *in = rec->inputs;
    const json_t *inv = need(history, "inventory", err);
    const json_t *model_doc = inv ? need(history, "model", err) : NULL;
    const json_t *contract_doc = model_doc ? need(history, "contract", err) : NULL;
    const json_t *ctx_doc =
        contract_doc ? need(history, json_string_value(json_object_get(in, "context")), err) : NULL;
    const json_t *plan =
        ctx_doc ? need(history, json_string_value(json_object_get(in, "plan")), err) : NULL;
    const char *cause = json_string_value(json_object_get(in, "cause"));
    if (!plan)
        return PX_EPARSE;
    px_heal_context ctx;
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_contract *contract = NULL;
    px_heal_fault_class cls;
    px_heal_locus where;
    px_heal_finding f;
    bool has_f;
    int chosen;
    px_status st;
    if ((st = px__hr_context_from_json(ctx_doc, &ctx, err)) ||
        (st = cause_of(history, cause, &cls, &where, &f, &has_f, err)) ||
        (st = px_hw_graph_from_value(inv, "recorded inventory", NULL, &graph, NULL, err)) ||
        (st = px_plan_trace_open_model(model_doc, &model, err)) ||
        (st = px_plan_trace_open_contract(contract_doc, &contract, err)))
        goto done;
    ctx.graph = graph;
    ctx.model = model;
    ctx.contract = contract;
    ctx.request.graph = graph;
    ctx.request.model = model;
    ctx.request.contract = contract;
    st = px__hr_decide(&ctx, plan, cls, &where, json_object_get(in, "lost"), has_f ? &f : NULL, out,
                       NULL, NULL, &chosen, err);
done:
    px_contract_free(contract);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    return st;
}

static const px_trace_deriver derivers[] = {
    {"heal.detect", derive_detect},
    {"heal.mitigation", derive_mitigation},
    {"heal.canary", derive_canary},
    {"heal.rollback", derive_rollback},
};

const px_trace_deriver *px_heal_replay_derivers(size_t *n)
{
    if (n)
        *n = PX_ARRAY_LEN(derivers);
    return derivers;
}
