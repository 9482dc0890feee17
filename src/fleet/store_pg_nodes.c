/* The PostgreSQL store's slots for agents on every replica (version 11):
 * node credentials looked up by a replica that does not schedule, each
 * node's last call to such a replica (numbered from one sequence, so that
 * the scheduler reads only what changed), what each waiting member is to
 * run, which work a node must stop, members' reports queued for the
 * scheduler, and the scheduling replica's URL.
 *
 * Change numbers come from a sequence, and a sequence number is taken
 * before its row commits: a reader that saw change 12 committed may later
 * see 11 commit.  So every write of a change number holds a shared
 * transaction advisory lock, and the scheduler's read takes it exclusively
 * first: when the read runs, every number already taken is committed, and
 * a following number, written after the read, is higher than any it saw.
 * A write waits at most for one read (one indexed query). */
#include "fleet/store_pg_impl.h"

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

/* Writers of change numbers hold it shared, the reader exclusively:
 * (classid, objid) = ("plex", 3). */
#define CHANGES_KEY "1886152056, 3"

static px_status node_of_credential(void *self, const char *hex, char *name, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, hex);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "SELECT c.node FROM node_credentials c WHERE c.hash = $1 AND NOT EXISTS"
                       " (SELECT 1 FROM revoked_nodes v WHERE v.node = c.node)",
                       &q, &r, "look up a node credential", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_OK && PQntuples(r) == 0)
        rc = px_err_set(err, PX_ENOTFOUND, "unknown node credential");
    else if (rc == PX_OK)
        snprintf(name, 65, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

/* A registration: the node's row (online unless an admin drains it), its
 * registration, and the scheduler woken. */
#define NOTE_REGISTER                                                                            \
    "WITH l AS (SELECT pg_advisory_xact_lock_shared(" CHANGES_KEY ")),"                          \
    " c AS (SELECT nextval('node_changes') AS v FROM l),"                                        \
    " n AS (INSERT INTO nodes(name, registration, state, last_seen, changed, registered,"        \
    "  call_kind, call_body) SELECT $1, $2, 'online', $3, c.v, c.v, 'register', $4 FROM c"       \
    "  ON CONFLICT(name) DO UPDATE SET registration = EXCLUDED.registration,"                    \
    "  state = CASE WHEN nodes.state = 'draining' THEN 'draining' ELSE 'online' END,"            \
    "  last_seen = EXCLUDED.last_seen, changed = EXCLUDED.changed,"                              \
    "  registered = EXCLUDED.registered, call_kind = 'register', call_body = EXCLUDED.call_body" \
    "  RETURNING name)"                                                                          \
    " SELECT pg_notify('plexus_jobs', '') FROM n"

/* A heartbeat (its body kept for the scheduler) or a poll (the body of
 * the last call kept: a registration's "running" list must survive until
 * the scheduler reads it). */
#define NOTE_CALL                                                          \
    "WITH l AS (SELECT pg_advisory_xact_lock_shared(" CHANGES_KEY ")),"    \
    " c AS (SELECT nextval('node_changes') AS v FROM l)"                   \
    " UPDATE nodes SET last_seen = $2, changed = c.v,"                     \
    " call_kind = CASE WHEN $3 = 'poll' THEN call_kind ELSE $3 END,"       \
    " call_body = CASE WHEN $3 = 'poll' THEN call_body ELSE $4 END FROM c" \
    " WHERE name = $1 AND registration <> '{}'"

static px_status note_node(void *self, const char *name, const char *kind, const char *body,
                           px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    PGresult *r = NULL;
    px_status rc;
    bool reg = strcmp(kind, "register") == 0;
    text(&q, name);
    if (reg) {
        /* The registration kept is the body less its volatile list. */
        json_t *keep = body ? json_loads(body, 0, NULL) : NULL;
        json_object_del(keep, "running");
        char *registration = keep ? json_dumps(keep, JSON_COMPACT) : NULL;
        json_decref(keep);
        if (!registration)
            return px_err_set(err, PX_EINVAL, "node %s: the registration is not a JSON object",
                              name);
        text(&q, registration);
        i64(&q, px_wall_time());
        text(&q, body);
        pthread_mutex_lock(&st->mu);
        rc = run(st, NOTE_REGISTER, &q, NULL, "record a registration", err);
        pthread_mutex_unlock(&st->mu);
        free(registration);
        return rc;
    }
    i64(&q, px_wall_time());
    text(&q, kind);
    text(&q, body);
    /* A lost heartbeat or poll costs nothing (the next comes within
     * seconds): committed without waiting for the disk. */
    px__pg_stmt s[] = {{"BEGIN", NULL},
                       {"SET LOCAL synchronous_commit = off", NULL},
                       {NOTE_CALL, &q},
                       {"COMMIT", NULL}};
    pthread_mutex_lock(&st->mu);
    if (st->batch)
        rc = run(st, NOTE_CALL, &q, &r, "record a node's call", err);
    else {
        rc = px__pg_pipeline(st, s, 4, 2, &r, "record a node's call", err);
        if (rc != PX_OK && !st->lost)
            run(st, "ROLLBACK", NULL, NULL, "rollback", NULL);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_OK && strtol(PQcmdTuples(r), NULL, 10) == 0)
        rc = px_err_set(err, PX_ENOTFOUND, "unknown node \"%s\": register again", name);
    PQclear(r);
    return rc;
}

static px_status node_mark(void *self, int64_t *mark, px_err *err)
{
    px__pg *st = self;
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, "SELECT COALESCE(MAX(changed), 0) FROM nodes", NULL, &r,
                       "read the nodes' change mark", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_OK)
        *mark = px__pg_int(r, 0, 0);
    PQclear(r);
    return rc;
}

static px_status changed_nodes(void *self, int64_t after, int max, px__node_change_cb cb, void *ud,
                               px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    i64(&q, after);
    i64(&q, max);
    static const char *const sql =
        "SELECT changed, name, NULLIF(registration, '{}'), registered > $1, call_kind,"
        " call_body FROM nodes WHERE changed > $1 ORDER BY changed LIMIT $2";
    px__pg_stmt s[] = {{"BEGIN", NULL},
                       {"SELECT pg_advisory_xact_lock(" CHANGES_KEY ")", NULL},
                       {sql, &q},
                       {"COMMIT", NULL}};
    PGresult *r = NULL;
    px_status rc;
    pthread_mutex_lock(&st->mu);
    if (st->batch) {
        /* Never inside a pass: the lock would hold every writer until the
         * pass commits. */
        rc = px_err_set(err, PX_EINVAL, "changed nodes read inside a batch");
    } else {
        rc = px__pg_pipeline(st, s, 4, 2, &r, "read changed nodes", err);
        if (rc != PX_OK && !st->lost)
            run(st, "ROLLBACK", NULL, NULL, "rollback", NULL);
    }
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++) {
        px__node_change c = {
            .change = px__pg_int(r, i, 0),
            .name = PQgetvalue(r, i, 1),
            .registration = PQgetisnull(r, i, 2) ? NULL : PQgetvalue(r, i, 2),
            .registered = strcmp(PQgetvalue(r, i, 3), "t") == 0,
            .kind = PQgetisnull(r, i, 4) ? "poll" : PQgetvalue(r, i, 4),
            .body = PQgetisnull(r, i, 5) ? NULL : PQgetvalue(r, i, 5),
        };
        cb(&c, ud);
    }
    PQclear(r);
    return rc;
}

static px_status node_assignments(void *self, const char *node, px__name_cb cb, void *ud,
                                  px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, node);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "SELECT m.assignment FROM members m JOIN jobs j ON j.id = m.job"
                       " WHERE m.node = $1 AND m.state = 'assigned' AND m.assignment IS NOT NULL"
                       " AND m.attempt = j.attempt AND j.state IN ('assigned', 'running')"
                       " ORDER BY j.seq, m.rank",
                       &q, &r, "read a node's assignments", err);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), ud);
    PQclear(r);
    return rc;
}

static px_status nodes_assignments(void *self, const char *nodes,
                                   void (*cb)(const char *node, const char *text, void *ud),
                                   void *ud, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, nodes);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "SELECT m.node, m.assignment FROM members m JOIN jobs j ON j.id = m.job"
                       " WHERE m.node IN (SELECT json_array_elements_text($1::json))"
                       " AND m.state = 'assigned' AND m.assignment IS NOT NULL"
                       " AND m.attempt = j.attempt AND j.state IN ('assigned', 'running')"
                       " ORDER BY m.node, j.seq, m.rank",
                       &q, &r, "read waiting nodes' assignments", err);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), ud);
    PQclear(r);
    return rc;
}

static px_status node_stops(void *self, const char *node, const char *running, char **out,
                            px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, node);
    text(&q, running);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc =
        run(st,
            "SELECT COALESCE(json_agg(json_build_object('job', x.v->>'job', 'attempt',"
            " (x.v->>'attempt')::int, 'rank', (x.v->>'rank')::int)), '[]'::json)::text"
            " FROM json_array_elements($2::json) AS x(v) WHERE NOT EXISTS (SELECT 1 FROM jobs j"
            " JOIN members m ON m.job = j.id AND m.rank = (x.v->>'rank')::int AND m.node = $1"
            " WHERE j.id = x.v->>'job' AND j.attempt = (x.v->>'attempt')::int"
            " AND j.state IN ('assigned', 'running') AND m.attempt = j.attempt)",
            &q, &r, "read a node's work to stop", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_OK && !(*out = px__pg_text(r, 0, 0)))
        rc = px_err_set(err, PX_ENOMEM, "out of memory");
    PQclear(r);
    return rc;
}

static px_status put_member_report(void *self, const char *node, const char *job, const char *kind,
                                   const char *body, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, node);
    text(&q, job);
    text(&q, kind);
    text(&q, body);
    i64(&q, px_wall_time());
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "WITH i AS (INSERT INTO member_reports(node, job, kind, body, at)"
                       " VALUES($1, $2, $3, $4, $5) RETURNING job)"
                       " SELECT pg_notify('plexus_jobs', job) FROM i",
                       &q, NULL, "record a member's report", err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status take_member_reports(void *self, int max, px__member_report_cb cb, void *ud,
                                     px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    i64(&q, max);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "WITH d AS (DELETE FROM member_reports WHERE seq IN (SELECT seq FROM"
                       " member_reports ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)"
                       " RETURNING seq, node, job, kind, body)"
                       " SELECT node, job, kind, body FROM d ORDER BY seq",
                       &q, &r, "take members' reports", err);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), ud);
    PQclear(r);
    return rc;
}

static px_status set_holder(void *self, const char *url, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, url ? url : "");
    i64(&q, px_wall_time());
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "INSERT INTO scheduler_holder(one, url, at) VALUES(1, $1, $2)"
                       " ON CONFLICT(one) DO UPDATE SET url = EXCLUDED.url, at = EXCLUDED.at",
                       &q, NULL, "record the scheduler's URL", err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status get_holder(void *self, char *url, px_err *err)
{
    px__pg *st = self;
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc =
        run(st, "SELECT url FROM scheduler_holder", NULL, &r, "read the scheduler's URL", err);
    pthread_mutex_unlock(&st->mu);
    url[0] = '\0';
    if (rc == PX_OK && PQntuples(r) > 0)
        snprintf(url, 256, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

void px__pg_fill_node_ops(px__store_ops *ops)
{
    ops->node_of_credential = node_of_credential;
    ops->note_node = note_node;
    ops->node_mark = node_mark;
    ops->changed_nodes = changed_nodes;
    ops->node_assignments = node_assignments;
    ops->nodes_assignments = nodes_assignments;
    ops->node_stops = node_stops;
    ops->put_member_report = put_member_report;
    ops->take_member_reports = take_member_reports;
    ops->set_holder = set_holder;
    ops->get_holder = get_holder;
}
