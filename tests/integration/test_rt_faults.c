/* Fault injection into real pipelines of stories260K (cpu and emu
 * stages): every fault kind has the effect it names (link latency shows
 * in the hop's transfer time and not in compute, a slowdown multiplies a
 * stage's compute, corruption changes the output, memory taken shows as
 * less free memory, a crash or a kill is blamed on its stage within
 * milliseconds, a stopped stage is found by the step deadline), CLEAR
 * undoes them, and bad faults are refused naming the field.  Audited
 * steps carry every stage's first output row. */
#include "px_test.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#define N_NEW 16

typedef struct collected {
    int32_t tokens[N_NEW + 4];
    uint32_t n;
    /* After `after` tokens, inject `fault` (kind KILL or STOP). */
    px_rt_executor *ex;
    px_rt_fault fault;
    uint32_t after;
    bool armed;
    uint64_t t_fault;
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    collected *c = ud;
    if (prompt == 0 && c->n < N_NEW + 4)
        c->tokens[c->n++] = token;
    if (c->armed && c->n == c->after) {
        c->armed = false;
        c->t_fault = px_now_ns();
        px_err err;
        px_assert_ok(px_rt_executor_inject(c->ex, &c->fault, &err), &err);
    }
}

static px_rt_tokenizer *tokenizer_of(const char *path)
{
    px_ir_model *ir;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &ir, &err), &err);
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, &err), &err);
    px_ir_model_free(ir);
    return t;
}

/* Stage i holds blocks [cut[i], cut[i+1]); even stages cpu, odd ones emu
 * (64 MiB, no jitter). */
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
            .compute_slowdown = 1.5, .memory_slowdown = 1.2, .memory_bytes = 64u << 20};
        px_strlcpy(s->emu.name, s->device, sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

typedef struct rig {
    char *path;
    px_rt_tokenizer *t;
    px_rt_executor *ex;
} rig;

static bool rig_open(rig *r, uint32_t n_stages, const uint32_t *cut, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->path = px_test_require_shared_model("stories260K.gguf");
    if (!r->path)
        return false;
    px_rt_pipeline_spec spec;
    make_spec(n_stages, cut, &spec);
    px_rt_executor_opts xo = {.model_path = r->path,
                              .worker_bin = px_test_plexus_bin(),
                              .n_threads = 1,
                              .timeout_ms = timeout_ms,
                              .max_seqs = 1};
    px_err err;
    px_assert_ok(px_rt_executor_new(&spec, &xo, &r->ex, &err), &err);
    r->t = tokenizer_of(r->path);
    return true;
}

static void rig_close(rig *r)
{
    px_rt_executor_free(r->ex);
    px_rt_tokenizer_free(r->t);
    free(r->path);
}

/* Asks for an audit of the third step and keeps what it shows. */
typedef struct auditor {
    bool seen;
    uint32_t len[2];
    float first[64]; /* stage 0's row */
    bool last_is_logits;
} auditor;

static px_status audit_after(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                             px_rt_step_verdict *v, px_err *err)
{
    (void)ex;
    (void)err;
    auditor *a = ud;
    if (obs->index == 1)
        v->audit_next = true;
    if (obs->audit[0] && obs->n_stages == 2) {
        a->seen = true;
        a->len[0] = obs->audit_len[0];
        a->len[1] = obs->audit_len[1];
        memcpy(a->first, obs->audit[0], sizeof a->first);
        a->last_is_logits = obs->audit[1] && obs->audit_len[1] == obs->vocab &&
                            !memcmp(obs->audit[1], obs->logits, (size_t)obs->vocab * sizeof(float));
    }
    return PX_OK;
}

static px_status generate_audited(rig *r, collected *c, auditor *a, px_err *err)
{
    const char *prompt = "Once upon a time";
    px_rt_supervisor sv = {.after_step = audit_after, .ud = a};
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = N_NEW,
                              .ignore_eos = true,
                              .on_token = on_token,
                              .ud = c,
                              .supervisor = &sv};
    c->n = 0;
    memset(a, 0, sizeof *a);
    return px_rt_executor_generate(r->ex, r->t, &go, NULL, err);
}

static px_status generate(rig *r, collected *c, px_rt_pipeline_stats *st, px_err *err)
{
    const char *prompt = "Once upon a time";
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = N_NEW,
                              .ignore_eos = true,
                              .on_token = on_token,
                              .ud = c};
    c->n = 0;
    return px_rt_executor_generate(r->ex, r->t, &go, st, err);
}

static void inject_ok(rig *r, px_rt_fault f)
{
    px_err err;
    px_assert_ok(px_rt_executor_inject(r->ex, &f, &err), &err);
}

static double ms_of(uint64_t ns)
{
    return (double)ns / 1e6;
}

static void expect_refused(px_rt_executor *ex, px_rt_fault f, const char *field)
{
    px_err err;
    assert_int_equal(px_rt_executor_inject(ex, &f, &err), PX_EINVAL);
    px_assert_contains(err.msg, field);
}

/* Bad faults are refused naming the field; the pipeline is unharmed. */
static void check_refusals(rig *r)
{
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_CLEAR, .stage = 2}, "stage 2");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_SLOW, .factor = 0.5}, "factor");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_SLOW, .factor = INFINITY}, "factor");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_SLOW, .factor = 2, .tau_s = -1},
                   "tau_s");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_CORRUPT, .magnitude = NAN},
                   "magnitude");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_CORRUPT, .magnitude = 0}, "magnitude");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_LINK, .link.bandwidth_bps = -1},
                   "link.bandwidth_bps");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_LINK, .link.period_s = 1}, "link.duty");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_LINK, .link.loss = 1.5}, "link.loss");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_LINK, .link.flip = NAN}, "link.flip");
    expect_refused(r->ex, (px_rt_fault){.kind = PX_RT_FAULT_MEMORY}, "bytes");
    expect_refused(r->ex, (px_rt_fault){.kind = (px_rt_fault_kind)42}, "kind 42");
    assert_string_equal(px_rt_fault_kind_name(PX_RT_FAULT_CORRUPT), "corrupt");
    assert_string_equal(px_rt_fault_kind_name(PX_RT_FAULT_STOP), "stop");
}

static void test_each_fault_has_its_effect_and_clear_restores(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 3, 5};
    rig r;
    if (!rig_open(&r, 2, cut, 5000))
        return;
    px_err err;
    collected clean = {0}, c = {0};
    px_rt_pipeline_stats base, st;
    px_assert_ok(generate(&r, &clean, &base, &err), &err);
    assert_int_equal(clean.n, N_NEW);
    uint64_t steps = base.stages[1].decode_steps;
    assert_true(steps >= N_NEW - 2);

    /* 20 ms on the link from stage 0 to stage 1: the hop into stage 1
     * takes it every step, its compute does not. */
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_LINK, .stage = 0, .link.latency_ns = 20000000});
    px_assert_ok(generate(&r, &c, &st, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);
    double faulted = ms_of(st.stages[1].xfer_in_decode_ns);
    double added = faulted - ms_of(base.stages[1].xfer_in_decode_ns);
    print_message("link latency 20 ms: the hop into stage 1 took %.1f ms more over %" PRIu64
                  " decode steps; stage 1 compute %.1f ms (clean %.1f ms)\n",
                  added, steps, ms_of(st.stages[1].decode_ns), ms_of(base.stages[1].decode_ns));
    assert_true(faulted >= 15.0 * (double)steps && added > 0);
    assert_true(ms_of(st.stages[1].decode_ns) < ms_of(base.stages[1].decode_ns) + 150);
    px_rt_pipeline_stats_release(&st);
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_CLEAR, .stage = 0});
    px_assert_ok(generate(&r, &c, &st, &err), &err);
    assert_true(ms_of(st.stages[1].xfer_in_decode_ns) < faulted - 10.0 * (double)steps);
    px_rt_pipeline_stats_release(&st);

    /* Stage 1 twenty times slower at once: far beyond what a loaded
     * machine's noise does to either run's compute times. */
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_SLOW, .stage = 1, .factor = 20, .tau_s = 0});
    px_assert_ok(generate(&r, &c, &st, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);
    double ratio = (double)st.stages[1].decode_ns / (double)base.stages[1].decode_ns;
    double ratio0 = (double)st.stages[0].decode_ns / (double)base.stages[0].decode_ns;
    print_message("slow x20: stage 1 decode compute x%.2f, stage 0 x%.2f\n", ratio, ratio0);
    assert_true(ratio >= 4);
    assert_true(ratio0 < ratio / 2);
    px_rt_pipeline_stats_release(&st);
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_CLEAR, .stage = 1});

    /* An audited step carries each stage's first output row: stage 0's
     * hidden state (dim values), stage 1's logits. */
    auditor clean_audit, bad_audit;
    px_assert_ok(generate_audited(&r, &c, &clean_audit, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);
    assert_true(clean_audit.seen);
    assert_int_equal(clean_audit.len[0], 64);
    assert_int_equal(clean_audit.len[1], 512);
    assert_true(clean_audit.last_is_logits);

    /* Silent corruption of every op of stage 0 changes the text and
     * shows in its audit row; cleared, the output is the clean one
     * again. */
    inject_ok(
        &r, (px_rt_fault){
                .kind = PX_RT_FAULT_CORRUPT, .stage = 0, .layer = -1, .magnitude = 20, .seed = 3});
    px_assert_ok(generate_audited(&r, &c, &bad_audit, &err), &err);
    assert_int_equal(c.n, N_NEW);
    assert_true(memcmp(c.tokens, clean.tokens, sizeof c.tokens) != 0);
    assert_true(bad_audit.seen);
    assert_true(memcmp(bad_audit.first, clean_audit.first, sizeof bad_audit.first) != 0);
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_CLEAR, .stage = 0});
    px_assert_ok(generate(&r, &c, NULL, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);

    /* Memory taken from the emu device shows in its description. */
    uint64_t free0 = px_rt_executor_stage_device(r.ex, 1)->memory_free;
    assert_true(free0 > (16u << 20));
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_MEMORY, .stage = 1, .bytes = 8u << 20});
    assert_int_equal(px_rt_executor_stage_device(r.ex, 1)->memory_free, free0 - (8u << 20));
    px_assert_ok(generate(&r, &c, NULL, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_CLEAR, .stage = 1});
    assert_int_equal(px_rt_executor_stage_device(r.ex, 1)->memory_free, free0);
    assert_int_equal(px_rt_executor_stage_health(r.ex, 1, NULL, 0), PX_RT_STAGE_RUNNING);
    assert_int_equal(px_rt_executor_culprit(r.ex), -1);
    px_rt_pipeline_stats_release(&base);

    check_refusals(&r);
    px_assert_ok(generate(&r, &c, NULL, &err), &err);
    assert_memory_equal(c.tokens, clean.tokens, sizeof c.tokens);

    /* More than the device holds: the stage fails naming both. */
    px_rt_fault big = {.kind = PX_RT_FAULT_MEMORY, .stage = 1, .bytes = 1u << 30};
    assert_int_not_equal(px_rt_executor_inject(r.ex, &big, &err), PX_OK);
    px_assert_contains(err.msg, "local.emu1");
    px_assert_contains(err.msg, "1073741824");
    assert_int_equal(px_rt_executor_inject(r.ex, &big, &err), PX_ESTATE);
    rig_close(&r);
}

static void test_crash_is_blamed_on_the_stage_that_aborted(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 3, 5};
    rig r;
    if (!rig_open(&r, 2, cut, 5000))
        return;
    inject_ok(&r, (px_rt_fault){.kind = PX_RT_FAULT_CRASH, .stage = 0});
    collected c = {0};
    px_err err;
    assert_int_not_equal(generate(&r, &c, NULL, &err), PX_OK);
    px_assert_contains(err.msg, "stage 0 (local.cpu0");
    px_assert_contains(err.msg, "signal 6");
    assert_int_equal(px_rt_executor_culprit(r.ex), 0);
    char detail[128];
    assert_int_equal(px_rt_executor_stage_health(r.ex, 0, detail, sizeof detail),
                     PX_RT_STAGE_KILLED);
    px_assert_contains(detail, "signal 6");
    rig_close(&r);
}

/* Kills stage `victim` after 4 tokens and returns how long the failure
 * took to surface. */
static double kill_latency_ms(uint32_t n_stages, const uint32_t *cut, uint32_t victim)
{
    rig r;
    if (!rig_open(&r, n_stages, cut, 5000))
        return -1;
    collected c = {.ex = r.ex,
                   .fault = {.kind = PX_RT_FAULT_KILL, .stage = victim},
                   .after = 4,
                   .armed = true};
    px_err err;
    px_status st = generate(&r, &c, NULL, &err);
    double ms = ms_of(px_now_ns() - c.t_fault);
    assert_int_not_equal(st, PX_OK);
    char want[32];
    snprintf(want, sizeof want, "stage %u (", victim);
    px_assert_contains(err.msg, want);
    px_assert_contains(err.msg, "killed by signal 9");
    assert_int_equal(px_rt_executor_culprit(r.ex), (int)victim);
    char detail[128];
    assert_int_equal(px_rt_executor_stage_health(r.ex, victim, detail, sizeof detail),
                     PX_RT_STAGE_KILLED);
    px_assert_contains(detail, "signal 9");
    rig_close(&r);
    return ms;
}

static void test_killed_stage_is_blamed_within_milliseconds(void **state)
{
    (void)state;
    uint32_t cut2[] = {0, 3, 5}, cut3[] = {0, 2, 4, 5};
    double last = kill_latency_ms(2, cut2, 1);
    if (last < 0)
        return;
    double middle = kill_latency_ms(3, cut3, 1);
    print_message("kill detected after %.1f ms (last stage of 2), %.1f ms (middle stage of 3)\n",
                  last, middle);
    /* ~50 ms in the common case; the bound leaves room for a loaded
     * machine and the sanitizers. */
    assert_true(last < 1000 && middle < 1000);
}

static void test_stopped_stage_is_found_by_the_step_deadline(void **state)
{
    (void)state;
    uint32_t cut[] = {0, 3, 5};
    rig r;
    if (!rig_open(&r, 2, cut, 5000))
        return;
    px_rt_executor_set_step_timeout(r.ex, 300);
    collected c = {
        .ex = r.ex, .fault = {.kind = PX_RT_FAULT_STOP, .stage = 0}, .after = 4, .armed = true};
    px_err err;
    assert_int_equal(generate(&r, &c, NULL, &err), PX_ETIMEOUT);
    double ms = ms_of(px_now_ns() - c.t_fault);
    print_message("stopped stage reported after %.1f ms (step deadline 300 ms)\n", ms);
    assert_true(ms >= 290 && ms < 2000);
    px_assert_contains(err.msg, "stage 0 (local.cpu0");
    px_assert_contains(err.msg, "stopped");
    char detail[128];
    assert_int_equal(px_rt_executor_stage_health(r.ex, 0, detail, sizeof detail),
                     PX_RT_STAGE_STOPPED);
    assert_int_equal(px_rt_executor_culprit(r.ex), 0);
    assert_non_null(px_rt_executor_spec(r.ex));
    assert_int_equal(px_rt_executor_spec(r.ex)->n_stages, 2);
    kill(px_rt_executor_stage_pid(r.ex, 0), SIGCONT);
    rig_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_fault_has_its_effect_and_clear_restores),
        cmocka_unit_test(test_crash_is_blamed_on_the_stage_that_aborted),
        cmocka_unit_test(test_killed_stage_is_blamed_within_milliseconds),
        cmocka_unit_test(test_stopped_stage_is_found_by_the_step_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
