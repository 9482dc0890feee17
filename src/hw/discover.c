/* Discovery: px_hw_discover runs the probes in order and assembles the
 * one-node inventory; also the helpers the probes share (quantities,
 * files under the sysroot, line splitting, outcome records) and the
 * operating system probe. */
#include "hw/discover_impl.h"

#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Text helpers                                                        */
/* ------------------------------------------------------------------ */

void px__lines_init(px__lines *it, const char *text, size_t len)
{
    it->p = text;
    it->end = text ? text + len : text;
    it->lineno = 0;
}

bool px__lines_next(px__lines *it, const char **line, size_t *len)
{
    if (!it->p || it->p >= it->end)
        return false;
    const char *nl = memchr(it->p, '\n', (size_t)(it->end - it->p));
    const char *stop = nl ? nl : it->end;
    *line = it->p;
    *len = (size_t)(stop - it->p);
    if (*len && (*line)[*len - 1] == '\r')
        (*len)--;
    it->p = nl ? nl + 1 : it->end;
    it->lineno++;
    return true;
}

void px__trim(const char **s, size_t *len)
{
    const char *p = *s;
    size_t n = *len;
    while (n && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r'))
        n--;
    *s = p;
    *len = n;
}

void px__copy_text(char *out, size_t n, const char *s, size_t len)
{
    if (!n)
        return;
    if (len >= n)
        len = n - 1;
    if (len)
        memcpy(out, s, len);
    out[len] = '\0';
}

/* ------------------------------------------------------------------ */
/* Quantities, files, outcome records                                  */
/* ------------------------------------------------------------------ */

/* Drops digits a figure does not have, so that documents print "134.1
 * GFLOP/s" rather than "134144192000.00002 FLOP/s": measurements and
 * estimates keep four significant digits, discovered figures nine (byte
 * counts stay exact).  The number is rebuilt the way the quantity parser
 * reads "134.1 GFLOP/s" (a decimal times the unit's power of 1000), so
 * that it prints back in that unit. */
static double tidy(double v, px_dim dim, px_prov_kind kind)
{
    if (!isfinite(v) || v <= 0 || (dim == PX_DIM_BYTES && kind == PX_PROV_DISCOVERED))
        return v;
    int digits = kind == PX_PROV_MEASURED || kind == PX_PROV_ASSUMED ? 4 : 9;
    double factor = 1;
    if (v >= 1 && dim != PX_DIM_TEMPERATURE && dim != PX_DIM_TIME)
        factor = pow(10, PX_MIN(floor(log10(v) / 3) * 3, 18));
    char buf[40];
    snprintf(buf, sizeof buf, "%.*g", digits, v / factor);
    return strtod(buf, NULL) * factor;
}

json_t *px__disc_qty(const px__disc *d, double value, px_dim dim, px_prov_kind kind,
                     const char *source, double rel)
{
    px_qty q = px_qty_make(tidy(value, dim, kind), dim);
    q.prov.kind = kind;
    q.prov.source = source;
    q.prov.at = d->at;
    if (rel > 0) {
        q.unc.kind = PX_UNC_RELATIVE;
        q.unc.rel = rel;
    }
    return px_qty_to_json(&q);
}

json_t *px__disc_qty_interval(const px__disc *d, double value, px_dim dim, px_prov_kind kind,
                              const char *source, double lo, double hi)
{
    px_qty q = px_qty_make(tidy(value, dim, kind), dim);
    q.prov.kind = kind;
    q.prov.source = source;
    q.prov.at = d->at;
    q.unc.kind = PX_UNC_INTERVAL;
    q.unc.lo = PX_MIN(tidy(lo, dim, kind), q.value);
    q.unc.hi = PX_MAX(tidy(hi, dim, kind), q.value);
    return px_qty_to_json(&q);
}

char *px__disc_path(const px__disc *d, const char *abs)
{
    return px_asprintf("%s%s", d->sysroot, abs);
}

px_status px__disc_read(const px__disc *d, const char *abs, size_t max, char **out, size_t *len,
                        px_err *err)
{
    char *path = px__disc_path(d, abs);
    if (!path)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = px_read_file(path, max, out, len, err);
    free(path);
    return st;
}

bool px__disc_exists(const px__disc *d, const char *abs)
{
    char *path = px__disc_path(d, abs);
    bool ok = path && access(path, F_OK) == 0;
    free(path);
    return ok;
}

static const char *const probe_status_names[] = {"ok", "partial", "failed", "skipped"};

px_status px__disc_record(px__disc *d, const char *probe, px__probe_status status,
                          const char *source, uint64_t started_ns, const char *fix, const char *fmt,
                          ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t index = json_array_size(d->probes);
    json_t *rec = json_pack("{s:s, s:s, s:s}", "probe", probe, "status", probe_status_names[status],
                            "message", msg);
    if (!rec)
        return PX_ENOMEM;
    if (source && px_json_set(rec, "source", json_string(source)) != PX_OK)
        goto fail_rec;
    char took[64];
    double us = (double)(px_now_ns() - started_ns) * 1e-3;
    if (us < 1000)
        snprintf(took, sizeof took, "%.0f us", us);
    else if (us < 1e6)
        snprintf(took, sizeof took, "%.3g ms", us * 1e-3);
    else
        snprintf(took, sizeof took, "%.3g s", us * 1e-6);
    if (px_json_set(rec, "duration", json_string(took)) != PX_OK)
        goto fail_rec;
    if (px_json_push(d->probes, rec) != PX_OK)
        return PX_ENOMEM;
    if (status == PX__PROBE_FAILED && d->report) {
        char ptr[64];
        snprintf(ptr, sizeof ptr, "/nodes/0/x-probes/%zu", index);
        if (px_diags_add(d->report, PX_SEV_WARNING, ptr, fix, "%s probe: %s", probe, msg) != PX_OK)
            return PX_ENOMEM;
    }
    return PX_OK;

fail_rec:
    json_decref(rec);
    return PX_ENOMEM;
}

px_status px__disc_warn(px__disc *d, const char *probe, const char *fix, const char *fmt, ...)
{
    if (!d->report)
        return PX_OK;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The probe records its outcome next, at this index. */
    char ptr[64];
    snprintf(ptr, sizeof ptr, "/nodes/0/x-probes/%zu", json_array_size(d->probes));
    return px_diags_add(d->report, PX_SEV_WARNING, ptr, fix, "%s probe: %s", probe, msg);
}

/* ------------------------------------------------------------------ */
/* The operating system                                                */
/* ------------------------------------------------------------------ */

/* Reads the first line of a small system file into out; false if absent
 * or not printable text. */
static bool read_first_line(const px__disc *d, const char *abs, char *out, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    if (px__disc_read(d, abs, 64 * 1024, &text, &len, NULL) != PX_OK)
        return false;
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line = NULL;
    size_t ll = 0;
    bool ok = px__lines_next(&it, &line, &ll);
    if (ok) {
        px__trim(&line, &ll);
        for (size_t i = 0; i < ll; i++)
            if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
                ok = false;
        ok = ok && ll > 0;
        if (ok)
            px__copy_text(out, n, line, ll);
    }
    free(text);
    return ok;
}

/* PRETTY_NAME from os-release(5): KEY=value or KEY="value". */
static bool read_distro(const px__disc *d, char *out, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    if (px__disc_read(d, "/etc/os-release", 64 * 1024, &text, &len, NULL) != PX_OK &&
        px__disc_read(d, "/usr/lib/os-release", 64 * 1024, &text, &len, NULL) != PX_OK)
        return false;
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t ll;
    bool found = false;
    while (!found && it.lineno < PX__DISC_MAX_LINES && px__lines_next(&it, &line, &ll)) {
        static const char key[] = "PRETTY_NAME=";
        if (ll < sizeof key - 1 || memcmp(line, key, sizeof key - 1))
            continue;
        const char *v = line + sizeof key - 1;
        size_t vl = ll - (sizeof key - 1);
        px__trim(&v, &vl);
        if (vl >= 2 && (v[0] == '"' || v[0] == '\'') && v[vl - 1] == v[0])
            v++, vl -= 2;
        found = vl > 0;
        for (size_t i = 0; i < vl; i++)
            if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f || v[i] == '\\')
                found = false;
        if (found)
            px__copy_text(out, n, v, vl);
    }
    free(text);
    return found;
}

px_status px__disc_probe_os(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    char kernel[128], distro[160], loadavg[128];
    bool has_kernel = read_first_line(d, "/proc/sys/kernel/osrelease", kernel, sizeof kernel);
    bool has_distro = read_distro(d, distro, sizeof distro);
    if (has_kernel || has_distro) {
        json_t *os = json_object();
        if (px_json_set(d->node, "os", os) != PX_OK)
            return PX_ENOMEM;
        if (has_kernel && px_json_set(os, "kernel", json_string(kernel)) != PX_OK)
            return PX_ENOMEM;
        if (has_distro && px_json_set(os, "distro", json_string(distro)) != PX_OK)
            return PX_ENOMEM;
    }
    /* The load average per hardware thread: how busy the node is. */
    bool has_load = false;
    if (d->n_threads && read_first_line(d, "/proc/loadavg", loadavg, sizeof loadavg)) {
        char *end;
        double l1 = strtod(loadavg, &end);
        if (end != loadavg && isfinite(l1) && l1 >= 0 && l1 < 1e6) {
            json_t *live = json_object_get(d->node, "live");
            if (!live) {
                live = json_object();
                if (px_json_set(d->node, "live", live) != PX_OK)
                    return PX_ENOMEM;
            }
            if (px_json_set(live, "load", json_real(l1 / d->n_threads)) != PX_OK)
                return PX_ENOMEM;
            has_load = true;
        }
    }
    px__probe_status st = has_kernel && has_distro && has_load ? PX__PROBE_OK
                          : has_kernel || has_distro           ? PX__PROBE_PARTIAL
                                                               : PX__PROBE_FAILED;
    return px__disc_record(
        d, "os", st, "/proc/sys/kernel/osrelease, /etc/os-release, /proc/loadavg", t0, NULL,
        "kernel %s, %s%s", has_kernel ? kernel : "unknown",
        has_distro ? distro : "distribution unknown", has_load ? "" : ", load unknown");
}

/* ------------------------------------------------------------------ */
/* The whole discovery                                                 */
/* ------------------------------------------------------------------ */

static bool valid_id(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* A node id from a host name: the first label, with characters ids do not
 * allow replaced by '-'. */
static void node_id_from_hostname(const char *host, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = host; *p && *p != '.' && k + 1 < n && k < 64; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
        out[k++] = ok ? c : '-';
    }
    out[k] = '\0';
    if (!k)
        px_strlcpy(out, "local", n);
}

static px_status check_options(const px_hw_discover_options *o, px_err *err)
{
    if (!(o->measure_seconds >= 0) || !isfinite(o->measure_seconds) || o->measure_seconds > 600)
        return px_err_set(err, PX_EINVAL,
                          "discovery: measure_seconds is %g; give 0 (the default) or up to "
                          "600 seconds",
                          o->measure_seconds);
    if (!(o->command_timeout >= 0) || !isfinite(o->command_timeout) || o->command_timeout > 3600)
        return px_err_set(err, PX_EINVAL,
                          "discovery: command_timeout is %g; give 0 (the default) or up to "
                          "3600 seconds",
                          o->command_timeout);
    if (o->node_id && !valid_id(o->node_id))
        return px_err_set(err, PX_EINVAL,
                          "discovery: node id \"%.64s\" is not 1 to 64 characters of "
                          "[A-Za-z0-9_-]",
                          o->node_id);
    if (o->n_python_prefixes && !o->python_prefixes)
        return px_err_set(err, PX_EINVAL, "discovery: %zu python prefixes but no array",
                          o->n_python_prefixes);
    for (size_t i = 0; i < o->n_python_prefixes; i++)
        if (!o->python_prefixes[i] || !o->python_prefixes[i][0])
            return px_err_set(err, PX_EINVAL, "discovery: python prefix %zu is empty", i);
    return PX_OK;
}

/* Drops members that ended up empty, so the document holds only what was
 * found. */
static void drop_empty(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v && ((json_is_array(v) && json_array_size(v) == 0) ||
              (json_is_object(v) && json_object_size(v) == 0)))
        json_object_del(obj, key);
}

px_status px_hw_discover(const px_hw_discover_options *options, json_t **out, px_diags *report,
                         px_err *err)
{
    static const px_hw_discover_options defaults;
    const px_hw_discover_options *o = options ? options : &defaults;
    *out = NULL;
    px_status st = check_options(o, err);
    if (st != PX_OK)
        return st;

    px__disc d = {.opt = o, .report = report};
    char root[4096];
    px_strlcpy(root, o->sysroot ? o->sysroot : "", sizeof root);
    size_t rl = strlen(root);
    while (rl && root[rl - 1] == '/')
        root[--rl] = '\0';
    d.sysroot = root;
    d.timeout = o->command_timeout > 0 ? o->command_timeout : 10.0;
    d.at = o->now ? o->now : px_wall_time();

    char host[256] = "";
    if (!read_first_line(&d, "/proc/sys/kernel/hostname", host, sizeof host) && !root[0] &&
        gethostname(host, sizeof host - 1) != 0)
        host[0] = '\0';
    host[sizeof host - 1] = '\0';
    if (o->node_id)
        px_strlcpy(d.node_id, o->node_id, sizeof d.node_id);
    else
        node_id_from_hostname(host, d.node_id, sizeof d.node_id);

    d.doc = json_pack("{s:s, s:s, s:s, s:[], s:[]}", "schema", "plexus.inventory/1", "name",
                      d.node_id, "description",
                      "this machine, as plexus inventory discover found it", "nodes", "links");
    if (!d.doc)
        goto fail_nomem;
    d.links = json_object_get(d.doc, "links");
    d.node = json_pack("{s:s, s:[], s:[], s:[]}", "id", d.node_id, "devices", "memory", "x-probes");
    if (!d.node || px_json_push(json_object_get(d.doc, "nodes"), d.node) != PX_OK)
        goto fail_nomem;
    d.devices = json_object_get(d.node, "devices");
    d.memory = json_object_get(d.node, "memory");
    d.probes = json_object_get(d.node, "x-probes");
    if (host[0] && px_json_set(d.node, "hostname", json_string(host)) != PX_OK)
        goto fail_nomem;

    px_status (*const probes[])(px__disc *) = {
        px__disc_probe_cpu, px__disc_probe_mem,    px__disc_probe_os,
        px__disc_probe_gpu, px__disc_probe_python, px__disc_probe_measure,
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(probes); i++)
        if (probes[i](&d) != PX_OK)
            goto fail_nomem;

    drop_empty(d.node, "memory");
    drop_empty(d.node, "frameworks");
    drop_empty(d.doc, "links");
    *out = d.doc;
    return PX_OK;

fail_nomem:
    json_decref(d.doc);
    return px_err_set(err, PX_ENOMEM, "discovery: out of memory");
}
