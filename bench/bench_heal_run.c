/*
 * Healing real runs: stories260K through real worker processes on the
 * emu-small inventory (this machine's cpu and two emulated devices), with
 * the planner's throughput plan (two stages: cpu0, then emu-a).
 *
 * 1. Device loss: a worker killed at token 20, ten runs: time to detect
 *    (the kill to the failed step) and time to recover (detection to the
 *    first token on the new executor: candidates planned, validated in
 *    the simulator, the new workers started, the KV caches rebuilt),
 *    median and max.
 * 2. A seeded fault campaign: each kind (kill, stop, crash, a slow link,
 *    an intermittent link, a slowing device, silent corruption under an
 *    audit every 4 steps) at random tokens and stages, plus fault-free
 *    runs for false alarms.  Detection precision (incidents of the
 *    expected class over all incidents) and recall (faults whose class
 *    was found), mean time to mitigation (injection to the first token on
 *    the new plan), recovery success (the output equals the fault-free
 *    run's), rollback rate, lost work, explanation completeness (share of
 *    incidents px_heal_incident_complete accepts) and reproducibility
 *    (share of traces replaying identical).
 *
 * Emulated devices: the figures say what this machine does when paced
 * like them, nothing about real hardware.  Timing faults are detected
 * against the run's own baseline: on a loaded machine, noise shows up as
 * false alarms.  The workers are the plexus binary: $PLEXUS_BIN, or
 * `plexus` beside this benchmark.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plexus/heal.h"

#include "bench_util.h"

#define N_NEW 40

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static char plexus_bin[PATH_MAX + 16];
static char model_path[PATH_MAX];
static char dir[] = "/tmp/plexus-bench-heal-XXXXXX";
static px_hw_graph *graph;
static json_t *inventory_doc;
static px_ir_model *ir;
static px_rt_tokenizer *tok;
static json_t *plan;
static px_plan_request request;
static char reference[4096];

static void die(const char *what, const px_err *err)
{
    fprintf(stderr, "bench_heal_run: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

typedef struct collected {
    px_strbuf text;
    size_t ends[1024];
    size_t n;
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)prompt;
    (void)token;
    collected *c = ud;
    if (c->n < PX_ARRAY_LEN(c->ends))
        c->ends[c->n++] = c->text.len;
    px_strbuf_add(&c->text, piece, len);
}

static void on_retract(uint32_t prompt, uint32_t kept, void *ud)
{
    (void)prompt;
    collected *c = ud;
    if (kept < c->n) {
        c->text.len = c->ends[kept];
        c->text.buf[c->text.len] = 0;
        c->n = kept;
    }
}

typedef struct outcome {
    bool ok, identical, replayed;
    json_t *incidents;
    px_heal_run_summary sum;
} outcome;

/* One supervised generation; the trace (when path is set) is replayed. */
static void run_once(const px_heal_inject *inj, size_t n_inj, uint32_t audit_every,
                     const char *trace_path, outcome *out)
{
    memset(out, 0, sizeof *out);
    px_err err;
    px_trace_writer *w = NULL;
    if (trace_path && px_trace_writer_open(trace_path, "run", &w, &err) != PX_OK)
        die("trace", &err);
    px_heal_run_opts ho;
    px_heal_run_opts_default(&ho);
    ho.graph = graph;
    ho.inventory_doc = inventory_doc;
    ho.model = ir;
    ho.model_path = model_path;
    ho.request = request;
    ho.plan = plan;
    ho.executor = (px_rt_executor_opts){.model_path = model_path, .worker_bin = plexus_bin};
    ho.injects = inj;
    ho.n_injects = n_inj;
    ho.trace = w;
    ho.trace_path = trace_path;
    ho.audit_every = audit_every;
    const char *prompt = "Once upon a time";
    ho.prompts = &prompt;
    ho.n_prompts = 1;
    ho.max_new_tokens = N_NEW;
    collected c = {.text = PX_STRBUF_INIT};
    ho.on_retract = on_retract;
    ho.ud = &c;
    px_heal_run *h = NULL;
    if (px_heal_run_new(&ho, &h, &err) != PX_OK)
        die("px_heal_run_new", &err);
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = N_NEW,
                              .on_token = on_token,
                              .ud = &c,
                              .supervisor = px_heal_run_supervisor(h)};
    out->ok = px_rt_executor_generate(px_heal_run_executor(h), tok, &go, NULL, &err) == PX_OK;
    const char *text = c.text.buf ? c.text.buf : "";
    must(px_heal_run_finish(h, &text, 1, NULL), "finish");
    out->identical = out->ok && !strcmp(text, reference);
    out->incidents = px_heal_run_incidents(h);
    px_heal_run_get_summary(h, &out->sum);
    px_heal_run_free(h);
    must(px_trace_writer_close(w, NULL), "trace");
    if (trace_path) {
        px_trace_deriver d[16];
        size_t n = 0, k;
        const px_trace_deriver *t = px_plan_replay_derivers(&k);
        for (size_t i = 0; i < k; i++)
            d[n++] = t[i];
        t = px_heal_replay_derivers(&k);
        for (size_t i = 0; i < k && n < PX_ARRAY_LEN(d); i++)
            d[n++] = t[i];
        px_trace_replay_report rep;
        out->replayed = px_trace_replay(trace_path, d, n, NULL, &rep, &err) == PX_OK;
    }
    if (!out->ok && reference[0])
        fprintf(stderr, "  (a run failed: %s)\n", err.msg);
    if (!reference[0] && out->ok)
        px_strlcpy(reference, text, sizeof reference);
    px_strbuf_release(&c.text);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void setup(void)
{
    if (!bench_plexus_bin(plexus_bin, sizeof plexus_bin))
        exit(1);
    if (access(plexus_bin, X_OK) != 0) {
        fprintf(stderr, "bench_heal_run: %s is not there: build plexus or set PLEXUS_BIN\n",
                plexus_bin);
        exit(1);
    }
    snprintf(model_path, sizeof model_path, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    if (access(model_path, R_OK) != 0) {
        printf("bench_heal_run: %s is absent; skipped\n", model_path);
        exit(0);
    }
    if (!mkdtemp(dir))
        exit(1);
    px_err err;
    char inv[PATH_MAX];
    snprintf(inv, sizeof inv, "%s/data/scenarios/emu-small.json", PX_SOURCE_DIR);
    if (px_hw_graph_load(inv, NULL, &graph, NULL, &err) ||
        px_json_load_file(inv, NULL, &inventory_doc, &err) ||
        px_ir_model_open_any(model_path, NULL, &ir, &err) ||
        px_rt_tokenizer_new(px_ir_model_vocab(ir), &tok, &err))
        die("inputs", &err);
    px_plan_request_default(&request);
    request.graph = graph;
    request.model = ir;
    request.objective = PX_PLAN_OBJ_THROUGHPUT;
    px_plan *p;
    if (px_plan_search(&request, &p, &err))
        die("plan", &err);
    plan = px_plan_to_json(p);
    px_plan_free(p);
    if (json_array_size(json_object_get(plan, "stages")) < 2)
        die("plan", &(px_err){.msg = "the throughput plan has one stage"});
    outcome o;
    run_once(NULL, 0, 0, NULL, &o);
    json_decref(o.incidents);
    if (!reference[0])
        die("the fault-free run", NULL);
}

static void device_loss(void)
{
    double detect[10], recover[10];
    int n = 0;
    px_heal_inject inj;
    px_err err;
    if (px_heal_inject_parse("kill:stage1@token20", &inj, &err))
        die("inject", &err);
    int identical = 0;
    for (int i = 0; i < 10; i++) {
        outcome o;
        run_once(&inj, 1, 0, NULL, &o);
        identical += o.identical;
        const json_t *inc = json_array_get(o.incidents, 0);
        const json_t *rto = json_object_get(inc, "recover_s");
        if (inc && json_is_number(rto)) {
            detect[n] = json_number_value(
                json_object_get(json_object_get(inc, "detection"), "time_to_detect_s"));
            recover[n++] = json_number_value(rto);
        }
        json_decref(o.incidents);
    }
    if (!n) {
        printf("device loss: no recovery measured\n");
        return;
    }
    qsort(detect, (size_t)n, sizeof *detect, cmp);
    qsort(recover, (size_t)n, sizeof *recover, cmp);
    printf("device loss (kill:stage1@token20), %d runs, output identical in %d:\n", n, identical);
    printf("  time to detect   median %8.2f ms   max %8.2f ms\n", detect[n / 2] * 1e3,
           detect[n - 1] * 1e3);
    printf("  time to recover  median %8.2f ms   max %8.2f ms   (aim: < 1 s)\n",
           recover[n / 2] * 1e3, recover[n - 1] * 1e3);
}

typedef struct kind {
    const char *name, *fmt, *expect; /* fmt: %u the stage, %u the token */
    uint32_t audit_every;
    int stage; /* -1: drawn */
} kind;

static const kind kinds[] = {
    {"kill", "kill:stage%u@token%u", "device-loss", 0, -1},
    {"stop", "stop:stage%u@token%u", "hang", 0, -1},
    {"crash", "crash:stage%u@token%u", "crash", 0, -1},
    {"link", "link:stage%u>next:latency=20ms@token%u", "link-degrade", 0, -1},
    /* Bad for 100 ms of every 200: about ten steps of this model. */
    {"link-intermittent", "link:stage%u>next:latency=10ms,period=200ms,duty=0.5@token%u",
     "link-degrade", 0, -1},
    /* The emulated stage: the runtime slows an emulated device's ops. */
    {"slow", "slow:stage%u:factor=30@token%u", "thermal", 0, 1},
    {"corrupt", "corrupt:stage%u:magnitude=0.5@token%u", "corruption", 4, -1},
};

static bool class_matches(const char *got, const char *want)
{
    if (!strcmp(got, want))
        return true;
    /* A lost or broken link, a slow stage read as its device. */
    return (!strcmp(want, "link-degrade") && !strcmp(got, "link-loss")) ||
           (!strcmp(want, "thermal") && !strcmp(got, "stale-topology"));
}

static void campaign(void)
{
    enum { REPS = 2, CLEAN = 3 };
    px_rng rng;
    px_rng_seed(&rng, 2026);
    uint32_t faults = 0, found = 0, incidents = 0, right = 0, complete = 0, rollbacks = 0;
    uint32_t runs = 0, identical = 0, traces = 0, replayed = 0;
    double ttm_sum = 0, lost_s = 0;
    uint64_t lost_steps = 0, lost_tokens = 0;
    uint32_t ttm_n = 0, recoveries = 0;
    char path[PATH_MAX];
    for (size_t k = 0; k < PX_ARRAY_LEN(kinds) + 1; k++) {
        int reps = k < PX_ARRAY_LEN(kinds) ? REPS : CLEAN;
        for (int r = 0; r < reps; r++) {
            px_heal_inject inj;
            size_t n_inj = 0;
            const kind *kd = k < PX_ARRAY_LEN(kinds) ? &kinds[k] : NULL;
            if (kd) {
                char spec[128];
                uint32_t stage = (uint32_t)px_rng_below(&rng, 2);
                if (kd->stage >= 0)
                    stage = (uint32_t)kd->stage;
                uint32_t token = 12 + (uint32_t)px_rng_below(&rng, 12);
                snprintf(spec, sizeof spec, kd->fmt, stage, token);
                /* The receiving end of a link: the next stage, or the
                 * executor after the last. */
                char *next = strstr(spec, ">next");
                if (next) {
                    char rest[96];
                    px_strlcpy(rest, next + 5, sizeof rest);
                    snprintf(next, sizeof spec - (size_t)(next - spec), ">%s%s",
                             stage == 0 ? "stage1" : "executor", rest);
                }
                px_err err;
                if (px_heal_inject_parse(spec, &inj, &err))
                    die(spec, &err);
                n_inj = 1;
                faults++;
            }
            snprintf(path, sizeof path, "%s/run-%zu-%d.trace", dir, k, r);
            outcome o;
            run_once(n_inj ? &inj : NULL, n_inj, kd ? kd->audit_every : 0, path, &o);
            runs++;
            identical += o.identical;
            traces++;
            replayed += o.replayed;
            bool hit = false;
            size_t i;
            json_t *inc;
            json_array_foreach(o.incidents, i, inc)
            {
                incidents++;
                const char *cls =
                    json_string_value(json_object_get(json_object_get(inc, "cause"), "class"));
                bool ok = kd && cls && class_matches(cls, kd->expect);
                right += ok;
                hit |= ok;
                complete += px_heal_incident_complete(inc, NULL);
                rollbacks += json_is_object(json_object_get(inc, "rollback"));
                const json_t *rto = json_object_get(inc, "rto_s");
                if (json_is_number(rto)) {
                    ttm_sum += json_number_value(rto);
                    ttm_n++;
                    recoveries++;
                }
                const json_t *lw = json_object_get(inc, "lost_work");
                lost_steps += (uint64_t)json_integer_value(json_object_get(lw, "steps"));
                lost_tokens += (uint64_t)json_integer_value(json_object_get(lw, "tokens"));
                lost_s += json_number_value(json_object_get(lw, "seconds"));
            }
            found += hit;
            printf("  %-18s %-52s %s, %zu incident(s)%s\n", kd ? kd->name : "fault-free",
                   kd ? inj.text : "-", o.identical ? "identical" : "DIFFERENT",
                   json_array_size(o.incidents), o.replayed ? "" : ", replay FAILED");
            json_decref(o.incidents);
        }
    }
    printf("campaign: %u runs (%u with a fault, %d fault-free)\n", runs, faults, CLEAN);
    printf("  detection precision      %5.1f%% (%u of %u incidents of the injected class)\n",
           incidents ? 100.0 * right / incidents : 100.0, right, incidents);
    printf("  detection recall         %5.1f%% (%u of %u faults found)\n",
           faults ? 100.0 * found / faults : 0.0, found, faults);
    printf("  mean time to mitigation  %8.2f ms (injection to the first token on the new plan, "
           "%u changes)\n",
           ttm_n ? ttm_sum / ttm_n * 1e3 : NAN, ttm_n);
    printf("  recovery success         %5.1f%% (%u of %u outputs identical to the fault-free "
           "run)\n",
           runs ? 100.0 * identical / runs : 0.0, identical, runs);
    printf("  rollback rate            %5.1f%% (%u of %u incidents)\n",
           incidents ? 100.0 * rollbacks / incidents : 0.0, rollbacks, incidents);
    printf("  lost work per incident   %.1f steps, %.1f tokens, %.1f ms\n",
           incidents ? (double)lost_steps / incidents : 0.0,
           incidents ? (double)lost_tokens / incidents : 0.0,
           incidents ? lost_s / incidents * 1e3 : 0.0);
    printf("  explanation completeness %5.1f%% (%u of %u incidents complete)\n",
           incidents ? 100.0 * complete / incidents : 100.0, complete, incidents);
    printf("  reproducibility          %5.1f%% (%u of %u traces replay identical)\n",
           traces ? 100.0 * replayed / traces : 0.0, replayed, traces);
    (void)recoveries;
}

int main(void)
{
    setup();
    printf("stories260K, %d new tokens, emu-small (EMULATED devices), throughput plan\n", N_NEW);
    device_loss();
    campaign();
    json_decref(plan);
    json_decref(inventory_doc);
    px_rt_tokenizer_free(tok);
    px_ir_model_free(ir);
    px_hw_graph_free(graph);
    return 0;
}
