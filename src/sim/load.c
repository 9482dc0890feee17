/* Load specs ("poisson:rate=5,prompt=128,gen=64") and arrival traces
 * (JSON Lines), both untrusted and bounded. */
#include "base/common.h"

#include "sim/sim_impl.h"

#define MAX_SPEC        4096
#define MAX_LEN         1000000u
#define MAX_TRACE_LINES 10000000u
#define MAX_TRACE_LINE  4096
#define MAX_TRACE_BYTES (512u << 20)

static const char keys_help[] =
    "accepted: rate=R (requests/s), burst=F (bursty), period=T (bursty, e.g. 10s), "
    "prompt=N|uniform:A-B|exp:MEAN, gen=N|uniform:A-B|exp:MEAN";

static bool parse_u32(const char *s, uint32_t *out)
{
    if (!*s || *s == '-' || *s == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v < 1 || v > MAX_LEN)
        return false;
    *out = (uint32_t)v;
    return true;
}

static px_status parse_len(const char *key, const char *v, px_sim_len *out, px_err *err)
{
    char buf[64];
    if (px_strlcpy(buf, v, sizeof buf) >= sizeof buf)
        goto bad;
    if (px_str_starts_with(buf, "uniform:")) {
        char *dash = strchr(buf + 8, '-');
        if (!dash)
            goto bad;
        *dash = 0;
        out->kind = PX_SIM_LEN_UNIFORM;
        if (!parse_u32(buf + 8, &out->a) || !parse_u32(dash + 1, &out->b) || out->b < out->a)
            goto bad;
        return PX_OK;
    }
    if (px_str_starts_with(buf, "exp:")) {
        out->kind = PX_SIM_LEN_EXPONENTIAL;
        out->b = 0;
        if (!parse_u32(buf + 4, &out->a))
            goto bad;
        return PX_OK;
    }
    out->kind = PX_SIM_LEN_FIXED;
    out->b = 0;
    if (!parse_u32(buf, &out->a))
        goto bad;
    return PX_OK;
bad:
    return px_err_set(err, PX_EINVAL,
                      "load spec: %s=\"%.40s\": expected a whole number from 1 to %u, "
                      "uniform:A-B (A <= B) or exp:MEAN",
                      key, v, MAX_LEN);
}

static px_status parse_positive(const char *key, const char *v, px_dim dim, double *out,
                                px_err *err)
{
    px_qty q;
    if (dim == PX_DIM_TIME) {
        if (px_qty_parse(v, PX_DIM_TIME, &q, NULL) == PX_OK && q.value > 0 && q.value < 1e9) {
            *out = q.value;
            return PX_OK;
        }
    } else {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (!errno && end != v && !*end && isfinite(x) && x > 0 && x < 1e9) {
            *out = x;
            return PX_OK;
        }
    }
    return px_err_set(err, PX_EINVAL, "load spec: %s=\"%.40s\": expected a positive %s", key, v,
                      dim == PX_DIM_TIME ? "time such as 10s" : "number below 1e9");
}

px_status px_sim_load_parse(const char *spec, px_sim_load *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    out->prompt = (px_sim_len){PX_SIM_LEN_FIXED, 128, 0};
    out->gen = (px_sim_len){PX_SIM_LEN_FIXED, 64, 0};
    out->burst = 4;
    out->period_s = 10;
    if (!spec || !*spec)
        return px_err_set(err, PX_EINVAL,
                          "load spec is empty: give poisson:rate=R,..., bursty:rate=R,burst=F,... "
                          "or trace:FILE");
    size_t n = strlen(spec);
    if (n > MAX_SPEC)
        return px_err_set(err, PX_ELIMIT, "load spec is %zu bytes long; at most %d are accepted", n,
                          MAX_SPEC);
    if (px_str_starts_with(spec, "trace:")) {
        const char *path = spec + 6;
        if (!*path)
            return px_err_set(err, PX_EINVAL, "load spec \"trace:\" names no file: trace:FILE");
        char *text;
        size_t len;
        px_status st = px_read_file(path, MAX_TRACE_BYTES, &text, &len, err);
        if (st != PX_OK)
            return st;
        st = px_sim_load_read_trace(text, len, path, out, err);
        free(text);
        return st;
    }
    const char *colon = strchr(spec, ':');
    size_t kl = colon ? (size_t)(colon - spec) : n;
    if (kl == 7 && !strncmp(spec, "poisson", 7))
        out->kind = PX_SIM_LOAD_POISSON;
    else if (kl == 6 && !strncmp(spec, "bursty", 6))
        out->kind = PX_SIM_LOAD_BURSTY;
    else
        return px_err_set(err, PX_EINVAL,
                          "load spec \"%.60s\": unknown kind \"%.*s\"; use poisson, bursty or "
                          "trace",
                          spec, (int)(kl > 40 ? 40 : kl), spec);
    char buf[MAX_SPEC + 1];
    px_strlcpy(buf, colon ? colon + 1 : "", sizeof buf);
    bool have_rate = false;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            return px_err_set(err, PX_EINVAL, "load spec: item \"%.40s\" is not KEY=VALUE; %s",
                              item, keys_help);
        *eq = 0;
        const char *v = eq + 1;
        px_status st;
        if (!strcmp(item, "rate")) {
            st = parse_positive("rate", v, PX_DIM_NONE, &out->rate, err);
            have_rate = true;
        } else if (!strcmp(item, "burst") && out->kind == PX_SIM_LOAD_BURSTY) {
            st = parse_positive("burst", v, PX_DIM_NONE, &out->burst, err);
            if (st == PX_OK && out->burst <= 1)
                st = px_err_set(err, PX_EINVAL,
                                "load spec: burst=%s: the burst factor must be above 1", v);
        } else if (!strcmp(item, "period") && out->kind == PX_SIM_LOAD_BURSTY) {
            st = parse_positive("period", v, PX_DIM_TIME, &out->period_s, err);
        } else if (!strcmp(item, "prompt")) {
            st = parse_len("prompt", v, &out->prompt, err);
        } else if (!strcmp(item, "gen")) {
            st = parse_len("gen", v, &out->gen, err);
        } else {
            return px_err_set(err, PX_EINVAL, "load spec: unknown key \"%.40s\" for %s; %s", item,
                              out->kind == PX_SIM_LOAD_BURSTY ? "bursty" : "poisson", keys_help);
        }
        if (st != PX_OK)
            return st;
    }
    if (!have_rate)
        return px_err_set(err, PX_EINVAL, "load spec \"%.60s\": rate=R (requests/s) is required",
                          spec);
    return PX_OK;
}

static px_status trace_line(const char *line, size_t len, const char *name, size_t lineno,
                            px_sim_arrival *a, px_err *err)
{
    json_t *v;
    px_json_limits lim = {
        .max_bytes = MAX_TRACE_LINE, .max_depth = 2, .max_string = 64, .max_elements = 8};
    px_err e;
    if (px_json_parse(line, len, name, &lim, &v, &e) != PX_OK)
        return px_err_set(err, PX_EPARSE, "%s:%zu: not a JSON object: %s", name, lineno, e.msg);
    px_status st = PX_OK;
    if (!json_is_object(v)) {
        st = px_err_set(err, PX_EPARSE,
                        "%s:%zu: expected an object {\"t\", \"prompt_tokens\", "
                        "\"gen_tokens\"}, got %s",
                        name, lineno, px_json_type_name(v));
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        if (strcmp(key, "t") && strcmp(key, "prompt_tokens") && strcmp(key, "gen_tokens")) {
            st = px_err_set(err, PX_EPARSE,
                            "%s:%zu: unknown member \"%.40s\"; a line holds t, prompt_tokens "
                            "and gen_tokens",
                            name, lineno, key);
            goto done;
        }
    }
    json_t *t = json_object_get(v, "t"), *p = json_object_get(v, "prompt_tokens"),
           *g = json_object_get(v, "gen_tokens");
    if (!json_is_number(t) || !isfinite(json_number_value(t)) || json_number_value(t) < 0 ||
        json_number_value(t) > 1e9) {
        st = px_err_set(err, PX_EPARSE, "%s:%zu: /t must be a number of seconds from 0 to 1e9",
                        name, lineno);
        goto done;
    }
    const char *which = NULL;
    if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > MAX_LEN)
        which = "prompt_tokens";
    else if (!json_is_integer(g) || json_integer_value(g) < 1 || json_integer_value(g) > MAX_LEN)
        which = "gen_tokens";
    if (which) {
        st = px_err_set(err, PX_EPARSE, "%s:%zu: /%s must be a whole number from 1 to %u", name,
                        lineno, which, MAX_LEN);
        goto done;
    }
    a->t = json_number_value(t);
    a->prompt_tokens = (uint32_t)json_integer_value(p);
    a->gen_tokens = (uint32_t)json_integer_value(g);
done:
    json_decref(v);
    return st;
}

px_status px_sim_load_read_trace(const char *text, size_t len, const char *name, px_sim_load *out,
                                 px_err *err)
{
    memset(out, 0, sizeof *out);
    out->kind = PX_SIM_LOAD_TRACE;
    px_strlcpy(out->source, name ? name : "trace", sizeof out->source);
    name = out->source;
    size_t cap = 0, lineno = 0;
    px_status st = PX_OK;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - (text + pos)) : len - pos;
        const char *line = text + pos;
        pos += l + (nl ? 1 : 0);
        lineno++;
        if (lineno > MAX_TRACE_LINES) {
            st = px_err_set(err, PX_ELIMIT, "%s: more than %u lines", name, MAX_TRACE_LINES);
            goto fail;
        }
        if (l > MAX_TRACE_LINE) {
            st = px_err_set(err, PX_ELIMIT, "%s:%zu: line of %zu bytes; at most %d are accepted",
                            name, lineno, l, MAX_TRACE_LINE);
            goto fail;
        }
        size_t k = 0;
        while (k < l && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
            k++;
        if (k == l)
            continue;
        if (out->n_arrivals == cap) {
            size_t nc = cap ? cap * 2 : 256;
            px_sim_arrival *a = realloc(out->arrivals, nc * sizeof *a);
            if (!a) {
                st = px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
                goto fail;
            }
            out->arrivals = a;
            cap = nc;
        }
        px_sim_arrival *a = &out->arrivals[out->n_arrivals];
        st = trace_line(line, l, name, lineno, a, err);
        if (st != PX_OK)
            goto fail;
        if (out->n_arrivals && a->t < out->arrivals[out->n_arrivals - 1].t) {
            st = px_err_set(err, PX_EPARSE,
                            "%s:%zu: t = %g comes before the previous line's %g; sort the "
                            "arrivals by time",
                            name, lineno, a->t, out->arrivals[out->n_arrivals - 1].t);
            goto fail;
        }
        out->n_arrivals++;
    }
    if (out->n_arrivals == 0) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: no arrivals; each line is {\"t\": seconds, "
                        "\"prompt_tokens\": n, \"gen_tokens\": m}",
                        name);
        goto fail;
    }
    double span = out->arrivals[out->n_arrivals - 1].t;
    out->rate = span > 0 ? (double)out->n_arrivals / span : 0;
    return PX_OK;
fail:
    free(out->arrivals);
    out->arrivals = NULL;
    out->n_arrivals = 0;
    return st;
}

void px_sim_load_release(px_sim_load *load)
{
    if (!load)
        return;
    free(load->arrivals);
    memset(load, 0, sizeof *load);
}

static json_t *len_json(const px_sim_len *l)
{
    static const char *const names[] = {"fixed", "uniform", "exponential"};
    return json_pack("{s:s, s:I, s:I}", "kind", names[l->kind], "a", (json_int_t)l->a, "b",
                     (json_int_t)l->b);
}

json_t *px_sim_load_to_json(const px_sim_load *load)
{
    static const char *const kinds[] = {"poisson", "bursty", "trace"};
    json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:o, s:o}", "kind", kinds[load->kind], "rate",
                          load->rate, "burst", load->burst, "period_s", load->period_s, "prompt",
                          len_json(&load->prompt), "gen", len_json(&load->gen));
    if (!o || load->kind != PX_SIM_LOAD_TRACE)
        return o;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < load->n_arrivals; i++) {
        const px_sim_arrival *a = &load->arrivals[i];
        if (px_json_push(arr, json_pack("[f, I, I]", a->t, (json_int_t)a->prompt_tokens,
                                        (json_int_t)a->gen_tokens)) != PX_OK) {
            json_decref(arr);
            arr = NULL;
        }
    }
    if (px_json_set(o, "arrivals", arr) != PX_OK ||
        px_json_set(o, "source", json_string(load->source)) != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static bool len_from_json(const json_t *v, px_sim_len *l)
{
    const char *kind;
    json_int_t a, b;
    if (json_unpack((json_t *)v, "{s:s, s:I, s:I}", "kind", &kind, "a", &a, "b", &b))
        return false;
    if (!strcmp(kind, "fixed"))
        l->kind = PX_SIM_LEN_FIXED;
    else if (!strcmp(kind, "uniform"))
        l->kind = PX_SIM_LEN_UNIFORM;
    else if (!strcmp(kind, "exponential"))
        l->kind = PX_SIM_LEN_EXPONENTIAL;
    else
        return false;
    if (a < 1 || a > MAX_LEN || b < 0 || b > MAX_LEN || (l->kind == PX_SIM_LEN_UNIFORM && b < a))
        return false;
    l->a = (uint32_t)a;
    l->b = (uint32_t)b;
    return true;
}

px_status px_sim_load_from_json(const json_t *v, px_sim_load *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    const char *kind;
    json_t *prompt, *gen;
    if (json_unpack((json_t *)v, "{s:s, s:F, s:F, s:F, s:o, s:o}", "kind", &kind, "rate",
                    &out->rate, "burst", &out->burst, "period_s", &out->period_s, "prompt", &prompt,
                    "gen", &gen) ||
        !len_from_json(prompt, &out->prompt) || !len_from_json(gen, &out->gen))
        return px_err_set(err, PX_EPARSE, "recorded load: malformed");
    if (!strcmp(kind, "poisson"))
        out->kind = PX_SIM_LOAD_POISSON;
    else if (!strcmp(kind, "bursty"))
        out->kind = PX_SIM_LOAD_BURSTY;
    else if (!strcmp(kind, "trace"))
        out->kind = PX_SIM_LOAD_TRACE;
    else
        return px_err_set(err, PX_EPARSE, "recorded load: unknown kind \"%.40s\"", kind);
    if (out->kind != PX_SIM_LOAD_TRACE)
        return PX_OK;
    const json_t *arr = json_object_get(v, "arrivals");
    const json_t *src = json_object_get(v, "source");
    if (json_is_string(src))
        px_strlcpy(out->source, json_string_value(src), sizeof out->source);
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n == 0 || n > MAX_TRACE_LINES)
        return px_err_set(err, PX_EPARSE, "recorded load: arrivals missing");
    out->arrivals = calloc(n, sizeof *out->arrivals);
    if (!out->arrivals)
        return px_err_set(err, PX_ENOMEM, "recorded load: out of memory");
    for (size_t i = 0; i < n; i++) {
        double t;
        json_int_t p, g;
        if (json_unpack(json_array_get(arr, i), "[F, I, I]", &t, &p, &g) || !isfinite(t) || t < 0 ||
            p < 1 || g < 1 || p > MAX_LEN || g > MAX_LEN || (i && t < out->arrivals[i - 1].t)) {
            px_sim_load_release(out);
            return px_err_set(err, PX_EPARSE, "recorded load: /arrivals/%zu malformed", i);
        }
        out->arrivals[i] = (px_sim_arrival){t, (uint32_t)p, (uint32_t)g};
    }
    out->n_arrivals = n;
    return PX_OK;
}

static double len_mean(const px_sim_len *l)
{
    switch (l->kind) {
    case PX_SIM_LEN_UNIFORM:
        return 0.5 * ((double)l->a + (double)l->b);
    case PX_SIM_LEN_EXPONENTIAL:
    case PX_SIM_LEN_FIXED:
    default:
        return (double)l->a;
    }
}

double px_sim_load_offered_tokens(const px_sim_load *load)
{
    if (load->kind == PX_SIM_LOAD_TRACE) {
        if (load->n_arrivals < 2)
            return 0;
        double span = load->arrivals[load->n_arrivals - 1].t - load->arrivals[0].t, gen = 0;
        for (size_t i = 0; i < load->n_arrivals; i++)
            gen += load->arrivals[i].gen_tokens;
        return span > 0 ? gen / span : 0;
    }
    return load->rate * len_mean(&load->gen);
}
