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

static struct {
    px_fleet_agent_config cfg;
    const char *server, *ca, *join_file, *token_file;
    double budget;
} A;

/* Seconds: 0 < S <= max, given in .hi. */
static const px_cli_opt opts[] = {
    PX_CLI_OPT("server", 0, PX_CLI_STR, &A.server, "URL",
               "the server (default $PLEXUS_SERVER or\nhttp://127.0.0.1:7070)"),
    PX_CLI_OPT("join-token-file", 0, PX_CLI_STR, &A.join_file, "FILE",
               "the join token, in a file only you can read (chmod 600)"),
    PX_CLI_OPT("token-file", 0, PX_CLI_STR, &A.token_file, "FILE", "the same as --join-token-file",
               .flags = PX_CLI_HIDDEN),
    PX_CLI_OPT("state", 0, PX_CLI_STR, &A.cfg.state_dir, "DIR",
               "the node's credential (default WORK/state, mode 0700)"),
    PX_CLI_OPT("ca", 0, PX_CLI_STR, &A.ca, "FILE",
               "trust only this CA for an https:// server ($PLEXUS_CA)"),
    PX_CLI_OPT("job-user", 0, PX_CLI_STR, &A.cfg.job_user, "USER",
               "run jobs as USER (the agent runs as root); an agent\n"
               "running as root refuses to start without it"),
    PX_CLI_OPT("inventory", 0, PX_CLI_STR, &A.cfg.inventory, "FILE",
               "describe the node from an inventory (marked emulated)"),
    PX_CLI_OPT("name", 0, PX_CLI_STR, &A.cfg.name, "NAME", "node name (default the node's id)"),
    PX_CLI_OPT("cache", 0, PX_CLI_STR, &A.cfg.cache_dir, "DIR",
               "model and artifact cache (default WORK/cache)"),
    PX_CLI_OPT("cache-budget", 0, PX_CLI_SIZE, &A.budget, "SIZE",
               "cache size limit, e.g. 10GiB (the default)", .lo = 1),
    PX_CLI_OPT("work", 0, PX_CLI_STR, &A.cfg.work_dir, "DIR",
               "job folders (default $TMPDIR/plexus-agent-NAME)"),
    PX_CLI_OPT("address", 0, PX_CLI_STR, &A.cfg.address, "ADDR",
               "address other members of a job reach this node at"),
    PX_CLI_OPT("health-interval", 0, PX_CLI_TIME, &A.cfg.health_interval_s, "TIME",
               "time between service health checks (default 1s)", .lo = 0.001, .hi = 3600),
    PX_CLI_OPT("max-job-time", 0, PX_CLI_TIME, &A.cfg.max_job_time_s, "TIME",
               "stop any job after TIME", .lo = 0.001, .hi = 30 * 86400.0),
    PX_CLI_OPT("token", 0, PX_CLI_CALL, NULL, "TOKEN", NULL, .parse = px__fleet_cli_refuse_token,
               .flags = PX_CLI_HIDDEN),
    {0},
};

static const px_cli_spec spec = {
    .name = "agent",
    .synopsis = "--server URL [--join-token-file FILE] [options]",
    .about = "Describes this node (discovery, or --inventory FILE for an emulated node), joins\n"
             "the server, heartbeats its live state and runs the work the server assigns: each\n"
             "job under a supervisor that ends everything it starts (in a cgroup of its own\n"
             "where cgroup v2 allows), with only its devices visible and a scrubbed\n"
             "environment; output is streamed to the server.\n"
             "\n"
             "The first time, the agent joins with the join token (the \"agent\" line of the\n"
             "server's token file) and keeps a credential of its own in STATE/credential;\n"
             "afterwards it needs no token.  No secret is ever taken from the command line or\n"
             "the environment: jobs must not find one.",
    .opts = opts,
    .more = "SIGINT or SIGTERM stops the agent and the work it runs.  When the agent cannot\n"
            "renew its lease for 3/4 of it, it stops its jobs before the server can give them\n"
            "to another node.",
    .examples = "plexus agent --server https://10.0.0.5:7070 --ca ca.pem \\\n"
                "    --join-token-file join.token --job-user plexus-jobs\n"
                "plexus agent --server http://127.0.0.1:7070 --join-token-file t \\\n"
                "    --inventory data/scenarios/hetero-pair-h100-l4.json   # an emulated node\n",
};
const px_cli_spec *const px__cmd_agent_specs[] = {&spec, NULL};

int px__cmd_agent(int argc, char **argv)
{
    memset(&A, 0, sizeof A);
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    px_fleet_agent_config cfg = A.cfg;
    cfg.cache_budget = (uint64_t)A.budget;
    px__fleet_cli o = {.cmd = "agent", .server = A.server, .ca = A.ca, .token_file = A.token_file};
    const char *join_file = A.join_file;
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
