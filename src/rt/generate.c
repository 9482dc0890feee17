/*
 * Text generation: prompts in, tokens out, several prompts decoding
 * together as one batch.  Prefill packs the prompts' tokens into steps of
 * at most max_batch_tokens rows (a prompt may span steps, a step may hold
 * several prompts); decode then runs one token per unfinished prompt per
 * step.
 */
#include "base/common.h"

#include "rt/rt_impl.h"

typedef struct seq_state {
    int32_t seq;     /* session sequence id, -1 before it is added */
    int32_t *prompt; /* BOS + prompt tokens */
    size_t n_prompt;
    size_t n_fed; /* prompt tokens prefilled so far */
    int32_t last; /* the last token (prompt or produced) */
    uint32_t n_new;
    bool done;
    px_rt_sampler *sampler;
} seq_state;

typedef struct gen {
    px_rt_session *s;
    const px_rt_tokenizer *t;
    const px_rt_generate_opts *o;
    px_rt_generate_stats *st;
    seq_state *seqs;
    px_rt_seq_step *steps;
    uint32_t *step_of; /* the prompt of each step entry */
    float *logits;     /* a writable copy of one row */
} gen;

/* Samples the next token of prompt i from a row of logits, reports it and
 * decides whether the prompt is finished. */
static px_status produce(gen *g, uint32_t i, const float *row, bool in_decode, px_err *err)
{
    seq_state *q = &g->seqs[i];
    uint32_t vocab = g->s->model->hp.vocab_size;
    memcpy(g->logits, row, vocab * sizeof(float));
    int32_t next = px_rt_sampler_sample(q->sampler, g->logits);
    bool stop = !g->o->ignore_eos &&
                (next == px_rt_tokenizer_eos(g->t) || next == px_rt_tokenizer_bos(g->t));
    if (stop) {
        q->done = true;
        return PX_OK;
    }
    q->n_new++;
    g->st->new_tokens++;
    if (in_decode)
        g->st->decode_tokens++;
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
    } else if (px_rt_seq_len(g->s, q->seq) >= g->s->context) {
        q->done = true;
        g->st->n_stopped_at_context++;
    }
    return PX_OK;
}

static px_status prefill(gen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    uint64_t t0 = px_now_ns();
    for (;;) {
        uint32_t n_steps = 0, rows = 0;
        for (uint32_t i = 0; i < n && rows < g->s->max_rows; i++) {
            seq_state *q = &g->seqs[i];
            if (q->n_fed == q->n_prompt)
                continue;
            uint32_t k = (uint32_t)PX_MIN(q->n_prompt - q->n_fed, (size_t)(g->s->max_rows - rows));
            g->steps[n_steps] = (px_rt_seq_step){.seq = q->seq,
                                                 .pos = (uint32_t)q->n_fed,
                                                 .n_tokens = k,
                                                 .tokens = q->prompt + q->n_fed};
            g->step_of[n_steps++] = i;
            rows += k;
        }
        if (n_steps == 0)
            break;
        px_rt_batch b = {.n_seqs = n_steps, .seqs = g->steps};
        px_rt_output out;
        px_status st = px_rt_forward(g->s, &b, NULL, &out, err);
        if (st)
            return st;
        for (uint32_t j = 0; j < n_steps; j++) {
            seq_state *q = &g->seqs[g->step_of[j]];
            q->n_fed += g->steps[j].n_tokens;
            g->st->prompt_tokens += g->steps[j].n_tokens;
            if (q->n_fed < q->n_prompt)
                continue;
            q->last = q->prompt[q->n_prompt - 1];
            if (g->o->max_new_tokens == 0) {
                q->done = true;
                continue;
            }
            if ((st = produce(g, g->step_of[j], out.data + (size_t)j * out.row_len, false, err)) !=
                PX_OK)
                return st;
        }
    }
    g->st->prefill_ns = px_now_ns() - t0;
    return PX_OK;
}

static px_status decode(gen *g, px_err *err)
{
    uint32_t n = g->o->n_prompts;
    uint64_t t0 = px_now_ns();
    for (;;) {
        uint32_t n_steps = 0;
        for (uint32_t i = 0; i < n; i++) {
            seq_state *q = &g->seqs[i];
            if (q->done)
                continue;
            g->steps[n_steps] = (px_rt_seq_step){.seq = q->seq,
                                                 .pos = (uint32_t)px_rt_seq_len(g->s, q->seq),
                                                 .n_tokens = 1,
                                                 .tokens = &q->last};
            g->step_of[n_steps++] = i;
        }
        if (n_steps == 0)
            break;
        px_rt_batch b = {.n_seqs = n_steps, .seqs = g->steps};
        px_rt_output out;
        px_status st = px_rt_forward(g->s, &b, NULL, &out, err);
        if (st)
            return st;
        for (uint32_t j = 0; j < n_steps; j++)
            if ((st = produce(g, g->step_of[j], out.data + (size_t)j * out.row_len, true, err)) !=
                PX_OK)
                return st;
    }
    g->st->decode_ns = px_now_ns() - t0;
    return PX_OK;
}

static px_status check(const px_rt_session *s, const px_rt_tokenizer *t,
                       const px_rt_generate_opts *o, px_err *err)
{
    if (!s->has_embedding || !s->has_head)
        return px_err_set(err, PX_EINVAL,
                          "generate: the session holds layers [%u, %u) of %u; "
                          "generation needs the whole model",
                          s->layer_begin, s->layer_end, s->model->hp.n_layers);
    if (!o || o->n_prompts == 0 || !o->prompts)
        return px_err_set(err, PX_EINVAL, "generate: no prompt");
    if (o->n_prompts > s->max_seqs)
        return px_err_set(err, PX_EINVAL,
                          "generate: %u prompts; the session decodes at most %u "
                          "sequences together (max_seqs)",
                          o->n_prompts, s->max_seqs);
    if (px_rt_tokenizer_n_tokens(t) > s->model->hp.vocab_size)
        return px_err_set(err, PX_EINVAL,
                          "generate: the tokenizer has %u tokens, the model "
                          "only %u: they do not belong together",
                          px_rt_tokenizer_n_tokens(t), s->model->hp.vocab_size);
    for (uint32_t i = 0; i < s->max_seqs; i++)
        if (s->seq_len[i] >= 0)
            return px_err_set(err, PX_ESTATE,
                              "generate: the session already has sequences; "
                              "use a fresh session");
    return PX_OK;
}

px_status px_rt_generate(px_rt_session *s, const px_rt_tokenizer *t, const px_rt_generate_opts *o,
                         px_rt_generate_stats *stats, px_err *err)
{
    px_rt_generate_stats local;
    px_rt_generate_stats *st_out = stats ? stats : &local;
    memset(st_out, 0, sizeof *st_out);
    px_status st = check(s, t, o, err);
    if (st)
        return st;
    uint32_t n = o->n_prompts;
    gen g = {.s = s, .t = t, .o = o, .st = st_out};
    g.seqs = calloc(n, sizeof *g.seqs);
    g.steps = calloc(n, sizeof *g.steps);
    g.step_of = calloc(n, sizeof *g.step_of);
    g.logits = malloc(s->model->hp.vocab_size * sizeof(float));
    if (!g.seqs || !g.steps || !g.step_of || !g.logits) {
        st = px_err_set(err, PX_ENOMEM, "generate: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++)
        g.seqs[i].seq = -1;
    for (uint32_t i = 0; i < n; i++) {
        seq_state *q = &g.seqs[i];
        const char *text = o->prompts[i] ? o->prompts[i] : "";
        size_t cap = (size_t)s->context + 1;
        q->prompt = malloc(cap * sizeof *q->prompt);
        if (!q->prompt) {
            st = px_err_set(err, PX_ENOMEM, "generate: out of memory");
            goto done;
        }
        st = px_rt_tokenizer_encode(t, text, strlen(text), PX_RT_ENCODE_BOS, q->prompt, cap,
                                    &q->n_prompt, err);
        if (st == PX_OK && q->n_prompt > s->context)
            st = PX_ELIMIT;
        if (st == PX_ELIMIT && q->n_prompt > 0) {
            st = px_err_set(err, PX_ELIMIT,
                            "prompt %u is %zu tokens long (BOS included); the "
                            "context holds %u: shorten it",
                            i + 1, q->n_prompt, s->context);
            goto done;
        }
        if (st)
            goto done;
        px_rt_sampler_opts so = o->sampling;
        so.seed += i;
        if ((st = px_rt_sampler_new(s->model->hp.vocab_size, &so, &q->sampler, err)) ||
            (st = px_rt_seq_add(s, &q->seq, err)))
            goto done;
    }
    if ((st = prefill(&g, err)) == PX_OK)
        st = decode(&g, err);
done:
    if (g.seqs)
        for (uint32_t i = 0; i < n; i++) {
            if (g.seqs[i].seq >= 0)
                px_rt_seq_remove(s, g.seqs[i].seq, NULL);
            px_rt_sampler_free(g.seqs[i].sampler);
            free(g.seqs[i].prompt);
        }
    free(g.seqs);
    free(g.steps);
    free(g.step_of);
    free(g.logits);
    return st;
}
