/* plexus deploy: serve a model across the fleet under a name. */
#include "cli/fleet_cli.h"

#include <unistd.h>

const char px__cmd_deploy_summary[] =
    "deploy a model across the fleet's devices under a name (planned by the server)";

/* The "contract" member: a file's document, else a built-in's name. */
static json_t *contract_member(const char *spec)
{
    if (access(spec, F_OK) != 0)
        return json_string(spec);
    json_t *doc = NULL;
    px_err err;
    if (px_json_load_file(spec, NULL, &doc, &err) != PX_OK) {
        fprintf(stderr, "plexus deploy: --contract %s: %s\n", spec, err.msg);
        return NULL;
    }
    return doc;
}

static void print_deployment(const json_t *d)
{
    printf("deployment %s planned: %lld stage%s on %zu node%s, %lld replica%s; %s\n",
           px__fleet_cli_str(d, "name", "?"),
           (long long)json_integer_value(json_object_get(d, "stages")),
           json_integer_value(json_object_get(d, "stages")) == 1 ? "" : "s",
           json_array_size(json_object_get(d, "nodes")),
           json_array_size(json_object_get(d, "nodes")) == 1 ? "" : "s",
           (long long)json_integer_value(json_object_get(d, "replicas")),
           json_integer_value(json_object_get(d, "replicas")) == 1 ? "" : "s",
           !strcmp(px__fleet_cli_str(d, "state", ""), "resident")
               ? "the model is resident on every node of the plan"
               : "its nodes fetch the model from the server");
    const char *report = px__fleet_cli_str(json_object_get(d, "plan"), "report", NULL);
    if (report) {
        char *clean = malloc(strlen(report) + 1);
        if (clean)
            fputs(px__fleet_cli_clean(report, clean, strlen(report) + 1), stdout);
        free(clean);
    }
}

static px__fleet_cli o;
static const char *model, *name, *objective, *contract, *policy;
static uint32_t replicas;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &model, "FILE|DIGEST",
               "GGUF or llama2.c file (uploaded), or a blob's digest", .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("name", 0, PX_CLI_STR, &name, "NAME",
               "1 to 64 of A-Z a-z 0-9 _ . @ -, unique in the fleet", .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("objective", 0, PX_CLI_STR, &objective, "NAME",
               "latency (default), ttft, throughput, tokens_per_dollar,\njoules_per_token"),
    PX_CLI_OPT("contract", 0, PX_CLI_STR, &contract, "FILE|NAME",
               "numerical contract: a file or strict, deterministic,\n"
               "relaxed (default: stored precision, deterministic)"),
    PX_CLI_OPT("policy", 0, PX_CLI_CHOICE, &policy, "NAME",
               "plexus (default) or a baseline: llamacpp, exo, gpustack,\nsingle-type",
               .choices = "plexus|llamacpp|exo|gpustack|single-type"),
    PX_CLI_OPT("replicas", 0, PX_CLI_U32, &replicas, "N",
               "replicas the plan must offer (default 1)", .lo = 1, .hi = 64),
    PX__FLEET_CLI_OPTS(o),
    {0},
};
static const px_cli_spec spec = {
    .name = "deploy",
    .synopsis = "--model FILE|DIGEST --name NAME [options]",
    .about = "Uploads the model (a file) or names one the server has (its SHA-256), and asks\n"
             "the server to plan it over the online nodes' devices: the stages, the node of\n"
             "each, the predictions and the rejected alternatives, the same report as plexus\n"
             "plan.  The deployment keeps its plan; plexus deployments lists them, plexus\n"
             "explain NAME shows one, plexus undeploy NAME ends it.",
    .opts = opts,
    .examples = "plexus deploy --model stories260K.gguf --name tiny-chat\n"
                "plexus deploy -m llama.gguf --name llama --objective throughput --replicas 2\n",
};
const px_cli_spec *const px__cmd_deploy_specs[] = {&spec, NULL};

int px__cmd_deploy(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "deploy"};
    model = name = objective = contract = policy = NULL;
    replicas = 1;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    json_t *body = json_pack("{s:s, s:i}", "name", name, "replicas", (int)replicas);
    if (objective)
        json_object_set_new(body, "objective", json_string(objective));
    if (policy)
        json_object_set_new(body, "policy", json_string(policy));
    if (contract) {
        json_t *c = contract_member(contract);
        if (!c) {
            json_decref(body);
            return PX_EXIT_FAIL;
        }
        json_object_set_new(body, "contract", c);
    }
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c) {
        json_decref(body);
        return PX_EXIT_FAIL;
    }
    json_t *m = px__fleet_cli_model(&o, c, model);
    json_t *reply = NULL;
    if (m) {
        json_object_set_new(body, "model", m);
        reply = px__fleet_cli_get(&o, c, "POST", "/v1/deployments", body);
    }
    json_decref(body);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else
        print_deployment(reply);
    json_decref(reply);
    return rc;
}
