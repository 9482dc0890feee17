/* plexus agent: attach this machine (or an emulated node) to a server. */
#include "cli/fleet_cli.h"

#include <signal.h>

const char px__cmd_agent_summary[] = "attach this node to a plexus server and run its work";

/* Set by the signal handler, read by the agent's threads: a lock-free
 * atomic is safe in both places. */
static atomic_int stop_flag;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "atomic_int must be lock-free for signal handlers");

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop_flag, 1);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus agent --server URL --token T [--inventory FILE] [--name N]\n"
               "                    [--cache DIR] [--cache-budget SIZE] [--work DIR]\n"
               "                    [--address A] [--health-interval S]\n"
               "\n"
               "Describes this node (discovery, or --inventory FILE for an emulated node),\n"
               "registers with the server, heartbeats its live state and runs the work the\n"
               "server assigns: each job in its own process group, with only its devices\n"
               "visible and a scrubbed environment; output is streamed to the server.\n"
               "\n"
               "  --server URL        default PLEXUS_SERVER or http://127.0.0.1:7070\n"
               "  --token T           the cluster token (default PLEXUS_TOKEN)\n"
               "  --inventory FILE    describe the node from an inventory (marked emulated)\n"
               "  --name N            node name (default the node's id)\n"
               "  --cache DIR         model and artifact cache (default WORK/cache)\n"
               "  --cache-budget SIZE cache size limit, e.g. 10GiB (the default)\n"
               "  --work DIR          job folders (default $TMPDIR/plexus-agent-NAME)\n"
               "  --address A         address other members of a job reach this node at\n"
               "  --health-interval S seconds between service health checks (default 1)\n"
               "\n"
               "SIGINT or SIGTERM stops the agent and the work it runs.\n");
}

int px__cmd_agent(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "agent"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    px_fleet_agent_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        const char *a = argv[i];
        const char *v = px__fleet_cli_value(&o, argc, argv, &i);
        if (!v)
            return PX_EXIT_USAGE;
        if (!strcmp(a, "--inventory"))
            cfg.inventory = v;
        else if (!strcmp(a, "--name"))
            cfg.name = v;
        else if (!strcmp(a, "--cache"))
            cfg.cache_dir = v;
        else if (!strcmp(a, "--work"))
            cfg.work_dir = v;
        else if (!strcmp(a, "--address"))
            cfg.address = v;
        else if (!strcmp(a, "--cache-budget")) {
            px_qty q;
            px_err err;
            if (px_qty_parse(v, PX_DIM_BYTES, &q, &err) != PX_OK || q.value < 1)
                return px__cli_usage_error("agent",
                                           "--cache-budget \"%s\": give a size such as 10GiB", v);
            cfg.cache_budget = (uint64_t)q.value;
        } else if (!strcmp(a, "--health-interval")) {
            char *end;
            cfg.health_interval_s = strtod(v, &end);
            if (end == v || *end || !(cfg.health_interval_s > 0) || cfg.health_interval_s > 3600)
                return px__cli_usage_error("agent", "--health-interval takes seconds (0 to 3600]");
        } else
            return px__cli_usage_error("agent", "unknown option \"%s\"", a);
    }
    if (!o.server)
        o.server = getenv("PLEXUS_SERVER");
    if (!o.token)
        o.token = getenv("PLEXUS_TOKEN");
    if (!o.token || !o.token[0])
        return px__cli_usage_error("agent", "give the cluster token with --token or PLEXUS_TOKEN");
    cfg.server = o.server;
    cfg.token = o.token;
    cfg.stop = &stop_flag;
    if (!getenv("PLEXUS_LOG"))
        px_log_set_level(PX_LOG_INFO);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    px_err err;
    if (px_fleet_agent_run(&cfg, &err) != PX_OK)
        return px__cli_fail("agent", &err);
    return PX_EXIT_OK;
}
