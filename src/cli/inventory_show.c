/* The readable forms of an inventory: a table per node, a Graphviz
 * drawing, and the catalogue listing. */
#include "base/svg.h"
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

/* The inventory as a picture without Graphviz: each node a column of its
 * devices (id and model, class and memory, peak compute), then every link
 * in words.  Texts are measured and cut to their boxes (base/svg.h), and
 * each names its box (data-in), as in the plan's picture. */
#define ISVG_FONT   12
#define ISVG_LINE   16
#define ISVG_PAD    8
#define ISVG_MARGIN 20
#define ISVG_BOX_H  (3 * ISVG_LINE + 2 * ISVG_PAD + 4)
#define ISVG_GAP    10
#define ISVG_COLS   4
#define ISVG_NODES  64 /* nodes drawn */
#define ISVG_DEVS   64 /* devices drawn per node */
#define ISVG_LINKS  40 /* links listed */

static void isvg_text(px_strbuf *sb, int x, int y, int size, const char *in, double max_w,
                      const char *s)
{
    px_svg_add_text(sb, x, y, size, ISVG_FONT, in, max_w, s);
}

static void isvg_device_lines(const px_hw_device *d, char l[3][256])
{
    char a[64], b[64];
    snprintf(l[0], 256, "%s (%s)", d->id, d->model ? d->model : px_hw_class_name(d->cls));
    snprintf(l[1], 256, "%s%s%s, memory %s%s", px_hw_class_name(d->cls), d->vendor ? " " : "",
             d->vendor ? d->vendor : "", bytes_text(px_hw_device_memory_capacity(d), a, sizeof a),
             d->emulated ? ", emulated" : "");
    bool bf16 = px_hw_has(d->compute[PX_HW_DTYPE_BF16]);
    const px_qty *peak = bf16 ? &d->compute[PX_HW_DTYPE_BF16] : &d->compute[PX_HW_DTYPE_F32];
    snprintf(l[2], 256, "peak %s %s", qty_text(peak, b, sizeof b), bf16 ? "bf16" : "f32");
}

int px__inventory_svg(const px_hw_graph *g, FILE *out)
{
    const px_hw_view *v = px_hw_graph_view(g);
    size_t n_nodes = PX_MIN(v->n_nodes, (size_t)ISVG_NODES), hidden = 0;
    double want = 170;
    char l[3][256], line[512], a[64];
    for (size_t j = 0; j < v->n_nodes; j++) {
        const px_hw_node *n = &v->nodes[j];
        if (j >= n_nodes) {
            hidden += n->n_devices;
            continue;
        }
        hidden += n->n_devices > ISVG_DEVS ? n->n_devices - ISVG_DEVS : 0;
        snprintf(line, sizeof line, "node %s%s%s%s%s", n->id, n->hostname ? " (" : "",
                 n->hostname ? n->hostname : "", n->hostname ? ")" : "",
                 n->emulated ? " emulated" : "");
        want = PX_MAX(want, px_svg_text_width(line, ISVG_FONT) + 2 * ISVG_PAD);
        for (size_t k = 0; k < n->n_devices && k < ISVG_DEVS; k++) {
            isvg_device_lines(&v->devices[n->devices[k]], l);
            for (int q = 0; q < 3; q++)
                want = PX_MAX(want, px_svg_text_width(l[q], ISVG_FONT) + 2 * ISVG_PAD);
        }
    }
    int box_w = (int)PX_MIN(want, 320.0) + 1, node_w = box_w + 2 * ISVG_PAD;
    int cols = (int)PX_MIN(n_nodes, (size_t)ISVG_COLS);
    int rows = cols ? (int)((n_nodes + (size_t)cols - 1) / (size_t)cols) : 0;
    int row_h[ISVG_NODES] = {0};
    for (size_t j = 0; j < n_nodes; j++) {
        int nd = (int)PX_MIN(v->nodes[j].n_devices, (size_t)ISVG_DEVS);
        int h = ISVG_LINE + ISVG_PAD + nd * (ISVG_BOX_H + ISVG_GAP) + ISVG_PAD;
        row_h[j / (size_t)cols] = PX_MAX(row_h[j / (size_t)cols], h);
    }
    /* The header and the links, measured before the canvas is sized. */
    size_t n_listed = 0, n_fwd = 0;
    for (size_t k = 0; k < v->n_links; k++)
        n_fwd += !v->links[k].reverse;
    char title[512];
    snprintf(title, sizeof title, "inventory %s: %zu device(s) on %zu node(s), %zu link(s)%s",
             v->name ? v->name : "", v->n_devices, v->n_nodes, n_fwd,
             v->emulated ? "; EMULATED hardware" : "");
    double line_w = px_svg_text_width(title, 15);
    px_strbuf links = PX_STRBUF_INIT;
    for (size_t k = 0; k < v->n_links && n_listed < ISVG_LINKS; k++) {
        const px_hw_link *lk = &v->links[k];
        if (lk->reverse)
            continue;
        snprintf(line, sizeof line, "%s %s %s: %s %s", px_hw_graph_endpoint_name(g, lk->from),
                 lk->bidirectional ? "<->" : "->", px_hw_graph_endpoint_name(g, lk->to),
                 px_hw_link_kind_name(lk->kind), qty_text(&lk->bandwidth, a, sizeof a));
        line_w = PX_MAX(line_w, px_svg_text_width(line, ISVG_FONT));
        px_strbuf_addf(&links, "%s\n", line);
        n_listed++;
    }
    char more[160] = "";
    if (n_fwd > n_listed || hidden)
        snprintf(more, sizeof more,
                 "%zu more link(s) and %zu more device(s) not drawn: plexus "
                 "inventory show lists them",
                 n_fwd - n_listed, hidden);
    line_w = PX_MIN(PX_MAX(line_w, px_svg_text_width(more, ISVG_FONT)), 1100.0);
    int grid_w = cols * node_w + (cols > 0 ? (cols - 1) * 16 : 0);
    int width = 2 * ISVG_MARGIN + PX_MAX(grid_w, (int)line_w + 1);
    int grid_top = ISVG_MARGIN + 36, y = grid_top;
    for (int r = 0; r < rows; r++)
        y += row_h[r] + 16;
    int links_top = y;
    int height = links_top + (int)(n_listed + (more[0] ? 1 : 0)) * ISVG_LINE + ISVG_MARGIN;
    double avail = width - 2 * ISVG_MARGIN;
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_addf(&sb,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                   "font-family=\"%s\" font-size=\"%d\">\n<rect id=\"canvas\" x=\"0\" y=\"0\" "
                   "width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
                   width, height, PX_SVG_FONT, ISVG_FONT, width, height);
    isvg_text(&sb, ISVG_MARGIN, ISVG_MARGIN + 16, 15, "canvas", avail, title);
    for (size_t j = 0; j < n_nodes; j++) {
        const px_hw_node *n = &v->nodes[j];
        int c = (int)(j % (size_t)cols), r = (int)(j / (size_t)cols);
        int nx = ISVG_MARGIN + c * (node_w + 16), ny = grid_top;
        for (int k = 0; k < r; k++)
            ny += row_h[k] + 16;
        int nd = (int)PX_MIN(n->n_devices, (size_t)ISVG_DEVS);
        char in[32];
        snprintf(in, sizeof in, "node%zu", j);
        px_strbuf_addf(&sb,
                       "<rect id=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                       "fill=\"#f6f6f6\" stroke=\"#999\"%s data-node=\"",
                       in, nx, ny, node_w,
                       ISVG_LINE + ISVG_PAD + nd * (ISVG_BOX_H + ISVG_GAP) + ISVG_PAD,
                       n->emulated ? " stroke-dasharray=\"4 3\"" : "");
        px_svg_escape(&sb, n->id);
        px_strbuf_adds(&sb, "\"/>\n");
        snprintf(line, sizeof line, "node %s%s%s%s%s", n->id, n->hostname ? " (" : "",
                 n->hostname ? n->hostname : "", n->hostname ? ")" : "",
                 n->emulated ? " emulated" : "");
        isvg_text(&sb, nx + ISVG_PAD, ny + ISVG_PAD + 11, ISVG_FONT, in, node_w - 2 * ISVG_PAD,
                  line);
        for (int k = 0; k < nd; k++) {
            const px_hw_device *d = &v->devices[n->devices[k]];
            int dx = nx + ISVG_PAD, dy = ny + ISVG_LINE + ISVG_PAD + k * (ISVG_BOX_H + ISVG_GAP);
            char din[48];
            snprintf(din, sizeof din, "dev%u", n->devices[k]);
            px_strbuf_addf(&sb,
                           "<rect id=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"4\" "
                           "fill=\"%s\" stroke=\"#333\" data-stage=\"-1\" data-replica=\"-1\" "
                           "data-device=\"",
                           din, dx, dy, box_w, ISVG_BOX_H,
                           d->cls == PX_HW_CLASS_CPU ? "#e8e8e8" : "#aecbea");
            px_svg_escape(&sb, d->global_id);
            px_strbuf_adds(&sb, "\"/>\n");
            isvg_device_lines(d, l);
            for (int q = 0; q < 3; q++)
                isvg_text(&sb, dx + ISVG_PAD, dy + ISVG_PAD + 11 + q * ISVG_LINE, ISVG_FONT, din,
                          box_w - 2 * ISVG_PAD, l[q]);
        }
    }
    y = links_top + 12;
    for (const char *p = links.buf; *p; y += ISVG_LINE) {
        const char *e = strchr(p, '\n');
        snprintf(line, sizeof line, "%.*s", (int)(e - p), p);
        isvg_text(&sb, ISVG_MARGIN, y, ISVG_FONT, "canvas", avail, line);
        p = e + 1;
    }
    if (more[0])
        isvg_text(&sb, ISVG_MARGIN, y, ISVG_FONT, "canvas", avail, more);
    px_strbuf_adds(&sb, "</svg>\n");
    px_strbuf_release(&links);
    bool ok = fwrite(sb.buf, 1, sb.len, out) == sb.len && sb.len > 0;
    px_strbuf_release(&sb);
    return ok && !ferror(out) ? PX_EXIT_OK : PX_EXIT_FAIL;
}
