/* plexus serve in one process on stories260K, driven with curl and with
 * the official OpenAI client (node): the routes, the API key checked
 * before the body, errors in OpenAI's shape, completions and chat streamed
 * and not (the same text as `plexus generate`), stop strings, logprobs,
 * seeds, concurrent streams that match the same requests alone, a client
 * that goes away, 429 with Retry-After when the queue is full, and the
 * metrics.  Skipped without ../shared; the OpenAI client's tests skip
 * without tests/node/node_modules (scripts/install-deps). */
#include "serve_harness.h"

#define PROMPT "Once upon a time"

static char *model;
static sh_server srv;
static char *reference; /* `plexus generate` greedy text, 24 tokens */

static int setup(void **state)
{
    (void)state;
    model = px_test_shared_model("stories260K.gguf");
    if (!model)
        return 0;
    const char *args[] = {"--model",         model,    "--threads",    "1",       "--max-seqs", "8",
                          "--chat-template", "chatml", "--model-name", "stories", NULL};
    sh_start(&srv, args);
    const char *gen[] = {px_test_plexus_bin(),
                         "generate",
                         "--model",
                         model,
                         "--prompt",
                         PROMPT,
                         "-n",
                         "24",
                         "--temp",
                         "0",
                         "-o",
                         "json",
                         NULL};
    char *out = NULL;
    assert_int_equal(px_test_run((char *const *)gen, 60, &out, NULL), 0);
    json_t *doc = sh_json(out);
    reference = px_strdup(json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "results"), 0), "text")));
    json_decref(doc);
    free(out);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (model)
        assert_int_equal(sh_stop(&srv), 0);
    free(model);
    free(reference);
    return 0;
}

#define REQUIRE_MODEL()                                                                 \
    do {                                                                                \
        if (!model) {                                                                   \
            print_message("skipped: ../shared/models/stories260K.gguf is not there\n"); \
            skip();                                                                     \
        }                                                                               \
    } while (0)

static void expect_error(const char *body, int status, int want_status, const char *type,
                         const char *needle)
{
    if (status != want_status)
        fail_msg("status %d, expected %d:\n%s", status, want_status, body);
    json_t *v = sh_json(body);
    const json_t *e = json_object_get(v, "error");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    px_assert_contains(json_string_value(json_object_get(e, "message")), needle);
    json_decref(v);
}

static void test_routes_key_and_errors(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    int st;
    char *b = sh_curl(&srv, "GET", "/v1/models", NULL, true, &st, NULL);
    assert_int_equal(st, 200);
    json_t *v = sh_json(b);
    assert_string_equal(sh_str(json_array_get(json_object_get(v, "data"), 0), "id"), "stories");
    json_decref(v);
    free(b);
    /* No key, a wrong key: 401 before the body is read. */
    b = sh_curl(&srv, "POST", "/v1/completions", "{\"prompt\": \"x\"}", false, &st, NULL);
    expect_error(b, st, 401, "invalid_request_error", "API key");
    free(b);
    const char *wrong[] = {"-H", "Authorization: Bearer not-the-key", NULL};
    b = sh_curl(&srv, "GET", "/v1/models", NULL, false, &st, wrong);
    assert_int_equal(st, 401);
    free(b);
    /* /health answers without the key, and says more with it. */
    b = sh_curl(&srv, "GET", "/health", NULL, false, &st, NULL);
    assert_int_equal(st, 200);
    px_assert_contains(b, "\"ok\"");
    free(b);
    b = sh_curl(&srv, "GET", "/health", NULL, true, &st, NULL);
    assert_int_equal(st, 200);
    px_assert_contains(b, "\"replicas\"");
    /* Each replica says how many sequences it runs at once (--max-seqs 8). */
    px_assert_contains(b, "\"max_seqs\":8");
    free(b);
    /* Errors in OpenAI's shape. */
    b = sh_curl(&srv, "POST", "/v1/completions", "{\"prompt\": ", true, &st, NULL);
    expect_error(b, st, 400, "invalid_request_error", "");
    free(b);
    b = sh_curl(&srv, "POST", "/v1/completions", "{\"model\": \"gpt-4\", \"prompt\": \"x\"}", true,
                &st, NULL);
    expect_error(b, st, 404, "invalid_request_error", "stories");
    free(b);
    b = sh_curl(&srv, "POST", "/v1/completions", "{\"prompt\": \"x\", \"n\": 2}", true, &st, NULL);
    expect_error(b, st, 400, "invalid_request_error", "n");
    free(b);
    b = sh_curl(&srv, "GET", "/v1/nothing", NULL, true, &st, NULL);
    expect_error(b, st, 404, "invalid_request_error", "no route");
    free(b);
    b = sh_curl(&srv, "GET", "/v1/completions", NULL, true, &st, NULL);
    assert_int_equal(st, 405);
    free(b);
    /* A prompt longer than the context (512 positions). */
    px_strbuf big = PX_STRBUF_INIT;
    px_strbuf_adds(&big, "{\"prompt\": \"");
    for (int i = 0; i < 700; i++)
        px_strbuf_adds(&big, "cat ");
    px_strbuf_adds(&big, "\"}");
    b = sh_curl(&srv, "POST", "/v1/completions", big.buf, true, &st, NULL);
    expect_error(b, st, 400, "invalid_request_error", "context");
    free(b);
    px_strbuf_release(&big);
    /* A body over the server's bound (8 MiB) is refused before it is read
     * whole. */
    char *huge_path = px_asprintf("%s/huge.json", px_test_tmpdir());
    FILE *f = fopen(huge_path, "w");
    fputs("{\"prompt\": \"", f);
    for (int i = 0; i < (9 << 20) / 64; i++)
        fputs("0123456789012345678901234567890123456789012345678901234567890123", f);
    fputs("\"}", f);
    fclose(f);
    char *at = px_asprintf("@%s", huge_path);
    b = sh_curl(&srv, "POST", "/v1/completions", at, true, &st, NULL);
    assert_int_equal(st, 413);
    free(b);
    free(at);
    free(huge_path);
}

static void test_completion_matches_generate_streamed_or_not(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    int st;
    char *b = sh_curl(&srv, "POST", "/v1/completions",
                      "{\"model\": \"stories\", \"prompt\": \"" PROMPT
                      "\", \"max_tokens\": 24, \"temperature\": 0}",
                      true, &st, NULL);
    assert_int_equal(st, 200);
    json_t *v = sh_json(b);
    const json_t *c0 = json_array_get(json_object_get(v, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), reference);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    assert_string_equal(sh_str(v, "object"), "text_completion");
    assert_int_equal(sh_int(v, "usage", "completion_tokens"), 24);
    assert_int_equal(sh_int(v, "usage", "prompt_tokens"), 5);
    assert_int_equal(sh_int(v, "usage", "total_tokens"), 29);
    json_decref(v);
    free(b);
    /* Streamed: server-sent events, the same text, then [DONE]. */
    b = sh_curl(&srv, "POST", "/v1/completions",
                "{\"prompt\": \"" PROMPT "\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": "
                "true, \"stream_options\": {\"include_usage\": true}}",
                true, &st, NULL);
    assert_int_equal(st, 200);
    px_strbuf text = PX_STRBUF_INIT;
    int n_events = 0;
    bool done = false, usage = false;
    for (char *line = b, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        n_events++;
        if (!strcmp(line + 6, "[DONE]")) {
            done = true;
            continue;
        }
        assert_false(done);
        json_t *ev = sh_json(line + 6);
        const json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        if (ch)
            px_strbuf_adds(&text, json_string_value(json_object_get(ch, "text")));
        if (json_is_object(json_object_get(ev, "usage")))
            usage = sh_int(ev, "usage", "completion_tokens") == 24;
        json_decref(ev);
    }
    assert_true(done);
    assert_true(usage);
    assert_true(n_events > 5);
    assert_string_equal(text.buf, reference);
    px_strbuf_release(&text);
    free(b);
}

static double wakeups(void)
{
    int st;
    char *m = sh_curl(&srv, "GET", "/metrics", NULL, true, &st, NULL);
    assert_int_equal(st, 200);
    double v = sh_metric(m, "plexus_serve_http_wakeups_total");
    free(m);
    return v;
}

/* A whole response is sent when its request ends: the engine wakes its
 * HTTP thread once, not once per token; a stream is woken per token. */
static void test_whole_response_wakes_its_thread_once(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    int st;
    double before = wakeups();
    char *b = sh_curl(&srv, "POST", "/v1/completions",
                      "{\"prompt\": \"" PROMPT "\", \"max_tokens\": 24, \"temperature\": 0}", true,
                      &st, NULL);
    assert_int_equal(st, 200);
    free(b);
    double whole = wakeups() - before;
    if (whole != 1)
        fail_msg("a non-streamed request of 24 tokens woke its thread %g times, expected 1", whole);
    before = wakeups();
    b = sh_curl(&srv, "POST", "/v1/completions",
                "{\"prompt\": \"" PROMPT "\", \"max_tokens\": 24, \"temperature\": 0, "
                "\"stream\": true}",
                true, &st, NULL);
    assert_int_equal(st, 200);
    free(b);
    double streamed = wakeups() - before;
    if (streamed < 24)
        fail_msg("a streamed request of 24 tokens woke its thread %g times, expected >= 24",
                 streamed);
}

static void test_openai_client_completions_and_chat(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    if (!sh_have_node_client()) {
        print_message("skipped: the openai client is not installed (scripts/install-deps)\n");
        skip();
    }
    const char *args[] = {"basic", PROMPT, NULL};
    json_t *v = sh_node(&srv, args, NULL);
    assert_string_equal(json_string_value(json_array_get(json_object_get(v, "models"), 0)),
                        "stories");
    assert_string_equal(sh_str(v, "completion.text"), reference);
    assert_string_equal(sh_str(v, "completion.finish"), "length");
    assert_int_equal(sh_int(json_object_get(v, "completion"), "usage", "completion_tokens"), 24);
    assert_int_equal(sh_int(v, "completion", "logprobs_tokens"), 24);
    assert_int_equal(sh_int(v, "completion", "top_logprobs"), 3);
    assert_string_equal(sh_str(v, "completion_stream.text"), reference);
    assert_int_equal(sh_int(json_object_get(v, "completion_stream"), "usage", "total_tokens"), 29);
    assert_string_equal(sh_str(v, "chat.role"), "assistant");
    assert_string_equal(sh_str(v, "chat.object"), "chat.completion");
    assert_int_equal(sh_int(v, "chat", "logprobs"), 16);
    assert_string_equal(sh_str(v, "chat_stream.text"), sh_str(v, "chat.text"));
    assert_string_equal(sh_str(v, "chat_stream.role"), "assistant");
    /* The stop string cut the text before it. */
    const char *stop = sh_str(v, "stop.stop"), *cut = sh_str(v, "stop.text");
    assert_string_equal(sh_str(v, "stop.finish"), "stop");
    assert_null(strstr(cut, stop));
    assert_true(!strncmp(reference, cut, strlen(cut)));
    /* The same seed samples the same text. */
    const json_t *seeded = json_object_get(v, "seeded");
    assert_string_equal(json_string_value(json_array_get(seeded, 0)),
                        json_string_value(json_array_get(seeded, 1)));
    assert_int_equal(sh_int(v, "wrong_model", "status"), 404);
    json_decref(v);
}

static void test_concurrent_streams_match_each_alone(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    if (!sh_have_node_client())
        skip();
    const char *prompts = "Once upon a time\nThe cat sat\nA big red ball\nLily\nOne day, a "
                          "little\nThe sun\nTom and his dog\nShe";
    const char *alone[] = {"concurrent", "8", "32", "serial", NULL};
    const char *many[] = {"concurrent", "8", "32", NULL};
    json_t *got = sh_node(&srv, many, prompts);
    json_t *ref = sh_node(&srv, alone, prompts);
    const json_t *res = json_object_get(got, "results"), *refs = json_object_get(ref, "results");
    assert_int_equal(json_array_size(res), 8);
    assert_int_equal(json_array_size(refs), 8);
    for (size_t i = 0; i < 8; i++) {
        const json_t *r = json_array_get(res, i), *r1 = json_array_get(refs, i);
        assert_string_equal(json_string_value(json_object_get(r, "prompt")),
                            json_string_value(json_object_get(r1, "prompt")));
        assert_string_equal(json_string_value(json_object_get(r, "text")),
                            json_string_value(json_object_get(r1, "text")));
        assert_int_equal(sh_int(r, "usage", "completion_tokens"), 32);
    }
    json_decref(ref);
    json_decref(got);
}

/* A server whose one stage runs on an emulated device three hundred times
 * slower than this cpu: requests last seconds, so a client can leave in
 * the middle and a queue can fill. */
static void start_slow(sh_server *slow, const char *max_seqs, const char *queue)
{
    char *plan = px_asprintf("%s/slow-plan.json", px_test_tmpdir());
    const char *doc = "{\"schema\": \"plexus.plan/1\", \"stages\": [{\"layers\": {\"first\": 0, "
                      "\"last\": 4}, \"devices\": [\"local.slow\"], \"backend\": \"emu\", "
                      "\"emulated\": true, \"embedding\": true, \"head\": true, \"emu\": "
                      "{\"compute_slowdown\": 300, \"memory_slowdown\": 300}}]}";
    px_err err;
    px_assert_ok(px_write_file(plan, doc, strlen(doc), &err), &err);
    const char *args[] = {"--model", model,     "--plan", plan, "--max-seqs",
                          max_seqs,  "--queue", queue,    NULL};
    sh_start(slow, args);
    free(plan);
}

static void test_client_that_goes_away_frees_its_sequence(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    if (!sh_have_node_client())
        skip();
    sh_server slow;
    start_slow(&slow, "2", "4");
    const char *args[] = {"cancel", NULL};
    json_t *v = sh_node(&slow, args, NULL);
    assert_true(json_is_true(json_object_get(v, "aborted")));
    json_decref(v);
    /* The sequence leaves the running batch at the next step. */
    int st;
    double running = 1, disconnects = 0;
    for (int i = 0; i < 100 && (running != 0 || disconnects < 1); i++) {
        char *m = sh_curl(&slow, "GET", "/metrics", NULL, true, &st, NULL);
        assert_int_equal(st, 200);
        running = sh_metric(m, "plexus_serve_running");
        disconnects = sh_metric(m, "plexus_serve_disconnects_total");
        free(m);
        if (running != 0 || disconnects < 1)
            usleep(50000);
    }
    assert_true(running == 0);
    assert_true(disconnects >= 1);
    assert_int_equal(sh_stop(&slow), 0);
}

static void test_full_queue_answers_429_with_retry_after(void **state)
{
    (void)state;
    REQUIRE_MODEL();
    if (!sh_have_node_client())
        skip();
    sh_server small;
    start_slow(&small, "1", "2");
    /* Six long requests at once; the client gives up after two seconds
     * on those that were taken in. */
    const char *args[] = {"overload", "6", "100", "2000", NULL};
    json_t *v = sh_node(&small, args, NULL);
    const json_t *res = json_object_get(v, "results");
    int taken = 0, busy = 0;
    for (size_t i = 0; i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        const json_t *status = json_object_get(r, "status");
        if (json_integer_value(status) == 429) {
            busy++;
            assert_string_equal(json_string_value(json_object_get(r, "retry_after")), "1");
        } else if (json_integer_value(status) == 200 || json_is_string(status)) {
            taken++;
        }
    }
    /* One runs, one or two wait, the rest are turned away. */
    assert_true(taken >= 2 && taken <= 3);
    assert_int_equal(taken + busy, 6);
    json_decref(v);
    int st;
    char *m = sh_curl(&small, "GET", "/metrics", NULL, true, &st, NULL);
    assert_true(sh_metric(m, "plexus_serve_rejected_total") >= 1);
    px_assert_contains(m, "plexus_serve_time_to_first_token_seconds_bucket");
    px_assert_contains(m, "plexus_serve_kv_blocks_free{replica=\"0\"}");
    /* The incident counter counts what the healing loop opened, and says
     * so: their records appear only when they close. */
    px_assert_contains(m, "# HELP plexus_serve_incidents_total incidents the healing loop opened");
    free(m);
    assert_int_equal(sh_stop(&small), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes_key_and_errors),
        cmocka_unit_test(test_completion_matches_generate_streamed_or_not),
        cmocka_unit_test(test_whole_response_wakes_its_thread_once),
        cmocka_unit_test(test_openai_client_completions_and_chat),
        cmocka_unit_test(test_concurrent_streams_match_each_alone),
        cmocka_unit_test(test_client_that_goes_away_frees_its_sequence),
        cmocka_unit_test(test_full_queue_answers_429_with_retry_after),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
