/* Events per second of the simulator's engine, and one simulated run's
 * summary.  A pipeline-heavy plan (4 replicas x 4 stages, 4 micro-batches,
 * hops sharing contention domains) under a saturating Poisson load keeps
 * every kind of event busy: arrivals, stage completions, transfer starts
 * and processor-sharing completions. */
#include "base/common.h"

#include "plexus/sim.h"

enum { N_REP = 4, N_STAGE = 4 };

int main(void)
{
    px_sim_device devices[N_REP * N_STAGE];
    px_sim_link links[2];
    px_sim_replica replicas[N_REP];
    px_sim_stage stages[N_REP][N_STAGE];
    memset(devices, 0, sizeof devices);
    memset(stages, 0, sizeof stages);
    for (int d = 0; d < N_REP * N_STAGE; d++) {
        snprintf(devices[d].id, sizeof devices[d].id, "n%d.gpu%d", d / N_STAGE, d % N_STAGE);
        devices[d].power_active_w = 700;
        devices[d].power_idle_w = 70;
        devices[d].thermal_limit_k = 360;
        devices[d].thermal_tau_s = 20;
        devices[d].usd_per_hour = 2.5;
    }
    links[0] = (px_sim_link){.id = "tor-a", .bandwidth = 12.5e9};
    links[1] = (px_sim_link){.id = "tor-b", .bandwidth = 12.5e9};
    for (int r = 0; r < N_REP; r++) {
        replicas[r] = (px_sim_replica){
            .stages = stages[r], .n_stages = N_STAGE, .batch = 32, .micro_batches = 4};
        for (int i = 0; i < N_STAGE; i++) {
            px_sim_stage *s = &stages[r][i];
            s->devices[0] = (uint32_t)(r * N_STAGE + i);
            s->n_devices = 1;
            s->decode_s = 0.004;
            s->decode_p99_s = 0.005;
            s->prefill_s = 0.08;
            s->prefill_p99_s = 0.1;
            s->weight_fraction = 0.7;
            s->link = i + 1 < N_STAGE ? (uint32_t)(r % 2) : PX_SIM_NONE;
            s->xfer_bytes = 8 * 4096 * 2;
            s->xfer_latency_s = 10e-6;
            s->next_device = i + 1 < N_STAGE ? (uint32_t)(r * N_STAGE + i + 1) : PX_SIM_NONE;
        }
    }
    px_sim_plan plan = {.id = "bench",
                        .devices = devices,
                        .n_devices = N_REP * N_STAGE,
                        .links = links,
                        .n_links = 2,
                        .replicas = replicas,
                        .n_replicas = N_REP,
                        .context = 4096,
                        .prompt_tokens = 512,
                        .gen_tokens = 256};
    px_sim_load load;
    px_err err;
    if (px_sim_load_parse("poisson:rate=25,prompt=uniform:128-1024,gen=exp:200", &load, &err)) {
        fprintf(stderr, "bench_sim_events: %s\n", err.msg);
        return 1;
    }
    px_sim_options opt;
    px_sim_options_default(&opt);
    opt.duration_s = 600;
    opt.replications = 3;
    opt.random_failures = false;
    uint64_t t0 = px_now_ns();
    px_sim_result res;
    if (px_sim_run(&plan, &load, NULL, &opt, &res, &err) != PX_OK) {
        fprintf(stderr, "bench_sim_events: %s\n", err.msg);
        return 1;
    }
    double wall = (double)(px_now_ns() - t0) / 1e9;
    double events = 0;
    for (uint32_t r = 0; r < res.n_replications; r++)
        events += res.runs[r].events;
    printf("bench_sim_events: %.0f events in %.3f s of wall time: %.3g events/s "
           "(%u replications of %g simulated s)\n",
           events, wall, events / wall, res.n_replications, opt.duration_s);
    px_strbuf sb = PX_STRBUF_INIT;
    if (px_sim_result_report(&res, &plan, &sb) == PX_OK)
        fputs(sb.buf, stdout);
    px_strbuf_release(&sb);
    px_sim_result_release(&res);
    px_sim_load_release(&load);
    return 0;
}
