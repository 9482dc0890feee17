/*
 * Helpers shared by the fleet client commands (nodes, submit, jobs, logs,
 * explain, cancel, artifacts): the server, token and CA options and their
 * environment variables, connecting, and printing replies.
 */
#ifndef PX_CLI_FLEET_CLI_H
#define PX_CLI_FLEET_CLI_H

#include "cli/cli.h"
#include "plexus/fleet.h"

/* Options every client command takes.  Where each comes from, first
 * found: the option; the context named by --context; the environment
 * (PLEXUS_SERVER, PLEXUS_TOKEN, PLEXUS_CA); the current context of the
 * config file (cli_config.c); http://127.0.0.1:7070 and no token. */
typedef struct px__fleet_cli {
    const char *cmd;        /* the subcommand, for messages */
    const char *server;     /* --server URL */
    const char *token_file; /* --token-file FILE */
    const char *ca;         /* --ca FILE: the CA to trust for https:// */
    const char *context;    /* --context NAME */
    char token[320];        /* read from the token file ("" none); wiped by release */
    char ctx_server[512], ctx_ca[512], ctx_token_file[512]; /* from the context */
    px_cli_format format;
    bool format_given;
} px__fleet_cli;

/* Refuses --token VALUE: a token in argv is visible to every user in ps. */
px_status px__fleet_cli_refuse_token(const char *value, void *dest, px_err *err);

/* The rows of the options every client command takes, for its table:
 *     static px__fleet_cli F;
 *     static const px_cli_opt opts[] = {..., PX__FLEET_CLI_OPTS(F), {0}}; */
#define PX__FLEET_CLI_OPTS(o)                                                                  \
    PX_CLI_OPT("server", 0, PX_CLI_STR, &(o).server, "URL",                                    \
               "the server (else the context's, $PLEXUS_SERVER or\n"                           \
               "http://127.0.0.1:7070)"),                                                      \
        PX_CLI_OPT("token-file", 0, PX_CLI_STR, &(o).token_file, "FILE",                       \
                   "the API token, in a file only you can read (chmod\n"                       \
                   "600); else the context's or $PLEXUS_TOKEN"),                               \
        PX_CLI_OPT("ca", 0, PX_CLI_STR, &(o).ca, "FILE",                                       \
                   "the CA certificate to trust for https:// (else the\n"                      \
                   "context's or $PLEXUS_CA)"),                                                \
        PX_CLI_OPT("context", 0, PX_CLI_STR, &(o).context, "NAME",                             \
                   "the context of the config file to use (plexus config)"),                   \
        PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &(o).format, "FORMAT",                        \
                   "report format: text (default), json or yaml", .choices = "text|json|yaml", \
                   .seen = &(o).format_given),                                                 \
        PX_CLI_OPT("token", 0, PX_CLI_CALL, NULL, "TOKEN", NULL,                               \
                   .parse = px__fleet_cli_refuse_token, .flags = PX_CLI_HIDDEN)

/* Prints the reply as -o asked (json or yaml); PX_EXIT_OK or PX_EXIT_FAIL. */
int px__fleet_cli_print(const px__fleet_cli *o, const json_t *reply);
/* Connects a client (owned: px_fleet_client_free); prints the error and
 * returns NULL on failure. */
px_fleet_client *px__fleet_cli_connect(px__fleet_cli *o);
/* Wipes the token connect read. */
void px__fleet_cli_release(px__fleet_cli *o);
/* Calls the API and prints the error on failure (returns NULL). */
json_t *px__fleet_cli_get(px__fleet_cli *o, px_fleet_client *c, const char *method,
                          const char *path, const json_t *body);
/* The "model" member of a request: --model FILE uploads the file (POST
 * /v1/blobs) and gives {"digest", "name", "size"}; --model DIGEST names a
 * blob the server has ({"digest"}).  New reference, or NULL after
 * printing why (as o->cmd). */
json_t *px__fleet_cli_model(px__fleet_cli *o, px_fleet_client *c, const char *model);
/* Appends the strings of a JSON array joined by commas to out; returns
 * out's text, or "-" for none. */
const char *px__fleet_cli_join(const json_t *arr, px_strbuf *out);
/* Formats bytes ("16 GiB") into buf. */
const char *px__fleet_cli_bytes(double bytes, char *buf, size_t n);
/* A job id or node name fit for a URL path: [A-Za-z0-9_.-]{1,128}. */
bool px__fleet_cli_valid_id(const char *s);
/* The text of a JSON value member, or def. */
const char *px__fleet_cli_str(const json_t *obj, const char *key, const char *def);
/* Text from the server fit for a terminal: control characters other than
 * newline and tab (escape sequences among them) become '?'.  Returns buf. */
const char *px__fleet_cli_clean(const char *text, char *buf, size_t n);
/* Erases NAME=VALUE from this process's environment, in place: what
 * /proc/PID/environ shows is overwritten too, not only unset. */
void px__cli_scrub_env(const char *name);

#endif
