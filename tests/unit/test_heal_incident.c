/* plexus.incident/1 records: the completeness check, member by member. */
#include "px_test.h"

#include <string.h>

#include "plexus/heal.h"

/* A complete record, as docs/formats/incident.md shows it. */
static const char *const complete_record =
    "{\"schema\":\"plexus.incident/1\",\"id\":\"inc-0001\",\"kind\":\"recovery\","
    "\"cause\":{\"class\":\"device-loss\",\"inject\":{\"text\":\"kill:stage1@token20\","
    "\"kind\":\"kill\",\"target\":\"stage1\",\"at_token\":20}},"
    "\"signature\":{\"class\":\"device-loss\",\"locus\":{\"kind\":\"device\",\"stage\":1,"
    "\"device\":\"local.emu-a\"},\"evidence\":\"stage1 (local.emu-a): killed by signal 9\","
    "\"onset\":{\"t_s\":1.5,\"step\":20}},"
    "\"detection\":{\"detector\":\"heartbeat\",\"detected_at_s\":1.52,\"time_to_detect_s\":0.02},"
    "\"localization\":{\"kind\":\"device\",\"stage\":1,\"to\":null,\"device\":\"local.emu-a\","
    "\"evidence\":\"the worker of stage1 exited; the others answer\"},"
    "\"candidates\":[{\"action\":\"repartition\",\"label\":\"drop local.emu-a, plan again: "
    "local.cpu0\",\"accepted\":true,\"reject_code\":null,\"reject_reason\":null},"
    "{\"action\":\"restart-worker\",\"label\":\"restart the worker of stage1\",\"accepted\":false,"
    "\"reject_code\":\"infeasible\",\"reject_reason\":\"the device is gone\"}],"
    "\"choice\":{\"index\":0,\"action\":\"repartition\",\"label\":\"drop local.emu-a\","
    "\"why\":\"the only accepted candidate\"},"
    "\"canary\":{\"steps\":5,\"predicted_p50_s\":0.004,\"observed_p50_s\":0.0042,"
    "\"verdict\":\"pass\"},"
    "\"rollback\":null,"
    "\"predicted\":{\"tpot_s\":0.004},\"realized\":{\"tpot_s\":0.0042},"
    "\"timeline\":[{\"t_s\":1.5,\"event\":\"fault\"},{\"t_s\":1.52,\"event\":\"detected\"}],"
    "\"rto_s\":0.9,\"rpo_tokens\":0,"
    "\"lost_work\":{\"tokens\":0,\"steps\":3,\"seconds\":0.2},"
    "\"reproducer\":{\"trace\":\"run.trace\",\"first_seq\":10,\"last_seq\":42,"
    "\"command\":\"plexus replay run.trace\"}}";

static json_t *record(void)
{
    json_error_t e;
    json_t *j = json_loads(complete_record, 0, &e);
    if (!j)
        fail_msg("record: %s at %d", e.text, e.position);
    return j;
}

static void expect_incomplete(json_t *j, const char *needle)
{
    px_err err;
    px_err_clear(&err);
    assert_false(px_heal_incident_complete(j, &err));
    assert_int_equal(err.code, PX_EVALIDATE);
    px_assert_contains(err.msg, needle);
    json_decref(j);
}

static void test_incident_complete_record_passes(void **state)
{
    (void)state;
    json_t *j = record();
    px_err err;
    if (!px_heal_incident_complete(j, &err))
        fail_msg("%s", err.msg);
    /* A rollback object and a record where nothing could be chosen. */
    json_object_set_new(j, "rollback",
                        json_pack("{s:s,s:s}", "why", "canary failed", "to", "the previous plan"));
    assert_true(px_heal_incident_complete(j, &err));
    json_t *c0 = json_array_get(json_object_get(j, "candidates"), 0);
    json_object_set_new(c0, "accepted", json_false());
    json_object_set_new(c0, "reject_code", json_string("slo"));
    json_object_set_new(c0, "reject_reason", json_string("p99 12 ms over 10 ms"));
    json_object_set_new(json_object_get(j, "choice"), "index", json_integer(-1));
    json_object_set_new(json_object_get(j, "choice"), "action", json_string("none"));
    if (!px_heal_incident_complete(j, &err))
        fail_msg("%s", err.msg);
    json_decref(j);
}

static void test_incident_names_each_missing_member(void **state)
{
    (void)state;
    static const char *const top[] = {
        "schema",       "id",         "kind",   "cause",      "signature", "detection",
        "localization", "candidates", "choice", "canary",     "rollback",  "predicted",
        "realized",     "timeline",   "rto_s",  "rpo_tokens", "lost_work", "reproducer"};
    for (size_t i = 0; i < PX_ARRAY_LEN(top); i++) {
        json_t *j = record();
        json_object_del(j, top[i]);
        char needle[64];
        snprintf(needle, sizeof needle, "/%s: missing", top[i]);
        expect_incomplete(j, needle);
    }
    static const char *const nested[][2] = {{"cause", "class"},
                                            {"cause", "inject"},
                                            {"signature", "evidence"},
                                            {"signature", "onset"},
                                            {"detection", "detector"},
                                            {"detection", "time_to_detect_s"},
                                            {"localization", "evidence"},
                                            {"localization", "to"},
                                            {"choice", "why"},
                                            {"canary", "verdict"},
                                            {"canary", "observed_p50_s"},
                                            {"lost_work", "tokens"},
                                            {"reproducer", "command"},
                                            {"realized", "tpot_s"}};
    for (size_t i = 0; i < PX_ARRAY_LEN(nested); i++) {
        json_t *j = record();
        json_object_del(json_object_get(j, nested[i][0]), nested[i][1]);
        char needle[96];
        snprintf(needle, sizeof needle, "/%s/%s: missing", nested[i][0], nested[i][1]);
        expect_incomplete(j, needle);
    }
}

static void test_incident_refuses_inconsistent_records(void **state)
{
    (void)state;
    json_t *j = record();
    json_object_del(json_array_get(json_object_get(j, "candidates"), 1), "reject_reason");
    expect_incomplete(j, "/candidates/1/reject_reason: missing");

    j = record();
    json_object_set_new(json_array_get(json_object_get(j, "candidates"), 1), "reject_code",
                        json_string(""));
    expect_incomplete(j, "/candidates/1/reject_code: empty");

    j = record();
    json_object_set_new(json_object_get(j, "choice"), "index", json_integer(2));
    expect_incomplete(j, "not among the 2 candidates");

    j = record();
    json_object_set_new(json_object_get(j, "choice"), "index", json_integer(1));
    expect_incomplete(j, "candidate 1 was rejected");

    j = record();
    json_object_set_new(json_object_get(j, "choice"), "index", json_integer(-1));
    expect_incomplete(j, "-1 (none chosen) although 1 candidates were accepted");

    j = record();
    json_object_set_new(json_object_get(j, "choice"), "action", json_string("reroute"));
    expect_incomplete(j, "/choice/action: differs");

    j = record();
    json_object_set_new(j, "schema", json_string("plexus.incident/2"));
    expect_incomplete(j, "/schema");

    j = record();
    json_object_set_new(j, "kind", json_string("accident"));
    expect_incomplete(j, "/kind: \"accident\" is not one of recovery, adaptation");

    j = record();
    json_object_set_new(json_object_get(j, "cause"), "class", json_string("gremlins"));
    expect_incomplete(j, "/cause/class: \"gremlins\" is no fault class");

    j = record();
    json_object_set_new(json_object_get(j, "canary"), "verdict", json_string("maybe"));
    expect_incomplete(j, "/canary/verdict");

    j = record();
    json_object_set_new(j, "rollback", json_object());
    expect_incomplete(j, "/rollback/why: missing");

    j = record();
    json_object_set_new(j, "timeline", json_array());
    expect_incomplete(j, "/timeline: empty");

    j = record();
    json_array_append_new(json_object_get(j, "timeline"), json_string("later"));
    expect_incomplete(j, "/timeline/2: expected an object");

    j = record();
    json_object_set_new(j, "rto_s", json_string("1 s"));
    expect_incomplete(j, "/rto_s: expected a number or null, got a string");

    j = record();
    json_object_set_new(json_object_get(j, "localization"), "kind", json_string("everywhere"));
    expect_incomplete(j, "/localization/kind");

    px_err err;
    assert_false(px_heal_incident_complete(NULL, &err));
    json_t *arr = json_array();
    assert_false(px_heal_incident_complete(arr, NULL));
    json_decref(arr);
}

static void test_incident_embeds_the_module_own_json(void **state)
{
    (void)state;
    /* Records built from the module's JSON forms pass the check. */
    json_t *j = record();
    px_heal_candidate c[2];
    memset(c, 0, sizeof c);
    c[0].action = PX_HEAL_ACT_REPARTITION;
    strcpy(c[0].label, "drop local.emu-a");
    c[0].accepted = c[0].validated = c[0].feasible = c[0].contract_ok = c[0].slo_ok = true;
    c[0].tpot_p50_s = c[0].tpot_p99_s = c[0].throughput = 1;
    c[1].action = PX_HEAL_ACT_LOWER_PRECISION;
    strcpy(c[1].label, "lower precision");
    strcpy(c[1].reject_code, "contract");
    strcpy(c[1].reject_reason, "forbidden by contract \"strict\"");
    json_t *arr = json_array();
    for (int i = 0; i < 2; i++)
        json_array_append_new(arr, px_heal_candidate_to_json(&c[i]));
    json_object_set_new(j, "candidates", arr);
    px_heal_inject in;
    px_err err;
    px_assert_ok(px_heal_inject_parse("kill:stage1@token20", &in, &err), &err);
    json_object_set_new(json_object_get(j, "cause"), "inject", px_heal_inject_to_json(&in));
    px_heal_locus l = {.kind = PX_HEAL_AT_LINK, .stage = 0, .to = 1};
    strcpy(l.device, "local.cpu0>local.emu-a");
    json_object_set_new(json_object_get(j, "signature"), "locus", px_heal_locus_to_json(&l));
    if (!px_heal_incident_complete(j, &err))
        fail_msg("%s", err.msg);
    json_decref(j);
    assert_string_equal(px_heal_fault_class_name(PX_HEAL_STALE_TOPOLOGY), "stale-topology");
    assert_string_equal(px_heal_fault_class_name(PX_HEAL_FAULT_CLASS_COUNT_), "unknown");
    assert_string_equal(px_heal_action_name(PX_HEAL_ACT_FALLBACK_PLAN), "fallback-plan");
    assert_string_equal(px_heal_locus_kind_name(PX_HEAL_AT_DOMAIN), "domain");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_incident_complete_record_passes),
        cmocka_unit_test(test_incident_names_each_missing_member),
        cmocka_unit_test(test_incident_refuses_inconsistent_records),
        cmocka_unit_test(test_incident_embeds_the_module_own_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
