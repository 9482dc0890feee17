/*
 * Reading and validating plexus.contract/1 documents.
 *
 * The reader walks the whole document and reports every problem it finds
 * (with its JSON pointer and a fix) rather than stopping at the first, so a
 * user fixes a contract in one pass.  A contract object exists only when no
 * error was found: nothing downstream ever sees a half-valid contract.
 */
#include "contract/contract_impl.h"

typedef struct parse_ctx {
    px_contract *c;
    px_diags *diags;
    const char *name;
    size_t n_errors;
    bool oom;
    char first[256]; /* the first error, for err */
} parse_ctx;

static void diag(parse_ctx *ctx, px_severity sev, const char *ptr, const char *fix, const char *fmt,
                 ...) PX_PRINTF(5, 6);
static void diag(parse_ctx *ctx, px_severity sev, const char *ptr, const char *fix, const char *fmt,
                 ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (sev == PX_SEV_ERROR && ctx->n_errors++ == 0) {
        /* Hostile member names make long pointers; keep the summary
         * readable (the diagnostic itself has the whole pointer). */
        const char *shown = ptr[0] ? ptr : "(document)";
        size_t n = strlen(shown);
        px__fmt(ctx->first, sizeof ctx->first, "%.*s%s: %s", n > 80 ? 80 : (int)n, shown,
                n > 80 ? "..." : "", msg);
    }
    if (px_diags_add(ctx->diags, sev, ptr, fix, "%s", msg) == PX_ENOMEM)
        ctx->oom = true;
}

/* JSON pointers are built in a strbuf that grows and shrinks as the walk
 * descends and returns. */
static size_t ptr_push(px_strbuf *p, const char *token)
{
    size_t mark = p->len;
    px_strbuf_addch(p, '/');
    px_strbuf_add_pointer_token(p, token);
    return mark;
}

static size_t ptr_push_index(px_strbuf *p, size_t i)
{
    size_t mark = p->len;
    px_strbuf_addf(p, "/%zu", i);
    return mark;
}

static void ptr_pop(px_strbuf *p, size_t mark)
{
    if (p->cap) {
        p->len = mark;
        p->buf[mark] = '\0';
    }
}

static bool is_id_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           strchr("._:/@+-", ch) != NULL;
}

/* Reads an identifier (reference, prompt set, prompt name).  Returns an
 * arena copy or NULL after reporting the problem. */
static const char *read_id(parse_ctx *ctx, const json_t *v, const char *ptr, const char *what)
{
    if (!json_is_string(v)) {
        diag(ctx, PX_SEV_ERROR, ptr, "write it as a string such as \"scalar-reference\"",
             "%s must be a string, not %s", what, px_json_type_name(v));
        return NULL;
    }
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (len == 0 || len > PX_CONTRACT_MAX_ID) {
        diag(ctx, PX_SEV_ERROR, ptr, "use a name of 1 to 128 characters", "%s is %zu bytes long",
             what, len);
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        if (!is_id_char(s[i])) {
            diag(ctx, PX_SEV_ERROR, ptr, "use letters, digits and . _ : / @ + -",
                 "%s has the character 0x%02x at byte %zu", what, (unsigned char)s[i], i);
            return NULL;
        }
    }
    const char *copy = px_arena_strndup(ctx->c->arena, s, len);
    if (!copy)
        ctx->oom = true;
    return copy;
}

/* Free text (name, description): any UTF-8 without control characters. */
static const char *read_text(parse_ctx *ctx, const json_t *v, const char *ptr, const char *what,
                             size_t max)
{
    if (!json_is_string(v)) {
        diag(ctx, PX_SEV_ERROR, ptr, NULL, "%s must be a string, not %s", what,
             px_json_type_name(v));
        return NULL;
    }
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (len > max) {
        diag(ctx, PX_SEV_ERROR, ptr, "shorten it",
             "%s is %zu bytes long, more than the limit of %zu", what, len, max);
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f) {
            diag(ctx, PX_SEV_ERROR, ptr, "remove control characters (newlines, tabs, NUL)",
                 "%s has the control character 0x%02x at byte %zu", what, ch, i);
            return NULL;
        }
    }
    const char *copy = px_arena_strndup(ctx->c->arena, s, len);
    if (!copy)
        ctx->oom = true;
    return copy;
}

/* Reads a finite number into *out; reports and returns false otherwise. */
static bool read_number(parse_ctx *ctx, const json_t *v, const char *ptr, const char *what,
                        double *out)
{
    if (!json_is_number(v)) {
        diag(ctx, PX_SEV_ERROR, ptr, "write a plain JSON number such as 0.001",
             "%s must be a number, not %s", what, px_json_type_name(v));
        return false;
    }
    double x = json_number_value(v);
    if (!isfinite(x)) {
        diag(ctx, PX_SEV_ERROR, ptr, "write a finite number", "%s is not finite", what);
        return false;
    }
    *out = x;
    return true;
}

static bool read_uint(parse_ctx *ctx, const json_t *v, const char *ptr, const char *what,
                      uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!json_is_integer(v)) {
        diag(ctx, PX_SEV_ERROR, ptr, "write a whole number without a decimal point",
             "%s must be an integer, not %s", what, px_json_type_name(v));
        return false;
    }
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi) {
        char fix[96];
        px__fmt(fix, sizeof fix, "use a value from %" PRIu64 " to %" PRIu64, lo, hi);
        diag(ctx, PX_SEV_ERROR, ptr, fix, "%s is %" JSON_INTEGER_FORMAT ", out of range", what, x);
        return false;
    }
    *out = (uint64_t)x;
    return true;
}

/* Reports members of obj not in known (NULL-terminated). */
static void check_members(parse_ctx *ctx, const json_t *obj, px_strbuf *ptr,
                          const char *const *known, const char *where)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        bool found = false;
        for (const char *const *k = known; *k && !found; k++)
            found = !strcmp(key, *k);
        if (found)
            continue;
        px_strbuf fix = PX_STRBUF_INIT;
        px_strbuf_adds(&fix, "remove it; ");
        px_strbuf_adds(&fix, where);
        px_strbuf_adds(&fix, " takes ");
        for (const char *const *k = known; *k; k++)
            px_strbuf_addf(&fix, "%s\"%s\"", k == known ? "" : ", ", *k);
        size_t mark = ptr_push(ptr, key);
        diag(ctx, PX_SEV_ERROR, ptr->buf, fix.buf, "unknown member \"%.64s\" in %s", key, where);
        ptr_pop(ptr, mark);
        px_strbuf_release(&fix);
    }
}

/* ---- Clauses ------------------------------------------------------- */

static void read_bitwise(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, px_contract_clause *cl)
{
    cl->reference = NULL; /* resolved to the contract's reference later */
    if (json_is_true(v)) {
        cl->reqs |= PX_CONTRACT_BITWISE;
        return;
    }
    if (json_is_false(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "remove the member; a clause lists only what it requires",
             "\"bitwise\": false requires nothing");
        return;
    }
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "write true, or {\"reference\": \"cpu\"} to match another reference",
             "bitwise must be true or an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"reference", NULL};
    check_members(ctx, v, ptr, known, "bitwise");
    const json_t *ref = json_object_get(v, "reference");
    if (ref) {
        size_t mark = ptr_push(ptr, "reference");
        cl->reference = read_id(ctx, ref, ptr->buf, "the bitwise reference");
        ptr_pop(ptr, mark);
    }
    cl->reqs |= PX_CONTRACT_BITWISE;
}

static void read_deterministic(parse_ctx *ctx, const json_t *v, px_strbuf *ptr,
                               px_contract_clause *cl)
{
    if (json_is_true(v)) {
        cl->reqs |= PX_CONTRACT_DETERMINISTIC;
        return;
    }
    if (json_is_false(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "remove the member; a clause lists only what it requires",
             "\"deterministic\": false requires nothing");
        return;
    }
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write true, or {\"seed\": 42} to fix the seed",
             "deterministic must be true or an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"seed", NULL};
    check_members(ctx, v, ptr, known, "deterministic");
    const json_t *seed = json_object_get(v, "seed");
    if (seed) {
        size_t mark = ptr_push(ptr, "seed");
        if (read_uint(ctx, seed, ptr->buf, "the seed", 0, (uint64_t)INT64_MAX, &cl->seed))
            cl->has_seed = true;
        ptr_pop(ptr, mark);
    }
    cl->reqs |= PX_CONTRACT_DETERMINISTIC;
}

/* Reads a required number member of obj and checks lo <= x <= hi (lo_open
 * excludes lo itself). */
static bool read_bounded(parse_ctx *ctx, const json_t *obj, px_strbuf *ptr, const char *key,
                         double lo, bool lo_open, double hi, const char *fix, double *out)
{
    const json_t *v = json_object_get(obj, key);
    size_t mark = ptr_push(ptr, key);
    bool ok = false;
    if (!v) {
        char f[128];
        px__fmt(f, sizeof f, "add \"%s\", e.g. %s", key, fix);
        ptr_pop(ptr, mark);
        diag(ctx, PX_SEV_ERROR, ptr->buf, f, "\"%s\" is missing", key);
        return false;
    }
    double x;
    if (read_number(ctx, v, ptr->buf, key, &x)) {
        if ((lo_open ? x <= lo : x < lo) || x > hi) {
            char f[160];
            px__fmt(f, sizeof f, "use a value in %s%g, %g]; e.g. %s", lo_open ? "(" : "[", lo, hi,
                    fix);
            diag(ctx, PX_SEV_ERROR, ptr->buf, f, "%s = %g is outside the sane range %s%g, %g]", key,
                 x, lo_open ? "(" : "[", lo, hi);
        } else {
            *out = x;
            ok = true;
        }
    }
    ptr_pop(ptr, mark);
    return ok;
}

static void read_tolerance(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, px_contract_clause *cl)
{
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write {\"atol\": 1e-5, \"rtol\": 1e-4}",
             "tolerance must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"atol", "rtol", NULL};
    check_members(ctx, v, ptr, known, "tolerance");
    /* An absolute error above 10 or a relative error above 100% bounds
     * nothing a user could mean; they are typos for smaller numbers. */
    bool a = read_bounded(ctx, v, ptr, "atol", 0, false, 10, "1e-5", &cl->atol);
    bool r = read_bounded(ctx, v, ptr, "rtol", 0, false, 1, "1e-4", &cl->rtol);
    if (a && r && cl->atol == 0 && cl->rtol == 0)
        diag(ctx, PX_SEV_WARNING, ptr->buf, "write \"bitwise\": true to require exact equality",
             "a tolerance of zero requires bit-identical outputs");
    cl->reqs |= PX_CONTRACT_TOLERANCE;
}

static void read_divergence(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, px_contract_clause *cl)
{
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write {\"kl_max\": 0.01}",
             "divergence must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"kl_max", NULL};
    check_members(ctx, v, ptr, known, "divergence");
    /* kl_max = 0 would be exact equality of distributions (use bitwise or
     * exact_logits); above 1 nat the output distribution may be anything. */
    read_bounded(ctx, v, ptr, "kl_max", 0, true, 1, "0.01 (nats)", &cl->kl_max);
    cl->reqs |= PX_CONTRACT_DIVERGENCE;
}

static void read_agreement(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, px_contract_clause *cl)
{
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write {\"top1_min\": 0.99}",
             "agreement must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"top1_min", "prompt_set", "positions", NULL};
    check_members(ctx, v, ptr, known, "agreement");
    if (read_bounded(ctx, v, ptr, "top1_min", 0, false, 1, "0.99", &cl->top1_min) &&
        cl->top1_min == 0) {
        size_t mark = ptr_push(ptr, "top1_min");
        diag(ctx, PX_SEV_WARNING, ptr->buf, "raise it, or remove the agreement requirement",
             "top1_min = 0 is met by any output");
        ptr_pop(ptr, mark);
    }
    const json_t *set = json_object_get(v, "prompt_set");
    const json_t *pos = json_object_get(v, "positions");
    if (set && pos) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "keep one of them",
             "agreement names both a prompt set and a number of positions");
    }
    if (set) {
        size_t mark = ptr_push(ptr, "prompt_set");
        cl->prompt_set = read_id(ctx, set, ptr->buf, "the prompt set");
        ptr_pop(ptr, mark);
    }
    if (pos) {
        size_t mark = ptr_push(ptr, "positions");
        read_uint(ctx, pos, ptr->buf, "positions", 1, PX__CONTRACT_MAX_TOKENS, &cl->positions);
        ptr_pop(ptr, mark);
    }
    cl->reqs |= PX_CONTRACT_AGREEMENT;
}

static void read_path(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, px_contract_path *path)
{
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "write {\"tokens\": [1, 403, 407]} or {\"prompt\": \"name\"}",
             "a path must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"tokens", "prompt", NULL};
    check_members(ctx, v, ptr, known, "a path");
    const json_t *tokens = json_object_get(v, "tokens");
    const json_t *prompt = json_object_get(v, "prompt");
    if (!tokens == !prompt) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "give exactly one of \"tokens\" or \"prompt\"",
             "a path needs either token ids or a prompt name");
        return;
    }
    if (prompt) {
        size_t mark = ptr_push(ptr, "prompt");
        path->prompt = read_id(ctx, prompt, ptr->buf, "the prompt name");
        ptr_pop(ptr, mark);
        return;
    }
    size_t mark = ptr_push(ptr, "tokens");
    size_t n = json_is_array(tokens) ? json_array_size(tokens) : 0;
    if (!json_is_array(tokens) || n == 0 || n > PX_CONTRACT_MAX_PATH_TOKENS) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "give 1 to 4096 token ids",
             "tokens must be a non-empty array of at most %d token ids",
             PX_CONTRACT_MAX_PATH_TOKENS);
        ptr_pop(ptr, mark);
        return;
    }
    int32_t *ids = px_arena_calloc(ctx->c->arena, n, sizeof *ids);
    if (!ids) {
        ctx->oom = true;
        ptr_pop(ptr, mark);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t m2 = ptr_push_index(ptr, i);
        uint64_t id;
        if (read_uint(ctx, json_array_get(tokens, i), ptr->buf, "a token id", 0, INT32_MAX, &id))
            ids[i] = (int32_t)id;
        ptr_pop(ptr, m2);
    }
    path->tokens = ids;
    path->n_tokens = n;
    ptr_pop(ptr, mark);
}

static void read_exact_logits(parse_ctx *ctx, const json_t *v, px_strbuf *ptr,
                              px_contract_clause *cl)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_array(v) || n == 0 || n > PX_CONTRACT_MAX_PATHS) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "write a list such as [{\"tokens\": [1, 403, 407]}, {\"prompt\": \"greeting\"}]",
             "exact_logits must be a non-empty array of at most %d paths", PX_CONTRACT_MAX_PATHS);
        return;
    }
    px_contract_path *paths = px_arena_calloc(ctx->c->arena, n, sizeof *paths);
    if (!paths) {
        ctx->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t mark = ptr_push_index(ptr, i);
        read_path(ctx, json_array_get(v, i), ptr, &paths[i]);
        ptr_pop(ptr, mark);
    }
    cl->paths = paths;
    cl->n_paths = n;
    cl->reqs |= PX_CONTRACT_EXACT_LOGITS;
}

static void read_clause(parse_ctx *ctx, const json_t *v, px_strbuf *ptr, const char *pattern,
                        px_contract_clause *cl)
{
    memset(cl, 0, sizeof *cl);
    cl->pattern = pattern;
    if (json_is_string(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write an object, e.g. {\"bitwise\": true}",
             "a clause is an object of requirements, not the string \"%.32s\"",
             json_string_value(v));
        return;
    }
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf, "write an object, e.g. {\"deterministic\": true}",
             "a clause must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"bitwise",   "deterministic", "tolerance", "divergence",
                                        "agreement", "exact_logits",  NULL};
    check_members(ctx, v, ptr, known, "a clause");
    static const struct {
        const char *key;
        void (*read)(parse_ctx *, const json_t *, px_strbuf *, px_contract_clause *);
    } readers[] = {
        {"bitwise", read_bitwise},     {"deterministic", read_deterministic},
        {"tolerance", read_tolerance}, {"divergence", read_divergence},
        {"agreement", read_agreement}, {"exact_logits", read_exact_logits},
    };
    bool any = false;
    for (size_t i = 0; i < PX_ARRAY_LEN(readers); i++) {
        const json_t *m = json_object_get(v, readers[i].key);
        if (!m)
            continue;
        any = true;
        size_t mark = ptr_push(ptr, readers[i].key);
        readers[i].read(ctx, m, ptr, cl);
        ptr_pop(ptr, mark);
    }
    if (!any && json_object_size(v) == 0) {
        /* An empty clause would allow every transformation; the contract
         * must say so in words instead (a loose tolerance, say). */
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "add a requirement: bitwise, deterministic, tolerance, divergence, agreement or "
             "exact_logits",
             "the clause requires nothing");
    }
    if ((cl->reqs & PX_CONTRACT_BITWISE) && (cl->reqs & ~(unsigned)PX_CONTRACT_BITWISE))
        diag(ctx, PX_SEV_WARNING, ptr->buf, "keep only \"bitwise\"",
             "bitwise already implies the clause's other requirements");
}

/* ---- The document ---------------------------------------------------- */

/* Overlaps are reported up to this many: a hostile contract of 1024
 * overlapping globs would otherwise produce half a million messages. */
#define MAX_OVERLAPS_REPORTED 64

static int cmp_region(const void *a, const void *b)
{
    return strcmp(((const px__region *)a)->key, ((const px__region *)b)->key);
}

static void read_validation(parse_ctx *ctx, const json_t *v, px_strbuf *ptr)
{
    px_contract *c = ctx->c;
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "write {\"prompt_set\": \"default\", \"prompts\": 16, \"tokens\": 2048}",
             "validation must be an object, not %s", px_json_type_name(v));
        return;
    }
    static const char *const known[] = {"prompt_set", "prompts", "tokens", NULL};
    check_members(ctx, v, ptr, known, "validation");
    const json_t *m;
    if ((m = json_object_get(v, "prompt_set"))) {
        size_t mark = ptr_push(ptr, "prompt_set");
        const char *s = read_id(ctx, m, ptr->buf, "the prompt set");
        if (s)
            c->prompt_set = s;
        ptr_pop(ptr, mark);
    }
    if ((m = json_object_get(v, "prompts"))) {
        size_t mark = ptr_push(ptr, "prompts");
        read_uint(ctx, m, ptr->buf, "prompts", 1, PX__CONTRACT_MAX_PROMPTS, &c->prompts);
        ptr_pop(ptr, mark);
    }
    if ((m = json_object_get(v, "tokens"))) {
        size_t mark = ptr_push(ptr, "tokens");
        read_uint(ctx, m, ptr->buf, "tokens", 1, PX__CONTRACT_MAX_TOKENS, &c->tokens);
        ptr_pop(ptr, mark);
    }
    if (c->tokens < c->prompts)
        diag(ctx, PX_SEV_ERROR, ptr->buf, "give at least one token per prompt",
             "the budget of %" PRIu64 " tokens is smaller than its %" PRIu64 " prompts", c->tokens,
             c->prompts);
}

static void read_regions(parse_ctx *ctx, const json_t *v, px_strbuf *ptr)
{
    px_contract *c = ctx->c;
    if (!json_is_object(v)) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "write an object from region pattern to clause, e.g. {\"layer.*.ffn\": {...}}",
             "regions must be an object, not %s", px_json_type_name(v));
        return;
    }
    size_t n = json_object_size(v);
    if (n > PX_CONTRACT_MAX_REGIONS) {
        diag(ctx, PX_SEV_ERROR, ptr->buf,
             "merge entries with patterns (\"layer.*.ffn\", \"layer.0-7.attention\")",
             "%zu region entries, more than the limit of %d", n, PX_CONTRACT_MAX_REGIONS);
        return;
    }
    if (n == 0)
        return;
    c->regions = px_arena_calloc(c->arena, n, sizeof *c->regions);
    if (!c->regions) {
        ctx->oom = true;
        return;
    }
    const char *key;
    json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)v, key, val)
    {
        px__region *r = &c->regions[i++];
        r->key = px_arena_strdup(c->arena, key);
        if (!r->key) {
            ctx->oom = true;
            return;
        }
    }
    c->n_regions = n;
    /* Canonical order, so diagnostics and exports do not depend on the
     * order of the input. */
    qsort(c->regions, n, sizeof *c->regions, cmp_region);
    bool *bad = calloc(n, sizeof *bad);
    if (!bad) {
        ctx->oom = true;
        return;
    }
    for (i = 0; i < n; i++) {
        px__region *r = &c->regions[i];
        size_t mark = ptr_push(ptr, r->key);
        char why[192];
        if (px__pattern_parse(r->key, true, &r->pattern, why, sizeof why) != PX_OK) {
            bad[i] = true;
            diag(ctx, PX_SEV_ERROR, ptr->buf,
                 "write a region name (\"layer.3.ffn\"), a glob with whole-segment \"*\" "
                 "(\"layer.*.ffn\") or a range (\"layer.0-3.attention\")",
                 "region pattern \"%.64s\" %s", r->key, why);
        } else if (!strcmp(r->key, "default")) {
            diag(ctx, PX_SEV_WARNING, ptr->buf,
                 "move the clause to the top-level \"default\" if it is meant for unlisted "
                 "regions",
                 "an entry named \"default\" under regions matches only a region called "
                 "\"default\"");
        }
        read_clause(ctx, json_object_get(v, r->key), ptr, r->key, &r->clause);
        ptr_pop(ptr, mark);
    }
    c->wild = px_arena_calloc(c->arena, n, sizeof *c->wild);
    if (!c->wild) {
        ctx->oom = true;
        free(bad);
        return;
    }
    for (i = 0; i < n; i++)
        if (!bad[i] && (c->regions[i].pattern.n_star || c->regions[i].pattern.n_range))
            c->wild[c->n_wild++] = i;
    /* Entries that match a common region with equal specificity leave that
     * region's clause undefined.  Two exact names never overlap (their
     * keys differ) and an exact name is never as specific as a pattern, so
     * only pairs of patterns need comparing. */
    size_t n_overlaps = 0;
    for (size_t a = 0; a < c->n_wild && n_overlaps < MAX_OVERLAPS_REPORTED; a++) {
        for (size_t b = a + 1; b < c->n_wild && n_overlaps < MAX_OVERLAPS_REPORTED; b++) {
            const px__region *ra = &c->regions[c->wild[a]], *rb = &c->regions[c->wild[b]];
            if (px__pattern_cmp_specificity(&ra->pattern, &rb->pattern) != 0)
                continue;
            char witness[PX_CONTRACT_MAX_PATTERN + 1];
            if (!px__pattern_intersect(&ra->pattern, &rb->pattern, witness, sizeof witness))
                continue;
            size_t mark = ptr_push(ptr, rb->key);
            diag(ctx, PX_SEV_ERROR, ptr->buf,
                 "add an entry for the overlap, or narrow one of the two patterns",
                 "\"%.64s\" and \"%.64s\" are equally specific and both match \"%s\"", ra->key,
                 rb->key, witness);
            ptr_pop(ptr, mark);
            n_overlaps++;
        }
    }
    if (n_overlaps == MAX_OVERLAPS_REPORTED)
        diag(ctx, PX_SEV_ERROR, ptr->buf, "resolve the overlaps above and validate again",
             "more overlapping entries not listed");
    free(bad);
}

/* Resolves the clauses' defaults that depend on contract-wide settings. */
static void resolve_clause(const px_contract *c, px_contract_clause *cl)
{
    if ((cl->reqs & PX_CONTRACT_BITWISE) && !cl->reference)
        cl->reference = c->reference;
}

static void read_document(parse_ctx *ctx, const json_t *doc)
{
    px_contract *c = ctx->c;
    px_strbuf ptr = PX_STRBUF_INIT;
    if (!json_is_object(doc)) {
        diag(ctx, PX_SEV_ERROR, "",
             "start from {\"schema\": \"plexus.contract/1\", \"default\": {\"deterministic\": "
             "true}}",
             "a contract is a JSON object, not %s", px_json_type_name(doc));
        return;
    }
    static const char *const known[] = {"schema",     "name",    "description", "reference",
                                        "validation", "default", "regions",     NULL};
    check_members(ctx, doc, &ptr, known, "a contract");

    const json_t *schema = json_object_get(doc, "schema");
    if (!schema)
        diag(ctx, PX_SEV_ERROR, "", "add \"schema\": \"plexus.contract/1\"",
             "the member \"schema\" is missing");
    else if (!json_is_string(schema) || strcmp(json_string_value(schema), PX_CONTRACT_SCHEMA))
        diag(ctx, PX_SEV_ERROR, "/schema",
             "write \"plexus.contract/1\"; this version of plexus reads no other",
             "unsupported schema %s%.64s%s", json_is_string(schema) ? "\"" : "(",
             json_is_string(schema) ? json_string_value(schema) : px_json_type_name(schema),
             json_is_string(schema) ? "\"" : ")");

    const json_t *m;
    if ((m = json_object_get(doc, "name")))
        c->name = read_text(ctx, m, "/name", "the name", PX_CONTRACT_MAX_ID);
    if ((m = json_object_get(doc, "description")))
        c->description = read_text(ctx, m, "/description", "the description", PX_CONTRACT_MAX_TEXT);
    if ((m = json_object_get(doc, "reference"))) {
        const char *ref = read_id(ctx, m, "/reference", "the reference");
        if (ref)
            c->reference = ref;
    }
    if ((m = json_object_get(doc, "validation"))) {
        size_t mark = ptr_push(&ptr, "validation");
        read_validation(ctx, m, &ptr);
        ptr_pop(&ptr, mark);
    }
    const json_t *def = json_object_get(doc, "default");
    if (!def) {
        diag(ctx, PX_SEV_ERROR, "",
             "add \"default\": {\"deterministic\": true} (or the clause unlisted regions need)",
             "the member \"default\" is missing; every region needs a clause");
    } else {
        size_t mark = ptr_push(&ptr, "default");
        read_clause(ctx, def, &ptr, "default", &c->default_clause);
        ptr_pop(&ptr, mark);
    }
    if ((m = json_object_get(doc, "regions"))) {
        size_t mark = ptr_push(&ptr, "regions");
        read_regions(ctx, m, &ptr);
        ptr_pop(&ptr, mark);
    }
    resolve_clause(c, &c->default_clause);
    for (size_t i = 0; i < c->n_regions; i++)
        resolve_clause(c, &c->regions[i].clause);
    px_strbuf_release(&ptr);
}

px_status px_contract_from_json(const json_t *doc, const char *name, px_diags *diags,
                                px_contract **out, px_err *err)
{
    *out = NULL;
    if (!name)
        name = "contract";
    px_diags local;
    px_diags_init(&local);
    parse_ctx ctx = {.diags = diags ? diags : &local, .name = name};
    px_status st = PX_OK;
    px_contract *c = calloc(1, sizeof *c);
    if (!c) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    st = px_arena_new(0, &c->arena, err);
    if (st != PX_OK)
        goto fail_contract;
    c->reference = PX__CONTRACT_DEFAULT_REFERENCE;
    c->prompt_set = PX__CONTRACT_DEFAULT_PROMPT_SET;
    c->prompts = PX__CONTRACT_DEFAULT_PROMPTS;
    c->tokens = PX__CONTRACT_DEFAULT_TOKENS;
    ctx.c = c;
    read_document(&ctx, doc);
    if (ctx.oom) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory while reading the contract", name);
        goto fail_contract;
    }
    if (ctx.n_errors) {
        if (ctx.n_errors == 1)
            st = px_err_set(err, PX_EVALIDATE, "%s: %s", name, ctx.first);
        else
            st = px_err_set(err, PX_EVALIDATE, "%s: %s (and %zu more problems)", name, ctx.first,
                            ctx.n_errors - 1);
        goto fail_contract;
    }
    *out = c;
    goto done;
fail_contract:
    px_contract_free(c);
done:
    px_diags_release(&local);
    return st;
}

px_status px_contract_parse(const char *text, size_t len, const char *name, px_diags *diags,
                            px_contract **out, px_err *err)
{
    *out = NULL;
    if (!name)
        name = "contract";
    /* The document bounds sit a little above the contract's own limits so
     * that an oversize section is reported by the contract reader, with
     * its pointer and fix, rather than by the generic JSON check. */
    px_json_limits lim = {
        .max_bytes = PX_CONTRACT_MAX_BYTES,
        .max_depth = 16,
        .max_string = 2 * PX_CONTRACT_MAX_TEXT,
        .max_elements = 4 * PX_CONTRACT_MAX_PATH_TOKENS,
    };
    json_t *doc;
    px_status st = px_json_parse(text, len, name, &lim, &doc, err);
    if (st != PX_OK) {
        if (diags)
            px_diags_add(diags, PX_SEV_ERROR, "",
                         st == PX_ELIMIT ? "shrink the document" : "fix the JSON syntax", "%s",
                         err ? err->msg : px_status_str(st));
        return st;
    }
    st = px_contract_from_json(doc, name, diags, out, err);
    json_decref(doc);
    return st;
}
