/*
 * What a deployment's front end reports, on a real server with real
 * agents on 127.0.0.1: a deployment planned over two nodes; a node of its
 * plan reports serving figures with its own credential through
 * px_fleet_report_observation, the owner reports too, and the owner reads
 * them back with the plan's predictions beside them; a node outside the
 * plan, another user and hostile bodies are refused with reasons; a
 * plexus.incident/1 record is kept and an incomplete one refused; the
 * records go when the deployment does.
 */
#include "fleet_harness.h"

#define SMALL_GPU(id)                                                                        \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"tiny\", " \
    "\"backend\": \"emu\", \"compute\": {\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": "   \
    "\"hbm\", \"kind\": \"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"

#define ROGUE_CRED "rogue-node-credential-for-reports-0123456789"

static char last_error[512];

/* Calls the API with a token and a body (text, sent as is); returns the
 * HTTP status, *reply owned. */
static long call(fh_fleet *f, const char *token, const char *method, const char *path,
                 const char *body, json_t **reply)
{
    px_fleet_client *c = fh_client(f, token);
    long status = 0;
    json_t *r = NULL;
    px_err err;
    px_err_clear(&err);
    last_error[0] = '\0';
    if (px_fleet_client_send(c, method, path, body, body ? strlen(body) : 0, &status, &r, &err) !=
        PX_OK)
        px_strlcpy(last_error, err.msg, sizeof last_error);
    px_fleet_client_free(c);
    if (reply)
        *reply = r;
    else
        json_decref(r);
    return status;
}

static void refused(fh_fleet *f, const char *token, const char *method, const char *path,
                    const char *body, long status, const char *needle)
{
    long got = call(f, token, method, path, body, NULL);
    if (got != status)
        fail_msg("%s %s %.200s: expected %ld, got %ld: %s", method, path, body ? body : "", status,
                 got, last_error);
    px_assert_contains(last_error, needle);
}

static char *node_credential(fh_fleet *f, const char *node)
{
    char path[700], cred[200] = "";
    snprintf(path, sizeof path, "%s/work-%s/state/credential", f->dir, node);
    char *text = NULL;
    size_t len;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 16, &text, &len, &err), &err);
    assert_int_equal(sscanf(text, "%*s %*s %199s", cred), 1);
    free(text);
    return px_strdup(cred);
}

static void deploy_chat(fh_fleet *f, const char *model)
{
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "deploy", "--model", model, "--name", "chat", "--policy",
                       "llamacpp", NULL);
    if (rc != 0) {
        fh_print_log(f->server.log);
        fail_msg("plexus deploy: exit %d: %s%s", rc, out, err);
    }
    free(out);
    free(err);
}

static void test_front_end_reports_observations_and_incidents(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    fh_fleet f = {0};
    fh_fleet_start(&f, "reports", 10);
    char *a = fh_inventory(&f, "n1", SMALL_GPU("gpu0"), "");
    char *b = fh_inventory(&f, "n2", SMALL_GPU("gpu0"), "");
    fh_start_agent(&f, "n1", a);
    fh_start_agent(&f, "n2", b);
    free(a);
    free(b);
    const char *names[] = {"n1", "n2"};
    fh_wait_nodes_online(&f, names, 2, 30);
    deploy_chat(&f, model);
    json_t *d = fh_api(&f, "GET", "/v1/deployments/chat", NULL);
    assert_int_equal(json_array_size(json_object_get(d, "nodes")), 2);
    json_decref(d);

    /* A node of the plan reports with its own credential. */
    char *cred = node_credential(&f, "n1");
    px_fleet_client *node = fh_client(&f, cred);
    json_t *obs = json_pack(
        "{s:f, s:{s:f, s:f}, s:{s:f, s:f}, s:i, s:i, s:i, s:f, s:[{s:i, s:{s:f, s:f}}, {s:i, "
        "s:{s:f}}]}",
        "tokens_per_s", 412.5, "ttft_s", "p50", 0.081, "p99", 0.19, "tpot_s", "p50", 0.0121, "p99",
        0.0188, "running", 6, "queued", 2, "requests", 37, "window_s", 5.0, "stages", "stage", 0,
        "step_s", "p50", 0.0051, "p99", 0.0066, "stage", 1, "step_s", "p50", 0.0058);
    int64_t seq = 0;
    px_err err;
    px_assert_ok(px_fleet_report_observation(node, "chat", obs, &seq, &err), &err);
    assert_int_equal(seq, 1);
    /* A refusal comes back with the server's reason. */
    json_object_set_new(obs, "tokens_per_sec", json_real(1.0));
    assert_int_equal(px_fleet_report_observation(node, "chat", obs, &seq, &err), PX_EINVAL);
    px_assert_contains(err.msg, "unknown member \"tokens_per_sec\"");
    json_decref(obs);
    json_t *empty = json_object();
    assert_int_equal(px_fleet_report_observation(node, "nope", empty, &seq, &err), PX_ENOTFOUND);
    json_decref(empty);
    /* Nodes report; they do not read. */
    refused(&f, cred, "GET", "/v1/deployments/chat/observations", NULL, 403, "owner's token");
    refused(&f, cred, "GET", "/v1/deployments/chat", NULL, 403, "user's token");
    px_fleet_client_free(node);

    /* The owner reports too. */
    json_t *r = NULL;
    assert_int_equal(call(&f, FH_USER_TOKEN, "POST", "/v1/deployments/chat/observations",
                          "{\"tokens_per_s\": 398, \"tpot_s\": {\"p50\": 0.0125}}", &r),
                     201);
    assert_int_equal(json_integer_value(json_object_get(r, "seq")), 2);
    json_decref(r);

    /* Someone else: another user, a node the plan does not use. */
    const char *one = "{\"tokens_per_s\": 1}";
    refused(&f, FH_OTHER_TOKEN, "POST", "/v1/deployments/chat/observations", one, 404,
            "no deployment");
    refused(&f, FH_OTHER_TOKEN, "GET", "/v1/deployments/chat/observations", NULL, 404,
            "no deployment");
    assert_int_equal(call(&f, FH_CLUSTER_TOKEN, "POST", "/v1/agent/join",
                          "{\"name\": \"rogue\", \"cpus\": 1, \"credential\": \"" ROGUE_CRED "\"}",
                          NULL),
                     200);
    refused(&f, ROGUE_CRED, "POST", "/v1/deployments/chat/observations", one, 404, "no deployment");
    refused(&f, NULL, "POST", "/v1/deployments/chat/observations", one, 401, "missing token");

    /* Hostile bodies, each refused with the member and the fix. */
    const char *path = "/v1/deployments/chat/observations";
    refused(&f, FH_USER_TOKEN, "POST", path, "{}", 400, "no figure");
    refused(&f, FH_USER_TOKEN, "POST", path, "[1]", 400, "expected a JSON object");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"tokens_per_s\": -1}", 400, "tokens_per_s");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"tokens_per_s\": \"fast\"}", 400, "got a string");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"tpot_s\": {\"p50\": 0.02, \"p99\": 0.01}}", 400,
            "below p50");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"ttft_s\": {\"p99\": 0.01}}", 400,
            "\"p50\" is missing");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"running\": 1.5}", 400, "whole number");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"stages\": [{\"stage\": 9999, \"step_s\": {}}]}",
            400, "stages[0].stage");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"stages\": {}}", 400, "stages");
    refused(&f, FH_USER_TOKEN, "POST", path, "{\"tokens_per_s\": 1", 400, "request body");
    char *big = malloc(20000);
    memset(big, ' ', 19999);
    memcpy(big, "{\"tokens_per_s\": 1", 18);
    big[19998] = '}';
    big[19999] = '\0';
    refused(&f, FH_USER_TOKEN, "POST", path, big, 413, "over the limit");
    free(big);
    refused(&f, FH_USER_TOKEN, "PUT", path, one, 405, "GET or POST");
    refused(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat/metrics", NULL, 404, "no deployment");
    refused(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat/observations?after=x", NULL, 400,
            "?after=x");

    /* The owner reads them back, oldest first, with the plan's
     * predictions to hold them against. */
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    json_t *list = json_object_get(r, "observations");
    assert_int_equal(json_array_size(list), 2);
    json_t *first = json_array_get(list, 0);
    assert_int_equal(json_integer_value(json_object_get(first, "seq")), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(first, "reporter"), "node")), "n1");
    const json_t *o1 = json_object_get(first, "observation");
    assert_true(json_number_value(json_object_get(o1, "tokens_per_s")) == 412.5);
    assert_int_equal(json_array_size(json_object_get(o1, "stages")), 2);
    assert_true(json_number_value(json_object_get(first, "at")) > 1.7e9);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(list, 1), "reporter"), "user")),
                        "tester");
    const json_t *pred = json_object_get(r, "predicted");
    assert_int_equal(json_array_size(json_object_get(pred, "stages")), 2);
    assert_true(json_number_value(json_object_get(
                    json_object_get(json_array_get(json_object_get(pred, "stages"), 1), "step_s"),
                    "p50")) > 0);
    json_decref(r);
    assert_int_equal(
        call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat/observations?after=1", NULL, &r), 200);
    assert_int_equal(json_array_size(json_object_get(r, "observations")), 1);
    json_decref(r);

    /* Incidents: a complete plexus.incident/1 record is kept; one that
     * misses a member is refused naming it. */
    char *incident = NULL;
    size_t len;
    px_assert_ok(px_read_file(PX_SOURCE_DIR "/tests/data/fleet/incident-recovery.json", 1 << 20,
                              &incident, &len, &err),
                 &err);
    assert_int_equal(call(&f, cred, "POST", "/v1/deployments/chat/incidents", incident, &r), 201);
    json_decref(r);
    json_t *broken = json_loads(incident, 0, NULL);
    json_object_del(json_array_get(json_object_get(broken, "candidates"), 1), "reject_reason");
    char *text = json_dumps(broken, 0);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments/chat/incidents", text, 400,
            "/candidates/1/reject_reason");
    free(text);
    json_decref(broken);
    free(incident);
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat/incidents", NULL, &r),
                     200);
    list = json_object_get(r, "incidents");
    assert_int_equal(json_array_size(list), 1);
    const json_t *inc = json_object_get(json_array_get(list, 0), "incident");
    assert_string_equal(json_string_value(json_object_get(inc, "schema")), "plexus.incident/1");
    assert_true(json_number_value(json_object_get(inc, "rto_s")) == 0.9);
    json_decref(r);

    /* The summary says how far the reports go (the dashboard fetches on a
     * change). */
    d = fh_api(&f, "GET", "/v1/deployments", NULL);
    const json_t *rep =
        json_object_get(json_array_get(json_object_get(d, "deployments"), 0), "reported");
    assert_int_equal(json_integer_value(json_object_get(rep, "observations")), 2);
    assert_int_equal(json_integer_value(json_object_get(rep, "incidents")), 1);
    json_decref(d);

    /* Undeployed, its records go: the name deployed again starts afresh. */
    assert_int_equal(call(&f, FH_USER_TOKEN, "DELETE", "/v1/deployments/chat", NULL, NULL), 200);
    refused(&f, FH_USER_TOKEN, "GET", path, NULL, 404, "no deployment");
    deploy_chat(&f, model);
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    assert_int_equal(json_array_size(json_object_get(r, "observations")), 0);
    json_decref(r);

    free(cred);
    free(model);
    fh_fleet_stop(&f);
}

int main(void)
{
    fh_install_cleanup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_front_end_reports_observations_and_incidents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
