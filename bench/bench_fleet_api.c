/* The fleet server's HTTP API on loopback, in process: submit-to-start
 * latency with three simulated agents long-polling for work; request
 * latency under a paced load of about 1,000 requests per second for three
 * seconds; the latency four legitimate clients see while 500 hostile
 * connections (half-open requests trickling a byte a second, from eight
 * loopback addresses) are held open; and while 60 MB uploads stream in.
 * Bounded in count and time; talks only to 127.0.0.0/8. */
#include "base/common.h"

#include "plexus/fleet.h"
#include "bench_util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#define __USE_XOPEN_EXTENDED 1
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define AGENT_TOKEN  "bench-agent-token-0123456789" /* the join token */
#define USER_TOKEN   "bench-user-token-0123456789"
#define N_AGENTS     3
#define N_SUBMIT     60
#define LOAD_THREADS 8
#define LOAD_RATE    1000.0
#define LOAD_SECONDS 3.0
#define N_HOSTILE    500
#define N_LEGIT      4
#define HOSTILE_S    4.0

static char base[128];
static int port;
static volatile int stop_agents;

typedef struct client {
    CURL *c;
    struct curl_slist *h;
    px_strbuf out;
} client;

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
    px_strbuf_add(ud, p, size * n);
    return size * n;
}

static void client_init(client *cl, const char *token)
{
    cl->c = curl_easy_init();
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    cl->h = curl_slist_append(NULL, auth);
    cl->h = curl_slist_append(cl->h, "Expect:");
    px_strbuf_init(&cl->out);
}

static void client_free(client *cl)
{
    curl_slist_free_all(cl->h);
    curl_easy_cleanup(cl->c);
    px_strbuf_release(&cl->out);
}

/* One request on a kept-alive connection; returns the status (0 on failure). */
static long call(client *cl, const char *method, const char *path, const char *body)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", base, path);
    px_strbuf_reset(&cl->out);
    curl_easy_setopt(cl->c, CURLOPT_URL, url);
    curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(cl->c, CURLOPT_HTTPHEADER, cl->h);
    curl_easy_setopt(cl->c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(cl->c, CURLOPT_WRITEDATA, &cl->out);
    curl_easy_setopt(cl->c, CURLOPT_TIMEOUT, 20L);
    curl_easy_setopt(cl->c, CURLOPT_HTTPGET, body ? 0L : 1L);
    curl_easy_setopt(cl->c, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(cl->c, CURLOPT_POSTFIELDS, body);
    if (curl_easy_perform(cl->c) != CURLE_OK)
        return 0;
    long status = 0;
    curl_easy_getinfo(cl->c, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* ---- submit-to-start ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t submitted_at[N_SUBMIT + 1], started_at[N_SUBMIT + 1];

/* The credential simulated agent k made for itself. */
static void credential_of(int k, char *out, size_t n)
{
    snprintf(out, n, "bench-node-credential-%d-0123456789abcdef", k);
}

static void *agent_main(void *arg)
{
    int k = (int)(intptr_t)arg;
    client cl;
    client_init(&cl, AGENT_TOKEN);
    char name[32], path[128], body[256], cred[64];
    snprintf(name, sizeof name, "agent%d", k);
    credential_of(k, cred, sizeof cred);
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"cpus\": 4, \"memory\": \"8 GiB\", \"credential\": \"%s\"}", name,
             cred);
    call(&cl, "POST", "/v1/agent/join", body);
    client_free(&cl);
    client_init(&cl, cred);
    snprintf(path, sizeof path, "/v1/agent/assignments?wait=1");
    while (!stop_agents) {
        if (call(&cl, "GET", path, NULL) != 200)
            continue;
        json_t *r = json_loads(cl.out.buf, 0, NULL);
        json_t *as = json_object_get(r, "assignments");
        for (size_t i = 0; i < json_array_size(as); i++) {
            const json_t *a = json_array_get(as, i);
            const char *id = json_string_value(json_object_get(a, "job"));
            int attempt = (int)json_integer_value(json_object_get(a, "attempt"));
            char jp[128], jb[160];
            snprintf(jp, sizeof jp, "/v1/agent/jobs/%s/start", id);
            snprintf(jb, sizeof jb, "{\"node\": \"%s\", \"attempt\": %d, \"rank\": 0, \"pid\": 1}",
                     name, attempt);
            if (call(&cl, "POST", jp, jb) == 200) {
                long seq = strtol(id + 2, NULL, 10);
                pthread_mutex_lock(&mu);
                if (seq > 0 && seq <= N_SUBMIT)
                    started_at[seq] = px_now_ns();
                pthread_mutex_unlock(&mu);
            }
            snprintf(jp, sizeof jp, "/v1/agent/jobs/%s/finish", id);
            snprintf(jb, sizeof jb,
                     "{\"node\": \"%s\", \"attempt\": %d, \"rank\": 0, \"exit_code\": 0}", name,
                     attempt);
            call(&cl, "POST", jp, jb);
        }
        json_decref(r);
    }
    client_free(&cl);
    return NULL;
}

static void submit_to_start(void)
{
    client cl;
    client_init(&cl, USER_TOKEN);
    usleep(300000); /* agents register */
    for (int i = 1; i <= N_SUBMIT; i++) {
        uint64_t t = px_now_ns();
        if (call(&cl, "POST", "/v1/jobs", "{\"command\": [\"true\"]}") != 201)
            fprintf(stderr, "bench: submit failed: %s\n", cl.out.buf);
        json_t *r = json_loads(cl.out.buf, 0, NULL);
        long seq = strtol(json_string_value(json_object_get(r, "id")) + 2, NULL, 10);
        json_decref(r);
        pthread_mutex_lock(&mu);
        if (seq > 0 && seq <= N_SUBMIT)
            submitted_at[seq] = t;
        pthread_mutex_unlock(&mu);
        usleep(20000);
    }
    usleep(500000);
    double lat[N_SUBMIT];
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 1; i <= N_SUBMIT; i++)
        if (submitted_at[i] && started_at[i] >= submitted_at[i])
            lat[n++] = (double)(started_at[i] - submitted_at[i]) / 1e6;
    pthread_mutex_unlock(&mu);
    qsort(lat, (size_t)n, sizeof *lat, bench_cmp_double);
    if (n > 0)
        printf("submit-to-start (%d agents, %d jobs, simulated agents over HTTP long polls): "
               "p50 %.1f ms  p99 %.1f ms  max %.1f ms  (aim: p50 < 50 ms)\n",
               N_AGENTS, n, lat[n / 2], lat[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1],
               lat[n - 1]);
    else
        printf("submit-to-start: no job started\n");
    client_free(&cl);
}

/* ---- paced load ---- */

typedef struct load_thread {
    int k;
    double *lat;
    int n, errors;
} load_thread;

static void *load_main(void *arg)
{
    load_thread *t = arg;
    client cl;
    char cred[64];
    credential_of(0, cred, sizeof cred);
    client_init(&cl, t->k == 0 ? cred : USER_TOKEN);
    int total = (int)(LOAD_RATE / LOAD_THREADS * LOAD_SECONDS);
    t->lat = malloc((size_t)total * sizeof *t->lat);
    double interval = LOAD_THREADS / LOAD_RATE;
    uint64_t t0 = px_now_ns();
    for (int i = 0; i < total && t->lat; i++) {
        uint64_t due = t0 + (uint64_t)(i * interval * 1e9);
        uint64_t now = px_now_ns();
        if (due > now)
            usleep((useconds_t)((due - now) / 1000));
        char path[64];
        long want = 200, got;
        uint64_t a = px_now_ns();
        if (t->k == 0) {
            got = call(&cl, "POST", "/v1/agent/heartbeat",
                       "{\"node\": \"agent0\", \"live\": {\"load\": 0.1}, \"running\": []}");
        } else if (i % 5 == 0) {
            got = call(&cl, "GET", "/v1/nodes", NULL);
        } else if (i % 5 == 1) {
            got = call(&cl, "GET", "/v1/jobs?limit=20", NULL);
        } else {
            snprintf(path, sizeof path, "/v1/jobs/j-%06d", 1 + (i * 7 + t->k) % N_SUBMIT);
            got = call(&cl, "GET", path, NULL);
        }
        t->lat[t->n++] = (double)(px_now_ns() - a) / 1e6;
        t->errors += got != want;
    }
    client_free(&cl);
    return NULL;
}

static void paced_load(void)
{
    load_thread th[LOAD_THREADS] = {0};
    pthread_t tid[LOAD_THREADS];
    uint64_t t0 = px_now_ns();
    for (int k = 0; k < LOAD_THREADS; k++) {
        th[k].k = k;
        pthread_create(&tid[k], NULL, load_main, &th[k]);
    }
    int n = 0, errors = 0;
    for (int k = 0; k < LOAD_THREADS; k++) {
        pthread_join(tid[k], NULL);
        n += th[k].n;
        errors += th[k].errors;
    }
    double secs = (double)(px_now_ns() - t0) / 1e9;
    double *all = malloc((size_t)(n ? n : 1) * sizeof *all);
    int m = 0;
    for (int k = 0; k < LOAD_THREADS; k++) {
        for (int i = 0; i < th[k].n; i++)
            all[m++] = th[k].lat[i];
        free(th[k].lat);
    }
    qsort(all, (size_t)m, sizeof *all, bench_cmp_double);
    if (m > 0)
        printf("API under load: %d requests in %.2f s (%.0f/s; mix: job GETs, job lists, node "
               "lists, heartbeats)  p50 %.2f ms  p99 %.2f ms  max %.2f ms  errors %d\n",
               m, secs, m / secs, all[m / 2], all[(m * 99) / 100], all[m - 1], errors);
    free(all);
}

/* ---- legitimate clients beside hostile connections or large uploads ---- */

typedef struct legit {
    double *lat;
    int n, cap, errors;
    double seconds;
} legit;

static void *legit_main(void *arg)
{
    legit *t = arg;
    client cl;
    client_init(&cl, USER_TOKEN);
    uint64_t until = px_now_ns() + (uint64_t)(t->seconds * 1e9);
    for (int i = 0; px_now_ns() < until && t->n < t->cap; i++) {
        uint64_t a = px_now_ns();
        long got = i % 2 ? call(&cl, "GET", "/v1/jobs?limit=20", NULL)
                         : call(&cl, "GET", "/v1/nodes", NULL);
        t->lat[t->n++] = (double)(px_now_ns() - a) / 1e6;
        t->errors += got != 200;
        usleep(5000);
    }
    client_free(&cl);
    return NULL;
}

static void run_legit(const char *what, int held)
{
    legit th[N_LEGIT];
    pthread_t tid[N_LEGIT];
    for (int k = 0; k < N_LEGIT; k++) {
        th[k] = (legit){.cap = 4096, .seconds = HOSTILE_S};
        th[k].lat = malloc((size_t)th[k].cap * sizeof *th[k].lat);
        pthread_create(&tid[k], NULL, legit_main, &th[k]);
    }
    double *all = malloc((size_t)N_LEGIT * 4096 * sizeof *all);
    int m = 0, errors = 0;
    for (int k = 0; k < N_LEGIT; k++) {
        pthread_join(tid[k], NULL);
        for (int i = 0; i < th[k].n; i++)
            all[m++] = th[k].lat[i];
        errors += th[k].errors;
        free(th[k].lat);
    }
    qsort(all, (size_t)m, sizeof *all, bench_cmp_double);
    if (m > 0)
        printf("%s: %d legitimate clients, %d requests: p50 %.2f ms  p99 %.2f ms  max %.2f ms  "
               "errors %d",
               what, N_LEGIT, m, all[m / 2], all[(m * 99) / 100], all[m - 1], errors);
    else
        printf("%s: no request was served", what);
    if (held >= 0)
        printf("  (hostile connections still open: %d)", held);
    printf("  (aim: every request served within 1 s)\n");
    free(all);
}

static int hostile_connect(int k)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    char src_ip[32];
    snprintf(src_ip, sizeof src_ip, "127.0.0.%d", 2 + k % 8);
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, src_ip, &src.sin_addr);
    dst.sin_port = htons((uint16_t)port);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || bind(s, (struct sockaddr *)&src, sizeof src) != 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    connect(s, (struct sockaddr *)&dst, sizeof dst);
    return s;
}

static void *trickle_main(void *arg)
{
    int *socks = arg;
    uint64_t until = px_now_ns() + (uint64_t)((HOSTILE_S + 1) * 1e9);
    while (px_now_ns() < until) {
        for (int i = 0; i < N_HOSTILE; i++)
            if (socks[i] >= 0 && send(socks[i], "X", 1, MSG_NOSIGNAL) <= 0) {
                close(socks[i]);
                socks[i] = -1;
            }
        usleep(1000000);
    }
    return NULL;
}

static void under_hostile_connections(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    static int socks[N_HOSTILE];
    usleep(200000);
    for (int i = 0; i < N_HOSTILE; i++) {
        socks[i] = hostile_connect(i);
        struct pollfd p = {socks[i], POLLOUT, 0};
        if (socks[i] >= 0 && poll(&p, 1, 1000) == 1)
            send(socks[i], "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n", 33, MSG_NOSIGNAL);
    }
    usleep(300000);
    int held = 0;
    for (int i = 0; i < N_HOSTILE; i++) {
        char b;
        if (socks[i] < 0)
            continue;
        ssize_t r = recv(socks[i], &b, 1, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
            close(socks[i]);
            socks[i] = -1;
        } else
            held++;
    }
    pthread_t trickle;
    pthread_create(&trickle, NULL, trickle_main, socks);
    char what[160];
    snprintf(what, sizeof what,
             "API with %d hostile connections opened (half-open, trickling, from 8 addresses; "
             "%d held by the server)",
             N_HOSTILE, held);
    run_legit(what, -1);
    pthread_join(trickle, NULL);
    for (int i = 0; i < N_HOSTILE; i++)
        if (socks[i] >= 0)
            close(socks[i]);
}

static size_t read_zero(char *buf, size_t size, size_t n, void *ud)
{
    size_t *left = ud, take = PX_MIN(size * n, *left);
    memset(buf, 'u', take);
    *left -= take;
    return take;
}

static atomic_int uploading;

static void *upload_main(void *arg)
{
    (void)arg;
    CURL *c = curl_easy_init();
    char url[200], auth[200];
    snprintf(url, sizeof url, "%s/v1/blobs", base);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", USER_TOKEN);
    struct curl_slist *h = curl_slist_append(NULL, auth);
    h = curl_slist_append(h, "Expect:");
    int n = 0;
    while (atomic_load(&uploading)) {
        size_t left = (size_t)60 << 20;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, read_zero);
        curl_easy_setopt(c, CURLOPT_READDATA, &left);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)left);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        px_strbuf out = PX_STRBUF_INIT;
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
        if (curl_easy_perform(c) == CURLE_OK)
            n++;
        px_strbuf_release(&out);
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    printf("  (%d uploads of 60 MB completed meanwhile)\n", n);
    return NULL;
}

static void during_uploads(void)
{
    pthread_t up;
    atomic_store(&uploading, 1);
    pthread_create(&up, NULL, upload_main, NULL);
    usleep(200000);
    run_legit("API while 60 MB uploads stream in", -1);
    atomic_store(&uploading, 0);
    pthread_join(up, NULL);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void)
{
    char dir[] = "/tmp/plexus-bench-api-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    px_fleet_server_options o = {.listen = "127.0.0.1:0",
                                 .data_dir = dir,
                                 .cluster_token = AGENT_TOKEN,
                                 .api_token = USER_TOKEN,
                                 .lease_s = 30};
    px_fleet_server *srv;
    px_err err;
    if (px_fleet_server_start(&o, &srv, &err) != PX_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    snprintf(base, sizeof base, "%s", px_fleet_server_url(srv));
    port = px_fleet_server_port(srv);
    pthread_t agents[N_AGENTS];
    for (int k = 0; k < N_AGENTS; k++)
        pthread_create(&agents[k], NULL, agent_main, (void *)(intptr_t)k);
    submit_to_start();
    paced_load();
    under_hostile_connections();
    during_uploads();
    stop_agents = 1;
    for (int k = 0; k < N_AGENTS; k++)
        pthread_join(agents[k], NULL);
    px_fleet_server_stop(srv);
    curl_global_cleanup();
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
