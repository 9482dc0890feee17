/* The SQLite store's records beside the jobs: nodes and their last live
 * report, log chunks, artifacts, explanations, node credentials and
 * revoked node names. */
#include "fleet/store_sqlite_impl.h"

#define sql_fail  px__sql_fail
#define exec      px__sql_exec
#define prepare   px__sql_prepare
#define bind_text px__sql_bind_text
#define col_text  px__sql_col_text

static px_status put_node(void *self, const char *name, const char *reg, const char *state,
                          int64_t last_seen, px_err *err)
{
    px__sql *st = self;
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
    px__sql *st = self;
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

static px_status append_log(void *self, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err)
{
    px__sql *st = self;
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
    px__sql *st = self;
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
    px__sql *st = self;
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
    px__sql *st = self;
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
    px__sql *st = self;
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
    px__sql *st = self;
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
    px__sql *st = self;
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

static px_status job_usage(void *self, const char *job, int64_t *log_bytes, int64_t *artifact_bytes,
                           px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "SELECT (SELECT COALESCE(SUM(length(data)), 0) FROM logs WHERE job = ?1),"
                " (SELECT COALESCE(SUM(size), 0) FROM artifacts WHERE job = ?1)",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, job);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *log_bytes = sqlite3_column_int64(s, 0);
        *artifact_bytes = sqlite3_column_int64(s, 1);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_ROW ? PX_OK : sql_fail(st, err, "job usage");
}

static px_status put_credential(void *self, const char *node, const char *hash, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "INSERT OR REPLACE INTO node_credentials(hash, node, created) VALUES(?,?,?)",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, hash);
    bind_text(s, 2, node);
    sqlite3_bind_int64(s, 3, px_wall_time());
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "put credential");
}

static px_status drop_credentials(void *self, const char *node, const char *keep, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "DELETE FROM node_credentials WHERE node = ?1 AND (?2 IS NULL OR hash != ?2)",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, node);
    bind_text(s, 2, keep);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "drop credentials");
}

static px_status list_credentials(void *self, px__credential_cb cb, void *ud, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "SELECT node, hash FROM node_credentials ORDER BY created", &s, err))
        return PX_EIO;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        cb((const char *)sqlite3_column_text(s, 0), (const char *)sqlite3_column_text(s, 1), ud);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list credentials");
}

static px_status set_revoked(void *self, const char *node, bool revoked, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                revoked ? "INSERT OR REPLACE INTO revoked_nodes(node, at) VALUES(?1, ?2)"
                        : "DELETE FROM revoked_nodes WHERE node = ?1 AND ?2 IS NOT NULL",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, node);
    sqlite3_bind_int64(s, 2, px_wall_time());
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "revoke node");
}

static px_status list_revoked(void *self, px__name_cb cb, void *ud, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "SELECT node FROM revoked_nodes", &s, err))
        return PX_EIO;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        cb((const char *)sqlite3_column_text(s, 0), ud);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list revoked nodes");
}

void px__sql_fill_record_ops(px__store_ops *ops)
{
    ops->put_node = put_node;
    ops->list_nodes = list_nodes;
    ops->append_log = append_log;
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
