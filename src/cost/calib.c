/* The calibration overlay: corrections, their checks, lookup, and the
 * `plexus.calibration/1` document (reader and writer). */
#include "base/common.h"

#include "cost/cost_impl.h"

#define CALIB_MAX_FILE (16u * 1024u * 1024u)

struct px_cost_calibration {
    px_cost_correction *items;
    size_t n, cap;
    char digest[65];
    bool digest_ok;
};

static const char *const class_names[PX_COST_CLASS_COUNT_] = {"matvec", "attention", "matmul",
                                                              "copy",   "step",      "decode"};

const char *px_cost_op_class_name(px_cost_op_class c)
{
    return (unsigned)c < PX_COST_CLASS_COUNT_ ? class_names[c] : "?";
}

px_status px_cost_op_class_parse(const char *name, px_cost_op_class *out, px_err *err)
{
    for (int i = 0; i < PX_COST_CLASS_COUNT_; i++) {
        if (name && !strcmp(name, class_names[i])) {
            *out = (px_cost_op_class)i;
            return PX_OK;
        }
    }
    return px_err_set(
        err, PX_EINVAL,
        "unknown op class \"%s\"; use matvec, attention, matmul, copy, step or decode",
        name ? name : "");
}

px_status px_cost_calibration_new(px_cost_calibration **out, px_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return px_err_set(err, PX_ENOMEM, "out of memory creating a calibration overlay");
    return PX_OK;
}

void px_cost_calibration_free(px_cost_calibration *c)
{
    if (!c)
        return;
    free(c->items);
    free(c);
}

size_t px_cost_calibration_count(const px_cost_calibration *cal)
{
    return cal ? cal->n : 0;
}

const px_cost_correction *px_cost_calibration_at(const px_cost_calibration *cal, size_t i)
{
    return cal && i < cal->n ? &cal->items[i] : NULL;
}

static bool finite_pos(double v)
{
    return isfinite(v) && v > 0;
}

/* The checks the reader applies; field names are the document's. */
static px_status check_correction(const px_cost_correction *c, const char *where, px_err *err)
{
    if (!c->device[0] || memchr(c->device, '\0', sizeof c->device) == NULL)
        return px_err_set(err, PX_EINVAL, "%s/device: give a device id or link kind", where);
    if ((unsigned)c->cls >= PX_COST_CLASS_COUNT_)
        return px_err_set(err, PX_EINVAL,
                          "%s/class: use matvec, attention, matmul, copy, step or decode", where);
    if ((unsigned)c->dtype > PX_DTYPE_COUNT_)
        return px_err_set(err, PX_EINVAL, "%s/dtype: unknown dtype", where);
    if (!finite_pos(c->factor) || c->factor > 1e6 || c->factor < 1e-6)
        return px_err_set(err, PX_EINVAL,
                          "%s/factor: %g; a correction factor is a finite number in [1e-6, 1e6]",
                          where, c->factor);
    if (!finite_pos(c->lo) || !finite_pos(c->hi) || c->lo > c->factor || c->hi < c->factor ||
        c->hi > 1e7)
        return px_err_set(err, PX_EINVAL,
                          "%s/interval: [%g, %g] must be finite, positive and contain the "
                          "factor %g",
                          where, c->lo, c->hi, c->factor);
    if (!isfinite(c->offset_s) || fabs(c->offset_s) > 1e3)
        return px_err_set(err, PX_EINVAL, "%s/offset_s: %g; give seconds in [-1000, 1000]", where,
                          c->offset_s);
    if (!(c->confidence > 0 && c->confidence < 1))
        return px_err_set(err, PX_EINVAL, "%s/confidence: %g; use a level in (0, 1), e.g. 0.95",
                          where, c->confidence);
    if (!isfinite(c->valid_lo) || !isfinite(c->valid_hi) || c->valid_lo < 0 ||
        c->valid_hi < c->valid_lo)
        return px_err_set(err, PX_EINVAL,
                          "%s/valid: [%g, %g]; give finite bounds with 0 <= min <= max", where,
                          c->valid_lo, c->valid_hi);
    if (c->n_samples < 1)
        return px_err_set(err, PX_EINVAL, "%s/samples: a correction rests on at least one sample",
                          where);
    if (memchr(c->dataset, '\0', sizeof c->dataset) == NULL ||
        memchr(c->timestamp, '\0', sizeof c->timestamp) == NULL)
        return px_err_set(err, PX_EINVAL, "%s: dataset or timestamp too long", where);
    return PX_OK;
}

/* The same device, class and dtype with overlapping validity ranges: two
 * corrections that could both claim one size. */
static bool same_key(const px_cost_correction *a, const px_cost_correction *b)
{
    return a->cls == b->cls && a->dtype == b->dtype && !strcmp(a->device, b->device) &&
           a->valid_lo <= b->valid_hi && b->valid_lo <= a->valid_hi;
}

/* Room for one more correction. */
static px_status grow(px_cost_calibration *cal, px_err *err)
{
    if (cal->n >= PX_COST_CALIB_MAX)
        return px_err_set(err, PX_ELIMIT, "calibration: more than %d corrections",
                          PX_COST_CALIB_MAX);
    if (cal->n < cal->cap)
        return PX_OK;
    size_t cap = cal->cap ? cal->cap * 2 : 16;
    px_cost_correction *items = realloc(cal->items, cap * sizeof *items);
    if (!items)
        return px_err_set(err, PX_ENOMEM, "out of memory adding a correction");
    cal->items = items;
    cal->cap = cap;
    return PX_OK;
}

px_status px_cost_calibration_add(px_cost_calibration *cal, const px_cost_correction *c,
                                  px_err *err)
{
    px_status st = check_correction(c, "correction", err);
    if (st != PX_OK)
        return st;
    cal->digest_ok = false;
    /* An older correction of the key keeps the part of its range that c
     * leaves: its fit holds there still.  The first one c covers whole
     * gives c its place; the others c covers go. */
    bool placed = false;
    for (size_t i = 0; i < cal->n;) {
        px_cost_correction *e = &cal->items[i];
        if (!same_key(e, c)) {
            i++;
            continue;
        }
        bool below = e->valid_lo < c->valid_lo;
        bool above = e->valid_hi > c->valid_hi;
        if (below && above) {
            if ((st = grow(cal, err)) != PX_OK)
                return st;
            e = &cal->items[i];
            px_cost_correction upper = *e;
            upper.valid_lo = nextafter(c->valid_hi, INFINITY);
            e->valid_hi = nextafter(c->valid_lo, -INFINITY);
            cal->items[cal->n++] = upper;
            i++;
        } else if (below) {
            e->valid_hi = nextafter(c->valid_lo, -INFINITY);
            i++;
        } else if (above) {
            e->valid_lo = nextafter(c->valid_hi, INFINITY);
            i++;
        } else if (!placed) {
            *e = *c;
            placed = true;
            i++;
        } else {
            memmove(e, e + 1, (cal->n - i - 1) * sizeof *e);
            cal->n--;
        }
    }
    if (placed)
        return PX_OK;
    if ((st = grow(cal, err)) != PX_OK)
        return st;
    cal->items[cal->n++] = *c;
    return PX_OK;
}

px_cost_calib_verdict px_cost_calibration_lookup(const px_cost_calibration *cal, const char *device,
                                                 px_cost_op_class cls, px_dtype dtype, double size,
                                                 size_t *index)
{
    px_cost_calib_verdict v = PX_COST_CALIB_NONE;
    if (!cal || !device)
        return v;
    for (size_t i = 0; i < cal->n; i++) {
        const px_cost_correction *c = &cal->items[i];
        if (c->cls != cls || strcmp(c->device, device) != 0)
            continue;
        if (c->dtype != PX_DTYPE_COUNT_ && c->dtype != dtype) {
            if (v == PX_COST_CALIB_NONE)
                v = PX_COST_CALIB_DTYPE;
            continue;
        }
        if (!(size >= c->valid_lo && size <= c->valid_hi)) {
            v = PX_COST_CALIB_OUT_OF_RANGE;
            continue;
        }
        if (index)
            *index = i;
        return PX_COST_CALIB_APPLIED;
    }
    return v;
}

/* ---- the document ---- */

static json_t *correction_json(const px_cost_correction *c)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "device", json_string(c->device)) ||
        px_json_set(o, "class", json_string(px_cost_op_class_name(c->cls))) ||
        px_json_set(o, "dtype",
                    json_string(c->dtype == PX_DTYPE_COUNT_ ? "any" : px_dtype_name(c->dtype))) ||
        px_json_set(o, "valid", json_pack("{s:f, s:f}", "min", c->valid_lo, "max", c->valid_hi)) ||
        px_json_set(o, "factor", json_real(c->factor)) ||
        px_json_set(o, "offset_s", json_real(c->offset_s)) ||
        px_json_set(o, "interval", json_pack("{s:f, s:f}", "lo", c->lo, "hi", c->hi)) ||
        px_json_set(o, "confidence", json_real(c->confidence)) ||
        px_json_set(o, "samples", json_integer(c->n_samples)) ||
        px_json_set(o, "dataset", json_string(c->dataset)) ||
        px_json_set(o, "timestamp", json_string(c->timestamp))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *px_cost_calibration_to_json(const px_cost_calibration *cal)
{
    json_t *doc = json_object();
    json_t *arr = json_array();
    if (!doc || !arr)
        goto fail;
    for (size_t i = 0; cal && i < cal->n; i++)
        if (px_json_push(arr, correction_json(&cal->items[i])))
            goto fail_arr;
    if (px_json_set(doc, "schema", json_string(PX_COST_CALIBRATION_SCHEMA)) ||
        px_json_set(doc, "corrections", arr))
        goto fail_doc;
    return doc;
fail_arr:
    json_decref(arr);
fail:
    json_decref(doc);
    return NULL;
fail_doc:
    json_decref(doc);
    return NULL;
}

char *px_cost_calibration_dump(const px_cost_calibration *cal)
{
    json_t *doc = px_cost_calibration_to_json(cal);
    if (!doc)
        return NULL;
    char *text = px_json_dump_canonical(doc);
    json_decref(doc);
    return text;
}

const char *px_cost_calibration_digest(const px_cost_calibration *cal)
{
    px_cost_calibration *c = (px_cost_calibration *)cal; /* digest is a cache */
    if (!c)
        return "";
    if (!c->digest_ok) {
        json_t *doc = px_cost_calibration_to_json(c);
        if (!doc)
            return "";
        c->digest_ok = px_json_digest_hex(doc, c->digest) == PX_OK;
        json_decref(doc);
        if (!c->digest_ok)
            return "";
    }
    return c->digest;
}

/* ---- the reader ---- */

static px_status bad(px_err *err, const char *name, const char *ptr, const char *what)
{
    return px_err_set(err, PX_EVALIDATE, "%s: %s: %s", name, ptr, what);
}

static px_status check_members(const json_t *o, const char *const *allowed, size_t n,
                               const char *name, const char *ptr, px_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        bool ok = false;
        for (size_t i = 0; i < n; i++)
            ok |= !strcmp(key, allowed[i]);
        if (!ok)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: %s/%.64s: unknown member; remove it (see "
                              "docs/formats/calibration.md)",
                              name, ptr, key);
    }
    return PX_OK;
}

static px_status get_num(const json_t *o, const char *key, const char *name, const char *ptr,
                         double *out, px_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || !json_is_number(v))
        return px_err_set(err, PX_EVALIDATE, "%s: %s/%s: %s; give a number", name, ptr, key,
                          v ? "not a number" : "missing");
    *out = json_number_value(v);
    if (!isfinite(*out))
        return px_err_set(err, PX_EVALIDATE, "%s: %s/%s: not finite", name, ptr, key);
    return PX_OK;
}

static px_status get_str(const json_t *o, const char *key, const char *name, const char *ptr,
                         char *out, size_t cap, px_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || !json_is_string(v))
        return px_err_set(err, PX_EVALIDATE, "%s: %s/%s: %s; give a string", name, ptr, key,
                          v ? "not a string" : "missing");
    if (json_string_length(v) >= cap || strlen(json_string_value(v)) != json_string_length(v))
        return px_err_set(err, PX_EVALIDATE,
                          "%s: %s/%s: longer than %zu bytes or holding a NUL byte", name, ptr, key,
                          cap - 1);
    px_strlcpy(out, json_string_value(v), cap);
    return PX_OK;
}

static px_status read_range(const json_t *o, const char *key, const char *k_lo, const char *k_hi,
                            const char *name, const char *ptr, double *lo, double *hi, px_err *err)
{
    char sub[96];
    snprintf(sub, sizeof sub, "%s/%s", ptr, key);
    json_t *v = json_object_get(o, key);
    if (!v || !json_is_object(v))
        return px_err_set(err, PX_EVALIDATE, "%s: %s: %s; give {\"%s\": ..., \"%s\": ...}", name,
                          sub, v ? "not an object" : "missing", k_lo, k_hi);
    const char *const allowed[] = {k_lo, k_hi};
    px_status st = check_members(v, allowed, 2, name, sub, err);
    if (!st)
        st = get_num(v, k_lo, name, sub, lo, err);
    if (!st)
        st = get_num(v, k_hi, name, sub, hi, err);
    return st;
}

static px_status read_correction(const json_t *o, const char *name, const char *ptr,
                                 px_cost_correction *c, px_err *err)
{
    static const char *const allowed[] = {"device",  "class",    "dtype",    "valid",
                                          "factor",  "offset_s", "interval", "confidence",
                                          "samples", "dataset",  "timestamp"};
    if (!json_is_object(o))
        return bad(err, name, ptr, "a correction is an object");
    px_status st = check_members(o, allowed, PX_ARRAY_LEN(allowed), name, ptr, err);
    if (st)
        return st;
    memset(c, 0, sizeof *c);
    char cls[32], dtype[32];
    if ((st = get_str(o, "device", name, ptr, c->device, sizeof c->device, err)) ||
        (st = get_str(o, "class", name, ptr, cls, sizeof cls, err)) ||
        (st = get_str(o, "dtype", name, ptr, dtype, sizeof dtype, err)) ||
        (st = get_num(o, "factor", name, ptr, &c->factor, err)) ||
        (st = get_num(o, "confidence", name, ptr, &c->confidence, err)) ||
        (st = read_range(o, "valid", "min", "max", name, ptr, &c->valid_lo, &c->valid_hi, err)) ||
        (st = read_range(o, "interval", "lo", "hi", name, ptr, &c->lo, &c->hi, err)) ||
        (st = get_str(o, "dataset", name, ptr, c->dataset, sizeof c->dataset, err)) ||
        (st = get_str(o, "timestamp", name, ptr, c->timestamp, sizeof c->timestamp, err)))
        return st;
    /* offset_s is optional: a purely multiplicative correction. */
    if (json_object_get(o, "offset_s") &&
        (st = get_num(o, "offset_s", name, ptr, &c->offset_s, err)))
        return st;
    px_err sub;
    if (px_cost_op_class_parse(cls, &c->cls, &sub) != PX_OK)
        return px_err_set(err, PX_EVALIDATE, "%s: %s/class: %s", name, ptr, sub.msg);
    if (!strcmp(dtype, "any"))
        c->dtype = PX_DTYPE_COUNT_;
    else if (px_dtype_parse(dtype, &c->dtype, &sub) != PX_OK)
        return px_err_set(err, PX_EVALIDATE, "%s: %s/dtype: %s (or \"any\")", name, ptr, sub.msg);
    json_t *n = json_object_get(o, "samples");
    if (!n || !json_is_integer(n) || json_integer_value(n) < 1 ||
        json_integer_value(n) > 1000000000)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: %s/samples: give the number of samples, a whole number >= 1", name,
                          ptr);
    c->n_samples = (uint32_t)json_integer_value(n);
    int64_t t;
    if (px_time_parse(c->timestamp, &t, &sub) != PX_OK)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: %s/timestamp: \"%s\" is not RFC 3339 UTC "
                          "(\"2026-11-29T16:25:10Z\")",
                          name, ptr, c->timestamp);
    if (check_correction(c, ptr, &sub) != PX_OK)
        return px_err_set(err, PX_EVALIDATE, "%s: %s", name, sub.msg);
    return PX_OK;
}

px_status px_cost_calibration_parse(const char *text, size_t len, const char *name,
                                    px_cost_calibration **out, px_err *err)
{
    *out = NULL;
    if (!name)
        name = "calibration";
    px_json_limits lim = {.max_bytes = CALIB_MAX_FILE,
                          .max_depth = 8,
                          .max_string = 4096,
                          .max_elements = PX_COST_CALIB_MAX};
    json_t *doc = NULL;
    px_status st = px_json_parse(text, len, name, &lim, &doc, err);
    if (st != PX_OK)
        return st;
    px_cost_calibration *cal = NULL;
    static const char *const top[] = {"schema", "corrections", "description"};
    if (!json_is_object(doc)) {
        st = bad(err, name, "(root)", "a calibration overlay is a JSON object");
        goto fail;
    }
    if ((st = check_members(doc, top, PX_ARRAY_LEN(top), name, "", err)))
        goto fail;
    json_t *schema = json_object_get(doc, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), PX_COST_CALIBRATION_SCHEMA)) {
        st = bad(err, name, "/schema", "give \"" PX_COST_CALIBRATION_SCHEMA "\"");
        goto fail;
    }
    json_t *desc = json_object_get(doc, "description");
    if (desc && !json_is_string(desc)) {
        st = bad(err, name, "/description", "give a string");
        goto fail;
    }
    json_t *arr = json_object_get(doc, "corrections");
    if (!json_is_array(arr)) {
        st = bad(err, name, "/corrections", "give an array of corrections");
        goto fail;
    }
    if ((st = px_cost_calibration_new(&cal, err)))
        goto fail;
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o)
    {
        char ptr[48];
        snprintf(ptr, sizeof ptr, "/corrections/%zu", i);
        px_cost_correction c;
        if ((st = read_correction(o, name, ptr, &c, err)))
            goto fail;
        for (size_t j = 0; j < cal->n; j++) {
            if (same_key(&cal->items[j], &c)) {
                st = px_err_set(err, PX_EVALIDATE,
                                "%s: %s: overlaps /corrections/%zu (device \"%s\", class %s, "
                                "dtype %s, validity ranges overlap); keep one or make the "
                                "ranges disjoint",
                                name, ptr, j, c.device, px_cost_op_class_name(c.cls),
                                c.dtype == PX_DTYPE_COUNT_ ? "any" : px_dtype_name(c.dtype));
                goto fail;
            }
        }
        if ((st = px_cost_calibration_add(cal, &c, err)))
            goto fail;
    }
    json_decref(doc);
    *out = cal;
    return PX_OK;
fail:
    px_cost_calibration_free(cal);
    json_decref(doc);
    return st;
}

px_status px_cost_calibration_load(const char *path, px_cost_calibration **out, px_err *err)
{
    char *text;
    size_t len;
    *out = NULL;
    px_status st = px_read_file(path, CALIB_MAX_FILE, &text, &len, err);
    if (st != PX_OK)
        return st;
    st = px_cost_calibration_parse(text, len, path, out, err);
    free(text);
    return st;
}
