/* plexus compare: runs planning policies on the same scenarios in the
 * simulator and compares them pair by pair. */
#include "cli/cli.h"

#include "plexus/plan.h"
#include "plexus/sim.h"

const char px__cmd_compare_summary[] =
    "compare planning policies on a scenario pack (paired, with confidence intervals)";

static void usage(void)
{
    printf("usage: plexus compare --pack FILE [--policies A,B,...] [--seeds N] [options]\n"
           "\n"
           "Plans every scenario of the pack with every policy, simulates each plan under\n"
           "the same load, faults and seeds 1..N, and reports per scenario and overall:\n"
           "TPOT p50/p99, TTFT p99, tokens/s, J/token, $/Mtoken and failed requests with\n"
           "95%% intervals, paired differences against the first policy (same seed, same\n"
           "scenario), model error (predicted vs simulated TPOT) and policy error (regret\n"
           "against the best policy, predicted gap to the exact optimum on small fleets).\n"
           "The same inputs give byte-identical output.\n"
           "\n"
           "options:\n"
           "  --pack FILE          plexus.pack/1 JSON (docs/formats/pack.md) or one\n"
           "                       plexus.inventory/1 file (data/scenarios/*.json)\n"
           "  --policies LIST      comma-separated, the first is the reference\n"
           "                       (default plexus,llamacpp,exo,gpustack,single-type)\n"
           "  --seeds N            simulate seeds 1..N (default 10, at most 1000)\n"
           "  --faults FILE        plexus.faults/1 file for every scenario (replaces the pack's)\n"
           "  --duration T         simulated time per seed (default: sized to the load)\n"
           "  --metric NAME        figure for regret, \"best\" and the plot in every scenario:\n"
           "                       tpot_p50_s, tpot_p99_s, ttft_p99_s, tokens_per_s,\n"
           "                       joules_per_token, usd_per_mtoken, failed (default: each\n"
           "                       scenario's objective's own figure; the plot tpot_p50_s)\n"
           "  --no-random-failures draw no failures from MTBFs (faults files only)\n"
           "  --exact-max N        exact yardstick on fleets of at most N devices (default 6,\n"
           "                       at most 8: enumeration grows as N!; 0: off)\n"
           "  -o text|json         report format (default text; json: plexus.compare/1)\n"
           "  --out FILE           also write the plexus.compare/1 JSON to FILE\n"
           "  --svg FILE           box and strip plot of the metric over seeds\n");
}

static const char *const all_policies[] = {"plexus", "llamacpp", "exo", "gpustack", "single-type"};

/* Splits "a,b,c" into at most PX_SIM_COMPARE_MAX_POLICIES names, pointing
 * into buf (a copy of text). */
static bool split_policies(const char *text, char *buf, size_t cap, const char **names, size_t *n)
{
    if (px_strlcpy(buf, text, cap) >= cap) {
        px__cli_usage_error("compare", "--policies is too long");
        return false;
    }
    *n = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (!*p) {
            px__cli_usage_error("compare", "--policies has an empty name in \"%s\"", text);
            return false;
        }
        if (*n == PX_SIM_COMPARE_MAX_POLICIES) {
            px__cli_usage_error("compare", "--policies: at most %d policies",
                                PX_SIM_COMPARE_MAX_POLICIES);
            return false;
        }
        if (!px_plan_policy_exists(p)) {
            px__cli_usage_error("compare",
                                "unknown policy \"%s\"; use plexus, llamacpp, exo, gpustack or "
                                "single-type",
                                p);
            return false;
        }
        names[(*n)++] = p;
        if (!comma)
            return true;
        p = comma + 1;
    }
}

static bool parse_seeds(const char *arg, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v < 1 || v > PX_SIM_COMPARE_MAX_SEEDS) {
        px__cli_usage_error("compare", "--seeds takes a whole number from 1 to %d, not \"%s\"",
                            PX_SIM_COMPARE_MAX_SEEDS, arg);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static int write_outputs(const px_sim_comparison *cmp, px_cli_format fmt, const char *out_path,
                         const char *svg_path, px_sim_cmp_metric metric)
{
    px_err err;
    px_err_clear(&err);
    json_t *doc = NULL;
    char *text = NULL;
    px_strbuf sb = PX_STRBUF_INIT;
    int rc = PX_EXIT_FAIL;
    if (fmt == PX_CLI_JSON || out_path) {
        doc = px_sim_comparison_to_json(cmp);
        text = doc ? px_json_dump_canonical(doc) : NULL;
        if (!text) {
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (out_path && px_write_file(out_path, text, strlen(text), &err) != PX_OK)
        goto fail;
    if (svg_path) {
        if (px_sim_comparison_svg(cmp, metric, &sb) != PX_OK) {
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        if (px_write_file(svg_path, sb.buf, sb.len, &err) != PX_OK)
            goto fail;
        px_strbuf_reset(&sb);
    }
    if (fmt == PX_CLI_JSON) {
        fputs(text, stdout);
        fputc('\n', stdout);
    } else {
        if (px_sim_comparison_report(cmp, &sb) != PX_OK) {
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        fputs(sb.buf, stdout);
    }
    rc = PX_EXIT_OK;
    goto done;
fail:
    rc = px__cli_fail("compare", &err);
done:
    px_strbuf_release(&sb);
    free(text);
    json_decref(doc);
    return rc;
}

int px__cmd_compare(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage();
        return PX_EXIT_OK;
    }
    const char *pack_path = NULL, *out_path = NULL, *svg_path = NULL;
    const char *names[PX_SIM_COMPARE_MAX_POLICIES];
    char names_buf[1024];
    px_cli_format fmt = PX_CLI_TEXT;
    px_sim_compare_options opt;
    px_sim_compare_options_default(&opt);
    opt.policies = all_policies;
    opt.n_policies = PX_ARRAY_LEN(all_policies);
    px_err err;
    px_err_clear(&err);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(a, "--no-random-failures")) {
            opt.random_failures = false;
            takes = false;
        } else if (!v && a[0] == '-') {
            return px__cli_usage_error("compare", "%s needs a value", a);
        } else if (!strcmp(a, "--pack")) {
            pack_path = v;
        } else if (!strcmp(a, "--policies")) {
            if (!split_policies(v, names_buf, sizeof names_buf, names, &opt.n_policies))
                return PX_EXIT_USAGE;
            opt.policies = names;
        } else if (!strcmp(a, "--seeds")) {
            if (!parse_seeds(v, &opt.seeds))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--exact-max")) {
            char *end;
            errno = 0;
            unsigned long x = strtoul(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-' || x > 8)
                return px__cli_usage_error("compare",
                                           "--exact-max takes a whole number from 0 to 8, not "
                                           "\"%s\"",
                                           v);
            opt.exact_max_devices = (uint32_t)x;
        } else if (!strcmp(a, "--faults")) {
            opt.faults = v;
        } else if (!strcmp(a, "--duration")) {
            px_qty q;
            if (px_qty_parse(v, PX_DIM_TIME, &q, NULL) != PX_OK || !(q.value > 0))
                return px__cli_usage_error("compare",
                                           "--duration takes a time such as 60s, not \"%s\"", v);
            opt.duration_s = q.value;
        } else if (!strcmp(a, "--metric")) {
            if (px_sim_cmp_metric_parse(v, &opt.metric, &err) != PX_OK)
                return px__cli_usage_error("compare", "%s", err.msg);
            opt.metric_by_objective = false;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!px__cli_parse_format("compare", v, &fmt))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--out")) {
            out_path = v;
        } else if (!strcmp(a, "--svg")) {
            svg_path = v;
        } else {
            return px__cli_usage_error("compare", "unknown argument \"%s\"", a);
        }
        if (takes)
            i++;
    }
    if (!pack_path)
        return px__cli_usage_error("compare", "--pack FILE is required");

    px_sim_pack pack;
    if (px_sim_pack_load(pack_path, &pack, &err) != PX_OK)
        return px__cli_fail("compare", &err);
    px_sim_comparison cmp;
    int rc;
    if (px_sim_compare(&pack, &opt, &cmp, &err) != PX_OK)
        rc = px__cli_fail("compare", &err);
    else
        rc = write_outputs(&cmp, fmt, out_path, svg_path, opt.metric);
    px_sim_comparison_release(&cmp);
    px_sim_pack_release(&pack);
    return rc;
}
