/* `plexus simulate`: byte-identical output for a seed, faults, errors. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/sim.h"

static const char inventory[] =
    "{\"schema\":\"plexus.inventory/1\",\"name\":\"sim-pair\","
    "\"domains\":[{\"id\":\"rack-a\",\"kind\":\"rack\"}],"
    "\"nodes\":[{\"id\":\"n1\",\"domains\":[\"rack-a\"],\"devices\":[{\"id\":\"gpu0\","
    "\"class\":\"gpu\",\"compute\":{\"bf16\":\"100 TFLOP/s\"},"
    "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"24 GB\",\"bandwidth\":\"1 "
    "TB/s\"}],"
    "\"power\":{\"tdp\":\"350 W\",\"idle\":\"50 W\"},\"cost\":\"1.8 $/h\"}]},"
    "{\"id\":\"n2\",\"domains\":[\"rack-a\"],\"devices\":[{\"id\":\"gpu0\",\"class\":\"gpu\","
    "\"compute\":{\"bf16\":\"100 TFLOP/s\"},"
    "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"24 GB\",\"bandwidth\":\"1 "
    "TB/s\"}],"
    "\"power\":{\"tdp\":\"350 W\",\"idle\":\"50 W\"}}]}]}";

/* Two single-stage replicas, one per device. */
static const char plan_doc[] =
    "{\"schema\":\"plexus.plan/1\",\"id\":\"cafe01\",\"emulated\":false,"
    "\"workload\":{\"batch\":4,\"micro_batches\":1,\"context\":2048,\"prompt_tokens\":256,"
    "\"gen_tokens\":64},"
    "\"batching\":{\"batch_per_replica\":4,\"micro_batches\":1,\"replicas\":2},"
    "\"predictions\":{\"throughput_tokens_per_s\":{\"p50\":600.0}},"
    "\"stages\":[{\"devices\":[\"n1.gpu0\"],\"memory_per_device\":{\"weights\":8e9,\"kv\":2e9},"
    "\"predicted\":{\"decode_s_per_token\":{\"p50\":0.012,\"p99\":0.015},"
    "\"prefill_s\":{\"p50\":0.2,\"p99\":0.25},\"transfer_s_per_token\":0}}],"
    "\"replicas\":[{\"index\":0,\"tpot_s\":0.012,\"stages\":[{\"devices\":[\"n1.gpu0\"]}]},"
    "{\"index\":1,\"tpot_s\":0.012,\"stages\":[{\"devices\":[\"n2.gpu0\"]}]}]}";

static char *write_tmp(const char *name, const char *text)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", px_test_tmpdir(), name) < 0)
        fail_msg("asprintf");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static int simulate(const char *seed, const char *faults, const char *trace, const char *fmt,
                    char **out, char **err)
{
    char *plan = write_tmp("plan.json", plan_doc);
    char *inv = write_tmp("inv.json", inventory);
    const char *argv[24] = {px_test_plexus_bin(),
                            "simulate",
                            "--plan",
                            plan,
                            "--inventory",
                            inv,
                            "--load",
                            "poisson:rate=8,prompt=128,gen=32",
                            "--duration",
                            "20s",
                            "--replications",
                            "3",
                            "--seed",
                            seed,
                            "-o",
                            fmt};
    int n = 16;
    if (trace) {
        argv[n++] = "--trace";
        argv[n++] = trace;
    }
    if (faults) {
        argv[n++] = "--faults";
        argv[n++] = faults;
    }
    argv[n] = NULL;
    int rc = px_test_run((char *const *)argv, 60, out, err);
    free(plan);
    free(inv);
    return rc;
}

static void test_simulate_same_seed_gives_byte_identical_json(void **state)
{
    (void)state;
    char *a, *b, *c, *e;
    assert_int_equal(simulate("7", NULL, NULL, "json", &a, &e), 0);
    free(e);
    assert_int_equal(simulate("7", NULL, NULL, "json", &b, &e), 0);
    free(e);
    assert_int_equal(simulate("8", NULL, NULL, "json", &c, &e), 0);
    free(e);
    assert_string_equal(a, b);
    assert_true(strcmp(a, c) != 0);
    px_assert_contains(a, "\"schema\": \"plexus.sim/1\"");
    px_assert_contains(a, "\"ttft_p99_s\"");
    json_t *doc = json_loads(a, 0, NULL);
    assert_non_null(doc);
    json_t *tps =
        json_object_get(json_object_get(json_object_get(doc, "metrics"), "tokens_per_s"), "mean");
    assert_true(json_number_value(tps) > 200 && json_number_value(tps) < 300);
    json_decref(doc);
    free(a);
    free(b);
    free(c);
    char *text;
    assert_int_equal(simulate("7", NULL, NULL, "text", &text, &e), 0);
    px_assert_contains(text, "time to first token p50");
    free(text);
    free(e);
}

static void test_simulate_counts_requests_lost_with_a_device(void **state)
{
    (void)state;
    char *faults =
        write_tmp("faults.json", "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"5 s\","
                                 "\"kind\":\"device-loss\",\"target\":\"n1.gpu0\"}]}");
    char *out, *err;
    assert_int_equal(simulate("1", faults, NULL, "json", &out, &err), 0);
    json_t *doc = json_loads(out, 0, NULL);
    assert_non_null(doc);
    json_t *m = json_object_get(doc, "metrics");
    assert_true(json_number_value(json_object_get(json_object_get(m, "failed"), "mean")) > 0);
    assert_true(json_number_value(json_object_get(json_object_get(m, "device_losses"), "mean")) ==
                1);
    json_decref(doc);
    free(out);
    free(err);
    free(faults);

    faults = write_tmp("bad.json", "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"5 s\","
                                   "\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n2.gpu0\","
                                   "\"bandwidth_factor\":2}]}");
    assert_int_equal(simulate("1", faults, NULL, "json", &out, &err), 1);
    px_assert_contains(err, "/faults/0/bandwidth_factor");
    free(out);
    free(err);
    free(faults);

    faults = write_tmp("ghost.json", "{\"schema\":\"plexus.faults/1\",\"faults\":["
                                     "{\"kind\":\"device-loss\",\"target\":\"n5.gpu0\"}]}");
    assert_int_equal(simulate("1", faults, NULL, "json", &out, &err), 1);
    px_assert_contains(err, "\"n5.gpu0\" is not in the plan's inventory");
    free(out);
    free(err);
    free(faults);
}

static void test_simulate_trace_replays_identically(void **state)
{
    (void)state;
    char *faults =
        write_tmp("faults-t.json", "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"3 s\","
                                   "\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n2.gpu0\","
                                   "\"latency\":\"1 ms\"},{\"at\":\"9 s\",\"kind\":\"domain-loss\","
                                   "\"target\":\"rack-a\"}]}");
    char *trace = NULL;
    if (asprintf(&trace, "%s/sim.trace", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *out, *err;
    assert_int_equal(simulate("3", faults, trace, "json", &out, &err), 0);
    size_t n;
    const px_trace_deriver *der = px_sim_replay_derivers(&n);
    px_trace_replay_report rep;
    px_err perr;
    px_assert_ok(px_trace_replay(trace, der, n, NULL, &rep, &perr), &perr);
    assert_int_equal(rep.n_identical, 1);
    assert_int_equal(rep.n_unreplayed, 0);
    free(out);
    free(err);
    free(trace);
    free(faults);
}

static void test_simulate_usage_errors(void **state)
{
    (void)state;
    char *out, *err;
    char *const no_load[] = {(char *)px_test_plexus_bin(), "simulate", "--plan", "x.json", NULL};
    assert_int_equal(px_test_run(no_load, 30, &out, &err), 2);
    px_assert_contains(err, "--load");
    free(out);
    free(err);
    char *plan = write_tmp("plan2.json", plan_doc);
    char *const bad_load[] = {(char *)px_test_plexus_bin(), "simulate", "--plan", plan, "--load",
                              "poisson:rate=5,colour=red",  NULL};
    assert_int_equal(px_test_run(bad_load, 30, &out, &err), 1);
    px_assert_contains(err, "unknown key \"colour\"");
    free(out);
    free(err);
    free(plan);
}

/* A plan simulated against another inventory than the one it was made on
 * is refused, naming both: a device of the same name may be another. */
static void test_simulate_refuses_a_plan_made_on_another_inventory(void **state)
{
    (void)state;
    char *pair = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *cluster = px_test_source_path("data/scenarios/faulted-cluster.json");
    char *plan = NULL;
    if (asprintf(&plan, "%s/pair-plan.json", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *out, *err;
    char *const mk[] = {(char *)px_test_plexus_bin(),
                        "plan",
                        "--model",
                        "llama-3-8b",
                        "--inventory",
                        pair,
                        "--no-fallbacks",
                        "--out",
                        plan,
                        NULL};
    assert_int_equal(px_test_run(mk, 120, &out, &err), 0);
    free(out);
    free(err);
    char *const other[] = {(char *)px_test_plexus_bin(),
                           "simulate",
                           "--plan",
                           plan,
                           "--inventory",
                           cluster,
                           "--load",
                           "poisson:rate=1,prompt=64,gen=16",
                           "--replications",
                           "1",
                           NULL};
    assert_int_equal(px_test_run(other, 60, &out, &err), 1);
    px_assert_contains(err, "made on the inventory \"hetero-pair-h100-l4\"");
    px_assert_contains(err, cluster);
    px_assert_contains(err, "plan on this inventory");
    px_assert_contains(err, "faulted-cluster.json");
    free(out);
    free(err);
    /* The same inventory: it runs; a load past what the plan serves is
     * called an overload, in the text report and in JSON. */
    char *const over[] = {(char *)px_test_plexus_bin(),
                          "simulate",
                          "--plan",
                          plan,
                          "--inventory",
                          pair,
                          "--load",
                          "poisson:rate=20,prompt=128,gen=64",
                          "--replications",
                          "1",
                          "--duration",
                          "10s",
                          NULL};
    assert_int_equal(px_test_run(over, 60, &out, &err), 0);
    px_assert_contains(out, "warning: overload: the load offers 1280 tokens/s but the plan "
                            "serves about");
    free(out);
    free(err);
    char *const light[] = {(char *)px_test_plexus_bin(),
                           "simulate",
                           "--plan",
                           plan,
                           "--inventory",
                           pair,
                           "--load",
                           "poisson:rate=1,prompt=128,gen=64",
                           "--replications",
                           "1",
                           "--duration",
                           "10s",
                           "-o",
                           "json",
                           NULL};
    assert_int_equal(px_test_run(light, 60, &out, &err), 0);
    assert_null(strstr(out, "overload"));
    assert_null(strstr(err, "overload"));
    free(out);
    free(err);
    free(plan);
    free(cluster);
    free(pair);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simulate_same_seed_gives_byte_identical_json),
        cmocka_unit_test(test_simulate_counts_requests_lost_with_a_device),
        cmocka_unit_test(test_simulate_trace_replays_identically),
        cmocka_unit_test(test_simulate_usage_errors),
        cmocka_unit_test(test_simulate_refuses_a_plan_made_on_another_inventory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
