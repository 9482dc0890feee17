/*
 * The fixture of the tests that drive `plexus run` on the real tiny
 * model: stories260K planned for throughput on the emu-small inventory
 * (this machine's cpu and two emulated accelerators) by `plexus plan`,
 * and run_plexus, which runs the plexus binary under test.  Without the
 * shared model the group set-up leaves `model` NULL and every test skips.
 * Included by tests/integration/test_heal_run_cli.c and
 * test_heal_run_launched.c.
 */
#ifndef PX_STORIES_RUN_H
#define PX_STORIES_RUN_H

#include "px_test.h"

#include <string.h>

static char *model, *inventory, *plan;

/* Runs `plexus ARGS...` (args NULL-ended) for at most 180 s; returns its
 * exit status, its output in *out and its errors in *errs (either may be
 * NULL). */
static int run_plexus(const char *const *args, char **out, char **errs)
{
    const char *argv[40];
    size_t n = 0;
    argv[n++] = px_test_plexus_bin();
    for (size_t i = 0; args[i] && n + 1 < PX_ARRAY_LEN(argv); i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return px_test_run((char *const *)argv, 180, out, errs);
}

static int setup(void **state)
{
    (void)state;
    model = px_test_shared_model("stories260K.gguf");
    FILE *f = model ? fopen(model, "rb") : NULL;
    if (!f) {
        free(model);
        model = NULL;
        return 0;
    }
    fclose(f);
    inventory = px_test_source_path("data/scenarios/emu-small.json");
    const char *args[] = {"plan",        "--model",    model, "--inventory", inventory,
                          "--objective", "throughput", "-o",  "json",        NULL};
    char *out = NULL;
    if (run_plexus(args, &out, NULL) != 0)
        fail_msg("plexus plan failed");
    plan = px_asprintf("%s/plan.json", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_write_file(plan, out, strlen(out), &err), &err);
    free(out);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(model);
    free(inventory);
    free(plan);
    return 0;
}

#endif
