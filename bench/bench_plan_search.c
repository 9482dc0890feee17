/* Planner benchmark: wall time on the scenario packs and on generated
 * fleets of 4 to 4096 devices (32- and 80-block models), the optimality gap
 * against the exact yardsticks, and plexus's predicted latency and
 * throughput against each baseline on the same inputs. */
#include "base/common.h"

#include <dirent.h>

#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

typedef struct gpu_type {
    const char *name, *cap, *bw, *bf16, *f32, *tdp, *price;
    bool nvlink;
} gpu_type;

static const gpu_type types[] = {
    {"h100", "80 GiB", "3.35 TB/s", "989 TFLOP/s", "67 TFLOP/s", "700 W", "2.49 $/h", true},
    {"a100", "40 GiB", "1.55 TB/s", "312 TFLOP/s", "19.5 TFLOP/s", "400 W", "1.1 $/h", true},
    {"l4", "24 GiB", "300 GB/s", "121 TFLOP/s", "30 TFLOP/s", "72 W", "0.5 $/h", false},
    {"l40s", "48 GiB", "864 GB/s", "362 TFLOP/s", "91 TFLOP/s", "350 W", "1.0 $/h", false},
};

static void add_gpu(px_strbuf *sb, int id, const gpu_type *t, bool first)
{
    px_strbuf_addf(sb,
                   "%s{\"id\":\"gpu%d\",\"class\":\"gpu\",\"model\":\"%s\",\"backend\":\"cuda\","
                   "\"compute\":{\"bf16\":\"%s\",\"f16\":\"%s\",\"f32\":\"%s\"},"
                   "\"memory\":[{\"id\":\"hbm\",\"kind\":\"hbm\",\"capacity\":\"%s\","
                   "\"bandwidth\":{\"value\":\"%s\",\"uncertainty\":0.05}}],"
                   "\"power\":{\"tdp\":\"%s\"},\"cost\":\"%s\"}",
                   first ? "" : ",", id, t->name, t->bf16, t->bf16, t->f32, t->cap, t->bw, t->tdp,
                   t->price);
}

/* n devices: nodes of 8 GPUs of one type each (types cycling), NVLink rings
 * inside nodes of NVLink types, PCIe to the host, 100 Gbit/s from every
 * node to node 0.  Fewer than 8 devices: one node of mixed types. */
static char *fleet_text(int n, uint64_t seed)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf links = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\":\"plexus.inventory/1\",\"name\":\"generated\",\"nodes\":[");
    int per = n < 8 ? n : 8;
    int nodes = (n + per - 1) / per;
    px_rng r;
    px_rng_seed(&r, seed);
    for (int j = 0; j < nodes; j++) {
        px_strbuf_addf(&sb, "%s{\"id\":\"n%d\",\"devices\":[", j ? "," : "", j);
        const gpu_type *t = &types[(j + px_rng_below(&r, 2)) % PX_ARRAY_LEN(types)];
        for (int i = 0; i < per; i++) {
            const gpu_type *ti = n < 8 ? &types[(size_t)(i + seed) % PX_ARRAY_LEN(types)] : t;
            add_gpu(&sb, i, ti, i == 0);
            px_strbuf_addf(&links,
                           "%s{\"from\":\"n%d.gpu%d\",\"to\":\"n%d\",\"kind\":\"pcie4\","
                           "\"bandwidth\":\"32 GB/s\",\"latency\":\"2 us\","
                           "\"contention\":\"n%d-pcie\"}",
                           links.len ? "," : "", j, i, j, j);
            if (n >= 8 && t->nvlink && per > 1)
                px_strbuf_addf(&links,
                               ",{\"from\":\"n%d.gpu%d\",\"to\":\"n%d.gpu%d\",\"kind\":\"nvlink4\","
                               "\"bandwidth\":\"300 GB/s\",\"latency\":\"2 us\"}",
                               j, i, j, (i + 1) % per);
        }
        px_strbuf_adds(&sb, "]}");
        if (j > 0)
            px_strbuf_addf(&links,
                           ",{\"from\":\"n%d\",\"to\":\"n0\",\"kind\":\"ethernet\","
                           "\"bandwidth\":\"100 Gbit/s\",\"latency\":\"10 us\"}",
                           j);
    }
    px_strbuf_addf(&sb, "],\"links\":[%s]}", links.buf);
    px_strbuf_release(&links);
    return px_strbuf_detach(&sb, NULL);
}

static px_hw_graph *load_text(const char *text)
{
    px_hw_graph *g = NULL;
    px_err err;
    if (px_hw_graph_from_json(text, strlen(text), "generated.json", NULL, &g, NULL, &err) !=
        PX_OK) {
        fprintf(stderr, "bench: generated inventory refused: %s\n", err.msg);
        return NULL;
    }
    return g;
}

static double ms_since(uint64_t t0)
{
    return (double)(px_now_ns() - t0) / 1e6;
}

static px_ir_model *preset(const char *name, px_dtype dt)
{
    px_ir_model *m = NULL;
    px_err err;
    if (px_ir_preset_new(name, dt, NULL, &m, &err) != PX_OK)
        fprintf(stderr, "bench: %s\n", err.msg);
    return m;
}

static void timing(void)
{
    static const int sizes[] = {4, 16, 64, 256, 1024, 4096};
    static const char *models[] = {"llama-3-8b", "llama-3-70b"};
    printf("\n== planner wall time on generated fleets (search + Monte Carlo finalists; "
           "full = with fallbacks and baselines)\n");
    printf("%-8s %-12s %10s %10s %12s %10s %8s\n", "devices", "model", "search ms", "full ms",
           "tpot p50", "tok/s", "stages");
    for (size_t k = 0; k < PX_ARRAY_LEN(models); k++) {
        px_ir_model *m = preset(models[k], PX_DTYPE_COUNT_);
        if (!m)
            continue;
        for (size_t s = 0; s < PX_ARRAY_LEN(sizes); s++) {
            char *text = fleet_text(sizes[s], 1);
            px_hw_graph *g = load_text(text);
            free(text);
            if (!g)
                continue;
            px_plan_request req;
            px_plan_request_default(&req);
            req.graph = g;
            req.model = m;
            req.fallbacks = false;
            px_plan *p = NULL;
            px_err err;
            uint64_t t0 = px_now_ns();
            px_status st = px_plan_search(&req, &p, &err);
            double search_ms = ms_since(t0);
            double full_ms = 0;
            px_plan_summary sum = {0};
            if (st == PX_OK) {
                px_plan_get_summary(p, &sum);
                px_plan_free(p);
                req.fallbacks = true;
                req.compare_baselines = sizes[s] <= 1024;
                t0 = px_now_ns();
                if (px_plan_search(&req, &p, &err) == PX_OK)
                    full_ms = ms_since(t0);
                px_plan_free(p);
                printf("%-8d %-12s %10.1f %10.1f %10.3g ms %10.4g %8u\n", sizes[s], models[k],
                       search_ms, full_ms, sum.tpot_point_s * 1e3, sum.throughput_point,
                       sum.n_stages);
            } else {
                printf("%-8d %-12s %10.1f %10s  (%s)\n", sizes[s], models[k], search_ms, "-",
                       err.msg);
            }
            fflush(stdout);
            px_hw_graph_free(g);
        }
        px_ir_model_free(m);
    }
}

static void optimality_gap(void)
{
    printf("\n== optimality gap on small instances (exhaustive: every ordered sequence of disjoint "
           "device groups and cut)\n");
    printf("%-6s %-8s %-10s %12s %12s %8s\n", "seed", "devices", "model", "plexus tpot",
           "exact tpot", "gap %");
    double worst = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        int n = 3 + (int)(seed % 4); /* 4..6 devices */
        char *text = fleet_text(n, seed);
        px_hw_graph *g = load_text(text);
        free(text);
        if (!g)
            continue;
        for (int dt = 0; dt < 2; dt++) {
            px_ir_model *m = preset("llama-3-8b", dt ? PX_DTYPE_F32 : PX_DTYPE_COUNT_);
            px_plan_request req;
            px_plan_request_default(&req);
            req.graph = g;
            req.model = m;
            req.fallbacks = false;
            px_plan *p = NULL;
            px_err err;
            double exact = 0;
            if (px_plan_search(&req, &p, &err) == PX_OK &&
                px_plan_exact(&req, (uint32_t)n, &exact, &err) == PX_OK) {
                px_plan_summary s;
                px_plan_get_summary(p, &s);
                double gap = 100.0 * (s.tpot_point_s / exact - 1.0);
                worst = PX_MAX(worst, gap);
                printf("%-6" PRIu64 " %-8d %-10s %10.4g ms %10.4g ms %8.2f\n", seed, n,
                       dt ? "8b-f32" : "8b-bf16", s.tpot_point_s * 1e3, exact * 1e3, gap);
            } else {
                printf("%-6" PRIu64 " %-8d %-10s  (%s)\n", seed, n, dt ? "8b-f32" : "8b-bf16",
                       err.msg);
            }
            px_plan_free(p);
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
    }
    printf("worst gap against exhaustive enumeration: %.2f%% (aim: under 1%%)\n", worst);

    printf("\n== optimality gap on medium instances (GLPK MILP of the bottleneck split)\n");
    printf("%-8s %14s %14s %8s\n", "devices", "heuristic ms", "MILP ms", "gap %");
    worst = 0;
    static const int sizes[] = {8, 16, 32, 64};
    px_ir_model *m = preset("llama-3-70b", PX_DTYPE_COUNT_);
    for (size_t s = 0; m && s < PX_ARRAY_LEN(sizes); s++) {
        char *text = fleet_text(sizes[s], 3);
        px_hw_graph *g = load_text(text);
        free(text);
        if (!g)
            continue;
        px_plan_request req;
        px_plan_request_default(&req);
        req.graph = g;
        req.model = m;
        req.workload.context = 4096;
        req.workload.prompt_tokens = 512;
        double milp, heur;
        px_err err;
        if (px_plan_milp(&req, &milp, &err) == PX_OK &&
            px_plan_heuristic_bottleneck(&req, &heur, &err) == PX_OK) {
            double gap = 100.0 * (heur / milp - 1.0);
            worst = PX_MAX(worst, gap);
            printf("%-8d %14.4g %14.4g %8.2f\n", sizes[s], heur * 1e3, milp * 1e3, gap);
        } else {
            printf("%-8d  (%s)\n", sizes[s], err.msg);
        }
        px_hw_graph_free(g);
    }
    px_ir_model_free(m);
    printf("worst gap against the MILP: %.2f%%\n", worst);
}

static void ratios_one(const char *label, px_hw_graph *g, px_ir_model *m)
{
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.fallbacks = false;
    req.compare_baselines = true;
    for (int obj = 0; obj < 2; obj++) {
        req.objective = obj ? PX_PLAN_OBJ_THROUGHPUT : PX_PLAN_OBJ_LATENCY;
        px_plan *p = NULL;
        px_err err;
        if (px_plan_search(&req, &p, &err) != PX_OK) {
            printf("%-34s %-10s  (%s)\n", label, px_plan_objective_name(req.objective), err.msg);
            continue;
        }
        json_t *doc = px_plan_to_json(p);
        size_t i;
        const json_t *b;
        printf("%-34s %-10s", label, px_plan_objective_name(req.objective));
        json_array_foreach(json_object_get(doc, "baselines"), i, b)
        {
            const char *name = json_string_value(json_object_get(b, "policy"));
            if (!json_is_true(json_object_get(b, "feasible"))) {
                printf("  %s: -", name);
                continue;
            }
            double r = json_number_value(
                json_object_get(b, obj ? "plexus_speedup_throughput" : "plexus_speedup_tpot"));
            printf("  %s: %.2fx", name, r);
        }
        printf("\n");
        json_decref(doc);
        px_plan_free(p);
    }
}

static void ratios(void)
{
    printf("\n== plexus against the baselines (same cost model and workload; >1 means plexus "
           "is better: latency = baseline TPOT / plexus TPOT, throughput = plexus / baseline)\n");
    px_ir_model *m8 = preset("llama-3-8b", PX_DTYPE_COUNT_);
    px_ir_model *m70 = preset("llama-3-70b", PX_DTYPE_COUNT_);
    char *dir = px_asprintf("%s/data/scenarios", PX_SOURCE_DIR);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        char *path = px_asprintf("%s/%s", dir, e->d_name);
        px_hw_graph *g = NULL;
        px_err err;
        if (px_hw_graph_load(path, NULL, &g, NULL, &err) == PX_OK) {
            char label[64];
            snprintf(label, sizeof label, "%.40s 8b", e->d_name);
            uint64_t t0 = px_now_ns();
            ratios_one(label, g, m8);
            printf("    (%.0f ms)\n", ms_since(t0));
            px_hw_graph_free(g);
        }
        free(path);
    }
    if (d)
        closedir(d);
    free(dir);
    for (int k = 0; k < 3; k++) {
        int n = k == 0 ? 6 : k == 1 ? 16 : 64;
        char *text = fleet_text(n, 5);
        px_hw_graph *g = load_text(text);
        free(text);
        if (!g)
            continue;
        char label[64];
        snprintf(label, sizeof label, "generated-%d 70b", n);
        ratios_one(label, g, m70);
        px_hw_graph_free(g);
    }
    px_ir_model_free(m8);
    px_ir_model_free(m70);
}

static const char *const new_fleets[] = {
    "home-lab-2x4090",       "a100-l4-100gbe",          "h100x2-l4x8",
    "m2ultra-2x4090-10gbe",  "sixteen-4-types",         "v100x8-h200",
    "mi300x2-h100x2-100gbe", "3090x4-pcie3-l4x2-10gbe", "gaudi3-h200-epyc-400gbe"};

/* One plan with the baselines: plexus's figure on the objective, the best
 * baseline's, the bound fractions and the planning time. */
static void fleet_row(const char *fleet, px_hw_graph *g, const char *model, px_ir_model *m,
                      px_plan_objective obj, double *worst_ratio, size_t *behind)
{
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    req.fallbacks = false;
    req.compare_baselines = true;
    req.objective = obj;
    px_plan *p = NULL;
    px_err err;
    uint64_t t0 = px_now_ns();
    px_status st = px_plan_search(&req, &p, &err);
    double ms = ms_since(t0);
    bool thr = obj == PX_PLAN_OBJ_THROUGHPUT;
    if (st != PX_OK) {
        printf("%-22s %-12s %-10s  infeasible (%.60s)\n", fleet, model, px_plan_objective_name(obj),
               err.msg);
        return;
    }
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    json_t *doc = px_plan_to_json(p);
    const json_t *lb = json_object_get(doc, "lower_bound");
    double mine = thr ? s.throughput_point : s.tpot_point_s;
    double best = thr ? 0 : INFINITY, ratio = INFINITY;
    const char *best_name = "-";
    size_t i;
    const json_t *b;
    json_array_foreach(json_object_get(doc, "baselines"), i, b)
    {
        if (!json_is_true(json_object_get(b, "feasible")))
            continue;
        double v = json_number_value(json_object_get(b, thr ? "throughput" : "tpot_s"));
        double r = json_number_value(
            json_object_get(b, thr ? "plexus_speedup_throughput" : "plexus_speedup_tpot"));
        if (thr ? v > best : v < best) {
            best = v;
            best_name = json_string_value(json_object_get(b, "policy"));
        }
        ratio = PX_MIN(ratio, r);
    }
    if (isfinite(ratio)) {
        *worst_ratio = PX_MIN(*worst_ratio, ratio);
        *behind += ratio < 0.999;
    }
    char mine_s[32], best_s[32];
    if (thr) {
        snprintf(mine_s, sizeof mine_s, "%.4g tok/s", mine);
        snprintf(best_s, sizeof best_s, "%.4g tok/s", best);
    } else {
        snprintf(mine_s, sizeof mine_s, "%.4g ms", mine * 1e3);
        snprintf(best_s, sizeof best_s, "%.4g ms", best * 1e3);
    }
    /* Each replica's batch: replicas may batch differently. */
    char batches[64] = "";
    size_t len = 0;
    for (uint32_t r = 0; r < s.n_replicas && len + 12 < sizeof batches; r++) {
        if (r == 6) {
            snprintf(batches + len, sizeof batches - len, ",...");
            break;
        }
        int w = snprintf(batches + len, sizeof batches - len, "%s%u", r ? "," : "",
                         px_plan_replica_workload(p, r)->batch);
        len += w > 0 ? (size_t)w : 0;
    }
    printf("%-22s %-12s %-10s %14s  %-11s %14s %7.2fx  %5.0f%% %5.0f%%  %7.0f ms  %s\n", fleet,
           model, px_plan_objective_name(obj), mine_s, best_name, isfinite(ratio) ? best_s : "-",
           isfinite(ratio) ? ratio : 0.0,
           100.0 * json_number_value(json_object_get(lb, "fraction")),
           100.0 * json_number_value(json_object_get(lb, "throughput_fraction")), ms, batches);
    json_decref(doc);
    px_plan_free(p);
}

static void new_fleets_figures(void)
{
    printf("\n== heterogeneous fleets (data/scenarios): plexus against the best baseline on the "
           "objective's metric (same cost model and workload; ratio >1: plexus better, worst of "
           "the baselines), fractions of the latency and throughput bounds, planning time\n");
    printf("%-22s %-12s %-10s %14s  %-11s %14s %8s  %6s %6s  %10s  %s\n", "fleet", "model",
           "objective", "plexus", "best base", "its figure", "ratio", "lat-b", "thr-b", "plan time",
           "batch per replica");
    static const char *const models[] = {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mixtral-8x7b"};
    double worst = INFINITY;
    size_t behind = 0;
    for (size_t fi = 0; fi < PX_ARRAY_LEN(new_fleets); fi++) {
        char *path = px_asprintf("%s/data/scenarios/%s.json", PX_SOURCE_DIR, new_fleets[fi]);
        px_hw_graph *g = NULL;
        px_err err;
        if (px_hw_graph_load(path, NULL, &g, NULL, &err) != PX_OK) {
            printf("%s: %s\n", new_fleets[fi], err.msg);
            free(path);
            continue;
        }
        free(path);
        for (size_t mi = 0; mi < PX_ARRAY_LEN(models); mi++) {
            px_ir_model *m = preset(models[mi], PX_DTYPE_COUNT_);
            if (!m)
                continue;
            fleet_row(new_fleets[fi], g, models[mi], m, PX_PLAN_OBJ_LATENCY, &worst, &behind);
            fleet_row(new_fleets[fi], g, models[mi], m, PX_PLAN_OBJ_THROUGHPUT, &worst, &behind);
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
    }
    printf("worst ratio against any feasible baseline: %.3fx; plans behind a baseline: %zu\n",
           worst, behind);

    printf("\n== exhaustive yardstick on small fleets (every ordered sequence of disjoint groups, "
           "tensor-parallel groups of any devices included, each with its best cut)\n");
    printf("%-22s %-12s %8s %14s %14s %8s %10s\n", "fleet", "model", "devices", "plexus tpot",
           "exact tpot", "gap %", "exact time");
    static const struct {
        const char *fleet;
        uint32_t max_devices;
    } small[] = {{"home-lab-2x4090", 2},        {"m2ultra-2x4090-10gbe", 3},
                 {"hetero-pair-h100-l4", 2},    {"irregular-4dev", 4},
                 {"a100-l4-100gbe", 4},         {"adversarial-fast-behind-slow-link", 4},
                 {"mi300x2-h100x2-100gbe", 4},  {"gaudi3-h200-epyc-400gbe", 3},
                 {"3090x4-pcie3-l4x2-10gbe", 3}};
    double worst_gap = -INFINITY;
    for (size_t c = 0; c < PX_ARRAY_LEN(small); c++) {
        char *path = px_asprintf("%s/data/scenarios/%s.json", PX_SOURCE_DIR, small[c].fleet);
        px_hw_graph *g = NULL;
        px_err err;
        px_status st = px_hw_graph_load(path, NULL, &g, NULL, &err);
        free(path);
        if (st != PX_OK)
            continue;
        for (int k = 0; k < 2; k++) {
            const char *name = k ? "llama-3-70b" : "llama-3-8b";
            px_ir_model *m = preset(name, PX_DTYPE_COUNT_);
            px_plan_request req;
            px_plan_request_default(&req);
            req.graph = g;
            req.model = m;
            req.fallbacks = false;
            px_plan *p = NULL;
            double exact = 0;
            uint64_t t0 = px_now_ns();
            if (m && px_plan_search(&req, &p, &err) == PX_OK &&
                px_plan_exact(&req, small[c].max_devices, &exact, &err) == PX_OK) {
                double ms = ms_since(t0);
                px_plan_summary s;
                px_plan_get_summary(p, &s);
                double gap = 100.0 * (s.tpot_point_s / exact - 1.0);
                worst_gap = PX_MAX(worst_gap, gap);
                printf("%-22.22s %-12s %8u %11.4g ms %11.4g ms %8.2f %7.0f ms\n", small[c].fleet,
                       name, small[c].max_devices, s.tpot_point_s * 1e3, exact * 1e3, gap, ms);
            } else {
                printf("%-22.22s %-12s  (%.70s)\n", small[c].fleet, name, err.msg);
            }
            px_plan_free(p);
            px_ir_model_free(m);
        }
        px_hw_graph_free(g);
    }
    printf("worst gap of plexus against the exhaustive yardstick: %.2f%% (<= 0: no layout "
           "beats the search)\n",
           worst_gap);
}

int main(void)
{
    px_log_set_level(PX_LOG_ERROR);
    uint64_t t0 = px_now_ns();
    /* PX_BENCH_PLAN=fleets runs only the heterogeneous fleets' part. */
    const char *only = getenv("PX_BENCH_PLAN");
    if (!only || strcmp(only, "fleets") != 0) {
        timing();
        optimality_gap();
        ratios();
    }
    new_fleets_figures();
    printf("\nbench_plan_search: %.1f s in all\n", ms_since(t0) / 1e3);
    return 0;
}
