/*
 * A deployment served across real agents on 127.0.0.1: the server plans
 * the tiny model over three nodes (emulated GPUs), the agents fetch it,
 * start the stage workers the server orders (linked over TCP with the
 * deployment's secret) and the server routes the OpenAI API of the
 * deployment's name to its front end.  Eight clients stream completions
 * at once through the server; one agent is killed mid-stream; every
 * stream completes with the tokens of the fault-free run, the incident
 * (with its RTO) and the stage workers on the remaining nodes show in
 * `plexus explain`, and a second deployment of the model lands on the
 * warm nodes.  Another user sees none of it.
 */
#include "deploy_serve_harness.h"

static void kill_agent(void *ud, const char *node)
{
    fh_fleet *f = ud;
    for (int k = 0; k < f->n_agents; k++)
        if (!strcmp(f->agents[k].name, node))
            kill(f->agents[k].pid, SIGKILL);
}

static void test_deployment_serves_streams_and_heals_across_nodes(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fh_fleet f = {0};
    fh_fleet_start(&f, "deploy-serve", 5);
    const char *names[] = {"n1", "n2", "n3"};
    for (int i = 0; i < 3; i++) {
        char *inv = fh_inventory(&f, names[i], SMALL_GPU("gpu0"), "");
        fh_start_agent(&f, names[i], inv);
        free(inv);
    }
    fh_wait_nodes_online(&f, names, 3, 30);
    dsh_scenario(&f, names, model, "tcp:127.0.0.1:", kill_agent, &f);
    free(model);
    fh_fleet_stop(&f);
    curl_global_cleanup();
}

/* A node whose cache budget holds one model at a time: deploying a
 * second model evicts the first (no longer deployed) and the deployment
 * says which and why. */
static void test_eviction_for_a_deployment_is_explained(void **state)
{
    (void)state;
    char *big = px_test_require_shared_model("stories260K.gguf");
    char *small = px_test_require_shared_model("stories260K-q8_0.gguf");
    fh_fleet f = {0};
    fh_fleet_start(&f, "deploy-evict", 10);
    char *inv = fh_inventory(&f, "n1", SMALL_GPU("gpu0"), "");
    const char *extra[] = {"--cache-budget", "1400KiB", NULL};
    fh_start_agent_via(&f, "n1", inv, NULL, extra);
    free(inv);
    const char *names[] = {"n1"};
    fh_wait_nodes_online(&f, names, 1, 30);
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", small, "--name", "first", NULL), 0);
    free(out);
    free(err);
    json_decref(wait_state(&f, "first", "serving", 120));
    assert_int_equal(fh_plexus(&out, &err, "undeploy", "first", NULL), 0);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", big, "--name", "second", NULL), 0);
    free(out);
    free(err);
    json_t *d = wait_state(&f, "second", "serving", 120);
    const json_t *ev = json_array_get(json_object_get(d, "evictions"), 0);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "node")), "n1");
    assert_string_equal(json_string_value(json_object_get(ev, "name")), "stories260K-q8_0.gguf");
    json_decref(d);
    assert_int_equal(fh_plexus(&out, &err, "explain", "second", NULL), 0);
    px_assert_contains(out, "cache evictions for this model:");
    px_assert_contains(out, "node n1 evicted stories260K-q8_0.gguf");
    px_assert_contains(out, "cache budget of 1433600 bytes");
    free(out);
    free(err);
    /* Hostile reports from a node, and hostile requests on the route. */
    char path[700], *cred = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/work-n1/state/credential", f.dir);
    assert_int_equal(px_read_file(path, 4096, &cred, &len, NULL), PX_OK);
    /* "MAGIC NAME SECRET" */
    char secret[300] = "";
    assert_int_equal(sscanf(cred, "%*s %*s %299s", secret), 1);
    static const struct {
        const char *body;
        long status;
    } reports[] = {
        {"not json", 400},
        {"{\"reports\": 5}", 400},
        {"{\"reports\": [7, null, {\"id\": \"x\"}, {\"id\": 999999, \"address\": "
         "\"tcp:1.2.3.4:5\"}, {\"id\": -1, \"state\": \"killed\"}]}",
         200},
    };
    px_fleet_client *node = fh_client(&f, secret);
    for (size_t i = 0; i < PX_ARRAY_LEN(reports); i++) {
        long code = 0;
        px_err perr;
        (void)px_fleet_client_send(node, "POST", "/v1/agent/stages", reports[i].body,
                                   strlen(reports[i].body), &code, NULL, &perr);
        assert_int_equal(code, reports[i].status);
    }
    px_fleet_client_free(node);
    free(cred);
    px_fleet_client *user = fh_client(&f, FH_USER_TOKEN);
    static const struct {
        const char *body;
        long status;
    } calls[] = {
        {"not json", 400},
        {"{\"prompt\": \"x\"}", 400},
        {"{\"model\": 5, \"prompt\": \"x\"}", 400},
        {"{\"model\": \"nope\", \"prompt\": \"x\"}", 404},
        {"{\"model\": \"first\", \"prompt\": \"x\"}", 404},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(calls); i++) {
        long code = 0;
        px_err perr;
        (void)px_fleet_client_send(user, "POST", "/v1/chat/completions", calls[i].body,
                                   strlen(calls[i].body), &code, NULL, &perr);
        assert_int_equal(code, calls[i].status);
    }
    long code = 0;
    px_err perr;
    (void)px_fleet_client_send(user, "POST", "/v1/agent/stages", "{\"reports\": []}", 15, &code,
                               NULL, &perr);
    assert_int_equal(code, 403);
    px_fleet_client_free(user);
    px_fleet_client *anon = fh_client(&f, NULL);
    (void)px_fleet_client_send(anon, "POST", "/v1/completions", "{}", 2, &code, NULL, &perr);
    assert_int_equal(code, 401);
    px_fleet_client_free(anon);
    /* The deployment still serves. */
    json_decref(wait_state(&f, "second", "serving", 10));
    free(big);
    free(small);
    fh_fleet_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deployment_serves_streams_and_heals_across_nodes),
        cmocka_unit_test(test_eviction_for_a_deployment_is_explained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
