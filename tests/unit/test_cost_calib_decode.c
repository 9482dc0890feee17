/* The decode class of the calibration overlay: a stage's decode step of
 * two or more rows, measured whole.  A decode correction applies only in
 * the calibrated mode, only at two rows or more and inside its validity
 * range, in place of the terms composed from the one-row classes; a run
 * of several prompts gives one sample per stage (a run of one gives none),
 * and so does each window of a serving run's report at its rows and
 * context; new corrections cut older ones of their key to what they leave;
 * the class round-trips through the document. */
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
    return calib_fixture_setup("calib-decode-synth.gguf");
}

/* A decode correction for device: observed = factor x sourced, valid for
 * [vlo, vhi] rows per step. */
static px_cost_correction decode_corr(const char *device, double factor, double vlo, double vhi)
{
    px_cost_correction c;
    memset(&c, 0, sizeof c);
    px_strlcpy(c.device, device, sizeof c.device);
    c.cls = PX_COST_CLASS_DECODE;
    c.dtype = PX_DTYPE_F32;
    c.factor = factor;
    c.lo = factor * 0.9;
    c.hi = factor * 1.1;
    c.confidence = 0.95;
    c.valid_lo = vlo;
    c.valid_hi = vhi;
    c.n_samples = 3;
    px_strlcpy(c.dataset, "unit test", sizeof c.dataset);
    px_strlcpy(c.timestamp, "2026-12-03T19:00:00Z", sizeof c.timestamp);
    return c;
}

/* The whole model on local.cpu0, at `rows` sequences per step. */
static void one_stage(uint32_t rows, px_cost_pipeline *p, px_cost_workload *wl)
{
    memset(p, 0, sizeof *p);
    p->n_stages = 1;
    p->stages[0] = px_cost_stage_make(dev("local.cpu0"), fx.model);
    p->stages[0].first = 0;
    p->stages[0].last = 4;
    p->stages[0].embedding = p->stages[0].head = true;
    *wl = px_cost_workload_default();
    wl->batch = rows;
    wl->micro_batches = 1;
    wl->context = 64;
    wl->prompt_tokens = 5;
    wl->gen_tokens = 64;
}

static double decode_with(const px_cost_calibration *cal, uint32_t rows)
{
    px_cost_pipeline p;
    px_cost_workload wl;
    one_stage(rows, &p, &wl);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    static px_cost_estimate est;
    px_err err;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &est, &err), &err);
    assert_int_equal(est.why, PX_COST_OK);
    return est.stages[0].decode_s;
}

static void test_decode_correction_replaces_the_step_at_two_rows_or_more(void **state)
{
    (void)state;
    px_err err;
    px_cost_calibration *none, *cal;
    px_assert_ok(px_cost_calibration_new(&none, &err), &err);
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_cost_correction c = decode_corr("local.cpu0", 3.0, 2, 200);
    px_assert_ok(px_cost_calibration_add(cal, &c, &err), &err);
    /* One row: the one-row classes' step, whatever the decode class says. */
    assert_double_equal(decode_with(cal, 1), decode_with(none, 1), 0);
    /* 64 rows: three times the sourced decode term at the point
     * efficiencies, which px_cost_stage_terms_of gives. */
    px_cost_pipeline p;
    px_cost_workload wl;
    one_stage(64, &p, &wl);
    px_cost_stage_terms t;
    px_assert_ok(
        px_cost_stage_terms_of(fx.fleet, fx.model, &fx.params, &wl, &p.stages[0], &t, &err), &err);
    assert_double_equal(t.decode_size, 64, 0);
    assert_true(t.decode_s > 0);
    assert_double_equal(decode_with(cal, 64), 3.0 * t.decode_s, 1e-12 * t.decode_s);
    assert_true(decode_with(cal, 64) != decode_with(none, 64));
    /* Outside its range (256 rows), or for another device: not applied. */
    assert_double_equal(decode_with(cal, 256), decode_with(none, 256), 0);
    px_cost_calibration *other;
    px_assert_ok(px_cost_calibration_new(&other, &err), &err);
    c = decode_corr("local.emu-b", 3.0, 2, 200);
    px_assert_ok(px_cost_calibration_add(other, &c, &err), &err);
    assert_double_equal(decode_with(other, 64), decode_with(none, 64), 0);
    /* The sourced mode never reads it. */
    px_cost_params ps = fx.params;
    static px_cost_estimate a, b;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &ps, &wl, &p, NULL, &a, &err), &err);
    ps.calibration = cal;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &ps, &wl, &p, NULL, &b, &err), &err);
    assert_memory_equal(&a, &b, sizeof a);
    px_cost_calibration_free(none);
    px_cost_calibration_free(cal);
    px_cost_calibration_free(other);
}

static void test_runs_of_several_prompts_give_decode_samples(void **state)
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
    run.stages[0].decode_s = 2e-3;
    run.stages[1].decode_s = 3e-3;
    run.stages[1].xfer_in_s = 5e-5;
    run.n_prompts = 16;
    run.prompt_tokens = 16 * 5;
    run.decode_tokens = 16 * 24;
    run.tpot_s = 0.01;
    px_cost_calib_sample s[2];
    size_t n = 9;
    px_assert_ok(px_cost_run_decode_samples(&run, fx.fleet, fx.model, &fx.params, s, &n, &err),
                 &err);
    assert_int_equal(n, 2);
    px_cost_pipeline p;
    px_cost_workload wl;
    px_assert_ok(px_cost_run_pipeline(&run, fx.fleet, fx.model, &p, &wl, &err), &err);
    for (uint32_t i = 0; i < 2; i++) {
        px_cost_stage_terms t;
        px_assert_ok(
            px_cost_stage_terms_of(fx.fleet, fx.model, &fx.params, &wl, &p.stages[i], &t, &err),
            &err);
        assert_string_equal(s[i].device, run.stages[i].device);
        assert_int_equal(s[i].cls, PX_COST_CLASS_DECODE);
        assert_int_equal(s[i].dtype, PX_DTYPE_F32);
        assert_double_equal(s[i].size, 16, 0);
        assert_double_equal(s[i].predicted_s, t.decode_s, 0);
        assert_double_equal(s[i].observed_s, run.stages[i].decode_s, 0);
    }
    /* Fitted, they bring the calibrated step to what was observed. */
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_cost_fit_opts fo = {.dataset = "unit test", .range_slack = 1.5};
    px_assert_ok(px_cost_calibration_fit(cal, s, n, &fo, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 2);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    static px_cost_estimate est;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &est, &err), &err);
    assert_double_equal(est.stages[0].decode_s, 2e-3, 1e-12);
    assert_double_equal(est.stages[1].decode_s, 3e-3, 1e-12);
    px_cost_calibration_free(cal);
    /* Nor do they give weight-streaming samples: their steps hold the
     * work that grows with the rows. */
    px_assert_ok(px_cost_run_samples(&run, fx.fleet, fx.model, &fx.params, s, &n, &err), &err);
    assert_int_equal(n, 0);
    /* One prompt: its steps are the one-row classes' (px_cost_run_samples). */
    run.n_prompts = 1;
    run.prompt_tokens = 5;
    run.decode_tokens = 24;
    px_assert_ok(px_cost_run_decode_samples(&run, fx.fleet, fx.model, &fx.params, s, &n, &err),
                 &err);
    assert_int_equal(n, 0);
    px_assert_ok(px_cost_run_samples(&run, fx.fleet, fx.model, &fx.params, s, &n, &err), &err);
    assert_int_equal(n, 2);
}

/* A serving run's report (`plexus serve --run-report`): two windows of
 * replica 0's steps of about 64 rows, and one of steps of one row. */
static const char *served_doc =
    "{\"schema\": \"plexus.serve-run/1\", \"model\": \"m\", \"emulated\": true, \"runs\": ["
    "{\"schema\": \"plexus.run/1\", \"replica\": 0, \"window\": 0, \"steps\": 40,"
    " \"rows_per_step\": 63.6, \"context\": 40.4, \"prefill\": {\"tokens\": 0},"
    " \"decode\": {\"tokens\": 2544}, \"stages\": ["
    "  {\"device\": \"local.cpu0\", \"layers\": {\"first\": 0, \"last\": 1},"
    "   \"decode_s_per_token\": {\"observed\": 0.002}, \"core_wait_s_per_decode_step\": 0.0005},"
    "  {\"device\": \"local.emu-a\", \"layers\": {\"first\": 2, \"last\": 4},"
    "   \"decode_s_per_token\": {\"observed\": 0.003}, \"transfer_in_s_per_decode_step\": 5e-5}]},"
    "{\"schema\": \"plexus.run/1\", \"replica\": 0, \"window\": 1, \"steps\": 41,"
    " \"rows_per_step\": 64, \"context\": 40, \"prefill\": {\"tokens\": 0},"
    " \"decode\": {\"tokens\": 2624}, \"stages\": ["
    "  {\"device\": \"local.cpu0\", \"layers\": {\"first\": 0, \"last\": 1},"
    "   \"decode_s_per_token\": {\"observed\": 0.0022}},"
    "  {\"device\": \"local.emu-a\", \"layers\": {\"first\": 2, \"last\": 4},"
    "   \"decode_s_per_token\": {\"observed\": 0.0031}}]},"
    "{\"schema\": \"plexus.run/1\", \"replica\": 0, \"window\": 1, \"steps\": 9,"
    " \"rows_per_step\": 1, \"context\": 70, \"prefill\": {\"tokens\": 0},"
    " \"decode\": {\"tokens\": 9}, \"stages\": ["
    "  {\"device\": \"local.cpu0\", \"layers\": {\"first\": 0, \"last\": 1},"
    "   \"decode_s_per_token\": {\"observed\": 0.0002}},"
    "  {\"device\": \"local.emu-a\", \"layers\": {\"first\": 2, \"last\": 4},"
    "   \"decode_s_per_token\": {\"observed\": 0.0003}}]}]}";

static void parse_runs(const char *text, px_cost_run **runs, size_t *n)
{
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(text, strlen(text), "served.json", NULL, &doc, &err), &err);
    px_assert_ok(px_cost_runs_parse(doc, "served.json", runs, n, &err), &err);
    json_decref(doc);
}

static void test_serving_run_windows_give_decode_samples_at_their_rows(void **state)
{
    (void)state;
    px_err err;
    px_cost_run *runs;
    size_t n;
    parse_runs(served_doc, &runs, &n);
    assert_int_equal(n, 3);
    /* The rows and positions a step's rows attended, as the server counted. */
    assert_int_equal(runs[0].n_prompts, 64);
    assert_double_equal(runs[0].context, 40.4, 0);
    px_cost_pipeline p;
    px_cost_workload wl;
    px_assert_ok(px_cost_run_pipeline(&runs[0], fx.fleet, fx.model, &p, &wl, &err), &err);
    assert_int_equal(wl.batch, 64);
    assert_int_equal(wl.micro_batches, 1);
    assert_int_equal(wl.context, 40);
    /* Each window of 64 rows: a decode sample per stage; the window of one
     * row: weight-streaming samples. */
    px_cost_calib_sample s[6];
    size_t k = 0, got;
    for (size_t i = 0; i < 2; i++) {
        px_assert_ok(
            px_cost_run_decode_samples(&runs[i], fx.fleet, fx.model, &fx.params, s + k, &got, &err),
            &err);
        assert_int_equal(got, 2);
        for (size_t j = k; j < k + got; j++) {
            assert_int_equal(s[j].cls, PX_COST_CLASS_DECODE);
            assert_double_equal(s[j].size, 64, 0);
        }
        k += got;
    }
    assert_double_equal(s[2].observed_s, 0.0022, 0);
    px_assert_ok(
        px_cost_run_decode_samples(&runs[2], fx.fleet, fx.model, &fx.params, s + k, &got, &err),
        &err);
    assert_int_equal(got, 0);
    px_assert_ok(px_cost_run_samples(&runs[2], fx.fleet, fx.model, &fx.params, s + k, &got, &err),
                 &err);
    assert_int_equal(got, 2);
    assert_int_equal(s[k].cls, PX_COST_CLASS_MATVEC);
    /* Fitted: the two windows are two samples of each device at 64 rows,
     * and the calibrated step lies between them. */
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_cost_fit_opts fo = {.dataset = "served.json", .range_slack = 1.5};
    px_assert_ok(px_cost_calibration_fit(cal, s, 4, &fo, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 2);
    assert_int_equal(px_cost_calibration_at(cal, 0)->n_samples, 2);
    px_cost_params pc = fx.params;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    static px_cost_estimate est;
    px_assert_ok(px_cost_eval_pipeline(fx.fleet, fx.model, &pc, &wl, &p, NULL, &est, &err), &err);
    assert_true(est.stages[0].decode_s > 0.002 && est.stages[0].decode_s < 0.0022);
    assert_true(est.stages[1].decode_s > 0.003 && est.stages[1].decode_s < 0.0031);
    px_cost_calibration_free(cal);
    free(runs);
    /* A plain run report is one run; a serving run without runs, none. */
    parse_runs("{\"schema\": \"plexus.serve-run/1\", \"runs\": []}", &runs, &n);
    assert_int_equal(n, 0);
    assert_null(runs);
}

static void expect_refused(const char *text, px_status want, const char *where)
{
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(text, strlen(text), "served.json", NULL, &doc, &err), &err);
    px_cost_run *runs = (px_cost_run *)&err; /* overwritten on failure */
    size_t n = 7;
    assert_int_equal(px_cost_runs_parse(doc, "served.json", &runs, &n, &err), want);
    assert_null(runs);
    assert_int_equal(n, 0);
    px_assert_contains(err.msg, where);
    json_decref(doc);
}

static void test_serving_run_reports_refuse_hostile_documents(void **state)
{
    (void)state;
    const char *stage = "\"stages\": [{\"device\": \"local.cpu0\", \"layers\": {\"first\": 0, "
                        "\"last\": 4}}], \"prefill\": {\"tokens\": 0}, \"decode\": {\"tokens\": 8}";
    char text[1024];
    expect_refused("{\"schema\": \"plexus.serve-run/1\"}", PX_EVALIDATE, "served.json: /runs:");
    expect_refused("{\"schema\": \"plexus.serve-run/1\", \"runs\": {}}", PX_EVALIDATE, "/runs");
    /* Rows per step: not a number, below one, past the bound, not finite. */
    const char *rows[] = {"\"64\"", "0.5", "1e9", "-3"};
    for (size_t i = 0; i < PX_ARRAY_LEN(rows); i++) {
        snprintf(text, sizeof text,
                 "{\"schema\": \"plexus.serve-run/1\", \"runs\": [{%s, \"rows_per_step\": %s}]}",
                 stage, rows[i]);
        expect_refused(text, PX_EVALIDATE, "served.json: /runs/0: /rows_per_step");
    }
    snprintf(text, sizeof text,
             "{\"schema\": \"plexus.serve-run/1\", \"runs\": [{%s}, {%s, \"context\": 0}]}", stage,
             stage);
    expect_refused(text, PX_EVALIDATE, "served.json: /runs/1: /context");
    /* A run of the wrong kind inside. */
    snprintf(text, sizeof text,
             "{\"schema\": \"plexus.serve-run/1\", \"runs\": [{\"schema\": \"plexus.plan/1\", "
             "%s}]}",
             stage);
    expect_refused(text, PX_EVALIDATE, "/runs/0: /schema");
    /* More runs than a report may hold. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.serve-run/1\", \"runs\": [");
    for (int i = 0; i <= PX_COST_MAX_RUNS; i++)
        px_strbuf_addf(&sb, "%s{}", i ? "," : "");
    px_strbuf_adds(&sb, "]}");
    expect_refused(sb.buf, PX_ELIMIT, "/runs: 1025 runs; at most 1024");
    px_strbuf_release(&sb);
}

static void test_new_corrections_cut_older_ones_to_what_they_leave(void **state)
{
    (void)state;
    px_err err;
    px_cost_calibration *cal;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    /* The sweep's regimes at 32, 64 and 128 rows... */
    px_cost_correction a = decode_corr("local.cpu0", 1.0, 22, 45);
    px_cost_correction b = decode_corr("local.cpu0", 1.1, 46, 90);
    px_cost_correction c = decode_corr("local.cpu0", 1.2, 91, 181);
    px_cost_correction other = decode_corr("local.emu-a", 1.3, 40, 100);
    px_assert_ok(px_cost_calibration_add(cal, &a, &err), &err);
    px_assert_ok(px_cost_calibration_add(cal, &b, &err), &err);
    px_assert_ok(px_cost_calibration_add(cal, &c, &err), &err);
    px_assert_ok(px_cost_calibration_add(cal, &other, &err), &err);
    /* ...and one served at 68 rows, across all three: the 64 one is
     * covered, the others keep what it leaves of their ranges. */
    px_cost_correction s = decode_corr("local.cpu0", 2.0, 45.3, 102);
    px_assert_ok(px_cost_calibration_add(cal, &s, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 4);
    const double at[][2] = {{30, 1.0},  {44.9, 1.0}, {45.3, 2.0}, {64, 2.0},
                            {102, 2.0}, {103, 1.2},  {181, 1.2}};
    for (size_t i = 0; i < PX_ARRAY_LEN(at); i++) {
        size_t idx = 99;
        assert_int_equal(px_cost_calibration_lookup(cal, "local.cpu0", PX_COST_CLASS_DECODE,
                                                    PX_DTYPE_F32, at[i][0], &idx),
                         PX_COST_CALIB_APPLIED);
        assert_double_equal(px_cost_calibration_at(cal, idx)->factor, at[i][1], 0);
    }
    size_t idx;
    assert_int_equal(px_cost_calibration_lookup(cal, "local.emu-a", PX_COST_CLASS_DECODE,
                                                PX_DTYPE_F32, 64, &idx),
                     PX_COST_CALIB_APPLIED);
    assert_double_equal(px_cost_calibration_at(cal, idx)->factor, 1.3, 0);
    /* One cut in the middle becomes two. */
    px_cost_correction mid = decode_corr("local.emu-a", 4.0, 60, 70);
    px_assert_ok(px_cost_calibration_add(cal, &mid, &err), &err);
    assert_int_equal(px_cost_calibration_count(cal), 6);
    const double emu[][2] = {{50, 1.3}, {65, 4.0}, {80, 1.3}};
    for (size_t i = 0; i < PX_ARRAY_LEN(emu); i++) {
        assert_int_equal(px_cost_calibration_lookup(cal, "local.emu-a", PX_COST_CLASS_DECODE,
                                                    PX_DTYPE_F32, emu[i][0], &idx),
                         PX_COST_CALIB_APPLIED);
        assert_double_equal(px_cost_calibration_at(cal, idx)->factor, emu[i][1], 0);
    }
    /* The ranges of one key stay disjoint: the document reads back. */
    char *text = px_cost_calibration_dump(cal);
    px_cost_calibration *back;
    px_assert_ok(px_cost_calibration_parse(text, strlen(text), "t", &back, &err), &err);
    assert_int_equal(px_cost_calibration_count(back), 6);
    free(text);
    px_cost_calibration_free(back);
    px_cost_calibration_free(cal);
}

static void test_decode_correction_round_trips_through_its_document(void **state)
{
    (void)state;
    px_err err;
    px_cost_calibration *cal, *back;
    px_assert_ok(px_cost_calibration_new(&cal, &err), &err);
    px_cost_correction c = decode_corr("local.cpu0", 1.25, 45.3, 90.5);
    px_assert_ok(px_cost_calibration_add(cal, &c, &err), &err);
    char *text = px_cost_calibration_dump(cal);
    assert_non_null(text);
    px_assert_contains(text, "\"class\": \"decode\"");
    char *path = px_asprintf("%s/calib-decode.json", px_test_tmpdir());
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
    px_assert_ok(px_cost_calibration_load(path, &back, &err), &err);
    assert_int_equal(px_cost_calibration_count(back), 1);
    const px_cost_correction *k = px_cost_calibration_at(back, 0);
    assert_int_equal(k->cls, PX_COST_CLASS_DECODE);
    assert_double_equal(k->factor, 1.25, 0);
    assert_double_equal(k->valid_lo, 45.3, 0);
    px_cost_op_class cls;
    px_assert_ok(px_cost_op_class_parse("decode", &cls, &err), &err);
    assert_int_equal(cls, PX_COST_CLASS_DECODE);
    assert_string_equal(px_cost_op_class_name(PX_COST_CLASS_DECODE), "decode");
    assert_int_equal(px_cost_op_class_parse("decodes", &cls, &err), PX_EINVAL);
    px_assert_contains(err.msg, "step or decode");
    free(text);
    free(path);
    px_cost_calibration_free(cal);
    px_cost_calibration_free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_correction_replaces_the_step_at_two_rows_or_more),
        cmocka_unit_test(test_runs_of_several_prompts_give_decode_samples),
        cmocka_unit_test(test_serving_run_windows_give_decode_samples_at_their_rows),
        cmocka_unit_test(test_serving_run_reports_refuse_hostile_documents),
        cmocka_unit_test(test_new_corrections_cut_older_ones_to_what_they_leave),
        cmocka_unit_test(test_decode_correction_round_trips_through_its_document),
    };
    return cmocka_run_group_tests(tests, setup, calib_fixture_teardown);
}
