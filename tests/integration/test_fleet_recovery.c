/*
 * A real server (3 s lease) and three agents on 127.0.0.1: gang placement
 * all or nothing; a crashed service restarted; a killed agent's job
 * finishing elsewhere; the server killed with SIGKILL under load and
 * restarted without losing an acknowledged job.
 */
#include "fleet_harness.h"

#include <pthread.h>
#include <stdatomic.h>

static fh_fleet fleet;

/* Submissions from a thread while the server is killed; the ids are
 * freed by the teardown too when a check fails half-way. */
typedef struct submitter {
    char *ids[200];
    atomic_int n_acked;
    int n_refused;
    atomic_int stop;
} submitter;

static submitter subs;

static int setup(void **state)
{
    (void)state;
    fh_fleet_start(&fleet, "recovery", 3);
    /* A stand-in torchrun on the agents' PATH prints what it was given. */
    char *bin = px_asprintf("%s/bin", fleet.dir);
    char *tr = px_asprintf("%s/torchrun", bin);
    mkdir(bin, 0755);
    const char *script = "#!/bin/sh\necho torchrun \"$@\"\n";
    assert_int_equal(px_write_file(tr, script, strlen(script), NULL), PX_OK);
    chmod(tr, 0755);
    char *path = px_asprintf("%s:%s", bin, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    setenv("PATH", path, 1);
    free(path);
    free(tr);
    free(bin);
    fh_start_agent(&fleet, "a", NULL);
    fh_start_agent(&fleet, "b", NULL);
    fh_start_agent(&fleet, "c", NULL);
    const char *names[] = {"a", "b", "c"};
    fh_wait_nodes_online(&fleet, names, 3, 20);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    for (int i = 0; i < subs.n_acked; i++)
        free(subs.ids[i]);
    return 0;
}

static void test_gang_job_is_placed_all_or_nothing(void **state)
{
    (void)state;
    /* Four members cannot fit three nodes: nothing is placed. */
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/true\"], \"nodes\": 4, \"resources\": "
                                 "{\"cpus\": 2}}");
    fh_sleep_ms(700);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "queued");
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(job, "members"), i, m)
        assert_true(json_object_get(m, "node") == NULL || json_is_null(json_object_get(m, "node")));
    json_decref(job);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    json_t *e = fh_api(&fleet, "GET", path, NULL);
    assert_false(json_is_true(json_object_get(json_object_get(e, "decision"), "placed")));
    json_decref(e);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    free(id);

    /* Two members land on two nodes and learn their ranks. */
    id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo "
                           "rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK "
                           "master=$MASTER_ADDR:$MASTER_PORT\"], \"nodes\": 2, "
                           "\"resources\": {\"cpus\": 2}}");
    job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    char n0[128];
    snprintf(n0, sizeof n0, "%s", fh_member_node(job, 0));
    assert_true(n0[0]);
    assert_true(fh_member_node(job, 1)[0]);
    assert_string_not_equal(n0, fh_member_node(job, 1));
    json_decref(job);
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "rank=0/2");
    px_assert_contains(out, "rank=1/2");
    px_assert_contains(out, "master=127.0.0.1:");
    free(out);
    free(id);
}

static void test_torchrun_members_get_their_rank_arguments(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"python3\", \"train.py\"], \"nodes\": 2, "
                                 "\"launcher\": \"torchrun\", \"resources\": {\"cpus\": 2}}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "--nnodes=2");
    px_assert_contains(out, "--node_rank=0");
    px_assert_contains(out, "--node_rank=1");
    px_assert_contains(out, "--no-python python3 train.py");
    free(out);
    free(id);
}

static void test_crashed_service_is_restarted(void **state)
{
    (void)state;
    /* The service answers its health check, then crashes after a second. */
    int port = fh_free_port();
    char *spec = px_asprintf(
        "{\"name\": \"flaky\", \"command\": [\"/bin/sh\", \"-c\", \"echo started attempt "
        "$PLEXUS_ATTEMPT; sleep 1; exit 3\"], \"service\": {\"port\": %d, "
        "\"health_command\": [\"/bin/true\"]}}",
        port);
    char *id = fh_submit(&fleet, spec);
    uint64_t deadline = px_now_ns() + FH_SECONDS(25ull) * 1000000000ull;
    long restarts = 0;
    const char *state_text = "";
    json_t *job = NULL;
    while (px_now_ns() < deadline) {
        json_decref(job);
        job = fh_job(&fleet, id);
        restarts = (long)json_integer_value(json_object_get(job, "restarts"));
        state_text = json_string_value(json_object_get(job, "state"));
        if (restarts >= 2)
            break;
        fh_sleep_ms(200);
    }
    if (restarts < 2) {
        fh_print_log(fleet.server.log);
        fail_msg("the service was restarted %ld times (state %s)", restarts, state_text);
    }
    /* A service never fails for exiting: it is queued again. */
    assert_true(fh_state_in(state_text, "queued,assigned,running"));
    json_decref(job);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "started attempt 1");
    px_assert_contains(out, "started attempt 2");
    free(out);
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    free(id);
    free(spec);
}

static void test_unhealthy_service_is_stopped_and_restarted(void **state)
{
    (void)state;
    /* Nothing ever listens on the port: the health check fails, the agent
     * stops the service and reports why. */
    int port = fh_free_port();
    char *spec = px_asprintf("{\"command\": [\"/bin/sleep\", \"60\"], \"service\": {\"port\": %d, "
                             "\"health_path\": \"/healthz\"}}",
                             port);
    char *id = fh_submit(&fleet, spec);
    uint64_t deadline = px_now_ns() + FH_SECONDS(25ull) * 1000000000ull;
    long restarts = 0;
    while (px_now_ns() < deadline && restarts < 1) {
        json_t *job = fh_job(&fleet, id);
        restarts = (long)json_integer_value(json_object_get(job, "restarts"));
        json_decref(job);
        fh_sleep_ms(200);
    }
    assert_true(restarts >= 1);
    char *out = NULL, *err = NULL;
    fh_plexus(&out, &err, "logs", id, "--stream", "stderr", NULL);
    px_assert_contains(err, "health check failed");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    free(id);
    free(spec);
}

static int agent_index(const char *name)
{
    for (int i = 0; i < fleet.n_agents; i++)
        if (!strcmp(fleet.agents[i].name, name))
            return i;
    return -1;
}

static void test_killed_agents_job_finishes_elsewhere(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"sleep 3; echo finished "
                                 "attempt $PLEXUS_ATTEMPT\"], \"max_attempts\": 3}");
    json_t *job = fh_wait_job(&fleet, id, "running", 20);
    char victim[128];
    snprintf(victim, sizeof victim, "%s", fh_member_node(job, 0));
    json_decref(job);
    int k = agent_index(victim);
    assert_true(k >= 0);
    kill(-fleet.agents[k].pid, SIGKILL);
    waitpid(fleet.agents[k].pid, NULL, 0);
    fh_forget(fleet.agents[k].pid);
    fleet.agents[k].pid = 0;
    job = fh_wait_job(&fleet, id, "succeeded,failed", 40);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_true(json_integer_value(json_object_get(job, "attempt")) >= 2);
    assert_string_not_equal(fh_member_node(job, 0), victim);
    json_decref(job);
    json_t *node = fh_node(&fleet, victim);
    if (strcmp(json_string_value(json_object_get(node, "state")), "offline")) {
        fh_print_log(fleet.server.log);
        fh_print_log(fleet.agents[k].log);
        fail_msg("node %s is %s after its agent was killed", victim,
                 json_string_value(json_object_get(node, "state")));
    }
    json_decref(node);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "finished attempt 2");
    free(out);
    /* The agent comes back under the same name, with its credential. */
    fh_restart_agent(&fleet, k, NULL);
    const char *names[] = {victim};
    fh_wait_nodes_online(&fleet, names, 1, 20);
    free(id);
}

static void *submit_loop(void *arg)
{
    submitter *s = arg;
    px_fleet_client *c = fh_client(&fleet, FH_USER_TOKEN);
    px_fleet_client_set_timeout(c, 2000);
    json_t *spec = json_pack("{s:[s, s, s], s:{s:f}}", "command", "/bin/sh", "-c",
                             "sleep 0.2; echo ok", "resources", "cpus", 0.1);
    for (int i = 0; i < 200 && !atomic_load(&s->stop); i++) {
        json_t *r = NULL;
        if (px_fleet_client_call(c, "POST", "/v1/jobs", spec, NULL, &r, NULL) == PX_OK) {
            const char *id = json_string_value(json_object_get(r, "id"));
            if (id) {
                s->ids[atomic_load(&s->n_acked)] = px_strdup(id);
                atomic_fetch_add(&s->n_acked, 1);
            }
        } else {
            s->n_refused++;
            fh_sleep_ms(20);
        }
        json_decref(r);
    }
    json_decref(spec);
    px_fleet_client_free(c);
    return NULL;
}

static void test_server_kill9_loses_no_acknowledged_job(void **state)
{
    (void)state;
    submitter *s = &subs;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, submit_loop, s), 0);
    /* Kill the server in the middle of the submissions. */
    for (int i = 0; i < 200 && s->n_acked < 15; i++)
        fh_sleep_ms(20);
    fh_kill_server(&fleet);
    fh_sleep_ms(300);
    fh_start_server(&fleet);
    fh_sleep_ms(500);
    atomic_store(&s->stop, 1);
    pthread_join(th, NULL);
    assert_true(s->n_acked >= 15);
    print_message("acknowledged %d submissions, %d refused while the server was down\n", s->n_acked,
                  s->n_refused);
    for (int i = 0; i < s->n_acked; i++) {
        json_t *job = fh_wait_job(&fleet, s->ids[i], "succeeded,failed", 60);
        assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
        json_decref(job);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gang_job_is_placed_all_or_nothing),
        cmocka_unit_test(test_torchrun_members_get_their_rank_arguments),
        cmocka_unit_test(test_crashed_service_is_restarted),
        cmocka_unit_test(test_unhealthy_service_is_stopped_and_restarted),
        cmocka_unit_test(test_killed_agents_job_finishes_elsewhere),
        cmocka_unit_test(test_server_kill9_loses_no_acknowledged_job),
    };
    alarm(FH_SECONDS(170));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
