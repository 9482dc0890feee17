/*
 * The agent's process runner: a job runs in its own process group, with a
 * scrubbed environment and only its assigned devices visible, and its
 * output comes back through pipes.  Cancelling a job kills the group, so
 * whatever the job started goes with it.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

struct px__proc {
    pid_t pid;
    int fd[4]; /* [1] stdout, [2] stderr, [3] result; -1 when closed */
    bool reaped;
    px__proc_exit exit;
};

/* Variables passed through from the agent's own environment. */
static const char *const kept_vars[] = {"PATH", "HOME", "LANG", "TMPDIR"};

/* Every variable a runtime reads to choose its devices: NVIDIA (CUDA and
 * the container toolkit), AMD (HIP and ROCr) and Intel (Level Zero). */
static const char *const visibility_vars[] = {
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",     "ZE_AFFINITY_MASK",
};

/* The list a visibility variable gets: its vendor's override, else the
 * common one. */
static const char *visibility_value(const px__proc_spec *spec, size_t var)
{
    const char *v = var < 2   ? spec->visible_nvidia
                    : var < 5 ? spec->visible_amd
                              : spec->visible_intel;
    return v ? v : spec->visible_devices;
}

static bool any_visibility(const px__proc_spec *spec)
{
    return spec->visible_devices || spec->visible_nvidia || spec->visible_amd ||
           spec->visible_intel;
}

static bool is_visibility_var(const char *kv)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(visibility_vars); i++) {
        size_t n = strlen(visibility_vars[i]);
        if (!strncmp(kv, visibility_vars[i], n) && kv[n] == '=')
            return true;
    }
    return false;
}

/* Builds the child's environment (NULL-terminated, owned strings). */
static char **build_env(const px__proc_spec *spec)
{
    size_t cap = PX_ARRAY_LEN(kept_vars) + spec->n_env + PX_ARRAY_LEN(visibility_vars) + 1;
    char **env = calloc(cap, sizeof *env);
    if (!env)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(kept_vars); i++) {
        const char *v = getenv(kept_vars[i]);
        if (!v && !strcmp(kept_vars[i], "PATH"))
            v = "/usr/local/bin:/usr/bin:/bin";
        if (v && !(env[n++] = px_asprintf("%s=%s", kept_vars[i], v)))
            goto fail;
    }
    for (size_t i = 0; i < spec->n_env; i++) {
        if (any_visibility(spec) && is_visibility_var(spec->env[i]))
            continue;
        if (!(env[n++] = px_strdup(spec->env[i])))
            goto fail;
    }
    for (size_t i = 0; i < PX_ARRAY_LEN(visibility_vars); i++) {
        const char *v = visibility_value(spec, i);
        if (v && !(env[n++] = px_asprintf("%s=%s", visibility_vars[i], v)))
            goto fail;
    }
    env[n] = NULL;
    return env;
fail:
    for (size_t i = 0; i < n; i++)
        free(env[i]);
    free(env);
    return NULL;
}

static void free_env(char **env)
{
    if (!env)
        return;
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

/* Looks argv0 up in the given PATH, as execvpe would, but before the fork,
 * so a missing program is an error the agent can report. */
static char *resolve_program(const char *argv0, const char *path)
{
    if (strchr(argv0, '/'))
        return access(argv0, X_OK) == 0 ? px_strdup(argv0) : NULL;
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char *cand = n ? px_asprintf("%.*s/%s", (int)n, p, argv0) : px_asprintf("./%s", argv0);
        if (cand && access(cand, X_OK) == 0)
            return cand;
        free(cand);
        p += n;
        if (*p == ':')
            p++;
    }
    return NULL;
}

static void close_pair(int fds[2])
{
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* In the child after fork: only async-signal-safe calls until exec. */
static _Noreturn void child_exec(const char *prog, char *const *argv, char **env, const char *cwd,
                                 int out_w, int err_w, int res_w, int status_w)
{
    setpgid(0, 0);
    /* A job dies with the thread that supervises it, so a killed agent
     * leaves no job running unsupervised (its server requeues the work). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* A job must not inherit the agent's blocked or ignored signals. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    /* Moves the result pipe out of the way before stdout/stderr land. */
    if (res_w >= 0 && res_w != 3) {
        if (out_w == 3 || err_w == 3 || status_w == 3) {
            /* Rare: fd 3 is taken by another pipe end; relocate it. */
            int moved = fcntl(3, F_DUPFD_CLOEXEC, 10);
            if (out_w == 3)
                out_w = moved;
            if (err_w == 3)
                err_w = moved;
            if (status_w == 3)
                status_w = moved;
        }
        dup2(res_w, 3);
    } else if (res_w == 3) {
        fcntl(3, F_SETFD, 0);
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    /* Everything above fd 3 (4 without a result pipe) is closed at exec,
     * except the status pipe, which is close-on-exec already. */
    int first = res_w >= 0 ? 4 : 3;
    if (status_w >= first) {
        if (status_w > first)
            close_range((unsigned)first, (unsigned)status_w - 1, 0);
        close_range((unsigned)status_w + 1, ~0u, 0);
    } else {
        close_range((unsigned)first, ~0u, 0);
    }
    if (cwd && chdir(cwd) != 0) {
        int e = errno;
        (void)!write(status_w, &e, sizeof e);
        _exit(127);
    }
    execve(prog, argv, env);
    int e = errno;
    (void)!write(status_w, &e, sizeof e);
    _exit(127);
}

px_status px__proc_spawn(const px__proc_spec *spec, px__proc **out, px_err *err)
{
    *out = NULL;
    if (!spec->shell && (!spec->argv || !spec->argv[0] || !spec->argv[0][0]))
        return px_err_set(err, PX_EINVAL, "job command is empty: give a program after \"--\"");
    const char *sh_argv[4] = {"/bin/sh", "-c", spec->shell, NULL};
    char *const *argv = spec->shell ? (char *const *)sh_argv : spec->argv;
    px_status st = PX_OK;
    char **env = build_env(spec);
    if (!env)
        return px_err_set(err, PX_ENOMEM, "out of memory building the job's environment");
    const char *path = NULL;
    for (char **e = env; *e; e++)
        if (px_str_starts_with(*e, "PATH="))
            path = *e + 5;
    char *prog = resolve_program(argv[0], path);
    if (!prog) {
        st = px_err_set(err, PX_ENOTFOUND,
                        "program \"%s\" was not found on the node's PATH or is not executable; "
                        "give an absolute path or install it on the node",
                        argv[0]);
        goto fail_env;
    }
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, pr[2] = {-1, -1}, ps[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(ps, O_CLOEXEC) ||
        (spec->result_fd && pipe2(pr, O_CLOEXEC))) {
        st = px_err_set(err, PX_EIO, "cannot create pipes for the job: %s", strerror(errno));
        goto fail_pipes;
    }
    px__proc *p = calloc(1, sizeof *p);
    if (!p) {
        st = px_err_set(err, PX_ENOMEM, "out of memory starting the job");
        goto fail_pipes;
    }
    p->fd[0] = -1;
    pid_t pid = fork();
    if (pid < 0) {
        st = px_err_set(err, PX_EIO, "cannot fork the job: %s", strerror(errno));
        free(p);
        goto fail_pipes;
    }
    if (pid == 0)
        child_exec(prog, argv, env, spec->cwd, po[1], pe[1], pr[1], ps[1]);
    /* Both sides set the group so that a kill right after spawn reaches it. */
    setpgid(pid, pid);
    close(po[1]);
    close(pe[1]);
    close(ps[1]);
    if (pr[1] >= 0)
        close(pr[1]);
    p->pid = pid;
    p->fd[1] = po[0];
    p->fd[2] = pe[0];
    p->fd[3] = pr[0];
    int child_errno = 0;
    ssize_t n;
    do
        n = read(ps[0], &child_errno, sizeof child_errno);
    while (n < 0 && errno == EINTR);
    close(ps[0]);
    if (n == (ssize_t)sizeof child_errno) {
        st = px_err_set(err, child_errno == ENOENT ? PX_ENOTFOUND : PX_EIO,
                        "cannot start \"%s\"%s%s: %s", argv[0], spec->cwd ? " in " : "",
                        spec->cwd ? spec->cwd : "", strerror(child_errno));
        px__proc_free(p);
        goto fail_prog;
    }
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0)
            fcntl(p->fd[i], F_SETFL, fcntl(p->fd[i], F_GETFL) | O_NONBLOCK);
    free(prog);
    free_env(env);
    *out = p;
    return PX_OK;

fail_pipes:
    close_pair(po);
    close_pair(pe);
    close_pair(pr);
    close_pair(ps);
fail_prog:
    free(prog);
fail_env:
    free_env(env);
    return st;
}

bool px__proc_pump(px__proc *p, int timeout_ms, px__proc_sink sink, void *ud)
{
    struct pollfd fds[3];
    int which[3];
    nfds_t n = 0;
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0) {
            fds[n] = (struct pollfd){.fd = p->fd[i], .events = POLLIN};
            which[n++] = i;
        }
    if (!n)
        return false;
    int r = poll(fds, n, timeout_ms);
    if (r <= 0)
        return true;
    char buf[16384];
    for (nfds_t i = 0; i < n; i++) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int s = which[i];
        for (;;) {
            ssize_t got = read(p->fd[s], buf, sizeof buf);
            if (got > 0) {
                if (sink)
                    sink((px__proc_stream)s, buf, (size_t)got, ud);
                if ((size_t)got < sizeof buf)
                    break;
                continue;
            }
            if (got < 0 && (errno == EINTR))
                continue;
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            close(p->fd[s]);
            p->fd[s] = -1;
            break;
        }
    }
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0)
            return true;
    return false;
}

static void record_status(px__proc *p, int status)
{
    p->reaped = true;
    if (WIFSIGNALED(status)) {
        p->exit.code = -1;
        p->exit.signal = WTERMSIG(status);
    } else {
        p->exit.code = WEXITSTATUS(status);
        p->exit.signal = 0;
    }
}

bool px__proc_done(px__proc *p, px__proc_exit *ex)
{
    if (!p->reaped) {
        int status;
        pid_t r;
        do
            r = waitpid(p->pid, &status, WNOHANG);
        while (r < 0 && errno == EINTR);
        if (r == p->pid)
            record_status(p, status);
        else if (r < 0 && errno == ECHILD) /* reaped elsewhere: treat as gone */
            p->reaped = true, p->exit = (px__proc_exit){.code = -1, .signal = 0};
    }
    if (p->reaped && ex)
        *ex = p->exit;
    return p->reaped;
}

void px__proc_signal(px__proc *p, int sig)
{
    if (p->pid > 0)
        kill(-p->pid, sig);
}

void px__proc_stop(px__proc *p, int grace_ms)
{
    px__proc_signal(p, SIGTERM);
    uint64_t until = px_now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
    while (!px__proc_done(p, NULL) && px_now_ns() < until) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* The group goes too, also when the leader left on its own. */
    px__proc_signal(p, SIGKILL);
    if (!p->reaped) {
        int status;
        pid_t r;
        do
            r = waitpid(p->pid, &status, 0);
        while (r < 0 && errno == EINTR);
        if (r == p->pid)
            record_status(p, status);
        else
            p->reaped = true;
    }
}

pid_t px__proc_pid(const px__proc *p)
{
    return p->pid;
}

void px__proc_free(px__proc *p)
{
    if (!p)
        return;
    if (!p->reaped)
        px__proc_stop(p, 0);
    else
        px__proc_signal(p, SIGKILL); /* leftovers of the group */
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0)
            close(p->fd[i]);
    free(p);
}

typedef struct capture {
    px_strbuf out;
    size_t max;
} capture;

static void capture_sink(px__proc_stream s, const char *data, size_t len, void *ud)
{
    capture *c = ud;
    if (s != PX__PROC_STDOUT || c->out.len >= c->max)
        return;
    px_strbuf_add(&c->out, data, PX_MIN(len, c->max - c->out.len));
}

px_status px__proc_run_capture(const px__proc_spec *spec, int limit_ms, size_t max_out, char **out,
                               px__proc_exit *ex, px_err *err)
{
    if (out)
        *out = NULL;
    px__proc *p;
    px_status st = px__proc_spawn(spec, &p, err);
    if (st != PX_OK)
        return st;
    capture c = {PX_STRBUF_INIT, max_out};
    uint64_t deadline = limit_ms > 0 ? px_now_ns() + (uint64_t)limit_ms * 1000000ull : 0;
    bool open = true;
    for (;;) {
        if (open)
            open = px__proc_pump(p, 50, capture_sink, &c);
        if (px__proc_done(p, NULL) && !open)
            break;
        if (!open && !px__proc_done(p, NULL)) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (deadline && px_now_ns() > deadline) {
            px__proc_stop(p, 0);
            px__proc_free(p);
            px_strbuf_release(&c.out);
            return px_err_set(err, PX_ETIMEOUT, "\"%s\" did not finish within %d ms",
                              spec->shell ? spec->shell : spec->argv[0], limit_ms);
        }
        /* A finished leader whose descendants keep the pipes open. */
        if (open && px__proc_done(p, NULL)) {
            px__proc_pump(p, 100, capture_sink, &c);
            break;
        }
    }
    if (ex)
        px__proc_done(p, ex);
    px__proc_free(p);
    if (out)
        *out = px_strbuf_detach(&c.out, NULL);
    else
        px_strbuf_release(&c.out);
    return PX_OK;
}
