/* The PostgreSQL store's deployments: one row per deployed model, by name. */
#include "fleet/store_pg_impl.h"

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

static px_status put_deployment(void *self, const px__deploy_row *row, bool replace, px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, row->name);
    text(&q, row->owner);
    text(&q, row->model);
    text(&q, row->spec);
    text(&q, row->state);
    text(&q, row->plan);
    text(&q, row->incidents);
    i64(&q, row->created);
    i64(&q, row->updated);
    const char *sql =
        replace ? "UPDATE deployments SET owner = $2, model = $3, spec = $4, state = $5,"
                  " plan = $6, incidents = $7, created = $8, updated = $9 WHERE name = $1"
                  " RETURNING name"
                : "INSERT INTO deployments(name, owner, model, spec, state, plan, incidents,"
                  " created, updated) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING name";
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, sql, &q, &r, "put deployment", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_EEXIST)
        return px_err_set(err, PX_EEXIST, "a deployment named \"%.64s\" exists", row->name);
    if (rc == PX_OK && replace && PQntuples(r) == 0)
        rc = px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", row->name);
    PQclear(r);
    return rc;
}

#define COLUMNS "name, owner, model, spec, state, plan, incidents, created, updated"

/* Fills out from row i; false when out of memory (out released). */
static bool read_row(const PGresult *r, int i, px__deploy_row *out)
{
    memset(out, 0, sizeof *out);
    char **cols[] = {&out->name,  &out->owner, &out->model,    &out->spec,
                     &out->state, &out->plan,  &out->incidents};
    for (size_t c = 0; c < PX_ARRAY_LEN(cols); c++)
        if (!PQgetisnull(r, i, (int)c) && !(*cols[c] = px__pg_text(r, i, (int)c))) {
            px__deploy_row_release(out);
            return false;
        }
    out->created = px__pg_int(r, i, 7);
    out->updated = px__pg_int(r, i, 8);
    return true;
}

static px_status query(px__pg *st, const char *sql, const char *arg, PGresult **r, const char *what,
                       px_err *err)
{
    px__pgq q = {0};
    text(&q, arg);
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st, sql, &q, r, what, err);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static px_status get_deployment(void *self, const char *name, px__deploy_row *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    px_status rc = query(self, "SELECT " COLUMNS " FROM deployments WHERE name = $1", name, &r,
                         "get deployment", err);
    if (rc != PX_OK)
        return rc;
    if (PQntuples(r) == 1)
        rc = read_row(r, 0, out) ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
    else
        rc = px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", name);
    PQclear(r);
    return rc;
}

static px_status list_deployments(void *self, const char *owner, px__deploy_cb cb, void *ud,
                                  px_err *err)
{
    PGresult *r = NULL;
    px_status rc = query(self,
                         "SELECT " COLUMNS " FROM deployments WHERE $1::text IS NULL OR owner = $1"
                         " ORDER BY name",
                         owner, &r, "list deployments", err);
    if (rc != PX_OK)
        return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        px__deploy_row row;
        if (!read_row(r, i, &row)) {
            rc = px_err_set(err, PX_ENOMEM, "out of memory");
            break;
        }
        cb(&row, ud);
        px__deploy_row_release(&row);
    }
    PQclear(r);
    return rc;
}

static px_status delete_deployment(void *self, const char *name, px_err *err)
{
    PGresult *r = NULL;
    px_status rc = query(self, "DELETE FROM deployments WHERE name = $1 RETURNING name", name, &r,
                         "delete deployment", err);
    if (rc == PX_OK && PQntuples(r) == 0)
        rc = px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", name);
    PQclear(r);
    return rc;
}

/* One statement: the insert with the next number, and the trim (which
 * sees the rows as they were before it, so never the new one). */
static px_status append_deploy_record(void *self, const char *deployment, const char *kind,
                                      int64_t at, const char *body, int keep, int64_t *seq,
                                      px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, deployment);
    text(&q, kind);
    i64(&q, at);
    text(&q, body);
    i64(&q, keep);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc =
        run(st,
            "WITH ins AS (INSERT INTO deployment_records(deployment, kind, seq, at, body)"
            " SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4 FROM deployment_records"
            " WHERE deployment = $1 AND kind = $2"
            " HAVING EXISTS(SELECT 1 FROM deployments WHERE name = $1) RETURNING seq),"
            " trim AS (DELETE FROM deployment_records d USING ins WHERE d.deployment = $1"
            " AND d.kind = $2 AND d.seq <= ins.seq - $5)"
            " SELECT seq FROM ins",
            &q, &r, "append deployment record", err);
    pthread_mutex_unlock(&st->mu);
    if (rc == PX_EEXIST)
        rc = px_err_set(err, PX_ESTATE,
                        "deployment %.64s: another record was stored at the same moment; send "
                        "it again",
                        deployment);
    else if (rc == PX_OK && PQntuples(r) != 1)
        rc = px_err_set(err, PX_ENOTFOUND, "no deployment \"%.64s\"", deployment);
    else if (rc == PX_OK)
        *seq = px__pg_int(r, 0, 0);
    PQclear(r);
    return rc;
}

static px_status list_deploy_records(void *self, const char *deployment, const char *kind,
                                     int64_t after, int limit, px__deploy_record_cb cb, void *ud,
                                     px_err *err)
{
    px__pg *st = self;
    px__pgq q = {0};
    text(&q, deployment);
    text(&q, kind);
    i64(&q, after);
    i64(&q, limit);
    PGresult *r = NULL;
    pthread_mutex_lock(&st->mu);
    px_status rc = run(st,
                       "SELECT seq, at, body FROM deployment_records WHERE deployment = $1 AND"
                       " kind = $2 AND seq > $3 ORDER BY seq LIMIT $4",
                       &q, &r, "list deployment records", err);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; rc == PX_OK && i < PQntuples(r); i++)
        cb(px__pg_int(r, i, 0), px__pg_int(r, i, 1), PQgetvalue(r, i, 2), ud);
    PQclear(r);
    return rc;
}

void px__pg_fill_deploy_ops(px__store_ops *ops)
{
    ops->append_deploy_record = append_deploy_record;
    ops->list_deploy_records = list_deploy_records;
    ops->put_deployment = put_deployment;
    ops->get_deployment = get_deployment;
    ops->list_deployments = list_deployments;
    ops->delete_deployment = delete_deployment;
}
