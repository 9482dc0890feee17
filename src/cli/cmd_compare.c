/* plexus compare: runs planning policies on the same scenarios in the
 * simulator and compares them pair by pair. */
#include "cli/cli.h"

#include "plexus/plan.h"
#include "plexus/sim.h"

const char px__cmd_compare_summary[] =
    "compare planning policies on a scenario pack (paired, with confidence intervals)";

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
    if (out_path) {
        if (px_write_file(out_path, text, strlen(text), &err) != PX_OK)
            goto fail;
        px__cli_wrote("compare", out_path, "the comparison");
    }
    if (svg_path) {
        if (px_sim_comparison_svg(cmp, metric, &sb) != PX_OK) {
            px_err_set(&err, PX_ENOMEM, "out of memory");
            goto fail;
        }
        if (px_write_file(svg_path, sb.buf, sb.len, &err) != PX_OK)
            goto fail;
        px__cli_wrote("compare", svg_path, "the picture");
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

typedef struct compare_args {
    const char *pack, *out, *svg, *policies, *metric;
    bool no_random_failures;
    px_cli_format fmt;
    px_sim_compare_options opt;
} compare_args;

static compare_args C;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("pack", 0, PX_CLI_STR, &C.pack, "FILE",
               "plexus.pack/1 JSON (docs/formats/pack.md) or one\n"
               "plexus.inventory/1 file (data/scenarios/*.json)",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("policies", 0, PX_CLI_STR, &C.policies, "LIST",
               "comma-separated, the first is the reference\n"
               "(default plexus,llamacpp,exo,gpustack,single-type)"),
    PX_CLI_OPT("seeds", 0, PX_CLI_U32, &C.opt.seeds, "N", "simulate seeds 1..N (default 10)",
               .lo = 1, .hi = PX_SIM_COMPARE_MAX_SEEDS),
    PX_CLI_OPT("faults", 0, PX_CLI_STR, &C.opt.faults, "FILE",
               "plexus.faults/1 file for every scenario (replaces the\npack's)"),
    PX_CLI_OPT("duration", 0, PX_CLI_TIME, &C.opt.duration_s, "TIME",
               "simulated time per seed (default: sized to the load)", .lo = 1e-9),
    PX_CLI_OPT("metric", 0, PX_CLI_STR, &C.metric, "NAME",
               "figure for regret, \"best\" and the plot in every\n"
               "scenario: tpot_p50_s, tpot_p99_s, ttft_p99_s,\n"
               "tokens_per_s, joules_per_token, usd_per_mtoken, failed\n"
               "(default: each scenario's objective's own figure; the\n"
               "plot tpot_p50_s)"),
    PX_CLI_OPT("no-random-failures", 0, PX_CLI_FLAG, &C.no_random_failures, NULL,
               "draw no failures from MTBFs (faults files only)"),
    PX_CLI_OPT("exact-max", 0, PX_CLI_U32, &C.opt.exact_max_devices, "N",
               "exact yardstick on fleets of at most N devices (default\n"
               "6, at most 8: enumeration grows as N!; 0: off)",
               .hi = 8),
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &C.fmt, "FORMAT",
               "report format (default text; json: plexus.compare/1)"),
    PX_CLI_OPT("out", 0, PX_CLI_STR, &C.out, "FILE",
               "also write the plexus.compare/1 JSON to FILE"),
    PX_CLI_OPT("svg", 0, PX_CLI_STR, &C.svg, "FILE", "box and strip plot of the metric over seeds"),
    {0},
};

static const px_cli_spec spec = {
    .name = "compare",
    .synopsis = "--pack FILE [--policies A,B,...] [--seeds N] [options]",
    .about = "Plans every scenario of the pack with every policy, simulates each plan under the\n"
             "same load, faults and seeds 1..N, and reports per scenario and overall: TPOT\n"
             "p50/p99, TTFT p99, tokens/s, J/token, $/Mtoken and failed requests with 95%\n"
             "intervals, paired differences against the first policy (same seed, same\n"
             "scenario), model error (predicted vs simulated TPOT) and policy error (regret\n"
             "against the best policy, predicted gap to the exact optimum on small fleets).\n"
             "The same inputs give byte-identical output.  Progress goes to stderr when it is\n"
             "a terminal.",
    .opts = opts,
    .examples = "plexus compare --pack data/packs/hetero.json --seeds 20\n"
                "plexus compare --pack data/scenarios/hetero-pair-h100-l4.json \\\n"
                "    --policies plexus,llamacpp --out cmp.json --svg cmp.svg\n",
};
const px_cli_spec *const px__cmd_compare_specs[] = {&spec, NULL};

static void on_progress(void *ctx, const char *step)
{
    (void)ctx;
    px__cli_progress("compare", "%s", step);
}

int px__cmd_compare(int argc, char **argv)
{
    const char *names[PX_SIM_COMPARE_MAX_POLICIES];
    char names_buf[1024];
    memset(&C, 0, sizeof C);
    px_sim_compare_options_default(&C.opt);
    C.opt.policies = all_policies;
    C.opt.n_policies = PX_ARRAY_LEN(all_policies);
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    px_sim_compare_options opt = C.opt;
    px_cli_format fmt = C.fmt;
    const char *pack_path = C.pack, *out_path = C.out, *svg_path = C.svg;
    px_err err;
    px_err_clear(&err);
    if (C.no_random_failures)
        opt.random_failures = false;
    if (C.policies) {
        if (!split_policies(C.policies, names_buf, sizeof names_buf, names, &opt.n_policies))
            return PX_EXIT_USAGE;
        opt.policies = names;
    }
    if (C.metric) {
        if (px_sim_cmp_metric_parse(C.metric, &opt.metric, &err) != PX_OK)
            return px__cli_usage_error("compare", "%s", err.msg);
        opt.metric_by_objective = false;
    }
    opt.progress = on_progress;

    px_sim_pack pack;
    if (px_sim_pack_load(pack_path, &pack, &err) != PX_OK)
        return px__cli_fail("compare", &err);
    px_sim_comparison cmp;
    int rc;
    px_status st = px_sim_compare(&pack, &opt, &cmp, &err);
    px__cli_progress_done();
    if (st != PX_OK)
        rc = px__cli_fail("compare", &err);
    else
        rc = write_outputs(&cmp, fmt, out_path, svg_path, opt.metric);
    px_sim_comparison_release(&cmp);
    px_sim_pack_release(&pack);
    return rc;
}
