/*
 * Decode and prefill speed of the cpu backend, against this machine's
 * memory bandwidth and against llama.cpp on the same model.
 *
 * 1. Measures the read bandwidth of memory: threads summing disjoint
 *    parts of a 512 MiB array (far larger than the caches), best of
 *    several runs, with 1 and 2 threads.  Decode reads the weights once
 *    per token and writes little, so this is its bound.
 * 2. Writes the 136 M-parameter synthetic llama that `plexus model synth
 *    --dim 1024 --hidden 2816 --layers 12 --heads 16 --kv-heads 4 --vocab
 *    512 --context 512 --seed 1 --dtype D` writes (the same library call),
 *    in f32, f16 and q8_0, and the f32 file quantized by `plexus model
 *    quantize --type T` (the same library call) for q4_k_m, q4_0, q5_k_m
 *    and q6_k, into bench-models/ beside this program (the build folder),
 *    once: later runs reuse the files.
 * 3. For each, with 1 and 2 threads, three runs of a fresh sequence:
 *    prefill of a 65-token prompt in one step (tokens/s, best of the last
 *    two: the first faults the mapped weights in), then greedy decode of
 *    32 tokens (tokens/s of the median step of the three runs' 96: the
 *    neighbours' bursts on a shared machine hit a run, not most steps), the bytes a
 *    decode step reads (every weight but the embedding table, one row of
 *    it, and the KV cache), the bandwidth that reaches and its fraction of
 *    the measured read bandwidth, and the ratios to llama.cpp's figures
 *    on the same file (LLAMA_CPP below; "no anchor" where none was
 *    measured).  PX_BENCH_DTYPES=q4_0,q4_K_M (names as the table prints
 *    them, any case, comma-separated) runs those rows alone.
 * 4. Runs step 3 again in a child process whose environment lacks every
 *    OPENBLAS_* variable, when this one has some: the figures must not
 *    depend on them.
 * 5. Tokens/s of the real tiny model (stories260K) when ../shared/models
 *    holds it.
 *
 * The machine's load is printed at the start and the end: figures taken
 * while other processes compete for the cores are lower than the
 * hardware's, so compare ratios within one run.
 */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_bandwidth.h"
#include "bench_models.h"
#include "plexus/ir.h"
#include "plexus/rt.h"

extern char **environ;

#define READ_BYTES ((size_t)512 << 20)
#define READ_RUNS  5

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

/* llama.cpp (llama-bench -p 64 -n 32, CPU build, no BLAS) on the same
 * synthetic model file, measured side by side with plexus on the 2-core
 * AMD EPYC (Zen 5) development machine, quiet, in December 2026: decode
 * and prompt tokens/s. */
static const struct anchor {
    px_dtype dtype;
    uint32_t threads;
    double decode, prefill;
} LLAMA_CPP[] = {
    {PX_DTYPE_F32, 1, 42.1, 409},  {PX_DTYPE_F32, 2, 70.4, 432}, {PX_DTYPE_F16, 1, 75.1, 404},
    {PX_DTYPE_F16, 2, 131.0, 885}, {PX_DTYPE_Q8_0, 1, 104, 307}, {PX_DTYPE_Q8_0, 2, 175, 593},
    {PX_DTYPE_Q4_K, 1, 240, 546},  {PX_DTYPE_Q4_K, 2, 308, 958},
};

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

/* A row of the table: a file written by synth (recipe NULL) or quantized
 * from the f32 file with a recipe of `plexus model quantize`. */
typedef struct bench_format {
    const char *name; /* as the table prints it */
    px_dtype dtype;   /* synth's dtype, or the recipe's main format (anchors) */
    const char *recipe;
} bench_format;

static const bench_format FORMATS[] = {
    {"f32", PX_DTYPE_F32, NULL},     {"f16", PX_DTYPE_F16, NULL},
    {"q8_0", PX_DTYPE_Q8_0, NULL},   {"q4_K_M", PX_DTYPE_Q4_K, "q4_k_m"},
    {"q4_0", PX_DTYPE_Q4_0, "q4_0"}, {"q5_K_M", PX_DTYPE_Q5_K, "q5_k_m"},
    {"q6_K", PX_DTYPE_Q6_K, "q6_k"},
};

/* The model file of format f in dir, written unless already there. */
static int synth_model(const char *dir, const bench_format *f, char *path, size_t cap)
{
    snprintf(path, cap, "%s/synth136m-%s.gguf", dir, f->recipe ? f->recipe : f->name);
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_size > 50000000)
        return 0;
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    px_err err;
    uint64_t t0 = px_now_ns();
    if (f->recipe) {
        char src[1200];
        if (synth_model(dir, &FORMATS[0], src, sizeof src))
            return 1;
        if (px_rt_quantize_file(src, tmp, f->recipe, NULL, &err) != PX_OK ||
            rename(tmp, path) != 0) {
            fprintf(stderr, "bench_rt_decode: quantizing %s: %s\n", path, err.msg);
            remove(tmp);
            return 1;
        }
        printf("(wrote %s in %.1f s)\n", path, (double)(px_now_ns() - t0) / 1e9);
        return 0;
    }
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 1024;
    o.hidden_dim = 2816;
    o.n_layers = 12;
    o.n_heads = 16;
    o.n_kv_heads = 4;
    o.vocab_size = 512;
    o.context_length = 512;
    o.seed = 1;
    o.dtype = f->dtype;
    if (px_ir_synth_write(&o, tmp, &err) != PX_OK || rename(tmp, path) != 0) {
        fprintf(stderr, "bench_rt_decode: writing %s: %s\n", path, err.msg);
        remove(tmp);
        return 1;
    }
    printf("(wrote %s in %.1f s)\n", path, (double)(px_now_ns() - t0) / 1e9);
    return 0;
}

/* Whether PX_BENCH_DTYPES (unset: every row) names the row `name`. */
static bool selected(const char *name)
{
    const char *list = getenv("PX_BENCH_DTYPES");
    if (!list || !list[0])
        return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncasecmp(p, name, n) == 0)
            return true;
        p += len + (e ? 1 : 0);
    }
    return false;
}

typedef struct figures {
    double prefill_tps, decode_tps, bytes_per_token;
} figures;

enum { PROMPT = 65, DECODE_STEPS = 32, DECODE_WARM = 3 };

/* One run of a fresh sequence: the prompt in one step, then DECODE_WARM + DECODE_STEPS greedy
 * steps; the prefill's tokens/s and the timed steps' times (ns).  Returns nonzero on failure. */
static int run_once(px_rt_session *s, double *prefill_tps, double *step_ns)
{
    px_err err;
    int32_t prompt[PROMPT], seq;
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = 3 + (i * 37) % 250;
    must(px_rt_seq_add(s, &seq, &err), "sequence");
    px_rt_output out;
    px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = PROMPT, .tokens = prompt};
    uint64_t t0 = px_now_ns();
    if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err)) {
        fprintf(stderr, "prefill: %s\n", err.msg);
        return 1;
    }
    *prefill_tps = PROMPT / ((double)(px_now_ns() - t0) / 1e9);
    int32_t tok = px_rt_argmax(out.data, out.row_len);
    for (int i = 0; i < DECODE_WARM + DECODE_STEPS; i++) {
        t0 = px_now_ns();
        st = (px_rt_seq_step){
            .seq = seq, .pos = PROMPT + (uint32_t)i, .n_tokens = 1, .tokens = &tok};
        if (px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err)) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
        tok = px_rt_argmax(out.data, out.row_len);
        if (i >= DECODE_WARM)
            step_ns[i - DECODE_WARM] = (double)(px_now_ns() - t0);
    }
    must(px_rt_seq_remove(s, seq, &err), "sequence");
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prefill: the best of the runs after the first (whose step faults the mapped weights in), as
 * the read bandwidth is the best of its runs.  Decode: the median of the RUNS * DECODE_STEPS
 * steps' times.  On this shared machine neighbours take the memory in bursts of a fraction of
 * a second: a run of 32 steps (0.7 s of f32) rarely misses them all, while the bandwidth's
 * reads (20 ms each) do; the median step is the kernels' time, the bursts' steps beyond it. */
static int measure(const px_rt_model *m, uint32_t threads, figures *f)
{
    enum { RUNS = 3 };
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = threads, .context = 256, .max_batch_tokens = PROMPT};
    if (px_rt_session_new(m, &so, &s, &err) != PX_OK) {
        fprintf(stderr, "session: %s\n", err.msg);
        return 1;
    }
    f->prefill_tps = 0;
    double steps[RUNS * DECODE_STEPS];
    for (int run = 0; run < RUNS; run++) {
        double pf;
        if (run_once(s, &pf, steps + run * DECODE_STEPS)) {
            px_rt_session_free(s);
            return 1;
        }
        if (run > 0)
            f->prefill_tps = PX_MAX(f->prefill_tps, pf);
    }
    qsort(steps, RUNS * DECODE_STEPS, sizeof steps[0], cmp_double);
    f->decode_tps = 1e9 / steps[RUNS * DECODE_STEPS / 2];
    f->bytes_per_token = decode_bytes(m, PROMPT + DECODE_WARM + DECODE_STEPS / 2);
    px_rt_session_free(s);
    return 0;
}

static const struct anchor *anchor_for(px_dtype t, uint32_t threads)
{
    for (size_t i = 0; i < sizeof LLAMA_CPP / sizeof LLAMA_CPP[0]; i++)
        if (LLAMA_CPP[i].dtype == t && LLAMA_CPP[i].threads == threads)
            return &LLAMA_CPP[i];
    return NULL;
}

/* The ratio column: plexus / llama.cpp, or "no anchor". */
static void ratio(char *out, size_t cap, double plexus, double anchor)
{
    if (anchor > 0)
        snprintf(out, cap, "%.2f", plexus / anchor);
    else
        snprintf(out, cap, "no anchor");
}

/* Step 3 for every selected format: returns nonzero on failure. */
static int model_figures(const char *dir, const double bw[3])
{
    printf("136 M synthetic llama (dim 1024, hidden 2816, 12 layers, 16 heads, 4 kv heads, "
           "vocab 512): prefill of %d tokens, greedy decode of %d\n",
           PROMPT, DECODE_STEPS);
    printf("%-6s %3s %9s %9s %9s %9s %8s %8s %6s\n", "dtype", "thr", "prefill/s", "x l.cpp",
           "decode/s", "x l.cpp", "MB/token", "GB/s", "of bw");
    size_t n_run = 0;
    for (size_t fi = 0; fi < sizeof FORMATS / sizeof FORMATS[0]; fi++) {
        const bench_format *bf = &FORMATS[fi];
        if (!selected(bf->name))
            continue;
        n_run++;
        char path[1200];
        if (synth_model(dir, bf, path, sizeof path))
            return 1;
        px_err err;
        px_rt_model *m = NULL;
        if (px_rt_model_open(path, &m, &err)) {
            fprintf(stderr, "bench_rt_decode: %s\n", err.msg);
            return 1;
        }
        for (uint32_t threads = 1; threads <= 2; threads++) {
            figures f;
            if (measure(m, threads, &f)) {
                px_rt_model_free(m);
                return 1;
            }
            const struct anchor *a = anchor_for(bf->dtype, threads);
            double reached = f.bytes_per_token * f.decode_tps;
            char rp[16], rd[16];
            ratio(rp, sizeof rp, f.prefill_tps, a ? a->prefill : 0);
            ratio(rd, sizeof rd, f.decode_tps, a ? a->decode : 0);
            printf("%-6s %3u %9.1f %9s %9.1f %9s %8.1f %8.2f %5.0f%%\n", bf->name, threads,
                   f.prefill_tps, rp, f.decode_tps, rd, f.bytes_per_token / 1e6, reached / 1e9,
                   100.0 * reached / bw[threads]);
        }
        px_rt_model_free(m);
    }
    if (n_run == 0) {
        fprintf(stderr,
                "bench_rt_decode: PX_BENCH_DTYPES=%s names no row; the rows are f32, "
                "f16, q8_0, q4_K_M, q4_0, q5_K_M, q6_K\n",
                getenv("PX_BENCH_DTYPES"));
        return 1;
    }
    printf("(x l.cpp: plexus / llama.cpp on the same file, \"no anchor\" where llama.cpp's "
           "figure was not measured; of bw: the bytes a decode step reads times tokens/s, over "
           "the measured read bandwidth at the same thread count)\n");
    return 0;
}

/* Runs this program again for step 3 alone, without OPENBLAS_*. */
static int without_openblas_env(const char *self)
{
    size_t n = 0;
    for (char **e = environ; *e; e++)
        n++;
    char **env = calloc(n + 2, sizeof *env);
    if (!env)
        return 1;
    size_t k = 0;
    bool had = false;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "OPENBLAS_", 9) == 0)
            had = true;
        else
            env[k++] = *e;
    }
    if (!had) {
        free(env);
        printf("\n(no OPENBLAS_* variable in the environment: the figures above are without "
               "them)\n");
        return 0;
    }
    env[k++] = "PX_BENCH_MODELS_ONLY=1";
    env[k] = NULL;
    printf("\nThe same without the OPENBLAS_* variables (a child process):\n");
    fflush(stdout);
    pid_t pid;
    char *argv[] = {(char *)self, NULL};
    int rc = posix_spawn(&pid, self, NULL, NULL, argv, env);
    free(env);
    if (rc != 0)
        return 1;
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
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
    char self[1024], dir[1100];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self[len] = 0;
    if (!bench_models_dir(dir, sizeof dir))
        return 1;
    mkdir(dir, 0755);
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool models_only = getenv("PX_BENCH_MODELS_ONLY") != NULL;
    print_load("at start");
    double bw[3] = {0};
    for (int t = 1; t <= 2; t++) {
        bw[t] = bench_read_bandwidth(t, READ_BYTES, READ_RUNS);
        printf("memory read bandwidth (best of %d): %d thread%s: %.2f GB/s\n", READ_RUNS, t,
               t == 1 ? " " : "s", bw[t] / 1e9);
    }
    int rc = model_figures(dir, bw);
    if (!models_only) {
        if (rc == 0)
            rc = without_openblas_env(self);
        printf("\n");
        tiny_model();
    }
    print_load("at end");
    return rc;
}
