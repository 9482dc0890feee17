/* Helpers shared by the subcommands. */
#include "cli/cli.h"

bool px__cli_parse_format(const char *cmd, const char *arg, px_cli_format *out)
{
    if (!strcmp(arg, "text")) {
        *out = PX_CLI_TEXT;
        return true;
    }
    if (!strcmp(arg, "json")) {
        *out = PX_CLI_JSON;
        return true;
    }
    px__cli_usage_error(cmd, "-o takes \"text\" or \"json\", not \"%s\"", arg);
    return false;
}

int px__cli_fail(const char *cmd, const px_err *err)
{
    fprintf(stderr, "plexus %s: %s\n", cmd,
            err && err->msg[0] ? err->msg : px_status_str(err ? err->code : PX_EINTERNAL));
    return PX_EXIT_FAIL;
}

int px__cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plexus %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nrun 'plexus %s --help' for usage\n", cmd);
    va_end(ap);
    return PX_EXIT_USAGE;
}

int px__cli_print_json(const json_t *v)
{
    char *s = px_json_dump_canonical(v);
    if (!s) {
        fprintf(stderr, "plexus: out of memory printing JSON\n");
        return PX_EXIT_FAIL;
    }
    fputs(s, stdout);
    free(s);
    return PX_EXIT_OK;
}

bool px__cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            return false;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return true;
    }
    return false;
}
