/*
 * `plexus up`: a server and a local agent in one process, tokens
 * generated into the data folder, jobs run, and a clean stop on SIGTERM;
 * with --tls, over HTTPS with the local CA it makes.
 */
#include "fleet_harness.h"

static void run_up(bool tls)
{
    fh_install_cleanup();
    chmod(px_test_tmpdir(), 0755); /* a root `plexus up` runs jobs as nobody */
    char *dir = px_asprintf("%s/up%s", px_test_tmpdir(), tls ? "-tls" : "");
    mkdir(dir, 0755);
    char *data = px_asprintf("%s/data", dir);
    char *log = px_asprintf("%s/up.log", dir);
    int port = fh_free_port();
    char listen[64], url[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(url, sizeof url, "%s://127.0.0.1:%d", tls ? "https" : "http", port);
    fh_fleet f;
    memset(&f, 0, sizeof f);
    snprintf(f.url, sizeof f.url, "%s", url);
    snprintf(f.dir, sizeof f.dir, "%s", dir);
    char *inv =
        fh_inventory(&f, "local", FH_L4("gpu0"), "{\"name\": \"torch\", \"version\": \"2.3.1\"}");
    /* Without TLS the data folder is given relative to where up starts
     * (as `up --data ./plexus-data` in the README): what a job gets
     * must still be absolute. */
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "up",
                    "--data",
                    tls ? data : "./data",
                    "--listen",
                    listen,
                    "--inventory",
                    inv,
                    tls ? "--tls" : NULL,
                    NULL};
    char *cwd = getcwd(NULL, 0);
    assert_non_null(cwd);
    assert_int_equal(chdir(dir), 0);
    pid_t pid = fh_spawn(argv, log, NULL);
    assert_int_equal(chdir(cwd), 0);
    free(cwd);
    /* The tokens appear in the data folder; the user token drives the CLI. */
    char *tokens = px_asprintf("%s/tokens", data);
    char *user = NULL;
    for (int i = 0; i < 200 && !user; i++) {
        char *text = NULL;
        size_t len;
        if (px_read_file(tokens, 1 << 16, &text, &len, NULL) == PX_OK) {
            char *p = strstr(text, "\nuser ");
            if (p) {
                p += 6;
                size_t n = strcspn(p, " \n");
                if (n >= 16)
                    user = px_strndup(p, n);
            }
        }
        free(text);
        if (!user)
            fh_sleep_ms(50);
    }
    if (!user) {
        fh_print_log(log);
        fail_msg("plexus up wrote no user token to %s", tokens);
    }
    setenv("PLEXUS_SERVER", url, 1);
    setenv("PLEXUS_TOKEN", user, 1);
    char *ca = px_asprintf("%s/tls/ca.pem", data);
    if (tls)
        setenv("PLEXUS_CA", ca, 1);
    else
        unsetenv("PLEXUS_CA");
    /* Wait for the local node, then run a GPU job on it. */
    bool online = false;
    for (int i = 0; i < 200 && !online; i++) {
        char *out = NULL;
        if (fh_plexus(&out, NULL, "nodes", NULL) == 0 && strstr(out, "online"))
            online = true;
        free(out);
        if (!online)
            fh_sleep_ms(100);
    }
    if (!online) {
        fh_print_log(log);
        fail_msg("the local node of plexus up did not come online");
    }
    /* The listing has its columns named, and a device without memory of
     * its own shows "-", not a capacity of 0 B. */
    char *listing = NULL;
    assert_int_equal(fh_plexus(&listing, NULL, "nodes", NULL), 0);
    px_assert_contains(listing, "NODE ");
    px_assert_contains(listing, " CAPABILITY ");
    assert_null(strstr(listing, " 0 B"));
    free(listing);
    char *out = NULL, *err = NULL;
    int rc =
        fh_plexus(&out, &err, "submit", "--gpus", "1", "--framework", "torch>=2", "--wait",
                  "--timeout", "30", "--", "/bin/sh", "-c", "echo gpu=$CUDA_VISIBLE_DEVICES", NULL);
    if (rc != 0) {
        fh_print_log(log);
        fail_msg("submit on plexus up failed (%d): %s %s", rc, out, err);
    }
    px_assert_contains(out, "succeeded");
    free(out);
    free(err);
    /* $PLEXUS_MODEL is an absolute path the job can read from its folder. */
    char *model = px_test_shared_model("stories260K.gguf");
    if (model) {
        rc = fh_plexus(&out, &err, "submit", "--model", model, "--wait", "--timeout", "60", "--",
                       "/bin/sh", "-c",
                       "case \"$PLEXUS_MODEL\" in /*) head -c 4 \"$PLEXUS_MODEL\";; *) echo "
                       "\"relative: $PLEXUS_MODEL\"; exit 1;; esac",
                       NULL);
        if (rc != 0) {
            fh_print_log(log);
            fail_msg("a model job on plexus up failed (%d): %s %s", rc, out, err);
        }
        char id[64] = "";
        const char *sub = strstr(out, "submitted ");
        assert_non_null(sub);
        assert_int_equal(sscanf(sub, "submitted %63s", id), 1);
        free(out);
        free(err);
        assert_int_equal(fh_plexus(&out, &err, "logs", id, NULL), 0);
        px_assert_contains(out, "GGUF");
        free(out);
        free(err);
        free(model);
    }
    /* SIGTERM stops the agent and the server; the process exits 0. */
    kill(pid, SIGTERM);
    int status = -1;
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        status = -1;
        fh_sleep_ms(50);
    }
    if (status == -1) {
        fh_print_log(log);
        fail_msg("plexus up did not stop within 10 s of SIGTERM");
    }
    fh_forget(pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* Tokens are never written to the log. */
    char *text = NULL;
    size_t len;
    px_assert_ok(px_read_file(log, 1 << 20, &text, &len, NULL), (px_err *)NULL);
    assert_null(strstr(text, user));
    free(text);
    free(user);
    free(ca);
    free(tokens);
    free(inv);
    free(log);
    free(data);
    free(dir);
}

static void test_up_runs_jobs_and_stops_cleanly(void **state)
{
    (void)state;
    run_up(false);
}

static void test_up_tls_serves_https_with_its_local_ca(void **state)
{
    (void)state;
    run_up(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_up_runs_jobs_and_stops_cleanly),
        cmocka_unit_test(test_up_tls_serves_https_with_its_local_ca),
    };
    alarm(FH_SECONDS(90));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
