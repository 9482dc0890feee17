/* The profiling harness: timed steps on the cpu and emu backends, split
 * by op class; an emulated device is slower than the cpu it runs on;
 * copies through a Unix socket; bad options are refused. */
#include "px_test.h"

#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

static char *path;
static px_rt_model *model;

static int setup(void **state)
{
    (void)state;
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 64;
    o.hidden_dim = 128;
    o.n_layers = 3;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.vocab_size = 300;
    o.context_length = 64;
    path = px_asprintf("%s/profile.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    px_assert_ok(px_rt_model_open(path, &model, &err), &err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    px_rt_model_free(model);
    free(path);
    return 0;
}

static uint64_t median_step(const px_rt_profile_result *r)
{
    uint64_t v[64];
    size_t n = r->n_decode < 64 ? r->n_decode : 64;
    for (size_t i = 0; i < n; i++)
        v[i] = r->decode[i].ns;
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

static void test_profile_times_steps_split_by_op_class(void **state)
{
    (void)state;
    px_err err;
    px_rt_profile_opts o = {.prompt_tokens = 8, .decode_steps = 12};
    px_rt_profile_result r;
    px_assert_ok(px_rt_profile_run(model, &o, &r, &err), &err);
    assert_int_equal(r.n_decode, 12);
    assert_true(r.embedding && r.head);
    assert_int_equal(r.prefill.rows, 8);
    assert_int_equal(r.prefill.context, 8);
    for (size_t i = 0; i < r.n_decode; i++) {
        const px_rt_profile_step *s = &r.decode[i];
        assert_int_equal(s->rows, 1);
        assert_int_equal(s->context, 9 + i);
        assert_true(s->attention_ns > 0 && s->matmul_ns > 0 && s->other_ns > 0);
        assert_true(s->attention_ns + s->matmul_ns + s->other_ns <= s->ns);
    }
    uint64_t cpu = median_step(&r);
    px_rt_profile_result_release(&r);
    /* A middle range is fed hidden states and has neither end. */
    o.layer_begin = 1;
    o.layer_end = 2;
    px_assert_ok(px_rt_profile_run(model, &o, &r, &err), &err);
    assert_false(r.embedding || r.head);
    px_rt_profile_result_release(&r);
    /* Emulated at 4x memory and compute: clearly slower. */
    px_rt_emu_profile emu = {.compute_slowdown = 4, .memory_slowdown = 4};
    px_rt_profile_opts e = {.backend = "emu", .emu = &emu, .prompt_tokens = 8, .decode_steps = 12};
    px_assert_ok(px_rt_profile_run(model, &e, &r, &err), &err);
    assert_true(r.device.emulated);
    assert_true(median_step(&r) > 2 * cpu);
    px_rt_profile_result_release(&r);
}

static void test_profile_refuses_bad_options(void **state)
{
    (void)state;
    px_err err;
    px_rt_profile_result r;
    px_rt_profile_opts o = {.layer_begin = 2, .layer_end = 9};
    assert_int_equal(px_rt_profile_run(model, &o, &r, &err), PX_EINVAL);
    px_assert_contains(err.msg, "layers");
    px_rt_profile_opts big = {.prompt_tokens = 60, .decode_steps = 30};
    assert_int_equal(px_rt_profile_run(model, &big, &r, &err), PX_EINVAL);
    px_assert_contains(err.msg, "context");
    px_rt_profile_opts gpu = {.backend = "rocm"};
    assert_int_equal(px_rt_profile_run(model, &gpu, &r, &err), PX_EINVAL);
    assert_null(r.decode);
    px_rt_profile_result_release(NULL);
}

static void test_profile_copies_through_a_socket(void **state)
{
    (void)state;
    px_err err;
    uint64_t ns[16];
    px_assert_ok(px_rt_profile_copy(4096, 16, ns, &err), &err);
    for (int i = 0; i < 16; i++)
        assert_true(ns[i] > 0);
    assert_int_equal(px_rt_profile_copy(0, 16, ns, &err), PX_EINVAL);
    assert_int_equal(px_rt_profile_copy(128, 0, ns, &err), PX_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_times_steps_split_by_op_class),
        cmocka_unit_test(test_profile_refuses_bad_options),
        cmocka_unit_test(test_profile_copies_through_a_socket),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
