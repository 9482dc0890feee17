/* plexus cancel: cancel a job. */
#include "cli/fleet_cli.h"

const char px__cmd_cancel_summary[] = "cancel a job (its processes are killed)";

int px__cmd_cancel(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "cancel"};
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus cancel JOB [--server URL] [--token-file F] [-o text|json]\n\n"
               "Cancels a queued, assigned or running job.  Agents running it kill its\n"
               "process groups at their next heartbeat.  A job that already ended\n"
               "cannot be cancelled (exit 1).\n");
        return PX_EXIT_OK;
    }
    const char *id = NULL;
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        if (argv[i][0] != '-' && !id)
            id = argv[i];
        else
            return px__cli_usage_error("cancel", "unexpected argument \"%s\"", argv[i]);
    }
    if (!id)
        return px__cli_usage_error("cancel", "give the job id to cancel");
    if (!px__fleet_cli_valid_id(id))
        return px__cli_usage_error("cancel", "\"%s\" is not a job id (e.g. j-000012)", id);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    json_t *body = json_object();
    json_t *reply = px__fleet_cli_get(&o, c, "POST", path, body);
    json_decref(body);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format == PX_CLI_JSON)
        rc = px__cli_print_json(reply);
    else
        printf("%s %s\n", id, px__fleet_cli_str(reply, "state", "cancelled"));
    json_decref(reply);
    return rc;
}
