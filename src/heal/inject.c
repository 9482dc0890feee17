/* The --inject grammar: parsing untrusted command-line text into a fault,
 * resolving its target against the pipeline that runs, and writing it
 * back (canonical text and JSON).  docs/formats/inject.md. */
#include "base/common.h"

#include "heal/heal_impl.h"

#define SPEC_MAX   255
#define ID_MAX     95
#define TOKEN_MAX  1000000000000000ULL /* 10^15 */
#define FORMS      "KIND:TARGET[:PARAM=VALUE,...]@tokenN"
#define KINDS      "kill, stop, crash, link, slow, corrupt, memory or clear"
#define MAX_TIME_S 3600.0

static const struct {
    const char *name;
    px_rt_fault_kind kind;
    const char *keys; /* accepted parameters, for messages */
} kinds[] = {
    {"kill", PX_RT_FAULT_KILL, "none"},
    {"stop", PX_RT_FAULT_STOP, "none"},
    {"crash", PX_RT_FAULT_CRASH, "none"},
    {"link", PX_RT_FAULT_LINK, "latency, bandwidth, loss, flip, period, duty, resend, seed, cut"},
    {"slow", PX_RT_FAULT_SLOW, "factor (required), tau"},
    {"corrupt", PX_RT_FAULT_CORRUPT, "magnitude (required), layer, seed"},
    {"memory", PX_RT_FAULT_MEMORY, "bytes (required)"},
    {"clear", PX_RT_FAULT_CLEAR, "none"},
};

/* Every message starts with the spec (cut to keep room for the rest). */
static px_status fail(const char *spec, px_err *err, const char *fmt, ...) PX_PRINTF(3, 4);
static px_status fail(const char *spec, px_err *err, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t n = strlen(spec);
    return px_err_set(err, PX_EINVAL, "--inject \"%.*s%s\": %s", n > 40 ? 40 : (int)n, spec,
                      n > 40 ? "..." : "", what);
}

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* Copies [s, s+n) into out when it is a well-formed id. */
static px_status take_id(const char *spec, const char *what, const char *s, size_t n, char *out,
                         px_err *err)
{
    if (n == 0)
        return fail(spec, err,
                    "empty %s; name a stage (\"stage1\") or a device id (\"local.emu-a\")", what);
    if (n > ID_MAX)
        return fail(spec, err, "%s is %zu bytes long; at most %d", what, n, ID_MAX);
    for (size_t i = 0; i < n; i++)
        if (!id_char(s[i]))
            return fail(spec, err,
                        "%s \"%.*s\": character %zu is not a letter, digit, '.', '_' or '-'; "
                        "name a stage (\"stage1\") or a device id",
                        what, (int)n, s, i + 1);
    memcpy(out, s, n);
    out[n] = 0;
    return PX_OK;
}

static bool all_digits(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* A quantity with a unit, within [lo, hi]. */
static px_status take_qty(const char *spec, const char *key, const char *val, px_dim dim,
                          const char *example, double lo, double hi, bool lo_open, double *out,
                          px_err *err)
{
    px_qty q;
    px_err e;
    if (px_qty_parse(val, dim, &q, &e) != PX_OK)
        return fail(spec, err, "%s=%.32s: %.80s; write e.g. %s=%s", key, val, e.msg, key, example);
    if (!isfinite(q.value) || q.value < lo || (lo_open && q.value <= lo) || q.value > hi)
        return fail(spec, err, "%s=%.32s is out of range; use %s%g to %g %s", key, val,
                    lo_open ? "above " : "", lo, hi, px_dim_unit(dim));
    *out = q.value + 0.0; /* "-0" is 0: the canonical text has no sign */
    return PX_OK;
}

/* A plain decimal number within [lo, hi] (lo excluded when lo_open). */
static px_status take_number(const char *spec, const char *key, const char *val, double lo,
                             double hi, bool lo_open, double *out, px_err *err)
{
    px_qty q;
    px_err e;
    if (px_qty_parse(val, PX_DIM_NONE, &q, &e) != PX_OK || !isfinite(q.value))
        return fail(spec, err, "%s=%.32s is not a plain number; write e.g. %s=0.05", key, val, key);
    if (q.value < lo || (lo_open && q.value <= lo) || q.value > hi)
        return fail(spec, err, "%s=%.32s is out of range; use %s%g to %g", key, val,
                    lo_open ? "above " : "", lo, hi);
    *out = q.value + 0.0; /* "-0" is 0: the canonical text has no sign */
    return PX_OK;
}

static px_status take_u64(const char *spec, const char *key, const char *val, uint64_t *out,
                          px_err *err)
{
    size_t n = strlen(val);
    if (!all_digits(val, n) || n > 20)
        return fail(spec, err, "%s=%.32s is not a whole number; write e.g. %s=7", key, val, key);
    errno = 0;
    unsigned long long v = strtoull(val, NULL, 10);
    /* Seeds stay within JSON's signed integers. */
    if (errno == ERANGE || v > (unsigned long long)INT64_MAX)
        return fail(spec, err, "%s=%.32s is above %" PRId64, key, val, INT64_MAX);
    *out = v;
    return PX_OK;
}

static px_status take_bytes(const char *spec, const char *val, uint64_t *out, px_err *err)
{
    const double max = 16.0 * 1024 * 1024 * 1024 * 1024;
    size_t n = strlen(val);
    double v;
    if (all_digits(val, n)) {
        if (n > 14)
            return fail(spec, err, "bytes=%.32s is out of range; use 1 B to 16 TiB", val);
        v = (double)strtoull(val, NULL, 10);
        if (v < 1 || v > max)
            return fail(spec, err, "bytes=%.32s is out of range; use 1 B to 16 TiB", val);
    } else {
        px_status st = take_qty(spec, "bytes", val, PX_DIM_BYTES, "64MiB", 1, max, false, &v, err);
        if (st != PX_OK)
            return st;
    }
    *out = (uint64_t)llround(v);
    return PX_OK;
}

/* One PARAM=VALUE (or a bare flag) of a kind. */
static px_status take_param(const char *spec, px_heal_inject *in, const char *key, const char *val,
                            unsigned *seen, px_err *err)
{
    static const char *const keys[] = {"latency", "bandwidth", "loss",  "flip", "period",
                                       "duty",    "resend",    "seed",  "cut",  "factor",
                                       "tau",     "magnitude", "layer", "bytes"};
    size_t k = 0;
    while (k < PX_ARRAY_LEN(keys) && strcmp(keys[k], key))
        k++;
    px_rt_fault *f = &in->fault;
    const char *accepted = "none";
    for (size_t i = 0; i < PX_ARRAY_LEN(kinds); i++)
        if (kinds[i].kind == f->kind)
            accepted = kinds[i].keys;
    bool ok = k < PX_ARRAY_LEN(keys);
    if (ok) {
        switch (f->kind) {
        case PX_RT_FAULT_LINK:
            ok = k <= 8;
            break;
        case PX_RT_FAULT_SLOW:
            ok = k == 9 || k == 10;
            break;
        case PX_RT_FAULT_CORRUPT:
            ok = k == 11 || k == 12 || k == 7;
            break;
        case PX_RT_FAULT_MEMORY:
            ok = k == 13;
            break;
        default:
            ok = false;
        }
    }
    if (!ok)
        return fail(spec, err, "parameter \"%.24s\" is not one of this kind's: %s", key, accepted);
    if (*seen & (1u << k))
        return fail(spec, err, "parameter \"%s\" is given twice", key);
    *seen |= 1u << k;
    if (k == 8 && val)
        return fail(spec, err, "cut takes no value; write \",cut\"");
    if (k != 8 && !val)
        return fail(spec, err, "parameter \"%s\" needs a value: %s=VALUE", key, key);
    double x;
    px_status st = PX_OK;
    switch (k) {
    case 0:
        st = take_qty(spec, key, val, PX_DIM_TIME, "5ms", 0, 60, false, &x, err);
        f->link.latency_ns = (uint64_t)llround(x * 1e9);
        break;
    case 1:
        st = take_qty(spec, key, val, PX_DIM_BANDWIDTH, "1MB/s", 0, 1e15, true,
                      &f->link.bandwidth_bps, err);
        break;
    case 2:
        st = take_number(spec, key, val, 0, 0.999, false, &f->link.loss, err);
        break;
    case 3:
        st = take_number(spec, key, val, 0, 1, false, &f->link.flip, err);
        break;
    case 4:
        st = take_qty(spec, key, val, PX_DIM_TIME, "200ms", 0, MAX_TIME_S, true, &f->link.period_s,
                      err);
        break;
    case 5:
        st = take_number(spec, key, val, 0, 1, true, &f->link.duty, err);
        break;
    case 6:
        st = take_qty(spec, key, val, PX_DIM_TIME, "200ms", 0, 60, false, &x, err);
        f->link.resend_ns = (uint64_t)llround(x * 1e9);
        break;
    case 7:
        st = take_u64(spec, key, val, f->kind == PX_RT_FAULT_LINK ? &f->link.seed : &f->seed, err);
        break;
    case 8:
        f->link.cut = true;
        break;
    case 9:
        st = take_number(spec, key, val, 1, 1000, false, &f->factor, err);
        break;
    case 10:
        st = take_qty(spec, key, val, PX_DIM_TIME, "500ms", 0, MAX_TIME_S, false, &f->tau_s, err);
        break;
    case 11:
        st = take_number(spec, key, val, 0, 1e6, true, &f->magnitude, err);
        break;
    case 12:
        st = take_number(spec, key, val, -1, 1000000, false, &x, err);
        if (st == PX_OK && x != floor(x))
            st = fail(spec, err, "layer=%.32s is not a whole number; use -1 (every op) or a layer",
                      val);
        f->layer = (int32_t)x;
        break;
    case 13:
        st = take_bytes(spec, val, &f->bytes, err);
        break;
    }
    return st;
}

static px_status take_params(const char *spec, px_heal_inject *in, const char *s, size_t n,
                             px_err *err)
{
    unsigned seen = 0;
    char item[SPEC_MAX + 1];
    const char *end = s + n;
    while (s <= end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *stop = comma ? comma : end;
        size_t len = (size_t)(stop - s);
        if (len == 0)
            return fail(spec, err, "an empty parameter; write PARAM=VALUE,PARAM=VALUE");
        memcpy(item, s, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        if (eq)
            *eq = 0;
        px_status st = take_param(spec, in, item, eq ? eq + 1 : NULL, &seen, err);
        if (st != PX_OK)
            return st;
        s = stop + 1;
    }
    px_rt_fault *f = &in->fault;
    switch (f->kind) {
    case PX_RT_FAULT_LINK:
        if ((seen & (1u << 5)) && !(seen & (1u << 4)))
            return fail(spec, err, "duty needs period: write period=200ms,duty=0.5");
        if ((seen & (1u << 4)) && !(seen & (1u << 5)))
            f->link.duty = 0.5;
        break;
    case PX_RT_FAULT_SLOW:
        if (!(seen & (1u << 9)))
            return fail(spec, err,
                        "slow needs factor: write slow:stage1:factor=4,tau=500ms@token5");
        break;
    case PX_RT_FAULT_CORRUPT:
        if (!(seen & (1u << 11)))
            return fail(spec, err,
                        "corrupt needs magnitude: write corrupt:stage1:magnitude=0.5@token12");
        break;
    default:
        break;
    }
    return PX_OK;
}

px_status px_heal_inject_parse(const char *spec, px_heal_inject *out, px_err *err)
{
    if (!spec || !out)
        return px_err_set(err, PX_EINVAL, "--inject: no spec given; write " FORMS);
    memset(out, 0, sizeof *out);
    size_t len = strnlen(spec, SPEC_MAX + 1);
    if (len > SPEC_MAX)
        return fail(spec, err, "longer than %d bytes; write " FORMS, SPEC_MAX);
    if (len == 0)
        return px_err_set(err, PX_EINVAL,
                          "--inject \"\": empty; write " FORMS ", e.g. "
                          "kill:stage1@token20");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)spec[i] <= ' ' || (unsigned char)spec[i] >= 127)
            return fail(spec, err, "byte %zu is a space or not printable ASCII; write " FORMS,
                        i + 1);
    memcpy(out->text, spec, len);
    out->fault.layer = -1;

    const char *at = strrchr(spec, '@');
    if (!at)
        return fail(spec, err, "no @tokenN; write " FORMS ", e.g. kill:stage1@token20");
    const char *when = at + 1;
    size_t wlen = strlen(when);
    if (!px_str_starts_with(when, "token") || !all_digits(when + 5, wlen - 5) || wlen - 5 > 16)
        return fail(spec, err, "\"@%.24s\": WHEN is tokenN with N a whole number, e.g. @token20",
                    when);
    unsigned long long tok = strtoull(when + 5, NULL, 10);
    if (tok > TOKEN_MAX)
        return fail(spec, err, "@%.24s: N is at most 10^15", when);
    out->at_token = tok;

    size_t head = (size_t)(at - spec);
    const char *c1 = memchr(spec, ':', head);
    if (!c1)
        return fail(spec, err, "no TARGET; write " FORMS ", e.g. kill:stage1@token20");
    size_t klen = (size_t)(c1 - spec);
    size_t k = 0;
    while (k < PX_ARRAY_LEN(kinds) &&
           !(strlen(kinds[k].name) == klen && !memcmp(kinds[k].name, spec, klen)))
        k++;
    if (k == PX_ARRAY_LEN(kinds))
        return fail(spec, err, "kind \"%.*s\" is unknown; use " KINDS, klen > 24 ? 24 : (int)klen,
                    spec);
    out->fault.kind = kinds[k].kind;

    const char *t = c1 + 1;
    const char *tend = spec + head;
    const char *c2 = memchr(t, ':', (size_t)(tend - t));
    const char *target_end = c2 ? c2 : tend;
    const char *gt = memchr(t, '>', (size_t)(target_end - t));
    px_status st;
    if (out->fault.kind == PX_RT_FAULT_LINK) {
        if (!gt)
            return fail(spec, err,
                        "a link is A>B, the sender and its next hop, e.g. "
                        "link:stage0>stage1:latency=5ms@token10");
        if ((st = take_id(spec, "link sender", t, (size_t)(gt - t), out->target, err)) != PX_OK ||
            (st = take_id(spec, "link receiver", gt + 1, (size_t)(target_end - gt - 1),
                          out->link_to, err)) != PX_OK)
            return st;
    } else {
        if (gt)
            return fail(spec, err, "only link faults name A>B; %s names one stage, e.g. %s:stage1",
                        kinds[k].name, kinds[k].name);
        if ((st = take_id(spec, "target", t, (size_t)(target_end - t), out->target, err)) != PX_OK)
            return st;
    }
    if (c2) {
        if (!strcmp(kinds[k].keys, "none"))
            return fail(spec, err, "%s takes no parameters; write %s:TARGET@tokenN", kinds[k].name,
                        kinds[k].name);
        st = take_params(spec, out, c2 + 1, (size_t)(tend - c2 - 1), err);
        if (st != PX_OK)
            return st;
    } else if (strcmp(kinds[k].keys, "none")) {
        return fail(spec, err, "%s needs parameters: %s", kinds[k].name, kinds[k].keys);
    }
    if (out->fault.kind == PX_RT_FAULT_LINK) {
        const px_rt_link_faults *l = &out->fault.link;
        if (!l->latency_ns && !l->bandwidth_bps && !l->loss && !l->flip && !l->cut)
            return fail(spec, err,
                        "link needs one of latency, bandwidth, loss, flip or cut, e.g. "
                        "latency=5ms");
    }
    return PX_OK;
}

/* The stage a name denotes: "stageN" or a stage's device id. */
static bool stage_of(const char *name, const px_rt_pipeline_spec *spec, uint32_t *out)
{
    size_t n = strlen(name);
    if (px_str_starts_with(name, "stage") && all_digits(name + 5, n - 5) && n - 5 <= 3) {
        unsigned long v = strtoul(name + 5, NULL, 10);
        if (v < spec->n_stages) {
            *out = (uint32_t)v;
            return true;
        }
    }
    for (uint32_t i = 0; i < spec->n_stages; i++)
        if (spec->stages[i].device[0] && !strcmp(spec->stages[i].device, name)) {
            *out = i;
            return true;
        }
    return false;
}

static void list_stages(const px_rt_pipeline_spec *spec, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < spec->n_stages && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%sstage%u (%s)", i ? ", " : "", i,
                         spec->stages[i].device[0] ? spec->stages[i].device : "no device");
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

px_status px_heal_inject_resolve(const px_heal_inject *in, const px_rt_pipeline_spec *spec,
                                 px_rt_fault *out, px_err *err)
{
    if (!in || !spec || !out)
        return px_err_set(err, PX_EINVAL, "px_heal_inject_resolve: missing argument");
    char stages[160];
    list_stages(spec, stages, sizeof stages);
    uint32_t a;
    if (!stage_of(in->target, spec, &a))
        return px_err_set(err, PX_ENOTFOUND,
                          "--inject \"%.60s\": \"%.40s\" is no stage of this pipeline; "
                          "its stages are %s",
                          in->text, in->target, stages);
    *out = in->fault;
    out->stage = a;
    if (in->fault.kind != PX_RT_FAULT_LINK)
        return PX_OK;
    char next[96];
    if (a + 1 < spec->n_stages)
        px__heal_textf(next, sizeof next, "stage%u (%s)", a + 1,
                       spec->stages[a + 1].device[0] ? spec->stages[a + 1].device : "no device");
    else
        px__heal_textf(next, sizeof next, "executor");
    bool ok;
    if (!strcmp(in->link_to, "executor")) {
        ok = a + 1 == spec->n_stages;
    } else {
        uint32_t b;
        if (!stage_of(in->link_to, spec, &b))
            return px_err_set(err, PX_ENOTFOUND,
                              "--inject \"%.60s\": \"%.40s\" is no stage of this pipeline; "
                              "its stages are %s",
                              in->text, in->link_to, stages);
        ok = b == a + 1;
    }
    if (!ok)
        return px_err_set(err, PX_EINVAL,
                          "--inject \"%.60s\": %.40s>%.40s is not a hop of this pipeline; the "
                          "next hop of stage%u is %s (write %s>%s)",
                          in->text, in->target, in->link_to, a, next, in->target,
                          a + 1 < spec->n_stages ? next : "executor");
    return PX_OK;
}

/* Appends the shortest text that reads back as x. */
static void add_number(px_strbuf *sb, double x)
{
    char buf[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    px_strbuf_adds(sb, buf);
}

static void add_qty(px_strbuf *sb, double x, px_dim dim)
{
    char buf[64];
    px_qty_format(x, dim, buf, sizeof buf);
    for (const char *p = buf; *p; p++)
        if (*p != ' ')
            px_strbuf_addch(sb, *p);
}

static void add_key(px_strbuf *sb, const char *key, bool *first)
{
    px_strbuf_adds(sb, *first ? ":" : ",");
    px_strbuf_adds(sb, key);
    *first = false;
}

size_t px_heal_inject_format(const px_heal_inject *in, char *buf, size_t cap)
{
    px_strbuf sb = PX_STRBUF_INIT;
    const px_rt_fault *f = &in->fault;
    px_strbuf_adds(&sb, px_rt_fault_kind_name(f->kind));
    px_strbuf_addch(&sb, ':');
    px_strbuf_adds(&sb, in->target);
    bool first = true;
    switch (f->kind) {
    case PX_RT_FAULT_LINK: {
        const px_rt_link_faults *l = &f->link;
        px_strbuf_addch(&sb, '>');
        px_strbuf_adds(&sb, in->link_to);
        if (l->latency_ns) {
            add_key(&sb, "latency=", &first);
            add_qty(&sb, (double)l->latency_ns / 1e9, PX_DIM_TIME);
        }
        if (l->bandwidth_bps > 0) {
            add_key(&sb, "bandwidth=", &first);
            add_qty(&sb, l->bandwidth_bps, PX_DIM_BANDWIDTH);
        }
        if (l->loss > 0) {
            add_key(&sb, "loss=", &first);
            add_number(&sb, l->loss);
        }
        if (l->flip > 0) {
            add_key(&sb, "flip=", &first);
            add_number(&sb, l->flip);
        }
        if (l->period_s > 0) {
            add_key(&sb, "period=", &first);
            add_qty(&sb, l->period_s, PX_DIM_TIME);
            add_key(&sb, "duty=", &first);
            add_number(&sb, l->duty);
        }
        if (l->resend_ns) {
            add_key(&sb, "resend=", &first);
            add_qty(&sb, (double)l->resend_ns / 1e9, PX_DIM_TIME);
        }
        if (l->seed) {
            add_key(&sb, "seed=", &first);
            px_strbuf_addf(&sb, "%" PRIu64, l->seed);
        }
        if (l->cut)
            add_key(&sb, "cut", &first);
        break;
    }
    case PX_RT_FAULT_SLOW:
        add_key(&sb, "factor=", &first);
        add_number(&sb, f->factor);
        if (f->tau_s > 0) {
            add_key(&sb, "tau=", &first);
            add_qty(&sb, f->tau_s, PX_DIM_TIME);
        }
        break;
    case PX_RT_FAULT_CORRUPT:
        add_key(&sb, "magnitude=", &first);
        add_number(&sb, f->magnitude);
        if (f->layer != -1) {
            add_key(&sb, "layer=", &first);
            px_strbuf_addf(&sb, "%" PRId32, f->layer);
        }
        if (f->seed) {
            add_key(&sb, "seed=", &first);
            px_strbuf_addf(&sb, "%" PRIu64, f->seed);
        }
        break;
    case PX_RT_FAULT_MEMORY:
        add_key(&sb, "bytes=", &first);
        px_strbuf_addf(&sb, "%" PRIu64, f->bytes);
        break;
    default:
        break;
    }
    px_strbuf_addf(&sb, "@token%" PRIu64, in->at_token);
    size_t n = sb.len;
    if (cap)
        px_strlcpy(buf, sb.buf, cap);
    px_strbuf_release(&sb);
    return n;
}

json_t *px_heal_inject_to_json(const px_heal_inject *in)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    char spec[SPEC_MAX + 64];
    px_heal_inject_format(in, spec, sizeof spec);
    const px_rt_fault *f = &in->fault;
    const px_rt_link_faults *l = &f->link;
    bool link = f->kind == PX_RT_FAULT_LINK;
    px_status st = PX_OK;
    if (px_json_set(o, "text", json_string(in->text)) ||
        px_json_set(o, "spec", json_string(spec)) ||
        px_json_set(o, "kind", json_string(px_rt_fault_kind_name(f->kind))) ||
        px_json_set(o, "target", json_string(in->target)) ||
        (link && px_json_set(o, "link_to", json_string(in->link_to))) ||
        px_json_set(o, "at_token", json_integer((json_int_t)in->at_token)))
        st = PX_ENOMEM;
    if (st == PX_OK && link) {
        if (px__heal_set_num(o, "latency_s", (double)l->latency_ns / 1e9) ||
            px__heal_set_num(o, "bandwidth_bps", l->bandwidth_bps) ||
            px__heal_set_num(o, "loss", l->loss) || px__heal_set_num(o, "flip", l->flip) ||
            px__heal_set_num(o, "period_s", l->period_s) || px__heal_set_num(o, "duty", l->duty) ||
            px__heal_set_num(o, "resend_s", (double)l->resend_ns / 1e9) ||
            px_json_set(o, "seed", json_integer((json_int_t)l->seed)) ||
            px_json_set(o, "cut", json_boolean(l->cut)))
            st = PX_ENOMEM;
    } else if (st == PX_OK && f->kind == PX_RT_FAULT_SLOW) {
        if (px__heal_set_num(o, "factor", f->factor) || px__heal_set_num(o, "tau_s", f->tau_s))
            st = PX_ENOMEM;
    } else if (st == PX_OK && f->kind == PX_RT_FAULT_CORRUPT) {
        if (px__heal_set_num(o, "magnitude", f->magnitude) ||
            px_json_set(o, "layer", json_integer(f->layer)) ||
            px_json_set(o, "seed", json_integer((json_int_t)f->seed)))
            st = PX_ENOMEM;
    } else if (st == PX_OK && f->kind == PX_RT_FAULT_MEMORY) {
        if (px_json_set(o, "bytes", json_integer((json_int_t)f->bytes)))
            st = PX_ENOMEM;
    }
    if (st != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}
