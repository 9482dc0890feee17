/* The HTTP side of the server on libmicrohttpd: one thread per connection
 * (long polls block in their handler), JSON errors, request metrics, and
 * the defences of a server on an open network:
 *
 *   - every request is authenticated from its headers, before one byte of
 *     its body is read: a client without a token cannot make the server
 *     hold memory or disk for it;
 *   - connections are limited in total and per client address;
 *   - a connection gets a deadline for each phase: an idle connection (or
 *     a TLS handshake) has 30 s to start a request, a started request
 *     header_timeout to finish its headers, and a body may not stall
 *     longer than that; a watchdog thread shuts down the socket of a
 *     connection past its deadline, so a client trickling a byte now and
 *     then holds nothing for long;
 *   - JSON bodies are bounded and held in memory within a budget; uploads
 *     (artifacts, blobs) go to disk as they arrive (api_upload.c);
 *   - TLS (GnuTLS through libmicrohttpd) with the operator's certificate. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "fleet/secret_impl.h"
#include "fleet/ui_impl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* JSON and log bodies held in memory across all connections at once; past
 * it new body bytes are refused, so many concurrent requests cannot
 * exhaust memory.  Only authenticated requests get here. */
#define BODY_BUDGET ((size_t)512 << 20)
/* An idle connection (none of a request yet, or a TLS handshake). */
#define IDLE_TIMEOUT_S   30.0
#define WATCHDOG_TICK_NS (100 * 1000000L)

/* ---- connections and their deadlines ---- */

typedef enum conn_phase {
    PHASE_IDLE = 0, /* waiting for a request line */
    PHASE_HEADERS,  /* request line seen, headers arriving */
    PHASE_BODY,     /* headers done, body arriving */
    PHASE_HANDLER,  /* the request is being answered (long polls wait here) */
} conn_phase;

typedef struct conn_slot {
    int fd; /* a duplicate of the socket: shutting it down never hits a reused fd */
    conn_phase phase;
    uint64_t since_ns; /* start of the phase, or the last body byte */
    bool cut;
    struct conn_slot *prev, *next;
} conn_slot;

typedef struct conns {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    conn_slot *head;
    pthread_t watchdog;
    bool started, stop;
    uint64_t header_ns;
    size_t body_in_flight;
} conns;

static void set_phase(conn_slot *s, conns *t, conn_phase phase)
{
    if (!s)
        return;
    pthread_mutex_lock(&t->mu);
    s->phase = phase;
    s->since_ns = px_now_ns();
    pthread_mutex_unlock(&t->mu);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    px_fleet_server *srv = cls;
    conns *t = srv->conns;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_slot *s = calloc(1, sizeof *s);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!s)
            return;
        s->fd = ci ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        /* A TLS reply goes out in several records: without this, Nagle's
         * algorithm holds the last one for the client's delayed ACK (40 ms
         * on Linux). */
        int one = 1;
        if (ci)
            setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s->phase = PHASE_IDLE;
        s->since_ns = px_now_ns();
        pthread_mutex_lock(&t->mu);
        s->next = t->head;
        if (t->head)
            t->head->prev = s;
        t->head = s;
        pthread_mutex_unlock(&t->mu);
        *socket_context = s;
        return;
    }
    conn_slot *s = *socket_context;
    if (!s)
        return;
    pthread_mutex_lock(&t->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        t->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&t->mu);
    if (s->fd >= 0)
        close(s->fd);
    free(s);
    *socket_context = NULL;
}

static void *watchdog_main(void *arg)
{
    conns *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t now = px_now_ns();
        for (conn_slot *s = t->head; s; s = s->next) {
            uint64_t limit = s->phase == PHASE_IDLE      ? (uint64_t)(IDLE_TIMEOUT_S * 1e9)
                             : s->phase == PHASE_HANDLER ? UINT64_MAX
                                                         : t->header_ns;
            if (!s->cut && s->fd >= 0 && now - s->since_ns > limit) {
                /* The connection's thread wakes to an end of file and closes. */
                shutdown(s->fd, SHUT_RDWR);
                s->cut = true;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCHDOG_TICK_NS;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->wake, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)uri;
    px_fleet_server *srv = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    set_phase(ci ? ci->socket_context : NULL, srv->conns, PHASE_HEADERS);
    return NULL;
}

static conn_slot *slot_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* ---- requests ---- */

typedef struct req_ctx {
    px_strbuf body;
    size_t limit;
    bool too_large;
    size_t counted; /* bytes added to the body budget */
    uint64_t t0;
    px__who who;
    px__upload *upload;
    conn_slot *slot;
} req_ctx;

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
        status = 403;
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

/* AUTH_UI: the dashboard, which checks its session cookie itself
 * (ui_http.c) and shows the login page to everyone else. */
typedef enum auth_need {
    AUTH_NONE,
    AUTH_USER,
    AUTH_NODE,
    AUTH_JOIN,
    AUTH_USER_OR_NODE,
    AUTH_UI
} auth_need;

static auth_need need_of(const char *method, const char *url)
{
    if (strcmp(url, "/v1/health") == 0 || strcmp(url, "/metrics") == 0)
        return AUTH_NONE;
    if (px__ui_is(url))
        return AUTH_UI;
    if (strcmp(url, "/v1/agent/join") == 0)
        return AUTH_JOIN;
    if (px_str_starts_with(url, "/v1/agent/"))
        return AUTH_NODE;
    if ((px_str_starts_with(url, "/v1/blobs/") && strcmp(method, "GET") == 0) ||
        px__api_deploy_node_may(method, url))
        return AUTH_USER_OR_NODE;
    return AUTH_USER;
}

/* Returns 0 when allowed (who filled), else the HTTP status of the reply
 * set in rs. */
static int authorize(px_fleet_server *srv, struct MHD_Connection *conn, const char *method,
                     auth_need need, px__who *who, px__api_resp *rs)
{
    memset(who, 0, sizeof *who);
    if (need == AUTH_NONE || need == AUTH_UI)
        return 0;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h && (need == AUTH_USER || need == AUTH_USER_OR_NODE)) {
        /* The dashboard's pages call the API with their session cookie. */
        int st = px__ui_cookie_auth(srv, conn, method, who, rs);
        if (st >= 0)
            return st;
    }
    if (!h) {
        px__api_error(rs, 401,
                      "missing token: send \"Authorization: Bearer <token>\" (--token-file or "
                      "PLEXUS_TOKEN)");
        return 401;
    }
    /* A replica that does not schedule holds no node credentials: the
     * store knows them. */
    if (!px__auth_identify(srv, h, who) && !(need == AUTH_NODE && !atomic_load(&srv->active) &&
                                             px__auth_identify_stored(srv, h, who))) {
        px__api_error(rs, 401,
                      need == AUTH_NODE
                          ? "unknown node credential: the node was revoked or the server does not "
                            "know it; see the agent's log"
                          : "unknown token: check --token-file or PLEXUS_TOKEN");
        return 401;
    }
    bool ok =
        (need == AUTH_USER && who->kind == PX__WHO_USER) ||
        (need == AUTH_NODE && who->kind == PX__WHO_NODE) ||
        (need == AUTH_JOIN && who->kind == PX__WHO_JOIN) ||
        (need == AUTH_USER_OR_NODE && (who->kind == PX__WHO_USER || who->kind == PX__WHO_NODE));
    if (ok)
        return 0;
    px__api_error(rs, 403, "%s",
                  who->kind == PX__WHO_JOIN
                      ? "the join token only joins a node (POST /v1/agent/join); a node then uses "
                        "its own credential"
                  : need == AUTH_JOIN ? "joining needs the join token"
                  : need == AUTH_NODE ? "this endpoint is for agents, with their node credential"
                                      : "a node's credential cannot be used here: use a user's "
                                        "token");
    return 403;
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

static bool is_blob_route(const char *method, const char *url)
{
    return (strcmp(method, "POST") == 0 && strcmp(url, "/v1/blobs") == 0) ||
           (strcmp(method, "GET") == 0 && px_str_starts_with(url, "/v1/blobs/"));
}

/* What a replica that does not schedule serves from the database alone:
 * job submissions and cancellations (recorded for the scheduling replica
 * to take), every read of jobs (state, explanation, logs, artifacts) and,
 * where the store keeps blobs, users' uploads and downloads of blobs.
 * Nodes, artifact uploads, agents and the dashboard need the scheduler's
 * memory (or its node credentials) and go to the replica that holds the
 * lease. */
static bool standby_serves(px_fleet_server *srv, const char *method, const char *url)
{
    if (px_str_starts_with(url, "/v1/agent/"))
        return px__store_serves_agents(&srv->store) && px__api_agent_standby_serves(method, url);
    if (is_blob_route(method, url))
        return px__store_has_blobs(&srv->store);
    if (strcmp(method, "POST") == 0)
        return strcmp(url, "/v1/jobs") == 0 ||
               (srv->store.ops->version >= 9 && srv->store.ops->request_cancel &&
                px_str_starts_with(url, "/v1/jobs/") && strlen(url) > strlen("/cancel") &&
                strcmp(url + strlen(url) - strlen("/cancel"), "/cancel") == 0);
    if (strcmp(method, "GET") != 0)
        return false;
    return strcmp(url, "/v1/jobs") == 0 || px_str_starts_with(url, "/v1/jobs/");
}

/* 503: this replica stands by, or stopped serving for good. */
static enum MHD_Result standby_reply(px_fleet_server *srv, struct MHD_Connection *conn, req_ctx *rc,
                                     bool failed)
{
    px__api_resp rs = {.fd = -1};
    char holder[256];
    pthread_mutex_lock(&srv->lock);
    px_strlcpy(holder, failed ? "" : px__srv_holder_url(srv), sizeof holder);
    pthread_mutex_unlock(&srv->lock);
    char msg[512];
    if (failed)
        px_textf(msg, sizeof msg,
                 "this server replica stopped serving (it lost the scheduler lease or its "
                 "store); use another server URL");
    else
        px_textf(msg, sizeof msg,
                 "this server replica is standing by (another holds the scheduler lease); use "
                 "another server URL%s%s",
                 holder[0] ? ": the scheduler is at " : "", holder);
    json_t *o = json_pack("{s:s, s:s}", "status", failed ? "failed" : "standby", "error", msg);
    /* Where the scheduler is, when it said (clients may go there). */
    if (o && holder[0])
        json_object_set_new(o, "scheduler", json_string(holder));
    px__api_json(&rs, 503, o);
    count(srv, 503, rc->t0);
    return reply(conn, &rs);
}

/* The first call of a request: its headers are complete, its body (if
 * any) not yet read.  Everything that can refuse it does so here. */
static enum MHD_Result begin(px_fleet_server *srv, struct MHD_Connection *conn, const char *url,
                             const char *method, void **con_cls)
{
    px__api_resp rs = {.fd = -1};
    req_ctx *rc = calloc(1, sizeof *rc);
    if (!rc)
        return MHD_NO;
    px_strbuf_init(&rc->body);
    rc->t0 = px_now_ns();
    rc->slot = slot_of(conn);
    *con_cls = rc;
    set_phase(rc->slot, srv->conns, PHASE_BODY);
    /* A replica standing by (another holds the scheduler lease) serves
     * what the database alone answers (standby_serves); for the rest
     * clients and load balancers go to the next server, and /v1/health
     * says why.  One that stopped serving for good serves nothing. */
    bool standby = !atomic_load(&srv->active), failed = false;
    if (standby) {
        pthread_mutex_lock(&srv->lock);
        failed = srv->failed[0] != '\0';
        pthread_mutex_unlock(&srv->lock);
    }
    if (standby && strcmp(url, "/metrics") != 0 && (failed || !standby_serves(srv, method, url)))
        return standby_reply(srv, conn, rc, failed);
    auth_need need = need_of(method, url);
    int refused = authorize(srv, conn, method, need, &rc->who, &rs);
    /* A standby knows users alone (nodes' credentials are read with the
     * lease): a node fetching a blob, or a token it cannot place, goes to
     * the next URL. */
    bool token = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization") != NULL;
    if (standby && is_blob_route(method, url) &&
        ((refused == 401 && token) || (!refused && rc->who.kind != PX__WHO_USER))) {
        free(rs.body);
        rs.body = NULL;
        return standby_reply(srv, conn, rc, false);
    }
    if (refused) {
        count(srv, rs.status, rc->t0);
        return reply(conn, &rs);
    }
    bool upload = px__upload_is(method, url);
    rc->limit = upload            ? srv->opt.max_upload
                : need == AUTH_UI ? PX__UI_BODY_MAX
                                  : srv->opt.max_body;
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    unsigned long long length = cl ? strtoull(cl, NULL, 10) : 0;
    if (cl && length > rc->limit) {
        px__api_error(&rs, 413, "%s %s: a body of %s bytes is over the limit of %zu bytes%s",
                      method, url, cl, rc->limit, upload ? " (plexus server --max-upload)" : "");
        count(srv, 413, rc->t0);
        return reply(conn, &rs);
    }
    if (upload) {
        px__api_req rq = {.srv = srv, .conn = conn, .method = method, .url = url, .who = rc->who};
        pthread_mutex_lock(&srv->lock);
        int status = px__upload_begin(&rq, length, &rc->upload, &rs);
        pthread_mutex_unlock(&srv->lock);
        if (status != 0) {
            count(srv, rs.status, rc->t0);
            return reply(conn, &rs);
        }
    }
    return MHD_YES;
}

static void body_data(px_fleet_server *srv, req_ctx *rc, const char *data, size_t n)
{
    conns *t = srv->conns;
    if (rc->slot) {
        pthread_mutex_lock(&t->mu);
        rc->slot->since_ns = px_now_ns();
        pthread_mutex_unlock(&t->mu);
    }
    if (rc->upload) {
        px__upload_data(rc->upload, data, n);
        return;
    }
    if (rc->too_large || rc->body.len + n > rc->limit) {
        rc->too_large = true;
        return;
    }
    if (__atomic_add_fetch(&t->body_in_flight, n, __ATOMIC_RELAXED) > BODY_BUDGET) {
        __atomic_sub_fetch(&t->body_in_flight, n, __ATOMIC_RELAXED);
        rc->too_large = true;
        return;
    }
    rc->counted += n;
    if (px_strbuf_add(&rc->body, data, n) != PX_OK)
        rc->too_large = true;
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls)
{
    (void)version;
    px_fleet_server *srv = cls;
    req_ctx *rc = *con_cls;
    if (!rc)
        return begin(srv, conn, url, method, con_cls);
    if (*upload_data_size > 0) {
        body_data(srv, rc, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    set_phase(rc->slot, srv->conns, PHASE_HANDLER);
    px__api_resp rs = {.fd = -1};
    px__api_req rq = {srv, conn, method, url, rc->body.buf, rc->body.len, rc->who, NULL};
    if (rc->upload) {
        px__upload_end(&rq, rc->upload, &rs);
    } else if (rc->too_large) {
        px__api_error(&rs, 413, "%s %s: body is over the limit of %zu bytes", method, url,
                      rc->limit);
    } else if (px__ui_is(url)) {
        int status = 500;
        enum MHD_Result ret = (enum MHD_Result)px__ui_serve(&rq, &status);
        count(srv, status, rc->t0);
        return ret;
    } else if (rc->who.kind == PX__WHO_USER && px__serving_is_route(method, url)) {
        /* A deployment's OpenAI API: streamed from its front end, without
         * the server lock. */
        enum MHD_Result ret = (enum MHD_Result)px__serving_route(
            srv, conn, method, url, rc->body.buf, rc->body.len, &rc->who);
        count(srv, 200, rc->t0);
        return ret;
    } else if (rc->who.kind != PX__WHO_NONE && strcmp(method, "GET") == 0 &&
               px_str_starts_with(url, "/v1/blobs/") && px__api_blob_prepare(&rq, &rs) != 0) {
        /* rs says why the blob cannot be had */
    } else if (rc->who.kind == PX__WHO_USER && px_str_starts_with(url, "/v1/jobs/") &&
               px__api_artifact_prepare(&rq, &rs) != 0) {
        /* rs holds the artifact's bytes, copied from the store, or why not */
    } else {
        pthread_mutex_lock(&srv->lock);
        px_err err;
        if (rc->who.kind == PX__WHO_NODE && rc->who.fresh &&
            px__auth_settle(srv, &rc->who, &err) != PX_OK)
            px__api_fail(&rs, &err);
        else if (rc->who.kind == PX__WHO_NONE)
            public_route(&rq, &rs);
        else if (px_str_starts_with(url, "/v1/agent/") ? !px__api_agent_route(&rq, &rs)
                                                       : !px__api_user_route(&rq, &rs))
            px__api_error(&rs, 404, "%s %s: no such endpoint (see docs/formats/fleet-api.md)",
                          method, url);
        pthread_mutex_unlock(&srv->lock);
    }
    count(srv, rs.status, rc->t0);
    return reply(conn, &rs);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    px_fleet_server *srv = cls;
    req_ctx *rc = *con_cls;
    /* Kept alive: the connection waits for its next request. */
    set_phase(slot_of(conn), srv->conns, PHASE_IDLE);
    if (!rc)
        return;
    __atomic_sub_fetch(&((conns *)srv->conns)->body_in_flight, rc->counted, __ATOMIC_RELAXED);
    px__upload_free(rc->upload);
    px_strbuf_release(&rc->body);
    free(rc);
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

/* Certificate and key of the server, kept until it stops (libmicrohttpd
 * reads them at start; the key is wiped afterwards). */
static px_status read_tls(px_fleet_server *srv, char **cert, char **key, px_err *err)
{
    size_t len;
    if (!MHD_is_feature_supported(MHD_FEATURE_TLS))
        return px_err_set(err, PX_EUNSUPPORTED,
                          "this libmicrohttpd was built without TLS; install one built with "
                          "GnuTLS (Debian's libmicrohttpd12 is)");
    px_status st = px_read_file(srv->opt.tls_cert, 1 << 20, cert, &len, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "--tls-cert: ");
    st = px__secret_read_file(srv->opt.tls_key, "--tls-key", 1 << 20, key, &len, err);
    if (st != PX_OK) {
        free(*cert);
        *cert = NULL;
    }
    return st;
}

px_status px__api_start(px_fleet_server *srv, const char *host, uint16_t port, px_err *err)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    const char *h = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &addr.sin_addr) != 1)
        return px_err_set(err, PX_EINVAL,
                          "--listen: \"%s\" is not an IPv4 address (use 127.0.0.1 or 0.0.0.0)",
                          host);
    conns *t = calloc(1, sizeof *t);
    if (!t)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    t->header_ns = (uint64_t)(srv->opt.header_timeout_s * 1e9);
    srv->conns = t;
    char *cert = NULL, *key = NULL;
    if (srv->tls) {
        px_status st = read_tls(srv, &cert, &key, err);
        if (st != PX_OK)
            return st;
    }
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_ERROR_LOG | (srv->tls ? MHD_USE_TLS : 0);
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, key},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, port, NULL, NULL, access_handler, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
        MHD_OPTION_CONNECTION_LIMIT, srv->opt.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        srv->opt.max_connections_per_address, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)1 << 20, MHD_OPTION_UNESCAPE_CALLBACK, unescape, srv,
        MHD_OPTION_ARRAY, srv->tls ? tls_opts : tls_opts + 2, MHD_OPTION_END);
    int e = errno;
    px__secret_wipe(key, 0);
    free(key);
    free(cert);
    if (!d)
        return px_err_set(err, PX_EPEER, "cannot listen on %s:%u: %s%s", host, (unsigned)port,
                          strerror(e),
                          srv->tls ? " (or the TLS certificate and key do not match or parse)"
                                   : " (is the port in use?)");
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (info)
        srv->port = info->port;
    srv->daemon = d;
    if (pthread_create(&t->watchdog, NULL, watchdog_main, t) != 0)
        return px_err_set(err, PX_EINTERNAL, "cannot start the connection watchdog");
    t->started = true;
    return PX_OK;
}

void px__api_stop(px_fleet_server *srv)
{
    if (srv->daemon)
        MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    conns *t = srv->conns;
    if (!t)
        return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->watchdog, NULL);
    }
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    free(t);
    srv->conns = NULL;
}
