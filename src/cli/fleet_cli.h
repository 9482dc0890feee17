/*
 * Helpers shared by the fleet client commands (nodes, submit, jobs, logs,
 * explain, cancel, artifacts): the server, token and CA options and their
 * environment variables, connecting, and printing replies.
 */
#ifndef PX_CLI_FLEET_CLI_H
#define PX_CLI_FLEET_CLI_H

#include "cli/cli.h"
#include "plexus/fleet.h"

/* Options every client command takes. */
typedef struct px__fleet_cli {
    const char *cmd;        /* the subcommand, for messages */
    const char *server;     /* --server, else PLEXUS_SERVER, else http://127.0.0.1:7070 */
    const char *token_file; /* --token-file; else PLEXUS_TOKEN */
    const char *ca;         /* --ca, else PLEXUS_CA: the CA to trust for https:// */
    char token[320];        /* read from token_file ("" none); wiped by release */
    px_cli_format format;
    bool format_given;
} px__fleet_cli;

/* Consumes a common option at argv[*i] (--server URL, --token-file F,
 * --ca F, -o/--output text|json), advancing *i past its value.  --token
 * is refused: a token in argv is visible to every user in ps.  Returns 1
 * when consumed, 0 when argv[*i] is not one of them, -1 after a usage
 * error (already printed). */
int px__fleet_cli_common(px__fleet_cli *o, int argc, char **argv, int *i);
/* Takes the value of option argv[*i]: returns it and advances *i, or
 * prints a usage error and returns NULL. */
const char *px__fleet_cli_value(const px__fleet_cli *o, int argc, char **argv, int *i);
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
