/* `plexus run` under supervision, from the command line: bad --inject
 * specs and targets are refused with the accepted forms; a run without
 * --inventory says that healing needs one; a supervised run without
 * faults prints exactly the text of an unsupervised one; the text output
 * prints each incident as a paragraph and --incidents writes the
 * records; and the trace of a healed run replays identical, is refused
 * when a line is edited, and diverges when a recorded observation is
 * changed and the chain recomputed; the run report holds text that is
 * not UTF-8; and a hand-written plan without predictions is warned of.
 * Skipped without the shared model (but the last two). */
#include "stories_run.h"

#include <string.h>

#include "plexus/heal.h"

static void test_run_refuses_a_malformed_inject_with_the_forms(void **state)
{
    (void)state;
    if (!model)
        skip();
    const char *args[] = {
        "run", "--model", model,      "--inventory",           inventory, "--prompt", "Once",
        "-n",  "4",       "--inject", "explode:stage1@token3", NULL};
    char *out = NULL, *errs = NULL;
    assert_int_equal(run_plexus(args, &out, &errs), 2);
    px_assert_contains(errs, "explode:stage1@token3");
    px_assert_contains(errs, "kill");
    free(out);
    free(errs);
}

static void test_run_refuses_an_inject_target_the_plan_lacks(void **state)
{
    (void)state;
    if (!model)
        skip();
    const char *args[] = {"run",
                          "--model",
                          model,
                          "--inventory",
                          inventory,
                          "--plan",
                          plan,
                          "--prompt",
                          "Once",
                          "-n",
                          "4",
                          "--inject",
                          "kill:stage7@token3",
                          NULL};
    char *out = NULL, *errs = NULL;
    assert_int_equal(run_plexus(args, &out, &errs), 1);
    px_assert_contains(errs, "kill:stage7@token3");
    px_assert_contains(errs, "stage");
    free(out);
    free(errs);
}

static void test_run_without_inventory_says_healing_needs_one(void **state)
{
    (void)state;
    if (!model)
        skip();
    /* The plan names emulated devices: without the inventory they carry
     * their profiles nowhere, so use a cpu-only hand plan. */
    char *hand = px_asprintf("%s/hand.json", px_test_tmpdir());
    const char *doc = "{\"schema\": \"plexus.plan/1\", \"stages\": ["
                      "{\"layers\": {\"first\": 0, \"last\": 2}, \"backend\": \"cpu\"},"
                      "{\"layers\": {\"first\": 3, \"last\": 4}, \"backend\": \"cpu\"}]}";
    px_err err;
    px_assert_ok(px_write_file(hand, doc, strlen(doc), &err), &err);
    const char *args[] = {"run",
                          "--model",
                          model,
                          "--plan",
                          hand,
                          "--prompt",
                          "Once",
                          "-n",
                          "8",
                          "--inject",
                          "crash:stage1@token3",
                          NULL};
    char *out = NULL, *errs = NULL;
    int rc = run_plexus(args, &out, &errs);
    px_assert_contains(errs, "healing needs --inventory");
    /* A crashed worker is still restarted on the same plan. */
    if (rc != 0)
        fail_msg("exit %d:\n%s\n%s", rc, out, errs);
    px_assert_contains(out, "restart");
    free(out);
    free(errs);
    free(hand);
}

static void test_supervised_run_without_faults_prints_the_same_text(void **state)
{
    (void)state;
    if (!model)
        skip();
    const char *plain[] = {"run",  "--model", model, "--inventory", inventory,          "--plan",
                           plan,   "-n",      "24",  "--prompt",    "Once upon a time", "-o",
                           "json", NULL};
    char *trace = px_asprintf("%s/quiet.trace", px_test_tmpdir());
    const char *supervised[] = {
        "run",      "--model",          model, "--inventory", inventory, "--plan", plan, "-n", "24",
        "--prompt", "Once upon a time", "-o",  "json",        "--trace", trace,    NULL};
    char *a = NULL, *b = NULL;
    assert_int_equal(run_plexus(plain, &a, NULL), 0);
    assert_int_equal(run_plexus(supervised, &b, NULL), 0);
    json_t *ja = NULL, *jb = NULL;
    px_err err;
    px_assert_ok(px_json_parse(a, strlen(a), "plain", NULL, &ja, &err), &err);
    px_assert_ok(px_json_parse(b, strlen(b), "supervised", NULL, &jb, &err), &err);
    const json_t *ra = json_array_get(json_object_get(ja, "results"), 0);
    const json_t *rb = json_array_get(json_object_get(jb, "results"), 0);
    assert_string_equal(json_string_value(json_object_get(ra, "text")),
                        json_string_value(json_object_get(rb, "text")));
    assert_null(json_object_get(ja, "incidents"));
    assert_true(json_is_array(json_object_get(jb, "incidents")));
    json_decref(ja);
    json_decref(jb);
    const char *rep[] = {"replay", trace, NULL};
    char *r = NULL;
    assert_int_equal(run_plexus(rep, &r, NULL), 0);
    px_assert_contains(r, "identical");
    free(r);
    free(a);
    free(b);
    free(trace);
}

/* Rewrites the chain of every line from `from` on, as someone who edits
 * a trace with the tools at hand would. */
static char *rechain(const char *text)
{
    px_strbuf sb = PX_STRBUF_INIT;
    char prev[65] = "";
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        json_t *v = NULL;
        px_err err;
        px_assert_ok(px_json_parse(line, len, "line", NULL, &v, &err), &err);
        json_object_del(v, "chain");
        char *canon = px_json_dump_line(v);
        px_strbuf tmp = PX_STRBUF_INIT;
        px_strbuf_addf(&tmp, "%s\n%s", prev, canon);
        px_digest d;
        px_sha256(tmp.buf, tmp.len, &d);
        px_digest_hex(&d, prev);
        json_object_set_new(v, "chain", json_string(prev));
        char *out = px_json_dump_line(v);
        px_strbuf_addf(&sb, "%s\n", out);
        free(out);
        free(canon);
        px_strbuf_release(&tmp);
        json_decref(v);
        line = nl ? nl + 1 : line + len;
    }
    return px_strbuf_detach(&sb, NULL);
}

static void test_healed_trace_replays_and_detects_edits(void **state)
{
    (void)state;
    if (!model)
        skip();
    char *trace = px_asprintf("%s/heal.trace", px_test_tmpdir());
    char *incidents = px_asprintf("%s/incidents.json", px_test_tmpdir());
    const char *args[] = {"run",
                          "--model",
                          model,
                          "--inventory",
                          inventory,
                          "--plan",
                          plan,
                          "-n",
                          "32",
                          "--prompt",
                          "Once upon a time",
                          "--inject",
                          "kill:stage1@token12",
                          "--trace",
                          trace,
                          "--incidents",
                          incidents,
                          NULL};
    char *out = NULL, *errs = NULL;
    int rc = run_plexus(args, &out, &errs);
    if (rc != 0)
        fail_msg("exit %d:\n%s\n%s", rc, out, errs);
    /* Text output: each incident as a paragraph after the report. */
    px_assert_contains(out, "incidents:");
    /* The device the plan puts stage 1 on. */
    json_t *pd = NULL;
    px_err perr;
    px_assert_ok(px_json_load_file(plan, NULL, &pd, &perr), &perr);
    const json_t *st1 = json_array_get(json_object_get(pd, "stages"), 1);
    char *want = px_asprintf("device-loss at %s",
                             json_string_value(json_array_get(json_object_get(st1, "devices"), 0)));
    json_decref(pd);
    px_assert_contains(out, want);
    free(want);
    px_assert_contains(out, "Recovered (detection to the first token");
    px_assert_contains(out, "plexus replay");
    json_t *inc = NULL;
    px_err err;
    px_assert_ok(px_json_load_file(incidents, NULL, &inc, &err), &err);
    assert_true(json_array_size(inc) >= 1);
    assert_true(px_heal_incident_complete(json_array_get(inc, 0), &err));
    json_decref(inc);

    const char *rep[] = {"replay", trace, NULL};
    char *r = NULL;
    assert_int_equal(run_plexus(rep, &r, NULL), 0);
    px_assert_contains(r, "identical");
    free(r);

    char *text = NULL;
    size_t len;
    px_assert_ok(px_read_file(trace, 64u << 20, &text, &len, &err), &err);
    /* An edited line: the chain breaks and replay refuses the trace. */
    char *edited = px_strdup(text);
    char *at = strstr(edited, "\"culprit\":1");
    assert_non_null(at);
    at[10] = '0';
    char *bad = px_asprintf("%s/edited.trace", px_test_tmpdir());
    px_assert_ok(px_write_file(bad, edited, strlen(edited), &err), &err);
    const char *rep2[] = {"replay", bad, NULL};
    char *r2 = NULL, *e2 = NULL;
    assert_int_equal(run_plexus(rep2, &r2, &e2), 1);
    px_assert_contains(e2, "chain");
    /* The same change with the chain recomputed: the failure now blames
     * stage 0, so the mitigation derived from it diverges. */
    char *rechained = rechain(edited);
    px_assert_ok(px_write_file(bad, rechained, strlen(rechained), &err), &err);
    char *r3 = NULL;
    assert_int_equal(run_plexus(rep2, &r3, NULL), 3);
    px_assert_contains(r3, "diverged");
    px_assert_contains(r3, "heal.mitigation");
    free(r2);
    free(e2);
    free(r3);
    free(rechained);
    free(bad);
    free(edited);
    free(text);
    free(out);
    free(errs);
    free(trace);
    free(incidents);
}

/* A model's text may hold bytes that are not UTF-8 (byte tokens, a
 * character cut by the token limit): the run report carries them as
 * U+FFFD instead of failing.  A synthetic model with a byte vocabulary,
 * greedy, writes such bytes within its first tokens. */
static void test_run_report_holds_text_that_is_not_utf8(void **state)
{
    (void)state;
    char *synth = px_asprintf("%s/bytes.gguf", px_test_tmpdir());
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    const char *mk[] = {"model",      "synth", "--out",    synth, "--dim",     "64",
                        "--hidden",   "128",   "--layers", "2",   "--heads",   "4",
                        "--kv-heads", "2",     "--vocab",  "512", "--context", "128",
                        "--seed",     "1",     NULL};
    char *out = NULL, *errs = NULL;
    assert_int_equal(run_plexus(mk, &out, &errs), 0);
    free(out);
    free(errs);
    const char *args[] = {"run",  "--model", synth, "--inventory", inv,    "--prompt",
                          "Once", "-n",      "48",  "-o",          "json", NULL};
    int rc = run_plexus(args, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run -o json exited %d: %s", rc, errs ? errs : "");
    json_t *j = NULL;
    px_err err;
    px_assert_ok(px_json_parse(out, strlen(out), "run", NULL, &j, &err), &err);
    const char *text = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "results"), 0), "text"));
    assert_non_null(text);
    px_assert_contains(text, "\xef\xbf\xbd");
    json_decref(j);
    free(out);
    free(errs);
    free(inv);
    free(synth);
}

/* A plan written by hand without predictions: a supervised run says at
 * start that a fault will stop it (healing sizes its checks from them),
 * before any fault. */
static void test_run_warns_when_the_plan_cannot_size_healing(void **state)
{
    (void)state;
    char *synth = px_asprintf("%s/warn.gguf", px_test_tmpdir());
    char *plan_path = px_asprintf("%s/hand.json", px_test_tmpdir());
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    const char *mk[] = {"model",   "synth",    "--out",      synth,      "--dim",
                        "64",      "--hidden", "128",        "--layers", "2",
                        "--heads", "4",        "--kv-heads", "2",        "--vocab",
                        "300",     "--seed",   "1",          NULL};
    char *out = NULL, *errs = NULL;
    assert_int_equal(run_plexus(mk, &out, &errs), 0);
    free(out);
    free(errs);
    const char *doc = "{\"schema\": \"plexus.plan/1\", \"stages\": [{\"layers\": {\"first\": 0, "
                      "\"last\": 1}, \"devices\": [\"local.cpu0\"], \"backend\": \"cpu\"}]}";
    px_err err;
    px_assert_ok(px_write_file(plan_path, doc, strlen(doc), &err), &err);
    const char *args[] = {"run",    "--model",       synth,      "--inventory", inv,
                          "--plan", plan_path,       "--prompt", "Once",        "-n",
                          "4",      "--audit-every", "2",        NULL};
    run_plexus(args, &out, &errs);
    px_assert_contains(errs, "no predicted tpot_s and ttft_s");
    px_assert_contains(errs, "plexus plan --out");
    free(out);
    free(errs);
    free(inv);
    free(plan_path);
    free(synth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_refuses_a_malformed_inject_with_the_forms),
        cmocka_unit_test(test_run_refuses_an_inject_target_the_plan_lacks),
        cmocka_unit_test(test_run_without_inventory_says_healing_needs_one),
        cmocka_unit_test(test_supervised_run_without_faults_prints_the_same_text),
        cmocka_unit_test(test_healed_trace_replays_and_detects_edits),
        cmocka_unit_test(test_run_report_holds_text_that_is_not_utf8),
        cmocka_unit_test(test_run_warns_when_the_plan_cannot_size_healing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
