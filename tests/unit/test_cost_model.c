/* The cost model: roofline times, transfers, all-reduce, memory items,
 * energy, money, reliability, uncertainty and bounds. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"

/* One GPU (24 GiB, 1 TB/s, 400 TFLOP/s bf16, 2 $/h, MTBF 1000 h) and a
 * host CPU on node n1; optionally a second GPU on n2 behind `link`. */
static const char *gpu_json =
    "{\"id\":\"%s\",\"class\":\"gpu\",\"model\":\"%s\",\"backend\":\"cuda\","
    "\"compute\":{\"bf16\":\"400 TFLOP/s\",\"f16\":\"400 TFLOP/s\",\"f32\":\"50 TFLOP/s\"},"
    "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"%s\",\"bandwidth\":"
    "{\"value\":\"%s\",\"uncertainty\":0.05}}],"
    "\"power\":{\"tdp\":\"300 W\",\"idle\":\"50 W\"},\"cost\":\"2 $/h\",\"mtbf\":\"1000 h\"}";

static char *gpu(const char *id, const char *model, const char *cap, const char *bw)
{
    char *s = px_asprintf(gpu_json, id, model, cap, bw);
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

/* n1: gpu0 (+ gpu1 when two) with NVLink between them; n2: gpu0 behind a
 * link of the given bandwidth and latency from n1. */
static px_hw_graph *fleet_json(bool two_local, const char *remote_bw, const char *remote_lat,
                               const char *nvl_lat)
{
    char *g0 = gpu("gpu0", "card", "24 GiB", "1 TB/s");
    char *g1 = gpu("gpu1", "card", "24 GiB", "1 TB/s");
    char *r0 = gpu("gpu0", "card", "24 GiB", "1 TB/s");
    char *doc = px_asprintf(
        "{\"schema\":\"plexus.inventory/1\",\"name\":\"t\",\"nodes\":["
        "{\"id\":\"n1\",\"memory\":[{\"id\":\"ddr0\",\"kind\":\"ddr\",\"capacity\":\"256 GiB\","
        "\"bandwidth\":\"200 GB/s\"}],\"devices\":[%s%s%s,"
        "{\"id\":\"cpu0\",\"class\":\"cpu\",\"model\":\"host\",\"backend\":\"cpu\","
        "\"compute\":{\"f32\":\"2 TFLOP/s\"}}]},"
        "{\"id\":\"n2\",\"devices\":[%s]}],"
        "\"links\":[{\"id\":\"p0\",\"from\":\"n1.gpu0\",\"to\":\"n1\",\"kind\":\"pcie4\","
        "\"bandwidth\":\"32 GB/s\",\"latency\":\"2 us\"},"
        "{\"id\":\"p2\",\"from\":\"n2.gpu0\",\"to\":\"n2\",\"kind\":\"pcie4\","
        "\"bandwidth\":\"32 GB/s\",\"latency\":\"2 us\"},"
        "{\"id\":\"net\",\"from\":\"n1\",\"to\":\"n2\",\"kind\":\"ethernet\","
        "\"bandwidth\":\"%s\",\"latency\":\"%s\"}%s%s%s]}",
        g0, two_local ? "," : "", two_local ? g1 : "", r0, remote_bw, remote_lat,
        two_local ? ",{\"id\":\"nvl\",\"from\":\"n1.gpu0\",\"to\":\"n1.gpu1\",\"kind\":"
                    "\"nvlink4\",\"bandwidth\":\"300 GB/s\",\"latency\":\""
                  : "",
        two_local ? nvl_lat : "", two_local ? "\"}" : "");
    px_hw_graph *g = load(doc);
    free(g0);
    free(g1);
    free(r0);
    free(doc);
    return g;
}

typedef struct fixture {
    px_hw_graph *graph;
    px_ir_model *ir;
    px_cost_fleet *fleet;
    px_cost_model *model;
    px_cost_params params;
    px_cost_workload wl;
} fixture;

static void setup_fixture(fixture *fx, px_hw_graph *g, const char *preset, px_dtype dt)
{
    px_err err;
    memset(fx, 0, sizeof *fx);
    fx->graph = g;
    px_cost_params_default(&fx->params);
    px_assert_ok(px_ir_preset_new(preset, dt, NULL, &fx->ir, &err), &err);
    px_assert_ok(px_cost_fleet_new(g, &fx->params, &fx->fleet, &err), &err);
    px_assert_ok(px_cost_model_new(fx->ir, &fx->model, &err), &err);
    fx->wl = px_cost_workload_default();
}

static void teardown_fixture(fixture *fx)
{
    px_cost_model_free(fx->model);
    px_cost_fleet_free(fx->fleet);
    px_ir_model_free(fx->ir);
    px_hw_graph_free(fx->graph);
}

static uint32_t dev(const fixture *fx, const char *id)
{
    for (uint32_t i = 0; i < fx->fleet->n_devices; i++)
        if (!strcmp(fx->fleet->devices[i].id, id))
            return i;
    fail_msg("no device %s", id);
    return 0;
}

static px_cost_pipeline one_stage(const fixture *fx, uint32_t d)
{
    px_cost_pipeline p;
    memset(&p, 0, sizeof p);
    p.n_stages = 1;
    p.stages[0] = px_cost_stage_make(d, fx->model);
    return p;
}

static px_cost_pipeline two_stages(const fixture *fx, uint32_t a, uint32_t b, int32_t cut)
{
    px_cost_pipeline p = one_stage(fx, a);
    p.n_stages = 2;
    p.stages[1] = p.stages[0];
    p.stages[0].last = cut - 1;
    p.stages[0].head = false;
    p.stages[1].devices[0] = b;
    p.stages[1].first = cut;
    p.stages[1].embedding = false;
    return p;
}

static px_cost_estimate *eval(fixture *fx, const px_cost_pipeline *p)
{
    static px_cost_estimate est;
    px_err err;
    px_assert_ok(
        px_cost_eval_pipeline(fx->fleet, fx->model, &fx->params, &fx->wl, p, NULL, &est, &err),
        &err);
    return &est;
}

static void test_cost_decode_is_memory_bound_at_batch_one(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_OK);
    assert_int_equal(e->stages[0].bind, PX_COST_BIND_MEMORY_BW);
    double kv = 0;
    for (uint32_t i = 0; i < fx.model->n_layers; i++)
        kv += fx.model->layers[i].kv_bytes_token;
    double bytes = fx.model->total_bytes - fx.model->embedding.attn_bytes + kv * fx.wl.context;
    double want = bytes / (1e12 * fx.params.eff_mem);
    if (fabs(e->tpot_s - want) > 0.05 * want)
        fail_msg("tpot %g s, roofline says %g s", e->tpot_s, want);
    assert_true(e->throughput > 0.99 / e->tpot_s && e->throughput < 1.01 / e->tpot_s);
    teardown_fixture(&fx);
}

static void test_cost_memory_is_itemized_and_sums(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_estimate *e = eval(&fx, &p);
    const px_cost_mem *m = &e->stages[0].mem;
    double sum = m->weights + m->kv + m->activations + m->workspace + m->runtime;
    assert_true(fabs(sum - m->total) <= 1e-6 * m->total);
    assert_true(m->runtime >= 500.0 * 1024 * 1024 - 1); /* CUDA context assumption */
    assert_true(fabs(m->weights - fx.model->total_bytes) < 0.01 * fx.model->total_bytes ||
                m->weights < fx.model->total_bytes); /* tied tables count once */
    assert_true(m->limit <= 24.0 * 1073741824 * 0.9 + 1);
    teardown_fixture(&fx);
}

static void test_cost_refuses_model_larger_than_memory(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_F32);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_NO_MEMORY);
    assert_true(e->why_bytes > 1e9);
    assert_string_equal(px_cost_infeasible_name(e->why), "memory");
    teardown_fixture(&fx);
}

static void test_cost_kv_on_host_is_slower_and_frees_device_memory(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    fx.wl.batch = 4;
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_estimate a = *eval(&fx, &p);
    p.stages[0].kv = PX_COST_KV_HOST;
    px_cost_estimate *b = eval(&fx, &p);
    assert_true(b->tpot_s > a.tpot_s);
    assert_true(b->stages[0].kv_host_s > 0);
    assert_true(b->stages[0].mem.kv == 0 && a.stages[0].mem.kv > 0);
    assert_true(b->stages[0].host_bytes > 0);
    teardown_fixture(&fx);
}

/* Host memory belongs to a node: two stages on one node that each keep a
 * KV cache within the node's memory, but not both together, do not fit. */
static void test_cost_host_kv_is_summed_per_node(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(true, "100 Gbit/s", "5 us", "2 us"), "llama-3-8b",
                  PX_DTYPE_COUNT_);
    fx.wl.context = 65536;
    fx.wl.batch = 1;
    px_cost_pipeline p = two_stages(&fx, dev(&fx, "n1.gpu0"), dev(&fx, "n1.gpu1"), 16);
    p.stages[0].kv = p.stages[1].kv = PX_COST_KV_HOST;
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_OK);
    double per_seq = PX_MAX(e->stages[0].host_bytes, e->stages[1].host_bytes);
    double limit = fx.fleet->devices[dev(&fx, "n1.gpu0")].host_mem * (1.0 - fx.params.headroom);
    assert_true(per_seq > 0 && limit > 0);
    fx.wl.batch = (uint32_t)ceil(0.6 * limit / per_seq);
    e = eval(&fx, &p);
    /* Each stage alone is within the node's memory; together they are not. */
    assert_true(e->stages[0].host_bytes <= limit && e->stages[1].host_bytes <= limit);
    assert_true(e->stages[0].host_bytes + e->stages[1].host_bytes > limit);
    assert_int_equal(e->why, PX_COST_NO_MEMORY);
    assert_true(e->why_host);
    assert_true(e->why_bytes > 0);
    /* Half the batch fits both. */
    fx.wl.batch /= 2;
    e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_OK);
    teardown_fixture(&fx);
}

/* The time per attended position is the decode step's slope in the
 * positions its rows attend: memory-bound, one position's KV bytes over
 * the bandwidth; with the cache on the host, more. */
static void test_cost_prices_each_attended_position(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    fx.wl.batch = 8;
    fx.wl.context = 8192;
    fx.wl.prompt_tokens = 1024;
    fx.wl.gen_tokens = 256;
    px_cost_estimate *e = eval(&fx, &p);
    double a = e->stages[0].attention_pos_s, dec = e->stages[0].decode_s;
    double kv = 0;
    for (uint32_t i = 0; i < fx.model->n_layers; i++)
        kv += fx.model->layers[i].kv_bytes_token;
    assert_float_equal(a, kv / (1e12 * fx.params.eff_mem), 1e-6 * a);
    /* A row attends its prompt and half its new tokens on average: the
     * step's growth from 2048 more prompt positions is that slope. */
    fx.wl.prompt_tokens = 3072;
    e = eval(&fx, &p);
    double slope = (e->stages[0].decode_s - dec) / (8.0 * 2048);
    assert_float_equal(a, slope, 1e-3 * a);
    /* The context is what the cache holds, not what a step reads. */
    fx.wl.context = 4096;
    double held = e->stages[0].decode_s;
    e = eval(&fx, &p);
    assert_float_equal(e->stages[0].decode_s, held, 1e-9 * held);
    fx.wl.context = 2048; /* a shorter context caps what a row attends */
    e = eval(&fx, &p);
    assert_float_equal(px_cost_attended(&fx.wl), 2048, 0);
    assert_true(e->stages[0].decode_s < held);
    /* The cache on the host reads its positions over the host link too. */
    p.stages[0].kv = PX_COST_KV_HOST;
    fx.wl.context = 2048;
    e = eval(&fx, &p);
    assert_true(e->stages[0].attention_pos_s > 0);
    teardown_fixture(&fx);
}

/* Continuous batching prefills new requests' prompts inside decode steps:
 * at batch 1 a sequence sees no other prefill (time per token is the
 * decode step), at a larger batch it sees the others', more with longer
 * prompts and fewer with longer generations, and the throughput is the
 * batch over the step that carries every sequence's share. */
static void test_cost_prefill_interferes_with_decode(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    fx.wl.batch = 1;
    fx.wl.context = 2048;
    fx.wl.prompt_tokens = 1024;
    fx.wl.gen_tokens = 128;
    px_cost_estimate *e = eval(&fx, &p);
    assert_true(e->tpot_s == e->decode_step_s);
    assert_true(e->step_s > e->decode_step_s);
    assert_true(fabs(e->throughput * e->step_s - 1.0) < 1e-9);
    fx.wl.batch = 32;
    e = eval(&fx, &p);
    double tpot32 = e->tpot_s, step32 = e->step_s, dec32 = e->decode_step_s;
    assert_true(tpot32 > dec32 * 1.05);
    assert_true(step32 >= tpot32);
    assert_true(fabs(e->throughput * e->step_s - 32.0) < 1e-9);
    assert_true(e->stages[0].serve_tpot_s > e->stages[0].decode_s);
    /* Longer prompts interfere more; longer generations less. */
    fx.wl.prompt_tokens = 2000;
    assert_true(eval(&fx, &p)->tpot_s > tpot32);
    fx.wl.prompt_tokens = 1024;
    fx.wl.gen_tokens = 4096;
    e = eval(&fx, &p);
    assert_true(e->tpot_s < tpot32);
    assert_true(e->tpot_s - e->decode_step_s < (tpot32 - dec32) / 16);
    teardown_fixture(&fx);
}

/* The Monte Carlo of a layout evaluates every replica under each sample:
 * its throughput is the replicas' sum and its time per token the slowest
 * replica's, so two identical replicas give twice one's throughput and
 * the same time per token, and the two intervals agree with the batch. */
static void test_cost_layout_uncertainty_sums_replicas(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(true, "100 Gbit/s", "5 us", "2 us"), "llama-3-8b",
                  PX_DTYPE_COUNT_);
    fx.wl.batch = 4;
    px_cost_pipeline pipes[2] = {one_stage(&fx, dev(&fx, "n1.gpu0")),
                                 one_stage(&fx, dev(&fx, "n1.gpu1"))};
    px_cost_workload wls[2] = {fx.wl, fx.wl};
    px_cost_uncertain one, two;
    px_err err;
    px_assert_ok(
        px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &fx.wl, &pipes[0], 0, 0, &one, &err),
        &err);
    px_assert_ok(
        px_cost_uncertainty_layout(fx.fleet, fx.model, &fx.params, wls, pipes, 2, 0, 0, &two, &err),
        &err);
    /* Each sample's throughput is at least one replica's and at most two
     * of the slowest: the medians lie in between, near twice one's. */
    assert_true(two.throughput.p50 > 1.8 * one.throughput.p50);
    assert_true(two.throughput.p50 < 2.2 * one.throughput.p50);
    assert_true(two.tpot_s.p50 >= one.tpot_s.p50);
    /* Time per token and throughput describe the same draws: batch x
     * replicas over the time per token, within the prefill share and the
     * spread between the two devices' draws. */
    double implied = 2 * 4 / two.tpot_s.p50;
    assert_true(two.throughput.p50 < implied * 1.25);
    assert_true(two.throughput.p50 > implied * 0.8);
    /* A replica at a smaller batch adds less. */
    wls[1].batch = 1;
    px_cost_uncertain mixed;
    px_assert_ok(px_cost_uncertainty_layout(fx.fleet, fx.model, &fx.params, wls, pipes, 2, 0, 0,
                                            &mixed, &err),
                 &err);
    assert_true(mixed.throughput.p50 < two.throughput.p50);
    assert_true(mixed.throughput.p50 > one.throughput.p50);
    assert_int_equal(px_cost_uncertainty_layout(fx.fleet, fx.model, &fx.params, wls, pipes, 0, 0, 0,
                                                &mixed, &err),
                     PX_EINVAL);
    teardown_fixture(&fx);
}

/* One host: a cpu device and two emulated ones (compute slowdown 4, memory
 * slowdown 2), with `cpu` as the node's cpu member ("" for none). */
static px_hw_graph *host_json(const char *cpu)
{
    static const char *emu =
        "{\"id\":\"%s\",\"class\":\"gpu\",\"model\":\"emu\",\"emulated\":true,"
        "\"backend\":\"emu\",\"compute\":{\"f32\":\"500 GFLOP/s\"},\"memory\":[{\"id\":"
        "\"m\",\"kind\":\"hbm\",\"capacity\":\"64 GiB\",\"bandwidth\":\"50 GB/s\"}],"
        "\"emu\":{\"compute_slowdown\":4,\"memory_slowdown\":2}}";
    char *e0 = px_asprintf(emu, "emu0"), *e1 = px_asprintf(emu, "emu1");
    char *doc = px_asprintf(
        "{\"schema\":\"plexus.inventory/1\",\"name\":\"h\",\"nodes\":[{\"id\":\"n1\"%s%s,"
        "\"memory\":[{\"id\":\"ddr0\",\"kind\":\"ddr\",\"capacity\":\"256 GiB\","
        "\"bandwidth\":\"100 GB/s\"}],\"devices\":[{\"id\":\"cpu0\",\"class\":\"cpu\","
        "\"backend\":\"cpu\",\"compute\":{\"f32\":\"1 TFLOP/s\"}},%s,%s]}],\"links\":["
        "{\"from\":\"n1.cpu0\",\"to\":\"n1.emu0\",\"kind\":\"loopback\",\"bandwidth\":"
        "\"10 GB/s\",\"latency\":\"5 us\"},{\"from\":\"n1.emu0\",\"to\":\"n1.emu1\","
        "\"kind\":\"loopback\",\"bandwidth\":\"10 GB/s\",\"latency\":\"5 us\"}]}",
        cpu[0] ? ",\"cpu\":" : "", cpu, e0, e1);
    px_hw_graph *g = load(doc);
    free(e0);
    free(e1);
    free(doc);
    return g;
}

static px_cost_pipeline three_on_host(const fixture *fx)
{
    px_cost_pipeline p = two_stages(fx, dev(fx, "n1.cpu0"), dev(fx, "n1.emu0"), 10);
    p.n_stages = 3;
    p.stages[2] = p.stages[1];
    p.stages[1].last = 19;
    p.stages[1].head = false;
    p.stages[2].devices[0] = dev(fx, "n1.emu1");
    p.stages[2].first = 20;
    return p;
}

/* Stages on one host's cores: a step lasts at least the core-seconds its
 * micro-batches ask of them (a cpu device all its time, an emulated one
 * 1/slowdown of it) over the node's cores; without cores declared, no
 * floor; with many, the same step as without. */
static void test_cost_host_cores_floor_the_step(void **state)
{
    (void)state;
    px_cost_estimate none, many, one;
    const char *cpus[] = {"", "{\"cores\":512}", "{\"cores\":1}"};
    px_cost_estimate *out[] = {&none, &many, &one};
    for (int k = 0; k < 3; k++) {
        fixture fx;
        setup_fixture(&fx, host_json(cpus[k]), "llama-3-8b", PX_DTYPE_COUNT_);
        fx.wl.batch = 6;
        fx.wl.micro_batches = 3;
        px_cost_pipeline p = three_on_host(&fx);
        *out[k] = *eval(&fx, &p);
        assert_int_equal(out[k]->why, PX_COST_OK);
        if (k == 2) {
            double want = 0;
            for (uint32_t i = 0; i < 3; i++) {
                const px_cost_stage_est *e = &one.stages[i];
                bool cpu = i == 0;
                double slow = e->compute_s > e->mem_s ? 4.0 : 2.0;
                want += 3 * e->serve_s * (cpu ? 1.0 : 1.0 / slow);
                /* The host's work per step of each micro-batch, beside
                 * the first stage. */
                if (i == 0)
                    want += 3 * one.executor_s;
                assert_true(fabs(e->host_core_s - e->serve_s * (cpu ? 1.0 : 1.0 / slow)) <=
                            1e-12 * e->serve_s);
            }
            assert_true(fabs(one.host_cores_s - want) <= 1e-9 * want);
            assert_int_equal(one.host_node, fx.fleet->devices[dev(&fx, "n1.cpu0")].node);
        }
        teardown_fixture(&fx);
    }
    assert_true(none.host_cores_s == 0);
    assert_int_equal(none.host_node, PX_HW_NONE);
    assert_true(many.host_cores_s > 0 && many.host_cores_s < many.step_s);
    assert_true(many.step_s == none.step_s && many.tpot_s == none.tpot_s);
    /* One core: the floor binds the step, the time per token and the
     * throughput (batch over the step). */
    assert_true(one.step_s == one.host_cores_s && one.step_s > none.step_s);
    assert_true(one.tpot_s >= one.host_cores_s);
    assert_true(fabs(one.throughput - 6 / one.step_s) <= 1e-9 * one.throughput);
}

/* Replicas on one host share its cores: where their uses add up past 1,
 * each slows by the sum; other hosts and undeclared ones are untouched. */
static void test_cost_replicas_share_a_hosts_cores(void **state)
{
    (void)state;
    const uint32_t node[] = {0, 0, PX_HW_NONE, 1, 2, 2};
    const double use[] = {0.7, 0.6, 0.9, 0.5, 0.5, 0.4};
    double k[6];
    px_cost_host_shares(node, use, 6, k);
    assert_true(fabs(k[0] - 1.3) < 1e-12 && fabs(k[1] - 1.3) < 1e-12);
    assert_true(k[2] == 1 && k[3] == 1 && k[4] == 1 && k[5] == 1);
}

/* A device that names no backend is planned for its vendor's stack. */
static void test_cost_default_backend_follows_the_vendor(void **state)
{
    (void)state;
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, "nvidia"), "cuda");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, "AMD"), "rocm");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, "apple"), "metal");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, "intel"), "oneapi");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, NULL), "unknown");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_GPU, "acme"), "unknown");
    assert_string_equal(px_cost_default_backend(PX_HW_CLASS_CPU, "amd"), "cpu");
}

static void test_cost_falls_back_to_a_supported_dtype(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.cpu0"));
    p.stages[0].prec.activations = PX_DTYPE_BF16; /* the CPU states f32 only */
    px_cost_estimate *e = eval(&fx, &p);
    assert_true(e->stages[0].dtype_fallback);
    assert_int_equal(e->stages[0].compute_dtype, PX_HW_DTYPE_F32);
    teardown_fixture(&fx);
}

static void test_cost_slow_link_adds_transfer_time(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "10 Mbit/s", "20 ms", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = two_stages(&fx, dev(&fx, "n1.gpu0"), dev(&fx, "n2.gpu0"), 16);
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_OK);
    double bytes = fx.model->layers[15].act_bytes_token;
    double min = 20e-3 + bytes / (10e6 / 8);
    assert_true(e->stages[0].xfer_s >= min);
    assert_true(e->transfer_s >= e->stages[0].xfer_s + 20e-3); /* the token goes back too */
    assert_true(e->tpot_s > e->stages[0].decode_s + e->stages[1].decode_s + min);
    teardown_fixture(&fx);
}

/* The logits come back from the last stage to the executor beside the
 * first: rows x vocab x 4 bytes over the path, a resource of the cycle
 * like a hop; with one stage there is no way back to price. */
static void test_cost_logits_come_back_over_the_link(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "1 Gbit/s", "100 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    fx.wl.batch = 32;
    fx.wl.micro_batches = 2;
    px_cost_pipeline p = two_stages(&fx, dev(&fx, "n1.gpu0"), dev(&fx, "n2.gpu0"), 16);
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(e->why, PX_COST_OK);
    /* 16 rows of 128,256 logits, 8.2 MB over 1 Gbit/s (the narrowest
     * link of the way back), after 104 us of latency (the network's and
     * each PCIe link's). */
    double bytes = 16.0 * fx.model->vocab * 4.0;
    double want = 104e-6 + bytes / (1e9 / 8 * fx.params.eff_link);
    if (!(fabs(e->return_s - want) <= 1e-9 * want))
        fail_msg("return_s %.9g, expected %.9g", e->return_s, want);
    assert_true(e->transfer_s >= e->stages[0].xfer_s + e->return_s);
    /* Each micro-batch crosses it once a step: two of them take at least
     * twice its time. */
    assert_true(e->step_s >= 2 * e->return_s);
    assert_true(e->tpot_s >= e->return_s + e->stages[0].decode_s + e->stages[1].decode_s);
    px_cost_pipeline one = one_stage(&fx, dev(&fx, "n1.gpu0"));
    e = eval(&fx, &one);
    assert_true(e->return_s == 0);
    teardown_fixture(&fx);
}

static void test_cost_allreduce_grows_with_link_latency(void **state)
{
    (void)state;
    double ar[2];
    const char *lat[2] = {"1 us", "200 us"};
    for (int k = 0; k < 2; k++) {
        fixture fx;
        setup_fixture(&fx, fleet_json(true, "100 Gbit/s", "5 us", lat[k]), "llama-3-8b",
                      PX_DTYPE_COUNT_);
        px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
        p.stages[0].devices[1] = dev(&fx, "n1.gpu1");
        p.stages[0].tp = 2;
        px_cost_estimate *e = eval(&fx, &p);
        assert_int_equal(e->why, PX_COST_OK);
        ar[k] = e->stages[0].allreduce_s;
        assert_true(ar[k] > 0);
        teardown_fixture(&fx);
    }
    /* 2 all-reduces per block, 2 (p-1) latency terms each. */
    assert_true(ar[1] - ar[0] > 32 * 2 * 2 * 199e-6 * 0.99);
}

static void test_cost_money_energy_and_reliability(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_estimate *e = eval(&fx, &p);
    assert_true(fabs(e->usd_per_hour - 2.0) < 1e-9);
    /* Money and energy per token over the served step (batch 1: the step
     * carries its own prompt's prefill share). */
    assert_true(fabs(e->usd_per_token - 2.0 / 3600 * e->step_s) < 1e-12);
    assert_true(fabs(e->tokens_per_usd - 3600 * e->throughput / 2.0) < 1e-6 * e->tokens_per_usd);
    /* Busy all the time at batch 1: active power. */
    assert_true(e->power_w > 299 && e->power_w <= 300.0001);
    assert_true(fabs(e->joules_per_token - e->power_w * e->step_s) < 1e-9);
    double want = 1.0 - exp(-24.0 / 1000.0);
    assert_true(fabs(e->p_fail - want) < 1e-9);
    teardown_fixture(&fx);
}

static void test_cost_uncertainty_is_seeded_and_ordered(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_uncertain a, b, c;
    px_err err;
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &fx.wl, &p, 0.02, 0, &a, &err),
                 &err);
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &fx.wl, &p, 0.02, 0, &b, &err),
                 &err);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a.tpot_s.lo <= a.tpot_s.p50 && a.tpot_s.p50 <= a.tpot_s.p99 &&
                a.tpot_s.p99 <= a.tpot_s.hi);
    assert_true(a.throughput.p99 <= a.throughput.p50); /* pessimistic tail of a rate */
    assert_true(a.tpot_s.hi > a.tpot_s.lo);
    assert_true(a.p_meet_slo >= 0 && a.p_meet_slo <= 1);
    fx.params.seed = 7;
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &fx.wl, &p, 0.02, 0, &c, &err),
                 &err);
    assert_true(c.tpot_s.hi != a.tpot_s.hi || c.tpot_s.lo != a.tpot_s.lo);
    teardown_fixture(&fx);
}

/* A model larger than the fleet's device memory: the bound reads what the
 * devices cannot hold over host links, so it lies well above the bytes
 * over the aggregate bandwidth, yet below a placement that spills the KV
 * cache; the throughput bound is finite and below the compute ceiling. */
static void test_cost_lower_bound_counts_capacity(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-70b", PX_DTYPE_COUNT_);
    px_cost_bound bound;
    px_cost_lower_bound(fx.fleet, fx.model, &fx.params, &fx.wl, NULL, 0, &bound);
    double bw = 0;
    for (uint32_t i = 0; i < fx.fleet->n_devices; i++)
        if (fx.fleet->devices[i].mem_free > 0)
            bw += fx.fleet->devices[i].mem_bw * fx.params.eff_mem_hi;
    double naive = fx.model->total_bytes / bw;
    assert_true(bound.tpot_mem_s > 1.5 * naive);
    assert_true(isfinite(bound.tpot_s));
    assert_true(bound.throughput > 0 && isfinite(bound.throughput));
    fx.wl.batch = 64;
    px_cost_bound big;
    px_cost_lower_bound(fx.fleet, fx.model, &fx.params, &fx.wl, NULL, 0, &big);
    assert_true(big.tpot_s >= bound.tpot_s);
    teardown_fixture(&fx);
}

static void test_cost_lower_bound_is_below_every_prediction(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(true, "100 Gbit/s", "5 us", "2 us"), "llama-3-8b",
                  PX_DTYPE_COUNT_);
    px_cost_bound bound;
    px_cost_lower_bound(fx.fleet, fx.model, &fx.params, &fx.wl, NULL, 0, &bound);
    assert_true(bound.tpot_s > 0);
    uint32_t ids[3] = {dev(&fx, "n1.gpu0"), dev(&fx, "n1.gpu1"), dev(&fx, "n2.gpu0")};
    for (int a = 0; a < 3; a++) {
        px_cost_pipeline p = one_stage(&fx, ids[a]);
        px_cost_estimate *e = eval(&fx, &p);
        assert_true(e->tpot_s >= bound.tpot_s);
        assert_true(px_cost_pipeline_bound(fx.fleet, fx.model, &fx.params, &fx.wl, &p) <=
                    e->tpot_s);
        for (int b = 0; b < 3; b++) {
            if (a == b)
                continue;
            px_cost_pipeline q = two_stages(&fx, ids[a], ids[b], 10);
            e = eval(&fx, &q);
            assert_true(e->why != PX_COST_OK || e->tpot_s >= bound.tpot_s);
        }
    }
    teardown_fixture(&fx);
}

static void test_cost_stage_quick_matches_pipeline_eval(void **state)
{
    (void)state;
    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "mixtral-8x7b", PX_DTYPE_Q4_0);
    fx.wl.batch = 3;
    px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.gpu0"));
    px_cost_prefix pre;
    px_err err;
    px_assert_ok(px_cost_prefix_init(&pre, fx.model, &p.stages[0].prec, &fx.wl, &err), &err);
    px_cost_stage_est q;
    px_cost_infeasible r = px_cost_stage_quick(fx.fleet, &pre, &fx.params, &p.stages[0], &q);
    px_cost_estimate *e = eval(&fx, &p);
    assert_int_equal(r, e->why);
    assert_true(fabs(q.decode_s - e->stages[0].decode_s) <= 1e-9 * e->stages[0].decode_s);
    assert_true(fabs(q.mem.total - e->stages[0].mem.total) <= 1e-6 * e->stages[0].mem.total);
    px_cost_prefix_release(&pre);
    teardown_fixture(&fx);
}

static void test_cost_block_quantized_weights_run_int8_products(void **state)
{
    (void)state;
    px_cost_device d = {0};
    d.peak[PX_HW_DTYPE_F32] = 1e12;
    px_hw_dtype cd;
    bool fb;
    /* Without int8: the activations' dtype, as before. */
    assert_true(px_cost_compute_dtype(&d, PX_DTYPE_Q4_K, PX_DTYPE_F32, &cd, &fb));
    assert_int_equal(cd, PX_HW_DTYPE_F32);
    assert_false(fb);
    d.peak[PX_HW_DTYPE_INT8] = 4e12;
    static const px_dtype blocks[] = {PX_DTYPE_Q4_0, PX_DTYPE_Q5_0, PX_DTYPE_Q2_K, PX_DTYPE_Q3_K,
                                      PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};
    for (size_t i = 0; i < PX_ARRAY_LEN(blocks); i++) {
        assert_true(px_cost_compute_dtype(&d, blocks[i], PX_DTYPE_F32, &cd, &fb));
        assert_int_equal(cd, PX_HW_DTYPE_INT8);
        assert_false(fb);
    }
    /* Q8_0 and float weights multiply f32 activations in float. */
    assert_true(px_cost_compute_dtype(&d, PX_DTYPE_Q8_0, PX_DTYPE_F32, &cd, &fb));
    assert_int_equal(cd, PX_HW_DTYPE_F32);
    assert_true(px_cost_compute_dtype(&d, PX_DTYPE_BF16, PX_DTYPE_F32, &cd, &fb));
    assert_int_equal(cd, PX_HW_DTYPE_F32);
}

/* The cost follows the weights' format: on a bandwidth-bound device a
 * decode step reads each format's own bytes (q4_K_M and the other 4-bit
 * files faster than q8_0, q8_0 than f16), stays memory-bound at batch one
 * whatever the format (Q2_K's few bits included), and takes as long as
 * its bytes over the bandwidth; a prefill of block-quantized weights runs
 * at the device's int8 rate where it has one. */
static void test_cost_follows_the_weight_format(void **state)
{
    (void)state;
    static const px_dtype formats[] = {PX_DTYPE_F16,  PX_DTYPE_Q8_0, PX_DTYPE_Q6_K, PX_DTYPE_Q5_K,
                                       PX_DTYPE_Q4_K, PX_DTYPE_Q4_0, PX_DTYPE_Q3_K, PX_DTYPE_Q2_K};
    double prev_tpot = INFINITY, prev_bytes = INFINITY;
    for (size_t i = 0; i < PX_ARRAY_LEN(formats); i++) {
        fixture fx;
        setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", formats[i]);
        px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.cpu0"));
        px_cost_estimate *e = eval(&fx, &p);
        assert_int_equal(e->why, PX_COST_OK);
        if (e->stages[0].bind != PX_COST_BIND_MEMORY_BW)
            fail_msg("%s: decode at batch one bound by %d, not memory bandwidth",
                     px_dtype_name(formats[i]), (int)e->stages[0].bind);
        /* Every format's bytes per weight, from its blocks. */
        double bpw = fx.model->total_bytes / fx.model->total_params;
        double want = px_dtype_bytes_per_elem(formats[i]);
        if (fabs(bpw - want) > 0.02 * want)
            fail_msg("%s: %.4f bytes per weight, the format holds %.4f", px_dtype_name(formats[i]),
                     bpw, want);
        /* Q4_0 and Q4_K hold 4.5 bits a weight alike: the same time. */
        bool same = fx.model->total_bytes == prev_bytes;
        if (same ? fabs(e->tpot_s - prev_tpot) > 1e-9 * prev_tpot
                 : !(e->tpot_s < prev_tpot) || !(fx.model->total_bytes < prev_bytes))
            fail_msg("%s: decode %g s (%g bytes), not faster than the wider format's %g s",
                     px_dtype_name(formats[i]), e->tpot_s, fx.model->total_bytes, prev_tpot);
        double kv = 0;
        for (uint32_t l = 0; l < fx.model->n_layers; l++)
            kv += fx.model->layers[l].kv_bytes_token;
        double bytes =
            fx.model->total_bytes - fx.model->embedding.attn_bytes + kv * px_cost_attended(&fx.wl);
        double ddr = 200e9 * fx.params.eff_mem;
        if (fabs(e->tpot_s - bytes / ddr) > 0.1 * bytes / ddr)
            fail_msg("%s: decode %g s, its bytes over the bandwidth %g s",
                     px_dtype_name(formats[i]), e->tpot_s, bytes / ddr);
        prev_tpot = e->tpot_s;
        prev_bytes = fx.model->total_bytes;
        teardown_fixture(&fx);
    }

    /* A device with int8 products: the prefill of Q4_K weights runs at
     * its int8 rate, eight times its float rate here; q8_0's at f32. */
    const char *inv =
        "{\"schema\":\"plexus.inventory/1\",\"name\":\"t\",\"nodes\":[{\"id\":\"n1\","
        "\"devices\":[{\"id\":\"npu0\",\"class\":\"npu\",\"model\":\"m\","
        "\"backend\":\"cpu\",\"compute\":{\"f32\":\"10 TFLOP/s\",\"int8\":\"80 TOP/s\"},"
        "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"64 GiB\","
        "\"bandwidth\":\"1 TB/s\"}]}]}]}";
    double pf[2];
    static const px_dtype pair[2] = {PX_DTYPE_Q8_0, PX_DTYPE_Q4_K};
    for (int i = 0; i < 2; i++) {
        fixture fx;
        setup_fixture(&fx, load(inv), "llama-3-8b", pair[i]);
        fx.wl.prompt_tokens = 2048;
        px_cost_pipeline p = one_stage(&fx, dev(&fx, "n1.npu0"));
        px_cost_estimate *e = eval(&fx, &p);
        assert_int_equal(e->why, PX_COST_OK);
        assert_int_equal(e->stages[0].compute_dtype, i ? PX_HW_DTYPE_INT8 : PX_HW_DTYPE_F32);
        pf[i] = e->stages[0].prefill_s;
        teardown_fixture(&fx);
    }
    if (!(pf[1] < pf[0] / 4))
        fail_msg("prefill of 2048 tokens: q4_K %g s, q8_0 %g s: int8 products not priced", pf[1],
                 pf[0]);
}

static void test_cost_refuses_bad_parameters_and_layouts(void **state)
{
    (void)state;
    px_cost_params p;
    px_err err;
    px_cost_params_default(&p);
    px_assert_ok(px_cost_params_check(&p, &err), &err);
    /* The calibrated mode needs its overlay (test_cost_calib.c). */
    p.mode = PX_COST_CALIBRATED;
    assert_int_equal(px_cost_params_check(&p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "calibrated");
    px_cost_params_default(&p);
    p.headroom = 2;
    assert_int_equal(px_cost_params_check(&p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "headroom");

    fixture fx;
    setup_fixture(&fx, fleet_json(false, "100 Gbit/s", "5 us", ""), "llama-3-8b", PX_DTYPE_COUNT_);
    px_cost_pipeline bad = one_stage(&fx, 0);
    bad.stages[0].tp = 0;
    px_cost_estimate est;
    assert_int_equal(
        px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &fx.wl, &bad, NULL, &est, &err),
        PX_EINVAL);
    bad = one_stage(&fx, 0);
    bad.stages[0].devices[0] = 999;
    assert_int_equal(
        px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &fx.wl, &bad, NULL, &est, &err),
        PX_EINVAL);
    /* A gap in the layers is infeasible, not a crash. */
    bad = two_stages(&fx, dev(&fx, "n1.gpu0"), dev(&fx, "n2.gpu0"), 16);
    bad.stages[1].first = 18;
    px_cost_estimate *e = eval(&fx, &bad);
    assert_int_equal(e->why, PX_COST_BAD_LAYOUT);
    json_t *a = px_cost_assumptions_json(fx.fleet, fx.model, &fx.params);
    assert_non_null(a);
    char *text = px_json_dump_canonical(a);
    px_assert_contains(text, "70-85%");
    free(text);
    json_decref(a);
    teardown_fixture(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_decode_is_memory_bound_at_batch_one),
        cmocka_unit_test(test_cost_memory_is_itemized_and_sums),
        cmocka_unit_test(test_cost_refuses_model_larger_than_memory),
        cmocka_unit_test(test_cost_kv_on_host_is_slower_and_frees_device_memory),
        cmocka_unit_test(test_cost_host_kv_is_summed_per_node),
        cmocka_unit_test(test_cost_prices_each_attended_position),
        cmocka_unit_test(test_cost_prefill_interferes_with_decode),
        cmocka_unit_test(test_cost_layout_uncertainty_sums_replicas),
        cmocka_unit_test(test_cost_default_backend_follows_the_vendor),
        cmocka_unit_test(test_cost_falls_back_to_a_supported_dtype),
        cmocka_unit_test(test_cost_slow_link_adds_transfer_time),
        cmocka_unit_test(test_cost_logits_come_back_over_the_link),
        cmocka_unit_test(test_cost_allreduce_grows_with_link_latency),
        cmocka_unit_test(test_cost_money_energy_and_reliability),
        cmocka_unit_test(test_cost_uncertainty_is_seeded_and_ordered),
        cmocka_unit_test(test_cost_lower_bound_counts_capacity),
        cmocka_unit_test(test_cost_lower_bound_is_below_every_prediction),
        cmocka_unit_test(test_cost_stage_quick_matches_pipeline_eval),
        cmocka_unit_test(test_cost_block_quantized_weights_run_int8_products),
        cmocka_unit_test(test_cost_follows_the_weight_format),
        cmocka_unit_test(test_cost_refuses_bad_parameters_and_layouts),
        cmocka_unit_test(test_cost_host_cores_floor_the_step),
        cmocka_unit_test(test_cost_replicas_share_a_hosts_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
