/*
 * The executor: starts one worker process per stage of a plan, joins
 * them in a ring of framed connections, and generates through it: prefill
 * in micro-batches, then decode token by token, several prompts together,
 * sequences joining and leaving between steps.  Every wait is bounded; a
 * worker that died is named by its stage, device and pid.
 */
#include "base/common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "rt/executor_impl.h"

#define DEFAULT_TIMEOUT_MS 10000

/* ------------------------------------------------------------------ */
/* Workers                                                             */
/* ------------------------------------------------------------------ */

static const char *stage_device(const px_rt_executor *ex, uint32_t i)
{
    const px_rt_stage_spec *s = &ex->spec.stages[i];
    return s->device[0] ? s->device : s->backend;
}

/* A launched stage that ended is reaped as a child would be: its wait
 * status made from what the launcher says. */
static void reap_launched(px_rt_executor *ex, uint32_t i)
{
    int code = 0;
    char detail[sizeof ex->end_detail[i]];
    px_rt_stage_state s =
        ex->launcher->health(ex->launcher->ctx, ex->handle[i], &code, detail, sizeof detail);
    if (s != PX_RT_STAGE_KILLED && s != PX_RT_STAGE_EXITED)
        return;
    px_strlcpy(ex->end_detail[i], detail, sizeof ex->end_detail[i]);
    ex->reaped[i] = true;
    ex->wstatus[i] =
        s == PX_RT_STAGE_KILLED ? (code > 0 && code < 0x7f ? code : SIGKILL) : (code & 0xff) << 8;
    ex->reap_order[i] = ++ex->n_reaped;
}

static void reap(px_rt_executor *ex, bool block)
{
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        if (ex->launched[i] && !ex->reaped[i])
            reap_launched(ex, i);
        if (ex->pid[i] <= 0 || ex->reaped[i])
            continue;
        int status;
        pid_t r = waitpid(ex->pid[i], &status, block ? 0 : WNOHANG);
        if (r == ex->pid[i]) {
            ex->reaped[i] = true;
            ex->wstatus[i] = status;
            ex->reap_order[i] = ++ex->n_reaped;
        }
    }
}

/* Where stage i runs, for messages: "pid 4242", or for a launched stage
 * the address it listens on. */
static const char *stage_where(const px_rt_executor *ex, uint32_t i, char *buf, size_t cap)
{
    if (ex->launched[i] || ex->pid[i] <= 0)
        snprintf(buf, cap, "launched, at %s", ex->addr[i]);
    else
        snprintf(buf, cap, "pid %d", (int)ex->pid[i]);
    return buf;
}

/* Appends why stage i ended, if it did, to sb: a launched stage's in its
 * launcher's words, which carry the worker's own message (its machine's
 * log is not this one's). */
static bool describe_exit(const px_rt_executor *ex, uint32_t i, px_strbuf *sb)
{
    if (!ex->reaped[i])
        return false;
    int s = ex->wstatus[i];
    char where[160];
    px_strbuf_addf(sb, "stage %u (%s%s, %s) ", i, stage_device(ex, i),
                   ex->spec.stages[i].emulated ? ", emulated" : "",
                   stage_where(ex, i, where, sizeof where));
    if (ex->launched[i] && ex->end_detail[i][0])
        px_strbuf_addf(sb, "%s", ex->end_detail[i]);
    else if (WIFSIGNALED(s))
        px_strbuf_addf(sb, "died: killed by signal %d (%s)", WTERMSIG(s), strsignal(WTERMSIG(s)));
    else
        px_strbuf_addf(sb, "exited with status %d", WEXITSTATUS(s));
    return true;
}

/* Whether /proc says the process is stopped (state T or t). */
bool px__rt_exec_stopped(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* "pid (comm) S ...": the state follows the last ')'. */
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
}

bool px__rt_exec_stage_stopped(const px_rt_executor *ex, uint32_t i)
{
    if (ex->launched[i]) {
        int code;
        char detail[8];
        return ex->launcher->health(ex->launcher->ctx, ex->handle[i], &code, detail,
                                    sizeof detail) == PX_RT_STAGE_STOPPED;
    }
    return ex->pid[i] > 0 && px__rt_exec_stopped(ex->pid[i]);
}

/* What /proc says of the stage workers: the processor time they have
 * used together (ns), and whether one of them is stopped or runnable. */
typedef struct stage_activity {
    uint64_t cpu_ns;
    bool stopped, runnable;
} stage_activity;

static stage_activity stages_activity(const px_rt_executor *ex)
{
    stage_activity a = {0};
    long tick = sysconf(_SC_CLK_TCK);
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        char path[64], buf[512];
        if (ex->launched[i]) {
            /* Another machine's: only its launcher knows. */
            a.stopped |= px__rt_exec_stage_stopped(ex, i);
            continue;
        }
        if (ex->pid[i] <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)ex->pid[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        /* "pid (comm) S ppid ... utime stime": fields 3, 14 and 15. */
        const char *p = strrchr(buf, ')');
        if (!p || p[1] != ' ')
            continue;
        char state = p[2];
        a.stopped |= state == 'T' || state == 't';
        a.runnable |= state == 'R' || state == 'D';
        unsigned long long utime = 0, stime = 0;
        if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                   &stime) == 2 &&
            tick > 0)
            a.cpu_ns += (utime + stime) * (1000000000ull / (unsigned long long)tick);
    }
    return a;
}

/* When the launcher's health of every launched stage still running will
 * have shown an end that happened before now (now itself when it is
 * current, or without a launcher). */
static uint64_t health_current_at(const px_rt_executor *ex, uint64_t now)
{
    uint64_t at = now;
    if (!ex->launcher || !ex->launcher->lag_ns)
        return at;
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        if (!ex->launched[i] || ex->reaped[i])
            continue;
        uint64_t lag = ex->launcher->lag_ns(ex->launcher->ctx, ex->handle[i]);
        at = PX_MAX(at, now + PX_MIN(lag, PX_RT_HEALTH_LAG_MAX_NS));
    }
    return at;
}

/* Turns a failure of the ring into a message naming the stage that died
 * first (one killed by a signal, else one that exited), when one did. */
static px_status ring_failed(px_rt_executor *ex, px_status st, px_err *err)
{
    ex->failed = true;
    /* Give the rest of the ring a moment to notice and exit, but no more
     * than it takes to know whom to blame: a worker killed by a signal
     * (its socket closes a moment before it can be reaped), or a stopped
     * one when the ring timed out.  A worker that only exited is usually
     * one that saw its neighbour die, so a killed one is waited for a
     * little longer.  A launcher may learn of a worker's end later than
     * its neighbours see the connection close (a fleet's node lost while
     * its agent was between polls): its lag is waited out too, or a dead
     * worker would be taken for a cut link.  Each reading of the lag
     * bounds when an end before the failure shows, so the earliest
     * bound holds. */
    uint64_t t0 = px_now_ns(), grace = 200000000u;
    uint64_t current_at = health_current_at(ex, t0);
    int culprit = -1;
    bool stopped = false;
    for (;;) {
        reap(ex, false);
        culprit = px__rt_exec_blame(ex, &stopped);
        if (culprit >= 0 && !stopped && WIFSIGNALED(ex->wstatus[culprit]))
            break;
        if (culprit >= 0 && stopped && st == PX_ETIMEOUT)
            break;
        uint64_t now = px_now_ns();
        if (culprit >= 0 && !stopped)
            grace = PX_MIN(grace, now - t0 + 20000000u);
        current_at = PX_MIN(current_at, health_current_at(ex, now));
        if (now - t0 >= grace && now >= current_at)
            break;
        struct timespec ts = {0, now - t0 < grace ? 1000000 : 5000000};
        nanosleep(&ts, NULL);
    }
    char why[256];
    px_strlcpy(why, err ? err->msg : "", sizeof why);
    if (culprit >= 0 && stopped) {
        if (st != PX_ETIMEOUT)
            return st;
        /* A worker that answers nothing may be stopped (SIGSTOP, a
         * debugger): name it rather than the hop that timed out. */
        uint32_t i = (uint32_t)culprit;
        char where[160];
        px_err_set(err, PX_ETIMEOUT,
                   "stage %u (%s%s, %s) is stopped and answers "
                   "nothing; the pipeline timed out (%s)",
                   i, stage_device(ex, i), ex->spec.stages[i].emulated ? ", emulated" : "",
                   stage_where(ex, i, where, sizeof where), why);
        return PX_ETIMEOUT;
    }
    /* Otherwise a stage's own error frame, or the timeout naming the
     * stage that stopped answering, already says what happened. */
    if (culprit < 0 || !WIFSIGNALED(ex->wstatus[culprit]))
        return st;
    px_strbuf sb = PX_STRBUF_INIT;
    describe_exit(ex, (uint32_t)culprit, &sb);
    px_err_set(err, PX_EPEER, "%s; the pipeline stopped (%s)", sb.buf ? sb.buf : "", why);
    px_strbuf_release(&sb);
    return PX_EPEER;
}

/* Creates the run's private folder for the Unix sockets under $TMPDIR (or
 * /tmp when unset or empty), mode 0700 by mkdtemp.  A socket path must fit
 * sockaddr_un (108 bytes with "/executor.sock"), hence the bound on dir. */
static px_status make_socket_dir(char *dir, size_t cap, px_err *err)
{
    const char *tmp = getenv("TMPDIR");
    size_t n = tmp ? strlen(tmp) : 0;
    while (n > 1 && tmp[n - 1] == '/')
        n--;
    if (!n) {
        tmp = "/tmp";
        n = 4;
    }
    int len = snprintf(dir, cap, "%.*s/plexus-run-XXXXXX", (int)PX_MIN(n, (size_t)INT_MAX), tmp);
    if (len < 0 || (size_t)len >= cap) {
        dir[0] = 0;
        return px_err_set(err, PX_EINVAL,
                          "executor: TMPDIR \"%.60s\" is longer than the %zu characters a Unix "
                          "socket path leaves: set a shorter TMPDIR or use the tcp transport",
                          tmp, cap - sizeof "/plexus-run-XXXXXX");
    }
    if (!mkdtemp(dir)) {
        int e = errno;
        dir[0] = 0;
        return px_err_set(err, PX_EIO,
                          "executor: cannot create a folder for the sockets under %.*s: %s (set "
                          "TMPDIR to a writable folder)",
                          (int)PX_MIN(n, (size_t)200), tmp, strerror(e));
    }
    return PX_OK;
}

/* The options of stage i's worker (its strings borrow ex and prof). */
static px_status stage_opts(px_rt_executor *ex, uint32_t i, px_strbuf *prof, px_rt_worker_opts *o,
                            px_err *err)
{
    const px_rt_stage_spec *s = &ex->spec.stages[i];
    if (!strcmp(s->backend, "emu")) {
        px_status st = px_rt_emu_profile_format(&s->emu, prof, err);
        if (st)
            return st;
    }
    *o = (px_rt_worker_opts){
        .stage = i,
        .model_path = ex->model_path,
        .layer_begin = s->layer_begin,
        .layer_end = s->layer_end,
        .embedding = s->embedding,
        .head = s->head,
        .backend = s->backend,
        .emu_profile = prof->len ? prof->buf : NULL,
        .device_name = s->device,
        .n_threads = ex->n_threads,
        .listen = ex->addr[i],
        .next = ex->addr[i + 1 < ex->spec.n_stages ? i + 1 : PX_RT_MAX_STAGES],
        .timeout_ms = ex->timeout_ms,
        .max_seqs = ex->max_seqs,
        .context = ex->context,
        .max_batch_tokens = ex->max_rows,
        .kv_blocks = ex->kv_blocks,
        .kv_block_size = ex->kv_block_size,
        .secret = ex->secret_len ? ex->secret : NULL,
        .secret_len = ex->secret_len,
        .announce = ex->launcher != NULL,
    };
    return PX_OK;
}

/* Starts stage i through the launcher; its address goes to ex->addr[i]. */
static px_status launch(px_rt_executor *ex, uint32_t i, px_err *err)
{
    px_strbuf prof = PX_STRBUF_INIT;
    px_rt_worker_opts o;
    px_rt_worker_argv av = {0};
    /* The launcher puts an address of its machine in place of this. */
    px_strlcpy(ex->addr[i], "tcp:127.0.0.1:0", sizeof ex->addr[i]);
    px_status st = stage_opts(ex, i, &prof, &o, err);
    if (st == PX_OK)
        st = px_rt_worker_args_build(&o, "plexus", &av, err);
    char addr[128] = "";
    if (st == PX_OK) {
        void *h = NULL;
        st = ex->launcher->start(ex->launcher->ctx, i, &av, ex->secret, ex->secret_len, addr,
                                 sizeof addr, &h, err);
        ex->handle[i] = st == PX_OK ? h : NULL;
        ex->launched[i] = ex->handle[i] != NULL;
        if (st)
            px_err_prefix(err, st, "stage %u (%s): ", i, stage_device(ex, i));
    }
    if (st == PX_OK && (st = px_rt_addr_check(addr, err)) != PX_OK)
        px_err_prefix(err, st, "stage %u: the launcher reported ", i);
    if (st == PX_OK)
        px_strlcpy(ex->addr[i], addr, sizeof ex->addr[i]);
    px_rt_worker_args_release(&av);
    px_strbuf_release(&prof);
    return st;
}

/* Starts stage i's worker as a child.  With tcp, the worker binds a port
 * of its own choosing on 127.0.0.1 and announces it on a pipe, which
 * goes to ex->addr[i] (a port picked here and let go could be taken by
 * another process before the worker binds it); else it listens at
 * ex->addr[i]. */
static px_status spawn(px_rt_executor *ex, uint32_t i, bool tcp, px_err *err)
{
    px_strbuf prof = PX_STRBUF_INIT;
    px_rt_worker_opts o;
    px_rt_worker_argv av = {0};
    if (tcp)
        px_strlcpy(ex->addr[i], "tcp:127.0.0.1:0", sizeof ex->addr[i]);
    px_status st = stage_opts(ex, i, &prof, &o, err);
    o.announce = tcp;
    if (st == PX_OK)
        st = px_rt_worker_args_build(&o, ex->worker_bin, &av, err);
    px_strbuf_release(&prof);
    if (st)
        return st;
    /* The secret reaches the worker on a pipe to its standard input, and
     * its address comes back on one from its standard output. */
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if ((ex->secret_len && pipe2(in, O_CLOEXEC) != 0) || (tcp && pipe2(out, O_CLOEXEC) != 0)) {
        int e = errno;
        for (int k = 0; k < 2; k++)
            if (in[k] >= 0)
                close(in[k]);
        px_rt_worker_args_release(&av);
        return px_err_set(err, PX_EIO, "stage %u: pipe: %s", i, strerror(e));
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        for (int k = 0; k < 2; k++) {
            if (in[k] >= 0)
                close(in[k]);
            if (out[k] >= 0)
                close(out[k]);
        }
        px_rt_worker_args_release(&av);
        return px_err_set(err, PX_EIO, "stage %u: fork: %s", i, strerror(e));
    }
    if (pid == 0) {
        /* A worker must not outlive its executor, and takes signals
         * whatever its parent blocked. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (getppid() != parent)
            _exit(126);
        if ((in[0] >= 0 && dup2(in[0], 0) != 0) || (out[1] >= 0 && dup2(out[1], 1) != 1))
            _exit(126);
        execv(ex->worker_bin, av.argv);
        static const char msg[] = "plexus worker: cannot execute the plexus binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    px_rt_worker_args_release(&av);
    ex->pid[i] = pid;
    if (out[1] >= 0)
        close(out[1]);
    if (in[0] >= 0) {
        close(in[0]);
        char hex[2 * PX_RT_SECRET_MAX + 2];
        px_rt_secret_hex(ex->secret, ex->secret_len, hex);
        size_t n = strlen(hex);
        hex[n++] = '\n';
        /* At most 130 bytes: within the pipe's buffer, never blocks. */
        ssize_t w = write(in[1], hex, n);
        int e = errno;
        OPENSSL_cleanse(hex, sizeof hex);
        close(in[1]);
        if (w != (ssize_t)n)
            st = px_err_set(err, PX_EIO, "stage %u: cannot hand the secret to the worker: %s", i,
                            w < 0 ? strerror(e) : "short write");
    }
    if (out[0] >= 0) {
        char addr[sizeof ex->addr[i]];
        if (st == PX_OK &&
            (st = px__rt_read_announce(out[0], i, ex->timeout_ms, addr, sizeof addr, err)) == PX_OK)
            px_strlcpy(ex->addr[i], addr, sizeof ex->addr[i]);
        close(out[0]);
    }
    return st;
}

/* Waits for the ring to close, watching for a worker that exits first. */
static px_status join_ring(px_rt_executor *ex, px_err *err)
{
    const px_ir_hparams *hp = px_rt_model_hparams(ex->model);
    px_rt_hello mine = {
        .stage = UINT32_MAX, .dim = hp->dim, .max_payload = PX_RT_FRAME_MAX_PAYLOAD};
    px_digest d;
    char hex[65];
    px_status st = px_sha256_file(ex->model_path, &d, err);
    if (st)
        return st;
    px_digest_hex(&d, hex);
    snprintf(mine.model, sizeof mine.model, "sha256:%s", hex);
    uint32_t n = ex->spec.n_stages;
    char peer[320], where[160];
    snprintf(peer, sizeof peer, "stage %u (%s, %s)", n - 1, stage_device(ex, n - 1),
             stage_where(ex, n - 1, where, sizeof where));
    /* Workers open the model before they connect: allow them the timeout
     * to do so, polling for one that gave up. */
    uint64_t deadline = px_now_ns() + (uint64_t)ex->timeout_ms * 1000000u;
    for (;;) {
        st = px_rt_listener_accept(ex->ret, 100, peer, &ex->last, err);
        if (st != PX_ETIMEOUT)
            break;
        reap(ex, false);
        for (uint32_t i = 0; i < n; i++)
            if (ex->reaped[i]) {
                px_strbuf sb = PX_STRBUF_INIT;
                describe_exit(ex, i, &sb);
                px_err_set(err, PX_EPEER, "%s while the pipeline was starting%s",
                           sb.buf ? sb.buf : "a stage",
                           ex->launched[i] ? "" : " (its message is above)");
                px_strbuf_release(&sb);
                return PX_EPEER;
            }
        if (px_now_ns() > deadline)
            return px_err_set(err, PX_ETIMEOUT, "the pipeline did not form within %d ms",
                              ex->timeout_ms);
    }
    if (st)
        return st;
    px_rt_conn_set_timeout(ex->last, ex->timeout_ms);
    px_rt_hello theirs;
    if ((st = px_rt_conn_set_secret(ex->last, ex->secret, ex->secret_len, err)) != PX_OK ||
        (st = px_rt_hello_server(ex->last, &mine, &theirs, err)) != PX_OK)
        return st;
    snprintf(peer, sizeof peer, "stage 0 (%s, %s)", stage_device(ex, 0),
             stage_where(ex, 0, where, sizeof where));
    if ((st = px_rt_conn_connect(ex->addr[0], ex->timeout_ms, peer, &ex->first, err)) != PX_OK)
        return st;
    px_rt_conn_set_timeout(ex->first, ex->timeout_ms);
    if ((st = px_rt_conn_set_secret(ex->first, ex->secret, ex->secret_len, err)) != PX_OK ||
        (st = px_rt_hello_client(ex->first, &mine, &theirs, err)) != PX_OK)
        return st;
    return px__rt_exec_rx_start(ex, err);
}

/* Receives the next frame from the last stage; an error frame becomes
 * the error. */
static px_status recv_last(px_rt_executor *ex, px_rt_frame_type want, px_rt_frame_header *h,
                           const uint8_t **p, px_err *err)
{
    /* A step's result may have a tighter deadline than the transport's
     * (px_rt_executor_set_step_timeout): a hung stage is found sooner. */
    bool step = want == PX_RT_FRAME_RESULT && ex->step_timeout_ms > 0;
    px_status st;
    if (!step) {
        st = px__rt_exec_rx_take(ex, want, ex->timeout_ms, h, p, err);
    } else {
        /* Past the step's deadline a stage that still works (it used the
         * processor since, or waits for one) is slow, not stuck: on a
         * busy host that is the host's doing.  It gets another deadline,
         * up to the transport's; a stopped one, or one that did nothing,
         * is stuck. */
        stage_activity a0 = stages_activity(ex);
        int waited = 0;
        for (;;) {
            st = px__rt_exec_rx_take(ex, want, ex->step_timeout_ms, h, p, err);
            waited += ex->step_timeout_ms;
            if (st != PX_ETIMEOUT || waited >= ex->timeout_ms)
                break;
            stage_activity a1 = stages_activity(ex);
            if (a1.stopped || (a1.cpu_ns == a0.cpu_ns && !a1.runnable))
                break;
            a0 = a1;
        }
    }
    if (st)
        return st;
    if (h->type == PX_RT_FRAME_ERROR && want != PX_RT_FRAME_ERROR)
        return px_err_set(err, PX_EPEER, "%.*s", (int)PX_MIN(h->length, 240u), (const char *)*p);
    if (h->type != want)
        return px_err_set(err, PX_EPARSE, "%s: expected a frame of type %u, got %u",
                          px__rt_conn_peer(ex->last), want, h->type);
    return PX_OK;
}

px_status px__rt_exec_gather_info(px_rt_executor *ex, px_err *err)
{
    px_status st = px_rt_conn_send(ex->first, PX_RT_FRAME_INFO, 0, NULL, 0, err);
    px_rt_frame_header h;
    const uint8_t *p;
    if (st == PX_OK)
        st = recv_last(ex, PX_RT_FRAME_INFO, &h, &p, err);
    if (st)
        return st;
    if (h.length != ex->spec.n_stages * sizeof(px__rt_stage_info))
        return px_err_set(err, PX_EPARSE, "the stages' descriptions do not add up");
    memcpy(ex->info, p, h.length);
    return PX_OK;
}

static px_status check_model(px_rt_executor *ex, px_err *err)
{
    const px_rt_pipeline_spec *sp = &ex->spec;
    uint32_t n_layers = px_rt_model_hparams(ex->model)->n_layers;
    if (sp->model_id[0] && px_str_starts_with(sp->model_id, "sha256:")) {
        px_digest d;
        char hex[65];
        px_status st = px_sha256_file(ex->model_path, &d, err);
        if (st)
            return st;
        px_digest_hex(&d, hex);
        if (strcmp(sp->model_id + 7, hex))
            return px_err_set(err, PX_EVALIDATE,
                              "model %s (sha256:%.12s...) is not the model "
                              "the plan was made for (%.19s...): pass that model, or plan "
                              "again for this one",
                              ex->model_path, hex, sp->model_id);
    }
    if (sp->stages[sp->n_stages - 1].layer_end != n_layers)
        return px_err_set(err, PX_EVALIDATE,
                          "the plan's stages cover blocks 0-%" PRId64 " but model %s "
                          "has %u blocks: the model does not match the plan",
                          (int64_t)sp->stages[sp->n_stages - 1].layer_end - 1, ex->model_path,
                          n_layers);
    return PX_OK;
}

px_status px_rt_executor_new(const px_rt_pipeline_spec *spec, const px_rt_executor_opts *opts,
                             px_rt_executor **out, px_err *err)
{
    *out = NULL;
    if (!spec || !opts || !opts->model_path || spec->n_stages == 0 ||
        spec->n_stages > PX_RT_MAX_STAGES)
        return px_err_set(err, PX_EINVAL,
                          "executor: a plan with 1 to %d stages and a model "
                          "are required",
                          PX_RT_MAX_STAGES);
    px_rt_executor *ex = calloc(1, sizeof *ex);
    if (!ex)
        return px_err_set(err, PX_ENOMEM, "executor: out of memory");
    ex->spec = *spec;
    ex->opts = *opts;
    ex->model_path = px_strdup(opts->model_path);
    ex->worker_bin = px_strdup(opts->worker_bin ? opts->worker_bin : "/proc/self/exe");
    ex->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    ex->n_threads = opts->n_threads ? opts->n_threads : 1;
    ex->max_seqs = opts->max_seqs ? opts->max_seqs : 8;
    px_status st;
    if (!ex->model_path || !ex->worker_bin) {
        st = px_err_set(err, PX_ENOMEM, "executor: out of memory");
        goto fail;
    }
    if (!strcmp(ex->worker_bin, "/proc/self/exe")) {
        /* Resolve now: a child's /proc/self/exe is the child's. */
        char buf[4096];
        ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
        if (n > 0) {
            buf[n] = 0;
            free(ex->worker_bin);
            ex->worker_bin = px_strdup(buf);
        }
    }
    if ((st = px_rt_model_open(ex->model_path, &ex->model, err)) != PX_OK ||
        (st = check_model(ex, err)) != PX_OK)
        goto fail;
    const px_ir_hparams *hp = px_rt_model_hparams(ex->model);
    uint32_t model_ctx = hp->context_length ? hp->context_length : 2048;
    ex->context = opts->context ? PX_MIN(opts->context, model_ctx) : model_ctx;
    ex->max_rows = opts->max_batch_tokens ? opts->max_batch_tokens : PX_MIN(ex->context, 512u);
    px__rt_kv_defaults(ex->context, ex->max_seqs, opts->kv_block_size, opts->kv_blocks,
                       &ex->kv_block_size, &ex->kv_blocks);
    ex->slot_used = calloc(ex->max_seqs, sizeof *ex->slot_used);
    if (!ex->slot_used) {
        st = px_err_set(err, PX_ENOMEM, "executor: out of memory");
        goto fail;
    }
    ex->launcher = opts->launcher;
    if (ex->launcher && (!ex->launcher->start || !ex->launcher->health || !ex->launcher->stop)) {
        st = px_err_set(err, PX_EINVAL, "executor: a launcher needs start, health and stop");
        goto fail;
    }
    if (opts->secret_len) {
        if (!opts->secret || opts->secret_len < PX_RT_SECRET_MIN ||
            opts->secret_len > PX_RT_SECRET_MAX) {
            st = px_err_set(err, PX_EINVAL, "executor: a secret of %zu bytes (%d to %d)",
                            opts->secret_len, PX_RT_SECRET_MIN, PX_RT_SECRET_MAX);
            goto fail;
        }
        memcpy(ex->secret, opts->secret, opts->secret_len);
        ex->secret_len = opts->secret_len;
    } else if (ex->launcher || opts->transport == PX_RT_TRANSPORT_TCP) {
        /* Any local process can reach a TCP port: the workers answer only
         * the executor's ring. */
        if ((st = px_rt_secret_new(ex->secret, err)) != PX_OK)
            goto fail;
        ex->secret_len = PX_RT_SECRET_BYTES;
    }
    if (ex->launcher) {
        const char *ret = opts->listen ? opts->listen : "tcp:127.0.0.1:0";
        if (!px_str_starts_with(ret, "tcp:")) {
            st = px_err_set(err, PX_EINVAL,
                            "executor: listen address \"%.100s\": with a launcher the "
                            "executor listens on tcp:A.B.C.D:PORT",
                            ret);
            goto fail;
        }
        if ((st = px_rt_listener_new(ret, &ex->ret, err)) != PX_OK)
            goto fail;
        px_strlcpy(ex->addr[PX_RT_MAX_STAGES], px_rt_listener_address(ex->ret), sizeof ex->addr[0]);
        /* The last stage first: each worker's next hop already listens. */
        for (uint32_t k = spec->n_stages; k-- > 0;)
            if ((st = launch(ex, k, err)) != PX_OK) {
                st = ring_failed(ex, st, err);
                goto fail;
            }
    } else if (opts->transport == PX_RT_TRANSPORT_TCP) {
        /* Ports of their own choosing, announced: the last stage first,
         * so that each worker's next hop already listens. */
        if ((st = px_rt_listener_new("tcp:127.0.0.1:0", &ex->ret, err)) != PX_OK)
            goto fail;
        px_strlcpy(ex->addr[PX_RT_MAX_STAGES], px_rt_listener_address(ex->ret), sizeof ex->addr[0]);
        for (uint32_t k = spec->n_stages; k-- > 0;)
            if ((st = spawn(ex, k, true, err)) != PX_OK)
                goto fail;
    } else {
        if ((st = make_socket_dir(ex->dir, sizeof ex->dir, err)) != PX_OK)
            goto fail;
        for (uint32_t i = 0; i < spec->n_stages; i++)
            snprintf(ex->addr[i], sizeof ex->addr[i], "unix:%s/stage-%u.sock", ex->dir, i);
        snprintf(ex->addr[PX_RT_MAX_STAGES], sizeof ex->addr[0], "unix:%s/executor.sock", ex->dir);
        if ((st = px_rt_listener_new(ex->addr[PX_RT_MAX_STAGES], &ex->ret, err)) != PX_OK)
            goto fail;
        for (uint32_t i = 0; i < spec->n_stages; i++)
            if ((st = spawn(ex, i, false, err)) != PX_OK)
                goto fail;
    }
    if ((st = join_ring(ex, err)) != PX_OK || (st = px__rt_exec_gather_info(ex, err)) != PX_OK) {
        st = ring_failed(ex, st, err);
        goto fail;
    }
    *out = ex;
    return PX_OK;
fail:
    ex->failed = true;
    px_rt_executor_free(ex);
    return st;
}

void px_rt_executor_free(px_rt_executor *ex)
{
    if (!ex)
        return;
    if (!ex->failed && ex->first && ex->rx_started &&
        px_rt_conn_send(ex->first, PX_RT_FRAME_SHUTDOWN, 0, NULL, 0, NULL) == PX_OK) {
        px_rt_frame_header h;
        const uint8_t *p;
        (void)px__rt_exec_rx_take(ex, PX_RT_FRAME_SHUTDOWN, ex->timeout_ms, &h, &p, NULL);
    }
    px__rt_exec_rx_stop(ex);
    px_rt_conn_free(ex->first);
    px_rt_conn_free(ex->last);
    /* Workers exit on shutdown or when their neighbours close; any left
     * after a grace period is killed. */
    for (int k = 0; k < 200; k++) {
        reap(ex, false);
        bool all = true;
        for (uint32_t i = 0; i < ex->spec.n_stages; i++)
            all &= (ex->pid[i] <= 0 && !ex->launched[i]) || ex->reaped[i];
        if (all)
            break;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        if (ex->pid[i] > 0 && !ex->reaped[i])
            kill(ex->pid[i], SIGKILL);
        if (ex->launched[i]) {
            ex->launcher->stop(ex->launcher->ctx, ex->handle[i]);
            ex->launched[i] = false;
            ex->handle[i] = NULL;
        }
    }
    reap(ex, true);
    OPENSSL_cleanse(ex->secret, sizeof ex->secret);
    px_rt_listener_free(ex->ret);
    if (ex->dir[0]) {
        for (uint32_t i = 0; i < ex->spec.n_stages; i++)
            (void)unlink(ex->addr[i] + 5);
        (void)rmdir(ex->dir);
    }
    px_rt_model_free(ex->model);
    free(ex->model_path);
    free(ex->worker_bin);
    free(ex->slot_used);
    free(ex->sendbuf);
    free(ex);
}

void px_rt_executor_set_faults(px_rt_executor *ex, const px_rt_link_faults *f)
{
    if (ex && ex->first)
        px_rt_conn_set_faults(ex->first, f);
}

int px_rt_executor_stage_pid(const px_rt_executor *ex, uint32_t i)
{
    return ex && i < ex->spec.n_stages && !ex->launched[i] ? (int)ex->pid[i] : -1;
}

void *px_rt_executor_stage_handle(const px_rt_executor *ex, uint32_t i)
{
    return ex && i < ex->spec.n_stages && ex->launched[i] ? ex->handle[i] : NULL;
}

const px_rt_device_props *px_rt_executor_stage_device(const px_rt_executor *ex, uint32_t i)
{
    return ex && i < ex->spec.n_stages ? &ex->info[i].device : NULL;
}

/* ------------------------------------------------------------------ */
/* Shared with executor_generate.c and executor_fault.c                */
/* ------------------------------------------------------------------ */

void px__rt_exec_reap(px_rt_executor *ex)
{
    reap(ex, false);
}

px_status px__rt_exec_fail(px_rt_executor *ex, px_status st, px_err *err)
{
    return ring_failed(ex, st, err);
}

px_status px__rt_exec_recv(px_rt_executor *ex, px_rt_frame_type want, px_rt_frame_header *h,
                           const uint8_t **p, px_err *err)
{
    return recv_last(ex, want, h, p, err);
}

const px_rt_pipeline_spec *px__rt_exec_spec(const px_rt_executor *ex)
{
    return &ex->spec;
}
