/*
 * The agent's process runner.  A job does not run as the agent's child
 * but under a small supervisor process of its own (the "shim", forked
 * from the agent and never exec'd) that
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
#define SCAN_MAX       8192

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

/* ---- async-signal-safe helpers (shim and child) ---- */

static void safe_write(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p = (const char *)p + w;
        n -= (size_t)w;
    }
}

static long parse_long(const char *s, const char **end)
{
    long v = 0;
    while (*s >= '0' && *s <= '9')
        v = v * 10 + (*s++ - '0');
    if (end)
        *end = s;
    return v;
}

/* The parent of pid from /proc/PID/stat, or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[40] = "/proc/";
    char num[16];
    int k = 0;
    for (long v = pid; v > 0 && k < 15; v /= 10)
        num[k++] = (char)('0' + v % 10);
    size_t at = strlen(path);
    while (k > 0)
        path[at++] = num[--k];
    memcpy(path + at, "/stat", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* "pid (comm) S ppid ...": comm may hold spaces and parentheses. */
    char *rp = NULL;
    for (char *c = buf; *c; c++)
        if (*c == ')')
            rp = c;
    if (!rp || rp[1] != ' ' || !rp[2] || rp[3] != ' ')
        return -1;
    return (pid_t)parse_long(rp + 4, NULL);
}

static pid_t scan_pid[SCAN_MAX], scan_ppid[SCAN_MAX];
static bool scan_mark[SCAN_MAX];

struct linux_dirent64_px {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Sends sig to every descendant of this process (found through /proc);
 * returns how many there were. */
static size_t signal_descendants(int sig)
{
    int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    size_t n = 0;
    char buf[8192];
    for (;;) {
        long got = syscall(SYS_getdents64, dfd, buf, sizeof buf);
        if (got <= 0)
            break;
        for (long off = 0; off < got;) {
            struct linux_dirent64_px *d = (struct linux_dirent64_px *)(buf + off);
            off += d->d_reclen;
            const char *end;
            long pid = parse_long(d->d_name, &end);
            if (pid <= 0 || *end || n >= SCAN_MAX)
                continue;
            pid_t pp = parent_of((pid_t)pid);
            if (pp <= 0)
                continue;
            scan_pid[n] = (pid_t)pid;
            scan_ppid[n] = pp;
            scan_mark[n] = false;
            n++;
        }
    }
    close(dfd);
    pid_t self = getpid();
    size_t found = 0;
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t i = 0; i < n; i++) {
            if (scan_mark[i])
                continue;
            bool child = scan_ppid[i] == self;
            for (size_t k = 0; !child && k < n; k++)
                child = scan_mark[k] && scan_pid[k] == scan_ppid[i];
            if (child) {
                scan_mark[i] = grew = true;
                kill(scan_pid[i], sig);
                found++;
            }
        }
    }
    return found;
}

typedef struct shim_args {
    pid_t agent;
    pid_t shim; /* set by the shim for its job */
    const char *const *candidates;
    size_t n_candidates;
    char *const *argv;
    char *const *env;
    const char *cwd;
    int out_w, err_w, res_w, exec_w, status_w;
    int cgroup_procs_fd, cgroup_kill_fd;
    bool set_user;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    int n_groups;
} shim_args;

/* In the job's process after fork: only async-signal-safe calls until
 * exec; any failure is written as an errno on exec_w. */
static _Noreturn void job_exec(const shim_args *a)
{
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    const int reset[] = {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGUSR1, SIGQUIT};
    for (size_t i = 0; i < PX_ARRAY_LEN(reset); i++)
        signal(reset[i], SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int e = 0;
    if (a->cgroup_procs_fd >= 0 && write(a->cgroup_procs_fd, "0", 1) != 1)
        e = errno;
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    int out_w = a->out_w, err_w = a->err_w, exec_w = a->exec_w;
    /* Moves the result pipe onto fd 3 after taking anything else off it. */
    if (a->res_w >= 0 && a->res_w != 3) {
        int moved = fcntl(3, F_DUPFD_CLOEXEC, 10);
        if (out_w == 3)
            out_w = moved;
        if (err_w == 3)
            err_w = moved;
        if (exec_w == 3)
            exec_w = moved;
        dup2(a->res_w, 3);
    } else if (a->res_w == 3) {
        fcntl(3, F_SETFD, 0);
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    /* Everything above fd 3 (4 with a result pipe) closes at exec, except
     * exec_w, which is close-on-exec already. */
    int first = a->res_w >= 0 ? 4 : 3;
    if (exec_w >= first) {
        if (exec_w > first)
            close_range((unsigned)first, (unsigned)exec_w - 1, 0);
        close_range((unsigned)exec_w + 1, ~0u, 0);
    } else {
        close_range((unsigned)first, ~0u, 0);
    }
    /* Raw system calls: this runs on the shim's memory (vfork-like), where
     * libc's own bookkeeping of the change must not run. */
    if (!e && a->set_user &&
        (syscall(SYS_setgroups, (size_t)a->n_groups, a->groups) != 0 ||
         syscall(SYS_setresgid, a->gid, a->gid, a->gid) != 0 ||
         syscall(SYS_setresuid, a->uid, a->uid, a->uid) != 0 || getuid() != a->uid ||
         geteuid() != a->uid))
        e = errno ? errno : EPERM;
    /* The job dies with its shim (a shim only dies when killed).  Set after
     * the change of user, which clears it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != a->shim)
        _exit(127); /* the shim is already gone */
    if (!e && a->cwd && chdir(a->cwd) != 0)
        e = errno;
    if (!e) {
        e = ENOENT;
        for (size_t i = 0; i < a->n_candidates; i++) {
            execve(a->candidates[i], a->argv, a->env);
            /* As execvp: keep looking past a path this user may not run. */
            if (errno != ENOENT && errno != EACCES && errno != ENOTDIR) {
                e = errno;
                break;
            }
            if (errno == EACCES || e == ENOENT)
                e = errno;
        }
    }
    safe_write(exec_w, &e, sizeof e);
    _exit(127);
}

static int job_main(void *arg)
{
    job_exec(arg);
}

/* Kills every process of the job and reaps them; returns when none is
 * left. */
static void kill_tree(const shim_args *a, pid_t leader, bool leader_done)
{
    struct timespec pause = {0, 5 * 1000000L};
    int status;
    /* No child at all: as the subreaper of the whole tree, the shim then
     * has no descendant either (the common end of a job). */
    if (waitpid(-1, &status, WNOHANG) < 0 && errno == ECHILD) {
        if (a->cgroup_kill_fd >= 0)
            (void)!pwrite(a->cgroup_kill_fd, "1", 1, 0);
        return;
    }
    for (int round = 0; round < 2000; round++) {
        if (a->cgroup_kill_fd >= 0)
            (void)!pwrite(a->cgroup_kill_fd, "1", 1, 0);
        /* Once reaped, the leader's id may be reused: go by descent then. */
        if (leader > 0 && !leader_done)
            kill(-leader, SIGKILL);
        size_t n = signal_descendants(SIGKILL);
        while (waitpid(-1, &status, WNOHANG) > 0)
            ;
        if (n == 0 && waitpid(-1, &status, WNOHANG) < 0 && errno == ECHILD)
            return;
        nanosleep(&pause, NULL);
    }
}

static void report_exit(int status_w, int status)
{
    int32_t msg[3] = {2, 0, 0};
    if (WIFSIGNALED(status)) {
        msg[1] = -1;
        msg[2] = WTERMSIG(status);
    } else {
        msg[1] = WEXITSTATUS(status);
    }
    safe_write(status_w, msg, sizeof msg);
}

/* The shim: forks the job, reaps what the job leaves behind, forwards
 * SIGTERM/SIGINT/SIGHUP to the whole tree, and on SIGUSR1 (the agent's
 * "kill now", and its parent death signal) kills the tree and exits. */
/* Closes every descriptor above 2 but those in keep: the shim is forked
 * from a process with threads, which may hold another job's pipes right
 * now, and it never execs (so close-on-exec does not help); holding one
 * would keep that job's pipes open for this job's whole life. */
static void keep_only(int *keep, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && keep[k - 1] > keep[k]; k--) {
            int t = keep[k];
            keep[k] = keep[k - 1];
            keep[k - 1] = t;
        }
    unsigned from = 3;
    for (size_t i = 0; i < n; i++) {
        if (keep[i] < (int)from)
            continue;
        if ((unsigned)keep[i] > from)
            close_range(from, (unsigned)keep[i] - 1, 0);
        from = (unsigned)keep[i] + 1;
    }
    close_range(from, ~0u, 0);
}

static _Noreturn void shim_main(const shim_args *a)
{
    int keep[] = {a->out_w,    a->err_w,           a->res_w,         a->exec_w,
                  a->status_w, a->cgroup_procs_fd, a->cgroup_kill_fd};
    keep_only(keep, PX_ARRAY_LEN(keep));
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGUSR1);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    prctl(PR_SET_NAME, "plexus-shim");
    sigset_t set;
    sigemptyset(&set);
    const int handled[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGUSR1};
    for (size_t i = 0; i < PX_ARRAY_LEN(handled); i++)
        sigaddset(&set, handled[i]);
    sigprocmask(SIG_SETMASK, &set, NULL);
    /* SIGCHLD must not be ignored, or children would not be waitable. */
    signal(SIGCHLD, SIG_DFL);
    if (getppid() != a->agent)
        _exit(0); /* the agent died before we were set up: start nothing */
    shim_args mine = *a;
    mine.shim = getpid();
    /* The job starts as posix_spawn starts a program: on the shim's memory
     * (no copy of the page tables, which cost milliseconds for a process
     * of the agent's size) with a stack of its own, the shim waiting until
     * it execs or fails. */
    const size_t stack_size = 256 * 1024;
    void *stack = mmap(NULL, stack_size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    pid_t leader = stack == MAP_FAILED ? -1
                                       : clone(job_main, (char *)stack + stack_size,
                                               CLONE_VM | CLONE_VFORK | SIGCHLD, &mine);
    close(a->out_w);
    close(a->err_w);
    if (a->res_w >= 0)
        close(a->res_w);
    if (a->cgroup_procs_fd >= 0)
        close(a->cgroup_procs_fd);
    if (leader < 0) {
        int e = errno;
        safe_write(a->exec_w, &e, sizeof e);
        _exit(127);
    }
    close(a->exec_w);
    int32_t hello[3] = {1, (int32_t)leader, 0};
    safe_write(a->status_w, hello, sizeof hello);
    bool leader_done = false;
    struct timespec tick = {0, 200 * 1000000L};
    for (;;) {
        siginfo_t info;
        int sig = sigtimedwait(&set, &info, &tick);
        if (sig == SIGCHLD || sig < 0) {
            int status;
            pid_t p;
            while ((p = waitpid(-1, &status, WNOHANG)) > 0)
                if (p == leader && !leader_done) {
                    leader_done = true;
                    report_exit(a->status_w, status);
                }
        }
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
            if (!leader_done)
                kill(-leader, sig);
            signal_descendants(sig);
        }
        if (sig == SIGUSR1 || getppid() != a->agent) {
            kill_tree(a, leader, leader_done);
            if (!leader_done) {
                int32_t gone[3] = {2, -1, SIGKILL};
                safe_write(a->status_w, gone, sizeof gone);
            }
            _exit(0);
        }
    }
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
    shim_args a = {.agent = getpid(),
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
        shim_main(&a);
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

size_t px__proc_sweep(void)
{
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
        long pid = parse_long(e->d_name, &end);
        if (pid <= 0 || *end || parent_of((pid_t)pid) != self)
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
