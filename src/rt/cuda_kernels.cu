/*
 * The cuda backend's kernels: embedding, RMS norm, matrix-vector products
 * over every weight format (dequantised on the fly from ggml's block
 * layouts, as quant.c decodes them), weight tiles converted to f32 for
 * cuBLAS, RoPE, attention over the paged KV cache with a running-max
 * softmax, SwiGLU and residual adds.  Activations are f32; sums are f32.
 *
 * Every launcher returns cudaGetLastError() after queueing, so that a bad
 * launch is reported where it happened.  Nothing here allocates.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "rt/cuda_impl.h"

#define WARP 32

/* ------------------------------------------------------------------ */
/* Weight decoding (quant.c's layouts)                                 */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ float f16_at(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float bf16_bits(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Values per block and bytes per block of a format (1 and the element
 * size for f32, f16, bf16). */
__device__ __host__ __forceinline__ uint32_t block_elems(px__cuda_dtype t)
{
    switch (t) {
    case PX__CUDA_F32:
    case PX__CUDA_F16:
    case PX__CUDA_BF16:
        return 1;
    case PX__CUDA_Q8_0:
    case PX__CUDA_Q4_0:
    case PX__CUDA_Q5_0:
        return 32;
    default:
        return 256;
    }
}

__device__ __host__ __forceinline__ uint32_t block_bytes(px__cuda_dtype t)
{
    switch (t) {
    case PX__CUDA_F32:
        return 4;
    case PX__CUDA_F16:
    case PX__CUDA_BF16:
        return 2;
    case PX__CUDA_Q8_0:
        return 34;
    case PX__CUDA_Q4_0:
        return 18;
    case PX__CUDA_Q5_0:
        return 22;
    case PX__CUDA_Q2_K:
        return 84;
    case PX__CUDA_Q3_K:
        return 110;
    case PX__CUDA_Q4_K:
        return 144;
    case PX__CUDA_Q5_K:
        return 176;
    default: /* Q6_K */
        return 210;
    }
}

/* Scale and min j (of 8) of a q4_k/q5_k super-block (quant.c). */
__device__ __forceinline__ void scale_min_k4(uint32_t j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

__device__ __forceinline__ int scale_q3_k(uint32_t i, const uint8_t *s)
{
    uint32_t lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
    uint32_t hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (int)(lo | (hi << 4)) - 32;
}

/* The 32 values of chunk c (values 32c..32c+31) of a weight row in a
 * block format, as quant.c's dequantisation computes them:
 * (d * sc) * q - (dmin * m) per group of 16. */
__device__ __forceinline__ void decode32(px__cuda_dtype t, const uint8_t *row, uint32_t c,
                                         float *w)
{
    if (block_elems(t) == 32) {
        const uint8_t *blk = row + (size_t)c * block_bytes(t);
        float d = f16_at(blk);
        if (t == PX__CUDA_Q8_0) {
            const int8_t *q = (const int8_t *)(blk + 2);
#pragma unroll
            for (int l = 0; l < 32; l++)
                w[l] = d * (float)q[l];
        } else if (t == PX__CUDA_Q4_0) {
            const uint8_t *qs = blk + 2;
#pragma unroll
            for (int l = 0; l < 16; l++) {
                w[l] = d * (float)((qs[l] & 0xF) - 8);
                w[l + 16] = d * (float)((qs[l] >> 4) - 8);
            }
        } else { /* Q5_0 */
            uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 |
                          (uint32_t)blk[5] << 24;
            const uint8_t *qs = blk + 6;
#pragma unroll
            for (int l = 0; l < 16; l++) {
                uint32_t h0 = (qh >> l) & 1, h1 = (qh >> (l + 16)) & 1;
                w[l] = d * (float)((int)((qs[l] & 0xF) | (h0 << 4)) - 16);
                w[l + 16] = d * (float)((int)((qs[l] >> 4) | (h1 << 4)) - 16);
            }
        }
        return;
    }
    const uint8_t *blk = row + (size_t)(c / 8) * block_bytes(t);
    uint32_t sub = c % 8, v0 = 32 * sub;
    float dl[2], ml[2] = {0, 0};
    int q[32];
    switch (t) {
    case PX__CUDA_Q2_K: {
        float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
        for (int g = 0; g < 2; g++) {
            uint8_t s = blk[2 * sub + g];
            dl[g] = __fmul_rn(d, (float)(s & 0xF));
            ml[g] = __fmul_rn(dmin, (float)(s >> 4));
        }
        /* Value 128n + 32j + l: bits 2j of qs[32n + l]. */
        uint32_t n = v0 / 128, j = (v0 % 128) / 32;
        const uint8_t *qs = blk + 16 + 32 * n;
#pragma unroll
        for (int l = 0; l < 32; l++)
            q[l] = (qs[l] >> (2 * j)) & 3;
        break;
    }
    case PX__CUDA_Q3_K: {
        float d = f16_at(blk + 108);
        for (int g = 0; g < 2; g++)
            dl[g] = __fmul_rn(d, (float)scale_q3_k(2 * sub + g, blk + 96));
        uint32_t n = v0 / 128, j = (v0 % 128) / 32;
        const uint8_t *hm = blk, *qs = blk + 32 + 32 * n;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int lo = (qs[l] >> (2 * j)) & 3;
            int high = (hm[l] >> (4 * n + j)) & 1;
            q[l] = lo - (high ? 0 : 4);
        }
        break;
    }
    case PX__CUDA_Q4_K:
    case PX__CUDA_Q5_K: {
        bool five = t == PX__CUDA_Q5_K;
        float d = f16_at(blk), dmin = f16_at(blk + 2);
        int sc, m;
        scale_min_k4(sub, blk + 4, &sc, &m);
        dl[0] = dl[1] = __fmul_rn(d, (float)sc);
        ml[0] = ml[1] = __fmul_rn(dmin, (float)m);
        /* Value 64g + 32h + l: nibble h of qs[32g + l] (+16 from bit
         * 2g + h of qh[l] for q5_k). */
        uint32_t g = sub / 2, h = sub % 2;
        const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16) + 32 * g;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = h ? qs[l] >> 4 : qs[l] & 0xF;
            if (five)
                v += ((qh[l] >> (2 * g + h)) & 1) << 4;
            q[l] = v;
        }
        break;
    }
    default: { /* Q6_K */
        float d = f16_at(blk + 208);
        const int8_t *scales = (const int8_t *)(blk + 192);
        dl[0] = __fmul_rn(d, (float)scales[2 * sub]);
        dl[1] = __fmul_rn(d, (float)scales[2 * sub + 1]);
        /* Value 128n + 32i + l: low four bits from ql[64n + l + 32(i&1)]
         * (high nibble for i >= 2), high two from bits 2i of qh[32n + l]. */
        uint32_t n = v0 / 128, i = (v0 % 128) / 32;
        const uint8_t *ql = blk + 64 * n + 32 * (i & 1), *qh = blk + 128 + 32 * n;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int lo = i < 2 ? ql[l] & 0xF : ql[l] >> 4;
            int hi = (qh[l] >> (2 * i)) & 3;
            q[l] = (lo | (hi << 4)) - 32;
        }
        break;
    }
    }
    /* Separate roundings, never fused: the values are quant.c's. */
    bool has_min = t == PX__CUDA_Q2_K || t == PX__CUDA_Q4_K || t == PX__CUDA_Q5_K;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        float v = __fmul_rn(dl[l / 16], (float)q[l]);
        w[l] = has_min ? __fsub_rn(v, ml[l / 16]) : v;
    }
}

/* Value j of a row of a float format. */
/* A 16-bit value of an f16 or bf16 row as a float. */
__device__ __forceinline__ float half_value(px__cuda_dtype t, uint16_t h)
{
    return t == PX__CUDA_F16 ? __half2float(__ushort_as_half(h)) : bf16_bits(h);
}

__device__ __forceinline__ float float_at(px__cuda_dtype t, const uint8_t *row, uint32_t j)
{
    if (t == PX__CUDA_F32)
        return ((const float *)row)[j];
    return half_value(t, ((const uint16_t *)row)[j]);
}

/* ------------------------------------------------------------------ */
/* Reductions                                                          */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block; every thread gets it.  red holds one value
 * per warp; blockDim.x is a multiple of 32. */
__device__ float block_reduce(float v, float *red, bool is_max)
{
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0)
        red[wid] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
    r = is_max ? warp_max(r) : warp_sum(r);
    return r;
}

static int launch_status(void)
{
    return (int)cudaGetLastError();
}

static unsigned blocks_for(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* ------------------------------------------------------------------ */
/* Embedding and conversions                                           */
/* ------------------------------------------------------------------ */

/* One thread per value of a row (float formats) or per 32-value chunk. */
__global__ void k_rows_to_f32(px__cuda_dtype t, const uint8_t *base, size_t row_bytes,
                              const int32_t *ids, uint32_t row0, uint32_t k, uint32_t n_rows,
                              float *dst)
{
    uint32_t r = blockIdx.y;
    if (r >= n_rows)
        return;
    size_t src_row = ids ? (size_t)ids[r] : (size_t)row0 + r;
    const uint8_t *row = base + src_row * row_bytes;
    float *y = dst + (size_t)r * k;
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (block_elems(t) == 1) {
        if (i < k)
            y[i] = float_at(t, row, i);
        return;
    }
    if (i >= k / 32)
        return;
    float w[32];
    decode32(t, row, i, w);
#pragma unroll
    for (int l = 0; l < 32; l++)
        y[32 * i + l] = w[l];
}

static int rows_to_f32(void *stream, px__cuda_dtype t, const void *base, size_t row_bytes,
                       const int32_t *ids, uint32_t row0, uint32_t k, uint32_t n, float *dst)
{
    if (n == 0)
        return 0;
    unsigned threads = 128;
    size_t items = block_elems(t) == 1 ? k : k / 32;
    dim3 grid(blocks_for(items, threads), n);
    k_rows_to_f32<<<grid, threads, 0, (cudaStream_t)stream>>>(t, (const uint8_t *)base, row_bytes,
                                                              ids, row0, k, n, dst);
    return launch_status();
}

extern "C" int px__cuda_embedding(void *stream, px__cuda_dtype t, const void *tab,
                                  size_t row_bytes, uint32_t dim, const int32_t *ids,
                                  uint32_t rows, float *y)
{
    return rows_to_f32(stream, t, tab, row_bytes, ids, 0, dim, rows, y);
}

extern "C" int px__cuda_dequant(void *stream, px__cuda_dtype t, const void *w, size_t row_bytes,
                                uint32_t k, uint32_t row0, uint32_t n, float *dst)
{
    return rows_to_f32(stream, t, w, row_bytes, NULL, row0, k, n, dst);
}

__global__ void k_gather(const float *x, const uint32_t *select, uint32_t n, uint32_t k,
                         float *dst)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * k)
        dst[i] = x[(size_t)select[i / k] * k + i % k];
}

extern "C" int px__cuda_gather(void *stream, const float *x, const uint32_t *select, uint32_t n,
                               uint32_t k, float *dst)
{
    size_t total = (size_t)n * k;
    if (total == 0)
        return 0;
    k_gather<<<blocks_for(total, 256), 256, 0, (cudaStream_t)stream>>>(x, select, n, k, dst);
    return launch_status();
}

__global__ void k_add_bias(float *y, const float *b, uint32_t rows, uint32_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * n)
        y[i] += b[i % n];
}

extern "C" int px__cuda_add_bias(void *stream, float *y, const float *b, uint32_t rows,
                                 uint32_t n)
{
    size_t total = (size_t)rows * n;
    if (total == 0)
        return 0;
    k_add_bias<<<blocks_for(total, 256), 256, 0, (cudaStream_t)stream>>>(y, b, rows, n);
    return launch_status();
}

/* ------------------------------------------------------------------ */
/* RMS norm                                                            */
/* ------------------------------------------------------------------ */

__global__ void k_rmsnorm(const float *x, const float *w, const uint32_t *select, uint32_t n,
                          float eps, float *y)
{
    __shared__ float red[32];
    uint32_t r = blockIdx.x;
    const float *xr = x + (size_t)(select ? select[r] : r) * n;
    float ss = 0;
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x)
        ss += xr[j] * xr[j];
    ss = block_reduce(ss, red, false);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    float *yr = y + (size_t)r * n;
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = w[j] * (scale * xr[j]);
}

extern "C" int px__cuda_rmsnorm(void *stream, const float *x, const float *w,
                                const uint32_t *select, uint32_t rows, uint32_t n, float eps,
                                float *y)
{
    if (rows == 0)
        return 0;
    k_rmsnorm<<<rows, 256, 0, (cudaStream_t)stream>>>(x, w, select, n, eps, y);
    return launch_status();
}

/* ------------------------------------------------------------------ */
/* Matrix-vector products                                              */
/* ------------------------------------------------------------------ */

#define MV_WARPS 4

/* One warp per weight row; each lane walks the row (values for float
 * formats, 32-value chunks for blocks) against every activation row, so
 * the weights are read once for up to PX__CUDA_MV_MAX_ROWS rows. */
template <int NX>
__global__ void k_matvec(px__cuda_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,
                         uint32_t n_out, const float *x, const uint32_t *select, uint32_t n_x,
                         const float *bias, float *y, bool vec)
{
    uint32_t i = blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    uint32_t lane = threadIdx.x % WARP;
    if (i >= n_out)
        return;
    const uint8_t *row = w + (size_t)i * row_bytes;
    const float *xr[NX];
#pragma unroll
    for (int r = 0; r < NX; r++)
        xr[r] = x + (size_t)(r < (int)n_x ? (select ? select[r] : (uint32_t)r) : 0) * k;
    float acc[NX];
#pragma unroll
    for (int r = 0; r < NX; r++)
        acc[r] = 0;
    if (block_elems(t) == 1 && vec) {
        /* Eight values a lane per load (16 or 32 bytes), so that a warp
         * has more of a row in flight than 64 or 128 bytes. */
        for (uint32_t c = lane; c < k / 8; c += WARP) {
            float wv[8];
            if (t == PX__CUDA_F32) {
                const float4 *p = (const float4 *)(row + 32 * (size_t)c);
                float4 a = p[0], b = p[1];
                wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w;
                wv[4] = b.x, wv[5] = b.y, wv[6] = b.z, wv[7] = b.w;
            } else {
                uint4 u = *(const uint4 *)(row + 16 * (size_t)c);
                uint32_t hw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    wv[2 * e] = half_value(t, (uint16_t)(hw[e] & 0xffffu));
                    wv[2 * e + 1] = half_value(t, (uint16_t)(hw[e] >> 16));
                }
            }
#pragma unroll
            for (int r = 0; r < NX; r++) {
                const float4 *xv = (const float4 *)(xr[r] + 8 * (size_t)c);
                float4 a = xv[0], b = xv[1];
                acc[r] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x +
                          wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
            }
        }
    } else if (block_elems(t) == 1) {
        for (uint32_t j = lane; j < k; j += WARP) {
            float wv = float_at(t, row, j);
#pragma unroll
            for (int r = 0; r < NX; r++)
                acc[r] += wv * xr[r][j];
        }
    } else {
        float wv[32];
        for (uint32_t c = lane; c < k / 32; c += WARP) {
            decode32(t, row, c, wv);
#pragma unroll
            for (int r = 0; r < NX; r++) {
                const float4 *xv = (const float4 *)(xr[r] + 32 * c);
                float s = 0;
#pragma unroll
                for (int l = 0; l < 8; l++) {
                    float4 a = xv[l];
                    s += wv[4 * l] * a.x + wv[4 * l + 1] * a.y + wv[4 * l + 2] * a.z +
                         wv[4 * l + 3] * a.w;
                }
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NX; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < (int)n_x)
            y[(size_t)r * n_out + i] = s + (bias ? bias[i] : 0.0f);
    }
}

extern "C" int px__cuda_matvec(void *stream, px__cuda_dtype t, const void *w, size_t row_bytes,
                               uint32_t k, uint32_t n_out, const float *x, const uint32_t *select,
                               uint32_t n_x, const float *bias, float *y)
{
    if (n_x == 0 || n_out == 0)
        return 0;
    if (n_x > PX__CUDA_MV_MAX_ROWS)
        return (int)cudaErrorInvalidValue;
    dim3 grid(blocks_for(n_out, MV_WARPS));
    cudaStream_t s = (cudaStream_t)stream;
    const uint8_t *wb = (const uint8_t *)w;
    /* Rows x are read with float4 in block formats: k is a multiple of 32
     * and activation rows start 16-byte aligned (the session aligns them).
     * Float rows are read eight values at a time where k is a multiple of
     * 8 and the rows start 16-byte aligned. */
    bool vec = k % 8 == 0 && (uintptr_t)w % 16 == 0 && row_bytes % 16 == 0;
    if (n_x == 1)
        k_matvec<1><<<grid, MV_WARPS * WARP, 0, s>>>(t, wb, row_bytes, k, n_out, x, select, n_x,
                                                      bias, y, vec);
    else if (n_x <= 2)
        k_matvec<2><<<grid, MV_WARPS * WARP, 0, s>>>(t, wb, row_bytes, k, n_out, x, select, n_x,
                                                      bias, y, vec);
    else if (n_x <= 4)
        k_matvec<4><<<grid, MV_WARPS * WARP, 0, s>>>(t, wb, row_bytes, k, n_out, x, select, n_x,
                                                      bias, y, vec);
    else
        k_matvec<8><<<grid, MV_WARPS * WARP, 0, s>>>(t, wb, row_bytes, k, n_out, x, select, n_x,
                                                      bias, y, vec);
    return launch_status();
}

/* ------------------------------------------------------------------ */
/* RoPE                                                                */
/* ------------------------------------------------------------------ */

/* One thread per (row, head, pair); table[p*rope_dim + 2i] is the cosine
 * of pair i at position p, + 1 the sine (as on the cpu). */
__global__ void k_rope(float *x, const float *tab, const int32_t *pos, uint32_t rows,
                       uint32_t width, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                       bool halves)
{
    uint32_t half = rope_dim / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)rows * n_heads * half)
        return;
    uint32_t i = id % half, h = (id / half) % n_heads, r = (uint32_t)(id / half / n_heads);
    const float *cs = tab + (size_t)pos[r] * rope_dim;
    float *v = x + (size_t)r * width + (size_t)h * head_dim;
    uint32_t a = halves ? i : 2 * i, b = halves ? i + half : 2 * i + 1;
    float c = cs[2 * i], s = cs[2 * i + 1], v0 = v[a], v1 = v[b];
    v[a] = v0 * c - v1 * s;
    v[b] = v0 * s + v1 * c;
}

extern "C" int px__cuda_rope(void *stream, float *x, const float *tab, const int32_t *pos,
                             uint32_t rows, uint32_t width, uint32_t n_heads, uint32_t head_dim,
                             uint32_t rope_dim, bool halves)
{
    size_t n = (size_t)rows * n_heads * (rope_dim / 2);
    if (n == 0)
        return 0;
    k_rope<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, tab, pos, rows, width, n_heads,
                                                                head_dim, rope_dim, halves);
    return launch_status();
}

/* ------------------------------------------------------------------ */
/* Attention over the paged KV cache                                   */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ size_t cache_row(const px__cuda_rows &rw, uint32_t block, int32_t slot,
                                            int32_t p)
{
    if (!rw.block_table)
        return (size_t)slot * block + (size_t)p;
    int32_t b = rw.block_table[(size_t)slot * rw.blocks_per_slot + (size_t)p / block];
    return (size_t)b * block + (size_t)p % block;
}

__global__ void k_kv_store(const float *k, const float *v, float *kc, float *vc,
                           px__cuda_rows rw, uint32_t block, uint32_t kv_dim)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)rw.n_rows * kv_dim)
        return;
    uint32_t r = (uint32_t)(id / kv_dim), j = (uint32_t)(id % kv_dim);
    size_t at = cache_row(rw, block, rw.slot[r], rw.pos[r]) * kv_dim + j;
    kc[at] = k[id];
    vc[at] = v[id];
}

/* One block per (row, query head), one warp per share of the positions
 * (warp w takes first + w, first + w + NW, ...; two at a time, so that
 * their loads overlap).  A warp's lanes split the head's dimensions
 * (d = lane + 32 j): a key row and a value row are each read whole by
 * the warp at once.  Each warp keeps its own running max, sum and output
 * (online softmax); the block merges the NW of them at the end.  The
 * work is a warp per position pair in flight, not a thread per position,
 * so a decode step with few rows still spreads over the warps. */
__global__ void k_attention(const float *q, float *out, const float *kc, const float *vc,
                            px__cuda_rows rw, uint32_t block, uint32_t n_heads,
                            uint32_t n_kv_heads, uint32_t hd, uint32_t window, float scale)
{
    constexpr uint32_t NW = PX__CUDA_ATT_THREADS / WARP;
    constexpr uint32_t ND = PX__CUDA_MAX_HEAD_DIM / WARP;
    __shared__ float wm[NW], wl[NW];
    __shared__ float wo[NW][PX__CUDA_MAX_HEAD_DIM];
    uint32_t r = blockIdx.x, hq = blockIdx.y, lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    uint32_t h = hq / (n_heads / n_kv_heads);
    size_t q_dim = (size_t)n_heads * hd, kv_dim = (size_t)n_kv_heads * hd;
    const float *qr = q + (size_t)r * q_dim + (size_t)hq * hd;
    float qv[ND], acc[ND];
#pragma unroll
    for (uint32_t j = 0; j < ND; j++) {
        uint32_t d = lane + j * WARP;
        qv[j] = d < hd ? qr[d] : 0.0f;
        acc[j] = 0;
    }
    int32_t pos = rw.pos[r], slot = rw.slot[r];
    int32_t first = window && (uint32_t)pos >= window ? pos - (int32_t)window + 1 : 0;
    float m = -INFINITY, l = 0;
    for (int32_t p = first + (int32_t)w; p <= pos; p += 2 * (int32_t)NW) {
        int32_t p2 = p + (int32_t)NW;
        bool two = p2 <= pos;
        size_t a1 = cache_row(rw, block, slot, p) * kv_dim + (size_t)h * hd;
        size_t a2 = two ? cache_row(rw, block, slot, p2) * kv_dim + (size_t)h * hd : a1;
        float d1 = 0, d2 = 0;
#pragma unroll
        for (uint32_t j = 0; j < ND; j++) {
            uint32_t d = lane + j * WARP;
            if (d < hd) {
                d1 += qv[j] * kc[a1 + d];
                d2 += qv[j] * kc[a2 + d];
            }
        }
        float s1 = warp_sum(d1) * scale, s2 = two ? warp_sum(d2) * scale : -INFINITY;
        float m_new = fmaxf(m, fmaxf(s1, s2));
        float corr = expf(m - m_new), e1 = expf(s1 - m_new), e2 = two ? expf(s2 - m_new) : 0.0f;
        l = l * corr + e1 + e2;
#pragma unroll
        for (uint32_t j = 0; j < ND; j++) {
            uint32_t d = lane + j * WARP;
            if (d < hd)
                acc[j] = acc[j] * corr + e1 * vc[a1 + d] + e2 * vc[a2 + d];
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[w] = m;
        wl[w] = l;
    }
#pragma unroll
    for (uint32_t j = 0; j < ND; j++) {
        uint32_t d = lane + j * WARP;
        if (d < hd)
            wo[w][d] = acc[j];
    }
    __syncthreads();
    /* A warp with no positions has m = -inf and l = 0: weight 0. */
    float mm = -INFINITY;
    for (uint32_t k = 0; k < NW; k++)
        mm = fmaxf(mm, wm[k]);
    float ll = 0, f[NW];
    for (uint32_t k = 0; k < NW; k++) {
        f[k] = wl[k] > 0 ? expf(wm[k] - mm) : 0.0f;
        ll += wl[k] * f[k];
    }
    float inv = 1.0f / ll;
    float *o = out + (size_t)r * q_dim + (size_t)hq * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += PX__CUDA_ATT_THREADS) {
        float v = 0;
        for (uint32_t k = 0; k < NW; k++)
            v += wo[k][d] * f[k];
        o[d] = v * inv;
    }
}

extern "C" int px__cuda_attention(void *stream, const float *q, const float *k, const float *v,
                                  float *kc, float *vc, float *out, const px__cuda_rows *rows,
                                  uint32_t block, uint32_t n_heads, uint32_t n_kv_heads,
                                  uint32_t head_dim, uint32_t window)
{
    if (rows->n_rows == 0)
        return 0;
    if (head_dim == 0 || head_dim > PX__CUDA_MAX_HEAD_DIM || n_kv_heads == 0)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    uint32_t kv_dim = n_kv_heads * head_dim;
    size_t n = (size_t)rows->n_rows * kv_dim;
    /* Every new row first: later rows of a sequence attend to earlier
     * rows of the same step. */
    k_kv_store<<<blocks_for(n, 256), 256, 0, s>>>(k, v, kc, vc, *rows, block, kv_dim);
    int st = launch_status();
    if (st)
        return st;
    dim3 grid(rows->n_rows, n_heads);
    k_attention<<<grid, PX__CUDA_ATT_THREADS, 0, s>>>(q, out, kc, vc, *rows, block, n_heads,
                                                      n_kv_heads, head_dim, window,
                                                      1.0f / sqrtf((float)head_dim));
    return launch_status();
}

/* ------------------------------------------------------------------ */
/* Element-wise                                                        */
/* ------------------------------------------------------------------ */

__global__ void k_swiglu(const float *a, const float *b, float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = a[i];
        y[i] = g / (1.0f + expf(-g)) * b[i];
    }
}

__global__ void k_add(const float *a, const float *b, float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a[i] + b[i];
}

extern "C" int px__cuda_swiglu(void *stream, const float *a, const float *b, float *y, size_t n)
{
    if (n == 0)
        return 0;
    k_swiglu<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(a, b, y, n);
    return launch_status();
}

extern "C" int px__cuda_add(void *stream, const float *a, const float *b, float *y, size_t n)
{
    if (n == 0)
        return 0;
    k_add<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(a, b, y, n);
    return launch_status();
}
