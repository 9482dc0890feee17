/* Discovery: short microbenchmarks run on request (--measure): memory
 * bandwidth with a STREAM-like triad and f32 throughput with a
 * register-blocked multiply-add loop, on one thread and on all. */
#include "hw/discover_impl.h"

#include <pthread.h>

/* The kernels are compiled with optimization even in debug builds: what
 * they report is the machine's rate, not the build's.  Clang has no
 * per-function optimize attribute and is optimized by its build type. */
#if defined(__GNUC__) && !defined(__clang__)
#define PX_HOT __attribute__((optimize("O3", "fp-contract=fast")))
#else
#define PX_HOT
#endif

/* ------------------------------------------------------------------ */
/* Threads in lock step                                                */
/* ------------------------------------------------------------------ */

/* The calling thread is worker 0; the others wait at `start`, run their
 * share of one repetition and meet at `end`, so the caller times whole
 * repetitions from start to end. */
typedef struct team {
    pthread_barrier_t start, end;
    /* Workers wait at the gate until every one of them has started (go)
     * or one could not be (abort): the barriers count all of them. */
    pthread_mutex_t gate;
    pthread_cond_t gate_cond;
    bool go, abort;
    bool stop;
    unsigned n;
    void (*work)(struct team *t, unsigned worker);
    /* What the repetitions after the warm-up run (NULL: work again); set
     * by the caller between barriers, never by a worker. */
    void (*then)(struct team *t, unsigned worker);
    void *ctx;
} team;

typedef struct worker_arg {
    team *t;
    unsigned id;
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg *a = p;
    pthread_mutex_lock(&a->t->gate);
    while (!a->t->go && !a->t->abort)
        pthread_cond_wait(&a->t->gate_cond, &a->t->gate);
    bool abort_ = a->t->abort;
    pthread_mutex_unlock(&a->t->gate);
    if (abort_)
        return NULL;
    for (;;) {
        pthread_barrier_wait(&a->t->start);
        if (a->t->stop)
            break;
        a->t->work(a->t, a->id);
        pthread_barrier_wait(&a->t->end);
    }
    return NULL;
}

/* Runs one repetition on every worker and returns its time in seconds. */
static double team_rep(team *t)
{
    uint64_t t0 = px_now_ns();
    pthread_barrier_wait(&t->start);
    t->work(t, 0);
    pthread_barrier_wait(&t->end);
    return (double)(px_now_ns() - t0) * 1e-9;
}

/* Repeats until `seconds` have passed (at least twice, for a spread; at
 * most 1000 times) after one warm-up, and reports the best and worst
 * rates for `units` of work per repetition. */
static px_status team_run(team *t, double units, double seconds, px__bench_result *out, px_err *err)
{
    pthread_t *th = calloc(t->n, sizeof *th);
    worker_arg *args = calloc(t->n, sizeof *args);
    unsigned started = 1;
    px_status st = PX_OK;
    if (!th || !args) {
        st = px_err_set(err, PX_ENOMEM, "out of memory starting %u threads", t->n);
        goto done_alloc;
    }
    if (pthread_barrier_init(&t->start, NULL, t->n)) {
        st = px_err_set(err, PX_EIO, "cannot create a thread barrier");
        goto done_alloc;
    }
    if (pthread_barrier_init(&t->end, NULL, t->n)) {
        pthread_barrier_destroy(&t->start);
        st = px_err_set(err, PX_EIO, "cannot create a thread barrier");
        goto done_alloc;
    }
    pthread_mutex_init(&t->gate, NULL);
    pthread_cond_init(&t->gate_cond, NULL);
    t->stop = t->go = t->abort = false;
    for (; started < t->n; started++) {
        args[started] = (worker_arg){t, started};
        if (pthread_create(&th[started], NULL, worker_main, &args[started]) != 0)
            break;
    }
    pthread_mutex_lock(&t->gate);
    t->go = started == t->n;
    t->abort = !t->go;
    pthread_cond_broadcast(&t->gate_cond);
    pthread_mutex_unlock(&t->gate);
    if (t->abort) {
        st = px_err_set(err, PX_EIO, "cannot start thread %u of %u", started, t->n);
        goto done_threads;
    }
    team_rep(t); /* warm-up: page faults, clocks ramping, caches */
    if (t->then)
        t->work = t->then; /* every worker waits at the start barrier */
    out->best = 0;
    out->worst = INFINITY;
    out->reps = 0;
    double spent = 0;
    while ((out->reps < 2 || spent < seconds) && out->reps < 1000) {
        double s = team_rep(t);
        spent += s;
        double rate = units / PX_MAX(s, 1e-9);
        out->best = PX_MAX(out->best, rate);
        out->worst = PX_MIN(out->worst, rate);
        out->reps++;
    }
    out->threads = t->n;
    t->stop = true;
    pthread_barrier_wait(&t->start);
done_threads:
    for (unsigned i = 1; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&t->gate_cond);
    pthread_mutex_destroy(&t->gate);
    pthread_barrier_destroy(&t->start);
    pthread_barrier_destroy(&t->end);
done_alloc:
    free(th);
    free(args);
    return st;
}

/* ------------------------------------------------------------------ */
/* Triad: a[i] = b[i] + s * c[i]                                       */
/* ------------------------------------------------------------------ */

typedef struct triad {
    double *a, *b, *c;
    size_t n;
} triad;

PX_HOT static void triad_work(team *t, unsigned w)
{
    triad *tr = t->ctx;
    size_t lo = tr->n * w / t->n, hi = tr->n * (w + 1) / t->n;
    double *restrict a = tr->a;
    const double *restrict b = tr->b, *restrict c = tr->c;
    const double s = 3.0;
    for (size_t i = lo; i < hi; i++)
        a[i] = b[i] + s * c[i];
}

static void triad_init(team *t, unsigned w)
{
    /* Each worker touches its own share first, so on NUMA machines the
     * pages land on the node of the thread that streams them. */
    triad *tr = t->ctx;
    size_t lo = tr->n * w / t->n, hi = tr->n * (w + 1) / t->n;
    for (size_t i = lo; i < hi; i++) {
        tr->a[i] = 0;
        tr->b[i] = 1;
        tr->c[i] = 2;
    }
}

px_status px__bench_triad(unsigned threads, size_t array_bytes, double seconds,
                          px__bench_result *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    size_t n = array_bytes / sizeof(double);
    if (threads < 1 || n < 1024)
        return px_err_set(err, PX_EINVAL, "triad: %zu bytes per array is too small", array_bytes);
    triad tr = {.n = n};
    tr.a = malloc(n * sizeof(double));
    tr.b = malloc(n * sizeof(double));
    tr.c = malloc(n * sizeof(double));
    px_status st;
    if (!tr.a || !tr.b || !tr.c) {
        st = px_err_set(err, PX_ENOMEM, "triad: cannot allocate 3 x %zu MiB", array_bytes >> 20);
    } else {
        team t = {.n = threads, .work = triad_init, .then = triad_work, .ctx = &tr};
        /* STREAM counts two reads and one write per element. */
        st = team_run(&t, 3.0 * (double)n * sizeof(double), seconds, out, err);
        out->bytes = n * sizeof(double);
    }
    free(tr.a);
    free(tr.b);
    free(tr.c);
    return st;
}

/* ------------------------------------------------------------------ */
/* f32 multiply-add                                                    */
/* ------------------------------------------------------------------ */

/* Twelve independent vector accumulators hide the latency of the
 * multiply-add unit (4 cycles, two units on most cores) and fit in the
 * sixteen registers of SSE and AVX2.  a = a * x + y converges to 1, so
 * the values stay normal. */
#define FMA_KERNEL(NAME, ATTR, BYTES)                                               \
    typedef float NAME##_vec __attribute__((vector_size(BYTES)));                   \
    ATTR PX_HOT static double NAME(uint64_t iters)                                  \
    {                                                                               \
        NAME##_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0};      \
        NAME##_vec a6 = {0}, a7 = {0}, a8 = {0}, a9 = {0}, a10 = {0}, a11 = {0};    \
        NAME##_vec x = a0 + 0.999f, y = a0 + 0.001f;                                \
        a1 += 0.1f, a2 += 0.2f, a3 += 0.3f, a4 += 0.4f, a5 += 0.5f, a6 += 0.6f;     \
        a7 += 0.7f, a8 += 0.8f, a9 += 0.9f, a10 += 1.1f, a11 += 1.2f;               \
        for (uint64_t i = 0; i < iters; i++) {                                      \
            a0 = a0 * x + y, a1 = a1 * x + y, a2 = a2 * x + y, a3 = a3 * x + y;     \
            a4 = a4 * x + y, a5 = a5 * x + y, a6 = a6 * x + y, a7 = a7 * x + y;     \
            a8 = a8 * x + y, a9 = a9 * x + y, a10 = a10 * x + y, a11 = a11 * x + y; \
        }                                                                           \
        NAME##_vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11; \
        double sum = 0;                                                             \
        for (size_t k = 0; k < BYTES / sizeof(float); k++)                          \
            sum += s[k];                                                            \
        return sum;                                                                 \
    }

#if defined(__x86_64__) && defined(__GNUC__)
FMA_KERNEL(fma_avx512, __attribute__((target("avx512f,fma"))), 64)
FMA_KERNEL(fma_avx2, __attribute__((target("avx2,fma"))), 32)
#endif
FMA_KERNEL(fma_base, , 16)

typedef struct fma_ctx {
    double (*kernel)(uint64_t);
    uint64_t iters;
    double sink[256];
} fma_ctx;

static void fma_work(team *t, unsigned w)
{
    fma_ctx *c = t->ctx;
    c->sink[w % 256] += c->kernel(c->iters);
}

/* The widest code path this CPU runs, and the f32 lanes it has. */
static double (*pick_kernel(const char **name, unsigned *lanes))(uint64_t)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
        *name = "avx512f+fma";
        *lanes = 16;
        return fma_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *name = "avx2+fma";
        *lanes = 8;
        return fma_avx2;
    }
#endif
    *name = "128-bit";
    *lanes = 4;
    return fma_base;
}

px_status px__bench_fma(unsigned threads, double seconds, px__bench_result *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (threads < 1)
        return px_err_set(err, PX_EINVAL, "fma: no threads");
    const char *path;
    unsigned lanes;
    fma_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    c->kernel = pick_kernel(&path, &lanes);
    /* Size one repetition to about a tenth of the budget. */
    uint64_t probe = 100000;
    uint64_t t0 = px_now_ns();
    c->sink[0] += c->kernel(probe);
    double per_iter = PX_MAX((double)(px_now_ns() - t0) * 1e-9 / (double)probe, 1e-12);
    double want = PX_MAX(seconds / 10, 0.002) / per_iter;
    c->iters = (uint64_t)PX_MIN(PX_MAX(want, 1000.0), 1e10);
    team t = {.n = threads, .work = fma_work, .ctx = c};
    double flops = 2.0 * 12 * lanes * (double)c->iters * threads;
    px_status st = team_run(&t, flops, seconds, out, err);
    free(c);
    return st;
}

/* ------------------------------------------------------------------ */
/* The probe                                                           */
/* ------------------------------------------------------------------ */

static const char *fma_path_name(void)
{
    const char *name;
    unsigned lanes;
    pick_kernel(&name, &lanes);
    return name;
}

px_status px__disc_probe_measure(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    const px_hw_discover_options *o = d->opt;
    if (!o->measure)
        return px__disc_record(d, "measure", PX__PROBE_SKIPPED, NULL, t0, NULL,
                               "not requested (pass --measure)");
    double secs = o->measure_seconds > 0 ? o->measure_seconds : 0.5;
    unsigned threads = d->n_threads ? d->n_threads : 1;
    size_t bytes = o->measure_bytes;
    if (!bytes) {
        uint64_t b = d->llc_bytes * 4;
        b = PX_MAX(b, (uint64_t)64 << 20);
        b = PX_MIN(b, (uint64_t)512 << 20); /* three arrays, 1.5 GiB at most */
        if (d->mem_available)
            b = PX_MIN(b, d->mem_available / 8); /* three arrays: under half of it */
        bytes = (size_t)b;
    }
    json_t *x = json_object();
    if (!x)
        return PX_ENOMEM;
    if (px_json_set(d->cpu ? d->cpu : d->node, "x-measure", x) != PX_OK)
        return PX_ENOMEM;
    char problems[2 * PX_ERR_MSG_MAX + 64] = "";
    char src[256];
    px__bench_result r;
    px_err err;

    px_status st = px__bench_triad(threads, bytes, secs, &r, &err);
    if (st != PX_OK) {
        snprintf(problems, sizeof problems, "triad: %s", err.msg);
    } else {
        snprintf(src, sizeof src,
                 "plexus inventory discover --measure (triad, %zu MiB per array, %u threads, "
                 "best of %u)",
                 r.bytes >> 20, r.threads, r.reps);
        json_t *q = px__disc_qty_interval(d, r.best, PX_DIM_BANDWIDTH, PX_PROV_MEASURED, src,
                                          r.worst, r.best);
        json_t *q2 = px__disc_qty_interval(d, r.best, PX_DIM_BANDWIDTH, PX_PROV_MEASURED, src,
                                           r.worst, r.best);
        if (px_json_set(x, "triad", q) != PX_OK)
            return PX_ENOMEM;
        if (d->ddr) {
            if (px_json_set(d->ddr, "bandwidth", q2) != PX_OK)
                return PX_ENOMEM;
        } else {
            json_decref(q2);
        }
    }

    const char *path = fma_path_name();
    for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
        st = px__bench_fma(k == 0 ? 1 : threads, secs, &r, &err);
        if (st != PX_OK) {
            size_t len = strlen(problems);
            snprintf(problems + len, sizeof problems - len, "%sf32 loop: %s", len ? "; " : "",
                     err.msg);
            break;
        }
        snprintf(src, sizeof src,
                 "plexus inventory discover --measure (f32 multiply-add loop, %s code path, %u "
                 "threads, best of %u)",
                 path, r.threads, r.reps);
        json_t *q =
            px__disc_qty_interval(d, r.best, PX_DIM_FLOPS, PX_PROV_MEASURED, src, r.worst, r.best);
        if (px_json_set(x, k == 0 ? "f32_one_thread" : "f32_all_threads", q) != PX_OK)
            return PX_ENOMEM;
        if ((k == 1 || threads == 1) && d->cpu) {
            json_t *compute = json_object_get(d->cpu, "compute");
            if (!compute && px_json_set(d->cpu, "compute", compute = json_object()) != PX_OK)
                return PX_ENOMEM;
            json_t *q2 = px__disc_qty_interval(d, r.best, PX_DIM_FLOPS, PX_PROV_MEASURED, src,
                                               r.worst, r.best);
            if (px_json_set(compute, "f32", q2) != PX_OK)
                return PX_ENOMEM;
        }
    }
    if (problems[0]) {
        if (px__disc_warn(d, "measure", NULL, "%s", problems) != PX_OK)
            return PX_ENOMEM;
    }
    json_t *jt = json_object_get(x, "triad");
    const char *f1 =
        json_string_value(json_object_get(json_object_get(x, "f32_one_thread"), "value"));
    const char *fn =
        json_string_value(json_object_get(json_object_get(x, "f32_all_threads"), "value"));
    return px__disc_record(d, "measure", problems[0] ? PX__PROBE_PARTIAL : PX__PROBE_OK,
                           "plexus inventory discover --measure", t0, NULL,
                           "triad %s; f32 %s on one thread, %s on %u threads%s%s",
                           jt ? json_string_value(json_object_get(jt, "value")) : "not run",
                           f1 ? f1 : "not run",
                           fn   ? fn
                           : f1 ? f1
                                : "not run",
                           threads, problems[0] ? "; " : "", problems);
}
