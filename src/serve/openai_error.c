/*
 * Errors in OpenAI's shape: {"error": {"message", "type", "param",
 * "code"}} with the HTTP status, for every refusal the front end makes.
 */
#include "serve/serve_impl.h"

static const struct {
    int status;
    const char *type;
    const char *code; /* NULL: null */
    px_status px;
} kinds[PX_SERVE_ERR_KIND_COUNT_] = {
    [PX_SERVE_ERR_INVALID_REQUEST] = {400, "invalid_request_error", NULL, PX_EINVAL},
    [PX_SERVE_ERR_CONTEXT_LENGTH] = {400, "invalid_request_error", "context_length_exceeded",
                                     PX_ELIMIT},
    [PX_SERVE_ERR_UNAUTHORIZED] = {401, "invalid_request_error", "invalid_api_key", PX_EAUTH},
    [PX_SERVE_ERR_NOT_FOUND] = {404, "invalid_request_error", "not_found", PX_ENOTFOUND},
    [PX_SERVE_ERR_MODEL_NOT_FOUND] = {404, "invalid_request_error", "model_not_found",
                                      PX_ENOTFOUND},
    [PX_SERVE_ERR_METHOD] = {405, "invalid_request_error", "method_not_allowed", PX_EUNSUPPORTED},
    [PX_SERVE_ERR_TOO_LARGE] = {413, "invalid_request_error", "request_too_large", PX_ELIMIT},
    [PX_SERVE_ERR_RATE_LIMIT] = {429, "requests", "rate_limit_exceeded", PX_ELIMIT},
    [PX_SERVE_ERR_INTERNAL] = {500, "server_error", NULL, PX_EINTERNAL},
    [PX_SERVE_ERR_UNAVAILABLE] = {503, "server_error", "service_unavailable", PX_ESTATE},
};

static px_serve_error_kind clamp(px_serve_error_kind kind)
{
    return (unsigned)kind < PX_SERVE_ERR_KIND_COUNT_ ? kind : PX_SERVE_ERR_INTERNAL;
}

const char *px_serve_error_type(px_serve_error_kind kind)
{
    return kinds[clamp(kind)].type;
}

const char *px_serve_error_code(px_serve_error_kind kind)
{
    return kinds[clamp(kind)].code;
}

int px_serve_error_status(px_serve_error_kind kind)
{
    return kinds[clamp(kind)].status;
}

px_status px_serve_error_set(px_serve_error *e, px_serve_error_kind kind, const char *param,
                             const char *fmt, ...)
{
    kind = clamp(kind);
    if (e) {
        e->kind = kind;
        e->http_status = kinds[kind].status;
        px_strlcpy(e->param, param ? param : "", sizeof e->param);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
    }
    return kinds[kind].px;
}

/* A JSON string of s, made valid UTF-8 first (a message cut at its
 * buffer's end may end mid-character). */
static json_t *text(const char *s)
{
    px_strbuf sb = PX_STRBUF_INIT;
    json_t *v = NULL;
    if (px_utf8_add_sanitized(&sb, s, strlen(s)) == PX_OK)
        v = json_stringn(sb.buf, sb.len);
    px_strbuf_release(&sb);
    return v;
}

static json_t *error_json(const px_serve_error *e)
{
    px_serve_error_kind kind = clamp(e->kind);
    json_t *outer = json_object(), *inner = json_object();
    if (!outer || !inner) {
        json_decref(outer);
        json_decref(inner);
        return NULL;
    }
    /* inner belongs to outer from here on, also when a set fails. */
    if (px_json_set(outer, "error", inner) || px_json_set(inner, "message", text(e->message)) ||
        px_json_set(inner, "type", json_string(kinds[kind].type)) ||
        px_json_set(inner, "param", e->param[0] ? text(e->param) : json_null()) ||
        px_json_set(inner, "code",
                    kinds[kind].code ? json_string(kinds[kind].code) : json_null())) {
        json_decref(outer);
        return NULL;
    }
    return outer;
}

char *px_serve_error_json(const px_serve_error *e)
{
    json_t *v = error_json(e);
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

px_status px_serve_error_sse(const px_serve_error *e, px_strbuf *out)
{
    char *s = px_serve_error_json(e);
    if (!s)
        return PX_ENOMEM;
    px_status st = px_strbuf_addf(out, "data: %s\n\n", s);
    free(s);
    return st;
}
