/*
 * Pipelined execution on one machine.
 *
 * 1. The overhead of a 2-stage pipeline (two worker processes on the cpu
 *    backend, joined by Unix sockets) against one process, in decode: time
 *    per token of each, and the overhead in percent.  On the real tiny
 *    model (stories260K, 0.3 ms a token, where every hop's fixed cost
 *    shows) and on a synthetic model of a few ms a token (written with
 *    the ir module's GGUF writer into a temporary folder).
 * 2. The real tiny model's tokens/s through a plan over a cpu device and
 *    two emulated devices with the profiles of data/scenarios/emu-small.json
 *    (compute x3 / memory x2, and x5 / x4).  Emulated: the figures say
 *    what this machine does when paced like those devices, nothing about
 *    real hardware.
 *
 * The workers are the plexus binary: $PLEXUS_BIN, or `plexus` beside this
 * benchmark.  Each figure is the best of three runs.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

#include "bench_util.h"

#define N_NEW 64
#define RUNS  3

static char plexus_bin[PATH_MAX + 16];

static void die(const char *what, const px_err *err)
{
    fprintf(stderr, "bench_rt_pipeline: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static px_rt_tokenizer *tokenizer_of(const char *path)
{
    px_ir_model *ir;
    px_err err;
    if (px_ir_model_open(path, NULL, &ir, &err))
        die(path, &err);
    px_rt_tokenizer *t;
    if (px_rt_tokenizer_new(px_ir_model_vocab(ir), &t, &err))
        die("tokenizer", &err);
    px_ir_model_free(ir);
    return t;
}

static const char *prompt = "Once upon a time";

/* Best decode seconds per token of one process on the cpu. */
static double single_tpot(const char *path, double *prefill_tps)
{
    px_err err;
    px_rt_model *m;
    if (px_rt_model_open(path, &m, &err))
        die(path, &err);
    px_rt_tokenizer *t = tokenizer_of(path);
    double best = INFINITY;
    *prefill_tps = 0;
    for (int r = 0; r < RUNS; r++) {
        px_rt_session_opts so = {.n_threads = 1, .max_seqs = 1};
        px_rt_session *s;
        if (px_rt_session_new(m, &so, &s, &err))
            die("session", &err);
        px_rt_generate_opts go = {
            .prompts = &prompt, .n_prompts = 1, .max_new_tokens = N_NEW, .ignore_eos = true};
        px_rt_generate_stats st;
        if (px_rt_generate(s, t, &go, &st, &err))
            die("generate", &err);
        best = fmin(best, (double)st.decode_ns / 1e9 / (double)st.decode_tokens);
        *prefill_tps = fmax(*prefill_tps, (double)st.prompt_tokens / (st.prefill_ns / 1e9));
        px_rt_session_free(s);
    }
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
    return best;
}

static double pipeline_tpot(const char *path, const px_rt_pipeline_spec *spec, double *prefill_tps,
                            double *xfer_per_step)
{
    px_err err;
    px_rt_executor_opts xo = {.model_path = path,
                              .worker_bin = plexus_bin,
                              .n_threads = 1,
                              .timeout_ms = 30000,
                              .max_seqs = 1};
    px_rt_executor *ex;
    if (px_rt_executor_new(spec, &xo, &ex, &err))
        die("executor", &err);
    px_rt_tokenizer *t = tokenizer_of(path);
    double best = INFINITY;
    *prefill_tps = 0;
    *xfer_per_step = 0;
    for (int r = 0; r < RUNS; r++) {
        px_rt_generate_opts go = {
            .prompts = &prompt, .n_prompts = 1, .max_new_tokens = N_NEW, .ignore_eos = true};
        px_rt_pipeline_stats st;
        if (px_rt_executor_generate(ex, t, &go, &st, &err))
            die("pipeline generate", &err);
        double tpot = (double)st.gen.decode_ns / 1e9 / (double)st.decode_steps;
        if (tpot < best) {
            best = tpot;
            uint64_t x = st.xfer_out_decode_ns;
            for (uint32_t i = 0; i < st.n_stages; i++)
                x += st.stages[i].xfer_in_decode_ns;
            *xfer_per_step = (double)x / 1e9 / (double)st.decode_steps;
        }
        *prefill_tps = fmax(*prefill_tps, (double)st.gen.prompt_tokens / (st.gen.prefill_ns / 1e9));
        px_rt_pipeline_stats_release(&st);
    }
    px_rt_tokenizer_free(t);
    px_rt_executor_free(ex);
    return best;
}

static void stage(px_rt_pipeline_spec *spec, uint32_t i, uint32_t a, uint32_t b, const char *dev,
                  double cs, double ms)
{
    px_rt_stage_spec *s = &spec->stages[i];
    memset(s, 0, sizeof *s);
    s->layer_begin = a;
    s->layer_end = b;
    px_strlcpy(s->device, dev, sizeof s->device);
    bool emu = cs > 0;
    px_strlcpy(s->backend, emu ? "emu" : "cpu", sizeof s->backend);
    s->emulated = emu;
    s->emu = (px_rt_emu_profile){.compute_slowdown = emu ? cs : 1, .memory_slowdown = emu ? ms : 1};
    px_strlcpy(s->emu.name, dev, sizeof s->emu.name);
    s->pred_decode_s = s->pred_prefill_s = (px_rt_interval){NAN, NAN, NAN};
}

static void overhead(const char *name, const char *path, uint32_t n_layers)
{
    double pf1, pf2, xfer;
    double t1 = single_tpot(path, &pf1);
    px_rt_pipeline_spec spec = {.n_stages = 2};
    stage(&spec, 0, 0, n_layers / 2, "cpu-a", 0, 0);
    stage(&spec, 1, n_layers / 2, n_layers, "cpu-b", 0, 0);
    spec.stages[0].embedding = true;
    spec.stages[1].head = true;
    spec.pred_tpot_s = spec.pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
    double t2 = pipeline_tpot(path, &spec, &pf2, &xfer);
    printf("%-28s one process %8.3f ms/token (%7.1f tok/s) | 2 stages %8.3f ms/token (%7.1f "
           "tok/s), transfers %6.1f us/step | overhead %+.1f%%\n",
           name, t1 * 1e3, 1 / t1, t2 * 1e3, 1 / t2, xfer * 1e6, (t2 / t1 - 1) * 100);
}

int main(void)
{
    if (!bench_plexus_bin(plexus_bin, sizeof plexus_bin))
        return 1;
    if (access(plexus_bin, X_OK) != 0) {
        fprintf(stderr,
                "bench_rt_pipeline: %s is not there: build the plexus target or set "
                "PLEXUS_BIN\n",
                plexus_bin);
        return 1;
    }
    px_err err;
    char dir[] = "/tmp/plexus-bench-pipe-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char synth[PATH_MAX];
    snprintf(synth, sizeof synth, "%s/synth.gguf", dir);
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 768;
    o.hidden_dim = 2048;
    o.n_layers = 8;
    o.n_heads = 12;
    o.n_kv_heads = 4;
    o.vocab_size = 2048;
    o.context_length = 256;
    if (px_ir_synth_write(&o, synth, &err))
        die("synthetic model", &err);

    printf("decode, 1 thread per process, %d new tokens, best of %d\n", N_NEW, RUNS);
    char real[PATH_MAX];
    snprintf(real, sizeof real, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    bool have_real = access(real, R_OK) == 0;
    if (have_real)
        overhead("stories260K (real, tiny)", real, 5);
    else
        printf("stories260K: skipped (%s is absent)\n", real);
    overhead("synthetic 8 x 768 (f32)", synth, 8);

    if (have_real) {
        px_rt_pipeline_spec spec = {.n_stages = 3, .emulated = true};
        stage(&spec, 0, 0, 2, "local.cpu0", 0, 0);
        stage(&spec, 1, 2, 4, "local.emu-a", 3, 2);
        stage(&spec, 2, 4, 5, "local.emu-b", 5, 4);
        spec.stages[0].embedding = true;
        spec.stages[2].head = true;
        spec.pred_tpot_s = spec.pred_ttft_s = (px_rt_interval){NAN, NAN, NAN};
        double pf, xfer;
        double t = pipeline_tpot(real, &spec, &pf, &xfer);
        printf("stories260K through cpu0 [0-1] + emu-a (emulated, x3/x2) [2-3] + emu-b "
               "(emulated, x5/x4) [4]: decode %.1f tokens/s (%.3f ms/token), prefill %.1f "
               "tokens/s [emulated devices]\n",
               1 / t, t * 1e3, pf);
    }
    unlink(synth);
    rmdir(dir);
    return 0;
}
