/*
 * libFuzzer target: the client's config file (plexus.config/1 contexts)
 * from arbitrary bytes.  A refusal must say why; an accepted file gives
 * valid context names, a current context among them, absolute paths and
 * no member beyond its bounds.  Any crash, leak or sanitizer report is a
 * finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20)
        return 0;
    px__cli_config *c = malloc(sizeof *c);
    if (!c)
        return 0;
    px_err err;
    err.msg[0] = '\0';
    if (px__cli_config_parse((const char *)data, size, "fuzz-config", c, &err) != PX_OK) {
        if (!err.msg[0])
            abort();
        free(c);
        return 0;
    }
    if (c->n > PX_CLI_CONTEXTS_MAX)
        abort();
    bool current_found = !c->current[0];
    for (size_t i = 0; i < c->n; i++) {
        if (!px__cli_context_name_valid(c->v[i].name))
            abort();
        if ((c->v[i].ca[0] && c->v[i].ca[0] != '/') ||
            (c->v[i].token_file[0] && c->v[i].token_file[0] != '/'))
            abort();
        current_found = current_found || !strcmp(c->v[i].name, c->current);
    }
    if (!current_found)
        abort();
    /* What was read writes back to a document that reads the same. */
    json_t *doc = px__cli_config_to_json(c);
    char *text = doc ? json_dumps(doc, 0) : NULL;
    if (text) {
        px__cli_config *again = malloc(sizeof *again);
        if (again && px__cli_config_parse(text, strlen(text), "again", again, &err) != PX_OK)
            abort();
        if (again && (again->n != c->n || strcmp(again->current, c->current)))
            abort();
        free(again);
    }
    free(text);
    json_decref(doc);
    free(c);
    return 0;
}
