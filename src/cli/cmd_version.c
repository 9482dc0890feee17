/* plexus version: prints the tool's version. */
#include "cli/cli.h"

const char px__cmd_version_summary[] = "print the version of plexus";

static px_cli_format fmt;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &fmt, "FORMAT", "text (default) or json"),
    {0},
};
static const px_cli_spec spec = {
    .name = "version",
    .synopsis = "[-o text|json]",
    .about = "Prints the version of plexus.",
    .opts = opts,
    .examples = "plexus version -o json\n",
};
const px_cli_spec *const px__cmd_version_specs[] = {&spec, NULL};

int px__cmd_version(int argc, char **argv)
{
    fmt = PX_CLI_TEXT;
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc;
    if (fmt == PX_CLI_JSON) {
        json_t *doc = json_pack("{s:s, s:s}", "name", "plexus", "version", px_version());
        rc = doc ? px__cli_print_json(doc) : PX_EXIT_FAIL;
        json_decref(doc);
        return rc;
    }
    printf("plexus %s\n", px_version());
    return PX_EXIT_OK;
}
