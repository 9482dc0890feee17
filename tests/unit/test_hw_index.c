/*
 * The work of reading an inventory grows linearly with its size: the
 * lookups of ids (devices, nodes, domains, link ends) go through one
 * hash index, and the probes it makes per device stay flat from a small
 * inventory to one sixteen times larger.  Work is counted, not timed.
 */
#include "px_test.h"

#include <string.h>

#include "hw/hw_impl.h"
#include "plexus/hw.h"

/* n nodes of 8 GPUs, every pair joined by NVLink and each GPU by PCIe to
 * its host, the hosts in a ring with chords, racks and power domains: the
 * shape of bench/bench_hw_inventory.c. */
static char *inventory(int n, size_t *len)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"name\": \"work\", \"domains\": "
                        "[{\"id\": \"region\", \"kind\": \"region\"}");
    for (int r = 0; r < (n + 9) / 10; r++)
        px_strbuf_addf(&sb,
                       ", {\"id\": \"rack%d\", \"kind\": \"rack\", \"parent\": \"region\"}, "
                       "{\"id\": \"pdu%d\", \"kind\": \"power\", \"parent\": \"region\"}",
                       r, r);
    px_strbuf_adds(&sb, "], \"nodes\": [");
    for (int i = 0; i < n; i++) {
        px_strbuf_addf(&sb,
                       "%s{\"id\": \"n%d\", \"domains\": [\"rack%d\", \"pdu%d\"], \"memory\": "
                       "[{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"2 TiB\", "
                       "\"bandwidth\": \"614 GB/s\"}], \"devices\": [",
                       i ? "," : "", i, i / 10, i / 10);
        for (int g = 0; g < 8; g++)
            px_strbuf_addf(&sb, "%s{\"id\": \"gpu%d\", \"catalog\": \"nvidia-h100-sxm5\"}",
                           g ? "," : "", g);
        px_strbuf_adds(&sb, "]}");
    }
    px_strbuf_adds(&sb, "], \"links\": [");
    for (int i = 0; i < n; i++) {
        for (int a = 0; a < 8; a++) {
            for (int b = a + 1; b < 8; b++)
                px_strbuf_addf(&sb,
                               "%s{\"from\": \"n%d.gpu%d\", \"to\": \"n%d.gpu%d\", \"catalog\": "
                               "\"nvlink-4\", \"contention\": \"n%d-nvswitch\"}",
                               i || a || b > 1 ? "," : "", i, a, i, b, i);
            px_strbuf_addf(&sb,
                           ",{\"from\": \"n%d.gpu%d\", \"to\": \"n%d\", \"catalog\": "
                           "\"pcie-5-x16\"}",
                           i, a, i);
        }
        px_strbuf_addf(&sb,
                       ",{\"from\": \"n%d\", \"to\": \"n%d\", \"catalog\": \"ethernet-400g\"}"
                       ",{\"from\": \"n%d\", \"to\": \"n%d\", \"catalog\": \"ethernet-400g\"}",
                       i, (i + 1) % n, i, (i + 37) % n);
    }
    px_strbuf_adds(&sb, "]}");
    return px_strbuf_detach(&sb, len);
}

/* Index probes per device to read and validate an inventory of n nodes. */
static double probes_per_device(int n)
{
    size_t len;
    char *text = inventory(n, &len);
    assert_non_null(text);
    px_hw_graph *g = NULL;
    px_err err;
    unsigned long before = px__hw_index_probes();
    px_assert_ok(px_hw_graph_from_json(text, len, "work.json", NULL, &g, NULL, &err), &err);
    unsigned long probes = px__hw_index_probes() - before;
    size_t n_devices = px_hw_graph_view(g)->n_devices;
    assert_int_equal(n_devices, (size_t)n * 8);
    px_hw_graph_free(g);
    free(text);
    return (double)probes / (double)n_devices;
}

static void test_hw_index_probes_per_device_stay_flat(void **state)
{
    (void)state;
    double small = probes_per_device(50), large = probes_per_device(800);
    print_message("index probes per device: %.2f at 400 devices, %.2f at 6,400\n", small, large);
    /* Each device is named a few dozen times (its links' ends, its node's
     * lists); a lookup costs about one probe. */
    assert_true(small > 1);
    if (large > small * 1.25)
        fail_msg("index probes per device grow with the inventory: %.2f at 400 devices, %.2f "
                 "at 6,400",
                 small, large);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_index_probes_per_device_stay_flat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
