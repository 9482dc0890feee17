/*
 * Dot products of block-quantized weights with quantized activations: the
 * portable definition of their results, and the matrix-vector driver that
 * quantizes activation rows and runs either variant.
 *
 * The results, exactly (cpu_quant_x86.c reproduces them bit for bit):
 *
 * - Q4_0, Q5_0 against Q8_0 activations: four groups of eight float
 *   lanes; block b adds to group g = b % 4 only: its lane l adds
 *   p_l * (d_w * d_x), where p_l is the exact integer sum of the products
 *   of values 4l..4l+3.  Each lane l then sums its groups as
 *   h_l = (g0 + g2) + (g1 + g3), and the result is
 *   ((h0 + h4) + (h2 + h6)) + ((h1 + h5) + (h3 + h7)).  The four groups
 *   are four independent chains of additions, so that a vector dot is
 *   not bound by one chain's latency.
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
    float lane[PX__RT_Q0_GROUPS][8] = {{0}};
    px__rt_qblock b;
    for (uint32_t i = 0; i < n / PX__RT_QK0; i++) {
        const uint8_t *xb = xq + (size_t)i * PX__RT_Q8_0_ACT_BYTES;
        const int8_t *qx = (const int8_t *)(xb + 2);
        float *g = lane[i % PX__RT_Q0_GROUPS];
        px__rt_quant_unpack(t, w, i, &b);
        float s = b.d * px__rt_f16((uint16_t)(xb[0] | xb[1] << 8));
        for (uint32_t l = 0; l < 8; l++) {
            int32_t p = 0;
            for (uint32_t j = 4 * l; j < 4 * l + 4; j++)
                p += b.q[j] * qx[j];
            g[l] = g[l] + (float)p * s;
        }
    }
    float h[8];
    for (uint32_t l = 0; l < 8; l++)
        h[l] = (lane[0][l] + lane[2][l]) + (lane[1][l] + lane[3][l]);
    return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
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

void px__rt_quant_dotn_loop(px__rt_quant_dot_fn dot, px_dtype t, const uint8_t *w,
                            const uint8_t *xq, size_t ldxq, uint32_t n_x, uint32_t n, float *out)
{
    for (uint32_t r = 0; r < n_x; r++)
        out[r] = dot(t, w, xq + r * ldxq, n);
}

static void dotn_portable(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                          uint32_t n_x, uint32_t n, float *out)
{
    px__rt_quant_dotn_loop(px__rt_quant_dot_portable, t, w, xq, ldxq, n_x, n, out);
}

const px__rt_quant_dotn_fn px__rt_quant_dotn_portable = dotn_portable;

void px__rt_quant_gemm(px__rt_quant_dotn_fn dotn, px_dtype t, const void *w, size_t row_bytes,
                       uint32_t k, uint32_t i0, uint32_t i1, const uint8_t *xq, size_t ldxq,
                       uint32_t n_x, float *y, size_t ldy)
{
    size_t be = px_dtype_block_elems(t), bb = px_dtype_block_bytes(t);
    /* Tiles of weight rows that stay in the second-level cache while
     * every group of activation rows passes over them
     * (px__rt_tile_rows); each weight block is decoded once per group. */
    uint32_t tile = px__rt_tile_rows(row_bytes, n_x);
    for (uint32_t b = i0; b < i1; b += PX_MIN(tile, i1 - b)) {
        uint32_t e = b + PX_MIN(tile, i1 - b);
        for (uint32_t r = 0; r < n_x; r += PX__RT_QDOT_ROWS) {
            uint32_t nr = PX_MIN(n_x - r, PX__RT_QDOT_ROWS);
            for (uint32_t c0 = 0; c0 < k; c0 += PX__RT_QCHUNK) {
                uint32_t n = PX_MIN(PX__RT_QCHUNK, k - c0);
                const uint8_t *wc = (const uint8_t *)w + c0 / be * bb;
                const uint8_t *xc = xq + r * ldxq + px__rt_quant_act_bytes(t, c0);
                float *yr = y + (size_t)r * ldy;
                for (uint32_t i = b; i < e; i++) {
                    float v[PX__RT_QDOT_ROWS];
                    dotn(t, wc + (size_t)i * row_bytes, xc, ldxq, nr, n, v);
                    for (uint32_t q = 0; q < nr; q++)
                        yr[q * ldy + i] = c0 == 0 ? v[q] : yr[q * ldy + i] + v[q];
                }
            }
        }
    }
}

void px__rt_quant_matmul(px__rt_quant_gemm_fn gemm, px_dtype t, const void *w, size_t row_bytes,
                         uint32_t k, uint32_t i0, uint32_t i1, const float *x, size_t ldx,
                         uint32_t n_x, float *y, size_t ldy)
{
    /* Every activation row quantized once, then the products: on the
     * stack for a few short rows, else on the heap. */
    size_t ab = px__rt_quant_act_bytes(t, k);
    uint8_t stack[PX__RT_QDOT_ROWS * PX__RT_QCHUNK_BYTES];
    uint8_t *xq = ab * n_x <= sizeof stack ? stack : malloc(ab * n_x);
    PX_ASSERT(xq);
    for (uint32_t r = 0; r < n_x; r++)
        px__rt_quant_act(t, x + (size_t)r * ldx, xq + r * ab, k);
    gemm(t, w, row_bytes, k, i0, i1, xq, ab, n_x, y, ldy);
    if (xq != stack)
        free(xq);
}
