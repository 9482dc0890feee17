/*
 * Generation through the pipeline: the loop of px_rt_generate (the same
 * prefill packing and stopping rules, so that output matches a single
 * process bit for bit), with each step sent around the ring of stage
 * workers, and the stages' telemetry gathered on the way.
 */
#include "base/common.h"

#include "rt/pipeline_impl.h"

typedef struct pseq {
    int32_t seq;
    int32_t *prompt;
    size_t n_prompt, n_fed;
    int64_t len; /* positions cached in the stages */
    int32_t last;
    uint32_t n_new;
    bool done;
    px_rt_sampler *sampler;
} pseq;

typedef struct pgen {
    px_rt_executor *ex;
    const px_rt_tokenizer *t;
    const px_rt_generate_opts *o;
    px_rt_pipeline_stats *st;
    uint32_t vocab, context, max_rows, n_stages;
    pseq *seqs;
    px__rt_step_seq *wire; /* the step's sequences as sent */
    uint32_t *step_of;
    int32_t *tokens; /* the step's tokens */
    float *logits;
    uint64_t t_start;
    bool first_token;
} pgen;

static px_status produce(pgen *g, uint32_t i, const float *row, bool in_decode, px_err *err)
{
    pseq *q = &g->seqs[i];
    memcpy(g->logits, row, g->vocab * sizeof(float));
    int32_t next = px_rt_sampler_sample(q->sampler, g->logits);
    if (!g->first_token) {
        g->first_token = true;
        g->st->ttft_ns = px_now_ns() - g->t_start;
    }
    bool stop = !g->o->ignore_eos &&
                (next == px_rt_tokenizer_eos(g->t) || next == px_rt_tokenizer_bos(g->t));
    if (stop) {
        q->done = true;
        return PX_OK;
    }
    q->n_new++;
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
    q->last = next;
    if (q->n_new >= g->o->max_new_tokens) {
        q->done = true;
    } else if (q->len >= g->context) {
        q->done = true;
        g->st->gen.n_stopped_at_context++;
    }
    return PX_OK;
}

/* Books the stages' records of one step. */
static void book(pgen *g, const px__rt_stage_record *recs, uint32_t n, uint64_t sent, uint64_t got,
                 bool prefill)
{
    uint64_t prev = sent;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t s = recs[k].stage;
        if (s >= g->n_stages)
            continue;
        px_rt_stage_stats *ss = &g->st->stages[s];
        uint64_t hop = recs[k].recv_done_ns > prev ? recs[k].recv_done_ns - prev : 0;
        if (prefill) {
            ss->prefill_steps++;
            ss->prefill_rows += recs[k].rows;
            ss->prefill_ns += recs[k].compute_ns;
            ss->xfer_in_prefill_ns += hop;
        } else {
            ss->decode_steps++;
            ss->decode_ns += recs[k].compute_ns;
            ss->xfer_in_decode_ns += hop;
        }
        prev = recs[k].send_start_ns;
    }
    uint64_t out = got > prev ? got - prev : 0;
    if (prefill)
        g->st->xfer_out_prefill_ns += out;
    else
        g->st->xfer_out_decode_ns += out;
}

/* Sends a frame to stage 0.  When that fails, the stage that saw the
 * broken frame may say so around the ring: its word is the better
 * message. */
static px_status send_first(pgen *g, px_rt_frame_type type, const void *const *parts,
                            const uint32_t *lens, uint32_t n, px_err *err)
{
    px_status st = px_rt_conn_sendv(px__rt_exec_first(g->ex), type, 0, parts, lens, n, err);
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

/* Sends a step of n entries (g->wire, g->tokens) and returns its logits
 * (one row per entry, in the connection's buffer). */
static px_status run_step(pgen *g, uint32_t n, uint32_t rows, bool prefill, const float **logits,
                          px_err *err)
{
    px__rt_step_head h = {
        .n_seqs = n, .n_rows = rows, .row_len = 0, .n_records = 0, .prefill = prefill};
    const void *parts[3] = {&h, g->wire, g->tokens};
    uint32_t lens[3] = {sizeof h, n * (uint32_t)sizeof *g->wire, rows * 4};
    uint64_t sent = px_now_ns();
    px_status st = send_first(g, PX_RT_FRAME_STEP, parts, lens, 3, err);
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
        want != fh.length)
        return px_err_set(err, PX_EPARSE,
                          "the result of a step has %u rows of %u logits and %u "
                          "stage records; expected %u rows of %u and %u",
                          rh.n_rows, rh.row_len, rh.n_records, n, g->vocab, g->n_stages);
    *logits = (const float *)(p + sizeof rh);
    px__rt_stage_record recs[PX_RT_MAX_STAGES];
    memcpy(recs, p + sizeof rh + (size_t)rh.n_rows * rh.row_len * 4,
           (size_t)rh.n_records * sizeof *recs);
    book(g, recs, rh.n_records, sent, got, prefill);
    return PX_OK;
}

static px_status prefill(pgen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    uint64_t t0 = px_now_ns();
    for (;;) {
        uint32_t n_steps = 0, rows = 0;
        for (uint32_t i = 0; i < n && rows < g->max_rows; i++) {
            pseq *q = &g->seqs[i];
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
        px_status st = run_step(g, n_steps, rows, true, &logits, err);
        if (st)
            return st;
        for (uint32_t j = 0; j < n_steps; j++) {
            pseq *q = &g->seqs[g->step_of[j]];
            q->n_fed += g->wire[j].n_tokens;
            q->len = (int64_t)q->n_fed;
            g->st->gen.prompt_tokens += g->wire[j].n_tokens;
            if (q->n_fed < q->n_prompt)
                continue;
            q->last = q->prompt[q->n_prompt - 1];
            if (g->o->max_new_tokens == 0) {
                q->done = true;
                continue;
            }
            if ((st = produce(g, g->step_of[j], logits + (size_t)j * g->vocab, false, err)))
                return st;
        }
    }
    g->st->gen.prefill_ns = px_now_ns() - t0;
    return PX_OK;
}

static px_status decode(pgen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    uint64_t t0 = px_now_ns();
    for (;;) {
        uint32_t n_steps = 0;
        for (uint32_t i = 0; i < n; i++) {
            pseq *q = &g->seqs[i];
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
        px_status st = run_step(g, n_steps, n_steps, false, &logits, err);
        if (st)
            return st;
        g->st->decode_steps++;
        for (uint32_t j = 0; j < n_steps; j++) {
            g->seqs[g->step_of[j]].len++;
            if ((st = produce(g, g->step_of[j], logits + (size_t)j * g->vocab, true, err)))
                return st;
        }
    }
    g->st->gen.decode_ns = px_now_ns() - t0;
    return PX_OK;
}

/* Sends a sequence control frame around the ring and waits for it. */
static px_status seq_op(pgen *g, uint32_t op, int32_t seq, px_err *err)
{
    px__rt_seq_msg m = {.op = op, .seq = seq};
    const void *parts[1] = {&m};
    uint32_t lens[1] = {sizeof m};
    px_status st = send_first(g, PX_RT_FRAME_SEQ, parts, lens, 1, err);
    px_rt_frame_header h;
    const uint8_t *p;
    if (st == PX_OK)
        st = px__rt_exec_recv(g->ex, PX_RT_FRAME_SEQ, &h, &p, err);
    return st;
}

static px_status gather_stats(pgen *g, px_err *err)
{
    px_status st = send_first(g, PX_RT_FRAME_STATS, NULL, NULL, 0, err);
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

static px_status prepare(pgen *g, px_err *err)
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
    g->tokens = calloc(cap_rows, sizeof *g->tokens);
    g->logits = malloc(g->vocab * sizeof(float));
    if (!g->seqs || !g->wire || !g->step_of || !g->tokens || !g->logits)
        return px_err_set(err, PX_ENOMEM, "generate: out of memory");
    for (uint32_t i = 0; i < n; i++)
        g->seqs[i].seq = -1;
    for (uint32_t i = 0; i < n; i++) {
        pseq *q = &g->seqs[i];
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
        px_rt_sampler_opts so = o->sampling;
        so.seed += i;
        if ((st = px_rt_sampler_new(g->vocab, &so, &q->sampler, err)))
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
    pgen g = {.ex = ex,
              .t = t,
              .o = o,
              .st = st_out,
              .n_stages = spec->n_stages,
              .vocab = px_rt_model_hparams(px__rt_exec_model(ex))->vocab_size};
    st_out->n_stages = spec->n_stages;
    st_out->n_prompts = o ? o->n_prompts : 0;
    bool ring_used = false;
    px_status st = prepare(&g, err);
    if (st)
        goto done;
    /* Sequences join: the lowest free slot, as every stage's session
     * picks it. */
    bool *used = px__rt_exec_slots(ex);
    uint32_t max_seqs, ctx, rows;
    px__rt_exec_limits(ex, &max_seqs, &ctx, &rows);
    ring_used = true;
    for (uint32_t i = 0; i < o->n_prompts && st == PX_OK; i++) {
        int32_t slot = 0;
        while ((uint32_t)slot < max_seqs && used[slot])
            slot++;
        if ((uint32_t)slot == max_seqs) {
            st = px_err_set(err, PX_ELIMIT, "generate: every sequence slot is taken");
            break;
        }
        if ((st = seq_op(&g, 1, slot, err)) == PX_OK) {
            used[slot] = true;
            g.seqs[i].seq = slot;
        }
    }
    g.t_start = px_now_ns();
    if (st == PX_OK)
        st = prefill(&g, err);
    if (st == PX_OK)
        st = decode(&g, err);
    if (st == PX_OK)
        st = gather_stats(&g, err);
    /* Sequences leave. */
    for (uint32_t i = 0; i < o->n_prompts && st == PX_OK && g.seqs; i++)
        if (g.seqs[i].seq >= 0 && (st = seq_op(&g, 2, g.seqs[i].seq, err)) == PX_OK)
            used[g.seqs[i].seq] = false;
done:
    if (st && ring_used)
        st = px__rt_exec_fail(ex, st, err);
    if (g.seqs)
        for (uint32_t i = 0; i < o->n_prompts; i++) {
            px_rt_sampler_free(g.seqs[i].sampler);
            free(g.seqs[i].prompt);
        }
    free(g.seqs);
    free(g.wire);
    free(g.step_of);
    free(g.tokens);
    free(g.logits);
    if (st || !stats)
        px_rt_pipeline_stats_release(st_out);
    return st;
}
