/* `plexus compare`: byte-identical reruns, a known-better policy winning
 * with a significant paired difference, a policy against itself showing
 * none, and refusals of bad usage and bad packs. */
#include "px_test.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *tmp_path(const char *name)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", px_test_tmpdir(), name) < 0)
        fail_msg("asprintf");
    return path;
}

/* Runs plexus compare on the heterogeneous pack with the given policies
 * (a short run: 4 seeds, 40 s each), the text report on stdout, the JSON
 * document to json_path and the plot to svg_path (either may be NULL). */
static int compare(const char *policies, const char *json_path, const char *svg_path, char **out,
                   char **err)
{
    char *pack = px_test_source_path("data/packs/hetero.json");
    const char *argv[20] = {px_test_plexus_bin(), "compare", "--pack",  pack,
                            "--policies",         policies,  "--seeds", "4",
                            "--duration",         "40s"};
    int n = 10;
    if (json_path) {
        argv[n++] = "--out";
        argv[n++] = json_path;
    }
    if (svg_path) {
        argv[n++] = "--svg";
        argv[n++] = svg_path;
    }
    argv[n] = NULL;
    int rc = px_test_run((char *const *)argv, 120, out, err);
    free(pack);
    return rc;
}

static json_t *parse_doc(const char *text)
{
    json_error_t je;
    json_t *doc = json_loads(text, 0, &je);
    if (!doc)
        fail_msg("not JSON (%s): %.300s", je.text, text);
    return doc;
}

static const json_t *scenario(const json_t *doc, const char *name)
{
    size_t i;
    const json_t *s;
    json_array_foreach(json_object_get(doc, "scenarios"), i, s)
    {
        if (!strcmp(json_string_value(json_object_get(s, "name")), name))
            return s;
    }
    fail_msg("no scenario %s", name);
    return NULL;
}

static char *slurp(const char *path)
{
    char *text = NULL;
    size_t len;
    px_err e;
    if (px_read_file(path, 1 << 24, &text, &len, &e) != PX_OK)
        fail_msg("%s: %s", path, e.msg);
    return text;
}

/* The first run's JSON, kept for the tests after it. */
static char *plexus_vs_llamacpp;

/* Each axis' tick labels step by one round amount (1, 2 or 5 times a
 * power of ten), every label with the same number of decimals. */
static void check_round_ticks(const char *svg)
{
    const char *key = "text-anchor=\"middle\">";
    int axes = 0;
    const char *p = strstr(svg, key);
    while (p) {
        double v[32];
        int n = 0, decimals = -1;
        /* One axis: consecutive labels until a line that is not a tick. */
        for (; p && n < 32; p = strstr(p + 1, key)) {
            const char *t = p + strlen(key), *dot = strchr(t, '.'), *end = strchr(t, '<');
            int d = dot && dot < end ? (int)(end - dot - 1) : 0;
            if (decimals >= 0 && d != decimals)
                fail_msg("tick labels with %d and %d decimals", decimals, d);
            decimals = d;
            v[n++] = atof(t);
            const char *next = strstr(p + 1, key), *axis_end = strstr(p, "text-anchor=\"end\"");
            if (!next || (axis_end && axis_end < next)) {
                p = next;
                break;
            }
        }
        assert_true(n >= 3);
        double step = v[1] - v[0];
        double mag = pow(10, floor(log10(step))), norm = step / mag;
        if (!(fabs(norm - 1) < 1e-6 || fabs(norm - 2) < 1e-6 || fabs(norm - 5) < 1e-6))
            fail_msg("tick step %g is not round", step);
        for (int i = 1; i < n; i++)
            if (fabs(v[i] - v[i - 1] - step) > 1e-6 * step)
                fail_msg("uneven ticks %g, %g, %g", v[0], v[1], v[i]);
        axes++;
    }
    assert_true(axes >= 2);
}

static void test_compare_reruns_are_byte_identical(void **state)
{
    (void)state;
    char *json_a = tmp_path("a.json"), *json_b = tmp_path("b.json");
    char *svg_a = tmp_path("a.svg"), *svg_b = tmp_path("b.svg");
    char *out_a = NULL, *out_b = NULL, *err = NULL;
    int rc = compare("plexus,llamacpp", json_a, svg_a, &out_a, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    free(err);
    assert_int_equal(compare("plexus,llamacpp", json_b, svg_b, &out_b, &err), 0);
    free(err);
    /* Text, JSON and SVG: identical to the byte. */
    assert_string_equal(out_a, out_b);
    px_assert_contains(out_a, "scenario hetero-pair-h100-l4");
    px_assert_contains(out_a, "overall");
    char *ja = slurp(json_a), *jb = slurp(json_b);
    assert_string_equal(ja, jb);
    char *a = slurp(svg_a), *b = slurp(svg_b);
    assert_string_equal(a, b);
    /* Plain, well-formed SVG: one root, closed at the end. */
    assert_true(px_str_starts_with(a, "<?xml version=\"1.0\""));
    px_assert_contains(a, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
    assert_true(px_str_ends_with(a, "</svg>\n"));
    assert_null(strstr(strstr(a, "<svg") + 1, "<svg"));
    /* The axis in the unit the header names, ticks at round steps. */
    px_assert_contains(a, "hetero-pair-h100-l4: tpot_p50 (ms), 4 seeds");
    assert_null(strstr(a, "tpot_p50_s"));
    px_assert_contains(a, "text-anchor=\"end\">ms</text>");
    check_round_ticks(a);
    json_t *doc = parse_doc(ja);
    assert_string_equal(json_string_value(json_object_get(doc, "schema")), "plexus.compare/1");
    assert_int_equal(json_array_size(json_object_get(doc, "scenarios")), 2);
    json_decref(doc);
    plexus_vs_llamacpp = ja;
    free(jb);
    free(a);
    free(b);
    free(out_a);
    free(out_b);
    free(json_a);
    free(json_b);
    free(svg_a);
    free(svg_b);
}

/* On an H100 beside an L4, llama.cpp's memory-proportional split puts
 * layers on the L4; plexus keeps them on the H100 and must win on TPOT
 * by a significant paired difference. */
static void test_compare_known_better_policy_wins_significantly(void **state)
{
    (void)state;
    if (!plexus_vs_llamacpp)
        skip();
    json_t *doc = parse_doc(plexus_vs_llamacpp);
    const json_t *s = scenario(doc, "hetero-pair-h100-l4");
    assert_string_equal(json_string_value(json_object_get(s, "best")), "plexus");
    const json_t *ll = json_array_get(json_object_get(s, "policies"), 1);
    assert_string_equal(json_string_value(json_object_get(ll, "policy")), "llamacpp");
    const json_t *tpot = json_object_get(json_object_get(ll, "metrics"), "tpot_p50_s");
    const json_t *diff = json_object_get(tpot, "diff");
    assert_true(json_is_true(json_object_get(diff, "significant")));
    assert_true(json_real_value(json_object_get(diff, "lo")) > 0);
    assert_int_equal(json_integer_value(json_object_get(diff, "n")), 4);
    assert_int_equal(json_array_size(json_object_get(tpot, "samples")), 4);
    assert_true(json_real_value(json_object_get(json_object_get(ll, "policy_error"), "regret")) >
                0.5);
    /* Model error and the exact yardstick are reported. */
    const json_t *px = json_array_get(json_object_get(s, "policies"), 0);
    assert_true(
        json_is_real(json_object_get(json_object_get(px, "model_error"), "tpot_p50_relative")));
    assert_true(json_is_real(json_object_get(s, "exact_tpot_s")));
    json_decref(doc);
    free(plexus_vs_llamacpp);
    plexus_vs_llamacpp = NULL;
}

static void test_compare_policy_against_itself_shows_no_difference(void **state)
{
    (void)state;
    char *json = tmp_path("self.json");
    char *out = NULL, *err = NULL;
    assert_int_equal(compare("plexus,plexus", json, NULL, &out, &err), 0);
    char *text = slurp(json);
    json_t *doc = parse_doc(text);
    size_t i, j;
    const json_t *s, *p;
    json_array_foreach(json_object_get(doc, "scenarios"), i, s)
    {
        json_array_foreach(json_object_get(s, "policies"), j, p)
        {
            const char *key;
            const json_t *m;
            json_object_foreach(json_object_get(p, "metrics"), key, m)
            {
                const json_t *d = json_object_get(m, "diff");
                if (json_real_value(json_object_get(d, "mean")) != 0 ||
                    json_is_true(json_object_get(d, "significant")))
                    fail_msg("%s: %s: a policy against itself differs", key,
                             json_string_value(json_object_get(s, "name")));
            }
        }
    }
    json_decref(doc);
    free(text);
    free(json);
    free(out);
    free(err);
}

static void test_compare_takes_a_plain_inventory(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *out = NULL, *err = NULL;
    char *const argv[] = {(char *)px_test_plexus_bin(),
                          "compare",
                          "--pack",
                          inv,
                          "--policies",
                          "plexus,gpustack",
                          "--seeds",
                          "2",
                          "--duration",
                          "30s",
                          "--metric",
                          "tokens_per_s",
                          "-o",
                          "json",
                          NULL};
    int rc = px_test_run(argv, 120, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    json_t *doc = parse_doc(out);
    assert_string_equal(json_string_value(json_object_get(doc, "metric")), "tokens_per_s");
    const json_t *s = scenario(doc, "hetero-pair-h100-l4");
    /* The default load: Poisson sized to the plans, at the default lengths. */
    px_assert_contains(json_string_value(json_object_get(s, "load")), "poisson:rate=");
    px_assert_contains(json_string_value(json_object_get(s, "load")), "prompt=512,gen=256");
    json_decref(doc);
    free(out);
    free(err);
    free(inv);
}

static void test_compare_refuses_bad_usage_and_bad_packs(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    char *const no_pack[] = {(char *)px_test_plexus_bin(), "compare", NULL};
    assert_int_equal(px_test_run(no_pack, 30, &out, &err), 2);
    px_assert_contains(err, "--pack");
    free(out);
    free(err);
    char *const bad_policy[] = {(char *)px_test_plexus_bin(),
                                "compare",
                                "--pack",
                                "x.json",
                                "--policies",
                                "plexus,magic",
                                NULL};
    assert_int_equal(px_test_run(bad_policy, 30, &out, &err), 2);
    px_assert_contains(err, "unknown policy \"magic\"");
    free(out);
    free(err);
    char *const bad_seeds[] = {
        (char *)px_test_plexus_bin(), "compare", "--pack", "x.json", "--seeds", "0", NULL};
    assert_int_equal(px_test_run(bad_seeds, 30, &out, &err), 2);
    free(out);
    free(err);
    char *pack = tmp_path("bad-pack.json");
    const char *text = "{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                       "\"inventory\":\"i.json\",\"objective\":\"speed\"}]}";
    px_assert_ok(px_write_file(pack, text, strlen(text), NULL), NULL);
    char *const bad_pack[] = {(char *)px_test_plexus_bin(), "compare", "--pack", pack, NULL};
    assert_int_equal(px_test_run(bad_pack, 30, &out, &err), 1);
    px_assert_contains(err, "/scenarios/0/objective");
    free(out);
    free(err);
    free(pack);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compare_reruns_are_byte_identical),
        cmocka_unit_test(test_compare_known_better_policy_wins_significantly),
        cmocka_unit_test(test_compare_policy_against_itself_shows_no_difference),
        cmocka_unit_test(test_compare_takes_a_plain_inventory),
        cmocka_unit_test(test_compare_refuses_bad_usage_and_bad_packs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
