/*
 * The local launcher: starts stage workers on this machine as a launcher
 * (px_rt_launcher) would on any machine.  Each worker listens on
 * tcp:HOST:0 and announces the address it bound on its standard output,
 * where a worker that fails later says why ("error MESSAGE"); the
 * deployment's secret goes to its standard input.  Health comes from
 * waitpid, /proc and that pipe, so that reading it never waits.  A fleet agent runs
 * one for the stages placed on its node; the executor can use one to
 * reach its workers over an interface other than loopback.
 */
#include "base/common.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "rt/executor_impl.h"

/* A worker it started (the handle); the launcher keeps them in a list so
 * that freeing it ends every one. */
typedef struct local_stage {
    struct local_stage *next;
    uint32_t stage;
    pid_t pid;
    bool reaped;
    int wstatus;
    int out;       /* the read end of the worker's standard output; -1 */
    char why[320]; /* its "error MESSAGE", once read */
} local_stage;

struct px_rt_local_launcher {
    px_rt_launcher iface;
    char *bin;
    char host[64];
    int timeout_ms;
    pthread_mutex_t mu; /* the list: executors of several threads share one */
    local_stage *stages;
};

static void reap_one(local_stage *s, bool block)
{
    if (s->pid <= 0 || s->reaped)
        return;
    int status;
    if (waitpid(s->pid, &status, block ? 0 : WNOHANG) == s->pid) {
        s->reaped = true;
        s->wstatus = status;
    }
}

px_status px__rt_read_announce(int fd, uint32_t stage, int timeout_ms, char *addr, size_t cap,
                               px_err *err)
{
    char line[256];
    size_t n = 0;
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (n < sizeof line - 1) {
        uint64_t now = px_now_ns();
        if (now >= deadline)
            return px_err_set(err, PX_ETIMEOUT,
                              "the worker of stage %u did not announce its address within %d ms",
                              stage, timeout_ms);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = (int)PX_MIN((deadline - now) / 1000000u + 1, (uint64_t)INT32_MAX);
        if (poll(&p, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, line + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return px_err_set(err, PX_EPEER,
                              "the worker of stage %u ended before it listened (its message is "
                              "above)",
                              stage);
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    if (px_str_starts_with(line, "error "))
        return px_err_set(err, PX_EPEER, "the worker of stage %u did not start: %s", stage,
                          line + 6);
    if (!px_str_starts_with(line, "listening ") || strlen(line + 10) >= cap ||
        px_rt_addr_check(line + 10, NULL) != PX_OK)
        return px_err_set(err, PX_EPARSE,
                          "the worker of stage %u announced \"%.100s\", not \"listening "
                          "tcp:A.B.C.D:PORT\"",
                          stage, line);
    px_strlcpy(addr, line + 10, cap);
    return PX_OK;
}

static void forget(px_rt_local_launcher *l, local_stage *s)
{
    pthread_mutex_lock(&l->mu);
    for (local_stage **p = &l->stages; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&l->mu);
    if (s->out >= 0)
        close(s->out);
    free(s);
}

static px_status local_start(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                             const uint8_t *secret, size_t secret_len, char *addr, size_t addr_cap,
                             void **handle, px_err *err)
{
    px_rt_local_launcher *l = ctx;
    *handle = NULL;
    /* Check the command line as a worker would, then run it with this
     * machine's binary and address. */
    px_rt_worker_opts o;
    bool secret_stdin;
    if (argv->argc < 2 || strcmp(argv->argv[1], "worker"))
        return px_err_set(err, PX_EINVAL, "launcher: not a worker's command line");
    px_status st = px_rt_worker_args_parse(argv->argc - 2, argv->argv + 2, &o, &secret_stdin, err);
    if (st)
        return px_err_prefix(err, st, "launcher: stage %u: ", stage);
    char listen[96];
    snprintf(listen, sizeof listen, "tcp:%s:0", l->host);
    o.listen = listen;
    o.announce = true;
    o.secret = secret;
    o.secret_len = secret_len;
    px_rt_worker_argv av;
    if ((st = px_rt_worker_args_build(&o, l->bin, &av, err)) != PX_OK)
        return st;
    local_stage *s = calloc(1, sizeof *s);
    if (!s) {
        px_rt_worker_args_release(&av);
        return px_err_set(err, PX_ENOMEM, "launcher: out of memory");
    }
    s->out = -1;
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        st = px_err_set(err, PX_EIO, "launcher: pipe: %s", strerror(errno));
        goto done;
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        st = px_err_set(err, PX_EIO, "launcher: fork: %s", strerror(errno));
        goto done;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (getppid() != parent || dup2(in[0], 0) != 0 || dup2(out[1], 1) != 1)
            _exit(126);
        execv(l->bin, av.argv);
        static const char msg[] = "plexus worker: cannot execute the plexus binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    pthread_mutex_lock(&l->mu);
    *s = (local_stage){.next = l->stages, .stage = stage, .pid = pid, .out = -1};
    l->stages = s;
    pthread_mutex_unlock(&l->mu);
    close(in[0]);
    close(out[1]);
    in[0] = out[1] = -1;
    if (secret_len) {
        char hex[2 * PX_RT_SECRET_MAX + 2];
        px_rt_secret_hex(secret, secret_len, hex);
        size_t n = strlen(hex);
        hex[n++] = '\n';
        ssize_t w = write(in[1], hex, n);
        OPENSSL_cleanse(hex, sizeof hex);
        if (w != (ssize_t)n)
            st = px_err_set(err, PX_EIO, "launcher: cannot hand stage %u its secret", stage);
    }
    close(in[1]);
    in[1] = -1;
    if (st == PX_OK)
        st = px__rt_read_announce(out[0], stage, l->timeout_ms, addr, addr_cap, err);
    if (st) {
        kill(pid, SIGKILL);
        reap_one(s, true);
    } else if (fcntl(out[0], F_SETFL, O_NONBLOCK) == 0) {
        s->out = out[0];
        out[0] = -1;
    }
done:
    for (int k = 0; k < 2; k++) {
        if (in[k] >= 0)
            close(in[k]);
        if (out[k] >= 0)
            close(out[k]);
    }
    px_rt_worker_args_release(&av);
    if (st)
        forget(l, s);
    else
        *handle = s;
    return st;
}

/* Reads what the worker wrote after its announcement, without waiting,
 * keeping its "error MESSAGE" line; the pipe is closed at its end. */
static void read_why(local_stage *s)
{
    char buf[1024];
    ssize_t n;
    while (s->out >= 0 && (n = read(s->out, buf, sizeof buf - 1)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return;
            break;
        }
        buf[n] = 0;
        char *e = strstr(buf, "error ");
        if (e && !s->why[0]) {
            e[strcspn(e, "\n")] = 0;
            px_strlcpy(s->why, e + 6, sizeof s->why);
        }
    }
    close(s->out);
    s->out = -1;
}

static px_rt_stage_state local_health(void *ctx, void *handle, int *code, char *detail, size_t cap)
{
    (void)ctx;
    local_stage *s = handle;
    *code = 0;
    if (cap)
        detail[0] = 0;
    if (!s || s->pid <= 0)
        return PX_RT_STAGE_RUNNING;
    reap_one(s, false);
    if (s->reaped && WIFSIGNALED(s->wstatus)) {
        *code = WTERMSIG(s->wstatus);
        snprintf(detail, cap, "killed by signal %d (%s)", *code, strsignal(*code));
        return PX_RT_STAGE_KILLED;
    }
    if (s->reaped) {
        *code = WEXITSTATUS(s->wstatus);
        read_why(s);
        snprintf(detail, cap, "exited with status %d%s%s", *code, s->why[0] ? ": " : "", s->why);
        return PX_RT_STAGE_EXITED;
    }
    if (px__rt_exec_stopped(s->pid)) {
        snprintf(detail, cap, "stopped (pid %d answers nothing)", (int)s->pid);
        return PX_RT_STAGE_STOPPED;
    }
    return PX_RT_STAGE_RUNNING;
}

static px_status local_signal(void *ctx, void *handle, int sig, px_err *err)
{
    (void)ctx;
    local_stage *s = handle;
    if (!s || s->pid <= 0 || s->reaped)
        return px_err_set(err, PX_ESTATE, "launcher: the worker has ended");
    if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCONT && sig != SIGTERM)
        return px_err_set(err, PX_EINVAL, "launcher: signal %d (KILL, STOP, CONT or TERM)", sig);
    if (kill(s->pid, sig) != 0)
        return px_err_set(err, PX_EIO, "launcher: cannot signal stage %u (pid %d): %s", s->stage,
                          (int)s->pid, strerror(errno));
    return PX_OK;
}

static void end_worker(local_stage *s)
{
    if (s->pid > 0 && !s->reaped) {
        kill(s->pid, SIGKILL);
        reap_one(s, true);
    }
}

static void local_stop(void *ctx, void *handle)
{
    if (!handle)
        return;
    end_worker(handle);
    forget(ctx, handle);
}

px_status px_rt_local_launcher_new(const char *bin, const char *host, int timeout_ms,
                                   px_rt_local_launcher **out, px_err *err)
{
    *out = NULL;
    char probe[96];
    snprintf(probe, sizeof probe, "tcp:%s:0", host ? host : "");
    if (!host || strlen(host) >= sizeof((px_rt_local_launcher *)0)->host ||
        px_rt_addr_check(probe, NULL) != PX_OK)
        return px_err_set(err, PX_EINVAL, "launcher: host \"%.64s\": use a numeric IPv4 address",
                          host ? host : "");
    px_rt_local_launcher *l = calloc(1, sizeof *l);
    if (!l)
        return px_err_set(err, PX_ENOMEM, "launcher: out of memory");
    char buf[4096];
    if (!bin) {
        ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
        if (n <= 0) {
            free(l);
            return px_err_set(err, PX_EIO, "launcher: cannot find this program's binary");
        }
        buf[n] = 0;
        bin = buf;
    }
    l->bin = px_strdup(bin);
    if (!l->bin) {
        free(l);
        return px_err_set(err, PX_ENOMEM, "launcher: out of memory");
    }
    px_strlcpy(l->host, host, sizeof l->host);
    pthread_mutex_init(&l->mu, NULL);
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
    l->iface = (px_rt_launcher){.ctx = l,
                                .start = local_start,
                                .health = local_health,
                                .signal = local_signal,
                                .stop = local_stop};
    *out = l;
    return PX_OK;
}

void px_rt_local_launcher_free(px_rt_local_launcher *l)
{
    if (!l)
        return;
    while (l->stages) {
        end_worker(l->stages);
        forget(l, l->stages);
    }
    pthread_mutex_destroy(&l->mu);
    free(l->bin);
    free(l);
}

const px_rt_launcher *px_rt_local_launcher_iface(px_rt_local_launcher *l)
{
    return &l->iface;
}

int px_rt_local_launcher_pid(px_rt_local_launcher *l, const void *handle)
{
    int pid = -1;
    if (!l)
        return -1;
    pthread_mutex_lock(&l->mu);
    for (const local_stage *s = l->stages; s; s = s->next)
        if (s == handle)
            pid = (int)s->pid;
    pthread_mutex_unlock(&l->mu);
    return pid;
}
