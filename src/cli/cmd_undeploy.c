/* plexus undeploy: end a deployment. */
#include "cli/fleet_cli.h"

const char px__cmd_undeploy_summary[] = "end a deployment and release what it holds";

int px__cmd_undeploy(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "undeploy"};
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus undeploy NAME [--server URL] [--token-file F] [-o text|json]\n\n"
               "Ends the deployment NAME: the server forgets its plan and its name becomes\n"
               "free again.\n");
        return PX_EXIT_OK;
    }
    const char *name = NULL;
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        if (argv[i][0] != '-' && !name)
            name = argv[i];
        else
            return px__cli_usage_error("undeploy", "unexpected argument \"%s\"", argv[i]);
    }
    if (!name)
        return px__cli_usage_error("undeploy", "give the deployment's name");
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
    if (o.format == PX_CLI_JSON)
        rc = px__cli_print_json(reply);
    else
        printf("%s %s\n", name, px__fleet_cli_str(reply, "state", "undeployed"));
    json_decref(reply);
    return rc;
}
