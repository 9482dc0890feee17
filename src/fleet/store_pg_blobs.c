/* Blobs in PostgreSQL: a row per blob (its size and number of chunks) and
 * its bytes in chunks of CHUNK bytes, so that every replica on the
 * database serves every blob without a shared folder.  Jobs' artifacts
 * use the same tables under the key "artifact/<sha256>", a space of their
 * own: an artifact is never served as a blob, nor a blob as an artifact.  Each call runs on a
 * connection of its own, never under the store's lock: an upload of
 * gigabytes does not stall the scheduler's writes.  Writes stream from a
 * file and reads to one, in constant memory; the SHA-256 is checked on
 * the way in and on the way out. */
#include "fleet/store_pg_impl.h"

#include <unistd.h>

#define CHUNK ((size_t)1 << 20)

#define ARTIFACT_KEY PX__PG_ARTIFACT_KEY

/* What a key names, for messages. */
static const char *noun_of(const char *key)
{
    return px_str_starts_with(key, ARTIFACT_KEY) ? "artifact" : "blob";
}

/* The message of a failed result (or of the connection), one line. */
static px_status fail(px__pg *st, PGconn *c, const PGresult *r, const char *what, px_err *err)
{
    char line[200];
    snprintf(line, sizeof line, "%s",
             r && *PQresultErrorMessage(r) ? PQresultErrorMessage(r) : PQerrorMessage(c));
    for (char *p = line; *p; p++)
        if (*p == '\n')
            *p = p[1] ? ' ' : '\0';
    return px_err_set(err, PX_EIO, "PostgreSQL %s: %s: %s", st->where, what, line);
}

/* Runs one statement; *res (may be NULL) gets rows, in binary when
 * binary.  The values are text but for a bytea of data_len bytes at the
 * end when data is not NULL. */
static px_status exec(px__pg *st, PGconn *c, const char *sql, const char *const *v, int n,
                      const void *data, size_t data_len, bool binary, PGresult **res,
                      const char *what, px_err *err)
{
    const char *vals[4] = {0};
    int lens[4] = {0}, fmts[4] = {0};
    PX_ASSERT(n + (data != NULL) <= 4);
    for (int i = 0; i < n; i++)
        vals[i] = v[i];
    if (data) {
        vals[n] = data_len ? data : "";
        lens[n] = (int)data_len;
        fmts[n] = 1;
        n++;
    }
    PGresult *r = PQexecParams(c, sql, n, NULL, vals, lens, fmts, binary ? 1 : 0);
    ExecStatusType t = PQresultStatus(r);
    if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK) {
        px_status rc = fail(st, c, r, what, err);
        PQclear(r);
        return rc;
    }
    if (res)
        *res = r;
    else
        PQclear(r);
    return PX_OK;
}

static px_status read_full(int fd, void *buf, size_t n, off_t at, px_err *err)
{
    char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return px_err_set(err, PX_EIO, "reading the blob to store: %s",
                              got < 0 ? strerror(errno) : "the file is shorter than its size");
        p += got;
        n -= (size_t)got;
        at += got;
    }
    return PX_OK;
}

/* The chunks of fd, hashed on the way: a file that changed since its
 * digest was taken is refused rather than stored under a false name. */
static px_status put_chunks(px__pg *st, PGconn *c, const char *key, const char *hex, int fd,
                            int64_t size, char *buf, px_err *err)
{
    px_sha256_ctx *h;
    if (px_sha256_new(&h, err) != PX_OK)
        return err ? err->code : PX_ENOMEM;
    px_status rc = PX_OK;
    int64_t done = 0;
    for (int n = 0; rc == PX_OK && done < size; n++) {
        size_t len = (size_t)PX_MIN((int64_t)CHUNK, size - done);
        if ((rc = read_full(fd, buf, len, (off_t)done, err)) != PX_OK)
            break;
        px_sha256_update(h, buf, len);
        char num[16];
        snprintf(num, sizeof num, "%d", n);
        const char *v[] = {key, num};
        rc = exec(st, c, "INSERT INTO blob_chunks(digest, n, data) VALUES($1, $2, $3)", v, 2, buf,
                  len, false, NULL, "store blob", err);
        done += (int64_t)len;
    }
    px_digest d;
    px_sha256_final(h, &d);
    char got[65];
    px_digest_hex(&d, got);
    if (rc == PX_OK && strcmp(got, hex) != 0)
        rc = px_err_set(err, PX_EIO,
                        "%s %.16s...: the file changed while it was stored (its "
                        "SHA-256 is now %.16s...); upload it again",
                        noun_of(key), hex, got);
    return rc;
}

static px_status put_keyed(px__pg *st, const char *key, const char *hex, int fd, int64_t size,
                           px_err *err)
{
    PGconn *c = px__pg_connect(st, "store blob", err);
    if (!c)
        return PX_EIO;
    char *buf = NULL;
    char sz[24], chunks[24], now[24];
    snprintf(sz, sizeof sz, "%" PRId64, size);
    snprintf(chunks, sizeof chunks, "%" PRId64, (size + (int64_t)CHUNK - 1) / (int64_t)CHUNK);
    snprintf(now, sizeof now, "%" PRId64, (int64_t)px_wall_time());
    const char *v[] = {key, sz, chunks, now};
    PGresult *r = NULL;
    px_status rc = exec(st, c, "BEGIN", NULL, 0, NULL, 0, false, NULL, "store blob", err);
    /* The row first: a replica storing the same blob at once waits here
     * for the other's commit, then finds the row and keeps that one.  A
     * row already there is dated again (xmax is 0 only on a row this
     * statement inserted): an upload that finds its artifact's bytes stored
     * has the collector's grace period from now until it writes its row,
     * and a collection under way either removed the row before (then it is
     * inserted afresh) or sees the new date and keeps it. */
    if (rc == PX_OK)
        rc = exec(st, c,
                  "INSERT INTO blobs(digest, size, chunks, created) VALUES($1, $2, $3, $4)"
                  " ON CONFLICT (digest) DO UPDATE SET created ="
                  " GREATEST(blobs.created, EXCLUDED.created) RETURNING xmax = 0",
                  v, 4, NULL, 0, false, &r, "store blob", err);
    bool fresh = rc == PX_OK && PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (fresh && !(buf = malloc(CHUNK)))
        rc = px_err_set(err, PX_ENOMEM, "out of memory");
    if (fresh && rc == PX_OK)
        rc = put_chunks(st, c, key, hex, fd, size, buf, err);
    if (rc == PX_OK)
        rc = exec(st, c, "COMMIT", NULL, 0, NULL, 0, false, NULL, "store blob", err);
    else
        PQclear(PQexec(c, "ROLLBACK"));
    free(buf);
    PQfinish(c);
    return rc;
}

static px_status put_blob(void *self, const char *hex, int fd, int64_t size, px_err *err)
{
    return put_keyed(self, hex, hex, fd, size, err);
}

static px_status put_artifact_data(void *self, const char *hex, int fd, int64_t size, px_err *err)
{
    char key[80];
    snprintf(key, sizeof key, ARTIFACT_KEY "%.64s", hex);
    return put_keyed(self, key, hex, fd, size, err);
}

static px_status write_full(int fd, const char *p, size_t n, px_err *err)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return px_err_set(err, PX_EIO, "writing the blob: %s",
                              w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return PX_OK;
}

/* Chunk by chunk, each checked against what is left of the size, the
 * whole against the digest. */
static px_status get_chunks(px__pg *st, PGconn *c, const char *key, const char *hex, int fd,
                            int64_t size, int64_t chunks, bool *damaged, px_err *err)
{
    px_sha256_ctx *h;
    if (px_sha256_new(&h, err) != PX_OK)
        return err ? err->code : PX_ENOMEM;
    px_status rc = PX_OK;
    int64_t done = 0;
    for (int64_t n = 0; rc == PX_OK && n < chunks; n++) {
        char num[24];
        snprintf(num, sizeof num, "%" PRId64, n);
        const char *v[] = {key, num};
        PGresult *r = NULL;
        rc = exec(st, c, "SELECT data FROM blob_chunks WHERE digest = $1 AND n = $2", v, 2, NULL, 0,
                  true, &r, "read blob", err);
        if (rc != PX_OK)
            break;
        int64_t len = PQntuples(r) == 1 ? PQgetlength(r, 0, 0) : -1;
        if (len < 0 || len > (int64_t)CHUNK || len > size - done) {
            *damaged = true;
            rc = px_err_set(err, PX_EIO,
                            "PostgreSQL %s: %s %.16s...: chunk %" PRId64
                            " is missing or too long; it was removed, upload it again",
                            st->where, noun_of(key), hex, n);
        } else {
            px_sha256_update(h, PQgetvalue(r, 0, 0), (size_t)len);
            rc = write_full(fd, PQgetvalue(r, 0, 0), (size_t)len, err);
            done += len;
        }
        PQclear(r);
    }
    px_digest d;
    px_sha256_final(h, &d);
    char got[65];
    px_digest_hex(&d, got);
    if (rc == PX_OK && (done != size || strcmp(got, hex) != 0)) {
        *damaged = true;
        rc = px_err_set(err, PX_EIO,
                        "PostgreSQL %s: %s %.16s... is damaged (%" PRId64 " of %" PRId64
                        " bytes, SHA-256 %.16s...); it was removed, upload it again",
                        st->where, noun_of(key), hex, done, size, got);
    }
    return rc;
}

static void drop(px__pg *st, PGconn *c, const char *key, const char *hex)
{
    const char *v[] = {key};
    px_err e;
    if (exec(st, c, "BEGIN", NULL, 0, NULL, 0, false, NULL, "remove blob", &e) != PX_OK)
        return;
    if (exec(st, c, "DELETE FROM blob_chunks WHERE digest = $1", v, 1, NULL, 0, false, NULL,
             "remove blob", &e) != PX_OK ||
        exec(st, c, "DELETE FROM blobs WHERE digest = $1", v, 1, NULL, 0, false, NULL,
             "remove blob", &e) != PX_OK ||
        exec(st, c, "COMMIT", NULL, 0, NULL, 0, false, NULL, "remove blob", &e) != PX_OK) {
        PQclear(PQexec(c, "ROLLBACK"));
        px_log_warn("%s %.16s...: %s", noun_of(key), hex, e.msg);
    }
}

static px_status get_keyed(px__pg *st, const char *key, const char *hex, int fd, int64_t *size,
                           px_err *err)
{
    *size = 0;
    PGconn *c = px__pg_connect(st, "read blob", err);
    if (!c)
        return PX_EIO;
    PGresult *r = NULL;
    const char *v[] = {key};
    bool damaged = false;
    px_status rc = exec(st, c, "SELECT size, chunks FROM blobs WHERE digest = $1", v, 1, NULL, 0,
                        false, &r, "read blob", err);
    if (rc == PX_OK && PQntuples(r) != 1)
        rc = px_err_set(err, PX_ENOTFOUND, "no %s %.64s", noun_of(key), hex);
    int64_t sz = 0, chunks = 0;
    if (rc == PX_OK) {
        sz = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        chunks = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        if (sz < 0 || chunks != (sz + (int64_t)CHUNK - 1) / (int64_t)CHUNK) {
            damaged = true;
            rc = px_err_set(err, PX_EIO,
                            "PostgreSQL %s: %s %.16s...: %" PRId64 " chunks for %" PRId64
                            " bytes; it was removed, upload it again",
                            st->where, noun_of(key), hex, chunks, sz);
        }
    }
    PQclear(r);
    if (rc == PX_OK)
        rc = get_chunks(st, c, key, hex, fd, sz, chunks, &damaged, err);
    /* A blob whose bytes are not those of its name is of no use to
     * anyone: removed, so that the next upload of it stores it afresh
     * (an upload of a blob already stored keeps the one there). */
    if (damaged)
        drop(st, c, key, hex);
    if (rc == PX_OK)
        *size = sz;
    PQfinish(c);
    return rc;
}

static px_status get_blob(void *self, const char *hex, int fd, int64_t *size, px_err *err)
{
    return get_keyed(self, hex, hex, fd, size, err);
}

static px_status get_artifact_data(void *self, const char *hex, int fd, int64_t *size, px_err *err)
{
    char key[80];
    snprintf(key, sizeof key, ARTIFACT_KEY "%.64s", hex);
    return get_keyed(self, key, hex, fd, size, err);
}

/* The candidates are read first (the oldest, at most max), then deleted
 * with their date checked again: a put that dated a candidate again after
 * the read committed its new date before the delete could lock the row,
 * and PostgreSQL checks the delete's own conditions against that newest
 * version, so the row stays.  An artifact's row is written only after its
 * bytes were stored (or dated again), so bytes older than `before` that no
 * row names are not those of an upload in flight, as long as the grace
 * period outlasts the gap between the two.  The chunks go in the same
 * statement, and so the same transaction, as their row.  Each candidate is
 * looked up by the index on artifacts.sha256 (migration 9): the condition
 * compares the column itself, not an expression of it. */
static px_status collect_artifact_data(void *self, int64_t before, int max, int64_t *removed,
                                       int64_t *bytes, px_err *err)
{
    px__pg *st = self;
    PX_ASSERT(max > 0);
    *removed = *bytes = 0;
    PGconn *c = px__pg_connect(st, "collect artifacts", err);
    if (!c)
        return PX_EIO;
    char at[24], limit[24];
    snprintf(at, sizeof at, "%" PRId64, before);
    snprintf(limit, sizeof limit, "%d", max);
    const char *v[] = {at, limit};
    PGresult *r = NULL;
    px_status rc = exec(st, c, PX__PG_COLLECT_ARTIFACTS, v, 2, NULL, 0, false, &r,
                        "collect unreferenced artifacts", err);
    if (rc == PX_OK && PQntuples(r) == 1) {
        *removed = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        *bytes = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

void px__pg_fill_blob_ops(px__store_ops *ops)
{
    ops->put_blob = put_blob;
    ops->get_blob = get_blob;
    ops->put_artifact_data = put_artifact_data;
    ops->get_artifact_data = get_artifact_data;
    ops->collect_artifact_data = collect_artifact_data;
}
