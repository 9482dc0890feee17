/*
 * The fleet on PostgreSQL with three server replicas (a PostgreSQL server
 * started for the run by tests/support/pg_harness.h: initdb, a Unix
 * socket, fsync on; skipped with a message where PostgreSQL is not
 * installed):
 *   1. placement decisions per second at 10,000 nodes: jobs another
 *      replica accepted are claimed (FOR UPDATE SKIP LOCKED), placed, and
 *      each assignment committed before the next decision is acted on;
 *      also how long the scheduling replica takes to read 10,000 nodes
 *      when it takes the lease;
 *   2. submit-to-start latency through the replicas' URLs (four `plexus
 *      agent` processes given all three; a job has started when it writes
 *      to a FIFO);
 *   3. scheduler failover after kill -9 of the replica holding the lease:
 *      time until another replica answers /v1/health with 200.
 * Bounded in count and time; talks to 127.0.0.1 and a Unix socket only.
 *
 *     bench_fleet_replicas [JOBS]        (default 2000 decisions)
 */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/fleet.h"

#include "bench_util.h"

#include "../tests/support/pg_harness.h"

#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <time.h>

#define N_REPLICAS 3
#define N_NODES    10000
#define N_AGENTS   4
#define LAT_JOBS   100
#define ROUNDS     3

static pg_harness pg;
static char plexus[600];

static bool exec_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "bench_fleet_replicas: %s", PQresultErrorMessage(r));
    PQclear(r);
    return ok;
}

/* Three servers in this process on one database; returns the index of the
 * one that took the lease (-1 on failure). */
static int start_replicas(const char *uri, const char *dir, px_fleet_server **srv)
{
    for (int i = 0; i < N_REPLICAS; i++) {
        char data[700];
        snprintf(data, sizeof data, "%s/data-%d", dir, i);
        px_fleet_server_options opt = {.listen = "127.0.0.1:0",
                                       .data_dir = data,
                                       .store = uri,
                                       .cluster_token = "bench-cluster-token-0123456789",
                                       .api_token = "bench-user-token-0123456789",
                                       .lease_s = 3600};
        px_err err;
        if (px_fleet_server_start(&opt, &srv[i], &err) != PX_OK) {
            fprintf(stderr, "bench_fleet_replicas: %s\n", err.msg);
            return -1;
        }
    }
    for (int t = 0; t < 2400; t++) {
        for (int i = 0; i < N_REPLICAS; i++)
            if (px_fleet_server_serving(srv[i]))
                return i;
        bench_sleep_ms(25);
    }
    return -1;
}

static void stop_replicas(px_fleet_server **srv)
{
    for (int i = 0; i < N_REPLICAS; i++)
        px_fleet_server_stop(srv[i]);
}

/* 1: decisions per second at 10,000 nodes. */
static int bench_decisions(long jobs)
{
    char dir[] = "/tmp/plexus-bench-replicas-XXXXXX";
    char *uri = pg_harness_database(&pg, "decisions");
    if (!mkdtemp(dir) || !uri)
        return 1;
    px__store st;
    px_err err;
    if (px__store_pg_open(uri, &st, &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_replicas: %s\n", err.msg);
        return 1;
    }
    st.ops->close(st.self);
    PGconn *c = PQconnectdb(uri);
    /* 10,000 registered nodes (64 CPUs, 256 GiB each), as agents leave them. */
    bool ok = exec_ok(c, "BEGIN");
    for (int i = 0; ok && i < N_NODES; i++) {
        char name[32], reg[256], at[32];
        snprintf(name, sizeof name, "node-%05d", i);
        snprintf(reg, sizeof reg, "{\"name\": \"%s\", \"cpus\": 64, \"memory\": \"256 GiB\"}",
                 name);
        snprintf(at, sizeof at, "%lld", (long long)px_wall_time());
        const char *v[] = {name, reg, at};
        PGresult *r = PQexecParams(c,
                                   "INSERT INTO nodes(name, registration, state, last_seen)"
                                   " VALUES($1, $2, 'online', $3)",
                                   3, NULL, v, NULL, NULL, 0);
        ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    ok = ok && exec_ok(c, "COMMIT");
    px_fleet_server *srv[N_REPLICAS] = {0};
    uint64_t t_take = px_now_ns();
    int active = ok ? start_replicas(uri, dir, srv) : -1;
    double take_s = (double)(px_now_ns() - t_take) / 1e9;
    if (active < 0) {
        fprintf(stderr, "bench_fleet_replicas: no replica took the lease\n");
        stop_replicas(srv);
        PQfinish(c);
        return 1;
    }
    /* The jobs, accepted by another replica: queued, not yet adopted, and
     * the scheduling replica notified as a replica's insert does. */
    char sql[1024];
    snprintf(sql, sizeof sql,
             "WITH j AS (INSERT INTO jobs(seq, id, name, state, attempt, restarts, spec, members,"
             " created, updated, adopted) SELECT s, 'b-' || s, 'bench', 'queued', 1, 0,"
             " CASE WHEN s %% 2 = 0 THEN '{\"command\": [\"true\"], \"resources\": {\"cpus\": 1}}'"
             " ELSE '{\"command\": [\"etl\"], \"resources\": {\"cpus\": 2, \"memory\": \"4 GiB\"}}'"
             " END, '[]', %lld, %lld, false FROM (SELECT nextval('jobs_seq') AS s FROM"
             " generate_series(1, %ld)) q RETURNING id)"
             " SELECT pg_notify('plexus_jobs', 'bench') FROM j LIMIT 1",
             (long long)px_wall_time(), (long long)px_wall_time(), jobs);
    pthread_mutex_lock(&srv[active]->lock);
    uint64_t d0 = srv[active]->metrics.decisions;
    pthread_mutex_unlock(&srv[active]->lock);
    uint64_t t0 = px_now_ns();
    ok = exec_ok(c, sql);
    uint64_t done = 0;
    bool committing = false;
    /* Until every decision is made and its pass's commit has landed (a
     * pass that commits with the server lock released has decisions
     * counted before its commit). */
    while (ok && (done < (uint64_t)jobs || committing) && px_now_ns() - t0 < 60000000000ull) {
        bench_sleep_ms(5);
        pthread_mutex_lock(&srv[active]->lock);
        done = srv[active]->metrics.decisions - d0;
        committing = srv[active]->n_deferred > 0;
        pthread_mutex_unlock(&srv[active]->lock);
    }
    double secs = (double)(px_now_ns() - t0) / 1e9;
    pthread_mutex_lock(&srv[active]->lock);
    uint64_t placed = srv[active]->metrics.placements;
    pthread_mutex_unlock(&srv[active]->lock);
    printf("placement at %d nodes, %d replicas on PostgreSQL, %ld jobs accepted elsewhere:\n",
           N_NODES, N_REPLICAS, jobs);
    printf("  decisions/s %.0f  (%llu decisions, %llu placed, %.2f s; each claimed FOR UPDATE SKIP"
           " LOCKED and its assignment committed)\n",
           (double)done / secs, (unsigned long long)done, (unsigned long long)placed, secs);
    printf("  the scheduling replica read %d nodes and took the lease in %.2f s\n", N_NODES,
           take_s);
    printf("  anchors: SQLite, one server 11,202/s; Ray 8,040/s; Nomad 1,500-3,750/s;"
           " kube-scheduler 680-1,100/s; Slurm ~500/s\n");
    stop_replicas(srv);
    PQfinish(c);
    bench_rm_tree(dir);
    free(uri);
    return done == (uint64_t)jobs ? 0 : 1;
}

static pid_t spawn(const char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        unsetenv("PLEXUS_TOKEN");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pid);
    return pid;
}

static void stop_pid(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(-pid, SIGTERM);
    for (int w = 0; waitpid(pid, NULL, WNOHANG) == 0 && w < 100; w++)
        bench_sleep_ms(20);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, WNOHANG);
}

/* 2: submit-to-start through the replicas. */
static int bench_latency(void)
{
    char dir[] = "/tmp/plexus-bench-replicas-XXXXXX";
    char *uri = pg_harness_database(&pg, "latency");
    if (!mkdtemp(dir) || !uri)
        return 1;
    chmod(dir, 0755);
    px_fleet_server *srv[N_REPLICAS] = {0};
    if (start_replicas(uri, dir, srv) < 0) {
        stop_replicas(srv);
        return 1;
    }
    char urls[400] = "", fifo[600], join[600];
    for (int i = 0; i < N_REPLICAS; i++)
        snprintf(urls + strlen(urls), sizeof urls - strlen(urls), "%s%s", i ? "," : "",
                 px_fleet_server_url(srv[i]));
    snprintf(fifo, sizeof fifo, "%s/started", dir);
    snprintf(join, sizeof join, "%s/join", dir);
    mkfifo(fifo, 0666);
    chmod(fifo, 0666);
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    int keep = open(fifo, O_WRONLY);
    if (px_write_file(join, "bench-cluster-token-0123456789", 30, NULL) != PX_OK)
        return 1;
    chmod(join, 0600);
    pid_t agents[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        char name[32], inventory[640], work[640], log[640];
        snprintf(name, sizeof name, "bench-%d", i);
        snprintf(inventory, sizeof inventory, "%s/bench-%d.json", dir, i);
        snprintf(work, sizeof work, "%s/work-%d", dir, i);
        snprintf(log, sizeof log, "%s/agent-%d.log", dir, i);
        if (bench_write_cpu_node(inventory, name) != PX_OK)
            return 1;
        agents[i] = bench_start_agent(plexus, urls, join, NULL, inventory, name, work, log);
    }
    px_fleet_client *c;
    if (px_fleet_client_new(urls, "bench-user-token-0123456789", &c, NULL) != PX_OK)
        return 1;
    int online = 0;
    for (int t = 0; t < 600 && online < N_AGENTS; t++) {
        json_t *r = NULL;
        online = 0;
        if (px_fleet_client_call(c, "GET", "/v1/nodes", NULL, NULL, &r, NULL) == PX_OK) {
            size_t k;
            json_t *n;
            json_array_foreach(json_object_get(r, "nodes"), k, n)
            {
                const char *state = json_string_value(json_object_get(n, "state"));
                online += state && !strcmp(state, "online");
            }
        }
        json_decref(r);
        bench_sleep_ms(50);
    }
    double lat[LAT_JOBS];
    size_t n = 0;
    if (online >= N_AGENTS) {
        char *line = px_asprintf("echo started >> %s", fifo);
        json_t *spec = json_pack("{s:[s, s, s], s:{s:f}}", "command", "/bin/sh", "-c", line,
                                 "resources", "cpus", 0.5);
        free(line);
        for (int i = 0; i < LAT_JOBS; i++) {
            uint64_t t0 = px_now_ns();
            json_t *r = NULL;
            px_err err;
            if (px_fleet_client_call(c, "POST", "/v1/jobs", spec, NULL, &r, &err) != PX_OK) {
                fprintf(stderr, "bench_fleet_replicas: submit: %s\n", err.msg);
                break;
            }
            json_decref(r);
            struct pollfd pfd = {rfd, POLLIN, 0};
            if (poll(&pfd, 1, 10000) != 1)
                break;
            lat[n++] = (double)(px_now_ns() - t0) / 1e6;
            char buf[256];
            while (read(rfd, buf, sizeof buf) > 0) {
            }
        }
        json_decref(spec);
    }
    if (n > 0) {
        qsort(lat, n, sizeof *lat, bench_cmp_double);
        printf("submit-to-start, %d replicas on PostgreSQL, %d agents given all URLs, %zu jobs one"
               " at a time:\n  p50 %.2f ms  p90 %.2f ms  max %.2f ms  (SQLite, one server: p50"
               " 22 ms)\n",
               N_REPLICAS, N_AGENTS, n, lat[n / 2], lat[n * 9 / 10], lat[n - 1]);
        /* Where the time goes, from the scheduling replica's own figures:
         * in its queue until the assignment is written (the server), then
         * until the start is reported (the agent: the long poll's answer,
         * fork and exec, the report); the rest is the submission's round
         * trip and the job's shell writing to the FIFO. */
        for (int i = 0; i < N_REPLICAS; i++) {
            if (!atomic_load(&srv[i]->active))
                continue;
            pthread_mutex_lock(&srv[i]->lock);
            px__metrics m = srv[i]->metrics;
            pthread_mutex_unlock(&srv[i]->lock);
            printf(
                "  of which: in the queue until the assignment is written %.2f ms (mean of %llu),"
                " then until the agent reports the start %.2f ms (mean of %llu)\n",
                m.queue_count ? m.queue_sum / (double)m.queue_count * 1e3 : 0.0,
                (unsigned long long)m.queue_count,
                m.dispatch_count ? m.dispatch_sum / (double)m.dispatch_count * 1e3 : 0.0,
                (unsigned long long)m.dispatch_count);
        }
    } else
        fprintf(stderr, "bench_fleet_replicas: no job started (agents online: %d)\n", online);
    px_fleet_client_free(c);
    for (int i = 0; i < N_AGENTS; i++)
        stop_pid(agents[i]);
    stop_replicas(srv);
    close(rfd);
    close(keep);
    bench_rm_tree(dir);
    free(uri);
    return n == LAT_JOBS ? 0 : 1;
}

static long health(const char *url)
{
    px_fleet_client *c;
    if (px_fleet_client_new(url, NULL, &c, NULL) != PX_OK)
        return 0;
    px_fleet_client_set_timeout(c, 1000);
    long code = 0;
    json_t *r = NULL;
    if (px_fleet_client_call(c, "GET", "/v1/health", NULL, &code, &r, NULL) != PX_OK)
        code = 0;
    json_decref(r);
    px_fleet_client_free(c);
    return code;
}

/* 3: failover after kill -9 of the scheduling replica (processes). */
static int bench_failover(void)
{
    char dir[] = "/tmp/plexus-bench-replicas-XXXXXX";
    char *uri = pg_harness_database(&pg, "failover");
    if (!mkdtemp(dir) || !uri)
        return 1;
    char tokens[600];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    const char *t = "agent bench-cluster-token-0123456789\nuser bench-user-token-0123456789\n";
    if (px_write_file(tokens, t, strlen(t), NULL) != PX_OK)
        return 1;
    chmod(tokens, 0600);
    pid_t pids[N_REPLICAS] = {0};
    char url[N_REPLICAS][64];
    for (int i = 0; i < N_REPLICAS; i++) {
        char listen[64], data[700], log[700];
        int port = 20500 + (int)(getpid() % 1000) * 3 + i;
        snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
        snprintf(url[i], sizeof url[i], "http://127.0.0.1:%d", port);
        snprintf(data, sizeof data, "%s/data-%d", dir, i);
        snprintf(log, sizeof log, "%s/server-%d.log", dir, i);
        const char *argv[] = {plexus,    "server", "--listen",     listen, "--data", data,
                              "--store", uri,      "--token-file", tokens, NULL};
        pids[i] = spawn(argv, log);
    }
    double took[ROUNDS];
    int rounds = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int active = -1;
        for (int w = 0; w < 1200 && active < 0; w++) {
            for (int i = 0; i < N_REPLICAS && active < 0; i++)
                if (pids[i] > 0 && health(url[i]) == 200)
                    active = i;
            if (active < 0)
                bench_sleep_ms(25);
        }
        if (active < 0)
            break;
        uint64_t t0 = px_now_ns();
        kill(-pids[active], SIGKILL);
        waitpid(pids[active], NULL, 0);
        pids[active] = 0;
        int next = -1;
        while (next < 0 && px_now_ns() - t0 < 30000000000ull) {
            for (int i = 0; i < N_REPLICAS && next < 0; i++)
                if (pids[i] > 0 && health(url[i]) == 200)
                    next = i;
            if (next < 0)
                bench_sleep_ms(10);
        }
        if (next < 0)
            break;
        took[rounds++] = (double)(px_now_ns() - t0) / 1e9;
        /* The killed replica comes back, as a standby. */
        char listen[64], data[700], log[700];
        snprintf(listen, sizeof listen, "%s", url[active] + 7);
        snprintf(data, sizeof data, "%s/data-%d", dir, active);
        snprintf(log, sizeof log, "%s/server-%d.log", dir, active);
        const char *argv[] = {plexus,    "server", "--listen",     listen, "--data", data,
                              "--store", uri,      "--token-file", tokens, NULL};
        pids[active] = spawn(argv, log);
    }
    if (rounds > 0) {
        qsort(took, (size_t)rounds, sizeof *took, bench_cmp_double);
        printf("scheduler failover after kill -9 of the lease holder, %d replicas, %d rounds:\n"
               "  median %.2f s  max %.2f s  (goal < 5 s)\n",
               N_REPLICAS, rounds, took[rounds / 2], took[rounds - 1]);
    }
    for (int i = 0; i < N_REPLICAS; i++)
        stop_pid(pids[i]);
    bench_rm_tree(dir);
    free(uri);
    return rounds == ROUNDS ? 0 : 1;
}

int main(int argc, char **argv)
{
    long jobs = argc > 1 ? strtol(argv[1], NULL, 10) : 2000;
    if (jobs < 1 || jobs > 1000000) {
        fprintf(stderr, "usage: bench_fleet_replicas [JOBS 1..1000000]\n");
        return 2;
    }
    px_log_set_level(PX_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    char self[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(plexus, sizeof plexus, "%s/plexus", self);
    if (access(plexus, X_OK) != 0) {
        fprintf(stderr, "bench_fleet_replicas: %s is missing; build the plexus target\n", plexus);
        return 1;
    }
    if (!pg_harness_start(&pg)) {
        printf("bench_fleet_replicas: skipped: %s\n", pg.why);
        return 0;
    }
    atexit(pg_harness_at_exit);
    int rc = bench_decisions(jobs);
    rc |= bench_latency();
    rc |= bench_failover();
    pg_harness_stop(&pg);
    return rc;
}
