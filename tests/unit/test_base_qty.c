/* Quantities: every unit parses, prints back and round-trips. */
#include "px_test.h"

#include <math.h>
#include <string.h>

static void parse_ok(const char *text, px_dim dim, double want)
{
    px_qty q;
    px_err err;
    px_assert_ok(px_qty_parse(text, dim, &q, &err), &err);
    if (fabs(q.value - want) > 1e-9 * fabs(want))
        fail_msg("%s parsed to %.17g, want %.17g", text, q.value, want);
    if (dim != PX_DIM_NONE)
        assert_int_equal(q.dim, dim);
}

static void test_qty_parses_every_unit(void **state)
{
    (void)state;
    parse_ok("1 B", PX_DIM_BYTES, 1);
    parse_ok("2 kB", PX_DIM_BYTES, 2e3);
    parse_ok("3 MB", PX_DIM_BYTES, 3e6);
    parse_ok("4 GB", PX_DIM_BYTES, 4e9);
    parse_ok("5 TB", PX_DIM_BYTES, 5e12);
    parse_ok("1 KiB", PX_DIM_BYTES, 1024);
    parse_ok("1 MiB", PX_DIM_BYTES, 1048576);
    parse_ok("80 GiB", PX_DIM_BYTES, 80.0 * 1073741824);
    parse_ok("2 TiB", PX_DIM_BYTES, 2.0 * 1099511627776);
    parse_ok("7 B/s", PX_DIM_BANDWIDTH, 7);
    parse_ok("900 GB/s", PX_DIM_BANDWIDTH, 9e11);
    parse_ok("3.35 TB/s", PX_DIM_BANDWIDTH, 3.35e12);
    parse_ok("400 Gbit/s", PX_DIM_BANDWIDTH, 5e10);
    parse_ok("989 TFLOP/s", PX_DIM_FLOPS, 9.89e14);
    parse_ok("12 GFLOP/s", PX_DIM_FLOPS, 1.2e10);
    parse_ok("1.979 PFLOP/s", PX_DIM_FLOPS, 1.979e15);
    parse_ok("5 ns", PX_DIM_TIME, 5e-9);
    parse_ok("1.5 us", PX_DIM_TIME, 1.5e-6);
    parse_ok("2 ms", PX_DIM_TIME, 2e-3);
    parse_ok("3 s", PX_DIM_TIME, 3);
    parse_ok("2 min", PX_DIM_TIME, 120);
    parse_ok("1 h", PX_DIM_TIME, 3600);
    parse_ok("700 W", PX_DIM_POWER, 700);
    parse_ok("10.2 kW", PX_DIM_POWER, 10200);
    parse_ok("5 J", PX_DIM_ENERGY, 5);
    parse_ok("1 kWh", PX_DIM_ENERGY, 3.6e6);
    parse_ok("25 C", PX_DIM_TEMPERATURE, 298.15);
    parse_ok("300 K", PX_DIM_TEMPERATURE, 300);
    parse_ok("2.49 $/h", PX_DIM_MONEY_RATE, 2.49);
    parse_ok("1980 MHz", PX_DIM_FREQUENCY, 1.98e9);
    parse_ok("2.1 GHz", PX_DIM_FREQUENCY, 2.1e9);
    parse_ok("3.35TB/s", PX_DIM_BANDWIDTH, 3.35e12);
    parse_ok("1e3 GB/s", PX_DIM_BANDWIDTH, 1e12);
    parse_ok("42", PX_DIM_NONE, 42);
}

static void parse_fails(const char *text, px_dim dim, const char *needle)
{
    px_qty q;
    px_err err;
    px_err_clear(&err);
    if (px_qty_parse(text, dim, &q, &err) == PX_OK)
        fail_msg("\"%s\" parsed but should not", text);
    px_assert_contains(err.msg, needle);
}

static void test_qty_refuses_bad_text(void **state)
{
    (void)state;
    parse_fails("", PX_DIM_BYTES, "empty");
    parse_fails("GB", PX_DIM_BYTES, "does not start with a number");
    parse_fails("nan GB", PX_DIM_BYTES, "does not start with a number");
    parse_fails("inf GB", PX_DIM_BYTES, "does not start with a number");
    parse_fails("0x10 GB", PX_DIM_BYTES, "unknown unit");
    parse_fails("80 GiB", PX_DIM_BANDWIDTH, "bytes but a bandwidth is expected");
    parse_fails("80 parsecs", PX_DIM_NONE, "unknown unit");
    parse_fails("80", PX_DIM_BYTES, "has no unit");
    parse_fails("8 KB", PX_DIM_BYTES, "ambiguous");
    parse_fails("1e400 B", PX_DIM_BYTES, "out of range");
    parse_fails("1e300 PB", PX_DIM_BYTES, "out of range");
    parse_fails("1111111111111111111111111111111111111111111111111111111111111111111 B",
                PX_DIM_BYTES, "longer than 64");
}

static void round_trip(double value, px_dim dim, const char *want)
{
    char buf[64];
    px_qty_format(value, dim, buf, sizeof buf);
    if (want)
        assert_string_equal(buf, want);
    px_qty q;
    px_err err;
    px_assert_ok(px_qty_parse(buf, dim, &q, &err), &err);
    if (q.value != value)
        fail_msg("%.17g printed as \"%s\" reads back as %.17g", value, buf, q.value);
}

static void test_qty_prints_and_round_trips(void **state)
{
    (void)state;
    round_trip(3.35e12, PX_DIM_BANDWIDTH, "3.35 TB/s");
    round_trip(80.0 * 1073741824, PX_DIM_BYTES, "80 GiB");
    round_trip(1.5e9, PX_DIM_BYTES, "1.5 GB");
    round_trip(512, PX_DIM_BYTES, "512 B");
    round_trip(9.89e14, PX_DIM_FLOPS, "989 TFLOP/s");
    round_trip(2e-3, PX_DIM_TIME, "2 ms");
    round_trip(7e-7, PX_DIM_TIME, "700 ns");
    round_trip(700, PX_DIM_POWER, "700 W");
    round_trip(298.15, PX_DIM_TEMPERATURE, "298.15 K");
    round_trip(2.49, PX_DIM_MONEY_RATE, "2.49 $/h");
    round_trip(1.98e9, PX_DIM_FREQUENCY, "1.98 GHz");
    round_trip(3.6e6, PX_DIM_ENERGY, "3.6 MJ");
    round_trip(0, PX_DIM_BYTES, "0 B");
    /* Decimal prefixes scale in the text, so these stay short. */
    round_trip(2039e9, PX_DIM_BANDWIDTH, "2.039 TB/s");
    round_trip(1.6e9, PX_DIM_BANDWIDTH, "1.6 GB/s");
    round_trip(4.9e-7, PX_DIM_TIME, "490 ns");
    /* Awkward values still read back exactly. */
    px_rng r;
    px_rng_seed(&r, 7);
    for (int i = 0; i < 2000; i++) {
        double v = px_rng_uniform(&r) * pow(10, (double)px_rng_below(&r, 30) - 10);
        px_dim d = (px_dim)(1 + px_rng_below(&r, PX_DIM_COUNT_ - 1));
        round_trip(v, d, NULL);
    }
}

static void test_qty_json_forms(void **state)
{
    (void)state;
    px_arena *a;
    px_err err;
    px_assert_ok(px_arena_new(0, &a, &err), &err);
    json_error_t je;
    json_t *v = json_loads("{\"value\": \"3.35 TB/s\", \"provenance\": \"datasheet\","
                           " \"source\": \"NVIDIA H100 datasheet\", \"uncertainty\": 0.05,"
                           " \"at\": \"2026-01-02T03:04:05Z\","
                           " \"valid\": {\"param\": \"transfer_size\", \"min\": \"1 MiB\"}}",
                           0, &je);
    assert_non_null(v);
    px_qty q;
    px_assert_ok(px_qty_from_json(v, PX_DIM_BANDWIDTH, a, "x", &q, &err), &err);
    assert_int_equal(q.prov.kind, PX_PROV_DATASHEET);
    assert_string_equal(q.prov.source, "NVIDIA H100 datasheet");
    assert_int_equal(q.unc.kind, PX_UNC_RELATIVE);
    assert_true(fabs(px_qty_lo(&q) - 3.1825e12) < 1);
    assert_true(px_qty_valid_at(&q, 2 << 20));
    assert_false(px_qty_valid_at(&q, 4096));
    char t[32];
    px_time_format(q.prov.at, t);
    assert_string_equal(t, "2026-01-02T03:04:05Z");
    json_t *back = px_qty_to_json(&q);
    px_qty q2;
    px_assert_ok(px_qty_from_json(back, PX_DIM_BANDWIDTH, a, "x", &q2, &err), &err);
    assert_true(q2.value == q.value && q2.unc.rel == q.unc.rel && q2.valid.min == q.valid.min &&
                q2.prov.at == q.prov.at);
    json_decref(back);
    json_decref(v);

    /* Plain quantity prints as a bare string. */
    px_qty plain = px_qty_make(1024, PX_DIM_BYTES);
    json_t *s = px_qty_to_json(&plain);
    assert_string_equal(json_string_value(s), "1 KiB");
    json_decref(s);

    /* Hostile forms. */
    const char *bad[] = {
        "{\"value\": \"1 GB/s\", \"uncertainty\": -1}",
        "{\"value\": \"1 GB/s\", \"uncertainty\": [\"2 GB/s\", \"3 GB/s\"]}",
        "{\"value\": \"1 GB/s\", \"bogus\": 1}",
        "{\"value\": \"1 GB/s\", \"provenance\": \"rumour\"}",
        "{\"value\": \"1 GB/s\", \"valid\": {\"param\": \"x\", \"min\": \"2 MiB\", "
        "\"max\": \"1 MiB\"}}",
        "{\"value\": \"1 GB/s\", \"at\": \"yesterday\"}",
        "{\"provenance\": \"datasheet\"}",
        "[1]",
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        json_t *b = json_loads(bad[i], 0, &je);
        assert_non_null(b);
        if (px_qty_from_json(b, PX_DIM_BANDWIDTH, a, "/q", &q, &err) == PX_OK)
            fail_msg("accepted %s", bad[i]);
        px_assert_contains(err.msg, "/q");
        json_decref(b);
    }
    px_arena_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qty_parses_every_unit),
        cmocka_unit_test(test_qty_refuses_bad_text),
        cmocka_unit_test(test_qty_prints_and_round_trips),
        cmocka_unit_test(test_qty_json_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
