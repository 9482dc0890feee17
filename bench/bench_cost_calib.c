/*
 * Prediction error of the cost model before and after calibration, on
 * real runs.
 *
 * The real tiny model (stories260K) runs through five pipelines over the
 * devices of data/scenarios/emu-small.json (the host cpu and two emulated
 * accelerators), one worker process per stage, twice each.  The overlay
 * comes from `plexus calibrate` (in-process microbenchmarks and pipelines
 * on one device at a time, never these runs).  For every stage of every
 * run, the observed decode time per step (the median over the run's
 * steps; the mean too, as run reports give it) is compared with the
 * sourced prediction and with the calibrated one (px_cost_run_check: p50
 * and the Monte Carlo range): median absolute error and the fraction of
 * observations inside the intervals, for each; and the time per token
 * end to end, which the calibrated mode predicts with the executor's own
 * round trip per step (the step class).  A second overlay fitted from the
 * first round of runs (per stage, and what each run's time per token
 * leaves after its stages and hops) is checked on the second round (held
 * out).
 *
 * Emulated devices: the figures say what this machine does when paced
 * like them, nothing about real hardware.  The workers are the plexus
 * binary: $PLEXUS_BIN, or `plexus` beside this benchmark.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/rt.h"

#include "bench_util.h"

#define N_NEW   48
#define ROUNDS  2
#define N_PIPES 5

static char plexus_bin[PATH_MAX + 16];

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static void die(const char *what, const px_err *err)
{
    fprintf(stderr, "bench_cost_calib: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* Stages as (device, first block, last block); the first holds the
 * embedding, the last the head. */
typedef struct pipe_def {
    uint32_t n;
    const char *dev[3];
    int32_t first[3], last[3];
} pipe_def;

static const pipe_def pipes[N_PIPES] = {
    {3, {"local.cpu0", "local.emu-a", "local.emu-b"}, {0, 2, 4}, {1, 3, 4}},
    {2, {"local.emu-a", "local.emu-b"}, {0, 3, 0}, {2, 4, 0}},
    {1, {"local.cpu0"}, {0}, {4}},
    {2, {"local.emu-b", "local.cpu0"}, {0, 2, 0}, {1, 4, 0}},
    {1, {"local.emu-a"}, {0}, {4}},
};

static void spec_of(const pipe_def *d, const px_hw_graph *g, px_rt_pipeline_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_stages = d->n;
    for (uint32_t i = 0; i < d->n; i++) {
        px_rt_stage_spec *s = &spec->stages[i];
        uint32_t idx;
        if (!px_hw_graph_find_device(g, d->dev[i], &idx))
            die(d->dev[i], NULL);
        const px_hw_device *hd = &px_hw_graph_view(g)->devices[idx];
        s->layer_begin = (uint32_t)d->first[i];
        s->layer_end = (uint32_t)d->last[i] + 1;
        s->embedding = i == 0;
        s->head = i + 1 == d->n;
        px_strlcpy(s->device, d->dev[i], sizeof s->device);
        px_strlcpy(s->backend, hd->backend ? hd->backend : "cpu", sizeof s->backend);
        s->emulated = hd->emulated;
        if (hd->emu.present)
            s->emu = (px_rt_emu_profile){.compute_slowdown = hd->emu.compute_slowdown,
                                         .memory_slowdown = hd->emu.memory_slowdown,
                                         .jitter = hd->emu.jitter,
                                         .seed = hd->emu.seed};
        px_strlcpy(s->emu.name, d->dev[i], sizeof s->emu.name);
        s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
    }
    spec->emulated = true;
    spec->pred_tpot_s = spec->pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
}

/* Per-stage compute of each decode step, from the supervisor. */
typedef struct step_log {
    uint32_t n;
    double ns[3][N_NEW];
    double hop[3][N_NEW]; /* hop[i]: into stage i (i >= 1) */
} step_log;

static px_status log_step(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                          px_rt_step_verdict *v, px_err *err)
{
    (void)ex;
    (void)v;
    (void)err;
    step_log *l = ud;
    if (obs->prefill || obs->replay || l->n >= N_NEW)
        return PX_OK;
    for (uint32_t i = 0; i < 3 && i < obs->n_stages; i++) {
        l->ns[i][l->n] = (double)obs->compute_ns[i];
        l->hop[i][l->n] = (double)obs->xfer_in_ns[i];
    }
    l->n++;
    return PX_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs one pipeline and returns what calibration reads of it: per stage
 * the median decode step (out) and the mean (mean_out), as run reports
 * give it. */
static void run_pipe(const char *model, const pipe_def *d, const px_hw_graph *g,
                     const px_rt_tokenizer *t, px_cost_run *out, px_cost_run *mean_out)
{
    px_rt_pipeline_spec spec;
    spec_of(d, g, &spec);
    px_err err;
    px_rt_executor_opts xo = {
        .model_path = model, .worker_bin = plexus_bin, .n_threads = 1, .timeout_ms = 30000};
    px_rt_executor *ex;
    if (px_rt_executor_new(&spec, &xo, &ex, &err))
        die("executor", &err);
    const char *prompt = "Once upon a time";
    static step_log log;
    memset(&log, 0, sizeof log);
    px_rt_supervisor sup = {.after_step = log_step, .ud = &log};
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = N_NEW,
                              .ignore_eos = true,
                              .supervisor = &sup};
    px_rt_pipeline_stats st;
    if (px_rt_executor_generate(ex, t, &go, &st, &err))
        die("generate", &err);
    memset(out, 0, sizeof *out);
    out->n_stages = d->n;
    out->n_prompts = 1;
    out->prompt_tokens = (double)st.gen.prompt_tokens;
    out->decode_tokens = (double)st.gen.decode_tokens;
    out->tpot_s = st.decode_steps ? (double)st.gen.decode_ns / 1e9 / (double)st.decode_steps : NAN;
    for (uint32_t i = 0; i < d->n; i++) {
        px_cost_run_stage *rs = &out->stages[i];
        px_strlcpy(rs->device, d->dev[i], sizeof rs->device);
        rs->first = d->first[i];
        rs->last = d->last[i];
        rs->decode_s = log.n ? median_of(log.ns[i], log.n) / 1e9 : NAN;
        rs->prefill_s = (double)st.stages[i].prefill_ns / 1e9;
        rs->xfer_in_s = i > 0 && log.n ? median_of(log.hop[i], log.n) / 1e9 : NAN;
    }
    *mean_out = *out;
    for (uint32_t i = 0; i < d->n; i++) {
        double steps = (double)st.stages[i].decode_steps;
        mean_out->stages[i].decode_s = steps ? (double)st.stages[i].decode_ns / 1e9 / steps : NAN;
        if (i > 0)
            mean_out->stages[i].xfer_in_s =
                steps ? (double)st.stages[i].xfer_in_decode_ns / 1e9 / steps : NAN;
    }
    px_rt_pipeline_stats_release(&st);
    px_rt_executor_free(ex);
}

static void check(const char *title, px_cost_run *runs, size_t n_runs, px_cost_fleet *f,
                  const px_cost_model *m, const px_cost_params *p, const px_cost_calibration *cal,
                  bool table)
{
    px_cost_calib_obs *obs = calloc(n_runs * 3, sizeof *obs);
    px_cost_calib_obs *e2e = calloc(n_runs, sizeof *e2e);
    size_t k = 0, n_e2e = 0;
    px_err err;
    for (size_t i = 0; i < n_runs; i++) {
        char name[32];
        snprintf(name, sizeof name, "pipe%zu.%zu", i % N_PIPES, i / N_PIPES);
        size_t got;
        bool has;
        if (px_cost_run_check(&runs[i], name, f, m, p, cal, obs + k, &got, &e2e[n_e2e], &has, &err))
            die("check", &err);
        k += got;
        n_e2e += has;
    }
    px_cost_calib_summary s;
    px_strbuf sb = PX_STRBUF_INIT;
    must(px_cost_calib_report(obs, k, &s, table ? &sb : NULL), "calibration report");
    printf("%s\n%s", title, table ? sb.buf : "");
    printf("  per-stage decode time, %zu observations: median absolute error sourced %.1f%% -> "
           "calibrated %.1f%%; inside the interval sourced %.0f%% -> calibrated %.0f%%\n",
           k, 100 * s.mae_before, 100 * s.mae_after, 100 * s.coverage_before,
           100 * s.coverage_after);
    must(px_cost_calib_report(e2e, n_e2e, &s, NULL), "calibration report");
    printf("  end to end per token (transfers and the executor included), %zu runs: median "
           "absolute error sourced %.1f%% -> calibrated %.1f%%; inside the interval sourced %.0f%% "
           "-> calibrated %.0f%%\n\n",
           n_e2e, 100 * s.mae_before, 100 * s.mae_after, 100 * s.coverage_before,
           100 * s.coverage_after);
    px_strbuf_release(&sb);
    free(obs);
    free(e2e);
}

int main(void)
{
    if (!bench_plexus_bin(plexus_bin, sizeof plexus_bin))
        return 1;
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    if (access(model, R_OK) != 0) {
        printf("bench_cost_calib: skipped: %s is absent\n", model);
        return 0;
    }
    if (access(plexus_bin, X_OK) != 0) {
        fprintf(stderr, "bench_cost_calib: %s is not there: build the plexus target\n", plexus_bin);
        return 1;
    }
    char inv[PATH_MAX];
    snprintf(inv, sizeof inv, "%s/data/scenarios/emu-small.json", PX_SOURCE_DIR);
    char dir[] = "/tmp/plexus-bench-calib-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cal_path[PATH_MAX + 32], cmd[6 * PATH_MAX];
    snprintf(cal_path, sizeof cal_path, "%s/calibration.json", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' calibrate --inventory '%s' --model '%s' --runs 3 --out '%s' >/dev/null",
             plexus_bin, inv, model, cal_path);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_cost_calib: %s failed\n", cmd);
        return 1;
    }
    px_err err;
    px_hw_graph *g;
    px_diags d;
    px_diags_init(&d);
    px_ir_model *ir;
    px_cost_fleet *f;
    px_cost_model *m;
    px_cost_params p;
    px_cost_params_default(&p);
    px_rt_tokenizer *t;
    px_cost_calibration *cal, *from_runs;
    if (px_hw_graph_load(inv, NULL, &g, &d, &err) || px_ir_model_open(model, NULL, &ir, &err) ||
        px_cost_fleet_new(g, &p, &f, &err) || px_cost_model_new(ir, &m, &err) ||
        px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, &err) ||
        px_cost_calibration_load(cal_path, &cal, &err))
        die("setup", &err);
    static px_cost_run runs[ROUNDS * N_PIPES], means[ROUNDS * N_PIPES];
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N_PIPES; i++)
            run_pipe(model, &pipes[i], g, t, &runs[r * N_PIPES + i], &means[r * N_PIPES + i]);
    printf("stories260K on emu-small (EMULATED devices: paced on this machine, no claim about "
           "real hardware), %d pipelines x %d rounds, %d new tokens\n\n",
           N_PIPES, ROUNDS, N_NEW);
    check("calibrated by plexus calibrate --runs 3 (microbenchmarks and its own pipelines, never "
          "these runs), checked on every run (observed: the median decode step of each stage):",
          runs, ROUNDS * N_PIPES, f, m, &p, cal, true);
    check("the same, observed as the mean decode step (as run reports give it):", means,
          ROUNDS * N_PIPES, f, m, &p, cal, false);
    /* Fitted on round 1, checked on round 2: per-stage weight streaming
     * and the executor's round trip (what the time per token leaves after
     * the stages and the hops between them). */
    px_cost_calib_sample s[N_PIPES * 6];
    size_t n = 0;
    for (int i = 0; i < N_PIPES; i++) {
        size_t got;
        bool has;
        if (px_cost_run_samples(&runs[i], f, m, &p, s + n, &got, &err) ||
            px_cost_run_step_sample(&runs[i], f, m, s + n + got, &has, &err))
            die("samples", &err);
        n += got + has;
    }
    px_cost_fit_opts fo = {.dataset = "bench round 1"};
    if (px_cost_calibration_new(&from_runs, &err) ||
        px_cost_calibration_fit(from_runs, s, n, &fo, &err))
        die("fit", &err);
    check("calibrated from round 1's run reports, checked on round 2 (held out):", runs + N_PIPES,
          N_PIPES, f, m, &p, from_runs, false);
    px_cost_calibration_free(from_runs);
    px_cost_calibration_free(cal);
    px_rt_tokenizer_free(t);
    px_cost_model_free(m);
    px_cost_fleet_free(f);
    px_ir_model_free(ir);
    px_hw_graph_free(g);
    px_diags_release(&d);
    unlink(cal_path);
    rmdir(dir);
    return 0;
}
