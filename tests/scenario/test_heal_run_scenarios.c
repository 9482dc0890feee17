/* Healing real runs whose faults are found from events, not from
 * timings: a lost device (the process table), silent corruption (audited
 * steps), a crashed worker, memory pressure, and a hung worker (a step
 * deadline far above any step time).  The scenarios found from wall-clock
 * timings are in tests/slow/test_heal_run_timing.c. */
#include "heal_run_harness.h"

static void test_device_loss_mid_generation_recovers_with_identical_output(void **state)
{
    (void)state;
    /* The device, not "stage1": on a loaded machine a slow step may have
     * moved the run to another plan before token 20. */
    const char *extra[] = {"--inject", "kill:local.emu-a@token20", NULL};
    outcome o = {0};
    run_scenario("kill", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "device-loss");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "localization"), "device")),
        "local.emu-a");
    /* Recovery well within the deadline even in a sanitized debug build
     * (the benchmark measures the release figure against 1 s). */
    assert_true(num(inc, "recover_s") > 0 && num(inc, "recover_s") < 10);
    assert_true(num(inc, "rto_s") >= num(inc, "recover_s"));
    assert_int_equal(json_integer_value(json_object_get(inc, "rpo_tokens")), 0);
    assert_true(json_integer_value(json_object_get(json_object_get(inc, "lost_work"), "steps")) >
                0);
    outcome_release(&o);
}

static void test_silent_corruption_is_caught_by_the_audit_and_regenerated(void **state)
{
    (void)state;
    const char *extra[] = {"--inject", "corrupt:local.emu-a:magnitude=0.5@token12", "--audit-every",
                           "4", NULL};
    outcome o = {0};
    run_scenario("corrupt", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "corruption");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "localization"), "device")),
        "local.emu-a");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "detection"), "detector")), "audit");
    outcome_release(&o);
}

static void test_crashed_worker_is_restarted(void **state)
{
    (void)state;
    const char *extra[] = {"--inject", "crash:stage0@token6", NULL};
    outcome o = {0};
    run_scenario("crash", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "crash");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(inc, "choice"), "action")),
        "restart-worker");
    outcome_release(&o);
}

static void test_memory_pressure_moves_the_stage_off_the_device(void **state)
{
    (void)state;
    /* More than the emulated device holds: the stage ends, and the
     * failure is blamed on memory pressure at that device, not on a
     * crash. */
    const char *extra[] = {"--inject", "memory:stage1:bytes=100GiB@token6", NULL};
    outcome o = {0};
    run_scenario("memory", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "memory-pressure");
    const char *action =
        json_string_value(json_object_get(json_object_get(inc, "choice"), "action"));
    assert_non_null(action);
    assert_true(!strcmp(action, "repartition") || !strcmp(action, "fallback-plan"));
    px_assert_contains(
        json_string_value(json_object_get(json_object_get(inc, "signature"), "evidence")),
        "ran out of memory");
    outcome_release(&o);
}

static void test_hung_worker_is_found_within_the_deadline(void **state)
{
    (void)state;
    const char *extra[] = {"--inject", "stop:stage1@token14", NULL};
    outcome o = {0};
    run_scenario("hang", inventory, plan, extra, &o);
    const json_t *inc = incident_of(&o, "hang");
    const json_t *det = json_object_get(inc, "detection");
    /* The deadline is ten baseline steps, at least 250 ms. */
    assert_true(num(det, "time_to_detect_s") < 2.0);
    outcome_release(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_loss_mid_generation_recovers_with_identical_output),
        cmocka_unit_test(test_silent_corruption_is_caught_by_the_audit_and_regenerated),
        cmocka_unit_test(test_crashed_worker_is_restarted),
        cmocka_unit_test(test_memory_pressure_moves_the_stage_off_the_device),
        cmocka_unit_test(test_hung_worker_is_found_within_the_deadline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
