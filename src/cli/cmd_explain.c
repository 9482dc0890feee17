/* plexus explain: why a job was placed where it was, and why not elsewhere;
 * or a deployment's plan, state and incidents. */
#include "cli/fleet_cli.h"

const char px__cmd_explain_summary[] =
    "explain a job's placement, or a deployment's plan, state and incidents";

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

/* Whether id is a job id: "j-" and digits. */
static bool is_job_id(const char *id)
{
    if (strncmp(id, "j-", 2) != 0 || !id[2])
        return false;
    for (const char *c = id + 2; *c; c++)
        if (*c < '0' || *c > '9')
            return false;
    return true;
}

static void print_deployment(const json_t *d)
{
    const json_t *spec = json_object_get(d, "spec");
    printf("deployment %s, state %s, owner %s\n", px__fleet_cli_str(d, "name", "?"),
           px__fleet_cli_str(d, "state", "?"), px__fleet_cli_str(d, "owner", "-"));
    printf("model %s%s%s%s\n", px__fleet_cli_str(d, "model", "?"),
           json_object_get(json_object_get(spec, "model"), "name") ? " (" : "",
           px__fleet_cli_str(json_object_get(spec, "model"), "name", ""),
           json_object_get(json_object_get(spec, "model"), "name") ? ")" : "");
    printf("asked for: objective %s, contract %s, %lld replica%s\n",
           px__fleet_cli_str(spec, "objective", "latency"),
           json_is_string(json_object_get(spec, "contract"))
               ? json_string_value(json_object_get(spec, "contract"))
           : json_object_get(spec, "contract") ? "(document)"
                                               : "implied",
           (long long)json_integer_value(json_object_get(spec, "replicas")),
           json_integer_value(json_object_get(spec, "replicas")) == 1 ? "" : "s");
    const json_t *plan = json_object_get(d, "plan");
    size_t i;
    json_t *a;
    printf("\nstages                    node                 layers   devices\n");
    json_array_foreach(json_object_get(plan, "assignment"), i, a)
    {
        px_strbuf devs = PX_STRBUF_INIT;
        printf("  replica %lld stage %-8lld %-20s %3lld-%-3lld  %s\n",
               (long long)json_integer_value(json_object_get(a, "replica")),
               (long long)json_integer_value(json_object_get(a, "stage")),
               px__fleet_cli_str(a, "node", "?"),
               (long long)json_integer_value(json_object_get(a, "first_layer")),
               (long long)json_integer_value(json_object_get(a, "last_layer")),
               px__fleet_cli_join(json_object_get(a, "devices"), &devs));
        px_strbuf_release(&devs);
    }
    px_strbuf held = PX_STRBUF_INIT, nodes = PX_STRBUF_INIT;
    printf("model resident on: %s (of %s)\n",
           px__fleet_cli_join(json_object_get(d, "model_resident_on"), &held),
           px__fleet_cli_join(json_object_get(d, "nodes"), &nodes));
    px_strbuf_release(&held);
    px_strbuf_release(&nodes);
    const json_t *residency = json_object_get(plan, "residency");
    if (residency) {
        char why[480];
        printf("\nplaced on %s: %s\n", px__fleet_cli_str(residency, "placed_on", "?"),
               px__fleet_cli_clean(px__fleet_cli_str(residency, "why", ""), why, sizeof why));
    }
    const char *report = px__fleet_cli_str(plan, "report", NULL);
    if (report) {
        size_t n = strlen(report) + 1;
        char *clean = malloc(n);
        if (clean)
            printf("\nplan\n%s", px__fleet_cli_clean(report, clean, n));
        free(clean);
    }
    const json_t *evictions = json_object_get(d, "evictions");
    if (json_array_size(evictions)) {
        printf("\ncache evictions for this model:\n");
        json_array_foreach(evictions, i, a)
        {
            char why[400];
            printf("  %s\n", px__fleet_cli_clean(px__fleet_cli_str(a, "why", ""), why, sizeof why));
        }
    }
    const json_t *serving = json_object_get(d, "serving");
    if (serving) {
        char detail[480];
        printf(
            "\nfront end: %s%s%s\n", px__fleet_cli_str(serving, "state", "?"),
            px__fleet_cli_str(serving, "detail", "")[0] ? ": " : "",
            px__fleet_cli_clean(px__fleet_cli_str(serving, "detail", ""), detail, sizeof detail));
        printf("stage workers now      node                 state      address\n");
        json_array_foreach(json_object_get(serving, "stage_workers"), i, a)
        {
            printf("  stage %-15lld %-20s %-10s %s\n",
                   (long long)json_integer_value(json_object_get(a, "stage")),
                   px__fleet_cli_str(a, "node", "?"), px__fleet_cli_str(a, "state", "?"),
                   px__fleet_cli_str(a, "address", ""));
        }
    }
    const json_t *incidents = json_object_get(d, "incidents");
    printf("\nincidents: %s\n", json_array_size(incidents) ? "" : "none");
    json_array_foreach(incidents, i, a)
    {
        char detail[400];
        if (json_object_get(a, "localization")) {
            /* A record of the healing loop: what failed where, what was
             * done, how long serving was interrupted. */
            const json_t *loc = json_object_get(a, "localization");
            const json_t *choice = json_object_get(a, "choice");
            const json_t *rto = json_object_get(a, "rto_s");
            printf("  %s %s: %s at %s; %s (%s); RTO %s%.3f s; %s\n",
                   px__fleet_cli_str(a, "id", "-"), px__fleet_cli_str(a, "kind", "?"),
                   px__fleet_cli_str(json_object_get(a, "signature"), "class", "?"),
                   px__fleet_cli_str(loc, "device", "?"), px__fleet_cli_str(choice, "action", "?"),
                   px__fleet_cli_str(choice, "label", ""), json_is_number(rto) ? "" : "unknown ",
                   json_is_number(rto) ? json_number_value(rto) : 0.0,
                   px__fleet_cli_str(a, "outcome", "open"));
            continue;
        }
        printf("  %s %s: %s\n", px__fleet_cli_str(a, "at", "-"), px__fleet_cli_str(a, "kind", "?"),
               px__fleet_cli_clean(px__fleet_cli_str(a, "detail", ""), detail, sizeof detail));
    }
}

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const px_cli_spec spec = {
    .name = "explain",
    .synopsis = "JOB|DEPLOYMENT [options]",
    .about = "Prints the scheduler's record of its latest decision for the job: each\n"
             "requirement with how many nodes meet it, each rejected node with every\n"
             "requirement it fails (framework, version, GPU count, GPU memory with the\n"
             "numbers, vendor, capability, offline, draining, CPUs, memory), the top scored\n"
             "nodes with each score term, and the decision.\n"
             "\n"
             "For a deployment (a name that is not a job id): its state, the node of each\n"
             "stage, the planner's report (predictions, what binds, the rejected\n"
             "alternatives) and its incidents.",
    .opts = opts,
    .operands = "JOB|DEPLOYMENT",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus explain j-000012\n"
                "plexus explain j-000012 -o yaml\n"
                "plexus explain llama-chat        # a deployment\n",
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
        return px__cli_usage_error(
            "explain", "\"%s\" is neither a job id (e.g. j-000012) nor a deployment's name", id);
    bool job = is_job_id(id);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    snprintf(path, sizeof path, job ? "/v1/jobs/%s/explain" : "/v1/deployments/%s", id);
    json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else if (job)
        print_explanation(reply);
    else
        print_deployment(reply);
    json_decref(reply);
    return rc;
}
