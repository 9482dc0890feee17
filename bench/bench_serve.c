/*
 * Serving throughput and latency of `plexus serve`, against llama.cpp's
 * server on the same model and machine class.
 *
 * 1. Writes the 136 M-parameter synthetic llama of ANCHORS.md (dim 1024,
 *    hidden 2816, 12 layers, 16 heads, 4 kv heads, vocab 512, context 512,
 *    seed 1) at q8_0 with `plexus model synth`.
 * 2. Starts `plexus serve --threads 2` on it and drives it with 1, 4, 8 and
 *    16 concurrent clients, each sending streamed completions of 64 new
 *    tokens one after the other (libcurl, server-sent events, usage
 *    counted).  Prints tokens/s, time to first token and time per output
 *    token (p50, p99) per concurrency, and the ratio to llama-server's
 *    figures measured on this machine class (`llama-server -t 2 -np 16`,
 *    non-streamed, 64 tokens): 128, 139, 235 and 259 tokens/s.  Those were
 *    measured on another day: the ratio is indicative, the figures are the
 *    result.
 * 3. Plans stories260K for throughput on emu-small (this cpu and two
 *    emulated accelerators), serves the plan through its stage workers,
 *    loads it with as many clients as the plan batches, and prints the
 *    observed tokens/s against the plan's predicted interval; then the
 *    same with the inventory calibrated on this machine (`plexus
 *    calibrate`, `plexus plan --mode calibrated`), and three times more with
 *    that overlay taught what the last serving run measured of its stages
 *    (`plexus serve --run-report`, `plexus calibrate --from-run`): the
 *    devices sharing the host's cores.  Plans run one device per stage
 *    (`--max-tp 1`), as the stage workers do.  The plan predicts the
 *    steady state, so the clients send one request after another and the
 *    figures come from a window that opens once every sequence in flight
 *    has its first tokens (the ramp and the drain are left out); per
 *    replica it prints the rows its steps carried against the rows of the
 *    micro-batch it priced.  For each it also
 *    prints what shared the host's cores while it was measured (CPU
 *    seconds of the clients, the server and the stage workers, and the
 *    time their threads waited for a core), the rows per engine step, and
 *    the incidents the healing loop opened (an adaptation changes the plan
 *    being measured).  Per replica it splits a step into its parts (each
 *    stage's compute, each hop, the executor's work and its wait for
 *    results, each with the time it waited for a core, from the server's
 *    /metrics) beside what the plan predicts of each, and a micro-batch's
 *    trip round the ring with and without those waits.
 *
 * About three minutes on a two-core machine.  PX_BENCH_DIR holds the model
 * (default: a fresh folder under TMPDIR, removed afterwards).
 */
#include <curl/curl.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plexus/base.h"

#define N_NEW      64
#define MAX_REQS   16
#define MAX_CLIENT 512

static const char *plexus_bin;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs a command to completion; returns its exit status. */
static int run(const char *const *argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct server {
    pid_t pid;
    char url[128];
} server;

static bool start_server(server *s, const char *const *args)
{
    const char *argv[40];
    size_t n = 0;
    argv[n++] = plexus_bin;
    argv[n++] = "serve";
    for (size_t i = 0; args[i] && n < 36; i++)
        argv[n++] = args[i];
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n] = NULL;
    int out[2];
    if (pipe(out) != 0)
        return false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(out[1], 1);
        close(out[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    s->pid = pid;
    char buf[1024] = {0};
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        if (poll(&p, 1, 120000) <= 0)
            break;
        ssize_t r = read(out[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        char *at = strstr(buf, "listening on "), *nl = at ? strchr(at, '\n') : NULL;
        if (nl) {
            *nl = 0;
            snprintf(s->url, sizeof s->url, "http://%s/v1/completions", at + 13);
            break;
        }
    }
    close(out[0]);
    return s->url[0] != 0;
}

static void stop_server(server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 250; i++) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return;
        }
        usleep(20000);
    }
    kill(-s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* One streamed request's timings. */
typedef struct req_result {
    double ttft, tpot;
    long tokens;
    bool ok;
} req_result;

typedef struct stream_state {
    double t0, first, last;
    long tokens;
    char line[8192];
    size_t len;
} stream_state;

static void on_line(stream_state *s, const char *line)
{
    if (strncmp(line, "data: ", 6) != 0 || !strcmp(line + 6, "[DONE]"))
        return;
    const char *u = strstr(line, "\"completion_tokens\":");
    if (u) {
        s->tokens = strtol(u + 20, NULL, 10);
        return;
    }
    if (strstr(line, "\"text\":\"\"") || !strstr(line, "\"text\":"))
        return;
    double t = now_s();
    if (s->first == 0)
        s->first = t;
    s->last = t;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
    stream_state *s = ud;
    size_t len = size * n;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '\n') {
            s->line[s->len] = 0;
            on_line(s, s->line);
            s->len = 0;
        } else if (s->len + 1 < sizeof s->line) {
            s->line[s->len++] = p[i];
        }
    }
    return len;
}

static req_result one_request(CURL *c, const char *url, const char *prompt, int max_tokens,
                              bool stream)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true%s}",
             prompt, max_tokens,
             stream ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "");
    stream_state s = {.t0 = now_s()};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    if (!stream) {
        /* The whole body is one line: its usage says how many tokens. */
        s.line[s.len] = 0;
        const char *u = strstr(s.line, "\"completion_tokens\":");
        s.tokens = u ? strtol(u + 20, NULL, 10) : 0;
        s.first = s.last = now_s();
    }
    req_result r = {.ok = rc == CURLE_OK && status == 200 && s.first > 0, .tokens = s.tokens};
    if (r.ok && stream) {
        r.ttft = s.first - s.t0;
        r.tpot = s.tokens > 1 ? (s.last - s.first) / (double)(s.tokens - 1) : 0;
    }
    return r;
}

typedef struct client {
    const char *url;
    int n_requests, max_tokens, index;
    bool stream;
    req_result *out;
    bool until_stop; /* one request after another until stop_clients; out unused */
    int failed;      /* ...and how many of them failed */
} client;

static atomic_bool stop_clients;

static const char *const prompts[] = {
    "Once upon a time",       "The quick brown fox", "In a land far", "It was a dark and", "Hello",
    "The cat sat on the mat", "A long time ago",     "She said"};

static void *client_main(void *arg)
{
    client *cl = arg;
    CURL *c = curl_easy_init();
    for (int i = 0; cl->until_stop && !atomic_load(&stop_clients); i++)
        cl->failed +=
            !one_request(c, cl->url, prompts[(size_t)(cl->index + i) % PX_ARRAY_LEN(prompts)],
                         cl->max_tokens, cl->stream)
                 .ok;
    for (int i = 0; !cl->until_stop && i < cl->n_requests; i++)
        cl->out[i] =
            one_request(c, cl->url, prompts[(size_t)(cl->index + i) % PX_ARRAY_LEN(prompts)],
                        cl->max_tokens, cl->stream);
    curl_easy_cleanup(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)ceil(p * (double)n) - 1;
    return v[i < n ? i : n - 1];
}

typedef struct level {
    double tokens_per_s, ttft50, ttft99, tpot50, tpot99;
    int failed;
} level;

/* n_clients clients, each n_requests requests one after the other. */
static level load(const char *url, int n_clients, int n_requests, int max_tokens, bool stream)
{
    pthread_t th[MAX_CLIENT];
    client cl[MAX_CLIENT];
    static req_result res[MAX_CLIENT][MAX_REQS];
    double t0 = now_s();
    for (int i = 0; i < n_clients; i++) {
        cl[i] = (client){.url = url,
                         .n_requests = n_requests,
                         .max_tokens = max_tokens,
                         .index = i,
                         .stream = stream,
                         .out = res[i]};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < n_clients; i++)
        pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    static double ttft[MAX_CLIENT * MAX_REQS], tpot[MAX_CLIENT * MAX_REQS];
    size_t n = 0;
    long tokens = 0;
    level lv = {0};
    for (int i = 0; i < n_clients; i++)
        for (int k = 0; k < n_requests; k++) {
            if (!res[i][k].ok) {
                lv.failed++;
                continue;
            }
            tokens += res[i][k].tokens;
            ttft[n] = res[i][k].ttft;
            tpot[n] = res[i][k].tpot;
            n++;
        }
    lv.tokens_per_s = (double)tokens / wall;
    lv.ttft50 = pct(ttft, n, 0.5);
    lv.ttft99 = pct(ttft, n, 0.99);
    lv.tpot50 = pct(tpot, n, 0.5);
    lv.tpot99 = pct(tpot, n, 0.99);
    return lv;
}

static void serve_136m(const char *dir)
{
    char model[512];
    snprintf(model, sizeof model, "%s/synth136-q8_0.gguf", dir);
    const char *synth[] = {plexus_bin, "model",    "synth", "--dim",     "1024", "--hidden",
                           "2816",     "--layers", "12",    "--heads",   "16",   "--kv-heads",
                           "4",        "--vocab",  "512",   "--context", "512",  "--seed",
                           "1",        "--dtype",  "q8_0",  "--out",     model,  NULL};
    if (run(synth) != 0) {
        printf("could not write the 136 M model with `plexus model synth`\n");
        return;
    }
    server s = {0};
    const char *args[] = {"--model", model, "--threads", "2", "--max-seqs", "16", NULL};
    if (!start_server(&s, args)) {
        printf("plexus serve did not start\n");
        stop_server(&s);
        return;
    }
    /* Warm-up: the weights are mapped in and the pool is awake. */
    load(s.url, 1, 1, 16, true);
    static const int conc[] = {1, 4, 8, 16};
    static const double anchor[] = {128, 139, 235, 259};
    static const int reqs[] = {6, 3, 2, 2};
    printf("136 M synthetic llama, q8_0, plexus serve --threads 2 --max-seqs 16; %d new tokens "
           "per streamed request\n",
           N_NEW);
    printf("%-8s %10s %10s %8s %10s %10s %10s %10s\n", "clients", "tok/s", "llama.cpp", "ratio",
           "ttft p50", "ttft p99", "tpot p50", "tpot p99");
    for (size_t i = 0; i < PX_ARRAY_LEN(conc); i++) {
        level lv = load(s.url, conc[i], reqs[i], N_NEW, true);
        printf("%-8d %10.1f %10.0f %7.2fx %8.1fms %8.1fms %8.2fms %8.2fms%s\n", conc[i],
               lv.tokens_per_s, anchor[i], lv.tokens_per_s / anchor[i], lv.ttft50 * 1e3,
               lv.ttft99 * 1e3, lv.tpot50 * 1e3, lv.tpot99 * 1e3, lv.failed ? " (failures)" : "");
        fflush(stdout);
    }
    stop_server(&s);
    unlink(model);
}

/* CPU seconds (user + system) this process has used: the clients' share,
 * since they are its threads. */
static double self_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return NAN;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds every programme on this machine has used (user, nice,
 * system, irq, softirq and steal time of /proc/stat's "cpu" line). */
static double machine_cpu_s(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7])
              : 0;
    if (f)
        fclose(f);
    if (n != 8)
        return NAN;
    /* user nice system idle iowait irq softirq steal */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

/* What the live processes of process group pgid (the server, which leads
 * its own group, and its stage workers) have used: CPU seconds (user +
 * system, /proc/PID/stat) and seconds their threads waited runnable for a
 * core (run_delay, /proc/PID/task/TID/schedstat), the server's apart from
 * its workers'. */
typedef struct group_use {
    double server_cpu, server_wait, workers_cpu, workers_wait;
} group_use;

static double task_wait_s(const char *pid)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/task", pid);
    DIR *dir = opendir(path);
    if (!dir)
        return 0;
    double sum = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char p[600];
        snprintf(p, sizeof p, "/proc/%s/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long run = 0, wait = 0;
        if (f && fscanf(f, "%llu %llu", &run, &wait) == 2)
            sum += (double)wait / 1e9;
        if (f)
            fclose(f);
    }
    closedir(dir);
    return sum;
}

static group_use group_use_now(pid_t pgid)
{
    group_use u = {0};
    DIR *dir = opendir("/proc");
    if (!dir)
        return u;
    double ticks = (double)sysconf(_SC_CLK_TCK);
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        /* After the command's closing parenthesis: state ppid pgrp ...,
         * utime and stime are the 12th and 13th fields from there. */
        const char *p = strrchr(buf, ')');
        long pgrp = 0;
        unsigned long ut = 0, st = 0;
        if (!p ||
            sscanf(p + 2, "%*c %*d %ld %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &pgrp, &ut, &st) !=
                3 ||
            pgrp != (long)pgid)
            continue;
        bool lead = strtol(e->d_name, NULL, 10) == (long)pgid;
        *(lead ? &u.server_cpu : &u.workers_cpu) += (double)(ut + st) / ticks;
        *(lead ? &u.server_wait : &u.workers_wait) += task_wait_s(e->d_name);
    }
    closedir(dir);
    return u;
}

/* The server's /metrics (url: its /v1/ base) into body (n bytes, a
 * newline first, so that every line starts after one); false when it
 * cannot be had. */
static bool fetch_metrics(const char *url, char *body, size_t n)
{
    char murl[160];
    const char *v1 = strstr(url, "/v1/");
    snprintf(murl, sizeof murl, "%.*s/metrics", v1 ? (int)(v1 - url) : (int)strlen(url), url);
    CURL *c = curl_easy_init();
    FILE *mem = fmemopen(body, n - 1, "w");
    if (!c || !mem) {
        if (mem)
            fclose(mem);
        curl_easy_cleanup(c);
        return false;
    }
    fputc('\n', mem);
    curl_easy_setopt(c, CURLOPT_URL, murl);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, mem);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(c);
    size_t len = (size_t)ftell(mem);
    fclose(mem);
    curl_easy_cleanup(c);
    body[len < n ? len : n - 1] = 0;
    return rc == CURLE_OK;
}

/* The value of `metric` in the server's /metrics, summed over replicas
 * when it is per replica, or replica `only`'s alone (>= 0); NAN when
 * absent. */
static double scrape_replica(const char *url, const char *metric, int only)
{
    static char body[1 << 16];
    if (!fetch_metrics(url, body, sizeof body))
        return NAN;
    double sum = NAN;
    size_t mlen = strlen(metric);
    for (const char *l = body + 1; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, metric, mlen) != 0 || (l[mlen] != ' ' && l[mlen] != '{'))
            continue;
        char label[32];
        snprintf(label, sizeof label, "{replica=\"%d\"}", only);
        if (only >= 0 && strncmp(l + mlen, label, strlen(label)) != 0)
            continue;
        const char *sp = strchr(l, ' ');
        if (sp)
            sum = (isnan(sum) ? 0 : sum) + strtod(sp + 1, NULL);
    }
    return sum;
}

static double scrape(const char *url, const char *metric)
{
    return scrape_replica(url, metric, -1);
}

/* Per replica, the counters that say what batch it formed. */
#define MAX_REPS   8
#define MAX_STAGES 8
typedef struct rep_rows {
    double steps, rows, decode_steps, decode_rows, tokens;
} rep_rows;

static void rows_now(const char *url, int n_reps, rep_rows *out)
{
    for (int i = 0; i < n_reps && i < MAX_REPS; i++)
        out[i] = (rep_rows){scrape_replica(url, "plexus_serve_steps_total", i),
                            scrape_replica(url, "plexus_serve_step_rows_total", i),
                            scrape_replica(url, "plexus_serve_decode_steps_total", i),
                            scrape_replica(url, "plexus_serve_decode_rows_total", i),
                            scrape_replica(url, "plexus_serve_engine_generated_tokens_total", i)};
}

/* Where each replica's steps spent their time, from the server's
 * /metrics (plexus_serve_timed_..., _stage_..., _hop_..., _executor_...):
 * sums in seconds since the server started. */
typedef struct rep_timing {
    double steps, rows, context;
    double compute[MAX_STAGES], compute_wait[MAX_STAGES];
    double hop[MAX_STAGES + 1], hop_wait[MAX_STAGES + 1];
    double work, work_wait, result, result_wait;
} rep_timing;

/* The value of `metric{labels}` in body; 0 when absent. */
static double metric_in(const char *body, const char *metric, const char *labels)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s{%s} ", metric, labels);
    const char *at = strstr(body, key);
    return at ? strtod(at + strlen(key), NULL) : 0;
}

static void timing_now(const char *url, int n_reps, const int *n_stages, rep_timing *out)
{
    static char body[1 << 17];
    memset(out, 0, sizeof *out * (size_t)n_reps);
    if (!fetch_metrics(url, body, sizeof body))
        return;
    for (int i = 0; i < n_reps; i++) {
        rep_timing *t = &out[i];
        char r[32], l[64];
        snprintf(r, sizeof r, "replica=\"%d\"", i);
        t->steps = metric_in(body, "plexus_serve_timed_steps_total", r);
        t->rows = metric_in(body, "plexus_serve_timed_rows_total", r);
        t->context = metric_in(body, "plexus_serve_timed_context_total", r);
        t->work = metric_in(body, "plexus_serve_executor_work_seconds_total", r);
        t->work_wait = metric_in(body, "plexus_serve_executor_work_core_wait_seconds_total", r);
        t->result = metric_in(body, "plexus_serve_executor_result_wait_seconds_total", r);
        t->result_wait = metric_in(body, "plexus_serve_executor_result_core_wait_seconds_total", r);
        for (int k = 0; k <= n_stages[i] && k <= MAX_STAGES; k++) {
            if (k < n_stages[i] && k < MAX_STAGES) {
                snprintf(l, sizeof l, "%s,stage=\"%d\"", r, k);
                t->compute[k] = metric_in(body, "plexus_serve_stage_compute_seconds_total", l);
                t->compute_wait[k] =
                    metric_in(body, "plexus_serve_stage_core_wait_seconds_total", l);
                snprintf(l, sizeof l, "%s,into=\"%d\"", r, k);
            } else {
                snprintf(l, sizeof l, "%s,into=\"executor\"", r);
            }
            t->hop[k] = metric_in(body, "plexus_serve_hop_seconds_total", l);
            t->hop_wait[k] = metric_in(body, "plexus_serve_hop_core_wait_seconds_total", l);
        }
    }
}

/* What a replica's plan predicts of each part of its step (the replica's
 * "predicted" and its stages'), per micro-batch. */
typedef struct rep_pred_parts {
    double step_s, executor_s, return_s, served_step_s[MAX_STAGES], transfer_s[MAX_STAGES];
    double context; /* the positions the plan prices a decode row at */
    int mb;
} rep_pred_parts;

/* Prints replica i's step, part by part, over the window (t0 to t1),
 * against its plan: per micro-batch step, each stage's compute (of which
 * waiting for a core), each hop (of which its receiver waiting for a
 * core), the engine thread's own work and its wait for results, and the
 * period between steps. */
static void print_parts(int i, int n_stages, const rep_timing *t0, const rep_timing *t1,
                        const rep_pred_parts *p, double wall)
{
    double n = t1->steps - t0->steps;
    if (n <= 0)
        return;
    double ms = 1e3 / n;
    printf("  replica %d, per step (%.0f steps, %.1f rows, %.0f positions attended per row against "
           "the plan's %.0f; ms, observed [waiting for a core] / predicted):",
           i, n, (t1->rows - t0->rows) / n,
           t1->rows > t0->rows ? (t1->context - t0->context) / (t1->rows - t0->rows) : 0,
           p->context);
    for (int k = 0; k < n_stages && k < MAX_STAGES; k++)
        printf(" hop into %d %.3f [%.3f] / %.3f; stage %d %.3f [%.3f] / %.3f;", k,
               (t1->hop[k] - t0->hop[k]) * ms, (t1->hop_wait[k] - t0->hop_wait[k]) * ms,
               k ? p->transfer_s[k - 1] * 1e3 : 0, k, (t1->compute[k] - t0->compute[k]) * ms,
               (t1->compute_wait[k] - t0->compute_wait[k]) * ms, p->served_step_s[k] * 1e3);
    int b = n_stages <= MAX_STAGES ? n_stages : MAX_STAGES;
    printf(" hop back %.3f [%.3f] / %.3f; executor work %.3f [%.3f] / %.3f; executor waiting for "
           "results %.3f [%.3f]; period %.3f / %.3f (%d micro-batch%s)\n",
           (t1->hop[b] - t0->hop[b]) * ms, (t1->hop_wait[b] - t0->hop_wait[b]) * ms,
           p->return_s * 1e3, (t1->work - t0->work) * ms, (t1->work_wait - t0->work_wait) * ms,
           p->executor_s * 1e3, (t1->result - t0->result) * ms,
           (t1->result_wait - t0->result_wait) * ms, wall * ms,
           p->mb > 0 ? p->step_s / p->mb * 1e3 : 0, p->mb, p->mb == 1 ? "" : "es");
    /* A micro-batch's trip round the ring (the engine's work, every hop
     * and stage), and what of it was waiting for a core: with mb
     * micro-batches in flight a step takes at least the trip over mb. */
    double trip = t1->work - t0->work, waited = t1->work_wait - t0->work_wait;
    for (int k = 0; k <= b; k++) {
        trip += t1->hop[k] - t0->hop[k];
        waited += t1->hop_wait[k] - t0->hop_wait[k];
        if (k < b) {
            trip += t1->compute[k] - t0->compute[k];
            waited += t1->compute_wait[k] - t0->compute_wait[k];
        }
    }
    double pred_trip = p->executor_s + p->return_s;
    for (int k = 0; k < b; k++)
        pred_trip += p->served_step_s[k] + p->transfer_s[k];
    printf(
        "  replica %d, a micro-batch's trip round the ring: %.3f ms, of which waiting for a core "
        "%.3f ms (%.0f%%); without those waits %.3f ms against the plan's %.3f (%.2f)\n",
        i, trip * ms, waited * ms, trip > 0 ? 100 * waited / trip : 0, (trip - waited) * ms,
        pred_trip * 1e3, pred_trip > 0 ? (trip - waited) * ms / (pred_trip * 1e3) : 0);
}

/* Serves the plan in `plan` (made for emu-small) and prints its observed
 * tokens/s against its predicted interval, as `label` says; with report,
 * the server writes its run report there when it stops. */
static void serve_plan(const char *label, const char *model, const char *inventory,
                       const char *plan, const char *report)
{
    json_t *doc = json_load_file(plan, 0, NULL);
    const json_t *pred =
        json_object_get(json_object_get(doc, "predictions"), "throughput_tokens_per_s");
    double p50 = json_number_value(json_object_get(pred, "p50"));
    double lo = json_number_value(json_object_get(pred, "lo"));
    double hi = json_number_value(json_object_get(pred, "hi"));
    const json_t *batching = json_object_get(doc, "batching");
    json_int_t batch = json_integer_value(json_object_get(batching, "batch_per_replica"));
    json_int_t reps = json_integer_value(json_object_get(batching, "replicas"));
    /* Each replica runs at its own batch: as many clients as they hold. */
    json_int_t in_flight = json_integer_value(json_object_get(batching, "sequences_in_flight"));
    /* The replicas' batches over their times per token: what the time per
     * token says the layout serves (each replica at its own batch). */
    double by_tpot = 0;
    size_t ri;
    const json_t *rep;
    /* Each replica's stages, and the rows of a micro-batch it priced. */
    int n_reps = 0, rep_stages[MAX_REPS] = {0};
    double rep_mb_rows[MAX_REPS] = {0}, rep_pred[MAX_REPS] = {0};
    static rep_pred_parts parts[MAX_REPS];
    memset(parts, 0, sizeof parts);
    double plan_context =
        json_number_value(json_object_get(json_object_get(doc, "workload"), "attended_positions"));
    json_array_foreach(json_object_get(doc, "replicas"), ri, rep)
    {
        double t = json_number_value(json_object_get(rep, "tpot_s"));
        json_int_t b = json_integer_value(json_object_get(rep, "batch"));
        json_int_t mb = json_integer_value(json_object_get(rep, "micro_batches"));
        if (t > 0 && b > 0)
            by_tpot += (double)b / t;
        if (ri < MAX_REPS) {
            rep_stages[ri] = (int)json_array_size(json_object_get(rep, "stages"));
            rep_mb_rows[ri] = mb > 0 ? ceil((double)b / (double)mb) : (double)b;
            rep_pred[ri] = json_number_value(json_object_get(rep, "throughput"));
            const json_t *rp = json_object_get(rep, "predicted");
            rep_pred_parts *pp = &parts[ri];
            pp->step_s = json_number_value(json_object_get(rp, "step_s"));
            pp->executor_s = json_number_value(json_object_get(rp, "executor_s_per_micro_batch"));
            pp->return_s = json_number_value(json_object_get(rp, "return_s_per_micro_batch"));
            pp->mb = mb > 0 ? (int)mb : 1;
            pp->context = plan_context;
            size_t si;
            const json_t *st;
            json_array_foreach(json_object_get(rep, "stages"), si, st)
            {
                const json_t *sp = json_object_get(st, "predicted");
                if (si < MAX_STAGES) {
                    pp->served_step_s[si] = json_number_value(json_object_get(sp, "served_step_s"));
                    pp->transfer_s[si] = json_number_value(json_object_get(sp, "transfer_s"));
                }
            }
            n_reps = (int)ri + 1;
        }
    }
    size_t n_stages = json_array_size(json_object_get(doc, "stages"));
    json_decref(doc);
    if (batch <= 0)
        batch = 8;
    if (reps <= 0)
        reps = 1;
    if (in_flight <= 0)
        in_flight = batch * reps;
    int clients = (int)PX_MIN(in_flight, (json_int_t)MAX_CLIENT);
    server s = {0};
    /* Room for the clients' connections and the bench's scrapes. */
    const char *args[] = {"--model",
                          model,
                          "--inventory",
                          inventory,
                          "--plan",
                          plan,
                          "--queue",
                          "1024",
                          "--max-connections",
                          "1024",
                          report ? "--run-report" : NULL,
                          report,
                          NULL};
    if (!start_server(&s, args)) {
        printf("emu-small throughput plan, %s: plexus serve did not start\n", label);
        stop_server(&s);
        return;
    }
    load(s.url, 2, 1, 16, false);
    /* The plan predicts the steady state: every replica's batch full,
     * requests ending and new ones taking their places.  The clients send
     * one request after another (up to 100 new tokens each) until told to
     * stop; the window opens once the sequences in flight have produced 20
     * tokens each (all admitted), and the figures are the window's. */
    static pthread_t th[MAX_CLIENT];
    static client cl[MAX_CLIENT];
    atomic_store(&stop_clients, false);
    double tok_start = scrape(s.url, "plexus_serve_engine_generated_tokens_total");
    for (int i = 0; i < clients; i++) {
        cl[i] = (client){
            .url = s.url, .max_tokens = 100, .index = i, .stream = false, .until_stop = true};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    double ramp0 = now_s();
    while (now_s() - ramp0 < 120 &&
           scrape(s.url, "plexus_serve_engine_generated_tokens_total") - tok_start < 20.0 * clients)
        usleep(50000);
    double ramp = now_s() - ramp0;
    double inc0 = scrape(s.url, "plexus_serve_incidents_total");
    double steps0 = scrape(s.url, "plexus_serve_steps_total");
    double tok0 = scrape(s.url, "plexus_serve_engine_generated_tokens_total");
    rep_rows r0[MAX_REPS], r1[MAX_REPS];
    rows_now(s.url, n_reps, r0);
    static rep_timing tm0[MAX_REPS], tm1[MAX_REPS];
    timing_now(s.url, n_reps, rep_stages, tm0);
    group_use u0 = group_use_now(s.pid);
    double cpu_cl = self_cpu_s(), t0 = now_s(), all0 = machine_cpu_s();
    usleep(6000000);
    double tokens = scrape(s.url, "plexus_serve_engine_generated_tokens_total") - tok0;
    double wall = now_s() - t0;
    cpu_cl = self_cpu_s() - cpu_cl;
    double all = machine_cpu_s() - all0;
    group_use u1 = group_use_now(s.pid);
    double incidents = scrape(s.url, "plexus_serve_incidents_total") - inc0;
    double steps = scrape(s.url, "plexus_serve_steps_total") - steps0;
    rows_now(s.url, n_reps, r1);
    timing_now(s.url, n_reps, rep_stages, tm1);
    atomic_store(&stop_clients, true);
    level lv = {.tokens_per_s = wall > 0 ? tokens / wall : 0};
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        lv.failed += cl[i].failed;
    }
    stop_server(&s);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool inside = lv.tokens_per_s >= lo && lv.tokens_per_s <= hi;
    printf("emu-small throughput plan, %s (%zu stages, %lld replica%s, %lld sequences in "
           "flight, EMULATED devices): observed %.0f tok/s with %d clients (steady state, after "
           "%.1f s of ramp); predicted %.0f [%.0f, "
           "%.0f] (observed/predicted p50 %.2f; the replicas' batches over their times per "
           "token: %.0f tok/s): %s%s\n",
           label, n_stages, (long long)reps, reps == 1 ? "" : "s", (long long)in_flight,
           lv.tokens_per_s, clients, ramp, p50, lo, hi, p50 > 0 ? lv.tokens_per_s / p50 : 0,
           by_tpot, inside ? "inside the interval" : "OUTSIDE the interval",
           lv.failed ? " (failed requests)" : "");
    /* What shares the host's cores while it is measured: the clients (this
     * process's threads) and the server with its stage workers; and whether
     * the healing loop changed the plan while it was measured. */
    double cap = wall * (double)cores, per_tok = tokens > 0 ? 1e6 / tokens : 0;
    double srv = u1.server_cpu - u0.server_cpu, wrk = u1.workers_cpu - u0.workers_cpu;
    printf("  over %.1f s on %ld cores: CPU-s (share of the cores, us per token): clients %.2f "
           "(%.1f%%, %.0f), server %.2f (%.1f%%, %.0f), stage workers %.2f (%.1f%%, %.0f); "
           "waiting for a core: server %.2f s, stage workers %.2f s; %.0f engine steps, %.1f "
           "rows per step; %.0f incident%s during the measurement\n",
           wall, cores, cpu_cl, 100 * cpu_cl / cap, cpu_cl * per_tok, srv, 100 * srv / cap,
           srv * per_tok, wrk, 100 * wrk / cap, wrk * per_tok, u1.server_wait - u0.server_wait,
           u1.workers_wait - u0.workers_wait, steps, steps > 0 ? tokens / steps : 0, incidents,
           incidents == 1 ? "" : "s");
    /* The plan prices the host's cores as this serving's alone: what
     * other programmes took of them meanwhile is the share it did not
     * have. */
    double others = all - cpu_cl - srv - wrk;
    printf("  other programmes on this machine meanwhile: %.2f CPU-s (%.1f%% of the cores); the "
           "plan prices the %ld cores as this serving's alone\n",
           others, 100 * others / cap, cores);
    for (int i = 0; i < n_reps; i++) {
        double st = r1[i].steps - r0[i].steps, ds = r1[i].decode_steps - r0[i].decode_steps;
        double tps = (r1[i].tokens - r0[i].tokens) / wall;
        printf("  replica %d (%d stage%s): %.0f tok/s, predicted %.0f (%.2f); priced %.0f rows per "
               "micro-batch; %.0f steps of %.1f rows, %.0f of them decode only, of %.1f rows\n",
               i, rep_stages[i], rep_stages[i] == 1 ? "" : "s", tps, rep_pred[i],
               rep_pred[i] > 0 ? tps / rep_pred[i] : 0, rep_mb_rows[i], st,
               st > 0 ? (r1[i].rows - r0[i].rows) / st : 0, ds,
               ds > 0 ? (r1[i].decode_rows - r0[i].decode_rows) / ds : 0);
    }
    for (int i = 0; i < n_reps; i++)
        print_parts(i, rep_stages[i], &tm0[i], &tm1[i], &parts[i], wall);
    fflush(stdout);
}

/* The workload the plan part sends (prompts of a few tokens, up to 100 new
 * tokens each), so that the plan predicts what is measured; one device
 * per stage, as the stage workers run. */
#define PLAN_WORKLOAD "--prompt-tokens 8 --gen-tokens 100 --max-tp 1"
/* Rounds of serving, calibrating from that run, planning again. */
#define SERVED_ROUNDS 3

/* emu-small describes this machine's CPU beside two emulated devices; its
 * node gets this machine's cores as discovery finds them (`plexus
 * inventory discover`: online CPUs, affinity, cgroup quota), so that the
 * plan prices the stages, devices and executor sharing them.  Writes the
 * copy to out; false when discovery gives no cores. */
static bool emu_small_here(const char *dir, const char *src, const char *out)
{
    char disc[512], cmd[2048];
    snprintf(disc, sizeof disc, "%s/discovered.json", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' inventory discover --no-gpu --no-interpreter -o json > '%s' 2>/dev/null",
             plexus_bin, disc);
    bool ok = false;
    json_t *d = system(cmd) == 0 ? json_load_file(disc, 0, NULL) : NULL;
    json_t *inv = json_load_file(src, 0, NULL);
    json_t *cpu = json_object_get(json_array_get(json_object_get(d, "nodes"), 0), "cpu");
    json_t *node = json_array_get(json_object_get(inv, "nodes"), 0);
    if (cpu && node && json_object_set(node, "cpu", cpu) == 0 &&
        json_dump_file(inv, out, JSON_INDENT(2)) == 0) {
        printf("emu-small on this machine's cores: %s\n",
               json_string_value(json_object_get(json_object_get(cpu, "cores"), "value")));
        ok = true;
    }
    json_decref(d);
    json_decref(inv);
    unlink(disc);
    return ok;
}

/* The throughput plan on emu-small, served, against its prediction: as
 * planned from the inventory's sourced figures; from figures calibrated
 * on this machine (`plexus calibrate`), each device timed alone; and
 * from those with what that serving run measured of its stages
 * (`plexus serve --run-report`, `plexus calibrate --from-run`): the
 * devices sharing the host's cores. */
static void serve_plans(const char *dir)
{
    char model[512], plan[512], calib[512], calib2[512], report[512], inventory[512], cmd[8192];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    char scenario[512];
    snprintf(scenario, sizeof scenario, "%s/data/scenarios/emu-small.json", PX_SOURCE_DIR);
    snprintf(inventory, sizeof inventory, "%s/emu-small-here.json", dir);
    if (!emu_small_here(dir, scenario, inventory)) {
        printf("emu-small throughput plan: this machine's cores were not discovered; the plan "
               "does not price the stages sharing them\n");
        snprintf(inventory, sizeof inventory, "%s", scenario);
    }
    snprintf(plan, sizeof plan, "%s/throughput-plan.json", dir);
    snprintf(calib, sizeof calib, "%s/emu-small-calibration.json", dir);
    if (access(model, R_OK) != 0) {
        printf("emu-small throughput plan: skipped (%s is not there)\n", model);
        return;
    }
    snprintf(cmd, sizeof cmd,
             "'%s' plan --model '%s' --inventory '%s' --objective throughput " PLAN_WORKLOAD
             " -o json > '%s'",
             plexus_bin, model, inventory, plan);
    if (system(cmd) != 0) {
        printf("emu-small throughput plan: plexus plan failed\n");
        return;
    }
    serve_plan("sourced figures", model, inventory, plan, NULL);
    snprintf(cmd, sizeof cmd,
             "'%s' calibrate --inventory '%s' --model '%s' --out '%s' > /dev/null && "
             "'%s' plan --model '%s' --inventory '%s' --objective throughput " PLAN_WORKLOAD
             " --mode calibrated "
             "--calibration '%s' -o json > '%s'",
             plexus_bin, inventory, model, calib, plexus_bin, model, inventory, calib, plan);
    snprintf(report, sizeof report, "%s/served.json", dir);
    snprintf(calib2, sizeof calib2, "%s/emu-small-calibration-served.json", dir);
    if (system(cmd) != 0) {
        printf("emu-small throughput plan: plexus calibrate or plan failed\n");
    } else {
        serve_plan("calibrated on this machine", model, inventory, plan, report);
        /* SERVED_ROUNDS times: a plan learnt from serving may run its
         * devices at batches the served run did not, which its own run
         * shows. */
        for (int round = 1; round <= SERVED_ROUNDS; round++) {
            snprintf(cmd, sizeof cmd,
                     "'%s' calibrate --inventory '%s' --model '%s' --no-bench --calibration '%s' "
                     "--from-run '%s' --out '%s' > /dev/null && cp '%s' '%s' && "
                     "'%s' plan --model '%s' --inventory '%s' --objective throughput " PLAN_WORKLOAD
                     " --mode calibrated --calibration '%s' -o json > '%s'",
                     plexus_bin, inventory, model, calib, report, calib2, calib2, calib, plexus_bin,
                     model, inventory, calib, plan);
            if (system(cmd) != 0) {
                printf("emu-small throughput plan: calibrating from the serving run failed\n");
                break;
            }
            char label[96];
            snprintf(label, sizeof label, "calibrated, and from %d serving run%s", round,
                     round == 1 ? "" : "s");
            serve_plan(label, model, inventory, plan, round < SERVED_ROUNDS ? report : NULL);
        }
    }
    unlink(calib);
    unlink(calib2);
    unlink(report);
    unlink(plan);
    if (strcmp(inventory, scenario) != 0)
        unlink(inventory);
}

int main(void)
{
    static char bin[1024];
    const char *env = getenv("PLEXUS_BIN");
    if (env) {
        plexus_bin = env;
    } else {
        ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
        if (n <= 0)
            return 1;
        bin[n] = 0;
        char *slash = strrchr(bin, '/');
        snprintf(slash + 1, sizeof bin - (size_t)(slash + 1 - bin), "plexus");
        plexus_bin = bin;
    }
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char tmpl[] = "/tmp/plexus-bench-serve-XXXXXX";
    const char *dir = getenv("PX_BENCH_DIR");
    bool own = !dir;
    if (own && !(dir = mkdtemp(tmpl)))
        return 1;
    /* PX_BENCH_SERVE=136m or =plan runs one part. */
    const char *only = getenv("PX_BENCH_SERVE");
    if (!only || strcmp(only, "136m") == 0)
        serve_136m(dir);
    if (!only || strcmp(only, "plan") == 0)
        serve_plans(dir);
    if (own)
        rmdir(dir);
    curl_global_cleanup();
    return 0;
}
