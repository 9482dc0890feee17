/*
 * UTF-8 for text a model writes: tokens end in the middle of characters
 * (byte tokens, merged pieces, a sequence cut by the token limit), and
 * JSON strings must be valid UTF-8.
 */
#include "base/common.h"

size_t px_utf8_seq_len(const unsigned char *s, size_t n)
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
    size_t len = px_utf8_seq_len(buf, 4);
    return len > k;
}

size_t px_utf8_incomplete_tail(const char *s, size_t n)
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

bool px_utf8_boundary(const char *s, size_t len, size_t n)
{
    return n >= len || ((unsigned char)s[n] & 0xC0) != 0x80;
}

px_status px_utf8_add_sanitized(px_strbuf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes at i - run .. i not yet copied */
    while (i < n) {
        size_t len = px_utf8_seq_len(u + i, n - i);
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

json_t *px_json_text(const char *s, size_t n)
{
    px_strbuf sb = PX_STRBUF_INIT;
    json_t *j = px_utf8_add_sanitized(&sb, s, n) == PX_OK ? json_stringn(sb.buf, sb.len) : NULL;
    px_strbuf_release(&sb);
    return j;
}
