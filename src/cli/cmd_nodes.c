/* plexus nodes: the fleet's nodes, their devices, frameworks and load. */
#include "cli/fleet_cli.h"

const char px__cmd_nodes_summary[] =
    "list the fleet's nodes; drain, revoke, admit or rotate the credential of one";

/* The columns of a node's line and of its devices' lines. */
static void print_header(void)
{
    printf("%-20s %-9s %-4s %5s %10s %7s %7s %8s\n", "NODE", "STATE", "EMU", "CPUS", "MEMORY",
           "DEVICES", "RUNNING", "RESIDENT");
    printf("    %-8s %-5s %-8s %-24s %-10s %10s\n", "DEVICE", "CLASS", "VENDOR", "MODEL",
           "CAPABILITY", "MEMORY");
}

static void print_node(const json_t *n)
{
    char mem[32];
    double memory = json_number_value(json_object_get(n, "memory"));
    const json_t *devices = json_object_get(n, "devices");
    const json_t *running = json_object_get(n, "running");
    const json_t *resident = json_object_get(n, "resident");
    printf("%-20s %-9s %-4s %5lld %10s %7zu %7zu %8zu\n", px__fleet_cli_str(n, "id", "?"),
           px__fleet_cli_str(n, "state", "?"),
           json_is_true(json_object_get(n, "emulated")) ? "emu" : "-",
           (long long)json_number_value(json_object_get(n, "cpus")),
           memory > 0 ? px__fleet_cli_bytes(memory, mem, sizeof mem) : "-",
           json_array_size(devices), json_array_size(running), json_array_size(resident));
    size_t i;
    json_t *d;
    json_array_foreach(devices, i, d)
    {
        /* A device without memory of its own (a CPU) or a capability shows
         * "-", not "0 B". */
        const json_t *m = json_object_get(d, "memory");
        char dm[32] = "-";
        if (json_is_number(m) && json_number_value(m) > 0)
            px__fleet_cli_bytes(json_number_value(m), dm, sizeof dm);
        else if (json_is_string(m) && json_string_value(m)[0])
            snprintf(dm, sizeof dm, "%s", json_string_value(m));
        const char *cap = px__fleet_cli_str(d, "capability", "");
        const char *alloc = px__fleet_cli_str(d, "allocated_to", "");
        printf("    %-8s %-5s %-8s %-24s %-10s %10s%s%s\n", px__fleet_cli_str(d, "id", "?"),
               px__fleet_cli_str(d, "class", "-"), px__fleet_cli_str(d, "vendor", "-"),
               px__fleet_cli_str(d, "model", "-"), cap[0] ? cap : "-", dm,
               alloc[0] ? "  used by " : "", alloc);
    }
    const json_t *fw = json_object_get(n, "frameworks");
    if (json_array_size(fw)) {
        printf("    frameworks:");
        json_array_foreach(fw, i, d)
            printf(" %s%s%s", px__fleet_cli_str(d, "name", "?"),
                   json_object_get(d, "version") ? " " : "", px__fleet_cli_str(d, "version", ""));
        printf("\n");
    }
}

static px__fleet_cli o;
static const px_cli_opt opts[] = {PX__FLEET_CLI_OPTS(o), {0}};
static const char nodes_more[] =
    "actions (a user with the admin role only):\n"
    "  drain NODE     the node keeps its work and gets nothing new (undrain NODE)\n"
    "  revoke NODE    the node's credential stops working at once; its work is requeued\n"
    "                 elsewhere and its agent stops; the name cannot join again until\n"
    "                 plexus nodes admit NODE\n"
    "  rotate NODE    the node's agent makes a new credential at its next heartbeat; the\n"
    "                 old one stops working once the new is used";
static const px_cli_spec list_spec = {
    .name = "nodes",
    .synopsis = "[options] | ACTION NODE [options]",
    .about = "Lists the nodes attached to the server: state (online, offline, draining),\n"
             "whether the node is emulated, CPUs, memory, devices with their free memory,\n"
             "installed frameworks, resident models and running work.",
    .opts = opts,
    .examples = "plexus nodes\n"
                "plexus nodes -o yaml\n"
                "plexus nodes drain node-3      # before maintenance; undrain after\n",
    .more = nodes_more,
};
#define NODE_ACTION(var, act, what)                  \
    static const px_cli_spec var = {                 \
        .name = "nodes " act,                        \
        .summary = what,                             \
        .synopsis = "NODE [options]",                \
        .about = what ".",                           \
        .opts = opts,                                \
        .operands = "NODE",                          \
        .min_operands = 1,                           \
        .max_operands = 1,                           \
        .examples = "plexus nodes " act " node-3\n", \
        .more = nodes_more,                          \
    }
NODE_ACTION(drain_spec, "drain", "the node keeps its work and gets nothing new");
NODE_ACTION(undrain_spec, "undrain", "the node takes new work again");
NODE_ACTION(revoke_spec, "revoke",
            "the node's credential stops working and its work is requeued elsewhere");
NODE_ACTION(admit_spec, "admit", "a revoked node's name may join again");
NODE_ACTION(rotate_spec, "rotate", "the node's agent makes a new credential at its next heartbeat");
const px_cli_spec *const px__cmd_nodes_specs[] = {
    &list_spec, &drain_spec, &undrain_spec, &revoke_spec, &admit_spec, &rotate_spec, NULL};

int px__cmd_nodes(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "nodes"};
    const px_cli_spec *spec = &list_spec;
    int prc;
    /* An operand first is an action ("nodes drain NODE"); options first
     * list the nodes. */
    if (argc > 1 && argv[1][0] != '-') {
        if (!(spec = px__cli_action("nodes", px__cmd_nodes_specs + 1, argc, argv, &prc)))
            return prc;
        argc--;
        argv++;
    }
    px_cli_args args;
    if (!px__cli_parse(spec, argc, argv, &args, &prc))
        return prc;
    const char *action = spec == &list_spec ? NULL : strchr(spec->name, ' ') + 1;
    const char *node = args.n ? args.v[0] : NULL;
    if (node && !px__fleet_cli_valid_id(node))
        return px__cli_usage_error("nodes", "\"%s\" is not a node name", node);
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    char path[256];
    if (action)
        snprintf(path, sizeof path, "/v1/nodes/%s/%s", node, action);
    json_t *body = action ? json_object() : NULL;
    json_t *reply =
        px__fleet_cli_get(&o, c, action ? "POST" : "GET", action ? path : "/v1/nodes", body);
    json_decref(body);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (action) {
        if (o.format != PX_CLI_TEXT)
            rc = px__fleet_cli_print(&o, reply);
        else if (!strcmp(action, "rotate"))
            printf("node %s: its agent makes a new credential at its next heartbeat\n", node);
        else if (!strcmp(action, "revoke"))
            printf("node %s revoked: its credential no longer works and its work was requeued\n",
                   node);
        else if (!strcmp(action, "admit"))
            printf("node %s may join again\n", node);
        else
            printf("node %s %s\n", node, px__fleet_cli_str(reply, "state", action));
    } else if (o.format != PX_CLI_TEXT) {
        rc = px__fleet_cli_print(&o, reply);
    } else {
        const json_t *nodes = json_object_get(reply, "nodes");
        if (!json_array_size(nodes))
            printf("no nodes are attached; start one with `plexus agent --server URL "
                   "--join-token-file F`\n");
        if (json_array_size(nodes))
            print_header();
        size_t i;
        json_t *n;
        json_array_foreach(nodes, i, n) print_node(n);
    }
    json_decref(reply);
    return rc;
}
