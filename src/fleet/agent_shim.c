/*
 * The supervisor of one job (the "shim"): forked from the agent and never
 * exec'd, so everything here is async-signal-safe (the agent has
 * threads).  It is the subreaper of everything the job starts, forwards
 * the agent's polite signals to the whole tree, reports the leader's exit
 * on a pipe, and kills the tree (by descent through /proc, and through
 * the job's cgroup when there is one) when the agent asks, when the agent
 * dies (its parent death signal) and before it exits.  agent_exec.c is
 * the agent's side.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SCAN_MAX 8192

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

long px__shim_parse_long(const char *s, const char **end)
{
    long v = 0;
    while (*s >= '0' && *s <= '9')
        v = v * 10 + (*s++ - '0');
    if (end)
        *end = s;
    return v;
}

/* The parent of pid from /proc/PID/stat, or -1. */
pid_t px__shim_parent_of(pid_t pid)
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
    return (pid_t)px__shim_parse_long(rp + 4, NULL);
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
            long pid = px__shim_parse_long(d->d_name, &end);
            if (pid <= 0 || *end || n >= SCAN_MAX)
                continue;
            pid_t pp = px__shim_parent_of((pid_t)pid);
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

/* In the job's process after fork: only async-signal-safe calls until
 * exec; any failure is written as an errno on exec_w. */
static _Noreturn void job_exec(const px__shim_args *a)
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
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
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
static void kill_tree(const px__shim_args *a, pid_t leader, bool leader_done)
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

_Noreturn void px__shim_main(const px__shim_args *a)
{
    int keep[] = {a->out_w,    a->err_w,           a->res_w,         a->exec_w,
                  a->status_w, a->cgroup_procs_fd, a->cgroup_kill_fd};
    keep_only(keep, PX_ARRAY_LEN(keep));
    setpgid(0, 0);
    /* Raw system calls: the child of a threaded process must not take a
     * lock another thread held at the fork, and a sanitizer's prctl
     * wrapper takes its thread registry's (PR_SET_NAME). */
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGUSR1, 0, 0, 0);
    syscall(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    syscall(SYS_prctl, PR_SET_NAME, "plexus-shim", 0, 0, 0);
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
    px__shim_args mine = *a;
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
