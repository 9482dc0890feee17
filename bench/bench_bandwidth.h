/*
 * The machine's memory read bandwidth, as the decode benchmarks measure
 * it (static; included by bench_rt_*.c): the best of `runs` streaming
 * reads of a buffer of `bytes`, split over 1 or 2 threads.
 */
#ifndef PX_BENCH_BANDWIDTH_H
#define PX_BENCH_BANDWIDTH_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "plexus/base.h"

typedef struct bench_read_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bench_read_arg;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx2"))) static void *bench__read_part(void *varg)
{
    bench_read_arg *a = varg;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    const __m256i *v = (const __m256i *)(const void *)a->p;
    size_t n = a->n / 4;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(v + i));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(v + i + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(v + i + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(v + i + 3));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)(void *)out, s);
    a->sum = out[0] + out[1] + out[2] + out[3];
    return NULL;
}
#else
static void *bench__read_part(void *varg)
{
    bench_read_arg *a = varg;
    uint64_t s = 0;
    for (size_t i = 0; i < a->n; i++)
        s += a->p[i];
    a->sum = s;
    return NULL;
}
#endif

/* Best read bandwidth in bytes/s with `threads` threads (1 or 2); 0 when
 * the buffer cannot be had. */
static inline double bench_read_bandwidth(int threads, size_t bytes, int runs)
{
    size_t words = bytes / 8;
    uint64_t *p = aligned_alloc(64, bytes);
    if (!p)
        return 0;
    for (size_t i = 0; i < words; i++)
        p[i] = i;
    double best = 0;
    for (int r = 0; r < runs; r++) {
        pthread_t th[2];
        bench_read_arg args[2];
        uint64_t t0 = px_now_ns();
        for (int i = 0; i < threads; i++) {
            size_t b = words * (size_t)i / (size_t)threads / 16 * 16;
            size_t e = words * (size_t)(i + 1) / (size_t)threads / 16 * 16;
            args[i] = (bench_read_arg){p + b, e - b, 0};
            pthread_create(&th[i], NULL, bench__read_part, &args[i]);
        }
        uint64_t sum = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            sum += args[i].sum;
        }
        double s = (double)(px_now_ns() - t0) / 1e9;
        if (sum == 1) /* keeps the sums live */
            printf(" ");
        if ((double)bytes / s > best)
            best = (double)bytes / s;
    }
    free(p);
    return best;
}

#endif
