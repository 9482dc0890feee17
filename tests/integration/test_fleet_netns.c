/*
 * The fleet across real network boundaries: the server in a hub network
 * namespace, three agents in three namespaces of their own joined to it by
 * veth pairs and a bridge (tests/support/netns.h), each with its own
 * emulated inventory and reachable only at its veth address.  Agents
 * register over those links; a three-member job's members meet at rank
 * 0's address across namespaces; `plexus deploy` puts the model on the
 * nodes it planned, fetched over the links; an agent whose link goes down
 * is found lost by the heartbeat, its job finishes elsewhere and its
 * process is ended on the node, and it rejoins when the link comes back.
 * Skips, saying why, where namespaces cannot be made (not root, no
 * CAP_NET_ADMIN, no `ip`).
 */
#include "fleet_netns_harness.h"

#define N_NODES 3
#define LEASE_S 3.0

/* An emulated accelerator; llama.cpp's split (the llamacpp policy) puts
 * layers on every device in proportion to its memory: three nodes, three
 * stages. */
#define SMALL_GPU(id)                                                                        \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"tiny\", " \
    "\"backend\": \"emu\", \"compute\": {\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": "   \
    "\"hbm\", \"kind\": \"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"

static fh_netns_fleet nf;
static bool ready;

static int setup(void **state)
{
    (void)state;
    if (!fhn_start(&nf, "netns", N_NODES, LEASE_S))
        return 0;
    for (int i = 0; i < N_NODES; i++) {
        char *inv = fh_inventory(&nf.fleet, nf.names[i], SMALL_GPU("gpu0"), "");
        fhn_start_agent(&nf, i, inv);
        free(inv);
    }
    fhn_wait_online(&nf, N_NODES, 60);
    ready = true;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fhn_stop(&nf);
    return 0;
}

static void need_namespaces(void)
{
    if (!ready) {
        print_message("skipped: %s\n", nf.why);
        skip();
    }
}

static void test_agents_register_over_their_veth_addresses(void **state)
{
    (void)state;
    need_namespaces();
    for (int i = 0; i < N_NODES; i++) {
        /* The agent lives in its namespace, where the only way out is
         * its veth to the hub. */
        if (!fhn_runs_in(&nf, i, nf.fleet.agents[nf.agent[i]].pid))
            fail_msg("agent %s (pid %d) is not in %s", nf.names[i],
                     (int)nf.fleet.agents[nf.agent[i]].pid, nf.net.node[i]);
        json_t *node = fh_node(&nf.fleet, nf.names[i]);
        assert_non_null(node);
        assert_string_equal(json_string_value(json_object_get(node, "state")), "online");
        assert_string_equal(json_string_value(json_object_get(node, "address")), nf.net.addr[i]);
        json_decref(node);
    }
}

/* Rank 0 listens at its node's address; the others connect and say who
 * they are; rank 0 prints the address each came from. */
static const char rendezvous_py[] =
    "import os, socket, time\n"
    "rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])\n"
    "master, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])\n"
    "if rank == 0:\n"
    "    s = socket.socket()\n"
    "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    s.bind((master, port))\n"
    "    s.listen(world)\n"
    "    s.settimeout(120)\n"
    "    for _ in range(world - 1):\n"
    "        c, peer = s.accept()\n"
    "        line = c.makefile().readline().strip()\n"
    "        print('rank 0 at %s got <%s> from %s' % (master, line, peer[0]), flush=True)\n"
    "        c.close()\n"
    "else:\n"
    "    deadline = time.time() + 120\n"
    "    while True:\n"
    "        try:\n"
    "            c = socket.create_connection((master, port), timeout=10)\n"
    "            break\n"
    "        except OSError:\n"
    "            if time.time() > deadline:\n"
    "                raise\n"
    "            time.sleep(0.1)\n"
    "    c.sendall(b'rank %d\\n' % rank)\n"
    "    c.close()\n"
    "    print('rank %d reached %s:%d' % (rank, master, port), flush=True)\n";

static void test_distributed_job_members_meet_across_namespaces(void **state)
{
    (void)state;
    need_namespaces();
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("skipped: /usr/bin/python3 is absent (scripts/install-deps installs it)\n");
        skip();
    }
    char *script = px_asprintf("%s/rendezvous.py", nf.fleet.shared);
    px_err err;
    px_assert_ok(px_write_file(script, rendezvous_py, strlen(rendezvous_py), &err), &err);
    chmod(script, 0644);
    char *spec = px_asprintf("{\"command\": [\"/usr/bin/python3\", \"%s\"], \"nodes\": 3, "
                             "\"resources\": {\"cpus\": 1}}",
                             script);
    char *id = fh_submit(&nf.fleet, spec);
    json_t *job = fh_wait_job(&nf.fleet, id, "succeeded,failed", 120);
    char *logs = fh_logs(&nf.fleet, id);
    if (strcmp(json_string_value(json_object_get(job, "state")), "succeeded")) {
        print_message("logs:\n%s\n", logs);
        fail_msg("the rendezvous job failed");
    }
    int node_of[N_NODES];
    for (int r = 0; r < N_NODES; r++) {
        node_of[r] = fhn_node(&nf, fh_member_node(job, r));
        assert_true(node_of[r] >= 0);
        for (int q = 0; q < r; q++)
            assert_int_not_equal(node_of[q], node_of[r]);
    }
    /* Each member came from its own node's veth address to rank 0's. */
    for (int r = 1; r < N_NODES; r++) {
        char want[160];
        snprintf(want, sizeof want, "rank 0 at %s got <rank %d> from %s\n", nf.net.addr[node_of[0]],
                 r, nf.net.addr[node_of[r]]);
        px_assert_contains(logs, want);
        snprintf(want, sizeof want, "rank %d reached %s:", r, nf.net.addr[node_of[0]]);
        px_assert_contains(logs, want);
    }
    free(logs);
    json_decref(job);
    free(id);
    free(spec);
    free(script);
}

/* Waits until the deployment's model is resident on n nodes. */
static json_t *wait_resident(const char *name, size_t n, int timeout_s)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/deployments/%s", name);
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    for (;;) {
        json_t *d = fh_api(&nf.fleet, "GET", path, NULL);
        if (json_array_size(json_object_get(d, "model_resident_on")) == n)
            return d;
        if (px_now_ns() > deadline) {
            char *text = px_json_dump_canonical(d);
            print_message("deployment: %s\n", text);
            free(text);
            for (int i = 0; i < nf.fleet.n_agents; i++)
                fh_print_log(nf.fleet.agents[i].log);
            fail_msg("the model of %s is not resident on %zu nodes after %d s", name, n, timeout_s);
        }
        json_decref(d);
        fh_sleep_ms(100);
    }
}

static void test_deployment_is_fetched_over_the_links(void **state)
{
    (void)state;
    need_namespaces();
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "deploy", "--model", model, "--name", "chat", "--policy",
                       "llamacpp", NULL);
    if (rc != 0) {
        fh_print_log(nf.fleet.server.log);
        fail_msg("plexus deploy: exit %d: %s%s", rc, out, err);
    }
    px_assert_contains(out, "deployment chat planned: 3 stages on 3 nodes");
    free(out);
    free(err);
    json_t *d = wait_resident("chat", N_NODES, 90);
    /* Each stage's node holds the model: resident where it was placed. */
    const json_t *assignment = json_object_get(json_object_get(d, "plan"), "assignment");
    assert_int_equal(json_array_size(assignment), N_NODES);
    size_t i;
    json_t *st;
    json_array_foreach(assignment, i, st)
    {
        const char *node = json_string_value(json_object_get(st, "node"));
        bool resident = false;
        size_t k;
        json_t *r;
        json_array_foreach(json_object_get(d, "model_resident_on"), k, r) resident =
            resident || (node && !strcmp(json_string_value(r), node));
        if (!resident)
            fail_msg("stage %zu's node %s does not hold the model", i, node ? node : "?");
    }
    json_decref(d);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat", NULL), 0);
    px_assert_contains(out, "model resident on: n0,n1,n2 (of n0,n1,n2)");
    free(out);
    free(err);
    free(model);
}

static void test_cut_off_agent_is_lost_and_rejoins(void **state)
{
    (void)state;
    need_namespaces();
    char *id =
        fh_submit(&nf.fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo pid=$$; sleep 5; "
                             "echo finished attempt $PLEXUS_ATTEMPT\"], \"max_attempts\": 3}");
    char *first = fh_wait_logs(&nf.fleet, id, "pid=", 60);
    pid_t pid = 0;
    assert_int_equal(fh_pids_in(first, "pid", &pid, 1), 1);
    free(first);
    json_t *job = fh_job(&nf.fleet, id);
    int victim = fhn_node(&nf, fh_member_node(job, 0));
    json_decref(job);
    assert_true(victim >= 0);
    assert_true(fhn_runs_in(&nf, victim, pid));

    /* The victim's interface goes down: it can reach nothing but itself. */
    if (!px_netns_link(&nf.net, victim, false))
        fail_msg("%s", nf.net.why);
    job = fh_wait_job(&nf.fleet, id, "succeeded,failed", 90);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_true(json_integer_value(json_object_get(job, "attempt")) >= 2);
    assert_string_not_equal(fh_member_node(job, 0), nf.names[victim]);
    json_decref(job);
    json_t *node = fh_node(&nf.fleet, nf.names[victim]);
    assert_string_equal(json_string_value(json_object_get(node, "state")), "offline");
    json_decref(node);
    char *log = NULL;
    size_t len;
    char needle[64];
    snprintf(needle, sizeof needle, "node %s lost (no heartbeat", nf.names[victim]);
    px_err err;
    px_assert_ok(px_read_file(nf.fleet.server.log, 1u << 24, &log, &len, &err), &err);
    px_assert_contains(log, needle);
    free(log);
    /* The cut-off agent ends the job it can no longer renew. */
    fh_wait_pids_gone(&pid, 1, 60);
    assert_false(fh_pid_gone(nf.fleet.agents[nf.agent[victim]].pid));

    /* The link comes back: the same agent registers again. */
    if (!px_netns_link(&nf.net, victim, true))
        fail_msg("%s", nf.net.why);
    const char *back[] = {nf.names[victim]};
    fh_wait_nodes_online(&nf.fleet, back, 1, 60);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "finished attempt");
    free(out);
    free(id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agents_register_over_their_veth_addresses),
        cmocka_unit_test(test_distributed_job_members_meet_across_namespaces),
        cmocka_unit_test(test_deployment_is_fetched_over_the_links),
        cmocka_unit_test(test_cut_off_agent_is_lost_and_rejoins),
    };
    alarm(FH_SECONDS(280));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
