/* Quantities: values with a dimension, parsed from text and printed back,
 * with provenance, uncertainty and a validity range. */
#include "base/common.h"

typedef struct unit {
    const char *text;
    px_dim dim;
    double factor; /* SI value = number * factor / divisor + offset */
    double offset;
    double divisor; /* 0 means 1; dividing keeps 700 ns exactly 7e-7 s */
    bool display;   /* used when printing */
} unit;

#define K1 1e3
#define KI 1024.0

static const unit units[] = {
    /* bytes */
    {"B", PX_DIM_BYTES, 1, 0, 0, true},
    {"kB", PX_DIM_BYTES, 1e3, 0, 0, true},
    {"MB", PX_DIM_BYTES, 1e6, 0, 0, true},
    {"GB", PX_DIM_BYTES, 1e9, 0, 0, true},
    {"TB", PX_DIM_BYTES, 1e12, 0, 0, true},
    {"PB", PX_DIM_BYTES, 1e15, 0, 0, true},
    {"KiB", PX_DIM_BYTES, KI, 0, 0, false},
    {"MiB", PX_DIM_BYTES, KI *KI, 0, 0, false},
    {"GiB", PX_DIM_BYTES, KI *KI *KI, 0, 0, false},
    {"TiB", PX_DIM_BYTES, KI *KI *KI *KI, 0, 0, false},
    {"PiB", PX_DIM_BYTES, KI *KI *KI *KI *KI, 0, 0, false},
    /* bandwidth */
    {"B/s", PX_DIM_BANDWIDTH, 1, 0, 0, true},
    {"kB/s", PX_DIM_BANDWIDTH, 1e3, 0, 0, true},
    {"MB/s", PX_DIM_BANDWIDTH, 1e6, 0, 0, true},
    {"GB/s", PX_DIM_BANDWIDTH, 1e9, 0, 0, true},
    {"TB/s", PX_DIM_BANDWIDTH, 1e12, 0, 0, true},
    {"PB/s", PX_DIM_BANDWIDTH, 1e15, 0, 0, true},
    {"KiB/s", PX_DIM_BANDWIDTH, KI, 0, 0, false},
    {"MiB/s", PX_DIM_BANDWIDTH, KI *KI, 0, 0, false},
    {"GiB/s", PX_DIM_BANDWIDTH, KI *KI *KI, 0, 0, false},
    {"TiB/s", PX_DIM_BANDWIDTH, KI *KI *KI *KI, 0, 0, false},
    {"bit/s", PX_DIM_BANDWIDTH, 1, 0, 8, false},
    {"kbit/s", PX_DIM_BANDWIDTH, 125, 0, 0, false},
    {"Mbit/s", PX_DIM_BANDWIDTH, 125e3, 0, 0, false},
    {"Gbit/s", PX_DIM_BANDWIDTH, 125e6, 0, 0, false},
    {"Tbit/s", PX_DIM_BANDWIDTH, 125e9, 0, 0, false},
    /* compute */
    {"FLOP/s", PX_DIM_FLOPS, 1, 0, 0, true},
    {"kFLOP/s", PX_DIM_FLOPS, 1e3, 0, 0, true},
    {"MFLOP/s", PX_DIM_FLOPS, 1e6, 0, 0, true},
    {"GFLOP/s", PX_DIM_FLOPS, 1e9, 0, 0, true},
    {"TFLOP/s", PX_DIM_FLOPS, 1e12, 0, 0, true},
    {"PFLOP/s", PX_DIM_FLOPS, 1e15, 0, 0, true},
    {"EFLOP/s", PX_DIM_FLOPS, 1e18, 0, 0, true},
    {"OP/s", PX_DIM_FLOPS, 1, 0, 0, false},
    {"GOP/s", PX_DIM_FLOPS, 1e9, 0, 0, false},
    {"TOP/s", PX_DIM_FLOPS, 1e12, 0, 0, false},
    {"POP/s", PX_DIM_FLOPS, 1e15, 0, 0, false},
    /* time */
    {"ns", PX_DIM_TIME, 1, 0, 1e9, true},
    {"us", PX_DIM_TIME, 1, 0, 1e6, true},
    {"\xc2\xb5s", PX_DIM_TIME, 1, 0, 1e6, false},
    {"ms", PX_DIM_TIME, 1, 0, 1e3, true},
    {"s", PX_DIM_TIME, 1, 0, 0, true},
    {"min", PX_DIM_TIME, 60, 0, 0, false},
    {"h", PX_DIM_TIME, 3600, 0, 0, false},
    /* power */
    {"mW", PX_DIM_POWER, 1, 0, 1e3, true},
    {"W", PX_DIM_POWER, 1, 0, 0, true},
    {"kW", PX_DIM_POWER, 1e3, 0, 0, true},
    {"MW", PX_DIM_POWER, 1e6, 0, 0, true},
    /* energy */
    {"pJ", PX_DIM_ENERGY, 1, 0, 1e12, true},
    {"nJ", PX_DIM_ENERGY, 1, 0, 1e9, true},
    {"uJ", PX_DIM_ENERGY, 1, 0, 1e6, true},
    {"mJ", PX_DIM_ENERGY, 1, 0, 1e3, true},
    {"J", PX_DIM_ENERGY, 1, 0, 0, true},
    {"kJ", PX_DIM_ENERGY, 1e3, 0, 0, true},
    {"MJ", PX_DIM_ENERGY, 1e6, 0, 0, true},
    {"Wh", PX_DIM_ENERGY, 3600, 0, 0, false},
    {"kWh", PX_DIM_ENERGY, 3.6e6, 0, 0, false},
    {"MWh", PX_DIM_ENERGY, 3.6e9, 0, 0, false},
    /* temperature */
    {"K", PX_DIM_TEMPERATURE, 1, 0, 0, true},
    {"C", PX_DIM_TEMPERATURE, 1, 273.15, 0, false},
    {"\xc2\xb0"
     "C",
     PX_DIM_TEMPERATURE, 1, 273.15, 0, false},
    /* money */
    {"$/h", PX_DIM_MONEY_RATE, 1, 0, 0, true},
    /* frequency */
    {"Hz", PX_DIM_FREQUENCY, 1, 0, 0, true},
    {"kHz", PX_DIM_FREQUENCY, 1e3, 0, 0, true},
    {"MHz", PX_DIM_FREQUENCY, 1e6, 0, 0, true},
    {"GHz", PX_DIM_FREQUENCY, 1e9, 0, 0, true},
};

static double unit_value(const unit *u, double number)
{
    double v = number * u->factor;
    if (u->divisor != 0)
        v /= u->divisor;
    return v + u->offset;
}

static double unit_number(const unit *u, double value)
{
    double x = value - u->offset;
    if (u->divisor != 0)
        x *= u->divisor;
    return x / u->factor;
}

/* The value of a number written as text in unit u.  For decimal prefixes
 * the scaling is done in the text ("2.039" TB/s reads as "2.039e12"), so
 * the result is the correctly rounded double, the same one "2039 GB/s"
 * gives; multiplying 2.039 by 1e12 would round twice. */
static double unit_value_text(const unit *u, const char *text)
{
    double x = strtod(text, NULL);
    double scale = u->divisor != 0 ? u->factor / u->divisor : u->factor;
    if (u->offset != 0 || scale == 1 || strpbrk(text, "eE"))
        return unit_value(u, x);
    int k = (int)lround(log10(scale));
    if (pow(10, k) != scale)
        return unit_value(u, x);
    char buf[96];
    snprintf(buf, sizeof buf, "%se%d", text, k);
    return strtod(buf, NULL);
}

/* A unit's size in SI units, for choosing the unit to print with. */
static double unit_scale(const unit *u)
{
    return u->divisor != 0 ? u->factor / u->divisor : u->factor;
}

static const char *dim_names[PX_DIM_COUNT_] = {
    [PX_DIM_NONE] = "number",
    [PX_DIM_BYTES] = "bytes",
    [PX_DIM_BANDWIDTH] = "bandwidth",
    [PX_DIM_FLOPS] = "compute",
    [PX_DIM_TIME] = "time",
    [PX_DIM_POWER] = "power",
    [PX_DIM_ENERGY] = "energy",
    [PX_DIM_TEMPERATURE] = "temperature",
    [PX_DIM_MONEY_RATE] = "money rate",
    [PX_DIM_FREQUENCY] = "frequency",
};

static const char *dim_units[PX_DIM_COUNT_] = {
    [PX_DIM_NONE] = "",        [PX_DIM_BYTES] = "B",       [PX_DIM_BANDWIDTH] = "B/s",
    [PX_DIM_FLOPS] = "FLOP/s", [PX_DIM_TIME] = "s",        [PX_DIM_POWER] = "W",
    [PX_DIM_ENERGY] = "J",     [PX_DIM_TEMPERATURE] = "K", [PX_DIM_MONEY_RATE] = "$/h",
    [PX_DIM_FREQUENCY] = "Hz",
};

const char *px_dim_name(px_dim dim)
{
    return (unsigned)dim < PX_DIM_COUNT_ ? dim_names[dim] : "unknown";
}

const char *px_dim_unit(px_dim dim)
{
    return (unsigned)dim < PX_DIM_COUNT_ ? dim_units[dim] : "?";
}

static const char *prov_names[PX_PROV_COUNT_] = {
    [PX_PROV_UNSPECIFIED] = "unspecified", [PX_PROV_DATASHEET] = "datasheet",
    [PX_PROV_DISCOVERED] = "discovered",   [PX_PROV_MEASURED] = "measured",
    [PX_PROV_CALIBRATED] = "calibrated",   [PX_PROV_ASSUMED] = "assumed",
};

const char *px_prov_kind_name(px_prov_kind kind)
{
    return (unsigned)kind < PX_PROV_COUNT_ ? prov_names[kind] : "unspecified";
}

px_status px_prov_kind_parse(const char *text, px_prov_kind *out)
{
    for (int k = 1; k < PX_PROV_COUNT_; k++)
        if (!strcmp(text, prov_names[k])) {
            *out = (px_prov_kind)k;
            return PX_OK;
        }
    return PX_EPARSE;
}

px_qty px_qty_make(double value, px_dim dim)
{
    px_qty q;
    memset(&q, 0, sizeof q);
    q.value = value;
    q.dim = dim;
    q.valid.min = NAN;
    q.valid.max = NAN;
    return q;
}

static void list_units(px_dim dim, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < PX_ARRAY_LEN(units) && used + 1 < n; i++) {
        if (dim != PX_DIM_NONE && units[i].dim != dim)
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", units[i].text);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

px_status px_qty_parse(const char *text, px_dim expect, px_qty *out, px_err *err)
{
    if (!text)
        return px_err_set(err, PX_EINVAL, "no quantity given");
    size_t len = strlen(text);
    if (len == 0)
        return px_err_set(err, PX_EPARSE,
                          "empty quantity; write a number and a unit, "
                          "e.g. \"80 GiB\"");
    if (len > 64)
        return px_err_set(err, PX_ELIMIT,
                          "quantity \"%.32s...\" is longer than 64 "
                          "characters",
                          text);
    const char *p = text;
    while (*p == ' ')
        p++;
    /* The number: digits, one sign, a point, an exponent.  Anything strtod
     * would also take (nan, inf, hex) is refused on purpose. */
    const char *num = p;
    if (*p == '+' || *p == '-')
        p++;
    bool digits = false;
    while ((*p >= '0' && *p <= '9') || *p == '.') {
        digits |= *p != '.';
        p++;
    }
    if (digits && (*p == 'e' || *p == 'E') &&
        ((p[1] >= '0' && p[1] <= '9') ||
         ((p[1] == '+' || p[1] == '-') && p[2] >= '0' && p[2] <= '9'))) {
        p += 2;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (!digits)
        return px_err_set(err, PX_EPARSE,
                          "\"%s\" does not start with a number; write e.g. \"3.35 TB/s\"", text);
    char numbuf[72];
    size_t nlen = (size_t)(p - num);
    memcpy(numbuf, num, nlen);
    numbuf[nlen] = '\0';
    char *end;
    errno = 0;
    double x = strtod(numbuf, &end);
    if (*end != '\0')
        return px_err_set(err, PX_EPARSE, "\"%s\": \"%s\" is not a number", text, numbuf);
    if (!isfinite(x) || errno == ERANGE)
        return px_err_set(err, PX_ERANGE, "\"%s\": the number is out of range", text);
    while (*p == ' ')
        p++;
    const char *u = p;
    size_t ulen = strlen(u);
    while (ulen && u[ulen - 1] == ' ')
        ulen--;
    px_qty q = px_qty_make(0, PX_DIM_NONE);
    if (ulen == 0) {
        if (expect != PX_DIM_NONE) {
            char known[512];
            list_units(expect, known, sizeof known);
            return px_err_set(err, PX_EPARSE, "\"%s\" has no unit; a %s needs one of: %s", text,
                              px_dim_name(expect), known);
        }
        q.value = x;
        *out = q;
        return PX_OK;
    }
    for (size_t i = 0; i < PX_ARRAY_LEN(units); i++) {
        if (strlen(units[i].text) != ulen || memcmp(units[i].text, u, ulen) != 0)
            continue;
        if (expect != PX_DIM_NONE && units[i].dim != expect) {
            char known[512];
            list_units(expect, known, sizeof known);
            return px_err_set(err, PX_EPARSE, "\"%s\" is a %s but a %s is expected; use one of: %s",
                              text, px_dim_name(units[i].dim), px_dim_name(expect), known);
        }
        q.dim = units[i].dim;
        q.value = unit_value_text(&units[i], numbuf);
        if (!isfinite(q.value))
            return px_err_set(err, PX_ERANGE, "\"%s\": the value is out of range", text);
        *out = q;
        return PX_OK;
    }
    char known[512];
    list_units(expect, known, sizeof known);
    if (ulen == 2 && u[0] == 'K' && u[1] == 'B')
        return px_err_set(err, PX_EPARSE,
                          "\"%s\": \"KB\" is ambiguous; write kB (1000 bytes) or KiB (1024)", text);
    return px_err_set(err, PX_EPARSE, "\"%s\": unknown unit \"%.*s\"; known units: %s", text,
                      (int)(ulen > 16 ? 16 : ulen), u, known);
}

/* Shortest %g text of the number that reads back as exactly target. */
static bool shortest(const unit *u, double target, char *out, size_t n)
{
    double number = u ? unit_number(u, target) : target;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, number);
        if (prec < 17 && strchr(out, 'e'))
            continue;
        if ((u ? unit_value_text(u, out) : strtod(out, NULL)) == target)
            return true;
    }
    snprintf(out, n, "%.17g", number);
    return u == NULL;
}

void px_format_seconds(double s, char *buf, size_t n)
{
    if (isnan(s))
        snprintf(buf, n, "-");
    else if (isinf(s))
        snprintf(buf, n, "inf");
    else if (fabs(s) >= 1.0)
        snprintf(buf, n, "%.3g s", s);
    else if (fabs(s) >= 1e-3)
        snprintf(buf, n, "%.3g ms", s * 1e3);
    else
        snprintf(buf, n, "%.3g us", s * 1e6);
}

size_t px_qty_format(double value, px_dim dim, char *buf, size_t n)
{
    char num[40];
    if (dim == PX_DIM_NONE || !isfinite(value)) {
        shortest(NULL, value, num, sizeof num);
        int w = snprintf(buf, n, "%s", num);
        return w < 0 ? 0 : (size_t)w;
    }
    const unit *best = NULL;
    double mag = fabs(value);
    /* Binary prefixes for byte counts that are exact multiples of them. */
    if (dim == PX_DIM_BYTES && mag >= 1024 && fmod(mag, 1024.0) == 0) {
        for (size_t i = 0; i < PX_ARRAY_LEN(units); i++) {
            if (units[i].dim != PX_DIM_BYTES || units[i].factor < 1024 ||
                fmod(units[i].factor, 1024.0) != 0)
                continue;
            if (fmod(mag, units[i].factor) == 0 && (!best || units[i].factor > best->factor))
                best = &units[i];
        }
        if (best && mag / best->factor >= 1024 * 1024) /* too many digits */
            best = NULL;
    }
    if (!best) {
        for (size_t i = 0; i < PX_ARRAY_LEN(units); i++) {
            if (units[i].dim != dim || !units[i].display)
                continue;
            double sc = unit_scale(&units[i]);
            if (!best)
                best = &units[i];
            else if (mag >= sc && sc > unit_scale(best))
                best = &units[i];
            else if (mag < unit_scale(best) && sc < unit_scale(best))
                best = &units[i];
        }
    }
    if (!shortest(best, value, num, sizeof num)) {
        /* No decimal in that unit reads back exactly; the SI unit always
         * does. */
        for (size_t i = 0; i < PX_ARRAY_LEN(units); i++)
            if (units[i].dim == dim && units[i].factor == 1 && units[i].divisor == 0 &&
                units[i].offset == 0) {
                best = &units[i];
                break;
            }
        shortest(NULL, value, num, sizeof num);
    }
    int w = snprintf(buf, n, "%s %s", num, best->text);
    return w < 0 ? 0 : (size_t)w;
}

double px_qty_lo(const px_qty *q)
{
    switch (q->unc.kind) {
    case PX_UNC_RELATIVE:
        return q->value - fabs(q->value) * q->unc.rel;
    case PX_UNC_INTERVAL:
        return q->unc.lo;
    default:
        return q->value;
    }
}

double px_qty_hi(const px_qty *q)
{
    switch (q->unc.kind) {
    case PX_UNC_RELATIVE:
        return q->value + fabs(q->value) * q->unc.rel;
    case PX_UNC_INTERVAL:
        return q->unc.hi;
    default:
        return q->value;
    }
}

bool px_qty_valid_at(const px_qty *q, double x)
{
    if (!q->valid.param)
        return true;
    if (!isnan(q->valid.min) && x < q->valid.min)
        return false;
    if (!isnan(q->valid.max) && x > q->valid.max)
        return false;
    return true;
}

static px_status bad(px_err *err, const char *where, const char *fmt, const char *a)
{
    px_err_set(err, PX_EPARSE, fmt, a);
    return px_err_prefix(err, PX_EPARSE, "%s: ", where ? where : "quantity");
}

px_status px_qty_from_json(const json_t *v, px_dim expect, px_arena *arena, const char *where,
                           px_qty *out, px_err *err)
{
    if (!where)
        where = "quantity";
    if (json_is_string(v)) {
        px_status st = px_qty_parse(json_string_value(v), expect, out, err);
        if (st != PX_OK)
            return px_err_prefix(err, st, "%s: ", where);
        out->valid.min = out->valid.max = NAN;
        return PX_OK;
    }
    if (json_is_number(v) && expect == PX_DIM_NONE) {
        *out = px_qty_make(json_number_value(v), PX_DIM_NONE);
        return PX_OK;
    }
    if (!json_is_object(v)) {
        px_err_set(err, PX_EPARSE, "expected a quantity such as \"3.35 TB/s\" (a %s), found %s",
                   px_dim_name(expect), px_json_type_name(v));
        return px_err_prefix(err, PX_EPARSE, "%s: ", where);
    }
    const char *key;
    json_t *child;
    json_object_foreach((json_t *)v, key, child)
    {
        if (strcmp(key, "value") && strcmp(key, "provenance") && strcmp(key, "source") &&
            strcmp(key, "at") && strcmp(key, "uncertainty") && strcmp(key, "valid"))
            return bad(err, where,
                       "unknown member \"%s\"; a quantity object has value, provenance, "
                       "source, at, uncertainty and valid",
                       key);
    }
    json_t *jv = json_object_get(v, "value");
    if (!jv)
        return bad(err, where, "%s", "quantity object has no \"value\"");
    px_status st = px_qty_from_json(jv, expect, arena, where, out, err);
    if (st != PX_OK)
        return st;
    json_t *jp = json_object_get(v, "provenance");
    if (jp) {
        if (!json_is_string(jp) ||
            px_prov_kind_parse(json_string_value(jp), &out->prov.kind) != PX_OK)
            return bad(err, where,
                       "provenance %s is not one of datasheet, discovered, measured, "
                       "calibrated, assumed",
                       json_is_string(jp) ? json_string_value(jp) : "(not a string)");
    }
    json_t *js = json_object_get(v, "source");
    if (js) {
        if (!json_is_string(js))
            return bad(err, where, "%s", "source must be a string (a citation or command)");
        out->prov.source = px_arena_strdup(arena, json_string_value(js));
        if (!out->prov.source)
            return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    json_t *ja = json_object_get(v, "at");
    if (ja) {
        if (!json_is_string(ja) ||
            px_time_parse(json_string_value(ja), &out->prov.at, NULL) != PX_OK)
            return bad(err, where, "%s",
                       "at must be an RFC 3339 UTC time such as \"2026-11-29T00:00:00Z\"");
    }
    json_t *ju = json_object_get(v, "uncertainty");
    if (ju) {
        if (json_is_number(ju)) {
            double rel = json_number_value(ju);
            if (!isfinite(rel) || rel < 0 || rel > 10)
                return bad(err, where, "%s",
                           "uncertainty must be a relative figure between 0 and 10 "
                           "(0.05 means +-5%)");
            out->unc.kind = PX_UNC_RELATIVE;
            out->unc.rel = rel;
        } else if (json_is_array(ju) && json_array_size(ju) == 2) {
            px_qty lo, hi;
            st = px_qty_from_json(json_array_get(ju, 0), out->dim, arena, where, &lo, err);
            if (st == PX_OK)
                st = px_qty_from_json(json_array_get(ju, 1), out->dim, arena, where, &hi, err);
            if (st != PX_OK)
                return st;
            if (!(lo.value <= out->value && out->value <= hi.value))
                return bad(err, where, "%s",
                           "uncertainty interval [lo, hi] must contain the value");
            out->unc.kind = PX_UNC_INTERVAL;
            out->unc.lo = lo.value;
            out->unc.hi = hi.value;
        } else {
            return bad(err, where, "%s",
                       "uncertainty must be a relative number (0.05) or an interval "
                       "[\"lo\", \"hi\"]");
        }
    }
    json_t *jval = json_object_get(v, "valid");
    if (jval) {
        json_t *jparam = json_object_get(jval, "param");
        if (!json_is_object(jval) || !json_is_string(jparam))
            return bad(err, where, "%s",
                       "valid must be {\"param\": \"transfer_size\", \"min\": \"1 MiB\", "
                       "\"max\": ...}");
        out->valid.param = px_arena_strdup(arena, json_string_value(jparam));
        if (!out->valid.param)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        out->valid.dim = PX_DIM_NONE;
        json_t *jmin = json_object_get(jval, "min");
        json_t *jmax = json_object_get(jval, "max");
        if (!jmin && !jmax)
            return bad(err, where, "%s", "valid needs a min, a max or both");
        px_qty b;
        if (jmin) {
            st = px_qty_from_json(jmin, PX_DIM_NONE, arena, where, &b, err);
            if (st != PX_OK)
                return st;
            out->valid.min = b.value;
            out->valid.dim = b.dim;
        }
        if (jmax) {
            st = px_qty_from_json(jmax, PX_DIM_NONE, arena, where, &b, err);
            if (st != PX_OK)
                return st;
            if (jmin && b.dim != out->valid.dim)
                return bad(err, where, "%s", "valid min and max must have the same unit kind");
            out->valid.max = b.value;
            out->valid.dim = b.dim;
        }
        if (!isnan(out->valid.min) && !isnan(out->valid.max) && out->valid.min > out->valid.max)
            return bad(err, where, "%s", "valid min is above valid max");
        for (const char *k = "param"; k; k = NULL) {
            const char *key2;
            json_t *c2;
            json_object_foreach(jval, key2, c2)
            {
                if (strcmp(key2, "param") && strcmp(key2, "min") && strcmp(key2, "max"))
                    return bad(err, where, "valid has an unknown member \"%s\"", key2);
            }
        }
    }
    return PX_OK;
}

json_t *px_qty_to_json(const px_qty *q)
{
    char text[64];
    px_qty_format(q->value, q->dim, text, sizeof text);
    bool plain = q->prov.kind == PX_PROV_UNSPECIFIED && !q->prov.source && !q->prov.at &&
                 q->unc.kind == PX_UNC_NONE && !q->valid.param;
    if (plain)
        return json_string(text);
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool ok = px_json_set(o, "value", json_string(text)) == PX_OK;
    if (ok && q->prov.kind != PX_PROV_UNSPECIFIED)
        ok = px_json_set(o, "provenance", json_string(px_prov_kind_name(q->prov.kind))) == PX_OK;
    if (ok && q->prov.source)
        ok = px_json_set(o, "source", json_string(q->prov.source)) == PX_OK;
    if (ok && q->prov.at) {
        char t[32];
        px_time_format(q->prov.at, t);
        ok = px_json_set(o, "at", json_string(t)) == PX_OK;
    }
    if (ok && q->unc.kind == PX_UNC_RELATIVE)
        ok = px_json_set(o, "uncertainty", json_real(q->unc.rel)) == PX_OK;
    if (ok && q->unc.kind == PX_UNC_INTERVAL) {
        char lo[64], hi[64];
        px_qty_format(q->unc.lo, q->dim, lo, sizeof lo);
        px_qty_format(q->unc.hi, q->dim, hi, sizeof hi);
        ok = px_json_set(o, "uncertainty", json_pack("[s, s]", lo, hi)) == PX_OK;
    }
    if (ok && q->valid.param) {
        json_t *jv = json_pack("{s:s}", "param", q->valid.param);
        ok = jv != NULL;
        char b[64];
        if (ok && !isnan(q->valid.min)) {
            px_qty_format(q->valid.min, q->valid.dim, b, sizeof b);
            ok = px_json_set(jv, "min", json_string(b)) == PX_OK;
        }
        if (ok && !isnan(q->valid.max)) {
            px_qty_format(q->valid.max, q->valid.dim, b, sizeof b);
            ok = px_json_set(jv, "max", json_string(b)) == PX_OK;
        }
        if (ok)
            ok = px_json_set(o, "valid", jv) == PX_OK;
        else
            json_decref(jv);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}
