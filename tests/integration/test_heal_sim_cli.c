/* `plexus simulate --heal`: the incidents in text and JSON, complete; the
 * trace replays identical and an edited one is refused; hysteresis counts
 * fewer plan switches than its absence on an intermittent link; usage
 * errors. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/heal.h"

/* Three nodes of two 16 GB GPUs behind a PCIe switch each (a shared
 * contention domain), Ethernet between nodes, two racks: the planner's
 * "gpustack" policy cuts Llama 3 8B into two pipeline stages here. */
static const char pipe_inventory[] =
    "{\"schema\": \"plexus.inventory/1\", \"name\": \"heal-pipe\","
    " \"domains\": [{\"id\": \"rack-a\", \"kind\": \"rack\"}, {\"id\": \"rack-b\", \"kind\": "
    "\"rack\"}],"
    " \"nodes\": ["
    "  {\"id\": \"n1\", \"domains\": [\"rack-a\"], \"devices\": ["
    "   {\"id\": \"gpu0\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}},"
    "   {\"id\": \"gpu1\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}}],"
    "   \"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"512 GiB\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"90 ns\"}]},"
    "  {\"id\": \"n2\", \"domains\": [\"rack-a\"], \"devices\": ["
    "   {\"id\": \"gpu0\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}},"
    "   {\"id\": \"gpu1\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}}],"
    "   \"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"512 GiB\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"90 ns\"}]},"
    "  {\"id\": \"n3\", \"domains\": [\"rack-b\"], \"devices\": ["
    "   {\"id\": \"gpu0\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}},"
    "   {\"id\": \"gpu1\", \"catalog\": \"nvidia-v100-pcie-16gb\", \"thermal\": {\"limit\": \"85 "
    "C\", \"time_constant\": \"20 s\"}}],"
    "   \"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"512 GiB\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"90 ns\"}]}],"
    " \"links\": ["
    "  {\"id\": \"n1-pcie0\", \"from\": \"n1.gpu0\", \"to\": \"n1\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n1-pcie-sw\"},"
    "  {\"id\": \"n1-pcie1\", \"from\": \"n1.gpu1\", \"to\": \"n1\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n1-pcie-sw\"},"
    "  {\"id\": \"n2-pcie0\", \"from\": \"n2.gpu0\", \"to\": \"n2\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n2-pcie-sw\"},"
    "  {\"id\": \"n2-pcie1\", \"from\": \"n2.gpu1\", \"to\": \"n2\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n2-pcie-sw\"},"
    "  {\"id\": \"n3-pcie0\", \"from\": \"n3.gpu0\", \"to\": \"n3\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n3-pcie-sw\"},"
    "  {\"id\": \"n3-pcie1\", \"from\": \"n3.gpu1\", \"to\": \"n3\", \"catalog\": \"pcie-3-x16\", "
    "\"latency\": \"2 us\", \"contention\": \"n3-pcie-sw\"},"
    "  {\"id\": \"eth-12\", \"from\": \"n1\", \"to\": \"n2\", \"catalog\": \"ethernet-100g\", "
    "\"latency\": \"10 us\"},"
    "  {\"id\": \"eth-23\", \"from\": \"n2\", \"to\": \"n3\", \"catalog\": \"ethernet-100g\", "
    "\"latency\": \"10 us\"},"
    "  {\"id\": \"eth-13\", \"from\": \"n1\", \"to\": \"n3\", \"catalog\": \"ethernet-100g\", "
    "\"latency\": \"10 us\"}]}";

static const char link_faults[] =
    "{\"schema\": \"plexus.faults/1\", \"faults\": [{\"at\": \"10 s\", \"kind\": "
    "\"link-degrade\", \"target\": \"n1.gpu0>n1.gpu1\", \"latency\": \"20 ms\", "
    "\"bandwidth_factor\": 0.2}, {\"at\": \"25 s\", \"kind\": \"device-loss\", \"target\": "
    "\"n2.gpu1\"}]}";

static const char flapping_faults[] =
    "{\"schema\": \"plexus.faults/1\", \"faults\": [{\"at\": \"10 s\", \"kind\": "
    "\"link-degrade\", \"target\": \"n1.gpu0>n1.gpu1\", \"latency\": \"20 ms\", "
    "\"bandwidth_factor\": 0.2, \"intermittent\": {\"period\": \"8 s\", \"duty\": 0.5}}]}";

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

static char *inv_path, *plan_path;

static int setup(void **state)
{
    (void)state;
    inv_path = write_tmp("heal-inv.json", pipe_inventory);
    if (asprintf(&plan_path, "%s/heal-plan.json", px_test_tmpdir()) < 0)
        return -1;
    const char *argv[] = {
        px_test_plexus_bin(), "plan",     "--model", "llama-3-8b", "--inventory", inv_path,
        "--policy",           "gpustack", "--out",   plan_path,    NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run((char *const *)argv, 120, &out, &err);
    if (rc != 0)
        fprintf(stderr, "plexus plan: %s\n", err ? err : "");
    free(out);
    free(err);
    return rc == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove(inv_path);
    remove(plan_path);
    free(inv_path);
    free(plan_path);
    return 0;
}

static int simulate(const char *faults, const char *fmt, const char *trace, const char *extra,
                    char **out, char **err)
{
    const char *argv[32] = {px_test_plexus_bin(),
                            "simulate",
                            "--plan",
                            plan_path,
                            "--inventory",
                            inv_path,
                            "--load",
                            "poisson:rate=2,prompt=128,gen=64",
                            "--duration",
                            "45s",
                            "--replications",
                            "1",
                            "--no-random-failures",
                            "--heal",
                            "--faults",
                            faults,
                            "-o",
                            fmt};
    int n = 18;
    if (trace) {
        argv[n++] = "--trace";
        argv[n++] = trace;
    }
    if (extra)
        argv[n++] = extra;
    argv[n] = NULL;
    return px_test_run((char *const *)argv, 120, out, err);
}

static void test_heal_cli_prints_complete_incidents_and_replays_identical(void **state)
{
    (void)state;
    char *faults = write_tmp("heal-faults.json", link_faults);
    char *trace = NULL;
    if (asprintf(&trace, "%s/heal-cli.trace", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *out = NULL, *err = NULL;
    assert_int_equal(simulate(faults, "json", trace, NULL, &out, &err), 0);
    json_error_t je;
    json_t *doc = json_loads(out, 0, &je);
    assert_non_null(doc);
    const json_t *incidents = json_object_get(doc, "incidents");
    assert_true(json_array_size(incidents) >= 2);
    size_t i;
    const json_t *inc;
    json_array_foreach(incidents, i, inc)
    {
        px_err e;
        if (!px_heal_incident_complete(inc, &e))
            fail_msg("incident %zu: %s", i, e.msg);
    }
    const char *first = json_string_value(
        json_object_get(json_object_get(json_array_get(incidents, 0), "signature"), "class"));
    assert_true(!strcmp(first, "interference") || !strcmp(first, "link-degrade"));
    json_decref(doc);
    free(out);
    free(err);

    /* Text: one paragraph per incident. */
    assert_int_equal(simulate(faults, "text", NULL, NULL, &out, &err), 0);
    px_assert_contains(out, "incident sim-r0-0");
    px_assert_contains(out, "device-loss at n2.gpu1");
    free(out);
    free(err);

    /* The trace replays identical. */
    const char *rargv[] = {px_test_plexus_bin(), "replay", trace, NULL};
    assert_int_equal(px_test_run((char *const *)rargv, 120, &out, &err), 0);
    px_assert_contains(out, "identical");
    free(out);
    free(err);

    /* An edited decision is refused. */
    FILE *f = fopen(trace, "r+");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    char *text = calloc(1, (size_t)size + 1);
    fseek(f, 0, SEEK_SET);
    assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
    /* The trigger's baseline lies only in a heal-sim.decision line. */
    char *num = strstr(text, "\"baseline\":");
    assert_non_null(num);
    num += strlen("\"baseline\":");
    *num = *num == '9' ? '8' : '9';
    fseek(f, 0, SEEK_SET);
    fwrite(text, 1, (size_t)size, f);
    fclose(f);
    free(text);
    assert_int_not_equal(px_test_run((char *const *)rargv, 120, &out, &err), 0);
    free(out);
    free(err);
    remove(trace);
    remove(faults);
    free(trace);
    free(faults);
}

static double switches(const char *json_text)
{
    json_error_t je;
    json_t *doc = json_loads(json_text, 0, &je);
    assert_non_null(doc);
    double v = json_number_value(
        json_object_get(json_object_get(json_object_get(doc, "metrics"), "plan_switches"), "mean"));
    json_decref(doc);
    return v;
}

static void test_heal_cli_hysteresis_switches_less_than_its_absence(void **state)
{
    (void)state;
    char *faults = write_tmp("heal-flap.json", flapping_faults);
    char *out = NULL, *err = NULL;
    assert_int_equal(simulate(faults, "json", NULL, "--no-hysteresis", &out, &err), 0);
    double without = switches(out);
    free(out);
    free(err);
    assert_int_equal(simulate(faults, "json", NULL, NULL, &out, &err), 0);
    double with = switches(out);
    free(out);
    free(err);
    assert_true(without > 2);
    assert_true(with <= 1);
    remove(faults);
    free(faults);
}

static void test_heal_cli_refuses_heal_without_an_inventory(void **state)
{
    (void)state;
    const char *argv[] = {px_test_plexus_bin(), "simulate", "--plan", plan_path, "--load",
                          "poisson:rate=1",     "--heal",   NULL};
    char *out = NULL, *err = NULL;
    assert_int_equal(px_test_run((char *const *)argv, 60, &out, &err), 2);
    px_assert_contains(err, "--inventory");
    free(out);
    free(err);
    const char *argv2[] = {px_test_plexus_bin(), "simulate",        "--plan", plan_path, "--load",
                           "poisson:rate=1",     "--no-hysteresis", NULL};
    assert_int_equal(px_test_run((char *const *)argv2, 60, &out, &err), 2);
    px_assert_contains(err, "--heal");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heal_cli_prints_complete_incidents_and_replays_identical),
        cmocka_unit_test(test_heal_cli_hysteresis_switches_less_than_its_absence),
        cmocka_unit_test(test_heal_cli_refuses_heal_without_an_inventory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
