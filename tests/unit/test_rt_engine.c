/* The generation engine over a session: a request's greedy tokens are the
 * same alone or among others arriving at any time, with any prefill chunk
 * size and through preemptions when the KV cache runs out; cancellation
 * frees a request's blocks at the next step; the queue is bounded;
 * logprobs, stop tokens, a caller's stop and bad requests.  On the real
 * stories260K model (skipped without ../shared). */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define N_REQ  8
#define N_NEW  24
#define MAX_ID 64

typedef struct outcome {
    int32_t tokens[N_NEW + 1];
    float logprob[N_NEW + 1]; /* bit for bit: the logits are the same */
    uint32_t n;
    uint32_t emitted;
    int finished; /* times on_finish came */
    px_rt_finish why;
    px_rt_request_stats st;
    uint32_t stop_after; /* on_token says stop after this many (0: never) */
} outcome;

static px_rt_model *model;
static px_rt_tokenizer *tok;

static const char *texts[N_REQ] = {
    "Once upon a time",  "The cat sat", "A big red ball",          "Lily",
    "One day, a little", "The sun",     "Tom and his dog went to", "She"};

static int setup(void **state)
{
    (void)state;
    char *path = px_test_shared_model("stories260K.gguf");
    if (!path)
        return 0;
    px_err err;
    if (px_rt_model_open(path, &model, &err) != PX_OK) {
        free(path);
        return 0;
    }
    free(path);
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(px_rt_model_ir(model)), &tok, &err), &err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    px_rt_tokenizer_free(tok);
    px_rt_model_free(model);
    return 0;
}

static bool on_token(void *ud, const px_rt_token_event *ev)
{
    outcome *o = ud;
    if (ev->index != o->n)
        fail_msg("token index %u, expected %u", ev->index, o->n);
    o->logprob[o->n] = ev->logprob;
    o->tokens[o->n++] = ev->token;
    o->emitted++;
    return !(o->stop_after && o->n >= o->stop_after);
}

static void on_finish(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err)
{
    (void)id;
    (void)err;
    outcome *o = ud;
    o->finished++;
    o->why = why;
    o->st = *st;
}

static px_rt_request request(const char *text, int32_t *ids, outcome *o)
{
    size_t n;
    px_err err;
    px_assert_ok(
        px_rt_tokenizer_encode(tok, text, strlen(text), PX_RT_ENCODE_BOS, ids, MAX_ID, &n, &err),
        &err);
    memset(o, 0, sizeof *o);
    return (px_rt_request){.prompt = ids,
                           .n_prompt = (uint32_t)n,
                           .max_new_tokens = N_NEW,
                           .ignore_eos = true,
                           .logprobs = true,
                           .on_token = on_token,
                           .on_finish = on_finish,
                           .ud = o};
}

static px_rt_session *session(uint32_t max_seqs, uint32_t kv_blocks, uint32_t rows)
{
    px_rt_session_opts so = {.n_threads = 1,
                             .max_seqs = max_seqs,
                             .context = 128,
                             .kv_blocks = kv_blocks,
                             .kv_block_size = 8,
                             .max_batch_tokens = rows};
    px_rt_session *s;
    px_err err;
    px_assert_ok(px_rt_session_new(model, &so, &s, &err), &err);
    return s;
}

static px_rt_engine *engine(px_rt_session *s, uint32_t step_tokens, uint32_t max_waiting)
{
    px_rt_engine_opts eo = {
        .session = s, .tokenizer = tok, .step_tokens = step_tokens, .max_waiting = max_waiting};
    px_rt_engine *e;
    px_err err;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    return e;
}

/* Each request alone: the reference. */
static void alone(outcome ref[N_REQ])
{
    for (int i = 0; i < N_REQ; i++) {
        px_rt_session *s = session(1, 0, 0);
        px_rt_engine *e = engine(s, 0, 0);
        int32_t ids[MAX_ID];
        px_rt_request r = request(texts[i], ids, &ref[i]);
        uint64_t id;
        px_err err;
        px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
        px_assert_ok(px_rt_engine_run(e, &err), &err);
        assert_int_equal(ref[i].n, N_NEW);
        assert_int_equal(ref[i].why, PX_RT_FINISH_LENGTH);
        px_rt_engine_free(e);
        px_rt_session_free(s);
    }
}

static void expect_same(const outcome *a, const outcome *b)
{
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(a[i].n, b[i].n);
        assert_memory_equal(a[i].tokens, b[i].tokens, a[i].n * sizeof(int32_t));
        assert_memory_equal(a[i].logprob, b[i].logprob, a[i].n * sizeof(float));
        assert_int_equal(b[i].emitted, b[i].n);
        assert_int_equal(b[i].finished, 1);
    }
}

/* All requests on one engine: half at once, the rest arriving while the
 * first decode. */
static void together(px_rt_session *s, uint32_t step_tokens, outcome got[N_REQ],
                     px_rt_engine_metrics *m)
{
    px_rt_engine *e = engine(s, step_tokens, 0);
    int32_t ids[N_REQ][MAX_ID];
    px_err err;
    for (int i = 0; i < N_REQ; i++) {
        px_rt_request r = request(texts[i], ids[i], &got[i]);
        uint64_t id;
        px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
        if (i == N_REQ / 2 - 1)
            for (int k = 0; k < 5; k++) {
                bool busy;
                px_assert_ok(px_rt_engine_step(e, &busy, &err), &err);
            }
    }
    px_assert_ok(px_rt_engine_run(e, &err), &err);
    px_rt_engine_metrics_get(e, m);
    px_rt_engine_free(e);
}

static void test_tokens_do_not_depend_on_company_or_chunking(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome ref[N_REQ], got[N_REQ];
    alone(ref);
    /* Steps of 3 rows: prompts split across steps and sharing them. */
    uint32_t budgets[] = {0, 3, 17};
    for (size_t b = 0; b < PX_ARRAY_LEN(budgets); b++) {
        px_rt_session *s = session(N_REQ, 0, 64);
        px_rt_engine_metrics m;
        together(s, budgets[b], got, &m);
        expect_same(ref, got);
        assert_int_equal(m.finished, N_REQ);
        assert_int_equal(m.preemptions, 0);
        assert_int_equal(m.new_tokens, N_REQ * N_NEW);
        assert_int_equal(m.kv_blocks_used, 0);
        px_rt_session_free(s);
    }
}

static void test_preemption_when_the_cache_runs_out_keeps_the_tokens(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome ref[N_REQ], got[N_REQ];
    alone(ref);
    /* 10 blocks of 8 positions: two or three sequences' worth, for eight
     * running at once. */
    px_rt_session *s = session(N_REQ, 10, 64);
    px_rt_engine_metrics m;
    together(s, 0, got, &m);
    expect_same(ref, got);
    assert_true(m.preemptions > 0);
    uint32_t preempted = 0;
    for (int i = 0; i < N_REQ; i++)
        preempted += got[i].st.preemptions;
    assert_int_equal(preempted, m.preemptions);
    assert_int_equal(m.kv_blocks_used, 0);
    px_rt_session_info info;
    px_rt_session_info_get(s, &info);
    assert_int_equal(info.kv_blocks_free, 10);
    px_rt_session_free(s);
}

static void test_cancel_ends_a_request_and_frees_its_blocks(void **state)
{
    (void)state;
    if (!model)
        skip();
    px_rt_session *s = session(2, 0, 0);
    px_rt_engine *e = engine(s, 0, 0);
    int32_t ids[2][MAX_ID];
    outcome o[2];
    uint64_t id[2];
    px_err err;
    for (int i = 0; i < 2; i++) {
        px_rt_request r = request(texts[i], ids[i], &o[i]);
        px_assert_ok(px_rt_engine_submit(e, &r, &id[i], &err), &err);
    }
    for (int k = 0; k < 4; k++)
        px_assert_ok(px_rt_engine_step(e, NULL, &err), &err);
    px_rt_engine_metrics m0, m1;
    px_rt_engine_metrics_get(e, &m0);
    px_rt_engine_cancel(e, id[0]);
    px_rt_engine_cancel(e, 999999); /* unknown: ignored */
    px_assert_ok(px_rt_engine_step(e, NULL, &err), &err);
    assert_int_equal(o[0].finished, 1);
    assert_int_equal(o[0].why, PX_RT_FINISH_CANCELLED);
    assert_true(o[0].n < N_NEW);
    px_rt_engine_metrics_get(e, &m1);
    assert_true(m1.kv_blocks_used < m0.kv_blocks_used);
    assert_int_equal(m1.cancelled, 1);
    px_assert_ok(px_rt_engine_run(e, &err), &err);
    assert_int_equal(o[1].n, N_NEW);
    assert_int_equal(o[1].why, PX_RT_FINISH_LENGTH);
    px_rt_engine_free(e);
    px_rt_session_free(s);
}

static void test_queue_is_bounded(void **state)
{
    (void)state;
    if (!model)
        skip();
    px_rt_session *s = session(1, 0, 0);
    px_rt_engine *e = engine(s, 0, 2);
    int32_t ids[3][MAX_ID];
    outcome o[3];
    uint64_t id;
    px_err err;
    for (int i = 0; i < 2; i++) {
        px_rt_request r = request(texts[i], ids[i], &o[i]);
        px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    }
    px_rt_request r = request(texts[2], ids[2], &o[2]);
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "try again later");
    /* Once one is running, the queue has room again. */
    px_assert_ok(px_rt_engine_step(e, NULL, &err), &err);
    px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    px_assert_ok(px_rt_engine_run(e, &err), &err);
    px_rt_engine_metrics m;
    px_rt_engine_metrics_get(e, &m);
    assert_int_equal(m.rejected, 1);
    assert_int_equal(m.finished, 3);
    assert_int_equal(o[2].finished, 1);
    px_rt_engine_free(e);
    px_rt_session_free(s);
}

static uint32_t n_lp;
static bool lp_ok;

static bool check_logprobs(void *ud, const px_rt_token_event *ev)
{
    (void)ud;
    n_lp++;
    /* Greedy: the token is the likeliest, and the alternatives come in
     * order. */
    if (!(ev->logprob <= 0) || ev->n_top != 5 || ev->top_token[0] != ev->token ||
        ev->top_logprob[0] != ev->logprob)
        lp_ok = false;
    for (uint32_t k = 1; k < ev->n_top; k++)
        if (ev->top_logprob[k] > ev->top_logprob[k - 1] || ev->top_token[k] == ev->top_token[0])
            lp_ok = false;
    return true;
}

static void test_logprobs_stop_tokens_and_caller_stop(void **state)
{
    (void)state;
    if (!model)
        skip();
    px_rt_session *s = session(3, 0, 0);
    px_rt_engine *e = engine(s, 0, 0);
    int32_t ids[3][MAX_ID];
    outcome o[3], ref[N_REQ];
    alone(ref);
    px_err err;
    uint64_t id;
    /* Logprobs with five alternatives. */
    px_rt_request r = request(texts[0], ids[0], &o[0]);
    r.logprobs = true;
    r.top_logprobs = 5;
    r.on_token = check_logprobs;
    n_lp = 0;
    lp_ok = true;
    px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    /* The fourth token of the reference as a stop token: three come. */
    r = request(texts[1], ids[1], &o[1]);
    r.stop_tokens = &ref[1].tokens[3];
    r.n_stop_tokens = 1;
    px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    /* The caller stops after five. */
    r = request(texts[2], ids[2], &o[2]);
    o[2].stop_after = 5;
    px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    px_assert_ok(px_rt_engine_run(e, &err), &err);
    assert_int_equal(n_lp, N_NEW);
    assert_true(lp_ok);
    uint32_t first = 0;
    while (ref[1].tokens[first] != ref[1].tokens[3])
        first++;
    assert_int_equal(o[1].n, first);
    assert_int_equal(o[1].why, PX_RT_FINISH_STOP);
    assert_int_equal(o[2].n, 5);
    assert_int_equal(o[2].why, PX_RT_FINISH_STOP);
    px_rt_engine_free(e);
    px_rt_session_free(s);
}

static void test_bad_requests_are_refused_naming_the_field(void **state)
{
    (void)state;
    if (!model)
        skip();
    px_rt_session *s = session(1, 4, 0);
    px_rt_engine *e = engine(s, 0, 0);
    int32_t ids[MAX_ID];
    outcome o;
    uint64_t id;
    px_err err;
    px_rt_request r = request(texts[0], ids, &o);
    r.n_prompt = 0;
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_EINVAL);
    px_assert_contains(err.msg, "empty");
    r = request(texts[0], ids, &o);
    ids[1] = 100000;
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_EINVAL);
    px_assert_contains(err.msg, "prompt[1]");
    r = request(texts[0], ids, &o);
    int32_t many[200] = {1};
    r.prompt = many;
    r.n_prompt = 200;
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "the context holds 128");
    /* 40 positions need 5 blocks of 8; the cache has 4. */
    r.n_prompt = 40;
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "the cache has 4");
    r = request(texts[0], ids, &o);
    r.top_logprobs = 21;
    assert_int_equal(px_rt_engine_submit(e, &r, &id, &err), PX_EINVAL);
    px_assert_contains(err.msg, "top_logprobs");
    /* No new token asked: the prompt is prefilled and the request ends. */
    r = request(texts[0], ids, &o);
    r.max_new_tokens = 0;
    px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
    px_assert_ok(px_rt_engine_run(e, &err), &err);
    assert_int_equal(o.n, 0);
    assert_int_equal(o.why, PX_RT_FINISH_LENGTH);
    assert_int_equal(o.st.prompt_tokens, r.n_prompt);
    px_rt_engine_free(e);
    px_rt_session_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens_do_not_depend_on_company_or_chunking),
        cmocka_unit_test(test_preemption_when_the_cache_runs_out_keeps_the_tokens),
        cmocka_unit_test(test_cancel_ends_a_request_and_frees_its_blocks),
        cmocka_unit_test(test_queue_is_bounded),
        cmocka_unit_test(test_logprobs_stop_tokens_and_caller_stop),
        cmocka_unit_test(test_bad_requests_are_refused_naming_the_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
