/* The agent's process runner, Python function runner and artifact opener. */
#include "px_test.h"

#include "base/common.h"
#include "fleet/agent_impl.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct collected {
    px_strbuf out, err, result;
} collected;

static void collect(px__proc_stream s, const char *data, size_t len, void *ud)
{
    collected *c = ud;
    px_strbuf_add(s == PX__PROC_STDOUT   ? &c->out
                  : s == PX__PROC_STDERR ? &c->err
                                         : &c->result,
                  data, len);
}

/* Runs spec to the end (at most 20 s), collecting every stream. */
static px__proc_exit run_all(const px__proc_spec *spec, collected *c)
{
    px__proc *p;
    px_err err;
    px_assert_ok(px__proc_spawn(spec, &p, &err), &err);
    uint64_t deadline = px_now_ns() + 20ull * 1000000000ull;
    px__proc_exit ex = {0};
    bool open = true;
    while (open && px_now_ns() < deadline)
        open = px__proc_pump(p, 50, collect, c);
    while (!px__proc_done(p, &ex) && px_now_ns() < deadline)
        usleep(10000);
    assert_false(open);
    px__proc_free(p);
    return ex;
}

static void release(collected *c)
{
    px_strbuf_release(&c->out);
    px_strbuf_release(&c->err);
    px_strbuf_release(&c->result);
}

static void test_runner_scrubs_environment_and_sets_visibility(void **state)
{
    (void)state;
    setenv("PLEXUS_SECRET_TEST", "leaked", 1);
    char *argv[] = {"/usr/bin/env", NULL};
    char *env[] = {"JOB_VAR=42", "CUDA_VISIBLE_DEVICES=7"};
    px__proc_spec spec = {.argv = argv, .env = env, .n_env = 2, .visible_devices = "1,3"};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    px_assert_contains(c.out.buf, "JOB_VAR=42\n");
    px_assert_contains(c.out.buf, "CUDA_VISIBLE_DEVICES=1,3\n");
    px_assert_contains(c.out.buf, "HIP_VISIBLE_DEVICES=1,3\n");
    px_assert_contains(c.out.buf, "PATH=");
    /* The job cannot widen its own visibility, and nothing else leaks. */
    assert_null(strstr(c.out.buf, "CUDA_VISIBLE_DEVICES=7"));
    assert_null(strstr(c.out.buf, "PLEXUS_SECRET_TEST"));
    release(&c);
    unsetenv("PLEXUS_SECRET_TEST");
}

static void test_runner_hides_every_device_for_cpu_jobs(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c", "echo \"[$CUDA_VISIBLE_DEVICES]\"", NULL};
    px__proc_spec spec = {.argv = argv, .visible_devices = ""};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    assert_string_equal(c.out.buf, "[]\n");
    release(&c);
}

static void test_runner_exposes_each_vendors_devices_separately(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c",
                    "echo \"cuda=[$CUDA_VISIBLE_DEVICES] hip=[$HIP_VISIBLE_DEVICES] "
                    "ze=[$ZE_AFFINITY_MASK]\"",
                    NULL};
    px__proc_spec spec = {.argv = argv, .visible_devices = "", .visible_amd = "0,1"};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    assert_string_equal(c.out.buf, "cuda=[] hip=[0,1] ze=[]\n");
    release(&c);
}

static void test_runner_passes_no_agent_file_descriptors(void **state)
{
    (void)state;
    int a = open("/dev/null", O_RDONLY), b = open("/dev/null", O_RDONLY),
        c3 = open("/dev/null", O_RDONLY);
    assert_true(a >= 0 && b >= 0 && c3 >= 0);
    char *argv[] = {"/bin/ls", "/proc/self/fd", NULL};
    px__proc_spec spec = {.argv = argv};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    /* stdin, stdout, stderr and the listing's own descriptor only. */
    assert_string_equal(c.out.buf, "0\n1\n2\n3\n");
    release(&c);
    close(a), close(b), close(c3);
}

static void test_runner_reports_exit_code_signal_and_streams(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    px__proc_spec spec = {.argv = argv};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 3);
    assert_int_equal(ex.signal, 0);
    assert_string_equal(c.out.buf, "out\n");
    assert_string_equal(c.err.buf, "err\n");
    release(&c);

    char *argv2[] = {"/bin/sh", "-c", "kill -9 $$", NULL};
    px__proc_spec spec2 = {.argv = argv2};
    collected c2 = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    ex = run_all(&spec2, &c2);
    assert_int_equal(ex.code, -1);
    assert_int_equal(ex.signal, SIGKILL);
    release(&c2);
}

static void test_runner_refuses_missing_program_before_running(void **state)
{
    (void)state;
    char *argv[] = {"no-such-program-plexus", "x", NULL};
    px__proc_spec spec = {.argv = argv};
    px__proc *p = NULL;
    px_err err;
    assert_int_equal(px__proc_spawn(&spec, &p, &err), PX_ENOTFOUND);
    assert_null(p);
    px_assert_contains(err.msg, "no-such-program-plexus");
    char *empty[] = {NULL};
    px__proc_spec spec2 = {.argv = empty};
    assert_int_equal(px__proc_spawn(&spec2, &p, &err), PX_EINVAL);
    /* A working folder that does not exist is an error at spawn too. */
    char *argv3[] = {"/bin/true", NULL};
    px__proc_spec spec3 = {.argv = argv3, .cwd = "/nonexistent/plexus/dir"};
    assert_int_not_equal(px__proc_spawn(&spec3, &p, &err), PX_OK);
    px_assert_contains(err.msg, "/nonexistent/plexus/dir");
}

static void test_runner_stop_kills_the_whole_process_group(void **state)
{
    (void)state;
    const char *dir = px_test_tmpdir();
    char *pidfile = px_asprintf("%s/grandchild.pid", dir);
    char *script = px_asprintf("sleep 60 & echo $! > %s; wait", pidfile);
    px__proc_spec spec = {.shell = script};
    px__proc *p;
    px_err err;
    px_assert_ok(px__proc_spawn(&spec, &p, &err), &err);
    pid_t grandchild = 0;
    for (int i = 0; i < 200 && !grandchild; i++) {
        usleep(20000);
        FILE *f = fopen(pidfile, "r");
        if (f) {
            long v = 0;
            if (fscanf(f, "%ld", &v) == 1)
                grandchild = (pid_t)v;
            fclose(f);
        }
    }
    assert_true(grandchild > 0);
    assert_int_equal(kill(grandchild, 0), 0);
    px__proc_stop(p, 1000);
    px__proc_exit ex;
    assert_true(px__proc_done(p, &ex));
    assert_true(ex.signal == SIGTERM || ex.signal == SIGKILL || ex.code != 0);
    px__proc_free(p);
    /* The grandchild was in the group: it is gone (or a zombie of init). */
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)grandchild);
        FILE *f = fopen(path, "r");
        if (!f) {
            gone = true;
            break;
        }
        char buf[512] = "";
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
        char *rp = strrchr(buf, ')');
        if (rp && rp[1] == ' ' && rp[2] == 'Z')
            gone = true;
        else
            usleep(20000);
    }
    assert_true(gone);
    free(script);
    free(pidfile);
}

static void test_run_capture_times_out(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sleep", "10", NULL};
    px__proc_spec spec = {.argv = argv};
    px_err err;
    uint64_t t0 = px_now_ns();
    assert_int_equal(px__proc_run_capture(&spec, 200, 100, NULL, NULL, &err), PX_ETIMEOUT);
    assert_true(px_now_ns() - t0 < 5ull * 1000000000ull);
    char *argv2[] = {"/bin/echo", "hello world", NULL};
    px__proc_spec spec2 = {.argv = argv2};
    char *out;
    px__proc_exit ex;
    px_assert_ok(px__proc_run_capture(&spec2, 5000, 5, &out, &ex, &err), &err);
    assert_string_equal(out, "hello"); /* bounded by max_out */
    free(out);
}

static bool have_python(void)
{
    char *argv[] = {"python3", "-c", "pass", NULL};
    px__proc_spec spec = {.argv = argv};
    px__proc_exit ex = {0};
    return px__proc_run_capture(&spec, 20000, 0, NULL, &ex, NULL) == PX_OK && ex.code == 0;
}

static void write_text(const char *path, const char *text)
{
    px_err err;
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
}

static void test_python_runner_returns_json_result_and_traceback(void **state)
{
    (void)state;
    if (!have_python()) {
        print_message("skipped: python3 is not installed\n");
        skip();
    }
    const char *dir = px_test_tmpdir();
    char *script = px_asprintf("%s/fn.py", dir);
    char *args = px_asprintf("%s/args.json", dir);
    write_text(script, "def add(a, b):\n    print('adding')\n    return {'sum': a + b}\n"
                       "def boom(x):\n    raise ValueError('bad x %d' % x)\n"
                       "def square(x):\n    return x * x\n");
    write_text(args, "{\"a\": 2, \"b\": 40}");
    const char *argv[8];
    px__python_argv("python3", script, "add", args, argv);
    px__proc_spec spec = {.argv = (char *const *)argv, .result_fd = true};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    assert_string_equal(c.out.buf, "adding\n");
    json_t *r = json_loads(c.result.buf, 0, NULL);
    assert_non_null(r);
    assert_true(json_is_true(json_object_get(r, "ok")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "result"), "sum")), 42);
    json_decref(r);
    release(&c);

    write_text(args, "7");
    px__python_argv("python3", script, "boom", args, argv);
    collected c2 = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    ex = run_all(&spec, &c2);
    assert_int_equal(ex.code, 1);
    r = json_loads(c2.result.buf, 0, NULL);
    assert_non_null(r);
    assert_true(json_is_false(json_object_get(r, "ok")));
    px_assert_contains(json_string_value(json_object_get(r, "error")), "ValueError: bad x 7");
    px_assert_contains(json_string_value(json_object_get(r, "traceback")), "Traceback");
    json_decref(r);
    release(&c2);

    /* A single non-object argument is passed positionally. */
    px__python_argv("python3", script, "square", args, argv);
    collected c3 = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    ex = run_all(&spec, &c3);
    assert_int_equal(ex.code, 0);
    px_assert_contains(c3.result.buf, "\"result\": 49");
    release(&c3);
    free(script);
    free(args);
}

static void test_python_target_parse_rejects_bad_targets(void **state)
{
    (void)state;
    char *file, *fn;
    px_err err;
    px_assert_ok(px_fleet_python_target_parse("dir/train.py:main_2", &file, &fn, &err), &err);
    assert_string_equal(file, "dir/train.py");
    assert_string_equal(fn, "main_2");
    free(file);
    free(fn);
    const char *bad[] = {"train.py", "train.txt:main", "train.py:", "train.py:1abc", "train.py:a-b",
                         ":f",       ".py:f"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        assert_int_equal(px_fleet_python_target_parse(bad[i], &file, &fn, &err), PX_EINVAL);
        assert_null(file);
        assert_null(fn);
    }
}

static void test_artifact_open_refuses_escapes_and_links(void **state)
{
    (void)state;
    char *dir = px_asprintf("%s/artifacts", px_test_tmpdir());
    mkdir(dir, 0755);
    char *sub = px_asprintf("%s/out", dir);
    mkdir(sub, 0755);
    char *f = px_asprintf("%s/out/model.pt", dir);
    write_text(f, "weights");
    char *link = px_asprintf("%s/passwd", dir);
    assert_int_equal(symlink("/etc/passwd", link), 0);
    char *dlink = px_asprintf("%s/etc", dir);
    assert_int_equal(symlink("/etc", dlink), 0);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    px_err err;
    int fd = px__agent_open_artifact(dfd, "out/model.pt", 12, &err);
    assert_true(fd >= 0);
    char buf[16] = "";
    assert_int_equal(read(fd, buf, sizeof buf), 7);
    close(fd);
    struct {
        const char *name;
        const char *needle;
    } bad[] = {
        {"../secret", "\"..\""},        {"/etc/passwd", "relative"},
        {"out/../../x", "\"..\""},      {"passwd", "symbolic link"},
        {"etc/passwd", "not a folder"}, {"out\\model.pt", "backslash"},
        {"missing.txt", "missing.txt"}, {"out", "regular file"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        fd = px__agent_open_artifact(dfd, bad[i].name, strlen(bad[i].name), &err);
        if (fd >= 0)
            fail_msg("artifact \"%s\" was opened", bad[i].name);
        px_assert_contains(err.msg, bad[i].needle);
    }
    /* An embedded NUL (length longer than the C string) is refused. */
    assert_int_equal(px__agent_open_artifact(dfd, "out/model.pt", 20, &err), -1);
    close(dfd);
    free(dir), free(sub), free(f), free(link), free(dlink);
}

static bool gone(pid_t pid)
{
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    fclose(f);
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] == 'Z';
}

static void wait_gone(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 400 && !gone(pids[i]); k++)
            usleep(25000);
        if (!gone(pids[i]))
            fail_msg("process %d outlived its job", (int)pids[i]);
    }
}

/* Runs a job that starts a setsid process and a double-forked orphan and
 * prints their pids, then exits; returns the pids. */
static void run_escaper(const char *cgroup, pid_t pids[2])
{
    char *script = "setsid sleep 300 & echo $!; (sleep 301 & echo $!); sleep 0.2";
    px__proc_spec spec = {.shell = script, .cgroup = cgroup};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc *p;
    px_err err;
    px_assert_ok(px__proc_spawn(&spec, &p, &err), &err);
    uint64_t deadline = px_now_ns() + 10ull * 1000000000ull;
    while (!px__proc_done(p, NULL) && px_now_ns() < deadline)
        px__proc_pump(p, 50, collect, &c);
    /* The leader is gone; its descendants hold the pipes.  Take what they
     * printed, then end the job. */
    for (int i = 0; i < 10; i++)
        px__proc_pump(p, 20, collect, &c);
    long a = 0, b = 0;
    assert_int_equal(sscanf(c.out.buf ? c.out.buf : "", "%ld %ld", &a, &b), 2);
    pids[0] = (pid_t)a;
    pids[1] = (pid_t)b;
    assert_false(gone(pids[0]));
    assert_false(gone(pids[1]));
    if (cgroup) {
        char path[64], *text = NULL;
        size_t len;
        snprintf(path, sizeof path, "/proc/%ld/cgroup", a);
        px_assert_ok(px_read_file(path, 4096, &text, &len, NULL), (px_err *)NULL);
        px_assert_contains(text, strrchr(cgroup, '/'));
        free(text);
    }
    px__proc_free(p);
    wait_gone(pids, 2);
    release(&c);
}

static void test_runner_ends_descendants_that_left_the_group(void **state)
{
    (void)state;
    pid_t pids[2];
    run_escaper(NULL, pids);
}

/* A cgroup v2 folder this test may write, or NULL. */
static char *test_cgroup(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096], mount[1024] = "";
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, " - cgroup2 ")) {
            char root[1024];
            if (sscanf(line, "%*s %*s %*s %1023s %1023s", root, mount) == 2 && !strcmp(root, "/"))
                break;
            mount[0] = '\0';
        }
    if (f)
        fclose(f);
    if (!mount[0])
        return NULL;
    f = fopen("/proc/self/cgroup", "r");
    char own[1024] = "";
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(own, sizeof own, "%.1000s", line + 3);
        }
    if (f)
        fclose(f);
    char *dir = px_asprintf("%s%s/plexus-runner-test-%d", mount, strcmp(own, "/") ? own : "",
                            (int)getpid());
    char kill_file[1200];
    snprintf(kill_file, sizeof kill_file, "%s/cgroup.kill", dir);
    if (mkdir(dir, 0755) != 0 || access(kill_file, W_OK) != 0) {
        rmdir(dir);
        free(dir);
        return NULL;
    }
    return dir;
}

static void test_runner_in_a_cgroup_ends_everything_and_removes_it(void **state)
{
    (void)state;
    char *cg = test_cgroup();
    if (!cg) {
        print_message("skipped: no writable cgroup v2 here; the supervisor's subreaper is "
                      "tested above\n");
        skip();
    }
    pid_t pids[2];
    run_escaper(cg, pids);
    assert_int_equal(access(cg, F_OK), -1); /* removed with the job */
    free(cg);
}

static void test_runner_runs_jobs_as_the_job_user(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("skipped: only root runs jobs as another user\n");
        skip();
    }
    const char *dir = px_test_tmpdir();
    char *secret = px_asprintf("%s/secret", dir);
    int fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cr3t\n", 7), 7);
    close(fd);
    chmod(dir, 0755);
    char *script = px_asprintf("id -u; id -G; cat %s || echo refused", secret);
    px__proc_spec spec = {.shell = script, .set_user = true, .uid = 65534, .gid = 65534};
    collected c = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    px__proc_exit ex = run_all(&spec, &c);
    assert_int_equal(ex.code, 0);
    px_assert_contains(c.out.buf, "65534\n65534\n");
    px_assert_contains(c.out.buf, "refused");
    assert_null(strstr(c.out.buf, "s3cr3t"));
    release(&c);
    free(script);
    free(secret);
}

/* An interpreter under a folder the job user cannot enter (python3 of
 * root's pyenv for a job run as nobody) is named with the folder in the
 * way and the fix, whether it is given as is or through a link; once the
 * way is open, or when jobs run as the agent's own user, it passes. */
static void test_job_user_must_reach_the_python_interpreter(void **state)
{
    (void)state;
    const char *dir = px_test_tmpdir();
    char *home = px_asprintf("%s/root-home", dir);
    char *bin = px_asprintf("%s/root-home/bin", dir);
    char *python = px_asprintf("%s/root-home/bin/python3", dir);
    char *link = px_asprintf("%s/python3-link", dir);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(mkdir(home, 0700), 0);
    assert_int_equal(mkdir(bin, 0755), 0);
    int fd = open(python, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(symlink(python, link), 0);
    px__agent a;
    memset(&a, 0, sizeof a);
    a.set_user = true;
    a.uid = 65534;
    a.gid = 65534;
    px_err err;
    assert_int_equal(px__agent_job_user_may_run(&a, python, "the Python interpreter", NULL, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "the Python interpreter");
    px_assert_contains(err.msg, python);
    px_assert_contains(err.msg, "uid 65534");
    px_assert_contains(err.msg, "cannot enter");
    px_assert_contains(err.msg, "chmod o+x");
    px_assert_contains(err.msg, home);
    assert_int_equal(px__agent_job_user_may_run(&a, link, "the Python interpreter", NULL, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, home);
    /* A file it may not execute. */
    assert_int_equal(chmod(home, 0711), 0);
    assert_int_equal(chmod(python, 0700), 0);
    assert_int_equal(px__agent_job_user_may_run(&a, link, "the Python interpreter", NULL, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "cannot execute");
    assert_int_equal(chmod(python, 0755), 0);
    px_assert_ok(px__agent_job_user_may_run(&a, link, "the Python interpreter", NULL, &err), &err);
    /* A bare name: the first on PATH the job user can run, past one in
     * a folder it cannot enter. */
    assert_int_equal(chmod(home, 0700), 0);
    char *open_bin = px_asprintf("%s/open-bin", dir);
    char *open_python = px_asprintf("%s/open-bin/python3", dir);
    assert_int_equal(mkdir(open_bin, 0755), 0);
    assert_int_equal(symlink("/bin/sh", open_python), 0);
    char *old_path = px_strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    char *path = px_asprintf("%s:%s", bin, open_bin);
    setenv("PATH", path, 1);
    char *found = NULL;
    px_err e2;
    px_status st = px__agent_job_user_may_run(&a, "python3", "the Python interpreter", &found, &e2);
    setenv("PATH", bin, 1);
    px_status st_blocked =
        px__agent_job_user_may_run(&a, "python3", "the Python interpreter", NULL, &err);
    setenv("PATH", old_path, 1);
    px_assert_ok(st, &e2);
    assert_non_null(found);
    assert_string_equal(found, open_python);
    assert_int_equal(st_blocked, PX_EINVAL);
    px_assert_contains(err.msg, python);
    free(found);
    free(path);
    free(old_path);
    free(open_bin);
    free(open_python);
    a.set_user = false;
    px_assert_ok(px__agent_job_user_may_run(&a, python, "the Python interpreter", NULL, &err),
                 &err);
    free(home);
    free(bin);
    free(python);
    free(link);
}

/* A job's client is kept when the job ends and handed to the next job
 * (its connection, and a TLS session, with it), with the credential made
 * current if it was rotated meanwhile; jobs at once get clients of their
 * own, and no more than PX__AGENT_IDLE_CLIENTS are kept. */
static void test_agent_jobs_reuse_their_clients(void **state)
{
    (void)state;
    px_fleet_agent_config cfg = {.server = "http://127.0.0.1:9,http://127.0.0.1:10",
                                 .token = "join-token"};
    px__agent *a = calloc(1, sizeof *a);
    assert_non_null(a);
    a->cfg = &cfg;
    pthread_mutex_init(&a->cred_mu, NULL);
    px_err err;
    px_fleet_client *c1, *c2, *again;
    unsigned g1, g2, g;
    px_assert_ok(px__agent_job_client(a, &c1, &g1, &err), &err);
    px_assert_ok(px__agent_job_client(a, &c2, &g2, &err), &err);
    assert_ptr_not_equal(c1, c2);
    px__agent_job_client_done(a, c1, g1);
    assert_int_equal(a->n_idle, 1);
    px_assert_ok(px__agent_job_client(a, &again, &g, &err), &err);
    assert_ptr_equal(again, c1);
    assert_int_equal(a->n_idle, 0);
    /* A rotation while the client was idle reaches it when it is taken. */
    px__agent_job_client_done(a, again, g);
    snprintf(a->cred, sizeof a->cred, "%s", "node-credential-rotated-0123456789abcdef");
    atomic_fetch_add(&a->cred_gen, 1);
    px_assert_ok(px__agent_job_client(a, &again, &g, &err), &err);
    assert_ptr_equal(again, c1);
    assert_int_equal(g, atomic_load(&a->cred_gen));
    px__agent_job_client_done(a, again, g);
    px__agent_job_client_done(a, c2, g2);
    assert_int_equal(a->n_idle, 2);
    /* Past the limit, a client given back is freed (ASan would see a leak
     * otherwise). */
    px_fleet_client *many[PX__AGENT_IDLE_CLIENTS + 2];
    for (int i = 0; i < PX__AGENT_IDLE_CLIENTS + 2; i++)
        px_assert_ok(px__agent_job_client(a, &many[i], &g, &err), &err);
    assert_int_equal(a->n_idle, 0);
    for (int i = 0; i < PX__AGENT_IDLE_CLIENTS + 2; i++)
        px__agent_job_client_done(a, many[i], g);
    assert_int_equal(a->n_idle, PX__AGENT_IDLE_CLIENTS);
    px__agent_idle_clients_free(a);
    assert_int_equal(a->n_idle, 0);
    pthread_mutex_destroy(&a->cred_mu);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runner_scrubs_environment_and_sets_visibility),
        cmocka_unit_test(test_runner_hides_every_device_for_cpu_jobs),
        cmocka_unit_test(test_runner_passes_no_agent_file_descriptors),
        cmocka_unit_test(test_runner_exposes_each_vendors_devices_separately),
        cmocka_unit_test(test_runner_reports_exit_code_signal_and_streams),
        cmocka_unit_test(test_runner_refuses_missing_program_before_running),
        cmocka_unit_test(test_runner_stop_kills_the_whole_process_group),
        cmocka_unit_test(test_run_capture_times_out),
        cmocka_unit_test(test_python_runner_returns_json_result_and_traceback),
        cmocka_unit_test(test_python_target_parse_rejects_bad_targets),
        cmocka_unit_test(test_artifact_open_refuses_escapes_and_links),
        cmocka_unit_test(test_runner_ends_descendants_that_left_the_group),
        cmocka_unit_test(test_runner_in_a_cgroup_ends_everything_and_removes_it),
        cmocka_unit_test(test_runner_runs_jobs_as_the_job_user),
        cmocka_unit_test(test_job_user_must_reach_the_python_interpreter),
        cmocka_unit_test(test_agent_jobs_reuse_their_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
