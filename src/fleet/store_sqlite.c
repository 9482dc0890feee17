/* The SQLite store: one file, WAL, synchronous=FULL, numbered migrations.
 * Every write is committed before it returns, so an acknowledged
 * submission survives a crash of the server. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <sqlite3.h>

typedef struct sql_store {
    sqlite3 *db;
    char *path;
} sql_store;

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
};

int px__store_sqlite_schema_version(void)
{
    return (int)PX_ARRAY_LEN(migrations);
}

static px_status sql_fail(sql_store *st, px_err *err, const char *what)
{
    return px_err_set(err, PX_EIO, "%s: %s: %s", st->path, what, sqlite3_errmsg(st->db));
}

static px_status exec(sql_store *st, const char *sql, px_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        px_err_set(err, PX_EIO, "%s: %s", st->path, msg ? msg : "error");
        sqlite3_free(msg);
        return PX_EIO;
    }
    return PX_OK;
}

static px_status prepare(sql_store *st, const char *sql, sqlite3_stmt **out, px_err *err)
{
    if (sqlite3_prepare_v2(st->db, sql, -1, out, NULL) != SQLITE_OK)
        return sql_fail(st, err, "prepare");
    return PX_OK;
}

static void bind_text(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, i);
}

static char *col_text(sqlite3_stmt *s, int i)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    return t ? px_strdup((const char *)t) : NULL;
}

static px_status migrate(sql_store *st, px_err *err)
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
    sql_store *st = self;
    if (!st)
        return;
    sqlite3_close_v2(st->db);
    free(st->path);
    free(st);
}

static px_status clear_tokens(void *self, px_err *err)
{
    return exec(self, "DELETE FROM tokens", err);
}

static px_status put_token(void *self, const char *kind, const char *name, const char *hash,
                           px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "INSERT OR REPLACE INTO tokens(hash, kind, name) VALUES(?,?,?)", &s, err))
        return PX_EIO;
    bind_text(s, 1, hash);
    bind_text(s, 2, kind);
    bind_text(s, 3, name);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put token");
}

static px_status list_tokens(void *self, px__token_cb cb, void *ud, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "SELECT kind, name, hash FROM tokens", &s, err))
        return PX_EIO;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        cb((const char *)sqlite3_column_text(s, 0), (const char *)sqlite3_column_text(s, 1),
           (const char *)sqlite3_column_text(s, 2), ud);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list tokens");
}

static px_status put_node(void *self, const char *name, const char *reg, const char *state,
                          int64_t last_seen, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    /* A NULL registration changes only the state (drain, lost, back). */
    if (prepare(st,
                "INSERT INTO nodes(name, registration, state, last_seen)"
                " VALUES(?1, COALESCE(?2, '{}'), ?3, ?4) ON CONFLICT(name) DO UPDATE SET"
                " registration = COALESCE(?2, registration), state = ?3, last_seen = ?4",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, name);
    bind_text(s, 2, reg);
    bind_text(s, 3, state);
    sqlite3_bind_int64(s, 4, last_seen);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put node");
}

static px_status list_nodes(void *self, px__node_cb cb, void *ud, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "SELECT name, registration, state, last_seen FROM nodes ORDER BY rowid", &s,
                err))
        return PX_EIO;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        cb((const char *)sqlite3_column_text(s, 0), (const char *)sqlite3_column_text(s, 1),
           (const char *)sqlite3_column_text(s, 2), sqlite3_column_int64(s, 3), ud);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list nodes");
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
    memset(r, 0, sizeof *r);
}

#define JOB_COLS                                                                               \
    "seq, id, name, state, attempt, restarts, spec, members, result, error, plan, exit_code, " \
    "created, updated, not_before"

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
}

static void read_job(sqlite3_stmt *s, px__job_row *r)
{
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
}

static px_status insert_job(void *self, px__job_row *row, px_err *err)
{
    sql_store *st = self;
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
    if (prepare(st, "INSERT INTO jobs(" JOB_COLS ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", &s,
                err))
        goto fail;
    bind_job(s, row);
    if (sqlite3_step(s) != SQLITE_DONE) {
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

static px_status write_members(sql_store *st, const px__job_row *row, px_err *err)
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
    sql_store *st = self;
    if (exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *s = NULL;
    if (prepare(st,
                "INSERT OR REPLACE INTO jobs(" JOB_COLS ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                &s, err))
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
    sql_store *st = self;
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

static px_status list_jobs(void *self, const char *state, int limit, px__job_cb cb, void *ud,
                           px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    const char *sql =
        !state || !*state ? "SELECT " JOB_COLS " FROM jobs ORDER BY seq DESC LIMIT ?"
        : strcmp(state, "active") == 0
            ? "SELECT " JOB_COLS " FROM jobs WHERE state IN ('queued','assigned','running')"
              " ORDER BY seq DESC LIMIT ?"
            : "SELECT " JOB_COLS " FROM jobs WHERE state = ?2 ORDER BY seq DESC LIMIT ?1";
    if (prepare(st, sql, &s, err))
        return PX_EIO;
    sqlite3_bind_int(s, 1, limit);
    if (state && *state && strcmp(state, "active") != 0)
        bind_text(s, 2, state);
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

static px_status append_log(void *self, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err)
{
    sql_store *st = self;
    if (exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *s = NULL;
    if (prepare(st,
                "INSERT INTO logs(job, seq, attempt, rank, stream, data, at) SELECT ?1,"
                " COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4, ?5, ?6 FROM logs WHERE job = ?1"
                " RETURNING seq",
                &s, err))
        goto fail;
    bind_text(s, 1, job);
    sqlite3_bind_int(s, 2, attempt);
    sqlite3_bind_int(s, 3, rank);
    bind_text(s, 4, stream);
    sqlite3_bind_blob(s, 5, len ? data : "", (int)len, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 6, px_wall_time());
    if (sqlite3_step(s) != SQLITE_ROW) {
        sql_fail(st, err, "append log");
        goto fail;
    }
    *seq = sqlite3_column_int64(s, 0);
    sqlite3_step(s);
    sqlite3_finalize(s);
    s = NULL;
    if (exec(st, "COMMIT", err) != PX_OK)
        goto fail;
    return PX_OK;
fail:
    sqlite3_finalize(s);
    exec(st, "ROLLBACK", NULL);
    return err ? err->code : PX_EIO;
}

static px_status read_logs(void *self, const char *job, int64_t after, const char *stream,
                           size_t max_bytes, px__log_cb cb, void *ud, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "SELECT seq, stream, rank, attempt, data FROM logs WHERE job = ?1 AND"
                " seq > ?2 AND (?3 IS NULL OR stream = ?3) ORDER BY seq LIMIT 10000",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, job);
    sqlite3_bind_int64(s, 2, after);
    bind_text(s, 3, stream);
    size_t total = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        px__log_chunk c = {.seq = sqlite3_column_int64(s, 0),
                           .stream = (char *)sqlite3_column_text(s, 1),
                           .rank = sqlite3_column_int(s, 2),
                           .attempt = sqlite3_column_int(s, 3)};
        c.data = (char *)sqlite3_column_blob(s, 4);
        c.len = (size_t)sqlite3_column_bytes(s, 4);
        if (total > 0 && total + c.len > max_bytes)
            break;
        total += c.len;
        cb(&c, ud);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? PX_OK : sql_fail(st, err, "read logs");
}

static px_status put_artifact(void *self, const px__artifact_row *a, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "INSERT OR REPLACE INTO artifacts(job, name, size, sha256, rank, attempt,"
                " created) VALUES(?,?,?,?,?,?,?)",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, a->job);
    bind_text(s, 2, a->name);
    sqlite3_bind_int64(s, 3, a->size);
    bind_text(s, 4, a->sha256);
    sqlite3_bind_int(s, 5, a->rank);
    sqlite3_bind_int(s, 6, a->attempt);
    sqlite3_bind_int64(s, 7, a->created);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put artifact");
}

static px_status list_artifacts(void *self, const char *job, px__artifact_cb cb, void *ud,
                                px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "SELECT job, name, sha256, size, rank, attempt, created FROM artifacts"
                " WHERE job = ? ORDER BY name",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, job);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        px__artifact_row a = {(char *)sqlite3_column_text(s, 0), (char *)sqlite3_column_text(s, 1),
                              (char *)sqlite3_column_text(s, 2), sqlite3_column_int64(s, 3),
                              sqlite3_column_int(s, 4),          sqlite3_column_int(s, 5),
                              sqlite3_column_int64(s, 6)};
        cb(&a, ud);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list artifacts");
}

static px_status put_explanation(void *self, const char *job, int attempt, const char *json,
                                 px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "INSERT OR REPLACE INTO explanations(job, attempt, body, at) VALUES(?,?,?,?)",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, job);
    sqlite3_bind_int(s, 2, attempt);
    bind_text(s, 3, json);
    sqlite3_bind_int64(s, 4, px_wall_time());
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put explanation");
}

static px_status get_explanation(void *self, const char *job, char **out, px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    *out = NULL;
    if (prepare(st, "SELECT body FROM explanations WHERE job = ? ORDER BY attempt DESC LIMIT 1", &s,
                err))
        return PX_EIO;
    bind_text(s, 1, job);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        *out = col_text(s, 0);
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW)
        return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    if (rc == SQLITE_DONE)
        return px_err_set(err, PX_ENOTFOUND, "no explanation for job \"%.64s\"", job);
    return sql_fail(st, err, "get explanation");
}

static px_status put_heartbeat(void *self, const char *node, int64_t at, const char *live,
                               px_err *err)
{
    sql_store *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "INSERT OR REPLACE INTO heartbeats(node, at, live) VALUES(?,?,?)", &s, err))
        return PX_EIO;
    bind_text(s, 1, node);
    sqlite3_bind_int64(s, 2, at);
    bind_text(s, 3, live);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put heartbeat");
}

static const px__store_ops sqlite_ops = {
    .version = 1,
    .close = sql_close,
    .clear_tokens = clear_tokens,
    .put_token = put_token,
    .list_tokens = list_tokens,
    .put_node = put_node,
    .list_nodes = list_nodes,
    .insert_job = insert_job,
    .update_job = update_job,
    .get_job = get_job,
    .list_jobs = list_jobs,
    .append_log = append_log,
    .read_logs = read_logs,
    .put_artifact = put_artifact,
    .list_artifacts = list_artifacts,
    .put_explanation = put_explanation,
    .get_explanation = get_explanation,
    .put_heartbeat = put_heartbeat,
};

px_status px__store_sqlite_open(const char *path, px__store *out, px_err *err)
{
    sql_store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = px_strdup(path))) {
        free(st);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    /* One connection shared under the server's lock; FULLMUTEX keeps SQLite
     * safe should a caller forget. */
    if (sqlite3_open_v2(path, &st->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK) {
        px_status rc = px_err_set(err, PX_EIO, "%s: cannot open the database: %s", path,
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
