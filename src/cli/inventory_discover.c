/* plexus inventory discover: describes the machine it runs on as an
 * inventory (JSON) or a short summary (text). */
#include "cli/cli.h"

#include "plexus/hw.h"
#include "plexus/rt.h"

static const char cmd[] = "inventory discover";

/* ------------------------------------------------------------------ */
/* The text summary                                                    */
/* ------------------------------------------------------------------ */

/* A quantity's value text, from its string or object form. */
static const char *qty_text(const json_t *q)
{
    if (json_is_string(q))
        return json_string_value(q);
    return json_string_value(json_object_get(q, "value"));
}

static const char *qty_provenance(const json_t *q)
{
    const char *p = json_string_value(json_object_get(q, "provenance"));
    return p ? p : "";
}

/* A quantity with three significant digits in a unit people read. */
static const char *human(const json_t *q, px_dim dim, char *buf, size_t n)
{
    const char *text = qty_text(q);
    px_qty v;
    if (!text || px_qty_parse(text, dim, &v, NULL) != PX_OK)
        return text ? text : "?";
    static const struct {
        px_dim dim;
        double scale;
        const char *unit;
    } units[] = {
        {PX_DIM_BYTES, 1099511627776.0, "TiB"},
        {PX_DIM_BYTES, 1073741824.0, "GiB"},
        {PX_DIM_BYTES, 1048576.0, "MiB"},
        {PX_DIM_BYTES, 1024.0, "KiB"},
        {PX_DIM_BANDWIDTH, 1e12, "TB/s"},
        {PX_DIM_BANDWIDTH, 1e9, "GB/s"},
        {PX_DIM_BANDWIDTH, 1e6, "MB/s"},
        {PX_DIM_FLOPS, 1e12, "TFLOP/s"},
        {PX_DIM_FLOPS, 1e9, "GFLOP/s"},
        {PX_DIM_FLOPS, 1e6, "MFLOP/s"},
        {PX_DIM_FREQUENCY, 1e9, "GHz"},
        {PX_DIM_FREQUENCY, 1e6, "MHz"},
        {PX_DIM_POWER, 1, "W"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(units); i++)
        if (units[i].dim == dim && v.value >= units[i].scale) {
            snprintf(buf, n, "%.3g %s", v.value / units[i].scale, units[i].unit);
            return buf;
        }
    if (dim == PX_DIM_TEMPERATURE) {
        snprintf(buf, n, "%.0f C", v.value - 273.15);
        return buf;
    }
    return text;
}

static const char *str(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

static void print_cpu(const json_t *dev)
{
    char b1[48], b2[48];
    const json_t *x = json_object_get(dev, "x-cpu");
    printf("%-8s %s", str(dev, "id"), json_object_get(dev, "model") ? str(dev, "model") : "CPU");
    long long packages = json_integer_value(json_object_get(x, "packages"));
    long long numa = json_integer_value(json_object_get(x, "numa_nodes"));
    printf(": %lld package%s, %lld cores, %lld threads, %lld NUMA node%s", packages,
           packages == 1 ? "" : "s", (long long)json_integer_value(json_object_get(x, "cores")),
           (long long)json_integer_value(json_object_get(x, "threads")), numa,
           numa == 1 ? "" : "s");
    const json_t *f = json_object_get(x, "frequency");
    if (f)
        printf(", %s", human(f, PX_DIM_FREQUENCY, b1, sizeof b1));
    printf("\n");
    const json_t *caches = json_object_get(x, "caches");
    const char *key;
    const json_t *c;
    bool any = false;
    json_object_foreach((json_t *)caches, key, c)
    {
        printf("%s%s %s x%lld", any ? ", " : "         caches: ", key,
               human(json_object_get(c, "size"), PX_DIM_BYTES, b1, sizeof b1),
               (long long)json_integer_value(json_object_get(c, "instances")));
        any = true;
    }
    if (any)
        printf("\n");
    const json_t *compute = json_object_get(dev, "compute");
    json_object_foreach((json_t *)compute, key, c) printf(
        "         %s %s (%s)\n", key, human(c, PX_DIM_FLOPS, b2, sizeof b2), qty_provenance(c));
}

static void print_gpu(const json_t *dev, const json_t *links, const char *node)
{
    char b1[48], b2[48], b3[48];
    printf("%-8s %s", str(dev, "id"), str(dev, "model"));
    const json_t *mem = json_array_get(json_object_get(dev, "memory"), 0);
    if (mem)
        printf(", %s %s", human(json_object_get(mem, "capacity"), PX_DIM_BYTES, b1, sizeof b1),
               str(mem, "kind"));
    if (json_object_get(dev, "capability"))
        printf(", capability %s", str(dev, "capability"));
    if (json_object_get(dev, "driver"))
        printf(", driver %s", str(dev, "driver"));
    const json_t *tdp = json_object_get(json_object_get(dev, "power"), "tdp");
    if (tdp)
        printf(", %s", human(tdp, PX_DIM_POWER, b2, sizeof b2));
    printf("\n");
    char from[160];
    snprintf(from, sizeof from, "%s.%s", node, str(dev, "id"));
    size_t i;
    const json_t *l;
    json_array_foreach((json_t *)links, i, l) if (!strcmp(str(l, "from"), from))
        printf("         link to %s: %s, %s\n", str(l, "to"), str(l, "kind"),
               human(json_object_get(l, "bandwidth"), PX_DIM_BANDWIDTH, b3, sizeof b3));
    const json_t *live = json_object_get(dev, "live");
    if (live) {
        const json_t *u = json_object_get(live, "utilization");
        printf("         now: %s free",
               json_object_get(live, "memory_free")
                   ? human(json_object_get(live, "memory_free"), PX_DIM_BYTES, b1, sizeof b1)
                   : "?");
        if (u)
            printf(", %.0f%% busy", 100 * json_number_value(u));
        if (json_object_get(live, "temperature"))
            printf(", %s",
                   human(json_object_get(live, "temperature"), PX_DIM_TEMPERATURE, b2, sizeof b2));
        printf("\n");
    }
    const json_t *cat = json_object_get(dev, "catalog");
    const json_t *cand = json_object_get(json_object_get(dev, "x-nvidia"), "catalog_candidate");
    if (cat)
        printf("         catalogue entry %s\n", json_string_value(cat));
    else if (cand)
        printf("         no catalogue entry (%s is not in the catalogue)\n",
               json_string_value(cand));
    const json_t *mig = json_object_get(json_object_get(dev, "x-nvidia"), "mig");
    if (json_array_size(mig))
        printf("         MIG: %zu instances\n", json_array_size(mig));
}

static void print_text(const json_t *inv)
{
    char b1[48], b2[48];
    const json_t *node = json_array_get(json_object_get(inv, "nodes"), 0);
    const json_t *links = json_object_get(inv, "links");
    const char *id = str(node, "id");
    const json_t *os = json_object_get(node, "os");
    printf("node %s", id);
    if (json_object_get(node, "hostname"))
        printf(" (host %s)", str(node, "hostname"));
    if (os)
        printf(": %s, kernel %s", json_object_get(os, "distro") ? str(os, "distro") : "?",
               json_object_get(os, "kernel") ? str(os, "kernel") : "?");
    printf("\n");
    const json_t *load = json_object_get(json_object_get(node, "live"), "load");
    if (load)
        printf("load     %.2f per hardware thread\n", json_number_value(load));
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(node, "memory"), i, v)
    {
        printf("%-8s %s %s", str(v, "id"), str(v, "kind"),
               human(json_object_get(v, "capacity"), PX_DIM_BYTES, b1, sizeof b1));
        const json_t *free_ = json_object_get(json_object_get(node, "live"), "memory_free");
        if (free_)
            printf(", %s available", human(free_, PX_DIM_BYTES, b2, sizeof b2));
        const json_t *bw = json_object_get(v, "bandwidth");
        if (bw)
            printf(", %s (%s)", human(bw, PX_DIM_BANDWIDTH, b2, sizeof b2), qty_provenance(bw));
        printf("\n");
    }
    json_array_foreach(json_object_get(node, "devices"), i, v)
    {
        if (!strcmp(str(v, "class"), "cpu"))
            print_cpu(v);
        else
            print_gpu(v, links, id);
    }
    const json_t *py = json_object_get(node, "python");
    if (py)
        printf("python   %s %s\n", str(py, "path"), str(py, "version"));
    const json_t *fws = json_object_get(node, "frameworks");
    if (json_array_size(fws)) {
        printf("frameworks");
        json_array_foreach(fws, i, v)
            printf("%s %s%s%s", i ? "," : "", str(v, "name"),
                   json_object_get(v, "version") ? " " : "", str(v, "version"));
        printf("\n");
    }
    printf("probes\n");
    json_array_foreach(json_object_get(node, "x-probes"), i, v)
        printf("  %-8s %-8s %-9s %s\n", str(v, "probe"), str(v, "status"), str(v, "duration"),
               str(v, "message"));
}

/* ------------------------------------------------------------------ */
/* The command                                                         */
/* ------------------------------------------------------------------ */

/* ------------------------------------------------------------------ */
/* Discovery against the CUDA runtime                                  */
/* ------------------------------------------------------------------ */

/* Each NVIDIA GPU that discovery found (the nvidia-smi on PATH) is compared with what
 * the CUDA runtime reports for it, in PCI bus order as nvidia-smi numbers
 * them; a mismatch, or a GPU the runtime cannot open, is a warning. */
static void crosscheck_gpus(const json_t *inv, px_diags *report)
{
    if (!px_rt_cuda_built())
        return;
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    size_t i, j;
    const json_t *node, *dev;
    json_array_foreach(json_object_get(inv, "nodes"), i, node)
    {
        json_array_foreach(json_object_get(node, "devices"), j, dev)
        {
            const char *id = str(dev, "id"), *backend = str(dev, "backend");
            if (!id || !backend || strcmp(backend, "cuda") || strncmp(id, "gpu", 3))
                continue;
            uint32_t ordinal = (uint32_t)strtoul(id + 3, NULL, 10);
            px_rt_cuda_info smi = {.memory_total = NAN, .clock_max_sm = NAN}, rt;
            px_strlcpy(smi.name, str(dev, "model") ? str(dev, "model") : "", sizeof smi.name);
            px_strlcpy(smi.capability, str(dev, "capability") ? str(dev, "capability") : "",
                       sizeof smi.capability);
            const char *cap = qty_text(
                json_object_get(json_array_get(json_object_get(dev, "memory"), 0), "capacity"));
            px_qty q;
            if (cap && px_qty_parse(cap, PX_DIM_BYTES, &q, NULL) == PX_OK)
                smi.memory_total = q.value;
            px_err err;
            if (px_rt_cuda_query(ordinal, &rt, &err) != PX_OK) {
                char ptr[64];
                snprintf(ptr, sizeof ptr, "/%s", id);
                (void)px_diags_add(
                    report, PX_SEV_WARNING, ptr, "check the driver and CUDA_VISIBLE_DEVICES",
                    "nvidia-smi lists %s but the CUDA runtime cannot open it: %s", id, err.msg);
                continue;
            }
            (void)px_rt_cuda_crosscheck(&smi, &rt, ordinal, report);
        }
    }
}

typedef struct discover_args {
    px_hw_discover_options opt;
    px_cli_format format;
    px_cli_list python;
    bool no_interpreter, no_gpu;
} discover_args;

static discover_args D;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &D.format, "FORMAT",
               "the inventory as canonical JSON (default) or YAML, or a\ntext summary",
               .choices = "json|text|yaml"),
    PX_CLI_OPT("measure", 0, PX_CLI_FLAG, &D.opt.measure, NULL,
               "also run short microbenchmarks: memory bandwidth (triad)\n"
               "and f32 throughput, on one thread and on all"),
    PX_CLI_OPT("measure-seconds", 0, PX_CLI_TIME, &D.opt.measure_seconds, "TIME",
               "time per microbenchmark (default 0.5s)", .lo = 1e-6, .hi = 600),
    PX_CLI_OPT("python", 0, PX_CLI_LIST, &D.python, "PREFIX",
               "also scan this prefix (a virtual or conda environment,\n"
               "or a site-packages folder); repeatable"),
    PX_CLI_OPT("interpreter", 0, PX_CLI_STR, &D.opt.python, "PATH",
               "the python3 whose sys.path is scanned (default: python3\non PATH)"),
    PX_CLI_OPT("no-interpreter", 0, PX_CLI_FLAG, &D.no_interpreter, NULL,
               "scan only the --python prefixes"),
    PX_CLI_OPT("nvidia-smi", 0, PX_CLI_STR, &D.opt.nvidia_smi, "PATH",
               "the nvidia-smi to run (default: nvidia-smi on PATH)"),
    PX_CLI_OPT("no-gpu", 0, PX_CLI_FLAG, &D.no_gpu, NULL, "skip the GPU probe"),
    PX_CLI_OPT("sysroot", 0, PX_CLI_STR, &D.opt.sysroot, "DIR",
               "read /proc, /sys and /etc under DIR (recorded trees)"),
    PX_CLI_OPT("node", 0, PX_CLI_STR, &D.opt.node_id, "ID",
               "the node's id (default: from the host name)"),
    PX_CLI_OPT("timeout", 0, PX_CLI_TIME, &D.opt.command_timeout, "TIME",
               "limit on each external command (default 10s)", .lo = 1e-6, .hi = 3600),
    {0},
};

const px_cli_spec px__inventory_discover_spec = {
    .name = "inventory discover",
    .summary = "describe this machine as an inventory",
    .synopsis = "[-o json|text|yaml] [--measure] [--python PREFIX]... [options]",
    .about = "Describes this machine as a plexus.inventory/1 document with one node: the CPU\n"
             "(hwloc, /proc/cpuinfo), memory (/proc/meminfo), NVIDIA GPUs and their PCIe\n"
             "links (nvidia-smi), the Python frameworks installed (package metadata, never\n"
             "imported) and the operating system.  Every figure says where it came from.  A\n"
             "probe that fails is reported on stderr and under the node's \"x-probes\";\n"
             "discovery goes on.",
    .opts = opts,
    .more = "Exit status: 0 when the inventory was written (probes may have failed), 1 when it\n"
            "could not be, 2 on bad usage.",
    .examples = "plexus inventory discover > this-node.json\n"
                "plexus inventory discover -o text --measure\n",
};

int px__cmd_inventory_discover(int argc, char **argv)
{
    memset(&D, 0, sizeof D);
    D.format = PX_CLI_JSON;
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&px__inventory_discover_spec, argc, argv, &args, &rc))
        return rc;
    for (size_t i = 0; i < D.python.n; i++)
        if (!D.python.v[i][0])
            return px__cli_usage_error(cmd, "--python needs a folder");
    px_hw_discover_options opt = D.opt;
    px_cli_format format = D.format;
    if (D.no_interpreter)
        opt.python = "";
    if (D.no_gpu)
        opt.nvidia_smi = "";
    const char **prefixes = calloc(D.python.n + 1, sizeof *prefixes);
    if (!prefixes) {
        fprintf(stderr, "plexus %s: out of memory\n", cmd);
        return PX_EXIT_FAIL;
    }
    for (size_t i = 0; i < D.python.n; i++)
        prefixes[opt.n_python_prefixes++] = D.python.v[i];
    opt.python_prefixes = prefixes;

    px_diags report;
    px_diags_init(&report);
    json_t *inv = NULL;
    px_err err;
    if (px_hw_discover(&opt, &inv, &report, &err) != PX_OK) {
        rc = px__cli_fail(cmd, &err);
    } else {
        /* Only the nvidia-smi on PATH speaks for this machine's GPUs. */
        if (!opt.nvidia_smi)
            crosscheck_gpus(inv, &report);
        if (format == PX_CLI_JSON) {
            rc = px__cli_print_json(inv);
            if (rc == PX_EXIT_OK)
                fputc('\n', stdout);
        } else if (format == PX_CLI_YAML) {
            rc = px__cli_print_doc(inv, format);
        } else {
            print_text(inv);
        }
        if (fflush(stdout) != 0) {
            fprintf(stderr, "plexus %s: cannot write the output: %s\n", cmd, strerror(errno));
            rc = PX_EXIT_FAIL;
        }
    }
    for (size_t i = 0; i < report.n; i++) {
        const px_diag *dg = &report.items[i];
        fprintf(stderr, "plexus %s: warning: %s", cmd, dg->message);
        if (dg->fix)
            fprintf(stderr, " (fix: %s)", dg->fix);
        fputc('\n', stderr);
    }
    json_decref(inv);
    px_diags_release(&report);
    free(prefixes);
    return rc;
}
