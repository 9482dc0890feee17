/* The dashboard's live feed: one server-sent event stream per open page.
 *
 * The stream sends `snapshot` events (what its user may see of the
 * fleet: nodes, jobs, deployments, incidents) whenever the fleet changes, at most a
 * few times a second and at least every SNAPSHOT_S while anything in it
 * changed (heartbeat ages and loads do); with ?job=ID it also sends that
 * job's log chunks as `log` events, each with the chunk's sequence number
 * as its event id, so that a browser reconnecting with Last-Event-ID
 * resumes where it was, and `logend` once the job ended and its log is
 * complete.  The stream's thread (libmicrohttpd gives each connection
 * one) waits on the server's `changed` condition; the server lock is
 * held only to build an event. */
#include "base/common.h"

#include "fleet/ui_impl.h"

#include <microhttpd.h>
#include <time.h>

#define SNAPSHOT_S    2.0
#define MIN_GAP_MS    300
#define KEEPALIVE_S   15.0
#define LOG_EVENT_MAX (1u << 20) /* log bytes in one fill */
#define SNAPSHOT_JOBS 200

typedef struct ui_stream {
    px_fleet_server *srv;
    px__who who;
    char job[72];
    bool has_job, log_done;
    int64_t after;
    char *last; /* the last snapshot sent */
    px_strbuf out;
    size_t off;
    uint64_t last_send_ns;
} ui_stream;

/* ---- the snapshot ---- */

typedef struct snap_ctx {
    px_fleet_server *srv;
    const px__who *who;
    json_t *jobs, *deployments;
} snap_ctx;

static void snap_job(const px__job_row *row, void *ud)
{
    snap_ctx *c = ud;
    px__job *live = px__srv_find_job(c->srv, row->id);
    const px__job_row *r = live ? &live->row : row;
    json_t *j = px__srv_job_json(c->srv, r, live, false, c->who);
    if (!j)
        return;
    json_object_set_new(j, "has_plan", json_boolean(r->plan != NULL));
    json_object_set_new(j, "error", r->error ? json_string(r->error) : json_null());
    json_array_append_new(c->jobs, j);
}

static void snap_deployment(const px__deploy_row *row, void *ud)
{
    snap_ctx *c = ud;
    json_t *d = px__srv_deploy_json(c->srv, row, false);
    if (d)
        json_array_append_new(c->deployments, d);
}

json_t *px__ui_snapshot(px_fleet_server *srv, const px__who *who)
{
    json_t *nodes = json_array();
    for (size_t i = 0; i < px_fleet_sched_n_nodes(srv->sched); i++)
        json_array_append_new(nodes, px__srv_node_json(srv, i));
    snap_ctx c = {srv, who, json_array(), json_array()};
    px_err err;
    json_t *store_error = json_null();
    /* The user's own deployments (an admin's: all), as GET /v1/deployments. */
    const char *owner = who->admin ? NULL : who->name;
    if (srv->store.ops->list_jobs(srv->store.self, "", owner, SNAPSHOT_JOBS, snap_job, &c, &err) !=
            PX_OK ||
        srv->store.ops->list_deployments(srv->store.self, owner, snap_deployment, &c, &err) !=
            PX_OK)
        store_error = json_string(err.msg);
    return json_pack("{s:{s:s, s:b}, s:s, s:b, s:f, s:o, s:o, s:o, s:o, s:o}", "user", "name",
                     who->name, "admin", who->admin, "version", px_version(), "tls", srv->tls,
                     "lease_s", srv->opt.lease_s, "nodes", nodes, "jobs", c.jobs, "incidents",
                     px__incidents_json(srv, who), "deployments", c.deployments, "store_error",
                     store_error);
}

/* ---- events ---- */

static void add_event(px_strbuf *sb, const char *event, const char *id, const char *data)
{
    if (id)
        px_strbuf_addf(sb, "id: %s\n", id);
    px_strbuf_addf(sb, "event: %s\n", event);
    /* JSON text has no raw line ends; data is one line. */
    px_strbuf_adds(sb, "data: ");
    px_strbuf_adds(sb, data);
    px_strbuf_adds(sb, "\n\n");
}

typedef struct log_ctx {
    ui_stream *s;
    size_t bytes;
    bool more;
} log_ctx;

static void log_one(const px__log_chunk *c, void *ud)
{
    log_ctx *x = ud;
    if (x->more || (x->bytes > 0 && x->bytes + c->len > LOG_EVENT_MAX)) {
        x->more = true;
        return;
    }
    x->bytes += c->len;
    px_strbuf text = PX_STRBUF_INIT;
    px__api_add_utf8(&text, (const unsigned char *)c->data, c->len);
    json_t *v =
        json_pack("{s:I, s:s, s:i, s:i, s:s%}", "seq", (json_int_t)c->seq, "stream", c->stream,
                  "rank", c->rank, "attempt", c->attempt, "data", text.buf, text.len);
    px_strbuf_release(&text);
    char *data = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (data) {
        char id[32];
        snprintf(id, sizeof id, "%" PRId64, c->seq);
        add_event(&x->s->out, "log", id, data);
        x->s->after = c->seq;
    } else
        x->more = true;
    free(data);
}

/* The job's new log chunks into s->out; lock held. */
static void add_logs(ui_stream *s)
{
    px_fleet_server *srv = s->srv;
    px__job *live = px__srv_find_job(srv, s->job);
    px__job_row row = {0};
    const char *owner;
    px_err err;
    if (live)
        owner = live->row.owner;
    else if (srv->store.ops->get_job(srv->store.self, s->job, &row, &err) == PX_OK)
        owner = row.owner;
    else {
        add_event(&s->out, "logend", NULL, "{\"error\":\"no such job\"}");
        s->log_done = true;
        return;
    }
    bool visible = s->who.admin || (owner && strcmp(owner, s->who.name) == 0);
    px__job_row_release(&row);
    if (!visible) {
        /* Another user's job is "no such job", as in the API. */
        add_event(&s->out, "logend", NULL, "{\"error\":\"no such job\"}");
        s->log_done = true;
        return;
    }
    log_ctx x = {s, 0, false};
    if (srv->store.ops->read_logs(srv->store.self, s->job, s->after, NULL, SIZE_MAX, log_one, &x,
                                  &err) != PX_OK) {
        px_log_warn("fleet: ui: logs of %s: %s", s->job, err.msg);
        return;
    }
    if (!live && !x.more) {
        add_event(&s->out, "logend", NULL, "{}");
        s->log_done = true;
    }
}

/* Fills s->out with the next events, waiting for a change; false when
 * the server is stopping. */
static bool fill(ui_stream *s)
{
    px_fleet_server *srv = s->srv;
    uint64_t now = px_now_ns();
    uint64_t gap = (uint64_t)MIN_GAP_MS * 1000000u;
    if (s->last_send_ns && now - s->last_send_ns < gap) {
        uint64_t left = gap - (now - s->last_send_ns);
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&srv->lock);
    uint64_t deadline = s->last ? px_now_ns() + (uint64_t)(SNAPSHOT_S * 1e9) : 0;
    uint64_t quiet_since = px_now_ns();
    for (;;) {
        if (srv->stopping)
            break;
        if (s->has_job && !s->log_done)
            add_logs(s);
        json_t *snap = px__ui_snapshot(srv, &s->who);
        char *text = snap ? json_dumps(snap, JSON_COMPACT) : NULL;
        json_decref(snap);
        if (text && (!s->last || strcmp(text, s->last) != 0)) {
            add_event(&s->out, "snapshot", NULL, text);
            free(s->last);
            s->last = text;
        } else
            free(text);
        if (s->out.len > 0)
            break;
        if (px_now_ns() - quiet_since > (uint64_t)(KEEPALIVE_S * 1e9)) {
            px_strbuf_adds(&s->out, ": keepalive\n\n");
            break;
        }
        if (!px__srv_wait(srv, deadline))
            deadline = px_now_ns() + (uint64_t)(SNAPSHOT_S * 1e9);
    }
    bool stopping = srv->stopping;
    pthread_mutex_unlock(&srv->lock);
    s->last_send_ns = px_now_ns();
    return !stopping;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ui_stream *s = cls;
    while (s->off >= s->out.len) {
        px_strbuf_release(&s->out);
        px_strbuf_init(&s->out);
        s->off = 0;
        if (!fill(s))
            return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = s->out.len - s->off;
    if (n > max)
        n = max;
    memcpy(buf, s->out.buf + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    ui_stream *s = cls;
    px_strbuf_release(&s->out);
    free(s->last);
    free(s);
}

void *px__ui_events_response(px_fleet_server *srv, const px__who *who, const char *job,
                             int64_t after)
{
    ui_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->srv = srv;
    s->who = *who;
    if (job) {
        snprintf(s->job, sizeof s->job, "%s", job);
        s->has_job = true;
    }
    s->after = after;
    px_strbuf_init(&s->out);
    /* The browser's EventSource retries after `retry` ms when the stream
     * ends (a server restart). */
    px_strbuf_adds(&s->out, "retry: 2000\n\n");
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, s, stream_free);
    if (!r)
        stream_free(s);
    return r;
}
