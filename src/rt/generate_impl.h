/*
 * Private declarations of generation through the pipeline: its state
 * (executor_generate.c runs the steps, executor_rebuild.c moves the
 * generation onto another executor and rebuilds it there).
 */
#ifndef PX_RT_GENERATE_IMPL_H
#define PX_RT_GENERATE_IMPL_H

#include "rt/pipeline_impl.h"

/* A log entry that produced no token: a prefill chunk that did not finish
 * its prompt, or a prompt that finished with max_new_tokens 0. */
#define PX__RT_GEN_NONE (-1)

typedef struct px__rt_gen_seq {
    int32_t seq;
    int32_t *prompt;
    size_t n_prompt, n_fed;
    int64_t len; /* positions cached in the stages */
    int32_t last;
    uint32_t n_new;
    bool done, at_context;
    px_rt_sampler *sampler;
} px__rt_gen_seq;

/* One step of the log: entries [first, first + n) of the entry arrays. */
typedef struct px__rt_gen_log_step {
    size_t first;
    uint32_t n, rows;
    bool prefill;
} px__rt_gen_log_step;

typedef struct px__rt_gen_log {
    px__rt_gen_log_step *steps;
    size_t n_steps, cap_steps;
    uint32_t *prompt; /* per entry: the prompt index */
    int32_t *token;   /* per entry: the token sampled (EOS included), or PX__RT_GEN_NONE */
    size_t n_entries, cap_entries;
} px__rt_gen_log;

typedef struct px__rt_gen {
    px_rt_executor *ex;
    const px_rt_tokenizer *t;
    const px_rt_generate_opts *o;
    const px_rt_supervisor *sup; /* may be NULL */
    px_rt_pipeline_stats *st;
    uint32_t vocab, dim, context, max_rows, n_stages;
    px__rt_gen_seq *seqs;
    px__rt_step_seq *wire; /* the step's sequences as sent */
    uint32_t *step_of;     /* the step's prompt indices */
    uint32_t *pos, *n_tokens;
    uint32_t *kept;  /* per prompt, for rollback */
    int32_t *tokens; /* the step's tokens */
    float *logits;
    uint64_t t_start, phase_t0;
    bool first_token;
    /* Supervision. */
    px__rt_gen_log log;
    uint64_t index;      /* steps sent on the current executor */
    uint64_t tokens_out; /* tokens produced on the current executor */
    bool replay;         /* the current step is in the log */
    px_rt_step_obs obs;  /* the current step */
    bool audit_next;
    bool ring_error; /* the last failure was the ring's (recoverable) */
    bool ex_failed;  /* g->ex was already marked failed */
    px_rt_executor *switch_to;
    uint64_t keep_steps;
    bool restart;
    bool rebuilding; /* switched is due once the replay is over */
    px_rt_executor *before;
    px_rt_rebuild_info info;
    uint64_t rebuild_t0;
} px__rt_gen;

static inline bool px__rt_gen_is_stop(const px__rt_gen *g, int32_t tok)
{
    return !g->o->ignore_eos &&
           (tok == px_rt_tokenizer_eos(g->t) || tok == px_rt_tokenizer_bos(g->t));
}

/* Sequences join g->ex in the lowest free slots; a failure of the ring
 * sets g->ring_error (executor_generate.c). */
px_status px__rt_gen_join(px__rt_gen *g, px_err *err);
/* Sequences leave g->ex; the first failure ends it (executor_generate.c). */
px_status px__rt_gen_leave(px__rt_gen *g, px_err *err);
/* Puts sequence i back to before its prompt (executor_generate.c). */
px_status px__rt_gen_reset_seq(px__rt_gen *g, uint32_t i, px_err *err);

/* Ends a rebuild under way: `switched` hands the executor left back
 * (executor_rebuild.c). */
void px__rt_gen_finish_rebuild(px__rt_gen *g);
/* Continues on g->switch_to, rolling back to g->keep_steps first
 * (executor_rebuild.c). */
px_status px__rt_gen_switch_over(px__rt_gen *g, px_err *err);
/* Names the failure st of g->ex and asks the supervisor for a
 * replacement to rebuild on (executor_rebuild.c). */
px_status px__rt_gen_recover(px__rt_gen *g, px_status st, px_err *err);

#endif
