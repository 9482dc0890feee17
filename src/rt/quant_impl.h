/*
 * The block-quantized weight formats GGUF files use beyond q8_0: Q4_0 and
 * Q5_0 (blocks of 32) and the k-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K
 * (super-blocks of 256), with ggml's byte layouts; the 8-bit activation
 * blocks their dot products use; and the quantizers `plexus model
 * quantize` writes files with.
 *
 * Every format is decoded into one integer form first (quant.c): per
 * super-block (or block), 256 (32) small integers q, one scale per 16
 * values and, for formats with a minimum, one min per 16 values, plus the
 * float factors d and dmin.  A value is then
 *
 *     w[j] = (d * sc[j/16]) * q[j] - (dmin * m[j/16])
 *
 * evaluated in float in that order, which is how ggml's reference
 * dequantisation computes it: the runtime reproduces its values bit for
 * bit.  The dot products (cpu_quant.c, cpu_quant_x86.c) take activations
 * quantized per row to 8-bit blocks (Q8_0 for Q4_0/Q5_0, Q8_K for the
 * k-quants), sum integer products exactly and scale in a fixed float
 * order, so the scalar and the AVX2 paths give identical results, and a
 * row's result depends on nothing but its weight row and its activation
 * row.
 *
 * Usage (the kernels' view):
 *
 *     uint8_t xq[PX__RT_QCHUNK_BYTES];
 *     px__rt_quant_act(PX_DTYPE_Q4_K, x, xq, 4096);
 *     float y = px__rt_quant_dot_portable(PX_DTYPE_Q4_K, row, xq, 4096);
 */
#ifndef PX_RT_QUANT_IMPL_H
#define PX_RT_QUANT_IMPL_H

#include "base/common.h"

#include "plexus/ir.h"

/* Clang fuses a*b+c into one rounding where FMA is available; the results
 * below are defined with separate roundings. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define PX__RT_QK  256u /* values per k-quant super-block */
#define PX__RT_QK0 32u  /* values per Q4_0/Q5_0/Q8_0 block */
/* Float accumulators (of eight lanes) a Q4_0/Q5_0 dot spreads its blocks
 * over: block b adds to group b % PX__RT_Q0_GROUPS (cpu_quant.c). */
#define PX__RT_Q0_GROUPS 4u

/* Activation blocks.  Q8_0: an f16 scale then 32 int8 (34 bytes).  Q8_K:
 * a float scale, 256 int8, then 16 int16 sums of each 16 values (292
 * bytes), in this build's byte order (never stored). */
#define PX__RT_Q8_0_ACT_BYTES 34u
#define PX__RT_Q8_K_BYTES     292u

/* Values per dot: a row longer than this is the sum, in order, of its
 * chunks' dots (a multiple of 256), so that a caller may quantize its
 * activations a chunk at a time into a buffer on the stack. */
#define PX__RT_QCHUNK       4096u
#define PX__RT_QCHUNK_BYTES (PX__RT_QCHUNK / PX__RT_QK * PX__RT_Q8_K_BYTES)

/* Whether t is one of the formats of this file (q4_0, q5_0, q2_k..q6_k). */
bool px__rt_quant_handles(px_dtype t);

/* The integer form of one block (32 values) or super-block (256). */
typedef struct px__rt_qblock {
    int8_t q[256];
    int16_t sc[16], m[16]; /* per 16 values; m all 0 without a minimum */
    float d, dmin;
    bool has_min;
} px__rt_qblock;

/* Q4_K's (and Q5_K's) eight six-bit scales and mins (one per 32 values)
 * from its 12 scale bytes, byte j of *scales and *mins: scale j < 4 is the
 * low six bits of byte j and min j of byte j + 4; j >= 4 takes the
 * nibbles of byte j + 4 and the top two bits of bytes j - 4 (scale) and j
 * (min).  Word-wide masks, no loop. */
static inline void px__rt_q4_k_scales(const uint8_t *s12, uint64_t *scales, uint64_t *mins)
{
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    /* Three word loads: one copy into an array went through the stack. */
    uint32_t u[3];
    memcpy(&u[0], s12, 4);
    memcpy(&u[1], s12 + 4, 4);
    memcpy(&u[2], s12 + 8, 4);
    uint32_t sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    uint32_t m_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    *scales = (uint64_t)sc_hi << 32 | (u[0] & k1);
    *mins = (uint64_t)m_hi << 32 | (u[1] & k1);
}

/* Q4_K rows repacked for the AVX-512 decode, sixteen rows to a group: each group's
 * super-block b is a tile of sixteen blocks' bytes (2304), tiles in order, groups in order, so
 * that a repacked matrix takes the bytes of the original.  A tile holds the rows' d (16 f16),
 * their dmin (16 f16), dword q (0..2) of their 12 scale bytes (row r at 64 q + 4 r from
 * PX__RT_Q4K16_SCALES) and dword j (0..31) of their 128 quant bytes (row r at 64 j + 4 r from
 * PX__RT_Q4K16_QS): one register a dword, one lane a row. */
#define PX__RT_Q4K16_ROWS   16u
#define PX__RT_Q4K16_SCALES 64u
#define PX__RT_Q4K16_QS     256u
#define PX__RT_Q4K16_TILE   2304u
/* Repacks rows [0, 16) of a Q4_K matrix (rows row_bytes apart, nb super-blocks each) into one
 * group at out (16 rows' bytes). */
void px__rt_q4_k_repack16(const uint8_t *w, size_t row_bytes, uint32_t nb, uint8_t *out);

/* Decodes the scales (d, dmin, sc, m, has_min) of the block at blk. */
void px__rt_quant_scales(px_dtype t, const uint8_t *blk, px__rt_qblock *out);
/* Decodes block b of a row of dtype t (px__rt_quant_handles(t)). */
void px__rt_quant_unpack(px_dtype t, const uint8_t *row, uint32_t b, px__rt_qblock *out);
/* Dequantises k values (a multiple of the block) of a row of dtype t,
 * bit for bit as ggml's reference does. */
void px__rt_quant_dequant_row(px_dtype t, const void *row, float *dst, uint32_t k);
/* The value at index i of a row of dtype t. */
float px__rt_quant_value_at(px_dtype t, const void *row, uint32_t i);

/* The activation format of weights of dtype t: Q8_0 or Q8_K. */
px_dtype px__rt_quant_act_dtype(px_dtype t);
/* Bytes of n activation values quantized for t. */
size_t px__rt_quant_act_bytes(px_dtype t, uint32_t n);
/* Quantizes n activation values for weights of dtype t into out
 * (px__rt_quant_act_bytes(t, n) bytes); n is a multiple of the activation
 * block (32 for Q8_0, 256 for Q8_K).  A block holding a NaN or an
 * infinity gets a NaN scale, so that the dots it enters are NaN. */
void px__rt_quant_act(px_dtype t, const float *x, uint8_t *out, uint32_t n);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* px__rt_quant_act with AVX-512 (Q8_K and Q8_0 activations), byte for
 * byte its results: callable where px__rt_quant_dot_avx512() returns a
 * dot. */
void px__rt_quant_act_x512(px_dtype t, const float *x, uint8_t *out, uint32_t n);
/* px__rt_quant_act with AVX2 (Q8_0 activations; Q8_K ones by the
 * portable code), byte for byte its results: callable where
 * px__rt_quant_dot_avx2() returns a dot. */
void px__rt_quant_act_x86(px_dtype t, const float *x, uint8_t *out, uint32_t n);
#endif

/* The dot of n values (a multiple of the block) of a weight row of dtype t
 * with activations quantized for t: the definition the vectorised
 * variants reproduce bit for bit. */
float px__rt_quant_dot_portable(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n);

/* A dot over n values as above. */
typedef float (*px__rt_quant_dot_fn)(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n);

/* The AVX2 variant of px__rt_quant_dot_portable, or NULL when the build
 * or the processor lacks AVX2 (cpu_quant_x86.c). */
px__rt_quant_dot_fn px__rt_quant_dot_avx2(void);
/* The AVX-512 (VNNI) variant, or NULL when the build or the processor lacks the avx512 kernels
 * (cpu_quant_avx512.c). */
px__rt_quant_dot_fn px__rt_quant_dot_avx512(void);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Those variants themselves: callable only where px__rt_quant_dot_avx2()
 * (px__rt_quant_dot_avx512()) returns them. */
float px__rt_quant_dot_x86(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n);
float px__rt_quant_dot_x512(px_dtype t, const uint8_t *w, const uint8_t *xq, uint32_t n);
#endif

/* Activation rows a weight row's blocks are decoded for at once. */
#define PX__RT_QDOT_ROWS 4u

/* out[r] = dot(w, xq + r * ldxq, n) for r < n_x (1 .. PX__RT_QDOT_ROWS):
 * each result bit for bit the single dot's; a variant decodes each weight
 * block once for all the rows. */
typedef void (*px__rt_quant_dotn_fn)(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                                     uint32_t n_x, uint32_t n, float *out);
/* dotn as one dot per activation row. */
void px__rt_quant_dotn_loop(px__rt_quant_dot_fn dot, px_dtype t, const uint8_t *w,
                            const uint8_t *xq, size_t ldxq, uint32_t n_x, uint32_t n, float *out);
extern const px__rt_quant_dotn_fn px__rt_quant_dotn_portable;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The avx2 and avx512 dotn: callable where px__rt_quant_dot_avx2()
 * (px__rt_quant_dot_avx512()) returns a dot. */
void px__rt_quant_dotn_x86(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                           uint32_t n_x, uint32_t n, float *out);
void px__rt_quant_dotn_x512(px_dtype t, const uint8_t *w, const uint8_t *xq, size_t ldxq,
                            uint32_t n_x, uint32_t n, float *out);
/* The AVX-512 product of one activation row (decode) for the formats it has its own for
 * (Q4_K, Q5_K with k <= 16384): y[i] = the dot of weight row i with xq (px__rt_quant_act over
 * all k values) for i in [i0, i1), as px__rt_quant_gemm gives it; returns false (and writes
 * nothing) for the others. */
bool px__rt_quant_gemv_x512(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                            uint32_t i1, const uint8_t *xq, float *y);
/* The AVX-512 product of Q4_K weights repacked (px__rt_q4_k_repack16) and n_x activation rows
 * (xq + r * ldxq, any number): y[r * ldy + i] for i in [i0, i1) (multiples of sixteen, groups of
 * w at i * row_bytes) as px__rt_quant_gemm writes it for the rows as stored. */
void px__rt_quant_gemm_x16_x512(const uint8_t *w, size_t row_bytes, uint32_t k, uint32_t i0,
                                uint32_t i1, const uint8_t *xq, size_t ldxq, uint32_t n_x, float *y,
                                size_t ldy);
/* The AVX-512 product of sixteen activation rows at a time (prefill) for Q4_K, Q5_K and Q6_K:
 * rows r < the returned count (n_x, or n_x less n_x % 16 when fewer than six rows are left past
 * the groups of sixteen; 0 for other formats, fewer than twelve rows, or when memory runs
 * short) written as px__rt_quant_gemm writes them, the rest left for it. */
uint32_t px__rt_quant_gemm16_x512(px_dtype t, const uint8_t *w, size_t row_bytes, uint32_t k,
                                  uint32_t i0, uint32_t i1, const uint8_t *xq, size_t ldxq,
                                  uint32_t n_x, float *y, size_t ldy);
#endif

/* y[r*ldy + i] = dot(row i of w, activation row r) for i in [i0, i1) and
 * r < n_x (any number), weights of dtype t (px__rt_quant_handles) with k
 * values per row, activation row r quantized for t (px__rt_quant_act
 * over all k values) at xq + r * ldxq.  A row longer than PX__RT_QCHUNK
 * values is the sum, in order, of its chunks' dots. */
void px__rt_quant_gemm(px__rt_quant_dotn_fn dotn, px_dtype t, const void *w, size_t row_bytes,
                       uint32_t k, uint32_t i0, uint32_t i1, const uint8_t *xq, size_t ldxq,
                       uint32_t n_x, float *y, size_t ldy);
/* A product as px__rt_quant_gemm's (a variant's matmul_quant). */
typedef void (*px__rt_quant_gemm_fn)(px_dtype t, const void *w, size_t row_bytes, uint32_t k,
                                     uint32_t i0, uint32_t i1, const uint8_t *xq, size_t ldxq,
                                     uint32_t n_x, float *y, size_t ldy);
/* The same from f32 activation rows (x + r * ldx), quantized here once, then multiplied by
 * gemm. */
void px__rt_quant_matmul(px__rt_quant_gemm_fn gemm, px_dtype t, const void *w, size_t row_bytes,
                         uint32_t k, uint32_t i0, uint32_t i1, const float *x, size_t ldx,
                         uint32_t n_x, float *y, size_t ldy);

/* ggml's nearest_int: round to nearest, ties to even, for |v| < 2^22. */
static inline int px__rt_nearest_int(float v)
{
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* ------------------------------------------------------------------ */
/* Weight quantizers (quantize.c)                                      */
/* ------------------------------------------------------------------ */

/* Quantizes n finite values (a multiple of the block of t) into blocks of
 * t, as ggml's reference quantizer does without an importance matrix.
 * t: q8_0, q4_0, q5_0, q4_k, q5_k, q6_k. */
void px__rt_quantize_row(px_dtype t, const float *x, uint8_t *out, uint64_t n);
/* Whether px__rt_quantize_row writes t. */
bool px__rt_quantize_supports(px_dtype t);

#endif
