/*
 * The cpu backend's matrix kernels alone, per variant and dtype, on the
 * 136 M synthetic model's largest shape (2816 weight rows of 1024
 * values): a 65-row product (prefill) and a 1-row product (decode), in
 * multiply-adds per second of the calling thread's CPU time, best of
 * several runs.  CPU time rather than wall time, so that other processes
 * competing for the cores lower the figures less; the machine's load is
 * printed all the same.  The ratio avx512 / avx2 is the speed-up of the
 * tiled kernels over four rows at a time (what every step larger than
 * four rows ran before them), with the same bits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plexus/rt.h"
#include "rt/rt_impl.h"

enum { K = 1024, N = 2816, ROWS = 65, RUNS = 3 };

static double thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Encodes n floats of a row as dtype t; returns the row's bytes. */
static size_t encode_row(px_dtype t, const float *v, uint8_t *out)
{
    size_t k = 0;
    for (size_t j = 0; j < K;) {
        if (t == PX_DTYPE_Q8_0) {
            float amax = 0;
            for (int i = 0; i < 32; i++)
                amax = fabsf(v[j + i]) > amax ? fabsf(v[j + i]) : amax;
            uint16_t dh = px_f32_to_f16(amax / 127.0f);
            float d = px_f16_to_f32(dh);
            memcpy(out + k, &dh, 2);
            for (int i = 0; i < 32; i++)
                out[k + 2 + i] = (uint8_t)(int8_t)(d > 0 ? lrintf(v[j + i] / d) : 0);
            k += 34;
            j += 32;
        } else if (t == PX_DTYPE_F16) {
            uint16_t h = px_f32_to_f16(v[j++]);
            memcpy(out + k, &h, 2);
            k += 2;
        } else {
            memcpy(out + k, &v[j++], 4);
            k += 4;
        }
    }
    return k;
}

/* Best multiply-adds per CPU second of one product of `rows` rows. */
static double rate(const px__rt_kernels *kern, px_dtype t, const uint8_t *w, size_t row_bytes,
                   const float *x, const int8_t *xq, const float *xd, uint32_t rows, float *y)
{
    double best = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = thread_seconds();
        if (t == PX_DTYPE_Q8_0)
            kern->matmul_q8_0(w, row_bytes, K, 0, N, xq, xd, rows, y, N);
        else
            kern->matmul(t, w, row_bytes, K, 0, N, x, K, rows, y, N);
        double s = thread_seconds() - t0;
        double macs = (double)rows * K * N / s;
        if (macs > best)
            best = macs;
    }
    return best;
}

static void print_load(const char *when)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = 0;
    if (f && fscanf(f, "%lf", &l1) == 1)
        printf("load average %s: %.2f on %ld online CPUs\n", when, l1,
               sysconf(_SC_NPROCESSORS_ONLN));
    if (f)
        fclose(f);
}

int main(void)
{
    print_load("at start");
    const px__rt_kernels *vars[3] = {&px__rt_kernels_portable, px__rt_kernels_avx2(),
                                     px__rt_kernels_avx512()};
    static const px_dtype types[] = {PX_DTYPE_F32, PX_DTYPE_F16, PX_DTYPE_Q8_0};
    px_rng rng;
    px_rng_seed(&rng, 1);
    float *wf = malloc((size_t)K * sizeof(float)), *x = malloc((size_t)ROWS * K * sizeof(float));
    uint8_t *w = malloc((size_t)N * K * 4);
    float *y = malloc((size_t)ROWS * N * sizeof(float));
    int8_t *xq = malloc((size_t)ROWS * K);
    float *xd = malloc((size_t)ROWS * K / 32 * sizeof(float));
    if (!wf || !x || !w || !y || !xq || !xd)
        return 1;
    for (size_t i = 0; i < (size_t)ROWS * K; i++)
        x[i] = (float)px_rng_normal(&rng);
    for (uint32_t r = 0; r < ROWS; r++)
        px__rt_quantize_q8_act(x + (size_t)r * K, K, xq + (size_t)r * K, xd + (size_t)r * K / 32);
    printf("matrix kernels, %u x %u weights, one thread: G multiply-adds per CPU second\n", N, K);
    printf("%-5s %-9s %12s %12s\n", "dtype", "variant", "65 rows", "1 row");
    for (size_t ti = 0; ti < 3; ti++) {
        px_dtype t = types[ti];
        size_t row_bytes = 0;
        for (uint32_t i = 0; i < N; i++) {
            for (uint32_t j = 0; j < K; j++)
                wf[j] = (float)(0.02 * px_rng_normal(&rng));
            row_bytes = encode_row(t, wf,
                                   w + (size_t)i * (t == PX_DTYPE_F32   ? K * 4
                                                    : t == PX_DTYPE_F16 ? K * 2
                                                                        : K / 32 * 34));
        }
        double prefill[3] = {0}, decode[3] = {0};
        for (int v = 0; v < 3; v++) {
            if (!vars[v])
                continue;
            /* The portable variant is slow: one run of the decode shape. */
            if (v == 0) {
                decode[v] = rate(vars[v], t, w, row_bytes, x, xq, xd, 1, y);
                printf("%-5s %-9s %12s %12.2f\n", px_dtype_name(t), vars[v]->name, "-",
                       decode[v] / 1e9);
                continue;
            }
            prefill[v] = rate(vars[v], t, w, row_bytes, x, xq, xd, ROWS, y);
            decode[v] = rate(vars[v], t, w, row_bytes, x, xq, xd, 1, y);
            printf("%-5s %-9s %12.2f %12.2f\n", px_dtype_name(t), vars[v]->name, prefill[v] / 1e9,
                   decode[v] / 1e9);
        }
        if (prefill[1] > 0 && prefill[2] > 0)
            printf("%-5s avx512 / avx2: %.2fx on 65 rows, %.2fx on 1 row\n", px_dtype_name(t),
                   prefill[2] / prefill[1], decode[2] / decode[1]);
    }
    print_load("at end");
    free(wf);
    free(x);
    free(w);
    free(y);
    free(xq);
    free(xd);
    return 0;
}
