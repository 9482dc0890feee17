/* The scheduler's nodes: reading an agent's registration, the name index,
 * node classes, live updates and allocation bookkeeping. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <ctype.h>

#define MAX_NODES      1000000
#define MAX_FRAMEWORKS 256
#define MAX_RESIDENT   100000

const char *px__reason_name(px__reason r)
{
    static const char *const names[PX__R_COUNT_] = {
        "offline", "draining",   "framework",  "framework_version",
        "vendor",  "capability", "gpu_memory", "gpus",
        "cpus",    "memory"};
    return (unsigned)r < PX__R_COUNT_ ? names[r] : "unknown";
}

px_status px_fleet_sched_new(px_fleet_sched **out, px_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    return PX_OK;
}

static void node_release_desc(px__sched_node *n)
{
    for (int i = 0; i < n->n_devs; i++) {
        free(n->devs[i].id);
        free(n->devs[i].vendor);
        free(n->devs[i].model);
        free(n->devs[i].capability);
    }
    free(n->devs);
    for (int i = 0; i < n->n_fws; i++) {
        free(n->fws[i].name);
        free(n->fws[i].version);
    }
    free(n->fws);
    free(n->link_bw);
    free(n->resident);
    free(n->address);
    n->devs = NULL;
    n->fws = NULL;
    n->link_bw = NULL;
    n->resident = NULL;
    n->address = NULL;
    n->n_devs = n->n_fws = 0;
    n->n_resident = 0;
}

void px_fleet_sched_free(px_fleet_sched *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_nodes; i++) {
        px__sched_node *n = &s->nodes[i];
        node_release_desc(n);
        for (size_t a = 0; a < n->n_allocs; a++)
            free(n->allocs[a].owner);
        free(n->allocs);
        free(n->name);
    }
    for (size_t i = 0; i < s->n_classes; i++)
        free(s->classes[i].signature);
    free(s->classes);
    for (size_t i = 0; i < s->n_owner_slots; i++)
        free(s->owners[i].nodes);
    free(s->owners);
    free(s->nodes);
    free(s->name_slots);
    free(s->class_verdict);
    free(s->scratch);
    free(s);
}

/* ---- name index ---- */

static size_t slot_of(const px_fleet_sched *s, const char *name)
{
    size_t mask = s->n_slots - 1;
    size_t i = (size_t)px_hash64(name, strlen(name)) & mask;
    while (s->name_slots[i] && strcmp(s->nodes[s->name_slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

px_status px_fleet_sched_find_node(const px_fleet_sched *s, const char *name, size_t *index,
                                   px_err *err)
{
    size_t i = s->n_slots ? slot_of(s, name) : 0;
    if (!s->n_slots || !s->name_slots[i])
        return px_err_set(err, PX_ENOTFOUND, "node \"%.100s\" is not registered", name);
    *index = s->name_slots[i] - 1;
    return PX_OK;
}

static bool index_grow(px_fleet_sched *s)
{
    size_t want = s->n_slots ? s->n_slots * 2 : 64;
    uint32_t *slots = calloc(want, sizeof *slots);
    if (!slots)
        return false;
    free(s->name_slots);
    s->name_slots = slots;
    s->n_slots = want;
    for (size_t k = 0; k < s->n_nodes; k++)
        s->name_slots[slot_of(s, s->nodes[k].name)] = (uint32_t)(k + 1);
    return true;
}

/* ---- reading a registration ---- */

/* Bytes from a quantity in any of its JSON forms; false when absent or bad. */
static bool json_bytes(const json_t *v, double *out)
{
    if (json_is_object(v))
        v = json_object_get(v, "value");
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return *out >= 0 && *out < 1e20;
    }
    if (!json_is_string(v))
        return false;
    px_qty q;
    if (px_qty_parse(json_string_value(v), PX_DIM_BYTES, &q, NULL) != PX_OK || q.value < 0)
        return false;
    *out = q.value;
    return true;
}

static bool json_bandwidth(const json_t *v, double *out)
{
    if (json_is_object(v))
        v = json_object_get(v, "value");
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return *out > 0;
    }
    px_qty q;
    if (!json_is_string(v) ||
        px_qty_parse(json_string_value(v), PX_DIM_BANDWIDTH, &q, NULL) != PX_OK)
        return false;
    *out = q.value;
    return q.value > 0;
}

/* A copy of at most max bytes of s (px_strndup copies exactly n). */
static char *dup_max(const char *s, size_t max)
{
    return px_strndup(s, strnlen(s, max));
}

static char *dup_lower(const char *s, size_t max)
{
    char *d = dup_max(s ? s : "", max);
    for (char *c = d; c && *c; c++)
        *c = (char)tolower((unsigned char)*c);
    return d;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i]))
            return false;
    return true;
}

static const char *str_or(const json_t *obj, const char *key, const char *dflt)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

static px_status read_devices(const json_t *devs, px__sched_node *n, px_err *err)
{
    if (!devs)
        return PX_OK;
    if (!json_is_array(devs))
        return px_err_set(err, PX_EINVAL, "registration: /node/devices: expected an array");
    size_t nd = json_array_size(devs);
    if (nd > PX__SCHED_MAX_DEVICES)
        return px_err_set(err, PX_ELIMIT,
                          "registration: /node/devices: %zu devices; at most %d per node", nd,
                          PX__SCHED_MAX_DEVICES);
    n->devs = calloc(nd ? nd : 1, sizeof *n->devs);
    if (!n->devs)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(devs, i);
        const char *id = json_is_object(d) ? str_or(d, "id", NULL) : NULL;
        if (!id || !valid_name(id))
            return px_err_set(err, PX_EINVAL,
                              "registration: /node/devices/%zu/id: expected an id of "
                              "[A-Za-z0-9_.-]{1,64}",
                              i);
        px__sched_device *dv = &n->devs[n->n_devs++];
        const char *cls = str_or(d, "class", "gpu");
        dv->gpu = strcmp(cls, "gpu") == 0 || strcmp(cls, "npu") == 0 || strcmp(cls, "tpu") == 0;
        dv->id = px_strdup(id);
        dv->vendor = dup_lower(str_or(d, "vendor", ""), 32);
        dv->model = dup_max(str_or(d, "model", ""), 64);
        dv->capability = dup_max(str_or(d, "capability", ""), 32);
        if (!dv->id || !dv->vendor || !dv->model || !dv->capability)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        const json_t *mem = json_object_get(d, "memory");
        double cap = 0;
        if (json_is_array(mem) && json_array_size(mem) > 0)
            json_bytes(json_object_get(json_array_get(mem, 0), "capacity"), &cap);
        else if (mem)
            json_bytes(mem, &cap);
        dv->mem_total = cap;
        double fr;
        const json_t *live = json_object_get(d, "live");
        dv->mem_free = json_bytes(json_object_get(live, "memory_free"), &fr) ? fr : -1;
        int ord = 0;
        for (int k = 0; k + 1 < n->n_devs; k++)
            if (strcmp(n->devs[k].vendor, dv->vendor) == 0 && n->devs[k].gpu == dv->gpu)
                ord++;
        dv->vendor_ordinal = ord;
    }
    return PX_OK;
}

static px_status read_frameworks(const json_t *fws, px__sched_node *n, px_err *err)
{
    if (!fws)
        return PX_OK;
    if (!json_is_array(fws) || json_array_size(fws) > MAX_FRAMEWORKS)
        return px_err_set(err, PX_EINVAL,
                          "registration: /node/frameworks: expected an array of at most %d",
                          MAX_FRAMEWORKS);
    size_t nf = json_array_size(fws);
    n->fws = calloc(nf ? nf : 1, sizeof *n->fws);
    if (!n->fws)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    for (size_t i = 0; i < nf; i++) {
        const json_t *f = json_array_get(fws, i);
        const char *name = json_is_object(f) ? str_or(f, "name", NULL) : NULL;
        if (!name || strlen(name) > 64)
            return px_err_set(err, PX_EINVAL,
                              "registration: /node/frameworks/%zu/name: expected a name", i);
        px__sched_framework *fw = &n->fws[n->n_fws++];
        fw->name = px_strdup(name);
        fw->version = dup_max(str_or(f, "version", ""), 64);
        if (!fw->name || !fw->version)
            return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    return PX_OK;
}

static void live_summary(px__sched_node *n)
{
    n->has_live_dev = false;
    n->min_dev_free = INFINITY;
    for (int d = 0; d < n->n_devs; d++)
        if (n->devs[d].mem_free >= 0) {
            n->has_live_dev = true;
            n->min_dev_free = PX_MIN(n->min_dev_free, n->devs[d].mem_free);
        }
}

static int dev_index(const px__sched_node *n, const char *id)
{
    /* Links may name devices globally ("n1.gpu0") or locally ("gpu0"). */
    const char *dot = strrchr(id, '.');
    for (int i = 0; i < n->n_devs; i++)
        if (strcmp(n->devs[i].id, id) == 0 || (dot && strcmp(n->devs[i].id, dot + 1) == 0))
            return i;
    return -1;
}

static px_status read_links(const json_t *links, px__sched_node *n, double *fastest, px_err *err)
{
    if (!links || n->n_devs == 0)
        return PX_OK;
    if (!json_is_array(links) || json_array_size(links) > 4096)
        return px_err_set(err, PX_EINVAL,
                          "registration: /links: expected an array of at most 4096 links");
    n->link_bw = calloc((size_t)n->n_devs * (size_t)n->n_devs, sizeof *n->link_bw);
    if (!n->link_bw)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(links); i++) {
        const json_t *l = json_array_get(links, i);
        int a = dev_index(n, str_or(l, "from", ""));
        int b = dev_index(n, str_or(l, "to", ""));
        double bw;
        if (a < 0 || b < 0 || a == b || !json_bandwidth(json_object_get(l, "bandwidth"), &bw))
            continue; /* links to the host or other nodes do not join devices */
        double *ab = &n->link_bw[a * n->n_devs + b], *ba = &n->link_bw[b * n->n_devs + a];
        if (bw > *ab)
            *ab = bw;
        if (!json_is_false(json_object_get(l, "bidirectional")) && bw > *ba)
            *ba = bw;
        if (bw > *fastest)
            *fastest = bw;
    }
    return PX_OK;
}

static int digest_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(px_digest));
}

static void read_resident(const json_t *res, px__sched_node *n)
{
    if (!json_is_array(res))
        return;
    size_t k = PX_MIN(json_array_size(res), (size_t)MAX_RESIDENT);
    px_digest *d = calloc(k ? k : 1, sizeof *d);
    if (!d)
        return;
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(res, i);
        if (json_is_string(v) && px_digest_parse(json_string_value(v), &d[m]) == PX_OK)
            m++;
    }
    qsort(d, m, sizeof *d, digest_cmp);
    free(n->resident);
    n->resident = d;
    n->n_resident = m;
}

/* Nodes with identical devices and frameworks share a class. */
static px_status assign_class(px_fleet_sched *s, px__sched_node *n, px_err *err)
{
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 0; i < n->n_devs; i++) {
        const px__sched_device *d = &n->devs[i];
        px_strbuf_addf(&sb, "d%d|%s|%s|%s|%.0f;", d->gpu, d->vendor, d->model, d->capability,
                       d->mem_total);
    }
    for (int i = 0; i < n->n_fws; i++)
        px_strbuf_addf(&sb, "f%s=%s;", n->fws[i].name, n->fws[i].version);
    uint64_t h = px_hash64(sb.buf, sb.len);
    for (size_t c = 0; c < s->n_classes; c++)
        if (s->classes[c].hash == h && strcmp(s->classes[c].signature, sb.buf) == 0) {
            n->class_id = (uint32_t)c;
            px_strbuf_release(&sb);
            return PX_OK;
        }
    if (s->n_classes == s->cap_classes) {
        size_t cap = s->cap_classes ? s->cap_classes * 2 : 16;
        px__sched_class *c = realloc(s->classes, cap * sizeof *c);
        if (!c) {
            px_strbuf_release(&sb);
            return px_err_set(err, PX_ENOMEM, "out of memory");
        }
        s->classes = c;
        s->cap_classes = cap;
    }
    s->classes[s->n_classes].hash = h;
    s->classes[s->n_classes].signature = px_strbuf_detach(&sb, NULL);
    n->class_id = (uint32_t)s->n_classes++;
    return PX_OK;
}

static px_status read_registration(px_fleet_sched *s, const json_t *reg, px__sched_node *n,
                                   px_err *err)
{
    const json_t *node = json_object_get(reg, "node");
    if (node && !json_is_object(node))
        return px_err_set(err, PX_EINVAL, "registration: /node: expected an inventory node object");
    n->address = dup_max(str_or(reg, "address", "127.0.0.1"), 255);
    if (!n->address)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    n->emulated = json_is_true(json_object_get(reg, "emulated")) ||
                  json_is_true(json_object_get(node, "emulated"));
    const json_t *cpus = json_object_get(reg, "cpus");
    if (cpus &&
        (!json_is_number(cpus) || !(json_number_value(cpus) > 0) || json_number_value(cpus) > 1e6))
        return px_err_set(err, PX_EINVAL,
                          "registration: /cpus: expected a number of cores above 0");
    n->cpus = cpus ? json_number_value(cpus) : 1;
    const json_t *mem = json_object_get(reg, "memory");
    n->memory = 0;
    if (mem && !json_bytes(mem, &n->memory))
        return px_err_set(err, PX_EINVAL, "registration: /memory: expected bytes or a size");
    if (!mem) {
        const json_t *tiers = json_object_get(node, "memory");
        for (size_t i = 0; json_is_array(tiers) && i < json_array_size(tiers); i++) {
            double c;
            if (json_bytes(json_object_get(json_array_get(tiers, i), "capacity"), &c))
                n->memory += c;
        }
    }
    n->mem_free_live = -1;
    px_status st = read_devices(json_object_get(node, "devices"), n, err);
    if (st == PX_OK)
        st = read_frameworks(json_object_get(node, "frameworks"), n, err);
    if (st == PX_OK)
        st = read_links(json_object_get(reg, "links"), n, &s->fastest_link, err);
    if (st == PX_OK) {
        live_summary(n);
        read_resident(json_object_get(reg, "resident"), n);
        st = assign_class(s, n, err);
    }
    return st;
}

px_status px_fleet_sched_add_node(px_fleet_sched *s, const json_t *reg, size_t *index, px_err *err)
{
    if (!json_is_object(reg))
        return px_err_set(err, PX_EINVAL, "registration: expected an object");
    const char *name = str_or(reg, "name", NULL);
    if (!name || !valid_name(name))
        return px_err_set(err, PX_EINVAL,
                          "registration: /name: expected a node name of [A-Za-z0-9_.-]{1,64}");
    px__sched_node fresh = {0};
    px_status st = read_registration(s, reg, &fresh, err);
    if (st != PX_OK) {
        node_release_desc(&fresh);
        return st;
    }
    size_t i;
    if (px_fleet_sched_find_node(s, name, &i, NULL) == PX_OK) {
        px__sched_node *n = &s->nodes[i];
        node_release_desc(n);
        n->address = fresh.address;
        n->emulated = fresh.emulated;
        n->cpus = fresh.cpus;
        n->memory = fresh.memory;
        n->devs = fresh.devs;
        n->n_devs = fresh.n_devs;
        n->fws = fresh.fws;
        n->n_fws = fresh.n_fws;
        n->link_bw = fresh.link_bw;
        n->resident = fresh.resident;
        n->n_resident = fresh.n_resident;
        n->class_id = fresh.class_id;
        n->has_live_dev = fresh.has_live_dev;
        n->min_dev_free = fresh.min_dev_free;
        n->mem_free_live = -1;
        n->busy &= n->n_devs >= 64 ? ~0ull : ((1ull << n->n_devs) - 1);
        if (n->state == PX_FLEET_NODE_OFFLINE)
            n->state = PX_FLEET_NODE_ONLINE;
    } else {
        if (s->n_nodes >= MAX_NODES) {
            node_release_desc(&fresh);
            return px_err_set(err, PX_ELIMIT, "registration: at most %d nodes", MAX_NODES);
        }
        if (s->n_nodes == s->cap_nodes) {
            size_t cap = s->cap_nodes ? s->cap_nodes * 2 : 16;
            px__sched_node *nn = realloc(s->nodes, cap * sizeof *nn);
            if (!nn) {
                node_release_desc(&fresh);
                return px_err_set(err, PX_ENOMEM, "out of memory");
            }
            s->nodes = nn;
            s->cap_nodes = cap;
        }
        fresh.name = px_strdup(name);
        if (!fresh.name) {
            node_release_desc(&fresh);
            return px_err_set(err, PX_ENOMEM, "out of memory");
        }
        i = s->n_nodes;
        s->nodes[s->n_nodes++] = fresh;
        if (s->n_nodes * 2 > s->n_slots && !index_grow(s)) {
            s->n_nodes--;
            free(fresh.name);
            node_release_desc(&fresh);
            return px_err_set(err, PX_ENOMEM, "out of memory");
        }
        s->name_slots[slot_of(s, name)] = (uint32_t)(i + 1);
    }
    if (index)
        *index = i;
    return PX_OK;
}

void px_fleet_sched_set_score_limit(px_fleet_sched *s, uint32_t limit)
{
    s->score_limit = limit;
}

size_t px_fleet_sched_n_nodes(const px_fleet_sched *s)
{
    return s->n_nodes;
}

const char *px_fleet_sched_node_name(const px_fleet_sched *s, size_t i)
{
    return i < s->n_nodes ? s->nodes[i].name : "";
}

void px_fleet_sched_set_state(px_fleet_sched *s, size_t i, px_fleet_node_state state)
{
    if (i < s->n_nodes)
        s->nodes[i].state = state;
}

px_fleet_node_state px_fleet_sched_state(const px_fleet_sched *s, size_t i)
{
    return i < s->n_nodes ? s->nodes[i].state : PX_FLEET_NODE_OFFLINE;
}

void px_fleet_sched_update_live(px_fleet_sched *s, size_t i, const json_t *hb)
{
    if (i >= s->n_nodes || !json_is_object(hb))
        return;
    px__sched_node *n = &s->nodes[i];
    const json_t *live = json_object_get(hb, "live");
    double x;
    if (json_bytes(json_object_get(live, "memory_free"), &x))
        n->mem_free_live = x;
    const json_t *load = json_object_get(live, "load");
    if (json_is_number(load) && json_number_value(load) >= 0 && json_number_value(load) < 1e6)
        n->load = json_number_value(load);
    const json_t *devs = json_object_get(live, "devices");
    for (size_t k = 0; json_is_array(devs) && k < json_array_size(devs) && k < 256; k++) {
        const json_t *d = json_array_get(devs, k);
        int di = dev_index(n, str_or(d, "id", ""));
        if (di < 0)
            continue;
        if (json_bytes(json_object_get(d, "memory_free"), &x))
            n->devs[di].mem_free = x;
        const json_t *u = json_object_get(d, "utilization");
        if (json_is_number(u))
            n->devs[di].utilization = json_number_value(u);
    }
    live_summary(n);
    if (json_object_get(hb, "resident"))
        read_resident(json_object_get(hb, "resident"), n);
}

/* ---- allocations ---- */

static uint64_t owner_hash(const char *owner)
{
    uint64_t h = px_hash64(owner, strlen(owner));
    return h < 2 ? h + 2 : h;
}

static px__owner_slot *owner_find(const px_fleet_sched *s, uint64_t h)
{
    if (!s->n_owner_slots)
        return NULL;
    size_t mask = s->n_owner_slots - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        if (s->owners[i].hash == h)
            return &s->owners[i];
        if (s->owners[i].hash == 0)
            return NULL;
    }
}

static bool owners_grow(px_fleet_sched *s)
{
    size_t want = s->n_owner_slots ? s->n_owner_slots * 2 : 256;
    px__owner_slot *fresh = calloc(want, sizeof *fresh);
    if (!fresh)
        return false;
    size_t used = 0;
    for (size_t i = 0; i < s->n_owner_slots; i++) {
        px__owner_slot *o = &s->owners[i];
        if (o->hash < 2)
            continue;
        size_t k = (size_t)o->hash & (want - 1);
        while (fresh[k].hash)
            k = (k + 1) & (want - 1);
        fresh[k] = *o;
        used++;
    }
    free(s->owners);
    s->owners = fresh;
    s->n_owner_slots = want;
    s->n_owner_used = used;
    return true;
}

static bool owner_add(px_fleet_sched *s, const char *owner, uint32_t node)
{
    uint64_t h = owner_hash(owner);
    px__owner_slot *o = owner_find(s, h);
    if (!o) {
        if ((s->n_owner_used + 1) * 2 > s->n_owner_slots && !owners_grow(s))
            return false;
        size_t mask = s->n_owner_slots - 1;
        size_t k = (size_t)h & mask;
        while (s->owners[k].hash >= 2)
            k = (k + 1) & mask;
        if (s->owners[k].hash == 0)
            s->n_owner_used++;
        o = &s->owners[k];
        *o = (px__owner_slot){.hash = h};
    }
    if (o->n == o->cap) {
        uint32_t cap = o->cap ? o->cap * 2 : 2;
        uint32_t *nn = realloc(o->nodes, cap * sizeof *nn);
        if (!nn)
            return false;
        o->nodes = nn;
        o->cap = cap;
    }
    o->nodes[o->n++] = node;
    return true;
}

px_status px__sched_alloc_add(px_fleet_sched *s, size_t node, const char *owner, int rank,
                              double cpus, double memory, uint64_t devices)
{
    px__sched_node *n = &s->nodes[node];
    if (n->n_allocs == n->cap_allocs) {
        size_t cap = n->cap_allocs ? n->cap_allocs * 2 : 4;
        px__sched_alloc *a = realloc(n->allocs, cap * sizeof *a);
        if (!a)
            return PX_ENOMEM;
        n->allocs = a;
        n->cap_allocs = cap;
    }
    char *o = px_strdup(owner);
    if (!o || !owner_add(s, owner, (uint32_t)node)) {
        free(o);
        return PX_ENOMEM;
    }
    n->allocs[n->n_allocs++] = (px__sched_alloc){o, rank, cpus, memory, devices};
    n->cpus_used += cpus;
    n->memory_used += memory;
    n->busy |= devices;
    return PX_OK;
}

static size_t release_on(px__sched_node *n, const char *owner)
{
    size_t released = 0;
    for (size_t a = 0; a < n->n_allocs;) {
        if (strcmp(n->allocs[a].owner, owner) != 0) {
            a++;
            continue;
        }
        n->cpus_used -= n->allocs[a].cpus;
        n->memory_used -= n->allocs[a].memory;
        n->busy &= ~n->allocs[a].devices;
        free(n->allocs[a].owner);
        n->allocs[a] = n->allocs[--n->n_allocs];
        released++;
    }
    if (n->n_allocs == 0)
        n->cpus_used = n->memory_used = 0; /* no drift from float sums */
    return released;
}

size_t px_fleet_sched_release(px_fleet_sched *s, const char *owner)
{
    uint64_t h = owner_hash(owner);
    px__owner_slot *o = owner_find(s, h);
    if (!o)
        return 0;
    size_t released = 0;
    for (uint32_t k = 0; k < o->n; k++)
        released += release_on(&s->nodes[o->nodes[k]], owner);
    /* Another owner may share the hash: keep the nodes still holding one. */
    uint32_t keep = 0;
    for (uint32_t k = 0; k < o->n; k++) {
        const px__sched_node *n = &s->nodes[o->nodes[k]];
        bool still = false;
        for (size_t a = 0; a < n->n_allocs && !still; a++)
            still = owner_hash(n->allocs[a].owner) == h;
        if (still)
            o->nodes[keep++] = o->nodes[k];
    }
    o->n = keep;
    if (keep == 0) {
        free(o->nodes);
        *o = (px__owner_slot){.hash = 1};
    }
    return released;
}

static const char *str_or_item(const json_t *arr, size_t k)
{
    const char *v = json_string_value(json_array_get(arr, k));
    return v ? v : "";
}

px_status px_fleet_sched_restore(px_fleet_sched *s, const px_fleet_request *r, const char *owner,
                                 size_t node, const json_t *devices, px_err *err)
{
    if (node >= s->n_nodes)
        return px_err_set(err, PX_EINVAL, "restore: no node %zu", node);
    px__sched_node *n = &s->nodes[node];
    uint64_t mask = 0;
    for (size_t k = 0; json_is_array(devices) && k < json_array_size(devices); k++) {
        int di = dev_index(n, str_or_item(devices, k));
        if (di >= 0)
            mask |= 1ull << di;
    }
    if (mask & n->busy)
        return px_err_set(err, PX_ESTATE, "restore: devices of %s on %s are taken", owner, n->name);
    if (px__sched_alloc_add(s, node, owner, 0, r->cpus, r->memory, mask) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    return PX_OK;
}
