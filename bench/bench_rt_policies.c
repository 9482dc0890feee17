/*
 * The policy table observed on real runs.
 *
 * bench_sim_compare compares plexus's planner with the baselines inside
 * the simulator, that is inside plexus's own cost model.  This benchmark
 * runs the plans for real: the tiny real model (stories260K) on the
 * emu-small inventory (this machine's cpu and two emulated devices), each
 * policy's plan for the latency objective (one prompt) and for the
 * throughput objective (several prompts decoding together), planned as
 * `plexus run` plans, then executed through the pipeline executor (one
 * worker process per stage).
 *
 * Design: every runnable plan gets its own executor, started once; then
 * ROUNDS rounds, each generating once with every plan, in a new random
 * order each round, so that the machine's noise (other processes, the
 * scheduler, frequency changes) falls on all policies alike and the
 * comparison with plexus can be paired round by round.
 *
 * Per plan it prints the stages and their devices, the predicted time per
 * output token (TPOT p50), the observed median TPOT with a distribution-free
 * 95% interval over rounds (order statistics), observed / predicted, the
 * observed tokens/s, and against plexus's plan for the same objective the
 * mean of the per-round differences with a Student t 95% interval and the
 * ratio baseline / plexus.  A plan the planner cannot make or the runtime
 * refuses is printed with the reason.  The devices are emulated: the
 * figures say what this machine does when paced like those devices,
 * nothing about real hardware.
 *
 * The workers are the plexus binary: $PLEXUS_BIN, or `plexus` beside this
 * benchmark.
 */
#include "base/common.h"

#include <limits.h>
#include <math.h>
#include <unistd.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/rt.h"
#include "plexus/sim.h"

#include "bench_util.h"

#define ROUNDS      21
#define N_NEW       256
#define MAX_CONFIGS 32
#define TPUT_BATCH  4

static const char *const latency_prompts[] = {"Once upon a time"};
static const char *const throughput_prompts[TPUT_BATCH] = {
    "Once upon a time", "The cat sat on the mat", "A big red ball", "Lily went to the park"};

/* One policy's plan for one objective, and what its runs observed. */
typedef struct config {
    size_t policy;
    px_plan_objective objective;
    const char *const *prompts;
    uint32_t n_prompts;
    char layout[192]; /* the plan's stages on their devices */
    char why[400];    /* why it cannot run; "" when it runs */
    bool planned;     /* the planner made a plan */
    px_plan_summary sum;
    double pred_tpot_s; /* predicted TPOT of replica 0 */
    double pred_tps;    /* predicted tokens/s of replica 0 */
    bool pred_point;    /* the predictions are replica 0's point estimates */
    bool emulated;      /* replica 0 (what runs) uses an emulated device */
    px_rt_executor *ex; /* NULL when it cannot run (any more) */
    double tpot[ROUNDS], tps[ROUNDS];
    bool ok[ROUNDS];
} config;

static char plexus_bin[PATH_MAX + 16];

static bool find_plexus_bin(void)
{
    if (!bench_plexus_bin(plexus_bin, sizeof plexus_bin))
        return false;
    return access(plexus_bin, X_OK) == 0;
}

/* The tiny model, in the layouts the shared folder has had; NULL when
 * absent.  Returns owned memory. */
static char *find_model(void)
{
    static const char *const names[] = {"stories260K/stories260K.gguf", "stories260K.gguf"};
    for (size_t i = 0; i < PX_ARRAY_LEN(names); i++) {
        char *path = px_asprintf("%s/models/%s", PX_SHARED_DIR, names[i]);
        if (path && access(path, R_OK) == 0)
            return path;
        free(path);
    }
    return NULL;
}

/* "cpu0[0-1] > emu-a[2-3] > emu-b[4]": replica 0's stages, with their
 * blocks, tensor-parallel groups joined by '+'; node prefixes dropped
 * (every device of emu-small is on node "local"). */
static void describe_layout(const px_plan *plan, char *out, size_t cap)
{
    const px_cost_pipeline *pipe = px_plan_pipeline(plan, 0);
    const px_cost_fleet *fleet = px_plan_fleet(plan);
    px_plan_summary sum;
    px_plan_get_summary(plan, &sum);
    px_strbuf sb = PX_STRBUF_INIT;
    for (uint32_t s = 0; pipe && s < pipe->n_stages; s++) {
        const px_cost_stage *st = &pipe->stages[s];
        px_strbuf_adds(&sb, s ? " > " : "");
        for (uint32_t k = 0; k < st->tp; k++) {
            const char *id =
                st->devices[k] < fleet->n_devices ? fleet->devices[st->devices[k]].id : "?";
            const char *dot = strchr(id, '.');
            px_strbuf_addf(&sb, "%s%s", k ? "+" : "", dot ? dot + 1 : id);
        }
        if (st->last < st->first)
            px_strbuf_adds(&sb, "[-]");
        else if (st->last == st->first)
            px_strbuf_addf(&sb, "[%d]", (int)st->first);
        else
            px_strbuf_addf(&sb, "[%d-%d]", (int)st->first, (int)st->last);
    }
    px_strbuf_addf(&sb, " b%u", sum.batch);
    if (sum.micro_batches > 1)
        px_strbuf_addf(&sb, "/mb%u", sum.micro_batches);
    if (sum.n_replicas > 1)
        px_strbuf_addf(&sb, " x%u replicas (replica 0 runs)", sum.n_replicas);
    px_strlcpy(out, sb.buf ? sb.buf : "?", cap);
    px_strbuf_release(&sb);
}

static px_status longest_prompt(const px_rt_tokenizer *tok, const char *const *prompts, uint32_t n,
                                uint32_t *out, px_err *err)
{
    int32_t ids[512];
    *out = 1;
    for (uint32_t i = 0; i < n; i++) {
        size_t n_ids = 0;
        px_status st = px_rt_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), PX_RT_ENCODE_BOS,
                                              ids, PX_ARRAY_LEN(ids), &n_ids, err);
        if (st)
            return st;
        *out = PX_MAX(*out, (uint32_t)n_ids);
    }
    return PX_OK;
}

/* Plans c as `plexus run` would for its prompts, and starts its
 * pipeline; on any refusal c->why says which step refused and why. */
static void prepare(config *c, const px_hw_graph *graph, const px_ir_model *ir,
                    const px_rt_tokenizer *tok, const char *model_path)
{
    px_err err;
    px_err_clear(&err);
    uint32_t prompt_tokens;
    if (longest_prompt(tok, c->prompts, c->n_prompts, &prompt_tokens, &err)) {
        px_textf(c->why, sizeof c->why, "cannot encode the prompts: %s", err.msg);
        return;
    }
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = graph;
    req.model = ir;
    req.objective = c->objective;
    req.policy = px_plan_policy_name(c->policy);
    req.workload.batch = c->n_prompts;
    req.workload.context = hp->context_length ? hp->context_length : 2048;
    req.workload.prompt_tokens = prompt_tokens;
    req.workload.gen_tokens = N_NEW;
    px_plan *plan = NULL;
    if (px_plan_search(&req, &plan, &err) != PX_OK) {
        px_textf(c->why, sizeof c->why, "no plan: %s", err.msg);
        return;
    }
    c->planned = true;
    px_plan_get_summary(plan, &c->sum);
    describe_layout(plan, c->layout, sizeof c->layout);
    const px_cost_pipeline *pipe = px_plan_pipeline(plan, 0);
    const px_cost_fleet *fleet = px_plan_fleet(plan);
    for (uint32_t s = 0; pipe && s < pipe->n_stages; s++)
        for (uint32_t k = 0; k < pipe->stages[s].tp; k++)
            if (pipe->stages[s].devices[k] < fleet->n_devices &&
                fleet->devices[pipe->stages[s].devices[k]].emulated)
                c->emulated = true;
    json_t *doc = px_plan_to_json(plan);
    px_plan_free(plan);
    px_rt_pipeline_spec spec;
    if (!doc) {
        px_textf(c->why, sizeof c->why, "out of memory");
        return;
    }
    /* The plan's predictions are for all its replicas (TPOT: the slowest;
     * tokens/s: the sum); only replica 0 runs here, so with several its
     * own (point) estimates are the ones to compare with. */
    c->pred_tpot_s = c->sum.tpot_s.p50;
    c->pred_tps = c->sum.throughput.p50;
    json_t *r0 = json_array_get(json_object_get(doc, "replicas"), 0);
    if (c->sum.n_replicas > 1 && json_is_number(json_object_get(r0, "tpot_s")) &&
        json_is_number(json_object_get(r0, "throughput"))) {
        c->pred_tpot_s = json_number_value(json_object_get(r0, "tpot_s"));
        c->pred_tps = json_number_value(json_object_get(r0, "throughput"));
        c->pred_point = true;
    }
    px_status st =
        px_rt_pipeline_spec_from_plan(doc, graph, px_plan_policy_name(c->policy), &spec, &err);
    json_decref(doc);
    if (st != PX_OK) {
        px_textf(c->why, sizeof c->why, "the runtime refuses the plan: %s", err.msg);
        return;
    }
    px_rt_executor_opts xo = {.model_path = model_path,
                              .worker_bin = plexus_bin,
                              .n_threads = 1,
                              .timeout_ms = 30000,
                              .max_seqs = c->n_prompts};
    if (px_rt_executor_new(&spec, &xo, &c->ex, &err) != PX_OK) {
        px_textf(c->why, sizeof c->why, "the runtime refuses the plan: %s", err.msg);
        c->ex = NULL;
    }
}

static px_rt_generate_opts gen_opts(const config *c)
{
    return (px_rt_generate_opts){.prompts = c->prompts,
                                 .n_prompts = c->n_prompts,
                                 .max_new_tokens = N_NEW,
                                 .ignore_eos = true};
}

/* One generation; a failure takes the plan out of the rounds that
 * remain (its pipeline is unusable), with the reason. */
static void run_once(config *c, const px_rt_tokenizer *tok, int round)
{
    if (!c->ex)
        return;
    px_err err;
    px_rt_generate_opts go = gen_opts(c);
    px_rt_pipeline_stats st;
    memset(&st, 0, sizeof st);
    if (px_rt_executor_generate(c->ex, tok, &go, &st, &err) != PX_OK) {
        px_textf(c->why, sizeof c->why, "the run failed%s: %s", round < 0 ? " (warm-up)" : "",
                 err.msg);
        px_rt_executor_free(c->ex);
        c->ex = NULL;
        px_rt_pipeline_stats_release(&st);
        return;
    }
    if (round >= 0 && st.decode_steps > 0 && st.gen.decode_ns > 0) {
        /* Time per output token of one sequence: a decode step serves
         * every prompt once. */
        c->tpot[round] = (double)st.gen.decode_ns / 1e9 / (double)st.decode_steps;
        c->tps[round] = (double)st.gen.decode_tokens / ((double)st.gen.decode_ns / 1e9);
        c->ok[round] = true;
    }
    px_rt_pipeline_stats_release(&st);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values, and the distribution-free interval around it: order
 * statistics [x(k), x(n+1-k)] with the largest k whose coverage
 * 1 - 2 P(Bin(n, 1/2) < k) is at least 95% (for 7 values: min and max,
 * 98.4%).  With fewer than 6 values no such k exists: NAN bounds. */
static void median_ci(const double *v, size_t n, double *med, double *lo, double *hi)
{
    double s[ROUNDS];
    memcpy(s, v, n * sizeof *v);
    qsort(s, n, sizeof *s, cmp_double);
    *med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    *lo = *hi = NAN;
    double below = 0, pk = pow(0.5, (double)n); /* P(B = j), j from 0 */
    for (size_t k = 1; k <= n / 2; k++) {
        below += pk; /* P(B < k) */
        pk = pk * (double)(n - (k - 1)) / (double)k;
        if (1 - 2 * below < 0.95)
            break;
        *lo = s[k - 1];
        *hi = s[n - k];
    }
}

/* The objective's figure of round r: TPOT (ms, lower is better) for
 * latency, tokens/s (higher is better) for throughput. */
static double figure(const config *c, int r)
{
    return c->objective == PX_PLAN_OBJ_THROUGHPUT ? c->tps[r] : c->tpot[r] * 1e3;
}

static const char *device_tag(const config *c)
{
    if (!c->planned || c->emulated)
        return "[EMULATED devices]";
    return "[runs on the host cpu only; emu-small's other devices are EMULATED]";
}

static void print_line(const config *c, const config *base)
{
    const char *pol = px_plan_policy_name(c->policy);
    const char *obj = px_plan_objective_name(c->objective);
    printf("%-10s %-11s %-44s", obj, pol, c->planned ? c->layout : "-");
    double t[ROUNDS], tps[ROUNDS];
    size_t n = 0;
    for (int r = 0; r < ROUNDS; r++)
        if (c->ok[r]) {
            t[n] = c->tpot[r] * 1e3;
            tps[n++] = c->tps[r];
        }
    if (n == 0) {
        printf(" pred %7.3f ms%s | %s %s\n", c->planned ? c->pred_tpot_s * 1e3 : NAN,
               c->pred_point ? "*" : " ", c->why[0] ? c->why : "no round completed", device_tag(c));
        return;
    }
    double med, lo, hi, tmed, tlo, thi;
    median_ci(t, n, &med, &lo, &hi);
    median_ci(tps, n, &tmed, &tlo, &thi);
    double pred = c->pred_tpot_s * 1e3;
    printf(" pred %7.3f ms%s | obs %7.3f ms [%7.3f, %7.3f] | obs/pred %5.2f | %7.1f tok/s (pred "
           "%7.1f)",
           pred, c->pred_point ? "*" : " ", med, lo, hi, med / pred, tmed, c->pred_tps);
    /* Paired against plexus for the same objective, over the rounds both
     * completed. */
    if (base && base != c) {
        double d[ROUNDS], a[ROUNDS], b[ROUNDS];
        size_t m = 0;
        for (int r = 0; r < ROUNDS; r++)
            if (c->ok[r] && base->ok[r]) {
                a[m] = figure(c, r);
                b[m] = figure(base, r);
                d[m] = a[m] - b[m];
                m++;
            }
        if (m >= 2) {
            double mean = 0, var = 0;
            for (size_t i = 0; i < m; i++)
                mean += d[i];
            mean /= (double)m;
            for (size_t i = 0; i < m; i++)
                var += (d[i] - mean) * (d[i] - mean);
            var /= (double)(m - 1);
            double half = px_sim_t975((uint32_t)(m - 1)) * sqrt(var / (double)m);
            double ma, la, ha, mb, lb, hb;
            median_ci(a, m, &ma, &la, &ha);
            median_ci(b, m, &mb, &lb, &hb);
            bool sig = mean - half > 0 || mean + half < 0;
            printf(" | vs plexus %+8.3f %s [%+8.3f, %+8.3f]%s ratio %5.2f", mean,
                   c->objective == PX_PLAN_OBJ_THROUGHPUT ? "tok/s" : "ms", mean - half,
                   mean + half, sig ? " *" : "  ", ma / mb);
        } else {
            printf(" | vs plexus: too few paired rounds (%zu)", m);
        }
    } else if (base == c) {
        printf(" | (reference)");
    } else {
        printf(" | vs plexus: plexus's plan did not run");
    }
    if (c->why[0])
        printf(" | %s", c->why);
    printf(" %s\n", device_tag(c));
}

int main(void)
{
    uint64_t t0 = px_now_ns();
    char *model = find_model();
    if (!model) {
        printf("bench_rt_policies: skipped: the tiny model stories260K.gguf is absent from "
               "%s/models\n",
               PX_SHARED_DIR);
        return 0;
    }
    if (!find_plexus_bin()) {
        fprintf(stderr,
                "bench_rt_policies: %s is not there: build the plexus target or set "
                "PLEXUS_BIN\n",
                plexus_bin);
        free(model);
        return 1;
    }
    int rc = 1;
    px_err err;
    px_err_clear(&err);
    char *inv = px_asprintf("%s/data/scenarios/emu-small.json", PX_SOURCE_DIR);
    px_hw_graph *graph = NULL;
    px_ir_model *ir = NULL;
    px_rt_tokenizer *tok = NULL;
    config *cfg = calloc(MAX_CONFIGS, sizeof *cfg);
    size_t n_cfg = 0;
    px_diags diags;
    px_diags_init(&diags);
    if (!inv || !cfg) {
        fprintf(stderr, "bench_rt_policies: out of memory\n");
        goto done;
    }
    if (px_hw_graph_load(inv, NULL, &graph, &diags, &err) != PX_OK) {
        char *report = px_diags_format(&diags, inv);
        fprintf(stderr, "bench_rt_policies: %s:\n%s\n", inv, report ? report : err.msg);
        free(report);
        goto done;
    }
    if (px_ir_model_open(model, NULL, &ir, &err) != PX_OK ||
        px_rt_tokenizer_new(px_ir_model_vocab(ir), &tok, &err) != PX_OK) {
        fprintf(stderr, "bench_rt_policies: %s: %s\n", model, err.msg);
        goto done;
    }

    static const px_plan_objective objectives[] = {PX_PLAN_OBJ_LATENCY, PX_PLAN_OBJ_THROUGHPUT};
    for (size_t o = 0; o < PX_ARRAY_LEN(objectives); o++)
        for (size_t p = 0; p < px_plan_policy_count() && n_cfg < MAX_CONFIGS; p++) {
            config *c = &cfg[n_cfg++];
            c->policy = p;
            c->objective = objectives[o];
            bool lat = objectives[o] == PX_PLAN_OBJ_LATENCY;
            c->prompts = lat ? latency_prompts : throughput_prompts;
            c->n_prompts = lat ? 1 : TPUT_BATCH;
            prepare(c, graph, ir, tok, model);
            run_once(c, tok, -1); /* warm-up: page cache, caches, first-touch */
        }
    /* Each round runs the plans in a fresh random order (fixed seed), so
     * that no plan always follows the same neighbour (whose workers may
     * still hold a core, or have evicted the caches). */
    px_rng rng;
    px_rng_seed(&rng, 7);
    size_t order[MAX_CONFIGS];
    for (size_t k = 0; k < n_cfg; k++)
        order[k] = k;
    for (int r = 0; r < ROUNDS; r++) {
        for (size_t k = n_cfg; k > 1; k--) {
            size_t j = (size_t)px_rng_below(&rng, k);
            size_t t = order[k - 1];
            order[k - 1] = order[j];
            order[j] = t;
        }
        for (size_t k = 0; k < n_cfg; k++)
            run_once(&cfg[order[k]], tok, r);
    }

    printf("policies observed on real runs: stories260K (real, tiny) on emu-small (host cpu0 + "
           "EMULATED emu-a x3/x2 and emu-b x5/x4), %d new tokens per prompt (greedy), latency: "
           "1 prompt, throughput: %d prompts decoding together; %d rounds, policies interleaved "
           "(a random order each round), 1 thread per worker\n",
           N_NEW, TPUT_BATCH, ROUNDS);
    printf("TPOT = decode time per output token of one sequence; obs = median over rounds "
           "[distribution-free 95%% interval: order statistics]; vs plexus = mean of per-round "
           "differences baseline - plexus [Student t 95%%] (* excludes 0) in the objective's "
           "figure (latency: TPOT ms, lower is better; throughput: tokens/s, higher is better), "
           "ratio = baseline / plexus of its medians; plan: devices[blocks] per stage, b = "
           "batch, mb = micro-batches; pred = the plan's TPOT p50 (ms*: replica 0's point "
           "estimate, when the plan has several replicas and only replica 0 runs here)\n");
    for (size_t o = 0; o < PX_ARRAY_LEN(objectives); o++) {
        const config *base = NULL;
        for (size_t i = 0; i < n_cfg; i++)
            if (cfg[i].objective == objectives[o] &&
                !strcmp(px_plan_policy_name(cfg[i].policy), "plexus"))
                base = &cfg[i];
        for (size_t i = 0; i < n_cfg; i++)
            if (cfg[i].objective == objectives[o])
                print_line(&cfg[i], base);
    }
    printf("(the devices are EMULATED: these figures say what this machine does when paced "
           "like them, nothing about real hardware; bench wall time %.1f s)\n",
           (double)(px_now_ns() - t0) / 1e9);
    rc = 0;
done:
    for (size_t i = 0; i < n_cfg; i++)
        px_rt_executor_free(cfg[i].ex);
    free(cfg);
    px_rt_tokenizer_free(tok);
    px_ir_model_free(ir);
    px_hw_graph_free(graph);
    px_diags_release(&diags);
    free(inv);
    free(model);
    return rc;
}
