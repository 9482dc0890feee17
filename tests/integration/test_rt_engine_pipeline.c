/* The generation engine through a pipeline of stage workers (a cpu stage
 * and an emulated one, real processes): requests arriving while others
 * decode come out bit for bit as in one process (tokens and their
 * log-probabilities), two steps travel the ring at once, requests that
 * do not fit the KV cache wait or are preempted, and a cancelled request
 * leaves the workers' caches.  On stories260K (skipped without
 * ../shared). */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define N_REQ  6
#define N_NEW  20
#define MAX_ID 64

typedef struct outcome {
    int32_t tokens[N_NEW];
    float logprob[N_NEW];
    uint32_t n;
    int finished;
    px_rt_finish why;
} outcome;

static const char *texts[N_REQ] = {"Once upon a time", "The cat sat",       "A big red ball",
                                   "Lily and Tom",     "One day, a little", "The sun was"};

static char *path;
static px_rt_model *model;
static px_rt_tokenizer *tok;

static int setup(void **state)
{
    (void)state;
    path = px_test_shared_model("stories260K.gguf");
    px_err err;
    if (!path || px_rt_model_open(path, &model, &err) != PX_OK) {
        free(path);
        path = NULL;
        return 0;
    }
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(px_rt_model_ir(model)), &tok, &err), &err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    px_rt_tokenizer_free(tok);
    px_rt_model_free(model);
    free(path);
    return 0;
}

static bool on_token(void *ud, const px_rt_token_event *ev)
{
    outcome *o = ud;
    if (o->n < N_NEW) {
        o->tokens[o->n] = ev->token;
        o->logprob[o->n] = ev->logprob;
    }
    o->n++;
    return true;
}

static void on_finish(void *ud, uint64_t id, px_rt_finish why, const px_rt_request_stats *st,
                      const px_err *err)
{
    (void)id;
    (void)st;
    (void)err;
    outcome *o = ud;
    o->finished++;
    o->why = why;
}

static px_rt_request request(int i, int32_t *ids, outcome *o)
{
    size_t n;
    px_err err;
    px_assert_ok(px_rt_tokenizer_encode(tok, texts[i], strlen(texts[i]), PX_RT_ENCODE_BOS, ids,
                                        MAX_ID, &n, &err),
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

/* Submits every request (half now, half after a few steps) and runs. */
static void run_all(px_rt_engine *e, outcome *o)
{
    int32_t ids[N_REQ][MAX_ID];
    px_err err;
    uint64_t id;
    for (int i = 0; i < N_REQ; i++) {
        px_rt_request r = request(i, ids[i], &o[i]);
        px_assert_ok(px_rt_engine_submit(e, &r, &id, &err), &err);
        if (i == N_REQ / 2 - 1)
            for (int k = 0; k < 6; k++)
                px_assert_ok(px_rt_engine_step(e, NULL, &err), &err);
    }
    px_assert_ok(px_rt_engine_run(e, &err), &err);
}

static void reference(outcome *ref)
{
    px_rt_session_opts so = {.n_threads = 1, .max_seqs = N_REQ, .context = 128};
    px_rt_session *s;
    px_err err;
    px_assert_ok(px_rt_session_new(model, &so, &s, &err), &err);
    px_rt_engine_opts eo = {.session = s, .tokenizer = tok};
    px_rt_engine *e;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    run_all(e, ref);
    px_rt_engine_free(e);
    px_rt_session_free(s);
}

static px_rt_executor *pipeline(uint32_t max_seqs, uint32_t kv_blocks, uint32_t micro_batches)
{
    uint32_t n_layers = px_rt_model_hparams(model)->n_layers;
    px_rt_pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_stages = 2;
    uint32_t cut[3] = {0, 2, n_layers};
    for (uint32_t i = 0; i < 2; i++) {
        px_rt_stage_spec *s = &spec.stages[i];
        s->layer_begin = cut[i];
        s->layer_end = cut[i + 1];
        s->embedding = i == 0;
        s->head = i == 1;
        snprintf(s->device, sizeof s->device, "local.%s", i ? "emu-a" : "cpu0");
        px_strlcpy(s->backend, i ? "emu" : "cpu", sizeof s->backend);
        s->emulated = i == 1;
        s->emu = (px_rt_emu_profile){.compute_slowdown = 2, .memory_slowdown = 2};
        px_strlcpy(s->emu.name, s->device, sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec.pred_tpot_s = spec.pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
    spec.micro_batches = micro_batches;
    px_rt_executor_opts xo = {.model_path = path,
                              .worker_bin = px_test_plexus_bin(),
                              .n_threads = 1,
                              .timeout_ms = 10000,
                              .max_seqs = max_seqs,
                              .context = 128,
                              .kv_blocks = kv_blocks,
                              .kv_block_size = 8};
    px_rt_executor *ex;
    px_err err;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &ex, &err), &err);
    return ex;
}

/* Counts steps in flight from the supervisor's view. */
typedef struct flight_watch {
    int in_flight, most;
    uint32_t most_rows; /* of a decode step */
} flight_watch;

static px_status before(void *ud, px_rt_executor *ex, const px_rt_step_obs *o, px_err *err)
{
    (void)ex;
    (void)err;
    flight_watch *w = ud;
    if (++w->in_flight > w->most)
        w->most = w->in_flight;
    if (!o->prefill && o->n_rows > w->most_rows)
        w->most_rows = o->n_rows;
    return PX_OK;
}

static px_status after(void *ud, px_rt_executor *ex, const px_rt_step_obs *o, px_rt_step_verdict *v,
                       px_err *err)
{
    (void)ex;
    (void)o;
    (void)v;
    (void)err;
    flight_watch *w = ud;
    w->in_flight--;
    return PX_OK;
}

static void expect_same(const outcome *a, const outcome *b)
{
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(a[i].n, N_NEW);
        assert_int_equal(b[i].n, N_NEW);
        assert_memory_equal(a[i].tokens, b[i].tokens, sizeof a[i].tokens);
        assert_memory_equal(a[i].logprob, b[i].logprob, sizeof a[i].logprob);
        assert_int_equal(b[i].finished, 1);
        assert_int_equal(b[i].why, PX_RT_FINISH_LENGTH);
    }
}

static void test_pipeline_matches_one_process_with_two_steps_in_flight(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome ref[N_REQ], got[N_REQ];
    reference(ref);
    px_rt_executor *ex = pipeline(N_REQ, 0, 0);
    flight_watch w = {0};
    px_rt_supervisor sup = {.before_step = before, .after_step = after, .ud = &w};
    px_rt_pipeline_stats st;
    px_rt_engine_opts eo = {.executor = ex, .tokenizer = tok, .supervisor = &sup, .stats = &st};
    px_rt_engine *e;
    px_err err;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    run_all(e, got);
    expect_same(ref, got);
    /* The two stages worked on two steps at once, each with its share. */
    assert_int_equal(w.most, 2);
    assert_true(w.most_rows <= (N_REQ + 1) / 2);
    assert_int_equal(w.in_flight, 0);
    assert_int_equal(st.gen.new_tokens, N_REQ * N_NEW);
    assert_true(st.stages[0].decode_steps > 0 && st.stages[1].decode_steps > 0);
    px_assert_ok(px_rt_engine_gather_stats(e, &err), &err);
    assert_true(st.stages[1].n_ops > 0);
    px_rt_engine_free(e);
    px_rt_pipeline_stats_release(&st);
    /* The workers' caches are empty again: a new engine runs there. */
    px_assert_ok(px_rt_engine_new(&(px_rt_engine_opts){.executor = ex, .tokenizer = tok}, &e, &err),
                 &err);
    run_all(e, got);
    expect_same(ref, got);
    px_rt_engine_free(e);
    px_rt_executor_free(ex);
}

/* A plan priced with one micro-batch through its two stages: the engine
 * keeps one step in flight, carrying every sequence, as priced. */
static void test_pipeline_runs_the_micro_batches_its_plan_priced(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome ref[N_REQ], got[N_REQ];
    reference(ref);
    px_rt_executor *ex = pipeline(N_REQ, 0, 1);
    flight_watch w = {0};
    px_rt_supervisor sup = {.before_step = before, .after_step = after, .ud = &w};
    px_rt_engine_opts eo = {.executor = ex, .tokenizer = tok, .supervisor = &sup};
    px_rt_engine *e;
    px_err err;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    run_all(e, got);
    expect_same(ref, got);
    assert_int_equal(w.most, 1);
    assert_int_equal(w.most_rows, N_REQ);
    px_rt_engine_free(e);
    /* The caller's micro_batches still come first. */
    w = (flight_watch){0};
    eo.micro_batches = 2;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    run_all(e, got);
    expect_same(ref, got);
    assert_int_equal(w.most, 2);
    px_rt_engine_free(e);
    px_rt_executor_free(ex);
}

static void test_pipeline_preempts_when_the_workers_caches_run_out(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome ref[N_REQ], got[N_REQ];
    reference(ref);
    /* 9 blocks of 8 positions per stage: about two sequences' worth. */
    px_rt_executor *ex = pipeline(N_REQ, 9, 0);
    px_rt_engine_opts eo = {.executor = ex, .tokenizer = tok};
    px_rt_engine *e;
    px_err err;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    run_all(e, got);
    expect_same(ref, got);
    px_rt_engine_metrics m;
    px_rt_engine_metrics_get(e, &m);
    assert_true(m.preemptions > 0);
    assert_int_equal(m.kv_blocks_used, 0);
    px_rt_engine_free(e);
    px_rt_executor_free(ex);
}

/* What the supervisor saw of each step, and the work it adds to the
 * engine's thread after each (a pause the engine must book as its own). */
typedef struct parts_watch {
    uint64_t steps, rows, compute_ns[2], wait_ns[2], hop_ns[3];
    /* The steps of decode rows only, by class of rows (2^c to 2^(c+1) - 1). */
    px_rt_engine_decode_timing by_rows[PX_RT_ENGINE_ROW_CLASSES];
} parts_watch;

#define PAUSE_NS 2000000ull

static px_status after_parts(void *ud, px_rt_executor *ex, const px_rt_step_obs *o,
                             px_rt_step_verdict *v, px_err *err)
{
    (void)ex;
    (void)v;
    (void)err;
    parts_watch *w = ud;
    if (o->replay)
        return PX_OK;
    w->steps++;
    w->rows += o->n_rows;
    for (uint32_t i = 0; i < 2; i++) {
        w->compute_ns[i] += o->compute_ns[i];
        w->wait_ns[i] += o->wait_ns[i];
        w->hop_ns[i] += o->xfer_in_ns[i];
    }
    w->hop_ns[2] += o->xfer_out_ns;
    if (!o->prefill) {
        uint32_t c = 0;
        while ((2u << c) <= o->n_rows)
            c++;
        px_rt_engine_decode_timing *d = &w->by_rows[c];
        d->steps++;
        d->rows += o->n_rows;
        for (uint32_t i = 0; i < o->n_seqs; i++)
            d->context += (uint64_t)o->pos[i] + o->n_tokens[i];
        for (uint32_t i = 0; i < 2; i++) {
            d->compute_ns[i] += o->compute_ns[i];
            d->wait_ns[i] += o->wait_ns[i];
            d->hop_ns[i] += o->xfer_in_ns[i];
        }
        d->hop_ns[2] += o->xfer_out_ns;
    }
    uint64_t t0 = px_now_ns();
    while (px_now_ns() - t0 < PAUSE_NS)
        ;
    return PX_OK;
}

/* The engine splits each step's time into its parts (the stages' compute
 * and hops as their records say, its own work between results, its wait
 * for them), so that a served step can be compared part by part with
 * its plan; and sums its decode steps by their rows, as a serving run's
 * report gives them. */
static void test_pipeline_splits_each_step_into_its_parts(void **state)
{
    (void)state;
    if (!model)
        skip();
    outcome got[N_REQ];
    px_rt_executor *ex = pipeline(N_REQ, 0, 2);
    parts_watch w = {0};
    px_rt_supervisor sup = {.after_step = after_parts, .ud = &w};
    px_rt_engine_opts eo = {.executor = ex, .tokenizer = tok, .supervisor = &sup};
    px_rt_engine *e;
    px_err err;
    px_assert_ok(px_rt_engine_new(&eo, &e, &err), &err);
    uint64_t t0 = px_now_ns();
    run_all(e, got);
    uint64_t wall = px_now_ns() - t0;
    px_rt_engine_metrics m;
    px_rt_engine_metrics_get(e, &m);
    assert_int_equal(m.n_stages, 2);
    assert_int_equal(m.timed_steps, w.steps);
    assert_int_equal(m.timed_steps, m.steps);
    assert_int_equal(m.timed_rows, w.rows);
    assert_int_equal(m.timed_rows, m.step_rows);
    assert_true(m.timed_context >= m.timed_rows);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(m.stage_compute_ns[i], w.compute_ns[i]);
        assert_int_equal(m.stage_wait_ns[i], w.wait_ns[i]);
        assert_true(m.stage_compute_ns[i] > 0);
    }
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(m.hop_ns[i], w.hop_ns[i]);
    /* The decode steps by their rows, for a serving run's report: the
     * requests' batches ran some, every one is in its class. */
    uint64_t decode_steps = 0;
    px_rt_engine_decode_timing by_rows[PX_RT_ENGINE_ROW_CLASSES];
    px_rt_engine_decode_timing_get(e, by_rows);
    for (uint32_t c = 0; c < PX_RT_ENGINE_ROW_CLASSES; c++) {
        assert_memory_equal(&by_rows[c], &w.by_rows[c], sizeof w.by_rows[c]);
        decode_steps += by_rows[c].steps;
        if (by_rows[c].steps)
            assert_true(by_rows[c].rows >= by_rows[c].steps << c);
    }
    assert_int_equal(decode_steps, m.decode_steps);
    assert_true(by_rows[1].steps + by_rows[2].steps > 0);
    /* The supervisor's pause after every step but the last of each busy
     * spell is the engine's own work, not its wait for results. */
    assert_true(m.host_ns >= (m.timed_steps - 2) * PAUSE_NS);
    assert_true(m.result_ns > 0);
    assert_true(m.host_ns + m.result_ns <= wall);
    assert_true(m.host_wait_ns <= m.host_ns && m.result_wait_ns <= m.result_ns);
    px_rt_engine_free(e);
    px_rt_executor_free(ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_matches_one_process_with_two_steps_in_flight),
        cmocka_unit_test(test_pipeline_runs_the_micro_batches_its_plan_priced),
        cmocka_unit_test(test_pipeline_preempts_when_the_workers_caches_run_out),
        cmocka_unit_test(test_pipeline_splits_each_step_into_its_parts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
