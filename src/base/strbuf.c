/* Growable NUL-terminated strings and small string helpers. */
#include "base/common.h"

char px__strbuf_empty[1];

void px_strbuf_init(px_strbuf *sb)
{
    sb->buf = px__strbuf_empty;
    sb->len = 0;
    sb->cap = 0;
}

void px_strbuf_release(px_strbuf *sb)
{
    if (!sb)
        return;
    if (sb->cap)
        free(sb->buf);
    px_strbuf_init(sb);
}

void px_strbuf_reset(px_strbuf *sb)
{
    sb->len = 0;
    sb->buf[0] = '\0';
}

px_status px_strbuf_grow(px_strbuf *sb, size_t extra)
{
    size_t need;
    if (!px__add_size(sb->len, extra, &need) || !px__add_size(need, 1, &need))
        return PX_ENOMEM;
    if (need <= sb->cap)
        return PX_OK;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return PX_ENOMEM;
        cap *= 2;
    }
    char *buf = realloc(sb->cap ? sb->buf : NULL, cap);
    if (!buf)
        return PX_ENOMEM;
    if (!sb->cap)
        buf[0] = '\0';
    sb->buf = buf;
    sb->cap = cap;
    return PX_OK;
}

px_status px_strbuf_add(px_strbuf *sb, const void *data, size_t len)
{
    if (px_strbuf_grow(sb, len) != PX_OK)
        return PX_ENOMEM;
    memcpy(sb->buf + sb->len, data, len);
    sb->len += len;
    sb->buf[sb->len] = '\0';
    return PX_OK;
}

px_status px_strbuf_adds(px_strbuf *sb, const char *s)
{
    return px_strbuf_add(sb, s, strlen(s));
}

px_status px_strbuf_addch(px_strbuf *sb, char c)
{
    return px_strbuf_add(sb, &c, 1);
}

px_status px_strbuf_vaddf(px_strbuf *sb, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return PX_EINVAL;
    if (px_strbuf_grow(sb, (size_t)n) != PX_OK)
        return PX_ENOMEM;
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
    sb->len += (size_t)n;
    return PX_OK;
}

px_status px_strbuf_addf(px_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_status st = px_strbuf_vaddf(sb, fmt, ap);
    va_end(ap);
    return st;
}

px_status px_strbuf_add_pointer_token(px_strbuf *sb, const char *s)
{
    for (; *s; s++) {
        px_status st;
        if (*s == '~')
            st = px_strbuf_add(sb, "~0", 2);
        else if (*s == '/')
            st = px_strbuf_add(sb, "~1", 2);
        else
            st = px_strbuf_addch(sb, *s);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

char *px_strbuf_detach(px_strbuf *sb, size_t *len)
{
    char *out;
    if (sb->cap) {
        out = sb->buf;
    } else {
        out = malloc(1);
        if (out)
            out[0] = '\0';
    }
    if (len)
        *len = sb->len;
    px_strbuf_init(sb);
    return out;
}

char *px_strndup(const char *s, size_t n)
{
    /* Like POSIX strndup: at most n bytes, never past the terminator. */
    n = strnlen(s, n);
    char *p = malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *px_strdup(const char *s)
{
    return s ? px_strndup(s, strlen(s)) : NULL;
}

char *px_asprintf(const char *fmt, ...)
{
    px_strbuf sb = PX_STRBUF_INIT;
    va_list ap;
    va_start(ap, fmt);
    px_status st = px_strbuf_vaddf(&sb, fmt, ap);
    va_end(ap);
    if (st != PX_OK) {
        px_strbuf_release(&sb);
        return NULL;
    }
    return px_strbuf_detach(&sb, NULL);
}

bool px_str_starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool px_str_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

size_t px_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);
    if (n) {
        size_t k = len < n - 1 ? len : n - 1;
        memcpy(dst, src, k);
        dst[k] = '\0';
    }
    return len;
}
