/*
 * The engine's scheduler: what the next step carries.  First one token
 * for every running sequence that decodes, then prompt chunks of running
 * sequences still prefilling (or being prefilled again after a
 * preemption or a fault), then new sequences admitted from the queue, all
 * within the step's row budget.  KV-cache blocks are counted here exactly
 * as the sessions take them (px_rt_kv_blocks_for), so a step that is sent
 * always fits.  A decoding sequence that needs a block when none is free
 * preempts the youngest running sequence (vLLM's recompute preemption).
 * With several micro-batches in flight a step carries its share of the
 * sequences, so that the next step has some of its own.
 */
#include "base/common.h"

#include "rt/engine_impl.h"

/* Takes the blocks q needs to hold positions [0, end); false when they
 * are not free. */
static bool grow(px_rt_engine *e, px__rt_eseq *q, uint32_t end)
{
    uint32_t want = px_rt_kv_blocks_for(end, e->run.kv_block_size);
    if (want <= q->blocks)
        return true;
    if (want - q->blocks > e->kv_free)
        return false;
    e->kv_free -= want - q->blocks;
    q->blocks = want;
    return true;
}

/* The tokens q feeds next: what it has not fed, within the rows left,
 * stopping where a rebuild checks the logits of its last token. */
static uint32_t chunk(const px_rt_engine *e, const px__rt_eseq *q, uint32_t rows_left)
{
    uint32_t k = PX_MIN(q->n_tokens - q->n_cached, rows_left);
    if (q->verify_at && q->n_cached < q->verify_at)
        k = PX_MIN(k, q->verify_at - q->n_cached);
    /* No more than the blocks it holds and the free ones can take. */
    uint64_t room = (uint64_t)(q->blocks + e->kv_free) * e->run.kv_block_size;
    room = PX_MIN(room, (uint64_t)e->run.context);
    if (room <= q->n_cached)
        return 0;
    return (uint32_t)PX_MIN((uint64_t)k, room - q->n_cached);
}

static void add_entry(px__rt_eflight *f, px__rt_eseq *q, uint32_t k)
{
    uint32_t j = f->n++;
    uint32_t pos = q->n_cached;
    bool decode = k == 1 && q->n_new > 0 && pos + 1 == q->n_tokens && !q->rebuild_to;
    f->seq[j] = q;
    f->ordinal[j] = q->ordinal;
    f->pos[j] = pos;
    f->n_tokens[j] = k;
    memcpy(f->tokens + f->rows, q->tokens + pos, (size_t)k * sizeof *f->tokens);
    f->wire[j] = (px__rt_step_seq){.seq = q->slot, .pos = pos, .n_tokens = k};
    f->steps[j] =
        (px_rt_seq_step){.seq = q->slot, .pos = pos, .n_tokens = k, .tokens = f->tokens + f->rows};
    f->rows += k;
    f->prefill |= !decode;
    if (!q->rebuild_to)
        f->replay = false;
    q->in_flight = true;
}

/* The youngest running sequence that can be preempted (resident, not in
 * a step, not `keep`), or NULL. */
static px__rt_eseq *victim(px_rt_engine *e, const px__rt_eseq *keep)
{
    px__rt_eseq *v = NULL;
    for (uint32_t i = 0; i < e->max_running; i++) {
        px__rt_eseq *q = e->running[i];
        if (!q || q == keep || q->in_flight || q->slot < 0)
            continue;
        if (!v || q->ordinal > v->ordinal)
            v = q;
    }
    return v;
}

px_status px__rt_engine_requeue(px_rt_engine *e, px__rt_eseq *q, px_err *err)
{
    PX_ASSERT(q->running && !q->in_flight);
    for (uint32_t i = 0; i < e->max_running; i++)
        if (e->running[i] == q) {
            e->running[i] = NULL;
            e->n_running--;
        }
    q->running = false;
    px_status st = PX_OK;
    if (q->slot >= 0)
        st = px__rt_runner_remove(&e->run, q->slot, err);
    q->slot = -1;
    e->kv_free += q->blocks;
    q->blocks = 0;
    q->n_cached = 0;
    /* First among the waiting, after those requeued before it that are
     * older (the queue keeps order of submission among them). */
    px__rt_eseq *prev = NULL, *p = e->wait_head;
    while (p && p->admitted_once && p->ordinal < q->ordinal) {
        prev = p;
        p = p->next;
    }
    q->next = p;
    if (prev)
        prev->next = q;
    else
        e->wait_head = q;
    if (!p)
        e->wait_tail = q;
    e->n_waiting++;
    return st;
}

/* Makes room for one more block for q by preempting younger sequences. */
static px_status make_room(px_rt_engine *e, px__rt_eseq *q, uint32_t end, bool *ok, px_err *err)
{
    *ok = grow(e, q, end);
    while (!*ok) {
        px__rt_eseq *v = victim(e, q);
        if (!v || v->ordinal < q->ordinal)
            return PX_OK;
        px_status st = px__rt_engine_requeue(e, v, err);
        v->st.preemptions++;
        pthread_mutex_lock(&e->mu);
        e->m.preemptions++;
        pthread_mutex_unlock(&e->mu);
        if (st)
            return st;
        *ok = grow(e, q, end);
    }
    return PX_OK;
}

/* Whether q may join the running sequences now: its tokens' blocks must
 * be free, and some headroom for the running ones to grow. */
static bool admissible(const px_rt_engine *e, const px__rt_eseq *q)
{
    uint32_t need =
        px_rt_kv_blocks_for(PX_MIN(q->n_tokens + 1, e->run.context), e->run.kv_block_size);
    uint32_t headroom = e->n_running ? PX_MAX(1u, e->run.kv_blocks / 100) : 0;
    return (uint64_t)need + headroom <= e->kv_free;
}

static px_status admit(px_rt_engine *e, px__rt_eseq *q, px_err *err)
{
    int32_t slot;
    px_status st = px__rt_runner_add(&e->run, &slot, err);
    if (st)
        return st;
    e->wait_head = q->next;
    if (!e->wait_head)
        e->wait_tail = NULL;
    q->next = NULL;
    e->n_waiting--;
    q->slot = slot;
    q->running = true;
    q->n_cached = 0;
    for (uint32_t i = 0; i < e->max_running; i++)
        if (!e->running[i]) {
            e->running[i] = q;
            break;
        }
    e->n_running++;
    if (!q->admitted_once) {
        q->admitted_once = true;
        q->st.queue_ns = px_now_ns() - q->t_submit;
        pthread_mutex_lock(&e->mu);
        e->n_queued--;
        pthread_mutex_unlock(&e->mu);
    }
    return PX_OK;
}

void px__rt_engine_cancel_due(px_rt_engine *e)
{
    for (uint32_t i = 0; i < e->max_running; i++) {
        px__rt_eseq *q = e->running[i];
        if (q && q->cancel && !q->in_flight)
            px__rt_engine_finish(e, q, PX_RT_FINISH_CANCELLED, NULL);
    }
    for (px__rt_eseq *q = e->wait_head, *n; q; q = n) {
        n = q->next;
        if (q->cancel)
            px__rt_engine_finish(e, q, PX_RT_FINISH_CANCELLED, NULL);
    }
}

px_status px__rt_engine_build(px_rt_engine *e, px__rt_eflight *f, px_err *err)
{
    f->n = f->rows = 0;
    f->prefill = f->audit = false;
    f->replay = true;
    uint32_t budget = e->step_tokens, cap = e->max_entries;
    if (e->depth > 1) {
        uint32_t active = e->n_running + PX_MIN(e->n_waiting, e->max_running - e->n_running);
        cap = PX_MIN(cap, PX_MAX(1u, (active + e->depth - 1) / e->depth));
    }
    /* Decodes first (one row each, latency), then prefill chunks. */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < e->max_running && f->n < cap && f->rows < budget; i++) {
            px__rt_eseq *q = e->running[i];
            if (!q || q->in_flight || q->cancel || q->slot < 0)
                continue;
            bool decode = q->n_tokens - q->n_cached == 1 && !q->rebuild_to;
            if (decode != (pass == 0))
                continue;
            if (decode) {
                bool ok;
                px_status st = make_room(e, q, q->n_cached + 1, &ok, err);
                if (st)
                    return st;
                if (ok)
                    add_entry(f, q, 1);
                continue;
            }
            uint32_t k = chunk(e, q, budget - f->rows);
            if (k && grow(e, q, q->n_cached + k))
                add_entry(f, q, k);
        }
    /* Then new sequences, in the order they came. */
    while (e->wait_head && e->n_running < e->max_running && f->n < cap && f->rows < budget) {
        px__rt_eseq *q = e->wait_head;
        if (!admissible(e, q)) {
            if (e->n_running == 0 && e->fl_count == 0 && f->n == 0) {
                /* Nothing will free blocks: it can never run. */
                px_err why;
                px_err_set(&why, PX_ELIMIT,
                           "request %" PRIu64 " needs %u KV-cache blocks of %u positions; the "
                           "cache holds %u",
                           q->id, px_rt_kv_blocks_for(q->n_tokens + 1, e->run.kv_block_size),
                           e->run.kv_block_size, e->run.kv_blocks);
                px__rt_engine_finish(e, q, PX_RT_FINISH_ERROR, &why);
                continue;
            }
            break;
        }
        px_status st = admit(e, q, err);
        if (st)
            return st;
        uint32_t k = chunk(e, q, budget - f->rows);
        if (k && grow(e, q, k))
            add_entry(f, q, k);
    }
    return PX_OK;
}
