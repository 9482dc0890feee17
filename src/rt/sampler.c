/*
 * Sampling, as llama2.c does it: greedy at temperature 0; otherwise
 * softmax of logits / temperature, then either a draw from the whole
 * distribution or nucleus (top-p) sampling.  Random numbers come from
 * px_rng, so a seed gives the same draws on every machine; sorting uses a
 * total order (probability, then id) so ties never depend on the C
 * library's qsort (which may also allocate).
 */
#include "base/common.h"

#include "rt/rt_impl.h"

typedef struct prob_index {
    float prob;
    int32_t index;
} prob_index;

struct px_rt_sampler {
    uint32_t vocab;
    px_rt_sampler_opts o;
    px_rng rng;
    prob_index *candidates; /* vocab entries, allocated once */
};

px_status px_rt_sampler_new(uint32_t vocab_size, const px_rt_sampler_opts *o, px_rt_sampler **out,
                            px_err *err)
{
    *out = NULL;
    px_rt_sampler_opts d = {0};
    if (!o)
        o = &d;
    if (vocab_size == 0)
        return px_err_set(err, PX_EINVAL, "sampler: vocabulary size 0");
    if (!isfinite(o->temperature) || o->temperature < 0)
        return px_err_set(err, PX_EINVAL,
                          "sampler: temperature %g must be 0 (greedy) or "
                          "positive",
                          (double)o->temperature);
    if (!(o->top_p >= 0 && o->top_p <= 1))
        return px_err_set(err, PX_EINVAL, "sampler: top-p %g must lie in [0, 1]", (double)o->top_p);
    if (!(o->min_p >= 0 && o->min_p <= 1))
        return px_err_set(err, PX_EINVAL, "sampler: min-p %g must lie in [0, 1]", (double)o->min_p);
    px_rt_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->candidates = malloc(vocab_size * sizeof *s->candidates))) {
        free(s);
        return px_err_set(err, PX_ENOMEM, "sampler: out of memory");
    }
    s->vocab = vocab_size;
    s->o = *o;
    px_rng_seed(&s->rng, o->seed);
    *out = s;
    return PX_OK;
}

void px_rt_sampler_free(px_rt_sampler *s)
{
    if (!s)
        return;
    free(s->candidates);
    free(s);
}

static void softmax(float *x, uint32_t n)
{
    float max = x[0];
    for (uint32_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (uint32_t i = 0; i < n; i++)
        x[i] = (float)(x[i] / sum);
}

static int32_t sample_all(const float *p, uint32_t n, double coin)
{
    double cdf = 0;
    for (uint32_t i = 0; i < n; i++) {
        cdf += p[i];
        if (coin < cdf)
            return (int32_t)i;
    }
    return (int32_t)n - 1; /* rounding */
}

/* Whether a sorts after b: by probability descending, then id. */
static bool after(const prob_index *a, const prob_index *b)
{
    if (a->prob != b->prob)
        return a->prob < b->prob;
    return a->index > b->index;
}

static void sift_down(prob_index *v, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && after(&v[c + 1], &v[c]))
            c++;
        if (!after(&v[c], &v[i]))
            return;
        prob_index t = v[i];
        v[i] = v[c];
        v[c] = t;
        i = c;
    }
}

/* Heapsort: in place, unlike the C library's qsort, which may allocate. */
static void sort_desc(prob_index *v, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(v, i, n);
    for (size_t end = n; end > 1; end--) {
        prob_index t = v[0];
        v[0] = v[end - 1];
        v[end - 1] = t;
        sift_down(v, 0, end - 1);
    }
}

/* A heap whose root is the least likely of the tokens it keeps. */
static void sift_down_worst(prob_index *v, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && after(&v[c + 1], &v[c]))
            c++;
        if (!after(&v[c], &v[i]))
            return;
        prob_index t = v[i];
        v[i] = v[c];
        v[c] = t;
        i = c;
    }
}

/* The k most likely tokens, most likely first: a heap of k, replacing
 * its least likely whenever a likelier token comes. */
static uint32_t top_k(px_rt_sampler *s, const float *p, uint32_t k)
{
    prob_index *v = s->candidates;
    for (uint32_t i = 0; i < k; i++)
        v[i] = (prob_index){p[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;)
        sift_down_worst(v, i, k);
    for (uint32_t i = k; i < s->vocab; i++) {
        prob_index c = {p[i], (int32_t)i};
        if (after(&v[0], &c)) {
            v[0] = c;
            sift_down_worst(v, 0, k);
        }
    }
    sort_desc(v, k);
    return k;
}

/* Nucleus sampling: the smallest set of most likely tokens whose
 * probabilities add up to more than top_p, renormalised.  Tokens below
 * (1 - top_p) / (n - 1) cannot be in that set and are dropped before
 * sorting (llama2.c's shortcut).  With top_k the set is drawn from the k
 * most likely tokens only. */
static int32_t sample_top_p(px_rt_sampler *s, const float *p, double coin)
{
    uint32_t n = s->vocab, n0 = 0;
    bool nucleus = s->o.top_p > 0 && s->o.top_p < 1;
    if (s->o.top_k > 0 && s->o.top_k < n) {
        n0 = top_k(s, p, s->o.top_k);
    } else if (s->o.min_p > 0 && !nucleus) {
        for (uint32_t i = 0; i < n; i++)
            s->candidates[n0++] = (prob_index){p[i], (int32_t)i};
        sort_desc(s->candidates, n0);
    } else {
        float cutoff = n > 1 ? (1.0f - s->o.top_p) / (float)(n - 1) : 0.0f;
        for (uint32_t i = 0; i < n; i++)
            if (p[i] >= cutoff)
                s->candidates[n0++] = (prob_index){p[i], (int32_t)i};
        if (n0 == 0)
            return px_rt_argmax(p, n);
        sort_desc(s->candidates, n0);
    }
    /* min-p: only tokens at least min_p times as likely as the first. */
    if (s->o.min_p > 0) {
        float floor = s->o.min_p * s->candidates[0].prob;
        uint32_t keep = 1;
        while (keep < n0 && s->candidates[keep].prob >= floor)
            keep++;
        n0 = keep;
    }
    /* After top-k or min-p the nucleus is taken of the tokens' own mass. */
    double mass = 1;
    if ((s->o.top_k > 0 && s->o.top_k < n) || s->o.min_p > 0) {
        mass = 0;
        for (uint32_t i = 0; i < n0; i++)
            mass += s->candidates[i].prob;
    }
    double cum = 0;
    uint32_t last = n0 - 1;
    for (uint32_t i = 0; i < n0; i++) {
        cum += s->candidates[i].prob;
        if (nucleus && cum > s->o.top_p * mass) {
            last = i;
            break;
        }
    }
    double r = coin * cum, cdf = 0;
    for (uint32_t i = 0; i <= last; i++) {
        cdf += s->candidates[i].prob;
        if (r < cdf)
            return s->candidates[i].index;
    }
    return s->candidates[last].index;
}

void px__rt_sampler_rewind(px_rt_sampler *s, uint32_t n)
{
    px_rng_seed(&s->rng, s->o.seed);
    if (s->o.temperature == 0)
        return;
    for (uint32_t i = 0; i < n; i++)
        (void)px_rng_uniform(&s->rng);
}

int32_t px_rt_sampler_sample(px_rt_sampler *s, float *logits)
{
    if (s->o.temperature == 0)
        return px_rt_argmax(logits, s->vocab);
    for (uint32_t i = 0; i < s->vocab; i++)
        logits[i] /= s->o.temperature;
    softmax(logits, s->vocab);
    double coin = px_rng_uniform(&s->rng);
    bool limited = (s->o.top_k > 0 && s->o.top_k < s->vocab) || s->o.min_p > 0;
    if (!limited && (s->o.top_p <= 0 || s->o.top_p >= 1))
        return sample_all(logits, s->vocab, coin);
    return sample_top_p(s, logits, coin);
}
