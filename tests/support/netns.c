/*
 * Network namespaces for tests (netns.h): created with iproute2's `ip`,
 * entered with setns(2), removed by unmounting their names under
 * /run/netns after the processes inside are killed (what `ip netns del`
 * does, without starting a process: the removal also runs from a fatal
 * signal's handler).
 */
#include "netns.h"

#include "px_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define NETNS_DIR    "/run/netns"
#define NETNS_PREFIX "pxns"
#define SUBNET       "10.77.0"

/* The instances set up and not torn down, for the exit and signal paths. */
static px_netns *live[4];
static int n_live;
static const int fatal_signals[] = {SIGTERM, SIGINT, SIGABRT, SIGSEGV, SIGALRM};
static struct sigaction previous[PX_ARRAY_LEN(fatal_signals)];

/* Runs `ip`/`tc` with the words of args (separated by single spaces);
 * false with what it said in x->why. */
static bool run_tool(px_netns *x, const char *tool, const char *args)
{
    char copy[512];
    char *argv[40];
    int n = 0;
    snprintf(copy, sizeof copy, "%s", args);
    argv[n++] = (char *)tool;
    for (char *save = NULL, *w = strtok_r(copy, " ", &save); w && n < 39;
         w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 30, &out, &err);
    if (rc != 0) {
        size_t len = err ? strlen(err) : 0;
        while (len && (err[len - 1] == '\n' || err[len - 1] == ' '))
            err[--len] = '\0';
        if (rc == 127)
            snprintf(x->why, sizeof x->why,
                     "the `%s` command is missing (install iproute2 to run the network "
                     "namespace tests)",
                     tool);
        else
            snprintf(x->why, sizeof x->why, "`%s %.200s` failed (exit %d): %.250s", tool, args, rc,
                     err && *err ? err : "no message");
    }
    free(out);
    free(err);
    return rc == 0;
}

/* Puts before and after around the message in x->why. */
static void wrap_why(px_netns *x, const char *before, const char *after)
{
    char why[sizeof x->why];
    snprintf(why, sizeof why, "%s", x->why[0] ? x->why : strerror(errno));
    snprintf(x->why, sizeof x->why, "%s%.300s%s", before, why, after);
}

static bool ip(px_netns *x, const char *fmt, ...) PX_PRINTF(2, 3);
static bool ip(px_netns *x, const char *fmt, ...)
{
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return run_tool(x, "ip", args);
}

/* The inode of a named namespace's file, or 0. */
static ino_t ns_inode(const char *name)
{
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, NETNS_DIR "/%s", name);
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* Process ids whose network namespace is the one of inode ino. */
static int pids_in(ino_t ino, pid_t *pids, int max)
{
    int n = 0;
    DIR *d = ino ? opendir("/proc") : NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
        if (stat(path, &st) == 0 && st.st_ino == ino)
            pids[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* Kills every process in the namespace but this one, then removes its
 * name. */
static void remove_ns(const char *name)
{
    pid_t pids[256];
    int n = pids_in(ns_inode(name), pids, 256);
    for (int i = 0; i < n; i++)
        if (pids[i] != getpid())
            kill(pids[i], SIGKILL);
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", name);
    umount2(path, MNT_DETACH);
    unlink(path);
}

/* Only system calls: usable from a signal handler. */
static void remove_name_only(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", name);
    umount2(path, MNT_DETACH);
    unlink(path);
}

int px_netns_sweep_stale(void)
{
    DIR *d = opendir(NETNS_DIR);
    if (!d)
        return 0;
    char names[64][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (strncmp(e->d_name, NETNS_PREFIX, strlen(NETNS_PREFIX)) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + strlen(NETNS_PREFIX), &end, 10);
        if (pid <= 0 || *end != '-' || pid == getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(names[n++], sizeof names[0], "%.63s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        remove_ns(names[i]);
    return n;
}

static void forget(px_netns *x)
{
    for (int i = 0; i < n_live; i++)
        if (live[i] == x) {
            live[i] = live[--n_live];
            return;
        }
}

void px_netns_teardown(px_netns *x)
{
    if (!x->up)
        return;
    x->up = false;
    forget(x);
    if (x->in_hub && x->home_fd >= 0)
        setns(x->home_fd, CLONE_NEWNET);
    x->in_hub = false;
    for (int i = 0; i < x->n; i++) {
        remove_ns(x->node[i]);
        if (x->node_fd[i] >= 0)
            close(x->node_fd[i]);
        x->node_fd[i] = -1;
    }
    remove_ns(x->hub);
    if (x->hub_fd >= 0)
        close(x->hub_fd);
    if (x->home_fd >= 0)
        close(x->home_fd);
    x->hub_fd = x->home_fd = -1;
}

static void teardown_all(void)
{
    while (n_live > 0)
        px_netns_teardown(live[n_live - 1]);
}

static void on_fatal(int sig)
{
    for (int k = 0; k < n_live; k++) {
        px_netns *x = live[k];
        for (int i = 0; i < x->n; i++)
            remove_name_only(x->node[i]);
        remove_name_only(x->hub);
    }
    for (size_t i = 0; i < PX_ARRAY_LEN(fatal_signals); i++)
        if (fatal_signals[i] == sig)
            sigaction(sig, &previous[i], NULL);
    raise(sig);
}

static void install_cleanup(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    atexit(teardown_all);
    for (size_t i = 0; i < PX_ARRAY_LEN(fatal_signals); i++) {
        struct sigaction sa = {.sa_handler = on_fatal};
        sigemptyset(&sa.sa_mask);
        sigaction(fatal_signals[i], &sa, &previous[i]);
    }
}

static int open_ns(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", name);
    return open(path, O_RDONLY | O_CLOEXEC);
}

bool px_netns_setup(px_netns *x, int n)
{
    memset(x, 0, sizeof *x);
    x->hub_fd = x->home_fd = -1;
    for (int i = 0; i < PX_NETNS_MAX; i++)
        x->node_fd[i] = -1;
    if (n < 1 || n > PX_NETNS_MAX || n_live == (int)PX_ARRAY_LEN(live)) {
        snprintf(x->why, sizeof x->why, "px_netns_setup: %d namespaces asked (1 to %d)", n,
                 PX_NETNS_MAX);
        return false;
    }
    if (geteuid() != 0) {
        snprintf(x->why, sizeof x->why,
                 "network namespaces need root (or CAP_SYS_ADMIN and CAP_NET_ADMIN); this "
                 "test runs as uid %d",
                 (int)geteuid());
        return false;
    }
    px_netns_sweep_stale();
    x->n = n;
    snprintf(x->hub, sizeof x->hub, NETNS_PREFIX "%d-hub", (int)getpid());
    snprintf(x->hub_addr, sizeof x->hub_addr, SUBNET ".1");
    for (int i = 0; i < n; i++) {
        snprintf(x->node[i], sizeof x->node[i], NETNS_PREFIX "%d-%d", (int)getpid(), i);
        snprintf(x->addr[i], sizeof x->addr[i], SUBNET ".%d", 10 + i);
    }
    x->home_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (x->home_fd < 0) {
        snprintf(x->why, sizeof x->why, "/proc/self/ns/net: %s (is /proc mounted?)",
                 strerror(errno));
        return false;
    }
    /* Namespaces of an earlier instance of this process (a test that
     * failed before its teardown) go first. */
    remove_ns(x->hub);
    for (int i = 0; i < n; i++)
        remove_ns(x->node[i]);
    install_cleanup();
    if (!ip(x, "netns add %s", x->hub)) {
        close(x->home_fd);
        x->home_fd = -1;
        wrap_why(x, "cannot create a network namespace (",
                 "); the test needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN");
        return false;
    }
    x->up = true;
    live[n_live++] = x;
    bool ok = ip(x, "-n %s link set lo up", x->hub) &&
              ip(x, "-n %s link add br0 type bridge", x->hub) &&
              ip(x, "-n %s addr add %s/24 dev br0", x->hub, x->hub_addr) &&
              ip(x, "-n %s link set br0 up", x->hub);
    for (int i = 0; ok && i < n; i++)
        ok = ip(x, "netns add %s", x->node[i]) && ip(x, "-n %s link set lo up", x->node[i]) &&
             ip(x, "-n %s link add v%d type veth peer name eth0 netns %s", x->hub, i, x->node[i]) &&
             ip(x, "-n %s link set v%d master br0", x->hub, i) &&
             ip(x, "-n %s link set v%d up", x->hub, i) &&
             ip(x, "-n %s addr add %s/24 dev eth0", x->node[i], x->addr[i]) &&
             ip(x, "-n %s link set eth0 up", x->node[i]);
    x->hub_fd = ok ? open_ns(x->hub) : -1;
    for (int i = 0; ok && i < n; i++)
        x->node_fd[i] = open_ns(x->node[i]);
    for (int i = 0; ok && i < n; i++)
        ok = x->node_fd[i] >= 0;
    if (ok && x->hub_fd < 0)
        ok = false;
    if (!ok) {
        wrap_why(x, "cannot join the namespaces by veth pairs: ", "");
        px_netns_teardown(x);
        return false;
    }
    return true;
}

bool px_netns_enter_hub(px_netns *x)
{
    if (px_netns_join(x, -1) != 0) {
        snprintf(x->why, sizeof x->why, "setns into %s: %s", x->hub, strerror(errno));
        return false;
    }
    x->in_hub = true;
    return true;
}

int px_netns_join(const px_netns *x, int i)
{
    int fd = i < 0 ? x->hub_fd : i < x->n ? x->node_fd[i] : -1;
    if (fd < 0) {
        errno = EINVAL;
        return -1;
    }
    return setns(fd, CLONE_NEWNET);
}

bool px_netns_link(px_netns *x, int i, bool up)
{
    if (i < 0 || i >= x->n) {
        snprintf(x->why, sizeof x->why, "px_netns_link: no node %d", i);
        return false;
    }
    return ip(x, "-n %s link set eth0 %s", x->node[i], up ? "up" : "down");
}

bool px_netns_shape(px_netns *x, int i, const char *args)
{
    if (i < 0 || i >= x->n) {
        snprintf(x->why, sizeof x->why, "px_netns_shape: no node %d", i);
        return false;
    }
    char line[400];
    if (args)
        snprintf(line, sizeof line, "-n %s qdisc replace dev eth0 root netem %s", x->node[i], args);
    else
        snprintf(line, sizeof line, "-n %s qdisc del dev eth0 root", x->node[i]);
    if (run_tool(x, "tc", line))
        return true;
    if (args && strstr(x->why, "qdisc kind is unknown"))
        wrap_why(
            x,
            "tc's netem is unavailable on this machine (load the kernel module sch_netem): ", "");
    return false;
}

int px_netns_pids(const px_netns *x, int i, pid_t *pids, int max)
{
    if (i < 0 || i >= x->n)
        return 0;
    return pids_in(ns_inode(x->node[i]), pids, max);
}
