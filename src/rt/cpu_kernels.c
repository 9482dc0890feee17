/*
 * Portable cpu kernels (plain C) and the dtype helpers every kernel
 * variant shares: row dequantisation and single-value reads.
 *
 * The portable kernels keep eight partial sums per dot product, in a
 * fixed order, so that the compiler may vectorise them without changing
 * results; they serve processors without AVX2 and are checked against the
 * reference like the vectorised ones.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

bool px__rt_dtype_supported(px_dtype t)
{
    return t == PX_DTYPE_F32 || t == PX_DTYPE_F16 || t == PX_DTYPE_BF16 || t == PX_DTYPE_Q8_0 ||
           px__rt_quant_handles(t);
}

static inline uint16_t load_u16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

void px__rt_dequant_row(px_dtype t, const void *row, float *dst, uint32_t k)
{
    switch (t) {
    case PX_DTYPE_F32:
        memcpy(dst, row, (size_t)k * sizeof(float));
        break;
    case PX_DTYPE_F16: {
        const uint8_t *p = row;
        for (uint32_t i = 0; i < k; i++)
            dst[i] = px__rt_f16(load_u16(p + 2 * (size_t)i));
        break;
    }
    case PX_DTYPE_BF16: {
        const uint8_t *p = row;
        for (uint32_t i = 0; i < k; i++)
            dst[i] = px__rt_bf16(load_u16(p + 2 * (size_t)i));
        break;
    }
    case PX_DTYPE_Q8_0: {
        const uint8_t *blk = row;
        for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++, blk += PX__RT_Q8_0_BYTES) {
            float d = px__rt_f16(load_u16(blk));
            const int8_t *q = (const int8_t *)(blk + 2);
            for (uint32_t j = 0; j < PX__RT_Q8_0_ELEMS; j++)
                dst[b * PX__RT_Q8_0_ELEMS + j] = d * (float)q[j];
        }
        break;
    }
    default:
        PX_ASSERT(px__rt_quant_handles(t));
        px__rt_quant_dequant_row(t, row, dst, k);
    }
}

double px__rt_weight_at(px_dtype t, const void *row, uint32_t i)
{
    const uint8_t *p = row;
    switch (t) {
    case PX_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * (size_t)i, sizeof f);
        return f;
    }
    case PX_DTYPE_F16:
        return px__rt_f16(load_u16(p + 2 * (size_t)i));
    case PX_DTYPE_BF16:
        return px__rt_bf16(load_u16(p + 2 * (size_t)i));
    case PX_DTYPE_Q8_0: {
        const uint8_t *blk = p + (size_t)(i / PX__RT_Q8_0_ELEMS) * PX__RT_Q8_0_BYTES;
        /* The scale is an f16; the product is exact in double. */
        return (double)px__rt_f16(load_u16(blk)) *
               (double)((const int8_t *)(blk + 2))[i % PX__RT_Q8_0_ELEMS];
    }
    default:
        PX_ASSERT(px__rt_quant_handles(t));
        return px__rt_quant_value_at(t, row, i);
    }
}

/* ------------------------------------------------------------------ */
/* Portable variant                                                    */
/* ------------------------------------------------------------------ */

static inline float lanes_sum(const float a[8])
{
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static float dot_f32(const float *a, const float *b, uint32_t n)
{
    float acc[8] = {0};
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[j + l] * b[j + l];
    float s = lanes_sum(acc);
    for (; j < n; j++)
        s += a[j] * b[j];
    return s;
}

static void axpy_f32(float a, const float *x, float *y, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        y[j] += a * x[j];
}

static void attn_scores(const float *q, const float *base, size_t stride, const uint32_t *rows,
                        size_t n, uint32_t hd, float scale, float *out)
{
    for (size_t p = 0; p < n; p++)
        out[p] = dot_f32(q, base + (size_t)rows[p] * stride, hd) * scale;
}

static void attn_values(const float *w, const float *base, size_t stride, const uint32_t *rows,
                        size_t n, uint32_t hd, float *out)
{
    for (size_t p = 0; p < n; p++)
        axpy_f32(w[p], base + (size_t)rows[p] * stride, out, hd);
}

/* The one-head kernels head by head: the same bits by definition.  Each
 * row is still read once per head, but from the first-level cache. */
static void attn_scores_group(const float *q, uint32_t n_q, const float *base, size_t stride,
                              const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out,
                              size_t ld)
{
    for (uint32_t g = 0; g < n_q; g++)
        attn_scores(q + (size_t)g * hd, base, stride, rows, n, hd, scale, out + (size_t)g * ld);
}

static void attn_values_group(const float *w, size_t ld, uint32_t n_q, const float *base,
                              size_t stride, const uint32_t *rows, size_t n, uint32_t hd,
                              float *out)
{
    for (uint32_t g = 0; g < n_q; g++) {
        float *o = out + (size_t)g * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        attn_values(w + (size_t)g * ld, base, stride, rows, n, hd, o);
    }
}

/* Cephes' expf constants: ln 2 split in two so that n * ln2_hi is exact,
 * and the polynomial of exp(r) - 1 - r over r^2. */
#define EXP_LOG2E  1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_ROUND  12582912.0f /* 1.5 x 2^23: adding it rounds to a whole number */
#define EXP_MIN    -87.0f

static inline float exp_one(float x)
{
    x = x < EXP_MIN ? EXP_MIN : x;
    float t = x * EXP_LOG2E + EXP_ROUND;
    float k = t - EXP_ROUND;
    float r = x - k * EXP_LN2_HI;
    r = r - k * EXP_LN2_LO;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    /* 2^k from the rounded sum's low bits (k in [-126, 0]). */
    int32_t tb, rb;
    memcpy(&tb, &t, sizeof tb);
    float round = EXP_ROUND;
    memcpy(&rb, &round, sizeof rb);
    uint32_t bits = (uint32_t)(tb - rb + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

float px__rt_exp_sum_ref(float *x, size_t n, float max)
{
    float acc[8] = {0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            x[j + l] = exp_one(x[j + l] - max);
            acc[l] += x[j + l];
        }
    float s = lanes_sum(acc);
    for (; j < n; j++) {
        x[j] = exp_one(x[j] - max);
        s += x[j];
    }
    return s;
}

/* Dot of one weight row with x; the row is converted 8 values at a time
 * into a small buffer, so every dtype shares dot_f32's order. */
static float dot_row(px_dtype t, const uint8_t *w, uint32_t k, const float *x)
{
    if (t == PX_DTYPE_F32)
        return dot_f32((const float *)(const void *)w, x, k);
    float acc[8] = {0}, tmp[8];
    uint32_t j = 0;
    for (; j + 8 <= k; j += 8) {
        px__rt_dequant_row(t, w + 2 * (size_t)j, tmp, 8);
        for (int l = 0; l < 8; l++)
            acc[l] += tmp[l] * x[j + l];
    }
    float s = lanes_sum(acc);
    for (; j < k; j++) {
        px__rt_dequant_row(t, w + 2 * (size_t)j, tmp, 1);
        s += tmp[0] * x[j];
    }
    return s;
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
    for (uint32_t i = i0; i < i1; i++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)i * row_bytes;
        for (uint32_t r = 0; r < n_x; r++)
            y[r * ldy + i] = dot_row(t, row, k, x + r * ldx);
    }
}

void px__rt_quantize_q8_act_ref(const float *x, uint32_t k, int8_t *q, float *d)
{
    for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++) {
        const float *xb = x + (size_t)b * PX__RT_Q8_0_ELEMS;
        int8_t *qb = q + (size_t)b * PX__RT_Q8_0_ELEMS;
        float amax = 0;
        bool nan = false;
        for (uint32_t j = 0; j < PX__RT_Q8_0_ELEMS; j++) {
            float a = fabsf(xb[j]);
            if (a > amax)
                amax = a;
            else if (a != a)
                nan = true;
        }
        float id = amax > 0 && !nan ? 127.0f / amax : 0.0f;
        d[b] = nan ? NAN : amax / 127.0f;
        for (uint32_t j = 0; j < PX__RT_Q8_0_ELEMS; j++) {
            float v = xb[j] * id;
            /* |v| <= 127 but for the rounding of id; an infinite block
             * (id 0) gives 0 * inf = NaN here: 0, and d = inf makes the
             * products NaN. */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
            qb[j] = (int8_t)lrintf(v);
        }
    }
}

void px__rt_quantize_q8_act(const float *x, uint32_t k, int8_t *q, float *d)
{
    px__rt_kernels_native()->quant_q8_0(x, k, q, d);
}

float px__rt_dot_q8_0(const uint8_t *w, const int8_t *xq, const float *xd, uint32_t k)
{
    float acc[16] = {0};
    for (uint32_t b = 0; b < k / PX__RT_Q8_0_ELEMS; b++) {
        const uint8_t *blk = w + (size_t)b * PX__RT_Q8_0_BYTES;
        const int8_t *q = (const int8_t *)(blk + 2), *xb = xq + (size_t)b * PX__RT_Q8_0_ELEMS;
        float scale = px__rt_f16(load_u16(blk)) * xd[b];
        float *a = acc + (b % 2) * 8;
        for (int l = 0; l < 8; l++) {
            int32_t sum = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++)
                sum += (int32_t)q[j] * (int32_t)xb[j];
            float p = scale * (float)sum;
            a[l] += p;
        }
    }
    float h[8];
    for (int l = 0; l < 8; l++)
        h[l] = acc[l] + acc[l + 8];
    return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
}

static void matmul_q8_0(const void *w, size_t row_bytes, uint32_t k, uint32_t i0, uint32_t i1,
                        const int8_t *xq, const float *xd, uint32_t n_x, float *y, size_t ldy)
{
    uint32_t nb = k / PX__RT_Q8_0_ELEMS;
    for (uint32_t i = i0; i < i1; i++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)i * row_bytes;
        for (uint32_t r = 0; r < n_x; r++)
            y[r * ldy + i] = px__rt_dot_q8_0(row, xq + (size_t)r * k, xd + (size_t)r * nb, k);
    }
}

static void matmul_quant(px_dtype t, const void *w, size_t row_bytes, uint32_t k, uint32_t i0,
                         uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                         size_t ldy)
{
    px__rt_quant_gemm(px__rt_quant_dotn_portable, t, w, row_bytes, k, i0, i1, xq, ldxq, n_x, y,
                      ldy);
}

const px__rt_kernels px__rt_kernels_portable = {
    .name = "portable",
    .matmul = matmul,
    .matmul_q8_0 = matmul_q8_0,
    .quant_q8_0 = px__rt_quantize_q8_act_ref,
    .matmul_quant = matmul_quant,
    .quant_act = px__rt_quant_act,
    .dequant = px__rt_dequant_row,
    .dot_f32 = dot_f32,
    .axpy_f32 = axpy_f32,
    .attn_scores = attn_scores,
    .attn_values = attn_values,
    .exp_sum = px__rt_exp_sum_ref,
    .attn_scores_group = attn_scores_group,
    .attn_values_group = attn_values_group,
};

const px__rt_kernels *px__rt_kernels_native(void)
{
    const px__rt_kernels *k = px__rt_kernels_avx512();
    if (!k)
        k = px__rt_kernels_avx2();
    return k ? k : &px__rt_kernels_portable;
}

#if !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
const px__rt_kernels *px__rt_kernels_avx2(void)
{
    return NULL;
}

const px__rt_kernels *px__rt_kernels_avx512(void)
{
    return NULL;
}
#endif
