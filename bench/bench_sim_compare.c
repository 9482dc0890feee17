/* Policy comparison benchmark: plexus's planner against each baseline on
 * every scenario pack in data/scenarios (the malicious and lying ones
 * left out), simulated under the same load and seeds, with paired
 * differences.  Prints the ratio table and the full comparison report. */
#include "base/common.h"

#include <dirent.h>

#include "plexus/sim.h"

#define SEEDS 10

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A plexus.pack/1 document naming every usable scenario inventory. */
static char *pack_text(void)
{
    char *dir = px_asprintf("%s/data/scenarios", PX_SOURCE_DIR);
    DIR *d = dir ? opendir(dir) : NULL;
    char *names[64];
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < PX_ARRAY_LEN(names)) {
        if (!px_str_ends_with(e->d_name, ".json") || strstr(e->d_name, "lying-topology"))
            continue;
        names[n++] = px_strdup(e->d_name);
    }
    if (d)
        closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\":\"plexus.pack/1\",\"scenarios\":[");
    /* The emulated fleet is sized for the tiny shared model; without it
     * that scenario is left out. */
    static const char *const tiny_names[] = {"stories260K/stories260K.gguf", "stories260K.gguf",
                                             "stories260K.bin"};
    char *tiny = NULL;
    FILE *f = NULL;
    for (size_t t = 0; !f && t < PX_ARRAY_LEN(tiny_names); t++) {
        free(tiny);
        tiny = px_asprintf("%s/models/%s", PX_SHARED_DIR, tiny_names[t]);
        f = tiny ? fopen(tiny, "rb") : NULL;
    }
    if (f)
        fclose(f);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]) - 5;
        bool emu = px_str_starts_with(names[i], "emu-");
        if (!emu || f) {
            px_strbuf_addf(&sb, "%s{\"name\":\"%.*s\",\"inventory\":\"%s/%s\"", k++ ? "," : "",
                           (int)len, names[i], dir, names[i]);
            if (emu)
                px_strbuf_addf(&sb,
                               ",\"model\":\"%s\",\"context\":256,\"prompt_tokens\":64,"
                               "\"gen_tokens\":64",
                               tiny);
            px_strbuf_adds(&sb, "}");
        }
        free(names[i]);
    }
    free(tiny);
    px_strbuf_adds(&sb, "]}");
    free(dir);
    return px_strbuf_detach(&sb, NULL);
}

static void ratio_table(const px_sim_comparison *c)
{
    printf("\n== plexus against each baseline in the simulator (%u seeds, same load and seeds; "
           "ratios > 1 favour plexus: TPOT = baseline / plexus, tok/s = plexus / baseline; "
           "paired TPOT p50 difference baseline - plexus in ms, * significant)\n",
           c->seeds);
    printf("%-36s %-12s %10s %24s %10s %10s %10s\n", "scenario", "baseline", "tpot p50",
           "paired diff ms [95% CI]", "tpot p99", "tok/s", "J/token");
    for (size_t i = 0; i < c->n_scenarios; i++) {
        const px_sim_scenario_outcome *s = &c->scenarios[i];
        const px_sim_policy_outcome *px = &s->policies[0];
        for (size_t p = 1; p < c->n_policies; p++) {
            const px_sim_policy_outcome *b = &s->policies[p];
            printf("%-36.36s %-12s", s->name, b->policy);
            if (!px->feasible || !b->feasible) {
                printf(" not compared: %.90s\n",
                       !px->feasible ? "plexus found no simulable plan" : b->reason);
                continue;
            }
            const px_sim_paired *d = &b->diff[PX_SIM_CMP_TPOT_P50];
            char ci[48];
            snprintf(ci, sizeof ci, "%+.3g [%+.3g, %+.3g]%s", d->mean * 1e3, d->lo * 1e3,
                     d->hi * 1e3, d->significant ? "*" : "");
            printf(" %9.2fx %24s %9.2fx %9.2fx %9.2fx\n",
                   b->stats[PX_SIM_CMP_TPOT_P50].mean / px->stats[PX_SIM_CMP_TPOT_P50].mean, ci,
                   b->stats[PX_SIM_CMP_TPOT_P99].mean / px->stats[PX_SIM_CMP_TPOT_P99].mean,
                   px->stats[PX_SIM_CMP_TOKENS_PER_S].mean / b->stats[PX_SIM_CMP_TOKENS_PER_S].mean,
                   b->stats[PX_SIM_CMP_JOULES_PER_TOKEN].mean /
                       px->stats[PX_SIM_CMP_JOULES_PER_TOKEN].mean);
        }
    }
}

int main(void)
{
    px_log_set_level(PX_LOG_ERROR);
    uint64_t t0 = px_now_ns();
    char *text = pack_text();
    px_sim_pack pack;
    px_err err;
    if (!text || px_sim_pack_parse(text, strlen(text), "bench-pack.json", &pack, &err) != PX_OK) {
        fprintf(stderr, "bench_sim_compare: %s\n", text ? err.msg : "out of memory");
        free(text);
        return 1;
    }
    free(text);
    const char *policies[] = {"plexus", "llamacpp", "exo", "gpustack", "single-type"};
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    opt.policies = policies;
    opt.n_policies = PX_ARRAY_LEN(policies);
    opt.seeds = SEEDS;
    px_sim_comparison c;
    if (px_sim_compare(&pack, &opt, &c, &err) != PX_OK) {
        fprintf(stderr, "bench_sim_compare: %s\n", err.msg);
        px_sim_pack_release(&pack);
        return 1;
    }
    ratio_table(&c);
    px_strbuf sb = PX_STRBUF_INIT;
    printf("\n== the full comparison (plexus compare's report)\n");
    if (px_sim_comparison_report(&c, &sb) == PX_OK)
        fputs(sb.buf, stdout);
    px_strbuf_release(&sb);
    px_sim_comparison_release(&c);
    px_sim_pack_release(&pack);
    printf("\nbench_sim_compare: %.1f s in all\n", (double)(px_now_ns() - t0) / 1e9);
    return 0;
}
