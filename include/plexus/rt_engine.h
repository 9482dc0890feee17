/*
 * plexus/rt_engine.h: the generation engine (continuous batching over a
 * session or an executor).  Part of plexus/rt.h, which includes it.
 */
#ifndef PLEXUS_RT_ENGINE_H
#define PLEXUS_RT_ENGINE_H

#include "plexus/rt_pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== */
/* The generation engine: continuous batching                          */
/* ================================================================== */
/*
 * One engine runs every generation: `plexus generate` (a session in this
 * process), `plexus run` (stage workers through an executor) and `plexus
 * serve` (requests arriving over HTTP).  It schedules at the granularity
 * of steps (Orca's iteration-level scheduling): requests join at a step
 * boundary and leave when done.  Each step carries one token for every
 * running sequence that decodes, then chunks of the prompts of sequences
 * still prefilling, up to a budget of rows per step (Sarathi-Serve's
 * chunked prefill mixed with decode).  The KV cache is paged (vLLM's
 * blocks, see px_rt_session_opts.kv_blocks): a request is admitted when
 * the cache has the blocks its tokens need, and when a running sequence
 * needs a block that is not free, the youngest running sequence is
 * preempted: its blocks are freed and it waits at the head of the queue,
 * to be prefilled again with every token it had (recompute), emitting
 * nothing twice.  Through a pipeline, as many micro-batches as its plan
 * priced (else one per stage) are in flight, each with its own share of
 * the sequences, so that the stages work at the same time.
 *
 * Because a row's result never depends on the other rows of its step
 * (see the ops above), a request's tokens do not depend on what runs
 * beside it, on how its prompt was chunked, or on preemptions: its greedy
 * output is the same alone or among many, in one process or through a
 * pipeline.  The same property rebuilds the KV caches after a fault: on a
 * new executor every sequence is prefilled again, and the engine checks
 * bit for bit that the logits that produced each sequence's last token
 * come out the same.
 *
 *     px_rt_engine_opts eo = {.session = s, .tokenizer = t};
 *     px_rt_engine *e;
 *     px_rt_engine_new(&eo, &e, &err);
 *     px_rt_request r = {.prompt = ids, .n_prompt = n, .max_new_tokens = 64,
 *                        .on_token = print_token, .ud = NULL};
 *     uint64_t id;
 *     px_rt_engine_submit(e, &r, &id, &err);
 *     px_rt_engine_run(e, &err);          // until every request is done
 *     px_rt_engine_free(e);
 *
 * Threads: px_rt_engine_submit, px_rt_engine_cancel, px_rt_engine_wait
 * and px_rt_engine_metrics_get may be called from any thread; step and
 * run from one thread at a time (the engine's thread), and the requests'
 * callbacks run on it, inside step.
 */

typedef struct px_rt_engine px_rt_engine;

/* Why a request ended. */
typedef enum px_rt_finish {
    PX_RT_FINISH_STOP = 1,  /* an end token (EOS, BOS or a stop token), or on_token said stop */
    PX_RT_FINISH_LENGTH,    /* max_new_tokens produced */
    PX_RT_FINISH_CONTEXT,   /* the context is full */
    PX_RT_FINISH_CANCELLED, /* px_rt_engine_cancel */
    PX_RT_FINISH_ERROR,     /* the engine failed */
} px_rt_finish;

/* "stop", "length", "context", "cancelled", "error". */
const char *px_rt_finish_name(px_rt_finish f);

#define PX_RT_MAX_LOGPROBS 20

/* A token produced for a request. */
typedef struct px_rt_token_event {
    uint64_t id;    /* the request's */
    uint32_t index; /* tokens the request produced before this one */
    int32_t token;
    const char *piece; /* its text after the previous token (not NUL-terminated) */
    size_t len;
    float logprob;  /* ln p(token) under the model's distribution (the
                       logits' softmax at temperature 1); NAN unless asked */
    uint32_t n_top; /* alternatives asked for, most likely first */
    int32_t top_token[PX_RT_MAX_LOGPROBS];
    float top_logprob[PX_RT_MAX_LOGPROBS];
} px_rt_token_event;

/* What a request cost, at its end. */
typedef struct px_rt_request_stats {
    uint32_t prompt_tokens, new_tokens;
    uint32_t preemptions;
    uint64_t queue_ns; /* submission to first admission */
    uint64_t ttft_ns;  /* submission to the first token; 0 when none */
    uint64_t total_ns; /* submission to the end */
} px_rt_request_stats;

typedef struct px_rt_request {
    const int32_t *prompt; /* token ids, BOS included when wanted (copied) */
    uint32_t n_prompt;     /* >= 1, at most the context */
    /* Tokens to produce at most; 0: none (the prompt is only prefilled);
     * UINT32_MAX: until an end token or the context. */
    uint32_t max_new_tokens;
    px_rt_sampler_opts sampling;
    bool ignore_eos;            /* EOS and BOS do not end the request */
    const int32_t *stop_tokens; /* more end tokens (copied), at most 16 */
    uint32_t n_stop_tokens;
    bool logprobs;         /* fill px_rt_token_event.logprob */
    uint32_t top_logprobs; /* alternatives per token, at most PX_RT_MAX_LOGPROBS */
    /* On the engine's thread.  on_token returns false to end the request
     * (finish STOP: the caller found a stop string). */
    bool (*on_token)(void *ud, const px_rt_token_event *ev);
    /* Exactly once per request, after its last token; err is NULL unless
     * why is PX_RT_FINISH_ERROR. */
    void (*on_finish)(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err);
    /* (optional) The request's tokens past the first `kept` were taken
     * back (a rollback after silent corruption); they come again through
     * on_token. */
    void (*on_retract)(void *ud, uint64_t id, uint32_t kept);
    void *ud;
} px_rt_request;

typedef struct px_rt_engine_opts {
    /* The runner: a session holding the whole model (borrowed), or an
     * executor (borrowed; with a supervisor, the engine may move to the
     * executors it hands over).  Exactly one. */
    px_rt_session *session;
    px_rt_executor *executor;
    const px_rt_tokenizer *tokenizer; /* borrowed; required */
    uint32_t max_running; /* sequences running at once; 0 (or more): the runner's max_seqs */
    uint32_t step_tokens; /* rows per step; 0 (or more): the runner's max_batch_tokens */
    uint32_t max_waiting; /* requests queued; 0: 1024.  More: PX_ELIMIT */
    /* Steps in flight; 0: the micro-batches of the executor's plan
     * (px_rt_pipeline_spec.micro_batches), else one per stage (1 for a
     * session).  Each step carries its share of the sequences. */
    uint32_t micro_batches;
    const px_rt_supervisor *supervisor; /* borrowed; executor only; may be NULL */
    /* (optional) Filled as steps run: the generation's totals and, through
     * a pipeline, every stage's compute and transfers (borrowed). */
    px_rt_pipeline_stats *stats;
} px_rt_engine_opts;

/* Checks the options.  Returns owned (px_rt_engine_free).  Errors:
 * PX_EINVAL (no runner or two, a session without the whole model, a
 * tokenizer of another vocabulary), PX_ENOMEM. */
PX_NODISCARD px_status px_rt_engine_new(const px_rt_engine_opts *o, px_rt_engine **out,
                                        px_err *err);
/* Requests still queued or running end with PX_RT_FINISH_CANCELLED
 * (their callbacks run here, on the caller's thread).  The runner is
 * left to its owner.  NULL is a no-op. */
void px_rt_engine_free(px_rt_engine *e);

/* Queues a request (thread-safe); *id names it.  Errors: PX_EINVAL (an
 * empty prompt, a token outside the vocabulary, too many stop tokens or
 * logprobs, naming the field), PX_ELIMIT (a prompt longer than the
 * context or than the KV cache holds, naming both; the queue is full:
 * retry later), PX_ESTATE (the engine failed), PX_ENOMEM.  A request that
 * fails here never calls its callbacks. */
PX_NODISCARD px_status px_rt_engine_submit(px_rt_engine *e, const px_rt_request *r, uint64_t *id,
                                           px_err *err);
/* Asks for a request to end (thread-safe): it finishes with
 * PX_RT_FINISH_CANCELLED at the next step boundary, its KV blocks freed.
 * An unknown or finished id is ignored. */
void px_rt_engine_cancel(px_rt_engine *e, uint64_t id);

/* Runs one step: takes in new requests and cancellations, schedules,
 * sends steps until `micro_batches` are in flight, then takes the oldest
 * step's result and produces its tokens.  *busy (may be NULL) says
 * whether requests remain.  Errors: the runner's, when no supervisor
 * recovered it; every request then ends with PX_RT_FINISH_ERROR and the
 * engine accepts no more. */
PX_NODISCARD px_status px_rt_engine_step(px_rt_engine *e, bool *busy, px_err *err);
/* Steps until no request is queued or running. */
PX_NODISCARD px_status px_rt_engine_run(px_rt_engine *e, px_err *err);
/* Waits up to timeout_ms for a new request or cancellation (thread-safe);
 * returns at once when requests are queued or running. */
void px_rt_engine_wait(px_rt_engine *e, int timeout_ms);
/* Wakes a px_rt_engine_wait (thread-safe), e.g. to shut a server down. */
void px_rt_engine_wake(px_rt_engine *e);

/* Decode steps of one class of rows (px_rt_engine_decode_timing_get):
 * their count, rows and attended positions; each stage's compute and of
 * it its thread's wait for a core; the hop into each stage (hop_ns[0]:
 * none) and back to the executor (hop_ns[n_stages]); nanoseconds. */
#define PX_RT_ENGINE_ROW_CLASSES 12
typedef struct px_rt_engine_decode_timing {
    uint64_t steps, rows, context;
    uint64_t compute_ns[PX_RT_MAX_STAGES], wait_ns[PX_RT_MAX_STAGES];
    uint64_t hop_ns[PX_RT_MAX_STAGES + 1];
} px_rt_engine_decode_timing;

/* What the engine is doing, for metrics (thread-safe snapshot). */
typedef struct px_rt_engine_metrics {
    uint32_t running, waiting, in_flight;
    uint32_t kv_block_size, kv_blocks, kv_blocks_used;
    uint64_t submitted, finished, cancelled, failed, rejected;
    uint64_t steps, prompt_tokens, new_tokens, recomputed_tokens;
    /* Rows the steps carried (prompt chunks and decode tokens), and the
     * steps that carried only decode rows with their rows: the batch the
     * engine actually forms, against the one its plan priced. */
    uint64_t step_rows, decode_steps, decode_rows;
    uint64_t preemptions;
    uint64_t busy_ns; /* time spent in steps */
    uint64_t recoveries;
    /* Where a step's time went, summed over the steps taken back (replayed
     * ones left out; timed_steps counts them), as the stages' records and
     * the engine's thread measured it, nanoseconds.  n_stages: the
     * stages of the executor the last timed step ran on.  Stage i:
     * stage_compute_ns its compute, stage_wait_ns of it the time its
     * thread waited runnable for a core; hop_ns[i] the hop into it,
     * hop_wait_ns[i] of that its receiver's wait for a core; hop_ns and
     * hop_wait_ns[n_stages] the hop back to the executor.  The engine's
     * thread: host_ns its own work between results (building and sending
     * steps, sampling and handing out tokens, the supervisor's check, its
     * caller's work between steps), result_ns its time waiting for a
     * step's result, and host_wait_ns and result_wait_ns of each the time
     * it waited runnable for a core (0 where the kernel does not say;
     * measured on the thread that steps the engine).  timed_rows and
     * timed_context: the rows those steps carried and the cache positions
     * their rows attended (each sequence's position plus its tokens). */
    uint64_t timed_steps, timed_rows, timed_context;
    uint32_t n_stages;
    uint64_t stage_compute_ns[PX_RT_MAX_STAGES], stage_wait_ns[PX_RT_MAX_STAGES];
    uint64_t hop_ns[PX_RT_MAX_STAGES + 1], hop_wait_ns[PX_RT_MAX_STAGES + 1];
    uint64_t host_ns, host_wait_ns, result_ns, result_wait_ns;
} px_rt_engine_metrics;

void px_rt_engine_metrics_get(px_rt_engine *e, px_rt_engine_metrics *out);
/* The timed steps that carried decode rows only (no prompt chunk), by
 * their rows (thread-safe snapshot): out[c] holds the steps of 2^c to
 * 2^(c+1) - 1 rows (the last class: that many or more), so that a
 * stage's step is known at the batch it ran (px_serve_run_report).  They
 * start again where the executor changes.  Apart from the metrics, which
 * a server copies every step. */
void px_rt_engine_decode_timing_get(px_rt_engine *e,
                                    px_rt_engine_decode_timing out[PX_RT_ENGINE_ROW_CLASSES]);
/* The executor the engine runs on now (it may have moved), or NULL. */
px_rt_executor *px_rt_engine_executor(const px_rt_engine *e);
/* Asks every stage for its telemetry (executor only) into stats, which
 * must be the engine's stats.  Errors: the transport's. */
PX_NODISCARD px_status px_rt_engine_gather_stats(px_rt_engine *e, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_RT_ENGINE_H */
