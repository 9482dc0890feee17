/* The planner: feasibility, objectives, explanations, contracts, baselines,
 * determinism and the exact yardsticks, on small hand-written fleets. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan_impl.h"
#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

/* A GPU: id, model, capacity, bandwidth, bf16 rate, price. */
static char *gpu(const char *id, const char *model, const char *cap, const char *bw,
                 const char *bf16, const char *price)
{
    char *s = px_asprintf(
        "{\"id\":\"%s\",\"class\":\"gpu\",\"model\":\"%s\",\"backend\":\"cuda\","
        "\"compute\":{\"bf16\":\"%s\",\"f16\":\"%s\",\"f32\":\"30 TFLOP/s\"},"
        "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"%s\",\"bandwidth\":\"%s\"}],"
        "\"power\":{\"tdp\":\"300 W\",\"idle\":\"40 W\"},\"cost\":\"%s\"}",
        id, model, bf16, bf16, cap, bw, price);
    assert_non_null(s);
    return s;
}

static px_hw_graph *load(const char *text)
{
    px_hw_graph *g = NULL;
    px_diags d;
    px_diags_init(&d);
    px_err err;
    if (px_hw_graph_from_json(text, strlen(text), "test.json", NULL, &g, &d, &err) != PX_OK) {
        char *r = px_diags_format(&d, "test.json");
        fail_msg("inventory refused: %s\n%s", err.msg, r ? r : "");
    }
    px_diags_release(&d);
    return g;
}

/* Two nodes joined by `net`: n1 holds devs1 (JSON list body), n2 devs2. */
static px_hw_graph *two_nodes(const char *devs1, const char *devs2, const char *links)
{
    char *doc = px_asprintf("{\"schema\":\"plexus.inventory/1\",\"name\":\"t\",\"nodes\":["
                            "{\"id\":\"n1\",\"devices\":[%s]},{\"id\":\"n2\",\"devices\":[%s]}],"
                            "\"links\":[%s]}",
                            devs1, devs2, links);
    px_hw_graph *g = load(doc);
    free(doc);
    return g;
}

/* An expensive fast GPU and a cheap slow one, each in its own node. */
static px_hw_graph *pricing_fleet(void)
{
    char *a = gpu("gpu0", "fast", "80 GiB", "3.35 TB/s", "989 TFLOP/s", "10 $/h");
    char *b = gpu("gpu0", "cheap", "24 GiB", "300 GB/s", "121 TFLOP/s", "0.5 $/h");
    px_hw_graph *g =
        two_nodes(a, b,
                  "{\"id\":\"net\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":\"ethernet\","
                  "\"bandwidth\":\"100 Gbit/s\",\"latency\":\"10 us\"}");
    free(a);
    free(b);
    return g;
}

/* Two mid GPUs on n1 (PCIe), the fastest GPU alone on n2 behind a very
 * slow network link. */
static px_hw_graph *slow_link_fleet(void)
{
    char *m0 = gpu("gpu0", "mid", "24 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *m1 = gpu("gpu1", "mid", "24 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *f0 = gpu("gpu0", "fast", "24 GiB", "3 TB/s", "600 TFLOP/s", "1 $/h");
    char *local = px_asprintf("%s,%s", m0, m1);
    px_hw_graph *g = two_nodes(
        local, f0,
        "{\"id\":\"p0\",\"from\":\"n1.gpu0\",\"to\":\"n1\",\"kind\":\"pcie4\",\"bandwidth\":\"32 "
        "GB/s\",\"latency\":\"2 us\"},"
        "{\"id\":\"p1\",\"from\":\"n1.gpu1\",\"to\":\"n1\",\"kind\":\"pcie4\",\"bandwidth\":\"32 "
        "GB/s\",\"latency\":\"2 us\"},"
        "{\"id\":\"p2\",\"from\":\"n2.gpu0\",\"to\":\"n2\",\"kind\":\"pcie4\",\"bandwidth\":\"32 "
        "GB/s\",\"latency\":\"2 us\"},"
        "{\"id\":\"net\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":\"ethernet\",\"bandwidth\":\"10 "
        "Mbit/s\",\"latency\":\"20 ms\"}");
    free(m0);
    free(m1);
    free(f0);
    free(local);
    return g;
}

static px_ir_model *preset(const char *name, px_dtype dt)
{
    px_ir_model *m;
    px_err err;
    px_assert_ok(px_ir_preset_new(name, dt, NULL, &m, &err), &err);
    return m;
}

static px_plan *plan_ok(px_plan_request *req)
{
    px_plan *p = NULL;
    px_err err;
    px_assert_ok(px_plan_search(req, &p, &err), &err);
    return p;
}

static json_t *doc_of(const px_plan *p)
{
    json_t *d = px_plan_to_json(p);
    assert_non_null(d);
    return d;
}

static const char *stage_device(const json_t *doc, size_t stage, size_t k)
{
    const json_t *st = json_array_get(json_object_get(doc, "stages"), stage);
    return json_string_value(json_array_get(json_object_get(st, "devices"), k));
}

static char *joined_explanation(const json_t *doc)
{
    px_strbuf sb = PX_STRBUF_INIT;
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(doc, "explanation"), i, e)
    {
        px_strbuf_adds(&sb, json_string_value(e));
        px_strbuf_addch(&sb, '\n');
    }
    return px_strbuf_detach(&sb, NULL);
}

/* Every stage fits its devices' memory and the layers are covered once. */
static void check_plan_invariants(const px_plan *p, const px_ir_model *m)
{
    const px_cost_fleet *f = px_plan_fleet(p);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    for (uint32_t r = 0; r < s.n_replicas; r++) {
        const px_cost_pipeline *pipe = px_plan_pipeline(p, r);
        assert_non_null(pipe);
        int32_t next = 0;
        for (uint32_t i = 0; i < pipe->n_stages; i++) {
            assert_int_equal(pipe->stages[i].first, next);
            next = pipe->stages[i].last + 1;
            for (uint32_t k = 0; k < pipe->stages[i].tp; k++) {
                const px_cost_device *d = &f->devices[pipe->stages[i].devices[k]];
                bool compute = false;
                for (int t = 0; t < PX_HW_DTYPE_COUNT; t++)
                    compute |= d->peak[t] > 0;
                assert_true(compute);
            }
        }
        assert_int_equal(next, (int32_t)px_ir_model_hparams(m)->n_layers);
    }
    json_t *doc = doc_of(p);
    size_t i;
    const json_t *st;
    json_array_foreach(json_object_get(doc, "stages"), i, st)
    {
        const json_t *mem = json_object_get(st, "memory_per_device");
        double total = json_number_value(json_object_get(mem, "total"));
        double limit = json_number_value(json_object_get(mem, "limit"));
        if (total > limit * 1.001)
            fail_msg("stage %zu uses %g B of a %g B limit", i, total, limit);
    }
    json_decref(doc);
}

static void test_plan_fits_memory_and_capabilities(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    check_plan_invariants(p, m);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_true(s.n_devices >= 2); /* 30 GiB of f32 weights need two devices */
    assert_true(s.tpot_s.lo <= s.tpot_s.p50 && s.tpot_s.p50 <= s.tpot_s.p99);
    assert_true(s.bound_fraction > 0 && s.bound_fraction <= 1.0);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_latency_and_tokens_per_dollar_differ_and_say_why(void **state)
{
    (void)state;
    px_hw_graph *g = pricing_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.workload.batch = 1;
    px_plan *lat = plan_ok(&req);
    req.objective = PX_PLAN_OBJ_TOKENS_PER_DOLLAR;
    px_plan *tpd = plan_ok(&req);
    json_t *a = doc_of(lat), *b = doc_of(tpd);
    assert_string_equal(stage_device(a, 0, 0), "n1.gpu0");
    assert_string_equal(stage_device(b, 0, 0), "n2.gpu0");
    assert_string_not_equal(px_plan_id(lat), px_plan_id(tpd));
    char *why_a = joined_explanation(a), *why_b = joined_explanation(b);
    /* Each names its own objective and the terms that decided. */
    px_assert_contains(why_a, "objective latency");
    px_assert_contains(why_a, "chosen over");
    px_assert_contains(why_b, "objective tokens_per_dollar");
    px_assert_contains(why_b, "$/h for");
    px_assert_contains(why_b, "it is faster per token");
    free(why_a);
    free(why_b);
    json_decref(a);
    json_decref(b);
    px_plan_free(lat);
    px_plan_free(tpd);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_avoids_fastest_device_behind_slow_link_and_says_so(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    size_t i;
    const json_t *st;
    json_array_foreach(json_object_get(doc, "stages"), i, st) assert_string_not_equal(
        json_string_value(json_array_get(json_object_get(st, "devices"), 0)), "n2.gpu0");
    char *why = joined_explanation(doc);
    px_assert_contains(why, "the fastest device n2.gpu0 is not used");
    px_assert_contains(why, "ethernet hop");
    free(why);
    /* The alternative with it is on record as dominated, with the cause. */
    bool found = false;
    const json_t *x;
    json_array_foreach(json_object_get(doc, "rejected"), i, x)
    {
        const char *devs = json_string_value(json_object_get(x, "devices"));
        const char *cause = json_string_value(json_object_get(x, "cause"));
        if (devs && strstr(devs, "n2.gpu0") && cause && strstr(cause, "ethernet") &&
            !strcmp(json_string_value(json_object_get(x, "reason")), "dominated"))
            found = true;
    }
    assert_true(found);
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_refuses_model_that_fits_in_total_but_no_cut(void **state)
{
    (void)state;
    px_strbuf devs = PX_STRBUF_INIT;
    for (int i = 0; i < 16; i++) {
        char id[16];
        snprintf(id, sizeof id, "gpu%d", i);
        char *d = gpu(id, "tiny", "1.2 GiB", "100 GB/s", "10 TFLOP/s", "0.1 $/h");
        px_strbuf_addf(&devs, "%s%s", i ? "," : "", d);
        free(d);
    }
    char *doc = px_asprintf("{\"schema\":\"plexus.inventory/1\",\"nodes\":[{\"id\":\"n1\","
                            "\"devices\":[%s]}]}",
                            devs.buf);
    px_hw_graph *g = load(doc);
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = NULL;
    px_err err;
    assert_int_equal(px_plan_search(&req, &p, &err), PX_EINFEASIBLE);
    assert_null(p);
    px_assert_contains(err.msg, "fits in the fleet's total free memory");
    px_assert_contains(err.msg, "no feasible cut");
    px_ir_model_free(m);
    px_hw_graph_free(g);
    free(doc);
    px_strbuf_release(&devs);
}

static px_contract *contract_of(const char *text)
{
    px_contract *c;
    px_err err;
    px_diags d;
    px_diags_init(&d);
    px_assert_ok(px_contract_parse(text, strlen(text), "c.json", &d, &c, &err), &err);
    px_diags_release(&d);
    return c;
}

static void test_plan_rejects_fp8_under_bitwise_contract(void **state)
{
    (void)state;
    px_hw_graph *g = pricing_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_builtin("strict", &c, &err), &err);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.contract = c;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    const json_t *prec = json_object_get(doc, "precision");
    assert_string_equal(json_string_value(json_object_get(prec, "weights")), "bf16");
    assert_string_equal(json_string_value(json_object_get(prec, "ffn_weights")), "bf16");
    assert_string_equal(json_string_value(json_object_get(prec, "activations")), "f32");
    bool fp8_refused = false;
    size_t i;
    const json_t *x;
    json_array_foreach(json_object_get(doc, "rejected"), i, x)
    {
        const char *msg = json_string_value(json_object_get(x, "message"));
        if (!strcmp(json_string_value(json_object_get(x, "reason")), "contract") && msg &&
            strstr(msg, "fp8") && strstr(msg, "bitwise"))
            fp8_refused = true;
    }
    assert_true(fp8_refused);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(doc, "contract"), "verdict")), "allowed");
    json_decref(doc);
    px_plan_free(p);
    px_contract_free(c);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_bounded_relaxation_lowers_only_allowed_regions(void **state)
{
    (void)state;
    px_hw_graph *g = pricing_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_contract *c =
        contract_of("{\"schema\":\"plexus.contract/1\",\"name\":\"ffn-only\","
                    "\"default\":{\"bitwise\":true},"
                    "\"regions\":{\"layer.*.ffn\":{\"divergence\":{\"kl_max\":0.05}}}}");
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.contract = c;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    const json_t *st0 = json_array_get(json_object_get(doc, "stages"), 0);
    const json_t *prec = json_object_get(st0, "precision");
    assert_string_equal(json_string_value(json_object_get(prec, "ffn_weights")), "fp8_e4m3");
    assert_string_equal(json_string_value(json_object_get(prec, "weights")), "bf16");
    assert_string_equal(json_string_value(json_object_get(prec, "activations")), "f32");
    /* The KV cache keeps its stored dtype (the preset's bf16). */
    assert_string_equal(json_string_value(json_object_get(prec, "kv")), "bf16");
    const json_t *cj = json_object_get(doc, "contract");
    assert_string_equal(json_string_value(json_object_get(cj, "verdict")),
                        "allowed-after-validation");
    char *text = px_json_dump_canonical(cj);
    px_assert_contains(text, "obligations");
    px_assert_contains(text, "layer.*.ffn");
    free(text);
    json_decref(doc);
    px_plan_free(p);
    px_contract_free(c);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_is_byte_identical_across_runs(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.compare_baselines = true;
    px_plan *a = plan_ok(&req), *b = plan_ok(&req);
    char *ta = px_plan_dump(a), *tb = px_plan_dump(b);
    assert_string_equal(ta, tb);
    assert_string_equal(px_plan_id(a), px_plan_id(b));
    assert_int_equal(strlen(px_plan_id(a)), 64);
    px_assert_contains(ta, "\"schema\": \"plexus.plan/1\"");
    /* No absolute paths and no clock in the hashed content. */
    assert_null(strstr(ta, "/work/"));
    assert_null(strstr(ta, "/tmp/"));
    /* The id is the hash of the document without it. */
    json_t *doc = doc_of(a);
    json_object_del(doc, "id");
    char *rest = px__plan_dump_json(doc);
    px_digest d;
    char hex[65];
    px_sha256(rest, strlen(rest), &d);
    px_digest_hex(&d, hex);
    assert_string_equal(hex, px_plan_id(a));
    free(rest);
    json_decref(doc);
    free(ta);
    free(tb);
    px_plan_free(a);
    px_plan_free(b);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_rejected_candidates_carry_reasons(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    const json_t *rej = json_object_get(doc, "rejected");
    assert_true(json_array_size(rej) >= 2);
    static const char *known[] = {"memory", "contract", "capability", "no-path",
                                  "slo",    "budget",   "dominated"};
    size_t i;
    const json_t *x;
    bool memory = false;
    json_array_foreach(rej, i, x)
    {
        const char *reason = json_string_value(json_object_get(x, "reason"));
        bool ok = false;
        for (size_t k = 0; k < PX_ARRAY_LEN(known); k++)
            ok |= reason && !strcmp(reason, known[k]);
        assert_true(ok);
        assert_true(strlen(json_string_value(json_object_get(x, "message"))) > 0);
        if (!strcmp(reason, "dominated")) {
            assert_true(json_number_value(json_object_get(x, "margin")) >= 0);
            assert_non_null(json_object_get(x, "cause"));
        }
        memory |= !strcmp(reason, "memory");
    }
    assert_true(memory); /* single 24 GiB devices cannot hold 30 GiB */
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_fallbacks_cover_each_device(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    const json_t *fb = json_object_get(doc, "fallbacks");
    assert_int_equal(json_array_size(fb), s.n_devices);
    size_t i;
    const json_t *x;
    json_array_foreach(fb, i, x)
    {
        assert_non_null(json_string_value(json_object_get(x, "lost")));
        if (json_is_true(json_object_get(x, "feasible"))) {
            const char *devs = json_string_value(json_object_get(x, "devices"));
            const char *lost = json_string_value(json_object_get(x, "lost"));
            if (devs)
                assert_null(strstr(devs, lost));
            assert_true(json_number_value(json_object_get(x, "tpot_s")) > 0);
        }
    }
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_never_ranks_below_a_baseline(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.compare_baselines = true;
    px_plan *p = plan_ok(&req);
    json_t *doc = doc_of(p);
    const json_t *bl = json_object_get(doc, "baselines");
    assert_int_equal(json_array_size(bl), 4);
    size_t i;
    const json_t *x;
    json_array_foreach(bl, i, x)
    {
        if (!json_is_true(json_object_get(x, "feasible")) ||
            !json_is_true(json_object_get(x, "contract_ok")))
            continue;
        double speedup = json_number_value(json_object_get(x, "plexus_speedup_tpot"));
        if (speedup < 0.999)
            fail_msg("baseline %s beats plexus on latency (%g)",
                     json_string_value(json_object_get(x, "policy")), speedup);
    }
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static px_plan *baseline_plan(px_hw_graph *g, px_ir_model *m, const char *policy)
{
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.policy = policy;
    req.fallbacks = false;
    return plan_ok(&req);
}

static void test_plan_llamacpp_splits_by_free_memory_with_host_embedding(void **state)
{
    (void)state;
    char *a = gpu("gpu0", "big", "48 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *b = gpu("gpu1", "small", "16 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *doc = px_asprintf(
        "{\"schema\":\"plexus.inventory/1\",\"nodes\":[{\"id\":\"n1\",\"memory\":[{\"id\":"
        "\"ddr\",\"kind\":\"ddr\",\"capacity\":\"128 GiB\",\"bandwidth\":\"100 GB/s\"}],"
        "\"devices\":[{\"id\":\"cpu0\",\"class\":\"cpu\",\"model\":\"host\",\"backend\":\"cpu\","
        "\"compute\":{\"f32\":\"1 TFLOP/s\"}},%s,%s]}]}",
        a, b);
    px_hw_graph *g = load(doc);
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan *p = baseline_plan(g, m, "llamacpp");
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    const px_cost_fleet *f = px_plan_fleet(p);
    assert_int_equal(pipe->n_stages, 3);
    /* The host keeps the input embedding and no block. */
    assert_string_equal(f->devices[pipe->stages[0].devices[0]].id, "n1.cpu0");
    assert_true(pipe->stages[0].embedding);
    assert_int_equal(pipe->stages[0].last, pipe->stages[0].first - 1);
    /* Shares 0.75 / 1.0: block il goes to gpu0 while il / 33 < 0.75. */
    assert_int_equal(pipe->stages[1].first, 0);
    assert_int_equal(pipe->stages[1].last, 24);
    assert_int_equal(pipe->stages[2].first, 25);
    assert_int_equal(pipe->stages[2].last, 31);
    assert_true(pipe->stages[2].head);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    free(doc);
    free(a);
    free(b);
}

static void test_plan_exo_takes_the_smallest_ring_by_memory(void **state)
{
    (void)state;
    char *a = gpu("gpu0", "a", "24 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *b = gpu("gpu0", "b", "20 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *c = gpu("gpu0", "c", "16 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *doc = px_asprintf("{\"schema\":\"plexus.inventory/1\",\"nodes\":["
                            "{\"id\":\"n1\",\"devices\":[%s]},{\"id\":\"n2\",\"devices\":[%s]},"
                            "{\"id\":\"n3\",\"devices\":[%s]}],"
                            "\"links\":[{\"id\":\"l12\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":"
                            "\"ethernet\",\"bandwidth\":\"100 Gbit/s\",\"latency\":\"10 us\"},"
                            "{\"id\":\"l23\",\"from\":\"n2\",\"to\":\"n3\",\"kind\":\"ethernet\","
                            "\"bandwidth\":\"100 Gbit/s\",\"latency\":\"10 us\"}]}",
                            a, b, c);
    px_hw_graph *g = load(doc);
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan *p = baseline_plan(g, m, "exo");
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    const px_cost_fleet *f = px_plan_fleet(p);
    /* 30 GiB: the two largest nodes; 24:20 by largest remainder is 17:15. */
    assert_int_equal(pipe->n_stages, 2);
    assert_string_equal(f->devices[pipe->stages[0].devices[0]].id, "n1.gpu0");
    assert_string_equal(f->devices[pipe->stages[1].devices[0]].id, "n2.gpu0");
    assert_int_equal(pipe->stages[0].last - pipe->stages[0].first + 1, 17);
    assert_int_equal(pipe->stages[1].last - pipe->stages[1].first + 1, 15);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    free(doc);
    free(a);
    free(b);
    free(c);
}

static void test_plan_gpustack_binpacks_onto_the_smallest_gpu_that_fits(void **state)
{
    (void)state;
    char *a = gpu("gpu0", "big", "80 GiB", "3 TB/s", "900 TFLOP/s", "4 $/h");
    char *b = gpu("gpu1", "small", "24 GiB", "300 GB/s", "120 TFLOP/s", "1 $/h");
    char *local = px_asprintf("%s,%s", a, b);
    px_hw_graph *g = two_nodes(local, b, "");
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan *p = baseline_plan(g, m, "gpustack");
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    const px_cost_fleet *f = px_plan_fleet(p);
    assert_int_equal(pipe->n_stages, 1);
    assert_string_equal(f->devices[pipe->stages[0].devices[0]].model, "small");
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    free(local);
    free(a);
    free(b);
}

static void test_plan_split_layers_by_largest_remainder(void **state)
{
    (void)state;
    double w[3] = {24, 20, 16};
    uint32_t c[3];
    px__plan_split_layers(w, 3, 32, 1, c);
    assert_int_equal(c[0] + c[1] + c[2], 32);
    assert_int_equal(c[0], 13);
    assert_int_equal(c[1], 11);
    assert_int_equal(c[2], 8);
    double tiny[3] = {1000, 1, 1};
    px__plan_split_layers(tiny, 3, 4, 1, c);
    assert_true(c[1] >= 1 && c[2] >= 1 && c[0] + c[1] + c[2] == 4);
}

/* A fast GPU and a slow small one on nodes joined by a slow network, for
 * throughput: each replica runs at the batch it serves best, the slow one
 * at a smaller batch (its KV cache stays in its memory), and together they
 * serve more than both at the fast one's batch. */
static void test_plan_replicas_run_at_batches_of_their_own(void **state)
{
    (void)state;
    char *a = gpu("gpu0", "fast", "80 GiB", "3.35 TB/s", "989 TFLOP/s", "1 $/h");
    char *b = gpu("gpu0", "slow", "48 GiB", "300 GB/s", "121 TFLOP/s", "1 $/h");
    px_hw_graph *g = two_nodes(a, b,
                               "{\"id\":\"net\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":"
                               "\"ethernet\",\"bandwidth\":\"1 Gbit/s\",\"latency\":\"10 ms\"}");
    free(a);
    free(b);
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.objective = PX_PLAN_OBJ_THROUGHPUT;
    req.fallbacks = false;
    px_err err;
    /* bf16 products: the fast GPU is not compute-bound at a small batch. */
    px_contract *relaxed = NULL;
    px_assert_ok(px_contract_builtin("relaxed", &relaxed, &err), &err);
    req.contract = relaxed;
    px_plan *p = NULL;
    px_assert_ok(px_plan_search(&req, &p, &err), &err);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    if (s.n_replicas != 2) {
        char *text = px_plan_dump(p);
        fail_msg("%u replicas: %.3000s", s.n_replicas, text);
    }
    const px_cost_workload *w0 = px_plan_replica_workload(p, 0);
    const px_cost_workload *w1 = px_plan_replica_workload(p, 1);
    assert_non_null(w0);
    assert_non_null(w1);
    assert_null(px_plan_replica_workload(p, 2));
    if (!(w1->batch < w0->batch))
        fail_msg("the slow replica runs at batch %u, the fast one at %u", w1->batch, w0->batch);
    assert_int_equal(s.batch_total, w0->batch + w1->batch);
    for (uint32_t r = 0; r < 2; r++) {
        const px_cost_pipeline *pipe = px_plan_pipeline(p, r);
        for (uint32_t i = 0; i < pipe->n_stages; i++)
            assert_int_equal(pipe->stages[i].kv, PX_COST_KV_DEVICE);
    }
    /* The document carries each replica's batch and says why. */
    json_t *doc = px_plan_to_json(p);
    json_t *reps = json_object_get(doc, "replicas");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(reps, 1), "batch")),
                     w1->batch);
    assert_false(json_is_true(json_object_get(json_object_get(doc, "batching"), "uniform")));
    assert_int_equal(json_integer_value(
                         json_object_get(json_object_get(doc, "batching"), "sequences_in_flight")),
                     w0->batch + w1->batch);
    bool said = false;
    json_t *why = json_object_get(doc, "explanation");
    for (size_t i = 0; i < json_array_size(why); i++)
        said |=
            strstr(json_string_value(json_array_get(why, i)), "the batch it serves best") != NULL;
    assert_true(said);
    json_decref(doc);
    /* Both at the fast replica's batch serve less under the same model. */
    px_cost_params cp;
    px_cost_params_default(&cp);
    px_cost_fleet *f = NULL;
    px_cost_model *cm = NULL;
    px_assert_ok(px_cost_fleet_new(g, &cp, &f, &err), &err);
    px_assert_ok(px_cost_model_new(m, &cm, &err), &err);
    px_cost_pipeline slow = *px_plan_pipeline(p, 1);
    px_cost_estimate *e = malloc(sizeof *e);
    assert_non_null(e);
    px_cost_workload same = *w0;
    px_cost_pipeline slow_kv_host = slow;
    for (uint32_t i = 0; i < slow.n_stages; i++)
        slow_kv_host.stages[i].kv = PX_COST_KV_HOST;
    px_assert_ok(px_cost_eval_pipeline(f, cm, &cp, &same, &slow, NULL, e, &err), &err);
    double at_same = 0;
    if (e->why == PX_COST_OK)
        at_same = e->throughput;
    px_assert_ok(px_cost_eval_pipeline(f, cm, &cp, &same, &slow_kv_host, NULL, e, &err), &err);
    if (e->why == PX_COST_OK)
        at_same = PX_MAX(at_same, e->throughput);
    px_assert_ok(px_cost_eval_pipeline(f, cm, &cp, w1, &slow, NULL, e, &err), &err);
    assert_int_equal(e->why, PX_COST_OK);
    assert_true(e->throughput > at_same);
    free(e);
    px_cost_model_free(cm);
    px_cost_fleet_free(f);
    px_plan_free(p);
    px_contract_free(relaxed);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

/* Two 24 GiB GPUs on one node whose host memory is `host`: Llama-3-8B at
 * batch 32 and context 8192 keeps 64 GiB of KV cache (f32) in host memory
 * per replica. */
static px_hw_graph *shared_host_fleet(const char *host)
{
    char *a = gpu("gpu0", "card", "24 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *b = gpu("gpu1", "card", "24 GiB", "1 TB/s", "200 TFLOP/s", "1 $/h");
    char *doc =
        px_asprintf("{\"schema\":\"plexus.inventory/1\",\"name\":\"t\",\"nodes\":[{\"id\":\"n1\","
                    "\"memory\":[{\"id\":\"ddr0\",\"kind\":\"ddr\",\"capacity\":\"%s\","
                    "\"bandwidth\":\"200 GB/s\"}],\"devices\":[%s,%s]}],\"links\":["
                    "{\"id\":\"p0\",\"from\":\"n1.gpu0\",\"to\":\"n1\",\"kind\":\"pcie4\","
                    "\"bandwidth\":\"32 GB/s\",\"latency\":\"2 us\"},"
                    "{\"id\":\"p1\",\"from\":\"n1.gpu1\",\"to\":\"n1\",\"kind\":\"pcie4\","
                    "\"bandwidth\":\"32 GB/s\",\"latency\":\"2 us\"}]}",
                    host, a, b);
    px_hw_graph *g = load(doc);
    free(a);
    free(b);
    free(doc);
    return g;
}

/* The host KV of every replica on node n1, summed (bytes). */
static double node_host_kv(px_hw_graph *g, px_ir_model *m, const px_plan *p)
{
    px_cost_fleet *f = NULL;
    px_cost_model *cm = NULL;
    px_cost_params cp;
    px_cost_params_default(&cp);
    px_err err;
    px_assert_ok(px_cost_fleet_new(g, &cp, &f, &err), &err);
    px_assert_ok(px_cost_model_new(m, &cm, &err), &err);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    px_cost_estimate *e = malloc(sizeof *e);
    assert_non_null(e);
    double sum = 0;
    for (uint32_t r = 0; r < s.n_replicas; r++) {
        px_assert_ok(px_cost_eval_pipeline(f, cm, &cp, px_plan_replica_workload(p, r),
                                           px_plan_pipeline(p, r), NULL, e, &err),
                     &err);
        assert_int_equal(e->why, PX_COST_OK);
        for (uint32_t i = 0; i < e->n_stages; i++)
            sum += e->stages[i].host_bytes;
    }
    free(e);
    px_cost_model_free(cm);
    px_cost_fleet_free(f);
    return sum;
}

/* Replicas on one node share its host memory: with room for one replica's
 * host KV the plan does not place a second that needs as much again; with
 * room for both it does. */
static void test_plan_replicas_share_the_nodes_host_memory(void **state)
{
    (void)state;
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    const char *hosts[] = {"100 GiB", "200 GiB"};
    for (int i = 0; i < 2; i++) {
        px_hw_graph *g = shared_host_fleet(hosts[i]);
        px_plan_request req;
        px_plan_request_default(&req);
        req.graph = g;
        req.model = m;
        req.objective = PX_PLAN_OBJ_THROUGHPUT;
        req.workload.batch = 32;
        req.workload.context = 8192;
        req.workload.prompt_tokens = 128;
        req.fallbacks = false;
        px_plan *p = NULL;
        px_err err;
        px_assert_ok(px_plan_search(&req, &p, &err), &err);
        px_plan_summary s;
        px_plan_get_summary(p, &s);
        double used = node_host_kv(g, m, p);
        double limit = (i == 0 ? 100.0 : 200.0) * 1024 * 1024 * 1024 * 0.9;
        assert_true(used > 0);
        if (!(used <= limit))
            fail_msg("host %s: %u replicas keep %.4g GiB of host KV on n1 (limit %.4g GiB)",
                     hosts[i], s.n_replicas, used / 1073741824.0, limit / 1073741824.0);
        if (i == 1)
            assert_int_equal(s.n_replicas, 2);
        px_plan_free(p);
        px_hw_graph_free(g);
    }
    px_ir_model_free(m);
}

static void test_plan_dit_prefers_replicas_for_throughput(void **state)
{
    (void)state;
    px_strbuf devs = PX_STRBUF_INIT;
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof id, "gpu%d", i);
        char *d = gpu(id, "card", "24 GiB", "1 TB/s", "300 TFLOP/s", "1 $/h");
        px_strbuf_addf(&devs, "%s%s", i ? "," : "", d);
        free(d);
    }
    char *doc = px_asprintf("{\"schema\":\"plexus.inventory/1\",\"nodes\":[{\"id\":\"n1\","
                            "\"devices\":[%s]}]}",
                            devs.buf);
    px_hw_graph *g = load(doc);
    px_ir_model *m = preset("dit-xl-2", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.objective = PX_PLAN_OBJ_THROUGHPUT;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_int_equal(s.n_stages, 1);
    assert_int_equal(s.n_replicas, 4);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    free(doc);
    px_strbuf_release(&devs);
}

static void test_plan_matches_the_exact_yardstick_on_a_small_fleet(void **state)
{
    (void)state;
    px_hw_graph *g = slow_link_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.fallbacks = false;
    req.workload.context = 4096;
    req.workload.prompt_tokens = 512;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    double exact;
    px_err err;
    px_assert_ok(px_plan_exact(&req, 3, &exact, &err), &err);
    if (s.tpot_point_s > exact * 1.01)
        fail_msg("heuristic %g s per token, exact %g s", s.tpot_point_s, exact);
    double milp, heur;
    px_assert_ok(px_plan_milp(&req, &milp, &err), &err);
    px_assert_ok(px_plan_heuristic_bottleneck(&req, &heur, &err), &err);
    assert_true(milp > 0 && heur >= milp * 0.999);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_parses_objectives_slos_and_refuses_the_impossible(void **state)
{
    (void)state;
    px_plan_objective o;
    px_err err;
    px_assert_ok(px_plan_objective_parse("tokens_per_dollar", &o, &err), &err);
    assert_int_equal(o, PX_PLAN_OBJ_TOKENS_PER_DOLLAR);
    assert_int_equal(px_plan_objective_parse("fastest", &o, &err), PX_EINVAL);
    px_assert_contains(err.msg, "latency");
    px_plan_slo slo = {0};
    px_assert_ok(px_plan_slo_parse("tpot=50ms,ttft=500ms", &slo, &err), &err);
    assert_true(fabs(slo.tpot_s - 0.05) < 1e-12 && fabs(slo.ttft_s - 0.5) < 1e-12);
    assert_int_equal(px_plan_slo_parse("tpot=50", &slo, &err), PX_EINVAL);
    assert_int_equal(px_plan_slo_parse("speed=5ms", &slo, &err), PX_EINVAL);
    px_assert_contains(err.msg, "tpot");
    double usd;
    px_assert_ok(px_plan_budget_parse("10$/h", &usd, &err), &err);
    assert_true(fabs(usd - 10) < 1e-12);
    assert_int_equal(px_plan_budget_parse("10 W", &usd, &err), PX_EINVAL);

    px_hw_graph *g = pricing_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.slo.tpot_s = 1e-6;
    px_plan *p = NULL;
    assert_int_equal(px_plan_search(&req, &p, &err), PX_EINFEASIBLE);
    px_assert_contains(err.msg, "SLO");
    req.slo.tpot_s = 0;
    req.slo.budget_usd_h = 0.1;
    assert_int_equal(px_plan_search(&req, &p, &err), PX_EINFEASIBLE);
    px_assert_contains(err.msg, "budget");
    req.slo.budget_usd_h = 0;
    req.policy = "round-robin";
    assert_int_equal(px_plan_search(&req, &p, &err), PX_EINVAL);
    assert_null(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_fits_memory_and_capabilities),
        cmocka_unit_test(test_plan_latency_and_tokens_per_dollar_differ_and_say_why),
        cmocka_unit_test(test_plan_avoids_fastest_device_behind_slow_link_and_says_so),
        cmocka_unit_test(test_plan_refuses_model_that_fits_in_total_but_no_cut),
        cmocka_unit_test(test_plan_rejects_fp8_under_bitwise_contract),
        cmocka_unit_test(test_plan_bounded_relaxation_lowers_only_allowed_regions),
        cmocka_unit_test(test_plan_is_byte_identical_across_runs),
        cmocka_unit_test(test_plan_rejected_candidates_carry_reasons),
        cmocka_unit_test(test_plan_fallbacks_cover_each_device),
        cmocka_unit_test(test_plan_never_ranks_below_a_baseline),
        cmocka_unit_test(test_plan_llamacpp_splits_by_free_memory_with_host_embedding),
        cmocka_unit_test(test_plan_exo_takes_the_smallest_ring_by_memory),
        cmocka_unit_test(test_plan_gpustack_binpacks_onto_the_smallest_gpu_that_fits),
        cmocka_unit_test(test_plan_split_layers_by_largest_remainder),
        cmocka_unit_test(test_plan_dit_prefers_replicas_for_throughput),
        cmocka_unit_test(test_plan_replicas_share_the_nodes_host_memory),
        cmocka_unit_test(test_plan_replicas_run_at_batches_of_their_own),
        cmocka_unit_test(test_plan_matches_the_exact_yardstick_on_a_small_fleet),
        cmocka_unit_test(test_plan_parses_objectives_slos_and_refuses_the_impossible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
