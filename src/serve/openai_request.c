/*
 * Request bodies of POST /v1/completions and /v1/chat/completions, parsed
 * into a px_serve_request.  A body is untrusted: its size, its strings, its
 * message and token counts are bounded, every member is type-checked and
 * range-checked, and every refusal names the member (OpenAI's "param").
 * Members plexus does not implement are refused when they ask for
 * something, accepted when they ask for the default (n: 1, echo: false,
 * penalties: 0); unknown members are ignored, as OpenAI does.
 */
#include "serve/serve_impl.h"

typedef struct parser {
    px_serve_api api;
    px_serve_limits lim;
    px_serve_request *out;
    px_serve_error *e;
    px_arena *arena;
} parser;

static px_serve_limits limits_or_default(const px_serve_limits *lim)
{
    px_serve_limits l = lim ? *lim : (px_serve_limits){0};
    if (!l.max_body_bytes)
        l.max_body_bytes = (size_t)8 << 20;
    if (!l.max_string_bytes)
        l.max_string_bytes = (size_t)4 << 20;
    if (!l.max_messages)
        l.max_messages = PX_SERVE_CHAT_MAX_MESSAGES;
    if (!l.max_prompt_tokens)
        l.max_prompt_tokens = 131072;
    if (!l.max_new_tokens)
        l.max_new_tokens = 1u << 20;
    if (!l.max_stop_bytes)
        l.max_stop_bytes = 256;
    return l;
}

/* A 400 naming param. */
static px_status bad(parser *p, const char *param, const char *fmt, ...) PX_PRINTF(3, 4);

static px_status bad(parser *p, const char *param, const char *fmt, ...)
{
    char msg[sizeof p->e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return px_serve_error_set(p->e, PX_SERVE_ERR_INVALID_REQUEST, param, "%s", msg);
}

static px_status oom(parser *p)
{
    px_serve_error_set(p->e, PX_SERVE_ERR_INTERNAL, NULL, "out of memory reading the request");
    return PX_ENOMEM;
}

static px_status wrong_type(parser *p, const char *param, const char *want, const json_t *v)
{
    return bad(p, param, "%s: expected %s, got %s", param, want, px_json_type_name(v));
}

/* The member, or NULL when it is absent or null (OpenAI treats null as
 * "not given"). */
static const json_t *member(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* ------------------------------------------------------------------ */
/* Scalars                                                             */
/* ------------------------------------------------------------------ */

static px_status get_bool(parser *p, const json_t *obj, const char *key, bool *out)
{
    const json_t *v = member(obj, key);
    if (!v)
        return PX_OK;
    if (!json_is_boolean(v))
        return wrong_type(p, key, "true or false", v);
    *out = json_is_true(v);
    return PX_OK;
}

/* A number in [lo, hi]; *given (may be NULL) says whether it was there. */
static px_status get_number(parser *p, const json_t *obj, const char *key, double lo, double hi,
                            double *out, bool *given)
{
    const json_t *v = member(obj, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return PX_OK;
    if (!json_is_number(v))
        return wrong_type(p, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return bad(p, key, "%s: %g is out of range [%g, %g]", key, x, lo, hi);
    *out = x;
    return PX_OK;
}

static px_status get_int(parser *p, const json_t *obj, const char *key, int64_t lo, int64_t hi,
                         int64_t *out, bool *given)
{
    const json_t *v = member(obj, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return PX_OK;
    if (!json_is_integer(v))
        return wrong_type(p, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(p, key,
                   "%s: %" JSON_INTEGER_FORMAT " is out of range [%" PRId64 ", %" PRId64 "]", key,
                   x, lo, hi);
    *out = x;
    return PX_OK;
}

/* A string copied into the arena (NUL-terminated; may hold NULs, which
 * JSON can carry as \u0000 only when jansson allows them). */
static px_status copy_string(parser *p, const json_t *v, const char *param, const char **out,
                             size_t *len)
{
    size_t n = json_string_length(v);
    if (n > p->lim.max_string_bytes)
        return bad(p, param, "%s: %zu bytes, more than the limit of %zu", param, n,
                   p->lim.max_string_bytes);
    char *s = px_arena_strndup(p->arena, json_string_value(v), n);
    if (!s)
        return oom(p);
    *out = s;
    if (len)
        *len = n;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Options that may only ask for the default                           */
/* ------------------------------------------------------------------ */

/* n, best_of: one choice per request. */
static px_status only_one(parser *p, const json_t *body, const char *key)
{
    int64_t n = 1;
    px_status st = get_int(p, body, key, INT64_MIN, INT64_MAX, &n, NULL);
    if (st != PX_OK)
        return st;
    if (n != 1)
        return bad(p, key,
                   "%s: %" PRId64 " choices asked for; plexus returns one choice per request "
                   "(send %s: 1, or several requests)",
                   key, n, key);
    return PX_OK;
}

static px_status zero_penalty(parser *p, const json_t *body, const char *key)
{
    double x = 0;
    px_status st = get_number(p, body, key, -2, 2, &x, NULL);
    if (st != PX_OK)
        return st;
    if (x != 0)
        return bad(p, key,
                   "%s: %g is not supported; plexus samples without penalties (send 0 or leave "
                   "it out)",
                   key, x);
    return PX_OK;
}

static px_status refuse_nonempty(parser *p, const json_t *body, const char *key, const char *why)
{
    const json_t *v = member(body, key);
    if (!v)
        return PX_OK;
    bool empty = (json_is_array(v) && json_array_size(v) == 0) ||
                 (json_is_object(v) && json_object_size(v) == 0) ||
                 (json_is_string(v) && json_string_length(v) == 0) || json_is_false(v);
    if (!empty)
        return bad(p, key, "%s: not supported (%s)", key, why);
    return PX_OK;
}

static px_status unsupported_options(parser *p, const json_t *body)
{
    px_status st;
    if ((st = only_one(p, body, "n")) || (st = zero_penalty(p, body, "presence_penalty")) ||
        (st = zero_penalty(p, body, "frequency_penalty")) ||
        (st = refuse_nonempty(p, body, "logit_bias", "no logit bias; leave it out")) ||
        (st = refuse_nonempty(p, body, "tools", "no tool calling; leave tools out")) ||
        (st = refuse_nonempty(p, body, "functions", "no function calling; leave it out")) ||
        (st = refuse_nonempty(p, body, "audio", "text output only")))
        return st;
    const json_t *v = member(body, "tool_choice");
    if (v && !(json_is_string(v) &&
               (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
        return bad(p, "tool_choice", "tool_choice: only \"none\" or \"auto\" (there are no tools)");
    v = member(body, "response_format");
    if (v) {
        const json_t *type = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(type))
            return bad(p, "response_format", "response_format: expected {\"type\": \"text\"}");
        if (strcmp(json_string_value(type), "text"))
            return bad(p, "response_format.type",
                       "response_format.type: \"%.40s\" is not supported (text only)",
                       json_string_value(type));
    }
    if (p->api == PX_SERVE_API_COMPLETIONS) {
        bool echo = false;
        if ((st = only_one(p, body, "best_of")) || (st = get_bool(p, body, "echo", &echo)))
            return st;
        if (echo)
            return bad(p, "echo", "echo: true is not supported (the prompt is not returned)");
        if ((st = refuse_nonempty(p, body, "suffix", "no insertion; leave it out")))
            return st;
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Sampling, stopping, streaming, logprobs                             */
/* ------------------------------------------------------------------ */

static px_status sampling(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    int64_t top_k = 0, seed = 0, max = 0;
    bool given;
    px_status st;
    if ((st = get_number(p, body, "temperature", 0, 2, &r->temperature, NULL)) ||
        (st = get_number(p, body, "top_p", 0, 1, &r->top_p, NULL)) ||
        (st = get_number(p, body, "min_p", 0, 1, &r->min_p, NULL)) ||
        (st = get_int(p, body, "top_k", -1, INT32_MAX, &top_k, NULL)))
        return st;
    if (r->top_p <= 0)
        return bad(p, "top_p",
                   "top_p: 0 keeps no token; give a value in (0, 1], or use "
                   "temperature 0 for greedy decoding");
    r->top_k = top_k < 0 ? 0 : (int32_t)top_k;
    /* An extension of llama.cpp's and vLLM's servers: generate past EOS. */
    if ((st = get_bool(p, body, "ignore_eos", &r->ignore_eos)))
        return st;
    if ((st = get_int(p, body, "seed", INT64_MIN, INT64_MAX, &seed, &given)))
        return st;
    r->has_seed = given;
    r->seed = (uint64_t)seed;
    const char *key = "max_tokens";
    if (p->api == PX_SERVE_API_CHAT && member(body, "max_completion_tokens"))
        key = "max_completion_tokens";
    if ((st = get_int(p, body, key, 1, p->lim.max_new_tokens, &max, NULL)))
        return st;
    r->max_tokens = (uint32_t)max;
    return PX_OK;
}

static px_status one_stop(parser *p, const json_t *v, const char *param)
{
    px_serve_request *r = p->out;
    if (!json_is_string(v))
        return wrong_type(p, param, "a string", v);
    size_t n = json_string_length(v);
    if (n == 0)
        return bad(p, param, "%s: an empty stop string would stop at once; leave it out", param);
    if (n > p->lim.max_stop_bytes)
        return bad(p, param, "%s: %zu bytes, more than the limit of %zu", param, n,
                   p->lim.max_stop_bytes);
    px_status st = copy_string(p, v, param, &r->stop[r->n_stop], &r->stop_len[r->n_stop]);
    if (st == PX_OK)
        r->n_stop++;
    return st;
}

static px_status stops(parser *p, const json_t *body)
{
    const json_t *v = member(body, "stop");
    if (!v)
        return PX_OK;
    if (json_is_string(v))
        return one_stop(p, v, "stop");
    if (!json_is_array(v))
        return wrong_type(p, "stop", "a string or an array of strings", v);
    if (json_array_size(v) > PX_SERVE_MAX_STOP)
        return bad(p, "stop", "stop: %zu strings, at most %d", json_array_size(v),
                   PX_SERVE_MAX_STOP);
    for (size_t i = 0; i < json_array_size(v); i++) {
        char param[32];
        snprintf(param, sizeof param, "stop[%zu]", i);
        px_status st = one_stop(p, json_array_get(v, i), param);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

static px_status streaming(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    px_status st = get_bool(p, body, "stream", &r->stream);
    if (st != PX_OK)
        return st;
    const json_t *o = member(body, "stream_options");
    if (!o)
        return PX_OK;
    if (!json_is_object(o))
        return wrong_type(p, "stream_options", "an object", o);
    if (!r->stream)
        return bad(p, "stream_options", "stream_options: only allowed with stream: true");
    const json_t *u = member(o, "include_usage");
    if (u && !json_is_boolean(u))
        return wrong_type(p, "stream_options.include_usage", "true or false", u);
    r->include_usage = u && json_is_true(u);
    return PX_OK;
}

static px_status logprobs(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    px_status st;
    if (p->api == PX_SERVE_API_COMPLETIONS) {
        const json_t *v = member(body, "logprobs");
        if (v && json_is_boolean(v))
            return bad(p, "logprobs",
                       "logprobs: expected an integer 0..5 (alternatives per token); true is "
                       "the chat API's form");
        int64_t k = 0;
        if ((st = get_int(p, body, "logprobs", 0, 5, &k, &r->logprobs)))
            return st;
        r->top_logprobs = (uint32_t)k;
        return PX_OK;
    }
    int64_t k = 0;
    bool given;
    if ((st = get_bool(p, body, "logprobs", &r->logprobs)) ||
        (st = get_int(p, body, "top_logprobs", 0, PX_SERVE_MAX_TOP_LOGPROBS, &k, &given)))
        return st;
    if (given && !r->logprobs)
        return bad(p, "top_logprobs", "top_logprobs: needs logprobs: true");
    r->top_logprobs = (uint32_t)k;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* The prompt (completions)                                            */
/* ------------------------------------------------------------------ */

static px_status token_array(parser *p, const json_t *arr, const char *param)
{
    px_serve_request *r = p->out;
    size_t n = json_array_size(arr);
    if (n == 0)
        return bad(p, param, "%s: an empty token array; give at least one token", param);
    if (n > p->lim.max_prompt_tokens)
        return bad(p, param, "%s: %zu tokens, more than the limit of %zu", param, n,
                   p->lim.max_prompt_tokens);
    int32_t *ids = px_arena_calloc(p->arena, n, sizeof *ids);
    if (!ids)
        return oom(p);
    int64_t hi = p->lim.n_vocab ? (int64_t)p->lim.n_vocab - 1 : INT32_MAX;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        char at[48];
        snprintf(at, sizeof at, "%s[%zu]", param, i);
        if (!json_is_integer(v))
            return wrong_type(p, at, "a token id (an integer)", v);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id > hi)
            return bad(p, at,
                       "%s: token %" JSON_INTEGER_FORMAT " is outside the vocabulary [0, %" PRId64
                       "]",
                       at, id, hi);
        ids[i] = (int32_t)id;
    }
    r->prompt_tokens = ids;
    r->n_prompt_tokens = n;
    return PX_OK;
}

static px_status prompt(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    const json_t *v = member(body, "prompt");
    if (!v)
        return bad(p, "prompt", "prompt: missing; give the text (or token ids) to complete");
    if (json_is_string(v))
        return copy_string(p, v, "prompt", &r->prompt, &r->prompt_len);
    if (!json_is_array(v))
        return wrong_type(p, "prompt", "a string or an array of token ids", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return bad(p, "prompt", "prompt: an empty array; give the text to complete");
    const json_t *first = json_array_get(v, 0);
    if (json_is_integer(first))
        return token_array(p, v, "prompt");
    if (!json_is_string(first) && !json_is_array(first))
        return wrong_type(p, "prompt[0]", "a string, a token id or an array of token ids", first);
    if (n > 1)
        return bad(p, "prompt",
                   "prompt: %zu prompts in one request; plexus completes one prompt per request "
                   "(send one request each)",
                   n);
    if (json_is_string(first))
        return copy_string(p, first, "prompt[0]", &r->prompt, &r->prompt_len);
    return token_array(p, first, "prompt[0]");
}

/* ------------------------------------------------------------------ */
/* The conversation (chat)                                             */
/* ------------------------------------------------------------------ */

static px_status role(parser *p, const json_t *msg, size_t i, px_serve_role *out)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].role", i);
    const json_t *v = json_object_get(msg, "role");
    if (!v)
        return bad(p, param, "%s: missing", param);
    if (!json_is_string(v))
        return wrong_type(p, param, "a string", v);
    const char *s = json_string_value(v);
    if (!strcmp(s, "system") || !strcmp(s, "developer"))
        *out = PX_SERVE_ROLE_SYSTEM;
    else if (!strcmp(s, "user"))
        *out = PX_SERVE_ROLE_USER;
    else if (!strcmp(s, "assistant"))
        *out = PX_SERVE_ROLE_ASSISTANT;
    else if (!strcmp(s, "tool") || !strcmp(s, "function"))
        return bad(p, param, "%s: \"%s\" messages are not supported (no tool calling)", param, s);
    else
        return bad(p, param, "%s: unknown role \"%.40s\" (system, developer, user or assistant)",
                   param, s);
    return PX_OK;
}

/* Content parts: the text parts joined with newlines. */
static px_status content_parts(parser *p, const json_t *parts, size_t i, px_serve_chat_msg *m)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_status st = PX_OK;
    char param[80];
    for (size_t k = 0; k < json_array_size(parts); k++) {
        const json_t *part = json_array_get(parts, k);
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!json_is_string(type)) {
            st = bad(p, param, "%s: expected {\"type\": \"text\", \"text\": ...}", param);
            break;
        }
        if (strcmp(json_string_value(type), "text")) {
            st = bad(p, param, "%s: \"%.40s\" parts are not supported (text only)", param,
                     json_string_value(type));
            break;
        }
        const json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].text", i, k);
            st = t ? wrong_type(p, param, "a string", t) : bad(p, param, "%s: missing", param);
            break;
        }
        if ((k && px_strbuf_addch(&sb, '\n')) ||
            px_strbuf_add(&sb, json_string_value(t), json_string_length(t))) {
            st = oom(p);
            break;
        }
        if (sb.len > p->lim.max_string_bytes) {
            snprintf(param, sizeof param, "messages[%zu].content", i);
            st = bad(p, param, "%s: more than the limit of %zu bytes", param,
                     p->lim.max_string_bytes);
            break;
        }
    }
    if (st == PX_OK) {
        char *s = px_arena_strndup(p->arena, sb.buf, sb.len);
        if (!s)
            st = oom(p);
        m->content = s;
        m->len = sb.len;
    }
    px_strbuf_release(&sb);
    return st;
}

static px_status message(parser *p, const json_t *msg, size_t i, px_serve_chat_msg *m)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(msg))
        return wrong_type(p, param, "an object", msg);
    px_status st = role(p, msg, i, &m->role);
    if (st != PX_OK)
        return st;
    const json_t *calls = member(msg, "tool_calls");
    if (calls && !(json_is_array(calls) && json_array_size(calls) == 0)) {
        snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
        return bad(p, param, "%s: not supported (no tool calling)", param);
    }
    snprintf(param, sizeof param, "messages[%zu].content", i);
    const json_t *c = member(msg, "content");
    if (!c)
        return bad(p, param, "%s: missing; give the message's text", param);
    if (json_is_string(c))
        return copy_string(p, c, param, &m->content, &m->len);
    if (json_is_array(c))
        return content_parts(p, c, i, m);
    return wrong_type(p, param, "a string or an array of text parts", c);
}

static px_status messages(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    const json_t *v = member(body, "messages");
    if (!v)
        return bad(p, "messages", "messages: missing; give the conversation");
    if (!json_is_array(v))
        return wrong_type(p, "messages", "an array of messages", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return bad(p, "messages", "messages: empty; give at least one message");
    if (n > p->lim.max_messages)
        return bad(p, "messages", "messages: %zu messages, more than the limit of %zu", n,
                   p->lim.max_messages);
    px_serve_chat_msg *m = px_arena_calloc(p->arena, n, sizeof *m);
    if (!m)
        return oom(p);
    for (size_t i = 0; i < n; i++) {
        px_status st = message(p, json_array_get(v, i), i, &m[i]);
        if (st != PX_OK)
            return st;
    }
    r->messages = m;
    r->n_messages = n;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* The body                                                            */
/* ------------------------------------------------------------------ */

static px_status parse_body(parser *p, const json_t *body)
{
    px_serve_request *r = p->out;
    px_status st;
    const json_t *model = member(body, "model");
    if (model && !json_is_string(model))
        return wrong_type(p, "model", "a string", model);
    if (model && json_string_length(model) > 256)
        return bad(p, "model", "model: %zu bytes; a model id is at most 256",
                   json_string_length(model));
    if (model && (st = copy_string(p, model, "model", &r->model, NULL)))
        return st;
    if ((st = p->api == PX_SERVE_API_CHAT ? messages(p, body) : prompt(p, body)) ||
        (st = sampling(p, body)) || (st = stops(p, body)) || (st = streaming(p, body)) ||
        (st = logprobs(p, body)) || (st = unsupported_options(p, body)))
        return st;
    return PX_OK;
}

px_status px_serve_request_parse(px_serve_api api, const char *body, size_t len,
                                 const px_serve_limits *lim, px_serve_request *out,
                                 px_serve_error *e)
{
    memset(out, 0, sizeof *out);
    parser p = {api, limits_or_default(lim), out, e, NULL};
    if (api != PX_SERVE_API_COMPLETIONS && api != PX_SERVE_API_CHAT)
        return px_serve_error_set(e, PX_SERVE_ERR_INTERNAL, NULL, "unknown API %d", (int)api);
    if (len > p.lim.max_body_bytes)
        return px_serve_error_set(e, PX_SERVE_ERR_TOO_LARGE, NULL,
                                  "the request body is %zu bytes, more than the limit of %zu", len,
                                  p.lim.max_body_bytes);
    px_json_limits jl = {p.lim.max_body_bytes, 32, p.lim.max_string_bytes,
                         PX_MAX(p.lim.max_messages, p.lim.max_prompt_tokens) + 64};
    json_t *doc = NULL;
    px_err jerr;
    px_status st = px_json_parse(body ? body : "", body ? len : 0, "body", &jl, &doc, &jerr);
    if (st == PX_ENOMEM)
        return oom(&p);
    if (st != PX_OK)
        return bad(&p, NULL, "%s", jerr.msg);
    if (!json_is_object(doc)) {
        st = bad(&p, NULL, "body: expected a JSON object, got %s", px_json_type_name(doc));
        json_decref(doc);
        return st;
    }
    if (px_arena_new(0, &p.arena, NULL) != PX_OK) {
        json_decref(doc);
        return oom(&p);
    }
    out->api = api;
    out->arena = p.arena;
    out->temperature = 1;
    out->top_p = 1;
    st = parse_body(&p, doc);
    json_decref(doc);
    if (st != PX_OK)
        px_serve_request_release(out);
    return st;
}

void px_serve_request_release(px_serve_request *r)
{
    if (!r)
        return;
    px_arena_free(r->arena);
    memset(r, 0, sizeof *r);
}
