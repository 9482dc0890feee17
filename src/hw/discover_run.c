/* Discovery: running external commands (nvidia-smi, python3) without a
 * shell, with a time limit and a bound on what they print. */
#include "hw/discover_impl.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bool is_executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

px_status px__disc_find_program(const char *name, char **out)
{
    *out = NULL;
    if (!name || !name[0])
        return PX_ENOTFOUND;
    if (strchr(name, '/')) {
        if (!is_executable_file(name))
            return PX_ENOTFOUND;
        *out = px_strdup(name);
        return *out ? PX_OK : PX_ENOMEM;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0])
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        /* An empty PATH entry means the current folder (POSIX). */
        char *cand = n ? px_asprintf("%.*s/%s", (int)n, p, name) : px_asprintf("./%s", name);
        if (!cand)
            return PX_ENOMEM;
        if (is_executable_file(cand)) {
            *out = cand;
            return PX_OK;
        }
        free(cand);
        if (!colon)
            break;
        p = colon + 1;
    }
    return PX_ENOTFOUND;
}

void px__cmd_result_release(px__cmd_result *res)
{
    if (!res)
        return;
    free(res->out);
    free(res->err_text);
    memset(res, 0, sizeof *res);
    res->exit_code = -1;
}

void px__cmd_describe(const px__cmd_result *res, char *buf, size_t n)
{
    int k;
    if (res->term_signal)
        k = snprintf(buf, n, "killed by signal %d", res->term_signal);
    else
        k = snprintf(buf, n, "exited with status %d", res->exit_code);
    if (k < 0 || (size_t)k >= n || !res->err_text || !res->err_text[0])
        return;
    const char *e = res->err_text;
    while (*e == ' ' || *e == '\n' || *e == '\t')
        e++;
    size_t len = strcspn(e, "\r\n");
    if (len > 160)
        len = 160;
    if (len)
        snprintf(buf + k, n - (size_t)k, ": %.*s", (int)len, e);
}

/* Appends what is readable on fd to sb, keeping at most cap bytes.
 * Returns false at end of file; *over is set when bytes were dropped. */
static bool pump(int fd, px_strbuf *sb, size_t cap, bool *over, bool *nomem)
{
    char buf[8192];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0)
        return errno == EINTR || errno == EAGAIN;
    if (r == 0)
        return false;
    size_t keep = (size_t)r;
    if (sb->len + keep > cap) {
        keep = cap > sb->len ? cap - sb->len : 0;
        *over = true;
    }
    if (keep && px_strbuf_add(sb, buf, keep) != PX_OK)
        *nomem = true;
    return true;
}

static void kill_group(pid_t pid)
{
    /* The child made itself a group leader, so this reaches whatever it
     * started too (a shell script's own children hold the pipe open). */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
}

px_status px__disc_run(char *const argv[], double timeout, size_t max_out, px__cmd_result *res,
                       px_err *err)
{
    memset(res, 0, sizeof *res);
    res->exit_code = -1;
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        return px_err_set(err, PX_EIO, "cannot open /dev/null: %s", strerror(errno));
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
        px_err_set(err, PX_EIO, "cannot create a pipe for %s: %s", argv[0], strerror(errno));
        goto fail_pipes;
    }
    pid_t pid = fork();
    if (pid < 0) {
        px_err_set(err, PX_EIO, "cannot start %s: %s", argv[0], strerror(errno));
        goto fail_pipes;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls from here on: the parent may have
         * other threads. */
        setpgid(0, 0);
        dup2(devnull, 0);
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
        execv(argv[0], argv);
        static const char msg[] = "cannot execute the program\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* also here, so that kill_group cannot race the child */
    close(devnull);
    close(out_pipe[1]);
    close(err_pipe[1]);
    devnull = out_pipe[1] = err_pipe[1] = -1;

    px_strbuf sout = PX_STRBUF_INIT, serr = PX_STRBUF_INIT;
    bool open_out = true, open_err = true, over = false, err_over = false, nomem = false;
    bool timed_out = false;
    uint64_t deadline = px_now_ns() + (uint64_t)(timeout * 1e9);
    while (open_out || open_err) {
        uint64_t now = px_now_ns();
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        struct pollfd fds[2] = {{open_out ? out_pipe[0] : -1, POLLIN, 0},
                                {open_err ? err_pipe[0] : -1, POLLIN, 0}};
        uint64_t left_ms = (deadline - now) / 1000000 + 1;
        int r = poll(fds, 2, left_ms > 1000 ? 1000 : (int)left_ms);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (open_out && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
            open_out = pump(out_pipe[0], &sout, max_out, &over, &nomem);
        if (open_err && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)))
            open_err = pump(err_pipe[0], &serr, PX__DISC_MAX_STDERR, &err_over, &nomem);
        if (over || nomem)
            break;
    }
    int status = 0;
    if (timed_out || over || nomem) {
        kill_group(pid);
        waitpid(pid, &status, 0);
    } else {
        /* Both pipes closed; the process normally exits right after. */
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid || (w < 0 && errno != EINTR))
                break;
            if (px_now_ns() >= deadline) {
                timed_out = true;
                kill_group(pid);
                waitpid(pid, &status, 0);
                break;
            }
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    close(out_pipe[0]);
    close(err_pipe[0]);
    if (WIFEXITED(status))
        res->exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        res->term_signal = WTERMSIG(status);
    res->out = px_strbuf_detach(&sout, &res->len);
    res->err_text = px_strbuf_detach(&serr, NULL);
    if (nomem || !res->out || !res->err_text)
        return px_err_set(err, PX_ENOMEM, "out of memory reading the output of %s", argv[0]);
    if (timed_out)
        return px_err_set(err, PX_ETIMEOUT, "%s did not finish within %g s and was killed", argv[0],
                          timeout);
    if (over)
        return px_err_set(err, PX_ELIMIT, "%s printed more than %zu bytes and was stopped", argv[0],
                          max_out);
    return PX_OK;

fail_pipes:
    for (int i = 0; i < 2; i++) {
        if (out_pipe[i] >= 0)
            close(out_pipe[i]);
        if (err_pipe[i] >= 0)
            close(err_pipe[i]);
    }
    close(devnull);
    return err ? err->code : PX_EIO;
}
