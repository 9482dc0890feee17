/* Validation: every rule of plexus.inventory/1, each problem with its
 * pointer, message and fix, and every problem of a file in one report. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/hw.h"

#define HEAD           "{\"schema\": \"plexus.inventory/1\", "
#define ONE_NODE(devs) HEAD "\"nodes\": [{\"id\": \"n1\", \"devices\": [" devs "]}]"

typedef struct result {
    px_status st;
    px_diags diags;
    px_hw_graph *g;
} result;

static result run(const char *text, bool strict)
{
    result r;
    px_diags_init(&r.diags);
    px_hw_read_options opt = {.strict = strict};
    px_err err;
    r.st = px_hw_graph_from_json(text, strlen(text), "t.json", &opt, &r.g, &r.diags, &err);
    if (r.st != PX_OK)
        assert_null(r.g);
    return r;
}

static void done(result *r)
{
    px_hw_graph_free(r->g);
    px_diags_release(&r->diags);
}

/* Asserts that a diagnostic of severity sev sits at pointer (NULL: any)
 * and says needle. */
static void expect_diag(const result *r, px_severity sev, const char *pointer, const char *needle)
{
    for (size_t i = 0; i < r->diags.n; i++) {
        const px_diag *d = &r->diags.items[i];
        if (d->severity == sev && (!pointer || !strcmp(d->pointer, pointer)) &&
            strstr(d->message, needle))
            return;
    }
    char *report = px_diags_format(&r->diags, "t.json");
    fail_msg("no diagnostic at \"%s\" saying \"%s\"; got:\n%s", pointer, needle,
             report ? report : "");
}

/* Reads text, expects it refused with exactly n errors, one at pointer
 * saying needle, each with a fix. */
static void refuse(const char *text, size_t n, const char *pointer, const char *needle)
{
    result r = run(text, false);
    if (r.st != PX_EVALIDATE && r.st != PX_EPARSE && r.st != PX_ELIMIT)
        fail_msg("expected a refusal, got %s", px_status_name(r.st));
    expect_diag(&r, PX_SEV_ERROR, pointer, needle);
    if (n && r.diags.n_errors != n) {
        char *report = px_diags_format(&r.diags, "t.json");
        fail_msg("expected %zu errors, got %zu:\n%s", n, r.diags.n_errors, report);
    }
    for (size_t i = 0; i < r.diags.n; i++)
        assert_non_null(r.diags.items[i].fix);
    done(&r);
}

static void accept(const char *text)
{
    result r = run(text, true);
    if (r.st != PX_OK) {
        char *report = px_diags_format(&r.diags, "t.json");
        fail_msg("refused:\n%s", report);
    }
    done(&r);
}

static void test_validate_structure(void **state)
{
    (void)state;
    refuse("{\"nodes\": [{\"id\": \"n1\"}]}", 1, "", "no \"schema\"");
    refuse("{\"schema\": \"plexus.inventory/2\", \"nodes\": [{\"id\": \"n1\"}]}", 1, "/schema",
           "is not plexus.inventory/1");
    refuse(HEAD "\"name\": \"x\"}", 1, "", "no \"nodes\"");
    refuse(HEAD "\"nodes\": []}", 1, "/nodes", "empty");
    refuse(HEAD "\"nodes\": {}}", 1, "/nodes", "must be an array");
    refuse("[1, 2]", 1, "", "must be an object");
    refuse(ONE_NODE("{\"id\": \"gpu0\"}") "}", 1, "/nodes/0/devices/0", "no \"class\"");
    refuse(ONE_NODE("{\"class\": \"gpu\"}") "}", 1, "/nodes/0/devices/0", "no \"id\"");
    refuse(ONE_NODE("{\"id\": \"gpu.0\", \"class\": \"gpu\"}") "}", 1, "/nodes/0/devices/0/id",
           "not a valid identifier");
    refuse(ONE_NODE("{\"id\": \"gpu0\", \"class\": \"quantum\"}") "}", 1,
           "/nodes/0/devices/0/class", "unknown device class \"quantum\"");
    refuse(ONE_NODE("{\"id\": \"gpu0\", \"class\": \"gpu\", \"emulated\": \"yes\"}") "}", 1,
           "/nodes/0/devices/0/emulated", "must be a boolean");
    refuse(ONE_NODE(
               "{\"id\": \"gpu0\", \"class\": \"gpu\", \"compute\": {\"f12\": \"1 TFLOP/s\"}}") "}",
           1, "/nodes/0/devices/0/compute/f12", "unknown dtype");
    refuse(ONE_NODE("{\"id\": \"gpu0\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", "
                    "\"kind\": \"nvme\", \"capacity\": \"1 TB\"}]}") "}",
           1, "/nodes/0/devices/0/memory/0/kind", "cannot be a device's memory");
    refuse(ONE_NODE("{\"id\": \"gpu0\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", "
                    "\"kind\": \"hbm\"}]}") "}",
           1, "/nodes/0/devices/0/memory/0", "no \"capacity\"");
    /* The CPU entry leaves its memory size to the machine. */
    refuse(ONE_NODE("{\"id\": \"cpu0\", \"catalog\": \"amd-epyc-9654\"}") "}", 1,
           "/nodes/0/devices/0/memory", "tier \"ddr\" of the catalogue entry has no capacity");
    accept(ONE_NODE("{\"id\": \"cpu0\", \"catalog\": \"amd-epyc-9654\", \"memory\":"
                    " [{\"id\": \"ddr\", \"capacity\": \"384 GiB\"}]}") "}");
}

static void test_validate_unknown_member_suggests_the_right_name(void **state)
{
    (void)state;
    const char *text =
        ONE_NODE("{\"id\": \"gpu0\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\","
                 " \"kind\": \"hbm\", \"capacity\": \"1 GB\", \"bandwith\": \"1 TB/s\"}],"
                 " \"x-vendor-note\": \"kept\"}") ", \"colour\": 1}";
    result r = run(text, false);
    assert_int_equal(r.st, PX_EVALIDATE);
    assert_int_equal(r.diags.n_errors, 2);
    expect_diag(&r, PX_SEV_ERROR, "/nodes/0/devices/0/memory/0/bandwith",
                "unknown member \"bandwith\"");
    expect_diag(&r, PX_SEV_ERROR, "/colour", "unknown member \"colour\"");
    for (size_t i = 0; i < r.diags.n; i++)
        if (strstr(r.diags.items[i].pointer, "bandwith"))
            px_assert_contains(r.diags.items[i].fix, "did you mean \"bandwidth\"");
    done(&r);
}

static void test_validate_quantities(void **state)
{
    (void)state;
#define TIER(cap, bw)                                                                         \
    ONE_NODE("{\"id\": \"gpu0\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": " \
             "\"hbm\", \"capacity\": " cap ", \"bandwidth\": " bw "}]}")                      \
    "}"
    const char *p = "/nodes/0/devices/0/memory/0/bandwidth";
    const char *pc = "/nodes/0/devices/0/memory/0/capacity";
    refuse(TIER("\"80 GB\"", "\"3 parsecs/s\""), 1, p, "unknown unit");
    refuse(TIER("\"80 GB\"", "\"3 GB\""), 1, p, "bytes but a bandwidth is expected");
    refuse(TIER("\"80 GB\"", "\"NaN TB/s\""), 1, p, "does not start with a number");
    refuse(TIER("\"80 GB\"", "\"Infinity TB/s\""), 1, p, "does not start with a number");
    refuse(TIER("\"80 GB\"", "3.35"), 1, p, "expected a quantity");
    refuse(TIER("\"80 GB\"", "\"3.35\""), 1, p, "has no unit");
    refuse(TIER("\"-80 GB\"", "\"1 TB/s\""), 1, pc, "is negative");
    refuse(TIER("\"0 GB\"", "\"1 TB/s\""), 1, pc, "is zero");
    refuse(TIER("\"1e400 GB\"", "\"1 TB/s\""), 1, pc, "out of range");
    refuse(TIER("\"8 KB\"", "\"1 TB/s\""), 1, pc, "ambiguous");
    refuse(TIER("{\"value\": \"80 GB\", \"uncertainty\": [\"-1 GB\", \"90 GB\"]}", "\"1 TB/s\""), 1,
           pc, "negative uncertainty");
    refuse(TIER("{\"value\": \"80 GB\", \"provenance\": \"rumour\"}", "\"1 TB/s\""), 1, pc,
           "provenance");
    accept(TIER(
        "{\"value\": \"80 GB\", \"provenance\": \"measured\", \"source\": \"probe\","
        " \"at\": \"2026-11-29T16:25:10Z\", \"uncertainty\": 0.05}",
        "{\"value\": \"1 TB/s\", \"valid\": {\"param\": \"transfer_size\", \"min\": \"1 MiB\"}}"));
#undef TIER
}

/* A node's cpu: whole counts of processors, threads at least the cores,
 * each refusal at its member with a fix; provenance kept. */
static void test_validate_host_cpu(void **state)
{
    (void)state;
#define CPU(x) HEAD "\"nodes\": [{\"id\": \"n1\", \"cpu\": " x ", \"devices\": []}]}"
    refuse(CPU("{\"cores\": 0}"), 1, "/nodes/0/cpu/cores", "is zero");
    refuse(CPU("{\"cores\": -2}"), 1, "/nodes/0/cpu/cores", "negative");
    refuse(CPU("{\"cores\": 2.5}"), 1, "/nodes/0/cpu/cores", "not a whole number");
    refuse(CPU("{\"cores\": 1e9}"), 1, "/nodes/0/cpu/cores", "not a whole number");
    refuse(CPU("{\"cores\": \"2 GB\"}"), 1, "/nodes/0/cpu/cores", "");
    refuse(CPU("{\"cores\": 8, \"threads\": 4}"), 1, "/nodes/0/cpu/threads",
           "a core runs at least one thread");
    refuse(CPU("{\"core\": 8}"), 1, "/nodes/0/cpu/core", "unknown");
    refuse(CPU("[8]"), 1, "/nodes/0/cpu", "object");
    refuse(CPU("{\"cores\": {\"value\": 2, \"provenance\": \"rumour\"}}"), 1, "/nodes/0/cpu/cores",
           "provenance");
    result r = run(CPU("{\"cores\": {\"value\": 2, \"provenance\": \"discovered\", "
                       "\"source\": \"sysconf\"}, \"threads\": 4}"),
                   true);
    assert_int_equal(r.st, PX_OK);
    const px_hw_node *n = &px_hw_graph_view(r.g)->nodes[0];
    assert_true(n->cpu_cores.value == 2 && n->cpu_threads.value == 4);
    assert_int_equal(n->cpu_cores.prov.kind, PX_PROV_DISCOVERED);
    assert_string_equal(n->cpu_cores.prov.source, "sysconf");
    done(&r);
    r = run(CPU("{}"), true);
    assert_int_equal(r.st, PX_OK);
    assert_true(px_hw_graph_view(r.g)->nodes[0].cpu_cores.value == 0);
    done(&r);
#undef CPU
}

static void test_validate_duplicate_ids(void **state)
{
    (void)state;
    refuse(HEAD "\"nodes\": [{\"id\": \"n1\"}, {\"id\": \"n2\"}, {\"id\": \"n1\"}]}", 1,
           "/nodes/2/id", "duplicate node id \"n1\" (first defined at /nodes/0)");
    refuse(ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\"}, {\"id\": \"g\", \"class\": \"cpu\"}") "}",
           1, "/nodes/0/devices/1/id", "duplicate device id \"n1.g\"");
    refuse(ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\", \"memory\": ["
                    "{\"id\": \"m\", \"kind\": \"hbm\", \"capacity\": \"1 GB\"},"
                    "{\"id\": \"m\", \"kind\": \"hbm\", \"capacity\": \"1 GB\"}]}") "}",
           1, "/nodes/0/devices/0/memory/1/id", "duplicate memory tier id \"m\"");
    refuse(
        HEAD
        "\"domains\": [{\"id\": \"r\", \"kind\": \"rack\"}, {\"id\": \"r\", \"kind\": \"zone\"}],"
        " \"nodes\": [{\"id\": \"n1\"}]}",
        1, "/domains/1/id", "duplicate domain id \"r\"");
    refuse(
        ONE_NODE(
            "{\"id\": \"a\", \"class\": \"gpu\"}, {\"id\": \"b\", \"class\": \"gpu\"}") ","
                                                                                        " \"links\""
                                                                                        ": "
                                                                                        "[{\"id\": "
                                                                                        "\"l\", "
                                                                                        "\"from\": "
                                                                                        "\"n1.a\", "
                                                                                        "\"to\": "
                                                                                        "\"n1.b\", "
                                                                                        "\"kind\": "
                                                                                        "\"pcie4\","
                                                                                        " \"bandwid"
                                                                                        "th\": \"1 "
                                                                                        "GB/s\"}, "
                                                                                        "{\"id\": "
                                                                                        "\"l\", "
                                                                                        "\"from\": "
                                                                                        "\"n1.b\", "
                                                                                        "\"to\": "
                                                                                        "\"n1.a\","
                                                                                        " \"kind\":"
                                                                                        " \"pcie4\""
                                                                                        ", "
                                                                                        "\"bandwidt"
                                                                                        "h\": \"1 "
                                                                                        "GB/s\"}]}",
        1, "/links/1/id", "duplicate link id \"l\"");
}

#define TWO_GPUS \
    ONE_NODE("{\"id\": \"a\", \"class\": \"gpu\"}, {\"id\": \"b\", \"class\": \"gpu\"}")

static void test_validate_references(void **state)
{
    (void)state;
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.c\", \"kind\": \"pcie4\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0/to", "device \"n1.c\" is not defined");
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n9.a\", \"to\": \"n1.a\", \"kind\": \"pcie4\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0/from", "device \"n9.a\" is not defined");
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n2\", \"to\": \"n1\", \"kind\": \"ethernet\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0/from", "node \"n2\" is not defined");
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.a\", \"kind\": \"pcie4\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0/to", "to itself");
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"kind\": \"pcie4\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0", "no \"to\"");
    refuse(TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\", \"kind\": \"warp\","
                    " \"bandwidth\": \"1 GB/s\"}]}",
           1, "/links/0/kind", "unknown link kind \"warp\"");
    refuse(TWO_GPUS
           ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\", \"catalog\": \"warp-9\"}]}",
           1, "/links/0/catalog", "unknown link catalogue entry");
    refuse(HEAD "\"nodes\": [{\"id\": \"n1\", \"domains\": [\"rack-z\"]}]}", 1, "/nodes/0/domains",
           "domain \"rack-z\" is not defined");
    refuse(HEAD "\"domains\": [{\"id\": \"r\", \"kind\": \"rack\", \"parent\": \"zz\"}],"
                " \"nodes\": [{\"id\": \"n1\"}]}",
           1, "/domains/0/parent", "parent domain \"zz\" is not defined");
}

static void test_validate_domain_cycles(void **state)
{
    (void)state;
    refuse(HEAD "\"domains\": [{\"id\": \"a\", \"kind\": \"rack\", \"parent\": \"b\"},"
                " {\"id\": \"b\", \"kind\": \"zone\", \"parent\": \"c\"},"
                " {\"id\": \"c\", \"kind\": \"region\", \"parent\": \"a\"},"
                " {\"id\": \"d\", \"kind\": \"rack\", \"parent\": \"a\"}],"
                " \"nodes\": [{\"id\": \"n1\"}]}",
           1, "/domains/0/parent", "its own ancestor");
    refuse(HEAD "\"domains\": [{\"id\": \"a\", \"kind\": \"rack\", \"parent\": \"a\"}],"
                " \"nodes\": [{\"id\": \"n1\"}]}",
           1, "/domains/0/parent", "its own ancestor");
    /* A long chain is fine (its time, linear, is measured in
     * bench_hw_inventory, not here). */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, HEAD "\"domains\": [");
    px_strbuf_adds(&sb, "{\"id\": \"d0\", \"kind\": \"zone\"}");
    for (int i = 1; i < 50000; i++)
        px_strbuf_addf(&sb, ",{\"id\": \"d%d\", \"kind\": \"zone\", \"parent\": \"d%d\"}", i,
                       i - 1);
    px_strbuf_adds(&sb, "], \"nodes\": [{\"id\": \"n1\", \"domains\": [\"d49999\"]}]}");
    accept(sb.buf);
    px_strbuf_release(&sb);
}

static void test_validate_contradicts_catalogue(void **state)
{
    (void)state;
    const char *pc = "/nodes/0/devices/0/compute/bf16";
    refuse(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-h100-sxm5\","
                    " \"compute\": {\"bf16\": \"1200 TFLOP/s\"}}") "}",
           1, pc, "above the");
    refuse(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-h100-sxm5\","
                    " \"memory\": [{\"id\": \"hbm\", \"bandwidth\": \"4 TB/s\"}]}") "}",
           1, "/nodes/0/devices/0/memory/0/bandwidth", "catalogue entry \"nvidia-h100-sxm5\"");
    refuse(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-l4\","
                    " \"memory\": [{\"id\": \"vram\", \"capacity\": \"48 GB\"}]}") "}",
           1, "/nodes/0/devices/0/memory/0/capacity", "above the");
    /* Within the entry's uncertainty (2%), and below it, are accepted. */
    accept(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-h100-sxm5\","
                    " \"compute\": {\"bf16\": \"1000 TFLOP/s\", \"f32\": \"50 TFLOP/s\"},"
                    " \"memory\": [{\"id\": \"hbm\", \"capacity\": \"79.6 GiB\"}]}") "}");
    /* A dtype the entry lacks is a warning, not an error. */
    result r = run(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-a100-80gb-sxm\","
                            " \"compute\": {\"fp8\": \"600 TFLOP/s\"}}") "}",
                   false);
    assert_int_equal(r.st, PX_OK);
    expect_diag(&r, PX_SEV_WARNING, "/nodes/0/devices/0/compute/fp8", "gives no fp8 compute");
    done(&r);
}

#define LINKED(a_bw, b_bw, link)                                                                   \
    ONE_NODE("{\"id\": \"a\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\"," \
             " \"capacity\": \"1 GB\", \"bandwidth\": \"" a_bw "\"}]},"                            \
             "{\"id\": \"b\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\"," \
             " \"capacity\": \"1 GB\", \"bandwidth\": \"" b_bw "\"}]}")                            \
    ","                                                                                            \
    " \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\", " link "}]}"

static void test_validate_link_contradictions(void **state)
{
    (void)state;
    refuse(LINKED("100 GB/s", "200 GB/s", "\"kind\": \"nvlink4\", \"bandwidth\": \"300 GB/s\""), 1,
           "/links/0/bandwidth", "faster than both of its ends");
    accept(LINKED("100 GB/s", "400 GB/s", "\"kind\": \"nvlink4\", \"bandwidth\": \"300 GB/s\""));
    /* The topology report lies: NVLink claimed, PCIe measured. */
    refuse(LINKED("3 TB/s", "3 TB/s",
                  "\"kind\": \"nvlink4\", \"bandwidth\": {\"value\": \"25 GB/s\","
                  " \"provenance\": \"measured\", \"source\": \"p2p probe\"}"),
           1, "/links/0/kind", "the topology report lies");
    refuse(LINKED("3 TB/s", "3 TB/s",
                  "\"kind\": \"nvlink3\", \"bandwidth\": {\"value\": \"60 GB/s\","
                  " \"provenance\": \"calibrated\"}"),
           1, "/links/0/kind", "PCIe-class");
    /* Measured at NVLink speed, or a slow NVLink from a datasheet (a
     * consumer bridge), is not a lie. */
    accept(LINKED("3 TB/s", "3 TB/s",
                  "\"kind\": \"nvlink4\", \"bandwidth\": {\"value\": \"380 GB/s\","
                  " \"provenance\": \"measured\", \"source\": \"p2p probe\"}"));
    accept(LINKED("900 GB/s", "900 GB/s",
                  "\"kind\": \"nvlink3\", \"bandwidth\": {\"value\": \"56.25 GB/s\","
                  " \"provenance\": \"datasheet\", \"source\": \"NVLink bridge\"}"));
    refuse(LINKED("3 TB/s", "3 TB/s", "\"catalog\": \"pcie-4-x16\", \"bandwidth\": \"40 GB/s\""), 1,
           "/links/0/bandwidth", "catalogue entry \"pcie-4-x16\"");
}

static void test_validate_implausible_values(void **state)
{
    (void)state;
    refuse(ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\","
                    " \"kind\": \"hbm\", \"capacity\": \"5 PB\"}]}") "}",
           1, "/nodes/0/devices/0/memory/0/capacity", "implausible");
    refuse(
        ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\", \"compute\": {\"fp8\": \"1 EFLOP/s\"}}") "}",
        1, "/nodes/0/devices/0/compute/fp8", "implausible");
    refuse(ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\", \"power\": {\"tdp\": \"100 W\","
                    " \"idle\": \"200 W\"}}") "}",
           1, "/nodes/0/devices/0/power/idle", "above the TDP");
    refuse(ONE_NODE("{\"id\": \"g\", \"class\": \"gpu\", \"thermal\": {\"limit\": \"900 C\"}}") "}",
           1, "/nodes/0/devices/0/thermal/limit", "implausible");
    refuse(HEAD "\"nodes\": [{\"id\": \"n1\"}, {\"id\": \"n2\"}], \"links\": [{\"from\": \"n1\","
                " \"to\": \"n2\", \"kind\": \"ethernet\", \"bandwidth\": \"100 Gbit/s\","
                " \"latency\": \"1 ns\"}]}",
           1, "/links/0/latency", "implausible");
    refuse(HEAD "\"nodes\": [{\"id\": \"n1\"}, {\"id\": \"n2\"}], \"links\": [{\"from\": \"n1\","
                " \"to\": \"n2\", \"kind\": \"ethernet\", \"bandwidth\": \"100 TB/s\"}]}",
           1, "/links/0/bandwidth", "implausible");
}

static void test_validate_reports_every_problem_at_once(void **state)
{
    (void)state;
    const char *text =
        HEAD "\"domains\": [{\"id\": \"a\", \"kind\": \"rack\", \"parent\": \"a\"}],"
             " \"nodes\": [{\"id\": \"n1\", \"devices\": ["
             "  {\"id\": \"g\", \"class\": \"gpu\", \"memory\": [{\"id\": \"m\", \"kind\": \"hbm\","
             "   \"capacity\": \"5 PB\", \"bandwidth\": \"-1 TB/s\"}]},"
             "  {\"id\": \"g\", \"class\": \"gpu\"},"
             "  {\"id\": \"h\", \"catalog\": \"nvidia-l4\", \"compute\": {\"bf16\": \"500 "
             "TFLOP/s\"}}]}],"
             " \"links\": [{\"from\": \"n1.g\", \"to\": \"n1.zz\", \"kind\": \"pcie4\","
             "  \"bandwidth\": \"3 furlongs/s\"}]}";
    result r = run(text, false);
    assert_int_equal(r.st, PX_EVALIDATE);
    expect_diag(&r, PX_SEV_ERROR, "/domains/0/parent", "its own ancestor");
    expect_diag(&r, PX_SEV_ERROR, "/nodes/0/devices/0/memory/0/capacity", "implausible");
    expect_diag(&r, PX_SEV_ERROR, "/nodes/0/devices/0/memory/0/bandwidth", "negative");
    expect_diag(&r, PX_SEV_ERROR, "/nodes/0/devices/1/id", "duplicate device id");
    expect_diag(&r, PX_SEV_ERROR, "/nodes/0/devices/2/compute/bf16", "above the");
    expect_diag(&r, PX_SEV_ERROR, "/links/0/bandwidth", "unknown unit");
    assert_true(r.diags.n_errors >= 6);
    done(&r);
}

static void test_validate_warnings_and_strict_mode(void **state)
{
    (void)state;
    const char *text = TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\","
                                " \"bidirectional\": false, \"kind\": \"pcie4\","
                                " \"bandwidth\": \"1 GB/s\"}]}";
    result r = run(text, false);
    assert_int_equal(r.st, PX_OK);
    assert_int_equal(r.diags.n_warnings, 1);
    expect_diag(&r, PX_SEV_WARNING, "/links/0", "no reverse direction");
    assert_int_equal(px_hw_graph_view(r.g)->n_links, 1);
    done(&r);
    r = run(text, true);
    assert_int_equal(r.st, PX_EVALIDATE);
    expect_diag(&r, PX_SEV_ERROR, "/links/0", "no reverse direction");
    done(&r);
    /* Both directions declared one way each: no warning. */
    accept(TWO_GPUS ", \"links\": [{\"from\": \"n1.a\", \"to\": \"n1.b\", \"bidirectional\": false,"
                    " \"kind\": \"pcie4\", \"bandwidth\": \"1 GB/s\"}, {\"from\": \"n1.b\","
                    " \"to\": \"n1.a\", \"bidirectional\": false, \"kind\": \"pcie4\","
                    " \"bandwidth\": \"2 GB/s\"}]}");
}

static void test_validate_size_limits(void **state)
{
    (void)state;
    /* Nesting over 32 levels, in an ignored member. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, HEAD "\"nodes\": [{\"id\": \"n1\"}], \"x-deep\": ");
    for (int i = 0; i < 40; i++)
        px_strbuf_addch(&sb, '[');
    for (int i = 0; i < 40; i++)
        px_strbuf_addch(&sb, ']');
    px_strbuf_addch(&sb, '}');
    refuse(sb.buf, 1, NULL, "nesting deeper than 32");
    /* Far deeper than the JSON parser's own bound. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, HEAD "\"nodes\": [{\"id\": \"n1\"}], \"x-deep\": ");
    for (int i = 0; i < 100000; i++)
        px_strbuf_addch(&sb, '[');
    for (int i = 0; i < 100000; i++)
        px_strbuf_addch(&sb, ']');
    px_strbuf_addch(&sb, '}');
    refuse(sb.buf, 1, "", "nesting deeper than 32");
    /* A 5 KiB string. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, HEAD "\"nodes\": [{\"id\": \"n1\", \"hostname\": \"");
    for (int i = 0; i < 5000; i++)
        px_strbuf_addch(&sb, 'h');
    px_strbuf_adds(&sb, "\"}]}");
    refuse(sb.buf, 1, "/nodes/0/hostname", "longer than the limit of 4096");
    /* 1,025 devices in one node. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, HEAD "\"nodes\": [{\"id\": \"n1\", \"devices\": [");
    for (int i = 0; i < 1025; i++)
        px_strbuf_addf(&sb, "%s{\"id\": \"g%d\", \"class\": \"gpu\"}", i ? "," : "", i);
    px_strbuf_adds(&sb, "]}]}");
    refuse(sb.buf, 1, "/nodes/0/devices", "more than the limit of 1024");
    px_strbuf_release(&sb);
    /* A tighter caller limit is honoured. */
    const char *small = HEAD "\"nodes\": [{\"id\": \"n1\"}]}";
    px_hw_read_options opt = {.limits = {.max_bytes = 10}};
    px_hw_graph *g;
    px_err err;
    assert_int_equal(px_hw_graph_from_json(small, strlen(small), "t.json", &opt, &g, NULL, &err),
                     PX_ELIMIT);
    px_assert_contains(err.msg, "limit of 10 bytes");
    /* Bad syntax says where. */
    refuse("{\"schema\": \"plexus.inventory/1\",\n \"nodes\": [}", 1, "", "t.json:2");
}

static void test_validate_graph_again_against_a_catalogue(void **state)
{
    (void)state;
    result r = run(ONE_NODE("{\"id\": \"g\", \"catalog\": \"nvidia-l4\"}") "}", true);
    assert_int_equal(r.st, PX_OK);
    px_diags d2;
    px_diags_init(&d2);
    px_err err;
    px_assert_ok(px_hw_graph_validate(r.g, NULL, &d2, &err), &err);
    assert_int_equal(d2.n, 0);
    /* Against a catalogue whose entry is slower, the same graph is too fast. */
    const char *texts[] = {
        "{\"schema\": \"plexus.catalog.device/1\", \"id\": \"nvidia-l4\", \"class\": \"gpu\","
        " \"compute\": {\"bf16\": {\"value\": \"50 TFLOP/s\", \"provenance\": \"datasheet\","
        " \"source\": \"a stricter sheet\"}}, \"memory\": [{\"id\": \"vram\", \"kind\": \"gddr\","
        " \"bandwidth\": {\"value\": \"300 GB/s\", \"provenance\": \"datasheet\","
        " \"source\": \"a stricter sheet\"}}]}"};
    px_hw_catalog *cat;
    px_assert_ok(px_hw_catalog_new_from_texts(texts, NULL, 1, &cat, NULL, &err), &err);
    assert_int_equal(px_hw_graph_validate(r.g, cat, &d2, &err), PX_EVALIDATE);
    assert_int_equal(d2.n_errors, 1);
    for (size_t i = 0; i < d2.n; i++)
        if (d2.items[i].severity == PX_SEV_ERROR)
            assert_string_equal(d2.items[i].pointer, "/nodes/0/devices/0/compute/bf16");
    px_hw_catalog_free(cat);
    px_diags_release(&d2);
    done(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_structure),
        cmocka_unit_test(test_validate_unknown_member_suggests_the_right_name),
        cmocka_unit_test(test_validate_quantities),
        cmocka_unit_test(test_validate_duplicate_ids),
        cmocka_unit_test(test_validate_references),
        cmocka_unit_test(test_validate_domain_cycles),
        cmocka_unit_test(test_validate_contradicts_catalogue),
        cmocka_unit_test(test_validate_link_contradictions),
        cmocka_unit_test(test_validate_implausible_values),
        cmocka_unit_test(test_validate_reports_every_problem_at_once),
        cmocka_unit_test(test_validate_warnings_and_strict_mode),
        cmocka_unit_test(test_validate_size_limits),
        cmocka_unit_test(test_validate_graph_again_against_a_catalogue),
        cmocka_unit_test(test_validate_host_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
