/* PEP 440 style version parsing and specifier matching ("torch>=2.1,<3"). */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <ctype.h>

/* Parses "2.3.1", "v12.1", "2.1.0rc1", "1.0.post2", "2.4.0+cu121".  The
 * local part after '+' is ignored, as PEP 440 does for ordering. */
bool px__version_parse(const char *text, px__version *out)
{
    memset(out, 0, sizeof *out);
    const char *p = text;
    if (*p == 'v' || *p == 'V')
        p++;
    if (!isdigit((unsigned char)*p))
        return false;
    while (isdigit((unsigned char)*p)) {
        if (out->n_rel == (int)PX_ARRAY_LEN(out->rel))
            return false;
        int64_t v = 0;
        int digits = 0;
        while (isdigit((unsigned char)*p)) {
            if (++digits > 15)
                return false;
            v = v * 10 + (*p - '0');
            p++;
        }
        out->rel[out->n_rel++] = v;
        if (*p == '.' && isdigit((unsigned char)p[1]))
            p++;
        else
            break;
    }
    if (*p == '.' || *p == '-' || *p == '_')
        p++;
    struct {
        const char *word;
        int kind;
    } tags[] = {{"dev", -4}, {"alpha", -3}, {"a", -3}, {"beta", -2},
                {"b", -2},   {"rc", -1},    {"c", -1}, {"post", 1}};
    for (size_t i = 0; i < PX_ARRAY_LEN(tags); i++) {
        size_t n = strlen(tags[i].word);
        if (strncmp(p, tags[i].word, n) == 0) {
            out->pre_kind = tags[i].kind;
            p += n;
            int64_t v = 0;
            int digits = 0;
            while (isdigit((unsigned char)*p) && digits++ < 15)
                v = v * 10 + (*p++ - '0');
            out->pre_num = v;
            break;
        }
    }
    if (*p == '+')
        p += strlen(p);
    if (*p != '\0')
        return false;
    out->numeric = true;
    return true;
}

int px__version_cmp(const px__version *a, const px__version *b)
{
    int n = PX_MAX(a->n_rel, b->n_rel);
    for (int i = 0; i < n; i++) {
        int64_t x = i < a->n_rel ? a->rel[i] : 0;
        int64_t y = i < b->n_rel ? b->rel[i] : 0;
        if (x != y)
            return x < y ? -1 : 1;
    }
    if (a->pre_kind != b->pre_kind)
        return a->pre_kind < b->pre_kind ? -1 : 1;
    if (a->pre_num != b->pre_num)
        return a->pre_num < b->pre_num ? -1 : 1;
    return 0;
}

/* Whether v's release starts with prefix's release numbers ("==2.1.*"). */
static bool release_prefix(const px__version *v, const px__version *prefix)
{
    for (int i = 0; i < prefix->n_rel; i++) {
        int64_t x = i < v->n_rel ? v->rel[i] : 0;
        if (x != prefix->rel[i])
            return false;
    }
    return true;
}

static px_status match_clause(const char *version, const px__version *v, bool v_ok,
                              const char *clause, size_t len, bool *out, px_err *err)
{
    char buf[96];
    while (len > 0 && isspace((unsigned char)*clause)) {
        clause++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)clause[len - 1]))
        len--;
    if (len == 0 || len >= sizeof buf)
        return px_err_set(err, PX_EPARSE,
                          "version specifier clause \"%.*s\" is empty or too long; "
                          "write clauses like \">=2.1\" joined by commas",
                          (int)PX_MIN(len, 64), clause);
    memcpy(buf, clause, len);
    buf[len] = '\0';
    static const char *const ops[] = {"~=", "==", "!=", "<=", ">=", "<", ">"};
    const char *op = NULL;
    for (size_t i = 0; i < PX_ARRAY_LEN(ops); i++)
        if (px_str_starts_with(buf, ops[i])) {
            op = ops[i];
            break;
        }
    if (!op)
        return px_err_set(err, PX_EPARSE,
                          "version specifier clause \"%s\" has no operator; use one of "
                          "==, !=, <, <=, >, >=, ~=",
                          buf);
    char *rhs = buf + strlen(op);
    while (isspace((unsigned char)*rhs))
        rhs++;
    bool wildcard = false;
    size_t rl = strlen(rhs);
    if (rl >= 2 && strcmp(rhs + rl - 2, ".*") == 0) {
        if (strcmp(op, "==") != 0 && strcmp(op, "!=") != 0)
            return px_err_set(err, PX_EPARSE,
                              "version specifier clause \"%s\": \".*\" is only allowed "
                              "with == and !=",
                              buf);
        wildcard = true;
        rhs[rl - 2] = '\0';
    }
    px__version want;
    if (!px__version_parse(rhs, &want)) {
        /* Text versions (gfx90a) compare only for equality. */
        if (wildcard || (strcmp(op, "==") != 0 && strcmp(op, "!=") != 0) || rhs[0] == '\0')
            return px_err_set(err, PX_EPARSE,
                              "version specifier clause \"%s\": \"%s\" is not a version "
                              "(expected numbers like 2.1 or 12.1.0)",
                              buf, rhs);
        bool eq = strcmp(version, rhs) == 0;
        *out = op[0] == '=' ? eq : !eq;
        return PX_OK;
    }
    if (!v_ok) {
        *out = false;
        return PX_OK;
    }
    int c = px__version_cmp(v, &want);
    if (strcmp(op, "==") == 0)
        *out = wildcard ? release_prefix(v, &want) : c == 0;
    else if (strcmp(op, "!=") == 0)
        *out = wildcard ? !release_prefix(v, &want) : c != 0;
    else if (strcmp(op, "<") == 0)
        *out = c < 0;
    else if (strcmp(op, "<=") == 0)
        *out = c <= 0;
    else if (strcmp(op, ">") == 0)
        *out = c > 0;
    else if (strcmp(op, ">=") == 0)
        *out = c >= 0;
    else {
        /* ~=2.2.1 means >=2.2.1 and ==2.2.*; it needs two release numbers. */
        if (want.n_rel < 2)
            return px_err_set(err, PX_EPARSE,
                              "version specifier clause \"%s\": ~= needs at least two "
                              "release numbers (~=2.1)",
                              buf);
        px__version prefix = want;
        prefix.n_rel--;
        *out = c >= 0 && release_prefix(v, &prefix);
    }
    return PX_OK;
}

px_status px_fleet_version_match(const char *version, const char *spec, bool *out, px_err *err)
{
    PX_ASSERT(version && spec && out);
    *out = true;
    px__version v;
    bool v_ok = px__version_parse(version, &v);
    const char *p = spec;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '\0')
        return PX_OK;
    bool all = true;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        bool ok = false;
        px_status st = match_clause(version, &v, v_ok, p, len, &ok, err);
        if (st != PX_OK)
            return st;
        all = all && ok;
        if (!comma)
            break;
        p = comma + 1;
    }
    *out = all;
    return PX_OK;
}
