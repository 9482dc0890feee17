/* plexus server: the fleet's control plane (HTTP API, store, scheduler). */
#include "cli/cli.h"

#include "plexus/fleet.h"

#include <pthread.h>
#include <signal.h>

const char px__cmd_server_summary[] = "run the fleet control plane (HTTP API, store, scheduler)";

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus server [--listen HOST:PORT] [--data DIR] [--token-file F]\n"
               "                     [--lease SECONDS] [--restart-backoff SECONDS]\n"
               "\n"
               "Serves the fleet API (docs/formats/fleet-api.md) on HOST:PORT (default\n"
               "127.0.0.1:7070; port 0 picks a free one) with its state in DIR (default\n"
               "./plexus-data): DIR/fleet.db (SQLite), artifacts and blobs.\n"
               "\n"
               "  --token-file F        lines \"agent TOKEN\" and \"user TOKEN [name]\"; without\n"
               "                        it, tokens are generated once into DIR/tokens (0600)\n"
               "  --lease S             a node without a heartbeat for S seconds is lost and\n"
               "                        its work requeued (default 10)\n"
               "  --restart-backoff S   first delay before a service restarts (default 1,\n"
               "                        doubling up to 60)\n"
               "\n"
               "Prints \"listening on URL\" on stdout once ready.  SIGINT or SIGTERM stop it;\n"
               "everything acknowledged is already on disk, so a kill -9 loses nothing.\n");
}

static bool parse_seconds(const char *opt, const char *v, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0) || x > 86400) {
        px__cli_usage_error("server", "%s takes seconds (0 < S <= 86400), not \"%s\"", opt, v);
        return false;
    }
    *out = x;
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
        if (i + 1 >= argc)
            return px__cli_usage_error("server", "\"%s\" needs a value or is unknown", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--listen"))
            opt.listen = v;
        else if (!strcmp(a, "--data"))
            opt.data_dir = v;
        else if (!strcmp(a, "--token-file"))
            opt.token_file = v;
        else if (!strcmp(a, "--lease")) {
            if (!parse_seconds(a, v, &opt.lease_s))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--restart-backoff")) {
            if (!parse_seconds(a, v, &opt.restart_backoff_s))
                return PX_EXIT_USAGE;
        } else
            return px__cli_usage_error("server", "unknown option \"%s\"", a);
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
    int sig = 0;
    sigwait(&set, &sig);
    px_log_info("server: stopping on signal %d", sig);
    px_fleet_server_stop(srv);
    return PX_EXIT_OK;
}
