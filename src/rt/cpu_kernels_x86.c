/*
 * AVX2 + FMA + F16C cpu kernels, chosen at run time when the processor
 * has them (the rest of the build stays at the baseline instruction set).
 *
 * A matrix product runs groups of up to PX_RT_SMALL_BATCH activation
 * rows against each weight row; a larger product runs in tiles of weight
 * rows that stay in the second-level cache while every group passes, so
 * the weights stream from memory once per product.  Each float dot keeps
 * two 8-wide partial sums over 16 values at a time and reduces them in a
 * fixed
 * order, the same for any number of rows and any row range, which keeps
 * results independent of batching and threads.  q8_0 weights meet
 * activations quantized to q8_0 with integer products (maddubs, madd),
 * in px__rt_dot_q8_0's order.  With one vector (decode), row i of the
 * first half of a row range runs beside row i + h of the second, each
 * with its own sums: twice the independent chains, each half still read
 * in order.  Processors with AVX-512 run
 * cpu_kernels_avx512.c instead, which computes the same bits faster.
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

/* Two rows of a plain dtype, `apart` bytes from each other, against one
 * vector: each row's sums are row_plain's with N = 1, bit for bit, but
 * the two rows' four chains of fused multiply-adds run side by side.
 * One row's two chains held f16 and bf16 decode to a chain's latency per
 * 16 values, below what memory delivers. */
INLINE void row_plain_pair(px_dtype t, const uint8_t *w, size_t apart, uint32_t k, const float *x,
                           float *out0, float *out1)
{
    const uint8_t *v = w + apart;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    uint32_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
        a0 = _mm256_fmadd_ps(load8(t, w, j), x0, a0);
        a1 = _mm256_fmadd_ps(load8(t, w, j + 8), x1, a1);
        b0 = _mm256_fmadd_ps(load8(t, v, j), x0, b0);
        b1 = _mm256_fmadd_ps(load8(t, v, j + 8), x1, b1);
    }
    if (j + 8 <= k) {
        __m256 x0 = _mm256_loadu_ps(x + j);
        a0 = _mm256_fmadd_ps(load8(t, w, j), x0, a0);
        b0 = _mm256_fmadd_ps(load8(t, v, j), x0, b0);
        j += 8;
    }
    float s = hsum(_mm256_add_ps(a0, a1)), u = hsum(_mm256_add_ps(b0, b1));
    for (uint32_t jj = j; jj < k; jj++) {
        s += value_at(t, w, jj) * x[jj];
        u += value_at(t, v, jj) * x[jj];
    }
    *out0 = s;
    *out1 = u;
}

static inline TGT __m256 q8_load8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* The 8 int32 sums of four int8 products each of a q8_0 block with an
 * activation block: |w| (unsigned) times x with w's sign, in pairs
 * (at most 2 * 128 * 127, so maddubs never saturates), then in fours. */
static inline TGT __m256i q8_block_sums(__m256i ax, __m256i wv, __m256i xv)
{
    __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Block b of a q8_0 row against N quantized activation rows, added to
 * acc (the partial sums of the block's parity). */
INLINE void q8_block(const uint8_t *w, uint32_t b, uint32_t k, const int8_t *xq, const float *xd,
                     uint32_t N, __m256 *acc)
{
    uint32_t nb = k / PX__RT_Q8_0_ELEMS;
    const uint8_t *blk = w + (size_t)b * PX__RT_Q8_0_BYTES;
    __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i ax = _mm256_abs_epi8(wv);
    float dw = _cvtsh_ss(load_u16(blk));
    for (uint32_t r = 0; r < N; r++) {
        const int8_t *xb = xq + (size_t)r * k + (size_t)b * PX__RT_Q8_0_ELEMS;
        __m256i xv = _mm256_loadu_si256((const __m256i *)xb);
        __m256 sum = _mm256_cvtepi32_ps(q8_block_sums(ax, wv, xv));
        __m256 scale = _mm256_set1_ps(dw * xd[(size_t)r * nb + b]);
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(scale, sum));
    }
}

/* One q8_0 row against N quantized activation rows (px__rt_dot_q8_0's
 * order: even blocks into acc0, odd into acc1, scale product not fused). */
INLINE void row_q8_0(const uint8_t *w, uint32_t k, const int8_t *xq, const float *xd, uint32_t N,
                     float *out)
{
    __m256 acc0[PX_RT_SMALL_BATCH], acc1[PX_RT_SMALL_BATCH];
    for (uint32_t r = 0; r < N; r++)
        acc0[r] = acc1[r] = _mm256_setzero_ps();
    uint32_t nb = k / PX__RT_Q8_0_ELEMS, b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8_block(w, b, k, xq, xd, N, acc0);
        q8_block(w, b + 1, k, xq, xd, N, acc1);
    }
    if (b < nb)
        q8_block(w, b, k, xq, xd, N, acc0);
    for (uint32_t r = 0; r < N; r++)
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
}

/* Two q8_0 rows, `apart` bytes from each other, against one quantized
 * vector: row_q8_0's sums with N = 1 for each, side by side. */
INLINE void row_q8_0_pair(const uint8_t *w, size_t apart, uint32_t k, const int8_t *xq,
                          const float *xd, float *out0, float *out1)
{
    const uint8_t *v = w + apart;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    uint32_t nb = k / PX__RT_Q8_0_ELEMS, b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8_block(w, b, k, xq, xd, 1, &a0);
        q8_block(v, b, k, xq, xd, 1, &b0);
        q8_block(w, b + 1, k, xq, xd, 1, &a1);
        q8_block(v, b + 1, k, xq, xd, 1, &b1);
    }
    if (b < nb) {
        q8_block(w, b, k, xq, xd, 1, &a0);
        q8_block(v, b, k, xq, xd, 1, &b0);
    }
    *out0 = hsum(_mm256_add_ps(a0, a1));
    *out1 = hsum(_mm256_add_ps(b0, b1));
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

/* One vector (decode): row i of the first half of [i0, i1) beside row
 * i + h of the second, so that each half streams from memory in order
 * (two neighbouring rows side by side measured half as fast, in
 * bench_rt_decode); the odd row last, alone. */
#define ROWS_PAIRED(PAIR, ONE)                              \
    {                                                       \
        uint32_t h = (i1 - i0) / 2;                         \
        for (uint32_t i = i0; i < i0 + h; i++) {            \
            const uint8_t *row = w + (size_t)i * row_bytes; \
            size_t apart = (size_t)h * row_bytes;           \
            PAIR;                                           \
        }                                                   \
        for (uint32_t i = i0 + 2 * h; i < i1; i++) {        \
            const uint8_t *row = w + (size_t)i * row_bytes; \
            ONE;                                            \
        }                                                   \
    }

#define MATVEC_N(NV)                                                                              \
    static TGT void matvec_##NV(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,       \
                                uint32_t i0, uint32_t i1, const float *x, size_t ldx, float *y,   \
                                size_t ldy)                                                       \
    {                                                                                             \
        enum { N = NV };                                                                          \
        float out[PX_RT_SMALL_BATCH];                                                             \
        if (N == 1) {                                                                             \
            switch (t) {                                                                          \
            case PX_DTYPE_F16:                                                                    \
                ROWS_PAIRED(row_plain_pair(PX_DTYPE_F16, row, apart, k, x, y + i, y + i + h),     \
                            row_plain(PX_DTYPE_F16, row, k, x, ldx, 1, y + i));                   \
                return;                                                                           \
            case PX_DTYPE_BF16:                                                                   \
                ROWS_PAIRED(row_plain_pair(PX_DTYPE_BF16, row, apart, k, x, y + i, y + i + h),    \
                            row_plain(PX_DTYPE_BF16, row, k, x, ldx, 1, y + i));                  \
                return;                                                                           \
            default:                                                                              \
                ROWS_PAIRED(row_plain_pair(PX_DTYPE_F32, row, apart, k, x, y + i, y + i + h),     \
                            row_plain(PX_DTYPE_F32, row, k, x, ldx, 1, y + i));                   \
                return;                                                                           \
            }                                                                                     \
        }                                                                                         \
        switch (t) {                                                                              \
        case PX_DTYPE_F16:                                                                        \
            ROWS(row_plain(PX_DTYPE_F16, row, k, x, ldx, N, out));                                \
            break;                                                                                \
        case PX_DTYPE_BF16:                                                                       \
            ROWS(row_plain(PX_DTYPE_BF16, row, k, x, ldx, N, out));                               \
            break;                                                                                \
        default:                                                                                  \
            ROWS(row_plain(PX_DTYPE_F32, row, k, x, ldx, N, out));                                \
            break;                                                                                \
        }                                                                                         \
    }                                                                                             \
    static TGT void matvec_q8_0_##NV(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0, \
                                     uint32_t i1, const int8_t *xq, const float *xd, float *y,    \
                                     size_t ldy)                                                  \
    {                                                                                             \
        enum { N = NV };                                                                          \
        float out[PX_RT_SMALL_BATCH];                                                             \
        if (N == 1) {                                                                             \
            ROWS_PAIRED(row_q8_0_pair(row, apart, k, xq, xd, y + i, y + i + h),                   \
                        row_q8_0(row, k, xq, xd, 1, y + i));                                      \
            return;                                                                               \
        }                                                                                         \
        ROWS(row_q8_0(row, k, xq, xd, N, out));                                                   \
    }

MATVEC_N(1)
MATVEC_N(2)
MATVEC_N(3)
MATVEC_N(4)

void px__rt_avx2_matmul(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                        uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y,
                        size_t ldy);
void px__rt_avx2_matmul_q8_0(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                             const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy);

/* Weight rows [i0, i1) against every x row, PX_RT_SMALL_BATCH x rows at
 * a time: a row's result is the same in every group. */
static void groups_plain(px_dtype t, const uint8_t *wb, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y,
                         size_t ldy)
{
    for (uint32_t r = 0; r < n_x; r += PX_RT_SMALL_BATCH) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        switch (PX_MIN(n_x - r, PX_RT_SMALL_BATCH)) {
        case 1:
            matvec_1(t, wb, row_bytes, k, i0, i1, xr, ldx, yr, ldy);
            break;
        case 2:
            matvec_2(t, wb, row_bytes, k, i0, i1, xr, ldx, yr, ldy);
            break;
        case 3:
            matvec_3(t, wb, row_bytes, k, i0, i1, xr, ldx, yr, ldy);
            break;
        default:
            matvec_4(t, wb, row_bytes, k, i0, i1, xr, ldx, yr, ldy);
            break;
        }
    }
}

static void groups_q8_0(const uint8_t *wb, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                        const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy)
{
    uint32_t nb = k / PX__RT_Q8_0_ELEMS;
    for (uint32_t r = 0; r < n_x; r += PX_RT_SMALL_BATCH) {
        const int8_t *qr = xq + (size_t)r * k;
        const float *dr = xd + (size_t)r * nb;
        float *yr = y + (size_t)r * ldy;
        switch (PX_MIN(n_x - r, PX_RT_SMALL_BATCH)) {
        case 1:
            matvec_q8_0_1(wb, row_bytes, k, i0, i1, qr, dr, yr, ldy);
            break;
        case 2:
            matvec_q8_0_2(wb, row_bytes, k, i0, i1, qr, dr, yr, ldy);
            break;
        case 3:
            matvec_q8_0_3(wb, row_bytes, k, i0, i1, qr, dr, yr, ldy);
            break;
        default:
            matvec_q8_0_4(wb, row_bytes, k, i0, i1, qr, dr, yr, ldy);
            break;
        }
    }
}

static void matmul_quant(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy);

void px__rt_avx2_matmul(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                        uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    if (px__rt_quant_handles(t)) {
        px__rt_quant_matmul(matmul_quant, t, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        return;
    }
    uint32_t tile = px__rt_tile_rows(row_bytes, n_x);
    for (uint32_t b = i0; b < i1; b += PX_MIN(tile, i1 - b))
        groups_plain(t, w, row_bytes, k, b, b + PX_MIN(tile, i1 - b), x, ldx, n_x, y, ldy);
}

void px__rt_avx2_matmul_q8_0(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                             const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy)
{
    uint32_t tile = px__rt_tile_rows(row_bytes, n_x);
    for (uint32_t b = i0; b < i1; b += PX_MIN(tile, i1 - b))
        groups_q8_0(w, row_bytes, k, b, b + PX_MIN(tile, i1 - b), xq, xd, n_x, y, ldy);
}

/* Shared with the avx512 variant (cpu_kernels_avx512.c). */
void px__rt_avx2_dequant(px_dtype t, const void *row, float *dst, uint32_t k);
float px__rt_avx2_dot_f32(const float *a, const float *b, uint32_t n);
void px__rt_avx2_axpy_f32(float a, const float *x, float *y, uint32_t n);
void px__rt_avx2_attn_scores(const float *q, const float *base, size_t stride, const uint32_t *rows,
                             size_t n, uint32_t hd, float scale, float *out);
void px__rt_avx2_attn_values(const float *w, const float *base, size_t stride, const uint32_t *rows,
                             size_t n, uint32_t hd, float *out);
float px__rt_avx2_exp_sum(float *x, size_t n, float max);

TGT void px__rt_avx2_dequant(px_dtype t, const void *row, float *dst, uint32_t k)
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

TGT float px__rt_avx2_dot_f32(const float *a, const float *b, uint32_t n)
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

TGT void px__rt_avx2_axpy_f32(float a, const float *x, float *y, uint32_t n)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    for (; j < n; j++)
        y[j] += a * x[j];
}

TGT void px__rt_avx2_attn_scores(const float *q, const float *base, size_t stride,
                                 const uint32_t *rows, size_t n, uint32_t hd, float scale,
                                 float *out)
{
    for (size_t p = 0; p < n; p++)
        out[p] = px__rt_avx2_dot_f32(q, base + (size_t)rows[p] * stride, hd) * scale;
}

TGT void px__rt_avx2_attn_values(const float *w, const float *base, size_t stride,
                                 const uint32_t *rows, size_t n, uint32_t hd, float *out)
{
    for (size_t p = 0; p < n; p++)
        px__rt_avx2_axpy_f32(w[p], base + (size_t)rows[p] * stride, out, hd);
}

/* A group of query heads at once (cpu_attn_x86.h): 2 heads by 4 rows of
 * scores (8 accumulators of the 16 registers), 4 heads by 16 values. */
#define ATTN_GT     2
#define ATTN_VGT    4
#define ATTN_VC     2
#define ATTN_SCORES px__rt_avx2_attn_scores_group
#define ATTN_VALUES px__rt_avx2_attn_values_group
void ATTN_SCORES(const float *q, uint32_t n_q, const float *base, size_t stride,
                 const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out, size_t ld);
void ATTN_VALUES(const float *w, size_t ld, uint32_t n_q, const float *base, size_t stride,
                 const uint32_t *rows, size_t n, uint32_t hd, float *out);
#include "rt/cpu_attn_x86.h"

/* px__rt_exp_sum_ref eight values at a time: the same operations, unfused
 * (no fused multiply-add), so the same bits. */
TGT float px__rt_avx2_exp_sum(float *x, size_t n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max), lo = _mm256_set1_ps(-87.0f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), round = _mm256_set1_ps(12582912.0f),
                 hi_c = _mm256_set1_ps(0.693359375f), lo_c = _mm256_set1_ps(-2.12194440e-4f),
                 one = _mm256_set1_ps(1.0f);
    const __m256i round_bits = _mm256_castps_si256(round), bias = _mm256_set1_epi32(127);
    __m256 acc = _mm256_setzero_ps();
    /* Fewer than 8 values last: their exps in the same lanes' operations
     * (the lanes past the end masked off), added in turn after the lanes'
     * sum. */
    for (size_t j = 0; j < n; j += 8) {
        bool tail = j + 8 > n;
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(tail ? n - j : 8)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 in = tail ? _mm256_maskload_ps(x + j, mask) : _mm256_loadu_ps(x + j);
        __m256 v = _mm256_sub_ps(in, vmax);
        v = _mm256_blendv_ps(v, lo, _mm256_cmp_ps(v, lo, _CMP_LT_OQ));
        __m256 t = _mm256_add_ps(_mm256_mul_ps(v, log2e), round);
        __m256 k = _mm256_sub_ps(t, round);
        __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(k, hi_c));
        r = _mm256_sub_ps(r, _mm256_mul_ps(k, lo_c));
        __m256 p = _mm256_set1_ps(1.9875691500e-4f);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
        __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), one);
        __m256i e = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), round_bits), bias), 23);
        y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        if (tail) {
            _mm256_maskstore_ps(x + j, mask, y);
            break;
        }
        _mm256_storeu_ps(x + j, y);
        acc = _mm256_add_ps(acc, y);
    }
    float a[8];
    _mm256_storeu_ps(a, acc);
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (size_t j = n - n % 8; j < n; j++)
        s += x[j];
    return s;
}

static void matmul_quant(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy)
{
    px__rt_quant_gemm(px__rt_quant_dotn_x86, t, w, row_bytes, k, i0, i1, xq, ldxq, n_x, y, ldy);
}

static const px__rt_kernels kernels_avx2 = {
    .name = "avx2",
    .matmul = px__rt_avx2_matmul,
    .matmul_q8_0 = px__rt_avx2_matmul_q8_0,
    .quant_q8_0 = px__rt_quantize_q8_act_x86,
    .matmul_quant = matmul_quant,
    .quant_act = px__rt_quant_act_x86,
    .dequant = px__rt_avx2_dequant,
    .dot_f32 = px__rt_avx2_dot_f32,
    .axpy_f32 = px__rt_avx2_axpy_f32,
    .attn_scores = px__rt_avx2_attn_scores,
    .attn_values = px__rt_avx2_attn_values,
    .exp_sum = px__rt_avx2_exp_sum,
    .attn_scores_group = px__rt_avx2_attn_scores_group,
    .attn_values_group = px__rt_avx2_attn_values_group,
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
