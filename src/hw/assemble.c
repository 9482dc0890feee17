/* From the reader's records to the graph: duplicate ids, sorting, indexes,
 * references between elements, links expanded into directional edges and
 * the adjacency lists.  Every step is O(n log n) at worst. */
#include "hw/hw_impl.h"

/* Sorting records by id keeps a pointer to the record; qsort's comparator
 * gets the id through it. */
typedef struct keyed {
    const char *key;
    size_t index;
} keyed;

static int cmp_keyed(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Reports each id seen before (in input order), marking the later record
 * dropped.  `dropped` is the record's flag; `where` its pointer. */
static px_status find_duplicates(px__hw_reader *r, size_t n, const char *(*id_of)(void *, size_t),
                                 bool *(*dropped_of)(void *, size_t),
                                 const char *(*where_of)(void *, size_t), void *recs,
                                 const char *what, const char *fix)
{
    px__hw_index ix;
    if (px__hw_index_init(&ix, r->arena, n) != PX_OK)
        return PX_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (*dropped_of(recs, i))
            continue;
        uint32_t first;
        if (!px__hw_index_put(&ix, id_of(recs, i), (uint32_t)i, &first)) {
            px__hw_error(r, px__hw_ptr(r, where_of(recs, i), "id"), fix,
                         "duplicate %s id \"%s\" (first defined at %s)", what, id_of(recs, i),
                         where_of(recs, first));
            *dropped_of(recs, i) = true;
        }
    }
    return PX_OK;
}

#define ACCESSORS(rec_type, field, id_expr)                \
    static const char *rec_type##_id(void *p, size_t i)    \
    {                                                      \
        return ((rec_type *)p)[i].field.id_expr;           \
    }                                                      \
    static bool *rec_type##_dropped(void *p, size_t i)     \
    {                                                      \
        return &((rec_type *)p)[i].dropped;                \
    }                                                      \
    static const char *rec_type##_where(void *p, size_t i) \
    {                                                      \
        return ((rec_type *)p)[i].field.where;             \
    }

ACCESSORS(px__hw_domain_rec, d, id)
ACCESSORS(px__hw_node_rec, n, id)

static const char *device_rec_id(void *p, size_t i)
{
    return ((px__hw_device_rec *)p)[i].d->global_id;
}

static bool *device_rec_dropped(void *p, size_t i)
{
    return &((px__hw_device_rec *)p)[i].dropped;
}

static const char *device_rec_where(void *p, size_t i)
{
    return ((px__hw_device_rec *)p)[i].d->where;
}

/* Moves element src[i] of base (elements of size bytes, cap of them) to
 * position i, for i < n, by swaps: the arrays are large and their elements
 * too, so they are put in order where they were read rather than copied.
 * The src are distinct. */
static px_status permute(void *base, size_t size, size_t cap, const uint32_t *src, size_t n)
{
    unsigned char *a = base;
    uint32_t *occupant = malloc((cap + 1) * sizeof *occupant);
    uint32_t *loc = malloc((cap + 1) * sizeof *loc);
    unsigned char *tmp = malloc(size);
    if (!occupant || !loc || !tmp) {
        free(occupant);
        free(loc);
        free(tmp);
        return PX_ENOMEM;
    }
    /* occupant[p]: which original element sits at p; loc[e]: where
     * original element e sits now. */
    for (size_t i = 0; i < cap; i++)
        occupant[i] = loc[i] = (uint32_t)i;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = src[i], j = loc[e];
        if (j == i)
            continue;
        memcpy(tmp, a + i * size, size);
        memcpy(a + i * size, a + (size_t)j * size, size);
        memcpy(a + (size_t)j * size, tmp, size);
        uint32_t o = occupant[i];
        occupant[i] = e;
        occupant[j] = o;
        loc[e] = (uint32_t)i;
        loc[o] = j;
    }
    free(occupant);
    free(loc);
    free(tmp);
    return PX_OK;
}

/* Resolves a sorted, deduplicated list of domain names into indices,
 * reporting unknown ones at "<owner_where>/domains". */
static const uint32_t *resolve_domains(px__hw_reader *r, const px_hw_graph *g,
                                       const char *const *names, size_t n, const char *owner_where,
                                       size_t *n_out)
{
    *n_out = 0;
    if (!n)
        return NULL;
    uint32_t *ix = px_arena_calloc(r->arena, n, sizeof *ix);
    if (!ix) {
        r->oom = true;
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d;
        if (px__hw_index_get(&g->domains, names[i], &d)) {
            ix[k++] = d;
            continue;
        }
        char shown[48];
        px_strlcpy(shown, names[i], sizeof shown);
        px__hw_error_at(r, owner_where, "domains", NULL,
                        "define it under /domains or correct the name",
                        "domain \"%s\" is not defined", shown);
    }
    /* Domain indices follow sorted ids, and names were sorted: already in
     * order. */
    *n_out = k;
    return ix;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static px_status assemble_domains(px__hw_reader *r, px__hw_build *b, px_hw_graph *g)
{
    if (find_duplicates(r, b->n_domains, px__hw_domain_rec_id, px__hw_domain_rec_dropped,
                        px__hw_domain_rec_where, b->domains, "domain",
                        "give each domain its own id") != PX_OK)
        return PX_ENOMEM;
    keyed *order = px_arena_calloc(r->arena, b->n_domains + 1, sizeof *order);
    if (!order)
        return PX_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < b->n_domains; i++)
        if (!b->domains[i].dropped)
            order[n++] = (keyed){b->domains[i].d.id, i};
    qsort(order, n, sizeof *order, cmp_keyed);
    px_hw_domain *doms = px_arena_calloc(r->arena, n + 1, sizeof *doms);
    if (!doms || px__hw_index_init(&g->domains, r->arena, n) != PX_OK)
        return PX_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        doms[i] = b->domains[order[i].index].d;
        px__hw_index_put(&g->domains, doms[i].id, (uint32_t)i, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        const char *parent = b->domains[order[i].index].parent;
        if (!parent)
            continue;
        uint32_t p;
        if (px__hw_index_get(&g->domains, parent, &p))
            doms[i].parent = p;
        else
            px__hw_error(r, px__hw_ptr(r, doms[i].where, "parent"),
                         "define the parent under /domains or correct the name",
                         "parent domain \"%s\" is not defined", parent);
    }
    g->view.domains = doms;
    g->view.n_domains = n;
    return PX_OK;
}

static px_status assemble_nodes_devices(px__hw_reader *r, px__hw_build *b, px_hw_graph *g)
{
    if (find_duplicates(r, b->n_nodes, px__hw_node_rec_id, px__hw_node_rec_dropped,
                        px__hw_node_rec_where, b->nodes, "node",
                        "give each node its own id") != PX_OK)
        return PX_ENOMEM;
    /* A duplicate node's devices go with it; they would clash anyway. */
    for (size_t i = 0; i < b->n_devices; i++)
        if (b->nodes[b->devices[i].node_rec].dropped)
            b->devices[i].dropped = true;
    if (find_duplicates(r, b->n_devices, device_rec_id, device_rec_dropped, device_rec_where,
                        b->devices, "device", "give each device of a node its own id") != PX_OK)
        return PX_ENOMEM;

    keyed *norder = px_arena_calloc(r->arena, b->n_nodes + 1, sizeof *norder);
    keyed *dorder = px_arena_calloc(r->arena, b->n_devices + 1, sizeof *dorder);
    size_t *node_final = px_arena_calloc(r->arena, b->n_nodes + 1, sizeof *node_final);
    if (!norder || !dorder || !node_final)
        return PX_ENOMEM;
    size_t nn = 0, nd = 0;
    for (size_t i = 0; i < b->n_nodes; i++)
        if (!b->nodes[i].dropped)
            norder[nn++] = (keyed){b->nodes[i].n.id, i};
    for (size_t i = 0; i < b->n_devices; i++)
        if (!b->devices[i].dropped)
            dorder[nd++] = (keyed){b->devices[i].d->global_id, i};
    qsort(norder, nn, sizeof *norder, cmp_keyed);
    qsort(dorder, nd, sizeof *dorder, cmp_keyed);

    px_hw_node *nodes = px_arena_calloc(r->arena, nn + 1, sizeof *nodes);
    px_hw_device *devs = b->device_slots;
    uint32_t *src = malloc((nd + 1) * sizeof *src);
    if (!src)
        return PX_ENOMEM;
    for (size_t i = 0; i < nd; i++)
        src[i] = (uint32_t)dorder[i].index;
    uint32_t *node_devs = px_arena_calloc(r->arena, nd + 1, sizeof *node_devs);
    size_t *fill = px_arena_calloc(r->arena, nn + 1, sizeof *fill);
    if (!nodes || !node_devs || !fill || px__hw_index_init(&g->nodes, r->arena, nn) != PX_OK ||
        px__hw_index_init(&g->devices, r->arena, nd) != PX_OK ||
        px__hw_index_init(&g->endpoints, r->arena, nn + nd) != PX_OK) {
        free(src);
        return PX_ENOMEM;
    }

    for (size_t i = 0; i < nn; i++) {
        px__hw_node_rec *rec = &b->nodes[norder[i].index];
        node_final[norder[i].index] = i;
        nodes[i] = rec->n;
        nodes[i].emulated = rec->n.emulated || b->emulated;
        nodes[i].endpoint = (uint32_t)(nd + i);
        nodes[i].domains = resolve_domains(r, g, rec->domain_names, rec->n_domain_names,
                                           rec->n.where, &nodes[i].n_domains);
        px__hw_index_put(&g->nodes, nodes[i].id, (uint32_t)i, NULL);
        px__hw_index_put(&g->endpoints, nodes[i].id, (uint32_t)(nd + i), NULL);
    }
    /* Devices sorted by global id are grouped by node ("n1." is a prefix
     * of all of n1's), and within a node sorted by local id.  Their fields
     * are completed where they were read, then they are moved in order. */
    for (size_t i = 0; i < nd; i++) {
        px__hw_device_rec *rec = &b->devices[dorder[i].index];
        size_t ni = node_final[rec->node_rec];
        px_hw_device *d = rec->d;
        d->node = (uint32_t)ni;
        d->endpoint = (uint32_t)i;
        d->emulated = d->emulated || nodes[ni].emulated;
        size_t n_own;
        const uint32_t *own =
            resolve_domains(r, g, rec->domain_names, rec->n_domain_names, d->where, &n_own);
        size_t total = n_own + nodes[ni].n_domains;
        if (total) {
            uint32_t *all = px_arena_calloc(r->arena, total, sizeof *all);
            if (!all) {
                free(src);
                return PX_ENOMEM;
            }
            memcpy(all, nodes[ni].domains, nodes[ni].n_domains * sizeof *all);
            if (n_own)
                memcpy(all + nodes[ni].n_domains, own, n_own * sizeof *all);
            qsort(all, total, sizeof *all, cmp_u32);
            size_t m = 0;
            for (size_t k = 0; k < total; k++)
                if (m == 0 || all[m - 1] != all[k])
                    all[m++] = all[k];
            d->domains = all;
            d->n_domains = m;
        }
        nodes[ni].n_devices++;
    }
    px_status st = permute(devs, sizeof *devs, b->n_devices, src, nd);
    free(src);
    if (st != PX_OK)
        return st;
    for (size_t i = 0; i < nd; i++) {
        px__hw_index_put(&g->devices, devs[i].global_id, (uint32_t)i, NULL);
        px__hw_index_put(&g->endpoints, devs[i].global_id, (uint32_t)i, NULL);
    }
    size_t at = 0;
    for (size_t i = 0; i < nn; i++) {
        nodes[i].devices = node_devs + at;
        fill[i] = at;
        at += nodes[i].n_devices;
    }
    for (size_t i = 0; i < nd; i++)
        node_devs[fill[devs[i].node]++] = (uint32_t)i;

    g->view.nodes = nodes;
    g->view.n_nodes = nn;
    g->view.devices = devs;
    g->view.n_devices = nd;
    g->view.n_endpoints = nn + nd;
    return PX_OK;
}

/* The fix for a dangling endpoint: point at the node's devices when the
 * node exists, otherwise at /nodes. */
static char *endpoint_fix(const px_hw_graph *g, const char *name)
{
    const char *dot = strchr(name, '.');
    if (!dot)
        return px_strdup("define the node under /nodes or correct the id");
    char node[2 * PX__HW_MAX_ID + 2];
    size_t n = (size_t)(dot - name);
    if (n >= sizeof node)
        n = sizeof node - 1;
    memcpy(node, name, n);
    node[n] = '\0';
    uint32_t ni;
    if (px__hw_index_get(&g->nodes, node, &ni))
        return px_asprintf("define it under %s/devices or correct the id", g->view.nodes[ni].where);
    return px_asprintf("node \"%s\" is not defined either; define it under /nodes or "
                       "correct the id",
                       node);
}

static bool resolve_end(px__hw_reader *r, const px_hw_graph *g, const px__hw_link_rec *rec,
                        const char *key, const char *name, uint32_t *out)
{
    if (px__hw_index_get(&g->endpoints, name, out))
        return true;
    char *fix = endpoint_fix(g, name);
    px__hw_error(r, px__hw_ptr(r, rec->l->where, key), fix, "%s \"%s\" is not defined",
                 strchr(name, '.') ? "device" : "node", name);
    free(fix);
    return false;
}

/* Edges are sorted through a small key per edge, then moved into place
 * in the array they were read into, rather than copied: each is some 500
 * bytes. */
typedef struct edge_key {
    uint32_t from, to;
    const char *id;
    const char *where;
    uint32_t slot; /* where the edge is now */
    bool reverse;
} edge_key;

static int cmp_edge(const void *a, const void *b)
{
    const edge_key *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if (x->to != y->to)
        return x->to < y->to ? -1 : 1;
    int c = strcmp(x->id ? x->id : "", y->id ? y->id : "");
    if (c)
        return c;
    /* Same ends, no ids: order by where they were declared, which is the
     * best a stable order can do for links nothing else tells apart. */
    c = strcmp(x->where, y->where);
    if (c)
        return c;
    return x->reverse - y->reverse;
}

static px_status assemble_links(px__hw_reader *r, px__hw_build *b, px_hw_graph *g)
{
    px__hw_index ids;
    if (px__hw_index_init(&ids, r->arena, b->n_links) != PX_OK)
        return PX_ENOMEM;
    const char **cnames = px_arena_calloc(r->arena, b->n_links + 1, sizeof *cnames);
    if (!cnames)
        return PX_ENOMEM;
    size_t n_edges = 0, n_c = 0;
    for (size_t i = 0; i < b->n_links; i++) {
        px__hw_link_rec *rec = &b->links[i];
        if (rec->dropped)
            continue;
        if (rec->l->id) {
            uint32_t first;
            if (!px__hw_index_put(&ids, rec->l->id, (uint32_t)i, &first)) {
                px__hw_error(r, px__hw_ptr(r, rec->l->where, "id"), "give each link its own id",
                             "duplicate link id \"%s\" (first defined at %s)", rec->l->id,
                             b->links[first].l->where);
                rec->dropped = true;
                continue;
            }
        }
        bool ok = resolve_end(r, g, rec, "from", rec->from_name, &rec->l->from);
        ok &= resolve_end(r, g, rec, "to", rec->to_name, &rec->l->to);
        if (ok && rec->l->from == rec->l->to) {
            px__hw_error(r, px__hw_ptr(r, rec->l->where, "to"),
                         "a link joins two different endpoints; remove it",
                         "link from \"%s\" to itself", rec->from_name);
            ok = false;
        }
        if (!ok) {
            rec->dropped = true;
            continue;
        }
        if (rec->contention_name)
            cnames[n_c++] = rec->contention_name;
        n_edges += rec->l->bidirectional ? 2 : 1;
    }
    qsort(cnames, n_c, sizeof *cnames, px__hw_cmp_str);
    size_t m = 0;
    for (size_t i = 0; i < n_c; i++)
        if (m == 0 || strcmp(cnames[m - 1], cnames[i]))
            cnames[m++] = cnames[i];
    px__hw_index cix;
    if (px__hw_index_init(&cix, r->arena, m) != PX_OK)
        return PX_ENOMEM;
    for (size_t i = 0; i < m; i++)
        px__hw_index_put(&cix, cnames[i], (uint32_t)i, NULL);

    edge_key *keys = malloc((n_edges + 1) * sizeof *keys);
    uint32_t *src = malloc((n_edges + 1) * sizeof *src);
    if (!keys || !src) {
        free(keys);
        free(src);
        return PX_ENOMEM;
    }
    px_hw_link *edges = b->edges;
    size_t k = 0;
    for (size_t i = 0; i < b->n_links; i++) {
        px__hw_link_rec *rec = &b->links[i];
        if (rec->dropped)
            continue;
        px_hw_link *e = rec->l;
        if (rec->contention_name)
            px__hw_index_get(&cix, rec->contention_name, &e->contention);
        keys[k++] = (edge_key){e->from, e->to, e->id, e->where, (uint32_t)(2 * i), false};
        if (e->bidirectional) {
            px_hw_link *back = &edges[2 * i + 1];
            *back = *e;
            back->from = e->to;
            back->to = e->from;
            back->reverse = true;
            keys[k++] =
                (edge_key){back->from, back->to, e->id, e->where, (uint32_t)(2 * i + 1), true};
        }
    }
    qsort(keys, n_edges, sizeof *keys, cmp_edge);
    for (size_t i = 0; i < n_edges; i++)
        src[i] = keys[i].slot;
    free(keys);
    px_status st = permute(edges, sizeof *edges, 2 * b->n_links, src, n_edges);
    free(src);
    if (st != PX_OK)
        return st;

    /* Edges sorted by (from, to): each endpoint's outgoing edges are one
     * run, already ordered by their far end. */
    size_t ne = g->view.n_endpoints;
    g->adj_start = px_arena_calloc(r->arena, ne + 1, sizeof *g->adj_start);
    g->adj = px_arena_calloc(r->arena, n_edges + 1, sizeof *g->adj);
    if (!g->adj_start || !g->adj)
        return PX_ENOMEM;
    for (size_t i = 0; i < n_edges; i++) {
        g->adj[i] = (uint32_t)i;
        g->adj_start[edges[i].from + 1]++;
    }
    for (size_t e = 0; e < ne; e++)
        g->adj_start[e + 1] += g->adj_start[e];

    g->view.links = edges;
    g->view.n_links = n_edges;
    g->view.contention = cnames;
    g->view.n_contention = m;
    return PX_OK;
}

/* A one-way link whose reverse direction nobody declared is legal (paths
 * can be asymmetric) but usually an omission. */
static void warn_one_way(px__hw_reader *r, const px_hw_graph *g)
{
    const px_hw_view *v = &g->view;
    for (size_t i = 0; i < v->n_links; i++) {
        const px_hw_link *l = &v->links[i];
        if (l->bidirectional)
            continue;
        /* Outgoing edges are sorted by their far end: binary search keeps
         * this linear-logarithmic when many links share an endpoint. */
        size_t n;
        const uint32_t *out = px_hw_graph_out_links(g, l->to, &n);
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (v->links[out[mid]].to < l->from)
                lo = mid + 1;
            else
                hi = mid;
        }
        bool back = lo < n && v->links[out[lo]].to == l->from;
        if (!back)
            px__hw_warning(
                r, l->where, "declare the reverse direction too, or set \"bidirectional\": true",
                "link from \"%s\" to \"%s\" has no reverse direction",
                px_hw_graph_endpoint_name(g, l->from), px_hw_graph_endpoint_name(g, l->to));
    }
}

px_status px__hw_assemble(px__hw_reader *r, px__hw_build *b, px_hw_graph *g)
{
    g->view.name = b->name;
    g->view.description = b->description;
    g->view.emulated = b->emulated;
    if (assemble_domains(r, b, g) != PX_OK || assemble_nodes_devices(r, b, g) != PX_OK ||
        assemble_links(r, b, g) != PX_OK)
        return PX_ENOMEM;
    warn_one_way(r, g);
    return r->oom ? PX_ENOMEM : PX_OK;
}
