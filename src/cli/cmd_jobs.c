/* plexus jobs: list jobs, or show one. */
#include "cli/fleet_cli.h"

const char px__cmd_jobs_summary[] = "list the fleet's jobs, or show one job";

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus jobs [--state S] [--limit N] [--server URL] [--token-file F] [-o "
               "text|json]\n"
               "       plexus jobs JOB [-o text|json]\n"
               "\n"
               "Lists jobs, newest first; --state filters (queued, assigned, running,\n"
               "succeeded, failed, cancelled, or active for the first three).  With a job\n"
               "id, shows that job: its members, nodes and devices, exit status, result\n"
               "or error, restarts and plan.\n");
}

static void print_summary_row(const json_t *j)
{
    px_strbuf nodes = PX_STRBUF_INIT;
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(j, "nodes"), i, n) px_strbuf_addf(
        &nodes, "%s%s", i ? "," : "", json_string_value(n) ? json_string_value(n) : "?");
    json_t *ec = json_object_get(j, "exit_code");
    char exit_text[24] = "-";
    if (json_is_integer(ec))
        snprintf(exit_text, sizeof exit_text, "%lld", (long long)json_integer_value(ec));
    char name[160];
    /* Names are the submitters' text: nothing in them reaches the
     * terminal as a control sequence. */
    printf("%-12s %-20.20s %-10s %7lld  %-5s %s\n", px__fleet_cli_str(j, "id", "?"),
           px__fleet_cli_clean(px__fleet_cli_str(j, "name", ""), name, sizeof name),
           px__fleet_cli_str(j, "state", "?"),
           (long long)json_integer_value(json_object_get(j, "attempt")), exit_text,
           nodes.len ? nodes.buf : "-");
    px_strbuf_release(&nodes);
}

/* The plan the scheduler made for the job (--plan auto): its stages on
 * the devices of each replica and what it predicts. */
static void print_plan(const json_t *plan)
{
    if (!json_is_object(plan))
        return;
    const char *id = px__fleet_cli_str(plan, "id", "?");
    const json_t *replicas = json_object_get(plan, "replicas");
    printf("plan      %.12s (policy %s, objective %s), %zu replica%s\n", id,
           px__fleet_cli_str(plan, "policy", "?"),
           px__fleet_cli_str(json_object_get(plan, "objective"), "name", "?"),
           json_array_size(replicas), json_array_size(replicas) == 1 ? "" : "s");
    size_t r, k;
    json_t *rep, *st;
    json_array_foreach(replicas, r, rep)
    {
        json_array_foreach(json_object_get(rep, "stages"), k, st)
        {
            px_strbuf devs = PX_STRBUF_INIT;
            size_t d;
            json_t *dv;
            json_array_foreach(json_object_get(st, "devices"), d, dv) px_strbuf_addf(
                &devs, "%s%s", d ? "," : "", json_string_value(dv) ? json_string_value(dv) : "?");
            const json_t *layers = json_object_get(st, "layers");
            printf("          replica %zu stage %zu: layers %lld-%lld on %s\n", r, k,
                   (long long)json_integer_value(json_object_get(layers, "first")),
                   (long long)json_integer_value(json_object_get(layers, "last")),
                   devs.buf ? devs.buf : "?");
            px_strbuf_release(&devs);
        }
    }
    const json_t *pred = json_object_get(plan, "predictions");
    double tps =
        json_number_value(json_object_get(json_object_get(pred, "throughput_tokens_per_s"), "p50"));
    double tpot = json_number_value(json_object_get(json_object_get(pred, "tpot_s"), "p50"));
    if (tps > 0 || tpot > 0)
        printf("          predicted %.4g tokens/s, %.3g ms per token (p50)\n", tps, tpot * 1e3);
}

static void print_job(const json_t *j)
{
    char text[4096];
    printf("job       %s\n", px__fleet_cli_str(j, "id", "?"));
    printf("name      %s\n",
           px__fleet_cli_clean(px__fleet_cli_str(j, "name", ""), text, sizeof text));
    if (json_is_string(json_object_get(j, "owner")))
        printf("owner     %s\n",
               px__fleet_cli_clean(px__fleet_cli_str(j, "owner", ""), text, sizeof text));
    printf("state     %s (attempt %lld, restarts %lld)\n", px__fleet_cli_str(j, "state", "?"),
           (long long)json_integer_value(json_object_get(j, "attempt")),
           (long long)json_integer_value(json_object_get(j, "restarts")));
    printf("created   %s\n", px__fleet_cli_str(j, "created", "-"));
    printf("updated   %s\n", px__fleet_cli_str(j, "updated", "-"));
    json_t *ec = json_object_get(j, "exit_code");
    if (json_is_integer(ec))
        printf("exit      %lld\n", (long long)json_integer_value(ec));
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m)
    {
        px_strbuf devs = PX_STRBUF_INIT;
        size_t k;
        json_t *d;
        json_array_foreach(json_object_get(m, "devices"), k, d) px_strbuf_addf(
            &devs, "%s%s", k ? "," : "", json_string_value(d) ? json_string_value(d) : "?");
        printf("member    rank %lld on %s, devices [%s], %s\n",
               (long long)json_integer_value(json_object_get(m, "rank")),
               px__fleet_cli_str(m, "node", "-"), devs.buf, px__fleet_cli_str(m, "state", "?"));
        px_strbuf_release(&devs);
    }
    json_t *result = json_object_get(j, "result");
    if (result && !json_is_null(result)) {
        char *dump = json_dumps(result, JSON_ENCODE_ANY | JSON_COMPACT);
        printf("result    %s\n", dump ? dump : "?");
        free(dump);
    }
    const char *e = px__fleet_cli_str(j, "error", NULL);
    if (e)
        printf("error     %s\n", px__fleet_cli_clean(e, text, sizeof text));
    print_plan(json_object_get(j, "plan"));
}

int px__cmd_jobs(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "jobs"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    const char *state = NULL, *limit = NULL, *id = NULL;
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--state")) {
            if (!(state = px__fleet_cli_value(&o, argc, argv, &i)))
                return PX_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--limit")) {
            if (!(limit = px__fleet_cli_value(&o, argc, argv, &i)))
                return PX_EXIT_USAGE;
        } else if (argv[i][0] != '-' && !id) {
            id = argv[i];
        } else {
            return px__cli_usage_error("jobs", "unexpected argument \"%s\"", argv[i]);
        }
    }
    if (id && !px__fleet_cli_valid_id(id))
        return px__cli_usage_error("jobs", "\"%s\" is not a job id (e.g. j-000012)", id);
    if (state && !px__fleet_cli_valid_id(state))
        return px__cli_usage_error("jobs", "--state \"%s\" is not a state", state);
    char *endp;
    if (limit && (strtol(limit, &endp, 10) < 1 || *endp))
        return px__cli_usage_error("jobs", "--limit takes a number from 1 to 1000");
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    if (id)
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
    else
        snprintf(path, sizeof path, "/v1/jobs?limit=%s%s%s", limit ? limit : "100",
                 state ? "&state=" : "", state ? state : "");
    json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format == PX_CLI_JSON) {
        rc = px__cli_print_json(reply);
    } else if (id) {
        print_job(reply);
    } else {
        const json_t *jobs = json_object_get(reply, "jobs");
        if (!json_array_size(jobs)) {
            printf("no jobs%s%s\n", state ? " in state " : "", state ? state : "");
        } else {
            printf("%-12s %-20s %-10s %7s  %-5s %s\n", "ID", "NAME", "STATE", "ATTEMPT", "EXIT",
                   "NODES");
            size_t i;
            json_t *j;
            json_array_foreach(jobs, i, j) print_summary_row(j);
        }
    }
    json_decref(reply);
    return rc;
}
