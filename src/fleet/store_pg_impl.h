/*
 * Private to the PostgreSQL store (store_pg*.c): the connection, its lock
 * and the helpers every statement uses.  The rest of the server sees only
 * the px__store_ops table of fleet_impl.h.
 */
#ifndef PX_FLEET_STORE_PG_IMPL_H
#define PX_FLEET_STORE_PG_IMPL_H

#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <libpq-fe.h>
#include <pthread.h>

/* One connection, shared by the server's threads under `mu`.  The
 * scheduler lease is a session advisory lock held on this very connection,
 * so the writes of a scheduler are fenced by it: when the connection is
 * lost the lock is gone, and so is every write that would have followed. */
typedef struct px__pg {
    PGconn *conn;
    pthread_mutex_t mu;
    char *spec;     /* the connection string (never a password), for `listen` */
    PGconn *listen; /* LISTENs for accepted jobs (wait_jobs); its caller's alone */
    char *where;    /* the database named for messages (never a password) */
    bool lease_held;
    bool lost;  /* the connection broke: the lease (if held) is gone */
    bool batch; /* a batch is open (batch_begin): writes become savepoints */
    int depth;  /* savepoints open inside the batch */
    /* Statements of pipelines prepared on `conn` (named "px_<i>"), so that
     * the server parses and plans each text once per session rather than
     * once per row; forgotten when the connection is made again. */
    struct px__pg_prepared {
        char *sql;
        int state; /* 1: its Parse is in the pipeline being sent, 2: ready */
    } prepared[32];
    int n_prepared;
    /* The epoch this replica took with the lease (0: not held), and the
     * connection of the writes it fences (fenced_update_jobs: made at the
     * first, its own lock, no lease of its own). */
    int64_t epoch;
    struct px__pg *fenced;
} px__pg;

/* Parameters of one statement, all sent as text except blobs. */
#define PX__PGQ_MAX 20
typedef struct px__pgq {
    const char *v[PX__PGQ_MAX];
    int len[PX__PGQ_MAX];
    int fmt[PX__PGQ_MAX];
    char buf[PX__PGQ_MAX][32];
    int n;
} px__pgq;

void px__pgq_text(px__pgq *q, const char *v); /* NULL is SQL NULL */
void px__pgq_int(px__pgq *q, int64_t v);
void px__pgq_double(px__pgq *q, double v);
void px__pgq_blob(px__pgq *q, const void *data, size_t len);

/* Runs sql with q's parameters (q may be NULL); *res (may be NULL) gets
 * the result of a statement that returned rows.  A failure sets err to
 * "PostgreSQL WHERE: WHAT: <server's message>" and returns PX_EIO, or
 * PX_EEXIST for a unique violation (the constraint's name in *constraint
 * when not NULL).  The caller holds st->mu. */
px_status px__pg_run(px__pg *st, const char *sql, const px__pgq *q, PGresult **res,
                     const char *what, px_err *err);
/* One statement of a pipeline. */
typedef struct px__pg_stmt {
    const char *sql;
    const px__pgq *q; /* NULL: no parameters */
} px__pg_stmt;

/* Sends n statements at once and reads their results (libpq's pipeline
 * mode): one round trip to the database rather than n.  The first failure
 * is returned (errors as px__pg_run), and the server skips the statements
 * after it, so a pipeline that opens a transaction or savepoint must be
 * followed by its rollback on failure.  *res (res may be NULL) gets the
 * rows of statement `keep`.  The caller holds st->mu. */
px_status px__pg_pipeline(px__pg *st, const px__pg_stmt *s, int n, int keep, PGresult **res,
                          const char *what, px_err *err);
/* A transaction of several statements, or inside a batch a savepoint:
 * begin, then commit or roll back.  The caller holds st->mu. */
px_status px__pg_begin(px__pg *st, px_err *err);
px_status px__pg_commit(px__pg *st, px_err *err);
void px__pg_rollback(px__pg *st);
/* A column's text copied (owned), NULL for NULL. */
char *px__pg_text(const PGresult *r, int row, int col);
int64_t px__pg_int(const PGresult *r, int row, int col);

/* store_pg_conn.c: a libpq error message on one line, cut to fit buf. */
const char *px__pg_one_line(const char *msg, char *buf, size_t n);
/* The settings every session of the store runs with, applied to c. */
px_status px__pg_configure_session(px__pg *st, PGconn *c, const char *what, px_err *err);
/* Forgets the statements prepared on st's connection (it was closed or
 * opened again). */
void px__pg_forget_prepared(px__pg *st);

/* store_pg_jobs.c: the job rows and cancellations. */
void px__pg_fill_job_ops(px__store_ops *ops);
/* store_pg_records.c: the slots that are not about jobs. */
void px__pg_fill_record_ops(px__store_ops *ops);
/* store_pg_deploy.c: the deployments. */
void px__pg_fill_deploy_ops(px__store_ops *ops);
/* store_pg_blobs.c: blobs in chunks. */
void px__pg_fill_blob_ops(px__store_ops *ops);
/* The stored key of an artifact's bytes (a blob's is its hex). */
#define PX__PG_ARTIFACT_KEY "artifact/"
/* The statement of collect_artifact_data (store_pg_blobs.c), here so that a
 * test can ask PostgreSQL for its plan: the bytes stored before $1 (wall
 * seconds) that no artifact row names, at most $2 of them, the oldest
 * first, removed with their chunks; one row, their number and size. */
#define PX__PG_COLLECT_ARTIFACTS                                                     \
    "WITH gone AS (DELETE FROM blobs WHERE created < $1 AND digest IN ("             \
    "  SELECT b.digest FROM blobs b WHERE b.digest LIKE '" PX__PG_ARTIFACT_KEY "%'"  \
    "  AND b.created < $1 AND NOT EXISTS (SELECT 1 FROM artifacts a"                 \
    "   WHERE a.sha256 = substr(b.digest, length('" PX__PG_ARTIFACT_KEY "') + 1))"   \
    "  ORDER BY b.created LIMIT $2) RETURNING digest, size),"                        \
    " chunks AS (DELETE FROM blob_chunks WHERE digest IN (SELECT digest FROM gone))" \
    " SELECT COUNT(*), COALESCE(SUM(size), 0) FROM gone"
/* store_pg_nodes.c: agents through every replica (version 11). */
void px__pg_fill_node_ops(px__store_ops *ops);
/* A new connection to the store's database, configured as the store's own
 * (NULL with err set when it cannot connect). */
PGconn *px__pg_connect(px__pg *st, const char *what, px_err *err);

#endif
