/* The plan as a picture read at a glance: a title, the key figures (time
 * per token, time to first token, throughput, what binds, the lower
 * bound), then every node with every device, each device box saying which
 * replica and stage it runs (or that it is unused) and its memory, arrows
 * along each replica's pipeline, and each replica's hops in words.  Every
 * text is measured (base/svg.h) and cut to the box that holds it; the
 * canvas grows to hold the rest.  Each text names its box (data-in), so a
 * renderer can check the layout. */
#include "base/common.h"

#include "base/svg.h"
#include "plan/plan_impl.h"

#define FONT       12 /* body text, px */
#define TITLE      16 /* the title, px */
#define LINE       16 /* body line pitch */
#define PAD        8  /* inside a box */
#define MARGIN     20 /* around the canvas */
#define BOX_H      (3 * LINE + 2 * PAD + 4)
#define BOX_GAP    10
#define NODE_GAP   16
#define GRID_COLS  4  /* node columns per row */
#define MAX_NODES  64 /* nodes drawn; the others are counted */
#define MAX_DEVS   64 /* devices drawn per node */
#define MAX_HOPS   8  /* replicas whose hops are listed */
#define MIN_BOX_W  170
#define MAX_BOX_W  320
#define MAX_LINE_W 1100 /* header and legend lines past this are cut */

/* Light tints, one per stage index, under black text. */
static const char *const fills[] = {"#aecbea", "#fbc99c", "#b2dcaa", "#f3b0b1",
                                    "#b9ddd9", "#f5e3a1", "#dac3d5", "#dcc7b6"};
#define UNUSED_FILL "#eeeeee"

typedef struct dev_draw {
    int replica, stage; /* -1: unused */
    double used;        /* bytes per device of its stage; < 0 unknown */
    int x, y;           /* its box; x < 0: not drawn */
} dev_draw;

static double getnum(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v ? json_number_value(v) : 0;
}

static const char *getstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* One line of text at baseline y, cut to max_w, inside box `in`. */
static void text(px_strbuf *sb, int x, int y, int size, const char *in, double max_w, const char *s)
{
    px_svg_add_text(sb, x, y, size, FONT, in, max_w, s);
}

/* Baseline of line k (0-based) in a box whose top is y. */
static int baseline(int y, int k)
{
    return y + PAD + 11 + k * LINE;
}

static void device_lines(const px_plan *p, const dev_draw *dd, size_t i, char l[3][256])
{
    const px_cost_device *d = &p->fleet->devices[i];
    char a[32], b[32];
    snprintf(l[0], 256, "%s (%s)", d->id, d->model);
    px__plan_fmt_bytes(d->mem_capacity, b, sizeof b);
    if (dd[i].stage < 0) {
        snprintf(l[1], 256, "unused");
        snprintf(l[2], 256, "memory %s", b);
        return;
    }
    const px_cost_stage *st = &p->layout.replicas[dd[i].replica].stages[dd[i].stage];
    char rep[32] = "";
    if (p->layout.n_replicas > 1)
        snprintf(rep, sizeof rep, "replica %d, ", dd[i].replica);
    char layers[32];
    if (st->last < st->first)
        snprintf(layers, sizeof layers, "no layers");
    else
        snprintf(layers, sizeof layers, "layers %u-%u", st->first, st->last);
    char tp[16] = "";
    if (st->tp > 1)
        snprintf(tp, sizeof tp, " TP%u", st->tp);
    snprintf(l[1], 256, "%sstage %d: %s%s%s%s", rep, dd[i].stage, layers,
             st->embedding ? " +emb" : "", st->head ? " +head" : "", tp);
    if (dd[i].used >= 0) {
        px__plan_fmt_bytes(dd[i].used, a, sizeof a);
        snprintf(l[2], 256, "memory %s of %s", a, b);
    } else {
        snprintf(l[2], 256, "memory ? of %s", b);
    }
}

/* What binds the plan, from the document's binding list, in words. */
static void binding_line(const json_t *doc, char *out, size_t n)
{
    px_strbuf sb = PX_STRBUF_INIT;
    const json_t *b;
    size_t i;
    char x[32], y[32];
    px_strbuf_adds(&sb, "bound by: ");
    json_array_foreach(json_object_get(doc, "binding"), i, b)
    {
        const char *kind = getstr(b, "kind");
        if (i)
            px_strbuf_adds(&sb, "; ");
        if (!strcmp(kind, "memory")) {
            px__plan_fmt_bytes(getnum(b, "used"), x, sizeof x);
            px__plan_fmt_bytes(getnum(b, "limit"), y, sizeof y);
            px_strbuf_addf(&sb, "memory of %s (%s of %s)", getstr(b, "device"), x, y);
        } else if (!strcmp(kind, "decode-term")) {
            px_strbuf_addf(&sb, "%s on %s", getstr(b, "term"), getstr(b, "device"));
        } else {
            px_strbuf_adds(&sb, kind);
        }
    }
    snprintf(out, n, "%s", sb.buf);
    px_strbuf_release(&sb);
}

/* "replica 0: gpu0 -(nvlink)-> gpu1 -(pcie)-> cpu0". */
static void hops_line(const px_plan *p, uint32_t r, char *out, size_t n)
{
    const px_cost_pipeline *pipe = &p->layout.replicas[r];
    px_strbuf sb = PX_STRBUF_INIT;
    if (p->layout.n_replicas > 1)
        px_strbuf_addf(&sb, "replica %u: ", r);
    for (uint32_t s = 0; s < pipe->n_stages; s++) {
        const px_cost_stage *st = &pipe->stages[s];
        if (s) {
            px_cost_path pa =
                px_cost_fleet_path(p->fleet, pipe->stages[s - 1].devices[0], st->devices[0]);
            px_strbuf_addf(&sb, " -(%s)-> ", px_hw_link_kind_name(pa.kind));
        }
        for (uint32_t k = 0; k < st->tp; k++)
            px_strbuf_addf(&sb, "%s%s", k ? "+" : "", p->fleet->devices[st->devices[k]].id);
    }
    snprintf(out, n, "%s", sb.buf);
    px_strbuf_release(&sb);
}

/* The points where an arrow from box a to box b leaves and enters them. */
static void arrow(px_strbuf *sb, const dev_draw *a, const dev_draw *b, int box_w)
{
    int ax = a->x + box_w / 2, ay = a->y + BOX_H / 2, bx = b->x + box_w / 2, by = b->y + BOX_H / 2;
    int x1 = ax, y1 = ay, x2 = bx, y2 = by;
    if (by - ay >= BOX_H) {
        y1 = a->y + BOX_H;
        y2 = b->y - 2;
    } else if (ay - by >= BOX_H) {
        y1 = a->y;
        y2 = b->y + BOX_H + 2;
    } else if (bx > ax) {
        x1 = a->x + box_w;
        x2 = b->x - 2;
    } else {
        x1 = a->x;
        x2 = b->x + box_w + 2;
    }
    px_strbuf_addf(sb,
                   "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\" "
                   "stroke-width=\"2\" marker-end=\"url(#arrow)\"/>\n",
                   x1, y1, x2, y2);
}

px_status px_plan_svg(const px_plan *p, px_strbuf *sb)
{
    const px_cost_fleet *f = p->fleet;
    const px_hw_view *v = px_hw_graph_view(f->graph);
    const json_t *doc = p->doc;
    size_t n_nodes = v->n_nodes, n_dev = f->n_devices;
    dev_draw *dd = malloc((n_dev ? n_dev : 1) * sizeof *dd);
    int *slot = malloc((n_nodes ? n_nodes : 1) * sizeof *slot);
    int *ndev = calloc(n_nodes ? n_nodes : 1, sizeof *ndev);
    if (!dd || !slot || !ndev) {
        free(dd);
        free(slot);
        free(ndev);
        return PX_ENOMEM;
    }
    for (size_t i = 0; i < n_dev; i++)
        dd[i] = (dev_draw){.replica = -1, .stage = -1, .used = -1, .x = -1};
    const json_t *reps = json_object_get(doc, "replicas");
    for (uint32_t r = 0; r < p->layout.n_replicas; r++) {
        const px_cost_pipeline *pipe = &p->layout.replicas[r];
        const json_t *jst = json_object_get(json_array_get(reps, r), "stages");
        for (uint32_t s = 0; s < pipe->n_stages; s++) {
            const json_t *mem = json_object_get(json_array_get(jst, s), "memory_per_device");
            for (uint32_t k = 0; k < pipe->stages[s].tp; k++) {
                dev_draw *d = &dd[pipe->stages[s].devices[k]];
                d->replica = (int)r;
                d->stage = (int)s;
                d->used = mem ? getnum(mem, "total") : -1;
            }
        }
    }

    /* The box width: the widest device line, within bounds. */
    double want = MIN_BOX_W;
    size_t drawn_nodes = 0, hidden_devs = 0;
    for (size_t j = 0; j < n_nodes; j++)
        slot[j] = j < MAX_NODES ? (int)drawn_nodes++ : -1;
    for (size_t i = 0; i < n_dev; i++) {
        uint32_t j = f->devices[i].node;
        if (j >= n_nodes || slot[j] < 0 || ndev[j] >= MAX_DEVS) {
            hidden_devs++;
            continue;
        }
        ndev[j]++;
        char l[3][256];
        device_lines(p, dd, i, l);
        for (int k = 0; k < 3; k++)
            want = PX_MAX(want, px_svg_text_width(l[k], FONT) + 2 * PAD);
    }
    for (size_t j = 0; j < n_nodes; j++)
        if (slot[j] >= 0) {
            char l[256];
            snprintf(l, sizeof l, "node %s", v->nodes[j].id);
            want = PX_MAX(want, px_svg_text_width(l, FONT) + 2 * PAD);
        }
    int box_w = (int)PX_MIN(want, (double)MAX_BOX_W) + 1;
    int node_w = box_w + 2 * PAD;
    int cols = (int)PX_MIN(drawn_nodes, (size_t)GRID_COLS);

    /* The header's lines, measured before the canvas is sized. */
    const json_t *model = json_object_get(doc, "model"), *inv = json_object_get(doc, "inventory");
    const json_t *pred = json_object_get(doc, "predictions"),
                 *lb = json_object_get(doc, "lower_bound");
    char title[256], sub[512], fig[5][512], a[32], b[32];
    snprintf(title, sizeof title, "plan %.12s: policy %s, objective %s", p->id, p->policy,
             getstr(json_object_get(doc, "objective"), "name"));
    snprintf(sub, sizeof sub, "%s on %s: %zu device(s) on %zu node(s)%s", getstr(model, "name"),
             getstr(inv, "name")[0] ? getstr(inv, "name") : "the inventory", n_dev, n_nodes,
             f->emulated ? "; EMULATED devices: figures describe the emulated hardware" : "");
    const json_t *tpot = json_object_get(pred, "tpot_s"), *ttft = json_object_get(pred, "ttft_s");
    px_format_seconds(getnum(tpot, "p50"), a, sizeof a);
    px_format_seconds(getnum(tpot, "p99"), b, sizeof b);
    snprintf(fig[0], sizeof fig[0], "time per token: p50 %s, p99 %s", a, b);
    px_format_seconds(getnum(ttft, "p50"), a, sizeof a);
    px_format_seconds(getnum(ttft, "p99"), b, sizeof b);
    snprintf(fig[1], sizeof fig[1], "time to first token: p50 %s, p99 %s", a, b);
    snprintf(fig[2], sizeof fig[2],
             "throughput: %.4g tokens/s (p50) from %u replica(s) of %u stage(s)",
             getnum(json_object_get(pred, "throughput_tokens_per_s"), "p50"), p->layout.n_replicas,
             p->layout.replicas[0].n_stages);
    binding_line(doc, fig[3], sizeof fig[3]);
    px_format_seconds(getnum(lb, "tpot_s"), a, sizeof a);
    snprintf(fig[4], sizeof fig[4],
             "lower bound: %s per token on this fleet; the plan reaches %.0f%% of it", a,
             100.0 * getnum(lb, "fraction"));
    uint32_t n_hops = PX_MIN(p->layout.n_replicas, (uint32_t)MAX_HOPS);
    char(*hops)[512] = calloc(n_hops + 1, sizeof *hops);
    if (!hops) {
        free(dd);
        free(slot);
        free(ndev);
        return PX_ENOMEM;
    }
    for (uint32_t r = 0; r < n_hops; r++)
        hops_line(p, r, hops[r], sizeof hops[r]);
    char notes[3][256];
    int n_notes = 0;
    snprintf(notes[n_notes++], sizeof notes[0],
             "colours mark stages; grey boxes are unused devices; memory is per device, used of "
             "capacity");
    if (p->layout.n_replicas > n_hops)
        snprintf(notes[n_notes++], sizeof notes[0],
                 "%u more replica(s): the plan's JSON lists them", p->layout.n_replicas - n_hops);
    if (hidden_devs)
        snprintf(notes[n_notes++], sizeof notes[0],
                 "%zu device(s) not drawn (more than %d nodes or %d devices a node)", hidden_devs,
                 MAX_NODES, MAX_DEVS);
    double line_w = px_svg_text_width(title, TITLE);
    line_w = PX_MAX(line_w, px_svg_text_width(sub, FONT));
    for (int k = 0; k < 5; k++)
        line_w = PX_MAX(line_w, px_svg_text_width(fig[k], FONT) + 2 * PAD);
    for (uint32_t r = 0; r < n_hops; r++)
        line_w = PX_MAX(line_w, px_svg_text_width(hops[r], FONT));
    for (int k = 0; k < n_notes; k++)
        line_w = PX_MAX(line_w, px_svg_text_width(notes[k], FONT));
    line_w = PX_MIN(line_w, (double)MAX_LINE_W);

    /* Rows of node columns: each row as tall as its tallest node. */
    int rows = cols ? (int)((drawn_nodes + (size_t)cols - 1) / (size_t)cols) : 0;
    int *row_h = calloc((size_t)rows + 1, sizeof *row_h);
    if (!row_h) {
        free(dd);
        free(slot);
        free(ndev);
        free(hops);
        return PX_ENOMEM;
    }
    for (size_t j = 0; j < n_nodes; j++)
        if (slot[j] >= 0) {
            int h = LINE + PAD + ndev[j] * (BOX_H + BOX_GAP) + PAD;
            row_h[slot[j] / cols] = PX_MAX(row_h[slot[j] / cols], h);
        }
    int grid_w = cols * node_w + (cols > 0 ? (cols - 1) * NODE_GAP : 0);
    int width = 2 * MARGIN + PX_MAX(grid_w, (int)line_w + 1);
    int fig_top = MARGIN + TITLE + 8 + LINE + 6;
    int fig_h = 5 * LINE + 2 * PAD + 4;
    int grid_top = fig_top + fig_h + 16;
    int y = grid_top;
    for (int r = 0; r < rows; r++)
        y += row_h[r] + NODE_GAP;
    int legend_top = y;
    int height = legend_top + ((int)n_hops + n_notes) * LINE + MARGIN;
    double avail = width - 2 * MARGIN;

    px_strbuf_addf(sb,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                   "font-family=\"%s\" font-size=\"%d\">\n"
                   "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
                   "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 "
                   "L0,10 z\" fill=\"#444\"/></marker></defs>\n"
                   "<rect id=\"canvas\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" "
                   "fill=\"white\"/>\n",
                   width, height, PX_SVG_FONT, FONT, width, height);
    text(sb, MARGIN, MARGIN + TITLE, TITLE, "canvas", avail, title);
    text(sb, MARGIN, MARGIN + TITLE + 8 + 12, FONT, "canvas", avail, sub);
    px_strbuf_addf(sb,
                   "<rect id=\"figures\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                   "fill=\"#fafafa\" stroke=\"#999\"/>\n",
                   MARGIN, fig_top, width - 2 * MARGIN, fig_h);
    for (int k = 0; k < 5; k++)
        text(sb, MARGIN + PAD, baseline(fig_top, k), FONT, "figures", avail - 2 * PAD, fig[k]);

    /* Nodes, then the arrows (under the device boxes), then the boxes. */
    for (size_t j = 0; j < n_nodes; j++) {
        if (slot[j] < 0)
            continue;
        int c = slot[j] % cols, r = slot[j] / cols;
        int nx = MARGIN + c * (node_w + NODE_GAP), ny = grid_top;
        for (int k = 0; k < r; k++)
            ny += row_h[k] + NODE_GAP;
        int nh = LINE + PAD + ndev[j] * (BOX_H + BOX_GAP) + PAD;
        char in[32], l[256];
        snprintf(in, sizeof in, "node%zu", j);
        px_strbuf_addf(sb,
                       "<rect id=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                       "fill=\"#f6f6f6\" stroke=\"#999\" data-node=\"",
                       in, nx, ny, node_w, nh);
        px_svg_escape(sb, v->nodes[j].id);
        px_strbuf_adds(sb, "\"/>\n");
        snprintf(l, sizeof l, "node %s", v->nodes[j].id);
        text(sb, nx + PAD, ny + PAD + 11, FONT, in, node_w - 2 * PAD, l);
        int row = 0;
        for (size_t i = 0; i < n_dev && row < ndev[j]; i++)
            if (f->devices[i].node == j) {
                dd[i].x = nx + PAD;
                dd[i].y = ny + LINE + PAD + row * (BOX_H + BOX_GAP);
                row++;
            }
    }
    for (uint32_t r = 0; r < p->layout.n_replicas; r++) {
        const px_cost_pipeline *pipe = &p->layout.replicas[r];
        for (uint32_t s = 0; s + 1 < pipe->n_stages; s++) {
            /* From the nearest pair of the two groups' drawn devices. */
            const px_cost_stage *sa = &pipe->stages[s], *sb2 = &pipe->stages[s + 1];
            const dev_draw *da = NULL, *db = NULL;
            double best = INFINITY;
            for (uint32_t k = 0; k < sa->tp; k++)
                for (uint32_t m = 0; m < sb2->tp; m++) {
                    const dev_draw *x = &dd[sa->devices[k]], *z = &dd[sb2->devices[m]];
                    double dx = x->x - z->x, dy = x->y - z->y;
                    if (x->x >= 0 && z->x >= 0 && dx * dx + dy * dy < best) {
                        best = dx * dx + dy * dy;
                        da = x;
                        db = z;
                    }
                }
            if (da)
                arrow(sb, da, db, box_w);
        }
    }
    for (size_t i = 0; i < n_dev; i++) {
        if (dd[i].x < 0)
            continue;
        char in[32], l[3][256];
        snprintf(in, sizeof in, "dev%zu", i);
        int s = dd[i].stage;
        px_strbuf_addf(sb,
                       "<rect id=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"4\" "
                       "fill=\"%s\" stroke=\"%s\"%s data-stage=\"%d\" data-replica=\"%d\" "
                       "data-device=\"",
                       in, dd[i].x, dd[i].y, box_w, BOX_H, s >= 0 ? fills[s % 8] : UNUSED_FILL,
                       s >= 0 ? "#333" : "#aaa", s >= 0 ? "" : " stroke-dasharray=\"4 3\"", s,
                       dd[i].replica);
        px_svg_escape(sb, f->devices[i].id);
        px_strbuf_adds(sb, "\"/>\n");
        device_lines(p, dd, i, l);
        for (int k = 0; k < 3; k++)
            text(sb, dd[i].x + PAD, baseline(dd[i].y, k), FONT, in, box_w - 2 * PAD, l[k]);
    }
    y = legend_top + 12;
    for (uint32_t r = 0; r < n_hops; r++, y += LINE)
        text(sb, MARGIN, y, FONT, "canvas", avail, hops[r]);
    for (int k = 0; k < n_notes; k++, y += LINE)
        text(sb, MARGIN, y, FONT, "canvas", avail, notes[k]);
    px_strbuf_adds(sb, "</svg>\n");
    free(dd);
    free(slot);
    free(ndev);
    free(hops);
    free(row_h);
    return sb->len ? PX_OK : PX_ENOMEM;
}
