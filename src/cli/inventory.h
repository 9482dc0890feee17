/*
 * Private helpers of `plexus inventory`: the text table, the Graphviz
 * drawing and the catalogue listing (src/cli/inventory_show.c).
 */
#ifndef PX_CLI_INVENTORY_H
#define PX_CLI_INVENTORY_H

#include "cli/cli.h"
#include "plexus/hw.h"

/* Reads an inventory; on failure prints its diagnostics to stderr and
 * returns NULL.  Returns owned memory (px_hw_graph_free). */
px_hw_graph *px__inventory_load(const char *cmd, const char *path, bool strict);
/* Each writes to out and returns a process exit status. */
int px__inventory_show(const px_hw_graph *g, FILE *out);
int px__inventory_dot(const px_hw_graph *g, FILE *out);
/* Writes the graph as an SVG picture (no Graphviz needed). */
int px__inventory_svg(const px_hw_graph *g, FILE *out);
int px__inventory_catalog_text(const px_hw_catalog *cat, FILE *out);
/* The table of `plexus inventory discover` (inventory_discover.c). */
extern const px_cli_spec px__inventory_discover_spec;

#endif
