/* The graph's accessors, lookups and summaries. */
#include "hw/hw_impl.h"

void px_hw_graph_free(px_hw_graph *g)
{
    if (!g)
        return;
    px_arena_free(g->arena);
    free(g);
}

const px_hw_view *px_hw_graph_view(const px_hw_graph *g)
{
    return &g->view;
}

const char *px_hw_graph_source(const px_hw_graph *g)
{
    return g->source ? g->source : "inventory";
}

bool px_hw_graph_find_device(const px_hw_graph *g, const char *global_id, uint32_t *index)
{
    return px__hw_index_get(&g->devices, global_id, index);
}

bool px_hw_graph_find_node(const px_hw_graph *g, const char *id, uint32_t *index)
{
    return px__hw_index_get(&g->nodes, id, index);
}

bool px_hw_graph_find_domain(const px_hw_graph *g, const char *id, uint32_t *index)
{
    return px__hw_index_get(&g->domains, id, index);
}

bool px_hw_graph_find_endpoint(const px_hw_graph *g, const char *id, uint32_t *endpoint)
{
    return px__hw_index_get(&g->endpoints, id, endpoint);
}

const char *px_hw_graph_endpoint_name(const px_hw_graph *g, uint32_t endpoint)
{
    const px_hw_view *v = &g->view;
    if (endpoint < v->n_devices)
        return v->devices[endpoint].global_id;
    if (endpoint < v->n_endpoints)
        return v->nodes[endpoint - v->n_devices].id;
    return "?";
}

const uint32_t *px_hw_graph_out_links(const px_hw_graph *g, uint32_t endpoint, size_t *n)
{
    if (endpoint >= g->view.n_endpoints || !g->adj_start) {
        *n = 0;
        return g->adj;
    }
    *n = g->adj_start[endpoint + 1] - g->adj_start[endpoint];
    return g->adj + g->adj_start[endpoint];
}

size_t px_hw_graph_memory(const px_hw_graph *g)
{
    return px_arena_reserved(g->arena) + sizeof *g;
}

double px_hw_device_memory_capacity(const px_hw_device *d)
{
    double sum = 0;
    for (size_t i = 0; i < d->n_memory; i++)
        sum += d->memory[i].capacity.value;
    return sum;
}

double px_hw_device_memory_bandwidth(const px_hw_device *d)
{
    double best = 0;
    for (size_t i = 0; i < d->n_memory; i++)
        if (d->memory[i].bandwidth.value > best)
            best = d->memory[i].bandwidth.value;
    return best;
}

double px_hw_device_peak(const px_hw_device *d, px_hw_dtype dt)
{
    if ((unsigned)dt >= PX_HW_DTYPE_COUNT || !px_hw_has(d->compute[dt]))
        return 0;
    return d->compute[dt].value;
}

double px_hw_graph_total_device_memory(const px_hw_graph *g)
{
    double sum = 0;
    for (size_t i = 0; i < g->view.n_devices; i++)
        sum += px_hw_device_memory_capacity(&g->view.devices[i]);
    return sum;
}
