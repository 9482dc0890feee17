/*
 * Deployments on a real server with real agents on 127.0.0.1 (emulated
 * GPU inventories): `plexus deploy` uploads the tiny model and the server
 * plans it over the online nodes' devices, keeping the planner's report
 * and the node of each stage; `plexus deployments`, `plexus explain NAME`
 * and `plexus undeploy NAME`; a taken name, hostile requests, another
 * user's view and a restart of the server.
 */
#include "fleet_harness.h"

/* An emulated accelerator; llama.cpp's split (the llamacpp policy) puts
 * layers on every device in proportion to its memory, so two nodes give
 * a plan of two stages, one on each. */
#define SMALL_GPU(id)                                                                        \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"tiny\", " \
    "\"backend\": \"emu\", \"compute\": {\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": "   \
    "\"hbm\", \"kind\": \"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"

/* The server's message of the last refused call. */
static char last_error[512];

/* Calls the API with a token; returns the HTTP status, *reply owned. */
static long call(fh_fleet *f, const char *token, const char *method, const char *path,
                 const char *body_text, json_t **reply)
{
    json_t *body = body_text ? json_loads(body_text, 0, NULL) : NULL;
    if (body_text && !body)
        fail_msg("bad JSON in the test: %s", body_text);
    px_fleet_client *c = fh_client(f, token);
    long status = 0;
    json_t *r = NULL;
    px_err err;
    px_err_clear(&err);
    if (px_fleet_client_call(c, method, path, body, &status, &r, &err) != PX_OK)
        px_strlcpy(last_error, err.msg, sizeof last_error);
    px_fleet_client_free(c);
    json_decref(body);
    if (reply)
        *reply = r;
    else
        json_decref(r);
    return status;
}

/* The request is refused with status and a message holding needle. */
static void refused(fh_fleet *f, const char *token, const char *method, const char *path,
                    const char *body, long status, const char *needle)
{
    long got = call(f, token, method, path, body, NULL);
    if (got != status)
        fail_msg("%s %s %s: expected %ld, got %ld: %s", method, path, body ? body : "", status, got,
                 last_error);
    px_assert_contains(last_error, needle);
}

static void test_deploy_plans_lists_explains_and_undeploys(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    fh_fleet f = {0};
    fh_fleet_start(&f, "deploy", 10);
    char *a = fh_inventory(&f, "n1", SMALL_GPU("gpu0"), "");
    char *b = fh_inventory(&f, "n2", SMALL_GPU("gpu0"), "");
    fh_start_agent(&f, "n1", a);
    fh_start_agent(&f, "n2", b);
    free(a);
    free(b);
    const char *names[] = {"n1", "n2"};
    fh_wait_nodes_online(&f, names, 2, 30);

    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "deploy", "--model", model, "--name", "chat", "--objective",
                       "throughput", "--policy", "llamacpp", NULL);
    if (rc != 0) {
        fh_print_log(f.server.log);
        fail_msg("plexus deploy: exit %d: %s%s", rc, out, err);
    }
    px_assert_contains(out, "deployment chat planned: 2 stages on 2 nodes, 1 replica");
    px_assert_contains(out, "policy llamacpp");
    free(out);
    free(err);

    /* The record: the plan document, its report, a node for each stage. */
    json_t *d = NULL;
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat", NULL, &d), 200);
    const json_t *plan = json_object_get(d, "plan");
    assert_string_equal(json_string_value(json_object_get(plan, "status")), "planned");
    assert_string_equal(json_string_value(json_object_get(json_object_get(plan, "plan"), "schema")),
                        "plexus.plan/1");
    assert_non_null(json_string_value(json_object_get(plan, "report")));
    assert_string_equal(json_string_value(json_object_get(d, "owner")), "tester");
    assert_string_equal(json_string_value(json_object_get(json_object_get(d, "spec"), "objective")),
                        "throughput");
    const json_t *assignment = json_object_get(plan, "assignment");
    assert_int_equal(json_array_size(assignment), 2);
    size_t i;
    json_t *st;
    json_array_foreach(assignment, i, st)
    {
        const char *node = json_string_value(json_object_get(st, "node"));
        assert_non_null(node);
        assert_true(!strcmp(node, "n1") || !strcmp(node, "n2"));
    }
    assert_string_not_equal(
        json_string_value(json_object_get(json_array_get(assignment, 0), "node")),
        json_string_value(json_object_get(json_array_get(assignment, 1), "node")));
    assert_int_equal(json_array_size(json_object_get(d, "nodes")), 2);
    char *digest = px_strdup(json_string_value(json_object_get(d, "model")));
    json_decref(d);

    assert_int_equal(fh_plexus(&out, &err, "deployments", NULL), 0);
    px_assert_contains(out, "chat");
    px_assert_contains(out, "planned");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat", NULL), 0);
    px_assert_contains(out, "deployment chat, state planned, owner tester");
    px_assert_contains(out, "replica 0 stage 1");
    px_assert_contains(out, "n2");
    px_assert_contains(out, "incidents: none");
    free(out);
    free(err);

    /* A taken name; another user sees nothing of it. */
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", digest, "--name", "chat", NULL), 1);
    px_assert_contains(err, "exists");
    free(out);
    free(err);
    refused(&f, FH_OTHER_TOKEN, "GET", "/v1/deployments/chat", NULL, 404, "no deployment");
    refused(&f, FH_OTHER_TOKEN, "DELETE", "/v1/deployments/chat", NULL, 404, "no deployment");
    json_t *list = NULL;
    assert_int_equal(call(&f, FH_OTHER_TOKEN, "GET", "/v1/deployments", NULL, &list), 200);
    assert_int_equal(json_array_size(json_object_get(list, "deployments")), 0);
    json_decref(list);
    assert_int_equal(call(&f, FH_ADMIN_TOKEN, "GET", "/v1/deployments/chat", NULL, NULL), 200);

    /* Hostile and impossible requests, each refused with its reason. */
    char body[512];
    snprintf(body, sizeof body, "{\"name\": \"j-000001\", \"model\": \"%s\"}", digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 400, "job id");
    snprintf(body, sizeof body, "{\"name\": \"x\", \"model\": \"%s\", \"gpus\": 2}", digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 400, "unknown member \"gpus\"");
    snprintf(body, sizeof body, "{\"name\": \"x\", \"model\": \"%s\", \"replicas\": 0}", digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 400, "replicas");
    snprintf(body, sizeof body, "{\"name\": \"x\", \"model\": \"%s\", \"objective\": \"fast\"}",
             digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 400, "objective");
    snprintf(body, sizeof body, "{\"name\": \"x\", \"model\": \"%s\", \"contract\": \"loose\"}",
             digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 400, "contract");
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments",
            "{\"name\": \"x\", \"model\": \"../etc\"}", 400, "SHA-256");
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments",
            "{\"name\": \"x\", \"model\": "
            "\"00000000000000000000000000000000000000000000000000000000000000ff\"}",
            409, "not on the server");
    snprintf(body, sizeof body, "{\"name\": \"x\", \"model\": \"%s\", \"replicas\": 64}", digest);
    refused(&f, FH_USER_TOKEN, "POST", "/v1/deployments", body, 409, "replicas");
    refused(&f, FH_USER_TOKEN, "PUT", "/v1/deployments/chat", NULL, 405, "GET or DELETE");
    refused(&f, FH_USER_TOKEN, "GET", "/v1/deployments/a%2F..%2Fb", NULL, 404, "no deployment");

    /* The deployment outlives the server. */
    fh_kill_server(&f);
    fh_start_server(&f);
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat", NULL, NULL), 200);

    assert_int_equal(fh_plexus(&out, &err, "undeploy", "chat", NULL), 0);
    px_assert_contains(out, "chat undeployed");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat", NULL), 1);
    px_assert_contains(err, "no deployment");
    free(out);
    free(err);
    /* The name is free again; the model is named by its digest. */
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", digest, "--name", "chat", NULL), 0);
    free(out);
    free(err);
    free(digest);
    free(model);
    fh_fleet_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deploy_plans_lists_explains_and_undeploys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
