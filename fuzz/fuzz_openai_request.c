/* Fuzz target: OpenAI request bodies and the responses built from them.
 * Any bytes as a /v1/completions or /v1/chat/completions body are parsed
 * into a request within its bounds, or refused with a 400, 413 or 500 and
 * an error body that is JSON.  The stop strings parsed, and the input cut
 * into tokens, then build a streamed and a whole response: every event
 * must be valid JSON (held-back UTF-8, stop strings cut across tokens). */
#include "base/common.h"

#include "plexus/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_json(const char *s, size_t n)
{
    json_error_t jerr;
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL, &jerr); /* a generated NUL is \u0000 */
    if (!v)
        __builtin_trap();
    json_decref(v);
}

static void check_request(const px_serve_request *r)
{
    if (r->n_stop > PX_SERVE_MAX_STOP || !(r->temperature >= 0 && r->temperature <= 2) ||
        !(r->top_p > 0 && r->top_p <= 1) || !(r->min_p >= 0 && r->min_p <= 1) || r->top_k < 0 ||
        r->top_logprobs > PX_SERVE_MAX_TOP_LOGPROBS)
        __builtin_trap();
    for (size_t i = 0; i < r->n_stop; i++)
        if (r->stop_len[i] == 0 || r->stop_len[i] > 256)
            __builtin_trap();
    if (r->api == PX_SERVE_API_CHAT) {
        if (r->n_messages == 0 || r->n_messages > PX_SERVE_CHAT_MAX_MESSAGES)
            __builtin_trap();
        for (size_t i = 0; i < r->n_messages; i++)
            if ((unsigned)r->messages[i].role >= PX_SERVE_ROLE_COUNT_ || !r->messages[i].content)
                __builtin_trap();
    } else if ((r->prompt != NULL) == (r->prompt_tokens != NULL) ||
               (r->prompt_tokens && (r->n_prompt_tokens == 0 || r->n_prompt_tokens > 131072))) {
        __builtin_trap();
    }
}

/* Streams the input, cut into tokens of 1 to 4 bytes, through a response
 * with the request's stop strings. */
static void respond(const px_serve_request *req, const uint8_t *data, size_t size, bool stream)
{
    px_serve_response_opts o = {.api = req->api,
                                .id = "x",
                                .model = "m",
                                .created = 1,
                                .stream = stream,
                                .include_usage = stream,
                                .logprobs = true,
                                .top_logprobs = 1,
                                .stop = req->stop,
                                .stop_len = req->stop_len,
                                .n_stop = req->n_stop};
    px_serve_response *r;
    if (px_serve_response_new(&o, &r, NULL) != PX_OK)
        __builtin_trap();
    px_strbuf out = PX_STRBUF_INIT;
    bool stopped = false;
    for (size_t i = 0; i < size && !stopped;) {
        size_t n = PX_MIN(size - i, (size_t)1 + data[i] % 4);
        px_serve_token_alt alt = {1, (const char *)data + i, n, -1.0f};
        px_serve_token_event ev = {(int32_t)i, (const char *)data + i, n, -0.5f, &alt, 1};
        if (px_serve_response_token(r, &ev, &out, &stopped, NULL) != PX_OK)
            __builtin_trap();
        i += n;
    }
    px_serve_usage u = {1, 2};
    if (px_serve_response_finish(r, PX_SERVE_FINISH_LENGTH, &u, &out, NULL) != PX_OK)
        __builtin_trap();
    if (!stream) {
        check_json(out.buf, out.len);
    } else {
        for (const char *p = out.buf; *p;) {
            const char *end = strstr(p, "\n\n");
            if (strncmp(p, "data: ", 6) || !end)
                __builtin_trap();
            if (strncmp(p + 6, "[DONE]", 6))
                check_json(p + 6, (size_t)(end - p - 6));
            p = end + 2;
        }
    }
    px_strbuf_release(&out);
    px_serve_response_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int api = PX_SERVE_API_COMPLETIONS; api <= PX_SERVE_API_CHAT; api++) {
        px_serve_request req;
        px_serve_error e;
        px_serve_limits lim = {.n_vocab = 1000};
        px_status st =
            px_serve_request_parse((px_serve_api)api, (const char *)data, size, &lim, &req, &e);
        if (st == PX_OK) {
            check_request(&req);
            respond(&req, data, size, api == PX_SERVE_API_CHAT);
        } else {
            if (e.http_status != 400 && e.http_status != 413 && e.http_status != 500)
                __builtin_trap();
            char *s = px_serve_error_json(&e);
            if (!s)
                __builtin_trap();
            check_json(s, strlen(s));
            free(s);
        }
        px_serve_request_release(&req);
    }
    return 0;
}
