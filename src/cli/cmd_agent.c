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
    fprintf(f, "usage: plexus agent --server URL [--join-token-file F] [--inventory FILE]\n"
               "                    [--name N] [--state DIR] [--ca F] [--job-user U]\n"
               "                    [--cache DIR] [--cache-budget SIZE] [--work DIR]\n"
               "                    [--address A] [--health-interval S] [--max-job-time S]\n"
               "\n"
               "Describes this node (discovery, or --inventory FILE for an emulated node),\n"
               "joins the server, heartbeats its live state and runs the work the server\n"
               "assigns: each job under a supervisor that ends everything it starts (in a\n"
               "cgroup of its own where cgroup v2 allows), with only its devices visible and\n"
               "a scrubbed environment; output is streamed to the server.\n"
               "\n"
               "The first time, the agent joins with the join token (the \"agent\" line of the\n"
               "server's token file) and keeps a credential of its own in STATE/credential;\n"
               "afterwards it needs no token.  No secret is ever taken from the command line\n"
               "or the environment: jobs must not find one.\n"
               "\n"
               "  --server URL          default PLEXUS_SERVER or http://127.0.0.1:7070\n"
               "  --join-token-file F   the join token, in a file only you can read (chmod 600)\n"
               "  --state DIR           the node's credential (default WORK/state, mode 0700)\n"
               "  --ca F                trust only this CA for an https:// server (PLEXUS_CA)\n"
               "  --job-user U          run jobs as user U (the agent runs as root); an agent\n"
               "                        running as root refuses to start without it\n"
               "  --inventory FILE      describe the node from an inventory (marked emulated)\n"
               "  --name N              node name (default the node's id)\n"
               "  --cache DIR           model and artifact cache (default WORK/cache)\n"
               "  --cache-budget SIZE   cache size limit, e.g. 10GiB (the default)\n"
               "  --work DIR            job folders (default $TMPDIR/plexus-agent-NAME)\n"
               "  --address A           address other members of a job reach this node at\n"
               "  --health-interval S   seconds between service health checks (default 1)\n"
               "  --max-job-time S      stop any job after S seconds\n"
               "\n"
               "SIGINT or SIGTERM stops the agent and the work it runs.  When the agent\n"
               "cannot renew its lease for 3/4 of it, it stops its jobs before the server\n"
               "can give them to another node.\n");
}

static bool parse_seconds(const char *opt, const char *v, double max, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0) || x > max) {
        px__cli_usage_error("agent", "%s takes seconds (0 < S <= %g), not \"%s\"", opt, max, v);
        return false;
    }
    *out = x;
    return true;
}

int px__cmd_agent(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "agent"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    px_fleet_agent_config cfg = {0};
    const char *join_file = NULL;
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
        if (!strcmp(a, "--join-token-file"))
            join_file = v;
        else if (!strcmp(a, "--inventory"))
            cfg.inventory = v;
        else if (!strcmp(a, "--name"))
            cfg.name = v;
        else if (!strcmp(a, "--state"))
            cfg.state_dir = v;
        else if (!strcmp(a, "--job-user"))
            cfg.job_user = v;
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
            if (!parse_seconds(a, v, 3600, &cfg.health_interval_s))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--max-job-time")) {
            if (!parse_seconds(a, v, 30 * 86400.0, &cfg.max_job_time_s))
                return PX_EXIT_USAGE;
        } else
            return px__cli_usage_error("agent", "unknown option \"%s\"", a);
    }
    /* --token-file is the common name of the same file. */
    if (!join_file)
        join_file = o.token_file;
    /* The agent keeps no secret in its environment, where a process of its
     * uid could read it: a token exported for the client commands is erased. */
    if (getenv("PLEXUS_TOKEN")) {
        px__cli_scrub_env("PLEXUS_TOKEN");
        fprintf(stderr, "plexus agent: PLEXUS_TOKEN erased from the agent's environment; the "
                        "agent joins with --join-token-file\n");
    }
    if (!o.server)
        o.server = getenv("PLEXUS_SERVER");
    if (!o.ca)
        o.ca = getenv("PLEXUS_CA");
    char *join = NULL;
    px_err err;
    if (join_file && px_fleet_secret_read(join_file, "--join-token-file", &join, &err) != PX_OK)
        return px__cli_fail("agent", &err);
    cfg.server = o.server;
    cfg.token = join;
    cfg.ca_file = o.ca && o.ca[0] ? o.ca : NULL;
    cfg.stop = &stop_flag;
    if (!getenv("PLEXUS_LOG"))
        px_log_set_level(PX_LOG_INFO);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    px_status st = px_fleet_agent_run(&cfg, &err);
    if (join) {
        for (volatile char *p = join; *p; p++)
            *p = 0;
        free(join);
    }
    if (st != PX_OK)
        return px__cli_fail("agent", &err);
    return PX_EXIT_OK;
}
