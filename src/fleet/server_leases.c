/* The scheduler's tick over nodes and running work: leases that ran out,
 * the work of lost or revoked nodes requeued (again on every tick while
 * the store refuses the write), jobs past their time limit failed, agents
 * that registered again without work they had, and the active jobs
 * rebuilt from the store after a restart.  Server lock held throughout. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "fleet/ui_impl.h"

/* A job past its limit by this much more than a lease is failed by the
 * server even if its agent never stopped it. */
#define TIME_LIMIT_GRACE_S 5.0

static bool member_on(const px__job *j, size_t node)
{
    for (int m = 0; m < j->n_members; m++)
        if (j->members[m].node == (int)node)
            return true;
    return false;
}

static px_status move_or_fail(px_fleet_server *srv, px__job *j, const char *reason, px_err *err)
{
    if (j->req->service || j->row.attempt < j->req->max_attempts)
        return px__srv_requeue(srv, j, 0, reason, err);
    return px__srv_finish(srv, j, PX__JOB_FAILED, -1, reason, err);
}

px_status px__srv_evict_node(px_fleet_server *srv, size_t node, const char *reason, px_err *err)
{
    px_status first = PX_OK;
    for (px__job *j = srv->jobs, *next; j; j = next) {
        next = j->next;
        if ((j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING) || !member_on(j, node))
            continue;
        px_err e;
        if (move_or_fail(srv, j, reason, &e) != PX_OK && first == PX_OK) {
            first = e.code;
            if (err)
                *err = e;
        }
    }
    return first;
}

static void time_limits(px_fleet_server *srv)
{
    int64_t now = px_wall_time();
    for (px__job *j = srv->jobs, *next; j; j = next) {
        next = j->next;
        if (j->state != PX__JOB_RUNNING || !(j->time_limit_s > 0))
            continue;
        bool over = false;
        for (int m = 0; m < j->n_members && !over; m++)
            over = j->members[m].state == PX__MEM_RUNNING && j->members[m].started > 0 &&
                   (double)(now - j->members[m].started) >
                       j->time_limit_s + srv->opt.lease_s + TIME_LIMIT_GRACE_S;
        if (!over)
            continue;
        char reason[160];
        snprintf(reason, sizeof reason, "time limit of %g s exceeded (stopped by the server)",
                 j->time_limit_s);
        px_err err;
        if (px__srv_finish(srv, j, PX__JOB_FAILED, -1, reason, &err) != PX_OK)
            continue; /* the store refused: again on the next tick */
        px_log_warn("fleet: job %s: %s", j->row.id, reason);
    }
}

void px__srv_check_leases(px_fleet_server *srv)
{
    double now = (double)px_now_ns();
    double lease = srv->opt.lease_s * 1e9;
    size_t n = px_fleet_sched_n_nodes(srv->sched);
    for (size_t i = 0; i < n && i < srv->cap_last_seen; i++) {
        const char *name = px_fleet_sched_node_name(srv->sched, i);
        if (px_fleet_sched_state(srv->sched, i) != PX_FLEET_NODE_OFFLINE &&
            now - srv->last_seen_ns[i] > lease) {
            px_log_warn("fleet: node %s lost (no heartbeat for %.1f s)", name,
                        (now - srv->last_seen_ns[i]) / 1e9);
            px__incident_node_lost(srv, i, (now - srv->last_seen_ns[i]) / 1e9);
            px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_OFFLINE);
            px_err err;
            if (srv->store.ops->put_node(srv->store.self, name, NULL, "offline", px_wall_time(),
                                         &err) != PX_OK)
                px_log_error("fleet: node %s: %s", name, err.msg);
        }
        /* Work on a node that is offline goes elsewhere; a requeue the
         * store refused is tried again here on the next tick. */
        if (px_fleet_sched_state(srv->sched, i) == PX_FLEET_NODE_OFFLINE) {
            char reason[200];
            if (px__auth_is_revoked(srv, name))
                snprintf(reason, sizeof reason, "node %s was revoked", name);
            else
                snprintf(reason, sizeof reason, "node %s lost (no heartbeat within %.1f s)", name,
                         srv->opt.lease_s);
            px__srv_evict_node(srv, i, reason, NULL);
        }
    }
    time_limits(srv);
    px__incidents_tick(srv);
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

px_status px__srv_reconcile_node(px_fleet_server *srv, size_t node, const json_t *running,
                                 int64_t seq, px_err *err)
{
    /* An agent that registers again (it restarted, or it stopped its work
     * when it could not renew its lease) without a member it had started
     * has lost that work: requeue it now rather than wait for a report
     * that will never come.  A live agent's heartbeat says the same of a
     * member it no longer lists: the agent lists its work until the
     * server has acknowledged its end, so a member missing from a list
     * taken after the member was listed has ended unreported. */
    for (px__job *j = srv->jobs, *next; j; j = next) {
        next = j->next;
        if (j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING)
            continue;
        int lost = -1;
        for (int m = 0; m < j->n_members && lost < 0; m++) {
            const px__member *x = &j->members[m];
            if (x->node == (int)node && x->state == PX__MEM_RUNNING &&
                (seq < 0 || (x->listed > 0 && x->listed <= seq)) &&
                !listed(running, j->row.id, j->row.attempt, m))
                lost = m;
        }
        if (lost < 0)
            continue;
        char reason[200];
        if (seq < 0)
            snprintf(reason, sizeof reason,
                     "the agent on %s registered again without rank %d (it restarted or stopped "
                     "its work)",
                     px_fleet_sched_node_name(srv->sched, node), lost);
        else
            snprintf(reason, sizeof reason,
                     "the agent on %s no longer lists rank %d (its work ended without a report)",
                     px_fleet_sched_node_name(srv->sched, node), lost);
        px_status st = move_or_fail(srv, j, reason, err);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

/* ---- restart: rebuild the active jobs from the store ---- */

typedef struct load_ctx {
    px__job_row *rows;
    size_t n, cap;
    bool oom; /* a row could not be kept: the load fails rather than lose it */
} load_ctx;

static void collect_row(const px__job_row *row, void *ud)
{
    load_ctx *c = ud;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        px__job_row *r = realloc(c->rows, cap * sizeof *r);
        if (!r) {
            c->oom = true;
            return;
        }
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
    d->owner = row->owner ? px_strdup(row->owner) : NULL;
    d->idem_key = row->idem_key ? px_strdup(row->idem_key) : NULL;
    d->idem_hash = row->idem_hash ? px_strdup(row->idem_hash) : NULL;
    if (!d->id || !d->state || !d->spec || (row->name && !d->name) ||
        (row->members && !d->members) || (row->result && !d->result) || (row->error && !d->error) ||
        (row->plan && !d->plan) || (row->owner && !d->owner) || (row->idem_key && !d->idem_key) ||
        (row->idem_hash && !d->idem_hash))
        c->oom = true;
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
        if (!name || px_fleet_sched_find_node(srv->sched, name, &node, NULL) != PX_OK ||
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
        px__srv_reset_members(job);
        job->state = PX__JOB_QUEUED;
    }
}

px_status px__srv_load(px_fleet_server *srv, px_err *err)
{
    load_ctx c = {0};
    px_status st =
        srv->store.ops->list_jobs(srv->store.self, "active", NULL, 10000000, collect_row, &c, err);
    if (st == PX_OK && c.oom)
        st = px_err_set(err, PX_ENOMEM,
                        "out of memory while reading the active jobs from the store; nothing "
                        "was changed: start the server again with more memory");
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
            px_err werr;
            if (srv->store.ops->update_job(srv->store.self, row, NULL, &werr) != PX_OK)
                px_log_error("fleet: job %s: %s", row->id, werr.msg);
            json_decref(spec);
            px__job_row_release(row);
            continue;
        }
        json_decref(spec);
        px__job *job = px__srv_job_new(srv, row, req);
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
        if (srv->store.ops->job_usage(srv->store.self, job->row.id, &job->log_bytes,
                                      &job->artifact_bytes, err) != PX_OK) {
            st = err->code;
            px__srv_free_job(job); /* with the row it took */
            break;
        }
        job->log_truncated = job->log_bytes >= (int64_t)srv->opt.log_quota;
        px__srv_append_job(srv, job);
    }
    /* Rows not yet handed to a job when a failure stopped the loop. */
    for (size_t r = 0; st != PX_OK && r < k; r++)
        px__job_row_release(&c.rows[r]);
    free(c.rows);
    srv->dirty = true;
    return st;
}
