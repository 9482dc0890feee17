/* The dashboard's routes: the login page and its form, the session
 * cookie, the static pages compiled into the binary, and the security
 * headers every page carries.
 *
 * A person logs in with a user token (the API's own): the form posts it,
 * the server checks it like a bearer token and keeps it in a cookie that
 * scripts cannot read (HttpOnly), that no other site's request carries
 * (SameSite=Strict), and that travels only over TLS when the server has
 * it (Secure).  The token never appears in a URL.  A browser without a
 * valid session gets the login page and nothing else.  The pages then
 * call the JSON API with the cookie; a call that changes anything must
 * also carry the X-Plexus-CSRF header and come from this origin. */
#include "base/common.h"

#include "fleet/secret_impl.h"
#include "fleet/ui_impl.h"

#include <microhttpd.h>

/* The login form's body: token=... (the longest token is 256 bytes,
 * percent-encoded at most three times that). */
#define LOGIN_BODY_MAX PX__UI_BODY_MAX
#define TOKEN_MAX      PX__UI_TOKEN_MAX
/* A session lasts this long; then the person logs in again. */
#define SESSION_S 43200

static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                          "frame-ancestors 'none'; base-uri 'none'";

bool px__ui_is(const char *url)
{
    return strcmp(url, "/ui") == 0 || px_str_starts_with(url, "/ui/");
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

bool px__ui_cookie_token(const char *value, char *out, size_t cap)
{
    size_t n = strlen(value);
    if (n == 0 || n % 2 || n / 2 > PX__UI_TOKEN_MAX || n / 2 >= cap)
        return false;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval(value[i]), lo = hexval(value[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        char c = (char)(hi * 16 + lo);
        if (c <= ' ' || c > '~')
            return false;
        out[k++] = c;
    }
    out[k] = '\0';
    return true;
}

/* The session cookie's user, or false (no cookie, not hex, not a user's
 * token). */
static bool session_user(px_fleet_server *srv, struct MHD_Connection *conn, px__who *who,
                         bool *had_cookie)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_COOKIE_KIND, PX__UI_COOKIE);
    *had_cookie = v != NULL;
    if (!v)
        return false;
    char bearer[8 + PX__UI_TOKEN_MAX + 1] = "Bearer ";
    if (!px__ui_cookie_token(v, bearer + 7, sizeof bearer - 7))
        return false;
    px__who w;
    bool ok = px__auth_identify(srv, bearer, &w) && w.kind == PX__WHO_USER;
    px__secret_wipe(bearer, sizeof bearer);
    if (ok)
        *who = w;
    return ok;
}

/* Whether the request comes from this server's own pages: an Origin
 * header, when the browser sent one, names this host, and Sec-Fetch-Site,
 * when sent, is same-origin (or none: typed in the address bar). */
static bool same_origin(px_fleet_server *srv, struct MHD_Connection *conn)
{
    const char *site = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Sec-Fetch-Site");
    if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
        return false;
    const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return true;
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host");
    if (!host)
        return false;
    char want[300];
    snprintf(want, sizeof want, "%s://%s", srv->tls ? "https" : "http", host);
    return strcmp(origin, want) == 0;
}

int px__ui_cookie_auth(px_fleet_server *srv, void *conn_v, const char *method, px__who *who,
                       px__api_resp *rs)
{
    struct MHD_Connection *conn = conn_v;
    bool had;
    px__who w;
    if (!session_user(srv, conn, &w, &had)) {
        if (!had)
            return -1;
        px__api_error(rs, 401, "the session is not valid (log in again at /ui/login)");
        return 401;
    }
    bool safe = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (!safe && (!MHD_lookup_connection_value(conn, MHD_HEADER_KIND, PX__UI_CSRF_HEADER) ||
                  !same_origin(srv, conn))) {
        px__api_error(rs, 403,
                      "%s with a session cookie needs the %s header and the server's own "
                      "origin (cross-site requests are refused)",
                      method, PX__UI_CSRF_HEADER);
        return 403;
    }
    *who = w;
    return 0;
}

static const px__ui_asset *asset(const char *name)
{
    for (size_t i = 0; i < px__ui_n_assets; i++)
        if (strcmp(px__ui_assets[i].name, name) == 0)
            return &px__ui_assets[i];
    return NULL;
}

static const char *ctype_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".html"))
        return "text/html; charset=utf-8";
    if (dot && !strcmp(dot, ".js"))
        return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css"))
        return "text/css; charset=utf-8";
    if (dot && !strcmp(dot, ".svg"))
        return "image/svg+xml";
    return "application/octet-stream";
}

static void add_security_headers(struct MHD_Response *r)
{
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "same-origin");
    MHD_add_response_header(r, "Cross-Origin-Opener-Policy", "same-origin");
    MHD_add_response_header(r, "Cache-Control", "no-store");
}

/* Queues a reply; body is copied.  Extra headers come in name, value
 * pairs ending with NULL. */
static int send_reply(struct MHD_Connection *conn, int status, const char *ctype, const void *body,
                      size_t len, ...)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    add_security_headers(r);
    MHD_add_response_header(r, "Content-Type", ctype);
    va_list ap;
    va_start(ap, len);
    for (const char *k; (k = va_arg(ap, const char *));) {
        const char *v = va_arg(ap, const char *);
        MHD_add_response_header(r, k, v);
    }
    va_end(ap);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static int send_json(struct MHD_Connection *conn, int status, json_t *v)
{
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!text)
        return send_reply(conn, 500, "application/json", "{\"error\":\"out of memory\"}", 25, NULL);
    int ret = send_reply(conn, status, "application/json", text, strlen(text), NULL);
    free(text);
    return ret;
}

static int redirect(struct MHD_Connection *conn, const char *to, const char *cookie)
{
    static const char body[] = "see other\n";
    if (cookie)
        return send_reply(conn, 303, "text/plain; charset=utf-8", body, sizeof body - 1, "Location",
                          to, "Set-Cookie", cookie, NULL);
    return send_reply(conn, 303, "text/plain; charset=utf-8", body, sizeof body - 1, "Location", to,
                      NULL);
}

/* The login page, with a fixed message in place of its marker (nothing
 * the request sent is ever echoed). */
static int login_page(struct MHD_Connection *conn, int status, const char *message)
{
    const px__ui_asset *a = asset("login.html");
    if (!a)
        return MHD_NO;
    const char *marker = "<!--message-->";
    const char *text = (const char *)a->data;
    const char *at = strstr(text, marker);
    px_strbuf sb = PX_STRBUF_INIT;
    if (at && message) {
        px_strbuf_add(&sb, text, (size_t)(at - text));
        px_strbuf_addf(&sb, "<p class=\"error\" role=\"alert\">%s</p>", message);
        px_strbuf_adds(&sb, at + strlen(marker));
    } else
        px_strbuf_add(&sb, text, a->len);
    int ret = send_reply(conn, status, "text/html; charset=utf-8", sb.buf, sb.len, NULL);
    px_strbuf_release(&sb);
    return ret;
}

bool px__ui_form_token(const char *body, size_t len, char *out, size_t cap)
{
    if (cap == 0)
        return false;
    const char *p = body, *end = body + len;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        if ((size_t)(stop - p) > 6 && memcmp(p, "token=", 6) == 0) {
            size_t k = 0;
            for (const char *r = p + 6; r < stop; r++) {
                char c = *r;
                if (c == '+')
                    c = ' ';
                else if (c == '%') {
                    if (stop - r < 3)
                        return false;
                    int hi = hexval((char)(r[1] | 0x20)), lo = hexval((char)(r[2] | 0x20));
                    if (hi < 0 || lo < 0)
                        return false;
                    c = (char)(hi * 16 + lo);
                    r += 2;
                }
                if (c == '\0' || k + 1 >= cap)
                    return false;
                out[k++] = c;
            }
            out[k] = '\0';
            /* A token pasted with a line end or spaces around it. */
            while (k > 0 && (out[k - 1] == ' ' || out[k - 1] == '\n' || out[k - 1] == '\r' ||
                             out[k - 1] == '\t'))
                out[--k] = '\0';
            size_t lead = strspn(out, " \t\r\n");
            memmove(out, out + lead, k - lead + 1);
            return out[0] != '\0';
        }
        p = stop + 1;
    }
    return false;
}

static int login(px__api_req *rq, int *status)
{
    struct MHD_Connection *conn = rq->conn;
    px_fleet_server *srv = rq->srv;
    if (!same_origin(srv, conn)) {
        *status = 403;
        return login_page(conn, 403, "This form only accepts logins from its own page.");
    }
    char token[TOKEN_MAX * 3 + 1];
    if (rq->body_len > LOGIN_BODY_MAX ||
        !px__ui_form_token(rq->body ? rq->body : "", rq->body_len, token, sizeof token)) {
        *status = 200;
        return login_page(conn, 200, "Paste a user token into the field.");
    }
    char bearer[sizeof token + 8];
    snprintf(bearer, sizeof bearer, "Bearer %s", token);
    px__who who;
    bool ok =
        px__token_valid(token) && px__auth_identify(srv, bearer, &who) && who.kind == PX__WHO_USER;
    px__secret_wipe(bearer, sizeof bearer);
    if (!ok) {
        px__secret_wipe(token, sizeof token);
        /* The form again with the reason, as a page (200): a browser
         * reports a 4xx page as an error in its console. */
        *status = 200;
        px_log_info("fleet: ui: a login with an unknown token was refused");
        return login_page(conn, 200,
                          "Unknown token: use a user token from the server's token file "
                          "(a join token or a node credential does not log in).");
    }
    char cookie[TOKEN_MAX * 2 + 160];
    int n = snprintf(cookie, sizeof cookie, "%s=", PX__UI_COOKIE);
    for (const char *c = token; *c; c++)
        n += snprintf(cookie + n, sizeof cookie - (size_t)n, "%02x", (unsigned char)*c);
    snprintf(cookie + n, sizeof cookie - (size_t)n,
             "; Path=/; Max-Age=%d; HttpOnly; SameSite=Strict%s", SESSION_S,
             srv->tls ? "; Secure" : "");
    px__secret_wipe(token, sizeof token);
    px_log_info("fleet: ui: %s logged in", who.name);
    *status = 303;
    int ret = redirect(conn, "/ui/", cookie);
    px__secret_wipe(cookie, sizeof cookie);
    return ret;
}

static int logout(px__api_req *rq, int *status)
{
    char cookie[160];
    snprintf(cookie, sizeof cookie, "%s=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict%s",
             PX__UI_COOKIE, rq->srv->tls ? "; Secure" : "");
    if (!same_origin(rq->srv, rq->conn)) {
        *status = 403;
        return send_json(rq->conn, 403,
                         json_pack("{s:s}", "error", "logout is only accepted from the dashboard"));
    }
    *status = 303;
    return redirect(rq->conn, "/ui/login", cookie);
}

static int events(px__api_req *rq, const px__who *who, int *status)
{
    const char *job = px__api_query(rq, "job");
    const char *after_s = px__api_query(rq, "after");
    const char *last = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Last-Event-ID");
    if (last)
        after_s = last;
    int64_t after = 0;
    if (after_s) {
        char *end;
        long long v = strtoll(after_s, &end, 10);
        if (*end || end == after_s || v < 0) {
            *status = 400;
            return send_json(rq->conn, 400,
                             json_pack("{s:s}", "error",
                                       "events: after (or Last-Event-ID) must be a log "
                                       "sequence number"));
        }
        after = v;
    }
    if (job && (strlen(job) > 64 || !*job)) {
        *status = 404;
        return send_json(rq->conn, 404, json_pack("{s:s}", "error", "events: no such job"));
    }
    struct MHD_Response *r = px__ui_events_response(rq->srv, who, job, after);
    if (!r)
        return MHD_NO;
    add_security_headers(r);
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    *status = 200;
    enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static int incident(px__api_req *rq, const px__who *who, const char *id, int *status)
{
    pthread_mutex_lock(&rq->srv->lock);
    json_t *v = *id ? px__incident_json(rq->srv, id, who) : px__incidents_json(rq->srv, who);
    pthread_mutex_unlock(&rq->srv->lock);
    if (!v) {
        *status = 404;
        return send_json(rq->conn, 404,
                         json_pack("{s:s}", "error", "no such incident; see /ui/#/incidents"));
    }
    *status = 200;
    return send_json(rq->conn, 200, *id ? v : json_pack("{s:o}", "incidents", v));
}

int px__ui_serve(px__api_req *rq, int *status)
{
    struct MHD_Connection *conn = rq->conn;
    const char *url = rq->url;
    bool get = strcmp(rq->method, "GET") == 0 || strcmp(rq->method, "HEAD") == 0;
    bool post = strcmp(rq->method, "POST") == 0;
    px__who who;
    bool had_cookie;
    bool authed = session_user(rq->srv, conn, &who, &had_cookie);
    const char *name = strcmp(url, "/ui") == 0 ? "" : url + 4;

    if (strcmp(name, "login") == 0 && post)
        return login(rq, status);
    if (strcmp(name, "logout") == 0 && post)
        return logout(rq, status);
    if (!get) {
        *status = 405;
        return send_json(conn, 405,
                         json_pack("{s:s}", "error",
                                   "the dashboard answers GET; it posts only /ui/login and "
                                   "/ui/logout"));
    }
    const px__ui_asset *a = asset(name);
    if (strcmp(name, "style.css") == 0 && a) {
        *status = 200;
        return send_reply(conn, 200, ctype_of(name), a->data, a->len, NULL);
    }
    if (strcmp(name, "login") == 0) {
        if (authed) {
            *status = 303;
            return redirect(conn, "/ui/", NULL);
        }
        *status = 200;
        return login_page(conn, 200, had_cookie ? "Your session ended: log in again." : NULL);
    }
    if (!authed) {
        /* Only the login page, whatever was asked. */
        if (strcmp(name, "events") == 0 || px_str_starts_with(name, "api/")) {
            *status = 401;
            return send_json(conn, 401, json_pack("{s:s}", "error", "log in first at /ui/login"));
        }
        *status = 303;
        return redirect(conn, "/ui/login", NULL);
    }
    if (!*name || strcmp(name, "index.html") == 0) {
        a = asset("index.html");
        *status = a ? 200 : 500;
        return a ? send_reply(conn, 200, ctype_of("index.html"), a->data, a->len, NULL)
                 : send_json(conn, 500, json_pack("{s:s}", "error", "dashboard not built in"));
    }
    if (strcmp(name, "events") == 0)
        return events(rq, &who, status);
    if (strcmp(name, "api/incidents") == 0)
        return incident(rq, &who, "", status);
    if (px_str_starts_with(name, "api/incidents/"))
        return incident(rq, &who, name + strlen("api/incidents/"), status);
    if (!a || strchr(name, '/') || strcmp(name, "login.html") == 0) {
        *status = 404;
        return send_json(conn, 404,
                         json_pack("{s:s}", "error", "no such page of the dashboard; see /ui/"));
    }
    *status = 200;
    return send_reply(conn, 200, ctype_of(name), a->data, a->len, NULL);
}
