/* Contracts: the command-line forms of transformations and devices, and the
 * names of the module's enums. */
#include "px_test.h"

#include <string.h>

#include "plexus/contract.h"

static void test_transform_and_device_specs_parse(void **state)
{
    (void)state;
    px_transform t;
    px_err err;
    char s1[] = "precision:fp8,targets=weights+activations,from=f32";
    px_assert_ok(px_transform_parse(s1, &t, &err), &err);
    assert_int_equal(t.kind, PX_TRANSFORM_PRECISION);
    assert_int_equal(t.tensors, PX_TENSORS_WEIGHTS | PX_TENSORS_ACTIVATIONS);
    assert_string_equal(t.to_dtype, "fp8");
    assert_string_equal(t.from_dtype, "f32");
    char s2[] = "quantize:q4_k";
    px_assert_ok(px_transform_parse(s2, &t, &err), &err);
    assert_int_equal(t.tensors, PX_TENSORS_WEIGHTS);
    char s3[] = "tensor_split:output";
    px_assert_ok(px_transform_parse(s3, &t, &err), &err);
    assert_int_equal(t.kind, PX_TRANSFORM_TENSOR_SPLIT);
    assert_int_equal(t.split, PX_SPLIT_OUTPUT);
    char s4[] = "reorder,order=dynamic";
    px_assert_ok(px_transform_parse(s4, &t, &err), &err);
    assert_true(t.dynamic_order);
    char s5[] = "alt-kernel:openblas";
    px_assert_ok(px_transform_parse(s5, &t, &err), &err);
    assert_string_equal(t.kernel, "openblas");
    char s6[] = "pipeline-cut:f16";
    px_assert_ok(px_transform_parse(s6, &t, &err), &err);
    assert_string_equal(t.to_dtype, "f16");

    static const struct {
        const char *spec;
        const char *needle;
    } bad[] = {
        {"", "empty transformation"},
        {"shrink", "unknown transformation \"shrink\""},
        {"precision", "needs the new dtype"},
        {"quantize:q3_x", "unknown dtype \"q3_x\""},
        {"tensor-split:rows", "not a dimension"},
        {"recompute:now", "takes no argument"},
        {"precision:f16,targets=bias", "unknown tensors \"bias\""},
        {"precision:f16,when=now", "unknown key \"when\""},
        {"reorder,order=random", "order: use static or dynamic"},
        {"reorder,dynamic", "write key=value"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        char buf[64];
        px_strlcpy(buf, bad[i].spec, sizeof buf);
        assert_int_equal(px_transform_parse(buf, &t, &err), PX_EINVAL);
        px_assert_contains(err.msg, bad[i].needle);
    }

    px_contract_device d;
    char d1[] = "gpu0,backend=cuda,vendor=nvidia,arch=sm_90,deterministic,emulated=no";
    px_assert_ok(px_contract_device_parse(d1, &d, &err), &err);
    assert_string_equal(d.id, "gpu0");
    assert_string_equal(d.backend, "cuda");
    assert_string_equal(d.arch, "sm_90");
    assert_true(d.deterministic);
    assert_false(d.emulated);
    char d2[] = "backend=cuda";
    assert_int_equal(px_contract_device_parse(d2, &d, &err), PX_EINVAL);
    char d3[] = "gpu0,color=red";
    assert_int_equal(px_contract_device_parse(d3, &d, &err), PX_EINVAL);
    px_assert_contains(err.msg, "\"color\" is not a device property");
    char d4[] = "gpu0,deterministic=maybe";
    assert_int_equal(px_contract_device_parse(d4, &d, &err), PX_EINVAL);

    /* Names round-trip. */
    for (int k = 0; k < PX_TRANSFORM_COUNT_; k++) {
        px_transform_kind back;
        px_assert_ok(px_transform_kind_parse(px_transform_kind_name((px_transform_kind)k), &back),
                     (px_err *)NULL);
        assert_int_equal(back, k);
    }
    assert_string_equal(px_transform_kind_name(PX_TRANSFORM_COUNT_), "unknown");
    assert_string_equal(px_contract_reason_name(PX_REASON_COUNT_), "unknown");
    assert_string_equal(px_contract_proof_name(PX_PROOF_COUNT_), "unknown");
    assert_string_equal(px_contract_req_name((px_contract_req)3), "unknown");
    assert_true(px_contract_dtype_known("BF16"));
    assert_false(px_contract_dtype_known("f128"));
    assert_false(px_contract_dtype_known(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transform_and_device_specs_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
