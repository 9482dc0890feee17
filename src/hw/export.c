/* Canonical export of a graph and of the catalogue.  Canonical means: every
 * list in a fixed order (by id, or by ends for links), every quantity in SI
 * units with its provenance, defaults left out, and inherited values
 * written once, where they are declared; so equal graphs give
 * byte-identical text.  The text is written directly (json_writer.c), in
 * the format of px_json_dump_canonical, because building a jansson tree
 * first costs more than the whole read of a large inventory. */
#include "hw/json_writer.h"

/* compute's members in the order of their names. */
static const px_hw_dtype dtypes_by_name[PX_HW_DTYPE_COUNT] = {
    PX_HW_DTYPE_BF16, PX_HW_DTYPE_F16,  PX_HW_DTYPE_F32,  PX_HW_DTYPE_F64,
    PX_HW_DTYPE_FP8,  PX_HW_DTYPE_INT4, PX_HW_DTYPE_INT8, PX_HW_DTYPE_TF32,
};

static void write_strings(px__jw *w, const char *key, const char *const *items, size_t n)
{
    px__jw_key(w, key);
    px__jw_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        px__jw_item(w);
        px__jw_string(w, items[i]);
    }
    px__jw_end_array(w);
}

static void write_tier(px__jw *w, const px_hw_mem_tier *t)
{
    px__jw_begin_object(w);
    px__jw_kqty(w, "bandwidth", &t->bandwidth);
    px__jw_kqty(w, "capacity", &t->capacity);
    px__jw_kstr(w, "id", t->id);
    px__jw_kstr(w, "kind", px_hw_mem_kind_name(t->kind));
    px__jw_kqty(w, "latency", &t->latency);
    px__jw_end_object(w);
}

static void write_tiers(px__jw *w, const px_hw_mem_tier *tiers, size_t n)
{
    if (!n)
        return;
    px__jw_key(w, "memory");
    px__jw_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        px__jw_item(w);
        write_tier(w, &tiers[i]);
    }
    px__jw_end_array(w);
}

static void write_live(px__jw *w, const px_hw_live *l, bool device)
{
    if (!l->present)
        return;
    px__jw_key(w, "live");
    px__jw_begin_object(w);
    if (!device && !isnan(l->load)) {
        px__jw_key(w, "load");
        px__jw_real(w, l->load);
    }
    px__jw_kqty(w, "memory_free", &l->memory_free);
    if (device) {
        px__jw_kqty(w, "temperature", &l->temperature);
        if (!isnan(l->utilization)) {
            px__jw_key(w, "utilization");
            px__jw_real(w, l->utilization);
        }
    }
    px__jw_end_object(w);
}

static void write_pair(px__jw *w, const char *key, const char *k1, const px_qty *q1, const char *k2,
                       const px_qty *q2)
{
    if (!px_hw_has(*q1) && !px_hw_has(*q2))
        return;
    px__jw_key(w, key);
    px__jw_begin_object(w);
    px__jw_kqty(w, k1, q1);
    px__jw_kqty(w, k2, q2);
    px__jw_end_object(w);
}

/* A count of processors (a plain number, PX_DIM_NONE), with its
 * provenance as every quantity; absent when 0. */
static void write_count(px__jw *w, const char *key, const px_qty *q)
{
    if (q->value <= 0)
        return;
    px__jw_key(w, key);
    px__jw_qty(w, q);
}

/* Whether sorted index list a holds x. */
static bool has_index(const uint32_t *a, size_t n, uint32_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && a[lo] == x;
}

/* A device; v is NULL for a catalogue entry. */
static void write_device(px__jw *w, const px_hw_device *d, const px_hw_view *v)
{
    const px_hw_node *node = v && d->node < v->n_nodes ? &v->nodes[d->node] : NULL;
    px__jw_begin_object(w);
    px__jw_kstr(w, "backend", d->backend);
    px__jw_kstr(w, "capability", d->capability);
    px__jw_kstr(w, "catalog", d->catalog);
    px__jw_kstr(w, "class", px_hw_class_name(d->cls));
    bool any = false;
    for (int k = 0; k < PX_HW_DTYPE_COUNT; k++)
        any |= px_hw_has(d->compute[k]);
    if (any) {
        px__jw_key(w, "compute");
        px__jw_begin_object(w);
        for (int k = 0; k < PX_HW_DTYPE_COUNT; k++)
            px__jw_kqty(w, px_hw_dtype_name(dtypes_by_name[k]), &d->compute[dtypes_by_name[k]]);
        px__jw_end_object(w);
    }
    px__jw_kqty(w, "cost", &d->cost);
    if (v) {
        /* Only the domains the device adds to its node's. */
        size_t own = 0;
        for (size_t i = 0; i < d->n_domains; i++)
            own += !node || !has_index(node->domains, node->n_domains, d->domains[i]);
        if (own) {
            px__jw_key(w, "domains");
            px__jw_begin_array(w);
            for (size_t i = 0; i < d->n_domains; i++)
                if (!node || !has_index(node->domains, node->n_domains, d->domains[i])) {
                    px__jw_item(w);
                    px__jw_string(w, v->domains[d->domains[i]].id);
                }
            px__jw_end_array(w);
        }
    }
    px__jw_kstr(w, "driver", d->driver);
    if (d->emu.present) {
        px__jw_key(w, "emu");
        px__jw_begin_object(w);
        px__jw_key(w, "compute_slowdown");
        px__jw_real(w, d->emu.compute_slowdown);
        px__jw_key(w, "jitter");
        px__jw_real(w, d->emu.jitter);
        px__jw_key(w, "memory_slowdown");
        px__jw_real(w, d->emu.memory_slowdown);
        px__jw_key(w, "seed");
        px__jw_real(w, (double)d->emu.seed);
        px__jw_end_object(w);
    }
    if (d->emulated && !(node && node->emulated)) {
        px__jw_key(w, "emulated");
        px__jw_bool(w, true);
    }
    px__jw_kstr(w, "id", d->id);
    if (d->n_kernels)
        write_strings(w, "kernels", d->kernels, d->n_kernels);
    write_live(w, &d->live, true);
    write_tiers(w, d->memory, d->n_memory);
    px__jw_kstr(w, "model", d->model);
    px__jw_kqty(w, "mtbf", &d->mtbf);
    if (!d->all_ops)
        write_strings(w, "ops", d->ops, d->n_ops);
    write_pair(w, "power", "idle", &d->power_idle, "tdp", &d->power_tdp);
    if (d->runtime_name || d->runtime_version) {
        px__jw_key(w, "runtime");
        px__jw_begin_object(w);
        px__jw_kstr(w, "name", d->runtime_name);
        px__jw_kstr(w, "version", d->runtime_version);
        px__jw_end_object(w);
    }
    write_pair(w, "thermal", "limit", &d->thermal_limit, "time_constant",
               &d->thermal_time_constant);
    px__jw_kstr(w, "vendor", d->vendor);
    px__jw_end_object(w);
}

/* A link's members; from and to are NULL for a catalogue entry, which
 * also has no bidirectional flag. */
static void write_link(px__jw *w, const px_hw_link *l, const char *from, const char *to,
                       const char *contention)
{
    px__jw_begin_object(w);
    px__jw_kqty(w, "bandwidth", &l->bandwidth);
    if (from) {
        px__jw_key(w, "bidirectional");
        px__jw_bool(w, l->bidirectional);
    }
    px__jw_kstr(w, "catalog", l->catalog);
    if (l->n_collectives)
        write_strings(w, "collectives", l->collectives, l->n_collectives);
    px__jw_kstr(w, "contention", contention);
    if (l->dollars_per_gb != 0) {
        px__jw_key(w, "dollars_per_gb");
        px__jw_real(w, l->dollars_per_gb);
    }
    px__jw_kqty(w, "energy_per_byte", &l->energy_per_byte);
    px__jw_kstr(w, "failure_group", l->failure_group);
    px__jw_kstr(w, "from", from);
    px__jw_kstr(w, "id", l->id);
    px__jw_kstr(w, "kind", px_hw_link_kind_name(l->kind));
    px__jw_kqty(w, "latency", &l->latency);
    px__jw_kqty(w, "setup", &l->setup);
    px__jw_kstr(w, "to", to);
    if (l->trust != PX_HW_TRUST_TRUSTED)
        px__jw_kstr(w, "trust", px_hw_trust_name(l->trust));
    px__jw_end_object(w);
}

static void write_node(px__jw *w, const px_hw_view *v, const px_hw_node *n)
{
    px__jw_begin_object(w);
    if (n->cpu_cores.value > 0 || n->cpu_threads.value > 0) {
        px__jw_key(w, "cpu");
        px__jw_begin_object(w);
        write_count(w, "cores", &n->cpu_cores);
        write_count(w, "threads", &n->cpu_threads);
        px__jw_end_object(w);
    }
    px__jw_key(w, "devices");
    px__jw_begin_array(w);
    for (size_t i = 0; i < n->n_devices; i++) {
        px__jw_item(w);
        write_device(w, &v->devices[n->devices[i]], v);
    }
    px__jw_end_array(w);
    if (n->n_domains) {
        px__jw_key(w, "domains");
        px__jw_begin_array(w);
        for (size_t i = 0; i < n->n_domains; i++) {
            px__jw_item(w);
            px__jw_string(w, v->domains[n->domains[i]].id);
        }
        px__jw_end_array(w);
    }
    if (n->emulated && !v->emulated) {
        px__jw_key(w, "emulated");
        px__jw_bool(w, true);
    }
    if (n->n_frameworks) {
        px__jw_key(w, "frameworks");
        px__jw_begin_array(w);
        for (size_t i = 0; i < n->n_frameworks; i++) {
            px__jw_item(w);
            px__jw_begin_object(w);
            px__jw_kstr(w, "name", n->frameworks[i].name);
            px__jw_kstr(w, "python", n->frameworks[i].python);
            px__jw_kstr(w, "version", n->frameworks[i].version);
            px__jw_end_object(w);
        }
        px__jw_end_array(w);
    }
    px__jw_kstr(w, "hostname", n->hostname);
    px__jw_kstr(w, "id", n->id);
    write_live(w, &n->live, false);
    write_tiers(w, n->memory, n->n_memory);
    if (n->os_kernel || n->os_distro) {
        px__jw_key(w, "os");
        px__jw_begin_object(w);
        px__jw_kstr(w, "distro", n->os_distro);
        px__jw_kstr(w, "kernel", n->os_kernel);
        px__jw_end_object(w);
    }
    if (n->python_path || n->python_version) {
        px__jw_key(w, "python");
        px__jw_begin_object(w);
        px__jw_kstr(w, "path", n->python_path);
        px__jw_kstr(w, "version", n->python_version);
        px__jw_end_object(w);
    }
    px__jw_end_object(w);
}

/* Links are written one declaration each, in the order of their ends and
 * id; links that nothing of these tells apart (same ends, no ids) are
 * ordered by their text, written into a scratch buffer for that run only.
 * Everything else goes straight to the output. */
typedef struct link_slice {
    const char *from, *to, *id;
    const px_hw_link *link;
    size_t at, len;   /* in the scratch buffer, for ties */
    const char *text; /* set once the scratch buffer stops moving */
} link_slice;

static int cmp_slice_key(const void *a, const void *b)
{
    const link_slice *x = a, *y = b;
    int c = strcmp(x->from, y->from);
    if (!c)
        c = strcmp(x->to, y->to);
    if (!c)
        c = strcmp(x->id ? x->id : "", y->id ? y->id : "");
    return c;
}

static int cmp_slice_text(const void *a, const void *b)
{
    const link_slice *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->text, y->text, n);
    if (!c)
        c = x->len < y->len ? -1 : x->len > y->len;
    return c;
}

static void write_one_link(px__jw *w, const px_hw_view *v, const link_slice *s)
{
    const px_hw_link *l = s->link;
    write_link(w, l, s->from, s->to,
               l->contention != PX_HW_NONE ? v->contention[l->contention] : NULL);
}

static bool write_links(px__jw *w, const px_hw_graph *g)
{
    const px_hw_view *v = &g->view;
    size_t n = 0;
    for (size_t i = 0; i < v->n_links; i++)
        n += !v->links[i].reverse;
    if (!n)
        return true;
    link_slice *slices = calloc(n, sizeof *slices);
    if (!slices)
        return false;
    size_t k = 0;
    for (size_t i = 0; i < v->n_links; i++) {
        const px_hw_link *l = &v->links[i];
        if (l->reverse)
            continue;
        const char *from = px_hw_graph_endpoint_name(g, l->from);
        const char *to = px_hw_graph_endpoint_name(g, l->to);
        /* A bidirectional link is the same link written either way round. */
        if (l->bidirectional && strcmp(from, to) > 0) {
            const char *t = from;
            from = to;
            to = t;
        }
        slices[k++] = (link_slice){from, to, l->id, l, 0, 0, NULL};
    }
    qsort(slices, n, sizeof *slices, cmp_slice_key);
    px__jw_key(w, "links");
    px__jw_begin_array(w);
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        size_t j = i + 1;
        while (j < n && !cmp_slice_key(&slices[i], &slices[j]))
            j++;
        if (j == i + 1) {
            px__jw_item(w);
            write_one_link(w, v, &slices[i]);
        } else {
            px_strbuf scratch = PX_STRBUF_INIT;
            px__jw lw;
            px__jw_init(&lw, &scratch, w->depth);
            for (size_t t = i; t < j; t++) {
                slices[t].at = scratch.len;
                lw.depth = w->depth;
                write_one_link(&lw, v, &slices[t]);
                slices[t].len = scratch.len - slices[t].at;
            }
            ok = !lw.oom;
            px__jw_release(&lw);
            for (size_t t = i; ok && t < j; t++)
                slices[t].text = scratch.buf + slices[t].at;
            if (ok)
                qsort(slices + i, j - i, sizeof *slices, cmp_slice_text);
            for (size_t t = i; ok && t < j; t++) {
                px__jw_item(w);
                if (px_strbuf_add(w->out, slices[t].text, slices[t].len) != PX_OK)
                    w->oom = true;
            }
            px_strbuf_release(&scratch);
        }
        i = j;
    }
    px__jw_end_array(w);
    free(slices);
    return ok;
}

px_status px_hw_graph_export(const px_hw_graph *g, char **text, size_t *len, px_err *err)
{
    const px_hw_view *v = &g->view;
    px_strbuf sb = PX_STRBUF_INIT;
    px__jw w;
    px__jw_init(&w, &sb, 0);
    px__jw_begin_object(&w);
    px__jw_kstr(&w, "description", v->description);
    if (v->n_domains) {
        px__jw_key(&w, "domains");
        px__jw_begin_array(&w);
        for (size_t i = 0; i < v->n_domains; i++) {
            const px_hw_domain *d = &v->domains[i];
            px__jw_item(&w);
            px__jw_begin_object(&w);
            px__jw_kstr(&w, "id", d->id);
            px__jw_kstr(&w, "kind", px_hw_domain_kind_name(d->kind));
            px__jw_kqty(&w, "mtbf", &d->mtbf);
            px__jw_kstr(&w, "parent", d->parent != PX_HW_NONE ? v->domains[d->parent].id : NULL);
            px__jw_end_object(&w);
        }
        px__jw_end_array(&w);
    }
    if (v->emulated) {
        px__jw_key(&w, "emulated");
        px__jw_bool(&w, true);
    }
    bool ok = write_links(&w, g);
    px__jw_kstr(&w, "name", v->name);
    px__jw_key(&w, "nodes");
    px__jw_begin_array(&w);
    for (size_t i = 0; i < v->n_nodes; i++) {
        px__jw_item(&w);
        write_node(&w, v, &v->nodes[i]);
    }
    px__jw_end_array(&w);
    px__jw_kstr(&w, "schema", "plexus.inventory/1");
    px__jw_end_object(&w);
    if (px_strbuf_addch(&sb, '\n') != PX_OK)
        w.oom = true;
    ok = ok && !w.oom;
    px__jw_release(&w);
    if (!ok) {
        px_strbuf_release(&sb);
        return px_err_set(err, PX_ENOMEM, "out of memory exporting %s", px_hw_graph_source(g));
    }
    *text = px_strbuf_detach(&sb, len);
    return PX_OK;
}

/* A tree from canonical text: for callers that want to edit or embed. */
static px_status text_to_tree(char *text, size_t len, json_t **out, px_err *err)
{
    json_error_t jerr;
    *out = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!*out)
        return px_err_set(err, PX_ENOMEM, "out of memory building the export (%s)", jerr.text);
    return PX_OK;
}

px_status px_hw_graph_to_json(const px_hw_graph *g, json_t **out, px_err *err)
{
    char *text;
    size_t len;
    px_status st = px_hw_graph_export(g, &text, &len, err);
    if (st != PX_OK)
        return st;
    return text_to_tree(text, len, out, err);
}

px_status px_hw_graph_digest(const px_hw_graph *g, char out[65], px_err *err)
{
    char *text;
    size_t len;
    px_status st = px_hw_graph_export(g, &text, &len, err);
    if (st != PX_OK)
        return st;
    px_digest d;
    px_sha256(text, len, &d);
    px_digest_hex(&d, out);
    free(text);
    return PX_OK;
}

px_status px_hw_catalog_export(const px_hw_catalog *cat, char **text, size_t *len, px_err *err)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px__jw w;
    px__jw_init(&w, &sb, 0);
    px__jw_begin_object(&w);
    px__jw_key(&w, "devices");
    px__jw_begin_array(&w);
    for (size_t i = 0; i < px_hw_catalog_n_devices(cat); i++) {
        px__jw_item(&w);
        write_device(&w, px_hw_catalog_device(cat, i), NULL);
    }
    px__jw_end_array(&w);
    px__jw_key(&w, "links");
    px__jw_begin_array(&w);
    for (size_t i = 0; i < px_hw_catalog_n_links(cat); i++) {
        px__jw_item(&w);
        write_link(&w, px_hw_catalog_link(cat, i), NULL, NULL, NULL);
    }
    px__jw_end_array(&w);
    px__jw_kstr(&w, "schema", "plexus.catalog/1");
    px__jw_end_object(&w);
    if (px_strbuf_addch(&sb, '\n') != PX_OK)
        w.oom = true;
    bool ok = !w.oom;
    px__jw_release(&w);
    if (!ok) {
        px_strbuf_release(&sb);
        return px_err_set(err, PX_ENOMEM, "out of memory writing the catalogue");
    }
    *text = px_strbuf_detach(&sb, len);
    return PX_OK;
}

px_status px_hw_catalog_to_json(const px_hw_catalog *cat, json_t **out, px_err *err)
{
    char *text;
    size_t len;
    px_status st = px_hw_catalog_export(cat, &text, &len, err);
    if (st != PX_OK)
        return st;
    return text_to_tree(text, len, out, err);
}
