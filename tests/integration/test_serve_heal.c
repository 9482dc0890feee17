/* Healing while serving: plexus serve runs stories260K as the throughput
 * plan's stage workers on emu-small (this machine's cpu and two emulated
 * accelerators); a stage worker is killed while eight streams are being
 * generated.  Every stream completes with the tokens `plexus generate`
 * gives each prompt alone, no request fails, and the incident shows in
 * /health, /metrics and /incidents.  The same with the stage workers
 * started by a launcher on 127.0.0.2, joined over authenticated TCP.
 * Skipped without ../shared or the OpenAI client. */
#include "serve_harness.h"

#include "px_slowdown.h"

#include "plexus/heal.h"

#define N_NEW "48"

static const char *prompts[] = {"Once upon a time",  "The cat sat", "A big red ball",  "Lily",
                                "One day, a little", "The sun",     "Tom and his dog", "She"};

static char *generate_alone(const char *model, const char *prompt)
{
    const char *gen[] = {px_test_plexus_bin(),
                         "generate",
                         "--model",
                         model,
                         "--prompt",
                         prompt,
                         "-n",
                         N_NEW,
                         "--temp",
                         "0",
                         "-o",
                         "json",
                         NULL};
    char *out = NULL;
    assert_int_equal(px_test_run((char *const *)gen, 60, &out, NULL), 0);
    json_t *doc = sh_json(out);
    char *text = px_strdup(json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "results"), 0), "text")));
    json_decref(doc);
    free(out);
    return text;
}

/* transport: NULL for the executor's own workers, or an address for
 * workers started by a launcher there and joined over authenticated TCP. */
static void killed_stage_mid_stream(const char *transport)
{
    char *model = px_test_require_shared_model("stories260K.gguf");
    if (!sh_have_node_client()) {
        free(model);
        print_message("skipped: the openai client is not installed (scripts/install-deps)\n");
        skip();
    }
    char *inventory = px_test_source_path("data/scenarios/emu-small.json");
    /* Stage 1's worker dies once 60 tokens have been produced, with every
     * stream in the middle of its text. */
    const char *args[] = {"--model",     model,      "--inventory",
                          inventory,     "--inject", "kill:stage1@token60",
                          "--transport", transport,  NULL};
    if (!transport)
        args[6] = NULL;
    sh_server srv;
    sh_start(&srv, args);
    int st;
    char *h = sh_curl(&srv, "GET", "/health", NULL, true, &st, NULL);
    json_t *health = sh_json(h);
    const json_t *stages =
        json_object_get(json_array_get(json_object_get(health, "replicas"), 0), "stages");
    if (json_array_size(stages) < 2)
        fail_msg("the throughput plan on emu-small should run 2 stages or more:\n%s", h);
    json_decref(health);
    free(h);

    px_strbuf list = PX_STRBUF_INIT;
    for (size_t i = 0; i < PX_ARRAY_LEN(prompts); i++)
        px_strbuf_addf(&list, "%s\n", prompts[i]);
    const char *args_node[] = {"concurrent", "8", N_NEW, NULL};
    json_t *got = sh_node(&srv, args_node, list.buf);
    px_strbuf_release(&list);
    const json_t *res = json_object_get(got, "results");
    assert_int_equal(json_array_size(res), 8);
    for (size_t i = 0; i < 8; i++) {
        const json_t *r = json_array_get(res, i);
        char *alone = generate_alone(model, json_string_value(json_object_get(r, "prompt")));
        const char *text = json_string_value(json_object_get(r, "text"));
        if (strcmp(text, alone) != 0)
            fail_msg("stream %zu (%s) departs from the prompt alone:\n%s\n---\n%s", i,
                     json_string_value(json_object_get(r, "prompt")), text, alone);
        assert_string_equal(json_string_value(json_object_get(r, "finish")), "length");
        free(alone);
    }
    json_decref(got);

    /* The incident: the worker was lost, the engine moved on. */
    char *m = sh_curl(&srv, "GET", "/metrics", NULL, true, &st, NULL);
    assert_int_equal(st, 200);
    double incidents = sh_metric(m, "plexus_serve_incidents_total");
    double recoveries = sh_metric(m, "plexus_serve_recoveries_total");
    if (!(incidents >= 1) || !(recoveries >= 1))
        fail_msg("replica 0: %g incidents, %g recoveries", incidents, recoveries);
    /* Each step's time, part by part, for comparison with the plan. */
    if (!(sh_metric(m, "plexus_serve_timed_steps_total") > 0) ||
        !(sh_metric(m, "plexus_serve_stage_compute_seconds_total") > 0) ||
        !(sh_metric(m, "plexus_serve_executor_result_wait_seconds_total") > 0))
        fail_msg("replica 0's steps are not split into their parts:\n%s", m);
    px_assert_contains(m, "plexus_serve_hop_seconds_total{replica=\"0\",into=\"executor\"}");
    free(m);
    /* ...and its record says what happened and what was done.  It is
     * recorded once the new plan's canary has judged it, or once the
     * replica has nothing left to run: that may come after the last
     * stream ended, so /incidents is read until it lists it (10 s, scaled
     * like every wait of a slowed build). */
    json_t *doc = NULL, *first = NULL;
    for (int tries = 0;; tries++) {
        char *inc = sh_curl(&srv, "GET", "/incidents", NULL, true, &st, NULL);
        assert_int_equal(st, 200);
        doc = json_loads(inc, 0, NULL);
        first = json_array_get(json_object_get(doc, "data"), 0);
        if (first) {
            free(inc);
            break;
        }
        if (tries >= 100 * PX_TEST_SLOWDOWN)
            fail_msg("no incident in /incidents %d s after the streams ended: %s",
                     10 * PX_TEST_SLOWDOWN, inc);
        free(inc);
        json_decref(doc);
        usleep(100000);
    }
    assert_string_equal(json_string_value(json_object_get(first, "schema")), "plexus.incident/1");
    assert_int_equal(json_integer_value(json_object_get(first, "replica")), 0);
    assert_true(px_heal_incident_complete(first, NULL));
    json_decref(doc);
    h = sh_curl(&srv, "GET", "/health", NULL, true, &st, NULL);
    px_assert_contains(h, "\"status\":\"ok\"");
    free(h);
    assert_int_equal(sh_stop(&srv), 0);
    free(inventory);
    free(model);
}

static void test_killed_stage_mid_stream_keeps_every_stream(void **state)
{
    (void)state;
    killed_stage_mid_stream(NULL);
}

static void test_killed_launched_stage_mid_stream_keeps_every_stream(void **state)
{
    (void)state;
    killed_stage_mid_stream("tcp:127.0.0.2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_stage_mid_stream_keeps_every_stream),
        cmocka_unit_test(test_killed_launched_stage_mid_stream_keeps_every_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
