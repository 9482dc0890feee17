/* plexus inventory: read, check, show and export hardware inventories, and
 * list the device catalogue. */
#include "cli/cli.h"
#include "cli/inventory.h"

const char px__cmd_inventory_summary[] =
    "validate, show, export or draw hardware inventories; list the catalogue";

static const char usage_text[] =
    "usage: plexus inventory <subcommand> [options]\n"
    "\n"
    "Hardware inventories (plexus.inventory/1, docs/formats/inventory.md)\n"
    "describe nodes, devices, memory tiers, links and domains.\n"
    "\n"
    "subcommands:\n"
    "  validate FILE...   check files against every rule; exit 1 on any error\n"
    "  show FILE          a table per node: devices, memory, compute, links\n"
    "  export FILE        the canonical JSON form (sorted, SI units, sources)\n"
    "  dot FILE           the graph for Graphviz (dot -Tsvg)\n"
    "  catalog            the built-in device and link catalogue\n"
    "  discover           describe this machine as an inventory\n"
    "\n"
    "run 'plexus inventory <subcommand> --help' for a subcommand's options.\n";

/* Reads one inventory, printing its diagnostics to stderr when it fails.
 * Returns the graph or NULL. */
px_hw_graph *px__inventory_load(const char *cmd, const char *path, bool strict)
{
    px_diags diags;
    px_diags_init(&diags);
    px_hw_read_options opt = {.strict = strict};
    px_hw_graph *g = NULL;
    px_err err;
    px_err_clear(&err);
    px_status st = px_hw_graph_load(path, &opt, &g, &diags, &err);
    if (st != PX_OK) {
        char *report = px_diags_format(&diags, path);
        if (report && report[0])
            fputs(report, stderr);
        else
            fprintf(stderr, "plexus %s: %s\n", cmd, err.msg);
        free(report);
        fprintf(stderr,
                "plexus %s: %s is not a usable inventory; run 'plexus inventory "
                "validate %s' for every problem\n",
                cmd, path, path);
    }
    px_diags_release(&diags);
    return g;
}

static int cmd_validate(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus inventory validate [-o text|json] [--strict] FILE...\n\n"
               "Checks each inventory against every rule of plexus.inventory/1 and prints\n"
               "every problem with its JSON pointer, what is wrong and how to fix it.\n"
               "Exits 1 if any file has an error (with --strict, also a warning).\n");
        return PX_EXIT_OK;
    }
    px_cli_format format = PX_CLI_TEXT;
    bool strict = false;
    int first = 1;
    for (; first < argc; first++) {
        if (!strcmp(argv[first], "-o") || !strcmp(argv[first], "--output")) {
            if (first + 1 >= argc)
                return px__cli_usage_error("inventory validate", "-o needs text or json");
            if (!px__cli_parse_format("inventory validate", argv[++first], &format))
                return PX_EXIT_USAGE;
        } else if (!strcmp(argv[first], "--strict")) {
            strict = true;
        } else if (!strcmp(argv[first], "--")) {
            first++;
            break;
        } else if (argv[first][0] == '-' && argv[first][1]) {
            return px__cli_usage_error("inventory validate", "unknown option \"%s\"", argv[first]);
        } else {
            break;
        }
    }
    if (first >= argc)
        return px__cli_usage_error("inventory validate", "give at least one FILE");
    int rc = PX_EXIT_OK;
    json_t *results = format == PX_CLI_JSON ? json_array() : NULL;
    if (format == PX_CLI_JSON && !results)
        return PX_EXIT_FAIL;
    for (int i = first; i < argc; i++) {
        const char *path = argv[i];
        px_diags diags;
        px_diags_init(&diags);
        px_hw_read_options opt = {.strict = strict};
        px_hw_graph *g = NULL;
        px_err err;
        px_err_clear(&err);
        px_status st = px_hw_graph_load(path, &opt, &g, &diags, &err);
        if (st != PX_OK) /* read but refused: a verdict; unreadable: an error */
            rc = st != PX_EIO && st != PX_ENOTFOUND && rc != PX_EXIT_FAIL ? PX_EXIT_VERDICT
                                                                          : PX_EXIT_FAIL;
        if (format == PX_CLI_JSON) {
            json_t *r =
                json_pack("{s:s, s:b, s:I, s:I, s:o}", "file", path, "ok", st == PX_OK, "errors",
                          (json_int_t)diags.n_errors, "warnings", (json_int_t)diags.n_warnings,
                          "diagnostics", px_diags_to_json(&diags));
            if (r && g) {
                const px_hw_view *v = px_hw_graph_view(g);
                json_object_set_new(r, "nodes", json_integer((json_int_t)v->n_nodes));
                json_object_set_new(r, "devices", json_integer((json_int_t)v->n_devices));
                json_object_set_new(r, "links", json_integer((json_int_t)v->n_links));
            }
            if (px_json_push(results, r) != PX_OK)
                rc = PX_EXIT_FAIL;
        } else {
            char *report = px_diags_format(&diags, path);
            if (report)
                fputs(report, stdout);
            free(report);
            if (g) {
                const px_hw_view *v = px_hw_graph_view(g);
                printf("%s: ok: %zu node%s, %zu device%s, %zu directional link%s%s%s\n", path,
                       v->n_nodes, v->n_nodes == 1 ? "" : "s", v->n_devices,
                       v->n_devices == 1 ? "" : "s", v->n_links, v->n_links == 1 ? "" : "s",
                       diags.n_warnings ? ", warnings above" : "",
                       v->emulated ? " (emulated)" : "");
            } else if (!diags.n) {
                printf("%s: %s\n", path, err.msg);
            } else {
                printf("%s: refused: %zu error%s, %zu warning%s\n", path, diags.n_errors,
                       diags.n_errors == 1 ? "" : "s", diags.n_warnings,
                       diags.n_warnings == 1 ? "" : "s");
            }
        }
        px_hw_graph_free(g);
        px_diags_release(&diags);
    }
    if (results) {
        if (px__cli_print_json(results) != PX_EXIT_OK)
            rc = PX_EXIT_FAIL;
        json_decref(results);
    }
    return rc;
}

/* Parses "[options] FILE" for the subcommands that take one inventory. */
static int one_file(int argc, char **argv, const char *cmd, const char **path)
{
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--") && i + 1 < argc && !*path) {
            *path = argv[i + 1];
            i++;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return px__cli_usage_error(cmd, "unknown option \"%s\"", argv[i]);
        } else if (*path) {
            return px__cli_usage_error(cmd, "one FILE only (\"%s\" is extra)", argv[i]);
        } else {
            *path = argv[i];
        }
    }
    if (!*path)
        return px__cli_usage_error(cmd, "give an inventory FILE");
    return PX_EXIT_OK;
}

static int cmd_export(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus inventory export FILE\n\n"
               "Prints the inventory in canonical form: every list sorted by id, every\n"
               "quantity in SI units with its provenance, catalogue figures written out\n"
               "with their citations.  Equal inventories export byte-identical text, and\n"
               "its SHA-256 is the inventory's content id.\n");
        return PX_EXIT_OK;
    }
    const char *path;
    int rc = one_file(argc, argv, "inventory export", &path);
    if (rc != PX_EXIT_OK)
        return rc;
    px_hw_graph *g = px__inventory_load("inventory export", path, false);
    if (!g)
        return PX_EXIT_FAIL;
    char *text;
    size_t len;
    px_err err;
    if (px_hw_graph_export(g, &text, &len, &err) != PX_OK) {
        px_hw_graph_free(g);
        return px__cli_fail("inventory export", &err);
    }
    rc = fwrite(text, 1, len, stdout) == len ? PX_EXIT_OK : PX_EXIT_FAIL;
    free(text);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_show(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus inventory show FILE\n\n"
               "Prints a table per node: each device with its class, model, memory,\n"
               "memory bandwidth, bf16 and f32 peak compute and catalogue entry, the\n"
               "node's own memory, then the links.  Emulated hardware is marked.\n");
        return PX_EXIT_OK;
    }
    const char *path;
    int rc = one_file(argc, argv, "inventory show", &path);
    if (rc != PX_EXIT_OK)
        return rc;
    px_hw_graph *g = px__inventory_load("inventory show", path, false);
    if (!g)
        return PX_EXIT_FAIL;
    rc = px__inventory_show(g, stdout);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_dot(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus inventory dot FILE\n\n"
               "Prints the hardware graph in Graphviz's language: one cluster per node,\n"
               "one box per device, one edge per link labelled with its kind and\n"
               "bandwidth.  Render it with `dot -Tsvg`.\n");
        return PX_EXIT_OK;
    }
    const char *path;
    int rc = one_file(argc, argv, "inventory dot", &path);
    if (rc != PX_EXIT_OK)
        return rc;
    px_hw_graph *g = px__inventory_load("inventory dot", path, false);
    if (!g)
        return PX_EXIT_FAIL;
    rc = px__inventory_dot(g, stdout);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_catalog(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus inventory catalog [-o text|json]\n\n"
               "Lists the built-in catalogue: devices and links whose sourced figures an\n"
               "inventory can name with \"catalog\": \"<id>\".  -o json prints every figure\n"
               "with its provenance and citation.\n");
        return PX_EXIT_OK;
    }
    px_cli_format format = PX_CLI_TEXT;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
            if (!px__cli_parse_format("inventory catalog", argv[++i], &format))
                return PX_EXIT_USAGE;
        } else {
            return px__cli_usage_error("inventory catalog", "unexpected argument \"%s\"", argv[i]);
        }
    }
    px_hw_catalog *cat;
    px_err err;
    if (px_hw_catalog_new_builtin(&cat, &err) != PX_OK)
        return px__cli_fail("inventory catalog", &err);
    int rc;
    if (format == PX_CLI_JSON) {
        char *text;
        size_t len;
        if (px_hw_catalog_export(cat, &text, &len, &err) != PX_OK) {
            px_hw_catalog_free(cat);
            return px__cli_fail("inventory catalog", &err);
        }
        rc = fwrite(text, 1, len, stdout) == len ? PX_EXIT_OK : PX_EXIT_FAIL;
        free(text);
    } else {
        rc = px__inventory_catalog_text(cat, stdout);
    }
    px_hw_catalog_free(cat);
    return rc;
}

int px__cmd_inventory(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return PX_EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        fputs(usage_text, stdout);
        return PX_EXIT_OK;
    }
    if (!strcmp(sub, "validate"))
        return cmd_validate(argc - 1, argv + 1);
    if (!strcmp(sub, "show"))
        return cmd_show(argc - 1, argv + 1);
    if (!strcmp(sub, "export"))
        return cmd_export(argc - 1, argv + 1);
    if (!strcmp(sub, "dot"))
        return cmd_dot(argc - 1, argv + 1);
    if (!strcmp(sub, "catalog"))
        return cmd_catalog(argc - 1, argv + 1);
    if (!strcmp(sub, "discover"))
        return px__cmd_inventory_discover(argc - 1, argv + 1);
    fprintf(stderr, "plexus inventory: unknown subcommand \"%s\"\n\n", sub);
    fputs(usage_text, stderr);
    return PX_EXIT_USAGE;
}
