/* Sampling: greedy, temperature, top-p, top-k and min-p, seeded and
 * reproducible. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/rt.h"

#define V 64

static void fill_logits(float *l, uint64_t seed)
{
    px_rng r;
    px_rng_seed(&r, seed);
    for (int i = 0; i < V; i++)
        l[i] = (float)(2.0 * px_rng_normal(&r));
}

/* n draws from a sampler with these options over the same logits. */
static void draws(const px_rt_sampler_opts *o, int n, int32_t *out)
{
    px_rt_sampler *s;
    px_err err;
    px_assert_ok(px_rt_sampler_new(V, o, &s, &err), &err);
    float base[V], l[V];
    fill_logits(base, 3);
    for (int i = 0; i < n; i++) {
        memcpy(l, base, sizeof l);
        out[i] = px_rt_sampler_sample(s, l);
        assert_true(out[i] >= 0 && out[i] < V);
    }
    px_rt_sampler_free(s);
}

static void test_sampler_same_seed_gives_same_tokens(void **state)
{
    (void)state;
    px_rt_sampler_opts o = {.temperature = 1.0f, .top_p = 0.9f, .seed = 1234};
    int32_t a[200], b[200], c[200];
    draws(&o, 200, a);
    draws(&o, 200, b);
    assert_memory_equal(a, b, sizeof a);
    o.seed = 1235;
    draws(&o, 200, c);
    assert_true(memcmp(a, c, sizeof a) != 0);
    /* Without top-p as well. */
    o.top_p = 1.0f;
    draws(&o, 200, a);
    draws(&o, 200, b);
    assert_memory_equal(a, b, sizeof a);
}

static void test_sampler_temperature_zero_and_tiny_top_p_are_greedy(void **state)
{
    (void)state;
    float l[V];
    fill_logits(l, 3);
    int32_t best = px_rt_argmax(l, V);
    int32_t out[100];
    draws(&(px_rt_sampler_opts){.temperature = 0.0f, .top_p = 0.9f, .seed = 5}, 100, out);
    for (int i = 0; i < 100; i++)
        assert_int_equal(out[i], best);
    draws(&(px_rt_sampler_opts){.temperature = 1.0f, .top_p = 1e-6f, .seed = 5}, 100, out);
    for (int i = 0; i < 100; i++)
        assert_int_equal(out[i], best);
    /* A very low temperature concentrates all mass on the arg-max too. */
    draws(&(px_rt_sampler_opts){.temperature = 1e-3f, .top_p = 1.0f, .seed = 5}, 100, out);
    for (int i = 0; i < 100; i++)
        assert_int_equal(out[i], best);
}

static void test_sampler_follows_the_distribution(void **state)
{
    (void)state;
    /* Three tokens with probabilities 0.5, 0.3, 0.2; the rest impossible. */
    px_rt_sampler *s;
    px_err err;
    px_assert_ok(
        px_rt_sampler_new(V, &(px_rt_sampler_opts){.temperature = 1.0f, .seed = 9}, &s, &err),
        &err);
    int counts[V] = {0};
    for (int i = 0; i < 20000; i++) {
        float l[V];
        for (int j = 0; j < V; j++)
            l[j] = -1e30f;
        l[10] = logf(0.5f);
        l[20] = logf(0.3f);
        l[30] = logf(0.2f);
        counts[px_rt_sampler_sample(s, l)]++;
    }
    assert_int_equal(counts[10] + counts[20] + counts[30], 20000);
    assert_in_range(counts[10], 9700, 10300);
    assert_in_range(counts[20], 5750, 6250);
    assert_in_range(counts[30], 3750, 4250);
    px_rt_sampler_free(s);

    /* top-p 0.7 keeps 0.5 and 0.3 (0.8 > 0.7), renormalised to 5/8, 3/8. */
    px_assert_ok(
        px_rt_sampler_new(V, &(px_rt_sampler_opts){.temperature = 1.0f, .top_p = 0.7f, .seed = 9},
                          &s, &err),
        &err);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 16000; i++) {
        float l[V];
        for (int j = 0; j < V; j++)
            l[j] = -1e30f;
        l[10] = logf(0.5f);
        l[20] = logf(0.3f);
        l[30] = logf(0.2f);
        counts[px_rt_sampler_sample(s, l)]++;
    }
    assert_int_equal(counts[30], 0);
    assert_in_range(counts[10], 9700, 10300);
    assert_in_range(counts[20], 5700, 6300);
    px_rt_sampler_free(s);
}

/* Whether token t is among the k likeliest of the logits. */
static bool in_top(const float *l, int32_t t, int k)
{
    int above = 0;
    for (int i = 0; i < V; i++)
        above += l[i] > l[t];
    return above < k;
}

static void test_sampler_top_k_and_min_p_keep_only_the_likeliest(void **state)
{
    (void)state;
    float l[V];
    fill_logits(l, 3);
    int32_t got[2000];
    /* Top-3 at a high temperature: only the three likeliest come, each of
     * them. */
    px_rt_sampler_opts k3 = {.temperature = 2.0f, .top_k = 3, .seed = 5};
    draws(&k3, 2000, got);
    int seen[V] = {0};
    for (int i = 0; i < 2000; i++) {
        assert_true(in_top(l, got[i], 3));
        seen[got[i]]++;
    }
    int distinct = 0;
    for (int i = 0; i < V; i++)
        distinct += seen[i] > 0;
    assert_int_equal(distinct, 3);
    /* Min-p: only tokens at least half as likely as the likeliest (at
     * temperature 1, logits within ln 2 of the largest). */
    px_rt_sampler_opts mp = {.temperature = 1.0f, .min_p = 0.5f, .seed = 5};
    draws(&mp, 2000, got);
    float max = l[px_rt_argmax(l, V)];
    for (int i = 0; i < 2000; i++)
        assert_true(l[got[i]] >= max - logf(2.0f) - 1e-5f);
    /* top_k 1 is greedy whatever the temperature. */
    px_rt_sampler_opts k1 = {.temperature = 5.0f, .top_k = 1, .seed = 9};
    draws(&k1, 50, got);
    for (int i = 0; i < 50; i++)
        assert_int_equal(got[i], px_rt_argmax(l, V));
}

static void test_sampler_rejects_bad_options(void **state)
{
    (void)state;
    px_rt_sampler *s;
    px_err err;
    assert_int_equal(px_rt_sampler_new(V, &(px_rt_sampler_opts){.temperature = -1}, &s, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "temperature");
    assert_int_equal(px_rt_sampler_new(V, &(px_rt_sampler_opts){.temperature = NAN}, &s, &err),
                     PX_EINVAL);
    assert_int_equal(px_rt_sampler_new(V, &(px_rt_sampler_opts){.top_p = 1.5f}, &s, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "top-p");
    assert_int_equal(px_rt_sampler_new(V, &(px_rt_sampler_opts){.min_p = 2}, &s, &err), PX_EINVAL);
    px_assert_contains(err.msg, "min-p");
    assert_int_equal(px_rt_sampler_new(0, NULL, &s, &err), PX_EINVAL);
    px_assert_ok(px_rt_sampler_new(V, NULL, &s, &err), &err);
    float l[V];
    fill_logits(l, 4);
    assert_int_equal(px_rt_sampler_sample(s, l), px_rt_argmax(l, V));
    px_rt_sampler_free(s);
    px_rt_sampler_free(NULL);
    assert_int_equal(px_rt_argmax(l, 0), -1);
    float ties[4] = {1, 3, 3, 2};
    assert_int_equal(px_rt_argmax(ties, 4), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_same_seed_gives_same_tokens),
        cmocka_unit_test(test_sampler_temperature_zero_and_tiny_top_p_are_greedy),
        cmocka_unit_test(test_sampler_follows_the_distribution),
        cmocka_unit_test(test_sampler_top_k_and_min_p_keep_only_the_likeliest),
        cmocka_unit_test(test_sampler_rejects_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
