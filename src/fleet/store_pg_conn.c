/* The PostgreSQL store's connection: statements with their parameters,
 * prepared once per connection, pipelines of statements, transactions
 * (nested ones as savepoints), and a connection that has dropped opened
 * again with the session's settings before the next statement. */
#include "fleet/store_pg_impl.h"

#define run  px__pg_run
#define text px__pgq_text
#define i64  px__pgq_int

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
const char *px__pg_one_line(const char *msg, char *buf, size_t n)
{
    snprintf(buf, n, "%s", msg && *msg ? msg : "unknown error");
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = (p[1] ? ' ' : '\0');
    return buf;
}

static px_status run_one(px__pg *st, const char *sql, const px__pgq *q, PGresult **res,
                         const char *what, px_err *err);
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

void px__pg_forget_prepared(px__pg *st)
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
        px__pg_forget_prepared(st);
        if (PQstatus(st->conn) == CONNECTION_OK) {
            px_status rc = px__pg_configure_session(st, st->conn, what, err);
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
    px_err_set(err, code, "PostgreSQL %s: %s: %s", st->where, what,
               px__pg_one_line(r && *PQresultErrorMessage(r) ? PQresultErrorMessage(r)
                                                             : PQerrorMessage(st->conn),
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

/* The settings of every session of the store, whatever the role's or the
 * database's defaults, applied to each new connection and again after a
 * reconnection: acknowledged means on the primary's disk, and notices
 * stay out of the server's output. */
px_status px__pg_configure_session(px__pg *st, PGconn *c, const char *what, px_err *err)
{
    PGresult *r = PQexec(c, "SET synchronous_commit = on; SET client_min_messages = warning");
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    px_status rc = PX_OK;
    if (!ok) {
        char line[200];
        rc = px_err_set(err, PX_EIO, "PostgreSQL %s: %s: configuring the session: %s", st->where,
                        what,
                        px__pg_one_line(r && *PQresultErrorMessage(r) ? PQresultErrorMessage(r)
                                                                      : PQerrorMessage(c),
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
                   px__pg_one_line(c ? PQerrorMessage(c) : "out of memory", line, sizeof line));
        PQfinish(c);
        return NULL;
    }
    if (px__pg_configure_session(st, c, what, err) != PX_OK) {
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
