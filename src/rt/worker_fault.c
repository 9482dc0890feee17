/*
 * The faults a stage worker applies to itself when a FAULT frame names
 * its stage: its outgoing link's faults (the transport applies them), a
 * slowdown of every op that grows towards its factor as a device heating
 * up would, silent corruption of op outputs through the stream's fault
 * hook, an abort at the next step, and memory taken from its device.
 */
#include "base/common.h"

#include <stddef.h>
#include <sys/resource.h>
#include <time.h>

#include "rt/executor_impl.h"
#include "rt/worker_fault.h"

px_status px__rt_wfault_parse(const uint8_t *p, uint32_t len, const char *peer, px_rt_fault *out,
                              px_err *err)
{
    memset(out, 0, sizeof *out);
    if (len != sizeof *out)
        return px_err_set(err, PX_EPARSE,
                          "malformed fault frame from %s: %u bytes, a fault is %zu (run the "
                          "same plexus binary everywhere)",
                          peer, len, sizeof *out);
    /* Enumerations and booleans are read as bytes first: a value outside
     * their range must not be loaded as one. */
    uint32_t kind;
    memcpy(&kind, p + offsetof(px_rt_fault, kind), sizeof kind);
    uint8_t cut = p[offsetof(px_rt_fault, link) + offsetof(px_rt_link_faults, cut)];
    uint8_t mid = p[offsetof(px_rt_fault, link) + offsetof(px_rt_link_faults, cut_mid_frame)];
    if (kind >= PX_RT_FAULT_KILL)
        return px_err_set(err, PX_EPARSE,
                          "malformed fault frame from %s: kind %u is not one a stage applies "
                          "(clear to memory)",
                          peer, kind);
    if (cut > 1 || mid > 1)
        return px_err_set(err, PX_EPARSE,
                          "malformed fault frame from %s: link.cut or link.cut_mid_frame is "
                          "not a boolean",
                          peer);
    memcpy(out, p, sizeof *out);
    px_err why;
    if (px__rt_fault_check(out, PX_RT_MAX_STAGES, &why) != PX_OK)
        return px_err_set(err, PX_EPARSE, "malformed fault frame from %s: %s", peer, why.msg);
    return PX_OK;
}

/* The stream's fault hook: moves one element of the op's output by
 * magnitude times the RMS of its row. */
static px_status corrupt_op(const px_rt_op *op, void *ud, px_err *err)
{
    px__rt_wfault *wf = ud;
    if (!wf->corrupt || (wf->layer >= 0 && op->layer != wf->layer))
        return PX_OK;
    const px_rt_tensor *t = op->dst;
    if (!t || !t->buffer || t->dtype != PX_DTYPE_F32 || t->nb[0] != sizeof(float))
        return PX_OK;
    int64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (cols <= 0 || rows <= 0)
        return PX_OK;
    if ((size_t)cols > wf->row_cap) {
        float *nr = realloc(wf->row, (size_t)cols * sizeof *nr);
        if (!nr)
            return px_err_set(err, PX_ENOMEM, "corrupt fault: out of memory");
        wf->row = nr;
        wf->row_cap = (size_t)cols;
    }
    uint64_t r = px_rng_below(&wf->rng, (uint64_t)rows);
    uint64_t r1 = r % (uint64_t)t->ne[1], r2 = r / (uint64_t)t->ne[1] % (uint64_t)t->ne[2],
             r3 = r / (uint64_t)t->ne[1] / (uint64_t)t->ne[2];
    size_t off = t->offset + r1 * t->nb[1] + r2 * t->nb[2] + r3 * t->nb[3];
    size_t n = (size_t)cols * sizeof(float);
    px_status st = px_rt_buffer_get(t->buffer, off, wf->row, n, err);
    if (st)
        return st;
    double ss = 0;
    for (int64_t i = 0; i < cols; i++)
        ss += (double)wf->row[i] * wf->row[i];
    double rms = sqrt(ss / (double)cols);
    uint64_t c = px_rng_below(&wf->rng, (uint64_t)cols);
    float v = (float)(wf->row[c] + wf->magnitude * (rms > 0 ? rms : 1.0));
    return px_rt_buffer_set(t->buffer, off + c * sizeof(float), &v, sizeof v, err);
}

static void free_memory(px__rt_wfault *wf)
{
    for (uint32_t i = 0; i < wf->n_memory; i++)
        px_rt_buffer_free(wf->memory[i]);
    wf->n_memory = 0;
}

static px_status take_memory(px__rt_wfault *wf, uint64_t bytes, px_err *err)
{
    if (wf->n_memory == PX__RT_WFAULT_MAX_MEMORY)
        return px_err_set(err, PX_ELIMIT,
                          "memory fault: %s already holds %d memory faults; clear them first",
                          wf->device, PX__RT_WFAULT_MAX_MEMORY);
    px_err why;
    px_rt_buffer *b;
    if (px_rt_buffer_alloc(wf->session->device, (size_t)bytes, &b, &why) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "memory fault: %s cannot hold %" PRIu64 " more bytes: %s",
                          wf->device, bytes, why.msg);
    wf->memory[wf->n_memory++] = b;
    return PX_OK;
}

px_status px__rt_wfault_apply(px__rt_wfault *wf, const px_rt_fault *f, px_err *err)
{
    px_rt_stream *stream = px_rt_session_stream(wf->session);
    switch (f->kind) {
    case PX_RT_FAULT_CLEAR:
        px_rt_conn_set_faults(wf->down, NULL);
        wf->slow = wf->corrupt = wf->crash = false;
        px_rt_stream_set_fault_hook(stream, NULL, NULL);
        free_memory(wf);
        return PX_OK;
    case PX_RT_FAULT_LINK:
        px_rt_conn_set_faults(wf->down, &f->link);
        return PX_OK;
    case PX_RT_FAULT_SLOW:
        wf->slow = true;
        wf->factor = f->factor;
        wf->tau_s = f->tau_s;
        wf->slow_t0 = px_now_ns();
        wf->slow_debt_ns = 0;
        return PX_OK;
    case PX_RT_FAULT_CORRUPT:
        wf->corrupt = true;
        wf->layer = f->layer;
        wf->magnitude = f->magnitude;
        px_rng_seed(&wf->rng, f->seed);
        px_rt_stream_set_fault_hook(stream, corrupt_op, wf);
        return PX_OK;
    case PX_RT_FAULT_CRASH:
        wf->crash = true;
        return PX_OK;
    case PX_RT_FAULT_MEMORY:
        return take_memory(wf, f->bytes, err);
    default:
        return px_err_set(err, PX_EINVAL, "%s faults are signals, not frames",
                          px_rt_fault_kind_name(f->kind));
    }
}

/* The slowdown reached t seconds after the fault began:
 * factor(t) = 1 + (factor - 1)(1 - exp(-t / tau)). */
static double slow_factor(const px__rt_wfault *wf)
{
    if (!(wf->tau_s > 0))
        return wf->factor;
    double t = (double)(px_now_ns() - wf->slow_t0) / 1e9;
    return 1 + (wf->factor - 1) * (1 - exp(-t / wf->tau_s));
}

uint64_t px__rt_wfault_after_op(px__rt_wfault *wf, uint64_t op_ns)
{
    if (!wf->slow || op_ns == 0)
        return 0;
    double extra = (double)op_ns * (slow_factor(wf) - 1);
    return extra >= 1 ? (uint64_t)PX_MIN(extra, 60e9) : 0;
}

void px__rt_wfault_after_step(px__rt_wfault *wf, uint64_t step_ns)
{
    if (!wf->slow)
        return;
    /* The whole step slows, host work between ops included: ops of a tiny
     * model take microseconds, less than the work around them, and one
     * sleep per step is not blurred by the timer's granularity.  What
     * the sleep overshot is deducted from the next step's. */
    double want = (double)step_ns * (slow_factor(wf) - 1) - (double)wf->slow_debt_ns;
    if (!(want >= 1000)) {
        /* Too little to sleep for (or already slept ahead): carry it. */
        wf->slow_debt_ns = -(int64_t)want;
        return;
    }
    uint64_t ns = (uint64_t)PX_MIN(want, 60e9), t0 = px_now_ns();
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    wf->slow_debt_ns = (int64_t)(px_now_ns() - t0) - (int64_t)ns;
}

void px__rt_wfault_before_step(px__rt_wfault *wf)
{
    if (!wf->crash)
        return;
    /* The crash is the fault: no core file to clean up after it. */
    struct rlimit none = {0, 0};
    (void)setrlimit(RLIMIT_CORE, &none);
    abort();
}

void px__rt_wfault_release(px__rt_wfault *wf)
{
    free_memory(wf);
    free(wf->row);
    wf->row = NULL;
    wf->row_cap = 0;
}
