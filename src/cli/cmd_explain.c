/* plexus explain: why a job was placed where it was, and why not elsewhere. */
#include "cli/fleet_cli.h"

const char px__cmd_explain_summary[] =
    "explain a job's placement: each requirement, each rejected node, the scores";

static void print_explanation(const json_t *e)
{
    printf("job %s, attempt %lld, decided %s\n", px__fleet_cli_str(e, "job", "?"),
           (long long)json_integer_value(json_object_get(e, "attempt")),
           px__fleet_cli_str(e, "at", "-"));
    long long considered = json_integer_value(json_object_get(e, "nodes_considered"));
    printf("nodes considered: %lld\n", considered);
    size_t i;
    json_t *it;
    const json_t *reqs = json_object_get(e, "requirements");
    if (json_array_size(reqs)) {
        printf("\nrequirements                                   nodes meeting it\n");
        json_array_foreach(reqs, i, it)
            printf("  %-44s %lld of %lld\n", px__fleet_cli_str(it, "requirement", "?"),
                   (long long)json_integer_value(json_object_get(it, "nodes_meeting")), considered);
    }
    const json_t *rejected = json_object_get(e, "rejected");
    if (json_array_size(rejected)) {
        printf("\nrejected nodes\n");
        json_array_foreach(rejected, i, it)
        {
            printf("  %-20s %-18s %s\n", px__fleet_cli_str(it, "node", "?"),
                   px__fleet_cli_str(it, "reason", "?"), px__fleet_cli_str(it, "detail", ""));
            /* Every other requirement the node fails, under its first. */
            size_t k;
            json_t *f;
            json_array_foreach(json_object_get(it, "failing"), k, f)
            {
                if (k > 0)
                    printf("  %-20s %-18s %s\n", "", px__fleet_cli_str(f, "reason", "?"),
                           px__fleet_cli_str(f, "detail", ""));
            }
        }
        long long more = json_integer_value(json_object_get(e, "rejected_more"));
        if (more > 0)
            printf("  ... and %lld more\n", more);
    }
    const json_t *scored = json_object_get(e, "scored");
    if (json_array_size(scored)) {
        printf("\ntop nodes             score  headroom locality  load topology  devices\n");
        json_array_foreach(scored, i, it)
        {
            px_strbuf devs = PX_STRBUF_INIT;
            size_t k;
            json_t *d;
            json_array_foreach(json_object_get(it, "devices"), k, d) px_strbuf_addf(
                &devs, "%s%s", k ? "," : "", json_string_value(d) ? json_string_value(d) : "?");
            printf("  %-16s %9.1f  %8.2f %8.2f %5.2f %8.2f  %s\n",
                   px__fleet_cli_str(it, "node", "?"),
                   json_number_value(json_object_get(it, "score")),
                   json_number_value(json_object_get(it, "headroom")),
                   json_number_value(json_object_get(it, "locality")),
                   json_number_value(json_object_get(it, "load")),
                   json_number_value(json_object_get(it, "topology")), devs.len ? devs.buf : "-");
            px_strbuf_release(&devs);
        }
    }
    const json_t *d = json_object_get(e, "decision");
    printf("\ndecision: %s\n",
           px__fleet_cli_str(d, "summary",
                             json_is_true(json_object_get(d, "placed")) ? "placed" : "not placed"));
    const json_t *plan = json_object_get(e, "plan");
    if (plan && !json_is_null(plan)) {
        const char *status = px__fleet_cli_str(plan, "status", NULL);
        if (status)
            printf("plan: %s\n", status);
        else
            printf("plan: kept with the job (plexus explain -o json shows it)\n");
    }
}

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const px_cli_spec spec = {
    .name = "explain",
    .synopsis = "JOB [options]",
    .about = "Prints the scheduler's record of its latest decision for the job: each\n"
             "requirement with how many nodes meet it, each rejected node with every\n"
             "requirement it fails (framework, version, GPU count, GPU memory with the\n"
             "numbers, vendor, capability, offline, draining, CPUs, memory), the top scored\n"
             "nodes with each score term, and the decision.",
    .opts = opts,
    .operands = "JOB",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus explain j-000012\n"
                "plexus explain j-000012 -o yaml\n",
};
const px_cli_spec *const px__cmd_explain_specs[] = {&spec, NULL};

int px__cmd_explain(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "explain"};
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *id = args.v[0];
    if (!px__fleet_cli_valid_id(id))
        return px__cli_usage_error("explain", "\"%s\" is not a job id (e.g. j-000012)", id);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else
        print_explanation(reply);
    json_decref(reply);
    return rc;
}
