/* plexus server: the fleet's control plane (HTTP API, store, scheduler). */
#include "cli/cli.h"

#include "plexus/fleet.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

const char px__cmd_server_summary[] = "run the fleet control plane (HTTP API, store, scheduler)";

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus server [--listen HOST:PORT] [--data DIR] [--store URI]\n"
               "                     [--token-file F]\n"
               "                     [--tls-cert F --tls-key F] [--lease SECONDS]\n"
               "                     [--restart-backoff SECONDS] [--disk-reserve SIZE]\n"
               "                     [--log-quota SIZE] [--artifact-quota SIZE]\n"
               "                     [--max-upload SIZE] [--max-job-time SECONDS]\n"
               "                     [--max-connections N] [--max-connections-per-address N]\n"
               "                     [--header-timeout SECONDS]\n"
               "\n"
               "Serves the fleet API (docs/formats/fleet-api.md) on HOST:PORT (default\n"
               "127.0.0.1:7070; port 0 picks a free one) with its state in DIR (default\n"
               "./plexus-data, made private: 0700): DIR/fleet.db (SQLite), artifacts, blobs.\n"
               "See docs/security.md for what the server promises and what it needs.\n"
               "\n"
               "  --store URI           postgres://USER@HOST:PORT/DATABASE: keep the state in\n"
               "                        PostgreSQL, which several replicas share (one\n"
               "                        schedules, the others serve and stand by); no\n"
               "                        password in URI: libpq reads ~/.pgpass or PGPASSFILE\n"
               "  --token-file F        lines \"agent TOKEN\" (the join token) and \"user TOKEN\n"
               "                        [NAME [user|admin]]\"; the file must be private\n"
               "                        (chmod 600); without it, a join token and an admin\n"
               "                        token are generated once into DIR/tokens\n"
               "  --tls-cert F, --tls-key F\n"
               "                        serve HTTPS with this certificate and key (the key\n"
               "                        file private); `plexus up --tls` makes a local CA\n"
               "  --lease S             a node without a heartbeat for S seconds is lost and\n"
               "                        its work requeued (default 10); agents stop their\n"
               "                        work after 3/4 of it without a renewal\n"
               "  --restart-backoff S   first delay before a service restarts (default 1,\n"
               "                        doubling up to 60)\n"
               "  --disk-reserve SIZE   free space kept in DIR: below it submissions and\n"
               "                        uploads get 507 (default 512MiB)\n"
               "  --log-quota SIZE      output kept per job, the rest dropped with a note in\n"
               "                        the log (default 256MiB)\n"
               "  --artifact-quota SIZE artifacts per job (default 16GiB)\n"
               "  --max-upload SIZE     one upload (models, artifacts), streamed to disk\n"
               "                        (default 1TiB)\n"
               "  --max-job-time S      the longest a job may run (and ask for); default none\n"
               "  --max-connections N   (default 1024), --max-connections-per-address N (64)\n"
               "  --header-timeout S    a request's headers, or a stalled body, may take this\n"
               "                        long before the connection is closed (default 10)\n"
               "\n"
               "Prints \"listening on URL\" on stdout once ready.  SIGINT or SIGTERM stop it;\n"
               "everything acknowledged is already on disk, so a kill -9 loses nothing.\n");
}

static bool parse_seconds(const char *opt, const char *v, double max, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0) || x > max) {
        px__cli_usage_error("server", "%s takes seconds (0 < S <= %g), not \"%s\"", opt, max, v);
        return false;
    }
    *out = x;
    return true;
}

static bool parse_size(const char *opt, const char *v, uint64_t *out)
{
    px_qty q;
    px_err err;
    if (px_qty_parse(v, PX_DIM_BYTES, &q, &err) != PX_OK || !(q.value >= 1) || q.value > 1e18) {
        px__cli_usage_error("server", "%s \"%s\": give a size such as 512MiB", opt, v);
        return false;
    }
    *out = (uint64_t)q.value;
    return true;
}

static bool parse_count(const char *opt, const char *v, unsigned *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < 1 || n > 1000000) {
        px__cli_usage_error("server", "%s takes a whole number from 1 to 1000000", opt);
        return false;
    }
    *out = (unsigned)n;
    return true;
}

int px__cmd_server(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    px_fleet_server_options opt = {.listen = "127.0.0.1:7070", .data_dir = "plexus-data"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--token"))
            return px__cli_usage_error("server",
                                       "--token: tokens on the command line are visible in ps; "
                                       "use --token-file F");
        if (i + 1 >= argc)
            return px__cli_usage_error("server", "\"%s\" needs a value or is unknown", a);
        const char *v = argv[++i];
        uint64_t size;
        bool ok = true;
        if (!strcmp(a, "--listen"))
            opt.listen = v;
        else if (!strcmp(a, "--data"))
            opt.data_dir = v;
        else if (!strcmp(a, "--store"))
            opt.store = v;
        else if (!strcmp(a, "--token-file"))
            opt.token_file = v;
        else if (!strcmp(a, "--tls-cert"))
            opt.tls_cert = v;
        else if (!strcmp(a, "--tls-key"))
            opt.tls_key = v;
        else if (!strcmp(a, "--lease"))
            ok = parse_seconds(a, v, 86400, &opt.lease_s);
        else if (!strcmp(a, "--restart-backoff"))
            ok = parse_seconds(a, v, 86400, &opt.restart_backoff_s);
        else if (!strcmp(a, "--max-job-time"))
            ok = parse_seconds(a, v, 30 * 86400.0, &opt.max_job_time_s);
        else if (!strcmp(a, "--header-timeout"))
            ok = parse_seconds(a, v, 3600, &opt.header_timeout_s);
        else if (!strcmp(a, "--disk-reserve"))
            ok = parse_size(a, v, &opt.disk_reserve);
        else if (!strcmp(a, "--log-quota"))
            ok = parse_size(a, v, &opt.log_quota);
        else if (!strcmp(a, "--artifact-quota"))
            ok = parse_size(a, v, &opt.artifact_quota);
        else if (!strcmp(a, "--max-upload")) {
            ok = parse_size(a, v, &size);
            opt.max_upload = (size_t)size;
        } else if (!strcmp(a, "--max-connections"))
            ok = parse_count(a, v, &opt.max_connections);
        else if (!strcmp(a, "--max-connections-per-address"))
            ok = parse_count(a, v, &opt.max_connections_per_address);
        else
            return px__cli_usage_error("server", "unknown option \"%s\"", a);
        if (!ok)
            return PX_EXIT_USAGE;
    }
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
