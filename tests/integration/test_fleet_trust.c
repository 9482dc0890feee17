/*
 * Trust on 127.0.0.1 with a real server and agents, tried as an attacker
 * would: a job that hunts for a secret finds none; a rogue node (joined
 * with the join token) cannot speak for another node, report its work,
 * upload undeclared artifacts, fetch its models or take its name; one
 * user cannot read or cancel another's jobs, and an admin sees them
 * without their environment values; the data folder and database are
 * private whatever the umask; secret files others can read and tokens in
 * argv are refused; over TLS, agents and clients work with the pinned CA
 * and fail without it.
 */
#include "fleet_harness.h"

#include <sys/stat.h>

static fh_fleet fleet;

static int setup(void **state)
{
    (void)state;
    fh_fleet_prepare(&fleet, "trust", 10);
    /* The data folder exists already, readable by all, under a loose umask:
     * the server makes it private anyway. */
    mkdir(fleet.data, 0755);
    chmod(fleet.data, 0755);
    umask(022);
    fh_start_server(&fleet);
    fh_start_agent(&fleet, "n1", NULL);
    const char *names[] = {"n1"};
    fh_wait_nodes_online(&fleet, names, 1, 20);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    return 0;
}

/* A raw call with a token; returns the HTTP status, *reply the JSON. */
static long call(const char *token, const char *method, const char *path, const char *body,
                 json_t **reply)
{
    px_fleet_client *c = fh_client(&fleet, token);
    long code = 0;
    px_err err;
    if (reply)
        *reply = NULL;
    /* The caller judges the outcome by the HTTP code. */
    (void)px_fleet_client_send(c, method, path, body, body ? strlen(body) : 0, &code, reply, &err);
    px_fleet_client_free(c);
    return code;
}

static char *read_text(const char *path)
{
    char *text = NULL;
    size_t len;
    if (px_read_file(path, 1 << 20, &text, &len, NULL) != PX_OK)
        return NULL;
    return text;
}

static void test_job_hunting_for_secrets_finds_none(void **state)
{
    (void)state;
    char cred_path[700], *cred_text, node_cred[200] = "";
    snprintf(cred_path, sizeof cred_path, "%s/work-n1/state/credential", fleet.dir);
    cred_text = read_text(cred_path);
    assert_non_null(cred_text);
    assert_int_equal(sscanf(cred_text, "%*s %*s %199s", node_cred), 1);
    free(cred_text);
    /* Every process's argv and environment the job can read, and, when the
     * agent runs as root with a job user, the files that hold secrets. */
    char *files = fh_as_root() ? px_asprintf("%s %s %s %s/tokens", cred_path, fleet.join,
                                             fleet.tokens, fleet.data)
                               : px_strdup("");
    if (!fh_as_root())
        print_message("not root: jobs run as the agent's user and may read its files; only "
                      "/proc is hunted here (see docs/security.md)\n");
    char *spec = px_asprintf(
        "{\"command\": [\"/bin/sh\", \"-c\", \"for p in /proc/[0-9]*; do cat $p/cmdline "
        "$p/environ 2>/dev/null | tr '\\\\\\\\000' ' '; echo; done; for f in %s; do cat $f "
        "2>/dev/null; done; env; echo hunt-done\"]}",
        files);
    char *id = fh_submit(&fleet, spec);
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    json_decref(job);
    char *logs = fh_wait_logs(&fleet, id, "hunt-done", 10);
    /* The hunt saw the agent: its argv (which names the token's file) but
     * nothing more. */
    px_assert_contains(logs, "--join-token-file");
    const char *secrets[] = {FH_CLUSTER_TOKEN, FH_USER_TOKEN, FH_ADMIN_TOKEN, FH_OTHER_TOKEN,
                             node_cred};
    for (size_t i = 0; i < PX_ARRAY_LEN(secrets); i++)
        if (strstr(logs, secrets[i]))
            fail_msg("the job found secret %zu of %zu in what it could read", i + 1,
                     PX_ARRAY_LEN(secrets));
    free(logs);
    free(spec);
    free(files);
    free(id);
}

#define ROGUE_CRED "rogue-node-credential-0123456789abcdefghij"

static void test_rogue_node_speaks_only_for_itself(void **state)
{
    (void)state;
    /* n1 runs a job with a model and a declared artifact. */
    char *model = px_asprintf("%s/model.bin", fleet.dir);
    px_assert_ok(px_write_file(model, "weights", 7, NULL), (px_err *)NULL);
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "--model", model, "--artifact", "out.txt", "-o",
                       "json", "--", "/bin/sh", "-c", "sleep 2; echo done > out.txt", NULL);
    if (rc != 0)
        fail_msg("submit: %s %s", out, err);
    json_t *r = json_loads(out, 0, NULL);
    char *id = px_strdup(json_string_value(json_object_get(r, "id")));
    json_decref(r);
    free(out);
    free(err);
    json_t *job = fh_wait_job(&fleet, id, "running", 20);
    const char *digest = json_string_value(
        json_object_get(json_object_get(json_object_get(job, "spec"), "model"), "digest"));
    char blob[128];
    snprintf(blob, sizeof blob, "/v1/blobs/%s", digest);
    json_decref(job);
    json_t *n1 = fh_node(&fleet, "n1");
    double cpus = json_number_value(json_object_get(n1, "cpus"));
    json_decref(n1);

    /* A rogue node joins (it holds the join token) and is drained. */
    assert_int_equal(
        call(FH_CLUSTER_TOKEN, "POST", "/v1/agent/join",
             "{\"name\": \"rogue\", \"cpus\": 1024, \"credential\": \"" ROGUE_CRED "\"}", NULL),
        200);
    assert_int_equal(call(FH_ADMIN_TOKEN, "POST", "/v1/nodes/rogue/drain", "{}", NULL), 200);
    char path[256], body[256];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/finish", id);
    snprintf(body, sizeof body,
             "{\"node\": \"n1\", \"attempt\": 1, \"rank\": 0, \"exit_code\": 0, \"result\": "
             "\"forged\"}");
    assert_int_equal(call(ROGUE_CRED, "POST", path, body, NULL), 403);
    snprintf(body, sizeof body, "{\"attempt\": 1, \"rank\": 0, \"exit_code\": 0}");
    assert_int_equal(call(ROGUE_CRED, "POST", path, body, NULL), 403);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/logs?attempt=1&rank=0&stream=stdout", id);
    assert_int_equal(call(ROGUE_CRED, "POST", path, "forged output\n", NULL), 403);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/out.txt?attempt=1&rank=0", id);
    assert_int_equal(call(ROGUE_CRED, "PUT", path, "forged", NULL), 403);
    /* Nor may n1 itself upload what its job did not declare. */
    char cred_path[700], n1_cred[200] = "";
    snprintf(cred_path, sizeof cred_path, "%s/work-n1/state/credential", fleet.dir);
    char *text = read_text(cred_path);
    assert_int_equal(sscanf(text, "%*s %*s %199s", n1_cred), 1);
    free(text);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/undeclared.bin?attempt=1&rank=0", id);
    assert_int_equal(call(n1_cred, "PUT", path, "x", NULL), 403);
    assert_int_equal(call(ROGUE_CRED, "GET", blob, NULL, NULL), 403);
    assert_int_equal(
        call(ROGUE_CRED, "POST", "/v1/agent/register", "{\"name\": \"n1\", \"cpus\": 0.1}", NULL),
        403);
    assert_int_equal(call(ROGUE_CRED, "POST", "/v1/agent/heartbeat",
                          "{\"node\": \"n1\", \"running\": []}", NULL),
                     403);
    assert_int_equal(call(ROGUE_CRED, "GET", "/v1/agent/assignments?node=n1&wait=0", NULL, NULL),
                     403);
    /* Joining under n1's name with another credential is refused. */
    assert_int_equal(
        call(FH_CLUSTER_TOKEN, "POST", "/v1/agent/join",
             "{\"name\": \"n1\", \"credential\": \"another-credential-0123456789abc\"}", NULL),
        409);
    /* The join token does nothing else; a user's token is no node's. */
    assert_int_equal(call(FH_CLUSTER_TOKEN, "GET", "/v1/jobs", NULL, NULL), 403);
    assert_int_equal(call(FH_USER_TOKEN, "POST", "/v1/agent/heartbeat", "{}", NULL), 403);
    /* n1's job ends as n1 reports it, and n1 is untouched. */
    job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_true(json_is_null(json_object_get(job, "result")));
    json_decref(job);
    n1 = fh_node(&fleet, "n1");
    assert_string_equal(json_string_value(json_object_get(n1, "state")), "online");
    assert_true(json_number_value(json_object_get(n1, "cpus")) == cpus);
    json_decref(n1);
    /* The admin revokes the rogue: its credential stops working. */
    assert_int_equal(call(FH_ADMIN_TOKEN, "POST", "/v1/nodes/rogue/revoke", "{}", NULL), 200);
    assert_int_equal(call(ROGUE_CRED, "POST", "/v1/agent/heartbeat", "{}", NULL), 401);
    assert_int_equal(call(FH_CLUSTER_TOKEN, "POST", "/v1/agent/join",
                          "{\"name\": \"rogue\", \"credential\": \"" ROGUE_CRED "\"}", NULL),
                     403);
    /* Only an admin manages nodes. */
    assert_int_equal(call(FH_USER_TOKEN, "POST", "/v1/nodes/n1/drain", "{}", NULL), 403);
    free(model);
    free(id);
}

static void test_users_see_only_their_own_jobs(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sleep\", \"30\"], \"env\": "
                                 "{\"AWS_SECRET_ACCESS_KEY\": \"alice-secret-value\"}}");
    char path[128];
    json_t *r;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    assert_int_equal(call(FH_OTHER_TOKEN, "GET", path, NULL, &r), 404);
    json_decref(r);
    char sub[160];
    const char *subs[] = {"logs", "explain", "artifacts"};
    for (size_t i = 0; i < PX_ARRAY_LEN(subs); i++) {
        snprintf(sub, sizeof sub, "%s/%s", path, subs[i]);
        assert_int_equal(call(FH_OTHER_TOKEN, "GET", sub, NULL, NULL), 404);
    }
    snprintf(sub, sizeof sub, "%s/cancel", path);
    assert_int_equal(call(FH_OTHER_TOKEN, "POST", sub, "{}", NULL), 404);
    assert_int_equal(call(FH_OTHER_TOKEN, "GET", "/v1/jobs?limit=1000", NULL, &r), 200);
    char *listing = json_dumps(r, 0);
    assert_null(strstr(listing, id));
    free(listing);
    json_decref(r);
    /* The admin sees the job, not its secret; the owner sees both. */
    assert_int_equal(call(FH_ADMIN_TOKEN, "GET", path, NULL, &r), 200);
    char *text = json_dumps(r, 0);
    assert_null(strstr(text, "alice-secret-value"));
    px_assert_contains(text, "AWS_SECRET_ACCESS_KEY");
    free(text);
    json_decref(r);
    assert_int_equal(call(FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    text = json_dumps(r, 0);
    px_assert_contains(text, "alice-secret-value");
    free(text);
    json_decref(r);
    assert_int_equal(call(FH_USER_TOKEN, "POST", sub, "{}", NULL), 200);
    free(id);
}

static mode_t mode_of(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        fail_msg("%s: %s", path, strerror(errno));
    return sb.st_mode & 07777;
}

static void test_state_is_private_and_loose_secrets_are_refused(void **state)
{
    (void)state;
    char path[700];
    assert_int_equal(mode_of(fleet.data), 0700);
    const char *files[] = {"fleet.db", "fleet.db-wal"};
    for (size_t i = 0; i < PX_ARRAY_LEN(files); i++) {
        snprintf(path, sizeof path, "%s/%s", fleet.data, files[i]);
        if (mode_of(path) != 0600)
            fail_msg("%s has mode %04o", path, (unsigned)mode_of(path));
    }
    snprintf(path, sizeof path, "%s/work-n1/state/credential", fleet.dir);
    assert_int_equal(mode_of(path), 0600);
    /* A token file others can read is refused, with the fix. */
    char *loose = px_asprintf("%s/loose-tokens", fleet.dir);
    fh_write_private(loose, "agent " FH_CLUSTER_TOKEN "\nuser " FH_USER_TOKEN "\n");
    chmod(loose, 0644);
    char *data = px_asprintf("%s/data-loose", fleet.dir);
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "server", "--listen", "127.0.0.1:0", "--data", data,
                               "--token-file", loose, NULL),
                     1);
    px_assert_contains(err, "chmod 600");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "nodes", "--token-file", loose, NULL), 1);
    px_assert_contains(err, "chmod 600");
    free(out);
    free(err);
    assert_int_equal(
        fh_plexus(&out, &err, "agent", "--join-token-file", loose, "--name", "x", NULL), 1);
    px_assert_contains(err, "chmod 600");
    free(out);
    free(err);
    /* A token in argv is refused before anything is sent. */
    assert_int_equal(fh_plexus(&out, &err, "jobs", "--token", FH_USER_TOKEN, NULL), 2);
    px_assert_contains(err, "ps");
    free(out);
    free(err);
    free(data);
    free(loose);
}

static void test_tls_with_the_pinned_ca_and_not_without(void **state)
{
    (void)state;
    static fh_fleet tf;
    static char cert[700], key[700];
    fh_fleet_prepare(&tf, "trust-tls", 10);
    char tls[480];
    snprintf(tls, sizeof tls, "%.400s/tls", tf.dir);
    px_err e;
    px_assert_ok(px_fleet_tls_make_local(tls, "127.0.0.1", &e), &e);
    snprintf(cert, sizeof cert, "%s/server.pem", tls);
    snprintf(key, sizeof key, "%s/server-key.pem", tls);
    snprintf(tf.ca, sizeof tf.ca, "%s/ca.pem", tls);
    tf.extra_server_args[0] = "--tls-cert";
    tf.extra_server_args[1] = cert;
    tf.extra_server_args[2] = "--tls-key";
    tf.extra_server_args[3] = key;
    tf.extra_server_args[4] = NULL;
    snprintf(tf.url, sizeof tf.url, "https://127.0.0.1:%d", tf.port);
    setenv("PLEXUS_SERVER", tf.url, 1);
    setenv("PLEXUS_CA", tf.ca, 1);
    fh_start_server(&tf);
    fh_start_agent(&tf, "t1", NULL);
    const char *names[] = {"t1"};
    fh_wait_nodes_online(&tf, names, 1, 20);
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "--wait", "--timeout", "30", "--", "/bin/echo",
                       "over tls", NULL);
    if (rc != 0)
        fail_msg("submit over TLS: %s %s", out, err);
    free(out);
    free(err);
    /* Without the CA, the server's certificate is not trusted. */
    unsetenv("PLEXUS_CA");
    assert_int_equal(fh_plexus(&out, &err, "jobs", NULL), 1);
    px_assert_contains(err, "certificate");
    free(out);
    free(err);
    /* Plain HTTP gets no answer from a TLS server. */
    char plain[64];
    snprintf(plain, sizeof plain, "http://127.0.0.1:%d", tf.port);
    assert_int_equal(fh_plexus(&out, &err, "jobs", "--server", plain, NULL), 1);
    free(out);
    free(err);
    fh_fleet_stop(&tf);
    setenv("PLEXUS_SERVER", fleet.url, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_hunting_for_secrets_finds_none),
        cmocka_unit_test(test_rogue_node_speaks_only_for_itself),
        cmocka_unit_test(test_users_see_only_their_own_jobs),
        cmocka_unit_test(test_state_is_private_and_loose_secrets_are_refused),
        cmocka_unit_test(test_tls_with_the_pinned_ca_and_not_without),
    };
    alarm(FH_SECONDS(200));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
