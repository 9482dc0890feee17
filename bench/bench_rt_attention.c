/*
 * Attention's cost on the cpu backend: the op alone, and its share of a
 * real decode step.
 *
 * 1. The attention op of one layer of the 136 M synthetic llama (16 query
 *    heads of 64 values over 4 KV heads, a context of 256) with one and
 *    two threads: a decode step (one row at positions 65 to 96, as
 *    bench_rt_matvec's decode step) and a prefill of 65 rows (positions 0
 *    to 64): us per op, the fastest of several rounds.
 * 2. A decode step of the q4_K_M file bench_rt_decode writes (PX_BENCH_DIR,
 *    or bench-models/ beside this program; skipped when absent) with one
 *    and two threads: tokens/s, and attention's us per token and share.
 *
 * 3. A served decode step's attention, layer after layer: `rows` sequences
 *    of one row each, every sequence at its own position (40 to 70, as
 *    a server's sequences are spread), their cache blocks of 16 positions
 *    scattered over the cache as a server's block table leaves them, each
 *    layer with a cache of its own.  Two shapes: stories260K's (8 query
 *    heads of 8 values over 4 KV heads, 64 rows, 4 layers: the cpu stage
 *    of the emu-small plan) and the 136 M llama's (16 rows, 12 layers).
 *    us per layer, the fastest of several rounds.
 *
 * `bench_rt_attention ops N` runs sections 1 and 3 only, N rounds (for
 * valgrind --tool=callgrind: instruction counts do not depend on the
 * load).  Figures taken while other processes compete for the cores are
 * lower than the hardware's: compare ratios within one run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"
#include "plexus/rt_backend.h"
#include "rt/rt_impl.h"
#include "bench_models.h"

enum { NH = 16, NKV = 4, HD = 64, CTX = 256, PREFILL = 65 };

typedef struct bench_cpu {
    px_rt_device *dev;
    px_rt_stream *stream;
    px_rt_buffer *buf;
    size_t used;
} bench_cpu;

static px_rt_tensor tensor(bench_cpu *c, px_dtype t, int64_t ne0, int64_t ne1, int64_t ne2)
{
    px_rt_tensor x;
    int64_t ne[3] = {ne0, ne1, ne2};
    if (px_rt_tensor_init(&x, t, 3, ne, NULL) != PX_OK)
        abort();
    x.buffer = c->buf;
    x.offset = c->used;
    c->used += (px_rt_tensor_nbytes(&x) + 63) / 64 * 64;
    if (c->used > px_rt_buffer_size(c->buf))
        abort();
    return x;
}

/* A cpu device of `threads` threads, its stream and a buffer of `bytes`;
 * exits naming the section when any cannot be had. */
static bench_cpu bench_cpu_open(uint32_t threads, size_t bytes, int section)
{
    px_err err;
    bench_cpu c = {0};
    px_rt_device_opts o = {.n_threads = threads};
    if (px_rt_device_open("cpu", &o, &c.dev, &err) || px_rt_stream_new(c.dev, &c.stream, &err) ||
        px_rt_buffer_alloc(c.dev, bytes, &c.buf, &err)) {
        printf("%d. skipped: %s\n", section, err.msg);
        exit(1);
    }
    return c;
}

static void bench_cpu_close(bench_cpu *c)
{
    px_rt_buffer_free(c->buf);
    px_rt_stream_free(c->stream);
    px_rt_device_free(c->dev);
}

/* The op's scratch, as the device asks for it, in c's buffer. */
static void give_work(bench_cpu *c, px_rt_op *op, px_rt_tensor *work)
{
    size_t need = px_rt_device_work_size(c->dev, op);
    *work = tensor(c, PX_DTYPE_I8, (int64_t)need, 1, 1);
    op->work = work;
}

static void fill(px_rng *r, const px_rt_tensor *t)
{
    float *v = px_rt_tensor_data(t);
    for (size_t i = 0; i < px_rt_tensor_nbytes(t) / sizeof(float); i++)
        v[i] = (float)px_rng_normal(r);
}

/* Section 1: us per attention op of `rows` rows (decode: 1; prefill:
 * PREFILL), the fastest of `rounds` rounds of 32 ops. */
static double op_us(uint32_t threads, uint32_t rows, int rounds)
{
    px_err err;
    bench_cpu c = bench_cpu_open(threads, 16 << 20, 1);
    px_rng r;
    px_rng_seed(&r, 7);
    px_rt_tensor q = tensor(&c, PX_DTYPE_F32, NH * HD, rows, 1),
                 k = tensor(&c, PX_DTYPE_F32, NKV * HD, rows, 1),
                 v = tensor(&c, PX_DTYPE_F32, NKV * HD, rows, 1),
                 kc = tensor(&c, PX_DTYPE_F32, NKV * HD, CTX, 1),
                 vc = tensor(&c, PX_DTYPE_F32, NKV * HD, CTX, 1),
                 att = tensor(&c, PX_DTYPE_F32, NH * HD, rows, 1);
    fill(&r, &q);
    fill(&r, &k);
    fill(&r, &v);
    fill(&r, &kc);
    fill(&r, &vc);
    int32_t pos[PREFILL], slot[PREFILL] = {0};
    px_rt_rows rw = {.n_rows = rows, .slot = slot, .pos = pos};
    px_rt_op op = {.kind = PX_IR_OP_ATTENTION,
                   .src = {&q, &k, &v, &kc, &vc},
                   .dst = &att,
                   .rows = &rw,
                   .n_heads = NH,
                   .n_kv_heads = NKV,
                   .head_dim = HD};
    px_rt_tensor work;
    give_work(&c, &op, &work);
    double best = 1e30;
    for (int round = 0; round < rounds; round++) {
        uint64_t t0 = px_now_ns();
        for (int i = 0; i < 32; i++) {
            for (uint32_t j = 0; j < rows; j++)
                pos[j] = rows == 1 ? 65 + i : (int32_t)j;
            if (px_rt_stream_run(c.stream, &op, 1, &err) != PX_OK) {
                printf("1. failed: %s\n", err.msg);
                exit(1);
            }
        }
        double us = (double)(px_now_ns() - t0) / 1e3 / 32;
        best = us < best ? us : best;
    }
    bench_cpu_close(&c);
    return best;
}

/* Section 3: us per layer of a served decode step's attention. */
typedef struct served_shape {
    const char *name;
    uint32_t nh, nkv, hd, rows, layers;
} served_shape;

enum { BLOCK = 16, SLOT_BLOCKS = 8 }; /* a context of 128 */

static double served_us(const served_shape *sh, uint32_t threads, int rounds)
{
    px_err err;
    uint32_t kv_dim = sh->nkv * sh->hd, n_blocks = sh->rows * SLOT_BLOCKS;
    size_t cache = (size_t)kv_dim * BLOCK * n_blocks * sizeof(float);
    size_t bytes = 2 * cache * sh->layers + ((size_t)4 << 20);
    bench_cpu c = bench_cpu_open(threads, bytes, 3);
    px_rng r;
    px_rng_seed(&r, 11);
    px_rt_tensor q = tensor(&c, PX_DTYPE_F32, sh->nh * sh->hd, sh->rows, 1),
                 k = tensor(&c, PX_DTYPE_F32, kv_dim, sh->rows, 1),
                 v = tensor(&c, PX_DTYPE_F32, kv_dim, sh->rows, 1),
                 att = tensor(&c, PX_DTYPE_F32, sh->nh * sh->hd, sh->rows, 1);
    px_rt_tensor kc[16], vc[16];
    for (uint32_t l = 0; l < sh->layers; l++) {
        kc[l] = tensor(&c, PX_DTYPE_F32, kv_dim, BLOCK, n_blocks);
        vc[l] = tensor(&c, PX_DTYPE_F32, kv_dim, BLOCK, n_blocks);
        fill(&r, &kc[l]);
        fill(&r, &vc[l]);
    }
    fill(&r, &q);
    fill(&r, &k);
    fill(&r, &v);
    /* Every block once, in a shuffled order. */
    int32_t *table = malloc(n_blocks * sizeof *table), pos[128], slot[128];
    for (uint32_t b = 0; b < n_blocks; b++)
        table[b] = (int32_t)b;
    for (uint32_t b = n_blocks - 1; b > 0; b--) {
        uint32_t j = (uint32_t)(px_rng_uniform(&r) * (b + 1)) % (b + 1);
        int32_t x = table[b];
        table[b] = table[j];
        table[j] = x;
    }
    for (uint32_t j = 0; j < sh->rows; j++) {
        slot[j] = (int32_t)j;
        pos[j] = 40 + (int32_t)(j * 7 % 31);
    }
    px_rt_rows rw = {.n_rows = sh->rows,
                     .slot = slot,
                     .pos = pos,
                     .block_table = table,
                     .blocks_per_slot = SLOT_BLOCKS};
    px_rt_op op = {.kind = PX_IR_OP_ATTENTION,
                   .src = {&q, &k, &v, &kc[0], &vc[0]},
                   .dst = &att,
                   .rows = &rw,
                   .n_heads = sh->nh,
                   .n_kv_heads = sh->nkv,
                   .head_dim = sh->hd};
    px_rt_tensor work;
    give_work(&c, &op, &work);
    double best = 1e30;
    for (int round = 0; round < rounds; round++) {
        uint64_t t0 = px_now_ns();
        for (int i = 0; i < 8; i++)
            for (uint32_t l = 0; l < sh->layers; l++) {
                op.src[3] = &kc[l];
                op.src[4] = &vc[l];
                if (px_rt_stream_run(c.stream, &op, 1, &err) != PX_OK) {
                    printf("3. failed: %s\n", err.msg);
                    exit(1);
                }
            }
        double us = (double)(px_now_ns() - t0) / 1e3 / (8.0 * sh->layers);
        best = us < best ? us : best;
    }
    free(table);
    bench_cpu_close(&c);
    return best;
}

static void served(int rounds)
{
    static const served_shape shapes[] = {{"stories260K", 8, 4, 8, 64, 4},
                                          {"136 M llama", 16, 4, 64, 16, 12}};
    for (size_t i = 0; i < PX_ARRAY_LEN(shapes); i++)
        for (uint32_t th = 1; th <= 2; th++)
            printf("3. served decode, %s (%u rows, %u layers), %u thread%s: %.1f us a layer\n",
                   shapes[i].name, shapes[i].rows, shapes[i].layers, th, th == 1 ? " " : "s",
                   served_us(&shapes[i], th, rounds));
}

/* Section 2: a decode step op by op, attention's part. */
typedef struct att_time {
    uint64_t att_ns, ops_ns;
} att_time;

static void on_op(const px_rt_op_record *rec, void *ud)
{
    att_time *a = ud;
    a->ops_ns += rec->ns;
    if (rec->kind == PX_IR_OP_ATTENTION)
        a->att_ns += rec->ns;
}

static void decode(const char *path, uint32_t threads)
{
    px_err err;
    px_rt_model *m = NULL;
    px_rt_session *s = NULL;
    if (px_rt_model_open(path, &m, &err) != PX_OK) {
        printf("2. skipped: %s\n", err.msg);
        return;
    }
    px_rt_session_opts so = {.n_threads = threads, .context = 256, .max_batch_tokens = 65};
    int32_t seq, prompt[65];
    if (px_rt_session_new(m, &so, &s, &err) != PX_OK || px_rt_seq_add(s, &seq, &err) != PX_OK)
        goto fail;
    for (int i = 0; i < 65; i++)
        prompt[i] = 3 + (i * 37) % 250;
    px_rt_output out;
    px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = 65, .tokens = prompt};
    uint64_t t0 = px_now_ns();
    if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err) != PX_OK)
        goto fail;
    uint64_t prefill_ns = px_now_ns() - t0;
    int32_t tok = px_rt_argmax(out.data, out.row_len);
    enum { WARM = 3, STEPS = 32 };
    uint64_t plain_ns = 0, timed_ns = 0;
    att_time at = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            px_rt_stream_set_telemetry(px_rt_session_stream(s), on_op, &at);
        for (int i = 0; i < WARM + STEPS; i++) {
            if (pass == 1 && i == WARM)
                at = (att_time){0, 0};
            st = (px_rt_seq_step){.seq = seq,
                                  .pos = 65 + (uint32_t)(pass * (WARM + STEPS) + i),
                                  .n_tokens = 1,
                                  .tokens = &tok};
            t0 = px_now_ns();
            if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err))
                goto fail;
            if (i >= WARM)
                *(pass ? &timed_ns : &plain_ns) += px_now_ns() - t0;
            tok = px_rt_argmax(out.data, out.row_len);
        }
    }
    px_rt_stream_set_telemetry(px_rt_session_stream(s), NULL, NULL);
    printf("2. %u thread%s: prefill of 65 %.0f tokens/s; decode %.0f tokens/s (%.1f us a token); "
           "attention %.1f us a token, %.1f%% of a step timed op by op\n",
           threads, threads == 1 ? " " : "s", 65e9 / (double)prefill_ns,
           1e9 * STEPS / (double)plain_ns, plain_ns / 1e3 / STEPS, at.att_ns / 1e3 / STEPS,
           100.0 * (double)at.att_ns / (double)timed_ns);
    goto done;
fail:
    printf("2. failed: %s\n", err.msg);
done:
    px_rt_session_free(s);
    px_rt_model_free(m);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool ops_only = argc > 1 && strcmp(argv[1], "ops") == 0;
    int rounds = ops_only && argc > 2 ? (int)strtol(argv[2], NULL, 10) : 20;
    if (rounds < 1)
        rounds = 1;
    FILE *lf = fopen("/proc/loadavg", "r");
    double load = 0;
    if (lf && fscanf(lf, "%lf", &load) == 1)
        printf("load average at start: %.2f on %ld online CPUs; %s kernels\n", load,
               sysconf(_SC_NPROCESSORS_ONLN), px__rt_kernels_native()->name);
    if (lf)
        fclose(lf);
    for (uint32_t th = 1; th <= 2; th++)
        printf("1. attention op, %u thread%s: decode (1 row, 65-96 positions) %.2f us, prefill "
               "(%d rows) %.1f us\n",
               th, th == 1 ? " " : "s", op_us(th, 1, rounds), PREFILL,
               op_us(th, PREFILL, rounds < 5 ? rounds : 5));
    served(rounds);
    if (ops_only)
        return 0;
    char dir[1100], path[1200];
    if (!bench_models_dir(dir, sizeof dir))
        return 1;
    snprintf(path, sizeof path, "%s/synth136m-q4_k_m.gguf", dir);
    if (access(path, R_OK) != 0) {
        printf("2. skipped: %s is absent (bench_rt_decode writes it)\n", path);
        return 0;
    }
    decode(path, 1);
    decode(path, 2);
    return 0;
}
