/* Local discovery's parsers on recorded and hostile samples: /proc/meminfo,
 * the nvidia-smi query CSV and MIG listing, the GPU catalogue names, and
 * Python package metadata. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/hw.h"

static char *fixture_text(const char *name, size_t *len)
{
    char *rel = px_asprintf("tests/data/nvidia-smi/%s", name);
    char *path = px_test_source_path(rel);
    char *text = NULL;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 20, &text, len, &err), &err);
    free(rel);
    free(path);
    return text;
}

static char *report_text(const px_diags *d)
{
    char *s = px_diags_format(d, "discovery");
    return s ? s : px_strdup("");
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

/* ------------------------------------------------------------------ */
/* /proc/meminfo                                                       */
/* ------------------------------------------------------------------ */

static void test_meminfo_reads_a_kernel_sample(void **state)
{
    (void)state;
    px_hw_meminfo mi;
    px_err err;
    px_assert_ok(px_hw_parse_meminfo(meminfo_sample, strlen(meminfo_sample), &mi, &err), &err);
    assert_int_equal(mi.total, 16283720ull * 1024);
    assert_int_equal(mi.available, 11708032ull * 1024);
    assert_int_equal(mi.free, 1419564ull * 1024);
    assert_false(mi.available_estimated);
}

static void test_meminfo_estimates_available_on_old_kernels(void **state)
{
    (void)state;
    const char old[] = "MemTotal: 8000 kB\r\nMemFree: 1000 kB\r\nBuffers: 200 kB\r\n"
                       "Cached: 3000 kB\r\n";
    px_hw_meminfo mi;
    px_err err;
    px_assert_ok(px_hw_parse_meminfo(old, strlen(old), &mi, &err), &err);
    assert_true(mi.available_estimated);
    assert_int_equal(mi.available, 4200ull * 1024);
}

static void test_meminfo_refuses_hostile_text(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t len; /* 0: strlen */
        px_status want;
        const char *needle;
    } cases[] = {
        {"MemFree: 10 kB\n", 0, PX_EPARSE, "no MemTotal"},
        {"MemTotal: abc kB\n", 0, PX_EPARSE, "line 1: MemTotal"},
        {"MemTotal: 99999999999999999999 kB\n", 0, PX_EPARSE, "expected a number"},
        {"MemTotal: 18446744073709551615 kB\n", 0, PX_EPARSE, "expected a number"},
        {"MemTotal: 100 MB\n", 0, PX_EPARSE, "got \"100 MB\""},
        {"MemTotal: -5 kB\n", 0, PX_EPARSE, "expected a number"},
        {"MemTotal: 100 kB\nMemTotal: 200 kB\n", 0, PX_EPARSE, "appears again"},
        {"MemTotal: 0 kB\n", 0, PX_EPARSE, "MemTotal is 0"},
        {"MemTotal: 100 kB\nMemAvailable: 200 kB\n", 0, PX_EPARSE, "exceeds MemTotal"},
        {"Mem\0Total: 100 kB\n", 18, PX_EPARSE, "no MemTotal"},
        {"MemTotal: 1\0000 kB\n", 18, PX_EPARSE, "expected a number"},
        {"", 0, PX_EPARSE, "no MemTotal"},
        {"\xff\xfe\x01 junk\nMemTotal: 64 kB\n:::\n\n", 0, PX_OK, NULL},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        px_hw_meminfo mi;
        px_err err = {0};
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].text);
        px_status st = px_hw_parse_meminfo(cases[i].text, len, &mi, &err);
        if (st != cases[i].want)
            fail_msg("case %zu: got %s (%s), want %s", i, px_status_name(st), err.msg,
                     px_status_name(cases[i].want));
        if (cases[i].needle)
            px_assert_contains(err.msg, cases[i].needle);
    }
    /* Size and line bounds. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "MemTotal: 100 kB\n");
    for (int i = 0; i < 5000; i++)
        px_strbuf_adds(&sb, "X: 1 kB\n");
    px_hw_meminfo mi;
    px_err err;
    assert_int_equal(px_hw_parse_meminfo(sb.buf, sb.len, &mi, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "lines");
    char *big = calloc(1, (2u << 20) + 1);
    memset(big, 'a', 2u << 20);
    assert_int_equal(px_hw_parse_meminfo(big, 2u << 20, &mi, &err), PX_ELIMIT);
    free(big);
    px_strbuf_release(&sb);
}

/* ------------------------------------------------------------------ */
/* nvidia-smi                                                          */
/* ------------------------------------------------------------------ */

static size_t parse_fixture(const char *name, px_hw_nvidia_gpu *gpus, size_t max, px_diags *w)
{
    size_t len, n = 0;
    char *text = fixture_text(name, &len);
    px_err err;
    px_assert_ok(px_hw_parse_nvidia_smi(text, len, gpus, max, &n, w, &err), &err);
    free(text);
    return n;
}

static void test_nvidia_smi_reads_eight_h100s(void **state)
{
    (void)state;
    px_hw_nvidia_gpu gpus[16];
    px_diags w;
    px_diags_init(&w);
    size_t n = parse_fixture("h100x8.txt", gpus, 16, &w);
    assert_int_equal(n, 8);
    assert_int_equal(w.n, 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(gpus[i].index, (int)i);
        assert_string_equal(gpus[i].name, "NVIDIA H100 80GB HBM3");
        assert_string_equal(gpus[i].capability, "9.0");
        assert_string_equal(gpus[i].driver, "550.54.15");
        assert_string_equal(gpus[i].catalog, "nvidia-h100-sxm5");
        assert_true(gpus[i].memory_total == 81559.0 * 1048576);
        assert_true(gpus[i].memory_free == 81004.0 * 1048576);
        assert_true(gpus[i].power_limit == 700.0);
        assert_true(gpus[i].clock_max_sm == 1980e6);
        assert_true(gpus[i].utilization == 0.0);
        assert_int_equal(gpus[i].pcie_gen, 5);
        assert_int_equal(gpus[i].pcie_width, 16);
        assert_true(px_str_starts_with(gpus[i].uuid, "GPU-"));
    }
    assert_true(fabs(gpus[0].temperature - (31 + 273.15)) < 1e-9);
    px_diags_release(&w);
}

static void test_nvidia_smi_reads_each_single_gpu_recording(void **state)
{
    (void)state;
    static const struct {
        const char *file, *name, *cap, *catalog;
        double mib, used_mib, watts, draw, util, temp_c, sm_mhz;
        int gen;
    } cases[] = {
        {"h200.txt", "NVIDIA H200", "9.0", "nvidia-h200-sxm", 143771, 0, 700, 76.83, 0, 27, 1980,
         5},
        {"a100.txt", "NVIDIA A100-SXM4-80GB", "8.0", "nvidia-a100-80gb-sxm", 81920, 4, 400, 61.24,
         0, 30, 1410, 4},
        {"l4.txt", "NVIDIA L4", "8.9", "nvidia-l4", 23034, 0, 72, 16.31, 0, 38, 2040, 4},
        {"rtx4090.txt", "NVIDIA GeForce RTX 4090", "8.9", "nvidia-rtx-4090", 24564, 412, 450, 21.55,
         0.03, 41, 3120, 4},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        px_hw_nvidia_gpu g[4];
        px_diags w;
        px_diags_init(&w);
        size_t n = parse_fixture(cases[i].file, g, 4, &w);
        if (n != 1 || w.n)
            fail_msg("%s: %zu GPUs, %zu warnings", cases[i].file, n, w.n);
        assert_string_equal(g[0].name, cases[i].name);
        assert_string_equal(g[0].capability, cases[i].cap);
        assert_string_equal(g[0].catalog, cases[i].catalog);
        assert_true(g[0].memory_total == cases[i].mib * 1048576);
        assert_true(g[0].memory_used == cases[i].used_mib * 1048576);
        assert_true(g[0].power_limit == cases[i].watts);
        assert_true(g[0].power_draw == cases[i].draw);
        assert_true(fabs(g[0].utilization - cases[i].util) < 1e-12);
        assert_true(fabs(g[0].temperature - (cases[i].temp_c + 273.15)) < 1e-9);
        assert_true(g[0].clock_max_sm == cases[i].sm_mhz * 1e6);
        assert_int_equal(g[0].pcie_gen, cases[i].gen);
        assert_int_equal(g[0].pcie_width, 16);
        assert_int_equal(g[0].index, 0);
        assert_int_equal(g[0].line, 1);
        px_diags_release(&w);
    }
}

static void test_nvidia_smi_treats_not_available_fields_as_absent(void **state)
{
    (void)state;
    px_hw_nvidia_gpu g[4];
    px_diags w;
    px_diags_init(&w);
    size_t n = parse_fixture("na-fields.txt", g, 4, &w);
    assert_int_equal(n, 2);
    /* Extra spaces around fields are trimmed. */
    assert_string_equal(g[0].name, "Tesla T4");
    assert_string_equal(g[0].catalog, "nvidia-t4");
    assert_true(g[0].memory_total == 15360.0 * 1048576);
    assert_true(isnan(g[0].utilization)); /* [Not Supported] */
    assert_true(isnan(g[0].temperature)); /* [N/A] */
    assert_true(isnan(g[0].power_draw));
    assert_int_equal(g[0].pcie_gen, 0);
    assert_int_equal(g[0].pcie_width, 0);
    assert_string_equal(g[0].capability, "7.5");
    /* "[Unknown Error]" is absent too, and worth a warning. */
    assert_string_equal(g[1].catalog, "nvidia-a10g");
    assert_true(isnan(g[1].temperature));
    assert_int_equal(w.n, 1);
    px_assert_contains(w.items[0].message, "temperature.gpu reads [Unknown Error]");
    px_diags_release(&w);
}

static void test_nvidia_smi_reads_mig_enabled_gpus_and_their_instances(void **state)
{
    (void)state;
    px_hw_nvidia_gpu g[4];
    px_diags w;
    px_diags_init(&w);
    size_t n = parse_fixture("a100-mig.txt", g, 4, &w);
    assert_int_equal(n, 2);
    assert_int_equal(w.n, 0);
    assert_true(isnan(g[0].utilization)); /* MIG mode hides utilization */
    assert_true(g[0].utilization != g[0].utilization);
    assert_true(g[1].utilization == 0);
    assert_true(g[0].memory_used == 13150.0 * 1048576);

    size_t len, nm = 0;
    char *text = fixture_text("a100-mig-list.txt", &len);
    px_hw_mig_instance m[8];
    px_err err;
    px_assert_ok(px_hw_parse_nvidia_smi_list(text, len, m, 8, &nm, &w, &err), &err);
    free(text);
    assert_int_equal(nm, 4);
    assert_int_equal(w.n, 0);
    for (size_t i = 0; i < nm; i++) {
        assert_int_equal(m[i].gpu_index, 0);
        assert_int_equal(m[i].device, (int)i);
        assert_true(px_str_starts_with(m[i].uuid, "MIG-"));
    }
    assert_string_equal(m[0].profile, "3g.40gb");
    assert_string_equal(m[3].profile, "1g.10gb");

    /* Hostile listings: a MIG line before any GPU, a cut line, a flood. */
    const char bad[] = "  MIG 1g.10gb Device 0: (UUID: MIG-a)\nGPU 3: X (UUID: GPU-b)\n"
                       "  MIG 1g.10gb Device 99999999999: (UUID: MIG-c)\n"
                       "  MIG 1g.10gb Device 1: (UUID: MIG-d\n"
                       "  MIG 2g.20gb Device 2: (UUID: MIG-e)\n";
    px_diags_release(&w);
    px_diags_init(&w);
    px_assert_ok(px_hw_parse_nvidia_smi_list(bad, strlen(bad), m, 8, &nm, &w, &err), &err);
    assert_int_equal(nm, 1);
    assert_int_equal(m[0].gpu_index, 3);
    assert_string_equal(m[0].uuid, "MIG-e");
    assert_int_equal(w.n, 3);
    px_diags_release(&w);
}

static void test_nvidia_smi_warns_about_garbage_and_keeps_good_rows(void **state)
{
    (void)state;
    px_hw_nvidia_gpu g[8];
    px_diags w;
    px_diags_init(&w);
    size_t n = parse_fixture("garbled.txt", g, 8, &w);
    assert_int_equal(n, 3);
    assert_int_equal(g[0].index, 0);
    assert_int_equal(g[1].index, 2);
    assert_int_equal(g[2].index, 1);
    /* Row 5: bad fields are dropped, the rest is kept. */
    assert_true(isnan(g[1].memory_total));
    assert_true(isnan(g[1].utilization));
    assert_int_equal(g[1].pcie_gen, 0);
    assert_int_equal(g[1].pcie_width, 16);
    assert_true(g[1].memory_free == 22478.0 * 1048576);
    char *all = report_text(&w);
    px_assert_contains(all, "line 2: 3 fields where 15 were expected");
    px_assert_contains(all, "line 3: \"Unable to determine the device handle");
    px_assert_contains(all, "line 4: index \"x\"");
    px_assert_contains(all, "line 5: memory.total \"23034abc\"");
    px_assert_contains(all, "line 5: utilization.gpu \"250\"");
    px_assert_contains(all, "line 5: pcie.link.gen.max \"9\"");
    px_assert_contains(all, "line 6: holds control or non-ASCII bytes");
    px_assert_contains(all, "line 8: GPU index 1 repeats line 7");
    px_assert_contains(all, "line 9: a MIG instance");
    free(all);
    px_diags_release(&w);
}

static void test_nvidia_smi_reads_no_gpus_from_empty_or_failed_output(void **state)
{
    (void)state;
    const char *quiet[] = {"empty.txt", "no-devices.txt"};
    for (size_t i = 0; i < PX_ARRAY_LEN(quiet); i++) {
        px_hw_nvidia_gpu g[2];
        px_diags w;
        px_diags_init(&w);
        assert_int_equal(parse_fixture(quiet[i], g, 2, &w), 0);
        assert_int_equal(w.n, 0);
        px_diags_release(&w);
    }
    px_hw_nvidia_gpu g[2];
    px_diags w;
    px_diags_init(&w);
    assert_int_equal(parse_fixture("driver-failed.txt", g, 2, &w), 0);
    assert_int_equal(w.n, 1);
    px_assert_contains(w.items[0].message, "NVIDIA-SMI has failed");
    px_diags_release(&w);
}

static void test_nvidia_smi_output_is_bounded(void **state)
{
    (void)state;
    const char row[] = "0, NVIDIA L4, GPU-1, 23034, 0, 22478, 0, 38, 16.31, 72.00, 2040, 8.9, "
                       "535.161.07, 4, 16\n";
    px_hw_nvidia_gpu g[64];
    px_diags w;
    px_err err;
    size_t n;
    /* More GPUs than room: the rest is ignored with a warning. */
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 0; i < 70; i++)
        px_strbuf_addf(&sb, "%d%s", i, row + 1);
    px_diags_init(&w);
    px_assert_ok(px_hw_parse_nvidia_smi(sb.buf, sb.len, g, 64, &n, &w, &err), &err);
    assert_int_equal(n, 64);
    px_assert_contains(w.items[w.n - 1].message, "more than 64 GPUs");
    px_diags_release(&w);
    /* Too many lines, one over-long line, too many bytes. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "0, NVIDIA L4");
    for (int i = 0; i < 3000; i++)
        px_strbuf_adds(&sb, " L4 L4 L4");
    px_strbuf_adds(&sb, "\n");
    for (int i = 0; i < 5000; i++)
        px_strbuf_adds(&sb, "\n");
    px_diags_init(&w);
    px_assert_ok(px_hw_parse_nvidia_smi(sb.buf, sb.len, g, 64, &n, &w, &err), &err);
    assert_int_equal(n, 0);
    assert_int_equal(w.n, 2);
    px_assert_contains(w.items[0].message, "line 1: longer than 1024 bytes");
    px_assert_contains(w.items[1].message, "more than 4096 lines");
    px_diags_release(&w);
    char *big = calloc(1, (1u << 20) + 2);
    memset(big, ',', (1u << 20) + 1);
    assert_int_equal(px_hw_parse_nvidia_smi(big, (1u << 20) + 1, g, 64, &n, NULL, &err), PX_ELIMIT);
    free(big);
    px_strbuf_release(&sb);
}

static void test_nvidia_catalog_ids_map_known_names_only(void **state)
{
    (void)state;
    assert_string_equal(px_hw_nvidia_catalog_id("NVIDIA H100 80GB HBM3"), "nvidia-h100-sxm5");
    assert_string_equal(px_hw_nvidia_catalog_id("  nvidia h200 "), "nvidia-h200-sxm");
    assert_string_equal(px_hw_nvidia_catalog_id("NVIDIA A100-SXM4-80GB"), "nvidia-a100-80gb-sxm");
    assert_string_equal(px_hw_nvidia_catalog_id("NVIDIA L4"), "nvidia-l4");
    assert_string_equal(px_hw_nvidia_catalog_id("NVIDIA GeForce RTX 4090"), "nvidia-rtx-4090");
    assert_null(px_hw_nvidia_catalog_id("NVIDIA L40"));
    assert_null(px_hw_nvidia_catalog_id("NVIDIA H100"));
    assert_null(px_hw_nvidia_catalog_id(""));
    assert_null(px_hw_nvidia_catalog_id(NULL));
}

/* ------------------------------------------------------------------ */
/* Package metadata                                                    */
/* ------------------------------------------------------------------ */

static const char torch_metadata[] =
    "Metadata-Version: 2.1\n"
    "Name: torch\n"
    "Version: 2.3.1\n"
    "Summary: Tensors and Dynamic neural networks in Python with strong GPU acceleration\n"
    "Home-page: https://pytorch.org/\n"
    "License: BSD-3\n"
    "Requires-Python: >=3.8.0\n"
    "Requires-Dist: filelock\n"
    "Requires-Dist: nvidia-cuda-nvrtc-cu12 ==12.1.105 ; platform_system == \"Linux\"\n"
    "Requires-Dist: nvidia-cuda-runtime-cu12 ==12.1.105 ; platform_system == \"Linux\" and "
    "platform_machine == \"x86_64\"\n"
    "Requires-Dist: nvidia-cudnn-cu12 ==8.9.2.26 ; platform_system == \"Linux\"\n"
    "Provides-Extra: opt-einsum\n"
    "\n"
    "Version: 9.9.9\n"
    "![PyTorch Logo](https://github.com/pytorch/pytorch/raw/main/docs/source/_static/img/"
    "pytorch-logo-dark.png)\n";

static void test_metadata_reads_name_version_and_cuda_runtime(void **state)
{
    (void)state;
    px_hw_dist_metadata md;
    px_err err;
    px_assert_ok(px_hw_parse_dist_metadata(torch_metadata, strlen(torch_metadata), &md, &err),
                 &err);
    assert_string_equal(md.name, "torch");
    assert_string_equal(md.version, "2.3.1"); /* not the body's "Version: 9.9.9" */
    assert_string_equal(md.cuda_runtime, "12.1");

    const char pkg_info[] = "Metadata-Version: 1.0\r\nname: cupy-cuda12x\r\nversion: 13.1.0\r\n"
                            "Description: a folded\r\n        description\r\n"
                            "Requires-Dist: nvidia-cuda-runtime-cu12>=12.0\r\n";
    px_assert_ok(px_hw_parse_dist_metadata(pkg_info, strlen(pkg_info), &md, &err), &err);
    assert_string_equal(md.name, "cupy-cuda12x");
    assert_string_equal(md.version, "13.1.0");
    assert_string_equal(md.cuda_runtime, "12");
}

static void test_metadata_refuses_hostile_files(void **state)
{
    (void)state;
    px_hw_dist_metadata md;
    px_err err;
    static const struct {
        const char *text;
        size_t len;
        const char *needle;
    } cases[] = {
        {"Name: torch\n", 0, "no Version header"},
        {"Version: 1.0\n", 0, "no Name header"},
        {"Name: torch\n\nVersion: 1.0\n", 0, "no Version header"},
        {"", 0, "no Name header"},
        {"Name: \nVersion: 1.0\n", 0, "line 1: Name"},
        {"Name: torch vision\nVersion: 1.0\n", 0, "line 1: Name"},
        {"Name: torch\nVersion: 1.0 beta\n", 0, "line 2: Version"},
        {"Name: to\0rch\nVersion: 1.0\n", 24, "line 1: Name"},
        {"Name: torch\nVersion: \xff\xfe\x01\n", 0, "line 2: Version"},
        {"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00", 10, "no Name header"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].text);
        if (px_hw_parse_dist_metadata(cases[i].text, len, &md, &err) != PX_EPARSE)
            fail_msg("case %zu was accepted", i);
        px_assert_contains(err.msg, cases[i].needle);
    }
    /* A huge name line and a huge header block. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "Name: ");
    for (int i = 0; i < 100000; i++)
        px_strbuf_addch(&sb, 'a');
    px_strbuf_adds(&sb, "\nVersion: 1\n");
    assert_int_equal(px_hw_parse_dist_metadata(sb.buf, sb.len, &md, &err), PX_EPARSE);
    px_assert_contains(err.msg, "Name is not 1 to 127");
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "Name: torch\n");
    for (int i = 0; i < 20000; i++)
        px_strbuf_adds(&sb, "Classifier: x\n");
    px_strbuf_adds(&sb, "Version: 1.0\n");
    /* The Version header lies past the 64 KiB that are read. */
    assert_int_equal(px_hw_parse_dist_metadata(sb.buf, sb.len, &md, &err), PX_EPARSE);
    px_assert_contains(err.msg, "no Version header");
    px_strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meminfo_reads_a_kernel_sample),
        cmocka_unit_test(test_meminfo_estimates_available_on_old_kernels),
        cmocka_unit_test(test_meminfo_refuses_hostile_text),
        cmocka_unit_test(test_nvidia_smi_reads_eight_h100s),
        cmocka_unit_test(test_nvidia_smi_reads_each_single_gpu_recording),
        cmocka_unit_test(test_nvidia_smi_treats_not_available_fields_as_absent),
        cmocka_unit_test(test_nvidia_smi_reads_mig_enabled_gpus_and_their_instances),
        cmocka_unit_test(test_nvidia_smi_warns_about_garbage_and_keeps_good_rows),
        cmocka_unit_test(test_nvidia_smi_reads_no_gpus_from_empty_or_failed_output),
        cmocka_unit_test(test_nvidia_smi_output_is_bounded),
        cmocka_unit_test(test_nvidia_catalog_ids_map_known_names_only),
        cmocka_unit_test(test_metadata_reads_name_version_and_cuda_runtime),
        cmocka_unit_test(test_metadata_refuses_hostile_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
