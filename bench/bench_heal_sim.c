/* Healing in the simulator, evaluated over a seeded fault campaign: every
 * fault kind the simulator models (device loss, domain loss, link
 * degradation, intermittent link, thermal, power cap) injected many times
 * at random times and targets, plus fault-free runs for false alarms.
 * Per kind: detection recall and precision, mean time to detect and to
 * mitigate, recovery success and rollback rates, work lost, explanation
 * completeness (incidents passing px_heal_incident_complete), plan
 * switches per run and reproducibility (traces replaying identical);
 * then the simulator's
 * events per second with and without the healer's observation.
 *
 * Llama 3 8B (a preset) is planned on the faulted-cluster scenario pack
 * (four replicas of two A100s, two racks) and, for link faults, on a
 * pipeline inventory made here (the "gpustack" policy cuts it in two
 * stages behind a shared PCIe switch). */
#include "base/common.h"

#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

#ifndef PX_SOURCE_DIR
#define PX_SOURCE_DIR "."
#endif

enum { RUNS = 20, CLEAN_RUNS = 10 };
#define DURATION_S 40.0

static const char pipe_inventory[] =
    "{\"schema\":\"plexus.inventory/1\",\"name\":\"heal-pipe\","
    "\"domains\":[{\"id\":\"rack-a\",\"kind\":\"rack\"},{\"id\":\"rack-b\",\"kind\":\"rack\"}],"
    "\"nodes\":["
    "{\"id\":\"n1\",\"domains\":[\"rack-a\"],\"devices\":["
    "{\"id\":\"gpu0\",\"catalog\":\"nvidia-v100-pcie-16gb\"},"
    "{\"id\":\"gpu1\",\"catalog\":\"nvidia-v100-pcie-16gb\"}]},"
    "{\"id\":\"n2\",\"domains\":[\"rack-a\"],\"devices\":["
    "{\"id\":\"gpu0\",\"catalog\":\"nvidia-v100-pcie-16gb\"},"
    "{\"id\":\"gpu1\",\"catalog\":\"nvidia-v100-pcie-16gb\"}]},"
    "{\"id\":\"n3\",\"domains\":[\"rack-b\"],\"devices\":["
    "{\"id\":\"gpu0\",\"catalog\":\"nvidia-v100-pcie-16gb\"},"
    "{\"id\":\"gpu1\",\"catalog\":\"nvidia-v100-pcie-16gb\"}]}],"
    "\"links\":["
    "{\"id\":\"n1-pcie0\",\"from\":\"n1.gpu0\",\"to\":\"n1\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n1-pcie-sw\"},"
    "{\"id\":\"n1-pcie1\",\"from\":\"n1.gpu1\",\"to\":\"n1\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n1-pcie-sw\"},"
    "{\"id\":\"n2-pcie0\",\"from\":\"n2.gpu0\",\"to\":\"n2\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n2-pcie-sw\"},"
    "{\"id\":\"n2-pcie1\",\"from\":\"n2.gpu1\",\"to\":\"n2\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n2-pcie-sw\"},"
    "{\"id\":\"n3-pcie0\",\"from\":\"n3.gpu0\",\"to\":\"n3\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n3-pcie-sw\"},"
    "{\"id\":\"n3-pcie1\",\"from\":\"n3.gpu1\",\"to\":\"n3\",\"catalog\":\"pcie-3-x16\","
    "\"contention\":\"n3-pcie-sw\"},"
    "{\"id\":\"eth-12\",\"from\":\"n1\",\"to\":\"n2\",\"catalog\":\"ethernet-100g\"},"
    "{\"id\":\"eth-23\",\"from\":\"n2\",\"to\":\"n3\",\"catalog\":\"ethernet-100g\"},"
    "{\"id\":\"eth-13\",\"from\":\"n1\",\"to\":\"n3\",\"catalog\":\"ethernet-100g\"}]}";

typedef struct setup {
    json_t *inv_doc;
    px_hw_graph *graph;
    px_ir_model *model;
    json_t *plan;
    const char *load;
} setup;

static int setup_open(setup *s, const char *pack, const char *text, const char *policy,
                      const px_ir_model *model, const char *load)
{
    memset(s, 0, sizeof *s);
    px_err err;
    px_err_clear(&err);
    if (pack) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", PX_SOURCE_DIR, pack);
        if (px_json_load_file(path, NULL, &s->inv_doc, &err) != PX_OK)
            goto fail;
    } else {
        json_error_t je;
        s->inv_doc = json_loads(text, 0, &je);
        if (!s->inv_doc) {
            px_err_set(&err, PX_EPARSE, "inventory: %s", je.text);
            goto fail;
        }
    }
    if (px_hw_graph_from_value(s->inv_doc, "inventory", NULL, &s->graph, NULL, &err) != PX_OK)
        goto fail;
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = s->graph;
    req.model = model;
    if (policy)
        req.policy = policy;
    px_plan *p;
    if (px_plan_search(&req, &p, &err) != PX_OK)
        goto fail;
    s->plan = px_plan_to_json(p);
    px_plan_free(p);
    s->load = load;
    return 0;
fail:
    fprintf(stderr, "bench_heal_sim: %s\n", err.msg);
    return 1;
}

static void setup_close(setup *s)
{
    json_decref(s->plan);
    px_hw_graph_free(s->graph);
    json_decref(s->inv_doc);
}

/* The plan's devices and the inventory's domains with a device in it. */
static size_t plan_devices(const json_t *plan, const char **out, size_t cap)
{
    size_t n = 0, i, k;
    const json_t *st, *d;
    json_array_foreach(json_object_get(plan, "stages"), i, st)
    {
        json_array_foreach(json_object_get(st, "devices"), k, d)
        {
            if (n < cap)
                out[n++] = json_string_value(d);
        }
    }
    return n;
}

typedef enum kind { K_DEVICE, K_DOMAIN, K_LINK, K_FLAP, K_THERMAL, K_POWER, K_CLEAN, K_COUNT } kind;
static const char *const kind_names[] = {"device-loss",  "domain-loss", "link-degrade",
                                         "intermittent", "thermal",     "power-cap",
                                         "fault-free"};

/* One fault of the kind at a random time and target, as a faults doc. */
static void make_faults(kind k, const setup *s, px_rng *r, char *buf, size_t cap)
{
    const char *devs[64];
    size_t nd = plan_devices(s->plan, devs, 64);
    double at = 8 + 12 * px_rng_uniform(r);
    const char *dev = nd ? devs[px_rng_below(r, nd)] : "none";
    switch (k) {
    case K_DEVICE:
        snprintf(buf, cap,
                 "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"%.2f s\","
                 "\"kind\":\"device-loss\",\"target\":\"%s\"}]}",
                 at, dev);
        break;
    case K_DOMAIN:
        snprintf(buf, cap,
                 "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"%.2f s\","
                 "\"kind\":\"domain-loss\",\"target\":\"%s\"}]}",
                 at, px_rng_below(r, 2) ? "rack-a" : "rack-b");
        break;
    case K_LINK:
    case K_FLAP:
        snprintf(buf, cap,
                 "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"%.2f s\","
                 "\"kind\":\"link-degrade\",\"target\":\"n1.gpu0>n1.gpu1\",\"latency\":\"%.0f ms\","
                 "\"bandwidth_factor\":%.2f%s}]}",
                 at, 5 + 25 * px_rng_uniform(r), 0.1 + 0.4 * px_rng_uniform(r),
                 k == K_FLAP ? ",\"intermittent\":{\"period\":\"6 s\",\"duty\":0.5}" : "");
        break;
    case K_THERMAL:
        snprintf(buf, cap,
                 "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"%.2f s\","
                 "\"kind\":\"thermal\",\"target\":\"%s\",\"ambient\":\"%.0f C\"}]}",
                 at, dev, 55 + 15 * px_rng_uniform(r));
        break;
    case K_POWER:
        snprintf(buf, cap,
                 "{\"schema\":\"plexus.faults/1\",\"faults\":[{\"at\":\"%.2f s\","
                 "\"kind\":\"power-cap\",\"target\":\"%s\",\"limit\":\"%.0f W\"}]}",
                 at, dev, 120 + 40 * px_rng_uniform(r));
        break;
    default:
        snprintf(buf, cap, "{\"schema\":\"plexus.faults/1\",\"faults\":[]}");
        break;
    }
}

typedef struct row {
    px_heal_sim_summary sum;
    uint32_t runs, traces, identical;
    double wall_s;
} row;

static px_status run_one(px_heal_sim *h, const setup *s, const char *faults_text, uint64_t seed,
                         px_err *err)
{
    px_sim_load load;
    px_status st = px_sim_load_parse(s->load, &load, err);
    if (st != PX_OK)
        return st;
    px_sim_faults faults = {0};
    if ((st = px_sim_faults_parse(faults_text, strlen(faults_text), "campaign", &faults, err)) !=
        PX_OK) {
        px_sim_load_release(&load);
        return st;
    }
    px_sim_options opt;
    px_sim_options_default(&opt);
    opt.duration_s = DURATION_S;
    opt.replications = 1;
    opt.random_failures = false;
    opt.seed = seed;
    px_sim_result res = {0};
    st = px_heal_sim_run(h, &load, faults.n ? &faults : NULL, &opt, &res, err);
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    return st;
}

/* One traced run on a fresh healer, then its replay. */
static bool traced_and_replayed(const setup *s, const px_ir_model *model, const char *faults_text,
                                uint64_t seed, const char *path)
{
    px_err err;
    px_heal_sim_opts ho;
    px_heal_sim_opts_default(&ho);
    ho.ctx.graph = s->graph;
    ho.ctx.model = model;
    ho.plan = s->plan;
    ho.model_ref = "preset:llama-3-8b";
    px_trace_writer *w = NULL;
    px_heal_sim *h = NULL;
    px_sim_load load = {0};
    px_sim_faults faults = {0};
    px_sim_result res = {0};
    bool ok = false;
    if (px_trace_writer_open(path, "simulate", &w, &err) != PX_OK)
        goto done;
    ho.trace = w;
    px_sim_options opt;
    px_sim_options_default(&opt);
    opt.duration_s = DURATION_S;
    opt.replications = 1;
    opt.random_failures = false;
    opt.seed = seed;
    if (px_heal_sim_new(&ho, &h, &err) != PX_OK ||
        px_sim_load_parse(s->load, &load, &err) != PX_OK ||
        px_sim_faults_parse(faults_text, strlen(faults_text), "campaign", &faults, &err) != PX_OK ||
        px_heal_sim_trace_begin(h, w, s->inv_doc, &load, faults.n ? &faults : NULL, &opt, &err) !=
            PX_OK ||
        px_heal_sim_run(h, &load, faults.n ? &faults : NULL, &opt, &res, &err) != PX_OK ||
        px_heal_sim_trace_end(h, w, &res, &err) != PX_OK)
        goto done;
    px_status cst = px_trace_writer_close(w, &err);
    w = NULL;
    if (cst != PX_OK)
        goto done;
    px_trace_deriver all[8];
    size_t n = 0, k;
    const px_trace_deriver *d = px_heal_sim_replay_derivers(&k);
    for (size_t i = 0; i < k; i++)
        all[n++] = d[i];
    d = px_sim_replay_derivers(&k);
    for (size_t i = 0; i < k; i++)
        all[n++] = d[i];
    px_trace_replay_report rep;
    ok = px_trace_replay(path, all, n, NULL, &rep, &err) == PX_OK && !rep.diverged &&
         rep.n_identical == rep.n_decisions;
done:
    if (w && px_trace_writer_close(w, ok ? &err : NULL) != PX_OK)
        ok = false;
    if (!ok)
        fprintf(stderr, "bench_heal_sim: trace %s: %s\n", path, err.msg);
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    px_heal_sim_free(h);
    remove(path);
    return ok;
}

static int campaign(kind k, const setup *s, const px_ir_model *model, row *out)
{
    memset(out, 0, sizeof *out);
    uint64_t t0 = px_now_ns();
    px_err err;
    px_heal_sim_opts ho;
    px_heal_sim_opts_default(&ho);
    ho.ctx.graph = s->graph;
    ho.ctx.model = model;
    ho.plan = s->plan;
    px_heal_sim *h;
    if (px_heal_sim_new(&ho, &h, &err) != PX_OK) {
        fprintf(stderr, "bench_heal_sim: %s\n", err.msg);
        return 1;
    }
    px_rng r = px_rng_derive(2024, (uint64_t)k + 1);
    uint32_t n = k == K_CLEAN ? CLEAN_RUNS : RUNS;
    char faults[1024];
    for (uint32_t i = 0; i < n; i++) {
        make_faults(k, s, &r, faults, sizeof faults);
        if (run_one(h, s, faults, 100 + i, &err) != PX_OK) {
            fprintf(stderr, "bench_heal_sim: %s run %u: %s\n", kind_names[k], i, err.msg);
            px_heal_sim_free(h);
            return 1;
        }
        out->runs++;
        /* Every fourth run is traced again on a fresh healer and replayed. */
        if (i % 4 == 0) {
            char path[256];
            const char *tmp = getenv("TMPDIR");
            snprintf(path, sizeof path, "%s/bench_heal_sim_%s_%u.trace", tmp ? tmp : "/tmp",
                     kind_names[k], i);
            out->traces++;
            out->identical += traced_and_replayed(s, model, faults, 100 + i, path);
        }
    }
    px_heal_sim_get_summary(h, &out->sum);
    px_heal_sim_free(h);
    out->wall_s = (double)(px_now_ns() - t0) / 1e9;
    return 0;
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

/* The simulator's events per second on the faulted-cluster plan, with the
 * healer's observation (ticks, no fault) and without hooks. */
static void events_per_second(const setup *s, const px_ir_model *model)
{
    px_err err;
    px_heal_sim_opts ho;
    px_heal_sim_opts_default(&ho);
    ho.ctx.graph = s->graph;
    ho.ctx.model = model;
    ho.plan = s->plan;
    px_heal_sim *h;
    if (px_heal_sim_new(&ho, &h, &err) != PX_OK)
        return;
    px_sim_load load;
    if (px_sim_load_parse("poisson:rate=60,prompt=uniform:128-1024,gen=exp:200", &load, &err) !=
        PX_OK) {
        px_heal_sim_free(h);
        return;
    }
    px_sim_options opt;
    px_sim_options_default(&opt);
    opt.duration_s = 300;
    opt.replications = 2;
    opt.random_failures = false;
    for (int healed = 0; healed < 2; healed++) {
        px_sim_result res;
        uint64_t t0 = px_now_ns();
        px_status st = healed ? px_heal_sim_run(h, &load, NULL, &opt, &res, &err)
                              : px_sim_run(px_heal_sim_plan(h), &load, NULL, &opt, &res, &err);
        double wall = (double)(px_now_ns() - t0) / 1e9;
        if (st != PX_OK)
            continue;
        double events = 0;
        for (uint32_t r = 0; r < res.n_replications; r++)
            events += res.runs[r].events;
        printf("simulator %-22s %.0f events in %.3f s: %.3g events/s\n",
               healed ? "with observation:" : "without hooks:", events, wall, events / wall);
        px_sim_result_release(&res);
    }
    px_sim_load_release(&load);
    px_heal_sim_free(h);
}

int main(void)
{
    px_err err;
    px_ir_model *model = NULL;
    if (px_ir_model_open_any("llama-3-8b", NULL, &model, &err) != PX_OK) {
        fprintf(stderr, "bench_heal_sim: %s\n", err.msg);
        return 1;
    }
    setup cluster, pipe;
    if (setup_open(&cluster, "data/scenarios/faulted-cluster.json", NULL, NULL, model,
                   "poisson:rate=20,prompt=128,gen=64") ||
        setup_open(&pipe, NULL, pipe_inventory, "gpustack", model,
                   "poisson:rate=2,prompt=128,gen=64")) {
        px_ir_model_free(model);
        return 1;
    }
    printf("bench_heal_sim: %d runs per fault kind (%d fault-free), %.0f simulated s each, "
           "seeded\n",
           RUNS, CLEAN_RUNS, DURATION_S);
    printf("%-13s %5s %6s %6s %6s %6s %7s %7s %7s %7s %8s %6s %7s %7s %6s\n", "kind", "runs",
           "recall", "prec", "f.alrm", "ttd_s", "ttm_s", "recov", "rollbk", "tok/inc", "req.fail",
           "sw/run", "complete", "replay", "wall_s");
    row total = {0};
    for (kind k = 0; k < K_COUNT; k++) {
        const setup *s = (k == K_LINK || k == K_FLAP) ? &pipe : &cluster;
        row rw;
        if (campaign(k, s, model, &rw) != 0)
            continue;
        const px_heal_sim_summary *m = &rw.sum;
        uint32_t matched = m->incidents > m->false_alarms ? m->incidents - m->false_alarms : 0;
        printf("%-13s %5u %6.2f %6.2f %6u %6.2f %7.2f %7.2f %7.2f %7.0f %8.0f %6.2f %7.2f %7.2f "
               "%6.1f\n",
               kind_names[k], rw.runs, ratio(m->faults_detected, m->faults_seen),
               ratio(matched, matched + m->false_alarms), m->false_alarms,
               ratio(m->detect_s_sum, m->faults_detected), ratio(m->mitigate_s_sum, m->mitigated),
               ratio(m->mitigated, m->incidents), ratio(m->rollbacks, m->incidents),
               ratio(m->tokens_lost, m->incidents), m->requests_failed, ratio(m->switches, rw.runs),
               ratio(m->complete, m->incidents), ratio(rw.identical, rw.traces), rw.wall_s);
        total.sum.faults_seen += m->faults_seen;
        total.sum.faults_detected += m->faults_detected;
        total.sum.false_alarms += m->false_alarms;
        total.sum.incidents += m->incidents;
        total.sum.complete += m->complete;
        total.traces += rw.traces;
        total.identical += rw.identical;
    }
    uint32_t matched = total.sum.incidents - total.sum.false_alarms;
    printf("overall: recall %.2f, precision %.2f, explanation completeness %.2f, traces replaying "
           "identical %.2f\n",
           ratio(total.sum.faults_detected, total.sum.faults_seen),
           ratio(matched, matched + total.sum.false_alarms),
           ratio(total.sum.complete, total.sum.incidents), ratio(total.identical, total.traces));
    events_per_second(&cluster, model);
    setup_close(&cluster);
    setup_close(&pipe);
    px_ir_model_free(model);
    return 0;
}
