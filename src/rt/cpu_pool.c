/*
 * The cpu backend's thread pool: persistent workers released by a
 * generation counter and joined by a counting barrier after every call.
 *
 * A decode step runs dozens of short ops, each followed by a barrier, so
 * waking workers through the kernel each time would cost more than the
 * ops.  Both sides therefore spin briefly (workers for the next
 * generation, the caller for the last worker) and only then sleep on a
 * condition variable.  The spin is short on purpose: when the machine has
 * more runnable threads than cores, a spinning thread only delays the one
 * it waits for.  Every wake-up is signalled under the mutex, so a thread
 * going to sleep cannot miss it.
 */
#include "base/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "rt/rt_impl.h"

/* Polls before a thread sleeps: some tens of microseconds. */
#define SPIN_ITERS 4000

struct px__rt_pool {
    uint32_t n;
    pthread_t *threads; /* n - 1 workers; the caller is thread 0 */
    uint32_t n_started;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a new generation */
    pthread_cond_t done; /* the last worker finished */
    _Atomic uint64_t generation;
    _Atomic uint32_t pending; /* workers still running this generation */
    _Atomic bool stop;
    _Atomic uint32_t ready; /* workers that have entered their loop */
    px__rt_pool_fn fn;
    void *arg;
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

static uint64_t wait_generation(px__rt_pool *p, uint64_t seen)
{
    uint64_t g;
    for (int i = 0; i < SPIN_ITERS; i++) {
        g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->lock);
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->wake, &p->lock);
    pthread_mutex_unlock(&p->lock);
    return g;
}

static void *worker_main(void *varg)
{
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    px__rt_pool *p = wa.pool;
    uint64_t seen = 0;
    atomic_fetch_add_explicit(&p->ready, 1, memory_order_release);
    for (;;) {
        seen = wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        p->fn(p->arg, wa.ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

px_status px__rt_pool_new(uint32_t n_threads, px__rt_pool **out, px_err *err)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024)
        return px_err_set(err, PX_EINVAL, "cpu: %u threads (1 to 1024)", n_threads);
    px__rt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return px_err_set(err, PX_ENOMEM, "cpu: out of memory for the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->ready, 0);
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
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_acq_rel);
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

void px__rt_pool_run(px__rt_pool *p, px__rt_pool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    fn(arg, 0, p->n);
    /* The barrier. */
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->lock);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}
