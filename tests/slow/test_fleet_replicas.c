/*
 * Three `plexus server` replicas on one PostgreSQL database (started by
 * the test, tests/support/pg_harness.h), three agents and four clients
 * given all three URLs (the agents with the standbys first, so that they
 * are served through the database).  300 jobs are submitted (each with its own
 * Idempotency-Key, retried until acknowledged) and the replica holding
 * the scheduler lease is killed with SIGKILL half-way: every acknowledged
 * job succeeds, none runs twice (each run appends its id to a file the
 * test reads), the lease moves to another replica, and the standbys
 * answer 503 "standby" until then.  How fast it moves is a figure of
 * `make bench` (bench_fleet_replicas), not a deadline here: under a loaded
 * machine the polls that observe it take seconds of their own.
 */
#include "../integration/fleet_harness.h"

#include <pthread.h>

#define N_REPLICAS 3
#define N_CLIENTS  4
#define N_JOBS     300
#define LEASE_S    10

static fh_fleet fleet;
static const char *store_uri;
static fh_proc replicas[N_REPLICAS];
static char replica_url[N_REPLICAS][64];

static void start_replica(int i)
{
    char data[700], listen[64];
    snprintf(data, sizeof data, "%s/data-%d", fleet.dir, i);
    int port = fh_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(replica_url[i], sizeof replica_url[i], "http://127.0.0.1:%d", port);
    snprintf(replicas[i].log, sizeof replicas[i].log, "%s/server-%d.log", fleet.dir, i);
    char lease[16];
    snprintf(lease, sizeof lease, "%d", LEASE_S);
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
                    "--lease",
                    lease,
                    NULL};
    const char *env[] = {"PLEXUS_LOG", "info", NULL};
    replicas[i].pid = fh_spawn(argv, replicas[i].log, env);
}

/* The HTTP status of GET /v1/health on one replica alone (0 unreachable). */
static long health(int i)
{
    px_fleet_client *c;
    px_err err;
    px_assert_ok(px_fleet_client_new(replica_url[i], NULL, &c, &err), &err);
    px_fleet_client_set_timeout(c, 1000);
    long code = 0;
    json_t *r = NULL;
    /* The HTTP status says it all (a standby's 503 is a failed call too);
     * 0 when nothing answered: down, or between replicas. */
    px_status st = px_fleet_client_call(c, "GET", "/v1/health", NULL, &code, &r, NULL);
    (void)st;
    json_decref(r);
    px_fleet_client_free(c);
    return code;
}

/* A counter of one replica's /metrics (-1 when absent or unreachable). */
static long long metric(int i, const char *name)
{
    px_fleet_client *c;
    px_err err;
    px_assert_ok(px_fleet_client_new(replica_url[i], NULL, &c, &err), &err);
    char dest[700];
    snprintf(dest, sizeof dest, "%s/metrics-%d.txt", fleet.dir, i);
    px_status st = px_fleet_client_download(c, "/metrics", dest, NULL, &err);
    px_fleet_client_free(c);
    char *text = NULL;
    size_t len;
    if (st != PX_OK || px_read_file(dest, 1 << 20, &text, &len, &err) != PX_OK)
        return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(text, key);
    long long v = at ? strtoll(at + strlen(key), NULL, 10) : -1;
    free(text);
    return v;
}

/* The replica that serves (holds the lease), waiting up to timeout_s. */
static int wait_active(int skip_i, int timeout_s)
{
    for (int t = 0; t < timeout_s * 20; t++) {
        for (int i = 0; i < N_REPLICAS; i++)
            if (i != skip_i && replicas[i].pid > 0 && health(i) == 200)
                return i;
        fh_sleep_ms(50);
    }
    for (int i = 0; i < N_REPLICAS; i++)
        fh_print_log(replicas[i].log);
    fail_msg("no replica took the scheduler lease within %d s", timeout_s);
    return -1;
}

static int setup(void **state)
{
    (void)state;
    fh_fleet_prepare(&fleet, "replicas", LEASE_S);
    if (!(store_uri = fh_pg_database()))
        return 0;
    start_replica(0);
    assert_int_equal(wait_active(-1, 60), 0);
    start_replica(1);
    start_replica(2);
    /* The standbys answer, but only to say they stand by. */
    for (int i = 1; i < N_REPLICAS; i++) {
        long code = 0;
        for (int t = 0; t < 400 && code != 503; t++) {
            code = health(i);
            if (code != 503)
                fh_sleep_ms(50);
        }
        assert_int_equal(code, 503);
    }
    snprintf(fleet.servers, sizeof fleet.servers, "%s,%s,%s", replica_url[0], replica_url[1],
             replica_url[2]);
    setenv("PLEXUS_SERVER", fleet.servers, 1);
    /* The agents list the standbys first: until the kill they are served
     * through the database by a replica that does not schedule. */
    static char agent_servers[200];
    snprintf(agent_servers, sizeof agent_servers, "%s,%s,%s", replica_url[2], replica_url[1],
             replica_url[0]);
    fh_start_agent_via(&fleet, "a", NULL, agent_servers, NULL);
    fh_start_agent_via(&fleet, "b", NULL, agent_servers, NULL);
    fh_start_agent_via(&fleet, "c", NULL, agent_servers, NULL);
    const char *names[] = {"a", "b", "c"};
    fh_wait_nodes_online(&fleet, names, 3, 60);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    for (int i = 0; i < N_REPLICAS; i++)
        if (replicas[i].pid > 0) {
            kill(-replicas[i].pid, SIGTERM);
            waitpid(replicas[i].pid, NULL, 0);
            fh_forget(replicas[i].pid);
        }
    return 0;
}

typedef struct client {
    int k;
    char *ids[N_JOBS / N_CLIENTS];
    atomic_int n_acked;
    int n_retries;
} client;

static atomic_int total_acked;

static void *client_main(void *arg)
{
    client *cl = arg;
    px_fleet_client *c = fh_client(&fleet, FH_USER_TOKEN);
    px_fleet_client_set_timeout(c, 5000);
    char runs[700];
    snprintf(runs, sizeof runs, "%s/runs", fleet.shared);
    for (int j = 0; j < N_JOBS / N_CLIENTS; j++) {
        char *spec_text = px_asprintf("{\"command\": [\"sh\", \"-c\", \"echo $PLEXUS_JOB_ID"
                                      " $PLEXUS_ATTEMPT >> %s\"], \"resources\": {\"cpus\": 0.1}}",
                                      runs);
        json_t *spec = json_loads(spec_text, 0, NULL);
        free(spec_text);
        char key[64];
        snprintf(key, sizeof key, "client-%d-job-%d", cl->k, j);
        px_err err;
        px_assert_ok(px_fleet_client_set_idempotency_key(c, key, &err), &err);
        /* Retried with the same key until acknowledged: a reply lost with
         * the replica that sent it names the same job the second time. */
        for (int tries = 0;; tries++) {
            json_t *r = NULL;
            if (px_fleet_client_call(c, "POST", "/v1/jobs", spec, NULL, &r, &err) == PX_OK) {
                cl->ids[j] = px_strdup(json_string_value(json_object_get(r, "id")));
                json_decref(r);
                break;
            }
            json_decref(r);
            cl->n_retries++;
            if (tries > 600)
                fail_msg("client %d: job %d never acknowledged: %s", cl->k, j, err.msg);
            fh_sleep_ms(50);
        }
        json_decref(spec);
        atomic_fetch_add(&cl->n_acked, 1);
        atomic_fetch_add(&total_acked, 1);
    }
    px_fleet_client_free(c);
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void
test_three_replicas_kill9_of_the_scheduler_loses_nothing_runs_nothing_twice(void **state)
{
    (void)state;
    if (!store_uri)
        skip();
    static client clients[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int k = 0; k < N_CLIENTS; k++) {
        clients[k].k = k;
        assert_int_equal(pthread_create(&th[k], NULL, client_main, &clients[k]), 0);
    }
    /* Half-way, kill the scheduling replica. */
    while (atomic_load(&total_acked) < N_JOBS / 2)
        fh_sleep_ms(10);
    int old = wait_active(-1, 5);
    /* The standby the agents list first has been serving them. */
    assert_int_equal(old, 0);
    assert_true(metric(2, "plexus_agent_calls_stored_total") > 0);
    uint64_t t0 = px_now_ns();
    kill(-replicas[old].pid, SIGKILL);
    waitpid(replicas[old].pid, NULL, 0);
    fh_forget(replicas[old].pid);
    replicas[old].pid = 0;
    /* A generous deadline: the lease must move, however loaded the
     * machine; the time it takes is printed and measured in the bench. */
    int now_active = wait_active(old, 12 * LEASE_S);
    assert_int_not_equal(now_active, old);
    double failover_s = (double)(px_now_ns() - t0) / 1e9;
    print_message("scheduler lease moved from replica %d to %d in %.2f s after kill -9 (as "
                  "observed by polling)\n",
                  old, now_active, failover_s);
    for (int k = 0; k < N_CLIENTS; k++)
        pthread_join(th[k], NULL);
    int retries = 0;
    for (int k = 0; k < N_CLIENTS; k++)
        retries += clients[k].n_retries;
    print_message("%d jobs acknowledged by 4 clients (%d submissions retried)\n",
                  atomic_load(&total_acked), retries);
    assert_int_equal(atomic_load(&total_acked), N_JOBS);
    /* Every acknowledged job succeeds, and the ids are distinct. */
    char *all[N_JOBS];
    int n = 0;
    for (int k = 0; k < N_CLIENTS; k++)
        for (int j = 0; j < N_JOBS / N_CLIENTS; j++)
            all[n++] = clients[k].ids[j];
    for (int i = 0; i < n; i++) {
        json_t *job = fh_wait_job(&fleet, all[i], "succeeded,failed,cancelled", 120);
        assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
        json_decref(job);
    }
    qsort(all, (size_t)n, sizeof *all, cmp_str);
    for (int i = 1; i < n; i++)
        assert_string_not_equal(all[i - 1], all[i]);
    /* Each ran exactly once. */
    char runs_path[700];
    snprintf(runs_path, sizeof runs_path, "%s/runs", fleet.shared);
    char *runs = NULL;
    size_t len = 0;
    px_err err;
    px_assert_ok(px_read_file(runs_path, 1 << 20, &runs, &len, &err), &err);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += runs[i] == '\n';
    for (int i = 0; i < n; i++) {
        int seen = 0;
        size_t idlen = strlen(all[i]);
        for (const char *p = runs; (p = strstr(p, all[i])); p += idlen)
            if ((p == runs || p[-1] == '\n') && p[idlen] == ' ')
                seen++;
        if (seen != 1)
            fail_msg("job %s ran %d times", all[i], seen);
    }
    print_message("%d runs for %d jobs: 0 lost, 0 run twice\n", lines, n);
    assert_int_equal(lines, n);
    free(runs);
    for (int i = 0; i < n; i++)
        free(all[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_three_replicas_kill9_of_the_scheduler_loses_nothing_runs_nothing_twice),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
