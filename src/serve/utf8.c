/*
 * UTF-8 for the front end: tokens end in the middle of characters (byte
 * tokens, merged pieces), JSON strings must be valid UTF-8, and chat
 * templates strip whitespace as Python does.
 */
#include "serve/serve_impl.h"

size_t px__utf8_seq_len(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* bounds of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* Whether the k bytes at s could be the start of a well-formed sequence
 * that more bytes would complete. */
static bool could_complete(const unsigned char *s, size_t k)
{
    unsigned char buf[4] = {0};
    memcpy(buf, s, k);
    /* Complete with the smallest continuation bytes allowed and check. */
    for (size_t i = k; i < 4; i++)
        buf[i] = 0x80;
    if (buf[0] == 0xE0 && k == 1)
        buf[1] = 0xA0;
    if (buf[0] == 0xF0 && k == 1)
        buf[1] = 0x90;
    size_t len = px__utf8_seq_len(buf, 4);
    return len > k;
}

size_t px__utf8_incomplete_tail(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* A sequence is at most 4 bytes: its lead is among the last 3. */
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = u[n - k];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: look further back */
        return c >= 0xC0 && could_complete(u + n - k, k) ? k : 0;
    }
    return 0;
}

bool px__utf8_boundary(const char *s, size_t len, size_t n)
{
    return n >= len || ((unsigned char)s[n] & 0xC0) != 0x80;
}

px_status px__utf8_add_sanitized(px_strbuf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes at i - run .. i not yet copied */
    while (i < n) {
        size_t len = px__utf8_seq_len(u + i, n - i);
        if (len > 0) {
            i += len;
            run += len;
            continue;
        }
        if (px_strbuf_add(out, s + i - run, run) != PX_OK ||
            px_strbuf_add(out, "\xef\xbf\xbd", 3) != PX_OK)
            return PX_ENOMEM;
        run = 0;
        /* One U+FFFD for the longest start of a sequence that is cut
         * short (Unicode's "maximal subpart"), else for one byte. */
        size_t k = 1;
        while (k < 3 && i + k < n && could_complete(u + i, k + 1))
            k++;
        i += could_complete(u + i, 1) ? k : 1;
    }
    return px_strbuf_add(out, s + n - run, run);
}

/* The code point of the well-formed sequence of len bytes at s. */
static uint32_t decode(const unsigned char *s, size_t len)
{
    static const unsigned char lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & lead_mask[len];
    for (size_t i = 1; i < len; i++)
        cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

static bool is_py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

void px__utf8_strip(const char *s, size_t n, size_t *start, size_t *end)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0;
    while (a < n) {
        size_t len = px__utf8_seq_len(u + a, n - a);
        if (len == 0 || !is_py_space(decode(u + a, len)))
            break;
        a += len;
    }
    size_t b = n;
    while (b > a) {
        /* Step back to the lead byte of the last character. */
        size_t k = 1;
        while (k < 4 && b - k > a && (u[b - k] & 0xC0) == 0x80)
            k++;
        size_t len = px__utf8_seq_len(u + b - k, k);
        if (len != k || !is_py_space(decode(u + b - k, len)))
            break;
        b -= k;
    }
    *start = a;
    *end = b;
}
