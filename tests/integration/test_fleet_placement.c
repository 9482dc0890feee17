/*
 * A real server and four agents on 127.0.0.1 (emulated GPU inventories):
 * placement by GPU memory, framework version and vendor; explanations
 * naming each node's reason; locality for a cached model; running work
 * with only its devices visible; Python functions; artifacts; cancel.
 */
#include "fleet_harness.h"

static fh_fleet fleet;

/* big:   2 x H100 80 GB (nvidia 9.0), torch 2.3.1 + torch.cuda 12.1
 * small: 1 x L4 24 GB (nvidia 8.9), torch 2.0.1
 * amd:   1 x MI300X 192 GB (amd gfx942), torch 2.1.0
 * cpu:   no accelerator, no framework */
static int setup(void **state)
{
    (void)state;
    fh_fleet *f = &fleet;
    fh_fleet_start(f, "placement", 10);
    char *big = fh_inventory(f, "big", FH_H100("gpu0") "," FH_H100("gpu1"),
                             "{\"name\": \"torch\", \"version\": \"2.3.1\"},"
                             "{\"name\": \"torch.cuda\", \"version\": \"12.1\"}");
    char *small =
        fh_inventory(f, "small", FH_L4("gpu0"), "{\"name\": \"torch\", \"version\": \"2.0.1\"}");
    char *amd =
        fh_inventory(f, "amd", FH_MI300X("gpu0"), "{\"name\": \"torch\", \"version\": \"2.1.0\"}");
    fh_start_agent(f, "big", big);
    fh_start_agent(f, "small", small);
    fh_start_agent(f, "amd", amd);
    fh_start_agent(f, "cpu", NULL);
    free(big);
    free(small);
    free(amd);
    const char *names[] = {"big", "small", "amd", "cpu"};
    fh_wait_nodes_online(f, names, 4, 20);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    return 0;
}

static json_t *explain(const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/explain", id);
    return fh_api(&fleet, "GET", path, NULL);
}

static void assert_rejected(const json_t *e, const char *node, const char *reason,
                            const char *detail_needle)
{
    const json_t *r = fh_rejected(e, node);
    if (!r) {
        char *text = px_json_dump_canonical(e);
        fail_msg("node %s is not among the rejected nodes:\n%s", node, text);
    }
    const char *got = json_string_value(json_object_get(r, "reason"));
    /* reason may list alternatives: "gpus|vendor" */
    if (!got || !fh_state_in(got, reason))
        fail_msg("node %s was rejected for \"%s\", expected %s (%s)", node, got ? got : "?", reason,
                 json_string_value(json_object_get(r, "detail")));
    if (detail_needle)
        px_assert_contains(json_string_value(json_object_get(r, "detail")), detail_needle);
}

static void test_gpu_memory_request_lands_on_a_node_with_enough(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo "
                                 "visible=$CUDA_VISIBLE_DEVICES\"], \"resources\": {\"gpus\": 1, "
                                 "\"gpu_memory\": \"40 GiB\", \"vendor\": \"nvidia\"}}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_string_equal(fh_member_node(job, 0), "big");
    json_decref(job);
    json_t *e = explain(id);
    assert_rejected(e, "small", "gpu_memory", "GiB");
    assert_rejected(e, "amd", "vendor", "amd");
    assert_rejected(e, "cpu", "gpus,vendor", NULL);
    assert_true(json_is_true(json_object_get(json_object_get(e, "decision"), "placed")));
    json_decref(e);
    /* The job saw exactly one device, and the CLI shows its output. */
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "visible=");
    assert_true(strstr(out, "visible=0\n") || strstr(out, "visible=1\n"));
    free(out);
    /* plexus explain names each node's reason in text. */
    assert_int_equal(fh_plexus(&out, NULL, "explain", id, NULL), 0);
    px_assert_contains(out, "small");
    px_assert_contains(out, "gpu_memory");
    px_assert_contains(out, "decision");
    free(out);
    free(id);
}

static void test_framework_version_mismatch_names_installed_version(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    int rc =
        fh_plexus(&out, &err, "submit", "--framework", "torch>=2.1", "--gpus", "1", "--capability",
                  ">=8.0", "--wait", "--timeout", "30", "-o", "json", "--", "/bin/true", NULL);
    if (rc != 0)
        fail_msg("plexus submit failed (%d): %s %s", rc, out, err);
    json_t *job = json_loads(out, 0, NULL);
    assert_non_null(job);
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *node = fh_member_node(job, 0);
    assert_true(!strcmp(node, "big") || !strcmp(node, "amd"));
    json_t *e = explain(id);
    assert_rejected(e, "small", "framework_version", "2.0.1");
    assert_rejected(e, "cpu", "framework", "torch");
    json_decref(e);
    json_decref(job);
    free(out);
    free(err);

    /* torch.cuda exists only on big. */
    char *id2 = fh_submit(&fleet, "{\"command\": [\"/bin/true\"], \"frameworks\": "
                                  "[\"torch.cuda\", \"torch~=2.3\"]}");
    job = fh_wait_job(&fleet, id2, "succeeded,failed", 30);
    assert_string_equal(fh_member_node(job, 0), "big");
    json_decref(job);
    free(id2);
}

static void test_vendor_request_lands_on_that_vendor(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo "
                                 "hip=[$HIP_VISIBLE_DEVICES] cuda=[$CUDA_VISIBLE_DEVICES]\"], "
                                 "\"resources\": {\"gpus\": 1, \"vendor\": \"amd\"}}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_string_equal(fh_member_node(job, 0), "amd");
    json_decref(job);
    /* The AMD device is visible to HIP; no NVIDIA device is. */
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    px_assert_contains(out, "hip=[0] cuda=[]");
    free(out);
    json_t *e = explain(id);
    assert_rejected(e, "big", "vendor", NULL);
    assert_rejected(e, "small", "vendor", NULL);
    json_decref(e);
    free(id);
}

static void test_unplaceable_job_stays_queued_with_every_reason(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/true\"], \"resources\": {\"gpus\": 4}}");
    fh_sleep_ms(500);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "queued");
    json_decref(job);
    json_t *e = explain(id);
    assert_false(json_is_true(json_object_get(json_object_get(e, "decision"), "placed")));
    assert_rejected(e, "big", "gpus", NULL);
    assert_rejected(e, "small", "gpus", NULL);
    assert_rejected(e, "amd", "gpus", NULL);
    /* A node without GPUs lacks GPUs; no vendor was asked for. */
    assert_rejected(e, "cpu", "gpus", "0 free that qualify");
    json_decref(e);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    px_assert_contains(out, "cancelled");
    free(out);
    free(id);
}

/* explain names every requirement a node fails, not only the first. */
static void test_explain_lists_every_failing_requirement(void **state)
{
    (void)state;
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/true\"], \"frameworks\": "
                                 "[\"torch>=2.3\"], \"resources\": {\"gpus\": 4, \"vendor\": "
                                 "\"amd\"}}");
    fh_sleep_ms(300);
    json_t *e = explain(id);
    const json_t *small = fh_rejected(e, "small");
    assert_non_null(small);
    char *text = px_json_dump_canonical(json_object_get(small, "failing"));
    px_assert_contains(text, "\"reason\": \"framework_version\"");
    px_assert_contains(text, "torch 2.0.1 installed, job needs >=2.3");
    px_assert_contains(text, "\"reason\": \"vendor\"");
    px_assert_contains(text, "\"reason\": \"gpus\"");
    free(text);
    json_decref(e);
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "explain", id, NULL), 0);
    px_assert_contains(out, "torch 2.0.1 installed, job needs >=2.3");
    px_assert_contains(out, "no amd GPU (node has nvidia");
    px_assert_contains(out, "not enough GPUs");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "explain", id, "-o", "yaml", NULL), 0);
    px_assert_contains(out, "rejected:\n  - node: ");
    px_assert_contains(out, "    failing:\n      - reason: ");
    free(out);
    free(err);
    /* delete job, as kubectl users write it, cancels the job. */
    char *kind_id = px_asprintf("jobs/%s", id), *want = px_asprintf("job %s cancelled", id);
    assert_int_equal(fh_plexus(&out, NULL, "delete", kind_id, "--yes", NULL), 0);
    px_assert_contains(out, want);
    free(out);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "cancelled");
    json_decref(job);
    /* It ended: deleting it again is refused. */
    assert_int_equal(fh_plexus(&out, &err, "delete", "job", id, "--yes", NULL), 1);
    free(out);
    free(err);
    free(kind_id);
    free(want);
    free(id);
}

/* submit -f takes the job specification from a file, options beside it
 * add to it; jobs and nodes print YAML for -o yaml. */
static void test_submit_reads_a_spec_file(void **state)
{
    (void)state;
    char *spec = NULL;
    if (asprintf(&spec, "%s/job-spec.json", fleet.dir) < 0)
        fail_msg("asprintf");
    FILE *f = fopen(spec, "w");
    assert_non_null(f);
    fputs("{\"name\": \"from-a-file\", \"command\": [\"/bin/sh\", \"-c\", "
          "\"echo spec $GREETING\"], \"resources\": {\"cpus\": 1}}\n",
          f);
    fclose(f);
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "-f", spec, "--env", "GREETING=hello", "--wait",
                       "--timeout", "60", "-o", "json", NULL);
    if (rc != 0)
        fail_msg("submit -f: exit %d: %s %s", rc, out, err);
    json_t *job = json_loads(out, 0, NULL);
    assert_non_null(job);
    assert_string_equal(json_string_value(json_object_get(job, "name")), "from-a-file");
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(job);
    free(out);
    free(err);
    char *logs = fh_logs(&fleet, id);
    px_assert_contains(logs, "spec hello");
    free(logs);
    assert_int_equal(fh_plexus(&out, &err, "jobs", id, "-o", "yaml", NULL), 0);
    px_assert_contains(out, "name: from-a-file\n");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "nodes", "-o", "yaml", NULL), 0);
    px_assert_contains(out, "nodes:\n  - ");
    free(out);
    free(err);
    /* A file that is not a job specification is named with the fix. */
    f = fopen(spec, "w");
    fputs("[1, 2]", f);
    fclose(f);
    assert_int_equal(fh_plexus(&out, &err, "submit", "-f", spec, NULL), 1);
    px_assert_contains(err, "not a job specification");
    free(out);
    free(err);
    free(id);
    free(spec);
}

static void test_python_function_returns_result_or_traceback(void **state)
{
    (void)state;
    char *py = px_asprintf("%s/fn.py", fleet.dir);
    const char *src = "import os\n"
                      "def add(a, b):\n    print('adding on', os.environ.get('PLEXUS_JOB_ID'))\n"
                      "    return {'sum': a + b}\n"
                      "def fail(x):\n    raise ValueError('bad input %r' % (x,))\n";
    px_err e;
    px_assert_ok(px_write_file(py, src, strlen(src), &e), &e);
    char *target = px_asprintf("%s:add", py);
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "--python", target, "--args", "{\"a\": 40, \"b\": 2}",
                       "--wait", "--timeout", "30", "-o", "json", NULL);
    if (rc != 0)
        fail_msg("plexus submit --python failed (%d): %s %s", rc, out, err);
    json_t *job = json_loads(out, 0, NULL);
    assert_non_null(job);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(job, "result"), "sum")),
                     42);
    json_decref(job);
    free(out);
    free(err);
    /* An array is the positional arguments. */
    rc = fh_plexus(&out, &err, "submit", "--python", target, "--args", "[2, 3]", "--wait",
                   "--timeout", "30", "-o", "json", NULL);
    if (rc != 0)
        fail_msg("plexus submit --python --args '[2, 3]' failed (%d): %s %s", rc, out, err);
    job = json_loads(out, 0, NULL);
    assert_non_null(job);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(job, "result"), "sum")), 5);
    json_decref(job);
    free(out);
    free(err);
    free(target);
    target = px_asprintf("%s:fail", py);
    rc = fh_plexus(&out, &err, "submit", "--python", target, "--args", "7", "--wait", "--timeout",
                   "30", NULL);
    assert_int_equal(rc, 1);
    px_assert_contains(out, "failed");
    px_assert_contains(out, "ValueError");
    px_assert_contains(out, "Traceback");
    free(out);
    free(err);
    free(target);
    free(py);
}

static void test_artifacts_are_uploaded_and_fetched(void **state)
{
    (void)state;
    char *id =
        fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"mkdir -p out && echo trained > "
                          "out/model.txt && ln -s /etc/passwd leak.txt\"], "
                          "\"artifacts\": [\"out/model.txt\", \"leak.txt\"]}");
    json_t *job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "artifacts", id, NULL), 0);
    px_assert_contains(out, "out/model.txt");
    assert_null(strstr(out, "leak.txt")); /* a link is never followed */
    free(out);
    char *dest = px_asprintf("%s/model-copy.txt", fleet.dir);
    assert_int_equal(
        fh_plexus(NULL, NULL, "artifacts", id, "--get", "out/model.txt", "--out", dest, NULL), 0);
    char *text;
    size_t len;
    px_err e;
    px_assert_ok(px_read_file(dest, 1000, &text, &len, &e), &e);
    assert_string_equal(text, "trained\n");
    free(text);
    /* The refusal is in the job's log. */
    assert_int_equal(fh_plexus(&out, NULL, "logs", id, NULL), 0);
    free(out);
    char *err = NULL;
    fh_plexus(&out, &err, "logs", id, "--stream", "stderr", NULL);
    px_assert_contains(err, "symbolic link");
    free(out);
    free(err);
    free(dest);
    free(id);
}

static void test_cancel_kills_the_running_process_group(void **state)
{
    (void)state;
    char *pidfile = px_asprintf("%s/cancel.pid", fleet.shared);
    char *spec = px_asprintf("{\"command\": [\"/bin/sh\", \"-c\", \"sleep 60 & echo $! > %s; "
                             "wait\"]}",
                             pidfile);
    char *id = fh_submit(&fleet, spec);
    json_t *job = fh_wait_job(&fleet, id, "running", 30);
    json_decref(job);
    pid_t child = 0;
    for (int i = 0; i < 100 && !child; i++) {
        FILE *fp = fopen(pidfile, "r");
        long v = 0;
        if (fp && fscanf(fp, "%ld", &v) == 1)
            child = (pid_t)v;
        if (fp)
            fclose(fp);
        fh_sleep_ms(50);
    }
    assert_true(child > 0);
    char *out = NULL;
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 0);
    free(out);
    job = fh_wait_job(&fleet, id, "cancelled", 10);
    json_decref(job);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; i++) {
        if (kill(child, 0) != 0)
            gone = true;
        else
            fh_sleep_ms(50);
    }
    assert_true(gone);
    /* Cancelling again is refused: the job already ended. */
    assert_int_equal(fh_plexus(&out, NULL, "cancel", id, NULL), 1);
    free(out);
    free(spec);
    free(pidfile);
    free(id);
}

static void test_cached_model_attracts_the_next_job(void **state)
{
    (void)state;
    char *model = px_asprintf("%s/tiny-model.bin", fleet.dir);
    const char *weights = "pretend these are weights: 0123456789abcdef";
    px_err e;
    px_assert_ok(px_write_file(model, weights, strlen(weights), &e), &e);
    /* The first job must run on amd; it fetches the model into amd's cache. */
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "submit", "--model", model, "--gpus", "1", "--vendor", "amd",
                       "--wait", "--timeout", "30", "-o", "json", "--", "/bin/sh", "-c",
                       "cat \"$PLEXUS_MODEL\"", NULL);
    if (rc != 0)
        fail_msg("submit --model failed (%d): %s %s", rc, out, err);
    json_t *job = json_loads(out, 0, NULL);
    const char *digest = json_string_value(
        json_object_get(json_object_get(json_object_get(job, "spec"), "model"), "digest"));
    assert_non_null(digest);
    char *d = px_strdup(digest);
    char *logs = NULL;
    fh_plexus(&logs, NULL, "logs", json_string_value(json_object_get(job, "id")), NULL);
    px_assert_contains(logs, "pretend these are weights");
    free(logs);
    json_decref(job);
    free(out);
    free(err);
    /* Wait until amd reports the model resident. */
    bool resident = false;
    for (int i = 0; i < 100 && !resident; i++) {
        json_t *node = fh_node(&fleet, "amd");
        size_t k;
        json_t *r;
        json_array_foreach(json_object_get(node, "resident"), k,
                           r) if (json_string_value(r) && !strcmp(json_string_value(r), d))
            resident = true;
        json_decref(node);
        if (!resident)
            fh_sleep_ms(100);
    }
    assert_true(resident);
    /* A job without constraints now prefers the node holding its model. */
    char *spec = px_asprintf("{\"command\": [\"/bin/true\"], \"model\": {\"digest\": \"%s\"}}", d);
    char *id = fh_submit(&fleet, spec);
    job = fh_wait_job(&fleet, id, "succeeded,failed", 30);
    assert_string_equal(fh_member_node(job, 0), "amd");
    json_decref(job);
    json_t *ex = explain(id);
    const json_t *top = json_array_get(json_object_get(ex, "scored"), 0);
    assert_string_equal(json_string_value(json_object_get(top, "node")), "amd");
    assert_true(json_number_value(json_object_get(top, "locality")) > 0.99);
    json_decref(ex);
    free(spec);
    free(id);
    free(d);
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_memory_request_lands_on_a_node_with_enough),
        cmocka_unit_test(test_framework_version_mismatch_names_installed_version),
        cmocka_unit_test(test_vendor_request_lands_on_that_vendor),
        cmocka_unit_test(test_unplaceable_job_stays_queued_with_every_reason),
        cmocka_unit_test(test_explain_lists_every_failing_requirement),
        cmocka_unit_test(test_submit_reads_a_spec_file),
        cmocka_unit_test(test_python_function_returns_result_or_traceback),
        cmocka_unit_test(test_artifacts_are_uploaded_and_fetched),
        cmocka_unit_test(test_cancel_kills_the_running_process_group),
        cmocka_unit_test(test_cached_model_attracts_the_next_job),
    };
    alarm(FH_SECONDS(150));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
