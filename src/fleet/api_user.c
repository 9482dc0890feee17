/* User endpoints: submit, list, inspect, cancel, explain, logs, artifacts,
 * nodes, blobs.  A user sees and acts on the jobs they submitted; the
 * admin role sees every job (and manages nodes), but the values of a
 * job's environment are shown to its owner alone.  A job another user
 * owns answers 404, as one that does not exist.  Called with the server
 * lock held. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <fcntl.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <strings.h>
#include <unistd.h>

#define LOG_REPLY_MAX (4u << 20)
#define MAX_WAIT_S    30

static json_t *parse_or_null(const char *text)
{
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    return v ? v : json_null();
}

static json_t *time_json(int64_t t)
{
    if (t <= 0)
        return json_null();
    char buf[32];
    px_time_format(t, buf);
    return json_string(buf);
}

bool px__api_may_see(const px__api_req *rq, const px__job_row *row)
{
    return rq->who.admin || (row->owner && !strcmp(row->owner, rq->who.name));
}

/* The spec as its viewer may see it: env values hidden from all but the
 * job's owner (an admin included). */
static json_t *spec_for(const px__job_row *row, const px__who *viewer)
{
    json_t *spec = parse_or_null(row->spec);
    bool owner = viewer && row->owner && !strcmp(row->owner, viewer->name);
    json_t *env = json_object_get(spec, "env");
    if (!owner && json_is_object(env)) {
        const char *k;
        json_t *v;
        json_object_foreach(env, k, v) json_object_set_new(env, k, json_string("(hidden)"));
    }
    return spec;
}

json_t *px__srv_job_json(px_fleet_server *srv, const px__job_row *row, const px__job *live,
                         bool detail, const px__who *viewer)
{
    (void)srv;
    json_t *members = parse_or_null(row->members);
    json_t *nodes = json_array();
    for (size_t i = 0; json_is_array(members) && i < json_array_size(members); i++) {
        const json_t *n = json_object_get(json_array_get(members, i), "node");
        if (json_is_string(n))
            json_array_append(nodes, (json_t *)n);
    }
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(row->id));
    json_object_set_new(o, "name", json_string(row->name ? row->name : row->id));
    json_object_set_new(o, "owner", row->owner ? json_string(row->owner) : json_null());
    json_object_set_new(o, "state",
                        json_string(live ? px__job_state_name(live->state) : row->state));
    json_object_set_new(o, "attempt", json_integer(row->attempt));
    json_object_set_new(o, "nodes", nodes);
    json_object_set_new(o, "created", time_json(row->created));
    json_object_set_new(o, "updated", time_json(row->updated));
    json_object_set_new(o, "exit_code",
                        row->exit_code == INT_MIN ? json_null() : json_integer(row->exit_code));
    if (detail) {
        json_object_set_new(o, "spec", spec_for(row, viewer));
        json_object_set_new(o, "time_limit_s",
                            live && live->time_limit_s > 0 ? json_real(live->time_limit_s)
                                                           : json_null());
        json_object_set(o, "members", members);
        json_object_set_new(o, "result", parse_or_null(row->result));
        json_object_set_new(o, "error", row->error ? json_string(row->error) : json_null());
        json_object_set_new(o, "restarts", json_integer(row->restarts));
        json_object_set_new(o, "plan", parse_or_null(row->plan));
    }
    json_decref(members);
    return o;
}

json_t *px__srv_node_json(px_fleet_server *srv, size_t i)
{
    const px__sched_node *n = &srv->sched->nodes[i];
    static const char *const states[] = {"online", "offline", "draining"};
    json_t *devs = json_array(), *fws = json_array(), *res = json_array(), *run = json_array();
    for (int d = 0; d < n->n_devs; d++) {
        const px__sched_device *dv = &n->devs[d];
        const char *owner = NULL;
        for (size_t a = 0; a < n->n_allocs && !owner; a++)
            if (n->allocs[a].devices >> d & 1)
                owner = n->allocs[a].owner;
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:f}", "id", dv->id, "class",
                              dv->gpu ? "gpu" : "cpu", "vendor", dv->vendor, "model", dv->model,
                              "capability", dv->capability, "memory", dv->mem_total);
        json_object_set_new(o, "memory_free",
                            dv->mem_free >= 0 ? json_real(dv->mem_free) : json_null());
        json_object_set_new(o, "allocated_to", owner ? json_string(owner) : json_null());
        json_array_append_new(devs, o);
    }
    for (int f = 0; f < n->n_fws; f++)
        json_array_append_new(
            fws, json_pack("{s:s, s:s}", "name", n->fws[f].name, "version", n->fws[f].version));
    for (size_t r = 0; r < n->n_resident && r < 1000; r++) {
        char hex[65];
        px_digest_hex(&n->resident[r], hex);
        json_array_append_new(res, json_string(hex));
    }
    for (size_t a = 0; a < n->n_allocs; a++) {
        px__job *j = px__srv_find_job(srv, n->allocs[a].owner);
        json_array_append_new(run,
                              json_pack("{s:s, s:i, s:i}", "job", n->allocs[a].owner, "attempt",
                                        j ? j->row.attempt : 0, "rank", n->allocs[a].rank));
    }
    double age = i < srv->cap_last_seen ? ((double)px_now_ns() - srv->last_seen_ns[i]) / 1e9 : -1;
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:b, s:s, s:f, s:f, s:f, s:f, s:o, s:o, s:o, s:o}", "id",
                  n->name, "name", n->name, "state", states[n->state], "emulated", n->emulated,
                  "address", n->address ? n->address : "", "cpus", n->cpus, "cpus_allocated",
                  n->cpus_used, "memory", n->memory, "memory_allocated", n->memory_used, "devices",
                  devs, "frameworks", fws, "resident", res, "running", run);
    json_object_set_new(
        o, "live",
        json_pack("{s:f, s:o}", "load", n->load, "memory_free",
                  n->mem_free_live >= 0 ? json_real(n->mem_free_live) : json_null()));
    json_object_set_new(o, "seconds_since_heartbeat", json_real(round(age * 10) / 10));
    return o;
}

/* ---- jobs ---- */

static bool idem_key_valid(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 128)
        return false;
    for (const char *c = k; *c; c++)
        if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 127)
            return false;
    return true;
}

static void submit(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    const char *key = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (key && !idem_key_valid(key)) {
        px__api_error(rs, 400, "Idempotency-Key: expected 1 to 128 printable characters");
        return;
    }
    if (px__srv_disk_headroom(srv) < 0) {
        px__api_error(rs, 507,
                      "the server's data folder is below its free-space reserve of %llu bytes; "
                      "no job is accepted until space is freed there (plexus server "
                      "--disk-reserve)",
                      (unsigned long long)srv->opt.disk_reserve);
        return;
    }
    json_t *spec = px__api_body_json(rq, rs);
    if (!spec)
        return;
    px__job_row row;
    bool replay;
    px_err err;
    if (px__srv_submit(srv, spec, rq->who.name, key, &row, &replay, &err) != PX_OK) {
        px__api_fail(rs, &err);
        json_decref(spec);
        return;
    }
    json_t *o =
        json_pack("{s:s, s:s, s:i}", "id", row.id, "state", row.state, "attempt", row.attempt);
    if (replay)
        json_object_set_new(o, "idempotent_replay", json_true());
    /* A gang larger than the fleet waits; say so rather than queue in silence. */
    long members = json_integer_value(json_object_get(spec, "nodes"));
    size_t known = px_fleet_sched_n_nodes(srv->sched);
    if (atomic_load(&srv->active) && members > 1 && (size_t)members > known) {
        char text[200];
        snprintf(text, sizeof text,
                 "the job needs %ld nodes for its members and the fleet has %zu; it stays queued "
                 "until enough nodes join (plexus explain %s)",
                 members, known, row.id);
        json_object_set_new(o, "warnings", json_pack("[s]", text));
    }
    px__api_json(rs, replay ? 200 : 201, o);
    px__job_row_release(&row);
    json_decref(spec);
}

typedef struct list_ctx {
    px_fleet_server *srv;
    json_t *arr;
    const px__who *viewer;
} list_ctx;

static void list_one(const px__job_row *row, void *ud)
{
    list_ctx *c = ud;
    px__job *live = px__srv_find_job(c->srv, row->id);
    json_array_append_new(
        c->arr, px__srv_job_json(c->srv, live ? &live->row : row, live, false, c->viewer));
}

static void list(px__api_req *rq, px__api_resp *rs)
{
    const char *state = px__api_query(rq, "state");
    const char *lim = px__api_query(rq, "limit");
    px__job_state ignored;
    if (state && strcmp(state, "active") != 0 && !px__job_state_parse(state, &ignored)) {
        px__api_error(rs, 400,
                      "state \"%.32s\": expected queued, assigned, running, succeeded, "
                      "failed, cancelled or active",
                      state);
        return;
    }
    long limit = 100;
    if (lim) {
        char *end;
        limit = strtol(lim, &end, 10);
        if (*end || limit < 1 || limit > 1000) {
            px__api_error(rs, 400, "limit \"%.32s\": expected 1..1000", lim);
            return;
        }
    }
    list_ctx c = {rq->srv, json_array(), &rq->who};
    px_err err;
    if (rq->srv->store.ops->list_jobs(rq->srv->store.self, state ? state : "",
                                      rq->who.admin ? NULL : rq->who.name, (int)limit, list_one, &c,
                                      &err) != PX_OK) {
        json_decref(c.arr);
        px__api_fail(rs, &err);
        return;
    }
    px__api_json(rs, 200, json_pack("{s:o}", "jobs", c.arr));
}

/* Loads a job's row (the live one when active, else from the store) when
 * the caller may see it; another user's job is "not found", so that its
 * existence says nothing either. */
static bool job_row(px__api_req *rq, px__api_resp *rs, const char *id, px__job_row *row,
                    px__job **live)
{
    *live = px__srv_find_job(rq->srv, id);
    memset(row, 0, sizeof *row);
    px_err err;
    if (!*live && rq->srv->store.ops->get_job(rq->srv->store.self, id, row, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return false;
    }
    if (!px__api_may_see(rq, *live ? &(*live)->row : row)) {
        px__job_row_release(row);
        *live = NULL;
        px__api_error(rs, 404, "no job \"%.64s\"", id);
        return false;
    }
    return true;
}

static void explain(px__api_req *rq, px__api_resp *rs, const char *id)
{
    px__job_row row;
    px__job *live;
    if (!job_row(rq, rs, id, &row, &live))
        return;
    if (live && live->explain) {
        px__api_json(rs, 200, json_incref(live->explain));
        return;
    }
    char *text;
    px_err err;
    px_status st = rq->srv->store.ops->get_explanation(rq->srv->store.self, id, &text, &err);
    if (st == PX_OK) {
        json_t *v = json_loads(text, 0, NULL);
        free(text);
        px__api_json(rs, v ? 200 : 500,
                     v ? v : json_pack("{s:s}", "error", "stored explanation unreadable"));
    } else if (st == PX_ENOTFOUND)
        px__api_json(rs, 200,
                     json_pack("{s:s, s:{s:b, s:[], s:s}}", "job", id, "decision", "placed", 0,
                               "nodes", "summary", "not yet considered"));
    else
        px__api_fail(rs, &err);
    px__job_row_release(&row);
}

/* Appends text as valid UTF-8 (base's rule: each ill-formed sequence
 * becomes U+FFFD), and each NUL byte as U+FFFD too. */
void px__api_add_utf8(px_strbuf *sb, const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const unsigned char *z = memchr(p + i, 0, n - i);
        size_t seg = z ? (size_t)(z - (p + i)) : n - i;
        px_utf8_add_sanitized(sb, (const char *)p + i, seg);
        i += seg;
        if (z) {
            px_strbuf_adds(sb, "\xEF\xBF\xBD");
            i++;
        }
    }
}

typedef struct logs_ctx {
    json_t *chunks;
    int64_t next;
    size_t bytes;
    bool more;
    size_t n;
} logs_ctx;

static void log_one(const px__log_chunk *c, void *ud)
{
    logs_ctx *x = ud;
    x->n++;
    if (x->more || (x->bytes > 0 && x->bytes + c->len > LOG_REPLY_MAX)) {
        x->more = true;
        return;
    }
    x->bytes += c->len;
    px_strbuf sb = PX_STRBUF_INIT;
    px__api_add_utf8(&sb, (const unsigned char *)c->data, c->len);
    json_array_append_new(x->chunks,
                          json_pack("{s:I, s:s, s:i, s:i, s:s%}", "seq", (json_int_t)c->seq,
                                    "stream", c->stream, "rank", c->rank, "attempt", c->attempt,
                                    "data", sb.buf, sb.len));
    px_strbuf_release(&sb);
    x->next = c->seq;
}

static bool parse_num(const char *text, double lo, double hi, double *out)
{
    if (!text)
        return true;
    char *end;
    double v = strtod(text, &end);
    if (*end || end == text || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* How often a replica that does not schedule reads a followed log again:
 * its writes come from the scheduling replica, which wakes nobody here. */
#define STANDBY_LOG_POLL_NS 250000000ull

/* Whether the job has not ended: the scheduler's memory says so; on a
 * replica that does not schedule, the stored row. */
static bool still_running(px_fleet_server *srv, const char *id)
{
    if (atomic_load(&srv->active))
        return px__srv_find_job(srv, id) != NULL;
    px__job_row row;
    px_err err;
    if (srv->store.ops->get_job(srv->store.self, id, &row, &err) != PX_OK)
        return false;
    px__job_state state;
    bool running = px__job_state_parse(row.state, &state) && state <= PX__JOB_RUNNING;
    px__job_row_release(&row);
    return running;
}

static uint64_t standby_deadline(px_fleet_server *srv, uint64_t deadline)
{
    /* Agents may send output to any replica: followers read it again. */
    if (atomic_load(&srv->active) && !px__store_serves_agents(&srv->store))
        return deadline;
    return PX_MIN(deadline, px_now_ns() + STANDBY_LOG_POLL_NS);
}

static void logs(px__api_req *rq, px__api_resp *rs, const char *id)
{
    double after = 0, wait = 0;
    const char *stream = px__api_query(rq, "stream");
    if (!parse_num(px__api_query(rq, "after"), 0, 9e15, &after) ||
        !parse_num(px__api_query(rq, "wait"), 0, MAX_WAIT_S, &wait)) {
        px__api_error(rs, 400, "logs: after must be a sequence number, wait 0..%d seconds",
                      MAX_WAIT_S);
        return;
    }
    if (stream && strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0) {
        px__api_error(rs, 400, "logs: stream must be stdout or stderr");
        return;
    }
    px__job_row row;
    px__job *live;
    if (!job_row(rq, rs, id, &row, &live))
        return;
    px__job_row_release(&row);
    uint64_t deadline = px_now_ns() + (uint64_t)(wait * 1e9);
    for (;;) {
        logs_ctx x = {json_array(), (int64_t)after, 0, false, 0};
        px_err err;
        if (rq->srv->store.ops->read_logs(rq->srv->store.self, id, (int64_t)after, stream, SIZE_MAX,
                                          log_one, &x, &err) != PX_OK) {
            json_decref(x.chunks);
            px__api_fail(rs, &err);
            return;
        }
        bool active = still_running(rq->srv, id);
        if (x.n > 0 || !active || !px__srv_wait(rq->srv, standby_deadline(rq->srv, deadline))) {
            bool done = !active && !x.more && x.n < 10000;
            px__api_json(rs, 200,
                         json_pack("{s:o, s:I, s:b}", "chunks", x.chunks, "next",
                                   (json_int_t)x.next, "done", done));
            return;
        }
        json_decref(x.chunks);
    }
}

typedef struct arts_ctx {
    json_t *arr;
} arts_ctx;

static void art_one(const px__artifact_row *a, void *ud)
{
    arts_ctx *c = ud;
    json_t *o = json_pack("{s:s, s:I, s:s, s:i, s:i}", "name", a->name, "size", (json_int_t)a->size,
                          "sha256", a->sha256, "rank", a->rank, "attempt", a->attempt);
    json_object_set_new(o, "created", time_json(a->created));
    json_array_append_new(c->arr, o);
}

static void artifacts(px__api_req *rq, px__api_resp *rs, const char *id, const char *name)
{
    px__job_row row;
    px__job *live;
    if (!job_row(rq, rs, id, &row, &live))
        return;
    px__job_row_release(&row);
    px_err err;
    if (!name) {
        arts_ctx c = {json_array()};
        if (rq->srv->store.ops->list_artifacts(rq->srv->store.self, id, art_one, &c, &err) !=
            PX_OK) {
            json_decref(c.arr);
            px__api_fail(rs, &err);
        } else
            px__api_json(rs, 200, json_pack("{s:o}", "artifacts", c.arr));
        return;
    }
    int fd;
    if (px__artifact_open(rq->srv->data_dir, id, name, false, &fd, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return;
    }
    size_t size;
    off_t end = lseek(fd, 0, SEEK_END);
    lseek(fd, 0, SEEK_SET);
    size = end > 0 ? (size_t)end : 0;
    rs->status = 200;
    rs->fd = fd;
    rs->len = size;
    rs->ctype = "application/octet-stream";
}

typedef struct art_find {
    const char *name;
    char sha256[65];
    int64_t size;
    bool found;
} art_find;

static void art_match(const px__artifact_row *a, void *ud)
{
    art_find *f = ud;
    if (!f->found && !strcmp(a->name, f->name) && strlen(a->sha256) == 64) {
        f->found = true;
        f->size = a->size;
        px_strlcpy(f->sha256, a->sha256, sizeof f->sha256);
    }
}

/* Copies an artifact's bytes out of the store into a file of this
 * replica's that is already unlinked (gone when the reply closes it). */
static px_status fetch_artifact(px_fleet_server *srv, const char *job, const char *name,
                                const char *hex, int *out_fd, int64_t *size, px_err *err)
{
    static atomic_uint seq;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/upload-artifact-%ld-%u", srv->tmp_dir, (long)getpid(),
             atomic_fetch_add(&seq, 1));
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return px_err_set(err, PX_EIO, "artifact %.64s of job %s: %s: %s", name, job, tmp,
                          strerror(errno));
    unlink(tmp);
    px_status st = srv->store.ops->get_artifact_data(srv->store.self, hex, fd, size, err);
    if (st == PX_OK && lseek(fd, 0, SEEK_SET) != 0)
        st = px_err_set(err, PX_EIO, "artifact %.64s of job %s: %s", name, job, strerror(errno));
    if (st != PX_OK) {
        close(fd);
        return st;
    }
    *out_fd = fd;
    return PX_OK;
}

int px__api_artifact_prepare(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    const char *rest = rq->url + strlen("/v1/jobs/");
    const char *slash = strchr(rest, '/');
    char id[64];
    size_t n = slash ? (size_t)(slash - rest) : 0;
    if (strcmp(rq->method, "GET") != 0 || !px__store_has_artifacts(&srv->store) || n == 0 ||
        n >= sizeof id || !px_str_starts_with(slash, "/artifacts/"))
        return 0;
    memcpy(id, rest, n);
    id[n] = '\0';
    art_find f = {.name = slash + strlen("/artifacts/")};
    px_err err;
    /* Who may see the job, and which bytes the name stands for, under the
     * lock (briefly); the bytes themselves are copied without it. */
    pthread_mutex_lock(&srv->lock);
    px__job_row row;
    px__job *live;
    bool seen = job_row(rq, rs, id, &row, &live);
    if (seen) {
        px__job_row_release(&row);
        if (srv->store.ops->list_artifacts(srv->store.self, id, art_match, &f, &err) != PX_OK)
            px__api_fail(rs, &err);
    }
    pthread_mutex_unlock(&srv->lock);
    if (rs->status)
        return rs->status;
    if (!f.found)
        return 0; /* the route says there is none */
    int64_t room = px__srv_disk_headroom(srv);
    if (room < 0 || f.size > room) {
        px__api_error(rs, 507,
                      "artifact %.64s of job %s: this server's data folder has too little free "
                      "space for its %lld bytes beyond its reserve; free space there (or lower "
                      "plexus server --disk-reserve), or download it through another server",
                      f.name, id, (long long)f.size);
        return 507;
    }
    int fd = -1;
    int64_t size = 0;
    px_status st = fetch_artifact(srv, id, f.name, f.sha256, &fd, &size, &err);
    /* An artifact stored before the store kept artifacts' bytes is read
     * from DATA/artifacts by the route. */
    if (st == PX_ENOTFOUND)
        return 0;
    if (st != PX_OK) {
        px__api_fail(rs, &err);
        return rs->status;
    }
    rs->status = 200;
    rs->fd = fd;
    rs->len = (size_t)size;
    rs->ctype = "application/octet-stream";
    return 200;
}

/* How long a replica that does not schedule waits for the scheduler to
 * carry out a cancellation it recorded before it answers 202. */
#define STANDBY_CANCEL_WAIT_NS 10000000000ull

/* A cancellation on a replica that does not schedule: recorded in the
 * store, which wakes the scheduler, then the row is read until the job
 * has ended: 200 cancelled, 409 when it ended otherwise first, 202 with
 * its state when the scheduler has not acted by the deadline. */
static void cancel_by_request(px__api_req *rq, px__api_resp *rs, const char *id)
{
    px_fleet_server *srv = rq->srv;
    uint64_t deadline = px_now_ns() + STANDBY_CANCEL_WAIT_NS;
    bool asked = false;
    for (;;) {
        px__job_row row;
        px_err err;
        if (srv->store.ops->get_job(srv->store.self, id, &row, &err) != PX_OK) {
            px__api_fail(rs, &err);
            return;
        }
        px__job_state state = PX__JOB_QUEUED;
        bool ended = !px__job_state_parse(row.state, &state) || state > PX__JOB_RUNNING;
        if (ended && asked && state == PX__JOB_CANCELLED)
            px__api_json(rs, 200, json_pack("{s:s, s:s}", "id", id, "state", "cancelled"));
        else if (ended)
            px__api_error(rs, 409, "job %s already ended (%s); nothing to cancel", id, row.state);
        else if (asked && px_now_ns() >= deadline)
            px__api_json(
                rs, 202,
                json_pack("{s:s, s:s, s:s}", "id", id, "state", row.state, "cancel", "requested"));
        px__job_row_release(&row);
        if (ended || rs->status)
            return;
        if (!asked && srv->store.ops->request_cancel(srv->store.self, id, &err) != PX_OK) {
            px__api_fail(rs, &err);
            return;
        }
        asked = true;
        if (!px__srv_wait(srv, standby_deadline(srv, deadline)) && srv->stopping) {
            px__api_error(rs, 503,
                          "the server is stopping; the cancellation of job %s was "
                          "recorded and is carried out by the scheduling replica",
                          id);
            return;
        }
    }
}

static void jobs_route(px__api_req *rq, px__api_resp *rs, const char *rest)
{
    /* rest: "<id>", "<id>/cancel", "<id>/explain", "<id>/logs", "<id>/artifacts[/<name>]" */
    char id[64];
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0 || n >= sizeof id) {
        px__api_error(rs, 404, "no job \"%.64s\"", rest);
        return;
    }
    memcpy(id, rest, n);
    id[n] = '\0';
    const char *sub = slash ? slash + 1 : "";
    bool get = strcmp(rq->method, "GET") == 0, post = strcmp(rq->method, "POST") == 0;
    if (!*sub && get) {
        px__job_row row;
        px__job *live;
        if (!job_row(rq, rs, id, &row, &live))
            return;
        px__api_json(rs, 200,
                     px__srv_job_json(rq->srv, live ? &live->row : &row, live, true, &rq->who));
        px__job_row_release(&row);
    } else if (strcmp(sub, "cancel") == 0 && post) {
        px__job_row row;
        px__job *live;
        if (!job_row(rq, rs, id, &row, &live))
            return;
        px__job_row_release(&row);
        px_err err;
        if (!atomic_load(&rq->srv->active))
            cancel_by_request(rq, rs, id);
        else if (px__srv_cancel(rq->srv, id, &err) != PX_OK)
            px__api_fail(rs, &err);
        else
            px__api_json(rs, 200, json_pack("{s:s, s:s}", "id", id, "state", "cancelled"));
    } else if (strcmp(sub, "explain") == 0 && get)
        explain(rq, rs, id);
    else if (strcmp(sub, "logs") == 0 && get)
        logs(rq, rs, id);
    else if (strcmp(sub, "artifacts") == 0 && get)
        artifacts(rq, rs, id, NULL);
    else if (px_str_starts_with(sub, "artifacts/") && get)
        artifacts(rq, rs, id, sub + strlen("artifacts/"));
    else
        px__api_error(rs, 405, "%s /v1/jobs/%s: method or path not supported", rq->method, rest);
}

/* ---- nodes and blobs ---- */

static void nodes_route(px__api_req *rq, px__api_resp *rs, const char *rest)
{
    px_fleet_server *srv = rq->srv;
    if (!*rest && strcmp(rq->method, "GET") == 0) {
        json_t *arr = json_array();
        for (size_t i = 0; i < px_fleet_sched_n_nodes(srv->sched); i++)
            json_array_append_new(arr, px__srv_node_json(srv, i));
        px__api_json(rs, 200, json_pack("{s:o}", "nodes", arr));
        return;
    }
    const char *slash = strchr(rest, '/');
    static const char *const actions[] = {"drain", "undrain", "revoke", "admit", "rotate"};
    size_t act = PX_ARRAY_LEN(actions);
    for (size_t k = 0; slash && k < PX_ARRAY_LEN(actions); k++)
        if (!strcmp(slash + 1, actions[k]))
            act = k;
    if (!slash || strcmp(rq->method, "POST") != 0 || act == PX_ARRAY_LEN(actions)) {
        px__api_error(rs, 404, "%s /v1/nodes/%.64s: no such endpoint", rq->method, rest);
        return;
    }
    if (!rq->who.admin) {
        px__api_error(rs, 403, "%s a node: only a user with the admin role may", actions[act]);
        return;
    }
    char name[80];
    size_t n = (size_t)(slash - rest);
    if (n >= sizeof name) {
        px__api_error(rs, 404, "no node \"%.64s\"", rest);
        return;
    }
    memcpy(name, rest, n);
    name[n] = '\0';
    px_err err;
    size_t i;
    bool known = px_fleet_sched_find_node(srv->sched, name, &i, NULL) == PX_OK;
    if (act == 3) { /* admit */
        if (!px__auth_is_revoked(srv, name)) {
            px__api_error(rs, 409, "node \"%s\" is not revoked; nothing to admit", name);
            return;
        }
        if (px__auth_admit(srv, name, &err) != PX_OK) {
            px__api_fail(rs, &err);
            return;
        }
        px__api_json(rs, 200, json_pack("{s:s, s:s}", "id", name, "state", "admitted"));
        return;
    }
    if (!known && !(act == 2 && px__auth_has_node(srv, name))) {
        px__api_error(rs, 404, "no node \"%s\"; see GET /v1/nodes", name);
        return;
    }
    if (act == 2) { /* revoke: credentials gone, work moved at once */
        if (px__auth_revoke(srv, name, &err) != PX_OK) {
            px__api_fail(rs, &err);
            return;
        }
        if (known) {
            px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_OFFLINE);
            if (srv->store.ops->put_node(srv->store.self, name, NULL, "offline", px_wall_time(),
                                         &err) != PX_OK)
                px_log_error("fleet: node %s: %s", name, err.msg);
            char reason[120];
            snprintf(reason, sizeof reason, "node %s was revoked", name);
            px__srv_evict_node(srv, i, reason, NULL); /* what fails is retried on the tick */
            pthread_cond_broadcast(&srv->changed);
        }
        px__api_json(rs, 200, json_pack("{s:s, s:s}", "id", name, "state", "revoked"));
        return;
    }
    if (act == 4) { /* rotate: the agent makes its next credential at its next heartbeat */
        json_object_set_new(srv->rotate, name, json_true());
        px__api_json(rs, 200, json_pack("{s:s, s:b}", "id", name, "rotate_credential", 1));
        return;
    }
    bool drain = act == 0;
    px_fleet_node_state st = px_fleet_sched_state(srv->sched, i);
    if (drain && st == PX_FLEET_NODE_ONLINE)
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_DRAINING);
    else if (!drain && st == PX_FLEET_NODE_DRAINING) {
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_ONLINE);
        srv->dirty = true;
        pthread_cond_signal(&srv->kick);
    }
    static const char *const names[] = {"online", "offline", "draining"};
    if (srv->store.ops->put_node(srv->store.self, name, NULL,
                                 names[px_fleet_sched_state(srv->sched, i)], px_wall_time(),
                                 &err) != PX_OK) {
        px_fleet_sched_set_state(srv->sched, i, st);
        px__api_fail(rs, &err);
        return;
    }
    px__api_json(rs, 200, px__srv_node_json(srv, i));
}

/* Whether a node may fetch the blob: the model of work assigned to it, or
 * of a deployment planned on it. */
static bool node_needs_blob(px_fleet_server *srv, const char *node, const char *digest)
{
    size_t i;
    if (px_fleet_sched_find_node(srv->sched, node, &i, NULL) != PX_OK)
        return false;
    if (px__srv_deploy_wants(srv, node, digest))
        return true;
    for (px__job *j = srv->jobs; j; j = j->next) {
        const char *d =
            json_string_value(json_object_get(json_object_get(j->req->spec, "model"), "digest"));
        if (!d || strcasecmp(d, digest) != 0)
            continue;
        for (int m = 0; m < j->n_members; m++)
            if (j->members[m].node == (int)i)
                return true;
    }
    return false;
}

int px__api_blob_prepare(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    const char *hex = rq->url + strlen("/v1/blobs/");
    if (rq->who.kind == PX__WHO_NODE) {
        pthread_mutex_lock(&srv->lock);
        bool allowed = node_needs_blob(srv, rq->who.name, hex);
        pthread_mutex_unlock(&srv->lock);
        if (!allowed)
            return 0; /* refused by the route, under the lock */
    }
    px_err err;
    if (px__blob_fetch(srv, hex, &err) != PX_OK && err.code != PX_ENOTFOUND &&
        err.code != PX_EINVAL) {
        if (err.code == PX_ELIMIT) /* the disk reserve, as for an upload */
            px__api_error(rs, 507, "%s", err.msg);
        else
            px__api_fail(rs, &err);
        return rs->status;
    }
    return 0; /* found, or the route says why not */
}

static void blobs_route(px__api_req *rq, px__api_resp *rs, const char *rest)
{
    char path[PATH_MAX];
    px_err err;
    if (*rest && strcmp(rq->method, "GET") == 0) {
        if (rq->who.kind == PX__WHO_NODE && !node_needs_blob(rq->srv, rq->who.name, rest)) {
            px__api_error(rs, 403,
                          "node %s has no work that reads blob %.64s; a node fetches only the "
                          "models of its own assignments",
                          rq->who.name, rest);
            return;
        }
        int fd;
        size_t size;
        if (px__blob_path(rq->srv->data_dir, rest, path, sizeof path, &err) != PX_OK ||
            px__open_read(path, &fd, &size, &err) != PX_OK) {
            if (err.code == PX_ENOTFOUND)
                px_err_set(&err, PX_ENOTFOUND, "no blob %.64s; upload it with POST /v1/blobs",
                           rest);
            px__api_fail(rs, &err);
            return;
        }
        rs->status = 200;
        rs->fd = fd;
        rs->len = size;
        rs->ctype = "application/octet-stream";
        return;
    }
    px__api_error(rs, 405, "%s /v1/blobs: use POST /v1/blobs or GET /v1/blobs/<digest>",
                  rq->method);
}

bool px__api_user_route(px__api_req *rq, px__api_resp *rs)
{
    const char *u = rq->url;
    if (strcmp(u, "/v1/jobs") == 0) {
        if (strcmp(rq->method, "POST") == 0)
            submit(rq, rs);
        else if (strcmp(rq->method, "GET") == 0)
            list(rq, rs);
        else
            px__api_error(rs, 405, "%s /v1/jobs: use GET or POST", rq->method);
        return true;
    }
    if (px_str_starts_with(u, "/v1/jobs/")) {
        jobs_route(rq, rs, u + strlen("/v1/jobs/"));
        return true;
    }
    if (strcmp(u, "/v1/nodes") == 0 || px_str_starts_with(u, "/v1/nodes/")) {
        nodes_route(rq, rs, u[strlen("/v1/nodes")] ? u + strlen("/v1/nodes/") : "");
        return true;
    }
    if (strcmp(u, "/v1/blobs") == 0 || px_str_starts_with(u, "/v1/blobs/")) {
        blobs_route(rq, rs, u[strlen("/v1/blobs")] ? u + strlen("/v1/blobs/") : "");
        return true;
    }
    return px__api_deploy_route(rq, rs);
}
