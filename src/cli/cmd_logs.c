/* plexus logs: a job's output, optionally followed as it is written. */
#include "cli/fleet_cli.h"

#include <signal.h>

const char px__cmd_logs_summary[] = "print a job's output (-f follows it)";

/* Set by the signal handler, read by libcurl's progress callback: a
 * lock-free atomic is safe in both places. */
static atomic_int interrupted;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "atomic_int must be lock-free for signal handlers");

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&interrupted, 1);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: plexus logs [-f] [--stream stdout|stderr] JOB [--server URL] [--token-file F]\n"
            "                   [-o text|json]\n"
            "\n"
            "Prints the job's output in order: stdout to stdout, stderr to stderr.\n"
            "-f follows the output until the job ends (long polling the server).\n"
            "-o json prints one JSON object per chunk (seq, stream, rank, attempt,\n"
            "data).\n");
}

int px__cmd_logs(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "logs"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    const char *id = NULL, *stream = NULL;
    bool follow = false;
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow"))
            follow = true;
        else if (!strcmp(argv[i], "--stream")) {
            if (!(stream = px__fleet_cli_value(&o, argc, argv, &i)))
                return PX_EXIT_USAGE;
            if (strcmp(stream, "stdout") && strcmp(stream, "stderr"))
                return px__cli_usage_error("logs", "--stream takes stdout or stderr");
        } else if (argv[i][0] != '-' && !id)
            id = argv[i];
        else
            return px__cli_usage_error("logs", "unexpected argument \"%s\"", argv[i]);
    }
    if (!id)
        return px__cli_usage_error("logs", "give the job id");
    if (!px__fleet_cli_valid_id(id))
        return px__cli_usage_error("logs", "\"%s\" is not a job id (e.g. j-000012)", id);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    px_fleet_client_set_timeout(c, 45000);
    if (follow) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        px_fleet_client_set_abort(c, &interrupted);
    }
    long long after = 0;
    int rc = PX_EXIT_OK;
    for (;;) {
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=%lld&wait=%d%s%s", id, after,
                 follow ? 10 : 0, stream ? "&stream=" : "", stream ? stream : "");
        json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
        if (!reply) {
            rc = atomic_load(&interrupted) ? PX_EXIT_OK : PX_EXIT_FAIL;
            break;
        }
        const json_t *chunks = json_object_get(reply, "chunks");
        size_t i;
        json_t *ch;
        json_array_foreach(chunks, i, ch)
        {
            if (o.format == PX_CLI_JSON) {
                char *line = px_json_dump_line(ch);
                if (line)
                    printf("%s\n", line);
                free(line);
                continue;
            }
            const char *data = px__fleet_cli_str(ch, "data", "");
            size_t len = json_string_length(json_object_get(ch, "data"));
            FILE *to =
                !strcmp(px__fleet_cli_str(ch, "stream", "stdout"), "stderr") ? stderr : stdout;
            fwrite(data, 1, len, to);
        }
        fflush(stdout);
        json_t *next = json_object_get(reply, "next");
        bool done = json_is_true(json_object_get(reply, "done"));
        bool progressed = json_is_integer(next) && json_integer_value(next) > after;
        if (progressed)
            after = json_integer_value(next);
        size_t n_chunks = json_array_size(chunks);
        json_decref(reply);
        if (atomic_load(&interrupted) || done)
            break;
        /* Without -f: stop once a reply brings nothing new. */
        if (!follow && (!progressed || !n_chunks))
            break;
    }
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    return rc;
}
