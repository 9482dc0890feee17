/* Healing real runs whose faults are found from wall-clock timings: an
 * intermittent degraded link, a device slowing down as it heats, a
 * planner model error caught by the canary, and a stale topology report.
 * Timings on a loaded machine blur these, so they run in `make
 * check-slow`; the decisions themselves are covered deterministically by
 * the simulator scenarios and the detector's unit tests. */
#include "heal_run_harness.h"

static void test_intermittent_link_degradation_is_rerouted_once(void **state)
{
    (void)state;
    const char *extra[] = {"--inject",
                           "link:stage0>stage1:latency=5ms,period=100ms,duty=0.5@token10", NULL};
    outcome o = {0};
    run_scenario("link", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "link-degrade");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "localization"), "kind")), "link");
    assert_string_equal(json_string_value(json_object_get(inc, "kind")), "adaptation");
    /* Hysteresis: one change for the link, not one per swing. */
    size_t i, n = 0;
    json_t *x;
    json_array_foreach(o.incidents, i, x) n += !strcmp(
        json_string_value(json_object_get(json_object_get(x, "cause"), "class")), "link-degrade");
    assert_int_equal(n, 1);
    outcome_release(&o);
}

static void test_compute_slowdown_is_found_on_the_right_stage(void **state)
{
    (void)state;
    /* A departure must add the detector's floor to the step (0.5 ms, or
     * the baseline steps' wall time): the throughput plan gives emu-a
     * one block, a few microseconds a step, so it slows a hundredfold. */
    const char *extra[] = {"--inject", "slow:local.emu-a:factor=100,tau=20ms@token10", NULL};
    outcome o = {0};
    run_scenario("slow", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "thermal");
    const json_t *loc = json_object_get(inc, "localization");
    assert_string_equal(json_string_value(json_object_get(loc, "kind")), "compute");
    assert_string_equal(json_string_value(json_object_get(loc, "device")), "local.emu-a");
    outcome_release(&o);
}

static void test_planner_model_error_is_caught_by_the_canary_and_rolled_back(void **state)
{
    (void)state;
    /* Losing emu-a leaves a plan on emu-b as the best on paper (its
     * figures claim five times cpu0's); emu-b is far slower than its
     * figures, so that plan's canary fails and the run rolls back. */
    const char *extra[] = {"--inject", "kill:local.emu-a@token16", NULL};
    outcome o = {0};
    run_scenario("canary", lying_inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "device-loss");
    const json_t *rb = json_object_get(inc, "rollback");
    if (!json_is_object(rb)) {
        char *s = json_dumps(inc, JSON_INDENT(1));
        fail_msg("no rollback:\n%s", s ? s : "");
    }
    /* On to the next accepted candidate (cpu0 alone), whose canary then
     * passes; on a heavily loaded machine that canary may fail too and
     * the run stays where it is, still correct. */
    const char *to = json_string_value(json_object_get(rb, "to"));
    assert_non_null(to);
    assert_true(!strcmp(to, "next-candidate") || !strcmp(to, "stay"));
    outcome_release(&o);
}

static void test_stale_topology_is_reported_from_the_start(void **state)
{
    (void)state;
    const char *extra[] = {NULL};
    outcome o = {0};
    run_scenario("stale", stale_inventory, stale_plan, extra, &o);
    const json_t *inc = incident_of(&o, "stale-topology");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "localization"), "device")),
        "local.emu-a");
    outcome_release(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intermittent_link_degradation_is_rerouted_once),
        cmocka_unit_test(test_compute_slowdown_is_found_on_the_right_stage),
        cmocka_unit_test(test_planner_model_error_is_caught_by_the_canary_and_rolled_back),
        cmocka_unit_test(test_stale_topology_is_reported_from_the_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
