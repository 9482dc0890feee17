/*
 * Attention's kernels for a group of query heads that share a KV head,
 * 8-wide (AVX2 + FMA): included by cpu_kernels_x86.c and
 * cpu_kernels_avx512.c, each with its own TGT (target attribute) and
 * tile sizes, so that the AVX-512 build runs the same instructions with 32
 * registers and larger tiles.  Both give the bits of the one-head kernels
 * (px__rt_avx2_attn_scores and _values):
 *
 * - Scores: each score is one 8-lane partial sum (fused multiply-add of
 *   value j into lane j % 8) over the whole 8-wide steps, reduced in
 *   hsum's order ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then
 *   the remaining values added in turn, unfused, then times the scale.
 *   A tile of ATTN_GT heads by 4 cached rows loads each key value once for
 *   the heads, and reduces the 4 rows' sums of a head at once.
 * - Values: each output value is a sum over the rows in turn (p = 0, 1,
 *   ...), fused multiply-adds from 0 (the tail, past the last 8-wide
 *   step, unfused), held in registers over the rows and stored once.  A
 *   tile of ATTN_VGT heads by ATTN_VC vectors of values loads each value
 *   once for the heads.
 *
 * The includer defines TGT, INLINE, ATTN_GT and ATTN_VGT (heads per tile
 * of scores and of values, 1 to 4), ATTN_VC (vectors of values per tile,
 * 1 to 4), and the names of the functions, ATTN_SCORES and (unless it
 * has its own values kernel, built on attn_values_tile and
 * attn_values_tail) ATTN_VALUES.
 */

/* Four 8-lane sums reduced at once, each in hsum's order. */
INLINE __m128 attn_hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    /* Lanes l + l+4: [v0 s0..s3 | v2 s0..s3] and [v1 | v3]. */
    __m256 a =
        _mm256_add_ps(_mm256_permute2f128_ps(v0, v2, 0x20), _mm256_permute2f128_ps(v0, v2, 0x31));
    __m256 b =
        _mm256_add_ps(_mm256_permute2f128_ps(v1, v3, 0x20), _mm256_permute2f128_ps(v1, v3, 0x31));
    /* s0 + s2 and s1 + s3: [v0 e, v1 e, v0 o, v1 o | v2 e, v3 e, v2 o, v3 o]. */
    __m256 c = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m128 lo = _mm256_castps256_ps128(c), hi = _mm256_extractf128_ps(c, 1);
    return _mm_add_ps(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Scores of G heads (q, hd apart) against the rows k[0..3]:
 * out[g * ld + p] for p < np (the other rows are copies, not stored). */
INLINE void attn_scores_tile(const float *q, uint32_t G, const float *const k[4], size_t np,
                             uint32_t hd, float scale, float *out, size_t ld)
{
    __m256 acc[ATTN_GT][4];
    for (uint32_t g = 0; g < G; g++)
        for (int p = 0; p < 4; p++)
            acc[g][p] = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 kv[4];
        for (int p = 0; p < 4; p++)
            kv[p] = _mm256_loadu_ps(k[p] + j);
        for (uint32_t g = 0; g < G; g++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)g * hd + j);
            for (int p = 0; p < 4; p++)
                acc[g][p] = _mm256_fmadd_ps(qv, kv[p], acc[g][p]);
        }
    }
    for (uint32_t g = 0; g < G; g++) {
        __m128 s = attn_hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        float *o = out + (size_t)g * ld;
        if (j == hd && np == 4) {
            _mm_storeu_ps(o, _mm_mul_ps(s, _mm_set1_ps(scale)));
            continue;
        }
        float sum[4];
        _mm_storeu_ps(sum, s);
        const float *qg = q + (size_t)g * hd;
        for (size_t p = 0; p < np; p++) {
            float x = sum[p];
            for (uint32_t i = j; i < hd; i++)
                x += qg[i] * k[p][i];
            o[p] = x * scale;
        }
    }
}

INLINE void attn_scores_rows(const float *q, uint32_t n_q, const float *base, size_t stride,
                             const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out,
                             size_t ld)
{
    for (size_t p = 0; p < n; p += 4) {
        size_t np = n - p < 4 ? n - p : 4;
        const float *k[4];
        for (size_t i = 0; i < 4; i++)
            k[i] = base + (size_t)rows[p + (i < np ? i : np - 1)] * stride;
        uint32_t g = 0;
        for (; g + ATTN_GT <= n_q; g += ATTN_GT)
            attn_scores_tile(q + (size_t)g * hd, ATTN_GT, k, np, hd, scale,
                             out + (size_t)g * ld + p, ld);
#if ATTN_GT > 2
        for (; g + 2 <= n_q; g += 2)
            attn_scores_tile(q + (size_t)g * hd, 2, k, np, hd, scale, out + (size_t)g * ld + p, ld);
#endif
        for (; g < n_q; g++)
            attn_scores_tile(q + (size_t)g * hd, 1, k, np, hd, scale, out + (size_t)g * ld + p, ld);
    }
}

/* The common head sizes as constants, so that the loops over a row's
 * values unroll (the same instructions, so the same bits). */
TGT void ATTN_SCORES(const float *q, uint32_t n_q, const float *base, size_t stride,
                     const uint32_t *rows, size_t n, uint32_t hd, float scale, float *out,
                     size_t ld)
{
    if (hd == 8)
        attn_scores_rows(q, n_q, base, stride, rows, n, 8, scale, out, ld);
    else if (hd == 16)
        attn_scores_rows(q, n_q, base, stride, rows, n, 16, scale, out, ld);
    else if (hd == 32)
        attn_scores_rows(q, n_q, base, stride, rows, n, 32, scale, out, ld);
    else if (hd == 64)
        attn_scores_rows(q, n_q, base, stride, rows, n, 64, scale, out, ld);
    else if (hd == 128)
        attn_scores_rows(q, n_q, base, stride, rows, n, 128, scale, out, ld);
    else
        attn_scores_rows(q, n_q, base, stride, rows, n, hd, scale, out, ld);
}

/* Values of G heads over values [j, j + 8 C) of every row. */
INLINE void attn_values_tile(const float *w, size_t ld, uint32_t G, const float *base,
                             size_t stride, const uint32_t *rows, size_t n, uint32_t j, uint32_t C,
                             float *out, uint32_t hd)
{
    __m256 acc[ATTN_VGT][ATTN_VC];
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t c = 0; c < C; c++)
            acc[g][c] = _mm256_setzero_ps();
    for (size_t p = 0; p < n; p++) {
        const float *v = base + (size_t)rows[p] * stride + j;
        __m256 vv[ATTN_VC];
        for (uint32_t c = 0; c < C; c++)
            vv[c] = _mm256_loadu_ps(v + 8 * c);
        for (uint32_t g = 0; g < G; g++) {
            __m256 wg = _mm256_broadcast_ss(w + (size_t)g * ld + p);
            for (uint32_t c = 0; c < C; c++)
                acc[g][c] = _mm256_fmadd_ps(wg, vv[c], acc[g][c]);
        }
    }
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t c = 0; c < C; c++)
            _mm256_storeu_ps(out + (size_t)g * hd + j + 8 * c, acc[g][c]);
}

/* Values [j, hd) of G heads, past the last 8-wide step: unfused. */
INLINE void attn_values_tail(const float *w, size_t ld, uint32_t G, const float *base,
                             size_t stride, const uint32_t *rows, size_t n, uint32_t j, uint32_t hd,
                             float *out)
{
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t i = j; i < hd; i++) {
            float x = 0.0f;
            for (size_t p = 0; p < n; p++)
                x += w[(size_t)g * ld + p] * base[(size_t)rows[p] * stride + i];
            out[(size_t)g * hd + i] = x;
        }
}

#ifdef ATTN_VALUES
/* Every vector of values of G heads, then the tail. */
INLINE void attn_values_heads(const float *w, size_t ld, uint32_t G, const float *base,
                              size_t stride, const uint32_t *rows, size_t n, uint32_t hd,
                              float *out)
{
    uint32_t j = 0;
    for (; j + 8 * ATTN_VC <= hd; j += 8 * ATTN_VC)
        attn_values_tile(w, ld, G, base, stride, rows, n, j, ATTN_VC, out, hd);
    for (; j + 8 <= hd; j += 8)
        attn_values_tile(w, ld, G, base, stride, rows, n, j, 1, out, hd);
    attn_values_tail(w, ld, G, base, stride, rows, n, j, hd, out);
}

TGT void ATTN_VALUES(const float *w, size_t ld, uint32_t n_q, const float *base, size_t stride,
                     const uint32_t *rows, size_t n, uint32_t hd, float *out)
{
    uint32_t g = 0;
    for (; g + ATTN_VGT <= n_q; g += ATTN_VGT)
        attn_values_heads(w + (size_t)g * ld, ld, ATTN_VGT, base, stride, rows, n, hd,
                          out + (size_t)g * hd);
#if ATTN_VGT > 2
    for (; g + 2 <= n_q; g += 2)
        attn_values_heads(w + (size_t)g * ld, ld, 2, base, stride, rows, n, hd,
                          out + (size_t)g * hd);
#endif
    for (; g < n_q; g++)
        attn_values_heads(w + (size_t)g * ld, ld, 1, base, stride, rows, n, hd,
                          out + (size_t)g * hd);
}
#endif
