/*
 * What a killed run of the namespace harness (tests/support/netns.h)
 * leaves, the next run removes: a process sets up namespaces, starts a
 * process inside one and is killed with SIGKILL (no handler runs); the
 * sweep then kills what still runs inside and removes the namespaces,
 * and leaves those of live runs alone.  Teardown removes everything, and
 * a second teardown does nothing.  Skips, saying why, where namespaces
 * cannot be made.
 */
#include "px_test.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "netns.h"

static bool exists(const char *name)
{
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, "/run/netns/%s", name);
    return stat(path, &st) == 0;
}

/* Whether pid is gone (or a zombie nobody has reaped yet). */
static bool gone(pid_t pid)
{
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return true;
    if (!fgets(buf, sizeof buf, fp))
        buf[0] = '\0';
    fclose(fp);
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] == 'Z';
}

static void wait_gone(pid_t pid, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    while (!gone(pid)) {
        if (px_now_ns() > deadline)
            fail_msg("process %d still runs %d s after the sweep", (int)pid, timeout_s);
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
}

/* Starts `sleep 300` inside node i of x; returns its pid once it is
 * there (-1 if it never gets there within 30 s). */
static pid_t sleeper(const px_netns *x, int i)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (px_netns_join(x, i) != 0)
            _exit(126);
        execl("/bin/sleep", "sleep", "300", (char *)NULL);
        _exit(127);
    }
    for (int k = 0; pid > 0 && k < 1500; k++) {
        pid_t pids[64];
        int n = px_netns_pids(x, i, pids, 64);
        for (int j = 0; j < n; j++)
            if (pids[j] == pid)
                return pid;
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    if (pid > 0)
        kill(pid, SIGKILL);
    return -1;
}

static void test_a_killed_runs_namespaces_are_swept(void **state)
{
    (void)state;
    px_netns mine;
    if (!px_netns_setup(&mine, 1)) {
        print_message("skipped: %s\n", mine.why);
        skip();
    }
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t run = fork();
    assert_true(run >= 0);
    if (run == 0) {
        /* A run that is killed before it can clean up. */
        close(fds[0]);
        px_netns x;
        pid_t inside = px_netns_setup(&x, 2) ? sleeper(&x, 1) : -1;
        if (write(fds[1], &inside, sizeof inside) != (ssize_t)sizeof inside)
            _exit(1);
        pause();
        _exit(0);
    }
    close(fds[1]);
    pid_t inside = -1;
    assert_int_equal(read(fds[0], &inside, sizeof inside), (ssize_t)sizeof inside);
    close(fds[0]);
    assert_true(inside > 0);
    char hub[32], node0[32], node1[32];
    snprintf(hub, sizeof hub, "pxns%d-hub", (int)run);
    snprintf(node0, sizeof node0, "pxns%d-0", (int)run);
    snprintf(node1, sizeof node1, "pxns%d-1", (int)run);
    assert_true(exists(hub) && exists(node0) && exists(node1));
    kill(run, SIGKILL);
    waitpid(run, NULL, 0);
    /* Still there: nothing of the killed run cleaned up. */
    assert_true(exists(node1));
    assert_false(gone(inside));

    assert_true(px_netns_sweep_stale() >= 3);
    assert_false(exists(hub) || exists(node0) || exists(node1));
    wait_gone(inside, 30);
    /* A live run's namespaces stay. */
    assert_true(exists(mine.hub) && exists(mine.node[0]));

    /* Teardown kills what runs inside and removes the names, once. */
    pid_t mine_inside = sleeper(&mine, 0);
    assert_true(mine_inside > 0);
    px_netns_teardown(&mine);
    assert_false(exists(mine.hub) || exists(mine.node[0]));
    waitpid(mine_inside, NULL, 0);
    assert_true(gone(mine_inside));
    px_netns_teardown(&mine);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_killed_runs_namespaces_are_swept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
