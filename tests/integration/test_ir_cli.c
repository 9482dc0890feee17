/* plexus model: inspect, synth and presets through the command. */
#include "px_test.h"

#include <string.h>
#include <unistd.h>

static int run(char *const argv[], char **out, char **err)
{
    return px_test_run(argv, 60, out, err);
}

static json_t *parse(const char *text)
{
    json_t *j;
    px_err err;
    px_assert_ok(px_json_parse(text, strlen(text), "stdout", NULL, &j, &err), &err);
    return j;
}

static void test_model_help_and_usage_errors(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char *out, *err;
    char *help[] = {(char *)px, "model", "--help", NULL};
    assert_int_equal(run(help, &out, &err), 0);
    px_assert_contains(out, "plexus model inspect FILE|PRESET");
    px_assert_contains(out, "plexus model synth");
    free(out);
    free(err);
    char *sub_help[] = {(char *)px, "model", "synth", "-h", NULL};
    assert_int_equal(run(sub_help, &out, &err), 0);
    px_assert_contains(out, "--kv-heads");
    free(out);
    free(err);
    char *none[] = {(char *)px, "model", "inspect", NULL};
    assert_int_equal(run(none, &out, &err), 2);
    px_assert_contains(err, "FILE|PRESET is required");
    free(out);
    free(err);
    char *bad[] = {(char *)px, "model", "frob", NULL};
    assert_int_equal(run(bad, &out, &err), 2);
    px_assert_contains(err, "unknown action \"frob\"");
    free(out);
    free(err);
    char *bad_num[] = {(char *)px, "model", "synth", "--dim", "x", "--out", "f.gguf", NULL};
    assert_int_equal(run(bad_num, &out, &err), 2);
    px_assert_contains(err, "--dim takes a whole number");
    free(out);
    free(err);
    char *missing[] = {(char *)px, "model", "inspect", "/nonexistent/m.gguf", NULL};
    assert_int_equal(run(missing, &out, &err), 1);
    px_assert_contains(err, "/nonexistent/m.gguf: cannot open");
    free(out);
    free(err);
}

static void test_model_synth_then_inspect_json(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char *path = px_asprintf("%s/s.gguf", px_test_tmpdir());
    char *out, *err;
    char *synth[] = {(char *)px, "model",      "synth", "--out",    path,  "--dim",
                     "32",       "--hidden",   "64",    "--layers", "3",   "--heads",
                     "4",        "--kv-heads", "2",     "--vocab",  "300", "--context",
                     "64",       "--dtype",    "q8_0",  "--seed",   "5",   NULL};
    int rc = run(synth, &out, &err);
    if (rc != 0)
        fail_msg("synth failed (%d): %s", rc, err);
    free(out);
    free(err);
    char *inspect[] = {(char *)px,  "model", "inspect", path, "-o", "json",
                       "--context", "32",    "--batch", "2",  NULL};
    assert_int_equal(run(inspect, &out, &err), 0);
    json_t *j = parse(out);
    json_t *hp = json_object_get(j, "hparams");
    assert_int_equal(json_integer_value(json_object_get(hp, "dim")), 32);
    assert_int_equal(json_integer_value(json_object_get(hp, "n_layers")), 3);
    assert_int_equal(json_integer_value(json_object_get(hp, "vocab_size")), 300);
    assert_int_equal(json_integer_value(json_object_get(j, "context")), 32);
    /* 2 (K, V) * 3 layers * 2 kv heads * 8 * 4 bytes. */
    json_t *kv = json_object_get(j, "kv_cache");
    assert_int_equal(json_integer_value(json_object_get(kv, "bytes_per_token")), 2 * 3 * 2 * 8 * 4);
    assert_int_equal(json_integer_value(json_object_get(kv, "bytes_at_context")),
                     2 * 3 * 2 * 8 * 4 * 32 * 2);
    assert_non_null(json_object_get(json_object_get(j, "by_dtype"), "q8_0"));
    assert_int_equal(json_array_size(json_object_get(j, "rows")), 5);
    json_decref(j);
    free(out);
    free(err);
    char *text[] = {(char *)px, "model", "inspect", path, NULL};
    assert_int_equal(run(text, &out, &err), 0);
    px_assert_contains(out, "dim 32, hidden 64, 3 layers, 4 heads (2 kv, head 8), vocab 300");
    px_assert_contains(out, "layer.0..2 (each)");
    free(out);
    free(err);
    free(path);
}

static void test_model_inspect_presets_and_real_file(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char *out, *err;
    char *list[] = {(char *)px, "model", "presets", NULL};
    assert_int_equal(run(list, &out, &err), 0);
    px_assert_contains(out, "llama-3-70b");
    px_assert_contains(out, "dit-xl-2");
    free(out);
    free(err);
    char *pj[] = {(char *)px, "model", "inspect", "mixtral-8x7b", "-o", "json", NULL};
    assert_int_equal(run(pj, &out, &err), 0);
    json_t *j = parse(out);
    assert_int_equal(json_integer_value(json_object_get(j, "params")), 46702792704ll);
    assert_false(json_boolean_value(json_object_get(j, "has_weights")));
    json_decref(j);
    free(out);
    free(err);
    char *dit[] = {(char *)px, "model", "inspect", "dit-xl-2", NULL};
    assert_int_equal(run(dit, &out, &err), 0);
    px_assert_contains(out, "per denoising step over 256 latent tokens");
    free(out);
    free(err);

    char *path = px_test_require_shared_model("stories260K.gguf");
    char *real[] = {(char *)px, "model", "inspect", path, NULL};
    assert_int_equal(run(real, &out, &err), 0);
    px_assert_contains(out, "dim 64, hidden 172, 5 layers, 8 heads (4 kv, head 8), vocab 512");
    px_assert_contains(out, "(292800)");
    free(out);
    free(err);
    free(path);
}

/* A preset keeps its cache in bf16 unless --kv-dtype says otherwise, f32
 * included (f32 is also what an unset option holds). */
static void test_model_inspect_kv_dtype_default_and_f32_override(void **state)
{
    (void)state;
    const char *px = px_test_plexus_bin();
    char *out, *err;
    char *plain[] = {(char *)px, "model", "inspect", "llama-3-8b", NULL};
    assert_int_equal(run(plain, &out, &err), 0);
    px_assert_contains(out, "kv cache  131 kB per token in bf16 (32 layers)");
    free(out);
    free(err);
    char *f32[] = {(char *)px, "model", "inspect", "llama-3-8b", "--kv-dtype", "f32", NULL};
    assert_int_equal(run(f32, &out, &err), 0);
    px_assert_contains(out, "kv cache  262 kB per token in f32 (32 layers)");
    free(out);
    free(err);
    char *js[] = {(char *)px, "model", "inspect", "llama-3-8b", "--kv-dtype",
                  "f32",      "-o",    "json",    NULL};
    assert_int_equal(run(js, &out, &err), 0);
    json_t *j = parse(out);
    json_t *kv = json_object_get(j, "kv_cache");
    assert_string_equal(json_string_value(json_object_get(kv, "dtype")), "f32");
    assert_int_equal(json_integer_value(json_object_get(kv, "bytes_per_token")), 262144);
    json_decref(j);
    free(out);
    free(err);
    char *bad[] = {(char *)px, "model", "inspect", "llama-3-8b", "--kv-dtype", "f33", NULL};
    assert_int_equal(run(bad, &out, &err), 2);
    px_assert_contains(err, "--kv-dtype");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_help_and_usage_errors),
        cmocka_unit_test(test_model_synth_then_inspect_json),
        cmocka_unit_test(test_model_inspect_presets_and_real_file),
        cmocka_unit_test(test_model_inspect_kv_dtype_default_and_f32_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
