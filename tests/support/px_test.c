/* Test helpers: shared models, temporary folders, running the command. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "px_test.h"

static char *join(const char *a, const char *b)
{
    return px_asprintf("%s/%s", a, b);
}

char *px_test_shared_model(const char *name)
{
    const char *dir = getenv("PX_SHARED_DIR");
#ifdef PX_SHARED_DIR
    if (!dir)
        dir = PX_SHARED_DIR;
#endif
    if (!dir)
        return NULL;
    char *models = join(dir, "models");
    char *p = join(models, name);
    free(models);
    return p;
}

char *px_test_require_shared_model(const char *name)
{
    char *p = px_test_shared_model(name);
    if (!p || access(p, R_OK) != 0) {
        print_message("skipped: %s is absent (tests that use the shared tiny "
                      "models need ../shared/models beside the checkout)\n",
                      p ? p : name);
        free(p);
        skip();
    }
    return p;
}

char *px_test_source_path(const char *rel)
{
    const char *dir = getenv("PX_SOURCE_DIR");
#ifdef PX_SOURCE_DIR
    if (!dir)
        dir = PX_SOURCE_DIR;
#endif
    return join(dir ? dir : ".", rel);
}

static char tmp_root[256];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_tmp(void)
{
    if (tmp_root[0])
        nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *px_test_tmpdir(void)
{
    if (!tmp_root[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp_root, sizeof tmp_root, "%s/plexus-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(tmp_root)) {
            tmp_root[0] = '\0';
            fail_msg("cannot create a temporary folder: %s", strerror(errno));
        }
        atexit(rm_tmp);
    }
    return tmp_root;
}

const char *px_test_plexus_bin(void)
{
    const char *b = getenv("PLEXUS_BIN");
    return b ? b : "plexus";
}

static void drain(int fd, px_strbuf *sb)
{
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0)
        px_strbuf_add(sb, buf, (size_t)n);
}

int px_test_run_input(char *const argv[], const char *input, int timeout_s, char **out, char **err)
{
    int po[2], pe[2], pi[2];
    if (pipe(po) || pipe(pe) || pipe(pi))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(pi[0], 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        close(pi[1]);
        setpgid(0, 0);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    close(pi[0]);
    if (input) {
        size_t left = strlen(input);
        const char *p = input;
        signal(SIGPIPE, SIG_IGN);
        while (left) {
            ssize_t w = write(pi[1], p, left);
            if (w <= 0)
                break;
            p += w;
            left -= (size_t)w;
        }
    }
    close(pi[1]);
    px_strbuf sout = PX_STRBUF_INIT, serr = PX_STRBUF_INIT;
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    bool open_o = true, open_e = true, timed_out = false;
    while (open_o || open_e) {
        struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
        uint64_t now = px_now_ns();
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        int ms = (int)((deadline - now) / 1000000) + 1;
        int r = poll(fds, 2, ms > 1000 ? 1000 : ms);
        if (r < 0 && errno != EINTR)
            break;
        if (open_o && (fds[0].revents & (POLLIN | POLLHUP))) {
            size_t before = sout.len;
            drain(po[0], &sout);
            if (sout.len == before)
                open_o = false, fds[0].fd = -1;
        }
        if (open_e && (fds[1].revents & (POLLIN | POLLHUP))) {
            size_t before = serr.len;
            drain(pe[0], &serr);
            if (serr.len == before)
                open_e = false, fds[1].fd = -1;
        }
    }
    close(po[0]);
    close(pe[0]);
    int status = 0;
    if (timed_out) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
    }
    waitpid(pid, &status, 0);
    if (out)
        *out = px_strbuf_detach(&sout, NULL);
    else
        px_strbuf_release(&sout);
    if (err)
        *err = px_strbuf_detach(&serr, NULL);
    else
        px_strbuf_release(&serr);
    if (timed_out)
        return -2;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

int px_test_run(char *const argv[], int timeout_s, char **out, char **err)
{
    return px_test_run_input(argv, NULL, timeout_s, out, err);
}

int px_test_run_pty(char *const argv[], const char *wait_for, const char *input, int timeout_s,
                    char **out)
{
    int master = -1;
    struct winsize ws = {.ws_row = 24, .ws_col = 120};
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    px_strbuf sout = PX_STRBUF_INIT;
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    bool timed_out = false, sent = input == NULL;
    for (;;) {
        if (!sent && (!wait_for || strstr(sout.buf, wait_for))) {
            size_t left = strlen(input);
            const char *p = input;
            while (left) {
                ssize_t w = write(master, p, left);
                if (w <= 0)
                    break;
                p += w;
                left -= (size_t)w;
            }
            sent = true;
        }
        uint64_t now = px_now_ns();
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        struct pollfd fd = {master, POLLIN, 0};
        int ms = (int)((deadline - now) / 1000000) + 1;
        int r = poll(&fd, 1, ms > 1000 ? 1000 : ms);
        if (r < 0 && errno != EINTR)
            break;
        if (r > 0) {
            size_t before = sout.len;
            drain(master, &sout);
            /* EIO or end of file: every process holding the terminal left. */
            if (sout.len == before)
                break;
        }
    }
    close(master);
    int status = 0;
    if (timed_out)
        kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (out)
        *out = px_strbuf_detach(&sout, NULL);
    else
        px_strbuf_release(&sout);
    if (timed_out)
        return -2;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
