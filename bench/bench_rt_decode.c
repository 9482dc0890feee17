/*
 * Decode and prefill speed of the cpu backend, against this machine's
 * memory bandwidth.
 *
 * 1. Measures sustained memory bandwidth with a STREAM-like triad
 *    (a = b + s*c over arrays far larger than the caches; 12 bytes per
 *    element, STREAM's convention), best of several runs, with 1 and 2
 *    threads.
 * 2. Writes a synthetic llama model of about 600 MB in f32, and its f16 and
 *    q8_0 versions, with the ir module's GGUF writer (in $PX_BENCH_DIR or a
 *    fresh folder under $TMPDIR; deleted afterwards).  Rows are drawn from
 *    a small pool of random rows, so that writing costs little more than
 *    the I/O; speed does not depend on the values.
 * 3. For each, with 1 and 2 threads: prefill of a 64-token prompt in one
 *    step (tokens/s), then decode of one token per step (tokens/s), and
 *    decode as a fraction of the bandwidth bound: (weight bytes + KV bytes
 *    read per token) / triad bandwidth at the same thread count.  A
 *    warm-up step first faults the mapped weights into memory, so the
 *    figures are steady-state.
 * 4. Tokens/s of the real tiny model (stories260K) when ../shared/models
 *    holds it.
 *
 * Stays well under two minutes on a two-core machine.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define TRIAD_ELEMS ((size_t)24 << 20) /* 3 arrays of 96 MiB */
#define TRIAD_RUNS  6

typedef struct triad_arg {
    float *a, *b, *c;
    size_t begin, end;
} triad_arg;

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static void *triad_part(void *p)
{
    triad_arg *t = p;
    const float s = 3.0f;
    for (size_t i = t->begin; i < t->end; i++)
        t->a[i] = t->b[i] + s * t->c[i];
    return NULL;
}

static void *touch_part(void *p)
{
    triad_arg *t = p;
    for (size_t i = t->begin; i < t->end; i++)
        t->a[i] = t->b[i] = t->c[i] = 1.0f;
    return NULL;
}

static void in_threads(float *a, float *b, float *c, int threads, void *(*fn)(void *))
{
    pthread_t th[16];
    triad_arg args[16];
    for (int i = 0; i < threads; i++) {
        args[i] = (triad_arg){a, b, c, TRIAD_ELEMS * (size_t)i / (size_t)threads,
                              TRIAD_ELEMS * (size_t)(i + 1) / (size_t)threads};
        pthread_create(&th[i], NULL, fn, &args[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
}

/* Best triad bandwidth in bytes/s. */
static double triad(int threads)
{
    float *a = malloc(TRIAD_ELEMS * sizeof(float)), *b = malloc(TRIAD_ELEMS * sizeof(float)),
          *c = malloc(TRIAD_ELEMS * sizeof(float));
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0;
    }
    /* First touch by the same threads, so pages are where they run. */
    in_threads(a, b, c, threads, touch_part);
    double best = 0;
    for (int r = 0; r < TRIAD_RUNS; r++) {
        uint64_t t0 = px_now_ns();
        in_threads(a, b, c, threads, triad_part);
        double s = (double)(px_now_ns() - t0) / 1e9;
        double bw = 3.0 * sizeof(float) * (double)TRIAD_ELEMS / s;
        if (bw > best)
            best = bw;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* Bytes a decode step reads: every weight but the embedding table (one
 * row of it), plus the K and V of every cached position. */
static double decode_bytes(const px_rt_model *m, uint32_t context)
{
    const px_ir_model *ir = px_rt_model_ir(m);
    const px_ir_hparams *hp = px_rt_model_hparams(m);
    double bytes = 0;
    const px_ir_tensor *embd = px_ir_model_weight(ir, 0, PX_IR_ROLE_TOKEN_EMBD);
    for (size_t i = 0; i < px_ir_model_n_tensors(ir); i++) {
        const px_ir_tensor *t = px_ir_model_tensor(ir, i);
        bytes += t == embd && !hp->tied_classifier ? (double)t->nb[1] : (double)t->n_bytes;
    }
    return bytes + 2.0 * hp->n_layers * hp->n_kv_heads * hp->head_dim * 4.0 * context;
}

/* The benchmark model's shape. */
enum { DIM = 1024, HIDDEN = 2816, LAYERS = 10, HEADS = 16, KV_HEADS = 4, VOCAB = 16000 };
#define POOL_ROWS 61

/* POOL_ROWS random rows of n values, encoded as dtype t, back to back. */
static uint8_t *row_pool(px_dtype t, uint32_t n, size_t *row_bytes, px_rng *rng)
{
    uint64_t rb;
    if (!px_dtype_nbytes(t, n, &rb))
        return NULL;
    uint8_t *pool = malloc(POOL_ROWS * rb);
    float *v = malloc(n * sizeof *v);
    if (!pool || !v) {
        free(pool);
        free(v);
        return NULL;
    }
    for (int r = 0; r < POOL_ROWS; r++) {
        uint8_t *out = pool + r * rb;
        for (uint32_t i = 0; i < n; i++)
            v[i] = (float)(0.05 * px_rng_normal(rng));
        for (uint32_t i = 0; i < n;) {
            if (t == PX_DTYPE_Q8_0) {
                float amax = 0;
                for (int j = 0; j < 32; j++)
                    amax = v[i + j] > amax ? v[i + j] : -v[i + j] > amax ? -v[i + j] : amax;
                uint16_t dh = px_f32_to_f16(amax / 127.0f);
                float d = px_f16_to_f32(dh);
                memcpy(out, &dh, 2);
                for (int j = 0; j < 32; j++)
                    out[2 + j] = (uint8_t)(int8_t)(d > 0 ? (int)(v[i + j] / d + 0.5f) : 0);
                out += 34;
                i += 32;
            } else if (t == PX_DTYPE_F16) {
                uint16_t h = px_f32_to_f16(v[i++]);
                memcpy(out, &h, 2);
                out += 2;
            } else {
                memcpy(out, &v[i++], 4);
                out += 4;
            }
        }
    }
    free(v);
    *row_bytes = (size_t)rb;
    return pool;
}

static px_status write_model(const char *path, px_dtype t, px_err *err)
{
    px_ir_gguf_writer *w;
    px_status st = px_ir_gguf_writer_new(path, &w, err);
    if (st)
        return st;
    struct {
        char name[48];
        uint32_t rows, cols;
    } ts[3 + 9 * LAYERS];
    size_t n = 0;
#define ADD(r, c, ...)                                        \
    do {                                                      \
        snprintf(ts[n].name, sizeof ts[n].name, __VA_ARGS__); \
        ts[n].rows = (r);                                     \
        ts[n++].cols = (c);                                   \
    } while (0)
    ADD(VOCAB, DIM, "token_embd.weight");
    ADD(1, DIM, "output_norm.weight");
    ADD(VOCAB, DIM, "output.weight");
    for (int l = 0; l < LAYERS; l++) {
        ADD(1, DIM, "blk.%d.attn_norm.weight", l);
        ADD(DIM, DIM, "blk.%d.attn_q.weight", l);
        ADD(KV_HEADS * (DIM / HEADS), DIM, "blk.%d.attn_k.weight", l);
        ADD(KV_HEADS * (DIM / HEADS), DIM, "blk.%d.attn_v.weight", l);
        ADD(DIM, DIM, "blk.%d.attn_output.weight", l);
        ADD(1, DIM, "blk.%d.ffn_norm.weight", l);
        ADD(HIDDEN, DIM, "blk.%d.ffn_gate.weight", l);
        ADD(DIM, HIDDEN, "blk.%d.ffn_down.weight", l);
        ADD(HIDDEN, DIM, "blk.%d.ffn_up.weight", l);
    }
#undef ADD
    if ((st = px_ir_gguf_writer_add_str(w, "general.architecture", "llama", err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.context_length", 512, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.embedding_length", DIM, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.feed_forward_length", HIDDEN, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.block_count", LAYERS, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.attention.head_count", HEADS, err)) ||
        (st = px_ir_gguf_writer_add_u32(w, "llama.attention.head_count_kv", KV_HEADS, err)))
        goto fail;
    for (size_t i = 0; i < n; i++) {
        uint64_t ne[2] = {ts[i].cols, ts[i].rows};
        px_dtype dt = ts[i].rows == 1 ? PX_DTYPE_F32 : t;
        if ((st =
                 px_ir_gguf_writer_add_tensor(w, ts[i].name, dt, ts[i].rows == 1 ? 1 : 2, ne, err)))
            goto fail;
    }
    if ((st = px_ir_gguf_writer_begin_data(w, err)))
        goto fail;
    px_rng rng;
    px_rng_seed(&rng, 1);
    size_t rb_dim = 0, rb_hid = 0;
    uint8_t *pool_dim = row_pool(t, DIM, &rb_dim, &rng),
            *pool_hid = row_pool(t, HIDDEN, &rb_hid, &rng);
    float ones[DIM];
    for (int i = 0; i < DIM; i++)
        ones[i] = 1.0f;
    uint64_t k = 0;
    for (size_t i = 0; i < n && st == PX_OK && pool_dim && pool_hid; i++) {
        if (ts[i].rows == 1) {
            st = px_ir_gguf_writer_write(w, ones, sizeof ones, err);
            continue;
        }
        bool wide = ts[i].cols == HIDDEN;
        for (uint32_t r = 0; r < ts[i].rows && st == PX_OK; r++, k++)
            st = px_ir_gguf_writer_write(
                w, wide ? pool_hid + (k % POOL_ROWS) * rb_hid : pool_dim + (k % POOL_ROWS) * rb_dim,
                wide ? rb_hid : rb_dim, err);
    }
    if (st == PX_OK && (!pool_dim || !pool_hid))
        st = px_err_set(err, PX_ENOMEM, "bench: out of memory");
    free(pool_dim);
    free(pool_hid);
    if (st)
        goto fail;
    return px_ir_gguf_writer_finish(w, err);
fail:
    px_ir_gguf_writer_abort(w);
    return st;
}

typedef struct figures {
    double prefill_tps, decode_tps, bytes_per_token;
} figures;

static int measure(const px_rt_model *m, uint32_t threads, figures *f)
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = threads, .context = 128, .max_batch_tokens = 64};
    if (px_rt_session_new(m, &so, &s, &err) != PX_OK) {
        fprintf(stderr, "session: %s\n", err.msg);
        return 1;
    }
    int32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = 3 + (i * 37) % 250;
    int32_t seq;
    must(px_rt_seq_add(s, &seq, &err), "sequence");
    px_rt_output out;
    f->prefill_tps = 0;
    /* Run 0 is the warm-up (page faults on the mapped weights). */
    for (int run = 0; run < 3; run++) {
        px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = 64, .tokens = prompt};
        uint64_t t0 = px_now_ns();
        if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err)) {
            fprintf(stderr, "prefill: %s\n", err.msg);
            px_rt_session_free(s);
            return 1;
        }
        double tps = 64.0 / ((double)(px_now_ns() - t0) / 1e9);
        if (run > 0 && tps > f->prefill_tps)
            f->prefill_tps = tps;
    }
    int32_t tok = px_rt_argmax(out.data, out.row_len);
    enum { WARM = 2, STEPS = 12 };
    uint64_t t0 = 0;
    for (int i = 0; i < WARM + STEPS; i++) {
        if (i == WARM)
            t0 = px_now_ns();
        px_rt_seq_step st = {.seq = seq, .pos = 64 + (uint32_t)i, .n_tokens = 1, .tokens = &tok};
        if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err)) {
            fprintf(stderr, "decode: %s\n", err.msg);
            px_rt_session_free(s);
            return 1;
        }
        tok = px_rt_argmax(out.data, out.row_len);
    }
    f->decode_tps = STEPS / ((double)(px_now_ns() - t0) / 1e9);
    f->bytes_per_token = decode_bytes(m, 64 + WARM + STEPS / 2);
    px_rt_session_free(s);
    return 0;
}

static void tiny_model(void)
{
    const char *shared = getenv("PX_SHARED_DIR");
#ifdef PX_SHARED_DIR
    if (!shared)
        shared = PX_SHARED_DIR;
#endif
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.bin", shared ? shared : "../shared");
    if (access(path, R_OK) != 0) {
        printf("stories260K: skipped (%s is absent)\n", path);
        return;
    }
    px_err err;
    px_rt_model *m;
    if (px_rt_model_open(path, &m, &err) != PX_OK) {
        printf("stories260K: %s\n", err.msg);
        return;
    }
    for (uint32_t threads = 1; threads <= 2; threads++) {
        px_rt_session *s;
        if (px_rt_session_new(m, &(px_rt_session_opts){.n_threads = threads}, &s, &err))
            break;
        int32_t seq, tok = 1;
        must(px_rt_seq_add(s, &seq, &err), "sequence");
        px_rt_output out;
        uint64_t t0 = px_now_ns();
        uint32_t n = 400;
        for (uint32_t p = 0; p < n; p++) {
            px_rt_seq_step st = {.seq = seq, .pos = p, .n_tokens = 1, .tokens = &tok};
            if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err))
                break;
            tok = px_rt_argmax(out.data, out.row_len);
        }
        double tps = n / ((double)(px_now_ns() - t0) / 1e9);
        printf("stories260K (real, f32, 260K parameters): %u thread%s: %.0f tokens/s greedy "
               "decode over %u positions\n",
               threads, threads == 1 ? " " : "s", tps, n);
        px_rt_session_free(s);
    }
    px_rt_model_free(m);
}

/* Prints the machine's load: figures taken while other processes compete
 * for the cores (and the memory bus) are lower than the hardware's. */
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
    double bw[3] = {0};
    for (int t = 1; t <= 2; t++) {
        bw[t] = triad(t);
        printf("memory bandwidth (triad, best of %d): %d thread%s: %.2f GB/s\n", TRIAD_RUNS, t,
               t == 1 ? " " : "s", bw[t] / 1e9);
    }

    char dir[512];
    const char *env = getenv("PX_BENCH_DIR");
    bool own_dir = !env;
    if (env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/plexus-bench-rt-XXXXXX", tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            return 1;
        }
    }
    static const px_dtype types[] = {PX_DTYPE_F32, PX_DTYPE_F16, PX_DTYPE_Q8_0};
    int rc = 0;
    for (size_t ti = 0; ti < 3 && rc == 0; ti++) {
        char path[600];
        snprintf(path, sizeof path, "%s/bench-rt-%s.gguf", dir, px_dtype_name(types[ti]));
        px_err err;
        uint64_t t0 = px_now_ns();
        px_rt_model *m = NULL;
        if (write_model(path, types[ti], &err) != PX_OK || px_rt_model_open(path, &m, &err)) {
            fprintf(stderr, "bench_rt_decode: %s\n", err.msg);
            rc = 1;
            remove(path);
            break;
        }
        struct stat sb;
        stat(path, &sb);
        printf("\nsynthetic llama, %s: %.0f MB (dim 1024, hidden 2816, 10 layers, 16 heads, "
               "4 kv heads, vocab 16000; written in %.1f s)\n",
               px_dtype_name(types[ti]), (double)sb.st_size / 1e6,
               (double)(px_now_ns() - t0) / 1e9);
        for (uint32_t threads = 1; threads <= 2 && rc == 0; threads++) {
            figures f;
            if ((rc = measure(m, threads, &f)) != 0)
                break;
            double achieved = f.bytes_per_token * f.decode_tps;
            printf("  %u thread%s: prefill %.1f tokens/s (64-token prompt); decode %.2f "
                   "tokens/s = %.2f GB/s of weights+KV, %.0f%% of the triad bound "
                   "(%.2f tokens/s)\n",
                   threads, threads == 1 ? " " : "s", f.prefill_tps, f.decode_tps, achieved / 1e9,
                   100.0 * achieved / bw[threads], bw[threads] / f.bytes_per_token);
        }
        px_rt_model_free(m);
        remove(path);
    }
    if (own_dir)
        rmdir(dir);
    printf("\n");
    tiny_model();
    print_load("at end");
    return rc;
}
