/*
 * The executor's receiver: one thread reads every frame the last stage
 * sends back and queues it.  With several steps in flight the executor
 * may be blocked sending the next step to stage 0 while the last stage
 * is blocked sending a result back; reading on a thread of its own breaks
 * that cycle.  Consumers take frames by type with a deadline, so a step's
 * result, a fault's acknowledgement and a stats reply can interleave.
 */
#include "base/common.h"

#include <time.h>

#include "rt/executor_impl.h"

/* The receiver never times out on its own: consumers keep the deadlines,
 * and stopping shuts the socket down. */
#define RX_IDLE_MS (24 * 3600 * 1000)

static void *rx_main(void *arg)
{
    px_rt_executor *ex = arg;
    int schedstat = -2; /* this thread's; see px__rt_thread_wait_ns */
    for (;;) {
        px_rt_frame_header h;
        const uint8_t *p;
        px_err e;
        uint64_t wait0 = px__rt_thread_wait_ns(&schedstat);
        px_status st = px_rt_conn_recv(ex->last, &h, &p, &e);
        /* The hop back ends here; of it, the time this thread waited
         * runnable for a core (the host busy, not the link) is measured
         * as the stage workers measure their receives. */
        uint64_t t_recv = px_now_ns(), waited = px__rt_thread_wait_ns(&schedstat) - wait0;
        px__rt_rx_frame *f = NULL;
        if (st == PX_OK && !(f = malloc(sizeof *f + h.length)))
            st = px_err_set(&e, PX_ENOMEM, "executor: cannot hold a frame of %u bytes", h.length);
        pthread_mutex_lock(&ex->rx_mu);
        if (st != PX_OK) {
            ex->rx_ended = true;
            ex->rx_status = st;
            ex->rx_err = e;
            pthread_cond_broadcast(&ex->rx_cv);
            pthread_mutex_unlock(&ex->rx_mu);
            px__rt_thread_wait_close(&schedstat);
            return NULL;
        }
        f->next = NULL;
        f->h = h;
        f->t_recv_ns = t_recv;
        f->wait_ns = waited;
        memcpy(f->payload, p, h.length);
        if (ex->rx_tail)
            ex->rx_tail->next = f;
        else
            ex->rx_head = f;
        ex->rx_tail = f;
        pthread_cond_broadcast(&ex->rx_cv);
        pthread_mutex_unlock(&ex->rx_mu);
    }
}

px_status px__rt_exec_rx_start(px_rt_executor *ex, px_err *err)
{
    if (pthread_mutex_init(&ex->rx_mu, NULL) != 0)
        return px_err_set(err, PX_EIO, "executor: cannot create the receiver's lock");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&ex->rx_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&ex->rx_mu);
        return px_err_set(err, PX_EIO, "executor: cannot create the receiver's condition");
    }
    px_rt_conn_set_timeout(ex->last, RX_IDLE_MS);
    if (pthread_create(&ex->rx, NULL, rx_main, ex) != 0) {
        pthread_cond_destroy(&ex->rx_cv);
        pthread_mutex_destroy(&ex->rx_mu);
        return px_err_set(err, PX_EIO, "executor: cannot start the receiver thread");
    }
    ex->rx_started = true;
    return PX_OK;
}

void px__rt_exec_rx_stop(px_rt_executor *ex)
{
    if (!ex->rx_started)
        return;
    px__rt_conn_shutdown(ex->last);
    pthread_join(ex->rx, NULL);
    ex->rx_started = false;
    for (px__rt_rx_frame *f = ex->rx_head, *n; f; f = n) {
        n = f->next;
        free(f);
    }
    ex->rx_head = ex->rx_tail = NULL;
    free(ex->rx_held);
    ex->rx_held = NULL;
    pthread_cond_destroy(&ex->rx_cv);
    pthread_mutex_destroy(&ex->rx_mu);
}

static void unlink_frame(px_rt_executor *ex, px__rt_rx_frame *prev, px__rt_rx_frame *f)
{
    if (prev)
        prev->next = f->next;
    else
        ex->rx_head = f->next;
    if (ex->rx_tail == f)
        ex->rx_tail = prev;
}

/* The first frame of type want or ERROR; sequence acknowledgements before
 * it are dropped.  Called with the lock held. */
static px__rt_rx_frame *find(px_rt_executor *ex, px_rt_frame_type want)
{
    px__rt_rx_frame *prev = NULL, *f = ex->rx_head;
    while (f) {
        if (f->h.type == want || f->h.type == PX_RT_FRAME_ERROR) {
            unlink_frame(ex, prev, f);
            return f;
        }
        if (f->h.type == PX_RT_FRAME_SEQ) {
            px__rt_rx_frame *next = f->next;
            unlink_frame(ex, prev, f);
            free(f);
            f = next;
            continue;
        }
        prev = f;
        f = f->next;
    }
    return NULL;
}

px_status px__rt_exec_rx_take(px_rt_executor *ex, px_rt_frame_type want, int timeout_ms,
                              px_rt_frame_header *h, const uint8_t **p, px_err *err)
{
    *p = NULL;
    free(ex->rx_held);
    ex->rx_held = NULL;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ex->rx_mu);
    px__rt_rx_frame *f;
    for (;;) {
        if ((f = find(ex, want)) != NULL)
            break;
        if (ex->rx_ended) {
            px_status st = ex->rx_status;
            if (err)
                *err = ex->rx_err;
            pthread_mutex_unlock(&ex->rx_mu);
            return st;
        }
        if (pthread_cond_timedwait(&ex->rx_cv, &ex->rx_mu, &dl) == ETIMEDOUT &&
            !(f = find(ex, want))) {
            pthread_mutex_unlock(&ex->rx_mu);
            return px_err_set(err, PX_ETIMEOUT, "%s sent nothing for %d ms: it is stuck or dead",
                              px__rt_conn_peer(ex->last), timeout_ms);
        }
        if (f)
            break;
    }
    pthread_mutex_unlock(&ex->rx_mu);
    ex->rx_held = f;
    *h = f->h;
    *p = f->payload;
    return PX_OK;
}

uint64_t px__rt_exec_rx_time(const px_rt_executor *ex)
{
    return ex->rx_held ? ex->rx_held->t_recv_ns : 0;
}

uint64_t px__rt_exec_rx_wait(const px_rt_executor *ex)
{
    return ex->rx_held ? ex->rx_held->wait_ns : 0;
}
