/*
 * Stages started by a launcher: stories260K on the emu-small inventory's
 * throughput plan (two stages), every worker started by the local
 * launcher on 127.0.0.2 and joined over authenticated TCP, ten runs each:
 *
 * 1. Start to first token: from asking for the pipeline (the launcher
 *    starts the last stage first, each announces its address, the hellos
 *    prove the secret) to the first generated token, median and max.
 * 2. RTO of a stage's loss: the worker of stage 1 killed through the
 *    launcher at token 20; the incident's rto_s (the fault to the first
 *    token on the new plan) and whether the output equals the fault-free
 *    run's, median and max.
 *
 * One machine: the links cross loopback, not a network, and the devices
 * are emulated; the figures are this machine's, nothing about real
 * hardware or a fleet.  The workers are the plexus binary: $PLEXUS_BIN,
 * or `plexus` beside this benchmark.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plexus/heal.h"

#include "bench_util.h"

#define N_NEW 40
#define RUNS  10

static char plexus_bin[PATH_MAX + 16];
static char model_path[PATH_MAX];
static px_hw_graph *graph;
static px_ir_model *ir;
static px_rt_tokenizer *tok;
static json_t *plan;
static px_plan_request request;
static px_rt_local_launcher *launcher;
static char reference[4096];

static void die(const char *what, const px_err *err)
{
    fprintf(stderr, "bench_rt_launch: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

typedef struct collected {
    px_strbuf text;
    uint64_t t_first_ns;
} collected;

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)prompt;
    (void)token;
    collected *c = ud;
    if (!c->t_first_ns)
        c->t_first_ns = px_now_ns();
    px_strbuf_add(&c->text, piece, len);
}

/* One supervised generation through launched stages.  *first_s: start
 * to first token; *rto_s: the first incident's, or -1. */
static bool run_once(const px_heal_inject *inj, double *first_s, double *rto_s, bool *identical)
{
    px_err err;
    px_heal_run_opts ho;
    px_heal_run_opts_default(&ho);
    ho.graph = graph;
    ho.model = ir;
    ho.model_path = model_path;
    ho.request = request;
    ho.plan = plan;
    ho.executor = (px_rt_executor_opts){.model_path = model_path,
                                        .worker_bin = plexus_bin,
                                        .launcher = px_rt_local_launcher_iface(launcher),
                                        .listen = "tcp:127.0.0.2:0"};
    ho.injects = inj;
    ho.n_injects = inj ? 1 : 0;
    const char *prompt = "Once upon a time";
    ho.prompts = &prompt;
    ho.n_prompts = 1;
    ho.max_new_tokens = N_NEW;
    collected c = {.text = PX_STRBUF_INIT};
    uint64_t t0 = px_now_ns();
    px_heal_run *h = NULL;
    if (px_heal_run_new(&ho, &h, &err) != PX_OK)
        die("px_heal_run_new", &err);
    px_rt_generate_opts go = {.prompts = &prompt,
                              .n_prompts = 1,
                              .max_new_tokens = N_NEW,
                              .on_token = on_token,
                              .ud = &c,
                              .supervisor = px_heal_run_supervisor(h)};
    bool ok = px_rt_executor_generate(px_heal_run_executor(h), tok, &go, NULL, &err) == PX_OK;
    const char *text = c.text.buf ? c.text.buf : "";
    (void)px_heal_run_finish(h, &text, 1, NULL); /* no trace: nothing to record */
    *first_s = c.t_first_ns ? (double)(c.t_first_ns - t0) / 1e9 : -1;
    json_t *incidents = px_heal_run_incidents(h);
    json_t *inc = json_array_get(incidents, 0);
    const json_t *rto = json_object_get(inc, "rto_s");
    *rto_s = json_is_number(rto) ? json_number_value(rto) : -1;
    if (!reference[0] && ok)
        px_strlcpy(reference, text, sizeof reference);
    *identical = ok && !strcmp(text, reference);
    if (!ok)
        fprintf(stderr, "  (a run failed: %s)\n", err.msg);
    json_decref(incidents);
    px_heal_run_free(h);
    px_strbuf_release(&c.text);
    return ok;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("  %-22s median %8.2f ms   max %8.2f ms\n", what, v[n / 2] * 1e3, v[n - 1] * 1e3);
}

int main(void)
{
    if (!bench_plexus_bin(plexus_bin, sizeof plexus_bin))
        return 1;
    snprintf(model_path, sizeof model_path, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    if (access(model_path, R_OK) != 0) {
        printf("bench_rt_launch: %s is absent; skipped\n", model_path);
        return 0;
    }
    px_err err;
    char inv[PATH_MAX];
    snprintf(inv, sizeof inv, "%s/data/scenarios/emu-small.json", PX_SOURCE_DIR);
    if (px_hw_graph_load(inv, NULL, &graph, NULL, &err) ||
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
    if (px_rt_local_launcher_new(plexus_bin, "127.0.0.2", 30000, &launcher, &err))
        die("launcher", &err);
    double first[RUNS], rto[RUNS];
    int n_first = 0, n_rto = 0, identical = 0;
    bool same;
    for (int i = 0; i < RUNS; i++) {
        double f, r;
        if (run_once(NULL, &f, &r, &same) && f >= 0)
            first[n_first++] = f;
    }
    px_heal_inject inj;
    if (px_heal_inject_parse("kill:stage1@token20", &inj, &err))
        die("inject", &err);
    for (int i = 0; i < RUNS; i++) {
        double f, r;
        run_once(&inj, &f, &r, &same);
        identical += same;
        if (r >= 0)
            rto[n_rto++] = r;
    }
    printf("launched stages (local launcher on 127.0.0.2, authenticated TCP, emu-small "
           "throughput plan, emulated devices):\n");
    if (n_first)
        report("start to first token", first, n_first);
    if (n_rto) {
        report("RTO of a stage's loss", rto, n_rto);
        printf("  output identical to the fault-free run in %d of %d runs\n", identical, RUNS);
    } else {
        printf("  stage loss: no recovery measured\n");
    }
    px_rt_local_launcher_free(launcher);
    json_decref(plan);
    px_rt_tokenizer_free(tok);
    px_ir_model_free(ir);
    px_hw_graph_free(graph);
    return n_first && n_rto ? 0 : 1;
}
