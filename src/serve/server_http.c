/*
 * The server's HTTP side on libmicrohttpd: one thread per connection (a
 * streamed response waits in its reader), a bounded number of
 * connections, per-address limits and timeouts against clients that
 * trickle, the API key checked in constant time on the request's headers,
 * before a byte of its body is read, and bodies bounded.
 */
#include "serve/server_impl.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>

typedef enum route {
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_INCIDENTS,
    ROUTE_NOT_FOUND,
    ROUTE_METHOD,
} route;

typedef struct http_ctx {
    route route;
    px_strbuf body;
    bool too_large;
} http_ctx;

static route route_of(const char *method, const char *url)
{
    static const struct {
        const char *path, *method;
        route r;
    } table[] = {
        {"/health", "GET", ROUTE_HEALTH},
        {"/metrics", "GET", ROUTE_METRICS},
        {"/incidents", "GET", ROUTE_INCIDENTS},
        {"/v1/models", "GET", ROUTE_MODELS},
        {"/v1/completions", "POST", ROUTE_COMPLETIONS},
        {"/v1/chat/completions", "POST", ROUTE_CHAT},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(table); i++)
        if (!strcmp(url, table[i].path))
            return strcmp(method, table[i].method) ? ROUTE_METHOD : table[i].r;
    return ROUTE_NOT_FOUND;
}

static px_serve_api api_of(route r)
{
    return r == ROUTE_CHAT ? PX_SERVE_API_CHAT : PX_SERVE_API_COMPLETIONS;
}

/* Whether the request carries the key ("Authorization: Bearer KEY"). */
static bool authorized(const px_serve *s, struct MHD_Connection *conn)
{
    if (!s->api_key)
        return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    const char *k = h + 7;
    size_t n = strlen(k);
    /* Compare as many bytes as the key has, whatever was sent, so that the
     * time says nothing of how much matched. */
    char buf[512] = {0};
    memcpy(buf, k, PX_MIN(n, sizeof buf - 1));
    return n == s->api_key_len && s->api_key_len < sizeof buf &&
           CRYPTO_memcmp(buf, s->api_key, s->api_key_len) == 0;
}

static int reply_json(px_serve *s, struct MHD_Connection *conn, route r, int status, json_t *v)
{
    char *body = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    struct MHD_Response *rs = MHD_create_response_from_buffer(
        body ? strlen(body) : 0, body, body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!rs) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    int rc = MHD_queue_response(conn, (unsigned)status, rs);
    MHD_destroy_response(rs);
    (void)s;
    (void)r;
    return rc;
}

static int reply_text(struct MHD_Connection *conn, int status, const char *ctype, char *body)
{
    struct MHD_Response *rs = MHD_create_response_from_buffer(
        body ? strlen(body) : 0, body, body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!rs) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    int rc = MHD_queue_response(conn, (unsigned)status, rs);
    MHD_destroy_response(rs);
    return rc;
}

static int refuse(px_serve *s, struct MHD_Connection *conn, route r, px_serve_error_kind kind,
                  const char *fmt, const char *arg)
{
    px_serve_error e;
    px_serve_error_set(&e, kind, NULL, fmt, arg);
    return px__srv_reply_error(s, conn, api_of(r), &e);
}

/* Answers once the request is whole. */
static int dispatch(px_serve *s, struct MHD_Connection *conn, http_ctx *c, const char *url)
{
    switch (c->route) {
    case ROUTE_HEALTH:
        return reply_json(s, conn, c->route, 200, px__srv_status_json(s));
    case ROUTE_METRICS:
        return reply_text(conn, 200, "text/plain; version=0.0.4", px__srv_metrics_text(s));
    case ROUTE_INCIDENTS:
        return reply_json(s, conn, c->route, 200, px__srv_incidents_json(s));
    case ROUTE_MODELS: {
        const char *ids[1] = {s->model_name};
        char *body = px_serve_models_json(ids, 1, s->created, "plexus");
        return reply_text(conn, body ? 200 : 500, "application/json", body);
    }
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
        if (c->too_large)
            return refuse(s, conn, c->route, PX_SERVE_ERR_TOO_LARGE,
                          "the request body is larger than %s bytes", "the server's limit");
        return px__srv_call(s, conn, api_of(c->route), c->body.buf ? c->body.buf : "", c->body.len);
    case ROUTE_METHOD:
        return refuse(s, conn, c->route, PX_SERVE_ERR_METHOD,
                      "%s does not take this method (GET /v1/models, POST /v1/completions, "
                      "POST /v1/chat/completions)",
                      url);
    case ROUTE_NOT_FOUND:
        break;
    }
    return refuse(s, conn, c->route, PX_SERVE_ERR_NOT_FOUND,
                  "no route %s (GET /v1/models, POST /v1/completions, POST "
                  "/v1/chat/completions, GET /health, GET /metrics, GET /incidents)",
                  url);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls)
{
    (void)version;
    px_serve *s = cls;
    http_ctx *c = *con_cls;
    if (!c) {
        route r = route_of(method, url);
        /* /health answers everyone, but says more with the key. */
        bool open_health = r == ROUTE_HEALTH && !authorized(s, conn);
        if (!open_health && !authorized(s, conn)) {
            px_serve_error e;
            px_serve_error_set(&e, PX_SERVE_ERR_UNAUTHORIZED, NULL,
                               "missing or wrong API key: send \"Authorization: Bearer KEY\"");
            return (enum MHD_Result)px__srv_reply_error(s, conn, api_of(r), &e);
        }
        if (open_health)
            return (enum MHD_Result)reply_json(s, conn, r, 200, json_pack("{s:s}", "status", "ok"));
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        size_t limit = s->o.max_body_bytes ? s->o.max_body_bytes : (size_t)8 << 20;
        if (cl && strtoull(cl, NULL, 10) > limit) {
            char n[32];
            snprintf(n, sizeof n, "%zu", limit);
            return (enum MHD_Result)refuse(s, conn, r, PX_SERVE_ERR_TOO_LARGE,
                                           "the request body is larger than %s bytes", n);
        }
        if (!(c = calloc(1, sizeof *c)))
            return MHD_NO;
        c->route = r;
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t limit = s->o.max_body_bytes ? s->o.max_body_bytes : (size_t)8 << 20;
        if (c->too_large || c->body.len + *upload_size > limit)
            c->too_large = true;
        else if (px_strbuf_add(&c->body, upload, *upload_size) != PX_OK)
            c->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    return (enum MHD_Result)dispatch(s, conn, c, url);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    http_ctx *c = *con_cls;
    if (!c)
        return;
    px_strbuf_release(&c->body);
    free(c);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    px_log_debug("serve: http: %s", msg);
}

static px_status parse_listen(const char *listen, struct sockaddr_in *addr, px_err *err)
{
    const char *spec = listen ? listen : "127.0.0.1:8080";
    const char *colon = strrchr(spec, ':');
    char host[64];
    if (!colon || (size_t)(colon - spec) >= sizeof host || colon == spec)
        return px_err_set(err, PX_EINVAL, "--listen \"%s\": expected HOST:PORT (127.0.0.1:8080)",
                          spec);
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port > 65535)
        return px_err_set(err, PX_EINVAL, "--listen \"%s\": the port must be 0 to 65535", spec);
    *addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    const char *h = !strcmp(host, "localhost") ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &addr->sin_addr) != 1)
        return px_err_set(err, PX_EINVAL,
                          "--listen \"%s\": \"%s\" is not an IPv4 address (127.0.0.1, 0.0.0.0)",
                          spec, host);
    return PX_OK;
}

px_status px__srv_http_start(px_serve *s, px_err *err)
{
    struct sockaddr_in addr;
    px_status st = parse_listen(s->o.listen, &addr, err);
    if (st)
        return st;
    unsigned max_conns = s->o.max_connections ? s->o.max_connections : 256;
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, access_handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT, max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, max_conns, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!d) {
        char a[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &addr.sin_addr, a, sizeof a);
        return px_err_set(err, PX_EIO, "serve: cannot listen on %s:%u: %s (is the port in use?)", a,
                          (unsigned)ntohs(addr.sin_port), strerror(errno));
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : ntohs(addr.sin_port);
    char a[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &addr.sin_addr, a, sizeof a);
    snprintf(s->address, sizeof s->address, "%s:%u", a, (unsigned)s->port);
    s->daemon = d;
    return PX_OK;
}

void px__srv_http_stop(px_serve *s)
{
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
