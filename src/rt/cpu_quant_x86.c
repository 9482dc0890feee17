/*
 * AVX2 dot products of block-quantized weights with quantized activations,
 * chosen at run time.  They reproduce cpu_quant.c's results bit for bit:
 * the integer sums are exact whatever their grouping, and the float steps
 * are the same operations in the same order (Q4_0/Q5_0: one float lane
 * per four values and one register per group of blocks, as the portable
 * definition's lanes and groups; k-quants: the super-block's float
 * expression in scalar code).  The Q8_0 activation quantizers reproduce
 * the portable bytes the same way.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <float.h>
#include <immintrin.h>

#define TGT    __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TGT

INLINE __m256i load256(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* Bytes of v shifted right by `bits` (0..7), within each byte. */
INLINE __m256i bits_at(__m256i v, uint32_t bits, int mask)
{
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128((int)bits)),
                            _mm256_set1_epi8((char)mask));
}

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as cpu_quant.c. */
INLINE float lanes_sum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* An f16 as float (exact, as px__rt_f16). */
INLINE float f16_at(const uint8_t *p)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | p[1] << 8)));
}

/* The 32 values of a Q4_0/Q5_0 block, signed, in order. */
INLINE __m256i legacy_values(px_dtype t, const uint8_t *blk)
{
    const uint8_t *qs = blk + (t == PX_DTYPE_Q5_0 ? 6 : 2);
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m128i m4 = _mm_set1_epi8(0xF);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
    if (t == PX_DTYPE_Q4_0)
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    /* Byte j takes bit j of the 32-bit qh: spread qh's byte j/8 to byte
     * j, then test bit j % 8. */
    uint32_t qh;
    memcpy(&qh, blk + 2, sizeof qh);
    __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(16));
}

/* Lane l of the eight int32 sums p_l * (d_w * d_x) of block i (bb bytes
 * a block), in float: the definition's addend for the block's group. */
INLINE __m256 legacy_block(px_dtype t, size_t bb, const uint8_t *w, const uint8_t *xq, uint32_t i)
{
    const uint8_t *blk = w + i * bb, *xb = xq + (size_t)i * PX__RT_Q8_0_ACT_BYTES;
    __m256i q = legacy_values(t, blk);
    __m256i qx = load256(xb + 2);
    /* Exact: |q| <= 16 and |qx| <= 127 keep the pair sums in int16. */
    __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(qx, q));
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    float s = f16_at(blk) * f16_at(xb);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(s));
}

_Static_assert(PX__RT_Q0_GROUPS == 4, "dot_legacy keeps four groups");

/* One accumulator per group (block i into acc[i % 4]): four independent
 * chains of additions; then the groups and the lanes add in the
 * definition's order. */
INLINE float dot_legacy(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    const size_t bb = t == PX_DTYPE_Q5_0 ? 22 : 18;
    __m256 acc[4];
    for (uint32_t g = 0; g < 4; g++)
        acc[g] = _mm256_setzero_ps();
    uint32_t nb = n / PX__RT_QK0, i = 0;
    for (; i + 4 <= nb; i += 4)
#pragma GCC unroll 4
        for (uint32_t g = 0; g < 4; g++)
            acc[g] = _mm256_add_ps(acc[g], legacy_block(t, bb, w, xq, i + g));
#pragma GCC unroll 4
    for (uint32_t g = 0; g < 4; g++)
        if (i + g < nb)
            acc[g] = _mm256_add_ps(acc[g], legacy_block(t, bb, w, xq, i + g));
    return lanes_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
}

static TGT float dot_q4_0(const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    return dot_legacy(PX_DTYPE_Q4_0, w, xq, n);
}

static TGT float dot_q5_0(const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    return dot_legacy(PX_DTYPE_Q5_0, w, xq, n);
}

/* Values 32c .. 32c + 31 of a k-quant super-block as unsigned bytes, and
 * the offset subtracted from each (q = byte - offset). */
INLINE __m256i k_values(px_dtype t, const uint8_t *blk, uint32_t c)
{
    switch (t) {
    case PX_DTYPE_Q2_K:
        return bits_at(load256(blk + 16 + 32 * (c / 4)), 2 * (c % 4), 3);
    case PX_DTYPE_Q3_K: {
        __m256i lo = bits_at(load256(blk + 32 + 32 * (c / 4)), 2 * (c % 4), 3);
        __m256i hi = bits_at(load256(blk), c, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
    }
    case PX_DTYPE_Q4_K:
        return bits_at(load256(blk + 16 + 32 * (c / 2)), 4 * (c % 2), 0xF);
    case PX_DTYPE_Q5_K: {
        __m256i lo = bits_at(load256(blk + 48 + 32 * (c / 2)), 4 * (c % 2), 0xF);
        __m256i hi = bits_at(load256(blk + 16), c, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    default: { /* Q6_K */
        uint32_t half = c / 4, i = c % 4;
        __m256i lo = bits_at(load256(blk + 64 * half + 32 * (i & 1)), i < 2 ? 0 : 4, 0xF);
        __m256i hi = bits_at(load256(blk + 128 + 32 * half), 2 * i, 3);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    }
}

/* px__rt_quant_scales's d, dmin, has_min and its 16 scales (and Q2_K's
 * mins) of a Q2_K, Q3_K or Q6_K super-block, without its loop; m is left
 * alone where the format has no mins. */
INLINE void k_scales16(px_dtype t, const uint8_t *blk, px__rt_qblock *b)
{
    __m128i sc8;
    switch (t) {
    case PX_DTYPE_Q2_K: {
        /* Byte j: scale j in its low nibble, min j in the high. */
        __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)blk), m4 = _mm_set1_epi8(0xF);
        sc8 = _mm_and_si128(raw, m4);
        _mm256_storeu_si256((__m256i *)(void *)b->m,
                            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4)));
        b->d = f16_at(blk + 80);
        b->dmin = f16_at(blk + 82);
        b->has_min = true;
        break;
    }
    case PX_DTYPE_Q3_K: {
        /* Scale i: the nibble i % 8 of bytes 0..7 (low for i < 8) and
         * bits 2 (i / 4) of byte 8 + i % 4 above it, less 32; word-wide,
         * four scales per word. */
        const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
        uint32_t a[3];
        memcpy(a, blk + 96, sizeof a);
        /* Built in registers: four word stores read back as one vector
         * would wait for the stores (no forwarding). */
        __m128i u = _mm_setr_epi32((int)((a[0] & k2) | ((a[2] & k1) << 4)),
                                   (int)((a[1] & k2) | (((a[2] >> 2) & k1) << 4)),
                                   (int)(((a[0] >> 4) & k2) | (((a[2] >> 4) & k1) << 4)),
                                   (int)(((a[1] >> 4) & k2) | (((a[2] >> 6) & k1) << 4)));
        sc8 = _mm_sub_epi8(u, _mm_set1_epi8(32));
        b->d = f16_at(blk + 108);
        b->dmin = 0;
        b->has_min = false;
        break;
    }
    default: /* Q6_K: int8 scales from byte 192 */
        sc8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 192));
        b->d = f16_at(blk + 208);
        b->dmin = 0;
        b->has_min = false;
        break;
    }
    _mm256_storeu_si256((__m256i *)(void *)b->sc, _mm256_cvtepi8_epi16(sc8));
}

INLINE float dot_k(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    size_t bb = px_dtype_block_bytes(t);
    int32_t offset = t == PX_DTYPE_Q3_K ? 4 : t == PX_DTYPE_Q6_K ? 32 : 0;
    float acc = 0;
    px__rt_qblock b;
    for (uint32_t i = 0; i < n / PX__RT_QK; i++) {
        const uint8_t *blk = w + i * bb, *xb = xq + (size_t)i * PX__RT_Q8_K_BYTES;
        if (t == PX_DTYPE_Q4_K || t == PX_DTYPE_Q5_K) {
            /* px__rt_quant_scales's values, each scale and min twice
             * (one per 16 values), without its loop. */
            uint64_t sc8, m8;
            px__rt_q4_k_scales(blk + 4, &sc8, &m8);
            __m128i sc = _mm_cvtsi64_si128((long long)sc8), m = _mm_cvtsi64_si128((long long)m8);
            _mm256_storeu_si256((__m256i *)(void *)b.sc,
                                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc, sc)));
            _mm256_storeu_si256((__m256i *)(void *)b.m,
                                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)));
            b.d = f16_at(blk);
            b.dmin = f16_at(blk + 2);
            b.has_min = true;
        } else {
            k_scales16(t, blk, &b);
        }
        __m256i sum = _mm256_setzero_si256();
        for (uint32_t c = 0; c < 8; c++) {
            __m256i q = k_values(t, blk, c);
            /* Exact: bytes <= 63 and |qx| <= 127 keep pair sums in int16,
             * and |scale| <= 128 their scaled sums in int32. */
            __m256i p16 = _mm256_maddubs_epi16(q, load256(xb + 4 + 32 * c));
            __m256i sc =
                _mm256_set_m128i(_mm_set1_epi16(b.sc[2 * c + 1]), _mm_set1_epi16(b.sc[2 * c]));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, sc));
        }
        /* The per-16 sums of the activations against the mins, and
         * against the scales for the offset: exact in int32. */
        __m256i bsums = load256(xb + 260);
        int32_t sumi = hsum_i32(sum);
        int32_t summ = 0;
        if (b.has_min)
            summ = hsum_i32(_mm256_madd_epi16(bsums, load256((const uint8_t *)b.m)));
        if (offset)
            sumi -= offset * hsum_i32(_mm256_madd_epi16(bsums, load256((const uint8_t *)b.sc)));
        float dx;
        memcpy(&dx, xb, sizeof dx);
        float v = (dx * b.d) * (float)sumi;
        if (b.has_min)
            v = v - (dx * b.dmin) * (float)summ;
        acc = acc + v;
    }
    return acc;
}

/* dot_k with the format a constant, so that its value decoding is the
 * format's alone. */
#define DOT_K(name, fmt)                                                   \
    static TGT float name(const uint8_t *w, const uint8_t *xq, uint32_t n) \
    {                                                                      \
        return dot_k(fmt, w, xq, n);                                       \
    }
DOT_K(dot_q2_k, PX_DTYPE_Q2_K)
DOT_K(dot_q3_k, PX_DTYPE_Q3_K)
DOT_K(dot_q4_k, PX_DTYPE_Q4_K)
DOT_K(dot_q5_k, PX_DTYPE_Q5_K)
DOT_K(dot_q6_k, PX_DTYPE_Q6_K)
#undef DOT_K

/* ------------------------------------------------------------------ */
/* Q8_0 activations                                                    */
/* ------------------------------------------------------------------ */

/* v with NaN lanes as 0, clamped to [-127, 127] (an infinity to 127 in
 * magnitude): the portable quantizers' clamp. */
INLINE __m256 clamp127(__m256 v)
{
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

/* roundf of each lane (half away from zero), for |v| <= 127: the whole
 * part t, exact, then one more in magnitude where |v - t| >= 0.5 (v - t
 * is exact). */
INLINE __m256i round_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f),
                              _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one)));
}

/* 32 int32 (in [-127, 127]) as 32 bytes, in order. */
INLINE __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The largest of eight lanes (none NaN: any order gives it). */
INLINE float max8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Q8_0 activation blocks as quant.c makes them (d = amax / 127 as an f16,
 * x * (1 / d) rounded half away from zero, NaN as 0, clamped): the
 * largest magnitude a vector maximum (a NaN or an infinity flagged apart),
 * the scales in scalar code as there, the f16 by F16C's rounding to
 * nearest even (px_f32_to_f16's; a NaN scale by px_f32_to_f16 itself). */
static TGT void quant_act_q8_0(const float *x, uint8_t *out, uint32_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    for (uint32_t b = 0; b < n / PX__RT_QK0; b++, x += PX__RT_QK0) {
        uint8_t *blk = out + (size_t)b * PX__RT_Q8_0_ACT_BYTES;
        __m256 v[4], amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (uint32_t k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            __m256 a = _mm256_andnot_ps(sign, v[k]);
            /* Not <= FLT_MAX: NaN (unordered) or infinite. */
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
            amax = _mm256_max_ps(amax, a);
        }
        if (_mm256_movemask_ps(bad)) {
            float d = NAN / 127.0f;
            uint16_t h = px_f32_to_f16(d);
            memcpy(blk, &h, sizeof h);
            memset(blk + 2, 0, PX__RT_QK0);
            continue;
        }
        float d = max8(amax) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(blk, &h, sizeof h);
        __m256 is = _mm256_set1_ps(id);
        __m256i i[4];
        for (uint32_t k = 0; k < 4; k++)
            i[k] = round_away(clamp127(_mm256_mul_ps(v[k], is)));
        _mm256_storeu_si256((__m256i *)(void *)(blk + 2), pack32(i[0], i[1], i[2], i[3]));
    }
}

TGT void px__rt_quant_act_x86(px_dtype t, const float *x, uint8_t *out, uint32_t n)
{
    if (px__rt_quant_act_dtype(t) == PX_DTYPE_Q8_0)
        quant_act_q8_0(x, out, n);
    else
        px__rt_quant_act(t, x, out, n);
}

/* px__rt_quantize_q8_act_ref's blocks: the largest magnitude of the
 * values that are not NaN (NaN flagged apart), the scales in scalar code
 * as there, x * (127 / amax) with NaN as 0, clamped, rounded to nearest
 * even (the processor's rounding, as lrintf). */
TGT void px__rt_quantize_q8_act_x86(const float *x, uint32_t k, int8_t *q, float *d)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++, x += PX__RT_Q8_0_ELEMS) {
        __m256 v[4], amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (uint32_t j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            __m256 a = _mm256_andnot_ps(sign, v[j]);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
            /* A NaN lane of a leaves amax as it was (maxps returns its
             * second operand then). */
            amax = _mm256_max_ps(a, amax);
        }
        bool has_nan = _mm256_movemask_ps(nan) != 0;
        float m = max8(amax);
        float id = m > 0 && !has_nan ? 127.0f / m : 0.0f;
        d[b] = has_nan ? NAN : m / 127.0f;
        __m256 is = _mm256_set1_ps(id);
        __m256i i[4];
        for (uint32_t j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(clamp127(_mm256_mul_ps(v[j], is)));
        _mm256_storeu_si256((__m256i *)(void *)(q + (size_t)b * PX__RT_Q8_0_ELEMS),
                            pack32(i[0], i[1], i[2], i[3]));
    }
}

TGT float px__rt_quant_dot_x86(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    switch (t) {
    case PX_DTYPE_Q2_K:
        return dot_q2_k(w, xq, n);
    case PX_DTYPE_Q3_K:
        return dot_q3_k(w, xq, n);
    case PX_DTYPE_Q4_K:
        return dot_q4_k(w, xq, n);
    case PX_DTYPE_Q5_K:
        return dot_q5_k(w, xq, n);
    case PX_DTYPE_Q6_K:
        return dot_q6_k(w, xq, n);
    case PX_DTYPE_Q5_0:
        return dot_q5_0(w, xq, n);
    default:
        return dot_q4_0(w, xq, n);
    }
}

void px__rt_quant_dotn_x86(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                           uint32_t n_x, uint32_t n, float *out)
{
    px__rt_quant_dotn_loop(px__rt_quant_dot_x86, t, w, xq, ldxq, n_x, n, out);
}

px__rt_quant_dot_fn px__rt_quant_dot_avx2(void)
{
    return px__rt_kernels_avx2() ? px__rt_quant_dot_x86 : NULL;
}

#else

px__rt_quant_dot_fn px__rt_quant_dot_avx2(void)
{
    return NULL;
}

#endif
