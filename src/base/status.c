/* Status codes, px_err and diagnostics lists. */
#include "base/common.h"

const char *px_status_str(px_status code)
{
    switch (code) {
#define X(name, value, text) \
    case name:               \
        return text;
        PX_STATUS_LIST(X)
#undef X
    }
    return "unknown status";
}

const char *px_status_name(px_status code)
{
    switch (code) {
#define X(name, value, text) \
    case name:               \
        return #name;
        PX_STATUS_LIST(X)
#undef X
    }
    return "PX_E?";
}

/* Length of the well-formed UTF-8 sequence at s (1 to 4), or 0 when the
 * bytes there are not one (a stray continuation byte, an overlong or
 * surrogate form, a sequence cut by the end of the string). */
static size_t utf8_seq_len(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

/* Makes a message safe to carry anywhere text goes (JSON bodies, logs, a
 * terminal): bytes that are not well-formed UTF-8 (from a file name or a
 * hostile input quoted in the message) become '?', and a message that
 * filled the buffer ends in "..." at a character boundary, so that a cut
 * never splits a character. */
static void tidy_msg(char *msg, size_t cap, bool cut)
{
    unsigned char *s = (unsigned char *)msg;
    size_t len = strlen(msg);
    if (cut && len >= 3) {
        size_t end = len - 3;
        while (end > 0 && (s[end] & 0xC0) == 0x80)
            end--;
        memcpy(msg + end, "...", 4);
        len = end + 3;
    }
    for (size_t i = 0; i < len;) {
        size_t n = utf8_seq_len(s + i);
        if (n == 0) {
            s[i++] = '?';
            continue;
        }
        i += n;
    }
    PX_ASSERT(len < cap);
}

void px_textfv(char *buf, size_t cap, const char *fmt, va_list ap)
{
    if (cap == 0)
        return;
    int n = vsnprintf(buf, cap, fmt, ap);
    if (n < 0)
        buf[0] = '\0';
    tidy_msg(buf, cap, n >= (int)cap);
}

void px_textf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_textfv(buf, cap, fmt, ap);
    va_end(ap);
}

px_status px_err_setv(px_err *err, px_status code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        px_textfv(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

px_status px_err_set(px_err *err, px_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_err_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

px_status px_err_prefix(px_err *err, px_status code, const char *fmt, ...)
{
    if (!err)
        return code;
    char prefix[sizeof err->msg];
    char old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    size_t n = px_strlcpy(err->msg, prefix, sizeof err->msg);
    bool cut = n >= sizeof err->msg;
    if (!cut)
        cut = px_strlcpy(err->msg + n, old, sizeof err->msg - n) >= sizeof err->msg - n;
    tidy_msg(err->msg, sizeof err->msg, cut);
    err->code = code;
    return code;
}

void px_err_clear(px_err *err)
{
    if (err) {
        err->code = PX_OK;
        err->msg[0] = '\0';
    }
}

void px__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "plexus: internal error: assertion `%s` failed at %s:%d\n", expr, file, line);
    fflush(stderr);
    abort();
}

const char *px_version(void)
{
#ifdef PX_VERSION
    return PX_VERSION;
#else
    return "0.0.0";
#endif
}

/* ---- diagnostics ---- */

void px_diags_init(px_diags *d)
{
    memset(d, 0, sizeof *d);
    d->max = 1000;
}

void px_diags_release(px_diags *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->items[i].pointer);
        free(d->items[i].message);
        free(d->items[i].fix);
    }
    free(d->items);
    size_t max = d->max;
    memset(d, 0, sizeof *d);
    d->max = max;
}

px_status px_diags_add(px_diags *d, px_severity sev, const char *pointer, const char *fix,
                       const char *fmt, ...)
{
    if (sev == PX_SEV_ERROR)
        d->n_errors++;
    else if (sev == PX_SEV_WARNING)
        d->n_warnings++;
    if (d->max && d->n >= d->max) {
        d->n_dropped++;
        return PX_OK;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        px_diag *items = realloc(d->items, cap * sizeof *items);
        if (!items) {
            d->n_dropped++;
            return PX_ENOMEM;
        }
        d->items = items;
        d->cap = cap;
    }
    px_diag *g = &d->items[d->n];
    va_list ap;
    va_start(ap, fmt);
    px_strbuf sb = PX_STRBUF_INIT;
    px_status st = px_strbuf_vaddf(&sb, fmt, ap);
    va_end(ap);
    g->severity = sev;
    g->pointer = px_strdup(pointer ? pointer : "");
    g->fix = fix ? px_strdup(fix) : NULL;
    g->message = px_strbuf_detach(&sb, NULL);
    if (st != PX_OK || !g->pointer || !g->message || (fix && !g->fix)) {
        free(g->pointer);
        free(g->fix);
        free(g->message);
        d->n_dropped++;
        return PX_ENOMEM;
    }
    d->n++;
    return PX_OK;
}

static const char *severity_name(px_severity s)
{
    switch (s) {
    case PX_SEV_ERROR:
        return "error";
    case PX_SEV_WARNING:
        return "warning";
    case PX_SEV_NOTE:
        return "note";
    }
    return "error";
}

char *px_diags_format(const px_diags *d, const char *input_name)
{
    px_strbuf sb = PX_STRBUF_INIT;
    for (size_t i = 0; i < d->n; i++) {
        const px_diag *g = &d->items[i];
        px_strbuf_addf(&sb, "%s: %s: %s: %s", input_name ? input_name : "input",
                       severity_name(g->severity), g->pointer[0] ? g->pointer : "(document)",
                       g->message);
        if (g->fix)
            px_strbuf_addf(&sb, "\n    fix: %s", g->fix);
        px_strbuf_addch(&sb, '\n');
    }
    if (d->n_dropped)
        px_strbuf_addf(&sb, "%s: %zu more problems not shown\n", input_name ? input_name : "input",
                       d->n_dropped);
    return px_strbuf_detach(&sb, NULL);
}

json_t *px_diags_to_json(const px_diags *d)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < d->n; i++) {
        const px_diag *g = &d->items[i];
        json_t *o = json_pack("{s:s, s:s, s:s}", "severity", severity_name(g->severity), "pointer",
                              g->pointer, "message", g->message);
        if (!o)
            goto fail;
        if (g->fix && json_object_set_new(o, "fix", json_string(g->fix)) != 0) {
            json_decref(o);
            goto fail;
        }
        if (json_array_append_new(arr, o) != 0)
            goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}
