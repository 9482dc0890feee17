/* The PostgreSQL store, for several server replicas on one database:
 * numbered migrations (the SQLite store's schema in PostgreSQL's types),
 * the scheduler lease, a pass's writes as one batch, wake-ups for jobs
 * other replicas accepted, and opening the store (the connection and its
 * statements are in store_pg_conn.c, the job rows in store_pg_jobs.c).
 * Every write is committed before it returns (synchronous_commit as the
 * database is configured: on by default), so an acknowledged submission
 * survives the death of the replica that took it; a write that fails
 * rolls back and says so.  The connection string never carries a
 * password: libpq reads it from ~/.pgpass or PGPASSFILE (a file only its
 * owner can read). */
#include "fleet/store_pg_impl.h"

#include <inttypes.h>
#include <poll.h>

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

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
    px__pg_forget_prepared(st);
    pthread_mutex_destroy(&st->mu);
    free(st->where);
    free(st->spec);
    free(st);
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

static px_status lease_epoch(void *self, int64_t *epoch, px_err *err)
{
    (void)err;
    px__pg *st = self;
    pthread_mutex_lock(&st->mu);
    *epoch = st->lease_held ? st->epoch : 0;
    pthread_mutex_unlock(&st->mu);
    return PX_OK;
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

/* ---- wake-ups: jobs other replicas accepted ---- */

/* Drops the listening connection after a failure, saying why. */
static px_status listen_lost(px__pg *st, const char *what, px_err *err)
{
    char line[200];
    px_status rc =
        px_err_set(err, PX_EIO, "PostgreSQL %s: %s: %s", st->where, what,
                   px__pg_one_line(st->listen ? PQerrorMessage(st->listen) : "out of memory", line,
                                   sizeof line));
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
    .lease = lease,
    .batch_begin = batch_begin,
    .batch_end = batch_end,
    .wait_jobs = wait_jobs,
    .lease_epoch = lease_epoch,
};
static pthread_once_t pg_ops_once = PTHREAD_ONCE_INIT;

static void fill_ops(void)
{
    px__pg_fill_job_ops(&pg_ops);
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
        px_status rc =
            px_err_set(err, PX_EINVAL,
                       "--store: not a PostgreSQL connection URI (%s); expected "
                       "postgres://USER@HOST:PORT/DATABASE",
                       px__pg_one_line(perr ? perr : "out of memory", line, sizeof line));
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
        px_status rc =
            px_err_set(err, PX_EIO, "PostgreSQL %s: cannot connect: %s", st->where,
                       px__pg_one_line(st->conn ? PQerrorMessage(st->conn) : "out of memory", line,
                                       sizeof line));
        pg_close(st);
        return rc;
    }
    if (px__pg_configure_session(st, st->conn, "configure", err) != PX_OK ||
        migrate(st, err) != PX_OK) {
        pg_close(st);
        return err ? err->code : PX_EIO;
    }
    out->ops = &pg_ops;
    out->self = st;
    return PX_OK;
}
