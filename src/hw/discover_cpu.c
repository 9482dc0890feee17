/* Discovery: the CPU.  Counts, caches and NUMA nodes from hwloc; model,
 * vendor, SIMD flags and clock from /proc/cpuinfo and cpufreq; an
 * estimate of peak throughput that is marked as such. */
#include "hw/discover_impl.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

/* What /proc/cpuinfo says about the first processor. */
typedef struct cpuinfo {
    char vendor[64];
    char model[128];
    double mhz; /* "cpu MHz", the current clock; 0 when absent */
    bool avx512f, avx2, fma, sse2, asimd;
    unsigned processors; /* "processor" lines */
} cpuinfo;

/* Whether a space-separated flag list holds flag. */
static bool has_flag(const char *list, size_t len, const char *flag)
{
    size_t fl = strlen(flag);
    const char *p = list, *end = list + len;
    while (p < end) {
        while (p < end && *p == ' ')
            p++;
        const char *w = p;
        while (p < end && *p != ' ')
            p++;
        if ((size_t)(p - w) == fl && !memcmp(w, flag, fl))
            return true;
    }
    return false;
}

static bool printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

static void read_cpuinfo(const px__disc *d, cpuinfo *ci)
{
    memset(ci, 0, sizeof *ci);
    char *text = NULL;
    size_t len = 0;
    if (px__disc_read(d, "/proc/cpuinfo", 16u << 20, &text, &len, NULL) != PX_OK)
        return;
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t n;
    bool got_flags = false;
    while (px__lines_next(&it, &line, &n) && it.lineno <= 1000000) {
        const char *colon = memchr(line, ':', n);
        if (!colon)
            continue;
        const char *key = line, *val = colon + 1;
        size_t kl = (size_t)(colon - line), vl = n - kl - 1;
        px__trim(&key, &kl);
        px__trim(&val, &vl);
#define KEY(s) (kl == sizeof(s) - 1 && !memcmp(key, s, kl))
        if (KEY("processor")) {
            ci->processors++;
        } else if ((KEY("vendor_id") || KEY("CPU implementer")) && !ci->vendor[0] &&
                   printable(val, vl)) {
            px__copy_text(ci->vendor, sizeof ci->vendor, val, vl);
        } else if (KEY("model name") && !ci->model[0] && printable(val, vl)) {
            px__copy_text(ci->model, sizeof ci->model, val, vl);
        } else if (KEY("cpu MHz") && ci->mhz == 0) {
            char buf[32];
            px__copy_text(buf, sizeof buf, val, vl);
            char *end;
            double v = strtod(buf, &end);
            if (end != buf && isfinite(v) && v > 0 && v < 1e5)
                ci->mhz = v;
        } else if ((KEY("flags") || KEY("Features")) && !got_flags) {
            got_flags = true;
            ci->avx512f = has_flag(val, vl, "avx512f");
            ci->avx2 = has_flag(val, vl, "avx2");
            ci->fma = has_flag(val, vl, "fma");
            ci->sse2 = has_flag(val, vl, "sse2");
            ci->asimd = has_flag(val, vl, "asimd");
        }
#undef KEY
    }
    free(text);
}

/* The highest clock the CPU runs at, in Hz, and where that came from. */
static double cpu_clock(const px__disc *d, const cpuinfo *ci, const char **source)
{
    char *text = NULL;
    size_t len = 0;
    if (px__disc_read(d, "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", 4096, &text, &len,
                      NULL) == PX_OK) {
        char *end;
        double khz = strtod(text, &end);
        free(text);
        if (end != text && isfinite(khz) && khz > 1e4 && khz < 1e8) {
            *source = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq";
            return khz * 1e3;
        }
    }
    /* Intel model names end in the base clock: "... CPU @ 2.10GHz". */
    const char *at = strstr(ci->model, "@ ");
    if (at) {
        char *end;
        double ghz = strtod(at + 2, &end);
        if (end != at + 2 && !strncmp(end, "GHz", 3) && ghz > 0.1 && ghz < 100) {
            *source = "/proc/cpuinfo model name";
            return ghz * 1e9;
        }
    }
    if (ci->mhz > 0) {
        *source = "/proc/cpuinfo cpu MHz (the clock when read)";
        return ci->mhz * 1e6;
    }
    return 0;
}

static const char *vendor_name(const char *v)
{
    if (!strcmp(v, "GenuineIntel"))
        return "intel";
    if (!strcmp(v, "AuthenticAMD"))
        return "amd";
    if (!strcmp(v, "0x41"))
        return "arm";
    if (!strcmp(v, "0x61"))
        return "apple";
    if (!strcmp(v, "0x48"))
        return "hisilicon";
    if (!strcmp(v, "0xc0"))
        return "ampere";
    if (!strcmp(v, "0x4e"))
        return "nvidia";
    return NULL;
}

typedef struct cache_level {
    const char *name; /* "l1d" */
    hwloc_obj_type_t type;
    uint64_t size;  /* one instance */
    unsigned count; /* instances */
} cache_level;

/* The CPUs a cgroup (v2) quota allows, from cpu.max ("max PERIOD" or
 * "QUOTA PERIOD"): 0 when there is no quota or the file is unreadable. */
static double cgroup_cpus(const px__disc *d)
{
    char *text = NULL;
    size_t len = 0;
    if (px__disc_read(d, "/sys/fs/cgroup/cpu.max", 4096, &text, &len, NULL) != PX_OK)
        return 0;
    double quota = 0, period = 0;
    char word[16] = "";
    double cpus = 0;
    if (sscanf(text, "%15s %lf", word, &period) == 2 && strcmp(word, "max") != 0 &&
        sscanf(word, "%lf", &quota) == 1 && quota > 0 && period > 0 && isfinite(quota / period))
        cpus = quota / period;
    free(text);
    return cpus;
}

/* The host's processors for work run on them (node "cpu"): the cores and
 * threads found, each cut to what this process may use: the running
 * system's online CPUs and affinity mask, and a cgroup quota rounded up
 * (a quota of 1.5 CPUs keeps two threads busy part of the time). */
static px_status add_host_cpu(px__disc *d, unsigned cores, unsigned threads)
{
    double usable = threads;
    char source[160] = "hwloc, /proc/cpuinfo";
    if (!d->sysroot[0]) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        CPU_ZERO(&set);
        int mask = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
        if (online > 0 && (usable <= 0 || online < usable))
            usable = (double)online;
        if (mask > 0 && (usable <= 0 || mask < usable))
            usable = mask;
        px_strlcpy(source, "sysconf(_SC_NPROCESSORS_ONLN), sched_getaffinity", sizeof source);
    }
    double quota = cgroup_cpus(d);
    if (quota > 0 && (usable <= 0 || ceil(quota) < usable)) {
        usable = ceil(quota);
        snprintf(source + strlen(source), sizeof source - strlen(source),
                 ", cgroup cpu.max (%.3g CPUs)", quota);
    }
    if (usable < 1)
        return PX_OK;
    double c = cores ? PX_MIN((double)cores, usable) : usable;
    json_t *o = json_object();
    if (px_json_set(d->node, "cpu", o) != PX_OK ||
        px_json_set(o, "cores", px__disc_qty(d, c, PX_DIM_NONE, PX_PROV_DISCOVERED, source, 0)) !=
            PX_OK ||
        px_json_set(o, "threads",
                    px__disc_qty(d, usable, PX_DIM_NONE, PX_PROV_DISCOVERED, source, 0)) != PX_OK)
        return PX_ENOMEM;
    return PX_OK;
}

/* Adds the peak estimate: cores x clock x FLOP per cycle, marked assumed
 * with an interval that covers cores with one or two FMA units and
 * all-core clocks below the maximum. */
static px_status add_estimate(px__disc *d, json_t *dev, const cpuinfo *ci, unsigned cores,
                              double hz)
{
    double per_cycle = 0;
    const char *isa = NULL;
    if (ci->avx512f && ci->fma)
        per_cycle = 32, isa = "avx512f+fma, one 512-bit FMA per cycle";
    else if (ci->avx2 && ci->fma)
        per_cycle = 16, isa = "avx2+fma, one 256-bit FMA per cycle";
    else if (ci->asimd)
        per_cycle = 8, isa = "asimd, one 128-bit FMA per cycle";
    else if (ci->sse2)
        per_cycle = 8, isa = "sse2, one 128-bit add and multiply per cycle";
    if (!per_cycle || !cores || hz <= 0)
        return PX_OK;
    json_t *compute = json_object();
    if (px_json_set(dev, "compute", compute) != PX_OK)
        return PX_ENOMEM;
    static const struct {
        const char *dtype;
        double div;
    } kinds[] = {{"f32", 1}, {"f64", 2}};
    for (size_t i = 0; i < PX_ARRAY_LEN(kinds); i++) {
        double v = cores * hz * per_cycle / kinds[i].div;
        char *src = px_asprintf(
            "estimate: %u cores x %.3g GHz x %g %s FLOP/cycle (%s; cores with two FMA "
            "units reach twice this, sustained all-core clocks are lower); not measured, "
            "run plexus inventory discover --measure",
            cores, hz * 1e-9, per_cycle / kinds[i].div, kinds[i].dtype, isa);
        json_t *q =
            src ? px__disc_qty_interval(d, v, PX_DIM_FLOPS, PX_PROV_ASSUMED, src, 0.75 * v, 2 * v)
                : NULL;
        free(src);
        if (px_json_set(compute, kinds[i].dtype, q) != PX_OK)
            return PX_ENOMEM;
    }
    d->cpu_estimated = true;
    return PX_OK;
}

px_status px__disc_probe_cpu(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    cpuinfo ci;
    read_cpuinfo(d, &ci);

    unsigned packages = 0, cores = 0, threads = 0, numa = 0;
    cache_level caches[] = {{"l1d", HWLOC_OBJ_L1CACHE, 0, 0},
                            {"l1i", HWLOC_OBJ_L1ICACHE, 0, 0},
                            {"l2", HWLOC_OBJ_L2CACHE, 0, 0},
                            {"l3", HWLOC_OBJ_L3CACHE, 0, 0}};
    char hw_model[128] = "", hw_vendor[64] = "";
    char hwloc_problem[160] = "";
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) {
        snprintf(hwloc_problem, sizeof hwloc_problem, "hwloc_topology_init failed: %s",
                 strerror(errno));
    } else if (hwloc_topology_load(topo) != 0) {
        snprintf(hwloc_problem, sizeof hwloc_problem, "hwloc_topology_load failed: %s",
                 strerror(errno));
        hwloc_topology_destroy(topo);
    } else {
        int v;
        packages = (v = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE)) > 0 ? (unsigned)v : 0;
        cores = (v = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE)) > 0 ? (unsigned)v : 0;
        threads = (v = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU)) > 0 ? (unsigned)v : 0;
        numa = (v = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE)) > 0 ? (unsigned)v : 0;
        for (size_t i = 0; i < PX_ARRAY_LEN(caches); i++) {
            int nc = hwloc_get_nbobjs_by_type(topo, caches[i].type);
            for (int j = 0; j < nc; j++) {
                hwloc_obj_t c = hwloc_get_obj_by_type(topo, caches[i].type, (unsigned)j);
                if (!c || !c->attr || !c->attr->cache.size)
                    continue;
                if (!caches[i].size)
                    caches[i].size = c->attr->cache.size;
                caches[i].count++;
            }
        }
        hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
        hwloc_obj_t root = hwloc_get_root_obj(topo);
        const char *m = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
        if (!m && root)
            m = hwloc_obj_get_info_by_name(root, "CPUModel");
        if (m && printable(m, strlen(m))) {
            /* CPUID brand strings are padded with spaces. */
            size_t ml = strlen(m);
            px__trim(&m, &ml);
            px__copy_text(hw_model, sizeof hw_model, m, ml);
        }
        const char *vend = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUVendor") : NULL;
        if (vend && printable(vend, strlen(vend)))
            px_strlcpy(hw_vendor, vend, sizeof hw_vendor);
        hwloc_topology_destroy(topo);
    }
    for (size_t i = PX_ARRAY_LEN(caches); i-- > 0;)
        if (caches[i].count && caches[i].type != HWLOC_OBJ_L1ICACHE) {
            d->llc_bytes = caches[i].size * caches[i].count;
            break;
        }
    if (!threads)
        threads = ci.processors;
    if (!cores)
        cores = threads;
    d->n_threads = threads;
    d->n_cores = cores;
    if (!threads && !ci.model[0] && !hw_model[0])
        return px__disc_record(d, "cpu", PX__PROBE_FAILED, "hwloc, /proc/cpuinfo", t0, NULL,
                               "%s; /proc/cpuinfo unreadable",
                               hwloc_problem[0] ? hwloc_problem : "hwloc found no processors");

    json_t *dev = json_pack("{s:s, s:s, s:s}", "id", "cpu0", "class", "cpu", "backend", "cpu");
    if (!dev || px_json_push(d->devices, dev) != PX_OK)
        return PX_ENOMEM;
    d->cpu = dev;
    const char *vendor = vendor_name(hw_vendor[0] ? hw_vendor : ci.vendor);
    if (vendor && px_json_set(dev, "vendor", json_string(vendor)) != PX_OK)
        return PX_ENOMEM;
    const char *model = hw_model[0] ? hw_model : ci.model;
    if (model[0] && px_json_set(dev, "model", json_string(model)) != PX_OK)
        return PX_ENOMEM;

    json_t *x = json_object();
    if (px_json_set(dev, "x-cpu", x) != PX_OK)
        return PX_ENOMEM;
    if ((packages && px_json_set(x, "packages", json_integer(packages)) != PX_OK) ||
        (cores && px_json_set(x, "cores", json_integer(cores)) != PX_OK) ||
        (threads && px_json_set(x, "threads", json_integer(threads)) != PX_OK) ||
        (numa && px_json_set(x, "numa_nodes", json_integer(numa)) != PX_OK))
        return PX_ENOMEM;
    json_t *jc = json_object();
    if (px_json_set(x, "caches", jc) != PX_OK)
        return PX_ENOMEM;
    for (size_t i = 0; i < PX_ARRAY_LEN(caches); i++) {
        if (!caches[i].count)
            continue;
        json_t *c = json_pack(
            "{s:o, s:i}", "size",
            px__disc_qty(d, (double)caches[i].size, PX_DIM_BYTES, PX_PROV_DISCOVERED, "hwloc", 0),
            "instances", (json_int_t)caches[i].count);
        if (px_json_set(jc, caches[i].name, c) != PX_OK)
            return PX_ENOMEM;
    }
    json_t *flags = json_array();
    if (px_json_set(x, "simd", flags) != PX_OK)
        return PX_ENOMEM;
    const struct {
        bool on;
        const char *name;
    } simd[] = {{ci.sse2, "sse2"},
                {ci.avx2, "avx2"},
                {ci.fma, "fma"},
                {ci.avx512f, "avx512f"},
                {ci.asimd, "asimd"}};
    for (size_t i = 0; i < PX_ARRAY_LEN(simd); i++)
        if (simd[i].on && px_json_push(flags, json_string(simd[i].name)) != PX_OK)
            return PX_ENOMEM;
    const char *clock_src = NULL;
    double hz = cpu_clock(d, &ci, &clock_src);
    if (hz > 0 && px_json_set(x, "frequency",
                              px__disc_qty(d, hz, PX_DIM_FREQUENCY, PX_PROV_DISCOVERED, clock_src,
                                           0)) != PX_OK)
        return PX_ENOMEM;
    if (add_estimate(d, dev, &ci, cores, hz) != PX_OK)
        return PX_ENOMEM;

    if (add_host_cpu(d, cores, threads) != PX_OK)
        return PX_ENOMEM;

    px__probe_status st = hwloc_problem[0] ? PX__PROBE_PARTIAL : PX__PROBE_OK;
    if (hwloc_problem[0] &&
        px__disc_warn(d, "cpu", NULL, "%s; counts come from /proc/cpuinfo", hwloc_problem) != PX_OK)
        return PX_ENOMEM;
    return px__disc_record(d, "cpu", st,
                           hwloc_problem[0] ? "/proc/cpuinfo" : "hwloc, /proc/cpuinfo", t0, NULL,
                           "%s: %u package%s, %u cores, %u threads, %u NUMA node%s",
                           model[0] ? model : "unknown model", packages, packages == 1 ? "" : "s",
                           cores, threads, numa, numa == 1 ? "" : "s");
}
