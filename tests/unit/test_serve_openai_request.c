/* OpenAI request bodies: every member read into px_serve_request, nulls
 * and unknown members as OpenAI treats them, and every refusal with its
 * HTTP status, the member it names (param) and a message saying why; the
 * error JSON in OpenAI's shape for every kind. */
#include "px_test.h"

#include <string.h>

#include "plexus/serve.h"

static px_serve_request parse_ok(px_serve_api api, const char *body, const px_serve_limits *lim)
{
    px_serve_request r;
    px_serve_error e;
    px_status st = px_serve_request_parse(api, body, strlen(body), lim, &r, &e);
    if (st != PX_OK)
        fail_msg("%s\nrefused (%d, param \"%s\"): %s", body, e.http_status, e.param, e.message);
    return r;
}

static void assert_msg(const px_serve_chat_msg *m, px_serve_role role, const char *text)
{
    assert_int_equal(m->role, role);
    assert_int_equal(m->len, strlen(text));
    assert_memory_equal(m->content, text, m->len);
}

static void test_chat_request_reads_every_member(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"tiny\", \"messages\": ["
        "{\"role\": \"system\", \"content\": \"S\"},"
        "{\"role\": \"developer\", \"content\": \"D\", \"name\": \"ignored\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        " {\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": \"c\\u00e9\", \"tool_calls\": []}],"
        "\"max_completion_tokens\": 7, \"max_tokens\": 99, \"temperature\": 0.5,"
        "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"seed\": -3,"
        "\"stop\": [\"x\", \"yy\"], \"stream\": true,"
        "\"stream_options\": {\"include_usage\": true}, \"logprobs\": true,"
        "\"top_logprobs\": 3, \"n\": 1, \"presence_penalty\": 0, \"frequency_penalty\": 0.0,"
        "\"user\": \"u-1\", \"logit_bias\": {}, \"tools\": [], \"tool_choice\": \"none\","
        "\"response_format\": {\"type\": \"text\"}, \"parallel_tool_calls\": false,"
        "\"some_future_member\": {\"x\": [1, 2]}}";
    px_serve_request r = parse_ok(PX_SERVE_API_CHAT, body, NULL);
    assert_int_equal(r.api, PX_SERVE_API_CHAT);
    assert_string_equal(r.model, "tiny");
    assert_int_equal(r.n_messages, 4);
    assert_msg(&r.messages[0], PX_SERVE_ROLE_SYSTEM, "S");
    assert_msg(&r.messages[1], PX_SERVE_ROLE_SYSTEM, "D");
    assert_msg(&r.messages[2], PX_SERVE_ROLE_USER, "a\nb");
    assert_msg(&r.messages[3], PX_SERVE_ROLE_ASSISTANT, "c\xc3\xa9");
    /* max_completion_tokens wins over the deprecated max_tokens. */
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.5);
    assert_true(r.top_p == 0.9);
    assert_int_equal(r.top_k, 40);
    assert_true(r.min_p == 0.05);
    assert_true(r.has_seed);
    assert_true(r.seed == (uint64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "x");
    assert_int_equal(r.stop_len[1], 2);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_null(r.prompt);
    assert_null(r.prompt_tokens);
    px_serve_request_release(&r);
    assert_null(r.arena);
    px_serve_request_release(&r); /* twice is safe */
}

static void test_defaults_and_nulls(void **state)
{
    (void)state;
    px_serve_request r = parse_ok(
        PX_SERVE_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", NULL);
    assert_null(r.model);
    assert_int_equal(r.max_tokens, 0);
    assert_true(r.temperature == 1 && r.top_p == 1 && r.min_p == 0);
    assert_int_equal(r.top_k, 0);
    assert_false(r.has_seed || r.stream || r.include_usage || r.logprobs);
    assert_int_equal(r.n_stop, 0);
    px_serve_request_release(&r);
    /* null is "not given" for every optional member. */
    r = parse_ok(PX_SERVE_API_CHAT,
                 "{\"model\": null, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
                 "\"temperature\": null, \"top_p\": null, \"max_tokens\": null, \"stop\": null,"
                 "\"stream\": null, \"stream_options\": null, \"logprobs\": null,"
                 "\"top_logprobs\": null, \"n\": null, \"seed\": null, \"tools\": null,"
                 "\"presence_penalty\": null, \"response_format\": null, \"top_k\": -1}",
                 NULL);
    assert_null(r.model);
    assert_true(r.temperature == 1);
    assert_false(r.has_seed);
    assert_int_equal(r.top_k, 0);
    px_serve_request_release(&r);
}

static void test_completion_prompts(void **state)
{
    (void)state;
    px_serve_request r =
        parse_ok(PX_SERVE_API_COMPLETIONS,
                 "{\"model\": \"m\", \"prompt\": \"Once upon\", \"max_tokens\": 16,"
                 " \"logprobs\": 2, \"echo\": false, \"best_of\": 1,"
                 " \"suffix\": null, \"stop\": \"\\n\"}",
                 NULL);
    assert_int_equal(r.api, PX_SERVE_API_COMPLETIONS);
    assert_int_equal(r.prompt_len, 9);
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.max_tokens, 16);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    assert_null(r.messages);
    px_serve_request_release(&r);
    /* logprobs 0: the chosen tokens' logprobs, no alternatives. */
    r = parse_ok(PX_SERVE_API_COMPLETIONS, "{\"prompt\": \"a\", \"logprobs\": 0}", NULL);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    px_serve_request_release(&r);
    /* Token ids, flat or as the one prompt of a list; a one-string list. */
    px_serve_limits lim = {.n_vocab = 100};
    r = parse_ok(PX_SERVE_API_COMPLETIONS, "{\"prompt\": [1, 99, 0]}", &lim);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_tokens, 3);
    assert_int_equal(r.prompt_tokens[1], 99);
    px_serve_request_release(&r);
    r = parse_ok(PX_SERVE_API_COMPLETIONS, "{\"prompt\": [[5, 6]]}", &lim);
    assert_int_equal(r.n_prompt_tokens, 2);
    assert_int_equal(r.prompt_tokens[0], 5);
    px_serve_request_release(&r);
    r = parse_ok(PX_SERVE_API_COMPLETIONS, "{\"prompt\": [\"only one\"]}", NULL);
    assert_string_equal(r.prompt, "only one");
    px_serve_request_release(&r);
    /* An empty prompt is a prompt (generation starts from BOS). */
    r = parse_ok(PX_SERVE_API_COMPLETIONS, "{\"prompt\": \"\"}", NULL);
    assert_non_null(r.prompt);
    assert_int_equal(r.prompt_len, 0);
    px_serve_request_release(&r);
}

/* ------------------------------------------------------------------ */
/* Refusals                                                            */
/* ------------------------------------------------------------------ */

typedef struct refusal {
    px_serve_api api;
    const char *body;
    int status;
    const char *param; /* "" for null */
    const char *says;
} refusal;

#define CHAT(extra) "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]" extra "}"
#define COMP(extra) "{\"prompt\": \"hi\"" extra "}"
#define C           PX_SERVE_API_CHAT
#define P           PX_SERVE_API_COMPLETIONS

static const refusal refusals[] = {
    /* The body. */
    {C, "{\"messages\": [", 400, "", "body:1:"},
    {C, "[1, 2]", 400, "", "expected a JSON object, got an array"},
    {C, "", 400, "", "body:"},
    {C, "{\"messages\": [], \"messages\": []}", 400, "", "duplicate"},
    {C, "{\"model\": 5}", 400, "model", "expected a string, got an integer"},
    /* Messages. */
    {C, "{}", 400, "messages", "missing"},
    {C, "{\"messages\": {}}", 400, "messages", "expected an array of messages"},
    {C, "{\"messages\": []}", 400, "messages", "empty"},
    {C, "{\"messages\": [\"hi\"]}", 400, "messages[0]", "expected an object"},
    {C, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role", "missing"},
    {C, "{\"messages\": [{\"role\": 7, \"content\": \"x\"}]}", 400, "messages[0].role",
     "expected a string"},
    {C, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, "messages[0].role",
     "no tool calling"},
    {C, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400, "messages[0].role",
     "unknown role \"robot\""},
    {C, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content", "missing"},
    {C, "{\"messages\": [{\"role\": \"assistant\", \"content\": null}]}", 400,
     "messages[0].content", "missing"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", 400, "messages[0].content",
     "expected a string or an array of text parts"},
    {C,
     "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
     "\"image_url\": {\"url\": \"x\"}}]}]}",
     400, "messages[0].content[0]", "\"image_url\" parts are not supported"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 400,
     "messages[0].content[0].text", "missing"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [7]}]}", 400, "messages[0].content[0]",
     "expected {\"type\": \"text\""},
    {C,
     "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": "
     "[{\"id\": \"1\"}]}]}",
     400, "messages[0].tool_calls", "no tool calling"},
    /* Sampling. */
    {C, CHAT(", \"max_tokens\": \"10\""), 400, "max_tokens", "expected an integer, got a string"},
    {C, CHAT(", \"max_tokens\": 0"), 400, "max_tokens", "out of range [1,"},
    {C, CHAT(", \"max_tokens\": 1.5"), 400, "max_tokens", "expected an integer, got a number"},
    {C, CHAT(", \"max_completion_tokens\": 99999999"), 400, "max_completion_tokens",
     "out of range"},
    {C, CHAT(", \"temperature\": 3"), 400, "temperature", "3 is out of range [0, 2]"},
    {C, CHAT(", \"temperature\": \"hot\""), 400, "temperature", "expected a number"},
    {C, CHAT(", \"top_p\": 0"), 400, "top_p", "temperature 0 for greedy"},
    {C, CHAT(", \"top_p\": 1.5"), 400, "top_p", "out of range"},
    {C, CHAT(", \"top_k\": -2"), 400, "top_k", "out of range"},
    {C, CHAT(", \"min_p\": 2"), 400, "min_p", "out of range"},
    {C, CHAT(", \"seed\": 1.5"), 400, "seed", "expected an integer"},
    /* Stop strings. */
    {C, CHAT(", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]"), 400, "stop",
     "5 strings, at most 4"},
    {C, CHAT(", \"stop\": \"\""), 400, "stop", "empty stop string"},
    {C, CHAT(", \"stop\": [\"a\", 1]"), 400, "stop[1]", "expected a string"},
    {C, CHAT(", \"stop\": 5"), 400, "stop", "a string or an array of strings"},
    /* Streaming. */
    {C, CHAT(", \"stream\": \"yes\""), 400, "stream", "expected true or false"},
    {C, CHAT(", \"stream_options\": {\"include_usage\": true}"), 400, "stream_options",
     "only allowed with stream: true"},
    {C, CHAT(", \"stream\": true, \"stream_options\": {\"include_usage\": 1}"), 400,
     "stream_options.include_usage", "true or false"},
    {C, CHAT(", \"stream\": true, \"stream_options\": []"), 400, "stream_options",
     "expected an object"},
    /* Logprobs. */
    {C, CHAT(", \"logprobs\": 3"), 400, "logprobs", "expected true or false"},
    {C, CHAT(", \"logprobs\": true, \"top_logprobs\": 21"), 400, "top_logprobs",
     "out of range [0, 20]"},
    {C, CHAT(", \"top_logprobs\": 2"), 400, "top_logprobs", "needs logprobs: true"},
    {P, COMP(", \"logprobs\": true"), 400, "logprobs", "integer 0..5"},
    {P, COMP(", \"logprobs\": 6"), 400, "logprobs", "out of range [0, 5]"},
    /* What plexus does not do. */
    {C, CHAT(", \"n\": 2"), 400, "n", "one choice per request"},
    {P, COMP(", \"best_of\": 3"), 400, "best_of", "one choice per request"},
    {P, COMP(", \"echo\": true"), 400, "echo", "not supported"},
    {P, COMP(", \"suffix\": \"end\""), 400, "suffix", "not supported"},
    {C, CHAT(", \"presence_penalty\": 0.5"), 400, "presence_penalty", "without penalties"},
    {C, CHAT(", \"frequency_penalty\": -1"), 400, "frequency_penalty", "without penalties"},
    {C, CHAT(", \"frequency_penalty\": 3"), 400, "frequency_penalty", "out of range"},
    {C, CHAT(", \"logit_bias\": {\"1\": 5}"), 400, "logit_bias", "not supported"},
    {C, CHAT(", \"tools\": [{\"type\": \"function\"}]"), 400, "tools", "no tool calling"},
    {C, CHAT(", \"tool_choice\": \"required\""), 400, "tool_choice", "there are no tools"},
    {C, CHAT(", \"response_format\": {\"type\": \"json_object\"}"), 400, "response_format.type",
     "\"json_object\" is not supported"},
    {C, CHAT(", \"response_format\": \"text\""), 400, "response_format", "expected"},
    {C, CHAT(", \"audio\": {\"voice\": \"x\"}"), 400, "audio", "text output only"},
    /* The prompt. */
    {P, "{}", 400, "prompt", "missing"},
    {P, "{\"prompt\": 5}", 400, "prompt", "a string or an array of token ids"},
    {P, "{\"prompt\": []}", 400, "prompt", "empty array"},
    {P, "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt", "2 prompts in one request"},
    {P, "{\"prompt\": [[1], [2]]}", 400, "prompt", "one prompt per request"},
    {P, "{\"prompt\": [1, \"a\"]}", 400, "prompt[1]", "a token id"},
    {P, "{\"prompt\": [[]]}", 400, "prompt[0]", "empty token array"},
    {P, "{\"prompt\": [{}]}", 400, "prompt[0]", "expected a string, a token id"},
    {P, "{\"prompt\": [1, -1]}", 400, "prompt[1]", "outside the vocabulary"},
    {P, "{\"prompt\": [100]}", 400, "prompt[0]", "outside the vocabulary [0, 99]"},
    {P, "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", 400, "prompt", "9 tokens, more than"},
    /* Bounds. */
    {C,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"0123456789012345678901234567890123\"}]}",
     400, "", "longer than the limit of 32"},
    {C,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
     "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}",
     400, "messages", "3 messages, more than the limit of 2"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": \"0123456789a\"}",
     400, "stop", "more than the limit of 10"},
    {C,
     "{\"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
     400, "", "nesting deeper"},
};

static void test_refusals_name_the_member_and_the_fix(void **state)
{
    (void)state;
    px_serve_limits lim = {.n_vocab = 100,
                           .max_prompt_tokens = 8,
                           .max_string_bytes = 32,
                           .max_messages = 2,
                           .max_stop_bytes = 10,
                           .max_new_tokens = 4096};
    for (size_t i = 0; i < PX_ARRAY_LEN(refusals); i++) {
        const refusal *f = &refusals[i];
        px_serve_request r;
        px_serve_error e;
        px_status st = px_serve_request_parse(f->api, f->body, strlen(f->body), &lim, &r, &e);
        if (st == PX_OK)
            fail_msg("accepted: %s", f->body);
        if (e.http_status != f->status || strcmp(e.param, f->param) || !strstr(e.message, f->says))
            fail_msg("%s\ngot %d, param \"%s\": %s\nwant %d, param \"%s\": ...%s...", f->body,
                     e.http_status, e.param, e.message, f->status, f->param, f->says);
        assert_int_equal(st, PX_EINVAL);
        assert_int_equal(e.kind, PX_SERVE_ERR_INVALID_REQUEST);
        assert_null(r.arena); /* nothing to release */
        px_serve_request_release(&r);
    }
}

static void test_body_over_the_limit_is_413(void **state)
{
    (void)state;
    px_serve_limits lim = {.max_body_bytes = 64};
    char body[200];
    snprintf(body, sizeof body, CHAT(", \"user\": \"%s\""),
             "a long user name that pushes the body past sixty-four bytes");
    px_serve_request r;
    px_serve_error e;
    assert_int_equal(px_serve_request_parse(C, body, strlen(body), &lim, &r, &e), PX_ELIMIT);
    assert_int_equal(e.http_status, 413);
    assert_int_equal(e.kind, PX_SERVE_ERR_TOO_LARGE);
    px_assert_contains(e.message, "more than the limit of 64");
    /* A NULL body is an empty one; e may be NULL. */
    assert_int_equal(px_serve_request_parse(C, NULL, 0, NULL, &r, NULL), PX_EINVAL);
}

/* ------------------------------------------------------------------ */
/* Error JSON                                                          */
/* ------------------------------------------------------------------ */

static void test_error_json_in_openai_shape(void **state)
{
    (void)state;
    static const struct {
        px_serve_error_kind kind;
        int status;
        const char *type, *code; /* code NULL: null */
    } kinds[] = {
        {PX_SERVE_ERR_INVALID_REQUEST, 400, "invalid_request_error", NULL},
        {PX_SERVE_ERR_CONTEXT_LENGTH, 400, "invalid_request_error", "context_length_exceeded"},
        {PX_SERVE_ERR_UNAUTHORIZED, 401, "invalid_request_error", "invalid_api_key"},
        {PX_SERVE_ERR_NOT_FOUND, 404, "invalid_request_error", "not_found"},
        {PX_SERVE_ERR_MODEL_NOT_FOUND, 404, "invalid_request_error", "model_not_found"},
        {PX_SERVE_ERR_METHOD, 405, "invalid_request_error", "method_not_allowed"},
        {PX_SERVE_ERR_TOO_LARGE, 413, "invalid_request_error", "request_too_large"},
        {PX_SERVE_ERR_RATE_LIMIT, 429, "requests", "rate_limit_exceeded"},
        {PX_SERVE_ERR_INTERNAL, 500, "server_error", NULL},
        {PX_SERVE_ERR_UNAVAILABLE, 503, "server_error", "service_unavailable"},
    };
    assert_int_equal(PX_ARRAY_LEN(kinds), PX_SERVE_ERR_KIND_COUNT_);
    for (size_t i = 0; i < PX_ARRAY_LEN(kinds); i++) {
        px_serve_error e;
        px_serve_error_set(&e, kinds[i].kind, i % 2 ? "messages[1].role" : NULL, "bad \"%s\"",
                           "thing");
        assert_int_equal(e.http_status, kinds[i].status);
        assert_int_equal(px_serve_error_status(kinds[i].kind), kinds[i].status);
        char *s = px_serve_error_json(&e);
        char want[512];
        char param[32], code[48];
        snprintf(param, sizeof param, i % 2 ? "\"messages[1].role\"" : "null");
        snprintf(code, sizeof code, kinds[i].code ? "\"%s\"" : "null",
                 kinds[i].code ? kinds[i].code : "");
        snprintf(want, sizeof want,
                 "{\"error\":{\"message\":\"bad \\\"thing\\\"\",\"type\":\"%s\",\"param\":%s,"
                 "\"code\":%s}}",
                 kinds[i].type, param, code);
        assert_string_equal(s, want);
        free(s);
    }
    /* The status returned matches the kind. */
    assert_int_equal(px_serve_error_set(NULL, PX_SERVE_ERR_RATE_LIMIT, NULL, "x"), PX_ELIMIT);
    assert_int_equal(px_serve_error_set(NULL, PX_SERVE_ERR_MODEL_NOT_FOUND, NULL, "x"),
                     PX_ENOTFOUND);
    /* A message cut inside a character stays valid UTF-8. */
    px_serve_error e;
    char long_text[600];
    memset(long_text, 'a', sizeof long_text);
    memcpy(long_text + 506, "\xe2\x82\xac\xe2\x82\xac", 6);
    long_text[512] = '\0';
    px_serve_error_set(&e, PX_SERVE_ERR_INTERNAL, NULL, "%s", long_text);
    char *s = px_serve_error_json(&e);
    px_assert_contains(s, "a\xe2\x82\xac\xef\xbf\xbd\",\"type\"");
    free(s);
    /* As a server-sent event. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_serve_error_set(&e, PX_SERVE_ERR_UNAVAILABLE, NULL, "stage 1 failed");
    px_assert_ok(px_serve_error_sse(&e, &sb), NULL);
    assert_string_equal(sb.buf, "data: {\"error\":{\"message\":\"stage 1 failed\",\"type\":"
                                "\"server_error\",\"param\":null,\"code\":\"service_"
                                "unavailable\"}}\n\n");
    px_strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_request_reads_every_member),
        cmocka_unit_test(test_defaults_and_nulls),
        cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_refusals_name_the_member_and_the_fix),
        cmocka_unit_test(test_body_over_the_limit_is_413),
        cmocka_unit_test(test_error_json_in_openai_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
