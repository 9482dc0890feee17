/* Contracts: region lookup by exact name, glob and range, specificity, and
 * the check against a model's region names. */
#include "px_test.h"

#include <string.h>

#include "plexus/contract.h"

static px_contract *parse(const char *text)
{
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_parse(text, strlen(text), "lookup.json", NULL, &c, &err), &err);
    return c;
}

static const char *clause_of(const px_contract *c, const char *region)
{
    const px_contract_clause *cl;
    px_err err;
    px_assert_ok(px_contract_lookup(c, region, &cl, &err), &err);
    return cl->pattern;
}

static const char *layered =
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"deterministic\": true},\n"
    " \"regions\": {\n"
    "  \"layer.*.ffn\": {\"divergence\": {\"kl_max\": 0.01}},\n"
    "  \"layer.0-3.ffn\": {\"tolerance\": {\"atol\": 0.001, \"rtol\": 0.01}},\n"
    "  \"layer.2.ffn\": {\"bitwise\": true},\n"
    "  \"layer.*.*\": {\"agreement\": {\"top1_min\": 0.9}},\n"
    "  \"layer.10-12.attention\": {\"bitwise\": true},\n"
    "  \"*.0-3.attention\": {\"tolerance\": {\"atol\": 0.01, \"rtol\": 0.1}},\n"
    "  \"head\": {\"exact_logits\": [{\"prompt\": \"p\"}]}\n"
    " }}";

static void test_lookup_prefers_exact_then_range_then_glob(void **state)
{
    (void)state;
    px_contract *c = parse(layered);
    assert_string_equal(clause_of(c, "layer.2.ffn"), "layer.2.ffn");   /* exact */
    assert_string_equal(clause_of(c, "layer.3.ffn"), "layer.0-3.ffn"); /* range beats glob */
    assert_string_equal(clause_of(c, "layer.0.ffn"), "layer.0-3.ffn"); /* bounds inclusive */
    assert_string_equal(clause_of(c, "layer.4.ffn"), "layer.*.ffn");   /* outside the range */
    assert_string_equal(clause_of(c, "layer.17.ffn"), "layer.*.ffn");
    assert_string_equal(clause_of(c, "layer.7.norm"), "layer.*.*"); /* two stars, last resort */
    assert_string_equal(clause_of(c, "layer.11.attention"), "layer.10-12.attention");
    assert_string_equal(clause_of(c, "layer.13.attention"), "layer.*.*");
    /* One star beats two; a star with a range ranks after a plain star. */
    assert_string_equal(clause_of(c, "layer.1.attention"), "*.0-3.attention");
    assert_string_equal(clause_of(c, "block.1.attention"), "*.0-3.attention");
    assert_string_equal(clause_of(c, "head"), "head");
    assert_string_equal(clause_of(c, "embedding"), "default"); /* unlisted */
    assert_string_equal(clause_of(c, "layer.3"), "default");   /* segment count differs */
    assert_string_equal(clause_of(c, "layer.3.ffn.extra"), "default");
    /* A range matches plain decimal indices only: "03" is not 3. */
    assert_string_equal(clause_of(c, "layer.03.ffn"), "layer.*.ffn");
    const px_contract_clause *cl;
    px_assert_ok(px_contract_lookup(c, "layer.2.ffn", &cl, NULL), (px_err *)NULL);
    assert_int_equal(cl->reqs, PX_CONTRACT_BITWISE);
    px_contract_free(c);
}

static void test_lookup_rejects_names_that_are_not_region_names(void **state)
{
    (void)state;
    px_contract *c = parse(layered);
    const char *bad[] = {"",        "layer.*.ffn", "layer.0-3.ffn", "layer..ffn", "layer.3.ffn.",
                         "layer 3", "layer.3/ffn"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        const px_contract_clause *cl = (const px_contract_clause *)0x1;
        px_err err;
        assert_int_equal(px_contract_lookup(c, bad[i], &cl, &err), PX_EINVAL);
        assert_null(cl);
        px_assert_contains(err.msg, "region name \"");
    }
    char long_name[300];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const px_contract_clause *cl;
    px_err err;
    assert_int_equal(px_contract_lookup(c, long_name, &cl, &err), PX_EINVAL);
    px_assert_contains(err.msg, "more than the limit of 128");
    assert_int_equal(px_contract_lookup(c, NULL, &cl, &err), PX_EINVAL);
    px_contract_free(c);
}

/* The region names a five-layer model has, as the IR names them. */
static const char *const model_regions[] = {
    "embedding",   "layer.0.attention", "layer.0.ffn", "layer.1.attention",
    "layer.1.ffn", "layer.2.attention", "layer.2.ffn", "layer.3.attention",
    "layer.3.ffn", "layer.4.attention", "layer.4.ffn", "head",
};

static void test_check_regions_accepts_a_contract_that_fits_the_model(void **state)
{
    (void)state;
    px_contract *c = parse("{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true},"
                           " \"regions\": {\"layer.*.ffn\": {\"deterministic\": true},"
                           " \"layer.0-1.attention\": {\"deterministic\": true},"
                           " \"head\": {\"agreement\": {\"top1_min\": 0.99}}}}");
    px_diags diags;
    px_diags_init(&diags);
    px_err err;
    px_assert_ok(
        px_contract_check_regions(c, model_regions, PX_ARRAY_LEN(model_regions), &diags, &err),
        &err);
    assert_int_equal(diags.n, 0);
    px_diags_release(&diags);
    px_contract_free(c);
}

static void test_check_regions_rejects_a_typo_and_warns_about_dead_patterns(void **state)
{
    (void)state;
    px_contract *c = parse("{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true},"
                           " \"regions\": {\"layer.3.fnn\": {\"deterministic\": true},"
                           " \"layer.9.ffn\": {\"deterministic\": true},"
                           " \"layers.*.ffn\": {\"deterministic\": true},"
                           " \"layer.5-9.attention\": {\"deterministic\": true}}}");
    px_diags diags;
    px_diags_init(&diags);
    px_err err;
    assert_int_equal(
        px_contract_check_regions(c, model_regions, PX_ARRAY_LEN(model_regions), &diags, &err),
        PX_EVALIDATE);
    assert_int_equal(diags.n_errors, 2);
    assert_int_equal(diags.n_warnings, 2);
    px_assert_contains(err.msg, "/regions/layer.3.fnn: region \"layer.3.fnn\" is not in the model");
    char *report = px_diags_format(&diags, "c.json");
    px_assert_contains(report,
                       "error: /regions/layer.9.ffn: region \"layer.9.ffn\" is not in the model");
    px_assert_contains(
        report, "warning: /regions/layers.*.ffn: pattern \"layers.*.ffn\" matches no region");
    px_assert_contains(report, "warning: /regions/layer.5-9.attention");
    px_assert_contains(report, "fix: use the model's region names: embedding, layer.0.attention");
    px_assert_contains(report, "(12 in all)");
    free(report);
    px_diags_release(&diags);

    /* Invalid names from the model are reported, not trusted. */
    const char *const broken[] = {"layer.1.ffn", "", "layer.*.ffn"};
    px_diags_init(&diags);
    assert_int_equal(px_contract_check_regions(c, broken, 3, &diags, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "the model's region #1 \"\" is empty");
    px_diags_release(&diags);
    /* diags may be NULL. */
    assert_int_equal(px_contract_check_regions(c, model_regions, 2, NULL, &err), PX_EVALIDATE);
    px_contract_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_prefers_exact_then_range_then_glob),
        cmocka_unit_test(test_lookup_rejects_names_that_are_not_region_names),
        cmocka_unit_test(test_check_regions_accepts_a_contract_that_fits_the_model),
        cmocka_unit_test(test_check_regions_rejects_a_typo_and_warns_about_dead_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
