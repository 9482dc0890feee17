/* The device catalogue: every entry loads, every figure is sourced, and an
 * inventory's own members override the entry it names. */
#include "px_test.h"

#include <dirent.h>
#include <math.h>
#include <string.h>

#include "plexus/hw.h"

static px_hw_graph *read_ok(const char *text)
{
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_err err;
    px_status st = px_hw_graph_from_json(text, strlen(text), "t.json", NULL, &g, &diags, &err);
    if (st != PX_OK) {
        char *report = px_diags_format(&diags, "t.json");
        fail_msg("inventory refused: %s\n%s", err.msg, report ? report : "");
    }
    assert_int_equal(diags.n_warnings, 0);
    px_diags_release(&diags);
    return g;
}

static void test_catalog_has_every_required_entry(void **state)
{
    (void)state;
    px_hw_catalog *cat;
    px_err err;
    px_assert_ok(px_hw_catalog_new_builtin(&cat, &err), &err);
    static const char *const devices[] = {
        "nvidia-h100-sxm5", "nvidia-h200-sxm", "nvidia-a100-80gb-sxm", "nvidia-l4",
        "nvidia-rtx-4090",  "nvidia-rtx-3090", "amd-mi300x",           "intel-gaudi3",
        "google-tpu-v5e",   "apple-m2-ultra",  "amd-epyc-9654",
    };
    static const char *const links[] = {
        "nvlink-4",      "nvlink-3",     "pcie-4-x16", "pcie-5-x16", "infiniband-ndr-400g",
        "ethernet-100g", "ethernet-400g"};
    for (size_t i = 0; i < PX_ARRAY_LEN(devices); i++)
        if (!px_hw_catalog_find_device(cat, devices[i]))
            fail_msg("catalogue entry %s is missing", devices[i]);
    for (size_t i = 0; i < PX_ARRAY_LEN(links); i++)
        if (!px_hw_catalog_find_link(cat, links[i]))
            fail_msg("link entry %s is missing", links[i]);
    assert_null(px_hw_catalog_find_device(cat, "nvidia-h100-sxm"));
    const px_hw_device *h100 = px_hw_catalog_find_device(cat, "nvidia-h100-sxm5");
    assert_int_equal(h100->cls, PX_HW_CLASS_GPU);
    assert_true(fabs(h100->compute[PX_HW_DTYPE_BF16].value - 989.4e12) < 1e9);
    assert_true(fabs(px_hw_device_memory_bandwidth(h100) - 3.35e12) < 1e6);
    assert_false(px_hw_has(h100->compute[PX_HW_DTYPE_INT4]));
    const px_hw_link *nvl = px_hw_catalog_find_link(cat, "nvlink-4");
    assert_int_equal(nvl->kind, PX_HW_LINK_NVLINK4);
    assert_true(fabs(nvl->bandwidth.value - 450e9) < 1);
    /* Sorted by id. */
    for (size_t i = 1; i < px_hw_catalog_n_devices(cat); i++)
        assert_true(strcmp(px_hw_catalog_device(cat, i - 1)->id, px_hw_catalog_device(cat, i)->id) <
                    0);
    assert_null(px_hw_catalog_device(cat, px_hw_catalog_n_devices(cat)));
    px_hw_catalog_free(cat);
    px_hw_catalog_free(NULL);
}

static void check_sourced(const px_qty *q, const char *entry, const char *what)
{
    if (!px_hw_has(*q))
        return;
    if (q->prov.kind != PX_PROV_DATASHEET || !q->prov.source || strlen(q->prov.source) < 10)
        fail_msg("%s: %s has no datasheet provenance and source", entry, what);
    if (!(q->value > 0) || !isfinite(q->value))
        fail_msg("%s: %s is not a positive number", entry, what);
}

static void test_catalog_every_figure_has_provenance_and_source(void **state)
{
    (void)state;
    px_hw_catalog *cat;
    px_assert_ok(px_hw_catalog_new_builtin(&cat, NULL), (px_err *)NULL);
    size_t figures = 0;
    for (size_t i = 0; i < px_hw_catalog_n_devices(cat); i++) {
        const px_hw_device *d = px_hw_catalog_device(cat, i);
        size_t present = 0;
        for (int k = 0; k < PX_HW_DTYPE_COUNT; k++) {
            check_sourced(&d->compute[k], d->id, px_hw_dtype_name((px_hw_dtype)k));
            present += px_hw_has(d->compute[k]);
        }
        if (present == 0)
            fail_msg("%s gives no compute figure", d->id);
        if (d->n_memory == 0)
            fail_msg("%s gives no memory tier", d->id);
        for (size_t m = 0; m < d->n_memory; m++) {
            check_sourced(&d->memory[m].capacity, d->id, "capacity");
            check_sourced(&d->memory[m].bandwidth, d->id, "bandwidth");
            check_sourced(&d->memory[m].latency, d->id, "latency");
            assert_true(px_hw_has(d->memory[m].bandwidth));
        }
        check_sourced(&d->power_tdp, d->id, "tdp");
        check_sourced(&d->power_idle, d->id, "idle");
        check_sourced(&d->thermal_limit, d->id, "thermal limit");
        check_sourced(&d->cost, d->id, "cost");
        check_sourced(&d->mtbf, d->id, "mtbf");
        figures += present + d->n_memory;
    }
    for (size_t i = 0; i < px_hw_catalog_n_links(cat); i++) {
        const px_hw_link *l = px_hw_catalog_link(cat, i);
        check_sourced(&l->bandwidth, l->id, "bandwidth");
        check_sourced(&l->latency, l->id, "latency");
        assert_true(px_hw_has(l->bandwidth));
        figures++;
    }
    assert_true(figures > 50);
    px_hw_catalog_free(cat);
}

/* Every file under data/catalog/ is compiled in: adding a file without
 * rebuilding, or a file the reader skips, fails here. */
static void test_catalog_embeds_every_data_file(void **state)
{
    (void)state;
    size_t files = 0;
    static const char *const dirs[] = {"data/catalog/devices", "data/catalog/links"};
    for (size_t i = 0; i < PX_ARRAY_LEN(dirs); i++) {
        char *path = px_test_source_path(dirs[i]);
        DIR *dir = opendir(path);
        assert_non_null(dir);
        struct dirent *e;
        while ((e = readdir(dir)))
            files += px_str_ends_with(e->d_name, ".json");
        closedir(dir);
        free(path);
    }
    px_hw_catalog *cat;
    px_assert_ok(px_hw_catalog_new_builtin(&cat, NULL), (px_err *)NULL);
    assert_int_equal(px_hw_catalog_n_devices(cat) + px_hw_catalog_n_links(cat), files);
    px_hw_catalog_free(cat);
}

static void test_catalog_values_fill_device_and_overrides_win(void **state)
{
    (void)state;
    px_hw_graph *g =
        read_ok("{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\", \"devices\": ["
                " {\"id\": \"gpu0\", \"catalog\": \"nvidia-h100-sxm5\","
                "  \"compute\": {\"f32\": \"60 TFLOP/s\"},"
                "  \"memory\": [{\"id\": \"hbm\", \"capacity\": \"79 GiB\"},"
                "             {\"id\": \"sram\", \"kind\": \"sram\", \"capacity\": \"50 MB\"}],"
                "  \"power\": {\"idle\": \"70 W\"}, \"model\": \"H100 (lab unit)\"}]}]}");
    const px_hw_view *v = px_hw_graph_view(g);
    assert_int_equal(v->n_devices, 1);
    const px_hw_device *d = &v->devices[0];
    assert_string_equal(d->catalog, "nvidia-h100-sxm5");
    assert_string_equal(d->model, "H100 (lab unit)");
    assert_string_equal(d->vendor, "nvidia");
    assert_string_equal(d->capability, "9.0");
    /* The override and its (absent) provenance. */
    assert_true(fabs(d->compute[PX_HW_DTYPE_F32].value - 60e12) < 1);
    assert_int_equal(d->compute[PX_HW_DTYPE_F32].prov.kind, PX_PROV_UNSPECIFIED);
    /* A value the inventory left out, from the catalogue, with its source. */
    assert_true(fabs(d->compute[PX_HW_DTYPE_BF16].value - 989.4e12) < 1e9);
    assert_int_equal(d->compute[PX_HW_DTYPE_BF16].prov.kind, PX_PROV_DATASHEET);
    assert_non_null(strstr(d->compute[PX_HW_DTYPE_BF16].prov.source, "H100"));
    /* Tiers merge by id: hbm keeps the catalogue's bandwidth and kind. */
    assert_int_equal(d->n_memory, 2);
    assert_string_equal(d->memory[0].id, "hbm");
    assert_int_equal(d->memory[0].kind, PX_HW_MEM_HBM);
    assert_true(fabs(d->memory[0].capacity.value - 79.0 * 1073741824) < 1);
    assert_true(fabs(d->memory[0].bandwidth.value - 3.35e12) < 1e6);
    assert_string_equal(d->memory[0].global_id, "n1.gpu0.hbm");
    assert_string_equal(d->memory[1].id, "sram");
    assert_true(fabs(d->power_idle.value - 70) < 1e-9);
    assert_true(fabs(d->power_tdp.value - 700) < 1e-9);
    px_hw_graph_free(g);
}

static void test_catalog_link_entry_fills_link(void **state)
{
    (void)state;
    px_hw_graph *g =
        read_ok("{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\", \"devices\": ["
                " {\"id\": \"a\", \"catalog\": \"nvidia-a100-80gb-sxm\"},"
                " {\"id\": \"b\", \"catalog\": \"nvidia-a100-80gb-sxm\"}]}],"
                " \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\", \"catalog\": \"nvlink-3\","
                "  \"latency\": \"1 us\"}]}");
    const px_hw_view *v = px_hw_graph_view(g);
    assert_int_equal(v->n_links, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(v->links[i].kind, PX_HW_LINK_NVLINK3);
        assert_true(fabs(v->links[i].bandwidth.value - 300e9) < 1);
        assert_int_equal(v->links[i].bandwidth.prov.kind, PX_PROV_DATASHEET);
        assert_true(fabs(v->links[i].latency.value - 1e-6) < 1e-15);
        assert_true(v->links[i].n_collectives > 0);
    }
    px_hw_graph_free(g);
}

static void test_catalog_refuses_unsourced_entry(void **state)
{
    (void)state;
    const char *texts[] = {
        "{\"schema\": \"plexus.catalog.device/1\", \"id\": \"x-gpu\", \"class\": \"gpu\","
        " \"compute\": {\"f32\": \"10 TFLOP/s\"},"
        " \"memory\": [{\"id\": \"hbm\", \"kind\": \"hbm\", \"bandwidth\": {\"value\": \"1 TB/s\","
        "   \"provenance\": \"datasheet\", \"source\": \"X datasheet\"}}]}",
    };
    const char *names[] = {"devices/x-gpu.json"};
    px_diags diags;
    px_diags_init(&diags);
    px_hw_catalog *cat = NULL;
    px_err err;
    assert_int_equal(px_hw_catalog_new_from_texts(texts, names, 1, &cat, &diags, &err),
                     PX_EVALIDATE);
    assert_null(cat);
    assert_int_equal(diags.n_errors, 1);
    assert_string_equal(diags.items[0].pointer, "devices/x-gpu.json#/compute/f32");
    px_assert_contains(diags.items[0].message, "no provenance and source");
    px_diags_release(&diags);
}

static void test_catalog_custom_entries_and_json(void **state)
{
    (void)state;
    const char *texts[] = {
        "{\"schema\": \"plexus.catalog.device/1\", \"id\": \"lab-npu\", \"class\": \"npu\","
        " \"compute\": {\"int8\": {\"value\": \"100 TOP/s\", \"provenance\": \"datasheet\","
        "   \"source\": \"Lab NPU manual\", \"uncertainty\": 0.1}},"
        " \"memory\": [{\"id\": \"ddr\", \"kind\": \"ddr\", \"capacity\": {\"value\": \"8 GiB\","
        "   \"provenance\": \"datasheet\", \"source\": \"Lab NPU manual\"},"
        "   \"bandwidth\": {\"value\": \"100 GB/s\", \"provenance\": \"datasheet\","
        "   \"source\": \"Lab NPU manual\"}}]}",
        "{\"schema\": \"plexus.catalog.link/1\", \"id\": \"lab-bus\", \"kind\": \"other\","
        " \"bandwidth\": {\"value\": \"5 GB/s\", \"provenance\": \"datasheet\","
        "   \"source\": \"Lab bus spec\"}}",
    };
    px_hw_catalog *cat;
    px_err err;
    px_assert_ok(px_hw_catalog_new_from_texts(texts, NULL, 2, &cat, NULL, &err), &err);
    assert_int_equal(px_hw_catalog_n_devices(cat), 1);
    assert_int_equal(px_hw_catalog_n_links(cat), 1);
    json_t *doc;
    px_assert_ok(px_hw_catalog_to_json(cat, &doc, &err), &err);
    char *text = px_json_dump_canonical(doc);
    px_assert_contains(text, "\"id\": \"lab-npu\"");
    px_assert_contains(text, "\"source\": \"Lab NPU manual\"");
    px_assert_contains(text, "\"value\": \"100 TFLOP/s\""); /* OP/s print as FLOP/s */
    px_assert_contains(text, "\"id\": \"lab-bus\"");
    free(text);
    json_decref(doc);

    /* An inventory read against this catalogue sees its entries only. */
    const char *inv = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\","
                      " \"devices\": [{\"id\": \"npu0\", \"catalog\": \"lab-npu\"}]}]}";
    px_hw_read_options opt = {.catalog = cat};
    px_hw_graph *g;
    px_assert_ok(px_hw_graph_from_json(inv, strlen(inv), "lab.json", &opt, &g, NULL, &err), &err);
    assert_int_equal(px_hw_graph_view(g)->devices[0].cls, PX_HW_CLASS_NPU);
    px_hw_graph_free(g);
    px_hw_catalog_free(cat);
}

static void test_catalog_unknown_entry_suggests_the_close_one(void **state)
{
    (void)state;
    const char *inv = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\","
                      " \"devices\": [{\"id\": \"gpu0\", \"catalog\": \"nvidia-h100-sxm\"}]}]}";
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g;
    assert_int_equal(px_hw_graph_from_json(inv, strlen(inv), "t.json", NULL, &g, &diags, NULL),
                     PX_EVALIDATE);
    assert_null(g);
    assert_int_equal(diags.n_errors, 1);
    assert_string_equal(diags.items[0].pointer, "/nodes/0/devices/0/catalog");
    px_assert_contains(diags.items[0].message, "unknown catalogue entry \"nvidia-h100-sxm\"");
    px_assert_contains(diags.items[0].fix, "did you mean \"nvidia-h100-sxm5\"");
    px_diags_release(&diags);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_catalog_has_every_required_entry),
        cmocka_unit_test(test_catalog_every_figure_has_provenance_and_source),
        cmocka_unit_test(test_catalog_embeds_every_data_file),
        cmocka_unit_test(test_catalog_values_fill_device_and_overrides_win),
        cmocka_unit_test(test_catalog_link_entry_fills_link),
        cmocka_unit_test(test_catalog_refuses_unsourced_entry),
        cmocka_unit_test(test_catalog_custom_entries_and_json),
        cmocka_unit_test(test_catalog_unknown_entry_suggests_the_close_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
