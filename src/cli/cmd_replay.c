/* plexus replay: recomputes every decision a trace recorded and compares. */
#include "cli/cli.h"

#include "plexus/heal.h"
#include "plexus/plan.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

const char px__cmd_replay_summary[] =
    "replay a trace: recompute every recorded decision and report the first divergence";

static px_cli_format R_fmt;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &R_fmt, "FORMAT",
               "report format: text (default), json or yaml", .choices = "text|json|yaml"),
    {0},
};
static const px_cli_spec spec = {
    .name = "replay",
    .synopsis = "FILE [-o text|json|yaml]",
    .about = "Reads a trace written with --trace (plexus plan, simulate, run), checks its hash\n"
             "chain, recomputes every recorded decision from the recorded inputs and compares\n"
             "it with what was recorded.  Prints \"identical\" or the first divergence: its\n"
             "sequence number, kind, name and id and what differed.",
    .opts = opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = 1,
    .more = "Exit status: 0 identical, 3 diverged, 1 refused (a malformed or edited trace, a\n"
            "model file that changed), 2 usage.",
    .examples = "plexus plan -m llama-3-8b -i inv.json --trace plan.trace && plexus replay "
                "plan.trace\n",
};
const px_cli_spec *const px__cmd_replay_specs[] = {&spec, NULL};

/* Every deriver this build has: the planner's, the simulator's and
 * those of healing real runs and healing in the simulator. */
static size_t collect_derivers(px_trace_deriver *out, size_t cap)
{
    size_t n = 0, k;
    const px_trace_deriver *d = px_plan_replay_derivers(&k);
    for (size_t i = 0; i < k && n < cap; i++)
        out[n++] = d[i];
    d = px_sim_replay_derivers(&k);
    for (size_t i = 0; i < k && n < cap; i++)
        out[n++] = d[i];
    d = px_heal_replay_derivers(&k);
    for (size_t i = 0; i < k && n < cap; i++)
        out[n++] = d[i];
    d = px_heal_sim_replay_derivers(&k);
    for (size_t i = 0; i < k && n < cap; i++)
        out[n++] = d[i];
    return n;
}

static int print_json(const px_trace_replay_report *rep, px_status st, px_cli_format fmt)
{
    json_t *doc = json_pack("{s:b, s:I, s:I, s:I, s:I}", "identical", st == PX_OK, "events",
                            (json_int_t)rep->n_events, "decisions", (json_int_t)rep->n_decisions,
                            "recomputed", (json_int_t)rep->n_identical, "not_replayable",
                            (json_int_t)rep->n_unreplayed);
    if (doc && rep->diverged)
        px_json_set(doc, "divergence",
                    json_pack("{s:I, s:s}", "seq", (json_int_t)rep->divergence_seq, "what",
                              rep->divergence));
    if (!doc) {
        fprintf(stderr, "plexus replay: out of memory\n");
        return PX_EXIT_FAIL;
    }
    int rc = px__cli_print_doc(doc, fmt);
    json_decref(doc);
    return rc;
}

int px__cmd_replay(int argc, char **argv)
{
    R_fmt = PX_CLI_TEXT;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *path = args.v[0];
    px_cli_format fmt = R_fmt;
    px_trace_deriver derivers[16];
    size_t n = collect_derivers(derivers, PX_ARRAY_LEN(derivers));
    px_trace_replay_report rep;
    px_err err;
    px_err_clear(&err);
    px_status st = px_trace_replay(path, derivers, n, NULL, &rep, &err);
    if (st != PX_OK && !rep.diverged) /* refused: unreadable, malformed or tampered */
        return px__cli_fail("replay", &err);
    if (fmt != PX_CLI_TEXT) {
        int rc = print_json(&rep, st, fmt);
        return st == PX_OK ? rc : PX_EXIT_VERDICT;
    }
    if (st == PX_OK) {
        printf("identical: %" PRIu64 " decisions recomputed, %" PRIu64 " not replayable\n",
               rep.n_identical, rep.n_unreplayed);
        return PX_EXIT_OK;
    }
    printf("diverged at event %" PRIu64 ": %s\n", rep.divergence_seq, rep.divergence);
    printf("(%" PRIu64 " decisions identical before it)\n", rep.n_identical);
    return PX_EXIT_VERDICT;
}
