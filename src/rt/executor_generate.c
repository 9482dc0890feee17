/*
 * Generation through the pipeline: the loop of px_rt_generate (the same
 * prefill packing and stopping rules, so that output matches a single
 * process bit for bit), with each step sent around the ring of stage
 * workers, and the stages' telemetry gathered on the way.
 *
 * Supervision: every step gets an index and goes into a log with the
 * token each of its entries produced.  When a step fails and the
 * supervisor hands over a replacement executor, or the supervisor asks to
 * switch executors, the generation starts again on the new one: the loops
 * rebuild exactly the same steps (their shapes depend only on the
 * per-sequence state, which the logged tokens reproduce), the steps the
 * log holds are replayed with their tokens forced and nothing emitted,
 * and the generation goes on past the log.  Replaying through the same
 * kernels rebuilds every KV cache bit for bit.
 */
#include "base/common.h"

#include "rt/generate_impl.h"

/* Samples entry j of the current step (prompt i).  A replayed step forces
 * the logged token, still sampling so that the sampler's random state
 * stays in step, and emits and books nothing. */
static px_status produce(px__rt_gen *g, uint32_t i, uint32_t j, const float *row, bool in_decode,
                         px_err *err)
{
    px__rt_gen_seq *q = &g->seqs[i];
    memcpy(g->logits, row, g->vocab * sizeof(float));
    int32_t next = px_rt_sampler_sample(q->sampler, g->logits);
    int32_t *logged = &g->log.token[g->log.steps[g->obs.index].first + j];
    if (g->replay) {
        if (*logged == PX__RT_GEN_NONE)
            return px_err_set(err, PX_EDIVERGED,
                              "generate: replaying step %llu, prompt %u produced a token where "
                              "the log has none",
                              (unsigned long long)g->obs.index, i + 1);
        if (next != *logged && g->info.identical) {
            g->info.identical = false;
            g->info.first_mismatch_step = g->obs.index;
        }
        next = *logged;
    } else {
        *logged = next;
        if (!g->first_token) {
            g->first_token = true;
            g->st->ttft_ns = px_now_ns() - g->t_start;
        }
    }
    if (px__rt_gen_is_stop(g, next)) {
        q->done = true;
        return PX_OK;
    }
    q->n_new++;
    g->tokens_out++;
    if (!g->replay) {
        g->st->gen.new_tokens++;
        if (in_decode)
            g->st->gen.decode_tokens++;
        if (g->o->on_token && (uint32_t)next < px_rt_tokenizer_n_tokens(g->t)) {
            const char *piece;
            size_t len;
            px_status s = px_rt_tokenizer_decode(g->t, q->last, next, &piece, &len, err);
            if (s)
                return s;
            g->o->on_token(i, next, piece, len, g->o->ud);
        }
    }
    q->last = next;
    if (q->n_new >= g->o->max_new_tokens) {
        q->done = true;
    } else if (q->len >= g->context) {
        q->done = true;
        q->at_context = true;
    }
    return PX_OK;
}

/* The stages' timings of one step, from their records, into g->obs. */
static void time_step(px__rt_gen *g, const px__rt_stage_record *recs, uint32_t n, uint64_t sent,
                      uint64_t got)
{
    px_rt_step_obs *ob = &g->obs;
    uint64_t prev = sent;
    ob->t_send_ns = sent;
    ob->wall_ns = got > sent ? got - sent : 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = recs[k].stage;
        if (s >= g->n_stages)
            continue;
        ob->compute_ns[s] = recs[k].compute_ns;
        ob->xfer_in_ns[s] = recs[k].recv_done_ns > prev ? recs[k].recv_done_ns - prev : 0;
        prev = recs[k].send_start_ns;
    }
    ob->xfer_out_ns = got > prev ? got - prev : 0;
}

/* Books the current step's timings (g->obs) and the stages' rows. */
static void book(px__rt_gen *g, const px__rt_stage_record *recs, uint32_t n, bool prefill)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = recs[k].stage;
        if (s >= g->n_stages)
            continue;
        px_rt_stage_stats *ss = &g->st->stages[s];
        if (prefill) {
            ss->prefill_steps++;
            ss->prefill_rows += recs[k].rows;
            ss->prefill_ns += recs[k].compute_ns;
            ss->xfer_in_prefill_ns += g->obs.xfer_in_ns[s];
        } else {
            ss->decode_steps++;
            ss->decode_ns += recs[k].compute_ns;
            ss->xfer_in_decode_ns += g->obs.xfer_in_ns[s];
        }
    }
    if (prefill)
        g->st->xfer_out_prefill_ns += g->obs.xfer_out_ns;
    else
        g->st->xfer_out_decode_ns += g->obs.xfer_out_ns;
}

/* Sends a frame to stage 0.  When that fails, the stage that saw the
 * broken frame may say so around the ring: its word is the better
 * message. */
static px_status send_first(px__rt_gen *g, px_rt_frame_type type, uint8_t flags,
                            const void *const *parts, const uint32_t *lens, uint32_t n, px_err *err)
{
    px_status st = px_rt_conn_sendv(px__rt_exec_first(g->ex), type, flags, parts, lens, n, err);
    if (st == PX_OK)
        return PX_OK;
    px_err why;
    px_rt_frame_header fh;
    const uint8_t *p;
    if (px__rt_exec_recv(g->ex, PX_RT_FRAME_ERROR, &fh, &p, &why) == PX_OK &&
        fh.type == PX_RT_FRAME_ERROR) {
        char mine[160];
        px_strlcpy(mine, err ? err->msg : "", sizeof mine);
        px_err_set(err, st, "%.*s (%s)", (int)PX_MIN(fh.length, 300u), (const char *)p, mine);
    }
    return st;
}

/* Exposes the audit blocks that follow the records at p[at..len): one per
 * stage in ring order, each a head and its output row (dim values, the
 * last stage's vocab). */
static px_status read_audit(px__rt_gen *g, const uint8_t *p, size_t at, size_t len, px_err *err)
{
    for (uint32_t k = 0; k < g->n_stages; k++) {
        px__rt_audit_head ah;
        if (len - at < sizeof ah)
            return px_err_set(err, PX_EPARSE,
                              "the result of an audited step ends before stage %u's audit block",
                              k);
        memcpy(&ah, p + at, sizeof ah);
        at += sizeof ah;
        uint32_t want = k + 1 == g->n_stages ? g->vocab : g->dim;
        if (ah.stage != k || ah.n != want || (len - at) / sizeof(float) < ah.n)
            return px_err_set(err, PX_EPARSE,
                              "audit block %u of a step names stage %u with %u values; expected "
                              "stage %u with %u, within the %zu bytes left",
                              k, ah.stage, ah.n, k, want, len - at);
        g->obs.audit[k] = (const float *)(p + at);
        g->obs.audit_len[k] = ah.n;
        at += (size_t)ah.n * sizeof(float);
    }
    if (at != len)
        return px_err_set(err, PX_EPARSE,
                          "the result of an audited step has %zu bytes past its audit blocks",
                          len - at);
    return PX_OK;
}

/* Sends a step of n entries (g->wire, g->tokens) and returns its logits
 * (one row per entry, in the connection's buffer). */
static px_status run_step(px__rt_gen *g, uint32_t n, uint32_t rows, bool prefill, bool audit,
                          const float **logits, px_err *err)
{
    px__rt_step_head h = {
        .n_seqs = n, .n_rows = rows, .row_len = 0, .n_records = 0, .prefill = prefill};
    const void *parts[3] = {&h, g->wire, g->tokens};
    uint32_t lens[3] = {sizeof h, n * (uint32_t)sizeof *g->wire, rows * 4};
    uint64_t sent = px_now_ns();
    px_status st =
        send_first(g, PX_RT_FRAME_STEP, audit ? PX_RT_STEP_AUDIT : 0, parts, lens, 3, err);
    px_rt_frame_header fh;
    const uint8_t *p = NULL;
    if (st != PX_OK)
        return st;
    st = px__rt_exec_recv(g->ex, PX_RT_FRAME_RESULT, &fh, &p, err);
    if (st)
        return st;
    uint64_t got = px_now_ns();
    px__rt_step_head rh;
    if (fh.length < sizeof rh)
        return px_err_set(err, PX_EPARSE, "a result frame is too short");
    memcpy(&rh, p, sizeof rh);
    uint64_t want = sizeof rh + (uint64_t)rh.n_rows * rh.row_len * 4 +
                    (uint64_t)rh.n_records * sizeof(px__rt_stage_record);
    if (rh.n_rows != n || rh.row_len != g->vocab || rh.n_records != g->n_stages ||
        (audit ? want > fh.length : want != fh.length))
        return px_err_set(err, PX_EPARSE,
                          "the result of a step has %u rows of %u logits and %u "
                          "stage records; expected %u rows of %u and %u",
                          rh.n_rows, rh.row_len, rh.n_records, n, g->vocab, g->n_stages);
    *logits = (const float *)(p + sizeof rh);
    px__rt_stage_record recs[PX_RT_MAX_STAGES];
    memcpy(recs, p + sizeof rh + (size_t)rh.n_rows * rh.row_len * 4,
           (size_t)rh.n_records * sizeof *recs);
    if (audit && (st = read_audit(g, p, (size_t)want, fh.length, err)))
        return st;
    time_step(g, recs, rh.n_records, sent, got);
    g->obs.logits = *logits;
    if (!g->replay)
        book(g, recs, rh.n_records, prefill);
    return PX_OK;
}

static px_status log_grow(px__rt_gen_log *l, uint32_t n)
{
    if (l->n_steps == l->cap_steps) {
        size_t cap = l->cap_steps ? 2 * l->cap_steps : 64;
        px__rt_gen_log_step *s = realloc(l->steps, cap * sizeof *s);
        if (!s)
            return PX_ENOMEM;
        l->steps = s;
        l->cap_steps = cap;
    }
    if (l->cap_entries - l->n_entries < n) {
        size_t cap = PX_MAX(2 * l->cap_entries, l->n_entries + n + 64);
        uint32_t *pr = realloc(l->prompt, cap * sizeof *pr);
        if (pr)
            l->prompt = pr;
        int32_t *tk = pr ? realloc(l->token, cap * sizeof *tk) : NULL;
        if (!tk)
            return PX_ENOMEM;
        l->token = tk;
        l->cap_entries = cap;
    }
    return PX_OK;
}

/* Runs the step the loops built (n entries, rows tokens): replayed when
 * the log holds it, else announced to the supervisor, sent and logged. */
static px_status step(px__rt_gen *g, uint32_t n, uint32_t rows, bool prefill, const float **logits,
                      px_err *err)
{
    px_rt_step_obs *ob = &g->obs;
    g->replay = g->index < g->log.n_steps;
    for (uint32_t j = 0; j < n; j++) {
        g->pos[j] = g->wire[j].pos;
        g->n_tokens[j] = g->wire[j].n_tokens;
    }
    *ob = (px_rt_step_obs){.index = g->index,
                           .prefill = prefill,
                           .replay = g->replay,
                           .n_seqs = n,
                           .n_rows = rows,
                           .prompt = g->step_of,
                           .pos = g->pos,
                           .n_tokens = g->n_tokens,
                           .tokens = g->tokens,
                           .tokens_out = g->tokens_out,
                           .n_stages = g->n_stages,
                           .vocab = g->vocab};
    px_status st;
    if (g->replay) {
        const px__rt_gen_log_step *ls = &g->log.steps[g->index];
        bool same = ls->n == n && ls->rows == rows && ls->prefill == prefill;
        for (uint32_t j = 0; j < n && same; j++)
            same = g->log.prompt[ls->first + j] == g->step_of[j];
        if (!same)
            return px_err_set(err, PX_EDIVERGED,
                              "generate: the rebuilt step %llu differs from the logged one",
                              (unsigned long long)g->index);
    } else {
        px__rt_gen_finish_rebuild(g);
        if (g->sup && g->sup->before_step && (st = g->sup->before_step(g->sup->ud, g->ex, ob, err)))
            return st;
        if (log_grow(&g->log, n))
            return px_err_set(err, PX_ENOMEM, "generate: out of memory");
    }
    bool audit = !g->replay && g->audit_next;
    if ((st = run_step(g, n, rows, prefill, audit, logits, err))) {
        g->ring_error = true;
        return st;
    }
    if (audit)
        g->audit_next = false;
    if (g->replay) {
        g->info.steps_replayed++;
        g->info.tokens_replayed += rows;
    } else {
        px__rt_gen_log *l = &g->log;
        l->steps[l->n_steps++] =
            (px__rt_gen_log_step){.first = l->n_entries, .n = n, .rows = rows, .prefill = prefill};
        for (uint32_t j = 0; j < n; j++) {
            l->prompt[l->n_entries + j] = g->step_of[j];
            l->token[l->n_entries + j] = PX__RT_GEN_NONE;
        }
        l->n_entries += n;
    }
    return PX_OK;
}

/* After the step's tokens are produced: the supervisor's verdict. */
static px_status after_step(px__rt_gen *g, px_err *err)
{
    g->index++;
    if (!g->sup || !g->sup->after_step)
        return PX_OK;
    px_rt_step_verdict v = {.keep_steps = UINT64_MAX};
    px_status st = g->sup->after_step(g->sup->ud, g->ex, &g->obs, &v, err);
    if (st)
        return st;
    if (v.audit_next)
        g->audit_next = true;
    if (v.switch_to) {
        g->switch_to = v.switch_to;
        g->keep_steps = v.keep_steps;
        g->restart = true;
    }
    return PX_OK;
}

static px_status prefill(px__rt_gen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    px_status st = PX_OK;
    g->phase_t0 = px_now_ns();
    while (!g->restart) {
        uint32_t n_steps = 0, rows = 0;
        for (uint32_t i = 0; i < n && rows < g->max_rows; i++) {
            px__rt_gen_seq *q = &g->seqs[i];
            if (q->n_fed == q->n_prompt)
                continue;
            uint32_t k = (uint32_t)PX_MIN(q->n_prompt - q->n_fed, (size_t)(g->max_rows - rows));
            g->wire[n_steps] =
                (px__rt_step_seq){.seq = q->seq, .pos = (uint32_t)q->n_fed, .n_tokens = k};
            memcpy(g->tokens + rows, q->prompt + q->n_fed, k * sizeof(int32_t));
            g->step_of[n_steps++] = i;
            rows += k;
        }
        if (n_steps == 0)
            break;
        const float *logits;
        if ((st = step(g, n_steps, rows, true, &logits, err)))
            break;
        for (uint32_t j = 0; j < n_steps && st == PX_OK; j++) {
            px__rt_gen_seq *q = &g->seqs[g->step_of[j]];
            q->n_fed += g->wire[j].n_tokens;
            q->len = (int64_t)q->n_fed;
            if (!g->replay)
                g->st->gen.prompt_tokens += g->wire[j].n_tokens;
            if (q->n_fed < q->n_prompt)
                continue;
            q->last = q->prompt[q->n_prompt - 1];
            if (g->o->max_new_tokens == 0) {
                q->done = true;
                continue;
            }
            st = produce(g, g->step_of[j], j, logits + (size_t)j * g->vocab, false, err);
        }
        if (st || (st = after_step(g, err)))
            break;
    }
    if (!g->rebuilding) /* else every step of it was replayed */
        g->st->gen.prefill_ns += px_now_ns() - g->phase_t0;
    return st;
}

static px_status decode(px__rt_gen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    px_status st = PX_OK;
    g->phase_t0 = px_now_ns();
    while (!g->restart) {
        uint32_t n_steps = 0;
        for (uint32_t i = 0; i < n; i++) {
            px__rt_gen_seq *q = &g->seqs[i];
            if (q->done)
                continue;
            g->wire[n_steps] =
                (px__rt_step_seq){.seq = q->seq, .pos = (uint32_t)q->len, .n_tokens = 1};
            g->tokens[n_steps] = q->last;
            g->step_of[n_steps++] = i;
        }
        if (n_steps == 0)
            break;
        const float *logits;
        if ((st = step(g, n_steps, n_steps, false, &logits, err)))
            break;
        if (!g->replay)
            g->st->decode_steps++;
        for (uint32_t j = 0; j < n_steps && st == PX_OK; j++) {
            g->seqs[g->step_of[j]].len++;
            st = produce(g, g->step_of[j], j, logits + (size_t)j * g->vocab, true, err);
        }
        if (st || (st = after_step(g, err)))
            break;
    }
    if (!g->rebuilding)
        g->st->gen.decode_ns += px_now_ns() - g->phase_t0;
    return st;
}

/* Sends a sequence control frame around the ring and waits for it. */
static px_status seq_op(px__rt_gen *g, uint32_t op, int32_t seq, px_err *err)
{
    px__rt_seq_msg m = {.op = op, .seq = seq};
    const void *parts[1] = {&m};
    uint32_t lens[1] = {sizeof m};
    px_status st = send_first(g, PX_RT_FRAME_SEQ, 0, parts, lens, 1, err);
    px_rt_frame_header h;
    const uint8_t *p;
    if (st == PX_OK)
        st = px__rt_exec_recv(g->ex, PX_RT_FRAME_SEQ, &h, &p, err);
    return st;
}

/* Sequences join: the lowest free slot, as every stage's session picks
 * it. */
px_status px__rt_gen_join(px__rt_gen *g, px_err *err)
{
    bool *used = px__rt_exec_slots(g->ex);
    uint32_t max_seqs, ctx, rows;
    px__rt_exec_limits(g->ex, &max_seqs, &ctx, &rows);
    for (uint32_t i = 0; i < g->o->n_prompts; i++) {
        int32_t slot = 0;
        while ((uint32_t)slot < max_seqs && used[slot])
            slot++;
        if ((uint32_t)slot == max_seqs)
            return px_err_set(err, PX_ELIMIT, "generate: every sequence slot is taken");
        px_status st = seq_op(g, 1, slot, err);
        if (st) {
            g->ring_error = true;
            return st;
        }
        used[slot] = true;
        g->seqs[i].seq = slot;
    }
    return PX_OK;
}

/* Sequences leave; the first failure ends it. */
px_status px__rt_gen_leave(px__rt_gen *g, px_err *err)
{
    bool *used = px__rt_exec_slots(g->ex);
    for (uint32_t i = 0; i < g->o->n_prompts; i++) {
        px__rt_gen_seq *q = &g->seqs[i];
        if (q->seq < 0)
            continue;
        px_status st = seq_op(g, 2, q->seq, err);
        if (st)
            return st;
        used[q->seq] = false;
        q->seq = -1;
    }
    return PX_OK;
}

static px_status gather_stats(px__rt_gen *g, px_err *err)
{
    px_status st = send_first(g, PX_RT_FRAME_STATS, 0, NULL, NULL, 0, err);
    px_rt_frame_header h;
    const uint8_t *p;
    if (st == PX_OK)
        st = px__rt_exec_recv(g->ex, PX_RT_FRAME_STATS, &h, &p, err);
    if (st)
        return st;
    size_t at = 0;
    for (uint32_t k = 0; k < g->n_stages; k++) {
        px__rt_stats_head sh;
        if (h.length - at < sizeof sh)
            return px_err_set(err, PX_EPARSE, "the stages' telemetry is cut short");
        memcpy(&sh, p + at, sizeof sh);
        at += sizeof sh;
        if (sh.stage >= g->n_stages || (h.length - at) / sizeof(px__rt_stats_entry) < sh.n_entries)
            return px_err_set(err, PX_EPARSE, "the stages' telemetry does not add up");
        px_rt_stage_stats *ss = &g->st->stages[sh.stage];
        free(ss->ops);
        ss->ops = calloc(sh.n_entries ? sh.n_entries : 1, sizeof *ss->ops);
        if (!ss->ops)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        ss->n_ops = sh.n_entries;
        for (uint32_t e = 0; e < sh.n_entries; e++) {
            px__rt_stats_entry en;
            memcpy(&en, p + at, sizeof en);
            at += sizeof en;
            ss->ops[e] = (px_rt_op_total){.layer = en.layer,
                                          .kind = (px_ir_op_kind)en.kind,
                                          .count = en.count,
                                          .ns = en.ns,
                                          .flops = en.flops,
                                          .bytes = en.bytes};
        }
    }
    return PX_OK;
}

void px_rt_pipeline_stats_release(px_rt_pipeline_stats *st)
{
    if (!st)
        return;
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++) {
        free(st->stages[i].ops);
        st->stages[i].ops = NULL;
        st->stages[i].n_ops = 0;
    }
}

/* Puts sequence i back to before its prompt: positions, tokens and a
 * sampler re-created from the same seed. */
px_status px__rt_gen_reset_seq(px__rt_gen *g, uint32_t i, px_err *err)
{
    px__rt_gen_seq *q = &g->seqs[i];
    q->seq = -1;
    q->n_fed = 0;
    q->len = 0;
    q->last = 0;
    q->n_new = 0;
    q->done = q->at_context = false;
    px_rt_sampler_free(q->sampler);
    q->sampler = NULL;
    px_rt_sampler_opts so = g->o->sampling;
    so.seed += i;
    return px_rt_sampler_new(g->vocab, &so, &q->sampler, err);
}

static px_status prepare(px__rt_gen *g, px_err *err)
{
    const px_rt_generate_opts *o = g->o;
    uint32_t max_seqs;
    px__rt_exec_limits(g->ex, &max_seqs, &g->context, &g->max_rows);
    if (!o || o->n_prompts == 0 || !o->prompts)
        return px_err_set(err, PX_EINVAL, "generate: no prompt");
    if (o->n_prompts > max_seqs)
        return px_err_set(err, PX_EINVAL,
                          "generate: %u prompts; the pipeline decodes at most "
                          "%u sequences together",
                          o->n_prompts, max_seqs);
    if (px_rt_tokenizer_n_tokens(g->t) > g->vocab)
        return px_err_set(err, PX_EINVAL,
                          "generate: the tokenizer has %u tokens, the model "
                          "only %u: they do not belong together",
                          px_rt_tokenizer_n_tokens(g->t), g->vocab);
    uint32_t n = o->n_prompts;
    size_t cap_rows = PX_MAX(g->max_rows, n);
    g->seqs = calloc(n, sizeof *g->seqs);
    g->wire = calloc(n, sizeof *g->wire);
    g->step_of = calloc(n, sizeof *g->step_of);
    g->pos = calloc(n, sizeof *g->pos);
    g->n_tokens = calloc(n, sizeof *g->n_tokens);
    g->kept = calloc(2 * (size_t)n, sizeof *g->kept);
    g->tokens = calloc(cap_rows, sizeof *g->tokens);
    g->logits = malloc(g->vocab * sizeof(float));
    if (!g->seqs || !g->wire || !g->step_of || !g->pos || !g->n_tokens || !g->kept || !g->tokens ||
        !g->logits)
        return px_err_set(err, PX_ENOMEM, "generate: out of memory");
    for (uint32_t i = 0; i < n; i++)
        g->seqs[i].seq = -1;
    for (uint32_t i = 0; i < n; i++) {
        px__rt_gen_seq *q = &g->seqs[i];
        const char *text = o->prompts[i] ? o->prompts[i] : "";
        size_t cap = (size_t)g->context + 1;
        q->prompt = malloc(cap * sizeof *q->prompt);
        if (!q->prompt)
            return px_err_set(err, PX_ENOMEM, "generate: out of memory");
        px_status st = px_rt_tokenizer_encode(g->t, text, strlen(text), PX_RT_ENCODE_BOS, q->prompt,
                                              cap, &q->n_prompt, err);
        if (st == PX_OK && q->n_prompt > g->context)
            st = PX_ELIMIT;
        if (st == PX_ELIMIT && q->n_prompt > 0)
            return px_err_set(err, PX_ELIMIT,
                              "prompt %u is %zu tokens long (BOS included); the "
                              "context holds %u: shorten it",
                              i + 1, q->n_prompt, g->context);
        if (st)
            return st;
        if ((st = px__rt_gen_reset_seq(g, i, err)))
            return st;
    }
    return PX_OK;
}

px_status px_rt_executor_generate(px_rt_executor *ex, const px_rt_tokenizer *t,
                                  const px_rt_generate_opts *o, px_rt_pipeline_stats *stats,
                                  px_err *err)
{
    px_rt_pipeline_stats local;
    px_rt_pipeline_stats *st_out = stats ? stats : &local;
    memset(st_out, 0, sizeof *st_out);
    if (px__rt_exec_failed(ex))
        return px_err_set(err, PX_ESTATE,
                          "generate: the pipeline failed before; start a new "
                          "one");
    const px_rt_pipeline_spec *spec = px__rt_exec_spec(ex);
    const px_ir_hparams *hp = px_rt_model_hparams(px__rt_exec_model(ex));
    px__rt_gen g = {.ex = ex,
                    .t = t,
                    .o = o,
                    .sup = o ? o->supervisor : NULL,
                    .st = st_out,
                    .n_stages = spec->n_stages,
                    .vocab = hp->vocab_size,
                    .dim = hp->dim};
    st_out->n_stages = spec->n_stages;
    st_out->n_prompts = o ? o->n_prompts : 0;
    bool ring_used = false;
    px_status st = prepare(&g, err);
    if (st)
        goto done;
    ring_used = true;
    st = px__rt_gen_join(&g, err);
    g.t_start = px_now_ns();
    for (;;) {
        if (st == PX_OK && !g.restart)
            st = prefill(&g, err);
        if (st == PX_OK && !g.restart)
            st = decode(&g, err);
        if (st == PX_OK && g.restart) {
            st = px__rt_gen_switch_over(&g, err);
            continue;
        }
        if (st && g.ring_error && !g.ex_failed && g.sup && g.sup->recover) {
            if ((st = px__rt_gen_recover(&g, st, err)) == PX_OK)
                continue;
        }
        break;
    }
    if (st == PX_OK) {
        px__rt_gen_finish_rebuild(&g);
        for (uint32_t i = 0; i < o->n_prompts; i++)
            st_out->gen.n_stopped_at_context += g.seqs[i].at_context;
        st = gather_stats(&g, err);
    }
    if (st == PX_OK)
        st = px__rt_gen_leave(&g, err);
done:
    if (st && ring_used && !g.ex_failed)
        st = px__rt_exec_fail(g.ex, st, err);
    if (g.seqs)
        for (uint32_t i = 0; i < o->n_prompts; i++) {
            px_rt_sampler_free(g.seqs[i].sampler);
            free(g.seqs[i].prompt);
        }
    free(g.seqs);
    free(g.wire);
    free(g.step_of);
    free(g.pos);
    free(g.n_tokens);
    free(g.kept);
    free(g.tokens);
    free(g.logits);
    free(g.log.steps);
    free(g.log.prompt);
    free(g.log.token);
    if (st || !stats)
        px_rt_pipeline_stats_release(st_out);
    return st;
}
