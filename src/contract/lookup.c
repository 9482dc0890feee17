/*
 * From region names to clauses: lookup by specificity, and the check of a
 * contract against the regions a model actually has.
 */
#include "contract/contract_impl.h"

static int cmp_key(const void *key, const void *elem)
{
    return strcmp((const char *)key, ((const px__region *)elem)->key);
}

const px__region *px__contract_match(const px_contract *c, const char *text,
                                     const px__pattern *name, bool *tie)
{
    *tie = false;
    const px__region *exact =
        c->n_regions ? bsearch(text, c->regions, c->n_regions, sizeof *c->regions, cmp_key) : NULL;
    if (exact)
        return exact;
    const px__region *best = NULL;
    for (size_t i = 0; i < c->n_wild; i++) {
        const px__region *r = &c->regions[c->wild[i]];
        if (!px__pattern_matches(&r->pattern, name))
            continue;
        if (!best) {
            best = r;
            continue;
        }
        int cmp = px__pattern_cmp_specificity(&r->pattern, &best->pattern);
        if (cmp < 0) {
            best = r;
            *tie = false;
        } else if (cmp == 0) {
            *tie = true;
        }
    }
    return best;
}

px_status px_contract_lookup(const px_contract *c, const char *region,
                             const px_contract_clause **out, px_err *err)
{
    *out = NULL;
    px__pattern name;
    char why[192];
    if (px__pattern_parse(region, false, &name, why, sizeof why) != PX_OK)
        return px_err_set(err, PX_EINVAL, "region name \"%.64s\" %s", region ? region : "", why);
    bool tie;
    const px__region *r = px__contract_match(c, region, &name, &tie);
    if (tie) {
        /* Validation rejects such contracts; reaching here is a bug. */
        return px_err_set(err, PX_EINTERNAL, "region \"%s\" matches two equally specific entries",
                          region);
    }
    *out = r ? &r->clause : &c->default_clause;
    return PX_OK;
}

/* Appends up to a few of the model's names to sb, for fixes. */
static void list_names(px_strbuf *sb, const char *const *names, size_t n_names)
{
    size_t shown = PX_MIN(n_names, (size_t)6);
    for (size_t i = 0; i < shown; i++)
        px_strbuf_addf(sb, "%s%.64s", i ? ", " : "", names[i]);
    if (n_names > shown)
        px_strbuf_addf(sb, ", ... (%zu in all)", n_names);
}

px_status px_contract_check_regions(const px_contract *c, const char *const *names, size_t n_names,
                                    px_diags *diags, px_err *err)
{
    px_diags local;
    px_diags_init(&local);
    if (!diags)
        diags = &local;
    px_status st = PX_OK;
    size_t n_errors = 0;
    char first[256] = "";
    px__pattern *parsed = calloc(n_names ? n_names : 1, sizeof *parsed);
    bool *valid = calloc(n_names ? n_names : 1, sizeof *valid);
    if (!parsed || !valid) {
        st = px_err_set(err, PX_ENOMEM, "out of memory checking regions");
        goto done;
    }
    for (size_t i = 0; i < n_names; i++) {
        char why[192];
        if (px__pattern_parse(names[i], false, &parsed[i], why, sizeof why) == PX_OK) {
            valid[i] = true;
            continue;
        }
        if (!n_errors++)
            px__fmt(first, sizeof first, "the model's region #%zu \"%.64s\" %s", i,
                    names[i] ? names[i] : "", why);
        px_diags_add(diags, PX_SEV_ERROR, "", "fix the model's region names",
                     "the model's region #%zu \"%.64s\" %s", i, names[i] ? names[i] : "", why);
    }
    for (size_t r = 0; r < c->n_regions; r++) {
        const px__region *reg = &c->regions[r];
        size_t hits = 0;
        for (size_t i = 0; i < n_names; i++)
            hits += valid[i] && px__pattern_matches(&reg->pattern, &parsed[i]);
        if (hits)
            continue;
        px_strbuf ptr = PX_STRBUF_INIT, fix = PX_STRBUF_INIT;
        px_strbuf_adds(&ptr, "/regions/");
        px_strbuf_add_pointer_token(&ptr, reg->key);
        px_strbuf_adds(&fix, "use the model's region names: ");
        list_names(&fix, names, n_names);
        bool exact = reg->pattern.n_star == 0 && reg->pattern.n_range == 0;
        if (exact) {
            /* An exact name the model lacks is almost always a typo, and
             * a typo here would silently apply the default instead. */
            if (!n_errors++)
                px__fmt(first, sizeof first, "%s: region \"%.64s\" is not in the model", ptr.buf,
                        reg->key);
            px_diags_add(diags, PX_SEV_ERROR, ptr.buf, fix.buf,
                         "region \"%.64s\" is not in the model", reg->key);
        } else {
            px_diags_add(diags, PX_SEV_WARNING, ptr.buf, fix.buf,
                         "pattern \"%.64s\" matches no region of the model", reg->key);
        }
        px_strbuf_release(&ptr);
        px_strbuf_release(&fix);
    }
    for (size_t i = 0; i < n_names; i++) {
        bool tie;
        if (!valid[i])
            continue;
        px__contract_match(c, names[i], &parsed[i], &tie);
        if (!tie)
            continue;
        if (!n_errors++)
            px__fmt(first, sizeof first, "region \"%.64s\" matches two equally specific entries",
                    names[i]);
        px_diags_add(diags, PX_SEV_ERROR, "/regions", "add an entry for the region",
                     "region \"%.64s\" matches two equally specific entries", names[i]);
    }
    if (n_errors)
        st = px_err_set(err, PX_EVALIDATE, "%s%s", first,
                        n_errors > 1 ? " (and more problems)" : "");
done:
    free(parsed);
    free(valid);
    px_diags_release(&local);
    return st;
}
