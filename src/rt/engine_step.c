/*
 * The engine's loop: steps are built (engine_sched.c) and sent until as
 * many as the runner overlaps are in flight, then the oldest one's result
 * is taken back and its tokens produced: sampled, checked against the end
 * tokens and the request's limits, handed to the request, and the request
 * ended when it is done.
 *
 * A supervisor (healing) sees every step before it is sent and after its
 * tokens are produced, with the stages' timings.  When a step fails on
 * the ring, the supervisor may hand over a replacement executor; the
 * supervisor may also ask to move to another executor while the current
 * one works, optionally taking back the tokens of the last steps
 * (rollback after silent corruption).  Either way every running sequence
 * is prefilled again on the new executor with the tokens it has, which
 * rebuilds its KV cache bit for bit (rows never depend on their step),
 * and the logits that produced its last token are checked to come out
 * the same.
 */
#include "base/common.h"

#include "rt/engine_impl.h"

static bool is_stop(const px_rt_engine *e, const px__rt_eseq *q, int32_t tok)
{
    if (!q->r.ignore_eos && (tok == px_rt_tokenizer_eos(e->t) || tok == px_rt_tokenizer_bos(e->t)))
        return true;
    for (uint32_t i = 0; i < q->r.n_stop_tokens; i++)
        if (q->stop[i] == tok)
            return true;
    return false;
}

/* ------------------------------------------------------------------ */
/* Failing and rebuilding                                              */
/* ------------------------------------------------------------------ */

/* Ends every request with the error; the engine takes no more. */
static px_status fail_all(px_rt_engine *e, px_status st, px_err *err)
{
    pthread_mutex_lock(&e->mu);
    e->failed = true;
    pthread_mutex_unlock(&e->mu);
    px__rt_engine_take_inbox(e);
    px_err why = {.code = st};
    if (err)
        why = *err;
    for (uint32_t i = 0; i < e->fl_count; i++) {
        px__rt_eflight *f = &e->flights[(e->fl_head + i) % e->depth];
        for (uint32_t j = 0; j < f->n; j++)
            f->seq[j]->in_flight = false;
    }
    e->fl_count = 0;
    /* A failed ring takes no more frames: the slots simply go. */
    if (e->run.ex && e->run.ex->failed)
        for (uint32_t i = 0; i < e->run.max_seqs; i++)
            e->run.slot_used[i] = false;
    for (uint32_t i = 0; i < e->max_running; i++)
        if (e->running[i]) {
            e->running[i]->slot = -1;
            px__rt_engine_finish(e, e->running[i], PX_RT_FINISH_ERROR, &why);
        }
    while (e->wait_head)
        px__rt_engine_finish(e, e->wait_head, PX_RT_FINISH_ERROR, &why);
    px__rt_engine_publish(e);
    return st;
}

static void finish_rebuild(px_rt_engine *e)
{
    e->info.ns = px_now_ns() - e->rebuild_t0;
    e->rebuild_t0 = 0;
    px_rt_executor *before = e->before;
    e->before = NULL;
    if (e->sup && e->sup->switched)
        e->sup->switched(e->sup->ud, before, e->run.ex, &e->info);
    e->info.ns = 0;
}

static px_status check_replacement(const px_rt_engine *e, px_rt_executor *next, px_err *err)
{
    if (!next || next->failed)
        return px_err_set(err, PX_EINVAL,
                          "generate: the executor to continue on is %s; hand over a running one",
                          next ? "failed" : "missing");
    const px_ir_hparams *hp = px_rt_model_hparams(next->model);
    if (hp->vocab_size != e->vocab || hp->dim != e->dim || next->max_seqs < e->n_running ||
        next->context < e->run.context)
        return px_err_set(err, PX_EINVAL,
                          "generate: the executor to continue on runs a model of vocabulary "
                          "%u, width %u, with %u sequences and context %u; the generation needs "
                          "%u, %u, at least %u and %u: give it the same model and limits",
                          hp->vocab_size, hp->dim, next->max_seqs, next->context, e->vocab, e->dim,
                          e->n_running, e->run.context);
    return PX_OK;
}

px_status px__rt_engine_ensure_flights(px_rt_engine *e, uint32_t depth, px_err *err)
{
    uint32_t n = e->max_entries, rows = PX_MAX(e->run.max_rows, n);
    for (uint32_t i = 0; i < depth; i++) {
        px__rt_eflight *f = &e->flights[i];
        if (f->seq)
            continue;
        f->seq = calloc(n, sizeof *f->seq);
        f->ordinal = calloc(n, sizeof *f->ordinal);
        f->pos = calloc(n, sizeof *f->pos);
        f->n_tokens = calloc(n, sizeof *f->n_tokens);
        f->wire = calloc(n, sizeof *f->wire);
        f->steps = calloc(n, sizeof *f->steps);
        f->tokens = calloc(rows, sizeof *f->tokens);
        if (!f->seq || !f->ordinal || !f->pos || !f->n_tokens || !f->wire || !f->steps ||
            !f->tokens)
            return px_err_set(err, PX_ENOMEM, "engine: out of memory");
    }
    return PX_OK;
}

px_status px__rt_engine_rebuild(px_rt_engine *e, px_rt_executor *next, px_err *err)
{
    px_status st = check_replacement(e, next, err);
    if (st)
        return st;
    /* A rebuild still under way is over: every executor left is handed
     * back exactly once. */
    if (e->rebuild_t0)
        finish_rebuild(e);
    px__rt_runner old = e->run;
    for (uint32_t i = 0; i < e->max_running; i++)
        if (e->running[i])
            e->running[i]->slot = -1;
    if (old.ex && old.ex->failed)
        for (uint32_t i = 0; i < old.max_seqs; i++)
            old.slot_used[i] = false;
    if ((st = px__rt_runner_init(&e->run, NULL, next, err)) != PX_OK)
        return st;
    e->before = old.ex;
    uint32_t old_rows = PX_MAX(old.max_rows, e->max_entries);
    e->max_running = PX_MIN(e->max_running, e->run.max_seqs);
    e->max_entries = PX_MIN(e->max_entries, e->run.max_seqs);
    e->step_tokens = PX_MIN(e->step_tokens, PX_MIN(e->run.max_rows, old_rows));
    e->depth = px__rt_runner_depth(&e->run, e->o.micro_batches);
    if ((st = px__rt_engine_ensure_flights(e, e->depth, err)) != PX_OK)
        return st;
    e->fl_head = e->fl_count = 0;
    e->kv_free = e->run.kv_blocks;
    e->info = (px_rt_rebuild_info){.identical = true};
    e->rebuild_t0 = px_now_ns();
    e->n_rebuilding = 0;
    if (e->o.stats) {
        px_rt_pipeline_stats_release(e->o.stats);
        memset(e->o.stats->stages, 0, sizeof e->o.stats->stages);
        e->o.stats->xfer_out_prefill_ns = e->o.stats->xfer_out_decode_ns = 0;
        e->o.stats->n_stages = e->run.n_stages;
    }
    /* Every running sequence waits to be prefilled again, in the order it
     * came, ahead of the requests never admitted. */
    for (;;) {
        px__rt_eseq *q = NULL;
        for (uint32_t i = 0; i < e->max_running; i++)
            if (e->running[i] && (!q || e->running[i]->ordinal > q->ordinal))
                q = e->running[i];
        if (!q)
            break;
        if (q->n_cached > 0) {
            q->rebuild_to = q->n_cached;
            q->verify_at = q->n_new > 0 && q->n_cached + 1 == q->n_tokens ? q->n_cached : 0;
            e->n_rebuilding++;
        }
        q->blocks = 0;
        if ((st = px__rt_engine_requeue(e, q, err)) != PX_OK)
            return st;
    }
    pthread_mutex_lock(&e->mu);
    e->m.recoveries++;
    pthread_mutex_unlock(&e->mu);
    if (e->n_rebuilding == 0)
        finish_rebuild(e);
    return PX_OK;
}

/* A step failed on the ring: the stage to blame is named, and a
 * supervisor may hand over a replacement to rebuild on. */
static px_status recover(px_rt_engine *e, px_status st, px_err *err)
{
    if (e->run.s)
        return fail_all(e, st, err);
    px_rt_executor *ex = e->run.ex;
    if (!ex->failed)
        st = px__rt_exec_fail(ex, st, err);
    for (uint32_t i = 0; i < e->fl_count; i++) {
        px__rt_eflight *f = &e->flights[(e->fl_head + i) % e->depth];
        for (uint32_t j = 0; j < f->n; j++)
            f->seq[j]->in_flight = false;
    }
    e->fl_count = 0;
    if (!e->sup || !e->sup->recover)
        return fail_all(e, st, err);
    /* A switch asked for and not made yet is superseded by the recovery:
     * the supervisor decides anew, knowing what failed (the executor it
     * asked for stays its own; px_rt_supervisor). */
    e->switch_to = NULL;
    e->keep_steps = UINT64_MAX;
    px_err why = {.code = st};
    if (err)
        why = *err;
    px_rt_executor *next = NULL;
    px_err rerr = {0};
    px_status rs = e->sup->recover(e->sup->ud, ex, st, &why, &next, &rerr);
    if (rs != PX_OK) {
        if (rs != st)
            px_err_set(err, rs, "%s", rerr.msg[0] ? rerr.msg : "generate: recovery failed");
        return fail_all(e, rs, err);
    }
    if ((rs = px__rt_engine_rebuild(e, next, err)) != PX_OK)
        return fail_all(e, rs, err);
    return PX_OK;
}

/* Takes back every token produced at step keep or later. */
static void roll_back(px_rt_engine *e, uint64_t keep)
{
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < e->max_running; i++) {
        px__rt_eseq *q = e->running[i];
        if (!q)
            continue;
        uint32_t kept = q->n_new;
        while (kept > 0 && q->made_at[q->n_prompt + kept - 1] >= keep)
            kept--;
        if (kept == q->n_new)
            continue;
        uint32_t dropped = q->n_new - kept;
        tokens += dropped;
        q->n_new = kept;
        q->n_tokens = q->n_prompt + kept;
        if (q->n_cached > q->n_tokens)
            q->n_cached = q->n_tokens;
        e->tokens_out -= dropped;
        if (e->o.stats)
            e->o.stats->gen.new_tokens -= dropped;
        px__rt_sampler_rewind(q->sampler, kept);
        if (q->r.on_retract)
            q->r.on_retract(q->r.ud, q->id, kept);
        if (e->sup && e->sup->retracted)
            e->sup->retracted(e->sup->ud, q->ordinal, kept);
    }
    e->info.steps_dropped = e->index > keep ? e->index - keep : 0;
    e->info.tokens_dropped = tokens;
}

/* The supervisor asked to continue on e->switch_to (the current executor
 * still works); no step is in flight. */
static px_status switch_over(px_rt_engine *e, px_err *err)
{
    px_rt_executor *next = e->switch_to;
    uint64_t keep = e->keep_steps;
    e->switch_to = NULL;
    e->keep_steps = UINT64_MAX;
    px_status st = check_replacement(e, next, err);
    if (st)
        return st;
    /* The sequences leave the executor left behind. */
    for (uint32_t i = 0; i < e->max_running; i++) {
        px__rt_eseq *q = e->running[i];
        if (q && q->slot >= 0) {
            px_err ignored;
            (void)px__rt_runner_remove(&e->run, q->slot, &ignored);
            q->slot = -1;
        }
    }
    uint64_t steps = 0, tokens = 0;
    if (keep != UINT64_MAX) {
        roll_back(e, keep);
        steps = e->info.steps_dropped;
        tokens = e->info.tokens_dropped;
    }
    if ((st = px__rt_engine_rebuild(e, next, err)) != PX_OK)
        return st;
    e->info.steps_dropped = steps;
    e->info.tokens_dropped = tokens;
    /* A stage may run on another device now: its steps by rows start
     * again, so that each class describes one set of devices. */
    pthread_mutex_lock(&e->mu);
    memset(e->by_rows, 0, sizeof e->by_rows);
    pthread_mutex_unlock(&e->mu);
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Producing tokens                                                    */
/* ------------------------------------------------------------------ */

/* ln softmax of a row of logits into e->lp, and the top n alternatives. */
static void logprobs(px_rt_engine *e, const float *row, px_rt_token_event *ev, int32_t tok,
                     uint32_t n_top)
{
    float max = row[0];
    for (uint32_t i = 1; i < e->vocab; i++)
        max = row[i] > max ? row[i] : max;
    double sum = 0;
    for (uint32_t i = 0; i < e->vocab; i++)
        sum += exp((double)row[i] - max);
    double lse = (double)max + log(sum);
    ev->logprob = (float)((double)row[tok] - lse);
    ev->n_top = 0;
    for (uint32_t k = 0; k < n_top && k < e->vocab; k++) {
        int32_t best = -1;
        for (uint32_t i = 0; i < e->vocab; i++) {
            bool taken = false;
            for (uint32_t j = 0; j < k && !taken; j++)
                taken = ev->top_token[j] == (int32_t)i;
            if (!taken && (best < 0 || row[i] > row[best]))
                best = (int32_t)i;
        }
        ev->top_token[k] = best;
        ev->top_logprob[k] = (float)((double)row[best] - lse);
        ev->n_top++;
    }
}

/* Entry j of step f was run: its sequence moves on and, when it fed every
 * token it had, produces the next one. */
static px_status produce(px_rt_engine *e, px__rt_eflight *f, uint32_t j, const float *row,
                         px_err *err)
{
    px__rt_eseq *q = f->seq[j];
    uint32_t fed_before = q->n_cached;
    q->in_flight = false;
    q->n_cached += f->n_tokens[j];
    if (q->rebuild_to) {
        e->info.tokens_replayed += f->n_tokens[j];
        if (q->verify_at && q->n_cached == q->verify_at) {
            uint32_t crc = px_rt_crc32(0, row, (size_t)e->vocab * sizeof(float));
            if (crc != q->last_crc && e->info.identical) {
                e->info.identical = false;
                e->info.first_mismatch_step = f->index;
            }
            q->verify_at = 0;
        }
        if (q->n_cached >= q->rebuild_to) {
            q->rebuild_to = 0;
            e->n_rebuilding--;
        }
    } else if (fed_before < q->n_prompt) {
        uint32_t n = PX_MIN(q->n_cached, q->n_prompt) - fed_before;
        pthread_mutex_lock(&e->mu);
        e->m.prompt_tokens += n;
        pthread_mutex_unlock(&e->mu);
        if (e->o.stats)
            e->o.stats->gen.prompt_tokens += n;
    }
    if (q->n_cached < q->n_tokens || q->cancel)
        return PX_OK;
    if (q->n_new >= q->r.max_new_tokens) {
        px__rt_engine_finish(e, q, PX_RT_FINISH_LENGTH, NULL);
        return PX_OK;
    }
    memcpy(e->logits, row, (size_t)e->vocab * sizeof(float));
    int32_t tok = px_rt_sampler_sample(q->sampler, e->logits);
    if (is_stop(e, q, tok)) {
        px__rt_engine_finish(e, q, PX_RT_FINISH_STOP, NULL);
        return PX_OK;
    }
    q->last_crc = px_rt_crc32(0, row, (size_t)e->vocab * sizeof(float));
    px_rt_token_event ev = {.id = q->id, .index = q->n_new, .token = tok, .logprob = NAN};
    if (q->r.logprobs || q->r.top_logprobs)
        logprobs(e, row, &ev, tok, q->r.top_logprobs);
    q->tokens[q->n_tokens] = tok;
    q->made_at[q->n_tokens] = f->index;
    q->n_tokens++;
    q->n_new++;
    e->tokens_out++;
    pthread_mutex_lock(&e->mu);
    e->m.new_tokens++;
    pthread_mutex_unlock(&e->mu);
    if (e->o.stats) {
        e->o.stats->gen.new_tokens++;
        if (!f->prefill)
            e->o.stats->gen.decode_tokens++;
    }
    uint64_t now = px_now_ns();
    if (q->n_new == 1)
        q->st.ttft_ns = now - q->t_submit;
    if (!e->first_token) {
        e->first_token = true;
        if (e->o.stats)
            e->o.stats->ttft_ns = now - e->t_start;
    }
    if ((uint32_t)tok < px_rt_tokenizer_n_tokens(e->t)) {
        px_status st =
            px_rt_tokenizer_decode(e->t, q->tokens[q->n_tokens - 2], tok, &ev.piece, &ev.len, err);
        if (st)
            return st;
    }
    bool go_on = q->r.on_token ? q->r.on_token(q->r.ud, &ev) : true;
    if (!go_on)
        px__rt_engine_finish(e, q, PX_RT_FINISH_STOP, NULL);
    else if (q->n_new >= q->r.max_new_tokens)
        px__rt_engine_finish(e, q, PX_RT_FINISH_LENGTH, NULL);
    else if (q->n_cached >= e->run.context) {
        if (e->o.stats)
            e->o.stats->gen.n_stopped_at_context++;
        px__rt_engine_finish(e, q, PX_RT_FINISH_CONTEXT, NULL);
    }
    return PX_OK;
}

/* The step's shape as the supervisor sees it. */
static void describe(px_rt_engine *e, const px__rt_eflight *f)
{
    memset(&e->obs, 0, sizeof e->obs);
    px_rt_step_obs *ob = &e->obs;
    ob->index = f->index;
    ob->prefill = f->prefill;
    ob->replay = f->replay;
    ob->n_seqs = f->n;
    ob->n_rows = f->rows;
    ob->prompt = f->ordinal;
    ob->pos = f->pos;
    ob->n_tokens = f->n_tokens;
    ob->tokens = f->tokens;
    ob->tokens_out = e->tokens_out;
    ob->n_stages = e->run.n_stages;
    ob->vocab = e->vocab;
}

/* Whether a failure is the ring's (a replacement may continue). */
static bool ring_error(const px_rt_engine *e, px_status st)
{
    return e->run.ex && st != PX_ENOMEM && st != PX_EINVAL;
}

/* Builds and sends steps until `depth` are in flight. */
static px_status send_steps(px_rt_engine *e, px_err *err)
{
    while (!e->switch_to && e->fl_count < e->depth) {
        px__rt_eflight *f = &e->flights[(e->fl_head + e->fl_count) % e->depth];
        px_status st = px__rt_engine_build(e, f, err);
        if (st == PX_OK && f->n == 0)
            return PX_OK;
        if (st == PX_OK) {
            f->index = e->index++;
            f->audit = e->run.ex && e->audit_next;
            e->audit_next = false;
            describe(e, f);
            if (!f->replay && e->sup && e->sup->before_step &&
                (st = e->sup->before_step(e->sup->ud, e->run.ex, &e->obs, err)) != PX_OK) {
                for (uint32_t j = 0; j < f->n; j++)
                    f->seq[j]->in_flight = false;
                return fail_all(e, st, err);
            }
            if ((st = px__rt_runner_submit(e, f, err)) == PX_OK) {
                e->fl_count++;
                e->rows_sent += f->rows;
                e->decode_steps += !f->prefill;
                e->decode_rows += f->prefill ? 0 : f->rows;
                continue;
            }
            for (uint32_t j = 0; j < f->n; j++)
                f->seq[j]->in_flight = false;
        }
        if (!ring_error(e, st))
            return fail_all(e, st, err);
        return recover(e, st, err);
    }
    return PX_OK;
}

/* Books where a step's time went (px_rt_engine_metrics: the stages'
 * records in e->obs, and the engine thread's work since its last result
 * and its wait for this one, from t_wait to t_got, with its wait for a
 * core read at each). */
static void book_timing(px_rt_engine *e, uint64_t t_wait, uint64_t core_wait, uint64_t t_got,
                        uint64_t core_got)
{
    const px_rt_step_obs *ob = &e->obs;
    uint32_t n = PX_MIN(ob->n_stages, (uint32_t)PX_RT_MAX_STAGES);
    uint64_t context = 0;
    for (uint32_t i = 0; ob->pos && ob->n_tokens && i < ob->n_seqs; i++)
        context += (uint64_t)ob->pos[i] + ob->n_tokens[i];
    pthread_mutex_lock(&e->mu);
    px_rt_engine_metrics *m = &e->m;
    if (m->n_stages != n) {
        /* Another executor with other stages: the sums start again. */
        memset(m->stage_compute_ns, 0, sizeof m->stage_compute_ns);
        memset(m->stage_wait_ns, 0, sizeof m->stage_wait_ns);
        memset(m->hop_ns, 0, sizeof m->hop_ns);
        memset(m->hop_wait_ns, 0, sizeof m->hop_wait_ns);
        memset(e->by_rows, 0, sizeof e->by_rows);
        m->n_stages = n;
    }
    if (!ob->prefill && ob->n_rows > 0) {
        uint32_t c = 0;
        while (c + 1 < PX_RT_ENGINE_ROW_CLASSES && ob->n_rows >> (c + 1))
            c++;
        px_rt_engine_decode_timing *d = &e->by_rows[c];
        d->steps++;
        d->rows += ob->n_rows;
        d->context += context;
        for (uint32_t i = 0; i < n; i++) {
            d->compute_ns[i] += ob->compute_ns[i];
            d->wait_ns[i] += ob->wait_ns[i];
            d->hop_ns[i] += ob->xfer_in_ns[i];
        }
        d->hop_ns[n] += ob->xfer_out_ns;
    }
    m->timed_steps++;
    m->timed_rows += ob->n_rows;
    m->timed_context += context;
    for (uint32_t i = 0; i < n; i++) {
        m->stage_compute_ns[i] += ob->compute_ns[i];
        m->stage_wait_ns[i] += ob->wait_ns[i];
        m->hop_ns[i] += ob->xfer_in_ns[i];
        m->hop_wait_ns[i] += ob->xfer_wait_ns[i];
    }
    m->hop_ns[n] += ob->xfer_out_ns;
    m->hop_wait_ns[n] += ob->xfer_out_wait_ns;
    if (e->t_result) {
        m->host_ns += t_wait > e->t_result ? t_wait - e->t_result : 0;
        m->host_wait_ns +=
            core_wait > e->core_wait_at_result ? core_wait - e->core_wait_at_result : 0;
    }
    m->result_ns += t_got > t_wait ? t_got - t_wait : 0;
    m->result_wait_ns += core_got > core_wait ? core_got - core_wait : 0;
    pthread_mutex_unlock(&e->mu);
}

/* Takes the oldest step back and produces its tokens. */
static px_status take_step(px_rt_engine *e, px_err *err)
{
    px__rt_eflight *f = &e->flights[e->fl_head];
    describe(e, f);
    const float *logits = NULL;
    uint64_t t_wait = px_now_ns(), core_wait = px__rt_thread_wait_ns(&e->wait_fd);
    px_status st = px__rt_runner_collect(e, f, &logits, err);
    if (st) {
        e->t_result = 0; /* the recovery is not the engine's work per step */
        return ring_error(e, st) ? recover(e, st, err) : fail_all(e, st, err);
    }
    uint64_t t_got = px_now_ns(), core_got = px__rt_thread_wait_ns(&e->wait_fd);
    if (!f->replay)
        book_timing(e, t_wait, core_wait, t_got, core_got);
    e->t_result = t_got;
    e->core_wait_at_result = core_got;
    e->fl_head = (e->fl_head + 1) % e->depth;
    e->fl_count--;
    e->obs.logits = logits;
    uint64_t now = px_now_ns();
    uint64_t dt = now - (e->phase_t0 ? e->phase_t0 : f->t_send);
    e->phase_t0 = now;
    if (e->o.stats && !f->replay) {
        if (f->prefill)
            e->o.stats->gen.prefill_ns += dt;
        else {
            e->o.stats->gen.decode_ns += dt;
            e->o.stats->decode_steps++;
        }
    }
    if (f->replay)
        e->info.steps_replayed++;
    for (uint32_t j = 0; j < f->n; j++)
        if ((st = produce(e, f, j, logits + (size_t)j * e->vocab, err)) != PX_OK)
            return fail_all(e, st, err);
    if (e->sup && e->sup->after_step) {
        px_rt_step_verdict v = {.keep_steps = UINT64_MAX};
        if ((st = e->sup->after_step(e->sup->ud, e->run.ex, &e->obs, &v, err)) != PX_OK)
            return fail_all(e, st, err);
        if (v.audit_next)
            e->audit_next = true;
        if (v.switch_to) {
            e->switch_to = v.switch_to;
            e->keep_steps = v.keep_steps;
        }
    }
    if (e->rebuild_t0 && e->n_rebuilding == 0)
        finish_rebuild(e);
    return PX_OK;
}

px_status px_rt_engine_step(px_rt_engine *e, bool *busy, px_err *err)
{
    bool local;
    if (!busy)
        busy = &local;
    *busy = false;
    if (e->failed)
        return px_err_set(err, PX_ESTATE, "engine: it failed before; start a new one");
    uint64_t t0 = px_now_ns();
    px__rt_engine_take_inbox(e);
    px__rt_engine_cancel_due(e);
    px_status st = PX_OK;
    if (e->switch_to && e->fl_count == 0 && (st = switch_over(e, err)) != PX_OK)
        return fail_all(e, st, err);
    if ((st = send_steps(e, err)) != PX_OK)
        return st;
    if (e->fl_count > 0 && (st = take_step(e, err)) != PX_OK)
        return st;
    if (e->fl_count == 0)
        e->phase_t0 = 0;
    px__rt_engine_cancel_due(e);
    px__rt_engine_publish(e);
    pthread_mutex_lock(&e->mu);
    e->m.steps = e->index;
    e->m.step_rows = e->rows_sent;
    e->m.decode_steps = e->decode_steps;
    e->m.decode_rows = e->decode_rows;
    e->m.busy_ns += px_now_ns() - t0;
    pthread_mutex_unlock(&e->mu);
    *busy = e->n_running || e->n_waiting || e->fl_count || e->switch_to;
    /* Idle until the next request: that wait is not the engine's work. */
    if (!*busy)
        e->t_result = 0;
    return PX_OK;
}

px_status px_rt_engine_run(px_rt_engine *e, px_err *err)
{
    for (;;) {
        bool busy;
        px_status st = px_rt_engine_step(e, &busy, err);
        if (st)
            return st;
        if (!busy) {
            px__rt_engine_take_inbox(e);
            if (!e->n_waiting)
                return PX_OK;
        }
    }
}
