/* What the command does on a terminal and off one: long work reports its
 * progress on stderr when stderr is a terminal (a pseudo-terminal here) and
 * never when it is a pipe; delete asks on a terminal and wants --yes off
 * one.  (Uploads: test_fleet_deploy.) */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#define PLX (char *)px_test_plexus_bin()

/* Runs argv on a pseudo-terminal and then with pipes; the terminal shows
 * `progress` (and the line is cleared after), the pipes show neither. */
static void progress_only_on_a_terminal(char **argv, const char *progress)
{
    char *tty = NULL, *out = NULL, *err = NULL;
    int rc = px_test_run_pty(argv, NULL, NULL, 300, &tty);
    if (rc != 0)
        fail_msg("%s %s on a terminal: exit %d: %s", argv[1], argv[2], rc, tty);
    if (!strstr(tty, progress))
        fail_msg("%s %s on a terminal shows no \"%s\": %s", argv[1], argv[2], progress, tty);
    px_assert_contains(tty, "\r\033[K");
    free(tty);
    rc = px_test_run(argv, 300, &out, &err);
    if (rc != 0)
        fail_msg("%s %s: exit %d: %s", argv[1], argv[2], rc, err);
    if (strstr(err, progress) || strstr(err, "\033") || strstr(out, "\033"))
        fail_msg("%s %s into a pipe shows its progress: %s", argv[1], argv[2], err);
    free(out);
    free(err);
}

static void test_simulate_reports_replications_on_a_terminal(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *plan = px_asprintf("%s/plan.json", px_test_tmpdir());
    char *mk[] = {PLX, "plan", "--model", "llama-3-8b", "--inventory", inv, "--out", plan, NULL};
    char *err = NULL;
    int rc = px_test_run(mk, 120, NULL, &err);
    if (rc != 0)
        fail_msg("plan: exit %d: %s", rc, err);
    free(err);
    char *argv[] = {PLX,           "simulate", "--plan",         plan,
                    "--inventory", inv,        "--load",         "poisson:rate=2,prompt=64,gen=16",
                    "--duration",  "20s",      "--replications", "40",
                    NULL};
    progress_only_on_a_terminal(argv, "plexus simulate: replication ");
    free(inv);
    free(plan);
}

static void test_model_synth_reports_on_a_terminal(void **state)
{
    (void)state;
    char *out = px_asprintf("%s/synth.gguf", px_test_tmpdir());
    char *argv[] = {PLX, "model",  "synth", "--dim", "64", "--layers",
                    "2", "--seed", "3",     "--out", out,  NULL};
    progress_only_on_a_terminal(argv, "plexus model synth: writing ");
    free(out);
}

static void test_compare_reports_its_steps_on_a_terminal(void **state)
{
    (void)state;
    char *pack = px_test_source_path("data/packs/hetero.json");
    char *argv[] = {PLX,       "compare", "--pack", pack, "--policies", "plexus,llamacpp",
                    "--seeds", "2",       NULL};
    progress_only_on_a_terminal(argv, "plexus compare: ");
    free(pack);
}

/* delete checks its confirmation before it reaches any server: off a
 * terminal it refuses without --yes; on one it asks, and "n" (or nothing)
 * deletes nothing.  A "y" goes on to the server (none listens here). */
static void test_delete_asks_on_a_terminal_and_wants_yes_off_one(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    char *argv[] = {PLX, "delete", "job", "j-000001", "--server", "http://127.0.0.1:9", NULL};
    assert_int_equal(px_test_run(argv, 30, &out, &err), 2);
    px_assert_contains(err, "stdin is not a terminal to confirm on: pass --yes to delete job "
                            "j-000001");
    free(out);
    free(err);
    assert_int_equal(px_test_run_pty(argv, "[y/N] ", "n\n", 30, &out), 1);
    px_assert_contains(out, "delete job j-000001? [y/N] ");
    px_assert_contains(out, "nothing deleted");
    free(out);
    assert_int_equal(px_test_run_pty(argv, "[y/N] ", "y\n", 60, &out), 1);
    px_assert_contains(out, "127.0.0.1:9");
    assert_null(strstr(out, "nothing deleted"));
    free(out);
    char *many[] = {
        PLX, "delete", "job/j-000001", "deployment/chat", "--server", "http://127.0.0.1:9", NULL};
    assert_int_equal(px_test_run_pty(many, "[y/N] ", "\n", 30, &out), 1);
    px_assert_contains(out, "delete job j-000001, deployment chat? [y/N] ");
    free(out);
    /* Usage: a kind first, and "did you mean". */
    char *bad[] = {PLX, "delete", "jbo", "j-000001", NULL};
    assert_int_equal(px_test_run(bad, 30, &out, &err), 2);
    px_assert_contains(err,
                       "\"jbo\" is not a kind to delete: job or deployment (did you mean job?)");
    free(out);
    free(err);
    char *bare[] = {PLX, "delete", "job/j-000001", "j-000002", "--yes", NULL};
    assert_int_equal(px_test_run(bare, 30, &out, &err), 2);
    px_assert_contains(err, "\"j-000002\" has no kind");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simulate_reports_replications_on_a_terminal),
        cmocka_unit_test(test_model_synth_reports_on_a_terminal),
        cmocka_unit_test(test_compare_reports_its_steps_on_a_terminal),
        cmocka_unit_test(test_delete_asks_on_a_terminal_and_wants_yes_off_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
