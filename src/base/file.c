/* Bounded file reading, atomic writes, clocks and RFC 3339 times. */
#include "base/common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

px_status px_read_file(const char *path, size_t max_bytes, char **out, size_t *len, px_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0) {
        int e = errno;
        close(fd);
        return px_err_set(err, PX_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(stbuf.st_mode)) {
        close(fd);
        return px_err_set(err, PX_EINVAL, "%s: is a folder, not a file", path);
    }
    if (S_ISREG(stbuf.st_mode) && (uint64_t)stbuf.st_size > max_bytes) {
        close(fd);
        return px_err_set(err, PX_ELIMIT,
                          "%s: file is %lld bytes, more than the limit of %zu bytes", path,
                          (long long)stbuf.st_size, max_bytes);
    }
    /* Read in chunks: special files report no size. */
    size_t cap = S_ISREG(stbuf.st_mode) ? (size_t)stbuf.st_size + 1 : 4096;
    char *buf = malloc(cap);
    size_t n = 0;
    if (!buf) {
        close(fd);
        return px_err_set(err, PX_ENOMEM, "%s: out of memory reading", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > max_bytes + 1) {
                free(buf);
                close(fd);
                return px_err_set(err, PX_ELIMIT, "%s: more than the limit of %zu bytes", path,
                                  max_bytes);
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                close(fd);
                return px_err_set(err, PX_ENOMEM, "%s: out of memory reading", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return px_err_set(err, PX_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max_bytes) {
            free(buf);
            close(fd);
            return px_err_set(err, PX_ELIMIT, "%s: more than the limit of %zu bytes", path,
                              max_bytes);
        }
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return PX_OK;
}

px_status px_write_file(const char *path, const void *data, size_t len, px_err *err)
{
    char *tmp = px_asprintf("%s.tmp.%ld", path, (long)getpid());
    if (!tmp)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    const unsigned char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            goto fail;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0)
        goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        goto fail;
    free(tmp);
    return PX_OK;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    return px_err_set(err, PX_EIO, "%s: cannot write: %s", path, strerror(e));
}

uint64_t px_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t px_wall_time(void)
{
    return (int64_t)time(NULL);
}

void px_time_format(int64_t unix_seconds, char out[32])
{
    time_t t = (time_t)unix_seconds;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        px_strlcpy(out, "1970-01-01T00:00:00Z", 32);
}

px_status px_time_parse(const char *text, int64_t *out, px_err *err)
{
    int y, mo, d, h, mi, s;
    char z = 0;
    int used = 0;
    if (strlen(text) != 20 ||
        sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d%c%n", &y, &mo, &d, &h, &mi, &s, &z, &used) != 7 ||
        z != 'Z' || used != 20 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
        s > 60 || y < 1970 || y > 9999)
        return px_err_set(err, PX_EPARSE,
                          "\"%.40s\" is not a UTC time; write it as RFC 3339 with a Z, "
                          "e.g. \"2026-11-29T16:25:10Z\"",
                          text);
    /* Days from civil (Howard Hinnant's algorithm), no time zone involved. */
    int yy = y - (mo <= 2);
    int era = yy / 400;
    int yoe = yy - era * 400;
    int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    int64_t days = (int64_t)era * 146097 + doe - 719468;
    *out = days * 86400 + h * 3600 + mi * 60 + s;
    return PX_OK;
}
