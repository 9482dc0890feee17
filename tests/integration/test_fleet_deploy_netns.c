/*
 * A deployment served across real network boundaries: three agents in
 * three network namespaces joined by veth pairs to the hub where the
 * server runs (tests/support/netns.h), each with its own emulated
 * inventory, so the stage workers listen on their node's veth address
 * and every stage link crosses real interfaces.  The scenario of
 * deploy_serve_harness.h: eight concurrent streams through the server's
 * route, a node killed mid-stream (its agent and its stage worker at
 * once, as a machine dies), every stream with the fault-free tokens, the
 * incident and the new plan in `plexus explain`, and a second deployment
 * on the warm nodes.  Skipped where namespaces cannot be made (not root,
 * no `ip`).
 */
#include "deploy_serve_harness.h"
#include "fleet_netns_harness.h"

static void kill_node(void *ud, const char *node)
{
    fh_netns_fleet *nf = ud;
    int i = fhn_node(nf, node);
    assert_true(i >= 0);
    /* Each stage worker listens on the veth address of its own node. */
    json_t *d = deployment(&nf->fleet, "chat");
    size_t k;
    json_t *w;
    json_array_foreach(json_object_get(json_object_get(d, "serving"), "stage_workers"), k, w)
    {
        int on = fhn_node(nf, json_string_value(json_object_get(w, "node")));
        const char *addr = json_string_value(json_object_get(w, "address"));
        char want[40];
        snprintf(want, sizeof want, "tcp:%s:", on >= 0 ? nf->net.addr[on] : "?");
        if (on < 0 || !addr || !px_str_starts_with(addr, want))
            fail_msg("a stage worker of node %d is at %s, not on %s", on, addr ? addr : "?", want);
    }
    json_decref(d);
    /* Its agent and the stage worker it started, at least. */
    assert_true(fhn_kill_node(nf, i) >= 2);
}

static void test_deployment_across_namespaces_heals_a_lost_node(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    static fh_netns_fleet nf;
    if (!fhn_start(&nf, "deploy-netns", 3, 5.0)) {
        print_message("skipped: %s\n", nf.why);
        free(model);
        skip();
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < 3; i++) {
        char *inv = fh_inventory(&nf.fleet, nf.names[i], SMALL_GPU("gpu0"), "");
        fhn_start_agent(&nf, i, inv);
        free(inv);
    }
    fhn_wait_online(&nf, 3, 30);
    const char *names[3] = {nf.names[0], nf.names[1], nf.names[2]};
    dsh_scenario(&nf.fleet, names, model, "tcp:10.77.0.", kill_node, &nf);
    free(model);
    fhn_stop(&nf);
    curl_global_cleanup();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deployment_across_namespaces_heals_a_lost_node),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
