/* Reading devices, memory tiers and link figures, for inventories and for
 * catalogue entries alike, with catalogue values as the starting point. */
#include "hw/hw_impl.h"

/* ------------------------------------------------------------------ */
/* Copies out of the catalogue (which the graph must not point into)     */
/* ------------------------------------------------------------------ */

static const char *dup_str(px__hw_reader *r, const char *s)
{
    return px__hw_intern(r, s);
}

static px_qty dup_qty(px__hw_reader *r, px_qty q)
{
    q.prov.source = dup_str(r, q.prov.source);
    q.valid.param = dup_str(r, q.valid.param);
    return q;
}

static const char *const *dup_list(px__hw_reader *r, const char *const *items, size_t n)
{
    if (!n)
        return NULL;
    const char **c = px_arena_calloc(r->arena, n, sizeof *c);
    if (!c) {
        r->oom = true;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        c[i] = dup_str(r, items[i]);
    return c;
}

static void dup_tier(px__hw_reader *r, const px_hw_mem_tier *src, px_hw_mem_tier *dst)
{
    *dst = *src;
    dst->id = dup_str(r, src->id);
    dst->global_id = NULL;
    dst->capacity = dup_qty(r, src->capacity);
    dst->bandwidth = dup_qty(r, src->bandwidth);
    dst->latency = dup_qty(r, src->latency);
    dst->where = NULL;
}

/* ------------------------------------------------------------------ */
/* Memory tiers                                                        */
/* ------------------------------------------------------------------ */

static const char *const tier_members[] = {"id", "kind", "capacity", "bandwidth", "latency", NULL};

bool px__hw_read_tier(px__hw_reader *r, const json_t *v, const char *where,
                      const char *owner_global, bool device_tier, px_hw_mem_tier *out)
{
    /* out may already hold the catalogue's tier of the same id: members
     * given here override it, the rest stay. */
    if (!px__hw_expect_object(r, v, where, "a memory tier"))
        return false;
    px__hw_check_members(r, v, where, "a memory tier", tier_members);
    const char *id = NULL;
    if (!px__hw_read_id(r, v, where, "id", "memory tier", &id))
        return false;
    out->id = id;
    out->where = where;
    if (owner_global) {
        out->global_id = px_arena_printf(r->arena, "%s.%s", owner_global, id);
        if (!out->global_id)
            r->oom = true;
    } else {
        out->global_id = id;
    }
    bool based = px_hw_has(out->capacity) || px_hw_has(out->bandwidth);
    json_t *jk = json_object_get(v, "kind");
    if (jk) {
        px_hw_mem_kind k;
        if (!json_is_string(jk) || px_hw_mem_kind_parse(json_string_value(jk), &k) != PX_OK) {
            px__hw_error(r, px__hw_ptr(r, where, "kind"),
                         device_tier ? "use hbm, gddr, ddr (unified memory) or sram"
                                     : "use ddr, cxl, nvme or remote",
                         "unknown memory tier kind %s%s%s", json_is_string(jk) ? "\"" : "",
                         json_is_string(jk) ? json_string_value(jk) : px_json_type_name(jk),
                         json_is_string(jk) ? "\"" : "");
        } else {
            bool device_kind = k == PX_HW_MEM_HBM || k == PX_HW_MEM_GDDR || k == PX_HW_MEM_DDR ||
                               k == PX_HW_MEM_SRAM;
            bool node_kind = k == PX_HW_MEM_DDR || k == PX_HW_MEM_CXL || k == PX_HW_MEM_NVME ||
                             k == PX_HW_MEM_REMOTE;
            if (device_tier ? !device_kind : !node_kind)
                px__hw_error(r, px__hw_ptr(r, where, "kind"),
                             device_tier ? "a device's own tiers are hbm, gddr, ddr or sram; "
                                           "move this tier to its node's \"memory\""
                                         : "a node's tiers are ddr, cxl, nvme or remote; "
                                           "move this tier to the device that holds it",
                             "a %s tier cannot be a %s's memory", px_hw_mem_kind_name(k),
                             device_tier ? "device" : "node");
            out->kind = k;
        }
    } else if (!based) {
        px__hw_error(r, where,
                     device_tier ? "add \"kind\": \"hbm\", \"gddr\", \"ddr\" or \"sram\""
                                 : "add \"kind\": \"ddr\", \"cxl\", \"nvme\" or \"remote\"",
                     "memory tier \"%s\" has no \"kind\"", id);
    }
    px__hw_read_qty(r, v, where, "capacity", PX_DIM_BYTES, true, &out->capacity);
    px__hw_read_qty(r, v, where, "bandwidth", PX_DIM_BANDWIDTH, true, &out->bandwidth);
    px__hw_read_qty(r, v, where, "latency", PX_DIM_TIME, false, &out->latency);
    if (!px_hw_has(out->capacity) && r->mode == PX__HW_READ_INVENTORY &&
        !json_object_get(v, "capacity"))
        px__hw_error(r, where, "add \"capacity\", e.g. \"80 GB\"",
                     "memory tier \"%s\" has no \"capacity\"", id);
    return true;
}

static int cmp_tier(const void *a, const void *b)
{
    return strcmp(((const px_hw_mem_tier *)a)->id, ((const px_hw_mem_tier *)b)->id);
}

/* Reads a "memory" array into tiers, starting from base (the catalogue's
 * tiers, copied).  Sorted by id; duplicate ids are reported. */
void px__hw_read_tiers(px__hw_reader *r, const json_t *obj, const char *where,
                       const char *owner_global, bool device_tier, const px_hw_mem_tier *base,
                       size_t n_base, const px_hw_mem_tier **out, size_t *n_out)
{
    json_t *arr = json_object_get(obj, "memory");
    size_t n_in = 0;
    const char *p = px__hw_ptr(r, where, "memory");
    if (arr && !json_is_array(arr)) {
        px__hw_error(r, p, "write a list of tiers: [{\"id\": ..., \"kind\": ..., ...}]",
                     "\"memory\" must be an array, found %s", px_json_type_name(arr));
        arr = NULL;
    }
    if (arr)
        n_in = json_array_size(arr);
    if (n_in > PX__HW_MAX_TIERS) {
        px__hw_error(r, p,
                     "describe at most " PX__HW_STR(PX__HW_MAX_TIERS) " tiers; merge "
                                                                      "tiers of one kind into one",
                     "%zu memory tiers is more than the limit of %d", n_in, PX__HW_MAX_TIERS);
        n_in = 0;
    }
    size_t cap = n_base + n_in;
    px_hw_mem_tier *tiers = px_arena_calloc(r->arena, cap ? cap : 1, sizeof *tiers);
    if (!tiers) {
        r->oom = true;
        return;
    }
    bool *given = px_arena_calloc(r->arena, cap ? cap : 1, sizeof *given);
    if (!given) {
        r->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < n_base; i++) {
        dup_tier(r, &base[i], &tiers[n]);
        tiers[n].global_id = owner_global
                                 ? px_arena_printf(r->arena, "%s.%s", owner_global, tiers[n].id)
                                 : tiers[n].id;
        if (!tiers[n].global_id)
            r->oom = true;
        tiers[n].where = p;
        n++;
    }
    for (size_t i = 0; i < n_in; i++) {
        json_t *v = json_array_get(arr, i);
        const char *tw = px__hw_ptr_index(r, p, NULL, i);
        /* A tier with a catalogue tier's id overrides that tier; a repeat
         * of an id given in this list is a duplicate. */
        json_t *jid = json_is_object(v) ? json_object_get(v, "id") : NULL;
        const char *id = json_is_string(jid) ? json_string_value(jid) : NULL;
        size_t slot = n;
        for (size_t j = 0; id && j < n; j++)
            if (!strcmp(tiers[j].id, id)) {
                slot = j;
                break;
            }
        if (slot < n && given[slot]) {
            px__hw_error(r, px__hw_ptr(r, tw, "id"), "give each tier its own id",
                         "duplicate memory tier id \"%s\" (first at %s)", id, tiers[slot].where);
            continue;
        }
        px_hw_mem_tier t;
        if (slot < n)
            t = tiers[slot];
        else
            memset(&t, 0, sizeof t);
        if (!px__hw_read_tier(r, v, tw, owner_global, device_tier, &t))
            continue;
        tiers[slot] = t;
        given[slot] = true;
        if (slot == n)
            n++;
    }
    /* A catalogue tier may leave its capacity to the machine (a CPU's
     * memory); an inventory that names the entry must then give it. */
    for (size_t i = 0; i < n_base && r->mode == PX__HW_READ_INVENTORY; i++)
        if (!given[i] && !px_hw_has(tiers[i].capacity))
            px__hw_error(r, p, "add {\"id\": \"<tier>\", \"capacity\": \"...\"} to \"memory\"",
                         "memory tier \"%s\" of the catalogue entry has no capacity; this "
                         "machine's must be given",
                         tiers[i].id);
    qsort(tiers, n, sizeof *tiers, cmp_tier);
    *out = tiers;
    *n_out = n;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

static const char *const device_members[] = {
    "id",      "class",  "vendor",  "model",   "catalog", "emulated", "backend", "capability",
    "compute", "memory", "ops",     "kernels", "runtime", "driver",   "power",   "thermal",
    "cost",    "mtbf",   "domains", "live",    "emu",     NULL};
static const char *const catalog_device_members[] = {
    "schema", "id",  "description", "class", "vendor",  "model", "backend", "capability", "compute",
    "memory", "ops", "kernels",     "power", "thermal", "cost",  "mtbf",    NULL};
static const char *const power_members[] = {"tdp", "idle", NULL};
static const char *const thermal_members[] = {"limit", "time_constant", NULL};
static const char *const runtime_members[] = {"name", "version", NULL};

static void copy_template(px__hw_reader *r, const px_hw_device *e, px_hw_device *d)
{
    d->cls = e->cls;
    d->vendor = dup_str(r, e->vendor);
    d->model = dup_str(r, e->model);
    d->backend = dup_str(r, e->backend);
    d->capability = dup_str(r, e->capability);
    for (int k = 0; k < PX_HW_DTYPE_COUNT; k++)
        d->compute[k] = dup_qty(r, e->compute[k]);
    d->all_ops = e->all_ops;
    d->ops = dup_list(r, e->ops, e->n_ops);
    d->n_ops = e->n_ops;
    d->kernels = dup_list(r, e->kernels, e->n_kernels);
    d->n_kernels = e->n_kernels;
    d->power_tdp = dup_qty(r, e->power_tdp);
    d->power_idle = dup_qty(r, e->power_idle);
    d->thermal_limit = dup_qty(r, e->thermal_limit);
    d->thermal_time_constant = dup_qty(r, e->thermal_time_constant);
    d->cost = dup_qty(r, e->cost);
    d->mtbf = dup_qty(r, e->mtbf);
}

/* Suggests the catalogue entry whose id shares the longest prefix. */
static const char *closest_entry(const px_hw_catalog *cat, const char *id)
{
    const char *best = NULL;
    size_t best_len = 3;
    for (size_t i = 0; i < cat->n_devices; i++) {
        const char *c = cat->devices[i].id;
        size_t k = 0;
        while (c[k] && c[k] == id[k])
            k++;
        if (k > best_len) {
            best_len = k;
            best = c;
        }
    }
    return best;
}

static void read_compute(px__hw_reader *r, const json_t *v, const char *where, px_hw_device *d)
{
    json_t *jc = json_object_get(v, "compute");
    if (!jc)
        return;
    const char *p = px__hw_ptr(r, where, "compute");
    if (!px__hw_expect_object(r, jc, p, "\"compute\""))
        return;
    const char *key;
    json_t *child;
    json_object_foreach(jc, key, child)
    {
        if (px_str_starts_with(key, "x-"))
            continue;
        px_hw_dtype dt;
        if (px_hw_dtype_parse(key, &dt) != PX_OK) {
            char shown[48];
            px_strlcpy(shown, key, sizeof shown);
            px__hw_error(r, px__hw_ptr(r, p, key),
                         "use f64, f32, tf32, bf16, f16, fp8, int8 or int4",
                         "unknown dtype \"%s\" in \"compute\"", shown);
            continue;
        }
        px__hw_read_qty(r, jc, p, key, PX_DIM_FLOPS, true, &d->compute[dt]);
    }
}

static void read_group(px__hw_reader *r, const json_t *v, const char *where, const char *key,
                       const char *const *members, const char *const *names, const px_dim *dims,
                       px_qty **outs)
{
    json_t *g = json_object_get(v, key);
    if (!g)
        return;
    const char *p = px__hw_ptr(r, where, key);
    char what[32];
    snprintf(what, sizeof what, "\"%s\"", key);
    if (!px__hw_expect_object(r, g, p, what))
        return;
    px__hw_check_members(r, g, p, what, members);
    for (size_t i = 0; names[i]; i++)
        px__hw_read_qty(r, g, p, names[i], dims[i], dims[i] != PX_DIM_POWER, outs[i]);
}

static const char *const known_backends[] = {"cpu", "emu", "cuda", NULL};

static const char *const emu_members[] = {"compute_slowdown", "memory_slowdown", "jitter", "seed",
                                          NULL};

/* The "emu" member: {"compute_slowdown", "memory_slowdown", "jitter",
 * "seed"}.  Slowdowns are at least 1 (an emulated device is never faster
 * than the host it runs on); jitter lies in [0, 1). */
static void read_emu(px__hw_reader *r, const json_t *v, const char *where, px_hw_device *d)
{
    json_t *je = json_object_get(v, "emu");
    if (!je)
        return;
    const char *p = px__hw_ptr(r, where, "emu");
    if (!px__hw_expect_object(r, je, p, "\"emu\""))
        return;
    px__hw_check_members(r, je, p, "\"emu\"", emu_members);
    d->emu.present = true;
    d->emu.compute_slowdown = 1;
    d->emu.memory_slowdown = 1;
    static const char *const keys[] = {"compute_slowdown", "memory_slowdown", "jitter", "seed"};
    double *outs[] = {&d->emu.compute_slowdown, &d->emu.memory_slowdown, &d->emu.jitter, NULL};
    for (size_t i = 0; i < PX_ARRAY_LEN(keys); i++) {
        json_t *x = json_object_get(je, keys[i]);
        if (!x)
            continue;
        const char *xp = px__hw_ptr(r, p, keys[i]);
        double val = json_is_number(x) ? json_number_value(x) : NAN;
        if (!isfinite(val)) {
            px__hw_error(r, xp, "give a number", "\"%s\" must be a number, found %s", keys[i],
                         px_json_type_name(x));
        } else if (i < 2 && val < 1) {
            px__hw_error(r, xp,
                         "use 1 or more: an emulated device runs on the host and can only "
                         "be slower than it",
                         "\"%s\" is %g, below 1", keys[i], val);
        } else if (i == 2 && (val < 0 || val >= 1)) {
            px__hw_error(r, xp, "use a fraction in [0, 1), such as 0.02",
                         "\"jitter\" is %g, outside [0, 1)", val);
        } else if (i == 3 && (val < 0 || val > 9007199254740992.0 || val != floor(val))) {
            px__hw_error(r, xp, "use a whole number from 0 to 2^53", "\"seed\" is %g", val);
        } else if (i == 3) {
            d->emu.seed = (uint64_t)val;
        } else {
            *outs[i] = val;
        }
    }
}

bool px__hw_read_device(px__hw_reader *r, const json_t *v, const char *where, const char *node_id,
                        px_hw_device *d)
{
    bool catalog_mode = r->mode == PX__HW_READ_CATALOG;
    px__hw_device_init(d);
    d->where = where;
    if (!px__hw_expect_object(r, v, where, "a device"))
        return false;
    px__hw_check_members(r, v, where, catalog_mode ? "a catalogue entry" : "a device",
                         catalog_mode ? catalog_device_members : device_members);
    if (!px__hw_read_id(r, v, where, "id", catalog_mode ? "catalogue entry" : "device", &d->id))
        return false;
    d->global_id = node_id ? px_arena_printf(r->arena, "%s.%s", node_id, d->id) : d->id;
    if (!d->global_id) {
        r->oom = true;
        return false;
    }

    const px_hw_device *entry = NULL;
    json_t *jcat = json_object_get(v, "catalog");
    if (jcat) {
        if (!json_is_string(jcat)) {
            px__hw_error_at(r, where, "catalog", NULL,
                            "name an entry listed by `plexus inventory catalog`",
                            "\"catalog\" must be a string, found %s", px_json_type_name(jcat));
        } else if (!r->catalog ||
                   !(entry = px_hw_catalog_find_device(r->catalog, json_string_value(jcat)))) {
            const char *close =
                r->catalog ? closest_entry(r->catalog, json_string_value(jcat)) : NULL;
            char *fix = close ? px_asprintf("did you mean \"%s\"? `plexus inventory "
                                            "catalog` lists the entries",
                                            close)
                              : px_strdup("name an entry listed by `plexus inventory "
                                          "catalog`, or drop \"catalog\" and give the "
                                          "figures");
            char shown[48];
            px_strlcpy(shown, json_string_value(jcat), sizeof shown);
            px__hw_error_at(r, where, "catalog", NULL, fix, "unknown catalogue entry \"%s\"",
                            shown);
            free(fix);
        } else {
            d->catalog = dup_str(r, entry->id);
            copy_template(r, entry, d);
        }
    }

    json_t *jclass = json_object_get(v, "class");
    if (jclass) {
        if (!json_is_string(jclass) ||
            px_hw_class_parse(json_string_value(jclass), &d->cls) != PX_OK)
            px__hw_error(r, px__hw_ptr(r, where, "class"), "use gpu, cpu, npu, tpu or fpga",
                         "unknown device class %s%s%s", json_is_string(jclass) ? "\"" : "",
                         json_is_string(jclass) ? json_string_value(jclass)
                                                : px_json_type_name(jclass),
                         json_is_string(jclass) ? "\"" : "");
    } else if (!entry && !(jcat && !entry)) {
        px__hw_error(r, where,
                     "add \"class\": \"gpu\" (or cpu, npu, tpu, fpga), or name a "
                     "catalogue entry with \"catalog\"",
                     "device \"%s\" has no \"class\"", d->id);
    }
    px__hw_read_string(r, v, where, "vendor", &d->vendor);
    px__hw_read_string(r, v, where, "model", &d->model);
    px__hw_read_bool(r, v, where, "emulated", &d->emulated);
    px__hw_read_string(r, v, where, "backend", &d->backend);
    if (json_object_get(v, "backend") && d->backend) {
        bool known = false;
        for (const char *const *b = known_backends; *b && !known; b++)
            known = !strcmp(*b, d->backend);
        if (!known)
            px__hw_warning(r, px__hw_ptr(r, where, "backend"),
                           "use cpu, emu or cuda, or leave it out when plexus has no "
                           "backend for the device",
                           "no backend named \"%s\"; the device can be planned for but not "
                           "run",
                           d->backend);
    }
    px__hw_read_string(r, v, where, "capability", &d->capability);
    read_emu(r, v, where, d);
    read_compute(r, v, where, d);
    px__hw_read_tiers(r, v, where, d->global_id, true, entry ? entry->memory : NULL,
                      entry ? entry->n_memory : 0, &d->memory, &d->n_memory);
    if (json_object_get(v, "ops")) {
        d->all_ops = false;
        d->ops = NULL;
        d->n_ops = 0;
        px__hw_read_string_list(r, v, where, "ops", &d->ops, &d->n_ops);
    }
    if (json_object_get(v, "kernels")) {
        d->kernels = NULL;
        d->n_kernels = 0;
        px__hw_read_string_list(r, v, where, "kernels", &d->kernels, &d->n_kernels);
    }
    json_t *jrt = json_object_get(v, "runtime");
    if (jrt) {
        const char *p = px__hw_ptr(r, where, "runtime");
        if (px__hw_expect_object(r, jrt, p, "\"runtime\"")) {
            px__hw_check_members(r, jrt, p, "\"runtime\"", runtime_members);
            px__hw_read_string(r, jrt, p, "name", &d->runtime_name);
            px__hw_read_string(r, jrt, p, "version", &d->runtime_version);
        }
    }
    px__hw_read_string(r, v, where, "driver", &d->driver);
    {
        static const char *const names[] = {"tdp", "idle", NULL};
        static const px_dim dims[] = {PX_DIM_POWER, PX_DIM_POWER};
        px_qty *outs[] = {&d->power_tdp, &d->power_idle};
        read_group(r, v, where, "power", power_members, names, dims, outs);
    }
    {
        static const char *const names[] = {"limit", "time_constant", NULL};
        static const px_dim dims[] = {PX_DIM_TEMPERATURE, PX_DIM_TIME};
        px_qty *outs[] = {&d->thermal_limit, &d->thermal_time_constant};
        read_group(r, v, where, "thermal", thermal_members, names, dims, outs);
    }
    px__hw_read_qty(r, v, where, "cost", PX_DIM_MONEY_RATE, false, &d->cost);
    px__hw_read_qty(r, v, where, "mtbf", PX_DIM_TIME, true, &d->mtbf);
    if (!catalog_mode)
        px__hw_read_live(r, v, where, true, &d->live);
    return true;
}

/* ------------------------------------------------------------------ */
/* Link figures                                                        */
/* ------------------------------------------------------------------ */

bool px__hw_read_link_figures(px__hw_reader *r, const json_t *v, const char *where, px_hw_link *l)
{
    bool catalog_mode = r->mode == PX__HW_READ_CATALOG;
    const px_hw_link *entry = NULL;
    json_t *jcat = catalog_mode ? NULL : json_object_get(v, "catalog");
    if (jcat) {
        if (!json_is_string(jcat) || !r->catalog ||
            !(entry = px_hw_catalog_find_link(r->catalog, json_string_value(jcat)))) {
            char shown[48];
            px_strlcpy(shown, json_is_string(jcat) ? json_string_value(jcat) : "", sizeof shown);
            px__hw_error_at(r, where, "catalog", NULL,
                            "name a link entry listed by `plexus inventory catalog`, or drop "
                            "\"catalog\" and give kind and bandwidth",
                            "unknown link catalogue entry \"%s\"", shown);
        } else {
            l->catalog = dup_str(r, entry->id);
            l->kind = entry->kind;
            l->bandwidth = dup_qty(r, entry->bandwidth);
            l->latency = dup_qty(r, entry->latency);
            l->setup = dup_qty(r, entry->setup);
            l->collectives = dup_list(r, entry->collectives, entry->n_collectives);
            l->n_collectives = entry->n_collectives;
            l->energy_per_byte = dup_qty(r, entry->energy_per_byte);
        }
    }
    bool ok = true;
    json_t *jk = json_object_get(v, "kind");
    if (jk) {
        if (!json_is_string(jk) ||
            px_hw_link_kind_parse(json_string_value(jk), &l->kind) != PX_OK) {
            char shown[48];
            px_strlcpy(shown, json_is_string(jk) ? json_string_value(jk) : px_json_type_name(jk),
                       sizeof shown);
            px__hw_error(r, px__hw_ptr(r, where, "kind"),
                         "use nvlink3, nvlink4, nvlink5, infinity-fabric, pcie3, pcie4, "
                         "pcie5, ethernet, infiniband, ici, cxl, loopback or other",
                         "unknown link kind \"%s\"", shown);
            ok = false;
        }
    } else if (!entry && !jcat) {
        px__hw_error(r, where, "add \"kind\", e.g. \"pcie4\" or \"ethernet\"",
                     "link has no \"kind\"");
        ok = false;
    }
    if (!px__hw_read_qty(r, v, where, "bandwidth", PX_DIM_BANDWIDTH, true, &l->bandwidth))
        ok = false;
    else if (!px_hw_has(l->bandwidth) && !jcat) {
        px__hw_error(r, where, "add \"bandwidth\" per direction, e.g. \"25 GB/s\"",
                     "link has no \"bandwidth\"");
        ok = false;
    }
    px__hw_read_qty(r, v, where, "latency", PX_DIM_TIME, false, &l->latency);
    px__hw_read_qty(r, v, where, "setup", PX_DIM_TIME, false, &l->setup);
    if (json_object_get(v, "collectives")) {
        l->collectives = NULL;
        l->n_collectives = 0;
        px__hw_read_string_list(r, v, where, "collectives", &l->collectives, &l->n_collectives);
    }
    px__hw_read_qty(r, v, where, "energy_per_byte", PX_DIM_ENERGY, false, &l->energy_per_byte);
    if (!catalog_mode) {
        json_t *jd = json_object_get(v, "dollars_per_gb");
        if (jd) {
            double x = json_is_number(jd) ? json_number_value(jd) : NAN;
            if (!json_is_number(jd) || !isfinite(x) || x < 0)
                px__hw_error(r, px__hw_ptr(r, where, "dollars_per_gb"),
                             "write the price per GB moved as a number >= 0, e.g. 0.02",
                             "\"dollars_per_gb\" must be a number of at least 0");
            else
                l->dollars_per_gb = x;
        }
        json_t *jt = json_object_get(v, "trust");
        if (jt &&
            (!json_is_string(jt) || px_hw_trust_parse(json_string_value(jt), &l->trust) != PX_OK))
            px__hw_error(r, px__hw_ptr(r, where, "trust"), "use trusted, encrypted or untrusted",
                         "unknown trust level");
    }
    return ok;
}
