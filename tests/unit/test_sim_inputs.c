/* The simulator's inputs: faults files, load specs, arrival traces, plan
 * documents with their inventory, and replay of a recorded simulation. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/sim.h"
#include "sim/sim_impl.h"

static void test_faults_file_round_trips(void **state)
{
    (void)state;
    const char *doc =
        "{\"schema\":\"plexus.faults/1\",\"description\":\"a bad afternoon\",\"faults\":["
        "{\"at\":\"12 s\",\"kind\":\"device-loss\",\"target\":\"n1.gpu0\"},"
        "{\"at\":\"5 s\",\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n1.gpu1\","
        "\"latency\":\"5 ms\",\"bandwidth_factor\":0.25,\"duration\":\"10 s\","
        "\"intermittent\":{\"period\":\"2 s\",\"duty\":0.5}},"
        "{\"kind\":\"thermal\",\"target\":\"*\",\"ambient\":\"45 C\"},"
        "{\"kind\":\"power-cap\",\"target\":\"n1.gpu1\",\"limit\":\"300 W\",\"at\":\"1 min\"},"
        "{\"kind\":\"domain-loss\",\"target\":\"rack-a\",\"at\":\"30 s\",\"duration\":\"5 s\"}]}";
    px_sim_faults f;
    px_err err;
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    assert_int_equal(f.n, 5);
    assert_int_equal(f.items[0].kind, PX_SIM_FAULT_DEVICE_LOSS);
    assert_float_equal(f.items[0].at_s, 12, 1e-12);
    assert_float_equal(f.items[1].latency_s, 0.005, 1e-12);
    assert_float_equal(f.items[1].bandwidth_factor, 0.25, 0);
    assert_float_equal(f.items[1].period_s, 2, 1e-12);
    assert_float_equal(f.items[1].duty, 0.5, 0);
    assert_float_equal(f.items[2].ambient_k, 318.15, 1e-9);
    assert_float_equal(f.items[3].power_limit_w, 300, 1e-9);
    assert_float_equal(f.items[3].at_s, 60, 1e-9);
    assert_float_equal(f.items[4].duration_s, 5, 1e-9);
    json_t *back = px_sim_faults_to_json(&f);
    char *text = px_json_dump_line(back);
    px_sim_faults g;
    px_assert_ok(px_sim_faults_parse(text, strlen(text), "back.json", &g, &err), &err);
    assert_int_equal(g.n, f.n);
    for (size_t i = 0; i < f.n; i++) {
        assert_int_equal(g.items[i].kind, f.items[i].kind);
        assert_string_equal(g.items[i].target, f.items[i].target);
        assert_float_equal(g.items[i].at_s, f.items[i].at_s, 1e-9);
        assert_float_equal(g.items[i].ambient_k, f.items[i].ambient_k, 1e-9);
    }
    free(text);
    json_decref(back);
    px_sim_faults_release(&g);
    px_sim_faults_release(&f);
}

static void expect_refused(const char *doc, const char *needle)
{
    px_sim_faults f;
    px_err err;
    px_err_clear(&err);
    px_status st = px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err);
    if (st == PX_OK)
        fail_msg("accepted: %s", doc);
    px_assert_contains(err.msg, needle);
    assert_null(f.items);
    assert_int_equal(f.n, 0);
}

#define HEAD "{\"schema\":\"plexus.faults/1\",\"faults\":["

static void test_faults_file_refuses_hostile_input_with_messages(void **state)
{
    (void)state;
    expect_refused("", "f.json");
    expect_refused("[1,2]", "expected an object");
    expect_refused("{\"faults\":[]}", "/schema");
    expect_refused("{\"schema\":\"plexus.faults/2\",\"faults\":[]}", "plexus.faults/1");
    expect_refused("{\"schema\":\"plexus.faults/1\"}", "/faults");
    expect_refused("{\"schema\":\"plexus.faults/1\",\"faults\":[],\"x\":1}", "/x");
    expect_refused(HEAD "{\"kind\":\"meteor\",\"target\":\"a\"}]}", "unknown kind \"meteor\"");
    expect_refused(HEAD "{\"kind\":\"device-loss\"}]}", "/faults/0/target");
    expect_refused(HEAD "{\"kind\":\"device-loss\",\"target\":\"*\"}]}", "only for thermal");
    expect_refused(HEAD "{\"kind\":\"device-loss\",\"target\":\"a\",\"at\":\"-5 s\"}]}",
                   "/faults/0/at");
    expect_refused(HEAD "{\"kind\":\"device-loss\",\"target\":\"a\",\"at\":\"5 W\"}]}",
                   "/faults/0/at");
    expect_refused(HEAD "{\"kind\":\"device-loss\",\"target\":\"a\",\"at\":5}]}",
                   "expected a string with a unit");
    expect_refused(HEAD "{\"kind\":\"device-loss\",\"target\":\"a\",\"ambient\":\"5 C\"}]}",
                   "/faults/0/ambient: not a member");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"ab\",\"latency\":\"1 ms\"}]}",
                   "FROM>TO");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b>c\",\"latency\":\"1 ms\"}]}",
                   "FROM>TO");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b\"}]}",
                   "latency, bandwidth_factor or both");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b\","
                        "\"bandwidth_factor\":1.5}]}",
                   "/faults/0/bandwidth_factor");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b\","
                        "\"bandwidth_factor\":0}]}",
                   "/faults/0/bandwidth_factor");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b\",\"latency\":\"1 ms\","
                        "\"intermittent\":{\"period\":\"2 s\"}}]}",
                   "intermittent/duty");
    expect_refused(HEAD "{\"kind\":\"link-degrade\",\"target\":\"a>b\",\"latency\":\"1 ms\","
                        "\"intermittent\":{\"period\":\"2 s\",\"duty\":0.5,\"x\":1}}]}",
                   "intermittent/x");
    expect_refused(HEAD "{\"kind\":\"thermal\",\"target\":\"a\"}]}", "/faults/0/ambient");
    expect_refused(HEAD "{\"kind\":\"thermal\",\"target\":\"a\",\"ambient\":\"5000 C\"}]}",
                   "out of range");
    expect_refused(HEAD "{\"kind\":\"power-cap\",\"target\":\"a\",\"limit\":\"3 s\"}]}",
                   "/faults/0/limit");
    expect_refused(HEAD "1]}", "/faults/0: expected an object");
    /* Deep nesting and oversized documents are cut off by the limits. */
    char deep[256];
    size_t k = px_strlcpy(deep, HEAD, sizeof deep);
    for (int i = 0; i < 20; i++)
        deep[k++] = '[';
    deep[k] = 0;
    expect_refused(deep, "f.json");
    size_t big = (1u << 20) + 10;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[big] = 0;
    px_sim_faults f;
    px_err err;
    assert_int_equal(px_sim_faults_parse(huge, big, "huge.json", &f, &err), PX_ELIMIT);
    free(huge);
    /* Over the fault count. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, HEAD);
    for (int i = 0; i < 10001; i++)
        px_strbuf_addf(&sb, "%s{\"kind\":\"device-loss\",\"target\":\"a\"}", i ? "," : "");
    px_strbuf_adds(&sb, "]}");
    assert_int_not_equal(px_sim_faults_parse(sb.buf, sb.len, "many.json", &f, &err), PX_OK);
    px_strbuf_release(&sb);
}

static void test_fault_targets_must_exist_in_the_plan(void **state)
{
    (void)state;
    px_sim_device dev = {.id = "n1.gpu0", .power_active_w = 100};
    px_sim_stage st = {.devices = {0},
                       .n_devices = 1,
                       .decode_s = 0.01,
                       .prefill_s = 0.01,
                       .weight_fraction = 1,
                       .link = PX_SIM_NONE};
    px_sim_replica rep = {.stages = &st, .n_stages = 1, .batch = 1, .micro_batches = 1};
    px_sim_plan plan = {.devices = &dev,
                        .n_devices = 1,
                        .replicas = &rep,
                        .n_replicas = 1,
                        .context = 128,
                        .prompt_tokens = 16,
                        .gen_tokens = 4};
    px_sim_load load;
    px_err err;
    px_assert_ok(px_sim_load_parse("poisson:rate=1,prompt=16,gen=4", &load, &err), &err);
    px_sim_options o;
    px_sim_options_default(&o);
    o.replications = 1;
    o.duration_s = 5;
    const char *docs[] = {
        HEAD "{\"kind\":\"device-loss\",\"target\":\"n9.gpu0\"}]}",
        HEAD "{\"kind\":\"domain-loss\",\"target\":\"rack-z\"}]}",
        HEAD "{\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n9.gpu9\",\"latency\":\"1 ms\"}]}",
    };
    const char *want[] = {"faults[0].target: device \"n9.gpu0\"", "domain \"rack-z\"",
                          "\"n9.gpu9\""};
    for (size_t i = 0; i < PX_ARRAY_LEN(docs); i++) {
        px_sim_faults f;
        px_assert_ok(px_sim_faults_parse(docs[i], strlen(docs[i]), "f.json", &f, &err), &err);
        px_sim_result res;
        assert_int_equal(px_sim_run(&plan, &load, &f, &o, &res, &err), PX_ENOTFOUND);
        px_assert_contains(err.msg, want[i]);
        px_sim_faults_release(&f);
    }
    /* Bad options are named. */
    o.replications = 0;
    px_sim_result res;
    assert_int_equal(px_sim_run(&plan, &load, NULL, &o, &res, &err), PX_EINVAL);
    px_assert_contains(err.msg, "replications");
    px_sim_load_release(&load);
}

static void test_load_specs_parse_and_refuse_with_messages(void **state)
{
    (void)state;
    px_sim_load l;
    px_err err;
    px_assert_ok(px_sim_load_parse("poisson:rate=5,prompt=128,gen=64", &l, &err), &err);
    assert_int_equal(l.kind, PX_SIM_LOAD_POISSON);
    assert_float_equal(l.rate, 5, 0);
    assert_int_equal(l.prompt.a, 128);
    assert_int_equal(l.gen.a, 64);
    px_assert_ok(px_sim_load_parse("bursty:rate=2.5,burst=4,period=30s,prompt=uniform:64-256,"
                                   "gen=exp:128",
                                   &l, &err),
                 &err);
    assert_int_equal(l.kind, PX_SIM_LOAD_BURSTY);
    assert_float_equal(l.period_s, 30, 1e-12);
    assert_int_equal(l.prompt.kind, PX_SIM_LEN_UNIFORM);
    assert_int_equal(l.prompt.b, 256);
    assert_int_equal(l.gen.kind, PX_SIM_LEN_EXPONENTIAL);
    px_rng r;
    px_rng_seed(&r, 3);
    for (int i = 0; i < 1000; i++) {
        uint32_t v = px__sim_len_draw(&l.prompt, &r);
        assert_true(v >= 64 && v <= 256);
    }
    struct {
        const char *spec, *needle;
    } bad[] = {
        {"", "empty"},
        {"uniform:rate=5", "unknown kind"},
        {"poisson:prompt=5", "rate=R"},
        {"poisson:rate=-1", "rate="},
        {"poisson:rate=nan", "rate="},
        {"poisson:rate=5,prompt=0", "prompt="},
        {"poisson:rate=5,prompt=uniform:9-3", "prompt="},
        {"poisson:rate=5,gen=exp:", "gen="},
        {"poisson:rate=5,burst=3", "unknown key \"burst\""},
        {"bursty:rate=5,burst=1", "above 1"},
        {"poisson:rate=5,zzz", "KEY=VALUE"},
        {"poisson:rate=5,prompt=99999999999", "prompt="},
        {"trace:", "names no file"},
        {"trace:/nonexistent/arrivals.jsonl", "arrivals.jsonl"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        px_err_clear(&err);
        if (px_sim_load_parse(bad[i].spec, &l, &err) == PX_OK)
            fail_msg("accepted \"%s\"", bad[i].spec);
        px_assert_contains(err.msg, bad[i].needle);
    }
    char *long_spec = malloc(5000);
    memset(long_spec, 'a', 4999);
    long_spec[4999] = 0;
    assert_int_equal(px_sim_load_parse(long_spec, &l, &err), PX_ELIMIT);
    free(long_spec);
}

static void test_arrival_traces_refuse_hostile_lines(void **state)
{
    (void)state;
    struct {
        const char *text, *needle;
    } bad[] = {
        {"", "no arrivals"},
        {"\n\n  \n", "no arrivals"},
        {"[1,2,3]\n", "t.jsonl:1: expected an object"},
        {"{\"t\":1,\"prompt_tokens\":4,\"gen_tokens\":4}\nnot json\n", "t.jsonl:2"},
        {"{\"t\":-1,\"prompt_tokens\":4,\"gen_tokens\":4}\n", "/t must be"},
        {"{\"t\":1,\"prompt_tokens\":0,\"gen_tokens\":4}\n", "/prompt_tokens"},
        {"{\"t\":1,\"prompt_tokens\":4,\"gen_tokens\":1.5}\n", "/gen_tokens"},
        {"{\"t\":1,\"prompt_tokens\":4,\"gen_tokens\":4,\"x\":1}\n", "unknown member \"x\""},
        {"{\"t\":2,\"prompt_tokens\":4,\"gen_tokens\":4}\n{\"t\":1,\"prompt_tokens\":4,"
         "\"gen_tokens\":4}\n",
         "t.jsonl:2: t = 1 comes before"},
        {"{\"t\":{\"a\":{\"b\":1}},\"prompt_tokens\":4,\"gen_tokens\":4}\n", "t.jsonl:1"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        px_sim_load l;
        px_err err;
        px_err_clear(&err);
        if (px_sim_load_read_trace(bad[i].text, strlen(bad[i].text), "t.jsonl", &l, &err) == PX_OK)
            fail_msg("accepted trace %zu", i);
        px_assert_contains(err.msg, bad[i].needle);
        assert_null(l.arrivals);
    }
    char *line = malloc(6000);
    memset(line, ' ', 5999);
    line[5999] = 0;
    px_sim_load l;
    px_err err;
    assert_int_equal(px_sim_load_read_trace(line, 5999, "t.jsonl", &l, &err), PX_ELIMIT);
    free(line);
}

/* A two-node inventory: one rack, a contention group on the hosts' link. */
static const char inventory[] =
    "{\"schema\":\"plexus.inventory/1\",\"name\":\"sim-pair\","
    "\"domains\":[{\"id\":\"rack-a\",\"kind\":\"rack\",\"mtbf\":\"100000 h\"}],"
    "\"nodes\":[{\"id\":\"n1\",\"domains\":[\"rack-a\"],\"devices\":[{\"id\":\"gpu0\","
    "\"class\":\"gpu\",\"compute\":{\"bf16\":\"100 TFLOP/s\"},"
    "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"24 GB\",\"bandwidth\":\"1 "
    "TB/s\"}],"
    "\"power\":{\"tdp\":\"350 W\",\"idle\":\"50 W\"},"
    "\"thermal\":{\"limit\":\"85 C\",\"time_constant\":\"20 s\"},\"mtbf\":\"50000 h\","
    "\"cost\":\"1.8 $/h\"}]},"
    "{\"id\":\"n2\",\"domains\":[\"rack-a\"],\"devices\":[{\"id\":\"gpu0\",\"class\":\"gpu\","
    "\"compute\":{\"bf16\":\"100 TFLOP/s\"},"
    "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"24 GB\",\"bandwidth\":\"1 "
    "TB/s\"}],"
    "\"power\":{\"tdp\":\"350 W\",\"idle\":\"50 W\"}}]}],"
    "\"links\":[{\"from\":\"n1.gpu0\",\"to\":\"n2.gpu0\",\"kind\":\"ethernet\","
    "\"bandwidth\":\"10 GB/s\",\"latency\":\"10 us\",\"contention\":\"tor-1\","
    "\"bidirectional\":true}]}";

/* The members of a plan document the simulator reads. */
static const char plan_doc[] =
    "{\"schema\":\"plexus.plan/1\",\"id\":\"abc123\",\"emulated\":false,"
    "\"workload\":{\"batch\":4,\"micro_batches\":2,\"context\":2048,\"prompt_tokens\":256,"
    "\"gen_tokens\":64},"
    "\"batching\":{\"batch_per_replica\":4,\"micro_batches\":2,\"replicas\":1},"
    "\"predictions\":{\"throughput_tokens_per_s\":{\"p50\":150.0},\"power_w\":700.0},"
    "\"stages\":[{\"devices\":[\"n1.gpu0\"],\"memory_per_device\":{\"weights\":8e9,\"kv\":2e9},"
    "\"predicted\":{\"decode_s_per_token\":{\"p50\":0.012,\"p99\":0.015},"
    "\"prefill_s\":{\"p50\":0.2,\"p99\":0.25},\"transfer_s_per_token\":0.0002}},"
    "{\"devices\":[\"n2.gpu0\"],\"memory_per_device\":{\"weights\":8e9,\"kv\":2e9},"
    "\"predicted\":{\"decode_s_per_token\":{\"p50\":0.012,\"p99\":0.015},"
    "\"prefill_s\":{\"p50\":0.2,\"p99\":0.25},\"transfer_s_per_token\":0}}],"
    "\"replicas\":[{\"index\":0,\"tpot_s\":0.025,\"stages\":[{\"devices\":[\"n1.gpu0\"]},"
    "{\"devices\":[\"n2.gpu0\"]}]}]}";

static void test_plan_document_and_inventory_become_a_simulation(void **state)
{
    (void)state;
    px_err err;
    px_hw_graph *g;
    px_assert_ok(
        px_hw_graph_from_json(inventory, strlen(inventory), "inv.json", NULL, &g, NULL, &err),
        &err);
    json_t *doc;
    px_assert_ok(px_json_parse(plan_doc, strlen(plan_doc), "plan.json", NULL, &doc, &err), &err);
    px_sim_plan p;
    px_assert_ok(px_sim_plan_from_json(doc, g, &p, &err), &err);
    assert_int_equal(p.n_devices, 2);
    assert_int_equal(p.n_domains, 1);
    assert_string_equal(p.devices[0].id, "n1.gpu0");
    assert_float_equal(p.devices[0].power_active_w, 350, 1e-9);
    assert_float_equal(p.devices[0].thermal_limit_k, 358.15, 1e-9);
    assert_float_equal(p.devices[0].thermal_tau_s, 20, 1e-9);
    assert_float_equal(p.devices[0].mtbf_s, 50000 * 3600.0, 1);
    assert_float_equal(p.devices[0].usd_per_hour, 1.8, 1e-9);
    assert_int_equal(p.devices[1].n_domains, 1);
    assert_float_equal(p.domains[0].mtbf_s, 100000 * 3600.0, 1);
    assert_int_equal(p.n_replicas, 1);
    assert_int_equal(p.replicas[0].batch, 4);
    assert_int_equal(p.replicas[0].micro_batches, 2);
    const px_sim_stage *s0 = &p.replicas[0].stages[0];
    assert_float_equal(s0->decode_s, 0.012, 1e-12);
    assert_float_equal(s0->weight_fraction, 0.8, 1e-12);
    assert_int_equal(p.n_links, 1);
    assert_string_equal(p.links[s0->link].id, "contention:tor-1");
    assert_true(s0->xfer_bytes > 0);
    assert_float_equal(s0->xfer_latency_s, 10e-6, 1e-9);
    px_assert_ok(px_sim_plan_check(&p, &err), &err);

    px_sim_load load;
    px_assert_ok(px_sim_load_parse("poisson:rate=3,prompt=256,gen=32", &load, &err), &err);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 30;
    o.replications = 2;
    px_sim_result res;
    px_assert_ok(px_sim_run(&p, &load, NULL, &o, &res, &err), &err);
    assert_true(res.mean.completed > 0);
    assert_true(res.mean.usd > 0);
    assert_true(res.mean.energy_j > 0);
    px_strbuf sb = PX_STRBUF_INIT;
    px_assert_ok(px_sim_result_report(&res, &p, &sb), &err);
    px_assert_contains(sb.buf, "time to first token p50");
    px_strbuf_release(&sb);
    px_sim_result_release(&res);

    /* Without the inventory: the plan's devices with assumed figures. */
    px_sim_plan q;
    px_assert_ok(px_sim_plan_from_json(doc, NULL, &q, &err), &err);
    assert_int_equal(q.n_devices, 2);
    assert_float_equal(q.devices[0].power_active_w, 350, 1e-9);
    px_sim_plan_release(&q);

    /* A replica at a batch of its own is simulated at it; one out of
     * range is refused, naming the replica. */
    json_t *own = json_deep_copy(doc);
    json_t *r0 = json_array_get(json_object_get(own, "replicas"), 0);
    json_object_set_new(r0, "batch", json_integer(2));
    json_object_set_new(r0, "micro_batches", json_integer(1));
    px_assert_ok(px_sim_plan_from_json(own, g, &q, &err), &err);
    assert_int_equal(q.replicas[0].batch, 2);
    assert_int_equal(q.replicas[0].micro_batches, 1);
    px_sim_plan_release(&q);
    json_object_set_new(r0, "micro_batches", json_integer(3));
    assert_int_equal(px_sim_plan_from_json(own, g, &q, &err), PX_EPARSE);
    px_assert_contains(err.msg, "/replicas/0");
    json_decref(own);

    /* A plan naming a device the inventory lacks is refused by name. */
    json_t *bad = json_deep_copy(doc);
    json_t *rs = json_object_get(json_array_get(json_object_get(bad, "replicas"), 0), "stages");
    json_array_set_new(json_object_get(json_array_get(rs, 1), "devices"), 0,
                       json_string("n7.gpu3"));
    assert_int_equal(px_sim_plan_from_json(bad, g, &q, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "n7.gpu3");
    json_decref(bad);
    bad = json_pack("{s:s}", "schema", "plexus.plan/9");
    assert_int_equal(px_sim_plan_from_json(bad, g, &q, &err), PX_EPARSE);
    px_assert_contains(err.msg, "/schema");
    json_decref(bad);

    /* Replay: the recorded simulation is re-derived identically. */
    const char *dir = px_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/sim.trace", dir);
    px_trace_writer *w;
    px_assert_ok(px_trace_writer_open(path, "simulate", &w, &err), &err);
    json_t *inv = NULL;
    px_assert_ok(px_json_parse(inventory, strlen(inventory), "inv", NULL, &inv, &err), &err);
    json_t *ld = px_sim_load_to_json(&load), *od = px_sim_options_to_json(&o);
    px_assert_ok(px_sim_run(&p, &load, NULL, &o, &res, &err), &err);
    json_t *out = px_sim_result_to_json(&res, &p);
    px_sim_result_release(&res);
    px_assert_ok(px_trace_input(w, "plan", doc, NULL, &err), &err);
    px_assert_ok(px_trace_input(w, "inventory", inv, NULL, &err), &err);
    px_assert_ok(px_trace_input(w, "load", ld, NULL, &err), &err);
    px_assert_ok(px_trace_input(w, "options", od, NULL, &err), &err);
    json_t *inputs = json_pack("{s:s}", "plan", "abc123");
    px_assert_ok(px_trace_decision(w, "simulate", inputs, out, NULL, &err), &err);
    px_assert_ok(px_trace_writer_close(w, &err), &err);
    size_t n_der;
    const px_trace_deriver *der = px_sim_replay_derivers(&n_der);
    assert_int_equal(n_der, 1);
    px_trace_replay_report rep;
    px_assert_ok(px_trace_replay(path, der, n_der, NULL, &rep, &err), &err);
    assert_int_equal(rep.n_identical, 1);
    assert_false(rep.diverged);
    json_decref(inputs);
    json_decref(out);
    json_decref(ld);
    json_decref(od);
    json_decref(inv);

    px_sim_load_release(&load);
    px_sim_plan_release(&p);
    json_decref(doc);
    px_hw_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults_file_round_trips),
        cmocka_unit_test(test_faults_file_refuses_hostile_input_with_messages),
        cmocka_unit_test(test_fault_targets_must_exist_in_the_plan),
        cmocka_unit_test(test_load_specs_parse_and_refuse_with_messages),
        cmocka_unit_test(test_arrival_traces_refuse_hostile_lines),
        cmocka_unit_test(test_plan_document_and_inventory_become_a_simulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
