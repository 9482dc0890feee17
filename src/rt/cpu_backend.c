/*
 * The cpu backend: host memory buffers (and zero-copy wrappers of mmapped
 * weights), and streams that run ops synchronously on a pool of threads
 * created once per stream (cpu_pool.c) with the kernels of cpu_ops.c.
 */
#include "base/common.h"

#include <pthread.h>
#include <unistd.h>

#include "rt/quant_impl.h"
#include "rt/rt_impl.h"

typedef px__rt_host_device cpu_device;

typedef struct cpu_buffer {
    void *data;
    size_t size;
    bool owned;
} cpu_buffer;

typedef struct cpu_stream {
    cpu_device *dev;
    px__rt_cpu_exec exec;
} cpu_stream;

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

static void buffer_free(void *b)
{
    cpu_buffer *cb = b;
    if (cb->owned)
        free(cb->data);
    free(cb);
}

static void *buffer_base(void *b)
{
    return ((cpu_buffer *)b)->data;
}

static const px_rt_buffer_iface cpu_buffer_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_buffer_iface),
    .free = buffer_free,
    .base = buffer_base,
};

static px_status buffer_alloc(void *dev, size_t size, const px_rt_buffer_iface **iface, void **buf,
                              px_err *err)
{
    (void)dev;
    cpu_buffer *cb = calloc(1, sizeof *cb);
    /* calloc: large buffers (the KV cache) come as untouched zero pages. */
    void *data = calloc(1, size ? size : 1);
    if (!cb || !data) {
        free(cb);
        free(data);
        return px_err_set(err, PX_ENOMEM, "cpu: cannot allocate %zu bytes", size);
    }
    cb->data = data;
    cb->size = size;
    cb->owned = true;
    *iface = &cpu_buffer_iface;
    *buf = cb;
    return PX_OK;
}

static px_status buffer_from_host(void *dev, void *ptr, size_t size,
                                  const px_rt_buffer_iface **iface, void **buf, px_err *err)
{
    (void)dev;
    cpu_buffer *cb = calloc(1, sizeof *cb);
    if (!cb)
        return px_err_set(err, PX_ENOMEM, "cpu: out of memory");
    cb->data = ptr;
    cb->size = size;
    cb->owned = false;
    *iface = &cpu_buffer_iface;
    *buf = cb;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

static void stream_free(void *s)
{
    cpu_stream *cs = s;
    px__rt_pool_free(cs->exec.pool);
    free(cs);
}

static px_status stream_run(void *s, const px_rt_op *ops, size_t n_ops, px_rt_op_timing *timing,
                            px_err *err)
{
    cpu_stream *cs = s;
    if (!timing) {
        /* Products of the same input run as one group; a timed list runs
         * op by op, so that each op has a time of its own. */
        for (size_t i = 0, m; i < n_ops; i += m) {
            m = px__rt_cpu_products(&ops[i], n_ops - i);
            px_status st = m > 1 ? px__rt_cpu_run_products(&cs->exec, &ops[i], m, err)
                                 : px__rt_cpu_run_op(&cs->exec, &ops[i], err);
            if (st)
                return st;
        }
        return PX_OK;
    }
    for (size_t i = 0; i < n_ops; i++) {
        uint64_t t0 = px_now_ns();
        px_status st = px__rt_cpu_run_op(&cs->exec, &ops[i], err);
        if (st)
            return st;
        timing[i].ns = PX_MAX(px_now_ns() - t0, 1);
    }
    return PX_OK;
}

static const px_rt_stream_iface cpu_stream_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_stream_iface),
    .free = stream_free,
    .run = stream_run,
};

static px_status stream_new(void *dev, const px_rt_stream_iface **iface, void **stream, px_err *err)
{
    cpu_device *d = dev;
    cpu_stream *cs = calloc(1, sizeof *cs);
    if (!cs)
        return px_err_set(err, PX_ENOMEM, "cpu: out of memory");
    cs->dev = d;
    cs->exec.k = d->kernels;
    px_status st = px__rt_pool_new(d->n_threads, &cs->exec.pool, err);
    if (st) {
        free(cs);
        return st;
    }
    *iface = &cpu_stream_iface;
    *stream = cs;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Device                                                              */
/* ------------------------------------------------------------------ */

static void device_free(void *dev)
{
    free(dev);
}

static uint64_t host_memory(bool available)
{
    long pages = sysconf(available ? _SC_AVPHYS_PAGES : _SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

static void device_props(void *dev, px_rt_device_props *out)
{
    cpu_device *d = dev;
    px_strlcpy(out->name, "cpu", sizeof out->name);
    snprintf(out->description, sizeof out->description, "cpu: %u thread%s, %s kernels",
             d->n_threads, d->n_threads == 1 ? "" : "s", d->kernels->name);
    out->kind = PX_RT_DEVICE_CPU;
    out->memory_total = host_memory(false);
    out->memory_free = host_memory(true);
    out->caps = PX_RT_CAP_HOST_MEMORY | PX_RT_CAP_HOST_PTR;
    out->n_threads = d->n_threads;
    out->emulated = false;
}

bool px__rt_host_supports_op(void *dev, px_ir_op_kind op, px_dtype dtype)
{
    (void)dev;
    return px__rt_cpu_supports(op, dtype);
}

size_t px__rt_host_work_size(void *dev, const px_rt_op *op)
{
    return px__rt_cpu_work_size(((const px__rt_host_device *)dev)->n_threads, op);
}

/* Q4_K matrices repacked for the avx512 kernels' products, which read sixteen rows a register. */
static uint32_t weight_layout(void *dev, px_dtype dtype, uint64_t cols, uint64_t rows)
{
    const cpu_device *d = dev;
    bool x16 = d->kernels->matmul_q4_k16 && dtype == PX_DTYPE_Q4_K && cols > 0 &&
               cols % PX__RT_QK == 0 && rows > 0 && rows % PX__RT_Q4K16_ROWS == 0;
    return x16 ? PX_RT_LAYOUT_Q4_K_X16 : PX_RT_LAYOUT_ROWS;
}

static const px_rt_device_iface cpu_device_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_device_iface),
    .free = device_free,
    .props = device_props,
    .supports_op = px__rt_host_supports_op,
    .buffer_alloc = buffer_alloc,
    .stream_new = stream_new,
    .buffer_from_host = buffer_from_host,
    .work_size = px__rt_host_work_size,
    .weight_layout = weight_layout,
};

px_status px__rt_host_device_init(px__rt_host_device *h, const char *name,
                                  const px_rt_device_opts *opts, px_err *err)
{
    uint32_t n = opts->n_threads;
    if (n == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (uint32_t)PX_MIN(online, 256) : 1;
    }
    if (n > 1024)
        return px_err_set(err, PX_EINVAL, "%s: %u threads requested (at most 1024)", name, n);
    h->n_threads = n;
    h->kernels = opts->portable_kernels ? NULL : px__rt_kernels_native();
    if (!h->kernels)
        h->kernels = &px__rt_kernels_portable;
    return PX_OK;
}

static px_status device_open(const px_rt_device_opts *opts, const px_rt_device_iface **iface,
                             void **dev, px_err *err)
{
    cpu_device host;
    px_status st = px__rt_host_device_init(&host, "cpu", opts, err);
    if (st)
        return st;
    cpu_device *d = malloc(sizeof *d);
    if (!d)
        return px_err_set(err, PX_ENOMEM, "cpu: out of memory");
    *d = host;
    *iface = &cpu_device_iface;
    *dev = d;
    return PX_OK;
}

const px_rt_backend_iface px__rt_cpu_backend = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_backend_iface),
    .name = "cpu",
    .description = "host processor: threads, own kernels",
    .device_open = device_open,
};
