/* plexus undeploy: end a deployment. */
#include "cli/fleet_cli.h"

const char px__cmd_undeploy_summary[] = "end a deployment and release what it holds";

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const px_cli_spec spec = {
    .name = "undeploy",
    .synopsis = "NAME [options]",
    .about = "Ends the deployment NAME: the server forgets its plan and its name becomes free\n"
             "again.",
    .opts = opts,
    .operands = "NAME",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus undeploy llama-chat\n",
};
const px_cli_spec *const px__cmd_undeploy_specs[] = {&spec, NULL};

int px__cmd_undeploy(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "undeploy"};
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *name = args.v[0];
    if (!px__fleet_cli_valid_id(name))
        return px__cli_usage_error("undeploy", "\"%s\" is not a deployment name", name);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    snprintf(path, sizeof path, "/v1/deployments/%s", name);
    json_t *reply = px__fleet_cli_get(&o, c, "DELETE", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else
        printf("%s %s\n", name, px__fleet_cli_str(reply, "state", "undeployed"));
    json_decref(reply);
    return rc;
}
