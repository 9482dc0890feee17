/* `plexus contract`: validate, show, check and list, run as a user would. */
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static int run(char *const argv[], char **out, char **err)
{
    return px_test_run(argv, 30, out, err);
}

static char *write_tmp(const char *name, const char *text)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_err e;
    px_assert_ok(px_write_file(path, text, strlen(text), &e), &e);
    return path;
}

static void test_validate_reports_every_problem_with_pointers(void **state)
{
    (void)state;
    char *good = write_tmp(
        "good.json", "{\"schema\": \"plexus.contract/1\", \"name\": \"g\","
                     " \"default\": {\"deterministic\": true},"
                     " \"regions\": {\"layer.*.ffn\": {\"divergence\": {\"kl_max\": 0.01}}}}");
    char *bad =
        write_tmp("bad.json", "{\"schema\": \"plexus.contract/1\","
                              " \"default\": {\"tolerance\": {\"atol\": -1}},"
                              " \"regions\": {\"head\": {\"agreement\": {\"top1_min\": 3}}}}");
    char *out, *err;
    char *const ok_argv[] = {(char *)px_test_plexus_bin(), "contract", "validate", good, NULL};
    assert_int_equal(run(ok_argv, &out, &err), 0);
    px_assert_contains(out, "good.json: ok (g, 1 region entry)");
    free(out);
    free(err);

    char *const bad_argv[] = {
        (char *)px_test_plexus_bin(), "contract", "validate", good, bad, NULL};
    assert_int_equal(run(bad_argv, &out, &err), 3);
    px_assert_contains(out, "good.json: ok");
    px_assert_contains(err, "bad.json: error: /default/tolerance/atol:");
    px_assert_contains(err, "bad.json: error: /default/tolerance: \"rtol\" is missing");
    px_assert_contains(err, "bad.json: error: /regions/head/agreement/top1_min:");
    px_assert_contains(err, "fix: ");
    free(out);
    free(err);

    char *const json_argv[] = {
        (char *)px_test_plexus_bin(), "contract", "validate", "-o", "json", bad, NULL};
    assert_int_equal(run(json_argv, &out, &err), 3);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_t *first = json_array_get(doc, 0);
    assert_false(json_is_true(json_object_get(first, "valid")));
    assert_int_equal(json_array_size(json_object_get(first, "diagnostics")), 3);
    json_decref(doc);
    free(out);
    free(err);
    free(good);
    free(bad);
}

static void test_show_prints_builtins_and_canonical_json(void **state)
{
    (void)state;
    char *out, *err;
    char *const text_argv[] = {(char *)px_test_plexus_bin(), "contract", "show", "relaxed", NULL};
    assert_int_equal(run(text_argv, &out, &err), 0);
    px_assert_contains(out, "contract    relaxed");
    px_assert_contains(out, "default                  divergence kl_max 0.02 nats");
    px_assert_contains(out, "id          sha256:");
    free(out);
    free(err);
    char *const json_argv[] = {
        (char *)px_test_plexus_bin(), "contract", "show", "strict", "-o", "json", NULL};
    assert_int_equal(run(json_argv, &out, &err), 0);
    px_assert_contains(out, "\"schema\": \"plexus.contract/1\"");
    px_assert_contains(out, "\"bitwise\": true");
    free(out);
    free(err);
    char *const missing[] = {(char *)px_test_plexus_bin(), "contract", "show", "loose", NULL};
    assert_int_equal(run(missing, &out, &err), 1);
    px_assert_contains(err, "not a built-in contract (strict, deterministic, relaxed)");
    free(out);
    free(err);
    char *const list[] = {(char *)px_test_plexus_bin(), "contract", "list", NULL};
    assert_int_equal(run(list, &out, &err), 0);
    px_assert_contains(out, "strict");
    px_assert_contains(out, "deterministic");
    px_assert_contains(out, "relaxed");
    free(out);
    free(err);
}

static void test_check_prints_verdict_proof_and_obligations(void **state)
{
    (void)state;
    char *out, *err;
    char *const forbidden[] = {(char *)px_test_plexus_bin(),
                               "contract",
                               "check",
                               "--contract",
                               "strict",
                               "--region",
                               "layer.3.attention",
                               "--transform",
                               "precision:fp8,from=f32",
                               "--device",
                               "gpu0,backend=cuda,arch=sm_90,deterministic",
                               NULL};
    assert_int_equal(run(forbidden, &out, &err), 3);
    px_assert_contains(out, "verdict: forbidden (bitwise-precision)");
    px_assert_contains(out, "layer.3.attention: precision change of weights from f32 to fp8 "
                            "changes bits; the contract requires bitwise");
    free(out);
    free(err);

    char *const proven[] = {(char *)px_test_plexus_bin(),
                            "contract",
                            "check",
                            "--contract",
                            "strict",
                            "--region",
                            "layer.2.ffn",
                            "--transform",
                            "pipeline-cut",
                            "--device",
                            "cpu0,backend=cpu,arch=x86_64-avx2,deterministic",
                            "--device",
                            "emu1,backend=emu,arch=x86_64-avx2,deterministic,emulated",
                            NULL};
    assert_int_equal(run(proven, &out, &err), 0);
    px_assert_contains(out, "verdict: allowed (proof: exact-transfer)");
    free(out);
    free(err);

    char *const validated[] = {(char *)px_test_plexus_bin(),
                               "contract",
                               "check",
                               "--contract",
                               "relaxed",
                               "--region",
                               "layer.1.ffn",
                               "--transform",
                               "quantize:int8",
                               "--device",
                               "gpu0,backend=cuda,arch=sm_90",
                               NULL};
    assert_int_equal(run(validated, &out, &err), 0);
    px_assert_contains(out, "verdict: allowed-after-validation");
    px_assert_contains(out, "obligations:\n  1. layer.1.ffn: run the reference");
    px_assert_contains(out, "at most 0.02 nats");
    free(out);
    free(err);

    char *const recorded[] = {(char *)px_test_plexus_bin(),
                              "contract",
                              "check",
                              "--contract",
                              "strict",
                              "--region",
                              "layer.1.ffn",
                              "--transform",
                              "alt-kernel:openblas",
                              "--device",
                              "cpu0,backend=cpu,arch=x86_64-avx2,deterministic",
                              "--equivalence",
                              "trace:abc123",
                              "-o",
                              "json",
                              NULL};
    assert_int_equal(run(recorded, &out, &err), 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "verdict")), "allowed");
    assert_string_equal(json_string_value(json_object_get(doc, "proof")), "recorded-equivalence");
    json_decref(doc);
    free(out);
    free(err);

    char *const combined[] = {(char *)px_test_plexus_bin(),
                              "contract",
                              "check",
                              "--contract",
                              "relaxed",
                              "--region",
                              "layer.0.ffn",
                              "--region",
                              "head",
                              "--transform",
                              "quantize:q8_0",
                              "--transform",
                              "kv-offload",
                              "--device",
                              "gpu0,backend=cuda,arch=sm_90",
                              NULL};
    assert_int_equal(run(combined, &out, &err), 0);
    px_assert_contains(out, "2 of 4 transformation-region pairs proven, 4 obligations");
    free(out);
    free(err);
}

static void test_contract_usage_errors_exit_2(void **state)
{
    (void)state;
    char *out, *err;
    char *const cases[][12] = {
        {(char *)px_test_plexus_bin(), "contract", NULL},
        {(char *)px_test_plexus_bin(), "contract", "frobnicate", NULL},
        {(char *)px_test_plexus_bin(), "contract", "check", "--contract", "strict", NULL},
        {(char *)px_test_plexus_bin(), "contract", "check", "--contract", "strict", "--region",
         "head", "--transform", "shrink", NULL},
        {(char *)px_test_plexus_bin(), "contract", "show", "-o", "xml", "strict", NULL},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        assert_int_equal(run(cases[i], &out, &err), 2);
        px_assert_contains(err, "plexus contract");
        px_assert_contains(err, "run 'plexus contract");
        free(out);
        free(err);
    }
    char *const help[] = {(char *)px_test_plexus_bin(), "contract", "--help", NULL};
    assert_int_equal(run(help, &out, &err), 0);
    px_assert_contains(out, "plexus contract validate FILE...");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_reports_every_problem_with_pointers),
        cmocka_unit_test(test_show_prints_builtins_and_canonical_json),
        cmocka_unit_test(test_check_prints_verdict_proof_and_obligations),
        cmocka_unit_test(test_contract_usage_errors_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
