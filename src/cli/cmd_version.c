/* plexus version: prints the tool's version. */
#include "cli/cli.h"

const char px__cmd_version_summary[] = "print the version of plexus";

int px__cmd_version(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        printf("usage: plexus version\n\nPrints the version of plexus.\n");
        return PX_EXIT_OK;
    }
    if (argc > 1)
        return px__cli_usage_error("version", "unexpected argument \"%s\"", argv[1]);
    printf("plexus %s\n", px_version());
    return PX_EXIT_OK;
}
