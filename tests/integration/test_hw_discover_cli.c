/* `plexus inventory discover`: the command end to end, on recorded
 * nvidia-smi output and system trees, and on this machine; its output
 * must pass `plexus inventory validate`. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void write_text(const char *path, const char *text)
{
    px_err err;
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
}

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

/* A stand-in nvidia-smi printing recorded output (and MIG lines for -L). */
static char *make_smi(const char *name, const char *fixture, const char *list, int status)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    char *q_rel = px_asprintf("tests/data/nvidia-smi/%s", fixture);
    char *q = px_test_source_path(q_rel);
    char *l = NULL;
    if (list) {
        char *rel = px_asprintf("tests/data/nvidia-smi/%s", list);
        l = px_test_source_path(rel);
        free(rel);
    }
    char *body = px_asprintf("#!/bin/sh\nif [ \"$1\" = -L ]; then %s%s%s; exit 0; fi\n"
                             "cat '%s'\nexit %d\n",
                             l ? "cat '" : "true", l ? l : "", l ? "'" : "", q, status);
    write_text(path, body);
    chmod(path, 0755);
    free(body);
    free(q);
    free(q_rel);
    free(l);
    return path;
}

static const char *sysroot(void)
{
    static char root[4096];
    if (root[0])
        return root;
    snprintf(root, sizeof root, "%s/root", px_test_tmpdir());
    char *p;
    make_dirs((p = px_asprintf("%s/proc/sys/kernel", root)));
    free(p);
    make_dirs((p = px_asprintf("%s/etc", root)));
    free(p);
    write_text((p = px_asprintf("%s/proc/meminfo", root)),
               "MemTotal:       2113389568 kB\nMemFree:        2000000000 kB\n"
               "MemAvailable:   2050000000 kB\n");
    free(p);
    write_text((p = px_asprintf("%s/proc/sys/kernel/hostname", root)), "dgx-h100-04\n");
    free(p);
    write_text((p = px_asprintf("%s/proc/sys/kernel/osrelease", root)), "5.15.0-105-generic\n");
    free(p);
    write_text((p = px_asprintf("%s/proc/loadavg", root)), "1.00 1.00 1.00 2/900 4242\n");
    free(p);
    write_text((p = px_asprintf("%s/etc/os-release", root)),
               "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\n");
    free(p);
    return root;
}

static json_t *parse_output(const char *out)
{
    json_t *doc = NULL;
    px_err err;
    if (px_json_parse(out, strlen(out), "stdout", NULL, &doc, &err) != PX_OK)
        fail_msg("the output is not JSON: %s\n%s", err.msg, out);
    return doc;
}

static const char *probe_status(json_t *doc, const char *name)
{
    json_t *node = json_array_get(json_object_get(doc, "nodes"), 0);
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(node, "x-probes"), i,
                       p) if (!strcmp(json_string_value(json_object_get(p, "probe")),
                                      name)) return json_string_value(json_object_get(p, "status"));
    return "absent";
}

/* Writes text to a file and runs `plexus inventory validate --strict` on it. */
static void assert_cli_validates(const char *name, const char *text)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    write_text(path, text);
    char *argv[] = {(char *)px_test_plexus_bin(), "inventory", "validate", "--strict", path, NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    if (rc != 0)
        fail_msg("plexus inventory validate exited %d:\n%s%s", rc, out, err);
    free(out);
    free(err);
    free(path);
}

static void test_discover_prints_a_recorded_dgx_that_validates(void **state)
{
    (void)state;
    char *smi = make_smi("smi-dgx", "h100x8.txt", NULL, 0);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "inventory",
                    "discover",
                    "--no-interpreter",
                    "--nvidia-smi",
                    smi,
                    "--sysroot",
                    (char *)sysroot(),
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    assert_string_equal(err, "");
    json_t *doc = parse_output(out);
    assert_string_equal(json_string_value(json_object_get(doc, "schema")), "plexus.inventory/1");
    json_t *node = json_array_get(json_object_get(doc, "nodes"), 0);
    assert_string_equal(json_string_value(json_object_get(node, "id")), "dgx-h100-04");
    assert_int_equal(json_array_size(json_object_get(node, "devices")), 9);
    assert_int_equal(json_array_size(json_object_get(doc, "links")), 8);
    assert_string_equal(probe_status(doc, "gpu"), "ok");
    assert_cli_validates("dgx.json", out);
    json_decref(doc);
    free(out);
    free(err);
    free(smi);
}

static void test_discover_text_summarizes_the_node(void **state)
{
    (void)state;
    char *smi = make_smi("smi-mig", "a100-mig.txt", "a100-mig-list.txt", 0);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "inventory",
                    "discover",
                    "-o",
                    "text",
                    "--no-interpreter",
                    "--nvidia-smi",
                    smi,
                    "--sysroot",
                    (char *)sysroot(),
                    "--node",
                    "a100-box",
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "node a100-box (host dgx-h100-04): Ubuntu 22.04.4 LTS, kernel "
                            "5.15.0-105-generic");
    px_assert_contains(out, "ddr0     ddr 1.97 TiB");
    px_assert_contains(out, "gpu0     NVIDIA A100-SXM4-80GB, 80 GiB hbm, capability 8.0");
    px_assert_contains(out, "link to a100-box: pcie4, 31.5 GB/s");
    px_assert_contains(out, "MIG: 4 instances");
    px_assert_contains(out, "cpu0 ");
    px_assert_contains(out, "probes\n");
    px_assert_contains(out, "  gpu      ok");
    px_assert_contains(out, "  python   skipped");
    free(out);
    free(err);
    free(smi);
}

static void test_discover_reports_a_failed_probe_and_goes_on(void **state)
{
    (void)state;
    char *smi = make_smi("smi-broken", "driver-failed.txt", NULL, 9);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "inventory",
                    "discover",
                    "--no-interpreter",
                    "--nvidia-smi",
                    smi,
                    "--sysroot",
                    (char *)sysroot(),
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    assert_int_equal(rc, 0);
    px_assert_contains(err, "plexus inventory discover: warning: gpu probe: nvidia-smi exited "
                            "with status 9: NVIDIA-SMI has failed");
    px_assert_contains(err, "(fix: check that the NVIDIA driver is loaded");
    json_t *doc = parse_output(out);
    assert_string_equal(probe_status(doc, "gpu"), "failed");
    assert_string_equal(probe_status(doc, "cpu"), "ok");
    assert_cli_validates("broken.json", out);
    json_decref(doc);
    free(out);
    free(err);
    free(smi);
}

static void test_discover_scans_a_python_prefix(void **state)
{
    (void)state;
    char *site = px_asprintf("%s/venv/lib/python3.10/site-packages", px_test_tmpdir());
    char *dist = px_asprintf("%s/torch-2.3.1+cu121.dist-info", site);
    make_dirs(dist);
    char *meta = px_asprintf("%s/METADATA", dist);
    write_text(meta, "Metadata-Version: 2.1\nName: torch\nVersion: 2.3.1+cu121\n\n");
    char *prefix = px_asprintf("%s/venv", px_test_tmpdir());
    char *smi = make_smi("smi-l4", "l4.txt", NULL, 0);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "inventory",
                    "discover",
                    "--no-interpreter",
                    "--python",
                    prefix,
                    "--nvidia-smi",
                    smi,
                    "--sysroot",
                    (char *)sysroot(),
                    "-o",
                    "text",
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    px_assert_contains(out, "frameworks torch 2.3.1+cu121, torch.cuda 12.1");
    free(out);
    free(err);
    free(smi);
    free(prefix);
    free(meta);
    free(dist);
    free(site);
}

static void test_discover_describes_this_machine(void **state)
{
    (void)state;
    char *argv[] = {(char *)px_test_plexus_bin(), "inventory", "discover", "--timeout", "20", NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 120, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    json_t *doc = parse_output(out);
    assert_string_equal(probe_status(doc, "cpu"), "ok");
    assert_string_equal(probe_status(doc, "memory"), "ok");
    assert_cli_validates("here.json", out);
    json_decref(doc);
    free(out);
    free(err);
}

static void test_discover_refuses_bad_usage(void **state)
{
    (void)state;
    static const struct {
        const char *args[4];
        const char *needle;
    } cases[] = {
        {{"--bogus"}, "unknown option \"--bogus\""},
        {{"-o", "xml"}, "-o/--output takes json, text or yaml, not \"xml\""},
        {{"--timeout", "-1"}, "--timeout takes a time such as 90s"},
        {{"--measure-seconds", "abc"}, "--measure-seconds takes a time such as 90s"},
        {{"--python"}, "--python needs a value"},
        {{"--python", ""}, "--python needs a folder"},
        {{"--node", "bad/id"}, "node id \"bad/id\""},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        char *argv[8] = {(char *)px_test_plexus_bin(), "inventory", "discover"};
        size_t k = 3;
        for (size_t j = 0; j < 4 && cases[i].args[j]; j++)
            argv[k++] = (char *)cases[i].args[j];
        argv[k] = NULL;
        char *out = NULL, *err = NULL;
        int rc = px_test_run(argv, 60, &out, &err);
        if (rc == 0)
            fail_msg("case %zu was accepted", i);
        px_assert_contains(err, cases[i].needle);
        free(out);
        free(err);
    }
    char *argv[] = {(char *)px_test_plexus_bin(), "inventory", "discover", "--help", NULL};
    char *out = NULL, *err = NULL;
    assert_int_equal(px_test_run(argv, 60, &out, &err), 0);
    px_assert_contains(out, "usage: plexus inventory discover");
    px_assert_contains(out, "--measure");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discover_prints_a_recorded_dgx_that_validates),
        cmocka_unit_test(test_discover_text_summarizes_the_node),
        cmocka_unit_test(test_discover_reports_a_failed_probe_and_goes_on),
        cmocka_unit_test(test_discover_scans_a_python_prefix),
        cmocka_unit_test(test_discover_describes_this_machine),
        cmocka_unit_test(test_discover_refuses_bad_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
