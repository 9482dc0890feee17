/*
 * A small fleet for integration tests: a real `plexus server` and real
 * `plexus agent` processes on 127.0.0.1 (ephemeral ports, a temporary data
 * folder, emulated GPU inventories written here), API calls with the user
 * token, and cleanup of every process group at exit, also on failure.
 * Agents join with the join token from a private file; when the tests run
 * as root, agents run their jobs as the user nobody (as a root agent
 * must), so the test folders are made passable for it.
 * Included by the tests/integration/test_fleet_*.c files (static helpers).
 */
#ifndef PX_FLEET_HARNESS_H
#define PX_FLEET_HARNESS_H

#include "px_test.h"

#include <stdatomic.h>

#include "base/common.h"
#include "pg_harness.h"
#include "px_slowdown.h"
#include "plexus/fleet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FH_MAX_PROCS     16
#define FH_CLUSTER_TOKEN "cluster-token-for-tests-0123456789"
#define FH_USER_TOKEN    "user-token-for-tests-abcdefghijkl"
#define FH_OTHER_TOKEN   "other-user-token-for-tests-mnopqr"
#define FH_ADMIN_TOKEN   "admin-token-for-tests-stuvwxyz0123"

/* Under ThreadSanitizer a lease of a few seconds would lapse between the
 * slowed agents' heartbeats on loaded cores and the agents would fence
 * their work, a path these suites do not mean to take. */
#define FH_LEASE_SCALE PX_TEST_SLOWDOWN
/* A limit of s seconds on what the slowed processes do (a job to finish,
 * nodes to come online, a whole suite's alarm), scaled the same way. */
#define FH_SECONDS(s) ((s)*PX_TEST_SLOWDOWN)

typedef struct fh_proc {
    pid_t pid;
    char name[64];
    char log[1024];
} fh_proc;

typedef struct fh_fleet {
    char dir[400];
    char data[600];
    char tokens[600];
    char join[600];   /* the join token, in a private file */
    char shared[600]; /* a folder every job may write (1777), for files the test reads */
    char ca[600];     /* with TLS: the CA clients and agents trust ("" without) */
    const char *extra_server_args[12]; /* more `plexus server` options, NULL-ended */
    char listen_host[32];              /* the server's listen address ("" : 127.0.0.1) */
    char url[64];
    char servers[256]; /* several servers (URL,URL,...) clients use instead of url; or "" */
    int port;
    double lease_s;
    fh_proc server;
    fh_proc agents[FH_MAX_PROCS];
    int n_agents;
} fh_fleet;

static pid_t fh_all_pids[64];
static int fh_n_pids;

/* Run in each child fh_spawn starts, between fork and exec (NULL: none),
 * for example to enter a network namespace (tests/support/netns.h); a
 * nonzero return ends the child with status 126. */
static int (*fh_child_setup)(void *arg);
static void *fh_child_setup_arg;

static inline void fh_kill_all(void)
{
    for (int i = 0; i < fh_n_pids; i++)
        if (fh_all_pids[i] > 0) {
            kill(-fh_all_pids[i], SIGKILL);
            kill(fh_all_pids[i], SIGKILL);
            waitpid(fh_all_pids[i], NULL, 0);
            fh_all_pids[i] = 0;
        }
}

static inline void fh_on_fatal(int sig)
{
    fh_kill_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void fh_install_cleanup(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    atexit(fh_kill_all);
    signal(SIGTERM, fh_on_fatal);
    signal(SIGINT, fh_on_fatal);
    signal(SIGABRT, fh_on_fatal);
    signal(SIGSEGV, fh_on_fatal);
    signal(SIGALRM, fh_on_fatal);
    signal(SIGPIPE, SIG_IGN);
}

static inline int fh_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &len) != 0)
        fail_msg("cannot find a free port: %s", strerror(errno));
    close(s);
    return ntohs(a.sin_port);
}

/* Starts argv in its own process group with output in log. */
static inline pid_t fh_spawn(char *const argv[], const char *log, const char *const *env)
{
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (fh_child_setup && fh_child_setup(fh_child_setup_arg) != 0)
            _exit(126);
        for (int i = 0; env && env[i]; i += 2) {
            if (env[i + 1])
                setenv(env[i], env[i + 1], 1);
            else
                unsetenv(env[i]);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    setpgid(pid, pid);
    if (fh_n_pids < (int)PX_ARRAY_LEN(fh_all_pids))
        fh_all_pids[fh_n_pids++] = pid;
    return pid;
}

static inline void fh_forget(pid_t pid)
{
    for (int i = 0; i < fh_n_pids; i++)
        if (fh_all_pids[i] == pid)
            fh_all_pids[i] = 0;
}

static inline void fh_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline void fh_print_log(const char *log)
{
    char *text = NULL;
    size_t len;
    if (px_read_file(log, 1u << 20, &text, &len, NULL) == PX_OK) {
        /* Not print_message: cmocka cuts its messages at 4 KiB. */
        size_t from = len > 16000 ? len - 16000 : 0;
        fprintf(stderr, "---- %s ----\n%s\n", log, text + from);
        fflush(stderr);
    }
    free(text);
}

/* A client with the user token (or another). */
static inline px_fleet_client *fh_client(fh_fleet *f, const char *token)
{
    px_fleet_client *c;
    px_err err;
    px_assert_ok(px_fleet_client_new(f->servers[0] ? f->servers : f->url, token, &c, &err), &err);
    if (f->ca[0])
        px_assert_ok(px_fleet_client_set_ca(c, f->ca, &err), &err);
    px_fleet_client_set_timeout(c, FH_SECONDS(20000));
    return c;
}

/* Calls the API with the user token; fails the test on error. */
static inline json_t *fh_api(fh_fleet *f, const char *method, const char *path, const json_t *body)
{
    px_fleet_client *c = fh_client(f, FH_USER_TOKEN);
    json_t *reply = NULL;
    px_err err;
    px_status st = px_fleet_client_call(c, method, path, body, NULL, &reply, &err);
    px_fleet_client_free(c);
    if (st != PX_OK)
        fail_msg("%s %s: %s", method, path, err.msg);
    return reply;
}

static inline bool fh_server_up(fh_fleet *f)
{
    px_fleet_client *c = fh_client(f, NULL);
    px_fleet_client_set_timeout(c, 1000);
    json_t *r = NULL;
    bool ok = px_fleet_client_call(c, "GET", "/v1/health", NULL, NULL, &r, NULL) == PX_OK;
    json_decref(r);
    px_fleet_client_free(c);
    return ok;
}

static inline void fh_start_server(fh_fleet *f)
{
    char lease[32], listen[64];
    snprintf(lease, sizeof lease, "%g", f->lease_s);
    snprintf(listen, sizeof listen, "%s:%d", f->listen_host[0] ? f->listen_host : "127.0.0.1",
             f->port);
    char *argv[32] = {(char *)px_test_plexus_bin(),
                      "server",
                      "--listen",
                      listen,
                      "--data",
                      f->data,
                      "--token-file",
                      f->tokens,
                      "--lease",
                      lease,
                      NULL};
    int n = 10;
    for (int i = 0; f->extra_server_args[i] && n < 30; i++)
        argv[n++] = (char *)f->extra_server_args[i];
    argv[n] = NULL;
    f->server.pid = fh_spawn(argv, f->server.log, NULL);
    for (int i = 0; i < 200; i++) {
        if (fh_server_up(f))
            return;
        int status;
        if (waitpid(f->server.pid, &status, WNOHANG) == f->server.pid) {
            fh_forget(f->server.pid);
            fh_print_log(f->server.log);
            fail_msg("plexus server exited at start (status %d)", status);
        }
        fh_sleep_ms(50);
    }
    fh_print_log(f->server.log);
    fail_msg("plexus server did not answer /v1/health within 10 s");
}

/* Kills the server with SIGKILL (no chance to clean up). */
static inline void fh_kill_server(fh_fleet *f)
{
    kill(-f->server.pid, SIGKILL);
    waitpid(f->server.pid, NULL, 0);
    fh_forget(f->server.pid);
    f->server.pid = 0;
}

/* Whether agents run their jobs as nobody (the tests run as root). */
static inline bool fh_as_root(void)
{
    return geteuid() == 0;
}

/* Writes text to a file only its owner can read. */
static inline void fh_write_private(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail_msg("%s: cannot write: %s", path, strerror(errno));
    fchmod(fd, 0600);
    close(fd);
}

/* Creates the folder, the token file and starts the server (with the
 * options already in f->extra_server_args). */
static inline void fh_fleet_prepare(fh_fleet *f, const char *name, double lease_s)
{
    fh_install_cleanup();
    const char *extra[12];
    char host[sizeof f->listen_host];
    memcpy(extra, f->extra_server_args, sizeof extra);
    memcpy(host, f->listen_host, sizeof host);
    memset(f, 0, sizeof *f);
    memcpy(f->extra_server_args, extra, sizeof extra);
    memcpy(f->listen_host, host, sizeof host);
    /* Jobs run as nobody must be able to walk to their folders. */
    chmod(px_test_tmpdir(), 0755);
    snprintf(f->dir, sizeof f->dir, "%s/%s", px_test_tmpdir(), name);
    mkdir(f->dir, 0755);
    snprintf(f->data, sizeof f->data, "%s/data", f->dir);
    snprintf(f->tokens, sizeof f->tokens, "%s/tokens.txt", f->dir);
    snprintf(f->join, sizeof f->join, "%s/join-token", f->dir);
    snprintf(f->shared, sizeof f->shared, "%s/shared", f->dir);
    mkdir(f->shared, 01777);
    chmod(f->shared, 01777);
    fh_write_private(f->tokens, "# tokens for the test fleet\nagent " FH_CLUSTER_TOKEN
                                "\nuser " FH_USER_TOKEN " tester\nuser " FH_OTHER_TOKEN
                                " other\nuser " FH_ADMIN_TOKEN " boss admin\n");
    fh_write_private(f->join, FH_CLUSTER_TOKEN "\n");
    f->port = fh_free_port();
    f->lease_s = lease_s * FH_LEASE_SCALE;
    snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", f->port);
    unsetenv("PLEXUS_CA");
    snprintf(f->server.log, sizeof f->server.log, "%s/server.log", f->dir);
    snprintf(f->server.name, sizeof f->server.name, "server");
    setenv("PLEXUS_SERVER", f->url, 1);
    setenv("PLEXUS_TOKEN", FH_USER_TOKEN, 1);
}

/* With PX_TEST_STORE=postgres, the fleet's server keeps its state in a
 * fresh database of a PostgreSQL server the test process starts (once):
 * the same suites then run on both stores.  The URI is f->store ("" on
 * SQLite). */
static pg_harness fh_pg;
static int fh_pg_state; /* 0 not tried, 1 up, -1 unavailable */
static char fh_store_uri[8][256];
static int fh_n_store_uri;

static inline bool fh_on_postgres(void)
{
    const char *s = getenv("PX_TEST_STORE");
    return s && strcmp(s, "postgres") == 0;
}

static inline const char *fh_pg_database(void)
{
    if (fh_pg_state == 0) {
        fh_pg_state = pg_harness_start(&fh_pg) ? 1 : -1;
        if (fh_pg_state < 0)
            fprintf(stderr, "SKIP: PostgreSQL: %s\n", fh_pg.why);
    }
    if (fh_pg_state < 0 || fh_n_store_uri == 8)
        return NULL;
    char name[32];
    snprintf(name, sizeof name, "fleet_%d", fh_n_store_uri);
    char *uri = pg_harness_database(&fh_pg, name);
    if (!uri)
        fail_msg("cannot create the PostgreSQL database %s", name);
    snprintf(fh_store_uri[fh_n_store_uri], sizeof fh_store_uri[0], "%s", uri);
    free(uri);
    return fh_store_uri[fh_n_store_uri++];
}

/* Adds --store URI to the server's options when the suite runs on
 * PostgreSQL; false (the test should skip) when PostgreSQL cannot run. */
static inline bool fh_use_store(fh_fleet *f)
{
    if (!fh_on_postgres())
        return true;
    const char *uri = fh_pg_database();
    if (!uri)
        return false;
    int n = 0;
    while (n < 6 && f->extra_server_args[n])
        n++;
    f->extra_server_args[n] = "--store";
    f->extra_server_args[n + 1] = uri;
    f->extra_server_args[n + 2] = NULL;
    return true;
}

static inline void fh_fleet_start(fh_fleet *f, const char *name, double lease_s)
{
    fh_fleet_prepare(f, name, lease_s);
    if (!fh_use_store(f))
        skip();
    fh_start_server(f);
}

/* Writes an emulated one-node inventory.  devices_json is the "devices"
 * array's content; frameworks_json the "frameworks" array's. */
static inline char *fh_inventory(fh_fleet *f, const char *node, const char *devices_json,
                                 const char *frameworks_json)
{
    char *path = px_asprintf("%s/%s.json", f->dir, node);
    char *text = px_asprintf(
        "{\"schema\": \"plexus.inventory/1\", \"name\": \"%s\", \"emulated\": true,\n"
        " \"nodes\": [{\"id\": \"%s\",\n"
        "   \"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"64 GiB\","
        " \"bandwidth\": \"100 GB/s\"}],\n"
        "   \"frameworks\": [%s],\n"
        "   \"devices\": [%s]}]}\n",
        node, node, frameworks_json ? frameworks_json : "", devices_json ? devices_json : "");
    px_err err;
    px_assert_ok(px_write_file(path, text, strlen(text), &err), &err);
    free(text);
    return path;
}

/* Starts an agent for an inventory (NULL: a plain CPU node) at a server
 * URL (NULL: the fleet's own), with more options (NULL-ended, may be NULL). */
static inline pid_t fh_spawn_agent(fh_fleet *f, fh_proc *p, const char *name, const char *inventory,
                                   const char *url, const char *const *extra)
{
    char work[600], *inv = NULL;
    snprintf(work, sizeof work, "%s/work-%s", f->dir, name);
    if (!inventory)
        inventory = inv = fh_inventory(f, name, "", "");
    char *argv[40] = {(char *)px_test_plexus_bin(),
                      "agent",
                      "--server",
                      (char *)(url ? url : f->url),
                      "--join-token-file",
                      f->join,
                      "--inventory",
                      (char *)inventory,
                      "--name",
                      (char *)name,
                      "--work",
                      work,
                      "--health-interval",
                      "0.2",
                      NULL};
    int n = 14;
    if (f->ca[0]) {
        argv[n++] = "--ca";
        argv[n++] = f->ca;
    }
    if (fh_as_root()) {
        argv[n++] = "--job-user";
        argv[n++] = "nobody";
    }
    for (int i = 0; extra && extra[i] && n < 38; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    /* The agent keeps no token in its environment: the test's own is not
     * passed on. */
    const char *env[] = {"PLEXUS_LOG", "info", "PLEXUS_TOKEN", NULL, NULL};
    pid_t pid = fh_spawn(argv, p->log, env);
    free(inv);
    return pid;
}

/* Starts an agent for an inventory (NULL: a plain CPU node) at a server
 * URL (NULL: the fleet's own), with more options (NULL-ended, may be NULL).
 * Its work folder (and so its credential) is work-NAME in the fleet's. */
static inline int fh_start_agent_via(fh_fleet *f, const char *name, const char *inventory,
                                     const char *url, const char *const *extra)
{
    assert_true(f->n_agents < FH_MAX_PROCS);
    fh_proc *p = &f->agents[f->n_agents];
    px_strlcpy(p->name, name, sizeof p->name);
    char *log = px_asprintf("%s/agent-%s.log", f->dir, name);
    px_strlcpy(p->log, log ? log : "", sizeof p->log);
    free(log);
    p->pid = fh_spawn_agent(f, p, name, inventory, url, extra);
    return f->n_agents++;
}

/* Starts agent k again (after it was killed), with its work folder. */
static inline void fh_restart_agent(fh_fleet *f, int k, const char *inventory)
{
    f->agents[k].pid = fh_spawn_agent(f, &f->agents[k], f->agents[k].name, inventory, NULL, NULL);
}

static inline int fh_start_agent(fh_fleet *f, const char *name, const char *inventory)
{
    return fh_start_agent_via(f, name, inventory, NULL, NULL);
}

static inline json_t *fh_node(fh_fleet *f, const char *name)
{
    json_t *r = fh_api(f, "GET", "/v1/nodes", NULL);
    json_t *found = NULL;
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(r, "nodes"), i, n)
    {
        const char *id = json_string_value(json_object_get(n, "id"));
        if (id && !strcmp(id, name))
            found = json_incref(n);
    }
    json_decref(r);
    return found;
}

/* Waits until the named nodes are online. */
static inline void fh_wait_nodes_online(fh_fleet *f, const char *const *names, int n, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)FH_SECONDS(timeout_s) * 1000000000ull;
    for (;;) {
        int online = 0;
        for (int i = 0; i < n; i++) {
            json_t *node = fh_node(f, names[i]);
            const char *st = json_string_value(json_object_get(node, "state"));
            if (st && !strcmp(st, "online"))
                online++;
            json_decref(node);
        }
        if (online == n)
            return;
        if (px_now_ns() > deadline) {
            for (int i = 0; i < f->n_agents; i++)
                fh_print_log(f->agents[i].log);
            fail_msg("only %d of %d nodes came online within %d s", online, n, timeout_s);
        }
        fh_sleep_ms(100);
    }
}

/* Submits a spec (JSON text) and returns the job id (malloc'd). */
static inline char *fh_submit(fh_fleet *f, const char *spec_text)
{
    json_error_t je;
    json_t *spec = json_loads(spec_text, 0, &je);
    if (!spec)
        fail_msg("bad spec in the test: %s: %s", spec_text, je.text);
    json_t *r = fh_api(f, "POST", "/v1/jobs", spec);
    json_decref(spec);
    const char *id = json_string_value(json_object_get(r, "id"));
    assert_non_null(id);
    char *copy = px_strdup(id);
    json_decref(r);
    return copy;
}

static inline json_t *fh_job(fh_fleet *f, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return fh_api(f, "GET", path, NULL);
}

static inline bool fh_state_in(const char *state, const char *states)
{
    if (!state)
        return false;
    size_t n = strlen(state);
    for (const char *p = states; (p = strstr(p, state)); p += n)
        if ((p == states || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* Waits until the job is in one of the comma-separated states; returns
 * the job (new reference).  Fails the test on timeout. */
static inline json_t *fh_wait_job(fh_fleet *f, const char *id, const char *states, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)FH_SECONDS(timeout_s) * 1000000000ull;
    for (;;) {
        json_t *j = fh_job(f, id);
        const char *st = json_string_value(json_object_get(j, "state"));
        if (fh_state_in(st, states))
            return j;
        if (px_now_ns() > deadline) {
            char *text = px_json_dump_canonical(j);
            print_message("job: %s\n", text);
            free(text);
            fh_print_log(f->server.log);
            for (int i = 0; i < f->n_agents; i++)
                fh_print_log(f->agents[i].log);
            json_decref(j);
            fail_msg("job %s did not reach %s within %d s", id, states, timeout_s);
        }
        json_decref(j);
        fh_sleep_ms(50);
    }
}

/* The node of the job's member `rank`, or "" (static buffer). */
static inline const char *fh_member_node(const json_t *job, int rank)
{
    static char node[128];
    node[0] = '\0';
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(job, "members"), i,
                       m) if (json_integer_value(json_object_get(m, "rank")) == rank &&
                              json_object_get(m, "node"))
        snprintf(node, sizeof node, "%s", json_string_value(json_object_get(m, "node")));
    return node;
}

/* Runs `plexus ARGS...` (NULL-terminated) and returns its exit status;
 * out and err (may be NULL) get the output. */
static inline int fh_plexus(char **out, char **err, ...)
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)px_test_plexus_bin();
    va_list ap;
    va_start(ap, err);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 63)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return px_test_run(argv, 60, out, err);
}

/* The explanation's rejected entry for a node, or NULL (borrowed). */
static inline const json_t *fh_rejected(const json_t *explain, const char *node)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(explain, "rejected"), i, r)
    {
        const char *n = json_string_value(json_object_get(r, "node"));
        if (n && !strcmp(n, node))
            return r;
    }
    return NULL;
}

static inline void fh_fleet_stop(fh_fleet *f)
{
    for (int i = 0; i < f->n_agents; i++)
        if (f->agents[i].pid > 0) {
            kill(-f->agents[i].pid, SIGTERM);
        }
    for (int i = 0; i < f->n_agents; i++)
        if (f->agents[i].pid > 0) {
            for (int k = 0; k < 40; k++) {
                if (waitpid(f->agents[i].pid, NULL, WNOHANG) == f->agents[i].pid)
                    break;
                fh_sleep_ms(50);
            }
            kill(-f->agents[i].pid, SIGKILL);
            waitpid(f->agents[i].pid, NULL, WNOHANG);
            fh_forget(f->agents[i].pid);
            f->agents[i].pid = 0;
        }
    if (f->server.pid > 0) {
        kill(-f->server.pid, SIGTERM);
        for (int k = 0; k < 40; k++) {
            if (waitpid(f->server.pid, NULL, WNOHANG) == f->server.pid)
                break;
            fh_sleep_ms(50);
        }
        kill(-f->server.pid, SIGKILL);
        waitpid(f->server.pid, NULL, WNOHANG);
        fh_forget(f->server.pid);
        f->server.pid = 0;
    }
}

/* The logs of a job (every stream, as text), or NULL; owned. */
static inline char *fh_logs(fh_fleet *f, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0", id);
    json_t *r = fh_api(f, "GET", path, NULL);
    px_strbuf sb = PX_STRBUF_INIT;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(r, "chunks"), i, c)
        px_strbuf_adds(&sb, json_string_value(json_object_get(c, "data")));
    json_decref(r);
    return px_strbuf_detach(&sb, NULL);
}

/* Waits until the job's logs hold needle; returns them (owned). */
static inline char *fh_wait_logs(fh_fleet *f, const char *id, const char *needle, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)FH_SECONDS(timeout_s) * 1000000000ull;
    for (;;) {
        char *text = fh_logs(f, id);
        if (text && strstr(text, needle))
            return text;
        if (px_now_ns() > deadline) {
            print_message("logs of %s:\n%s\n", id, text ? text : "");
            fh_print_log(f->server.log);
            for (int i = 0; i < f->n_agents; i++)
                fh_print_log(f->agents[i].log);
            free(text);
            fail_msg("the logs of %s did not show \"%s\" within %d s", id, needle, timeout_s);
        }
        free(text);
        fh_sleep_ms(100);
    }
}

/* Whether process pid is gone (or a zombie nobody waits for). */
static inline bool fh_pid_gone(pid_t pid)
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

/* Waits until every pid is gone; fails naming the first that stays. */
static inline void fh_wait_pids_gone(const pid_t *pids, int n, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)FH_SECONDS(timeout_s) * 1000000000ull;
    for (int i = 0; i < n; i++)
        while (!fh_pid_gone(pids[i])) {
            if (px_now_ns() > deadline)
                fail_msg("process %d (%d of %d) still runs after %d s", (int)pids[i], i + 1, n,
                         timeout_s);
            fh_sleep_ms(50);
        }
}

/* Reads the "NAME=PID" lines a job printed, in order, into pids. */
static inline int fh_pids_in(const char *text, const char *name, pid_t *pids, int max)
{
    int n = 0;
    size_t len = strlen(name);
    for (const char *p = text; p && *p && n < max; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, len) && p[len] == '=')
            pids[n++] = (pid_t)strtol(p + len + 1, NULL, 10);
    return n;
}

/* ---- a TCP proxy between an agent and the server, to cut on purpose ---- */

typedef struct fh_proxy {
    int listen_fd;
    int port, target;
    atomic_int cut; /* nonzero: every connection closed, new ones refused */
    atomic_int stop;
    pthread_t thread;
} fh_proxy;

static inline void *fh_proxy_main(void *arg)
{
    fh_proxy *x = arg;
    struct pollfd fds[129];
    int peer[129]; /* fds[i]'s other end */
    int n = 1;
    fds[0] = (struct pollfd){.fd = x->listen_fd, .events = POLLIN};
    while (!atomic_load(&x->stop)) {
        if (atomic_load(&x->cut)) {
            for (int i = 1; i < n; i++)
                close(fds[i].fd);
            n = 1;
        }
        if (poll(fds, (nfds_t)n, 50) <= 0)
            continue;
        if (fds[0].revents & POLLIN) {
            int c = accept(x->listen_fd, NULL, NULL);
            if (c >= 0 && (atomic_load(&x->cut) || n + 2 > 129)) {
                close(c);
            } else if (c >= 0) {
                int s = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(x->target)};
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
                    close(c);
                    if (s >= 0)
                        close(s);
                } else {
                    fds[n] = (struct pollfd){.fd = c, .events = POLLIN};
                    peer[n++] = s;
                    fds[n] = (struct pollfd){.fd = s, .events = POLLIN};
                    peer[n++] = c;
                }
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[65536];
            ssize_t r = read(fds[i].fd, buf, sizeof buf);
            bool ok = r > 0;
            for (ssize_t off = 0; ok && off < r;) {
                ssize_t w = write(peer[i], buf + off, (size_t)(r - off));
                ok = w > 0;
                off += w > 0 ? w : 0;
            }
            if (!ok) {
                /* One side closed: close the pair and drop both slots. */
                int a = fds[i].fd, b = peer[i];
                close(a);
                close(b);
                int w = 1;
                for (int k = 1; k < n; k++)
                    if (fds[k].fd != a && fds[k].fd != b) {
                        fds[w] = fds[k];
                        peer[w++] = peer[k];
                    }
                n = w;
                break;
            }
        }
    }
    for (int i = 1; i < n; i++)
        close(fds[i].fd);
    return NULL;
}

/* Starts a proxy on a free port of 127.0.0.1 to the fleet's server. */
static inline void fh_proxy_start(fh_proxy *x, fh_fleet *f)
{
    memset(x, 0, sizeof *x);
    x->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int one = 1;
    setsockopt(x->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(x->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(x->listen_fd, 64) != 0 ||
        getsockname(x->listen_fd, (struct sockaddr *)&a, &len) != 0)
        fail_msg("proxy: %s", strerror(errno));
    x->port = ntohs(a.sin_port);
    x->target = f->port;
    if (pthread_create(&x->thread, NULL, fh_proxy_main, x) != 0)
        fail_msg("proxy: cannot start its thread");
}

static inline void fh_proxy_stop(fh_proxy *x)
{
    atomic_store(&x->stop, 1);
    pthread_join(x->thread, NULL);
    close(x->listen_fd);
}

/* Device JSON snippets for inventories. */
#define FH_H100(id)                                                                          \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"H100\", " \
    "\"catalog\": \"nvidia-h100-sxm5\", \"capability\": \"9.0\"}"
#define FH_L4(id)                                                                          \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"L4\", " \
    "\"catalog\": \"nvidia-l4\", \"capability\": \"8.9\"}"
#define FH_MI300X(id)                                                                       \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"amd\", \"model\": \"MI300X\", " \
    "\"catalog\": \"amd-mi300x\", \"capability\": \"gfx942\"}"

#endif
