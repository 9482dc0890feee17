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
    fprintf(f, "\nrun 'plexus help <command>' or 'plexus <command> --help' for a command's "
               "options.\n"
               "exit status: 0 success; 1 an error (a file unreadable or malformed, a server\n"
               "unreachable, the work failed); 2 bad usage; 3 a verdict: the work ran and its\n"
               "answer is no (a contract forbids, a replay diverged, an input is refused).\n");
}

static const struct px_cli_command *find(const char *name)
{
    for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

static int unknown(const char *name)
{
    const char *names[128];
    size_t n = 0;
    for (const struct px_cli_command *c = px_cli_commands; c->name && n + 2 < 128; c++)
        names[n++] = c->name;
    names[n++] = "help";
    names[n] = NULL;
    const char *near = px__cli_nearest(name, names);
    if (near)
        fprintf(stderr, "plexus: unknown command \"%s\"; did you mean \"%s\"?\n", name, near);
    else
        fprintf(stderr, "plexus: unknown command \"%s\"\n\n", name);
    if (!near)
        usage(stderr);
    else
        fprintf(stderr, "run 'plexus help' for the list of commands\n");
    return PX_EXIT_USAGE;
}

/* `plexus help [COMMAND [ACTION]]`: the command's help, generated from its
 * tables, or what its own --help prints. */
static int help(int argc, char **argv)
{
    if (argc < 3) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    const struct px_cli_command *c = find(argv[2]);
    if (!c)
        return unknown(argv[2]);
    char *sub[4] = {(char *)c->name, NULL, NULL, NULL};
    int n = 1;
    if (argc > 3)
        sub[n++] = argv[3];
    sub[n++] = "--help";
    return c->run(n, sub);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return PX_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help"))
        return help(1, argv);
    if (!strcmp(name, "help"))
        return help(argc, argv);
    if (!strcmp(name, "--version")) {
        printf("plexus %s\n", px_version());
        return PX_EXIT_OK;
    }
    const struct px_cli_command *c = find(name);
    if (c)
        return c->run(argc - 1, argv + 1);
    return unknown(name);
}
