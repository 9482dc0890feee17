/* Job state transitions on the server: submission (with idempotency
 * keys), starts and finishes reported by agents (with attempt checks),
 * requeues, service restarts with backoff, cancels (the placement passes
 * are in server_pass.c).  Every function here runs with the server lock
 * held.
 *
 * Each transition writes its new state to the store first and changes the
 * job in memory only once the write succeeded: a write that fails (a full
 * disk) leaves the job as it was and the caller answers 503, so an agent
 * retries its report, a client its request, and the scheduler's tick its
 * own work, until the store takes writes again. */
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

px__job *px__srv_find_job_settled(px_fleet_server *srv, const char *id)
{
    px__job *j;
    bool counted = false;
    /* The pass publishes or undoes its assignments, then broadcasts
     * `changed`; the job may have ended meanwhile, hence the lookup by id
     * after each wait. */
    while ((j = px__srv_find_job(srv, id)) && j->committing) {
        if (!counted)
            srv->metrics.commit_waits++;
        counted = true;
        pthread_cond_wait(&srv->changed, &srv->lock);
    }
    return j;
}

json_t *px__srv_members_json(px_fleet_server *srv, const px__job *job)
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

/* Every member waiting for a node: how a requeued job is written. */
static json_t *waiting_members(const px__job *job)
{
    json_t *arr = json_array();
    for (int m = 0; arr && m < job->n_members; m++)
        json_array_append_new(arr, json_pack("{s:i, s:n, s:[], s:s, s:n, s:i, s:i}", "rank", m,
                                             "node", "devices", "state", "waiting", "exit_code",
                                             "started", 0, "finished", 0));
    return arr;
}

/* What each member waiting to start is to run (null for the others), as
 * JSON text, where the store serves agents through every replica (a
 * replica that does not schedule answers their polls with it); else
 * NULL. */
char *px__srv_assignments_text(px_fleet_server *srv, px__job *job)
{
    if (!px__store_serves_agents(&srv->store) ||
        (job->state != PX__JOB_ASSIGNED && job->state != PX__JOB_RUNNING))
        return NULL;
    json_t *arr = json_array();
    bool any = false;
    for (int m = 0; arr && m < job->n_members; m++) {
        bool waiting = job->members[m].node >= 0 && job->members[m].state == PX__MEM_PENDING;
        any = any || waiting;
        json_array_append_new(arr, waiting ? px__srv_assignment_json(srv, job, m) : json_null());
    }
    char *text = any && arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return text;
}

/* Writes the job's row as it stands (its members as they are, or all
 * waiting); only on success are the row's members, state and update time
 * replaced in memory. */
static px_status write_job(px_fleet_server *srv, px__job *job, const char *reason, bool waiting,
                           px_err *err)
{
    json_t *m = waiting ? waiting_members(job) : px__srv_members_json(srv, job);
    char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    char *state = px_strdup(px__job_state_name(job->state));
    if (!text || !state) {
        free(text);
        free(state);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px__job_row row = job->row;
    row.members = text;
    row.state = state;
    row.updated = px_wall_time();
    row.assignments = waiting ? NULL : px__srv_assignments_text(srv, job);
    px_status st = srv->store.ops->update_job(srv->store.self, &row, reason, err);
    free(row.assignments);
    if (st != PX_OK) {
        free(text);
        free(state);
        /* Said once: the tick retries while the store refuses. */
        if (!job->store_failed)
            px_log_error("fleet: job %s: could not write its state (%s), so it is unchanged and "
                         "retried: %s",
                         job->row.id, px__job_state_name(job->state), err->msg);
        return st;
    }
    if (job->store_failed)
        px_log_info("fleet: job %s: its state is written again", job->row.id);
    free(job->row.members);
    free(job->row.state);
    job->row.members = text;
    job->row.state = state;
    job->row.updated = row.updated;
    return PX_OK;
}

px_status px__srv_write_job(px_fleet_server *srv, px__job *job, const char *reason, px_err *err)
{
    return write_job(srv, job, reason, false, err);
}

void px__srv_reset_members(px__job *job)
{
    for (int m = 0; m < job->n_members; m++) {
        json_decref(job->members[m].devices);
        job->members[m] = (px__member){.node = -1};
    }
}

void px__srv_free_job(px__job *job)
{
    if (!job)
        return;
    px__srv_reset_members(job);
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
    px__srv_free_job(job);
    srv->dirty = true;
    pthread_cond_broadcast(&srv->changed);
}

/* The limit one attempt gets: the job's own, capped by the server's. */
static double effective_limit(const px_fleet_server *srv, const px_fleet_request *req)
{
    double own = req->time_limit_s, cap = srv->opt.max_job_time_s;
    if (own > 0 && cap > 0)
        return PX_MIN(own, cap);
    return own > 0 ? own : cap;
}

px__job *px__srv_job_new(px_fleet_server *srv, px__job_row *row, px_fleet_request *req)
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
    job->time_limit_s = effective_limit(srv, req);
    job->queued_ns = px_now_ns();
    return job;
}

void px__srv_append_job(px_fleet_server *srv, px__job *job)
{
    px__job **p = &srv->jobs;
    while (*p)
        p = &(*p)->next;
    *p = job;
}

/* SHA-256 of the spec's canonical text: what a retried submission must
 * match to be the same job. */
static px_status spec_hash(const json_t *spec, char hex[65], px_err *err)
{
    char *text = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_digest d;
    px_sha256(text, strlen(text), &d);
    free(text);
    px_digest_hex(&d, hex);
    return PX_OK;
}

px_status px__srv_submit(px_fleet_server *srv, json_t *spec, const char *owner,
                         const char *idem_key, px__job_row *out_row, bool *replay, px_err *err)
{
    *replay = false;
    memset(out_row, 0, sizeof *out_row);
    px_fleet_request *req;
    px_status st = px_fleet_request_compile(spec, &req, err);
    if (st != PX_OK)
        return st;
    if (srv->opt.max_job_time_s > 0 && req->time_limit_s > srv->opt.max_job_time_s) {
        px_fleet_request_free(req);
        return px_err_set(err, PX_EINVAL,
                          "job spec: /time_limit_s: %g s is over this server's limit of %g s "
                          "(plexus server --max-job-time)",
                          req->time_limit_s, srv->opt.max_job_time_s);
    }
    char hash[65];
    if ((st = spec_hash(spec, hash, err)) != PX_OK) {
        px_fleet_request_free(req);
        return st;
    }
    if (idem_key) {
        px__job_row prev;
        st = srv->store.ops->find_idempotent(srv->store.self, owner, idem_key, &prev, err);
        if (st == PX_OK) {
            px_fleet_request_free(req);
            if (!prev.idem_hash || strcmp(prev.idem_hash, hash) != 0) {
                st = px_err_set(err, PX_ESTATE,
                                "Idempotency-Key \"%.64s\" was used for another job spec (%s); "
                                "send a new key with a new job",
                                idem_key, prev.id);
                px__job_row_release(&prev);
                return st;
            }
            /* The live row, when active, has the current state. */
            px__job *live = px__srv_find_job(srv, prev.id);
            if (live) {
                px__job_row_release(&prev);
                if ((st = px__job_row_copy(&live->row, out_row, err)) != PX_OK)
                    return st;
                free(out_row->state);
                out_row->state = px_strdup(px__job_state_name(live->state));
            } else
                *out_row = prev;
            *replay = true;
            return PX_OK;
        }
        if (st != PX_ENOTFOUND) {
            px_fleet_request_free(req);
            return st;
        }
    }
    px__job_row row = {0};
    const char *name = json_string_value(json_object_get(spec, "name"));
    row.name = name ? px_strdup(name) : NULL;
    row.state = px_strdup("queued");
    row.attempt = 1;
    row.spec = json_dumps(spec, JSON_COMPACT);
    row.members = px_strdup("[]");
    row.exit_code = INT_MIN;
    row.created = row.updated = px_wall_time();
    row.owner = owner ? px_strdup(owner) : NULL;
    row.idem_key = idem_key ? px_strdup(idem_key) : NULL;
    row.idem_hash = idem_key ? px_strdup(hash) : NULL;
    if (!row.state || !row.spec || !row.members || (name && !row.name) || (owner && !row.owner) ||
        (idem_key && (!row.idem_key || !row.idem_hash))) {
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
    srv->metrics.submitted++;
    if (!atomic_load(&srv->active)) {
        /* A replica that does not schedule: the row waits, unadopted, for
         * the one that does, which the insert's notification wakes. */
        px_fleet_request_free(req);
        *out_row = row;
        return PX_OK;
    }
    px__job *job = px__srv_job_new(srv, &row, req);
    if (!job) {
        px__job_row_release(&row);
        px_fleet_request_free(req);
        return px_err_set(err, PX_ENOMEM,
                          "out of memory (the job was stored and will be "
                          "scheduled after a restart)");
    }
    if (!job->row.name)
        job->row.name = px_strdup(job->row.id);
    px__srv_append_job(srv, job);
    srv->dirty = true;
    pthread_cond_signal(&srv->kick);
    return px__job_row_copy(&job->row, out_row, err);
}

px_status px__srv_requeue(px_fleet_server *srv, px__job *job, double delay_s, const char *reason,
                          px_err *err)
{
    int attempt = job->row.attempt;
    px__job_state state = job->state;
    double nb = job->row.not_before;
    job->row.attempt++;
    job->state = PX__JOB_QUEUED;
    job->row.not_before = delay_s > 0 ? (double)px_wall_time() + delay_s : 0;
    px_status st = write_job(srv, job, reason, true, err);
    if (st != PX_OK) {
        job->row.attempt = attempt;
        job->state = state;
        job->row.not_before = nb;
        job->store_failed = true;
        return st;
    }
    job->store_failed = false;
    px_fleet_sched_release(srv->sched, job->row.id);
    px__srv_reset_members(job);
    job->explained_this_attempt = false;
    job->not_before_ns = delay_s > 0 ? (double)px_now_ns() + delay_s * 1e9 : 0;
    job->queued_ns = delay_s > 0 ? 0 : px_now_ns(); /* a delayed restart is not a wait */
    job->assigned_ns = 0;
    srv->metrics.requeues++;
    srv->dirty = true;
    pthread_cond_broadcast(&srv->changed);
    pthread_cond_signal(&srv->kick);
    return PX_OK;
}

px_status px__srv_finish(px_fleet_server *srv, px__job *job, px__job_state state, int exit_code,
                         const char *error, px_err *err)
{
    px__job_state old_state = job->state;
    int old_code = job->row.exit_code;
    char *old_error = job->row.error;
    job->state = state;
    job->row.exit_code = exit_code;
    if (error && !old_error)
        job->row.error = px_strdup(error);
    px_status st = write_job(srv, job, NULL, false, err);
    if (st != PX_OK) {
        if (job->row.error != old_error)
            free(job->row.error);
        job->row.error = old_error;
        job->state = old_state;
        job->row.exit_code = old_code;
        job->store_failed = true;
        return st;
    }
    retire(srv, job);
    return PX_OK;
}

px_status px__srv_cancel(px_fleet_server *srv, const char *id, px_err *err)
{
    /* A job whose assignment is being committed is cancelled by the pass
     * the moment the commit lands, before any agent can be sent it (or,
     * when the commit was undone, here): the cancel is neither lost under
     * the commit's write nor followed by a start. */
    px__job *job = px__srv_find_job(srv, id);
    bool waited = job && job->committing;
    if (waited) {
        job->cancel_on_commit = true;
        job = px__srv_find_job_settled(srv, id);
    }
    if (!job) {
        px__job_row row;
        if (srv->store.ops->get_job(srv->store.self, id, &row, err) != PX_OK)
            return err->code;
        px_status st =
            waited && strcmp(row.state, "cancelled") == 0
                ? PX_OK
                : px_err_set(err, PX_ESTATE, "job %s already ended (%s); nothing to cancel", id,
                             row.state);
        px__job_row_release(&row);
        return st;
    }
    return px__srv_finish(srv, job, PX__JOB_CANCELLED, INT_MIN, "cancelled by the user", err);
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
        return px_err_set(err, PX_EAUTH,
                          "rank %d of job %s attempt %d is not assigned to this node; a node "
                          "reports only its own work",
                          rank, job->row.id, attempt);
    return PX_OK;
}

px_status px__srv_check_member(px__job *job, int attempt, int rank, int node, px_err *err)
{
    return check_report(job, attempt, rank, node, err);
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
    px__job_state old_state = job->state;
    m->state = PX__MEM_RUNNING;
    m->started = px_wall_time();
    bool all = true;
    for (int k = 0; k < job->n_members; k++)
        all = all && job->members[k].state != PX__MEM_PENDING;
    if (all && job->state == PX__JOB_ASSIGNED)
        job->state = PX__JOB_RUNNING;
    if ((st = write_job(srv, job, NULL, false, err)) != PX_OK) {
        m->state = PX__MEM_PENDING;
        m->started = 0;
        job->state = old_state;
        return st;
    }
    if (job->state == PX__JOB_RUNNING && old_state == PX__JOB_ASSIGNED && job->assigned_ns) {
        uint64_t now = px_now_ns();
        px__metrics_observe(srv->metrics.dispatch_hist, &srv->metrics.dispatch_sum,
                            &srv->metrics.dispatch_count, (double)(now - job->assigned_ns) / 1e9);
    }
    pthread_cond_broadcast(&srv->changed);
    return PX_OK;
}

/* What a member's exit does to its job, once the member is marked. */
static px_status member_outcome(px_fleet_server *srv, px__job *job, int rank, int exit_code,
                                int sig, bool ok, px_err *err)
{
    char reason[200];
    if (job->req->service) {
        job->row.restarts++;
        double backoff = srv->opt.restart_backoff_s * pow(2.0, PX_MIN(job->row.restarts - 1, 16));
        snprintf(reason, sizeof reason, "service exited (code %d, signal %d); restart %d in %.1f s",
                 exit_code, sig, job->row.restarts, PX_MIN(backoff, MAX_BACKOFF_S));
        px_status st = px__srv_requeue(srv, job, PX_MIN(backoff, MAX_BACKOFF_S), reason, err);
        if (st != PX_OK)
            job->row.restarts--;
        return st;
    }
    if (!ok) {
        const json_t *omf = json_object_get(job->req->spec, "on_member_failure");
        bool restart = job->n_members > 1 && json_is_string(omf) &&
                       strcmp(json_string_value(omf), "restart") == 0 &&
                       job->row.attempt < job->req->max_attempts;
        if (restart) {
            snprintf(reason, sizeof reason, "member %d failed (code %d, signal %d); group restarts",
                     rank, exit_code, sig);
            return px__srv_requeue(srv, job, 0, reason, err);
        }
        return px__srv_finish(srv, job, PX__JOB_FAILED, sig ? 128 + sig : exit_code, NULL, err);
    }
    for (int k = 0; k < job->n_members; k++)
        if (job->members[k].state != PX__MEM_EXITED)
            return write_job(srv, job, NULL, false, err);
    return px__srv_finish(srv, job, PX__JOB_SUCCEEDED, 0, NULL, err);
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
    px__member saved = *m;
    char *old_result = job->row.result, *old_error = job->row.error;
    bool new_result = result && !json_is_null(result) && rank == 0;
    bool new_error = error && *error;
    m->state = PX__MEM_EXITED;
    m->exit_code = exit_code;
    m->finished = px_wall_time();
    if (new_result)
        job->row.result = json_dumps(result, JSON_COMPACT | JSON_ENCODE_ANY);
    if (new_error)
        job->row.error = px_strndup(error, strnlen(error, 64 * 1024));
    bool ok = exit_code == 0 && sig == 0 && !new_error;
    st = member_outcome(srv, job, rank, exit_code, sig, ok, err);
    if (st != PX_OK) {
        /* Nothing changed on disk: neither may it in memory. */
        if (new_result)
            free(job->row.result);
        if (new_error)
            free(job->row.error);
        job->row.result = old_result;
        job->row.error = old_error;
        *m = saved;
        return st;
    }
    /* The job may be gone (retired): only the texts it replaced are
     * touched now. */
    if (new_result)
        free(old_result);
    if (new_error)
        free(old_error);
    return PX_OK;
}

void px__srv_free_jobs(px_fleet_server *srv)
{
    while (srv->jobs) {
        px__job *j = srv->jobs;
        srv->jobs = j->next;
        px__srv_free_job(j);
    }
}
