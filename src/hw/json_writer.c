/* Canonical JSON text without a tree: the format of px_json_dump_canonical
 * (jansson, JSON_SORT_KEYS | JSON_INDENT(2) | JSON_REAL_PRECISION(17)). */
#include "hw/json_writer.h"

/* Formatting a quantity costs a search for its shortest exact decimal;
 * exports repeat the same figures (catalogue values) thousands of times,
 * so the text of recent ones is kept in a direct-mapped cache. */
#define MEMO_SLOTS 4096

typedef struct memo_slot {
    double value;
    int dim; /* px_dim, or -1 for a bare real */
    bool used;
    char text[48];
} memo_slot;

struct px__jw_memo {
    memo_slot slots[MEMO_SLOTS];
};

void px__jw_init(px__jw *w, px_strbuf *out, int depth)
{
    memset(w, 0, sizeof *w);
    w->out = out;
    w->depth = depth;
    w->first[depth] = true;
    w->memo = calloc(1, sizeof *w->memo); /* optional: NULL only slows down */
}

void px__jw_release(px__jw *w)
{
    free(w->memo);
    w->memo = NULL;
}

static void put(px__jw *w, const char *s, size_t n)
{
    if (px_strbuf_add(w->out, s, n) != PX_OK)
        w->oom = true;
}

static void puts_(px__jw *w, const char *s)
{
    put(w, s, strlen(s));
}

static void newline(px__jw *w, int depth)
{
    static const char spaces[] = "                                ";
    put(w, "\n", 1);
    for (int left = 2 * depth; left > 0;) {
        int n = left < (int)sizeof spaces - 1 ? left : (int)sizeof spaces - 1;
        put(w, spaces, (size_t)n);
        left -= n;
    }
}

static void begin(px__jw *w, char c)
{
    put(w, &c, 1);
    PX_ASSERT(w->depth < PX__JW_MAX_DEPTH);
    w->depth++;
    w->first[w->depth] = true;
    w->last_key[w->depth] = NULL;
}

static void end(px__jw *w, char c)
{
    if (!w->first[w->depth])
        newline(w, w->depth - 1);
    w->depth--;
    put(w, &c, 1);
}

void px__jw_begin_object(px__jw *w)
{
    begin(w, '{');
}

void px__jw_begin_array(px__jw *w)
{
    begin(w, '[');
}

void px__jw_end_object(px__jw *w)
{
    end(w, '}');
}

void px__jw_end_array(px__jw *w)
{
    end(w, ']');
}

void px__jw_item(px__jw *w)
{
    if (!w->first[w->depth])
        put(w, ",", 1);
    w->first[w->depth] = false;
    newline(w, w->depth);
}

void px__jw_key(px__jw *w, const char *key)
{
    /* Members out of order would make the text differ from the canonical
     * dump: a defect in the caller, not in the input. */
    PX_ASSERT(!w->last_key[w->depth] || strcmp(w->last_key[w->depth], key) < 0);
    w->last_key[w->depth] = key;
    px__jw_item(w);
    px__jw_string(w, key);
    put(w, ": ", 2);
}

void px__jw_string(px__jw *w, const char *s)
{
    put(w, "\"", 1);
    const char *run = s;
    for (const char *p = s;; p++) {
        unsigned char c = (unsigned char)*p;
        if (c && c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(w, run, (size_t)(p - run));
        if (!c)
            break;
        char esc[8];
        switch (c) {
        case '"':
            puts_(w, "\\\"");
            break;
        case '\\':
            puts_(w, "\\\\");
            break;
        case '\b':
            puts_(w, "\\b");
            break;
        case '\f':
            puts_(w, "\\f");
            break;
        case '\n':
            puts_(w, "\\n");
            break;
        case '\r':
            puts_(w, "\\r");
            break;
        case '\t':
            puts_(w, "\\t");
            break;
        default:
            snprintf(esc, sizeof esc, "\\u%04X", c);
            puts_(w, esc);
        }
        run = p + 1;
    }
    put(w, "\"", 1);
}

void px__jw_bool(px__jw *w, bool b)
{
    puts_(w, b ? "true" : "false");
}

static memo_slot *memo_find(px__jw *w, double v, int dim)
{
    if (!w->memo)
        return NULL;
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits ^= (uint64_t)(dim + 1) * 0x9e3779b97f4a7c15ULL;
    bits ^= bits >> 29;
    bits *= 0xbf58476d1ce4e5b9ULL;
    bits ^= bits >> 32;
    return &w->memo->slots[bits & (MEMO_SLOTS - 1)];
}

/* jansson's jsonp_dtostr with precision 17. */
static void real_text(double v, char *buf, size_t n)
{
    snprintf(buf, n, "%.17g", v);
    size_t len = strlen(buf);
    if (strspn(buf, "0123456789-") == len && len + 2 < n) {
        memcpy(buf + len, ".0", 3);
        len += 2;
    }
    char *e = strchr(buf, 'e');
    if (e) {
        char *start = e + 1, *stop = e + 2;
        if (*start == '-')
            start++;
        while (*stop == '0')
            stop++;
        if (stop != start)
            memmove(start, stop, len - (size_t)(stop - buf) + 1);
    }
}

void px__jw_real(px__jw *w, double v)
{
    memo_slot *m = memo_find(w, v, -1);
    if (m && m->used && m->dim == -1 && m->value == v) {
        puts_(w, m->text);
        return;
    }
    char buf[48];
    real_text(v, buf, sizeof buf);
    if (m) {
        m->used = true;
        m->dim = -1;
        m->value = v;
        px_strlcpy(m->text, buf, sizeof m->text);
    }
    puts_(w, buf);
}

static const char *qty_text(px__jw *w, double value, px_dim dim, char *buf, size_t n)
{
    memo_slot *m = memo_find(w, value, (int)dim);
    if (m && m->used && m->dim == (int)dim && m->value == value)
        return m->text;
    px_qty_format(value, dim, buf, n);
    if (m) {
        m->used = true;
        m->dim = (int)dim;
        m->value = value;
        px_strlcpy(m->text, buf, sizeof m->text);
    }
    return buf;
}

void px__jw_qty(px__jw *w, const px_qty *q)
{
    char buf[64];
    bool plain = q->prov.kind == PX_PROV_UNSPECIFIED && !q->prov.source && !q->prov.at &&
                 q->unc.kind == PX_UNC_NONE && !q->valid.param;
    if (plain) {
        px__jw_string(w, qty_text(w, q->value, q->dim, buf, sizeof buf));
        return;
    }
    px__jw_begin_object(w);
    if (q->prov.at) {
        char t[32];
        px_time_format(q->prov.at, t);
        px__jw_kstr(w, "at", t);
    }
    if (q->prov.kind != PX_PROV_UNSPECIFIED)
        px__jw_kstr(w, "provenance", px_prov_kind_name(q->prov.kind));
    px__jw_kstr(w, "source", q->prov.source);
    if (q->unc.kind == PX_UNC_RELATIVE) {
        px__jw_key(w, "uncertainty");
        px__jw_real(w, q->unc.rel);
    } else if (q->unc.kind == PX_UNC_INTERVAL) {
        px__jw_key(w, "uncertainty");
        px__jw_begin_array(w);
        px__jw_item(w);
        px__jw_string(w, qty_text(w, q->unc.lo, q->dim, buf, sizeof buf));
        px__jw_item(w);
        px__jw_string(w, qty_text(w, q->unc.hi, q->dim, buf, sizeof buf));
        px__jw_end_array(w);
    }
    if (q->valid.param) {
        px__jw_key(w, "valid");
        px__jw_begin_object(w);
        if (!isnan(q->valid.max)) {
            px__jw_key(w, "max");
            px__jw_string(w, qty_text(w, q->valid.max, q->valid.dim, buf, sizeof buf));
        }
        if (!isnan(q->valid.min)) {
            px__jw_key(w, "min");
            px__jw_string(w, qty_text(w, q->valid.min, q->valid.dim, buf, sizeof buf));
        }
        px__jw_kstr(w, "param", q->valid.param);
        px__jw_end_object(w);
    }
    px__jw_key(w, "value");
    px__jw_string(w, qty_text(w, q->value, q->dim, buf, sizeof buf));
    px__jw_end_object(w);
}

void px__jw_kstr(px__jw *w, const char *key, const char *s)
{
    if (!s)
        return;
    px__jw_key(w, key);
    px__jw_string(w, s);
}

void px__jw_kqty(px__jw *w, const char *key, const px_qty *q)
{
    if (!px_hw_has(*q))
        return;
    px__jw_key(w, key);
    px__jw_qty(w, q);
}
