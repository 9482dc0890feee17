/* plexus up: a server and one local agent in one process, for one machine. */
#include "cli/fleet_cli.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

const char px__cmd_up_summary[] = "run a server and a local agent in one process (single machine)";

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
    fprintf(f, "usage: plexus up [--data DIR] [--listen HOST:PORT] [--inventory FILE] [--name N]\n"
               "                 [--cache-budget SIZE] [--lease S]\n"
               "\n"
               "Starts the server (state in DIR, default ./plexus-data) and one agent for\n"
               "this machine in the same process: the embedded default for a single\n"
               "machine.  Tokens are generated on first start into DIR/tokens; client\n"
               "commands need the user token:\n"
               "\n"
               "  export PLEXUS_TOKEN=$(awk '$1==\"user\"{print $2}' plexus-data/tokens)\n"
               "\n"
               "SIGINT or SIGTERM stops both.\n");
}

/* Reads the first token of `kind` ("agent" or "user") from DIR/tokens. */
static char *read_token(const char *path, const char *kind, px_err *err)
{
    char *text;
    size_t len;
    if (px_read_file(path, 1u << 20, &text, &len, err) != PX_OK)
        return NULL;
    char *found = NULL, *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !found;
         line = strtok_r(NULL, "\n", &save)) {
        char k[16], tok[300];
        if (line[0] == '#' || sscanf(line, "%15s %299s", k, tok) != 2)
            continue;
        if (!strcmp(k, kind))
            found = px_strdup(tok);
    }
    free(text);
    if (!found)
        px_err_set(err, PX_ENOTFOUND, "%s: no \"%s\" token line", path, kind);
    return found;
}

typedef struct agent_thread {
    px_fleet_agent_config cfg;
    px_err err;
    px_status st;
} agent_thread;

static void *agent_main(void *arg)
{
    agent_thread *t = arg;
    t->st = px_fleet_agent_run(&t->cfg, &t->err);
    atomic_store(&stop_flag, 1);
    return NULL;
}

int px__cmd_up(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "up"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    const char *data = "plexus-data", *listen = "127.0.0.1:7070", *inventory = NULL, *name = NULL;
    uint64_t budget = 0;
    double lease = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = px__fleet_cli_value(&o, argc, argv, &i);
        if (!v)
            return PX_EXIT_USAGE;
        if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--listen"))
            listen = v;
        else if (!strcmp(a, "--inventory"))
            inventory = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--cache-budget")) {
            px_qty q;
            if (px_qty_parse(v, PX_DIM_BYTES, &q, NULL) != PX_OK || q.value < 1)
                return px__cli_usage_error("up", "--cache-budget \"%s\": give a size such as 10GiB",
                                           v);
            budget = (uint64_t)q.value;
        } else if (!strcmp(a, "--lease")) {
            char *end;
            lease = strtod(v, &end);
            if (end == v || *end || !(lease > 0))
                return px__cli_usage_error("up", "--lease takes seconds > 0");
        } else
            return px__cli_usage_error("up", "unknown option \"%s\"", a);
    }
    if (!getenv("PLEXUS_LOG"))
        px_log_set_level(PX_LOG_INFO);
    px_err err;
    px_fleet_server_options opt = {.listen = listen, .data_dir = data, .lease_s = lease};
    px_fleet_server *srv;
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK)
        return px__cli_fail("up", &err);
    char *tokens = px_asprintf("%s/tokens", data);
    char *agent_token = tokens ? read_token(tokens, "agent", &err) : NULL;
    if (!agent_token) {
        px_fleet_server_stop(srv);
        free(tokens);
        return px__cli_fail("up", &err);
    }
    char *work = px_asprintf("%s/agent", data);
    char *cache = px_asprintf("%s/agent/cache", data);
    mkdir(work, 0755);
    agent_thread t = {.cfg = {.server = px_fleet_server_url(srv),
                              .token = agent_token,
                              .inventory = inventory,
                              .name = name,
                              .cache_dir = cache,
                              .cache_budget = budget,
                              .work_dir = work,
                              .stop = &stop_flag}};
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("plexus up: server at %s, data in %s\n", px_fleet_server_url(srv), data);
    printf("plexus up: for client commands:\n"
           "  export PLEXUS_SERVER=%s\n"
           "  export PLEXUS_TOKEN=$(awk '$1==\"user\"{print $2}' %s)\n",
           px_fleet_server_url(srv), tokens);
    fflush(stdout);
    pthread_t th;
    int rc = PX_EXIT_OK;
    if (pthread_create(&th, NULL, agent_main, &t) != 0) {
        px_err_set(&err, PX_EINTERNAL, "cannot start the agent thread");
        rc = px__cli_fail("up", &err);
    } else {
        while (!atomic_load(&stop_flag)) {
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
        }
        pthread_join(th, NULL);
        if (t.st != PX_OK)
            rc = px__cli_fail("up", &t.err);
    }
    px_fleet_server_stop(srv);
    volatile char *p = agent_token;
    while (*p)
        *p++ = 0;
    free(agent_token);
    free(tokens);
    free(work);
    free(cache);
    return rc;
}
