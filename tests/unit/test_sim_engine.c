/* The simulator's engine: event order, processor sharing, the thermal
 * model, determinism, queueing theory, saturation, failures and hooks. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/sim.h"
#include "sim/sim_impl.h"

/* A hand-built plan: n_rep replicas of n_stages single-device stages, each
 * replica on its own devices; every device in domain rack0 (replicas
 * 0..half-1) or rack1. */
typedef struct test_plan {
    px_sim_plan plan;
    px_sim_device devices[16];
    px_sim_domain domains[2];
    px_sim_link links[16];
    px_sim_replica replicas[8];
    px_sim_stage stages[8][4];
} test_plan;

static void make_plan(test_plan *tp, uint32_t n_rep, uint32_t n_stages, uint32_t batch,
                      double decode_s, double prefill_s)
{
    memset(tp, 0, sizeof *tp);
    px_sim_plan *p = &tp->plan;
    p->devices = tp->devices;
    p->domains = tp->domains;
    p->links = tp->links;
    p->replicas = tp->replicas;
    p->n_replicas = n_rep;
    p->n_devices = n_rep * n_stages;
    p->n_domains = 2;
    p->context = 1024;
    p->prompt_tokens = 128;
    p->gen_tokens = 64;
    snprintf(p->id, sizeof p->id, "test-plan");
    snprintf(tp->domains[0].id, PX_SIM_ID_LEN, "rack0");
    snprintf(tp->domains[1].id, PX_SIM_ID_LEN, "rack1");
    for (uint32_t d = 0; d < p->n_devices; d++) {
        px_sim_device *dev = &tp->devices[d];
        snprintf(dev->id, sizeof dev->id, "n%u.gpu%u", d / n_stages, d % n_stages);
        dev->power_active_w = 300;
        dev->power_idle_w = 75;
        dev->usd_per_hour = 3.6;
        dev->n_domains = 1;
        dev->domains[0] = (d / n_stages) < (n_rep + 1) / 2 ? 0 : 1;
    }
    for (uint32_t r = 0; r < n_rep; r++) {
        px_sim_replica *rep = &tp->replicas[r];
        rep->stages = tp->stages[r];
        rep->n_stages = n_stages;
        rep->batch = batch;
        rep->micro_batches = 1;
        for (uint32_t i = 0; i < n_stages; i++) {
            px_sim_stage *s = &tp->stages[r][i];
            s->devices[0] = r * n_stages + i;
            s->n_devices = 1;
            s->decode_s = decode_s;
            s->decode_p99_s = decode_s;
            s->prefill_s = prefill_s;
            s->prefill_p99_s = prefill_s;
            s->weight_fraction = 1;
            s->link = PX_SIM_NONE;
            s->next_device = PX_SIM_NONE;
        }
    }
}

static px_sim_load poisson(double rate, uint32_t prompt, uint32_t gen)
{
    px_sim_load l;
    memset(&l, 0, sizeof l);
    l.kind = PX_SIM_LOAD_POISSON;
    l.rate = rate;
    l.prompt = (px_sim_len){PX_SIM_LEN_FIXED, prompt, 0};
    l.gen = (px_sim_len){PX_SIM_LEN_FIXED, gen, 0};
    return l;
}

static void test_queue_orders_by_time_then_insertion(void **state)
{
    (void)state;
    px__sim_queue q;
    assert_int_equal(px__sim_queue_init(&q, 4), PX_OK);
    assert_int_equal(px__sim_queue_push(&q, 2.0, 1, 0, 0), PX_OK);
    assert_int_equal(px__sim_queue_push(&q, 2.0, 2, 0, 0), PX_OK);
    assert_int_equal(px__sim_queue_push(&q, 1.0, 9, 0, 0), PX_OK);
    assert_int_equal(px__sim_queue_push(&q, 2.0, 3, 0, 0), PX_OK);
    px__sim_event ev;
    uint32_t want[] = {9, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        assert_true(px__sim_queue_pop(&q, &ev));
        assert_int_equal(ev.type, want[i]);
    }
    assert_false(px__sim_queue_pop(&q, &ev));
    /* Many ties among random times, growing past the initial size. */
    px_rng r;
    px_rng_seed(&r, 7);
    for (uint32_t i = 0; i < 20000; i++)
        assert_int_equal(px__sim_queue_push(&q, (double)px_rng_below(&r, 50), i, 0, 0), PX_OK);
    double last_t = -1;
    uint32_t last_type = 0;
    for (uint32_t i = 0; i < 20000; i++) {
        assert_true(px__sim_queue_pop(&q, &ev));
        assert_true(ev.t >= last_t);
        if (ev.t == last_t)
            assert_true(ev.type > last_type); /* inserted later, popped later */
        last_t = ev.t;
        last_type = ev.type;
    }
    px__sim_queue_release(&q);
}

static void test_two_transfers_in_one_domain_each_get_half_the_bandwidth(void **state)
{
    (void)state;
    px__sim_ps d;
    assert_int_equal(px__sim_ps_init(&d, 100.0, 4), PX_OK);
    assert_int_equal(px__sim_ps_add(&d, 0, 1, 100), PX_OK);
    assert_int_equal(px__sim_ps_add(&d, 0, 2, 100), PX_OK);
    double t;
    uint32_t f;
    assert_true(px__sim_ps_next(&d, &t, &f));
    assert_float_equal(t, 2.0, 1e-12); /* alone it would take 1 s */
    assert_int_equal(f, 1);
    px__sim_ps_advance(&d, t);
    px__sim_ps_remove(&d, 1);
    assert_true(px__sim_ps_next(&d, &t, &f));
    assert_float_equal(t, 2.0, 1e-12);
    assert_int_equal(f, 2);
    px__sim_ps_advance(&d, t);
    px__sim_ps_remove(&d, 2);
    assert_false(px__sim_ps_next(&d, &t, &f));
    /* A late arrival: A alone for 0.5 s (50 B), then both at 50 B/s. */
    assert_int_equal(px__sim_ps_add(&d, 10.0, 3, 100), PX_OK);
    assert_int_equal(px__sim_ps_add(&d, 10.5, 4, 100), PX_OK);
    assert_true(px__sim_ps_next(&d, &t, &f));
    assert_int_equal(f, 3);
    assert_float_equal(t, 11.5, 1e-9);
    px__sim_ps_advance(&d, t);
    px__sim_ps_remove(&d, 3);
    assert_true(px__sim_ps_next(&d, &t, &f));
    assert_float_equal(t, 12.0, 1e-9);
    /* Degradation halves the rate from 11.5 on. */
    px__sim_ps_set_bandwidth(&d, 11.5, 50.0);
    assert_true(px__sim_ps_next(&d, &t, &f));
    assert_float_equal(t, 12.5, 1e-9);
    px__sim_ps_release(&d);
}

static void test_thermal_converges_with_its_time_constant(void **state)
{
    (void)state;
    px__sim_thermal th = {.temp_k = 300, .t_last = 0, .power_w = 200, .max_k = 300};
    /* R = 0.25 K/W: steady state 50 K above ambient. */
    px__sim_thermal_advance(&th, 10.0, 300, 0.25, 10.0);
    assert_float_equal(th.temp_k, 300 + 50 * (1 - exp(-1.0)), 1e-9);
    px__sim_thermal_advance(&th, 400.0, 300, 0.25, 10.0);
    assert_float_equal(th.temp_k, 350, 1e-6);
    assert_float_equal(th.max_k, th.temp_k, 1e-12);
    /* Cooling at zero power goes back towards ambient with the same tau. */
    th.power_w = 0;
    px__sim_thermal_advance(&th, 410.0, 300, 0.25, 10.0);
    assert_float_equal(th.temp_k, 300 + 50 * exp(-1.0), 1e-6);
    /* The derived resistance puts full power 10 K under the limit. */
    px_sim_device d = {.power_active_w = 400, .thermal_limit_k = 358.15};
    assert_float_equal(298.15 + 400 * px__sim_thermal_r(&d), 348.15, 1e-9);
}

static char *run_json(const px_sim_plan *p, const px_sim_load *l, const px_sim_faults *f,
                      const px_sim_options *o)
{
    px_sim_result res;
    px_err err;
    px_assert_ok(px_sim_run(p, l, f, o, &res, &err), &err);
    json_t *doc = px_sim_result_to_json(&res, p);
    assert_non_null(doc);
    char *text = px_json_dump_canonical(doc);
    json_decref(doc);
    px_sim_result_release(&res);
    return text;
}

static void test_same_seed_gives_identical_results_and_other_seeds_differ(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 2, 2, 8, 0.02, 0.05);
    tp.stages[0][0].decode_p99_s = 0.03; /* some service noise */
    tp.stages[1][1].prefill_p99_s = 0.08;
    tp.links[0] = (px_sim_link){.id = "shared", .bandwidth = 1e6};
    tp.plan.n_links = 1;
    for (int r = 0; r < 2; r++) {
        tp.stages[r][0].link = 0;
        tp.stages[r][0].xfer_bytes = 4096;
        tp.stages[r][0].next_device = tp.stages[r][1].devices[0];
    }
    px_sim_load l = poisson(20, 128, 32);
    l.gen = (px_sim_len){PX_SIM_LEN_EXPONENTIAL, 32, 0};
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 30;
    o.replications = 3;
    char *a = run_json(&tp.plan, &l, NULL, &o);
    char *b = run_json(&tp.plan, &l, NULL, &o);
    assert_string_equal(a, b);
    o.seed = 2;
    char *c = run_json(&tp.plan, &l, NULL, &o);
    assert_true(strcmp(a, c) != 0);
    px_assert_contains(a, "\"tokens_per_s\"");
    free(a);
    free(b);
    free(c);
}

static void test_poisson_arrival_rate_is_recovered(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 64, 0.001, 0.001);
    px_sim_load l = poisson(50, 16, 1);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 1000;
    o.replications = 2;
    px_sim_result res;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &res, &err), &err);
    double rate = res.mean.arrivals / o.duration_s;
    assert_true(fabs(rate - 50) / 50 < 0.02);
    /* Bursty at the same mean rate keeps the mean but is burstier. */
    l.kind = PX_SIM_LOAD_BURSTY;
    l.burst = 4;
    l.period_s = 10;
    px_sim_result b;
    o.replications = 4;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &b, &err), &err);
    assert_true(fabs(b.mean.arrivals / o.duration_s - 50) / 50 < 0.10);
    px_sim_result_release(&b);
    px_sim_result_release(&res);
}

static void test_md1_mean_wait_matches_theory(void **state)
{
    (void)state;
    /* One server, batch 1, one token per request: the service is the
     * prefill, deterministic D = 0.1 s.  At rho = 0.5 the
     * Pollaczek-Khinchine mean wait is rho D / (2 (1 - rho)) = D / 2. */
    test_plan tp;
    make_plan(&tp, 1, 1, 1, 0.01, 0.1);
    px_sim_load l = poisson(5, 128, 1);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 2000;
    o.warmup_s = 20;
    o.replications = 4;
    px_sim_result res;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &res, &err), &err);
    double want = 0.1 + 0.05;
    assert_true(fabs(res.mean.ttft_mean_s - want) / want < 0.03);
    /* And the utilization is rho. */
    assert_true(fabs(res.mean.mean_utilization - 0.5) < 0.02);
    px_sim_result_release(&res);
}

static void test_throughput_saturates_at_the_predicted_capacity(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 8, 0.01, 0.001);
    tp.plan.predicted_throughput = 8 / 0.01;
    px_sim_load heavy = poisson(1000, 128, 256);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 60;
    o.warmup_s = 5;
    o.replications = 2;
    o.queue_limit = 1000;
    px_sim_result res;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &heavy, NULL, &o, &res, &err), &err);
    double cap = tp.plan.predicted_throughput;
    assert_true(res.mean.tokens_per_s <= cap * 1.001);
    assert_true(res.mean.tokens_per_s >= cap * 0.95);
    assert_true(res.mean.dropped > 0); /* the queue overflowed */
    px_sim_result_release(&res);
    /* Light load: throughput follows the offered load. */
    px_sim_load light = poisson(1, 128, 64);
    o.duration_s = 400;
    px_assert_ok(px_sim_run(&tp.plan, &light, NULL, &o, &res, &err), &err);
    assert_true(fabs(res.mean.tokens_per_s - 64) / 64 < 0.10);
    assert_true(res.mean.dropped == 0);
    px_sim_result_release(&res);
}

static void test_confidence_intervals_shrink_with_more_replications(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 4, 0.02, 0.05);
    tp.stages[0][0].decode_p99_s = 0.04;
    px_sim_load l = poisson(6, 128, 16);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 20;
    o.replications = 4;
    px_sim_result few, many;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &few, &err), &err);
    o.replications = 32;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &many, &err), &err);
    double w_few = few.hi.ttft_mean_s - few.lo.ttft_mean_s;
    double w_many = many.hi.ttft_mean_s - many.lo.ttft_mean_s;
    assert_true(w_few > 0 && w_many > 0);
    assert_true(w_many < w_few / 2);
    assert_true(many.lo.ttft_mean_s <= many.mean.ttft_mean_s &&
                many.mean.ttft_mean_s <= many.hi.ttft_mean_s);
    px_sim_result_release(&few);
    px_sim_result_release(&many);
    assert_float_equal(px_sim_t975(1), 12.7062047, 1e-6);
    assert_float_equal(px_sim_t975(100), 1.9839715, 1e-6);
}

static void test_rack_failure_takes_all_its_devices_down_at_once(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 2, 1, 4, 0.02, 0.02); /* replica 0 in rack0, replica 1 in rack1 */
    tp.domains[0].mtbf_s = 10;           /* rack0 fails early; devices alone never */
    px_sim_load l = poisson(20, 32, 64);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 200;
    o.replications = 1;
    px_sim_result res;
    px_err err;
    /* Make rack0 its own device: add a second device to rack0 (replica 0
     * has one stage: put a TP pair there). */
    tp.plan.n_devices = 3;
    snprintf(tp.devices[2].id, PX_SIM_ID_LEN, "n0.gpu1");
    tp.devices[2].n_domains = 1;
    tp.devices[2].domains[0] = 0;
    tp.devices[2].power_active_w = 300;
    tp.stages[0][0].devices[1] = 2;
    tp.stages[0][0].n_devices = 2;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &res, &err), &err);
    const px_sim_device_stats *d = res.devices;
    assert_true(d[0].lost_at_s >= 0);
    assert_float_equal(d[0].lost_at_s, d[2].lost_at_s, 0); /* together */
    assert_true(d[1].lost_at_s < 0);                       /* rack1 survives */
    assert_float_equal(res.mean.device_losses, 2, 0);
    assert_true(res.mean.completed > 0);
    px_sim_result_release(&res);

    /* The same by an injected fault, at a known time. */
    tp.domains[0].mtbf_s = 0;
    px_sim_faults f = {0};
    const char *doc = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"5 s\","
                      "\"kind\":\"domain-loss\",\"target\":\"rack0\"}]}";
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &res, &err), &err);
    assert_float_equal(res.devices[0].lost_at_s, 5.0, 0);
    assert_float_equal(res.devices[2].lost_at_s, 5.0, 0);
    assert_true(res.mean.failed > 0); /* in flight on replica 0 */
    px_sim_result_release(&res);
    px_sim_faults_release(&f);
}

typedef struct hook_seen {
    int calls;
    px_sim_fault_kind kind;
    uint32_t device;
    double t;
} hook_seen;

static void switch_on_loss(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                           px_sim_action *act)
{
    hook_seen *seen = ctx;
    seen->calls++;
    seen->kind = ev->kind;
    seen->device = ev->device;
    seen->t = px_sim_now(sim);
    act->kind = PX_SIM_ACT_SWITCH_PLAN;
    act->plan = 0;
    act->delay_s = 1.0;
    act->requeue = true;
}

static void test_device_loss_fails_requests_unless_a_hook_switches_plans(void **state)
{
    (void)state;
    test_plan tp, fb;
    make_plan(&tp, 1, 2, 8, 0.02, 0.05);
    /* The fallback: same device table, one stage on the surviving device. */
    make_plan(&fb, 1, 2, 8, 0.02, 0.05);
    fb.stages[0][0].devices[0] = 1;
    fb.replicas[0].n_stages = 1;
    fb.stages[0][0].decode_s = fb.stages[0][0].decode_p99_s = 0.04;
    px_sim_load l = poisson(10, 64, 32);
    px_sim_faults f = {0};
    px_err err;
    const char *doc = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"12 s\","
                      "\"kind\":\"device-loss\",\"target\":\"n0.gpu0\"}]}";
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 40;
    o.replications = 1;
    px_sim_result res;
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &res, &err), &err);
    assert_true(res.mean.failed > 0);
    double completed_without = res.mean.completed;
    assert_float_equal(res.devices[0].lost_at_s, 12.0, 0);
    px_sim_result_release(&res);

    hook_seen seen = {0};
    px_sim_hooks hooks = {
        .version = PX_SIM_HOOKS_VERSION, .on_fault = switch_on_loss, .ctx = &seen};
    o.hooks = &hooks;
    o.fallbacks = &fb.plan;
    o.n_fallbacks = 1;
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &res, &err), &err);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.kind, PX_SIM_FAULT_DEVICE_LOSS);
    assert_int_equal(seen.device, 0);
    assert_float_equal(seen.t, 12.0, 0);
    assert_float_equal(res.mean.failed, 0, 0);
    assert_float_equal(res.mean.plan_switches, 1, 0);
    assert_true(res.mean.completed > completed_without);
    px_sim_result_release(&res);

    /* A hook version this library does not speak is refused. */
    hooks.version = 99;
    assert_int_equal(px_sim_run(&tp.plan, &l, &f, &o, &res, &err), PX_EINVAL);
    px_assert_contains(err.msg, "hooks version");
    px_sim_faults_release(&f);
}

static void test_throttling_kicks_in_above_the_thermal_limit(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 8, 0.01, 0.001);
    tp.devices[0].thermal_limit_k = 358.15;
    tp.devices[0].thermal_tau_s = 5;
    px_sim_load l = poisson(1000, 128, 256);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 60;
    o.replications = 1;
    o.queue_limit = 100;
    px_sim_result cool, hot;
    px_err err;
    /* Derived resistance: full power sits 10 K under the limit. */
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &cool, &err), &err);
    assert_float_equal(cool.devices[0].throttled_s, 0, 0);
    assert_true(cool.devices[0].max_temp_k < 358.15);
    assert_true(cool.devices[0].max_temp_k > 340);
    /* A 45 C ambient puts the steady state 10 K over it. */
    px_sim_faults f = {0};
    const char *doc = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"kind\":\"thermal\","
                      "\"target\":\"*\",\"ambient\":\"45 C\"}]}";
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &hot, &err), &err);
    assert_true(hot.devices[0].throttled_s > 10);
    assert_true(hot.mean.tokens_per_s < cool.mean.tokens_per_s * 0.95);
    /* Throttling holds it near the limit instead of the 368 K steady state. */
    assert_true(hot.devices[0].max_temp_k < 364);
    px_sim_result_release(&cool);
    px_sim_result_release(&hot);
    px_sim_faults_release(&f);
}

static void test_link_degradation_and_contention_slow_transfers(void **state)
{
    (void)state;
    /* Two replicas of two stages whose hops share one 1 MB/s domain;
     * transfer-bound: 10 kB per step at batch 1. */
    test_plan tp;
    make_plan(&tp, 2, 2, 1, 0.001, 0.001);
    tp.links[0] = (px_sim_link){.id = "shared", .bandwidth = 1e6};
    tp.links[1] = (px_sim_link){.id = "private", .bandwidth = 1e6};
    tp.plan.n_links = 2;
    for (int r = 0; r < 2; r++) {
        tp.stages[r][0].link = 0;
        tp.stages[r][0].xfer_bytes = 10000;
        tp.stages[r][0].next_device = tp.stages[r][1].devices[0];
    }
    px_sim_load l = poisson(1000, 1, 200);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 20;
    o.replications = 1;
    o.queue_limit = 10;
    px_sim_result shared, apart, degraded;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &shared, &err), &err);
    tp.stages[1][0].link = 1;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &apart, &err), &err);
    /* Each step is ~2 ms compute + 10 ms transfer alone, ~20 ms shared. */
    assert_true(shared.mean.tokens_per_s < apart.mean.tokens_per_s * 0.65);
    px_sim_faults f = {0};
    const char *doc =
        "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"0 s\",\"kind\":\"link-degrade\","
        "\"target\":\"n0.gpu0>n0.gpu1\",\"bandwidth_factor\":0.25,\"latency\":\"5 ms\"}]}";
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &degraded, &err), &err);
    assert_true(degraded.mean.tokens_per_s < apart.mean.tokens_per_s * 0.8);
    px_sim_result_release(&shared);
    px_sim_result_release(&apart);
    px_sim_result_release(&degraded);
    px_sim_faults_release(&f);
}

static void pace_on_thermal(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                            px_sim_action *act)
{
    (void)sim;
    int *calls = ctx;
    (*calls)++;
    if (ev->kind == PX_SIM_FAULT_THERMAL) {
        act->kind = PX_SIM_ACT_PACE;
        act->max_batch = 2;
    }
}

static void test_pacing_and_intermittent_links_change_what_is_served(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 8, 0.01, 0.001);
    px_sim_load l = poisson(1000, 128, 256);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 30;
    o.replications = 1;
    o.queue_limit = 100;
    px_sim_result full, paced;
    px_err err;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &full, &err), &err);
    px_sim_faults f = {0};
    const char *doc = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"kind\":\"thermal\","
                      "\"target\":\"n0.gpu0\",\"ambient\":\"20 C\"}]}";
    px_assert_ok(px_sim_faults_parse(doc, strlen(doc), "f.json", &f, &err), &err);
    int calls = 0;
    px_sim_hooks hooks = {
        .version = PX_SIM_HOOKS_VERSION, .on_fault = pace_on_thermal, .ctx = &calls};
    o.hooks = &hooks;
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &paced, &err), &err);
    assert_int_equal(calls, 1);
    /* Two sequences per step instead of eight. */
    assert_true(paced.mean.tokens_per_s < full.mean.tokens_per_s * 0.3);
    assert_true(paced.mean.tokens_per_s > full.mean.tokens_per_s * 0.2);
    px_sim_result_release(&full);
    px_sim_result_release(&paced);
    px_sim_faults_release(&f);

    /* A link degraded half of each period serves between clean and
     * always degraded. */
    make_plan(&tp, 1, 2, 1, 0.001, 0.001);
    tp.links[0] = (px_sim_link){.id = "l", .bandwidth = 1e6};
    tp.plan.n_links = 1;
    tp.stages[0][0].link = 0;
    tp.stages[0][0].xfer_bytes = 10000;
    tp.stages[0][0].next_device = 1;
    o.hooks = NULL;
    l = poisson(1000, 1, 200);
    px_sim_result clean, always, half;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &clean, &err), &err);
    const char *deg = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"kind\":\"link-degrade\","
                      "\"target\":\"n0.gpu0>n0.gpu1\",\"bandwidth_factor\":0.1}]}";
    px_assert_ok(px_sim_faults_parse(deg, strlen(deg), "f.json", &f, &err), &err);
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &always, &err), &err);
    px_sim_faults_release(&f);
    const char *inter = "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"kind\":\"link-degrade\","
                        "\"target\":\"n0.gpu0>n0.gpu1\",\"bandwidth_factor\":0.1,"
                        "\"intermittent\":{\"period\":\"2 s\",\"duty\":0.5}}]}";
    px_assert_ok(px_sim_faults_parse(inter, strlen(inter), "f.json", &f, &err), &err);
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &half, &err), &err);
    assert_true(always.mean.tokens_per_s < clean.mean.tokens_per_s * 0.2);
    assert_true(half.mean.tokens_per_s > always.mean.tokens_per_s * 1.5);
    assert_true(half.mean.tokens_per_s < clean.mean.tokens_per_s * 0.8);
    px_sim_result_release(&clean);
    px_sim_result_release(&always);
    px_sim_result_release(&half);
    px_sim_faults_release(&f);
}

static void requeue_and_switch(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                               px_sim_action *act)
{
    (void)ctx;
    (void)sim;
    if (ev->kind == PX_SIM_FAULT_DOMAIN_LOSS) {
        act->kind = PX_SIM_ACT_SWITCH_PLAN;
        act->plan = 0;
        act->delay_s = 0.5;
    }
    act->requeue = ev->device % 2 == 0;
}

static void test_every_request_is_accounted_for_under_churn(void **state)
{
    (void)state;
    /* Four replicas of two stages with micro-batches, devices lost and
     * recovered again and again, a rack lost, links flapping, a bursty
     * load: arrivals = completed + failed + dropped + in flight. */
    test_plan tp, fb;
    make_plan(&tp, 4, 2, 6, 0.01, 0.02);
    for (int r = 0; r < 4; r++) {
        tp.replicas[r].micro_batches = 3;
        tp.stages[r][0].link = 0;
        tp.stages[r][0].xfer_bytes = 2000;
        tp.stages[r][0].xfer_latency_s = 0.001;
        tp.stages[r][0].next_device = tp.stages[r][1].devices[0];
        tp.stages[r][0].decode_p99_s = 0.02;
    }
    tp.links[0] = (px_sim_link){.id = "tor", .bandwidth = 1e6};
    tp.plan.n_links = 1;
    memcpy(&fb, &tp, sizeof fb);
    fb.plan.devices = fb.devices;
    fb.plan.domains = fb.domains;
    fb.plan.links = fb.links;
    fb.plan.replicas = fb.replicas;
    for (int r = 0; r < 4; r++)
        fb.replicas[r].stages = fb.stages[r];
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\":\"plexus.faults/1\",\"faults\":[");
    for (int i = 0; i < 40; i++)
        px_strbuf_addf(&sb,
                       "{\"kind\":\"device-loss\",\"target\":\"n%d.gpu%d\",\"at\":\"%d s\","
                       "\"duration\":\"%d s\"},",
                       i % 4, i % 2, i, 1 + i % 3);
    px_strbuf_adds(&sb, "{\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n1.gpu1\","
                        "\"bandwidth_factor\":0.2,\"intermittent\":{\"period\":\"1 s\","
                        "\"duty\":0.3}},"
                        "{\"kind\":\"power-cap\",\"target\":\"*\",\"limit\":\"200 W\","
                        "\"at\":\"10 s\",\"duration\":\"5 s\"},"
                        "{\"kind\":\"domain-loss\",\"target\":\"rack1\",\"at\":\"45 s\"}]}");
    px_sim_faults f;
    px_err err;
    px_assert_ok(px_sim_faults_parse(sb.buf, sb.len, "churn.json", &f, &err), &err);
    px_strbuf_release(&sb);
    px_sim_load l = poisson(60, 64, 16);
    l.kind = PX_SIM_LOAD_BURSTY;
    l.burst = 3;
    l.period_s = 4;
    l.gen = (px_sim_len){PX_SIM_LEN_UNIFORM, 1, 40};
    px_sim_hooks hooks = {.version = PX_SIM_HOOKS_VERSION, .on_fault = requeue_and_switch};
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 60;
    o.replications = 3;
    o.queue_limit = 50;
    o.hooks = &hooks;
    o.fallbacks = &fb.plan;
    o.n_fallbacks = 1;
    px_sim_result res;
    px_assert_ok(px_sim_run(&tp.plan, &l, &f, &o, &res, &err), &err);
    for (uint32_t r = 0; r < res.n_replications; r++) {
        const px_sim_metrics *m = &res.runs[r];
        assert_float_equal(m->arrivals, m->completed + m->failed + m->dropped + m->in_flight_at_end,
                           0);
        assert_true(m->failed > 0);
        assert_true(m->completed > 0);
        assert_float_equal(m->plan_switches, 1, 0);
    }
    px_sim_result_release(&res);
    px_sim_faults_release(&f);
}

static void test_trace_load_replays_recorded_arrivals(void **state)
{
    (void)state;
    test_plan tp;
    make_plan(&tp, 1, 1, 4, 0.01, 0.01);
    const char *text = "{\"t\": 0.5, \"prompt_tokens\": 128, \"gen_tokens\": 4}\n"
                       "\n"
                       "{\"t\": 1.0, \"prompt_tokens\": 64, \"gen_tokens\": 8}\n"
                       "{\"t\": 1.0, \"prompt_tokens\": 64, \"gen_tokens\": 2}\n";
    px_sim_load l;
    px_err err;
    px_assert_ok(px_sim_load_read_trace(text, strlen(text), "t.jsonl", &l, &err), &err);
    assert_int_equal(l.n_arrivals, 3);
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 10;
    o.replications = 1;
    px_sim_result res;
    px_assert_ok(px_sim_run(&tp.plan, &l, NULL, &o, &res, &err), &err);
    assert_float_equal(res.mean.arrivals, 3, 0);
    assert_float_equal(res.mean.completed, 3, 0);
    assert_float_equal(res.mean.tokens_per_s * 10, 14, 1e-9);
    px_sim_result_release(&res);
    px_sim_load_release(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_orders_by_time_then_insertion),
        cmocka_unit_test(test_two_transfers_in_one_domain_each_get_half_the_bandwidth),
        cmocka_unit_test(test_thermal_converges_with_its_time_constant),
        cmocka_unit_test(test_same_seed_gives_identical_results_and_other_seeds_differ),
        cmocka_unit_test(test_poisson_arrival_rate_is_recovered),
        cmocka_unit_test(test_md1_mean_wait_matches_theory),
        cmocka_unit_test(test_throughput_saturates_at_the_predicted_capacity),
        cmocka_unit_test(test_confidence_intervals_shrink_with_more_replications),
        cmocka_unit_test(test_rack_failure_takes_all_its_devices_down_at_once),
        cmocka_unit_test(test_device_loss_fails_requests_unless_a_hook_switches_plans),
        cmocka_unit_test(test_throttling_kicks_in_above_the_thermal_limit),
        cmocka_unit_test(test_link_degradation_and_contention_slow_transfers),
        cmocka_unit_test(test_pacing_and_intermittent_links_change_what_is_served),
        cmocka_unit_test(test_every_request_is_accounted_for_under_churn),
        cmocka_unit_test(test_trace_load_replays_recorded_arrivals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
