/* Fuzz target: the inventory reader on arbitrary bytes.  Whatever it
 * accepts must export, read back and export to the same text. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/hw.h"

static const px_hw_catalog *catalog(void)
{
    /* Parsed once: the built-in catalogue is the same for every input. */
    static px_hw_catalog *cat;
    if (!cat && px_hw_catalog_new_builtin(&cat, NULL) != PX_OK)
        abort();
    return cat;
}

static char *export_text(const px_hw_graph *g)
{
    json_t *doc;
    if (px_hw_graph_to_json(g, &doc, NULL) != PX_OK)
        return NULL;
    char *text = px_json_dump_canonical(doc);
    json_decref(doc);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_hw_read_options opt = {.catalog = catalog()};
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_status st = px_hw_graph_from_json((const char *)data, size, "fuzz", &opt, &g, &diags, NULL);
    if (st != PX_OK && !diags.n && st != PX_ENOMEM)
        abort(); /* a refusal must say why */
    if (st == PX_OK) {
        char *a = export_text(g);
        px_hw_graph *h = NULL;
        if (!a || px_hw_graph_from_json(a, strlen(a), "export", &opt, &h, NULL, NULL) != PX_OK)
            abort(); /* an accepted input's export must read back */
        char *b = export_text(h);
        if (!b || strcmp(a, b))
            abort(); /* export -> read -> export must be a fixed point */
        free(a);
        free(b);
        px_hw_graph_free(h);
    }
    px_hw_graph_free(g);
    px_diags_release(&diags);
    return 0;
}
