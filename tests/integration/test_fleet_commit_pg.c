/* The scheduling pass's commit outside the server lock, on a real
 * PostgreSQL server (tests/support/pg_harness.h): the servers run in this
 * process, so that a test holds a pass's commit open (a hook that waits
 * for the test, never a sleep) and looks at the replica meanwhile.  While
 * a commit is held the API answers (job lists, submissions) and shows the
 * job queued, and an agent's poll does not see the assignment until it is
 * committed; a cancel that meets the commit waits for it, and the job
 * ends cancelled without starting; a takeover before the commit reaches
 * the database refuses the old holder's commit (it stops scheduling) and
 * the new holder runs the job once; a takeover while the commit's
 * transaction is open waits for it, and the new holder reads it. */
#include "px_test.h"

#include "fleet/fleet_impl.h"
#include "plexus/fleet.h"
#include "http_reply.h"
#include "pg_harness.h"

#include <curl/curl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define AGENT_TOKEN "agent-token-0123456789abcdef" /* the join token */
#define USER_TOKEN  "user-token-0123456789abcdef"  /* the user "admin", role admin */
#define NODE_CRED   "node-credential-of-n1-0123456789abcdef"
#define WAIT_NS     (30ull * 1000000000ull) /* a deadline for what must happen, not a timing */

static pg_harness pg;
static bool pg_up;

/* ---- HTTP ---- */

typedef px_test_reply reply;

/* Never fails the test itself: a thread of the test calls it too. */
static reply req(const char *base, const char *method, const char *path, const char *token,
                 const char *body)
{
    return px_test_http(base, method, path, token, body, body ? strlen(body) : 0, 60);
}

static void drop(reply *r)
{
    px_test_reply_drop(r);
}

static void expect(const char *base, const char *method, const char *path, const char *token,
                   const char *body, long status)
{
    reply r = req(base, method, path, token, body);
    if (r.status != status)
        fail_msg("%s %s: expected %ld, got %ld: %s", method, path, status, r.status,
                 r.body ? r.body : "");
    drop(&r);
}

static char *submit(const char *base)
{
    reply r = req(base, "POST", "/v1/jobs", USER_TOKEN,
                  "{\"command\": [\"true\"], \"resources\": {\"cpus\": 1}}");
    if (r.status != 201)
        fail_msg("submit: %ld %s", r.status, r.body ? r.body : "");
    char *id = px_strdup(json_string_value(json_object_get(r.json, "id")));
    drop(&r);
    return id;
}

static char *job_state(const char *base, const char *id)
{
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    reply r = req(base, "GET", path, USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    char *s = px_strdup(json_string_value(json_object_get(r.json, "state")));
    drop(&r);
    return s;
}

/* The state GET /v1/jobs lists for id (NULL when not listed). */
static char *listed_state(const char *base, const char *id)
{
    reply r = req(base, "GET", "/v1/jobs", USER_TOKEN, NULL);
    assert_int_equal(r.status, 200);
    const json_t *jobs = json_object_get(r.json, "jobs");
    char *s = NULL;
    for (size_t i = 0; i < json_array_size(jobs) && !s; i++) {
        const json_t *j = json_array_get(jobs, i);
        if (strcmp(json_string_value(json_object_get(j, "id")), id) == 0)
            s = px_strdup(json_string_value(json_object_get(j, "state")));
    }
    drop(&r);
    return s;
}

/* The attempt of id among n1's assignments (0 when absent), after a poll
 * that waits up to `wait` seconds for any assignment. */
static int assigned_attempt(const char *base, const char *id, int wait)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/agent/assignments?node=n1&wait=%d", wait);
    reply r = req(base, "GET", path, NODE_CRED, NULL);
    if (r.status != 200)
        fail_msg("assignments: %ld %s", r.status, r.body ? r.body : "");
    const json_t *a = json_object_get(r.json, "assignments");
    int attempt = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i);
        const char *job = json_string_value(json_object_get(x, "job"));
        if (job && strcmp(job, id) == 0)
            attempt = (int)json_integer_value(json_object_get(x, "attempt"));
    }
    drop(&r);
    return attempt;
}

/* Polls until id is among n1's assignments; its attempt. */
static int wait_assigned(const char *base, const char *id)
{
    uint64_t deadline = px_now_ns() + WAIT_NS;
    int attempt = 0;
    while (!(attempt = assigned_attempt(base, id, 1)) && px_now_ns() < deadline) {
    }
    if (!attempt)
        fail_msg("job %s never reached node n1's assignments", id);
    return attempt;
}

static void report(const char *base, const char *id, const char *what, int attempt, long status)
{
    char path[128], body[256];
    snprintf(path, sizeof path, "/v1/agent/jobs/%s/%s", id, what);
    snprintf(body, sizeof body, "{\"node\": \"n1\", \"attempt\": %d, \"rank\": 0%s}", attempt,
             strcmp(what, "finish") == 0 ? ", \"exit_code\": 0" : "");
    expect(base, "POST", path, NODE_CRED, body, status);
}

/* ---- the database ---- */

static char *query_text(const char *uri, const char *sql)
{
    PGconn *c = PQconnectdb(uri);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *r = PQexec(c, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    char *v = PQntuples(r) ? px_strdup(PQgetvalue(r, 0, 0)) : NULL;
    PQclear(r);
    PQfinish(c);
    return v;
}

static char *job_column(const char *uri, const char *id, const char *column)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT %s FROM jobs WHERE id = '%s'", column, id);
    return query_text(uri, sql);
}

/* Ends the session that holds the scheduler lease (the advisory lock of
 * store_pg.c): the holder has lost the lease, and a standby may take it. */
static void end_lease_session(const char *uri)
{
    char *n = query_text(uri, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_locks"
                              " WHERE locktype = 'advisory' AND classid = 1886152056"
                              " AND objid = 1 AND granted");
    assert_non_null(n);
    assert_string_equal(n, "1");
    free(n);
}

/* ---- servers ---- */

static px_fleet_server *start(const char *uri, const char *name)
{
    char *dir = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_fleet_server_options o = {.listen = "127.0.0.1:0",
                                 .data_dir = dir,
                                 .cluster_token = AGENT_TOKEN,
                                 .api_token = USER_TOKEN,
                                 .lease_s = 60,
                                 .store = uri};
    px_fleet_server *srv;
    px_err err;
    px_assert_ok(px_fleet_server_start(&o, &srv, &err), &err);
    free(dir);
    return srv;
}

static void wait_serving(px_fleet_server *srv)
{
    uint64_t deadline = px_now_ns() + WAIT_NS;
    while (!px_fleet_server_serving(srv) && px_now_ns() < deadline)
        usleep(20000);
    assert_true(px_fleet_server_serving(srv));
}

/* A scheduling replica on a fresh database, with the node n1 joined. */
static px_fleet_server *start_holder(const char *uri, const char *name)
{
    px_fleet_server *srv = start(uri, name);
    wait_serving(srv);
    expect(px_fleet_server_url(srv), "POST", "/v1/agent/join", AGENT_TOKEN,
           "{\"name\": \"n1\", \"credential\": \"" NODE_CRED
           "\", \"cpus\": 8, \"memory\": \"16 GiB\"}",
           200);
    return srv;
}

static uint64_t counter_of(px_fleet_server *srv, const uint64_t *field)
{
    pthread_mutex_lock(&srv->lock);
    uint64_t v = *field;
    pthread_mutex_unlock(&srv->lock);
    return v;
}

/* ---- a commit held open ---- */

/* Holds the first `hold` calls until the test lets them go; the later
 * ones pass. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls, hold;
    bool go;
} gate;

static gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, false};

static void gate_arm(int hold)
{
    pthread_mutex_lock(&g.mu);
    g.calls = 0;
    g.hold = hold;
    g.go = false;
    pthread_mutex_unlock(&g.mu);
}

static void gate_pass(void)
{
    pthread_mutex_lock(&g.mu);
    int call = ++g.calls;
    pthread_cond_broadcast(&g.cv);
    while (call <= g.hold && !g.go)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
}

static void fence_hook(void *ud)
{
    (void)ud;
    gate_pass();
}

static void commit_hook(px_fleet_server *srv)
{
    (void)srv;
    gate_pass();
}

/* Waits until a commit is held at the gate. */
static void gate_wait_held(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    pthread_mutex_lock(&g.mu);
    while (g.calls == 0 && pthread_cond_timedwait(&g.cv, &g.mu, &ts) == 0) {
    }
    int calls = g.calls;
    pthread_mutex_unlock(&g.mu);
    if (calls == 0)
        fail_msg("no pass reached its commit");
}

static void gate_open(void)
{
    pthread_mutex_lock(&g.mu);
    g.go = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

static void unhook(void)
{
    px__store_pg_set_fence_hook(NULL, NULL);
    px__srv_commit_hook = NULL;
}

/* ---- the tests ---- */

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pg_up = pg_harness_start(&pg);
    if (!pg_up)
        fprintf(stderr, "SKIP: %s\n", pg.why);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pg_harness_stop(&pg);
    curl_global_cleanup();
    return 0;
}

static char *fresh(const char *name)
{
    if (!pg_up)
        return NULL;
    char *uri = pg_harness_database(&pg, name);
    assert_non_null(uri);
    return uri;
}

static void test_commit_held_keeps_the_api_answering_and_the_assignment_unseen(void **state)
{
    (void)state;
    char *uri = fresh("held");
    if (!uri)
        skip();
    gate_arm(1);
    px__store_pg_set_fence_hook(fence_hook, NULL);
    px_fleet_server *a = start_holder(uri, "held");
    const char *url = px_fleet_server_url(a);

    char *id = submit(url);
    gate_wait_held(); /* the pass's transaction is open, its COMMIT not sent */
    /* The server lock is free: the API answers, and shows the job queued. */
    char *s = listed_state(url, id);
    assert_non_null(s);
    assert_string_equal(s, "queued");
    free(s);
    s = job_state(url, id);
    assert_string_equal(s, "queued");
    free(s);
    char *other = submit(url);
    /* An agent's poll does not see the assignment. */
    assert_int_equal(assigned_attempt(url, id, 0), 0);
    s = job_column(uri, id, "state");
    assert_string_equal(s, "queued"); /* not committed */
    free(s);

    gate_open();
    assert_int_equal(wait_assigned(url, id), 1);
    s = job_column(uri, id, "state");
    assert_string_equal(s, "assigned");
    free(s);
    report(url, id, "start", 1, 200);
    report(url, id, "finish", 1, 200);
    s = job_state(url, id);
    assert_string_equal(s, "succeeded");
    free(s);
    assert_null(px_fleet_server_failed(a));
    assert_int_equal(counter_of(a, &a->metrics.commit_waits), 0);
    px_fleet_server_stop(a);
    unhook();
    free(other);
    free(id);
    free(uri);
}

typedef struct cancel_call {
    const char *url, *id;
    long status;
    char state[32];
} cancel_call;

static void *cancel_main(void *arg)
{
    cancel_call *c = arg;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", c->id);
    reply r = req(c->url, "POST", path, USER_TOKEN, NULL);
    c->status = r.status;
    const char *st = json_string_value(json_object_get(r.json, "state"));
    snprintf(c->state, sizeof c->state, "%s", st ? st : "");
    drop(&r);
    return NULL;
}

static void test_cancel_during_the_commit_waits_and_the_job_never_starts(void **state)
{
    (void)state;
    char *uri = fresh("cancel");
    if (!uri)
        skip();
    gate_arm(1);
    px__store_pg_set_fence_hook(fence_hook, NULL);
    px_fleet_server *a = start_holder(uri, "cancel");
    const char *url = px_fleet_server_url(a);

    char *id = submit(url);
    gate_wait_held();
    cancel_call c = {.url = url, .id = id};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, cancel_main, &c), 0);
    /* The cancel met the job being committed, and waits for the commit. */
    uint64_t deadline = px_now_ns() + WAIT_NS;
    while (counter_of(a, &a->metrics.commit_waits) == 0 && px_now_ns() < deadline)
        usleep(10000);
    assert_int_equal(counter_of(a, &a->metrics.commit_waits), 1);
    gate_open();
    pthread_join(t, NULL);
    assert_int_equal(c.status, 200);
    assert_string_equal(c.state, "cancelled");

    char *s = job_state(url, id);
    assert_string_equal(s, "cancelled");
    free(s);
    s = job_column(uri, id, "state");
    assert_string_equal(s, "cancelled");
    free(s);
    /* Never handed out, and a start for it is refused. */
    assert_int_equal(assigned_attempt(url, id, 1), 0);
    report(url, id, "start", 1, 409);
    assert_null(px_fleet_server_failed(a));
    px_fleet_server_stop(a);
    unhook();
    free(id);
    free(uri);
}

static void test_takeover_before_the_commit_refuses_it_and_the_job_runs_once(void **state)
{
    (void)state;
    char *uri = fresh("takeover");
    if (!uri)
        skip();
    gate_arm(1);
    px__srv_commit_hook = commit_hook; /* before the fenced transaction begins */
    px_fleet_server *a = start_holder(uri, "takeover_a");
    px_fleet_server *b = start(uri, "takeover_b");
    assert_false(px_fleet_server_serving(b));

    char *id = submit(px_fleet_server_url(a));
    gate_wait_held(); /* a decided; its commit not yet sent */
    end_lease_session(uri);
    wait_serving(b); /* b took the lease (the next epoch) and placed the job itself */
    const char *url = px_fleet_server_url(b);
    assert_int_equal(wait_assigned(url, id), 1);

    gate_open(); /* a's commit, at the old epoch, is refused */
    uint64_t deadline = px_now_ns() + WAIT_NS;
    while (!px_fleet_server_failed(a) && px_now_ns() < deadline)
        usleep(10000);
    assert_non_null(px_fleet_server_failed(a));
    px_assert_contains(px_fleet_server_failed(a), "epoch");
    px_assert_contains(px_fleet_server_failed(a), "assignments were taken back");
    px_assert_contains(px_fleet_server_failed(a), "this server stops serving");
    assert_int_equal(counter_of(a, &a->metrics.placements), 0);
    assert_int_equal(counter_of(b, &b->metrics.placements), 1);

    report(url, id, "start", 1, 200);
    report(url, id, "finish", 1, 200);
    char *s = job_column(uri, id, "state");
    assert_string_equal(s, "succeeded");
    free(s);
    s = job_column(uri, id, "attempt");
    assert_string_equal(s, "1");
    free(s);
    px_fleet_server_stop(a);
    px_fleet_server_stop(b);
    unhook();
    free(id);
    free(uri);
}

static void test_takeover_during_the_commit_waits_for_it_and_reads_it(void **state)
{
    (void)state;
    char *uri = fresh("inflight");
    if (!uri)
        skip();
    gate_arm(1);
    px__store_pg_set_fence_hook(fence_hook, NULL); /* inside the fenced transaction */
    px_fleet_server *a = start_holder(uri, "inflight_a");
    px_fleet_server *b = start(uri, "inflight_b");

    char *id = submit(px_fleet_server_url(a));
    gate_wait_held();
    end_lease_session(uri);
    /* b's increment of the epoch waits for a's transaction, which holds
     * the lease's row. */
    uint64_t deadline = px_now_ns() + WAIT_NS;
    char *waiting = NULL;
    while (px_now_ns() < deadline &&
           (free(waiting), waiting = query_text(uri, "SELECT COUNT(*) FROM pg_stat_activity"
                                                     " WHERE query LIKE 'UPDATE lease%'"
                                                     " AND wait_event_type = 'Lock'")) &&
           strcmp(waiting, "1") != 0)
        usleep(20000);
    assert_string_equal(waiting, "1");
    free(waiting);
    assert_false(px_fleet_server_serving(b));

    gate_open(); /* a's commit lands; b then reads the job assigned */
    wait_serving(b);
    const char *url = px_fleet_server_url(b);
    assert_int_equal(wait_assigned(url, id), 1);
    report(url, id, "start", 1, 200);
    report(url, id, "finish", 1, 200);
    char *s = job_column(uri, id, "state");
    assert_string_equal(s, "succeeded");
    free(s);
    s = job_column(uri, id, "attempt");
    assert_string_equal(s, "1");
    free(s);
    assert_int_equal(counter_of(b, &b->metrics.placements), 0); /* b placed nothing again */
    px_fleet_server_stop(a);
    px_fleet_server_stop(b);
    unhook();
    free(id);
    free(uri);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_held_keeps_the_api_answering_and_the_assignment_unseen),
        cmocka_unit_test(test_cancel_during_the_commit_waits_and_the_job_never_starts),
        cmocka_unit_test(test_takeover_before_the_commit_refuses_it_and_the_job_runs_once),
        cmocka_unit_test(test_takeover_during_the_commit_waits_for_it_and_reads_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
