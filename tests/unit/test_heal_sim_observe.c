/* Observation in the simulator (version 2 hooks) and the healer's pure
 * parts: ticks report step and transfer times against the plan, heat and
 * heartbeats; a version 1 table still works; plans installed during a run
 * serve and are switched back; the thermal fit, the classification of
 * triggers, the heat rule and the replay of a decision. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "heal/heal_sim_impl.h"
#include "plexus/heal.h"
#include "plexus/sim.h"

/* Two pipelines of two single-device stages (devices 0>1 and 2>3), each
 * hop on its own link; devices 0, 1 in rack0, 2, 3 in rack1. */
typedef struct fixture {
    px_sim_plan a, b; /* a on devices 0>1, b on devices 2>3 */
    px_sim_device devices[4];
    px_sim_domain domains[2];
    px_sim_link links[1];
    px_sim_replica rep_a, rep_b;
    px_sim_stage st_a[2], st_b[2];
} fixture;

static void make_stage(px_sim_stage *s, uint32_t dev, uint32_t next)
{
    memset(s, 0, sizeof *s);
    s->devices[0] = dev;
    s->n_devices = 1;
    s->decode_s = s->decode_p99_s = 0.01;
    s->prefill_s = s->prefill_p99_s = 0.05;
    s->weight_fraction = 1;
    s->link = next == PX_SIM_NONE ? PX_SIM_NONE : 0;
    s->next_device = next;
    s->xfer_bytes = next == PX_SIM_NONE ? 0 : 1e6;
    s->xfer_latency_s = next == PX_SIM_NONE ? 0 : 1e-4;
}

static void make_plan(px_sim_plan *p, fixture *f, px_sim_replica *rep, px_sim_stage *st,
                      uint32_t first, const char *id)
{
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    p->devices = f->devices;
    p->n_devices = 4;
    p->domains = f->domains;
    p->n_domains = 2;
    p->links = f->links;
    p->n_links = 1;
    p->replicas = rep;
    p->n_replicas = 1;
    p->context = 1024;
    p->prompt_tokens = 128;
    p->gen_tokens = 32;
    memset(rep, 0, sizeof *rep);
    rep->stages = st;
    rep->n_stages = 2;
    rep->batch = 4;
    rep->micro_batches = 2;
    make_stage(&st[0], first, first + 1);
    make_stage(&st[1], first + 1, PX_SIM_NONE);
}

static void make_fixture(fixture *f)
{
    memset(f, 0, sizeof *f);
    for (uint32_t d = 0; d < 4; d++) {
        snprintf(f->devices[d].id, PX_SIM_ID_LEN, "n%u.gpu%u", d / 2, d % 2);
        f->devices[d].power_active_w = 300;
        f->devices[d].power_idle_w = 75;
        f->devices[d].thermal_limit_k = 358.15;
        f->devices[d].thermal_tau_s = 20;
        f->devices[d].n_domains = 1;
        f->devices[d].domains[0] = d / 2;
    }
    snprintf(f->domains[0].id, PX_SIM_ID_LEN, "rack0");
    snprintf(f->domains[1].id, PX_SIM_ID_LEN, "rack1");
    snprintf(f->links[0].id, PX_SIM_ID_LEN, "hop");
    f->links[0].bandwidth = 1e9;
    make_plan(&f->a, f, &f->rep_a, f->st_a, 0, "plan-a");
    make_plan(&f->b, f, &f->rep_b, f->st_b, 2, "plan-b");
}

static px_sim_load poisson(double rate)
{
    px_sim_load l;
    memset(&l, 0, sizeof l);
    l.kind = PX_SIM_LOAD_POISSON;
    l.rate = rate;
    l.prompt = (px_sim_len){PX_SIM_LEN_FIXED, 128, 0};
    l.gen = (px_sim_len){PX_SIM_LEN_FIXED, 32, 0};
    return l;
}

/* What the ticks showed. */
typedef struct seen {
    const fixture *f;
    uint32_t ticks, begins, ends;
    double ratio_before, xfer_before, xfer_after;
    double hb_lost, hb_alive_at_end, temp_first, temp_last;
    const px_sim_plan *plan_at[64];
    double install_at, back_at;
    bool installed, back;
} seen;

static void on_tick(void *ctx, const px_sim *sim, const px_sim_obs *obs, px_sim_action *act)
{
    (void)sim;
    seen *s = ctx;
    uint32_t k = (uint32_t)llround(obs->t * 2);
    if (k < 64)
        s->plan_at[k] = obs->plan;
    s->ticks++;
    if (s->ticks == 1)
        s->temp_first = obs->devices[0].temp_k;
    s->temp_last = obs->devices[0].temp_k;
    if (obs->t < 10 && obs->n_stages == 2 && obs->stages[0].n_steps) {
        s->ratio_before = obs->stages[0].step_ratio_p50;
        if (obs->stages[0].n_xfers)
            s->xfer_before = obs->stages[0].xfer_ratio_p50;
    }
    if (obs->t > 12 && obs->t < 14 && obs->stages[0].n_xfers)
        s->xfer_after = obs->stages[0].xfer_ratio_p50;
    s->hb_lost = obs->devices[1].last_heartbeat_t;
    s->hb_alive_at_end = obs->devices[0].last_heartbeat_t;
    if (s->install_at > 0 && !s->installed && obs->t >= s->install_at) {
        act->kind = PX_SIM_ACT_SWITCH_PLAN;
        act->install = &s->f->b;
        act->delay_s = 1;
        s->installed = true;
    } else if (s->back_at > 0 && !s->back && obs->t >= s->back_at) {
        act->kind = PX_SIM_ACT_SWITCH_PLAN;
        act->install = &s->f->a;
        act->delay_s = 1;
        s->back = true;
    }
}

static void on_begin(void *ctx, const px_sim *sim, uint32_t r, uint64_t seed)
{
    (void)sim;
    (void)r;
    (void)seed;
    ((seen *)ctx)->begins++;
}

static void on_end(void *ctx, const px_sim *sim, const px_sim_metrics *m)
{
    (void)sim;
    (void)m;
    ((seen *)ctx)->ends++;
}

static px_sim_faults faults_of(const char *text)
{
    px_sim_faults f;
    px_err err;
    px_assert_ok(px_sim_faults_parse(text, strlen(text), "faults", &f, &err), &err);
    return f;
}

static void run(const fixture *f, seen *s, const px_sim_faults *faults, px_sim_result *res)
{
    px_sim_hooks hooks = {.version = PX_SIM_HOOKS_VERSION,
                          .ctx = s,
                          .tick_s = 0.5,
                          .on_begin = on_begin,
                          .on_tick = on_tick,
                          .on_end = on_end};
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 30;
    o.replications = 1;
    o.random_failures = false;
    o.hooks = &hooks;
    px_sim_load load = poisson(4);
    px_err err;
    px_assert_ok(px_sim_run(&f->a, &load, faults, &o, res, &err), &err);
}

static void test_ticks_show_steps_as_planned_and_heartbeats_stop_after_a_loss(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    seen s = {.f = &f};
    px_sim_faults faults = faults_of("{\"schema\": \"plexus.faults/1\", \"faults\": [{\"at\": "
                                     "\"10 s\", \"kind\": \"device-loss\", \"target\": "
                                     "\"n0.gpu1\"}]}");
    px_sim_result res;
    run(&f, &s, &faults, &res);
    assert_int_equal(s.begins, 1);
    assert_int_equal(s.ends, 1);
    assert_int_equal(s.ticks, 59); /* every 0.5 s before the end */
    assert_true(s.ratio_before > 0.9 && s.ratio_before < 1.5);
    if (!(s.xfer_before > 0.99 && s.xfer_before < 3.0))
        fail_msg("xfer ratio %g", s.xfer_before);
    assert_true(fabs(s.hb_lost - 10.0) < 1e-9);
    assert_true(fabs(s.hb_alive_at_end - 29.5) < 1e-9);
    assert_true(s.temp_last > s.temp_first);
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
}

static void test_a_slow_link_shows_in_transfer_times(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    seen s = {.f = &f};
    px_sim_faults faults =
        faults_of("{\"schema\": \"plexus.faults/1\", \"faults\": [{\"at\": \"10 s\", \"kind\": "
                  "\"link-degrade\", \"target\": \"n0.gpu0>n0.gpu1\", \"latency\": \"10 ms\"}]}");
    px_sim_result res;
    run(&f, &s, &faults, &res);
    assert_true(s.xfer_after > 5 * s.xfer_before);
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
}

static void test_an_installed_plan_serves_and_is_switched_back(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    seen s = {.f = &f, .install_at = 5, .back_at = 15};
    px_sim_result res;
    run(&f, &s, NULL, &res);
    assert_ptr_equal(s.plan_at[8], &f.a);  /* t = 4 */
    assert_ptr_equal(s.plan_at[14], &f.b); /* t = 7: after the 1 s delay */
    assert_ptr_equal(s.plan_at[40], &f.a); /* t = 20: back */
    assert_true(res.runs[0].plan_switches == 2);
    assert_true(res.runs[0].completed > 50);
    /* Both plans' devices worked. */
    assert_true(res.devices[0].utilization > 0 && res.devices[2].utilization > 0);
    px_sim_result_release(&res);
}

static void test_observation_is_deterministic(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    seen s1 = {.f = &f, .install_at = 5}, s2 = {.f = &f, .install_at = 5};
    px_sim_result r1, r2;
    run(&f, &s1, NULL, &r1);
    run(&f, &s2, NULL, &r2);
    assert_memory_equal(&r1.runs[0], &r2.runs[0], sizeof r1.runs[0]);
    assert_true(s1.xfer_before == s2.xfer_before && s1.temp_last == s2.temp_last);
    px_sim_result_release(&r1);
    px_sim_result_release(&r2);
}

/* The version 1 layout: three members. */
typedef struct hooks_v1 {
    int version;
    void (*on_fault)(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                     px_sim_action *action);
    void *ctx;
} hooks_v1;

static void count_fault(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                        px_sim_action *action)
{
    (void)sim;
    (void)ev;
    (void)action;
    (*(int *)ctx)++;
}

static void test_version_1_tables_still_work_and_a_tick_is_required(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    int faults_seen = 0;
    hooks_v1 v1 = {.version = 1, .on_fault = count_fault, .ctx = &faults_seen};
    px_sim_options o;
    px_sim_options_default(&o);
    o.duration_s = 20;
    o.replications = 1;
    o.random_failures = false;
    o.hooks = (const px_sim_hooks *)&v1;
    px_sim_faults faults = faults_of("{\"schema\": \"plexus.faults/1\", \"faults\": [{\"at\": "
                                     "\"5 s\", \"kind\": \"device-loss\", \"target\": "
                                     "\"n0.gpu0\"}]}");
    px_sim_load load = poisson(2);
    px_sim_result res;
    px_err err;
    px_assert_ok(px_sim_run(&f.a, &load, &faults, &o, &res, &err), &err);
    assert_int_equal(faults_seen, 1);
    px_sim_result_release(&res);
    seen s = {.f = &f};
    px_sim_hooks bad = {.version = 2, .ctx = &s, .on_tick = on_tick, .tick_s = 0};
    o.hooks = &bad;
    assert_int_equal(px_sim_run(&f.a, &load, NULL, &o, &res, &err), PX_EINVAL);
    px_assert_contains(err.msg, "tick_s");
    px_sim_faults_release(&faults);
}

/* ---- the healer's pure parts ---- */

static void test_thermal_fit_recovers_the_trajectory(void **state)
{
    (void)state;
    double t[8], temp[8], tau = 20, ss = 370, t0 = 300;
    for (int i = 0; i < 8; i++) {
        t[i] = 10 + 0.5 * i;
        temp[i] = ss + (t0 - ss) * exp(-t[i] / tau);
    }
    double fit, hit;
    px__hs_thermal_fit(t, temp, 8, tau, 358.15, &fit, &hit);
    assert_true(fabs(fit - ss) < 1e-6);
    /* T reaches the limit when ss + (t0 - ss) e^(-t/tau) = limit. */
    double when = -tau * log((ss - 358.15) / (ss - t0));
    assert_true(fabs((t[7] + hit) - when) < 1e-6);
    /* Heading under the limit: never. */
    px__hs_thermal_fit(t, temp, 8, tau, 380, &fit, &hit);
    assert_true(isinf(hit));
}

static json_t *heartbeats(double t_a0, double t_a1)
{
    return json_pack("{s:s, s:f, s:f, s:{s:f, s:f, s:f, s:f}, s:[], s:{s:i, s:i},"
                     " s:[{s:s, s:[s, s]}, {s:s, s:[s, s]}]}",
                     "signal", "heartbeat", "now", 12.0, "timeout_s", 1.5, "heartbeats", "a0", t_a0,
                     "a1", t_a1, "b0", 12.0, "b1", 12.0, "known_lost", "plan_devices", "a0", 0,
                     "a1", 1, "domains", "id", "rack-a", "members", "a0", "a1", "id", "rack-b",
                     "members", "b0", "b1");
}

/* A power feed inside a rack with the same devices: the outermost is
 * named, whichever order the domains come in, and the inner one is said. */
static void test_silent_nested_domains_name_the_enclosing_one(void **state)
{
    (void)state;
    for (int order = 0; order < 2; order++) {
        json_t *pdu = json_pack("{s:s, s:s, s:[s, s]}", "id", "pdu-a", "parent", "rack-a",
                                "members", "a0", "a1");
        json_t *rack =
            json_pack("{s:s, s:s, s:[s, s]}", "id", "rack-a", "parent", "", "members", "a0", "a1");
        json_t *tr = json_pack("{s:s, s:f, s:f, s:{s:f, s:f}, s:[], s:{s:i, s:i}, s:[o, o]}",
                               "signal", "heartbeat", "now", 12.0, "timeout_s", 1.5, "heartbeats",
                               "a0", 10.0, "a1", 10.0, "known_lost", "plan_devices", "a0", 0, "a1",
                               1, "domains", order ? rack : pdu, order ? pdu : rack);
        px_heal_fault_class cls;
        px_heal_locus where;
        bool inter;
        char ev[320];
        px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
        assert_int_equal(cls, PX_HEAL_DOMAIN_LOSS);
        assert_string_equal(where.device, "rack-a");
        px_assert_contains(ev, "pdu-a within it holds the same devices");
        json_decref(tr);
    }
}

static void test_silent_heartbeats_tell_a_domain_from_a_device(void **state)
{
    (void)state;
    px_heal_fault_class cls;
    px_heal_locus where;
    bool inter;
    char ev[320];
    json_t *tr = heartbeats(10, 10);
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_DOMAIN_LOSS);
    assert_string_equal(where.device, "rack-a");
    json_decref(tr);
    tr = heartbeats(12, 10);
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_DEVICE_LOSS);
    assert_string_equal(where.device, "a1");
    assert_int_equal(where.stage, 1);
    json_decref(tr);
    /* Under the timeout: nothing. */
    tr = heartbeats(11, 11);
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_NONE);
    json_decref(tr);
}

static json_t *transfer(double v1, double v2, double v3, double v4, bool shared)
{
    return json_pack("{s:s, s:[[f,f],[f,f],[f,f],[f,f]], s:f, s:f, s:i, s:i, s:i, s:i, s:s, s:s,"
                     " s:s, s:b}",
                     "signal", "transfer", "window", 1.0, v1, 1.5, v2, 2.0, v3, 2.5, v4, "baseline",
                     1.0, "ratio", 2.0, "confirm", 2, "stage", 0, "to", 1, "replica", 0, "device",
                     "a0", "hop", "a0>a1", "link", "contention:sw", "shared", shared);
}

static void test_slow_transfers_are_a_link_or_interference_and_flapping_is_seen(void **state)
{
    (void)state;
    px_heal_fault_class cls;
    px_heal_locus where;
    bool inter;
    char ev[320];
    json_t *tr = transfer(1, 1, 9, 9, false);
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_LINK_DEGRADE);
    assert_int_equal(where.kind, PX_HEAL_AT_LINK);
    assert_string_equal(where.device, "a0>a1");
    assert_false(inter);
    json_decref(tr);
    tr = transfer(9, 1, 9, 9, true);
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_INTERFERENCE);
    assert_true(inter);
    json_decref(tr);
    tr = transfer(9, 9, 9, 1, true); /* the last tick is back to normal */
    px__hs_classify(tr, &cls, &where, &inter, ev, sizeof ev);
    assert_int_equal(cls, PX_HEAL_NONE);
    json_decref(tr);
}

static void test_a_candidate_that_keeps_the_hot_device_is_rejected_unstable(void **state)
{
    (void)state;
    json_t *cands = json_pack(
        "[{s:s, s:b, s:f, s:[s]}, {s:s, s:b, s:f, s:[s]}, {s:s, s:b, s:f, s:s, s:[s]}]", "action",
        "pace", "accepted", 1, "tpot_p99_s", 0.01, "devices", "hot0", "action", "repartition",
        "accepted", 1, "tpot_p99_s", 0.02, "devices", "cool1", "action", "lower-precision",
        "accepted", 0, "tpot_p99_s", 0.005, "reject_code", "contract", "devices", "hot0");
    char codes[3][32];
    assert_int_equal(px__hs_choose(cands, "hot0", 0, codes, 3), 1);
    assert_string_equal(codes[0], "unstable");
    assert_string_equal(codes[1], "");
    assert_string_equal(codes[2], "contract");
    /* Without heat the faster one wins. */
    assert_int_equal(px__hs_choose(cands, NULL, 0, codes, 3), 0);
    json_decref(cands);
}

static void test_a_decision_replays_identical_and_a_changed_window_diverges(void **state)
{
    (void)state;
    size_t n;
    const px_trace_deriver *d = px_heal_sim_replay_derivers(&n);
    const px_trace_deriver *dec = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(d[i].name, "heal-sim.decision"))
            dec = &d[i];
    assert_non_null(dec);
    json_t *cands = json_pack("[{s:s, s:b, s:f, s:[s]}]", "action", "reroute", "accepted", 1,
                              "tpot_p99_s", 0.02, "devices", "b0");
    json_t *in = json_pack("{s:o, s:o, s:s, s:f}", "trigger", transfer(1, 1, 9, 9, true),
                           "candidates", cands, "hot", "", "slo_tpot_s", 0.0);
    px_trace_event ev = {.kind = PX_TRACE_MITIGATION, .name = "heal-sim.decision", .inputs = in};
    json_t *out1 = NULL, *out2 = NULL;
    px_err err;
    px_assert_ok(dec->derive(NULL, &ev, NULL, &out1, &err), &err);
    assert_string_equal(json_string_value(json_object_get(out1, "class")), "interference");
    assert_int_equal(json_integer_value(json_object_get(out1, "chosen")), 0);
    px_assert_ok(dec->derive(NULL, &ev, NULL, &out2, &err), &err);
    assert_true(json_equal(out1, out2));
    json_decref(out2);
    /* A window edited to stay under the threshold: another decision. */
    json_object_set_new(in, "trigger", transfer(1, 1, 1, 1, true));
    px_assert_ok(dec->derive(NULL, &ev, NULL, &out2, &err), &err);
    assert_false(json_equal(out1, out2));
    assert_string_equal(json_string_value(json_object_get(out2, "class")), "none");
    json_decref(out1);
    json_decref(out2);
    /* Inputs without a trigger are refused. */
    json_object_del(in, "trigger");
    assert_int_equal(dec->derive(NULL, &ev, NULL, &out1, &err), PX_EPARSE);
    json_decref(in);
}

static void test_healer_options_round_trip_and_refuse_garbage(void **state)
{
    (void)state;
    px_heal_sim_opts o, back;
    px_heal_sim_opts_default(&o);
    o.hysteresis = false;
    o.ratio = 3.5;
    o.ctx.slo.tpot_s = 0.05;
    json_t *j = px__hs_opts_to_json(&o);
    assert_non_null(j);
    px_heal_sim_opts_default(&back);
    px_err err;
    px_assert_ok(px__hs_opts_from_json(j, &back, &err), &err);
    assert_false(back.hysteresis);
    assert_true(back.ratio == 3.5 && back.ctx.slo.tpot_s == 0.05);
    json_object_set_new(j, "ratio", json_string("fast"));
    assert_int_equal(px__hs_opts_from_json(j, &back, &err), PX_EPARSE);
    px_assert_contains(err.msg, "\"ratio\" is not a finite number");
    px_assert_contains(err.msg, "run the simulation again");
    json_object_set_new(j, "ratio", json_real(2));
    json_object_set_new(j, "replications", json_integer(5000));
    assert_int_equal(px__hs_opts_from_json(j, &back, &err), PX_EPARSE);
    px_assert_contains(err.msg, "\"replications\" is 5000; it must be 1 to 1000");
    json_object_set_new(j, "replications", json_integer(1));
    json_object_set_new(j, "canary_ticks", json_integer(0));
    assert_int_equal(px__hs_opts_from_json(j, &back, &err), PX_EPARSE);
    px_assert_contains(err.msg, "\"canary_ticks\" is 0");
    json_object_set_new(j, "canary_ticks", json_integer(3));
    json_object_set_new(j, "surprise", json_true());
    assert_int_equal(px__hs_opts_from_json(j, &back, &err), PX_EPARSE);
    px_assert_contains(err.msg, "surprise");
    json_decref(j);
    /* The healer needs a plan, a graph and a model. */
    px_heal_sim *h;
    assert_int_equal(px_heal_sim_new(&o, &h, &err), PX_EINVAL);
    px_assert_contains(err.msg, "graph");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ticks_show_steps_as_planned_and_heartbeats_stop_after_a_loss),
        cmocka_unit_test(test_a_slow_link_shows_in_transfer_times),
        cmocka_unit_test(test_an_installed_plan_serves_and_is_switched_back),
        cmocka_unit_test(test_observation_is_deterministic),
        cmocka_unit_test(test_version_1_tables_still_work_and_a_tick_is_required),
        cmocka_unit_test(test_thermal_fit_recovers_the_trajectory),
        cmocka_unit_test(test_silent_heartbeats_tell_a_domain_from_a_device),
        cmocka_unit_test(test_silent_nested_domains_name_the_enclosing_one),
        cmocka_unit_test(test_slow_transfers_are_a_link_or_interference_and_flapping_is_seen),
        cmocka_unit_test(test_a_candidate_that_keeps_the_hot_device_is_rejected_unstable),
        cmocka_unit_test(test_a_decision_replays_identical_and_a_changed_window_diverges),
        cmocka_unit_test(test_healer_options_round_trip_and_refuse_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
