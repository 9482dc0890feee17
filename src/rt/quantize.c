/*
 * Weight quantizers: Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K blocks made the
 * way ggml's reference quantizer makes them without an importance matrix
 * (the procedure llama.cpp's quantize tool runs by default), so that a
 * file quantized here carries the same blocks as one quantized there.
 *
 * The k-quants search their scales: Q6_K fits one signed scale per 16
 * values by least squares over 19 candidate scalings (weights x^2), then
 * quantizes the scales to 8 bits; Q4_K and Q5_K fit a scale and a min per
 * 32 values over 21 (16) candidate ranges, each value weighted by
 * |x| + rms of its group, then quantize scales and mins to 6 bits.
 */
#include "base/common.h"

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#define GROUP_MAX_EPS 1e-15f

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = px_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *p)
{
    return px__rt_f16((uint16_t)(p[0] | p[1] << 8));
}

/* The value of largest magnitude (the first of equals) and its
 * magnitude. */
static float signed_max(const float *x, uint32_t n, float *amax_out)
{
    float amax = 0, max = 0;
    for (uint32_t j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    *amax_out = amax;
    return max;
}

static void q8_0_block(const float *x, uint8_t *out)
{
    float amax;
    signed_max(x, 32, &amax);
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (uint32_t j = 0; j < 32; j++)
        out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Q4_0 and Q5_0: the value of largest magnitude maps to -8 (-16); values
 * round half up after the offset and clip at 15 (31). */
static void q4_0_block(const float *x, uint8_t *out)
{
    float amax, max = signed_max(x, 32, &amax);
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (uint32_t j = 0; j < 16; j++) {
        int lo = PX_MIN(15, (int)(int8_t)(x[j] * id + 8.5f));
        int hi = PX_MIN(15, (int)(int8_t)(x[j + 16] * id + 8.5f));
        out[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

static void q5_0_block(const float *x, uint8_t *out)
{
    float amax, max = signed_max(x, 32, &amax);
    float d = max / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    put_f16(out, d);
    for (uint32_t j = 0; j < 16; j++) {
        int lo = PX_MIN(31, (int)(int8_t)(x[j] * id + 16.5f));
        int hi = PX_MIN(31, (int)(int8_t)(x[j + 16] * id + 16.5f));
        out[6 + j] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
        qh |= (uint32_t)((lo >> 4) & 1) << j;
        qh |= (uint32_t)((hi >> 4) & 1) << (j + 16);
    }
    for (uint32_t i = 0; i < 4; i++)
        out[2 + i] = (uint8_t)(qh >> (8 * i));
}

/* Signed levels L[i] in [0, 2*nmax) for n values with one scale (returned)
 * so that x ~ scale * (L - nmax): the least-squares scale, weighted by x^2,
 * of the best of 19 candidate scalings around nmax / max. */
static float fit_signed(uint32_t n, int nmax, const float *x, int8_t *L)
{
    float amax, max = signed_max(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, n);
        return 0;
    }
    float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (uint32_t i = 0; i < n; i++) {
        int l = PX_MAX(-nmax, PX_MIN(nmax - 1, px__rt_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (uint32_t i = 0; i < n; i++) {
            int l = PX_MAX(-nmax, PX_MIN(nmax - 1, px__rt_nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (uint32_t i = 0; i < n; i++) {
                int l = PX_MAX(-nmax, PX_MIN(nmax - 1, px__rt_nearest_int(iscale * x[i])));
                L[i] = (int8_t)(l + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Unsigned levels L[i] in [0, nmax] for n values with a scale (returned)
 * and a min (*the_min, as a positive offset) so that
 * x ~ scale * L - the_min: weighted least squares over nstep + 1
 * candidate ranges (rmin + rdelta * is + nmax) / (max - min), keeping the
 * first with the smallest weighted squared error. */
static float fit_min(uint32_t n, int nmax, const float *x, const float *weights, uint8_t *L,
                     float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (uint32_t i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, n);
        *the_min = -min;
        return 0;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (uint32_t i = 0; i < n; i++) {
        int l = px__rt_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)PX_MAX(0, PX_MIN(nmax, l));
        float diff = scale * (float)L[i] + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (uint32_t i = 0; i < n; i++) {
            int l = PX_MAX(0, PX_MIN(nmax, px__rt_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (uint32_t i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

static void q6_k_block(const float *x, uint8_t *out)
{
    int8_t L[256];
    float scales[16], max_scale = 0, max_abs = 0;
    for (uint32_t ib = 0; ib < 16; ib++) {
        scales[ib] = fit_signed(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs) {
            max_abs = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    memset(out, 0, 210);
    if (max_abs < GROUP_MAX_EPS)
        return; /* all zero, d = 0 */
    int8_t *sc = (int8_t *)(out + 192);
    float iscale = -128.0f / max_scale;
    put_f16(out + 208, 1 / iscale);
    for (uint32_t ib = 0; ib < 16; ib++)
        sc[ib] = (int8_t)PX_MIN(127, px__rt_nearest_int(iscale * scales[ib]));
    for (uint32_t j = 0; j < 16; j++) {
        float d = get_f16(out + 208) * (float)sc[j];
        if (d == 0)
            continue;
        for (uint32_t i = 0; i < 16; i++) {
            int l = px__rt_nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)(PX_MAX(-32, PX_MIN(31, l)) + 32);
        }
    }
    /* The layout of quant.c: per half, low nibbles in ql, two high bits
     * in qh. */
    uint8_t *ql = out, *qh = out + 128;
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t l = 0; l < 32; l++) {
            const int8_t *v = L + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((v[0] & 0xF) | (v[64] & 0xF) << 4);
            ql[64 * h + l + 32] = (uint8_t)((v[32] & 0xF) | (v[96] & 0xF) << 4);
            qh[32 * h + l] =
                (uint8_t)((v[0] >> 4) | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
        }
}

/* Q4_K (nmax 15) and Q5_K (nmax 31). */
static void qk_min_block(px_dtype t, const float *x, uint8_t *out)
{
    bool five = t == PX_DTYPE_Q5_K;
    int nmax = five ? 31 : 15;
    uint8_t L[256], Laux[32];
    float weights[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    for (uint32_t j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float sum_x2 = 0;
        for (uint32_t l = 0; l < 32; l++)
            sum_x2 += xj[l] * xj[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (uint32_t l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(xj[l]);
        scales[j] = fit_min(32, nmax, xj, weights, L + 32 * j, &mins[j], Laux, five ? -0.5f : -1.0f,
                            0.1f, five ? 15 : 20);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    memset(out, 0, five ? 176 : 144);
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *s = out + 4;
    for (uint32_t j = 0; j < 8; j++) {
        int ls = PX_MIN(63, (uint8_t)px__rt_nearest_int(inv_scale * scales[j]));
        int lm = PX_MIN(63, (uint8_t)px__rt_nearest_int(inv_min * mins[j]));
        if (j < 4) {
            s[j] = (uint8_t)ls;
            s[j + 4] = (uint8_t)lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    put_f16(out, max_scale / 63.0f);
    put_f16(out + 2, max_min / 63.0f);
    px__rt_qblock b;
    px__rt_quant_scales(t, out, &b);
    for (uint32_t j = 0; j < 8; j++) {
        float d = b.d * (float)b.sc[2 * j];
        if (d == 0)
            continue;
        float dm = b.dmin * (float)b.m[2 * j];
        for (uint32_t i = 0; i < 32; i++) {
            int l = px__rt_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)PX_MAX(0, PX_MIN(nmax, l));
        }
    }
    uint8_t *qh = out + 16, *qs = out + (five ? 48 : 16);
    for (uint32_t g = 0; g < 4; g++)
        for (uint32_t l = 0; l < 32; l++) {
            int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
            if (five) {
                qh[l] |= (uint8_t)(((lo >> 4) & 1) << (2 * g) | ((hi >> 4) & 1) << (2 * g + 1));
                lo &= 0xF;
                hi &= 0xF;
            }
            qs[32 * g + l] = (uint8_t)(lo | hi << 4);
        }
}

bool px__rt_quantize_supports(px_dtype t)
{
    return t == PX_DTYPE_Q8_0 || t == PX_DTYPE_Q4_0 || t == PX_DTYPE_Q5_0 || t == PX_DTYPE_Q4_K ||
           t == PX_DTYPE_Q5_K || t == PX_DTYPE_Q6_K;
}

void px__rt_quantize_row(px_dtype t, const float *x, uint8_t *out, uint64_t n)
{
    uint64_t be = px_dtype_block_elems(t), bb = px_dtype_block_bytes(t);
    for (uint64_t b = 0; b < n / be; b++, x += be, out += bb) {
        switch (t) {
        case PX_DTYPE_Q8_0:
            q8_0_block(x, out);
            break;
        case PX_DTYPE_Q4_0:
            q4_0_block(x, out);
            break;
        case PX_DTYPE_Q5_0:
            q5_0_block(x, out);
            break;
        case PX_DTYPE_Q4_K:
        case PX_DTYPE_Q5_K:
            qk_min_block(t, x, out);
            break;
        case PX_DTYPE_Q6_K:
            q6_k_block(x, out);
            break;
        default:
            PX_ASSERT(!"px__rt_quantize_supports checked");
        }
    }
}
