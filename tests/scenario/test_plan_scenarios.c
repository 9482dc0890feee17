/* The planner on every scenario pack (the JSON files of data/scenarios) with the
 * presets: every plan fits memory and capability, covers every block once,
 * is deterministic, and states emulated devices; malicious inventories are
 * refused before planning. */
#include "px_test.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

static const char *const presets[] = {"llama-3-8b", "qwen2.5-7b", "mixtral-8x7b", "dit-xl-2"};

static bool is_json(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && !strcmp(name + n - 5, ".json");
}

static void check_plan(const px_plan *p, const px_ir_model *m, const char *what)
{
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    const px_cost_fleet *f = px_plan_fleet(p);
    uint32_t L = px_ir_model_hparams(m)->n_layers;
    for (uint32_t r = 0; r < s.n_replicas; r++) {
        const px_cost_pipeline *pipe = px_plan_pipeline(p, r);
        int32_t next = 0;
        for (uint32_t i = 0; i < pipe->n_stages; i++) {
            if (pipe->stages[i].first != next)
                fail_msg("%s: replica %u stage %u starts at block %d, expected %d", what, r, i,
                         pipe->stages[i].first, next);
            next = pipe->stages[i].last + 1;
        }
        if (next != (int32_t)L)
            fail_msg("%s: replica %u covers %d of %u blocks", what, r, next, L);
    }
    json_t *doc = px_plan_to_json(p);
    size_t i;
    const json_t *st;
    bool any_emulated = false;
    json_array_foreach(json_object_get(doc, "stages"), i, st)
    {
        const json_t *mem = json_object_get(st, "memory_per_device");
        double total = json_number_value(json_object_get(mem, "total"));
        double limit = json_number_value(json_object_get(mem, "limit"));
        if (total > limit * 1.001)
            fail_msg("%s: stage %zu uses %g of %g bytes", what, i, total, limit);
        any_emulated |= json_is_true(json_object_get(st, "emulated"));
        /* The fields the runtime reads. */
        assert_non_null(json_object_get(st, "backend"));
        assert_non_null(json_object_get(json_object_get(st, "layers"), "first"));
        assert_non_null(json_object_get(json_object_get(st, "precision"), "kv"));
        assert_non_null(json_object_get(
            json_object_get(json_object_get(st, "predicted"), "decode_s_per_token"), "p99"));
    }
    if (any_emulated) {
        assert_true(json_is_true(json_object_get(doc, "emulated")));
        assert_non_null(json_object_get(doc, "notice"));
    }
    assert_true(s.tpot_s.p50 > 0 && isfinite(s.tpot_s.p99));
    /* Every reported figure lies inside its own interval. */
    const px_cost_interval *iv[] = {&s.tpot_s, &s.ttft_s};
    for (size_t k = 0; k < PX_ARRAY_LEN(iv); k++)
        if (!(iv[k]->lo <= iv[k]->p50 * (1 + 1e-9) && iv[k]->p50 <= iv[k]->hi * (1 + 1e-9)))
            fail_msg("%s: p50 %g outside its interval [%g, %g]", what, iv[k]->p50, iv[k]->lo,
                     iv[k]->hi);
    assert_true(s.bound_fraction > 0 && s.bound_fraction <= 1.0 + 1e-9);
    /* One link fallback per hop between stages and per tensor-parallel
     * group, when fallbacks were asked for. */
    size_t hops = 0;
    for (uint32_t r = 0; r < s.n_replicas; r++) {
        const px_cost_pipeline *pipe = px_plan_pipeline(p, r);
        for (uint32_t k = 0; k < pipe->n_stages; k++)
            hops += (k + 1 < pipe->n_stages) + (pipe->stages[k].tp > 1);
    }
    const json_t *lfb = json_object_get(doc, "link_fallbacks");
    assert_true(json_is_array(lfb));
    if (s.n_fallbacks > 0 && json_array_size(lfb) != hops)
        fail_msg("%s: %zu link fallbacks for %zu hops", what, json_array_size(lfb), hops);
    const json_t *x;
    json_array_foreach(lfb, i, x)
    {
        const char *action = json_string_value(json_object_get(x, "action"));
        const char *note = json_string_value(json_object_get(x, "note"));
        if (!action || !note || !note[0] ||
            (strcmp(action, "keep") && strcmp(action, "avoid-sender") &&
             strcmp(action, "avoid-receiver") && strcmp(action, "drop-replica")))
            fail_msg("%s: link fallback %zu lacks an action or a note", what, i);
    }
    json_decref(doc);
    (void)f;
}

static void test_plan_scenarios_every_pack_and_preset(void **state)
{
    (void)state;
    char *dir = px_test_source_path("data/scenarios");
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t planned = 0, refused = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_json(e->d_name))
            continue;
        char *path = px_asprintf("%s/%s", dir, e->d_name);
        px_hw_graph *g;
        px_diags diags;
        px_diags_init(&diags);
        px_err err;
        if (px_hw_graph_load(path, NULL, &g, &diags, &err) != PX_OK) {
            /* A pack that lies about itself must be refused with reasons. */
            assert_true(diags.n_errors > 0);
            refused++;
            px_diags_release(&diags);
            free(path);
            continue;
        }
        px_diags_release(&diags);
        for (size_t k = 0; k < PX_ARRAY_LEN(presets); k++) {
            px_ir_model *m;
            px_assert_ok(px_ir_preset_new(presets[k], PX_DTYPE_COUNT_, NULL, &m, &err), &err);
            for (int obj = 0; obj < 2; obj++) {
                px_plan_request req;
                px_plan_request_default(&req);
                req.graph = g;
                req.model = m;
                req.objective = obj ? PX_PLAN_OBJ_THROUGHPUT : PX_PLAN_OBJ_LATENCY;
                req.fallbacks = obj == 0;
                px_plan *p = NULL;
                char what[512];
                snprintf(what, sizeof what, "%.256s / %s / %s", e->d_name, presets[k],
                         px_plan_objective_name(req.objective));
                px_status st = px_plan_search(&req, &p, &err);
                if (st == PX_EINFEASIBLE) {
                    /* Too small a fleet: the refusal says why. */
                    assert_true(strlen(err.msg) > 20);
                    continue;
                }
                if (st != PX_OK)
                    fail_msg("%s: %s", what, err.msg);
                check_plan(p, m, what);
                planned++;
                if (obj == 0 && k == 0) {
                    px_plan *q = NULL;
                    px_assert_ok(px_plan_search(&req, &q, &err), &err);
                    char *a = px_plan_dump(p), *b = px_plan_dump(q);
                    if (strcmp(a, b))
                        fail_msg("%s: two runs gave different plans", what);
                    free(a);
                    free(b);
                    px_plan_free(q);
                }
                px_plan_free(p);
            }
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
        free(path);
    }
    closedir(d);
    free(dir);
    assert_true(planned >= 10);
    (void)refused;
}

static void test_plan_scenarios_refuse_malicious_inventories(void **state)
{
    (void)state;
    char *dir = px_test_source_path("data/scenarios/malicious");
    DIR *d = opendir(dir);
    if (!d) {
        free(dir);
        skip();
    }
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_json(e->d_name))
            continue;
        char *path = px_asprintf("%s/%s", dir, e->d_name);
        px_hw_graph *g = NULL;
        px_diags diags;
        px_diags_init(&diags);
        px_err err;
        px_status st = px_hw_graph_load(path, NULL, &g, &diags, &err);
        if (st == PX_OK)
            fail_msg("%s was accepted", e->d_name);
        assert_null(g);
        assert_true(strlen(err.msg) > 0);
        px_diags_release(&diags);
        free(path);
        n++;
    }
    closedir(d);
    free(dir);
    assert_true(n >= 3);
}

static void test_plan_scenarios_emulated_pack_says_so(void **state)
{
    (void)state;
    char *model_path = px_test_require_shared_model("stories260K.gguf");
    char *path = px_test_source_path("data/scenarios/emu-small.json");
    px_hw_graph *g;
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, NULL, &err), &err);
    px_ir_model *m;
    px_assert_ok(px_ir_model_open(model_path, NULL, &m, &err), &err);
    {
        /* Exclude the host CPU so the plan must use the emulated devices. */
        px_plan_request req;
        px_plan_request_default(&req);
        req.graph = g;
        req.model = m;
        const px_hw_view *v = px_hw_graph_view(g);
        bool *excluded = calloc(v->n_devices, sizeof *excluded);
        for (size_t i = 0; i < v->n_devices; i++)
            excluded[i] = v->devices[i].cls == PX_HW_CLASS_CPU;
        req.excluded = excluded;
        px_plan *p = NULL;
        px_assert_ok(px_plan_search(&req, &p, &err), &err);
        px_plan_summary s;
        px_plan_get_summary(p, &s);
        assert_true(s.emulated);
        px_strbuf sb = PX_STRBUF_INIT;
        px_assert_ok(px_plan_report(p, &sb), NULL);
        px_assert_contains(sb.buf, "EMULATED");
        px_strbuf_release(&sb);
        px_plan_free(p);
        free(excluded);
        px_ir_model_free(m);
    }
    free(model_path);
    px_hw_graph_free(g);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_scenarios_every_pack_and_preset),
        cmocka_unit_test(test_plan_scenarios_refuse_malicious_inventories),
        cmocka_unit_test(test_plan_scenarios_emulated_pack_says_so),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
