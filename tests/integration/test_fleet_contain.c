/*
 * Containment and fencing on 127.0.0.1 with a real server and agents:
 * whatever a job starts ends with it, setsid and double-forked processes
 * included, when it is cancelled, when its agent is killed with SIGKILL
 * and when the agent starts again; and an agent cut from its server by a
 * network partition (a TCP proxy between them, cut on purpose) stops its
 * job before the server gives the job to another node, so two copies
 * never run at once.  The assertions are about order (a lock the first
 * copy holds until it dies), not about time.
 */
#include "fleet_harness.h"

static fh_fleet fleet;
static fh_proxy proxy;

/* Lease of the fleet: the fenced agent stops its work after 3/4 of it. */
#define LEASE_S 4

static int setup(void **state)
{
    (void)state;
    fh_fleet_start(&fleet, "contain", LEASE_S);
    fh_proxy_start(&proxy, &fleet);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", proxy.port);
    fh_start_agent_via(&fleet, "cut", NULL, url, NULL); /* through the proxy */
    fh_start_agent(&fleet, "kept", NULL);
    const char *names[] = {"cut", "kept"};
    fh_wait_nodes_online(&fleet, names, 2, 20);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    fh_proxy_stop(&proxy);
    return 0;
}

static void admin(const char *action, const char *node)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/nodes/%s/%s", node, action);
    px_fleet_client *c = fh_client(&fleet, FH_ADMIN_TOKEN);
    json_t *body = json_object(), *reply = NULL;
    px_err err;
    if (px_fleet_client_call(c, "POST", path, body, NULL, &reply, &err) != PX_OK)
        fail_msg("%s %s: %s", action, node, err.msg);
    json_decref(body);
    json_decref(reply);
    px_fleet_client_free(c);
}

/* A job that starts a setsid process, a double-forked orphan and a plain
 * child, prints their pids, and waits. */
#define ESCAPER                                                                    \
    "{\"command\": [\"/bin/sh\", \"-c\", \"setsid sleep 300 & echo setsid=$!; "    \
    "(sleep 301 & echo orphan=$!); sleep 302 & echo child=$!; echo pids-printed; " \
    "wait\"]}"

static void escaper_pids(const char *id, pid_t pids[3])
{
    char *logs = fh_wait_logs(&fleet, id, "pids-printed", 30);
    assert_int_equal(fh_pids_in(logs, "setsid", pids, 1), 1);
    assert_int_equal(fh_pids_in(logs, "orphan", pids + 1, 1), 1);
    assert_int_equal(fh_pids_in(logs, "child", pids + 2, 1), 1);
    free(logs);
    for (int i = 0; i < 3; i++)
        assert_false(fh_pid_gone(pids[i]));
}

static void test_cancel_ends_setsid_and_double_forked_descendants(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, ESCAPER);
    pid_t pids[3];
    escaper_pids(id, pids);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    fh_wait_pids_gone(pids, 3, 20);
    free(id);
}

static int agent_index(const char *name)
{
    for (int i = 0; i < fleet.n_agents; i++)
        if (!strcmp(fleet.agents[i].name, name))
            return i;
    return -1;
}

static void test_killed_agent_ends_its_jobs_and_a_restart_finds_none(void **state)
{
    (void)state;
    admin("drain", "cut");
    char *id = fh_submit(&fleet, ESCAPER);
    pid_t pids[3];
    escaper_pids(id, pids);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(fh_member_node(job, 0), "kept");
    json_decref(job);
    /* SIGKILL to the agent alone: its job's supervisor ends the job. */
    int k = agent_index("kept");
    kill(fleet.agents[k].pid, SIGKILL);
    waitpid(fleet.agents[k].pid, NULL, 0);
    fh_wait_pids_gone(pids, 3, 20);
    /* The agent comes back: it runs nothing of before, the server knows it
     * and requeues the lost attempt at once. */
    fh_restart_agent(&fleet, k, NULL);
    uint64_t deadline = px_now_ns() + 30ull * 1000000000ull;
    for (;;) {
        json_t *again = fh_job(&fleet, id);
        bool moved = json_integer_value(json_object_get(again, "attempt")) >= 2 &&
                     !strcmp(json_string_value(json_object_get(again, "state")), "running");
        json_decref(again);
        if (moved)
            break;
        if (px_now_ns() > deadline)
            fail_msg("job %s was not requeued and run again after its agent restarted", id);
        fh_sleep_ms(50);
    }
    char *logs = fh_wait_logs(&fleet, id, "pids-printed", 30);
    free(logs);
    json_t *node = fh_node(&fleet, "kept");
    const json_t *running = json_object_get(node, "running");
    /* Only the new attempt, if it landed here again. */
    for (size_t i = 0; i < json_array_size(running); i++)
        assert_true(json_integer_value(json_object_get(json_array_get(running, i), "attempt")) >=
                    2);
    json_decref(node);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    admin("undrain", "cut");
    free(id);
}

static void test_partitioned_agent_stops_its_job_before_it_moves(void **state)
{
    (void)state;
    /* The job holds a lock for as long as it lives; a second copy that
     * finds the lock taken says OVERLAP: two copies ran at once. */
    char *spec = px_asprintf(
        "{\"command\": [\"/bin/sh\", \"-c\", \"exec 9>>%s/fence.lock; if flock -n 9; then echo "
        "holder attempt $PLEXUS_ATTEMPT; sleep 300; else echo OVERLAP attempt $PLEXUS_ATTEMPT; "
        "exit 3; fi\"], \"max_attempts\": 5}",
        fleet.shared);
    admin("undrain", "cut");
    admin("drain", "kept");
    char *id = fh_submit(&fleet, spec);
    char *logs = fh_wait_logs(&fleet, id, "holder attempt 1", 30);
    free(logs);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(fh_member_node(job, 0), "cut");
    json_decref(job);
    admin("undrain", "kept");
    /* The partition: nothing passes between "cut" and the server. */
    atomic_store(&proxy.cut, 1);
    logs = fh_wait_logs(&fleet, id, "attempt 2", 60);
    if (strstr(logs, "OVERLAP")) {
        fh_print_log(fleet.agents[agent_index("cut")].log);
        fail_msg("a second copy ran while the first still held its lock:\n%s", logs);
    }
    px_assert_contains(logs, "holder attempt 2");
    free(logs);
    job = fh_job(&fleet, id);
    assert_string_equal(fh_member_node(job, 0), "kept");
    json_decref(job);
    /* The agent says why it stopped the job. */
    char *text = NULL;
    size_t len;
    px_assert_ok(px_read_file(fleet.agents[agent_index("cut")].log, 1 << 20, &text, &len, NULL),
                 (px_err *)NULL);
    px_assert_contains(text, "stopping it before the server gives it to another node");
    free(text);
    /* The partition heals: the agent registers again and takes work. */
    atomic_store(&proxy.cut, 0);
    const char *names[] = {"cut"};
    fh_wait_nodes_online(&fleet, names, 1, 30);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    free(spec);
    free(id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_ends_setsid_and_double_forked_descendants),
        cmocka_unit_test(test_killed_agent_ends_its_jobs_and_a_restart_finds_none),
        cmocka_unit_test(test_partitioned_agent_stops_its_job_before_it_moves),
    };
    alarm(FH_SECONDS(240));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
