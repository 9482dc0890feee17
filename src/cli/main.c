/* plexus: the command.  Dispatches to one subcommand per cmd_<name>.c. */
#include "cli/cli.h"

#include "cli_commands.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus <command> [options]\n\n"
               "plexus places AI workloads on whatever accelerators a team can reach,\n"
               "runs them there, and keeps them running when hardware misbehaves.\n\n"
               "commands:\n");
    for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
    fprintf(f, "\nrun 'plexus <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return PX_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    if (!strcmp(name, "--version")) {
        printf("plexus %s\n", px_version());
        return PX_EXIT_OK;
    }
    for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "plexus: unknown command \"%s\"\n\n", name);
    usage(stderr);
    return PX_EXIT_USAGE;
}
