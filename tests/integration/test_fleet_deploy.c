/*
 * Deployments on a real server with real agents on 127.0.0.1 (emulated
 * GPU inventories): `plexus deploy` uploads the tiny model and the server
 * plans it over the online nodes' devices, keeping the planner's report
 * and the node of each stage; the agents of the plan fetch the model into
 * their caches and report it resident; a second deployment of the same
 * model lands on those warm nodes while a cold one waits; `plexus
 * deployments`, `plexus explain NAME` and `plexus undeploy NAME`, after
 * which the agents let the model go; a taken name, hostile requests,
 * another user's view and a restart of the server.
 */
#include "fleet_harness.h"

/* An emulated accelerator; llama.cpp's split (the llamacpp policy) puts
 * layers on every device in proportion to its memory, so two nodes give
 * a plan of two stages, one on each. */
#define SMALL_GPU(id)                                                                             \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"tiny\", "      \
    "\"backend\": \"emu\", \"emu\": {\"compute_slowdown\": 1, \"memory_slowdown\": 1, "           \
    "\"jitter\": 0, \"seed\": 1}, \"compute\": {\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": " \
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

/* Waits until the deployment's state is `want`; returns its record. */
static json_t *wait_state(fh_fleet *f, const char *name, const char *want, int timeout_s)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/deployments/%s", name);
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    for (;;) {
        json_t *d = fh_api(f, "GET", path, NULL);
        const char *st = json_string_value(json_object_get(d, "state"));
        if (st && !strcmp(st, want))
            return d;
        if (px_now_ns() > deadline) {
            for (int i = 0; i < f->n_agents; i++)
                fh_print_log(f->agents[i].log);
            fail_msg("deployment %s is %s, not %s, after %d s", name, st ? st : "?", want,
                     timeout_s);
        }
        json_decref(d);
        fh_sleep_ms(100);
    }
}

/* Waits until an agent's log says needle. */
static void wait_log(fh_proc *p, const char *needle, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    for (;;) {
        char *text = NULL;
        size_t len;
        bool found = px_read_file(p->log, 1u << 22, &text, &len, NULL) == PX_OK &&
                     strstr(text, needle) != NULL;
        free(text);
        if (found)
            return;
        if (px_now_ns() > deadline) {
            fh_print_log(p->log);
            fail_msg("agent %s never logged \"%s\" within %d s", p->name, needle, timeout_s);
        }
        fh_sleep_ms(100);
    }
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
    px_assert_contains(out, "deployment chat planned: 2 stages on 2 nodes, 1 replica; its nodes "
                            "fetch the model from the server");
    px_assert_contains(out, "policy llamacpp");
    /* No terminal: the upload is not reported as it goes. */
    assert_null(strstr(err, "uploading the model"));
    assert_null(strstr(err, "\033[K"));
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

    /* Both agents fetch the model (digest verified) and report it; then
     * the server starts its front end over stage workers on them. */
    d = wait_state(&f, "chat", "serving", 60);
    assert_int_equal(json_array_size(json_object_get(d, "model_resident_on")), 2);
    json_decref(d);
    wait_log(&f.agents[0], "fetched into the cache for a deployment", 5);

    assert_int_equal(fh_plexus(&out, &err, "deployments", NULL), 0);
    px_assert_contains(out, "chat");
    px_assert_contains(out, "serving");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat", NULL), 0);
    px_assert_contains(out, "deployment chat, state serving, owner tester");
    px_assert_contains(out, "model resident on: n1,n2 (of n1,n2)");
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

    /* A cold node joins; a second deployment of the cached model lands on
     * the warm nodes, and says why. */
    char *c3 = fh_inventory(&f, "n3", SMALL_GPU("gpu0"), "");
    fh_start_agent(&f, "n3", c3);
    free(c3);
    const char *all[] = {"n1", "n2", "n3"};
    fh_wait_nodes_online(&f, all, 3, 30);
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", digest, "--name", "chat2",
                               "--policy", "llamacpp", NULL),
                     0);
    px_assert_contains(out, "the model is resident on every node of the plan");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat2", NULL), 0);
    px_assert_contains(out, "placed on warm nodes: the model is resident on 2 of 3 online nodes");
    px_assert_contains(out, "model resident on: n1,n2 (of n1,n2)");
    free(out);
    free(err);
    /* delete asks first: without a terminal it wants --yes. */
    assert_int_equal(fh_plexus(&out, &err, "delete", "deployment", "chat2", NULL), 2);
    px_assert_contains(err, "pass --yes to delete deployment chat2");
    free(out);
    free(err);
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat2", NULL, NULL), 200);
    assert_int_equal(fh_plexus(&out, &err, "delete", "deployment/chat2", "--yes", NULL), 0);
    px_assert_contains(out, "deployment chat2 undeployed");
    free(out);
    free(err);
    assert_int_equal(call(&f, FH_USER_TOKEN, "GET", "/v1/deployments/chat2", NULL, NULL), 404);

    /* On a terminal, an upload says how far it is; delete asks and takes y. */
    char *argv[] = {
        (char *)px_test_plexus_bin(), "deploy", "--model", model, "--name", "chat3", NULL};
    rc = px_test_run_pty(argv, NULL, NULL, 120, &out);
    if (rc != 0)
        fail_msg("deploy on a terminal: exit %d: %s", rc, out);
    px_assert_contains(out, "plexus deploy: uploading the model: ");
    px_assert_contains(out, "(100%)");
    free(out);
    char *del[] = {(char *)px_test_plexus_bin(), "delete", "deploy", "chat3", NULL};
    assert_int_equal(px_test_run_pty(del, "[y/N] ", "y\n", 60, &out), 0);
    px_assert_contains(out, "delete deployment chat3? [y/N] ");
    px_assert_contains(out, "deployment chat3 undeployed");
    free(out);

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
    /* No deployment needs the model on n1 any more: it lets it go. */
    wait_log(&f.agents[0], "released: no deployment here needs it", 30);
    /* The name is free again; the model is named by its digest. */
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", digest, "--name", "chat", NULL), 0);
    free(out);
    free(err);

    /* A job planned by the server (--plan auto): `jobs JOB` shows the plan. */
    assert_int_equal(fh_plexus(&out, &err, "submit", "--model", digest, "--plan", "auto", "--",
                               "/bin/true", NULL),
                     0);
    const char *sub = strstr(out, "submitted ");
    assert_non_null(sub);
    char job_id[64];
    assert_int_equal(sscanf(sub, "submitted %63s", job_id), 1);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "jobs", job_id, NULL), 0);
    px_assert_contains(out, "\nplan      ");
    px_assert_contains(out, "replica 0 stage 0: layers 0-");
    assert_null(strstr(out, "(policy ?"));
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
