/* Uploads streamed to disk: a model or input file (POST /v1/blobs; then
 * into the store too where it keeps blobs) and a job's artifact (PUT
 * /v1/agent/jobs/<id>/artifacts/<name>).  The body is
 * written to a temporary file as it arrives and hashed on the way, so an
 * upload of any size takes constant memory; runs of zero bytes are left
 * as holes.  Writing and fsync happen in the connection's thread without
 * the server lock; only the checks before the first byte and the
 * bookkeeping after the last take it.  Nothing is acknowledged before the
 * file is durable.  An artifact's temporary file (".upload-*", in the
 * artifact's own folder so that it is renamed into place) is locked
 * (flock) from its creation until the upload is done with it, renamed or
 * not: the collection of files no artifact names (server_collect.c) leaves
 * a locked file alone, however old. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define PIECE 4096

struct px__upload {
    bool artifact;
    int fd;       /* the temporary file (an artifact's: locked, open until freed) */
    int dir_fd;   /* the folder it lives in */
    char tmp[96]; /* its name in dir_fd */
    px_sha256_ctx *hash;
    uint64_t n, limit;
    bool too_big;
    int failed_errno;
    /* artifacts */
    char job[72];
    char *name;       /* owned */
    const char *base; /* last component, in name */
    int attempt, rank;
};

bool px__upload_is(const char *method, const char *url)
{
    return (strcmp(method, "PUT") == 0 && px_str_starts_with(url, "/v1/agent/jobs/") &&
            strstr(url, "/artifacts/")) ||
           (strcmp(method, "POST") == 0 && strcmp(url, "/v1/blobs") == 0);
}

void px__upload_free(px__upload *u)
{
    if (!u)
        return;
    /* Removed while still locked, then closed (which unlocks it). */
    if (u->tmp[0] && u->dir_fd >= 0)
        unlinkat(u->dir_fd, u->tmp, 0);
    if (u->fd >= 0)
        close(u->fd);
    if (u->dir_fd >= 0)
        close(u->dir_fd);
    if (u->hash) {
        px_digest ignored;
        px_sha256_final(u->hash, &ignored);
    }
    free(u->name);
    free(u);
}

static int query_int(const px__api_req *rq, const char *key, int dflt, bool *ok)
{
    const char *q = px__api_query(rq, key);
    if (!q)
        return dflt;
    char *end;
    long v = strtol(q, &end, 10);
    if (*end || end == q || v < 0 || v > 1000000)
        *ok = false;
    return (int)v;
}

static bool declared(const px__job *job, const char *name)
{
    const json_t *list = json_object_get(job->req->spec, "artifacts");
    for (size_t i = 0; i < json_array_size(list); i++)
        if (!strcmp(json_string_value(json_array_get(list, i)), name))
            return true;
    return false;
}

/* The artifact's checks, server lock held: the job is active, the member
 * (attempt, rank) is current and on the caller's node, the name was
 * declared, the quota has room. */
static int check_artifact(px__api_req *rq, px__upload *u, uint64_t length, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    px__job *job = px__srv_find_job(srv, u->job);
    if (!job) {
        px__job_row row;
        px_err err;
        if (srv->store.ops->get_job(srv->store.self, u->job, &row, &err) == PX_OK) {
            px__api_error(rs, 409, "stale attempt: job %s has ended (%s); stop this work", u->job,
                          row.state);
            px__job_row_release(&row);
        } else
            px__api_fail(rs, &err);
        return rs->status;
    }
    size_t node;
    px_err err;
    if (px_fleet_sched_find_node(srv->sched, rq->who.name, &node, NULL) != PX_OK) {
        px__api_error(rs, 404, "unknown node \"%s\": register again", rq->who.name);
        return 404;
    }
    if (px__srv_check_member(job, u->attempt, u->rank, (int)node, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return rs->status;
    }
    if (!declared(job, u->name)) {
        px__api_error(rs, 403,
                      "artifact \"%.64s\" was not declared by job %s; a job uploads only the "
                      "artifacts its spec lists",
                      u->name, u->job);
        return 403;
    }
    uint64_t used = (uint64_t)PX_MAX(job->artifact_bytes, 0);
    uint64_t quota = srv->opt.artifact_quota;
    if (used >= quota || length > quota - used) {
        px__api_error(rs, 413,
                      "job %s: artifact \"%.64s\" (%llu bytes) would pass the job's artifact "
                      "quota of %llu bytes (%llu used; plexus server --artifact-quota)",
                      u->job, u->name, (unsigned long long)length, (unsigned long long)quota,
                      (unsigned long long)used);
        return 413;
    }
    u->limit = PX_MIN(u->limit, quota - used);
    return 0;
}

static int parse_artifact_url(px__api_req *rq, px__upload *u, px__api_resp *rs)
{
    const char *rest = rq->url + strlen("/v1/agent/jobs/");
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : 0;
    if (!slash || n == 0 || n >= sizeof u->job || !px_str_starts_with(slash, "/artifacts/")) {
        px__api_error(rs, 404, "%s: no such endpoint", rq->url);
        return 404;
    }
    memcpy(u->job, rest, n);
    u->job[n] = '\0';
    bool ok = true;
    u->attempt = query_int(rq, "attempt", -1, &ok);
    u->rank = query_int(rq, "rank", 0, &ok);
    if (!ok || u->attempt < 0) {
        px__api_error(rs, 400, "?attempt= and ?rank=: expected non-negative integers");
        return 400;
    }
    if (!(u->name = px_strdup(slash + strlen("/artifacts/")))) {
        px__api_error(rs, 500, "out of memory");
        return 500;
    }
    px_err err;
    if (px__artifact_name_check(u->name, strlen(u->name), &err) != PX_OK) {
        px__api_fail(rs, &err);
        return rs->status;
    }
    return 0;
}

int px__upload_begin(px__api_req *rq, uint64_t length, px__upload **out, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    *out = NULL;
    px__upload *u = calloc(1, sizeof *u);
    if (!u) {
        px__api_error(rs, 500, "out of memory");
        return 500;
    }
    u->fd = u->dir_fd = -1;
    u->limit = srv->opt.max_upload;
    u->artifact = strcmp(rq->method, "PUT") == 0;
    int status = 0;
    if (u->artifact) {
        if (rq->who.kind != PX__WHO_NODE) {
            px__api_error(rs, 403, "artifacts are uploaded by agents");
            status = 403;
        } else if (!(status = parse_artifact_url(rq, u, rs)))
            status = check_artifact(rq, u, length, rs);
    }
    int64_t room = status ? 0 : px__srv_disk_headroom(srv);
    if (!status && (room < 0 || length > (uint64_t)room)) {
        px__api_error(rs, 507,
                      "the server's data folder has too little free space for %llu more bytes "
                      "beyond its reserve of %llu bytes; free space there (or lower plexus "
                      "server --disk-reserve) and retry",
                      (unsigned long long)length, (unsigned long long)srv->opt.disk_reserve);
        status = 507;
    }
    px_err err;
    if (!status && u->artifact) {
        if (px__artifact_dir(srv->data_dir, u->job, u->name, true, &u->dir_fd, &u->base, &err) !=
            PX_OK) {
            px__api_fail(rs, &err);
            status = rs->status;
        }
    } else if (!status) {
        u->dir_fd = open(srv->tmp_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (u->dir_fd < 0) {
            px__api_error(rs, 503, "%s: %s", srv->tmp_dir, strerror(errno));
            status = 503;
        }
    }
    if (!status) {
        /* The clock in the name as well as the process and a number: a
         * server restarted with the same process id (a container's 1)
         * does not meet the name of a file its previous run left. */
        char rnd[80];
        static atomic_uint seq;
        snprintf(rnd, sizeof rnd, "%s%ld-%llx-%u", u->artifact ? ".upload-" : "upload-",
                 (long)getpid(), (unsigned long long)px_now_ns(), atomic_fetch_add(&seq, 1));
        px_strlcpy(u->tmp, rnd, sizeof u->tmp);
        u->fd =
            openat(u->dir_fd, u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (u->fd < 0 || (u->artifact && flock(u->fd, LOCK_EX) != 0) ||
            px_sha256_new(&u->hash, NULL) != PX_OK) {
            px__api_error(rs, 503, "cannot store the upload: %s; retry", strerror(errno));
            u->tmp[0] = u->fd < 0 ? '\0' : u->tmp[0];
            status = 503;
        }
    }
    if (status) {
        px__upload_free(u);
        return status;
    }
    *out = u;
    return 0;
}

static bool all_zero(const char *p, size_t n)
{
    return n > 0 && p[0] == 0 && memcmp(p, p + 1, n - 1) == 0;
}

bool px__upload_data(px__upload *u, const char *data, size_t len)
{
    if (u->too_big || u->failed_errno)
        return false;
    if (len > u->limit - u->n) {
        u->too_big = true;
        return false;
    }
    px_sha256_update(u->hash, data, len);
    /* Pieces aligned to the file's offsets: a piece of zeros is skipped
     * and stays a hole (the final size is set at the end). */
    size_t off = 0;
    while (off < len) {
        uint64_t at = u->n + off;
        size_t piece = PX_MIN(len - off, (size_t)(PIECE - at % PIECE));
        if (!all_zero(data + off, piece)) {
            size_t done = 0;
            while (done < piece) {
                ssize_t w = pwrite(u->fd, data + off + done, piece - done, (off_t)(at + done));
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0) {
                    u->failed_errno = w < 0 ? errno : EIO;
                    return false;
                }
                done += (size_t)w;
            }
        }
        off += piece;
    }
    u->n += len;
    return true;
}

/* The blob's final place: content-addressed, so an upload of a file the
 * server has already keeps the one there.  A store that keeps blobs gets
 * it first (committed before the reply), so that every replica serves
 * it; DATA/blobs is then this replica's copy. */
static void end_blob(px__api_req *rq, px__upload *u, const char *hex, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    if (px__store_has_blobs(&srv->store)) {
        int fd = openat(u->dir_fd, u->tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        px_err err;
        px_status st =
            fd < 0 ? px_err_set(&err, PX_EIO, "%s", strerror(errno))
                   : srv->store.ops->put_blob(srv->store.self, hex, fd, (int64_t)u->n, &err);
        if (fd >= 0)
            close(fd);
        if (st != PX_OK) {
            px__api_error(rs, 503, "cannot store the blob: %s; nothing was kept, retry", err.msg);
            return;
        }
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/blobs/%s", rq->srv->data_dir, hex);
    char tmp_path[PATH_MAX];
    snprintf(tmp_path, sizeof tmp_path, "%s/%s", rq->srv->tmp_dir, u->tmp);
    if (access(path, F_OK) != 0) {
        if (rename(tmp_path, path) != 0) {
            px__api_error(rs, 503, "cannot store the blob: %s", strerror(errno));
            return;
        }
        u->tmp[0] = '\0';
        char blobs[PATH_MAX];
        snprintf(blobs, sizeof blobs, "%s/blobs", rq->srv->data_dir);
        int dfd = open(blobs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    px__api_json(rs, 201, json_pack("{s:s, s:I}", "digest", hex, "size", (json_int_t)u->n));
}

static void end_artifact(px__api_req *rq, px__upload *u, const char *hex, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    px_err err;
    /* A store that keeps artifacts' bytes gets them first, committed on a
     * connection of the call's own and without the server lock, so that
     * every replica serves the artifact once its row is written. */
    if (px__store_has_artifacts(&srv->store)) {
        int fd = openat(u->dir_fd, u->tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        px_status st = fd < 0 ? px_err_set(&err, PX_EIO, "%s", strerror(errno))
                              : srv->store.ops->put_artifact_data(srv->store.self, hex, fd,
                                                                  (int64_t)u->n, &err);
        if (fd >= 0)
            close(fd);
        if (st != PX_OK) {
            px__api_error(rs, 503,
                          "cannot store artifact %.64s of job %s: %s; nothing was kept, retry",
                          u->name, u->job, err.msg);
            return;
        }
    }
    pthread_mutex_lock(&srv->lock);
    /* The job may have moved on while the bytes arrived. */
    if (check_artifact(rq, u, u->n, rs) != 0) {
        pthread_mutex_unlock(&srv->lock);
        return;
    }
    /* An artifact uploaded again replaces the file its row names: the old
     * file keeps a second name until the new row is written and is put
     * back if the store refuses the row, so that a row and its file agree.
     * Both names change under the server lock, which the sweep of
     * DATA/artifacts takes before it removes anything. */
    char prev[sizeof u->tmp + 8];
    px_textf(prev, sizeof prev, "%s.prev", u->tmp);
    bool kept = linkat(u->dir_fd, u->base, u->dir_fd, prev, 0) == 0;
    if (!kept && errno != ENOENT) {
        px__api_error(rs, 503, "cannot store artifact %.64s: keeping its previous version: %s",
                      u->name, strerror(errno));
        pthread_mutex_unlock(&srv->lock);
        return;
    }
    if (renameat(u->dir_fd, u->tmp, u->dir_fd, u->base) != 0) {
        px__api_error(rs, 503, "cannot store artifact %.64s: %s", u->name, strerror(errno));
        if (kept)
            unlinkat(u->dir_fd, prev, 0);
        pthread_mutex_unlock(&srv->lock);
        return;
    }
    u->tmp[0] = '\0';
    fsync(u->dir_fd);
    px__artifact_row a = {u->job,  u->name,    (char *)hex,   (int64_t)u->n,
                          u->rank, u->attempt, px_wall_time()};
    if (srv->store.ops->put_artifact(srv->store.self, &a, &err) != PX_OK) {
        /* The previous version back, or no file where no row names one. */
        if (kept ? renameat(u->dir_fd, prev, u->dir_fd, u->base) : unlinkat(u->dir_fd, u->base, 0))
            px_log_warn("artifact %.64s of job %s: the store refused its row, and its file "
                        "cannot be %s: %s",
                        u->name, u->job, kept ? "put back to its previous version" : "removed",
                        strerror(errno));
        fsync(u->dir_fd);
        px__api_fail(rs, &err);
    } else {
        if (kept)
            unlinkat(u->dir_fd, prev, 0);
        px__job *job = px__srv_find_job(srv, u->job);
        if (job)
            job->artifact_bytes += (int64_t)u->n;
        px__api_json(
            rs, 201,
            json_pack("{s:s, s:I, s:s}", "name", u->name, "size", (json_int_t)u->n, "sha256", hex));
    }
    pthread_mutex_unlock(&srv->lock);
}

void px__upload_end(px__api_req *rq, px__upload *u, px__api_resp *rs)
{
    if (u->too_big) {
        px__api_error(rs, 413,
                      "%s %s: the body passed its limit of %llu bytes (the upload limit, or the "
                      "job's artifact quota)",
                      rq->method, rq->url, (unsigned long long)u->limit);
        return;
    }
    bool ok = !u->failed_errno && ftruncate(u->fd, (off_t)u->n) == 0 && fsync(u->fd) == 0;
    if (!ok) {
        int e = u->failed_errno ? u->failed_errno : errno;
        px__api_error(rs, e == ENOSPC ? 507 : 503,
                      "cannot store the upload: %s; nothing was kept, retry when the server has "
                      "room",
                      strerror(e));
        return;
    }
    /* An artifact's file stays open, and so locked, until it is renamed
     * and its row written (px__upload_free closes it). */
    if (!u->artifact) {
        close(u->fd);
        u->fd = -1;
    }
    px_digest d;
    px_sha256_final(u->hash, &d);
    u->hash = NULL;
    char hex[65];
    px_digest_hex(&d, hex);
    if (u->artifact)
        end_artifact(rq, u, hex, rs);
    else
        end_blob(rq, u, hex, rs);
}
