/*
 * A real server on 127.0.0.1: bad tokens are refused, malformed and
 * oversized requests get a 4xx with a message, and the client commands
 * report both clearly.
 */
#include "fleet_harness.h"

static fh_fleet fleet;

static int setup(void **state)
{
    (void)state;
    fh_fleet_start(&fleet, "security", 10);
    fh_start_agent(&fleet, "n1", NULL);
    const char *names[] = {"n1"};
    fh_wait_nodes_online(&fleet, names, 1, 20);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    return 0;
}

/* Sends a raw request and returns the HTTP status; *reply gets the body's
 * error text (static buffer). */
static long raw(const char *token, const char *method, const char *path, const char *body,
                size_t len, const char **error)
{
    static char text[512];
    px_fleet_client *c = fh_client(&fleet, token);
    long code = 0;
    px_err err;
    err.msg[0] = '\0';
    /* The caller judges the outcome by the HTTP code and the message. */
    (void)px_fleet_client_send(c, method, path, body, len, &code, NULL, &err);
    px_fleet_client_free(c);
    px_textf(text, sizeof text, "%s", err.msg);
    if (error)
        *error = text;
    return code;
}

static void test_missing_and_wrong_tokens_are_refused(void **state)
{
    (void)state;
    const char *e;
    assert_int_equal(raw(NULL, "GET", "/v1/jobs", NULL, 0, &e), 401);
    assert_int_equal(raw("wrong-token-0123456789abcdef", "GET", "/v1/nodes", NULL, 0, &e), 401);
    /* The cluster token is for agents only, and the API token for users. */
    assert_int_equal(raw(FH_CLUSTER_TOKEN, "GET", "/v1/jobs", NULL, 0, &e), 403);
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/agent/heartbeat", "{}", 2, &e), 403);
    /* The token never appears in a refusal. */
    assert_null(strstr(e, FH_USER_TOKEN));
    /* The health check needs no token. */
    assert_int_equal(raw(NULL, "GET", "/v1/health", NULL, 0, &e), 200);
    char *out = NULL, *err = NULL;
    char *wrong = px_asprintf("%s/wrong-token", fleet.dir);
    fh_write_private(wrong, "not-the-right-token-123456\n");
    assert_int_equal(fh_plexus(&out, &err, "nodes", "--token-file", wrong, NULL), 1);
    px_assert_contains(err, "401");
    assert_null(strstr(err, "not-the-right-token-123456"));
    free(out);
    free(err);
    free(wrong);
}

static void test_malformed_requests_get_400_with_the_place(void **state)
{
    (void)state;
    const char *e;
    const char *bad = "{\"command\": [\"/bin/true\"";
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/jobs", bad, strlen(bad), &e), 400);
    assert_true(strlen(e) > 20);
    const char *unknown = "{\"command\": [\"/bin/true\"], \"comand\": 1}";
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/jobs", unknown, strlen(unknown), &e), 400);
    px_assert_contains(e, "comand");
    const char *types = "{\"command\": [\"/bin/true\"], \"resources\": {\"gpus\": \"two\"}}";
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/jobs", types, strlen(types), &e), 400);
    px_assert_contains(e, "gpus");
    const char *empty = "{}";
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/jobs", empty, 2, &e), 400);
    const char *notobj = "[1, 2]";
    assert_int_equal(raw(FH_USER_TOKEN, "POST", "/v1/jobs", notobj, strlen(notobj), &e), 400);
    assert_int_equal(raw(FH_USER_TOKEN, "GET", "/v1/jobs/j-999999", NULL, 0, &e), 404);
    assert_int_equal(raw(FH_USER_TOKEN, "GET", "/v1/no-such-endpoint", NULL, 0, &e), 404);
    /* The client refuses bad usage before sending anything. */
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "submit", "--gpus", "many", "--", "/bin/true", NULL), 2);
    px_assert_contains(err, "--gpus");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "logs", "../../etc/passwd", NULL), 2);
    free(out);
    free(err);
}

static void test_oversized_requests_get_413(void **state)
{
    (void)state;
    size_t n = (size_t)2 << 20;
    char *big = malloc(n + 64);
    int off = snprintf(big, 64, "{\"name\": \"");
    memset(big + off, 'a', n);
    memcpy(big + off + n, "\"}", 3);
    const char *e;
    long code = raw(FH_USER_TOKEN, "POST", "/v1/jobs", big, strlen(big), &e);
    assert_int_equal(code, 413);
    free(big);
    /* Deep nesting is refused too. */
    px_strbuf deep = PX_STRBUF_INIT;
    px_strbuf_adds(&deep, "{\"command\": [\"/bin/true\"], \"x-deep\": ");
    for (int i = 0; i < 100; i++)
        px_strbuf_addch(&deep, '[');
    for (int i = 0; i < 100; i++)
        px_strbuf_addch(&deep, ']');
    px_strbuf_addch(&deep, '}');
    code = raw(FH_USER_TOKEN, "POST", "/v1/jobs", deep.buf, deep.len, &e);
    assert_true(code == 400 || code == 413);
    px_strbuf_release(&deep);
}

static void test_artifact_names_cannot_escape(void **state)
{
    (void)state;
    /* An agent upload under a traversing name is refused by the server. */
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sleep\", \"2\"]}");
    json_t *job = fh_wait_job(&fleet, id, "running", 20);
    long attempt = (long)json_integer_value(json_object_get(job, "attempt"));
    json_decref(job);
    /* With the node's own credential, so that the names are what is judged. */
    char cred_path[700], cred[200] = "", *text = NULL;
    size_t len;
    snprintf(cred_path, sizeof cred_path, "%s/work-n1/state/credential", fleet.dir);
    px_assert_ok(px_read_file(cred_path, 4096, &text, &len, NULL), (px_err *)NULL);
    assert_int_equal(sscanf(text, "%*s %*s %199s", cred), 1);
    free(text);
    const char *names[] = {"..%2F..%2Fescape", "%2Fetc%2Fpasswd", "a%00b"};
    for (size_t i = 0; i < PX_ARRAY_LEN(names); i++) {
        char path[256];
        snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/%s?attempt=%ld&rank=0", id,
                 names[i], attempt);
        const char *e;
        long code = raw(cred, "PUT", path, "x", 1, &e);
        if (code != 400)
            fail_msg("artifact name %s was answered %ld: %s", names[i], code, e);
    }
    job = fh_wait_job(&fleet, id, "succeeded,failed", 20);
    json_decref(job);
    free(id);
}

static void test_submit_options_become_the_job_spec(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    int rc =
        fh_plexus(&out, &err, "submit", "--name", "spec-check", "--cpus", "0.5", "--mem", "1GiB",
                  "--env", "GREETING=hello world", "--artifact", "out/a.txt", "--max-attempts", "2",
                  "-o", "json", "--", "/bin/sh", "-c", "echo $GREETING", NULL);
    if (rc != 0)
        fail_msg("submit failed (%d): %s %s", rc, out, err);
    json_t *reply = json_loads(out, 0, NULL);
    assert_non_null(reply);
    char *id = px_strdup(json_string_value(json_object_get(reply, "id")));
    json_decref(reply);
    free(out);
    free(err);
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    const json_t *spec = json_object_get(job, "spec");
    assert_string_equal(json_string_value(json_object_get(spec, "name")), "spec-check");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(spec, "env"), "GREETING")),
        "hello world");
    assert_int_equal(json_integer_value(json_object_get(spec, "max_attempts")), 2);
    assert_string_equal(json_string_value(json_array_get(json_object_get(spec, "artifacts"), 0)),
                        "out/a.txt");
    const json_t *cmd = json_object_get(spec, "command");
    assert_int_equal(json_array_size(cmd), 3);
    assert_string_equal(json_string_value(json_array_get(cmd, 2)), "echo $GREETING");
    json_decref(job);
    /* Every listing command speaks JSON with -o json. */
    const char *cmds[][3] = {{"nodes", NULL, NULL},
                             {"jobs", NULL, NULL},
                             {"jobs", id, NULL},
                             {"explain", id, NULL},
                             {"artifacts", id, NULL}};
    for (size_t i = 0; i < PX_ARRAY_LEN(cmds); i++) {
        rc = cmds[i][1] ? fh_plexus(&out, &err, cmds[i][0], cmds[i][1], "-o", "json", NULL)
                        : fh_plexus(&out, &err, cmds[i][0], "-o", "json", NULL);
        if (rc != 0)
            fail_msg("plexus %s -o json failed (%d): %s", cmds[i][0], rc, err);
        json_t *v = json_loads(out, 0, NULL);
        if (!v)
            fail_msg("plexus %s -o json printed no JSON:\n%s", cmds[i][0], out);
        json_decref(v);
        free(out);
        free(err);
    }
    assert_int_equal(fh_plexus(&out, &err, "logs", id, NULL), 0);
    assert_string_equal(out, "hello world\n");
    free(out);
    free(err);
    free(id);
}

static void test_submit_wait_timeout_names_the_state(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "--wait", "--timeout", "0.3", "--", "/bin/sleep", "5",
                       NULL);
    assert_int_equal(rc, 1);
    /* The state is printed from the reply while it is still held. */
    if (!strstr(err, "is still queued") && !strstr(err, "is still assigned") &&
        !strstr(err, "is still running"))
        fail_msg("submit --wait --timeout printed: %s", err);
    const char *id = strstr(out, "submitted ");
    assert_non_null(id);
    char job[32];
    assert_int_equal(sscanf(id, "submitted %31s", job), 1);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "cancel", job, NULL), 0);
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_and_wrong_tokens_are_refused),
        cmocka_unit_test(test_malformed_requests_get_400_with_the_place),
        cmocka_unit_test(test_oversized_requests_get_413),
        cmocka_unit_test(test_artifact_names_cannot_escape),
        cmocka_unit_test(test_submit_options_become_the_job_spec),
        cmocka_unit_test(test_submit_wait_timeout_names_the_state),
    };
    alarm(FH_SECONDS(90));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
