/* The faults file (`plexus.faults/1`, docs/formats/faults.md): a bounded,
 * strict reader and its JSON form. */
#include "base/common.h"

#include "sim/sim_impl.h"

#define MAX_FAULTS_BYTES (1u << 20)
#define MAX_FAULTS       10000
#define MAX_TIME_S       1e9

static const char *const kind_names[PX_SIM_FAULT_KIND_COUNT_] = {
    "device-loss", "domain-loss", "link-degrade", "thermal", "power-cap",
};

const char *px_sim_fault_kind_name(px_sim_fault_kind k)
{
    return (unsigned)k < PX_SIM_FAULT_KIND_COUNT_ ? kind_names[k] : "unknown";
}

/* Which members each kind accepts beyond kind, at, target, duration. */
static bool member_allowed(px_sim_fault_kind k, const char *key)
{
    if (!strcmp(key, "kind") || !strcmp(key, "at") || !strcmp(key, "target") ||
        !strcmp(key, "duration") || !strcmp(key, "note"))
        return true;
    switch (k) {
    case PX_SIM_FAULT_LINK_DEGRADE:
        return !strcmp(key, "latency") || !strcmp(key, "bandwidth_factor") ||
               !strcmp(key, "intermittent");
    case PX_SIM_FAULT_THERMAL:
        return !strcmp(key, "ambient");
    case PX_SIM_FAULT_POWER_CAP:
        return !strcmp(key, "limit");
    default:
        return false;
    }
}

static px_status get_qty(const json_t *o, const char *key, px_dim dim, const char *name, size_t i,
                         const char *sub, double lo, double hi, double *out, px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v)
        return PX_ENOTFOUND;
    px_qty q;
    px_err e;
    if (!json_is_string(v))
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu%s/%s: expected a string with a unit "
                          "(e.g. \"%s\"), got %s",
                          name, i, sub, key,
                          dim == PX_DIM_TIME          ? "5 s"
                          : dim == PX_DIM_TEMPERATURE ? "45 C"
                                                      : "300 W",
                          px_json_type_name(v));
    if (px_qty_parse(json_string_value(v), dim, &q, &e) != PX_OK)
        return px_err_set(err, PX_EPARSE, "%s: /faults/%zu%s/%s: %s", name, i, sub, key, e.msg);
    if (!(q.value >= lo && q.value <= hi))
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu%s/%s: \"%s\" is out of range; use a "
                          "value from %g to %g %s",
                          name, i, sub, key, json_string_value(v), lo, hi, px_dim_unit(dim));
    *out = q.value;
    return PX_OK;
}

static px_status get_number(const json_t *o, const char *key, const char *name, size_t i,
                            const char *sub, double lo_excl, double hi, double *out, px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v)
        return PX_ENOTFOUND;
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || !(x > lo_excl) || x > hi)
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu%s/%s: expected a number above %g and "
                          "at most %g",
                          name, i, sub, key, lo_excl, hi);
    *out = x;
    return PX_OK;
}

/* Optional quantity: PX_OK when absent (out untouched) or valid. */
#define OPTIONAL(call)                           \
    do {                                         \
        px_status st_ = (call);                  \
        if (st_ != PX_OK && st_ != PX_ENOTFOUND) \
            return st_;                          \
    } while (0)

static px_status parse_fault(const json_t *o, const char *name, size_t i, px_sim_fault *f,
                             px_err *err)
{
    if (!json_is_object(o))
        return px_err_set(err, PX_EPARSE, "%s: /faults/%zu: expected an object, got %s", name, i,
                          px_json_type_name(o));
    const json_t *kind = json_object_get(o, "kind");
    if (!json_is_string(kind))
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu/kind: missing or not a string; use "
                          "device-loss, domain-loss, link-degrade, thermal or "
                          "power-cap",
                          name, i);
    f->kind = PX_SIM_FAULT_KIND_COUNT_;
    for (int k = 0; k < PX_SIM_FAULT_KIND_COUNT_; k++)
        if (!strcmp(json_string_value(kind), kind_names[k]))
            f->kind = (px_sim_fault_kind)k;
    if (f->kind == PX_SIM_FAULT_KIND_COUNT_)
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu/kind: unknown kind \"%.40s\"; use "
                          "device-loss, domain-loss, link-degrade, thermal or "
                          "power-cap",
                          name, i, json_string_value(kind));
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)o, key, val)
    {
        if (!member_allowed(f->kind, key))
            return px_err_set(err, PX_EPARSE,
                              "%s: /faults/%zu/%.40s: not a member of a %s fault "
                              "(see docs/formats/faults.md)",
                              name, i, key, kind_names[f->kind]);
    }
    const json_t *target = json_object_get(o, "target");
    if (!json_is_string(target) || !json_string_length(target))
        return px_err_set(err, PX_EPARSE, "%s: /faults/%zu/target: missing; name a %s", name, i,
                          f->kind == PX_SIM_FAULT_LINK_DEGRADE  ? "link as \"n1.gpu0>n1.gpu1\""
                          : f->kind == PX_SIM_FAULT_DOMAIN_LOSS ? "failure domain"
                          : f->kind == PX_SIM_FAULT_DEVICE_LOSS ? "device (\"n1.gpu0\")"
                                                                : "device or \"*\"");
    if (px_strlcpy(f->target, json_string_value(target), sizeof f->target) >= sizeof f->target)
        return px_err_set(err, PX_ELIMIT, "%s: /faults/%zu/target: longer than %zu bytes", name, i,
                          sizeof f->target - 1);
    if (f->kind == PX_SIM_FAULT_LINK_DEGRADE) {
        const char *gt = strchr(f->target, '>');
        if (!gt || gt == f->target || !gt[1] || strchr(gt + 1, '>') ||
            (size_t)(gt - f->target) >= PX_SIM_ID_LEN || strlen(gt + 1) >= PX_SIM_ID_LEN)
            return px_err_set(err, PX_EPARSE,
                              "%s: /faults/%zu/target: \"%.60s\" is not a link; "
                              "write FROM>TO with device ids, e.g. "
                              "\"n1.gpu0>n1.gpu1\"",
                              name, i, f->target);
    } else if (strlen(f->target) >= PX_SIM_ID_LEN) {
        return px_err_set(err, PX_ELIMIT, "%s: /faults/%zu/target: longer than %d bytes", name, i,
                          PX_SIM_ID_LEN - 1);
    }
    if ((f->kind == PX_SIM_FAULT_DEVICE_LOSS || f->kind == PX_SIM_FAULT_DOMAIN_LOSS) &&
        !strcmp(f->target, "*"))
        return px_err_set(err, PX_EPARSE,
                          "%s: /faults/%zu/target: \"*\" is allowed only for "
                          "thermal and power-cap faults; name one %s",
                          name, i, f->kind == PX_SIM_FAULT_DOMAIN_LOSS ? "domain" : "device");
    OPTIONAL(get_qty(o, "at", PX_DIM_TIME, name, i, "", 0, MAX_TIME_S, &f->at_s, err));
    OPTIONAL(
        get_qty(o, "duration", PX_DIM_TIME, name, i, "", 1e-9, MAX_TIME_S, &f->duration_s, err));
    px_status st;
    switch (f->kind) {
    case PX_SIM_FAULT_LINK_DEGRADE: {
        f->bandwidth_factor = 1;
        OPTIONAL(get_qty(o, "latency", PX_DIM_TIME, name, i, "", 0, 3600, &f->latency_s, err));
        OPTIONAL(get_number(o, "bandwidth_factor", name, i, "", 0, 1, &f->bandwidth_factor, err));
        if (!json_object_get(o, "latency") && !json_object_get(o, "bandwidth_factor"))
            return px_err_set(err, PX_EPARSE,
                              "%s: /faults/%zu: a link-degrade fault needs "
                              "latency, bandwidth_factor or both",
                              name, i);
        const json_t *im = json_object_get(o, "intermittent");
        if (im) {
            char sub[64];
            snprintf(sub, sizeof sub, "/intermittent");
            if (!json_is_object(im))
                return px_err_set(err, PX_EPARSE,
                                  "%s: /faults/%zu/intermittent: expected "
                                  "{\"period\": \"2 s\", \"duty\": 0.5}",
                                  name, i);
            json_object_foreach((json_t *)im, key, val)
            {
                if (strcmp(key, "period") && strcmp(key, "duty"))
                    return px_err_set(err, PX_EPARSE,
                                      "%s: /faults/%zu/intermittent/%.40s: "
                                      "unknown; use period and duty",
                                      name, i, key);
            }
            st = get_qty(im, "period", PX_DIM_TIME, name, i, sub, 1e-6, MAX_TIME_S, &f->period_s,
                         err);
            if (st == PX_ENOTFOUND)
                return px_err_set(err, PX_EPARSE, "%s: /faults/%zu/intermittent/period: missing",
                                  name, i);
            if (st != PX_OK)
                return st;
            st = get_number(im, "duty", name, i, sub, 0, 1, &f->duty, err);
            if (st == PX_ENOTFOUND)
                return px_err_set(err, PX_EPARSE,
                                  "%s: /faults/%zu/intermittent/duty: missing; "
                                  "the fraction of each period the link is "
                                  "degraded, in (0, 1]",
                                  name, i);
            if (st != PX_OK)
                return st;
        }
        break;
    }
    case PX_SIM_FAULT_THERMAL:
        st = get_qty(o, "ambient", PX_DIM_TEMPERATURE, name, i, "", 173.15, 473.15, &f->ambient_k,
                     err);
        if (st == PX_ENOTFOUND)
            return px_err_set(err, PX_EPARSE,
                              "%s: /faults/%zu/ambient: missing; give the ambient "
                              "temperature, e.g. \"45 C\"",
                              name, i);
        if (st != PX_OK)
            return st;
        break;
    case PX_SIM_FAULT_POWER_CAP:
        st = get_qty(o, "limit", PX_DIM_POWER, name, i, "", 1, 1e6, &f->power_limit_w, err);
        if (st == PX_ENOTFOUND)
            return px_err_set(err, PX_EPARSE,
                              "%s: /faults/%zu/limit: missing; give the power "
                              "cap, e.g. \"300 W\"",
                              name, i);
        if (st != PX_OK)
            return st;
        break;
    default:
        break;
    }
    return PX_OK;
}

px_status px_sim_faults_parse(const char *text, size_t len, const char *name, px_sim_faults *out,
                              px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "faults";
    if (len > MAX_FAULTS_BYTES)
        return px_err_set(err, PX_ELIMIT, "%s: %zu bytes; a faults file may hold at most %u", name,
                          len, MAX_FAULTS_BYTES);
    px_json_limits lim = {.max_bytes = MAX_FAULTS_BYTES,
                          .max_depth = 8,
                          .max_string = 1024,
                          .max_elements = MAX_FAULTS};
    json_t *doc;
    px_status st = px_json_parse(text, len, name, &lim, &doc, err);
    if (st != PX_OK)
        return st;
    if (!json_is_object(doc)) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: expected an object {\"schema\": \"%s\", \"faults\": "
                        "[...]}, got %s",
                        name, PX_SIM_FAULTS_SCHEMA, px_json_type_name(doc));
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(doc, key, val)
    {
        if (strcmp(key, "schema") && strcmp(key, "faults") && strcmp(key, "description")) {
            st = px_err_set(err, PX_EPARSE,
                            "%s: /%.40s: unknown member; a faults file holds "
                            "schema, description and faults",
                            name, key);
            goto done;
        }
    }
    const json_t *schema = json_object_get(doc, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), PX_SIM_FAULTS_SCHEMA)) {
        st = px_err_set(err, PX_EPARSE, "%s: /schema: expected \"%s\"", name, PX_SIM_FAULTS_SCHEMA);
        goto done;
    }
    const json_t *arr = json_object_get(doc, "faults");
    if (!json_is_array(arr)) {
        st = px_err_set(err, PX_EPARSE, "%s: /faults: missing or not an array", name);
        goto done;
    }
    size_t n = json_array_size(arr);
    if (n > MAX_FAULTS) {
        st = px_err_set(err, PX_ELIMIT, "%s: /faults: %zu faults; at most %d are accepted", name, n,
                        MAX_FAULTS);
        goto done;
    }
    out->items = calloc(n ? n : 1, sizeof *out->items);
    if (!out->items) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        st = parse_fault(json_array_get(arr, i), name, i, &out->items[i], err);
        if (st != PX_OK) {
            px_sim_faults_release(out);
            goto done;
        }
        out->n = i + 1;
    }
done:
    json_decref(doc);
    return st;
}

px_status px_sim_faults_load(const char *path, px_sim_faults *out, px_err *err)
{
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    px_status st = px_read_file(path, MAX_FAULTS_BYTES, &text, &len, err);
    if (st != PX_OK)
        return st;
    st = px_sim_faults_parse(text, len, path, out, err);
    free(text);
    return st;
}

void px_sim_faults_release(px_sim_faults *f)
{
    if (!f)
        return;
    free(f->items);
    memset(f, 0, sizeof *f);
}

static json_t *qty(double v, px_dim dim)
{
    char buf[64];
    px_qty_format(v, dim, buf, sizeof buf);
    return json_string(buf);
}

json_t *px_sim_faults_to_json(const px_sim_faults *f)
{
    json_t *arr = json_array();
    json_t *doc = json_pack("{s:s, s:o}", "schema", PX_SIM_FAULTS_SCHEMA, "faults", arr);
    if (!doc)
        return NULL;
    for (size_t i = 0; f && i < f->n; i++) {
        const px_sim_fault *x = &f->items[i];
        json_t *o = json_pack("{s:s, s:s, s:o}", "kind", px_sim_fault_kind_name(x->kind), "target",
                              x->target, "at", qty(x->at_s, PX_DIM_TIME));
        if (!o || px_json_push(arr, o) != PX_OK)
            goto fail;
        px_status st = PX_OK;
        if (x->duration_s > 0)
            st |= px_json_set(o, "duration", qty(x->duration_s, PX_DIM_TIME));
        if (x->kind == PX_SIM_FAULT_LINK_DEGRADE) {
            st |= px_json_set(o, "latency", qty(x->latency_s, PX_DIM_TIME));
            st |= px_json_set(o, "bandwidth_factor", json_real(x->bandwidth_factor));
            if (x->period_s > 0)
                st |= px_json_set(o, "intermittent",
                                  json_pack("{s:o, s:f}", "period", qty(x->period_s, PX_DIM_TIME),
                                            "duty", x->duty));
        } else if (x->kind == PX_SIM_FAULT_THERMAL) {
            st |= px_json_set(o, "ambient", qty(x->ambient_k, PX_DIM_TEMPERATURE));
        } else if (x->kind == PX_SIM_FAULT_POWER_CAP) {
            st |= px_json_set(o, "limit", qty(x->power_limit_w, PX_DIM_POWER));
        }
        if (st != PX_OK)
            goto fail;
    }
    return doc;
fail:
    json_decref(doc);
    return NULL;
}
