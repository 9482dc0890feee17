/* The --inject grammar: parsing, hostile input, the canonical round trip
 * and resolution against a running pipeline. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/heal.h"

static void parse_ok(const char *spec, px_heal_inject *in)
{
    px_err err;
    px_assert_ok(px_heal_inject_parse(spec, in, &err), &err);
}

static void expect_refused(const char *spec, const char *needle)
{
    px_heal_inject in;
    px_err err;
    px_err_clear(&err);
    px_status st = px_heal_inject_parse(spec, &in, &err);
    if (st == PX_OK)
        fail_msg("\"%s\" was accepted", spec);
    assert_int_equal(st, PX_EINVAL);
    px_assert_contains(err.msg, "--inject \"");
    px_assert_contains(err.msg, needle);
}

static void test_inject_parses_every_documented_form(void **state)
{
    (void)state;
    px_heal_inject in;
    parse_ok("kill:stage1@token20", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_KILL);
    assert_string_equal(in.target, "stage1");
    assert_int_equal(in.at_token, 20);
    parse_ok("stop:stage1@token20", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_STOP);
    parse_ok("crash:stage0@token5", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_CRASH);
    parse_ok("link:stage0>stage1:latency=5ms@token10", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_LINK);
    assert_string_equal(in.target, "stage0");
    assert_string_equal(in.link_to, "stage1");
    assert_int_equal(in.fault.link.latency_ns, 5000000);
    parse_ok("link:local.cpu0>executor:bandwidth=1MB/s,loss=0.05,flip=0.01,period=200ms,"
             "duty=0.25,cut@token0",
             &in);
    assert_float_equal(in.fault.link.bandwidth_bps, 1e6, 0);
    assert_float_equal(in.fault.link.loss, 0.05, 0);
    assert_float_equal(in.fault.link.flip, 0.01, 0);
    assert_float_equal(in.fault.link.period_s, 0.2, 1e-15);
    assert_float_equal(in.fault.link.duty, 0.25, 0);
    assert_true(in.fault.link.cut);
    assert_int_equal(in.at_token, 0);
    parse_ok("link:stage0>stage1:latency=500us,period=2s@token1", &in);
    assert_int_equal(in.fault.link.latency_ns, 500000);
    assert_float_equal(in.fault.link.duty, 0.5, 0); /* period alone: half the time */
    parse_ok("slow:stage1:factor=4,tau=500ms@token5", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_SLOW);
    assert_float_equal(in.fault.factor, 4, 0);
    assert_float_equal(in.fault.tau_s, 0.5, 1e-15);
    parse_ok("corrupt:stage1:magnitude=0.5,layer=1@token12", &in);
    assert_float_equal(in.fault.magnitude, 0.5, 0);
    assert_int_equal(in.fault.layer, 1);
    parse_ok("corrupt:stage1:magnitude=2@token12", &in);
    assert_int_equal(in.fault.layer, -1);
    parse_ok("memory:stage1:bytes=64MiB@token3", &in);
    assert_int_equal(in.fault.bytes, 64u << 20);
    parse_ok("memory:stage1:bytes=1GB@token3", &in);
    assert_int_equal(in.fault.bytes, 1000000000u);
    parse_ok("memory:local.emu-a:bytes=4096@token3", &in);
    assert_int_equal(in.fault.bytes, 4096);
    assert_string_equal(in.target, "local.emu-a");
    parse_ok("clear:stage1@token30", &in);
    assert_int_equal(in.fault.kind, PX_RT_FAULT_CLEAR);
    assert_string_equal(in.text, "clear:stage1@token30");
}

static void test_inject_refuses_malformed_specs_naming_the_part(void **state)
{
    (void)state;
    expect_refused("", "empty");
    expect_refused("kill:stage1", "@tokenN");
    expect_refused("kill:stage1@20", "tokenN");
    expect_refused("kill:stage1@token-1", "tokenN");
    expect_refused("kill:stage1@token99999999999999999", "tokenN");
    expect_refused("kill:stage1@token2000000000000000", "10^15");
    expect_refused("explode:stage1@token1",
                   "kill, stop, crash, link, slow, corrupt, memory or clear");
    expect_refused("kill@token1", "TARGET");
    expect_refused("kill:@token1", "empty target");
    expect_refused("kill:stage 1@token1", "space");
    expect_refused("kill:st$ge1@token1", "not a letter");
    expect_refused("kill:stage1:factor=2@token1", "takes no parameters");
    expect_refused("kill:stage0>stage1@token1", "only link faults");
    expect_refused("link:stage0:latency=5ms@token1", "A>B");
    expect_refused("link:stage0>:latency=5ms@token1", "empty link receiver");
    expect_refused("link:stage0>stage1@token1", "needs parameters");
    expect_refused("link:stage0>stage1:latency=5xs@token1", "latency=5xs");
    expect_refused("link:stage0>stage1:latency=5MB@token1", "latency=5MB");
    expect_refused("link:stage0>stage1:latency=90s@token1", "out of range");
    expect_refused("link:stage0>stage1:latency=-1ms@token1", "out of range");
    expect_refused("link:stage0>stage1:bandwidth=0MB/s@token1", "out of range");
    expect_refused("link:stage0>stage1:bandwidth=nanMB/s@token1", "bandwidth=nanMB/s");
    expect_refused("link:stage0>stage1:loss=1.5@token1", "out of range");
    expect_refused("link:stage0>stage1:loss=inf@token1", "not a plain number");
    expect_refused("link:stage0>stage1:duty=0.5@token1", "duty needs period");
    expect_refused("link:stage0>stage1:latency=5ms,latency=6ms@token1", "twice");
    expect_refused("link:stage0>stage1:latency=5ms,,cut@token1", "empty parameter");
    expect_refused("link:stage0>stage1:cut=1@token1", "cut takes no value");
    expect_refused("link:stage0>stage1:latency@token1", "needs a value");
    expect_refused("link:stage0>stage1:factor=2@token1", "latency, bandwidth");
    expect_refused("link:stage0>stage1:period=1s@token1", "one of latency");
    expect_refused("slow:stage1:tau=1s@token1", "slow needs factor");
    expect_refused("slow:stage1:factor=0.5@token1", "out of range");
    expect_refused("corrupt:stage1:layer=2@token1", "needs magnitude");
    expect_refused("corrupt:stage1:magnitude=1,layer=1.5@token1", "whole number");
    expect_refused("memory:stage1:bytes=0@token1", "out of range");
    expect_refused("memory:stage1:bytes=1EB@token1", "bytes=1EB");
    expect_refused("memory:stage1:bytes=99999999999999999999@token1", "out of range");
    expect_refused("corrupt:stage1:magnitude=1,seed=99999999999999999999@token1", "above");
    char longspec[400];
    memset(longspec, 'a', sizeof longspec - 1);
    longspec[sizeof longspec - 1] = 0;
    expect_refused(longspec, "longer than 255");
    char longid[160] = "kill:";
    memset(longid + 5, 'x', 120);
    strcpy(longid + 125, "@token1");
    expect_refused(longid, "at most 95");
    px_err err;
    assert_int_equal(px_heal_inject_parse(NULL, NULL, &err), PX_EINVAL);
}

static void round_trip(const char *spec, const char *canonical)
{
    px_heal_inject a, b;
    parse_ok(spec, &a);
    json_t *j = px_heal_inject_to_json(&a);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "text")), spec);
    const char *text = json_string_value(json_object_get(j, "spec"));
    assert_non_null(text);
    if (canonical)
        assert_string_equal(text, canonical);
    parse_ok(text, &b);
    assert_memory_equal(&a.fault, &b.fault, sizeof a.fault);
    assert_string_equal(a.target, b.target);
    assert_string_equal(a.link_to, b.link_to);
    assert_int_equal(a.at_token, b.at_token);
    json_t *k = px_heal_inject_to_json(&b);
    json_object_del(k, "text");
    json_object_del(j, "text");
    assert_true(json_equal(j, k));
    json_decref(j);
    json_decref(k);
}

static void test_inject_round_trips_through_json(void **state)
{
    (void)state;
    round_trip("kill:stage1@token20", "kill:stage1@token20");
    round_trip("link:stage0>stage1:latency=5ms@token10", "link:stage0>stage1:latency=5ms@token10");
    round_trip("link:stage1>executor:cut,flip=0.01,bandwidth=1.5MB/s,loss=0.05,period=200ms,"
               "duty=0.3,resend=50ms,seed=7@token3",
               "link:stage1>executor:bandwidth=1.5MB/s,loss=0.05,flip=0.01,period=200ms,"
               "duty=0.3,resend=50ms,seed=7,cut@token3");
    round_trip("slow:stage1:tau=500ms,factor=4@token5", "slow:stage1:factor=4,tau=500ms@token5");
    round_trip("corrupt:local.emu-a:magnitude=0.5,layer=1,seed=3@token12", NULL);
    round_trip("memory:stage1:bytes=64MiB@token3", "memory:stage1:bytes=67108864@token3");
    round_trip("link:stage0>stage1:latency=123.456us,bandwidth=3.3Gbit/s@token1", NULL);
    /* A negative zero is zero: found by fuzz_inject. */
    round_trip("slow:1:factor=4,tau=-000ms@token5", NULL);
    round_trip("link:stage1>executor:bandwidth=1MB/s,loss=-0@token3", NULL);
    px_heal_inject in;
    parse_ok("link:stage0>stage1:latency=5ms@token10", &in);
    json_t *j = px_heal_inject_to_json(&in);
    assert_float_equal(json_real_value(json_object_get(j, "latency_s")), 0.005, 1e-15);
    assert_string_equal(json_string_value(json_object_get(j, "link_to")), "stage1");
    json_decref(j);
}

static void three_stages(px_rt_pipeline_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_stages = 3;
    strcpy(spec->stages[0].device, "local.cpu0");
    strcpy(spec->stages[1].device, "local.emu-a");
    strcpy(spec->stages[2].device, "local.emu-b");
}

static void test_inject_resolves_stages_devices_and_hops(void **state)
{
    (void)state;
    px_rt_pipeline_spec spec;
    three_stages(&spec);
    px_heal_inject in;
    px_rt_fault f;
    px_err err;
    parse_ok("kill:stage2@token1", &in);
    px_assert_ok(px_heal_inject_resolve(&in, &spec, &f, &err), &err);
    assert_int_equal(f.stage, 2);
    assert_int_equal(f.kind, PX_RT_FAULT_KILL);
    parse_ok("slow:local.emu-a:factor=3@token1", &in);
    px_assert_ok(px_heal_inject_resolve(&in, &spec, &f, &err), &err);
    assert_int_equal(f.stage, 1);
    assert_float_equal(f.factor, 3, 0);
    parse_ok("link:stage1>local.emu-b:latency=1ms@token1", &in);
    px_assert_ok(px_heal_inject_resolve(&in, &spec, &f, &err), &err);
    assert_int_equal(f.stage, 1);
    parse_ok("link:local.emu-b>executor:latency=1ms@token1", &in);
    px_assert_ok(px_heal_inject_resolve(&in, &spec, &f, &err), &err);
    assert_int_equal(f.stage, 2);

    parse_ok("kill:stage3@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "\"stage3\" is no stage");
    px_assert_contains(err.msg, "stage1 (local.emu-a)");
    parse_ok("kill:n9.gpu0@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "n9.gpu0");
    parse_ok("link:stage0>stage2:latency=1ms@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_EINVAL);
    px_assert_contains(err.msg, "next hop of stage0 is stage1 (local.emu-a)");
    parse_ok("link:stage1>executor:latency=1ms@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_EINVAL);
    parse_ok("link:stage2>stage0:latency=1ms@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_EINVAL);
    px_assert_contains(err.msg, "executor");
    parse_ok("link:stage1>stage99:latency=1ms@token1", &in);
    assert_int_equal(px_heal_inject_resolve(&in, &spec, &f, &err), PX_ENOTFOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inject_parses_every_documented_form),
        cmocka_unit_test(test_inject_refuses_malformed_specs_naming_the_part),
        cmocka_unit_test(test_inject_round_trips_through_json),
        cmocka_unit_test(test_inject_resolves_stages_devices_and_hops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
