/*
 * Limits on 127.0.0.1 with a real server and agents: a job's output is
 * cut at its log quota (and the log says so), its artifacts at its
 * quota, its run at its time limit; submissions with an idempotency key
 * are not duplicated; the validation gaps an attacker used are closed;
 * an upload far over the old 64 MiB limit streams through in constant
 * memory; and with the data folder on a small tmpfs (when the test may
 * mount one), submissions below the free-space reserve get 507, a full
 * disk's failed writes are never acknowledged, and the server recovers by
 * itself when space returns.
 */
#include "fleet_harness.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

static fh_fleet fleet;

static int setup(void **state)
{
    (void)state;
    fleet.extra_server_args[0] = "--log-quota";
    fleet.extra_server_args[1] = "256KiB";
    fleet.extra_server_args[2] = "--artifact-quota";
    fleet.extra_server_args[3] = "600KiB";
    fleet.extra_server_args[4] = "--max-upload";
    fleet.extra_server_args[5] = "512MiB";
    fleet.extra_server_args[6] = NULL;
    fh_fleet_start(&fleet, "limits", 10);
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

static long post_job(const char *token, const char *key, const char *spec, json_t **reply,
                     char *error, size_t n)
{
    px_fleet_client *c = fh_client(&fleet, token);
    if (key)
        assert_int_equal(px_fleet_client_set_idempotency_key(c, key, NULL), PX_OK);
    json_t *s = json_loads(spec, 0, NULL);
    assert_non_null(s);
    long code = 0;
    px_err err;
    err.msg[0] = '\0';
    /* The caller judges the outcome by the HTTP code and the message. */
    (void)px_fleet_client_call(c, "POST", "/v1/jobs", s, &code, reply, &err);
    if (error)
        snprintf(error, n, "%s", err.msg);
    json_decref(s);
    px_fleet_client_free(c);
    return code;
}

static void test_log_artifact_and_time_limits_hold(void **state)
{
    (void)state;
    /* 1 MB of output against a 256 KiB quota. */
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"head -c 1000000 /dev/zero "
                                 "| tr '\\\\000' x; echo; echo printed\"]}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    char *logs = fh_wait_logs(&fleet, id, "output truncated", 10);
    assert_true(strlen(logs) < 300 * 1024);
    assert_null(strstr(logs, "printed"));
    free(logs);
    free(id);
    /* Two artifacts of 400 KB against a 600 KiB quota: the second is refused. */
    id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"head -c 400000 /dev/urandom > "
                           "a.bin; head -c 400000 /dev/urandom > b.bin\"], \"artifacts\": "
                           "[\"a.bin\", \"b.bin\"]}");
    job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    json_decref(job);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *arts = fh_api(&fleet, "GET", path, NULL);
    assert_int_equal(json_array_size(json_object_get(arts, "artifacts")), 1);
    json_decref(arts);
    logs = fh_wait_logs(&fleet, id, "artifact quota", 10);
    free(logs);
    free(id);
    /* A job past its time limit is stopped and fails, saying why. */
    id = fh_submit(&fleet, "{\"command\": [\"/bin/sleep\", \"300\"], \"time_limit_s\": 1}");
    job = fh_wait_job(&fleet, id, "failed", 30);
    px_assert_contains(json_string_value(json_object_get(job, "error")), "time limit of 1 s");
    json_decref(job);
    free(id);
}

static void test_idempotent_submissions_and_closed_validation_gaps(void **state)
{
    (void)state;
    const char *spec = "{\"command\": [\"/bin/true\"], \"name\": \"once\"}";
    json_t *r1 = NULL, *r2 = NULL;
    assert_int_equal(post_job(FH_USER_TOKEN, "retry-key-1", spec, &r1, NULL, 0), 201);
    assert_int_equal(post_job(FH_USER_TOKEN, "retry-key-1", spec, &r2, NULL, 0), 200);
    assert_string_equal(json_string_value(json_object_get(r1, "id")),
                        json_string_value(json_object_get(r2, "id")));
    assert_true(json_is_true(json_object_get(r2, "idempotent_replay")));
    json_decref(r2);
    /* The same key with another spec is a mistake, said as such. */
    char e[300];
    assert_int_equal(post_job(FH_USER_TOKEN, "retry-key-1", "{\"command\": [\"/bin/false\"]}", NULL,
                              e, sizeof e),
                     409);
    px_assert_contains(e, "Idempotency-Key");
    /* Another user's key space is their own. */
    assert_int_equal(post_job(FH_OTHER_TOKEN, "retry-key-1", spec, &r2, NULL, 0), 201);
    assert_string_not_equal(json_string_value(json_object_get(r1, "id")),
                            json_string_value(json_object_get(r2, "id")));
    json_decref(r1);
    json_decref(r2);
    /* Refused at submission, each naming the member. */
    struct {
        const char *spec, *needle;
    } bad[] = {
        {"{\"command\": [\"/bin/true\"], \"artifacts\": [\"../../etc/passwd\"]}", "/artifacts/0"},
        {"{\"command\": [\"/bin/true\"], \"resources\": {\"cpus\": 1e-300}}", "/resources/cpus"},
        {"{\"command\": [\"/bin/true\"], \"name\": \"evil\\u001b[2J\\u001b]0;pwned\\u0007\"}",
         "/name"},
        {"{\"command\": [\"/bin/true\"], \"time_limit_s\": 0}", "/time_limit_s"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        long code = post_job(FH_USER_TOKEN, NULL, bad[i].spec, NULL, e, sizeof e);
        if (code != 400 || !strstr(e, bad[i].needle))
            fail_msg("spec %zu answered %ld: %s", i, code, e);
    }
    /* A gang larger than the fleet is accepted, with a word. */
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "submit", "--nodes", "1024", "--", "/bin/true", NULL),
                     0);
    px_assert_contains(err, "needs 1024 nodes");
    char id[32];
    assert_int_equal(sscanf(out, "submitted %31s", id), 1);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
}

static long peak_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static void test_large_upload_streams_in_constant_memory(void **state)
{
    (void)state;
    /* 300 MB, mostly a hole, with data at both ends and in the middle. */
    char *path = px_asprintf("%s/big.bin", fleet.dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    const off_t size = (off_t)300 << 20;
    assert_int_equal(ftruncate(fd, size), 0);
    const char *marks[] = {"head", "middle", "tail"};
    off_t at[] = {0, size / 2 + 12345, size - 4};
    for (int i = 0; i < 3; i++)
        assert_true(pwrite(fd, marks[i], strlen(marks[i]), at[i]) > 0);
    close(fd);
    px_digest want;
    px_assert_ok(px_sha256_file(path, &want, NULL), (px_err *)NULL);
    char hex[65];
    px_digest_hex(&want, hex);
    long before = peak_rss_kib(fleet.server.pid);
    px_fleet_client *c = fh_client(&fleet, FH_USER_TOKEN);
    px_fleet_client_set_timeout(c, 120000);
    json_t *reply = NULL;
    px_err err;
    px_assert_ok(px_fleet_client_send_file(c, "POST", "/v1/blobs", path, NULL, &reply, &err), &err);
    assert_string_equal(json_string_value(json_object_get(reply, "digest")), hex);
    assert_int_equal(json_integer_value(json_object_get(reply, "size")), (json_int_t)size);
    json_decref(reply);
    long after = peak_rss_kib(fleet.server.pid);
    print_message("server peak RSS %ld KiB before, %ld KiB after a %lld MiB upload\n", before,
                  after, (long long)(size >> 20));
    assert_true(after - before < 64 * 1024);
    /* What comes back is what went in. */
    char *copy = px_asprintf("%s/big.copy", fleet.dir);
    char blob[128];
    snprintf(blob, sizeof blob, "/v1/blobs/%s", hex);
    px_assert_ok(px_fleet_client_download(c, blob, copy, NULL, &err), &err);
    px_digest got;
    px_assert_ok(px_sha256_file(copy, &got, NULL), (px_err *)NULL);
    assert_memory_equal(got.bytes, want.bytes, sizeof want.bytes);
    unlink(copy);
    free(copy);
    /* Over the server's upload limit: refused before the body, saying how. */
    assert_int_equal(truncate(path, (off_t)600 << 20), 0);
    long code = 0;
    assert_int_equal(px_fleet_client_send_file(c, "POST", "/v1/blobs", path, &code, NULL, &err),
                     PX_ELIMIT);
    assert_int_equal(code, 413);
    px_assert_contains(err.msg, "--max-upload");
    px_fleet_client_free(c);
    unlink(path);
    free(path);
}

/* ---- a full disk ---- */

static bool mount_tmpfs(const char *dir, const char *size)
{
    static bool own_ns;
    if (!own_ns) {
        /* In a mount namespace of this test (and its children) alone. */
        if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
            return false;
        own_ns = true;
    }
    char opts[64];
    snprintf(opts, sizeof opts, "size=%s,mode=0700", size);
    return mount("tmpfs", dir, "tmpfs", 0, opts) == 0;
}

/* Fills the file system of dir, leaving `leave` bytes free. */
static void fill(const char *path, uint64_t leave)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    char buf[65536];
    memset(buf, 1, sizeof buf);
    for (;;) {
        struct statvfs v;
        fstatvfs(fd, &v);
        uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
        if (avail <= leave)
            break;
        size_t n = (size_t)PX_MIN((uint64_t)sizeof buf, avail - leave);
        if (write(fd, buf, n) <= 0)
            break;
    }
    fsync(fd);
    close(fd);
}

static void restart_server(fh_fleet *f, const char *reserve)
{
    kill(f->server.pid, SIGTERM);
    waitpid(f->server.pid, NULL, 0);
    fh_forget(f->server.pid);
    f->extra_server_args[0] = "--disk-reserve";
    f->extra_server_args[1] = reserve;
    f->extra_server_args[2] = NULL;
    fh_start_server(f);
}

static void test_full_disk_is_never_acknowledged_and_heals(void **state)
{
    (void)state;
    static fh_fleet df;
    fh_fleet_prepare(&df, "limits-disk", 10);
    mkdir(df.data, 0700);
    if (!mount_tmpfs(df.data, "24m")) {
        print_message("skipped: cannot mount a tmpfs here (%s); the store's refused writes are "
                      "covered by test_fleet_api's injected failures\n",
                      strerror(errno));
        setenv("PLEXUS_SERVER", fleet.url, 1);
        skip();
    }
    df.extra_server_args[0] = "--disk-reserve";
    df.extra_server_args[1] = "4MiB";
    df.extra_server_args[2] = NULL;
    fh_start_server(&df);
    fh_start_agent(&df, "d1", NULL);
    const char *names[] = {"d1"};
    fh_wait_nodes_online(&df, names, 1, 20);
    char filler[700];
    snprintf(filler, sizeof filler, "%s/filler", df.data);
    /* Below the reserve: submissions and uploads get 507, with the fix. */
    fill(filler, 2u << 20);
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "submit", "--", "/bin/true", NULL), 1);
    px_assert_contains(err, "507");
    px_assert_contains(err, "--disk-reserve");
    free(out);
    free(err);
    unlink(filler);
    /* The reserve at one byte, the disk really full: a job runs while it
     * fills, and nothing the store refused is acknowledged. */
    restart_server(&df, "1B");
    fh_wait_nodes_online(&df, names, 1, 20);
    char *spec = px_asprintf("{\"command\": [\"/bin/sh\", \"-c\", \"echo started; while [ ! -e "
                             "%s/go ]; do sleep 0.05; done; echo finished\"]}",
                             df.shared);
    char *id = fh_submit(&df, spec);
    char *logs = fh_wait_logs(&df, id, "started", 30);
    free(logs);
    fill(filler, 0);
    assert_int_equal(fh_plexus(&out, &err, "submit", "--", "/bin/true", NULL), 1);
    assert_null(strstr(out, "submitted"));
    free(out);
    free(err);
    /* The job ends while the disk is full: its report waits. */
    char go[700];
    snprintf(go, sizeof go, "%s/go", df.shared);
    fh_write_private(go, "go\n");
    for (int i = 0; i < 10; i++) {
        json_t *job = fh_job(&df, id);
        assert_true(fh_state_in(json_string_value(json_object_get(job, "state")), "running"));
        json_decref(job);
        fh_sleep_ms(100);
    }
    /* Space returns: the server takes the retried reports by itself. */
    unlink(filler);
    json_t *job = fh_wait_job(&df, id, "succeeded,failed", 60);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    assert_int_equal(
        fh_plexus(&out, &err, "submit", "--wait", "--timeout", "30", "--", "/bin/true", NULL), 0);
    free(out);
    free(err);
    char *text = NULL;
    size_t len;
    px_assert_ok(px_read_file(df.server.log, 1 << 20, &text, &len, NULL), (px_err *)NULL);
    px_assert_contains(text, "disk is full");
    free(text);
    free(spec);
    free(id);
    fh_fleet_stop(&df);
    umount2(df.data, MNT_DETACH);
    setenv("PLEXUS_SERVER", fleet.url, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_artifact_and_time_limits_hold),
        cmocka_unit_test(test_idempotent_submissions_and_closed_validation_gaps),
        cmocka_unit_test(test_large_upload_streams_in_constant_memory),
        cmocka_unit_test(test_full_disk_is_never_acknowledged_and_heals),
    };
    alarm(FH_SECONDS(240));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
