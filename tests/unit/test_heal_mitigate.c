/* Mitigation candidates planned on a scenario pack's inventory and
 * validated in the simulator: device loss, a lower precision under a
 * bitwise contract, a faster candidate that breaks the tail. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/heal.h"

typedef struct fixture {
    px_hw_graph *graph;
    px_ir_model *model;
    px_contract *contract;
    json_t *current;
    px_heal_context ctx;
} fixture;

static void setup_on(fixture *fx, const char *scenario, const char *preset, const char *contract,
                     px_plan_objective objective, uint32_t gen_tokens)
{
    memset(fx, 0, sizeof *fx);
    char *path = px_test_source_path(scenario);
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &fx->graph, NULL, &err), &err);
    free(path);
    px_assert_ok(px_ir_preset_new(preset, PX_DTYPE_COUNT_, NULL, &fx->model, &err), &err);
    if (contract)
        px_assert_ok(px_contract_builtin(contract, &fx->contract, &err), &err);
    px_heal_context *c = &fx->ctx;
    px_plan_request_default(&c->request);
    c->request.graph = fx->graph;
    c->request.model = fx->model;
    c->request.contract = fx->contract;
    c->request.objective = objective;
    if (gen_tokens)
        c->request.workload.gen_tokens = gen_tokens;
    c->request.fallbacks = false;
    c->graph = fx->graph;
    c->model = fx->model;
    c->contract = fx->contract;
    c->seed = 7;
    c->replications = 2;
    c->duration_s = 20;
    px_plan *p;
    px_assert_ok(px_plan_search(&c->request, &p, &err), &err);
    fx->current = px_plan_to_json(p);
    px_plan_free(p);
    c->current_plan = fx->current;
}

static void teardown_fx(fixture *fx)
{
    json_decref(fx->current);
    px_contract_free(fx->contract);
    px_ir_model_free(fx->model);
    px_hw_graph_free(fx->graph);
}

static const char *first_device(const json_t *plan)
{
    const json_t *st = json_array_get(json_object_get(plan, "stages"), 0);
    return json_string_value(json_array_get(json_object_get(st, "devices"), 0));
}

static bool plan_uses(const json_t *plan, const char *dev)
{
    size_t i, k;
    const json_t *st, *d;
    json_array_foreach(json_object_get(plan, "stages"), i, st)
    {
        json_array_foreach(json_object_get(st, "devices"), k, d)
        {
            if (!strcmp(json_string_value(d), dev))
                return true;
        }
    }
    return false;
}

static void dump(const px_heal_candidate *c, size_t n, int chosen)
{
    for (size_t i = 0; i < n; i++)
        print_message("  %c%zu %-15s p99 %.4g s, %.4g tok/s, %s %s: %s\n",
                      (int)i == chosen ? '*' : ' ', i, px_heal_action_name(c[i].action),
                      c[i].tpot_p99_s, c[i].throughput, c[i].accepted ? "accepted" : "rejected",
                      c[i].reject_code, c[i].accepted ? c[i].label : c[i].reject_reason);
}

static void test_device_loss_candidates_are_planned_validated_and_chosen(void **state)
{
    (void)state;
    fixture fx;
    setup_on(&fx, "data/scenarios/faulted-cluster.json", "llama-3-8b", NULL, PX_PLAN_OBJ_LATENCY,
             0);
    const char *lost = first_device(fx.current);
    assert_non_null(lost);
    px_heal_locus where = {.kind = PX_HEAL_AT_DEVICE, .stage = 0};
    px_strlcpy(where.device, lost, sizeof where.device);
    px_heal_candidate *c;
    size_t n;
    px_err err;
    /* A crash: the same plan on a fresh worker is offered too. */
    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_CRASH, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 3);
    assert_int_equal(c[2].action, PX_HEAL_ACT_RESTART_WORKER);
    assert_null(c[2].plan);
    px_assert_contains(c[2].label, "restart the worker of stage0");
    px_heal_candidates_free(c, n);

    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DEVICE_LOSS, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 2);
    assert_int_equal(c[0].action, PX_HEAL_ACT_REPARTITION);
    assert_int_equal(c[1].action, PX_HEAL_ACT_FALLBACK_PLAN);
    for (int i = 0; i < 2; i++) {
        assert_non_null(c[i].plan);
        assert_false(plan_uses(c[i].plan, lost));
    }
    assert_int_equal(json_array_size(json_object_get(c[1].plan, "stages")), 1);
    px_assert_contains(c[0].label, "drop ");
    px_assert_contains(c[0].label, lost);

    /* Deterministic: the same inputs give the same candidates. */
    px_heal_candidate *again;
    size_t n2;
    px_assert_ok(px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DEVICE_LOSS, &where, NULL, 0,
                                    &again, &n2, &err),
                 &err);
    assert_int_equal(n2, n);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(c[i].label, again[i].label);
        assert_true(json_equal(c[i].plan, again[i].plan));
    }
    px_heal_candidates_free(again, n2);

    /* The device is gone from the start of the simulated window. */
    char doc[256];
    snprintf(doc, sizeof doc,
             "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"0 s\",\"kind\":"
             "\"device-loss\",\"target\":\"%s\"}]}",
             lost);
    px_sim_faults cond;
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "cond.json", &cond, &err), &err);
    int chosen;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, &cond, &chosen, &err), &err);
    dump(c, n, chosen);
    for (int i = 0; i < 2; i++) {
        assert_true(c[i].accepted && c[i].validated && c[i].feasible);
        assert_true(c[i].contract_ok && c[i].slo_ok);
        assert_true(c[i].tpot_p99_s >= c[i].tpot_p50_s && c[i].throughput > 0);
    }
    /* The one-device fallback is slower: the repartition is chosen. */
    assert_true(c[1].tpot_p99_s > c[0].tpot_p99_s);
    assert_int_equal(chosen, 0);

    /* The same validation again gives the same figures. */
    double p99 = c[0].tpot_p99_s;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, &cond, &chosen, &err), &err);
    assert_float_equal(c[0].tpot_p99_s, p99, 0);

    json_t *j = px_heal_candidate_to_json(&c[0]);
    assert_string_equal(json_string_value(json_object_get(j, "action")), "repartition");
    assert_true(json_is_string(json_object_get(j, "plan")));
    assert_true(json_is_null(json_object_get(j, "reject_code")));
    json_decref(j);
    /* Without a current plan the candidates that keep it cannot be judged. */
    fx.ctx.current_plan = NULL;
    px_heal_candidate keep = {.action = PX_HEAL_ACT_NONE, .feasible = true};
    px_assert_ok(px_heal_validate(&fx.ctx, &keep, 1, NULL, &chosen, &err), &err);
    assert_int_equal(chosen, -1);
    assert_string_equal(keep.reject_code, "infeasible");
    px_assert_contains(keep.reject_reason, "current plan");
    j = px_heal_candidate_to_json(&keep);
    assert_string_equal(json_string_value(json_object_get(j, "reject_code")), "infeasible");
    assert_true(json_is_null(json_object_get(j, "plan")));
    json_decref(j);

    px_sim_faults_release(&cond);
    px_heal_candidates_free(c, n);
    teardown_fx(&fx);
}

static void test_domain_loss_drops_every_member(void **state)
{
    (void)state;
    fixture fx;
    setup_on(&fx, "data/scenarios/faulted-cluster.json", "llama-3-8b", NULL, PX_PLAN_OBJ_LATENCY,
             0);
    px_heal_locus where = {.kind = PX_HEAL_AT_DOMAIN};
    strcpy(where.device, "rack-a");
    px_heal_candidate *c;
    size_t n;
    px_err err;
    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DOMAIN_LOSS, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 2);
    px_assert_contains(c[0].label, "drop rack-a (4 devices)");
    static const char *const rack_a[] = {"n1.gpu0", "n1.gpu1", "n2.gpu0", "n2.gpu1"};
    for (size_t i = 0; i < n; i++) {
        assert_non_null(c[i].plan);
        for (size_t k = 0; k < 4; k++)
            assert_false(plan_uses(c[i].plan, rack_a[k]));
    }
    px_heal_candidates_free(c, n);

    /* A zone holds both racks: nothing is left. */
    strcpy(where.device, "zone-1");
    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DOMAIN_LOSS, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 2);
    assert_null(c[0].plan);
    assert_false(c[0].feasible);
    assert_true(c[0].infeasible_at_generation);
    assert_string_equal(c[0].reject_code, "infeasible");
    assert_true(c[0].reject_reason[0]);
    int chosen;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, NULL, &chosen, &err), &err);
    assert_int_equal(chosen, -1);
    assert_string_equal(c[0].reject_code, "infeasible");
    px_heal_candidates_free(c, n);

    strcpy(where.device, "rack-z");
    assert_int_equal(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DOMAIN_LOSS, &where, NULL, 0, &c, &n, &err),
        PX_EINVAL);
    px_assert_contains(err.msg, "rack-z");
    const char *bogus[] = {"n9.gpu9"};
    assert_int_equal(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_NONE, NULL, bogus, 1, &c, &n, &err),
        PX_EINVAL);
    px_assert_contains(err.msg, "n9.gpu9");
    teardown_fx(&fx);
}

static void test_lower_precision_is_rejected_under_a_bitwise_contract(void **state)
{
    (void)state;
    fixture fx;
    setup_on(&fx, "data/scenarios/faulted-cluster.json", "llama-3-8b", "strict",
             PX_PLAN_OBJ_LATENCY, 0);
    const char *dev = first_device(fx.current);
    px_heal_locus where = {.kind = PX_HEAL_AT_COMPUTE, .stage = 0};
    px_strlcpy(where.device, dev, sizeof where.device);
    px_heal_candidate *c;
    size_t n;
    px_err err;
    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_THERMAL, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 3);
    assert_int_equal(c[0].action, PX_HEAL_ACT_PACE);
    assert_int_equal(c[1].action, PX_HEAL_ACT_REPARTITION);
    assert_int_equal(c[2].action, PX_HEAL_ACT_LOWER_PRECISION);
    assert_true(c[0].max_batch >= 1);
    assert_non_null(c[2].plan);
    int chosen;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, NULL, &chosen, &err), &err);
    dump(c, n, chosen);
    assert_false(c[2].accepted);
    assert_false(c[2].contract_ok);
    assert_string_equal(c[2].reject_code, "contract");
    px_assert_contains(c[2].reject_reason, "forbidden by contract");
    /* The latency plan admits one sequence: pacing cannot help. */
    assert_false(c[0].accepted);
    assert_string_equal(c[0].reject_code, "infeasible");
    px_assert_contains(c[0].reject_reason, "one sequence");
    assert_true(c[1].accepted);
    assert_int_equal(chosen, 1);
    px_heal_candidates_free(c, n);
    teardown_fx(&fx);
}

static void test_faster_candidate_breaking_the_tail_is_rejected(void **state)
{
    (void)state;
    /* The current plan (one H100) loses its device: it serves nothing, and
     * a repartition onto the L4 serves far more, at longer steps. */
    fixture fx;
    setup_on(&fx, "data/scenarios/hetero-pair-h100-l4.json", "llama-3-8b", NULL,
             PX_PLAN_OBJ_LATENCY, 16);
    const char *lost = first_device(fx.current);
    px_heal_locus where = {.kind = PX_HEAL_AT_DEVICE, .stage = 0};
    px_strlcpy(where.device, lost, sizeof where.device);
    px_heal_candidate *c;
    size_t n;
    px_err err;
    px_assert_ok(
        px_heal_candidates(&fx.ctx, fx.current, PX_HEAL_DEVICE_LOSS, &where, NULL, 0, &c, &n, &err),
        &err);
    assert_int_equal(n, 2);
    /* Keeping the current plan, judged beside them, is the yardstick. */
    px_heal_candidate *all = calloc(n + 1, sizeof *all);
    memcpy(all, c, n * sizeof *c);
    free(c);
    c = all;
    c[n] = (px_heal_candidate){.action = PX_HEAL_ACT_NONE, .feasible = true};
    strcpy(c[n].label, "keep the plan");
    const px_heal_candidate *keep = &c[n++];
    char doc[256];
    snprintf(doc, sizeof doc,
             "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"0 s\",\"kind\":"
             "\"device-loss\",\"target\":\"%s\"}]}",
             lost);
    px_sim_faults cond;
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "cond.json", &cond, &err), &err);
    int chosen;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, &cond, &chosen, &err), &err);
    dump(c, n, chosen);
    assert_false(keep->accepted);
    assert_string_equal(keep->reject_code, "infeasible");
    assert_true(c[0].accepted);
    assert_int_equal(chosen, 0);
    /* An SLO under the repartition's p99. */
    fx.ctx.slo.tpot_s = 0.8 * c[0].tpot_p99_s;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, &cond, &chosen, &err), &err);
    dump(c, n, chosen);
    assert_false(c[0].accepted);
    assert_false(c[0].slo_ok);
    assert_true(c[0].contract_ok);
    assert_true(c[0].validated && c[0].feasible);
    assert_string_equal(c[0].reject_code, "tail-latency");
    px_assert_contains(c[0].reject_reason, "beats the current");
    px_assert_contains(c[0].reject_reason, "breaks the SLO");
    /* Judged again without the fault, keeping the plan is fine again, and
     * the generation-time reasons stay. */
    fx.ctx.slo.tpot_s = 0;
    px_assert_ok(px_heal_validate(&fx.ctx, c, n, NULL, &chosen, &err), &err);
    assert_true(keep->accepted);
    assert_int_equal(chosen, 2);
    px_sim_faults_release(&cond);
    px_heal_candidates_free(c, n);
    teardown_fx(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_loss_candidates_are_planned_validated_and_chosen),
        cmocka_unit_test(test_domain_loss_drops_every_member),
        cmocka_unit_test(test_lower_precision_is_rejected_under_a_bitwise_contract),
        cmocka_unit_test(test_faster_candidate_breaking_the_tail_is_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
