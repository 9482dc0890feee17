/* Trace writing, bounded reading, tamper detection and replay. */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#include "plexus/trace.h"
#include "trace/trace_impl.h"

/* A toy decision: the sum of the recorded "numbers" input, plus the last
 * observed "offset" (observations are fed back, not recomputed). */
static px_status derive_sum(void *ctx, const px_trace_event *rec, const json_t *history,
                            json_t **out, px_err *err)
{
    (void)rec;
    int bias = ctx ? *(int *)ctx : 0;
    json_t *nums = json_object_get(history, "numbers");
    if (!json_is_array(nums))
        return px_err_set(err, PX_EINVAL, "no numbers recorded");
    json_int_t sum = bias;
    size_t i;
    json_t *v;
    json_array_foreach(nums, i, v) sum += json_integer_value(v);
    json_t *off = json_object_get(history, "offset");
    sum += json_integer_value(json_object_get(off, "value"));
    *out = json_pack("{s:I}", "sum", sum);
    return PX_OK;
}

static char *write_sample(void)
{
    char *path = px_asprintf("%s/sample-%d.trace", px_test_tmpdir(), rand());
    px_trace_writer *w;
    px_err err;
    px_assert_ok(px_trace_writer_open(path, "test", &w, &err), &err);
    json_t *nums = json_pack("[i,i,i]", 1, 2, 3);
    char id[PX_TRACE_ID_LEN];
    px_assert_ok(px_trace_input(w, "numbers", nums, id, &err), &err);
    json_t *off = json_pack("{s:i, s:f}", "value", 10, "ns", 1234.5);
    px_assert_ok(px_trace_observation(w, "offset", off, &err), &err);
    json_t *inputs = json_pack("{s:s}", "numbers", id);
    json_t *out = json_pack("{s:I}", "sum", (json_int_t)16);
    char did[PX_TRACE_ID_LEN];
    px_assert_ok(px_trace_decision(w, "sum", inputs, out, did, &err), &err);
    /* Same inputs, same id, on every machine. */
    char did2[PX_TRACE_ID_LEN];
    px_assert_ok(px__trace_decision_id("sum", inputs, did2), &err);
    assert_string_equal(did, did2);
    json_t *oc = json_pack("{s:b}", "ok", 1);
    px_assert_ok(px_trace_outcome(w, "done", oc, &err), &err);
    assert_int_equal(px_trace_writer_count(w), 4);
    px_assert_ok(px_trace_writer_close(w, &err), &err);
    json_decref(nums);
    json_decref(off);
    json_decref(inputs);
    json_decref(out);
    json_decref(oc);
    return path;
}

static const px_trace_deriver derivers[] = {{"sum", derive_sum}};

static void test_trace_replay_is_identical(void **state)
{
    (void)state;
    char *path = write_sample();
    px_trace_replay_report rep;
    px_err err;
    px_assert_ok(px_trace_replay(path, derivers, 1, NULL, &rep, &err), &err);
    assert_int_equal(rep.n_events, 4);
    assert_int_equal(rep.n_decisions, 1);
    assert_int_equal(rep.n_identical, 1);
    assert_false(rep.diverged);
    free(path);
}

static void test_trace_replay_reports_first_divergence(void **state)
{
    (void)state;
    char *path = write_sample();
    px_trace_replay_report rep;
    px_err err;
    int bias = 1;
    assert_int_equal(px_trace_replay(path, derivers, 1, &bias, &rep, &err), PX_EDIVERGED);
    assert_true(rep.diverged);
    assert_int_equal(rep.divergence_seq, 3);
    px_assert_contains(rep.divergence, "\"sum\"");
    free(path);
}

static void expect_refused(const char *text, size_t len, const char *needle)
{
    px_trace_reader *r;
    px_err err;
    px_err_clear(&err);
    px_status st = px_trace_reader_open_memory(text, len, "t.trace", NULL, &r, &err);
    if (st == PX_OK) {
        px_trace_event ev;
        bool done = false;
        while (st == PX_OK && !done)
            st = px_trace_next(r, &ev, &done, &err);
        px_trace_reader_free(r);
    }
    if (st == PX_OK)
        fail_msg("tampered trace accepted; expected \"%s\"", needle);
    px_assert_contains(err.msg, needle);
}

static void test_trace_tampering_is_refused(void **state)
{
    (void)state;
    char *path = write_sample();
    size_t len;
    char *text = NULL;
    px_err rerr;
    px_assert_ok(px_read_file(path, 1 << 20, &text, &len, &rerr), &rerr);

    /* An edited number in the observation. */
    char *edited = px_strdup(text);
    char *p = strstr(edited, "\"value\":10");
    assert_non_null(p);
    p[9] = '9';
    expect_refused(edited, len, "hash chain broken");

    /* A dropped line. */
    char *second = strchr(text, '\n') + 1;
    char *third = strchr(second, '\n') + 1;
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_add(&sb, text, (size_t)(second - text));
    px_strbuf_adds(&sb, third);
    expect_refused(sb.buf, sb.len, "hash chain broken");
    px_strbuf_release(&sb);

    /* Garbage, a wrong schema, an empty file, an over-long line. */
    expect_refused("not json\n", 9, "t.trace:1");
    expect_refused("", 0, "empty file");
    const char *wrong = "{\"schema\":\"other/1\",\"chain\":\"00\"}\n";
    expect_refused(wrong, strlen(wrong), "chain");
    px_trace_limits lim = {.max_line = 64};
    px_trace_reader *r;
    px_err err;
    assert_int_equal(px_trace_reader_open_memory(text, len, "t.trace", &lim, &r, &err), PX_ELIMIT);
    free(edited);
    free(text);
    free(path);
}

static void test_trace_forged_ids_are_refused(void **state)
{
    (void)state;
    /* A consistent chain over a decision whose id does not match its
     * inputs: ids are recomputed, not trusted. */
    char chain[PX_TRACE_ID_LEN] = "";
    px_strbuf sb = PX_STRBUF_INIT;
    const char *lines[] = {
        "{\"command\":\"x\",\"schema\":\"plexus.trace/1\",\"seq\":0,\"tool\":\"plexus\"}",
        "{\"data\":{},\"id\":\"000000000000000000000000000000000000000000000000000000000000"
        "0000\",\"inputs\":{},\"kind\":\"decision\",\"name\":\"plan\",\"seq\":1}",
    };
    for (size_t i = 0; i < 2; i++) {
        char next[PX_TRACE_ID_LEN];
        px__trace_chain(chain, lines[i], strlen(lines[i]), next);
        memcpy(chain, next, sizeof next);
        px_strbuf_add(&sb, lines[i], strlen(lines[i]) - 1);
        px_strbuf_addf(&sb, ",\"chain\":\"%s\"}\n", chain);
    }
    expect_refused(sb.buf, sb.len, "does not match its content");
    px_strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_replay_is_identical),
        cmocka_unit_test(test_trace_replay_reports_first_divergence),
        cmocka_unit_test(test_trace_tampering_is_refused),
        cmocka_unit_test(test_trace_forged_ids_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
