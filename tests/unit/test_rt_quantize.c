/* px_rt_quantize_file against the reference quantizer's files in
 * ../shared/models (skipped with a message when absent): the same dtype
 * for every tensor, Q8_0 and Q4_0 blocks identical byte for byte, k-quant
 * RMS errors within 1% of the reference's; and its refusals. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/rt.h"
#include "rt/rt_impl.h"

static px_ir_model *open_path(const char *path)
{
    px_err err;
    px_ir_model *m;
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    return m;
}

/* Sum of squared differences between the dequantised tensor q and the
 * f32 source tensor, over values; *n gets the count. */
static double sq_error(const px_ir_tensor *q, const px_ir_tensor *src, uint64_t *n)
{
    uint32_t k = (uint32_t)q->ne[0];
    float *row = malloc(k * sizeof(float));
    assert_non_null(row);
    double sq = 0;
    for (uint64_t r = 0; r < q->n_elems / k; r++) {
        px__rt_dequant_row(q->dtype, (const uint8_t *)q->data + r * q->nb[1], row, k);
        const float *s = (const float *)src->data + r * k;
        for (uint32_t j = 0; j < k; j++)
            sq += ((double)row[j] - s[j]) * ((double)row[j] - s[j]);
    }
    free(row);
    *n += q->n_elems;
    return sq;
}

typedef struct compared {
    size_t n_tensors, n_identical;
    double rmse_ours, rmse_ref;
} compared;

/* Quantizes `source` by `recipe` and compares it with `reference`. */
static compared quantize_and_compare(const char *source, const char *reference, const char *recipe)
{
    char *src_path = px_test_require_shared_model(source);
    char *ref_path = px_test_require_shared_model(reference);
    char out[512];
    snprintf(out, sizeof out, "%s/%s.gguf", px_test_tmpdir(), recipe);
    px_err err;
    px_rt_quantize_stats st;
    px_assert_ok(px_rt_quantize_file(src_path, out, recipe, &st, &err), &err);
    px_ir_model *src = open_path(src_path), *ref = open_path(ref_path), *ours = open_path(out);
    assert_int_equal(px_ir_model_n_tensors(ours), px_ir_model_n_tensors(ref));
    /* Every metadata pair is copied; the file type is the recipe's. */
    for (size_t i = 0; i < px_ir_model_n_meta(src); i++) {
        const char *key, *text, *key2, *text2;
        px_ir_model_meta_at(src, i, &key, &text);
        bool found = false;
        for (size_t j = 0; j < px_ir_model_n_meta(ours) && !found; j++) {
            px_ir_model_meta_at(ours, j, &key2, &text2);
            found =
                !strcmp(key, key2) && (!strcmp(text, text2) || !strcmp(key, "general.file_type"));
        }
        if (!found)
            fail_msg("%s: metadata %s (%s) was not copied", recipe, key, text);
    }
    uint64_t ftype = 0;
    assert_true(px_ir_model_meta_u64(ours, "general.file_type", &ftype));
    uint64_t ref_ftype = 0;
    if (px_ir_model_meta_u64(ref, "general.file_type", &ref_ftype))
        assert_int_equal(ftype, ref_ftype);
    compared c = {0};
    double sq_ours = 0, sq_ref = 0;
    uint64_t n_ours = 0, n_ref = 0;
    for (size_t i = 0; i < px_ir_model_n_tensors(ref); i++) {
        const px_ir_tensor *r = px_ir_model_tensor(ref, i);
        const px_ir_tensor *o = px_ir_model_find_tensor(ours, r->name);
        const px_ir_tensor *s = px_ir_model_find_tensor(src, r->name);
        assert_non_null(o);
        assert_non_null(s);
        if (o->dtype != r->dtype)
            fail_msg("%s: %s is %s here, %s in %s", recipe, r->name, px_dtype_name(o->dtype),
                     px_dtype_name(r->dtype), reference);
        if (!px_dtype_is_quantized(r->dtype)) {
            /* Kept or converted to f16 (rows that fill no block): the
             * same bytes too. */
            if (o->n_bytes != r->n_bytes || memcmp(o->data, r->data, r->n_bytes) != 0)
                fail_msg("%s: %s (%s) differs from %s", recipe, r->name, px_dtype_name(r->dtype),
                         reference);
            continue;
        }
        c.n_tensors++;
        c.n_identical += o->n_bytes == r->n_bytes && !memcmp(o->data, r->data, r->n_bytes);
        sq_ours += sq_error(o, s, &n_ours);
        sq_ref += sq_error(r, s, &n_ref);
    }
    c.rmse_ours = sqrt(sq_ours / (double)n_ours);
    c.rmse_ref = sqrt(sq_ref / (double)n_ref);
    print_message("%s: %zu quantized tensors, %zu byte-identical to %s; rmse %.9g here, %.9g "
                  "there (%+.4f%%)\n",
                  recipe, c.n_tensors, c.n_identical, reference, c.rmse_ours, c.rmse_ref,
                  100.0 * (c.rmse_ours / c.rmse_ref - 1));
    /* The stats report the same error over the quantized values. */
    assert_true(fabs(st.rmse - c.rmse_ours) <= 1e-9 * c.rmse_ours + 1e-15);
    px_ir_model_free(src);
    px_ir_model_free(ref);
    px_ir_model_free(ours);
    free(src_path);
    free(ref_path);
    return c;
}

static void test_quantize_q8_0_blocks_identical_to_reference(void **state)
{
    (void)state;
    compared c = quantize_and_compare("stories260K.gguf", "stories260K-q8_0.gguf", "q8_0");
    assert_true(c.n_tensors > 0);
    assert_int_equal(c.n_identical, c.n_tensors);
}

static void test_quantize_q4_0_blocks_identical_to_reference(void **state)
{
    (void)state;
    compared c = quantize_and_compare("quant/synth-f32.gguf", "quant/synth-q4_0.gguf", "q4_0");
    assert_int_equal(c.n_tensors, 16);
    assert_int_equal(c.n_identical, c.n_tensors);
}

static void check_k_recipe(const char *recipe)
{
    char ref[64];
    snprintf(ref, sizeof ref, "quant/synth-%s.gguf", recipe);
    compared c = quantize_and_compare("quant/synth-f32.gguf", ref, recipe);
    assert_int_equal(c.n_tensors, 16);
    assert_true(c.rmse_ours <= c.rmse_ref * 1.01);
}

static void test_quantize_q4_k_m_within_1_percent_of_reference(void **state)
{
    (void)state;
    check_k_recipe("q4_k_m");
}

static void test_quantize_q5_k_m_within_1_percent_of_reference(void **state)
{
    (void)state;
    check_k_recipe("q5_k_m");
}

static void test_quantize_q6_k_within_1_percent_of_reference(void **state)
{
    (void)state;
    check_k_recipe("q6_k");
}

static void test_quantize_refuses_bad_recipes_inputs_and_weights(void **state)
{
    (void)state;
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/small.gguf", px_test_tmpdir());
    snprintf(out, sizeof out, "%s/small-q.gguf", px_test_tmpdir());
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 256;
    o.hidden_dim = 256;
    o.n_layers = 1;
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    assert_int_equal(px_rt_quantize_file(path, out, "q3_k_xl", NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "q4_k_m");
    /* Quantized input: refused, naming the tensor. */
    assert_int_equal(px_rt_quantize_file(path, out, "q4_0", NULL, &err), PX_OK);
    assert_int_equal(px_rt_quantize_file(out, path, "q4_k_m", NULL, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "already q");
    /* A NaN weight: refused, naming the tensor and the row; nothing
     * written. */
    px_ir_model *m = open_path(path);
    const px_ir_tensor *t = px_ir_model_find_tensor(m, "blk.0.ffn_up.weight");
    assert_non_null(t);
    uint64_t at = t->offset + 3 * t->nb[1] + 4 * 5;
    px_ir_model_free(m);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    float nan = NAN;
    assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
    assert_int_equal(fwrite(&nan, sizeof nan, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    remove(out);
    assert_int_equal(px_rt_quantize_file(path, out, "q6_k", NULL, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "blk.0.ffn_up.weight: row 3 value 5");
    FILE *none = fopen(out, "rb");
    assert_null(none);
    /* Not a model at all. */
    assert_int_not_equal(px_rt_quantize_file("/nonexistent/model.gguf", out, "q4_0", NULL, &err),
                         PX_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_q8_0_blocks_identical_to_reference),
        cmocka_unit_test(test_quantize_q4_0_blocks_identical_to_reference),
        cmocka_unit_test(test_quantize_q4_k_m_within_1_percent_of_reference),
        cmocka_unit_test(test_quantize_q5_k_m_within_1_percent_of_reference),
        cmocka_unit_test(test_quantize_q6_k_within_1_percent_of_reference),
        cmocka_unit_test(test_quantize_refuses_bad_recipes_inputs_and_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
