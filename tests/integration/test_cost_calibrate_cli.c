/* `plexus calibrate` and `plexus plan --mode`: run reports make an overlay
 * that reads back and reports held-out runs before and after; plans in
 * either mode reproduce byte for byte, the sourced mode is the default,
 * the calibrated plan lists its corrections and refuses those outside
 * their validity range; hostile overlays, run reports and bad usage are
 * refused clearly.  (tests/slow/test_cost_calibrate_runs.c times the
 * devices for real.) */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#include "plexus/cost.h"
#include "plexus/ir.h"

static char *inv_path, *synth_path;

static int setup(void **state)
{
    (void)state;
    inv_path = px_test_source_path("data/scenarios/emu-small.json");
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 64;
    o.hidden_dim = 172;
    o.n_layers = 5;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.vocab_size = 512;
    o.context_length = 128;
    synth_path = px_asprintf("%s/calib-cli.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, synth_path, &err), &err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(inv_path);
    free(synth_path);
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

/* A run report as `plexus run -o json` writes it, on the devices of
 * emu-small (observed decode steps of 20, 105 and 75 us). */
static const char *run_doc =
    "{\"schema\":\"plexus.run/1\",\"prefill\":{\"tokens\":5,\"seconds\":0.01},"
    "\"decode\":{\"tokens\":47,\"seconds\":0.01},\"results\":[{\"prompt\":\"x\"}],"
    "\"stages\":["
    "{\"device\":\"local.cpu0\",\"layers\":{\"first\":0,\"last\":1},"
    "\"decode_s_per_token\":{\"observed\":%g}},"
    "{\"device\":\"local.emu-a\",\"layers\":{\"first\":2,\"last\":3},"
    "\"decode_s_per_token\":{\"observed\":%g}},"
    "{\"device\":\"local.emu-b\",\"layers\":{\"first\":4,\"last\":4},"
    "\"decode_s_per_token\":{\"observed\":%g}}]}";

static void test_calibrate_from_runs_then_plan_in_both_modes(void **state)
{
    (void)state;
    char *runs[3];
    for (int i = 0; i < 3; i++) {
        char *doc = px_asprintf(run_doc, 20e-6 * (1 + 0.02 * i), 105e-6 * (1 - 0.01 * i),
                                75e-6 * (1 + 0.015 * i));
        char name[32];
        snprintf(name, sizeof name, "run%d.json", i);
        runs[i] = write_tmp(name, doc);
        free(doc);
    }
    char *cal = px_asprintf("%s/from-runs.json", px_test_tmpdir());
    char *out = NULL, *err = NULL;
    const char *a[] = {"calibrate",  "--inventory", inv_path, "--model",    synth_path,
                       "--no-bench", "--from-run",  runs[0],  "--from-run", runs[1],
                       "--check",    runs[2],       "--out",  cal,          NULL};
    int rc = plexus(&out, &err, a);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "local.emu-a");
    px_assert_contains(out, "held out");
    px_assert_contains(out, "run2.json stage 1 local.emu-a decode");
    px_assert_contains(out, "median absolute error: sourced");
    free(out);
    free(err);
    px_cost_calibration *c;
    px_err perr;
    px_assert_ok(px_cost_calibration_load(cal, &c, &perr), &perr);
    assert_int_equal(px_cost_calibration_count(c), 3);
    px_cost_calibration_free(c);

    /* Each mode reproduces; the sourced mode is the default. */
    char *p[4] = {0};
    const char *calibrated[] = {"plan",     "--model",  synth_path, "--inventory", inv_path,
                                "--policy", "llamacpp", "--mode",   "calibrated",  "--calibration",
                                cal,        "-o",       "json",     NULL};
    const char *sourced[] = {"plan",     "--model", synth_path, "--inventory", inv_path, "--policy",
                             "llamacpp", "--mode",  "sourced",  "-o",          "json",   NULL};
    const char *plain[] = {"plan",     "--model",  synth_path, "--inventory", inv_path,
                           "--policy", "llamacpp", "-o",       "json",        NULL};
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
    for (int i = 0; i < 4; i++)
        free(p[i]);
    for (int i = 0; i < 3; i++)
        free(runs[i]);
    free(cal);
}

static const char *overlay_doc =
    "{\"schema\":\"plexus.calibration/1\",\"corrections\":[{\"device\":\"local.emu-a\","
    "\"class\":\"matvec\",\"dtype\":\"f32\",\"valid\":{\"min\":1e9,\"max\":2e9},"
    "\"factor\":%s,\"interval\":{\"lo\":0.1,\"hi\":9},\"confidence\":0.95,\"samples\":4,"
    "\"dataset\":\"test\",\"timestamp\":\"2026-11-29T19:00:00Z\"}]}";

static void test_plan_refuses_corrections_outside_their_validity_range(void **state)
{
    (void)state;
    char *doc = px_asprintf(overlay_doc, "2.5");
    char *cal = write_tmp("far.json", doc);
    char *out = NULL, *err = NULL;
    const char *a[] = {"plan",       "--model",       synth_path, "--inventory", inv_path, "--mode",
                       "calibrated", "--calibration", cal,        "-o",          "json",   NULL};
    int rc = plexus(&out, &err, a);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "not applied: outside its validity range");
    free(out);
    free(err);
    /* The predictions are the sourced ones: the only correction is refused. */
    const char *b[] = {"plan", "--model", synth_path, "--inventory", inv_path, NULL};
    const char *c[] = {"plan",   "--model",    synth_path,      "--inventory", inv_path,
                       "--mode", "calibrated", "--calibration", cal,           NULL};
    char *sb = NULL, *cb = NULL;
    assert_int_equal(plexus(&sb, NULL, b), 0);
    assert_int_equal(plexus(&cb, NULL, c), 0);
    /* The text report says the costs are calibrated, and that this
     * plan could not use the one correction. */
    px_assert_contains(cb, "costs: calibrated");
    px_assert_contains(cb, "1 not applied to this plan");
    assert_null(strstr(sb, "costs: calibrated"));
    const char *ps = strstr(sb, "predictions"), *pc = strstr(cb, "predictions");
    assert_non_null(ps);
    assert_non_null(pc);
    const char *es = strstr(ps, "lower bound"), *ec = strstr(pc, "lower bound");
    assert_non_null(es);
    assert_non_null(ec);
    assert_int_equal(es - ps, ec - pc);
    assert_memory_equal(ps, pc, (size_t)(es - ps));
    free(sb);
    free(cb);
    free(doc);
    free(cal);
}

static void test_plan_and_calibrate_refuse_bad_input(void **state)
{
    (void)state;
    char *doc = px_asprintf(overlay_doc, "\"fast\"");
    char *cal = write_tmp("bad.json", doc);
    char *out = NULL, *err = NULL;
    const char *a[] = {"plan",   "--model",    synth_path,      "--inventory", inv_path,
                       "--mode", "calibrated", "--calibration", cal,           NULL};
    assert_int_equal(plexus(&out, &err, a), 1);
    px_assert_contains(err, "/corrections/0/factor");
    free(out);
    free(err);
    const char *b[] = {"plan",   "--model", synth_path,   "--inventory",
                       inv_path, "--mode",  "calibrated", NULL};
    assert_int_equal(plexus(&out, &err, b), 2);
    px_assert_contains(err, "--calibration");
    free(out);
    free(err);
    const char *c[] = {"plan",   "--model",       synth_path, "--inventory",
                       inv_path, "--calibration", cal,        NULL};
    assert_int_equal(plexus(&out, &err, c), 2);
    free(out);
    free(err);
    const char *d[] = {"calibrate", "--inventory", inv_path, "--model", synth_path, NULL};
    assert_int_equal(plexus(&out, &err, d), 2);
    px_assert_contains(err, "--out FILE");
    free(out);
    free(err);
    char *bad_run = write_tmp("bad-run.json", "{\"stages\": 3}");
    const char *e[] = {"calibrate", "--inventory", inv_path, "--model", synth_path, "--from-run",
                       bad_run,     "--no-bench",  "--out",  cal,       NULL};
    assert_int_equal(plexus(&out, &err, e), 1);
    px_assert_contains(err, "/stages");
    free(out);
    free(err);
    free(bad_run);
    free(doc);
    free(cal);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate_from_runs_then_plan_in_both_modes),
        cmocka_unit_test(test_plan_refuses_corrections_outside_their_validity_range),
        cmocka_unit_test(test_plan_and_calibrate_refuse_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
