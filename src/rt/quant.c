/*
 * GGUF's block-quantized weight formats (ggml's layouts), decoded into the
 * integer form of quant_impl.h, and dequantised from it bit for bit as the
 * reference implementation computes them.
 *
 * Layouts, in bytes (d, dmin: f16 little-endian):
 *   q4_0  (32 values, 18)  d, qs[16]: value j < 16 in the low nibble of
 *                          qs[j], value j + 16 in its high nibble; q - 8
 *   q5_0  (32, 22)         d, qh (32 bits: the fifth bit of value j in bit
 *                          j), qs[16] as q4_0; q - 16
 *   q2_k  (256, 84)        scales[16] (low nibble scale, high nibble min,
 *                          per 16 values), qs[64] (2 bits), d, dmin
 *   q3_k  (256, 110)       hmask[32] (third bit), qs[64] (2 bits),
 *                          scales[12] (16 six-bit scales, biased by 32), d
 *   q4_k  (256, 144)       d, dmin, scales[12] (8 six-bit scales and mins,
 *                          per 32 values), qs[128] (4 bits)
 *   q5_k  (256, 176)       d, dmin, scales[12] as q4_k, qh[32] (fifth
 *                          bit), qs[128]
 *   q6_k  (256, 210)       ql[128] (low 4 bits), qh[64] (high 2 bits),
 *                          scales[16] (int8, per 16 values), d; q - 32
 * The order of values inside each is documented at its decoder below.
 */
#include "base/common.h"

#include <float.h>

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

static inline uint16_t u16_at(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

bool px__rt_quant_handles(px_dtype t)
{
    switch (t) {
    case PX_DTYPE_Q4_0:
    case PX_DTYPE_Q5_0:
    case PX_DTYPE_Q2_K:
    case PX_DTYPE_Q3_K:
    case PX_DTYPE_Q4_K:
    case PX_DTYPE_Q5_K:
    case PX_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* Six-bit scale i (of 16) of a q3_k block: the low four bits in the
 * nibbles of bytes 0..7 (i < 8: low nibble of byte i; else the high
 * nibble of byte i - 8), the high two bits in bytes 8..11 (bits 2*(i/4)
 * of byte 8 + i % 4). */
static int16_t scale_q3_k(uint32_t i, const uint8_t *s)
{
    uint32_t lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
    uint32_t hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (int16_t)((lo | (hi << 4)) - 32);
}

void px__rt_quant_scales(px_dtype t, const uint8_t *blk, px__rt_qblock *o)
{
    o->dmin = 0;
    o->has_min = false;
    memset(o->m, 0, sizeof o->m);
    switch (t) {
    case PX_DTYPE_Q4_0:
    case PX_DTYPE_Q5_0:
        o->d = px__rt_f16(u16_at(blk));
        o->sc[0] = o->sc[1] = 1;
        break;
    case PX_DTYPE_Q2_K:
        o->d = px__rt_f16(u16_at(blk + 80));
        o->dmin = px__rt_f16(u16_at(blk + 82));
        o->has_min = true;
        for (uint32_t s = 0; s < 16; s++) {
            o->sc[s] = blk[s] & 0xF;
            o->m[s] = blk[s] >> 4;
        }
        break;
    case PX_DTYPE_Q3_K:
        o->d = px__rt_f16(u16_at(blk + 108));
        for (uint32_t s = 0; s < 16; s++)
            o->sc[s] = scale_q3_k(s, blk + 96);
        break;
    case PX_DTYPE_Q4_K:
    case PX_DTYPE_Q5_K:
        o->d = px__rt_f16(u16_at(blk));
        o->dmin = px__rt_f16(u16_at(blk + 2));
        o->has_min = true;
        uint64_t sc8, m8;
        px__rt_q4_k_scales(blk + 4, &sc8, &m8);
        for (uint32_t s = 0; s < 8; s++) {
            o->sc[2 * s] = o->sc[2 * s + 1] = (int16_t)(sc8 >> 8 * s & 0xff);
            o->m[2 * s] = o->m[2 * s + 1] = (int16_t)(m8 >> 8 * s & 0xff);
        }
        break;
    case PX_DTYPE_Q6_K:
        o->d = px__rt_f16(u16_at(blk + 208));
        for (uint32_t s = 0; s < 16; s++)
            o->sc[s] = ((const int8_t *)(blk + 192))[s];
        break;
    default:
        PX_ASSERT(!"not a block format of quant.c");
    }
}

void px__rt_quant_unpack(px_dtype t, const uint8_t *row, uint32_t b, px__rt_qblock *o)
{
    const uint8_t *blk = row + (size_t)b * px_dtype_block_bytes(t);
    px__rt_quant_scales(t, blk, o);
    switch (t) {
    case PX_DTYPE_Q4_0: {
        const uint8_t *qs = blk + 2;
        for (uint32_t j = 0; j < 16; j++) {
            o->q[j] = (int8_t)((qs[j] & 0xF) - 8);
            o->q[j + 16] = (int8_t)((qs[j] >> 4) - 8);
        }
        break;
    }
    case PX_DTYPE_Q5_0: {
        uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 |
                      (uint32_t)blk[5] << 24;
        const uint8_t *qs = blk + 6;
        for (uint32_t j = 0; j < 16; j++) {
            uint32_t h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            o->q[j] = (int8_t)(((qs[j] & 0xF) | (h0 << 4)) - 16);
            o->q[j + 16] = (int8_t)(((qs[j] >> 4) | (h1 << 4)) - 16);
        }
        break;
    }
    case PX_DTYPE_Q2_K: {
        /* Value 128n + 32j + l (n < 2, j < 4, l < 32) is bits 2j..2j+1 of
         * qs[32n + l]; its group of 16 is 8n + 2j + l/16. */
        const uint8_t *qs = blk + 16;
        for (uint32_t n = 0; n < 2; n++)
            for (uint32_t j = 0; j < 4; j++)
                for (uint32_t l = 0; l < 32; l++)
                    o->q[128 * n + 32 * j + l] = (int8_t)((qs[32 * n + l] >> (2 * j)) & 3);
        break;
    }
    case PX_DTYPE_Q3_K: {
        /* As q2_k for the low two bits; the third is bit 4n + j of
         * hmask[l], and a clear bit subtracts 4. */
        const uint8_t *hm = blk, *qs = blk + 32;
        for (uint32_t n = 0; n < 2; n++)
            for (uint32_t j = 0; j < 4; j++)
                for (uint32_t l = 0; l < 32; l++) {
                    int lo = (qs[32 * n + l] >> (2 * j)) & 3;
                    int high = (hm[l] >> (4 * n + j)) & 1;
                    o->q[128 * n + 32 * j + l] = (int8_t)(lo - (high ? 0 : 4));
                }
        break;
    }
    case PX_DTYPE_Q4_K:
    case PX_DTYPE_Q5_K: {
        /* Value 64g + l (g < 4, l < 32) is the low nibble of qs[32g + l],
         * value 64g + 32 + l its high nibble; q5_k adds 16 where bit 2g
         * (2g + 1 for the high nibble) of qh[l] is set. */
        bool five = t == PX_DTYPE_Q5_K;
        const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
        for (uint32_t g = 0; g < 4; g++)
            for (uint32_t l = 0; l < 32; l++) {
                int lo = qs[32 * g + l] & 0xF, hi = qs[32 * g + l] >> 4;
                if (five) {
                    lo += ((qh[l] >> (2 * g)) & 1) << 4;
                    hi += ((qh[l] >> (2 * g + 1)) & 1) << 4;
                }
                o->q[64 * g + l] = (int8_t)lo;
                o->q[64 * g + 32 + l] = (int8_t)hi;
            }
        break;
    }
    case PX_DTYPE_Q6_K: {
        /* For each half n: value 128n + 32i + l (i < 4, l < 32) takes its
         * low four bits from ql[64n + l + 32*(i & 1)] (low nibble for
         * i < 2, high nibble otherwise) and its high two from bits 2i of
         * qh[32n + l]. */
        const uint8_t *ql = blk, *qh = blk + 128;
        for (uint32_t n = 0; n < 2; n++)
            for (uint32_t i = 0; i < 4; i++)
                for (uint32_t l = 0; l < 32; l++) {
                    uint8_t lb = ql[64 * n + l + 32 * (i & 1)];
                    int lo = i < 2 ? lb & 0xF : lb >> 4;
                    int hi = (qh[32 * n + l] >> (2 * i)) & 3;
                    o->q[128 * n + 32 * i + l] = (int8_t)((lo | (hi << 4)) - 32);
                }
        break;
    }
    default:
        PX_ASSERT(!"not a block format of quant.c");
    }
}

/* The values of one decoded block, in the reference's float order. */
static void dequant_block(const px__rt_qblock *b, uint32_t n, float *dst)
{
    for (uint32_t s = 0; s < n / 16; s++) {
        float dl = b->d * (float)b->sc[s];
        float ml = b->dmin * (float)b->m[s];
        const int8_t *q = b->q + 16 * s;
        float *y = dst + 16 * s;
        if (b->has_min)
            for (uint32_t l = 0; l < 16; l++)
                y[l] = dl * (float)q[l] - ml;
        else
            for (uint32_t l = 0; l < 16; l++)
                y[l] = dl * (float)q[l];
    }
}

void px__rt_quant_dequant_row(px_dtype t, const void *row, float *dst, uint32_t k)
{
    uint32_t be = px_dtype_block_elems(t);
    px__rt_qblock b;
    for (uint32_t i = 0; i < k / be; i++) {
        px__rt_quant_unpack(t, row, i, &b);
        dequant_block(&b, be, dst + (size_t)i * be);
    }
}

float px__rt_quant_value_at(px_dtype t, const void *row, uint32_t i)
{
    uint32_t be = px_dtype_block_elems(t);
    px__rt_qblock b;
    float vals[256];
    px__rt_quant_unpack(t, row, i / be, &b);
    dequant_block(&b, be, vals);
    return vals[i % be];
}

_Static_assert(PX__RT_Q4K16_QS == PX__RT_Q4K16_SCALES + 3 * 64,
               "a tile's quants follow its scales, a dword of every row at a time");

void px__rt_q4_k_repack16(const uint8_t *w, size_t row_bytes, uint32_t nb, uint8_t *out)
{
    const size_t bb = px_dtype_block_bytes(PX_DTYPE_Q4_K);
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t *tile = out + (size_t)b * PX__RT_Q4K16_TILE;
        for (uint32_t r = 0; r < PX__RT_Q4K16_ROWS; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bb;
            memcpy(tile + 2 * r, blk, 2);
            memcpy(tile + 32 + 2 * r, blk + 2, 2);
            /* Dwords 1 .. 35 (12 scale bytes, 128 quant bytes), 64 bytes apart. */
            uint8_t *dst = tile + PX__RT_Q4K16_SCALES + 4 * r;
            for (uint32_t j = 0; j < 35; j++)
                memcpy(dst + 64 * j, blk + 4 + 4 * j, 4);
        }
    }
}

px_status px_rt_weights_repack(px_rt_layout layout, px_dtype dtype, const void *src,
                               size_t row_bytes, uint64_t rows, uint64_t cols, void *dst,
                               px_err *err)
{
    if (layout == PX_RT_LAYOUT_ROWS) {
        memcpy(dst, src, (size_t)(rows * row_bytes));
        return PX_OK;
    }
    if (layout != PX_RT_LAYOUT_Q4_K_X16)
        return px_err_set(err, PX_EINVAL, "weights: unknown layout %u", (unsigned)layout);
    if (dtype != PX_DTYPE_Q4_K || cols % PX__RT_QK || rows % PX__RT_Q4K16_ROWS ||
        row_bytes != cols / PX__RT_QK * px_dtype_block_bytes(dtype))
        return px_err_set(err, PX_EINVAL,
                          "weights: the q4_k x16 layout takes contiguous q4_k matrices of whole "
                          "super-blocks and rows a multiple of 16, not %s %" PRIu64 " x %" PRIu64,
                          px_dtype_name(dtype), rows, cols);
    for (uint64_t g = 0; g < rows; g += PX__RT_Q4K16_ROWS)
        px__rt_q4_k_repack16((const uint8_t *)src + g * row_bytes, row_bytes,
                             (uint32_t)(cols / PX__RT_QK), (uint8_t *)dst + g * row_bytes);
    return PX_OK;
}

px_dtype px__rt_quant_act_dtype(px_dtype t)
{
    return t == PX_DTYPE_Q4_0 || t == PX_DTYPE_Q5_0 ? PX_DTYPE_Q8_0 : PX_DTYPE_Q8_K;
}

size_t px__rt_quant_act_bytes(px_dtype t, uint32_t n)
{
    if (px__rt_quant_act_dtype(t) == PX_DTYPE_Q8_0)
        return (size_t)(n / PX__RT_QK0) * PX__RT_Q8_0_ACT_BYTES;
    return (size_t)(n / PX__RT_QK) * PX__RT_Q8_K_BYTES;
}

/* Largest magnitude of n values; NaN when one is NaN or infinite. */
static float abs_max(const float *x, uint32_t n)
{
    float amax = 0;
    for (uint32_t j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (!(a <= FLT_MAX))
            return NAN;
        if (a > amax)
            amax = a;
    }
    return amax;
}

void px__rt_quant_act(px_dtype t, const float *x, uint8_t *out, uint32_t n)
{
    if (px__rt_quant_act_dtype(t) == PX_DTYPE_Q8_0) {
        /* Q8_0 as ggml's reference: d = amax / 127 (stored f16), values
         * x * (1 / d) rounded half away from zero and clamped to
         * [-127, 127].  Where d is subnormal, 1 / d is infinite: a zero
         * value gives 0 * inf = NaN there, which is taken as 0 (the
         * vector variants reproduce this byte for byte). */
        for (uint32_t b = 0; b < n / PX__RT_QK0; b++, x += PX__RT_QK0) {
            uint8_t *blk = out + (size_t)b * PX__RT_Q8_0_ACT_BYTES;
            int8_t *q = (int8_t *)(blk + 2);
            float amax = abs_max(x, PX__RT_QK0);
            float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
            uint16_t h = px_f32_to_f16(d);
            blk[0] = (uint8_t)h;
            blk[1] = (uint8_t)(h >> 8);
            for (uint32_t j = 0; j < PX__RT_QK0; j++) {
                float v = x[j] * id;
                q[j] =
                    isnan(d) || isnan(v) ? 0 : (int8_t)PX_MAX(-127.0f, PX_MIN(127.0f, roundf(v)));
            }
        }
        return;
    }
    /* Q8_K: d = amax / 127 as 1 / (127 / amax), values rounded to nearest
     * even, and the sum of each 16. */
    for (uint32_t b = 0; b < n / PX__RT_QK; b++, x += PX__RT_QK) {
        uint8_t *blk = out + (size_t)b * PX__RT_Q8_K_BYTES;
        int8_t *q = (int8_t *)(blk + 4);
        float amax = abs_max(x, PX__RT_QK), d = 0;
        if (isnan(amax)) {
            d = NAN;
            memset(q, 0, PX__RT_QK);
        } else if (amax == 0) {
            memset(q, 0, PX__RT_QK);
        } else {
            float iscale = 127.0f / amax;
            for (uint32_t j = 0; j < PX__RT_QK; j++)
                q[j] = (int8_t)PX_MAX(-127, PX_MIN(127, px__rt_nearest_int(iscale * x[j])));
            d = 1.0f / iscale;
        }
        memcpy(blk, &d, sizeof d);
        for (uint32_t s = 0; s < 16; s++) {
            int16_t sum = 0;
            for (uint32_t l = 0; l < 16; l++)
                sum = (int16_t)(sum + q[16 * s + l]);
            memcpy(blk + 260 + 2 * s, &sum, sizeof sum);
        }
    }
}
