/* Lookups, adjacency and path search over the directional edges. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/hw.h"

/* a-b direct: narrow and short.  a-c-b: wide and long.  a-f-b: as wide,
 * shorter than a-c-b.  a->d one way only.  e: no links. */
static const char graph_text[] =
    "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n1\", \"devices\": ["
    " {\"id\": \"a\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\","
    "  \"capacity\": \"1 GiB\", \"bandwidth\": \"1 TB/s\"}]},"
    " {\"id\": \"b\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\","
    "  \"capacity\": \"2 GiB\", \"bandwidth\": \"1 TB/s\"}]},"
    " {\"id\": \"c\", \"class\": \"gpu\"}, {\"id\": \"d\", \"class\": \"gpu\"},"
    " {\"id\": \"e\", \"class\": \"gpu\"}, {\"id\": \"f\", \"class\": \"gpu\"}]}],"
    " \"links\": ["
    "  {\"id\": \"ab\", \"from\": \"n1.a\", \"to\": \"n1.b\", \"kind\": \"pcie4\", \"bandwidth\": "
    "\"10 GB/s\", \"latency\": \"1 us\"},"
    "  {\"id\": \"ac\", \"from\": \"n1.a\", \"to\": \"n1.c\", \"kind\": \"nvlink4\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"5 us\"},"
    "  {\"id\": \"cb\", \"from\": \"n1.c\", \"to\": \"n1.b\", \"kind\": \"nvlink4\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"5 us\"},"
    "  {\"id\": \"af\", \"from\": \"n1.a\", \"to\": \"n1.f\", \"kind\": \"nvlink4\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"1 us\"},"
    "  {\"id\": \"fb\", \"from\": \"n1.f\", \"to\": \"n1.b\", \"kind\": \"nvlink4\", "
    "\"bandwidth\": \"100 GB/s\", \"latency\": \"0.5 us\", \"setup\": \"0.5 us\"},"
    "  {\"id\": \"ad\", \"from\": \"n1.a\", \"to\": \"n1.d\", \"bidirectional\": false, \"kind\": "
    "\"pcie4\", \"bandwidth\": \"1 GB/s\"},"
    "  {\"id\": \"da\", \"from\": \"n1.d\", \"to\": \"n1.a\", \"bidirectional\": false, \"kind\": "
    "\"pcie4\", \"bandwidth\": \"1 GB/s\"}"
    " ]}";

static px_hw_graph *graph(void)
{
    px_hw_graph *g;
    px_err err;
    px_assert_ok(
        px_hw_graph_from_json(graph_text, strlen(graph_text), "paths.json", NULL, &g, NULL, &err),
        &err);
    return g;
}

static uint32_t ep(const px_hw_graph *g, const char *id)
{
    uint32_t e;
    if (!px_hw_graph_find_endpoint(g, id, &e))
        fail_msg("no endpoint %s", id);
    return e;
}

/* The ids of a path's edges, joined: "ac,cb". */
static void path_ids(const px_hw_graph *g, const px_hw_path *p, char *out, size_t n)
{
    const px_hw_view *v = px_hw_graph_view(g);
    out[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < p->n_links; i++)
        used +=
            (size_t)snprintf(out + used, n - used, "%s%s", i ? "," : "", v->links[p->links[i]].id);
}

static void test_path_widest_and_fastest_differ(void **state)
{
    (void)state;
    px_hw_graph *g = graph();
    uint32_t a = ep(g, "n1.a"), b = ep(g, "n1.b");
    px_hw_path p;
    px_err err;
    char ids[64];

    /* Widest: 100 GB/s, and of the two such routes the one with less
     * latency (a-f-b, 2 us, not a-c-b, 10 us). */
    px_assert_ok(px_hw_graph_path(g, a, b, PX_HW_PATH_WIDEST, 0, &p, &err), &err);
    path_ids(g, &p, ids, sizeof ids);
    assert_string_equal(ids, "af,fb");
    assert_true(p.bandwidth == 100e9);
    assert_true(fabs(p.latency - 2e-6) < 1e-12);
    px_hw_path_release(&p);

    /* Fastest for a tiny message: least latency, the direct link. */
    px_assert_ok(px_hw_graph_path(g, a, b, PX_HW_PATH_FASTEST, 0, &p, &err), &err);
    path_ids(g, &p, ids, sizeof ids);
    assert_string_equal(ids, "ab");
    assert_true(p.bandwidth == 10e9);
    assert_true(fabs(p.latency - 1e-6) < 1e-12);
    px_hw_path_release(&p);

    /* Fastest for 1 GB: bandwidth dominates. */
    px_assert_ok(px_hw_graph_path(g, a, b, PX_HW_PATH_FASTEST, 1e9, &p, &err), &err);
    path_ids(g, &p, ids, sizeof ids);
    assert_string_equal(ids, "af,fb");
    px_hw_path_release(&p);

    /* The reverse direction uses the generated reverse edges. */
    px_assert_ok(px_hw_graph_path(g, b, a, PX_HW_PATH_WIDEST, 0, &p, &err), &err);
    assert_int_equal(p.n_links, 2);
    const px_hw_view *v = px_hw_graph_view(g);
    assert_true(v->links[p.links[0]].reverse);
    assert_int_equal(v->links[p.links[0]].from, b);
    assert_int_equal(v->links[p.links[1]].to, a);
    px_hw_path_release(&p);
    px_hw_graph_free(g);
}

static void test_path_edge_cases(void **state)
{
    (void)state;
    px_hw_graph *g = graph();
    px_hw_path p;
    px_err err;
    uint32_t a = ep(g, "n1.a"), e = ep(g, "n1.e"), d = ep(g, "n1.d");
    px_assert_ok(px_hw_graph_path(g, a, a, PX_HW_PATH_FASTEST, 0, &p, &err), &err);
    assert_int_equal(p.n_links, 0);
    assert_true(isinf(p.bandwidth));
    assert_true(p.latency == 0);
    px_hw_path_release(&p);

    assert_int_equal(px_hw_graph_path(g, a, e, PX_HW_PATH_WIDEST, 0, &p, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "no path from \"n1.a\" to \"n1.e\"");
    assert_null(p.links);
    assert_int_equal(px_hw_graph_path(g, e, a, PX_HW_PATH_FASTEST, 0, &p, &err), PX_ENOTFOUND);

    /* One-way links are followed one way only... */
    px_assert_ok(px_hw_graph_path(g, d, a, PX_HW_PATH_FASTEST, 0, &p, &err), &err);
    assert_int_equal(p.n_links, 1);
    px_hw_path_release(&p);

    assert_int_equal(px_hw_graph_path(g, a, 9999, PX_HW_PATH_FASTEST, 0, &p, &err), PX_EINVAL);
    assert_int_equal(px_hw_graph_path(g, a, d, PX_HW_PATH_FASTEST, -1, &p, &err), PX_EINVAL);
    assert_int_equal(px_hw_graph_path(g, a, d, PX_HW_PATH_FASTEST, NAN, &p, &err), PX_EINVAL);
    px_hw_path_release(&p);
    px_hw_path_release(NULL);
    px_hw_graph_free(g);
}

static void test_path_lookups_and_adjacency(void **state)
{
    (void)state;
    px_hw_graph *g = graph();
    const px_hw_view *v = px_hw_graph_view(g);
    assert_int_equal(v->n_devices, 6);
    assert_int_equal(v->n_nodes, 1);
    assert_int_equal(v->n_endpoints, 7);
    /* 5 bidirectional declarations and 2 one-way ones. */
    assert_int_equal(v->n_links, 12);
    uint32_t i;
    assert_true(px_hw_graph_find_device(g, "n1.c", &i));
    assert_string_equal(v->devices[i].global_id, "n1.c");
    assert_string_equal(v->devices[i].id, "c");
    assert_false(px_hw_graph_find_device(g, "n1.z", &i));
    assert_false(px_hw_graph_find_device(g, "n1", &i));
    assert_true(px_hw_graph_find_node(g, "n1", &i));
    assert_int_equal(i, 0);
    assert_true(px_hw_graph_find_endpoint(g, "n1", &i));
    assert_int_equal(i, v->n_devices);
    assert_string_equal(px_hw_graph_endpoint_name(g, i), "n1");
    assert_string_equal(px_hw_graph_endpoint_name(g, 999), "?");
    assert_false(px_hw_graph_find_domain(g, "r", &i));
    assert_int_equal(v->nodes[0].n_devices, 6);
    for (size_t k = 0; k < v->nodes[0].n_devices; k++)
        assert_int_equal(v->devices[v->nodes[0].devices[k]].node, 0);

    /* a's outgoing edges: to b, c, d, f, sorted by far end. */
    size_t n;
    const uint32_t *out = px_hw_graph_out_links(g, ep(g, "n1.a"), &n);
    assert_int_equal(n, 4);
    for (size_t k = 0; k < n; k++) {
        assert_int_equal(v->links[out[k]].from, ep(g, "n1.a"));
        if (k)
            assert_true(v->links[out[k - 1]].to < v->links[out[k]].to);
    }
    px_hw_graph_out_links(g, 12345, &n);
    assert_int_equal(n, 0);

    assert_true(px_hw_graph_total_device_memory(g) == 3.0 * 1073741824);
    assert_true(px_hw_device_memory_capacity(&v->devices[0]) == 1073741824);
    assert_true(px_hw_device_memory_bandwidth(&v->devices[0]) == 1e12);
    assert_true(px_hw_device_peak(&v->devices[0], PX_HW_DTYPE_BF16) == 0);
    assert_string_equal(px_hw_graph_source(g), "paths.json");
    px_hw_graph_free(g);
}

static void test_path_fast_device_behind_slow_link(void **state)
{
    (void)state;
    char *path = px_test_source_path("data/scenarios/adversarial-fast-behind-slow-link.json");
    px_hw_graph *g;
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, NULL, &err), &err);
    free(path);
    px_hw_path p;
    px_assert_ok(
        px_hw_graph_path(g, ep(g, "n1.gpu0"), ep(g, "n2.gpu0"), PX_HW_PATH_WIDEST, 0, &p, &err),
        &err);
    assert_int_equal(p.n_links, 3);
    assert_true(fabs(p.bandwidth - 1.25e9) < 1);
    assert_true(fabs(p.latency - 154e-6) < 1e-9);
    px_hw_path_release(&p);
    /* The two L4s reach each other through their host at PCIe speed. */
    px_assert_ok(
        px_hw_graph_path(g, ep(g, "n1.gpu0"), ep(g, "n1.gpu1"), PX_HW_PATH_WIDEST, 0, &p, &err),
        &err);
    assert_int_equal(p.n_links, 2);
    assert_true(fabs(p.bandwidth - 31.5e9) < 1);
    px_hw_path_release(&p);
    px_hw_graph_free(g);
}

static void test_names_round_trip(void **state)
{
    (void)state;
    for (int i = 0; i < PX_HW_DTYPE_COUNT; i++) {
        px_hw_dtype d;
        px_assert_ok(px_hw_dtype_parse(px_hw_dtype_name((px_hw_dtype)i), &d), (px_err *)NULL);
        assert_int_equal(d, i);
    }
    for (int i = 0; i < PX_HW_LINK_COUNT; i++) {
        px_hw_link_kind k;
        px_assert_ok(px_hw_link_kind_parse(px_hw_link_kind_name((px_hw_link_kind)i), &k),
                     (px_err *)NULL);
        assert_int_equal(k, i);
    }
    px_hw_class c = PX_HW_CLASS_CPU;
    assert_int_equal(px_hw_class_parse("GPU", &c), PX_ENOTFOUND);
    assert_int_equal(c, PX_HW_CLASS_CPU);
    assert_int_equal(px_hw_class_parse(NULL, &c), PX_ENOTFOUND);
    assert_string_equal(px_hw_class_name((px_hw_class)99), "unknown");
    assert_string_equal(px_hw_mem_kind_name(PX_HW_MEM_CXL), "cxl");
    assert_string_equal(px_hw_domain_kind_name(PX_HW_DOMAIN_COOLING), "cooling");
    assert_string_equal(px_hw_trust_name(PX_HW_TRUST_UNTRUSTED), "untrusted");
    assert_true(px_hw_link_kind_is_nvlink(PX_HW_LINK_NVLINK5));
    assert_false(px_hw_link_kind_is_nvlink(PX_HW_LINK_PCIE5));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_widest_and_fastest_differ),
        cmocka_unit_test(test_path_edge_cases),
        cmocka_unit_test(test_path_lookups_and_adjacency),
        cmocka_unit_test(test_path_fast_device_behind_slow_link),
        cmocka_unit_test(test_names_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
