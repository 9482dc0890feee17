/* Recording a planning run in a trace and re-deriving it on replay.
 *
 * The "plan" decision is a pure function of four recorded inputs: the
 * inventory document, the model reference, the contract and the request
 * options.  Replay rebuilds each one, runs the search again and returns the
 * same canonical document `plexus plan --out` writes, so replay compares
 * like with like.  A model file is re-opened by its recorded path and its
 * SHA-256 must match: a changed or missing file is refused, not replanned. */
#include "base/common.h"

#include "plexus/plan.h"

/* The hyper-parameters that shape a plan, recorded with the model so a
 * reader of the trace sees what was planned for without the file. */
static json_t *hparams_json(const px_ir_model *m)
{
    const px_ir_hparams *h = px_ir_model_hparams(m);
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "arch",
                     px_ir_arch_name(h->arch), "name", h->name, "dim", (json_int_t)h->dim,
                     "hidden_dim", (json_int_t)h->hidden_dim, "n_layers", (json_int_t)h->n_layers,
                     "n_heads", (json_int_t)h->n_heads, "n_kv_heads", (json_int_t)h->n_kv_heads,
                     "head_dim", (json_int_t)h->head_dim, "vocab_size", (json_int_t)h->vocab_size,
                     "n_experts", (json_int_t)h->n_experts);
}

static json_t *request_json(const px_plan_request *req)
{
    const px_cost_workload *wl = &req->workload;
    return json_pack(
        "{s:s, s:f, s:f, s:f, s:s, s:b, s:b, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I}}", "objective",
        px_plan_objective_name(req->objective), "slo_tpot_s", req->slo.tpot_s, "slo_ttft_s",
        req->slo.ttft_s, "budget_usd_per_hour", req->slo.budget_usd_h, "policy",
        req->policy ? req->policy : "plexus", "compare_baselines", req->compare_baselines,
        "fallbacks", req->fallbacks, "max_rejected", (json_int_t)req->max_rejected, "max_tp",
        (json_int_t)req->max_tp, "workload", "batch", (json_int_t)wl->batch, "micro_batches",
        (json_int_t)wl->micro_batches, "context", (json_int_t)wl->context, "prompt_tokens",
        (json_int_t)wl->prompt_tokens, "gen_tokens", (json_int_t)wl->gen_tokens);
}

static px_status model_json(const char *spec, const px_ir_model *m, json_t **out, px_err *err)
{
    *out = NULL;
    json_t *hp = hparams_json(m);
    if (!hp)
        return px_err_set(err, PX_ENOMEM, "trace: out of memory");
    if (px_ir_model_source(m) == PX_IR_SOURCE_PRESET) {
        *out = json_pack("{s:s, s:s, s:o}", "source", "preset", "preset", spec, "hparams", hp);
    } else {
        px_digest d;
        char hex[65];
        px_status st = px_sha256_file(spec, &d, err);
        if (st != PX_OK) {
            json_decref(hp);
            return px_err_prefix(err, st, "trace: hashing the model %s: ", spec);
        }
        px_digest_hex(&d, hex);
        *out = json_pack("{s:s, s:s, s:s, s:o}", "source", "file", "path", spec, "sha256", hex,
                         "hparams", hp);
    }
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "trace: out of memory");
}

/* The plan as `--out` writes it, parsed back so that the recorded output
 * and the recomputed one have the same canonical form. */
static px_status plan_doc(const px_plan *plan, json_t **out, px_err *err)
{
    char *text = px_plan_dump(plan);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "plan: out of memory");
    px_status st = px_json_parse(text, strlen(text), "plan", NULL, out, err);
    free(text);
    return st;
}

px_status px_plan_trace_record(px_trace_writer *w, const px_plan_request *req,
                               const px_plan_trace_inputs *in, const px_plan *plan, px_err *err)
{
    if (!w || !req || !req->model || !in || !in->inventory || !in->model_spec || !plan)
        return px_err_set(err, PX_EINVAL, "px_plan_trace_record: missing argument");
    json_t *model = NULL, *contract = NULL, *request = NULL, *inputs = NULL, *output = NULL;
    char id_inv[PX_TRACE_ID_LEN], id_model[PX_TRACE_ID_LEN], id_contract[PX_TRACE_ID_LEN],
        id_req[PX_TRACE_ID_LEN];
    px_status st = model_json(in->model_spec, req->model, &model, err);
    if (st != PX_OK)
        goto done;
    if (in->contract_doc)
        contract = json_pack("{s:s, s:O}", "source", "file", "document", in->contract_doc);
    else if (in->contract_name)
        contract = json_pack("{s:s, s:s}", "source", "builtin", "name", in->contract_name);
    else
        contract = json_pack("{s:s}", "source", "implied");
    request = request_json(req);
    if (!contract || !request) {
        st = px_err_set(err, PX_ENOMEM, "trace: out of memory");
        goto done;
    }
    if ((st = plan_doc(plan, &output, err)) != PX_OK ||
        (st = px_trace_input(w, "inventory", in->inventory, id_inv, err)) != PX_OK ||
        (st = px_trace_input(w, "model", model, id_model, err)) != PX_OK ||
        (st = px_trace_input(w, "contract", contract, id_contract, err)) != PX_OK ||
        (st = px_trace_input(w, "request", request, id_req, err)) != PX_OK)
        goto done;
    inputs = json_pack("{s:s, s:s, s:s, s:s}", "inventory", id_inv, "model", id_model, "contract",
                       id_contract, "request", id_req);
    if (!inputs) {
        st = px_err_set(err, PX_ENOMEM, "trace: out of memory");
        goto done;
    }
    st = px_trace_decision(w, "plan", inputs, output, NULL, err);
done:
    json_decref(model);
    json_decref(contract);
    json_decref(request);
    json_decref(inputs);
    json_decref(output);
    return st;
}

/* ---- replay ---- */

/* The bounds are those `plexus plan` accepts: a trace is untrusted, and a
 * forged workload must not make the search allocate without limit. */
static px_status get_u32(const json_t *obj, const char *key, uint32_t lo, uint32_t hi,
                         uint32_t *out, px_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return px_err_set(err, PX_EPARSE,
                          "plan: the recorded request lacks a whole number from %u to %u at "
                          "\"%s\"",
                          lo, hi, key);
    *out = (uint32_t)json_integer_value(v);
    return PX_OK;
}

static px_status get_real(const json_t *obj, const char *key, double *out, px_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
        return px_err_set(err, PX_EPARSE,
                          "plan: the recorded request lacks a number >= 0 at \"%s\"", key);
    *out = json_number_value(v);
    return PX_OK;
}

/* Rebuilds the request's options; strings stay borrowed from doc. */
static px_status request_from_json(const json_t *doc, px_plan_request *req, px_err *err)
{
    px_plan_request_default(req);
    const json_t *wl = json_object_get(doc, "workload");
    const char *obj = json_string_value(json_object_get(doc, "objective"));
    const char *policy = json_string_value(json_object_get(doc, "policy"));
    uint32_t max_rejected = 0;
    px_status st;
    if (!json_is_object(doc) || !json_is_object(wl) || !obj || !policy)
        return px_err_set(err, PX_EPARSE,
                          "plan: the recorded request lacks \"objective\", \"policy\" or "
                          "\"workload\"");
    if ((st = px_plan_objective_parse(obj, &req->objective, err)) != PX_OK)
        return st;
    if (!px_plan_policy_exists(policy))
        return px_err_set(err, PX_EPARSE, "plan: the recorded policy \"%s\" is unknown", policy);
    req->policy = policy;
    if ((st = get_real(doc, "slo_tpot_s", &req->slo.tpot_s, err)) != PX_OK ||
        (st = get_real(doc, "slo_ttft_s", &req->slo.ttft_s, err)) != PX_OK ||
        (st = get_real(doc, "budget_usd_per_hour", &req->slo.budget_usd_h, err)) != PX_OK ||
        (st = get_u32(doc, "max_rejected", 0, 100000, &max_rejected, err)) != PX_OK ||
        (st = get_u32(wl, "batch", 0, 65536, &req->workload.batch, err)) != PX_OK ||
        (st = get_u32(wl, "micro_batches", 0, 65536, &req->workload.micro_batches, err)) != PX_OK ||
        (st = get_u32(wl, "context", 0, 1u << 24, &req->workload.context, err)) != PX_OK ||
        (st = get_u32(wl, "prompt_tokens", 0, 1u << 24, &req->workload.prompt_tokens, err)) !=
            PX_OK ||
        (st = get_u32(wl, "gen_tokens", 1, 1u << 24, &req->workload.gen_tokens, err)) != PX_OK)
        return st;
    /* Traces written before the cap was recorded planned without one. */
    if (json_object_get(doc, "max_tp") &&
        (st = get_u32(doc, "max_tp", 0, 65536, &req->max_tp, err)) != PX_OK)
        return st;
    /* 0 lets the planner choose; a forged pair is refused as the command
     * line refuses it. */
    if (req->workload.context && req->workload.prompt_tokens > req->workload.context)
        return px_err_set(err, PX_EPARSE,
                          "plan: the recorded request's prompt_tokens (%u) exceeds its context "
                          "(%u)",
                          req->workload.prompt_tokens, req->workload.context);
    req->max_rejected = max_rejected;
    req->compare_baselines = json_is_true(json_object_get(doc, "compare_baselines"));
    req->fallbacks = json_is_true(json_object_get(doc, "fallbacks"));
    return PX_OK;
}

px_status px_plan_trace_open_model(const json_t *doc, px_ir_model **out, px_err *err)
{
    *out = NULL;
    const char *source = json_string_value(json_object_get(doc, "source"));
    if (source && !strcmp(source, "preset")) {
        const char *name = json_string_value(json_object_get(doc, "preset"));
        if (!name)
            return px_err_set(err, PX_EPARSE, "trace: the recorded model lacks \"preset\"");
        return px_ir_preset_new(name, PX_DTYPE_COUNT_, NULL, out, err);
    }
    const char *path = json_string_value(json_object_get(doc, "path"));
    const char *want = json_string_value(json_object_get(doc, "sha256"));
    if (!source || strcmp(source, "file") || !path || !want)
        return px_err_set(err, PX_EPARSE,
                          "trace: the recorded model is neither a preset nor a file with "
                          "\"path\" and \"sha256\"");
    px_digest d;
    char got[65];
    px_status st = px_sha256_file(path, &d, err);
    if (st != PX_OK)
        return px_err_prefix(err, st,
                             "trace: cannot re-open the model file recorded in the trace "
                             "(put it back at that path): ");
    px_digest_hex(&d, got);
    if (strcmp(got, want) != 0)
        return px_err_set(err, PX_EVALIDATE,
                          "trace: the model file %s has changed since the trace was written "
                          "(SHA-256 %.12s, recorded %.12s); replay needs the same file",
                          path, got, want);
    return px_ir_model_open_any(path, NULL, out, err);
}

px_status px_plan_trace_open_contract(const json_t *doc, px_contract **out, px_err *err)
{
    *out = NULL;
    const char *source = json_string_value(json_object_get(doc, "source"));
    if (source && !strcmp(source, "implied"))
        return PX_OK;
    if (source && !strcmp(source, "builtin")) {
        const char *name = json_string_value(json_object_get(doc, "name"));
        if (!name)
            return px_err_set(err, PX_EPARSE, "trace: the recorded contract lacks \"name\"");
        return px_contract_builtin(name, out, err);
    }
    const json_t *d = json_object_get(doc, "document");
    if (!source || strcmp(source, "file") || !json_is_object(d))
        return px_err_set(err, PX_EPARSE,
                          "trace: the recorded contract is neither implied, built in nor a "
                          "document");
    return px_contract_from_json(d, "recorded contract", NULL, out, err);
}

static px_status derive_plan(void *ctx, const px_trace_event *recorded, const json_t *history,
                             json_t **out, px_err *err)
{
    (void)ctx;
    (void)recorded;
    *out = NULL;
    const json_t *inv_doc = json_object_get(history, "inventory");
    const json_t *model_doc = json_object_get(history, "model");
    const json_t *contract_doc = json_object_get(history, "contract");
    const json_t *req_doc = json_object_get(history, "request");
    if (!inv_doc || !model_doc || !contract_doc || !req_doc)
        return px_err_set(err, PX_EPARSE,
                          "plan: the trace lacks the inventory, model, contract or request "
                          "input");
    px_hw_graph *graph = NULL;
    px_ir_model *model = NULL;
    px_contract *contract = NULL;
    px_plan *plan = NULL;
    px_plan_request req;
    px_status st;
    if ((st = request_from_json(req_doc, &req, err)) != PX_OK ||
        (st = px_hw_graph_from_value(inv_doc, "recorded inventory", NULL, &graph, NULL, err)) !=
            PX_OK ||
        (st = px_plan_trace_open_model(model_doc, &model, err)) != PX_OK ||
        (st = px_plan_trace_open_contract(contract_doc, &contract, err)) != PX_OK)
        goto done;
    req.graph = graph;
    req.model = model;
    req.contract = contract;
    if ((st = px_plan_search(&req, &plan, err)) != PX_OK)
        goto done;
    st = plan_doc(plan, out, err);
done:
    px_plan_free(plan);
    px_contract_free(contract);
    px_ir_model_free(model);
    px_hw_graph_free(graph);
    return st;
}

static const px_trace_deriver derivers[] = {
    {"plan", derive_plan},
};

const px_trace_deriver *px_plan_replay_derivers(size_t *n)
{
    if (n)
        *n = PX_ARRAY_LEN(derivers);
    return derivers;
}
