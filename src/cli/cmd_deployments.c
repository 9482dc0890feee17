/* plexus deployments: list the models deployed across the fleet. */
#include "cli/fleet_cli.h"

const char px__cmd_deployments_summary[] = "list the models deployed across the fleet";

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const px_cli_spec spec = {
    .name = "deployments",
    .synopsis = "[options]",
    .about = "Lists your deployments (an admin sees every user's): name, state, stages,\n"
             "replicas, the nodes that run them and the model's digest.  plexus explain NAME\n"
             "shows one deployment's plan and incidents.",
    .opts = opts,
    .examples = "plexus deployments\nplexus deployments -o yaml\n",
};
const px_cli_spec *const px__cmd_deployments_specs[] = {&spec, NULL};

int px__cmd_deployments(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "deployments"};
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    json_t *reply = px__fleet_cli_get(&o, c, "GET", "/v1/deployments", NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT) {
        rc = px__fleet_cli_print(&o, reply);
    } else {
        printf("%-24s %-10s %6s %8s  %-14s %s\n", "NAME", "STATE", "STAGES", "REPLICAS", "MODEL",
               "NODES");
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(reply, "deployments"), i, d)
        {
            px_strbuf nodes = PX_STRBUF_INIT;
            printf("%-24s %-10s %6lld %8lld  %-14.12s %s\n", px__fleet_cli_str(d, "name", "?"),
                   px__fleet_cli_str(d, "state", "?"),
                   (long long)json_integer_value(json_object_get(d, "stages")),
                   (long long)json_integer_value(json_object_get(d, "replicas")),
                   px__fleet_cli_str(d, "model", "?"),
                   px__fleet_cli_join(json_object_get(d, "nodes"), &nodes));
            px_strbuf_release(&nodes);
        }
    }
    json_decref(reply);
    return rc;
}
