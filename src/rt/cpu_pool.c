/*
 * The cpu backend's thread pool: persistent workers that take the parts
 * of each call from a shared counter, and a caller that returns when
 * every part is done.
 *
 * Parts are claimed, not assigned: whichever thread is running takes the
 * next part, so a worker the system has not scheduled yet (a busy
 * machine, a slow wake-up) delays nothing but the part it is in, and the
 * caller never waits for a worker that has no part.  Which thread runs a
 * part never changes its result: the callers' parts are fixed ranges of
 * outputs, each computed the same way by any thread.
 *
 * A decode step runs dozens of short calls, so waking workers through the
 * kernel each time would cost more than their share.  Both sides
 * therefore spin briefly (workers for the next call, the caller for the
 * last part) and only then sleep on a condition variable.  The spin is
 * short on purpose: when the machine has more runnable threads than
 * cores, a spinning thread only delays the one it waits for.  A thread
 * about to sleep counts itself first, and the other side signals, under
 * the mutex, only when someone sleeps.  The claim counter, the done count
 * and the caller's fields live on separate cache lines.
 */
#include "base/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "rt/rt_impl.h"

/* Polls before a thread sleeps: some tens of microseconds. */
#define SPIN_ITERS 4000

/* The part number of a closed call: past any call's parts. */
#define CLOSED 0x80000000u

struct px__rt_pool {
    uint32_t n;
    pthread_t *threads; /* n - 1 workers; the caller is thread 0 */
    uint32_t n_started;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a new call */
    pthread_cond_t done; /* its last part finished */
    _Atomic(px__rt_pool_fn) fn;
    _Atomic(void *) arg;
    _Atomic uint32_t n_parts;
    _Atomic bool stop;
    _Atomic uint32_t ready;    /* workers that have entered their loop */
    _Atomic uint32_t sleepers; /* threads asleep (or about to be) */
    /* The call's number (high 32 bits) and its next unclaimed part. */
    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) _Atomic uint32_t parts_done;
};

typedef struct worker_arg {
    px__rt_pool *pool;
    uint32_t ith;
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint32_t call_of(uint64_t claim)
{
    return (uint32_t)(claim >> 32);
}

/* Waits for a call other than `seen`; returns its number. */
static uint32_t wait_call(px__rt_pool *p, uint32_t seen)
{
    uint32_t g;
    for (int i = 0; i < SPIN_ITERS; i++) {
        g = call_of(atomic_load_explicit(&p->claim, memory_order_acquire));
        if (g != seen)
            return g;
        cpu_relax();
    }
    /* Counted as a sleeper before the last look: the caller publishes a
     * call before it looks at the count, so one of the two sees the
     * other. */
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = call_of(atomic_load(&p->claim))) == seen)
        pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return g;
}

/* Runs parts of call g on thread ith until none is left. */
static void run_parts(px__rt_pool *p, uint32_t g, uint32_t ith)
{
    for (;;) {
        uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
        if (call_of(c) != g)
            return;
        /* Read before the claim: a claim of call g succeeds only while g
         * has parts left, so these are g's. */
        px__rt_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        /* A count that belongs to the next call is seen only after that
         * call closed this one (CLOSED below): the claim then fails. */
        uint32_t n_parts = atomic_load_explicit(&p->n_parts, memory_order_acquire);
        uint32_t part = (uint32_t)c;
        if (part >= n_parts)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        fn(arg, part, n_parts, ith);
        if (atomic_fetch_add_explicit(&p->parts_done, 1, memory_order_acq_rel) + 1 == n_parts &&
            atomic_load(&p->sleepers) > 0) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static void *worker_main(void *varg)
{
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    px__rt_pool *p = wa.pool;
    uint32_t seen = 0;
    atomic_fetch_add_explicit(&p->ready, 1, memory_order_release);
    for (;;) {
        seen = wait_call(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        run_parts(p, seen, wa.ith);
    }
}

px_status px__rt_pool_new(uint32_t n_threads, px__rt_pool **out, px_err *err)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024)
        return px_err_set(err, PX_EINVAL, "cpu: %u threads (1 to 1024)", n_threads);
    /* Aligned, so that the fields on separate cache lines are. */
    px__rt_pool *p = aligned_alloc(64, sizeof *p);
    if (!p)
        return px_err_set(err, PX_ENOMEM, "cpu: out of memory for the thread pool");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->n_parts, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->ready, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->claim, 0);
    atomic_init(&p->parts_done, 0);
    if (n_threads > 1) {
        p->threads = calloc(n_threads - 1, sizeof *p->threads);
        if (!p->threads)
            goto fail_oom;
        for (uint32_t i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa)
                goto fail_oom;
            wa->pool = p;
            wa->ith = i;
            int rc = pthread_create(&p->threads[i - 1], NULL, worker_main, wa);
            if (rc != 0) {
                free(wa);
                px__rt_pool_free(p);
                return px_err_set(err, PX_ENOMEM, "cpu: cannot start worker thread %u: %s", i,
                                  strerror(rc));
            }
            p->n_started++;
        }
        /* Return a pool whose threads are running: thread start-up (and
         * whatever the C library or a sanitizer allocates for it) then
         * never overlaps the first steps. */
        while (atomic_load_explicit(&p->ready, memory_order_acquire) != p->n_started)
            sched_yield();
    }
    *out = p;
    return PX_OK;
fail_oom:
    px__rt_pool_free(p);
    return px_err_set(err, PX_ENOMEM, "cpu: out of memory for the thread pool");
}

void px__rt_pool_free(px__rt_pool *p)
{
    if (!p)
        return;
    if (p->n_started) {
        pthread_mutex_lock(&p->lock);
        atomic_store_explicit(&p->stop, true, memory_order_release);
        uint64_t c = atomic_load(&p->claim);
        atomic_store(&p->claim, (uint64_t)(call_of(c) + 1) << 32);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (uint32_t i = 0; i < p->n_started; i++)
            pthread_join(p->threads[i], NULL);
    }
    free(p->threads);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

uint32_t px__rt_pool_size(const px__rt_pool *p)
{
    return p->n;
}

void px__rt_pool_run(px__rt_pool *p, px__rt_pool_fn fn, void *arg, uint32_t n_parts)
{
    if (n_parts == 0)
        return;
    if (p->n == 1 || n_parts == 1 || n_parts >= CLOSED) {
        for (uint32_t i = 0; i < n_parts; i++)
            fn(arg, i, n_parts, 0);
        return;
    }
    /* Every part of the previous call is done, but a worker may still
     * hold its claim word: the call is closed first, so that no worker
     * can claim one part past its end against the new count. */
    uint32_t g = call_of(atomic_load_explicit(&p->claim, memory_order_relaxed));
    atomic_store(&p->claim, ((uint64_t)g << 32) | CLOSED);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n_parts, n_parts, memory_order_release);
    atomic_store_explicit(&p->parts_done, 0, memory_order_relaxed);
    g++;
    atomic_store(&p->claim, (uint64_t)g << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    run_parts(p, g, 0);
    /* The barrier: every part done (workers without one are not waited
     * for). */
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&p->parts_done, memory_order_acquire) == n_parts)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->parts_done) != n_parts)
        pthread_cond_wait(&p->done, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
}
