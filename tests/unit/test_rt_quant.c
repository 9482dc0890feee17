/* GGUF's block-quantized formats in the runtime: dequantisation against
 * the reference implementation's own output, bit for bit (the twins in
 * ../shared/models/quant, skipped with a message when absent); the AVX2
 * dot products against the portable definition, bit for bit; results
 * independent of row ranges and batching; the quantized dot close to the
 * float one; each quantized model running through generation. */
#include "px_test.h"
#include "px_slowdown.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "plexus/rt.h"
#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

static const px_dtype k_formats[] = {PX_DTYPE_Q4_0, PX_DTYPE_Q5_0, PX_DTYPE_Q2_K, PX_DTYPE_Q3_K,
                                     PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};

static px_ir_model *open_shared(const char *name)
{
    char *path = px_test_require_shared_model(name);
    px_err err;
    px_ir_model *m;
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    free(path);
    return m;
}

/* Every tensor of quant/synth-<recipe>.gguf, dequantised, equals the
 * tensor of the same name in the reference twin, bit for bit. */
static void check_twin(const char *recipe)
{
    char name[128], deq_name[128];
    snprintf(name, sizeof name, "quant/synth-%s.gguf", recipe);
    snprintf(deq_name, sizeof deq_name, "quant/synth-%s.deq.gguf", recipe);
    px_ir_model *q = open_shared(name), *ref = open_shared(deq_name);
    size_t n_quant = 0, n_values = 0;
    for (size_t i = 0; i < px_ir_model_n_tensors(q); i++) {
        const px_ir_tensor *t = px_ir_model_tensor(q, i);
        const px_ir_tensor *r = px_ir_model_find_tensor(ref, t->name);
        if (!r)
            fail_msg("%s: the twin has no tensor %s", deq_name, t->name);
        assert_int_equal(r->dtype, PX_DTYPE_F32);
        assert_int_equal(r->n_elems, t->n_elems);
        assert_true(px__rt_dtype_supported(t->dtype));
        uint32_t k = (uint32_t)t->ne[0];
        uint64_t rows = t->n_elems / k;
        float *got = malloc(k * sizeof(float));
        assert_non_null(got);
        for (uint64_t row = 0; row < rows; row++) {
            px__rt_dequant_row(t->dtype, (const uint8_t *)t->data + row * t->nb[1], got, k);
            const float *want = (const float *)r->data + row * k;
            if (memcmp(got, want, k * sizeof(float)) != 0) {
                for (uint32_t j = 0; j < k; j++)
                    if (memcmp(&got[j], &want[j], sizeof(float)) != 0)
                        fail_msg("%s: %s (%s) row %" PRIu64 " value %u: %.9g, reference %.9g", name,
                                 t->name, px_dtype_name(t->dtype), row, j, (double)got[j],
                                 (double)want[j]);
            }
            /* The single-value read (the reference pass) agrees. */
            uint32_t j = (uint32_t)((row * 37) % k);
            assert_true(px__rt_weight_at(t->dtype, (const uint8_t *)t->data + row * t->nb[1], j) ==
                        (double)want[j]);
        }
        free(got);
        n_quant += px_dtype_is_quantized(t->dtype);
        n_values += t->n_elems;
    }
    print_message("%s: %zu quantized tensors, %zu values equal to the reference bit for bit\n",
                  name, n_quant, n_values);
    assert_true(n_quant >= 15);
    px_ir_model_free(q);
    px_ir_model_free(ref);
}

static void test_q4_0_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q4_0");
}

static void test_q5_0_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q5_0");
}

static void test_q4_k_m_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q4_k_m");
}

static void test_q5_k_m_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q5_k_m");
}

static void test_q6_k_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q6_k");
}

static void test_q3_k_m_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q3_k_m");
}

static void test_q2_k_dequantizes_like_the_reference(void **state)
{
    (void)state;
    check_twin("q2_k");
}

/* Random blocks of t: random bytes, with every f16 scale set to a small
 * finite value (random bytes would make some infinite). */
static void random_blocks(px_rng *r, px_dtype t, uint8_t *out, uint32_t n)
{
    uint32_t nb = n / px_dtype_block_elems(t), bb = px_dtype_block_bytes(t);
    for (size_t i = 0; i < (size_t)nb * bb; i++)
        out[i] = (uint8_t)px_rng_next(r);
    size_t at[2] = {0, 2};
    size_t n_at = 1;
    switch (t) {
    case PX_DTYPE_Q2_K:
        at[0] = 80, at[1] = 82, n_at = 2;
        break;
    case PX_DTYPE_Q3_K:
        at[0] = 108;
        break;
    case PX_DTYPE_Q4_K:
    case PX_DTYPE_Q5_K:
        n_at = 2;
        break;
    case PX_DTYPE_Q6_K:
        at[0] = 208;
        break;
    default:
        break;
    }
    for (uint32_t b = 0; b < nb; b++)
        for (size_t a = 0; a < n_at; a++) {
            uint16_t h = px_f32_to_f16((float)(0.001 + 0.01 * px_rng_uniform(r)));
            memcpy(out + (size_t)b * bb + at[a], &h, 2);
        }
}

static void random_floats(px_rng *r, float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)px_rng_normal(r);
}

static void test_quant_avx2_and_avx512_dots_equal_portable_bit_for_bit(void **state)
{
    (void)state;
    px__rt_quant_dot_fn avx2 = px__rt_quant_dot_avx2(), avx512 = px__rt_quant_dot_avx512();
    if (!avx2) {
        print_message("skipped: no AVX2 on this processor; the portable dots alone run\n");
        skip();
    }
    if (!avx512)
        print_message("note: no AVX-512 VNNI on this processor; its dots are not tested\n");
    px_rng r;
    px_rng_seed(&r, 7);
    enum { N = 4096 };
    static uint8_t w[N / 256 * 210 + N / 32 * 22], xq[PX__RT_QCHUNK_BYTES];
    static float x[N];
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_dtype t = k_formats[f];
        for (int trial = 0; trial < 20; trial++) {
            uint32_t n = trial % 4 == 0 ? N : 256 * (uint32_t)(1 + px_rng_below(&r, 8));
            /* Q4_0 and Q5_0: an odd number of blocks too (the AVX-512 dots
             * take two at a time). */
            if (trial % 4 == 1 && px_dtype_block_elems(t) == PX__RT_QK0)
                n = PX__RT_QK0 * (1 + 2 * (uint32_t)px_rng_below(&r, 64));
            random_blocks(&r, t, w, n);
            random_floats(&r, x, n);
            if (trial == 3)
                memset(x, 0, sizeof x); /* an all-zero activation block */
            px__rt_quant_act(t, x, xq, n);
            float a = px__rt_quant_dot_portable(t, w, xq, n), b = avx2(t, w, xq, n);
            float c = avx512 ? avx512(t, w, xq, n) : a;
            if (memcmp(&a, &b, sizeof a) != 0 || memcmp(&a, &c, sizeof a) != 0)
                fail_msg("%s, %u values: portable %.9g, avx2 %.9g, avx512 %.9g", px_dtype_name(t),
                         n, (double)a, (double)b, (double)c);
        }
    }
}

/* The single-row dots (decode) with every byte of the super-blocks random, d and dmin
 * included (any f16: negative, tiny, huge, infinite or NaN): the vector dots take the
 * definition's float steps, so that each result is the portable one bit for bit (NaN where it
 * is NaN), whatever the scales. */
static void test_quant_decode_dots_equal_portable_for_any_scales(void **state)
{
    (void)state;
    px__rt_quant_dot_fn variants[2] = {px__rt_quant_dot_avx2(), px__rt_quant_dot_avx512()};
    if (!variants[0] && !variants[1]) {
        print_message("skipped: no AVX2 on this processor; the portable dots alone run\n");
        skip();
    }
    px_rng r;
    px_rng_seed(&r, 17);
    enum { N = 2048 };
    enum { ROWS = 3 };
    static uint8_t w[ROWS * (N / 256 * 210)], xq[N / 256 * PX__RT_Q8_K_BYTES];
    static float x[N];
    static const px_dtype ks[] = {PX_DTYPE_Q2_K, PX_DTYPE_Q3_K, PX_DTYPE_Q4_K, PX_DTYPE_Q5_K,
                                  PX_DTYPE_Q6_K};
    for (size_t f = 0; f < PX_ARRAY_LEN(ks); f++) {
        px_dtype t = ks[f];
        for (int trial = 0; trial < 200; trial++) {
            uint32_t n = 256 * (uint32_t)(1 + px_rng_below(&r, N / 256));
            for (size_t i = 0; i < sizeof w; i++)
                w[i] = (uint8_t)px_rng_next(&r);
            random_floats(&r, x, n);
            /* Activations of any magnitude too. */
            float scale = ldexpf(1.0f, (int)px_rng_below(&r, 200) - 100);
            for (uint32_t i = 0; i < n; i++)
                x[i] *= scale;
            px__rt_quant_act(t, x, xq, n);
            size_t row_bytes = n / 256 * px_dtype_block_bytes(t);
            float want = px__rt_quant_dot_portable(t, w, xq, n);
            for (size_t v = 0; v < 3; v++) {
                /* v == 2: the avx512 kernels' product of one activation row (decode), which
                 * lays the activations out anew for Q4_K and Q5_K and takes a range's rows in
                 * pairs, the odd one alone: each of three rows against its own dot. */
                const px__rt_kernels *k512 = px__rt_kernels_avx512();
                if ((v < 2 && !variants[v]) || (v == 2 && !k512))
                    continue;
                float got[ROWS] = {NAN, NAN, NAN};
                if (v < 2)
                    got[0] = variants[v](t, w, xq, n);
                else
                    k512->matmul_quant(t, w, row_bytes, n, 0, ROWS, xq,
                                       px__rt_quant_act_bytes(t, n), 1, got, 1);
                for (uint32_t row = 0; row < (v == 2 ? ROWS : 1); row++) {
                    float want_r =
                        row ? px__rt_quant_dot_portable(t, w + row * row_bytes, xq, n) : want;
                    if (!(isnan(want_r) && isnan(got[row])) &&
                        memcmp(&want_r, &got[row], sizeof want_r) != 0)
                        fail_msg("%s, %u values, trial %d, row %u: portable %.9g, %s %.9g",
                                 px_dtype_name(t), n, trial, row, (double)want_r,
                                 v == 2 ? "avx512 decode product"
                                 : v    ? "avx512"
                                        : "avx2",
                                 (double)got[row]);
                }
            }
        }
    }
}

/* The AVX-512 several-row dots (prefill) for every row count of a group
 * (1 .. PX__RT_QDOT_ROWS), over different activation rows, one of them
 * all zero and one holding an infinity: each row's result is bit for bit
 * the portable single dot of that row, NaN where that dot is NaN. */
static void test_quant_avx512_several_row_dots_equal_portable_per_row(void **state)
{
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!px__rt_quant_dot_avx512()) {
        print_message("skipped: no AVX-512 VNNI on this processor\n");
        skip();
    }
    px_rng r;
    px_rng_seed(&r, 11);
    enum { N = 1024, R = PX__RT_QDOT_ROWS };
    static uint8_t w[N / 256 * 210 + N / 32 * 22], xq[R * (N / 256 * PX__RT_Q8_K_BYTES + 64)];
    static float x[R * N];
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_dtype t = k_formats[f];
        size_t ab = px__rt_quant_act_bytes(t, N) + 64; /* rows not packed */
        random_blocks(&r, t, w, N);
        random_floats(&r, x, R * N);
        memset(x + N, 0, N * sizeof(float));
        x[2 * N + 300] = INFINITY;
        for (uint32_t q = 0; q < R; q++)
            px__rt_quant_act(t, x + q * N, xq + q * ab, N);
        /* Q4_0 and Q5_0: every count of blocks up to 20 too (pairs,
         * groups and an odd last block, in every position). */
        uint32_t n_last = px_dtype_block_elems(t) == PX__RT_QK0 ? 20 : 0;
        for (uint32_t len = 0; len <= n_last; len++) {
            uint32_t n = len ? len * PX__RT_QK0 : N;
            for (uint32_t nx = 1; nx <= R; nx++) {
                float got[R];
                px__rt_quant_dotn_x512(t, w, xq, ab, nx, n, got);
                for (uint32_t q = 0; q < nx; q++) {
                    float want = px__rt_quant_dot_portable(t, w, xq + q * ab, n);
                    if (!(isnan(want) && isnan(got[q])) && memcmp(&want, &got[q], sizeof want) != 0)
                        fail_msg("%s, %u values, %u rows, row %u: portable %.9g, avx512 %.9g",
                                 px_dtype_name(t), n, nx, q, (double)want, (double)got[q]);
                }
            }
        }
    }
#else
    skip();
#endif
}

/* The AVX-512 activation quantization gives the portable bytes: random
 * rows, huge and tiny magnitudes, exact rounding ties, all-zero blocks
 * and blocks with a NaN or an infinity, for Q8_K (k-quants) and Q8_0
 * (Q4_0) activations. */
static void test_quant_avx512_activations_equal_portable_bytes(void **state)
{
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!px__rt_quant_dot_avx512()) {
        print_message("skipped: no AVX-512 VNNI on this processor\n");
        skip();
    }
    px_rng r;
    px_rng_seed(&r, 17);
    enum { N = 8 * 256 };
    static float x[N];
    static uint8_t want[N / 256 * PX__RT_Q8_K_BYTES], got[N / 256 * PX__RT_Q8_K_BYTES];
    static const px_dtype types[] = {PX_DTYPE_Q4_K, PX_DTYPE_Q6_K, PX_DTYPE_Q4_0};
    for (int trial = 0; trial < 12; trial++) {
        random_floats(&r, x, N);
        float scale = trial % 3 == 0 ? 1e30f : trial % 3 == 1 ? 1e-30f : 1.0f;
        for (uint32_t i = 0; i < N; i++)
            x[i] *= scale;
        /* Block 1: ties (amax 127, so the scale is 1: x + 0.5 rounds to even). */
        for (uint32_t i = 0; i < 256; i++)
            x[256 + i] = i == 0 ? 127.0f : (float)((int)(i % 200) - 100) + 0.5f;
        memset(x + 2 * 256, 0, 256 * sizeof(float));
        x[3 * 256 + 7] = NAN;
        x[4 * 256 + 255] = -INFINITY;
        x[5 * 256] = INFINITY;
        for (size_t f = 0; f < PX_ARRAY_LEN(types); f++) {
            size_t ab = px__rt_quant_act_bytes(types[f], N);
            memset(want, 0xAA, sizeof want);
            memset(got, 0x55, sizeof got);
            px__rt_quant_act(types[f], x, want, N);
            px__rt_quant_act_x512(types[f], x, got, N);
            for (size_t i = 0; i < ab; i++)
                if (want[i] != got[i])
                    fail_msg("%s, trial %d: byte %zu: portable %u, avx512 %u",
                             px_dtype_name(types[f]), trial, i, want[i], got[i]);
        }
    }
#else
    skip();
#endif
}

/* The Q4_0/Q5_0 dot's definition, written out from the integer form:
 * block b's eight sums of four products, times d_w * d_x, add to group
 * b % 4; the groups, then the lanes, add in a fixed tree.  The portable
 * dot (and so every variant) gives these bits, for every count of blocks
 * up to 40; the groups make the bits differ from one chain of additions. */
static void test_quant_q4_0_q5_0_dot_adds_blocks_in_four_groups(void **state)
{
    (void)state;
    px_rng r;
    px_rng_seed(&r, 29);
    enum { NB = 40 };
    static uint8_t w[NB * 22], xq[NB * PX__RT_Q8_0_ACT_BYTES];
    static float x[NB * 32];
    int differs = 0;
    for (int f = 0; f < 2; f++) {
        px_dtype t = f ? PX_DTYPE_Q5_0 : PX_DTYPE_Q4_0;
        for (uint32_t nb = 1; nb <= NB; nb++) {
            random_blocks(&r, t, w, nb * 32);
            random_floats(&r, x, nb * 32);
            px__rt_quant_act(t, x, xq, nb * 32);
            float g[4][8] = {{0}}, chain[8] = {0};
            for (uint32_t b = 0; b < nb; b++) {
                px__rt_qblock qb;
                px__rt_quant_unpack(t, w, b, &qb);
                const uint8_t *xb = xq + b * PX__RT_Q8_0_ACT_BYTES;
                uint16_t h;
                memcpy(&h, xb, sizeof h);
                float s = qb.d * px__rt_f16(h);
                for (int l = 0; l < 8; l++) {
                    int32_t p = 0;
                    for (int j = 4 * l; j < 4 * l + 4; j++)
                        p += qb.q[j] * ((const int8_t *)(xb + 2))[j];
                    g[b % 4][l] = g[b % 4][l] + (float)p * s;
                    chain[l] = chain[l] + (float)p * s;
                }
            }
            float h[8];
            for (int l = 0; l < 8; l++)
                h[l] = (g[0][l] + g[2][l]) + (g[1][l] + g[3][l]);
            float want = ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
            float one = ((chain[0] + chain[4]) + (chain[2] + chain[6])) +
                        ((chain[1] + chain[5]) + (chain[3] + chain[7]));
            float got = px__rt_quant_dot_portable(t, w, xq, nb * 32);
            if (memcmp(&want, &got, sizeof want) != 0)
                fail_msg("%s, %u blocks: the definition %.9g, the portable dot %.9g",
                         px_dtype_name(t), nb, (double)want, (double)got);
            differs += memcmp(&one, &got, sizeof one) != 0;
        }
    }
    assert_true(differs > 0);
}

/* Rows of 32-value blocks that probe a Q8_0 quantizer: random values
 * scaled by `scale`, then block 1 of exact ties (amax 127: the scale is
 * 1, x + 0.5 rounds away from zero or to even), an all-zero block,
 * blocks holding a NaN, -inf and +inf, a block of subnormals with zeros
 * (its scale subnormal, 1 / d infinite), a block of -0, a block near
 * FLT_MAX, and a block of values just below a half. */
static void q8_0_probe_row(px_rng *r, float *x, uint32_t n, float scale)
{
    random_floats(r, x, n);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= scale;
    float *b = x;
    for (uint32_t i = 0; i < 32; i++)
        b[32 + i] = i == 0 ? 127.0f : (float)((int)i * 7 % 60 - 30) + 0.5f;
    memset(b + 2 * 32, 0, 32 * sizeof(float));
    b[3 * 32 + 5] = NAN;
    b[4 * 32 + 31] = -INFINITY;
    b[5 * 32] = INFINITY;
    for (uint32_t i = 0; i < 32; i++) {
        b[6 * 32 + i] = i % 3 == 0 ? 0.0f : (float)(i % 2 ? -1 : 1) * 1e-40f * (float)i;
        b[7 * 32 + i] = -0.0f;
        b[8 * 32 + i] = (float)(i % 2 ? -1 : 1) * (FLT_MAX - (float)i * 1e31f);
        b[9 * 32 + i] = (i % 2 ? -0.49999997f : 0.49999997f) * (float)(1 + i % 3);
    }
    /* A lone subnormal amax (its d underflows to 0 or stays subnormal). */
    b[10 * 32 + 3] = 1e-45f;
    for (uint32_t i = 0; i < 32; i++)
        if (i != 3)
            b[10 * 32 + i] = 0.0f;
}

/* Every vectorised Q8_0 activation quantizer gives the portable bytes:
 * the blocks of Q4_0/Q5_0 activations (px__rt_quant_act, f16 scale,
 * rounding half away from zero) with AVX2 and AVX-512, and those of q8_0
 * weights (px__rt_quantize_q8_act, float scale, rounding to even) with
 * AVX2, AVX-512 and the dispatching entry point, on the probe rows. */
static void test_quant_q8_0_activations_equal_portable_bytes(void **state)
{
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    bool avx2 = px__rt_quant_dot_avx2() != NULL, avx512 = px__rt_quant_dot_avx512() != NULL;
    if (!avx2) {
        print_message("skipped: no AVX2 on this processor\n");
        skip();
    }
    if (!avx512)
        print_message("note: no AVX-512 VNNI on this processor; its quantizers are not tested\n");
    px_rng r;
    px_rng_seed(&r, 23);
    enum { N = 16 * 32 };
    static float x[N], xd_want[N / 32], xd_got[N / 32];
    static uint8_t want[N / 32 * PX__RT_Q8_0_ACT_BYTES], got[N / 32 * PX__RT_Q8_0_ACT_BYTES];
    static int8_t q_want[N], q_got[N];
    static const float scales[] = {1.0f, 1e30f, 1e-30f, 1e-39f, 3e38f};
    for (int trial = 0; trial < 20; trial++) {
        q8_0_probe_row(&r, x, N, scales[trial % 5]);
        for (int v = 0; v < 2; v++) {
            if (v == 1 && !avx512)
                continue;
            for (int f = 0; f < 2; f++) {
                px_dtype t = f ? PX_DTYPE_Q5_0 : PX_DTYPE_Q4_0;
                memset(want, 0xAA, sizeof want);
                memset(got, 0x55, sizeof got);
                px__rt_quant_act(t, x, want, N);
                (v ? px__rt_quant_act_x512 : px__rt_quant_act_x86)(t, x, got, N);
                for (size_t i = 0; i < sizeof want; i++)
                    if (want[i] != got[i])
                        fail_msg("%s activations, %s, trial %d: byte %zu (block %zu): portable "
                                 "%u, vector %u",
                                 px_dtype_name(t), v ? "avx512" : "avx2", trial, i,
                                 i / PX__RT_Q8_0_ACT_BYTES, want[i], got[i]);
            }
        }
        px__rt_quantize_q8_act_ref(x, N, q_want, xd_want);
        for (int v = 0; v < 3; v++) {
            if (v == 1 && !avx512)
                continue;
            memset(q_got, 0x55, sizeof q_got);
            memset(xd_got, 0x55, sizeof xd_got);
            if (v == 0)
                px__rt_quantize_q8_act_x86(x, N, q_got, xd_got);
            else if (v == 1)
                px__rt_quantize_q8_act_x512(x, N, q_got, xd_got);
            else
                px__rt_quantize_q8_act(x, N, q_got, xd_got);
            const char *name = v == 0 ? "avx2" : v == 1 ? "avx512" : "dispatched";
            for (size_t i = 0; i < N; i++)
                if (q_want[i] != q_got[i])
                    fail_msg("q8_0 weights' activations, %s, trial %d: value %zu: portable %d, "
                             "vector %d",
                             name, trial, i, q_want[i], q_got[i]);
            if (memcmp(xd_want, xd_got, sizeof xd_want) != 0)
                fail_msg("q8_0 weights' activations, %s, trial %d: the block scales differ", name,
                         trial);
        }
    }
    /* The probes reach the cases they are for. */
    px__rt_quant_act(PX_DTYPE_Q4_0, x, want, N);
    const int8_t *ties = (const int8_t *)(want + PX__RT_Q8_0_ACT_BYTES + 2);
    assert_int_equal(ties[1], -23); /* -22.5, away from zero */
    assert_int_equal(ties[2], -16); /* -15.5 */
    px__rt_quantize_q8_act_ref(x, N, q_want, xd_want);
    assert_int_equal(q_want[32 + 1], -22); /* to even */
    assert_int_equal(q_want[32 + 2], -16);
#else
    skip();
#endif
}

/* The quantized dot is close to the float dot of the dequantised weights:
 * its integer sums and scales are right, not merely consistent. */
static void test_quant_dot_close_to_float_dot(void **state)
{
    (void)state;
    px_rng r;
    px_rng_seed(&r, 11);
    enum { N = 1024 };
    static uint8_t w[N / 256 * 210 + N / 32 * 22], xq[PX__RT_QCHUNK_BYTES];
    static float x[N], wf[N];
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_dtype t = k_formats[f];
        double worst = 0;
        for (int trial = 0; trial < 20; trial++) {
            random_blocks(&r, t, w, N);
            random_floats(&r, x, N);
            px__rt_quant_dequant_row(t, w, wf, N);
            double exact = 0, norm = 0;
            for (int j = 0; j < N; j++) {
                exact += (double)wf[j] * x[j];
                norm += fabs((double)wf[j] * x[j]);
            }
            px__rt_quant_act(t, x, xq, N);
            double got = px__rt_quant_dot_portable(t, w, xq, N);
            worst = fmax(worst, fabs(got - exact) / norm);
        }
        /* 8-bit activations: about 1/254 of each product's magnitude. */
        if (worst > 0.01)
            fail_msg("%s: quantized dot off by %.3g of the sum of |products|", px_dtype_name(t),
                     worst);
    }
}

/* Through the kernel tables: each output the same whatever the row range
 * and the number of activation rows computed beside it, for rows longer
 * than a quantization chunk too. */
static void test_quant_matvec_independent_of_rows_and_batch(void **state)
{
    (void)state;
    const px__rt_kernels *variants[3] = {&px__rt_kernels_portable, px__rt_kernels_avx2(),
                                         px__rt_kernels_avx512()};
    px_rng r;
    px_rng_seed(&r, 5);
    enum { K = 4096 + 512, ROWS = 6 };
    size_t row_bytes_max = K / 256 * 210;
    uint8_t *w = malloc(ROWS * row_bytes_max);
    float *x = malloc(4 * K * sizeof(float));
    assert_non_null(w);
    assert_non_null(x);
    random_floats(&r, x, 4 * K);
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_dtype t = k_formats[f];
        size_t rb = (size_t)K / px_dtype_block_elems(t) * px_dtype_block_bytes(t);
        for (int i = 0; i < ROWS; i++)
            random_blocks(&r, t, w + i * rb, K);
        float ref[4 * ROWS];
        for (size_t v = 0; v < 3 && variants[v]; v++) {
            float all[4 * ROWS], one[4 * ROWS];
            variants[v]->matmul(t, w, rb, K, 0, ROWS, x, K, 4, all, ROWS);
            for (uint32_t i = 0; i < ROWS; i++)
                for (uint32_t rr = 0; rr < 4; rr++)
                    variants[v]->matmul(t, w, rb, K, i, i + 1, x + rr * K, K, 1, one + rr * ROWS,
                                        ROWS);
            assert_memory_equal(all, one, sizeof all);
            if (v == 0)
                memcpy(ref, all, sizeof ref);
            else
                assert_memory_equal(all, ref, sizeof ref);
        }
    }
    free(w);
    free(x);
}

/* Products of 7, 13, 23, 42 and 83 activation rows (groups of
 * PX__RT_QDOT_ROWS, and the avx512 k-quant prefill's groups of sixteen:
 * part-filled, in pairs, alone, and the rest four at a time) over more
 * weight rows than a tile (px__rt_tile_rows), neither a multiple of
 * its unit, and a row range starting and ending inside tiles: every
 * output equals the portable single dot (chunk by chunk past
 * PX__RT_QCHUNK values), and no output outside the range is written. */
static void test_quant_products_cross_tile_boundaries(void **state)
{
    (void)state;
    const px__rt_kernels *variants[3] = {&px__rt_kernels_portable, px__rt_kernels_avx2(),
                                         px__rt_kernels_avx512()};
    /* 7: four at a time; 13: a part-filled group of sixteen alone; 23: a full group beside a
     * part-filled one; 42: a pair and a part-filled group alone; 83: five groups (four in
     * pairs, one alone) and three rows four at a time. */
    static const uint32_t nxs[] = {7, 13, 23, 42, 83};
    /* 544: 17 blocks of 32 (Q4_0, Q5_0 alone), an odd number. */
    static const uint32_t ks[] = {512, PX__RT_QCHUNK + 256, 544};
    px_rng r;
    px_rng_seed(&r, 13);
    for (size_t c = 0; c < PX_ARRAY_LEN(nxs) * PX_ARRAY_LEN(k_formats); c++) {
        uint32_t nx = nxs[c / PX_ARRAY_LEN(k_formats)];
        size_t f = c % PX_ARRAY_LEN(k_formats);
        px_dtype t = k_formats[f];
        for (size_t kk = 0; kk < PX_ARRAY_LEN(ks); kk++) {
            uint32_t k = ks[kk];
            if (k % px_dtype_block_elems(t) != 0)
                continue;
            size_t rb = (size_t)k / px_dtype_block_elems(t) * px_dtype_block_bytes(t);
            uint32_t tile = px__rt_tile_rows(rb, nx);
            assert_true(tile < 4096);
            uint32_t rows = tile + tile / 2 + 3, i0 = 3, i1 = rows - 2;
            size_t ab = px__rt_quant_act_bytes(t, k);
            uint8_t *w = malloc(rows * rb), *xq = malloc(nx * ab);
            float *x = malloc((size_t)nx * k * sizeof(float));
            float *want = malloc((size_t)nx * rows * sizeof(float));
            float *got = malloc((size_t)nx * rows * sizeof(float));
            assert_true(w && xq && x && want && got);
            for (uint32_t i = 0; i < rows; i++)
                random_blocks(&r, t, w + i * rb, k);
            random_floats(&r, x, (size_t)nx * k);
            for (uint32_t q = 0; q < nx; q++)
                px__rt_quant_act(t, x + (size_t)q * k, xq + q * ab, k);
            for (uint32_t q = 0; q < nx; q++)
                for (uint32_t i = 0; i < rows; i++) {
                    float v = NAN;
                    for (uint32_t c0 = 0; c0 < k && i >= i0 && i < i1; c0 += PX__RT_QCHUNK) {
                        uint32_t n = PX_MIN(PX__RT_QCHUNK, k - c0);
                        float d = px__rt_quant_dot_portable(
                            t, w + i * rb + c0 / px_dtype_block_elems(t) * px_dtype_block_bytes(t),
                            xq + q * ab + px__rt_quant_act_bytes(t, c0), n);
                        v = c0 == 0 ? d : v + d;
                    }
                    want[(size_t)q * rows + i] = v;
                }
            for (size_t v = 0; v < 3 && variants[v]; v++)
                for (int path = 0; path < 3; path++) {
                    for (size_t j = 0; j < (size_t)nx * rows; j++)
                        got[j] = NAN;
                    if (path == 0)
                        variants[v]->matmul_quant(t, w, rb, k, i0, i1, xq, ab, nx, got, rows);
                    else if (path == 1)
                        variants[v]->matmul(t, w, rb, k, i0, i1, x, k, nx, got, rows);
                    else /* one activation row at a time (decode) */
                        for (uint32_t q = 0; q < nx; q++)
                            variants[v]->matmul_quant(t, w, rb, k, i0, i1, xq + q * ab, ab, 1,
                                                      got + (size_t)q * rows, rows);
                    for (size_t j = 0; j < (size_t)nx * rows; j++)
                        if (memcmp(&got[j], &want[j], sizeof(float)) != 0)
                            fail_msg("%s, k %u, %s %s of %u rows: activation row %zu, weight "
                                     "row %zu of [%u, %u): %.9g, the single dot %.9g",
                                     px_dtype_name(t), k, variants[v]->name,
                                     path == 1 ? "matmul"
                                     : path    ? "matmul_quant, one row"
                                               : "matmul_quant",
                                     nx, j / rows, j % rows, i0, i1, (double)got[j],
                                     (double)want[j]);
                }
            free(w);
            free(xq);
            free(x);
            free(want);
            free(got);
        }
    }
}

/* The q4_k x16 layout: every byte of a group where the layout says (d and dmin of row r at 2 r
 * and 32 + 2 r of a super-block's tile, dword j of its scales and quants at 64 + 64 (j - 1) +
 * 4 r); the rows layout a copy; what the layout cannot take refused, naming why. */
static void test_quant_q4_k_x16_layout_and_refusals(void **state)
{
    (void)state;
    px_rng r;
    px_rng_seed(&r, 23);
    enum { K = 512, ROWS = 32 };
    const size_t rb = K / 256 * 144;
    uint8_t *w = malloc(ROWS * rb), *p = malloc(ROWS * rb);
    assert_true(w && p);
    for (size_t i = 0; i < ROWS * rb; i++)
        w[i] = (uint8_t)px_rng_next(&r);
    px_err err;
    px_assert_ok(
        px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, PX_DTYPE_Q4_K, w, rb, ROWS, K, p, &err), &err);
    for (uint32_t g = 0; g < ROWS / 16; g++)
        for (uint32_t b = 0; b < K / 256; b++)
            for (uint32_t row = 0; row < 16; row++) {
                const uint8_t *blk = w + (g * 16 + row) * rb + b * 144;
                const uint8_t *tile = p + g * 16 * rb + b * PX__RT_Q4K16_TILE;
                assert_memory_equal(tile + 2 * row, blk, 2);
                assert_memory_equal(tile + 32 + 2 * row, blk + 2, 2);
                for (uint32_t j = 1; j < 36; j++)
                    assert_memory_equal(tile + 64 + 64 * (j - 1) + 4 * row, blk + 4 * j, 4);
            }
    px_assert_ok(px_rt_weights_repack(PX_RT_LAYOUT_ROWS, PX_DTYPE_Q4_K, w, rb, ROWS, K, p, &err),
                 &err);
    assert_memory_equal(p, w, ROWS * rb);
    assert_int_equal(
        px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, PX_DTYPE_Q6_K, w, 2 * 210, 8, K, p, &err),
        PX_EINVAL);
    px_assert_contains(err.msg, "q6_k");
    assert_int_equal(
        px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, PX_DTYPE_Q4_K, w, rb, 24, K, p, &err),
        PX_EINVAL);
    px_assert_contains(err.msg, "multiple of 16");
    assert_int_equal(px_rt_weights_repack(7, PX_DTYPE_Q4_K, w, rb, ROWS, K, p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "unknown layout 7");
    free(w);
    free(p);
}

/* The avx512 products of a q4_k x16 matrix, for 1, 3 and 13 activation rows of 256 to
 * PX__RT_QCHUNK + 512 values, of any magnitude and one holding an infinity, over the groups of
 * a range inside the matrix: every output bit for bit the portable single dot of its row as
 * stored (chunk by chunk past PX__RT_QCHUNK values), NaN where that is NaN, and nothing written
 * outside the range. */
static void test_quant_q4_k_x16_products_equal_portable(void **state)
{
    (void)state;
    const px__rt_kernels *k512 = px__rt_kernels_avx512();
    if (!k512) {
        print_message("skipped: no AVX-512 VNNI on this processor; no kernel takes the layout\n");
        skip();
    }
    assert_non_null(k512->matmul_q4_k16);
    assert_null(px__rt_kernels_portable.matmul_q4_k16);
    static const uint32_t ks[] = {256, 1024, PX__RT_QCHUNK + 512};
    static const uint32_t nxs[] = {1, 3, 13};
    enum { ROWS = 64, I0 = 16, I1 = 48 };
    const float sentinel = 12345.0f;
    px_rng r;
    px_rng_seed(&r, 29);
    for (size_t c = 0; c < PX_ARRAY_LEN(ks) * PX_ARRAY_LEN(nxs); c++) {
        uint32_t k = ks[c / PX_ARRAY_LEN(nxs)], nx = nxs[c % PX_ARRAY_LEN(nxs)];
        size_t rb = k / 256 * 144, ab = px__rt_quant_act_bytes(PX_DTYPE_Q4_K, k);
        uint8_t *w = malloc(ROWS * rb), *p = malloc(ROWS * rb), *xq = malloc(nx * ab);
        float *x = malloc((size_t)nx * k * sizeof(float));
        float *got = malloc((size_t)nx * ROWS * sizeof(float));
        assert_true(w && p && xq && x && got);
        for (uint32_t i = 0; i < ROWS; i++)
            random_blocks(&r, PX_DTYPE_Q4_K, w + i * rb, k);
        random_floats(&r, x, (size_t)nx * k);
        for (uint32_t q = 0; q < nx; q++) {
            float scale = ldexpf(1.0f, (int)px_rng_below(&r, 60) - 30);
            for (uint32_t i = 0; i < k; i++)
                x[(size_t)q * k + i] *= scale;
        }
        if (nx == 3)
            x[k + 7] = INFINITY;
        for (uint32_t q = 0; q < nx; q++)
            px__rt_quant_act(PX_DTYPE_Q4_K, x + (size_t)q * k, xq + q * ab, k);
        px_err err;
        px_assert_ok(
            px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, PX_DTYPE_Q4_K, w, rb, ROWS, k, p, &err),
            &err);
        for (size_t j = 0; j < (size_t)nx * ROWS; j++)
            got[j] = sentinel;
        k512->matmul_q4_k16(p, rb, k, I0, I1, xq, ab, nx, got, ROWS);
        for (uint32_t q = 0; q < nx; q++)
            for (uint32_t i = 0; i < ROWS; i++) {
                float want = sentinel;
                for (uint32_t c0 = 0; c0 < k && i >= I0 && i < I1; c0 += PX__RT_QCHUNK) {
                    float d = px__rt_quant_dot_portable(
                        PX_DTYPE_Q4_K, w + i * rb + c0 / 256 * 144,
                        xq + q * ab + px__rt_quant_act_bytes(PX_DTYPE_Q4_K, c0),
                        PX_MIN(PX__RT_QCHUNK, k - c0));
                    want = c0 == 0 ? d : want + d;
                }
                float v = got[(size_t)q * ROWS + i];
                if (isnan(want) ? !isnan(v) : memcmp(&v, &want, sizeof v) != 0)
                    fail_msg("k %u, %u activation rows: row %u of activation row %u: %.9g, the "
                             "portable dot %.9g",
                             k, nx, i, q, (double)v, (double)want);
            }
        if (nx == 3)
            assert_true(isnan(got[ROWS + I0]));
        free(w);
        free(p);
        free(xq);
        free(x);
        free(got);
    }
}

/* Hostile blocks: NaN and infinite scales, and activations holding NaN,
 * give NaN (never a crash nor a plausible number). */
static void test_quant_non_finite_inputs_give_nan(void **state)
{
    (void)state;
    px_rng r;
    px_rng_seed(&r, 3);
    static uint8_t w[256 / 32 * 22 + 256], xq[PX__RT_QCHUNK_BYTES];
    float x[256];
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_dtype t = k_formats[f];
        random_blocks(&r, t, w, 256);
        random_floats(&r, x, 256);
        x[17] = NAN;
        px__rt_quant_act(t, x, xq, 256);
        assert_true(isnan(px__rt_quant_dot_portable(t, w, xq, 256)));
        px__rt_quant_dot_fn avx2 = px__rt_quant_dot_avx2(), avx512 = px__rt_quant_dot_avx512();
        if (avx2)
            assert_true(isnan(avx2(t, w, xq, 256)));
        if (avx512)
            assert_true(isnan(avx512(t, w, xq, 256)));
        x[17] = INFINITY;
        px__rt_quant_act(t, x, xq, 256);
        assert_true(isnan(px__rt_quant_dot_portable(t, w, xq, 256)));
    }
}

typedef struct collected {
    int32_t ids[64];
    size_t n;
} collected;

static void collect(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)prompt, (void)piece, (void)len;
    collected *c = ud;
    if (c->n < PX_ARRAY_LEN(c->ids))
        c->ids[c->n++] = token;
}

static void greedy(px_rt_model *m, px_rt_tokenizer *tok, uint32_t threads, collected *c)
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = threads};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    const char *prompt = "The quantized model";
    c->n = 0;
    px_rt_generate_opts go = {
        .prompts = &prompt, .n_prompts = 1, .max_new_tokens = 10, .on_token = collect, .ud = c};
    px_rt_generate_stats st;
    px_assert_ok(px_rt_generate(s, tok, &go, &st, &err), &err);
    assert_int_equal(st.new_tokens, 10);
    px_rt_session_free(s);
}

/* Logits of the last position of `tokens` fed as one sequence, alone or
 * beside another sequence in the same step. */
static void last_logits(px_rt_model *m, const int32_t *tokens, uint32_t n, bool crowded, float *out)
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = 2, .max_batch_tokens = 64, .max_seqs = 2};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    int32_t a, b;
    px_assert_ok(px_rt_seq_add(s, &a, &err), &err);
    px_assert_ok(px_rt_seq_add(s, &b, &err), &err);
    int32_t other[7] = {5, 9, 77, 120, 33, 200, 61};
    px_rt_seq_step steps[2] = {{.seq = b, .pos = 0, .n_tokens = 7, .tokens = other},
                               {.seq = a, .pos = 0, .n_tokens = n, .tokens = tokens}};
    px_rt_batch batch = {.n_seqs = crowded ? 2 : 1, .seqs = crowded ? steps : steps + 1};
    px_rt_output o;
    px_assert_ok(px_rt_forward(s, &batch, NULL, &o, &err), &err);
    uint32_t vocab = px_rt_model_hparams(m)->vocab_size;
    memcpy(out, o.data + (size_t)(o.n_rows - 1) * o.row_len, vocab * sizeof(float));
    px_rt_session_free(s);
}

static void check_model_runs(const char *recipe)
{
    char name[128];
    snprintf(name, sizeof name, "quant/synth-%s.gguf", recipe);
    px_ir_model *ir = open_shared(name);
    px_err err;
    px_rt_model *m;
    px_rt_tokenizer *tok;
    px_assert_ok(px_rt_model_new(ir, &m, &err), &err);
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &tok, &err), &err);
    collected one, two;
    greedy(m, tok, 1, &one);
    greedy(m, tok, 2, &two);
    assert_int_equal(one.n, two.n);
    assert_memory_equal(one.ids, two.ids, one.n * sizeof(int32_t));
    int32_t seq[12] = {1, 84, 104, 101, 32, 113, 117, 97, 110, 116, 105, 122};
    uint32_t vocab = px_rt_model_hparams(m)->vocab_size;
    float *alone = malloc(vocab * sizeof(float)), *crowded = malloc(vocab * sizeof(float));
    last_logits(m, seq, 12, false, alone);
    last_logits(m, seq, 12, true, crowded);
    assert_memory_equal(alone, crowded, vocab * sizeof(float));
    for (uint32_t i = 0; i < vocab; i++)
        assert_true(isfinite(alone[i]));
    free(alone);
    free(crowded);
    px_rt_tokenizer_free(tok);
    px_rt_model_free(m);
    px_ir_model_free(ir);
}

static void test_quant_models_generate_the_same_for_any_threads_and_batch(void **state)
{
    (void)state;
    static const char *recipes[] = {"q4_0", "q5_0", "q4_k_m", "q5_k_m", "q6_k", "q3_k_m", "q2_k"};
    /* Under ThreadSanitizer three of the seven formats run the pool. */
    for (size_t i = 0; i < PX_ARRAY_LEN(recipes); i += PX_TEST_WORKLOAD(1, 3))
        check_model_runs(recipes[i]);
}

/* Logits of the last of a few tokens on a device of `backend`. */
static float *device_logits(px_rt_model *m, const char *backend, const char *profile, bool portable)
{
    int32_t seq[6] = {1, 72, 101, 108, 108, 111};
    px_err err;
    px_rt_device *dev;
    px_rt_device_opts o = {.n_threads = 2, .portable_kernels = portable, .profile = profile};
    px_assert_ok(px_rt_emu_register(&err), &err);
    px_assert_ok(px_rt_device_open(backend, &o, &dev, &err), &err);
    px_rt_session_opts so = {.device = dev, .max_seqs = 1, .max_batch_tokens = 16};
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    int32_t id;
    px_assert_ok(px_rt_seq_add(s, &id, &err), &err);
    px_rt_seq_step step = {.seq = id, .pos = 0, .n_tokens = 6, .tokens = seq};
    px_rt_batch batch = {.n_seqs = 1, .seqs = &step};
    px_rt_output out;
    px_assert_ok(px_rt_forward(s, &batch, NULL, &out, &err), &err);
    float *v = malloc(out.row_len * sizeof(float));
    assert_non_null(v);
    memcpy(v, out.data, out.row_len * sizeof(float));
    px_rt_session_free(s);
    px_rt_device_free(dev);
    return v;
}

/* The logits of a prefill of 20 tokens, then of a decode step of three sequences (one token
 * beside two new prompts), on a session of m over dev; *info its info. */
static float *steps_logits(px_rt_model *m, px_rt_device *dev, px_rt_session **keep,
                           px_rt_session_info *info, size_t *n)
{
    px_err err;
    px_rt_session_opts so = {.device = dev, .max_seqs = 3, .max_batch_tokens = 32};
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    px_rt_session_info_get(s, info);
    int32_t id[3];
    for (int i = 0; i < 3; i++)
        px_assert_ok(px_rt_seq_add(s, &id[i], &err), &err);
    int32_t prompt[20], next = 7, two[2] = {40, 41}, one = 300;
    for (int i = 0; i < 20; i++)
        prompt[i] = (i * 37 + 11) % 500;
    uint32_t vocab = px_rt_model_hparams(m)->vocab_size;
    float *v = malloc(4 * vocab * sizeof(float));
    assert_non_null(v);
    px_rt_seq_step a = {.seq = id[0], .pos = 0, .n_tokens = 20, .tokens = prompt};
    px_rt_output out;
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &a}, NULL, &out, &err), &err);
    memcpy(v, out.data + (size_t)(out.n_rows - 1) * out.row_len, vocab * sizeof(float));
    px_rt_seq_step b[3] = {{.seq = id[0], .pos = 20, .n_tokens = 1, .tokens = &next},
                           {.seq = id[1], .pos = 0, .n_tokens = 2, .tokens = two},
                           {.seq = id[2], .pos = 0, .n_tokens = 1, .tokens = &one}};
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 3, .seqs = b}, NULL, &out, &err), &err);
    assert_int_equal(out.n_rows, 3);
    memcpy(v + vocab, out.data, 3 * (size_t)vocab * sizeof(float));
    *n = 4 * (size_t)vocab;
    *keep = s;
    return v;
}

/* A q4_K_M model on a cpu device whose kernels take the x16 layout: its Q4_K matrices
 * repacked once for all the model's sessions (a second session's are the first's bytes), the
 * embedding table (tied: the classifier's too, Q6_K in this recipe) read as stored, and the
 * logits of a prefill and of a decode step of three sequences bit for bit those of the
 * emulated device, which reads the rows as stored. */
static void test_quant_q4_k_x16_sessions_share_repack_and_match_rows(void **state)
{
    (void)state;
    px_err err;
    char f32_path[512], q4_path[512];
    snprintf(f32_path, sizeof f32_path, "%s/tied-f32.gguf", px_test_tmpdir());
    snprintf(q4_path, sizeof q4_path, "%s/tied-q4_k_m.gguf", px_test_tmpdir());
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 256, o.hidden_dim = 512, o.n_layers = 2, o.n_heads = 4, o.n_kv_heads = 2;
    o.tied_classifier = true, o.seed = 5;
    px_assert_ok(px_ir_synth_write(&o, f32_path, &err), &err);
    px_assert_ok(px_rt_quantize_file(f32_path, q4_path, "q4_k_m", NULL, &err), &err);
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(q4_path, &m, &err), &err);
    px_rt_device *cpu[2], *emu;
    px_rt_device_opts dopts = {.n_threads = 2};
    for (int i = 0; i < 2; i++)
        px_assert_ok(px_rt_device_open("cpu", &dopts, &cpu[i], &err), &err);
    if (px_rt_device_weight_layout(cpu[0], PX_DTYPE_Q4_K, 256, 256) != PX_RT_LAYOUT_Q4_K_X16) {
        print_message("skipped: this processor's kernels take no q4_k layout of their own\n");
        for (int i = 0; i < 2; i++)
            px_rt_device_free(cpu[i]);
        px_rt_model_free(m);
        skip();
    }
    px_assert_ok(px_rt_emu_register(&err), &err);
    px_assert_ok(px_rt_device_open("emu", &dopts, &emu, &err), &err);
    uint32_t q4 = 0;
    const px_ir_model *ir = px_rt_model_ir(m);
    for (size_t i = 0; i < px_ir_model_n_tensors(ir); i++) {
        const px_ir_tensor *t = px_ir_model_tensor(ir, i);
        q4 += t->dtype == PX_DTYPE_Q4_K && t->ne[1] > 1;
    }
    const px_ir_tensor *embd = m->tok_embd;
    print_message("%u q4_k matrices; token_embd (the classifier too) is %s\n", q4,
                  px_dtype_name(embd->dtype));
    px_rt_session *sa, *sb, *se;
    px_rt_session_info ia, ib, ie;
    size_t n;
    float *a = steps_logits(m, cpu[0], &sa, &ia, &n), *b = steps_logits(m, cpu[1], &sb, &ib, &n);
    float *e = steps_logits(m, emu, &se, &ie, &n);
    assert_true(q4 > 0);
    assert_int_equal(ia.weights_repacked, q4);
    assert_int_equal(ib.weights_repacked, q4);
    assert_int_equal(ie.weights_repacked, 0);
    assert_true(ia.repacked_bytes > 0 && ia.weights_copied);
    assert_true(px_rt_buffer_base(sa->layers[0].w1.buffer) ==
                px_rt_buffer_base(sb->layers[0].w1.buffer));
    assert_int_equal(sa->layers[0].w1.layout, PX_RT_LAYOUT_Q4_K_X16);
    assert_int_equal(sa->tok_embd.layout, PX_RT_LAYOUT_ROWS);
    assert_memory_equal(a, e, n * sizeof(float));
    assert_memory_equal(a, b, n * sizeof(float));
    free(a);
    free(b);
    free(e);
    px_rt_session_free(sa);
    px_rt_session_free(sb);
    px_rt_session_free(se);
    for (int i = 0; i < 2; i++)
        px_rt_device_free(cpu[i]);
    px_rt_device_free(emu);
    px_rt_model_free(m);
}

/* A model gives the same logits on the emulated device as on the cpu (and
 * its pacing counts each format's bytes), and close ones with the
 * portable kernels. */
static void test_quant_models_same_on_portable_avx2_and_emu(void **state)
{
    (void)state;
    int64_t wne[2] = {512, 64}, xne[2] = {512, 1}, yne[2] = {64, 1};
    px_rt_tensor w, x, y;
    px_err err;
    px_assert_ok(px_rt_tensor_init(&x, PX_DTYPE_F32, 2, xne, &err), &err);
    px_assert_ok(px_rt_tensor_init(&y, PX_DTYPE_F32, 2, yne, &err), &err);
    for (size_t f = 0; f < PX_ARRAY_LEN(k_formats); f++) {
        px_assert_ok(px_rt_tensor_init(&w, k_formats[f], 2, wne, &err), &err);
        px_rt_op mv = {.kind = PX_IR_OP_MATMUL, .src = {&x, &w}, .dst = &y};
        uint64_t flops, bytes;
        px_rt_op_cost(&mv, &flops, &bytes);
        assert_int_equal(flops, 2 * 512 * 64);
        assert_int_equal(bytes, 64 * 512 / px_dtype_block_elems(k_formats[f]) *
                                        px_dtype_block_bytes(k_formats[f]) +
                                    (512 + 64) * 4);
    }
    static const char *recipes[] = {"q4_0", "q5_0", "q4_k_m", "q5_k_m", "q6_k", "q3_k_m", "q2_k"};
    for (size_t r = 0; r < PX_ARRAY_LEN(recipes); r += PX_TEST_WORKLOAD(1, 3)) {
        char name[64];
        snprintf(name, sizeof name, "quant/synth-%s.gguf", recipes[r]);
        px_ir_model *ir = open_shared(name);
        px_rt_model *m;
        px_assert_ok(px_rt_model_new(ir, &m, &err), &err);
        size_t bytes = px_rt_model_hparams(m)->vocab_size * sizeof(float);
        float *fast = device_logits(m, "cpu", NULL, false);
        float *portable = device_logits(m, "cpu", NULL, true);
        float *emu =
            device_logits(m, "emu", "{\"compute_slowdown\": 1.5, \"memory_slowdown\": 2}", false);
        /* The block formats' products are identical on both variants
         * (tested above); the f32 ops around them (norms, attention) may
         * differ in the last bits, and a last-bit difference can move an
         * activation across an 8-bit rounding boundary: close, not equal. */
        uint32_t vocab = px_rt_model_hparams(m)->vocab_size;
        double diff = 0, scale = 0;
        for (uint32_t i = 0; i < vocab; i++) {
            diff = fmax(diff, fabs((double)fast[i] - portable[i]));
            scale = fmax(scale, fabs((double)fast[i]));
        }
        if (diff > 0.05 * scale)
            fail_msg("%s: portable and vectorised logits differ by %g (largest %g)", recipes[r],
                     diff, scale);
        assert_memory_equal(fast, emu, bytes);
        free(fast);
        free(portable);
        free(emu);
        px_rt_model_free(m);
        px_ir_model_free(ir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_0_dequantizes_like_the_reference),
        cmocka_unit_test(test_q5_0_dequantizes_like_the_reference),
        cmocka_unit_test(test_q4_k_m_dequantizes_like_the_reference),
        cmocka_unit_test(test_q5_k_m_dequantizes_like_the_reference),
        cmocka_unit_test(test_q6_k_dequantizes_like_the_reference),
        cmocka_unit_test(test_q3_k_m_dequantizes_like_the_reference),
        cmocka_unit_test(test_q2_k_dequantizes_like_the_reference),
        cmocka_unit_test(test_quant_avx2_and_avx512_dots_equal_portable_bit_for_bit),
        cmocka_unit_test(test_quant_decode_dots_equal_portable_for_any_scales),
        cmocka_unit_test(test_quant_avx512_several_row_dots_equal_portable_per_row),
        cmocka_unit_test(test_quant_avx512_activations_equal_portable_bytes),
        cmocka_unit_test(test_quant_q8_0_activations_equal_portable_bytes),
        cmocka_unit_test(test_quant_q4_0_q5_0_dot_adds_blocks_in_four_groups),
        cmocka_unit_test(test_quant_dot_close_to_float_dot),
        cmocka_unit_test(test_quant_matvec_independent_of_rows_and_batch),
        cmocka_unit_test(test_quant_products_cross_tile_boundaries),
        cmocka_unit_test(test_quant_q4_k_x16_layout_and_refusals),
        cmocka_unit_test(test_quant_q4_k_x16_products_equal_portable),
        cmocka_unit_test(test_quant_non_finite_inputs_give_nan),
        cmocka_unit_test(test_quant_models_generate_the_same_for_any_threads_and_batch),
        cmocka_unit_test(test_quant_models_same_on_portable_avx2_and_emu),
        cmocka_unit_test(test_quant_q4_k_x16_sessions_share_repack_and_match_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
