/*
 * plexus/hw.h: the hardware graph.
 *
 * One graph describes the hardware plexus can place work on: nodes
 * (machines) holding devices (GPUs, CPUs, NPUs, TPUs, FPGAs) and memory
 * tiers, directional links between devices and nodes, and domains (power,
 * cooling, rack, zone, region) that fail or throttle together.  Every
 * number is a px_qty with its provenance and uncertainty.  Graphs are read
 * from `plexus.inventory/1` JSON (docs/formats/inventory.md), checked
 * against every rule of that format at once, and exported back in a
 * canonical form whose SHA-256 is a stable content id.
 *
 * A device may name an entry of the built-in device catalogue
 * (`"catalog": "nvidia-h100-sxm5"`) whose sourced figures fill in what the
 * inventory leaves out; the inventory's own members override it.
 *
 *     px_diags diags;
 *     px_diags_init(&diags);
 *     px_hw_graph *g;
 *     px_err err;
 *     if (px_hw_graph_load("inventory.json", NULL, &g, &diags, &err) != PX_OK) {
 *         char *report = px_diags_format(&diags, "inventory.json");
 *         fputs(report ? report : err.msg, stderr);
 *         free(report);
 *     } else {
 *         const px_hw_view *v = px_hw_graph_view(g);
 *         for (size_t i = 0; i < v->n_devices; i++)
 *             printf("%s %g B\n", v->devices[i].global_id,
 *                    px_hw_device_memory_capacity(&v->devices[i]));
 *         uint32_t a, b;
 *         px_hw_path path;
 *         if (px_hw_graph_find_endpoint(g, "n1.gpu0", &a) &&
 *             px_hw_graph_find_endpoint(g, "n2.gpu0", &b) &&
 *             px_hw_graph_path(g, a, b, PX_HW_PATH_WIDEST, 0, &path, &err) == PX_OK) {
 *             printf("%g B/s, %g s\n", path.bandwidth, path.latency);
 *             px_hw_path_release(&path);
 *         }
 *         px_hw_graph_free(g);
 *     }
 *     px_diags_release(&diags);
 *
 * A graph is immutable once built: every pointer reachable from its view
 * stays valid and unchanged until px_hw_graph_free, and any number of
 * threads may read one graph at once.  Strings and arrays in the view live
 * in the graph's arena; callers never free them.
 */
#ifndef PLEXUS_HW_H
#define PLEXUS_HW_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An index that refers to nothing (no parent domain, no contention group). */
#define PX_HW_NONE UINT32_MAX

/* Whether a quantity of the view is present.  Absent quantities are all
 * zero, so their dim is PX_DIM_NONE; present ones always carry their
 * dimension (a compute rate is PX_DIM_FLOPS, a capacity PX_DIM_BYTES). */
#define px_hw_has(q) ((q).dim != PX_DIM_NONE)

/* ------------------------------------------------------------------ */
/* Enumerations and their names                                        */
/* ------------------------------------------------------------------ */

/* Number formats a device computes in; compute[] is indexed by these. */
typedef enum px_hw_dtype {
    PX_HW_DTYPE_F64 = 0,
    PX_HW_DTYPE_F32,
    PX_HW_DTYPE_TF32,
    PX_HW_DTYPE_BF16,
    PX_HW_DTYPE_F16,
    PX_HW_DTYPE_FP8,
    PX_HW_DTYPE_INT8,
    PX_HW_DTYPE_INT4,
    PX_HW_DTYPE_COUNT
} px_hw_dtype;

typedef enum px_hw_class {
    PX_HW_CLASS_GPU = 0,
    PX_HW_CLASS_CPU,
    PX_HW_CLASS_NPU,
    PX_HW_CLASS_TPU,
    PX_HW_CLASS_FPGA,
    PX_HW_CLASS_COUNT
} px_hw_class;

/* Memory tier kinds.  hbm, gddr, sram are device-local; ddr is device-local
 * (unified memory) or a node's; cxl, nvme, remote belong to nodes. */
typedef enum px_hw_mem_kind {
    PX_HW_MEM_HBM = 0,
    PX_HW_MEM_GDDR,
    PX_HW_MEM_DDR,
    PX_HW_MEM_SRAM,
    PX_HW_MEM_CXL,
    PX_HW_MEM_NVME,
    PX_HW_MEM_REMOTE,
    PX_HW_MEM_COUNT
} px_hw_mem_kind;

typedef enum px_hw_link_kind {
    PX_HW_LINK_NVLINK3 = 0,
    PX_HW_LINK_NVLINK4,
    PX_HW_LINK_NVLINK5,
    PX_HW_LINK_INFINITY_FABRIC,
    PX_HW_LINK_PCIE3,
    PX_HW_LINK_PCIE4,
    PX_HW_LINK_PCIE5,
    PX_HW_LINK_ETHERNET,
    PX_HW_LINK_INFINIBAND,
    PX_HW_LINK_ICI,
    PX_HW_LINK_CXL,
    PX_HW_LINK_LOOPBACK,
    PX_HW_LINK_OTHER,
    PX_HW_LINK_COUNT
} px_hw_link_kind;

typedef enum px_hw_domain_kind {
    PX_HW_DOMAIN_POWER = 0,
    PX_HW_DOMAIN_COOLING,
    PX_HW_DOMAIN_RACK,
    PX_HW_DOMAIN_ZONE,
    PX_HW_DOMAIN_REGION,
    PX_HW_DOMAIN_COUNT
} px_hw_domain_kind;

typedef enum px_hw_trust {
    PX_HW_TRUST_TRUSTED = 0,
    PX_HW_TRUST_ENCRYPTED,
    PX_HW_TRUST_UNTRUSTED,
    PX_HW_TRUST_COUNT
} px_hw_trust;

/* Each returns the format's spelling ("bf16", "gpu", "hbm", "nvlink4",
 * "rack", "trusted"), or "unknown" for a value out of range; never NULL. */
const char *px_hw_dtype_name(px_hw_dtype dt);
const char *px_hw_class_name(px_hw_class c);
const char *px_hw_mem_kind_name(px_hw_mem_kind k);
const char *px_hw_link_kind_name(px_hw_link_kind k);
const char *px_hw_domain_kind_name(px_hw_domain_kind k);
const char *px_hw_trust_name(px_hw_trust t);
/* Each parses the format's spelling; PX_ENOTFOUND for anything else (out is
 * then unchanged).  No err: callers word the message with the place. */
PX_NODISCARD px_status px_hw_dtype_parse(const char *text, px_hw_dtype *out);
PX_NODISCARD px_status px_hw_class_parse(const char *text, px_hw_class *out);
PX_NODISCARD px_status px_hw_mem_kind_parse(const char *text, px_hw_mem_kind *out);
PX_NODISCARD px_status px_hw_link_kind_parse(const char *text, px_hw_link_kind *out);
PX_NODISCARD px_status px_hw_domain_kind_parse(const char *text, px_hw_domain_kind *out);
PX_NODISCARD px_status px_hw_trust_parse(const char *text, px_hw_trust *out);
/* Whether a link kind is an NVLink generation. */
bool px_hw_link_kind_is_nvlink(px_hw_link_kind k);

/* ------------------------------------------------------------------ */
/* The read-only view                                                  */
/* ------------------------------------------------------------------ */

/* Every element records `where`, the RFC 6901 pointer of its declaration
 * in the input ("/nodes/0/devices/1"), so that later stages (the planner,
 * the scheduler) can point their own messages at the inventory. */

typedef struct px_hw_mem_tier {
    const char *id;        /* local id, "hbm" */
    const char *global_id; /* "n1.gpu0.hbm" or "n1.ddr0" */
    px_hw_mem_kind kind;
    px_qty capacity;  /* bytes; always present */
    px_qty bandwidth; /* B/s, sustained; may be absent */
    px_qty latency;   /* s; may be absent */
    const char *where;
} px_hw_mem_tier;

/* The last observed load of a node or device.  Never capacity, only
 * headroom.  Absent numbers are NAN; absent quantities are zero. */
typedef struct px_hw_live {
    bool present;       /* the input had a "live" member */
    px_qty memory_free; /* bytes */
    double load;        /* node: load average per core; NAN when absent */
    double utilization; /* device: 0..1; NAN when absent */
    px_qty temperature; /* device: K */
} px_hw_live;

typedef struct px_hw_framework {
    const char *name;    /* "torch", "torch.cuda" */
    const char *version; /* may be NULL */
    const char *python;  /* interpreter it is installed for; may be NULL */
} px_hw_framework;

typedef struct px_hw_node {
    const char *id;
    const char *hostname;    /* may be NULL */
    bool emulated;           /* the node itself, or the whole inventory, is emulated */
    const uint32_t *domains; /* indices into view->domains, as declared */
    size_t n_domains;
    const px_hw_mem_tier *memory; /* the node's own tiers (ddr, cxl, nvme, remote) */
    size_t n_memory;
    const px_hw_framework *frameworks;
    size_t n_frameworks;
    const char *python_path, *python_version; /* may be NULL */
    const char *os_kernel, *os_distro;        /* may be NULL */
    px_hw_live live;
    /* The host's processors for work that runs on them (cpu devices, the
     * emulated devices' kernels, stage workers and servers): cores and
     * hardware threads usable here, a cgroup quota or affinity mask
     * applied.  Plain numbers (PX_DIM_NONE) with provenance; value 0 when
     * the input gave none. */
    px_qty cpu_cores, cpu_threads;
    const uint32_t *devices; /* indices into view->devices, sorted by id */
    size_t n_devices;
    uint32_t endpoint; /* this node's host side as a link endpoint */
    const char *where;
} px_hw_node;

typedef struct px_hw_device {
    const char *id;        /* local id, "gpu0" */
    const char *global_id; /* "n1.gpu0" */
    uint32_t node;         /* index into view->nodes; PX_HW_NONE in the catalogue */
    px_hw_class cls;
    const char *vendor, *model; /* may be NULL */
    const char *catalog;        /* catalogue entry id, or NULL */
    bool emulated;              /* the device, its node or the inventory is emulated */
    const char *backend;        /* "cpu", "emu", "cuda"; may be NULL */
    const char *capability;     /* "9.0", "gfx942"; may be NULL */
    /* Peak dense throughput per dtype; absent (px_hw_has false, value 0)
     * when the device cannot compute in that dtype or nobody said. */
    px_qty compute[PX_HW_DTYPE_COUNT];
    const px_hw_mem_tier *memory; /* device-local tiers, sorted by id */
    size_t n_memory;
    /* Supported op kinds and kernel libraries, sorted.  all_ops is true when
     * the input gave no "ops": the device runs every standard op. */
    const char *const *ops;
    size_t n_ops;
    bool all_ops;
    const char *const *kernels;
    size_t n_kernels;
    const char *runtime_name, *runtime_version, *driver; /* may be NULL */
    px_qty power_tdp, power_idle;                        /* W */
    px_qty thermal_limit, thermal_time_constant;         /* K, s */
    px_qty cost;                                         /* $/h */
    px_qty mtbf;                                         /* s */
    /* Domains the device is in: its own and its node's, sorted, no repeats
     * (indices into view->domains). */
    const uint32_t *domains;
    size_t n_domains;
    px_hw_live live;
    uint32_t endpoint; /* this device as a link endpoint */
    const char *where;
    /* The emulation profile of an emulated device ("emu" member): the emu
     * backend runs the cpu kernels and stretches each op's time by the
     * slowdown of its class.  present is false when the input had none. */
    struct {
        bool present;
        double compute_slowdown; /* >= 1 */
        double memory_slowdown;  /* >= 1 */
        double jitter;           /* in [0, 1) */
        uint64_t seed;
    } emu;
} px_hw_device;

/* A directional edge.  A bidirectional declaration becomes two edges with
 * the same id and figures; the second has reverse set. */
typedef struct px_hw_link {
    const char *id;    /* declared id, or NULL when the input gave none */
    uint32_t from, to; /* endpoints */
    px_hw_link_kind kind;
    const char *catalog;            /* catalogue entry id, or NULL */
    px_qty bandwidth;               /* B/s per direction; always present */
    px_qty latency;                 /* s; may be absent */
    px_qty setup;                   /* s per transfer; may be absent */
    uint32_t contention;            /* index into view->contention, or PX_HW_NONE */
    const char *const *collectives; /* sorted */
    size_t n_collectives;
    const char *failure_group; /* may be NULL */
    px_qty energy_per_byte;    /* J; may be absent */
    double dollars_per_gb;     /* 0 when absent */
    px_hw_trust trust;
    bool bidirectional; /* declared bidirectional (two edges exist) */
    bool reverse;       /* the generated reverse edge of such a declaration */
    const char *where;
} px_hw_link;

typedef struct px_hw_domain {
    const char *id;
    px_hw_domain_kind kind;
    uint32_t parent; /* index into view->domains, or PX_HW_NONE */
    px_qty mtbf;     /* s; may be absent */
    const char *where;
} px_hw_domain;

/* An endpoint is a device or a node's host side.  Endpoint indices
 * 0 .. n_devices-1 are devices (endpoint i is device i); n_devices ..
 * n_devices+n_nodes-1 are nodes (endpoint n_devices+j is node j). */
typedef struct px_hw_view {
    const char *name;        /* may be NULL */
    const char *description; /* may be NULL */
    bool emulated;           /* the whole inventory is emulated */
    const px_hw_node *nodes; /* sorted by id */
    size_t n_nodes;
    const px_hw_device *devices; /* sorted by global id */
    size_t n_devices;
    const px_hw_link *links; /* directional edges, sorted by (from, to, id) */
    size_t n_links;
    const px_hw_domain *domains; /* sorted by id */
    size_t n_domains;
    const char *const *contention; /* contention group names, sorted */
    size_t n_contention;
    size_t n_endpoints; /* n_devices + n_nodes */
} px_hw_view;

/* ------------------------------------------------------------------ */
/* The graph                                                           */
/* ------------------------------------------------------------------ */

typedef struct px_hw_graph px_hw_graph;
typedef struct px_hw_catalog px_hw_catalog;

/* Reading options; NULL or zero fields take the defaults. */
typedef struct px_hw_read_options {
    /* Bounds on the JSON; zero fields take the format's limits (64 MiB,
     * 32 levels, 4 KiB strings, 1,000,000 elements).  Tighter limits are
     * honoured; looser ones are not: the format's limits always apply. */
    px_json_limits limits;
    /* The catalogue that "catalog" members name; NULL: the built-in one.
     * Borrowed for the call only. */
    const px_hw_catalog *catalog;
    /* Treat warnings as errors. */
    bool strict;
} px_hw_read_options;

/* Reads an inventory document of len bytes (need not be NUL-terminated).
 * name labels messages ("inventory.json").  Checks every rule of the
 * format and adds each problem to diags (caller-initialized; may be NULL,
 * then only err says what went wrong).  On success *out is a new graph
 * (returns owned: px_hw_graph_free) and diags may hold warnings.
 * Returns PX_OK; PX_EVALIDATE when any error was found (err summarizes:
 * the count and the first); PX_EPARSE or PX_ELIMIT when the text is not
 * JSON or breaks a size limit (one diagnostic says where); PX_ENOMEM.
 * On failure *out is NULL. */
PX_NODISCARD px_status px_hw_graph_from_json(const char *json, size_t len, const char *name,
                                             const px_hw_read_options *options, px_hw_graph **out,
                                             px_diags *diags, px_err *err);
/* Like px_hw_graph_from_json with an already parsed document (borrowed). */
PX_NODISCARD px_status px_hw_graph_from_value(const json_t *doc, const char *name,
                                              const px_hw_read_options *options, px_hw_graph **out,
                                              px_diags *diags, px_err *err);
/* Reads and checks a file (at most 64 MiB): px_hw_graph_from_json on its
 * bytes, named by path.  PX_EIO when it cannot be read. */
PX_NODISCARD px_status px_hw_graph_load(const char *path, const px_hw_read_options *options,
                                        px_hw_graph **out, px_diags *diags, px_err *err);
/* Frees the graph and everything its view points to.  NULL is a no-op. */
void px_hw_graph_free(px_hw_graph *g);

/* Runs the semantic rules (plausibility, contradictions with the
 * catalogue and between links and their ends, domain cycles) on a built
 * graph again and adds each problem to diags.  Reading already ran them;
 * this is for graphs a caller keeps and wants to re-check against another
 * catalogue (NULL: the built-in one).  Returns PX_OK when no error was
 * added, PX_EVALIDATE otherwise. */
PX_NODISCARD px_status px_hw_graph_validate(const px_hw_graph *g, const px_hw_catalog *catalog,
                                            px_diags *diags, px_err *err);

/* The graph's contents.  Borrowed; valid until px_hw_graph_free. */
const px_hw_view *px_hw_graph_view(const px_hw_graph *g);
/* The name the graph was read under ("inventory.json"); never NULL. */
const char *px_hw_graph_source(const px_hw_graph *g);

/* Lookups by id, O(1).  Each returns true and sets *index when found.
 * Devices by global id ("n1.gpu0"); nodes and domains by id; endpoints by
 * a device's global id or a node's id. */
bool px_hw_graph_find_device(const px_hw_graph *g, const char *global_id, uint32_t *index);
bool px_hw_graph_find_node(const px_hw_graph *g, const char *id, uint32_t *index);
bool px_hw_graph_find_domain(const px_hw_graph *g, const char *id, uint32_t *index);
bool px_hw_graph_find_endpoint(const px_hw_graph *g, const char *id, uint32_t *endpoint);
/* The name of an endpoint: a device's global id or a node's id; "?" when
 * out of range.  Borrowed. */
const char *px_hw_graph_endpoint_name(const px_hw_graph *g, uint32_t endpoint);
/* The outgoing edges of an endpoint as indices into view->links, sorted by
 * the index of their far end.  Borrowed; *n is 0 for an endpoint out of
 * range. */
const uint32_t *px_hw_graph_out_links(const px_hw_graph *g, uint32_t endpoint, size_t *n);

/* Bytes of memory the graph holds (its arena's reservation), for
 * capacity planning and benchmarks. */
size_t px_hw_graph_memory(const px_hw_graph *g);
/* Sum of the capacities of every device-local memory tier, in bytes. */
double px_hw_graph_total_device_memory(const px_hw_graph *g);
/* Sum of a device's local tier capacities, in bytes. */
double px_hw_device_memory_capacity(const px_hw_device *d);
/* The highest bandwidth among a device's local tiers, in B/s (0 if none). */
double px_hw_device_memory_bandwidth(const px_hw_device *d);
/* Peak throughput in dt in FLOP/s (or OP/s), 0 when absent. */
double px_hw_device_peak(const px_hw_device *d, px_hw_dtype dt);

/* Canonical export: nodes, devices, tiers, links and domains sorted by id;
 * every quantity in SI units with its provenance; catalogue values written
 * out in full with their citations; bidirectional declarations kept as
 * one entry.  Equal graphs export byte-identical documents, and reading
 * an export back exports it unchanged.  *text (returns owned: free()) is
 * the document as px_json_dump_canonical prints it, newline-terminated,
 * written directly (fast for large graphs); *len its length (len may be
 * NULL).  PX_ENOMEM. */
PX_NODISCARD px_status px_hw_graph_export(const px_hw_graph *g, char **text, size_t *len,
                                          px_err *err);
/* The same document as a jansson tree.  Returns a new reference in *out;
 * PX_ENOMEM. */
PX_NODISCARD px_status px_hw_graph_to_json(const px_hw_graph *g, json_t **out, px_err *err);
/* SHA-256 of the canonical export text, as 64 hex digits: the graph's
 * content id.  PX_ENOMEM. */
PX_NODISCARD px_status px_hw_graph_digest(const px_hw_graph *g, char out[65], px_err *err);

/* ------------------------------------------------------------------ */
/* Paths                                                               */
/* ------------------------------------------------------------------ */

typedef enum px_hw_path_metric {
    /* Least time to move `bytes`, each hop costing latency + setup +
     * bytes / bandwidth (store and forward); bytes = 0 gives the path of
     * least latency. */
    PX_HW_PATH_FASTEST = 0,
    /* Greatest bottleneck bandwidth; ties go to the lower latency. */
    PX_HW_PATH_WIDEST,
} px_hw_path_metric;

/* A route between two endpoints.  Value struct: px_hw_path_release. */
typedef struct px_hw_path {
    uint32_t *links; /* edges in order, indices into view->links (malloc'd) */
    size_t n_links;
    double bandwidth; /* B/s, the minimum along the path (INFINITY if empty) */
    double latency;   /* s, the sum of latencies and setups along the path */
} px_hw_path;

/* Finds the best path from endpoint `from` to `to` by metric (Dijkstra
 * over the directional edges, O(E log V)).  from == to gives an empty
 * path.  On success *out holds owned memory (px_hw_path_release).
 * Returns PX_EINVAL for an endpoint out of range, PX_ENOTFOUND when `to`
 * is unreachable (err names both ends), PX_ENOMEM. */
PX_NODISCARD px_status px_hw_graph_path(const px_hw_graph *g, uint32_t from, uint32_t to,
                                        px_hw_path_metric metric, double bytes, px_hw_path *out,
                                        px_err *err);
/* Frees path->links and zeroes the struct.  NULL is a no-op. */
void px_hw_path_release(px_hw_path *path);

/* ------------------------------------------------------------------ */
/* The device catalogue                                                */
/* ------------------------------------------------------------------ */

/* Catalogue entries are devices and links with every figure sourced
 * (provenance datasheet and a citation).  A device entry is a px_hw_device
 * whose node is PX_HW_NONE and whose id and global_id are the entry id; a
 * link entry is a px_hw_link whose endpoints are PX_HW_NONE. */

/* Parses the catalogue built into the library (data/catalog/ at build
 * time).  Returns owned memory (px_hw_catalog_free); PX_ENOMEM, or
 * PX_EINTERNAL if the embedded data is broken (a build defect). */
PX_NODISCARD px_status px_hw_catalog_new_builtin(px_hw_catalog **out, px_err *err);
/* Reads catalogue entries from JSON texts, one entry per text, each named
 * for messages.  For tests and for sites with their own entries.  Problems
 * go to diags (may be NULL).  PX_EVALIDATE when an entry is invalid. */
PX_NODISCARD px_status px_hw_catalog_new_from_texts(const char *const *texts,
                                                    const char *const *names, size_t n,
                                                    px_hw_catalog **out, px_diags *diags,
                                                    px_err *err);
/* NULL is a no-op. */
void px_hw_catalog_free(px_hw_catalog *cat);

/* Entries, sorted by id.  Borrowed; valid until px_hw_catalog_free. */
size_t px_hw_catalog_n_devices(const px_hw_catalog *cat);
const px_hw_device *px_hw_catalog_device(const px_hw_catalog *cat, size_t i);
size_t px_hw_catalog_n_links(const px_hw_catalog *cat);
const px_hw_link *px_hw_catalog_link(const px_hw_catalog *cat, size_t i);
/* Lookups by entry id; NULL when absent.  Borrowed. */
const px_hw_device *px_hw_catalog_find_device(const px_hw_catalog *cat, const char *id);
const px_hw_link *px_hw_catalog_find_link(const px_hw_catalog *cat, const char *id);
/* {"schema": "plexus.catalog/1", "devices": [...], "links": [...]}, every
 * figure with its citation, as canonical text (returns owned: free(); len
 * may be NULL) or as a tree (new reference).  PX_ENOMEM. */
PX_NODISCARD px_status px_hw_catalog_export(const px_hw_catalog *cat, char **text, size_t *len,
                                            px_err *err);
PX_NODISCARD px_status px_hw_catalog_to_json(const px_hw_catalog *cat, json_t **out, px_err *err);

/* ------------------------------------------------------------------ */
/* Local discovery                                                     */
/* ------------------------------------------------------------------ */

/* Discovery describes the machine it runs on as a one-node inventory
 * document (`plexus.inventory/1`, docs/formats/inventory.md): the CPU and
 * its caches and NUMA nodes (hwloc, /proc/cpuinfo), the node's memory
 * (/proc/meminfo), NVIDIA GPUs and their PCIe links (nvidia-smi), the
 * Python frameworks installed (package metadata, read as text, never
 * imported), the operating system and, on request, short
 * microbenchmarks of memory bandwidth and f32 throughput.
 *
 * Every number carries its provenance: "discovered" with the command or
 * file it came from, "measured" for the microbenchmarks, "assumed" for
 * estimates.  A probe that fails (no nvidia-smi, no python3, a command
 * that hangs) never fails discovery: it adds a warning to the probe report
 * and is recorded under the node's "x-probes" member.
 *
 *     px_hw_discover_options opt = {.measure = false};
 *     px_diags report;
 *     px_diags_init(&report);
 *     json_t *inventory;
 *     px_err err;
 *     if (px_hw_discover(&opt, &inventory, &report, &err) == PX_OK) {
 *         char *text = px_json_dump_canonical(inventory);
 *         fputs(text, stdout);
 *         free(text);
 *         json_decref(inventory);
 *     }
 *     char *warnings = px_diags_format(&report, "discovery");
 *     fputs(warnings ? warnings : "", stderr);
 *     free(warnings);
 *     px_diags_release(&report);
 *
 * The parsers below are pure functions over text, exposed so that the
 * formats they read can be tested on recorded samples. */

/* Options of px_hw_discover.  Zero fields take the defaults; every
 * pointer is borrowed for the call only. */
typedef struct px_hw_discover_options {
    /* Python installation prefixes (a virtual environment, a conda
     * environment, /usr/local) or site-packages folders to scan for
     * frameworks besides the interpreter's own. */
    const char *const *python_prefixes;
    size_t n_python_prefixes;
    /* The interpreter whose sys.path is scanned: NULL looks up python3 on
     * PATH; "" skips the interpreter (only the prefixes are scanned). */
    const char *python;
    /* The nvidia-smi to run: NULL looks it up on PATH; "" skips the GPU
     * probe. */
    const char *nvidia_smi;
    /* Folder under which /proc, /sys and /etc are read (tests point it at
     * a recorded tree); NULL or "/" is the running system.  hwloc always
     * examines the running system. */
    const char *sysroot;
    /* The node's id; NULL derives it from the host name. */
    const char *node_id;
    /* Run the microbenchmarks (memory bandwidth, f32 throughput). */
    bool measure;
    /* Time budget of each microbenchmark in seconds; 0: 0.5 s. */
    double measure_seconds;
    /* Bytes of each of the triad's three arrays; 0 picks four times the
     * last-level cache, at least 64 MiB, at most 1 GiB. */
    size_t measure_bytes;
    /* Limit in seconds on each external command; 0: 10 s. */
    double command_timeout;
    /* The time stamped on every figure (Unix seconds); 0: the wall clock. */
    int64_t now;
} px_hw_discover_options;

/* Describes the local machine.  options may be NULL (all defaults).  On
 * success *out is a new inventory document (returns owned: json_decref)
 * holding one node, and report (caller-initialized; may be NULL) holds a
 * warning for each problem a probe met (a probe that failed, a malformed
 * line of nvidia-smi output, unreadable package metadata), each pointing
 * at the probe's record under /nodes/0/x-probes.  That array holds one
 * record per probe (cpu, memory, os, gpu, python, measure):
 * {"probe", "status": "ok"|"partial"|"failed"|"skipped", "message",
 * "source", "duration"}.  Probes failing is not an error.  Returns PX_OK;
 * PX_EINVAL for options out of range (a negative time, a node id that is
 * not [A-Za-z0-9_-]{1,64}); PX_ENOMEM.  Not thread-safe with respect to
 * the process's child processes: it forks and waits for its own. */
PX_NODISCARD px_status px_hw_discover(const px_hw_discover_options *options, json_t **out,
                                      px_diags *report, px_err *err);

/* /proc/meminfo, in bytes. */
typedef struct px_hw_meminfo {
    uint64_t total;     /* MemTotal */
    uint64_t available; /* MemAvailable, or its estimate */
    uint64_t free;      /* MemFree */
    /* Kernels before 3.14 have no MemAvailable; available is then
     * MemFree + Buffers + Cached. */
    bool available_estimated;
} px_hw_meminfo;

/* Parses /proc/meminfo text of len bytes (need not be NUL-terminated; at
 * most 1 MiB, 4096 lines).  Lines it does not need are skipped, also
 * malformed ones.  Returns PX_OK; PX_EPARSE when MemTotal is missing or a
 * line it needs is malformed or overflows (err names the line);
 * PX_ELIMIT when the text is too long. */
PX_NODISCARD px_status px_hw_parse_meminfo(const char *text, size_t len, px_hw_meminfo *out,
                                           px_err *err);

/* The fields px_hw_discover asks nvidia-smi for, in the order
 * px_hw_parse_nvidia_smi expects them:
 * nvidia-smi --query-gpu=<these> --format=csv,noheader,nounits */
#define PX_HW_NVIDIA_SMI_QUERY                                              \
    "index,name,uuid,memory.total,memory.used,memory.free,utilization.gpu," \
    "temperature.gpu,power.draw,power.limit,clocks.max.sm,compute_cap,"     \
    "driver_version,pcie.link.gen.max,pcie.link.width.max"

/* One GPU as nvidia-smi reports it.  Figures nvidia-smi did not report
 * ("[N/A]", "[Not Supported]") are NAN, or 0 / "" for the integer and
 * text fields. */
typedef struct px_hw_nvidia_gpu {
    int index;                                     /* nvidia-smi's index */
    char name[96];                                 /* "NVIDIA H100 80GB HBM3" */
    char uuid[96];                                 /* "GPU-5b1f..." */
    char capability[16];                           /* CUDA compute capability, "9.0" */
    char driver[32];                               /* "550.54.15" */
    double memory_total, memory_used, memory_free; /* bytes */
    double utilization;                            /* 0..1 */
    double temperature;                            /* K */
    double power_draw, power_limit;                /* W */
    double clock_max_sm;                           /* Hz */
    int pcie_gen, pcie_width;                      /* link generation and lanes, the most this
                                                      GPU and slot can do */
    const char *catalog;                           /* catalogue id for the name, or NULL (static) */
    size_t line;                                   /* 1-based line of the output */
} px_hw_nvidia_gpu;

/* Parses the output of nvidia-smi --query-gpu=PX_HW_NVIDIA_SMI_QUERY
 * --format=csv,noheader,nounits (len bytes, at most 1 MiB and 4096 lines
 * of at most 1024 bytes) into gpus[0..max_gpus).  Rows that cannot be
 * read (wrong field count, control bytes, a bad index, a repeated index)
 * are skipped with a warning naming the line; a field that does not
 * parse becomes absent with a warning; "No devices were found" and empty
 * output give no GPUs.  warnings may be NULL.  Returns PX_OK with *n_gpus
 * set; PX_ELIMIT when the text is over the size limit. */
PX_NODISCARD px_status px_hw_parse_nvidia_smi(const char *text, size_t len, px_hw_nvidia_gpu *gpus,
                                              size_t max_gpus, size_t *n_gpus, px_diags *warnings,
                                              px_err *err);

/* One MIG instance from `nvidia-smi -L`. */
typedef struct px_hw_mig_instance {
    int gpu_index;    /* the physical GPU's index */
    int device;       /* the instance's device number on that GPU */
    char profile[32]; /* "1g.10gb" */
    char uuid[96];    /* "MIG-feb8..." */
} px_hw_mig_instance;

/* Parses the MIG lines of `nvidia-smi -L` ("  MIG 1g.10gb Device 0:
 * (UUID: MIG-...)", each under its "GPU N: ..." line) into
 * out[0..max).  Other lines are ignored; a MIG line before any GPU line or
 * that cannot be read is skipped with a warning.  Same bounds as
 * px_hw_parse_nvidia_smi.  Returns PX_OK; PX_ELIMIT. */
PX_NODISCARD px_status px_hw_parse_nvidia_smi_list(const char *text, size_t len,
                                                   px_hw_mig_instance *out, size_t max, size_t *n,
                                                   px_diags *warnings, px_err *err);

/* The device catalogue id for a GPU name as nvidia-smi prints it
 * ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-sxm5"), or NULL when the name
 * is not one this table maps.  The id may still be absent from a given
 * catalogue.  Returns a static string. */
const char *px_hw_nvidia_catalog_id(const char *name);

/* The head of a Python distribution's metadata (METADATA or PKG-INFO). */
typedef struct px_hw_dist_metadata {
    char name[128];   /* Name:, as written */
    char version[64]; /* Version:, as written ("2.3.1+cu121") */
    /* The CUDA runtime the distribution requires, "12.1", from a
     * Requires-Dist on nvidia-cuda-runtime-cuXX; "" when none. */
    char cuda_runtime[16];
} px_hw_dist_metadata;

/* Parses the RFC 822 style header block of a METADATA or PKG-INFO text
 * (len bytes; only the first 64 KiB are read; the header block ends at
 * the first blank line).  Returns PX_OK; PX_EPARSE when Name or Version
 * is missing, empty, too long or holds characters that no valid name or
 * version holds (err names the header and line). */
PX_NODISCARD px_status px_hw_parse_dist_metadata(const char *text, size_t len,
                                                 px_hw_dist_metadata *out, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_HW_H */
