/* The emu backend: profiles are checked (an emulated device is never
 * faster than the host), its results are the cpu backend's bit for bit,
 * its observed op times are the real ones stretched by the slowdown of
 * each op's class (compute- or memory-bound), its memory capacity is
 * enforced, and it always says it is emulated.  Also the inventory's
 * "emu" member that the profiles come from. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/rt.h"

static px_rt_model *model;

static int setup(void **state)
{
    (void)state;
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 256;
    o.hidden_dim = 512;
    o.n_layers = 2;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.vocab_size = 512;
    o.context_length = 256;
    o.seed = 11;
    char *path = px_asprintf("%s/emu.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    px_assert_ok(px_rt_model_open(path, &model, &err), &err);
    free(path);
    px_assert_ok(px_rt_emu_register(&err), &err);
    px_assert_ok(px_rt_emu_register(&err), &err); /* idempotent */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    px_rt_model_free(model);
    return 0;
}

static void test_profile_refuses_speedups_and_bad_jitter(void **state)
{
    (void)state;
    px_rt_emu_profile p;
    px_err err;
    assert_int_equal(px_rt_emu_profile_parse("{\"compute_slowdown\": 0.5}", &p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "only be slower than the host");
    assert_int_equal(px_rt_emu_profile_parse("{\"memory_slowdown\": -3}", &p, &err), PX_EINVAL);
    assert_int_equal(px_rt_emu_profile_parse("{\"jitter\": 1}", &p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "[0, 1)");
    assert_int_equal(px_rt_emu_profile_parse("{\"slowdown\": 2}", &p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "unknown member \"slowdown\"");
    assert_int_equal(px_rt_emu_profile_parse("[1]", &p, &err), PX_EINVAL);
    assert_int_not_equal(px_rt_emu_profile_parse("{\"jitter\": ", &p, &err), PX_OK);

    /* Round trip. */
    px_assert_ok(px_rt_emu_profile_parse("{\"compute_slowdown\": 3, \"memory_slowdown\": 2, "
                                         "\"jitter\": 0.1, \"seed\": 9, \"memory_bytes\": 1000,"
                                         " \"name\": \"n.emu\"}",
                                         &p, &err),
                 &err);
    px_strbuf sb = PX_STRBUF_INIT;
    px_assert_ok(px_rt_emu_profile_format(&p, &sb, &err), &err);
    px_rt_emu_profile q;
    px_assert_ok(px_rt_emu_profile_parse(sb.buf, &q, &err), &err);
    assert_true(q.compute_slowdown == 3 && q.memory_slowdown == 2 && q.jitter == 0.1);
    assert_int_equal(q.seed, 9);
    assert_int_equal(q.memory_bytes, 1000);
    assert_string_equal(q.name, "n.emu");
    px_strbuf_release(&sb);
}

static void test_ops_are_classified_by_flops_per_byte(void **state)
{
    (void)state;
    int64_t wne[2] = {256, 256}, one[2] = {256, 1}, many[2] = {256, 64};
    px_rt_tensor w, x1, x64, y1, y64;
    px_err err;
    px_assert_ok(px_rt_tensor_init(&w, PX_DTYPE_F32, 2, wne, &err), &err);
    px_assert_ok(px_rt_tensor_init(&x1, PX_DTYPE_F32, 2, one, &err), &err);
    px_assert_ok(px_rt_tensor_init(&y1, PX_DTYPE_F32, 2, one, &err), &err);
    px_assert_ok(px_rt_tensor_init(&x64, PX_DTYPE_F32, 2, many, &err), &err);
    px_assert_ok(px_rt_tensor_init(&y64, PX_DTYPE_F32, 2, many, &err), &err);
    px_rt_op mv = {.kind = PX_IR_OP_MATMUL, .src = {&x1, &w}, .dst = &y1};
    px_rt_op mm = {.kind = PX_IR_OP_MATMUL, .src = {&x64, &w}, .dst = &y64};
    px_rt_op add = {.kind = PX_IR_OP_ADD, .src = {&x64, &x64}, .dst = &y64};
    assert_false(px_rt_emu_op_compute_bound(&mv));
    assert_true(px_rt_emu_op_compute_bound(&mm));
    assert_false(px_rt_emu_op_compute_bound(&add));
}

/* Matrix products of every weight format: one activation row (decode) is
 * memory-bound, however few bits a weight takes (Q2_K's 2.6 would make 6
 * FLOPs per stored byte); many rows (prefill) are compute-bound. */
static void test_small_row_products_are_memory_bound_in_every_format(void **state)
{
    (void)state;
    static const px_dtype formats[] = {PX_DTYPE_F32,  PX_DTYPE_F16,  PX_DTYPE_BF16, PX_DTYPE_Q8_0,
                                       PX_DTYPE_Q4_0, PX_DTYPE_Q5_0, PX_DTYPE_Q2_K, PX_DTYPE_Q3_K,
                                       PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};
    int64_t wne[2] = {1024, 1024}, one[2] = {1024, 1}, many[2] = {1024, 64};
    px_rt_tensor x1, x64, y1, y64;
    px_err err;
    px_assert_ok(px_rt_tensor_init(&x1, PX_DTYPE_F32, 2, one, &err), &err);
    px_assert_ok(px_rt_tensor_init(&y1, PX_DTYPE_F32, 2, one, &err), &err);
    px_assert_ok(px_rt_tensor_init(&x64, PX_DTYPE_F32, 2, many, &err), &err);
    px_assert_ok(px_rt_tensor_init(&y64, PX_DTYPE_F32, 2, many, &err), &err);
    for (size_t i = 0; i < PX_ARRAY_LEN(formats); i++) {
        px_rt_tensor w;
        px_assert_ok(px_rt_tensor_init(&w, formats[i], 2, wne, &err), &err);
        for (int kind = 0; kind < 2; kind++) {
            px_ir_op_kind k = kind ? PX_IR_OP_CLASSIFIER : PX_IR_OP_MATMUL;
            px_rt_op mv = {.kind = k, .src = {&x1, &w}, .dst = &y1};
            px_rt_op mm = {.kind = k, .src = {&x64, &w}, .dst = &y64};
            if (px_rt_emu_op_compute_bound(&mv))
                fail_msg("%s: a one-row product counted compute-bound", px_dtype_name(formats[i]));
            if (!px_rt_emu_op_compute_bound(&mm))
                fail_msg("%s: a 64-row product counted memory-bound", px_dtype_name(formats[i]));
        }
    }
}

static px_rt_session *open_session(const char *backend, const char *profile, px_err *err,
                                   px_status *st)
{
    px_rt_device *dev = NULL;
    px_rt_device_opts o = {.n_threads = 1, .profile = profile};
    *st = px_rt_device_open(backend, &o, &dev, err);
    if (*st)
        return NULL;
    px_rt_session_opts so = {.device = dev, .max_seqs = 1, .max_batch_tokens = 64};
    px_rt_session *s = NULL;
    *st = px_rt_session_new(model, &so, &s, err);
    if (*st) {
        px_rt_device_free(dev);
        return NULL;
    }
    return s;
}

static void close_session(px_rt_session *s)
{
    px_rt_device *dev = px_rt_stream_device(px_rt_session_stream(s));
    px_rt_session_free(s);
    px_rt_device_free(dev);
}

static void test_results_match_the_cpu_bit_for_bit(void **state)
{
    (void)state;
    px_err err;
    px_status st;
    px_rt_session *cpu = open_session("cpu", NULL, &err, &st);
    px_assert_ok(st, &err);
    px_rt_session *emu = open_session("emu",
                                      "{\"compute_slowdown\": 2, \"memory_slowdown\": 3, "
                                      "\"jitter\": 0.3, \"name\": \"t.emu\"}",
                                      &err, &st);
    px_assert_ok(st, &err);
    px_rt_session_info info;
    px_rt_session_info_get(emu, &info);
    assert_true(info.device.emulated);
    px_assert_contains(info.device.description, "emulated");
    px_assert_contains(info.device.name, "t.emu");
    int32_t toks[12] = {1, 5, 9, 300, 7, 7, 8, 100, 200, 3, 4, 5};
    px_rt_session *ss[2] = {cpu, emu};
    float *logits[2];
    for (int k = 0; k < 2; k++) {
        int32_t seq;
        px_assert_ok(px_rt_seq_add(ss[k], &seq, &err), &err);
        px_rt_seq_step step = {.seq = seq, .pos = 0, .n_tokens = 12, .tokens = toks};
        px_rt_batch b = {.n_seqs = 1, .seqs = &step};
        px_rt_output out;
        px_assert_ok(px_rt_forward(ss[k], &b, NULL, &out, &err), &err);
        step = (px_rt_seq_step){.seq = seq, .pos = 12, .n_tokens = 1, .tokens = toks};
        px_assert_ok(px_rt_forward(ss[k], &b, NULL, &out, &err), &err);
        logits[k] = malloc(out.row_len * sizeof(float));
        memcpy(logits[k], out.data, out.row_len * sizeof(float));
    }
    assert_memory_equal(logits[0], logits[1], 512 * sizeof(float));
    free(logits[0]);
    free(logits[1]);
    close_session(cpu);
    close_session(emu);
}

typedef struct tally {
    uint64_t ns_compute, ns_memory;
} tally;

static void on_op(const px_rt_op_record *rec, void *ud)
{
    tally *t = ud;
    bool compute = rec->bytes && (double)rec->flops >= PX_RT_EMU_COMPUTE_INTENSITY * rec->bytes;
    if (compute)
        t->ns_compute += rec->ns;
    else
        t->ns_memory += rec->ns;
}

/* The ratio of the fastest of interleaved runs (emu time / cpu time) for
 * the ops of one class, in a step of `rows` rows: the fastest run is the
 * one a busy host disturbed least. */
static double stretch(const char *profile, uint32_t rows, bool compute_class)
{
    px_err err;
    px_status st;
    px_rt_session *cpu = open_session("cpu", NULL, &err, &st);
    px_assert_ok(st, &err);
    px_rt_session *emu = open_session("emu", profile, &err, &st);
    px_assert_ok(st, &err);
    px_rt_session *ss[2] = {cpu, emu};
    tally t[2];
    int32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = (int32_t)(i * 7 % 500 + 1);
    int32_t seq[2];
    for (int k = 0; k < 2; k++) {
        px_assert_ok(px_rt_seq_add(ss[k], &seq[k], &err), &err);
        px_rt_stream_set_telemetry(px_rt_session_stream(ss[k]), on_op, &t[k]);
    }
    enum { RUNS = 15 };
    double best[2] = {INFINITY, INFINITY};
    for (int r = 0; r < RUNS; r++) {
        for (int k = 0; k < 2; k++) {
            memset(&t[k], 0, sizeof t[k]);
            /* The same step every time: position 0 rewinds the sequence. */
            px_rt_seq_step step = {.seq = seq[k], .pos = 0, .n_tokens = rows, .tokens = toks};
            px_rt_batch b = {.n_seqs = 1, .seqs = &step};
            px_rt_output out;
            px_assert_ok(px_rt_forward(ss[k], &b, NULL, &out, &err), &err);
        }
        double c = (double)(compute_class ? t[0].ns_compute : t[0].ns_memory);
        double e = (double)(compute_class ? t[1].ns_compute : t[1].ns_memory);
        best[0] = fmin(best[0], c);
        best[1] = fmin(best[1], e);
    }
    close_session(cpu);
    close_session(emu);
    return best[0] > 0 ? best[1] / best[0] : 0;
}

static void test_op_times_are_stretched_by_their_class_slowdown(void **state)
{
    (void)state;
    /* One row: every op is memory-bound. */
    double r = stretch("{\"compute_slowdown\": 1, \"memory_slowdown\": 4}", 1, false);
    print_message("memory-bound ops, memory_slowdown 4: x%.2f\n", r);
    assert_true(r > 3.0 && r < 5.2);
    r = stretch("{\"compute_slowdown\": 4, \"memory_slowdown\": 1}", 1, false);
    print_message("memory-bound ops, compute_slowdown 4: x%.2f\n", r);
    assert_true(r > 0.75 && r < 1.35);
    /* 64 rows: the matrix products are compute-bound. */
    r = stretch("{\"compute_slowdown\": 3, \"memory_slowdown\": 1}", 64, true);
    print_message("compute-bound ops, compute_slowdown 3: x%.2f\n", r);
    assert_true(r > 2.3 && r < 3.9);
}

static void test_memory_capacity_is_enforced(void **state)
{
    (void)state;
    px_err err;
    px_status st;
    /* Far below the model's weights. */
    px_rt_session *s =
        open_session("emu", "{\"memory_bytes\": 65536, \"name\": \"n1.tiny\"}", &err, &st);
    assert_null(s);
    assert_int_equal(st, PX_ENOMEM);
    px_assert_contains(err.msg, "emu device n1.tiny (emulated)");
    px_assert_contains(err.msg, "65536");

    /* Enough: the device reports what is in use. */
    s = open_session("emu", "{\"memory_bytes\": 1000000000}", &err, &st);
    px_assert_ok(st, &err);
    px_rt_session_info info;
    px_rt_session_info_get(s, &info);
    assert_int_equal(info.device.memory_total, 1000000000);
    assert_true(info.device.memory_free < 1000000000 - info.weight_bytes);
    close_session(s);

    /* Direct allocations past the cap fail; freed memory comes back. */
    px_rt_device *dev;
    px_rt_device_opts o = {.n_threads = 1, .profile = "{\"memory_bytes\": 1000}"};
    px_assert_ok(px_rt_device_open("emu", &o, &dev, &err), &err);
    px_rt_buffer *a, *b;
    px_assert_ok(px_rt_buffer_alloc(dev, 600, &a, &err), &err);
    assert_int_equal(px_rt_buffer_alloc(dev, 600, &b, &err), PX_ENOMEM);
    px_rt_buffer_free(a);
    px_assert_ok(px_rt_buffer_alloc(dev, 600, &b, &err), &err);
    px_rt_buffer_free(b);
    px_rt_device_free(dev);
}

static void test_inventory_emu_member_is_read_and_checked(void **state)
{
    (void)state;
    char *path = px_test_source_path("data/scenarios/emu-small.json");
    px_hw_graph *g;
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, NULL, &err), &err);
    free(path);
    uint32_t a, b, c;
    assert_true(px_hw_graph_find_device(g, "local.emu-a", &a));
    assert_true(px_hw_graph_find_device(g, "local.emu-b", &b));
    assert_true(px_hw_graph_find_device(g, "local.cpu0", &c));
    const px_hw_view *v = px_hw_graph_view(g);
    assert_true(v->devices[a].emu.present);
    assert_true(v->devices[a].emu.compute_slowdown == 3 && v->devices[a].emu.memory_slowdown == 2);
    assert_true(v->devices[b].emu.compute_slowdown == 5 && v->devices[b].emu.memory_slowdown == 4);
    assert_false(v->devices[c].emu.present);
    /* The sourced figures agree with the slowdowns (they are independent
     * inputs: the planner reads the figures, the emu backend the
     * slowdowns). */
    double cpu_f = px_hw_device_peak(&v->devices[c], PX_HW_DTYPE_F32);
    double a_f = px_hw_device_peak(&v->devices[a], PX_HW_DTYPE_F32);
    assert_true(fabs(cpu_f / a_f - 3) < 0.2);
    px_hw_graph_free(g);

    const char *bad[] = {"{\"compute_slowdown\": 0.5}", "{\"jitter\": 1.5}",
                         "{\"memory_slowdown\": \"2\"}", "{\"speed\": 2}"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        char *doc = px_asprintf(
            "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\", \"devices\": "
            "[{\"id\": \"e\", \"class\": \"gpu\", \"backend\": \"emu\", \"emulated\": true, "
            "\"emu\": %s, \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\", \"capacity\": "
            "\"1 GiB\"}]}]}]}",
            bad[i]);
        px_diags d;
        px_diags_init(&d);
        px_hw_graph *h = NULL;
        px_hw_read_options ro = {.strict = true};
        assert_int_not_equal(px_hw_graph_from_json(doc, strlen(doc), "inv.json", &ro, &h, &d, &err),
                             PX_OK);
        char *report = px_diags_format(&d, "inv.json");
        px_assert_contains(report, "/nodes/0/devices/0/emu");
        free(report);
        px_diags_release(&d);
        free(doc);
    }
}

int main(void)
{
#ifdef PX_EMU_TIMING
    /* tests/slow/test_rt_emu_timing.c: wall-clock ratios, which a loaded
     * machine blurs. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_times_are_stretched_by_their_class_slowdown),
    };
    (void)test_profile_refuses_speedups_and_bad_jitter;
    (void)test_ops_are_classified_by_flops_per_byte;
    (void)test_small_row_products_are_memory_bound_in_every_format;
    (void)test_results_match_the_cpu_bit_for_bit;
    (void)test_memory_capacity_is_enforced;
    (void)test_inventory_emu_member_is_read_and_checked;
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_refuses_speedups_and_bad_jitter),
        cmocka_unit_test(test_ops_are_classified_by_flops_per_byte),
        cmocka_unit_test(test_small_row_products_are_memory_bound_in_every_format),
        cmocka_unit_test(test_results_match_the_cpu_bit_for_bit),
        cmocka_unit_test(test_memory_capacity_is_enforced),
        cmocka_unit_test(test_inventory_emu_member_is_read_and_checked),
    };
    (void)test_op_times_are_stretched_by_their_class_slowdown;
#endif
    return cmocka_run_group_tests(tests, setup, teardown);
}
