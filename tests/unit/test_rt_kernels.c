/* The cpu backend op by op, against plain double-precision definitions
 * written here: matrix-vector kernels of every variant and dtype, and
 * every op through the public stream interface, with several thread
 * counts (which must not change a bit), and shapes that do not fit. */
#include "px_test.h"
#include "px_slowdown.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "plexus/rt.h"
#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

static const px__rt_kernels *variants[3];
static size_t n_variants;

static int setup(void **state)
{
    (void)state;
    variants[0] = &px__rt_kernels_portable;
    n_variants = 1;
    if (px__rt_kernels_avx2())
        variants[n_variants++] = px__rt_kernels_avx2();
    else
        print_message("note: no AVX2 on this processor; only the portable kernels are tested\n");
    if (px__rt_kernels_avx512())
        variants[n_variants++] = px__rt_kernels_avx512();
    else
        print_message("note: no AVX-512 VNNI on this processor; its kernels are not tested\n");
    return 0;
}

/* y[r*ldy + i] for rows [i0, i1) and n_x activation rows, through the
 * kernel of w's dtype (q8_0: the activations quantized first). */
static void kernel_matmul(const px__rt_kernels *kern, px_dtype t, const uint8_t *w,
                          size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1, const float *x,
                          uint32_t n_x, float *y, size_t ldy)
{
    if (t != PX_DTYPE_Q8_0) {
        kern->matmul(t, w, row_bytes, k, i0, i1, x, k, n_x, y, ldy);
        return;
    }
    int8_t *xq = malloc((size_t)n_x * k + 1);
    float *xd = malloc(((size_t)n_x * k / 32 + 1) * sizeof(float));
    for (uint32_t r = 0; r < n_x; r++)
        px__rt_quantize_q8_act(x + (size_t)r * k, k, xq + (size_t)r * k, xd + (size_t)r * k / 32);
    kern->matmul_q8_0(w, row_bytes, k, i0, i1, xq, xd, n_x, y, ldy);
    free(xq);
    free(xd);
}

/* Encodes n floats as dtype t (q8_0: one scale per 32 values). */
static size_t encode(px_dtype t, const float *v, size_t n, uint8_t *out)
{
    size_t k = 0;
    for (size_t j = 0; j < n;) {
        if (t == PX_DTYPE_Q8_0) {
            float amax = 0;
            for (int i = 0; i < 32; i++)
                amax = fmaxf(amax, fabsf(v[j + i]));
            uint16_t dh = px_f32_to_f16(amax / 127.0f);
            float d = px_f16_to_f32(dh);
            memcpy(out + k, &dh, 2);
            for (int i = 0; i < 32; i++)
                out[k + 2 + i] = (uint8_t)(int8_t)(d > 0 ? lrintf(v[j + i] / d) : 0);
            k += 34;
            j += 32;
        } else if (t == PX_DTYPE_F32) {
            memcpy(out + k, &v[j++], 4);
            k += 4;
        } else {
            uint16_t h = t == PX_DTYPE_F16 ? px_f32_to_f16(v[j]) : px_f32_to_bf16(v[j]);
            j++;
            memcpy(out + k, &h, 2);
            k += 2;
        }
    }
    return k;
}

static void fill(px_rng *r, float *v, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(scale * px_rng_normal(r));
}

/* ------------------------------------------------------------------ */
/* Matrix-vector kernels                                               */
/* ------------------------------------------------------------------ */

/* The value matmul_q8_0 defines: the weights against the activations
 * as quantized, in double. */
static double q8_0_want(const uint8_t *w, const float *x, uint32_t k, double *mag)
{
    int8_t q[32];
    float d;
    double want = 0;
    *mag = 0;
    for (uint32_t b = 0; b < k / 32; b++) {
        px__rt_quantize_q8_act(x + b * 32, 32, q, &d);
        for (uint32_t j = 0; j < 32; j++) {
            double p = px__rt_weight_at(PX_DTYPE_Q8_0, w, b * 32 + j) * (double)d * q[j];
            want += p;
            *mag += fabs(p);
        }
    }
    return want;
}

static void test_matmul_matches_double_dot_for_every_variant_and_dtype(void **state)
{
    (void)state;
    static const px_dtype types[] = {PX_DTYPE_F32, PX_DTYPE_F16, PX_DTYPE_BF16, PX_DTYPE_Q8_0};
    static const uint32_t ks[] = {1, 7, 32, 37, 64, 72, 96, 200, 1056};
    enum { ROWS = 13, NX = 6 };
    px_rng r;
    px_rng_seed(&r, 1);
    float *wf = malloc(ROWS * 1056 * sizeof(float)), *x = malloc(NX * 1056 * sizeof(float));
    uint8_t *w = malloc(ROWS * 1056 * 4);
    for (size_t vi = 0; vi < n_variants; vi++) {
        const px__rt_kernels *kern = variants[vi];
        for (size_t ti = 0; ti < PX_ARRAY_LEN(types); ti++) {
            /* One thread runs these loops: under ThreadSanitizer the
             * shorter rows only (every other build checks them all). */
            for (size_t ki = 0; ki < PX_TEST_WORKLOAD(PX_ARRAY_LEN(ks), 5); ki++) {
                px_dtype t = types[ti];
                uint32_t k = ks[ki];
                if (t == PX_DTYPE_Q8_0 && k % 32)
                    continue;
                fill(&r, wf, (size_t)ROWS * k, 1.0);
                fill(&r, x, NX * (size_t)k, 1.0);
                size_t row_bytes = encode(t, wf, k, w);
                for (uint32_t i = 1; i < ROWS; i++)
                    encode(t, wf + (size_t)i * k, k, w + i * row_bytes);
                float yn[NX * ROWS], y1[ROWS];
                kernel_matmul(kern, t, w, row_bytes, k, 0, ROWS, x, NX, yn, ROWS);
                for (uint32_t xr = 0; xr < NX; xr++) {
                    /* One vector at a time, in two row ranges: the same bits. */
                    kernel_matmul(kern, t, w, row_bytes, k, 0, 5, x + xr * k, 1, y1, ROWS);
                    kernel_matmul(kern, t, w, row_bytes, k, 5, ROWS, x + xr * k, 1, y1, ROWS);
                    assert_memory_equal(y1, yn + xr * ROWS, sizeof y1);
                    for (uint32_t i = 0; i < ROWS; i++) {
                        double want = 0, mag = 0;
                        if (t == PX_DTYPE_Q8_0) {
                            want = q8_0_want(w + i * row_bytes, x + xr * k, k, &mag);
                        } else {
                            for (uint32_t j = 0; j < k; j++) {
                                double p =
                                    px__rt_weight_at(t, w + i * row_bytes, j) * x[xr * k + j];
                                want += p;
                                mag += fabs(p);
                            }
                        }
                        double got = y1[i];
                        if (fabs(got - want) > 1e-5 * mag + 1e-6)
                            fail_msg("%s %s k=%u row %u: %.9g, want %.9g", kern->name,
                                     px_dtype_name(t), k, i, got, want);
                    }
                }
                /* Dequantisation agrees with single-value reads. */
                float deq[1056];
                kern->dequant(t, w, deq, k);
                for (uint32_t j = 0; j < k; j++)
                    assert_true(deq[j] == (float)px__rt_weight_at(t, w, j));
            }
        }
    }
    free(wf);
    free(x);
    free(w);
}

/* Activation quantization: the scale is max|x| / 127, values round to
 * nearest, a zero block stays zero, a NaN makes the scale NaN. */
static void test_q8_activation_quantization_rounds_and_keeps_nan(void **state)
{
    (void)state;
    float x[64];
    int8_t q[64];
    float d[2];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) * 0.25f;
    memset(x + 32, 0, 32 * sizeof(float));
    px__rt_quantize_q8_act(x, 64, q, d);
    assert_true(d[0] == 4.0f / 127.0f);
    assert_int_equal(q[0], -127);
    assert_int_equal(q[16], 0);
    assert_int_equal(q[31], (int)lrintf(3.75f * (127.0f / 4.0f)));
    assert_true(d[1] == 0.0f);
    for (int j = 32; j < 64; j++)
        assert_int_equal(q[j], 0);
    x[5] = NAN;
    px__rt_quantize_q8_act(x, 32, q, d);
    assert_true(isnan(d[0]));
}

/* Attention's kernels: exp_sum within a few ulp of exp in double, the same
 * bits in every variant (tails of 0 to 7 values included), arguments far
 * below the maximum near 0; scores and values are dot_f32 and axpy_f32
 * over the listed cache rows, bit for bit. */
static void test_attention_kernels_match_exp_and_every_variant(void **state)
{
    (void)state;
    enum { N = 203, HD = 8 };
    float x[N], ref[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = -(float)i * 0.37f + (i % 3 ? 0.0f : -60.0f);
    x[7] = 0.0f;
    x[9] = -500.0f;
    for (size_t n = 1; n <= N; n += (n < 20 ? 1 : 23)) {
        memcpy(ref, x, sizeof x);
        float sref = px__rt_exp_sum_ref(ref, n, 0.0f);
        double sd = 0;
        for (size_t i = 0; i < n; i++) {
            double e = exp((double)x[i]);
            sd += ref[i];
            if (!(fabs(ref[i] - e) <= 4e-7 * e + 1e-37))
                fail_msg("exp(%g) = %.9g, expected %.9g", x[i], ref[i], e);
        }
        assert_true(fabs(sref - sd) <= 1e-6 * sd);
        for (size_t v = 0; v < n_variants; v++) {
            memcpy(y, x, sizeof x);
            float sv = variants[v]->exp_sum(y, n, 0.0f);
            if (memcmp(y, ref, n * sizeof(float)) != 0 || memcmp(&sv, &sref, sizeof sv) != 0)
                fail_msg("%s: exp_sum of %zu values differs from the portable bits",
                         variants[v]->name, n);
            if (memcmp(y + n, x + n, (N - n) * sizeof(float)) != 0)
                fail_msg("%s: exp_sum of %zu values wrote past them", variants[v]->name, n);
        }
    }
    /* Scores and values over rows 3, 0, 5 of a cache of 6 rows of stride 12. */
    float cache[6 * 12], q[HD], w[3] = {0.25f, 0.5f, 0.125f};
    for (int i = 0; i < 6 * 12; i++)
        cache[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    for (int i = 0; i < HD; i++)
        q[i] = (float)i * 0.3f - 1.0f;
    const uint32_t rows[3] = {3, 0, 5};
    for (size_t v = 0; v < n_variants; v++) {
        const px__rt_kernels *k = variants[v];
        float sc[3], out[HD] = {0}, want_out[HD] = {0};
        k->attn_scores(q, cache + 4, 12, rows, 3, HD, 0.5f, sc);
        for (int p = 0; p < 3; p++) {
            float want = k->dot_f32(q, cache + 4 + rows[p] * 12, HD) * 0.5f;
            assert_memory_equal(&sc[p], &want, sizeof want);
            k->axpy_f32(w[p], cache + 4 + rows[p] * 12, want_out, HD);
        }
        k->attn_values(w, cache + 4, 12, rows, 3, HD, out);
        assert_memory_equal(out, want_out, sizeof out);
    }
}

/* One configuration of the group kernels on variant k: the bits of the
 * one-head kernels head by head, within rounding of the sums in double,
 * nothing written past the n scores of a head or the n_q heads of
 * values; the results left in sc and out. */
static void check_attention_group(const px__rt_kernels *k, const float *q, uint32_t n_q,
                                  const float *base, size_t stride, const uint32_t *rows, size_t n,
                                  uint32_t hd, const float *w, size_t ld, float *sc, float *out)
{
    const float scale = 1.0f / sqrtf((float)hd), mark = 12345.0f;
    float one[320];
    for (size_t i = 0; i < (size_t)n_q * ld; i++)
        sc[i] = mark;
    for (size_t i = 0; i < (size_t)n_q * hd + 8; i++)
        out[i] = mark;
    k->attn_scores_group(q, n_q, base, stride, rows, n, hd, scale, sc, ld);
    k->attn_values_group(w, ld, n_q, base, stride, rows, n, hd, out);
    for (uint32_t g = 0; g < n_q; g++) {
        const float *qg = q + (size_t)g * hd, *wg = w + (size_t)g * ld;
        k->attn_scores(qg, base, stride, rows, n, hd, scale, one);
        if (memcmp(one, sc + (size_t)g * ld, n * sizeof(float)) != 0)
            fail_msg("%s: scores of head %u of %u (hd %u, %zu rows) differ from attn_scores'",
                     k->name, g, n_q, hd, n);
        for (size_t p = n; p < ld; p++)
            assert_true(sc[(size_t)g * ld + p] == mark);
        for (size_t p = 0; p < n; p++) {
            const float *kr = base + (size_t)rows[p] * stride;
            double want = 0, mag = 0;
            for (uint32_t i = 0; i < hd; i++) {
                want += (double)qg[i] * kr[i];
                mag += fabs((double)qg[i] * kr[i]);
            }
            if (!(fabs(sc[(size_t)g * ld + p] - want * scale) <= 1e-6 * mag * scale + 1e-30))
                fail_msg("%s: score %zu of head %u (hd %u) = %.9g, want %.9g", k->name, p, g, hd,
                         sc[(size_t)g * ld + p], want * scale);
        }
        memset(one, 0, sizeof one);
        k->attn_values(wg, base, stride, rows, n, hd, one);
        if (memcmp(one, out + (size_t)g * hd, hd * sizeof(float)) != 0)
            fail_msg("%s: values of head %u of %u (hd %u, %zu rows) differ from attn_values'",
                     k->name, g, n_q, hd, n);
        for (uint32_t i = 0; i < hd; i++) {
            double want = 0, mag = 0;
            for (size_t p = 0; p < n; p++) {
                want += (double)wg[p] * base[(size_t)rows[p] * stride + i];
                mag += fabs((double)wg[p] * base[(size_t)rows[p] * stride + i]);
            }
            if (!(fabs(out[(size_t)g * hd + i] - want) <= 1e-6 * mag + 1e-30))
                fail_msg("%s: value %u of head %u (hd %u, %zu rows) = %.9g, want %.9g", k->name, i,
                         g, hd, n, out[(size_t)g * hd + i], want);
        }
    }
    for (size_t i = (size_t)n_q * hd; i < (size_t)n_q * hd + 8; i++)
        assert_true(out[i] == mark);
}

/* Attention's group kernels (the query heads of a KV head at once)
 * against a plain scalar reference in double and, bit for bit, against
 * the one-head kernels of their variant: head sizes of 1 to 128 values,
 * odd ones and each one the kernels run as a constant (8 to 128) included, groups of 1 to 8 heads,
 * 1 to 300 cached rows listed out of order; the avx2 and avx512 variants give the same bits. */
static void test_attention_group_kernels_match_reference_and_one_head_bits(void **state)
{
    (void)state;
    enum { NROWS = 307, MAXN = 300, MAXG = 8, MAXHD = 128, STRIDE = 2 * MAXHD + 3 };
    static const uint32_t hds[] = {1, 3, 7, 8, 12, 16, 17, 32, 64, 67, 128};
    static const uint32_t groups[] = {1, 2, 3, 4, 8};
    static const size_t ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 65, 97, 300};
    px_rng r;
    px_rng_seed(&r, 11);
    size_t ld = MAXN + 3;
    float *cache = malloc((size_t)NROWS * STRIDE * sizeof(float));
    float *q = malloc((size_t)MAXG * MAXHD * sizeof(float));
    float *w = malloc((size_t)MAXG * ld * sizeof(float));
    float *sc[3], *out[3];
    for (int v = 0; v < 3; v++) {
        sc[v] = malloc((size_t)MAXG * ld * sizeof(float));
        out[v] = malloc(((size_t)MAXG * MAXHD + 8) * sizeof(float));
    }
    fill(&r, cache, (size_t)NROWS * STRIDE, 1.0);
    uint32_t rows[MAXN];
    for (uint32_t p = 0; p < MAXN; p++)
        rows[p] = (p * 7 + 3) % NROWS;
    for (size_t hi = 0; hi < PX_ARRAY_LEN(hds); hi++)
        for (size_t gi = 0; gi < PX_ARRAY_LEN(groups); gi++)
            for (size_t n = 1; n <= MAXN; n++) {
                uint32_t hd = hds[hi], n_q = groups[gi];
                bool listed = false;
                for (size_t i = 0; i < PX_ARRAY_LEN(ns); i++)
                    listed |= ns[i] == n;
                /* Every count of rows for the decode shape, some for the rest. */
                if (!listed && !(hd == 64 && n_q == 4))
                    continue;
                fill(&r, q, (size_t)n_q * hd, 1.0);
                for (size_t i = 0; i < (size_t)n_q * ld; i++)
                    w[i] = (float)(px_rng_uniform(&r) / (double)n);
                /* The head's values start hd values into a cached row. */
                const float *base = cache + (hd <= MAXHD ? hd : 0);
                for (size_t v = 0; v < n_variants; v++) {
                    check_attention_group(variants[v], q, n_q, base, STRIDE, rows, n, hd, w, ld,
                                          sc[v], out[v]);
                    if (v < 2)
                        continue;
                    for (uint32_t g = 0; g < n_q; g++)
                        if (memcmp(sc[v] + g * ld, sc[1] + g * ld, n * sizeof(float)) != 0)
                            fail_msg("%s and %s scores differ (hd %u, %u heads, %zu rows)",
                                     variants[v]->name, variants[1]->name, hd, n_q, n);
                    if (memcmp(out[v], out[1], (size_t)n_q * hd * sizeof(float)) != 0)
                        fail_msg("%s and %s values differ (hd %u, %u heads, %zu rows)",
                                 variants[v]->name, variants[1]->name, hd, n_q, n);
                }
            }
    for (int v = 0; v < 3; v++) {
        free(sc[v]);
        free(out[v]);
    }
    free(cache);
    free(q);
    free(w);
}

/* The batch-invariance contract of the matrix kernels: an activation
 * row's outputs are the same bits whatever the number of rows in the step
 * (1..N, the row at any place among them), whatever the split of weight
 * rows among 1..4 threads, and (for the avx2 and avx512 variants, and for
 * q8_0 on every variant) whatever the variant. */
static void test_matmul_row_is_identical_for_any_batch_thread_count_and_variant(void **state)
{
    (void)state;
    static const px_dtype types[] = {PX_DTYPE_F32, PX_DTYPE_F16, PX_DTYPE_BF16, PX_DTYPE_Q8_0};
    /* Odd block counts, tails of 8 and of single values, a wide one, and
     * one whose rows fill more than one tile of a large product
     * (px__rt_tile_rows). */
    static const uint32_t ks[] = {96, 200, 1024, 4096};
    enum { ROWS = 29, NMAX = 11, KMAX = 4096 };
    px_rng r;
    px_rng_seed(&r, 7);
    float *wf = malloc(ROWS * KMAX * sizeof(float)), *x = malloc(NMAX * KMAX * sizeof(float));
    uint8_t *w = malloc(ROWS * KMAX * 4);
    float *ref = malloc(NMAX * ROWS * sizeof(float)), *y = malloc(NMAX * ROWS * sizeof(float));
    for (size_t ti = 0; ti < PX_ARRAY_LEN(types); ti++)
        /* Simulated splits on one thread: under ThreadSanitizer the two
         * shorter rows only (every other build checks them all). */
        for (size_t ki = 0; ki < PX_TEST_WORKLOAD(PX_ARRAY_LEN(ks), 2); ki++) {
            px_dtype t = types[ti];
            uint32_t k = ks[ki];
            if (t == PX_DTYPE_Q8_0 && k % 32)
                continue;
            fill(&r, wf, (size_t)ROWS * k, 1.0);
            fill(&r, x, NMAX * (size_t)k, 1.0);
            size_t row_bytes = encode(t, wf, k, w);
            for (uint32_t i = 1; i < ROWS; i++)
                encode(t, wf + (size_t)i * k, k, w + i * row_bytes);
            for (size_t vi = 0; vi < n_variants; vi++) {
                const px__rt_kernels *kern = variants[vi];
                /* The reference: each row alone, one thread. */
                float ref_v[NMAX * ROWS];
                for (uint32_t xr = 0; xr < NMAX; xr++)
                    kernel_matmul(kern, t, w, row_bytes, k, 0, ROWS, x + xr * k, 1,
                                  ref_v + xr * ROWS, ROWS);
                if (vi == 0 || (vi == 1 && t != PX_DTYPE_Q8_0))
                    memcpy(ref, ref_v, sizeof ref_v);
                else if (memcmp(ref, ref_v, sizeof ref_v) != 0)
                    fail_msg("%s %s k=%u: results differ from the %s variant", kern->name,
                             px_dtype_name(t), k, vi == 1 ? "portable" : "previous");
                for (uint32_t n = 1; n <= NMAX; n++)
                    for (uint32_t nth = 1; nth <= 4; nth++) {
                        /* Rows [first, first + n) of x, split as the pool would. */
                        uint32_t first = (n * 5 + nth) % (NMAX - n + 1);
                        for (uint32_t ith = 0; ith < nth; ith++) {
                            size_t i0, i1;
                            px__rt_split(ROWS, ith, nth, &i0, &i1);
                            kernel_matmul(kern, t, w, row_bytes, k, (uint32_t)i0, (uint32_t)i1,
                                          x + (size_t)first * k, n, y, ROWS);
                        }
                        if (memcmp(y, ref_v + (size_t)first * ROWS, (size_t)n * ROWS * 4) != 0)
                            fail_msg("%s %s k=%u: %u rows from %u on %u threads differ from "
                                     "the rows alone",
                                     kern->name, px_dtype_name(t), k, n, first, nth);
                    }
            }
        }
    free(wf);
    free(x);
    free(w);
    free(ref);
    free(y);
}

/* ------------------------------------------------------------------ */
/* Ops through the stream interface                                    */
/* ------------------------------------------------------------------ */

typedef struct arena_buf {
    px_rt_device *dev;
    px_rt_stream *stream;
    px_rt_buffer *buf;
    size_t used;
} arena_buf;

static void open_cpu(arena_buf *a, uint32_t threads)
{
    px_err err;
    memset(a, 0, sizeof *a);
    px_rt_device_opts o = {.n_threads = threads};
    px_assert_ok(px_rt_device_open("cpu", &o, &a->dev, &err), &err);
    px_assert_ok(px_rt_stream_new(a->dev, &a->stream, &err), &err);
    px_assert_ok(px_rt_buffer_alloc(a->dev, 8 << 20, &a->buf, &err), &err);
}

static void close_cpu(arena_buf *a)
{
    px_rt_buffer_free(a->buf);
    px_rt_stream_free(a->stream);
    px_rt_device_free(a->dev);
}

static px_rt_tensor tensor(arena_buf *a, px_dtype t, int64_t ne0, int64_t ne1, int64_t ne2)
{
    px_rt_tensor x;
    px_err err;
    int64_t ne[3] = {ne0, ne1, ne2};
    px_assert_ok(px_rt_tensor_init(&x, t, 3, ne, &err), &err);
    x.buffer = a->buf;
    x.offset = a->used;
    a->used += (px_rt_tensor_nbytes(&x) + 63) / 64 * 64;
    assert_true(a->used <= px_rt_buffer_size(a->buf));
    return x;
}

static float *f32(const px_rt_tensor *t)
{
    return px_rt_tensor_data(t);
}

static void run(arena_buf *a, const px_rt_op *op)
{
    px_err err;
    px_assert_ok(px_rt_stream_run(a->stream, op, 1, &err), &err);
}

/* The work tensor an op needs on this device. */
static px_rt_tensor work_for(arena_buf *a, const px_rt_op *op)
{
    size_t n = px_rt_device_work_size(a->dev, op);
    return tensor(a, PX_DTYPE_I8, (int64_t)(n ? n : 1), 1, 1);
}

#define CLOSE(a, b, tol)                                        \
    do {                                                        \
        double px__a = (a), px__b = (b);                        \
        if (!(fabs(px__a - px__b) <= (tol)))                    \
            fail_msg("%s = %.9g, want %.9g", #a, px__a, px__b); \
    } while (0)

/* Every op once, with `threads` threads, results in `out` (for bitwise
 * comparison across thread counts). */
static void all_ops(uint32_t threads, float *out, size_t *n_out)
{
    arena_buf a;
    open_cpu(&a, threads);
    px_rng r;
    px_rng_seed(&r, 42);
    size_t o = 0;
    enum { R = 9, DIM = 48, HD = 12, NH = 4, NKV = 2, CTX = 16, SLOTS = 3, VOC = 70 };

    /* RMSNORM over selected rows. */
    px_rt_tensor x = tensor(&a, PX_DTYPE_F32, DIM, R, 1), g = tensor(&a, PX_DTYPE_F32, DIM, 1, 1),
                 y = tensor(&a, PX_DTYPE_F32, DIM, R, 1);
    fill(&r, f32(&x), DIM * R, 2.0);
    fill(&r, f32(&g), DIM, 1.0);
    uint32_t sel[3] = {8, 0, 4};
    px_rt_op op = {.kind = PX_IR_OP_RMSNORM,
                   .src = {&x, &g},
                   .dst = &y,
                   .eps = 1e-5f,
                   .select = sel,
                   .n_select = 3};
    run(&a, &op);
    for (int rr = 0; rr < 3; rr++) {
        const float *xr = f32(&x) + sel[rr] * DIM;
        double ss = 0;
        for (int j = 0; j < DIM; j++)
            ss += (double)xr[j] * xr[j];
        double sc = 1 / sqrt(ss / DIM + 1e-5);
        for (int j = 0; j < DIM; j++)
            CLOSE(f32(&y)[rr * DIM + j], f32(&g)[j] * xr[j] * sc, 1e-5);
    }
    memcpy(out + o, f32(&y), 3 * DIM * sizeof(float));
    o += 3 * DIM;

    /* ROPE, both pairings, 8 of 12 dimensions rotated. */
    int32_t pos[R] = {0, 1, 2, 3, 4, 5, 6, 7, 15}, slot[R] = {0, 0, 0, 0, 1, 1, 1, 2, 2};
    px_rt_rows rows = {.n_rows = R, .slot = slot, .pos = pos};
    px_rt_tensor tab = tensor(&a, PX_DTYPE_F32, 8, CTX, 1);
    px__rt_rope_table(f32(&tab), CTX, 8, 10000.0f);
    for (int style = 1; style <= 2; style++) {
        px_rt_tensor q = tensor(&a, PX_DTYPE_F32, NH * HD, R, 1);
        fill(&r, f32(&q), NH * HD * R, 1.0);
        float before[NH * HD * R];
        memcpy(before, f32(&q), sizeof before);
        op = (px_rt_op){.kind = PX_IR_OP_ROPE,
                        .src = {&q, &tab},
                        .dst = &q,
                        .rows = &rows,
                        .n_heads = NH,
                        .head_dim = HD,
                        .rope_dim = 8,
                        .rope_style = (px_ir_rope_style)style};
        run(&a, &op);
        for (int rr = 0; rr < R; rr++)
            for (int h = 0; h < NH; h++) {
                const float *b = before + rr * NH * HD + h * HD;
                const float *v = f32(&q) + rr * NH * HD + h * HD;
                for (int i = 0; i < 4; i++) {
                    int ia = style == PX_IR_ROPE_HALVES ? i : 2 * i;
                    int ib = style == PX_IR_ROPE_HALVES ? i + 4 : 2 * i + 1;
                    double ang = pos[rr] * pow(10000.0, -2.0 * i / 8);
                    CLOSE(v[ia], b[ia] * cos(ang) - b[ib] * sin(ang), 1e-5);
                    CLOSE(v[ib], b[ia] * sin(ang) + b[ib] * cos(ang), 1e-5);
                }
                for (int i = 8; i < HD; i++) /* past rope_dim: untouched */
                    assert_true(v[i] == b[i]);
            }
        memcpy(out + o, f32(&q), sizeof before);
        o += NH * HD * R;
    }

    /* ATTENTION: grouped-query heads, three slots, a window of 5. */
    for (uint32_t window = 0; window <= 5; window += 5) {
        px_rt_tensor q = tensor(&a, PX_DTYPE_F32, NH * HD, R, 1),
                     k = tensor(&a, PX_DTYPE_F32, NKV * HD, R, 1),
                     v = tensor(&a, PX_DTYPE_F32, NKV * HD, R, 1),
                     kc = tensor(&a, PX_DTYPE_F32, NKV * HD, CTX, SLOTS),
                     vc = tensor(&a, PX_DTYPE_F32, NKV * HD, CTX, SLOTS),
                     att = tensor(&a, PX_DTYPE_F32, NH * HD, R, 1);
        fill(&r, f32(&q), NH * HD * R, 1.0);
        fill(&r, f32(&k), NKV * HD * R, 1.0);
        fill(&r, f32(&v), NKV * HD * R, 1.0);
        /* Slot 2 already holds positions 0..14. */
        fill(&r, f32(&kc), NKV * HD * CTX * SLOTS, 1.0);
        fill(&r, f32(&vc), NKV * HD * CTX * SLOTS, 1.0);
        op = (px_rt_op){.kind = PX_IR_OP_ATTENTION,
                        .src = {&q, &k, &v, &kc, &vc},
                        .dst = &att,
                        .rows = &rows,
                        .n_heads = NH,
                        .n_kv_heads = NKV,
                        .head_dim = HD,
                        .window = window};
        px_rt_tensor wk = work_for(&a, &op);
        op.work = &wk;
        run(&a, &op);
        for (int rr = 0; rr < R; rr++) {
            const float *kr = f32(&k) + rr * NKV * HD, *vr = f32(&v) + rr * NKV * HD;
            const float *kcs = f32(&kc) + (size_t)slot[rr] * CTX * NKV * HD;
            const float *vcs = f32(&vc) + (size_t)slot[rr] * CTX * NKV * HD;
            /* The new rows were stored at (slot, pos). */
            assert_memory_equal(kcs + pos[rr] * NKV * HD, kr, NKV * HD * sizeof(float));
            assert_memory_equal(vcs + pos[rr] * NKV * HD, vr, NKV * HD * sizeof(float));
            int first = window && pos[rr] >= (int)window ? pos[rr] - (int)window + 1 : 0;
            for (int h = 0; h < NH; h++) {
                int kvh = h / (NH / NKV);
                const float *qh = f32(&q) + rr * NH * HD + h * HD;
                double sc[CTX], mx = -INFINITY, sum = 0;
                for (int t = first; t <= pos[rr]; t++) {
                    double s = 0;
                    for (int d = 0; d < HD; d++)
                        s += (double)qh[d] * kcs[t * NKV * HD + kvh * HD + d];
                    sc[t] = s / sqrt(HD);
                    mx = fmax(mx, sc[t]);
                }
                for (int t = first; t <= pos[rr]; t++)
                    sum += (sc[t] = exp(sc[t] - mx));
                for (int d = 0; d < HD; d++) {
                    double want = 0;
                    for (int t = first; t <= pos[rr]; t++)
                        want += sc[t] / sum * vcs[t * NKV * HD + kvh * HD + d];
                    CLOSE(f32(&att)[rr * NH * HD + h * HD + d], want, 1e-5);
                }
            }
        }
        memcpy(out + o, f32(&att), NH * HD * R * sizeof(float));
        o += NH * HD * R;
    }

    /* SWIGLU and ADD, in place. */
    px_rt_tensor ga = tensor(&a, PX_DTYPE_F32, DIM, R, 1), up = tensor(&a, PX_DTYPE_F32, DIM, R, 1);
    fill(&r, f32(&ga), DIM * R, 2.0);
    fill(&r, f32(&up), DIM * R, 2.0);
    float g0[DIM * R];
    memcpy(g0, f32(&ga), sizeof g0);
    op = (px_rt_op){.kind = PX_IR_OP_SWIGLU, .src = {&ga, &up}, .dst = &ga};
    run(&a, &op);
    for (int i = 0; i < DIM * R; i++)
        CLOSE(f32(&ga)[i], g0[i] / (1 + exp(-(double)g0[i])) * f32(&up)[i], 1e-5);
    op = (px_rt_op){.kind = PX_IR_OP_ADD, .src = {&ga, &up}, .dst = &ga};
    memcpy(g0, f32(&ga), sizeof g0);
    run(&a, &op);
    for (int i = 0; i < DIM * R; i++)
        assert_true(f32(&ga)[i] == g0[i] + f32(&up)[i]);
    memcpy(out + o, f32(&ga), sizeof g0);
    o += DIM * R;

    /* EMBEDDING and MATMUL (9 rows) for every dtype, and a CLASSIFIER over
     * selected rows (3 rows), which must equal the MATMUL's rows. */
    static const px_dtype types[] = {PX_DTYPE_F32, PX_DTYPE_F16, PX_DTYPE_BF16, PX_DTYPE_Q8_0};
    for (size_t ti = 0; ti < PX_ARRAY_LEN(types); ti++) {
        px_dtype t = types[ti];
        px_rt_tensor wt = tensor(&a, t, 64, VOC, 1), bias = tensor(&a, PX_DTYPE_F32, VOC, 1, 1);
        float wf[64 * VOC];
        fill(&r, wf, 64 * VOC, 0.5);
        fill(&r, f32(&bias), VOC, 0.5);
        encode(t, wf, 64 * VOC, px_rt_tensor_data(&wt));
        const uint8_t *wd = px_rt_tensor_data(&wt);
        px_rt_tensor ids = tensor(&a, PX_DTYPE_I32, R, 1, 1),
                     e = tensor(&a, PX_DTYPE_F32, 64, R, 1);
        int32_t *id = px_rt_tensor_data(&ids);
        for (int i = 0; i < R; i++)
            id[i] = (int32_t)px_rng_below(&r, VOC);
        op = (px_rt_op){.kind = PX_IR_OP_EMBEDDING, .src = {&wt, &ids}, .dst = &e};
        run(&a, &op);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < 64; j++)
                assert_true(f32(&e)[i * 64 + j] ==
                            (float)px__rt_weight_at(t, wd + (size_t)id[i] * wt.nb[1], (uint32_t)j));
        px_rt_tensor mm = tensor(&a, PX_DTYPE_F32, VOC, R, 1);
        op = (px_rt_op){.kind = PX_IR_OP_MATMUL, .src = {&e, &wt, &bias}, .dst = &mm};
        px_rt_tensor wk = work_for(&a, &op);
        op.work = &wk;
        run(&a, &op);
        for (int i = 0; i < R; i++)
            for (int n = 0; n < VOC; n++) {
                double want = f32(&bias)[n], mag;
                if (t == PX_DTYPE_Q8_0)
                    want += q8_0_want(wd + (size_t)n * wt.nb[1], f32(&e) + i * 64, 64, &mag);
                else
                    for (int j = 0; j < 64; j++)
                        want += px__rt_weight_at(t, wd + (size_t)n * wt.nb[1], (uint32_t)j) *
                                f32(&e)[i * 64 + j];
                CLOSE(f32(&mm)[i * VOC + n], want, 1e-4);
            }
        memcpy(out + o, f32(&mm), R * VOC * sizeof(float));
        o += R * VOC;
        px_rt_tensor logits = tensor(&a, PX_DTYPE_F32, VOC, 3, 1);
        op = (px_rt_op){.kind = PX_IR_OP_CLASSIFIER,
                        .src = {&e, &wt},
                        .dst = &logits,
                        .select = sel,
                        .n_select = 3};
        px_rt_tensor wk2 = work_for(&a, &op);
        op.work = &wk2;
        run(&a, &op);
        for (int i = 0; i < 3; i++)
            for (int n = 0; n < VOC; n++)
                CLOSE(f32(&logits)[i * VOC + n], f32(&mm)[sel[i] * VOC + n] - f32(&bias)[n], 1e-4);
    }
    *n_out = o;
    close_cpu(&a);
}

static void test_ops_match_definitions_and_ignore_thread_count(void **state)
{
    (void)state;
    size_t cap = 1 << 16, n1, n3;
    float *one = malloc(cap * sizeof(float)), *three = malloc(cap * sizeof(float));
    all_ops(1, one, &n1);
    all_ops(3, three, &n3);
    assert_int_equal(n1, n3);
    assert_true(n1 < cap);
    assert_memory_equal(one, three, n1 * sizeof(float));
    free(one);
    free(three);
}

/* A k x n weight of dtype t with values of scale 0.5. */
static px_rt_tensor weight(arena_buf *a, px_rng *r, px_dtype t, uint32_t k, uint32_t n)
{
    px_rt_tensor w = tensor(a, t, k, n, 1);
    float *row = malloc(k * sizeof(float));
    uint8_t *wd = px_rt_tensor_data(&w);
    for (uint32_t i = 0; i < n; i++) {
        fill(r, row, k, 0.5);
        if (t == PX_DTYPE_F32 || t == PX_DTYPE_F16 || t == PX_DTYPE_BF16)
            encode(t, row, k, wd + (size_t)i * w.nb[1]);
        else
            px__rt_quantize_row(t, row, wd + (size_t)i * w.nb[1], k);
    }
    free(row);
    return w;
}

enum { GK = 1024, GN0 = 100, GN1 = 40, GN2 = 44 };

/* Runs the n products of one input in ops as one list (a group, asserted), then each again
 * alone into z[j], by the weights alone_w[j] where given. */
static void group_then_alone(arena_buf *a, px_rt_op *ops, int n, px_rt_tensor *z,
                             const px_rt_tensor *const *alone_w)
{
    px_rt_tensor wk = work_for(a, &ops[0]);
    for (int j = 0; j < n; j++)
        ops[j].work = &wk;
    assert_int_equal(px__rt_cpu_products(ops, (size_t)n), (size_t)n);
    px_err err;
    px_assert_ok(px_rt_stream_run(a->stream, ops, (size_t)n, &err), &err);
    for (int j = 0; j < n; j++) {
        px_rt_op alone = ops[j];
        if (alone_w && alone_w[j])
            alone.src[1] = alone_w[j];
        alone.dst = &z[j];
        run(a, &alone);
        ops[j].work = NULL;
    }
}

/* Three products of one input (as a layer's q, k and v), the second with
 * a bias, run as one list (a group) and each alone; the group's outputs
 * go to out (GN0 + GN1 + GN2 values a row). */
static void group_outputs(uint32_t threads, px_dtype ta, px_dtype tb, uint32_t rows, float *out)
{
    arena_buf a;
    open_cpu(&a, threads);
    px_rng r;
    px_rng_seed(&r, 7);
    static const uint32_t width[3] = {GN0, GN1, GN2};
    px_rt_tensor x = tensor(&a, PX_DTYPE_F32, GK, rows, 1);
    fill(&r, f32(&x), (size_t)GK * rows, 1.0);
    px_rt_tensor w[3], y[3], z[3], bias = tensor(&a, PX_DTYPE_F32, GN1, 1, 1);
    fill(&r, f32(&bias), GN1, 0.5);
    px_rt_op ops[3];
    for (int j = 0; j < 3; j++) {
        w[j] = weight(&a, &r, j == 1 ? tb : ta, GK, width[j]);
        y[j] = tensor(&a, PX_DTYPE_F32, width[j], rows, 1);
        z[j] = tensor(&a, PX_DTYPE_F32, width[j], rows, 1);
        ops[j] = (px_rt_op){
            .kind = PX_IR_OP_MATMUL, .src = {&x, &w[j], j == 1 ? &bias : NULL}, .dst = &y[j]};
    }
    group_then_alone(&a, ops, 3, z, NULL);
    for (int j = 0; j < 3; j++) {
        if (memcmp(f32(&y[j]), f32(&z[j]), (size_t)width[j] * rows * sizeof(float)) != 0)
            fail_msg("%s and %s, %u rows, %u threads: product %d of the group differs from "
                     "the product alone",
                     px_dtype_name(ta), px_dtype_name(tb), rows, threads, j);
        for (uint32_t i = 0; i < rows; i++)
            memcpy(out + (size_t)i * (GN0 + GN1 + GN2) + (j > 0 ? GN0 : 0) + (j > 1 ? GN1 : 0),
                   f32(&y[j]) + (size_t)i * width[j], width[j] * sizeof(float));
    }
    close_cpu(&a);
}

/* The products of one input run as one group in one pool call, whose
 * parts cross from one product into the next: every output is bit for
 * bit the product's alone, on any number of threads, for every way the
 * activation rows are prepared (as they are, q8_0's split, Q8_0 and Q8_K
 * blocks), for one row (decode) and several. */
static void test_products_of_one_input_run_as_one_group_bit_for_bit(void **state)
{
    (void)state;
    static const px_dtype pairs[][2] = {{PX_DTYPE_Q4_K, PX_DTYPE_Q6_K},
                                        {PX_DTYPE_Q8_0, PX_DTYPE_Q8_0},
                                        {PX_DTYPE_Q4_0, PX_DTYPE_Q5_0},
                                        {PX_DTYPE_F16, PX_DTYPE_F32}};
    static const uint32_t row_counts[] = {1, 5};
    size_t row_len = GN0 + GN1 + GN2;
    float *one = malloc(5 * row_len * sizeof(float)), *many = malloc(5 * row_len * sizeof(float));
    for (size_t p = 0; p < PX_ARRAY_LEN(pairs); p++)
        for (size_t rc = 0; rc < PX_ARRAY_LEN(row_counts); rc++) {
            uint32_t rows = row_counts[rc];
            group_outputs(1, pairs[p][0], pairs[p][1], rows, one);
            for (uint32_t threads = 2; threads <= 3; threads++) {
                group_outputs(threads, pairs[p][0], pairs[p][1], rows, many);
                if (memcmp(one, many, rows * row_len * sizeof(float)) != 0)
                    fail_msg("%s and %s, %u rows: the group on %u threads differs from 1",
                             px_dtype_name(pairs[p][0]), px_dtype_name(pairs[p][1]), rows, threads);
            }
        }
    free(one);
    free(many);
}

/* Only products that can share their prepared input are grouped: not
 * across inputs, activation forms or selections, not when one writes the
 * input or another's output, and at most PX__RT_MAX_PRODUCTS. */
static void test_products_group_only_what_shares_an_input(void **state)
{
    (void)state;
    arena_buf a;
    open_cpu(&a, 2);
    px_rng r;
    px_rng_seed(&r, 3);
    px_rt_tensor x = tensor(&a, PX_DTYPE_F32, 256, 1, 1), x2 = tensor(&a, PX_DTYPE_F32, 256, 1, 1);
    px_rt_tensor wq4 = weight(&a, &r, PX_DTYPE_Q4_K, 256, 24),
                 wq6 = weight(&a, &r, PX_DTYPE_Q6_K, 256, 24),
                 wq8 = weight(&a, &r, PX_DTYPE_Q8_0, 256, 24),
                 wk = tensor(&a, PX_DTYPE_I8, 4096, 1, 1);
    px_rt_tensor y[6];
    px_rt_op ops[6];
    for (int j = 0; j < 6; j++) {
        y[j] = tensor(&a, PX_DTYPE_F32, 24, 1, 1);
        ops[j] = (px_rt_op){
            .kind = PX_IR_OP_MATMUL, .src = {&x, j % 2 ? &wq6 : &wq4}, .dst = &y[j], .work = &wk};
    }
    assert_int_equal(px__rt_cpu_products(ops, 0), 0);
    assert_int_equal(px__rt_cpu_products(ops, 1), 1);
    assert_int_equal(px__rt_cpu_products(ops, 3), 3);
    assert_int_equal(px__rt_cpu_products(ops, 6), PX__RT_MAX_PRODUCTS);
    px_rt_op b[2] = {ops[0], ops[1]};
    b[1].src[0] = &x2;
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* another input */
    b[1] = ops[1];
    b[1].src[1] = &wq8;
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* Q8_K blocks, then q8_0's split */
    b[1] = ops[1];
    b[1].dst = &x;
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* writes the input */
    b[1] = ops[1];
    b[1].dst = &y[0];
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* writes the first's output */
    b[1] = ops[1];
    b[1].kind = PX_IR_OP_CLASSIFIER;
    assert_int_equal(px__rt_cpu_products(b, 2), 1);
    b[1] = ops[1];
    uint32_t sel = 0;
    b[0].select = &sel;
    b[0].n_select = 1;
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* a selection */
    b[0] = ops[0];
    b[1].work = NULL;
    assert_int_equal(px__rt_cpu_products(b, 2), 1); /* another work buffer */
    close_cpu(&a);
}

static void expect_op_error(arena_buf *a, const px_rt_op *op, px_status code, const char *needle)
{
    px_err err;
    px_status st = px_rt_stream_run(a->stream, op, 1, &err);
    if (st != code)
        fail_msg("expected %s, got %s: %s", px_status_name(code), px_status_name(st), err.msg);
    px_assert_contains(err.msg, needle);
}

/* The matrix w (Q4_K, rows a multiple of 16) in PX_RT_LAYOUT_Q4_K_X16, in a's buffer. */
static px_rt_tensor x16_copy(arena_buf *a, const px_rt_tensor *w)
{
    px_rt_tensor p = tensor(a, w->dtype, w->ne[0], w->ne[1], 1);
    px_err err;
    px_assert_ok(px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, w->dtype, px_rt_tensor_data(w),
                                      w->nb[1], (uint64_t)w->ne[1], (uint64_t)w->ne[0],
                                      px_rt_tensor_data(&p), &err),
                 &err);
    p.layout = PX_RT_LAYOUT_Q4_K_X16;
    return p;
}

/* A Q4_K matrix in the x16 layout through the cpu stream, for 1, 5 and 40 activation rows (the
 * decode, a few sequences, a prefill), on 1 and 2 threads, alone and in a group of products
 * beside a q6_k matrix and another in the rows layout: every output bit for bit the rows
 * layout's. */
static void test_q4_k_x16_layout_runs_as_the_rows_layout(void **state)
{
    (void)state;
    enum { K = 1024, N = 96 };
    static const uint32_t row_counts[] = {1, 5, 40};
    for (uint32_t threads = 1; threads <= 2; threads++) {
        arena_buf a;
        open_cpu(&a, threads);
        if (px_rt_device_weight_layout(a.dev, PX_DTYPE_Q4_K, K, N) != PX_RT_LAYOUT_Q4_K_X16) {
            close_cpu(&a);
            print_message("skipped: this processor's kernels take no q4_k layout of their own\n");
            skip();
        }
        px_rng r;
        px_rng_seed(&r, 31);
        px_rt_tensor w = weight(&a, &r, PX_DTYPE_Q4_K, K, N), p = x16_copy(&a, &w);
        px_rt_tensor w6 = weight(&a, &r, PX_DTYPE_Q6_K, K, 40);
        for (size_t rc = 0; rc < PX_ARRAY_LEN(row_counts); rc++) {
            uint32_t rows = row_counts[rc];
            size_t used = a.used;
            px_rt_tensor x = tensor(&a, PX_DTYPE_F32, K, rows, 1);
            fill(&r, f32(&x), (size_t)K * rows, 1.0);
            px_rt_tensor y[3], z[3];
            for (int j = 0; j < 3; j++) {
                y[j] = tensor(&a, PX_DTYPE_F32, j == 1 ? 40 : N, rows, 1);
                z[j] = tensor(&a, PX_DTYPE_F32, j == 1 ? 40 : N, rows, 1);
            }
            /* The x16 matrix, the q6_k one, the same matrix in rows; then all in rows. */
            px_rt_op ops[3] = {{.kind = PX_IR_OP_MATMUL, .src = {&x, &p}, .dst = &y[0]},
                               {.kind = PX_IR_OP_MATMUL, .src = {&x, &w6}, .dst = &y[1]},
                               {.kind = PX_IR_OP_MATMUL, .src = {&x, &w}, .dst = &y[2]}};
            const px_rt_tensor *rows_w[3] = {&w, NULL, NULL};
            group_then_alone(&a, ops, 3, z, rows_w);
            for (int j = 0; j < 3; j++)
                if (memcmp(f32(&y[j]), f32(&z[j]), (size_t)(j == 1 ? 40 : N) * rows * 4) != 0)
                    fail_msg("%u rows, %u threads: product %d of the group differs from the "
                             "rows layout alone",
                             rows, threads, j);
            a.used = used;
        }
        close_cpu(&a);
    }
}

/* The x16 layout where it cannot run: rows not a multiple of 16, a device whose kernels have
 * no product for it, an embedding table in it. */
static void test_q4_k_x16_layout_refused_where_it_cannot_run(void **state)
{
    (void)state;
    arena_buf a;
    open_cpu(&a, 1);
    px_rng r;
    px_rng_seed(&r, 37);
    px_rt_tensor w = weight(&a, &r, PX_DTYPE_Q4_K, 256, 32), p = x16_copy(&a, &w);
    px_rt_tensor x = tensor(&a, PX_DTYPE_F32, 256, 1, 1), y = tensor(&a, PX_DTYPE_F32, 32, 1, 1);
    px_rt_op op = {.kind = PX_IR_OP_MATMUL, .src = {&x, &p}, .dst = &y};
    px_rt_tensor wk = work_for(&a, &op);
    op.work = &wk;
    if (px_rt_device_weight_layout(a.dev, PX_DTYPE_Q4_K, 256, 32) == PX_RT_LAYOUT_Q4_K_X16) {
        px_rt_tensor odd = p;
        odd.ne[1] = 24;
        px_rt_tensor y24 = tensor(&a, PX_DTYPE_F32, 24, 1, 1);
        px_rt_op bad = op;
        bad.src[1] = &odd;
        bad.dst = &y24;
        expect_op_error(&a, &bad, PX_EINVAL, "multiple of 16");
        assert_int_equal(px_rt_device_weight_layout(a.dev, PX_DTYPE_Q4_K, 256, 24),
                         PX_RT_LAYOUT_ROWS);
        assert_int_equal(px_rt_device_weight_layout(a.dev, PX_DTYPE_Q4_K, 200, 32),
                         PX_RT_LAYOUT_ROWS);
        assert_int_equal(px_rt_device_weight_layout(a.dev, PX_DTYPE_Q6_K, 256, 32),
                         PX_RT_LAYOUT_ROWS);
    } else {
        expect_op_error(&a, &op, PX_EUNSUPPORTED, "layout 1");
    }
    px_rt_tensor ids = tensor(&a, PX_DTYPE_I32, 1, 1, 1), e = tensor(&a, PX_DTYPE_F32, 256, 1, 1);
    px_rt_op emb = {.kind = PX_IR_OP_EMBEDDING, .src = {&p, &ids}, .dst = &e};
    expect_op_error(&a, &emb, PX_EUNSUPPORTED, "embedding cannot read weight");
    /* The portable kernels take the rows layout alone (a's tensors, host memory). */
    px_err err;
    px_rt_device *dev;
    px_rt_stream *st;
    px_rt_device_opts o = {.n_threads = 1, .portable_kernels = true};
    px_assert_ok(px_rt_device_open("cpu", &o, &dev, &err), &err);
    px_assert_ok(px_rt_stream_new(dev, &st, &err), &err);
    assert_int_equal(px_rt_device_weight_layout(dev, PX_DTYPE_Q4_K, 256, 32), PX_RT_LAYOUT_ROWS);
    assert_int_equal(px_rt_stream_run(st, &op, 1, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "portable kernels");
    px_rt_stream_free(st);
    px_rt_device_free(dev);
    close_cpu(&a);
}

static void test_ops_reject_shapes_ids_and_kinds_they_cannot_run(void **state)
{
    (void)state;
    arena_buf a;
    open_cpu(&a, 2);
    px_rt_tensor x = tensor(&a, PX_DTYPE_F32, 16, 4, 1), w = tensor(&a, PX_DTYPE_F32, 17, 8, 1),
                 y = tensor(&a, PX_DTYPE_F32, 8, 4, 1), g = tensor(&a, PX_DTYPE_F32, 16, 1, 1);
    px_rt_op op = {.kind = PX_IR_OP_MATMUL, .src = {&x, &w}, .dst = &y};
    expect_op_error(&a, &op, PX_EINVAL, "disagree");
    op = (px_rt_op){.kind = PX_IR_OP_GELU, .src = {&x}, .dst = &x};
    expect_op_error(&a, &op, PX_EUNSUPPORTED, "gelu");
    px_rt_tensor q4 = tensor(&a, PX_DTYPE_Q4_1, 32, 8, 1), xx = tensor(&a, PX_DTYPE_F32, 32, 4, 1);
    op = (px_rt_op){.kind = PX_IR_OP_MATMUL, .src = {&xx, &q4}, .dst = &y};
    expect_op_error(&a, &op, PX_EUNSUPPORTED, "q4_1");
    px_rt_tensor ids = tensor(&a, PX_DTYPE_I32, 2, 1, 1), tab = tensor(&a, PX_DTYPE_F32, 16, 5, 1),
                 e = tensor(&a, PX_DTYPE_F32, 16, 2, 1);
    ((int32_t *)px_rt_tensor_data(&ids))[1] = 5;
    op = (px_rt_op){.kind = PX_IR_OP_EMBEDDING, .src = {&tab, &ids}, .dst = &e};
    expect_op_error(&a, &op, PX_EINVAL, "token id 5 at row 1");
    op = (px_rt_op){.kind = PX_IR_OP_RMSNORM, .src = {&x, &w}, .dst = &x};
    expect_op_error(&a, &op, PX_EINVAL, "disagree");
    /* Attention positions outside the cache. */
    int32_t pos[1] = {4}, slot[1] = {0};
    px_rt_rows rows = {.n_rows = 1, .slot = slot, .pos = pos};
    px_rt_tensor q = tensor(&a, PX_DTYPE_F32, 8, 1, 1), k = tensor(&a, PX_DTYPE_F32, 8, 1, 1),
                 kc = tensor(&a, PX_DTYPE_F32, 8, 4, 1), att = tensor(&a, PX_DTYPE_F32, 8, 1, 1);
    op = (px_rt_op){.kind = PX_IR_OP_ATTENTION,
                    .src = {&q, &k, &k, &kc, &kc},
                    .dst = &att,
                    .rows = &rows,
                    .n_heads = 1,
                    .n_kv_heads = 1,
                    .head_dim = 8};
    expect_op_error(&a, &op, PX_EINVAL, "outside the cache");
    /* Paged: position 4 of slot 0 is in its second block of 4, which the
     * table does not hold. */
    int32_t table[2] = {0, -1};
    rows.block_table = table;
    rows.blocks_per_slot = 2;
    expect_op_error(&a, &op, PX_EINVAL, "not held");
    (void)g;
    close_cpu(&a);
}

/* One attention op over rows (slot[i], pos[i]) of a cache already filled
 * (position t of slot s at row s * 128 + t of kc0, vc0) with `threads`
 * threads, the output rows in out.  Paged: the cache in blocks of 16
 * positions, a slot's blocks scattered over the cache. */
static void attention_rows(uint32_t threads, uint32_t nh, uint32_t nkv, uint32_t hd,
                           uint32_t window, bool paged, const int32_t *slot, const int32_t *pos,
                           uint32_t n, const float *kc0, const float *vc0, float *out)
{
    enum { CTX = 128, SLOTS = 3, BLOCK = 16, PER_SLOT = CTX / BLOCK };
    arena_buf a;
    open_cpu(&a, threads);
    int64_t rows_per = paged ? BLOCK : CTX, n_blocks = paged ? SLOTS * PER_SLOT : SLOTS;
    px_rt_tensor q = tensor(&a, PX_DTYPE_F32, nh * hd, n, 1),
                 k = tensor(&a, PX_DTYPE_F32, nkv * hd, n, 1),
                 v = tensor(&a, PX_DTYPE_F32, nkv * hd, n, 1),
                 kc = tensor(&a, PX_DTYPE_F32, nkv * hd, rows_per, n_blocks),
                 vc = tensor(&a, PX_DTYPE_F32, nkv * hd, rows_per, n_blocks),
                 att = tensor(&a, PX_DTYPE_F32, nh * hd, n, 1);
    size_t kv = (size_t)nkv * hd;
    int32_t table[SLOTS * PER_SLOT];
    for (int i = 0; i < SLOTS * PER_SLOT; i++)
        table[i] = (i * 5 + 7) % (SLOTS * PER_SLOT);
    for (size_t s = 0; s < SLOTS; s++)
        for (size_t t = 0; t < CTX; t++) {
            size_t to =
                paged ? (size_t)table[s * PER_SLOT + t / BLOCK] * BLOCK + t % BLOCK : s * CTX + t;
            memcpy(f32(&kc) + to * kv, kc0 + (s * CTX + t) * kv, kv * sizeof(float));
            memcpy(f32(&vc) + to * kv, vc0 + (s * CTX + t) * kv, kv * sizeof(float));
        }
    /* Each row's query, key and value are a function of its (slot, pos),
     * whatever the rows beside it. */
    for (uint32_t i = 0; i < n; i++) {
        px_rng r = px_rng_derive(99, (uint64_t)slot[i] * CTX + (uint64_t)pos[i]);
        fill(&r, f32(&q) + (size_t)i * nh * hd, (size_t)nh * hd, 1.0);
        fill(&r, f32(&k) + i * kv, kv, 1.0);
        fill(&r, f32(&v) + i * kv, kv, 1.0);
    }
    px_rt_rows rows = {.n_rows = n,
                       .slot = slot,
                       .pos = pos,
                       .block_table = paged ? table : NULL,
                       .blocks_per_slot = paged ? PER_SLOT : 0};
    px_rt_op op = {.kind = PX_IR_OP_ATTENTION,
                   .src = {&q, &k, &v, &kc, &vc},
                   .dst = &att,
                   .rows = &rows,
                   .n_heads = nh,
                   .n_kv_heads = nkv,
                   .head_dim = hd,
                   .window = window};
    px_rt_tensor wk = work_for(&a, &op);
    op.work = &wk;
    run(&a, &op);
    memcpy(out, f32(&att), (size_t)n * nh * hd * sizeof(float));
    close_cpu(&a);
}

/* The batch-invariance contract of attention: a row's output is the same
 * bits whatever the rows that share its step (a decode beside a prefill
 * chunk, or alone), the thread count (1 to 3) and so the split of its
 * query heads among parts, and whatever the cache's layout (in blocks
 * scattered by a block table, or a slot's positions in order); head
 * groups of 4 (the decode shape of the bench model), 8 and 3 (an odd
 * head size), with and without a window.
 * Later rows of a sequence see the earlier rows of the same step, so a
 * row run alone runs after the rows before it of its sequence. */
static void test_attention_row_is_identical_for_any_batch_and_thread_count(void **state)
{
    (void)state;
    enum { CTX = 128, SLOTS = 3, N = 8 };
    static const struct {
        uint32_t nh, nkv, hd, window;
    } shapes[] = {{16, 4, 64, 0}, {16, 4, 64, 20}, {8, 1, 12, 0}, {6, 2, 67, 7}};
    /* A decode at 100 in slot 0, a prefill chunk at 40..44 in slot 1, two
     * decodes in slot 2. */
    const int32_t slot[N] = {1, 1, 0, 1, 1, 2, 1, 2}, pos[N] = {40, 41, 100, 42, 43, 5, 44, 127};
    for (size_t si = 0; si < PX_ARRAY_LEN(shapes); si++) {
        uint32_t nh = shapes[si].nh, hd = shapes[si].hd, width = nh * hd;
        size_t cache = (size_t)shapes[si].nkv * hd * CTX * SLOTS;
        float *kc = malloc(cache * sizeof(float)), *vc = malloc(cache * sizeof(float));
        float *all = malloc((size_t)N * width * sizeof(float));
        float *alt = malloc((size_t)N * width * sizeof(float));
        px_rng r;
        px_rng_seed(&r, 5 + si);
        fill(&r, kc, cache, 1.0);
        fill(&r, vc, cache, 1.0);
        attention_rows(1, nh, shapes[si].nkv, hd, shapes[si].window, false, slot, pos, N, kc, vc,
                       all);
        for (uint32_t th = 1; th <= 3; th++)
            for (int paged = th == 1; paged <= 1; paged++) {
                attention_rows(th, nh, shapes[si].nkv, hd, shapes[si].window, paged, slot, pos, N,
                               kc, vc, alt);
                if (memcmp(all, alt, (size_t)N * width * sizeof(float)) != 0)
                    fail_msg("shape %zu: %u threads%s change the output", si, th,
                             paged ? " and a paged cache" : "");
            }
        for (uint32_t i = 0; i < N; i++)
            for (uint32_t th = 1; th <= 3; th++) {
                /* Row i with the rows of its sequence before it, which it
                 * attends, or alone when it has none in the step. */
                int32_t s1[N], p1[N];
                uint32_t n = 0;
                for (uint32_t j = 0; j < i; j++)
                    if (slot[j] == slot[i]) {
                        s1[n] = slot[j];
                        p1[n++] = pos[j];
                    }
                s1[n] = slot[i];
                p1[n++] = pos[i];
                attention_rows(th, nh, shapes[si].nkv, hd, shapes[si].window, th == 2, s1, p1, n,
                               kc, vc, alt);
                if (memcmp(all + (size_t)i * width, alt + (size_t)(n - 1) * width,
                           width * sizeof(float)) != 0)
                    fail_msg("shape %zu: row %u (slot %d, position %d) differs in a step of %u "
                             "rows on %u threads",
                             si, i, slot[i], pos[i], n, th);
            }
        free(kc);
        free(vc);
        free(all);
        free(alt);
    }
}

/* ------------------------------------------------------------------ */
/* The thread pool                                                     */
/* ------------------------------------------------------------------ */

typedef struct pool_probe {
    _Atomic uint32_t runs[64];
    _Atomic uint32_t bad_thread;
    uint32_t n_threads;
} pool_probe;

static void count_part(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    pool_probe *pp = arg;
    if (thread >= pp->n_threads || part >= n_parts)
        atomic_fetch_add(&pp->bad_thread, 1);
    else
        atomic_fetch_add(&pp->runs[part], 1);
}

/* Every part of every call runs exactly once, on a thread of the pool,
 * and the call returns only when all have: calls back to back (workers
 * still in the previous one), after a pause long enough for the workers
 * to sleep, and with more parts than threads and fewer. */
static void test_pool_runs_every_part_once_per_call(void **state)
{
    (void)state;
    for (uint32_t nth = 1; nth <= 4; nth++) {
        px__rt_pool *pool;
        px_err err;
        px_assert_ok(px__rt_pool_new(nth, &pool, &err), &err);
        assert_int_equal(px__rt_pool_size(pool), nth);
        pool_probe pp = {.n_threads = nth};
        for (uint32_t call = 0; call < 2000; call++) {
            uint32_t n_parts = call % 37;
            for (uint32_t i = 0; i < 64; i++)
                atomic_store(&pp.runs[i], 0);
            if (call % 500 == 499) {
                /* Long enough for every worker to go to sleep. */
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            px__rt_pool_run(pool, count_part, &pp, n_parts);
            for (uint32_t i = 0; i < 64; i++)
                if (atomic_load(&pp.runs[i]) != (i < n_parts ? 1u : 0u))
                    fail_msg("%u threads, call %u: part %u of %u ran %u times", nth, call, i,
                             n_parts, atomic_load(&pp.runs[i]));
        }
        assert_int_equal(atomic_load(&pp.bad_thread), 0);
        px__rt_pool_free(pool);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_matches_double_dot_for_every_variant_and_dtype),
        cmocka_unit_test(test_q8_activation_quantization_rounds_and_keeps_nan),
        cmocka_unit_test(test_attention_kernels_match_exp_and_every_variant),
        cmocka_unit_test(test_attention_group_kernels_match_reference_and_one_head_bits),
        cmocka_unit_test(test_matmul_row_is_identical_for_any_batch_thread_count_and_variant),
        cmocka_unit_test(test_ops_match_definitions_and_ignore_thread_count),
        cmocka_unit_test(test_attention_row_is_identical_for_any_batch_and_thread_count),
        cmocka_unit_test(test_ops_reject_shapes_ids_and_kinds_they_cannot_run),
        cmocka_unit_test(test_pool_runs_every_part_once_per_call),
        cmocka_unit_test(test_products_of_one_input_run_as_one_group_bit_for_bit),
        cmocka_unit_test(test_products_group_only_what_shares_an_input),
        cmocka_unit_test(test_q4_k_x16_layout_runs_as_the_rows_layout),
        cmocka_unit_test(test_q4_k_x16_layout_refused_where_it_cannot_run),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
