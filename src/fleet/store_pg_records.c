/* The PostgreSQL store's records beside the jobs: nodes and their last
 * live report, log chunks, artifacts, explanations, node credentials and
 * revoked node names. */
#include "fleet/store_pg_impl.h"

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

/* Runs one write statement under the connection's lock. */
static px_status write1(px__pg *st, const char *sql, const px__pgq *q, const char *what,
                        px_err *err)
{
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, sql, q, NULL, what, err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Runs one query under the connection's lock; *r owned by the caller. */
static px_status read1(px__pg *st, const char *sql, const px__pgq *q, PGresult **r,
                       const char *what, px_err *err)
{
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, sql, q, r, what, err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Runs one write whose loss in a crash costs nothing but a record: an
 * explanation (made again on the next decision) or a node's live report
 * (sent again within seconds).  It commits without waiting for the disk
 * (synchronous_commit off for this transaction alone): still atomic and
 * in order, and the writes that acknowledge something keep their fsync. */
static px_status write_advisory(px__pg *st, const char *sql, const px__pgq *q, const char *what,
                                px_err *err)
{
    pthread_mutex_lock(&st->mu);
    px_status rc;
    if (st->batch) {
        /* In a batch it commits with the batch's durable writes. */
        rc = run(st, sql, q, NULL, what, err);
        pthread_mutex_unlock(&st->mu);
        return rc;
    }
    rc = px__pg_begin(st, err);
    if (rc == PX_OK)
        rc = run(st, "SET LOCAL synchronous_commit = off", NULL, NULL, what, err);
    if (rc == PX_OK)
        rc = run(st, sql, q, NULL, what, err);
    if (rc == PX_OK)
        rc = px__pg_commit(st, err);
    else
        px__pg_rollback(st);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status put_node(void *self, const char *name, const char *reg, const char *state,
                          int64_t last_seen, px_err *err)
{
    px__pgq q = {0};
    text(&q, name);
    text(&q, reg);
    text(&q, state);
    i64(&q, last_seen);
    /* A NULL registration changes only the state (drain, lost, back). */
    return write1(self,
                  "INSERT INTO nodes(name, registration, state, last_seen)"
                  " VALUES($1, COALESCE($2, '{}'), $3, $4) ON CONFLICT(name) DO UPDATE SET"
                  " registration = COALESCE($2, nodes.registration), state = $3,"
                  " last_seen = $4",
                  &q, "put node", err);
}

static px_status list_nodes(void *self, px__node_cb cb, void *ud, px_err *err)
{
    PGresult *r;
    px_status rc =
        read1(self, "SELECT name, registration, state, last_seen FROM nodes ORDER BY ord", NULL, &r,
              "list nodes", err);
    if (rc != PX_OK)
        return rc;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), px__pg_int(r, i, 3), ud);
    PQclear(r);
    return PX_OK;
}

/* A job's log chunks are counted against its quota under a transaction
 * advisory lock of the job, ("plog", hashtext(job)): every replica's
 * writer takes it, so that the bytes it reads are all the bytes there are
 * until it commits (a statement after the lock reads what committed before
 * it).  Two jobs that hash alike only wait for each other. */
#define LOG_LOCK "SELECT pg_advisory_xact_lock(1886154599, hashtext($1))"

static px_status insert_log(px__pg *st, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err)
{
    px__pgq q = {0};
    text(&q, job);
    i64(&q, attempt);
    i64(&q, rank);
    text(&q, stream);
    px__pgq_blob(&q, data, len);
    i64(&q, px_wall_time());
    PGresult *r = NULL;
    px_status rc = run(st,
                       "INSERT INTO logs(job, seq, attempt, rank, stream, data, at) SELECT $1,"
                       " COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6 FROM logs WHERE job = $1"
                       " RETURNING seq",
                       &q, &r, "append log", err);
    if (rc == PX_OK)
        *seq = px__pg_int(r, 0, 0);
    PQclear(r);
    return rc;
}

static px_status append_log(void *self, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err)
{
    px__pg *st = self;
    px_status rc = PX_EEXIST;
    /* The next number of the job's log, in one statement; two writers of
     * the same log can race for it, and the loser takes the next. */
    pthread_mutex_lock(&st->mu);
    for (int tries = 0; rc == PX_EEXIST && tries < 5; tries++)
        rc = insert_log(st, job, attempt, rank, stream, data, len, seq, err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status append_log_quota(void *self, const char *job, int attempt, int rank,
                                  const char *stream, const void *data, size_t len, int64_t quota,
                                  const char *note, size_t *taken, bool *cut, int64_t *seq,
                                  px_err *err)
{
    px__pg *st = self;
    *taken = 0;
    *cut = false;
    *seq = 0;
    px__pgq q = {0};
    text(&q, job);
    pthread_mutex_lock(&st->mu);
    px_status rc = PX_EEXIST;
    /* A writer that numbers the log without the lock (append_log) can take
     * the number first: the transaction is tried again. */
    for (int tries = 0; rc == PX_EEXIST && tries < 5; tries++) {
        PGresult *r = NULL;
        int64_t last = 0;
        size_t take = 0;
        bool noted = false; /* past the quota: the note is there already */
        rc = px__pg_begin(st, err);
        if (rc == PX_OK)
            rc = run(st, LOG_LOCK, &q, NULL, "append log", err);
        if (rc == PX_OK)
            rc = run(st, "SELECT COALESCE(SUM(length(data)), 0) FROM logs WHERE job = $1", &q, &r,
                     "append log", err);
        if (rc == PX_OK) {
            int64_t used = px__pg_int(r, 0, 0);
            noted = used > quota;
            take = used >= quota ? 0 : (size_t)PX_MIN((uint64_t)len, (uint64_t)(quota - used));
        }
        PQclear(r);
        if (rc == PX_OK && take > 0)
            rc = insert_log(st, job, attempt, rank, stream, data, take, &last, err);
        if (rc == PX_OK && take < len && !noted && note)
            rc = insert_log(st, job, attempt, rank, "stderr", note, strlen(note), &last, err);
        if (rc == PX_OK)
            rc = px__pg_commit(st, err);
        else
            px__pg_rollback(st);
        if (rc == PX_OK) {
            *taken = take;
            *cut = take < len;
            *seq = last;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status read_logs(void *self, const char *job, int64_t after, const char *stream,
                           size_t max_bytes, px__log_cb cb, void *ud, px_err *err)
{
    px__pgq q = {0};
    text(&q, job);
    i64(&q, after);
    text(&q, stream);
    PGresult *r;
    px_status rc = read1(self,
                         "SELECT seq, stream, rank, attempt, data FROM logs WHERE job = $1 AND"
                         " seq > $2 AND ($3::text IS NULL OR stream = $3) ORDER BY seq"
                         " LIMIT 10000",
                         &q, &r, "read logs", err);
    if (rc != PX_OK)
        return rc;
    size_t total = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        size_t len = 0;
        unsigned char *data = PQunescapeBytea((const unsigned char *)PQgetvalue(r, i, 4), &len);
        if (!data) {
            rc = px_err_set(err, PX_ENOMEM, "out of memory");
            break;
        }
        if (total > 0 && total + len > max_bytes) {
            PQfreemem(data);
            break;
        }
        total += len;
        px__log_chunk c = {.seq = px__pg_int(r, i, 0),
                           .stream = PQgetvalue(r, i, 1),
                           .rank = (int)px__pg_int(r, i, 2),
                           .attempt = (int)px__pg_int(r, i, 3),
                           .data = (char *)data,
                           .len = len};
        cb(&c, ud);
        PQfreemem(data);
    }
    PQclear(r);
    return rc;
}

static px_status put_artifact(void *self, const px__artifact_row *a, px_err *err)
{
    px__pgq q = {0};
    text(&q, a->job);
    text(&q, a->name);
    i64(&q, a->size);
    text(&q, a->sha256);
    i64(&q, a->rank);
    i64(&q, a->attempt);
    i64(&q, a->created);
    return write1(self,
                  "INSERT INTO artifacts(job, name, size, sha256, rank, attempt, created)"
                  " VALUES($1,$2,$3,$4,$5,$6,$7) ON CONFLICT(job, name) DO UPDATE SET"
                  " size = EXCLUDED.size, sha256 = EXCLUDED.sha256, rank = EXCLUDED.rank,"
                  " attempt = EXCLUDED.attempt, created = EXCLUDED.created",
                  &q, "put artifact", err);
}

static px_status list_artifacts(void *self, const char *job, px__artifact_cb cb, void *ud,
                                px_err *err)
{
    px__pgq q = {0};
    text(&q, job);
    PGresult *r;
    px_status rc = read1(self,
                         "SELECT job, name, sha256, size, rank, attempt, created FROM artifacts"
                         " WHERE job = $1 ORDER BY name",
                         &q, &r, "list artifacts", err);
    if (rc != PX_OK)
        return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        px__artifact_row a = {PQgetvalue(r, i, 0),      PQgetvalue(r, i, 1),
                              PQgetvalue(r, i, 2),      px__pg_int(r, i, 3),
                              (int)px__pg_int(r, i, 4), (int)px__pg_int(r, i, 5),
                              px__pg_int(r, i, 6)};
        cb(&a, ud);
    }
    PQclear(r);
    return PX_OK;
}

static px_status put_explanation(void *self, const char *job, int attempt, const char *json,
                                 px_err *err)
{
    px__pgq q = {0};
    text(&q, job);
    i64(&q, attempt);
    text(&q, json);
    i64(&q, px_wall_time());
    return write_advisory(self,
                          "INSERT INTO explanations(job, attempt, body, at) VALUES($1,$2,$3,$4)"
                          " ON CONFLICT(job, attempt) DO UPDATE SET body = EXCLUDED.body,"
                          " at = EXCLUDED.at",
                          &q, "put explanation", err);
}

static px_status get_explanation(void *self, const char *job, char **out, px_err *err)
{
    *out = NULL;
    px__pgq q = {0};
    text(&q, job);
    PGresult *r;
    px_status rc = read1(self,
                         "SELECT body FROM explanations WHERE job = $1 ORDER BY attempt DESC"
                         " LIMIT 1",
                         &q, &r, "get explanation", err);
    if (rc != PX_OK)
        return rc;
    if (PQntuples(r) == 1)
        rc = (*out = px__pg_text(r, 0, 0)) ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    else
        rc = px_err_set(err, PX_ENOTFOUND, "no explanation for job \"%.64s\"", job);
    PQclear(r);
    return rc;
}

static px_status put_heartbeat(void *self, const char *node, int64_t at, const char *live,
                               px_err *err)
{
    px__pgq q = {0};
    text(&q, node);
    i64(&q, at);
    text(&q, live);
    return write_advisory(
        self,
        "INSERT INTO heartbeats(node, at, live) VALUES($1,$2,$3) ON CONFLICT(node)"
        " DO UPDATE SET at = EXCLUDED.at, live = EXCLUDED.live",
        &q, "put heartbeat", err);
}

static px_status job_usage(void *self, const char *job, int64_t *log_bytes, int64_t *artifact_bytes,
                           px_err *err)
{
    px__pgq q = {0};
    text(&q, job);
    PGresult *r;
    px_status rc = read1(self,
                         "SELECT (SELECT COALESCE(SUM(length(data)), 0) FROM logs WHERE job = $1),"
                         " (SELECT COALESCE(SUM(size), 0) FROM artifacts WHERE job = $1)",
                         &q, &r, "job usage", err);
    if (rc != PX_OK)
        return rc;
    *log_bytes = px__pg_int(r, 0, 0);
    *artifact_bytes = px__pg_int(r, 0, 1);
    PQclear(r);
    return PX_OK;
}

static px_status put_credential(void *self, const char *node, const char *hash, px_err *err)
{
    px__pgq q = {0};
    text(&q, hash);
    text(&q, node);
    i64(&q, px_wall_time());
    return write1(self,
                  "INSERT INTO node_credentials(hash, node, created) VALUES($1,$2,$3)"
                  " ON CONFLICT(hash) DO UPDATE SET node = EXCLUDED.node,"
                  " created = EXCLUDED.created",
                  &q, "put credential", err);
}

static px_status drop_credentials(void *self, const char *node, const char *keep, px_err *err)
{
    px__pgq q = {0};
    text(&q, node);
    text(&q, keep);
    return write1(self,
                  "DELETE FROM node_credentials WHERE node = $1 AND ($2::text IS NULL OR"
                  " hash != $2)",
                  &q, "drop credentials", err);
}

static px_status list_credentials(void *self, px__credential_cb cb, void *ud, px_err *err)
{
    PGresult *r;
    px_status rc = read1(self, "SELECT node, hash FROM node_credentials ORDER BY created", NULL, &r,
                         "list credentials", err);
    if (rc != PX_OK)
        return rc;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), ud);
    PQclear(r);
    return PX_OK;
}

static px_status set_revoked(void *self, const char *node, bool revoked, px_err *err)
{
    px__pgq q = {0};
    text(&q, node);
    if (!revoked)
        return write1(self, "DELETE FROM revoked_nodes WHERE node = $1", &q, "revoke node", err);
    i64(&q, px_wall_time());
    return write1(self,
                  "INSERT INTO revoked_nodes(node, at) VALUES($1, $2) ON CONFLICT(node)"
                  " DO UPDATE SET at = EXCLUDED.at",
                  &q, "revoke node", err);
}

static px_status list_revoked(void *self, px__name_cb cb, void *ud, px_err *err)
{
    PGresult *r;
    px_status rc =
        read1(self, "SELECT node FROM revoked_nodes", NULL, &r, "list revoked nodes", err);
    if (rc != PX_OK)
        return rc;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), ud);
    PQclear(r);
    return PX_OK;
}

void px__pg_fill_record_ops(px__store_ops *ops)
{
    ops->put_node = put_node;
    ops->list_nodes = list_nodes;
    ops->append_log = append_log;
    ops->append_log_quota = append_log_quota;
    ops->read_logs = read_logs;
    ops->job_usage = job_usage;
    ops->put_artifact = put_artifact;
    ops->list_artifacts = list_artifacts;
    ops->put_explanation = put_explanation;
    ops->get_explanation = get_explanation;
    ops->put_heartbeat = put_heartbeat;
    ops->put_credential = put_credential;
    ops->drop_credentials = drop_credentials;
    ops->list_credentials = list_credentials;
    ops->set_revoked = set_revoked;
    ops->list_revoked = list_revoked;
}
