/*
 * AVX-512 cpu kernels (F, BW, DQ, VL and VNNI, with FMA and F16C), chosen
 * at run time when the processor has them.  They compute the same bits
 * as the avx2 variant, faster:
 *
 * - f32, f16, bf16: one 16-lane accumulator per (activation row, weight
 *   row) holds exactly the avx2 variant's two 8-lane partial sums (lane
 *   j % 16), and is reduced the same way.  A matrix product runs in tiles
 *   of TILE_X activation rows by TILE_W weight rows, so that each weight
 *   value loaded (and converted) feeds TILE_X fused multiply-adds and each
 *   activation value TILE_W; the weights stream from memory once per
 *   step, whatever the number of rows.  A partial tile is computed lane
 *   for lane like a full one, so a row's result never depends on the rows
 *   beside it: prefill, batched decode and a single decode agree bit for
 *   bit.  A single activation row (decode) takes two weight rows h rows
 *   apart, one from each half of the range: two streams from memory, each
 *   in order.
 * - q8_0: two blocks per register; the exact int32 sums come from
 *   vpdpbusd on (x + 128) as unsigned bytes against the signed weights,
 *   started from -128 * sum(w) (the same dpbusd on 0x80 bytes), so that
 *   every lane holds the same integer as the avx2 and portable paths; the
 *   even block lands in lanes 0-7 and the odd in 8-15, which are the
 *   avx2 variant's two accumulators.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define TGT    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TGT

/* Tiles: activation rows by weight rows (accumulators in registers: 24
 * of the 32 for floats; 12 for q8_0, which needs more per weight row). */
enum { TILE_X = 4, TILE_W = 6, TILE_WQ = 3 };

static inline uint16_t load_u16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* hsum8(lo + hi), in the avx2 variant's order. */
INLINE float hsum16(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum16 of four accumulators at once: the same additions of the same
 * lanes in the same order (i + 8, i + 4, i + 2, i + 1), two or four
 * accumulators to an instruction; lane g holds hsum16 of the g-th. */
INLINE __m128 hsum16x4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    /* [a 0-7 | b 0-7] + [a 8-15 | b 8-15], and the same of c and d. */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    /* Four values of each in its own 128-bit lane: g's 0-3 + g's 4-7. */
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(3, 2, 3, 2)));
    s = _mm512_add_ps(s, _mm512_movehdup_ps(s));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

/* The sums of RW accumulators (a row of a tile) into y[0..RW), four at a
 * time. */
INLINE void store_sums(const __m512 *acc, uint32_t RW, float *y)
{
    uint32_t c = 0;
    for (; c + 4 <= RW; c += 4)
        _mm_storeu_ps(y + c, hsum16x4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3]));
    if (c + 2 <= RW) {
        _mm_storel_pi((__m64 *)(void *)(y + c), hsum16x4(acc[c], acc[c + 1], acc[c], acc[c + 1]));
        c += 2;
    }
    if (c < RW)
        y[c] = hsum16(acc[c]);
}

/* Sixteen values of a row of dtype t starting at value j, as floats. */
INLINE __m512 load16(px_dtype t, const uint8_t *w, uint32_t j)
{
    switch (t) {
    case PX_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)j)));
    case PX_DTYPE_BF16: {
        __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)j)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    }
    default:
        return _mm512_loadu_ps((const float *)(const void *)(w + 4 * (size_t)j));
    }
}

/* Eight values in lanes 0-7 (lanes 8-15 zero). */
INLINE __m512 load8(px_dtype t, const uint8_t *w, uint32_t j)
{
    switch (t) {
    case PX_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(w + 2 * (size_t)j)), 0));
    case PX_DTYPE_BF16: {
        __m512i u = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(
            _mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(w + 2 * (size_t)j)), 0));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    }
    default:
        return _mm512_zextps256_ps512(
            _mm256_loadu_ps((const float *)(const void *)(w + 4 * (size_t)j)));
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

/* RX activation rows (x, ldx apart) by RW weight rows (w, row_bytes
 * apart) into y[r*ldy + c].  RX and RW are constants in each inlined
 * copy, so the accumulators stay in registers. */
INLINE void tile_plain(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, const float *x,
                       size_t ldx, uint32_t RX, uint32_t RW, float *y, size_t ldy)
{
    __m512 acc[TILE_X][TILE_W];
#pragma GCC unroll 8
    for (uint32_t r = 0; r < RX; r++)
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++)
            acc[r][c] = _mm512_setzero_ps();
    uint32_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512 wv[TILE_W];
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++)
            wv[c] = load16(t, w + c * row_bytes, j);
#pragma GCC unroll 8
        for (uint32_t r = 0; r < RX; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * ldx + j);
#pragma GCC unroll 8
            for (uint32_t c = 0; c < RW; c++)
                acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
        }
    }
    if (j + 8 <= k) {
        /* The avx2 variant's last 8-wide step: lanes 0-7 only. */
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++) {
            __m512 wv = load8(t, w + c * row_bytes, j);
#pragma GCC unroll 8
            for (uint32_t r = 0; r < RX; r++)
                acc[r][c] = _mm512_mask3_fmadd_ps(
                    wv, _mm512_zextps256_ps512(_mm256_loadu_ps(x + r * ldx + j)), acc[r][c], 0xff);
        }
        j += 8;
    }
    if (j == k) {
#pragma GCC unroll 8
        for (uint32_t r = 0; r < RX; r++)
            store_sums(acc[r], RW, y + r * ldy);
        return;
    }
#pragma GCC unroll 8
    for (uint32_t r = 0; r < RX; r++)
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++) {
            float s = hsum16(acc[r][c]);
            for (uint32_t jj = j; jj < k; jj++)
                s += value_at(t, w + c * row_bytes, jj) * x[r * ldx + jj];
            y[r * ldy + c] = s;
        }
}

/* All activation rows against RW weight rows. */
INLINE void rows_plain(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, const float *x,
                       size_t ldx, uint32_t n_x, uint32_t RW, float *y, size_t ldy)
{
    uint32_t r = 0;
    for (; r + TILE_X <= n_x; r += TILE_X)
        tile_plain(t, w, row_bytes, k, x + r * ldx, ldx, TILE_X, RW, y + r * ldy, ldy);
    switch (n_x - r) {
    case 1:
        tile_plain(t, w, row_bytes, k, x + r * ldx, ldx, 1, RW, y + r * ldy, ldy);
        break;
    case 2:
        tile_plain(t, w, row_bytes, k, x + r * ldx, ldx, 2, RW, y + r * ldy, ldy);
        break;
    case 3:
        tile_plain(t, w, row_bytes, k, x + r * ldx, ldx, 3, RW, y + r * ldy, ldy);
        break;
    default:
        break;
    }
}

/* Decode (one activation row): rows i, i + h, ..., i + (S - 1) h of the range (a tile of S
 * rows h apart) at a time, so that S parts of it stream from memory, each in order; the odd
 * rows last.  Each row's sum is the same chain at any S.  On a model's matrices (415 MB of
 * f32, 273 MB of f16, one thread) two streams read 31.5 to 32.2 GB/s of f32 and 29.6 to 30.3 of
 * f16; four 35.3 to 36.6 and 32.5 to 33.6; six 34.5 and 37.7. */
INLINE void decode_plain(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const float *x, size_t ldx, float *y, uint32_t S)
{
    uint32_t h = (i1 - i0) / S, i = i0;
    for (; i < i0 + h; i++) {
        float out[TILE_W];
        tile_plain(t, w + (size_t)i * row_bytes, (size_t)h * row_bytes, k, x, ldx, 1, S, out, 1);
        for (uint32_t c = 0; c < S; c++)
            y[i + c * h] = out[c];
    }
    for (i = i0 + S * h; i < i1; i++)
        tile_plain(t, w + (size_t)i * row_bytes, row_bytes, k, x, ldx, 1, 1, y + i, 1);
}

/* Weight rows outermost: a tile of them stays in the first-level cache
 * while every activation row passes, and is read from memory once. */
INLINE void matmul_plain(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y,
                         size_t ldy)
{
    uint32_t i = i0;
    if (n_x == 1) {
        /* f16 and bf16 rows are half the bytes: more of them to keep the memory as busy. */
        decode_plain(t, w, row_bytes, k, i0, i1, x, ldx, y, t == PX_DTYPE_F32 ? 4 : 6);
        return;
    }
    for (; i + TILE_W <= i1; i += TILE_W)
        rows_plain(t, w + (size_t)i * row_bytes, row_bytes, k, x, ldx, n_x, TILE_W, y + i, ldy);
    for (; i < i1; i++)
        rows_plain(t, w + (size_t)i * row_bytes, row_bytes, k, x, ldx, n_x, 1, y + i, ldy);
}

static TGT void matmul_f32(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                           const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    matmul_plain(PX_DTYPE_F32, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
}

static TGT void matmul_f16(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                           const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    matmul_plain(PX_DTYPE_F16, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
}

static TGT void matmul_bf16(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                            const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    matmul_plain(PX_DTYPE_BF16, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
}

/* The avx2 variant's kernels (cpu_kernels_x86.c), with the same bits:
 * two to PX_RT_SMALL_BATCH activation rows, where the weights stream from
 * memory and the wide tiles measured no faster (bench_rt_kernels), and
 * the block-quantized formats (cpu_quant*.c).  One activation row
 * (decode) takes the tiles here with two weight rows, one from each half
 * of the range (matmul_plain, matvec_q8_0): fewer instructions than the
 * avx2 pairs (half for the float formats), which left f16 and q8_0 short
 * of memory's speed on one thread. */
void px__rt_avx2_matmul(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                        uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y,
                        size_t ldy);
void px__rt_avx2_matmul_q8_0(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                             const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy);

static bool dtype_plain(px_dtype t)
{
    return t == PX_DTYPE_F32 || t == PX_DTYPE_F16 || t == PX_DTYPE_BF16;
}

static void matmul_quant(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy);

static void matmul(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                   uint32_t i1, const float *x, size_t ldx, uint32_t n_x, float *y, size_t ldy)
{
    if (px__rt_quant_handles(t)) {
        px__rt_quant_matmul(matmul_quant, t, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        return;
    }
    if ((n_x > 1 && n_x <= PX_RT_SMALL_BATCH) || !dtype_plain(t)) {
        px__rt_avx2_matmul(t, w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        return;
    }
    switch (t) {
    case PX_DTYPE_F16:
        matmul_f16(w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        break;
    case PX_DTYPE_BF16:
        matmul_bf16(w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        break;
    default:
        matmul_f32(w, row_bytes, k, i0, i1, x, ldx, n_x, y, ldy);
        break;
    }
}

/* ------------------------------------------------------------------ */
/* q8_0                                                                */
/* ------------------------------------------------------------------ */

/* [a x 8, b x 8] from the two floats of lo (lanes 0 and 1). */
INLINE __m512 pair_spread(__m128 lo)
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(lo));
}

INLINE void tile_q8_0(const uint8_t *w, size_t row_bytes, uint32_t k, const int8_t *xq,
                      const float *xd, uint32_t RX, uint32_t RW, float *y, size_t ldy)
{
    uint32_t nb = k / PX__RT_Q8_0_ELEMS, b = 0;
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    __m512 acc[TILE_X][TILE_WQ];
#pragma GCC unroll 8
    for (uint32_t r = 0; r < RX; r++)
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (; b + 2 <= nb; b += 2) {
        __m512i wv[TILE_WQ], base[TILE_WQ];
        __m512 dw[TILE_WQ];
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++) {
            const uint8_t *blk = w + c * row_bytes + (size_t)b * PX__RT_Q8_0_BYTES;
            wv[c] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                _mm256_loadu_si256((const __m256i *)(blk + 2 + PX__RT_Q8_0_BYTES)), 1);
            base[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, wv[c]));
            uint32_t hh = (uint32_t)load_u16(blk) | (uint32_t)load_u16(blk + PX__RT_Q8_0_BYTES)
                                                        << 16;
            dw[c] = pair_spread(_mm_cvtph_ps(_mm_cvtsi32_si128((int)hh)));
        }
#pragma GCC unroll 8
        for (uint32_t r = 0; r < RX; r++) {
            const float *dr = xd + (size_t)r * nb + b;
            __m512i xv = _mm512_xor_si512(
                _mm512_loadu_si512(xq + (size_t)r * k + (size_t)b * PX__RT_Q8_0_ELEMS), c80);
            __m512 dx = pair_spread(_mm_setr_ps(dr[0], dr[1], 0.0f, 0.0f));
#pragma GCC unroll 8
            for (uint32_t c = 0; c < RW; c++) {
                __m512 sum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(base[c], xv, wv[c]));
                __m512 scale = _mm512_mul_ps(dw[c], dx);
                acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(scale, sum));
            }
        }
    }
    if (b < nb) {
        /* An odd count: the last block is an even one, lanes 0-7. */
        const __m256i c80h = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (uint32_t c = 0; c < RW; c++) {
            const uint8_t *blk = w + c * row_bytes + (size_t)b * PX__RT_Q8_0_BYTES;
            __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
            __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(),
                                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), c80h, wv));
            float dw = _cvtsh_ss(load_u16(blk));
#pragma GCC unroll 8
            for (uint32_t r = 0; r < RX; r++) {
                __m256i xv = _mm256_xor_si256(
                    _mm256_loadu_si256(
                        (const __m256i *)(xq + (size_t)r * k + (size_t)b * PX__RT_Q8_0_ELEMS)),
                    c80h);
                __m256 sum = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(base, xv, wv));
                __m256 scale = _mm256_set1_ps(dw * xd[(size_t)r * nb + b]);
                __m256 p = _mm256_mul_ps(scale, sum);
                acc[r][c] =
                    _mm512_mask_add_ps(acc[r][c], 0xff, acc[r][c], _mm512_castps256_ps512(p));
            }
        }
    }
#pragma GCC unroll 8
    for (uint32_t r = 0; r < RX; r++)
        store_sums(acc[r], RW, y + r * ldy);
}

INLINE void rows_q8_0(const uint8_t *w, size_t row_bytes, uint32_t k, const int8_t *xq,
                      const float *xd, uint32_t n_x, uint32_t RW, float *y, size_t ldy)
{
    uint32_t nb = k / PX__RT_Q8_0_ELEMS, r = 0;
    for (; r + TILE_X <= n_x; r += TILE_X)
        tile_q8_0(w, row_bytes, k, xq + (size_t)r * k, xd + (size_t)r * nb, TILE_X, RW, y + r * ldy,
                  ldy);
    switch (n_x - r) {
    case 1:
        tile_q8_0(w, row_bytes, k, xq + (size_t)r * k, xd + (size_t)r * nb, 1, RW, y + r * ldy,
                  ldy);
        break;
    case 2:
        tile_q8_0(w, row_bytes, k, xq + (size_t)r * k, xd + (size_t)r * nb, 2, RW, y + r * ldy,
                  ldy);
        break;
    case 3:
        tile_q8_0(w, row_bytes, k, xq + (size_t)r * k, xd + (size_t)r * nb, 3, RW, y + r * ldy,
                  ldy);
        break;
    default:
        break;
    }
}

/* Decode (one activation row): row i of the first half of [i0, i1) beside row i + h of the
 * second (a tile of two rows h rows apart), so that each half streams from memory in order. */
static TGT void matvec_q8_0(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                            uint32_t i1, const int8_t *xq, const float *xd, float *y)
{
    uint32_t h = (i1 - i0) / 2, i = i0;
    for (; i < i0 + h; i++) {
        float out[2];
        tile_q8_0(w + (size_t)i * row_bytes, (size_t)h * row_bytes, k, xq, xd, 1, 2, out, 1);
        y[i] = out[0];
        y[i + h] = out[1];
    }
    for (i = i0 + 2 * h; i < i1; i++)
        tile_q8_0(w + (size_t)i * row_bytes, row_bytes, k, xq, xd, 1, 1, y + i, 1);
}

static TGT void matmul_q8_0(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                            const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy)
{
    if (n_x == 1) {
        matvec_q8_0(w, row_bytes, k, i0, i1, xq, xd, y);
        return;
    }
    if (n_x <= PX_RT_SMALL_BATCH) {
        px__rt_avx2_matmul_q8_0(w, row_bytes, k, i0, i1, xq, xd, n_x, y, ldy);
        return;
    }
    const uint8_t *wb = w;
    uint32_t i = i0;
    for (; i + TILE_WQ <= i1; i += TILE_WQ)
        rows_q8_0(wb + (size_t)i * row_bytes, row_bytes, k, xq, xd, n_x, TILE_WQ, y + i, ldy);
    for (; i < i1; i++)
        rows_q8_0(wb + (size_t)i * row_bytes, row_bytes, k, xq, xd, n_x, 1, y + i, ldy);
}

/* The rest (dequantisation, the one-head attention kernels) is the avx2 variant's
 * (cpu_kernels_x86.c). */
void px__rt_avx2_dequant(px_dtype t, const void *row, float *dst, uint32_t k);
float px__rt_avx2_dot_f32(const float *a, const float *b, uint32_t n);
void px__rt_avx2_axpy_f32(float a, const float *x, float *y, uint32_t n);
void px__rt_avx2_attn_scores(const float *q, const float *base, size_t stride, const uint32_t *rows,
                             size_t n, uint32_t hd, float scale, float *out);
void px__rt_avx2_attn_values(const float *w, const float *base, size_t stride, const uint32_t *rows,
                             size_t n, uint32_t hd, float *out);
float px__rt_avx2_exp_sum(float *x, size_t n, float max);

/* Attention for a group of query heads (cpu_attn_x86.h): the scores are
 * the avx2 variant's instructions with 32 registers (4 heads by 4 rows);
 * the values 16 wide, 4 heads by 64 values in 16 registers.  A value's
 * sum is the same chain of fused multiply-adds over the rows at any
 * width (the lanes never meet), so the bits are the avx2 variant's. */
#define ATTN_GT     4
#define ATTN_VGT    4
#define ATTN_VC     1
#define ATTN_SCORES attn_scores_group
static void ATTN_SCORES(const float *q, uint32_t n_q, const float *base, size_t stride,
                        const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out,
                        size_t ld);
#include "rt/cpu_attn_x86.h"

/* Values [j, j + 16 C) of G heads over every row. */
INLINE void attn_values16_tile(const float *w, size_t ld, uint32_t G, const float *base,
                               size_t stride, const uint32_t *rows, size_t n, uint32_t j,
                               uint32_t C, float *out, uint32_t hd)
{
    __m512 acc[4][4];
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t c = 0; c < C; c++)
            acc[g][c] = _mm512_setzero_ps();
    for (size_t p = 0; p < n; p++) {
        const float *v = base + (size_t)rows[p] * stride + j;
        __m512 vv[4];
        for (uint32_t c = 0; c < C; c++)
            vv[c] = _mm512_loadu_ps(v + 16 * c);
        for (uint32_t g = 0; g < G; g++) {
            __m512 wg = _mm512_set1_ps(w[(size_t)g * ld + p]);
            for (uint32_t c = 0; c < C; c++)
                acc[g][c] = _mm512_fmadd_ps(wg, vv[c], acc[g][c]);
        }
    }
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t c = 0; c < C; c++)
            _mm512_storeu_ps(out + (size_t)g * hd + j + 16 * c, acc[g][c]);
}

INLINE void attn_values16_heads(const float *w, size_t ld, uint32_t G, const float *base,
                                size_t stride, const uint32_t *rows, size_t n, uint32_t hd,
                                float *out)
{
    uint32_t j = 0;
    for (; j + 64 <= hd; j += 64)
        attn_values16_tile(w, ld, G, base, stride, rows, n, j, 4, out, hd);
    for (; j + 16 <= hd; j += 16)
        attn_values16_tile(w, ld, G, base, stride, rows, n, j, 1, out, hd);
    for (; j + 8 <= hd; j += 8)
        attn_values_tile(w, ld, G, base, stride, rows, n, j, 1, out, hd);
    attn_values_tail(w, ld, G, base, stride, rows, n, j, hd, out);
}

static TGT void attn_values_group(const float *w, size_t ld, uint32_t n_q, const float *base,
                                  size_t stride, const uint32_t *rows, size_t n, uint32_t hd,
                                  float *out)
{
    uint32_t g = 0;
    for (; g + 4 <= n_q; g += 4)
        attn_values16_heads(w + (size_t)g * ld, ld, 4, base, stride, rows, n, hd,
                            out + (size_t)g * hd);
    for (; g + 2 <= n_q; g += 2)
        attn_values16_heads(w + (size_t)g * ld, ld, 2, base, stride, rows, n, hd,
                            out + (size_t)g * hd);
    for (; g < n_q; g++)
        attn_values16_heads(w + (size_t)g * ld, ld, 1, base, stride, rows, n, hd,
                            out + (size_t)g * hd);
}

static void matmul_quant(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy)
{
    if (n_x == 1 && px__rt_quant_gemv_x512(t, w, row_bytes, k, i0, i1, xq, y))
        return;
    uint32_t done = px__rt_quant_gemm16_x512(t, w, row_bytes, k, i0, i1, xq, ldxq, n_x, y, ldy);
    if (done < n_x)
        px__rt_quant_gemm(px__rt_quant_dotn_x512, t, w, row_bytes, k, i0, i1, xq + done * ldxq,
                          ldxq, n_x - done, y + done * ldy, ldy);
}

static const px__rt_kernels kernels_avx512 = {
    .name = "avx512",
    .matmul = matmul,
    .matmul_q8_0 = matmul_q8_0,
    .quant_q8_0 = px__rt_quantize_q8_act_x512,
    .matmul_quant = matmul_quant,
    .matmul_q4_k16 = px__rt_quant_gemm_x16_x512,
    .quant_act = px__rt_quant_act_x512,
    .dequant = px__rt_avx2_dequant,
    .dot_f32 = px__rt_avx2_dot_f32,
    .axpy_f32 = px__rt_avx2_axpy_f32,
    .attn_scores = px__rt_avx2_attn_scores,
    .attn_values = px__rt_avx2_attn_values,
    .exp_sum = px__rt_avx2_exp_sum,
    .attn_scores_group = attn_scores_group,
    .attn_values_group = attn_values_group,
};

const px__rt_kernels *px__rt_kernels_avx512(void)
{
    __builtin_cpu_init();
    if (px__rt_kernels_avx2() && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return &kernels_avx512;
    return NULL;
}

#endif
