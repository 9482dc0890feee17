/* The command line: one parser for every ported command (--x=v, -n5,
 * "did you mean"), help, man pages and completion generated from the same
 * tables, exit statuses, and files of the wrong kind named as such. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PX ((char *)px_test_plexus_bin())

static int plexus(char **out, char **err, char *const *args)
{
    char *argv[32] = {PX};
    int n = 1;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return px_test_run(argv, 120, out, err);
}

#define RUN(out, err, ...) plexus(out, err, (char *const[]){__VA_ARGS__, NULL})

static void test_cli_suggests_commands_and_options(void **state)
{
    (void)state;
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "plna"), 2);
    px_assert_contains(err, "unknown command \"plna\"; did you mean \"plan\"?");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "plan", "--modle", "llama-3-8b"), 2);
    px_assert_contains(err, "plexus plan: unknown option \"--modle\"; did you mean --model?");
    px_assert_contains(err, "run 'plexus plan --help' for usage");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "simulate", "--replicatoins=3"), 2);
    px_assert_contains(err, "did you mean --replications?");
    free(out);
    free(err);
    /* Values are checked by the table: what it takes and what it got. */
    assert_int_equal(RUN(&out, &err, "plan", "-m", "llama-3-8b", "-i", "x.json", "--batch=x"), 2);
    px_assert_contains(err, "--batch takes a whole number from 1 to 65536, not \"x\"");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "plan", "-m", "llama-3-8b", "-i", "x.json", "-o", "p.json"),
                     2);
    px_assert_contains(err, "-o/--output takes text or json, not \"p.json\" (a file goes with "
                            "--out FILE)");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "plan", "--inventory", "x.json"), 2);
    px_assert_contains(err, "--model FILE|PRESET is required");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "simulate", "-p", "x", "-l", "y", "--heal=yes"), 2);
    px_assert_contains(err, "--heal takes no value");
    free(out);
    free(err);
}

static void test_cli_reads_attached_values(void **state)
{
    (void)state;
    char *inv = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    char *plan = NULL, *opt_inv = NULL;
    if (asprintf(&plan, "%s/usage-plan.json", px_test_tmpdir()) < 0 ||
        asprintf(&opt_inv, "--inventory=%s", inv) < 0)
        fail_msg("asprintf");
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "plan", "--model=llama-3-8b", opt_inv, "--no-fallbacks",
                         "--out", plan, "-ojson"),
                     0);
    px_assert_contains(out, "\"schema\": \"plexus.plan/1\"");
    char want[512];
    snprintf(want, sizeof want, "plexus plan: wrote %s (the plan)", plan);
    px_assert_contains(err, want);
    free(out);
    free(err);
    /* -n2: two replications; --duration=5s. */
    assert_int_equal(RUN(&out, &err, "simulate", "-p", plan, opt_inv,
                         "--load=poisson:rate=1,prompt=64,gen=16", "-n2", "--duration=5s", "-o",
                         "json"),
                     0);
    px_assert_contains(out, "\"replications\": 2");
    free(out);
    free(err);
    free(opt_inv);
    free(plan);
    free(inv);
}

static void test_cli_help_is_generated_with_examples(void **state)
{
    (void)state;
    char *out, *err, *out2, *err2;
    assert_int_equal(RUN(&out, &err, "help", "plan"), 0);
    assert_int_equal(RUN(&out2, &err2, "plan", "--help"), 0);
    assert_string_equal(out, out2);
    px_assert_contains(out, "usage: plexus plan --model FILE|PRESET --inventory FILE [options]");
    px_assert_contains(out, "  -m, --model FILE|PRESET   GGUF or llama2.c file");
    px_assert_contains(out, "      --context T           context length planned for");
    px_assert_contains(out, "examples:\n  plexus plan --model llama-3-8b");
    free(out);
    free(err);
    free(out2);
    free(err2);
    /* A command without tables still answers `plexus help CMD`. */
    assert_int_equal(RUN(&out, &err, "help", "nodes"), 0);
    px_assert_contains(out, "usage: plexus nodes");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "help"), 0);
    px_assert_contains(out, "3 a verdict");
    free(out);
    free(err);
}

static void test_cli_man_pages_and_completion_come_from_the_tables(void **state)
{
    (void)state;
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "man", "plan"), 0);
    px_assert_contains(out, ".TH PLEXUS-PLAN 1");
    px_assert_contains(out, "\\fB\\-\\-model\\fR \\fIFILE|PRESET\\fR");
    px_assert_contains(out, ".SH EXAMPLES");
    px_assert_contains(out, ".SH EXIT STATUS");
    free(out);
    free(err);
    char *dir = NULL;
    if (asprintf(&dir, "%s/man1", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    mkdir(dir, 0755);
    assert_int_equal(RUN(&out, &err, "man", "--dir", dir), 0);
    px_assert_contains(err, "plexus-simulate.1");
    const char *pages[] = {"plexus.1", "plexus-plan.1", "plexus-simulate.1", "plexus-nodes.1"};
    for (size_t i = 0; i < PX_ARRAY_LEN(pages); i++) {
        char *p = NULL;
        if (asprintf(&p, "%s/%s", dir, pages[i]) < 0)
            fail_msg("asprintf");
        struct stat sb;
        if (stat(p, &sb) != 0 || sb.st_size < 100)
            fail_msg("%s: missing or empty", p);
        free(p);
    }
    free(out);
    free(err);
    free(dir);

    assert_int_equal(RUN(&out, &err, "completion", "bash"), 0);
    px_assert_contains(out, "complete -o filenames -F _plexus plexus");
    px_assert_contains(out, "--replications");
    px_assert_contains(out, "plan:--policy) words=\"plexus llamacpp exo gpustack single-type\"");
    px_assert_contains(out, "simulate:--output|simulate:-o) words=\"text json\"");
    char *bash_out, *bash_err;
    char *const check[] = {"bash", "-n", NULL};
    assert_int_equal(px_test_run_input(check, out, 30, &bash_out, &bash_err), 0);
    free(bash_out);
    free(bash_err);
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "completion", "zsh"), 0);
    px_assert_contains(out, "#compdef plexus");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "completion", "fish"), 2);
    free(out);
    free(err);
}

/* -o is a report format everywhere; files go with --out FILE. */
static void test_cli_o_is_a_format_and_out_a_file(void **state)
{
    (void)state;
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "calibrate", "-i", "x.json", "-m", "y.gguf", "-o", "c.json"),
                     2);
    px_assert_contains(err, "-o is a report format in plexus; a file goes with --out FILE");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "model", "synth", "-o", "s.gguf"), 2);
    px_assert_contains(err, "write the model with --out FILE");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "version", "-o", "json"), 0);
    px_assert_contains(out, "\"version\": ");
    free(out);
    free(err);
}

static void test_cli_names_a_file_of_the_wrong_kind(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "plan", "--model", model, "--inventory", model), 1);
    px_assert_contains(err, "is a GGUF model file, not an inventory");
    px_assert_contains(err, "give a model to --model, an inventory to --inventory");
    assert_null(strstr(err, "JSON syntax"));
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "plan", "--model", inv, "--inventory", inv), 1);
    px_assert_contains(err, "is a plexus.inventory/1 document, not a model");
    assert_null(strstr(err, "n_heads"));
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "plan", "--model", "llama-3-8", "--inventory", inv), 1);
    px_assert_contains(err, "llama-3-8: no such file, and no preset of that name; did you mean "
                            "llama-3-8b?");
    px_assert_contains(err, "presets: ");
    px_assert_contains(err, "llama-3-70b");
    free(out);
    free(err);
    free(inv);
    free(model);
}

/* `cmake --install` puts the command, the library, its headers and
 * pkg-config file, the man pages and the completion in place. */
static void test_cli_install_puts_everything_in_place(void **state)
{
    (void)state;
    char *prefix = NULL;
    if (asprintf(&prefix, "%s/prefix", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *out, *err;
    char *const install[] = {"cmake", "--install", PX_BINARY_DIR, "--prefix", prefix, NULL};
    int rc = px_test_run(install, 120, &out, &err);
    if (rc != 0)
        fail_msg("cmake --install failed (%d): %s %s", rc, out, err);
    free(out);
    free(err);
    const char *files[] = {"bin/plexus",
                           "include/plexus/plan.h",
                           "share/man/man1/plexus.1",
                           "share/man/man1/plexus-plan.1",
                           "share/bash-completion/completions/plexus",
                           "share/zsh/vendor-completions/_plexus"};
    for (size_t i = 0; i < PX_ARRAY_LEN(files); i++) {
        char *p = NULL;
        if (asprintf(&p, "%s/%s", prefix, files[i]) < 0)
            fail_msg("asprintf");
        struct stat sb;
        if (stat(p, &sb) != 0 || sb.st_size == 0)
            fail_msg("%s: not installed", p);
        free(p);
    }
    /* The library is found by pkg-config under the prefix. */
    char *pc = NULL, *env = NULL;
    if (asprintf(&pc, "%s/lib/pkgconfig/plexus.pc", prefix) < 0)
        fail_msg("asprintf");
    struct stat sb;
    if (stat(pc, &sb) != 0) {
        free(pc);
        if (asprintf(&pc, "%s/lib/x86_64-linux-gnu/pkgconfig/plexus.pc", prefix) < 0)
            fail_msg("asprintf");
    }
    char *dir = strdup(pc);
    *strrchr(dir, '/') = 0;
    if (asprintf(&env, "PKG_CONFIG_PATH=%s", dir) < 0)
        fail_msg("asprintf");
    char *const pkg[] = {"env", env, "pkg-config", "--cflags", "--libs", "plexus", NULL};
    rc = px_test_run(pkg, 30, &out, &err);
    if (rc != 0)
        fail_msg("pkg-config plexus failed (%d): %s %s", rc, out, err);
    px_assert_contains(out, "-lplexus");
    px_assert_contains(out, "/include");
    free(out);
    free(err);
    free(env);
    free(dir);
    free(pc);
    free(prefix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_suggests_commands_and_options),
        cmocka_unit_test(test_cli_reads_attached_values),
        cmocka_unit_test(test_cli_help_is_generated_with_examples),
        cmocka_unit_test(test_cli_man_pages_and_completion_come_from_the_tables),
        cmocka_unit_test(test_cli_o_is_a_format_and_out_a_file),
        cmocka_unit_test(test_cli_names_a_file_of_the_wrong_kind),
        cmocka_unit_test(test_cli_install_puts_everything_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
