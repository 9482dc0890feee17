/*
 * The block-quantized formats against f32: greedy agreement on
 * teacher-forced positions, as the q8_0 test does for stories260K.
 *
 * For each model, the f32 model's greedy continuation of 12 prompts (BOS,
 * the prompt, up to 120 tokens, within 128 positions) is fed back through
 * the quantized model in one prefill step; the figures are the fraction
 * of positions where the quantized model's arg-max equals the f32
 * model's, and the mean KL divergence of its next-token distribution from
 * f32's, with the weight bytes a token reads.
 *
 * 1. ../shared/models/quant: the synthetic model in every recipe, made by
 *    the reference quantizer (the bench says so and stops when the folder
 *    is absent).
 * 2. stories260K (a trained model) quantized by px_rt_quantize_file.
 * 3. One matrix-vector product of a 4096 x 4096 matrix in each format, one
 *    thread, the kernels chosen at run time: weight GB/s streamed (best of
 *    7; the matrix, 8 to 67 MB, is larger than the caches).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"
#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

#define N_NEW 120

typedef struct loaded {
    px_ir_model *ir;
    px_rt_model *model;
    px_rt_tokenizer *tok;
} loaded;

static int load(const char *dir, const char *name, loaded *l)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    px_err err;
    if (px_ir_model_open(path, NULL, &l->ir, &err) || px_rt_model_new(l->ir, &l->model, &err) ||
        px_rt_tokenizer_new(px_ir_model_vocab(l->ir), &l->tok, &err)) {
        fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void unload(loaded *l)
{
    px_rt_tokenizer_free(l->tok);
    px_rt_model_free(l->model);
    px_ir_model_free(l->ir);
}

typedef struct collected {
    int32_t ids[N_NEW];
    size_t n;
} collected;

static void collect(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)prompt, (void)piece, (void)len;
    collected *c = ud;
    if (c->n < N_NEW)
        c->ids[c->n++] = token;
}

/* Greedy continuation; returns decode tokens/s (0 on failure). */
static double greedy(const loaded *l, const char *prompt, uint32_t n_new, uint32_t threads,
                     collected *c)
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = threads};
    if (px_rt_session_new(l->model, &so, &s, &err)) {
        fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
        return 0;
    }
    c->n = 0;
    px_rt_generate_opts go = {
        .prompts = &prompt, .n_prompts = 1, .max_new_tokens = n_new, .on_token = collect, .ud = c};
    px_rt_generate_stats st;
    px_status rc = px_rt_generate(s, l->tok, &go, &st, &err);
    px_rt_session_free(s);
    if (rc) {
        fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
        return 0;
    }
    return st.decode_ns ? (double)st.decode_tokens * 1e9 / (double)st.decode_ns : 0;
}

/* Every row's logits for seq, teacher-forced in one step (out: n rows of
 * vocab floats). */
static int logits_all(const loaded *l, const int32_t *seq, uint32_t n, float *out)
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = 2, .max_batch_tokens = n, .max_logit_rows = n};
    if (px_rt_session_new(l->model, &so, &s, &err))
        goto fail;
    int32_t id;
    if (px_rt_seq_add(s, &id, &err))
        goto fail_session;
    px_rt_seq_step step = {.seq = id, .pos = 0, .n_tokens = n, .tokens = seq};
    px_rt_batch b = {.n_seqs = 1, .seqs = &step};
    px_rt_forward_opts fo = {.layer_begin = 0,
                             .layer_end = px_rt_model_hparams(l->model)->n_layers,
                             .output = PX_RT_OUTPUT_LOGITS_ALL};
    px_rt_output o;
    if (px_rt_forward(s, &b, &fo, &o, &err))
        goto fail_session;
    memcpy(out, o.data, (size_t)n * o.row_len * sizeof(float));
    px_rt_session_free(s);
    return 0;
fail_session:
    px_rt_session_free(s);
fail:
    fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
    return -1;
}

static void softmax(const float *z, uint32_t n, double *p)
{
    double max = z[0], sum = 0;
    for (uint32_t i = 1; i < n; i++)
        max = fmax(max, z[i]);
    for (uint32_t i = 0; i < n; i++)
        sum += p[i] = exp(z[i] - max);
    for (uint32_t i = 0; i < n; i++)
        p[i] /= sum;
}

typedef struct agreement {
    uint64_t agree, total;
    double kl;
} agreement;

/* Teacher-forced comparison of model m against the reference logits ref
 * (N_PROMPTS sequences of MAX_SEQ rows of vocab). */
enum { N_PROMPTS = 12, MAX_SEQ = 128 };

static int compare(const loaded *m, int32_t seqs[][MAX_SEQ], const uint32_t *lens, const float *ref,
                   uint32_t vocab, agreement *a)
{
    float *got = malloc((size_t)MAX_SEQ * vocab * sizeof(float));
    double *p = malloc(vocab * sizeof(double)), *q = malloc(vocab * sizeof(double));
    int rc = got && p && q ? 0 : -1;
    memset(a, 0, sizeof *a);
    for (int i = 0; i < N_PROMPTS && rc == 0; i++) {
        if ((rc = logits_all(m, seqs[i], lens[i], got)))
            break;
        for (uint32_t j = 0; j < lens[i]; j++) {
            const float *x = ref + ((size_t)i * MAX_SEQ + j) * vocab, *y = got + (size_t)j * vocab;
            a->agree += px_rt_argmax(x, vocab) == px_rt_argmax(y, vocab);
            a->total++;
            softmax(x, vocab, p);
            softmax(y, vocab, q);
            for (uint32_t v = 0; v < vocab; v++)
                a->kl += p[v] * log(p[v] / q[v]);
        }
    }
    free(got);
    free(p);
    free(q);
    return rc;
}

/* The f32 model's greedy text for each prompt, and its logits at every
 * position of it (ref: N_PROMPTS * MAX_SEQ rows). */
static int reference(const loaded *f32, int32_t seqs[][MAX_SEQ], uint32_t *lens, float *ref)
{
    static const char *prompts[N_PROMPTS] = {
        "Once upon a time",  "The little dog",  "Lily and Ben",     "One day, a bird",
        "Tom had a red car", "The sun",         "Mom said",         "There was a big tree",
        "A cat and a mouse", "The boy was sad", "In the park, Sue", "Max liked to run"};
    uint32_t vocab = px_rt_model_hparams(f32->model)->vocab_size;
    uint32_t context = px_rt_model_hparams(f32->model)->context_length;
    uint32_t max = PX_MIN((uint32_t)MAX_SEQ, context);
    for (int i = 0; i < N_PROMPTS; i++) {
        collected c;
        greedy(f32, prompts[i], N_NEW, 2, &c);
        size_t n;
        px_err err;
        if (px_rt_tokenizer_encode(f32->tok, prompts[i], strlen(prompts[i]), PX_RT_ENCODE_BOS,
                                   seqs[i], max, &n, &err)) {
            fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
            return -1;
        }
        for (size_t j = 0; j < c.n && n < max; j++)
            seqs[i][n++] = c.ids[j];
        lens[i] = (uint32_t)n;
        if (logits_all(f32, seqs[i], lens[i], ref + (size_t)i * MAX_SEQ * vocab))
            return -1;
    }
    return 0;
}

static void weight_bytes(const loaded *m, uint64_t *bytes, uint64_t *n)
{
    *bytes = *n = 0;
    for (size_t t = 0; t < px_ir_model_n_tensors(m->ir); t++) {
        *bytes += px_ir_model_tensor(m->ir, t)->n_bytes;
        *n += px_ir_model_tensor(m->ir, t)->n_elems;
    }
}

static void row(const char *name, const loaded *m, const agreement *a)
{
    uint64_t bytes, n;
    weight_bytes(m, &bytes, &n);
    printf("%-26s %9.2f%% %14.5f %12.3f %12.2f\n", name,
           a ? 100.0 * (double)a->agree / (double)a->total : 100.0,
           a ? a->kl / (double)a->total : 0.0, (double)bytes / 1e6,
           8.0 * (double)bytes / (double)n);
}

static void header(void)
{
    printf("%-26s %10s %14s %12s %12s\n", "format", "agreement", "mean KL (nat)", "MB/token",
           "bits/weight");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Section 3: weight GB/s of one-thread matrix-vector products. */
static void matvec_speed(void)
{
    enum { K = 4096, N = 4096 };
    static const px_dtype types[] = {PX_DTYPE_F32,  PX_DTYPE_F16,  PX_DTYPE_Q8_0, PX_DTYPE_Q6_K,
                                     PX_DTYPE_Q5_K, PX_DTYPE_Q5_0, PX_DTYPE_Q4_K, PX_DTYPE_Q4_0,
                                     PX_DTYPE_Q3_K, PX_DTYPE_Q2_K};
    const px__rt_kernels *k = px__rt_kernels_avx2();
    if (!k)
        k = &px__rt_kernels_portable;
    float *row = malloc(K * sizeof(float)), *x = malloc(K * sizeof(float)), y[N];
    uint8_t *w = malloc((size_t)N * K * 4);
    if (!row || !x || !w)
        return;
    px_rng r;
    px_rng_seed(&r, 1);
    for (int j = 0; j < K; j++)
        x[j] = (float)px_rng_normal(&r);
    printf("\n3. one matrix-vector product, 4096 x 4096, 1 thread, %s kernels\n\n", k->name);
    printf("%-8s %12s %12s %14s\n", "format", "MB", "ms", "weight GB/s");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        px_dtype dt = types[t];
        size_t rb = (size_t)K / px_dtype_block_elems(dt) * px_dtype_block_bytes(dt);
        for (int i = 0; i < N; i++) {
            uint8_t *o = w + (size_t)i * rb;
            if (dt == PX_DTYPE_F32 || dt == PX_DTYPE_F16 || px__rt_quantize_supports(dt)) {
                for (int j = 0; j < K; j++)
                    row[j] = (float)(0.02 * px_rng_normal(&r));
                if (dt == PX_DTYPE_F32)
                    memcpy(o, row, rb);
                else if (dt == PX_DTYPE_F16)
                    for (int j = 0; j < K; j++) {
                        uint16_t h = px_f32_to_f16(row[j]);
                        memcpy(o + 2 * j, &h, 2);
                    }
                else
                    px__rt_quantize_row(dt, row, o, K);
            } else {
                /* Q2_K, Q3_K: no quantizer here; random blocks with small
                 * scales time the same. */
                for (size_t b = 0; b < rb; b++)
                    o[b] = (uint8_t)px_rng_next(&r);
                for (size_t b = 0; b < rb; b += px_dtype_block_bytes(dt)) {
                    uint16_t h = px_f32_to_f16(0.001f);
                    memcpy(o + b + px_dtype_block_bytes(dt) - 2, &h, 2);
                    if (dt == PX_DTYPE_Q2_K)
                        memcpy(o + b + 80, &h, 2);
                }
            }
        }
        double best = 1e9;
        for (int rep = 0; rep < 7; rep++) {
            double t0 = now_s();
            k->matvec(dt, w, rb, K, 0, N, x, K, 1, y, N);
            best = fmin(best, now_s() - t0);
        }
        double mb = (double)rb * N / 1e6;
        printf("%-8s %12.1f %12.3f %14.2f\n", px_dtype_name(dt), mb, best * 1e3, mb / 1e3 / best);
    }
    free(row);
    free(x);
    free(w);
}

int main(void)
{
    const char *shared = getenv("PX_SHARED_DIR");
    char dir[1100], models[1000];
    snprintf(models, sizeof models, "%s/models", shared ? shared : PX_SHARED_DIR);
    snprintf(dir, sizeof dir, "%s/quant", models);
    char f32_path[1200];
    snprintf(f32_path, sizeof f32_path, "%s/synth-f32.gguf", dir);
    if (access(f32_path, R_OK) != 0) {
        printf("skipped: %s is absent (the quantized reference models live in "
               "../shared/models/quant beside the checkout)\n",
               f32_path);
        return 0;
    }
    static int32_t seqs[N_PROMPTS][MAX_SEQ];
    uint32_t lens[N_PROMPTS];
    loaded f32;
    if (load(dir, "synth-f32.gguf", &f32))
        return 1;
    uint32_t vocab = px_rt_model_hparams(f32.model)->vocab_size;
    float *ref = malloc((size_t)N_PROMPTS * MAX_SEQ * vocab * sizeof(float));
    if (!ref || reference(&f32, seqs, lens, ref))
        return 1;
    uint32_t positions = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        positions += lens[i];
    printf("1. synthetic llama (dim 256, hidden 768, 2 layers, vocab 512, random N(0, 0.02) "
           "weights), the reference quantizer's files; %u teacher-forced positions of the f32 "
           "model's greedy text.  Random weights give flat distributions, so top-1 agreement is "
           "a hard test here; the KL divergence shows the error.\n\n",
           positions);
    header();
    row("f32", &f32, NULL);
    static const char *recipes[] = {"q6_k", "q5_k_m", "q5_0", "q4_k_m", "q4_0", "q3_k_m", "q2_k"};
    int status = 0;
    for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++) {
        char name[64];
        snprintf(name, sizeof name, "synth-%s.gguf", recipes[r]);
        loaded m;
        agreement a;
        if (load(dir, name, &m)) {
            status = 1;
            continue;
        }
        if (compare(&m, seqs, lens, ref, vocab, &a))
            status = 1;
        else
            row(recipes[r], &m, &a);
        unload(&m);
    }
    unload(&f32);
    free(ref);

    /* 2. A trained model: stories260K quantized here (dim 64: the
     * k-quant recipes fall back to 32-value blocks, so q8_0 and q4_0). */
    loaded s32;
    if (load(models, "stories260K.gguf", &s32))
        return 1;
    vocab = px_rt_model_hparams(s32.model)->vocab_size;
    ref = malloc((size_t)N_PROMPTS * MAX_SEQ * vocab * sizeof(float));
    if (!ref || reference(&s32, seqs, lens, ref))
        return 1;
    positions = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        positions += lens[i];
    printf("\n2. stories260K (trained; dim 64), quantized by plexus model quantize; %u "
           "teacher-forced positions.\n\n",
           positions);
    header();
    row("f32", &s32, NULL);
    static const char *small[] = {"q8_0", "q4_0"};
    const char *tmp = getenv("TMPDIR");
    for (size_t r = 0; r < 2; r++) {
        char in[1100], out[1200], name[64];
        snprintf(in, sizeof in, "%s/stories260K.gguf", models);
        snprintf(name, sizeof name, "bench-quant-%ld-%s.gguf", (long)getpid(), small[r]);
        snprintf(out, sizeof out, "%s/%s", tmp ? tmp : "/tmp", name);
        px_err err;
        loaded m;
        agreement a;
        if (px_rt_quantize_file(in, out, small[r], NULL, &err)) {
            fprintf(stderr, "bench_rt_quant: %s\n", err.msg);
            status = 1;
            continue;
        }
        if (load(tmp ? tmp : "/tmp", name, &m)) {
            status = 1;
        } else {
            if (compare(&m, seqs, lens, ref, vocab, &a))
                status = 1;
            else
                row(small[r], &m, &a);
            unload(&m);
        }
        remove(out);
    }
    unload(&s32);
    free(ref);
    matvec_speed();
    return status;
}
