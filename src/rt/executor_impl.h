/*
 * Private declarations of the executor's files: the executor object
 * (executor_run.c sets it up and runs the ring, executor_fault.c injects
 * faults and reads the workers' health) and the fault checks the executor
 * and the workers share.
 */
#ifndef PX_RT_EXECUTOR_IMPL_H
#define PX_RT_EXECUTOR_IMPL_H

#include "rt/pipeline_impl.h"

#include <pthread.h>
#include <sys/types.h>

/* A frame the receiver thread read from the last stage. */
typedef struct px__rt_rx_frame {
    struct px__rt_rx_frame *next;
    px_rt_frame_header h;
    uint64_t t_recv_ns; /* CLOCK_MONOTONIC when it had arrived whole */
    uint64_t wait_ns;   /* the receiver's wait for a core while it received
                           (px__rt_thread_wait_ns; 0: not known) */
    uint8_t payload[];
} px__rt_rx_frame;

struct px_rt_executor {
    px_rt_pipeline_spec spec;
    px_rt_executor_opts opts;
    char *model_path, *worker_bin;
    px_rt_model *model;
    uint32_t max_seqs, context, max_rows, n_threads;
    uint32_t kv_blocks, kv_block_size; /* every stage's, as its session computes them */
    int timeout_ms;
    int step_timeout_ms; /* the wait for a step's result; 0: timeout_ms */
    char dir[64];
    char addr[PX_RT_MAX_STAGES + 1][128]; /* stage i's; [n]: the executor's return */
    pid_t pid[PX_RT_MAX_STAGES];          /* 0 for stages a launcher started */
    const px_rt_launcher *launcher;       /* NULL: the executor's own workers */
    bool launched[PX_RT_MAX_STAGES];      /* the launcher started it */
    void *handle[PX_RT_MAX_STAGES];       /* the launcher's */
    uint8_t secret[PX_RT_SECRET_MAX];
    size_t secret_len;
    int wstatus[PX_RT_MAX_STAGES];
    char end_detail[PX_RT_MAX_STAGES][448]; /* a launched stage's end, its launcher's words */
    bool reaped[PX_RT_MAX_STAGES];
    uint32_t reap_order[PX_RT_MAX_STAGES]; /* 1, 2, ...: the order workers ended in */
    uint32_t n_reaped;
    px_rt_listener *ret;
    px_rt_conn *first, *last;
    px__rt_stage_info info[PX_RT_MAX_STAGES];
    bool *slot_used;
    bool failed;
    uint8_t *sendbuf;
    size_t sendcap;

    /* The receiver: a thread reads every frame the last stage sends into
     * a queue, so that the ring never stalls on the executor while it is
     * busy sending (several steps may be in flight; executor_recv.c). */
    pthread_t rx;
    bool rx_started;
    pthread_mutex_t rx_mu;
    pthread_cond_t rx_cv;
    px__rt_rx_frame *rx_head, *rx_tail;
    bool rx_ended; /* the connection failed or closed: rx_status, rx_err */
    px_status rx_status;
    px_err rx_err;
    px__rt_rx_frame *rx_held; /* handed out last; freed at the next receive */
};

/* Starts the receiver on ex->last (executor_recv.c).  PX_EIO. */
px_status px__rt_exec_rx_start(px_rt_executor *ex, px_err *err);
/* Stops it (shutting the connection down) and frees the queue. */
void px__rt_exec_rx_stop(px_rt_executor *ex);
/* Takes the first queued frame of type `want` (or an ERROR frame, which
 * becomes the error), dropping the sequence acknowledgements queued before
 * it and leaving frames of other types in place.  Waits at most
 * timeout_ms.  *p stays valid until the next call.  Errors: PX_ETIMEOUT
 * naming the last stage, PX_EPEER (an error frame, or the connection
 * closed), the transport's. */
px_status px__rt_exec_rx_take(px_rt_executor *ex, px_rt_frame_type want, int timeout_ms,
                              px_rt_frame_header *h, const uint8_t **p, px_err *err);
/* When the frame last taken had arrived (CLOCK_MONOTONIC), 0 if none. */
uint64_t px__rt_exec_rx_time(const px_rt_executor *ex);
/* Of the frame last taken, the time the receiver thread waited runnable
 * for a core while it received it, 0 if none or not known. */
uint64_t px__rt_exec_rx_wait(const px_rt_executor *ex);

/* Collects the workers that ended, without waiting (executor_run.c). */
void px__rt_exec_reap(px_rt_executor *ex);
/* Whether /proc says the process is stopped (executor_run.c). */
bool px__rt_exec_stopped(pid_t pid);
/* Whether stage i is stopped: its process, or what its launcher says. */
bool px__rt_exec_stage_stopped(const px_rt_executor *ex, uint32_t i);
/* Asks every stage for its description again (executor_run.c). */
px_status px__rt_exec_gather_info(px_rt_executor *ex, px_err *err);
/* Reads a worker's "listening ADDRESS" line (--announce) from fd within
 * timeout_ms into addr (launcher_local.c). */
px_status px__rt_read_announce(int fd, uint32_t stage, int timeout_ms, char *addr, size_t cap,
                               px_err *err);
/* The stage to blame: the first killed by a signal, else the first that
 * exited, else a stopped one; -1 when none (executor_fault.c).  Reads
 * what was reaped; reap first. */
int px__rt_exec_blame(const px_rt_executor *ex, bool *stopped);

/* Checks a fault's fields: a stage below n_stages and every parameter in
 * range.  PX_EINVAL naming the field and the fix (executor_fault.c). */
px_status px__rt_fault_check(const px_rt_fault *f, uint32_t n_stages, px_err *err);

#endif
