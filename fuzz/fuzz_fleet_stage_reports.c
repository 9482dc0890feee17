/*
 * libFuzzer target: what an agent sends the server about its stage
 * workers and its cache (POST /v1/agent/stages and the "stages" and
 * "evictions" of a heartbeat), from arbitrary bytes under the API's JSON
 * limits, applied to a server holding stage orders of two nodes.  Reports
 * of node n1 must never change an order of node n2, an order may only
 * move forward (listening, failed or ended), and the evictions kept stay
 * bounded.  Any crash, leak or sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Orders as the fleet launcher queues them, delivered to their agents
 * (ids 1 and 2 on n1, 3 on n2). */
static void orders(px_fleet_server *srv)
{
    json_t *argv = json_pack("[s, s]", "plexus", "worker");
    static const char *const nodes[] = {"n1", "n1", "n2"};
    for (uint32_t i = 0; argv && i < 3; i++)
        px__srv_stages_queue(srv, nodes[i], "d", "00", i, argv,
                             "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    json_decref(argv);
    json_decref(px__srv_stages_for(srv, "n1"));
    json_decref(px__srv_stages_for(srv, "n2"));
}

/* Node n2's orders as the API shows them. */
static json_t *of_n2(px_fleet_server *srv)
{
    json_t *all = px__srv_stages_json(srv, "d"), *mine = json_array();
    size_t i;
    json_t *o;
    json_array_foreach(all, i, o)
    {
        if (!strcmp(json_string_value(json_object_get(o, "node")), "n2"))
            json_array_append(mine, o);
    }
    json_decref(all);
    return mine;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_json_limits lim = {
        .max_bytes = 1 << 20, .max_depth = 32, .max_string = 1 << 20, .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse((const char *)data, size, "fuzz.json", &lim, &v, &err) != PX_OK)
        return 0;
    px_fleet_server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        json_decref(v);
        return 0;
    }
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->changed, NULL);
    orders(srv);
    pthread_mutex_lock(&srv->lock);
    json_t *before = of_n2(srv);
    px__srv_stages_report(srv, "n1", json_object_get(v, "reports"));
    px__srv_stages_report(srv, "n1", json_object_get(v, "stages"));
    px__srv_deploy_evictions(srv, "n1", json_object_get(v, "evictions"));
    px__srv_deploy_evictions(srv, "n1", json_object_get(v, "evictions"));
    if (json_array_size(json_object_get(srv->evictions, "n1")) > 32)
        abort(); /* bounded */
    json_t *after = of_n2(srv);
    if (!json_equal(before, after))
        abort(); /* n1 spoke for n2 */
    pthread_mutex_unlock(&srv->lock);
    json_decref(before);
    json_decref(after);
    px__srv_stages_free(srv);
    json_decref(srv->evictions);
    pthread_cond_destroy(&srv->changed);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
    json_decref(v);
    return 0;
}
