/* plexus config: the contexts of the config file (server, CA, token
 * file), as kubectl config keeps them. */
#include "cli/cli_config.h"

#include "cli/cli.h"
#include "fleet/secret_impl.h"
#include "plexus/fleet.h"

#include <limits.h>

const char px__cmd_config_summary[] =
    "contexts for the fleet commands: server, CA and token file (as kubectl config)";

static struct {
    const char *server, *ca, *token_file;
    bool current;
    px_cli_format fmt;
} A;

static px_status refuse_token(const char *value, void *dest, px_err *err)
{
    (void)value;
    (void)dest;
    return px_err_set(err, PX_EINVAL,
                      "is refused: the config keeps the path of a token file, never a token; "
                      "put the token in a file only you can read (chmod 600) and give "
                      "--token-file FILE");
}

static const px_cli_opt set_opts[] = {
    PX_CLI_OPT("server", 0, PX_CLI_STR, &A.server, "URL",
               "the server: http://HOST:PORT or https://"),
    PX_CLI_OPT("ca", 0, PX_CLI_STR, &A.ca, "FILE", "the CA certificate to trust for https://"),
    PX_CLI_OPT("token-file", 0, PX_CLI_STR, &A.token_file, "FILE",
               "the file holding the API token (mode 0600); the\n"
               "config keeps its path, never the token"),
    PX_CLI_OPT("current", 0, PX_CLI_FLAG, &A.current, NULL, "make it the current context too"),
    PX_CLI_OPT("token", 0, PX_CLI_CALL, NULL, "TOKEN", NULL, .parse = refuse_token,
               .flags = PX_CLI_HIDDEN),
    {0},
};
static const px_cli_opt fmt_opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &A.fmt, "FORMAT",
               "report format: text (default), json or yaml", .choices = "text|json|yaml"),
    {0},
};
static const px_cli_opt no_opts[] = {{0}};

static const char config_more[] =
    "The config file is $PLEXUS_CONFIG, else $XDG_CONFIG_HOME/plexus/config.json, else\n"
    "~/.config/plexus/config.json; it is written with mode 0600 and refused when group\n"
    "or others can read it.  The fleet commands take the server, CA and token file from\n"
    "--server, --ca and --token-file, else the context --context names, else\n"
    "PLEXUS_SERVER, PLEXUS_CA and PLEXUS_TOKEN, else the current context.";

static const px_cli_spec set_spec = {
    .name = "config set-context",
    .summary = "make or change a context",
    .synopsis = "NAME [--server URL] [--ca FILE] [--token-file FILE] [--current]",
    .about = "Makes the context NAME, or changes the members given.  Paths are kept absolute;\n"
             "the token file must exist and be private (chmod 600): it is read once to check\n"
             "it, and the config keeps only its path.",
    .opts = set_opts,
    .operands = "NAME",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus config set-context lab --server https://10.0.0.5:7070 \\\n"
                "    --ca lab/ca.pem --token-file lab/admin.token --current\n",
    .more = config_more,
};
static const px_cli_spec use_spec = {
    .name = "config use-context",
    .summary = "make a context the current one",
    .synopsis = "NAME",
    .about = "Makes NAME the context the fleet commands use when --context is not given.",
    .opts = no_opts,
    .operands = "NAME",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus config use-context lab\n",
    .more = config_more,
};
static const px_cli_spec get_spec = {
    .name = "config get-contexts",
    .summary = "list the contexts; * marks the current one",
    .synopsis = "[-o text|json|yaml]",
    .about = "Lists the contexts of the config file: name, server, CA and token file.",
    .opts = fmt_opts,
    .examples = "plexus config get-contexts\nplexus config get-contexts -o yaml\n",
    .more = config_more,
};
static const px_cli_spec current_spec = {
    .name = "config current-context",
    .summary = "print the current context's name",
    .synopsis = "",
    .about = "Prints the name of the current context (exit 1 when there is none).",
    .opts = no_opts,
    .examples = "plexus config current-context\n",
    .more = config_more,
};
static const px_cli_spec delete_spec = {
    .name = "config delete-context",
    .summary = "remove a context",
    .synopsis = "NAME",
    .about = "Removes the context NAME; when it was the current one, none is current.",
    .opts = no_opts,
    .operands = "NAME",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus config delete-context old-lab\n",
    .more = config_more,
};
const px_cli_spec *const px__cmd_config_specs[] = {&set_spec,     &use_spec,    &get_spec,
                                                   &current_spec, &delete_spec, NULL};

/* An absolute form of path (which must exist) into out. */
static int absolute(const char *opt, const char *path, char *out, size_t n)
{
    char buf[PATH_MAX];
    if (!realpath(path, buf)) {
        fprintf(stderr, "plexus config: %s %s: %s\n", opt, path, strerror(errno));
        return PX_EXIT_FAIL;
    }
    if (strlen(buf) >= n) {
        fprintf(stderr, "plexus config: %s %s: the path is longer than %zu bytes\n", opt, path,
                n - 1);
        return PX_EXIT_FAIL;
    }
    px_strlcpy(out, buf, n);
    return PX_EXIT_OK;
}

static int set_context(const char *name, px__cli_config *c)
{
    if (!px__cli_context_name_valid(name))
        return px__cli_usage_error("config set-context",
                                   "\"%s\" is not a context name: use 1 to %d letters, digits "
                                   "and _.@-",
                                   name, PX_CLI_CONTEXT_NAME_MAX);
    if (A.server && !px_str_starts_with(A.server, "http://") &&
        !px_str_starts_with(A.server, "https://"))
        return px__cli_usage_error("config set-context",
                                   "--server takes http://HOST:PORT or https://HOST:PORT, not "
                                   "\"%s\"",
                                   A.server);
    if (A.server && strlen(A.server) >= sizeof c->v[0].server)
        return px__cli_usage_error("config set-context", "--server: longer than %zu bytes",
                                   sizeof c->v[0].server - 1);
    px__cli_context *x = px__cli_config_find(c, name);
    if (!x) {
        if (c->n == PX_CLI_CONTEXTS_MAX) {
            fprintf(stderr, "plexus config: %d contexts already: delete one first\n",
                    PX_CLI_CONTEXTS_MAX);
            return PX_EXIT_FAIL;
        }
        x = &c->v[c->n++];
        memset(x, 0, sizeof *x);
        px_strlcpy(x->name, name, sizeof x->name);
    }
    int rc;
    if (A.server)
        px_strlcpy(x->server, A.server, sizeof x->server);
    if (A.ca && (rc = absolute("--ca", A.ca, x->ca, sizeof x->ca)) != PX_EXIT_OK)
        return rc;
    if (A.token_file) {
        if ((rc = absolute("--token-file", A.token_file, x->token_file, sizeof x->token_file)) !=
            PX_EXIT_OK)
            return rc;
        /* Checked now (private, holds a token) rather than at first use. */
        char *token = NULL;
        px_err err;
        px_status st = px_fleet_secret_read(x->token_file, "--token-file", &token, &err);
        px__secret_wipe(token, 0);
        free(token);
        if (st != PX_OK)
            return px__cli_fail("config", &err);
    }
    if (A.current)
        px_strlcpy(c->current, name, sizeof c->current);
    return PX_EXIT_OK;
}

static void print_contexts(const px__cli_config *c)
{
    if (!c->n) {
        printf("no contexts; make one with plexus config set-context NAME --server URL\n");
        return;
    }
    printf("%-7s %-20s %-32s %s\n", "CURRENT", "NAME", "SERVER", "TOKEN FILE");
    for (size_t i = 0; i < c->n; i++) {
        const px__cli_context *x = &c->v[i];
        printf("%-7s %-20s %-32s %s\n", strcmp(x->name, c->current) ? "" : "*", x->name,
               x->server[0] ? x->server : "-", x->token_file[0] ? x->token_file : "-");
    }
}

int px__cmd_config(int argc, char **argv)
{
    memset(&A, 0, sizeof A);
    int rc;
    const px_cli_spec *spec = px__cli_action("config", px__cmd_config_specs, argc, argv, &rc);
    if (!spec)
        return rc;
    px_cli_args args;
    if (!px__cli_parse(spec, argc - 1, argv + 1, &args, &rc))
        return rc;
    px__cli_config *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "plexus config: out of memory\n");
        return PX_EXIT_FAIL;
    }
    char path[1024];
    bool exists;
    px_err err;
    px_err_clear(&err);
    bool changed = false;
    if (px__cli_config_load(c, &exists, path, sizeof path, &err) != PX_OK) {
        rc = px__cli_fail("config", &err);
        goto done;
    }
    rc = PX_EXIT_OK;
    if (spec == &set_spec) {
        if ((rc = set_context(args.v[0], c)) != PX_EXIT_OK)
            goto done;
        changed = true;
    } else if (spec == &use_spec || spec == &delete_spec) {
        px__cli_context *x = px__cli_config_find(c, args.v[0]);
        if (!x) {
            fprintf(stderr,
                    "plexus config: no context \"%s\" in %s (plexus config get-contexts "
                    "lists them)\n",
                    args.v[0], path);
            rc = PX_EXIT_FAIL;
            goto done;
        }
        if (spec == &use_spec) {
            px_strlcpy(c->current, x->name, sizeof c->current);
            printf("switched to context \"%s\"\n", x->name);
        } else {
            if (!strcmp(c->current, x->name))
                c->current[0] = 0;
            printf("deleted context \"%s\"\n", x->name);
            memmove(x, x + 1, (size_t)(&c->v[c->n] - (x + 1)) * sizeof *x);
            c->n--;
        }
        changed = true;
    } else if (spec == &current_spec) {
        if (!c->current[0]) {
            fprintf(stderr,
                    "plexus config: no current context in %s: pick one with plexus "
                    "config use-context NAME\n",
                    path);
            rc = PX_EXIT_FAIL;
        } else {
            printf("%s\n", c->current);
        }
    } else if (A.fmt != PX_CLI_TEXT) {
        json_t *doc = px__cli_config_to_json(c);
        rc = doc ? px__cli_print_doc(doc, A.fmt) : PX_EXIT_FAIL;
        json_decref(doc);
    } else {
        print_contexts(c);
    }
    if (changed) {
        if (px__cli_config_save(c, &err) != PX_OK) {
            rc = px__cli_fail("config", &err);
            goto done;
        }
        if (spec == &set_spec)
            px__cli_wrote("config", path, "the contexts");
    }
done:
    free(c);
    return rc;
}
