/*
 * libFuzzer target for the block-quantized formats: any bytes are blocks
 * of some format (the first byte picks it), and any activations (drawn
 * from the same bytes, NaN and infinities included) go through the
 * activation quantizer.  Dequantisation, single-value reads and every dot
 * product variant must run without a crash, an over-read or undefined
 * behaviour, the AVX2 and AVX-512 dots (single and several-row) must
 * equal the portable one bit for bit (or all be NaN), and the AVX2 and
 * AVX-512 activation quantizers (Q8_K; Q8_0 for Q4_0/Q5_0 and for q8_0
 * weights) must give the portable bytes.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const px_dtype formats[] = {PX_DTYPE_Q4_0, PX_DTYPE_Q5_0, PX_DTYPE_Q2_K, PX_DTYPE_Q3_K,
                                       PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};
    if (size < 2)
        return 0;
    px_dtype t = formats[data[0] % (sizeof formats / sizeof formats[0])];
    data++, size--;
    uint32_t be = px_dtype_block_elems(t), bb = px_dtype_block_bytes(t);
    /* Whole activation blocks (256 values for the k-quants, 32 for Q4_0
     * and Q5_0: any number of them, odd ones too), within one chunk. */
    uint32_t ab = be == 32 ? 32 : 256;
    uint32_t n = (uint32_t)(size / bb) * be / ab * ab;
    if (n > PX__RT_QCHUNK)
        n = PX__RT_QCHUNK;
    if (n == 0)
        return 0;
    size_t wbytes = (size_t)n / be * bb;
    /* Exactly-sized copies, so AddressSanitizer catches any read past. */
    uint8_t *w = malloc(wbytes);
    float *x = malloc((size_t)n * sizeof(float)), *deq = malloc((size_t)n * sizeof(float));
    uint8_t *xq = malloc(px__rt_quant_act_bytes(t, n));
    if (!w || !x || !deq || !xq)
        goto done;
    memcpy(w, data, wbytes);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = 0;
        for (int b = 0; b < 4; b++)
            u = u << 8 | data[(4 * (size_t)i + (size_t)b) % size];
        float f;
        memcpy(&f, &u, sizeof f);
        x[i] = f;
    }
    px__rt_quant_dequant_row(t, w, deq, n);
    float v = px__rt_quant_value_at(t, w, n - 1);
    if (memcmp(&v, &deq[n - 1], sizeof v) != 0)
        abort();
    px__rt_quant_act(t, x, xq, n);
    float a = px__rt_quant_dot_portable(t, w, xq, n);
    px__rt_quant_dot_fn variants[2] = {px__rt_quant_dot_avx2(), px__rt_quant_dot_avx512()};
    for (int k = 0; k < 2; k++) {
        if (!variants[k])
            continue;
        float b = variants[k](t, w, xq, n);
        if (!(isnan(a) && isnan(b)) && memcmp(&a, &b, sizeof a) != 0)
            abort();
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (variants[0]) {
        /* The AVX2 activation quantizer: the portable bytes; and the q8_0
         * weights' quantizer (any 32-value blocks) in every variant. */
        size_t qb = px__rt_quant_act_bytes(t, n);
        uint8_t *xq2 = malloc(qb);
        int8_t *q8 = malloc(n), *q8v = malloc(n);
        float *d8 = malloc((size_t)n / 32 * sizeof(float)),
              *d8v = malloc((size_t)n / 32 * sizeof(float));
        if (!xq2 || !q8 || !q8v || !d8 || !d8v) {
            free(xq2), free(q8), free(q8v), free(d8), free(d8v);
            goto done;
        }
        px__rt_quant_act_x86(t, x, xq2, n);
        if (memcmp(xq, xq2, qb) != 0)
            abort();
        px__rt_quantize_q8_act_ref(x, n, q8, d8);
        void (*q8_variants[2])(const float *, uint32_t, int8_t *, float *) = {
            px__rt_quantize_q8_act_x86, variants[1] ? px__rt_quantize_q8_act_x512 : NULL};
        for (int k = 0; k < 2; k++) {
            if (!q8_variants[k])
                continue;
            q8_variants[k](x, n, q8v, d8v);
            if (memcmp(q8, q8v, n) != 0 || memcmp(d8, d8v, (size_t)n / 32 * sizeof(float)) != 0)
                abort();
        }
        free(xq2), free(q8), free(q8v), free(d8), free(d8v);
    }
    /* The several-row dots (prefill), here over one activation row taken
     * PX__RT_QDOT_ROWS times: each result the single dot's. */
    if (variants[1]) {
        /* The AVX-512 activation quantizer: the portable bytes. */
        size_t qb = px__rt_quant_act_bytes(t, n);
        uint8_t *xq2 = malloc(qb);
        if (!xq2)
            goto done;
        px__rt_quant_act_x512(t, x, xq2, n);
        if (memcmp(xq, xq2, qb) != 0)
            abort();
        free(xq2);
        float outs[PX__RT_QDOT_ROWS];
        px__rt_quant_dotn_x512(t, w, xq, 0, PX__RT_QDOT_ROWS, n, outs);
        for (uint32_t r = 0; r < PX__RT_QDOT_ROWS; r++)
            if (!(isnan(a) && isnan(outs[r])) && memcmp(&a, &outs[r], sizeof a) != 0)
                abort();
    }
#endif
done:
    free(w);
    free(x);
    free(deq);
    free(xq);
    return 0;
}
