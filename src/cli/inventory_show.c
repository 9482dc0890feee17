/* The readable forms of an inventory: a table per node, a Graphviz
 * drawing, and the catalogue listing. */
#include "cli/inventory.h"

/* Copies s into buf for printing: control bytes become '?' (an inventory
 * is untrusted text and must not drive the terminal), long text is cut
 * with "...". */
static const char *clean(const char *s, char *buf, size_t n)
{
    if (!s)
        return "-";
    size_t k = 0;
    for (; s[k] && k + 1 < n; k++)
        buf[k] = (unsigned char)s[k] < 0x20 || s[k] == 0x7f ? '?' : s[k];
    buf[k] = '\0';
    if (s[k] && n > 4)
        memcpy(buf + n - 4, "...", 4);
    return buf;
}

static const char *qty_text(const px_qty *q, char *buf, size_t n)
{
    if (!px_hw_has(*q))
        return "-";
    px_qty_format(q->value, q->dim, buf, n);
    return buf;
}

static const char *bytes_text(double v, char *buf, size_t n)
{
    if (v <= 0)
        return "-";
    px_qty_format(v, PX_DIM_BYTES, buf, n);
    return buf;
}

/* A total for reading, not for reading back: four significant digits. */
static const char *approx_bytes(double v, char *buf, size_t n)
{
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
    size_t u = 0;
    while (v >= 1000 && u + 1 < PX_ARRAY_LEN(units)) {
        v /= 1000;
        u++;
    }
    snprintf(buf, n, "%.4g %s", v, units[u]);
    return buf;
}

/* The node an endpoint belongs to. */
static uint32_t endpoint_node(const px_hw_view *v, uint32_t ep)
{
    return ep < v->n_devices ? v->devices[ep].node : (uint32_t)(ep - v->n_devices);
}

static void print_link(const px_hw_graph *g, const px_hw_link *l, FILE *out)
{
    char bw[64], lat[64], name[72];
    fprintf(out, "    %-22s %s %-22s %-15s %-14s %-10s%s%s\n",
            px_hw_graph_endpoint_name(g, l->from), l->bidirectional ? "<->" : "-> ",
            px_hw_graph_endpoint_name(g, l->to), px_hw_link_kind_name(l->kind),
            qty_text(&l->bandwidth, bw, sizeof bw), qty_text(&l->latency, lat, sizeof lat),
            l->id ? "  " : "", l->id ? clean(l->id, name, sizeof name) : "");
}

int px__inventory_show(const px_hw_graph *g, FILE *out)
{
    const px_hw_view *v = px_hw_graph_view(g);
    char a[64], b[64], c[64], d[64], e[64], m[40], t[128];
    fprintf(out, "inventory %s%s%s%s\n", clean(v->name ? v->name : px_hw_graph_source(g), t, 64),
            v->description ? ": " : "", v->description ? clean(v->description, t + 64, 64) : "",
            v->emulated ? "  [emulated: not real hardware]" : "");
    fprintf(out, "%zu node%s, %zu device%s, %zu directional link%s, %s of device memory\n",
            v->n_nodes, v->n_nodes == 1 ? "" : "s", v->n_devices, v->n_devices == 1 ? "" : "s",
            v->n_links, v->n_links == 1 ? "" : "s",
            approx_bytes(px_hw_graph_total_device_memory(g), a, sizeof a));
    for (size_t i = 0; i < v->n_nodes; i++) {
        const px_hw_node *n = &v->nodes[i];
        fprintf(out, "\nnode %s", n->id);
        if (n->hostname)
            fprintf(out, "  host %s", clean(n->hostname, t, sizeof t));
        if (n->n_domains) {
            fprintf(out, "  domains");
            for (size_t k = 0; k < n->n_domains; k++)
                fprintf(out, " %s", v->domains[n->domains[k]].id);
        }
        fprintf(out, "%s\n", n->emulated ? "  [emulated]" : "");
        fprintf(out, "  %-22s %-5s %-30s %-11s %-12s %-15s %-15s %s\n", "DEVICE", "CLASS", "MODEL",
                "MEMORY", "MEM BW", "BF16", "F32", "CATALOG");
        for (size_t k = 0; k < n->n_devices; k++) {
            const px_hw_device *dv = &v->devices[n->devices[k]];
            char model[64];
            snprintf(model, sizeof model, "%s%s", clean(dv->model, m, dv->emulated ? 24 : 31),
                     dv->emulated ? " [emu]" : "");
            double bw = px_hw_device_memory_bandwidth(dv);
            fprintf(out, "  %-22s %-5s %-30s %-11s %-12s %-15s %-15s %s\n", dv->global_id,
                    px_hw_class_name(dv->cls), model,
                    bytes_text(px_hw_device_memory_capacity(dv), a, sizeof a),
                    bw > 0 ? (px_qty_format(bw, PX_DIM_BANDWIDTH, b, sizeof b), b) : "-",
                    qty_text(&dv->compute[PX_HW_DTYPE_BF16], c, sizeof c),
                    qty_text(&dv->compute[PX_HW_DTYPE_F32], d, sizeof d),
                    dv->catalog ? dv->catalog : "-");
        }
        for (size_t k = 0; k < n->n_memory; k++) {
            const px_hw_mem_tier *tier = &n->memory[k];
            fprintf(out, "  host memory %s (%s): %s, %s\n", tier->id,
                    px_hw_mem_kind_name(tier->kind), qty_text(&tier->capacity, a, sizeof a),
                    qty_text(&tier->bandwidth, e, sizeof e));
        }
        bool header = false;
        for (size_t k = 0; k < v->n_links; k++) {
            const px_hw_link *l = &v->links[k];
            if (l->reverse || endpoint_node(v, l->from) != i || endpoint_node(v, l->to) != i)
                continue;
            if (!header)
                fprintf(out, "  links:\n");
            header = true;
            print_link(g, l, out);
        }
    }
    bool header = false;
    for (size_t k = 0; k < v->n_links; k++) {
        const px_hw_link *l = &v->links[k];
        if (l->reverse || endpoint_node(v, l->from) == endpoint_node(v, l->to))
            continue;
        if (!header)
            fprintf(out, "\nlinks between nodes:\n");
        header = true;
        print_link(g, l, out);
    }
    return ferror(out) ? PX_EXIT_FAIL : PX_EXIT_OK;
}

/* Writes s as the inside of a Graphviz quoted string. */
static void dot_str(const char *s, FILE *out)
{
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fputc('\\', out);
        fputc(ch < 0x20 || ch == 0x7f ? '?' : ch, out);
    }
}

int px__inventory_dot(const px_hw_graph *g, FILE *out)
{
    const px_hw_view *v = px_hw_graph_view(g);
    char a[64], b[64];
    fputs("digraph \"", out);
    dot_str(v->name ? v->name : "inventory", out);
    fputs("\" {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n  edge [fontsize=9];\n", out);
    if (v->emulated)
        fputs("  label=\"emulated hardware\";\n", out);
    for (size_t i = 0; i < v->n_nodes; i++) {
        const px_hw_node *n = &v->nodes[i];
        fprintf(out, "  subgraph \"cluster_%s\" {\n    label=\"%s", n->id, n->id);
        if (n->hostname) {
            fputs(" (", out);
            dot_str(n->hostname, out);
            fputs(")", out);
        }
        fprintf(out, "%s\";\n%s", n->emulated ? " [emulated]" : "",
                n->emulated ? "    style=dashed;\n" : "");
        fprintf(out, "    \"%s\" [shape=ellipse, label=\"%s host\"];\n", n->id, n->id);
        for (size_t k = 0; k < n->n_devices; k++) {
            const px_hw_device *d = &v->devices[n->devices[k]];
            fprintf(out, "    \"%s\" [label=\"%s\\n", d->global_id, d->id);
            dot_str(d->model ? d->model : px_hw_class_name(d->cls), out);
            fprintf(out, "\\n%s", bytes_text(px_hw_device_memory_capacity(d), a, sizeof a));
            const px_qty *peak = px_hw_has(d->compute[PX_HW_DTYPE_BF16])
                                     ? &d->compute[PX_HW_DTYPE_BF16]
                                     : &d->compute[PX_HW_DTYPE_F32];
            if (px_hw_has(*peak))
                fprintf(out, ", %s %s", qty_text(peak, b, sizeof b),
                        peak == &d->compute[PX_HW_DTYPE_BF16] ? "bf16" : "f32");
            fprintf(out, "\"%s];\n", d->emulated ? ", style=dashed" : "");
        }
        fputs("  }\n", out);
    }
    for (size_t k = 0; k < v->n_links; k++) {
        const px_hw_link *l = &v->links[k];
        if (l->reverse)
            continue;
        fprintf(out, "  \"%s\" -> \"%s\" [label=\"%s %s\"%s];\n",
                px_hw_graph_endpoint_name(g, l->from), px_hw_graph_endpoint_name(g, l->to),
                px_hw_link_kind_name(l->kind), qty_text(&l->bandwidth, a, sizeof a),
                l->bidirectional ? ", dir=both" : "");
    }
    fputs("}\n", out);
    return ferror(out) ? PX_EXIT_FAIL : PX_EXIT_OK;
}

int px__inventory_catalog_text(const px_hw_catalog *cat, FILE *out)
{
    char a[64], b[64], c[64], d[64], e[64], m[40];
    fprintf(out, "devices (figures from vendor documents; `-o json` shows each source)\n");
    fprintf(out, "  %-22s %-5s %-7s %-28s %-9s %-11s %-15s %-15s %s\n", "ID", "CLASS", "VENDOR",
            "MODEL", "MEMORY", "MEM BW", "BF16", "F32", "TDP");
    for (size_t i = 0; i < px_hw_catalog_n_devices(cat); i++) {
        const px_hw_device *dv = px_hw_catalog_device(cat, i);
        double bw = px_hw_device_memory_bandwidth(dv);
        fprintf(out, "  %-22s %-5s %-7s %-28s %-9s %-11s %-15s %-15s %s\n", dv->id,
                px_hw_class_name(dv->cls), dv->vendor ? dv->vendor : "-", clean(dv->model, m, 28),
                bytes_text(px_hw_device_memory_capacity(dv), a, sizeof a),
                bw > 0 ? (px_qty_format(bw, PX_DIM_BANDWIDTH, b, sizeof b), b) : "-",
                qty_text(&dv->compute[PX_HW_DTYPE_BF16], c, sizeof c),
                qty_text(&dv->compute[PX_HW_DTYPE_F32], d, sizeof d),
                qty_text(&dv->power_tdp, e, sizeof e));
    }
    fprintf(out, "\nlinks (bandwidth per direction)\n");
    fprintf(out, "  %-22s %-15s %s\n", "ID", "KIND", "BANDWIDTH");
    for (size_t i = 0; i < px_hw_catalog_n_links(cat); i++) {
        const px_hw_link *l = px_hw_catalog_link(cat, i);
        fprintf(out, "  %-22s %-15s %s\n", l->id, px_hw_link_kind_name(l->kind),
                qty_text(&l->bandwidth, a, sizeof a));
    }
    return ferror(out) ? PX_EXIT_FAIL : PX_EXIT_OK;
}
