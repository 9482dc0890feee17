/* The fleet server's HTTP API, in process on an ephemeral port of
 * 127.0.0.1, driven with libcurl: authentication, bounded and malformed
 * requests, the job life cycle with agents' reports, attempts after a lost
 * lease, gangs, services, cancels, artifacts and a restart of the server. */
#include "px_test.h"

#include "http_reply.h"

#include "fleet/fleet_impl.h"
#include "plexus/fleet.h"
#include "plexus/hw.h"

#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AGENT_TOKEN "agent-token-0123456789abcdef" /* the join token */
#define USER_TOKEN  "user-token-0123456789abcdef"  /* the user "admin", role admin */

static char base_url[128];

typedef px_test_reply reply;

static reply http(const char *method, const char *path, const char *token, const char *body,
                  size_t len)
{
    reply r = px_test_http(base_url, method, path, token, body, len, 20);
    if (r.status == 0)
        fail_msg("%s %s: %s", method, path, r.body);
    return r;
}

static reply req(const char *method, const char *path, const char *token, const char *json)
{
    return http(method, path, token, json, json ? strlen(json) : 0);
}

static void drop(reply *r)
{
    px_test_reply_drop(r);
}

static void expect(const char *method, const char *path, const char *token, const char *json,
                   long status, const char *needle)
{
    reply r = req(method, path, token, json);
    if (r.status != status)
        fail_msg("%s %s: expected %ld, got %ld: %s", method, path, status, r.status, r.body);
    if (needle)
        px_assert_contains(r.body, needle);
    drop(&r);
}

/* Node credentials made by the test's "agents" as they join. */
static struct {
    char name[32];
    char cred[96];
} creds[32];
static int n_creds;

static const char *cred_of(const char *node)
{
    for (int i = 0; i < n_creds; i++)
        if (!strcmp(creds[i].name, node))
            return creds[i].cred;
    assert_true(n_creds < 32);
    snprintf(creds[n_creds].name, sizeof creds[0].name, "%s", node);
    snprintf(creds[n_creds].cred, sizeof creds[0].cred, "node-credential-of-%s-0123456789abcdef",
             node);
    return creds[n_creds++].cred;
}

static px_fleet_server *start(const char *data, double lease)
{
    px_fleet_server_options o = {.listen = "127.0.0.1:0",
                                 .data_dir = data,
                                 .cluster_token = AGENT_TOKEN,
                                 .api_token = USER_TOKEN,
                                 .lease_s = lease,
                                 .restart_backoff_s = 0.2};
    px_fleet_server *srv;
    px_err err;
    px_assert_ok(px_fleet_server_start(&o, &srv, &err), &err);
    snprintf(base_url, sizeof base_url, "%s", px_fleet_server_url(srv));
    return srv;
}

static char *fresh_dir(const char *name)
{
    n_creds = 0;
    char *d = px_asprintf("%s/%s", px_test_tmpdir(), name);
    return d;
}

/* Joins the node (the first time, with the join token and a credential
 * of its own) or registers it again with that credential. */
static void register_node(const char *name, const char *extra)
{
    char body[2048];
    bool joined = false;
    for (int i = 0; i < n_creds; i++)
        joined = joined || !strcmp(creds[i].name, name);
    const char *cred = cred_of(name);
    if (!joined) {
        snprintf(body, sizeof body,
                 "{\"name\": \"%s\", \"credential\": \"%s\", \"cpus\": 8, \"memory\": "
                 "\"16 GiB\"%s}",
                 name, cred, extra ? extra : "");
        expect("POST", "/v1/agent/join", AGENT_TOKEN, body, 200, "\"lease_s\"");
        return;
    }
    snprintf(body, sizeof body, "{\"name\": \"%s\", \"cpus\": 8, \"memory\": \"16 GiB\"%s}", name,
             extra ? extra : "");
    expect("POST", "/v1/agent/register", cred, body, 200, "\"lease_s\"");
}

static char *submit(const char *spec)
{
    reply r = req("POST", "/v1/jobs", USER_TOKEN, spec);
    if (r.status != 201)
        fail_msg("submit: %ld %s", r.status, r.body);
    char *id = px_strdup(json_string_value(json_object_get(r.json, "id")));
    drop(&r);
    return id;
}

/* Long-polls node's assignments; returns the JSON array (caller decrefs). */
static json_t *assignments(const char *node, int wait)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/agent/assignments?node=%s&wait=%d", node, wait);
    reply r = req("GET", path, cred_of(node), NULL);
    assert_int_equal(r.status, 200);
    json_t *a = json_incref(json_object_get(r.json, "assignments"));
    drop(&r);
    return a;
}

static void report(const char *id, const char *what, const char *node, int attempt, int rank,
                   const char *extra, long status)
{
    char path[128], body[512];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/%s", id, what);
    snprintf(body, sizeof body, "{\"node\": \"%s\", \"attempt\": %d, \"rank\": %d%s}", node,
             attempt, rank, extra ? extra : "");
    expect("POST", path, cred_of(node), body, status, NULL);
}

static char *job_state(const char *id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    char *s = px_strdup(json_string_value(json_object_get(r.json, "state")));
    drop(&r);
    return s;
}

static void heartbeat(const char *node, const char *running)
{
    char body[512];
    snprintf(body, sizeof body, "{\"node\": \"%s\", \"running\": %s}", node, running);
    expect("POST", "/v1/agent/heartbeat", cred_of(node), body, 200, NULL);
}

static void test_api_refuses_bad_tokens(void **state)
{
    (void)state;
    char *d = fresh_dir("auth");
    px_fleet_server *srv = start(d, 5);
    expect("GET", "/v1/health", NULL, NULL, 200, "\"ok\"");
    expect("GET", "/metrics", NULL, NULL, 200, "plexus_jobs_submitted_total");
    expect("GET", "/v1/jobs", NULL, NULL, 401, "missing token");
    expect("GET", "/v1/jobs", "wrong-token-0123456789", NULL, 401, "unknown token");
    expect("GET", "/v1/jobs", AGENT_TOKEN, NULL, 403, "join token only joins");
    expect("POST", "/v1/agent/register", USER_TOKEN, "{\"name\": \"n\"}", 403, "for agents");
    expect("POST", "/v1/agent/register", AGENT_TOKEN, "{\"name\": \"n\"}", 403,
           "join token only joins");
    expect("GET", "/v1/jobs", USER_TOKEN, NULL, 200, "\"jobs\"");
    /* The token never shows up in an answer. */
    reply r = req("GET", "/v1/jobs", "wrong-token-0123456789", NULL);
    assert_null(strstr(r.body, "wrong-token"));
    drop(&r);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_refuses_malformed_and_oversized_requests(void **state)
{
    (void)state;
    char *d = fresh_dir("bad");
    px_fleet_server *srv = start(d, 5);
    expect("POST", "/v1/jobs", USER_TOKEN, "{\"command\": [", 400, "request body");
    expect("POST", "/v1/jobs", USER_TOKEN, "[1, 2]", 400, "expected a JSON object");
    expect("POST", "/v1/jobs", USER_TOKEN, "", 400, "expected a JSON object");
    expect("POST", "/v1/jobs", USER_TOKEN,
           "{\"command\": [\"a\"], \"resources\": {\"gpus\": \"two\"}}", 400, "/resources/gpus");
    expect("POST", "/v1/jobs", USER_TOKEN, "{\"comand\": [\"a\"]}", 400, "comand");
    expect("GET", "/v1/nowhere", USER_TOKEN, NULL, 404, "no such endpoint");
    expect("DELETE", "/v1/jobs", USER_TOKEN, NULL, 405, NULL);
    expect("GET", "/v1/jobs/j-424242", USER_TOKEN, NULL, 404, "no job");
    expect("GET", "/v1/jobs?limit=5000", USER_TOKEN, NULL, 400, "limit");
    expect("GET", "/v1/jobs?state=sleeping", USER_TOKEN, NULL, 400, "state");
    expect("GET", "/v1/blobs/zz", USER_TOKEN, NULL, 400, "64 hex digits");
    expect("POST", "/v1/agent/join", AGENT_TOKEN,
           "{\"name\": \"a b\", \"credential\": \"node-credential-0123456789abcdef0123\"}", 400,
           "/name");
    register_node("m1", NULL);
    expect("POST", "/v1/agent/heartbeat", cred_of("m1"), "{\"node\": \"ghost\"}", 403,
           "only for itself");
    expect("GET", "/v1/agent/assignments?node=m1&wait=99", cred_of("m1"), NULL, 400, "wait");
    /* A body over 1 MiB is refused before it is read whole. */
    size_t n = (1u << 20) + 100;
    char *big = malloc(n);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    reply r = http("POST", "/v1/jobs", USER_TOKEN, big, n);
    assert_int_equal(r.status, 413);
    px_assert_contains(r.body, "over the limit");
    drop(&r);
    free(big);
    /* Deep nesting is refused by the JSON limits. */
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 0; i < 100; i++)
        px_strbuf_adds(&sb, "{\"a\":");
    px_strbuf_adds(&sb, "1");
    for (int i = 0; i < 100; i++)
        px_strbuf_adds(&sb, "}");
    expect("POST", "/v1/jobs", USER_TOKEN, sb.buf, 400, "nesting");
    px_strbuf_release(&sb);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_runs_a_job_through_its_life(void **state)
{
    (void)state;
    char *d = fresh_dir("life");
    px_fleet_server *srv = start(d, 5);
    char *id = submit("{\"name\": \"hello\", \"command\": [\"echo\", \"hi\"], \"resources\": "
                      "{\"vendor\": \"nvidia\"}, \"artifacts\": [\"out/result.txt\"]}");
    /* No node yet: the explanation says so once considered. */
    register_node("cpu1", NULL);
    register_node("gpu1", ", \"node\": {\"devices\": [{\"id\": \"gpu0\", \"class\": \"gpu\", "
                          "\"vendor\": \"nvidia\", \"memory\": \"24 GB\"}]}");
    json_t *a = assignments("gpu1", 5);
    assert_int_equal(json_array_size(a), 1);
    const json_t *as = json_array_get(a, 0);
    assert_string_equal(json_string_value(json_object_get(as, "job")), id);
    assert_int_equal(json_integer_value(json_object_get(as, "attempt")), 1);
    assert_string_equal(json_string_value(json_array_get(json_object_get(as, "devices"), 0)),
                        "gpu0");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(as, "env"), "WORLD_SIZE")), "1");
    json_decref(a);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    px_assert_contains(r.body, "\"placed\":true");
    px_assert_contains(r.body, "no nvidia GPU");
    drop(&r);
    report(id, "start", "gpu1", 1, 0, ", \"pid\": 42", 200);
    char *st = job_state(id);
    assert_string_equal(st, "running");
    free(st);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/logs?attempt=1&rank=0&stream=stdout", id);
    reply l = http("POST", path, cred_of("gpu1"), "hi\n\xff", 4);
    assert_int_equal(l.status, 200);
    drop(&l);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/out%%2Fresult.txt?attempt=1", id);
    l = http("PUT", path, cred_of("gpu1"), "42", 2);
    assert_int_equal(l.status, 201);
    drop(&l);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/%%2Fetc%%2Fpasswd?attempt=1", id);
    expect("PUT", path, cred_of("gpu1"), "x", 400, "absolute");
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/a%%2F..%%2F..%%2Fx?attempt=1", id);
    expect("PUT", path, cred_of("gpu1"), "x", 400, "cannot leave");
    report(id, "finish", "gpu1", 1, 0, ", \"exit_code\": 0, \"result\": {\"answer\": 42}", 200);
    st = job_state(id);
    assert_string_equal(st, "succeeded");
    free(st);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0&wait=1", id);
    r = req("GET", path, USER_TOKEN, NULL);
    px_assert_contains(r.body, "\"data\":\"hi\\n\xef\xbf\xbd\"");
    px_assert_contains(r.body, "\"done\":true");
    drop(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/out%%2Fresult.txt", id);
    r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "42");
    drop(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    r = req("GET", path, USER_TOKEN, NULL);
    px_assert_contains(r.body, "\"result\":{\"answer\":42}");
    drop(&r);
    /* A late report for an ended job is refused and changes nothing. */
    report(id, "finish", "gpu1", 1, 0, ", \"exit_code\": 1", 409);
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    expect("POST", path, USER_TOKEN, NULL, 409, "already ended");
    expect("GET", "/metrics", NULL, NULL, 200, "plexus_placements_total 1");
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_requeues_work_of_a_lost_node_with_next_attempt(void **state)
{
    (void)state;
    char *d = fresh_dir("lease");
    px_fleet_server *srv = start(d, 0.6);
    register_node("a", NULL);
    char *id = submit("{\"command\": [\"sleep\", \"100\"]}");
    json_t *as = assignments("a", 5);
    assert_int_equal(json_array_size(as), 1);
    json_decref(as);
    report(id, "start", "a", 1, 0, NULL, 200);
    /* "a" goes silent; "b" keeps heartbeating and receives attempt 2. */
    register_node("b", NULL);
    json_t *got = NULL;
    for (int i = 0; i < 40 && (!got || json_array_size(got) == 0); i++) {
        json_decref(got);
        heartbeat("b", "[]");
        got = assignments("b", 0);
        usleep(100000);
    }
    assert_int_equal(json_array_size(got), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(got, 0), "attempt")), 2);
    json_decref(got);
    /* The old attempt's late report is refused; its agent is told to stop. */
    report(id, "finish", "a", 1, 0, ", \"exit_code\": 0", 409);
    char running[160];
    snprintf(running, sizeof running, "[{\"job\": \"%s\", \"attempt\": 1, \"rank\": 0}]", id);
    char body[300];
    snprintf(body, sizeof body, "{\"node\": \"a\", \"running\": %s}", running);
    reply r = req("POST", "/v1/agent/heartbeat", cred_of("a"), body);
    assert_int_equal(json_array_size(json_object_get(r.json, "stop")), 1);
    drop(&r);
    report(id, "start", "b", 2, 0, NULL, 200);
    /* "b" restarts and registers again without the job: attempt 3 waits
     * for a node at once, without waiting for a lease to run out. */
    expect("POST", "/v1/nodes/a/drain", USER_TOKEN, NULL, 200, NULL); /* "a" came back */
    register_node("b", NULL);
    char jp[64];
    snprintf(jp, sizeof jp, "/v1/jobs/%s", id);
    expect("GET", jp, USER_TOKEN, NULL, 200, "\"attempt\":3");
    char *st;
    json_t *again = assignments("b", 5);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(again, 0), "attempt")), 3);
    json_decref(again);
    report(id, "start", "b", 3, 0, NULL, 200);
    report(id, "finish", "b", 3, 0, ", \"exit_code\": 0", 200);
    st = job_state(id);
    assert_string_equal(st, "succeeded");
    free(st);
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

/* A heartbeat whose numbered running list no longer holds a member the
 * server thinks running requeues it at once; a list taken before the
 * member was listed, or one without a number, loses nothing. */
static void test_api_heartbeat_requeues_work_the_agent_no_longer_lists(void **state)
{
    (void)state;
    char *d = fresh_dir("reconcile");
    px_fleet_server *srv = start(d, 30);
    register_node("h1", NULL);
    char *id = submit("{\"command\": [\"sleep\", \"100\"]}");
    json_t *as = assignments("h1", 5);
    assert_int_equal(json_array_size(as), 1);
    json_decref(as);
    report(id, "start", "h1", 1, 0, ", \"listed\": 1000", 200);
    char jp[64], listed[200], body[400];
    snprintf(jp, sizeof jp, "/v1/jobs/%s", id);
    snprintf(listed, sizeof listed, "[{\"job\": \"%s\", \"attempt\": 1, \"rank\": 0}]", id);
    /* Listed: kept. */
    snprintf(body, sizeof body, "{\"node\": \"h1\", \"running\": %s, \"running_seq\": 1000}",
             listed);
    expect("POST", "/v1/agent/heartbeat", cred_of("h1"), body, 200, NULL);
    /* A list from before the member joined it, and an unnumbered one:
     * they say nothing of it. */
    expect("POST", "/v1/agent/heartbeat", cred_of("h1"),
           "{\"node\": \"h1\", \"running\": [], \"running_seq\": 999}", 200, NULL);
    heartbeat("h1", "[]");
    char *st = job_state(id);
    assert_string_equal(st, "running");
    free(st);
    expect("GET", jp, USER_TOKEN, NULL, 200, "\"attempt\":1");
    /* A later list without it: the work ended unreported; attempt 2. */
    expect("POST", "/v1/agent/heartbeat", cred_of("h1"),
           "{\"node\": \"h1\", \"running\": [], \"running_seq\": 1001}", 200, NULL);
    expect("GET", jp, USER_TOKEN, NULL, 200, "\"attempt\":2");
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_gang_and_member_failure_fail_the_group(void **state)
{
    (void)state;
    char *d = fresh_dir("gang");
    px_fleet_server *srv = start(d, 5);
    register_node("g1", NULL);
    char *id = submit("{\"command\": [\"train\"], \"nodes\": 2, \"launcher\": \"torchrun\"}");
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    /* One node: nothing placed (all or nothing). */
    reply r = req("GET", path, USER_TOKEN, NULL);
    for (int i = 0; i < 20 && !strstr(r.body, "1 of 2 nodes fit"); i++) {
        drop(&r);
        usleep(50000);
        r = req("GET", path, USER_TOKEN, NULL);
    }
    px_assert_contains(r.body, "1 of 2 nodes fit");
    drop(&r);
    json_t *none = assignments("g1", 0);
    assert_int_equal(json_array_size(none), 0);
    json_decref(none);
    register_node("g2", NULL);
    json_t *a1 = assignments("g1", 5), *a2 = assignments("g2", 5);
    assert_int_equal(json_array_size(a1), 1);
    assert_int_equal(json_array_size(a2), 1);
    const json_t *m = json_array_get(a1, 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(m, "env"), "WORLD_SIZE")),
                        "2");
    assert_non_null(json_object_get(m, "torchrun_args"));
    int rank1 = (int)json_integer_value(json_object_get(m, "rank"));
    int rank2 = (int)json_integer_value(json_object_get(json_array_get(a2, 0), "rank"));
    assert_int_not_equal(rank1, rank2);
    json_decref(a1);
    json_decref(a2);
    report(id, "start", "g1", 1, rank1, NULL, 200);
    report(id, "start", "g2", 1, rank2, NULL, 200);
    report(id, "finish", "g1", 1, rank1, ", \"exit_code\": 3", 200);
    char *st = job_state(id);
    assert_string_equal(st, "failed");
    free(st);
    char running[160];
    snprintf(running, sizeof running, "[{\"job\": \"%s\", \"attempt\": 1, \"rank\": %d}]", id,
             rank2);
    char body[300];
    snprintf(body, sizeof body, "{\"node\": \"g2\", \"running\": %s}", running);
    r = req("POST", "/v1/agent/heartbeat", cred_of("g2"), body);
    assert_int_equal(json_array_size(json_object_get(r.json, "stop")), 1);
    drop(&r);
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_service_restarts_after_exit(void **state)
{
    (void)state;
    char *d = fresh_dir("svc");
    px_fleet_server *srv = start(d, 5);
    register_node("s1", NULL);
    char *id = submit(
        "{\"command\": [\"serve\"], \"service\": {\"port\": 8080, \"health_path\": \"/h\"}}");
    json_t *a = assignments("s1", 5);
    assert_int_equal(json_array_size(a), 1);
    json_decref(a);
    report(id, "start", "s1", 1, 0, NULL, 200);
    report(id, "finish", "s1", 1, 0, ", \"exit_code\": 137, \"error\": \"health check failed\"",
           200);
    /* Restarted with the next attempt after the backoff (0.2 s here). */
    a = assignments("s1", 5);
    assert_int_equal(json_array_size(a), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 0), "attempt")), 2);
    json_decref(a);
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    px_assert_contains(r.body, "\"restarts\":1");
    drop(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    expect("POST", path, USER_TOKEN, NULL, 200, "cancelled");
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_keeps_jobs_across_a_restart(void **state)
{
    (void)state;
    char *d = fresh_dir("restart");
    px_fleet_server *srv = start(d, 5);
    register_node("r1", NULL);
    char *ids[3];
    for (int i = 0; i < 3; i++)
        ids[i] = submit("{\"command\": [\"true\"], \"resources\": {\"cpus\": 8}}");
    json_t *a = assignments("r1", 5);
    assert_int_equal(json_array_size(a), 1); /* 8 CPUs: one at a time */
    json_decref(a);
    report(ids[0], "start", "r1", 1, 0, NULL, 200);
    px_fleet_server_stop(srv);
    srv = start(d, 5);
    /* The running job is still on r1; the others are still queued. */
    char *st = job_state(ids[0]);
    assert_string_equal(st, "running");
    free(st);
    st = job_state(ids[2]);
    assert_string_equal(st, "queued");
    free(st);
    heartbeat("r1", "[]");
    report(ids[0], "finish", "r1", 1, 0, ", \"exit_code\": 0", 200);
    a = assignments("r1", 5);
    assert_int_equal(json_array_size(a), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 0), "job")), ids[1]);
    json_decref(a);
    expect("GET", "/v1/jobs?state=active", USER_TOKEN, NULL, 200, ids[2]);
    for (int i = 0; i < 3; i++)
        free(ids[i]);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_artifacts_refuse_symlinked_folders(void **state)
{
    (void)state;
    char *d = fresh_dir("links");
    px_fleet_server *srv = start(d, 5);
    register_node("l1", NULL);
    char *id = submit("{\"command\": [\"true\"], \"artifacts\": [\"evil/x\", \"ok\"]}");
    json_t *a = assignments("l1", 5);
    json_decref(a);
    char dir[600], link[700];
    snprintf(dir, sizeof dir, "%s/artifacts/%s", d, id);
    mkdir(dir, 0700);
    snprintf(link, sizeof link, "%s/evil", dir);
    assert_int_equal(symlink(px_test_tmpdir(), link), 0);
    char path[160];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/evil%%2Fx?attempt=1", id);
    expect("PUT", path, cred_of("l1"), "x", 400, "link");
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/ok?attempt=7", id);
    expect("PUT", path, cred_of("l1"), "x", 409, "stale attempt");
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static void test_api_plan_auto_plans_or_says_why(void **state)
{
    (void)state;
    char *d = fresh_dir("plan");
    px_fleet_server *srv = start(d, 5);
    register_node("p1", ", \"node\": {\"devices\": [{\"id\": \"cpu0\", \"class\": \"cpu\", "
                        "\"vendor\": \"intel\", \"backend\": \"cpu\", \"compute\": {\"f32\": "
                        "\"1 TFLOP/s\"}, \"memory\": [{\"id\": \"ddr\", \"kind\": \"ddr\", "
                        "\"capacity\": \"16 GiB\", \"bandwidth\": \"50 GB/s\"}]}]}");
    const char *digest = "047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b";
    char spec[300], path[96];
    snprintf(spec, sizeof spec,
             "{\"command\": [\"serve\"], \"plan\": \"auto\", \"model\": {\"digest\": \"%s\"}}",
             digest);
    char *id = submit(spec);
    json_t *a = assignments("p1", 5);
    assert_int_equal(json_array_size(a), 1);
    json_decref(a);
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    expect("GET", path, USER_TOKEN, NULL, 200, "planner unavailable");
    expect("GET", path, USER_TOKEN, NULL, 200, "is not on the server");
    free(id);
    /* The rest needs the real tiny model; stop the server before skipping. */
    char *model = px_test_shared_model("stories260K.gguf");
    if (!model || access(model, R_OK) != 0) {
        free(model);
        px_fleet_server_stop(srv);
        free(d);
        model = px_test_require_shared_model("stories260K.gguf"); /* skips */
    }
    char *data;
    size_t len;
    px_assert_ok(px_read_file(model, 8u << 20, &data, &len, NULL), (px_err *)NULL);
    reply up = http("POST", "/v1/blobs", USER_TOKEN, data, len);
    assert_int_equal(up.status, 201);
    assert_string_equal(json_string_value(json_object_get(up.json, "digest")), digest);
    drop(&up);
    free(data);
    free(model);
    id = submit(spec);
    /* The first job's assignment is repeated until it starts: wait for
     * this job's own, so that its placement (and plan) is done. */
    bool mine = false;
    for (int i = 0; i < 100 && !mine; i++) {
        a = assignments("p1", 1);
        for (size_t k = 0; k < json_array_size(a); k++)
            mine = mine ||
                   !strcmp(json_string_value(json_object_get(json_array_get(a, k), "job")), id);
        json_decref(a);
    }
    assert_true(mine);
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    px_assert_contains(r.body, "\"status\":\"planned\"");
    px_assert_contains(r.body, "plexus.plan/1");
    drop(&r);
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

/* What the planning hook saw: how often it ran, and the answer to
 * GET /v1/jobs it asked for while the plan was being made. */
static atomic_int hook_calls;
static long hook_status;
static char hook_body[4096];

static size_t hook_data(char *p, size_t size, size_t n, void *ud)
{
    (void)ud;
    size_t have = strlen(hook_body);
    size_t take = PX_MIN(size * n, sizeof hook_body - 1 - have);
    memcpy(hook_body + have, p, take);
    hook_body[have + take] = '\0';
    return size * n;
}

/* Runs on the scheduler's thread as a plan begins: asks the API for the
 * jobs.  Were the server lock held, the request could not be answered
 * until the hook returned, and it would time out (status 0). */
static void plan_hook(px_fleet_server *srv)
{
    (void)srv;
    if (atomic_fetch_add(&hook_calls, 1) != 0)
        return;
    CURL *c = curl_easy_init();
    if (!c)
        return;
    char url[256], auth[128];
    snprintf(url, sizeof url, "%s/v1/jobs", base_url);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", USER_TOKEN);
    struct curl_slist *h = curl_slist_append(NULL, auth);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hook_data);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &hook_status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

static void test_api_answers_while_a_job_is_planned(void **state)
{
    (void)state;
    char *d = fresh_dir("planlock");
    atomic_store(&hook_calls, 0);
    hook_status = 0;
    hook_body[0] = '\0';
    px__srv_plan_hook = plan_hook;
    px_fleet_server *srv = start(d, 5);
    register_node("q1", NULL);
    char *id = submit(
        "{\"command\": [\"serve\"], \"plan\": \"auto\", \"model\": "
        "{\"digest\": \"0000000000000000000000000000000000000000000000000000000000000000\"}}");
    json_t *a = assignments("q1", 5);
    assert_int_equal(json_array_size(a), 1);
    json_decref(a);
    px_fleet_server_stop(srv);
    px__srv_plan_hook = NULL;
    /* The plan was asked once, and the API answered meanwhile, listing
     * the very job being planned. */
    assert_int_equal(atomic_load(&hook_calls), 1);
    assert_int_equal(hook_status, 200);
    px_assert_contains(hook_body, id);
    free(id);
    free(d);
}

/* The inventory the planner gets for `plan: "auto"` jobs and deployments
 * keeps the links inside each node (named by the node's registered name)
 * next to the assumed network between nodes, and leaves out the ends it
 * cannot name. */
static void test_api_planner_inventory_keeps_links_inside_nodes(void **state)
{
    (void)state;
    char *d = fresh_dir("links");
    px_fleet_server *srv = start(d, 5);
#define DEV(id)                                                                    \
    "{\"id\": \"" id "\", \"class\": \"cpu\", \"backend\": \"cpu\", \"compute\": " \
    "{\"f32\": \"1 TFLOP/s\"}, \"memory\": [{\"id\": \"ddr\", \"kind\": \"ddr\", " \
    "\"capacity\": \"16 GiB\", \"bandwidth\": \"50 GB/s\"}]}"
    register_node("k1",
                  ", \"node\": {\"id\": \"host-a\", \"devices\": [" DEV("d0") ", " DEV(
                      "d1") "]}, \"links\": [{\"from\": \"d0\", \"to\": \"host-a.d1\", "
                            "\"kind\": \"pcie5\", \"bandwidth\": \"32 GB/s\", "
                            "\"latency\": \"2 us\", \"bidirectional\": true}, "
                            "{\"from\": \"d0\", \"to\": \"host\", \"bandwidth\": \"1 GB/s\"}]");
    register_node("k2", ", \"node\": {\"devices\": [" DEV("d0") "]}");
#undef DEV
    pthread_mutex_lock(&srv->lock);
    json_t *inv = px__srv_fleet_inventory(srv);
    pthread_mutex_unlock(&srv->lock);
    assert_non_null(inv);
    json_t *links = json_object_get(inv, "links");
    bool inside = false, to_host = false;
    size_t i;
    json_t *l;
    json_array_foreach(links, i, l)
    {
        const char *from = json_string_value(json_object_get(l, "from"));
        const char *to = json_string_value(json_object_get(l, "to"));
        if (!strcmp(from, "k1.d0") && !strcmp(to, "k1.d1")) {
            inside = true;
            assert_string_equal(json_string_value(json_object_get(l, "kind")), "pcie5");
            assert_string_equal(json_string_value(json_object_get(l, "bandwidth")), "32 GB/s");
            assert_string_equal(json_string_value(json_object_get(l, "latency")), "2 us");
        }
        to_host = to_host || strstr(to, "host");
    }
    assert_true(inside);
    assert_false(to_host);
    /* The planner reads it: the devices of k1 are joined by that link. */
    px_hw_graph *g = NULL;
    px_err err;
    px_assert_ok(px_hw_graph_from_value(inv, "fleet inventory", NULL, &g, NULL, &err), &err);
    const px_hw_view *v = px_hw_graph_view(g);
    bool pcie = false;
    for (size_t k = 0; k < v->n_links; k++)
        pcie = pcie || v->links[k].kind == PX_HW_LINK_PCIE5;
    assert_true(pcie);
    px_hw_graph_free(g);
    json_decref(inv);
    px_fleet_server_stop(srv);
    free(d);
}

/* A store that keeps blobs, holding one of FAKE_BLOB_SIZE bytes. */
#define FAKE_BLOB_SIZE (4 << 20)
static px_status fake_put_blob(void *self, const char *hex, int fd, int64_t size, px_err *err)
{
    (void)self, (void)hex, (void)fd, (void)size;
    return px_err_set(err, PX_EIO, "not used");
}

static px_status fake_get_blob(void *self, const char *hex, int fd, int64_t *size, px_err *err)
{
    (void)self, (void)hex, (void)err;
    static char chunk[1 << 16];
    for (int64_t done = 0; done < FAKE_BLOB_SIZE; done += (int64_t)sizeof chunk)
        if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk)
            return px_err_set(err, PX_EIO, "short write");
    *size = FAKE_BLOB_SIZE;
    return PX_OK;
}

/* A blob the server fetches from its store into DATA/blobs (for an agent
 * that asks for it) respects --disk-reserve as an upload does: refused,
 * with nothing kept and no bytes past the room written, when it would
 * leave less free than the reserve. */
static void test_blob_fetch_refuses_to_cross_the_disk_reserve(void **state)
{
    (void)state;
    char *d = fresh_dir("reserve");
    px_fleet_server srv;
    memset(&srv, 0, sizeof srv);
    srv.data_dir = d;
    srv.tmp_dir = px_asprintf("%s/tmp", d);
    char *blobs = px_asprintf("%s/blobs", d);
    assert_int_equal(mkdir(d, 0700), 0);
    assert_int_equal(mkdir(srv.tmp_dir, 0700), 0);
    assert_int_equal(mkdir(blobs, 0700), 0);
    static const px__store_ops ops = {
        .version = 9, .put_blob = fake_put_blob, .get_blob = fake_get_blob};
    srv.store.ops = &ops;
    const char *hex = "047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b";
    char path[PATH_MAX];
    px_err err;
    px_assert_ok(px__blob_path(d, hex, path, sizeof path, &err), &err);

    /* 1 MiB of room above the reserve: the 4 MiB blob is refused. */
    srv.opt.disk_reserve = 0;
    int64_t free_now = px__srv_disk_headroom(&srv);
    assert_true(free_now > (16 << 20));
    srv.opt.disk_reserve = (uint64_t)(free_now - (1 << 20));
    assert_int_equal(px__blob_fetch(&srv, hex, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "--disk-reserve");
    px_assert_contains(err.msg, "4194304 bytes");
    assert_int_not_equal(access(path, F_OK), 0);
    DIR *dir = opendir(srv.tmp_dir);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));)
        if (e->d_name[0] != '.')
            fail_msg("a refused fetch left %s in the tmp folder", e->d_name);
    closedir(dir);

    /* With the reserve met, the same blob is fetched and kept. */
    srv.opt.disk_reserve = 1 << 20;
    px_assert_ok(px__blob_fetch(&srv, hex, &err), &err);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, FAKE_BLOB_SIZE);
    free(blobs);
    free(srv.tmp_dir);
    free(d);
}

/* A node with one CPU device of the given compute and bandwidth. */
static void register_cpu_node(const char *name, const char *flops, const char *bandwidth)
{
    char extra[600];
    snprintf(extra, sizeof extra,
             ", \"node\": {\"devices\": [{\"id\": \"cpu0\", \"class\": \"cpu\", "
             "\"vendor\": \"intel\", \"backend\": \"cpu\", \"compute\": {\"f32\": \"%s\"}, "
             "\"memory\": [{\"id\": \"ddr\", \"kind\": \"ddr\", \"capacity\": \"16 GiB\", "
             "\"bandwidth\": \"%s\"}]}]}",
             flops, bandwidth);
    register_node(name, extra);
}

static void resident_on(const char *node, const char *digest)
{
    char body[300];
    snprintf(body, sizeof body, "{\"node\": \"%s\", \"running\": [], \"resident\": [\"%s\"]}", node,
             digest);
    expect("POST", "/v1/agent/heartbeat", cred_of(node), body, 200, NULL);
}

/* Deploys the model as name and returns the reply (the caller drops it). */
static reply deploy(const char *name, const char *digest)
{
    char body[300];
    snprintf(body, sizeof body, "{\"name\": \"%s\", \"model\": \"%s\"}", name, digest);
    reply r = req("POST", "/v1/deployments", USER_TOKEN, body);
    if (r.status != 201)
        fail_msg("deploy %s: %ld %s", name, r.status, r.body);
    return r;
}

static const char *placed_on(const reply *r)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(r->json, "plan"), "residency"), "placed_on"));
}

static const char *stage0_node(const reply *r)
{
    return json_string_value(json_object_get(
        json_array_get(json_object_get(json_object_get(r->json, "plan"), "assignment"), 0),
        "node"));
}

static void test_api_deployment_prefers_warm_nodes_unless_they_cost_too_much(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *d = fresh_dir("warm");
    px_fleet_server *srv = start(d, 30);
    char *data;
    size_t len;
    px_assert_ok(px_read_file(model, 8u << 20, &data, &len, NULL), (px_err *)NULL);
    reply up = http("POST", "/v1/blobs", USER_TOKEN, data, len);
    assert_int_equal(up.status, 201);
    char *digest = px_strdup(json_string_value(json_object_get(up.json, "digest")));
    drop(&up);
    free(data);
    register_cpu_node("w1", "1 TFLOP/s", "50 GB/s");
    register_cpu_node("w2", "1 TFLOP/s", "50 GB/s");
    register_cpu_node("w3", "1 TFLOP/s", "50 GB/s");

    /* A node fetches only the models of its own work. */
    char blob[128];
    snprintf(blob, sizeof blob, "/v1/blobs/%s", digest);
    expect("GET", blob, cred_of("w1"), NULL, 403, "only the models of its own assignments");

    /* Resident nowhere: every node is a candidate, and the record says so. */
    reply r = deploy("cold", digest);
    assert_string_equal(placed_on(&r), "every online node");
    px_assert_contains(r.body, "resident on no online node");
    /* The node of its plan is told to hold the model and may fetch it;
     * another may not. */
    char *holder = px_strdup(stage0_node(&r));
    drop(&r);
    char hb[200];
    snprintf(hb, sizeof hb, "{\"node\": \"%s\", \"running\": []}", holder);
    r = req("POST", "/v1/agent/heartbeat", cred_of(holder), hb);
    assert_int_equal(r.status, 200);
    px_assert_contains(r.body, digest);
    drop(&r);
    reply got = http("GET", blob, cred_of(holder), NULL, 0);
    assert_int_equal(got.status, 200);
    drop(&got);
    register_node("idle", NULL); /* describes no device: in no plan */
    expect("GET", blob, cred_of("idle"), NULL, 403, "only the models of its own assignments");
    free(holder);

    /* Resident on w3 alone, and w3 is as good as any: it lands there. */
    resident_on("w3", digest);
    r = deploy("warm", digest);
    assert_string_equal(placed_on(&r), "warm nodes");
    assert_string_equal(stage0_node(&r), "w3");
    px_assert_contains(r.body, "resident on 1 of 4 online nodes");
    drop(&r);

    /* A warm node far slower than the cold ones: the plan over every node
     * wins, and the record says by how much. */
    register_cpu_node("slow", "1 GFLOP/s", "100 MB/s");
    resident_on("w3", "00000000000000000000000000000000000000000000000000000000000000aa");
    resident_on("slow", digest);
    r = deploy("fast", digest);
    assert_string_equal(placed_on(&r), "every online node");
    px_assert_contains(r.body, "worse): planned over every node");
    assert_string_not_equal(stage0_node(&r), "slow");
    drop(&r);

    /* Listing and ending them. */
    r = req("GET", "/v1/deployments", USER_TOKEN, NULL);
    assert_int_equal(json_array_size(json_object_get(r.json, "deployments")), 3);
    drop(&r);
    expect("DELETE", "/v1/deployments/warm", USER_TOKEN, NULL, 200, "undeployed");
    expect("GET", "/v1/deployments/warm", USER_TOKEN, NULL, 404, "no deployment");
    free(digest);
    free(model);
    px_fleet_server_stop(srv);
    free(d);
}

/* Two emulated GPUs of a node joined by NVLink, slow in compute: for
 * the tiny model the planner's best stage at the latency objective is a
 * tensor-parallel pair, which the stage workers cannot run.  A deployment
 * plans, as `plexus serve` does, one device per stage. */
static void test_api_deployment_plans_one_device_per_stage(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *d = fresh_dir("maxtp");
    px_fleet_server *srv = start(d, 30);
    char *data;
    size_t len;
    px_assert_ok(px_read_file(model, 8u << 20, &data, &len, NULL), (px_err *)NULL);
    reply up = http("POST", "/v1/blobs", USER_TOKEN, data, len);
    assert_int_equal(up.status, 201);
    char *digest = px_strdup(json_string_value(json_object_get(up.json, "digest")));
    drop(&up);
    free(data);
#define GPU(id)                                                                               \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"backend\": \"emu\", " \
    "\"compute\": {\"f32\": \"10 GFLOP/s\"}, \"memory\": [{\"id\": \"hbm\", \"kind\": "       \
    "\"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"
    register_node("t1", ", \"node\": {\"devices\": [" GPU("gpu0") ", " GPU(
                            "gpu1") "]}, \"links\": [{\"from\": \"gpu0\", \"to\": \"gpu1\", "
                                    "\"kind\": \"nvlink4\", \"bandwidth\": \"90 GB/s\", "
                                    "\"latency\": \"1 us\", \"bidirectional\": true}]");
#undef GPU
    reply r = deploy("pair", digest);
    const json_t *stages =
        json_object_get(json_object_get(json_object_get(r.json, "plan"), "plan"), "stages");
    assert_true(json_array_size(stages) > 0);
    size_t i;
    json_t *st;
    json_array_foreach(stages, i, st)
    {
        if (json_integer_value(json_object_get(st, "tensor_parallel")) != 1 ||
            json_array_size(json_object_get(st, "devices")) != 1)
            fail_msg("stage %zu is not one device: %s", i, r.body);
    }
    drop(&r);
    free(digest);
    free(model);
    px_fleet_server_stop(srv);
    free(d);
}

typedef struct late_log {
    char path[160];
} late_log;

static void *post_late_log(void *arg)
{
    late_log *l = arg;
    usleep(300000);
    reply r = http("POST", l->path, cred_of("d2"), "late line\n", 10);
    drop(&r);
    return NULL;
}

static void test_api_drain_group_restart_and_log_long_poll(void **state)
{
    (void)state;
    char *d = fresh_dir("drain");
    px_fleet_server *srv = start(d, 5);
    register_node("d1", NULL);
    register_node("d2", NULL);
    expect("POST", "/v1/nodes/d1/drain", USER_TOKEN, NULL, 200, "\"state\":\"draining\"");
    expect("POST", "/v1/nodes/nowhere/drain", USER_TOKEN, NULL, 404, "no node");
    char *id = submit("{\"command\": [\"a\"]}");
    json_t *a = assignments("d2", 5);
    assert_int_equal(json_array_size(a), 1);
    json_decref(a);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    expect("GET", path, USER_TOKEN, NULL, 200, "\"reason\":\"draining\"");
    /* A log chunk posted while a reader waits wakes the reader. */
    report(id, "start", "d2", 1, 0, NULL, 200);
    late_log l;
    snprintf(l.path, sizeof l.path, "/v1/agent/jobs/%s/logs?attempt=1&rank=0&stream=stderr", id);
    pthread_t t;
    pthread_create(&t, NULL, post_late_log, &l);
    uint64_t t0 = px_now_ns();
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0&wait=10", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    pthread_join(t, NULL);
    px_assert_contains(r.body, "late line");
    px_assert_contains(r.body, "\"done\":false");
    assert_true(px_now_ns() - t0 < 5000000000ull);
    drop(&r);
    report(id, "finish", "d2", 1, 0, ", \"exit_code\": 0", 200);
    free(id);
    expect("POST", "/v1/nodes/d1/undrain", USER_TOKEN, NULL, 200, "\"state\":\"online\"");
    /* A group that restarts on a member's failure comes back as attempt 2. */
    id = submit("{\"command\": [\"a\"], \"nodes\": 2, \"on_member_failure\": \"restart\"}");
    json_t *a1 = assignments("d1", 5), *a2 = assignments("d2", 5);
    assert_int_equal(json_array_size(a1), 1);
    assert_int_equal(json_array_size(a2), 1);
    int r1 = (int)json_integer_value(json_object_get(json_array_get(a1, 0), "rank"));
    json_decref(a1);
    json_decref(a2);
    report(id, "finish", "d1", 1, r1, ", \"exit_code\": 1", 200);
    a1 = assignments("d1", 5);
    assert_int_equal(json_array_size(a1), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a1, 0), "attempt")), 2);
    json_decref(a1);
    char *st = job_state(id);
    assert_string_equal(st, "assigned");
    free(st);
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

static char *state_of(const char *id, int *attempt)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    reply r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    char *s = px_strdup(json_string_value(json_object_get(r.json, "state")));
    if (attempt)
        *attempt = (int)json_integer_value(json_object_get(r.json, "attempt"));
    drop(&r);
    return s;
}

static void test_api_never_acknowledges_a_write_the_store_refused(void **state)
{
    (void)state;
    char *d = fresh_dir("full");
    atomic_int full = 0;
    px__store_fail_flag = &full; /* this server's store fails on demand */
    px_fleet_server *srv = start(d, 1.0);
    px__store_fail_flag = NULL;
    register_node("f1", NULL);
    register_node("f2", NULL);
    expect("POST", "/v1/nodes/f2/drain", USER_TOKEN, NULL, 200, NULL);
    char *a = submit("{\"command\": [\"a\"], \"resources\": {\"cpus\": 1}}");
    char *c = submit("{\"command\": [\"c\"], \"resources\": {\"cpus\": 8}}");
    json_t *as = assignments("f1", 5);
    assert_int_equal(json_array_size(as), 1);
    json_decref(as);
    report(a, "start", "f1", 1, 0, NULL, 200);
    atomic_store(&full, 1);
    /* Nothing the store refused is acknowledged, and its error is named. */
    expect("POST", "/v1/jobs", USER_TOKEN, "{\"command\": [\"b\"]}", 503, "disk is full");
    report(a, "finish", "f1", 1, 0, ", \"exit_code\": 0", 503);
    char cancel[96];
    snprintf(cancel, sizeof cancel, "/v1/jobs/%s/cancel", c);
    expect("POST", cancel, USER_TOKEN, NULL, 503, "disk is full");
    expect("POST", "/v1/agent/join", AGENT_TOKEN,
           "{\"name\": \"f3\", \"credential\": \"node-credential-of-f3-0123456789abcdef\"}", 503,
           "disk is full");
    char *st = state_of(a, NULL);
    assert_string_equal(st, "running");
    free(st);
    st = state_of(c, NULL);
    assert_string_equal(st, "queued");
    free(st);
    /* The space comes back: the agent's retry is taken, C is placed. */
    atomic_store(&full, 0);
    report(a, "finish", "f1", 1, 0, ", \"exit_code\": 0", 200);
    st = state_of(a, NULL);
    assert_string_equal(st, "succeeded");
    free(st);
    as = assignments("f1", 5);
    assert_int_equal(json_array_size(as), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(as, 0), "job")), c);
    json_decref(as);
    report(c, "start", "f1", 1, 0, NULL, 200);
    /* f1 is lost while the store refuses: the requeue waits for the store
     * and happens by itself once it takes writes again. */
    atomic_store(&full, 1);
    expect("POST", "/v1/nodes/f2/undrain", USER_TOKEN, NULL, 503, "disk is full");
    int attempt = 0;
    for (int i = 0; i < 30; i++) {
        heartbeat("f2", "[]");
        usleep(100000);
    }
    st = state_of(c, &attempt);
    assert_string_equal(st, "running");
    assert_int_equal(attempt, 1);
    free(st);
    atomic_store(&full, 0);
    for (int i = 0; i < 50 && attempt < 2; i++) {
        heartbeat("f2", "[]");
        usleep(100000);
        free(state_of(c, &attempt));
    }
    assert_int_equal(attempt, 2);
    expect("POST", "/v1/jobs", USER_TOKEN, "{\"command\": [\"b\"]}", 201, NULL);
    free(a);
    free(c);
    px_fleet_server_stop(srv);
    free(d);
}

/* An artifact upload held in the middle of its body: the reader sends
 * `first` bytes, then waits for `go`, then the rest. */
typedef struct held_upload {
    char path[200];
    const char *cred;
    const unsigned char *data;
    size_t len, first, sent;
    atomic_int go;
    long status;
} held_upload;

static size_t held_read(char *buf, size_t size, size_t n, void *ud)
{
    held_upload *h = ud;
    while (h->sent >= h->first && !atomic_load(&h->go))
        usleep(10000);
    size_t end = atomic_load(&h->go) ? h->len : h->first;
    size_t k = PX_MIN(size * n, end - h->sent);
    memcpy(buf, h->data + h->sent, k);
    h->sent += k;
    return k;
}

static void *held_put(void *arg)
{
    held_upload *h = arg;
    CURL *c = curl_easy_init();
    char url[512], auth[300];
    snprintf(url, sizeof url, "%s%s", base_url, h->path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", h->cred);
    struct curl_slist *hd = curl_slist_append(NULL, auth);
    hd = curl_slist_append(hd, "Expect:");
    px_strbuf out = PX_STRBUF_INIT;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, held_read);
    curl_easy_setopt(c, CURLOPT_READDATA, h);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)h->len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, px_test_reply_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &h->status);
    curl_slist_free_all(hd);
    curl_easy_cleanup(c);
    px_strbuf_release(&out);
    return NULL;
}

/* A file under dir, written now and dated `age` seconds back. */
static void plant(const char *dir, const char *name, const char *body, int age)
{
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    struct timespec t[2] = {{.tv_sec = px_wall_time() - age}, {.tv_sec = px_wall_time() - age}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static bool exists_in(const char *dir, const char *name)
{
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* The name of the upload's own temporary file in dir ("" while none). */
static void upload_file(const char *dir, char *out, size_t n)
{
    out[0] = '\0';
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (px_str_starts_with(e->d_name, ".upload-") && !strstr(e->d_name, "planted"))
            snprintf(out, n, "%s", e->d_name);
    closedir(d);
}

/* An artifact whose row the store refuses leaves its file as the row
 * says: an upload again of a kept artifact puts its previous version back,
 * a new one leaves no file; neither leaves a second name behind. */
static void test_api_artifact_refused_by_the_store_keeps_file_and_row_together(void **state)
{
    (void)state;
    char *d = fresh_dir("artrefused");
    atomic_int full = 0;
    px__store_fail_flag = &full;
    px_fleet_server *srv = start(d, 30);
    px__store_fail_flag = NULL;
    register_node("r1", NULL);
    char *id = submit("{\"command\": [\"true\"], \"artifacts\": [\"out/a.txt\", \"out/b.txt\"]}");
    json_t *as = assignments("r1", 5);
    assert_int_equal(json_array_size(as), 1);
    json_decref(as);
    report(id, "start", "r1", 1, 0, NULL, 200);
    char path[200], out[600];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/out%%2Fa.txt?attempt=1", id);
    reply r = http("PUT", path, cred_of("r1"), "first", 5);
    assert_int_equal(r.status, 201);
    drop(&r);
    atomic_store(&full, 1);
    r = http("PUT", path, cred_of("r1"), "second!", 7);
    assert_int_equal(r.status, 503);
    px_assert_contains(r.body, "disk is full");
    drop(&r);
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/out%%2Fb.txt?attempt=1", id);
    r = http("PUT", path, cred_of("r1"), "new", 3);
    assert_int_equal(r.status, 503);
    drop(&r);
    atomic_store(&full, 0);
    snprintf(out, sizeof out, "%s/artifacts/%s/out", d, id);
    assert_false(exists_in(out, "b.txt"));
    DIR *dir = opendir(out);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));)
        if (strstr(e->d_name, ".prev") || strstr(e->d_name, ".upload-"))
            fail_msg("%s was left in %s", e->d_name, out);
    closedir(dir);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/out%%2Fa.txt", id);
    r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "first");
    drop(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    px_assert_contains(r.body, "\"size\":5");
    /* sha256("first") */
    px_assert_contains(r.body, "a7937b64b8caa58f03721bb6bacf5c78cb235febe0e70b1b84cd99541461a08e");
    drop(&r);
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

/* Files a crash left in DATA/artifacts (a cut-off upload's ".upload-*",
 * an artifact renamed into place whose row never came) go once older than
 * the grace period; a fresh one, an artifact a row names, an upload in
 * flight (however old its file: it holds a lock), folders of jobs the
 * store does not know and whatever links point at stay.  The sweep runs at
 * start, and here again with the test's clock. */
static void test_api_sweeps_what_crashed_uploads_left(void **state)
{
    (void)state;
    char *d = fresh_dir("sweep");
    px_fleet_server *srv = start(d, 30);
    register_node("s1", NULL);
    char *id = submit("{\"command\": [\"true\"], \"artifacts\": [\"out/kept.txt\", "
                      "\"out/big.bin\"]}");
    json_t *a = assignments("s1", 5);
    assert_int_equal(json_array_size(a), 1);
    json_decref(a);
    report(id, "start", "s1", 1, 0, NULL, 200);
    char path[200];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/artifacts/out%%2Fkept.txt?attempt=1", id);
    reply r = http("PUT", path, cred_of("s1"), "kept", 4);
    assert_int_equal(r.status, 201);
    drop(&r);
    char out[600], other[600], outside[600];
    snprintf(out, sizeof out, "%s/artifacts/%s/out", d, id);
    snprintf(other, sizeof other, "%s/artifacts/j-999999", d);
    snprintf(outside, sizeof outside, "%s/outside", d);
    assert_int_equal(mkdir(other, 0700), 0);
    assert_int_equal(mkdir(outside, 0700), 0);
    plant(out, ".upload-planted-old", "cut off", 7200);
    plant(out, ".upload-planted-fresh", "in flight elsewhere", 0);
    plant(out, "stray.bin", "renamed, no row", 7200);
    plant(out, "kept.txt", "kept", 7200); /* the artifact itself, dated back */
    plant(other, "x", "not this job's", 7200);
    plant(outside, "target", "outside", 7200);
    char link[700];
    snprintf(link, sizeof link, "%s/link", out);
    assert_int_equal(symlink(outside, link), 0);

    /* An upload in flight, its file dated back too: only its lock keeps it. */
    static unsigned char big[256 << 10];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 7 + 1);
    held_upload h = {.cred = cred_of("s1"), .data = big, .len = sizeof big, .first = 64 << 10};
    snprintf(h.path, sizeof h.path, "/v1/agent/jobs/%s/artifacts/out%%2Fbig.bin?attempt=1", id);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, held_put, &h), 0);
    char tmp[256] = "", held[900] = "";
    struct stat sb = {0};
    for (int i = 0; i < 1000 && (!tmp[0] || sb.st_size == 0); i++) {
        usleep(10000 * PX_TEST_SLOWDOWN);
        upload_file(out, tmp, sizeof tmp);
        snprintf(held, sizeof held, "%s/%s", out, tmp);
        if (!tmp[0] || stat(held, &sb) != 0)
            sb.st_size = 0;
    }
    assert_true(tmp[0] && sb.st_size > 0);
    struct timespec old[2] = {{.tv_sec = px_wall_time() - 7200}, {.tv_sec = px_wall_time() - 7200}};
    assert_int_equal(utimensat(AT_FDCWD, held, old, 0), 0);

    int64_t removed = -1, bytes = -1;
    px_err err;
    px_assert_ok(
        px__srv_collect_files(srv, px_wall_time(), PX__COLLECT_GRACE_S, &removed, &bytes, &err),
        &err);
    assert_int_equal(removed, 2);
    assert_int_equal(bytes, (int64_t)(strlen("cut off") + strlen("renamed, no row")));
    assert_false(exists_in(out, ".upload-planted-old"));
    assert_false(exists_in(out, "stray.bin"));
    assert_true(exists_in(out, ".upload-planted-fresh"));
    assert_true(exists_in(out, "kept.txt"));
    assert_true(exists_in(out, tmp));
    assert_true(exists_in(out, "link"));
    assert_true(exists_in(outside, "target"));
    assert_true(exists_in(other, "x"));

    /* The upload goes on and lands whole. */
    atomic_store(&h.go, 1);
    pthread_join(t, NULL);
    assert_int_equal(h.status, 201);
    assert_false(exists_in(out, tmp));
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/out%%2Fbig.bin", id);
    r = req("GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    drop(&r);
    char file[700];
    snprintf(file, sizeof file, "%s/big.bin", out);
    FILE *f = fopen(file, "rb");
    assert_non_null(f);
    static unsigned char back[sizeof big];
    assert_int_equal(fread(back, 1, sizeof back, f), sizeof back);
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
    assert_memory_equal(back, big, sizeof big);
    /* Past its grace period an artifact a row names stays all the same. */
    assert_int_equal(utimensat(AT_FDCWD, file, old, 0), 0);
    px_assert_ok(
        px__srv_collect_files(srv, px_wall_time(), PX__COLLECT_GRACE_S, &removed, &bytes, &err),
        &err);
    assert_int_equal(removed, 0);
    assert_true(exists_in(out, "big.bin"));

    /* A server started on the folder sweeps it at once. */
    px_fleet_server_stop(srv);
    plant(out, ".upload-planted-crash", "cut off by a crash", 7200);
    srv = start(d, 30);
    for (int i = 0; i < 500 && exists_in(out, ".upload-planted-crash"); i++)
        usleep(10000 * PX_TEST_SLOWDOWN);
    assert_false(exists_in(out, ".upload-planted-crash"));
    assert_true(exists_in(out, ".upload-planted-fresh"));
    assert_true(exists_in(out, "kept.txt"));
    free(id);
    px_fleet_server_stop(srv);
    free(d);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_refuses_bad_tokens),
        cmocka_unit_test(test_api_refuses_malformed_and_oversized_requests),
        cmocka_unit_test(test_api_runs_a_job_through_its_life),
        cmocka_unit_test(test_api_requeues_work_of_a_lost_node_with_next_attempt),
        cmocka_unit_test(test_api_heartbeat_requeues_work_the_agent_no_longer_lists),
        cmocka_unit_test(test_api_gang_and_member_failure_fail_the_group),
        cmocka_unit_test(test_api_service_restarts_after_exit),
        cmocka_unit_test(test_api_keeps_jobs_across_a_restart),
        cmocka_unit_test(test_api_artifacts_refuse_symlinked_folders),
        cmocka_unit_test(test_api_artifact_refused_by_the_store_keeps_file_and_row_together),
        cmocka_unit_test(test_api_plan_auto_plans_or_says_why),
        cmocka_unit_test(test_api_answers_while_a_job_is_planned),
        cmocka_unit_test(test_api_planner_inventory_keeps_links_inside_nodes),
        cmocka_unit_test(test_blob_fetch_refuses_to_cross_the_disk_reserve),
        cmocka_unit_test(test_api_deployment_prefers_warm_nodes_unless_they_cost_too_much),
        cmocka_unit_test(test_api_deployment_plans_one_device_per_stage),
        cmocka_unit_test(test_api_drain_group_restart_and_log_long_poll),
        cmocka_unit_test(test_api_never_acknowledges_a_write_the_store_refused),
        cmocka_unit_test(test_api_sweeps_what_crashed_uploads_left),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
