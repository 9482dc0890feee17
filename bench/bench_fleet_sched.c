/* The fleet scheduler alone (no HTTP, no store): placement decisions per
 * second over 1,000 and 10,000 nodes with 100,000 queued jobs, every
 * decision's explanation kept in memory.  Jobs finish in FIFO order so the
 * fleet stays busy but not full; unplaceable jobs count as decisions too. */
#include "base/common.h"

#include "plexus/fleet.h"
#include "bench_util.h"

#include <time.h>

#ifndef N_JOBS
#define N_JOBS 100000
#endif

static const char *const node_templates[] = {
    /* CPU-only hosts. */
    "{\"name\": \"%s\", \"cpus\": 64, \"memory\": \"256 GiB\", \"node\": {\"frameworks\": "
    "[{\"name\": \"torch\", \"version\": \"2.3.1\"}, {\"name\": \"numpy\", \"version\": "
    "\"1.26.4\"}]}}",
    /* 4 x A100 40 GB, torch 2.3. */
    "{\"name\": \"%s\", \"cpus\": 64, \"memory\": \"512 GiB\", \"node\": {\"devices\": ["
    "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"A100\", "
    "\"capability\": \"8.0\", \"memory\": \"40 GB\"},"
    "{\"id\": \"gpu1\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"A100\", "
    "\"capability\": \"8.0\", \"memory\": \"40 GB\"},"
    "{\"id\": \"gpu2\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"A100\", "
    "\"capability\": \"8.0\", \"memory\": \"40 GB\"},"
    "{\"id\": \"gpu3\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"A100\", "
    "\"capability\": \"8.0\", \"memory\": \"40 GB\"}],"
    " \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.3.1\"}, {\"name\": \"torch.cuda\", "
    "\"version\": \"12.1\"}]},"
    " \"links\": [{\"from\": \"gpu0\", \"to\": \"gpu1\", \"bandwidth\": \"300 GB/s\"}, {\"from\": "
    "\"gpu2\", \"to\": \"gpu3\", \"bandwidth\": \"300 GB/s\"}]}",
    /* 8 x H100 80 GB, torch 2.4. */
    "{\"name\": \"%s\", \"cpus\": 128, \"memory\": \"2 TiB\", \"node\": {\"devices\": ["
    "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu1\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu2\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu3\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu4\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu5\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu6\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"},"
    "{\"id\": \"gpu7\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", "
    "\"capability\": \"9.0\", \"memory\": \"80 GB\"}],"
    " \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.4.0\"}, {\"name\": \"torch.cuda\", "
    "\"version\": \"12.4\"}]}}",
    /* 4 x MI250 64 GB, torch 2.2 (ROCm). */
    "{\"name\": \"%s\", \"cpus\": 64, \"memory\": \"512 GiB\", \"node\": {\"devices\": ["
    "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"amd\", \"model\": \"MI250\", "
    "\"capability\": \"gfx90a\", \"memory\": \"64 GB\"},"
    "{\"id\": \"gpu1\", \"class\": \"gpu\", \"vendor\": \"amd\", \"model\": \"MI250\", "
    "\"capability\": \"gfx90a\", \"memory\": \"64 GB\"},"
    "{\"id\": \"gpu2\", \"class\": \"gpu\", \"vendor\": \"amd\", \"model\": \"MI250\", "
    "\"capability\": \"gfx90a\", \"memory\": \"64 GB\"},"
    "{\"id\": \"gpu3\", \"class\": \"gpu\", \"vendor\": \"amd\", \"model\": \"MI250\", "
    "\"capability\": \"gfx90a\", \"memory\": \"64 GB\"}],"
    " \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.2.2\"}]}}",
    /* 1 x L4 24 GB, old torch. */
    "{\"name\": \"%s\", \"cpus\": 16, \"memory\": \"64 GiB\", \"node\": {\"devices\": ["
    "{\"id\": \"gpu0\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"L4\", "
    "\"capability\": \"8.9\", \"memory\": \"24 GB\"}],"
    " \"frameworks\": [{\"name\": \"torch\", \"version\": \"2.0.1\"}]}}",
};

#define MODEL "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

static const char *const job_templates[] = {
    "{\"command\": [\"python3\", \"etl.py\"], \"resources\": {\"cpus\": 2, \"memory\": \"4 GiB\"}}",
    "{\"command\": [\"python3\", \"train.py\"], \"resources\": {\"gpus\": 1, \"gpu_memory\": \"16 "
    "GB\"},"
    " \"frameworks\": [\"torch>=2.1\"]}",
    "{\"command\": [\"serve\"], \"resources\": {\"gpus\": 1, \"vendor\": \"nvidia\", "
    "\"capability\": \">=8.0\"},"
    " \"model\": {\"digest\": \"" MODEL "\"}}",
    "{\"command\": [\"train\"], \"resources\": {\"gpus\": 2, \"gpu_memory\": \"60 GB\"},"
    " \"frameworks\": [\"torch>=2.4\", \"torch.cuda\"]}",
    "{\"command\": [\"rocm-job\"], \"resources\": {\"gpus\": 1, \"vendor\": \"amd\"}}",
    "{\"command\": [\"tiny\"], \"resources\": {\"cpus\": 0.5}}",
    "{\"command\": [\"dist\"], \"nodes\": 4, \"resources\": {\"gpus\": 1, \"vendor\": \"nvidia\"}}",
};

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int run(size_t n_nodes)
{
    px_err err;
    px_fleet_sched *s;
    if (px_fleet_sched_new(&s, &err) != PX_OK)
        return 1;
    px_rng rng;
    px_rng_seed(&rng, 42);
    for (size_t i = 0; i < n_nodes; i++) {
        char name[32], text[4096];
        snprintf(name, sizeof name, "node%05zu", i);
        size_t t = i % PX_ARRAY_LEN(node_templates);
        snprintf(text, sizeof text, node_templates[t], name);
        json_t *reg = json_loads(text, 0, NULL);
        /* One node in ten holds the model. */
        if (reg && px_rng_below(&rng, 10) == 0)
            json_object_set_new(reg, "resident", json_pack("[s]", MODEL));
        if (!reg || px_fleet_sched_add_node(s, reg, NULL, &err) != PX_OK) {
            fprintf(stderr, "bench: node %zu: %s\n", i, err.msg);
            return 1;
        }
        json_decref(reg);
    }
    px_fleet_request *req[PX_ARRAY_LEN(job_templates)];
    for (size_t t = 0; t < PX_ARRAY_LEN(job_templates); t++) {
        json_t *spec = json_loads(job_templates[t], 0, NULL);
        if (!spec || px_fleet_request_compile(spec, &req[t], &err) != PX_OK) {
            fprintf(stderr, "bench: job template %zu: %s\n", t, err.msg);
            return 1;
        }
        json_decref(spec);
    }
    /* The queue: 100,000 jobs drawn from the templates. */
    uint8_t *queue = malloc(N_JOBS);
    px_fleet_explanation **kept = calloc(N_JOBS, sizeof *kept);
    double *lat = malloc(N_JOBS * sizeof *lat);
    char(*owner)[16] = malloc(N_JOBS * sizeof *owner);
    if (!queue || !kept || !lat || !owner)
        return 1;
    for (size_t j = 0; j < N_JOBS; j++) {
        uint64_t x = px_rng_below(&rng, 100);
        queue[j] = x < 30 ? 0 : x < 50 ? 1 : x < 65 ? 2 : x < 75 ? 3 : x < 85 ? 4 : x < 98 ? 5 : 6;
        snprintf(owner[j], sizeof owner[j], "j%zu", j);
    }
    /* Jobs finish first in, first out once this many run. */
    size_t max_running = n_nodes * 6, oldest = 0, placed = 0;
    size_t *running = malloc(N_JOBS * sizeof *running);
    size_t n_running = 0;
    uint64_t t0 = px_now_ns();
    double c0 = cpu_seconds();
    for (size_t j = 0; j < N_JOBS; j++) {
        uint64_t a = px_now_ns();
        if (px_fleet_sched_place(s, req[queue[j]], owner[j], &kept[j], &err) != PX_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
        lat[j] = (double)(px_now_ns() - a) / 1e3;
        if (px_fleet_explanation_placed(kept[j])) {
            placed++;
            running[n_running++] = j;
        }
        while (n_running - oldest > max_running)
            px_fleet_sched_release(s, owner[running[oldest++]]);
    }
    double secs = (double)(px_now_ns() - t0) / 1e9;
    double cpu = cpu_seconds() - c0;
    qsort(lat, N_JOBS, sizeof *lat, bench_cmp_double);
    /* Turning a kept explanation into JSON (what `plexus explain` asks for). */
    uint64_t e0 = px_now_ns();
    json_t *ex = px_fleet_explanation_to_json(kept[N_JOBS - 1], s);
    double explain_ms = (double)(px_now_ns() - e0) / 1e6;
    size_t n_rejected = json_array_size(json_object_get(ex, "rejected")) +
                        (size_t)json_integer_value(json_object_get(ex, "rejected_more"));
    json_decref(ex);
    printf("nodes %6zu  jobs %d  decisions/s %9.0f (per CPU second %.0f)  placed %zu (%.0f%%)  per "
           "decision p50 %.1f us"
           "  p99 %.1f us  explanations kept %d  (last one: %zu nodes rejected, to JSON %.2f ms)\n",
           n_nodes, N_JOBS, N_JOBS / secs, N_JOBS / cpu, placed, 100.0 * (double)placed / N_JOBS,
           lat[N_JOBS / 2], lat[N_JOBS * 99 / 100], N_JOBS, n_rejected, explain_ms);
    fflush(stdout);
    for (size_t j = 0; j < N_JOBS; j++)
        px_fleet_explanation_free(kept[j]);
    for (size_t t = 0; t < PX_ARRAY_LEN(job_templates); t++)
        px_fleet_request_free(req[t]);
    px_fleet_sched_free(s);
    free(queue);
    free(kept);
    free(lat);
    free(owner);
    free(running);
    return 0;
}

int main(void)
{
    printf("fleet scheduler: filter + score + explanation per decision (aim: >= 10,000/s at "
           "10,000 nodes)\n");
    if (run(1000) != 0 || run(10000) != 0)
        return 1;
    return 0;
}
