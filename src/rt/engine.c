/*
 * The generation engine's requests: taken in from any thread (an inbox
 * under a lock), moved into the engine's own state at each step, and
 * ended exactly once with their reason.  Scheduling is in engine_sched.c,
 * the steps in engine_step.c.
 */
#include "base/common.h"

#include <time.h>

#include "rt/engine_impl.h"

const char *px_rt_finish_name(px_rt_finish f)
{
    switch (f) {
    case PX_RT_FINISH_STOP:
        return "stop";
    case PX_RT_FINISH_LENGTH:
        return "length";
    case PX_RT_FINISH_CONTEXT:
        return "context";
    case PX_RT_FINISH_CANCELLED:
        return "cancelled";
    case PX_RT_FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

static px_status check_opts(const px_rt_engine_opts *o, px_err *err)
{
    if (!o || !!o->session == !!o->executor)
        return px_err_set(err, PX_EINVAL, "engine: give it a session or an executor (one of them)");
    if (!o->tokenizer)
        return px_err_set(err, PX_EINVAL, "engine: a tokenizer is required");
    if (o->session && (!o->session->has_embedding || !o->session->has_head))
        return px_err_set(err, PX_EINVAL,
                          "engine: the session holds layers [%u, %u) of %u; generation needs the "
                          "whole model",
                          o->session->layer_begin, o->session->layer_end,
                          o->session->model->hp.n_layers);
    if (o->session && o->supervisor)
        return px_err_set(err, PX_EINVAL,
                          "engine: a supervisor watches an executor, not a session");
    if (o->micro_batches > PX__RT_ENGINE_MAX_FLIGHTS)
        return px_err_set(err, PX_EINVAL, "engine: %u micro-batches in flight; at most %d",
                          o->micro_batches, PX__RT_ENGINE_MAX_FLIGHTS);
    return PX_OK;
}

px_status px_rt_engine_new(const px_rt_engine_opts *o, px_rt_engine **out, px_err *err)
{
    *out = NULL;
    px_status st = check_opts(o, err);
    if (st)
        return st;
    px_rt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return px_err_set(err, PX_ENOMEM, "engine: out of memory");
    e->o = *o;
    e->wait_fd = -2;
    e->t = o->tokenizer;
    e->sup = o->supervisor;
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((st = px__rt_runner_init(&e->run, o->session, o->executor, err)) != PX_OK)
        goto fail;
    const px_ir_hparams *hp =
        o->session ? &o->session->model->hp : px_rt_model_hparams(o->executor->model);
    e->vocab = hp->vocab_size;
    e->dim = hp->dim;
    if (px_rt_tokenizer_n_tokens(e->t) > e->vocab) {
        st = px_err_set(err, PX_EINVAL,
                        "engine: the tokenizer has %u tokens, the model only %u: they do not "
                        "belong together",
                        px_rt_tokenizer_n_tokens(e->t), e->vocab);
        goto fail;
    }
    e->max_running =
        o->max_running && o->max_running < e->run.max_seqs ? o->max_running : e->run.max_seqs;
    e->step_tokens =
        o->step_tokens && o->step_tokens < e->run.max_rows ? o->step_tokens : e->run.max_rows;
    e->max_waiting = o->max_waiting ? o->max_waiting : 1024;
    e->depth = px__rt_runner_depth(&e->run, o->micro_batches);
    e->max_entries = e->run.max_seqs;
    e->kv_free = e->run.kv_blocks;
    e->keep_steps = UINT64_MAX;
    e->running = calloc(e->max_running, sizeof *e->running);
    e->logits = malloc((size_t)e->vocab * sizeof *e->logits);
    e->lp = malloc((size_t)e->vocab * sizeof *e->lp);
    if (!e->running || !e->logits || !e->lp) {
        st = px_err_set(err, PX_ENOMEM, "engine: out of memory");
        goto fail;
    }
    if ((st = px__rt_engine_ensure_flights(e, e->depth, err)) != PX_OK)
        goto fail;
    e->m.kv_block_size = e->run.kv_block_size;
    e->m.kv_blocks = e->run.kv_blocks;
    if (o->stats) {
        memset(o->stats, 0, sizeof *o->stats);
        o->stats->n_stages = e->run.n_stages;
    }
    e->next_id = 1;
    e->t_start = px_now_ns();
    *out = e;
    return PX_OK;
fail:
    px_rt_engine_free(e);
    return st;
}

static void free_seq(px__rt_eseq *q)
{
    if (!q)
        return;
    px_rt_sampler_free(q->sampler);
    free(q->tokens);
    free(q->made_at);
    free(q);
}

void px_rt_engine_free(px_rt_engine *e)
{
    if (!e)
        return;
    px__rt_engine_take_inbox(e);
    /* Steps in flight are abandoned with their runner's owner. */
    for (uint32_t i = 0; i < e->max_running && e->running; i++)
        if (e->running[i]) {
            e->running[i]->in_flight = false;
            px__rt_engine_finish(e, e->running[i], PX_RT_FINISH_CANCELLED, NULL);
        }
    while (e->wait_head)
        px__rt_engine_finish(e, e->wait_head, PX_RT_FINISH_CANCELLED, NULL);
    for (uint32_t i = 0; i < PX__RT_ENGINE_MAX_FLIGHTS; i++) {
        px__rt_eflight *f = &e->flights[i];
        free(f->seq);
        free(f->ordinal);
        free(f->pos);
        free(f->n_tokens);
        free(f->wire);
        free(f->steps);
        free(f->tokens);
    }
    px__rt_runner_release(&e->run);
    px__rt_thread_wait_close(&e->wait_fd);
    free(e->running);
    free(e->logits);
    free(e->lp);
    free(e->cancels);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* ------------------------------------------------------------------ */
/* Taking requests in                                                  */
/* ------------------------------------------------------------------ */

static px_status check_request(const px_rt_engine *e, const px_rt_request *r, px_err *err)
{
    if (!r || !r->prompt || r->n_prompt == 0)
        return px_err_set(err, PX_EINVAL, "request: the prompt is empty");
    for (uint32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= e->vocab)
            return px_err_set(err, PX_EINVAL,
                              "request: prompt[%u] is token %d, outside the vocabulary [0, %u)", i,
                              r->prompt[i], e->vocab);
    if (r->n_prompt > e->run.context)
        return px_err_set(err, PX_ELIMIT,
                          "request: the prompt is %u tokens long; the context holds %u: shorten "
                          "it",
                          r->n_prompt, e->run.context);
    uint32_t need = px_rt_kv_blocks_for(
        PX_MIN(r->n_prompt + (r->max_new_tokens ? 1 : 0), e->run.context), e->run.kv_block_size);
    if (need > e->run.kv_blocks)
        return px_err_set(err, PX_ELIMIT,
                          "request: the prompt needs %u KV-cache blocks of %u positions; the "
                          "cache has %u in all: shorten it, or give the cache more blocks",
                          need, e->run.kv_block_size, e->run.kv_blocks);
    if (r->n_stop_tokens > PX__RT_ENGINE_MAX_STOP || (r->n_stop_tokens && !r->stop_tokens))
        return px_err_set(err, PX_EINVAL, "request: %u stop tokens; at most %d", r->n_stop_tokens,
                          PX__RT_ENGINE_MAX_STOP);
    if (r->top_logprobs > PX_RT_MAX_LOGPROBS)
        return px_err_set(err, PX_EINVAL, "request: top_logprobs %u; at most %d", r->top_logprobs,
                          PX_RT_MAX_LOGPROBS);
    return PX_OK;
}

px_status px_rt_engine_submit(px_rt_engine *e, const px_rt_request *r, uint64_t *id, px_err *err)
{
    px_status st = check_request(e, r, err);
    if (st)
        return st;
    px__rt_eseq *q = calloc(1, sizeof *q);
    if (!q)
        return px_err_set(err, PX_ENOMEM, "engine: out of memory");
    q->r = *r;
    uint64_t most = (uint64_t)r->n_prompt + (r->max_new_tokens == UINT32_MAX
                                                 ? e->run.context
                                                 : PX_MIN(r->max_new_tokens, e->run.context));
    q->cap = (uint32_t)PX_MIN(most + 1, (uint64_t)e->run.context + 2);
    q->tokens = malloc((size_t)q->cap * sizeof *q->tokens);
    q->made_at = malloc((size_t)q->cap * sizeof *q->made_at);
    if (!q->tokens || !q->made_at) {
        free_seq(q);
        return px_err_set(err, PX_ENOMEM, "engine: out of memory");
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    q->n_prompt = q->n_tokens = r->n_prompt;
    if (r->n_stop_tokens)
        memcpy(q->stop, r->stop_tokens, (size_t)r->n_stop_tokens * sizeof *q->stop);
    q->r.prompt = q->tokens;
    q->r.stop_tokens = q->stop;
    q->slot = -1;
    q->st.prompt_tokens = r->n_prompt;
    if ((st = px_rt_sampler_new(e->vocab, &r->sampling, &q->sampler, err)) != PX_OK) {
        free_seq(q);
        return st;
    }
    q->t_submit = px_now_ns();
    pthread_mutex_lock(&e->mu);
    if (e->failed) {
        pthread_mutex_unlock(&e->mu);
        free_seq(q);
        return px_err_set(err, PX_ESTATE, "engine: it failed before and takes no more requests");
    }
    if (e->n_queued >= e->max_waiting) {
        e->m.rejected++;
        uint32_t n = e->n_queued;
        pthread_mutex_unlock(&e->mu);
        free_seq(q);
        return px_err_set(err, PX_ELIMIT,
                          "engine: %u requests are already waiting (the queue's bound): try "
                          "again later",
                          n);
    }
    q->id = e->next_id++;
    q->ordinal = e->next_ordinal++;
    if (e->inbox_tail)
        e->inbox_tail->next = q;
    else
        e->inbox_head = q;
    e->inbox_tail = q;
    e->n_inbox++;
    e->n_queued++;
    e->m.submitted++;
    *id = q->id;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return PX_OK;
}

void px_rt_engine_cancel(px_rt_engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels == e->cap_cancels) {
        size_t cap = e->cap_cancels ? 2 * e->cap_cancels : 16;
        uint64_t *c = realloc(e->cancels, cap * sizeof *c);
        if (!c) {
            /* The request runs to its end: the caller ignores its tokens. */
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->cancels = c;
        e->cap_cancels = cap;
    }
    e->cancels[e->n_cancels++] = id;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void mark_cancelled(px_rt_engine *e, uint64_t id)
{
    for (uint32_t i = 0; i < e->max_running; i++)
        if (e->running[i] && e->running[i]->id == id) {
            e->running[i]->cancel = true;
            return;
        }
    for (px__rt_eseq *q = e->wait_head; q; q = q->next)
        if (q->id == id) {
            q->cancel = true;
            return;
        }
}

void px__rt_engine_take_inbox(px_rt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    px__rt_eseq *in = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    e->n_waiting += e->n_inbox;
    e->n_inbox = 0;
    size_t n_cancels = e->n_cancels;
    uint64_t *cancels = e->cancels;
    e->cancels = NULL;
    e->n_cancels = e->cap_cancels = 0;
    pthread_mutex_unlock(&e->mu);
    if (in) {
        if (e->wait_tail)
            e->wait_tail->next = in;
        else
            e->wait_head = in;
        while (in->next)
            in = in->next;
        e->wait_tail = in;
    }
    for (size_t i = 0; i < n_cancels; i++)
        mark_cancelled(e, cancels[i]);
    free(cancels);
}

/* ------------------------------------------------------------------ */
/* Letting requests go                                                 */
/* ------------------------------------------------------------------ */

static void unlink_waiting(px_rt_engine *e, px__rt_eseq *q)
{
    px__rt_eseq *prev = NULL;
    for (px__rt_eseq *p = e->wait_head; p; prev = p, p = p->next)
        if (p == q) {
            if (prev)
                prev->next = q->next;
            else
                e->wait_head = q->next;
            if (e->wait_tail == q)
                e->wait_tail = prev;
            q->next = NULL;
            e->n_waiting--;
            if (!q->admitted_once) {
                pthread_mutex_lock(&e->mu);
                e->n_queued--;
                pthread_mutex_unlock(&e->mu);
            }
            return;
        }
}

void px__rt_engine_finish(px_rt_engine *e, px__rt_eseq *q, px_rt_finish why, const px_err *err)
{
    PX_ASSERT(!q->in_flight);
    if (q->running) {
        for (uint32_t i = 0; i < e->max_running; i++)
            if (e->running[i] == q) {
                e->running[i] = NULL;
                e->n_running--;
            }
        q->running = false;
    } else {
        unlink_waiting(e, q);
    }
    if (q->slot >= 0) {
        px_err ignored;
        /* A runner that cannot take the removal has failed; the next step
         * finds it. */
        (void)px__rt_runner_remove(&e->run, q->slot, &ignored);
        q->slot = -1;
    }
    e->kv_free += q->blocks;
    q->blocks = 0;
    if (q->rebuild_to) {
        q->rebuild_to = 0;
        e->n_rebuilding--;
    }
    q->st.new_tokens = q->n_new;
    q->st.total_ns = px_now_ns() - q->t_submit;
    pthread_mutex_lock(&e->mu);
    e->m.finished++;
    if (why == PX_RT_FINISH_CANCELLED)
        e->m.cancelled++;
    if (why == PX_RT_FINISH_ERROR)
        e->m.failed++;
    pthread_mutex_unlock(&e->mu);
    if (q->r.on_finish)
        q->r.on_finish(q->r.ud, q->id, why, &q->st, why == PX_RT_FINISH_ERROR ? err : NULL);
    free_seq(q);
}

void px__rt_engine_publish(px_rt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->m.running = e->n_running;
    e->m.waiting = e->n_waiting + e->n_inbox;
    e->m.in_flight = e->fl_count;
    e->m.kv_blocks = e->run.kv_blocks;
    e->m.kv_block_size = e->run.kv_block_size;
    e->m.kv_blocks_used = e->run.kv_blocks - e->kv_free;
    pthread_mutex_unlock(&e->mu);
}

void px_rt_engine_metrics_get(px_rt_engine *e, px_rt_engine_metrics *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->m;
    pthread_mutex_unlock(&e->mu);
}

void px_rt_engine_decode_timing_get(px_rt_engine *e,
                                    px_rt_engine_decode_timing out[PX_RT_ENGINE_ROW_CLASSES])
{
    pthread_mutex_lock(&e->mu);
    memcpy(out, e->by_rows, sizeof e->by_rows);
    pthread_mutex_unlock(&e->mu);
}

void px_rt_engine_wait(px_rt_engine *e, int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mu);
    if (!e->inbox_head && !e->n_cancels && !e->m.running && !e->m.waiting)
        pthread_cond_timedwait(&e->cv, &e->mu, &dl);
    pthread_mutex_unlock(&e->mu);
}

void px_rt_engine_wake(px_rt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

px_rt_executor *px_rt_engine_executor(const px_rt_engine *e)
{
    return e->run.ex;
}
