/*
 * The agent's process runner.  A job does not run as the agent's child
 * but under a small supervisor process of its own (the "shim", forked
 * from the agent and never exec'd; agent_shim.c) that
 *
 *   - is the subreaper (PR_SET_CHILD_SUBREAPER) of everything the job
 *     starts, so that processes that leave the job's process group or
 *     session (setsid, double forks) are still its descendants;
 *   - kills that whole tree, by walking /proc for its descendants and, where
 *     cgroup v2 is writable, through the job's own cgroup (cgroup.kill),
 *     when the agent asks (SIGUSR1), when the agent dies (its parent death
 *     signal) and before it exits;
 *   - reports the job's leader exit status on a pipe.
 *
 * The job itself runs in its own process group with a scrubbed
 * environment, only its assigned devices visible, as the job user when
 * one is set, and its output comes back through pipes.  Between fork and
 * exec, and in the shim, only async-signal-safe calls are made: the agent
 * has threads.
 */
#include "base/common.h"

#include <stdatomic.h>

#include "fleet/agent_impl.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_CANDIDATES 64

struct px__proc {
    pid_t shim;    /* the supervisor, the agent's child */
    pid_t leader;  /* the job's first process */
    int fd[4];     /* [1] stdout, [2] stderr, [3] result; -1 when closed */
    int status_fd; /* the shim's reports: the leader's exit */
    bool shim_reaped;
    bool leader_done;
    px__proc_exit exit;
    char *cgroup; /* the job's cgroup folder (removed when empty), or NULL */
};

/* ---- the registry of the agent's children ---- */

/* Every child the agent forks is a shim recorded here, under a lock held
 * across the fork, so that the sweeper can tell escaped processes (which
 * become the agent's children through its subreaper) from its own. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t reg[4096];
static size_t n_reg;

static void reg_add_locked(pid_t pid)
{
    if (n_reg < PX_ARRAY_LEN(reg))
        reg[n_reg++] = pid;
}

static void reg_del(pid_t pid)
{
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < n_reg; i++)
        if (reg[i] == pid) {
            reg[i] = reg[--n_reg];
            break;
        }
    pthread_mutex_unlock(&reg_mu);
}

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

/* Whether the job's own variables set `name`. */
static bool job_sets(const px__proc_spec *spec, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < spec->n_env; i++)
        if (!strncmp(spec->env[i], name, n) && spec->env[i][n] == '=')
            return true;
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
        if (job_sets(spec, kept_vars[i]))
            continue; /* the job's own value, once */
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

/* The paths argv0 may be, in PATH order, that exist and are executable
 * by the agent (the job user's own rights decide in the child). */
static size_t candidates(const char *argv0, const char *path, char *out[MAX_CANDIDATES])
{
    size_t n = 0;
    if (strchr(argv0, '/')) {
        if (access(argv0, X_OK) == 0 && (out[0] = px_strdup(argv0)))
            n = 1;
        return n;
    }
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p && n < MAX_CANDIDATES;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *cand = len ? px_asprintf("%.*s/%s", (int)len, p, argv0) : px_asprintf("./%s", argv0);
        if (cand && access(cand, X_OK) == 0)
            out[n++] = cand;
        else
            free(cand);
        p += len;
        if (*p == ':')
            p++;
    }
    return n;
}

static void close_pair(int fds[2])
{
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* ---- the agent's side ---- */

static px_status cgroup_fds(const char *cgroup, int *procs, int *killfd, px_err *err)
{
    *procs = *killfd = -1;
    if (!cgroup)
        return PX_OK;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/cgroup.procs", cgroup);
    *procs = open(path, O_WRONLY | O_CLOEXEC);
    snprintf(path, sizeof path, "%s/cgroup.kill", cgroup);
    *killfd = open(path, O_WRONLY | O_CLOEXEC);
    if (*procs < 0 || *killfd < 0) {
        int e = errno;
        if (*procs >= 0)
            close(*procs);
        if (*killfd >= 0)
            close(*killfd);
        *procs = *killfd = -1;
        return px_err_set(err, PX_EIO, "cgroup %s: %s", cgroup, strerror(e));
    }
    return PX_OK;
}

px_status px__proc_spawn(const px__proc_spec *spec, px__proc **out, px_err *err)
{
    *out = NULL;
    if (!spec->shell && (!spec->argv || !spec->argv[0] || !spec->argv[0][0]))
        return px_err_set(err, PX_EINVAL, "job command is empty: give a program after \"--\"");
    const char *sh_argv[4] = {"/bin/sh", "-c", spec->shell, NULL};
    char *const *argv = spec->shell ? (char *const *)sh_argv : spec->argv;
    px_status st = PX_OK;
    char *cands[MAX_CANDIDATES];
    size_t n_cands = 0;
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, pr[2] = {-1, -1}, px[2] = {-1, -1}, ps[2] = {-1, -1};
    int cg_procs = -1, cg_kill = -1;
    px__proc *p = NULL;
    char **env = build_env(spec);
    if (!env)
        return px_err_set(err, PX_ENOMEM, "out of memory building the job's environment");
    const char *path = NULL;
    for (char **e = env; *e; e++)
        if (px_str_starts_with(*e, "PATH="))
            path = *e + 5;
    if (!(n_cands = candidates(argv[0], path, cands))) {
        st = px_err_set(err, PX_ENOTFOUND,
                        "program \"%s\" was not found on the node's PATH or is not executable; "
                        "give an absolute path or install it on the node",
                        argv[0]);
        goto fail;
    }
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(px, O_CLOEXEC) ||
        pipe2(ps, O_CLOEXEC) || (spec->result_fd && pipe2(pr, O_CLOEXEC))) {
        st = px_err_set(err, PX_EIO, "cannot create pipes for the job: %s", strerror(errno));
        goto fail;
    }
    if ((st = cgroup_fds(spec->cgroup, &cg_procs, &cg_kill, err)) != PX_OK)
        goto fail;
    if (!(p = calloc(1, sizeof *p)) || (spec->cgroup && !(p->cgroup = px_strdup(spec->cgroup)))) {
        st = px_err_set(err, PX_ENOMEM, "out of memory starting the job");
        goto fail;
    }
    p->fd[0] = -1;
    px__shim_args a = {.agent = getpid(),
                       .candidates = (const char *const *)cands,
                       .n_candidates = n_cands,
                       .argv = argv,
                       .env = env,
                       .cwd = spec->cwd,
                       .out_w = po[1],
                       .err_w = pe[1],
                       .res_w = pr[1],
                       .exec_w = px[1],
                       .status_w = ps[1],
                       .cgroup_procs_fd = cg_procs,
                       .cgroup_kill_fd = cg_kill,
                       .set_user = spec->set_user,
                       .uid = spec->uid,
                       .gid = spec->gid,
                       .groups = spec->groups,
                       .n_groups = spec->n_groups};
    pthread_mutex_lock(&reg_mu);
    pid_t shim = fork();
    if (shim == 0)
        px__shim_main(&a);
    if (shim > 0)
        reg_add_locked(shim);
    pthread_mutex_unlock(&reg_mu);
    if (shim < 0) {
        st = px_err_set(err, PX_EIO, "cannot fork the job: %s", strerror(errno));
        goto fail;
    }
    p->shim = shim;
    close(po[1]);
    close(pe[1]);
    close(px[1]);
    close(ps[1]);
    po[1] = pe[1] = px[1] = ps[1] = -1;
    if (pr[1] >= 0)
        close(pr[1]);
    pr[1] = -1;
    if (cg_kill >= 0)
        close(cg_kill);
    if (cg_procs >= 0)
        close(cg_procs);
    cg_kill = cg_procs = -1;
    p->fd[1] = po[0];
    p->fd[2] = pe[0];
    p->fd[3] = pr[0];
    p->status_fd = ps[0];
    po[0] = pe[0] = pr[0] = ps[0] = -1;
    int child_errno = 0;
    ssize_t n;
    do
        n = read(px[0], &child_errno, sizeof child_errno);
    while (n < 0 && errno == EINTR);
    close(px[0]);
    px[0] = -1;
    int32_t hello[3] = {0, 0, 0};
    ssize_t h;
    do
        h = read(p->status_fd, hello, sizeof hello);
    while (h < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof child_errno || h != (ssize_t)sizeof hello || hello[0] != 1) {
        if (n != (ssize_t)sizeof child_errno)
            child_errno = ECHILD;
        st = px_err_set(err,
                        child_errno == ENOENT   ? PX_ENOTFOUND
                        : child_errno == EACCES ? PX_EAUTH
                                                : PX_EIO,
                        "cannot start \"%s\"%s%s%s: %s", argv[0], spec->cwd ? " in " : "",
                        spec->cwd ? spec->cwd : "", spec->set_user ? " as the job user" : "",
                        strerror(child_errno));
        px__proc_free(p);
        p = NULL;
        goto fail;
    }
    p->leader = (pid_t)hello[1];
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0)
            fcntl(p->fd[i], F_SETFL, fcntl(p->fd[i], F_GETFL) | O_NONBLOCK);
    fcntl(p->status_fd, F_SETFL, fcntl(p->status_fd, F_GETFL) | O_NONBLOCK);
    for (size_t i = 0; i < n_cands; i++)
        free(cands[i]);
    free_env(env);
    *out = p;
    return PX_OK;

fail:
    close_pair(po);
    close_pair(pe);
    close_pair(pr);
    close_pair(px);
    close_pair(ps);
    if (cg_procs >= 0)
        close(cg_procs);
    if (cg_kill >= 0)
        close(cg_kill);
    if (p) {
        free(p->cgroup);
        free(p);
    }
    for (size_t i = 0; i < n_cands; i++)
        free(cands[i]);
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

/* Reads the shim's reports (the leader's exit). */
static void read_status(px__proc *p)
{
    int32_t msg[3];
    ssize_t n;
    while (p->status_fd >= 0 && (n = read(p->status_fd, msg, sizeof msg)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return; /* nothing yet */
        if (n == (ssize_t)sizeof msg && msg[0] == 2 && !p->leader_done) {
            p->leader_done = true;
            p->exit = (px__proc_exit){.code = msg[1], .signal = msg[2]};
        }
    }
    /* End of file: the shim is gone; a leader it never reported was lost. */
    if (p->status_fd >= 0) {
        close(p->status_fd);
        p->status_fd = -1;
    }
    if (!p->leader_done) {
        p->leader_done = true;
        p->exit = (px__proc_exit){.code = -1, .signal = SIGKILL};
    }
}

static void reap_shim(px__proc *p, bool block)
{
    if (p->shim_reaped || p->shim <= 0)
        return;
    int status;
    pid_t r;
    do
        r = waitpid(p->shim, &status, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == p->shim || (r < 0 && errno == ECHILD)) {
        p->shim_reaped = true;
        reg_del(p->shim);
    }
}

bool px__proc_done(px__proc *p, px__proc_exit *ex)
{
    if (!p->leader_done)
        read_status(p);
    if (p->leader_done && ex)
        *ex = p->exit;
    return p->leader_done;
}

void px__proc_signal(px__proc *p, int sig)
{
    if (p->shim > 0 && !p->shim_reaped)
        kill(p->shim, sig == SIGKILL ? SIGUSR1 : sig);
}

/* Waits for the shim to finish its tree; a shim that does not (it cannot
 * be made to stop: it is the agent's own code) is killed, and its orphans
 * then come to the agent, whose sweeper ends them. */
static void end_shim(px__proc *p)
{
    if (p->shim_reaped)
        return;
    /* A descriptor of the shim wakes the wait as soon as it exits. */
    int pidfd = (int)syscall(SYS_pidfd_open, p->shim, 0);
    kill(p->shim, SIGUSR1);
    uint64_t until = px_now_ns() + 10ull * 1000000000ull;
    while (!p->shim_reaped && px_now_ns() < until) {
        reap_shim(p, false);
        if (p->shim_reaped)
            break;
        if (pidfd >= 0) {
            struct pollfd pf = {pidfd, POLLIN, 0};
            poll(&pf, 1, 100);
        } else {
            struct timespec ts = {0, 2 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (pidfd >= 0)
        close(pidfd);
    if (!p->shim_reaped) {
        px_log_warn("agent: the supervisor of a job did not stop; killing it");
        kill(p->shim, SIGKILL);
        reap_shim(p, true);
    }
    read_status(p);
}

void px__proc_stop(px__proc *p, int grace_ms)
{
    px__proc_signal(p, SIGTERM);
    uint64_t until = px_now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
    while (!px__proc_done(p, NULL) && px_now_ns() < until) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* The whole tree goes, also when the leader left on its own. */
    end_shim(p);
}

pid_t px__proc_pid(const px__proc *p)
{
    return p->leader;
}

void px__proc_free(px__proc *p)
{
    if (!p)
        return;
    end_shim(p);
    for (int i = 1; i <= 3; i++)
        if (p->fd[i] >= 0)
            close(p->fd[i]);
    if (p->status_fd >= 0)
        close(p->status_fd);
    if (p->cgroup) {
        /* Whatever is left (the shim was killed from outside) goes now; the
         * folder is empty once every process in it is reaped. */
        char kill_path[PATH_MAX];
        snprintf(kill_path, sizeof kill_path, "%s/cgroup.kill", p->cgroup);
        int kfd = open(kill_path, O_WRONLY | O_CLOEXEC);
        if (kfd >= 0) {
            (void)!write(kfd, "1", 1);
            close(kfd);
        }
        for (int i = 0; i < 400 && rmdir(p->cgroup) != 0 && errno == EBUSY; i++) {
            struct timespec ts = {0, 5 * 1000000L};
            nanosleep(&ts, NULL);
        }
        free(p->cgroup);
    }
    free(p);
}

static atomic_int sweep_paused;

void px__proc_sweep_pause(bool pause)
{
    atomic_fetch_add(&sweep_paused, pause ? 1 : -1);
}

void px__proc_keep(pid_t pid, bool keep)
{
    if (keep) {
        pthread_mutex_lock(&reg_mu);
        reg_add_locked(pid);
        pthread_mutex_unlock(&reg_mu);
    } else {
        reg_del(pid);
    }
}

size_t px__proc_sweep(void)
{
    /* A child being started outside a shim (a stage worker) is not yet
     * registered: no sweep meanwhile. */
    if (atomic_load(&sweep_paused) > 0)
        return 0;
    /* Processes that escaped their shim (a shim killed from outside) are
     * re-parented to the agent, a subreaper: any child of the agent that is
     * not a shim is one of those, and is ended. */
    pid_t self = getpid();
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t killed = 0;
    struct dirent *e;
    pthread_mutex_lock(&reg_mu);
    while ((e = readdir(d))) {
        const char *end;
        long pid = px__shim_parse_long(e->d_name, &end);
        if (pid <= 0 || *end || px__shim_parent_of((pid_t)pid) != self)
            continue;
        bool ours = false;
        for (size_t i = 0; i < n_reg && !ours; i++)
            ours = reg[i] == (pid_t)pid;
        if (ours)
            continue;
        kill((pid_t)pid, SIGKILL);
        waitpid((pid_t)pid, NULL, WNOHANG);
        killed++;
    }
    pthread_mutex_unlock(&reg_mu);
    closedir(d);
    return killed;
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
