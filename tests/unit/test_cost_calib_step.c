/* The step class of the calibration overlay: the host's work per step
 * outside the stages' kernels (the executor's round trip, sampling and
 * token handling per row), sourced as rows x host_row_s.  A step
 * correction applies only in the calibrated mode, only when it is for the
 * first stage's device (and the plan's assumptions say so), is drawn in
 * the Monte Carlo, is fitted as a fixed time from what run reports leave
 * after their stages and hops, or as a fixed time plus a time per row
 * from runs at several batch sizes, and round-trips through the
 * document. */
#include "calib_fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"

static int setup(void **state)
{
    (void)state;
    return calib_fixture_setup("calib-step-synth.gguf");
}

/* A step correction: a fixed time per step for pipelines starting on
 * device, valid for [vlo, vhi] bytes of logits per step. */
static px_cost_correction step_corr(const char *device, double offset_s, double vlo, double vhi)
{
    px_cost_correction c;
    memset(&c, 0, sizeof c);
    px_strlcpy(c.device, device, sizeof c.device);
    c.cls = PX_COST_CLASS_STEP;
    c.dtype = PX_DTYPE_COUNT_;
    c.factor = 1.0;
    c.offset_s = offset_s;
    c.lo = 0.8;
    c.hi = 1.25;
    c.confidence = 0.95;
    c.valid_lo = vlo;
    c.valid_hi = vhi;
    c.n_samples = 9;
    px_strlcpy(c.dataset, "unit test", sizeof c.dataset);
    px_strlcpy(c.timestamp, "2026-11-29T19:00:00Z", sizeof c.timestamp);
    return c;
}

static px_cost_calibration *overlay(const px_cost_correction *cs, size_t n)
{
    px_cost_calibration *cal;
    px_err err;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    for (size_t i = 0; i < n; i++)
        px_assert_ok(px_cost_calibration_add(cal, &cs[i], &err), &err);
    return cal;
}

static px_cost_pipeline three_stages(void)
{
    px_cost_pipeline p;
    memset(&p, 0, sizeof p);
    p.n_stages = 3;
    const char *ids[] = {"local.cpu0", "local.emu-a", "local.emu-b"};
    int32_t first[] = {0, 2, 4}, last[] = {1, 3, 4};
    for (int i = 0; i < 3; i++) {
        p.stages[i] = px_cost_stage_make(dev(ids[i]), fx.model);
        p.stages[i].first = first[i];
        p.stages[i].last = last[i];
        p.stages[i].embedding = i == 0;
        p.stages[i].head = i == 2;
    }
    return p;
}

static px_cost_workload small_wl(void)
{
    px_cost_workload wl = px_cost_workload_default();
    wl.context = 37;
    wl.prompt_tokens = 5;
    wl.gen_tokens = 64;
    return wl;
}

static void eval_with(const px_cost_calibration *cal, px_cost_estimate *est)
{
    px_cost_pipeline p = three_stages();
    px_cost_workload wl = small_wl();
    px_cost_params pc = fx.params;
    pc.mode = cal ? PX_COST_CALIBRATED : PX_COST_SOURCED;
    pc.calibration = cal;
    px_err err;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, est, &err), &err);
}

static char *assumptions_with(const px_cost_calibration *cal)
{
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    json_t *a = px_cost_assumptions_json(fx.fleet, fx.model, &pc);
    assert_non_null(a);
    char *text = px_json_dump_canonical(a);
    json_decref(a);
    return text;
}

static void test_step_term_applies_only_in_calibrated_mode_when_present(void **state)
{
    (void)state;
    px_cost_workload wl = small_wl();
    double size = px_cost_step_size(fx.model, &wl);
    assert_true(size == 512 * 4.0);
    static px_cost_estimate sourced, again, empty, other, out, in;
    eval_with(NULL, &sourced);
    assert_int_equal(sourced.why, PX_COST_OK);
    /* No step correction: the calibrated mode adds nothing. */
    px_cost_calibration *none = overlay(NULL, 0);
    eval_with(none, &empty);
    assert_memory_equal(&sourced, &empty, sizeof sourced);
    /* A step correction for a device that does not start this pipeline,
     * and one outside its validity range: nothing either. */
    px_cost_correction c_other = step_corr("local.emu-b", 1e-3, 1, 1e9);
    px_cost_calibration *cal_other = overlay(&c_other, 1);
    eval_with(cal_other, &other);
    assert_memory_equal(&sourced, &other, sizeof sourced);
    px_cost_correction c_out = step_corr("local.cpu0", 1e-3, 1e6, 1e7);
    px_cost_calibration *cal_out = overlay(&c_out, 1);
    eval_with(cal_out, &out);
    assert_memory_equal(&sourced, &out, sizeof sourced);
    char *text = assumptions_with(cal_out);
    px_assert_contains(text, "calibration: local.cpu0 step (any dtype)");
    px_assert_contains(text, "not applied: outside its validity range");
    free(text);
    /* The sourced host time per row: one row here. */
    assert_double_equal(sourced.executor_s, fx.params.host_row_s, 1e-18);
    /* Present and in range: the time per token grows by the fixed time,
     * and so does the first token; per-stage figures stay. */
    px_cost_correction c_in = step_corr("local.cpu0", 1e-3, size / 2, size * 2);
    px_cost_calibration *cal_in = overlay(&c_in, 1);
    eval_with(cal_in, &in);
    assert_double_equal(in.tpot_s, sourced.tpot_s + 1e-3, 1e-12);
    assert_double_equal(in.ttft_s, sourced.ttft_s + 1e-3, 1e-12);
    /* Not a transfer between stages: what binds stays. */
    assert_double_equal(in.transfer_s, sourced.transfer_s, 0);
    assert_double_equal(in.executor_s, 1e-3 + sourced.executor_s, 1e-15);
    assert_int_equal(in.bind, sourced.bind);
    assert_memory_equal(in.stages, sourced.stages, sizeof sourced.stages);
    text = assumptions_with(cal_in);
    px_assert_contains(text, "applied: the host's work per step");
    px_assert_contains(text, "0.001 s plus 1e-05 s per row");
    free(text);
    /* The sourced mode is the same with or without any overlay around. */
    eval_with(NULL, &again);
    assert_memory_equal(&sourced, &again, sizeof sourced);
    /* The Monte Carlo draws it: the calibrated median moves by about the
     * fixed time, and the interval widens by the correction's spread. */
    px_cost_pipeline p = three_stages();
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = none;
    static px_cost_uncertain ua, ub;
    px_err err;
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &pc, &wl, &p, 0, 0, &ua, &err), &err);
    pc.calibration = cal_in;
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &pc, &wl, &p, 0, 0, &ub, &err), &err);
    assert_true(ub.tpot_s.p50 > ua.tpot_s.p50 + 0.8e-3);
    assert_true(ub.tpot_s.p50 < ua.tpot_s.p50 + 1.2e-3);
    assert_true(ub.tpot_s.hi - ub.tpot_s.lo > ua.tpot_s.hi - ua.tpot_s.lo);
    px_cost_calibration_free(none);
    px_cost_calibration_free(cal_other);
    px_cost_calibration_free(cal_out);
    px_cost_calibration_free(cal_in);
}

static void test_step_correction_round_trips_through_its_document(void **state)
{
    (void)state;
    px_err err;
    px_cost_correction cs[] = {step_corr("local.cpu0", 2.5e-4, 1024, 4096),
                               step_corr("local.emu-a", 3e-4, 1024, 4096)};
    px_cost_calibration *cal = overlay(cs, 2);
    char *text = px_cost_calibration_dump(cal);
    assert_non_null(text);
    px_assert_contains(text, "\"class\": \"step\"");
    px_cost_calibration *back;
    px_assert_ok(px_cost_calibration_parse(text, strlen(text), "step.json", &back, &err), &err);
    assert_int_equal(px_cost_calibration_count(back), 2);
    const px_cost_correction *b = px_cost_calibration_at(back, 0);
    assert_int_equal(b->cls, PX_COST_CLASS_STEP);
    assert_true(b->dtype == PX_DTYPE_COUNT_);
    assert_double_equal(b->offset_s, 2.5e-4, 1e-18);
    char *again = px_cost_calibration_dump(back);
    assert_string_equal(text, again);
    assert_string_equal(px_cost_calibration_digest(cal), px_cost_calibration_digest(back));
    size_t idx = 99;
    assert_int_equal(px_cost_calibration_lookup(back, "local.emu-a", PX_COST_CLASS_STEP,
                                                PX_DTYPE_F32, 2048, &idx),
                     PX_COST_CALIB_APPLIED);
    assert_int_equal(idx, 1);
    assert_int_equal(px_cost_calibration_lookup(back, "local.emu-a", PX_COST_CLASS_STEP,
                                                PX_DTYPE_F32, 8192, &idx),
                     PX_COST_CALIB_OUT_OF_RANGE);
    free(text);
    free(again);
    px_cost_calibration_free(cal);
    px_cost_calibration_free(back);
    /* An unknown class names the ones there are. */
    px_cost_op_class k;
    assert_int_equal(px_cost_op_class_parse("hop", &k, &err), PX_EINVAL);
    px_assert_contains(err.msg, "copy, step or decode");
}

static void test_fit_makes_step_a_fixed_time_with_an_interval(void **state)
{
    (void)state;
    px_err err;
    px_cost_calib_sample s[5];
    double obs[5] = {2.0e-4, 2.2e-4, 1.9e-4, 2.1e-4, 1.8e-4};
    for (int i = 0; i < 5; i++)
        s[i] = (px_cost_calib_sample){"local.cpu0", PX_COST_CLASS_STEP, PX_DTYPE_COUNT_, 2048, 0,
                                      obs[i]};
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_assert_ok(px_cost_calibration_fit(cal, s, 5, NULL, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 1);
    const px_cost_correction *c = px_cost_calibration_at(cal, 0);
    assert_int_equal(c->cls, PX_COST_CLASS_STEP);
    assert_double_equal(c->factor, 1.0, 0);
    assert_double_equal(c->offset_s, 2.0e-4, 1e-12);
    assert_true(c->lo < 1.0 && c->hi > 1.0);
    /* t(0.975, 4) x spread (~0.079) x sqrt(1.2): about 24% each side. */
    assert_true(c->hi - 1.0 > 0.15 && c->hi - 1.0 < 0.35);
    assert_true(c->valid_lo <= 2048 && c->valid_hi >= 2048);
    assert_int_equal(c->n_samples, 5);
    px_cost_calibration_free(cal);
    /* A prediction of 0 is the step class's alone. */
    s[0].cls = PX_COST_CLASS_MATVEC;
    s[0].dtype = PX_DTYPE_F32;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    assert_int_equal(px_cost_calibration_fit(cal, s, 1, NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "calibration sample 0");
    px_cost_calibration_free(cal);
}

/* Runs at 1 to 64 rows whose host work is 150 us + 25 us per row (with a
 * spread of +-2%) fit that fixed time and time per row, with an interval
 * from the spread alone; a plan at 128 rows is priced with them. */
static void test_fit_over_batches_gives_a_fixed_time_and_a_time_per_row(void **state)
{
    (void)state;
    px_err err;
    px_cost_calib_sample s[21];
    size_t n = 0;
    double row = fx.params.host_row_s;
    for (int rep = 0; rep < 3; rep++)
        for (uint32_t r = 1; r <= 64; r *= 2) {
            double noise = 1.0 + 0.02 * (double)((int)((n * 7) % 5) - 2) / 2.0;
            s[n++] = (px_cost_calib_sample){"local.cpu0",    PX_COST_CLASS_STEP,
                                            PX_DTYPE_COUNT_, r * 512 * 4.0,
                                            r * row,         (150e-6 + 25e-6 * r) * noise};
        }
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_assert_ok(px_cost_calibration_fit(cal, s, n, NULL, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 1);
    const px_cost_correction *c = px_cost_calibration_at(cal, 0);
    assert_int_equal(c->cls, PX_COST_CLASS_STEP);
    assert_int_equal(c->n_samples, 21);
    if (!(fabs(c->offset_s - 150e-6) < 15e-6 && fabs(c->factor * row - 25e-6) < 1e-6))
        fail_msg("fitted %g s + %g s per row, expected 150 us + 25 us", c->offset_s,
                 c->factor * row);
    /* The interval comes from the spread: a few percent, not the sourced
     * range. */
    assert_true(c->lo < c->factor && c->hi > c->factor);
    assert_true(c->hi / c->factor - 1.0 < 0.06);
    /* Valid from one row to twice the largest batch run. */
    assert_true(c->valid_lo <= 512 * 4.0 && c->valid_hi >= 128 * 512 * 4.0);
    /* A plan at 128 rows: sourced, 128 x host_row_s; calibrated, the
     * fitted fixed time and time per row. */
    px_cost_pipeline p = three_stages();
    px_cost_workload wl = small_wl();
    wl.batch = 128;
    static px_cost_estimate src, cal_est;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &wl, &p, NULL, &src, &err),
                 &err);
    assert_double_equal(src.executor_s, 128 * row, 1e-15);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &cal_est, &err),
                 &err);
    assert_double_equal(cal_est.executor_s, c->offset_s + c->factor * 128 * row, 1e-15);
    assert_true(cal_est.step_s >= src.step_s - src.executor_s + cal_est.executor_s - 1e-12);
    px_cost_calibration_free(cal);
}

/* A run at 8 rows gives a step sample against the sourced per-row
 * prediction: what its time per token leaves after the stages as
 * predicted and the observed hop. */
static void test_run_at_a_batch_gives_a_host_sample(void **state)
{
    (void)state;
    px_err err;
    px_cost_run run;
    memset(&run, 0, sizeof run);
    run.n_stages = 2;
    px_strlcpy(run.stages[0].device, "local.cpu0", sizeof run.stages[0].device);
    px_strlcpy(run.stages[1].device, "local.emu-a", sizeof run.stages[1].device);
    run.stages[0].first = 0;
    run.stages[0].last = 1;
    run.stages[1].first = 2;
    run.stages[1].last = 4;
    run.stages[0].decode_s = run.stages[1].decode_s = 1e-3;
    run.stages[0].xfer_in_s = NAN;
    run.stages[1].xfer_in_s = 5e-5;
    run.n_prompts = 8;
    run.prompt_tokens = 40;
    run.decode_tokens = 8 * 24;
    run.tpot_s = 0.05;
    px_cost_calib_sample smp;
    bool has = false;
    px_assert_ok(px_cost_run_host_sample(&run, fx.fleet, fx.model, &fx.params, &smp, &has, &err),
                 &err);
    assert_true(has);
    px_cost_pipeline p;
    px_cost_workload wl;
    static px_cost_estimate est;
    px_assert_ok(px_cost_run_pipeline(&run, fx.fleet, fx.model, &p, &wl, &err), &err);
    assert_int_equal(wl.batch, 8);
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &wl, &p, NULL, &est, &err),
                 &err);
    assert_string_equal(smp.device, "local.cpu0");
    assert_int_equal(smp.cls, PX_COST_CLASS_STEP);
    assert_double_equal(smp.size, 8 * 512 * 4.0, 0);
    assert_double_equal(smp.predicted_s, 8 * fx.params.host_row_s, 1e-18);
    /* The logits' way back, 8 rows of 512 over the loopback link, as
     * predicted. */
    assert_true(est.return_s > 8 * 512 * 4.0 / 2e9);
    assert_double_equal(
        smp.observed_s,
        0.05 - est.stages[0].decode_s - est.stages[1].decode_s - 5e-5 - est.return_s, 1e-12);
    /* Nothing left (the stages take it all), or no hop observed: none. */
    run.tpot_s = 1e-9;
    px_assert_ok(px_cost_run_host_sample(&run, fx.fleet, fx.model, &fx.params, &smp, &has, &err),
                 &err);
    assert_false(has);
    run.tpot_s = 0.05;
    run.stages[1].xfer_in_s = NAN;
    px_assert_ok(px_cost_run_host_sample(&run, fx.fleet, fx.model, &fx.params, &smp, &has, &err),
                 &err);
    assert_false(has);
}

static const char *run_doc =
    "{\"schema\":\"plexus.run/1\",\"prefill\":{\"tokens\":5,\"seconds\":0.01},"
    "\"decode\":{\"tokens\":63,\"seconds\":0.04},\"results\":[{\"prompt\":\"x\"}],"
    "%s"
    "\"stages\":["
    "{\"device\":\"local.cpu0\",\"layers\":{\"first\":0,\"last\":1},"
    "\"decode_s_per_token\":{\"observed\":%g}},"
    "{\"device\":\"local.emu-a\",\"layers\":{\"first\":2,\"last\":4},"
    "\"decode_s_per_token\":{\"observed\":%g}%s}]}";

static void parse_run(const char *tpot, double a, double b, const char *xfer, px_cost_run *run)
{
    char *text = px_asprintf(run_doc, tpot, a, b, xfer);
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(text, strlen(text), "run.json", NULL, &doc, &err), &err);
    px_assert_ok(px_cost_run_parse(doc, "run.json", run, &err), &err);
    json_decref(doc);
    free(text);
}

static void test_run_reports_give_the_executor_round_trip(void **state)
{
    (void)state;
    px_err err;
    px_cost_run run;
    px_cost_calib_sample s;
    bool has = true;
    /* 1 ms per token: 0.2 + 0.5 ms of stages, 0.05 ms between them. */
    parse_run("\"tpot_s\":{\"observed\":1e-3},", 2e-4, 5e-4,
              ",\"transfer_in_s_per_decode_step\":5e-5", &run);
    px_assert_ok(px_cost_run_step_sample(&run, fx.fleet, fx.model, &s, &has, &err), &err);
    assert_true(has);
    assert_int_equal(s.cls, PX_COST_CLASS_STEP);
    assert_string_equal(s.device, "local.cpu0");
    assert_double_equal(s.observed_s, 2.5e-4, 1e-12);
    assert_double_equal(s.predicted_s, 0, 0);
    assert_double_equal(s.size, 2048, 0);
    /* Nothing to learn without the time per token, without the hop
     * between stages, or when the stages already account for it all. */
    parse_run("", 2e-4, 5e-4, ",\"transfer_in_s_per_decode_step\":5e-5", &run);
    px_assert_ok(px_cost_run_step_sample(&run, fx.fleet, fx.model, &s, &has, &err), &err);
    assert_false(has);
    parse_run("\"tpot_s\":{\"observed\":1e-3},", 2e-4, 5e-4, "", &run);
    px_assert_ok(px_cost_run_step_sample(&run, fx.fleet, fx.model, &s, &has, &err), &err);
    assert_false(has);
    parse_run("\"tpot_s\":{\"observed\":1e-3},", 5e-4, 5e-4,
              ",\"transfer_in_s_per_decode_step\":5e-5", &run);
    px_assert_ok(px_cost_run_step_sample(&run, fx.fleet, fx.model, &s, &has, &err), &err);
    assert_false(has);
    /* Fitted from three runs, the end-to-end check of a fourth comes
     * close in the calibrated mode, and not in the sourced one. */
    px_cost_calib_sample all[3 * 3];
    size_t n = 0;
    double tp[4] = {1.0e-3, 1.05e-3, 0.98e-3, 1.02e-3};
    static px_cost_run runs[4];
    for (int i = 0; i < 4; i++) {
        char tpot[64];
        snprintf(tpot, sizeof tpot, "\"tpot_s\":{\"observed\":%g},", tp[i]);
        parse_run(tpot, 2e-4, 5e-4, ",\"transfer_in_s_per_decode_step\":5e-5", &runs[i]);
    }
    for (int i = 0; i < 3; i++) {
        size_t got;
        px_assert_ok(
            px_cost_run_samples(&runs[i], fx.fleet, fx.model, &fx.params, all + n, &got, &err),
            &err);
        px_assert_ok(
            px_cost_run_step_sample(&runs[i], fx.fleet, fx.model, all + n + got, &has, &err), &err);
        assert_true(has);
        n += got + 1;
    }
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_assert_ok(px_cost_calibration_fit(cal, all, n, NULL, &err), &err);
    size_t idx;
    assert_int_equal(
        px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_STEP, PX_DTYPE_F32, 2048, &idx),
        PX_COST_CALIB_APPLIED);
    px_cost_calib_obs o[2], e2e;
    bool has_e2e = false;
    px_assert_ok(px_cost_run_check(&runs[3], "held", fx.fleet, fx.model, &fx.params, cal, o, &n,
                                   &e2e, &has_e2e, &err),
                 &err);
    assert_true(has_e2e);
    double before = fabs(e2e.before.p50 - e2e.observed_s) / e2e.observed_s;
    double after = fabs(e2e.after.p50 - e2e.observed_s) / e2e.observed_s;
    assert_true(after < 0.15);
    assert_true(after < before);
    px_cost_calibration_free(cal);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_term_applies_only_in_calibrated_mode_when_present),
        cmocka_unit_test(test_step_correction_round_trips_through_its_document),
        cmocka_unit_test(test_fit_makes_step_a_fixed_time_with_an_interval),
        cmocka_unit_test(test_run_reports_give_the_executor_round_trip),
        cmocka_unit_test(test_fit_over_batches_gives_a_fixed_time_and_a_time_per_row),
        cmocka_unit_test(test_run_at_a_batch_gives_a_host_sample),
    };
    return cmocka_run_group_tests(tests, setup, calib_fixture_teardown);
}
