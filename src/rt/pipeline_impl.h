/*
 * Private declarations shared by the pipeline's files: the transport
 * (transport_*.c), the stage worker (worker.c) and the executor
 * (executor_*.c), including the binary layout of step, result and
 * telemetry payloads.
 */
#ifndef PX_RT_PIPELINE_IMPL_H
#define PX_RT_PIPELINE_IMPL_H

#include "rt/rt_impl.h"

/* The peer's name in messages; never NULL. */
const char *px__rt_conn_peer(const px_rt_conn *c);
/* Shuts the socket down both ways: a thread blocked reading it wakes with
 * PX_EPEER (transport_conn.c). */
void px__rt_conn_shutdown(px_rt_conn *c);
/* The connection's secret (px_rt_conn_set_secret), NULL when none. */
const uint8_t *px__rt_conn_secret(const px_rt_conn *c, size_t *len);

/* The clock a connection reads its deadlines and its intermittent faults'
 * phase from, and sleeps its injected latencies on: the monotonic clock
 * and nanosleep unless a test puts its own in, so that what a test
 * asserts (a deadline passed, a latency added, an on-phase) follows the
 * times it sets rather than how busy the machine is.  now_ns returns
 * nanoseconds on a monotonic scale; sleep_ns waits (or accounts for) ns.
 * A poll for data still waits in real time, bounded by what the clock
 * says is left of the deadline. */
typedef struct px__rt_clock {
    uint64_t (*now_ns)(void *ud);
    void (*sleep_ns)(void *ud, uint64_t ns);
    void *ud;
} px__rt_clock;

/* Puts clock (borrowed; it must outlive the connection or the next call)
 * in c; NULL puts the real clock back.  The intermittent faults' phase
 * starts again at the clock's now.  Not thread safe: call it before the
 * connection is used. */
void px__rt_conn_set_clock(px_rt_conn *c, const px__rt_clock *clock);

/* Nanoseconds the calling thread has waited runnable for a core (the
 * kernel's run_delay, the second field of /proc/thread-self/schedstat), or
 * 0 where the kernel does not say.  Time a thread spends waiting for a
 * core is the host's other work holding the cores, not the device or the
 * link it serves: the healing loop's detector leaves it out.  *fd is the
 * thread's own schedstat file: start it at -2 (not opened yet), call only
 * from that thread (thread-self is the opener's), and close it with
 * px__rt_thread_wait_close; -1 after a failed open (every read then says
 * 0).  Opened once and read with pread: no allocation on a step's path
 * (thread_wait.c). */
uint64_t px__rt_thread_wait_ns(int *fd);
void px__rt_thread_wait_close(int *fd);

/* Payloads are little-endian structs copied with memcpy. */

/* STEP and RESULT start with this. */
typedef struct px__rt_step_head {
    uint32_t n_seqs;
    uint32_t n_rows;  /* STEP: activation rows; RESULT: logit rows */
    uint32_t row_len; /* STEP: dim (hidden) or 0 (tokens); RESULT: vocab */
    uint32_t n_records;
    uint32_t prefill; /* 1 for a prefill micro-batch, 0 for decode */
    uint32_t reserved;
} px__rt_step_head;

/* Then n_seqs of these (STEP only). */
typedef struct px__rt_step_seq {
    int32_t seq;
    uint32_t pos;
    uint32_t n_tokens;
    uint32_t reserved;
} px__rt_step_seq;

/* Then the tokens (i32 x n_rows) or rows (f32 x n_rows x row_len), then
 * n_records of these: each stage appends its own.  Times are
 * CLOCK_MONOTONIC, shared by every process of the machine, so that hop
 * times are the receiver's recv_done minus the later of the sender's
 * send_start and the receiver's ready (with several steps in flight a
 * frame may wait while its receiver finishes the step before). */
typedef struct px__rt_stage_record {
    uint32_t stage;
    uint32_t rows;
    uint64_t recv_done_ns;
    uint64_t compute_ns;
    uint64_t send_start_ns;
    uint64_t ready_ns;     /* when the stage began waiting for this frame */
    uint64_t wait_ns;      /* of compute_ns, the time the stage's thread waited
                              runnable for a core (0: not known) */
    uint64_t recv_wait_ns; /* of the hop in, the same: the receiving thread's
                              wait for a core while it received */
} px__rt_stage_record;

/* Audited steps (frame flag PX_RT_STEP_AUDIT): after the records come
 * n_records blocks, one per stage in ring order, each this head and then
 * n f32 values: the stage's output row for the step's first row. */
typedef struct px__rt_audit_head {
    uint32_t stage;
    uint32_t n;
} px__rt_audit_head;

/* FAULT payload: a px_rt_fault as the executor's binary lays it out (the
 * workers run the same binary).  Every stage passes it on; the one it
 * names applies it first. */

/* SEQ payload. */
typedef struct px__rt_seq_msg {
    uint32_t op; /* 1 add, 2 remove */
    int32_t seq;
} px__rt_seq_msg;

/* INFO: each stage appends one of these. */
typedef struct px__rt_stage_info {
    uint32_t stage;
    int32_t pid;
    uint32_t layer_begin, layer_end;
    uint64_t weight_bytes, kv_bytes;
    px_rt_device_props device;
} px__rt_stage_info;

/* STATS: each stage appends a head and n entries. */
typedef struct px__rt_stats_head {
    uint32_t stage;
    uint32_t n_entries;
} px__rt_stats_head;

typedef struct px__rt_stats_entry {
    int32_t layer;
    uint32_t kind;
    uint64_t count, ns, flops, bytes;
} px__rt_stats_entry;

/* The most sequences one step carries. */
#define PX__RT_MAX_STEP_SEQS 4096u

/* The executor's parts its other files and the engine use
 * (executor_run.c). */
px_status px__rt_exec_fail(px_rt_executor *ex, px_status st, px_err *err);
px_status px__rt_exec_recv(px_rt_executor *ex, px_rt_frame_type want, px_rt_frame_header *h,
                           const uint8_t **p, px_err *err);
const px_rt_pipeline_spec *px__rt_exec_spec(const px_rt_executor *ex);

#endif
