/* What uploads leave behind that nothing names.
 *
 * Artifacts' bytes in the store.  An upload stores the bytes of an
 * artifact (store slot put_artifact_data) before it writes the row that
 * names them, so that a row always has its bytes; bytes whose row never
 * came (the job moved on while they arrived, the replica died between the
 * two) are named by nothing.  The replica that schedules removes them,
 * when it takes the lease and then every PX__COLLECT_EVERY_S, once they
 * are older than PX__COLLECT_GRACE_S: an upload in flight has stored its
 * bytes and is about to write its row, and the grace period (an hour, for
 * a gap of milliseconds to seconds) keeps them.  The store's own
 * connection is never used, nor the server lock held, while the database
 * deletes.
 *
 * Files in DATA/artifacts.  An artifact arrives in a temporary file
 * (".upload-*") in its own folder, renamed into place under the server
 * lock just before its row is written (a row the store refuses puts the
 * previous file back, or removes the new one).  A server killed mid-upload
 * leaves the temporary file, and one killed between the rename and the row
 * leaves a file no row names.  Every server removes
 * such files from its data folder at start and then every
 * PX__COLLECT_EVERY_S: a file older than PX__COLLECT_GRACE_S (its last
 * write) that no artifact row of its job names and that no upload holds.
 * An upload locks its file (flock) from its creation until its row is
 * written, so a file in flight is kept whatever its age; the date covers
 * the moment between its creation and its lock.  Folders of jobs the
 * store does not know are left alone (the server never makes them), as are
 * folders themselves. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define COLLECT_MAX 256 /* rows deleted per statement (each its own transaction) */
/* The deepest folder an artifact's name makes (255 bytes, "a/b/..."), and
 * the longest path in a job's folder an upload makes: a name and, beside
 * it, a temporary file's.  Anything past these is not the server's. */
#define SWEEP_DEPTH   128
#define SWEEP_REL_MAX 512

static bool has_collector(const px_fleet_server *srv)
{
    const px__store_ops *o = srv->store.ops;
    return o->version >= 13 && o->collect_artifact_data;
}

px_status px__srv_collect_artifacts(px_fleet_server *srv, int64_t now, int64_t grace,
                                    int64_t *removed, int64_t *bytes, px_err *err)
{
    *removed = *bytes = 0;
    if (!has_collector(srv))
        return PX_OK;
    for (;;) {
        int64_t n = 0, size = 0;
        px_status st = srv->store.ops->collect_artifact_data(srv->store.self, now - grace,
                                                             COLLECT_MAX, &n, &size, err);
        if (st != PX_OK)
            return st;
        *removed += n;
        *bytes += size;
        if (n < COLLECT_MAX)
            return PX_OK;
    }
}

/* One sweep of DATA/artifacts. */
typedef struct sweep {
    px_fleet_server *srv;
    int64_t before;          /* files last written before this (wall seconds) are old */
    const char *job;         /* the job whose folder is walked */
    json_t *names;           /* its artifacts' names (an object used as a set) */
    char rel[SWEEP_REL_MAX]; /* the path walked, in the job's folder */
    int64_t removed, bytes;
    px_status st; /* the first failure, in err */
    px_err err;
} sweep;

static void add_name(const px__artifact_row *a, void *ud)
{
    json_object_set_new_nocheck(ud, a->name, json_true());
}

/* The names of the job's artifact rows into s->names; false when the
 * store does not know the job, or failed (said in s->err).  Server lock
 * held: the SQLite store's connection is shared under it. */
static bool job_names(sweep *s)
{
    px_fleet_server *srv = s->srv;
    json_object_clear(s->names);
    px_err err;
    if (srv->store.ops->list_artifacts(srv->store.self, s->job, add_name, s->names, &err) !=
        PX_OK) {
        if (s->st == PX_OK)
            s->st = px_err_set(&s->err, err.code, "%s", err.msg);
        return false;
    }
    if (json_object_size(s->names) > 0)
        return true;
    px__job_row row;
    px_status st = srv->store.ops->get_job(srv->store.self, s->job, &row, &err);
    if (st == PX_OK)
        px__job_row_release(&row);
    else if (st != PX_ENOTFOUND && s->st == PX_OK)
        s->st = px_err_set(&s->err, err.code, "%s", err.msg);
    return st == PX_OK;
}

/* Removes the file `name` of dir (s->rel in the job's folder) if it is
 * still old, unlocked and unnamed.  The lock taken here is never given
 * back to an upload: names are never made again, so a file nobody holds
 * and that is old is a leftover. */
static void remove_unused(sweep *s, int dir, const char *name)
{
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat was, is;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        /* Held: an upload in flight.  Any other failure: the lock cannot
         * say, so the file stays, and the log says why. */
        if (errno != EWOULDBLOCK && s->st == PX_OK)
            s->st = px_err_set(&s->err, PX_EIO,
                               "artifacts of job %s: %s: cannot tell whether an upload holds "
                               "it (flock: %s); it stays",
                               s->job, s->rel, strerror(errno));
        close(fd);
        return;
    }
    if (fstat(fd, &was) != 0 || !S_ISREG(was.st_mode) || was.st_mtime >= s->before) {
        close(fd);
        return;
    }
    /* Under the server lock, the names of the job's rows read again and the
     * name checked to be this very file: an upload renames its file into
     * place and writes its row under that lock, so neither can come
     * between the checks and the removal. */
    pthread_mutex_lock(&s->srv->lock);
    if (job_names(s) && !json_object_get(s->names, s->rel) &&
        fstatat(dir, name, &is, AT_SYMLINK_NOFOLLOW) == 0 && is.st_ino == was.st_ino &&
        is.st_dev == was.st_dev && unlinkat(dir, name, 0) == 0) {
        s->removed++;
        s->bytes += (int64_t)was.st_size;
    }
    pthread_mutex_unlock(&s->srv->lock);
    close(fd);
}

/* Walks dir (s->rel, len bytes of it) for old files no row names; links
 * are never followed. */
static void sweep_dir(sweep *s, int dir, size_t len, int depth)
{
    int own = dup(dir);
    DIR *d = own >= 0 ? fdopendir(own) : NULL;
    if (!d) {
        if (own >= 0)
            close(own);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        size_t n = strlen(name);
        if (len + (len > 0) + n >= sizeof s->rel)
            continue;
        if (len > 0)
            s->rel[len] = '/';
        memcpy(s->rel + len + (len > 0), name, n + 1);
        size_t sub_len = len + (len > 0) + n;
        struct stat sb;
        bool seen = fstatat(dir, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
        if (seen && S_ISDIR(sb.st_mode) && depth < SWEEP_DEPTH) {
            int sub = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                sweep_dir(s, sub, sub_len, depth + 1);
                close(sub);
            }
        } else if (seen && S_ISREG(sb.st_mode) && sb.st_mtime < s->before &&
                   !json_object_get(s->names, s->rel)) {
            remove_unused(s, dir, name);
        }
        s->rel[len] = '\0';
    }
    closedir(d);
}

px_status px__srv_collect_files(px_fleet_server *srv, int64_t now, int64_t grace, int64_t *removed,
                                int64_t *bytes, px_err *err)
{
    *removed = *bytes = 0;
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/artifacts", srv->data_dir);
    int top = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = top >= 0 ? fdopendir(top) : NULL;
    if (!d) {
        px_status st = px_err_set(err, PX_EIO, "%s: %s", root, strerror(errno));
        if (top >= 0)
            close(top);
        return st;
    }
    sweep s = {.srv = srv, .before = now - grace, .names = json_object()};
    if (!s.names) {
        closedir(d);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int job = openat(top, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (job < 0)
            continue;
        s.job = e->d_name;
        s.rel[0] = '\0';
        pthread_mutex_lock(&srv->lock);
        bool known = job_names(&s);
        pthread_mutex_unlock(&srv->lock);
        if (known)
            sweep_dir(&s, job, 0, 1);
        close(job);
    }
    closedir(d);
    json_decref(s.names);
    *removed = s.removed;
    *bytes = s.bytes;
    if (s.st != PX_OK)
        return px_err_set(err, s.st, "%s: %s", root, s.err.msg);
    return PX_OK;
}

/* Sweeps the data folder at once and then every period; collects the
 * store's bytes while this replica schedules.  A failure is said in the
 * log and tried again at the next period (what it would remove stays
 * unused, and nothing depends on it being gone). */
static void *collect_main(void *arg)
{
    px_fleet_server *srv = arg;
    uint64_t files_due = 0, store_due = 0; /* at once; the store's on taking the lease */
    bool was_active = false;
    uint64_t period = (uint64_t)PX__COLLECT_EVERY_S * 1000000000ull;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        uint64_t now = px_now_ns();
        bool active = atomic_load(&srv->active) && has_collector(srv);
        if (active && !was_active)
            store_due = now;
        was_active = active;
        bool files = now >= files_due, store = active && now >= store_due;
        if (!files && !store) {
            /* A replica that does not schedule looks again each second for
             * the lease. */
            uint64_t wake = PX_MIN(files_due, active ? store_due : now + 1000000000ull);
            px__srv_wait(srv, wake);
            continue;
        }
        pthread_mutex_unlock(&srv->lock);
        int64_t removed = 0, bytes = 0;
        px_err err = {0};
        if (files) {
            px_status st = px__srv_collect_files(srv, px_wall_time(), PX__COLLECT_GRACE_S, &removed,
                                                 &bytes, &err);
            if (st != PX_OK)
                px_log_warn("server: removing files of uploads that no artifact names: %s; "
                            "tried again in %d s",
                            err.msg, PX__COLLECT_EVERY_S);
            if (removed > 0)
                px_log_info("server: removed %" PRId64 " files in the artifacts folder that no "
                            "artifact names (%" PRId64 " bytes; uploads cut off by a crash or "
                            "refused after their rename)",
                            removed, bytes);
        }
        if (store) {
            px_status st = px__srv_collect_artifacts(srv, px_wall_time(), PX__COLLECT_GRACE_S,
                                                     &removed, &bytes, &err);
            if (st != PX_OK)
                px_log_warn("server: collecting artifacts' bytes that no artifact names: %s; "
                            "tried again in %d s",
                            err.msg, PX__COLLECT_EVERY_S);
            else if (removed > 0)
                px_log_info("server: removed the bytes of %" PRId64 " artifacts that no "
                            "artifact names (%" PRId64 " bytes; uploads refused or cut off "
                            "before their row)",
                            removed, bytes);
        }
        pthread_mutex_lock(&srv->lock);
        if (files)
            files_due = px_now_ns() + period;
        if (store)
            store_due = px_now_ns() + period;
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

px_status px__srv_collect_start(px_fleet_server *srv, px_err *err)
{
    if (pthread_create(&srv->collect_thread, NULL, collect_main, srv) != 0)
        return px_err_set(err, PX_EINTERNAL,
                          "cannot start the thread that collects what uploads left behind");
    srv->collect_thread_started = true;
    return PX_OK;
}

void px__srv_collect_stop(px_fleet_server *srv)
{
    if (srv->collect_thread_started)
        pthread_join(srv->collect_thread, NULL);
    srv->collect_thread_started = false;
}
