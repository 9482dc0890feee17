/*
 * Where a decode step's time goes with k-quant weights: the matrix-vector
 * products alone, per matrix shape, and a real decode step op by op.
 *
 * 1. The memory's read bandwidth with one and two threads (as
 *    bench_rt_decode measures it): what a product out of cache can reach.
 * 2. One matrix-vector product of each shape of the 136 M synthetic llama
 *    (2816 x 1024, 1024 x 2816, 1024 x 1024, 256 x 1024 and the 512 x 1024
 *    output) in Q4_K, Q5_K and Q6_K, then Q4_K repacked sixteen rows to a
 *    group where the kernels take it (ADR 0022), the kernels chosen at run time, one
 *    thread: ns per 256-value super-block with the matrix in cache (the
 *    same matrix again and again) and out of cache (a new copy of it each
 *    time, from some 200 MB of copies: what decode does), the weight GB/s
 *    out of cache and its share of the read bandwidth.  A product that
 *    takes as long in cache as out of it is bound by its instructions,
 *    not by the memory.
 * 3. The same out of cache with two threads, split as the cpu backend
 *    splits a product, and the cost of one call of the thread pool that
 *    does nothing (its wake-up and barrier), which a decode step pays for
 *    every call; then a layer's q, k and v products in one call each and
 *    in one call for the three (as the cpu backend groups them).
 * 4. A decode step of the q4_K_M file bench_rt_decode writes
 *    (PX_BENCH_DIR, or bench-models/ beside this program; skipped when
 *    absent; PX_BENCH_PROFILE=f32, f16, q8_0, ... names another of its
 *    files) with one and two threads, op by op: time per token of each
 *    kind of op (matrix products by the bytes they read), and the step's
 *    time outside its ops.
 *
 * Figures taken while other processes compete for the cores are lower
 * than the hardware's: compare ratios within one run.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_bandwidth.h"
#include "bench_models.h"
#include "plexus/ir.h"
#include "plexus/rt.h"
#include "plexus/rt_backend.h"
#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#define READ_BYTES ((size_t)256 << 20)
#define COPY_BYTES ((size_t)192 << 20)

/* One product split as cpu_ops.c splits it: units of PX__RT_ROW_UNIT rows,
 * parts by the bytes they read (px__rt_matmul_parts). */
typedef struct product {
    const px__rt_kernels *k;
    px_dtype t;
    bool x16; /* Q4_K in PX_RT_LAYOUT_Q4_K_X16 (units of PX__RT_ROW_UNIT_X16) */
    const uint8_t *w;
    size_t row_bytes;
    uint32_t cols, rows;
    const uint8_t *xq;
    float *y;
} product;

static void product_part(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    const product *p = arg;
    size_t u0, u1, unit = p->x16 ? PX__RT_ROW_UNIT_X16 : PX__RT_ROW_UNIT;
    px__rt_split((p->rows + unit - 1) / unit, part, n_parts, &u0, &u1);
    uint32_t i0 = (uint32_t)PX_MIN(u0 * unit, p->rows);
    uint32_t i1 = (uint32_t)PX_MIN(u1 * unit, p->rows);
    if (i1 > i0 && p->x16)
        p->k->matmul_q4_k16(p->w, p->row_bytes, p->cols, i0, i1, p->xq, 0, 1, p->y, p->rows);
    else if (i1 > i0)
        p->k->matmul_quant(p->t, p->w, p->row_bytes, p->cols, i0, i1, p->xq, 0, 1, p->y, p->rows);
}

static void run_product(product *p, px__rt_pool *pool)
{
    if (!pool) {
        product_part(p, 0, 1, 0);
        return;
    }
    size_t unit = p->x16 ? PX__RT_ROW_UNIT_X16 : PX__RT_ROW_UNIT;
    uint32_t units = (uint32_t)((p->rows + unit - 1) / unit);
    px__rt_pool_run(pool, product_part, p,
                    px__rt_matmul_parts(units, p->row_bytes * p->rows, px__rt_pool_size(pool)));
}

static void nothing(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)arg, (void)part, (void)n_parts, (void)thread;
}

typedef struct shape {
    uint32_t rows, cols;
    const char *what;
} shape;

static const shape SHAPES[] = {
    {2816, 1024, "ffn gate, up"}, {1024, 2816, "ffn down"}, {1024, 1024, "attn q, o"},
    {256, 1024, "attn k, v"},     {512, 1024, "output"},
};

/* Section 2 and 3 for one format and shape (x16: Q4_K repacked as the cpu device holds it where
 * the kernels have a product for it). */
static void matvec(const px__rt_kernels *k, px__rt_pool *pool, px_dtype t, bool x16, const shape *s,
                   const double bw[3], uint8_t *copies, px_rng *r)
{
    size_t row_bytes = (size_t)s->cols / PX__RT_QK * px_dtype_block_bytes(t);
    size_t mat = row_bytes * s->rows, n_copies = COPY_BYTES / mat;
    float *row = malloc(s->cols * sizeof(float)), *y = malloc(s->rows * sizeof(float));
    uint8_t *xq = malloc(px__rt_quant_act_bytes(t, s->cols));
    if (!row || !y || !xq)
        goto done;
    for (uint32_t i = 0; i < s->rows; i++) {
        for (uint32_t j = 0; j < s->cols; j++)
            row[j] = (float)(0.02 * px_rng_normal(r));
        px__rt_quantize_row(t, row, copies + i * row_bytes, s->cols);
    }
    if (x16) {
        px_err err;
        if (px_rt_weights_repack(PX_RT_LAYOUT_Q4_K_X16, t, copies, row_bytes, s->rows, s->cols,
                                 copies + mat, &err) != PX_OK) {
            printf("%s\n", err.msg);
            goto done;
        }
        memcpy(copies, copies + mat, mat);
    }
    for (size_t c = 1; c < n_copies; c++)
        memcpy(copies + c * mat, copies, mat);
    for (uint32_t j = 0; j < s->cols; j++)
        row[j] = (float)px_rng_normal(r);
    k->quant_act(t, row, xq, s->cols);
    product p = {k, t, x16, copies, row_bytes, s->cols, s->rows, xq, y};
    double sblocks = (double)s->rows * s->cols / PX__RT_QK;
    double hot = 1e30, cold[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 200; rep++) {
        uint64_t t0 = px_now_ns();
        run_product(&p, NULL);
        hot = PX_MIN(hot, (double)(px_now_ns() - t0));
    }
    /* Out of cache: each copy once, in turn, three passes; the time per
     * product of the best pass. */
    for (uint32_t th = 1; th <= 2; th++) {
        for (int pass = 0; pass < 3; pass++) {
            uint64_t t0 = px_now_ns();
            for (size_t c = 0; c < n_copies; c++) {
                p.w = copies + c * mat;
                run_product(&p, th == 2 ? pool : NULL);
            }
            cold[th] = PX_MIN(cold[th], (double)(px_now_ns() - t0) / (double)n_copies);
        }
    }
    printf("%-9s %4u x %-4u %-13s %8.2f %8.2f %7.2f %5.0f%% %8.2f %7.2f %5.0f%%\n",
           x16 ? "q4_k x16" : px_dtype_name(t), s->rows, s->cols, s->what, hot / sblocks,
           cold[1] / sblocks, (double)mat / cold[1], 100.0 * mat / cold[1] * 1e9 / bw[1],
           cold[2] / sblocks, (double)mat / cold[2], 100.0 * mat / cold[2] * 1e9 / bw[2]);
done:
    free(row);
    free(y);
    free(xq);
}

/* Section 3, grouped: a layer's q, k and v products (1024, 256 and 256
 * rows of 1024 values, Q4_K) out of cache, on one thread, on two threads
 * in one pool call each, and on two threads in one call for the three, as
 * px__rt_cpu_run_products runs them. */
typedef struct qkv_group {
    product p[3];
    size_t unit_end[3];
} qkv_group;

static void group_part(void *arg, uint32_t part, uint32_t n_parts, uint32_t thread)
{
    (void)thread;
    const qkv_group *g = arg;
    size_t u0, u1, first = 0;
    px__rt_split(g->unit_end[2], part, n_parts, &u0, &u1);
    for (int j = 0; j < 3 && u0 < u1; first = g->unit_end[j++]) {
        if (u0 >= g->unit_end[j])
            continue;
        size_t end = PX_MIN(u1, g->unit_end[j]);
        const product *p = &g->p[j];
        uint32_t i0 = (uint32_t)PX_MIN((u0 - first) * PX__RT_ROW_UNIT, p->rows);
        uint32_t i1 = (uint32_t)PX_MIN((end - first) * PX__RT_ROW_UNIT, p->rows);
        if (i1 > i0)
            p->k->matmul_quant(p->t, p->w, p->row_bytes, p->cols, i0, i1, p->xq, 0, 1, p->y,
                               p->rows);
        u0 = end;
    }
}

static void qkv(const px__rt_kernels *k, px__rt_pool *pool, uint8_t *copies, px_rng *r)
{
    enum { COLS = 1024 };
    static const uint32_t rows[3] = {1024, 256, 256};
    const px_dtype t = PX_DTYPE_Q4_K;
    size_t row_bytes = COLS / PX__RT_QK * px_dtype_block_bytes(t), all = 1536;
    size_t mat = row_bytes * all, n_copies = COPY_BYTES / mat;
    float *row = malloc(COLS * sizeof(float)), *y = malloc(all * sizeof(float));
    uint8_t *xq = malloc(px__rt_quant_act_bytes(t, COLS));
    if (!row || !y || !xq)
        goto done;
    for (size_t i = 0; i < all; i++) {
        for (uint32_t j = 0; j < COLS; j++)
            row[j] = (float)(0.02 * px_rng_normal(r));
        px__rt_quantize_row(t, row, copies + i * row_bytes, COLS);
    }
    for (size_t c = 1; c < n_copies; c++)
        memcpy(copies + c * mat, copies, mat);
    for (uint32_t j = 0; j < COLS; j++)
        row[j] = (float)px_rng_normal(r);
    k->quant_act(t, row, xq, COLS);
    qkv_group g;
    size_t units = 0, first_row = 0;
    for (int j = 0; j < 3; j++) {
        g.p[j] = (product){k, t, false, NULL, row_bytes, COLS, rows[j], xq, y + first_row};
        g.unit_end[j] = units += (rows[j] + PX__RT_ROW_UNIT - 1) / PX__RT_ROW_UNIT;
        first_row += rows[j];
    }
    uint32_t parts = px__rt_matmul_parts(units, mat, px__rt_pool_size(pool));
    double best[3] = {1e30, 1e30, 1e30}, sblocks = (double)all * COLS / PX__RT_QK;
    for (int pass = 0; pass < 5; pass++)
        for (int v = 0; v < 3; v++) {
            uint64_t t0 = px_now_ns();
            for (size_t c = 0; c < n_copies; c++) {
                for (int j = 0; j < 3; j++)
                    g.p[j].w = copies + c * mat + (j ? rows[0] + (j - 1) * rows[1] : 0) * row_bytes;
                if (v == 2) {
                    px__rt_pool_run(pool, group_part, &g, parts);
                    continue;
                }
                for (int j = 0; j < 3; j++)
                    run_product(&g.p[j], v == 1 ? pool : NULL);
            }
            best[v] = PX_MIN(best[v], (double)(px_now_ns() - t0) / (double)n_copies);
        }
    printf("\n3. q, k and v (1024 + 256 + 256 x 1024, q4_k) out of cache, ns per super-block: "
           "%.2f on 1 thread, %.2f on 2 threads in three pool calls, %.2f on 2 threads in one "
           "(%u parts): %.2fx the three calls' time\n",
           best[0] / sblocks, best[1] / sblocks, best[2] / sblocks, parts, best[2] / best[1]);
done:
    free(row);
    free(y);
    free(xq);
}

/* Section 4: time per token of each kind of op, products by bytes. */
#define MAX_BINS 24

typedef struct op_bin {
    px_ir_op_kind kind;
    uint64_t bytes, ns, count;
} op_bin;

typedef struct op_table {
    op_bin bin[MAX_BINS];
    size_t n;
    uint64_t ops_ns;
} op_table;

static void on_op(const px_rt_op_record *rec, void *ud)
{
    op_table *tab = ud;
    bool mm = rec->kind == PX_IR_OP_MATMUL || rec->kind == PX_IR_OP_CLASSIFIER;
    uint64_t key = mm ? rec->bytes : 0;
    tab->ops_ns += rec->ns;
    for (size_t i = 0; i < tab->n; i++) {
        if (tab->bin[i].kind == rec->kind && tab->bin[i].bytes == key) {
            tab->bin[i].ns += rec->ns;
            tab->bin[i].count++;
            return;
        }
    }
    if (tab->n < MAX_BINS)
        tab->bin[tab->n++] = (op_bin){rec->kind, key, rec->ns, 1};
}

static void decode_profile(const char *path, uint32_t threads)
{
    px_err err;
    px_rt_model *m = NULL;
    px_rt_session *s = NULL;
    if (px_rt_model_open(path, &m, &err) != PX_OK) {
        printf("4. skipped: %s\n", err.msg);
        return;
    }
    px_rt_session_opts so = {.n_threads = threads, .context = 256, .max_batch_tokens = 65};
    int32_t seq, prompt[65];
    if (px_rt_session_new(m, &so, &s, &err) != PX_OK || px_rt_seq_add(s, &seq, &err) != PX_OK) {
        printf("4. skipped: %s\n", err.msg);
        goto done;
    }
    for (int i = 0; i < 65; i++)
        prompt[i] = 3 + (i * 37) % 250;
    px_rt_output out;
    px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = 65, .tokens = prompt};
    if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err) != PX_OK)
        goto fail;
    int32_t tok = px_rt_argmax(out.data, out.row_len);
    op_table tab = {.n = 0};
    enum { WARM = 3, STEPS = 32 };
    uint64_t step_ns = 0, plain_ns = 0;
    /* Steps without telemetry first (what decode costs), then with it (op
     * by op: each op then waits for the one before). */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            px_rt_stream_set_telemetry(px_rt_session_stream(s), on_op, &tab);
        for (int i = 0; i < WARM + STEPS; i++) {
            if (pass == 1 && i == WARM)
                memset(&tab, 0, sizeof tab);
            st = (px_rt_seq_step){.seq = seq,
                                  .pos = 65 + (uint32_t)(pass * (WARM + STEPS) + i),
                                  .n_tokens = 1,
                                  .tokens = &tok};
            uint64_t t0 = px_now_ns();
            if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err))
                goto fail;
            if (i >= WARM)
                *(pass ? &step_ns : &plain_ns) += px_now_ns() - t0;
            tok = px_rt_argmax(out.data, out.row_len);
        }
    }
    px_rt_stream_set_telemetry(px_rt_session_stream(s), NULL, NULL);
    printf("\n4. a decode step of %s, %u thread%s: %.1f us a token (%.0f tokens/s), %.1f us "
           "with each op timed, of which %.1f us outside the ops\n",
           path, threads, threads == 1 ? "" : "s", plain_ns / 1e3 / STEPS,
           1e9 * STEPS / (double)plain_ns, step_ns / 1e3 / STEPS,
           (double)(step_ns - tab.ops_ns) / 1e3 / STEPS);
    printf("%-11s %10s %8s %10s %7s %8s\n", "op", "MB", "a token", "us/token", "share", "GB/s");
    for (size_t i = 0; i < tab.n; i++) {
        const op_bin *b = &tab.bin[i];
        double us = (double)b->ns / 1e3 / STEPS;
        printf("%-11s %10.3f %8.0f %10.1f %6.1f%% %8.2f\n", px_ir_op_kind_name(b->kind),
               b->bytes / 1e6, (double)b->count / STEPS, us, 100.0 * (double)b->ns / step_ns,
               b->bytes ? (double)b->bytes * b->count / b->ns : 0.0);
    }
    goto done;
fail:
    printf("4. failed: %s\n", err.msg);
done:
    px_rt_session_free(s);
    px_rt_model_free(m);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    FILE *lf = fopen("/proc/loadavg", "r");
    double load = 0;
    if (lf && fscanf(lf, "%lf", &load) == 1)
        printf("load average at start: %.2f on %ld online CPUs\n", load,
               sysconf(_SC_NPROCESSORS_ONLN));
    if (lf)
        fclose(lf);
    double bw[3] = {0, bench_read_bandwidth(1, READ_BYTES, 5),
                    bench_read_bandwidth(2, READ_BYTES, 5)};
    printf("1. memory read bandwidth: %.2f GB/s (1 thread), %.2f GB/s (2 threads)\n", bw[1] / 1e9,
           bw[2] / 1e9);
    const px__rt_kernels *k = px__rt_kernels_native();
    px_err err;
    px__rt_pool *pool = NULL;
    uint8_t *copies = aligned_alloc(64, COPY_BYTES);
    if (!copies || px__rt_pool_new(2, &pool, &err) != PX_OK) {
        fprintf(stderr, "bench_rt_matvec: set-up failed\n");
        return 1;
    }
    double call = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = px_now_ns();
        for (int i = 0; i < 2000; i++)
            px__rt_pool_run(pool, nothing, NULL, 8);
        call = PX_MIN(call, (double)(px_now_ns() - t0) / 2000);
    }
    printf("3. a pool call of 8 empty parts on 2 threads: %.0f ns\n", call);
    printf("\n2, 3. one matrix-vector product, %s kernels: ns per super-block in cache and out "
           "of cache (1 thread), GB/s and share of the read bandwidth; then out of cache with 2 "
           "threads\n",
           k->name);
    printf("%-9s %11s %-13s %8s %8s %7s %6s %8s %7s %6s\n", "dtype", "rows x cols", "matrix",
           "ns hot", "ns cold", "GB/s", "of bw", "ns 2thr", "GB/s", "of bw");
    px_rng r;
    px_rng_seed(&r, 1);
    static const px_dtype types[] = {PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};
    for (size_t t = 0; t < PX_ARRAY_LEN(types); t++)
        for (size_t i = 0; i < PX_ARRAY_LEN(SHAPES); i++)
            matvec(k, pool, types[t], false, &SHAPES[i], bw, copies, &r);
    /* Q4_K as a cpu device with these kernels holds it (ADR 0022). */
    for (size_t i = 0; i < PX_ARRAY_LEN(SHAPES) && k->matmul_q4_k16; i++)
        matvec(k, pool, PX_DTYPE_Q4_K, true, &SHAPES[i], bw, copies, &r);
    qkv(k, pool, copies, &r);
    free(copies);
    px__rt_pool_free(pool);
    char dir[1100], path[1200];
    if (!bench_models_dir(dir, sizeof dir))
        return 1;
    const char *file = getenv("PX_BENCH_PROFILE");
    snprintf(path, sizeof path, "%s/synth136m-%s.gguf", dir, file && file[0] ? file : "q4_k_m");
    if (access(path, R_OK) != 0) {
        printf("\n4. skipped: %s is absent (bench_rt_decode writes it)\n", path);
        return 0;
    }
    decode_profile(path, 1);
    decode_profile(path, 2);
    return 0;
}
