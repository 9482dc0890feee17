/* Policy comparison: the pack reader's refusals, the paired statistics on
 * known numbers, and a small comparison through the library. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/sim.h"

static px_status parse(const char *text, px_sim_pack *pack, px_err *err)
{
    return px_sim_pack_parse(text, strlen(text), "packs/p.json", pack, err);
}

/* Parses text, expects failure with code and a message containing want. */
static void expect_refused(const char *text, px_status code, const char *want)
{
    px_sim_pack pack;
    px_err err;
    px_err_clear(&err);
    px_status st = parse(text, &pack, &err);
    if (st != code)
        fail_msg("expected %s for %s, got %s: %s", px_status_name(code), text, px_status_name(st),
                 err.msg);
    px_assert_contains(err.msg, want);
    assert_null(pack.scenarios);
    assert_null(pack.arena);
}

static void test_pack_reads_scenarios_and_resolves_paths(void **state)
{
    (void)state;
    const char *text =
        "{\"schema\":\"plexus.pack/1\",\"description\":\"d\",\"scenarios\":["
        "{\"name\":\"a\",\"inventory\":\"inv/a.json\",\"faults\":\"f.json\","
        "\"load\":\"trace:arr.jsonl\",\"model\":\"weights/m.gguf\",\"objective\":\"throughput\","
        "\"slo\":\"tpot=50ms\",\"context\":1024,\"prompt_tokens\":128,\"gen_tokens\":32,"
        "\"batch\":4},"
        "{\"name\":\"b\",\"inventory\":\"/abs/b.json\",\"load\":\"poisson:rate=2\"}]}";
    px_sim_pack pack;
    px_err err;
    px_assert_ok(parse(text, &pack, &err), &err);
    assert_int_equal(pack.n_scenarios, 2);
    const px_sim_scenario *a = &pack.scenarios[0], *b = &pack.scenarios[1];
    assert_string_equal(a->name, "a");
    assert_string_equal(a->inventory, "packs/inv/a.json");
    assert_string_equal(a->faults, "packs/f.json");
    assert_string_equal(a->load, "trace:packs/arr.jsonl");
    assert_string_equal(a->model, "packs/weights/m.gguf");
    assert_string_equal(a->objective, "throughput");
    assert_string_equal(a->slo, "tpot=50ms");
    assert_int_equal(a->context, 1024);
    assert_int_equal(a->prompt_tokens, 128);
    assert_int_equal(a->gen_tokens, 32);
    assert_int_equal(a->batch, 4);
    /* Defaults, and an absolute path kept as it is. */
    assert_string_equal(b->inventory, "/abs/b.json");
    assert_string_equal(b->model, "llama-3-8b");
    assert_string_equal(b->objective, "latency");
    assert_null(b->faults);
    assert_null(b->slo);
    assert_int_equal(b->context, 4096);
    assert_int_equal(b->prompt_tokens, 512);
    assert_int_equal(b->gen_tokens, 256);
    assert_int_equal(b->batch, 0);
    px_sim_pack_release(&pack);
    px_sim_pack_release(&pack); /* released twice: a no-op */
    px_sim_pack_release(NULL);
}

static void test_pack_accepts_a_plain_inventory(void **state)
{
    (void)state;
    const char *text = "{\"schema\":\"plexus.inventory/1\",\"name\":\"lab\",\"nodes\":[]}";
    px_sim_pack pack;
    px_err err;
    px_assert_ok(parse(text, &pack, &err), &err);
    assert_int_equal(pack.n_scenarios, 1);
    assert_string_equal(pack.scenarios[0].name, "lab");
    assert_string_equal(pack.scenarios[0].inventory, "packs/p.json");
    assert_string_equal(pack.scenarios[0].model, "llama-3-8b");
    assert_null(pack.scenarios[0].load);
    px_sim_pack_release(&pack);
    /* Without a usable name, the file's stem names it. */
    const char *unnamed = "{\"schema\":\"plexus.inventory/1\",\"nodes\":[]}";
    px_assert_ok(px_sim_pack_parse(unnamed, strlen(unnamed), "x/lab-2.json", &pack, &err), &err);
    assert_string_equal(pack.scenarios[0].name, "lab-2");
    px_sim_pack_release(&pack);
}

static void test_pack_refuses_hostile_documents(void **state)
{
    (void)state;
    expect_refused("", PX_EPARSE, "");
    expect_refused("[1,2]", PX_EPARSE, "expected a JSON object");
    expect_refused("{\"schema\":\"plexus.pack/2\",\"scenarios\":[]}", PX_EPARSE, "/schema");
    expect_refused("{\"schema\":\"plexus.pack/1\"}", PX_EPARSE, "/scenarios: missing or empty");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[]}", PX_EPARSE,
                   "/scenarios: missing or empty");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"extra\":1,\"scenarios\":[]}", PX_EPARSE,
                   "/extra: not a member of a pack");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[7]}", PX_EPARSE,
                   "/scenarios/0: expected an object");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"seeds\":3}]}",
                   PX_EPARSE, "/scenarios/0/seeds: not a member of a scenario");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"inventory\":\"i.json\"}]}",
                   PX_EPARSE, "/scenarios/0/name: missing");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\"}]}", PX_EPARSE,
                   "/scenarios/0/inventory: missing");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\"},{\"name\":\"a\",\"inventory\":\"j.json\"}]}",
                   PX_EPARSE, "/scenarios/1/name: \"a\" is already the name of /scenarios/0");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"objective\":\"speed\"}]}",
                   PX_EPARSE, "/scenarios/0/objective:");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"slo\":\"tpot=fast\"}]}",
                   PX_EPARSE, "/scenarios/0/slo:");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"load\":\"poisson:rate=-1\"}]}",
                   PX_EPARSE, "/scenarios/0/load:");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"load\":\"trace:\"}]}",
                   PX_EPARSE, "needs a file name");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"context\":-4}]}",
                   PX_EPARSE, "/scenarios/0/context: expected a whole number");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"batch\":1.5}]}",
                   PX_EPARSE, "/scenarios/0/batch");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\","
                   "\"inventory\":\"i.json\",\"context\":100,\"prompt_tokens\":200}]}",
                   PX_EPARSE, "exceeds the context");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\\u0000b\","
                   "\"inventory\":\"i.json\"}]}",
                   PX_EPARSE, "\\u0000");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"a\\nb\","
                   "\"inventory\":\"i.json\"}]}",
                   PX_EPARSE, "printable");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"\","
                   "\"inventory\":\"i.json\"}]}",
                   PX_EPARSE, "empty");
    expect_refused("{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":7,"
                   "\"inventory\":\"i.json\"}]}",
                   PX_EPARSE, "/scenarios/0/name: expected a string");
}

static void test_pack_refuses_too_many_scenarios_and_deep_nesting(void **state)
{
    (void)state;
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\":\"plexus.pack/1\",\"scenarios\":[");
    for (int i = 0; i < PX_SIM_PACK_MAX_SCENARIOS + 1; i++)
        px_strbuf_addf(&sb, "%s{\"name\":\"s%d\",\"inventory\":\"i.json\"}", i ? "," : "", i);
    px_strbuf_adds(&sb, "]}");
    expect_refused(sb.buf, PX_ELIMIT, "at most 256");
    px_strbuf_reset(&sb);
    for (int i = 0; i < 40; i++)
        px_strbuf_adds(&sb, "[");
    for (int i = 0; i < 40; i++)
        px_strbuf_adds(&sb, "]");
    px_sim_pack pack;
    px_err err;
    assert_int_not_equal(parse(sb.buf, &pack, &err), PX_OK);
    px_strbuf_release(&sb);
    /* Over the byte limit before any parsing. */
    size_t big = (1u << 20) + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, ' ', big);
    assert_int_equal(px_sim_pack_parse(huge, big, "big.json", &pack, &err), PX_ELIMIT);
    free(huge);
    assert_int_equal(px_sim_pack_load("/nonexistent/pack.json", &pack, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "/nonexistent/pack.json");
}

static void test_paired_diff_on_known_numbers(void **state)
{
    (void)state;
    /* Differences 1, 2, 3, 4, 5: mean 3, sd sqrt(2.5), t(4) = 2.776. */
    const double a[] = {11, 12, 13, 14, 15}, b[] = {10, 10, 10, 10, 10};
    px_sim_paired d;
    px_sim_paired_diff(a, b, 5, &d);
    assert_true(fabs(px_sim_t975(4) - 2.7764451) < 1e-6);
    double half = px_sim_t975(4) * sqrt(2.5 / 5);
    assert_int_equal(d.n, 5);
    assert_true(fabs(d.mean - 3) < 1e-12);
    assert_true(fabs(d.lo - (3 - half)) < 1e-9);
    assert_true(fabs(d.hi - (3 + half)) < 1e-9);
    assert_true(d.significant);
    /* Differences straddling 0: not significant. */
    const double c[] = {10, 12, 9, 11, 10};
    px_sim_paired_diff(c, b, 5, &d);
    assert_true(d.lo < 0 && d.hi > 0);
    assert_false(d.significant);
    /* The same numbers on both sides: exactly 0, the interval the point. */
    px_sim_paired_diff(a, a, 5, &d);
    assert_true(d.mean == 0 && d.lo == 0 && d.hi == 0);
    assert_false(d.significant);
    /* A constant non-zero shift: the point, significant. */
    const double e[] = {12, 13, 14, 15, 16};
    px_sim_paired_diff(e, a, 5, &d);
    assert_true(d.mean == 1 && d.lo == 1 && d.hi == 1);
    assert_true(d.significant);
    /* Pairs with an undefined side are left out. */
    const double f[] = {11, NAN, 13, INFINITY, 15};
    px_sim_paired_diff(f, b, 5, &d);
    assert_int_equal(d.n, 3);
    assert_true(fabs(d.mean - 3) < 1e-12);
    /* One pair: unbounded unless it is 0; none: NAN. */
    px_sim_paired_diff(a, b, 1, &d);
    assert_true(isinf(d.lo) && isinf(d.hi));
    assert_false(d.significant);
    px_sim_paired_diff(f + 1, b, 1, &d);
    assert_int_equal(d.n, 0);
    assert_true(isnan(d.mean));
    assert_false(d.significant);
}

static void test_metric_names_round_trip(void **state)
{
    (void)state;
    for (int m = 0; m < PX_SIM_CMP_COUNT_; m++) {
        px_sim_cmp_metric back;
        px_assert_ok(
            px_sim_cmp_metric_parse(px_sim_cmp_metric_name((px_sim_cmp_metric)m), &back, NULL),
            NULL);
        assert_int_equal(back, m);
    }
    px_sim_cmp_metric x;
    px_err err;
    assert_int_equal(px_sim_cmp_metric_parse("speed", &x, &err), PX_EINVAL);
    px_assert_contains(err.msg, "tpot_p50_s");
    assert_true(px_sim_cmp_metric_higher_is_better(PX_SIM_CMP_TOKENS_PER_S));
    assert_false(px_sim_cmp_metric_higher_is_better(PX_SIM_CMP_TPOT_P50));
}

static void test_compare_refuses_bad_options(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    px_sim_pack pack;
    px_err err;
    px_assert_ok(px_sim_pack_load(inv, &pack, &err), &err);
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    px_sim_comparison cmp;
    const char *twice[] = {"plexus", "plexus"};
    const char *unknown[] = {"plexus", "magic"};
    opt.policies = unknown;
    opt.n_policies = 2;
    assert_int_equal(px_sim_compare(&pack, &opt, &cmp, &err), PX_EINVAL);
    px_assert_contains(err.msg, "unknown policy \"magic\"");
    opt.policies = twice;
    opt.n_policies = 1;
    opt.seeds = 0;
    assert_int_equal(px_sim_compare(&pack, &opt, &cmp, &err), PX_EINVAL);
    px_assert_contains(err.msg, "seeds");
    opt.seeds = 2;
    opt.n_policies = 0;
    assert_int_equal(px_sim_compare(&pack, &opt, &cmp, &err), PX_EINVAL);
    px_assert_contains(err.msg, "policies");
    px_sim_pack_release(&pack);
    /* A missing inventory names the scenario. */
    const char *text = "{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"gone\","
                       "\"inventory\":\"/nonexistent/inv.json\"}]}";
    px_assert_ok(parse(text, &pack, &err), &err);
    px_sim_compare_options_default(&opt);
    opt.policies = twice;
    opt.n_policies = 1;
    assert_int_not_equal(px_sim_compare(&pack, &opt, &cmp, &err), PX_OK);
    px_assert_contains(err.msg, "scenario \"gone\"");
    px_sim_pack_release(&pack);
    free(inv);
}

/* The comparison keeps its own copies: the pack may go first.  An explicit
 * load is used as given. */
static void test_compare_outlives_its_pack(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *text = NULL;
    if (asprintf(&text,
                 "{\"schema\":\"plexus.pack/1\",\"scenarios\":[{\"name\":\"pair\","
                 "\"inventory\":\"%s\",\"load\":\"poisson:rate=2,prompt=64,gen=16\","
                 "\"context\":1024,\"prompt_tokens\":64,\"gen_tokens\":16}]}",
                 inv) < 0)
        fail_msg("asprintf");
    px_sim_pack pack;
    px_err err;
    px_assert_ok(parse(text, &pack, &err), &err);
    const char *policies[] = {"plexus"};
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    opt.policies = policies;
    opt.n_policies = 1;
    opt.seeds = 2;
    opt.duration_s = 10;
    opt.exact_max_devices = 0;
    px_sim_comparison c;
    px_assert_ok(px_sim_compare(&pack, &opt, &c, &err), &err);
    px_sim_pack_release(&pack);
    assert_string_equal(c.scenarios[0].name, "pair");
    assert_string_equal(c.scenarios[0].load, "poisson:rate=2,prompt=64,gen=16");
    assert_true(c.scenarios[0].duration_s == 10);
    assert_true(isnan(c.scenarios[0].exact_tpot_s));
    assert_true(isnan(c.scenarios[0].policies[0].exact_gap));
    json_t *doc = px_sim_comparison_to_json(&c);
    assert_non_null(doc);
    assert_true(json_is_null(
        json_object_get(json_array_get(json_object_get(doc, "scenarios"), 0), "exact_tpot_s")));
    json_decref(doc);
    px_sim_comparison_release(&c);
    px_sim_comparison_release(&c);
    free(text);
    free(inv);
}

/* plexus against llama.cpp's split on an H100 beside an L4: plexus keeps
 * the model on the H100 and must win on TPOT by a significant paired
 * difference; everything is reproducible. */
/* A throughput scenario is judged on tokens per second, and its default
 * duration lets requests of the slowest plan finish many times over. */
static void test_compare_judges_a_scenario_on_its_objective(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    px_sim_pack pack;
    px_err err;
    px_assert_ok(px_sim_pack_load(inv, &pack, &err), &err);
    pack.scenarios[0].objective = "throughput";
    pack.scenarios[0].context = 2048;
    pack.scenarios[0].prompt_tokens = 256;
    pack.scenarios[0].gen_tokens = 32;
    const char *policies[] = {"plexus", "llamacpp"};
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    opt.policies = policies;
    opt.n_policies = 2;
    opt.seeds = 2;
    opt.exact_max_devices = 0;
    px_sim_comparison c;
    px_assert_ok(px_sim_compare(&pack, &opt, &c, &err), &err);
    const px_sim_scenario_outcome *so = &c.scenarios[0];
    assert_int_equal(so->metric, PX_SIM_CMP_TOKENS_PER_S);
    double slowest = 0;
    for (size_t p = 0; p < 2; p++)
        if (so->policies[p].feasible)
            slowest = PX_MAX(slowest, 32 * so->policies[p].predicted_tpot_p50_s);
    assert_true(so->duration_s >= 10 * slowest);
    /* Every feasible policy finished requests. */
    for (size_t p = 0; p < 2; p++)
        if (so->policies[p].feasible)
            assert_true(so->policies[p].stats[PX_SIM_CMP_TOKENS_PER_S].mean > 0);
    px_strbuf r = PX_STRBUF_INIT;
    px_assert_ok(px_sim_comparison_report(&c, &r), NULL);
    px_assert_contains(r.buf, "best on tokens_per_s");
    px_strbuf_release(&r);
    px_sim_comparison_release(&c);
    /* --metric: one figure everywhere. */
    opt.metric_by_objective = false;
    px_assert_ok(px_sim_compare(&pack, &opt, &c, &err), &err);
    assert_int_equal(c.scenarios[0].metric, PX_SIM_CMP_TPOT_P50);
    px_sim_comparison_release(&c);
    px_sim_pack_release(&pack);
    free(inv);
}

static void test_compare_finds_the_better_policy(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    px_sim_pack pack;
    px_err err;
    px_assert_ok(px_sim_pack_load(inv, &pack, &err), &err);
    pack.scenarios[0].context = 2048;
    pack.scenarios[0].prompt_tokens = 256;
    pack.scenarios[0].gen_tokens = 32;
    const char *policies[] = {"plexus", "llamacpp"};
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    opt.policies = policies;
    opt.n_policies = 2;
    opt.seeds = 4;
    opt.duration_s = 20;
    px_sim_comparison a, b;
    px_assert_ok(px_sim_compare(&pack, &opt, &a, &err), &err);
    px_assert_ok(px_sim_compare(&pack, &opt, &b, &err), &err);
    const px_sim_scenario_outcome *so = &a.scenarios[0];
    const px_sim_policy_outcome *px = &so->policies[0], *ll = &so->policies[1];
    assert_true(px->feasible && ll->feasible);
    assert_string_equal(so->best, "plexus");
    assert_true(ll->diff[PX_SIM_CMP_TPOT_P50].mean > 0);
    assert_true(ll->diff[PX_SIM_CMP_TPOT_P50].significant);
    assert_true(ll->regret > 0);
    assert_true(px->regret == 0);
    /* The reference against itself: exactly nothing. */
    assert_true(px->diff[PX_SIM_CMP_TPOT_P50].mean == 0);
    assert_false(px->diff[PX_SIM_CMP_TPOT_P50].significant);
    assert_true(isfinite(px->model_error));
    assert_true(isfinite(so->exact_tpot_s));
    assert_true(px->exact_gap > -1e-9);
    /* Reruns give the same numbers and the same document. */
    json_t *ja = px_sim_comparison_to_json(&a), *jb = px_sim_comparison_to_json(&b);
    char *ta = px_json_dump_canonical(ja), *tb = px_json_dump_canonical(jb);
    assert_string_equal(ta, tb);
    px_strbuf ra = PX_STRBUF_INIT, sa = PX_STRBUF_INIT;
    px_assert_ok(px_sim_comparison_report(&a, &ra), NULL);
    px_assert_ok(px_sim_comparison_svg(&a, PX_SIM_CMP_TPOT_P50, &sa), NULL);
    px_assert_contains(ra.buf, "scenario hetero-pair-h100-l4");
    px_assert_contains(sa.buf, "<svg");
    px_assert_contains(sa.buf, "</svg>");
    px_strbuf_release(&ra);
    px_strbuf_release(&sa);
    free(ta);
    free(tb);
    json_decref(ja);
    json_decref(jb);
    assert_int_equal(a.overall[1].wins, 0);
    assert_int_equal(a.overall[0].wins, 1);
    assert_true(a.overall[1].rel_diff[PX_SIM_CMP_TPOT_P50].significant);
    px_sim_comparison_release(&a);
    px_sim_comparison_release(&b);
    px_sim_pack_release(&pack);
    free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_reads_scenarios_and_resolves_paths),
        cmocka_unit_test(test_pack_accepts_a_plain_inventory),
        cmocka_unit_test(test_pack_refuses_hostile_documents),
        cmocka_unit_test(test_pack_refuses_too_many_scenarios_and_deep_nesting),
        cmocka_unit_test(test_paired_diff_on_known_numbers),
        cmocka_unit_test(test_metric_names_round_trip),
        cmocka_unit_test(test_compare_refuses_bad_options),
        cmocka_unit_test(test_compare_outlives_its_pack),
        cmocka_unit_test(test_compare_finds_the_better_policy),
        cmocka_unit_test(test_compare_judges_a_scenario_on_its_objective),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
