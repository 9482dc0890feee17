/* Inputs shaped to make a careless reader quadratic: many duplicate ids,
 * many one-way links between two ends, many unknown members, a long domain
 * cycle, many dangling references.  Each must be read in time roughly
 * linear in its size, and the report stays bounded. */
#include "px_test.h"

#include <string.h>

#include "plexus/hw.h"

static void timed(const char *what, const char *text, px_status want, double max_s)
{
    uint64_t t0 = px_now_ns();
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_status st = px_hw_graph_from_json(text, strlen(text), what, NULL, &g, &diags, NULL);
    double s = (double)(px_now_ns() - t0) / 1e9;
    if (st != want) {
        char *report = px_diags_format(&diags, what);
        fail_msg("%s: got %s, want %s\n%.2000s", what, px_status_name(st), px_status_name(want),
                 report ? report : "");
    }
    if (s > max_s)
        fail_msg("%s took %.2f s (limit %.1f s): quadratic?", what, s, max_s);
    /* A hostile file cannot make the report grow without bound. */
    assert_true(diags.n <= 1000);
    print_message("%s: %.3f s, %zu diagnostics (%zu dropped)\n", what, s, diags.n, diags.n_dropped);
    px_hw_graph_free(g);
    px_diags_release(&diags);
}

static void test_limits_hostile_inputs_stay_fast(void **state)
{
    (void)state;
    px_strbuf sb = PX_STRBUF_INIT;

    /* Sizes where a quadratic step would take minutes and a linear one
     * takes a fraction of a second (seconds under the sanitizers). */

    /* 50,000 nodes with one id: duplicate detection by hash. */
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"nodes\": [");
    for (int i = 0; i < 50000; i++)
        px_strbuf_addf(&sb, "%s{\"id\": \"n\"}", i ? "," : "");
    px_strbuf_adds(&sb, "]}");
    timed("50k duplicate nodes", sb.buf, PX_EVALIDATE, 20);

    /* 60,000 one-way links between two nodes, half each way: the
     * reverse-direction check must not scan. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"a\"},"
                        " {\"id\": \"b\"}], \"links\": [");
    for (int i = 0; i < 60000; i++)
        px_strbuf_addf(&sb,
                       "%s{\"from\": \"%s\", \"to\": \"%s\", \"bidirectional\": false,"
                       " \"kind\": \"ethernet\", \"bandwidth\": \"%d Mbit/s\"}",
                       i ? "," : "", i % 2 ? "a" : "b", i % 2 ? "b" : "a", 1 + i % 1000);
    px_strbuf_adds(&sb, "]}");
    timed("60k one-way links", sb.buf, PX_OK, 20);

    /* 50,000 unknown members in one object. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\"}]");
    for (int i = 0; i < 50000; i++)
        px_strbuf_addf(&sb, ", \"member%d\": 1", i);
    px_strbuf_adds(&sb, "}");
    timed("50k unknown members", sb.buf, PX_EVALIDATE, 20);

    /* A 50,000-domain cycle. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\"}],"
                        " \"domains\": [");
    for (int i = 0; i < 50000; i++)
        px_strbuf_addf(&sb, "%s{\"id\": \"d%d\", \"kind\": \"zone\", \"parent\": \"d%d\"}",
                       i ? "," : "", i, (i + 1) % 50000);
    px_strbuf_adds(&sb, "]}");
    timed("50k-domain cycle", sb.buf, PX_EVALIDATE, 20);

    /* 200 devices each naming 1,000 domains that do not exist. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\","
                        " \"devices\": [");
    for (int i = 0; i < 200; i++) {
        px_strbuf_addf(&sb, "%s{\"id\": \"g%d\", \"class\": \"gpu\", \"domains\": [", i ? "," : "",
                       i);
        for (int k = 0; k < 1000; k++)
            px_strbuf_addf(&sb, "%s\"x%d\"", k ? "," : "", k);
        px_strbuf_adds(&sb, "]}");
    }
    px_strbuf_adds(&sb, "]}]}");
    timed("200k dangling domain references", sb.buf, PX_EVALIDATE, 20);
    px_strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_hostile_inputs_stay_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
