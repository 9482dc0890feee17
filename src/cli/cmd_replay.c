/* plexus replay: recomputes every decision a trace recorded and compares. */
#include "cli/cli.h"

#include "plexus/heal.h"
#include "plexus/plan.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

const char px__cmd_replay_summary[] =
    "replay a trace: recompute every recorded decision and report the first divergence";

static void usage(void)
{
    printf("usage: plexus replay FILE [-o text|json]\n"
           "\n"
           "Reads a trace written with --trace (plexus plan, simulate, run), checks its\n"
           "hash chain, recomputes every recorded decision from the recorded inputs and\n"
           "compares it with what was recorded.  Prints \"identical\" or the first\n"
           "divergence: its sequence number, kind, name and id and what differed.\n"
           "Exit status: 0 identical, 3 diverged, 1 refused (a malformed or edited trace,\n"
           "a model file that changed), 2 usage.\n"
           "\n"
           "options:\n"
           "  -o text|json   report format (default text)\n");
}

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

static int print_json(const px_trace_replay_report *rep, px_status st)
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
    int rc = px__cli_print_json(doc);
    json_decref(doc);
    return rc;
}

int px__cmd_replay(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage();
        return PX_EXIT_OK;
    }
    const char *path = NULL;
    px_cli_format fmt = PX_CLI_TEXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc)
                return px__cli_usage_error("replay", "%s needs a value", a);
            if (!px__cli_parse_format("replay", argv[++i], &fmt))
                return PX_EXIT_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return px__cli_usage_error("replay", "unknown option \"%s\"", a);
        } else if (path) {
            return px__cli_usage_error("replay", "one trace at a time, not also \"%s\"", a);
        } else {
            path = a;
        }
    }
    if (!path)
        return px__cli_usage_error("replay", "the trace FILE is required");

    px_trace_deriver derivers[16];
    size_t n = collect_derivers(derivers, PX_ARRAY_LEN(derivers));
    px_trace_replay_report rep;
    px_err err;
    px_err_clear(&err);
    px_status st = px_trace_replay(path, derivers, n, NULL, &rep, &err);
    if (st != PX_OK && !rep.diverged) /* refused: unreadable, malformed or tampered */
        return px__cli_fail("replay", &err);
    if (fmt == PX_CLI_JSON) {
        int rc = print_json(&rep, st);
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
