/* plexus deploy: serve a model across the fleet under a name. */
#include "cli/fleet_cli.h"

#include <unistd.h>

const char px__cmd_deploy_summary[] =
    "deploy a model across the fleet's devices under a name (planned by the server)";

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus deploy --model FILE|DIGEST --name NAME [--objective NAME]\n"
               "                     [--contract FILE|NAME] [--policy NAME] [--replicas N]\n"
               "                     [--server URL] [--token-file F] [-o text|json]\n"
               "\n"
               "Uploads the model (a file) or names one the server has (its SHA-256), and\n"
               "asks the server to plan it over the online nodes' devices: the stages, the\n"
               "node of each, the predictions and the rejected alternatives, the same report\n"
               "as `plexus plan`.  The deployment keeps its plan; `plexus deployments` lists\n"
               "them, `plexus explain NAME` shows one, `plexus undeploy NAME` ends it.\n"
               "\n"
               "  --model FILE|DIGEST    GGUF or llama2.c file (uploaded), or a blob's digest\n"
               "  --name NAME            1 to 64 of A-Z a-z 0-9 _ . @ -, unique in the fleet\n"
               "  --objective NAME       latency (default), ttft, throughput,\n"
               "                         tokens_per_dollar, joules_per_token\n"
               "  --contract FILE|NAME   numerical contract: a file or strict, deterministic,\n"
               "                         relaxed (default: stored precision, deterministic)\n"
               "  --policy NAME          plexus (default) or a baseline: llamacpp, exo,\n"
               "                         gpustack, single-type\n"
               "  --replicas N           replicas the plan must offer (default 1)\n");
}

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

int px__cmd_deploy(int argc, char **argv)
{
    px__fleet_cli o = {.cmd = "deploy"};
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    const char *model = NULL, *name = NULL, *objective = NULL, *contract = NULL, *policy = NULL;
    long replicas = 1;
    for (int i = 1; i < argc; i++) {
        int r = px__fleet_cli_common(&o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        const char **dest = !strcmp(argv[i], "--model")       ? &model
                            : !strcmp(argv[i], "--name")      ? &name
                            : !strcmp(argv[i], "--objective") ? &objective
                            : !strcmp(argv[i], "--contract")  ? &contract
                            : !strcmp(argv[i], "--policy")    ? &policy
                                                              : NULL;
        if (dest) {
            if (!(*dest = px__fleet_cli_value(&o, argc, argv, &i)))
                return PX_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--replicas")) {
            const char *v = px__fleet_cli_value(&o, argc, argv, &i);
            char *end;
            if (!v)
                return PX_EXIT_USAGE;
            replicas = strtol(v, &end, 10);
            if (*end || end == v || replicas < 1 || replicas > 64)
                return px__cli_usage_error("deploy",
                                           "--replicas takes a whole number from 1 to 64, not "
                                           "\"%s\"",
                                           v);
        } else {
            return px__cli_usage_error("deploy", "unexpected argument \"%s\"", argv[i]);
        }
    }
    if (!model || !name)
        return px__cli_usage_error("deploy", "give --model FILE|DIGEST and --name NAME");
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
    if (o.format == PX_CLI_JSON)
        rc = px__cli_print_json(reply);
    else
        print_deployment(reply);
    json_decref(reply);
    return rc;
}
