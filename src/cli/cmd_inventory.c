/* plexus inventory: read, check, show and export hardware inventories, and
 * list the device catalogue. */
#include "cli/cli.h"
#include "cli/inventory.h"

const char px__cmd_inventory_summary[] =
    "validate, show, export or draw hardware inventories; list the catalogue";

static struct {
    px_cli_format format;
    bool strict;
} I;

static const px_cli_opt validate_opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &I.format, "FORMAT",
               "report format: text (default), json or yaml", .choices = "text|json|yaml"),
    PX_CLI_OPT("strict", 0, PX_CLI_FLAG, &I.strict, NULL, "a warning refuses the file too"),
    {0},
};
static const px_cli_opt doc_opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &I.format, "FORMAT",
               "text (default), json or yaml: the canonical document", .choices = "text|json|yaml"),
    {0},
};
static const px_cli_opt export_opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &I.format, "FORMAT", "json (default) or yaml",
               .choices = "json|yaml"),
    {0},
};
static const px_cli_opt dot_opts[] = {{0}};

static const px_cli_spec validate_spec = {
    .name = "inventory validate",
    .summary = "check files against every rule (exit 3 on a refusal)",
    .synopsis = "[-o text|json|yaml] [--strict] FILE...",
    .about = "Checks each inventory against every rule of plexus.inventory/1\n"
             "(docs/formats/inventory.md) and prints every problem with its JSON pointer, what\n"
             "is wrong and how to fix it.  Exits 3 if any file is refused (with --strict, also\n"
             "for a warning), 1 if one cannot be read.",
    .opts = validate_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = -1,
    .examples = "plexus inventory validate data/scenarios/*.json\n"
                "plexus inventory validate --strict -o json my-cluster.json\n",
};
static const px_cli_spec show_spec = {
    .name = "inventory show",
    .summary = "a table per node: devices, memory, compute, links",
    .synopsis = "FILE [-o text|json|yaml]",
    .about = "Prints a table per node: each device with its class, model, memory, memory\n"
             "bandwidth, bf16 and f32 peak compute and catalogue entry, the node's own memory,\n"
             "then the links.  Emulated hardware is marked.  -o json or yaml prints the\n"
             "canonical document (as plexus inventory export).",
    .opts = doc_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus inventory show data/scenarios/hetero-pair-h100-l4.json\n",
};
static const px_cli_spec export_spec = {
    .name = "inventory export",
    .summary = "the canonical JSON form (sorted, SI units, sources)",
    .synopsis = "FILE [-o json|yaml]",
    .about = "Prints the inventory in canonical form: every list sorted by id, every quantity\n"
             "in SI units with its provenance, catalogue figures written out with their\n"
             "citations.  Equal inventories export byte-identical JSON, and its SHA-256 is the\n"
             "inventory's content id.",
    .opts = export_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus inventory export inv.json | sha256sum   # the content id\n",
};
static const px_cli_spec dot_spec = {
    .name = "inventory dot",
    .summary = "the graph for Graphviz (dot -Tsvg)",
    .synopsis = "FILE",
    .about = "Prints the hardware graph in Graphviz's language: one cluster per node, one box\n"
             "per device, one edge per link labelled with its kind and bandwidth.",
    .opts = dot_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus inventory dot inv.json | dot -Tsvg > inv.svg   # graphviz package\n"
                "plexus inventory svg inv.json > inv.svg           # without graphviz\n",
};
static const px_cli_spec svg_spec = {
    .name = "inventory svg",
    .summary = "the nodes, devices and links as an SVG picture (no Graphviz needed)",
    .synopsis = "FILE",
    .about = "Prints an SVG picture of the inventory: each node a column of its devices (model,\n"
             "class, memory, peak compute), then every link with its kind and bandwidth.  It\n"
             "needs nothing else installed; `inventory dot` gives Graphviz's language instead.",
    .opts = dot_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus inventory svg data/scenarios/irregular-4dev.json > inv.svg\n",
};
static const px_cli_spec catalog_spec = {
    .name = "inventory catalog",
    .summary = "the built-in device and link catalogue",
    .synopsis = "[-o text|json|yaml]",
    .about = "Lists the built-in catalogue: devices and links whose sourced figures an\n"
             "inventory can name with \"catalog\": \"<id>\".  -o json prints every figure with\n"
             "its provenance and citation.",
    .opts = doc_opts,
    .examples = "plexus inventory catalog\nplexus inventory catalog -o yaml\n",
};
const px_cli_spec *const px__cmd_inventory_specs[] = {&validate_spec,
                                                      &show_spec,
                                                      &export_spec,
                                                      &dot_spec,
                                                      &svg_spec,
                                                      &catalog_spec,
                                                      &px__inventory_discover_spec,
                                                      NULL};

/* Prints JSON text as asked: as it is, or its tree as YAML. */
static int print_text_doc(const char *text, size_t len, px_cli_format format)
{
    if (format != PX_CLI_YAML)
        return fwrite(text, 1, len, stdout) == len ? PX_EXIT_OK : PX_EXIT_FAIL;
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    if (!doc) {
        fprintf(stderr, "plexus inventory: the document cannot be read back: %s\n", je.text);
        return PX_EXIT_FAIL;
    }
    int rc = px__cli_print_doc(doc, format);
    json_decref(doc);
    return rc;
}

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
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&validate_spec, argc, argv, &args, &prc))
        return prc;
    px_cli_format format = I.format;
    bool strict = I.strict;
    int rc = PX_EXIT_OK;
    json_t *results = format != PX_CLI_TEXT ? json_array() : NULL;
    if (format != PX_CLI_TEXT && !results)
        return PX_EXIT_FAIL;
    for (int i = 0; i < args.n; i++) {
        const char *path = args.v[i];
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
        if (format != PX_CLI_TEXT) {
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
        if (px__cli_print_doc(results, format) != PX_EXIT_OK)
            rc = PX_EXIT_FAIL;
        json_decref(results);
    }
    return rc;
}

static int cmd_export(int argc, char **argv)
{
    px_cli_args args;
    int rc;
    I.format = PX_CLI_JSON;
    if (!px__cli_parse(&export_spec, argc, argv, &args, &rc))
        return rc;
    const char *path = args.v[0];
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
    rc = print_text_doc(text, len, I.format);
    free(text);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_show(int argc, char **argv)
{
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&show_spec, argc, argv, &args, &rc))
        return rc;
    if (I.format != PX_CLI_TEXT) {
        char *sub[] = {"export", "-o", I.format == PX_CLI_YAML ? "yaml" : "json", args.v[0], NULL};
        return cmd_export(4, sub);
    }
    const char *path = args.v[0];
    px_hw_graph *g = px__inventory_load("inventory show", path, false);
    if (!g)
        return PX_EXIT_FAIL;
    rc = px__inventory_show(g, stdout);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_dot(int argc, char **argv)
{
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&dot_spec, argc, argv, &args, &rc))
        return rc;
    const char *path = args.v[0];
    px_hw_graph *g = px__inventory_load("inventory dot", path, false);
    if (!g)
        return PX_EXIT_FAIL;
    rc = px__inventory_dot(g, stdout);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_svg(int argc, char **argv)
{
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&svg_spec, argc, argv, &args, &rc))
        return rc;
    px_hw_graph *g = px__inventory_load("inventory svg", args.v[0], false);
    if (!g)
        return PX_EXIT_FAIL;
    rc = px__inventory_svg(g, stdout);
    px_hw_graph_free(g);
    return rc;
}

static int cmd_catalog(int argc, char **argv)
{
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&catalog_spec, argc, argv, &args, &prc))
        return prc;
    px_cli_format format = I.format;
    px_hw_catalog *cat;
    px_err err;
    if (px_hw_catalog_new_builtin(&cat, &err) != PX_OK)
        return px__cli_fail("inventory catalog", &err);
    int rc;
    if (format != PX_CLI_TEXT) {
        char *text;
        size_t len;
        if (px_hw_catalog_export(cat, &text, &len, &err) != PX_OK) {
            px_hw_catalog_free(cat);
            return px__cli_fail("inventory catalog", &err);
        }
        rc = print_text_doc(text, len, format);
        free(text);
    } else {
        rc = px__inventory_catalog_text(cat, stdout);
    }
    px_hw_catalog_free(cat);
    return rc;
}

int px__cmd_inventory(int argc, char **argv)
{
    memset(&I, 0, sizeof I);
    int rc;
    const px_cli_spec *spec = px__cli_action("inventory", px__cmd_inventory_specs, argc, argv, &rc);
    if (!spec)
        return rc;
    if (spec == &validate_spec)
        return cmd_validate(argc - 1, argv + 1);
    if (spec == &show_spec)
        return cmd_show(argc - 1, argv + 1);
    if (spec == &export_spec)
        return cmd_export(argc - 1, argv + 1);
    if (spec == &dot_spec)
        return cmd_dot(argc - 1, argv + 1);
    if (spec == &svg_spec)
        return cmd_svg(argc - 1, argv + 1);
    if (spec == &catalog_spec)
        return cmd_catalog(argc - 1, argv + 1);
    return px__cmd_inventory_discover(argc - 1, argv + 1);
}
