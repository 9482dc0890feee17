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

static px__fleet_cli o;
static bool follow;
static const char *stream;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("follow", 'f', PX_CLI_FLAG, &follow, NULL,
               "follow the output until the job ends (long polling)"),
    PX_CLI_OPT("stream", 0, PX_CLI_CHOICE, &stream, "NAME", "only stdout or stderr",
               .choices = "stdout|stderr"),
    PX__FLEET_CLI_OPTS(o),
    {0},
};
static const px_cli_spec spec = {
    .name = "logs",
    .synopsis = "JOB [-f] [--stream stdout|stderr] [options]",
    .about = "Prints the job's output in order: stdout to stdout, stderr to stderr.  -o json\n"
             "prints one JSON object per chunk (seq, stream, rank, attempt, data); -o yaml\n"
             "one YAML document per chunk.",
    .opts = opts,
    .operands = "JOB",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus logs j-000012\n"
                "plexus logs -f j-000012 --stream stderr   # follow the errors\n",
};
const px_cli_spec *const px__cmd_logs_specs[] = {&spec, NULL};

int px__cmd_logs(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "logs"};
    follow = false;
    stream = NULL;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *id = args.v[0];
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
            if (o.format == PX_CLI_YAML) {
                printf("---\n");
                px__cli_yaml_write(ch, stdout);
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
