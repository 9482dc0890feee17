/*
 * UTF-8 for the front end: chat templates strip whitespace as Python
 * does (the rest of UTF-8's handling is base's, px_utf8_*).
 */
#include "serve/serve_impl.h"

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
        size_t len = px_utf8_seq_len(u + a, n - a);
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
        size_t len = px_utf8_seq_len(u + b - k, k);
        if (len != k || !is_py_space(decode(u + b - k, len)))
            break;
        b -= k;
    }
    *start = a;
    *end = b;
}
