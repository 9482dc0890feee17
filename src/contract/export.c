/*
 * The canonical form of a contract: every default written out, numbers as
 * reals, bitwise written as `true` when it matches the contract's own
 * reference, keys sorted by the JSON dumper.  Two contracts that mean the
 * same thing therefore export the same bytes, and the digest of that text
 * is the contract's content id.
 */
#include "contract/contract_impl.h"

static json_t *path_to_json(const px_contract_path *p)
{
    if (p->prompt)
        return json_pack("{s:s}", "prompt", p->prompt);
    json_t *ids = json_array();
    if (!ids)
        return NULL;
    for (size_t i = 0; i < p->n_tokens; i++) {
        if (px_json_push(ids, json_integer(p->tokens[i])) != PX_OK) {
            json_decref(ids);
            return NULL;
        }
    }
    return json_pack("{s:o}", "tokens", ids);
}

static json_t *clause_to_json(const px_contract *c, const px_contract_clause *cl)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    px_status st = PX_OK;
    if (cl->reqs & PX_CONTRACT_BITWISE) {
        if (!cl->reference || !strcmp(cl->reference, c->reference))
            st = px_json_set(o, "bitwise", json_true());
        else
            st = px_json_set(o, "bitwise", json_pack("{s:s}", "reference", cl->reference));
    }
    if (st == PX_OK && (cl->reqs & PX_CONTRACT_DETERMINISTIC)) {
        if (cl->has_seed)
            st = px_json_set(o, "deterministic", json_pack("{s:I}", "seed", (json_int_t)cl->seed));
        else
            st = px_json_set(o, "deterministic", json_true());
    }
    if (st == PX_OK && (cl->reqs & PX_CONTRACT_TOLERANCE))
        st = px_json_set(o, "tolerance",
                         json_pack("{s:f, s:f}", "atol", cl->atol, "rtol", cl->rtol));
    if (st == PX_OK && (cl->reqs & PX_CONTRACT_DIVERGENCE))
        st = px_json_set(o, "divergence", json_pack("{s:f}", "kl_max", cl->kl_max));
    if (st == PX_OK && (cl->reqs & PX_CONTRACT_AGREEMENT)) {
        json_t *a = json_pack("{s:f}", "top1_min", cl->top1_min);
        if (a && cl->prompt_set)
            st = px_json_set(a, "prompt_set", json_string(cl->prompt_set));
        if (a && st == PX_OK && cl->positions)
            st = px_json_set(a, "positions", json_integer((json_int_t)cl->positions));
        if (st == PX_OK)
            st = px_json_set(o, "agreement", a);
        else
            json_decref(a);
    }
    if (st == PX_OK && (cl->reqs & PX_CONTRACT_EXACT_LOGITS)) {
        json_t *paths = json_array();
        for (size_t i = 0; paths && st == PX_OK && i < cl->n_paths; i++)
            st = px_json_push(paths, path_to_json(&cl->paths[i]));
        if (st == PX_OK)
            st = px_json_set(o, "exact_logits", paths);
        else
            json_decref(paths);
    }
    if (st != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *px_contract_to_json(const px_contract *c)
{
    json_t *doc = json_pack("{s:s, s:s, s:{s:s, s:I, s:I}}", "schema", PX_CONTRACT_SCHEMA,
                            "reference", c->reference, "validation", "prompt_set", c->prompt_set,
                            "prompts", (json_int_t)c->prompts, "tokens", (json_int_t)c->tokens);
    if (!doc)
        return NULL;
    px_status st = PX_OK;
    if (c->name)
        st = px_json_set(doc, "name", json_string(c->name));
    if (st == PX_OK && c->description)
        st = px_json_set(doc, "description", json_string(c->description));
    if (st == PX_OK)
        st = px_json_set(doc, "default", clause_to_json(c, &c->default_clause));
    json_t *regions = st == PX_OK ? json_object() : NULL;
    if (!regions)
        st = PX_ENOMEM;
    for (size_t i = 0; st == PX_OK && i < c->n_regions; i++)
        st = px_json_set(regions, c->regions[i].key, clause_to_json(c, &c->regions[i].clause));
    if (st == PX_OK)
        st = px_json_set(doc, "regions", regions);
    else
        json_decref(regions);
    if (st != PX_OK) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

char *px_contract_export(const px_contract *c)
{
    json_t *doc = px_contract_to_json(c);
    if (!doc)
        return NULL;
    char *text = px_json_dump_canonical(doc);
    json_decref(doc);
    return text;
}

px_status px_contract_digest(const px_contract *c, char out[65])
{
    json_t *doc = px_contract_to_json(c);
    if (!doc)
        return PX_ENOMEM;
    px_status st = px_json_digest_hex(doc, out);
    json_decref(doc);
    return st;
}

char *px_contract_clause_text(const px_contract_clause *cl)
{
    px_strbuf sb = PX_STRBUF_INIT;
    const char *sep = "";
    if (cl->reqs & PX_CONTRACT_BITWISE) {
        px_strbuf_addf(&sb, "bitwise against \"%s\"", cl->reference ? cl->reference : "?");
        sep = "; ";
    }
    if (cl->reqs & PX_CONTRACT_DETERMINISTIC) {
        px_strbuf_addf(&sb, "%sdeterministic", sep);
        if (cl->has_seed)
            px_strbuf_addf(&sb, " (seed %" PRIu64 ")", cl->seed);
        sep = "; ";
    }
    if (cl->reqs & PX_CONTRACT_TOLERANCE) {
        px_strbuf_addf(&sb, "%stolerance atol %g rtol %g", sep, cl->atol, cl->rtol);
        sep = "; ";
    }
    if (cl->reqs & PX_CONTRACT_DIVERGENCE) {
        px_strbuf_addf(&sb, "%sdivergence kl_max %g nats", sep, cl->kl_max);
        sep = "; ";
    }
    if (cl->reqs & PX_CONTRACT_AGREEMENT) {
        px_strbuf_addf(&sb, "%sagreement top1_min %g", sep, cl->top1_min);
        if (cl->prompt_set)
            px_strbuf_addf(&sb, " on prompt set \"%s\"", cl->prompt_set);
        if (cl->positions)
            px_strbuf_addf(&sb, " over %" PRIu64 " positions", cl->positions);
        sep = "; ";
    }
    if (cl->reqs & PX_CONTRACT_EXACT_LOGITS)
        px_strbuf_addf(&sb, "%sexact logits on %zu path%s", sep, cl->n_paths,
                       cl->n_paths == 1 ? "" : "s");
    return px_strbuf_detach(&sb, NULL);
}
