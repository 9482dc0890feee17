/* The command line: one parser for every ported command (--x=v, -n5,
 * "did you mean"), help, man pages and completion generated from the same
 * tables, exit statuses, and files of the wrong kind named as such. */
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

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
    /* Every duration reads the same way: with a unit or bare seconds (the
     * command then fails only at the missing server). */
    char *times[] = {"90s", "2min", "60", "0.5"};
    for (size_t i = 0; i < PX_ARRAY_LEN(times); i++) {
        assert_int_equal(RUN(&out, &err, "submit", "--wait", "--timeout", times[i], "--server",
                             "http://127.0.0.1:9", "--", "true"),
                         1);
        assert_null(strstr(err, "--timeout"));
        free(out);
        free(err);
    }
    assert_int_equal(RUN(&out, &err, "submit", "--wait", "--timeout", "60x", "--", "true"), 2);
    px_assert_contains(err,
                       "--timeout takes a time such as 90s, 2min or 30 (seconds), not \"60x\"");
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
    /* `plexus help CMD` is the command's own help. */
    assert_int_equal(RUN(&out, &err, "help", "nodes"), 0);
    px_assert_contains(out, "usage: plexus nodes");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "help"), 0);
    px_assert_contains(out, "3 a verdict");
    /* Every command listed, those with actions too, has examples in its
     * help, the same through `plexus help CMD`. */
    const char *p = strstr(out, "\ncommands:\n");
    assert_non_null(p);
    size_t n_cmds = 0;
    for (p = strchr(p + 1, '\n') + 1; !strncmp(p, "  ", 2); p = strchr(p, '\n') + 1) {
        char name[32];
        assert_int_equal(sscanf(p, " %31s", name), 1);
        n_cmds++;
        assert_int_equal(RUN(&out2, &err2, name, "--help"), 0);
        if (!strstr(out2, "\nexamples:\n  ") && strcmp(name, "worker") != 0)
            fail_msg("plexus %s --help has no examples:\n%s", name, out2);
        char *via_help, *e3;
        assert_int_equal(RUN(&via_help, &e3, "help", name), 0);
        assert_string_equal(via_help, out2);
        free(via_help);
        free(e3);
        free(out2);
        free(err2);
    }
    assert_true(n_cmds >= 30);
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
    px_assert_contains(err, "-o is a report format in plexus; a file goes with --out FILE");
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
    /* model inspect too. */
    assert_int_equal(RUN(&out, &err, "model", "inspect", "llama-3-8bb"), 1);
    px_assert_contains(err, "llama-3-8bb: no such file, and no preset of that name; did you mean "
                            "llama-3-8b?");
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

/* Every command but the internal worker reads its command line from a
 * table: a misspelled option gets the same error and suggestion
 * everywhere, and every help page has examples. */
static void test_cli_every_command_reads_a_table(void **state)
{
    (void)state;
    static const char *const cmds[][2] = {
        {"run", NULL},         {"generate", NULL},   {"compare", NULL}, {"contract", "check"},
        {"inventory", "show"}, {"model", "inspect"}, {"serve", NULL},   {"server", NULL},
        {"agent", NULL},       {"up", NULL},         {"submit", NULL},  {"jobs", NULL},
        {"logs", NULL},        {"cancel", NULL},     {"delete", NULL},  {"nodes", NULL},
        {"explain", NULL},     {"artifacts", NULL},  {"replay", NULL},  {"config", "use-context"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cmds); i++) {
        char *out, *err;
        char *argv[8] = {PX, (char *)cmds[i][0]};
        int n = 2;
        if (cmds[i][1])
            argv[n++] = (char *)cmds[i][1];
        argv[n++] = "--hlep";
        argv[n] = NULL;
        int rc = px_test_run(argv, 60, &out, &err);
        if (rc != 2 || !strstr(err, "unknown option \"--hlep\"; did you mean --help?"))
            fail_msg("plexus %s %s --hlep: exit %d: %s", cmds[i][0], cmds[i][1] ? cmds[i][1] : "",
                     rc, err);
        free(out);
        free(err);
        argv[n - 1] = "--help";
        if (px_test_run(argv, 60, &out, &err) != 0 || !strstr(out, "\nexamples:\n  plexus "))
            fail_msg("plexus %s --help: no examples:\n%s", cmds[i][0], out);
        free(out);
        free(err);
    }
    /* The generated completion knows the ported commands' options. */
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "completion", "bash"), 0);
    px_assert_contains(out, "--idempotency-key");
    px_assert_contains(out, "logs:--stream) words=\"stdout stderr\"");
    px_assert_contains(out, "jobs:--output|jobs:-o) words=\"text json yaml\"");
    free(out);
    free(err);
}

/* -o yaml writes the JSON document's tree: a YAML reader gives back the
 * very document -o json prints, strings YAML would read as something
 * else included. */
static void test_cli_yaml_is_the_json_tree(void **state)
{
    (void)state;
    char *inv = NULL;
    if (asprintf(&inv, "%s/yaml-inv.json", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *src = px_test_source_path("data/scenarios/hetero-pair-h100-l4.json");
    json_t *doc = json_load_file(src, 0, NULL);
    assert_non_null(doc);
    /* Strings a YAML reader would take for a boolean, a number, null, a
     * comment, a mapping or a sequence if written plainly. */
    json_object_set_new(doc, "description",
                        json_string("yes: - #1 null 0x1F \"q\" 'a' \\ tab\tend\nline2 é"));
    assert_int_equal(json_dump_file(doc, inv, JSON_INDENT(2)), 0);
    json_decref(doc);
    char *json_out, *yaml_out, *err;
    assert_int_equal(RUN(&json_out, &err, "inventory", "export", inv, "-o", "json"), 0);
    free(err);
    assert_int_equal(RUN(&yaml_out, &err, "inventory", "export", inv, "-o", "yaml"), 0);
    free(err);
    px_assert_contains(yaml_out, "\nlinks:\n  - bandwidth:\n");
    px_assert_contains(yaml_out, "bidirectional: true\n");
    char *const py[] = {"python3", "-c",
                        "import sys, json, yaml\n"
                        "y = yaml.safe_load(sys.stdin)\n"
                        "print(json.dumps(y, sort_keys=True))",
                        NULL};
    char *py_out, *py_err;
    int rc = px_test_run_input(py, yaml_out, 60, &py_out, &py_err);
    if (rc != 0 && strstr(py_err, "No module named 'yaml'")) {
        free(py_out);
        free(py_err);
        free(json_out);
        free(yaml_out);
        free(src);
        free(inv);
        skip(); /* python3-yaml (scripts/install-deps) is not installed */
    }
    if (rc != 0)
        fail_msg("python3 yaml: %s", py_err);
    json_t *a = json_loads(json_out, 0, NULL), *b = json_loads(py_out, 0, NULL);
    assert_non_null(a);
    assert_non_null(b);
    if (!json_equal(a, b))
        fail_msg("the YAML reads back as another document:\n%s\n---\n%s", yaml_out, json_out);
    json_decref(a);
    json_decref(b);
    free(py_out);
    free(py_err);
    free(json_out);
    free(yaml_out);
    free(src);
    free(inv);
}

static char *tmp_file(const char *name, const char *text, mode_t mode)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", px_test_tmpdir(), name) < 0)
        fail_msg("asprintf");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(p, mode);
    return p;
}

/* plexus config keeps contexts in a private file, holds a token file's
 * path but never a token, and refuses a config others can read. */
static void test_cli_config_contexts(void **state)
{
    (void)state;
    char *cfg = NULL, *env = NULL;
    if (asprintf(&cfg, "%s/ctx/config.json", px_test_tmpdir()) < 0)
        fail_msg("asprintf");
    char *dir = strdup(cfg);
    *strrchr(dir, '/') = 0;
    mkdir(dir, 0700);
    setenv("PLEXUS_CONFIG", cfg, 1);
    char *token = tmp_file("ctx-token", "user-token-0123456789abcdef\n", 0600);
    char *loose = tmp_file("ctx-loose-token", "user-token-0123456789abcdef\n", 0644);
    char *out, *err;
    assert_int_equal(RUN(&out, &err, "config", "get-contexts"), 0);
    px_assert_contains(out, "no contexts");
    free(out);
    free(err);
    /* A token on the command line, or in a file others can read, is refused. */
    assert_int_equal(RUN(&out, &err, "config", "set-context", "lab", "--token", "abc"), 2);
    px_assert_contains(err, "the config keeps the path of a token file, never a token");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "set-context", "lab", "--server",
                         "http://127.0.0.1:9", "--token-file", loose),
                     1);
    px_assert_contains(err, "chmod 600");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "set-context", "lab", "--server", "ftp://x"), 2);
    px_assert_contains(err, "--server takes http://HOST:PORT or https://HOST:PORT");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "set-context", "lab", "--server",
                         "http://127.0.0.1:9", "--token-file", token, "--current"),
                     0);
    free(out);
    free(err);
    assert_int_equal(
        RUN(&out, &err, "config", "set-context", "other", "--server", "http://127.0.0.1:8"), 0);
    free(out);
    free(err);
    struct stat sb;
    assert_int_equal(stat(cfg, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    char *text = NULL;
    size_t len = 0;
    FILE *f = fopen(cfg, "r");
    assert_non_null(f);
    assert_int_equal(getdelim(&text, &len, 0, f) > 0, 1);
    fclose(f);
    assert_null(strstr(text, "user-token-0123456789abcdef"));
    px_assert_contains(text, "\"token_file\": \"/");
    free(text);
    assert_int_equal(RUN(&out, &err, "config", "current-context"), 0);
    assert_string_equal(out, "lab\n");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "use-context", "other"), 0);
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "get-contexts", "-o", "yaml"), 0);
    px_assert_contains(out, "current_context: other\ncontexts:\n  - name: lab\n");
    free(out);
    free(err);
    /* The fleet commands use the current context, or the one --context names. */
    unsetenv("PLEXUS_SERVER");
    unsetenv("PLEXUS_TOKEN");
    assert_int_equal(RUN(&out, &err, "jobs", "--context", "lab"), 1);
    px_assert_contains(err, "127.0.0.1:9");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "jobs"), 1);
    px_assert_contains(err, "127.0.0.1:8");
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "jobs", "--context", "lba"), 1);
    px_assert_contains(err, "no context \"lba\"");
    px_assert_contains(err, "(it has lab, other)");
    free(out);
    free(err);
    /* A config others can read is refused with the fix. */
    chmod(cfg, 0644);
    assert_int_equal(RUN(&out, &err, "config", "get-contexts"), 1);
    px_assert_contains(err, "chmod 600");
    free(out);
    free(err);
    chmod(cfg, 0600);
    assert_int_equal(RUN(&out, &err, "config", "delete-context", "other"), 0);
    free(out);
    free(err);
    assert_int_equal(RUN(&out, &err, "config", "current-context"), 1);
    free(out);
    free(err);
    /* A token written into the file by hand is refused, not used. */
    char *bad = tmp_file("ctx/bad.json",
                         "{\"schema\": \"plexus.config/1\", \"contexts\": [{\"name\": \"x\", "
                         "\"token\": \"abc\"}]}",
                         0600);
    setenv("PLEXUS_CONFIG", bad, 1);
    assert_int_equal(RUN(&out, &err, "config", "get-contexts"), 1);
    px_assert_contains(err, "contexts[0].token: a token is never kept in the config");
    free(out);
    free(err);
    unsetenv("PLEXUS_CONFIG");
    free(bad);
    free(token);
    free(loose);
    free(dir);
    free(env);
    free(cfg);
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
        cmocka_unit_test(test_cli_every_command_reads_a_table),
        cmocka_unit_test(test_cli_yaml_is_the_json_tree),
        cmocka_unit_test(test_cli_config_contexts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
