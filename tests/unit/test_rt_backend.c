/* The backend interface: the registry and its refusals, ABI versions and
 * optional slots with their defaults, a session on a device whose memory
 * has no host address (reached only through set/get, as a GPU's would
 * be), telemetry per op and the fault hook. */
#include "px_test.h"

#include <string.h>

#include "plexus/rt.h"
#include "rt/rt_impl.h"

/* ------------------------------------------------------------------ */
/* A device without host-visible memory                                */
/* ------------------------------------------------------------------ */

/* Its buffers expose only set and get; its stream runs the cpu kernels on
 * host-visible shadows of its own memory, which nothing outside the
 * backend can see. */
typedef struct hl_buf {
    uint8_t *mem;
    px_rt_buffer *shadow;
} hl_buf;

typedef struct hl_dev {
    px_rt_device *cpu;
    uint32_t n_threads;
} hl_dev;

typedef struct hl_stream {
    px__rt_cpu_exec exec;
} hl_stream;

static void hl_buf_free(void *b)
{
    hl_buf *hb = b;
    px_rt_buffer_free(hb->shadow);
    free(hb->mem);
    free(hb);
}

static px_status hl_set(void *b, size_t off, const void *src, size_t n, px_err *err)
{
    (void)err;
    memcpy(((hl_buf *)b)->mem + off, src, n);
    return PX_OK;
}

static px_status hl_get(void *b, size_t off, void *dst, size_t n, px_err *err)
{
    (void)err;
    memcpy(dst, ((hl_buf *)b)->mem + off, n);
    return PX_OK;
}

static const px_rt_buffer_iface hl_buf_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_buffer_iface),
    .free = hl_buf_free,
    .set = hl_set,
    .get = hl_get,
};

static void hl_stream_free(void *s)
{
    px__rt_pool_free(((hl_stream *)s)->exec.pool);
    free(s);
}

/* The host-visible twin of a tensor of this backend. */
static const px_rt_tensor *twin(const px_rt_tensor *t, const px_rt_tensor **from, px_rt_tensor *to,
                                size_t *n)
{
    if (!t)
        return NULL;
    for (size_t i = 0; i < *n; i++)
        if (from[i] == t)
            return &to[i];
    from[*n] = t;
    to[*n] = *t;
    to[*n].buffer = ((hl_buf *)t->buffer->ctx)->shadow;
    return &to[(*n)++];
}

static px_status hl_run(void *s, const px_rt_op *ops, size_t n_ops, px_rt_op_timing *timing,
                        px_err *err)
{
    (void)timing;
    for (size_t i = 0; i < n_ops; i++) {
        const px_rt_tensor *from[8];
        px_rt_tensor to[8];
        size_t n = 0;
        px_rt_op op = ops[i];
        for (int j = 0; j < 5; j++)
            op.src[j] = twin(ops[i].src[j], from, to, &n);
        op.dst = twin(ops[i].dst, from, to, &n);
        op.work = twin(ops[i].work, from, to, &n);
        px_status st = px__rt_cpu_run_op(&((hl_stream *)s)->exec, &op, err);
        if (st)
            return st;
    }
    return PX_OK;
}

static const px_rt_stream_iface hl_stream_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_stream_iface),
    .free = hl_stream_free,
    .run = hl_run,
};

static void hl_free(void *d)
{
    px_rt_device_free(((hl_dev *)d)->cpu);
    free(d);
}

static void hl_props(void *d, px_rt_device_props *p)
{
    px_strlcpy(p->name, "hostless", sizeof p->name);
    p->kind = PX_RT_DEVICE_ACCEL;
    p->n_threads = ((hl_dev *)d)->n_threads;
    p->emulated = true;
}

static bool hl_supports(void *d, px_ir_op_kind op, px_dtype t)
{
    (void)d;
    return px__rt_cpu_supports(op, t);
}

static px_status hl_alloc(void *d, size_t size, const px_rt_buffer_iface **iface, void **buf,
                          px_err *err)
{
    hl_buf *hb = calloc(1, sizeof *hb);
    hb->mem = calloc(1, size ? size : 1);
    px_status st =
        px_rt_buffer_from_host(((hl_dev *)d)->cpu, hb->mem, size, &hb->shadow, NULL, err);
    if (st) {
        free(hb->mem);
        free(hb);
        return st;
    }
    *iface = &hl_buf_iface;
    *buf = hb;
    return PX_OK;
}

static px_status hl_stream_new(void *d, const px_rt_stream_iface **iface, void **stream,
                               px_err *err)
{
    hl_stream *s = calloc(1, sizeof *s);
    s->exec.k = px__rt_kernels_native();
    px_status st = px__rt_pool_new(((hl_dev *)d)->n_threads, &s->exec.pool, err);
    if (st) {
        free(s);
        return st;
    }
    *iface = &hl_stream_iface;
    *stream = s;
    return PX_OK;
}

static size_t hl_work(void *d, const px_rt_op *op)
{
    return px__rt_cpu_work_size(((hl_dev *)d)->n_threads, op);
}

static const px_rt_device_iface hl_dev_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_device_iface),
    .free = hl_free,
    .props = hl_props,
    .supports_op = hl_supports,
    .buffer_alloc = hl_alloc,
    .stream_new = hl_stream_new,
    .work_size = hl_work,
};

/* The same table as an older minor version would have it: the optional
 * slots past buffer_alloc and stream_new are outside its size. */
static const px_rt_device_iface hl_old_iface = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = offsetof(px_rt_device_iface, buffer_from_host),
    .free = hl_free,
    .props = hl_props,
    .supports_op = NULL,
    .buffer_alloc = hl_alloc,
    .stream_new = hl_stream_new,
    .work_size = hl_work, /* beyond size: must be ignored */
};

static px_status hl_open_with(const px_rt_device_opts *o, const px_rt_device_iface *tbl,
                              const px_rt_device_iface **iface, void **dev, px_err *err)
{
    hl_dev *d = calloc(1, sizeof *d);
    d->n_threads = o->n_threads ? o->n_threads : 2;
    px_rt_device_opts co = {.n_threads = 1};
    px_status st = px_rt_device_open("cpu", &co, &d->cpu, err);
    if (st) {
        free(d);
        return st;
    }
    *iface = tbl;
    *dev = d;
    return PX_OK;
}

static px_status hl_open(const px_rt_device_opts *o, const px_rt_device_iface **iface, void **dev,
                         px_err *err)
{
    return hl_open_with(o, &hl_dev_iface, iface, dev, err);
}

static px_status hl_open_old(const px_rt_device_opts *o, const px_rt_device_iface **iface,
                             void **dev, px_err *err)
{
    return hl_open_with(o, &hl_old_iface, iface, dev, err);
}

static const px_rt_backend_iface hostless = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_backend_iface),
    .name = "hostless",
    .description = "test device reached only through set and get",
    .device_open = hl_open,
};

static const px_rt_backend_iface hostless_old = {
    .abi_version = PX_RT_ABI_VERSION,
    .size = sizeof(px_rt_backend_iface),
    .name = "hostless-old",
    .device_open = hl_open_old,
};

static int setup(void **state)
{
    (void)state;
    px_err err;
    px_assert_ok(px_rt_backend_register(&hostless, &err), &err);
    px_assert_ok(px_rt_backend_register(&hostless_old, &err), &err);
    return 0;
}

static px_rt_model *model(void)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.n_layers = 3;
    o.vocab_size = 300;
    char *path = px_asprintf("%s/m.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    free(path);
    return m;
}

/* Logits after feeding 6 tokens then 2 decode steps, into out[300]. */
static px_status run_steps(px_rt_session *s, float *out, px_err *err)
{
    int32_t seq, toks[6] = {3, 30, 60, 90, 120, 150};
    px_status st = px_rt_seq_add(s, &seq, err);
    for (uint32_t step = 0; st == PX_OK && step < 3; step++) {
        uint32_t n = step ? 1 : 6, pos = step ? 5 + step : 0;
        px_rt_seq_step ss = {.seq = seq, .pos = pos, .n_tokens = n, .tokens = toks};
        px_rt_output o;
        st = px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &ss}, NULL, &o, err);
        if (st == PX_OK)
            memcpy(out, o.data, 300 * sizeof(float));
        toks[0] = (int32_t)(7 * step + 1);
    }
    px_status rm = px_rt_seq_remove(s, seq, NULL);
    return st != PX_OK ? st : rm;
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_registry_lists_backends_and_refuses_bad_tables(void **state)
{
    (void)state;
    px_err err;
    assert_true(px_rt_backend_count() >= 3);
    assert_string_equal(px_rt_backend_at(0)->name, "cpu");
    assert_null(px_rt_backend_at(1000));
    assert_int_equal(px_rt_backend_register(&px__rt_cpu_backend, &err), PX_EEXIST);
    px_rt_backend_iface future = hostless;
    future.name = "future";
    future.abi_version = (2u << 16) | 0;
    assert_int_equal(px_rt_backend_register(&future, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "ABI 2.0");
    px_rt_backend_iface truncated = hostless;
    truncated.name = "truncated";
    truncated.size = offsetof(px_rt_backend_iface, device_open);
    assert_int_equal(px_rt_backend_register(&truncated, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "device_open");
    px_rt_backend_iface unnamed = hostless;
    unnamed.name = "";
    assert_int_equal(px_rt_backend_register(&unnamed, &err), PX_EINVAL);
    px_rt_device *d;
    assert_int_equal(px_rt_device_open("warp-drive", NULL, &d, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "cpu, cuda, hostless");
}

static void test_cpu_device_describes_itself_and_its_ops(void **state)
{
    (void)state;
    px_err err;
    px_rt_device *d;
    px_assert_ok(px_rt_device_open(NULL, &(px_rt_device_opts){.n_threads = 3}, &d, &err), &err);
    px_rt_device_props p;
    px_rt_device_props_get(d, &p);
    assert_string_equal(p.name, "cpu");
    assert_int_equal(p.n_threads, 3);
    assert_true(p.caps & PX_RT_CAP_HOST_MEMORY);
    assert_false(p.emulated);
    px_assert_contains(p.description, "3 threads");
    assert_true(px_rt_device_supports_op(d, PX_IR_OP_MATMUL, PX_DTYPE_Q8_0));
    assert_true(px_rt_device_supports_op(d, PX_IR_OP_EMBEDDING, PX_DTYPE_BF16));
    assert_true(px_rt_device_supports_op(d, PX_IR_OP_MATMUL, PX_DTYPE_Q4_K));
    assert_false(px_rt_device_supports_op(d, PX_IR_OP_MATMUL, PX_DTYPE_IQ2_XXS));
    assert_false(px_rt_device_supports_op(d, PX_IR_OP_MOE_EXPERTS, PX_DTYPE_F32));
    assert_false(px_rt_device_supports_op(d, PX_IR_OP_ATTENTION, PX_DTYPE_F16));
    px_rt_device_free(d);
    px_rt_device_free(NULL);
}

static void test_buffers_without_host_address_use_the_defaults(void **state)
{
    (void)state;
    px_err err;
    px_rt_device *hl, *cpu;
    px_assert_ok(px_rt_device_open("hostless", NULL, &hl, &err), &err);
    px_assert_ok(px_rt_device_open("cpu", NULL, &cpu, &err), &err);
    px_rt_buffer *a, *b;
    px_assert_ok(px_rt_buffer_alloc(hl, 3 << 20, &a, &err), &err);
    px_assert_ok(px_rt_buffer_alloc(cpu, 3 << 20, &b, &err), &err);
    assert_null(px_rt_buffer_base(a));
    assert_non_null(px_rt_buffer_base(b));
    assert_ptr_equal(px_rt_buffer_device(a), hl);
    /* fill goes through a staging buffer (larger than one chunk). */
    px_assert_ok(px_rt_buffer_fill(a, 1, 0x5a, (3 << 20) - 2, &err), &err);
    uint8_t edge[4];
    px_assert_ok(px_rt_buffer_get(a, 0, edge, 2, &err), &err);
    assert_int_equal(edge[0], 0);
    assert_int_equal(edge[1], 0x5a);
    /* copy from device memory to host memory and back. */
    px_assert_ok(px_rt_buffer_copy(b, 0, a, 0, 3 << 20, &err), &err);
    assert_int_equal(((uint8_t *)px_rt_buffer_base(b))[(3 << 20) - 2], 0x5a);
    assert_int_equal(((uint8_t *)px_rt_buffer_base(b))[(3 << 20) - 1], 0);
    memset(px_rt_buffer_base(b), 7, 100);
    px_assert_ok(px_rt_buffer_copy(a, 50, b, 0, 100, &err), &err);
    px_assert_ok(px_rt_buffer_get(a, 49, edge, 3, &err), &err);
    assert_int_equal(edge[0], 0x5a);
    assert_int_equal(edge[1], 7);
    /* Ranges are checked. */
    assert_int_equal(px_rt_buffer_set(a, (3 << 20) - 1, edge, 2, &err), PX_ERANGE);
    px_assert_contains(err.msg, "outside");
    assert_int_equal(px_rt_buffer_get(a, SIZE_MAX, edge, 2, &err), PX_ERANGE);
    assert_int_equal(px_rt_buffer_copy(b, 0, a, 1, 3 << 20, &err), PX_ERANGE);
    /* Host memory is wrapped by the cpu, copied by the other device. */
    static const uint8_t host[64] = {1, 2, 3};
    px_rt_buffer *w1, *w2;
    bool copied;
    px_assert_ok(px_rt_buffer_from_host(cpu, host, sizeof host, &w1, &copied, &err), &err);
    assert_false(copied);
    assert_ptr_equal(px_rt_buffer_base(w1), host);
    px_assert_ok(px_rt_buffer_from_host(hl, host, sizeof host, &w2, &copied, &err), &err);
    assert_true(copied);
    px_assert_ok(px_rt_buffer_get(w2, 0, edge, 3, &err), &err);
    assert_memory_equal(edge, host, 3);
    px_rt_buffer_free(w1);
    px_rt_buffer_free(w2);
    px_rt_buffer_free(a);
    px_rt_buffer_free(b);
    px_rt_buffer_free(NULL);
    px_rt_device_free(hl);
    px_rt_device_free(cpu);
}

static void test_session_on_device_memory_matches_the_cpu_bit_for_bit(void **state)
{
    (void)state;
    px_rt_model *m = model();
    px_err err;
    px_rt_device *hl;
    px_assert_ok(px_rt_device_open("hostless", &(px_rt_device_opts){.n_threads = 2}, &hl, &err),
                 &err);
    px_rt_session *on_hl, *on_cpu;
    px_assert_ok(
        px_rt_session_new(m, &(px_rt_session_opts){.device = hl, .context = 32}, &on_hl, &err),
        &err);
    px_assert_ok(
        px_rt_session_new(m, &(px_rt_session_opts){.n_threads = 2, .context = 32}, &on_cpu, &err),
        &err);
    px_rt_session_info info;
    px_rt_session_info_get(on_hl, &info);
    assert_true(info.weights_copied);
    assert_string_equal(info.device.name, "hostless");
    assert_true(info.device.emulated);
    assert_true(info.weight_bytes > 0);
    assert_true(info.kv_bytes > 0);
    float a[300], b[300];
    px_assert_ok(run_steps(on_hl, a, &err), &err);
    px_assert_ok(run_steps(on_cpu, b, &err), &err);
    assert_memory_equal(a, b, sizeof a);
    px_rt_session_free(on_hl);
    px_rt_session_free(on_cpu);
    px_rt_device_free(hl);

    /* An older table without supports_op: nothing is supported. */
    px_rt_session *old;
    assert_int_equal(
        px_rt_session_new(m, &(px_rt_session_opts){.backend = "hostless-old"}, &old, &err),
        PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "cannot run");
    px_rt_model_free(m);
}

typedef struct tally {
    int n, n_matmul, n_attention;
    int32_t max_layer;
    uint64_t flops, ns;
} tally;

static void on_op(const px_rt_op_record *r, void *ud)
{
    tally *t = ud;
    t->n++;
    t->n_matmul += r->kind == PX_IR_OP_MATMUL;
    t->n_attention += r->kind == PX_IR_OP_ATTENTION;
    t->max_layer = PX_MAX(t->max_layer, r->layer);
    t->flops += r->flops;
    t->ns += r->ns;
    assert_true(r->ns > 0);
    if (r->kind == PX_IR_OP_MATMUL)
        assert_true(r->flops > 0 && r->bytes > 0);
}

typedef struct fault {
    int mode; /* 1: fail layer 1's attention; 2: corrupt it */
} fault;

static px_status inject(const px_rt_op *op, void *ud, px_err *err)
{
    fault *f = ud;
    if (op->kind != PX_IR_OP_ATTENTION || op->layer != 1)
        return PX_OK;
    if (f->mode == 1)
        return px_err_set(err, PX_EPEER, "injected: layer 1 attention failed");
    return px_rt_buffer_fill(op->dst->buffer, op->dst->offset, 0x3f, 16, err);
}

static void test_telemetry_and_fault_hook_see_every_op(void **state)
{
    (void)state;
    px_rt_model *m = model();
    px_err err;
    px_rt_session *s;
    px_assert_ok(
        px_rt_session_new(m, &(px_rt_session_opts){.n_threads = 2, .context = 32}, &s, &err), &err);
    float clean[300], out[300];
    px_assert_ok(run_steps(s, clean, &err), &err);

    tally t = {0};
    px_rt_stream_set_telemetry(px_rt_session_stream(s), on_op, &t);
    px_assert_ok(run_steps(s, out, &err), &err);
    /* 3 steps: embedding, 15 ops per layer, final norm and classifier. */
    assert_int_equal(t.n, 3 * (1 + 15 * 3 + 2));
    assert_int_equal(t.n_matmul, 3 * 7 * 3);
    assert_int_equal(t.n_attention, 3 * 3);
    assert_int_equal(t.max_layer, 2);
    assert_true(t.flops > 0 && t.ns > 0);
    assert_memory_equal(out, clean, sizeof out);
    px_rt_stream_set_telemetry(px_rt_session_stream(s), NULL, NULL);

    fault f = {.mode = 1};
    px_rt_stream_set_fault_hook(px_rt_session_stream(s), inject, &f);
    assert_int_equal(run_steps(s, out, &err), PX_EPEER);
    px_assert_contains(err.msg, "injected");
    f.mode = 2;
    px_assert_ok(run_steps(s, out, &err), &err);
    assert_true(memcmp(out, clean, sizeof out) != 0);
    px_rt_stream_set_fault_hook(px_rt_session_stream(s), NULL, NULL);
    px_assert_ok(run_steps(s, out, &err), &err);
    assert_memory_equal(out, clean, sizeof out);
    px_rt_session_free(s);
    px_rt_model_free(m);
}

static void test_tensor_init_checks_blocks_and_sizes(void **state)
{
    (void)state;
    px_rt_tensor t;
    px_err err;
    px_assert_ok(px_rt_tensor_init(&t, PX_DTYPE_Q8_0, 2, (int64_t[]){64, 3}, &err), &err);
    assert_int_equal(t.nb[0], 34);
    assert_int_equal(t.nb[1], 68);
    assert_int_equal(px_rt_tensor_nbytes(&t), 204);
    assert_null(px_rt_tensor_data(&t));
    assert_int_equal(px_rt_tensor_init(&t, PX_DTYPE_Q8_0, 1, (int64_t[]){40}, &err), PX_EINVAL);
    px_assert_contains(err.msg, "blocks");
    assert_int_equal(px_rt_tensor_init(&t, PX_DTYPE_F32, 2, (int64_t[]){4, 0}, &err), PX_EINVAL);
    assert_int_equal(px_rt_tensor_init(&t, PX_DTYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, &err),
                     PX_EINVAL);
    assert_int_equal(
        px_rt_tensor_init(&t, PX_DTYPE_F32, 3, (int64_t[]){INT64_MAX / 2, INT64_MAX / 2, 4}, &err),
        PX_ERANGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_lists_backends_and_refuses_bad_tables),
        cmocka_unit_test(test_cpu_device_describes_itself_and_its_ops),
        cmocka_unit_test(test_buffers_without_host_address_use_the_defaults),
        cmocka_unit_test(test_session_on_device_memory_matches_the_cpu_bit_for_bit),
        cmocka_unit_test(test_telemetry_and_fault_hook_see_every_op),
        cmocka_unit_test(test_tensor_init_checks_blocks_and_sizes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
