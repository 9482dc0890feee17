/* Discovery: reading what nvidia-smi prints (the CSV of --query-gpu and
 * the MIG lines of -L) and naming GPUs by their catalogue entries.  Pure
 * functions over text, bounded, for untrusted output. */
#include "hw/discover_impl.h"

#include <strings.h>

/* ------------------------------------------------------------------ */
/* Catalogue names                                                     */
/* ------------------------------------------------------------------ */

static const struct {
    const char *name; /* as nvidia-smi prints it */
    const char *id;
} catalog_names[] = {
    {"NVIDIA H100 80GB HBM3", "nvidia-h100-sxm5"},
    {"NVIDIA H100 PCIe", "nvidia-h100-pcie"},
    {"NVIDIA H100 NVL", "nvidia-h100-nvl"},
    {"NVIDIA H200", "nvidia-h200-sxm"},
    {"NVIDIA H200 NVL", "nvidia-h200-nvl"},
    {"NVIDIA B200", "nvidia-b200"},
    {"NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb-sxm"},
    {"NVIDIA A100-SXM4-40GB", "nvidia-a100-40gb-sxm"},
    {"NVIDIA A100 80GB PCIe", "nvidia-a100-80gb-pcie"},
    {"NVIDIA A100-PCIE-40GB", "nvidia-a100-40gb-pcie"},
    {"NVIDIA L4", "nvidia-l4"},
    {"NVIDIA L40S", "nvidia-l40s"},
    {"NVIDIA A10G", "nvidia-a10g"},
    {"NVIDIA A10", "nvidia-a10"},
    {"Tesla T4", "nvidia-t4"},
    {"Tesla V100-SXM2-32GB", "nvidia-v100-32gb-sxm2"},
    {"NVIDIA GeForce RTX 4090", "nvidia-rtx-4090"},
    {"NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"},
};

const char *px_hw_nvidia_catalog_id(const char *name)
{
    if (!name)
        return NULL;
    const char *s = name;
    size_t n = strlen(name);
    px__trim(&s, &n);
    for (size_t i = 0; i < PX_ARRAY_LEN(catalog_names); i++)
        if (strlen(catalog_names[i].name) == n && !strncasecmp(catalog_names[i].name, s, n))
            return catalog_names[i].id;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* --query-gpu CSV                                                     */
/* ------------------------------------------------------------------ */

enum {
    F_INDEX,
    F_NAME,
    F_UUID,
    F_MEM_TOTAL,
    F_MEM_USED,
    F_MEM_FREE,
    F_UTIL,
    F_TEMP,
    F_POWER_DRAW,
    F_POWER_LIMIT,
    F_CLOCK_SM,
    F_CAP,
    F_DRIVER,
    F_PCIE_GEN,
    F_PCIE_WIDTH,
    F_COUNT
};

static const char *const field_names[F_COUNT] = {
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.max.sm",
    "compute_cap",
    "driver_version",
    "pcie.link.gen.max",
    "pcie.link.width.max",
};

/* Whether a field is one of nvidia-smi's "not reported" markers:
 * "[N/A]", "[Not Supported]", "[Unknown Error]", ... */
static bool not_reported(const char *s, size_t n)
{
    if (n == 0 || (n == 3 && !memcmp(s, "N/A", 3)))
        return true;
    return n >= 2 && s[0] == '[' && s[n - 1] == ']';
}

static bool says(const char *s, size_t n, const char *what)
{
    return strlen(what) == n && !memcmp(s, what, n);
}

/* Parses a decimal number in [lo, hi]. */
static bool parse_number(const char *s, size_t n, double lo, double hi, double *out)
{
    char buf[48];
    if (n == 0 || n >= sizeof buf)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' || s[i] == '+'))
            return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (*end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool text_ok(const char *s, size_t n, const char *allowed_extra)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              strchr(allowed_extra, c)) ||
            c == '\0')
            return false;
    }
    return true;
}

static void warn(px_diags *w, const char *fix, const char *fmt, ...) PX_PRINTF(3, 4);
static void warn(px_diags *w, const char *fix, const char *fmt, ...)
{
    if (!w)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    px_diags_add(w, PX_SEV_WARNING, "", fix, "%s", msg);
}

/* A numeric field: absent when not reported; absent with a warning when
 * it does not parse or is out of range.  scale converts the unit the
 * output uses into SI; offset is added after scaling. */
static double numeric(const char *s, size_t n, double lo, double hi, double scale, double offset,
                      size_t line, int field, px_diags *w)
{
    double v;
    if (not_reported(s, n)) {
        if (says(s, n, "[GPU is lost]") || says(s, n, "[Unknown Error]"))
            warn(w, "check the GPU with nvidia-smi -q and the kernel log",
                 "line %zu: %s reads %.*s", line, field_names[field], (int)n, s);
        return NAN;
    }
    if (!parse_number(s, n, lo, hi, &v)) {
        warn(w, NULL, "line %zu: %s \"%.*s\" is not a number in [%g, %g]; ignored", line,
             field_names[field], (int)PX_MIN(n, 32), s, lo, hi);
        return NAN;
    }
    return v * scale + offset;
}

static int integer(const char *s, size_t n, int lo, int hi, size_t line, int field, px_diags *w)
{
    double v = numeric(s, n, lo, hi, 1, 0, line, field, w);
    if (isnan(v))
        return 0;
    if (v != floor(v)) {
        warn(w, NULL, "line %zu: %s \"%.*s\" is not a whole number; ignored", line,
             field_names[field], (int)PX_MIN(n, 32), s);
        return 0;
    }
    return (int)v;
}

/* Whether the line holds only printable ASCII and tabs. */
static bool clean_line(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c >= 0x7f)
            return false;
    }
    return true;
}

/* Parses one row; returns false (with a warning) when the row is skipped. */
static bool parse_row(const char *line, size_t n, size_t lineno, px_hw_nvidia_gpu *g, px_diags *w)
{
    const char *f[F_COUNT];
    size_t fl[F_COUNT];
    size_t nf = 0;
    const char *p = line, *end = line + n;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        if (nf < F_COUNT) {
            f[nf] = p;
            fl[nf] = (size_t)(stop - p);
            px__trim(&f[nf], &fl[nf]);
        }
        nf++;
        if (!comma)
            break;
        p = comma + 1;
    }
    if (nf != F_COUNT) {
        warn(w,
             "run nvidia-smi --query-gpu=" PX_HW_NVIDIA_SMI_QUERY " --format=csv,noheader,nounits",
             "line %zu: %zu fields where %d were expected; not a row of the query, skipped", lineno,
             nf, F_COUNT);
        return false;
    }
    memset(g, 0, sizeof *g);
    g->line = lineno;
    double idx;
    if (!parse_number(f[F_INDEX], fl[F_INDEX], 0, 1023, &idx) || idx != floor(idx)) {
        warn(w, NULL, "line %zu: index \"%.*s\" is not a whole number in [0, 1023]; row skipped",
             lineno, (int)PX_MIN(fl[F_INDEX], 32), f[F_INDEX]);
        return false;
    }
    g->index = (int)idx;
    if (not_reported(f[F_NAME], fl[F_NAME]) || fl[F_NAME] >= sizeof g->name) {
        warn(w, NULL, "line %zu: GPU %d has no usable name (\"%.*s\"); row skipped", lineno,
             g->index, (int)PX_MIN(fl[F_NAME], 48), f[F_NAME]);
        return false;
    }
    px__copy_text(g->name, sizeof g->name, f[F_NAME], fl[F_NAME]);
    if (!not_reported(f[F_UUID], fl[F_UUID])) {
        if (fl[F_UUID] < sizeof g->uuid && text_ok(f[F_UUID], fl[F_UUID], "-/_"))
            px__copy_text(g->uuid, sizeof g->uuid, f[F_UUID], fl[F_UUID]);
        else
            warn(w, NULL, "line %zu: uuid \"%.*s\" is malformed; ignored", lineno,
                 (int)PX_MIN(fl[F_UUID], 48), f[F_UUID]);
    }
    if (!strncmp(g->uuid, "MIG-", 4)) {
        warn(w, NULL,
             "line %zu: a MIG instance (%s), not a physical GPU; skipped (MIG instances are "
             "read from nvidia-smi -L)",
             lineno, g->uuid);
        return false;
    }
    const double mib = 1048576.0, max_mib = 16.0 * 1024 * 1024; /* 16 TiB */
    g->memory_total =
        numeric(f[F_MEM_TOTAL], fl[F_MEM_TOTAL], 0, max_mib, mib, 0, lineno, F_MEM_TOTAL, w);
    g->memory_used =
        numeric(f[F_MEM_USED], fl[F_MEM_USED], 0, max_mib, mib, 0, lineno, F_MEM_USED, w);
    g->memory_free =
        numeric(f[F_MEM_FREE], fl[F_MEM_FREE], 0, max_mib, mib, 0, lineno, F_MEM_FREE, w);
    if (g->memory_total == 0)
        g->memory_total = NAN; /* a capacity of zero is no capacity at all */
    g->utilization = numeric(f[F_UTIL], fl[F_UTIL], 0, 100, 0.01, 0, lineno, F_UTIL, w);
    g->temperature = numeric(f[F_TEMP], fl[F_TEMP], -60, 250, 1, 273.15, lineno, F_TEMP, w);
    g->power_draw =
        numeric(f[F_POWER_DRAW], fl[F_POWER_DRAW], 0, 1e5, 1, 0, lineno, F_POWER_DRAW, w);
    g->power_limit =
        numeric(f[F_POWER_LIMIT], fl[F_POWER_LIMIT], 0, 1e5, 1, 0, lineno, F_POWER_LIMIT, w);
    if (g->power_limit == 0)
        g->power_limit = NAN;
    g->clock_max_sm = numeric(f[F_CLOCK_SM], fl[F_CLOCK_SM], 0, 1e5, 1e6, 0, lineno, F_CLOCK_SM, w);
    if (!not_reported(f[F_CAP], fl[F_CAP])) {
        if (fl[F_CAP] < sizeof g->capability && fl[F_CAP] >= 3 &&
            text_ok(f[F_CAP], fl[F_CAP], ".") && memchr(f[F_CAP], '.', fl[F_CAP]))
            px__copy_text(g->capability, sizeof g->capability, f[F_CAP], fl[F_CAP]);
        else
            warn(w, NULL, "line %zu: compute_cap \"%.*s\" is not MAJOR.MINOR; ignored", lineno,
                 (int)PX_MIN(fl[F_CAP], 32), f[F_CAP]);
    }
    if (!not_reported(f[F_DRIVER], fl[F_DRIVER])) {
        if (fl[F_DRIVER] < sizeof g->driver && text_ok(f[F_DRIVER], fl[F_DRIVER], ".-"))
            px__copy_text(g->driver, sizeof g->driver, f[F_DRIVER], fl[F_DRIVER]);
        else
            warn(w, NULL, "line %zu: driver_version \"%.*s\" is malformed; ignored", lineno,
                 (int)PX_MIN(fl[F_DRIVER], 32), f[F_DRIVER]);
    }
    g->pcie_gen = integer(f[F_PCIE_GEN], fl[F_PCIE_GEN], 1, 7, lineno, F_PCIE_GEN, w);
    g->pcie_width = integer(f[F_PCIE_WIDTH], fl[F_PCIE_WIDTH], 1, 64, lineno, F_PCIE_WIDTH, w);
    g->catalog = px_hw_nvidia_catalog_id(g->name);
    return true;
}

px_status px_hw_parse_nvidia_smi(const char *text, size_t len, px_hw_nvidia_gpu *gpus,
                                 size_t max_gpus, size_t *n_gpus, px_diags *warnings, px_err *err)
{
    *n_gpus = 0;
    if (len > PX__DISC_MAX_OUTPUT)
        return px_err_set(err, PX_ELIMIT, "nvidia-smi output: %zu bytes, more than the limit of %d",
                          len, PX__DISC_MAX_OUTPUT);
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t n;
    while (px__lines_next(&it, &line, &n)) {
        if (it.lineno > PX__DISC_MAX_LINES) {
            warn(warnings, NULL, "more than %d lines; the rest is ignored", PX__DISC_MAX_LINES);
            break;
        }
        px__trim(&line, &n);
        if (n == 0)
            continue;
        if (n > PX__DISC_MAX_LINE) {
            warn(warnings, NULL, "line %zu: longer than %d bytes; skipped", it.lineno,
                 PX__DISC_MAX_LINE);
            continue;
        }
        if (!clean_line(line, n)) {
            warn(warnings, NULL,
                 "line %zu: holds control or non-ASCII bytes; not a row of nvidia-smi output, "
                 "skipped",
                 it.lineno);
            continue;
        }
        if (says(line, n, "No devices were found"))
            break;
        if (!memchr(line, ',', n)) {
            /* nvidia-smi prints its failures ("NVIDIA-SMI has failed
             * because it couldn't communicate with the NVIDIA driver") in
             * place of rows. */
            warn(warnings, NULL, "line %zu: \"%.*s\"", it.lineno, (int)PX_MIN(n, 200), line);
            continue;
        }
        px_hw_nvidia_gpu g;
        if (!parse_row(line, n, it.lineno, &g, warnings))
            continue;
        bool dup = false;
        for (size_t i = 0; i < *n_gpus; i++)
            if (gpus[i].index == g.index) {
                warn(warnings, NULL, "line %zu: GPU index %d repeats line %zu; skipped", it.lineno,
                     g.index, gpus[i].line);
                dup = true;
            }
        if (dup)
            continue;
        if (*n_gpus >= max_gpus) {
            warn(warnings, NULL, "line %zu: more than %zu GPUs; the rest are ignored", it.lineno,
                 max_gpus);
            break;
        }
        gpus[(*n_gpus)++] = g;
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* nvidia-smi -L                                                       */
/* ------------------------------------------------------------------ */

/* Reads an unsigned decimal at *p (advancing it); false if none. */
static bool read_uint(const char **p, const char *end, int max, int *out)
{
    const char *s = *p;
    long v = 0;
    if (s >= end || *s < '0' || *s > '9')
        return false;
    while (s < end && *s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > max)
            return false;
        s++;
    }
    *p = s;
    *out = (int)v;
    return true;
}

static void skip_spaces(const char **p, const char *end)
{
    while (*p < end && (**p == ' ' || **p == '\t'))
        (*p)++;
}

static bool expect(const char **p, const char *end, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(end - *p) < n || memcmp(*p, word, n))
        return false;
    *p += n;
    return true;
}

/* "MIG 1g.10gb     Device  0: (UUID: MIG-...)", leading spaces trimmed. */
static bool parse_mig_line(const char *s, size_t n, int gpu, px_hw_mig_instance *m)
{
    const char *p = s, *end = s + n;
    memset(m, 0, sizeof *m);
    m->gpu_index = gpu;
    if (!expect(&p, end, "MIG"))
        return false;
    skip_spaces(&p, end);
    const char *prof = p;
    while (p < end && *p != ' ' && *p != '\t')
        p++;
    size_t pl = (size_t)(p - prof);
    if (!pl || pl >= sizeof m->profile || !text_ok(prof, pl, ".+-_"))
        return false;
    px__copy_text(m->profile, sizeof m->profile, prof, pl);
    skip_spaces(&p, end);
    if (!expect(&p, end, "Device"))
        return false;
    skip_spaces(&p, end);
    if (!read_uint(&p, end, 1023, &m->device) || !expect(&p, end, ":"))
        return false;
    skip_spaces(&p, end);
    if (!expect(&p, end, "(UUID:"))
        return false;
    skip_spaces(&p, end);
    const char *u = p;
    while (p < end && *p != ')')
        p++;
    size_t ul = (size_t)(p - u);
    if (p >= end || !ul || ul >= sizeof m->uuid || !text_ok(u, ul, "-/_"))
        return false;
    px__copy_text(m->uuid, sizeof m->uuid, u, ul);
    return true;
}

px_status px_hw_parse_nvidia_smi_list(const char *text, size_t len, px_hw_mig_instance *out,
                                      size_t max, size_t *n, px_diags *warnings, px_err *err)
{
    *n = 0;
    if (len > PX__DISC_MAX_OUTPUT)
        return px_err_set(err, PX_ELIMIT,
                          "nvidia-smi -L output: %zu bytes, more than the limit of %d", len,
                          PX__DISC_MAX_OUTPUT);
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t ll;
    int gpu = -1;
    while (px__lines_next(&it, &line, &ll)) {
        if (it.lineno > PX__DISC_MAX_LINES) {
            warn(warnings, NULL, "nvidia-smi -L: more than %d lines; the rest is ignored",
                 PX__DISC_MAX_LINES);
            break;
        }
        px__trim(&line, &ll);
        if (ll == 0 || ll > PX__DISC_MAX_LINE || !clean_line(line, ll))
            continue;
        const char *p = line, *end = line + ll;
        int idx;
        if (expect(&p, end, "GPU ") && read_uint(&p, end, 1023, &idx) && expect(&p, end, ":")) {
            gpu = idx;
            continue;
        }
        if (ll < 4 || memcmp(line, "MIG ", 4))
            continue;
        px_hw_mig_instance m;
        if (gpu < 0 || !parse_mig_line(line, ll, gpu, &m)) {
            warn(warnings, NULL,
                 gpu < 0 ? "nvidia-smi -L: line %zu: a MIG line before any GPU line; skipped"
                         : "nvidia-smi -L: line %zu: a MIG line that cannot be read; skipped",
                 it.lineno);
            continue;
        }
        if (*n >= max) {
            warn(warnings, NULL,
                 "nvidia-smi -L: more than %zu MIG instances; the rest are "
                 "ignored",
                 max);
            break;
        }
        out[(*n)++] = m;
    }
    return PX_OK;
}
