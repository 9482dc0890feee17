/*
 * Decisions as JSON, the form plans, traces and `plexus contract check -o
 * json` record.
 */
#include "contract/contract_impl.h"

static json_t *obligation_to_json(const px_obligation *o)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:s}", "region", o->region, "clause",
                          o->pattern ? o->pattern : "", "requirement", px_contract_req_name(o->req),
                          "reference", o->reference ? o->reference : "", "prompts",
                          (json_int_t)o->prompts, "tokens", (json_int_t)o->tokens, "text", o->text);
    if (!j)
        return NULL;
    px_status st = PX_OK;
    if (o->prompt_set)
        st = px_json_set(j, "prompt_set", json_string(o->prompt_set));
    switch (o->req) {
    case PX_CONTRACT_TOLERANCE:
        if (st == PX_OK)
            st = px_json_set(j, "atol", json_real(o->atol));
        if (st == PX_OK)
            st = px_json_set(j, "rtol", json_real(o->rtol));
        break;
    case PX_CONTRACT_DIVERGENCE:
        if (st == PX_OK)
            st = px_json_set(j, "kl_max", json_real(o->threshold));
        break;
    case PX_CONTRACT_AGREEMENT:
        if (st == PX_OK)
            st = px_json_set(j, "top1_min", json_real(o->threshold));
        break;
    case PX_CONTRACT_EXACT_LOGITS: {
        json_t *paths = json_array();
        for (size_t i = 0; paths && st == PX_OK && i < o->n_paths; i++) {
            const px_contract_path *p = &o->paths[i];
            if (p->prompt) {
                st = px_json_push(paths, json_pack("{s:s}", "prompt", p->prompt));
                continue;
            }
            json_t *ids = json_array();
            for (size_t k = 0; ids && st == PX_OK && k < p->n_tokens; k++)
                st = px_json_push(ids, json_integer(p->tokens[k]));
            if (st == PX_OK)
                st = px_json_push(paths, json_pack("{s:o}", "tokens", ids));
            else
                json_decref(ids);
        }
        if (st == PX_OK)
            st = px_json_set(j, "paths", paths);
        else
            json_decref(paths);
        break;
    }
    default:
        break;
    }
    if (st != PX_OK) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *px_contract_decision_to_json(const px_contract_decision *d)
{
    json_t *j =
        json_pack("{s:s, s:s}", "verdict", px_verdict_name(d->verdict), "message", d->message);
    if (!j)
        return NULL;
    px_status st = PX_OK;
    if (d->verdict == PX_VERDICT_ALLOWED && d->proof != PX_PROOF_NONE)
        st = px_json_set(j, "proof", json_string(px_contract_proof_name(d->proof)));
    if (st == PX_OK && d->verdict == PX_VERDICT_FORBIDDEN)
        st = px_json_set(j, "reason", json_string(px_contract_reason_name(d->reason)));
    if (st == PX_OK && d->req)
        st = px_json_set(j, "requirement", json_string(px_contract_req_name(d->req)));
    json_t *obs = st == PX_OK ? json_array() : NULL;
    for (size_t i = 0; obs && st == PX_OK && i < d->n_obligations; i++)
        st = px_json_push(obs, obligation_to_json(&d->obligations[i]));
    if (!obs)
        st = PX_ENOMEM;
    if (st == PX_OK)
        st = px_json_set(j, "obligations", obs);
    else
        json_decref(obs);
    if (st != PX_OK) {
        json_decref(j);
        return NULL;
    }
    return j;
}
