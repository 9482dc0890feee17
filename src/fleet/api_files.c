/* Artifact and blob files on the server: names that cannot escape their
 * folder, every path component opened with O_NOFOLLOW, atomic blobs
 * (fetched from the store where it keeps them, DATA/blobs then a cache). */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

px_status px__artifact_name_check(const char *name, size_t len, px_err *err)
{
    if (len == 0 || len > 255)
        return px_err_set(err, PX_EINVAL, "artifact name must have 1 to 255 bytes");
    if (strlen(name) != len)
        return px_err_set(err, PX_EINVAL, "artifact name contains a NUL byte");
    if (name[0] == '/')
        return px_err_set(err, PX_EINVAL,
                          "artifact name \"%.64s\" is absolute; use a path "
                          "relative to the job's folder",
                          name);
    if (strchr(name, '\\'))
        return px_err_set(err, PX_EINVAL, "artifact name \"%.64s\" contains a backslash", name);
    for (const char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return px_err_set(err, PX_EINVAL,
                              "artifact name contains a NUL or control character (byte %zu); "
                              "use printable names",
                              (size_t)(c - name));
    const char *p = name;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return px_err_set(err, PX_EINVAL,
                              "artifact name \"%.64s\" has an empty, \".\" or \"..\" component; "
                              "artifacts cannot leave their job's folder",
                              name);
        if (!slash)
            break;
        p = slash + 1;
        if (!*p)
            return px_err_set(err, PX_EINVAL, "artifact name \"%.64s\" ends with /", name);
    }
    return PX_OK;
}

px_status px__artifact_dir(const char *data_dir, const char *job, const char *name, bool create,
                           int *out_dir, const char **base, px_err *err)
{
    px_status st = px__artifact_name_check(name, strlen(name), err);
    if (st != PX_OK)
        return st;
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/artifacts", data_dir);
    int dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return px_err_set(err, PX_EIO, "%s: %s", root, strerror(errno));
    char *path = px_asprintf("%s/%s", job, name);
    if (!path) {
        close(dir);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    char *p = path;
    for (;;) {
        char *slash = strchr(p, '/');
        if (!slash)
            break;
        *slash = '\0';
        if (create && mkdirat(dir, p, 0700) != 0 && errno != EEXIST) {
            st = px_err_set(err, PX_EIO, "artifact %s: cannot create folder: %s", name,
                            strerror(errno));
            goto done;
        }
        int next = openat(dir, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            st = px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EINVAL, "artifact %s: %s",
                            name, errno == ENOENT ? "not found" : "a folder on its path is a link");
            goto done;
        }
        close(dir);
        dir = next;
        p = slash + 1;
    }
    *out_dir = dir;
    dir = -1;
    *base = name + (p - path) - strlen(job) - 1;
done:
    free(path);
    if (dir >= 0)
        close(dir);
    return st;
}

/* Opens DATA/artifacts/<job>/<name> walking one component at a time with
 * O_NOFOLLOW, so a symbolic link planted anywhere on the way is refused. */
px_status px__artifact_open(const char *data_dir, const char *job, const char *name, bool create,
                            int *out_fd, px_err *err)
{
    int dir;
    const char *base;
    px_status st = px__artifact_dir(data_dir, job, name, create, &dir, &base, err);
    if (st != PX_OK)
        return st;
    int fd = openat(dir, base,
                    create ? O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC
                           : O_RDONLY | O_NOFOLLOW | O_CLOEXEC,
                    0600);
    if (fd < 0)
        st = px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EINVAL, "artifact %s: %s", name,
                        errno == ENOENT ? "not found" : strerror(errno));
    else
        *out_fd = fd;
    close(dir);
    return st;
}

px_status px__write_all(int fd, const void *data, size_t len, px_err *err)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return px_err_set(err, PX_EIO, "write failed: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    if (fsync(fd) != 0)
        return px_err_set(err, PX_EIO, "fsync failed: %s", strerror(errno));
    return PX_OK;
}

px_status px__blob_path(const char *data_dir, const char *hex, char *out, size_t n, px_err *err)
{
    px_digest d;
    if (strlen(hex) != 64 || px_digest_parse(hex, &d) != PX_OK)
        return px_err_set(err, PX_EINVAL, "blob \"%.80s\": expected a SHA-256 as 64 hex digits",
                          hex);
    char canon[65];
    px_digest_hex(&d, canon);
    snprintf(out, n, "%s/blobs/%s", data_dir, canon);
    return PX_OK;
}

/* Opens a file for reading (no links) and reports its size. */
px_status px__open_read(const char *path, int *fd, size_t *size, px_err *err)
{
    int f = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s",
                          errno == ENOENT ? "not found" : strerror(errno));
    struct stat stt;
    if (fstat(f, &stt) != 0 || !S_ISREG(stt.st_mode)) {
        close(f);
        return px_err_set(err, PX_EIO, "not a regular file");
    }
    *fd = f;
    *size = (size_t)stt.st_size;
    return PX_OK;
}

bool px__store_has_blobs(const px__store *store)
{
    return store->ops->version >= 9 && store->ops->put_blob && store->ops->get_blob;
}

bool px__store_has_artifacts(const px__store *store)
{
    return store->ops->version >= 10 && store->ops->put_artifact_data &&
           store->ops->get_artifact_data;
}

/* The store writes a blob to the pipe's end from its own thread, while
 * the fetching thread copies it to the file, up to the room it has. */
typedef struct blob_pipe {
    const px__store *store;
    const char *hex;
    int fd; /* the write end; closed when the store is done */
    int64_t size;
    px_status st;
    px_err err;
} blob_pipe;

static void *blob_pipe_run(void *arg)
{
    blob_pipe *bp = arg;
    bp->st = bp->store->ops->get_blob(bp->store->self, bp->hex, bp->fd, &bp->size, &bp->err);
    close(bp->fd);
    return NULL;
}

/* Copies the store's blob into fd, refusing it (PX_ELIMIT, nothing past
 * room written) when it is larger than room: the size is known only once
 * the store has sent it, so the rest is read and dropped, never written
 * to the disk the reserve protects. */
static px_status get_blob_bounded(px_fleet_server *srv, const char *hex, int fd, int64_t room,
                                  int64_t *size, px_err *err)
{
    int p[2];
    char *buf = malloc(1u << 16);
    if (!buf || pipe2(p, O_CLOEXEC) != 0) {
        free(buf);
        return px_err_set(err, PX_EIO, "blob %.16s...: cannot fetch it: %s", hex,
                          buf ? strerror(errno) : "out of memory");
    }
    blob_pipe bp = {.store = &srv->store, .hex = hex, .fd = p[1]};
    pthread_t th;
    if (pthread_create(&th, NULL, blob_pipe_run, &bp) != 0) {
        close(p[0]);
        close(p[1]);
        free(buf);
        return px_err_set(err, PX_EIO, "blob %.16s...: cannot start its fetch", hex);
    }
    int64_t got = 0;
    px_status wst = PX_OK;
    for (;;) {
        ssize_t n = read(p[0], buf, 1u << 16);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (wst == PX_OK && got + n > room)
            wst = PX_ELIMIT;
        for (ssize_t off = 0; wst == PX_OK && off < n;) {
            ssize_t w = write(fd, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                wst = px_err_set(err, PX_EIO, "blob %.16s...: cannot write it: %s", hex,
                                 w < 0 ? strerror(errno) : "short write");
            else
                off += w;
        }
        got += n;
    }
    close(p[0]);
    pthread_join(th, NULL);
    free(buf);
    *size = got;
    if (bp.st != PX_OK) {
        if (err)
            *err = bp.err;
        return bp.st;
    }
    if (wst == PX_ELIMIT)
        return px_err_set(err, PX_ELIMIT,
                          "blob %.16s...: its %lld bytes would leave less free space in the "
                          "server's data folder than its reserve of %llu bytes (%lld left above "
                          "it); free space there (or lower plexus server --disk-reserve) and "
                          "retry",
                          hex, (long long)got, (unsigned long long)srv->opt.disk_reserve,
                          (long long)PX_MAX(room, 0));
    return wst;
}

px_status px__blob_fetch(px_fleet_server *srv, const char *hex, px_err *err)
{
    char path[PATH_MAX];
    px_status st = px__blob_path(srv->data_dir, hex, path, sizeof path, err);
    if (st != PX_OK)
        return st;
    if (access(path, F_OK) == 0)
        return PX_OK;
    if (!px__store_has_blobs(&srv->store))
        return px_err_set(err, PX_ENOTFOUND, "no blob %.64s; upload it with POST /v1/blobs", hex);
    /* "upload-" as uploads in flight: a crash's leftovers are removed at
     * the next start (clean_tmp). */
    static atomic_uint seq;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/upload-fetch-%ld-%u", srv->tmp_dir, (long)getpid(),
             atomic_fetch_add(&seq, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return px_err_set(err, PX_EIO, "blob %.16s...: %s: %s", hex, tmp, strerror(errno));
    int64_t size = 0;
    st =
        get_blob_bounded(srv, path + strlen(path) - 64, fd, px__srv_disk_headroom(srv), &size, err);
    if (st == PX_OK && fsync(fd) != 0)
        st = px_err_set(err, PX_EIO, "blob %.16s...: fsync failed: %s", hex, strerror(errno));
    close(fd);
    if (st == PX_OK && rename(tmp, path) != 0)
        st = px_err_set(err, PX_EIO, "blob %.16s...: cannot keep it: %s", hex, strerror(errno));
    if (st != PX_OK) {
        unlink(tmp);
        if (st == PX_ENOTFOUND)
            px_err_set(err, PX_ENOTFOUND, "no blob %.64s; upload it with POST /v1/blobs", hex);
        return st;
    }
    char blobs[PATH_MAX];
    snprintf(blobs, sizeof blobs, "%s/blobs", srv->data_dir);
    int dfd = open(blobs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    px_log_info("fleet: blob %.16s... (%lld bytes) fetched from the store", hex, (long long)size);
    return PX_OK;
}
