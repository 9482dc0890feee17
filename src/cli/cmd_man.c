/* plexus man: man pages generated from the option tables of the
 * subcommands (or their --help where they have none). */
#include "cli/cli_meta.h"

#include <ctype.h>

#include "cli_commands.h"

const char px__cmd_man_summary[] = "print or write the man pages (section 1)";

static const char *dir = NULL;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("dir", 0, PX_CLI_STR, &dir, "DIR",
               "write every page into DIR (plexus.1, plexus-COMMAND.1, ...)\n"
               "and announce each file on stderr"),
    {0},
};
static const px_cli_spec spec = {
    .name = "man",
    .synopsis = "[COMMAND] | --dir DIR",
    .about = "Prints the man page of plexus or of one command on stdout, or writes them all\n"
             "into a folder (what `make install` installs under share/man/man1).",
    .opts = opts,
    .operands = "COMMAND",
    .max_operands = 1,
    .examples = "plexus man plan | man -l -          # read one page\n"
                "plexus man --dir build/man          # every page\n",
};
const px_cli_spec *const px__cmd_man_specs[] = {&spec, NULL};

/* The page of a command without option tables: its --help, verbatim. */
static void man_from_help(const struct px_cli_command *c, FILE *f)
{
    char title[64];
    snprintf(title, sizeof title, "PLEXUS-%s", c->name);
    for (char *p = title; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    fprintf(f, ".TH %s 1 \"\" \"plexus %s\" \"plexus manual\"\n.SH NAME\nplexus\\-%s \\- %s\n",
            title, px_version(), c->name, c->summary);
    fprintf(f, ".SH DESCRIPTION\n.nf\n");
    char *text = px__cli_capture_help(c->run, c->name, NULL);
    for (const char *p = text ? text : ""; *p; p++) {
        if ((p == text || p[-1] == '\n') && (*p == '.' || *p == '\''))
            fputs("\\&", f);
        if (*p == '\\')
            fputs("\\e", f);
        else if (*p == '-')
            fputs("\\-", f);
        else
            fputc(*p, f);
    }
    free(text);
    fprintf(f, ".fi\n.SH SEE ALSO\n.BR plexus (1)\n");
}

static void man_index(FILE *f)
{
    fprintf(f,
            ".TH PLEXUS 1 \"\" \"plexus %s\" \"plexus manual\"\n"
            ".SH NAME\nplexus \\- place AI workloads on accelerators, run them, heal them\n"
            ".SH SYNOPSIS\n.B plexus\n\\fICOMMAND\\fR [\\fIoptions\\fR]\n"
            ".SH DESCRIPTION\nplexus places AI workloads on whatever accelerators a team "
            "can reach, runs them there, and keeps them running when hardware misbehaves.\n"
            ".SH COMMANDS\n",
            px_version());
    for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
        fprintf(f, ".TP\n.BR plexus\\-%s (1)\n%s\n", c->name, c->summary);
    fprintf(f, ".SH EXIT STATUS\n0 success; 1 an error; 2 bad usage; 3 a verdict (forbidden, "
               "diverged, refused).\n"
               ".SH FILES\n~/.config/plexus/config.json: contexts (server, token file, CA)\n");
}

/* Every page of one command (one per action) into f, or into files. */
static int pages(const struct px_cli_command *c, const char *folder)
{
    size_t n = 0;
    while (c->specs && c->specs[n])
        n++;
    for (size_t i = 0; i < (n ? n : 1); i++) {
        FILE *f = stdout;
        char *path = NULL;
        if (folder) {
            char name[96];
            snprintf(name, sizeof name, "plexus-%s.1", n ? c->specs[i]->name : c->name);
            for (char *p = name; *p; p++)
                *p = *p == ' ' ? '-' : *p;
            path = px_asprintf("%s/%s", folder, name);
            if (!path || !(f = fopen(path, "w"))) {
                fprintf(stderr, "plexus man: cannot write %s: %s\n", path ? path : name,
                        strerror(errno));
                free(path);
                return PX_EXIT_FAIL;
            }
        }
        if (n)
            px__cli_man(c->specs[i], n == 1 ? c->summary : NULL, f);
        else
            man_from_help(c, f);
        if (folder) {
            bool ok = fclose(f) == 0;
            if (ok)
                fprintf(stderr, "plexus man: wrote %s\n", path);
            free(path);
            if (!ok)
                return PX_EXIT_FAIL;
        }
    }
    return PX_EXIT_OK;
}

int px__cmd_man(int argc, char **argv)
{
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc;
    if (args.n) {
        for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
            if (!strcmp(c->name, args.v[0]))
                return pages(c, dir);
        return px__cli_usage_error("man", "no command \"%s\"", args.v[0]);
    }
    if (!dir) {
        man_index(stdout);
        return PX_EXIT_OK;
    }
    char *path = px_asprintf("%s/plexus.1", dir);
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, "plexus man: cannot write %s/plexus.1: %s (does the folder exist?)\n", dir,
                strerror(errno));
        free(path);
        return PX_EXIT_FAIL;
    }
    man_index(f);
    fclose(f);
    fprintf(stderr, "plexus man: wrote %s\n", path);
    free(path);
    for (const struct px_cli_command *c = px_cli_commands; c->name; c++)
        if ((rc = pages(c, dir)) != PX_EXIT_OK)
            return rc;
    return PX_EXIT_OK;
}
