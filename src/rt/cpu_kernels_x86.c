/*
 * AVX2 + FMA + F16C cpu kernels, chosen at run time when the processor
 * has them (the rest of the build stays at the baseline instruction set).
 *
 * A matrix-vector product streams each weight row once and dots it with
 * up to PX_RT_SMALL_BATCH activation vectors: decode is bound by memory
 * bandwidth, so reading the weights once per step is what matters.  Each
 * dot keeps two 8-wide partial sums over 16 values at a time and reduces
 * them in a fixed order, the same for any number of vectors and any row
 * range, which keeps results independent of batching and threads.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <cpuid.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
/* Inlined into each caller, so that dtype and vector count are constants. */
#define INLINE static inline __attribute__((always_inline)) TGT

static inline TGT float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline uint16_t load_u16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Eight values of a row of dtype t starting at value j, as floats. */
INLINE __m256 load8(px_dtype t, const uint8_t *w, uint32_t j)
{
    switch (t) {
    case PX_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * (size_t)j)));
    case PX_DTYPE_BF16: {
        __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * (size_t)j)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    }
    default:
        return _mm256_loadu_ps((const float *)(const void *)(w + 4 * (size_t)j));
    }
}

static inline float value_at(px_dtype t, const uint8_t *w, uint32_t j)
{
    switch (t) {
    case PX_DTYPE_F16:
        return px__rt_f16(load_u16(w + 2 * (size_t)j));
    case PX_DTYPE_BF16:
        return px__rt_bf16(load_u16(w + 2 * (size_t)j));
    default: {
        float f;
        memcpy(&f, w + 4 * (size_t)j, sizeof f);
        return f;
    }
    }
}

/* One row of a plain dtype against N vectors.  N is a constant in each
 * instantiation, so the partial sums stay in registers. */
INLINE void row_plain(px_dtype t, const uint8_t *w, uint32_t k, const float *x, size_t ldx,
                      uint32_t N, float *out)
{
    __m256 a0[PX_RT_SMALL_BATCH], a1[PX_RT_SMALL_BATCH];
    for (uint32_t r = 0; r < N; r++)
        a0[r] = a1[r] = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m256 w0 = load8(t, w, j), w1 = load8(t, w, j + 8);
        for (uint32_t r = 0; r < N; r++) {
            const float *xr = x + r * ldx + j;
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a1[r]);
        }
    }
    if (j + 8 <= k) {
        __m256 w0 = load8(t, w, j);
        for (uint32_t r = 0; r < N; r++)
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + j), a0[r]);
        j += 8;
    }
    for (uint32_t r = 0; r < N; r++) {
        float s = hsum(_mm256_add_ps(a0[r], a1[r]));
        for (uint32_t jj = j; jj < k; jj++)
            s += value_at(t, w, jj) * x[r * ldx + jj];
        out[r] = s;
    }
}

static inline TGT __m256 q8_load8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* One q8_0 row against N vectors: per block, the dot of the 32 int8
 * values with x, then scaled and added to the row's sum. */
INLINE void row_q8_0(const uint8_t *w, uint32_t k, const float *x, size_t ldx, uint32_t N,
                     float *out)
{
    __m256 acc[PX_RT_SMALL_BATCH];
    for (uint32_t r = 0; r < N; r++)
        acc[r] = _mm256_setzero_ps();
    uint32_t nb = k / PX__RT_Q8_0_ELEMS;
    for (uint32_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * PX__RT_Q8_0_BYTES;
        const int8_t *q = (const int8_t *)(blk + 2);
        __m256 d = _mm256_set1_ps(px__rt_f16(load_u16(blk)));
        __m256 q0 = q8_load8(q), q1 = q8_load8(q + 8), q2 = q8_load8(q + 16), q3 = q8_load8(q + 24);
        for (uint32_t r = 0; r < N; r++) {
            const float *xr = x + r * ldx + (size_t)b * PX__RT_Q8_0_ELEMS;
            __m256 v = _mm256_mul_ps(q0, _mm256_loadu_ps(xr));
            v = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xr + 8), v);
            v = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xr + 16), v);
            v = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xr + 24), v);
            acc[r] = _mm256_fmadd_ps(d, v, acc[r]);
        }
    }
    for (uint32_t r = 0; r < N; r++)
        out[r] = hsum(acc[r]);
}

/* The row loop for one dtype, with the row kernel inlined so that the
 * dtype is a constant inside it. */
#define ROWS(CALL)                                      \
    for (uint32_t i = i0; i < i1; i++) {                \
        const uint8_t *row = w + (size_t)i * row_bytes; \
        CALL;                                           \
        for (uint32_t r = 0; r < N; r++)                \
            y[r * ldy + i] = out[r];                    \
    }

#define MATVEC_N(NV)                                                                            \
    static TGT void matvec_##NV(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,     \
                                uint32_t i0, uint32_t i1, const float *x, size_t ldx, float *y, \
                                size_t ldy)                                                     \
    {                                                                                           \
        enum { N = NV };                                                                        \
        float out[PX_RT_SMALL_BATCH];                                                           \
        switch (t) {                                                                            \
        case PX_DTYPE_Q8_0:                                                                     \
            ROWS(row_q8_0(row, k, x, ldx, N, out));                                             \
            break;                                                                              \
        case PX_DTYPE_F16:                                                                      \
            ROWS(row_plain(PX_DTYPE_F16, row, k, x, ldx, N, out));                              \
            break;                                                                              \
        case PX_DTYPE_BF16:                                                                     \
            ROWS(row_plain(PX_DTYPE_BF16, row, k, x, ldx, N, out));                             \
            break;                                                                              \
        default:                                                                                \
            ROWS(row_plain(PX_DTYPE_F32, row, k, x, ldx, N, out));                              \
            break;                                                                              \
        }                                                                                       \
    }

MATVEC_N(1)
MATVEC_N(2)
MATVEC_N(3)
MATVEC_N(4)

static void matvec(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                   uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    const uint8_t *wb = w;
    if (px__rt_quant_handles(t)) {
        px__rt_quant_matvec(px__rt_quant_dot_x86, t, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        return;
    }
    switch (n_x) {
    case 1:
        matvec_1(t, wb, row_bytes, k, i0, i1, x, ldx, y, ldy);
        break;
    case 2:
        matvec_2(t, wb, row_bytes, k, i0, i1, x, ldx, y, ldy);
        break;
    case 3:
        matvec_3(t, wb, row_bytes, k, i0, i1, x, ldx, y, ldy);
        break;
    default:
        PX_ASSERT(n_x == 4);
        matvec_4(t, wb, row_bytes, k, i0, i1, x, ldx, y, ldy);
        break;
    }
}

static TGT void dequant(px_dtype t, const void *row, float *dst, uint32_t k)
{
    const uint8_t *w = row;
    if (px__rt_quant_handles(t)) {
        px__rt_quant_dequant_row(t, row, dst, k);
        return;
    }
    if (t == PX_DTYPE_Q8_0) {
        for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++) {
            const uint8_t *blk = w + (size_t)b * PX__RT_Q8_0_BYTES;
            const int8_t *q = (const int8_t *)(blk + 2);
            __m256 d = _mm256_set1_ps(px__rt_f16(load_u16(blk)));
            float *o = dst + (size_t)b * PX__RT_Q8_0_ELEMS;
            for (uint32_t j = 0; j < PX__RT_Q8_0_ELEMS; j += 8)
                _mm256_storeu_ps(o + j, _mm256_mul_ps(d, q8_load8(q + j)));
        }
        return;
    }
    uint32_t j = 0;
    for (; j + 8 <= k; j += 8)
        _mm256_storeu_ps(dst + j, load8(t, w, j));
    for (; j < k; j++)
        dst[j] = value_at(t, w, j);
}

static TGT float dot_f32(const float *a, const float *b, uint32_t n)
{
    __m256 acc = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    float s = hsum(acc);
    for (; j < n; j++)
        s += a[j] * b[j];
    return s;
}

static TGT void axpy_f32(float a, const float *x, float *y, uint32_t n)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    for (; j < n; j++)
        y[j] += a * x[j];
}

static const px__rt_kernels kernels_avx2 = {
    .name = "avx2",
    .matvec = matvec,
    .dequant = dequant,
    .dot_f32 = dot_f32,
    .axpy_f32 = axpy_f32,
};

/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
 * does not know the feature. */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

const px__rt_kernels *px__rt_kernels_avx2(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        return &kernels_avx2;
    return NULL;
}

#endif
