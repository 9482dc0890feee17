/*
 * One completion call, from the request body to the response: the body
 * parsed (openai.c), the prompt built (a chat rendered with the model's
 * template) and tokenized, a request submitted to the least loaded
 * replica's engine, and its tokens turned into the response as the engine
 * produces them (on the engine's thread).  A streamed response is read
 * by libmicrohttpd from a callback that waits for the next chunk; a whole
 * one is sent when the request ends.  Either way a client that goes away
 * is noticed within 200 ms and its request cancelled, freeing its
 * sequence at the engine's next step.
 */
#include "serve/server_impl.h"

#include <microhttpd.h>
#include <poll.h>
#include <time.h>

#define WAIT_MS 200

typedef struct call {
    px_serve *s;
    px_serve_api api;
    atomic_int refs; /* the HTTP side and the engine's request */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    px_strbuf out; /* bytes produced, not yet handed to the connection */
    size_t sent;
    bool done; /* the engine ended the request and out holds the end */
    px_rt_finish why;
    px_err err;
    px_rt_request_stats st;
    px_serve_response *resp;
    bool stream;
    bool string_stop; /* a stop string ended it */
    bool cancel_sent;
    uint64_t id;
    px__srv_replica *rep;
    int fd;
    uint32_t prompt_tokens;
    px_serve_token_alt alts[PX_RT_MAX_LOGPROBS];
} call;

static void call_unref(call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    px_serve_response_free(c->resp);
    px_strbuf_release(&c->out);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void px__srv_count(px_serve *s, px_serve_api api, int status)
{
    int k = status < 300    ? 0
            : status == 400 ? 1
            : status == 401 ? 2
            : status == 404 ? 3
            : status == 429 ? 4
                            : 5;
    pthread_mutex_lock(&s->mu);
    s->m.requests[api == PX_SERVE_API_CHAT][k]++;
    pthread_mutex_unlock(&s->mu);
}

static int queue_body(struct MHD_Connection *conn, int status, const char *ctype, char *body,
                      size_t len, bool retry_after)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after)
        MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    int rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

int px__srv_reply_error(px_serve *s, struct MHD_Connection *conn, px_serve_api api,
                        const px_serve_error *e)
{
    px__srv_count(s, api, e->http_status);
    char *body = px_serve_error_json(e);
    return queue_body(conn, e->http_status, "application/json", body, body ? strlen(body) : 0,
                      e->kind == PX_SERVE_ERR_RATE_LIMIT);
}

/* ------------------------------------------------------------------ */
/* The engine's side                                                   */
/* ------------------------------------------------------------------ */

static bool on_token(void *ud, const px_rt_token_event *ev)
{
    call *c = ud;
    px_serve_token_event sev = {.id = ev->token,
                                .text = ev->piece ? ev->piece : "",
                                .len = ev->piece ? ev->len : 0,
                                .logprob = ev->logprob,
                                .top = c->alts,
                                .n_top = ev->n_top};
    for (uint32_t k = 0; k < ev->n_top; k++) {
        const char *text = "";
        size_t len = 0;
        (void)px_rt_tokenizer_token_text(c->s->tok, ev->top_token[k], &text, &len, NULL);
        c->alts[k] = (px_serve_token_alt){
            .id = ev->top_token[k], .text = text, .len = len, .logprob = ev->top_logprob[k]};
    }
    bool stopped = false;
    px_err err;
    pthread_mutex_lock(&c->mu);
    px_status st = px_serve_response_token(c->resp, &sev, &c->out, &stopped, &err);
    if (stopped)
        c->string_stop = true;
    /* Only a stream has something to send per token; a whole response is
     * sent when the request ends (on_finish wakes it), so its HTTP thread
     * is not woken once per token of every row of every step. */
    if (c->stream) {
        atomic_fetch_add(&c->s->http_wakeups, 1);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (st)
        px_log_warn("serve: request %" PRIu64 ": %s", c->id, err.msg);
    return st == PX_OK && !stopped;
}

static void record(px_serve *s, const call *c, const px_rt_request_stats *st)
{
    pthread_mutex_lock(&s->mu);
    s->m.prompt_tokens += st->prompt_tokens;
    s->m.completion_tokens += st->new_tokens;
    if (st->new_tokens > 0) {
        px__srv_hist_add(&s->m.ttft, (double)st->ttft_ns / 1e9);
        px__srv_hist_add(&s->m.e2e, (double)st->total_ns / 1e9);
    }
    if (st->new_tokens > 1)
        px__srv_hist_add(&s->m.tpot,
                         (double)(st->total_ns - st->ttft_ns) / 1e9 / (st->new_tokens - 1));
    if (c->why == PX_RT_FINISH_CANCELLED)
        s->m.disconnects++;
    pthread_mutex_unlock(&s->mu);
}

static void on_finish(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err)
{
    (void)id;
    call *c = ud;
    pthread_mutex_lock(&c->mu);
    c->why = why;
    c->st = *st;
    if (err)
        c->err = *err;
    px_err e;
    if (why == PX_RT_FINISH_ERROR) {
        if (c->stream) {
            px_serve_error se;
            px_serve_error_set(&se, PX_SERVE_ERR_INTERNAL, NULL, "generation failed: %s",
                               err ? err->msg : "unknown error");
            px_serve_error_sse(&se, &c->out);
            px_strbuf_adds(&c->out, "data: [DONE]\n\n");
        }
    } else if (why != PX_RT_FINISH_CANCELLED) {
        px_serve_finish reason = why == PX_RT_FINISH_LENGTH || why == PX_RT_FINISH_CONTEXT
                                     ? PX_SERVE_FINISH_LENGTH
                                     : PX_SERVE_FINISH_STOP;
        px_serve_usage usage = {.prompt_tokens = st->prompt_tokens,
                                .completion_tokens = st->new_tokens};
        if (px_serve_response_finish(c->resp, reason, &usage, &c->out, &e) != PX_OK)
            px_log_warn("serve: request %" PRIu64 ": %s", c->id, e.msg);
    }
    c->done = true;
    atomic_fetch_add(&c->s->http_wakeups, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    record(c->s, c, st);
    px__srv_release(c->rep);
    call_unref(c);
}

/* ------------------------------------------------------------------ */
/* The connection's side                                               */
/* ------------------------------------------------------------------ */

/* Whether the client closed its side of the connection. */
static bool gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void deadline_in(struct timespec *dl, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, dl);
    dl->tv_nsec += (long)ms * 1000000L;
    while (dl->tv_nsec >= 1000000000L) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000L;
    }
}

static void cancel(call *c)
{
    px_rt_engine_cancel(c->rep->engine, c->id);
}

/* libmicrohttpd reads a streamed response from here. */
static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    call *c = cls;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->sent < c->out.len) {
            size_t n = PX_MIN(max, c->out.len - c->sent);
            memcpy(buf, c->out.buf + c->sent, n);
            c->sent += n;
            if (c->sent == c->out.len) {
                c->out.len = c->sent = 0;
                if (c->out.buf)
                    c->out.buf[0] = 0;
            }
            pthread_mutex_unlock(&c->mu);
            return (ssize_t)n;
        }
        if (c->done) {
            pthread_mutex_unlock(&c->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec dl;
        deadline_in(&dl, WAIT_MS);
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) != ETIMEDOUT || c->cancel_sent)
            continue;
        if (gone(c->fd)) {
            c->cancel_sent = true;
            pthread_mutex_unlock(&c->mu);
            cancel(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (atomic_load(&c->s->closing)) {
            /* The server is shutting down: the request ends, the stream
             * with it once the engine says so. */
            c->cancel_sent = true;
            cancel(c);
        }
    }
}

static void stream_done(void *cls)
{
    call *c = cls;
    pthread_mutex_lock(&c->mu);
    bool done = c->done;
    pthread_mutex_unlock(&c->mu);
    if (!done)
        cancel(c);
    call_unref(c);
}

static int reply_stream(call *c, struct MHD_Connection *conn)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_stream, c, stream_done);
    if (!r) {
        cancel(c);
        call_unref(c);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    px__srv_count(c->s, c->api, 200);
    int rc = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

/* Waits for the whole response, cancelling when the client goes away. */
static int reply_whole(call *c, struct MHD_Connection *conn)
{
    pthread_mutex_lock(&c->mu);
    bool cancelled = false;
    while (!c->done) {
        struct timespec dl;
        deadline_in(&dl, WAIT_MS);
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT && !cancelled &&
            (gone(c->fd) || atomic_load(&c->s->closing))) {
            cancelled = true;
            cancel(c);
        }
    }
    char *body = NULL;
    size_t len = 0;
    int status = 200;
    if (c->why == PX_RT_FINISH_ERROR) {
        px_serve_error e;
        px_serve_error_set(&e, PX_SERVE_ERR_INTERNAL, NULL, "generation failed: %s", c->err.msg);
        body = px_serve_error_json(&e);
        len = body ? strlen(body) : 0;
        status = 500;
    } else if (c->why != PX_RT_FINISH_CANCELLED) {
        body = c->out.buf;
        len = c->out.len;
        c->out = (px_strbuf)PX_STRBUF_INIT;
    }
    pthread_mutex_unlock(&c->mu);
    px_serve *s = c->s;
    px_serve_api api = c->api;
    call_unref(c);
    if (cancelled || !body) {
        free(body);
        return MHD_NO; /* the client is gone: close */
    }
    px__srv_count(s, api, status);
    return queue_body(conn, status, "application/json", body, len, false);
}

/* ------------------------------------------------------------------ */
/* The request                                                         */
/* ------------------------------------------------------------------ */

/* The prompt's token ids (owned), from text or ids (completions) or the
 * conversation rendered with the chat template. */
static px_status prompt_ids(px_serve *s, const px_serve_request *rq, int32_t **ids, size_t *n,
                            px_serve_error *e)
{
    *ids = NULL;
    *n = 0;
    size_t cap = (size_t)s->context + 1;
    if (rq->prompt_tokens) {
        if (rq->n_prompt_tokens > s->context)
            goto too_long;
        *ids = malloc(PX_MAX(rq->n_prompt_tokens, 1) * sizeof **ids);
        if (!*ids)
            return px_serve_error_set(e, PX_SERVE_ERR_INTERNAL, NULL, "out of memory");
        memcpy(*ids, rq->prompt_tokens, rq->n_prompt_tokens * sizeof **ids);
        *n = rq->n_prompt_tokens;
        return PX_OK;
    }
    char *text = NULL;
    size_t len = 0;
    unsigned flags = PX_RT_ENCODE_BOS | PX_RT_ENCODE_SPECIAL;
    if (rq->api == PX_SERVE_API_CHAT) {
        if (!s->tmpl)
            return px_serve_error_set(e, PX_SERVE_ERR_INVALID_REQUEST, "messages",
                                      "this server cannot render a chat for its model: %s; "
                                      "start it with --chat-template NAME, or use "
                                      "/v1/completions",
                                      s->tmpl_error);
        px_err err;
        size_t bad = SIZE_MAX;
        px_status st =
            px_serve_chat_template_check(s->tmpl, rq->messages, rq->n_messages, &bad, &err);
        px_serve_chat_render_opts ro = {.add_generation_prompt = true};
        if (st == PX_OK)
            st = px_serve_chat_template_render(s->tmpl, rq->messages, rq->n_messages, &ro, &text,
                                               &len, &err);
        if (st) {
            char param[40] = "messages";
            if (bad != SIZE_MAX)
                snprintf(param, sizeof param, "messages[%zu]", bad);
            return px_serve_error_set(
                e, st == PX_ENOMEM ? PX_SERVE_ERR_INTERNAL : PX_SERVE_ERR_INVALID_REQUEST, param,
                "%s", err.msg);
        }
        if (!px_serve_chat_template_info_get(s->tmpl)->add_bos)
            flags &= ~(unsigned)PX_RT_ENCODE_BOS;
    }
    const char *src = text ? text : rq->prompt;
    size_t src_len = text ? len : rq->prompt_len;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) {
        free(text);
        return px_serve_error_set(e, PX_SERVE_ERR_INTERNAL, NULL, "out of memory");
    }
    px_err err;
    px_status st = px_rt_tokenizer_encode(s->tok, src ? src : "", src ? src_len : 0, flags, *ids,
                                          cap, n, &err);
    free(text);
    if (st == PX_ELIMIT || (st == PX_OK && *n > s->context))
        goto too_long;
    if (st)
        return px_serve_error_set(e, PX_SERVE_ERR_INVALID_REQUEST,
                                  rq->api == PX_SERVE_API_CHAT ? "messages" : "prompt", "%s",
                                  err.msg);
    return PX_OK;
too_long:
    free(*ids);
    *ids = NULL;
    return px_serve_error_set(e, PX_SERVE_ERR_CONTEXT_LENGTH,
                              rq->api == PX_SERVE_API_CHAT ? "messages" : "prompt",
                              "the prompt is longer than the model's context of %u tokens: "
                              "shorten it",
                              s->context);
}

static uint64_t seed_of(px_serve *s, const px_serve_request *rq, uint64_t seq)
{
    if (rq->has_seed)
        return rq->seed;
    uint64_t x = s->salt ^ (seq * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    return x;
}

/* The call for a parsed request: its response builder. */
static call *call_new(px_serve *s, const px_serve_request *rq, uint64_t seq, px_serve_error *e)
{
    call *c = calloc(1, sizeof *c);
    if (!c) {
        px_serve_error_set(e, PX_SERVE_ERR_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    c->s = s;
    c->api = rq->api;
    c->stream = rq->stream;
    c->fd = -1;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    char id[40];
    px_serve_response_id(rq->api, seq, s->salt, id);
    px_serve_response_opts ro = {.api = rq->api,
                                 .id = id,
                                 .model = s->model_name,
                                 .created = (int64_t)time(NULL),
                                 .stream = rq->stream,
                                 .include_usage = rq->include_usage,
                                 .logprobs = rq->logprobs,
                                 .top_logprobs = rq->top_logprobs,
                                 .stop = rq->stop,
                                 .stop_len = rq->stop_len,
                                 .n_stop = rq->n_stop};
    px_err err;
    if (px_serve_response_new(&ro, &c->resp, &err) != PX_OK) {
        px_serve_error_set(e, PX_SERVE_ERR_INVALID_REQUEST, "stop", "%s", err.msg);
        call_unref(c);
        return NULL;
    }
    if (rq->stream && px_serve_response_begin(c->resp, &c->out, &err) != PX_OK) {
        px_serve_error_set(e, PX_SERVE_ERR_INTERNAL, NULL, "%s", err.msg);
        call_unref(c);
        return NULL;
    }
    return c;
}

/* Checks what the request asks of this model. */
static px_status check_request(px_serve *s, const px_serve_request *rq, px_serve_error *e)
{
    if (rq->model && strcmp(rq->model, s->model_name) != 0)
        return px_serve_error_set(e, PX_SERVE_ERR_MODEL_NOT_FOUND, "model",
                                  "the model \"%.100s\" is not served here; this server serves "
                                  "\"%s\" (GET /v1/models)",
                                  rq->model, s->model_name);
    return PX_OK;
}

int px__srv_call(px_serve *s, struct MHD_Connection *conn, px_serve_api api, const char *body,
                 size_t len)
{
    px_serve_limits lim = {.max_body_bytes = s->o.max_body_bytes,
                           .n_vocab = px_rt_tokenizer_n_tokens(s->tok)};
    px_serve_request rq;
    px_serve_error e;
    if (px_serve_request_parse(api, body, len, &lim, &rq, &e) != PX_OK)
        return px__srv_reply_error(s, conn, api, &e);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    call *c = NULL;
    int rc;
    if (check_request(s, &rq, &e) != PX_OK || prompt_ids(s, &rq, &ids, &n_ids, &e) != PX_OK)
        goto refuse;
    uint64_t seq = atomic_fetch_add(&s->next_seq, 1);
    if (!(c = call_new(s, &rq, seq, &e)))
        goto refuse;
    px__srv_replica *rep = px__srv_pick(s);
    if (!rep) {
        px_serve_error_set(&e, PX_SERVE_ERR_UNAVAILABLE, NULL,
                           "no replica of the model is serving (GET /health says why)");
        goto refuse;
    }
    c->rep = rep;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    uint32_t max_new = rq.max_tokens                     ? rq.max_tokens
                       : api == PX_SERVE_API_COMPLETIONS ? 16
                                                         : UINT32_MAX;
    px_rt_request r = {.prompt = ids,
                       .n_prompt = (uint32_t)n_ids,
                       .max_new_tokens = max_new,
                       .sampling = {.temperature = (float)rq.temperature,
                                    .top_p = (float)rq.top_p,
                                    .top_k = rq.top_k > 0 ? (uint32_t)rq.top_k : 0,
                                    .min_p = (float)rq.min_p,
                                    .seed = seed_of(s, &rq, seq)},
                       .ignore_eos = rq.ignore_eos,
                       .stop_tokens = s->stop_ids,
                       .n_stop_tokens = s->n_stop_ids,
                       .logprobs = rq.logprobs,
                       .top_logprobs = rq.top_logprobs,
                       .on_token = on_token,
                       .on_finish = on_finish,
                       .ud = c};
    c->prompt_tokens = (uint32_t)n_ids;
    atomic_fetch_add(&c->refs, 1); /* the engine's */
    px_err err;
    px_status st = px_rt_engine_submit(rep->engine, &r, &c->id, &err);
    if (st) {
        atomic_fetch_sub(&c->refs, 1);
        px__srv_release(rep);
        if (st == PX_ELIMIT && strstr(err.msg, "try again")) {
            pthread_mutex_lock(&s->mu);
            s->m.rejected_queue_full++;
            pthread_mutex_unlock(&s->mu);
            px_serve_error_set(&e, PX_SERVE_ERR_RATE_LIMIT, NULL,
                               "the server is busy (%s); retry after a second", err.msg);
        } else if (st == PX_ELIMIT) {
            px_serve_error_set(&e, PX_SERVE_ERR_CONTEXT_LENGTH,
                               api == PX_SERVE_API_CHAT ? "messages" : "prompt", "%s", err.msg);
        } else if (st == PX_ESTATE) {
            px_serve_error_set(&e, PX_SERVE_ERR_UNAVAILABLE, NULL, "%s", err.msg);
        } else {
            px_serve_error_set(&e, PX_SERVE_ERR_INVALID_REQUEST, NULL, "%s", err.msg);
        }
        goto refuse;
    }
    free(ids);
    px_serve_request_release(&rq);
    return c->stream ? reply_stream(c, conn) : reply_whole(c, conn);
refuse:
    rc = px__srv_reply_error(s, conn, api, &e);
    if (c)
        call_unref(c);
    free(ids);
    px_serve_request_release(&rq);
    return rc;
}
