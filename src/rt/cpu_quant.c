/*
 * Dot products of block-quantized weights with quantized activations: the
 * portable definition of their results, and the matrix-vector driver that
 * quantizes activation rows and runs either variant.
 *
 * The results, exactly (cpu_quant_x86.c reproduces them bit for bit):
 *
 * - Q4_0, Q5_0 against Q8_0 activations: eight float lanes; for each
 *   block, lane l adds p_l * (d_w * d_x), where p_l is the exact integer
 *   sum of the products of values 4l..4l+3; the lanes then add as
 *   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
 * - the k-quants against Q8_K activations: per super-block the exact
 *   integers S = sum over 16-value groups of sc * sum(q * qx) and
 *   M = sum of m * (sum of the group's qx), then
 *   v = (d_x * d) * S - (d_x * dmin) * M (no M term without mins); the
 *   super-blocks add in order from 0.
 * - a row longer than PX__RT_QCHUNK values: the chunks' results add in
 *   order.
 *
 * Each result depends on the weight row and the activation row alone:
 * the same for any thread count, row range or batch.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

static float dot_legacy(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    float lane[8] = {0};
    px__rt_qblock b;
    for (uint32_t i = 0; i < n / PX__RT_QK0; i++) {
        const uint8_t *xb = xq + (size_t)i * PX__RT_Q8_0_ACT_BYTES;
        const int8_t *qx = (const int8_t *)(xb + 2);
        px__rt_quant_unpack(t, w, i, &b);
        float s = b.d * px__rt_f16((uint16_t)(xb[0] | xb[1] << 8));
        for (uint32_t l = 0; l < 8; l++) {
            int32_t p = 0;
            for (uint32_t j = 4 * l; j < 4 * l + 4; j++)
                p += b.q[j] * qx[j];
            lane[l] = lane[l] + (float)p * s;
        }
    }
    return ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
           ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

static float dot_k(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    float acc = 0;
    px__rt_qblock b;
    for (uint32_t i = 0; i < n / PX__RT_QK; i++) {
        const uint8_t *xb = xq + (size_t)i * PX__RT_Q8_K_BYTES;
        const int8_t *qx = (const int8_t *)(xb + 4);
        float dx;
        memcpy(&dx, xb, sizeof dx);
        px__rt_quant_unpack(t, w, i, &b);
        int32_t sumi = 0, summ = 0;
        for (uint32_t s = 0; s < 16; s++) {
            int32_t p = 0;
            for (uint32_t l = 0; l < 16; l++)
                p += b.q[16 * s + l] * qx[16 * s + l];
            sumi += b.sc[s] * p;
            int16_t bsum;
            memcpy(&bsum, xb + 260 + 2 * s, sizeof bsum);
            summ += b.m[s] * bsum;
        }
        float v = (dx * b.d) * (float)sumi;
        if (b.has_min)
            v = v - (dx * b.dmin) * (float)summ;
        acc = acc + v;
    }
    return acc;
}

float px__rt_quant_dot_portable(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n)
{
    if (px__rt_quant_act_dtype(t) == PX_DTYPE_Q8_0)
        return dot_legacy(t, w, xq, n);
    return dot_k(t, w, xq, n);
}

void px__rt_quant_matvec(px__rt_quant_dot_fn dot, px_dtype t, const void *w, size_t row_bytes,
                         uint32_t k, uint32_t i0, uint32_t i1, const float *x, size_t ldx,
                         uint32_t n_x, float *y, size_t ldy)
{
    uint8_t xq[PX_RT_SMALL_BATCH][PX__RT_QCHUNK_BYTES];
    size_t be = px_dtype_block_elems(t), bb = px_dtype_block_bytes(t);
    PX_ASSERT(n_x <= PX_RT_SMALL_BATCH);
    for (uint32_t c0 = 0; c0 < k; c0 += PX__RT_QCHUNK) {
        uint32_t n = PX_MIN(PX__RT_QCHUNK, k - c0);
        for (uint32_t r = 0; r < n_x; r++)
            px__rt_quant_act(t, x + r * ldx + c0, xq[r], n);
        const uint8_t *wc = (const uint8_t *)w + c0 / be * bb;
        for (uint32_t i = i0; i < i1; i++) {
            const uint8_t *row = wc + (size_t)i * row_bytes;
            for (uint32_t r = 0; r < n_x; r++) {
                float v = dot(t, row, xq[r], n);
                float *out = &y[r * ldy + i];
                *out = c0 == 0 ? v : *out + v;
            }
        }
    }
}

void px__rt_quant_matmul(px__rt_quant_dot_fn dot, px_dtype t, const void *w, size_t row_bytes,
                         uint32_t k, uint32_t i0, uint32_t i1, const float *x, size_t ldx,
                         uint32_t n_x, float *y, size_t ldy)
{
    /* Tiles of weight rows (px__rt_tile_rows); each group of activation
     * rows is quantized again per tile, a small cost beside the tile's
     * products. */
    uint32_t tile = px__rt_tile_rows(row_bytes, n_x);
    for (uint32_t b = i0; b < i1; b += PX_MIN(tile, i1 - b))
        for (uint32_t r = 0; r < n_x; r += PX_RT_SMALL_BATCH)
            px__rt_quant_matvec(dot, t, w, row_bytes, k, b, b + PX_MIN(tile, i1 - b),
                                x + (size_t)r * ldx, ldx, PX_MIN(n_x - r, PX_RT_SMALL_BATCH),
                                y + (size_t)r * ldy, ldy);
}
