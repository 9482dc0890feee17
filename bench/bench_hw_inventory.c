/* Benchmark: read + validate and export of a 10,000-device inventory.
 *
 * The inventory is generated in memory: 1,250 nodes of 8 H100s each, every
 * pair of GPUs in a node joined by NVLink (28 links) and every GPU by PCIe
 * to its host, the hosts joined by 400 GbE in a ring with chords, in 125
 * racks under 25 power domains, 5 zones and a region.  Reported: the
 * median of several runs of each step, the graph's own memory (its
 * arena) and the process's peak resident set.  Aims: under 1 s for read,
 * validate and export together, under 200 MB peak.
 *
 * Then a chain of domains, each the parent of the next, 5,000 and 50,000
 * long: validation checks every domain for cycles, and the longer chain
 * must not take a hundred times as long as the shorter (a walk to the
 * root from every domain, quadratic).  Aim: a ratio under 50 (29 to 33
 * measured in cpu time: more than linear, well under quadratic).
 *
 * With an argument NODES it reads, validates and exports one inventory
 * of that many nodes and stops (`chain DOMAINS`: reads one chain): the
 * runs to profile at two sizes.  Under callgrind the instructions per
 * device stay flat (about 515,000 at 800, 3,200 and 10,000 devices) and
 * per domain of a chain too (about 26,000 at 5,000 to 50,000): the time
 * that grows faster comes from memory (page faults, glibc's allocator
 * under jansson's parser), not from more work; tests/unit/test_hw_index.c
 * counts the index's probes per device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "plexus/hw.h"

#define NODES 1250
#define GPUS  8
#define RUNS  5

static char *generate(int n_nodes, size_t *len)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"name\": \"bench-10k\","
                        " \"domains\": [{\"id\": \"region\", \"kind\": \"region\"}");
    for (int z = 0; z < 5; z++)
        px_strbuf_addf(&sb, ", {\"id\": \"zone%d\", \"kind\": \"zone\", \"parent\": \"region\"}",
                       z);
    for (int p = 0; p < 25; p++)
        px_strbuf_addf(&sb,
                       ", {\"id\": \"pdu%d\", \"kind\": \"power\", \"parent\": \"zone%d\","
                       " \"mtbf\": \"300000 h\"}",
                       p, p / 5);
    for (int r = 0; r < (n_nodes + 9) / 10; r++)
        px_strbuf_addf(&sb, ", {\"id\": \"rack%d\", \"kind\": \"rack\", \"parent\": \"zone%d\"}", r,
                       r / 25);
    px_strbuf_adds(&sb, "], \"nodes\": [");
    for (int n = 0; n < n_nodes; n++) {
        px_strbuf_addf(&sb,
                       "%s{\"id\": \"n%d\", \"hostname\": \"h100-%05d\", \"domains\":"
                       " [\"rack%d\", \"pdu%d\"], \"memory\": [{\"id\": \"ddr0\", \"kind\":"
                       " \"ddr\", \"capacity\": \"2 TiB\", \"bandwidth\": \"614 GB/s\"}],"
                       " \"devices\": [",
                       n ? "," : "", n, n, n / 10, n / 50);
        for (int g = 0; g < GPUS; g++)
            px_strbuf_addf(&sb,
                           "%s{\"id\": \"gpu%d\", \"catalog\": \"nvidia-h100-sxm5\","
                           " \"driver\": \"550.54.15\", \"mtbf\": \"50000 h\","
                           " \"live\": {\"memory_free\": \"79 GiB\", \"utilization\": 0.25}}",
                           g ? "," : "", g);
        px_strbuf_adds(&sb, "]}");
    }
    px_strbuf_adds(&sb, "], \"links\": [");
    bool first = true;
    for (int n = 0; n < n_nodes; n++) {
        for (int a = 0; a < GPUS; a++) {
            for (int b = a + 1; b < GPUS; b++) {
                px_strbuf_addf(&sb,
                               "%s{\"from\": \"n%d.gpu%d\", \"to\": \"n%d.gpu%d\","
                               " \"catalog\": \"nvlink-4\", \"latency\": \"1.5 us\","
                               " \"contention\": \"n%d-nvswitch\"}",
                               first ? "" : ",", n, a, n, b, n);
                first = false;
            }
            px_strbuf_addf(&sb,
                           ",{\"from\": \"n%d.gpu%d\", \"to\": \"n%d\", \"catalog\":"
                           " \"pcie-5-x16\", \"latency\": \"2 us\"}",
                           n, a, n);
        }
        px_strbuf_addf(&sb,
                       ",{\"from\": \"n%d\", \"to\": \"n%d\", \"catalog\": \"ethernet-400g\","
                       " \"latency\": \"5 us\"}",
                       n, (n + 1) % n_nodes);
        px_strbuf_addf(&sb,
                       ",{\"from\": \"n%d\", \"to\": \"n%d\", \"catalog\": \"ethernet-400g\","
                       " \"latency\": \"8 us\"}",
                       n, (n + 37) % n_nodes);
    }
    px_strbuf_adds(&sb, "]}");
    return px_strbuf_detach(&sb, len);
}

/* An inventory of `n` domains in a chain, the last one a node's. */
static char *domain_chain(int n, size_t *len)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"name\": \"chain\","
                        " \"domains\": [{\"id\": \"d0\", \"kind\": \"zone\"}");
    for (int i = 1; i < n; i++)
        px_strbuf_addf(&sb, ",{\"id\": \"d%d\", \"kind\": \"zone\", \"parent\": \"d%d\"}", i,
                       i - 1);
    px_strbuf_addf(&sb, "], \"nodes\": [{\"id\": \"n1\", \"domains\": [\"d%d\"]}]}", n - 1);
    return px_strbuf_detach(&sb, len);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Median cpu seconds to read and validate a chain of `n` domains (cpu
 * time: the ratio must not depend on how busy the machine is); negative
 * when it cannot be read. */
static double chain_seconds(int n)
{
    size_t len;
    char *text = domain_chain(n, &len);
    if (!text) {
        fprintf(stderr, "bench_hw_inventory: out of memory generating a chain\n");
        return -1;
    }
    double s[RUNS];
    for (int run = 0; run < RUNS; run++) {
        px_diags diags;
        px_diags_init(&diags);
        px_hw_graph *g;
        px_err err;
        double c0 = cpu_seconds();
        px_status st = px_hw_graph_from_json(text, len, "chain.json", NULL, &g, &diags, &err);
        s[run] = cpu_seconds() - c0;
        px_diags_release(&diags);
        if (st != PX_OK) {
            fprintf(stderr, "bench_hw_inventory: a chain of %d domains: %s\n", n, err.msg);
            free(text);
            return -1;
        }
        px_hw_graph_free(g);
    }
    free(text);
    return median(s, RUNS);
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* One read, validate and export of an inventory of n_nodes nodes, for a
 * profiler (valgrind --tool=callgrind): run at two sizes, the
 * instructions per device should stay flat. */
static int profile_once(int n_nodes)
{
    size_t len, out_len;
    char *text = generate(n_nodes, &len), *out = NULL;
    px_hw_graph *g = NULL;
    px_err err;
    if (!text || px_hw_graph_from_json(text, len, "bench.json", NULL, &g, NULL, &err) != PX_OK ||
        px_hw_graph_export(g, &out, &out_len, &err) != PX_OK) {
        fprintf(stderr, "bench_hw_inventory: %d nodes: %s\n", n_nodes,
                text ? err.msg : "out of memory");
        free(text);
        px_hw_graph_free(g);
        return 1;
    }
    printf("hw inventory: %zu devices read, validated and exported\n",
           px_hw_graph_view(g)->n_devices);
    free(out);
    px_hw_graph_free(g);
    free(text);
    return 0;
}

/* One read and validation of a chain of n domains, for a profiler. */
static int chain_once(int n)
{
    size_t len;
    char *text = domain_chain(n, &len);
    px_hw_graph *g = NULL;
    px_err err;
    if (!text || px_hw_graph_from_json(text, len, "chain.json", NULL, &g, NULL, &err) != PX_OK) {
        fprintf(stderr, "bench_hw_inventory: a chain of %d domains: %s\n", n,
                text ? err.msg : "out of memory");
        free(text);
        return 1;
    }
    printf("hw inventory: a chain of %d domains read and validated\n", n);
    px_hw_graph_free(g);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "chain")) {
        int n = atoi(argv[2]);
        if (n < 2 || n > 1000000) {
            fprintf(stderr, "usage: bench_hw_inventory chain DOMAINS  (2 to 1000000)\n");
            return 2;
        }
        return chain_once(n);
    }
    if (argc > 1) {
        int n = atoi(argv[1]);
        if (n < 1 || n > 100000) {
            fprintf(stderr,
                    "usage: bench_hw_inventory [NODES]  (1 to 100000; without: the "
                    "benchmark of %d nodes)\n",
                    NODES);
            return 2;
        }
        return profile_once(n);
    }
    size_t len;
    char *text = generate(NODES, &len);
    if (!text) {
        fprintf(stderr, "bench_hw_inventory: out of memory generating the inventory\n");
        return 1;
    }
    double base_rss = peak_rss_mb();
    double read_s[RUNS], export_s[RUNS], total_s[RUNS], cpu_s[RUNS];
    double first_peak = 0;
    size_t graph_bytes = 0, export_len = 0, n_devices = 0, n_links = 0;
    for (int run = 0; run < RUNS; run++) {
        px_diags diags;
        px_diags_init(&diags);
        px_hw_graph *g;
        px_err err;
        double c0 = cpu_seconds();
        uint64_t t0 = px_now_ns();
        if (px_hw_graph_from_json(text, len, "bench-10k.json", NULL, &g, &diags, &err) != PX_OK) {
            char *report = px_diags_format(&diags, "bench-10k.json");
            fprintf(stderr, "bench_hw_inventory: %s\n%.4000s", err.msg, report ? report : "");
            return 1;
        }
        uint64_t t1 = px_now_ns();
        char *out;
        if (px_hw_graph_export(g, &out, &export_len, &err) != PX_OK) {
            fprintf(stderr, "bench_hw_inventory: %s\n", err.msg);
            return 1;
        }
        uint64_t t2 = px_now_ns();
        cpu_s[run] = cpu_seconds() - c0;
        read_s[run] = (double)(t1 - t0) / 1e9;
        export_s[run] = (double)(t2 - t1) / 1e9;
        total_s[run] = (double)(t2 - t0) / 1e9;
        graph_bytes = px_hw_graph_memory(g);
        n_devices = px_hw_graph_view(g)->n_devices;
        n_links = px_hw_graph_view(g)->n_links;
        /* The first run's peak is the one a single `plexus inventory
         * export` would see; later runs only add allocator reuse. */
        if (run == 0)
            first_peak = peak_rss_mb();
        free(out);
        px_hw_graph_free(g);
        px_diags_release(&diags);
    }
    double total = median(total_s, RUNS), cpu = median(cpu_s, RUNS);
    printf("hw inventory: %zu devices, %zu directional links, %.1f MB of JSON in, %.1f MB out\n",
           n_devices, n_links, (double)len / 1e6, (double)export_len / 1e6);
    printf("  read + validate   median %.3f s (%d runs)\n", median(read_s, RUNS), RUNS);
    printf("  export            median %.3f s\n", median(export_s, RUNS));
    printf("  together          median %.3f s wall, %.3f s cpu   aim < 1 s: %s\n", total, cpu,
           total < 1.0 ? "met"
           : cpu < 1.0 ? "met in cpu time (the machine is shared)"
                       : "NOT met");
    printf("  graph memory      %.1f MB (arena reserved)\n", (double)graph_bytes / 1e6);
    printf("  peak RSS          %.1f MB (%.1f MB of it the generated input)   aim < 200 MB: %s\n",
           first_peak, base_rss, first_peak < 200 ? "met" : "NOT met");
    free(text);
    double short_s = chain_seconds(5000), long_s = chain_seconds(50000);
    if (short_s < 0 || long_s < 0)
        return 1;
    double ratio = long_s / fmax(short_s, 1e-6);
    printf("  domain chain      5,000: median %.4f s cpu, 50,000: %.4f s, ratio %.1f"
           "   aim < 50 (quadratic: 100): %s\n",
           short_s, long_s, ratio, ratio < 50 ? "met" : "NOT met");
    return 0;
}
