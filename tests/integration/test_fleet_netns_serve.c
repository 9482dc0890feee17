/*
 * The deployment scenario of tests/integration/deploy_serve_harness.h
 * across real network boundaries: the server in a hub network namespace,
 * three agents in three namespaces of their own joined to it by veth
 * pairs (fleet_netns_harness.h), each with its own emulated inventory.
 * The stage workers listen on their nodes' veth addresses and link to each
 * other and back to the server across the bridge; eight clients stream
 * through the server's route; the node of the middle stage dies
 * mid-stream as a machine does (its agent and its stage worker killed at
 * once); every stream ends with the fault-free tokens, the incident with
 * its RTO and the new stages show in `plexus explain`, and a second
 * deployment lands on the warm nodes.  Skips, saying why, where
 * namespaces cannot be made or the shared model is absent.
 */
#include "deploy_serve_harness.h"
#include "fleet_netns_harness.h"

#define N_NODES 3

static fh_netns_fleet nf;

static void kill_node(void *ud, const char *node)
{
    fh_netns_fleet *x = ud;
    int i = fhn_node(x, node);
    if (i < 0)
        fail_msg("no node %s in the namespaces", node);
    /* Each stage worker listens on the veth address of its own node. */
    json_t *d = deployment(&x->fleet, "chat");
    size_t k;
    json_t *w;
    json_array_foreach(json_object_get(json_object_get(d, "serving"), "stage_workers"), k, w)
    {
        int on = fhn_node(x, json_string_value(json_object_get(w, "node")));
        const char *addr = json_string_value(json_object_get(w, "address"));
        char want[40];
        snprintf(want, sizeof want, "tcp:%s:", on >= 0 ? x->net.addr[on] : "?");
        if (on < 0 || !addr || !px_str_starts_with(addr, want))
            fail_msg("a stage worker of node %d is at %s, not on %s", on, addr ? addr : "?", want);
    }
    json_decref(d);
    /* Its agent and the stage worker it started, at least. */
    int n = fhn_kill_node(x, i);
    if (n < 2)
        fail_msg("node %s had %d processes when it was killed (its agent and a stage worker "
                 "expected)",
                 node, n);
}

static void test_deployment_across_namespaces_serves_and_heals(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    if (!fhn_start(&nf, "netns-serve", N_NODES, 5)) {
        print_message("skipped: %s\n", nf.why);
        free(model);
        skip();
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < N_NODES; i++) {
        char *inv = fh_inventory(&nf.fleet, nf.names[i], SMALL_GPU("gpu0"), "");
        fhn_start_agent(&nf, i, inv);
        free(inv);
    }
    fhn_wait_online(&nf, N_NODES, 60);
    const char *names[N_NODES];
    for (int i = 0; i < N_NODES; i++)
        names[i] = nf.names[i];
    /* Every stage worker on a node's veth address, never a loopback. */
    dsh_scenario(&nf.fleet, names, model, "tcp:10.77.0.1", kill_node, &nf);
    free(model);
    fhn_stop(&nf);
    curl_global_cleanup();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deployment_across_namespaces_serves_and_heals),
    };
    alarm(290);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
