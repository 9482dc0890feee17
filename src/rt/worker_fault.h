/*
 * The faults a stage worker applies to itself (worker_fault.c), driven by
 * FAULT frames: its outgoing link's faults, a slowdown of every op, silent
 * corruption of op outputs, a crash at the next step and memory taken from
 * its device.
 */
#ifndef PX_RT_WORKER_FAULT_H
#define PX_RT_WORKER_FAULT_H

#include "rt/pipeline_impl.h"

/* Memory faults a worker holds at once. */
#define PX__RT_WFAULT_MAX_MEMORY 8

typedef struct px__rt_wfault {
    /* Set by the worker before use (borrowed). */
    px_rt_session *session;
    px_rt_conn *down;
    const char *device; /* the device's name in messages */

    bool slow;
    double factor, tau_s;
    uint64_t slow_t0;
    int64_t slow_debt_ns; /* what the last sleep overshot (negative: owed) */

    bool corrupt;
    int32_t layer;
    double magnitude;
    px_rng rng;
    float *row; /* one output row, for its RMS */
    size_t row_cap;

    bool crash;

    px_rt_buffer *memory[PX__RT_WFAULT_MAX_MEMORY];
    uint32_t n_memory;
} px__rt_wfault;

/* Reads and checks a FAULT payload (untrusted: its length, kind, stage
 * and every field).  PX_EPARSE "malformed fault frame from <peer>: ...". */
px_status px__rt_wfault_parse(const uint8_t *p, uint32_t len, const char *peer, px_rt_fault *out,
                              px_err *err);
/* Applies f (addressed to this stage).  Errors: a memory fault the device
 * cannot hold (PX_ENOMEM naming the device and the bytes). */
px_status px__rt_wfault_apply(px__rt_wfault *wf, const px_rt_fault *f, px_err *err);
/* The extra time an op that took op_ns costs on the slowed device, for
 * telemetry (the time itself is spent after the step). */
uint64_t px__rt_wfault_after_op(px__rt_wfault *wf, uint64_t op_ns);
/* Called after each step that took step_ns: sleeps step_ns times the
 * slowdown reached, less what the previous sleep overshot. */
void px__rt_wfault_after_step(px__rt_wfault *wf, uint64_t step_ns);
/* Called before each step: aborts the process when a crash was asked
 * for. */
void px__rt_wfault_before_step(px__rt_wfault *wf);
/* Clears every fault and frees what they hold. */
void px__rt_wfault_release(px__rt_wfault *wf);

#endif
