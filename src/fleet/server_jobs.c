/* Job state transitions on the server: submission, placement passes,
 * starts and finishes reported by agents (with attempt checks), requeues
 * when a node's lease runs out, service restarts with backoff, cancels.
 * Every function here runs with the server lock held. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#define MAX_BACKOFF_S 60.0

const char *px__job_state_name(px__job_state s)
{
    static const char *const names[] = {"queued",    "assigned", "running",
                                        "succeeded", "failed",   "cancelled"};
    return (unsigned)s < PX_ARRAY_LEN(names) ? names[s] : "unknown";
}

bool px__job_state_parse(const char *text, px__job_state *out)
{
    for (int i = 0; i <= PX__JOB_CANCELLED; i++)
        if (text && strcmp(text, px__job_state_name((px__job_state)i)) == 0) {
            *out = (px__job_state)i;
            return true;
        }
    return false;
}

px__job *px__srv_find_job(px_fleet_server *srv, const char *id)
{
    for (px__job *j = srv->jobs; j; j = j->next)
        if (strcmp(j->row.id, id) == 0)
            return j;
    return NULL;
}

static json_t *members_json(px_fleet_server *srv, const px__job *job)
{
    json_t *arr = json_array();
    for (int m = 0; arr && m < job->n_members; m++) {
        const px__member *x = &job->members[m];
        json_t *o = json_object();
        json_object_set_new(o, "rank", json_integer(m));
        json_object_set_new(o, "node",
                            x->node >= 0
                                ? json_string(px_fleet_sched_node_name(srv->sched, (size_t)x->node))
                                : json_null());
        json_object_set_new(o, "devices", x->devices ? json_incref(x->devices) : json_array());
        json_object_set_new(o, "state",
                            json_string(x->node < 0                   ? "waiting"
                                        : x->state == PX__MEM_PENDING ? "assigned"
                                        : x->state == PX__MEM_RUNNING ? "running"
                                                                      : "exited"));
        json_object_set_new(o, "exit_code",
                            x->state == PX__MEM_EXITED ? json_integer(x->exit_code) : json_null());
        json_object_set_new(o, "started", json_integer(x->started));
        json_object_set_new(o, "finished", json_integer(x->finished));
        json_array_append_new(arr, o);
    }
    return arr;
}

px_status px__srv_write_job(px_fleet_server *srv, px__job *job, const char *reason, px_err *err)
{
    json_t *m = members_json(srv, job);
    char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    char *state = px_strdup(px__job_state_name(job->state));
    if (!text || !state) {
        free(text);
        free(state);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    free(job->row.members);
    job->row.members = text;
    free(job->row.state);
    job->row.state = state;
    job->row.updated = px_wall_time();
    px_status st = srv->store.ops->update_job(srv->store.self, &job->row, reason, err);
    if (st != PX_OK)
        px_log_error("fleet: job %s: could not write state: %s", job->row.id, err ? err->msg : "");
    return st;
}

static void reset_members(px__job *job)
{
    for (int m = 0; m < job->n_members; m++) {
        json_decref(job->members[m].devices);
        job->members[m] = (px__member){.node = -1};
    }
}

static void job_free(px__job *job)
{
    if (!job)
        return;
    reset_members(job);
    free(job->members);
    px_fleet_request_free(job->req);
    json_decref(job->explain);
    px__job_row_release(&job->row);
    free(job);
}

/* Removes an ended job from the active list (its row stays in the store). */
static void retire(px_fleet_server *srv, px__job *job)
{
    px_fleet_sched_release(srv->sched, job->row.id);
    for (px__job **p = &srv->jobs; *p; p = &(*p)->next)
        if (*p == job) {
            *p = job->next;
            break;
        }
    job_free(job);
    srv->dirty = true;
    pthread_cond_broadcast(&srv->changed);
}

static px__job *job_new(px__job_row *row, px_fleet_request *req)
{
    px__job *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    job->row = *row;
    job->req = req;
    job->n_members = px_fleet_request_members(req);
    job->members = calloc((size_t)job->n_members, sizeof *job->members);
    if (!job->members) {
        free(job);
        return NULL;
    }
    for (int m = 0; m < job->n_members; m++)
        job->members[m].node = -1;
    job->master_port = 20000 + (int)(row->seq * 7 % 10000);
    return job;
}

static void append(px_fleet_server *srv, px__job *job)
{
    px__job **p = &srv->jobs;
    while (*p)
        p = &(*p)->next;
    *p = job;
}

px_status px__srv_submit(px_fleet_server *srv, json_t *spec, px__job **out, px_err *err)
{
    px_fleet_request *req;
    px_status st = px_fleet_request_compile(spec, &req, err);
    if (st != PX_OK)
        return st;
    px__job_row row = {0};
    const char *name = json_string_value(json_object_get(spec, "name"));
    row.name = name ? px_strdup(name) : NULL;
    row.state = px_strdup("queued");
    row.attempt = 1;
    row.spec = json_dumps(spec, JSON_COMPACT);
    row.members = px_strdup("[]");
    row.exit_code = INT_MIN;
    row.created = row.updated = px_wall_time();
    if (!row.state || !row.spec || !row.members || (name && !row.name)) {
        px__job_row_release(&row);
        px_fleet_request_free(req);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    /* Durable before the caller acknowledges: insert_job commits. */
    st = srv->store.ops->insert_job(srv->store.self, &row, err);
    if (st != PX_OK) {
        px__job_row_release(&row);
        px_fleet_request_free(req);
        return st;
    }
    px__job *job = job_new(&row, req);
    if (!job) {
        px__job_row_release(&row);
        px_fleet_request_free(req);
        return px_err_set(err, PX_ENOMEM,
                          "out of memory (the job was stored and will be "
                          "scheduled after a restart)");
    }
    if (!job->row.name)
        job->row.name = px_strdup(job->row.id);
    append(srv, job);
    srv->metrics.submitted++;
    srv->dirty = true;
    pthread_cond_signal(&srv->kick);
    *out = job;
    return PX_OK;
}

static json_t *stamp_explanation(px__job *job, json_t *body)
{
    char at[32];
    px_time_format(px_wall_time(), at);
    json_object_set_new(body, "job", json_string(job->row.id));
    json_object_set_new(body, "attempt", json_integer(job->row.attempt));
    json_object_set_new(body, "at", json_string(at));
    if (job->req->plan_auto) {
        json_t *plan = job->row.plan ? json_loads(job->row.plan, 0, NULL) : NULL;
        json_object_set_new(body, "plan",
                            plan ? plan : json_pack("{s:s}", "status", "planner not yet asked"));
    }
    return body;
}

static void keep_explanation(px_fleet_server *srv, px__job *job, px_fleet_explanation *e,
                             bool persist)
{
    json_t *body = px_fleet_explanation_to_json(e, srv->sched);
    if (!body)
        return;
    stamp_explanation(job, body);
    json_decref(job->explain);
    job->explain = body;
    if (persist) {
        char *text = json_dumps(body, JSON_COMPACT);
        px_err err;
        if (text && srv->store.ops->put_explanation(srv->store.self, job->row.id, job->row.attempt,
                                                    text, &err) != PX_OK)
            px_log_warn("fleet: job %s: explanation not stored: %s", job->row.id, err.msg);
        free(text);
    }
}

static void place(px_fleet_server *srv, px__job *job)
{
    px_fleet_explanation *e;
    px_err err;
    if (job->req->plan_auto && !job->row.plan) {
        /* Asked once per job; the answer (a plan or why there is none) is
         * kept with the job and shown by explain. */
        json_t *plan = px__srv_plan(srv, job);
        job->row.plan = plan ? json_dumps(plan, JSON_COMPACT) : NULL;
        json_decref(plan);
    }
    if (px_fleet_sched_place(srv->sched, job->req, job->row.id, &e, &err) != PX_OK) {
        px_log_error("fleet: job %s: %s", job->row.id, err.msg);
        return;
    }
    srv->metrics.decisions++;
    bool placed = px_fleet_explanation_placed(e);
    keep_explanation(srv, job, e, placed || !job->explained_this_attempt);
    job->explained_this_attempt = true;
    if (placed) {
        srv->metrics.placements++;
        for (int m = 0; m < job->n_members; m++) {
            job->members[m].node = (int)px_fleet_explanation_node(e, (size_t)m);
            job->members[m].devices = px_fleet_explanation_devices(e, srv->sched, (size_t)m);
            job->members[m].state = PX__MEM_PENDING;
        }
        job->state = PX__JOB_ASSIGNED;
        job->not_before_ns = 0;
        job->row.not_before = 0;
        px__srv_write_job(srv, job, NULL, NULL);
        pthread_cond_broadcast(&srv->changed);
    }
    px_fleet_explanation_free(e);
}

void px__srv_schedule_pass(px_fleet_server *srv)
{
    uint64_t t0 = px_now_ns();
    srv->dirty = false;
    double now = (double)t0;
    for (px__job *j = srv->jobs; j; j = j->next) {
        if (j->state != PX__JOB_QUEUED)
            continue;
        if (j->not_before_ns > now) {
            continue;
        }
        place(srv, j);
    }
    px__metrics_observe(srv->metrics.pass_hist, &srv->metrics.pass_sum, &srv->metrics.pass_count,
                        (double)(px_now_ns() - t0) / 1e9);
}

/* Puts a job back in the queue with the next attempt number. */
static void requeue(px_fleet_server *srv, px__job *job, double delay_s, const char *reason)
{
    px_fleet_sched_release(srv->sched, job->row.id);
    reset_members(job);
    job->row.attempt++;
    job->state = PX__JOB_QUEUED;
    job->explained_this_attempt = false;
    job->not_before_ns = delay_s > 0 ? (double)px_now_ns() + delay_s * 1e9 : 0;
    job->row.not_before = delay_s > 0 ? (double)px_wall_time() + delay_s : 0;
    srv->metrics.requeues++;
    px__srv_write_job(srv, job, reason, NULL);
    srv->dirty = true;
    pthread_cond_broadcast(&srv->changed);
    pthread_cond_signal(&srv->kick);
}

static void finish_job(px_fleet_server *srv, px__job *job, px__job_state state, int exit_code,
                       const char *error)
{
    job->state = state;
    job->row.exit_code = exit_code;
    if (error && !job->row.error)
        job->row.error = px_strdup(error);
    px__srv_write_job(srv, job, NULL, NULL);
    retire(srv, job);
}

void px__srv_check_leases(px_fleet_server *srv)
{
    double now = (double)px_now_ns();
    double lease = srv->opt.lease_s * 1e9;
    size_t n = px_fleet_sched_n_nodes(srv->sched);
    for (size_t i = 0; i < n && i < srv->cap_last_seen; i++) {
        if (px_fleet_sched_state(srv->sched, i) == PX_FLEET_NODE_OFFLINE ||
            now - srv->last_seen_ns[i] <= lease)
            continue;
        const char *name = px_fleet_sched_node_name(srv->sched, i);
        px_log_warn("fleet: node %s lost (no heartbeat for %.1f s)", name,
                    (now - srv->last_seen_ns[i]) / 1e9);
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_OFFLINE);
        srv->store.ops->put_node(srv->store.self, name, NULL, "offline", px_wall_time(), NULL);
        for (px__job *j = srv->jobs, *next; j; j = next) {
            next = j->next;
            bool on_node = false;
            for (int m = 0; m < j->n_members; m++)
                on_node = on_node || j->members[m].node == (int)i;
            if (!on_node || (j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING))
                continue;
            char reason[160];
            snprintf(reason, sizeof reason, "node %s lost (no heartbeat within %.1f s)", name,
                     srv->opt.lease_s);
            if (j->req->service || j->row.attempt < j->req->max_attempts)
                requeue(srv, j, 0, reason);
            else
                finish_job(srv, j, PX__JOB_FAILED, -1, reason);
        }
    }
}

static bool listed(const json_t *running, const char *id, int attempt, int rank)
{
    for (size_t k = 0; json_is_array(running) && k < json_array_size(running); k++) {
        const json_t *r = json_array_get(running, k);
        const char *j = json_string_value(json_object_get(r, "job"));
        if (j && strcmp(j, id) == 0 &&
            json_integer_value(json_object_get(r, "attempt")) == attempt &&
            json_integer_value(json_object_get(r, "rank")) == rank)
            return true;
    }
    return false;
}

void px__srv_reconcile_node(px_fleet_server *srv, size_t node, const json_t *running)
{
    /* An agent that registers again (it restarted) without a member it had
     * started has lost that work: requeue it now rather than wait for a
     * report that will never come. */
    for (px__job *j = srv->jobs, *next; j; j = next) {
        next = j->next;
        if (j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING)
            continue;
        int lost = -1;
        for (int m = 0; m < j->n_members && lost < 0; m++)
            if (j->members[m].node == (int)node && j->members[m].state == PX__MEM_RUNNING &&
                !listed(running, j->row.id, j->row.attempt, m))
                lost = m;
        if (lost < 0)
            continue;
        char reason[200];
        snprintf(reason, sizeof reason,
                 "the agent on %s registered again without rank %d (it restarted)",
                 px_fleet_sched_node_name(srv->sched, node), lost);
        if (j->req->service || j->row.attempt < j->req->max_attempts)
            requeue(srv, j, 0, reason);
        else
            finish_job(srv, j, PX__JOB_FAILED, -1, reason);
    }
}

px_status px__srv_cancel(px_fleet_server *srv, const char *id, px_err *err)
{
    px__job *job = px__srv_find_job(srv, id);
    if (!job) {
        px__job_row row;
        if (srv->store.ops->get_job(srv->store.self, id, &row, err) != PX_OK)
            return err ? err->code : PX_ENOTFOUND;
        px_status st = px_err_set(err, PX_ESTATE, "job %s already ended (%s); nothing to cancel",
                                  id, row.state);
        px__job_row_release(&row);
        return st;
    }
    finish_job(srv, job, PX__JOB_CANCELLED, INT_MIN, "cancelled by the user");
    return PX_OK;
}

static px_status check_report(px__job *job, int attempt, int rank, int node, px_err *err)
{
    if (attempt != job->row.attempt)
        return px_err_set(err, PX_ESTATE,
                          "stale attempt: job %s is at attempt %d, the report is for attempt %d; "
                          "stop this work",
                          job->row.id, job->row.attempt, attempt);
    if (rank < 0 || rank >= job->n_members)
        return px_err_set(err, PX_EINVAL, "job %s has no rank %d (it has %d members)", job->row.id,
                          rank, job->n_members);
    if (job->members[rank].node != node)
        return px_err_set(err, PX_ESTATE,
                          "stale attempt: rank %d of job %s is not assigned to this node; stop "
                          "this work",
                          rank, job->row.id);
    return PX_OK;
}

px_status px__srv_member_start(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                               px_err *err)
{
    px_status st = check_report(job, attempt, rank, node, err);
    if (st != PX_OK)
        return st;
    px__member *m = &job->members[rank];
    if (m->state != PX__MEM_PENDING)
        return PX_OK; /* a repeated report */
    m->state = PX__MEM_RUNNING;
    m->started = px_wall_time();
    bool all = true;
    for (int k = 0; k < job->n_members; k++)
        all = all && job->members[k].state != PX__MEM_PENDING;
    if (all && job->state == PX__JOB_ASSIGNED)
        job->state = PX__JOB_RUNNING;
    px__srv_write_job(srv, job, NULL, NULL);
    pthread_cond_broadcast(&srv->changed);
    return PX_OK;
}

px_status px__srv_member_finish(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                                int exit_code, int sig, const json_t *result, const char *error,
                                px_err *err)
{
    px_status st = check_report(job, attempt, rank, node, err);
    if (st != PX_OK)
        return st;
    px__member *m = &job->members[rank];
    if (m->state == PX__MEM_EXITED)
        return PX_OK;
    m->state = PX__MEM_EXITED;
    m->exit_code = exit_code;
    m->finished = px_wall_time();
    if (result && !json_is_null(result) && rank == 0) {
        free(job->row.result);
        job->row.result = json_dumps(result, JSON_COMPACT | JSON_ENCODE_ANY);
    }
    if (error && *error) {
        free(job->row.error);
        job->row.error = px_strndup(error, strnlen(error, 64 * 1024));
    }
    bool ok = exit_code == 0 && sig == 0 && !(error && *error);
    char reason[200];
    if (job->req->service) {
        job->row.restarts++;
        double backoff = srv->opt.restart_backoff_s * pow(2.0, PX_MIN(job->row.restarts - 1, 16));
        snprintf(reason, sizeof reason, "service exited (code %d, signal %d); restart %d in %.1f s",
                 exit_code, sig, job->row.restarts, PX_MIN(backoff, MAX_BACKOFF_S));
        requeue(srv, job, PX_MIN(backoff, MAX_BACKOFF_S), reason);
        return PX_OK;
    }
    if (!ok) {
        const json_t *omf = json_object_get(job->req->spec, "on_member_failure");
        bool restart = job->n_members > 1 && json_is_string(omf) &&
                       strcmp(json_string_value(omf), "restart") == 0 &&
                       job->row.attempt < job->req->max_attempts;
        if (restart) {
            snprintf(reason, sizeof reason, "member %d failed (code %d, signal %d); group restarts",
                     rank, exit_code, sig);
            requeue(srv, job, 0, reason);
        } else
            finish_job(srv, job, PX__JOB_FAILED, sig ? 128 + sig : exit_code, NULL);
        return PX_OK;
    }
    for (int k = 0; k < job->n_members; k++)
        if (job->members[k].state != PX__MEM_EXITED) {
            px__srv_write_job(srv, job, NULL, NULL);
            return PX_OK;
        }
    finish_job(srv, job, PX__JOB_SUCCEEDED, 0, NULL);
    return PX_OK;
}

/* ---- restart: rebuild the active jobs from the store ---- */

typedef struct load_ctx {
    px__job_row *rows;
    size_t n, cap;
} load_ctx;

static void collect_row(const px__job_row *row, void *ud)
{
    load_ctx *c = ud;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        px__job_row *r = realloc(c->rows, cap * sizeof *r);
        if (!r)
            return;
        c->rows = r;
        c->cap = cap;
    }
    /* Take ownership of the strings: the store releases its copy after. */
    px__job_row *d = &c->rows[c->n++];
    *d = *row;
    d->id = px_strdup(row->id);
    d->name = row->name ? px_strdup(row->name) : NULL;
    d->state = px_strdup(row->state);
    d->spec = px_strdup(row->spec);
    d->members = row->members ? px_strdup(row->members) : NULL;
    d->result = row->result ? px_strdup(row->result) : NULL;
    d->error = row->error ? px_strdup(row->error) : NULL;
    d->plan = row->plan ? px_strdup(row->plan) : NULL;
}

static void restore_members(px_fleet_server *srv, px__job *job)
{
    json_t *m = job->row.members ? json_loads(job->row.members, 0, NULL) : NULL;
    bool ok = json_is_array(m) && (int)json_array_size(m) == job->n_members &&
              job->state != PX__JOB_QUEUED;
    for (int k = 0; ok && k < job->n_members; k++) {
        const json_t *x = json_array_get(m, (size_t)k);
        size_t node;
        const char *name = json_string_value(json_object_get(x, "node"));
        const char *state = json_string_value(json_object_get(x, "state"));
        if (!name || px_fleet_sched_find_node(srv->sched, name, &node) != PX_OK ||
            px_fleet_sched_restore(srv->sched, job->req, job->row.id, node,
                                   json_object_get(x, "devices"), NULL) != PX_OK) {
            ok = false;
            break;
        }
        px__member *mm = &job->members[k];
        mm->node = (int)node;
        mm->devices = json_incref(json_object_get(x, "devices"));
        mm->state = state && strcmp(state, "running") == 0  ? PX__MEM_RUNNING
                    : state && strcmp(state, "exited") == 0 ? PX__MEM_EXITED
                                                            : PX__MEM_PENDING;
        const json_t *ec = json_object_get(x, "exit_code");
        mm->exit_code = json_is_integer(ec) ? (int)json_integer_value(ec) : 0;
        mm->started = json_integer_value(json_object_get(x, "started"));
        mm->finished = json_integer_value(json_object_get(x, "finished"));
    }
    json_decref(m);
    if (!ok && job->state != PX__JOB_QUEUED) {
        px_fleet_sched_release(srv->sched, job->row.id);
        reset_members(job);
        job->state = PX__JOB_QUEUED;
    }
}

px_status px__srv_load(px_fleet_server *srv, px_err *err)
{
    load_ctx c = {0};
    px_status st =
        srv->store.ops->list_jobs(srv->store.self, "active", 10000000, collect_row, &c, err);
    /* Oldest first, as they were queued. */
    size_t k = c.n;
    while (st == PX_OK && k-- > 0) {
        px__job_row *row = &c.rows[k];
        json_t *spec = json_loads(row->spec, 0, NULL);
        px_fleet_request *req = NULL;
        px_err cerr;
        if (!spec || px_fleet_request_compile(spec, &req, &cerr) != PX_OK) {
            px_log_error("fleet: job %s: stored specification unreadable; marking failed", row->id);
            free(row->state);
            row->state = px_strdup("failed");
            srv->store.ops->update_job(srv->store.self, row, NULL, NULL);
            json_decref(spec);
            px__job_row_release(row);
            continue;
        }
        json_decref(spec);
        px__job *job = job_new(row, req);
        if (!job) {
            px_fleet_request_free(req);
            px__job_row_release(row);
            st = px_err_set(err, PX_ENOMEM, "out of memory");
            break;
        }
        if (!px__job_state_parse(row->state, &job->state))
            job->state = PX__JOB_QUEUED;
        if (row->not_before > 0) {
            double wait = row->not_before - (double)px_wall_time();
            job->not_before_ns = wait > 0 ? (double)px_now_ns() + wait * 1e9 : 0;
        }
        restore_members(srv, job);
        append(srv, job);
    }
    /* Rows not yet handed to a job when a failure stopped the loop. */
    for (size_t r = 0; st != PX_OK && r < k; r++)
        px__job_row_release(&c.rows[r]);
    free(c.rows);
    srv->dirty = true;
    return st;
}

void px__srv_free_jobs(px_fleet_server *srv)
{
    while (srv->jobs) {
        px__job *j = srv->jobs;
        srv->jobs = j->next;
        job_free(j);
    }
}
