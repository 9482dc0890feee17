/*
 * Submit-to-start latency of the fleet on loopback: a server in this
 * process and four `plexus agent` processes (emulated CPU nodes), jobs
 * submitted one at a time over HTTP; a job has started when its process
 * writes to a FIFO the benchmark reads.  So the figure holds the HTTP submission, the commit to
 * SQLite (synchronous=FULL), the scheduling pass, the agent's long poll,
 * the fork and exec of the job and its shell.  Bounded in count (JOBS) and
 * time (60 s); talks to 127.0.0.1 only.
 *
 *     bench_fleet_latency [JOBS]        (default 200)
 */
#include "base/common.h"

#include "plexus/fleet.h"

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

/* An agent process: `plexus agent` beside this benchmark's binary. */
static pid_t start_agent(const char *plexus, const char *url, const char *token,
                         const char *inventory, const char *name, const char *work, const char *log)
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
        execl(plexus, plexus, "agent", "--server", url, "--token", token, "--inventory", inventory,
              "--name", name, "--work", work, (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pid);
    return pid;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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

int main(int argc, char **argv)
{
    long jobs = argc > 1 ? strtol(argv[1], NULL, 10) : 200;
    if (jobs < 1 || jobs > 100000) {
        fprintf(stderr, "usage: bench_fleet_latency [JOBS 1..100000]\n");
        return 2;
    }
    px_log_set_level(PX_LOG_ERROR);
    char dir[] = "/tmp/plexus-bench-latency-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char data[600], fifo[600];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(fifo, sizeof fifo, "%s/started", dir);
    if (mkfifo(fifo, 0600) != 0) {
        perror("mkfifo");
        return 1;
    }
    /* Keep a writer open so the reader never sees end of file. */
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    int keep = open(fifo, O_WRONLY);
    const char *ctok = "bench-cluster-token-0123456789", *utok = "bench-user-token-0123456789";
    px_fleet_server_options opt = {.listen = "127.0.0.1:0",
                                   .data_dir = data,
                                   .cluster_token = ctok,
                                   .api_token = utok,
                                   .lease_s = 10};
    px_fleet_server *srv;
    px_err err;
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_latency: %s\n", err.msg);
        return 1;
    }
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
        px_fleet_server_stop(srv);
        return 1;
    }
    pid_t agents[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        char name[32], inventory[640], work[640], log[640];
        snprintf(name, sizeof name, "bench-%d", i);
        snprintf(inventory, sizeof inventory, "%s/bench-%d.json", dir, i);
        snprintf(work, sizeof work, "%s/work-%d", dir, i);
        snprintf(log, sizeof log, "%s/agent-%d.log", dir, i);
        char *inv = px_asprintf(
            "{\"schema\": \"plexus.inventory/1\", \"emulated\": true, \"nodes\": [{\"id\": \"%s\", "
            "\"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"64 GiB\"}], "
            "\"devices\": []}]}",
            name);
        px_write_file(inventory, inv, strlen(inv), NULL);
        free(inv);
        agents[i] = start_agent(plexus, px_fleet_server_url(srv), ctok, inventory, name, work, log);
    }
    px_fleet_client *c;
    px_fleet_client_new(px_fleet_server_url(srv), utok, &c, NULL);
    int rc = 0;
    if (wait_nodes(c, N_AGENTS) != 0) {
        fprintf(stderr, "bench_fleet_latency: the agents did not come online\n");
        rc = 1;
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
            rc = 1;
            break;
        }
        json_decref(r);
        ack[n] = (double)(px_now_ns() - t0) / 1e6;
        struct pollfd pfd = {rfd, POLLIN, 0};
        if (poll(&pfd, 1, 10000) != 1) {
            fprintf(stderr, "bench_fleet_latency: job %ld did not start within 10 s\n", i);
            rc = 1;
            break;
        }
        lat[n++] = (double)(px_now_ns() - t0) / 1e6;
        char buf[256];
        while (read(rfd, buf, sizeof buf) > 0)
            ;
    }
    json_decref(spec);
    if (n > 0) {
        qsort(lat, n, sizeof *lat, cmp_double);
        qsort(ack, n, sizeof *ack, cmp_double);
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += lat[i];
        printf("fleet submit-to-start latency, %d agents on loopback, %zu jobs one at a time\n",
               N_AGENTS, n);
        printf("  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  mean %.2f ms  (aim: p50 < 50 "
               "ms)\n",
               pct(lat, n, 0.5), pct(lat, n, 0.9), pct(lat, n, 0.99), lat[n - 1], sum / (double)n);
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
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
