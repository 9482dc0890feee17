/* plexus up: a server and one local agent in one process, for one machine. */
#include "cli/fleet_cli.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Reads the first token of `kind` ("agent" or "user") from DIR/tokens,
 * a file the server keeps private. */
static char *read_token(const char *path, const char *kind, px_err *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && (sb.st_mode & 077)) {
        px_err_set(err, PX_EAUTH, "%s is readable by group or others; chmod 600 %s", path, path);
        return NULL;
    }
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
        memset(tok, 0, sizeof tok);
    }
    memset(text, 0, len);
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

typedef struct up_args {
    const char *data, *listen, *inventory, *name, *job_user;
    double budget, lease;
    bool tls;
} up_args;
static up_args U;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("data", 0, PX_CLI_STR, &U.data, "DIR",
               "the server's state (default ./plexus-data); the agent's\n"
               "job folders and model cache go in DIR-agent"),
    PX_CLI_OPT("listen", 0, PX_CLI_STR, &U.listen, "HOST:PORT",
               "where the server listens (default 127.0.0.1:7070)"),
    PX_CLI_OPT("tls", 0, PX_CLI_FLAG, &U.tls, NULL,
               "serve HTTPS with a local CA made in DIR/tls (ca.pem is the\n"
               "CA clients trust: --ca DIR/tls/ca.pem or PLEXUS_CA)"),
    PX_CLI_OPT("inventory", 0, PX_CLI_STR, &U.inventory, "FILE",
               "describe the node from an inventory (marked emulated)"),
    PX_CLI_OPT("name", 0, PX_CLI_STR, &U.name, "NAME", "the node's name"),
    PX_CLI_OPT("cache-budget", 0, PX_CLI_SIZE, &U.budget, "SIZE",
               "the model cache's size limit, e.g. 10GiB", .lo = 1),
    PX_CLI_OPT("lease", 0, PX_CLI_TIME, &U.lease, "TIME", "the agents' lease (default 10s)",
               .lo = 0.001),
    PX_CLI_OPT("job-user", 0, PX_CLI_STR, &U.job_user, "USER",
               "run jobs as USER; when plexus up runs as root the\n"
               "default is nobody, so that no job runs as root"),
    {0},
};

static const px_cli_spec spec = {
    .name = "up",
    .synopsis = "[--data DIR] [--listen HOST:PORT] [--tls] [options]",
    .about = "Starts the server (state in DIR) and one agent for this machine in the same\n"
             "process: the embedded default for a single machine.  A join token and an admin\n"
             "token are generated on first start into DIR/tokens (mode 0600); client commands\n"
             "need the admin (user) token:\n"
             "\n"
             "  awk '$1==\"user\"{print $2}' plexus-data/tokens > ~/.plexus-token\n"
             "  chmod 600 ~/.plexus-token\n"
             "  plexus config set-context local --server http://127.0.0.1:7070 \\\n"
             "      --token-file ~/.plexus-token --current",
    .opts = opts,
    .more = "SIGINT or SIGTERM stops both.",
    .examples = "plexus up\n"
                "plexus up --data /srv/plexus --listen 0.0.0.0:7070 --tls --job-user nobody\n",
};
const px_cli_spec *const px__cmd_up_specs[] = {&spec, NULL};

int px__cmd_up(int argc, char **argv)
{
    U = (up_args){.data = "plexus-data", .listen = "127.0.0.1:7070"};
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *data_arg = U.data, *listen = U.listen, *inventory = U.inventory, *name = U.name,
               *job_user = U.job_user;
    uint64_t budget = (uint64_t)U.budget;
    double lease = U.lease;
    bool tls = U.tls;
    if (!getenv("PLEXUS_LOG"))
        px_log_set_level(PX_LOG_INFO);
    /* A token the user exported for the client commands stays out of this
     * process's environment, which its jobs' processes are not to read. */
    px__cli_scrub_env("PLEXUS_TOKEN");
    if (!job_user && geteuid() == 0) {
        job_user = "nobody";
        printf("plexus up: running as root: jobs run as the user nobody (--job-user to choose)\n");
    }
    /* Absolute paths: the model path a job gets ($PLEXUS_MODEL) must hold
     * from the job's own folder. */
    if (mkdir(data_arg, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "plexus up: %s: cannot create: %s\n", data_arg, strerror(errno));
        return PX_EXIT_FAIL;
    }
    char *data = realpath(data_arg, NULL);
    if (!data) {
        fprintf(stderr, "plexus up: %s: %s\n", data_arg, strerror(errno));
        return PX_EXIT_FAIL;
    }
    px_err err;
    char *tls_dir = tls ? px_asprintf("%s/tls", data) : NULL;
    char *cert = tls ? px_asprintf("%s/server.pem", tls_dir) : NULL;
    char *key = tls ? px_asprintf("%s/server-key.pem", tls_dir) : NULL;
    char *ca = tls ? px_asprintf("%s/ca.pem", tls_dir) : NULL;
    int rc = PX_EXIT_OK;
    char *tokens = NULL, *agent_token = NULL, *work = NULL, *cache = NULL;
    px_fleet_server *srv = NULL;
    if (tls) {
        char host[64];
        const char *colon = strrchr(listen, ':');
        snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : 0, listen);
        if (px_fleet_tls_make_local(tls_dir, host[0] ? host : NULL, &err) != PX_OK) {
            rc = px__cli_fail("up", &err);
            goto done;
        }
    }
    px_fleet_server_options opt = {
        .listen = listen, .data_dir = data, .lease_s = lease, .tls_cert = cert, .tls_key = key};
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK) {
        rc = px__cli_fail("up", &err);
        goto done;
    }
    tokens = px_asprintf("%s/tokens", data);
    agent_token = tokens ? read_token(tokens, "agent", &err) : NULL;
    if (!agent_token) {
        rc = px__cli_fail("up", &err);
        goto done;
    }
    /* Beside DATA, not in it: DATA is the server's and private (0700), and
     * a job user must reach its own folders and the models. */
    work = px_asprintf("%s-agent", data);
    cache = px_asprintf("%s-agent/cache", data);
    agent_thread t = {.cfg = {.server = px_fleet_server_url(srv),
                              .token = agent_token,
                              .ca_file = ca,
                              .job_user = job_user,
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
    if (ca)
        printf("  export PLEXUS_CA=%s\n", ca);
    fflush(stdout);
    pthread_t th;
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
done:
    px_fleet_server_stop(srv);
    if (agent_token) {
        volatile char *p = agent_token;
        while (*p)
            *p++ = 0;
    }
    free(agent_token);
    free(tokens);
    free(work);
    free(cache);
    free(tls_dir);
    free(cert);
    free(key);
    free(ca);
    free(data);
    return rc;
}
