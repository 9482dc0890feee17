/* The fleet scheduler alone: version specifiers, job specification checks,
 * filters with every node's reason, scores (headroom, locality, load,
 * topology), gang placement all or nothing, releases and explanations. */
#include "px_test.h"

#include "plexus/fleet.h"

#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, 0, &e);
    if (!v)
        fail_msg("bad test JSON: %s: %s", e.text, text);
    return v;
}

static void add_node(px_fleet_sched *s, const char *text)
{
    json_t *reg = parse(text);
    px_err err;
    px_assert_ok(px_fleet_sched_add_node(s, reg, NULL, &err), &err);
    json_decref(reg);
}

static px_fleet_request *request(const char *text)
{
    json_t *spec = parse(text);
    px_fleet_request *r;
    px_err err;
    px_assert_ok(px_fleet_request_compile(spec, &r, &err), &err);
    json_decref(spec);
    return r;
}

/* Places and returns the explanation as JSON (caller decrefs). */
static json_t *place(px_fleet_sched *s, px_fleet_request *r, const char *owner, bool *placed)
{
    px_fleet_explanation *e;
    px_err err;
    px_assert_ok(px_fleet_sched_place(s, r, owner, &e, &err), &err);
    *placed = px_fleet_explanation_placed(e);
    json_t *j = px_fleet_explanation_to_json(e, s);
    assert_non_null(j);
    px_fleet_explanation_free(e);
    return j;
}

static const char *rejected_detail(const json_t *ex, const char *node, const char **reason)
{
    const json_t *rej = json_object_get(ex, "rejected");
    for (size_t i = 0; i < json_array_size(rej); i++) {
        const json_t *x = json_array_get(rej, i);
        if (strcmp(json_string_value(json_object_get(x, "node")), node) == 0) {
            if (reason)
                *reason = json_string_value(json_object_get(x, "reason"));
            return json_string_value(json_object_get(x, "detail"));
        }
    }
    return NULL;
}

static const char *decision_node(const json_t *ex, size_t rank)
{
    return json_string_value(
        json_array_get(json_object_get(json_object_get(ex, "decision"), "nodes"), rank));
}

static void test_version_specifiers_follow_pep440(void **state)
{
    (void)state;
    struct {
        const char *version, *spec;
        bool want;
    } cases[] = {
        {"2.3.1", ">=2.1", true},
        {"2.0.1", ">=2.1", false},
        {"2.10", ">2.9", true},
        {"2.1.0rc1", ">=2.1", false},
        {"2.1.0", "==2.1", true},
        {"2.1.5", "==2.1.*", true},
        {"2.2.0", "==2.1.*", false},
        {"2.2.3", "~=2.2", true},
        {"3.0", "~=2.2", false},
        {"2.4.1", "~=2.4.0", true},
        {"2.5.0", "~=2.4.0", false},
        {"2.3.1", ">=2.1,<3", true},
        {"3.0.0", ">=2.1,<3", false},
        {"12.1", "!=12.0", true},
        {"2.4.0+cu121", ">=2.4", true},
        {"gfx90a", "==gfx90a", true},
        {"gfx90a", ">=8.0", false},
        {"1.0.post1", ">1.0", true},
        {"8.0", "", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool got;
        px_err err;
        px_assert_ok(px_fleet_version_match(cases[i].version, cases[i].spec, &got, &err), &err);
        if (got != cases[i].want)
            fail_msg("%s against \"%s\": expected %d", cases[i].version, cases[i].spec,
                     cases[i].want);
    }
    bool got;
    px_err err;
    assert_int_equal(px_fleet_version_match("1.0", ">=", &got, &err), PX_EPARSE);
    assert_int_equal(px_fleet_version_match("1.0", "2.0", &got, &err), PX_EPARSE);
    px_assert_contains(err.msg, "no operator");
    assert_int_equal(px_fleet_version_match("1.0", "~=2", &got, &err), PX_EPARSE);
    assert_int_equal(px_fleet_version_match("1.0", ">=1.*", &got, &err), PX_EPARSE);
}

static void test_request_rejects_bad_specifications_with_pointer(void **state)
{
    (void)state;
    struct {
        const char *spec, *needle;
    } bad[] = {
        {"{}", "/command"},
        {"{\"command\": \"echo\"}", "/command"},
        {"{\"command\": []}", "/command"},
        {"{\"command\": [\"a\"], \"resources\": {\"gpus\": -1}}", "/resources/gpus"},
        {"{\"command\": [\"a\"], \"resources\": {\"memory\": \"8 parsecs\"}}", "/resources/memory"},
        {"{\"command\": [\"a\"], \"resources\": {\"capability\": \"8.0\"}}",
         "/resources/capability"},
        {"{\"command\": [\"a\"], \"frameworks\": [\">=2\"]}", "/frameworks/0"},
        {"{\"command\": [\"a\"], \"frameworks\": [\"torch>=x\"]}", "/frameworks/0"},
        {"{\"command\": [\"a\"], \"colour\": 1}", "unknown member \"colour\""},
        {"{\"command\": [\"a\"], \"nodes\": 0}", "/nodes"},
        {"{\"command\": [\"a\"], \"launcher\": \"ssh\"}", "/launcher"},
        {"{\"command\": [\"a\"], \"service\": {\"health_path\": \"/h\"}}", "/service/port"},
        {"{\"command\": [\"a\"], \"model\": {\"digest\": \"abc\"}}", "/model/digest"},
        {"{\"command\": [\"a\"], \"plan\": \"auto\"}", "/plan"},
        {"{\"command\": [\"a\", \"b\"], \"shell\": true}", "/command"},
        {"{\"python\": {\"source\": \"x\", \"function\": \"os.system('x')\"}}", "/python/function"},
        {"{\"command\": [\"a\"], \"env\": {\"A=B\": \"c\"}}", "/env"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *spec = parse(bad[i].spec);
        px_fleet_request *r = NULL;
        px_err err;
        px_status st = px_fleet_request_compile(spec, &r, &err);
        json_decref(spec);
        if (st == PX_OK) {
            px_fleet_request_free(r);
            fail_msg("accepted bad spec %s", bad[i].spec);
        }
        px_assert_contains(err.msg, bad[i].needle);
    }
    /* x- members are kept and ignored. */
    px_fleet_request_free(request("{\"command\": [\"a\"], \"x-team\": \"ml\"}"));
}

#define GPU_NODE(name, vendor, cap, mem, torch)                                                \
    "{\"name\": \"" name "\", \"cpus\": 16, \"memory\": \"64 GiB\", \"node\": {\"devices\": [" \
    "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"" vendor "\", \"model\": \"X\","     \
    " \"capability\": \"" cap "\", \"memory\": [{\"capacity\": \"" mem "\"}]}],"               \
    " \"frameworks\": [{\"name\": \"torch\", \"version\": \"" torch "\"}]}}"

static void test_filters_keep_every_node_reason(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    add_node(s, GPU_NODE("big", "nvidia", "9.0", "80 GB", "2.3.1"));
    add_node(s, GPU_NODE("oldtorch", "nvidia", "9.0", "80 GB", "2.0.1"));
    add_node(s, GPU_NODE("small", "nvidia", "8.6", "24 GB", "2.3.1"));
    add_node(s, GPU_NODE("amd", "amd", "gfx90a", "64 GB", "2.3.1"));
    add_node(s, "{\"name\": \"cpuonly\", \"cpus\": 2, \"memory\": \"4 GiB\"}");
    add_node(s, GPU_NODE("gone", "nvidia", "9.0", "80 GB", "2.3.1"));
    size_t gone;
    assert_int_equal(px_fleet_sched_find_node(s, "gone", &gone, NULL), PX_OK);
    px_fleet_sched_set_state(s, gone, PX_FLEET_NODE_OFFLINE);
    px_fleet_request *r = request(
        "{\"command\": [\"train\"], \"resources\": {\"gpus\": 1, \"gpu_memory\": \"40 GB\","
        " \"vendor\": \"nvidia\", \"memory\": \"8 GiB\"}, \"frameworks\": [\"torch>=2.1\"]}");
    bool placed;
    json_t *ex = place(s, r, "j1", &placed);
    assert_true(placed);
    assert_string_equal(decision_node(ex, 0), "big");
    const char *reason;
    px_assert_contains(rejected_detail(ex, "oldtorch", &reason),
                       "torch 2.0.1 installed, job needs >=2.1");
    assert_string_equal(reason, "framework_version");
    px_assert_contains(rejected_detail(ex, "small", &reason),
                       "largest GPU has 24 GB, job needs 40 GB");
    assert_string_equal(reason, "gpu_memory");
    px_assert_contains(rejected_detail(ex, "amd", &reason), "no nvidia GPU");
    assert_string_equal(reason, "vendor");
    px_assert_contains(rejected_detail(ex, "cpuonly", &reason), "torch is not installed");
    assert_string_equal(reason, "framework");
    assert_non_null(rejected_detail(ex, "gone", &reason));
    assert_string_equal(reason, "offline");
    assert_null(rejected_detail(ex, "big", NULL));
    /* Requirement counts: 4 nodes have torch>=2.1 (big, small, amd, gone). */
    const json_t *reqs = json_object_get(ex, "requirements");
    bool seen = false;
    for (size_t i = 0; i < json_array_size(reqs); i++) {
        const json_t *q = json_array_get(reqs, i);
        if (strcmp(json_string_value(json_object_get(q, "requirement")), "framework torch>=2.1") ==
            0) {
            assert_int_equal(json_integer_value(json_object_get(q, "nodes_meeting")), 4);
            seen = true;
        }
    }
    assert_true(seen);
    json_decref(ex);
    /* The only fitting GPU is now taken: the next identical job waits with "gpus". */
    ex = place(s, r, "j2", &placed);
    assert_false(placed);
    px_assert_contains(rejected_detail(ex, "big", &reason), "not enough GPUs");
    assert_string_equal(reason, "gpus");
    px_assert_contains(
        json_string_value(json_object_get(json_object_get(ex, "decision"), "summary")),
        "not placed: 0/6 nodes fit");
    json_decref(ex);
    /* Releasing j1 frees the GPU for j2. */
    assert_int_equal(px_fleet_sched_release(s, "j1"), 1);
    ex = place(s, r, "j2", &placed);
    assert_true(placed);
    json_decref(ex);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

static void test_capability_and_cpu_memory_filters(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    add_node(s, GPU_NODE("ampere", "nvidia", "8.0", "40 GB", "2.3.1"));
    add_node(s, GPU_NODE("turing", "nvidia", "7.5", "16 GB", "2.3.1"));
    px_fleet_request *r =
        request("{\"command\": [\"a\"], \"resources\": {\"capability\": \">=8.0\"}}");
    bool placed;
    json_t *ex = place(s, r, "c1", &placed);
    assert_true(placed);
    assert_string_equal(decision_node(ex, 0), "ampere");
    const char *reason;
    px_assert_contains(rejected_detail(ex, "turing", &reason), "capability >=8.0 (node has 7.5)");
    json_decref(ex);
    px_fleet_request_free(r);
    r = request("{\"command\": [\"a\"], \"resources\": {\"cpus\": 32}}");
    ex = place(s, r, "c2", &placed);
    assert_false(placed);
    px_assert_contains(rejected_detail(ex, "turing", &reason),
                       "not enough CPUs: 16 free, job needs 32");
    json_decref(ex);
    px_fleet_request_free(r);
    r = request("{\"command\": [\"a\"], \"resources\": {\"memory\": \"100 GiB\"}}");
    ex = place(s, r, "c3", &placed);
    assert_false(placed);
    px_assert_contains(rejected_detail(ex, "ampere", &reason),
                       "not enough memory: 64 GiB free, job needs 100 GiB");
    json_decref(ex);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

static void test_scores_prefer_headroom_then_resident_model(void **state)
{
    (void)state;
    const char *digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    add_node(s, "{\"name\": \"a\", \"cpus\": 8, \"memory\": \"32 GiB\"}");
    add_node(s, "{\"name\": \"b\", \"cpus\": 8, \"memory\": \"32 GiB\", \"resident\": [\""
                "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"]}");
    add_node(s, "{\"name\": \"c\", \"cpus\": 8, \"memory\": \"32 GiB\"}");
    char spec[400];
    snprintf(spec, sizeof spec,
             "{\"command\": [\"serve\"], \"resources\": {\"memory\": \"4 GiB\"}, \"model\": "
             "{\"digest\": \"%s\"}}",
             digest);
    px_fleet_request *r = request(spec);
    bool placed;
    json_t *ex = place(s, r, "m1", &placed);
    assert_true(placed);
    assert_string_equal(decision_node(ex, 0), "b");
    const json_t *top = json_array_get(json_object_get(ex, "scored"), 0);
    assert_true(json_real_value(json_object_get(top, "locality")) == 1.0);
    px_assert_contains(
        json_string_value(json_object_get(json_object_get(ex, "decision"), "summary")),
        "model resident");
    json_decref(ex);
    px_fleet_request_free(r);
    /* Memory headroom comes first: a node with much more free memory wins
     * over a resident model. */
    add_node(s, "{\"name\": \"huge\", \"cpus\": 8, \"memory\": \"512 GiB\"}");
    r = request(spec);
    ex = place(s, r, "m2", &placed);
    assert_string_equal(decision_node(ex, 0), "huge");
    json_decref(ex);
    px_fleet_request_free(r);
    /* Live load lowers the load term; heartbeats feed it. */
    px_fleet_sched_release(s, "m1");
    px_fleet_sched_release(s, "m2");
    size_t b;
    assert_int_equal(px_fleet_sched_find_node(s, "b", &b, NULL), PX_OK);
    json_t *hb = parse("{\"node\": \"b\", \"live\": {\"load\": 0.9}, \"resident\": []}");
    px_fleet_sched_update_live(s, b, hb);
    json_decref(hb);
    r = request("{\"command\": [\"x\"], \"resources\": {\"memory\": \"1 GiB\"}}");
    px_fleet_sched_set_state(s, 3, PX_FLEET_NODE_DRAINING);
    ex = place(s, r, "m3", &placed);
    assert_string_equal(decision_node(ex, 0), "a");
    const char *reason;
    assert_non_null(rejected_detail(ex, "huge", &reason));
    assert_string_equal(reason, "draining");
    json_decref(ex);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

static void test_topology_picks_fastest_linked_devices(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    add_node(
        s, "{\"name\": \"n\", \"cpus\": 8, \"memory\": \"32 GiB\", \"node\": {\"devices\": ["
           "{\"id\": \"g0\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"memory\": \"80 GB\"},"
           "{\"id\": \"g1\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"memory\": \"80 GB\"},"
           "{\"id\": \"g2\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"memory\": \"80 GB\"}]},"
           "\"links\": [{\"from\": \"g0\", \"to\": \"g1\", \"bandwidth\": \"32 GB/s\"},"
           "{\"from\": \"g1\", \"to\": \"g2\", \"bandwidth\": \"450 GB/s\"},"
           "{\"from\": \"g0\", \"to\": \"g2\", \"bandwidth\": \"32 GB/s\"}]}");
    px_fleet_request *r = request("{\"command\": [\"a\"], \"resources\": {\"gpus\": 2}}");
    px_fleet_explanation *e;
    px_assert_ok(px_fleet_sched_place(s, r, "t1", &e, NULL), (px_err *)NULL);
    assert_true(px_fleet_explanation_placed(e));
    json_t *devs = px_fleet_explanation_devices(e, s, 0);
    assert_int_equal(json_array_size(devs), 2);
    assert_string_equal(json_string_value(json_array_get(devs, 0)), "g1");
    assert_string_equal(json_string_value(json_array_get(devs, 1)), "g2");
    json_decref(devs);
    px_fleet_explanation_free(e);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

static void test_gang_placement_is_all_or_nothing(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    add_node(s, GPU_NODE("g1", "nvidia", "9.0", "80 GB", "2.3.1"));
    add_node(s, GPU_NODE("g2", "nvidia", "9.0", "80 GB", "2.3.1"));
    add_node(s, "{\"name\": \"c1\", \"cpus\": 8, \"memory\": \"32 GiB\"}");
    px_fleet_request *three = request("{\"command\": [\"a\"], \"nodes\": 3, \"launcher\": "
                                      "\"torchrun\", \"resources\": {\"gpus\": 1}}");
    assert_int_equal(px_fleet_request_members(three), 3);
    bool placed;
    json_t *ex = place(s, three, "gang3", &placed);
    assert_false(placed);
    px_assert_contains(
        json_string_value(json_object_get(json_object_get(ex, "decision"), "summary")),
        "2 of 3 nodes fit");
    json_decref(ex);
    /* Nothing was allocated by the failed gang: a two-member gang fits. */
    assert_int_equal(px_fleet_sched_release(s, "gang3"), 0);
    px_fleet_request *two =
        request("{\"command\": [\"a\"], \"nodes\": 2, \"resources\": {\"gpus\": 1}}");
    ex = place(s, two, "gang2", &placed);
    assert_true(placed);
    assert_non_null(decision_node(ex, 1));
    assert_string_not_equal(decision_node(ex, 0), decision_node(ex, 1));
    json_decref(ex);
    assert_int_equal(px_fleet_sched_release(s, "gang2"), 2);
    px_fleet_request_free(three);
    px_fleet_request_free(two);
    px_fleet_sched_free(s);
}

static void test_registration_is_validated_and_bounded(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    const char *bad[] = {
        "[]",
        "{\"name\": \"../etc\"}",
        "{\"name\": \"\"}",
        "{\"name\": \"n\", \"cpus\": -1}",
        "{\"name\": \"n\", \"memory\": \"lots\"}",
        "{\"name\": \"n\", \"node\": {\"devices\": [{\"class\": \"gpu\"}]}}",
        "{\"name\": \"n\", \"node\": {\"frameworks\": [{\"version\": \"1\"}]}}",
        "{\"name\": \"n\", \"node\": 7}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *reg = parse(bad[i]);
        px_err err;
        if (px_fleet_sched_add_node(s, reg, NULL, &err) == PX_OK)
            fail_msg("accepted bad registration %s", bad[i]);
        px_assert_contains(err.msg, "registration");
        json_decref(reg);
    }
    /* 65 devices are over the per-node limit. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"name\": \"many\", \"node\": {\"devices\": [");
    for (int i = 0; i < 65; i++)
        px_strbuf_addf(&sb, "%s{\"id\": \"g%d\"}", i ? "," : "", i);
    px_strbuf_adds(&sb, "]}}");
    json_t *reg = parse(sb.buf);
    px_err err;
    assert_int_equal(px_fleet_sched_add_node(s, reg, NULL, &err), PX_ELIMIT);
    json_decref(reg);
    px_strbuf_release(&sb);
    assert_int_equal(px_fleet_sched_n_nodes(s), 0);
    /* Registering again under the same name replaces the description. */
    add_node(s, "{\"name\": \"n\", \"cpus\": 2}");
    add_node(s, "{\"name\": \"n\", \"cpus\": 4}");
    assert_int_equal(px_fleet_sched_n_nodes(s), 1);
    px_fleet_sched_free(s);
}

static void test_many_nodes_index_and_rejected_list_bounded(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    for (int i = 0; i < 500; i++) {
        char reg[128];
        snprintf(reg, sizeof reg, "{\"name\": \"n%03d\", \"cpus\": 1, \"memory\": \"1 GiB\"}", i);
        add_node(s, reg);
    }
    size_t idx;
    assert_int_equal(px_fleet_sched_find_node(s, "n321", &idx, NULL), PX_OK);
    assert_int_equal(idx, 321);
    px_err e;
    assert_int_equal(px_fleet_sched_find_node(s, "n999", &idx, &e), PX_ENOTFOUND);
    assert_int_equal(e.code, PX_ENOTFOUND);
    assert_non_null(strstr(e.msg, "\"n999\" is not registered"));
    px_fleet_request *r = request("{\"command\": [\"a\"], \"resources\": {\"cpus\": 2}}");
    bool placed;
    json_t *ex = place(s, r, "big", &placed);
    assert_false(placed);
    assert_int_equal(json_array_size(json_object_get(ex, "rejected")), 100);
    assert_int_equal(json_integer_value(json_object_get(ex, "rejected_more")), 400);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(ex, "rejected_by_reason"), "cpus")),
        500);
    json_decref(ex);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

static void test_large_fleets_score_a_window_plus_model_holders(void **state)
{
    (void)state;
    px_fleet_sched *s;
    px_assert_ok(px_fleet_sched_new(&s, NULL), (px_err *)NULL);
    px_fleet_sched_set_score_limit(s, 20);
    for (int i = 0; i < 200; i++) {
        char reg[300];
        snprintf(reg, sizeof reg, "{\"name\": \"w%03d\", \"cpus\": 4, \"memory\": \"8 GiB\"%s}", i,
                 i == 150 ? ", \"resident\": "
                            "[\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"]"
                          : "");
        add_node(s, reg);
    }
    px_fleet_request *r =
        request("{\"command\": [\"a\"], \"model\": {\"digest\": "
                "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"}}");
    bool placed;
    json_t *ex = place(s, r, "w1", &placed);
    assert_true(placed);
    /* The model holder lies outside the first window and still wins. */
    assert_string_equal(decision_node(ex, 0), "w150");
    assert_int_equal(json_integer_value(json_object_get(ex, "nodes_feasible")), 200);
    assert_int_equal(json_integer_value(json_object_get(ex, "nodes_scored")), 11);
    px_assert_contains(
        json_string_value(json_object_get(json_object_get(ex, "decision"), "summary")),
        "scored 11 of 200 feasible nodes");
    json_decref(ex);
    px_fleet_request_free(r);
    /* Successive decisions score different windows. */
    r = request("{\"command\": [\"a\"]}");
    ex = place(s, r, "w2", &placed);
    const char *first = decision_node(ex, 0);
    json_t *ex2 = place(s, r, "w3", &placed);
    assert_string_not_equal(first, decision_node(ex2, 0));
    json_decref(ex);
    json_decref(ex2);
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_specifiers_follow_pep440),
        cmocka_unit_test(test_request_rejects_bad_specifications_with_pointer),
        cmocka_unit_test(test_filters_keep_every_node_reason),
        cmocka_unit_test(test_capability_and_cpu_memory_filters),
        cmocka_unit_test(test_scores_prefer_headroom_then_resident_model),
        cmocka_unit_test(test_topology_picks_fastest_linked_devices),
        cmocka_unit_test(test_gang_placement_is_all_or_nothing),
        cmocka_unit_test(test_registration_is_validated_and_bounded),
        cmocka_unit_test(test_many_nodes_index_and_rejected_list_bounded),
        cmocka_unit_test(test_large_fleets_score_a_window_plus_model_holders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
