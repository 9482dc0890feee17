/* Replaying the healing loop's detector from a trace: the step records
 * (heal.step.N) and their fields rows, context, wait_s and xfer_wait_s.
 * What a run records replays identical, and a changed wait changes the
 * decision; older records without those fields replay with their
 * defaults; hostile values (wrong types, negative, huge, non-finite,
 * waits longer than their time, context beyond the rows) are refused with
 * the trace file, the record, the field and the fix; rows above a plan's
 * batch are taken as recorded. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "heal/heal_run_impl.h"
#include "plexus/heal.h"
#include "plexus/trace.h"

#define N_STAGES 2
/* A decision is recorded on the step that confirms a finding: 8 baseline
 * steps, a slowdown from step 10, confirmed on its third step. */
#define N_STEPS 13

static void envelope(px_heal_envelope *env)
{
    memset(env, 0, sizeof *env);
    env->n_stages = N_STAGES;
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++) {
        if (i < PX_RT_MAX_STAGES)
            env->compute_p50[i] = env->compute_hi[i] = i < N_STAGES ? 0.001 : NAN;
        env->xfer_p50[i] = env->xfer_hi[i] = NAN;
    }
    px_strlcpy(env->device[0], "local.cpu0", sizeof env->device[0]);
    px_strlcpy(env->device[1], "local.emu-a", sizeof env->device[1]);
}

static void opts(px_heal_detector_opts *o)
{
    px_heal_detector_opts_default(o);
}

/* A step as a run records it: 1 ms per stage, 80 us per hop, 8 rows.
 * With `slow`, from step 10 stage 1 takes 2 ms more and the hop back to
 * the executor 3 ms more, all of it spent waiting for a core (`waits`
 * says whether the record says so). */
static void sample_at(px_heal_sample *s, uint64_t step, bool slow, bool waits)
{
    memset(s, 0, sizeof *s);
    s->step = step;
    s->t_s = (double)step * 0.003;
    s->n_stages = N_STAGES;
    double j = (double)((step * 7) % 5) * 1e-5;
    for (uint32_t i = 0; i < N_STAGES; i++)
        s->compute_s[i] = 0.001 + j;
    for (uint32_t i = 0; i <= N_STAGES; i++)
        s->xfer_s[i] = 0.00008 + j / 10;
    s->rows = 8;
    s->context = 8 * (40 + step);
    if (slow && step >= 10) {
        s->compute_s[1] += 0.002;
        s->xfer_s[N_STAGES] += 0.003;
        if (waits) {
            s->wait_s[1] = 0.002;
            s->xfer_wait_s[N_STAGES] = 0.003;
        }
    }
}

/* The recorded form of the samples, as the run writes it. */
static json_t *step_json(const px_heal_sample *s)
{
    json_t *j = px__hr_sample_json(s, 0.003);
    assert_non_null(j);
    return j;
}

/* Writes a trace of the steps (owned by the caller) and one "heal.detect"
 * decision over them whose recorded output is the detector's over
 * `decided` (n samples), or {} when NULL.  Returns the path (free). */
static char *write_trace(const char *tag, json_t *const *steps, size_t n,
                         const px_heal_sample *decided)
{
    char *path = px_asprintf("%s/%s.trace", px_test_tmpdir(), tag);
    px_trace_writer *w;
    px_err err;
    px_assert_ok(px_trace_writer_open(path, "run", &w, &err), &err);
    json_t *names = json_array();
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "heal.step.%zu", i);
        px_assert_ok(px_trace_observation(w, name, steps[i], &err), &err);
        json_array_append_new(names, json_string(name));
    }
    px_heal_envelope env;
    envelope(&env);
    px_heal_detector_opts o;
    opts(&o);
    json_t *inputs = json_pack("{s:o, s:o, s:o}", "envelope", px__hr_envelope_json(&env),
                               "detector", px__hr_detector_opts_json(&o), "samples", names);
    json_t *out = json_object();
    if (decided) {
        json_decref(out);
        px_heal_finding f;
        px_assert_ok(px__hr_detect(&env, &o, decided, n, &f, &out, &err), &err);
    }
    px_assert_ok(px_trace_decision(w, "heal.detect", inputs, out, NULL, &err), &err);
    px_assert_ok(px_trace_writer_close(w, &err), &err);
    json_decref(inputs);
    json_decref(out);
    return path;
}

static px_status replay(const char *path, px_trace_replay_report *rep, px_err *err)
{
    size_t n;
    const px_trace_deriver *d = px_heal_replay_derivers(&n);
    return px_trace_replay(path, d, n, NULL, rep, err);
}

static void free_steps(json_t **steps, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_decref(steps[i]);
}

/* What a run records replays identical; the same records under a decision
 * taken without their waits come out different, so replay reads them
 * (the hop back's included). */
static void test_replay_reads_the_step_fields_a_run_records(void **state)
{
    (void)state;
    px_heal_sample s[N_STEPS], blind[N_STEPS];
    json_t *steps[N_STEPS];
    for (uint64_t i = 0; i < N_STEPS; i++) {
        sample_at(&s[i], i, true, true);
        sample_at(&blind[i], i, true, false);
        steps[i] = step_json(&s[i]);
    }
    px_trace_replay_report rep;
    px_err err;
    char *path = write_trace("recorded", steps, N_STEPS, s);
    px_assert_ok(replay(path, &rep, &err), &err);
    assert_int_equal(rep.n_identical, 1);
    free(path);

    path = write_trace("recorded-blind", steps, N_STEPS, blind);
    assert_int_equal(replay(path, &rep, &err), PX_EDIVERGED);
    px_assert_contains(rep.divergence, "\"heal.detect\"");
    px_assert_contains(rep.divergence, "came out different");
    free(path);

    /* The hop back alone: its wait is the last entry of xfer_wait_s. */
    for (uint64_t i = 0; i < N_STEPS; i++) {
        s[i].compute_s[1] = blind[i].compute_s[1] = s[i].compute_s[0];
        s[i].wait_s[1] = 0;
        json_decref(steps[i]);
        steps[i] = step_json(&s[i]);
    }
    px_heal_envelope env;
    envelope(&env);
    px_heal_detector_opts o;
    opts(&o);
    px_heal_finding f;
    json_t *out;
    px_assert_ok(px__hr_detect(&env, &o, s, N_STEPS, &f, &out, &err), &err);
    json_decref(out);
    assert_int_equal(f.cls, PX_HEAL_NONE);
    px_assert_ok(px__hr_detect(&env, &o, blind, N_STEPS, &f, &out, &err), &err);
    json_decref(out);
    assert_int_equal(f.cls, PX_HEAL_LINK_DEGRADE);
    assert_string_equal(f.locus.device, "local.emu-a>executor");
    path = write_trace("hop-back", steps, N_STEPS, s);
    px_assert_ok(replay(path, &rep, &err), &err);
    free(path);
    path = write_trace("hop-back-blind", steps, N_STEPS, blind);
    assert_int_equal(replay(path, &rep, &err), PX_EDIVERGED);
    free(path);
    free_steps(steps, N_STEPS);
}

/* Traces from before steps carried them lack rows, context, wait_s and
 * xfer_wait_s: they replay, reading 0 for each (not known: no scaling by
 * rows, nothing left out as waiting). */
static void test_replay_takes_older_steps_without_the_new_fields(void **state)
{
    (void)state;
    px_heal_sample s[N_STEPS];
    json_t *steps[N_STEPS];
    for (uint64_t i = 0; i < N_STEPS; i++) {
        sample_at(&s[i], i, true, false);
        steps[i] = step_json(&s[i]);
        json_object_del(steps[i], "rows");
        json_object_del(steps[i], "context");
        json_object_del(steps[i], "wait_s");
        json_object_del(steps[i], "xfer_wait_s");
        s[i].rows = 0;
        s[i].context = 0;
    }
    px_heal_sample got;
    double wall;
    px_err err;
    px_assert_ok(px__hr_sample_from_json(steps[12], "heal.step.12", &got, &wall, &err), &err);
    assert_int_equal(got.rows, 0);
    assert_int_equal(got.context, 0);
    for (uint32_t i = 0; i <= N_STAGES; i++) {
        assert_true(got.xfer_wait_s[i] == 0);
        if (i < N_STAGES)
            assert_true(got.wait_s[i] == 0);
    }
    assert_float_equal(got.xfer_s[N_STAGES], s[12].xfer_s[N_STAGES], 0);

    char *path = write_trace("older", steps, N_STEPS, s);
    px_trace_replay_report rep;
    px_assert_ok(replay(path, &rep, &err), &err);
    assert_int_equal(rep.n_identical, 1);
    free(path);
    free_steps(steps, N_STEPS);
}

/* N_STEPS normal steps, step 3's `field` set to the JSON `value`. */
static char *trace_with(const char *tag, const char *field, const char *value, bool decide)
{
    json_t *steps[N_STEPS];
    px_heal_sample s[N_STEPS];
    for (uint64_t i = 0; i < N_STEPS; i++) {
        sample_at(&s[i], i, false, false);
        steps[i] = step_json(&s[i]);
    }
    json_error_t je;
    json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
    if (!v)
        fail_msg("test value %s: %s", value, je.text);
    assert_int_equal(json_object_set_new(steps[3], field, v), 0);
    px_err err;
    /* What replay will recompute, for values it takes. */
    if (decide)
        px_assert_ok(px__hr_sample_from_json(steps[3], "heal.step.3", &s[3], NULL, &err), &err);
    char *path = write_trace(tag, steps, N_STEPS, decide ? s : NULL);
    free_steps(steps, N_STEPS);
    return path;
}

static void expect_refused(const char *field, const char *value, const char *needle)
{
    static int k;
    char tag[32];
    snprintf(tag, sizeof tag, "hostile-%d", k++);
    char *path = trace_with(tag, field, value, false);
    px_trace_replay_report rep;
    px_err err;
    px_err_clear(&err);
    px_status st = replay(path, &rep, &err);
    if (st == PX_OK)
        fail_msg("\"%s\": %s was accepted; expected \"%s\"", field, value, needle);
    char quoted[48];
    snprintf(quoted, sizeof quoted, "\"%s\"", field);
    px_assert_contains(err.msg, path);                   /* the trace file */
    px_assert_contains(err.msg, "\"heal.detect\"");      /* the decision reading it */
    px_assert_contains(err.msg, "\"heal.step.3\"");      /* the record */
    px_assert_contains(err.msg, quoted);                 /* the field */
    px_assert_contains(err.msg, needle);                 /* what is wrong */
    px_assert_contains(err.msg, "record the run again"); /* the fix */
    free(path);
}

static void expect_taken(const char *field, const char *value)
{
    static int k;
    char tag[32];
    snprintf(tag, sizeof tag, "taken-%d", k++);
    char *path = trace_with(tag, field, value, true);
    px_trace_replay_report rep;
    px_err err;
    px_assert_ok(replay(path, &rep, &err), &err);
    assert_int_equal(rep.n_identical, 1);
    free(path);
}

static void test_replay_refuses_hostile_step_fields(void **state)
{
    (void)state;
    /* Negative. */
    expect_refused("wait_s", "[0.0001, -0.002]", "is -0.002 s; a time is never negative");
    expect_refused("xfer_wait_s", "[0, -1e-9, 0]", "never negative");
    expect_refused("compute_s", "[0.001, -0.001]", "never negative");
    expect_refused("rows", "-1", "is an integer out of range");
    expect_refused("context", "-5", "is an integer out of range");
    /* Huge. */
    expect_refused("wait_s", "[1e300, 0]", "more than the 0.00101 s of \"compute_s\"[0]");
    expect_refused("rows", "4294967296", "out of range; it must be an integer from 0");
    expect_refused("rows", "9223372036854775807", "out of range");
    /* More context than 8 rows can attend to (8 x 2^24 positions). */
    expect_refused("context", "134217729", "times 16777216");
    /* Wrong type. */
    expect_refused("wait_s", "\"0.0001\"", "is a string; it must be an array of 2 numbers");
    expect_refused("wait_s", "{\"stage\": 1}", "is an object");
    expect_refused("wait_s", "null", "is null");
    expect_refused("wait_s", "[0.0001, \"x\"]", "[1] is a string; it must be a number or null");
    expect_refused("xfer_wait_s", "true", "is a boolean");
    expect_refused("xfer_wait_s", "[0, [0], 0]", "[1] is an array");
    expect_refused("rows", "\"8\"", "is a string");
    expect_refused("rows", "8.5", "is a real");
    expect_refused("rows", "{}", "is an object");
    expect_refused("context", "[1]", "is an array");
    expect_refused("context", "1.5", "is a real");
    /* Wrong length. */
    expect_refused("wait_s", "[0.0001]", "is an array of 1; it must be an array of 2");
    expect_refused("xfer_wait_s", "[0, 0, 0, 0]", "is an array of 4; it must be an array of 3");
    /* A wait longer than its own time: the stage's, a hop's, the hop back's. */
    expect_refused("wait_s", "[0.002, 0]", "more than the 0.00101 s of \"compute_s\"[0]");
    expect_refused("xfer_wait_s", "[0, 0, 0.0009]", "of \"xfer_s\"[2] it is part of");
}

static void test_replay_takes_what_the_fields_mean(void **state)
{
    (void)state;
    /* A wait as long as its time: the whole stage waited for a core. */
    char whole[64];
    snprintf(whole, sizeof whole, "[%.17g, 0]", 0.001 + (double)((3 * 7) % 5) * 1e-5);
    expect_taken("wait_s", whole);
    /* null: not known, as for any recorded time. */
    expect_taken("wait_s", "[null, 0.0001]");
    /* Rows far above any plan's batch are what the step carried (a run
     * given more prompts than its plan's batch carries them). */
    expect_taken("rows", "100000");
    expect_taken("rows", "4294967295");
    /* Every row at the longest context. */
    expect_taken("context", "134217728");
    expect_taken("context", "0");
    /* Negative zero is zero. */
    expect_taken("wait_s", "[-0.0, 0]");
}

/* NaN and infinities are not JSON: the trace reader refuses the line,
 * naming the file and the line, before any record is read from it. */
static void test_replay_refuses_non_finite_numbers_by_line(void **state)
{
    (void)state;
    char *path = trace_with("finite", "rows", "8", true);
    char *text;
    size_t len;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 24, &text, &len, &err), &err);
    const char *bad[] = {"NaN", "Infinity", "-Infinity", "1e999", "-1e999"};
    for (size_t k = 0; k < PX_ARRAY_LEN(bad); k++) {
        /* The step's line is the fifth (the header, then steps 0 to 3). */
        char *at = strstr(text, "\"name\":\"heal.step.3\"");
        assert_non_null(at);
        char *line = at;
        while (line > text && line[-1] != '\n')
            line--;
        char *rows = strstr(line, "\"rows\":8");
        assert_non_null(rows);
        px_strbuf sb = PX_STRBUF_INIT;
        px_strbuf_add(&sb, text, (size_t)(rows - text));
        px_strbuf_addf(&sb, "\"rows\":8,\"wait_s\":[%s,0]", bad[k]);
        px_strbuf_adds(&sb, rows + strlen("\"rows\":8"));
        char *edited = px_asprintf("%s/non-finite-%zu.trace", px_test_tmpdir(), k);
        px_assert_ok(px_write_file(edited, sb.buf, sb.len, &err), &err);
        px_trace_replay_report rep;
        px_err_clear(&err);
        assert_int_not_equal(replay(edited, &rep, &err), PX_OK);
        char *where = px_asprintf("%s:5", edited);
        px_assert_contains(err.msg, where);
        free(where);
        free(edited);
        px_strbuf_release(&sb);
    }
    free(text);
    free(path);
}

/* The envelope's time per attended position: recorded with the envelope,
 * read back, refused out of its range or shape, absent in older traces. */
static void test_envelope_time_per_position_under_hostile_input(void **state)
{
    (void)state;
    px_heal_envelope env, got;
    envelope(&env);
    env.attention_pos_s[0] = 2e-7;
    env.attention_pos_s[1] = NAN;
    px_err err;
    json_t *j = px__hr_envelope_json(&env);
    assert_non_null(j);
    px_assert_ok(px__hr_envelope_from_json(j, &got, &err), &err);
    assert_float_equal(got.attention_pos_s[0], 2e-7, 0);
    assert_true(isnan(got.attention_pos_s[1]));

    json_object_del(j, "attention_s_per_position");
    px_assert_ok(px__hr_envelope_from_json(j, &got, &err), &err);
    assert_true(isnan(got.attention_pos_s[0]) && isnan(got.attention_pos_s[1]));

    const struct {
        const char *value, *needle;
    } bad[] = {
        {"[-1e-6, 0]", "from 0 to 1 s"},
        {"[1.5, 0]", "from 0 to 1 s"},
        {"[0]", "an array of 1"},
        {"[0, 0, 0]", "an array of 3"},
        {"[\"fast\", 0]", "must be a number or null"},
        {"{}", "must be an array of 2 numbers"},
        {"7", "must be an array of 2 numbers"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        json_t *v = json_loads(bad[i].value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(j, "attention_s_per_position", v), 0);
        px_err_clear(&err);
        if (px__hr_envelope_from_json(j, &got, &err) != PX_EPARSE)
            fail_msg("attention_s_per_position %s was accepted", bad[i].value);
        px_assert_contains(err.msg, "\"attention_s_per_position\"");
        px_assert_contains(err.msg, bad[i].needle);
        px_assert_contains(err.msg, "record the run again");
    }
    json_decref(j);
}

/* The envelope's stage count and the detector's options, refused by
 * field, with what they must be and what to do. */
static void test_envelope_and_detector_options_refused_by_field(void **state)
{
    (void)state;
    px_heal_envelope env;
    envelope(&env);
    px_err err;
    json_t *j = px__hr_envelope_json(&env);
    assert_non_null(j);
    const char *stages[] = {"0", "99", "\"2\"", "1.5", "null"};
    for (size_t i = 0; i < PX_ARRAY_LEN(stages); i++) {
        json_t *v = json_loads(stages[i], JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(j, "n_stages", v), 0);
        px_err_clear(&err);
        if (px__hr_envelope_from_json(j, &env, &err) != PX_EPARSE)
            fail_msg("n_stages %s was accepted", stages[i]);
        px_assert_contains(err.msg, "\"n_stages\"");
        px_assert_contains(err.msg, "from 1 to");
        px_assert_contains(err.msg, "record the run again");
    }
    json_decref(j);
    json_t *arr = json_array();
    px_err_clear(&err);
    assert_int_equal(px__hr_envelope_from_json(arr, &env, &err), PX_EPARSE);
    px_assert_contains(err.msg, "must be an object");
    json_decref(arr);

    px_heal_detector_opts o, got;
    px_heal_detector_opts_default(&o);
    json_t *d = px__hr_detector_opts_json(&o);
    assert_non_null(d);
    px_assert_ok(px__hr_detector_opts_from_json(d, &got, &err), &err);
    assert_int_equal(got.baseline_steps, o.baseline_steps);
    assert_int_equal(got.confirm, o.confirm);
    assert_float_equal(got.ratio, o.ratio, 1e-12);
    const struct {
        const char *field, *value, *needle;
    } bad[] = {
        {"baseline_steps", "0", "at least 1"},   {"baseline_steps", "5000", "at most 4096"},
        {"baseline_steps", "2.5", "an integer"}, {"confirm", "65", "at most 64"},
        {"confirm", "\"3\"", "an integer"},      {"ratio", "1", "over 1"},
        {"ratio", "null", "a number"},           {"floor_s", "-1", "at least 0"},
        {"stale_ratio", "1e7", "under 1e+06"},   {"host_stretch", "0.5", "at least 1"},
        {"host_stretch", "65", "at most 64"},    {"host_stretch", "\"2\"", "a number"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        json_t *c = json_deep_copy(d), *v = json_loads(bad[i].value, JSON_DECODE_ANY, NULL);
        assert_non_null(c);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(c, bad[i].field, v), 0);
        px_err_clear(&err);
        if (px__hr_detector_opts_from_json(c, &got, &err) != PX_EPARSE)
            fail_msg("%s %s was accepted", bad[i].field, bad[i].value);
        char field[64];
        px_textf(field, sizeof field, "\"%s\"", bad[i].field);
        px_assert_contains(err.msg, field);
        px_assert_contains(err.msg, bad[i].needle);
        px_assert_contains(err.msg, "record the run again");
        json_decref(c);
    }
    json_decref(d);
}

/* Which stages run on the host's cores and the stretch allowed them:
 * recorded with the envelope and the detector's options, read back,
 * refused out of shape, absent in older traces (no stage on the host, no
 * stretch: the detector as it then ran). */
static void test_host_cores_and_stretch_are_recorded(void **state)
{
    (void)state;
    px_heal_envelope env, got;
    envelope(&env);
    env.host_cores[1] = true;
    px_err err;
    json_t *j = px__hr_envelope_json(&env);
    assert_non_null(j);
    px_assert_ok(px__hr_envelope_from_json(j, &got, &err), &err);
    assert_false(got.host_cores[0]);
    assert_true(got.host_cores[1]);
    const char *bad[] = {"[true]", "[true, 1]", "{}", "\"yes\""};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        json_t *v = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_int_equal(json_object_set_new(j, "host_cores", v), 0);
        px_err_clear(&err);
        if (px__hr_envelope_from_json(j, &got, &err) != PX_EPARSE)
            fail_msg("host_cores %s was accepted", bad[i]);
        px_assert_contains(err.msg, "\"host_cores\"");
        px_assert_contains(err.msg, "record the run again");
    }
    json_object_del(j, "host_cores");
    px_assert_ok(px__hr_envelope_from_json(j, &got, &err), &err);
    assert_false(got.host_cores[0] || got.host_cores[1]);
    json_decref(j);

    px_heal_detector_opts o, back;
    px_heal_detector_opts_default(&o);
    o.host_stretch = 2.5;
    json_t *d = px__hr_detector_opts_json(&o);
    px_assert_ok(px__hr_detector_opts_from_json(d, &back, &err), &err);
    assert_float_equal(back.host_stretch, 2.5, 0);
    json_object_del(d, "host_stretch");
    px_assert_ok(px__hr_detector_opts_from_json(d, &back, &err), &err);
    assert_float_equal(back.host_stretch, 1, 0);
    json_decref(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_reads_the_step_fields_a_run_records),
        cmocka_unit_test(test_replay_takes_older_steps_without_the_new_fields),
        cmocka_unit_test(test_replay_refuses_hostile_step_fields),
        cmocka_unit_test(test_replay_takes_what_the_fields_mean),
        cmocka_unit_test(test_replay_refuses_non_finite_numbers_by_line),
        cmocka_unit_test(test_envelope_time_per_position_under_hostile_input),
        cmocka_unit_test(test_envelope_and_detector_options_refused_by_field),
        cmocka_unit_test(test_host_cores_and_stretch_are_recorded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
