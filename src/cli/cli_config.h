/*
 * The client's config file: named contexts, each a server address, the
 * CA to trust and the path of a file holding the API token (never the
 * token), and which context is current, as kubectl keeps them.
 *
 * The file is $PLEXUS_CONFIG, else $XDG_CONFIG_HOME/plexus/config.json,
 * else ~/.config/plexus/config.json:
 *
 *     {"schema": "plexus.config/1", "current_context": "lab",
 *      "contexts": [{"name": "lab", "server": "https://10.0.0.5:7070",
 *                    "ca": "/home/me/lab/ca.pem",
 *                    "token_file": "/home/me/lab/token"}]}
 *
 * It is written with mode 0600 and refused when group or others can
 * read it, as a file holding a secret would be: the paths it holds tell
 * where the secrets are.
 */
#ifndef PX_CLI_CONFIG_H
#define PX_CLI_CONFIG_H

#include "base/common.h"

#define PX_CLI_CONTEXTS_MAX     64
#define PX_CLI_CONTEXT_NAME_MAX 64

typedef struct px__cli_context {
    char name[PX_CLI_CONTEXT_NAME_MAX + 1];
    char server[512];     /* "" unset */
    char ca[512];         /* "" unset: an absolute path */
    char token_file[512]; /* "" unset: an absolute path */
} px__cli_context;

typedef struct px__cli_config {
    px__cli_context v[PX_CLI_CONTEXTS_MAX];
    size_t n;
    char current[PX_CLI_CONTEXT_NAME_MAX + 1]; /* "" none */
} px__cli_config;

/* Parses a config document of len bytes (not NUL-terminated necessarily);
 * `path` names it in messages.  Every error names the member and the
 * fix.  Bounds: PX_CLI_CONTEXTS_MAX contexts, names of at most
 * PX_CLI_CONTEXT_NAME_MAX characters from [A-Za-z0-9_.@-], strings of
 * at most 511 bytes; a "token" member is refused. */
px_status px__cli_config_parse(const char *text, size_t len, const char *path, px__cli_config *out,
                               px_err *err);
/* The config as a document (returns owned: json_decref). */
json_t *px__cli_config_to_json(const px__cli_config *c);
/* Whether s is a context name. */
bool px__cli_context_name_valid(const char *s);

/* The config file's path into buf; PX_ENOTFOUND when neither
 * PLEXUS_CONFIG, XDG_CONFIG_HOME nor HOME is set. */
px_status px__cli_config_path(char *buf, size_t n, px_err *err);
/* Reads the config file into *out (empty when the file does not exist:
 * *exists false).  PX_EAUTH for a file others can read. */
px_status px__cli_config_load(px__cli_config *out, bool *exists, char *path, size_t path_n,
                              px_err *err);
/* Writes the config file (mode 0600, atomically; its folder made with
 * mode 0700 when missing). */
px_status px__cli_config_save(const px__cli_config *c, px_err *err);
/* The context named `name`, or the current one when name is NULL.
 * PX_ENOTFOUND when there is no config file, no current context, or no
 * context of that name (the message lists them). */
px_status px__cli_config_context(const char *name, px__cli_context *out, px_err *err);
/* The context of that name in c, or NULL. */
px__cli_context *px__cli_config_find(px__cli_config *c, const char *name);

#endif
