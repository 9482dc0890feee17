/* The fleet view: a flat record per device, islands, classes, and a cache
 * of device-to-device routes over the hardware graph. */
#include "base/common.h"

#include <strings.h>

#include "cost/cost_impl.h"

/* Open-addressing map from (a, b) to a route. */
typedef struct path_slot {
    uint64_t key; /* (a << 32 | b) + 1; 0 marks an empty slot */
    px_cost_path path;
} path_slot;

struct px__cost_path_cache {
    path_slot *slots;
    size_t cap, n;
    double host_link_bw, host_link_latency;
};

double px__cost_qty_rel(const px_qty *q, double fallback)
{
    if (q->unc.kind == PX_UNC_RELATIVE && q->unc.rel >= 0)
        return q->unc.rel;
    if (q->unc.kind == PX_UNC_INTERVAL && q->value > 0) {
        double w = PX_MAX(q->value - q->unc.lo, q->unc.hi - q->value);
        return w / q->value;
    }
    return fallback;
}

double px__cost_bpe(px_dtype dt, double fallback)
{
    if ((int)dt < 0 || dt >= PX_DTYPE_COUNT_)
        return fallback;
    double b = px_dtype_bytes_per_elem(dt);
    return b > 0 ? b : fallback;
}

static double node_ddr(const px_hw_node *n, double *bw)
{
    double cap = 0, best = 0;
    for (size_t i = 0; i < n->n_memory; i++) {
        if (n->memory[i].kind != PX_HW_MEM_DDR && n->memory[i].kind != PX_HW_MEM_CXL)
            continue;
        cap += n->memory[i].capacity.value;
        if (px_hw_has(n->memory[i].bandwidth) && n->memory[i].bandwidth.value > best)
            best = n->memory[i].bandwidth.value;
    }
    if (bw)
        *bw = best;
    return cap;
}

/* The tier whose bandwidth is highest, for its uncertainty. */
static const px_qty *best_bw_qty(const px_hw_device *d)
{
    const px_qty *q = NULL;
    for (size_t i = 0; i < d->n_memory; i++)
        if (px_hw_has(d->memory[i].bandwidth) && (!q || d->memory[i].bandwidth.value > q->value))
            q = &d->memory[i].bandwidth;
    return q;
}

static uint32_t uf_find(uint32_t *parent, uint32_t x)
{
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

static bool fast_link(px_hw_link_kind k)
{
    return px_hw_link_kind_is_nvlink(k) || k == PX_HW_LINK_INFINITY_FABRIC || k == PX_HW_LINK_ICI;
}

typedef struct class_key {
    uint32_t dev;
    const char *model, *backend;
    px_hw_class cls;
    double cap, bw, peak, island_size;
} class_key;

static int cmp_class_key(const void *pa, const void *pb)
{
    const class_key *a = pa, *b = pb;
    int c = strcmp(a->model, b->model);
    if (c)
        return c;
    if ((c = strcmp(a->backend, b->backend)))
        return c;
    if (a->cls != b->cls)
        return a->cls < b->cls ? -1 : 1;
    if (a->cap != b->cap)
        return a->cap < b->cap ? -1 : 1;
    if (a->bw != b->bw)
        return a->bw < b->bw ? -1 : 1;
    if (a->peak != b->peak)
        return a->peak < b->peak ? -1 : 1;
    if (a->island_size != b->island_size)
        return a->island_size < b->island_size ? -1 : 1;
    return a->dev < b->dev ? -1 : (a->dev > b->dev);
}

static bool same_class(const class_key *a, const class_key *b)
{
    return !strcmp(a->model, b->model) && !strcmp(a->backend, b->backend) && a->cls == b->cls &&
           a->cap == b->cap && a->bw == b->bw && a->peak == b->peak &&
           a->island_size == b->island_size;
}

static px_status assign_classes(px_cost_fleet *f, px_err *err)
{
    size_t n = f->n_devices;
    uint32_t *island_size = calloc(n, sizeof *island_size);
    class_key *keys = calloc(n, sizeof *keys);
    if (!island_size || !keys) {
        free(island_size);
        free(keys);
        return px_err_set(err, PX_ENOMEM, "out of memory building device classes");
    }
    for (size_t i = 0; i < n; i++)
        island_size[f->devices[i].island]++;
    for (size_t i = 0; i < n; i++) {
        const px_cost_device *d = &f->devices[i];
        keys[i] = (class_key){.dev = (uint32_t)i,
                              .model = d->model,
                              .backend = d->backend,
                              .cls = d->cls,
                              .cap = d->mem_capacity,
                              .bw = d->mem_bw,
                              .peak = d->peak[PX_HW_DTYPE_F16] + d->peak[PX_HW_DTYPE_F32],
                              .island_size = island_size[d->island]};
    }
    qsort(keys, n, sizeof *keys, cmp_class_key);
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && !same_class(&keys[i - 1], &keys[i]))
            k++;
        f->devices[keys[i].dev].klass = k;
    }
    f->n_classes = n ? k + 1 : 0;
    free(island_size);
    free(keys);
    return PX_OK;
}

static px_status build_islands(px_cost_fleet *f, const px_hw_view *v, px_err *err)
{
    size_t n = f->n_devices;
    uint32_t *parent = malloc(n * sizeof *parent);
    uint32_t *id = malloc(n * sizeof *id);
    if (!parent || !id) {
        free(parent);
        free(id);
        return px_err_set(err, PX_ENOMEM, "out of memory building link islands");
    }
    for (size_t i = 0; i < n; i++)
        parent[i] = (uint32_t)i;
    for (size_t i = 0; i < v->n_links; i++) {
        const px_hw_link *l = &v->links[i];
        if (l->from >= n || l->to >= n || !fast_link(l->kind))
            continue;
        uint32_t a = uf_find(parent, l->from), b = uf_find(parent, l->to);
        if (a != b)
            parent[a < b ? b : a] = a < b ? a : b;
    }
    for (size_t i = 0; i < n; i++)
        id[i] = UINT32_MAX;
    uint32_t next = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = uf_find(parent, (uint32_t)i);
        if (id[r] == UINT32_MAX)
            id[r] = next++;
        f->devices[i].island = id[r];
    }
    f->n_islands = next;
    free(parent);
    free(id);
    return PX_OK;
}

const char *px_cost_default_backend(px_hw_class cls, const char *vendor)
{
    if (cls == PX_HW_CLASS_CPU)
        return "cpu";
    /* The vendor's own stack, named for what it is: plexus plans for it
     * whether or not it can run it, and never calls it cuda unless it is. */
    static const struct {
        const char *vendor, *backend;
    } by_vendor[] = {{"nvidia", "cuda"},  {"amd", "rocm"},     {"apple", "metal"},
                     {"intel", "oneapi"}, {"google", "xla"},   {"habana", "synapse"},
                     {"aws", "neuron"},   {"qualcomm", "qnn"}, {"huawei", "cann"}};
    for (size_t i = 0; vendor && i < PX_ARRAY_LEN(by_vendor); i++)
        if (!strcasecmp(vendor, by_vendor[i].vendor))
            return by_vendor[i].backend;
    return "unknown";
}

double px_cost_device_overhead(const px_cost_params *p, const px_cost_device *d)
{
    bool cpu = d->cls == PX_HW_CLASS_CPU || !strcmp(d->backend, "cpu");
    bool emu = !strcmp(d->backend, "emu");
    /* Emulated devices run the cpu kernels and need their workspace; any
     * other accelerator stack holds a context like CUDA's. */
    double workspace = cpu || emu ? p->workspace_cpu : p->workspace_gpu;
    double runtime = emu ? p->runtime_emu : cpu ? p->runtime_cpu : p->runtime_cuda;
    return workspace + runtime;
}

static void fill_device(px_cost_device *cd, const px_hw_view *v, uint32_t i,
                        const px_cost_params *p)
{
    const px_hw_device *d = &v->devices[i];
    const px_hw_node *node = d->node < v->n_nodes ? &v->nodes[d->node] : NULL;
    double host_bw = 0;
    double host_cap = node ? node_ddr(node, &host_bw) : 0;

    memset(cd, 0, sizeof *cd);
    cd->id = d->global_id;
    cd->model = d->model ? d->model : d->catalog ? d->catalog : px_hw_class_name(d->cls);
    cd->backend = d->backend ? d->backend : px_cost_default_backend(d->cls, d->vendor);
    cd->node_id = node ? node->id : "";
    cd->cls = d->cls;
    cd->hw_index = i;
    cd->node = d->node;
    cd->emulated = d->emulated || v->emulated;
    cd->all_ops = d->all_ops;
    cd->host_mem = host_cap;
    /* What it asks of its host's cores while busy: a cpu device runs on
     * them (one thread per stage worker); an emulated one runs the cpu
     * kernels for 1/slowdown of its time and sleeps the rest. */
    cd->host_cores = node && node->cpu_cores.value > 0 ? node->cpu_cores.value : 0;
    if (!strcmp(cd->backend, "cpu")) {
        cd->host_busy_mem = cd->host_busy_compute = 1.0;
    } else if (!strcmp(cd->backend, "emu")) {
        cd->host_busy_mem = d->emu.present ? 1.0 / d->emu.memory_slowdown : 1.0;
        cd->host_busy_compute = d->emu.present ? 1.0 / d->emu.compute_slowdown : 1.0;
    }

    cd->mem_capacity = px_hw_device_memory_capacity(d);
    cd->mem_bw = px_hw_device_memory_bandwidth(d);
    const px_qty *bwq = best_bw_qty(d);
    if (cd->mem_capacity <= 0 && cd->cls == PX_HW_CLASS_CPU) {
        /* A CPU without tiers of its own works out of its node's DDR. */
        cd->mem_capacity = host_cap;
        if (cd->mem_bw <= 0)
            cd->mem_bw = host_bw;
        if (node)
            for (size_t t = 0; t < node->n_memory; t++)
                if (px_hw_has(node->memory[t].bandwidth) &&
                    node->memory[t].bandwidth.value == host_bw)
                    bwq = &node->memory[t].bandwidth;
    }
    if (cd->mem_bw <= 0) {
        cd->mem_bw = 20e9;
        cd->assumed |= PX_COST_ASSUMED_MEM_BW;
    }
    cd->mem_bw_rel = bwq ? px__cost_qty_rel(bwq, -1) : -1;
    if (cd->mem_bw_rel < 0) {
        cd->mem_bw_rel = p->default_rel_unc;
        cd->assumed |= PX_COST_ASSUMED_BW_UNC;
    }
    cd->mem_free = cd->mem_capacity;
    const px_hw_live *live = cd->cls == PX_HW_CLASS_CPU && node ? &node->live : &d->live;
    if (live->present && px_hw_has(live->memory_free) && live->memory_free.value >= 0)
        cd->mem_free = PX_MIN(cd->mem_capacity, live->memory_free.value);

    const px_qty *pq = NULL;
    for (int t = 0; t < PX_HW_DTYPE_COUNT; t++) {
        cd->peak[t] = px_hw_device_peak(d, (px_hw_dtype)t);
        if (!pq && cd->peak[t] > 0 &&
            (t == PX_HW_DTYPE_F16 || t == PX_HW_DTYPE_BF16 || t == PX_HW_DTYPE_F32))
            pq = &d->compute[t];
    }
    cd->peak_rel = pq ? px__cost_qty_rel(pq, p->default_rel_unc) : p->default_rel_unc;

    if (px_hw_has(d->power_tdp) && d->power_tdp.value > 0) {
        cd->power_active = d->power_tdp.value;
    } else {
        cd->power_active = d->cls == PX_HW_CLASS_CPU ? p->default_power_cpu : p->default_power_gpu;
        cd->assumed |= PX_COST_ASSUMED_POWER;
    }
    cd->power_idle =
        px_hw_has(d->power_idle) ? d->power_idle.value : cd->power_active * p->idle_fraction;
    cd->cost_rate = px_hw_has(d->cost) ? d->cost.value : 0;
    if (px_hw_has(d->mtbf) && d->mtbf.value > 0) {
        cd->mtbf_s = d->mtbf.value;
    } else {
        cd->mtbf_s = p->default_mtbf_s;
        cd->assumed |= PX_COST_ASSUMED_MTBF;
    }
    cd->domains = d->domains;
    cd->n_domains = d->n_domains;
}

/* The widest direct edge from one endpoint to another, as a one-hop
 * route; false when there is none. */
static bool direct_link(const px_hw_graph *g, uint32_t from, uint32_t to, px_cost_path *r)
{
    const px_hw_view *v = px_hw_graph_view(g);
    size_t n;
    const uint32_t *out = px_hw_graph_out_links(g, from, &n);
    int64_t best = -1;
    for (size_t i = 0; i < n; i++) {
        const px_hw_link *l = &v->links[out[i]];
        if (l->to == to && (best < 0 || l->bandwidth.value > v->links[best].bandwidth.value))
            best = out[i];
    }
    if (best < 0)
        return false;
    const px_hw_link *l = &v->links[best];
    *r = (px_cost_path){.bw = l->bandwidth.value,
                        .bw_rel = px__cost_qty_rel(&l->bandwidth, 0.10),
                        .latency = (px_hw_has(l->latency) ? l->latency.value : 0) +
                                   (px_hw_has(l->setup) ? l->setup.value : 0),
                        .n_hops = 1,
                        .contention = l->contention,
                        .bottleneck = (int32_t)best,
                        .kind = l->kind,
                        .reachable = true};
    return true;
}

/* The device's route to its own node's host side. */
static void host_route(px_cost_fleet *f, px_cost_device *cd, const px_hw_view *v,
                       const px_cost_params *p)
{
    const px_hw_device *d = &v->devices[cd->hw_index];
    if (cd->cls == PX_HW_CLASS_CPU) {
        cd->host_bw = cd->mem_bw;
        cd->host_latency = 0;
        cd->host_link = -1;
        return;
    }
    px_cost_path direct;
    if (d->node < v->n_nodes &&
        direct_link(f->graph, d->endpoint, v->nodes[d->node].endpoint, &direct)) {
        cd->host_bw = direct.bw;
        cd->host_latency = direct.latency;
        cd->host_link = direct.bottleneck;
        return;
    }
    if (d->node < v->n_nodes) {
        px_hw_path path;
        if (px_hw_graph_path(f->graph, d->endpoint, v->nodes[d->node].endpoint, PX_HW_PATH_WIDEST,
                             0, &path, NULL) == PX_OK) {
            bool ok = path.n_links > 0 && isfinite(path.bandwidth);
            if (ok) {
                cd->host_bw = path.bandwidth;
                cd->host_latency = path.latency;
                cd->host_link = -1;
            }
            px_hw_path_release(&path);
            if (ok)
                return;
        }
    }
    cd->host_bw = p->host_link_bw;
    cd->host_link = -1;
    cd->host_latency = p->host_link_latency;
    cd->assumed |= PX_COST_ASSUMED_HOST_LINK;
}

px_status px_cost_fleet_new(const px_hw_graph *g, const px_cost_params *params, px_cost_fleet **out,
                            px_err *err)
{
    px_cost_params defaults;
    if (!params) {
        px_cost_params_default(&defaults);
        params = &defaults;
    }
    *out = NULL;
    const px_hw_view *v = px_hw_graph_view(g);
    if (!v || v->n_devices == 0)
        return px_err_set(err, PX_EINFEASIBLE,
                          "%s: the inventory has no device to place work on; add devices "
                          "under /nodes/*/devices",
                          px_hw_graph_source(g));
    px_cost_fleet *f = calloc(1, sizeof *f);
    if (!f)
        return px_err_set(err, PX_ENOMEM, "out of memory building the fleet view");
    f->graph = g;
    f->n_devices = v->n_devices;
    f->devices = calloc(v->n_devices, sizeof *f->devices);
    f->paths = calloc(1, sizeof *f->paths);
    if (!f->devices || !f->paths) {
        px_cost_fleet_free(f);
        return px_err_set(err, PX_ENOMEM, "out of memory building the fleet view");
    }
    f->paths->host_link_bw = params->host_link_bw;
    f->paths->host_link_latency = params->host_link_latency;
    for (size_t i = 0; i < v->n_devices; i++) {
        fill_device(&f->devices[i], v, (uint32_t)i, params);
        host_route(f, &f->devices[i], v, params);
        if (f->devices[i].emulated)
            f->emulated = true;
    }
    px_status st = build_islands(f, v, err);
    if (st == PX_OK)
        st = assign_classes(f, err);
    if (st == PX_OK)
        st = px_hw_graph_digest(g, f->digest, err);
    if (st != PX_OK) {
        px_cost_fleet_free(f);
        return st;
    }
    *out = f;
    return PX_OK;
}

void px_cost_fleet_free(px_cost_fleet *f)
{
    if (!f)
        return;
    if (f->paths)
        free(f->paths->slots);
    free(f->paths);
    free(f->devices);
    free(f);
}

/* Fills the bottleneck fields of r from a hw path. */
static void from_hw_path(px_cost_fleet *f, const px_hw_path *hp, px_cost_path *r)
{
    const px_hw_view *v = px_hw_graph_view(f->graph);
    r->bw = hp->bandwidth;
    r->latency = hp->latency;
    r->n_hops = (uint32_t)hp->n_links;
    r->bottleneck = -1;
    r->contention = PX_HW_NONE;
    r->kind = PX_HW_LINK_OTHER;
    r->bw_rel = 0;
    double best = INFINITY;
    for (size_t i = 0; i < hp->n_links; i++) {
        const px_hw_link *l = &v->links[hp->links[i]];
        if (l->bandwidth.value < best) {
            best = l->bandwidth.value;
            r->bottleneck = (int32_t)hp->links[i];
            r->contention = l->contention;
            r->kind = l->kind;
            r->bw_rel = px__cost_qty_rel(&l->bandwidth, 0.10);
        }
    }
    r->reachable = true;
}

static bool hw_route(px_cost_fleet *f, uint32_t from, uint32_t to, px_cost_path *r)
{
    px_hw_path hp;
    if (px_hw_graph_path(f->graph, from, to, PX_HW_PATH_WIDEST, 0, &hp, NULL) != PX_OK)
        return false;
    from_hw_path(f, &hp, r);
    px_hw_path_release(&hp);
    return true;
}

/* Joins two route segments in series. */
static void join(px_cost_path *acc, const px_cost_path *seg)
{
    if (seg->bw < acc->bw) {
        acc->bw = seg->bw;
        acc->bw_rel = seg->bw_rel;
        acc->bottleneck = seg->bottleneck;
        acc->contention = seg->contention;
        acc->kind = seg->kind;
    }
    acc->latency += seg->latency;
    acc->n_hops += seg->n_hops;
    acc->assumed = acc->assumed || seg->assumed;
}

static px_cost_path node_path(px_cost_fleet *f, uint32_t na, uint32_t nb);

/* A device's segment to its node's host: the declared link, or the assumed
 * PCIe link. */
static px_cost_path host_segment(const px_cost_device *d)
{
    px_cost_path seg = {.bw = d->host_bw,
                        .bw_rel = 0.10,
                        .latency = d->host_latency,
                        .n_hops = 1,
                        .contention = PX_HW_NONE,
                        .bottleneck = d->host_link,
                        .kind = d->cls == PX_HW_CLASS_CPU ? PX_HW_LINK_LOOPBACK : PX_HW_LINK_PCIE4,
                        .assumed = (d->assumed & PX_COST_ASSUMED_HOST_LINK) != 0,
                        .reachable = true};
    return seg;
}

/* Routes are taken in this order: a direct link between the two devices;
 * through their shared host; through both hosts and the widest route
 * between the nodes.  Routes that leave a device other than through its
 * host or a direct link are not considered, which keeps a fleet of
 * thousands of devices cheap to route. */
static px_cost_path compute_path(px_cost_fleet *f, uint32_t a, uint32_t b)
{
    const px_hw_view *v = px_hw_graph_view(f->graph);
    const px_cost_device *da = &f->devices[a], *db = &f->devices[b];
    px_cost_path r = {.bw = INFINITY,
                      .contention = PX_HW_NONE,
                      .bottleneck = -1,
                      .kind = PX_HW_LINK_LOOPBACK,
                      .reachable = true};
    if (a == b)
        return r;
    uint32_t ea = v->devices[da->hw_index].endpoint, eb = v->devices[db->hw_index].endpoint;
    if (direct_link(f->graph, ea, eb, &r))
        return r;
    r = (px_cost_path){.bw = INFINITY,
                       .contention = PX_HW_NONE,
                       .bottleneck = -1,
                       .kind = PX_HW_LINK_LOOPBACK,
                       .reachable = false};
    if (da->node >= v->n_nodes || db->node >= v->n_nodes) {
        /* Devices outside nodes: only the graph can say. */
        if (hw_route(f, ea, eb, &r))
            return r;
        return r;
    }
    px_cost_path seg = host_segment(da);
    join(&r, &seg);
    if (da->node != db->node) {
        px_cost_path mid = node_path(f, da->node, db->node);
        if (!mid.reachable)
            return r;
        join(&r, &mid);
    }
    seg = host_segment(db);
    join(&r, &seg);
    r.reachable = true;
    return r;
}

static bool cache_grow(struct px__cost_path_cache *c)
{
    size_t ncap = c->cap ? c->cap * 2 : 256;
    path_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return false;
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->slots[i].key)
            continue;
        size_t h = (size_t)(px_hash64(&c->slots[i].key, sizeof(uint64_t)) & (ncap - 1));
        while (ns[h].key)
            h = (h + 1) & (ncap - 1);
        ns[h] = c->slots[i];
    }
    free(c->slots);
    c->slots = ns;
    c->cap = ncap;
    return true;
}

static bool cache_get(struct px__cost_path_cache *c, uint64_t key, px_cost_path *out)
{
    if (!c->cap)
        return false;
    size_t h = (size_t)(px_hash64(&key, sizeof key) & (c->cap - 1));
    while (c->slots[h].key) {
        if (c->slots[h].key == key) {
            *out = c->slots[h].path;
            return true;
        }
        h = (h + 1) & (c->cap - 1);
    }
    return false;
}

static void cache_put(struct px__cost_path_cache *c, uint64_t key, const px_cost_path *r)
{
    /* A full cache is only a lost optimisation, never an error. */
    if ((c->n + 1) * 2 > c->cap && !cache_grow(c))
        return;
    size_t h = (size_t)(px_hash64(&key, sizeof key) & (c->cap - 1));
    while (c->slots[h].key)
        h = (h + 1) & (c->cap - 1);
    c->slots[h].key = key;
    c->slots[h].path = *r;
    c->n++;
}

/* Node-to-node routes share the cache, keyed apart from device pairs. */
static px_cost_path node_path(px_cost_fleet *f, uint32_t na, uint32_t nb)
{
    uint64_t key = ((((uint64_t)na << 32) | nb) + 1) | (1ull << 63);
    px_cost_path r;
    if (cache_get(f->paths, key, &r))
        return r;
    const px_hw_view *v = px_hw_graph_view(f->graph);
    r = (px_cost_path){.contention = PX_HW_NONE, .bottleneck = -1, .reachable = false};
    if (!hw_route(f, v->nodes[na].endpoint, v->nodes[nb].endpoint, &r))
        r.reachable = false;
    cache_put(f->paths, key, &r);
    return r;
}

px_cost_path px_cost_fleet_path(px_cost_fleet *f, uint32_t a, uint32_t b)
{
    px_cost_path unreachable = {
        .bw = 0, .contention = PX_HW_NONE, .bottleneck = -1, .reachable = false};
    if (a >= f->n_devices || b >= f->n_devices)
        return unreachable;
    struct px__cost_path_cache *c = f->paths;
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    px_cost_path r;
    if (cache_get(c, key, &r))
        return r;
    r = compute_path(f, a, b);
    cache_put(c, key, &r);
    return r;
}
