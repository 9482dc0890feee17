/* Paths between endpoints: Dijkstra over the directional edges with a
 * binary heap and lazy deletion, O(E log E). */
#include "hw/hw_impl.h"

typedef struct heap_item {
    double key;
    uint32_t at;
} heap_item;

typedef struct heap {
    heap_item *items;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, double key, uint32_t at)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        heap_item *items = realloc(h->items, cap * sizeof *items);
        if (!items)
            return false;
        h->items = items;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->items[parent].key <= key)
            break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = (heap_item){key, at};
    return true;
}

static heap_item heap_pop(heap *h)
{
    heap_item top = h->items[0];
    heap_item last = h->items[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->items[c + 1].key < h->items[c].key)
            c++;
        if (h->items[c].key >= last.key)
            break;
        h->items[i] = h->items[c];
        i = c;
    }
    if (h->n)
        h->items[i] = last;
    return top;
}

typedef enum search_kind {
    MIN_TIME,  /* additive: latency + setup + bytes / bandwidth */
    MAX_WIDTH, /* bottleneck bandwidth, maximised (keys negated) */
} search_kind;

/* One Dijkstra pass from `from`.  Edges narrower than min_width are
 * skipped.  Fills dist (the key; for MAX_WIDTH the negated width) and prev
 * (the edge that reached each endpoint, PX_HW_NONE if none). */
static bool dijkstra(const px_hw_graph *g, uint32_t from, search_kind kind, double bytes,
                     double min_width, double *dist, uint32_t *prev)
{
    const px_hw_view *v = &g->view;
    size_t n = v->n_endpoints;
    for (size_t i = 0; i < n; i++) {
        dist[i] = INFINITY;
        prev[i] = PX_HW_NONE;
    }
    heap h = {0};
    dist[from] = kind == MAX_WIDTH ? -INFINITY : 0;
    bool ok = heap_push(&h, dist[from], from);
    while (ok && h.n) {
        heap_item it = heap_pop(&h);
        if (it.key > dist[it.at])
            continue; /* a stale entry */
        size_t n_out;
        const uint32_t *out = px_hw_graph_out_links(g, it.at, &n_out);
        for (size_t k = 0; k < n_out; k++) {
            const px_hw_link *l = &v->links[out[k]];
            double bw = l->bandwidth.value;
            if (bw < min_width || bw <= 0)
                continue;
            double key;
            if (kind == MAX_WIDTH) {
                key = PX_MAX(it.key, -bw);
            } else {
                key = it.key + l->latency.value + l->setup.value + (bytes > 0 ? bytes / bw : 0);
            }
            if (key < dist[l->to]) {
                dist[l->to] = key;
                prev[l->to] = out[k];
                if (!heap_push(&h, key, l->to))
                    ok = false;
            }
        }
    }
    free(h.items);
    return ok;
}

px_status px_hw_graph_path(const px_hw_graph *g, uint32_t from, uint32_t to,
                           px_hw_path_metric metric, double bytes, px_hw_path *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    const px_hw_view *v = &g->view;
    if (from >= v->n_endpoints || to >= v->n_endpoints)
        return px_err_set(err, PX_EINVAL, "endpoint %u is out of range (the graph has %zu)",
                          from >= v->n_endpoints ? from : to, v->n_endpoints);
    if (!(bytes >= 0) || !isfinite(bytes))
        return px_err_set(err, PX_EINVAL, "transfer size must be finite and >= 0");
    out->bandwidth = INFINITY;
    if (from == to)
        return PX_OK;
    size_t n = v->n_endpoints;
    double *dist = malloc(n * sizeof *dist);
    uint32_t *prev = malloc(n * sizeof *prev);
    px_status st = PX_OK;
    if (!dist || !prev) {
        st = px_err_set(err, PX_ENOMEM, "out of memory searching a path");
        goto done;
    }
    double min_width = 0;
    if (metric == PX_HW_PATH_WIDEST) {
        /* First the widest bottleneck, then the least latency among the
         * paths that keep it: exact, where one pass with a lexicographic
         * key would not be. */
        if (!dijkstra(g, from, MAX_WIDTH, 0, 0, dist, prev)) {
            st = px_err_set(err, PX_ENOMEM, "out of memory searching a path");
            goto done;
        }
        if (isinf(dist[to]) && dist[to] > 0)
            goto unreachable;
        min_width = -dist[to];
    }
    if (!dijkstra(g, from, MIN_TIME, metric == PX_HW_PATH_FASTEST ? bytes : 0, min_width, dist,
                  prev)) {
        st = px_err_set(err, PX_ENOMEM, "out of memory searching a path");
        goto done;
    }
    if (prev[to] == PX_HW_NONE)
        goto unreachable;
    size_t hops = 0;
    for (uint32_t at = to; at != from; at = v->links[prev[at]].from)
        hops++;
    out->links = malloc(hops * sizeof *out->links);
    if (!out->links) {
        st = px_err_set(err, PX_ENOMEM, "out of memory searching a path");
        goto done;
    }
    out->n_links = hops;
    out->latency = 0;
    size_t i = hops;
    for (uint32_t at = to; at != from; at = v->links[prev[at]].from) {
        const px_hw_link *l = &v->links[prev[at]];
        out->links[--i] = prev[at];
        out->bandwidth = PX_MIN(out->bandwidth, l->bandwidth.value);
        out->latency += l->latency.value + l->setup.value;
    }
    goto done;

unreachable:
    st = px_err_set(err, PX_ENOTFOUND, "%s: no path from \"%s\" to \"%s\"", px_hw_graph_source(g),
                    px_hw_graph_endpoint_name(g, from), px_hw_graph_endpoint_name(g, to));
done:
    free(dist);
    free(prev);
    if (st != PX_OK) {
        free(out->links);
        memset(out, 0, sizeof *out);
    }
    return st;
}

void px_hw_path_release(px_hw_path *path)
{
    if (!path)
        return;
    free(path->links);
    memset(path, 0, sizeof *path);
}
