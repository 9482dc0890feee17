/*
 * Response bodies and server-sent event chunks of the OpenAI API, built
 * from token events.
 *
 * Text is held back while it could still change meaning: while it ends in
 * an incomplete UTF-8 character (a token may stop in the middle of one, and
 * JSON must not carry a broken one) or in what may be the start of a stop
 * string (the client must never see part of a stop string).  What is
 * released is always whole tokens, so that each chunk's logprobs describe
 * exactly its text.  A stop string found cuts the text before it and ends
 * the response.
 */
#include "serve/serve_impl.h"

/* A token whose text sits in the held-back buffer. */
typedef struct held_token {
    int32_t id;
    size_t len; /* its bytes in the buffer */
    float logprob;
    px_serve_token_alt *top; /* copies, texts in one block after them */
    size_t n_top;
} held_token;

struct px_serve_response {
    px_serve_api api;
    char *id, *model;
    int64_t created;
    bool stream, include_usage, logprobs;
    uint32_t top_logprobs;
    char *stop[PX_SERVE_MAX_STOP];
    size_t stop_len[PX_SERVE_MAX_STOP], n_stop;
    px_strbuf held;     /* text not yet released */
    held_token *tokens; /* tokens of held, in order */
    size_t n_tokens, cap_tokens;
    px_strbuf text; /* text released so far */
    size_t chars;   /* characters released so far (text_offset) */
    json_t *lp;     /* logprobs kept for a whole-body response */
    bool began, stopped, finished;
};

static void free_tokens(held_token *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(t[i].top);
}

void px_serve_response_free(px_serve_response *r)
{
    if (!r)
        return;
    free(r->id);
    free(r->model);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free_tokens(r->tokens, r->n_tokens);
    free(r->tokens);
    px_strbuf_release(&r->held);
    px_strbuf_release(&r->text);
    json_decref(r->lp);
    free(r);
}

static px_status copy_stops(px_serve_response *r, const px_serve_response_opts *o, px_err *err)
{
    if (o->n_stop > PX_SERVE_MAX_STOP || (o->n_stop && !o->stop))
        return px_err_set(err, PX_EINVAL, "response: %zu stop strings (at most %d)", o->n_stop,
                          PX_SERVE_MAX_STOP);
    for (size_t i = 0; i < o->n_stop; i++) {
        size_t n = o->stop[i] ? (o->stop_len ? o->stop_len[i] : strlen(o->stop[i])) : 0;
        if (n == 0)
            return px_err_set(err, PX_EINVAL, "response: stop string %zu is empty", i);
        if (!(r->stop[i] = px_strndup(o->stop[i], n)))
            return px_err_set(err, PX_ENOMEM, "response: out of memory");
        r->stop_len[i] = n;
        r->n_stop++;
    }
    return PX_OK;
}

/* The whole-body logprobs: chat's content list, or completions' four
 * parallel lists. */
static json_t *new_logprobs(px_serve_api api)
{
    if (api == PX_SERVE_API_CHAT)
        return json_array();
    json_t *o = json_object();
    if (o &&
        (px_json_set(o, "tokens", json_array()) || px_json_set(o, "token_logprobs", json_array()) ||
         px_json_set(o, "top_logprobs", json_array()) ||
         px_json_set(o, "text_offset", json_array()))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

px_status px_serve_response_new(const px_serve_response_opts *o, px_serve_response **out,
                                px_err *err)
{
    *out = NULL;
    if (!o || !o->id || !o->model ||
        (o->api != PX_SERVE_API_COMPLETIONS && o->api != PX_SERVE_API_CHAT))
        return px_err_set(err, PX_EINVAL, "response: an API, an id and a model are needed");
    px_serve_response *r = calloc(1, sizeof *r);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "response: out of memory");
    r->api = o->api;
    r->created = o->created;
    r->stream = o->stream;
    r->include_usage = o->stream && o->include_usage;
    r->logprobs = o->logprobs;
    r->top_logprobs = PX_MIN(o->top_logprobs, PX_SERVE_MAX_TOP_LOGPROBS);
    px_strbuf_init(&r->held);
    px_strbuf_init(&r->text);
    px_status st = copy_stops(r, o, err);
    if (st == PX_OK && (!(r->id = px_strdup(o->id)) || !(r->model = px_strdup(o->model)) ||
                        (r->logprobs && !r->stream && !(r->lp = new_logprobs(r->api)))))
        st = px_err_set(err, PX_ENOMEM, "response: out of memory");
    if (st != PX_OK) {
        px_serve_response_free(r);
        return st;
    }
    *out = r;
    return PX_OK;
}

const char *px_serve_response_text(const px_serve_response *r, size_t *len)
{
    if (len)
        *len = r->text.len;
    return r->text.buf;
}

/* ------------------------------------------------------------------ */
/* JSON pieces                                                         */
/* ------------------------------------------------------------------ */

/* OpenAI writes -9999 for a log-probability of minus infinity. */
static json_t *logprob_json(float lp)
{
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

static json_t *bytes_json(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (px_json_push(a, json_integer((unsigned char)s[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Chat: {"token", "logprob", "bytes"} (and "top_logprobs" when top). */
static json_t *chat_entry(const char *s, size_t n, float lp, const px_serve_token_alt *top,
                          size_t n_top, bool with_top)
{
    json_t *e = json_object();
    if (!e || px_json_set(e, "token", px_json_text(s, n)) ||
        px_json_set(e, "logprob", logprob_json(lp)) || px_json_set(e, "bytes", bytes_json(s, n)))
        goto fail;
    if (!with_top)
        return e;
    json_t *alts = json_array();
    if (px_json_set(e, "top_logprobs", alts))
        goto fail;
    for (size_t i = 0; i < n_top; i++)
        if (px_json_push(alts, chat_entry(top[i].text, top[i].len, top[i].logprob, NULL, 0, false)))
            goto fail;
    return e;
fail:
    json_decref(e);
    return NULL;
}

/* Completions: {text: logprob} of the alternatives (the first of equal
 * texts kept), or null when none were asked for. */
static json_t *completion_alts(const held_token *t, uint32_t k)
{
    if (k == 0)
        return json_null();
    json_t *o = json_object();
    for (size_t i = 0; o && i < t->n_top && i < k; i++) {
        px_strbuf sb = PX_STRBUF_INIT;
        px_status st = px_utf8_add_sanitized(&sb, t->top[i].text, t->top[i].len);
        if (st == PX_OK && !json_object_get(o, sb.buf))
            st = px_json_set(o, sb.buf, logprob_json(t->top[i].logprob));
        px_strbuf_release(&sb);
        if (st != PX_OK) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* Appends the logprobs of tokens[0..n) (texts in s) to lp, in the API's
 * layout. */
static px_status add_logprobs(px_serve_response *r, json_t *lp, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++) {
        const held_token *t = &r->tokens[i];
        if (r->api == PX_SERVE_API_CHAT) {
            if (px_json_push(lp, chat_entry(s, t->len, t->logprob, t->top,
                                            PX_MIN(t->n_top, r->top_logprobs), true)))
                return PX_ENOMEM;
        } else if (px_json_push(json_object_get(lp, "tokens"), px_json_text(s, t->len)) ||
                   px_json_push(json_object_get(lp, "token_logprobs"), logprob_json(t->logprob)) ||
                   px_json_push(json_object_get(lp, "top_logprobs"),
                                completion_alts(t, r->top_logprobs)) ||
                   px_json_push(json_object_get(lp, "text_offset"),
                                json_integer((json_int_t)r->chars))) {
            return PX_ENOMEM;
        }
        /* Characters, counted as UTF-8 lead bytes, so that a token ending
         * mid-character leaves the count where the next one starts. */
        for (size_t k = 0; k < t->len; k++)
            r->chars += ((unsigned char)s[k] & 0xC0) != 0x80;
        s += t->len;
    }
    return PX_OK;
}

/* {"id", "object", "created", "model", "choices": [choice]} (choice
 * stolen; NULL: an empty list), with "usage": null in streams that end
 * with a usage chunk. */
static json_t *envelope(const px_serve_response *r, const char *object, json_t *choice)
{
    json_t *o = json_object(), *choices = json_array();
    if (!o || !choices || px_json_set(o, "id", json_string(r->id)) ||
        px_json_set(o, "object", json_string(object)) ||
        px_json_set(o, "created", json_integer(r->created)) ||
        px_json_set(o, "model", px_json_text(r->model, strlen(r->model))) ||
        px_json_set(o, "choices", json_incref(choices)) ||
        (choice && px_json_push(choices, json_incref(choice))) ||
        (r->include_usage && px_json_set(o, "usage", json_null()))) {
        json_decref(o);
        o = NULL;
    }
    json_decref(choices);
    json_decref(choice);
    return o;
}

static px_status emit_sse(json_t *chunk, px_strbuf *out)
{
    if (!chunk)
        return PX_ENOMEM;
    char *s = json_dumps(chunk, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(chunk);
    if (!s)
        return PX_ENOMEM;
    px_status st = px_strbuf_addf(out, "data: %s\n\n", s);
    free(s);
    return st;
}

/* A streamed chunk carrying text (or the end): chat's delta or
 * completions' text, the chunk's logprobs, the finish reason. */
static json_t *stream_choice(const px_serve_response *r, const char *s, size_t n, json_t *lp,
                             const char *finish, bool role)
{
    json_t *c = json_object();
    if (!c || (r->api == PX_SERVE_API_COMPLETIONS && px_json_set(c, "text", px_json_text(s, n))) ||
        px_json_set(c, "index", json_integer(0)))
        goto fail;
    if (r->api == PX_SERVE_API_CHAT) {
        json_t *delta = json_object();
        if (px_json_set(c, "delta", delta) ||
            (role && px_json_set(delta, "role", json_string("assistant"))) ||
            ((role || finish == NULL) && px_json_set(delta, "content", px_json_text(s, n))))
            goto fail;
    }
    if (lp && r->api == PX_SERVE_API_CHAT) {
        json_t *wrap = json_object();
        if (px_json_set(c, "logprobs", wrap) || px_json_set(wrap, "content", json_incref(lp)))
            goto fail;
    } else if (px_json_set(c, "logprobs", lp ? json_incref(lp) : json_null())) {
        goto fail;
    }
    if (px_json_set(c, "finish_reason", finish ? json_string(finish) : json_null()))
        goto fail;
    json_decref(lp);
    return c;
fail:
    json_decref(lp);
    json_decref(c);
    return NULL;
}

static const char *chunk_object(const px_serve_response *r)
{
    return r->api == PX_SERVE_API_CHAT ? "chat.completion.chunk" : "text_completion";
}

px_status px_serve_response_begin(px_serve_response *r, px_strbuf *out, px_err *err)
{
    if (r->began || !r->stream || r->api != PX_SERVE_API_CHAT) {
        r->began = true;
        return PX_OK;
    }
    json_t *c = stream_choice(r, "", 0, NULL, NULL, true);
    if (!c || emit_sse(envelope(r, chunk_object(r), c), out) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "response: out of memory");
    r->began = true;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Releasing held text                                                 */
/* ------------------------------------------------------------------ */

/* Releases the first n held tokens and the first len bytes of held text
 * (len may end inside the last of them when a stop string cuts it), then
 * forgets them. */
static px_status release(px_serve_response *r, size_t n, size_t len, px_strbuf *out)
{
    if (n == 0 && len == 0)
        return PX_OK;
    json_t *lp = NULL;
    if (r->logprobs) {
        lp = r->stream ? new_logprobs(r->api) : json_incref(r->lp);
        if (!lp || add_logprobs(r, lp, n, r->held.buf) != PX_OK) {
            json_decref(lp);
            return PX_ENOMEM;
        }
    }
    px_status st = px_strbuf_add(&r->text, r->held.buf, len);
    /* A chunk for text, or for the logprobs of tokens without text. */
    if (st == PX_OK && r->stream && (len > 0 || lp)) {
        json_t *c = stream_choice(r, r->held.buf, len, r->lp ? NULL : lp, NULL, false);
        lp = NULL;
        st = c ? emit_sse(envelope(r, chunk_object(r), c), out) : PX_ENOMEM;
    }
    json_decref(lp);
    if (st != PX_OK)
        return st;
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        used += r->tokens[i].len;
    used = PX_MAX(used, len);
    memmove(r->held.buf, r->held.buf + used, r->held.len - used + 1);
    r->held.len -= used;
    free_tokens(r->tokens, n);
    memmove(r->tokens, r->tokens + n, (r->n_tokens - n) * sizeof *r->tokens);
    r->n_tokens -= n;
    return PX_OK;
}

/* The earliest place a stop string starts in the held text, or SIZE_MAX. */
static size_t find_stop(const px_serve_response *r)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < r->n_stop; i++) {
        const char *p = r->held.len >= r->stop_len[i]
                            ? memmem(r->held.buf, r->held.len, r->stop[i], r->stop_len[i])
                            : NULL;
        if (p && (size_t)(p - r->held.buf) < best)
            best = (size_t)(p - r->held.buf);
    }
    return best;
}

/* How many bytes at the end of the held text may begin a stop string. */
static size_t stop_prefix(const px_serve_response *r)
{
    size_t hold = 0;
    for (size_t i = 0; i < r->n_stop; i++)
        for (size_t k = PX_MIN(r->stop_len[i] - 1, r->held.len); k > hold; k--)
            if (!memcmp(r->held.buf + r->held.len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    return hold;
}

/* Releases the longest run of whole tokens that ends on a character
 * boundary and holds nothing a stop string could start with. */
static px_status release_safe(px_serve_response *r, px_strbuf *out)
{
    size_t safe = r->held.len - stop_prefix(r);
    safe = PX_MIN(safe, r->held.len - px_utf8_incomplete_tail(r->held.buf, r->held.len));
    size_t n = 0, end = 0, best_n = 0, best_end = 0;
    while (n < r->n_tokens && end + r->tokens[n].len <= safe) {
        end += r->tokens[n++].len;
        if (px_utf8_boundary(r->held.buf, r->held.len, end)) {
            best_n = n;
            best_end = end;
        }
    }
    return release(r, best_n, best_end, out);
}

/* A stop string starts at cut: the tokens that begin before it go out
 * with the text up to it; the rest is dropped. */
static px_status release_stop(px_serve_response *r, size_t cut, px_strbuf *out)
{
    size_t n = 0, start = 0;
    while (n < r->n_tokens && start < cut)
        start += r->tokens[n++].len;
    px_status st = release(r, n, cut, out);
    free_tokens(r->tokens, r->n_tokens);
    r->n_tokens = 0;
    px_strbuf_reset(&r->held);
    r->stopped = true;
    return st;
}

static px_status hold(px_serve_response *r, const px_serve_token_event *ev)
{
    if (r->n_tokens == r->cap_tokens) {
        size_t cap = r->cap_tokens ? 2 * r->cap_tokens : 16;
        held_token *t = realloc(r->tokens, cap * sizeof *t);
        if (!t)
            return PX_ENOMEM;
        r->tokens = t;
        r->cap_tokens = cap;
    }
    held_token t = {ev->id, ev->len, ev->logprob, NULL, 0};
    size_t k = r->logprobs && ev->top ? PX_MIN(ev->n_top, r->top_logprobs) : 0;
    if (k) {
        size_t bytes = k * sizeof *t.top;
        for (size_t i = 0; i < k; i++)
            bytes += ev->top[i].len;
        if (!(t.top = malloc(bytes)))
            return PX_ENOMEM;
        char *texts = (char *)(t.top + k);
        for (size_t i = 0; i < k; i++) {
            t.top[i] = ev->top[i];
            if (ev->top[i].len)
                memcpy(texts, ev->top[i].text, ev->top[i].len);
            t.top[i].text = texts;
            texts += ev->top[i].len;
        }
        t.n_top = k;
    }
    if (ev->len && px_strbuf_add(&r->held, ev->text, ev->len) != PX_OK) {
        free(t.top);
        return PX_ENOMEM;
    }
    r->tokens[r->n_tokens++] = t;
    return PX_OK;
}

px_status px_serve_response_token(px_serve_response *r, const px_serve_token_event *ev,
                                  px_strbuf *out, bool *stopped, px_err *err)
{
    if (stopped)
        *stopped = r->stopped;
    if (r->stopped || r->finished)
        return px_err_set(err, PX_ESTATE, "response: a token after the response %s",
                          r->finished ? "finished" : "met a stop string");
    if (!ev || (ev->len && !ev->text))
        return px_err_set(err, PX_EINVAL, "response: a token event without its text");
    px_status st = px_serve_response_begin(r, out, err);
    if (st != PX_OK)
        return st;
    if (hold(r, ev) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "response: out of memory");
    size_t cut = find_stop(r);
    st = cut != SIZE_MAX ? release_stop(r, cut, out) : release_safe(r, out);
    if (st != PX_OK)
        return px_err_set(err, PX_ENOMEM, "response: out of memory");
    if (stopped)
        *stopped = r->stopped;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* The end                                                             */
/* ------------------------------------------------------------------ */

static json_t *usage_json(const px_serve_usage *u)
{
    px_serve_usage none = {0, 0};
    if (!u)
        u = &none;
    json_t *o = json_object();
    if (o && (px_json_set(o, "prompt_tokens", json_integer((json_int_t)u->prompt_tokens)) ||
              px_json_set(o, "completion_tokens", json_integer((json_int_t)u->completion_tokens)) ||
              px_json_set(o, "total_tokens",
                          json_integer((json_int_t)(u->prompt_tokens + u->completion_tokens))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static px_status finish_stream(px_serve_response *r, const char *reason,
                               const px_serve_usage *usage, px_strbuf *out)
{
    json_t *c = stream_choice(r, "", 0, NULL, reason, false);
    px_status st = c ? emit_sse(envelope(r, chunk_object(r), c), out) : PX_ENOMEM;
    if (st == PX_OK && r->include_usage) {
        json_t *u = envelope(r, chunk_object(r), NULL);
        if (!u || px_json_set(u, "usage", usage_json(usage))) {
            json_decref(u);
            st = PX_ENOMEM;
        } else {
            st = emit_sse(u, out);
        }
    }
    return st == PX_OK ? px_strbuf_adds(out, "data: [DONE]\n\n") : st;
}

/* Chat's {"content": [...]}, completions' lists, or null. */
static json_t *body_logprobs(const px_serve_response *r)
{
    if (!r->lp)
        return json_null();
    if (r->api != PX_SERVE_API_CHAT)
        return json_incref(r->lp);
    json_t *wrap = json_object();
    if (!wrap || px_json_set(wrap, "content", json_incref(r->lp))) {
        json_decref(wrap);
        return NULL;
    }
    return wrap;
}

static json_t *body_choice(const px_serve_response *r, const char *reason)
{
    json_t *c = json_object();
    if (!c)
        return NULL;
    bool ok;
    if (r->api == PX_SERVE_API_CHAT) {
        json_t *m = json_object();
        ok = !px_json_set(c, "index", json_integer(0)) && !px_json_set(c, "message", m) &&
             !px_json_set(m, "role", json_string("assistant")) &&
             !px_json_set(m, "content", px_json_text(r->text.buf, r->text.len));
    } else {
        ok = !px_json_set(c, "text", px_json_text(r->text.buf, r->text.len)) &&
             !px_json_set(c, "index", json_integer(0));
    }
    ok = ok && !px_json_set(c, "logprobs", body_logprobs(r)) &&
         !px_json_set(c, "finish_reason", json_string(reason));
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

static px_status finish_body(px_serve_response *r, const char *reason, const px_serve_usage *usage,
                             px_strbuf *out)
{
    json_t *c = body_choice(r, reason);
    json_t *body =
        c ? envelope(r, r->api == PX_SERVE_API_CHAT ? "chat.completion" : "text_completion", c)
          : NULL;
    if (!body || px_json_set(body, "usage", usage_json(usage))) {
        json_decref(body);
        return PX_ENOMEM;
    }
    char *text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(body);
    if (!text)
        return PX_ENOMEM;
    px_status st = px_strbuf_adds(out, text);
    free(text);
    return st;
}

px_status px_serve_response_finish(px_serve_response *r, px_serve_finish reason,
                                   const px_serve_usage *usage, px_strbuf *out, px_err *err)
{
    if (r->finished)
        return px_err_set(err, PX_ESTATE, "response: already finished");
    px_status st = px_serve_response_begin(r, out, err);
    if (st != PX_OK)
        return st;
    /* What is still held can no longer become a stop string or complete a
     * character: it goes out as it is. */
    st = release(r, r->n_tokens, r->held.len, out);
    const char *why = r->stopped || reason == PX_SERVE_FINISH_STOP ? "stop" : "length";
    if (st == PX_OK)
        st = r->stream ? finish_stream(r, why, usage, out) : finish_body(r, why, usage, out);
    if (st != PX_OK)
        return px_err_set(err, PX_ENOMEM, "response: out of memory");
    r->finished = true;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Ids and the model list                                              */
/* ------------------------------------------------------------------ */

void px_serve_response_id(px_serve_api api, uint64_t seq, uint64_t salt, char out[40])
{
    uint64_t in[3] = {seq, salt, 0};
    uint64_t a = px_hash64(in, sizeof in);
    in[2] = 1;
    uint64_t b = px_hash64(in, sizeof in);
    snprintf(out, 40, "%s%016" PRIx64 "%08" PRIx32,
             api == PX_SERVE_API_CHAT ? "chatcmpl-" : "cmpl-", a, (uint32_t)b);
}

char *px_serve_models_json(const char *const *ids, size_t n, int64_t created, const char *owned_by)
{
    json_t *o = json_object(), *data = json_array();
    if (!o || !data || px_json_set(o, "object", json_string("list")) ||
        px_json_set(o, "data", json_incref(data))) {
        json_decref(o);
        json_decref(data);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_object();
        if (px_json_push(data, m) || px_json_set(m, "id", px_json_text(ids[i], strlen(ids[i]))) ||
            px_json_set(m, "object", json_string("model")) ||
            px_json_set(m, "created", json_integer(created)) ||
            px_json_set(m, "owned_by",
                        px_json_text(owned_by ? owned_by : "plexus",
                                     strlen(owned_by ? owned_by : "plexus")))) {
            json_decref(data);
            json_decref(o);
            return NULL;
        }
    }
    json_decref(data);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
