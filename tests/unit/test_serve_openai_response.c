/* OpenAI responses built from token events: the exact JSON of
 * non-streaming completions and chat completions (with logprobs in each
 * API's layout), the exact server-sent event chunks of streams (role first,
 * finish reason last, the usage chunk, [DONE]), UTF-8 held back at token
 * boundaries, stop strings cut out even across tokens, the model list and
 * response ids. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/serve.h"

#define CREATED 1700000000

static px_serve_response *make(px_serve_api api, bool stream, bool usage, bool logprobs,
                               uint32_t top, const char *const *stop, size_t n_stop)
{
    px_serve_response_opts o = {.api = api,
                                .id = api == PX_SERVE_API_CHAT ? "chatcmpl-1" : "cmpl-1",
                                .model = "tiny",
                                .created = CREATED,
                                .stream = stream,
                                .include_usage = usage,
                                .logprobs = logprobs,
                                .top_logprobs = top,
                                .stop = stop,
                                .n_stop = n_stop};
    px_serve_response *r;
    px_err err;
    px_assert_ok(px_serve_response_new(&o, &r, &err), &err);
    return r;
}

/* Feeds a token; returns whether a stop string completed. */
static bool feed_alts(px_serve_response *r, const char *text, float lp,
                      const px_serve_token_alt *top, size_t n_top, px_strbuf *out)
{
    px_serve_token_event ev = {7, text, strlen(text), lp, top, n_top};
    bool stopped = false;
    px_err err;
    px_assert_ok(px_serve_response_token(r, &ev, out, &stopped, &err), &err);
    return stopped;
}

static bool feed(px_serve_response *r, const char *text, px_strbuf *out)
{
    return feed_alts(r, text, -0.5f, NULL, 0, out);
}

static void finish(px_serve_response *r, px_serve_finish why, uint64_t prompt, uint64_t completion,
                   px_strbuf *out)
{
    px_serve_usage u = {prompt, completion};
    px_err err;
    px_assert_ok(px_serve_response_finish(r, why, &u, out, &err), &err);
}

/* Every "data: " event of a stream is valid JSON (or [DONE]); returns the
 * chat deltas' or completions' texts joined, and the number of events. */
static char *stream_text(const char *sse, size_t *n_events)
{
    px_strbuf text = PX_STRBUF_INIT;
    *n_events = 0;
    for (const char *p = sse; *p;) {
        assert_true(!strncmp(p, "data: ", 6));
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        (*n_events)++;
        if (strncmp(p + 6, "[DONE]", 6)) {
            json_error_t jerr;
            json_t *v = json_loadb(p + 6, (size_t)(end - p - 6), 0, &jerr);
            if (!v)
                fail_msg("event is not JSON (%s): %.*s", jerr.text, (int)(end - p), p);
            json_t *c = json_array_get(json_object_get(v, "choices"), 0);
            json_t *t = json_object_get(c, "text");
            if (!t)
                t = json_object_get(json_object_get(c, "delta"), "content");
            if (t)
                px_strbuf_add(&text, json_string_value(t), json_string_length(t));
            json_decref(v);
        }
        p = end + 2;
    }
    return px_strbuf_detach(&text, NULL);
}

/* ------------------------------------------------------------------ */
/* Whole bodies                                                        */
/* ------------------------------------------------------------------ */

static void test_chat_completion_body(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_CHAT, false, false, false, 0, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    assert_false(feed(r, "Hel", &out));
    feed(r, "lo", &out);
    feed(r, " world", &out);
    assert_int_equal(out.len, 0); /* nothing before the end */
    finish(r, PX_SERVE_FINISH_STOP, 5, 3, &out);
    assert_string_equal(
        out.buf, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
                 "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                 "\"assistant\",\"content\":\"Hello world\"},\"logprobs\":null,"
                 "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"
                 "\"completion_tokens\":3,\"total_tokens\":8}}");
    size_t len;
    assert_string_equal(px_serve_response_text(r, &len), "Hello world");
    assert_int_equal(len, 11);
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

static void test_chat_logprobs_layout(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_CHAT, false, false, true, 2, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    px_serve_token_alt alts[] = {{1, "Hi", 2, -0.5f}, {2, "Hey", 3, -1.25f}, {3, "Yo", 2, -3}};
    feed_alts(r, "Hi", -0.5f, alts, 3, &out);
    feed_alts(r, "!", -INFINITY, NULL, 0, &out);
    finish(r, PX_SERVE_FINISH_LENGTH, 1, 2, &out);
    assert_string_equal(
        out.buf,
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":"
        "\"tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
        "\"Hi!\"},\"logprobs\":{\"content\":[{\"token\":\"Hi\",\"logprob\":-0.5,\"bytes\":[72,"
        "105],\"top_logprobs\":[{\"token\":\"Hi\",\"logprob\":-0.5,\"bytes\":[72,105]},"
        "{\"token\":\"Hey\",\"logprob\":-1.25,\"bytes\":[72,101,121]}]},{\"token\":\"!\","
        "\"logprob\":-9999.0,\"bytes\":[33],\"top_logprobs\":[]}]},\"finish_reason\":\"length\"}],"
        "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}");
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

static void test_completion_logprobs_layout(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_COMPLETIONS, false, false, true, 2, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    /* Equal texts among the alternatives keep the first (a dict). */
    px_serve_token_alt alts[] = {
        {1, " Once", 5, -0.125f}, {2, " Once", 5, -2.5f}, {3, " once", 5, -3}};
    feed_alts(r, " Once", -0.125f, alts, 3, &out);
    /* "€" in two tokens: each token shows as U+FFFD, the text whole. */
    feed_alts(r, "\xe2\x82", -0.5f, NULL, 0, &out);
    feed_alts(r, "\xac", -2.5f, NULL, 0, &out);
    finish(r, PX_SERVE_FINISH_LENGTH, 2, 3, &out);
    assert_string_equal(
        out.buf,
        "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":"
        "\"tiny\",\"choices\":[{\"text\":\" Once\xe2\x82\xac\",\"index\":0,\"logprobs\":"
        "{\"tokens\":[\" Once\",\"\xef\xbf\xbd\",\"\xef\xbf\xbd\"],\"token_logprobs\":[-0.125,"
        "-0.5,-2.5],\"top_logprobs\":[{\" Once\":-0.125},{},{}],\"text_offset\":[0,5,6]},"
        "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,"
        "\"total_tokens\":5}}");
    px_strbuf_release(&out);
    px_serve_response_free(r);
    /* logprobs 0: the chosen tokens only, top_logprobs entries null. */
    r = make(PX_SERVE_API_COMPLETIONS, false, false, true, 0, NULL, 0);
    feed_alts(r, "x", -0.25f, alts, 3, &out);
    finish(r, PX_SERVE_FINISH_STOP, 1, 1, &out);
    px_assert_contains(out.buf, "\"logprobs\":{\"tokens\":[\"x\"],\"token_logprobs\":[-0.25],"
                                "\"top_logprobs\":[null],\"text_offset\":[0]}");
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

#define CHUNK                                                                                   \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000," \
    "\"model\":\"tiny\",\"choices\":["

static void test_chat_stream_events(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_CHAT, true, true, false, 0, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    px_err err;
    px_assert_ok(px_serve_response_begin(r, &out, &err), &err);
    px_assert_ok(px_serve_response_begin(r, &out, &err), &err); /* once */
    feed(r, "Hel", &out);
    feed(r, "lo", &out);
    finish(r, PX_SERVE_FINISH_STOP, 4, 2, &out);
    assert_string_equal(
        out.buf,
        CHUNK "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
              "\"finish_reason\":null}],\"usage\":null}\n\n" CHUNK
              "{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,\"finish_reason\":"
              "null}],\"usage\":null}\n\n" CHUNK
              "{\"index\":0,\"delta\":{\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":"
              "null}],\"usage\":null}\n\n" CHUNK
              "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":"
              "null}\n\n" CHUNK "],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,"
              "\"total_tokens\":6}}\n\n"
              "data: [DONE]\n\n");
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

static void test_chat_stream_with_logprobs_and_no_usage(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_CHAT, true, false, true, 1, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    px_serve_token_alt alt = {1, "a", 1, -0.5f};
    feed_alts(r, "a", -0.5f, &alt, 1, &out); /* the role chunk comes first by itself */
    finish(r, PX_SERVE_FINISH_LENGTH, 1, 1, &out);
    const char *want =
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
        "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"logprobs\":"
        "{\"content\":[{\"token\":\"a\",\"logprob\":-0.5,\"bytes\":[97],\"top_logprobs\":"
        "[{\"token\":\"a\",\"logprob\":-0.5,\"bytes\":[97]}]}]},\"finish_reason\":null}]}\n\n"
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,"
        "\"finish_reason\":\"length\"}]}\n\n"
        "data: [DONE]\n\n";
    assert_string_equal(out.buf, want);
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

static void test_completion_stream_events(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_COMPLETIONS, true, true, true, 1, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    px_serve_token_alt alt = {1, "c", 1, -0.125f};
    feed_alts(r, "ab", -0.5f, &alt, 1, &out);
    feed_alts(r, "c", -0.125f, &alt, 1, &out);
    finish(r, PX_SERVE_FINISH_LENGTH, 3, 2, &out);
#define COMP                                                                          \
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000," \
    "\"model\":\"tiny\",\"choices\":["
    assert_string_equal(
        out.buf, COMP
        "{\"text\":\"ab\",\"index\":0,\"logprobs\":{\"tokens\":[\"ab\"],\"token_logprobs\":"
        "[-0.5],\"top_logprobs\":[{\"c\":-0.125}],\"text_offset\":[0]},\"finish_reason\":"
        "null}],\"usage\":null}\n\n" COMP
        "{\"text\":\"c\",\"index\":0,\"logprobs\":{\"tokens\":[\"c\"],\"token_logprobs\":"
        "[-0.125],\"top_logprobs\":[{\"c\":-0.125}],\"text_offset\":[2]},\"finish_reason\":"
        "null}],\"usage\":null}\n\n" COMP
        "{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":"
        "null}\n\n" COMP "],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
        "\"total_tokens\":5}}\n\n"
        "data: [DONE]\n\n");
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

/* ------------------------------------------------------------------ */
/* UTF-8 and stop strings                                              */
/* ------------------------------------------------------------------ */

static void test_split_characters_are_held_until_complete(void **state)
{
    (void)state;
    px_serve_response *r = make(PX_SERVE_API_CHAT, true, false, true, 0, NULL, 0);
    px_strbuf out = PX_STRBUF_INIT;
    px_err err;
    px_assert_ok(px_serve_response_begin(r, &out, &err), &err);
    size_t mark = out.len;
    feed(r, "a\xe2", &out);
    feed(r, "\x82", &out);
    assert_int_equal(out.len, mark); /* "a" could go, but not without its token */
    feed(r,
         "\xac"
         "b",
         &out);
    assert_true(out.len > mark);
    mark = out.len;
    feed(r, "\xf0\x9f", &out);
    assert_int_equal(out.len, mark);
    feed(r, "\x98\x80", &out);
    finish(r, PX_SERVE_FINISH_STOP, 1, 5, &out);
    size_t n;
    char *text = stream_text(out.buf, &n);
    assert_string_equal(text, "a\xe2\x82\xac"
                              "b\xf0\x9f\x98\x80");
    assert_int_equal(n, 5); /* role, "a€b", "😀", finish, [DONE] */
    /* The three tokens of "a€b" go out with their own logprobs. */
    px_assert_contains(out.buf, "\"bytes\":[97,226],\"top_logprobs\":[]},{\"token\":\"\xef\xbf"
                                "\xbd\",\"logprob\":-0.5,\"bytes\":[130],\"top_logprobs\":[]},"
                                "{\"token\":\"\xef\xbf\xbd"
                                "b\"");
    free(text);
    px_strbuf_release(&out);
    px_serve_response_free(r);

    /* A character never completed is U+FFFD at the end. */
    r = make(PX_SERVE_API_CHAT, false, false, false, 0, NULL, 0);
    feed(r, "ok\xe2\x82", &out);
    finish(r, PX_SERVE_FINISH_LENGTH, 1, 1, &out);
    px_assert_contains(out.buf, "\"content\":\"ok\xef\xbf\xbd\"");
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

static void test_stop_strings_are_cut_across_tokens(void **state)
{
    (void)state;
    const char *stops[] = {"END", "\n\n"};
    px_serve_response *r = make(PX_SERVE_API_CHAT, true, false, false, 0, stops, 2);
    px_strbuf out = PX_STRBUF_INIT;
    assert_false(feed(r, "ab", &out));
    size_t mark = out.len;
    assert_false(feed(r, "E", &out)); /* may start "END": held */
    assert_false(feed(r, "N", &out));
    assert_int_equal(out.len, mark);
    assert_true(feed(r, "Dxyz", &out));
    assert_int_equal(out.len, mark); /* nothing of "END" or after it */
    px_err err;
    px_serve_token_event ev = {1, "more", 4, 0, NULL, 0};
    bool stopped = false;
    assert_int_equal(px_serve_response_token(r, &ev, &out, &stopped, &err), PX_ESTATE);
    assert_true(stopped);
    /* A stop string forces "stop", whatever the caller says. */
    finish(r, PX_SERVE_FINISH_LENGTH, 1, 4, &out);
    px_assert_contains(out.buf, "\"finish_reason\":\"stop\"");
    size_t n;
    char *text = stream_text(out.buf, &n);
    assert_string_equal(text, "ab");
    free(text);
    px_strbuf_release(&out);
    px_serve_response_free(r);

    static const struct {
        const char *stops[2];
        const char *tokens[4];
        const char *text;
        bool stopped;
    } cases[] = {
        /* A held prefix that goes on otherwise is released. */
        {{"END", NULL}, {"E", "x", NULL}, "Ex", false},
        /* Inside one token. */
        {{"STOP", NULL}, {"fooSTOPbar", NULL}, "foo", true},
        /* The earliest of two. */
        {{"cd", "b"}, {"abcd", NULL}, "a", true},
        /* Over three tokens, text before it kept. */
        {{"STOP", NULL}, {"xS", "TO", "Py", NULL}, "x", true},
        /* A prefix still held at the end is text. */
        {{"STOP", NULL}, {"go", "ST", NULL}, "goST", false},
        /* Multi-byte stop strings. */
        {{"\xe2\x82\xac", NULL}, {"5\xe2", "\x82\xac", NULL}, "5", true},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        size_t n_stop = cases[i].stops[1] ? 2 : 1;
        r = make(PX_SERVE_API_COMPLETIONS, false, false, false, 0, cases[i].stops, n_stop);
        bool cut = false;
        for (size_t k = 0; cases[i].tokens[k]; k++)
            cut = feed(r, cases[i].tokens[k], &out);
        finish(r, PX_SERVE_FINISH_LENGTH, 1, 1, &out);
        assert_int_equal(cut, cases[i].stopped);
        assert_string_equal(px_serve_response_text(r, NULL), cases[i].text);
        px_assert_contains(out.buf, cases[i].stopped ? "\"finish_reason\":\"stop\""
                                                     : "\"finish_reason\":\"length\"");
        px_strbuf_reset(&out);
        px_serve_response_free(r);
    }
    px_strbuf_release(&out);
}

/* ------------------------------------------------------------------ */
/* Misuse, ids, models                                                 */
/* ------------------------------------------------------------------ */

static void test_misuse_is_refused(void **state)
{
    (void)state;
    px_serve_response *r;
    px_err err;
    px_serve_response_opts o = {.api = PX_SERVE_API_CHAT, .id = "x", .model = NULL};
    assert_int_equal(px_serve_response_new(&o, &r, &err), PX_EINVAL);
    assert_null(r);
    o.model = "m";
    const char *five[] = {"a", "b", "c", "d", "e"};
    o.stop = five;
    o.n_stop = 5;
    assert_int_equal(px_serve_response_new(&o, &r, &err), PX_EINVAL);
    const char *empty[] = {""};
    o.stop = empty;
    o.n_stop = 1;
    assert_int_equal(px_serve_response_new(&o, &r, &err), PX_EINVAL);
    px_assert_contains(err.msg, "empty");
    o.n_stop = 0;
    px_assert_ok(px_serve_response_new(&o, &r, &err), &err);
    px_strbuf out = PX_STRBUF_INIT;
    px_serve_token_event bad = {1, NULL, 3, 0, NULL, 0};
    assert_int_equal(px_serve_response_token(r, &bad, &out, NULL, &err), PX_EINVAL);
    assert_int_equal(px_serve_response_token(r, NULL, &out, NULL, &err), PX_EINVAL);
    finish(r, PX_SERVE_FINISH_STOP, 0, 0, &out);
    /* An empty answer is a valid body. */
    px_assert_contains(out.buf, "\"content\":\"\"");
    assert_int_equal(px_serve_response_finish(r, PX_SERVE_FINISH_STOP, NULL, &out, &err),
                     PX_ESTATE);
    px_serve_token_event ev = {1, "a", 1, 0, NULL, 0};
    assert_int_equal(px_serve_response_token(r, &ev, &out, NULL, &err), PX_ESTATE);
    px_strbuf_release(&out);
    px_serve_response_free(r);
    px_serve_response_free(NULL);
}

/* Quantiles of a histogram's counts, as a front end's reporter takes them
 * over a window: interpolated within the bucket, NAN when empty. */
static void test_figures_quantiles(void **state)
{
    (void)state;
    double b[PX_SERVE_BUCKETS];
    for (size_t i = 0; i < PX_SERVE_BUCKETS; i++)
        b[i] = 0.01 * (double)(i + 1); /* 10 ms, 20 ms, ... */
    uint64_t c[PX_SERVE_BUCKETS + 1] = {0};
    assert_true(isnan(px_serve_figures_quantile(b, c, 0.5)));
    c[1] = 4; /* four values in (10 ms, 20 ms] */
    assert_float_equal(px_serve_figures_quantile(b, c, 0.5), 0.015, 1e-12);
    assert_float_equal(px_serve_figures_quantile(b, c, 0.99), 0.0199, 1e-12);
    c[3] = 4; /* and four in (30 ms, 40 ms] */
    assert_float_equal(px_serve_figures_quantile(b, c, 0.5), 0.020, 1e-12);
    assert_float_equal(px_serve_figures_quantile(b, c, 0.75), 0.035, 1e-12);
    c[PX_SERVE_BUCKETS] = 100; /* most above the last bound */
    assert_float_equal(px_serve_figures_quantile(b, c, 0.99), b[PX_SERVE_BUCKETS - 1], 1e-12);
}

static void test_ids_and_model_list(void **state)
{
    (void)state;
    char a[40], b[40], c[40];
    px_serve_response_id(PX_SERVE_API_CHAT, 1, 42, a);
    px_serve_response_id(PX_SERVE_API_CHAT, 2, 42, b);
    px_serve_response_id(PX_SERVE_API_COMPLETIONS, 1, 42, c);
    assert_int_equal(strlen(a), 9 + 24);
    assert_true(px_str_starts_with(a, "chatcmpl-"));
    assert_true(px_str_starts_with(c, "cmpl-"));
    assert_string_not_equal(a, b);
    assert_string_equal(a + 9, c + 5); /* same seq and salt, same digits */
    px_serve_response_id(PX_SERVE_API_CHAT, 1, 43, b);
    assert_string_not_equal(a, b);
    const char *ids[] = {"tiny", "caf\xc3\xa9"};
    char *s = px_serve_models_json(ids, 2, CREATED, NULL);
    assert_string_equal(s, "{\"object\":\"list\",\"data\":[{\"id\":\"tiny\",\"object\":\"model\","
                           "\"created\":1700000000,\"owned_by\":\"plexus\"},{\"id\":"
                           "\"caf\xc3\xa9\",\"object\":\"model\",\"created\":1700000000,"
                           "\"owned_by\":\"plexus\"}]}");
    free(s);
    s = px_serve_models_json(NULL, 0, CREATED, "me");
    assert_string_equal(s, "{\"object\":\"list\",\"data\":[]}");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_completion_body),
        cmocka_unit_test(test_figures_quantiles),
        cmocka_unit_test(test_chat_logprobs_layout),
        cmocka_unit_test(test_completion_logprobs_layout),
        cmocka_unit_test(test_chat_stream_events),
        cmocka_unit_test(test_chat_stream_with_logprobs_and_no_usage),
        cmocka_unit_test(test_completion_stream_events),
        cmocka_unit_test(test_split_characters_are_held_until_complete),
        cmocka_unit_test(test_stop_strings_are_cut_across_tokens),
        cmocka_unit_test(test_misuse_is_refused),
        cmocka_unit_test(test_ids_and_model_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
