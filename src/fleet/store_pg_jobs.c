/* The PostgreSQL store's job rows: one row per job with its members in a
 * table of their own, written one at a time, in pipelines of many for a
 * scheduling pass (at the lease's epoch where the pass commits outside
 * the server lock), read by id, state or owner, and claimed by the
 * scheduling replica when another replica accepted them. */
#include "fleet/store_pg_impl.h"

#define run      px__pg_run
#define text     px__pgq_text
#define i64      px__pgq_int
#define begin    px__pg_begin
#define commit   px__pg_commit
#define rollback px__pg_rollback

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
    px__pg_forget_prepared(f);
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

/* Claims up to max queued jobs no scheduler has taken in yet (those other
 * replicas accepted), oldest first: the rows are locked FOR UPDATE SKIP
 * LOCKED, so a row another transaction holds is left for the next call
 * rather than waited for, marked adopted and handed to cb. */
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

void px__pg_fill_job_ops(px__store_ops *ops)
{
    ops->insert_job = insert_job;
    ops->update_job = update_job;
    ops->update_jobs = update_jobs;
    ops->fenced_update_jobs = fenced_update_jobs;
    ops->put_explanations = put_explanations;
    ops->get_job = get_job;
    ops->list_jobs = list_jobs;
    ops->find_idempotent = find_idempotent;
    ops->claim_jobs = claim_jobs;
    ops->request_cancel = request_cancel;
    ops->take_cancels = take_cancels;
}
