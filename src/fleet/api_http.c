/* The HTTP side of the server on libmicrohttpd: one thread per connection
 * (long polls block in their handler), bounded bodies, bearer tokens
 * checked by hash in constant time, JSON errors, request metrics. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <strings.h>
#include <unistd.h>

/* Request bodies held in memory across all connections at once; past it
 * new body bytes are refused, so many concurrent uploads cannot exhaust
 * memory. */
#define BODY_BUDGET ((size_t)512 << 20)
static size_t body_bytes_in_flight;

typedef struct conn_ctx {
    px_strbuf body;
    size_t limit;
    bool too_large;
    size_t counted; /* bytes added to body_bytes_in_flight */
    uint64_t t0;
} conn_ctx;

const char *px__api_query(const px__api_req *rq, const char *key)
{
    return MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, key);
}

void px__api_json(px__api_resp *rs, int status, json_t *v)
{
    free(rs->body);
    rs->body = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    if (!rs->body) {
        rs->status = 500;
        rs->body = px_strdup("{\"error\":\"out of memory\"}");
    } else
        rs->status = status;
    rs->len = rs->body ? strlen(rs->body) : 0;
    rs->ctype = "application/json";
}

void px__api_error(px__api_resp *rs, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    px__api_json(rs, status, json_pack("{s:s}", "error", msg));
}

void px__api_fail(px__api_resp *rs, const px_err *err)
{
    int status;
    switch (err->code) {
    case PX_EINVAL:
    case PX_EPARSE:
    case PX_ERANGE:
    case PX_EVALIDATE:
        status = 400;
        break;
    case PX_ENOTFOUND:
        status = 404;
        break;
    case PX_ESTATE:
    case PX_EEXIST:
        status = 409;
        break;
    case PX_ELIMIT:
        status = 413;
        break;
    case PX_EAUTH:
        status = 401;
        break;
    case PX_EIO:
        status = 503;
        break;
    default:
        status = 500;
    }
    px__api_error(rs, status, "%s", err->msg[0] ? err->msg : px_status_str(err->code));
}

json_t *px__api_body_json(const px__api_req *rq, px__api_resp *rs)
{
    px_json_limits lim = {.max_bytes = rq->srv->opt.max_body,
                          .max_depth = 32,
                          .max_string = 1 << 20,
                          .max_elements = 10000};
    json_t *v;
    px_err err;
    if (rq->body_len == 0) {
        px__api_error(rs, 400, "%s %s: expected a JSON object in the request body", rq->method,
                      rq->url);
        return NULL;
    }
    if (px_json_parse(rq->body, rq->body_len, "request body", &lim, &v, &err) != PX_OK) {
        px__api_error(rs, 400, "%s", err.msg);
        return NULL;
    }
    if (!json_is_object(v)) {
        px__api_error(rs, 400, "request body: expected a JSON object, got %s",
                      px_json_type_name(v));
        json_decref(v);
        return NULL;
    }
    return v;
}

/* ---- authentication ---- */

typedef enum auth_need { AUTH_NONE, AUTH_USER, AUTH_AGENT, AUTH_EITHER } auth_need;

static auth_need need_of(const char *method, const char *url)
{
    if (strcmp(url, "/v1/health") == 0 || strcmp(url, "/metrics") == 0)
        return AUTH_NONE;
    if (px_str_starts_with(url, "/v1/agent/"))
        return AUTH_AGENT;
    if (px_str_starts_with(url, "/v1/blobs/") && strcmp(method, "GET") == 0)
        return AUTH_EITHER;
    return AUTH_USER;
}

/* Returns 0 when allowed, else the HTTP status (and sets the reply). */
static int authorize(px_fleet_server *srv, struct MHD_Connection *conn, auth_need need,
                     px__api_resp *rs)
{
    if (need == AUTH_NONE)
        return 0;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
        px__api_error(rs, 401,
                      "missing token: send \"Authorization: Bearer <token>\" "
                      "(--token or PLEXUS_TOKEN)");
        return 401;
    }
    const char *tok = h + 7;
    while (*tok == ' ')
        tok++;
    px_digest d;
    px_sha256(tok, strlen(tok), &d);
    /* Compare against every token without stopping early, so the time
     * taken says nothing about which token came close. */
    int match_agent = 0, match_user = 0;
    for (size_t i = 0; i < srv->n_tokens; i++) {
        int eq = CRYPTO_memcmp(d.bytes, srv->tokens[i].hash.bytes, sizeof d.bytes) == 0;
        match_agent |= eq & srv->tokens[i].agent;
        match_user |= eq & !srv->tokens[i].agent;
    }
    if (!match_agent && !match_user) {
        px__api_error(rs, 401, "unknown token: check --token or PLEXUS_TOKEN");
        return 401;
    }
    if ((need == AUTH_AGENT && !match_agent) || (need == AUTH_USER && !match_user)) {
        px__api_error(rs, 403,
                      need == AUTH_AGENT ? "this endpoint is for agents: use the cluster token"
                                         : "agents' cluster token cannot be used here: use an API "
                                           "token");
        return 403;
    }
    return 0;
}

static bool is_upload(const char *method, const char *url)
{
    return (strcmp(method, "PUT") == 0 && px_str_starts_with(url, "/v1/agent/jobs/") &&
            strstr(url, "/artifacts/")) ||
           (strcmp(method, "POST") == 0 && strcmp(url, "/v1/blobs") == 0);
}

static void public_route(px__api_req *rq, px__api_resp *rs)
{
    if (strcmp(rq->url, "/v1/health") == 0) {
        px__api_json(rs, 200, json_pack("{s:s, s:s}", "status", "ok", "version", px_version()));
        return;
    }
    char *text = px__metrics_render(rq->srv);
    if (!text) {
        px__api_error(rs, 500, "out of memory");
        return;
    }
    rs->status = 200;
    rs->body = text;
    rs->len = strlen(text);
    rs->ctype = "text/plain; version=0.0.4";
}

static enum MHD_Result reply(struct MHD_Connection *conn, px__api_resp *rs)
{
    struct MHD_Response *r;
    if (rs->fd >= 0) {
        r = MHD_create_response_from_fd((uint64_t)rs->len, rs->fd);
        rs->fd = -1;
    } else {
        r = MHD_create_response_from_buffer(rs->len, rs->body ? rs->body : (char *)"",
                                            rs->body ? MHD_RESPMEM_MUST_FREE
                                                     : MHD_RESPMEM_PERSISTENT);
        if (r)
            rs->body = NULL;
    }
    if (!r) {
        free(rs->body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", rs->ctype ? rs->ctype : "application/json");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)rs->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void count(px_fleet_server *srv, int status, uint64_t t0)
{
    pthread_mutex_lock(&srv->lock);
    int cls = status / 100;
    if (cls >= 1 && cls <= 5)
        srv->metrics.http_by_class[cls]++;
    px__metrics_observe(srv->metrics.http_hist, &srv->metrics.http_sum, &srv->metrics.http_count,
                        (double)(px_now_ns() - t0) / 1e9);
    pthread_mutex_unlock(&srv->lock);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls)
{
    (void)version;
    px_fleet_server *srv = cls;
    conn_ctx *cc = *con_cls;
    px__api_resp rs = {.fd = -1};
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc)
            return MHD_NO;
        px_strbuf_init(&cc->body);
        cc->t0 = px_now_ns();
        cc->limit = is_upload(method, url) ? srv->opt.max_upload : srv->opt.max_body;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > cc->limit) {
            px__api_error(&rs, 413, "%s %s: body of %s bytes is over the limit of %zu bytes",
                          method, url, cl, cc->limit);
            count(srv, 413, cc->t0);
            return reply(conn, &rs);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        if (!cc->too_large && cc->body.len + n <= cc->limit &&
            __atomic_add_fetch(&body_bytes_in_flight, n, __ATOMIC_RELAXED) <= BODY_BUDGET) {
            cc->counted += n;
            if (px_strbuf_add(&cc->body, upload_data, n) != PX_OK)
                cc->too_large = true;
        } else {
            if (!cc->too_large && cc->body.len + n <= cc->limit)
                __atomic_sub_fetch(&body_bytes_in_flight, n, __ATOMIC_RELAXED);
            cc->too_large = true;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cc->too_large) {
        px__api_error(&rs, 413, "%s %s: body is over the limit of %zu bytes", method, url,
                      cc->limit);
    } else {
        px__api_req rq = {srv, conn, method, url, cc->body.buf, cc->body.len};
        auth_need need = need_of(method, url);
        pthread_mutex_lock(&srv->lock);
        if (authorize(srv, conn, need, &rs) == 0) {
            if (need == AUTH_NONE)
                public_route(&rq, &rs);
            else if (need == AUTH_AGENT ? !px__api_agent_route(&rq, &rs)
                                        : !px__api_user_route(&rq, &rs))
                px__api_error(&rs, 404, "%s %s: no such endpoint (see docs/formats/fleet-api.md)",
                              method, url);
        }
        pthread_mutex_unlock(&srv->lock);
    }
    count(srv, rs.status, cc->t0);
    return reply(conn, &rs);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc)
        return;
    __atomic_sub_fetch(&body_bytes_in_flight, cc->counted, __ATOMIC_RELAXED);
    px_strbuf_release(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes %XX escapes in place.  An escaped NUL becomes 0x01 instead of
 * ending the string early, so "a%00b" cannot pass for the name "a": names
 * with control characters are refused where they are checked. */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0) {
            char c = (char)(hi * 16 + lo);
            *w++ = c ? c : '\x01';
            r += 2;
        } else
            *w++ = *r;
    }
    *w = '\0';
    return (size_t)(w - s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    px_log_debug("fleet: http: %s", msg);
}

px_status px__api_start(px_fleet_server *srv, const char *host, uint16_t port, px_err *err)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    const char *h = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &addr.sin_addr) != 1)
        return px_err_set(err, PX_EINVAL,
                          "--listen: \"%s\" is not an IPv4 address (use 127.0.0.1 or 0.0.0.0)",
                          host);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG, port,
        NULL, NULL, access_handler, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, completed, srv, MHD_OPTION_CONNECTION_LIMIT,
        srv->opt.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, srv, MHD_OPTION_UNESCAPE_CALLBACK, unescape, srv, MHD_OPTION_END);
    if (!d)
        return px_err_set(err, PX_EPEER, "cannot listen on %s:%u: %s (is the port in use?)", host,
                          (unsigned)port, strerror(errno));
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (info)
        srv->port = info->port;
    srv->daemon = d;
    return PX_OK;
}

void px__api_stop(px_fleet_server *srv)
{
    if (srv->daemon)
        MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
}
