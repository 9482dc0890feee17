/* Files that hold secrets, and fresh secrets: private modes whatever the
 * umask, refusal of files others can read, atomic replacement. */
#include "base/common.h"

#include "fleet/secret_impl.h"
#include "plexus/fleet.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

px_status px__secret_check_fd(int fd, const char *path, const char *what, px_err *err)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return px_err_set(err, PX_EIO, "%s %s: %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return px_err_set(err, PX_EINVAL, "%s %s: not a regular file", what, path);
    if (sb.st_mode & 077)
        return px_err_set(err, PX_EAUTH,
                          "%s %s: the file is readable by group or others (mode %04o), and it "
                          "holds a secret; make it private with: chmod 600 %s",
                          what, path, (unsigned)(sb.st_mode & 07777), path);
    return PX_OK;
}

void px__secret_wipe(void *p, size_t n)
{
    if (!p)
        return;
    volatile char *c = p;
    if (!n)
        while (c[n])
            n++;
    for (size_t i = 0; i < n; i++)
        c[i] = 0;
}

px_status px__secret_read_file(const char *path, const char *what, size_t max, char **out,
                               size_t *len, px_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s %s: cannot open: %s",
                          what, path, strerror(errno));
    px_status st = px__secret_check_fd(fd, path, what, err);
    px_strbuf sb = PX_STRBUF_INIT;
    char buf[4096];
    ssize_t n;
    while (st == PX_OK && (n = read(fd, buf, sizeof buf)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            st = px_err_set(err, PX_EIO, "%s %s: %s", what, path, strerror(errno));
        else if (sb.len + (size_t)n > max)
            st = px_err_set(err, PX_ELIMIT, "%s %s: larger than %zu bytes", what, path, max);
        else if (px_strbuf_add(&sb, buf, (size_t)n) != PX_OK)
            st = px_err_set(err, PX_ENOMEM, "out of memory");
    }
    px__secret_wipe(buf, sizeof buf);
    close(fd);
    if (st != PX_OK) {
        px__secret_wipe(sb.buf, sb.len);
        px_strbuf_release(&sb);
        return st;
    }
    if (len)
        *len = sb.len;
    *out = px_strbuf_detach(&sb, NULL);
    if (!*out)
        *out = px_strdup("");
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
}

px_status px__private_dir(const char *path, px_err *err)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return px_err_set(err, PX_EIO, "%s: cannot create the folder: %s", path, strerror(errno));
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return px_err_set(err, PX_EIO, "%s: not a folder (or a link): %s", path, strerror(errno));
    struct stat sb;
    px_status st = PX_OK;
    if (fstat(fd, &sb) != 0)
        st = px_err_set(err, PX_EIO, "%s: %s", path, strerror(errno));
    else if (sb.st_uid != geteuid())
        st = px_err_set(err, PX_EAUTH,
                        "%s: the folder belongs to uid %u, not to this process (uid %u); give a "
                        "folder of your own",
                        path, (unsigned)sb.st_uid, (unsigned)geteuid());
    else if ((sb.st_mode & 077) && fchmod(fd, 0700) != 0)
        st = px_err_set(err, PX_EIO, "%s: cannot make it private (chmod 700): %s", path,
                        strerror(errno));
    close(fd);
    return st;
}

px_status px__secret_write_file(const char *path, const void *data, size_t len, px_err *err)
{
    char *tmp = px_asprintf("%s.tmp.%ld", path, (long)getpid());
    if (!tmp)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    px_status st = PX_OK;
    if (fd < 0) {
        st = px_err_set(err, PX_EIO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    /* The umask may have taken bits away, never added any; fchmod makes
     * the mode exactly 0600 either way. */
    const char *p = data;
    size_t left = len;
    bool ok = fchmod(fd, 0600) == 0;
    while (ok && left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        ok = w > 0;
        if (ok) {
            p += w;
            left -= (size_t)w;
        }
    }
    ok = ok && fsync(fd) == 0;
    if (close(fd) != 0)
        ok = false;
    if (!ok || rename(tmp, path) != 0) {
        st = px_err_set(err, PX_EIO, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    /* The rename is durable once the folder is. */
    char *dir = px_strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash) {
        *slash = '\0';
        int dfd = open(slash == dir ? "/" : dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    free(dir);
done:
    free(tmp);
    return st;
}

px_status px__secret_new(const char *prefix, char *out, size_t n, px_err *err)
{
    unsigned char b[32];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return px_err_set(err, PX_EIO, "cannot read random bytes for a secret: %s",
                              strerror(errno));
        got += (size_t)r;
    }
    size_t pl = strlen(prefix);
    if (n < pl + 2 * sizeof b + 1)
        return px_err_set(err, PX_EINTERNAL, "secret buffer too small");
    memcpy(out, prefix, pl);
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(out + pl + 2 * i, 3, "%02x", b[i]);
    px__secret_wipe(b, sizeof b);
    return PX_OK;
}

bool px__token_valid(const char *token)
{
    size_t n = token ? strlen(token) : 0;
    if (n < 16 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)token[i] <= ' ' || (unsigned char)token[i] >= 127)
            return false;
    return true;
}

px_status px_fleet_secret_read(const char *path, const char *what, char **out, px_err *err)
{
    *out = NULL;
    char *text;
    size_t len;
    px_status st = px__secret_read_file(path, what, 64 * 1024, &text, &len, err);
    if (st != PX_OK)
        return st;
    /* The first word of the first line that is not a comment. */
    char *tok = NULL;
    for (char *line = text; line && *line && !tok;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p && *p != '#') {
            size_t w = strcspn(p, " \t\r");
            tok = px_strndup(p, w);
            if (!tok)
                st = px_err_set(err, PX_ENOMEM, "out of memory");
        }
        line = nl ? nl + 1 : NULL;
    }
    px__secret_wipe(text, len);
    free(text);
    if (st != PX_OK)
        return st;
    if (!tok)
        return px_err_set(err, PX_EINVAL, "%s %s: the file holds no token", what, path);
    if (!px__token_valid(tok)) {
        px__secret_wipe(tok, 0);
        free(tok);
        return px_err_set(err, PX_EINVAL,
                          "%s %s: a token is 16 to 256 printable characters without spaces", what,
                          path);
    }
    *out = tok;
    return PX_OK;
}
