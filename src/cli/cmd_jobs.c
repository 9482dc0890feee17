/* plexus jobs: list jobs, or show one. */
#include "cli/fleet_cli.h"

const char px__cmd_jobs_summary[] = "list the fleet's jobs, or show one job";

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
static void print_plan(const json_t *entry)
{
    if (!json_is_object(entry))
        return;
    /* The server keeps {"status", "plan": the plan document} or, when no
     * plan could be made, {"status", "detail"}. */
    const char *status = px__fleet_cli_str(entry, "status", "");
    const json_t *plan = json_object_get(entry, "plan");
    if (!json_is_object(plan)) {
        char text[512];
        printf("plan      none: %s%s%s\n", status[0] ? status : "not made",
               json_object_get(entry, "detail") ? ": " : "",
               px__fleet_cli_clean(px__fleet_cli_str(entry, "detail", ""), text, sizeof text));
        return;
    }
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

static px__fleet_cli o;
static const char *state;
static uint32_t limit;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("state", 0, PX_CLI_CHOICE, &state, "STATE",
               "only jobs in this state (active: the first three)",
               .choices = "queued|assigned|running|succeeded|failed|cancelled|active"),
    PX_CLI_OPT("limit", 0, PX_CLI_U32, &limit, "N", "at most N jobs (default 100)", .lo = 1,
               .hi = 1000),
    PX__FLEET_CLI_OPTS(o),
    {0},
};
static const px_cli_spec spec = {
    .name = "jobs",
    .synopsis = "[JOB] [--state STATE] [--limit N] [options]",
    .about = "Lists jobs, newest first.  With a job id, shows that job: its members, nodes\n"
             "and devices, exit status, result or error, restarts, and the plan it was\n"
             "given (stages on the devices of each replica, predictions).",
    .opts = opts,
    .operands = "JOB",
    .min_operands = 0,
    .max_operands = 1,
    .examples = "plexus jobs --state active\n"
                "plexus jobs j-000012            # one job with its plan\n"
                "plexus jobs j-000012 -o yaml\n",
};
const px_cli_spec *const px__cmd_jobs_specs[] = {&spec, NULL};

int px__cmd_jobs(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "jobs"};
    state = NULL;
    limit = 100;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *id = args.n ? args.v[0] : NULL;
    if (id && !px__fleet_cli_valid_id(id))
        return px__cli_usage_error("jobs", "\"%s\" is not a job id (e.g. j-000012)", id);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    if (id)
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
    else
        snprintf(path, sizeof path, "/v1/jobs?limit=%u%s%s", limit, state ? "&state=" : "",
                 state ? state : "");
    json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT) {
        rc = px__fleet_cli_print(&o, reply);
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
