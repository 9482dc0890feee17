/*
 * Two `plexus server` replicas on one PostgreSQL database (started by the
 * test, tests/support/pg_harness.h) and one agent joined to the replica
 * that schedules.  The standby serves what the database answers: jobs are
 * submitted to it alone, read back from it (state, logs, listing) with
 * each user seeing only their own, while what needs the scheduler's memory
 * still answers 503 "standby".  The scheduling replica learns of the
 * standby's jobs from the database's notification (LISTEN/NOTIFY), which
 * its /metrics count, and runs them.  Blobs live in the database: one
 * uploaded to either replica is served by the other, whose data folder
 * never saw it, byte for byte; so are jobs' artifacts, which the agent
 * uploads to the scheduling replica.  A cancellation sent to the standby is
 * carried out by the scheduler, and the standby answers once it has
 * been.  An agent that lists the standby first is served by it: the
 * database carries its calls to the scheduler.  Skips where PostgreSQL
 * cannot run.
 */
#include "fleet_harness.h"

#include <pthread.h>

#define LEASE_S 10

static fh_fleet fleet;
static const char *store_uri;
static fh_proc standby;
static char standby_url[64];
static char last_error[512]; /* the message of the last call that failed */

static px_fleet_client *client_of(const char *url, const char *token)
{
    px_fleet_client *c;
    px_err err;
    px_assert_ok(px_fleet_client_new(url, token, &c, &err), &err);
    px_fleet_client_set_timeout(c, 20000);
    return c;
}

/* One call to one replica alone: the HTTP status; the reply in *out. */
static long call(const char *url, const char *token, const char *method, const char *path,
                 const json_t *body, json_t **out)
{
    px_fleet_client *c = client_of(url, token);
    long code = 0;
    json_t *r = NULL;
    px_err err;
    if (px_fleet_client_call(c, method, path, body, &code, &r, &err) != PX_OK)
        px_textf(last_error, sizeof last_error, "%s", err.msg);
    px_fleet_client_free(c);
    if (out)
        *out = r;
    else
        json_decref(r);
    return code;
}

/* A counter of a replica's /metrics (-1 when absent). */
static long long metric(const char *url, const char *name)
{
    px_fleet_client *c = client_of(url, NULL);
    char dest[700];
    snprintf(dest, sizeof dest, "%s/metrics.txt", fleet.dir);
    px_err err;
    px_assert_ok(px_fleet_client_download(c, "/metrics", dest, NULL, &err), &err);
    px_fleet_client_free(c);
    char *text;
    size_t len;
    px_assert_ok(px_read_file(dest, 1 << 20, &text, &len, &err), &err);
    long long v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(text, key);
    if (at)
        v = strtoll(at + strlen(key), NULL, 10);
    free(text);
    return v;
}

static int setup(void **state)
{
    (void)state;
    fh_fleet_prepare(&fleet, "standby", LEASE_S);
    if (!(store_uri = fh_pg_database()))
        return 0;
    fleet.extra_server_args[0] = "--store";
    fleet.extra_server_args[1] = store_uri;
    fleet.extra_server_args[2] = NULL;
    /* The first replica takes the lease (fh_start_server waits for it). */
    fh_start_server(&fleet);
    long code = 0;
    for (int t = 0; t < 400 && code != 200; t++) {
        code = call(fleet.url, NULL, "GET", "/v1/health", NULL, NULL);
        if (code != 200)
            fh_sleep_ms(50);
    }
    assert_int_equal(code, 200);
    char data[700], listen[64];
    snprintf(data, sizeof data, "%s/data-standby", fleet.dir);
    int port = fh_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(standby_url, sizeof standby_url, "http://127.0.0.1:%d", port);
    snprintf(standby.log, sizeof standby.log, "%s/standby.log", fleet.dir);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "server",
                    "--listen",
                    listen,
                    "--data",
                    data,
                    "--store",
                    (char *)store_uri,
                    "--token-file",
                    fleet.tokens,
                    NULL};
    const char *env[] = {"PLEXUS_LOG", "info", NULL};
    standby.pid = fh_spawn(argv, standby.log, env);
    code = 0;
    for (int t = 0; t < 400 && code != 503; t++) {
        code = call(standby_url, NULL, "GET", "/v1/health", NULL, NULL);
        if (code != 503)
            fh_sleep_ms(50);
    }
    if (code != 503)
        fh_print_log(standby.log);
    assert_int_equal(code, 503);
    /* The agent is given the standby first: it finds the scheduler by
     * itself. */
    static char urls[200];
    snprintf(urls, sizeof urls, "%s,%s", standby_url, fleet.url);
    fh_start_agent_via(&fleet, "a", NULL, urls, NULL);
    const char *names[] = {"a"};
    fh_wait_nodes_online(&fleet, names, 1, 60);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    if (standby.pid > 0) {
        kill(-standby.pid, SIGTERM);
        waitpid(standby.pid, NULL, 0);
        fh_forget(standby.pid);
        standby.pid = 0;
    }
    return 0;
}

/* Waits (reading from the standby) until the job has ended; its state. */
static char *wait_done_on_standby(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (int t = 0; t < 1200; t++) {
        json_t *j = NULL;
        assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &j), 200);
        const char *st = json_string_value(json_object_get(j, "state"));
        if (fh_state_in(st, "succeeded,failed,cancelled")) {
            char *copy = px_strdup(st);
            json_decref(j);
            return copy;
        }
        json_decref(j);
        fh_sleep_ms(50);
    }
    fh_print_log(fleet.server.log);
    fh_print_log(standby.log);
    fh_print_log(fleet.agents[0].log);
    fail_msg("job %s did not end within 60 s", id);
    return NULL;
}

static void test_standby_serves_submissions_and_reads_from_the_database(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    json_t *spec = json_pack("{s:[s,s,s]}", "command", "/bin/sh", "-c", "echo from-the-standby");
    json_t *r = NULL;
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
    json_decref(spec);
    char *id = px_strdup(json_string_value(json_object_get(r, "id")));
    assert_non_null(id);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "queued");
    json_decref(r);

    char *st = wait_done_on_standby(id);
    assert_string_equal(st, "succeeded");
    free(st);
    /* The scheduling replica agrees: one database. */
    json_t *j = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "succeeded");
    json_decref(j);

    /* Logs, the listing and the explanation come from the standby. */
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    char *text = json_dumps(r, 0);
    assert_non_null(strstr(text, "from-the-standby"));
    assert_true(json_is_true(json_object_get(r, "done")));
    free(text);
    json_decref(r);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", "/v1/jobs?limit=10", NULL, &r), 200);
    text = json_dumps(r, 0);
    assert_non_null(strstr(text, id));
    free(text);
    json_decref(r);
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    assert_true(json_is_object(r));
    json_decref(r);

    /* Each principal sees only its own, on the standby too; no token, no
     * answer. */
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    assert_int_equal(call(standby_url, FH_OTHER_TOKEN, "GET", path, NULL, NULL), 404);
    assert_int_equal(call(standby_url, FH_OTHER_TOKEN, "GET", "/v1/jobs", NULL, &r), 200);
    text = json_dumps(r, 0);
    assert_null(strstr(text, id));
    free(text);
    json_decref(r);
    assert_int_equal(call(standby_url, NULL, "GET", path, NULL, NULL), 401);
    json_t *empty = json_object();
    assert_int_equal(
        call(standby_url, "not-a-token-of-this-fleet", "POST", "/v1/jobs", empty, NULL), 401);
    json_decref(empty);

    /* What needs the scheduler's memory sends the caller on. */
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", "/v1/nodes", NULL, NULL), 503);
    assert_non_null(strstr(last_error, "standing by"));
    /* A cancellation of a job that has ended is refused, as on the
     * scheduler. */
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", path, NULL, NULL), 409);
    assert_non_null(strstr(last_error, "already ended"));
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", "/v1/health", NULL, NULL), 503);
    free(id);
}

static void test_scheduler_woken_by_the_databases_notification(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    long long before = metric(fleet.url, "plexus_store_notifications_total");
    long long claimed = metric(fleet.url, "plexus_jobs_claimed_total");
    assert_true(before >= 0 && claimed >= 0);
    char *ids[5];
    for (int i = 0; i < 5; i++) {
        json_t *spec = json_pack("{s:[s], s:s}", "command", "/bin/true", "name", "woken");
        json_t *r = NULL;
        assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
        ids[i] = px_strdup(json_string_value(json_object_get(r, "id")));
        json_decref(r);
        json_decref(spec);
    }
    /* The scheduling replica counts the notifications and takes every job
     * in (a generous deadline: nothing here is timed). */
    long long now = before, took = claimed;
    for (int t = 0; t < 1200 && (now <= before || took < claimed + 5); t++) {
        fh_sleep_ms(50);
        now = metric(fleet.url, "plexus_store_notifications_total");
        took = metric(fleet.url, "plexus_jobs_claimed_total");
    }
    if (now <= before || took < claimed + 5)
        fh_print_log(fleet.server.log);
    assert_true(now > before);
    assert_true(took >= claimed + 5);
    /* The standby never schedules: it claims nothing. */
    assert_int_equal(metric(standby_url, "plexus_jobs_claimed_total"), 0);
    for (int i = 0; i < 5; i++) {
        char *st = wait_done_on_standby(ids[i]);
        assert_string_equal(st, "succeeded");
        free(st);
        free(ids[i]);
    }
    /* Jobs submitted to the scheduling replica itself wake nobody: it has
     * them in hand, and its own notifications would only wake it to claim
     * nothing. */
    before = metric(fleet.url, "plexus_store_notifications_total");
    claimed = metric(fleet.url, "plexus_jobs_claimed_total");
    for (int i = 0; i < 3; i++) {
        json_t *spec = json_pack("{s:[s], s:s}", "command", "/bin/true", "name", "in-hand");
        json_t *r = NULL;
        assert_int_equal(call(fleet.url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
        ids[i] = px_strdup(json_string_value(json_object_get(r, "id")));
        json_decref(r);
        json_decref(spec);
    }
    for (int i = 0; i < 3; i++) {
        char *st = wait_done_on_standby(ids[i]);
        assert_string_equal(st, "succeeded");
        free(st);
        free(ids[i]);
    }
    /* A notification is delivered before the row's job can run (it is
     * sent at the insert's commit): had one been sent, it is counted by
     * now. */
    assert_int_equal(metric(fleet.url, "plexus_store_notifications_total"), before);
    assert_int_equal(metric(fleet.url, "plexus_jobs_claimed_total"), claimed);
}

/* A labelled counter of a replica's /metrics (-1 when absent). */
static long long metric_5xx(const char *url)
{
    return metric(url, "plexus_http_requests_total{code=\"5xx\"}");
}

static void test_agent_reports_go_straight_to_the_scheduler(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    /* The agent was given the standby's URL first.  Once its poll found
     * the scheduler, each job's reports (start, logs, finish) go there at
     * once: the standby sends nobody on (503) meanwhile. */
    long long before = metric_5xx(standby_url);
    assert_true(before >= 0);
    for (int i = 0; i < 3; i++) {
        json_t *spec = json_pack("{s:[s,s,s]}", "command", "/bin/sh", "-c", "echo straight");
        json_t *r = NULL;
        assert_int_equal(call(fleet.url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
        char *id = px_strdup(json_string_value(json_object_get(r, "id")));
        json_decref(r);
        json_decref(spec);
        char *st = wait_done_on_standby(id);
        assert_string_equal(st, "succeeded");
        free(st);
        free(id);
    }
    assert_int_equal(metric_5xx(standby_url), before);
}

/* Uploads n bytes of a pattern to one replica; the digest it answers. */
static char *upload(const char *url, size_t n, const char *name)
{
    char file[700];
    snprintf(file, sizeof file, "%s/%s", fleet.dir, name);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++)
        fputc((int)((i * 2654435761u) >> 11 & 0xff), f);
    fclose(f);
    px_fleet_client *c = client_of(url, FH_USER_TOKEN);
    long code = 0;
    json_t *r = NULL;
    px_err err;
    px_assert_ok(px_fleet_client_send_file(c, "POST", "/v1/blobs", file, &code, &r, &err), &err);
    assert_int_equal(code, 201);
    assert_int_equal(json_integer_value(json_object_get(r, "size")), (json_int_t)n);
    char *digest = px_strdup(json_string_value(json_object_get(r, "digest")));
    json_decref(r);
    px_fleet_client_free(c);
    return digest;
}

/* Downloads a blob from one replica and compares it with the file sent. */
static void download_same(const char *url, const char *digest, const char *name)
{
    char path[128], dest[700], sent[700];
    snprintf(path, sizeof path, "/v1/blobs/%s", digest);
    snprintf(dest, sizeof dest, "%s/%s.back", fleet.dir, name);
    snprintf(sent, sizeof sent, "%s/%s", fleet.dir, name);
    px_fleet_client *c = client_of(url, FH_USER_TOKEN);
    long code = 0;
    px_err err;
    px_assert_ok(px_fleet_client_download(c, path, dest, &code, &err), &err);
    assert_int_equal(code, 200);
    px_fleet_client_free(c);
    char *a, *b;
    size_t na, nb;
    px_assert_ok(px_read_file(sent, 16 << 20, &a, &na, &err), &err);
    px_assert_ok(px_read_file(dest, 16 << 20, &b, &nb, &err), &err);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
}

static void test_blobs_uploaded_to_one_replica_are_served_by_the_other(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    /* Several chunks in the database, to the standby; back from the
     * scheduling replica, which fetches it from the database. */
    char *d1 = upload(standby_url, (5u << 20) / 2 + 7, "to-standby.bin");
    char local[800];
    snprintf(local, sizeof local, "%s/blobs/%s", fleet.data, d1);
    assert_int_not_equal(access(local, F_OK), 0);
    download_same(fleet.url, d1, "to-standby.bin");
    assert_int_equal(access(local, F_OK), 0);
    /* And the other way. */
    char *d2 = upload(fleet.url, 1000, "to-scheduler.bin");
    download_same(standby_url, d2, "to-scheduler.bin");
    /* Unknown blobs are unknown on both; a malformed name is refused. */
    char path[128];
    snprintf(path, sizeof path, "/v1/blobs/%064d", 0);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, NULL), 404);
    assert_int_equal(call(fleet.url, FH_USER_TOKEN, "GET", path, NULL, NULL), 404);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", "/v1/blobs/xyz", NULL, NULL), 400);
    /* No token, no blob; a token the standby cannot place (a node's, whose
     * credentials only the scheduling replica reads) goes on to the next
     * URL. */
    snprintf(path, sizeof path, "/v1/blobs/%s", d1);
    assert_int_equal(call(standby_url, NULL, "GET", path, NULL, NULL), 401);
    assert_int_equal(call(standby_url, "not-a-token-of-this-fleet", "GET", path, NULL, NULL), 503);
    free(d1);
    free(d2);
}

/* The lines 1..n, as `seq` writes them. */
static char *seq_text(int n, size_t *len)
{
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 1; i <= n; i++)
        px_strbuf_addf(&sb, "%d\n", i);
    return px_strbuf_detach(&sb, len);
}

static void test_artifacts_are_served_by_every_replica_from_the_database(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    /* Uploaded by the agent to the scheduling replica; about 2.5 MiB, so
     * in several chunks of the database. */
    json_t *spec = json_pack("{s:[s,s,s], s:[s]}", "command", "/bin/sh", "-c",
                             "seq 1 400000 > big.txt", "artifacts", "big.txt");
    json_t *r = NULL;
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
    json_decref(spec);
    char *id = px_strdup(json_string_value(json_object_get(r, "id")));
    json_decref(r);
    char *st = wait_done_on_standby(id);
    assert_string_equal(st, "succeeded");
    free(st);
    /* Listed and served by the standby, whose data folder never saw it. */
    char path[200], dest[700], local[800];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    json_t *a = json_array_get(json_object_get(r, "artifacts"), 0);
    assert_string_equal(json_string_value(json_object_get(a, "name")), "big.txt");
    json_decref(r);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/big.txt", id);
    snprintf(dest, sizeof dest, "%s/big.txt.back", fleet.dir);
    px_fleet_client *c = client_of(standby_url, FH_USER_TOKEN);
    long code = 0;
    px_err err;
    px_assert_ok(px_fleet_client_download(c, path, dest, &code, &err), &err);
    px_fleet_client_free(c);
    assert_int_equal(code, 200);
    size_t n_want, n_got;
    char *want = seq_text(400000, &n_want), *got;
    px_assert_ok(px_read_file(dest, 16 << 20, &got, &n_got, &err), &err);
    assert_true(n_want > (2u << 20));
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, n_want);
    free(want);
    free(got);
    snprintf(local, sizeof local, "%s/data-standby/artifacts/%s", fleet.dir, id);
    assert_int_not_equal(access(local, F_OK), 0);
    /* Another user does not see it; an unknown name is unknown. */
    assert_int_equal(call(standby_url, FH_OTHER_TOKEN, "GET", path, NULL, NULL), 404);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/none.txt", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, NULL), 404);
    free(id);
}

static void test_standby_cancellation_is_carried_out_by_the_scheduler(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    json_t *spec = json_pack("{s:[s,s]}", "command", "/bin/sleep", "300");
    json_t *r = NULL;
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", "/v1/jobs", spec, &r), 201);
    json_decref(spec);
    char *id = px_strdup(json_string_value(json_object_get(r, "id")));
    json_decref(r);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    const char *st = NULL;
    for (int t = 0; t < 1200; t++) {
        json_t *j = NULL;
        assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &j), 200);
        bool running = strcmp(json_string_value(json_object_get(j, "state")), "running") == 0;
        json_decref(j);
        if (running) {
            st = "running";
            break;
        }
        fh_sleep_ms(50);
    }
    assert_non_null(st);
    /* Another user's job is not theirs to cancel, on the standby too. */
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    assert_int_equal(call(standby_url, FH_OTHER_TOKEN, "POST", path, NULL, NULL), 404);
    /* The standby records it, the scheduler stops the job, the standby
     * answers (202 only if the scheduler has not acted within 10 s: then
     * wait for it here, nothing is timed). */
    long code = call(standby_url, FH_USER_TOKEN, "POST", path, NULL, &r);
    if (code != 200)
        fh_print_log(fleet.server.log);
    assert_true(code == 200 || code == 202);
    json_decref(r);
    char *final = wait_done_on_standby(id);
    assert_string_equal(final, "cancelled");
    free(final);
    json_t *j = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
    json_decref(j);
    /* Asked again: it has ended. */
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "POST", path, NULL, NULL), 409);
    free(id);
}

/* The node credential the agent of `node` keeps in its work folder. */
static char *node_credential(const char *node)
{
    char path[700], cred[200] = "";
    snprintf(path, sizeof path, "%s/work-%s/state/credential", fleet.dir, node);
    char *text = NULL;
    size_t len;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 16, &text, &len, &err), &err);
    assert_int_equal(sscanf(text, "%*s %*s %199s", cred), 1);
    free(text);
    return px_strdup(cred);
}

/* What a node may not do through the standby, which checks it against
 * the database as the scheduler checks it against memory. */
static void standby_refuses_hostile_agent_calls(const char *node, const char *done_id)
{
    char *cred = node_credential(node);
    char path[160];
    /* A node speaks only for itself. */
    json_t *b = json_pack("{s:s, s:[]}", "node", "a", "running");
    assert_int_equal(call(standby_url, cred, "POST", "/v1/agent/heartbeat", b, NULL), 403);
    json_decref(b);
    assert_int_equal(
        call(standby_url, cred, "GET", "/v1/agent/assignments?wait=0&node=a", NULL, NULL), 403);
    /* Reports for work that is not its current attempt change nothing. */
    b = json_pack("{s:i, s:i}", "attempt", 7, "rank", 0);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/start", done_id);
    assert_int_equal(call(standby_url, cred, "POST", path, b, NULL), 409);
    json_decref(b);
    b = json_pack("{s:s, s:i}", "attempt", "1; DROP TABLE jobs", "rank", 0);
    assert_int_equal(call(standby_url, cred, "POST", path, b, NULL), 400);
    json_decref(b);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/logs?attempt=1&rank=0&stream=stdout", done_id);
    assert_int_equal(call(standby_url, cred, "POST", path, NULL, NULL), 409);
    /* A "running" list of junk is read as far as it is well formed. */
    b = json_pack("{s:[{s:s, s:s}, i, {s:s, s:i, s:i}]}", "running", "job", "x", "attempt", "y", 7,
                  "job", "no-such-job", "attempt", 1, "rank", 0);
    json_t *r = NULL;
    assert_int_equal(call(standby_url, cred, "POST", "/v1/agent/heartbeat", b, &r), 200);
    assert_int_equal(json_array_size(json_object_get(r, "stop")), 1);
    json_decref(r);
    json_decref(b);
    /* Joining and rotating need the scheduler; an unknown secret is
     * unknown. */
    assert_int_equal(call(standby_url, cred, "POST", "/v1/agent/credential", NULL, NULL), 503);
    assert_int_equal(call(standby_url, "not-a-credential-of-this-fleet-at-all-0123456789", "POST",
                          "/v1/agent/heartbeat", NULL, NULL),
                     401);
    free(cred);
}

/* An agent whose list of server URLs puts the standby first: after it
 * has joined (through the scheduling replica: joining needs its memory),
 * it registers, heartbeats, polls for work and reports through the
 * standby alone, which answers from the database; the scheduler reads
 * the node from the database, places a job only this node can run on it,
 * and the job runs, its output read back through the standby. */
static void test_agent_listing_the_standby_first_is_served_by_it(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    char *inv = fh_inventory(&fleet, "b", "", "{\"name\": \"onlyb\", \"version\": \"1.0\"}");
    int k = fh_start_agent(&fleet, "b", inv);
    const char *names[] = {"b"};
    fh_wait_nodes_online(&fleet, names, 1, 60);
    kill(-fleet.agents[k].pid, SIGKILL);
    waitpid(fleet.agents[k].pid, NULL, 0);
    fh_forget(fleet.agents[k].pid);
    long long before = metric(standby_url, "plexus_agent_calls_stored_total");
    assert_true(before >= 0);
    char urls[200];
    snprintf(urls, sizeof urls, "%s,%s", standby_url, fleet.url);
    fleet.agents[k].pid = fh_spawn_agent(&fleet, &fleet.agents[k], "b", inv, urls, NULL);
    free(inv);

    /* The registration and heartbeats reach the standby... */
    long long now = before;
    for (int t = 0; t < 600 && now < before + 3; t++) {
        fh_sleep_ms(50);
        now = metric(standby_url, "plexus_agent_calls_stored_total");
    }
    if (now < before + 3)
        fh_print_log(fleet.agents[k].log);
    assert_true(now >= before + 3);
    /* ...and the scheduler hears of them through the database. */
    fh_wait_nodes_online(&fleet, names, 1, 60);

    char *id =
        fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo served-by-the-standby\"],"
                          " \"frameworks\": [\"onlyb\"]}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed,cancelled", 60);
    if (strcmp(json_string_value(json_object_get(job, "state")), "succeeded") != 0) {
        fh_print_log(fleet.server.log);
        fh_print_log(standby.log);
        fh_print_log(fleet.agents[k].log);
    }
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_string_equal(fh_member_node(job, 0), "b");
    json_decref(job);
    char path[160];
    json_t *r = NULL;
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0", id);
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", path, NULL, &r), 200);
    char *text = json_dumps(r, 0);
    assert_non_null(strstr(text, "served-by-the-standby"));
    free(text);
    json_decref(r);
    /* Its poll, start, output and finish went through the standby too. */
    assert_true(metric(standby_url, "plexus_agent_calls_stored_total") >= now + 4);
    /* What the standby cannot answer names the scheduler's URL. */
    assert_int_equal(call(standby_url, FH_USER_TOKEN, "GET", "/v1/nodes", NULL, NULL), 503);
    assert_non_null(strstr(last_error, fleet.url));
    standby_refuses_hostile_agent_calls("b", id);
    free(id);
}

/* A poll of node b's assignments on the standby, as its agent would send. */
typedef struct standby_poll {
    const char *cred;
    const char *query;
    long code;
    size_t n_assignments;
    uint64_t took_ns;
} standby_poll;

static void *poll_standby(void *arg)
{
    standby_poll *p = arg;
    uint64_t t0 = px_now_ns();
    json_t *r = NULL;
    p->code = call(standby_url, p->cred, "GET", p->query, NULL, &r);
    p->n_assignments = json_array_size(json_object_get(r, "assignments"));
    p->took_ns = px_now_ns() - t0;
    json_decref(r);
    return NULL;
}

#define N_POLLS 16

static void run_polls(standby_poll *p, const char *cred, const char *query, pthread_t *t)
{
    for (int i = 0; i < N_POLLS; i++) {
        p[i] = (standby_poll){.cred = cred, .query = query};
        assert_int_equal(pthread_create(&t[i], NULL, poll_standby, &p[i]), 0);
    }
}

/* Many polls waiting on a standby are served by one read of the database
 * per tick (250 ms), not one each; an assignment written meanwhile still
 * reaches every one of them within a tick or two. */
static void test_standby_polls_share_one_read_per_tick(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    char *cred = node_credential("b");
    standby_poll p[N_POLLS];
    pthread_t t[N_POLLS];
    long long before = metric(standby_url, "plexus_standby_poll_reads_total");
    assert_true(before >= 0);
    run_polls(p, cred, "/v1/agent/assignments?wait=2&node=b", t);
    for (int i = 0; i < N_POLLS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(p[i].code, 200);
        assert_int_equal(p[i].n_assignments, 0);
    }
    /* 16 polls of 2 s, and the agent's own: about 8 ticks' reads, where
     * one read per poll and tick would be well over a hundred. */
    long long reads = metric(standby_url, "plexus_standby_poll_reads_total") - before;
    print_message("%lld reads for %d polls of 2 s\n", reads, N_POLLS);
    assert_true(reads >= 4);
    assert_true(reads <= 16);

    run_polls(p, cred, "/v1/agent/assignments?wait=20&node=b", t);
    fh_sleep_ms(300);
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo polled\"],"
                                 " \"frameworks\": [\"onlyb\"]}");
    for (int i = 0; i < N_POLLS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(p[i].code, 200);
        assert_int_equal(p[i].n_assignments, 1);
        assert_true(p[i].took_ns < 10000000000ull);
    }
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed,cancelled", 60);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    free(id);
    free(cred);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standby_serves_submissions_and_reads_from_the_database),
        cmocka_unit_test(test_scheduler_woken_by_the_databases_notification),
        cmocka_unit_test(test_agent_reports_go_straight_to_the_scheduler),
        cmocka_unit_test(test_blobs_uploaded_to_one_replica_are_served_by_the_other),
        cmocka_unit_test(test_artifacts_are_served_by_every_replica_from_the_database),
        cmocka_unit_test(test_standby_cancellation_is_carried_out_by_the_scheduler),
        cmocka_unit_test(test_agent_listing_the_standby_first_is_served_by_it),
        cmocka_unit_test(test_standby_polls_share_one_read_per_tick),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
