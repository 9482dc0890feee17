/*
 * The executor: starts one worker process per stage of a plan, joins
 * them in a ring of framed connections, and generates through it: prefill
 * in micro-batches, then decode token by token, several prompts together,
 * sequences joining and leaving between steps.  Every wait is bounded; a
 * worker that died is named by its stage, device and pid.
 */
#include "base/common.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "rt/executor_impl.h"

#define DEFAULT_TIMEOUT_MS 10000
#define MAX_ARGS           48

/* ------------------------------------------------------------------ */
/* Workers                                                             */
/* ------------------------------------------------------------------ */

static const char *stage_device(const px_rt_executor *ex, uint32_t i)
{
    const px_rt_stage_spec *s = &ex->spec.stages[i];
    return s->device[0] ? s->device : s->backend;
}

static void reap(px_rt_executor *ex, bool block)
{
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
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

/* Appends why stage i ended, if it did, to sb. */
static bool describe_exit(const px_rt_executor *ex, uint32_t i, px_strbuf *sb)
{
    if (!ex->reaped[i])
        return false;
    int s = ex->wstatus[i];
    px_strbuf_addf(sb, "stage %u (%s%s, pid %d) ", i, stage_device(ex, i),
                   ex->spec.stages[i].emulated ? ", emulated" : "", (int)ex->pid[i]);
    if (WIFSIGNALED(s))
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
     * little longer. */
    uint64_t t0 = px_now_ns(), grace = 200000000u;
    int culprit = -1;
    bool stopped = false;
    for (;;) {
        reap(ex, false);
        culprit = px__rt_exec_blame(ex, &stopped);
        if (culprit >= 0 && !stopped && WIFSIGNALED(ex->wstatus[culprit]))
            break;
        if (culprit >= 0 && stopped && st == PX_ETIMEOUT)
            break;
        if (culprit >= 0 && !stopped)
            grace = PX_MIN(grace, px_now_ns() - t0 + 20000000u);
        if (px_now_ns() - t0 >= grace)
            break;
        struct timespec ts = {0, 1000000};
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
        px_err_set(err, PX_ETIMEOUT,
                   "stage %u (%s%s, pid %d) is stopped and answers "
                   "nothing; the pipeline timed out (%s)",
                   i, stage_device(ex, i), ex->spec.stages[i].emulated ? ", emulated" : "",
                   (int)ex->pid[i], why);
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

static px_status pick_tcp_ports(px_rt_executor *ex, px_err *err)
{
    int fds[PX_RT_MAX_STAGES + 1];
    uint32_t n = ex->spec.n_stages + 1;
    px_status st = PX_OK;
    uint32_t i = 0;
    for (; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fds[i], (struct sockaddr *)&a, &len) != 0) {
            st = px_err_set(err, PX_EIO, "cannot find a free port on 127.0.0.1: %s",
                            strerror(errno));
            if (fds[i] >= 0)
                close(fds[i]);
            break;
        }
        snprintf(ex->addr[i], sizeof ex->addr[i], "tcp:127.0.0.1:%u", ntohs(a.sin_port));
    }
    for (uint32_t k = 0; k < i; k++)
        close(fds[k]);
    return st;
}

static px_status spawn(px_rt_executor *ex, uint32_t i, px_err *err)
{
    const px_rt_stage_spec *s = &ex->spec.stages[i];
    char stage[16], layers[48], threads[16], tmo[16], seqs[16], ctx[16], rows[16], kvb[16], kvs[16];
    snprintf(stage, sizeof stage, "%u", i);
    if (s->layer_begin == s->layer_end)
        snprintf(layers, sizeof layers, "none@%u", s->layer_begin);
    else
        snprintf(layers, sizeof layers, "%u-%u", s->layer_begin, s->layer_end - 1);
    snprintf(threads, sizeof threads, "%u", ex->n_threads);
    snprintf(tmo, sizeof tmo, "%d", ex->timeout_ms);
    snprintf(seqs, sizeof seqs, "%u", ex->max_seqs);
    snprintf(ctx, sizeof ctx, "%u", ex->context);
    snprintf(rows, sizeof rows, "%u", ex->max_rows);
    snprintf(kvb, sizeof kvb, "%u", ex->kv_blocks);
    snprintf(kvs, sizeof kvs, "%u", ex->kv_block_size);
    px_strbuf prof = PX_STRBUF_INIT;
    if (!strcmp(s->backend, "emu")) {
        px_status st = px_rt_emu_profile_format(&s->emu, &prof, err);
        if (st)
            return st;
    }
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = ex->worker_bin;
    argv[n++] = "worker";
    argv[n++] = "--stage", argv[n++] = stage;
    argv[n++] = "--model", argv[n++] = ex->model_path;
    argv[n++] = "--layers", argv[n++] = layers;
    if (s->embedding)
        argv[n++] = "--embedding";
    if (s->head)
        argv[n++] = "--head";
    argv[n++] = "--backend", argv[n++] = s->backend;
    if (prof.len)
        argv[n++] = "--emu-profile", argv[n++] = prof.buf;
    if (s->device[0])
        argv[n++] = "--device", argv[n++] = s->device;
    argv[n++] = "--threads", argv[n++] = threads;
    argv[n++] = "--listen", argv[n++] = ex->addr[i];
    argv[n++] = "--next",
    argv[n++] = ex->addr[i + 1 < ex->spec.n_stages ? i + 1 : PX_RT_MAX_STAGES];
    argv[n++] = "--timeout-ms", argv[n++] = tmo;
    argv[n++] = "--max-seqs", argv[n++] = seqs;
    argv[n++] = "--context", argv[n++] = ctx;
    argv[n++] = "--batch-tokens", argv[n++] = rows;
    argv[n++] = "--kv-blocks", argv[n++] = kvb;
    argv[n++] = "--kv-block-size", argv[n++] = kvs;
    argv[n] = NULL;
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        px_strbuf_release(&prof);
        return px_err_set(err, PX_EIO, "stage %u: fork: %s", i, strerror(errno));
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
        execv(ex->worker_bin, (char *const *)argv);
        static const char msg[] = "plexus worker: cannot execute the plexus binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    px_strbuf_release(&prof);
    ex->pid[i] = pid;
    return PX_OK;
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
    char peer[160];
    snprintf(peer, sizeof peer, "stage %u (%s, pid %d)", n - 1, stage_device(ex, n - 1),
             (int)ex->pid[n - 1]);
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
                px_err_set(err, PX_EPEER,
                           "%s while the pipeline was starting (its message is "
                           "above)",
                           sb.buf ? sb.buf : "a stage");
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
    if ((st = px_rt_hello_server(ex->last, &mine, &theirs, err)) != PX_OK)
        return st;
    snprintf(peer, sizeof peer, "stage 0 (%s, pid %d)", stage_device(ex, 0), (int)ex->pid[0]);
    if ((st = px_rt_conn_connect(ex->addr[0], ex->timeout_ms, peer, &ex->first, err)) != PX_OK)
        return st;
    px_rt_conn_set_timeout(ex->first, ex->timeout_ms);
    if ((st = px_rt_hello_client(ex->first, &mine, &theirs, err)) != PX_OK)
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
    px_status st =
        px__rt_exec_rx_take(ex, want, step ? ex->step_timeout_ms : ex->timeout_ms, h, p, err);
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
    if (opts->transport == PX_RT_TRANSPORT_TCP) {
        if ((st = pick_tcp_ports(ex, err)) != PX_OK)
            goto fail;
        px_strlcpy(ex->addr[PX_RT_MAX_STAGES], ex->addr[spec->n_stages],
                   sizeof ex->addr[PX_RT_MAX_STAGES]);
    } else {
        if ((st = make_socket_dir(ex->dir, sizeof ex->dir, err)) != PX_OK)
            goto fail;
        for (uint32_t i = 0; i < spec->n_stages; i++)
            snprintf(ex->addr[i], sizeof ex->addr[i], "unix:%s/stage-%u.sock", ex->dir, i);
        snprintf(ex->addr[PX_RT_MAX_STAGES], sizeof ex->addr[0], "unix:%s/executor.sock", ex->dir);
    }
    if ((st = px_rt_listener_new(ex->addr[PX_RT_MAX_STAGES], &ex->ret, err)) != PX_OK)
        goto fail;
    for (uint32_t i = 0; i < spec->n_stages; i++)
        if ((st = spawn(ex, i, err)) != PX_OK)
            goto fail;
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
            all &= ex->pid[i] <= 0 || ex->reaped[i];
        if (all)
            break;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t i = 0; i < ex->spec.n_stages; i++)
        if (ex->pid[i] > 0 && !ex->reaped[i])
            kill(ex->pid[i], SIGKILL);
    reap(ex, true);
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
    return ex && i < ex->spec.n_stages ? (int)ex->pid[i] : -1;
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
