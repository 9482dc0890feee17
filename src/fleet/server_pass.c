/* The scheduling pass: plans asked for first (with the server lock
 * released), then a decision for every due queued job, written together
 * at the pass's end.  On a store whose writes a lease epoch fences
 * (PostgreSQL) the pass commits with the server lock released, its
 * assignments held out of sight meanwhile (commit_unlocked); else in one
 * batch under the lock (flush_deferred).  Server lock held on entry and
 * on return. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

/* A placement whose write failed is tried again after this long. */
#define STORE_RETRY_S 1.0

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

/* A decision of a pass on a store that writes many at once (slots
 * update_jobs and put_explanations), written at the end of the pass. */
typedef struct px__deferred {
    px__job *job;
    char *explanation; /* JSON text to store, or NULL (owned) */
    bool assigned;     /* placed: the row's members and state to write (owned) */
    char *members;
    char *state;
    char *assignments; /* px__job_row.assignments, or NULL (owned) */
    double not_before; /* the row's, before the decision */
    px__member *held;  /* the placed members while their commit is in flight (owned) */
} px__deferred;

static px__deferred *defer_new(px_fleet_server *srv, px__job *job)
{
    if (srv->n_deferred == srv->cap_deferred) {
        size_t cap = srv->cap_deferred ? srv->cap_deferred * 2 : 256;
        px__deferred *d = realloc(srv->deferred, cap * sizeof *d);
        if (!d)
            return NULL;
        srv->deferred = d;
        srv->cap_deferred = cap;
    }
    px__deferred *d = &srv->deferred[srv->n_deferred++];
    *d = (px__deferred){.job = job};
    return d;
}

/* The explanation is kept with the job; with persist, stored: at once, or
 * (d not NULL) with the pass's other writes. */
static void keep_explanation(px_fleet_server *srv, px__job *job, px_fleet_explanation *e,
                             bool persist, px__deferred *d)
{
    json_t *body = px_fleet_explanation_to_json(e, srv->sched);
    if (!body)
        return;
    stamp_explanation(job, body);
    json_decref(job->explain);
    job->explain = body;
    if (persist && d) {
        d->explanation = json_dumps(body, JSON_COMPACT);
        if (!d->explanation)
            px_log_warn("fleet: job %s: explanation not stored: out of memory", job->row.id);
    } else if (persist) {
        char *text = json_dumps(body, JSON_COMPACT);
        px_err err;
        if (text && srv->store.ops->put_explanation(srv->store.self, job->row.id, job->row.attempt,
                                                    text, &err) != PX_OK)
            px_log_warn("fleet: job %s: explanation not stored: %s", job->row.id, err.msg);
        free(text);
    }
}

/* Takes a placement back that could not be written: the job is queued
 * again and retried shortly. */
static void unplace(px_fleet_server *srv, px__job *job, double not_before)
{
    px_fleet_sched_release(srv->sched, job->row.id);
    px__srv_reset_members(job);
    job->state = PX__JOB_QUEUED;
    job->row.not_before = not_before;
    job->not_before_ns = (double)px_now_ns() + STORE_RETRY_S * 1e9;
    job->store_failed = true;
}

/* The assignment is written: the end of the job's wait in the queue. */
static void assigned(px_fleet_server *srv, px__job *job)
{
    job->assigned_ns = px_now_ns();
    if (job->queued_ns && job->assigned_ns >= job->queued_ns)
        px__metrics_observe(srv->metrics.queue_hist, &srv->metrics.queue_sum,
                            &srv->metrics.queue_count,
                            (double)(job->assigned_ns - job->queued_ns) / 1e9);
}

/* A committed assignment: the job takes the pass's members and state. */
static void publish(px_fleet_server *srv, px__deferred *d, int64_t now)
{
    px__job *job = d->job;
    if (job->store_failed)
        px_log_info("fleet: job %s: its state is written again", job->row.id);
    free(job->row.members);
    free(job->row.state);
    job->row.members = d->members;
    job->row.state = d->state;
    job->row.updated = now;
    d->members = d->state = NULL;
    srv->metrics.placements++;
    assigned(srv, job);
    job->not_before_ns = 0;
    job->store_failed = false;
}

static void place(px_fleet_server *srv, px__job *job)
{
    px_fleet_explanation *e;
    px_err err;
    if (job->req->plan_auto && !job->row.plan) {
        /* Planned before a pass, with the lock released (plan_queued); a
         * job that came in while others were planned waits for the next
         * pass, which follows at once. */
        srv->dirty = true;
        return;
    }
    if (px_fleet_sched_place(srv->sched, job->req, job->row.id, &e, &err) != PX_OK) {
        px_log_error("fleet: job %s: %s", job->row.id, err.msg);
        return;
    }
    srv->metrics.decisions++;
    bool placed = px_fleet_explanation_placed(e);
    px__deferred *d = srv->defer ? defer_new(srv, job) : NULL;
    keep_explanation(srv, job, e, placed || !job->explained_this_attempt, d);
    job->explained_this_attempt = true;
    if (placed) {
        for (int m = 0; m < job->n_members; m++) {
            job->members[m].node = (int)px_fleet_explanation_node(e, (size_t)m);
            job->members[m].devices = px_fleet_explanation_devices(e, srv->sched, (size_t)m);
            job->members[m].state = PX__MEM_PENDING;
        }
        job->state = PX__JOB_ASSIGNED;
        double nb = job->row.not_before;
        job->row.not_before = 0;
        if (d) {
            /* Written at the end of the pass (flush_deferred). */
            json_t *m = px__srv_members_json(srv, job);
            d->members = m ? json_dumps(m, JSON_COMPACT) : NULL;
            json_decref(m);
            d->state = px_strdup(px__job_state_name(job->state));
            d->assignments = px__srv_assignments_text(srv, job);
            d->not_before = nb;
            d->assigned = true;
            px_fleet_explanation_free(e);
            return;
        }
        if (px__srv_write_job(srv, job, NULL, &err) != PX_OK) {
            /* Not on disk: take the placement back and try again shortly. */
            unplace(srv, job, nb);
        } else {
            srv->metrics.placements++;
            assigned(srv, job);
            job->not_before_ns = 0;
            job->store_failed = false;
            pthread_cond_broadcast(&srv->changed);
        }
    }
    px_fleet_explanation_free(e);
}

/* Writes the pass's explanations, then its assignments, each set in one
 * call; assignments that could not be written are taken back. */
static void flush_deferred(px_fleet_server *srv)
{
    size_t n = srv->n_deferred;
    px__explanation_row *ex = calloc(n ? n : 1, sizeof *ex);
    px__job_row *rows = calloc(n ? n : 1, sizeof *rows);
    int n_ex = 0, n_rows = 0;
    int64_t now = px_wall_time();
    for (size_t i = 0; i < n; i++) {
        px__deferred *d = &srv->deferred[i];
        if (d->explanation && ex)
            ex[n_ex++] = (px__explanation_row){d->job->row.id, d->job->row.attempt, d->explanation};
        if (d->assigned && d->members && d->state && rows) {
            rows[n_rows] = d->job->row;
            rows[n_rows].members = d->members;
            rows[n_rows].state = d->state;
            rows[n_rows].assignments = d->assignments;
            rows[n_rows].updated = now;
            n_rows++;
        }
    }
    px_err err;
    if (n_ex && srv->store.ops->put_explanations(srv->store.self, ex, n_ex, &err) != PX_OK)
        px_log_warn("fleet: the explanations of %d decisions not stored: %s", n_ex, err.msg);
    px_status st = !rows    ? px_err_set(&err, PX_ENOMEM, "out of memory")
                   : n_rows ? srv->store.ops->update_jobs(srv->store.self, rows, n_rows, &err)
                            : PX_OK;
    bool logged = false;
    for (size_t i = 0; i < n; i++) {
        px__deferred *d = &srv->deferred[i];
        px__job *job = d->job;
        if (!d->assigned)
            ;
        else if (st == PX_OK && d->members && d->state) {
            publish(srv, d, now);
        } else {
            if (!logged && !job->store_failed)
                px_log_error("fleet: %d assignments could not be written (%s), so their jobs "
                             "stay queued and are retried",
                             n_rows, st == PX_OK ? "out of memory" : err.msg);
            logged = true;
            unplace(srv, job, d->not_before);
        }
        free(d->explanation);
        free(d->members);
        free(d->state);
        free(d->assignments);
    }
    srv->n_deferred = 0;
    free(ex);
    free(rows);
    if (n_rows)
        pthread_cond_broadcast(&srv->changed);
}

void (*px__srv_commit_hook)(px_fleet_server *srv);

/* Holds a placed job out of sight while its assignment is committed: its
 * members are kept in d->held and the job is shown queued with none
 * placed (the scheduler keeps its reservation).  False (nothing changed)
 * when the members cannot be held. */
static bool hold(px__deferred *d)
{
    px__job *job = d->job;
    d->held = malloc((size_t)job->n_members * sizeof *d->held);
    if (!d->held)
        return false;
    memcpy(d->held, job->members, (size_t)job->n_members * sizeof *d->held);
    for (int m = 0; m < job->n_members; m++)
        job->members[m] = (px__member){.node = -1};
    job->state = PX__JOB_QUEUED;
    job->committing = true;
    return true;
}

/* Gives the held job its members back, assigned as decided. */
static void unhold(px__deferred *d)
{
    px__job *job = d->job;
    memcpy(job->members, d->held, (size_t)job->n_members * sizeof *d->held);
    free(d->held);
    d->held = NULL;
    job->state = PX__JOB_ASSIGNED;
    job->committing = false;
}

/* The pass's commit with the server lock released (a store whose writes
 * a lease epoch fences): its assignments, held out of sight (hold), are
 * written in one transaction fenced by the epoch this replica took with
 * the lease; the lock is taken again and the assignments published, then
 * let go once more while the pass's explanations are written on the
 * lease's own connection (which the lease's session fences), never before
 * the assignments they explain are in.  A commit that failed is undone in
 * memory (the jobs queued again), and the replica stops scheduling:
 * another holder may have taken the lease (PX_ESTATE), or the commit's
 * outcome is unknown (a connection lost at its COMMIT), and either way
 * the next holder reads the truth from the database.  Server lock held on
 * entry and on return (released meanwhile). */
static void commit_unlocked(px_fleet_server *srv, int64_t epoch)
{
    size_t n = srv->n_deferred;
    if (n == 0)
        return;
    px__explanation_row *ex = calloc(n, sizeof *ex);
    px__job_row *rows = calloc(n, sizeof *rows);
    bool *ex_placed = calloc(n, sizeof *ex_placed);
    int n_ex = 0, n_rows = 0;
    int64_t now = px_wall_time();
    bool logged = false;
    for (size_t i = 0; i < n; i++) {
        px__deferred *d = &srv->deferred[i];
        px__job *job = d->job;
        if (d->assigned && !(d->members && d->state && rows && hold(d))) {
            if (!logged)
                px_log_error("fleet: job %s: its assignment could not be written (out of memory), "
                             "so it stays queued and is retried",
                             job->row.id);
            logged = true;
            d->assigned = false;
            unplace(srv, job, d->not_before);
        }
        /* The ids are copied: a job that is not held may end while the
         * lock is released. */
        if (d->explanation && ex && ex_placed && (ex[n_ex].job = px_strdup(job->row.id)) != NULL) {
            ex[n_ex].attempt = job->row.attempt;
            ex[n_ex].json = d->explanation;
            ex_placed[n_ex++] = d->assigned;
        }
        if (d->assigned) {
            /* Nobody changes a held job's row: every transition waits for
             * the commit (px__srv_find_job_settled). */
            rows[n_rows] = job->row;
            rows[n_rows].members = d->members;
            rows[n_rows].state = d->state;
            rows[n_rows].assignments = d->assignments;
            rows[n_rows].updated = now;
            n_rows++;
        }
    }
    if (n_rows == 0 && n_ex == 0) {
        srv->n_deferred = 0;
        for (size_t i = 0; i < n; i++) {
            free(srv->deferred[i].explanation);
            free(srv->deferred[i].members);
            free(srv->deferred[i].state);
            free(srv->deferred[i].assignments);
        }
        free(ex);
        free(ex_placed);
        free(rows);
        return;
    }
    px_err err = {0};
    px_status st = PX_OK;
    if (n_rows) {
        pthread_mutex_unlock(&srv->lock);
        if (px__srv_commit_hook)
            px__srv_commit_hook(srv);
        st = srv->store.ops->fenced_update_jobs(srv->store.self, epoch, rows, n_rows, &err);
        pthread_mutex_lock(&srv->lock);
    }
    for (size_t i = 0; i < n; i++) {
        px__deferred *d = &srv->deferred[i];
        px__job *job = d->job;
        if (d->assigned) {
            unhold(d);
            if (st == PX_OK) {
                publish(srv, d, now);
            } else {
                unplace(srv, job, d->not_before);
            }
            /* A cancel waits for this commit: applied before anyone else
             * holds the lock, so no agent is sent the job.  A write the
             * store refuses is left to the waiting cancel, which tries
             * again and answers with the error. */
            bool cancel = job->cancel_on_commit && st == PX_OK;
            job->cancel_on_commit = false;
            px_err cerr;
            if (cancel && px__srv_finish(srv, job, PX__JOB_CANCELLED, INT_MIN,
                                         "cancelled by the user", &cerr) != PX_OK)
                px_log_warn("fleet: job %s: cancel not yet written: %s", job->row.id, cerr.msg);
        }
        free(d->members);
        free(d->state);
        free(d->assignments);
    }
    srv->n_deferred = 0;
    free(rows);
    if (st != PX_OK) {
        char why[600];
        px_textf(why, sizeof why, "%s (the pass's %d assignments were taken back)", err.msg,
                 n_rows);
        px__srv_fence(srv, why);
    }
    /* Published or undone: transitions waiting for the commit go on. */
    pthread_cond_broadcast(&srv->changed);
    /* Explanations of placements only once these are committed (after
     * they are published, so that their write does not delay them);
     * those of jobs left queued whatever became of the commit, unless
     * another replica holds the lease now.  The lock is let go again for
     * the write; nothing below touches a job. */
    int k = 0;
    for (int i = 0; i < n_ex; i++)
        if (st == PX_OK || (!ex_placed[i] && st != PX_ESTATE))
            ex[k++] = ex[i];
        else
            free((char *)ex[i].job);
    if (k) {
        pthread_mutex_unlock(&srv->lock);
        px_err xerr;
        if (srv->store.ops->put_explanations(srv->store.self, ex, k, &xerr) != PX_OK)
            px_log_warn("fleet: the explanations of %d decisions not stored: %s", k, xerr.msg);
        pthread_mutex_lock(&srv->lock);
    }
    for (int i = 0; i < k; i++)
        free((char *)ex[i].job);
    for (size_t i = 0; i < n; i++)
        free(srv->deferred[i].explanation);
    free(ex);
    free(ex_placed);
}

/* How long the plans before one pass may take, in all. */
#define PLAN_BUDGET_NS 1000000000ull

/* The planner's record kept when even "out of memory" cannot be kept. */
static const char PLAN_NO_MEMORY[] =
    "{\"status\":\"planner unavailable\",\"detail\":\"out of memory\"}";

/* Asks the planner for the queued `plan: "auto"` jobs that are due and
 * have no plan yet, before the pass decides anything: each asked once per
 * job, with the server lock released meanwhile (px__srv_plan), so that
 * the API, agents' reports and heartbeats go on while a model is fetched
 * and planned.  The answer (a plan or why there is none) is kept with the
 * job and shown by explain; a job that ended meanwhile is found gone by
 * its id.  Server lock held on entry and on return. */
static void plan_queued(px_fleet_server *srv, double now)
{
    size_t n = 0;
    for (px__job *j = srv->jobs; j; j = j->next)
        n += j->state == PX__JOB_QUEUED && j->req->plan_auto && !j->row.plan &&
             j->not_before_ns <= now;
    if (n == 0)
        return;
    char **ids = calloc(n, sizeof *ids);
    if (!ids)
        return;
    size_t k = 0;
    for (px__job *j = srv->jobs; j && k < n; j = j->next)
        if (j->state == PX__JOB_QUEUED && j->req->plan_auto && !j->row.plan &&
            j->not_before_ns <= now && (ids[k] = px_strdup(j->row.id)))
            k++;
    uint64_t t0 = px_now_ns();
    for (size_t i = 0; i < k; i++) {
        /* Past the budget the pass places what it can, and the next pass
         * plans the rest: jobs that need no plan do not wait for them all. */
        bool over = px_now_ns() - t0 > PLAN_BUDGET_NS;
        px__job *job = srv->stopping || over ? NULL : px__srv_find_job(srv, ids[i]);
        if (job && job->state == PX__JOB_QUEUED && !job->row.plan) {
            json_t *plan = px__srv_plan(srv, job);
            char *text = plan ? json_dumps(plan, JSON_COMPACT) : NULL;
            json_decref(plan);
            job = px__srv_find_job(srv, ids[i]);
            if (job && job->state == PX__JOB_QUEUED && !job->row.plan)
                job->row.plan = text ? text : px_strdup(PLAN_NO_MEMORY);
            else
                free(text);
        }
        free(ids[i]);
    }
    free(ids);
}

void px__srv_schedule_pass(px_fleet_server *srv)
{
    uint64_t t0 = px_now_ns();
    srv->dirty = false;
    double now = (double)t0;
    plan_queued(srv, now);
    /* The lock was let go while plans were made: this replica may have
     * stopped, or stopped scheduling, meanwhile. */
    if (srv->stopping || !atomic_load(&srv->active)) {
        srv->dirty = true;
        return;
    }
    /* The pass's assignments commit together (one flush of the store's
     * log, not one per decision); a store without batches commits each on
     * its own. */
    px_err err;
    /* Where the lease's epoch fences writes on a connection of their own,
     * the pass commits with the lock released (commit_unlocked); else in
     * a batch under the lock. */
    const px__store_ops *ops = srv->store.ops;
    int64_t epoch = 0;
    bool fenced = ops->version >= 12 && ops->lease_epoch && ops->fenced_update_jobs &&
                  ops->update_jobs && ops->put_explanations &&
                  ops->lease_epoch(srv->store.self, &epoch, &err) == PX_OK && epoch > 0;
    bool batch = !fenced && ops->batch_begin && ops->batch_begin(srv->store.self, &err) == PX_OK;
    /* With a store that writes many at once, the pass's decisions are
     * written together at its end, and nobody sees one before it is
     * written: under the lock throughout, or held out of sight while the
     * commit runs without it. */
    srv->defer =
        fenced || (batch && ops->version >= 6 && ops->update_jobs && ops->put_explanations);
    for (px__job *j = srv->jobs; j; j = j->next) {
        if (j->state != PX__JOB_QUEUED)
            continue;
        if (j->not_before_ns > now) {
            continue;
        }
        place(srv, j);
    }
    if (fenced)
        commit_unlocked(srv, epoch);
    else if (srv->defer)
        flush_deferred(srv);
    srv->defer = false;
    if (batch && srv->store.ops->batch_end(srv->store.self, &err) != PX_OK)
        px__srv_fence(srv, err.msg);
    px__metrics_observe(srv->metrics.pass_hist, &srv->metrics.pass_sum, &srv->metrics.pass_count,
                        (double)(px_now_ns() - t0) / 1e9);
}
