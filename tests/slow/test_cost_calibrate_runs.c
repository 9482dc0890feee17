/* `plexus calibrate` on the real tiny model: microbenchmarks and pipelines
 * on the cpu and emu devices of emu-small write an overlay that reads
 * back; plans made with it reproduce byte for byte and list its
 * corrections; a real run of the calibrated plan, checked against the
 * overlay, prints the error before and after.  Slow: it starts a dozen
 * pipelines. */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#include "plexus/cost.h"

static char *inv_path;

static int setup(void **state)
{
    (void)state;
    inv_path = px_test_source_path("data/scenarios/emu-small.json");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(inv_path);
    return 0;
}

/* Runs plexus with up to 15 arguments (NULL-terminated). */
static int plexus(char **out, char **err, const char *const *args)
{
    char *argv[18] = {(char *)px_test_plexus_bin()};
    for (int i = 0; args[i] && i < 16; i++)
        argv[i + 1] = (char *)args[i];
    return px_test_run(argv, 60, out, err);
}

static char *write_tmp(const char *name, const char *text)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_err err;
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
    return path;
}

static void test_calibrate_cli_learns_from_the_devices_and_plans_with_it(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *cal = px_asprintf("%s/cal.json", px_test_tmpdir());
    char *out = NULL, *err = NULL;
    const char *a[] = {"calibrate", "--inventory", inv_path, "--model", model,
                       "--runs",    "1",           "--out",  cal,       NULL};
    int rc = plexus(&out, &err, a);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "corrections");
    px_assert_contains(out, "local.emu-b");
    px_assert_contains(out, "matvec");
    px_assert_contains(out, "attention");
    px_assert_contains(out, "loopback");
    px_assert_contains(out, "median absolute error: sourced");
    px_assert_contains(out, "pipelines run here");
    /* The largest batch is timed by decode steps that carry all of it. */
    px_assert_contains(out, "1 to 128 rows");
    free(out);
    free(err);
    px_cost_calibration *c;
    px_err perr;
    px_assert_ok(px_cost_calibration_load(cal, &c, &perr), &perr);
    assert_true(px_cost_calibration_count(c) >= 9);
    px_cost_calibration_free(c);

    /* Each mode reproduces; the sourced mode is the default. */
    char *p[4] = {0};
    const char *calibrated[] = {"plan",   "--model",  model,        "--inventory",
                                inv_path, "--policy", "llamacpp",   "--context",
                                "40",     "--mode",   "calibrated", "--calibration",
                                cal,      "-o",       "json",       NULL};
    const char *sourced[] = {"plan",     "--model",  model,       "--inventory", inv_path,
                             "--policy", "llamacpp", "--context", "40",          "--mode",
                             "sourced",  "-o",       "json",      NULL};
    const char *plain[] = {"plan",     "--model",   model, "--inventory", inv_path, "--policy",
                           "llamacpp", "--context", "40",  "-o",          "json",   NULL};
    const char *const *cmds[4] = {calibrated, calibrated, sourced, plain};
    for (int i = 0; i < 4; i++) {
        rc = plexus(&p[i], &err, cmds[i]);
        if (rc != 0)
            fail_msg("plan %d: exit %d: %s", i, rc, err);
        free(err);
    }
    assert_string_equal(p[0], p[1]);
    assert_string_equal(p[2], p[3]);
    assert_true(strcmp(p[0], p[2]) != 0);
    px_assert_contains(p[0], "calibration overlay (mode calibrated)");
    px_assert_contains(p[0], "calibration: local.emu-a matvec (f32)");
    assert_null(strstr(p[2], "calibration"));

    /* A real run of the calibrated plan, checked against the overlay. */
    char *plan_path = write_tmp("plan-cal.json", p[0]);
    char *run_out = NULL;
    const char *run[] = {
        "run",      "--model",          model, "--plan", plan_path, "--inventory", inv_path,
        "--prompt", "Once upon a time", "-n",  "24",     "-o",      "json",        NULL};
    rc = plexus(&run_out, &err, run);
    if (rc != 0)
        fail_msg("run: exit %d: %s", rc, err);
    free(err);
    char *run_path = write_tmp("run.json", run_out);
    const char *check[] = {"calibrate",  "--inventory",   inv_path, "--model", model,
                           "--no-bench", "--calibration", cal,      "--check", run_path,
                           NULL};
    rc = plexus(&out, &err, check);
    if (rc != 0)
        fail_msg("check: exit %d: %s", rc, err);
    px_assert_contains(out, "held out");
    px_assert_contains(out, "run.json stage 1 local.emu-a decode");
    px_assert_contains(out, "calibrated");
    free(out);
    free(err);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    free(run_out);
    free(run_path);
    free(plan_path);
    free(cal);
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate_cli_learns_from_the_devices_and_plans_with_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
