/* The SQLite store: one file, WAL, synchronous=FULL, numbered migrations,
 * and the job rows.  Every write is committed before it returns, so an
 * acknowledged submission survives a crash of the server; a write that
 * fails (a full disk) rolls back and says so. */
#include "fleet/store_sqlite_impl.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

/* Migrations, applied in order, each in one transaction; never edit one
 * that has shipped, add the next. */
static const char *const migrations[] = {
    /* 1: the first schema. */
    "CREATE TABLE tokens(hash TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT);"
    "CREATE TABLE nodes(name TEXT PRIMARY KEY, registration TEXT NOT NULL,"
    "  state TEXT NOT NULL, last_seen INTEGER NOT NULL);"
    "CREATE TABLE jobs(seq INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, name TEXT,"
    "  state TEXT NOT NULL, attempt INTEGER NOT NULL, restarts INTEGER NOT NULL,"
    "  spec TEXT NOT NULL, members TEXT, result TEXT, error TEXT, plan TEXT,"
    "  exit_code INTEGER, created INTEGER NOT NULL, updated INTEGER NOT NULL,"
    "  not_before REAL NOT NULL DEFAULT 0);"
    "CREATE INDEX jobs_state ON jobs(state);"
    "CREATE TABLE members(job TEXT NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL,"
    "  node TEXT, devices TEXT, state TEXT, exit_code INTEGER, started INTEGER,"
    "  finished INTEGER, PRIMARY KEY(job, rank));"
    "CREATE TABLE attempts(job TEXT NOT NULL, attempt INTEGER NOT NULL, reason TEXT,"
    "  at INTEGER NOT NULL, PRIMARY KEY(job, attempt));"
    "CREATE TABLE logs(job TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL,"
    "  rank INTEGER NOT NULL, stream TEXT NOT NULL, data BLOB NOT NULL, at INTEGER NOT NULL,"
    "  PRIMARY KEY(job, seq));"
    "CREATE TABLE artifacts(job TEXT NOT NULL, name TEXT NOT NULL, size INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL, rank INTEGER, attempt INTEGER, created INTEGER NOT NULL,"
    "  PRIMARY KEY(job, name));"
    "CREATE TABLE explanations(job TEXT NOT NULL, attempt INTEGER NOT NULL, body TEXT NOT NULL,"
    "  at INTEGER NOT NULL, PRIMARY KEY(job, attempt));",
    /* 2: the last live report of each node. */
    "CREATE TABLE heartbeats(node TEXT PRIMARY KEY, at INTEGER NOT NULL, live TEXT);",
    /* 3: users own jobs, submissions carry idempotency keys, nodes have
     * credentials of their own; the token file is configuration and is no
     * longer copied here. */
    "ALTER TABLE jobs ADD COLUMN owner TEXT;"
    "ALTER TABLE jobs ADD COLUMN idem_key TEXT;"
    "ALTER TABLE jobs ADD COLUMN idem_hash TEXT;"
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs(owner, idem_key) WHERE idem_key IS NOT NULL;"
    "CREATE INDEX jobs_owner ON jobs(owner, seq);"
    "CREATE TABLE node_credentials(hash TEXT PRIMARY KEY, node TEXT NOT NULL,"
    "  created INTEGER NOT NULL);"
    "CREATE INDEX node_credentials_node ON node_credentials(node);"
    "CREATE TABLE revoked_nodes(node TEXT PRIMARY KEY, at INTEGER NOT NULL);"
    "DROP TABLE tokens;",
    /* 4: models deployed across the fleet, by name. */
    "CREATE TABLE deployments(name TEXT PRIMARY KEY, owner TEXT, model TEXT NOT NULL,"
    "  spec TEXT NOT NULL, state TEXT NOT NULL, plan TEXT, incidents TEXT,"
    "  created INTEGER NOT NULL, updated INTEGER NOT NULL);"
    "CREATE INDEX deployments_owner ON deployments(owner, name);",
    /* 5: what a deployment's front end reports (serving figures and
     * incidents), a ring per deployment and kind, gone with the deployment. */
    "CREATE TABLE deployment_records(deployment TEXT NOT NULL"
    "  REFERENCES deployments(name) ON DELETE CASCADE, kind TEXT NOT NULL,"
    "  seq INTEGER NOT NULL, at INTEGER NOT NULL, body TEXT NOT NULL,"
    "  PRIMARY KEY(deployment, kind, seq));",
};

int px__store_sqlite_schema_version(void)
{
    return (int)PX_ARRAY_LEN(migrations);
}

px_status px__sql_fail(px__sql *st, px_err *err, const char *what)
{
    return px_err_set(err, PX_EIO, "%s: %s: %s", st->path, what, sqlite3_errmsg(st->db));
}

px_status px__sql_exec(px__sql *st, const char *sql, px_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        px_err_set(err, PX_EIO, "%s: %s", st->path, msg ? msg : sqlite3_errmsg(st->db));
        sqlite3_free(msg);
        return PX_EIO;
    }
    return PX_OK;
}

px_status px__sql_prepare(px__sql *st, const char *sql, sqlite3_stmt **out, px_err *err)
{
    if (sqlite3_prepare_v2(st->db, sql, -1, out, NULL) != SQLITE_OK)
        return px__sql_fail(st, err, "prepare");
    return PX_OK;
}

void px__sql_bind_text(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, i);
}

char *px__sql_col_text(sqlite3_stmt *s, int i)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    return t ? px_strdup((const char *)t) : NULL;
}
#define sql_fail  px__sql_fail
#define exec      px__sql_exec
#define prepare   px__sql_prepare
#define bind_text px__sql_bind_text
#define col_text  px__sql_col_text

static px_status migrate(px__sql *st, px_err *err)
{
    if (exec(st,
             "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL,"
             " applied INTEGER NOT NULL)",
             err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *q;
    if (prepare(st, "SELECT COALESCE(MAX(version), 0) FROM schema_version", &q, err) != PX_OK)
        return PX_EIO;
    int have = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int(q, 0) : 0;
    sqlite3_finalize(q);
    if (have > (int)PX_ARRAY_LEN(migrations))
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: schema version %d is newer than this plexus knows (%zu); "
                          "run a newer plexus",
                          st->path, have, PX_ARRAY_LEN(migrations));
    for (int v = have + 1; v <= (int)PX_ARRAY_LEN(migrations); v++) {
        char stamp[128];
        snprintf(stamp, sizeof stamp,
                 "INSERT INTO schema_version(version, applied) VALUES(%d, %lld);", v,
                 (long long)px_wall_time());
        if (exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
            return PX_EIO;
        if (exec(st, migrations[v - 1], err) != PX_OK || exec(st, stamp, err) != PX_OK) {
            exec(st, "ROLLBACK", NULL);
            return px_err_prefix(err, PX_EIO, "migration %d: ", v);
        }
        if (exec(st, "COMMIT", err) != PX_OK)
            return PX_EIO;
    }
    return PX_OK;
}

static void sql_close(void *self)
{
    px__sql *st = self;
    if (!st)
        return;
    sqlite3_close_v2(st->db);
    free(st->path);
    free(st);
}

void px__job_row_release(px__job_row *r)
{
    if (!r)
        return;
    free(r->id);
    free(r->name);
    free(r->state);
    free(r->spec);
    free(r->members);
    free(r->result);
    free(r->error);
    free(r->plan);
    free(r->owner);
    free(r->idem_key);
    free(r->idem_hash);
    free(r->assignments);
    memset(r, 0, sizeof *r);
}

px_status px__job_row_copy(const px__job_row *in, px__job_row *out, px_err *err)
{
    *out = *in;
    char **fields[] = {&out->id,      &out->name,     &out->state,     &out->spec,
                       &out->members, &out->result,   &out->error,     &out->plan,
                       &out->owner,   &out->idem_key, &out->idem_hash, &out->assignments};
    bool ok = true;
    for (size_t i = 0; i < PX_ARRAY_LEN(fields); i++)
        if (*fields[i] && !(*fields[i] = px_strdup(*fields[i])))
            ok = false;
    if (ok)
        return PX_OK;
    /* Free only what was duplicated: a field equal to the input's was not. */
    const char *const orig[] = {in->id,      in->name,     in->state,     in->spec,
                                in->members, in->result,   in->error,     in->plan,
                                in->owner,   in->idem_key, in->idem_hash, in->assignments};
    for (size_t i = 0; i < PX_ARRAY_LEN(fields); i++)
        if (*fields[i] != orig[i])
            free(*fields[i]);
    memset(out, 0, sizeof *out);
    return px_err_set(err, PX_ENOMEM, "out of memory");
}

#define JOB_COLS                                                                               \
    "seq, id, name, state, attempt, restarts, spec, members, result, error, plan, exit_code, " \
    "created, updated, not_before, owner, idem_key, idem_hash"
#define JOB_PARAMS "?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?"

static void bind_job(sqlite3_stmt *s, const px__job_row *r)
{
    sqlite3_bind_int64(s, 1, r->seq);
    bind_text(s, 2, r->id);
    bind_text(s, 3, r->name);
    bind_text(s, 4, r->state);
    sqlite3_bind_int(s, 5, r->attempt);
    sqlite3_bind_int(s, 6, r->restarts);
    bind_text(s, 7, r->spec);
    bind_text(s, 8, r->members);
    bind_text(s, 9, r->result);
    bind_text(s, 10, r->error);
    bind_text(s, 11, r->plan);
    if (r->exit_code == INT_MIN)
        sqlite3_bind_null(s, 12);
    else
        sqlite3_bind_int(s, 12, r->exit_code);
    sqlite3_bind_int64(s, 13, r->created);
    sqlite3_bind_int64(s, 14, r->updated);
    sqlite3_bind_double(s, 15, r->not_before);
    bind_text(s, 16, r->owner);
    bind_text(s, 17, r->idem_key);
    bind_text(s, 18, r->idem_hash);
}

static void read_job(sqlite3_stmt *s, px__job_row *r)
{
    r->assignments = NULL; /* written, never read back */
    r->seq = sqlite3_column_int64(s, 0);
    r->id = col_text(s, 1);
    r->name = col_text(s, 2);
    r->state = col_text(s, 3);
    r->attempt = sqlite3_column_int(s, 4);
    r->restarts = sqlite3_column_int(s, 5);
    r->spec = col_text(s, 6);
    r->members = col_text(s, 7);
    r->result = col_text(s, 8);
    r->error = col_text(s, 9);
    r->plan = col_text(s, 10);
    r->exit_code = sqlite3_column_type(s, 11) == SQLITE_NULL ? INT_MIN : sqlite3_column_int(s, 11);
    r->created = sqlite3_column_int64(s, 12);
    r->updated = sqlite3_column_int64(s, 13);
    r->not_before = sqlite3_column_double(s, 14);
    r->owner = col_text(s, 15);
    r->idem_key = col_text(s, 16);
    r->idem_hash = col_text(s, 17);
}

static px_status insert_job(void *self, px__job_row *row, px_err *err)
{
    px__sql *st = self;
    if (exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *s = NULL;
    if (prepare(st, "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs", &s, err))
        goto fail;
    if (sqlite3_step(s) != SQLITE_ROW) {
        sql_fail(st, err, "next job number");
        goto fail;
    }
    row->seq = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    s = NULL;
    if (!row->id) {
        row->id = px_asprintf("j-%06" PRId64, row->seq);
        if (!row->id) {
            px_err_set(err, PX_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (prepare(st, "INSERT INTO jobs(" JOB_COLS ") VALUES(" JOB_PARAMS ")", &s, err))
        goto fail;
    bind_job(s, row);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_CONSTRAINT && row->idem_key) {
        px_err_set(err, PX_EEXIST, "Idempotency-Key \"%.64s\" is already used", row->idem_key);
        goto fail;
    }
    if (rc != SQLITE_DONE) {
        sql_fail(st, err, "insert job");
        goto fail;
    }
    sqlite3_finalize(s);
    if (exec(st, "COMMIT", err) != PX_OK)
        goto fail_rollback;
    return PX_OK;
fail:
    sqlite3_finalize(s);
fail_rollback:
    exec(st, "ROLLBACK", NULL);
    return err ? err->code : PX_EIO;
}

static px_status write_members(px__sql *st, const px__job_row *row, px_err *err)
{
    json_t *m = row->members ? json_loads(row->members, 0, NULL) : NULL;
    sqlite3_stmt *s;
    if (prepare(st,
                "INSERT OR REPLACE INTO members(job, rank, attempt, node, devices, state,"
                " exit_code, started, finished) VALUES(?,?,?,?,?,?,?,?,?)",
                &s, err)) {
        json_decref(m);
        return PX_EIO;
    }
    px_status ret = PX_OK;
    for (size_t i = 0; json_is_array(m) && i < json_array_size(m); i++) {
        const json_t *x = json_array_get(m, i);
        char *devs = json_dumps(json_object_get(x, "devices"), JSON_COMPACT | JSON_ENCODE_ANY);
        sqlite3_reset(s);
        sqlite3_bind_text(s, 1, row->id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 2, (sqlite3_int64)i);
        sqlite3_bind_int(s, 3, row->attempt);
        bind_text(s, 4, json_string_value(json_object_get(x, "node")));
        bind_text(s, 5, devs);
        bind_text(s, 6, json_string_value(json_object_get(x, "state")));
        const json_t *ec = json_object_get(x, "exit_code");
        if (json_is_integer(ec))
            sqlite3_bind_int64(s, 7, json_integer_value(ec));
        else
            sqlite3_bind_null(s, 7);
        sqlite3_bind_int64(s, 8, json_integer_value(json_object_get(x, "started")));
        sqlite3_bind_int64(s, 9, json_integer_value(json_object_get(x, "finished")));
        int rc = sqlite3_step(s);
        free(devs);
        if (rc != SQLITE_DONE) {
            ret = sql_fail(st, err, "write members");
            break;
        }
    }
    sqlite3_finalize(s);
    json_decref(m);
    return ret;
}

static px_status update_job(void *self, const px__job_row *row, const char *reason, px_err *err)
{
    px__sql *st = self;
    if (exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *s = NULL;
    if (prepare(st, "INSERT OR REPLACE INTO jobs(" JOB_COLS ") VALUES(" JOB_PARAMS ")", &s, err))
        goto fail;
    bind_job(s, row);
    if (sqlite3_step(s) != SQLITE_DONE) {
        sql_fail(st, err, "update job");
        goto fail;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (write_members(st, row, err) != PX_OK)
        goto fail;
    if (reason) {
        if (prepare(st, "INSERT OR REPLACE INTO attempts(job, attempt, reason, at) VALUES(?,?,?,?)",
                    &s, err))
            goto fail;
        bind_text(s, 1, row->id);
        sqlite3_bind_int(s, 2, row->attempt);
        bind_text(s, 3, reason);
        sqlite3_bind_int64(s, 4, px_wall_time());
        if (sqlite3_step(s) != SQLITE_DONE) {
            sql_fail(st, err, "record attempt");
            goto fail;
        }
        sqlite3_finalize(s);
        s = NULL;
    }
    if (exec(st, "COMMIT", err) != PX_OK)
        goto fail;
    return PX_OK;
fail:
    sqlite3_finalize(s);
    exec(st, "ROLLBACK", NULL);
    return err ? err->code : PX_EIO;
}

static px_status get_job(void *self, const char *id, px__job_row *out, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    memset(out, 0, sizeof *out);
    if (prepare(st, "SELECT " JOB_COLS " FROM jobs WHERE id = ?", &s, err))
        return PX_EIO;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        read_job(s, out);
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW)
        return PX_OK;
    if (rc == SQLITE_DONE)
        return px_err_set(err, PX_ENOTFOUND, "no job \"%.64s\"", id);
    return sql_fail(st, err, "get job");
}

static px_status list_jobs(void *self, const char *state, const char *owner, int limit,
                           px__job_cb cb, void *ud, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    /* ?3 NULL matches every owner. */
    const char *sql =
        !state || !*state ? "SELECT " JOB_COLS " FROM jobs WHERE (?3 IS NULL OR owner = ?3)"
                            " ORDER BY seq DESC LIMIT ?1"
        : strcmp(state, "active") == 0
            ? "SELECT " JOB_COLS " FROM jobs WHERE state IN ('queued','assigned','running')"
              " AND (?3 IS NULL OR owner = ?3) ORDER BY seq DESC LIMIT ?1"
            : "SELECT " JOB_COLS " FROM jobs WHERE state = ?2 AND (?3 IS NULL OR owner = ?3)"
              " ORDER BY seq DESC LIMIT ?1";
    if (prepare(st, sql, &s, err))
        return PX_EIO;
    sqlite3_bind_int(s, 1, limit);
    if (state && *state && strcmp(state, "active") != 0)
        bind_text(s, 2, state);
    bind_text(s, 3, owner);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        px__job_row r;
        read_job(s, &r);
        cb(&r, ud);
        px__job_row_release(&r);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list jobs");
}

static px_status find_idempotent(void *self, const char *owner, const char *key, px__job_row *out,
                                 px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    memset(out, 0, sizeof *out);
    if (prepare(st,
                "SELECT " JOB_COLS " FROM jobs WHERE idem_key = ?2 AND"
                " (owner = ?1 OR (?1 IS NULL AND owner IS NULL))",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, owner);
    bind_text(s, 2, key);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        read_job(s, out);
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW)
        return PX_OK;
    if (rc == SQLITE_DONE)
        return px_err_set(err, PX_ENOTFOUND, "no job with that idempotency key");
    return sql_fail(st, err, "find idempotent job");
}

static px__store_ops sqlite_ops = {
    .version = 7,
    .close = sql_close,
    .insert_job = insert_job,
    .update_job = update_job,
    .get_job = get_job,
    .list_jobs = list_jobs,
    .find_idempotent = find_idempotent,
};
static pthread_once_t sqlite_ops_once = PTHREAD_ONCE_INIT;

static void fill_ops(void)
{
    px__sql_fill_record_ops(&sqlite_ops);
    px__sql_fill_deploy_ops(&sqlite_ops);
}

/* Creates the file readable by its owner alone, or takes group and world
 * access away from one that exists (a database from before, or one made
 * under a loose umask), so that neither it nor its WAL leaks jobs' secrets:
 * SQLite gives the -wal and -shm files the database's own mode. */
static px_status secure_file(const char *path, bool create, px_err *err)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        if (!create && errno == ENOENT)
            return PX_OK;
        return px_err_set(err, PX_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    px_status st = PX_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = px_err_set(err, PX_EIO, "%s: not a regular file", path);
    else if ((sb.st_mode & 077) && fchmod(fd, sb.st_mode & 0700) != 0)
        st = px_err_set(err, PX_EIO, "%s: cannot make it private (chmod 600): %s", path,
                        strerror(errno));
    close(fd);
    return st;
}

px_status px__store_sqlite_open(const char *path, px__store *out, px_err *err)
{
    pthread_once(&sqlite_ops_once, fill_ops);
    px_status rc = secure_file(path, true, err);
    for (int i = 0; rc == PX_OK && i < 2; i++) {
        char side[PATH_MAX];
        snprintf(side, sizeof side, "%s%s", path, i ? "-shm" : "-wal");
        rc = secure_file(side, false, err);
    }
    if (rc != PX_OK)
        return rc;
    px__sql *st = calloc(1, sizeof *st);
    if (!st || !(st->path = px_strdup(path))) {
        free(st);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    /* One connection shared under the server's lock; FULLMUTEX keeps SQLite
     * safe should a caller forget. */
    if (sqlite3_open_v2(path, &st->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK) {
        rc = px_err_set(err, PX_EIO, "%s: cannot open the database: %s", path,
                        st->db ? sqlite3_errmsg(st->db) : "out of memory");
        sql_close(st);
        return rc;
    }
    sqlite3_busy_timeout(st->db, 5000);
    if (exec(st, "PRAGMA journal_mode=WAL", err) != PX_OK ||
        exec(st, "PRAGMA synchronous=FULL", err) != PX_OK ||
        exec(st, "PRAGMA foreign_keys=ON", err) != PX_OK || migrate(st, err) != PX_OK) {
        sql_close(st);
        return err ? err->code : PX_EIO;
    }
    out->ops = &sqlite_ops;
    out->self = st;
    return PX_OK;
}
