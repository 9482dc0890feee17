/*
 * The HTTP client of the fleet API over libcurl, used by the agent and by
 * the client commands.  One client is one connection (kept alive between
 * calls); it is not shared between threads.  Replies are bounded, and
 * curl's and the server's errors become px_err messages that name the
 * server, the request and the server's own explanation.  The token is
 * sent in a header and never appears in a message.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"
#include "plexus/fleet.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define REPLY_MAX_BYTES      (64u << 20)
#define DOWNLOAD_MAX_BYTES   (1ull << 40) /* models are gigabytes; the disk is the bound */
#define EXPECT_CONTINUE_FROM (1u << 20)   /* body bytes that wait for "100 Continue" */

#define MAX_SERVERS 16

struct px_fleet_client {
    CURL *curl;
    char *base; /* the server in use: "http://127.0.0.1:7070", no trailing slash */
    /* Every server given ("URL,URL,..."; replicas on one store): a request
     * the one in use cannot take goes to the next. */
    char *servers[MAX_SERVERS];
    int n_servers, cur;
    char *auth; /* "Authorization: Bearer ..." */
    char *ca;   /* trust only this CA file, or NULL for the system store */
    char *idem; /* "Idempotency-Key: ...", or NULL */
    long timeout_ms;
    const atomic_int *abort_flag; /* a request in flight ends when it becomes nonzero */
    void (*progress)(void *ud, uint64_t done, uint64_t total); /* or NULL */
    void *progress_ud;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void wipe_free(char *s)
{
    if (!s)
        return;
    /* The token should not outlive the client in freed memory. */
    volatile char *p = s;
    while (*p)
        *p++ = 0;
    free(s);
}

static bool token_ok(const char *token)
{
    for (const char *t = token; t && *t; t++)
        if ((unsigned char)*t <= ' ' || (unsigned char)*t >= 127)
            return false;
    return true;
}
static CURLcode curl_init_status;

/* One connection pool and TLS session cache for every client of the
 * process: an agent's job threads (one client each) reuse the connections
 * and TLS sessions of the others instead of a full handshake per job. */
static CURLSH *share;
static pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
    (void)h, (void)access, (void)ud;
    pthread_mutex_lock(&share_mu[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ud)
{
    (void)h, (void)ud;
    pthread_mutex_unlock(&share_mu[data]);
}

static void curl_init(void)
{
    curl_init_status = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (curl_init_status != CURLE_OK)
        return;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&share_mu[i], NULL);
    share = curl_share_init();
    if (share &&
        (curl_share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
         curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
         curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK ||
         curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK)) {
        curl_share_cleanup(share);
        share = NULL;
    }
}

px_status px_fleet_client_new(const char *server_url, const char *token, px_fleet_client **out,
                              px_err *err)
{
    *out = NULL;
    if (!server_url || !server_url[0])
        server_url = "http://127.0.0.1:7070";
    if (strlen(server_url) > 2048)
        return px_err_set(err, PX_EINVAL, "server URL is longer than 2048 characters");
    /* Several servers, comma-separated: each must be a URL. */
    int n_servers = 0;
    for (const char *p = server_url;; n_servers++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n_servers == MAX_SERVERS)
            return px_err_set(err, PX_EINVAL, "server URLs: more than %d servers given",
                              MAX_SERVERS);
        if ((len < 7 || strncmp(p, "http://", 7) != 0) && (len < 8 || strncmp(p, "https://", 8)))
            return px_err_set(err, PX_EINVAL,
                              "server URL %d \"%.*s\" must start with http:// or https:// "
                              "(e.g. http://127.0.0.1:7070; several servers: URL,URL)",
                              n_servers + 1, (int)PX_MIN(len, 200), p);
        if (!comma)
            break;
        p = comma + 1;
    }
    n_servers++;
    if (!token_ok(token))
        return px_err_set(err, PX_EINVAL,
                          "the token holds a space or a non-printable character; check "
                          "--token-file or PLEXUS_TOKEN");
    pthread_once(&curl_once, curl_init);
    if (curl_init_status != CURLE_OK)
        return px_err_set(err, PX_EIO, "cannot initialise libcurl: %s",
                          curl_easy_strerror(curl_init_status));
    px_fleet_client *c = calloc(1, sizeof *c);
    if (!c)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    bool ok = true;
    const char *p = server_url;
    for (int i = 0; i < n_servers; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char *u = malloc(len + 1);
        if (!u) {
            ok = false;
            break;
        }
        memcpy(u, p, len);
        u[len] = '\0';
        while (len > 0 && u[len - 1] == '/')
            u[--len] = '\0';
        c->servers[c->n_servers++] = u;
        p = comma ? comma + 1 : p + len;
    }
    c->base = c->n_servers ? c->servers[0] : NULL;
    c->auth = token && token[0] ? px_asprintf("Authorization: Bearer %s", token) : NULL;
    c->curl = curl_easy_init();
    c->timeout_ms = 30000;
    if (!ok || !c->base || !c->curl || (token && token[0] && !c->auth)) {
        px_fleet_client_free(c);
        return px_err_set(err, PX_ENOMEM, "out of memory creating the HTTP client");
    }
    *out = c;
    return PX_OK;
}

void px_fleet_client_free(px_fleet_client *c)
{
    if (!c)
        return;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    wipe_free(c->auth);
    free(c->ca);
    free(c->idem);
    for (int i = 0; i < c->n_servers; i++)
        free(c->servers[i]);
    free(c);
}

px_status px_fleet_client_set_ca(px_fleet_client *c, const char *ca_file, px_err *err)
{
    char *copy = NULL;
    if (ca_file) {
        if (access(ca_file, R_OK) != 0)
            return px_err_set(err, PX_ENOTFOUND, "CA file %s: cannot read: %s", ca_file,
                              strerror(errno));
        if (!(copy = px_strdup(ca_file)))
            return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    free(c->ca);
    c->ca = copy;
    return PX_OK;
}

px_status px_fleet_client_set_token(px_fleet_client *c, const char *token, px_err *err)
{
    if (!token_ok(token))
        return px_err_set(err, PX_EINVAL, "the token holds a space or a non-printable character");
    char *auth = token && token[0] ? px_asprintf("Authorization: Bearer %s", token) : NULL;
    if (token && token[0] && !auth)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    wipe_free(c->auth);
    c->auth = auth;
    return PX_OK;
}

px_status px_fleet_client_set_idempotency_key(px_fleet_client *c, const char *key, px_err *err)
{
    char *h = NULL;
    if (key) {
        size_t n = strlen(key);
        if (n == 0 || n > 128 || !token_ok(key))
            return px_err_set(err, PX_EINVAL,
                              "an idempotency key is 1 to 128 printable characters without "
                              "spaces");
        if (!(h = px_asprintf("Idempotency-Key: %s", key)))
            return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    free(c->idem);
    c->idem = h;
    return PX_OK;
}

void px_fleet_client_set_timeout(px_fleet_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
}

void px_fleet_client_set_abort(px_fleet_client *c, const atomic_int *flag)
{
    c->abort_flag = flag;
}

void px_fleet_client_set_progress(px_fleet_client *c,
                                  void (*fn)(void *ud, uint64_t done, uint64_t total), void *ud)
{
    c->progress = fn;
    c->progress_ud = ud;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    const px_fleet_client *c = ud;
    if (c->progress) {
        if (ultotal > 0 || ulnow > 0)
            c->progress(c->progress_ud, (uint64_t)ulnow, (uint64_t)PX_MAX(ultotal, 0));
        else if (dltotal > 0 || dlnow > 0)
            c->progress(c->progress_ud, (uint64_t)dlnow, (uint64_t)PX_MAX(dltotal, 0));
    }
    return c->abort_flag && atomic_load_explicit(c->abort_flag, memory_order_relaxed) ? 1 : 0;
}

const char *px_fleet_client_server(const px_fleet_client *c)
{
    return c->base;
}

void px__client_start_at(px_fleet_client *c, const char *url)
{
    for (int i = 0; url && i < c->n_servers; i++)
        if (!strcmp(c->servers[i], url)) {
            c->cur = i;
            c->base = c->servers[i];
            return;
        }
}

typedef struct sink {
    px_strbuf body;
    int fd; /* download target, or -1 */
    uint64_t n;
    uint64_t max;
    bool too_big;
    bool write_failed;
} sink;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    sink *s = ud;
    size_t len = size * nmemb;
    if (s->n + len > s->max) {
        s->too_big = true;
        return 0;
    }
    uint64_t at = s->n;
    s->n += len;
    if (s->fd >= 0) {
        /* Pieces of zeros stay holes (the size is set when done), as the
         * server keeps them: a sparse model costs its data, not its size. */
        for (size_t off = 0; off < len;) {
            size_t piece = PX_MIN(len - off, (size_t)(4096 - (at + off) % 4096));
            const char *p = ptr + off;
            bool zero = p[0] == 0 && memcmp(p, p + 1, piece - 1) == 0;
            for (size_t done = 0; !zero && done < piece;) {
                ssize_t w = pwrite(s->fd, p + done, piece - done, (off_t)(at + off + done));
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0) {
                    s->write_failed = true;
                    return 0;
                }
                done += (size_t)w;
            }
            off += piece;
        }
        /* Error replies are JSON: keep their start for the message. */
        if (s->body.len < 4096)
            px_strbuf_add(&s->body, ptr, PX_MIN(len, 4096 - s->body.len));
        return len;
    }
    return px_strbuf_add(&s->body, ptr, len) == PX_OK ? len : 0;
}

static px_status status_for_http(long code)
{
    switch (code) {
    case 400:
        return PX_EINVAL;
    case 401:
    case 403:
        return PX_EAUTH;
    case 404:
        return PX_ENOTFOUND;
    case 409:
        return PX_ESTATE;
    case 413:
        return PX_ELIMIT;
    default:
        return code >= 500 ? PX_EPEER : PX_EINVAL;
    }
}

/* The server's {"error": "..."} text, or the start of the body. */
static void error_text(const px_strbuf *body, char *out, size_t n)
{
    json_t *v = json_loadb(body->buf, body->len, 0, NULL);
    const char *e = json_string_value(json_object_get(v, "error"));
    if (e)
        px_strlcpy(out, e, n);
    else
        snprintf(out, n, "%.*s", (int)PX_MIN(body->len, 200), body->buf);
    json_decref(v);
}

typedef struct request {
    const char *method;
    const char *path;
    const void *data; /* request body, or NULL */
    size_t len;
    const char *content_type;
    int upload_fd; /* stream a file as the body, or -1 */
    uint64_t upload_len;
    int download_fd; /* write the reply body here, or -1 */
} request;

static size_t on_read(char *buf, size_t size, size_t nmemb, void *ud)
{
    int fd = *(int *)ud;
    ssize_t r;
    do
        r = read(fd, buf, size * nmemb);
    while (r < 0 && errno == EINTR);
    return r < 0 ? CURL_READFUNC_ABORT : (size_t)r;
}

static px_status perform_one(px_fleet_client *c, const request *rq, long *http_status, sink *s,
                             bool *next, px_err *err)
{
    *next = false;
    CURL *h = c->curl;
    curl_easy_reset(h);
    char *url = px_asprintf("%s%s", c->base, rq->path);
    if (!url)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    struct curl_slist *hdrs = NULL;
    if (c->auth)
        hdrs = curl_slist_append(hdrs, c->auth);
    if (c->idem)
        hdrs = curl_slist_append(hdrs, c->idem);
    char ct[128];
    snprintf(ct, sizeof ct, "Content-Type: %s",
             rq->content_type ? rq->content_type : "application/json");
    hdrs = curl_slist_append(hdrs, ct);
    /* A small body goes at once; a large one waits for the server's "100
     * Continue", so that a refusal (413 over the limit, 401) arrives as an
     * answer instead of a reset in the middle of the body. */
    size_t body_len = rq->upload_fd >= 0 ? (size_t)rq->upload_len : rq->data ? rq->len : 0;
    if (body_len < EXPECT_CONTINUE_FROM)
        hdrs = curl_slist_append(hdrs, "Expect:");
    else
        hdrs = curl_slist_append(hdrs, "Expect: 100-continue");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (share)
        curl_easy_setopt(h, CURLOPT_SHARE, share);
    if (c->ca) {
        /* Pinned: this CA alone, not the system's store. */
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
    }
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    if (c->abort_flag || c->progress) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)c);
    }
    int upload_fd = rq->upload_fd;
    if (upload_fd >= 0 && lseek(upload_fd, 0, SEEK_SET) != 0) {
        curl_slist_free_all(hdrs);
        free(url);
        return px_err_set(err, PX_EIO, "cannot read the file to send: %s", strerror(errno));
    }
    if (!strcmp(rq->method, "GET")) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (upload_fd >= 0) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &upload_fd);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rq->upload_len);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);
    } else {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->data ? rq->data : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(rq->data ? rq->len : 0));
        if (strcmp(rq->method, "POST"))
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);
    }
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hdrs);
    if (http_status)
        *http_status = code;
    px_status st = PX_OK;
    if (rc != CURLE_OK) {
        if (s->too_big)
            st = px_err_set(err, PX_ELIMIT, "%s %s: reply larger than %llu bytes", rq->method, url,
                            (unsigned long long)s->max);
        else if (s->write_failed)
            st = px_err_set(err, PX_EIO, "%s %s: cannot write the download: %s", rq->method, url,
                            strerror(errno));
        else if (rc == CURLE_ABORTED_BY_CALLBACK)
            st = px_err_set(err, PX_ETIMEOUT, "%s %s: interrupted", rq->method, rq->path);
        else {
            /* Nothing was sent: another server may take it. */
            *next = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST;
            st = px_err_set(err, rc == CURLE_OPERATION_TIMEDOUT ? PX_ETIMEOUT : PX_EIO,
                            "cannot reach the plexus server at %s (%s %s): %s; check --server "
                            "or PLEXUS_SERVER and that the server runs",
                            c->base, rq->method, rq->path, curl_easy_strerror(rc));
        }
    } else if (code < 200 || code >= 300) {
        /* A replica standing by refuses before it reads anything. */
        *next = code == 503 && s->body.len > 0 &&
                (strstr(s->body.buf, "\"standby\"") || strstr(s->body.buf, "\"failed\""));
        char text[200];
        error_text(&s->body, text, sizeof text);
        st = px_err_set(err, status_for_http(code), "%s %s: server answered %ld: %s", rq->method,
                        rq->path, code, text);
    }
    free(url);
    return st;
}

/* Sends the request to the server in use; when it cannot take it (it
 * cannot be reached, or it is a replica standing by) and others were
 * given, to each of them in turn, keeping the first that answers. */
static px_status perform(px_fleet_client *c, const request *rq, long *http_status, sink *s,
                         px_err *err)
{
    px_status st = PX_EIO;
    for (int tried = 0; tried < c->n_servers; tried++) {
        bool next = false;
        st = perform_one(c, rq, http_status, s, &next, err);
        if (!next || c->n_servers == 1)
            break;
        c->cur = (c->cur + 1) % c->n_servers;
        c->base = c->servers[c->cur];
        px_strbuf_reset(&s->body);
        s->n = 0;
        s->too_big = s->write_failed = false;
        if (s->fd >= 0 && ftruncate(s->fd, 0) != 0)
            break;
    }
    return st;
}

static px_status parse_reply(const sink *s, const char *path, json_t **reply, px_err *err)
{
    if (!reply)
        return PX_OK;
    *reply = NULL;
    if (s->body.len == 0) {
        *reply = json_object();
        return *reply ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px_json_limits lim = {.max_bytes = REPLY_MAX_BYTES, .max_string = REPLY_MAX_BYTES};
    px_status st = px_json_parse(s->body.buf, s->body.len, path, &lim, reply, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "reply of the server: ");
    return PX_OK;
}

px_status px_fleet_client_call(px_fleet_client *c, const char *method, const char *path,
                               const json_t *body, long *http_status, json_t **reply, px_err *err)
{
    if (reply)
        *reply = NULL;
    char *text = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return px_err_set(err, PX_ENOMEM, "out of memory encoding the request");
    request rq = {method, path, text, text ? strlen(text) : 0, NULL, -1, 0, -1};
    sink s = {PX_STRBUF_INIT, -1, 0, REPLY_MAX_BYTES, false, false};
    px_status st = perform(c, &rq, http_status, &s, err);
    free(text);
    if (st == PX_OK)
        st = parse_reply(&s, path, reply, err);
    px_strbuf_release(&s.body);
    return st;
}

px_status px_fleet_client_send(px_fleet_client *c, const char *method, const char *path,
                               const void *data, size_t len, long *http_status, json_t **reply,
                               px_err *err)
{
    if (reply)
        *reply = NULL;
    request rq = {method, path, data, len, "application/octet-stream", -1, 0, -1};
    sink s = {PX_STRBUF_INIT, -1, 0, REPLY_MAX_BYTES, false, false};
    px_status st = perform(c, &rq, http_status, &s, err);
    if (st == PX_OK)
        st = parse_reply(&s, path, reply, err);
    px_strbuf_release(&s.body);
    return st;
}

px_status px_fleet_client_send_file(px_fleet_client *c, const char *method, const char *path,
                                    const char *file, long *http_status, json_t **reply,
                                    px_err *err)
{
    if (reply)
        *reply = NULL;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s: cannot open: %s", file,
                          strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return px_err_set(err, PX_EINVAL, "%s: not a regular file", file);
    }
    request rq = {method, path, NULL, 0, "application/octet-stream", fd, (uint64_t)sb.st_size, -1};
    sink s = {PX_STRBUF_INIT, -1, 0, REPLY_MAX_BYTES, false, false};
    px_status st = perform(c, &rq, http_status, &s, err);
    close(fd);
    if (st == PX_OK)
        st = parse_reply(&s, path, reply, err);
    px_strbuf_release(&s.body);
    return st;
}

px_status px__client_send_fd(px_fleet_client *c, const char *method, const char *path, int fd,
                             uint64_t len, long *http_status, json_t **reply, px_err *err)
{
    if (reply)
        *reply = NULL;
    request rq = {method, path, NULL, 0, "application/octet-stream", fd, len, -1};
    sink s = {PX_STRBUF_INIT, -1, 0, REPLY_MAX_BYTES, false, false};
    px_status st = perform(c, &rq, http_status, &s, err);
    if (st == PX_OK)
        st = parse_reply(&s, path, reply, err);
    px_strbuf_release(&s.body);
    return st;
}

px_status px_fleet_client_download(px_fleet_client *c, const char *path, const char *dest,
                                   long *http_status, px_err *err)
{
    char *tmp = px_asprintf("%s.part.%ld", dest, (long)getpid());
    if (!tmp)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", dest, strerror(errno));
        free(tmp);
        return st;
    }
    request rq = {"GET", path, NULL, 0, NULL, -1, 0, fd};
    sink s = {PX_STRBUF_INIT, fd, 0, DOWNLOAD_MAX_BYTES, false, false};
    px_status st = perform(c, &rq, http_status, &s, err);
    if (st == PX_OK && (ftruncate(fd, (off_t)s.n) != 0 || fsync(fd) != 0))
        st = px_err_set(err, PX_EIO, "%s: cannot write: %s", dest, strerror(errno));
    if (close(fd) != 0 && st == PX_OK)
        st = px_err_set(err, PX_EIO, "%s: cannot write: %s", dest, strerror(errno));
    if (st == PX_OK && rename(tmp, dest) != 0)
        st = px_err_set(err, PX_EIO, "%s: cannot write: %s", dest, strerror(errno));
    if (st != PX_OK)
        unlink(tmp);
    free(tmp);
    px_strbuf_release(&s.body);
    return st;
}

char *px_fleet_url_escape(const char *s)
{
    pthread_once(&curl_once, curl_init);
    char *e = curl_easy_escape(NULL, s, 0);
    if (!e)
        return NULL;
    char *r = px_strdup(e);
    curl_free(e);
    return r;
}
