/* plexus model quantize through the command: a synthetic f32 model
 * quantized by each recipe, then run by plexus generate; usage errors and
 * refusals. */
#include "px_test.h"

#include <string.h>
#include <unistd.h>

static int run(char *const argv[], char **out, char **err)
{
    return px_test_run(argv, 120, out, err);
}

static void test_quantize_each_recipe_then_generate(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/f32.gguf", px_test_tmpdir());
    char *out, *err;
    char *synth[] = {(char *)px, "model", "synth",    "--out", src,      "--dim", "256",
                     "--hidden", "512",   "--layers", "2",     "--seed", "3",     NULL};
    assert_int_equal(run(synth, &out, &err), 0);
    free(out);
    free(err);
    static const char *recipes[] = {"q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"};
    static const char *dtype[] = {"\"q8_0\"", "\"q4_0\"", "\"q4_k\"", "\"q5_k\"", "\"q6_k\""};
    for (size_t i = 0; i < PX_ARRAY_LEN(recipes); i++) {
        snprintf(dst, sizeof dst, "%s/%s.gguf", px_test_tmpdir(), recipes[i]);
        char *q[] = {(char *)px,         "model", "quantize", src, dst, "--type",
                     (char *)recipes[i], "-o",    "json",     NULL};
        int rc = run(q, &out, &err);
        if (rc != 0)
            fail_msg("quantize %s: exit %d: %s", recipes[i], rc, err);
        px_assert_contains(out, "\"tensors_by_dtype\"");
        px_assert_contains(out, dtype[i]);
        px_assert_contains(out, "\"rmse\"");
        free(out);
        free(err);
        char *gen[] = {(char *)px, "generate", "--model", dst,         "--prompt", "Hi", "-n",
                       "6",        "--temp",   "0",       "--threads", "2",        NULL};
        rc = run(gen, &out, &err);
        if (rc != 0)
            fail_msg("generate %s: exit %d: %s", recipes[i], rc, err);
        px_assert_contains(out, "Hi");
        px_assert_contains(err, "decode: ");
        free(out);
        free(err);
    }
}

static void test_quantize_usage_errors_and_refusals(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char *out, *err;
    char *help[] = {(char *)px, "model", "--help", NULL};
    assert_int_equal(run(help, &out, &err), 0);
    px_assert_contains(out, "plexus model quantize IN OUT --type");
    free(out);
    free(err);
    char *no_type[] = {(char *)px, "model", "quantize", "a.gguf", "b.gguf", NULL};
    assert_int_equal(run(no_type, &out, &err), 2);
    px_assert_contains(err, "--type");
    free(out);
    free(err);
    char *no_out[] = {(char *)px, "model", "quantize", "a.gguf", "--type", "q4_0", NULL};
    assert_int_equal(run(no_out, &out, &err), 2);
    px_assert_contains(err, "IN OUT");
    free(out);
    free(err);
    char *bad_type[] = {(char *)px, "model",  "quantize", "a.gguf",
                        "b.gguf",   "--type", "q9_9",     NULL};
    assert_int_equal(run(bad_type, &out, &err), 1);
    px_assert_contains(err, "unknown quantization type \"q9_9\"; known: q8_0, q4_0");
    free(out);
    free(err);
    char *missing[] = {(char *)px, "model",  "quantize", "/nonexistent/m.gguf",
                       "b.gguf",   "--type", "q4_0",     NULL};
    assert_int_equal(run(missing, &out, &err), 1);
    px_assert_contains(err, "/nonexistent/m.gguf");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_each_recipe_then_generate),
        cmocka_unit_test(test_quantize_usage_errors_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
