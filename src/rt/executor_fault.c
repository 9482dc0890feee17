/*
 * Fault injection into a running pipeline and the workers' health: KILL
 * and STOP are signals to a worker; the other faults travel the ring as a
 * FAULT frame that the named stage applies (worker_fault.c).  Health comes
 * from the process table, so reading it never waits on a worker.
 */
#include "base/common.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rt/executor_impl.h"

const char *px_rt_fault_kind_name(px_rt_fault_kind k)
{
    static const char *const names[] = {"clear", "link",   "slow", "corrupt",
                                        "crash", "memory", "kill", "stop"};
    return (unsigned)k < PX_RT_FAULT_KIND_COUNT_ ? names[k] : "unknown";
}

static bool finite_nonneg(double v)
{
    return isfinite(v) && v >= 0;
}

px_status px__rt_fault_check(const px_rt_fault *f, uint32_t n_stages, px_err *err)
{
    if ((unsigned)f->kind >= PX_RT_FAULT_KIND_COUNT_)
        return px_err_set(err, PX_EINVAL, "fault: kind %u is not a fault kind (0 to %d)",
                          (unsigned)f->kind, PX_RT_FAULT_KIND_COUNT_ - 1);
    const char *k = px_rt_fault_kind_name(f->kind);
    if (f->stage >= n_stages)
        return px_err_set(err, PX_EINVAL,
                          "%s fault: stage %u does not exist: the pipeline has %u stages (0-%u)", k,
                          f->stage, n_stages, n_stages - 1);
    switch (f->kind) {
    case PX_RT_FAULT_LINK: {
        const px_rt_link_faults *l = &f->link;
        if (!finite_nonneg(l->bandwidth_bps))
            return px_err_set(err, PX_EINVAL,
                              "link fault: link.bandwidth_bps %g must be finite and >= 0 (0: "
                              "unlimited)",
                              l->bandwidth_bps);
        if (!finite_nonneg(l->period_s))
            return px_err_set(err, PX_EINVAL,
                              "link fault: link.period_s %g must be finite and >= 0 (0: always)",
                              l->period_s);
        if (l->period_s > 0 && !(l->duty > 0 && l->duty <= 1))
            return px_err_set(err, PX_EINVAL,
                              "link fault: link.duty %g must be in (0, 1] with a period: the "
                              "share of each period the link is degraded",
                              l->duty);
        if (!(l->loss >= 0 && l->loss <= 1))
            return px_err_set(err, PX_EINVAL,
                              "link fault: link.loss %g must be a probability in [0, 1]", l->loss);
        if (!(l->flip >= 0 && l->flip <= 1))
            return px_err_set(err, PX_EINVAL,
                              "link fault: link.flip %g must be a probability in [0, 1]", l->flip);
        break;
    }
    case PX_RT_FAULT_SLOW:
        if (!(isfinite(f->factor) && f->factor >= 1))
            return px_err_set(err, PX_EINVAL,
                              "slow fault: factor %g must be finite and >= 1 (the final "
                              "slowdown)",
                              f->factor);
        if (!finite_nonneg(f->tau_s))
            return px_err_set(err, PX_EINVAL,
                              "slow fault: tau_s %g must be finite and >= 0 (0: at once)",
                              f->tau_s);
        break;
    case PX_RT_FAULT_CORRUPT:
        if (!(isfinite(f->magnitude) && f->magnitude > 0))
            return px_err_set(err, PX_EINVAL,
                              "corrupt fault: magnitude %g must be finite and > 0 (times the "
                              "row's RMS)",
                              f->magnitude);
        if (f->layer < -1)
            return px_err_set(err, PX_EINVAL,
                              "corrupt fault: layer %d: use a block index, or -1 for every op",
                              (int)f->layer);
        break;
    case PX_RT_FAULT_MEMORY:
        if (f->bytes == 0 || f->bytes > (uint64_t)SIZE_MAX / 2)
            return px_err_set(err, PX_EINVAL,
                              "memory fault: bytes %" PRIu64 " must be above 0 and "
                              "addressable",
                              f->bytes);
        break;
    default:
        break;
    }
    return PX_OK;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Sends a signal and waits (at most a second) until the process table
 * shows it took effect, so that health read right after is the fault's. */
static px_status signal_stage(px_rt_executor *ex, uint32_t i, int sig, px_err *err)
{
    if (ex->launched[i]) {
        if (!ex->launcher->signal)
            return px_err_set(err, PX_EUNSUPPORTED,
                              "%s fault: stage %u was started by a launcher that cannot signal it",
                              sig == SIGKILL ? "kill" : "stop", i);
        if (ex->reaped[i])
            return px_err_set(err, PX_ESTATE, "%s fault: stage %u has already ended",
                              sig == SIGKILL ? "kill" : "stop", i);
        px_status st = ex->launcher->signal(ex->launcher->ctx, ex->handle[i], sig, err);
        if (st)
            return st;
        for (int k = 0; k < 1000; k++) {
            px__rt_exec_reap(ex);
            if (sig == SIGKILL ? ex->reaped[i] : px__rt_exec_stage_stopped(ex, i))
                break;
            sleep_ms(1);
        }
        return PX_OK;
    }
    if (ex->pid[i] <= 0 || ex->reaped[i])
        return px_err_set(err, PX_ESTATE, "%s fault: stage %u (pid %d) has already ended",
                          sig == SIGKILL ? "kill" : "stop", i, (int)ex->pid[i]);
    if (kill(ex->pid[i], sig) != 0)
        return px_err_set(err, PX_EIO, "cannot signal stage %u (pid %d): %s", i, (int)ex->pid[i],
                          strerror(errno));
    for (int k = 0; k < 1000; k++) {
        px__rt_exec_reap(ex);
        if (sig == SIGKILL ? ex->reaped[i] : px__rt_exec_stopped(ex->pid[i]))
            break;
        sleep_ms(1);
    }
    return PX_OK;
}

px_status px_rt_executor_inject(px_rt_executor *ex, const px_rt_fault *f, px_err *err)
{
    if (!ex || !f)
        return px_err_set(err, PX_EINVAL, "inject: an executor and a fault are required");
    if (ex->failed)
        return px_err_set(err, PX_ESTATE,
                          "inject: the pipeline failed before; start a new executor");
    px_status st = px__rt_fault_check(f, ex->spec.n_stages, err);
    if (st)
        return st;
    if (f->kind == PX_RT_FAULT_KILL)
        return signal_stage(ex, f->stage, SIGKILL, err);
    if (f->kind == PX_RT_FAULT_STOP)
        return signal_stage(ex, f->stage, SIGSTOP, err);
    /* The payload is the struct's bytes with the padding zeroed, so that
     * equal faults are equal frames. */
    px_rt_fault wire;
    memset(&wire, 0, sizeof wire);
    wire.kind = f->kind;
    wire.stage = f->stage;
    wire.link.latency_ns = f->link.latency_ns;
    wire.link.bandwidth_bps = f->link.bandwidth_bps;
    wire.link.cut = f->link.cut;
    wire.link.cut_after = f->link.cut_after;
    wire.link.cut_mid_frame = f->link.cut_mid_frame;
    wire.link.period_s = f->link.period_s;
    wire.link.duty = f->link.duty;
    wire.link.loss = f->link.loss;
    wire.link.resend_ns = f->link.resend_ns;
    wire.link.flip = f->link.flip;
    wire.link.seed = f->link.seed;
    wire.factor = f->factor;
    wire.tau_s = f->tau_s;
    wire.layer = f->layer;
    wire.magnitude = f->magnitude;
    wire.bytes = f->bytes;
    wire.seed = f->seed;
    st = px_rt_conn_send(ex->first, PX_RT_FRAME_FAULT, 0, &wire, sizeof wire, err);
    px_rt_frame_header h;
    const uint8_t *p;
    /* Its return around the ring is the acknowledgement: every stage
     * before the named one passed it on, the named one applied it. */
    if (st == PX_OK)
        st = px__rt_exec_recv(ex, PX_RT_FRAME_FAULT, &h, &p, err);
    if (st == PX_OK && h.length != sizeof wire)
        st = px_err_set(err, PX_EPARSE, "the %s fault came back as %u bytes, not %zu",
                        px_rt_fault_kind_name(f->kind), h.length, sizeof wire);
    /* Memory faults change what the stage reports as free: read the
     * stages' descriptions again (px_rt_executor_stage_device). */
    if (st == PX_OK && (f->kind == PX_RT_FAULT_MEMORY || f->kind == PX_RT_FAULT_CLEAR))
        st = px__rt_exec_gather_info(ex, err);
    if (st)
        return px__rt_exec_fail(ex, st, err);
    return PX_OK;
}

int px__rt_exec_blame(const px_rt_executor *ex, bool *stopped)
{
    int killed = -1, exited = -1;
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        if (!ex->reaped[i])
            continue;
        int *best = WIFSIGNALED(ex->wstatus[i]) ? &killed : &exited;
        if (*best < 0 || ex->reap_order[i] < ex->reap_order[*best])
            *best = (int)i;
    }
    *stopped = false;
    if (killed >= 0)
        return killed;
    if (exited >= 0)
        return exited;
    for (uint32_t i = 0; i < ex->spec.n_stages; i++)
        if (px__rt_exec_stage_stopped(ex, i)) {
            *stopped = true;
            return (int)i;
        }
    return -1;
}

px_rt_stage_state px_rt_executor_stage_health(px_rt_executor *ex, uint32_t i, char *detail,
                                              size_t cap)
{
    char local[8];
    if (!detail || cap == 0) {
        detail = local;
        cap = sizeof local;
    }
    detail[0] = 0;
    if (!ex || i >= ex->spec.n_stages || (ex->pid[i] <= 0 && !ex->launched[i]))
        return PX_RT_STAGE_RUNNING;
    if (ex->launched[i]) {
        int code = 0;
        px__rt_exec_reap(ex);
        return ex->launcher->health(ex->launcher->ctx, ex->handle[i], &code, detail, cap);
    }
    px__rt_exec_reap(ex);
    if (ex->reaped[i]) {
        int s = ex->wstatus[i];
        if (WIFSIGNALED(s)) {
            snprintf(detail, cap, "killed by signal %d (%s)", WTERMSIG(s), strsignal(WTERMSIG(s)));
            return PX_RT_STAGE_KILLED;
        }
        snprintf(detail, cap, "exited with status %d", WEXITSTATUS(s));
        return PX_RT_STAGE_EXITED;
    }
    if (px__rt_exec_stopped(ex->pid[i])) {
        snprintf(detail, cap, "stopped (pid %d answers nothing)", (int)ex->pid[i]);
        return PX_RT_STAGE_STOPPED;
    }
    return PX_RT_STAGE_RUNNING;
}

void px_rt_executor_kill_stages(px_rt_executor *ex)
{
    if (!ex)
        return;
    px__rt_exec_reap(ex);
    for (uint32_t i = 0; i < ex->spec.n_stages; i++) {
        if (ex->reaped[i])
            continue;
        if (ex->launched[i]) {
            if (!ex->launcher->signal ||
                ex->launcher->signal(ex->launcher->ctx, ex->handle[i], SIGKILL, NULL) != PX_OK) {
                /* It cannot be signalled: end it and count it killed. */
                ex->launcher->stop(ex->launcher->ctx, ex->handle[i]);
                ex->launched[i] = false;
                ex->handle[i] = NULL;
                ex->reaped[i] = true;
                ex->wstatus[i] = SIGKILL;
                ex->reap_order[i] = ++ex->n_reaped;
            }
        } else if (ex->pid[i] > 0) {
            kill(ex->pid[i], SIGKILL);
        }
    }
}

int px_rt_executor_culprit(px_rt_executor *ex)
{
    if (!ex)
        return -1;
    px__rt_exec_reap(ex);
    bool stopped;
    return px__rt_exec_blame(ex, &stopped);
}

void px_rt_executor_set_step_timeout(px_rt_executor *ex, int ms)
{
    if (ex)
        ex->step_timeout_ms = ms > 0 ? ms : 0;
}

const px_rt_pipeline_spec *px_rt_executor_spec(const px_rt_executor *ex)
{
    return ex ? &ex->spec : NULL;
}
