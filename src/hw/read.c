/* Reading a `plexus.inventory/1` document: the top level, domains, nodes
 * and links, collected in input order; px__hw_assemble then resolves them
 * into a graph. */
#include "hw/hw_impl.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#define SCHEMA "plexus.inventory/1"
/* Documents at least this large return their parse tree's memory to the
 * system once read. */
#define TRIM_AFTER_BYTES ((size_t)1 << 20)

static const char *const top_members[] = {"schema",  "name",  "description", "emulated",
                                          "domains", "nodes", "links",       NULL};
static const char *const domain_members[] = {"id", "kind", "parent", "mtbf", NULL};
static const char *const node_members[] = {"id",      "hostname", "emulated",   "domains",
                                           "devices", "memory",   "frameworks", "python",
                                           "os",      "live",     "cpu",        NULL};
static const char *const framework_members[] = {"name", "version", "python", NULL};
static const char *const python_members[] = {"path", "version", NULL};
static const char *const os_members[] = {"kernel", "distro", NULL};
static const char *const cpu_members[] = {"cores", "threads", NULL};
/* More processors than any one host offers: a typo or a generator gone wrong. */
#define MAX_HOST_CPUS 65536
static const char *const link_members[] = {"id",
                                           "from",
                                           "to",
                                           "bidirectional",
                                           "kind",
                                           "catalog",
                                           "bandwidth",
                                           "latency",
                                           "setup",
                                           "contention",
                                           "collectives",
                                           "failure_group",
                                           "energy_per_byte",
                                           "dollars_per_gb",
                                           "trust",
                                           NULL};

/* Returns the array member key of obj, or NULL (reported when present but
 * not an array). */
static const json_t *get_array(px__hw_reader *r, const json_t *obj, const char *where,
                               const char *key, const char *example)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return NULL;
    if (!json_is_array(v)) {
        px__hw_error(r, px__hw_ptr(r, where, key), example, "\"%s\" must be an array, found %s",
                     key, px_json_type_name(v));
        return NULL;
    }
    return v;
}

static void read_domain(px__hw_reader *r, const json_t *v, const char *where,
                        px__hw_domain_rec *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->d.parent = PX_HW_NONE;
    rec->d.where = where;
    rec->dropped = true;
    if (!px__hw_expect_object(r, v, where, "a domain"))
        return;
    px__hw_check_members(r, v, where, "a domain", domain_members);
    if (!px__hw_read_id(r, v, where, "id", "domain", &rec->d.id))
        return;
    json_t *jk = json_object_get(v, "kind");
    if (!jk)
        px__hw_error(r, where, "add \"kind\": power, cooling, rack, zone or region",
                     "domain \"%s\" has no \"kind\"", rec->d.id);
    else if (!json_is_string(jk) ||
             px_hw_domain_kind_parse(json_string_value(jk), &rec->d.kind) != PX_OK)
        px__hw_error(r, px__hw_ptr(r, where, "kind"), "use power, cooling, rack, zone or region",
                     "unknown domain kind");
    json_t *jp = json_object_get(v, "parent");
    if (jp) {
        if (!json_is_string(jp) || !px__hw_id_ok(json_string_value(jp)))
            px__hw_error(r, px__hw_ptr(r, where, "parent"), "name another domain's id",
                         "\"parent\" must be a domain id");
        else
            rec->parent = px_arena_strdup(r->arena, json_string_value(jp));
    }
    px__hw_read_qty(r, v, where, "mtbf", PX_DIM_TIME, true, &rec->d.mtbf);
    rec->dropped = false;
}

/* Frameworks have no id: their canonical order is by name, version and
 * interpreter. */
static int cmp_framework(const void *a, const void *b)
{
    const px_hw_framework *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (!c)
        c = strcmp(x->version ? x->version : "", y->version ? y->version : "");
    if (!c)
        c = strcmp(x->python ? x->python : "", y->python ? y->python : "");
    return c;
}

static void read_frameworks(px__hw_reader *r, const json_t *v, const char *where, px_hw_node *n)
{
    const json_t *arr = get_array(r, v, where, "frameworks",
                                  "write [{\"name\": \"torch\", \"version\": \"2.3.1\"}]");
    if (!arr)
        return;
    const char *p = px__hw_ptr(r, where, "frameworks");
    size_t count = json_array_size(arr);
    px_hw_framework *fw = px_arena_calloc(r->arena, count ? count : 1, sizeof *fw);
    if (!fw) {
        r->oom = true;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(arr, i);
        const char *ew = px__hw_ptr_index(r, p, NULL, i);
        if (!px__hw_expect_object(r, e, ew, "a framework"))
            continue;
        px__hw_check_members(r, e, ew, "a framework", framework_members);
        px_hw_framework f = {0};
        px__hw_read_string(r, e, ew, "name", &f.name);
        px__hw_read_string(r, e, ew, "version", &f.version);
        px__hw_read_string(r, e, ew, "python", &f.python);
        if (!f.name || !f.name[0]) {
            px__hw_error(r, ew, "add \"name\", e.g. \"torch\"", "framework has no \"name\"");
            continue;
        }
        fw[k++] = f;
    }
    qsort(fw, k, sizeof *fw, cmp_framework);
    n->frameworks = fw;
    n->n_frameworks = k;
}

/* A count of processors: a whole number from 1 to MAX_HOST_CPUS, plain or
 * as a quantity object with provenance. */
static void read_count(px__hw_reader *r, const json_t *obj, const char *where, const char *key,
                       px_qty *out)
{
    px_qty q;
    memset(&q, 0, sizeof q);
    if (!json_object_get(obj, key) || !px__hw_read_qty(r, obj, where, key, PX_DIM_NONE, true, &q))
        return;
    if (q.value != floor(q.value) || q.value > MAX_HOST_CPUS) {
        px__hw_error_at(r, where, key, NULL,
                        "give a whole number of processors from 1 to 65536, as nproc counts them",
                        "\"%s\" is %g, not a whole number of processors from 1 to %d", key, q.value,
                        MAX_HOST_CPUS);
        return;
    }
    *out = q;
}

/* "cpu": {"cores", "threads"}: the host's processors for work run on them. */
static void read_host_cpu(px__hw_reader *r, const json_t *v, const char *where, px_hw_node *n)
{
    json_t *jc = json_object_get(v, "cpu");
    if (!jc)
        return;
    const char *p = px__hw_ptr(r, where, "cpu");
    if (!px__hw_expect_object(r, jc, p, "\"cpu\""))
        return;
    px__hw_check_members(r, jc, p, "\"cpu\"", cpu_members);
    read_count(r, jc, p, "cores", &n->cpu_cores);
    read_count(r, jc, p, "threads", &n->cpu_threads);
    if (n->cpu_cores.value > 0 && n->cpu_threads.value > 0 &&
        n->cpu_threads.value < n->cpu_cores.value)
        px__hw_error_at(r, p, "threads", NULL,
                        "count every hardware thread (at least one per core), or leave "
                        "\"threads\" out",
                        "%g threads on %g cores: a core runs at least one thread",
                        n->cpu_threads.value, n->cpu_cores.value);
}

static void read_node(px__hw_reader *r, px__hw_build *b, const json_t *v, const char *where,
                      size_t node_index)
{
    px__hw_node_rec *rec = &b->nodes[node_index];
    memset(rec, 0, sizeof *rec);
    rec->n.where = where;
    rec->n.endpoint = PX_HW_NONE;
    rec->n.live.load = NAN;
    rec->n.live.utilization = NAN;
    rec->first_device = b->n_devices;
    rec->dropped = true;
    if (!px__hw_expect_object(r, v, where, "a node"))
        return;
    px__hw_check_members(r, v, where, "a node", node_members);
    if (!px__hw_read_id(r, v, where, "id", "node", &rec->n.id))
        return;
    rec->dropped = false;
    px__hw_read_string(r, v, where, "hostname", &rec->n.hostname);
    px__hw_read_bool(r, v, where, "emulated", &rec->n.emulated);
    px__hw_read_string_list(r, v, where, "domains", &rec->domain_names, &rec->n_domain_names);
    px__hw_read_tiers(r, v, where, rec->n.id, false, NULL, 0, &rec->n.memory, &rec->n.n_memory);
    read_frameworks(r, v, where, &rec->n);
    json_t *jp = json_object_get(v, "python");
    if (jp) {
        const char *p = px__hw_ptr(r, where, "python");
        if (px__hw_expect_object(r, jp, p, "\"python\"")) {
            px__hw_check_members(r, jp, p, "\"python\"", python_members);
            px__hw_read_string(r, jp, p, "path", &rec->n.python_path);
            px__hw_read_string(r, jp, p, "version", &rec->n.python_version);
        }
    }
    json_t *jo = json_object_get(v, "os");
    if (jo) {
        const char *p = px__hw_ptr(r, where, "os");
        if (px__hw_expect_object(r, jo, p, "\"os\"")) {
            px__hw_check_members(r, jo, p, "\"os\"", os_members);
            px__hw_read_string(r, jo, p, "kernel", &rec->n.os_kernel);
            px__hw_read_string(r, jo, p, "distro", &rec->n.os_distro);
        }
    }
    px__hw_read_live(r, v, where, false, &rec->n.live);
    read_host_cpu(r, v, where, &rec->n);

    const json_t *devs =
        get_array(r, v, where, "devices", "write [{\"id\": \"gpu0\", \"class\": \"gpu\", ...}]");
    size_t count = devs ? json_array_size(devs) : 0;
    const char *dp = px__hw_ptr(r, where, "devices");
    if (count > PX__HW_MAX_DEVICES_PER_NODE) {
        px__hw_error(r, dp, "split the machine into several nodes or fix the generator",
                     "%zu devices in one node is more than the limit of %d", count,
                     PX__HW_MAX_DEVICES_PER_NODE);
        count = 0;
    }
    for (size_t i = 0; i < count; i++) {
        px__hw_device_rec *d = &b->devices[b->n_devices];
        memset(d, 0, sizeof *d);
        d->d = &b->device_slots[b->n_devices];
        const json_t *jd = json_array_get(devs, i);
        const char *w = px__hw_ptr_index(r, dp, NULL, i);
        if (!px__hw_read_device(r, jd, w, rec->n.id, d->d))
            continue;
        d->node_rec = node_index;
        px__hw_read_string_list(r, jd, w, "domains", &d->domain_names, &d->n_domain_names);
        b->n_devices++;
    }
    rec->n_devices = b->n_devices - rec->first_device;
}

/* An endpoint name: a node id, or "<node>.<device>". */
static const char *read_endpoint(px__hw_reader *r, const json_t *v, const char *where,
                                 const char *key)
{
    json_t *e = json_object_get(v, key);
    if (!e) {
        px__hw_error(r, where, "name a device (\"n1.gpu0\") or a node (\"n1\")",
                     "link has no \"%s\"", key);
        return NULL;
    }
    if (!json_is_string(e) || json_string_length(e) == 0 ||
        json_string_length(e) > 2 * PX__HW_MAX_ID + 1 ||
        strlen(json_string_value(e)) != json_string_length(e)) {
        px__hw_error(r, px__hw_ptr(r, where, key), "name a device (\"n1.gpu0\") or a node (\"n1\")",
                     "\"%s\" must be a device's global id or a node id", key);
        return NULL;
    }
    const char *s = px_arena_strdup(r->arena, json_string_value(e));
    if (!s)
        r->oom = true;
    return s;
}

static void read_link(px__hw_reader *r, const json_t *v, const char *where, px__hw_link_rec *rec,
                      px_hw_link *edge)
{
    memset(rec, 0, sizeof *rec);
    rec->l = edge;
    px__hw_link_init(rec->l);
    rec->l->where = where;
    rec->dropped = true;
    if (!px__hw_expect_object(r, v, where, "a link"))
        return;
    px__hw_check_members(r, v, where, "a link", link_members);
    bool ok = true;
    if (json_object_get(v, "id") && !px__hw_read_id(r, v, where, "id", "link", &rec->l->id))
        ok = false;
    rec->from_name = read_endpoint(r, v, where, "from");
    rec->to_name = read_endpoint(r, v, where, "to");
    px__hw_read_bool(r, v, where, "bidirectional", &rec->l->bidirectional);
    if (!px__hw_read_link_figures(r, v, where, rec->l))
        ok = false;
    json_t *jc = json_object_get(v, "contention");
    if (jc) {
        if (!json_is_string(jc) || !px__hw_id_ok(json_string_value(jc)))
            px__hw_error(r, px__hw_ptr(r, where, "contention"),
                         "name the shared resource with an id, e.g. \"n1-pcie-switch0\"",
                         "\"contention\" must be an identifier");
        else
            rec->contention_name = px_arena_strdup(r->arena, json_string_value(jc));
    }
    px__hw_read_string(r, v, where, "failure_group", &rec->l->failure_group);
    rec->dropped = !ok || !rec->from_name || !rec->to_name;
}

/* Reads the whole document into b.  Structure errors are reported; the
 * elements that can be used are kept so that reference and semantic
 * errors are found in the same pass.  The record arrays are malloc'd (they
 * are copied into the graph and then dropped: release_build). */
static void read_document(px__hw_reader *r, const json_t *doc, px__hw_build *b)
{
    memset(b, 0, sizeof *b);
    if (!px__hw_expect_object(r, doc, "", "an inventory"))
        return;
    px__hw_check_members(r, doc, "", "an inventory", top_members);
    json_t *js = json_object_get(doc, "schema");
    if (!js)
        px__hw_error(r, "", "add \"schema\": \"" SCHEMA "\"", "the document has no \"schema\"");
    else if (!json_is_string(js) || strcmp(json_string_value(js), SCHEMA))
        px__hw_error(r, "/schema", "this reader takes \"" SCHEMA "\"",
                     "schema %s%.64s%s is not " SCHEMA, json_is_string(js) ? "\"" : "",
                     json_is_string(js) ? json_string_value(js) : px_json_type_name(js),
                     json_is_string(js) ? "\"" : "");
    px__hw_read_string(r, doc, "", "name", &b->name);
    px__hw_read_string(r, doc, "", "description", &b->description);
    px__hw_read_bool(r, doc, "", "emulated", &b->emulated);

    const json_t *doms =
        get_array(r, doc, "", "domains", "write [{\"id\": \"rack-a\", \"kind\": \"rack\"}]");
    size_t nd = doms ? json_array_size(doms) : 0;
    b->domains = calloc(nd ? nd : 1, sizeof *b->domains);
    if (!b->domains) {
        r->oom = true;
        return;
    }
    for (size_t i = 0; i < nd; i++)
        read_domain(r, json_array_get(doms, i), px__hw_ptr_index(r, "", "domains", i),
                    &b->domains[b->n_domains++]);

    const json_t *nodes =
        get_array(r, doc, "", "nodes", "write [{\"id\": \"n1\", \"devices\": [...]}]");
    size_t nn = nodes ? json_array_size(nodes) : 0;
    if (!json_object_get(doc, "nodes"))
        px__hw_error(r, "", "add \"nodes\": [{\"id\": \"n1\", \"devices\": [...]}]",
                     "the inventory has no \"nodes\"");
    else if (nodes && nn == 0)
        px__hw_error(r, "/nodes", "describe at least one node", "\"nodes\" is empty");
    if (nn > PX__HW_MAX_NODES) {
        px__hw_error(r, "/nodes", "split the inventory, or fix the generator that wrote it",
                     "%zu nodes is more than the limit of %d", nn, PX__HW_MAX_NODES);
        nn = 0;
    }
    /* Devices are counted first so their records are one array. */
    size_t total = 0;
    for (size_t i = 0; i < nn; i++) {
        json_t *jd = json_is_object(json_array_get(nodes, i))
                         ? json_object_get(json_array_get(nodes, i), "devices")
                         : NULL;
        size_t c = json_is_array(jd) ? json_array_size(jd) : 0;
        total += c <= PX__HW_MAX_DEVICES_PER_NODE ? c : 0;
    }
    b->nodes = calloc(nn ? nn : 1, sizeof *b->nodes);
    b->devices = calloc(total ? total : 1, sizeof *b->devices);
    b->device_slots = px_arena_alloc(r->arena, (total + 1) * sizeof *b->device_slots);
    if (!b->nodes || !b->devices || !b->device_slots) {
        r->oom = true;
        return;
    }
    for (size_t i = 0; i < nn && !r->oom; i++) {
        read_node(r, b, json_array_get(nodes, i), px__hw_ptr_index(r, "", "nodes", i), i);
        b->n_nodes++;
    }

    const json_t *links =
        get_array(r, doc, "", "links", "write [{\"from\": \"n1.gpu0\", \"to\": \"n1.gpu1\", ...}]");
    size_t nl = links ? json_array_size(links) : 0;
    if (nl > PX__HW_MAX_LINKS) {
        px__hw_error(r, "/links", "split the inventory, or fix the generator that wrote it",
                     "%zu links is more than the limit of %d", nl, PX__HW_MAX_LINKS);
        nl = 0;
    }
    b->links = calloc(nl ? nl : 1, sizeof *b->links);
    size_t slots;
    if (!px__mul_size(nl + 1, 2 * sizeof *b->edges, &slots) ||
        !(b->edges = px_arena_alloc(r->arena, slots)) || !b->links) {
        r->oom = true;
        return;
    }
    for (size_t i = 0; i < nl && !r->oom; i++) {
        read_link(r, json_array_get(links, i), px__hw_ptr_index(r, "", "links", i),
                  &b->links[b->n_links], &b->edges[2 * i]);
        b->n_links++;
    }
}

static void release_build(px__hw_build *b)
{
    free(b->domains);
    free(b->nodes);
    free(b->devices);
    free(b->links);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* Entry points                                                        */
/* ------------------------------------------------------------------ */

static px_json_limits effective_limits(const px_hw_read_options *o)
{
    px_json_limits l = {PX__HW_MAX_BYTES, PX__HW_MAX_DEPTH, PX__HW_MAX_STRING, PX__HW_MAX_ELEMENTS};
    if (o) {
        if (o->limits.max_bytes && o->limits.max_bytes < l.max_bytes)
            l.max_bytes = o->limits.max_bytes;
        if (o->limits.max_depth && o->limits.max_depth < l.max_depth)
            l.max_depth = o->limits.max_depth;
        if (o->limits.max_string && o->limits.max_string < l.max_string)
            l.max_string = o->limits.max_string;
        if (o->limits.max_elements && o->limits.max_elements < l.max_elements)
            l.max_elements = o->limits.max_elements;
    }
    return l;
}

/* Sets err to "<name>: N errors; the first: <pointer>: <message>". */
static px_status summarize(px_diags *diags, size_t first, size_t n_errors, const char *name,
                           px_err *err)
{
    const px_diag *d = NULL;
    for (size_t i = first; diags && i < diags->n; i++)
        if (diags->items[i].severity == PX_SEV_ERROR) {
            d = &diags->items[i];
            break;
        }
    if (!d)
        return px_err_set(err, PX_EVALIDATE, "%s: %zu error%s", name, n_errors,
                          n_errors == 1 ? "" : "s");
    return px_err_set(err, PX_EVALIDATE, "%s: %zu error%s; the first: %s: %s", name, n_errors,
                      n_errors == 1 ? "" : "s", d->pointer[0] ? d->pointer : "(document)",
                      d->message);
}

px_status px_hw_graph_from_value(const json_t *doc, const char *name,
                                 const px_hw_read_options *options, px_hw_graph **out,
                                 px_diags *diags, px_err *err)
{
    *out = NULL;
    if (!name)
        name = "inventory";
    px_diags local;
    px_diags_init(&local);
    px_diags *dg = diags ? diags : &local;
    size_t first = dg->n;
    px_hw_catalog *own_catalog = NULL;
    const px_hw_catalog *catalog = options ? options->catalog : NULL;
    px_status st = PX_OK;
    px_hw_graph *g = calloc(1, sizeof *g);
    if (!g) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
        goto fail_graph;
    }
    if ((st = px_arena_new(256 * 1024, &g->arena, err)) != PX_OK)
        goto fail_arena;
    if (!catalog) {
        if ((st = px_hw_catalog_new_builtin(&own_catalog, err)) != PX_OK)
            goto fail_catalog;
        catalog = own_catalog;
    }
    g->source = px_arena_strdup(g->arena, name);
    px__hw_reader r = {.arena = g->arena,
                       .diags = dg,
                       .mode = PX__HW_READ_INVENTORY,
                       .catalog = catalog,
                       .strict = options && options->strict};
    px__hw_build b;
    read_document(&r, doc, &b);
    if (!r.oom && (st = px__hw_assemble(&r, &b, g)) != PX_OK)
        r.oom = true;
    release_build(&b);
    /* The semantic rules run on whatever could be assembled, so that one
     * report lists structural and semantic problems together. */
    if (!r.oom)
        px__hw_check_graph(&r, g);
    px__hw_reader_release(&r);
    if (r.oom || !g->source) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory reading the inventory", name);
        goto fail_read;
    }
    if (r.n_errors) {
        st = summarize(dg, first, r.n_errors, name, err);
        goto fail_read;
    }
    px_hw_catalog_free(own_catalog);
    px_diags_release(&local);
    *out = g;
    return PX_OK;

fail_read:
    px_hw_catalog_free(own_catalog);
fail_catalog:
    px_arena_free(g->arena);
fail_arena:
    free(g);
fail_graph:
    px_diags_release(&local);
    return st;
}

/* Turns the JSON parser's message ("name: /pointer: what" for a broken
 * limit, "name:line:column: what" for bad syntax) into a diagnostic with
 * the pointer in its place. */
static void add_parse_diag(px_diags *diags, const char *name, px_status st, const char *msg)
{
    size_t n = strlen(name);
    const char *rest = msg;
    if (!strncmp(msg, name, n))
        rest = msg + n;
    char pointer[256] = "";
    if (rest[0] == ':' && rest[1] == ' ' && rest[2] == '/') {
        const char *end = strstr(rest + 2, ": ");
        size_t len = end ? (size_t)(end - (rest + 2)) : 0;
        if (end && len < sizeof pointer) {
            memcpy(pointer, rest + 2, len);
            pointer[len] = '\0';
            rest = end + 2;
        }
    } else if (rest[0] == ':' && rest[1] == ' ') {
        rest += 2;
    } else {
        rest = msg;
    }
    /* jansson refuses nesting deeper than its own bound as a syntax
     * error; it is the nesting limit all the same. */
    bool deep = strstr(rest, "maximum parsing depth") != NULL;
    const char *fix = st == PX_ELIMIT || deep
                          ? "the format's limits are 64 MiB per file, 32 levels of nesting, "
                            "4 KiB per string and 1,000,000 elements per array or object"
                          : "fix the JSON syntax at the line and column given";
    if (deep)
        px_diags_add(diags, PX_SEV_ERROR, pointer, fix, "nesting deeper than %d levels (%s)",
                     PX__HW_MAX_DEPTH, rest);
    else
        px_diags_add(diags, PX_SEV_ERROR, pointer, fix, "%s", rest);
}

px_status px_hw_graph_from_json(const char *json, size_t len, const char *name,
                                const px_hw_read_options *options, px_hw_graph **out,
                                px_diags *diags, px_err *err)
{
    *out = NULL;
    if (!name)
        name = "inventory";
    px_json_limits lim = effective_limits(options);
    json_t *doc = NULL;
    px_err perr;
    px_err_clear(&perr);
    px_status st = px_json_parse(json, len, name, &lim, &doc, &perr);
    if (st != PX_OK) {
        if (diags)
            add_parse_diag(diags, name, st, perr.msg);
        if (err)
            *err = perr;
        return st;
    }
    st = px_hw_graph_from_value(doc, name, options, out, diags, err);
    json_decref(doc);
#ifdef __GLIBC__
    /* The parsed document is some ten times its text, in small blocks the
     * allocator keeps after they are freed; giving them back keeps the
     * peak of read-then-export (plexus inventory export) down. */
    if (len >= TRIM_AFTER_BYTES)
        malloc_trim(0);
#endif
    return st;
}

/* A file that is no JSON text at all (a GGUF model, a llama2.c
 * checkpoint, any binary) is named as such from its first bytes, before
 * the JSON reader would ask to "fix the syntax" of a model. */
static px_status sniff_binary(const char *path, px_diags *diags, px_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return PX_OK; /* the reader says why */
    unsigned char head[512];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    const char *what = NULL;
    if (n >= 4 && !memcmp(head, "GGUF", 4))
        what = "a GGUF model file";
    for (size_t i = 0; !what && i < n; i++)
        if (head[i] < 0x20 && head[i] != '\n' && head[i] != '\r' && head[i] != '\t')
            what = "a binary file (a llama2.c checkpoint or other data)";
    if (!what)
        return PX_OK;
    const char *fix = "an inventory is plexus.inventory/1 JSON (docs/formats/inventory.md): "
                      "give a model to --model, an inventory to --inventory";
    if (diags)
        px_diags_add(diags, PX_SEV_ERROR, "", fix, "%s is %s, not an inventory", path, what);
    return px_err_set(err, PX_EPARSE, "%s is %s, not an inventory; %s", path, what, fix);
}

px_status px_hw_graph_load(const char *path, const px_hw_read_options *options, px_hw_graph **out,
                           px_diags *diags, px_err *err)
{
    *out = NULL;
    px_status sst = sniff_binary(path, diags, err);
    if (sst != PX_OK)
        return sst;
    px_json_limits lim = effective_limits(options);
    char *text;
    size_t len;
    px_err rerr;
    px_err_clear(&rerr);
    px_status st = px_read_file(path, lim.max_bytes, &text, &len, &rerr);
    if (st != PX_OK) {
        if (diags)
            px_diags_add(diags, PX_SEV_ERROR, "",
                         st == PX_ELIMIT ? "inventories are at most 64 MiB; split it" : NULL, "%s",
                         rerr.msg);
        if (err)
            *err = rerr;
        return st;
    }
    st = px_hw_graph_from_json(text, len, path, options, out, diags, err);
    free(text);
    return st;
}
