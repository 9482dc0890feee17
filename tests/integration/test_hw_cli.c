/* `plexus inventory`: validate, show, export, dot and catalog on the
 * scenario packs, run as a user would. */
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static char *pack(const char *file)
{
    char *rel = px_asprintf("data/scenarios/%s", file);
    char *path = px_test_source_path(rel);
    free(rel);
    return path;
}

static int run(char *const argv[], char **out, char **err)
{
    return px_test_run(argv, 60, out, err);
}

#define PX (char *)px_test_plexus_bin()

static void test_cli_validate_good_and_bad_packs(void **state)
{
    (void)state;
    char *good = pack("hetero-pair-h100-l4.json"), *emu = pack("emu-small.json");
    char *lying = pack("lying-topology.json"), *dup = pack("malicious/duplicate-ids.json");
    char *out, *err;

    char *const ok_argv[] = {PX, "inventory", "validate", good, emu, NULL};
    assert_int_equal(run(ok_argv, &out, &err), 0);
    px_assert_contains(out, "hetero-pair-h100-l4.json: ok: 2 nodes, 2 devices");
    px_assert_contains(out, "emu-small.json: ok: 1 node, 3 devices");
    free(out);
    free(err);

    char *const bad_argv[] = {PX, "inventory", "validate", good, lying, dup, NULL};
    assert_int_equal(run(bad_argv, &out, &err), 3);
    px_assert_contains(out, "hetero-pair-h100-l4.json: ok");
    px_assert_contains(out, "lying-topology.json: error: /links/0/kind: the topology report lies");
    px_assert_contains(out,
                       "duplicate-ids.json: error: /nodes/0/devices/1/id: duplicate device id");
    px_assert_contains(out, "fix: ");
    px_assert_contains(out, "lying-topology.json: refused: 1 error");
    free(out);
    free(err);

    char *const json_argv[] = {PX, "inventory", "validate", "-o", "json", lying, NULL};
    assert_int_equal(run(json_argv, &out, &err), 3);
    json_t *doc;
    px_err e;
    px_assert_ok(px_json_parse(out, strlen(out), "stdout", NULL, &doc, &e), &e);
    json_t *first = json_array_get(doc, 0);
    assert_false(json_is_true(json_object_get(first, "ok")));
    assert_int_equal(json_integer_value(json_object_get(first, "errors")), 1);
    json_t *diag = json_array_get(json_object_get(first, "diagnostics"), 0);
    assert_string_equal(json_string_value(json_object_get(diag, "pointer")), "/links/0/kind");
    json_decref(doc);
    free(out);
    free(err);

    char *const missing_argv[] = {PX, "inventory", "validate", "/nonexistent/inv.json", NULL};
    assert_int_equal(run(missing_argv, &out, &err), 1);
    px_assert_contains(out, "/nonexistent/inv.json");
    free(out);
    free(err);

    char *const usage_argv[] = {PX, "inventory", "validate", NULL};
    assert_int_equal(run(usage_argv, &out, &err), 2);
    px_assert_contains(err, "FILE is required");
    free(out);
    free(err);
    free(good);
    free(emu);
    free(lying);
    free(dup);
}

static void test_cli_validates_every_malicious_pack_without_crashing(void **state)
{
    (void)state;
    static const char *const files[] = {"malicious/nan-and-negative-via-strings.json",
                                        "malicious/hbm-5pb.json",
                                        "malicious/self-link.json",
                                        "malicious/link-to-undefined-device.json",
                                        "malicious/deeply-nested.json",
                                        "malicious/huge-string.json",
                                        "malicious/unknown-unit.json",
                                        "malicious/faster-than-catalog.json"};
    for (size_t i = 0; i < PX_ARRAY_LEN(files); i++) {
        char *p = pack(files[i]);
        char *out, *err;
        char *const argv[] = {PX, "inventory", "validate", p, NULL};
        int rc = run(argv, &out, &err);
        if (rc != 3)
            fail_msg("%s: exit %d\n%s%s", files[i], rc, out, err);
        px_assert_contains(out, "refused");
        free(out);
        free(err);
        char *const show[] = {PX, "inventory", "show", p, NULL};
        assert_int_equal(run(show, &out, &err), 1);
        px_assert_contains(err, "is not a usable inventory");
        free(out);
        free(err);
        free(p);
    }
}

static void test_cli_show_marks_emulated_and_lists_links(void **state)
{
    (void)state;
    char *emu = pack("emu-small.json"), *irr = pack("irregular-4dev.json");
    char *out, *err;
    char *const argv[] = {PX, "inventory", "show", emu, NULL};
    assert_int_equal(run(argv, &out, &err), 0);
    px_assert_contains(out, "node local");
    px_assert_contains(out, "local.emu-a");
    px_assert_contains(out, "[emu]");
    px_assert_contains(out, "512 MiB");
    px_assert_contains(out, "loopback");
    free(out);
    free(err);
    char *const argv2[] = {PX, "inventory", "show", irr, NULL};
    assert_int_equal(run(argv2, &out, &err), 0);
    px_assert_contains(out, "BF16");
    px_assert_contains(out, "165.2 TFLOP/s");
    px_assert_contains(out, "82.6 TFLOP/s");
    px_assert_contains(out, "15.75 GB/s");
    px_assert_contains(out, "nvidia-rtx-4090");
    free(out);
    free(err);
    free(emu);
    free(irr);
}

static void test_cli_export_is_canonical_and_reads_back(void **state)
{
    (void)state;
    char *p = pack("faulted-cluster.json");
    char *out, *err;
    char *const argv[] = {PX, "inventory", "export", p, NULL};
    assert_int_equal(run(argv, &out, &err), 0);
    px_assert_contains(out, "\"schema\": \"plexus.inventory/1\"");
    px_assert_contains(out, "\"provenance\": \"datasheet\"");
    char *again = px_asprintf("%s/export.json", px_test_tmpdir());
    px_err e;
    px_assert_ok(px_write_file(again, out, strlen(out), &e), &e);
    char *out2, *err2;
    char *const argv2[] = {PX, "inventory", "export", again, NULL};
    assert_int_equal(run(argv2, &out2, &err2), 0);
    assert_string_equal(out, out2);
    free(out);
    free(err);
    free(out2);
    free(err2);
    free(again);
    free(p);
}

static void test_cli_dot_draws_clusters_and_edges(void **state)
{
    (void)state;
    char *p = pack("hetero-pair-h100-l4.json");
    char *out, *err;
    char *const argv[] = {PX, "inventory", "dot", p, NULL};
    assert_int_equal(run(argv, &out, &err), 0);
    px_assert_contains(out, "digraph \"hetero-pair-h100-l4\" {");
    px_assert_contains(out, "subgraph \"cluster_n1\"");
    px_assert_contains(out, "\"n1\" -> \"n2\" [label=\"ethernet 12.5 GB/s\", dir=both];");
    assert_true(out[strlen(out) - 2] == '}');
    free(out);
    free(err);
    free(p);
}

static void test_cli_catalog_and_help(void **state)
{
    (void)state;
    char *out, *err;
    char *const argv[] = {PX, "inventory", "catalog", NULL};
    assert_int_equal(run(argv, &out, &err), 0);
    px_assert_contains(out, "nvidia-h100-sxm5");
    px_assert_contains(out, "amd-mi300x");
    px_assert_contains(out, "infiniband-ndr-400g");
    free(out);
    free(err);
    char *const jargv[] = {PX, "inventory", "catalog", "-o", "json", NULL};
    assert_int_equal(run(jargv, &out, &err), 0);
    px_assert_contains(out, "\"schema\": \"plexus.catalog/1\"");
    px_assert_contains(out, "AMD Instinct MI300X accelerator data sheet");
    free(out);
    free(err);
    static const char *const subs[] = {"validate", "show", "export", "dot", "catalog"};
    for (size_t i = 0; i < PX_ARRAY_LEN(subs); i++) {
        char *const hargv[] = {PX, "inventory", (char *)subs[i], "--help", NULL};
        assert_int_equal(run(hargv, &out, &err), 0);
        px_assert_contains(out, "usage: plexus inventory");
        free(out);
        free(err);
    }
    char *const top[] = {PX, "inventory", "--help", NULL};
    assert_int_equal(run(top, &out, &err), 0);
    px_assert_contains(out, "discover");
    free(out);
    free(err);
    char *const unknown[] = {PX, "inventory", "frobnicate", NULL};
    assert_int_equal(run(unknown, &out, &err), 2);
    px_assert_contains(err, "unknown action \"frobnicate\"");
    free(out);
    free(err);
    char *const two[] = {PX, "inventory", "show", "a.json", "b.json", NULL};
    assert_int_equal(run(two, &out, &err), 2);
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_validate_good_and_bad_packs),
        cmocka_unit_test(test_cli_validates_every_malicious_pack_without_crashing),
        cmocka_unit_test(test_cli_show_marks_emulated_and_lists_links),
        cmocka_unit_test(test_cli_export_is_canonical_and_reads_back),
        cmocka_unit_test(test_cli_dot_draws_clusters_and_edges),
        cmocka_unit_test(test_cli_catalog_and_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
