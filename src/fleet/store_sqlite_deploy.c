/* The SQLite store's deployments: one row per deployed model, by name. */
#include "fleet/store_sqlite_impl.h"

#define sql_fail  px__sql_fail
#define prepare   px__sql_prepare
#define bind_text px__sql_bind_text
#define col_text  px__sql_col_text

static px_status put_deployment(void *self, const px__deploy_row *row, bool replace, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    const char *sql =
        replace ? "UPDATE deployments SET owner = ?2, model = ?3, spec = ?4, state = ?5,"
                  " plan = ?6, incidents = ?7, created = ?8, updated = ?9 WHERE name = ?1"
                : "INSERT INTO deployments(name, owner, model, spec, state, plan, incidents,"
                  " created, updated) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
    if (prepare(st, sql, &s, err))
        return PX_EIO;
    bind_text(s, 1, row->name);
    bind_text(s, 2, row->owner);
    bind_text(s, 3, row->model);
    bind_text(s, 4, row->spec);
    bind_text(s, 5, row->state);
    bind_text(s, 6, row->plan);
    bind_text(s, 7, row->incidents);
    sqlite3_bind_int64(s, 8, row->created);
    sqlite3_bind_int64(s, 9, row->updated);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc == SQLITE_CONSTRAINT)
        return px_err_set(err, PX_EEXIST, "a deployment named \"%.64s\" exists", row->name);
    if (rc != SQLITE_DONE)
        return sql_fail(st, err, "put deployment");
    if (replace && sqlite3_changes(st->db) == 0)
        return px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", row->name);
    return PX_OK;
}

#define COLUMNS "name, owner, model, spec, state, plan, incidents, created, updated"

/* Fills out from the current row; false when out of memory (out released). */
static bool read_row(sqlite3_stmt *s, px__deploy_row *out)
{
    memset(out, 0, sizeof *out);
    char **cols[] = {&out->name,  &out->owner, &out->model,    &out->spec,
                     &out->state, &out->plan,  &out->incidents};
    for (size_t i = 0; i < PX_ARRAY_LEN(cols); i++)
        if (sqlite3_column_type(s, (int)i) != SQLITE_NULL && !(*cols[i] = col_text(s, (int)i))) {
            px__deploy_row_release(out);
            return false;
        }
    out->created = sqlite3_column_int64(s, 7);
    out->updated = sqlite3_column_int64(s, 8);
    return true;
}

static px_status get_deployment(void *self, const char *name, px__deploy_row *out, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    memset(out, 0, sizeof *out);
    if (prepare(st, "SELECT " COLUMNS " FROM deployments WHERE name = ?", &s, err))
        return PX_EIO;
    bind_text(s, 1, name);
    int rc = sqlite3_step(s);
    bool ok = rc == SQLITE_ROW && read_row(s, out);
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW)
        return ok ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    if (rc == SQLITE_DONE)
        return px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", name);
    return sql_fail(st, err, "get deployment");
}

static px_status list_deployments(void *self, const char *owner, px__deploy_cb cb, void *ud,
                                  px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "SELECT " COLUMNS " FROM deployments WHERE ?1 IS NULL OR owner = ?1 ORDER BY name",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, owner);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        px__deploy_row row;
        if (!read_row(s, &row)) {
            sqlite3_finalize(s);
            return px_err_set(err, PX_ENOMEM, "out of memory");
        }
        cb(&row, ud);
        px__deploy_row_release(&row);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list deployments");
}

static px_status delete_deployment(void *self, const char *name, px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st, "DELETE FROM deployments WHERE name = ?", &s, err))
        return PX_EIO;
    bind_text(s, 1, name);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return sql_fail(st, err, "delete deployment");
    if (sqlite3_changes(st->db) == 0)
        return px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", name);
    return PX_OK;
}

static px_status append_deploy_record(void *self, const char *deployment, const char *kind,
                                      int64_t at, const char *body, int keep, int64_t *seq,
                                      px_err *err)
{
    px__sql *st = self;
    if (px__sql_exec(st, "BEGIN IMMEDIATE", err) != PX_OK)
        return PX_EIO;
    sqlite3_stmt *s = NULL;
    if (prepare(st,
                "INSERT INTO deployment_records(deployment, kind, seq, at, body) SELECT ?1, ?2,"
                " COALESCE(MAX(seq), 0) + 1, ?3, ?4 FROM deployment_records"
                " WHERE deployment = ?1 AND kind = ?2"
                " HAVING EXISTS(SELECT 1 FROM deployments WHERE name = ?1) RETURNING seq",
                &s, err))
        goto fail;
    bind_text(s, 1, deployment);
    bind_text(s, 2, kind);
    sqlite3_bind_int64(s, 3, at);
    bind_text(s, 4, body);
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE)
            px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", deployment);
        else
            sql_fail(st, err, "append deployment record");
        goto fail;
    }
    *seq = sqlite3_column_int64(s, 0);
    sqlite3_step(s);
    sqlite3_finalize(s);
    if (prepare(st,
                "DELETE FROM deployment_records WHERE deployment = ?1 AND kind = ?2 AND seq <= ?3",
                &s, err))
        goto fail;
    bind_text(s, 1, deployment);
    bind_text(s, 2, kind);
    sqlite3_bind_int64(s, 3, *seq - keep);
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    s = NULL;
    if (rc != SQLITE_DONE) {
        sql_fail(st, err, "trim deployment records");
        goto fail;
    }
    if (px__sql_exec(st, "COMMIT", err) != PX_OK)
        goto fail;
    return PX_OK;
fail:
    sqlite3_finalize(s);
    px__sql_exec(st, "ROLLBACK", NULL);
    return err->code;
}

static px_status list_deploy_records(void *self, const char *deployment, const char *kind,
                                     int64_t after, int limit, px__deploy_record_cb cb, void *ud,
                                     px_err *err)
{
    px__sql *st = self;
    sqlite3_stmt *s;
    if (prepare(st,
                "SELECT seq, at, body FROM deployment_records WHERE deployment = ?1 AND kind = ?2"
                " AND seq > ?3 ORDER BY seq LIMIT ?4",
                &s, err))
        return PX_EIO;
    bind_text(s, 1, deployment);
    bind_text(s, 2, kind);
    sqlite3_bind_int64(s, 3, after);
    sqlite3_bind_int(s, 4, limit);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        cb(sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
           (const char *)sqlite3_column_text(s, 2), ud);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? PX_OK : sql_fail(st, err, "list deployment records");
}

void px__sql_fill_deploy_ops(px__store_ops *ops)
{
    ops->append_deploy_record = append_deploy_record;
    ops->list_deploy_records = list_deploy_records;
    ops->put_deployment = put_deployment;
    ops->get_deployment = get_deployment;
    ops->list_deployments = list_deployments;
    ops->delete_deployment = delete_deployment;
}
