/*
 * Moving a generation onto another executor: after a failure (the
 * supervisor's replacement) or on the supervisor's word (switch_to, with
 * an optional rollback).  The sequences start again on the new executor
 * and the generation's loops replay the log there (executor_generate.c).
 */
#include "base/common.h"

#include "rt/generate_impl.h"

/* Ends a rebuild: the replay is over (or the executor is left again). */
void px__rt_gen_finish_rebuild(px__rt_gen *g)
{
    if (!g->rebuilding)
        return;
    g->rebuilding = false;
    g->info.ns = px_now_ns() - g->rebuild_t0;
    g->phase_t0 = px_now_ns();
    px_rt_executor *before = g->before;
    g->before = NULL;
    if (g->sup && g->sup->switched)
        g->sup->switched(g->sup->ud, before, g->ex, &g->info);
}

/* Moves the generation onto `next` and starts rebuilding it: the
 * sequences are reset and re-added there; the loops then replay the log.
 * The executor left is handed back through `switched` once the replay is
 * over. */
static px_status begin_rebuild(px__rt_gen *g, px_rt_executor *next, px_err *err)
{
    uint32_t max_seqs, ctx, rows;
    if (!next || px__rt_exec_failed(next))
        return px_err_set(err, PX_EINVAL,
                          "generate: the executor to continue on is %s; hand over a running one",
                          next ? "failed" : "missing");
    px__rt_exec_limits(next, &max_seqs, &ctx, &rows);
    const px_ir_hparams *hp = px_rt_model_hparams(px__rt_exec_model(next));
    if (hp->vocab_size != g->vocab || hp->dim != g->dim || max_seqs < g->o->n_prompts ||
        ctx < g->context || rows < g->max_rows)
        return px_err_set(err, PX_EINVAL,
                          "generate: the executor to continue on runs a model of vocabulary "
                          "%u, width %u, with %u sequences, context %u and %u rows a step; the "
                          "generation needs %u, %u, at least %u, %u and %u: give it the same "
                          "model and limits",
                          hp->vocab_size, hp->dim, max_seqs, ctx, rows, g->vocab, g->dim,
                          g->o->n_prompts, g->context, g->max_rows);
    /* A rebuild still under way is over: every executor left is handed
     * back exactly once. */
    px__rt_gen_finish_rebuild(g);
    g->before = g->ex;
    g->ex = next;
    g->ex_failed = false;
    g->ring_error = false;
    g->rebuilding = true;
    g->rebuild_t0 = px_now_ns();
    g->info = (px_rt_rebuild_info){.identical = true};
    /* The stats describe the stages of the executor in use. */
    px_rt_pipeline_stats_release(g->st);
    memset(g->st->stages, 0, sizeof g->st->stages);
    g->st->xfer_out_prefill_ns = g->st->xfer_out_decode_ns = 0;
    g->n_stages = g->st->n_stages = px__rt_exec_spec(next)->n_stages;
    g->index = 0;
    g->tokens_out = 0;
    for (uint32_t i = 0; i < g->o->n_prompts; i++) {
        px_status st = px__rt_gen_reset_seq(g, i, err);
        if (st)
            return st;
    }
    return px__rt_gen_join(g, err);
}

/* Takes back the steps from `keep` on: the tokens they produced are
 * retracted and unbooked. */
static void roll_back(px__rt_gen *g, uint64_t keep, uint64_t *steps, uint64_t *tokens)
{
    px__rt_gen_log *l = &g->log;
    uint32_t n = g->o->n_prompts;
    uint32_t *kept = g->kept, *total = g->kept + n;
    memset(g->kept, 0, 2 * (size_t)n * sizeof *g->kept);
    *steps = *tokens = 0;
    for (size_t s = 0; s < l->n_steps; s++) {
        const px__rt_gen_log_step *ls = &l->steps[s];
        for (uint32_t j = 0; j < ls->n; j++) {
            int32_t tok = l->token[ls->first + j];
            if (tok == PX__RT_GEN_NONE || px__rt_gen_is_stop(g, tok))
                continue;
            uint32_t i = l->prompt[ls->first + j];
            total[i]++;
            if (s < keep) {
                kept[i]++;
                continue;
            }
            (*tokens)++;
            g->st->gen.new_tokens--;
            if (!ls->prefill)
                g->st->gen.decode_tokens--;
        }
        if (s < keep)
            continue;
        (*steps)++;
        if (ls->prefill)
            g->st->gen.prompt_tokens -= ls->rows;
        else
            g->st->decode_steps--;
    }
    l->n_steps = keep;
    l->n_entries = keep ? l->steps[keep - 1].first + l->steps[keep - 1].n : 0;
    if (g->sup->retracted)
        for (uint32_t i = 0; i < n; i++)
            if (kept[i] < total[i])
                g->sup->retracted(g->sup->ud, i, kept[i]);
}

/* The supervisor asked to continue on g->switch_to (the old executor
 * still works): roll back if asked, let the sequences leave the old one,
 * and rebuild on the new one. */
px_status px__rt_gen_switch_over(px__rt_gen *g, px_err *err)
{
    px_rt_executor *next = g->switch_to;
    uint64_t keep = g->keep_steps, steps = 0, tokens = 0;
    g->restart = false;
    g->switch_to = NULL;
    if (keep < g->log.n_steps)
        roll_back(g, keep, &steps, &tokens);
    px_err ignored;
    px_status st = px__rt_gen_leave(g, &ignored);
    if (st) {
        (void)px__rt_exec_fail(g->ex, st, &ignored);
        g->ex_failed = true;
    }
    if ((st = begin_rebuild(g, next, err)))
        return st;
    g->info.steps_dropped = steps;
    g->info.tokens_dropped = tokens;
    return PX_OK;
}

/* A step (or a sequence joining) failed on g->ex with st: the failure is
 * named, and the supervisor may hand over a replacement. */
px_status px__rt_gen_recover(px__rt_gen *g, px_status st, px_err *err)
{
    st = px__rt_exec_fail(g->ex, st, err);
    g->ex_failed = true;
    px_err why = {.code = st};
    if (err)
        why = *err;
    px_rt_executor *next = NULL;
    px_err rerr = {0};
    px_status rs = g->sup->recover(g->sup->ud, g->ex, st, &why, &next, &rerr);
    if (rs != PX_OK) {
        if (rs != st)
            px_err_set(err, rs, "%s", rerr.msg[0] ? rerr.msg : "generate: recovery failed");
        return rs;
    }
    return begin_rebuild(g, next, err);
}
