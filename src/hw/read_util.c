/* The inventory reader's small pieces: diagnostics with pointers, member
 * checks, identifiers, strings, quantities and live state. */
#include "hw/hw_impl.h"

static void add_diag(px__hw_reader *r, px_severity sev, const char *pointer, const char *fix,
                     const char *fmt, va_list ap)
{
    if (r->strict && sev == PX_SEV_WARNING)
        sev = PX_SEV_ERROR;
    if (sev == PX_SEV_ERROR)
        r->n_errors++;
    if (!r->diags)
        return;
    px_strbuf sb = PX_STRBUF_INIT;
    if (px_strbuf_vaddf(&sb, fmt, ap) != PX_OK) {
        r->oom = true;
        px_strbuf_release(&sb);
        return;
    }
    if (px_diags_add(r->diags, sev, pointer, fix, "%s", sb.buf) == PX_ENOMEM)
        r->oom = true;
    px_strbuf_release(&sb);
}

static size_t string_slot(const char *s, size_t cap)
{
    uint64_t h = px_hash64(s, strlen(s));
    h ^= h >> 31;
    return (size_t)h & (cap - 1);
}

const char *px__hw_intern(px__hw_reader *r, const char *s)
{
    if (!s)
        return NULL;
    if (2 * (r->strings_n + 1) > r->strings_cap) {
        size_t cap = r->strings_cap ? 2 * r->strings_cap : 256;
        const char **t = calloc(cap, sizeof *t);
        if (!t) {
            r->oom = true;
            return NULL;
        }
        for (size_t i = 0; i < r->strings_cap; i++) {
            if (!r->strings[i])
                continue;
            size_t k = string_slot(r->strings[i], cap);
            while (t[k])
                k = (k + 1) & (cap - 1);
            t[k] = r->strings[i];
        }
        free(r->strings);
        r->strings = t;
        r->strings_cap = cap;
    }
    size_t k = string_slot(s, r->strings_cap);
    while (r->strings[k]) {
        if (!strcmp(r->strings[k], s))
            return r->strings[k];
        k = (k + 1) & (r->strings_cap - 1);
    }
    const char *c = px_arena_strdup(r->arena, s);
    if (!c) {
        r->oom = true;
        return NULL;
    }
    r->strings[k] = c;
    r->strings_n++;
    return c;
}

void px__hw_reader_release(px__hw_reader *r)
{
    free(r->strings);
    r->strings = NULL;
    r->strings_cap = r->strings_n = 0;
}

void px__hw_error(px__hw_reader *r, const char *pointer, const char *fix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_diag(r, PX_SEV_ERROR, pointer, fix, fmt, ap);
    va_end(ap);
}

void px__hw_warning(px__hw_reader *r, const char *pointer, const char *fix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_diag(r, PX_SEV_WARNING, pointer, fix, fmt, ap);
    va_end(ap);
}

static void add_diag_at(px__hw_reader *r, px_severity sev, const char *where, const char *k1,
                        const char *k2, const char *fix, const char *fmt, va_list ap)
{
    px_strbuf p = PX_STRBUF_INIT;
    px_strbuf_adds(&p, where);
    for (const char *k = k1; k; k = k == k1 ? k2 : NULL) {
        px_strbuf_addch(&p, '/');
        px_strbuf_add_pointer_token(&p, k);
    }
    add_diag(r, sev, p.buf, fix, fmt, ap);
    px_strbuf_release(&p);
}

void px__hw_error_at(px__hw_reader *r, const char *where, const char *k1, const char *k2,
                     const char *fix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_diag_at(r, PX_SEV_ERROR, where, k1, k2, fix, fmt, ap);
    va_end(ap);
}

void px__hw_warning_at(px__hw_reader *r, const char *where, const char *k1, const char *k2,
                       const char *fix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_diag_at(r, PX_SEV_WARNING, where, k1, k2, fix, fmt, ap);
    va_end(ap);
}

const char *px__hw_ptr(px__hw_reader *r, const char *where, const char *key)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, where);
    px_strbuf_addch(&sb, '/');
    px_strbuf_add_pointer_token(&sb, key);
    char *p = px_arena_strndup(r->arena, sb.buf, sb.len);
    px_strbuf_release(&sb);
    if (!p) {
        r->oom = true;
        return "";
    }
    return p;
}

const char *px__hw_ptr_index(px__hw_reader *r, const char *where, const char *key, size_t index)
{
    char *p = key ? px_arena_printf(r->arena, "%s/%s/%zu", where, key, index)
                  : px_arena_printf(r->arena, "%s/%zu", where, index);
    if (!p) {
        r->oom = true;
        return "";
    }
    return p;
}

/* Edit distance between short strings, for "did you mean" hints.  Bounded
 * by the caller to names of at most 32 bytes. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[33];
    if (la > 32 || lb > 32)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

void px__hw_check_members(px__hw_reader *r, const json_t *obj, const char *where, const char *what,
                          const char *const *allowed)
{
    const char *key;
    json_t *child;
    json_object_foreach((json_t *)obj, key, child)
    {
        if (px_str_starts_with(key, "x-"))
            continue;
        bool known = false;
        for (const char *const *a = allowed; *a && !known; a++)
            known = !strcmp(*a, key);
        if (known)
            continue;
        const char *close = NULL;
        size_t best = 3;
        for (const char *const *a = allowed; *a; a++) {
            size_t d = edit_distance(key, *a);
            if (d < best) {
                best = d;
                close = *a;
            }
        }
        px_strbuf list = PX_STRBUF_INIT;
        for (const char *const *a = allowed; *a; a++)
            px_strbuf_addf(&list, "%s%s", a == allowed ? "" : ", ", *a);
        char *fix = close ? px_asprintf("did you mean \"%s\"? (names starting with \"x-\" "
                                        "are ignored)",
                                        close)
                          : px_asprintf("remove it, or prefix it with \"x-\" to keep it as "
                                        "an extension; known members: %s",
                                        list.buf);
        char shown[48];
        px_strlcpy(shown, key, sizeof shown);
        px__hw_error(r, px__hw_ptr(r, where, key), fix, "unknown member \"%s%s\" in %s", shown,
                     strlen(key) >= sizeof shown ? "..." : "", what);
        free(fix);
        px_strbuf_release(&list);
    }
}

bool px__hw_expect_object(px__hw_reader *r, const json_t *v, const char *where, const char *what)
{
    if (json_is_object(v))
        return true;
    px__hw_error(r, where, "write a JSON object {...} as docs/formats/inventory.md shows",
                 "%s must be an object, found %s", what, px_json_type_name(v));
    return false;
}

void px__hw_read_string(px__hw_reader *r, const json_t *obj, const char *where, const char *key,
                        const char **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return;
    if (!json_is_string(v)) {
        px__hw_error(r, px__hw_ptr(r, where, key), "write it as a JSON string",
                     "\"%s\" must be a string, found %s", key, px_json_type_name(v));
        return;
    }
    /* Strings are copied up to an embedded NUL: an id or a name with one
     * would print differently from what the file says. */
    if (strlen(json_string_value(v)) != json_string_length(v)) {
        px__hw_error(r, px__hw_ptr(r, where, key), "remove the \\u0000 escape",
                     "\"%s\" contains a NUL character", key);
        return;
    }
    const char *s = px__hw_intern(r, json_string_value(v));
    if (s)
        *out = s;
}

void px__hw_read_bool(px__hw_reader *r, const json_t *obj, const char *where, const char *key,
                      bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return;
    if (!json_is_boolean(v)) {
        px__hw_error(r, px__hw_ptr(r, where, key), "write true or false",
                     "\"%s\" must be a boolean, found %s", key, px_json_type_name(v));
        return;
    }
    *out = json_is_true(v);
}

bool px__hw_id_ok(const char *text)
{
    size_t n = 0;
    for (const char *p = text; *p; p++, n++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
        if (n >= PX__HW_MAX_ID)
            return false;
    }
    return n > 0;
}

bool px__hw_read_id(px__hw_reader *r, const json_t *obj, const char *where, const char *key,
                    const char *what, const char **out)
{
    json_t *v = json_object_get(obj, key);
    const char *p = px__hw_ptr(r, where, key);
    if (!v) {
        px__hw_error(r, where, "add an \"id\" of letters, digits, '_' and '-'", "%s has no \"%s\"",
                     what, key);
        return false;
    }
    if (!json_is_string(v)) {
        px__hw_error(r, p, "write the id as a string", "%s \"%s\" must be a string, found %s", what,
                     key, px_json_type_name(v));
        return false;
    }
    const char *s = json_string_value(v);
    if (!px__hw_id_ok(s) || strlen(s) != json_string_length(v)) {
        char shown[48];
        px_strlcpy(shown, s, sizeof shown);
        px__hw_error(r, p,
                     "use 1 to 64 letters, digits, '_' or '-' (no dots: they join "
                     "node and device ids)",
                     "%s id \"%s%s\" is not a valid identifier", what, shown,
                     strlen(s) >= sizeof shown ? "..." : "");
        return false;
    }
    *out = px_arena_strdup(r->arena, s);
    if (!*out) {
        r->oom = true;
        return false;
    }
    return true;
}

static const char *example_of(px_dim dim)
{
    switch (dim) {
    case PX_DIM_BYTES:
        return "write a size such as \"80 GiB\" or \"24 GB\"";
    case PX_DIM_BANDWIDTH:
        return "write a bandwidth such as \"3.35 TB/s\" or \"100 Gbit/s\"";
    case PX_DIM_FLOPS:
        return "write a rate such as \"989.4 TFLOP/s\" (or \"1979 TOP/s\" for integers)";
    case PX_DIM_TIME:
        return "write a time such as \"1.5 us\" or \"50000 h\"";
    case PX_DIM_POWER:
        return "write a power such as \"700 W\"";
    case PX_DIM_ENERGY:
        return "write an energy such as \"8 pJ\"";
    case PX_DIM_TEMPERATURE:
        return "write a temperature such as \"87 C\"";
    case PX_DIM_MONEY_RATE:
        return "write a money rate such as \"2.49 $/h\"";
    case PX_DIM_FREQUENCY:
        return "write a frequency such as \"1.98 GHz\"";
    default:
        return "write a number";
    }
}

/* px_qty_from_json prefixes its messages with `where`; the diagnostic
 * carries the pointer separately, so the prefix is dropped. */
static const char *strip_prefix(const char *msg, const char *where)
{
    size_t n = strlen(where);
    if (!strncmp(msg, where, n) && msg[n] == ':' && msg[n + 1] == ' ')
        return msg + n + 2;
    return msg;
}

bool px__hw_read_qty(px__hw_reader *r, const json_t *obj, const char *where, const char *key,
                     px_dim dim, bool positive, px_qty *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return true;
    px_qty q;
    px_err err;
    px_err_clear(&err);
    /* `where` names the parent only: the member's pointer is built when
     * there is something to report. */
    if (px_qty_from_json(v, dim, r->arena, where, &q, &err) != PX_OK) {
        if (err.code == PX_ENOMEM)
            r->oom = true;
        px__hw_error_at(r, where, key, NULL, example_of(dim), "%s", strip_prefix(err.msg, where));
        return false;
    }
    if (q.value < 0) {
        char text[64];
        px_qty_format(q.value, q.dim, text, sizeof text);
        px__hw_error_at(r, where, key, NULL, "give the magnitude; no figure here can be negative",
                        "\"%s\" is negative (%s)", key, text);
        return false;
    }
    if (positive && q.value == 0) {
        px__hw_error_at(r, where, key, NULL,
                        "give the real figure, or leave the member out when unknown",
                        "\"%s\" is zero", key);
        return false;
    }
    if (q.unc.kind == PX_UNC_INTERVAL && q.unc.lo < 0) {
        px__hw_error_at(r, where, key, NULL, "the interval's low end must not be negative",
                        "\"%s\" has a negative uncertainty bound", key);
        return false;
    }
    if (r->mode == PX__HW_READ_CATALOG &&
        (q.prov.kind == PX_PROV_UNSPECIFIED || !q.prov.source || !q.prov.source[0])) {
        px__hw_error_at(r, where, key, NULL,
                        "write {\"value\": ..., \"provenance\": \"datasheet\", \"source\": "
                        "\"<document name>\"}",
                        "catalogue figure \"%s\" has no provenance and source", key);
        return false;
    }
    q.prov.source = px__hw_intern(r, q.prov.source);
    q.valid.param = px__hw_intern(r, q.valid.param);
    *out = q;
    return true;
}

bool px__hw_read_string_list(px__hw_reader *r, const json_t *obj, const char *where,
                             const char *key, const char *const **out, size_t *n)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return false;
    const char *p = px__hw_ptr(r, where, key);
    if (!json_is_array(v)) {
        px__hw_error(r, p, "write a list such as [\"a\", \"b\"]",
                     "\"%s\" must be an array of strings, found %s", key, px_json_type_name(v));
        return false;
    }
    size_t count = json_array_size(v);
    const char **items = px_arena_calloc(r->arena, count ? count : 1, sizeof *items);
    if (!items) {
        r->oom = true;
        return false;
    }
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e) || json_string_length(e) == 0 ||
            strlen(json_string_value(e)) != json_string_length(e)) {
            px__hw_error(r, px__hw_ptr_index(r, p, NULL, i), "remove it or write a name",
                         "\"%s\" entries must be non-empty strings, found %s", key,
                         px_json_type_name(e));
            ok = false;
            continue;
        }
        items[k] = px__hw_intern(r, json_string_value(e));
        if (!items[k])
            return false;
        k++;
    }
    qsort(items, k, sizeof *items, px__hw_cmp_str);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || strcmp(items[m - 1], items[i]))
            items[m++] = items[i];
    *out = items;
    *n = m;
    return ok;
}

static const char *const node_live_members[] = {"memory_free", "load", NULL};
static const char *const device_live_members[] = {"memory_free", "utilization", "temperature",
                                                  NULL};

void px__hw_read_live(px__hw_reader *r, const json_t *obj, const char *where, bool device,
                      px_hw_live *out)
{
    memset(out, 0, sizeof *out);
    out->load = NAN;
    out->utilization = NAN;
    json_t *v = json_object_get(obj, "live");
    if (!v)
        return;
    const char *p = px__hw_ptr(r, where, "live");
    if (!px__hw_expect_object(r, v, p, "\"live\""))
        return;
    out->present = true;
    px__hw_check_members(r, v, p, "\"live\"", device ? device_live_members : node_live_members);
    px__hw_read_qty(r, v, p, "memory_free", PX_DIM_BYTES, false, &out->memory_free);
    const char *num_key = device ? "utilization" : "load";
    json_t *n = json_object_get(v, num_key);
    if (n) {
        double x = json_is_number(n) ? json_number_value(n) : NAN;
        if (!json_is_number(n) || !isfinite(x) || x < 0 || (device && x > 1))
            px__hw_error(r, px__hw_ptr(r, p, num_key),
                         device ? "write a fraction between 0 and 1"
                                : "write the load average per core, a number >= 0",
                         "\"%s\" must be a number %s", num_key,
                         device ? "between 0 and 1" : "of at least 0");
        else if (device)
            out->utilization = x;
        else
            out->load = x;
    }
    if (device)
        px__hw_read_qty(r, v, p, "temperature", PX_DIM_TEMPERATURE, false, &out->temperature);
}

void px__hw_device_init(px_hw_device *d)
{
    memset(d, 0, sizeof *d);
    d->node = PX_HW_NONE;
    d->endpoint = PX_HW_NONE;
    d->all_ops = true;
    d->live.load = NAN;
    d->live.utilization = NAN;
}

void px__hw_link_init(px_hw_link *l)
{
    memset(l, 0, sizeof *l);
    l->from = PX_HW_NONE;
    l->to = PX_HW_NONE;
    l->contention = PX_HW_NONE;
    l->kind = PX_HW_LINK_OTHER;
    l->trust = PX_HW_TRUST_TRUSTED;
    l->bidirectional = true;
}
