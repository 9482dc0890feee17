/* The semantic rules of an inventory: implausible figures, contradictions
 * with the catalogue and between a link and its ends, links that claim a
 * fabric their measurement denies, and domain cycles. */
#include "hw/hw_impl.h"

#define TIB 1099511627776.0

/* The most any one part plausibly has.  Generous on purpose: these catch
 * wrong units and corrupted files (a 5 PB HBM stack), not new hardware. */
static double max_capacity(px_hw_mem_kind k)
{
    switch (k) {
    case PX_HW_MEM_HBM:
    case PX_HW_MEM_GDDR:
    case PX_HW_MEM_SRAM:
        return 16 * TIB;
    case PX_HW_MEM_DDR:
    case PX_HW_MEM_CXL:
        return 256 * TIB;
    case PX_HW_MEM_NVME:
        return 1e17;
    default:
        return 1e20;
    }
}

static double max_tier_bandwidth(px_hw_mem_kind k)
{
    switch (k) {
    case PX_HW_MEM_SRAM:
        return 1e17; /* wafer-scale SRAM reaches tens of PB/s */
    case PX_HW_MEM_NVME:
        return 1e12;
    default:
        return 1e14;
    }
}

#define MAX_COMPUTE      5e17 /* FLOP/s of one device */
#define MAX_LINK_BW      1e13 /* B/s per direction of one link */
#define MAX_TDP          3e4  /* W */
#define MAX_COST         1e4  /* $/h */
#define MIN_NET_LATENCY  1e-7 /* s: no network hop is faster than 100 ns */
#define MIN_LINK_LATENCY 1e-8
#define MAX_LATENCY      10.0
/* The fastest PCIe a single link can be: 5.0 x16, about 63 GB/s per
 * direction.  A link measured at or below it is PCIe-class. */
#define PCIE_CLASS_BW 64e9

static void fmt(double value, px_dim dim, char *buf, size_t n)
{
    px_qty_format(value, dim, buf, n);
}

static void too_big(px__hw_reader *r, const char *where, const char *k1, const char *k2,
                    const char *what, const px_qty *q, double limit, const char *fix)
{
    char a[64], b[64];
    fmt(q->value, q->dim, a, sizeof a);
    fmt(limit, q->dim, b, sizeof b);
    px__hw_error_at(r, where, k1, k2, fix, "%s of %s is implausible (no real part exceeds %s)",
                    what, a, b);
}

static void check_tier(px__hw_reader *r, const px_hw_mem_tier *t, const char *owner)
{
    if (!t->where)
        return;
    char what[160];
    if (t->capacity.value > max_capacity(t->kind)) {
        snprintf(what, sizeof what, "%s %s capacity", owner, px_hw_mem_kind_name(t->kind));
        too_big(r, t->where, "capacity", NULL, what, &t->capacity, max_capacity(t->kind),
                "check the unit (GB, not PB?) and the figure");
    }
    if (t->bandwidth.value > max_tier_bandwidth(t->kind)) {
        snprintf(what, sizeof what, "%s %s bandwidth", owner, px_hw_mem_kind_name(t->kind));
        too_big(r, t->where, "bandwidth", NULL, what, &t->bandwidth, max_tier_bandwidth(t->kind),
                "check the unit (GB/s, not PB/s? bytes, not bits?) and the figure");
    }
    if (t->latency.value > MAX_LATENCY)
        too_big(r, t->where, "latency", NULL, "memory latency", &t->latency, MAX_LATENCY,
                "check the unit (ns, not s?)");
}

void px__hw_check_device(px__hw_reader *r, const px_hw_device *d)
{
    for (int k = 0; k < PX_HW_DTYPE_COUNT; k++) {
        if (d->compute[k].value > MAX_COMPUTE) {
            const char *dt = px_hw_dtype_name((px_hw_dtype)k);
            char what[64];
            snprintf(what, sizeof what, "%s compute", dt);
            too_big(r, d->where, "compute", dt, what, &d->compute[k], MAX_COMPUTE,
                    "give the peak of one device, dense, in TFLOP/s");
        }
    }
    for (size_t i = 0; i < d->n_memory; i++)
        check_tier(r, &d->memory[i], "device");
    if (d->power_tdp.value > MAX_TDP)
        too_big(r, d->where, "power", "tdp", "TDP", &d->power_tdp, MAX_TDP,
                "give one device's TDP in W");
    if (px_hw_has(d->power_tdp) && d->power_idle.value > d->power_tdp.value) {
        char a[64], b[64];
        fmt(d->power_idle.value, PX_DIM_POWER, a, sizeof a);
        fmt(d->power_tdp.value, PX_DIM_POWER, b, sizeof b);
        px__hw_error_at(r, d->where, "power", "idle", "idle power is below the TDP; swap them?",
                        "idle power %s is above the TDP %s", a, b);
    }
    if (px_hw_has(d->thermal_limit) &&
        (d->thermal_limit.value < 273.15 || d->thermal_limit.value > 473.15)) {
        char a[64];
        fmt(d->thermal_limit.value, PX_DIM_TEMPERATURE, a, sizeof a);
        px__hw_error_at(r, d->where, "thermal", "limit",
                        "give the throttle temperature in C, e.g. \"87 C\"",
                        "thermal limit %s is implausible (outside 0 C .. 200 C)", a);
    }
    if (d->cost.value > MAX_COST)
        too_big(r, d->where, "cost", NULL, "cost", &d->cost, MAX_COST, "give the price per hour");
    if (d->live.present && px_hw_has(d->live.memory_free) && d->n_memory &&
        d->live.memory_free.value > px_hw_device_memory_capacity(d))
        px__hw_warning_at(r, d->where, "live", "memory_free",
                          "re-read the live state; free memory cannot exceed capacity",
                          "free memory is above the device's capacity");
}

void px__hw_check_link(px__hw_reader *r, const px_hw_link *l)
{
    if (l->bandwidth.value > MAX_LINK_BW)
        too_big(r, l->where, "bandwidth", NULL, "link bandwidth", &l->bandwidth, MAX_LINK_BW,
                "give the bandwidth per direction; check the unit (GB/s vs Gbit/s)");
    bool net = l->kind == PX_HW_LINK_ETHERNET || l->kind == PX_HW_LINK_INFINIBAND;
    double min_lat =
        net ? MIN_NET_LATENCY : (l->kind == PX_HW_LINK_LOOPBACK ? 0 : MIN_LINK_LATENCY);
    if (px_hw_has(l->latency) && l->latency.value < min_lat) {
        char a[64], b[64];
        fmt(l->latency.value, PX_DIM_TIME, a, sizeof a);
        fmt(min_lat, PX_DIM_TIME, b, sizeof b);
        px__hw_error_at(r, l->where, "latency", NULL, "check the unit (us, not ns?) and the figure",
                        "%s latency of %s is implausible (no such hop is faster than %s)",
                        px_hw_link_kind_name(l->kind), a, b);
    }
    if (l->latency.value > MAX_LATENCY)
        too_big(r, l->where, "latency", NULL, "link latency", &l->latency, MAX_LATENCY,
                "check the unit (ms, not s?)");
    if (px_hw_link_kind_is_nvlink(l->kind) && px_hw_has(l->bandwidth) &&
        (l->bandwidth.prov.kind == PX_PROV_MEASURED ||
         l->bandwidth.prov.kind == PX_PROV_CALIBRATED) &&
        l->bandwidth.value <= PCIE_CLASS_BW) {
        char a[64];
        fmt(l->bandwidth.value, PX_DIM_BANDWIDTH, a, sizeof a);
        px__hw_error_at(r, l->where, "kind", NULL,
                        "set \"kind\" to the PCIe generation the measurement shows (e.g. "
                        "\"pcie4\"), or re-measure: an NVLink path does not run at PCIe speed",
                        "the topology report lies: kind \"%s\" claims NVLink, but the link's "
                        "%s bandwidth is %s, PCIe-class (at most 64 GB/s)",
                        px_hw_link_kind_name(l->kind), px_prov_kind_name(l->bandwidth.prov.kind),
                        a);
    }
}

/* A figure above what the catalogue entry allows, uncertainty included;
 * reported at "<where>/<k1>[/<k2>]". */
static void above_entry(px__hw_reader *r, const char *where, const char *k1, const char *k2,
                        const char *what, const px_qty *have, const px_qty *entry,
                        const char *entry_id)
{
    if (!px_hw_has(*have) || !px_hw_has(*entry))
        return;
    double hi = px_qty_hi(entry);
    if (have->value <= hi * (1 + 1e-12))
        return;
    char a[64], b[64];
    fmt(have->value, have->dim, a, sizeof a);
    fmt(hi, entry->dim, b, sizeof b);
    px__hw_error_at(r, where, k1, k2,
                    "correct the figure, or drop \"catalog\" if this is a different part",
                    "%s %s is above the %s that catalogue entry \"%s\" allows (its figure "
                    "and uncertainty)",
                    what, a, b, entry_id);
}

static void check_against_catalog(px__hw_reader *r, const px_hw_device *d)
{
    if (!d->catalog || !r->catalog)
        return;
    const px_hw_device *e = px_hw_catalog_find_device(r->catalog, d->catalog);
    if (!e)
        return;
    for (int k = 0; k < PX_HW_DTYPE_COUNT; k++) {
        const char *dt = px_hw_dtype_name((px_hw_dtype)k);
        if (!px_hw_has(d->compute[k]))
            continue;
        if (!px_hw_has(e->compute[k])) {
            px__hw_warning_at(r, d->where, "compute", dt,
                              "check the dtype; leave it out if the part lacks it",
                              "catalogue entry \"%s\" gives no %s compute, but the device "
                              "claims some",
                              e->id, dt);
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "%s compute", dt);
        above_entry(r, d->where, "compute", dt, what, &d->compute[k], &e->compute[k], e->id);
    }
    for (size_t i = 0; i < d->n_memory; i++) {
        const px_hw_mem_tier *t = &d->memory[i];
        for (size_t j = 0; j < e->n_memory; j++) {
            if (strcmp(e->memory[j].id, t->id))
                continue;
            char what[96];
            snprintf(what, sizeof what, "memory tier \"%s\" bandwidth", t->id);
            above_entry(r, t->where, "bandwidth", NULL, what, &t->bandwidth,
                        &e->memory[j].bandwidth, e->id);
            snprintf(what, sizeof what, "memory tier \"%s\" capacity", t->id);
            above_entry(r, t->where, "capacity", NULL, what, &t->capacity, &e->memory[j].capacity,
                        e->id);
        }
    }
}

/* How fast an endpoint can source or sink data: a device's fastest tier,
 * a node's fastest host tier; 0 when unknown. */
static double endpoint_bandwidth(const px_hw_graph *g, uint32_t ep)
{
    const px_hw_view *v = &g->view;
    if (ep < v->n_devices)
        return px_hw_device_memory_bandwidth(&v->devices[ep]);
    const px_hw_node *n = &v->nodes[ep - v->n_devices];
    double best = 0;
    for (size_t i = 0; i < n->n_memory; i++)
        if (n->memory[i].kind != PX_HW_MEM_NVME && n->memory[i].bandwidth.value > best)
            best = n->memory[i].bandwidth.value;
    return best;
}

static void check_link_in_graph(px__hw_reader *r, const px_hw_graph *g, const px_hw_link *l)
{
    px__hw_check_link(r, l);
    if (l->catalog && r->catalog) {
        const px_hw_link *e = px_hw_catalog_find_link(r->catalog, l->catalog);
        if (e)
            above_entry(r, l->where, "bandwidth", NULL, "link bandwidth", &l->bandwidth,
                        &e->bandwidth, e->id);
    }
    double a = endpoint_bandwidth(g, l->from), b = endpoint_bandwidth(g, l->to);
    if (a > 0 && b > 0 && l->bandwidth.value > PX_MAX(a, b)) {
        char x[64], ya[64], yb[64];
        fmt(l->bandwidth.value, PX_DIM_BANDWIDTH, x, sizeof x);
        fmt(a, PX_DIM_BANDWIDTH, ya, sizeof ya);
        fmt(b, PX_DIM_BANDWIDTH, yb, sizeof yb);
        px__hw_error_at(r, l->where, "bandwidth", NULL,
                        "give the link's real bandwidth per direction, or the ends' memory "
                        "bandwidth if that is what is wrong",
                        "link bandwidth %s is faster than both of its ends can move data "
                        "(\"%s\" %s, \"%s\" %s)",
                        x, px_hw_graph_endpoint_name(g, l->from), ya,
                        px_hw_graph_endpoint_name(g, l->to), yb);
    }
}

/* Each domain has at most one parent, so the parent relation is a forest
 * unless it has cycles.  Walking each chain once and colouring what was
 * walked makes the check linear in the number of domains. */
static void check_domain_cycles(px__hw_reader *r, const px_hw_graph *g)
{
    const px_hw_view *v = &g->view;
    size_t n = v->n_domains;
    if (!n)
        return;
    unsigned char *state = calloc(n, 1); /* 0 new, 1 on the current walk, 2 done */
    if (!state) {
        r->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t at = i;
        while (at != PX_HW_NONE && at < n && state[at] == 0) {
            state[at] = 1;
            at = v->domains[at].parent;
        }
        if (at != PX_HW_NONE && at < n && state[at] == 1)
            px__hw_error(r, px__hw_ptr(r, v->domains[at].where, "parent"),
                         "break the cycle: a domain cannot contain itself",
                         "domain \"%s\" is its own ancestor (a cycle of \"parent\")",
                         v->domains[at].id);
        for (at = i; at != PX_HW_NONE && at < n && state[at] == 1; at = v->domains[at].parent)
            state[at] = 2;
    }
    free(state);
}

size_t px__hw_check_graph(px__hw_reader *r, const px_hw_graph *g)
{
    size_t before = r->n_errors;
    const px_hw_view *v = &g->view;
    for (size_t i = 0; i < v->n_nodes; i++)
        for (size_t k = 0; k < v->nodes[i].n_memory; k++)
            check_tier(r, &v->nodes[i].memory[k], "node");
    for (size_t i = 0; i < v->n_devices; i++) {
        px__hw_check_device(r, &v->devices[i]);
        check_against_catalog(r, &v->devices[i]);
    }
    for (size_t i = 0; i < v->n_links; i++)
        if (!v->links[i].reverse)
            check_link_in_graph(r, g, &v->links[i]);
    check_domain_cycles(r, g);
    return r->n_errors - before;
}

px_status px_hw_graph_validate(const px_hw_graph *g, const px_hw_catalog *catalog, px_diags *diags,
                               px_err *err)
{
    px_hw_catalog *own = NULL;
    px_arena *arena = NULL;
    px_status st = px_arena_new(0, &arena, err);
    if (st != PX_OK)
        return st;
    if (!catalog) {
        if ((st = px_hw_catalog_new_builtin(&own, err)) != PX_OK)
            goto done;
        catalog = own;
    }
    px__hw_reader r = {.arena = arena, .diags = diags, .catalog = catalog};
    px__hw_check_graph(&r, g);
    px__hw_reader_release(&r);
    if (r.oom)
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory validating", px_hw_graph_source(g));
    else if (r.n_errors)
        st = px_err_set(err, PX_EVALIDATE, "%s: %zu error%s", px_hw_graph_source(g), r.n_errors,
                        r.n_errors == 1 ? "" : "s");
done:
    px_hw_catalog_free(own);
    px_arena_free(arena);
    return st;
}
