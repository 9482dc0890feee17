/*
 * AVX-512 (BW, DQ, VL, VNNI) dot products of block-quantized weights with
 * quantized activations, chosen at run time with the avx512 kernels.  They
 * reproduce cpu_quant.c's results bit for bit:
 *
 * - the k-quants (Q2_K .. Q6_K) with Q8_K activations: 64 values per
 *   step, the integer sums per 16 (or 32) values scaled and added in
 *   int32 (exact whatever their grouping: unsigned values <= 63 times
 *   int8 activations in int16 pairs, times scales of at most 128 in
 *   magnitude), then the super-block's float expression in the
 *   definition's order;
 * - Q4_0 and Q5_0 with Q8_0 activations: two blocks per step, each four
 *   values' products summed exactly in int32 by VNNI (the values unsigned,
 *   their offset of 8 or 16 taken against the activations' sums of four),
 *   times each block's scale in sixteen float lanes, then added to the
 *   two groups of the definition the blocks belong to (block b to group
 *   b % 4: two registers of two groups, two independent chains).
 *
 * Q8_0 activations (Q4_0, Q5_0) and those of q8_0 weights
 * (px__rt_quantize_q8_act) are quantized 32 values a block with the
 * portable code's operations, so their bytes are the same.
 *
 * Up to four activation rows share one decode of each weight super-block
 * or pair of blocks (prefill: dotn_k, dotn_legacy); the k-quants' rows
 * there add their scaled pair sums with VNNI (vpdpwssd) and reduce their
 * four sums in one pass.  Q4_K, Q5_K and Q6_K prefill takes sixteen
 * activation rows at a time instead, one a lane, so that no sum is reduced
 * across lanes (px__rt_quant_gemm16_x512); fewer than six rows of a batch
 * past a multiple of sixteen go four at a time.  Decode of rows as stored takes one weight row
 * at a time: its rows lie one after the other, so the weights stream from memory in order (four
 * rows interleaved in place measured twice as slow on a model whose weights come from memory,
 * for all their sharing of the activations).  The k-quants decode four super-blocks at a time,
 * sharing one reduction and one float step, and row i of the first half of a range beside row
 * i + h of the second: two streams, each in order (px__rt_quant_gemv_x512); Q4_K and Q5_K with
 * the activation row laid out once per product so that one 64-byte load of weights serves 128
 * values.  Q4_K matrices a cpu device holds repacked sixteen rows to a group (ADR 0022) take
 * px__rt_quant_gemm_x16_x512 instead, for decode and batches alike: one lane a row.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <float.h>
#include <immintrin.h>

#define TGT    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TGT

INLINE __m256i load256(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* [lo, hi] as one register. */
INLINE __m512i join(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Values 64s .. 64s + 63 of a super-block as unsigned bytes (Q6_K's
 * before its offset of 32). */
/* Bit `bits` + 1 of bytes of v in the upper half, bit `bits` in the
 * lower, as 0 or 1 per byte (bits + 1 <= 7). */
INLINE __m512i bit_pairs(__m256i v, uint32_t bits)
{
    __m512i j = join(v, _mm256_srli_epi16(v, 1));
    return _mm512_and_si512(_mm512_srl_epi16(j, _mm_cvtsi32_si128((int)bits)), _mm512_set1_epi8(1));
}

/* Two-bit fields at 4 * (s % 2) (lower half) and two above (upper) of 32
 * bytes. */
INLINE __m512i crumbs(__m256i raw, uint32_t s)
{
    __m512i j = join(raw, _mm256_srli_epi16(raw, 2));
    return _mm512_and_si512(_mm512_srl_epi16(j, _mm_cvtsi32_si128((int)(4 * (s % 2)))),
                            _mm512_set1_epi8(3));
}

INLINE __m512i values64(px_dtype t, const uint8_t *blk, uint32_t s)
{
    const __m512i m4 = _mm512_set1_epi8(0xF);
    switch (t) {
    case PX_DTYPE_Q4_K: {
        /* Values 64s.. are the low nibbles of 32 bytes, then the high:
         * the bytes in both halves, the upper half shifted. */
        __m512i raw = _mm512_broadcast_i64x4(load256(blk + 16 + 32 * s));
        return _mm512_and_si512(_mm512_mask_srli_epi16(raw, 0xFFFF0000u, raw, 4), m4);
    }
    case PX_DTYPE_Q5_K: {
        /* Q4_K's nibbles (from byte 48), and bit c of qh (bytes 16..47)
         * as the fifth bit of 32-value chunk c = 2s, 2s + 1. */
        __m256i raw = load256(blk + 48 + 32 * s);
        __m512i lo = _mm512_and_si512(join(raw, _mm256_srli_epi16(raw, 4)), m4);
        return _mm512_or_si512(lo, _mm512_slli_epi16(bit_pairs(load256(blk + 16), 2 * s), 4));
    }
    case PX_DTYPE_Q2_K:
        /* 32-value chunk c is the bits 2 (c % 4) of qs[32 (c / 4) ..]. */
        return crumbs(load256(blk + 16 + 32 * (s / 2)), s);
    case PX_DTYPE_Q3_K: {
        /* Q2_K's layout from byte 32, and bit c of hmask (bytes 0..31)
         * as the third bit; the offset of 4 is taken apart. */
        __m512i lo = crumbs(load256(blk + 32 + 32 * (s / 2)), s);
        return _mm512_or_si512(lo, _mm512_slli_epi16(bit_pairs(load256(blk), 2 * s), 2));
    }
    default:
        break;
    }
    /* Q6_K: half h = s / 2 of the super-block; its low four bits are the
     * nibbles of ql[64h .. 64h + 63] (low ones for s even, high for odd),
     * its top two bits those of qh[32h .. 32h + 31] at 4 * (s % 2) and two
     * above. */
    uint32_t h = s / 2, odd = s % 2;
    __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    __m512i lo = _mm512_and_si512(odd ? _mm512_srli_epi16(ql, 4) : ql, m4);
    __m256i qh = load256(blk + 128 + 32 * h);
    __m512i hi = odd ? join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6))
                     : join(qh, _mm256_srli_epi16(qh, 2));
    hi = _mm512_and_si512(hi, _mm512_set1_epi8(3));
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
}

INLINE float f16_at(const uint8_t *p)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | p[1] << 8)));
}

/* Lane l of the pair sums of values 64s .. 64s + 63 (int16 lanes, two
 * values each) takes the scale of 32-value group 2s + GROUP_Q4_K[l]
 * (Q4_K), or of 16-value group 4s + GROUP_Q6_K[l] (Q6_K). */
static const int16_t GROUP_Q4_K[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static const int16_t GROUP_Q6_K[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* Q4_K, Q5_K: a scale and a min per 32 values; the others per 16. */
INLINE bool per32(px_dtype t)
{
    return t == PX_DTYPE_Q4_K || t == PX_DTYPE_Q5_K;
}

INLINE bool has_min(px_dtype t)
{
    return per32(t) || t == PX_DTYPE_Q2_K;
}

/* The scale indices of the four 64-value steps (GROUP_Q4_K, GROUP_Q6_K). */
INLINE void k_groups(px_dtype t, __m512i group[4])
{
    __m512i base = _mm512_loadu_si512(per32(t) ? GROUP_Q4_K : GROUP_Q6_K);
    for (uint32_t s = 0; s < 4; s++)
        group[s] = _mm512_add_epi16(base, _mm512_set1_epi16((short)(per32(t) ? 2 * s : 4 * s)));
}

/* Where a super-block's f16 d lies; dmin follows it (formats with mins). */
INLINE uint32_t d_offset(px_dtype t)
{
    switch (t) {
    case PX_DTYPE_Q2_K:
        return 80;
    case PX_DTYPE_Q3_K:
        return 108;
    case PX_DTYPE_Q6_K:
        return 208;
    default:
        return 0;
    }
}

/* A super-block's scales (int16, indexed by k_groups) and per16: per 16 values, against the
 * activations' sums of 16, the mins (Q4_K, Q5_K: each twice; Q2_K), or the scales times minus the
 * offset (Q3_K: 4, Q6_K: 32), which add to the sum.  Exact in int16 and int32. */
INLINE void k_scales(px_dtype t, const uint8_t *blk, __m512i *scales, __m256i *per16)
{
    if (per32(t)) {
        uint64_t sc8, m8;
        px__rt_q4_k_scales(blk + 4, &sc8, &m8);
        *scales = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)sc8)));
        __m128i m = _mm_cvtsi64_si128((long long)m8);
        *per16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    } else if (t == PX_DTYPE_Q2_K) {
        /* Byte j: scale j in its low nibble, min j in the high. */
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)blk);
        __m128i m4 = _mm_set1_epi8(0xF);
        *scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(b, m4)));
        *per16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
    } else if (t == PX_DTYPE_Q3_K) {
        px__rt_qblock b;
        px__rt_quant_scales(t, blk, &b);
        __m256i sc16 = load256((const uint8_t *)b.sc);
        *scales = _mm512_castsi256_si512(sc16);
        *per16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
    } else {
        __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
        *scales = _mm512_castsi256_si512(sc16);
        *per16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    }
}

/* The totals of the int32 lanes of a, b, c and d, in lanes 0..3: one
 * reduction for four sums instead of four (exact in int32). */
INLINE __m128i hsum4_512(__m512i a, __m512i b, __m512i c, __m512i d)
{
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

INLINE __m128i hsum4_256(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* The integer sums of one super-block against one activation block xb: *sum (int32 lanes that
 * add to S, the per-16 term of formats without mins included) and *msum (lanes that add to M),
 * from the block's decoded values v[4] and per-step scales sc[4].  VNNI adds each step's scaled
 * pair sums in one instruction. */
INLINE void k_sums(px_dtype t, const __m512i v[4], const __m512i sc[4], __m256i per16,
                   const uint8_t *xb, __m512i *sum, __m256i *msum)
{
    __m512i s = _mm512_setzero_si512();
    for (uint32_t j = 0; j < 4; j++)
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(v[j], _mm512_loadu_si512(xb + 4 + 64 * j)),
                                sc[j]);
    __m256i m = _mm256_madd_epi16(load256(xb + 260), per16);
    if (has_min(t)) {
        *msum = m;
    } else {
        s = _mm512_add_epi32(s, _mm512_zextsi256_si512(m));
        *msum = _mm256_setzero_si256();
    }
    *sum = s;
}

/* A super-block's values (four steps of 64) and their scales per int16 pair lane. */
INLINE void k_decode(px_dtype t, const uint8_t *blk, const __m512i group[4], __m512i v[4],
                     __m512i sc[4], __m256i *per16)
{
    __m512i scales;
    k_scales(t, blk, &scales, per16);
    for (uint32_t s = 0; s < 4; s++) {
        v[s] = values64(t, blk, s);
        sc[s] = _mm512_permutexvar_epi16(group[s], scales);
    }
}

/* The definition's float step of four super-blocks (or rows) at once, lane by lane:
 * (dx * d) * S, less (dx * dmin) * M for formats with mins. */
INLINE __m128 k_floats(px_dtype t, __m128i sumi, __m128i summ, __m128 dx, __m128 d, __m128 dmin)
{
    __m128 v = _mm_mul_ps(_mm_mul_ps(dx, d), _mm_cvtepi32_ps(sumi));
    if (has_min(t))
        v = _mm_sub_ps(v, _mm_mul_ps(_mm_mul_ps(dx, dmin), _mm_cvtepi32_ps(summ)));
    return v;
}

INLINE float f32_at(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* The exact totals of the int32 lanes of s (S) and m (M), in lanes 0 and 1 as floats: one
 * reduction for both, (float) S and (float) M rounded as the scalar conversion rounds them. */
INLINE __m128 sums_sm(__m512i s, __m256i m)
{
    __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    __m256i sm = _mm256_add_epi32(_mm256_unpacklo_epi32(s8, m), _mm256_unpackhi_epi32(s8, m));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sm), _mm256_extracti128_si256(sm, 1));
    return _mm_cvtepi32_ps(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e)));
}

/* The dot of one weight row with one activation row, super-block by super-block: the
 * four steps' scaled pair sums added by VNNI (vpdpwssd) into two accumulators, alternate steps
 * each, so that no chain is longer than two; S and M reduced together and the float step taken
 * in two lanes, [dx * d, dx * dmin] times [S, M], each product the definition's, then the
 * difference and the running sum in lane 0 in the definition's order.  (Decode products take
 * the k-quants through gemv_dot2 below.) */
INLINE float dot1_k(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    size_t bb = px_dtype_block_bytes(t);
    uint32_t doff = d_offset(t);
    __m128 acc = _mm_setzero_ps();
    __m512i group[4];
    k_groups(t, group);
    for (uint32_t i = 0; i < n / PX__RT_QK; i++) {
        const uint8_t *blk = w + i * bb, *xb = xq + (size_t)i * PX__RT_Q8_K_BYTES;
        __m512i scales;
        __m256i per16;
        k_scales(t, blk, &scales, &per16);
        __m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
        for (uint32_t s = 0; s < 4; s += 2) {
            __m512i pa =
                _mm512_maddubs_epi16(values64(t, blk, s), _mm512_loadu_si512(xb + 4 + 64 * s));
            __m512i pb = _mm512_maddubs_epi16(values64(t, blk, s + 1),
                                              _mm512_loadu_si512(xb + 4 + 64 * (s + 1)));
            sa = _mm512_dpwssd_epi32(sa, pa, _mm512_permutexvar_epi16(group[s], scales));
            sb = _mm512_dpwssd_epi32(sb, pb, _mm512_permutexvar_epi16(group[s + 1], scales));
        }
        __m512i sum = _mm512_add_epi32(sa, sb);
        __m256i m = _mm256_madd_epi16(load256(xb + 260), per16);
        if (!has_min(t)) {
            sum = _mm512_add_epi32(sum, _mm512_zextsi256_si512(m));
            m = _mm256_setzero_si256();
        }
        __m128 sm = sums_sm(sum, m);
        __m128 dx = _mm_set1_ps(f32_at(xb));
        /* [d, dmin] (f16, exact), or [d, 0] without mins. */
        uint32_t dd = blk[doff] | (uint32_t)blk[doff + 1] << 8;
        if (has_min(t))
            dd |= (uint32_t)blk[doff + 2] << 16 | (uint32_t)blk[doff + 3] << 24;
        __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        __m128 p = _mm_mul_ps(_mm_mul_ps(dx, f), sm);
        __m128 v = has_min(t) ? _mm_sub_ss(p, _mm_movehdup_ps(p)) : p;
        acc = _mm_add_ss(acc, v);
    }
    return _mm_cvtss_f32(acc);
}

/* Decode (one activation row) of Q4_K and Q5_K weights with the activations laid out anew
 * once per product: values 128p .. 128p + 127 of a super-block lie in 64 bytes (Q5_K: their
 * low four bits), values 32c + j in the low nibble of byte 32 (c / 2) + j for c even and in the
 * high one for c odd, so one load gives 32-value chunks 4p and 4p + 2 (low nibbles) and 4p + 1
 * and 4p + 3 (high).  The activations' 128 bytes are reordered to match ([0, 32), [64, 96),
 * [32, 64), [96, 128)): each product pairs the same value with the same activation, and the
 * integer sums are exact whatever their grouping, so the result is the definition's.
 *
 * The rest is laid out for fewer instructions a super-block: the per-16 sums of the
 * activations become per-32 sums (the mins apply per 32 values) behind eight zeros, so that
 * one multiply-add of them with the block's [scales, mins] gives M; the blocks' scales dx
 * go to an array of their own.  Four super-blocks share one reduction of their sums and one
 * float step in four lanes, each lane the definition's, then added in turn. */
#define GEMV_MAX_K 16384u

/* The activation row xq of k values (Q8_K blocks) laid out as above into out, and its blocks'
 * scales into dx. */
INLINE void gemv_act(const uint8_t *xq, uint32_t k, uint8_t *out, float *dx)
{
    uint32_t nb = k / PX__RT_QK;
    for (uint32_t b = 0; b < nb; b++) {
        const uint8_t *x = xq + (size_t)b * PX__RT_Q8_K_BYTES;
        uint8_t *o = out + (size_t)b * PX__RT_Q8_K_BYTES;
        memcpy(&dx[b], x, sizeof dx[b]);
        for (uint32_t p = 0; p < 2; p++) {
            __m512i a = _mm512_loadu_si512(x + 4 + 128 * p),
                    c = _mm512_loadu_si512(x + 68 + 128 * p);
            _mm512_storeu_si512(o + 4 + 128 * p, _mm512_shuffle_i64x2(a, c, 0x44));
            _mm512_storeu_si512(o + 68 + 128 * p, _mm512_shuffle_i64x2(a, c, 0xEE));
        }
        /* Sums of 16 values (at most 16 * 128 in magnitude) added in pairs: exact in int16. */
        __m256i s16 = load256(x + 260);
        __m256i s32 = _mm256_hadd_epi16(s16, _mm256_setzero_si256());
        /* [pairs 0..3, 0, pairs 4..7, 0] in 64-bit parts, then [0, 0, pairs 0..3, 4..7]. */
        _mm256_storeu_si256((__m256i *)(void *)(o + 260), _mm256_permute4x64_epi64(s32, 0x85));
    }
}

/* A Q4_K or Q5_K super-block's 8 scales and 8 mins (6 bits each, packed in its 12 bytes at
 * blk + 4 as px__rt_q4_k_scales reads them) as int16 [scales, mins], decoded in vector lanes:
 * bytes 0..3 and 4..7 hold scales 0..3 and mins 0..3 in their low six bits; scales 4..7 and
 * mins 4..7 are the low and high nibbles of bytes 8..11, above which go the top two bits of
 * bytes 0..3 and 4..7. */
INLINE __m256i k4_scales_mins(const uint8_t *blk)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(blk + 4));
    __m128i lo =
        _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    lo = _mm_mask_mov_epi8(lo, 0xF000, _mm_srli_epi16(lo, 4));
    __m128i top =
        _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    top = _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30));
    const __m128i keep =
        _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    /* (lo & keep) | top */
    return _mm256_cvtepu8_epi16(_mm_ternarylogic_epi32(lo, keep, top, 0xEA));
}

/* Values 128p .. 128p + 127 of a Q4_K or Q5_K super-block as unsigned bytes: lo, the low
 * nibbles of its 64 bytes (32-value groups 4p and 4p + 2), and hi, the high ones (4p + 1 and
 * 4p + 3), with Q5_K's fifth bits (g: gemv_groups, whose lanes count those groups' bits in qh). */
INLINE void k4_values128(px_dtype t, const uint8_t *blk, const __m512i g[4], uint32_t p,
                         __m512i *lo, __m512i *hi)
{
    const __m512i m4 = _mm512_set1_epi8(0xF), one = _mm512_set1_epi8(1);
    __m512i raw = _mm512_loadu_si512(blk + (t == PX_DTYPE_Q4_K ? 16 : 48) + 64 * p);
    *lo = _mm512_and_si512(raw, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if (t == PX_DTYPE_Q5_K) {
        __m512i qh = _mm512_broadcast_i64x4(load256(blk + 16));
        __m512i blo = _mm512_and_si512(_mm512_srlv_epi16(qh, g[2 * p]), one);
        __m512i bhi = _mm512_and_si512(_mm512_srlv_epi16(qh, g[2 * p + 1]), one);
        *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(blo, 4));
        *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(bhi, 4));
    }
}

/* The integer sums of one super-block against its activations (laid out by gemv_act for Q4_K
 * and Q5_K): int32 lanes that add to S and lanes of m that add to M (zero without mins, their
 * per-16 term then in S).  g: the scale indices (gemv_groups). */
INLINE void gemv_block(px_dtype t, const uint8_t *blk, const uint8_t *xb, const __m512i g[4],
                       __m512i *s, __m256i *m)
{
    if (!per32(t)) {
        __m512i scales;
        __m256i per16;
        k_scales(t, blk, &scales, &per16);
        __m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
        for (uint32_t q = 0; q < 4; q += 2) {
            __m512i pa =
                _mm512_maddubs_epi16(values64(t, blk, q), _mm512_loadu_si512(xb + 4 + 64 * q));
            __m512i pb = _mm512_maddubs_epi16(values64(t, blk, q + 1),
                                              _mm512_loadu_si512(xb + 4 + 64 * (q + 1)));
            sa = _mm512_dpwssd_epi32(sa, pa, _mm512_permutexvar_epi16(g[q], scales));
            sb = _mm512_dpwssd_epi32(sb, pb, _mm512_permutexvar_epi16(g[q + 1], scales));
        }
        *s = _mm512_add_epi32(sa, sb);
        *m = _mm256_madd_epi16(load256(xb + 260), per16);
        if (!has_min(t)) {
            *s = _mm512_add_epi32(*s, _mm512_zextsi256_si512(*m));
            *m = _mm256_setzero_si256();
        }
        return;
    }
    const __m512i glo[2] = {g[0], g[2]}, ghi[2] = {g[1], g[3]};
    __m256i sm = k4_scales_mins(blk);
    __m512i scales = _mm512_castsi256_si512(sm);
    __m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
    for (uint32_t p = 0; p < 2; p++) {
        __m512i lo, hi;
        k4_values128(t, blk, g, p, &lo, &hi);
        __m512i pl = _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xb + 4 + 128 * p));
        __m512i ph = _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xb + 68 + 128 * p));
        sa = _mm512_dpwssd_epi32(sa, pl, _mm512_permutexvar_epi16(glo[p], scales));
        sb = _mm512_dpwssd_epi32(sb, ph, _mm512_permutexvar_epi16(ghi[p], scales));
    }
    *s = _mm512_add_epi32(sa, sb);
    *m = _mm256_madd_epi16(sm, load256(xb + 260));
}

INLINE uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The scale indices of gemv_block: for Q4_K and Q5_K, lanes of chunks 4p, 4p + 2 (g[2p]) and
 * 4p + 1, 4p + 3 (g[2p + 1]), also Q5_K's bit counts of the same chunks in qh; for the other
 * k-quants those of the four 64-value steps (k_groups). */
INLINE void gemv_groups(px_dtype t, __m512i g[4])
{
    if (!per32(t)) {
        k_groups(t, g);
        return;
    }
    for (uint32_t p = 0; p < 2; p++) {
        g[2 * p] = _mm512_add_epi16(
            _mm512_loadu_si512(GROUP_Q4_K),
            _mm512_add_epi16(_mm512_loadu_si512(GROUP_Q4_K), _mm512_set1_epi16((short)(4 * p))));
        g[2 * p + 1] = _mm512_add_epi16(g[2 * p], _mm512_set1_epi16(1));
    }
}

/* A super-block's f16 d, and dmin above it for formats with mins (0 without). */
INLINE uint32_t d_dmin(px_dtype t, const uint8_t *blk)
{
    const uint8_t *p = blk + d_offset(t);
    uint32_t v = p[0] | (uint32_t)p[1] << 8;
    return has_min(t) ? v | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : v;
}

/* The float terms of super-blocks i .. i + 3 of a row w (bb bytes each), one a lane, each the
 * definition's (dx * d) * S - (dx * dmin) * M: their integer sums reduced together. */
INLINE __m128 gemv_four(px_dtype t, const uint8_t *w, size_t bb, uint32_t i, const uint8_t *xp,
                        const float *dx, const __m512i g[4])
{
    __m512i s[4];
    __m256i m[4];
    for (uint32_t q = 0; q < 4; q++)
        gemv_block(t, w + (i + q) * bb, xp + (size_t)(i + q) * PX__RT_Q8_K_BYTES, g, &s[q], &m[q]);
    __m128i si = hsum4_512(s[0], s[1], s[2], s[3]), mi = hsum4_256(m[0], m[1], m[2], m[3]);
    /* [d0, dmin0, d1, dmin1, ...] (f16, exact) parted into d and dmin. */
    __m256 f = _mm256_cvtph_ps(
        _mm_setr_epi32((int)d_dmin(t, w + i * bb), (int)d_dmin(t, w + (i + 1) * bb),
                       (int)d_dmin(t, w + (i + 2) * bb), (int)d_dmin(t, w + (i + 3) * bb)));
    __m128 flo = _mm256_castps256_ps128(f), fhi = _mm256_extractf128_ps(f, 1);
    return k_floats(t, si, mi, _mm_loadu_ps(dx + i), _mm_shuffle_ps(flo, fhi, 0x88),
                    _mm_shuffle_ps(flo, fhi, 0xDD));
}

/* acc plus lanes 0, 1, 2 and 3 of v in turn (lane 0). */
INLINE __m128 add_in_turn(__m128 acc, __m128 v)
{
    acc = _mm_add_ss(acc, v);
    acc = _mm_add_ss(acc, _mm_movehdup_ps(v));
    acc = _mm_add_ss(acc, _mm_movehl_ps(v, v));
    return _mm_add_ss(acc, _mm_shuffle_ps(v, v, 3));
}

/* acc plus the float term of super-block i alone: [dx * d, dx * dmin] times [S, M] in two
 * lanes. */
INLINE __m128 gemv_one(px_dtype t, const uint8_t *w, size_t bb, uint32_t i, const uint8_t *xp,
                       const float *dx, const __m512i g[4], __m128 acc)
{
    const uint8_t *blk = w + i * bb;
    __m512i s;
    __m256i m;
    gemv_block(t, blk, xp + (size_t)i * PX__RT_Q8_K_BYTES, g, &s, &m);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)d_dmin(t, blk)));
    __m128 p = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dx[i]), f), sums_sm(s, m));
    return _mm_add_ss(acc, has_min(t) ? _mm_sub_ss(p, _mm_movehdup_ps(p)) : p);
}

/* The dots of n values of k-quant weight rows wa and wb with an activation row (laid out by
 * gemv_act for Q4_K and Q5_K; dx: its scales), side by side (wb NULL: wa alone): two streams
 * from memory, each in order. */
INLINE void gemv_dot2(px_dtype t, size_t bb, const __m512i g[4], const uint8_t *wa,
                      const uint8_t *wb, const uint8_t *xp, const float *dx, uint32_t n, float *ya,
                      float *yb)
{
    __m128 a = _mm_setzero_ps(), b = _mm_setzero_ps();
    uint32_t nb = n / PX__RT_QK, i = 0;
    for (; i + 4 <= nb; i += 4) {
        a = add_in_turn(a, gemv_four(t, wa, bb, i, xp, dx, g));
        if (wb)
            b = add_in_turn(b, gemv_four(t, wb, bb, i, xp, dx, g));
    }
    for (; i < nb; i++) {
        a = gemv_one(t, wa, bb, i, xp, dx, g, a);
        if (wb)
            b = gemv_one(t, wb, bb, i, xp, dx, g, b);
    }
    *ya = _mm_cvtss_f32(a);
    if (wb)
        *yb = _mm_cvtss_f32(b);
}

/* Rows i0 .. i1 - 1: row i of the first half beside row i + h of the second (as the float
 * kernels' decode), the odd row last; each row's chunks of PX__RT_QCHUNK values added in turn. */
INLINE void gemv_rows(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                      uint32_t i1, const uint8_t *xp, const float *dx, float *y)
{
    const size_t bb = px_dtype_block_bytes(t);
    __m512i g[4];
    gemv_groups(t, g);
    uint32_t h = (i1 - i0) / 2;
    for (uint32_t i = i0; i < i1; i++) {
        if (i >= i0 + h && i < i0 + 2 * h)
            continue;
        const uint8_t *row = w + (size_t)i * row_bytes;
        const uint8_t *other = i < i0 + h ? row + (size_t)h * row_bytes : NULL;
        float va = 0, vb = 0;
        for (uint32_t c0 = 0; c0 < k; c0 += PX__RT_QCHUNK) {
            uint32_t n = PX_MIN(PX__RT_QCHUNK, k - c0);
            size_t off = c0 / PX__RT_QK * bb;
            float da, db = 0;
            gemv_dot2(t, bb, g, row + off, other ? other + off : NULL,
                      xp + (size_t)c0 / PX__RT_QK * PX__RT_Q8_K_BYTES, dx + c0 / PX__RT_QK, n, &da,
                      &db);
            va = c0 == 0 ? da : va + da;
            vb = c0 == 0 ? db : vb + db;
        }
        y[i] = va;
        if (other)
            y[i + h] = vb;
    }
}

#define GEMV_FN(NAME, T)                                                                           \
    static TGT void NAME(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1, \
                         const uint8_t *xp, const float *dx, float *y)                             \
    {                                                                                              \
        gemv_rows(T, w, row_bytes, k, i0, i1, xp, dx, y);                                          \
    }
GEMV_FN(gemv_q2_k, PX_DTYPE_Q2_K)
GEMV_FN(gemv_q3_k, PX_DTYPE_Q3_K)
GEMV_FN(gemv_q4_k, PX_DTYPE_Q4_K)
GEMV_FN(gemv_q5_k, PX_DTYPE_Q5_K)
GEMV_FN(gemv_q6_k, PX_DTYPE_Q6_K)

TGT bool px__rt_quant_gemv_x512(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,
                                uint32_t i0, uint32_t i1, const uint8_t *xq, float *y)
{
    if ((t != PX_DTYPE_Q2_K && t != PX_DTYPE_Q3_K && t != PX_DTYPE_Q4_K && t != PX_DTYPE_Q5_K &&
         t != PX_DTYPE_Q6_K) ||
        k > GEMV_MAX_K || k % PX__RT_QK)
        return false;
    _Alignas(64) uint8_t xp[GEMV_MAX_K / PX__RT_QK * PX__RT_Q8_K_BYTES];
    float dx[GEMV_MAX_K / PX__RT_QK];
    if (per32(t)) {
        gemv_act(xq, k, xp, dx);
        xq = xp;
    } else {
        for (uint32_t b = 0; b < k / PX__RT_QK; b++)
            dx[b] = f32_at(xq + (size_t)b * PX__RT_Q8_K_BYTES);
    }
    switch (t) {
    case PX_DTYPE_Q2_K:
        gemv_q2_k(w, row_bytes, k, i0, i1, xq, dx, y);
        break;
    case PX_DTYPE_Q3_K:
        gemv_q3_k(w, row_bytes, k, i0, i1, xq, dx, y);
        break;
    case PX_DTYPE_Q4_K:
        gemv_q4_k(w, row_bytes, k, i0, i1, xq, dx, y);
        break;
    case PX_DTYPE_Q5_K:
        gemv_q5_k(w, row_bytes, k, i0, i1, xq, dx, y);
        break;
    default:
        gemv_q6_k(w, row_bytes, k, i0, i1, xq, dx, y);
        break;
    }
    return true;
}

/* Products by Q4_K weights repacked sixteen rows to a tile (px__rt_q4_k_repack16): lane r of
 * every register is row r of the group, so that nothing is reduced across lanes and the
 * weights stream from memory in one run, each of their bytes loaded once a product.  Per
 * super-block, dword j of the rows' quants (values 64p + 4(j % 8) .. + 3 in its low nibbles, 32
 * above in its high ones, p = j / 8) is multiplied by VNNI with the matching four activations
 * broadcast, into one int32 sum per 32-value group and row; the high nibbles are taken in place
 * (sixteen times the value), their sums shifted back, exact.  The rows' scales and mins are
 * decoded in their lanes, S takes each group's sum times its scale, M the mins times the
 * activations' sums of 32 (int16 pairs, vpdpwssd), and the float step is the definition's,
 * (dx * d) * S - (dx * dmin) * M, added in the definition's order: each lane's result is the
 * single dot's.  A batch (prefill) takes each group against every activation row in turn, the
 * group's tiles staying in cache: fewer instructions a value than decoding the rows for the
 * batch's own kernel. */

/* Byte g (0..3) of each dword, zero-extended (vpshufb, within 128-bit lanes). */
INLINE __m512i dword_byte(__m512i v, uint32_t g)
{
    const __m512i base =
        _mm512_set_epi32(0x8080800C, 0x80808008, 0x80808004, 0x80808000, 0x8080800C, 0x80808008,
                         0x80808004, 0x80808000, 0x8080800C, 0x80808008, 0x80808004, 0x80808000,
                         0x8080800C, 0x80808008, 0x80808004, 0x80808000);
    return _mm512_shuffle_epi8(v, _mm512_add_epi32(base, _mm512_set1_epi32((int)g)));
}

INLINE __m512i bcast32(const uint8_t *p)
{
    return _mm512_set1_epi32((int)u32_at(p));
}

/* The float terms of one super-block of sixteen rows (tile) against activation block xb
 * (Q8_K), one a lane. */
INLINE __m512 q4k16_block(const uint8_t *tile, const uint8_t *xb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m4h = _mm512_set1_epi8((char)0xF0);
    const uint8_t *qs = tile + PX__RT_Q4K16_QS, *x = xb + 4;
    __m512i acc[8];
    for (uint32_t g = 0; g < 8; g++)
        acc[g] = _mm512_setzero_si512();
#pragma GCC unroll 32
    for (uint32_t j = 0; j < 32; j++) {
        uint32_t p = j / 8, o = 64 * p + 4 * (j % 8);
        __m512i raw = _mm512_loadu_si512(qs + 64 * j);
        acc[2 * p] = _mm512_dpbusd_epi32(acc[2 * p], _mm512_and_si512(raw, m4), bcast32(x + o));
        acc[2 * p + 1] =
            _mm512_dpbusd_epi32(acc[2 * p + 1], _mm512_and_si512(raw, m4h), bcast32(x + o + 32));
    }
    /* px__rt_q4_k_scales in lanes: scales 0..3 and mins 0..3 in the low six bits of dwords a
     * and b; 4..7 the nibbles of c under the top two bits of a and b. */
    const __m512i k1 = _mm512_set1_epi8(0x3F), k2 = _mm512_set1_epi8(0x0F),
                  k3 = _mm512_set1_epi8(0x30);
    __m512i a = _mm512_loadu_si512(tile + PX__RT_Q4K16_SCALES),
            b = _mm512_loadu_si512(tile + PX__RT_Q4K16_SCALES + 64),
            c = _mm512_loadu_si512(tile + PX__RT_Q4K16_SCALES + 128);
    __m512i sc[2] = {
        _mm512_and_si512(a, k1),
        _mm512_ternarylogic_epi32(c, k2, _mm512_and_si512(_mm512_srli_epi32(a, 2), k3), 0xEA)};
    __m512i mn[2] = {_mm512_and_si512(b, k1),
                     _mm512_ternarylogic_epi32(_mm512_srli_epi32(c, 4), k2,
                                               _mm512_and_si512(_mm512_srli_epi32(b, 2), k3),
                                               0xEA)};
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (uint32_t g = 0; g < 8; g += 2) {
        __m512i hi = _mm512_srai_epi32(acc[g + 1], 4);
        s0 = _mm512_add_epi32(s0, _mm512_mullo_epi32(acc[g], dword_byte(sc[g / 4], g % 4)));
        s1 = _mm512_add_epi32(s1, _mm512_mullo_epi32(hi, dword_byte(sc[g / 4], g % 4 + 1)));
    }
    /* The activations' sums of 32 (sums of 16 added in pairs, at most 4096 in magnitude) as
     * int16 pairs [0, 2], [1, 3], [4, 6], [5, 7], against the mins' even and odd bytes. */
    __m256i s32 =
        _mm256_permutevar8x32_epi32(_mm256_madd_epi16(load256(xb + 260), _mm256_set1_epi16(1)),
                                    _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    uint32_t xs[4];
    _mm_storeu_si128(
        (__m128i *)(void *)xs,
        _mm_or_si128(_mm_and_si128(_mm256_castsi256_si128(s32), _mm_set1_epi32(0xFFFF)),
                     _mm_slli_epi32(_mm256_extracti128_si256(s32, 1), 16)));
    const __m512i even = _mm512_set1_epi32(0x00FF00FF);
    __m512i m = _mm512_setzero_si512();
    for (uint32_t h = 0; h < 2; h++) {
        m = _mm512_dpwssd_epi32(m, _mm512_and_si512(mn[h], even),
                                _mm512_set1_epi32((int)xs[2 * h]));
        m = _mm512_dpwssd_epi32(m, _mm512_and_si512(_mm512_srli_epi32(mn[h], 8), even),
                                _mm512_set1_epi32((int)xs[2 * h + 1]));
    }
    __m512 d = _mm512_cvtph_ps(load256(tile)), dmin = _mm512_cvtph_ps(load256(tile + 32));
    __m512 vx = _mm512_set1_ps(f32_at(xb));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(vx, d), _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)));
    return _mm512_sub_ps(v, _mm512_mul_ps(_mm512_mul_ps(vx, dmin), _mm512_cvtepi32_ps(m)));
}

/* Bytes ahead of a tile whose lines are asked for with it.  One stream from memory leaves the
 * hardware's prefetch behind at every page: two tiles ahead, the products of a model's
 * matrices (46 MB, one thread) read 33 to 37 GB/s where they read 20 to 23 without (a
 * streaming read of the same machine: 30).  Past a matrix's end the hint touches nothing. */
#define X16_AHEAD (2 * PX__RT_Q4K16_TILE)

/* The sixteen dots of the group at grp (nb super-blocks) with one activation row, each the sum
 * of its chunks' dots in order. */
INLINE __m512 q4k16_group(const uint8_t *grp, uint32_t nb, const uint8_t *xq)
{
    __m512 total = _mm512_setzero_ps();
    for (uint32_t c0 = 0; c0 < nb; c0 += PX__RT_QCHUNK / PX__RT_QK) {
        uint32_t c1 = PX_MIN(nb, c0 + PX__RT_QCHUNK / PX__RT_QK);
        __m512 acc = _mm512_setzero_ps();
        for (uint32_t b = c0; b < c1; b++) {
            const uint8_t *tile = grp + (size_t)b * PX__RT_Q4K16_TILE;
            for (uint32_t l = 0; l < PX__RT_Q4K16_TILE; l += 64)
                _mm_prefetch((const char *)tile + X16_AHEAD + l, _MM_HINT_T0);
            acc = _mm512_add_ps(acc, q4k16_block(tile, xq + (size_t)b * PX__RT_Q8_K_BYTES));
        }
        total = c0 == 0 ? acc : _mm512_add_ps(total, acc);
    }
    return total;
}

TGT void px__rt_quant_gemm_x16_x512(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                                    uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x,
                                    float *y, size_t ldy)
{
    uint32_t nb = k / PX__RT_QK;
    for (uint32_t g = i0; g < i1; g += PX__RT_Q4K16_ROWS)
        for (uint32_t r = 0; r < n_x; r++)
            _mm512_storeu_ps(y + (size_t)r * ldy + g,
                             q4k16_group(w + (size_t)g * row_bytes, nb, xq + (size_t)r * ldxq));
}

_Static_assert(PX__RT_QDOT_ROWS == 4, "dotn_k reduces four rows at once");

/* The dots of one weight row with nx activation rows (xq, ldxq bytes apart; prefill): each
 * super-block's values and scales are decoded once for all of them, the rows' integer sums
 * reduced together and their float steps taken in one lane each, so that each row's result is
 * the single dot's. */
INLINE void dotn_k(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq, uint32_t nx,
                   uint32_t n, float *out)
{
    if (nx == 1) {
        out[0] = dot1_k(t, w, xq, n);
        return;
    }
    size_t bb = px_dtype_block_bytes(t);
    uint32_t doff = d_offset(t);
    __m128 acc = _mm_setzero_ps();
    __m512i group[4];
    k_groups(t, group);
    for (uint32_t i = 0; i < n / PX__RT_QK; i++) {
        const uint8_t *blk = w + i * bb, *xb = xq + (size_t)i * PX__RT_Q8_K_BYTES;
        __m512i v[4], sc[4];
        __m256i per16;
        k_decode(t, blk, group, v, sc, &per16);
        __m512i sum[PX__RT_QDOT_ROWS];
        __m256i msum[PX__RT_QDOT_ROWS];
        float dxs[PX__RT_QDOT_ROWS] = {0};
        for (uint32_t r = 0; r < nx; r++) {
            k_sums(t, v, sc, per16, xb + r * ldxq, &sum[r], &msum[r]);
            dxs[r] = f32_at(xb + r * ldxq);
        }
        for (uint32_t r = nx; r < PX__RT_QDOT_ROWS; r++) {
            sum[r] = _mm512_setzero_si512();
            msum[r] = _mm256_setzero_si256();
        }
        __m128i sumi = hsum4_512(sum[0], sum[1], sum[2], sum[3]);
        __m128i summ = has_min(t) ? hsum4_256(msum[0], msum[1], msum[2], msum[3]) : sumi;
        __m128 d = _mm_set1_ps(f16_at(blk + doff));
        __m128 dmin = has_min(t) ? _mm_set1_ps(f16_at(blk + doff + 2)) : d;
        acc = _mm_add_ps(acc, k_floats(t, sumi, summ, _mm_loadu_ps(dxs), d, dmin));
    }
    float v[4];
    _mm_storeu_ps(v, acc);
    for (uint32_t r = 0; r < nx; r++)
        out[r] = v[r];
}

/* Q4_0 and Q5_0: bytes of a block and where its 16 bytes of nibbles lie
 * (after the f16 scale, and Q5_0's 32 fifth bits). */
INLINE size_t legacy_bytes(px_dtype t)
{
    return t == PX_DTYPE_Q5_0 ? 22 : 18;
}

INLINE size_t legacy_nibbles(px_dtype t)
{
    return t == PX_DTYPE_Q5_0 ? 6 : 2;
}

/* The offset a Q4_0 (8) or Q5_0 (16) value is stored above its own. */
INLINE int legacy_offset(px_dtype t)
{
    return t == PX_DTYPE_Q5_0 ? 16 : 8;
}

/* The 32 values of the block at blk, unsigned (value + offset), in order:
 * the low nibbles of its 16 bytes, then the high ones. */
INLINE __m256i legacy_values32(px_dtype t, const uint8_t *blk)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)(blk + legacy_nibbles(t)));
    __m128i m4 = _mm_set1_epi8(0xF);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                                        _mm_and_si128(_mm_srli_epi16(raw, 4), m4), 1);
    if (t == PX_DTYPE_Q5_0) {
        /* Bit j of qh is the fifth bit of value j: a byte mask as is. */
        uint32_t qh;
        memcpy(&qh, blk + 2, sizeof qh);
        v = _mm256_mask_add_epi8(v, (__mmask32)qh, v, _mm256_set1_epi8(16));
    }
    return v;
}

/* The 64 values of the blocks at blk and blk + legacy_bytes(t), unsigned,
 * in order: [low nibbles 0, high 0, low 1, high 1]. */
INLINE __m512i legacy_values64(px_dtype t, const uint8_t *blk)
{
    size_t nb = legacy_nibbles(t), bb = legacy_bytes(t);
    __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + nb))),
        _mm_loadu_si128((const __m128i *)(const void *)(blk + bb + nb)), 1);
    /* [bytes 0, bytes 0, bytes 1, bytes 1] in 128-bit lanes, the second
     * copy of each block's bytes shifted to its high nibbles. */
    __m512i r = _mm512_castsi256_si512(raw);
    r = _mm512_shuffle_i64x2(r, r, _MM_SHUFFLE(1, 1, 0, 0));
    __m512i v =
        _mm512_and_si512(_mm512_mask_srli_epi16(r, 0xFF00FF00u, r, 4), _mm512_set1_epi8(0xF));
    if (t == PX_DTYPE_Q5_0) {
        uint32_t h0, h1;
        memcpy(&h0, blk + 2, sizeof h0);
        memcpy(&h1, blk + bb + 2, sizeof h1);
        v = _mm512_mask_add_epi8(v, (__mmask64)h1 << 32 | h0, v, _mm512_set1_epi8(16));
    }
    return v;
}

/* The f16 values at a and b as floats (exact), in lanes 0 and 1. */
INLINE __m128 f16_pair(const uint8_t *a, const uint8_t *b)
{
    uint16_t ha, hb;
    memcpy(&ha, a, sizeof ha);
    memcpy(&hb, b, sizeof hb);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)hb << 16 | ha)));
}

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as cpu_quant.c. */
INLINE float lanes_sum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The products of the weight blocks i and i + 1 (values v, scales dw in
 * lanes 0 and 1) with the activation blocks at xb: lanes 0..7 block i's
 * eight p_l * (d_w * d_x), lanes 8..15 block i + 1's. */
INLINE __m512 legacy_pair(__m512i v, __m128 dw, __m512i off, const uint8_t *xb)
{
    const size_t xbb = PX__RT_Q8_0_ACT_BYTES;
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i x = join(load256(xb + 2), load256(xb + xbb + 2));
    /* Exact: sum of four (value + offset) * x, less offset times the sum
     * of the four x. */
    __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), v, x),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, x));
    __m512 s = _mm512_permutexvar_ps(
        spread, _mm512_castps128_ps512(_mm_mul_ps(dw, f16_pair(xb, xb + xbb))));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(p), s);
}

_Static_assert(PX__RT_Q0_GROUPS == 4, "dotn_legacy keeps four groups in two registers");

/* The dots of one Q4_0/Q5_0 weight row with nx activation rows of Q8_0
 * blocks (xq, ldxq bytes apart): each pair of weight blocks is decoded
 * once for all of them.  The definition's four groups lie in two
 * registers per row: pair j (blocks 2j, 2j + 1) adds to acc[j % 2], its
 * first block in lanes 0..7 (group 2j % 4), its second in lanes 8..15
 * (group 2j % 4 + 1); two chains of additions per row, each taking one
 * addition per pair, instead of one chain taking two.  Then acc0 + acc1
 * holds g0 + g2 in its low half and g1 + g3 in its high half. */
INLINE void dotn_legacy(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq, uint32_t nx,
                        uint32_t n, float *out)
{
    const size_t bb = legacy_bytes(t), xbb = PX__RT_Q8_0_ACT_BYTES;
    const __m512i off = _mm512_set1_epi8((char)legacy_offset(t));
    __m512 acc[PX__RT_QDOT_ROWS][2];
#pragma GCC unroll 4
    for (uint32_t r = 0; r < nx; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    uint32_t nb = n / PX__RT_QK0, np = nb / 2, p = 0;
    for (; p + 2 <= np; p += 2)
#pragma GCC unroll 2
        for (uint32_t j = 0; j < 2; j++) {
            const uint8_t *blk = w + 2 * (p + j) * bb;
            __m512i v = legacy_values64(t, blk);
            __m128 dw = f16_pair(blk, blk + bb);
#pragma GCC unroll 4
            for (uint32_t r = 0; r < nx; r++)
                acc[r][j] = _mm512_add_ps(
                    acc[r][j], legacy_pair(v, dw, off, xq + r * ldxq + 2 * (p + j) * xbb));
        }
    if (p < np) {
        const uint8_t *blk = w + 2 * p * bb;
        __m512i v = legacy_values64(t, blk);
        __m128 dw = f16_pair(blk, blk + bb);
#pragma GCC unroll 4
        for (uint32_t r = 0; r < nx; r++)
            acc[r][0] =
                _mm512_add_ps(acc[r][0], legacy_pair(v, dw, off, xq + r * ldxq + 2 * p * xbb));
    }
    if (nb % 2) {
        /* The last block, 2 np: the low half of acc[np % 2]. */
        uint32_t i = nb - 1, j = np % 2;
        const uint8_t *blk = w + i * bb;
        __m256i v = legacy_values32(t, blk);
        float d0 = f16_at(blk);
#pragma GCC unroll 4
        for (uint32_t r = 0; r < nx; r++) {
            const uint8_t *xb = xq + r * ldxq + i * xbb;
            __m256i x = load256(xb + 2);
            __m256i pi = _mm256_sub_epi32(
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), v, x),
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(off), x));
            __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(pi), _mm256_set1_ps(d0 * f16_at(xb)));
            __m512 a = j ? acc[r][1] : acc[r][0];
            a = _mm512_mask_add_ps(a, 0xFF, a, _mm512_zextps256_ps512(prod));
            if (j)
                acc[r][1] = a;
            else
                acc[r][0] = a;
        }
    }
#pragma GCC unroll 4
    for (uint32_t r = 0; r < nx; r++) {
        __m512 g = _mm512_add_ps(acc[r][0], acc[r][1]);
        out[r] = lanes_sum(_mm256_add_ps(_mm512_castps512_ps256(g), _mm512_extractf32x8_ps(g, 1)));
    }
}

/* v with NaN lanes as 0, clamped to [-127, 127] (an infinity to 127 in
 * magnitude): the portable quantizers' clamp. */
INLINE __m512 clamp127(__m512 v)
{
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

/* roundf of each lane (half away from zero), for |v| <= 127: the whole
 * part t, exact, then one more in magnitude where |v - t| >= 0.5 (v - t
 * is exact). */
INLINE __m512i round_away(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up =
        _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)),
                        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

/* Q8_0 activation blocks as quant.c makes them (d = amax / 127 as an f16,
 * x * (1 / d) rounded half away from zero, NaN as 0, clamped): the
 * largest magnitude a vector maximum (a NaN or an infinity flagged apart),
 * the scales in scalar code as there, the f16 by F16C's rounding to
 * nearest even (px_f32_to_f16's; a NaN scale by px_f32_to_f16 itself). */
static TGT void quant_act_q8_0(const float *x, uint8_t *out, uint32_t n)
{
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    for (uint32_t b = 0; b < n / PX__RT_QK0; b++, x += PX__RT_QK0) {
        uint8_t *blk = out + (size_t)b * PX__RT_Q8_0_ACT_BYTES;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        /* Not <= FLT_MAX: NaN (unordered) or infinite. */
        if (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) {
            float d = NAN / 127.0f;
            uint16_t h = px_f32_to_f16(d);
            memcpy(blk, &h, sizeof h);
            memset(blk + 2, 0, PX__RT_QK0);
            continue;
        }
        float d = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / 127.0f;
        float id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(blk, &h, sizeof h);
        __m512 is = _mm512_set1_ps(id);
        __m128i q0 = _mm512_cvtepi32_epi8(round_away(clamp127(_mm512_mul_ps(v0, is))));
        __m128i q1 = _mm512_cvtepi32_epi8(round_away(clamp127(_mm512_mul_ps(v1, is))));
        _mm256_storeu_si256((__m256i *)(void *)(blk + 2), _mm256_set_m128i(q1, q0));
    }
}

/* px__rt_quantize_q8_act_ref's blocks: the largest magnitude of the
 * values that are not NaN (NaN flagged apart), the scales in scalar code
 * as there, x * (127 / amax) with NaN as 0, clamped, rounded to nearest
 * even (the processor's rounding, as lrintf). */
TGT void px__rt_quantize_q8_act_x512(const float *x, uint32_t k, int8_t *q, float *d)
{
    for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++, x += PX__RT_Q8_0_ELEMS) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        bool has_nan = (_mm512_cmp_ps_mask(a0, a0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(a1, a1, _CMP_UNORD_Q)) != 0;
        /* Without NaN lanes (maxps would return its second operand for
         * them); with one, amax is not used. */
        float m = has_nan ? 0.0f : _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        float id = m > 0 && !has_nan ? 127.0f / m : 0.0f;
        d[b] = has_nan ? NAN : m / 127.0f;
        __m512 is = _mm512_set1_ps(id);
        __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(clamp127(_mm512_mul_ps(v0, is))));
        __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(clamp127(_mm512_mul_ps(v1, is))));
        _mm256_storeu_si256((__m256i *)(void *)(q + (size_t)b * PX__RT_Q8_0_ELEMS),
                            _mm256_set_m128i(q1, q0));
    }
}

/* Q8_K activations as quant.c makes them: the largest magnitude (any
 * order: a maximum), the scale 127 / amax in scalar code, each value
 * rounded to nearest even by the same float add of 1.5 * 2^23 and
 * clamped to [-127, 127], the sums of each 16 (one vector's lanes) exact.
 * A block with a NaN or an infinity gets a NaN scale and zero values. */
TGT void px__rt_quant_act_x512(px_dtype t, const float *x, uint8_t *out, uint32_t n)
{
    if (px__rt_quant_act_dtype(t) != PX_DTYPE_Q8_K) {
        quant_act_q8_0(x, out, n);
        return;
    }
    const __m512 big = _mm512_set1_ps(FLT_MAX), magic = _mm512_set1_ps(12582912.f);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (uint32_t b = 0; b < n / PX__RT_QK; b++, x += PX__RT_QK) {
        uint8_t *blk = out + (size_t)b * PX__RT_Q8_K_BYTES;
        int8_t *q = (int8_t *)(blk + 4);
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (uint32_t j = 0; j < PX__RT_QK; j += 16) {
            __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + j));
            /* Not <= FLT_MAX: NaN (unordered) or infinite. */
            bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);
            amax = _mm512_max_ps(amax, a);
        }
        float m = _mm512_reduce_max_ps(amax), d = 0;
        if (bad || m == 0) {
            d = bad ? NAN : 0.0f;
            memset(q, 0, PX__RT_QK);
            memset(blk + 260, 0, 32);
        } else {
            float iscale = 127.0f / m;
            __m512 is = _mm512_set1_ps(iscale);
            int16_t sums[16];
            for (uint32_t j = 0; j < PX__RT_QK; j += 16) {
                __m512 f = _mm512_add_ps(_mm512_mul_ps(is, _mm512_loadu_ps(x + j)), magic);
                __m512i i = _mm512_sub_epi32(
                    _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32(0x007fffff)),
                    _mm512_set1_epi32(0x00400000));
                i = _mm512_max_epi32(lo, _mm512_min_epi32(hi, i));
                _mm_storeu_si128((__m128i *)(void *)(q + j), _mm512_cvtepi32_epi8(i));
                sums[j / 16] = (int16_t)_mm512_reduce_add_epi32(i);
            }
            memcpy(blk + 260, sums, sizeof sums);
            d = 1.0f / iscale;
        }
        memcpy(blk, &d, sizeof d);
    }
}

/* dotn_k with nx a constant, for each format. */
#define DOTN(name, body, fmt)                                                           \
    static TGT void name(const uint8_t *w, const uint8_t *xq, size_t ldxq, uint32_t nx, \
                         uint32_t n, float *out)                                        \
    {                                                                                   \
        switch (nx) {                                                                   \
        case 1:                                                                         \
            body(fmt, w, xq, ldxq, 1, n, out);                                          \
            break;                                                                      \
        case 2:                                                                         \
            body(fmt, w, xq, ldxq, 2, n, out);                                          \
            break;                                                                      \
        case 3:                                                                         \
            body(fmt, w, xq, ldxq, 3, n, out);                                          \
            break;                                                                      \
        default:                                                                        \
            body(fmt, w, xq, ldxq, 4, n, out);                                          \
            break;                                                                      \
        }                                                                               \
    }
DOTN(dotn_q4_0, dotn_legacy, PX_DTYPE_Q4_0)
DOTN(dotn_q5_0, dotn_legacy, PX_DTYPE_Q5_0)
DOTN(dotn_q2_k, dotn_k, PX_DTYPE_Q2_K)
DOTN(dotn_q3_k, dotn_k, PX_DTYPE_Q3_K)
DOTN(dotn_q4_k, dotn_k, PX_DTYPE_Q4_K)
DOTN(dotn_q5_k, dotn_k, PX_DTYPE_Q5_K)
DOTN(dotn_q6_k, dotn_k, PX_DTYPE_Q6_K)
#undef DOTN

/* Prefill of Q4_K, Q5_K and Q6_K sixteen activation rows at a time, one a lane of each
 * register.  The activations of sixteen rows are laid out once per product (pf_pack), four
 * values of a row to a 32-bit lane; a weight super-block is decoded once to bytes, and each four
 * of its values, broadcast, multiply the sixteen rows' four in one VNNI step (vpdpbusd: the
 * values unsigned, the activations signed), one chain per scale group.  So the sums need no
 * reduction across lanes: S is the chains times their scales (Q6_K: less 32 times the scales
 * against the activations' sums of 16), M the mins against those sums, all exact in int32, and
 * the float step is the definition's in each lane. */
enum { PF_ROWS = 16, PF_GROUPS = 4 };
/* Fewer rows than PF_PAD_MIN past the groups of sixteen go four at a time (dotn_k); this many
 * or more take a group of their own, its other lanes empty: cheaper than four at a time from
 * about five rows on beside a full group, which shares each weight super-block's decode, and
 * from about twelve alone (eight alone measured slower). */
enum { PF_PAD_MIN = 6, PF_ALONE_MIN = 12 };
#define PF_BS_OFF   (PX__RT_QK * PF_ROWS)
#define PF_DX_OFF   (PF_BS_OFF + 8 * 64)
#define PF_SB_BYTES (PF_DX_OFF + 64)

/* Super-block i of `rows` (at most sixteen) activation rows (xq, ldxq bytes apart) laid out at
 * out: for each four values 4q .. 4q + 3, the rows' bytes in lanes (64 bytes); for each two sums
 * of 16 values, the rows' pairs (int16); the rows' scales.  Lanes past `rows` hold zeros. */
INLINE void pf_pack(const uint8_t *xq, size_t ldxq, uint32_t i, uint32_t rows, uint8_t *out)
{
    const __mmask16 live = (__mmask16)((1u << rows) - 1);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i at =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)ldxq));
    const uint8_t *base = xq + (size_t)i * PX__RT_Q8_K_BYTES;
    for (uint32_t q = 0; q < PX__RT_QK / 4; q++)
        _mm512_store_si512(out + 64 * q,
                           _mm512_mask_i32gather_epi32(zero, live, at, base + 4 + 4 * q, 1));
    for (uint32_t a = 0; a < 8; a++)
        _mm512_store_si512(out + PF_BS_OFF + 64 * a,
                           _mm512_mask_i32gather_epi32(zero, live, at, base + 260 + 4 * a, 1));
    _mm512_store_si512(out + PF_DX_OFF, _mm512_mask_i32gather_epi32(zero, live, at, base, 1));
}

/* The scale group (Q4_K, Q5_K: of 32 values) of each 32 bytes of pf_weights' u. */
static const uint8_t PF_GROUP[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/* A super-block decoded for pf_sums: its values as bytes in u (Q6_K: in order, before their
 * offset; Q4_K, Q5_K: 32 a group in the order PF_GROUP, the low nibbles of 64 bytes, then the
 * high ones); its scales as int32 in sc; in mp, int16 pairs against each two sums of 16 values:
 * each group's min twice (Q4_K, Q5_K), or minus 32 times the two groups' scales (Q6_K). */
INLINE void pf_weights(px_dtype t, const uint8_t *blk, const __m512i g[4], uint8_t *u, int32_t *sc,
                       uint8_t *mp)
{
    if (t == PX_DTYPE_Q6_K) {
        for (uint32_t s = 0; s < 4; s++)
            _mm512_store_si512(u + 64 * s, values64(t, blk, s));
        __m128i s8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 192));
        _mm512_store_si512(sc, _mm512_cvtepi8_epi32(s8));
        __m256i s16 = _mm256_cvtepi8_epi16(s8);
        _mm256_store_si256((__m256i *)(void *)mp,
                           _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)));
        return;
    }
    for (uint32_t p = 0; p < 2; p++) {
        __m512i lo, hi;
        k4_values128(t, blk, g, p, &lo, &hi);
        _mm512_store_si512(u + 128 * p, lo);
        _mm512_store_si512(u + 128 * p + 64, hi);
    }
    __m256i sm = k4_scales_mins(blk);
    _mm256_store_si256((__m256i *)(void *)sc, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(sm)));
    __m128i mins = _mm256_extracti128_si256(sm, 1);
    _mm_store_si128((__m128i *)(void *)mp, _mm_unpacklo_epi16(mins, mins));
    _mm_store_si128((__m128i *)(void *)(mp + 16), _mm_unpackhi_epi16(mins, mins));
}

/* S and M of a decoded super-block against one or two (x1 not NULL) groups of sixteen rows laid
 * out by pf_pack (M zero without mins): eight chains a group at a time, one per scale group,
 * each broadcast of four values shared by both groups. */
INLINE void pf_sums(px_dtype t, const uint8_t *u, const int32_t *sc, const uint8_t *mp,
                    const uint8_t *x0, const uint8_t *x1, __m512i out[4])
{
    /* Values and steps of four a scale group. */
    const uint32_t gv = per32(t) ? 32 : 16, steps = gv / 4;
    __m512i s = _mm512_setzero_si512(), r = _mm512_setzero_si512();
    for (uint32_t h = 0; h < PX__RT_QK / gv / 8; h++) {
        __m512i a0[8], a1[8];
#pragma GCC unroll 8
        for (uint32_t c = 0; c < 8; c++)
            a0[c] = a1[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (uint32_t q = 0; q < steps; q++)
#pragma GCC unroll 8
            for (uint32_t c = 0; c < 8; c++) {
                uint32_t grp = per32(t) ? PF_GROUP[c] : 8 * h + c;
                __m512i v = _mm512_set1_epi32((int)u32_at(u + gv * (8 * h + c) + 4 * q));
                size_t at = 64 * (steps * (size_t)grp + q);
                a0[c] = _mm512_dpbusd_epi32(a0[c], v, _mm512_load_si512(x0 + at));
                if (x1)
                    a1[c] = _mm512_dpbusd_epi32(a1[c], v, _mm512_load_si512(x1 + at));
            }
#pragma GCC unroll 8
        for (uint32_t c = 0; c < 8; c++) {
            __m512i scale = _mm512_set1_epi32(sc[per32(t) ? PF_GROUP[c] : 8 * h + c]);
            s = _mm512_add_epi32(s, _mm512_mullo_epi32(a0[c], scale));
            if (x1)
                r = _mm512_add_epi32(r, _mm512_mullo_epi32(a1[c], scale));
        }
    }
    __m512i m = _mm512_setzero_si512(), n = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (uint32_t a = 0; a < 8; a++) {
        __m512i p = _mm512_set1_epi32((int)u32_at(mp + 4 * a));
        m = _mm512_dpwssd_epi32(m, _mm512_load_si512(x0 + PF_BS_OFF + 64 * a), p);
        if (x1)
            n = _mm512_dpwssd_epi32(n, _mm512_load_si512(x1 + PF_BS_OFF + 64 * a), p);
    }
    if (!has_min(t)) {
        s = _mm512_add_epi32(s, m);
        r = _mm512_add_epi32(r, n);
    }
    out[0] = s;
    out[1] = m;
    out[2] = r;
    out[3] = n;
}

/* acc plus the definition's float term of a super-block in each row's lane: (dx * d) * S, less
 * (dx * dmin) * M with mins. */
INLINE __m512 pf_float(px_dtype t, __m512i s, __m512i m, const uint8_t *x, float d, float dmin,
                       __m512 acc)
{
    __m512 dx = _mm512_load_ps((const float *)(const void *)(x + PF_DX_OFF));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(d)), _mm512_cvtepi32_ps(s));
    if (has_min(t))
        v = _mm512_sub_ps(
            v, _mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(dmin)), _mm512_cvtepi32_ps(m)));
    return _mm512_add_ps(acc, v);
}

/* Weight rows [i0, i1) of w against nb groups of sixteen activation rows laid out at xp
 * (nsb super-blocks each; the last group `last` rows), into y (row r of group j at
 * y + (16 j + r) * ldy). */
INLINE void pf_rows(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                    uint32_t i1, const uint8_t *xp, uint32_t nb, uint32_t last, float *y,
                    size_t ldy)
{
    const size_t bb = px_dtype_block_bytes(t), nsb = k / PX__RT_QK;
    __m512i g[4];
    gemv_groups(t, g);
    _Alignas(64) uint8_t u[PX__RT_QK];
    _Alignas(64) int32_t sc[16];
    _Alignas(32) uint8_t mp[32];
    for (uint32_t i = i0; i < i1; i++) {
        const uint8_t *row = w + (size_t)i * row_bytes;
        for (uint32_t c0 = 0; c0 < k; c0 += PX__RT_QCHUNK) {
            __m512 acc[PF_GROUPS];
            for (uint32_t j = 0; j < nb; j++)
                acc[j] = _mm512_setzero_ps();
            uint32_t b1 = PX_MIN(k, c0 + PX__RT_QCHUNK) / PX__RT_QK;
            for (uint32_t b = c0 / PX__RT_QK; b < b1; b++) {
                const uint8_t *blk = row + b * bb;
                pf_weights(t, blk, g, u, sc, mp);
                float d = f16_at(blk + d_offset(t));
                float dmin = has_min(t) ? f16_at(blk + d_offset(t) + 2) : 0;
                for (uint32_t j = 0; j < nb; j += 2) {
                    const uint8_t *x0 = xp + (j * nsb + b) * PF_SB_BYTES,
                                  *x1 = j + 1 < nb ? x0 + nsb * PF_SB_BYTES : NULL;
                    __m512i sm[4];
                    pf_sums(t, u, sc, mp, x0, x1, sm);
                    acc[j] = pf_float(t, sm[0], sm[1], x0, d, dmin, acc[j]);
                    if (x1)
                        acc[j + 1] = pf_float(t, sm[2], sm[3], x1, d, dmin, acc[j + 1]);
                }
            }
            for (uint32_t j = 0; j < nb; j++) {
                float v[PF_ROWS];
                _mm512_storeu_ps(v, acc[j]);
                for (uint32_t r = 0; r < (j + 1 < nb ? PF_ROWS : last); r++) {
                    float *o = y + ((size_t)PF_ROWS * j + r) * ldy + i;
                    *o = c0 == 0 ? v[r] : *o + v[r];
                }
            }
        }
    }
}

#define PF_FN(NAME, T)                                                                             \
    static TGT void NAME(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1, \
                         const uint8_t *xp, uint32_t nb, uint32_t last, float *y, size_t ldy)      \
    {                                                                                              \
        pf_rows(T, w, row_bytes, k, i0, i1, xp, nb, last, y, ldy);                                 \
    }
PF_FN(pf_q4_k, PX_DTYPE_Q4_K)
PF_FN(pf_q5_k, PX_DTYPE_Q5_K)
PF_FN(pf_q6_k, PX_DTYPE_Q6_K)
#undef PF_FN

TGT uint32_t px__rt_quant_gemm16_x512(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,
                                      uint32_t i0, uint32_t i1, const uint8_t *xq, size_t ldxq,
                                      uint32_t n_x, float *y, size_t ldy)
{
    if ((!per32(t) && t != PX_DTYPE_Q6_K) || n_x < PF_ALONE_MIN || k % PX__RT_QK ||
        ldxq > INT32_MAX / PF_ROWS)
        return 0;
    /* Rows done: the groups of sixteen, and the rest when they are enough for a group. */
    uint32_t done = n_x % PF_ROWS < PF_PAD_MIN ? n_x - n_x % PF_ROWS : n_x;
    uint32_t ng = (done + PF_ROWS - 1) / PF_ROWS, nsb = k / PX__RT_QK;
    uint8_t *xp = aligned_alloc(64, (size_t)PX_MIN(ng, PF_GROUPS) * nsb * PF_SB_BYTES);
    if (!xp)
        return 0;
    /* Four groups at a time: their activations (some 18 KB a super-block) stay in the
     * second-level cache while every weight row passes once. */
    for (uint32_t g0 = 0; g0 < ng; g0 += PF_GROUPS) {
        uint32_t nb = PX_MIN(PF_GROUPS, ng - g0);
        uint32_t last = PX_MIN(PF_ROWS, done - (g0 + nb - 1) * PF_ROWS);
        for (uint32_t j = 0; j < nb; j++)
            for (uint32_t b = 0; b < nsb; b++)
                pf_pack(xq + (size_t)(g0 + j) * PF_ROWS * ldxq, ldxq, b,
                        j + 1 < nb ? PF_ROWS : last, xp + ((size_t)j * nsb + b) * PF_SB_BYTES);
        float *yg = y + (size_t)g0 * PF_ROWS * ldy;
        if (t == PX_DTYPE_Q4_K)
            pf_q4_k(w, row_bytes, k, i0, i1, xp, nb, last, yg, ldy);
        else if (t == PX_DTYPE_Q5_K)
            pf_q5_k(w, row_bytes, k, i0, i1, xp, nb, last, yg, ldy);
        else
            pf_q6_k(w, row_bytes, k, i0, i1, xp, nb, last, yg, ldy);
    }
    free(xp);
    return done;
}

void px__rt_quant_dotn_x512(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                            uint32_t n_x, uint32_t n, float *out)
{
    PX_ASSERT(n_x >= 1 && n_x <= PX__RT_QDOT_ROWS);
    switch (t) {
    case PX_DTYPE_Q4_0:
        dotn_q4_0(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q5_0:
        dotn_q5_0(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q2_K:
        dotn_q2_k(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q3_K:
        dotn_q3_k(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q4_K:
        dotn_q4_k(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q5_K:
        dotn_q5_k(w, xq, ldxq, n_x, n, out);
        break;
    case PX_DTYPE_Q6_K:
        dotn_q6_k(w, xq, ldxq, n_x, n, out);
        break;
    default:
        PX_ASSERT(!"px__rt_quant_dotn_x512: not a block format");
    }
}

float px__rt_quant_dot_x512(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    float v;
    px__rt_quant_dotn_x512(t, w, xq, 0, 1, n, &v);
    return v;
}

px__rt_quant_dot_fn px__rt_quant_dot_avx512(void)
{
    return px__rt_kernels_avx512() ? px__rt_quant_dot_x512 : NULL;
}

#else

px__rt_quant_dot_fn px__rt_quant_dot_avx512(void)
{
    return NULL;
}

#endif
