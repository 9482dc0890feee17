/* Hysteresis and the canary. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/heal.h"

static void test_hysteresis_alternating_signal_changes_once(void **state)
{
    (void)state;
    px_heal_hysteresis h;
    px_heal_hysteresis_init(&h, 2.0, 1.3, 10.0);
    int adapts = 0, reverts = 0;
    for (int i = 0; i < 200; i++) {
        double signal = i % 2 ? 2.1 : 1.9; /* swings around enter */
        px_heal_hyst_verdict v = px_heal_hysteresis_update(&h, i * 0.5, signal);
        adapts += v == PX_HEAL_HYST_ADAPT;
        reverts += v == PX_HEAL_HYST_REVERT;
    }
    assert_int_equal(adapts, 1);
    assert_int_equal(reverts, 0);
    assert_int_equal(h.changes, 1);
    assert_true(h.adapted);
}

static void test_hysteresis_reverts_only_after_the_dwell(void **state)
{
    (void)state;
    px_heal_hysteresis h;
    px_heal_hysteresis_init(&h, 2.0, 1.3, 10.0);
    assert_int_equal(px_heal_hysteresis_update(&h, 0, 1.0), PX_HEAL_HYST_STAY);
    assert_int_equal(px_heal_hysteresis_update(&h, 5, 3.0), PX_HEAL_HYST_ADAPT);
    /* Well below exit, but within the dwell. */
    assert_int_equal(px_heal_hysteresis_update(&h, 6, 1.0), PX_HEAL_HYST_STAY);
    assert_int_equal(px_heal_hysteresis_update(&h, 14.9, 1.0), PX_HEAL_HYST_STAY);
    /* Past the dwell but between exit and enter: stay adapted. */
    assert_int_equal(px_heal_hysteresis_update(&h, 20, 1.5), PX_HEAL_HYST_STAY);
    assert_int_equal(px_heal_hysteresis_update(&h, 20, NAN), PX_HEAL_HYST_STAY);
    assert_int_equal(px_heal_hysteresis_update(&h, 21, 1.2), PX_HEAL_HYST_REVERT);
    assert_false(h.adapted);
    assert_float_equal(h.last_change_s, 21, 0);
    assert_int_equal(h.changes, 2);
    /* An exit above enter is lowered to enter. */
    px_heal_hysteresis_init(&h, 2.0, 5.0, 0);
    assert_float_equal(h.exit, 2.0, 0);
}

static void test_canary_passes_fails_and_waits(void **state)
{
    (void)state;
    px_heal_canary c;
    px_heal_canary_begin(&c, 0.010, 0.012, 5, 1.2);
    for (int i = 0; i < 4; i++)
        assert_int_equal(px_heal_canary_observe(&c, 0.011), PX_HEAL_CANARY_PENDING);
    assert_int_equal(px_heal_canary_observe(&c, NAN), PX_HEAL_CANARY_PENDING);
    assert_int_equal(px_heal_canary_observe(&c, 0.050), PX_HEAL_CANARY_PASS); /* median 11 ms */
    assert_float_equal(px_heal_canary_median(&c), 0.011, 1e-15);

    px_heal_canary_begin(&c, 0.010, 0.012, 3, 1.2);
    assert_int_equal(px_heal_canary_observe(&c, 0.020), PX_HEAL_CANARY_PENDING);
    assert_int_equal(px_heal_canary_observe(&c, 0.005), PX_HEAL_CANARY_PENDING);
    /* Median 15 ms > 12 ms x 1.2. */
    assert_int_equal(px_heal_canary_observe(&c, 0.015), PX_HEAL_CANARY_FAIL);

    /* Faster than predicted passes; the limit is hi x tolerance. */
    px_heal_canary_begin(&c, 0.010, 0.012, 1, 1.0);
    assert_int_equal(px_heal_canary_observe(&c, 0.001), PX_HEAL_CANARY_PASS);
    px_heal_canary_begin(&c, 0.010, 0.012, 1, 1.0);
    assert_int_equal(px_heal_canary_observe(&c, 0.0121), PX_HEAL_CANARY_FAIL);
    /* No hi: the p50 stands in; neither: it passes. */
    px_heal_canary_begin(&c, 0.010, NAN, 1, 1.0);
    assert_int_equal(px_heal_canary_observe(&c, 0.011), PX_HEAL_CANARY_FAIL);
    px_heal_canary_begin(&c, NAN, NAN, 2, 0);
    assert_float_equal(c.tolerance, 1, 0);
    assert_int_equal(px_heal_canary_observe(&c, 9), PX_HEAL_CANARY_PENDING);
    assert_int_equal(px_heal_canary_observe(&c, 9), PX_HEAL_CANARY_PASS);
    /* need is clamped to what the canary keeps; the median slides. */
    px_heal_canary_begin(&c, 0.010, 0.012, 1000, 1.0);
    assert_int_equal(c.need, 64);
    for (int i = 0; i < 100; i++)
        px_heal_canary_observe(&c, i < 50 ? 1.0 : 0.001);
    assert_float_equal(px_heal_canary_median(&c), 0.001, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hysteresis_alternating_signal_changes_once),
        cmocka_unit_test(test_hysteresis_reverts_only_after_the_dwell),
        cmocka_unit_test(test_canary_passes_fails_and_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
