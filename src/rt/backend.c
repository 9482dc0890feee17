/*
 * The backend interface: the registry of backends by name, and the public
 * wrappers over the device, buffer and stream tables, which check ABI
 * versions and supply the documented defaults of optional slots.
 */
#include "base/common.h"

#include <pthread.h>

#include "rt/rt_impl.h"

/* ------------------------------------------------------------------ */
/* Tensors                                                             */
/* ------------------------------------------------------------------ */

px_status px_rt_tensor_init(px_rt_tensor *t, px_dtype dtype, uint32_t n_dims, const int64_t *ne,
                            px_err *err)
{
    memset(t, 0, sizeof *t);
    if (n_dims == 0 || n_dims > PX_RT_MAX_DIMS)
        return px_err_set(err, PX_EINVAL, "tensor: %u dimensions (1 to %d)", n_dims,
                          PX_RT_MAX_DIMS);
    uint32_t be = px_dtype_block_elems(dtype), bb = px_dtype_block_bytes(dtype);
    if (be == 0)
        return px_err_set(err, PX_EINVAL, "tensor: invalid dtype %d", (int)dtype);
    for (uint32_t i = 0; i < PX_RT_MAX_DIMS; i++) {
        int64_t n = i < n_dims ? ne[i] : 1;
        if (n < 1)
            return px_err_set(err, PX_EINVAL,
                              "tensor: dimension %u is %" PRId64 " (must be at least 1)", i, n);
        t->ne[i] = n;
    }
    if (t->ne[0] % be)
        return px_err_set(err, PX_EINVAL,
                          "tensor: row of %" PRId64 " values is not a "
                          "whole number of %s blocks (%u values)",
                          t->ne[0], px_dtype_name(dtype), be);
    size_t stride = bb;
    t->nb[0] = bb;
    if (!px__mul_size(bb, (size_t)(t->ne[0] / be), &stride))
        return px_err_set(err, PX_ERANGE, "tensor: size overflows");
    for (uint32_t i = 1; i < PX_RT_MAX_DIMS; i++) {
        t->nb[i] = stride;
        if (!px__mul_size(stride, (size_t)t->ne[i], &stride))
            return px_err_set(err, PX_ERANGE, "tensor: size overflows");
    }
    t->dtype = dtype;
    return PX_OK;
}

size_t px_rt_tensor_nbytes(const px_rt_tensor *t)
{
    return (size_t)t->ne[PX_RT_MAX_DIMS - 1] * t->nb[PX_RT_MAX_DIMS - 1];
}

void *px_rt_tensor_data(const px_rt_tensor *t)
{
    if (!t || !t->buffer || !t->buffer->base)
        return NULL;
    return (char *)t->buffer->base + t->offset;
}

/* ------------------------------------------------------------------ */
/* Op cost                                                             */
/* ------------------------------------------------------------------ */

static uint64_t tensor_rows(const px_rt_tensor *t)
{
    return t ? (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) : 0;
}

void px_rt_op_cost(const px_rt_op *op, uint64_t *flops, uint64_t *bytes)
{
    uint64_t f = 0, b = 0;
    const px_rt_tensor *x = op->src[0], *y = op->dst;
    uint64_t rows = op->select ? op->n_select : (op->rows ? op->rows->n_rows : tensor_rows(x));
    switch (op->kind) {
    case PX_IR_OP_EMBEDDING: {
        const px_rt_tensor *tab = op->src[0];
        b = rows * (uint64_t)tab->nb[1] + rows * (uint64_t)y->ne[0] * 4;
        break;
    }
    case PX_IR_OP_RMSNORM:
        f = 4 * rows * (uint64_t)x->ne[0];
        b = 2 * rows * (uint64_t)x->ne[0] * 4 + (uint64_t)x->ne[0] * 4;
        break;
    case PX_IR_OP_MATMUL:
    case PX_IR_OP_CLASSIFIER: {
        const px_rt_tensor *w = op->src[1];
        uint64_t k = (uint64_t)w->ne[0], n = (uint64_t)w->ne[1];
        f = 2 * rows * k * n + (op->src[2] ? rows * n : 0);
        b = (uint64_t)w->nb[1] * n + rows * (k + n) * 4;
        break;
    }
    case PX_IR_OP_ROPE:
        f = 3 * rows * (uint64_t)op->n_heads * op->rope_dim;
        b = 2 * rows * (uint64_t)x->ne[0] * 4;
        break;
    case PX_IR_OP_ATTENTION: {
        uint64_t pairs = 0;
        if (op->rows)
            for (uint32_t r = 0; r < op->rows->n_rows; r++) {
                uint64_t p = (uint64_t)op->rows->pos[r] + 1;
                if (op->window && p > op->window)
                    p = op->window;
                pairs += p;
            }
        uint64_t hd = op->head_dim;
        f = pairs * op->n_heads * (4 * hd + 5);
        /* K and V of every attended position, once per kv head; the new
         * rows' q, k, v and the output. */
        b = pairs * 2 * op->n_kv_heads * hd * 4 +
            rows * (2 * (uint64_t)op->n_heads + 4 * (uint64_t)op->n_kv_heads) * hd * 4;
        break;
    }
    case PX_IR_OP_SWIGLU:
        f = 5 * rows * (uint64_t)x->ne[0];
        b = 3 * rows * (uint64_t)x->ne[0] * 4;
        break;
    case PX_IR_OP_ADD:
        f = rows * (uint64_t)x->ne[0];
        b = 3 * rows * (uint64_t)x->ne[0] * 4;
        break;
    default:
        break;
    }
    if (flops)
        *flops = f;
    if (bytes)
        *bytes = b;
}

const char *px_rt_op_name(const px_rt_op *op)
{
    return px_ir_op_kind_name(op->kind);
}

/* ------------------------------------------------------------------ */
/* Registry                                                            */
/* ------------------------------------------------------------------ */

#define MAX_BACKENDS 32

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static const px_rt_backend_iface *reg[MAX_BACKENDS];
static size_t reg_n;

static px_status check_abi(uint32_t version, const char *what, const char *name, px_err *err)
{
    if ((version >> 16) != PX_RT_ABI_MAJOR)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "backend %s: %s table has ABI %u.%u; this runtime speaks "
                          "%u.x: rebuild the backend against this version",
                          name, what, version >> 16, version & 0xffff, PX_RT_ABI_MAJOR);
    return PX_OK;
}

static px_status add_backend_locked(const px_rt_backend_iface *b, px_err *err)
{
    const char *name = b && b->name ? b->name : "(unnamed)";
    if (!b || !b->name || !b->name[0])
        return px_err_set(err, PX_EINVAL, "backend registration: the table has no name");
    px_status st = check_abi(b->abi_version, "backend", name, err);
    if (st)
        return st;
    if (!PX__RT_HAS(b, px_rt_backend_iface, device_open))
        return px_err_set(err, PX_EUNSUPPORTED,
                          "backend %s: the table lacks the "
                          "required device_open slot",
                          name);
    for (size_t i = 0; i < reg_n; i++)
        if (!strcmp(reg[i]->name, b->name))
            return px_err_set(err, PX_EEXIST, "backend \"%s\" is already registered", b->name);
    if (reg_n == MAX_BACKENDS)
        return px_err_set(err, PX_ELIMIT, "backend %s: no room (at most %d backends)", name,
                          MAX_BACKENDS);
    reg[reg_n++] = b;
    return PX_OK;
}

static void ensure_builtin_locked(void)
{
    if (reg_n == 0) {
        (void)add_backend_locked(&px__rt_cpu_backend, NULL);
        (void)add_backend_locked(&px__rt_cuda_backend, NULL);
    }
}

px_status px_rt_backend_register(const px_rt_backend_iface *b, px_err *err)
{
    pthread_mutex_lock(&reg_lock);
    ensure_builtin_locked();
    px_status st = add_backend_locked(b, err);
    pthread_mutex_unlock(&reg_lock);
    return st;
}

size_t px_rt_backend_count(void)
{
    pthread_mutex_lock(&reg_lock);
    ensure_builtin_locked();
    size_t n = reg_n;
    pthread_mutex_unlock(&reg_lock);
    return n;
}

const px_rt_backend_iface *px_rt_backend_at(size_t i)
{
    pthread_mutex_lock(&reg_lock);
    ensure_builtin_locked();
    const px_rt_backend_iface *b = i < reg_n ? reg[i] : NULL;
    pthread_mutex_unlock(&reg_lock);
    return b;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

px_status px_rt_device_open(const char *name, const px_rt_device_opts *opts, px_rt_device **out,
                            px_err *err)
{
    *out = NULL;
    if (!name)
        name = "cpu";
    const px_rt_backend_iface *b = NULL;
    px_strbuf known = PX_STRBUF_INIT;
    pthread_mutex_lock(&reg_lock);
    ensure_builtin_locked();
    for (size_t i = 0; i < reg_n; i++) {
        if (!strcmp(reg[i]->name, name))
            b = reg[i];
        px_strbuf_addf(&known, "%s%s", i ? ", " : "", reg[i]->name);
    }
    pthread_mutex_unlock(&reg_lock);
    if (!b) {
        px_err_set(err, PX_ENOTFOUND, "no backend named \"%s\" (registered: %s)", name, known.buf);
        px_strbuf_release(&known);
        return PX_ENOTFOUND;
    }
    px_strbuf_release(&known);

    px_rt_device_opts defaults = {0};
    const px_rt_device_iface *iface = NULL;
    void *ctx = NULL;
    px_status st = b->device_open(opts ? opts : &defaults, &iface, &ctx, err);
    if (st)
        return st;
    if (!iface || (st = check_abi(iface->abi_version, "device", name, err)) != PX_OK)
        goto fail_iface;
    if (!PX__RT_HAS(iface, px_rt_device_iface, free) ||
        !PX__RT_HAS(iface, px_rt_device_iface, props) ||
        !PX__RT_HAS(iface, px_rt_device_iface, buffer_alloc) ||
        !PX__RT_HAS(iface, px_rt_device_iface, stream_new)) {
        st = px_err_set(err, PX_EUNSUPPORTED,
                        "backend %s: the device table lacks a "
                        "required slot (free, props, buffer_alloc, stream_new)",
                        name);
        goto fail_iface;
    }
    px_rt_device *d = calloc(1, sizeof *d);
    if (!d) {
        st = px_err_set(err, PX_ENOMEM, "backend %s: out of memory", name);
        goto fail_iface;
    }
    d->backend = b;
    d->iface = iface;
    d->ctx = ctx;
    px_rt_device_props p;
    px_rt_device_props_get(d, &p);
    d->caps = p.caps;
    *out = d;
    return PX_OK;

fail_iface:
    if (iface && PX__RT_HAS(iface, px_rt_device_iface, free))
        iface->free(ctx);
    return st;
}

void px_rt_device_free(px_rt_device *d)
{
    if (!d)
        return;
    d->iface->free(d->ctx);
    free(d);
}

void px_rt_device_props_get(const px_rt_device *d, px_rt_device_props *out)
{
    memset(out, 0, sizeof *out);
    d->iface->props(d->ctx, out);
}

bool px_rt_device_supports_op(const px_rt_device *d, px_ir_op_kind op, px_dtype dtype)
{
    if (!PX__RT_HAS(d->iface, px_rt_device_iface, supports_op))
        return false;
    return d->iface->supports_op(d->ctx, op, dtype);
}

size_t px_rt_device_work_size(const px_rt_device *d, const px_rt_op *op)
{
    if (!PX__RT_HAS(d->iface, px_rt_device_iface, work_size))
        return 0;
    return d->iface->work_size(d->ctx, op);
}

px_rt_layout px_rt_device_weight_layout(const px_rt_device *d, px_dtype dtype, uint64_t cols,
                                        uint64_t rows)
{
    if (!PX__RT_HAS(d->iface, px_rt_device_iface, weight_layout))
        return PX_RT_LAYOUT_ROWS;
    return (px_rt_layout)d->iface->weight_layout(d->ctx, dtype, cols, rows);
}

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

static px_status wrap_buffer(px_rt_device *d, size_t size, const px_rt_buffer_iface *iface,
                             void *ctx, px_rt_buffer **out, px_err *err)
{
    const char *name = d->backend->name;
    px_status st = iface ? check_abi(iface->abi_version, "buffer", name, err)
                         : px_err_set(err, PX_EINTERNAL, "backend %s: no buffer table", name);
    if (st)
        goto fail;
    if (!PX__RT_HAS(iface, px_rt_buffer_iface, free)) {
        st = px_err_set(err, PX_EUNSUPPORTED, "backend %s: buffer table lacks free", name);
        goto fail;
    }
    void *base = PX__RT_HAS(iface, px_rt_buffer_iface, base) ? iface->base(ctx) : NULL;
    if (!base && (!PX__RT_HAS(iface, px_rt_buffer_iface, set) ||
                  !PX__RT_HAS(iface, px_rt_buffer_iface, get))) {
        st = px_err_set(err, PX_EUNSUPPORTED,
                        "backend %s: a buffer that is not "
                        "host-visible must have set and get slots",
                        name);
        goto fail;
    }
    px_rt_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        st = px_err_set(err, PX_ENOMEM, "backend %s: out of memory", name);
        goto fail;
    }
    b->iface = iface;
    b->ctx = ctx;
    b->device = d;
    b->size = size;
    b->base = base;
    *out = b;
    return PX_OK;
fail:
    if (iface && PX__RT_HAS(iface, px_rt_buffer_iface, free))
        iface->free(ctx);
    return st;
}

px_status px_rt_buffer_alloc(px_rt_device *d, size_t size, px_rt_buffer **out, px_err *err)
{
    *out = NULL;
    const px_rt_buffer_iface *iface = NULL;
    void *ctx = NULL;
    px_status st = d->iface->buffer_alloc(d->ctx, size, &iface, &ctx, err);
    if (st)
        return st;
    return wrap_buffer(d, size, iface, ctx, out, err);
}

px_status px_rt_buffer_from_host(px_rt_device *d, const void *ptr, size_t size, px_rt_buffer **out,
                                 bool *copied, px_err *err)
{
    *out = NULL;
    if (copied)
        *copied = false;
    if (PX__RT_HAS(d->iface, px_rt_device_iface, buffer_from_host)) {
        const px_rt_buffer_iface *iface = NULL;
        void *ctx = NULL;
        /* The table takes a non-const pointer; the runtime never writes
         * through a weight buffer. */
        px_status st =
            d->iface->buffer_from_host(d->ctx, (void *)(uintptr_t)ptr, size, &iface, &ctx, err);
        if (st == PX_OK)
            return wrap_buffer(d, size, iface, ctx, out, err);
        if (st != PX_EUNSUPPORTED)
            return st;
        px_err_clear(err);
    }
    px_status st = px_rt_buffer_alloc(d, size, out, err);
    if (st)
        return st;
    if ((st = px_rt_buffer_set(*out, 0, ptr, size, err)) != PX_OK) {
        px_rt_buffer_free(*out);
        *out = NULL;
        return st;
    }
    if (copied)
        *copied = true;
    return PX_OK;
}

void px_rt_buffer_free(px_rt_buffer *b)
{
    if (!b)
        return;
    b->iface->free(b->ctx);
    free(b);
}

size_t px_rt_buffer_size(const px_rt_buffer *b)
{
    return b->size;
}

void *px_rt_buffer_base(const px_rt_buffer *b)
{
    return b->base;
}

px_rt_device *px_rt_buffer_device(const px_rt_buffer *b)
{
    return b->device;
}

static px_status check_range(const px_rt_buffer *b, size_t offset, size_t n, px_err *err)
{
    size_t end;
    if (!px__add_size(offset, n, &end) || end > b->size)
        return px_err_set(err, PX_ERANGE,
                          "buffer of %zu bytes: %zu bytes at offset %zu "
                          "lie outside it",
                          b->size, n, offset);
    return PX_OK;
}

px_status px_rt_buffer_set(px_rt_buffer *b, size_t offset, const void *src, size_t n, px_err *err)
{
    px_status st = check_range(b, offset, n, err);
    if (st || n == 0)
        return st;
    if (PX__RT_HAS(b->iface, px_rt_buffer_iface, set))
        return b->iface->set(b->ctx, offset, src, n, err);
    memcpy((char *)b->base + offset, src, n);
    return PX_OK;
}

px_status px_rt_buffer_get(const px_rt_buffer *b, size_t offset, void *dst, size_t n, px_err *err)
{
    px_status st = check_range(b, offset, n, err);
    if (st || n == 0)
        return st;
    if (PX__RT_HAS(b->iface, px_rt_buffer_iface, get))
        return b->iface->get(b->ctx, offset, dst, n, err);
    memcpy(dst, (const char *)b->base + offset, n);
    return PX_OK;
}

/* Size of the host staging buffer the defaults move data through. */
#define STAGING_BYTES ((size_t)1 << 20)

px_status px_rt_buffer_fill(px_rt_buffer *b, size_t offset, uint8_t value, size_t n, px_err *err)
{
    px_status st = check_range(b, offset, n, err);
    if (st || n == 0)
        return st;
    if (PX__RT_HAS(b->iface, px_rt_buffer_iface, fill))
        return b->iface->fill(b->ctx, offset, value, n, err);
    if (b->base && !PX__RT_HAS(b->iface, px_rt_buffer_iface, set)) {
        memset((char *)b->base + offset, value, n);
        return PX_OK;
    }
    size_t chunk = PX_MIN(n, STAGING_BYTES);
    uint8_t *staging = malloc(chunk);
    if (!staging)
        return px_err_set(err, PX_ENOMEM, "buffer fill: out of memory");
    memset(staging, value, chunk);
    for (size_t done = 0; done < n && st == PX_OK; done += chunk) {
        size_t m = PX_MIN(chunk, n - done);
        st = px_rt_buffer_set(b, offset + done, staging, m, err);
    }
    free(staging);
    return st;
}

px_status px_rt_buffer_copy(px_rt_buffer *dst, size_t dst_offset, const px_rt_buffer *src,
                            size_t src_offset, size_t n, px_err *err)
{
    px_status st = check_range(dst, dst_offset, n, err);
    if (st == PX_OK)
        st = check_range(src, src_offset, n, err);
    if (st || n == 0)
        return st;
    if (PX__RT_HAS(dst->iface, px_rt_buffer_iface, copy_from))
        return dst->iface->copy_from(dst->ctx, dst_offset, src, src_offset, n, err);
    if (src->base)
        return px_rt_buffer_set(dst, dst_offset, (const char *)src->base + src_offset, n, err);
    size_t chunk = PX_MIN(n, STAGING_BYTES);
    uint8_t *staging = malloc(chunk);
    if (!staging)
        return px_err_set(err, PX_ENOMEM, "buffer copy: out of memory");
    for (size_t done = 0; done < n && st == PX_OK; done += chunk) {
        size_t m = PX_MIN(chunk, n - done);
        st = px_rt_buffer_get(src, src_offset + done, staging, m, err);
        if (st == PX_OK)
            st = px_rt_buffer_set(dst, dst_offset + done, staging, m, err);
    }
    free(staging);
    return st;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

px_status px_rt_stream_new(px_rt_device *d, px_rt_stream **out, px_err *err)
{
    *out = NULL;
    const char *name = d->backend->name;
    const px_rt_stream_iface *iface = NULL;
    void *ctx = NULL;
    px_status st = d->iface->stream_new(d->ctx, &iface, &ctx, err);
    if (st)
        return st;
    if (!iface) {
        st = px_err_set(err, PX_EINTERNAL, "backend %s: no stream table", name);
        goto fail;
    }
    if ((st = check_abi(iface->abi_version, "stream", name, err)) != PX_OK)
        goto fail;
    if (!PX__RT_HAS(iface, px_rt_stream_iface, free) ||
        !PX__RT_HAS(iface, px_rt_stream_iface, run)) {
        st = px_err_set(err, PX_EUNSUPPORTED,
                        "backend %s: the stream table lacks "
                        "free or run",
                        name);
        goto fail;
    }
    px_rt_stream *s = calloc(1, sizeof *s);
    if (!s) {
        st = px_err_set(err, PX_ENOMEM, "backend %s: out of memory", name);
        goto fail;
    }
    s->iface = iface;
    s->ctx = ctx;
    s->device = d;
    *out = s;
    return PX_OK;
fail:
    if (iface && PX__RT_HAS(iface, px_rt_stream_iface, free))
        iface->free(ctx);
    return st;
}

void px_rt_stream_free(px_rt_stream *s)
{
    if (!s)
        return;
    s->iface->free(s->ctx);
    free(s);
}

px_rt_device *px_rt_stream_device(const px_rt_stream *s)
{
    return s->device;
}

px_status px_rt_stream_synchronize(px_rt_stream *s, px_err *err)
{
    if (!PX__RT_HAS(s->iface, px_rt_stream_iface, synchronize))
        return PX_OK;
    return s->iface->synchronize(s->ctx, err);
}

void px_rt_stream_set_telemetry(px_rt_stream *s, px_rt_telemetry_fn fn, void *ud)
{
    s->telemetry = fn;
    s->telemetry_ud = ud;
}

void px_rt_stream_set_fault_hook(px_rt_stream *s, px_rt_fault_hook hook, void *ud)
{
    s->fault_hook = hook;
    s->fault_ud = ud;
}

px_status px_rt_stream_run(px_rt_stream *s, const px_rt_op *ops, size_t n_ops, px_err *err)
{
    if (!s->telemetry && !s->fault_hook)
        return s->iface->run(s->ctx, ops, n_ops, NULL, err);
    if (!s->fault_hook && (s->device->caps & PX_RT_CAP_OP_TIMING)) {
        /* The device times every op of a list: runs of up to 64 ops. */
        px_rt_op_timing timing[64];
        for (size_t i = 0; i < n_ops; i += PX_ARRAY_LEN(timing)) {
            size_t n = PX_MIN(n_ops - i, PX_ARRAY_LEN(timing));
            memset(timing, 0, n * sizeof *timing);
            px_status st = s->iface->run(s->ctx, ops + i, n, timing, err);
            if (st == PX_OK)
                st = px_rt_stream_synchronize(s, err);
            if (st)
                return st;
            for (size_t j = 0; j < n; j++) {
                px_rt_op_record rec = {
                    .kind = ops[i + j].kind, .layer = ops[i + j].layer, .ns = timing[j].ns};
                px_rt_op_cost(&ops[i + j], &rec.flops, &rec.bytes);
                s->telemetry(&rec, s->telemetry_ud);
            }
        }
        return PX_OK;
    }
    /* One op at a time, so that each can be measured and faulted. */
    for (size_t i = 0; i < n_ops; i++) {
        px_rt_op_timing timing = {0};
        uint64_t t0 = px_now_ns();
        px_status st = s->iface->run(s->ctx, &ops[i], 1, &timing, err);
        if (st == PX_OK && (s->telemetry || timing.ns == 0))
            st = px_rt_stream_synchronize(s, err);
        uint64_t host_ns = px_now_ns() - t0;
        if (st)
            return st;
        if (s->fault_hook) {
            if (PX__RT_HAS(s->iface, px_rt_stream_iface, fault))
                st = s->iface->fault(s->ctx, &ops[i], s->fault_hook, s->fault_ud, err);
            else
                st = s->fault_hook(&ops[i], s->fault_ud, err);
            if (st)
                return st;
        }
        if (s->telemetry) {
            px_rt_op_record rec = {
                .kind = ops[i].kind, .layer = ops[i].layer, .ns = timing.ns ? timing.ns : host_ns};
            px_rt_op_cost(&ops[i], &rec.flops, &rec.bytes);
            s->telemetry(&rec, s->telemetry_ud);
        }
    }
    return PX_OK;
}
