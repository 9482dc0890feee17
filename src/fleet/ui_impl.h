/* The web dashboard of `plexus server` at /ui: private declarations shared
 * by ui_http.c (routes, login, the session cookie, static pages),
 * ui_events.c (server-sent events) and ui_incidents.c (node-loss
 * incidents), and the hooks the rest of the server calls.
 *
 * The pages are static files (src/fleet/ui/) compiled into the binary by
 * CMake; they fetch the JSON API (/v1/...) with the session cookie and
 * follow the fleet through one event stream.  docs/ui.md describes them,
 * docs/adr/0016-web-dashboard.md the choices. */
#ifndef PX_FLEET_UI_IMPL_H
#define PX_FLEET_UI_IMPL_H

#include "fleet/fleet_impl.h"

/* The name of the session cookie: the hex of the user's token. */
#define PX__UI_COOKIE "plexus_session"
/* The header a cookie-authenticated request that changes anything must
 * carry (a cross-site form cannot set it; a cross-site script would need
 * a CORS preflight the server never approves). */
#define PX__UI_CSRF_HEADER "X-Plexus-CSRF"
/* The largest body a /ui request may have (the login form). */
#define PX__UI_BODY_MAX 4096

/* One static file of the dashboard (generated: fleet_ui_assets.c). */
typedef struct px__ui_asset {
    const char *name; /* "app.js" */
    const unsigned char *data;
    size_t len;
} px__ui_asset;
extern const px__ui_asset px__ui_assets[];
extern const size_t px__ui_n_assets;

/* The longest user token (docs/formats/fleet-api.md). */
#define PX__UI_TOKEN_MAX 256

/* Parsers of what a browser sends (untrusted; fuzz/fuzz_fleet_ui.c).
 * px__ui_form_token: the value of token= in an urlencoded form body of
 * len bytes ('+' is a space, %XX decoded, spaces and line ends around it
 * dropped) into out (cap bytes with its NUL); false when absent, empty,
 * malformed or too long.
 * px__ui_cookie_token: the session cookie's value (the hex of a token)
 * decoded into out; false unless it is 1..PX__UI_TOKEN_MAX printable
 * characters without spaces that fit cap. */
bool px__ui_form_token(const char *body, size_t len, char *out, size_t cap);
bool px__ui_cookie_token(const char *value, char *out, size_t cap);

/* Whether url is the dashboard's (/ui or under /ui/). */
bool px__ui_is(const char *url);

/* Authenticates a request by its session cookie when it has no
 * Authorization header.  Returns 0 with *who filled (a user), -1 when the
 * request has no session cookie (who untouched), else the HTTP status of
 * the refusal set in rs (401 unknown session, 403 a state change without
 * the CSRF header or from another origin).  `conn` is the MHD
 * connection. */
int px__ui_cookie_auth(px_fleet_server *srv, void *conn, const char *method, px__who *who,
                       px__api_resp *rs);

/* Answers a /ui request (its body, if any, read into rq) and queues the
 * reply on the connection itself: pages with their security headers, the
 * login and logout forms, the event stream.  Takes the server lock where
 * it needs it (never held by the caller).  *status gets the HTTP status
 * for the metrics.  Returns the MHD result. */
int px__ui_serve(px__api_req *rq, int *status);

/* ui_events.c: a server-sent event stream for the user who; job (may be
 * NULL) adds that job's log chunks after seq `after`.  Returns an MHD
 * response (owned by the caller) or NULL when out of memory. */
void *px__ui_events_response(px_fleet_server *srv, const px__who *who, const char *job,
                             int64_t after);
/* The snapshot the stream sends: what `who` may see of the fleet (new
 * reference).  Server lock held. */
json_t *px__ui_snapshot(px_fleet_server *srv, const px__who *who);

/* ui_incidents.c: node-loss incidents, kept in memory (the last 200).
 * All take the server lock held. */
/* A node was found lost after `silent_s` without a heartbeat: records the
 * incident with the work that was on it (call before that work is
 * requeued). */
void px__incident_node_lost(px_fleet_server *srv, size_t node, double silent_s);
/* Follows every open incident: where its work went, the candidates the
 * scheduler weighed, the restart, the recovery time. */
void px__incidents_tick(px_fleet_server *srv);
/* The incidents (newest first) as JSON, each job entry only when viewer
 * may see the job (an admin sees all); new reference. */
json_t *px__incidents_json(px_fleet_server *srv, const px__who *viewer);
/* One incident's record, or NULL when unknown or not visible. */
json_t *px__incident_json(px_fleet_server *srv, const char *id, const px__who *viewer);
void px__incidents_free(px_fleet_server *srv);

#endif
