/*
 * The emu backend: an emulated accelerator for hardware this machine
 * lacks.  It runs the cpu kernels (so its results are the cpu backend's,
 * bit for bit), then stretches each op's real time by its profile's
 * slowdown for the op's class, compute-bound or memory-bound, and waits
 * out the difference once per run of ops, as a host sees an accelerator's
 * stream only when it synchronizes: clock_nanosleep to an absolute
 * deadline, then a short busy wait for accuracy.  The slowdowns come from
 * the inventory (the device's "emu" member), never from the planner's cost
 * model, so that predicted against observed stays an honest comparison.
 * Buffers count against the profile's memory capacity.
 */
#include "base/common.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

/* The last stretch of a wait is spun, not slept: a sleep overshoots by
 * tens of microseconds even with the timer slack lowered.  Only that
 * stretch: an emulated device computing is not a host thread running, and
 * a wait spun whole would take a core from the real work beside it (the
 * other stages, the server) on a small host. */
#define PACE_SPIN_NS 50000u

/* Linux lets a sleep end up to the thread's timer slack (50 us by
 * default) late; pacing wants it as small as it gets. */
static _Thread_local bool slack_set;

typedef struct emu_device {
    px__rt_host_device host; /* first: px__rt_host_supports_op and _work_size read it */
    px_rt_emu_profile prof;
    pthread_mutex_t lock;
    uint64_t used; /* bytes of live buffers */
} emu_device;

typedef struct emu_buffer {
    emu_device *dev;
    void *data;
    size_t size;
    bool owned;
} emu_buffer;

typedef struct emu_stream {
    emu_device *dev;
    px__rt_cpu_exec exec;
    px_rng rng;
    uint64_t *op_ns; /* per op of a run: its start, then its wall time */
    size_t cap_ops;
} emu_stream;

/* ------------------------------------------------------------------ */
/* Profiles                                                            */
/* ------------------------------------------------------------------ */

static px_status read_number(json_t *doc, const char *key, double lo, double hi, bool hi_open,
                             double *out, px_err *err)
{
    json_t *v = json_object_get(doc, key);
    if (!v)
        return PX_OK;
    if (!json_is_number(v))
        return px_err_set(err, PX_EINVAL, "emu profile: /%s must be a number, found %s", key,
                          px_json_type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (hi_open ? x >= hi : x > hi)) {
        if (!strcmp(key, "jitter"))
            return px_err_set(err, PX_EINVAL,
                              "emu profile: /jitter is %g; it must lie in "
                              "[0, 1)",
                              x);
        return px_err_set(err, PX_EINVAL,
                          "emu profile: /%s is %g; an emulated device can only "
                          "be slower than the host: use a value of at least %g",
                          key, x, lo);
    }
    *out = x;
    return PX_OK;
}

px_status px_rt_emu_profile_parse(const char *text, px_rt_emu_profile *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    out->compute_slowdown = 1;
    out->memory_slowdown = 1;
    if (!text || !text[0])
        return PX_OK;
    px_json_limits lim = {.max_bytes = 16384, .max_depth = 4, .max_string = 256};
    json_t *doc = NULL;
    px_status st = px_json_parse(text, strlen(text), "emu profile", &lim, &doc, err);
    if (st)
        return st;
    static const char *const known[] = {
        "compute_slowdown", "memory_slowdown", "jitter", "seed", "memory_bytes", "name", NULL};
    if (!json_is_object(doc)) {
        st = px_err_set(err, PX_EINVAL,
                        "emu profile: expected an object such as "
                        "{\"compute_slowdown\": 3, \"memory_slowdown\": 2}");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v)
    {
        bool ok = px_str_starts_with(key, "x-");
        for (size_t i = 0; known[i] && !ok; i++)
            ok = !strcmp(known[i], key);
        if (!ok) {
            st = px_err_set(err, PX_EINVAL,
                            "emu profile: unknown member \"%.40s\" (known: "
                            "compute_slowdown, memory_slowdown, jitter, seed, memory_bytes, "
                            "name)",
                            key);
            goto done;
        }
    }
    double seed = 0, mem = 0;
    if ((st = read_number(doc, "compute_slowdown", 1, 1e6, false, &out->compute_slowdown, err)) ||
        (st = read_number(doc, "memory_slowdown", 1, 1e6, false, &out->memory_slowdown, err)) ||
        (st = read_number(doc, "jitter", 0, 1, true, &out->jitter, err)) ||
        (st = read_number(doc, "seed", 0, 9007199254740992.0, false, &seed, err)) ||
        (st = read_number(doc, "memory_bytes", 0, 1e18, false, &mem, err)))
        goto done;
    out->seed = (uint64_t)seed;
    out->memory_bytes = (uint64_t)mem;
    json_t *name = json_object_get(doc, "name");
    if (name) {
        if (!json_is_string(name)) {
            st = px_err_set(err, PX_EINVAL, "emu profile: /name must be a string");
            goto done;
        }
        px_strlcpy(out->name, json_string_value(name), sizeof out->name);
    }
done:
    json_decref(doc);
    return st;
}

px_status px_rt_emu_profile_format(const px_rt_emu_profile *p, px_strbuf *out, px_err *err)
{
    json_t *o = json_object();
    if (!o || px_json_set(o, "compute_slowdown", json_real(p->compute_slowdown)) ||
        px_json_set(o, "memory_slowdown", json_real(p->memory_slowdown)) ||
        px_json_set(o, "jitter", json_real(p->jitter)) ||
        px_json_set(o, "seed", json_integer((json_int_t)p->seed)) ||
        px_json_set(o, "memory_bytes", json_integer((json_int_t)p->memory_bytes)) ||
        (p->name[0] && px_json_set(o, "name", json_string(p->name)))) {
        json_decref(o);
        return px_err_set(err, PX_ENOMEM, "emu profile: out of memory");
    }
    char *text = px_json_dump_line(o);
    json_decref(o);
    px_status st = text ? px_strbuf_adds(out, text) : PX_ENOMEM;
    free(text);
    if (st)
        return px_err_set(err, PX_ENOMEM, "emu profile: out of memory");
    return PX_OK;
}

bool px_rt_emu_op_compute_bound(const px_rt_op *op)
{
    uint64_t flops = 0, bytes = 0;
    px_rt_op_cost(op, &flops, &bytes);
    /* A matrix product's weights count at no less than one byte per value.
     * The block formats below 8 bits (Q4_0 .. Q6_K) multiply as 8-bit
     * integers against 8-bit activations (ADR 0009), at a device's int8
     * rate, not its float rate: at their stored size a one-row product of
     * Q2_K weights (2.6 bits a value) would count 6 FLOPs per byte and pass
     * for compute-bound, when, like every matrix-vector product, what it
     * costs is the reading of its weights. */
    const px_rt_tensor *w = op->src[1];
    if ((op->kind == PX_IR_OP_MATMUL || op->kind == PX_IR_OP_CLASSIFIER) && w &&
        px__rt_quant_handles(w->dtype)) {
        uint64_t values = (uint64_t)(w->ne[0] * w->ne[1]);
        uint64_t stored = (uint64_t)w->nb[1] * (uint64_t)w->ne[1];
        if (values > stored)
            bytes += values - stored;
    }
    return bytes > 0 && (double)flops >= PX_RT_EMU_COMPUTE_INTENSITY * (double)bytes;
}

/* ------------------------------------------------------------------ */
/* Buffers: host memory, counted against the capacity                  */
/* ------------------------------------------------------------------ */

static px_status reserve(emu_device *d, size_t size, px_err *err)
{
    px_status st = PX_OK;
    pthread_mutex_lock(&d->lock);
    uint64_t cap = d->prof.memory_bytes;
    if (cap && (d->used > cap || size > cap - d->used))
        st = px_err_set(err, PX_ENOMEM,
                        "emu device %s (emulated): cannot allocate %zu bytes: "
                        "%" PRIu64 " of its %" PRIu64 " bytes are in use; give the stage fewer "
                        "layers or a device with more memory",
                        d->prof.name[0] ? d->prof.name : "emu", size, d->used, cap);
    else
        d->used += size;
    pthread_mutex_unlock(&d->lock);
    return st;
}

static void release(emu_device *d, size_t size)
{
    pthread_mutex_lock(&d->lock);
    d->used -= PX_MIN(d->used, (uint64_t)size);
    pthread_mutex_unlock(&d->lock);
}

static void buffer_free(void *b)
{
    emu_buffer *eb = b;
    release(eb->dev, eb->size);
    if (eb->owned)
        free(eb->data);
    free(eb);
}

static void *buffer_base(void *b)
{
    return ((emu_buffer *)b)->data;
}

static const px_rt_buffer_iface emu_buffer_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_buffer_iface),
    .free = buffer_free,
    .base = buffer_base,
};

static px_status buffer_make(emu_device *d, void *host, size_t size,
                             const px_rt_buffer_iface **iface, void **buf, px_err *err)
{
    px_status st = reserve(d, size, err);
    if (st)
        return st;
    emu_buffer *eb = calloc(1, sizeof *eb);
    void *data = host ? host : calloc(1, size ? size : 1);
    if (!eb || !data) {
        free(eb);
        if (!host)
            free(data);
        release(d, size);
        return px_err_set(err, PX_ENOMEM, "emu: cannot allocate %zu bytes", size);
    }
    eb->dev = d;
    eb->data = data;
    eb->size = size;
    eb->owned = host == NULL;
    *iface = &emu_buffer_iface;
    *buf = eb;
    return PX_OK;
}

static px_status buffer_alloc(void *dev, size_t size, const px_rt_buffer_iface **iface, void **buf,
                              px_err *err)
{
    return buffer_make(dev, NULL, size, iface, buf, err);
}

/* Weights stay where they are mapped, but count as if copied: a real
 * accelerator would hold them. */
static px_status buffer_from_host(void *dev, void *ptr, size_t size,
                                  const px_rt_buffer_iface **iface, void **buf, px_err *err)
{
    return buffer_make(dev, ptr, size, iface, buf, err);
}

/* ------------------------------------------------------------------ */
/* Streams: the cpu kernels, paced                                     */
/* ------------------------------------------------------------------ */

static void wait_until(uint64_t deadline)
{
    if (!slack_set) {
        (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        slack_set = true;
    }
    uint64_t now = px_now_ns();
    if (now + PACE_SPIN_NS < deadline) {
        uint64_t wake = deadline - PACE_SPIN_NS;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000u),
                              .tv_nsec = (long)(wake % 1000000000u)};
        /* px_now_ns reads CLOCK_MONOTONIC too. */
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    while (px_now_ns() < deadline)
        ;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void stream_free(void *s)
{
    emu_stream *es = s;
    px__rt_pool_free(es->exec.pool);
    free(es->op_ns);
    free(es);
}

static px_status stream_run(void *s, const px_rt_op *ops, size_t n_ops, px_rt_op_timing *timing,
                            px_err *err)
{
    emu_stream *es = s;
    const px_rt_emu_profile *p = &es->dev->prof;
    if (n_ops > es->cap_ops) {
        uint64_t *t = realloc(es->op_ns, 2 * n_ops * sizeof *t);
        if (!t)
            return px_err_set(err, PX_ENOMEM, "emu device %s (emulated): out of memory",
                              p->name[0] ? p->name : "emu");
        es->op_ns = t;
        es->cap_ops = n_ops;
    }
    /* The ops' own time is the processor time they took, not the wall
     * time: a preemption would otherwise be stretched too, and a busy host
     * would emulate a much slower device.  The processor time is read once
     * for the run (a system call, which costs microseconds on some hosts:
     * twice per op it came to a quarter of an emulated stage's processor
     * time), and each op's wall time scaled by the run's share of it. */
    uint64_t c0 = thread_cpu_ns(), start = px_now_ns();
    for (size_t i = 0; i < n_ops; i++) {
        uint64_t t0 = px_now_ns();
        px_status st = px__rt_cpu_run_op(&es->exec, &ops[i], err);
        if (st)
            return px_err_prefix(err, st,
                                 "emu device %s (emulated): ", p->name[0] ? p->name : "emu");
        es->op_ns[2 * i] = t0;
        es->op_ns[2 * i + 1] = px_now_ns() - t0;
    }
    uint64_t wall = px_now_ns() - start, cpu = thread_cpu_ns() - c0;
    double share = cpu > 0 && cpu < wall ? (double)cpu / (double)wall : 1.0;
    /* The device's clock: when the ops run so far would have finished on
     * it.  Each op starts when both the host has run it and the device
     * has finished the one before. */
    uint64_t device_now = start;
    for (size_t i = 0; i < n_ops; i++) {
        uint64_t t0 = es->op_ns[2 * i], op_wall = es->op_ns[2 * i + 1];
        double k = px_rt_emu_op_compute_bound(&ops[i]) ? p->compute_slowdown : p->memory_slowdown;
        if (p->jitter > 0)
            k *= 1.0 + p->jitter * (2.0 * px_rng_uniform(&es->rng) - 1.0);
        if (k < 1)
            k = 1;
        uint64_t target = (uint64_t)((double)op_wall * share * k);
        device_now = PX_MAX(device_now, t0) + target;
        /* The device's time is the stretched one; a late wake-up of a
         * busy host is the host's, not the emulated device's. */
        if (timing)
            timing[i].ns = PX_MAX(PX_MAX(target, op_wall), 1);
    }
    wait_until(device_now);
    return PX_OK;
}

static const px_rt_stream_iface emu_stream_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_stream_iface),
    .free = stream_free,
    .run = stream_run,
};

static px_status stream_new(void *dev, const px_rt_stream_iface **iface, void **stream, px_err *err)
{
    emu_device *d = dev;
    emu_stream *es = calloc(1, sizeof *es);
    if (!es)
        return px_err_set(err, PX_ENOMEM, "emu: out of memory");
    es->dev = d;
    es->exec.k = d->host.kernels;
    px_rng_seed(&es->rng, d->prof.seed);
    px_status st = px__rt_pool_new(d->host.n_threads, &es->exec.pool, err);
    if (st) {
        free(es);
        return st;
    }
    *iface = &emu_stream_iface;
    *stream = es;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Device                                                              */
/* ------------------------------------------------------------------ */

static void device_free(void *dev)
{
    emu_device *d = dev;
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void device_props(void *dev, px_rt_device_props *out)
{
    emu_device *d = dev;
    snprintf(out->name, sizeof out->name, "emu:%.58s", d->prof.name[0] ? d->prof.name : "device");
    snprintf(out->description, sizeof out->description,
             "%.40s (emulated): compute x%.3g, memory x%.3g of the host cpu, %u thread%s",
             d->prof.name[0] ? d->prof.name : "emu", d->prof.compute_slowdown,
             d->prof.memory_slowdown, d->host.n_threads, d->host.n_threads == 1 ? "" : "s");
    out->kind = PX_RT_DEVICE_ACCEL;
    pthread_mutex_lock(&d->lock);
    out->memory_total = d->prof.memory_bytes;
    out->memory_free =
        d->prof.memory_bytes ? d->prof.memory_bytes - PX_MIN(d->used, d->prof.memory_bytes) : 0;
    out->memory_used = d->used;
    pthread_mutex_unlock(&d->lock);
    out->caps = PX_RT_CAP_HOST_MEMORY | PX_RT_CAP_HOST_PTR;
    out->n_threads = d->host.n_threads;
    out->emulated = true;
}

static const px_rt_device_iface emu_device_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_device_iface),
    .free = device_free,
    .props = device_props,
    .supports_op = px__rt_host_supports_op,
    .buffer_alloc = buffer_alloc,
    .stream_new = stream_new,
    .buffer_from_host = buffer_from_host,
    .work_size = px__rt_host_work_size,
};

static px_status device_open(const px_rt_device_opts *opts, const px_rt_device_iface **iface,
                             void **dev, px_err *err)
{
    px_rt_emu_profile prof;
    px_status st = px_rt_emu_profile_parse(opts->profile, &prof, err);
    if (st)
        return st;
    /* The same threads and kernels the cpu backend picks, so that results
     * match it. */
    px__rt_host_device host;
    st = px__rt_host_device_init(&host, "emu", opts, err);
    if (st)
        return st;
    emu_device *d = calloc(1, sizeof *d);
    if (!d)
        return px_err_set(err, PX_ENOMEM, "emu: out of memory");
    d->host = host;
    d->prof = prof;
    pthread_mutex_init(&d->lock, NULL);
    *iface = &emu_device_iface;
    *dev = d;
    return PX_OK;
}

static const px_rt_backend_iface emu_backend = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_backend_iface),
    .name = "emu",
    .description = "emulated accelerator: the cpu kernels, paced by a profile's slowdowns",
    .device_open = device_open,
};

static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

px_status px_rt_emu_register(px_err *err)
{
    pthread_mutex_lock(&register_lock);
    px_status st = PX_OK;
    bool found = false;
    for (size_t i = 0; i < px_rt_backend_count() && !found; i++)
        found = px_rt_backend_at(i) == &emu_backend;
    if (!found)
        st = px_rt_backend_register(&emu_backend, err);
    pthread_mutex_unlock(&register_lock);
    return st;
}
