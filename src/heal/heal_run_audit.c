/* Healing real runs: audits against a shadow computation.  Silent
 * corruption changes no timing; it is found by recomputing an audited
 * step in this process, on the cpu backend, and comparing each stage's
 * output row with what the stage sent.  The shadow session is fed
 * lazily: it keeps every token each sequence embedded (noted before each
 * step) and, when a step is audited, first prefills what it has not seen
 * in chunks, then runs the audited token stage range by stage range. */
#include "heal/heal_run_impl.h"

struct hr_shadow {
    px_rt_model *model;
    px_rt_session *s;
    uint32_t n_prompts, context, chunk, dim, vocab;
    int32_t seq[HR_MAX_PROMPTS];
    int32_t *tokens[HR_MAX_PROMPTS]; /* context entries: the token at each position */
    uint32_t known[HR_MAX_PROMPTS];  /* positions noted */
    uint32_t valid[HR_MAX_PROMPTS];  /* positions the shadow's cache holds correctly */
    uint32_t prompt_len[HR_MAX_PROMPTS];
    float *hidden; /* dim: the previous range's output */
};

px_status px__hr_shadow_new(const char *model_path, uint32_t n_prompts, uint32_t context,
                            hr_shadow **out, px_err *err)
{
    *out = NULL;
    if (n_prompts == 0 || n_prompts > HR_MAX_PROMPTS)
        return px_err_set(err, PX_EINVAL, "heal: the audit takes 1 to %d prompts", HR_MAX_PROMPTS);
    hr_shadow *sh = calloc(1, sizeof *sh);
    if (!sh)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    px_status st = px_rt_model_open(model_path, &sh->model, err);
    if (st != PX_OK)
        goto fail;
    const px_ir_hparams *hp = px_rt_model_hparams(sh->model);
    px_rt_session_opts so = {.backend = "cpu",
                             .n_threads = 1,
                             .max_seqs = n_prompts,
                             .context = context,
                             .max_logit_rows = n_prompts};
    if ((st = px_rt_session_new(sh->model, &so, &sh->s, err)) != PX_OK)
        goto fail;
    px_rt_session_info info;
    px_rt_session_info_get(sh->s, &info);
    sh->n_prompts = n_prompts;
    sh->context = info.context;
    /* Chunks no larger than the small-batch kernels take, so that the
     * shadow's KV cache is computed the way decode steps compute theirs. */
    sh->chunk = PX_MIN(info.max_batch_tokens, (uint32_t)PX_RT_SMALL_BATCH);
    sh->dim = hp->dim;
    sh->vocab = hp->vocab_size;
    sh->hidden = calloc(PX_MAX(sh->dim, sh->vocab), sizeof *sh->hidden);
    if (!sh->hidden) {
        st = px_err_set(err, PX_ENOMEM, "heal: out of memory");
        goto fail;
    }
    for (uint32_t p = 0; p < n_prompts; p++) {
        sh->tokens[p] = calloc(sh->context, sizeof *sh->tokens[p]);
        if (!sh->tokens[p]) {
            st = px_err_set(err, PX_ENOMEM, "heal: out of memory");
            goto fail;
        }
        if ((st = px_rt_seq_add(sh->s, &sh->seq[p], err)) != PX_OK)
            goto fail;
    }
    *out = sh;
    return PX_OK;
fail:
    px__hr_shadow_free(sh);
    return st;
}

void px__hr_shadow_free(hr_shadow *sh)
{
    if (!sh)
        return;
    for (uint32_t p = 0; p < HR_MAX_PROMPTS; p++)
        free(sh->tokens[p]);
    free(sh->hidden);
    px_rt_session_free(sh->s);
    px_rt_model_free(sh->model);
    free(sh);
}

void px__hr_shadow_note(hr_shadow *sh, const px_rt_step_obs *obs)
{
    uint32_t row = 0;
    for (uint32_t i = 0; i < obs->n_seqs; i++) {
        uint32_t p = obs->prompt[i], pos = obs->pos[i], n = obs->n_tokens[i];
        for (uint32_t k = 0; k < n; k++, row++) {
            if (p >= sh->n_prompts || pos + k >= sh->context || !obs->tokens)
                continue;
            uint32_t at = pos + k;
            /* A position written again with another token (after a
             * rollback) invalidates what the shadow computed from it. */
            if (at < sh->valid[p] && sh->tokens[p][at] != obs->tokens[row])
                sh->valid[p] = at;
            sh->tokens[p][at] = obs->tokens[row];
            if (at + 1 > sh->known[p])
                sh->known[p] = at + 1;
        }
        if (obs->prefill && p < sh->n_prompts && pos + n > sh->prompt_len[p])
            sh->prompt_len[p] = pos + n;
    }
}

void px__hr_shadow_retract(hr_shadow *sh, uint32_t prompt, uint32_t kept)
{
    if (prompt >= sh->n_prompts)
        return;
    uint32_t from = sh->prompt_len[prompt] + kept;
    if (from < sh->valid[prompt])
        sh->valid[prompt] = from;
    if (from < sh->known[prompt])
        sh->known[prompt] = from;
}

/* Brings prompt p's cache up to position `upto` (exclusive). */
static px_status catch_up(hr_shadow *sh, uint32_t p, uint32_t upto, px_err *err)
{
    while (sh->valid[p] < upto) {
        uint32_t n = PX_MIN(sh->chunk, upto - sh->valid[p]);
        px_rt_seq_step step = {.seq = sh->seq[p],
                               .pos = sh->valid[p],
                               .n_tokens = n,
                               .tokens = &sh->tokens[p][sh->valid[p]]};
        px_rt_batch b = {.n_seqs = 1, .seqs = &step};
        px_rt_output out;
        px_status st = px_rt_forward(sh->s, &b, NULL, &out, err);
        if (st != PX_OK)
            return st;
        sh->valid[p] += n;
    }
    return PX_OK;
}

/* max|a - b| / rms(b): how far a stage's row is from the shadow's. */
static double rel_error(const float *a, const float *b, size_t n)
{
    double maxd = 0, ss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= maxd)) /* NAN counts as departing */
            maxd = isnan(d) ? INFINITY : d;
        ss += (double)b[i] * b[i];
    }
    double rms = sqrt(ss / (double)(n ? n : 1));
    return maxd / (rms > 1e-30 ? rms : 1e-30);
}

px_status px__hr_shadow_audit(hr_shadow *sh, const px_rt_pipeline_spec *spec,
                              const px_rt_step_obs *obs, double tolerance, int *first_bad,
                              json_t **out, px_err *err)
{
    *first_bad = -1;
    if (out)
        *out = NULL;
    if (obs->n_seqs == 0 || obs->n_tokens[0] == 0)
        return px_err_set(err, PX_EINVAL, "heal: an audited step with no rows");
    uint32_t p = obs->prompt[0], pos = obs->pos[0];
    if (p >= sh->n_prompts || pos >= sh->known[p])
        return px_err_set(err, PX_EINVAL, "heal: the audited row's tokens were not noted");
    px_status st = catch_up(sh, p, pos, err);
    if (st != PX_OK)
        return st;
    json_t *stages = json_array();
    if (!stages)
        return px_err_set(err, PX_ENOMEM, "heal: out of memory");
    const px_ir_hparams *hp = px_rt_model_hparams(sh->model);
    bool have_hidden = false;
    for (uint32_t i = 0; i < spec->n_stages && i < obs->n_stages; i++) {
        const px_rt_stage_spec *ss = &spec->stages[i];
        bool last = i + 1 == spec->n_stages;
        px_rt_seq_step step = {.seq = sh->seq[p], .pos = pos, .n_tokens = 1};
        px_rt_batch b = {.n_seqs = 1, .seqs = &step};
        if (ss->layer_begin == 0 && !have_hidden)
            step.tokens = &sh->tokens[p][pos];
        else
            b.hidden = sh->hidden;
        px_rt_forward_opts fo = {.layer_begin = ss->layer_begin,
                                 .layer_end = last ? hp->n_layers : ss->layer_end,
                                 .output = last ? PX_RT_OUTPUT_LOGITS_LAST : PX_RT_OUTPUT_HIDDEN};
        px_rt_output o;
        px_err e;
        if (ss->layer_begin == ss->layer_end && !last) {
            /* An embedding-only stage: what it sends is compared by the
             * next stage's result. */
            json_array_append_new(stages,
                                  json_pack("{s:i, s:s}", "stage", (int)i, "skipped", "no layers"));
            continue;
        }
        if ((st = px_rt_forward(sh->s, &b, &fo, &o, &e)) != PX_OK) {
            json_decref(stages);
            return px_err_set(err, st, "heal: the shadow of stage %u: %s", i, e.msg);
        }
        memcpy(sh->hidden, o.data, (size_t)o.row_len * sizeof *sh->hidden);
        have_hidden = true;
        const float *row = obs->audit[i];
        uint32_t len = obs->audit_len[i];
        double rel = row && len == o.row_len ? rel_error(row, o.data, len) : INFINITY;
        bool departs = !(rel <= tolerance);
        if (departs && *first_bad < 0)
            *first_bad = (int)i;
        json_t *j =
            json_pack("{s:i, s:s, s:b}", "stage", (int)i, "device", ss->device, "departs", departs);
        if (j)
            px__heal_set_num(j, "rel_error", rel);
        json_array_append_new(stages, j);
    }
    sh->valid[p] = pos + 1;
    if (out) {
        *out = json_pack("{s:I, s:i, s:i, s:f, s:i, s:O}", "step", (json_int_t)obs->index, "prompt",
                         (int)p, "pos", (int)pos, "tolerance", tolerance, "first_bad", *first_bad,
                         "stages", stages);
        if (!*out) {
            json_decref(stages);
            return px_err_set(err, PX_ENOMEM, "heal: out of memory");
        }
    }
    json_decref(stages);
    return PX_OK;
}
