/* plexus cancel: cancel a job. */
#include "cli/fleet_cli.h"

const char px__cmd_cancel_summary[] = "cancel a job (its processes are killed)";

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const px_cli_spec spec = {
    .name = "cancel",
    .synopsis = "JOB [options]",
    .about = "Cancels a queued, assigned or running job.  Agents running it kill its process\n"
             "groups at their next heartbeat.  A job that already ended cannot be cancelled\n"
             "(exit 1).",
    .opts = opts,
    .operands = "JOB",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus cancel j-000012\n"
                "plexus cancel j-000012 --context lab -o json\n",
};
const px_cli_spec *const px__cmd_cancel_specs[] = {&spec, NULL};

int px__cmd_cancel(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "cancel"};
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *id = args.v[0];
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
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else if (json_object_get(reply, "cancel"))
        /* A replica that does not schedule took it; the scheduler had not
         * stopped the job yet when it answered. */
        printf("%s %s (cancellation requested)\n", id, px__fleet_cli_str(reply, "state", "?"));
    else
        printf("%s %s\n", id, px__fleet_cli_str(reply, "state", "cancelled"));
    json_decref(reply);
    return rc;
}
