/* The detector on synthetic sample streams: a slow link told apart from a
 * slow stage, jitter below the floor ignored, intermittent degradation,
 * a stale topology, rebasing, determinism, steps with more rows, steps
 * attending more positions, loopback hops slowing together, time spent
 * waiting for a core (the executor's own, on the hop back, too), and the
 * stretch a shared host's cores allow its stages. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/heal.h"

#define N_STAGES 2

static void envelope(px_heal_envelope *env, double compute_hi)
{
    memset(env, 0, sizeof *env);
    env->n_stages = N_STAGES;
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++)
        env->compute_p50[i] = env->compute_hi[i] = NAN;
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++)
        env->xfer_p50[i] = env->xfer_hi[i] = NAN;
    for (uint32_t i = 0; i < N_STAGES; i++) {
        env->compute_p50[i] = compute_hi * 0.8;
        env->compute_hi[i] = compute_hi;
    }
    strcpy(env->device[0], "local.cpu0");
    strcpy(env->device[1], "local.emu-a");
}

/* A normal step: 1 ms compute per stage, 80 us per hop, with a small
 * deterministic jitter. */
static void normal(px_heal_sample *s, uint64_t step)
{
    memset(s, 0, sizeof *s);
    s->step = step;
    s->t_s = (double)step * 0.003;
    s->n_stages = N_STAGES;
    double j = ((step * 7) % 5) * 1e-5;
    for (uint32_t i = 0; i < N_STAGES; i++)
        s->compute_s[i] = 0.001 + j;
    for (uint32_t i = 0; i <= N_STAGES; i++)
        s->xfer_s[i] = 0.00008 + j / 10;
}

static px_heal_detector *detector(const px_heal_envelope *env)
{
    px_heal_detector_opts o;
    px_heal_detector_opts_default(&o);
    px_heal_detector *d;
    px_err err;
    px_assert_ok(px_heal_detector_new(env, &o, &d, &err), &err);
    return d;
}

static void test_detector_tells_a_slow_link_from_a_slow_stage(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    px_heal_finding f;
    px_heal_sample s;
    int found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        normal(&s, step);
        if (step >= 14)
            s.xfer_s[1] = 0.0052; /* the hop stage0 -> stage1 */
        if (px_heal_detector_observe(d, &s, &f)) {
            found++;
            assert_int_equal(f.cls, PX_HEAL_LINK_DEGRADE);
            assert_int_equal(f.locus.kind, PX_HEAL_AT_LINK);
            assert_int_equal(f.locus.stage, 0);
            assert_int_equal(f.locus.to, 1);
            assert_string_equal(f.locus.device, "local.cpu0>local.emu-a");
            assert_int_equal(f.onset_step, 14);
            assert_int_equal(f.confirmed_step, 16);
            assert_float_equal(f.onset_t_s, 14 * 0.003, 1e-12);
            assert_float_equal(f.confirmed_t_s, 16 * 0.003, 1e-12);
            assert_false(f.intermittent);
            assert_true(f.ratio > 50 && f.ratio < 80);
            px_assert_contains(f.evidence, "hop stage0>stage1: 5.2 ms per step since step 14");
            px_assert_contains(f.evidence, "compute of every stage unchanged");
            json_t *j = px_heal_finding_to_json(&f);
            assert_string_equal(json_string_value(json_object_get(j, "class")), "link-degrade");
            assert_string_equal(
                json_string_value(json_object_get(json_object_get(j, "locus"), "kind")), "link");
            json_decref(j);
        }
    }
    assert_int_equal(found, 1); /* once per onset */
    px_heal_detector_free(d);

    d = detector(&env);
    found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        normal(&s, step);
        if (step >= 20) /* stage 1 heats up: its compute grows */
            s.compute_s[1] = 0.001 * (1 + 0.5 * (double)(step - 19));
        if (px_heal_detector_observe(d, &s, &f)) {
            found++;
            assert_int_equal(f.cls, PX_HEAL_THERMAL);
            assert_int_equal(f.locus.kind, PX_HEAL_AT_COMPUTE);
            assert_int_equal(f.locus.stage, 1);
            assert_string_equal(f.locus.device, "local.emu-a");
            px_assert_contains(f.evidence, "compute of stage1 (local.emu-a)");
            px_assert_contains(f.evidence, "growing from");
            px_assert_contains(f.evidence, "every hop unchanged");
        }
    }
    assert_int_equal(found, 1);
    px_heal_detector_free(d);
}

/* Four stages: two on host "a", one on "b", one on "c"; every hop 80 us,
 * every stage 1 ms.  slow[i] multiplies stage i's compute from step 10. */
static int run_hosts(const double *slow, bool slow_hops, px_heal_finding *first)
{
    px_heal_envelope env;
    memset(&env, 0, sizeof env);
    env.n_stages = 4;
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++)
        env.compute_p50[i] = env.compute_hi[i] = NAN;
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++)
        env.xfer_p50[i] = env.xfer_hi[i] = NAN;
    strcpy(env.device[0], "a.cpu0");
    strcpy(env.device[1], "a.emu-a");
    strcpy(env.device[2], "b.gpu0");
    strcpy(env.device[3], "c.gpu0");
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 60; step++) {
        px_heal_sample s;
        memset(&s, 0, sizeof s);
        s.step = step;
        s.t_s = (double)step * 0.005;
        s.n_stages = 4;
        for (uint32_t i = 0; i < 4; i++)
            s.compute_s[i] = 0.001 * (step >= 10 ? slow[i] : 1.0);
        for (uint32_t i = 0; i <= 4; i++)
            s.xfer_s[i] = 0.00008;
        if (slow_hops && step >= 10)
            s.xfer_s[1] = s.xfer_s[0] = 0.004; /* into a.cpu0, and a.cpu0 > a.emu-a */
        px_heal_finding f;
        while (px_heal_detector_observe(d, &s, &f)) {
            if (found++ == 0 && first)
                *first = f;
            s.n_stages = 0; /* drain the rest without feeding the step again */
        }
    }
    px_heal_detector_free(d);
    return found;
}

static void test_detector_groups_stages_by_host(void **state)
{
    (void)state;
    px_heal_finding f;
    /* Both stages of host a slow down together, and the hops on it: the
     * host's cores are contended, no device or link is at fault. */
    const double host_a[] = {3.0, 4.0, 1.0, 1.0};
    assert_int_equal(run_hosts(host_a, true, NULL), 0);
    /* One stage of host a slows alone: a fault of its device. */
    const double one_a[] = {1.0, 4.0, 1.0, 1.0};
    assert_int_equal(run_hosts(one_a, false, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_int_equal(f.locus.stage, 1);
    assert_string_equal(f.locus.device, "a.emu-a");
    /* Stages of different hosts slowing together are two faults. */
    const double two_hosts[] = {1.0, 1.0, 4.0, 4.0};
    assert_int_equal(run_hosts(two_hosts, false, &f), 2);
    assert_int_equal(f.locus.stage, 2);
    /* A host with one stage cannot tell contention from a fault. */
    const double only_b[] = {1.0, 1.0, 4.0, 1.0};
    assert_int_equal(run_hosts(only_b, false, &f), 1);
    assert_string_equal(f.locus.device, "b.gpu0");
}

static void test_detector_ignores_jitter_below_the_floor(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    px_heal_sample s;
    px_heal_finding f;
    for (uint64_t step = 0; step < 200; step++) {
        normal(&s, step);
        /* Hops of 80 us jump to 400 us (5x, but only 0.32 ms above the
         * baseline, under the 0.5 ms floor); compute wobbles by 40%. */
        if (step >= 10 && step % 2)
            s.xfer_s[2] = 0.0004;
        if (step >= 10)
            s.compute_s[0] = step % 3 ? 0.0014 : 0.0009;
        assert_false(px_heal_detector_observe(d, &s, &f));
    }
    px_heal_detector_free(d);
}

static void test_detector_flags_intermittent_degradation(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    px_heal_sample s;
    px_heal_finding f;
    int found = 0;
    for (uint64_t step = 0; step < 60; step++) {
        normal(&s, step);
        /* Two slow steps, two normal ones: never `confirm` (3) in a row. */
        if (step >= 12 && (step / 2) % 2 == 0)
            s.xfer_s[2] = 0.004;
        if (px_heal_detector_observe(d, &s, &f)) {
            found++;
            assert_int_equal(f.cls, PX_HEAL_LINK_DEGRADE);
            assert_true(f.intermittent);
            assert_int_equal(f.locus.stage, 1);
            assert_int_equal(f.locus.to, 2);
            assert_string_equal(f.locus.device, "local.emu-a>executor");
            assert_int_equal(f.onset_step, 12);
            px_assert_contains(f.evidence, "intermittent");
            px_assert_contains(f.evidence, "hop stage1>executor");
        }
    }
    assert_int_equal(found, 1);
    px_heal_detector_free(d);
}

static void test_detector_reports_a_stale_topology_once(void **state)
{
    (void)state;
    /* The plan predicted at most 0.2 ms for each stage; stage 1 takes
     * 1 ms from the start (5x): the inventory over-reports it. */
    px_heal_envelope env;
    envelope(&env, 0.002);
    env.compute_hi[1] = 0.0002;
    px_heal_detector *d = detector(&env);
    px_heal_sample s;
    px_heal_finding f;
    int found = 0;
    for (uint64_t step = 100; step < 140; step++) {
        normal(&s, step);
        if (px_heal_detector_observe(d, &s, &f)) {
            found++;
            assert_int_equal(f.cls, PX_HEAL_STALE_TOPOLOGY);
            assert_int_equal(f.locus.kind, PX_HEAL_AT_COMPUTE);
            assert_int_equal(f.locus.stage, 1);
            assert_int_equal(f.confirmed_step, 107); /* when the baseline completes */
            assert_int_equal(f.onset_step, 100);
            assert_float_equal(f.onset_t_s, 0.3, 1e-12);
            assert_true(f.ratio > 4.9 && f.ratio < 5.5);
            px_assert_contains(f.evidence, "predicted at most 200 us");
        }
    }
    assert_int_equal(found, 1);
    px_heal_detector_free(d);
}

static void test_detector_rebase_starts_a_new_baseline(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    px_heal_sample s;
    px_heal_finding f;
    int found = 0;
    uint64_t step = 0;
    for (; step < 30; step++) {
        normal(&s, step);
        if (step >= 12)
            s.compute_s[0] = 0.004;
        found += px_heal_detector_observe(d, &s, &f);
    }
    assert_int_equal(found, 1);
    /* After the change the slower stage is the new normal: no report. */
    px_heal_detector_rebase(d, &env);
    for (; step < 60; step++) {
        normal(&s, step);
        s.compute_s[0] = 0.004;
        assert_false(px_heal_detector_observe(d, &s, &f));
    }
    /* And a new departure from the new baseline is reported again. */
    for (; step < 70; step++) {
        normal(&s, step);
        s.compute_s[0] = 0.012;
        found += px_heal_detector_observe(d, &s, &f);
    }
    assert_int_equal(found, 2);
    assert_int_equal(f.onset_step, 60);
    assert_float_equal(f.baseline_s, 0.004, 1e-12);
    px_heal_detector_free(d);
}

static void test_detector_is_deterministic_and_checks_its_options(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    char first[2][320];
    for (int run = 0; run < 2; run++) {
        px_heal_detector *d = detector(&env);
        px_heal_sample s;
        px_heal_finding f;
        first[run][0] = 0;
        for (uint64_t step = 0; step < 50; step++) {
            normal(&s, step);
            if (step > 20)
                s.xfer_s[0] = 0.003 + (double)(step % 3) * 1e-4;
            if (px_heal_detector_observe(d, &s, &f))
                strcpy(first[run], f.evidence);
        }
        px_heal_detector_free(d);
    }
    assert_true(first[0][0]);
    assert_string_equal(first[0], first[1]);
    px_assert_contains(first[0], "hop executor>stage0");

    px_heal_detector_opts o;
    px_heal_detector_opts_default(&o);
    px_heal_detector *d = NULL;
    px_err err;
    o.ratio = 0.5;
    assert_int_equal(px_heal_detector_new(&env, &o, &d, &err), PX_EINVAL);
    px_assert_contains(err.msg, "ratio");
    px_heal_detector_opts_default(&o);
    o.confirm = 0;
    assert_int_equal(px_heal_detector_new(&env, &o, &d, &err), PX_EINVAL);
    env.n_stages = 0;
    assert_int_equal(px_heal_detector_new(&env, NULL, &d, &err), PX_EINVAL);
    assert_null(d);
    px_heal_detector_free(NULL);
}

/* Two stages on hosts host0 and host1 (a "node.device" each); 8 baseline
 * steps of `rows0` rows, then steps of `rows` rows from step 10 on, each
 * signal's normal time times mult[signal] (hops 0..2, then the stages'
 * compute).  Returns the findings; the first in *first. */
static int run_rows(const char *dev0, const char *dev1, uint32_t rows0, uint32_t rows,
                    const double *mult, px_heal_finding *first)
{
    px_heal_envelope env;
    envelope(&env, 0.002);
    strcpy(env.device[0], dev0);
    strcpy(env.device[1], dev1);
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        px_heal_sample s;
        normal(&s, step);
        s.rows = step >= 10 ? rows : rows0;
        for (uint32_t k = 0; step >= 10 && k < 2 * N_STAGES + 1; k++) {
            double *v = k <= N_STAGES ? &s.xfer_s[k] : &s.compute_s[k - N_STAGES - 1];
            *v *= mult[k];
        }
        px_heal_finding f;
        while (px_heal_detector_observe(d, &s, &f)) {
            if (found++ == 0 && first)
                *first = f;
            s.n_stages = 0; /* drain the rest without feeding the step again */
        }
    }
    px_heal_detector_free(d);
    return found;
}

static void test_detector_expects_more_time_for_more_rows(void **state)
{
    (void)state;
    px_heal_finding f;
    /* Four times the rows, four times every time: no incident. */
    const double all4[] = {4, 4, 4, 4, 4};
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 32, 128, all4, NULL), 0);
    /* The same times with the rows not known: both stages depart (the
     * hops' growth stays below the floor). */
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 0, 0, all4, NULL), 2);
    /* ...or with the rows unchanged. */
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 128, 128, all4, NULL), 2);
    /* Fewer rows than the baseline's expect no less than the baseline. */
    const double all1[] = {1, 1, 1, 1, 1};
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 128, 8, all1, NULL), 0);
    /* Four times the rows, and stage 1 sixteen times slower: its fault,
     * reported at the baseline's rows. */
    const double slow1[] = {4, 4, 4, 4, 16};
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 32, 128, slow1, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_int_equal(f.locus.stage, 1);
    assert_string_equal(f.locus.device, "b.gpu0");
    assert_true(f.ratio > 3.5 && f.ratio < 4.5);
    assert_float_equal(f.observed_s, 0.004, 0.0002);
    px_assert_contains(f.evidence, "per step at 32 rows since step 10");
}

/* Two stages on two hosts, 32 rows a step.  Stage 1 costs 1 ms plus 1 us
 * per attended position; with `grow` every row attends one more position
 * each step (from 16 each), else 16 each throughout; from step `slow_at`
 * on it is `slow` times slower.  The envelope gives stage 1 `a` seconds
 * per position.  Returns the findings; the first in *first. */
static int run_positions(double a, bool grow, uint64_t slow_at, double slow, px_heal_finding *first)
{
    px_heal_envelope env;
    envelope(&env, 0.002);
    strcpy(env.device[0], "a.cpu0");
    strcpy(env.device[1], "b.gpu0");
    env.attention_pos_s[1] = a;
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 90; step++) {
        px_heal_sample s;
        normal(&s, step);
        s.rows = 32;
        s.context = 32 * (16 + (grow ? step : 0));
        s.compute_s[1] = (0.001 + 1e-6 * (double)s.context) * (step >= slow_at ? slow : 1);
        px_heal_finding f;
        while (px_heal_detector_observe(d, &s, &f)) {
            if (found++ == 0 && first)
                *first = f;
            s.n_stages = 0;
        }
    }
    px_heal_detector_free(d);
    return found;
}

static void test_detector_expects_more_time_for_more_positions(void **state)
{
    (void)state;
    px_heal_finding f;
    /* Positions grow from 512 to 3,360 at constant rows, the stage's time
     * by what its time per position says (1.5 ms to 4.4 ms): no
     * incident. */
    assert_int_equal(run_positions(1e-6, true, UINT64_MAX, 1, NULL), 0);
    /* Without the time per position the same growth reads as heat. */
    assert_int_equal(run_positions(0, true, UINT64_MAX, 1, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_int_equal(f.locus.stage, 1);
    /* A threefold slowdown at constant positions is still a fault... */
    assert_int_equal(run_positions(1e-6, false, 10, 3, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_string_equal(f.locus.device, "b.gpu0");
    assert_true(f.ratio > 2.8 && f.ratio < 3.2);
    px_assert_contains(f.evidence, "at 32 rows and 512 positions");
    /* ...and so is one while the positions grow as expected. */
    assert_int_equal(run_positions(1e-6, true, 30, 3, &f), 1);
    assert_int_equal(f.locus.stage, 1);
    /* A time per position far above what the baseline step can hold is
     * capped at the whole step over its positions: the slowdown at
     * constant positions is still found. */
    assert_int_equal(run_positions(0.5, false, 10, 3, NULL), 1);
    /* Positions not known (older traces): the rows' expectation alone. */
    px_heal_envelope env;
    envelope(&env, 0.002);
    env.attention_pos_s[1] = 1e-6;
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        px_heal_sample s;
        normal(&s, step);
        s.compute_s[1] *= step >= 10 ? 3 : 1;
        px_heal_finding g;
        found += px_heal_detector_observe(d, &s, &g);
    }
    px_heal_detector_free(d);
    assert_int_equal(found, 1);
}

static void test_detector_reads_loopback_hops_together_as_the_host(void **state)
{
    (void)state;
    px_heal_finding f;
    /* One host: the hops between its stages and to and from the executor
     * are loopback.  Two of them slow together, the stages not: the
     * host's cores, not a link. */
    const double hops12[] = {1, 20, 20, 1, 1};
    assert_int_equal(run_rows("local.cpu0", "local.emu-a", 0, 0, hops12, NULL), 0);
    const double hops02[] = {20, 1, 20, 1, 1};
    assert_int_equal(run_rows("local.cpu0", "local.emu-a", 0, 0, hops02, NULL), 0);
    /* One loopback hop slowing alone is still a slow link. */
    const double hop2[] = {1, 1, 20, 1, 1};
    assert_int_equal(run_rows("local.cpu0", "local.emu-a", 0, 0, hop2, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_LINK_DEGRADE);
    assert_string_equal(f.locus.device, "local.emu-a>executor");
    /* Two hosts: the hops cross links, each slow hop is a fault. */
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 0, 0, hops02, NULL), 2);
    assert_int_equal(run_rows("a.cpu0", "b.gpu0", 0, 0, hops12, NULL), 2);
}

/* Stage 1's compute triples from step 10 on; its thread waited runnable
 * for a core for `waited` of each step. */
static int run_waiting(double waited)
{
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        px_heal_sample s;
        normal(&s, step);
        if (step >= 10) {
            s.compute_s[1] *= 3;
            s.wait_s[1] = waited;
        }
        px_heal_finding f;
        found += px_heal_detector_observe(d, &s, &f);
    }
    px_heal_detector_free(d);
    return found;
}

/* A stage of 100 us whose rows triple while it slows twelvefold: its
 * scaled-back excess (300 us) is below the 500 us floor, the excess of the
 * step as it ran (900 us) is not. */
static void test_detector_applies_the_floor_to_the_step_as_it_ran(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 30; step++) {
        px_heal_sample s;
        normal(&s, step);
        s.rows = step >= 10 ? 30 : 10;
        s.compute_s[0] = step >= 10 ? 0.0012 : 0.0001;
        px_heal_finding f;
        found += px_heal_detector_observe(d, &s, &f);
    }
    px_heal_detector_free(d);
    assert_int_equal(found, 1);
}

static void test_detector_leaves_out_the_wait_for_a_core(void **state)
{
    (void)state;
    /* The extra time was spent waiting for a core: the host's, no fault. */
    assert_int_equal(run_waiting(0.002), 0);
    /* A wait that explains only part of it: the stage still departs. */
    assert_int_equal(run_waiting(0.0002), 1);
    /* No wait: a slow stage. */
    assert_int_equal(run_waiting(0), 1);
    /* A hop whose receiver waited for a core as long as it slowed. */
    for (int waited = 0; waited < 2; waited++) {
        px_heal_envelope env;
        envelope(&env, 0.002);
        px_heal_detector *d = detector(&env);
        int found = 0;
        for (uint64_t step = 0; step < 40; step++) {
            px_heal_sample s;
            normal(&s, step);
            if (step >= 10) {
                s.xfer_s[1] += 0.003;
                s.xfer_wait_s[1] = waited ? 0.003 : 0;
            }
            px_heal_finding f;
            found += px_heal_detector_observe(d, &s, &f);
        }
        px_heal_detector_free(d);
        assert_int_equal(found, waited ? 0 : 1);
    }
}

/* Runtime observations of a two-stage step on one host: 1 ms per stage,
 * 80 us per hop; from step 10 on the hop back to the executor takes
 * `extra_ns` longer, of which the executor's receiving thread waited
 * `waited_ns` for a core.  Returns the findings; *f gets the last. */
static int run_hop_back(uint64_t extra_ns, uint64_t waited_ns, px_heal_finding *f)
{
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector *d = detector(&env);
    int found = 0;
    for (uint64_t step = 0; step < 40; step++) {
        px_rt_step_obs obs;
        memset(&obs, 0, sizeof obs);
        obs.index = step;
        obs.n_stages = N_STAGES;
        obs.n_rows = 1;
        uint64_t j = ((step * 7) % 5) * 10000;
        for (uint32_t i = 0; i < N_STAGES; i++) {
            obs.compute_ns[i] = 1000000 + j;
            obs.xfer_in_ns[i] = 80000 + j / 10;
        }
        obs.xfer_out_ns = 80000 + j / 10;
        if (step >= 10) {
            obs.xfer_out_ns += extra_ns;
            obs.xfer_out_wait_ns = waited_ns;
        }
        px_heal_sample s;
        px_heal_sample_from_obs(&obs, (double)step * 0.003, &s);
        px_heal_finding g;
        if (px_heal_detector_observe(d, &s, &g)) {
            found++;
            if (f)
                *f = g;
        }
    }
    px_heal_detector_free(d);
    return found;
}

/* The hop back to the executor is judged without the time the
 * executor's own receiving thread waited for a core. */
static void test_detector_leaves_out_the_executors_wait_on_the_hop_back(void **state)
{
    (void)state;
    px_heal_finding f;
    /* All of the extra 3 ms was the executor's wait: the host, no fault. */
    assert_int_equal(run_hop_back(3000000, 3000000, NULL), 0);
    /* A real slow hop back still is one, wait or no wait. */
    assert_int_equal(run_hop_back(3000000, 0, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_LINK_DEGRADE);
    assert_string_equal(f.locus.device, "local.emu-a>executor");
    assert_int_equal(f.onset_step, 10);
    assert_int_equal(run_hop_back(3000000, 300000, &f), 1);
    assert_string_equal(f.locus.device, "local.emu-a>executor");
    /* Nothing slower, some wait: nothing. */
    assert_int_equal(run_hop_back(0, 50000, NULL), 0);
}

/* A stage on the host's cores shared with other stages and replicas
 * may run host_stretch times slower than its baseline before it departs;
 * a stage off the host (an accelerator) keeps the plain ratio, and so
 * does every stage with no stretch (1, the default). */
static int slowed_by(double factor, double host_stretch, bool on_host, px_heal_finding *f)
{
    px_heal_envelope env;
    envelope(&env, 0.002);
    env.host_cores[0] = env.host_cores[1] = on_host;
    px_heal_detector_opts o;
    px_heal_detector_opts_default(&o);
    o.host_stretch = host_stretch;
    px_heal_detector *d;
    px_err err;
    px_assert_ok(px_heal_detector_new(&env, &o, &d, &err), &err);
    int found = 0;
    px_heal_sample s;
    for (uint64_t step = 0; step < 40; step++) {
        normal(&s, step);
        if (step >= 12)
            s.compute_s[0] *= factor;
        found += px_heal_detector_observe(d, &s, f);
    }
    px_heal_detector_free(d);
    return found;
}

static void test_detector_allows_stages_on_a_shared_host_its_stretch(void **state)
{
    (void)state;
    px_heal_finding f;
    /* 2.5 times slower: a fault alone, the host's when it is shared by
     * twice its cores' stages. */
    assert_int_equal(slowed_by(2.5, 1, true, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_int_equal(slowed_by(2.5, 2, true, &f), 0);
    /* An accelerator's compute does not share the host's cores. */
    assert_int_equal(slowed_by(2.5, 2, false, &f), 1);
    assert_int_equal(f.locus.stage, 0);
    /* Beyond what sharing explains, a fault still. */
    assert_int_equal(slowed_by(6, 2, true, &f), 1);
    assert_int_equal(f.cls, PX_HEAL_THERMAL);
    assert_string_equal(f.locus.device, "local.cpu0");
    /* The option's bounds. */
    px_heal_envelope env;
    envelope(&env, 0.002);
    px_heal_detector_opts o;
    px_heal_detector_opts_default(&o);
    assert_true(o.host_stretch == 1);
    px_heal_detector *d = NULL;
    px_err err;
    const double bad[] = {0.5, 65, NAN};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        o.host_stretch = bad[i];
        assert_int_equal(px_heal_detector_new(&env, &o, &d, &err), PX_EINVAL);
        px_assert_contains(err.msg, "host_stretch");
    }
}

static void test_detector_reads_runtime_observations(void **state)
{
    (void)state;
    px_rt_step_obs obs;
    memset(&obs, 0, sizeof obs);
    obs.index = 9;
    obs.n_stages = 2;
    obs.compute_ns[0] = 1500000;
    obs.compute_ns[1] = 2000000;
    obs.xfer_in_ns[0] = 10000;
    obs.xfer_in_ns[1] = 80000;
    obs.xfer_out_ns = 30000;
    obs.n_rows = 96;
    obs.wait_ns[1] = 250000;
    obs.xfer_wait_ns[1] = 5000;
    obs.xfer_out_wait_ns = 7000;
    const uint32_t pos[2] = {40, 7}, n_tokens[2] = {1, 3};
    obs.n_seqs = 2;
    obs.pos = pos;
    obs.n_tokens = n_tokens;
    px_heal_sample s;
    px_heal_sample_from_obs(&obs, 1.25, &s);
    assert_int_equal(s.step, 9);
    assert_int_equal(s.n_stages, 2);
    assert_float_equal(s.t_s, 1.25, 0);
    assert_float_equal(s.compute_s[1], 0.002, 1e-15);
    assert_float_equal(s.xfer_s[1], 0.00008, 1e-15);
    assert_float_equal(s.xfer_s[2], 0.00003, 1e-15);
    assert_int_equal(s.rows, 96);
    assert_float_equal(s.wait_s[1], 0.00025, 1e-15);
    assert_float_equal(s.xfer_wait_s[1], 0.000005, 1e-15);
    assert_float_equal(s.xfer_wait_s[2], 0.000007, 1e-15);
    assert_int_equal(s.context, 51);

    px_rt_pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_stages = 2;
    spec.stages[1].pred_decode_s = (px_rt_interval){.p50 = 0.002, .lo = 0.001, .hi = 0.003};
    strcpy(spec.stages[1].device, "local.emu-b");
    spec.stages[1].pred_attention_pos_s = 2e-6;
    px_heal_envelope env;
    px_heal_envelope_from_spec(&spec, &env);
    assert_float_equal(env.attention_pos_s[1], 2e-6, 0);
    assert_int_equal(env.n_stages, 2);
    assert_float_equal(env.compute_hi[1], 0.003, 0);
    assert_true(isnan(env.xfer_hi[1]));
    assert_string_equal(env.device[1], "local.emu-b");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detector_tells_a_slow_link_from_a_slow_stage),
        cmocka_unit_test(test_detector_groups_stages_by_host),
        cmocka_unit_test(test_detector_ignores_jitter_below_the_floor),
        cmocka_unit_test(test_detector_flags_intermittent_degradation),
        cmocka_unit_test(test_detector_reports_a_stale_topology_once),
        cmocka_unit_test(test_detector_rebase_starts_a_new_baseline),
        cmocka_unit_test(test_detector_is_deterministic_and_checks_its_options),
        cmocka_unit_test(test_detector_expects_more_time_for_more_rows),
        cmocka_unit_test(test_detector_expects_more_time_for_more_positions),
        cmocka_unit_test(test_detector_reads_loopback_hops_together_as_the_host),
        cmocka_unit_test(test_detector_applies_the_floor_to_the_step_as_it_ran),
        cmocka_unit_test(test_detector_leaves_out_the_wait_for_a_core),
        cmocka_unit_test(test_detector_leaves_out_the_executors_wait_on_the_hop_back),
        cmocka_unit_test(test_detector_reads_runtime_observations),
        cmocka_unit_test(test_detector_allows_stages_on_a_shared_host_its_stretch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
