/* The device catalogue: sourced figures for known devices and links, read
 * from the JSON texts compiled into the library (data/catalog/). */
#include "hw/hw_impl.h"

#define DEVICE_SCHEMA "plexus.catalog.device/1"
#define LINK_SCHEMA   "plexus.catalog.link/1"

static const char *const link_entry_members[] = {
    "schema", "id",          "description",     "kind", "bandwidth", "latency",
    "setup",  "collectives", "energy_per_byte", NULL};

static int cmp_device(const void *a, const void *b)
{
    return strcmp(((const px_hw_device *)a)->id, ((const px_hw_device *)b)->id);
}

static int cmp_link(const void *a, const void *b)
{
    return strcmp(((const px_hw_link *)a)->id, ((const px_hw_link *)b)->id);
}

/* Reads one entry text into the catalogue's arrays (sized by the caller). */
static void read_entry(px__hw_reader *r, px_hw_catalog *cat, const char *text, size_t len,
                       const char *name)
{
    json_t *doc = NULL;
    px_err perr;
    px_json_limits lim = {1 << 20, 16, 4096, 10000};
    px_status st = px_json_parse(text, len, name, &lim, &doc, &perr);
    if (st == PX_ENOMEM) {
        r->oom = true;
        return;
    }
    if (st != PX_OK) {
        px__hw_error(r, "", "fix the entry's JSON", "%s", perr.msg);
        return;
    }
    /* Messages point into this entry: the pointer names it. */
    const char *where = px_arena_printf(r->arena, "%s#", name);
    if (!where) {
        r->oom = true;
        goto done;
    }
    json_t *js = json_is_object(doc) ? json_object_get(doc, "schema") : NULL;
    const char *schema = json_is_string(js) ? json_string_value(js) : "";
    if (!strcmp(schema, DEVICE_SCHEMA)) {
        px_hw_device *d = &cat->devices[cat->n_devices];
        if (!px__hw_read_device(r, doc, where, NULL, d))
            goto done;
        if (!json_object_get(doc, "class"))
            px__hw_error(r, where, "add \"class\"", "catalogue entry \"%s\" has no class", d->id);
        cat->n_devices++;
    } else if (!strcmp(schema, LINK_SCHEMA)) {
        px_hw_link *l = &cat->links[cat->n_links];
        px__hw_link_init(l);
        l->where = where;
        px__hw_check_members(r, doc, where, "a link catalogue entry", link_entry_members);
        if (!px__hw_read_id(r, doc, where, "id", "catalogue entry", &l->id))
            goto done;
        if (!px__hw_read_link_figures(r, doc, where, l))
            goto done;
        cat->n_links++;
    } else {
        px__hw_error(r, where, "use \"" DEVICE_SCHEMA "\" or \"" LINK_SCHEMA "\"",
                     "catalogue entry has no known \"schema\"");
    }
done:
    json_decref(doc);
}

static void find_duplicate_ids(px__hw_reader *r, px__hw_index *ix, const char *id,
                               const char *where, uint32_t i)
{
    if (!px__hw_index_put(ix, id, i, NULL))
        px__hw_error(r, where, "give each catalogue entry its own id",
                     "duplicate catalogue entry \"%s\"", id);
}

px_status px_hw_catalog_new_from_texts(const char *const *texts, const char *const *names, size_t n,
                                       px_hw_catalog **out, px_diags *diags, px_err *err)
{
    *out = NULL;
    px_hw_catalog *cat = calloc(1, sizeof *cat);
    if (!cat)
        return px_err_set(err, PX_ENOMEM, "out of memory reading the catalogue");
    px_status st = px_arena_new(64 * 1024, &cat->arena, err);
    if (st != PX_OK) {
        free(cat);
        return st;
    }
    cat->devices = px_arena_calloc(cat->arena, n + 1, sizeof *cat->devices);
    cat->links = px_arena_calloc(cat->arena, n + 1, sizeof *cat->links);
    px__hw_reader r = {.arena = cat->arena, .diags = diags, .mode = PX__HW_READ_CATALOG};
    if (!cat->devices || !cat->links)
        r.oom = true;
    for (size_t i = 0; i < n && !r.oom; i++)
        read_entry(&r, cat, texts[i], strlen(texts[i]), names && names[i] ? names[i] : "entry");
    if (!r.oom) {
        qsort(cat->devices, cat->n_devices, sizeof *cat->devices, cmp_device);
        qsort(cat->links, cat->n_links, sizeof *cat->links, cmp_link);
        if (px__hw_index_init(&cat->device_index, cat->arena, cat->n_devices) != PX_OK ||
            px__hw_index_init(&cat->link_index, cat->arena, cat->n_links) != PX_OK)
            r.oom = true;
    }
    for (size_t i = 0; !r.oom && i < cat->n_devices; i++) {
        find_duplicate_ids(&r, &cat->device_index, cat->devices[i].id, cat->devices[i].where,
                           (uint32_t)i);
        px__hw_check_device(&r, &cat->devices[i]);
    }
    for (size_t i = 0; !r.oom && i < cat->n_links; i++) {
        find_duplicate_ids(&r, &cat->link_index, cat->links[i].id, cat->links[i].where,
                           (uint32_t)i);
        px__hw_check_link(&r, &cat->links[i]);
    }
    px__hw_reader_release(&r);
    if (r.oom) {
        px_hw_catalog_free(cat);
        return px_err_set(err, PX_ENOMEM, "out of memory reading the catalogue");
    }
    if (r.n_errors) {
        px_hw_catalog_free(cat);
        return px_err_set(err, PX_EVALIDATE, "the catalogue has %zu error%s", r.n_errors,
                          r.n_errors == 1 ? "" : "s");
    }
    *out = cat;
    return PX_OK;
}

px_status px_hw_catalog_new_builtin(px_hw_catalog **out, px_err *err)
{
    size_t n = px__hw_catalog_n_files;
    const char **texts = calloc(n + 1, sizeof *texts);
    const char **names = calloc(n + 1, sizeof *names);
    px_status st = PX_OK;
    if (!texts || !names) {
        st = px_err_set(err, PX_ENOMEM, "out of memory reading the catalogue");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        /* The generated data ends with a NUL that len does not count. */
        texts[i] = (const char *)px__hw_catalog_files[i].data;
        names[i] = px__hw_catalog_files[i].name;
    }
    px_diags diags;
    px_diags_init(&diags);
    st = px_hw_catalog_new_from_texts(texts, names, n, out, &diags, err);
    if (st == PX_EVALIDATE) {
        /* The catalogue ships with the library: a broken entry is a build
         * defect, reported with its first problem. */
        px_err_set(err, PX_EINTERNAL, "the built-in catalogue is broken: %s: %s",
                   diags.n ? diags.items[0].pointer : "?", diags.n ? diags.items[0].message : "?");
        st = PX_EINTERNAL;
    }
    px_diags_release(&diags);
done:
    free(texts);
    free(names);
    return st;
}

void px_hw_catalog_free(px_hw_catalog *cat)
{
    if (!cat)
        return;
    px_arena_free(cat->arena);
    free(cat);
}

size_t px_hw_catalog_n_devices(const px_hw_catalog *cat)
{
    return cat->n_devices;
}

const px_hw_device *px_hw_catalog_device(const px_hw_catalog *cat, size_t i)
{
    return i < cat->n_devices ? &cat->devices[i] : NULL;
}

size_t px_hw_catalog_n_links(const px_hw_catalog *cat)
{
    return cat->n_links;
}

const px_hw_link *px_hw_catalog_link(const px_hw_catalog *cat, size_t i)
{
    return i < cat->n_links ? &cat->links[i] : NULL;
}

const px_hw_device *px_hw_catalog_find_device(const px_hw_catalog *cat, const char *id)
{
    uint32_t i;
    return cat && px__hw_index_get(&cat->device_index, id, &i) ? &cat->devices[i] : NULL;
}

const px_hw_link *px_hw_catalog_find_link(const px_hw_catalog *cat, const char *id)
{
    uint32_t i;
    return cat && px__hw_index_get(&cat->link_index, id, &i) ? &cat->links[i] : NULL;
}
