/* plexus server: the fleet's control plane (HTTP API, store, scheduler). */
#include "cli/cli.h"

#include "plexus/fleet.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

const char px__cmd_server_summary[] = "run the fleet control plane (HTTP API, store, scheduler)";

static px_fleet_server_options O;
static double disk_reserve, log_quota, artifact_quota, max_upload;

static px_status refuse_token(const char *value, void *dest, px_err *err)
{
    (void)value;
    (void)dest;
    return px_err_set(err, PX_EINVAL,
                      "is refused: tokens on the command line are visible in ps; use "
                      "--token-file FILE");
}

static const px_cli_opt opts[] = {
    PX_CLI_OPT("listen", 0, PX_CLI_STR, &O.listen, "HOST:PORT",
               "where to listen (default 127.0.0.1:7070; port 0 picks a\nfree one)"),
    PX_CLI_OPT("data", 0, PX_CLI_STR, &O.data_dir, "DIR",
               "the state (default ./plexus-data, made private: 0700):\n"
               "DIR/fleet.db (SQLite), artifacts, blobs"),
    PX_CLI_OPT("store", 0, PX_CLI_STR, &O.store, "URI",
               "postgres://USER@HOST:PORT/DATABASE: keep the state in\n"
               "PostgreSQL, which several replicas share (one schedules,\n"
               "the others serve and stand by); no password in URI:\n"
               "libpq reads ~/.pgpass or PGPASSFILE"),
    PX_CLI_OPT("token-file", 0, PX_CLI_STR, &O.token_file, "FILE",
               "lines \"agent TOKEN\" (the join token) and \"user TOKEN\n"
               "[NAME [user|admin]]\"; the file must be private (chmod\n"
               "600); without it, a join token and an admin token are\n"
               "generated once into DIR/tokens"),
    PX_CLI_OPT("tls-cert", 0, PX_CLI_STR, &O.tls_cert, "FILE",
               "serve HTTPS with this certificate (plexus up --tls\nmakes a local CA)"),
    PX_CLI_OPT("tls-key", 0, PX_CLI_STR, &O.tls_key, "FILE", "the certificate's key (private)"),
    PX_CLI_OPT("lease", 0, PX_CLI_TIME, &O.lease_s, "TIME",
               "a node without a heartbeat for this long is lost and its\n"
               "work requeued (default 10s); agents stop their work after\n"
               "3/4 of it without a renewal",
               .lo = 0.001, .hi = 86400),
    PX_CLI_OPT("restart-backoff", 0, PX_CLI_TIME, &O.restart_backoff_s, "TIME",
               "first delay before a service restarts (default 1s,\ndoubling up to 60s)",
               .lo = 0.001, .hi = 86400),
    PX_CLI_OPT("disk-reserve", 0, PX_CLI_SIZE, &disk_reserve, "SIZE",
               "free space kept in DIR: below it submissions and uploads\n"
               "get 507 (default 512MiB)",
               .lo = 1, .hi = 1e18),
    PX_CLI_OPT("log-quota", 0, PX_CLI_SIZE, &log_quota, "SIZE",
               "output kept per job, the rest dropped with a note in the\nlog (default 256MiB)",
               .lo = 1, .hi = 1e18),
    PX_CLI_OPT("artifact-quota", 0, PX_CLI_SIZE, &artifact_quota, "SIZE",
               "artifacts per job (default 16GiB)", .lo = 1, .hi = 1e18),
    PX_CLI_OPT("max-upload", 0, PX_CLI_SIZE, &max_upload, "SIZE",
               "one upload (models, artifacts), streamed to disk\n(default 1TiB)", .lo = 1,
               .hi = 1e18),
    PX_CLI_OPT("max-job-time", 0, PX_CLI_TIME, &O.max_job_time_s, "TIME",
               "the longest a job may run (and ask for); default none", .lo = 0.001,
               .hi = 30 * 86400.0),
    PX_CLI_OPT("max-connections", 0, PX_CLI_U32, &O.max_connections, "N",
               "connections at once (default 1024)", .lo = 1, .hi = 1000000),
    PX_CLI_OPT("max-connections-per-address", 0, PX_CLI_U32, &O.max_connections_per_address, "N",
               "connections at once from one address (default 64)", .lo = 1, .hi = 1000000),
    PX_CLI_OPT("header-timeout", 0, PX_CLI_TIME, &O.header_timeout_s, "TIME",
               "a request's headers, or a stalled body, may take this\n"
               "long before the connection is closed (default 10s)",
               .lo = 0.001, .hi = 3600),
    PX_CLI_OPT("token", 0, PX_CLI_CALL, NULL, "TOKEN", NULL, .parse = refuse_token,
               .flags = PX_CLI_HIDDEN),
    {0},
};

static const px_cli_spec spec = {
    .name = "server",
    .synopsis = "[--listen HOST:PORT] [--data DIR] [--store URI] [options]",
    .about = "Serves the fleet API (docs/formats/fleet-api.md).  See docs/security.md for what\n"
             "the server promises and what it needs.",
    .opts = opts,
    .more = "Prints \"listening on URL\" on stdout once ready.  SIGINT or SIGTERM stop it;\n"
            "everything acknowledged is already on disk, so a kill -9 loses nothing.  A\n"
            "replica that lost the scheduler lease exits with status 75 to be restarted as a\n"
            "standby.",
    .examples = "plexus server --listen 0.0.0.0:7070 --data /srv/plexus \\\n"
                "    --tls-cert server.pem --tls-key server-key.pem\n"
                "plexus server --store postgres://plexus@db:5432/plexus --listen 0.0.0.0:7070\n",
};
const px_cli_spec *const px__cmd_server_specs[] = {&spec, NULL};

int px__cmd_server(int argc, char **argv)
{
    O = (px_fleet_server_options){.listen = "127.0.0.1:7070", .data_dir = "plexus-data"};
    disk_reserve = log_quota = artifact_quota = max_upload = 0;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    px_fleet_server_options opt = O;
    opt.disk_reserve = (uint64_t)disk_reserve;
    opt.log_quota = (uint64_t)log_quota;
    opt.artifact_quota = (uint64_t)artifact_quota;
    opt.max_upload = (size_t)max_upload;
    if (!getenv("PLEXUS_LOG"))
        px_log_set_level(PX_LOG_INFO);
    /* Block the stop signals in every thread; the main thread waits for them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    px_err err;
    px_fleet_server *srv;
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK)
        return px__cli_fail("server", &err);
    printf("listening on %s\n", px_fleet_server_url(srv));
    fflush(stdout);
    /* A replica that lost the scheduler lease must not serve again from
     * what it holds in memory: it exits (75, "try again later") for its
     * supervisor to start it afresh as a standby. */
    int sig = 0;
    const char *failed = NULL;
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 200000000};
    while ((sig = sigtimedwait(&set, NULL, &tick)) < 0 && !(failed = px_fleet_server_failed(srv))) {
    }
    if (failed) {
        fprintf(stderr, "plexus server: %s; exiting to be restarted as a standby\n", failed);
        px_fleet_server_stop(srv);
        return 75;
    }
    px_log_info("server: stopping on signal %d", sig);
    px_fleet_server_stop(srv);
    return PX_EXIT_OK;
}
