/* Supervised generation through the pipeline on the real tiny model: a
 * stage killed mid-generation is recovered onto an executor of another
 * plan and the text comes out bit for bit as without the fault, each
 * token emitted once (one prompt greedy, three prompts sampled); a switch
 * to another executor and a rollback of the last steps give the same
 * text; without a recovery the error names the stage, a recovery that
 * fails gives its own error, and a replacement that does not fit is
 * refused; a switch asked for while a step is in flight gives way to
 * the recovery when that step fails first; audited steps carry every
 * stage's output row, and a
 * supervisor that only watches changes nothing.  Step indices only grow
 * (steps that rebuild the KV caches on a new executor get indices of
 * their own), before_step sees each step before it is sent and
 * after_step after its tokens, in the order sent; with several prompts
 * two steps may be in flight at once.  The time from the kill to the
 * first new token is printed. */
#include "px_test.h"

#include "px_slowdown.h"

#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define MAX_PROMPTS 3
#define MAX_TOKENS  256
#define N_NEW       32

typedef struct collected {
    int32_t tokens[MAX_PROMPTS][MAX_TOKENS];
    uint32_t n[MAX_PROMPTS];
    uint32_t emitted; /* on_token calls */
} collected;

/* What a test's supervisor does, and what it saw. */
typedef struct watch {
    const char *model;
    collected *out;
    /* Recovery and switching go to an executor of this plan. */
    px_rt_pipeline_spec next_spec;
    uint32_t max_seqs;
    bool recover_fails;  /* recover returns an error of its own */
    bool recover_small;  /* recover hands over too few sequence slots */
    uint64_t kill_at;    /* kill stage 1 before the step after this many tokens */
    uint64_t switch_at;  /* switch after this step (UINT64_MAX: never) */
    uint64_t drop_steps; /* with the switch: take back this many steps */
    uint64_t audit_at;   /* ask to audit the step after this one */
    /* Seen. */
    bool killed, recovered;
    px_status failed_with;
    uint64_t t_kill_ns, t_recover_ns, t_started_ns, t_first_after_ns;
    uint32_t n_switched, n_retracted;
    uint32_t retracted_kept[MAX_PROMPTS];
    px_rt_rebuild_info info;
    px_rt_executor *left; /* handed back by switched */
    px_rt_executor *made; /* made by the supervisor */
    uint64_t next_before, next_after, n_after, n_replayed_after;
    uint64_t audit_asked_at; /* index of the step after which an audit was asked */
    /* Crash stage 1 at its next step while a step is in flight, then
     * ask to switch once that step's result came, so that the step sent
     * after the crash fails with the switch still to be made. */
    bool switch_then_kill;
    uint64_t kill_before;     /* steps below this index were sent before the kill; 0: none */
    px_rt_executor *pending;  /* the switch asked for and not made */
    px_rt_executor *dropped;  /* the one pending when a step failed */
    px_rt_executor *mine[16]; /* every executor the supervisor made */
    uint32_t n_mine, attempts;
    bool switched_to_dropped;
    uint32_t n_audited;
    bool order_ok, audited_ok, audit_seen;
    uint32_t dim, vocab;
} watch;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    watch *w = ud;
    collected *c = w->out;
    c->emitted++;
    if (prompt < MAX_PROMPTS && c->n[prompt] < MAX_TOKENS)
        c->tokens[prompt][c->n[prompt]++] = token;
    if (w->killed && !w->t_first_after_ns)
        w->t_first_after_ns = px_now_ns();
}

static px_rt_tokenizer *tokenizer_of(const char *path, uint32_t *n_layers, watch *w)
{
    px_ir_model *ir;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &ir, &err), &err);
    if (n_layers)
        *n_layers = px_ir_model_hparams(ir)->n_layers;
    if (w) {
        w->dim = px_ir_model_hparams(ir)->dim;
        w->vocab = px_ir_model_hparams(ir)->vocab_size;
    }
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, &err), &err);
    px_ir_model_free(ir);
    return t;
}

/* A plan over the given cuts; backends alternate cpu, emu. */
static void make_spec(uint32_t n_stages, const uint32_t *cut, px_rt_pipeline_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_stages = n_stages;
    for (uint32_t i = 0; i < n_stages; i++) {
        px_rt_stage_spec *s = &spec->stages[i];
        s->layer_begin = cut[i];
        s->layer_end = cut[i + 1];
        s->embedding = i == 0;
        s->head = i == n_stages - 1;
        bool emu = i % 2 == 1;
        snprintf(s->device, sizeof s->device, "local.%s%u", emu ? "emu" : "cpu", i);
        px_strlcpy(s->backend, emu ? "emu" : "cpu", sizeof s->backend);
        s->emulated = emu;
        s->emu = (px_rt_emu_profile){
            .compute_slowdown = 1.5, .memory_slowdown = 1.2, .jitter = 0.1, .seed = i};
        px_strlcpy(s->emu.name, s->device, sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

static px_rt_executor *start(const char *model, const px_rt_pipeline_spec *spec, uint32_t max_seqs)
{
    px_rt_executor_opts xo = {.model_path = model,
                              .worker_bin = px_test_plexus_bin(),
                              .n_threads = 1,
                              .timeout_ms = 5000 * PX_TEST_SLOWDOWN,
                              .max_seqs = max_seqs};
    px_rt_executor *ex;
    px_err err;
    px_assert_ok(px_rt_executor_new(spec, &xo, &ex, &err), &err);
    return ex;
}

static px_status before_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *next, px_err *err)
{
    (void)err;
    watch *w = ud;
    if (next->index < w->next_before || next->replay || next->logits)
        w->order_ok = false;
    w->next_before = next->index + 1;
    if (w->switch_then_kill && !w->dropped && !w->kill_before && !w->pending && w->attempts < 6 &&
        next->tokens_out >= 6 && next->index > w->next_after) {
        /* The crash travels the ring behind the step in flight and
         * returns once it went round: that step comes back whole, and
         * stage 1 aborts at the next one, sent after it. */
        w->attempts++;
        w->kill_before = next->index;
        w->killed = true;
        px_err ferr;
        px_assert_ok(
            px_rt_executor_inject(ex, &(px_rt_fault){.kind = PX_RT_FAULT_CRASH, .stage = 1}, &ferr),
            &ferr);
    }
    if (!w->killed && w->kill_at && next->tokens_out >= w->kill_at) {
        w->killed = true;
        w->t_kill_ns = px_now_ns();
        kill(px_rt_executor_stage_pid(ex, 1), SIGKILL);
    }
    return PX_OK;
}

static px_status after_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                            px_rt_step_verdict *v, px_err *err)
{
    (void)err;
    watch *w = ud;
    w->n_after++;
    if (obs->index < w->next_after)
        w->order_ok = false;
    w->next_after = obs->index + 1;
    if (obs->replay) {
        w->n_replayed_after++;
        if (!w->made && !w->n_mine) /* replays happen on a new executor only */
            w->order_ok = false;
        return PX_OK;
    }
    if (!obs->logits || obs->vocab != w->vocab || obs->n_seqs == 0 || obs->n_rows < obs->n_seqs)
        w->order_ok = false;
    for (uint32_t i = 0; i < obs->n_stages; i++)
        if (obs->compute_ns[i] == 0)
            w->order_ok = false;
    /* Audit: one step sent after the verdict carries the blocks (a step
     * already in flight then does not). */
    bool audited = obs->audit[0] != NULL;
    if (audited) {
        w->n_audited++;
        if (w->audit_asked_at == UINT64_MAX || obs->index <= w->audit_asked_at)
            w->audited_ok = false;
        w->audit_seen = true;
        for (uint32_t i = 0; i < obs->n_stages; i++) {
            uint32_t len = i + 1 == obs->n_stages ? w->vocab : w->dim;
            if (!obs->audit[i] || obs->audit_len[i] != len)
                w->audited_ok = false;
        }
        /* The last stage's row is the step's first logits row. */
        uint32_t last = obs->n_stages - 1;
        if (obs->audit[last] &&
            memcmp(obs->audit[last], obs->logits, (size_t)w->vocab * sizeof(float)) != 0)
            w->audited_ok = false;
    } else {
        for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++)
            if (obs->audit[i])
                w->audited_ok = false;
    }
    if (obs->index == w->audit_at) {
        v->audit_next = true;
        w->audit_asked_at = obs->index;
    }
    /* A step sent before the kill came back: the switch asked for now
     * waits for the step sent after it, which cannot come back. */
    if (w->switch_then_kill && w->kill_before && obs->index < w->kill_before && !w->pending) {
        w->pending = start(w->model, &w->next_spec, w->max_seqs);
        w->mine[w->n_mine++] = w->pending;
        v->switch_to = w->pending;
    }
    if (obs->index == w->switch_at && !w->made) {
        w->made = start(w->model, &w->next_spec, w->max_seqs);
        v->switch_to = w->made;
        if (w->drop_steps)
            v->keep_steps = obs->index + 1 - w->drop_steps;
    }
    (void)ex;
    return PX_OK;
}

static px_status recover(void *ud, px_rt_executor *failed, px_status st, const px_err *why,
                         px_rt_executor **replacement, px_err *err)
{
    (void)failed;
    watch *w = ud;
    w->failed_with = st;
    assert_non_null(why);
    px_assert_contains(why->msg, "stage 1");
    if (w->recover_fails)
        return px_err_set(err, PX_EINFEASIBLE, "no spare device for stage 1");
    w->recovered = true;
    w->t_recover_ns = px_now_ns();
    w->made = start(w->model, &w->next_spec, w->recover_small ? 1 : w->max_seqs);
    w->t_started_ns = px_now_ns();
    if (w->switch_then_kill) {
        w->mine[w->n_mine++] = w->made;
        w->dropped = w->pending; /* NULL: the step in flight failed; try again */
        w->pending = NULL;
        w->kill_before = 0;
    }
    *replacement = w->made;
    return PX_OK;
}

static void switched(void *ud, px_rt_executor *before, px_rt_executor *now,
                     const px_rt_rebuild_info *info)
{
    watch *w = ud;
    w->n_switched++;
    w->left = before;
    w->info = *info;
    if (w->switch_then_kill) {
        if (now == w->dropped)
            w->switched_to_dropped = true;
        return;
    }
    assert_ptr_equal(now, w->made);
}

static void retracted(void *ud, uint32_t prompt, uint32_t kept)
{
    watch *w = ud;
    w->n_retracted++;
    assert_true(prompt < MAX_PROMPTS);
    assert_true(kept <= w->out->n[prompt]);
    w->retracted_kept[prompt] = kept;
    w->out->n[prompt] = kept;
}

static const char *prompts[MAX_PROMPTS] = {"Once upon a time", "The cat sat", "A big red ball"};

static px_rt_generate_opts gen_opts(uint32_t n, float temp, watch *w)
{
    return (px_rt_generate_opts){.prompts = prompts,
                                 .n_prompts = n,
                                 .max_new_tokens = N_NEW,
                                 .sampling = {.temperature = temp, .top_p = 0.9f, .seed = 3},
                                 .on_token = on_token,
                                 .ud = w};
}

/* The fault-free text: one process (the pipeline matches it bit for
 * bit, as test_rt_pipeline shows). */
static void run_single(const char *path, uint32_t n, float temp, collected *out)
{
    px_err err;
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    px_rt_tokenizer *t = tokenizer_of(path, NULL, NULL);
    px_rt_session_opts so = {.n_threads = 1, .max_seqs = n};
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    memset(out, 0, sizeof *out);
    watch w = {.out = out};
    px_rt_generate_opts go = gen_opts(n, temp, &w);
    px_assert_ok(px_rt_generate(s, t, &go, NULL, &err), &err);
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
}

static void expect_same(const collected *a, const collected *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(a->n[i], b->n[i]);
        assert_memory_equal(a->tokens[i], b->tokens[i], a->n[i] * sizeof(int32_t));
    }
}

static uint32_t total(const collected *c, uint32_t n)
{
    uint32_t s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += c->n[i];
    return s;
}

static void setup_watch(const char *model, uint32_t n_layers, uint32_t next_stages,
                        uint32_t n_prompts, watch *w, collected *out)
{
    memset(w, 0, sizeof *w);
    memset(out, 0, sizeof *out);
    w->model = model;
    w->out = out;
    w->max_seqs = n_prompts;
    w->switch_at = w->audit_at = w->audit_asked_at = UINT64_MAX;
    w->order_ok = w->audited_ok = true;
    uint32_t one[] = {0, n_layers};
    uint32_t two[] = {0, n_layers - 1, n_layers};
    make_spec(next_stages, next_stages == 1 ? one : two, &w->next_spec);
}

static px_rt_supervisor supervisor_of(watch *w, bool with_recover)
{
    return (px_rt_supervisor){.before_step = before_step,
                              .after_step = after_step,
                              .recover = with_recover ? recover : NULL,
                              .switched = switched,
                              .retracted = retracted,
                              .ud = w};
}

/* Runs a generation on a fresh 2-stage pipeline under w's supervisor. */
static px_status supervised(const char *model, uint32_t n_layers, uint32_t n_prompts, float temp,
                            watch *w, bool with_recover, px_rt_pipeline_stats *st, px_err *err)
{
    uint32_t cut[] = {0, 2, n_layers};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_rt_executor *ex = start(model, &spec, n_prompts);
    px_rt_tokenizer *t = tokenizer_of(model, NULL, w);
    px_rt_supervisor sup = supervisor_of(w, with_recover);
    px_rt_generate_opts go = gen_opts(n_prompts, temp, w);
    go.supervisor = &sup;
    px_status s = px_rt_executor_generate(ex, t, &go, st, err);
    if (w->left)
        assert_ptr_equal(w->left, ex);
    px_rt_executor_free(ex);
    px_rt_executor_free(w->made);
    w->made = NULL;
    px_rt_tokenizer_free(t);
    return s;
}

static void check_recovery(uint32_t n_prompts, float temp, uint32_t next_stages)
{
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected base, got;
    run_single(model, n_prompts, temp, &base);
    assert_true(total(&base, n_prompts) > 20);
    watch w;
    setup_watch(model, n_layers, next_stages, n_prompts, &w, &got);
    w.kill_at = 20;
    px_rt_pipeline_stats st;
    px_err err;
    px_assert_ok(supervised(model, n_layers, n_prompts, temp, &w, true, &st, &err), &err);
    assert_true(w.killed);
    assert_true(w.recovered);
    assert_int_equal(w.failed_with, PX_EPEER);
    assert_int_equal(w.n_switched, 1);
    assert_true(w.info.identical);
    assert_true(w.info.steps_replayed > 0);
    assert_int_equal(w.info.steps_replayed, w.n_replayed_after);
    assert_true(w.info.tokens_replayed >= w.info.steps_replayed);
    assert_int_equal(w.info.steps_dropped, 0);
    assert_true(w.order_ok);
    expect_same(&got, &base, n_prompts);
    /* Every token was emitted exactly once and counted once. */
    assert_int_equal(got.emitted, total(&base, n_prompts));
    assert_int_equal(st.gen.new_tokens, total(&base, n_prompts));
    /* The stats describe the new executor's stages. */
    assert_int_equal(st.n_stages, next_stages);
    for (uint32_t i = 0; i < next_stages; i++)
        assert_true(st.stages[i].n_ops > 0);
    printf("recovery of stage 1 (%u prompt%s, temperature %.1f) onto %u stage%s: %.1f ms from "
           "the kill to the first new token: failure found in %.1f ms, new executor started "
           "in %.1f ms, rebuild %.1f ms (%llu steps replayed)\n",
           n_prompts, n_prompts > 1 ? "s" : "", (double)temp, next_stages,
           next_stages > 1 ? "s" : "", (double)(w.t_first_after_ns - w.t_kill_ns) / 1e6,
           (double)(w.t_recover_ns - w.t_kill_ns) / 1e6,
           (double)(w.t_started_ns - w.t_recover_ns) / 1e6, (double)w.info.ns / 1e6,
           (unsigned long long)w.info.steps_replayed);
    fflush(stdout);
    px_rt_pipeline_stats_release(&st);
    free(model);
}

static void test_killed_stage_is_recovered_bit_for_bit(void **state)
{
    (void)state;
    check_recovery(1, 0.0f, 1);
}

static void test_recovery_with_three_sampled_prompts_is_bit_for_bit(void **state)
{
    (void)state;
    check_recovery(3, 0.8f, 2);
}

static void check_switch(uint64_t drop)
{
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected base, got;
    run_single(model, 2, 0.8f, &base);
    watch w;
    setup_watch(model, n_layers, 1, 2, &w, &got);
    w.switch_at = 15;
    w.drop_steps = drop;
    px_rt_pipeline_stats st;
    px_err err;
    px_assert_ok(supervised(model, n_layers, 2, 0.8f, &w, false, &st, &err), &err);
    assert_int_equal(w.n_switched, 1);
    assert_true(w.info.identical);
    /* The KV caches are prefilled again on the new executor: a step or a
     * few carry every position the sequences had. */
    assert_true(w.info.steps_replayed >= 1);
    assert_int_equal(w.info.steps_replayed, w.n_replayed_after);
    assert_true(w.info.tokens_replayed > w.info.steps_replayed);
    /* Steps sent before the verdict came are taken back too. */
    assert_true(w.info.steps_dropped >= drop && w.info.steps_dropped <= drop + 1);
    assert_true(w.order_ok);
    expect_same(&got, &base, 2);
    assert_int_equal(st.gen.new_tokens, total(&base, 2));
    assert_int_equal(st.n_stages, 1);
    if (drop) {
        /* Both prompts decode together: each lost its last tokens, which
         * came again through on_token. */
        assert_int_equal(w.n_retracted, 2);
        assert_true(w.info.tokens_dropped > 0);
        assert_int_equal(got.emitted, total(&base, 2) + w.info.tokens_dropped);
    } else {
        assert_int_equal(w.n_retracted, 0);
        assert_int_equal(got.emitted, total(&base, 2));
    }
    px_rt_pipeline_stats_release(&st);
    free(model);
}

static void test_switch_mid_run_keeps_the_text(void **state)
{
    (void)state;
    check_switch(0);
}

static void test_rollback_retracts_and_generates_again(void **state)
{
    (void)state;
    check_switch(5);
}

/* A switch is asked for while a step sent after stage 1's crash was
 * injected is in flight: that step fails before the switch is made, the supervisor
 * recovers, and the generation goes on on the replacement, never on the
 * executor asked for before the failure (which the supervisor still
 * owns: it may hold the lost device too).  The order is forced by the
 * steps' indices, not by timing. */
static void test_switch_asked_before_a_failure_gives_way_to_the_recovery(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected base, got;
    run_single(model, 3, 0.8f, &base);
    watch w;
    setup_watch(model, n_layers, 2, 3, &w, &got);
    w.switch_then_kill = true;
    uint32_t cut[] = {0, 2, n_layers};
    px_rt_pipeline_spec spec;
    make_spec(2, cut, &spec);
    px_rt_executor *ex = start(model, &spec, 3);
    px_rt_tokenizer *t = tokenizer_of(model, NULL, &w);
    px_rt_supervisor sup = supervisor_of(&w, true);
    px_rt_generate_opts go = gen_opts(3, 0.8f, &w);
    go.supervisor = &sup;
    px_err err;
    px_assert_ok(px_rt_executor_generate(ex, t, &go, NULL, &err), &err);
    if (!w.dropped)
        fail_msg("in %u tries, no step failed with a switch asked for", w.attempts);
    assert_int_equal(w.attempts, 1);
    assert_true(w.recovered);
    assert_false(w.switched_to_dropped);
    assert_true(w.order_ok);
    expect_same(&got, &base, 3);
    assert_int_equal(got.emitted, total(&base, 3));
    px_rt_executor_free(ex);
    for (uint32_t i = 0; i < w.n_mine; i++)
        px_rt_executor_free(w.mine[i]);
    px_rt_tokenizer_free(t);
    free(model);
}

static void test_without_recover_the_error_names_the_stage(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected got;
    watch w;
    setup_watch(model, n_layers, 1, 1, &w, &got);
    w.kill_at = 5;
    px_err err;
    assert_int_equal(supervised(model, n_layers, 1, 0.0f, &w, false, NULL, &err), PX_EPEER);
    px_assert_contains(err.msg, "stage 1");
    px_assert_contains(err.msg, "killed by signal 9");
    assert_int_equal(w.n_switched, 0);
    free(model);
}

static void test_failed_recovery_gives_its_error(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected got;
    watch w;
    setup_watch(model, n_layers, 1, 1, &w, &got);
    w.kill_at = 5;
    w.recover_fails = true;
    px_err err;
    assert_int_equal(supervised(model, n_layers, 1, 0.0f, &w, true, NULL, &err), PX_EINFEASIBLE);
    px_assert_contains(err.msg, "no spare device for stage 1");
    assert_int_equal(w.failed_with, PX_EPEER);
    assert_int_equal(w.n_switched, 0);
    free(model);
}

/* A supervisor that watches and asks for one audit: the text, the
 * steps and the counts are those of an unsupervised run, and only the
 * audited step carries every stage's output row. */
static void test_replacement_that_does_not_fit_is_refused(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected got;
    watch w;
    setup_watch(model, n_layers, 1, 2, &w, &got);
    w.kill_at = 5;
    w.recover_small = true;
    px_err err;
    assert_int_equal(supervised(model, n_layers, 2, 0.0f, &w, true, NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "with 1 sequences");
    px_assert_contains(err.msg, "give it the same model and limits");
    assert_int_equal(w.n_switched, 0);
    free(model);
}

static void test_audited_step_carries_every_stage_row(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    uint32_t n_layers;
    px_rt_tokenizer_free(tokenizer_of(model, &n_layers, NULL));
    collected base, got;
    run_single(model, 3, 0.8f, &base);
    watch w;
    setup_watch(model, n_layers, 1, 3, &w, &got);
    w.audit_at = 8;
    px_rt_pipeline_stats st;
    px_err err;
    px_assert_ok(supervised(model, n_layers, 3, 0.8f, &w, true, &st, &err), &err);
    assert_true(w.audit_seen);
    assert_int_equal(w.n_audited, 1);
    assert_true(w.audited_ok);
    assert_true(w.order_ok);
    assert_int_equal(w.n_switched, 0);
    assert_int_equal(w.n_replayed_after, 0);
    assert_int_equal(w.n_after, w.next_after);
    assert_int_equal(st.decode_steps + st.stages[0].prefill_steps, w.n_after);
    expect_same(&got, &base, 3);
    assert_int_equal(got.emitted, total(&base, 3));
    assert_int_equal(st.gen.new_tokens, total(&base, 3));
    px_rt_pipeline_stats_release(&st);
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_stage_is_recovered_bit_for_bit),
        cmocka_unit_test(test_recovery_with_three_sampled_prompts_is_bit_for_bit),
        cmocka_unit_test(test_switch_mid_run_keeps_the_text),
        cmocka_unit_test(test_rollback_retracts_and_generates_again),
        cmocka_unit_test(test_switch_asked_before_a_failure_gives_way_to_the_recovery),
        cmocka_unit_test(test_without_recover_the_error_names_the_stage),
        cmocka_unit_test(test_failed_recovery_gives_its_error),
        cmocka_unit_test(test_replacement_that_does_not_fit_is_refused),
        cmocka_unit_test(test_audited_step_carries_every_stage_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
