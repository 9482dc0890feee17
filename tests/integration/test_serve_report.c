/* A serving run's report: plexus serve runs stories260K as the throughput
 * plan's stage workers on emu-small (this machine's cpu and two emulated
 * accelerators), requests run several at once, and on SIGTERM it writes
 * what each replica's stages took per decode step at the batches they ran
 * (--run-report); plexus calibrate --from-run learns decode corrections
 * from it; /health gives each replica's host_stretch.  Without stage
 * workers the option is refused.  Skipped without ../shared. */
#include "serve_harness.h"

#include <sched.h>
#include <sys/wait.h>

#include "plexus/serve.h"

/* n completions at once, each of max_tokens new tokens, through curl
 * (-f: an HTTP error fails the request). */
static void concurrent_requests(const sh_server *s, int n, int max_tokens)
{
    char url[128], auth[96], body[160];
    snprintf(url, sizeof url, "http://%s/v1/completions", s->addr);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", SH_KEY);
    pid_t kids[16];
    assert_true(n <= 16);
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        snprintf(body, sizeof body,
                 "{\"prompt\": \"Once upon a time %d\", \"max_tokens\": %d, \"temperature\": 0}", i,
                 max_tokens);
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            execlp("curl", "curl", "-sSf", "--max-time", "120", "-H", auth, "-H",
                   "Content-Type: application/json", "--data-binary", body, url, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) {
        int st;
        assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("request %d: curl exited %d", i, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* /health gives each replica's host_stretch: emu-small's devices all
 * run on this machine's cores (the scenario gives no count: the cores the
 * server may run on), so (every replica's stages + 1) / those cores, at
 * least 1. */
static void expect_host_stretch(const sh_server *s)
{
    int st;
    char *h = sh_curl(s, "GET", "/health", NULL, true, &st, NULL);
    assert_int_equal(st, 200);
    json_t *doc = json_loads(h, 0, NULL);
    assert_non_null(doc);
    const json_t *reps = json_object_get(doc, "replicas");
    size_t stages = 0, i;
    const json_t *r;
    json_array_foreach(reps, i, r) stages += json_array_size(json_object_get(r, "stages"));
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    double want = (double)(stages + 1) / CPU_COUNT(&set);
    want = want < 1 ? 1 : want > 64 ? 64 : want;
    json_array_foreach(reps, i, r)
    {
        double got = json_number_value(json_object_get(r, "host_stretch"));
        if (!(fabs(got - want) < 1e-9))
            fail_msg("replica %zu: host_stretch %g, expected %g (%zu stages):\n%s", i, got, want,
                     stages, h);
    }
    json_decref(doc);
    free(h);
}

static bool known_device(const char *id)
{
    return id &&
           (!strcmp(id, "local.cpu0") || !strcmp(id, "local.emu-a") || !strcmp(id, "local.emu-b"));
}

static void test_run_report_teaches_calibrate_the_served_steps(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inventory = px_test_source_path("data/scenarios/emu-small.json");
    char *report = px_asprintf("%s/served.json", px_test_tmpdir());
    char *overlay = px_asprintf("%s/served-calibration.json", px_test_tmpdir());
    unlink(report);
    const char *args[] = {"--model", model, "--inventory", inventory, "--run-report", report, NULL};
    sh_server srv;
    sh_start(&srv, args);
    expect_host_stretch(&srv);
    concurrent_requests(&srv, 8, 48);
    assert_int_equal(sh_stop(&srv), 0);

    /* The report: one run per replica, window and class of rows, each
     * stage on a device of the inventory with its observed step. */
    json_t *doc = json_load_file(report, 0, NULL);
    if (!doc)
        fail_msg("plexus serve wrote no run report at %s", report);
    assert_string_equal(json_string_value(json_object_get(doc, "schema")), "plexus.serve-run/1");
    assert_true(json_is_true(json_object_get(doc, "emulated")));
    px_assert_contains(json_string_value(json_object_get(doc, "notice")), "emulated devices");
    const json_t *runs = json_object_get(doc, "runs");
    assert_true(json_array_size(runs) >= 1);
    bool batched = false;
    size_t i;
    const json_t *run;
    json_array_foreach(runs, i, run)
    {
        assert_string_equal(json_string_value(json_object_get(run, "schema")), "plexus.run/1");
        json_int_t steps = json_integer_value(json_object_get(run, "steps"));
        double rows = json_number_value(json_object_get(run, "rows_per_step"));
        assert_true(steps >= PX_SERVE_REPORT_MIN_STEPS);
        assert_true(rows >= 1 && rows <= 8);
        assert_true(json_number_value(json_object_get(run, "context")) > 1);
        batched |= rows >= 2;
        size_t k;
        const json_t *st;
        json_array_foreach(json_object_get(run, "stages"), k, st)
        {
            const char *dev = json_string_value(json_object_get(st, "device"));
            if (!known_device(dev))
                fail_msg("run %zu stage %zu: device %s is not emu-small's", i, k,
                         dev ? dev : "(none)");
            double obs = json_number_value(
                json_object_get(json_object_get(st, "decode_s_per_token"), "observed"));
            double wait = json_number_value(json_object_get(st, "core_wait_s_per_decode_step"));
            /* The step as it ran: its waits for a core are part of it. */
            assert_true(obs > 0 && obs < 1);
            assert_true(wait >= 0 && wait <= obs);
        }
    }
    if (!batched)
        fail_msg("eight requests at once ran no step of two rows or more:\n%s",
                 json_dumps(doc, JSON_INDENT(1)));
    json_decref(doc);

    /* What calibrate learns from it: decode corrections at the served
     * rows, named after the report, and checked against it. */
    const char *cal[] = {
        px_test_plexus_bin(), "calibrate",  "--inventory", inventory, "--model", model,
        "--no-bench",         "--from-run", report,        "--out",   overlay,   NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run((char *const *)cal, 120, &out, &err);
    if (rc != 0)
        fail_msg("plexus calibrate --from-run exited %d:\n%s%s", rc, out ? out : "",
                 err ? err : "");
    px_assert_contains(out, "run reports, per-stage decode time per step (fitted, in-sample)");
    px_assert_contains(out, "served.json#0");
    free(out);
    free(err);
    json_t *o = json_load_file(overlay, 0, NULL);
    assert_non_null(o);
    bool decode = false;
    const json_t *c;
    json_array_foreach(json_object_get(o, "corrections"), i, c)
    {
        const char *dataset = json_string_value(json_object_get(c, "dataset"));
        px_assert_contains(dataset, "served.json");
        decode |= !strcmp(json_string_value(json_object_get(c, "class")), "decode");
    }
    assert_true(decode);
    json_decref(o);
    free(overlay);
    free(report);
    free(inventory);
    free(model);
}

static void test_run_report_needs_stage_workers(void **state)
{
    (void)state;
    const char *argv[] = {px_test_plexus_bin(), "serve",       "--model", "m.gguf",
                          "--run-report",       "served.json", NULL};
    char *out = NULL, *err = NULL;
    assert_int_equal(px_test_run((char *const *)argv, 30, &out, &err), 2);
    px_assert_contains(err, "--run-report describes stage workers: pass --inventory FILE");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_report_teaches_calibrate_the_served_steps),
        cmocka_unit_test(test_run_report_needs_stage_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
