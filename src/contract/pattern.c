/*
 * Region names and the patterns that select them.
 *
 * A region name is dot-separated segments of [A-Za-z0-9_-] ("layer.3.ffn").
 * A pattern is a name in which a whole segment may be "*" (any one segment)
 * or a range "lo-hi" (a decimal index in [lo, hi]).  Keeping wildcards to
 * whole segments makes two patterns' overlap decidable segment by segment,
 * so that ambiguous contracts are caught when they are read, not when a
 * model happens to have the region both entries match.
 */
#include "contract/contract_impl.h"

static bool is_name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-';
}

bool px__parse_index(const char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 10)
        return false;
    if (len > 1 && s[0] == '0')
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

/* Whether a segment has the shape digits-digits, which is always read as a
 * range (so "0-3" can never be a literal by accident). */
static bool looks_like_range(const char *s, size_t len, size_t *dash)
{
    size_t i = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == 0 || i == len || s[i] != '-')
        return false;
    size_t d = i++;
    if (i == len)
        return false;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i != len)
        return false;
    *dash = d;
    return true;
}

static px_status fail(char *why, size_t why_len, const char *fmt, ...) PX_PRINTF(3, 4);
static px_status fail(char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return PX_EINVAL;
}

/* offset is where the segment starts in the whole name, for messages. */
static px_status parse_segment(const char *s, size_t len, size_t offset, bool allow_wild,
                               px__segment *seg, char *why, size_t why_len)
{
    memset(seg, 0, sizeof *seg);
    if (len == 0)
        return fail(why, why_len, "has an empty segment (two dots, or a dot at an end)");
    if (len == 1 && s[0] == '*') {
        if (!allow_wild)
            return fail(why, why_len, "contains \"*\", which only patterns may use");
        seg->kind = PX__SEG_STAR;
        return PX_OK;
    }
    size_t dash;
    if (looks_like_range(s, len, &dash)) {
        if (!allow_wild)
            return fail(why, why_len, "contains the range \"%.*s\", which only patterns may use",
                        (int)len, s);
        uint64_t lo, hi;
        if (!px__parse_index(s, dash, &lo) || !px__parse_index(s + dash + 1, len - dash - 1, &hi))
            return fail(why, why_len,
                        "range \"%.*s\" has a bound with a leading zero; write bounds as plain "
                        "numbers (\"0-3\")",
                        (int)len, s);
        if (lo > hi)
            return fail(why, why_len, "range \"%.*s\" is empty; write the lower bound first",
                        (int)len, s);
        if (hi > PX_CONTRACT_MAX_RANGE)
            return fail(why, why_len, "range \"%.*s\" goes past the limit of %d", (int)len, s,
                        PX_CONTRACT_MAX_RANGE);
        seg->kind = PX__SEG_RANGE;
        seg->lo = (uint32_t)lo;
        seg->hi = (uint32_t)hi;
        seg->text = s;
        seg->len = len;
        return PX_OK;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '*')
            return fail(why, why_len,
                        "segment \"%.*s\" mixes \"*\" with other characters; \"*\" stands for a "
                        "whole segment",
                        (int)len, s);
        if (!is_name_char(s[i]))
            return fail(why, why_len,
                        "has the character 0x%02x at byte %zu; names use letters, digits, "
                        "'_', '-' and '.'",
                        (unsigned char)s[i], offset + i);
    }
    seg->kind = PX__SEG_LITERAL;
    seg->text = s;
    seg->len = len;
    return PX_OK;
}

px_status px__pattern_parse(const char *text, bool allow_wild, px__pattern *out, char *why,
                            size_t why_len)
{
    memset(out, 0, sizeof *out);
    if (!text || !text[0])
        return fail(why, why_len, "is empty");
    size_t total = strlen(text);
    if (total > PX_CONTRACT_MAX_PATTERN)
        return fail(why, why_len, "is %zu bytes long, more than the limit of %d", total,
                    PX_CONTRACT_MAX_PATTERN);
    const char *s = text;
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (out->n_seg == PX_CONTRACT_MAX_SEGMENTS)
            return fail(why, why_len, "has more than %d dot-separated segments",
                        PX_CONTRACT_MAX_SEGMENTS);
        px__segment *seg = &out->seg[out->n_seg];
        px_status st = parse_segment(s, len, (size_t)(s - text), allow_wild, seg, why, why_len);
        if (st != PX_OK)
            return st;
        out->n_seg++;
        if (seg->kind == PX__SEG_STAR)
            out->n_star++;
        else if (seg->kind == PX__SEG_RANGE)
            out->n_range++;
        if (!dot)
            break;
        s = dot + 1;
    }
    return PX_OK;
}

static bool segment_matches(const px__segment *p, const px__segment *n)
{
    switch (p->kind) {
    case PX__SEG_STAR:
        return true;
    case PX__SEG_RANGE: {
        uint64_t v;
        return px__parse_index(n->text, n->len, &v) && v >= p->lo && v <= p->hi;
    }
    case PX__SEG_LITERAL:
    default:
        return p->len == n->len && memcmp(p->text, n->text, p->len) == 0;
    }
}

bool px__pattern_matches(const px__pattern *p, const px__pattern *name)
{
    if (p->n_seg != name->n_seg)
        return false;
    for (size_t i = 0; i < p->n_seg; i++)
        if (!segment_matches(&p->seg[i], &name->seg[i]))
            return false;
    return true;
}

/* Whether some segment is accepted by both a and b; writes one to w when
 * w is not NULL. */
static bool segment_intersect(const px__segment *a, const px__segment *b, px_strbuf *w)
{
    if (a->kind == PX__SEG_LITERAL || b->kind == PX__SEG_LITERAL) {
        const px__segment *lit = a->kind == PX__SEG_LITERAL ? a : b;
        const px__segment *other = lit == a ? b : a;
        if (!segment_matches(other, lit))
            return false;
        if (w)
            px_strbuf_add(w, lit->text, lit->len);
        return true;
    }
    if (a->kind == PX__SEG_STAR && b->kind == PX__SEG_STAR) {
        if (w)
            px_strbuf_addch(w, '0');
        return true;
    }
    uint32_t lo = 0, hi = UINT32_MAX;
    if (a->kind == PX__SEG_RANGE) {
        lo = a->lo;
        hi = a->hi;
    }
    if (b->kind == PX__SEG_RANGE) {
        lo = PX_MAX(lo, b->lo);
        hi = PX_MIN(hi, b->hi);
    }
    if (lo > hi)
        return false;
    if (w)
        px_strbuf_addf(w, "%" PRIu32, lo);
    return true;
}

bool px__pattern_intersect(const px__pattern *a, const px__pattern *b, char *witness,
                           size_t witness_len)
{
    if (a->n_seg != b->n_seg)
        return false;
    /* Validation compares every pair of entries, so the common case (no
     * overlap) is decided without building anything. */
    for (size_t i = 0; i < a->n_seg; i++)
        if (!segment_intersect(&a->seg[i], &b->seg[i], NULL))
            return false;
    if (!witness || !witness_len)
        return true;
    px_strbuf w = PX_STRBUF_INIT;
    for (size_t i = 0; i < a->n_seg; i++) {
        if (i)
            px_strbuf_addch(&w, '.');
        segment_intersect(&a->seg[i], &b->seg[i], &w);
    }
    px_strlcpy(witness, w.buf, witness_len);
    px_strbuf_release(&w);
    return true;
}

int px__pattern_cmp_specificity(const px__pattern *a, const px__pattern *b)
{
    if (a->n_star != b->n_star)
        return a->n_star < b->n_star ? -1 : 1;
    if (a->n_range != b->n_range)
        return a->n_range < b->n_range ? -1 : 1;
    return 0;
}
