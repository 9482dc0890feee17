/* The PostgreSQL store, for several server replicas on one database: the
 * connection, numbered migrations (the SQLite store's schema in
 * PostgreSQL's types), the job rows and the scheduler lease.  Every write
 * is committed before it returns (synchronous_commit as the database is
 * configured: on by default), so an acknowledged submission survives the
 * death of the replica that took it; a write that fails rolls back and
 * says so.  The connection string never carries a password: libpq reads
 * it from ~/.pgpass or PGPASSFILE (a file only its owner can read). */
#include "fleet/store_pg_impl.h"

#include <inttypes.h>
#include <poll.h>

/* The scheduler lease: a session advisory lock, (classid, objid) =
 * ("plex", 1). */
#define LEASE_KEY "1886152056, 1"
/* Migrations run one replica at a time under this transaction lock. */
#define MIGRATE_KEY "1886152056, 2"

/* Migrations, applied in order, each in one transaction; never edit one
 * that has shipped, add the next.  Versions 1 to 4 follow the SQLite
 * store's (the same tables, less the token table that version 3 of the
 * SQLite store drops); after that each store numbers its own. */
static const char *const migrations[] = {
    /* 1: the first schema. */
    "CREATE TABLE nodes(name TEXT PRIMARY KEY, registration TEXT NOT NULL,"
    "  state TEXT NOT NULL, last_seen BIGINT NOT NULL, ord BIGSERIAL);"
    "CREATE SEQUENCE jobs_seq;"
    "CREATE TABLE jobs(seq BIGINT PRIMARY KEY, id TEXT UNIQUE NOT NULL, name TEXT,"
    "  state TEXT NOT NULL, attempt INTEGER NOT NULL, restarts INTEGER NOT NULL,"
    "  spec TEXT NOT NULL, members TEXT, result TEXT, error TEXT, plan TEXT,"
    "  exit_code INTEGER, created BIGINT NOT NULL, updated BIGINT NOT NULL,"
    "  not_before DOUBLE PRECISION NOT NULL DEFAULT 0,"
    /* Whether the scheduling replica has the job in hand (false: another
     * replica accepted it and the scheduler must still claim it). */
    "  adopted BOOLEAN NOT NULL DEFAULT true);"
    "CREATE INDEX jobs_state ON jobs(state);"
    "CREATE INDEX jobs_unadopted ON jobs(seq) WHERE NOT adopted;"
    "CREATE TABLE members(job TEXT NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL,"
    "  node TEXT, devices TEXT, state TEXT, exit_code INTEGER, started BIGINT,"
    "  finished BIGINT, PRIMARY KEY(job, rank));"
    "CREATE TABLE attempts(job TEXT NOT NULL, attempt INTEGER NOT NULL, reason TEXT,"
    "  at BIGINT NOT NULL, PRIMARY KEY(job, attempt));"
    "CREATE TABLE logs(job TEXT NOT NULL, seq BIGINT NOT NULL, attempt INTEGER NOT NULL,"
    "  rank INTEGER NOT NULL, stream TEXT NOT NULL, data BYTEA NOT NULL, at BIGINT NOT NULL,"
    "  PRIMARY KEY(job, seq));"
    "CREATE TABLE artifacts(job TEXT NOT NULL, name TEXT NOT NULL, size BIGINT NOT NULL,"
    "  sha256 TEXT NOT NULL, rank INTEGER, attempt INTEGER, created BIGINT NOT NULL,"
    "  PRIMARY KEY(job, name));"
    "CREATE TABLE explanations(job TEXT NOT NULL, attempt INTEGER NOT NULL, body TEXT NOT NULL,"
    "  at BIGINT NOT NULL, PRIMARY KEY(job, attempt));",
    /* 2: the last live report of each node. */
    "CREATE TABLE heartbeats(node TEXT PRIMARY KEY, at BIGINT NOT NULL, live TEXT);",
    /* 3: users own jobs, submissions carry idempotency keys, nodes have
     * credentials of their own. */
    "ALTER TABLE jobs ADD COLUMN owner TEXT;"
    "ALTER TABLE jobs ADD COLUMN idem_key TEXT;"
    "ALTER TABLE jobs ADD COLUMN idem_hash TEXT;"
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs(owner, idem_key) WHERE idem_key IS NOT NULL;"
    "CREATE INDEX jobs_owner ON jobs(owner, seq);"
    "CREATE TABLE node_credentials(hash TEXT PRIMARY KEY, node TEXT NOT NULL,"
    "  created BIGINT NOT NULL);"
    "CREATE INDEX node_credentials_node ON node_credentials(node);"
    "CREATE TABLE revoked_nodes(node TEXT PRIMARY KEY, at BIGINT NOT NULL);",
    /* 4: models deployed across the fleet, by name. */
    "CREATE TABLE deployments(name TEXT PRIMARY KEY, owner TEXT, model TEXT NOT NULL,"
    "  spec TEXT NOT NULL, state TEXT NOT NULL, plan TEXT, incidents TEXT,"
    "  created BIGINT NOT NULL, updated BIGINT NOT NULL);"
    "CREATE INDEX deployments_owner ON deployments(owner, name);",
    /* 5: blobs, in chunks, so that replicas share them (a SQLite server
     * keeps them as files in DATA/blobs, and has no such table). */
    "CREATE TABLE blobs(digest TEXT PRIMARY KEY, size BIGINT NOT NULL,"
    "  chunks INTEGER NOT NULL, created BIGINT NOT NULL);"
    "CREATE TABLE blob_chunks(digest TEXT NOT NULL, n INTEGER NOT NULL, data BYTEA NOT NULL,"
    "  PRIMARY KEY(digest, n));"
    /* and cancellations a replica that does not schedule accepted, until
     * the scheduler takes them. */
    "CREATE TABLE cancel_requests(job TEXT PRIMARY KEY, at BIGINT NOT NULL);",
    /* 6: what a deployment's front end reports (serving figures and
     * incidents), a ring per deployment and kind, gone with the deployment. */
    "CREATE TABLE deployment_records(deployment TEXT NOT NULL"
    "  REFERENCES deployments(name) ON DELETE CASCADE, kind TEXT NOT NULL,"
    "  seq BIGINT NOT NULL, at BIGINT NOT NULL, body TEXT NOT NULL,"
    "  PRIMARY KEY(deployment, kind, seq));",
    /* 7: agents through every replica.  Each node's last call to a replica
     * that does not schedule, numbered from node_changes so that the
     * scheduler reads only what changed (registered: the number of its
     * last registration); what each waiting member is to run; members'
     * reports for the scheduler; the scheduling replica's URL. */
    "CREATE SEQUENCE node_changes;"
    "ALTER TABLE nodes ADD COLUMN changed BIGINT NOT NULL DEFAULT 0;"
    "ALTER TABLE nodes ADD COLUMN registered BIGINT NOT NULL DEFAULT 0;"
    "ALTER TABLE nodes ADD COLUMN call_kind TEXT;"
    "ALTER TABLE nodes ADD COLUMN call_body TEXT;"
    "CREATE INDEX nodes_changed ON nodes(changed);"
    "ALTER TABLE members ADD COLUMN assignment TEXT;"
    "CREATE INDEX members_waiting ON members(node) WHERE state = 'assigned';"
    "CREATE TABLE member_reports(seq BIGSERIAL PRIMARY KEY, node TEXT NOT NULL,"
    "  job TEXT NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL, at BIGINT NOT NULL);"
    "CREATE TABLE scheduler_holder(one INTEGER PRIMARY KEY CHECK (one = 1), url TEXT NOT NULL,"
    "  at BIGINT NOT NULL);",
    /* 8: the lease's epoch, incremented by each new holder under the
     * advisory lock, and the check that opens every transaction it fences
     * on another connection: the row stays share-locked until that
     * transaction ends, so a new holder's increment waits for it, and one
     * that begins after a takeover fails (SQLSTATE PXF01) and rolls back. */
    "CREATE TABLE lease(one INTEGER PRIMARY KEY CHECK (one = 1), epoch BIGINT NOT NULL);"
    "INSERT INTO lease(one, epoch) VALUES(1, 0);"
    "CREATE FUNCTION plexus_fence(mine BIGINT) RETURNS void LANGUAGE plpgsql AS $f$"
    " DECLARE now_epoch BIGINT;"
    " BEGIN"
    "  SELECT epoch INTO now_epoch FROM lease WHERE one = 1 FOR SHARE;"
    "  IF now_epoch IS DISTINCT FROM mine THEN"
    "   RAISE EXCEPTION USING ERRCODE = 'PXF01', MESSAGE = format('the scheduler lease is at"
    " epoch %s, this replica holds epoch %s: another replica has taken over; this one stops"
    " scheduling (restart it as a standby)', now_epoch, mine);"
    "  END IF;"
    " END $f$;",
    /* 9: artifacts by content.  The collection of artifacts' bytes that no
     * row names (store_pg_blobs.c) looks each candidate up by its digest,
     * which scanned the table.  A plain CREATE INDEX, in the migration's
     * transaction: it holds off writes to artifacts while it builds, a
     * moment at a fleet's sizes, and CONCURRENTLY cannot run inside the
     * transaction (and advisory lock) that keeps replicas from migrating
     * at once. */
    "CREATE INDEX artifacts_sha256 ON artifacts(sha256);",
};

int px__store_pg_schema_version(void)
{
    return (int)PX_ARRAY_LEN(migrations);
}

/* ---- statements ---- */

static void pgq_slot(px__pgq *q, const char *v, int len, int fmt)
{
    PX_ASSERT(q->n < PX__PGQ_MAX);
    q->v[q->n] = v;
    q->len[q->n] = len;
    q->fmt[q->n] = fmt;
    q->n++;
}

void px__pgq_text(px__pgq *q, const char *v)
{
    pgq_slot(q, v, 0, 0);
}

void px__pgq_int(px__pgq *q, int64_t v)
{
    snprintf(q->buf[q->n], sizeof q->buf[0], "%" PRId64, v);
    pgq_slot(q, q->buf[q->n], 0, 0);
}

void px__pgq_double(px__pgq *q, double v)
{
    snprintf(q->buf[q->n], sizeof q->buf[0], "%.17g", v);
    pgq_slot(q, q->buf[q->n], 0, 0);
}

void px__pgq_blob(px__pgq *q, const void *data, size_t len)
{
    pgq_slot(q, len ? data : "", (int)len, 1);
}

/* The server's message on one line, without libpq's trailing newline. */
static const char *one_line(const char *msg, char *buf, size_t n)
{
    snprintf(buf, n, "%s", msg && *msg ? msg : "unknown error");
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = (p[1] ? ' ' : '\0');
    return buf;
}

static px_status run_one(px__pg *st, const char *sql, const px__pgq *q, PGresult **res,
                         const char *what, px_err *err);
static px_status configure_session(px__pg *st, PGconn *c, const char *what, px_err *err);
static px_status check_conn(px__pg *st, const char *what, px_err *err);
static px_status result_error(px__pg *st, const PGresult *r, const char *what, px_err *err);

px_status px__pg_run(px__pg *st, const char *sql, const px__pgq *q, PGresult **res,
                     const char *what, px_err *err)
{
    /* Inside a batch a statement of its own is a savepoint, so that one
     * that fails leaves the batch's other writes alone. */
    if (!st->batch || st->depth > 0 || !q)
        return run_one(st, sql, q, res, what, err);
    /* The savepoint, the statement and its release in one round trip. */
    px__pg_stmt s[3] = {{"SAVEPOINT px_s", NULL}, {sql, q}, {"RELEASE SAVEPOINT px_s", NULL}};
    px_status rc = px__pg_pipeline(st, s, 3, 1, res, what, err);
    if (rc != PX_OK && !st->lost)
        run_one(st, "ROLLBACK TO SAVEPOINT px_s; RELEASE SAVEPOINT px_s", NULL, NULL, what, NULL);
    return rc;
}

static void forget_prepared(px__pg *st)
{
    for (int i = 0; i < st->n_prepared; i++)
        free(st->prepared[i].sql);
    st->n_prepared = 0;
}

/* The prepared statement of sql: its index, with *parse set when its Parse
 * must go into this pipeline first; -1 (sent unprepared) when the table is
 * full or out of memory. */
static int prepared_slot(px__pg *st, const char *sql, bool *parse)
{
    *parse = false;
    for (int i = 0; i < st->n_prepared; i++)
        if (strcmp(st->prepared[i].sql, sql) == 0) {
            *parse = st->prepared[i].state == 0;
            st->prepared[i].state = PX_MAX(st->prepared[i].state, 1);
            return i;
        }
    if (st->n_prepared == (int)PX_ARRAY_LEN(st->prepared))
        return -1;
    char *copy = px_strdup(sql);
    if (!copy)
        return -1;
    st->prepared[st->n_prepared] = (struct px__pg_prepared){copy, 1};
    *parse = true;
    return st->n_prepared++;
}

/* After a pipeline: a Parse that failed (or was skipped after a failure,
 * or never answered) left no statement behind; it is sent again the next
 * time. */
static void settle_prepared(px__pg *st, int slot, bool ok)
{
    st->prepared[slot].state = ok ? 2 : 0;
}

/* The lost connection of a replica that does not schedule is made again;
 * PX_EIO when it stays lost (or holds the lease: lost for good). */
static px_status check_conn(px__pg *st, const char *what, px_err *err)
{
    if (st->lost && !st->lease_held) {
        /* A replica that does not schedule may simply reconnect (a new
         * session, without the statements prepared on the old, and with
         * the database's defaults until it is configured again). */
        PQreset(st->conn);
        forget_prepared(st);
        if (PQstatus(st->conn) == CONNECTION_OK) {
            px_status rc = configure_session(st, st->conn, what, err);
            if (rc != PX_OK)
                return rc;
            st->lost = false;
        }
    }
    if (st->lost)
        return px_err_set(err, PX_EIO,
                          "PostgreSQL %s: %s: the connection was lost (and with it the "
                          "scheduler lease)",
                          st->where, what);
    return PX_OK;
}

/* A failed result's message in err: PX_EEXIST for a unique violation,
 * PX_ESTATE for a write fenced out by a newer lease epoch, else PX_EIO. */
static px_status result_error(px__pg *st, const PGresult *r, const char *what, px_err *err)
{
    char line[200];
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    px_status code = state && strcmp(state, "23505") == 0   ? PX_EEXIST
                     : state && strcmp(state, "PXF01") == 0 ? PX_ESTATE
                                                            : PX_EIO;
    px_err_set(
        err, code, "PostgreSQL %s: %s: %s", st->where, what,
        one_line(r && *PQresultErrorMessage(r) ? PQresultErrorMessage(r) : PQerrorMessage(st->conn),
                 line, sizeof line));
    return code;
}

px_status px__pg_pipeline(px__pg *st, const px__pg_stmt *s, int n, int keep, PGresult **res,
                          const char *what, px_err *err)
{
    if (res)
        *res = NULL;
    px_status rc = check_conn(st, what, err);
    if (rc != PX_OK)
        return rc;
    if (!PQenterPipelineMode(st->conn)) {
        /* Not possible (a libpq without pipelines): one at a time. */
        for (int i = 0; i < n && rc == PX_OK; i++)
            rc = run_one(st, s[i].sql, s[i].q, i == keep ? res : NULL, what, err);
        return rc;
    }
    /* What was sent, in order: a statement (its index), or the Parse of a
     * prepared statement (-1 - its slot). */
    int *ops = malloc(sizeof *ops * (size_t)n * 2);
    if (!ops) {
        PQexitPipelineMode(st->conn);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    int sent = 0, n_ops = 0;
    for (; sent < n; sent++) {
        const px__pgq *q = s[sent].q;
        bool parse = false;
        int slot = q ? prepared_slot(st, s[sent].sql, &parse) : -1;
        char name[16];
        snprintf(name, sizeof name, "px_%d", slot);
        if (parse) {
            if (!PQsendPrepare(st->conn, name, s[sent].sql, 0, NULL))
                break;
            ops[n_ops++] = -1 - slot;
        }
        if (slot >= 0
                ? !PQsendQueryPrepared(st->conn, name, q->n, q->v, q->len, q->fmt, 0)
                : !PQsendQueryParams(st->conn, s[sent].sql, q ? q->n : 0, NULL, q ? q->v : NULL,
                                     q ? q->len : NULL, q ? q->fmt : NULL, 0))
            break;
        ops[n_ops++] = sent;
    }
    bool synced = PQpipelineSync(st->conn) == 1;
    if (sent < n || !synced)
        rc = result_error(st, NULL, what, err);
    /* Each statement's result, then NULL; after the first failure the
     * server skips the rest (PGRES_PIPELINE_ABORTED) until the sync. */
    for (int i = 0; i < n_ops && synced; i++) {
        PGresult *r = PQgetResult(st->conn);
        if (!r) {
            if (rc == PX_OK)
                rc = result_error(st, NULL, what, err);
            break;
        }
        ExecStatusType t = PQresultStatus(r);
        bool ok = t == PGRES_COMMAND_OK || t == PGRES_TUPLES_OK;
        if (!ok && rc == PX_OK)
            rc = result_error(st, r, what, err);
        if (ops[i] < 0)
            settle_prepared(st, -1 - ops[i], ok);
        if (ok && ops[i] >= 0 && ops[i] == keep && res)
            *res = r;
        else
            PQclear(r);
        while ((r = PQgetResult(st->conn)))
            PQclear(r);
    }
    /* Parses whose answer never came. */
    for (int i = 0; i < st->n_prepared; i++)
        if (st->prepared[i].state == 1)
            st->prepared[i].state = 0;
    free(ops);
    if (synced) {
        PGresult *r = PQgetResult(st->conn);
        if (PQresultStatus(r) != PGRES_PIPELINE_SYNC && rc == PX_OK)
            rc = result_error(st, r, what, err);
        PQclear(r);
    }
    if (!PQexitPipelineMode(st->conn) || PQstatus(st->conn) != CONNECTION_OK) {
        /* Out of step with the server: nothing more may be trusted on it. */
        if (rc == PX_OK)
            rc = result_error(st, NULL, what, err);
        st->lost = true;
    }
    if (rc != PX_OK && res && *res) {
        PQclear(*res);
        *res = NULL;
    }
    return rc;
}

static px_status run_one(px__pg *st, const char *sql, const px__pgq *q, PGresult **res,
                         const char *what, px_err *err)
{
    if (res)
        *res = NULL;
    px_status rc = check_conn(st, what, err);
    if (rc != PX_OK)
        return rc;
    /* Without parameters, the simple protocol: it runs a script of several
     * statements (the migrations). */
    PGresult *r = q ? PQexecParams(st->conn, sql, q->n, NULL, q->v, q->len, q->fmt, 0)
                    : PQexec(st->conn, sql);
    ExecStatusType s = PQresultStatus(r);
    if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
        if (res)
            *res = r;
        else
            PQclear(r);
        return PX_OK;
    }
    px_status code = result_error(st, r, what, err);
    PQclear(r);
    if (PQstatus(st->conn) != CONNECTION_OK)
        st->lost = true;
    return code;
}

char *px__pg_text(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : px_strdup(PQgetvalue(r, row, col));
}

int64_t px__pg_int(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

px_status px__pg_begin(px__pg *st, px_err *err)
{
    if (!st->batch)
        return run(st, "BEGIN", NULL, NULL, "begin", err);
    px_status rc = run(st, "SAVEPOINT px_t", NULL, NULL, "begin", err);
    if (rc == PX_OK)
        st->depth++;
    return rc;
}

px_status px__pg_commit(px__pg *st, px_err *err)
{
    if (!st->batch)
        return run(st, "COMMIT", NULL, NULL, "commit", err);
    px_status rc = run(st, "RELEASE SAVEPOINT px_t", NULL, NULL, "commit", err);
    if (rc == PX_OK)
        st->depth--;
    return rc;
}

void px__pg_rollback(px__pg *st)
{
    if (st->lost)
        return;
    if (!st->batch) {
        run(st, "ROLLBACK", NULL, NULL, "rollback", NULL);
        return;
    }
    run(st, "ROLLBACK TO SAVEPOINT px_t; RELEASE SAVEPOINT px_t", NULL, NULL, "rollback", NULL);
    st->depth--;
}

#define begin    px__pg_begin
#define commit   px__pg_commit
#define rollback px__pg_rollback

static px_status migrate(px__pg *st, px_err *err)
{
    PGresult *r = NULL;
    if (begin(st, err) != PX_OK)
        return PX_EIO;
    if (run(st, "SELECT pg_advisory_xact_lock(" MIGRATE_KEY ")", NULL, NULL, "migrate", err) ||
        run(st,
            "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL,"
            " applied BIGINT NOT NULL)",
            NULL, NULL, "migrate", err) ||
        run(st, "SELECT COALESCE(MAX(version), 0) FROM schema_version", NULL, &r, "migrate", err))
        goto fail;
    int have = (int)px__pg_int(r, 0, 0);
    PQclear(r);
    if (have > (int)PX_ARRAY_LEN(migrations)) {
        px_err_set(err, PX_EUNSUPPORTED,
                   "PostgreSQL %s: schema version %d is newer than this plexus knows (%zu); "
                   "run a newer plexus",
                   st->where, have, PX_ARRAY_LEN(migrations));
        goto fail;
    }
    for (int v = have + 1; v <= (int)PX_ARRAY_LEN(migrations); v++) {
        px__pgq q = {0};
        i64(&q, v);
        i64(&q, px_wall_time());
        if (run(st, migrations[v - 1], NULL, NULL, "migrate", err) ||
            run(st, "INSERT INTO schema_version(version, applied) VALUES($1, $2)", &q, NULL,
                "migrate", err)) {
            px_err_prefix(err, PX_EIO, "migration %d: ", v);
            goto fail;
        }
    }
    return commit(st, err);
fail:
    rollback(st);
    return err ? err->code : PX_EIO;
}

static void pg_close(void *self)
{
    px__pg *st = self;
    if (!st)
        return;
    pg_close(st->fenced);
    PQfinish(st->conn);
    PQfinish(st->listen);
    forget_prepared(st);
    pthread_mutex_destroy(&st->mu);
    free(st->where);
    free(st->spec);
    free(st);
}

/* ---- jobs ---- */

#define JOB_COLS                                                                               \
    "seq, id, name, state, attempt, restarts, spec, members, result, error, plan, exit_code, " \
    "created, updated, not_before, owner, idem_key, idem_hash"
#define JOB_PARAMS "$1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18"

static void bind_job(px__pgq *q, const px__job_row *r)
{
    i64(q, r->seq);
    text(q, r->id);
    text(q, r->name);
    text(q, r->state);
    i64(q, r->attempt);
    i64(q, r->restarts);
    text(q, r->spec);
    text(q, r->members);
    text(q, r->result);
    text(q, r->error);
    text(q, r->plan);
    if (r->exit_code == INT_MIN)
        text(q, NULL);
    else
        i64(q, r->exit_code);
    i64(q, r->created);
    i64(q, r->updated);
    px__pgq_double(q, r->not_before);
    text(q, r->owner);
    text(q, r->idem_key);
    text(q, r->idem_hash);
}

static void read_job(const PGresult *r, int i, px__job_row *o)
{
    o->assignments = NULL; /* written, never read back */
    o->seq = px__pg_int(r, i, 0);
    o->id = px__pg_text(r, i, 1);
    o->name = px__pg_text(r, i, 2);
    o->state = px__pg_text(r, i, 3);
    o->attempt = (int)px__pg_int(r, i, 4);
    o->restarts = (int)px__pg_int(r, i, 5);
    o->spec = px__pg_text(r, i, 6);
    o->members = px__pg_text(r, i, 7);
    o->result = px__pg_text(r, i, 8);
    o->error = px__pg_text(r, i, 9);
    o->plan = px__pg_text(r, i, 10);
    o->exit_code = PQgetisnull(r, i, 11) ? INT_MIN : (int)px__pg_int(r, i, 11);
    o->created = px__pg_int(r, i, 12);
    o->updated = px__pg_int(r, i, 13);
    o->not_before = PQgetisnull(r, i, 14) ? 0 : strtod(PQgetvalue(r, i, 14), NULL);
    o->owner = px__pg_text(r, i, 15);
    o->idem_key = px__pg_text(r, i, 16);
    o->idem_hash = px__pg_text(r, i, 17);
}

static px_status insert_job(void *self, px__job_row *row, px_err *err)
{
    px__pg *st = self;
    pthread_mutex_lock(&st->mu);
    PGresult *r = NULL;
    char *made_id = NULL;
    px_status rc = run(st, "SELECT nextval('jobs_seq')", NULL, &r, "next job number", err);
    if (rc != PX_OK)
        goto out;
    row->seq = px__pg_int(r, 0, 0);
    PQclear(r);
    if (!row->id) {
        if (!(made_id = px_asprintf("j-%06" PRId64, row->seq))) {
            rc = px_err_set(err, PX_ENOMEM, "out of memory");
            goto out;
        }
        row->id = made_id;
    }
    px__pgq q = {0};
    bind_job(&q, row);
    /* The scheduling replica inserts the job adopted and wakes nobody: it
     * has the job in hand, and its own listener would only wake it to
     * claim nothing.  Another replica's insert and the wake-up of the
     * scheduling replica commit together, in one statement. */
    if (st->lease_held)
        rc = run(st, "INSERT INTO jobs(" JOB_COLS ", adopted) VALUES(" JOB_PARAMS ", true)", &q,
                 NULL, "insert job", err);
    else
        rc = run(st,
                 "WITH j AS (INSERT INTO jobs(" JOB_COLS ", adopted) VALUES(" JOB_PARAMS ", false)"
                 " RETURNING id)"
                 " SELECT pg_notify('plexus_jobs', id) FROM j",
                 &q, NULL, "insert job", err);
    if (rc == PX_EEXIST && row->idem_key)
        px_err_set(err, PX_EEXIST, "Idempotency-Key \"%.64s\" is already used", row->idem_key);
out:
    if (rc != PX_OK && made_id) {
        free(made_id);
        row->id = NULL;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Every member of the job in one statement, from the row's JSON array
 * (rank = position), with its assignment (the element of the same rank
 * of $4, NULL when $4 is). */
#define WRITE_MEMBERS                                                                             \
    "INSERT INTO members(job, rank, attempt, node, devices, state, exit_code, started, finished," \
    " assignment)"                                                                                \
    " SELECT $1, m.ord - 1, $2, m.v->>'node', (m.v->'devices')::text, m.v->>'state',"             \
    " CASE WHEN json_typeof(m.v->'exit_code') = 'number' THEN (m.v->>'exit_code')::int END,"      \
    " CASE WHEN json_typeof(m.v->'started') = 'number'"                                           \
    "  THEN (m.v->>'started')::numeric::bigint ELSE 0 END,"                                       \
    " CASE WHEN json_typeof(m.v->'finished') = 'number'"                                          \
    "  THEN (m.v->>'finished')::numeric::bigint ELSE 0 END,"                                      \
    " NULLIF(($4::json -> (m.ord - 1)::int)::text, 'null')"                                       \
    " FROM json_array_elements($3::json) WITH ORDINALITY AS m(v, ord)"                            \
    " ON CONFLICT(job, rank) DO UPDATE SET attempt = EXCLUDED.attempt,"                           \
    " node = EXCLUDED.node, devices = EXCLUDED.devices, state = EXCLUDED.state,"                  \
    " exit_code = EXCLUDED.exit_code, started = EXCLUDED.started,"                                \
    " finished = EXCLUDED.finished, assignment = EXCLUDED.assignment"

#define UPSERT_JOB                                                                         \
    "INSERT INTO jobs(" JOB_COLS ") VALUES(" JOB_PARAMS ") ON CONFLICT(seq) DO UPDATE SET" \
    " id = EXCLUDED.id, name = EXCLUDED.name, state = EXCLUDED.state,"                     \
    " attempt = EXCLUDED.attempt, restarts = EXCLUDED.restarts, spec = EXCLUDED.spec,"     \
    " members = EXCLUDED.members, result = EXCLUDED.result, error = EXCLUDED.error,"       \
    " plan = EXCLUDED.plan, exit_code = EXCLUDED.exit_code, created = EXCLUDED.created,"   \
    " updated = EXCLUDED.updated, not_before = EXCLUDED.not_before,"                       \
    " owner = EXCLUDED.owner, idem_key = EXCLUDED.idem_key, idem_hash = EXCLUDED.idem_hash"

/* Whether the members text is a JSON array with at least one element. */
static bool has_members(const char *members)
{
    json_t *m = members ? json_loads(members, 0, NULL) : NULL;
    bool any = json_is_array(m) && json_array_size(m) > 0;
    json_decref(m);
    return any;
}

/* The job's row, its members and (with a reason) its attempt, all or
 * nothing, in one round trip: a transaction (in a batch, a savepoint)
 * sent as one pipeline. */
static px_status update_job(void *self, const px__job_row *row, const char *reason, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0}, m = {0}, a = {0};
    bind_job(&q, row);
    text(&m, row->id);
    i64(&m, row->attempt);
    text(&m, row->members);
    text(&m, row->assignments);
    text(&a, row->id);
    i64(&a, row->attempt);
    text(&a, reason);
    i64(&a, px_wall_time());
    px__pg_stmt s[5];
    int n = 0;
    pthread_mutex_lock(&st->mu);
    bool batch = st->batch;
    s[n++] = (px__pg_stmt){batch ? "SAVEPOINT px_t" : "BEGIN", NULL};
    s[n++] = (px__pg_stmt){UPSERT_JOB, &q};
    if (has_members(row->members))
        s[n++] = (px__pg_stmt){WRITE_MEMBERS, &m};
    if (reason)
        s[n++] = (px__pg_stmt){"INSERT INTO attempts(job, attempt, reason, at) VALUES($1,$2,$3,$4)"
                               " ON CONFLICT(job, attempt) DO UPDATE SET reason = EXCLUDED.reason,"
                               " at = EXCLUDED.at",
                               &a};
    s[n++] = (px__pg_stmt){batch ? "RELEASE SAVEPOINT px_t" : "COMMIT", NULL};
    px_status rc = px__pg_pipeline(st, s, n, -1, NULL, "update job", err);
    if (rc != PX_OK && !st->lost)
        run(st, batch ? "ROLLBACK TO SAVEPOINT px_t; RELEASE SAVEPOINT px_t" : "ROLLBACK", NULL,
            NULL, "rollback", NULL);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Statements sent in one pipeline by the writes of many rows: their
 * results are small, so the server never waits on a full socket for the
 * client to read while the client writes. */
#define PIPELINE_MAX 512

/* A test's hook, called with the fenced transaction's writes sent and
 * its commit not yet sent (px__store_pg_set_fence_hook). */
static void (*fence_hook)(void *ud);
static void *fence_hook_ud;

void px__store_pg_set_fence_hook(void (*hook)(void *ud), void *ud)
{
    fence_hook = hook;
    fence_hook_ud = ud;
}

/* Runs the statements (after `open`, before `close`) all or nothing, in
 * pipelines of PIPELINE_MAX; fence (NULL: none) goes first, right after
 * the opening.  The caller holds st->mu. */
static px_status run_group(px__pg *st, const px__pg_stmt *fence, px__pg_stmt *s, int n,
                           const char *what, px_err *err)
{
    bool batch = st->batch;
    px__pg_stmt open = {batch ? "SAVEPOINT px_g" : "BEGIN", NULL};
    px__pg_stmt close = {batch ? "RELEASE SAVEPOINT px_g" : "COMMIT", NULL};
    void (*hook)(void *) = fence ? fence_hook : NULL;
    void *hook_ud = fence_hook_ud;
    bool hooked = hook != NULL;
    /* The opening goes with the first pipeline and the closing with the
     * last: a group of up to PIPELINE_MAX rows is one round trip. */
    px__pg_stmt *part = malloc(sizeof *part * (PIPELINE_MAX + 3));
    if (!part)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status rc = PX_OK;
    for (int at = 0; rc == PX_OK && (at < n || at == 0); at += PIPELINE_MAX) {
        int k = 0, m = PX_MIN(PIPELINE_MAX, n - at);
        if (at == 0) {
            part[k++] = open;
            if (fence)
                part[k++] = *fence;
        }
        memcpy(part + k, s + at, sizeof *part * (size_t)PX_MAX(m, 0));
        k += PX_MAX(m, 0);
        if (at + m >= n && !hooked)
            part[k++] = close;
        rc = px__pg_pipeline(st, part, k, -1, NULL, what, err);
    }
    free(part);
    if (rc == PX_OK && hooked) {
        hook(hook_ud);
        rc = run(st, close.sql, NULL, NULL, what, err);
    }
    if (rc != PX_OK && !st->lost)
        run(st, batch ? "ROLLBACK TO SAVEPOINT px_g; RELEASE SAVEPOINT px_g" : "ROLLBACK", NULL,
            NULL, "rollback", NULL);
    return rc;
}

/* The statements that write rows (job and members, two per row), in s
 * with their parameters in q (2n of each); their number. */
static int job_writes(const px__job_row *rows, int n, px__pgq *q, px__pg_stmt *s)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        px__pgq *j = &q[2 * i], *m = &q[2 * i + 1];
        bind_job(j, &rows[i]);
        s[k++] = (px__pg_stmt){UPSERT_JOB, j};
        if (has_members(rows[i].members)) {
            text(m, rows[i].id);
            i64(m, rows[i].attempt);
            text(m, rows[i].members);
            text(m, rows[i].assignments);
            s[k++] = (px__pg_stmt){WRITE_MEMBERS, m};
        }
    }
    return k;
}

static px_status update_jobs(void *self, const px__job_row *rows, int n, px_err *err)
{
    px__pg *st = self;
    if (n <= 0)
        return PX_OK;
    px__pgq *q = calloc((size_t)n * 2, sizeof *q);
    px__pg_stmt *s = calloc((size_t)n * 2, sizeof *s);
    if (!q || !s) {
        free(q);
        free(s);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    int k = job_writes(rows, n, q, s);
    pthread_mutex_lock(&st->mu);
    px_status rc = run_group(st, NULL, s, k, "update jobs", err);
    pthread_mutex_unlock(&st->mu);
    free(q);
    free(s);
    return rc;
}

/* The connection of fenced writes, made (again) when missing or lost: a
 * new session is safe, since each transaction on it checks the epoch.
 * The caller holds f->mu when f exists. */
static px_status fenced_conn(px__pg *st, px_err *err)
{
    px__pg *f = st->fenced;
    if (f->conn && !f->lost)
        return PX_OK;
    PQfinish(f->conn);
    forget_prepared(f);
    f->lost = false;
    f->conn = px__pg_connect(st, "fenced writes", err);
    return f->conn ? PX_OK : PX_EIO;
}

static px_status fenced_update_jobs(void *self, int64_t epoch, const px__job_row *rows, int n,
                                    px_err *err)
{
    px__pg *st = self;
    if (n <= 0)
        return PX_OK;
    pthread_mutex_lock(&st->mu);
    if (!st->fenced) {
        px__pg *f = calloc(1, sizeof *f);
        if (f && (f->where = px_strdup(st->where))) {
            pthread_mutex_init(&f->mu, NULL);
            st->fenced = f;
        } else {
            free(f);
        }
    }
    px__pg *f = st->fenced;
    pthread_mutex_unlock(&st->mu);
    if (!f)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px__pgq *q = calloc((size_t)n * 2 + 1, sizeof *q);
    px__pg_stmt *s = calloc((size_t)n * 2, sizeof *s);
    if (!q || !s) {
        free(q);
        free(s);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    int k = job_writes(rows, n, q + 1, s);
    i64(&q[0], epoch);
    px__pg_stmt fence = {"SELECT plexus_fence($1)", &q[0]};
    pthread_mutex_lock(&f->mu);
    px_status rc = fenced_conn(st, err);
    if (rc == PX_OK)
        rc = run_group(f, &fence, s, k, "update jobs (fenced by the lease)", err);
    pthread_mutex_unlock(&f->mu);
    free(q);
    free(s);
    return rc;
}

static px_status put_explanations(void *self, const px__explanation_row *rows, int n, px_err *err)
{
    px__pg *st = self;
    if (n <= 0)
        return PX_OK;
    px__pgq *q = calloc((size_t)n, sizeof *q);
    px__pg_stmt *s = calloc((size_t)n, sizeof *s);
    if (!q || !s) {
        free(q);
        free(s);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        text(&q[i], rows[i].job);
        i64(&q[i], rows[i].attempt);
        text(&q[i], rows[i].json);
        i64(&q[i], px_wall_time());
        s[i] = (px__pg_stmt){"INSERT INTO explanations(job, attempt, body, at) VALUES($1,$2,$3,$4)"
                             " ON CONFLICT(job, attempt) DO UPDATE SET body = EXCLUDED.body,"
                             " at = EXCLUDED.at",
                             &q[i]};
    }
    pthread_mutex_lock(&st->mu);
    px_status rc = run_group(st, NULL, s, n, "put explanations", err);
    pthread_mutex_unlock(&st->mu);
    free(q);
    free(s);
    return rc;
}

static px_status get_job(void *self, const char *id, px__job_row *out, px_err *err)
{
    px__pg *st = self;
    memset(out, 0, sizeof *out);
    px__pgq q = {0};
    text(&q, id);
    PGresult *r;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, "SELECT " JOB_COLS " FROM jobs WHERE id = $1", &q, &r, "get job", err);
    pthread_mutex_unlock(&st->mu);
    if (rc != PX_OK)
        return rc;
    if (PQntuples(r) == 1)
        read_job(r, 0, out);
    else
        rc = px_err_set(err, PX_ENOTFOUND, "no job \"%.64s\"", id);
    PQclear(r);
    return rc;
}

static px_status each_job(PGresult *r, px__job_cb cb, void *ud)
{
    for (int i = 0; i < PQntuples(r); i++) {
        px__job_row row;
        read_job(r, i, &row);
        cb(&row, ud);
        px__job_row_release(&row);
    }
    PQclear(r);
    return PX_OK;
}

static px_status list_jobs(void *self, const char *state, const char *owner, int limit,
                           px__job_cb cb, void *ud, px_err *err)
{
    px__pg *st = self;
    const char *sql =
        !state || !*state ? "SELECT " JOB_COLS " FROM jobs WHERE ($2::text IS NULL OR state = $2)"
                            " AND ($3::text IS NULL OR owner = $3) ORDER BY seq DESC LIMIT $1"
        : strcmp(state, "active") == 0
            ? "SELECT " JOB_COLS " FROM jobs WHERE state IN ('queued','assigned','running')"
              " AND ($2::text IS NULL OR state = $2)"
              " AND ($3::text IS NULL OR owner = $3) ORDER BY seq DESC LIMIT $1"
            : "SELECT " JOB_COLS " FROM jobs WHERE state = $2 AND ($3::text IS NULL OR"
              " owner = $3) ORDER BY seq DESC LIMIT $1";
    px__pgq q = {0};
    i64(&q, limit);
    text(&q, state && *state && strcmp(state, "active") != 0 ? state : NULL);
    text(&q, owner);
    PGresult *r;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, sql, &q, &r, "list jobs", err);
    pthread_mutex_unlock(&st->mu);
    return rc != PX_OK ? rc : each_job(r, cb, ud);
}

static px_status find_idempotent(void *self, const char *owner, const char *key, px__job_row *out,
                                 px_err *err)
{
    px__pg *st = self;
    memset(out, 0, sizeof *out);
    px__pgq q = {0};
    text(&q, owner);
    text(&q, key);
    PGresult *r;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "SELECT " JOB_COLS " FROM jobs WHERE idem_key = $2 AND"
                       " (owner = $1 OR ($1::text IS NULL AND owner IS NULL))",
                       &q, &r, "find idempotent job", err);
    pthread_mutex_unlock(&st->mu);
    if (rc != PX_OK)
        return rc;
    if (PQntuples(r) >= 1)
        read_job(r, 0, out);
    else
        rc = px_err_set(err, PX_ENOTFOUND, "no job with that idempotency key");
    PQclear(r);
    return rc;
}

/* ---- the scheduler lease ---- */

static px_status lease(void *self, bool *held, px_err *err)
{
    px__pg *st = self;
    PGresult *r;
    pthread_mutex_lock(&st->mu);
    px_status rc;
    if (st->lease_held) {
        /* Still connected means still held: the lock lives as long as the
         * session does. */
        rc = run(st, "SELECT 1", NULL, NULL, "scheduler lease", err);
        if (rc != PX_OK)
            st->lease_held = false;
    } else {
        rc =
            run(st, "SELECT pg_try_advisory_lock(" LEASE_KEY ")", NULL, &r, "scheduler lease", err);
        if (rc == PX_OK) {
            st->lease_held = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
            PQclear(r);
        }
        /* A new holder takes the next epoch: the increment waits for the
         * fenced writes in flight, and fences out those of every earlier
         * holder. */
        if (rc == PX_OK && st->lease_held) {
            rc = run(st, "UPDATE lease SET epoch = epoch + 1 WHERE one = 1 RETURNING epoch", NULL,
                     &r, "scheduler lease epoch", err);
            if (rc == PX_OK) {
                st->epoch = px__pg_int(r, 0, 0);
                PQclear(r);
            } else {
                st->lease_held = false;
                if (!st->lost)
                    run(st, "SELECT pg_advisory_unlock(" LEASE_KEY ")", NULL, NULL,
                        "scheduler lease", NULL);
            }
        }
    }
    if (!st->lease_held)
        st->epoch = 0;
    *held = st->lease_held;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Claims up to max queued jobs no scheduler has taken in yet (those other
 * replicas accepted), oldest first: the rows are locked FOR UPDATE SKIP
 * LOCKED, so a row another transaction holds is left for the next call
 * rather than waited for, marked adopted and handed to cb. */
static px_status lease_epoch(void *self, int64_t *epoch, px_err *err)
{
    (void)err;
    px__pg *st = self;
    pthread_mutex_lock(&st->mu);
    *epoch = st->lease_held ? st->epoch : 0;
    pthread_mutex_unlock(&st->mu);
    return PX_OK;
}

static px_status claim_jobs(void *self, int max, px__job_cb cb, void *ud, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    i64(&q, max);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    if (begin(st, err) != PX_OK)
        goto fail_unlock;
    if (run(st,
            "UPDATE jobs SET adopted = true WHERE seq IN (SELECT seq FROM jobs WHERE NOT adopted"
            " ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING " JOB_COLS,
            &q, &r, "claim jobs", err) != PX_OK ||
        commit(st, err) != PX_OK)
        goto fail;
    pthread_mutex_unlock(&st->mu);
    return each_job(r, cb, ud);
fail:
    PQclear(r);
    rollback(st);
fail_unlock:
    pthread_mutex_unlock(&st->mu);
    return err ? err->code : PX_EIO;
}

/* The row and its notification in one statement, as insert_job: a
 * notification always means a committed request. */
static px_status request_cancel(void *self, const char *job, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, job);
    i64(&q, px_wall_time());
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "WITH c AS (INSERT INTO cancel_requests(job, at) VALUES($1, $2)"
                       " ON CONFLICT (job) DO NOTHING RETURNING job)"
                       " SELECT pg_notify('plexus_jobs', job) FROM c",
                       &q, NULL, "request cancellation", err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status take_cancels(void *self, int max, px__name_cb cb, void *ud, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    i64(&q, max);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "DELETE FROM cancel_requests WHERE job IN (SELECT job FROM cancel_requests"
                       " ORDER BY at, job LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING job",
                       &q, &r, "take cancellations", err);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), ud);
    PQclear(r);
    return rc;
}

/* A batch: one transaction for the writes of a scheduling pass, so that
 * its decisions cost one commit (one flush of the log) rather than one
 * each.  The server lock is held from batch_begin to batch_end, so no
 * reply and no agent sees a write of the batch before it is committed. */
static px_status batch_begin(void *self, px_err *err)
{
    px__pg *st = self;
    pthread_mutex_lock(&st->mu);
    px_status rc = st->batch ? PX_OK : run(st, "BEGIN", NULL, NULL, "begin batch", err);
    if (rc == PX_OK) {
        st->batch = true;
        st->depth = 0;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status batch_end(void *self, px_err *err)
{
    px__pg *st = self;
    pthread_mutex_lock(&st->mu);
    px_status rc = PX_OK;
    if (st->batch) {
        st->batch = false;
        rc = run(st, "COMMIT", NULL, NULL, "commit batch", err);
        if (rc != PX_OK && !st->lost)
            run(st, "ROLLBACK", NULL, NULL, "rollback batch", NULL);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* The settings of every session of the store, whatever the role's or the
 * database's defaults, applied to each new connection and again after a
 * reconnection: acknowledged means on the primary's disk, and notices
 * stay out of the server's output. */
static px_status configure_session(px__pg *st, PGconn *c, const char *what, px_err *err)
{
    PGresult *r = PQexec(c, "SET synchronous_commit = on; SET client_min_messages = warning");
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    px_status rc = PX_OK;
    if (!ok) {
        char line[200];
        rc = px_err_set(
            err, PX_EIO, "PostgreSQL %s: %s: configuring the session: %s", st->where, what,
            one_line(r && *PQresultErrorMessage(r) ? PQresultErrorMessage(r) : PQerrorMessage(c),
                     line, sizeof line));
    }
    PQclear(r);
    return rc;
}

PGconn *px__pg_connect(px__pg *st, const char *what, px_err *err)
{
    PGconn *c = PQconnectdb(st->spec);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        char line[200];
        px_err_set(err, PX_EIO, "PostgreSQL %s: %s: cannot connect: %s", st->where, what,
                   one_line(c ? PQerrorMessage(c) : "out of memory", line, sizeof line));
        PQfinish(c);
        return NULL;
    }
    if (configure_session(st, c, what, err) != PX_OK) {
        PQfinish(c);
        return NULL;
    }
    return c;
}

px_status px__store_pg_setting(void *self, const char *name, char *out, size_t n, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, name);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, "SELECT current_setting($1)", &q, &r, "read a setting", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_OK)
        snprintf(out, n, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

/* ---- wake-ups: jobs other replicas accepted ---- */

/* Drops the listening connection after a failure, saying why. */
static px_status listen_lost(px__pg *st, const char *what, px_err *err)
{
    char line[200];
    px_status rc = px_err_set(
        err, PX_EIO, "PostgreSQL %s: %s: %s", st->where, what,
        one_line(st->listen ? PQerrorMessage(st->listen) : "out of memory", line, sizeof line));
    PQfinish(st->listen);
    st->listen = NULL;
    return rc;
}

/* Inserts by other replicas notify the channel plexus_jobs in the same
 * transaction (insert_job), so a notification means a committed row.  A
 * connection of its own listens: the store's connection is shared under
 * its lock, and a wait must not hold it. */
static px_status wait_jobs(void *self, int timeout_ms, bool *woken, px_err *err)
{
    px__pg *st = self;
    *woken = false;
    if (!st->listen) {
        st->listen = PQconnectdb(st->spec);
        if (!st->listen || PQstatus(st->listen) != CONNECTION_OK)
            return listen_lost(st, "cannot connect to listen for jobs", err);
        PGresult *r = PQexec(st->listen, "LISTEN plexus_jobs");
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok)
            return listen_lost(st, "LISTEN plexus_jobs", err);
        /* Whatever was accepted before the LISTEN notified nobody. */
        *woken = true;
        return PX_OK;
    }
    for (int round = 0; round < 2; round++) {
        PGnotify *n;
        while ((n = PQnotifies(st->listen))) {
            *woken = true;
            PQfreemem(n);
        }
        if (*woken || round == 1)
            break;
        struct pollfd p = {.fd = PQsocket(st->listen), .events = POLLIN};
        int ready = poll(&p, 1, timeout_ms);
        if (ready < 0 && errno != EINTR)
            return listen_lost(st, "waiting for jobs", err);
        if (ready > 0 && !PQconsumeInput(st->listen))
            return listen_lost(st, "listening for jobs", err);
    }
    return PX_OK;
}

static px__store_ops pg_ops = {
    .version = 13,
    .close = pg_close,
    .insert_job = insert_job,
    .update_job = update_job,
    .get_job = get_job,
    .list_jobs = list_jobs,
    .find_idempotent = find_idempotent,
    .lease = lease,
    .claim_jobs = claim_jobs,
    .batch_begin = batch_begin,
    .batch_end = batch_end,
    .wait_jobs = wait_jobs,
    .update_jobs = update_jobs,
    .put_explanations = put_explanations,
    .request_cancel = request_cancel,
    .take_cancels = take_cancels,
    .lease_epoch = lease_epoch,
    .fenced_update_jobs = fenced_update_jobs,
};
static pthread_once_t pg_ops_once = PTHREAD_ONCE_INIT;

static void fill_ops(void)
{
    px__pg_fill_record_ops(&pg_ops);
    px__pg_fill_deploy_ops(&pg_ops);
    px__pg_fill_blob_ops(&pg_ops);
    px__pg_fill_node_ops(&pg_ops);
}

bool px__store_is_pg(const char *spec)
{
    return spec &&
           (px_str_starts_with(spec, "postgres://") || px_str_starts_with(spec, "postgresql://"));
}

/* The database a connection string names, for messages: host, port and
 * database, never the user's password. */
static char *describe(const PQconninfoOption *opts)
{
    const char *host = "", *port = "", *db = "";
    for (const PQconninfoOption *o = opts; o && o->keyword; o++) {
        if (!o->val)
            continue;
        if (!strcmp(o->keyword, "host"))
            host = o->val;
        else if (!strcmp(o->keyword, "port"))
            port = o->val;
        else if (!strcmp(o->keyword, "dbname"))
            db = o->val;
    }
    return px_asprintf("%s%s%s/%s", *host ? host : "(default host)", *port ? ":" : "", port, db);
}

px_status px__store_pg_open(const char *spec, px__store *out, px_err *err)
{
    pthread_once(&pg_ops_once, fill_ops);
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(spec, &perr);
    if (!opts) {
        char line[200];
        px_status rc = px_err_set(err, PX_EINVAL,
                                  "--store: not a PostgreSQL connection URI (%s); expected "
                                  "postgres://USER@HOST:PORT/DATABASE",
                                  one_line(perr ? perr : "out of memory", line, sizeof line));
        PQfreemem(perr);
        return rc;
    }
    for (const PQconninfoOption *o = opts; o->keyword; o++)
        if (!strcmp(o->keyword, "password") && o->val && *o->val) {
            PQconninfoFree(opts);
            return px_err_set(err, PX_EAUTH,
                              "--store: the URI carries a password, which anyone can read "
                              "in the process list; leave it out and put it in ~/.pgpass "
                              "or the file PGPASSFILE names (chmod 600)");
        }
    px__pg *st = calloc(1, sizeof *st);
    if (!st || !(st->where = describe(opts))) {
        PQconninfoFree(opts);
        free(st);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    PQconninfoFree(opts);
    pthread_mutex_init(&st->mu, NULL);
    if (!(st->spec = px_strdup(spec))) {
        pg_close(st);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    st->conn = PQconnectdb(spec);
    if (!st->conn || PQstatus(st->conn) != CONNECTION_OK) {
        char line[200];
        px_status rc = px_err_set(
            err, PX_EIO, "PostgreSQL %s: cannot connect: %s", st->where,
            one_line(st->conn ? PQerrorMessage(st->conn) : "out of memory", line, sizeof line));
        pg_close(st);
        return rc;
    }
    if (configure_session(st, st->conn, "configure", err) != PX_OK || migrate(st, err) != PX_OK) {
        pg_close(st);
        return err ? err->code : PX_EIO;
    }
    out->ops = &pg_ops;
    out->self = st;
    return PX_OK;
}
