/*
 * libFuzzer target: the server's token file ("agent TOKEN", "user TOKEN
 * [NAME [ROLE]]") from arbitrary bytes.  A refusal must name the line; an
 * accepted file gives principals with valid names.  Any crash, leak or
 * sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    px_fleet_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        abort();
    px_err err;
    err.msg[0] = '\0';
    if (px__auth_parse_text(srv, text, "fuzz-tokens", &err) != PX_OK) {
        if (!strstr(err.msg, "fuzz-tokens:"))
            abort(); /* the message names the file and the line */
    } else {
        for (size_t i = 0; i < srv->n_principals; i++)
            if (srv->principals[i].kind == PX__WHO_USER && !px__name_valid(srv->principals[i].name))
                abort();
    }
    free(srv->principals);
    free(srv);
    free(text);
    return 0;
}
