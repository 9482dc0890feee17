/*
 * The contract object: loading from files, freeing, and read access.
 */
#include "contract/contract_impl.h"

px_status px_contract_load_file(const char *path, px_diags *diags, px_contract **out, px_err *err)
{
    *out = NULL;
    char *text;
    size_t len;
    px_status st = px_read_file(path, PX_CONTRACT_MAX_BYTES, &text, &len, err);
    if (st != PX_OK) {
        if (diags)
            px_diags_add(diags, PX_SEV_ERROR, "", NULL, "%s", err ? err->msg : px_status_str(st));
        return st;
    }
    st = px_contract_parse(text, len, path, diags, out, err);
    free(text);
    return st;
}

void px_contract_free(px_contract *c)
{
    if (!c)
        return;
    px_arena_free(c->arena);
    free(c);
}

const char *px_contract_name(const px_contract *c)
{
    return c->name;
}

const char *px_contract_description(const px_contract *c)
{
    return c->description;
}

const char *px_contract_reference(const px_contract *c)
{
    return c->reference;
}

px_contract_budget px_contract_get_budget(const px_contract *c)
{
    px_contract_budget b = {
        .prompt_set = c->prompt_set, .prompts = c->prompts, .tokens = c->tokens};
    return b;
}

size_t px_contract_region_count(const px_contract *c)
{
    return c->n_regions;
}

const px_contract_clause *px_contract_region_at(const px_contract *c, size_t i)
{
    return i < c->n_regions ? &c->regions[i].clause : NULL;
}

const px_contract_clause *px_contract_default(const px_contract *c)
{
    return &c->default_clause;
}
