/* Canonical export: equal graphs export byte-identical text whatever the
 * order of their input, and export -> read -> export is a fixed point. */
#include "px_test.h"

#include <string.h>

#include "plexus/hw.h"

static const char *const packs[] = {
    "data/scenarios/homogeneous-8xh100.json",
    "data/scenarios/hetero-pair-h100-l4.json",
    "data/scenarios/irregular-4dev.json",
    "data/scenarios/faulted-cluster.json",
    "data/scenarios/adversarial-fast-behind-slow-link.json",
    "data/scenarios/emu-small.json",
};

static px_hw_graph *load_pack(const char *rel)
{
    char *path = px_test_source_path(rel);
    px_hw_graph *g;
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, NULL, &err), &err);
    free(path);
    return g;
}

static px_hw_graph *from_text(const char *text)
{
    px_hw_graph *g;
    px_err err;
    px_diags diags;
    px_diags_init(&diags);
    if (px_hw_graph_from_json(text, strlen(text), "export.json", NULL, &g, &diags, &err) != PX_OK) {
        char *report = px_diags_format(&diags, "export.json");
        fail_msg("re-reading an export failed: %s\n%s", err.msg, report ? report : "");
    }
    px_diags_release(&diags);
    return g;
}

static char *export_text(const px_hw_graph *g)
{
    char *text;
    size_t len;
    px_err err;
    px_assert_ok(px_hw_graph_export(g, &text, &len, &err), &err);
    assert_int_equal(strlen(text), len);
    return text;
}

/* Shuffles every array (except uncertainty intervals, whose order means
 * something), rebuilds every object with its members in reverse order, and
 * writes bidirectional links the other way round. */
static json_t *scramble(const json_t *v, px_rng *rng, const char *key)
{
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        json_t *a = json_array();
        size_t *order = malloc((n + 1) * sizeof *order);
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        if (!key || strcmp(key, "uncertainty"))
            for (size_t i = n; i > 1; i--) {
                size_t j = (size_t)px_rng_below(rng, i);
                size_t t = order[i - 1];
                order[i - 1] = order[j];
                order[j] = t;
            }
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, scramble(json_array_get(v, order[i]), rng, NULL));
        free(order);
        return a;
    }
    if (json_is_object(v)) {
        size_t n = json_object_size(v);
        const char **keys = malloc((n + 1) * sizeof *keys);
        size_t k = 0;
        const char *kk;
        json_t *child;
        json_object_foreach((json_t *)v, kk, child) keys[k++] = kk;
        json_t *o = json_object();
        for (size_t i = n; i > 0; i--)
            json_object_set_new(o, keys[i - 1],
                                scramble(json_object_get(v, keys[i - 1]), rng, keys[i - 1]));
        free(keys);
        json_t *from = json_object_get(o, "from"), *to = json_object_get(o, "to");
        json_t *bidi = json_object_get(o, "bidirectional");
        if (from && to && (!bidi || json_is_true(bidi)) && px_rng_below(rng, 2)) {
            json_incref(from);
            json_object_set(o, "from", to);
            json_object_set_new(o, "to", from);
        }
        return o;
    }
    return json_deep_copy(v);
}

static void test_export_is_byte_identical_for_shuffled_equal_inputs(void **state)
{
    (void)state;
    for (size_t p = 0; p < PX_ARRAY_LEN(packs); p++) {
        char *path = px_test_source_path(packs[p]);
        json_t *doc;
        px_err err;
        px_assert_ok(px_json_load_file(path, NULL, &doc, &err), &err);
        px_hw_graph *g = load_pack(packs[p]);
        char *want = export_text(g);
        char want_id[65];
        px_assert_ok(px_hw_graph_digest(g, want_id, &err), &err);
        px_hw_graph_free(g);
        for (uint64_t seed = 1; seed <= 4; seed++) {
            px_rng rng;
            px_rng_seed(&rng, seed * 7919 + p);
            json_t *mixed = scramble(doc, &rng, NULL);
            char *text = json_dumps(mixed, JSON_INDENT(1));
            px_hw_graph *h = from_text(text);
            char *got = export_text(h);
            if (strcmp(want, got))
                fail_msg("%s: shuffled input (seed %llu) exports differently", packs[p],
                         (unsigned long long)seed);
            char id[65];
            px_assert_ok(px_hw_graph_digest(h, id, &err), &err);
            assert_string_equal(id, want_id);
            free(got);
            px_hw_graph_free(h);
            free(text);
            json_decref(mixed);
        }
        free(want);
        json_decref(doc);
        free(path);
    }
}

static void test_export_read_export_is_a_fixed_point(void **state)
{
    (void)state;
    for (size_t p = 0; p < PX_ARRAY_LEN(packs); p++) {
        px_hw_graph *g = load_pack(packs[p]);
        char *first = export_text(g);
        px_hw_graph *h = from_text(first);
        char *second = export_text(h);
        if (strcmp(first, second))
            fail_msg("%s: export -> read -> export changed the text", packs[p]);
        /* The views agree too. */
        const px_hw_view *a = px_hw_graph_view(g), *b = px_hw_graph_view(h);
        assert_int_equal(a->n_nodes, b->n_nodes);
        assert_int_equal(a->n_devices, b->n_devices);
        assert_int_equal(a->n_links, b->n_links);
        assert_int_equal(a->n_domains, b->n_domains);
        for (size_t i = 0; i < a->n_devices; i++) {
            assert_string_equal(a->devices[i].global_id, b->devices[i].global_id);
            for (int k = 0; k < PX_HW_DTYPE_COUNT; k++)
                assert_true(a->devices[i].compute[k].value == b->devices[i].compute[k].value);
            assert_int_equal(a->devices[i].emulated, b->devices[i].emulated);
            assert_int_equal(a->devices[i].n_domains, b->devices[i].n_domains);
        }
        for (size_t i = 0; i < a->n_links; i++) {
            assert_int_equal(a->links[i].from, b->links[i].from);
            assert_int_equal(a->links[i].to, b->links[i].to);
            assert_true(a->links[i].bandwidth.value == b->links[i].bandwidth.value);
        }
        free(first);
        free(second);
        px_hw_graph_free(h);
        px_hw_graph_free(g);
    }
}

/* A node's cpu counts come back with their provenance, and read again
 * to the same figures. */
static void test_export_keeps_host_cpu_counts(void **state)
{
    (void)state;
    px_hw_graph *g = from_text(
        "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\", \"devices\": [], "
        "\"cpu\": {\"threads\": 16, \"cores\": {\"value\": 8, \"provenance\": \"discovered\", "
        "\"source\": \"sysconf\"}}}]}");
    char *text = export_text(g);
    json_t *doc = json_loads(text, 0, NULL);
    json_t *cpu = json_object_get(json_array_get(json_object_get(doc, "nodes"), 0), "cpu");
    json_t *cores = json_object_get(cpu, "cores");
    assert_string_equal(json_string_value(json_object_get(cores, "provenance")), "discovered");
    assert_string_equal(json_string_value(json_object_get(cores, "source")), "sysconf");
    px_hw_graph *h = from_text(text);
    const px_hw_node *n = &px_hw_graph_view(h)->nodes[0];
    assert_true(n->cpu_cores.value == 8 && n->cpu_threads.value == 16);
    assert_int_equal(n->cpu_cores.prov.kind, PX_PROV_DISCOVERED);
    json_decref(doc);
    free(text);
    px_hw_graph_free(h);
    px_hw_graph_free(g);
}

static void test_export_writes_catalogue_values_with_sources(void **state)
{
    (void)state;
    px_hw_graph *g = load_pack("data/scenarios/hetero-pair-h100-l4.json");
    char *text = export_text(g);
    px_assert_contains(text, "\"schema\": \"plexus.inventory/1\"");
    px_assert_contains(text, "\"catalog\": \"nvidia-h100-sxm5\"");
    px_assert_contains(text, "\"provenance\": \"datasheet\"");
    px_assert_contains(text, "NVIDIA H100 Tensor Core GPU datasheet");
    px_assert_contains(text, "\"value\": \"989.4 TFLOP/s\"");
    px_assert_contains(text, "\"value\": \"12.5 GB/s\""); /* 100 Gbit/s in SI bytes */
    px_assert_contains(text, "\"trust\": \"encrypted\"");
    free(text);
    px_hw_graph_free(g);
}

static void test_export_digest_changes_with_any_figure(void **state)
{
    (void)state;
    const char *a = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\","
                    " \"devices\": [{\"id\": \"g\", \"class\": \"gpu\", \"compute\":"
                    " {\"f32\": \"10 TFLOP/s\"}}]}]}";
    const char *b = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\","
                    " \"devices\": [{\"id\": \"g\", \"class\": \"gpu\", \"compute\":"
                    " {\"f32\": \"10000 GFLOP/s\"}}]}]}";
    const char *c = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\","
                    " \"devices\": [{\"id\": \"g\", \"class\": \"gpu\", \"compute\":"
                    " {\"f32\": \"10.5 TFLOP/s\"}}]}]}";
    px_hw_graph *ga = from_text(a), *gb = from_text(b), *gc = from_text(c);
    char ia[65], ib[65], ic[65];
    px_assert_ok(px_hw_graph_digest(ga, ia, NULL), (px_err *)NULL);
    px_assert_ok(px_hw_graph_digest(gb, ib, NULL), (px_err *)NULL);
    px_assert_ok(px_hw_graph_digest(gc, ic, NULL), (px_err *)NULL);
    assert_string_equal(ia, ib); /* the same figure in other units */
    assert_string_not_equal(ia, ic);
    char *text = export_text(gb);
    px_assert_contains(text, "\"f32\": \"10 TFLOP/s\"");
    free(text);
    px_hw_graph_free(ga);
    px_hw_graph_free(gb);
    px_hw_graph_free(gc);
}

static void test_export_writes_inherited_values_once(void **state)
{
    (void)state;
    const char *text =
        "{\"schema\": \"plexus.inventory/1\", \"emulated\": true,"
        " \"domains\": [{\"id\": \"r\", \"kind\": \"rack\"}, {\"id\": \"p\", \"kind\": \"power\"}],"
        " \"nodes\": [{\"id\": \"n1\", \"emulated\": true, \"domains\": [\"r\"], \"devices\": ["
        "  {\"id\": \"g\", \"class\": \"gpu\", \"emulated\": true, \"domains\": [\"r\", "
        "\"p\"]}]}]}";
    px_hw_graph *g = from_text(text);
    const px_hw_view *v = px_hw_graph_view(g);
    assert_true(v->nodes[0].emulated);
    assert_true(v->devices[0].emulated);
    assert_int_equal(v->devices[0].n_domains, 2);
    char *out = export_text(g);
    /* "emulated" once, at the top; the device lists only the domain it adds. */
    const char *first = strstr(out, "\"emulated\"");
    assert_non_null(first);
    assert_null(strstr(first + 1, "\"emulated\""));
    px_assert_contains(out, "\"domains\": [\n            \"p\"\n          ]");
    free(out);
    px_hw_graph_free(g);
}

/* Links with the same ends and no ids are told apart by their text, so
 * their order in the input does not show in the export. */
static void test_export_orders_links_nothing_else_tells_apart(void **state)
{
    (void)state;
    const char *head = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"a\"},"
                       " {\"id\": \"b\"}], \"links\": [";
    const char *l1 = "{\"from\": \"a\", \"to\": \"b\", \"kind\": \"ethernet\","
                     " \"bandwidth\": \"10 Gbit/s\"}";
    const char *l2 = "{\"from\": \"b\", \"to\": \"a\", \"kind\": \"ethernet\","
                     " \"bandwidth\": \"25 Gbit/s\"}";
    const char *l3 = "{\"from\": \"a\", \"to\": \"b\", \"kind\": \"infiniband\","
                     " \"bandwidth\": \"10 Gbit/s\"}";
    char *x = px_asprintf("%s%s, %s, %s]}", head, l1, l2, l3);
    char *y = px_asprintf("%s%s, %s, %s]}", head, l3, l2, l1);
    px_hw_graph *gx = from_text(x), *gy = from_text(y);
    char *ex = export_text(gx), *ey = export_text(gy);
    assert_string_equal(ex, ey);
    /* The link declared b -> a is written a -> b, with the others. */
    const char *p25 = strstr(ex, "3.125 GB/s"), *p10 = strstr(ex, "1.25 GB/s");
    assert_non_null(p25);
    assert_non_null(p10);
    free(ex);
    free(ey);
    px_hw_graph_free(gx);
    px_hw_graph_free(gy);
    free(x);
    free(y);
}

/* The export writes text directly; it must be exactly what jansson's
 * canonical dump prints for the same document. */
static void test_export_text_is_jansson_canonical(void **state)
{
    (void)state;
    for (size_t p = 0; p < PX_ARRAY_LEN(packs); p++) {
        px_hw_graph *g = load_pack(packs[p]);
        char *text = export_text(g);
        json_t *tree;
        px_err err;
        px_assert_ok(px_hw_graph_to_json(g, &tree, &err), &err);
        char *dumped = px_json_dump_canonical(tree);
        assert_string_equal(text, dumped);
        free(dumped);
        json_decref(tree);
        free(text);
        px_hw_graph_free(g);
    }
    /* Escapes, reals and every optional member. */
    const char *odd =
        "{\"schema\": \"plexus.inventory/1\", \"name\": \"q\\\"uote\\\\ \\u0001\\t\u00e9/\","
        " \"domains\": [{\"id\": \"z\", \"kind\": \"zone\", \"mtbf\": \"1e6 h\"},"
        "  {\"id\": \"r\", \"kind\": \"rack\", \"parent\": \"z\"}],"
        " \"nodes\": [{\"id\": \"n\", \"hostname\": \"h\", \"emulated\": true,"
        "  \"domains\": [\"r\"], \"os\": {\"kernel\": \"6.1\", \"distro\": \"d\"},"
        "  \"python\": {\"path\": \"/usr/bin/python3\", \"version\": \"3.11\"},"
        "  \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.3\"}, {\"name\": \"jax\"}],"
        "  \"live\": {\"memory_free\": \"1 GB\", \"load\": 0.1},"
        "  \"memory\": [{\"id\": \"ddr\", \"kind\": \"ddr\", \"capacity\": \"3 GiB\","
        "   \"latency\": {\"value\": \"90 ns\", \"provenance\": \"measured\","
        "   \"at\": \"2026-11-29T16:25:10Z\", \"uncertainty\": [\"80 ns\", \"100 ns\"],"
        "   \"valid\": {\"param\": \"stride\", \"min\": \"64 B\", \"max\": \"4 KiB\"}}}],"
        "  \"devices\": [{\"id\": \"g\", \"class\": \"fpga\", \"vendor\": \"v\", \"model\": \"m\","
        "   \"backend\": \"cpu\", \"capability\": \"x\", \"driver\": \"1\","
        "   \"runtime\": {\"name\": \"rt\", \"version\": \"2\"}, \"ops\": [],"
        "   \"kernels\": [\"k2\", \"k1\"], \"compute\": {\"int4\": \"3e-7 TOP/s\","
        "   \"tf32\": {\"value\": \"1 TFLOP/s\", \"uncertainty\": 0.1}},"
        "   \"power\": {\"tdp\": \"10 W\"}, \"thermal\": {\"time_constant\": \"3 s\"},"
        "   \"cost\": \"0.1 $/h\", \"mtbf\": \"1 h\", \"domains\": [\"z\"],"
        "   \"live\": {\"utilization\": 0.3, \"temperature\": \"40 C\"}}]},"
        "  {\"id\": \"m\"}],"
        " \"links\": [{\"from\": \"n\", \"to\": \"m\", \"kind\": \"ethernet\","
        "  \"bandwidth\": \"1 Gbit/s\", \"dollars_per_gb\": 0.1, \"trust\": \"untrusted\","
        "  \"collectives\": [\"allreduce\"], \"contention\": \"sw\", \"failure_group\": \"fg\","
        "  \"energy_per_byte\": \"5 pJ\", \"setup\": \"1 us\", \"latency\": \"10 us\"},"
        "  {\"from\": \"m\", \"to\": \"n\", \"kind\": \"ethernet\", \"bandwidth\": \"1 Gbit/s\"}]}";
    px_hw_graph *g = from_text(odd);
    char *text = export_text(g);
    json_t *tree;
    px_assert_ok(px_hw_graph_to_json(g, &tree, NULL), (px_err *)NULL);
    char *dumped = px_json_dump_canonical(tree);
    assert_string_equal(text, dumped);
    px_assert_contains(text, "\"dollars_per_gb\": 0.10000000000000001");
    px_assert_contains(text, "\\u0001");
    free(dumped);
    json_decref(tree);
    free(text);
    px_hw_graph_free(g);

    px_hw_catalog *cat;
    px_assert_ok(px_hw_catalog_new_builtin(&cat, NULL), (px_err *)NULL);
    size_t len;
    px_assert_ok(px_hw_catalog_export(cat, &text, &len, NULL), (px_err *)NULL);
    px_assert_ok(px_hw_catalog_to_json(cat, &tree, NULL), (px_err *)NULL);
    dumped = px_json_dump_canonical(tree);
    assert_string_equal(text, dumped);
    free(dumped);
    json_decref(tree);
    free(text);
    px_hw_catalog_free(cat);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_is_byte_identical_for_shuffled_equal_inputs),
        cmocka_unit_test(test_export_read_export_is_a_fixed_point),
        cmocka_unit_test(test_export_keeps_host_cpu_counts),
        cmocka_unit_test(test_export_writes_catalogue_values_with_sources),
        cmocka_unit_test(test_export_digest_changes_with_any_figure),
        cmocka_unit_test(test_export_writes_inherited_values_once),
        cmocka_unit_test(test_export_text_is_jansson_canonical),
        cmocka_unit_test(test_export_orders_links_nothing_else_tells_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
