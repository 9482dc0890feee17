/* Scenario packs (`plexus.pack/1`, docs/formats/pack.md): a bounded,
 * strict reader.  A pack names what `plexus compare` runs; every path in
 * it resolves against the pack's own folder so a pack can be moved with
 * its files. */
#include "base/common.h"

#include "plexus/ir.h"
#include "plexus/plan.h"
#include "sim/compare_impl.h"

#define MAX_PACK_BYTES (1u << 20)
#define MAX_NAME       64
#define MAX_PATH_TEXT  4096
#define MAX_TOKENS     (1u << 24)
#define MAX_BATCH      65536u

#define DEFAULT_MODEL     "llama-3-8b"
#define DEFAULT_OBJECTIVE "latency"

void px_sim_pack_release(px_sim_pack *pack)
{
    if (!pack)
        return;
    px_arena_free(pack->arena);
    memset(pack, 0, sizeof *pack);
}

/* The folder of path, with its trailing slash ("" for a bare name). */
static char *folder_of(px_arena *a, const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? px_arena_strndup(a, path, (size_t)(slash - path) + 1) : px_arena_strdup(a, "");
}

static const char *resolve(px_arena *a, const char *dir, const char *rel)
{
    if (rel[0] == '/' || !dir[0])
        return px_arena_strdup(a, rel);
    return px_arena_printf(a, "%s%s", dir, rel);
}

static bool is_preset(const char *name)
{
    for (size_t i = 0; i < px_ir_preset_count(); i++)
        if (!strcmp(px_ir_preset_at(i)->name, name))
            return true;
    return false;
}

/* A string member: present, a string without NUL bytes, 1..max bytes.
 * PX_ENOTFOUND when absent. */
static px_status get_string(const json_t *o, const char *key, const char *name, size_t i,
                            size_t max, const char **out, px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v)
        return PX_ENOTFOUND;
    if (!json_is_string(v))
        return px_err_set(err, PX_EPARSE, "%s: /scenarios/%zu/%s: expected a string, got %s", name,
                          i, key, px_json_type_name(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n != strlen(s))
        return px_err_set(err, PX_EPARSE,
                          "%s: /scenarios/%zu/%s: empty or holds a NUL byte; give a value", name, i,
                          key);
    if (n > max)
        return px_err_set(err, PX_ELIMIT, "%s: /scenarios/%zu/%s: longer than %zu bytes", name, i,
                          key, max);
    *out = s;
    return PX_OK;
}

static px_status get_u32(const json_t *o, const char *key, const char *name, size_t i, uint32_t lo,
                         uint32_t hi, uint32_t *out, px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v)
        return PX_OK;
    json_int_t x = json_integer_value(v);
    if (!json_is_integer(v) || x < (json_int_t)lo || x > (json_int_t)hi)
        return px_err_set(err, PX_EPARSE,
                          "%s: /scenarios/%zu/%s: expected a whole number from %u to %u", name, i,
                          key, lo, hi);
    *out = (uint32_t)x;
    return PX_OK;
}

#define OPTIONAL(call)                           \
    do {                                         \
        px_status st_ = (call);                  \
        if (st_ != PX_OK && st_ != PX_ENOTFOUND) \
            return st_;                          \
    } while (0)

static void scenario_defaults(px_sim_scenario *s)
{
    memset(s, 0, sizeof *s);
    s->model = DEFAULT_MODEL;
    s->objective = DEFAULT_OBJECTIVE;
    s->context = 4096;
    s->prompt_tokens = 512;
    s->gen_tokens = 256;
}

static bool scenario_member(const char *key)
{
    static const char *const names[] = {
        "name", "description", "inventory", "model",         "load",       "objective",
        "slo",  "faults",      "context",   "prompt_tokens", "gen_tokens", "batch",
    };
    for (size_t k = 0; k < PX_ARRAY_LEN(names); k++)
        if (!strcmp(key, names[k]))
            return true;
    return false;
}

static bool name_ok(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return false;
    return true;
}

static px_status parse_scenario(const json_t *o, const char *name, const char *dir, size_t i,
                                px_arena *a, px_sim_scenario *s, px_err *err)
{
    if (!json_is_object(o))
        return px_err_set(err, PX_EPARSE, "%s: /scenarios/%zu: expected an object, got %s", name, i,
                          px_json_type_name(o));
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)o, key, val)
    {
        if (!scenario_member(key))
            return px_err_set(err, PX_EPARSE,
                              "%s: /scenarios/%zu/%.40s: not a member of a scenario (see "
                              "docs/formats/pack.md)",
                              name, i, key);
    }
    scenario_defaults(s);
    const char *text;
    px_status st;
    if ((st = get_string(o, "name", name, i, MAX_NAME, &text, err)) != PX_OK)
        return st == PX_ENOTFOUND ? px_err_set(err, PX_EPARSE,
                                               "%s: /scenarios/%zu/name: missing; give each "
                                               "scenario a unique name",
                                               name, i)
                                  : st;
    if (!name_ok(text))
        return px_err_set(err, PX_EPARSE,
                          "%s: /scenarios/%zu/name: use printable ASCII characters only", name, i);
    s->name = px_arena_strdup(a, text);
    OPTIONAL(get_string(o, "description", name, i, MAX_PATH_TEXT, &text, err));
    if ((st = get_string(o, "inventory", name, i, MAX_PATH_TEXT, &text, err)) != PX_OK)
        return st == PX_ENOTFOUND ? px_err_set(err, PX_EPARSE,
                                               "%s: /scenarios/%zu/inventory: missing; name a "
                                               "plexus.inventory/1 file (relative to the pack)",
                                               name, i)
                                  : st;
    s->inventory = resolve(a, dir, text);
    text = NULL;
    OPTIONAL(get_string(o, "model", name, i, MAX_PATH_TEXT, &text, err));
    if (text)
        s->model = is_preset(text) ? px_arena_strdup(a, text) : resolve(a, dir, text);
    text = NULL;
    OPTIONAL(get_string(o, "objective", name, i, 64, &text, err));
    if (text) {
        px_plan_objective obj;
        px_err e;
        if (px_plan_objective_parse(text, &obj, &e) != PX_OK)
            return px_err_set(err, PX_EPARSE, "%s: /scenarios/%zu/objective: %s", name, i, e.msg);
        s->objective = px_plan_objective_name(obj);
    }
    text = NULL;
    OPTIONAL(get_string(o, "slo", name, i, 256, &text, err));
    if (text) {
        px_plan_slo slo = {0};
        px_err e;
        if (px_plan_slo_parse(text, &slo, &e) != PX_OK)
            return px_err_set(err, PX_EPARSE, "%s: /scenarios/%zu/slo: %s", name, i, e.msg);
        s->slo = px_arena_strdup(a, text);
    }
    text = NULL;
    OPTIONAL(get_string(o, "faults", name, i, MAX_PATH_TEXT, &text, err));
    if (text)
        s->faults = resolve(a, dir, text);
    text = NULL;
    OPTIONAL(get_string(o, "load", name, i, MAX_PATH_TEXT, &text, err));
    if (text && px_str_starts_with(text, "trace:")) {
        if (!text[6])
            return px_err_set(err, PX_EPARSE,
                              "%s: /scenarios/%zu/load: \"trace:\" needs a file name", name, i);
        const char *file = resolve(a, dir, text + 6);
        s->load = file ? px_arena_printf(a, "trace:%s", file) : NULL;
    } else if (text) {
        /* Poisson and bursty specs read no file: check them now so a bad
         * pack fails before any planning. */
        px_sim_load load;
        px_err e;
        if (px_sim_load_parse(text, &load, &e) != PX_OK)
            return px_err_set(err, PX_EPARSE, "%s: /scenarios/%zu/load: %s", name, i, e.msg);
        px_sim_load_release(&load);
        s->load = px_arena_strdup(a, text);
    }
    if ((st = get_u32(o, "context", name, i, 1, MAX_TOKENS, &s->context, err)) != PX_OK ||
        (st = get_u32(o, "prompt_tokens", name, i, 1, MAX_TOKENS, &s->prompt_tokens, err)) !=
            PX_OK ||
        (st = get_u32(o, "gen_tokens", name, i, 1, MAX_TOKENS, &s->gen_tokens, err)) != PX_OK ||
        (st = get_u32(o, "batch", name, i, 0, MAX_BATCH, &s->batch, err)) != PX_OK)
        return st;
    if (s->prompt_tokens > s->context)
        return px_err_set(err, PX_EPARSE,
                          "%s: /scenarios/%zu/prompt_tokens: %u exceeds the context (%u); "
                          "lower it or raise context",
                          name, i, s->prompt_tokens, s->context);
    if (!s->name || !s->inventory || !s->model || (text && !s->load) ||
        (json_object_get(o, "faults") && !s->faults))
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
    return PX_OK;
}

/* A plain inventory: one scenario with every default, named after the
 * inventory's "name" when it is a usable one, else after the file. */
static px_status single_inventory(const json_t *doc, const char *name, px_arena *a,
                                  px_sim_pack *out, px_err *err)
{
    px_sim_scenario *s = px_arena_calloc(a, 1, sizeof *s);
    if (!s)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
    scenario_defaults(s);
    const char *inv_name = json_string_value(json_object_get(doc, "name"));
    if (inv_name && inv_name[0] && strlen(inv_name) <= MAX_NAME && name_ok(inv_name)) {
        s->name = px_arena_strdup(a, inv_name);
    } else {
        const char *base = strrchr(name, '/');
        base = base ? base + 1 : name;
        size_t n = strlen(base);
        if (px_str_ends_with(base, ".json"))
            n -= 5;
        s->name = px_arena_strndup(a, base, PX_MIN(n, (size_t)MAX_NAME));
    }
    s->inventory = px_arena_strdup(a, name);
    if (!s->name || !s->inventory)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
    out->scenarios = s;
    out->n_scenarios = 1;
    return PX_OK;
}

static px_status parse_doc(const json_t *doc, const char *name, px_arena *a, px_sim_pack *out,
                           px_err *err)
{
    if (!json_is_object(doc))
        return px_err_set(err, PX_EPARSE, "%s: expected a JSON object (a plexus.pack/1 document)",
                          name);
    const char *schema = json_string_value(json_object_get(doc, "schema"));
    if (schema && !strcmp(schema, "plexus.inventory/1"))
        return single_inventory(doc, name, a, out, err);
    if (!schema || strcmp(schema, PX_SIM_PACK_SCHEMA))
        return px_err_set(err, PX_EPARSE,
                          "%s: /schema: expected \"%s\" (or a plexus.inventory/1 document)", name,
                          PX_SIM_PACK_SCHEMA);
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)doc, key, val)
    {
        if (strcmp(key, "schema") && strcmp(key, "description") && strcmp(key, "scenarios"))
            return px_err_set(err, PX_EPARSE,
                              "%s: /%.40s: not a member of a pack; use schema, description and "
                              "scenarios",
                              name, key);
    }
    const json_t *desc = json_object_get(doc, "description");
    if (desc && !json_is_string(desc))
        return px_err_set(err, PX_EPARSE, "%s: /description: expected a string", name);
    const json_t *list = json_object_get(doc, "scenarios");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return px_err_set(err, PX_EPARSE,
                          "%s: /scenarios: missing or empty; list at least one scenario", name);
    size_t n = json_array_size(list);
    if (n > PX_SIM_PACK_MAX_SCENARIOS)
        return px_err_set(err, PX_ELIMIT,
                          "%s: /scenarios: %zu scenarios; at most %d fit in one pack (split it)",
                          name, n, PX_SIM_PACK_MAX_SCENARIOS);
    const char *dir = folder_of(a, name);
    px_sim_scenario *items = px_arena_calloc(a, n, sizeof *items);
    if (!dir || !items)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
    for (size_t i = 0; i < n; i++) {
        px_status st = parse_scenario(json_array_get(list, i), name, dir, i, a, &items[i], err);
        if (st != PX_OK)
            return st;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(items[j].name, items[i].name))
                return px_err_set(err, PX_EPARSE,
                                  "%s: /scenarios/%zu/name: \"%s\" is already the name of "
                                  "/scenarios/%zu; names must be unique",
                                  name, i, items[i].name, j);
    }
    out->scenarios = items;
    out->n_scenarios = n;
    return PX_OK;
}

px_status px_sim_pack_parse(const char *text, size_t len, const char *path, px_sim_pack *out,
                            px_err *err)
{
    memset(out, 0, sizeof *out);
    const char *name = path && path[0] ? path : "pack.json";
    if (len > MAX_PACK_BYTES)
        return px_err_set(err, PX_ELIMIT, "%s: %zu bytes; a pack holds at most %u", name, len,
                          MAX_PACK_BYTES);
    px_json_limits lim = {
        .max_bytes = MAX_PACK_BYTES,
        .max_depth = 8,
        .max_string = MAX_PATH_TEXT,
        .max_elements = 4096,
    };
    json_t *doc = NULL;
    px_status st = px_json_parse(text, len, name, &lim, &doc, err);
    if (st != PX_OK)
        return st;
    if ((st = px_arena_new(0, &out->arena, err)) != PX_OK) {
        json_decref(doc);
        return st;
    }
    st = parse_doc(doc, name, out->arena, out, err);
    json_decref(doc);
    if (st != PX_OK)
        px_sim_pack_release(out);
    return st;
}

px_status px_sim_pack_load(const char *path, px_sim_pack *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    px_status st = px_read_file(path, MAX_PACK_BYTES, &text, &len, err);
    if (st != PX_OK)
        return st;
    st = px_sim_pack_parse(text, len, path, out, err);
    free(text);
    return st;
}
