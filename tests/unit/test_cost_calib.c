/* The calibration overlay: its document round-trips and refuses hostile
 * input with the JSON pointer of the problem; fitting gives Student-t
 * intervals that stay wide for few samples and splits regimes at gaps;
 * the calibrated mode never changes sourced values, reproduces exactly,
 * refuses corrections outside their validity range (and the assumptions
 * say so); run reports become samples and before/after reports. */
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
    return calib_fixture_setup("calib-synth.gguf");
}

static px_cost_correction corr(const char *device, px_cost_op_class cls, double factor, double lo,
                               double hi, double vlo, double vhi)
{
    px_cost_correction c;
    memset(&c, 0, sizeof c);
    px_strlcpy(c.device, device, sizeof c.device);
    c.cls = cls;
    c.dtype = PX_DTYPE_F32;
    c.factor = factor;
    c.lo = lo;
    c.hi = hi;
    c.confidence = 0.95;
    c.valid_lo = vlo;
    c.valid_hi = vhi;
    c.n_samples = 5;
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

static void test_calibration_round_trips_through_its_document(void **state)
{
    (void)state;
    px_cost_correction cs[] = {
        corr("local.emu-a", PX_COST_CLASS_MATVEC, 1.7, 1.5, 1.9, 1e5, 4e5),
        corr("local.emu-a", PX_COST_CLASS_ATTENTION, 3.25, 1.1, 9.5, 10, 40),
        corr("local.emu-a", PX_COST_CLASS_ATTENTION, 2.5, 2.0, 3.0, 41, 160),
        corr("loopback", PX_COST_CLASS_COPY, 4.0, 3.0, 5.0, 128, 512),
    };
    cs[3].dtype = PX_DTYPE_COUNT_;
    px_cost_calibration *cal = overlay(cs, 4);
    char *text = px_cost_calibration_dump(cal);
    assert_non_null(text);
    px_assert_contains(text, "\"schema\": \"plexus.calibration/1\"");
    px_assert_contains(text, "\"dtype\": \"any\"");
    px_cost_calibration *back;
    px_err err;
    px_assert_ok(px_cost_calibration_parse(text, strlen(text), "t.json", &back, &err), &err);
    assert_int_equal(px_cost_calibration_count(back), 4);
    char *again = px_cost_calibration_dump(back);
    assert_string_equal(text, again);
    assert_string_equal(px_cost_calibration_digest(cal), px_cost_calibration_digest(back));
    const px_cost_correction *c = px_cost_calibration_at(back, 1);
    assert_true(c->factor == 3.25 && c->valid_hi == 40 && c->n_samples == 5);
    assert_null(px_cost_calibration_at(back, 4));
    free(text);
    free(again);
    px_cost_calibration_free(cal);
    px_cost_calibration_free(back);
}

static const char *good_corr =
    "{\"device\":\"local.cpu0\",\"class\":\"matvec\",\"dtype\":\"f32\","
    "\"valid\":{\"min\":1,\"max\":2},\"factor\":1.5,\"interval\":{\"lo\":1,\"hi\":2},"
    "\"confidence\":0.95,\"samples\":3,\"dataset\":\"d\",\"timestamp\":\"2026-11-29T19:00:00Z\"}";

static void expect_refused(const char *doc, const char *needle)
{
    px_cost_calibration *cal = (px_cost_calibration *)1;
    px_err err;
    px_status st = px_cost_calibration_parse(doc, strlen(doc), "cal.json", &cal, &err);
    if (st == PX_OK)
        fail_msg("accepted: %s", doc);
    assert_null(cal);
    px_assert_contains(err.msg, needle);
}

static char *with(const char *from, const char *to)
{
    const char *p = strstr(good_corr, from);
    assert_non_null(p);
    return px_asprintf("{\"schema\":\"plexus.calibration/1\",\"corrections\":[%.*s%s%s]}",
                       (int)(p - good_corr), good_corr, to, p + strlen(from));
}

static void test_calibration_refuses_hostile_documents(void **state)
{
    (void)state;
    expect_refused("", "cal.json");
    expect_refused("[]", "a calibration overlay is a JSON object");
    expect_refused("{\"schema\":\"plexus.calibration/2\",\"corrections\":[]}", "/schema");
    expect_refused("{\"schema\":\"plexus.calibration/1\"}", "/corrections");
    expect_refused("{\"schema\":\"plexus.calibration/1\",\"corrections\":[],\"x\":1}", "/x");
    expect_refused("{\"schema\":\"plexus.calibration/1\",\"corrections\":[1]}", "/corrections/0");
    static const char *const cases[][3] = {
        {"\"factor\":1.5", "\"factor\":-1", "/corrections/0/factor"},
        {"\"factor\":1.5", "\"factor\":\"1.5\"", "/corrections/0/factor"},
        {"\"factor\":1.5", "\"factor\":3", "/corrections/0/interval"},
        {"\"min\":1,\"max\":2", "\"min\":3,\"max\":2", "/corrections/0/valid"},
        {"\"min\":1,\"max\":2", "\"min\":1", "/corrections/0/valid/max"},
        {"\"class\":\"matvec\"", "\"class\":\"gemm\"", "/corrections/0/class"},
        {"\"dtype\":\"f32\"", "\"dtype\":\"f33\"", "/corrections/0/dtype"},
        {"\"confidence\":0.95", "\"confidence\":1", "/corrections/0/confidence"},
        {"\"samples\":3", "\"samples\":0", "/corrections/0/samples"},
        {"\"samples\":3", "\"samples\":2.5", "/corrections/0/samples"},
        {"\"timestamp\":\"2026-11-29T19:00:00Z\"", "\"timestamp\":\"yesterday\"",
         "/corrections/0/timestamp"},
        {"\"device\":\"local.cpu0\"", "\"device\":\"\"", "/corrections/0/device"},
        {"\"dataset\":\"d\"", "\"dataset\":\"d\",\"extra\":true", "/corrections/0/extra"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *doc = with(cases[i][0], cases[i][1]);
        expect_refused(doc, cases[i][2]);
        free(doc);
    }
    /* Two corrections of one key with overlapping ranges. */
    char *dup = px_asprintf("{\"schema\":\"plexus.calibration/1\",\"corrections\":[%s,%s]}",
                            good_corr, good_corr);
    expect_refused(dup, "/corrections/1: overlaps /corrections/0");
    free(dup);
    /* A device id longer than the reader keeps. */
    char big[200];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char *dev_long = px_asprintf("\"device\":\"%s\"", big);
    char *doc = with("\"device\":\"local.cpu0\"", dev_long);
    expect_refused(doc, "/corrections/0/device");
    free(doc);
    free(dev_long);
}

static void test_fit_keeps_intervals_wide_for_few_samples(void **state)
{
    (void)state;
    px_cost_calib_sample s[40];
    for (int i = 0; i < 40; i++)
        s[i] = (px_cost_calib_sample){
            i < 2 ? "local.emu-b" : "local.emu-a", PX_COST_CLASS_MATVEC, PX_DTYPE_F32, 2e5, 1e-4,
            1e-4 * (2.0 + 0.02 * ((i % 5) - 2))};
    px_cost_calibration *cal;
    px_err err;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_cost_fit_opts fo = {.dataset = "unit", .timestamp = "2026-11-29T19:00:00Z"};
    px_assert_ok(px_cost_calibration_fit(cal, s, 40, &fo, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 2);
    const px_cost_correction *few = px_cost_calibration_at(cal, 0);
    const px_cost_correction *many = px_cost_calibration_at(cal, 1);
    assert_string_equal(few->device, "local.emu-b");
    assert_int_equal(few->n_samples, 2);
    assert_int_equal(many->n_samples, 38);
    assert_true(fabs(many->factor - 2.0) < 0.01);
    /* Barely observed: at least the sourced 50% either side. */
    assert_true(few->hi - few->factor >= 0.5 * few->factor - 1e-12);
    /* Well observed: t(0.975, 37) x s x sqrt(1 + 1/38), about 2.03 x 0.0284. */
    double half = many->hi - many->factor;
    assert_true(half > 0.05 && half < 0.07);
    assert_true(few->valid_lo == 1e5 && few->valid_hi == 4e5);
    /* Garbage samples are refused, naming the sample. */
    s[3].observed_s = NAN;
    assert_int_equal(px_cost_calibration_fit(cal, s, 40, &fo, &err), PX_EINVAL);
    px_assert_contains(err.msg, "sample 3");
    px_cost_calibration_free(cal);
}

static void test_fit_splits_regimes_at_gaps(void **state)
{
    (void)state;
    px_cost_calib_sample s[6];
    double sizes[] = {20, 22, 80, 84, 300, 310};
    for (int i = 0; i < 6; i++)
        s[i] = (px_cost_calib_sample){
            "local.cpu0", PX_COST_CLASS_ATTENTION, PX_DTYPE_F32, sizes[i], 1.0, 1.0 + i / 2};
    px_cost_calibration *cal;
    px_err err;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_assert_ok(px_cost_calibration_fit(cal, s, 6, NULL, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 3);
    size_t idx = 99;
    assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F32, 21, &idx),
                     PX_COST_CALIB_APPLIED);
    assert_true(px_cost_calibration_at(cal, idx)->factor == 1.0);
    assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F32, 82, &idx),
                     PX_COST_CALIB_APPLIED);
    assert_true(px_cost_calibration_at(cal, idx)->factor == 2.0);
    assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F32, 305, &idx),
                     PX_COST_CALIB_APPLIED);
    assert_true(px_cost_calibration_at(cal, idx)->factor == 3.0);
    /* Outside every regime, another dtype, another device. */
    assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F32, 5000, &idx),
                     PX_COST_CALIB_OUT_OF_RANGE);
    assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F16, 21, &idx),
                     PX_COST_CALIB_DTYPE);
    assert_int_equal(px_cost_calibration_lookup(cal, "local.emu-a", PX_COST_CLASS_ATTENTION,
                                                PX_DTYPE_F32, 21, &idx),
                     PX_COST_CALIB_NONE);
    /* The regimes do not overlap: the document reads back. */
    char *text = px_cost_calibration_dump(cal);
    px_cost_calibration *back;
    px_assert_ok(px_cost_calibration_parse(text, strlen(text), "t", &back, &err), &err);
    free(text);
    px_cost_calibration_free(back);
    px_cost_calibration_free(cal);
}

static void test_fit_separates_fixed_cost_from_cost_per_byte(void **state)
{
    (void)state;
    px_err err;
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    /* Stages of 1, 2 and 4 blocks: 10 us fixed plus 0.5 x the sourced
     * time; and a hop whose time does not depend on the link at all. */
    px_cost_calib_sample s[] = {
        {"local.cpu0", PX_COST_CLASS_MATVEC, PX_DTYPE_F32, 2e5, 20e-6, 20e-6},
        {"local.cpu0", PX_COST_CLASS_MATVEC, PX_DTYPE_F32, 2e5, 40e-6, 30e-6},
        {"local.cpu0", PX_COST_CLASS_MATVEC, PX_DTYPE_F32, 2e5, 80e-6, 50e-6},
        {"loopback", PX_COST_CLASS_COPY, PX_DTYPE_COUNT_, 256, 5e-6, 40e-6},
        {"loopback", PX_COST_CLASS_COPY, PX_DTYPE_COUNT_, 256, 10e-6, 40e-6 + 1e-15},
        {"loopback", PX_COST_CLASS_COPY, PX_DTYPE_COUNT_, 256, 20e-6, 40e-6 + 3e-15},
    };
    px_assert_ok(px_cost_calibration_fit(cal, s, 6, NULL, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 2);
    const px_cost_correction *mv = px_cost_calibration_at(cal, 0);
    assert_true(fabs(mv->factor - 0.5) < 1e-9 && fabs(mv->offset_s - 10e-6) < 1e-12);
    const px_cost_correction *cp = px_cost_calibration_at(cal, 1);
    assert_true(cp->factor == 1e-6 && fabs(cp->offset_s - 40e-6) < 1e-9);
    /* Both read back. */
    char *text = px_cost_calibration_dump(cal);
    px_cost_calibration *back;
    px_assert_ok(px_cost_calibration_parse(text, strlen(text), "t", &back, &err), &err);
    free(text);
    px_cost_calibration_free(back);
    px_cost_calibration_free(cal);
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

static void test_calibrated_mode_leaves_sourced_values_unchanged(void **state)
{
    (void)state;
    px_cost_pipeline p = three_stages();
    px_cost_workload wl = small_wl();
    px_err err;
    size_t bytes = fx.fleet->n_devices * sizeof *fx.fleet->devices;
    px_cost_device *before_devs = malloc(bytes);
    memcpy(before_devs, fx.fleet->devices, bytes);
    px_cost_params before_params = fx.params;
    static px_cost_estimate sourced, sourced2, calibrated;
    px_assert_ok(
        px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &wl, &p, NULL, &sourced, &err), &err);
    px_cost_correction cs[] = {
        corr("local.emu-a", PX_COST_CLASS_MATVEC, 2.0, 1.8, 2.2, 1e4, 1e7),
        corr("local.emu-a", PX_COST_CLASS_ATTENTION, 2.0, 1.8, 2.2, 1, 1000),
    };
    px_cost_calibration *cal = overlay(cs, 2);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    px_assert_ok(px_cost_params_check(&pc, &err), &err);
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &calibrated, &err),
                 &err);
    /* The corrected stage doubles (memory-bound); the others do not move. */
    assert_true(fabs(calibrated.stages[1].decode_s / sourced.stages[1].decode_s - 2.0) < 1e-9);
    assert_true(calibrated.stages[0].decode_s == sourced.stages[0].decode_s);
    assert_true(calibrated.stages[2].decode_s == sourced.stages[2].decode_s);
    /* Sourced figures and the sourced mode are untouched. */
    assert_memory_equal(before_devs, fx.fleet->devices, bytes);
    assert_memory_equal(&before_params, &fx.params, sizeof before_params);
    px_assert_ok(
        px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &wl, &p, NULL, &sourced2, &err),
        &err);
    assert_memory_equal(&sourced, &sourced2, sizeof sourced);
    /* Each correction and the mode are listed in the assumptions. */
    json_t *a = px_cost_assumptions_json(fx.fleet, fx.model, &pc);
    char *text = px_json_dump_canonical(a);
    px_assert_contains(text, "calibration overlay (mode calibrated)");
    px_assert_contains(text, "calibration: local.emu-a matvec (f32)");
    px_assert_contains(text, "applies where");
    free(text);
    json_decref(a);
    a = px_cost_assumptions_json(fx.fleet, fx.model, &fx.params);
    text = px_json_dump_canonical(a);
    assert_null(strstr(text, "calibration"));
    free(text);
    json_decref(a);
    free(before_devs);
    px_cost_calibration_free(cal);
}

static void test_both_modes_reproduce_exactly(void **state)
{
    (void)state;
    px_cost_pipeline p = three_stages();
    px_cost_workload wl = small_wl();
    px_err err;
    px_cost_correction cs[] = {corr("local.cpu0", PX_COST_CLASS_MATVEC, 0.4, 0.3, 0.6, 1e4, 1e7)};
    px_cost_calibration *cal = overlay(cs, 1);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    static px_cost_uncertain a, b, c, d;
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &wl, &p, 0, 0, &a, &err),
                 &err);
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &pc, &wl, &p, 0, 0, &b, &err), &err);
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &fx.params, &wl, &p, 0, 0, &c, &err),
                 &err);
    px_assert_ok(px_cost_uncertainty(fx.fleet, fx.model, &pc, &wl, &p, 0, 0, &d, &err), &err);
    assert_memory_equal(&a, &c, sizeof a);
    assert_memory_equal(&b, &d, sizeof b);
    /* The corrected stage's interval is the correction's, not the
     * sourced +-50% bandwidth: narrower relative to its median. */
    double wa = (a.decode_s[0].hi - a.decode_s[0].lo) / a.decode_s[0].p50;
    double wb = (b.decode_s[0].hi - b.decode_s[0].lo) / b.decode_s[0].p50;
    assert_true(wb < wa);
    assert_true(b.decode_s[0].p50 < a.decode_s[0].p50);
    px_cost_calibration_free(cal);
}

static void test_out_of_range_correction_is_not_applied(void **state)
{
    (void)state;
    px_cost_pipeline p = three_stages();
    px_cost_workload wl = small_wl();
    px_err err;
    /* Valid only for blocks of 1 to 2 GB: nothing like this model's. */
    px_cost_correction cs[] = {
        corr("local.emu-b", PX_COST_CLASS_MATVEC, 3.0, 2.5, 3.5, 1e9, 2e9),
        corr("local.emu-b", PX_COST_CLASS_ATTENTION, 3.0, 2.5, 3.5, 4096, 8192),
        corr("n9.gpu0", PX_COST_CLASS_MATVEC, 3.0, 2.5, 3.5, 1, 1e12),
    };
    px_cost_calibration *cal = overlay(cs, 3);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    static px_cost_estimate s, c;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &fx.params, &wl, &p, NULL, &s, &err),
                 &err);
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &c, &err), &err);
    assert_memory_equal(&s, &c, sizeof s);
    json_t *a = px_cost_assumptions_json(fx.fleet, fx.model, &pc);
    char *text = px_json_dump_canonical(a);
    px_assert_contains(text, "not applied: outside its validity range");
    px_assert_contains(text, "not applied: no device \\\"n9.gpu0\\\" in this inventory");
    free(text);
    json_decref(a);
    px_cost_calibration_free(cal);
}

static void test_params_check_pairs_mode_and_overlay(void **state)
{
    (void)state;
    px_err err;
    px_cost_params p = fx.params;
    p.mode = PX_COST_CALIBRATED;
    assert_int_equal(px_cost_params_check(&p, &err), PX_EINVAL);
    px_assert_contains(err.msg, "needs a calibration overlay");
    px_cost_calibration *cal = overlay(NULL, 0);
    p.mode = PX_COST_SOURCED;
    p.calibration = cal;
    assert_int_equal(px_cost_params_check(&p, &err), PX_EINVAL);
    p.mode = PX_COST_CALIBRATED;
    px_assert_ok(px_cost_params_check(&p, &err), &err);
    px_cost_calibration_free(cal);
}

static const char *run_doc =
    "{\"schema\":\"plexus.run/1\",\"prefill\":{\"tokens\":5,\"seconds\":0.01},"
    "\"decode\":{\"tokens\":63,\"seconds\":0.04},\"results\":[{\"prompt\":\"x\"}],"
    "\"stages\":["
    "{\"device\":\"local.cpu0\",\"layers\":{\"first\":0,\"last\":1},"
    "\"decode_s_per_token\":{\"observed\":%g},\"prefill_s\":{\"observed\":0.001}},"
    "{\"device\":\"local.emu-a\",\"layers\":{\"first\":2,\"last\":3},"
    "\"decode_s_per_token\":{\"observed\":%g},\"transfer_in_s_per_decode_step\":4e-5},"
    "{\"device\":\"local.emu-b\",\"layers\":{\"first\":4,\"last\":4},"
    "\"decode_s_per_token\":{\"observed\":%g}}]}";

static void parse_run(double a, double b, double c, px_cost_run *run)
{
    char *text = px_asprintf(run_doc, a, b, c);
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(text, strlen(text), "run.json", NULL, &doc, &err), &err);
    px_assert_ok(px_cost_run_parse(doc, "run.json", run, &err), &err);
    json_decref(doc);
    free(text);
}

static void test_run_reports_calibrate_and_check(void **state)
{
    (void)state;
    px_err err;
    static px_cost_run runs[4];
    /* Observed: cpu0 at 40% of its sourced figure, the emus slower. */
    double obs[4][3] = {{3.1e-5, 2.1e-4, 1.3e-4},
                        {3.0e-5, 2.0e-4, 1.25e-4},
                        {3.2e-5, 2.05e-4, 1.3e-4},
                        {3.05e-5, 2.02e-4, 1.28e-4}};
    for (int i = 0; i < 4; i++)
        parse_run(obs[i][0], obs[i][1], obs[i][2], &runs[i]);
    assert_int_equal(runs[0].n_stages, 3);
    assert_int_equal(runs[0].n_prompts, 1);
    px_cost_pipeline pipe;
    px_cost_workload wl;
    px_assert_ok(px_cost_run_pipeline(&runs[0], fx.fleet, fx.model, &pipe, &wl, &err), &err);
    assert_int_equal(wl.prompt_tokens, 5);
    assert_int_equal(wl.context, 5 + 32);
    px_cost_calib_sample s[3 * 3];
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        size_t got;
        px_assert_ok(
            px_cost_run_samples(&runs[i], fx.fleet, fx.model, &fx.params, s + n, &got, &err), &err);
        assert_int_equal(got, 3);
        assert_true(s[n].cls == PX_COST_CLASS_MATVEC);
        /* The observation less the sourced attention. */
        assert_true(s[n].observed_s < obs[i][0] && s[n].observed_s > 0.5 * obs[i][0]);
        n += got;
    }
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_assert_ok(px_cost_calibration_fit(cal, s, n, NULL, &err), &err);
    /* Weight streaming on each of three devices. */
    assert_int_equal(px_cost_calibration_count(cal), 3);
    /* Held out: run 3. */
    px_cost_calib_obs o[3];
    px_assert_ok(px_cost_run_check(&runs[3], "held", fx.fleet, fx.model, &fx.params, cal, o, &n,
                                   NULL, NULL, &err),
                 &err);
    assert_int_equal(n, 3);
    px_cost_calib_summary sum;
    px_strbuf sb = PX_STRBUF_INIT;
    px_assert_ok(px_cost_calib_report(o, n, &sum, &sb), NULL);
    px_assert_contains(sb.buf, "held stage 1 local.emu-a decode");
    px_assert_contains(sb.buf, "median absolute error");
    assert_true(sum.mae_after < 0.05);
    assert_true(sum.mae_after < sum.mae_before);
    assert_true(sum.coverage_after >= 1.0);
    px_strbuf_release(&sb);
    /* A run on a device the inventory lacks, and a broken report. */
    px_cost_run bad = runs[0];
    px_strlcpy(bad.stages[1].device, "local.gpu7", sizeof bad.stages[1].device);
    assert_int_equal(px_cost_run_pipeline(&bad, fx.fleet, fx.model, &pipe, &wl, &err),
                     PX_ENOTFOUND);
    px_assert_contains(err.msg, "local.gpu7");
    json_t *doc = json_pack("{s:s, s:[{s:s, s:{s:i, s:i}}]}", "schema", "plexus.run/1", "stages",
                            "device", "local.cpu0", "layers", "first", 3, "last", 0);
    px_cost_run r;
    assert_int_equal(px_cost_run_parse(doc, "r.json", &r, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "/stages/0/layers");
    json_decref(doc);
    px_cost_calibration_free(cal);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibration_round_trips_through_its_document),
        cmocka_unit_test(test_calibration_refuses_hostile_documents),
        cmocka_unit_test(test_fit_keeps_intervals_wide_for_few_samples),
        cmocka_unit_test(test_fit_splits_regimes_at_gaps),
        cmocka_unit_test(test_fit_separates_fixed_cost_from_cost_per_byte),
        cmocka_unit_test(test_calibrated_mode_leaves_sourced_values_unchanged),
        cmocka_unit_test(test_both_modes_reproduce_exactly),
        cmocka_unit_test(test_out_of_range_correction_is_not_applied),
        cmocka_unit_test(test_params_check_pairs_mode_and_overlay),
        cmocka_unit_test(test_run_reports_calibrate_and_check),
    };
    return cmocka_run_group_tests(tests, setup, calib_fixture_teardown);
}
