/*
 * The runners a step goes through: a session in this process (the step
 * runs at once) or an executor's ring of stage workers (the step travels
 * as a STEP frame; several may be in flight, and their results come back
 * in order).  Sequences join and leave a pipeline by SEQ frames the engine
 * does not wait for: every stage applies frames in order, so a sequence
 * added before a step is there when the step arrives.
 */
#include "base/common.h"

#include "rt/engine_impl.h"

px_status px__rt_runner_init(px__rt_runner *r, px_rt_session *s, px_rt_executor *ex, px_err *err)
{
    memset(r, 0, sizeof *r);
    r->s = s;
    r->ex = ex;
    if (s) {
        r->max_seqs = s->max_seqs;
        r->context = s->context;
        r->max_rows = s->max_rows;
        r->kv_block_size = s->kv_block_size;
        r->kv_blocks = s->kv_blocks;
        r->n_stages = 1;
        for (uint32_t i = 0; i < s->max_seqs; i++)
            if (s->seq_len[i] >= 0)
                return px_err_set(err, PX_ESTATE,
                                  "engine: the session already has sequences; use a fresh "
                                  "session");
        return PX_OK;
    }
    if (ex->failed)
        return px_err_set(err, PX_ESTATE, "engine: the pipeline failed before; start a new one");
    r->max_seqs = ex->max_seqs;
    r->context = ex->context;
    r->max_rows = ex->max_rows;
    r->kv_block_size = ex->kv_block_size;
    r->kv_blocks = ex->kv_blocks;
    r->n_stages = ex->spec.n_stages;
    r->micro_batches = ex->spec.micro_batches;
    r->slot_used = ex->slot_used;
    for (uint32_t i = 0; i < ex->max_seqs; i++)
        if (r->slot_used[i])
            return px_err_set(err, PX_ESTATE,
                              "engine: the pipeline already has sequences; use a fresh one");
    return PX_OK;
}

uint32_t px__rt_runner_depth(const px__rt_runner *r, uint32_t asked)
{
    if (r->s)
        return 1;
    /* The plan priced its steps as micro-batches of batch / micro_batches
     * rows, so many in flight: the engine forms those, not one per stage,
     * so that what runs is what was predicted. */
    uint32_t d = asked ? asked : r->micro_batches ? r->micro_batches : r->n_stages;
    return PX_MAX(1u, PX_MIN(d, (uint32_t)PX__RT_ENGINE_MAX_FLIGHTS));
}

void px__rt_runner_release(px__rt_runner *r)
{
    (void)r;
}

/* Sends a frame to stage 0.  When that fails, the stage that saw the
 * broken frame may have said why around the ring: its word is the better
 * message. */
static px_status send_first(px_rt_executor *ex, px_rt_frame_type type, uint8_t flags,
                            const void *const *parts, const uint32_t *lens, uint32_t n, px_err *err)
{
    px_status st = px_rt_conn_sendv(ex->first, type, flags, parts, lens, n, err);
    if (st == PX_OK)
        return PX_OK;
    px_err why;
    px_rt_frame_header fh;
    const uint8_t *p;
    if (px__rt_exec_recv(ex, PX_RT_FRAME_ERROR, &fh, &p, &why) == PX_OK) {
        char mine[160];
        px_strlcpy(mine, err ? err->msg : "", sizeof mine);
        px_err_set(err, st, "%.*s (%s)", (int)PX_MIN(fh.length, 300u), (const char *)p, mine);
    } else if (why.code == PX_EPEER && err) {
        /* The receiver already saw the ring break: its word names the
         * stage. */
        px_err_set(err, PX_EPEER, "%s", why.msg);
    }
    return st;
}

static px_status seq_frame(px_rt_executor *ex, uint32_t op, int32_t slot, px_err *err)
{
    px__rt_seq_msg m = {.op = op, .seq = slot};
    const void *parts[1] = {&m};
    uint32_t lens[1] = {sizeof m};
    return send_first(ex, PX_RT_FRAME_SEQ, 0, parts, lens, 1, err);
}

px_status px__rt_runner_add(px__rt_runner *r, int32_t *slot, px_err *err)
{
    if (r->s)
        return px_rt_seq_add(r->s, slot, err);
    uint32_t i = 0;
    while (i < r->max_seqs && r->slot_used[i])
        i++;
    if (i == r->max_seqs)
        return px_err_set(err, PX_ELIMIT, "engine: every sequence slot of the pipeline is taken");
    px_status st = seq_frame(r->ex, 1, (int32_t)i, err);
    if (st)
        return st;
    r->slot_used[i] = true;
    *slot = (int32_t)i;
    return PX_OK;
}

px_status px__rt_runner_remove(px__rt_runner *r, int32_t slot, px_err *err)
{
    if (r->s)
        return px_rt_seq_remove(r->s, slot, err);
    if (slot < 0 || (uint32_t)slot >= r->max_seqs || !r->slot_used[slot])
        return PX_OK;
    r->slot_used[slot] = false;
    if (r->ex->failed)
        return PX_OK;
    return seq_frame(r->ex, 2, slot, err);
}

px_status px__rt_runner_submit(px_rt_engine *e, px__rt_eflight *f, px_err *err)
{
    f->t_send = px_now_ns();
    if (e->run.s) {
        px_rt_batch b = {.n_seqs = f->n, .seqs = f->steps};
        return px_rt_forward(e->run.s, &b, NULL, &f->out, err);
    }
    px__rt_step_head h = {.n_seqs = f->n, .n_rows = f->rows, .prefill = f->prefill};
    const void *parts[3] = {&h, f->wire, f->tokens};
    uint32_t lens[3] = {sizeof h, f->n * (uint32_t)sizeof *f->wire, f->rows * 4};
    return send_first(e->run.ex, PX_RT_FRAME_STEP, f->audit ? PX_RT_STEP_AUDIT : 0, parts, lens, 3,
                      err);
}

/* Exposes the audit blocks that follow the records at p[at..len): one per
 * stage in ring order, each a head and its output row (dim values, the
 * last stage's vocab). */
static px_status read_audit(px_rt_engine *e, const uint8_t *p, size_t at, size_t len, px_err *err)
{
    px_rt_step_obs *ob = &e->obs;
    for (uint32_t k = 0; k < e->run.n_stages; k++) {
        px__rt_audit_head ah;
        if (len - at < sizeof ah)
            return px_err_set(err, PX_EPARSE,
                              "the result of an audited step ends before stage %u's audit block",
                              k);
        memcpy(&ah, p + at, sizeof ah);
        at += sizeof ah;
        uint32_t want = k + 1 == e->run.n_stages ? e->vocab : e->dim;
        if (ah.stage != k || ah.n != want || (len - at) / sizeof(float) < ah.n)
            return px_err_set(err, PX_EPARSE,
                              "audit block %u of a step names stage %u with %u values; expected "
                              "stage %u with %u, within the %zu bytes left",
                              k, ah.stage, ah.n, k, want, len - at);
        ob->audit[k] = (const float *)(p + at);
        ob->audit_len[k] = ah.n;
        at += (size_t)ah.n * sizeof(float);
    }
    if (at != len)
        return px_err_set(err, PX_EPARSE,
                          "the result of an audited step has %zu bytes past its audit blocks",
                          len - at);
    return PX_OK;
}

/* The stages' timings of one step, from their records, into e->obs. */
static void time_step(px_rt_engine *e, const px__rt_stage_record *recs, uint32_t n, uint64_t sent,
                      uint64_t got, uint64_t got_wait)
{
    px_rt_step_obs *ob = &e->obs;
    uint64_t prev = sent;
    ob->t_send_ns = sent;
    ob->wall_ns = got > sent ? got - sent : 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = recs[k].stage;
        if (s >= e->run.n_stages)
            continue;
        uint64_t from = PX_MAX(prev, recs[k].ready_ns);
        ob->compute_ns[s] = recs[k].compute_ns;
        ob->wait_ns[s] = PX_MIN(recs[k].wait_ns, recs[k].compute_ns);
        ob->xfer_in_ns[s] = recs[k].recv_done_ns > from ? recs[k].recv_done_ns - from : 0;
        /* Clipped to this step's hop, once it is known. */
        ob->xfer_wait_ns[s] = PX_MIN(recs[k].recv_wait_ns, ob->xfer_in_ns[s]);
        prev = recs[k].send_start_ns;
    }
    ob->xfer_out_ns = got > prev ? got - prev : 0;
    ob->xfer_out_wait_ns = PX_MIN(got_wait, ob->xfer_out_ns);
}

/* Books a step's timings into the pipeline's stats. */
static void book(px_rt_engine *e, const px__rt_stage_record *recs, uint32_t n, bool prefill)
{
    px_rt_pipeline_stats *ps = e->o.stats;
    if (!ps)
        return;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = recs[k].stage;
        if (s >= e->run.n_stages)
            continue;
        px_rt_stage_stats *ss = &ps->stages[s];
        if (prefill) {
            ss->prefill_steps++;
            ss->prefill_rows += recs[k].rows;
            ss->prefill_ns += recs[k].compute_ns;
            ss->xfer_in_prefill_ns += e->obs.xfer_in_ns[s];
        } else {
            ss->decode_steps++;
            ss->decode_ns += recs[k].compute_ns;
            ss->xfer_in_decode_ns += e->obs.xfer_in_ns[s];
        }
    }
    if (prefill)
        ps->xfer_out_prefill_ns += e->obs.xfer_out_ns;
    else
        ps->xfer_out_decode_ns += e->obs.xfer_out_ns;
}

px_status px__rt_runner_collect(px_rt_engine *e, px__rt_eflight *f, const float **logits,
                                px_err *err)
{
    px_rt_step_obs *ob = &e->obs;
    if (e->run.s) {
        *logits = f->out.data;
        uint64_t now = px_now_ns();
        ob->t_send_ns = f->t_send;
        ob->wall_ns = now - f->t_send;
        ob->compute_ns[0] = ob->wall_ns;
        return PX_OK;
    }
    px_rt_executor *ex = e->run.ex;
    px_rt_frame_header fh;
    const uint8_t *p = NULL;
    px_status st = px__rt_exec_recv(ex, PX_RT_FRAME_RESULT, &fh, &p, err);
    if (st)
        return st;
    uint64_t got = px__rt_exec_rx_time(ex), got_wait = px__rt_exec_rx_wait(ex);
    px__rt_step_head rh;
    if (fh.length < sizeof rh)
        return px_err_set(err, PX_EPARSE, "a result frame is too short");
    memcpy(&rh, p, sizeof rh);
    uint64_t want = sizeof rh + (uint64_t)rh.n_rows * rh.row_len * 4 +
                    (uint64_t)rh.n_records * sizeof(px__rt_stage_record);
    if (rh.n_rows != f->n || rh.row_len != e->vocab || rh.n_records != e->run.n_stages ||
        (f->audit ? want > fh.length : want != fh.length))
        return px_err_set(err, PX_EPARSE,
                          "the result of a step has %u rows of %u logits and %u "
                          "stage records; expected %u rows of %u and %u",
                          rh.n_rows, rh.row_len, rh.n_records, f->n, e->vocab, e->run.n_stages);
    *logits = (const float *)(p + sizeof rh);
    px__rt_stage_record recs[PX_RT_MAX_STAGES];
    memcpy(recs, p + sizeof rh + (size_t)rh.n_rows * rh.row_len * 4,
           (size_t)rh.n_records * sizeof *recs);
    if (f->audit && (st = read_audit(e, p, (size_t)want, fh.length, err)))
        return st;
    time_step(e, recs, rh.n_records, f->t_send, got, got_wait);
    if (!f->replay)
        book(e, recs, rh.n_records, f->prefill);
    return PX_OK;
}

px_status px_rt_engine_gather_stats(px_rt_engine *e, px_err *err)
{
    px_rt_pipeline_stats *ps = e->o.stats;
    px_rt_executor *ex = e->run.ex;
    if (!ps || !ex)
        return px_err_set(err, PX_EINVAL,
                          "engine: stats are gathered from a pipeline into the engine's stats");
    px_status st = send_first(ex, PX_RT_FRAME_STATS, 0, NULL, NULL, 0, err);
    px_rt_frame_header h;
    const uint8_t *p;
    if (st == PX_OK)
        st = px__rt_exec_recv(ex, PX_RT_FRAME_STATS, &h, &p, err);
    if (st)
        return st;
    size_t at = 0;
    for (uint32_t k = 0; k < e->run.n_stages; k++) {
        px__rt_stats_head sh;
        if (h.length - at < sizeof sh)
            return px_err_set(err, PX_EPARSE, "the stages' telemetry is cut short");
        memcpy(&sh, p + at, sizeof sh);
        at += sizeof sh;
        if (sh.stage >= e->run.n_stages ||
            (h.length - at) / sizeof(px__rt_stats_entry) < sh.n_entries)
            return px_err_set(err, PX_EPARSE, "the stages' telemetry does not add up");
        px_rt_stage_stats *ss = &ps->stages[sh.stage];
        free(ss->ops);
        ss->ops = calloc(sh.n_entries ? sh.n_entries : 1, sizeof *ss->ops);
        if (!ss->ops)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        ss->n_ops = sh.n_entries;
        for (uint32_t i = 0; i < sh.n_entries; i++) {
            px__rt_stats_entry en;
            memcpy(&en, p + at, sizeof en);
            at += sizeof en;
            ss->ops[i] = (px_rt_op_total){.layer = en.layer,
                                          .kind = (px_ir_op_kind)en.kind,
                                          .count = en.count,
                                          .ns = en.ns,
                                          .flops = en.flops,
                                          .bytes = en.bytes};
        }
    }
    return PX_OK;
}
