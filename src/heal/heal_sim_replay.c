/* Replay of healing in the simulator: the options as JSON, and the
 * derivers of what `plexus simulate --heal --trace` records.  A decision
 * ("heal-sim.decision") is recomputed from its recorded trigger and
 * candidates; the whole run ("simulate-heal") is run again from the
 * recorded inputs, the engine and the healer being deterministic. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

#define OPTS_FIX                                                                            \
    "; plexus records no such options: replay the trace as plexus simulate --heal --trace " \
    "wrote it, or run the simulation again"

void px__hs_request_from_plan(const json_t *doc, px_plan_request *req)
{
    const char *policy = json_string_value(json_object_get(doc, "policy"));
    if (policy && px_plan_policy_exists(policy))
        req->policy = policy;
    const char *obj = json_string_value(json_object_get(json_object_get(doc, "objective"), "name"));
    px_plan_objective o;
    if (obj && px_plan_objective_parse(obj, &o, NULL) == PX_OK)
        req->objective = o;
    const json_t *wl = json_object_get(doc, "workload");
    json_int_t v;
#define PX__HS_WL(field)                                 \
    v = json_integer_value(json_object_get(wl, #field)); \
    if (v > 0 && v < UINT32_MAX)                         \
        req->workload.field = (uint32_t)v;
    PX__HS_WL(batch)
    PX__HS_WL(micro_batches)
    PX__HS_WL(context)
    PX__HS_WL(prompt_tokens)
    PX__HS_WL(gen_tokens)
#undef PX__HS_WL
}

json_t *px__hs_opts_to_json(const px_heal_sim_opts *o)
{
    return json_pack("{s:f, s:f, s:f, s:i, s:f, s:i, s:b, s:f, s:f, s:f, s:b, s:f, s:f, s:i, s:f,"
                     " s:b, s:f, s:f, s:I, s:i, s:f}",
                     "tick_s", o->tick_s, "heartbeat_timeout_s", o->heartbeat_timeout_s, "switch_s",
                     o->switch_s, "baseline_ticks", (int)o->baseline_ticks, "ratio", o->ratio,
                     "confirm", (int)o->confirm, "hysteresis", o->hysteresis, "exit_ratio",
                     o->exit_ratio, "min_dwell_s", o->min_dwell_s, "hold_s", o->hold_s,
                     "thermal_predictive", o->thermal_predictive, "thermal_horizon_s",
                     o->thermal_horizon_s, "thermal_margin_k", o->thermal_margin_k, "canary_ticks",
                     (int)o->canary_ticks, "canary_tolerance", o->canary_tolerance, "heal", o->heal,
                     "slo_tpot_s", o->ctx.slo.tpot_s, "slo_ttft_s", o->ctx.slo.ttft_s, "seed",
                     (json_int_t)o->ctx.seed, "replications", (int)o->ctx.replications,
                     "duration_s", o->ctx.duration_s);
}

px_status px__hs_opts_from_json(const json_t *v, px_heal_sim_opts *o, px_err *err)
{
    if (!json_is_object(v))
        return px_err_set(err, PX_EPARSE, "heal options: expected an object%s", OPTS_FIX);
    json_t *tick = NULL, *hb = NULL, *sw = NULL, *ratio = NULL, *ex = NULL, *dw = NULL,
           *hold = NULL, *hz = NULL, *mg = NULL, *tol = NULL, *slo = NULL, *ttft = NULL,
           *dur = NULL;
    int bt = 0, cf = 0, hy = 0, tp = 0, ct = 0, heal = 0, reps = 0;
    json_int_t seed = 0;
    json_error_t je;
    if (json_unpack_ex((json_t *)v, &je, JSON_STRICT,
                       "{s:o, s:o, s:o, s:i, s:o, s:i, s:b, s:o, s:o, s:o, s:b, s:o, s:o, s:i, "
                       "s:o, s:b, s:o, s:o, s:I, s:i, s:o}",
                       "tick_s", &tick, "heartbeat_timeout_s", &hb, "switch_s", &sw,
                       "baseline_ticks", &bt, "ratio", &ratio, "confirm", &cf, "hysteresis", &hy,
                       "exit_ratio", &ex, "min_dwell_s", &dw, "hold_s", &hold, "thermal_predictive",
                       &tp, "thermal_horizon_s", &hz, "thermal_margin_k", &mg, "canary_ticks", &ct,
                       "canary_tolerance", &tol, "heal", &heal, "slo_tpot_s", &slo, "slo_ttft_s",
                       &ttft, "seed", &seed, "replications", &reps, "duration_s", &dur) != 0)
        return px_err_set(err, PX_EPARSE, "heal options: %s%s", je.text, OPTS_FIX);
    json_t *nums[] = {tick, hb, sw, ratio, ex, dw, hold, hz, mg, tol, slo, ttft, dur};
    static const char *const num_names[] = {
        "tick_s",           "heartbeat_timeout_s", "switch_s",   "ratio",
        "exit_ratio",       "min_dwell_s",         "hold_s",     "thermal_horizon_s",
        "thermal_margin_k", "canary_tolerance",    "slo_tpot_s", "slo_ttft_s",
        "duration_s"};
    _Static_assert(PX_ARRAY_LEN(nums) == PX_ARRAY_LEN(num_names), "a name per figure");
    for (size_t i = 0; i < PX_ARRAY_LEN(nums); i++)
        if (!json_is_number(nums[i]) || !isfinite(json_number_value(nums[i])))
            return px_err_set(err, PX_EPARSE, "heal options: \"%s\" is not a finite number%s",
                              num_names[i], OPTS_FIX);
    const struct {
        const char *name;
        int v, hi;
    } counts[] = {{"baseline_ticks", bt, INT32_MAX},
                  {"confirm", cf, INT32_MAX},
                  {"canary_ticks", ct, INT32_MAX},
                  {"replications", reps, 1000}};
    for (size_t i = 0; i < PX_ARRAY_LEN(counts); i++)
        if (counts[i].v < 1 || counts[i].v > counts[i].hi)
            return px_err_set(err, PX_EPARSE, "heal options: \"%s\" is %d; it must be 1 to %d%s",
                              counts[i].name, counts[i].v, counts[i].hi, OPTS_FIX);
    o->tick_s = json_number_value(tick);
    o->heartbeat_timeout_s = json_number_value(hb);
    o->switch_s = json_number_value(sw);
    o->baseline_ticks = (uint32_t)bt;
    o->ratio = json_number_value(ratio);
    o->confirm = (uint32_t)cf;
    o->hysteresis = hy;
    o->exit_ratio = json_number_value(ex);
    o->min_dwell_s = json_number_value(dw);
    o->hold_s = json_number_value(hold);
    o->thermal_predictive = tp;
    o->thermal_horizon_s = json_number_value(hz);
    o->thermal_margin_k = json_number_value(mg);
    o->canary_ticks = (uint32_t)ct;
    o->canary_tolerance = json_number_value(tol);
    o->heal = heal;
    o->ctx.slo.tpot_s = json_number_value(slo);
    o->ctx.slo.ttft_s = json_number_value(ttft);
    o->ctx.seed = (uint64_t)seed;
    o->ctx.replications = (uint32_t)reps;
    o->ctx.duration_s = json_number_value(dur);
    return PX_OK;
}

/* ---- one decision ---- */

static px_status derive_decision(void *ctx, const px_trace_event *rec, const json_t *history,
                                 json_t **out, px_err *err)
{
    (void)ctx;
    (void)history;
    *out = NULL;
    const json_t *in = rec->inputs;
    const json_t *trigger = json_object_get(in, "trigger");
    const json_t *cands = json_object_get(in, "candidates");
    if (!json_is_object(trigger) || !json_is_array(cands) || json_array_size(cands) > 1024)
        return px_err_set(err, PX_EPARSE,
                          "heal-sim.decision: the inputs lack the trigger or the candidates");
    px_heal_fault_class cls;
    px_heal_locus where;
    bool intermittent;
    char evidence[320];
    px__hs_classify(trigger, &cls, &where, &intermittent, evidence, sizeof evidence);
    size_t n = json_array_size(cands);
    char(*codes)[32] = calloc(n ? n : 1, sizeof *codes);
    if (!codes)
        return px_err_set(err, PX_ENOMEM, "heal-sim.decision: out of memory");
    const char *hot = json_string_value(json_object_get(in, "hot"));
    double slo = json_number_value(json_object_get(in, "slo_tpot_s"));
    int chosen = px__hs_choose(cands, hot && hot[0] ? hot : NULL, slo, codes, n);
    json_t *code_arr = json_array();
    for (size_t i = 0; code_arr && i < n; i++)
        json_array_append_new(code_arr, json_string(codes[i]));
    free(codes);
    *out = json_pack("{s:s, s:o, s:b, s:i, s:o}", "class", px_heal_fault_class_name(cls), "locus",
                     px_heal_locus_to_json(&where), "intermittent", intermittent, "chosen", chosen,
                     "codes", code_arr);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "heal-sim.decision: out of memory");
}

/* ---- the whole run ---- */

static px_status faults_from(const json_t *doc, px_sim_faults *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!doc || json_is_null(doc))
        return PX_OK;
    char *text = px_json_dump_line(doc);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "simulate-heal: out of memory");
    px_status st = px_sim_faults_parse(text, strlen(text), "recorded faults", out, err);
    free(text);
    return st;
}

static px_status derive_run(void *ctx, const px_trace_event *rec, const json_t *history,
                            json_t **out, px_err *err)
{
    (void)ctx;
    (void)rec;
    *out = NULL;
    const json_t *plan_doc = json_object_get(history, "plan");
    const json_t *inv_doc = json_object_get(history, "inventory");
    const json_t *model_doc = json_object_get(history, "model");
    const json_t *load_doc = json_object_get(history, "load");
    const json_t *opt_doc = json_object_get(history, "options");
    const json_t *heal_doc = json_object_get(history, "heal");
    const char *ref = json_string_value(json_object_get(model_doc, "ref"));
    if (!plan_doc || !inv_doc || !ref || !load_doc || !opt_doc || !heal_doc)
        return px_err_set(err, PX_EPARSE,
                          "simulate-heal: the trace lacks the plan, inventory, model, load, "
                          "options or heal input");
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_heal_sim *h = NULL;
    px_sim_load load = {0};
    px_sim_faults faults = {0};
    px_sim_result res = {0};
    px_sim_options opt;
    px_heal_sim_opts ho;
    px_heal_sim_opts_default(&ho);
    px_status st;
    if ((st = px_hw_graph_from_value(inv_doc, "inventory", NULL, &graph, NULL, err)) != PX_OK ||
        (st = px_ir_model_open_any(!strncmp(ref, "preset:", 7) ? ref + 7 : ref, NULL, &model,
                                   err)) != PX_OK ||
        (st = px_sim_load_from_json(load_doc, &load, err)) != PX_OK ||
        (st = px_sim_options_from_json(opt_doc, &opt, err)) != PX_OK ||
        (st = faults_from(json_object_get(history, "faults"), &faults, err)) != PX_OK ||
        (st = px__hs_opts_from_json(heal_doc, &ho, err)) != PX_OK)
        goto done;
    ho.ctx.graph = graph;
    ho.ctx.model = model;
    ho.plan = plan_doc;
    if ((st = px_heal_sim_new(&ho, &h, err)) != PX_OK ||
        (st = px_heal_sim_run(h, &load, faults.n ? &faults : NULL, &opt, &res, err)) != PX_OK)
        goto done;
    *out = px_heal_sim_result_to_json(h, &res);
    if (!*out)
        st = px_err_set(err, PX_ENOMEM, "simulate-heal: out of memory");
done:
    px_sim_result_release(&res);
    px_heal_sim_free(h);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    return st;
}

static const char *const input_names[7] = {"plan",   "inventory", "model", "load",
                                           "faults", "options",   "heal"};

json_t *px_heal_sim_result_to_json(const px_heal_sim *h, const px_sim_result *res)
{
    return json_pack("{s:o, s:o}", "result", px_sim_result_to_json(res, px_heal_sim_plan(h)),
                     "incidents", px_heal_sim_incidents(h));
}

px_status px_heal_sim_trace_begin(px_heal_sim *h, px_trace_writer *w, const json_t *inventory_doc,
                                  const px_sim_load *load, const px_sim_faults *faults,
                                  const px_sim_options *opt, px_err *err)
{
    if (!w || !inventory_doc)
        return px_err_set(err, PX_EINVAL, "heal: a trace needs the writer and the inventory");
    const json_t *plan = h->plans[0]->doc;
    const char *ref =
        h->o.model_ref ? h->o.model_ref
                       : json_string_value(json_object_get(json_object_get(plan, "model"), "id"));
    json_t *model = json_pack("{s:s}", "ref", ref ? ref : "");
    json_t *load_doc = px_sim_load_to_json(load);
    json_t *faults_doc = faults ? px_sim_faults_to_json(faults) : json_null();
    json_t *opt_doc = px_sim_options_to_json(opt);
    json_t *heal_doc = px__hs_opts_to_json(&h->o);
    px_status st = PX_OK;
    if (!model || !load_doc || !faults_doc || !opt_doc || !heal_doc) {
        st = px_err_set(err, PX_ENOMEM, "heal: out of memory writing the trace");
        goto done;
    }
    const json_t *docs[7] = {plan, inventory_doc, model, load_doc, faults_doc, opt_doc, heal_doc};
    for (size_t i = 0; i < 7; i++)
        if ((st = px_trace_input(w, input_names[i], docs[i], h->input_ids[i], err)) != PX_OK)
            goto done;
    for (size_t i = 0; faults && i < faults->n; i++)
        if ((st = px_trace_fault(w, "injected",
                                 json_array_get(json_object_get(faults_doc, "faults"), i), err)) !=
            PX_OK)
            goto done;
done:
    json_decref(model);
    json_decref(load_doc);
    json_decref(faults_doc);
    json_decref(opt_doc);
    json_decref(heal_doc);
    return st;
}

px_status px_heal_sim_trace_end(px_heal_sim *h, px_trace_writer *w, const px_sim_result *res,
                                px_err *err)
{
    json_t *out = px_heal_sim_result_to_json(h, res);
    /* Named by their content hashes: the same inputs, the same id. */
    json_t *in = json_object();
    for (size_t i = 0; in && i < 7; i++)
        if (px_json_set(in, input_names[i], json_string(h->input_ids[i])) != PX_OK) {
            json_decref(in);
            in = NULL;
        }
    px_status st;
    if (!out || !in)
        st = px_err_set(err, PX_ENOMEM, "heal: out of memory writing the trace");
    else if ((st = px_trace_decision(w, "simulate-heal", in, out, NULL, err)) == PX_OK)
        st = px_trace_outcome(w, "simulate-heal", json_object_get(out, "incidents"), err);
    json_decref(in);
    json_decref(out);
    return st;
}

static const px_trace_deriver derivers[] = {
    {"heal-sim.decision", derive_decision},
    {"simulate-heal", derive_run},
};

const px_trace_deriver *px_heal_sim_replay_derivers(size_t *n)
{
    if (n)
        *n = PX_ARRAY_LEN(derivers);
    return derivers;
}
