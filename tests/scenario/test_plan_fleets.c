/* The planner on heterogeneous fleets of data/scenarios that mix device
 * types, links and vendors: pipelines that mix tensor-parallel groups with
 * single devices, groups over PCIe, host memory counted per node, backends
 * named per vendor, and plexus never behind a baseline under its own cost
 * model. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

static px_hw_graph *load_fleet(const char *name)
{
    char *rel = px_asprintf("data/scenarios/%s.json", name);
    char *path = px_test_source_path(rel);
    px_hw_graph *g = NULL;
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, NULL, &err), &err);
    free(path);
    free(rel);
    return g;
}

static px_plan *plan_on(px_hw_graph *g, px_ir_model *m, px_plan_objective obj, bool baselines)
{
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.objective = obj;
    req.fallbacks = false;
    req.compare_baselines = baselines;
    px_plan *p = NULL;
    px_err err;
    px_assert_ok(px_plan_search(&req, &p, &err), &err);
    return p;
}

static px_ir_model *preset(const char *name)
{
    px_ir_model *m = NULL;
    px_err err;
    px_assert_ok(px_ir_preset_new(name, PX_DTYPE_COUNT_, NULL, &m, &err), &err);
    return m;
}

/* Llama-3-70B on two H100 (NVLink) and eight L4: a group of L4s takes the
 * first blocks, the H100 pair the rest, all weights in device memory.  A
 * search that keeps a pipeline all-groups or all-singles puts the whole
 * model on the H100 pair with its KV cache in host memory (51.6 ms). */
static void test_plan_fleets_mixes_groups_and_classes_in_one_pipeline(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("h100x2-l4x8");
    px_ir_model *m = preset("llama-3-70b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_LATENCY, false);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    const px_cost_fleet *f = px_plan_fleet(p);
    assert_true(pipe->n_stages >= 2);
    bool h100_group = false, l4 = false;
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage *st = &pipe->stages[i];
        const char *id = f->devices[st->devices[0]].id;
        if (!strncmp(id, "h.", 2) && st->tp == 2)
            h100_group = true;
        if (!strncmp(id, "l.", 2))
            l4 = true;
        assert_int_equal(st->kv, PX_COST_KV_DEVICE);
    }
    assert_true(h100_group && l4);
    if (!(s.tpot_s.p50 < 0.035))
        fail_msg("70B on 2xH100+8xL4: %.4g s per token, expected under 35 ms", s.tpot_s.p50);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* Llama-3-8B on two RTX 4090 joined only through the host's PCIe: the pair
 * as one tensor-parallel stage beats a two-stage pipeline (about 20 ms). */
static void test_plan_fleets_groups_over_pcie(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("home-lab-2x4090");
    px_ir_model *m = preset("llama-3-8b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_LATENCY, false);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    assert_int_equal(pipe->n_stages, 1);
    assert_int_equal(pipe->stages[0].tp, 2);
    if (!(s.tpot_s.p50 < 0.012))
        fail_msg("8B on 2x4090 over PCIe: %.4g s per token, expected under 12 ms", s.tpot_s.p50);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* Llama-3-8B for throughput on eight V100 and an H200: no replica keeps
 * its KV cache in host memory (1.3 s per token), replicas run at batches
 * of their own (the V100 pair left over at a smaller batch than the
 * pipeline with the H200), and with every request's prefill counted (a
 * 512-token prompt per 256 new tokens, at the f32 rates the implied
 * contract costs) the plan reaches most of the fleet's throughput bound
 * and more than twice the best baseline. */
static void test_plan_fleets_no_host_kv_for_throughput(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("v100x8-h200");
    px_ir_model *m = preset("llama-3-8b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_THROUGHPUT, true);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    bool other_batch = false;
    for (uint32_t r = 0; r < s.n_replicas; r++) {
        const px_cost_pipeline *pipe = px_plan_pipeline(p, r);
        for (uint32_t i = 0; i < pipe->n_stages; i++)
            assert_int_equal(pipe->stages[i].kv, PX_COST_KV_DEVICE);
        other_batch |= px_plan_replica_workload(p, r)->batch != s.batch;
    }
    assert_true(s.n_replicas >= 2);
    assert_true(other_batch);
    json_t *doc = px_plan_to_json(p);
    double bound = json_number_value(
        json_object_get(json_object_get(doc, "lower_bound"), "throughput_tokens_per_s"));
    double best_base = 0;
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(doc, "baselines"), i, b)
    {
        best_base = fmax(best_base, json_number_value(json_object_get(b, "throughput")));
    }
    /* The plan says what the prefill costs the decode steps. */
    bool said = false;
    json_array_foreach(json_object_get(doc, "explanation"), i, b)
    {
        said |= strstr(json_string_value(b), "prefilled inside decode steps") != NULL;
    }
    assert_true(said);
    double decode_only = json_number_value(
        json_object_get(json_object_get(doc, "predictions"), "decode_only_tpot_s"));
    assert_true(decode_only > 0 && decode_only < s.tpot_s.p50);
    json_decref(doc);
    if (!(s.throughput_point > 0.6 * bound && s.throughput_point > 2 * best_base))
        fail_msg("8B on 8xV100+H200: %.4g tokens/s; bound %.4g, best baseline %.4g",
                 s.throughput_point, bound, best_base);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* An Apple M2 Ultra has no CUDA: its stages say metal, and no stage on it
 * is costed with a CUDA backend. */
static void test_plan_fleets_names_backends_per_vendor(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("m2ultra-2x4090-10gbe");
    px_ir_model *m = preset("llama-3-70b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_LATENCY, false);
    const px_cost_fleet *f = px_plan_fleet(p);
    bool mac = false;
    for (size_t i = 0; i < f->n_devices; i++) {
        if (!strncmp(f->devices[i].id, "mac.", 4)) {
            assert_string_equal(f->devices[i].backend, "metal");
            mac = true;
        } else {
            assert_string_equal(f->devices[i].backend, "cuda");
        }
    }
    assert_true(mac);
    json_t *doc = px_plan_to_json(p);
    size_t i;
    const json_t *st;
    json_array_foreach(json_object_get(doc, "stages"), i, st)
    {
        const char *dev = json_string_value(json_array_get(json_object_get(st, "devices"), 0));
        const char *be = json_string_value(json_object_get(st, "backend"));
        assert_non_null(dev);
        assert_non_null(be);
        if (!strncmp(dev, "mac.", 4))
            assert_string_equal(be, "metal");
    }
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* Without a contract the products stay at f32 rates on tensor-core GPUs,
 * and the plan says why and what would allow the bf16 rate; with a
 * contract that allows it, the stages compute in bf16. */
static void test_plan_fleets_says_which_rate_products_are_costed_at(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("a100-l4-100gbe");
    px_ir_model *m = preset("llama-3-8b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_THROUGHPUT, false);
    json_t *doc = px_plan_to_json(p);
    char *text = json_dumps(json_object_get(doc, "explanation"), 0);
    assert_non_null(text);
    px_assert_contains(text, "costed at f32 rates");
    px_assert_contains(text, "--contract relaxed");
    free(text);
    json_decref(doc);
    px_plan_free(p);

    px_contract *c = NULL;
    px_err err;
    px_assert_ok(px_contract_builtin("relaxed", &c, &err), &err);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.objective = PX_PLAN_OBJ_THROUGHPUT;
    req.fallbacks = false;
    req.contract = c;
    px_assert_ok(px_plan_search(&req, &p, &err), &err);
    doc = px_plan_to_json(p);
    size_t i;
    const json_t *st;
    json_array_foreach(json_object_get(doc, "stages"), i, st)
    {
        const char *cd = json_string_value(json_object_get(st, "compute_dtype"));
        assert_non_null(cd);
        assert_true(strcmp(cd, "f32") != 0);
    }
    json_decref(doc);
    px_plan_free(p);
    px_contract_free(c);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* The exhaustive yardstick (every ordered sequence of disjoint groups, a
 * group one device or a tensor-parallel group of any devices, each with its
 * best cut) finds no layout faster than the search on small fleets. */
static void test_plan_fleets_no_layout_beats_the_search(void **state)
{
    (void)state;
    static const struct {
        const char *fleet;
        uint32_t max_devices;
    } cases[] = {{"home-lab-2x4090", 2},        {"m2ultra-2x4090-10gbe", 3},
                 {"hetero-pair-h100-l4", 2},    {"irregular-4dev", 4},
                 {"a100-l4-100gbe", 3},         {"h100x2-l4x8", 4},
                 {"mi300x2-h100x2-100gbe", 4},  {"gaudi3-h200-epyc-400gbe", 3},
                 {"3090x4-pcie3-l4x2-10gbe", 3}};
    static const char *const names[] = {"llama-3-8b", "llama-3-70b"};
    size_t checked = 0;
    for (size_t c = 0; c < PX_ARRAY_LEN(cases); c++) {
        px_hw_graph *g = load_fleet(cases[c].fleet);
        const px_hw_view *v = px_hw_graph_view(g);
        if (v->n_devices > 8) {
            px_hw_graph_free(g);
            continue;
        }
        for (size_t k = 0; k < PX_ARRAY_LEN(names); k++) {
            px_ir_model *m = preset(names[k]);
            px_plan_request req;
            px_plan_request_default(&req);
            req.graph = g;
            req.model = m;
            req.fallbacks = false;
            px_plan *p = NULL;
            px_err err;
            double exact = 0;
            if (px_plan_search(&req, &p, &err) != PX_OK ||
                px_plan_exact(&req, cases[c].max_devices, &exact, &err) != PX_OK) {
                px_plan_free(p);
                px_ir_model_free(m);
                continue;
            }
            px_plan_summary s;
            px_plan_get_summary(p, &s);
            if (s.tpot_point_s > exact * 1.001)
                fail_msg("%s / %s: the search gives %.4g s per token, a layout of the yardstick "
                         "%.4g s",
                         cases[c].fleet, names[k], s.tpot_point_s, exact);
            checked++;
            px_plan_free(p);
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
    }
    assert_true(checked >= 6);
}

/* Baselines are judged by their own rules: GPUStack's split of Llama-3-70B
 * over eight L4 and two H100 fits the memory itself (its own estimate
 * placed it), though not under plexus's headroom. */
static void test_plan_fleets_judges_baselines_by_their_own_rules(void **state)
{
    (void)state;
    px_hw_graph *g = load_fleet("h100x2-l4x8");
    px_ir_model *m = preset("llama-3-70b");
    px_plan *p = plan_on(g, m, PX_PLAN_OBJ_LATENCY, true);
    json_t *doc = px_plan_to_json(p);
    size_t i;
    const json_t *b;
    bool seen = false;
    json_array_foreach(json_object_get(doc, "baselines"), i, b)
    {
        if (strcmp(json_string_value(json_object_get(b, "policy")), "gpustack"))
            continue;
        seen = true;
        assert_true(json_is_true(json_object_get(b, "feasible")));
        assert_true(json_number_value(json_object_get(b, "plexus_speedup_tpot")) >= 1.0);
    }
    assert_true(seen);
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static const char *const fleets[] = {
    "home-lab-2x4090",       "a100-l4-100gbe",          "h100x2-l4x8",
    "m2ultra-2x4090-10gbe",  "sixteen-4-types",         "v100x8-h200",
    "mi300x2-h100x2-100gbe", "3090x4-pcie3-l4x2-10gbe", "gaudi3-h200-epyc-400gbe"};
static const char *const models[] = {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mixtral-8x7b"};

/* On every new fleet, model and objective, plexus is at least as good as
 * each feasible baseline on the objective's own metric, under the same
 * cost model and workload. */
static void test_plan_fleets_never_behind_a_baseline(void **state)
{
    (void)state;
    size_t compared = 0;
    for (size_t fi = 0; fi < PX_ARRAY_LEN(fleets); fi++) {
        px_hw_graph *g = load_fleet(fleets[fi]);
        for (size_t mi = 0; mi < PX_ARRAY_LEN(models); mi++) {
            px_ir_model *m = preset(models[mi]);
            for (int obj = 0; obj < 2; obj++) {
                px_plan_request req;
                px_plan_request_default(&req);
                req.graph = g;
                req.model = m;
                req.objective = obj ? PX_PLAN_OBJ_THROUGHPUT : PX_PLAN_OBJ_LATENCY;
                req.fallbacks = false;
                req.compare_baselines = true;
                px_plan *p = NULL;
                px_err err;
                px_status st = px_plan_search(&req, &p, &err);
                if (st == PX_EINFEASIBLE)
                    continue;
                if (st != PX_OK)
                    fail_msg("%s / %s: %s", fleets[fi], models[mi], err.msg);
                json_t *doc = px_plan_to_json(p);
                size_t i;
                const json_t *b;
                json_array_foreach(json_object_get(doc, "baselines"), i, b)
                {
                    if (!json_is_true(json_object_get(b, "feasible")))
                        continue;
                    const char *key = obj ? "plexus_speedup_throughput" : "plexus_speedup_tpot";
                    double x = json_number_value(json_object_get(b, key));
                    if (!(x >= 0.999))
                        fail_msg("%s / %s / %s: behind %s (%s %.4g)", fleets[fi], models[mi],
                                 obj ? "throughput" : "latency",
                                 json_string_value(json_object_get(b, "policy")), key, x);
                    compared++;
                }
                json_decref(doc);
                px_plan_free(p);
            }
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
    }
    assert_true(compared >= 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_fleets_mixes_groups_and_classes_in_one_pipeline),
        cmocka_unit_test(test_plan_fleets_groups_over_pcie),
        cmocka_unit_test(test_plan_fleets_no_host_kv_for_throughput),
        cmocka_unit_test(test_plan_fleets_names_backends_per_vendor),
        cmocka_unit_test(test_plan_fleets_says_which_rate_products_are_costed_at),
        cmocka_unit_test(test_plan_fleets_no_layout_beats_the_search),
        cmocka_unit_test(test_plan_fleets_judges_baselines_by_their_own_rules),
        cmocka_unit_test(test_plan_fleets_never_behind_a_baseline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
