/* Fallbacks for link degradation: one per hop the plan's replicas use,
 * each with an action, a note and the figures of the answer; none for a
 * single stage; re-planning around a link that a 10x slowdown makes
 * costly; dropping a replica; determinism. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

static px_hw_graph *load_text(const char *text)
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

static px_hw_graph *load_scenario(const char *name)
{
    char *rel = px_asprintf("data/scenarios/%s", name);
    char *path = px_test_source_path(rel);
    px_hw_graph *g = NULL;
    px_diags d;
    px_diags_init(&d);
    px_err err;
    px_assert_ok(px_hw_graph_load(path, NULL, &g, &d, &err), &err);
    px_diags_release(&d);
    free(path);
    free(rel);
    return g;
}

/* 24 GiB GPUs at 1 TB/s: llama-3-8b in f32 (30 GiB) needs two of them. */
static char *gpu(const char *id)
{
    char *s = px_asprintf(
        "{\"id\":\"%s\",\"class\":\"gpu\",\"model\":\"mid\",\"backend\":\"cuda\","
        "\"compute\":{\"bf16\":\"200 TFLOP/s\",\"f16\":\"200 TFLOP/s\",\"f32\":\"30 TFLOP/s\"},"
        "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"24 GiB\",\"bandwidth\":\"1 "
        "TB/s\"}],\"power\":{\"tdp\":\"300 W\",\"idle\":\"40 W\"},\"cost\":\"1 $/h\"}",
        id);
    assert_non_null(s);
    return s;
}

/* Three nodes of one GPU each, every pair joined by its own slow link:
 * a 10x slowdown of the link a two-stage pipeline uses costs more than
 * re-placing the pipeline on the other pair. */
static px_hw_graph *triangle_fleet(void)
{
    char *g = gpu("gpu0");
    char *doc = px_asprintf(
        "{\"schema\":\"plexus.inventory/1\",\"name\":\"triangle\",\"nodes\":["
        "{\"id\":\"n1\",\"devices\":[%s]},{\"id\":\"n2\",\"devices\":[%s]},"
        "{\"id\":\"n3\",\"devices\":[%s]}],\"links\":["
        "{\"id\":\"e12\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":\"ethernet\",\"bandwidth\":\"100 "
        "Mbit/s\",\"latency\":\"10 us\"},"
        "{\"id\":\"e23\",\"from\":\"n2\",\"to\":\"n3\",\"kind\":\"ethernet\",\"bandwidth\":\"100 "
        "Mbit/s\",\"latency\":\"10 us\"},"
        "{\"id\":\"e13\",\"from\":\"n1\",\"to\":\"n3\",\"kind\":\"ethernet\",\"bandwidth\":\"100 "
        "Mbit/s\",\"latency\":\"10 us\"}]}",
        g, g, g);
    px_hw_graph *graph = load_text(doc);
    free(doc);
    free(g);
    return graph;
}

/* Two nodes of two GPUs; each GPU reaches its host over its own slow
 * link, so the two-stage pipeline is cloned into a second replica and
 * a slowed device link hurts only one of them. */
static px_hw_graph *two_pair_fleet(void)
{
    char *a = gpu("gpu0"), *b = gpu("gpu1");
    px_strbuf links = PX_STRBUF_INIT;
    for (int n = 1; n <= 2; n++)
        for (int k = 0; k < 2; k++)
            px_strbuf_addf(&links,
                           "%s{\"id\":\"l%d%d\",\"from\":\"n%d.gpu%d\",\"to\":\"n%d\","
                           "\"kind\":\"pcie4\",\"bandwidth\":\"20 MB/s\",\"latency\":\"2 us\"}",
                           links.len ? "," : "", n, k, n, k, n);
    char *doc = px_asprintf("{\"schema\":\"plexus.inventory/1\",\"name\":\"pairs\",\"nodes\":["
                            "{\"id\":\"n1\",\"devices\":[%s,%s]},{\"id\":\"n2\",\"devices\":[%s,"
                            "%s]}],\"links\":[%s,{\"id\":\"net\",\"from\":\"n1\",\"to\":\"n2\","
                            "\"kind\":\"ethernet\",\"bandwidth\":\"100 Gbit/s\",\"latency\":\"10 "
                            "us\"}]}",
                            a, b, a, b, links.buf);
    px_hw_graph *g = load_text(doc);
    free(doc);
    px_strbuf_release(&links);
    free(a);
    free(b);
    return g;
}

static px_ir_model *preset(const char *name, px_dtype dt)
{
    px_ir_model *m;
    px_err err;
    px_assert_ok(px_ir_preset_new(name, dt, NULL, &m, &err), &err);
    return m;
}

static px_plan *plan_ok(const px_plan_request *req)
{
    px_plan *p = NULL;
    px_err err;
    px_assert_ok(px_plan_search(req, &p, &err), &err);
    return p;
}

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    if (!s)
        fail_msg("member \"%s\" missing or not a string", key);
    return s;
}

static double number(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("member \"%s\" missing or not a number", key);
    return json_number_value(v);
}

static bool is_action(const char *a)
{
    return !strcmp(a, "keep") || !strcmp(a, "avoid-sender") || !strcmp(a, "avoid-receiver") ||
           !strcmp(a, "drop-replica");
}

/* Checks the members every entry carries and returns the array. */
static const json_t *link_fallbacks(const json_t *doc)
{
    const json_t *lfb = json_object_get(doc, "link_fallbacks");
    assert_true(json_is_array(lfb));
    size_t i;
    const json_t *x;
    json_array_foreach(lfb, i, x)
    {
        assert_non_null(strchr(str(x, "link"), '>'));
        assert_true(is_action(str(x, "action")));
        assert_true(strlen(str(x, "note")) > 10);
        const char *kind = str(x, "kind");
        assert_true(!strcmp(kind, "pipeline") || !strcmp(kind, "allreduce"));
        assert_true(strlen(str(x, "via")) > 0);
        assert_true(json_is_true(json_object_get(x, "feasible")));
        assert_true(number(x, "tpot_s") > 0);
        assert_true(number(x, "throughput") > 0);
        assert_true(number(x, "replicas") >= 1);
        const json_t *deg = json_object_get(x, "degraded");
        assert_true(number(deg, "tpot_s") > 0);
        assert_true(number(deg, "throughput") > 0);
    }
    return lfb;
}

static uint32_t device_index(const px_hw_graph *g, const char *global_id)
{
    const px_hw_view *v = px_hw_graph_view(g);
    for (uint32_t i = 0; i < v->n_devices; i++)
        if (!strcmp(v->devices[i].global_id, global_id))
            return i;
    fail_msg("no device %s", global_id);
    return 0;
}

static void test_plan_link_fallbacks_give_one_answer_per_hop_of_a_pipeline(void **state)
{
    (void)state;
    px_hw_graph *g = load_scenario("irregular-4dev.json");
    px_ir_model *m = preset("llama-3-70b", PX_DTYPE_COUNT_);
    /* Without the V100 the 70B model spans the CPU and the two other GPUs. */
    bool excluded[4] = {false};
    assert_int_equal(px_hw_graph_view(g)->n_devices, 4);
    excluded[device_index(g, "ws1.gpu2")] = true;
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.excluded = excluded;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_int_equal(s.n_replicas, 1);
    assert_true(s.n_stages >= 2);
    json_t *doc = px_plan_to_json(p);
    const json_t *lfb = link_fallbacks(doc);
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    const px_cost_fleet *f = px_plan_fleet(p);
    /* One answer per hop between stages and per tensor-parallel group. */
    size_t hops = pipe->n_stages - 1;
    for (uint32_t i = 0; i < pipe->n_stages; i++)
        hops += pipe->stages[i].tp > 1;
    assert_int_equal(json_array_size(lfb), hops);
    assert_int_equal(s.n_link_fallbacks, hops);
    for (uint32_t i = 0; i + 1 < pipe->n_stages; i++) {
        const json_t *x = NULL, *y;
        size_t at;
        json_array_foreach(lfb, at, y)
        {
            if (!strcmp(str(y, "kind"), "pipeline") && (uint32_t)number(y, "stage") == i)
                x = y;
        }
        assert_non_null(x);
        char want[160];
        snprintf(want, sizeof want, "%s>%s", f->devices[pipe->stages[i].devices[0]].id,
                 f->devices[pipe->stages[i + 1].devices[0]].id);
        assert_string_equal(str(x, "link"), want);
        assert_string_equal(str(x, "kind"), "pipeline");
        assert_int_equal((int)number(x, "stage"), (int)i);
        /* A few microseconds of activations per token: slowing the link
         * tenfold costs far less than giving up a device. */
        assert_string_equal(str(x, "action"), "keep");
        assert_non_null(strstr(str(x, "note"), "keep"));
        double deg = number(json_object_get(x, "degraded"), "tpot_s");
        /* The document keeps four significant digits. */
        if (!(deg >= s.tpot_point_s * 0.9995))
            fail_msg("degraded %.9g, point %.9g", deg, s.tpot_point_s);
        assert_true(deg < s.tpot_point_s * 1.01);
    }
    /* The report lists them under the device fallbacks. */
    px_strbuf sb = PX_STRBUF_INIT;
    assert_int_equal(px_plan_report(p, &sb), PX_OK);
    const char *dev = strstr(sb.buf, "fallbacks if one device is lost:");
    const char *link = strstr(sb.buf, "fallbacks if a link degrades:");
    assert_non_null(dev);
    assert_non_null(link);
    assert_true(link > dev);
    px_strbuf_release(&sb);
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_single_stage_plan_has_no_link_fallbacks(void **state)
{
    (void)state;
    px_hw_graph *g = load_scenario("irregular-4dev.json");
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    /* The RTX 4090 alone (the others would join it in a tensor-parallel
     * group, whose ring has a link of its own). */
    bool excluded[4] = {false};
    excluded[device_index(g, "ws1.gpu1")] = true;
    excluded[device_index(g, "ws1.gpu2")] = true;
    req.excluded = excluded;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_int_equal(s.n_stages, 1);
    assert_int_equal(px_plan_pipeline(p, 0)->stages[0].tp, 1);
    assert_int_equal(s.n_replicas, 1);
    json_t *doc = px_plan_to_json(p);
    assert_int_equal(json_array_size(link_fallbacks(doc)), 0);
    assert_int_equal(s.n_link_fallbacks, 0);
    px_strbuf sb = PX_STRBUF_INIT;
    assert_int_equal(px_plan_report(p, &sb), PX_OK);
    assert_null(strstr(sb.buf, "fallbacks if a link degrades"));
    px_strbuf_release(&sb);
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_link_fallback_replans_around_a_costly_slowed_link(void **state)
{
    (void)state;
    px_hw_graph *g = triangle_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_int_equal(s.n_stages, 2);
    json_t *doc = px_plan_to_json(p);
    const json_t *lfb = link_fallbacks(doc);
    assert_int_equal(json_array_size(lfb), 1);
    const json_t *x = json_array_get(lfb, 0);
    const char *action = str(x, "action");
    if (strcmp(action, "avoid-sender") && strcmp(action, "avoid-receiver"))
        fail_msg("expected a re-plan around the link, got %s: %s", action, str(x, "note"));
    /* The answer leaves out the device it avoids and beats the plan on
     * the slowed link, which is clearly slower than the plan as made. */
    char link[160];
    px_strlcpy(link, str(x, "link"), sizeof link);
    char *gt = strchr(link, '>');
    *gt = 0;
    const char *avoided = !strcmp(action, "avoid-sender") ? link : gt + 1;
    const char *devices = str(x, "devices");
    assert_null(strstr(devices, avoided));
    assert_non_null(strstr(str(x, "note"), avoided));
    double deg = number(json_object_get(x, "degraded"), "tpot_s");
    assert_true(deg > s.tpot_point_s * 1.05);
    assert_true(number(x, "tpot_s") < deg * 0.95);
    assert_int_equal((int)number(x, "replicas"), 1);
    assert_string_equal(str(x, "via"), "e12");
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_link_fallback_drops_the_replica_behind_a_slowed_link(void **state)
{
    (void)state;
    px_hw_graph *g = two_pair_fleet();
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_F32);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    assert_int_equal(s.n_replicas, 2);
    assert_int_equal(s.n_stages, 2);
    json_t *doc = px_plan_to_json(p);
    const json_t *lfb = link_fallbacks(doc);
    assert_int_equal(json_array_size(lfb), 2);
    size_t i;
    const json_t *x;
    json_array_foreach(lfb, i, x)
    {
        /* Latency is the slowest replica's: the one on the slowed link is
         * better dropped, and the other keeps its own figures. */
        assert_string_equal(str(x, "action"), "drop-replica");
        assert_int_equal((int)number(x, "replica"), (int)i);
        assert_int_equal((int)number(x, "replicas"), 1);
        assert_null(json_object_get(x, "devices"));
        assert_true(number(x, "tpot_s") < s.tpot_point_s * 1.0001);
        assert_true(number(json_object_get(x, "degraded"), "tpot_s") > s.tpot_point_s * 1.05);
    }
    json_decref(doc);
    px_plan_free(p);

    /* For throughput a slowed replica still adds tokens: keep it. */
    req.objective = PX_PLAN_OBJ_THROUGHPUT;
    req.workload.batch = 1;
    p = plan_ok(&req);
    px_plan_get_summary(p, &s);
    doc = px_plan_to_json(p);
    lfb = link_fallbacks(doc);
    assert_true(json_array_size(lfb) > 0);
    if (s.n_replicas > 1)
        json_array_foreach(lfb, i, x)
        {
            assert_string_equal(str(x, "action"), "keep");
            double deg = number(json_object_get(x, "degraded"), "throughput");
            assert_true(number(x, "throughput") == deg);
            assert_true(deg < s.throughput_point);
        }
    json_decref(doc);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_link_fallbacks_cover_tensor_parallel_all_reduce(void **state)
{
    (void)state;
    px_hw_graph *g = load_scenario("homogeneous-8xh100.json");
    px_ir_model *m = preset("llama-3-70b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *p = plan_ok(&req);
    const px_cost_pipeline *pipe = px_plan_pipeline(p, 0);
    uint32_t groups = 0;
    for (uint32_t i = 0; i < pipe->n_stages; i++)
        groups += pipe->stages[i].tp > 1;
    json_t *doc = px_plan_to_json(p);
    const json_t *lfb = link_fallbacks(doc);
    size_t i, n_allreduce = 0;
    const json_t *x;
    json_array_foreach(lfb, i, x) n_allreduce += !strcmp(str(x, "kind"), "allreduce");
    assert_true(groups > 0);
    assert_int_equal(n_allreduce, groups);
    json_decref(doc);
    px_plan_free(p);
    /* Capped at one device per stage (as plexus serve's stage workers
     * run), the same request plans no group. */
    req.max_tp = 1;
    p = plan_ok(&req);
    pipe = px_plan_pipeline(p, 0);
    for (uint32_t k = 0; k < pipe->n_stages; k++)
        assert_int_equal(pipe->stages[k].tp, 1);
    px_plan_free(p);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

static void test_plan_link_fallbacks_are_deterministic_and_optional(void **state)
{
    (void)state;
    px_hw_graph *g = load_scenario("irregular-4dev.json");
    px_ir_model *m = preset("llama-3-70b", PX_DTYPE_COUNT_);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    px_plan *a = plan_ok(&req);
    px_plan *b = plan_ok(&req);
    char *ta = px_plan_dump(a), *tb = px_plan_dump(b);
    assert_string_equal(ta, tb);
    assert_string_equal(px_plan_id(a), px_plan_id(b));
    assert_non_null(strstr(ta, "\"link_fallbacks\""));
    px_plan_summary s;
    px_plan_get_summary(a, &s);
    assert_true(s.n_link_fallbacks >= 1);
    free(ta);
    free(tb);
    px_plan_free(b);
    /* Without fallbacks both lists are empty; the device fallbacks keep
     * their members whatever the link ones say. */
    req.fallbacks = false;
    b = plan_ok(&req);
    json_t *doc = px_plan_to_json(b);
    assert_int_equal(json_array_size(json_object_get(doc, "link_fallbacks")), 0);
    assert_int_equal(json_array_size(json_object_get(doc, "fallbacks")), 0);
    json_decref(doc);
    doc = px_plan_to_json(a);
    size_t i;
    const json_t *x;
    json_array_foreach(json_object_get(doc, "fallbacks"), i, x)
    {
        assert_non_null(json_object_get(x, "lost"));
        assert_non_null(json_object_get(x, "note"));
        assert_null(json_object_get(x, "action"));
    }
    json_decref(doc);
    px_plan_free(a);
    px_plan_free(b);
    px_ir_model_free(m);
    px_hw_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_link_fallbacks_give_one_answer_per_hop_of_a_pipeline),
        cmocka_unit_test(test_plan_single_stage_plan_has_no_link_fallbacks),
        cmocka_unit_test(test_plan_link_fallback_replans_around_a_costly_slowed_link),
        cmocka_unit_test(test_plan_link_fallback_drops_the_replica_behind_a_slowed_link),
        cmocka_unit_test(test_plan_link_fallbacks_cover_tensor_parallel_all_reduce),
        cmocka_unit_test(test_plan_link_fallbacks_are_deterministic_and_optional),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
