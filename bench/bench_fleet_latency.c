/*
 * Submit-to-start latency of the fleet on loopback: a server in this
 * process and four `plexus agent` processes (emulated CPU nodes), jobs
 * submitted one at a time over HTTP; a job has started when its process
 * writes to a FIFO the benchmark reads.  So the figure holds the HTTP submission, the commit to
 * SQLite (synchronous=FULL), the scheduling pass, the agent's long poll,
 * the fork and exec of the job and its shell.  Measured twice: over plain
 * HTTP and over TLS (a local CA made for the run; every client and agent
 * pins it).  Bounded in count (JOBS) and time (60 s each); talks to
 * 127.0.0.1 only.
 *
 *     bench_fleet_latency [JOBS]        (default 200)
 */
#include "base/common.h"

#include "plexus/fleet.h"

#include "bench_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_AGENTS 4
#define LIMIT_S  60

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static double pct(const double *sorted, size_t n, double p)
{
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return sorted[i < n ? i : n - 1];
}

static int wait_nodes(px_fleet_client *c, int want)
{
    for (int i = 0; i < 300; i++) {
        json_t *r = NULL;
        if (px_fleet_client_call(c, "GET", "/v1/nodes", NULL, NULL, &r, NULL) == PX_OK) {
            int online = 0;
            size_t k;
            json_t *n;
            json_array_foreach(json_object_get(r, "nodes"), k, n) online +=
                !strcmp(json_string_value(json_object_get(n, "state"))
                            ? json_string_value(json_object_get(n, "state"))
                            : "",
                        "online");
            json_decref(r);
            if (online >= want)
                return 0;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* One run: a server (TLS or not), four agents, jobs one at a time.
 * Prints the figures; returns the p50 in ms (negative on failure). */
static double run(const char *plexus, long jobs, bool tls)
{
    char dir[] = "/tmp/plexus-bench-latency-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    /* Jobs of a root agent run as nobody: they must reach their folders
     * and the FIFO. */
    chmod(dir, 0755);
    char data[600], fifo[600], join[600], tls_dir[600], cert[700], key[700], ca[700];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(fifo, sizeof fifo, "%s/started", dir);
    snprintf(join, sizeof join, "%s/join", dir);
    snprintf(tls_dir, sizeof tls_dir, "%s/tls", dir);
    snprintf(cert, sizeof cert, "%s/server.pem", tls_dir);
    snprintf(key, sizeof key, "%s/server-key.pem", tls_dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", tls_dir);
    double p50 = -1;
    if (mkfifo(fifo, 0666) != 0 || chmod(fifo, 0666) != 0) {
        perror("mkfifo");
        return -1;
    }
    /* Keep a writer open so the reader never sees end of file. */
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    int keep = open(fifo, O_WRONLY);
    const char *ctok = "bench-cluster-token-0123456789", *utok = "bench-user-token-0123456789";
    int jfd = open(join, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (jfd < 0 || write(jfd, ctok, strlen(ctok)) < 0) {
        perror(join);
        return -1;
    }
    close(jfd);
    px_err err;
    if (tls && px_fleet_tls_make_local(tls_dir, "127.0.0.1", &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_latency: %s\n", err.msg);
        return -1;
    }
    px_fleet_server_options opt = {.listen = "127.0.0.1:0",
                                   .data_dir = data,
                                   .cluster_token = ctok,
                                   .api_token = utok,
                                   .lease_s = 10,
                                   .tls_cert = tls ? cert : NULL,
                                   .tls_key = tls ? key : NULL};
    px_fleet_server *srv;
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_latency: %s\n", err.msg);
        return -1;
    }
    pid_t agents[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        char name[32], inventory[640], work[640], log[640];
        snprintf(name, sizeof name, "bench-%d", i);
        snprintf(inventory, sizeof inventory, "%s/bench-%d.json", dir, i);
        snprintf(work, sizeof work, "%s/work-%d", dir, i);
        snprintf(log, sizeof log, "%s/agent-%d.log", dir, i);
        must(bench_write_cpu_node(inventory, name), inventory);
        agents[i] = bench_start_agent(plexus, px_fleet_server_url(srv), join, tls ? ca : NULL,
                                      inventory, name, work, log);
    }
    px_fleet_client *c;
    must(px_fleet_client_new(px_fleet_server_url(srv), utok, &c, NULL), "client");
    if (tls)
        must(px_fleet_client_set_ca(c, ca, NULL), ca);
    if (wait_nodes(c, N_AGENTS) != 0) {
        fprintf(stderr, "bench_fleet_latency: the agents did not come online\n");
        goto done;
    }
    char *line = px_asprintf("echo started >> %s", fifo);
    json_t *spec = json_pack("{s:[s, s, s], s:{s:f}}", "command", "/bin/sh", "-c", line,
                             "resources", "cpus", 0.5);
    free(line);
    double *lat = calloc((size_t)jobs, sizeof *lat);
    double *ack = calloc((size_t)jobs, sizeof *ack);
    size_t n = 0;
    uint64_t t_begin = px_now_ns();
    for (long i = 0; i < jobs; i++) {
        if (px_now_ns() - t_begin > (uint64_t)LIMIT_S * 1000000000ull) {
            fprintf(stderr, "bench_fleet_latency: stopped after %ld jobs (time limit)\n", i);
            break;
        }
        uint64_t t0 = px_now_ns();
        json_t *r = NULL;
        if (px_fleet_client_call(c, "POST", "/v1/jobs", spec, NULL, &r, &err) != PX_OK) {
            fprintf(stderr, "bench_fleet_latency: submit: %s\n", err.msg);
            break;
        }
        json_decref(r);
        ack[n] = (double)(px_now_ns() - t0) / 1e6;
        struct pollfd pfd = {rfd, POLLIN, 0};
        if (poll(&pfd, 1, 10000) != 1) {
            fprintf(stderr, "bench_fleet_latency: job %ld did not start within 10 s\n", i);
            break;
        }
        lat[n++] = (double)(px_now_ns() - t0) / 1e6;
        char buf[256];
        while (read(rfd, buf, sizeof buf) > 0)
            ;
    }
    json_decref(spec);
    if (n > 0) {
        qsort(lat, n, sizeof *lat, bench_cmp_double);
        qsort(ack, n, sizeof *ack, bench_cmp_double);
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += lat[i];
        p50 = pct(lat, n, 0.5);
        printf("fleet submit-to-start latency%s, %d agents on loopback, %zu jobs one at a time\n",
               tls ? " over TLS (pinned local CA)" : " over plain HTTP", N_AGENTS, n);
        printf("  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  mean %.2f ms  (aim: p50 < 50 "
               "ms)\n",
               p50, pct(lat, n, 0.9), pct(lat, n, 0.99), lat[n - 1], sum / (double)n);
        printf("  of which the acknowledged (committed) submission: p50 %.2f ms  p99 %.2f ms\n",
               pct(ack, n, 0.5), pct(ack, n, 0.99));
    }
    free(lat);
    free(ack);
done:
    px_fleet_client_free(c);
    for (int i = 0; i < N_AGENTS; i++)
        if (agents[i] > 0)
            kill(-agents[i], SIGTERM);
    for (int i = 0; i < N_AGENTS; i++)
        if (agents[i] > 0) {
            int waited = 0;
            while (waitpid(agents[i], NULL, WNOHANG) == 0 && waited++ < 100)
                usleep(20000);
            kill(-agents[i], SIGKILL);
            waitpid(agents[i], NULL, WNOHANG);
        }
    px_fleet_server_stop(srv);
    close(rfd);
    close(keep);
    bench_rm_tree(dir);
    return p50;
}

int main(int argc, char **argv)
{
    long jobs = argc > 1 ? strtol(argv[1], NULL, 10) : 200;
    if (jobs < 1 || jobs > 100000) {
        fprintf(stderr, "usage: bench_fleet_latency [JOBS 1..100000]\n");
        return 2;
    }
    px_log_set_level(PX_LOG_ERROR);
    /* The plexus command lives beside this benchmark in the build folder. */
    char self[512], plexus[600];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(plexus, sizeof plexus, "%s/plexus", self);
    if (access(plexus, X_OK) != 0) {
        fprintf(stderr, "bench_fleet_latency: %s is missing; build the plexus target\n", plexus);
        return 1;
    }
    double plain = run(plexus, jobs, false);
    double tls = run(plexus, jobs, true);
    if (plain > 0 && tls > 0)
        printf("  TLS costs %.2f ms at the median (%.2fx)\n", tls - plain, tls / plain);
    return plain > 0 && tls > 0 ? 0 : 1;
}
