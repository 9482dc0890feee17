/*
 * Text generation for a list of prompts, in one process (px_rt_generate)
 * or through a pipeline (px_rt_executor_generate): both tokenize the
 * prompts (unless the caller has) and hand them to the generation engine
 * as requests, which
 * batches them continuously (engine*.c).  Prompt i samples with seed + i.
 */
#include "base/common.h"

#include "rt/engine_impl.h"

typedef struct gen gen;

/* One prompt's request. */
typedef struct gen_prompt {
    gen *g;
    uint32_t index;
    const int32_t *ids; /* owned by `owned`, or borrowed from the options */
    size_t n_ids;
    int32_t *owned;
} gen_prompt;

struct gen {
    const px_rt_generate_opts *o;
    gen_prompt *p;
    px_status failed; /* the first request that ended in error */
    px_err why;
};

static bool on_token(void *ud, const px_rt_token_event *ev)
{
    gen_prompt *p = ud;
    const px_rt_generate_opts *o = p->g->o;
    if (o->on_token && ev->piece)
        o->on_token(p->index, ev->token, ev->piece, ev->len, o->ud);
    else if (o->on_token)
        o->on_token(p->index, ev->token, "", 0, o->ud);
    return true;
}

static void on_finish(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err)
{
    (void)id;
    (void)st;
    gen_prompt *p = ud;
    if (why == PX_RT_FINISH_ERROR && !p->g->failed) {
        p->g->failed = err ? err->code : PX_EIO;
        if (err)
            p->g->why = *err;
    }
}

/* Tokenizes every prompt (BOS first), unless the options carry them
 * tokenized, and refuses one longer than the context. */
static px_status encode_all(gen *g, const px_rt_tokenizer *t, uint32_t context, px_err *err)
{
    const px_rt_generate_opts *o = g->o;
    g->p = calloc(o->n_prompts, sizeof *g->p);
    if (!g->p)
        return px_err_set(err, PX_ENOMEM, "generate: out of memory");
    for (uint32_t i = 0; i < o->n_prompts; i++) {
        gen_prompt *p = &g->p[i];
        p->g = g;
        p->index = i;
        px_status st = PX_OK;
        if (o->prompt_tokens) {
            p->ids = o->prompt_tokens[i];
            p->n_ids = o->n_prompt_tokens[i];
            if (p->n_ids > context)
                st = PX_ELIMIT;
        } else {
            const char *text = o->prompts[i] ? o->prompts[i] : "";
            size_t cap = (size_t)context + 1;
            if (!(p->owned = malloc(cap * sizeof *p->owned)))
                return px_err_set(err, PX_ENOMEM, "generate: out of memory");
            p->ids = p->owned;
            st = px_rt_tokenizer_encode(t, text, strlen(text), PX_RT_ENCODE_BOS, p->owned, cap,
                                        &p->n_ids, err);
            if (st == PX_OK && p->n_ids > context)
                st = PX_ELIMIT;
        }
        if (st == PX_ELIMIT && p->n_ids > 0)
            return px_err_set(err, PX_ELIMIT,
                              "prompt %u is %zu tokens long (BOS included); the context holds "
                              "%u: shorten it",
                              i + 1, p->n_ids, context);
        if (st)
            return st;
    }
    return PX_OK;
}

static void release(gen *g)
{
    if (g->p)
        for (uint32_t i = 0; i < g->o->n_prompts; i++)
            free(g->p[i].owned);
    free(g->p);
}

/* Submits every prompt and runs the engine until all are done. */
static px_status run_all(gen *g, px_rt_engine *e, px_err *err)
{
    const px_rt_generate_opts *o = g->o;
    for (uint32_t i = 0; i < o->n_prompts; i++) {
        px_rt_sampler_opts so = o->sampling;
        so.seed += i;
        px_rt_request r = {.prompt = g->p[i].ids,
                           .n_prompt = (uint32_t)g->p[i].n_ids,
                           .max_new_tokens = o->max_new_tokens,
                           .sampling = so,
                           .ignore_eos = o->ignore_eos,
                           .on_token = on_token,
                           .on_finish = on_finish,
                           .ud = &g->p[i]};
        uint64_t id;
        px_status st = px_rt_engine_submit(e, &r, &id, err);
        if (st)
            return st;
    }
    px_status st = px_rt_engine_run(e, err);
    if (st == PX_OK && g->failed) {
        st = g->failed;
        if (err)
            *err = g->why;
    }
    return st;
}

static px_status check_prompts(const px_rt_generate_opts *o, px_err *err)
{
    if (!o || o->n_prompts == 0 || (!o->prompts && !o->prompt_tokens))
        return px_err_set(err, PX_EINVAL, "generate: no prompt");
    if (o->prompt_tokens && !o->n_prompt_tokens)
        return px_err_set(err, PX_EINVAL,
                          "generate: prompt_tokens given without n_prompt_tokens: pass both");
    return PX_OK;
}

px_status px_rt_generate(px_rt_session *s, const px_rt_tokenizer *t, const px_rt_generate_opts *o,
                         px_rt_generate_stats *stats, px_err *err)
{
    px_rt_generate_stats local;
    px_rt_generate_stats *out = stats ? stats : &local;
    memset(out, 0, sizeof *out);
    px_status st = check_prompts(o, err);
    if (st)
        return st;
    gen g = {.o = o};
    px_rt_pipeline_stats ps;
    px_rt_engine *e = NULL;
    px_rt_engine_opts eo = {.session = s, .tokenizer = t, .stats = &ps};
    if ((st = px_rt_engine_new(&eo, &e, err)) == PX_OK &&
        (st = encode_all(&g, t, s->context, err)) == PX_OK)
        st = run_all(&g, e, err);
    if (e)
        *out = ps.gen;
    px_rt_engine_free(e);
    release(&g);
    return st;
}

px_status px_rt_executor_generate(px_rt_executor *ex, const px_rt_tokenizer *t,
                                  const px_rt_generate_opts *o, px_rt_pipeline_stats *stats,
                                  px_err *err)
{
    px_rt_pipeline_stats local;
    px_rt_pipeline_stats *out = stats ? stats : &local;
    memset(out, 0, sizeof *out);
    if (ex->failed)
        return px_err_set(err, PX_ESTATE, "generate: the pipeline failed before; start a new one");
    px_status st = check_prompts(o, err);
    if (st)
        return st;
    gen g = {.o = o};
    px_rt_engine *e = NULL;
    px_rt_engine_opts eo = {
        .executor = ex, .tokenizer = t, .supervisor = o->supervisor, .stats = out};
    bool ran = false;
    if ((st = px_rt_engine_new(&eo, &e, err)) == PX_OK &&
        (st = encode_all(&g, t, ex->context, err)) == PX_OK) {
        ran = true;
        st = run_all(&g, e, err);
    }
    out->n_prompts = o->n_prompts;
    if (st == PX_OK)
        st = px_rt_engine_gather_stats(e, err);
    /* A failure once the ring was used leaves it unusable (the engine may
     * have moved to an executor the supervisor handed it; one that failed
     * on the ring is already marked). */
    px_rt_executor *now = e ? px_rt_engine_executor(e) : ex;
    if (st && ran && now && !now->failed)
        st = px__rt_exec_fail(now, st, err);
    px_rt_engine_free(e);
    release(&g);
    if (st || !stats)
        px_rt_pipeline_stats_release(out);
    return st;
}
