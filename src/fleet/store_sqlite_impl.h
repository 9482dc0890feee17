/*
 * Private to the SQLite store (store_sqlite*.c): the connection and the
 * helpers every statement uses.  The rest of the server sees only the
 * px__store_ops table of fleet_impl.h.
 */
#ifndef PX_FLEET_STORE_SQLITE_IMPL_H
#define PX_FLEET_STORE_SQLITE_IMPL_H

#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <sqlite3.h>

typedef struct px__sql {
    sqlite3 *db;
    char *path;
} px__sql;

/* Sets err to "PATH: WHAT: <SQLite's message>" and returns PX_EIO. */
px_status px__sql_fail(px__sql *st, px_err *err, const char *what);
/* Runs statements without results; PX_EIO with SQLite's message. */
px_status px__sql_exec(px__sql *st, const char *sql, px_err *err);
px_status px__sql_prepare(px__sql *st, const char *sql, sqlite3_stmt **out, px_err *err);
/* Binds text, or NULL for a NULL pointer. */
void px__sql_bind_text(sqlite3_stmt *s, int i, const char *v);
/* A column's text copied (owned), NULL for NULL. */
char *px__sql_col_text(sqlite3_stmt *s, int i);

/* store_sqlite_records.c: the slots that are not about jobs. */
void px__sql_fill_record_ops(px__store_ops *ops);
/* store_sqlite_deploy.c: the deployments. */
void px__sql_fill_deploy_ops(px__store_ops *ops);

#endif
