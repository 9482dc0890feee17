/* Local discovery as a whole: framework detection on fake site-packages
 * trees, probes that fail or hang, recorded systems, the microbenchmarks,
 * and a real discovery of this machine; every document must validate as
 * an inventory.  The parsers have their own tests
 * (test_hw_discover_parse.c). */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plexus/hw.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static void write_text(const char *path, const char *text)
{
    px_err err;
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
}

/* mkdir -p for a path under the test's temporary folder. */
static void make_dirs(const char *path)
{
    char buf[4096];
    px_strlcpy(buf, path, sizeof buf);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

static char *tmp_path(const char *rel)
{
    return px_asprintf("%s/%s", px_test_tmpdir(), rel);
}

/* A stand-in for nvidia-smi: prints a fixture for --query-gpu and
 * another (or nothing) for -L, then exits with `status`. */
static char *make_smi_stub(const char *name, const char *query_fixture, const char *list_fixture,
                           int status)
{
    char *path = tmp_path(name);
    char *q = NULL, *l = NULL;
    if (query_fixture) {
        char *rel = px_asprintf("tests/data/nvidia-smi/%s", query_fixture);
        q = px_test_source_path(rel);
        free(rel);
    }
    if (list_fixture) {
        char *rel = px_asprintf("tests/data/nvidia-smi/%s", list_fixture);
        l = px_test_source_path(rel);
        free(rel);
    }
    char *script = px_asprintf("#!/bin/sh\ncase \"$1\" in\n-L) %s%s%s ;;\n*) %s%s%s ;;\nesac\n"
                               "exit %d\n",
                               l ? "cat '" : "true", l ? l : "", l ? "'" : "", q ? "cat '" : "true",
                               q ? q : "", q ? "'" : "", status);
    write_text(path, script);
    chmod(path, 0755);
    free(script);
    free(q);
    free(l);
    return path;
}

static char *make_script(const char *name, const char *body)
{
    char *path = tmp_path(name);
    write_text(path, body);
    chmod(path, 0755);
    return path;
}

static const char meminfo_sample[] = "MemTotal:       16283720 kB\n"
                                     "MemFree:         1419564 kB\n"
                                     "MemAvailable:   11708032 kB\n"
                                     "Buffers:          409284 kB\n"
                                     "Cached:         10009152 kB\n"
                                     "SwapCached:            0 kB\n"
                                     "Active:          5217348 kB\n"
                                     "HugePages_Total:       0\n"
                                     "Hugepagesize:       2048 kB\n"
                                     "DirectMap1G:    11534336 kB\n";

/* A recorded system tree: /proc and /etc files a discovery reads. */
static const char *make_sysroot(const char *name, bool nvidia_driver)
{
    static char root[4096];
    char *r = tmp_path(name);
    px_strlcpy(root, r, sizeof root);
    free(r);
    char *p;
    make_dirs((p = px_asprintf("%s/proc/sys/kernel", root)));
    free(p);
    make_dirs((p = px_asprintf("%s/etc", root)));
    free(p);
    write_text((p = px_asprintf("%s/proc/meminfo", root)), meminfo_sample);
    free(p);
    write_text((p = px_asprintf("%s/proc/sys/kernel/hostname", root)), "gpu-host-7.lab.example\n");
    free(p);
    write_text((p = px_asprintf("%s/proc/sys/kernel/osrelease", root)), "6.1.0-18-amd64\n");
    free(p);
    write_text((p = px_asprintf("%s/proc/loadavg", root)), "0.50 0.40 0.30 1/94 9678\n");
    free(p);
    write_text((p = px_asprintf("%s/etc/os-release", root)),
               "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n");
    free(p);
    if (nvidia_driver) {
        make_dirs((p = px_asprintf("%s/proc/driver/nvidia", root)));
        free(p);
        write_text((p = px_asprintf("%s/proc/driver/nvidia/version", root)),
                   "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n");
        free(p);
    }
    return root;
}

static json_t *node0(json_t *doc)
{
    return json_array_get(json_object_get(doc, "nodes"), 0);
}

static json_t *device(json_t *doc, const char *id)
{
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(node0(doc), "devices"), i,
                       d) if (!strcmp(json_string_value(json_object_get(d, "id")), id)) return d;
    return NULL;
}

static json_t *framework(json_t *doc, const char *name)
{
    size_t i;
    json_t *f;
    json_array_foreach(
        json_object_get(node0(doc), "frameworks"), i,
        f) if (!strcmp(json_string_value(json_object_get(f, "name")), name)) return f;
    return NULL;
}

static json_t *probe(json_t *doc, const char *name)
{
    size_t i;
    json_t *p;
    json_array_foreach(
        json_object_get(node0(doc), "x-probes"), i,
        p) if (!strcmp(json_string_value(json_object_get(p, "probe")), name)) return p;
    return NULL;
}

static const char *probe_status(json_t *doc, const char *name)
{
    return json_string_value(json_object_get(probe(doc, name), "status"));
}

/* A quantity's value in SI units. */
static double qty_value(const json_t *q, px_dim dim)
{
    const char *text =
        json_is_string(q) ? json_string_value(q) : json_string_value(json_object_get(q, "value"));
    px_qty v;
    px_err err;
    if (!text)
        fail_msg("no quantity");
    px_assert_ok(px_qty_parse(text, dim, &v, &err), &err);
    return v.value;
}

static char *report_text(const px_diags *d)
{
    char *s = px_diags_format(d, "discovery");
    return s ? s : px_strdup("");
}

/* Reads the document back with the inventory reader: every discovered
 * document must validate. */
static void assert_validates(json_t *doc)
{
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_err err;
    px_status st = px_hw_graph_from_value(doc, "discovered", NULL, &g, &diags, &err);
    if (st != PX_OK || diags.n_errors) {
        char *r = report_text(&diags);
        char *s = px_json_dump_canonical(doc);
        fail_msg("the discovered inventory does not validate: %s\n%s\n%s", err.msg, r, s);
    }
    px_hw_graph_free(g);
    px_diags_release(&diags);
}

/* ------------------------------------------------------------------ */
/* Frameworks on fake site-packages trees                              */
/* ------------------------------------------------------------------ */

static void add_dist(const char *site, const char *dir, const char *name, const char *version,
                     const char *extra)
{
    char *d = px_asprintf("%s/%s", site, dir);
    make_dirs(d);
    char *meta = px_asprintf("%s/METADATA", d);
    char *text = px_asprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s\nbody\n", name,
                             version, extra ? extra : "");
    write_text(meta, text);
    free(text);
    free(meta);
    free(d);
}

static json_t *discover_prefix(const char *prefix, const char *smi, const char *sysroot,
                               px_diags *report)
{
    const char *prefixes[] = {prefix};
    px_hw_discover_options opt = {.python_prefixes = prefixes,
                                  .n_python_prefixes = 1,
                                  .python = "",
                                  .nvidia_smi = smi,
                                  .sysroot = sysroot,
                                  .now = 1764433510};
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, report, &err), &err);
    return doc;
}

static void test_frameworks_cuda_torch_with_driver_gives_torch_cuda(void **state)
{
    (void)state;
    char *prefix = tmp_path("venv-cuda");
    char *site = px_asprintf("%s/lib/python3.11/site-packages", prefix);
    make_dirs(site);
    add_dist(site, "torch-2.3.1+cu121.dist-info", "torch", "2.3.1+cu121", NULL);
    add_dist(site, "numpy-1.26.4.dist-info", "numpy", "1.26.4", NULL);
    add_dist(site, "cupy_cuda12x-13.1.0.dist-info", "cupy-cuda12x", "13.1.0", NULL);
    add_dist(site, "jax-0.4.30.dist-info", "jax", "0.4.30", NULL);
    add_dist(site, "jax_cuda12_plugin-0.4.30.dist-info", "jax-cuda12-plugin", "0.4.30", NULL);
    add_dist(site, "requests-2.32.3.dist-info", "requests", "2.32.3", NULL);
    /* An egg-info file (a distutils install) and a broken dist-info. */
    char *egg = px_asprintf("%s/transformers-4.41.2-py3.11.egg-info", site);
    write_text(egg, "Metadata-Version: 1.1\nName: transformers\nVersion: 4.41.2\n");
    add_dist(site, "triton-2.3.1.dist-info", "triton", "", NULL);
    char *smi = make_smi_stub("smi-h100", "h100x8.txt", NULL, 0);
    px_diags report;
    px_diags_init(&report);
    json_t *doc = discover_prefix(prefix, smi, make_sysroot("root-plain", false), &report);

    json_t *t = framework(doc, "torch");
    assert_non_null(t);
    assert_string_equal(json_string_value(json_object_get(t, "version")), "2.3.1+cu121");
    json_t *tc = framework(doc, "torch.cuda");
    assert_non_null(tc);
    assert_string_equal(json_string_value(json_object_get(tc, "version")), "12.1");
    assert_string_equal(json_string_value(json_object_get(framework(doc, "numpy"), "version")),
                        "1.26.4");
    json_t *cupy = framework(doc, "cupy");
    assert_non_null(cupy);
    assert_string_equal(json_string_value(json_object_get(cupy, "x-package")), "cupy-cuda12x");
    assert_string_equal(json_string_value(json_object_get(framework(doc, "cupy.cuda"), "version")),
                        "12");
    assert_string_equal(json_string_value(json_object_get(framework(doc, "jax.cuda"), "version")),
                        "12");
    assert_non_null(framework(doc, "transformers"));
    assert_null(framework(doc, "requests"));
    assert_null(framework(doc, "jax-cuda12-plugin"));
    assert_null(framework(doc, "triton")); /* its metadata has an empty version */
    assert_string_equal(probe_status(doc, "python"), "partial");
    char *r = report_text(&report);
    px_assert_contains(r, "triton-2.3.1.dist-info/METADATA: line 3: Version");
    free(r);
    /* Eight GPUs, each linked to the host over PCIe 5. */
    assert_non_null(device(doc, "gpu7"));
    assert_int_equal(json_array_size(json_object_get(doc, "links")), 8);
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
    free(smi);
    free(egg);
    free(site);
    free(prefix);
}

static void test_frameworks_cpu_torch_gives_no_torch_cuda(void **state)
{
    (void)state;
    char *site = tmp_path("site-cpu");
    make_dirs(site);
    add_dist(site, "torch-2.3.1+cpu.dist-info", "torch", "2.3.1+cpu", NULL);
    char *vp = px_asprintf("%s/torch", site);
    make_dirs(vp);
    char *vf = px_asprintf("%s/version.py", vp);
    write_text(vf, "__version__ = '2.3.1+cpu'\ndebug = False\ncuda: Optional[str] = None\n");
    char *smi = make_smi_stub("smi-l4", "l4.txt", NULL, 0);
    px_diags report;
    px_diags_init(&report);
    json_t *doc = discover_prefix(site, smi, make_sysroot("root-cpu", false), &report);
    assert_non_null(framework(doc, "torch"));
    assert_null(framework(doc, "torch.cuda"));
    assert_string_equal(probe_status(doc, "python"), "ok");
    json_decref(doc);
    px_diags_release(&report);
    free(smi);
    free(vf);
    free(vp);
    free(site);
}

static void test_frameworks_cuda_build_needs_a_driver(void **state)
{
    (void)state;
    /* torch/version.py says CUDA 12.4 (no local version); without an
     * NVIDIA driver it is no torch.cuda, with the kernel module it is. */
    char *site = tmp_path("site-vpy");
    make_dirs(site);
    add_dist(site, "torch-2.4.0.dist-info", "torch", "2.4.0", NULL);
    char *vp = px_asprintf("%s/torch", site);
    make_dirs(vp);
    char *vf = px_asprintf("%s/version.py", vp);
    write_text(vf, "__version__ = '2.4.0'\ncuda: Optional[str] = '12.4'\n");
    px_diags report;
    px_diags_init(&report);
    json_t *doc = discover_prefix(site, "", make_sysroot("root-nodrv", false), &report);
    assert_non_null(framework(doc, "torch"));
    assert_null(framework(doc, "torch.cuda"));
    px_assert_contains(json_string_value(json_object_get(probe(doc, "python"), "message")),
                       "no NVIDIA driver");
    json_decref(doc);
    doc = discover_prefix(site, "", make_sysroot("root-drv", true), &report);
    assert_string_equal(json_string_value(json_object_get(framework(doc, "torch.cuda"), "version")),
                        "12.4");
    assert_string_equal(probe_status(doc, "gpu"), "skipped");
    json_decref(doc);
    px_diags_release(&report);
    free(vf);
    free(vp);
    free(site);
}

static void test_frameworks_from_the_interpreters_sys_path(void **state)
{
    (void)state;
    /* A stand-in interpreter that answers the sys.path question. */
    char *site = tmp_path("interp-site");
    make_dirs(site);
    add_dist(site, "numpy-2.0.0.dist-info", "numpy", "2.0.0", NULL);
    add_dist(site, "vllm-0.5.0.dist-info", "vllm", "0.5.0", NULL);
    char *body = px_asprintf("#!/bin/sh\necho '{\"executable\": \"/opt/py/bin/python3\", "
                             "\"version\": \"3.12.4\", \"path\": [\"\", \"/nonexistent\", "
                             "\"%s\", 7]}'\n",
                             site);
    char *py = make_script("fake-python3", body);
    px_hw_discover_options opt = {.python = py, .nvidia_smi = "", .now = 1764433510};
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    json_t *pyo = json_object_get(node0(doc), "python");
    assert_string_equal(json_string_value(json_object_get(pyo, "path")), "/opt/py/bin/python3");
    assert_string_equal(json_string_value(json_object_get(pyo, "version")), "3.12.4");
    assert_string_equal(json_string_value(json_object_get(framework(doc, "vllm"), "python")),
                        "/opt/py/bin/python3");
    assert_non_null(framework(doc, "numpy"));
    json_decref(doc);
    px_diags_release(&report);
    free(py);
    free(body);
    free(site);
}

/* ------------------------------------------------------------------ */
/* Probes that fail                                                    */
/* ------------------------------------------------------------------ */

static json_t *discover_with_smi(const char *smi, double timeout, px_diags *report)
{
    px_hw_discover_options opt = {
        .python = "", .nvidia_smi = smi, .command_timeout = timeout, .now = 1764433510};
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, report, &err), &err);
    return doc;
}

static void test_failing_nvidia_smi_is_a_warning_and_discovery_goes_on(void **state)
{
    (void)state;
    char *smi = make_smi_stub("smi-fails", "driver-failed.txt", NULL, 9);
    px_diags report;
    px_diags_init(&report);
    json_t *doc = discover_with_smi(smi, 5, &report);
    assert_string_equal(probe_status(doc, "gpu"), "failed");
    assert_non_null(device(doc, "cpu0"));
    assert_null(device(doc, "gpu0"));
    assert_int_equal(report.n_warnings, 1);
    px_assert_contains(report.items[0].message, "gpu probe: nvidia-smi exited with status 9");
    px_assert_contains(report.items[0].message, "NVIDIA-SMI has failed");
    assert_string_equal(report.items[0].pointer, "/nodes/0/x-probes/3");
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
    free(smi);

    px_diags_init(&report);
    doc = discover_with_smi("/nonexistent/nvidia-smi", 5, &report);
    assert_string_equal(probe_status(doc, "gpu"), "failed");
    px_assert_contains(report.items[0].message, "/nonexistent/nvidia-smi is not an executable");
    json_decref(doc);
    px_diags_release(&report);
}

static void test_hanging_nvidia_smi_is_killed_at_the_timeout(void **state)
{
    (void)state;
    char *smi = make_script("smi-hangs", "#!/bin/sh\necho '0, NVIDIA L4'\nsleep 30\n");
    px_diags report;
    px_diags_init(&report);
    uint64_t t0 = px_now_ns();
    json_t *doc = discover_with_smi(smi, 0.5, &report);
    double took = (double)(px_now_ns() - t0) * 1e-9;
    if (took > 5)
        fail_msg("discovery took %.1f s with a 0.5 s command timeout", took);
    assert_string_equal(probe_status(doc, "gpu"), "failed");
    px_assert_contains(report.items[0].message, "did not finish within 0.5 s");
    assert_non_null(device(doc, "cpu0"));
    json_decref(doc);
    px_diags_release(&report);
    free(smi);

    /* A flood of output is cut at the bound. */
    smi = make_script("smi-floods", "#!/bin/sh\nexec yes '0, NVIDIA L4, GPU-1'\n");
    px_diags_init(&report);
    doc = discover_with_smi(smi, 10, &report);
    px_assert_contains(report.items[0].message, "printed more than 1048576 bytes");
    json_decref(doc);
    px_diags_release(&report);
    free(smi);
}

static void test_discovery_refuses_bad_options(void **state)
{
    (void)state;
    json_t *doc = (json_t *)1;
    px_err err;
    px_hw_discover_options opt = {.measure_seconds = -1};
    assert_int_equal(px_hw_discover(&opt, &doc, NULL, &err), PX_EINVAL);
    assert_null(doc);
    px_assert_contains(err.msg, "measure_seconds");
    opt = (px_hw_discover_options){.node_id = "bad id/1"};
    assert_int_equal(px_hw_discover(&opt, &doc, NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "node id");
    opt = (px_hw_discover_options){.command_timeout = NAN};
    assert_int_equal(px_hw_discover(&opt, &doc, NULL, &err), PX_EINVAL);
}

/* ------------------------------------------------------------------ */
/* Whole discoveries                                                   */
/* ------------------------------------------------------------------ */

static void test_recorded_system_becomes_a_valid_inventory(void **state)
{
    (void)state;
    char *smi = make_smi_stub("smi-mig", "a100-mig.txt", "a100-mig-list.txt", 0);
    const char *root = make_sysroot("root-mig", false);
    px_hw_discover_options opt = {
        .python = "", .nvidia_smi = smi, .sysroot = root, .now = 1764433510};
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    json_t *node = node0(doc);
    assert_string_equal(json_string_value(json_object_get(node, "id")), "gpu-host-7");
    assert_string_equal(json_string_value(json_object_get(node, "hostname")),
                        "gpu-host-7.lab.example");
    json_t *os = json_object_get(node, "os");
    assert_string_equal(json_string_value(json_object_get(os, "distro")),
                        "Debian GNU/Linux 12 (bookworm)");
    assert_string_equal(json_string_value(json_object_get(os, "kernel")), "6.1.0-18-amd64");
    json_t *ddr = json_array_get(json_object_get(node, "memory"), 0);
    assert_true(qty_value(json_object_get(ddr, "capacity"), PX_DIM_BYTES) == 16283720.0 * 1024);
    json_t *cap = json_object_get(ddr, "capacity");
    assert_string_equal(json_string_value(json_object_get(cap, "provenance")), "discovered");
    assert_string_equal(json_string_value(json_object_get(cap, "source")),
                        "/proc/meminfo MemTotal");
    assert_string_equal(json_string_value(json_object_get(cap, "at")), "2025-11-29T16:25:10Z");

    json_t *g0 = device(doc, "gpu0");
    assert_string_equal(json_string_value(json_object_get(g0, "class")), "gpu");
    assert_string_equal(json_string_value(json_object_get(g0, "capability")), "8.0");
    json_t *hbm = json_array_get(json_object_get(g0, "memory"), 0);
    assert_string_equal(json_string_value(json_object_get(hbm, "kind")), "hbm");
    assert_true(qty_value(json_object_get(hbm, "capacity"), PX_DIM_BYTES) == 81920.0 * 1048576);
    assert_true(qty_value(json_object_get(json_object_get(g0, "power"), "tdp"), PX_DIM_POWER) ==
                400);
    assert_null(json_object_get(json_object_get(g0, "live"), "utilization"));
    json_t *mig = json_object_get(json_object_get(g0, "x-nvidia"), "mig");
    assert_int_equal(json_array_size(mig), 4);
    assert_null(json_object_get(json_object_get(device(doc, "gpu1"), "x-nvidia"), "mig"));
    json_t *link = json_array_get(json_object_get(doc, "links"), 0);
    assert_string_equal(json_string_value(json_object_get(link, "from")), "gpu-host-7.gpu0");
    assert_string_equal(json_string_value(json_object_get(link, "to")), "gpu-host-7");
    assert_string_equal(json_string_value(json_object_get(link, "kind")), "pcie4");
    assert_true(
        fabs(qty_value(json_object_get(link, "bandwidth"), PX_DIM_BANDWIDTH) - 16 * 1969.2e6) < 1);
    /* The catalogue id is written only when the catalogue has the entry. */
    px_hw_catalog *cat = NULL;
    px_assert_ok(px_hw_catalog_new_builtin(&cat, &err), &err);
    bool known = px_hw_catalog_find_device(cat, "nvidia-a100-80gb-sxm") != NULL;
    px_hw_catalog_free(cat);
    json_t *catalog = json_object_get(g0, "catalog");
    if (known)
        assert_string_equal(json_string_value(catalog), "nvidia-a100-80gb-sxm");
    else
        assert_null(catalog);
    assert_string_equal(probe_status(doc, "gpu"), "ok");
    assert_string_equal(probe_status(doc, "memory"), "ok");
    assert_string_equal(probe_status(doc, "os"), "ok");
    assert_string_equal(probe_status(doc, "python"), "skipped");
    assert_string_equal(probe_status(doc, "measure"), "skipped");
    assert_int_equal(report.n, 0);
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
    free(smi);
}

static void test_gpu_memory_tier_takes_the_catalogue_tier_id(void **state)
{
    (void)state;
    /* The L4's catalogue entry names its GDDR tier "vram": the discovered
     * tier must override it, not sit beside it (doubling the memory). */
    char *smi = make_smi_stub("smi-l4-tier", "l4.txt", NULL, 0);
    px_hw_discover_options opt = {.python = "",
                                  .nvidia_smi = smi,
                                  .node_id = "n1",
                                  .sysroot = make_sysroot("root-l4", false)};
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, NULL, &err), &err);
    json_t *tier = json_array_get(json_object_get(device(doc, "gpu0"), "memory"), 0);
    assert_string_equal(json_string_value(json_object_get(tier, "kind")), "gddr");
    assert_string_equal(json_string_value(json_object_get(tier, "id")), "vram");
    px_hw_graph *g = NULL;
    px_diags diags;
    px_diags_init(&diags);
    px_assert_ok(px_hw_graph_from_value(doc, "discovered", NULL, &g, &diags, &err), &err);
    uint32_t i;
    assert_true(px_hw_graph_find_device(g, "n1.gpu0", &i));
    const px_hw_device *d = &px_hw_graph_view(g)->devices[i];
    assert_int_equal(d->n_memory, 1);
    assert_true(px_hw_device_memory_capacity(d) == 23034.0 * 1048576);
    px_hw_graph_free(g);
    px_diags_release(&diags);
    json_decref(doc);
    free(smi);
}

static void test_unreported_fields_leave_members_out(void **state)
{
    (void)state;
    /* A T4 (no catalogue entry) reporting no temperature, utilization or
     * PCIe link, and an A10G with a failed temperature read. */
    char *smi = make_smi_stub("smi-na", "na-fields.txt", NULL, 0);
    px_hw_discover_options opt = {.python = "",
                                  .nvidia_smi = smi,
                                  .node_id = "n1",
                                  .sysroot = make_sysroot("root-na", false)};
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    json_t *t4 = device(doc, "gpu0");
    assert_string_equal(json_string_value(json_object_get(t4, "model")), "Tesla T4");
    assert_null(json_object_get(t4, "catalog"));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(t4, "x-nvidia"), "catalog_candidate")),
        "nvidia-t4");
    json_t *live = json_object_get(t4, "live");
    assert_non_null(json_object_get(live, "memory_free"));
    assert_null(json_object_get(live, "utilization"));
    assert_null(json_object_get(live, "temperature"));
    assert_null(json_object_get(json_object_get(t4, "x-nvidia"), "pcie"));
    /* Only the A10G reported its link. */
    json_t *links = json_object_get(doc, "links");
    assert_int_equal(json_array_size(links), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(links, 0), "from")),
                        "n1.gpu1");
    assert_string_equal(probe_status(doc, "gpu"), "partial");
    assert_int_equal(report.n_warnings, 1);
    px_assert_contains(report.items[0].message, "gpu probe: nvidia-smi output: line 2: "
                                                "temperature.gpu reads [Unknown Error]");
    assert_string_equal(report.items[0].pointer, "/nodes/0/x-probes/3");
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
    free(smi);
}

static void test_this_machine_is_discovered(void **state)
{
    (void)state;
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(NULL, &doc, &report, &err), &err);
    json_t *cpu = device(doc, "cpu0");
    assert_non_null(cpu);
    json_t *x = json_object_get(cpu, "x-cpu");
    assert_true(json_integer_value(json_object_get(x, "cores")) > 0);
    assert_true(json_integer_value(json_object_get(x, "threads")) >=
                json_integer_value(json_object_get(x, "cores")));
    json_t *ddr = json_array_get(json_object_get(node0(doc), "memory"), 0);
    assert_non_null(ddr);
    assert_true(qty_value(json_object_get(ddr, "capacity"), PX_DIM_BYTES) > 0);
    json_t *free_ = json_object_get(json_object_get(node0(doc), "live"), "memory_free");
    assert_true(qty_value(free_, PX_DIM_BYTES) > 0);
    assert_string_equal(probe_status(doc, "cpu"), "ok");
    /* The processors usable here: at least one, at most what hwloc counts. */
    json_t *host = json_object_get(node0(doc), "cpu");
    double cores = qty_value(json_object_get(host, "cores"), PX_DIM_NONE);
    assert_true(cores >= 1 && cores <= (double)json_integer_value(json_object_get(x, "cores")));
    assert_true(qty_value(json_object_get(host, "threads"), PX_DIM_NONE) >= cores);
    /* Any GPUs it found become devices with links. */
    size_t n_gpus = json_array_size(json_object_get(node0(doc), "devices")) - 1;
    if (n_gpus)
        assert_true(json_array_size(json_object_get(doc, "links")) <= n_gpus);
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
}

/* The node's usable processors: hwloc's counts cut to a cgroup quota
 * (half a CPU keeps one thread busy part of the time), with provenance. */
static void test_host_cpu_follows_the_cgroup_quota(void **state)
{
    (void)state;
    const char *root = make_sysroot("root-quota", false);
    char *p;
    make_dirs((p = px_asprintf("%s/sys/fs/cgroup", root)));
    free(p);
    write_text((p = px_asprintf("%s/sys/fs/cgroup/cpu.max", root)), "50000 100000\n");
    free(p);
    px_hw_discover_options opt = {.python = "", .nvidia_smi = "", .sysroot = root};
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    json_t *cpu = json_object_get(node0(doc), "cpu");
    assert_non_null(cpu);
    assert_true(qty_value(json_object_get(cpu, "cores"), PX_DIM_NONE) == 1);
    assert_true(qty_value(json_object_get(cpu, "threads"), PX_DIM_NONE) == 1);
    json_t *th = json_object_get(cpu, "threads");
    assert_string_equal(json_string_value(json_object_get(th, "provenance")), "discovered");
    assert_non_null(strstr(json_string_value(json_object_get(th, "source")), "cgroup cpu.max"));
    assert_validates(doc);
    json_decref(doc);
    /* No quota ("max"): the counts as found. */
    write_text((p = px_asprintf("%s/sys/fs/cgroup/cpu.max", root)), "max 100000\n");
    free(p);
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    cpu = json_object_get(node0(doc), "cpu");
    json_t *x = json_object_get(device(doc, "cpu0"), "x-cpu");
    assert_true(qty_value(json_object_get(cpu, "threads"), PX_DIM_NONE) ==
                (double)json_integer_value(json_object_get(x, "threads")));
    json_decref(doc);
    px_diags_release(&report);
}

static void test_measure_records_bandwidth_and_throughput(void **state)
{
    (void)state;
    px_hw_discover_options opt = {.python = "",
                                  .nvidia_smi = "",
                                  .measure = true,
                                  .measure_seconds = 0.05,
                                  .measure_bytes = 4u << 20};
    json_t *doc = NULL;
    px_diags report;
    px_diags_init(&report);
    px_err err;
    px_assert_ok(px_hw_discover(&opt, &doc, &report, &err), &err);
    assert_string_equal(probe_status(doc, "measure"), "ok");
    json_t *ddr = json_array_get(json_object_get(node0(doc), "memory"), 0);
    json_t *bw = json_object_get(ddr, "bandwidth");
    assert_string_equal(json_string_value(json_object_get(bw, "provenance")), "measured");
    px_assert_contains(json_string_value(json_object_get(bw, "source")), "triad, 4 MiB");
    assert_true(qty_value(bw, PX_DIM_BANDWIDTH) > 1e6);
    assert_true(json_is_array(json_object_get(bw, "uncertainty")));
    json_t *f32 = json_object_get(json_object_get(device(doc, "cpu0"), "compute"), "f32");
    assert_string_equal(json_string_value(json_object_get(f32, "provenance")), "measured");
    assert_true(qty_value(f32, PX_DIM_FLOPS) > 1e6);
    json_t *one =
        json_object_get(json_object_get(device(doc, "cpu0"), "x-measure"), "f32_one_thread");
    assert_true(qty_value(one, PX_DIM_FLOPS) > 1e6);
    assert_validates(doc);
    json_decref(doc);
    px_diags_release(&report);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frameworks_cuda_torch_with_driver_gives_torch_cuda),
        cmocka_unit_test(test_frameworks_cpu_torch_gives_no_torch_cuda),
        cmocka_unit_test(test_frameworks_cuda_build_needs_a_driver),
        cmocka_unit_test(test_frameworks_from_the_interpreters_sys_path),
        cmocka_unit_test(test_failing_nvidia_smi_is_a_warning_and_discovery_goes_on),
        cmocka_unit_test(test_hanging_nvidia_smi_is_killed_at_the_timeout),
        cmocka_unit_test(test_discovery_refuses_bad_options),
        cmocka_unit_test(test_recorded_system_becomes_a_valid_inventory),
        cmocka_unit_test(test_gpu_memory_tier_takes_the_catalogue_tier_id),
        cmocka_unit_test(test_unreported_fields_leave_members_out),
        cmocka_unit_test(test_this_machine_is_discovered),
        cmocka_unit_test(test_measure_records_bandwidth_and_throughput),
        cmocka_unit_test(test_host_cpu_follows_the_cgroup_quota),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
