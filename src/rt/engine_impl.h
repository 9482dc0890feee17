/*
 * Private declarations of the generation engine: requests and their
 * sequences (engine.c takes them in and lets them go), the scheduler that
 * builds each step (engine_sched.c), the runners a step goes through, a
 * session or an executor (engine_runner.c), and the loop that sends
 * steps, produces their tokens and rebuilds after a fault (engine_step.c).
 */
#ifndef PX_RT_ENGINE_IMPL_H
#define PX_RT_ENGINE_IMPL_H

#include "rt/executor_impl.h"

#include <pthread.h>

#define PX__RT_ENGINE_MAX_STOP 16
/* Steps in flight at most (a pipeline of PX_RT_MAX_STAGES stages). */
#define PX__RT_ENGINE_MAX_FLIGHTS PX_RT_MAX_STAGES

/* A request and its sequence. */
typedef struct px__rt_eseq {
    struct px__rt_eseq *next; /* in the inbox or the waiting queue */
    uint64_t id;
    uint32_t ordinal; /* order of submission: the supervisor's "prompt" */
    px_rt_request r;  /* prompt and stop_tokens point into this struct */
    int32_t stop[PX__RT_ENGINE_MAX_STOP];
    /* Every known token: the prompt, then what was produced. */
    int32_t *tokens;
    uint64_t *made_at; /* per produced token: the step that produced it */
    uint32_t n_prompt, n_tokens, cap;
    uint32_t n_new;
    /* In the runner: the KV cache holds tokens[0, n_cached); slot -1 when
     * the sequence is not resident; blocks it holds there. */
    uint32_t n_cached;
    int32_t slot;
    uint32_t blocks;
    bool running;   /* admitted and resident */
    bool in_flight; /* in a step sent and not yet taken back */
    bool cancel;
    /* Rebuild after a fault: positions to catch up to, and the position
     * whose logits produced the last token (0: none to check). */
    uint32_t rebuild_to;
    uint32_t verify_at;
    uint32_t last_crc; /* CRC-32 of the logits row that produced the last token */
    px_rt_sampler *sampler;
    px_rt_request_stats st;
    uint64_t t_submit;
    bool admitted_once;
} px__rt_eseq;

/* One step: its entries (a sequence and the tokens it feeds) and its
 * rows. */
typedef struct px__rt_eflight {
    uint64_t index;
    uint32_t n, rows;
    bool prefill, replay, audit;
    px__rt_eseq **seq;     /* [max_entries] */
    uint32_t *ordinal;     /* [max_entries] */
    uint32_t *pos;         /* [max_entries] */
    uint32_t *n_tokens;    /* [max_entries] */
    px__rt_step_seq *wire; /* [max_entries] */
    px_rt_seq_step *steps; /* [max_entries] (session) */
    int32_t *tokens;       /* [max_rows] */
    uint64_t t_send;
    /* A session's result (its logits stay in the session until the next
     * forward: a session runs one step at a time). */
    px_rt_output out;
} px__rt_eflight;

typedef struct px__rt_runner {
    px_rt_session *s;
    px_rt_executor *ex;
    uint32_t max_seqs, context, max_rows;
    uint32_t kv_block_size, kv_blocks;
    uint32_t n_stages;
    uint32_t micro_batches; /* the plan's steps in flight; 0: not said */
    bool *slot_used;        /* executor: the slots taken, as the workers see them */
} px__rt_runner;

struct px_rt_engine {
    px_rt_engine_opts o;
    const px_rt_tokenizer *t;
    const px_rt_supervisor *sup;
    uint32_t vocab, dim;
    px__rt_runner run;
    uint32_t max_running, step_tokens, max_waiting, depth;
    uint32_t max_entries; /* entries a step may carry */

    /* Between threads (lock): the inbox, cancellations, counters. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    px__rt_eseq *inbox_head, *inbox_tail;
    uint32_t n_inbox;
    uint64_t *cancels;
    size_t n_cancels, cap_cancels;
    uint64_t next_id;
    uint32_t next_ordinal;
    uint32_t n_queued; /* inbox + waiting, for admission control */
    px_rt_engine_metrics m;
    px_rt_engine_decode_timing by_rows[PX_RT_ENGINE_ROW_CLASSES]; /* under mu */
    bool failed;

    /* The engine's thread only. */
    px__rt_eseq **running; /* [max_running], in admission order; NULL gaps */
    uint32_t n_running;
    px__rt_eseq *wait_head, *wait_tail;
    uint32_t n_waiting;
    uint32_t kv_free;
    px__rt_eflight flights[PX__RT_ENGINE_MAX_FLIGHTS];
    uint32_t fl_head, fl_count;                    /* a ring of steps in flight */
    uint64_t index;                                /* steps sent so far */
    uint64_t tokens_out;                           /* tokens produced, all requests */
    uint64_t rows_sent, decode_steps, decode_rows; /* published as m.step_rows, ... */
    float *logits;                                 /* a writable row */
    float *lp;                                     /* log-probabilities of a row */
    bool audit_next;
    px_rt_step_obs obs;
    /* Rebuilding after a failure or a switch. */
    uint32_t n_rebuilding;
    px_rt_executor *before;
    px_rt_rebuild_info info;
    uint64_t rebuild_t0;
    px_rt_executor *switch_to;
    uint64_t keep_steps;
    uint64_t t_start, phase_t0;
    bool first_token;
    /* The engine thread's time (m.host_ns, m.result_ns): when its last
     * wait for a result ended (0: none yet), with its wait for a core
     * then, and its schedstat (px__rt_thread_wait_ns). */
    uint64_t t_result, core_wait_at_result;
    int wait_fd;
};

/* ---- engine.c ---- */
/* Ends a request: leaves the runner, calls on_finish and frees it. */
void px__rt_engine_finish(px_rt_engine *e, px__rt_eseq *q, px_rt_finish why, const px_err *err);
/* Moves the inbox and the cancellations into the engine's state. */
void px__rt_engine_take_inbox(px_rt_engine *e);
/* Publishes the counters the metrics snapshot reads. */
void px__rt_engine_publish(px_rt_engine *e);

/* ---- engine_sched.c ---- */
/* Builds the next step into f; f->n is 0 when nothing can run now. */
px_status px__rt_engine_build(px_rt_engine *e, px__rt_eflight *f, px_err *err);
/* Puts q back in the queue, first among those waiting, freeing its
 * blocks (preemption, rebuild). */
px_status px__rt_engine_requeue(px_rt_engine *e, px__rt_eseq *q, px_err *err);
/* Ends the requests asked to be cancelled that are not in flight. */
void px__rt_engine_cancel_due(px_rt_engine *e);

/* ---- engine_runner.c ---- */
/* The steps the engine keeps in flight on a runner: the caller's
 * micro_batches, else the plan's, else one per stage (1 for a session). */
uint32_t px__rt_runner_depth(const px__rt_runner *r, uint32_t asked);
px_status px__rt_runner_init(px__rt_runner *r, px_rt_session *s, px_rt_executor *ex, px_err *err);
void px__rt_runner_release(px__rt_runner *r);
/* A sequence joins (the lowest free slot) or leaves. */
px_status px__rt_runner_add(px__rt_runner *r, int32_t *slot, px_err *err);
px_status px__rt_runner_remove(px__rt_runner *r, int32_t slot, px_err *err);
/* Sends the step (a session runs it at once). */
px_status px__rt_runner_submit(px_rt_engine *e, px__rt_eflight *f, px_err *err);
/* Takes the oldest step's result: logits (n rows of vocab values) and,
 * through a pipeline, the stages' timings into e->obs. */
px_status px__rt_runner_collect(px_rt_engine *e, px__rt_eflight *f, const float **logits,
                                px_err *err);

/* ---- engine_step.c ---- */
/* Allocates the arrays of flights [0, depth) that have none. */
px_status px__rt_engine_ensure_flights(px_rt_engine *e, uint32_t depth, px_err *err);
/* Continues on `next` (a replacement after a failure, or the
 * supervisor's switch): every running sequence is prefilled again there. */
px_status px__rt_engine_rebuild(px_rt_engine *e, px_rt_executor *next, px_err *err);

#endif
