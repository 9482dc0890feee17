/*
 * Deploying a model across the fleet on loopback: a server in this
 * process and three `plexus agent` processes (emulated accelerators), the
 * tiny model of the shared models uploaded once.  Each round deploys it
 * under a new name with llama.cpp's split (a stage on every node) and
 * ends it.  Figures: the deploy request (checks, two planner runs when
 * some nodes are warm, the durable write) and the time until every node
 * of the plan reports the model resident: cold (the first deployment:
 * each agent fetches the model from the blob store and verifies it) and
 * warm (later ones: already held); deploy to first token (the stage
 * workers started on the agents and a one-token completion answered
 * through the server's route), cold and warm; and after the rounds, the
 * loss of a node: the agent of a stage of the last deployment is killed
 * while a long completion runs, and the incident's recovery time (RTO)
 * and the time from the kill until that completion returns are printed.
 * Bounded (ROUNDS, 60 s); 127.0.0.1 only.
 *
 *     bench_fleet_deploy [ROUNDS]        (default 20)
 */
#include "base/common.h"

#include "plexus/fleet.h"

#include "bench_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_AGENTS 3
#define LIMIT_S  60

/* The deployment's state, polled until `want` (ms waited) or -1. */
static double wait_state(px_fleet_client *c, const char *name, const char *want, uint64_t t0)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/deployments/%s", name);
    while (px_now_ns() - t0 < (uint64_t)LIMIT_S * 1000000000ull) {
        json_t *r = NULL;
        if (px_fleet_client_call(c, "GET", path, NULL, NULL, &r, NULL) == PX_OK) {
            const char *st = json_string_value(json_object_get(r, "state"));
            bool done = st && !strcmp(st, want);
            json_decref(r);
            if (done)
                return (double)(px_now_ns() - t0) / 1e6;
        }
        bench_sleep_ms(5);
    }
    return -1;
}

/* Completes one token of deployment name through the route, retrying
 * while its front end starts; ms from t0, or -1. */
static double first_token(px_fleet_client *c, const char *name, uint64_t t0)
{
    json_t *body = json_pack("{s:s, s:s, s:i, s:i}", "model", name, "prompt", "Once", "max_tokens",
                             1, "temperature", 0);
    double ms = -1;
    while (body && px_now_ns() - t0 < (uint64_t)LIMIT_S * 1000000000ull) {
        json_t *r = NULL;
        long code = 0;
        px_status st = px_fleet_client_call(c, "POST", "/v1/completions", body, &code, &r, NULL);
        json_decref(r);
        if (st == PX_OK) {
            ms = (double)(px_now_ns() - t0) / 1e6;
            break;
        }
        bench_sleep_ms(5);
    }
    json_decref(body);
    return ms;
}

typedef struct long_call {
    px_fleet_client *c;
    const char *name;
    px_status st;
    uint64_t end_ns;
} long_call;

static void *long_main(void *arg)
{
    long_call *l = arg;
    json_t *body =
        json_pack("{s:s, s:s, s:i, s:i, s:b}", "model", l->name, "prompt", "Once upon a time",
                  "max_tokens", 400, "temperature", 0, "ignore_eos", 1);
    json_t *r = NULL;
    l->st = body ? px_fleet_client_call(l->c, "POST", "/v1/completions", body, NULL, &r, NULL)
                 : PX_ENOMEM;
    l->end_ns = px_now_ns();
    json_decref(r);
    json_decref(body);
    return NULL;
}

static int online(px_fleet_client *c)
{
    json_t *r = NULL;
    int n = 0;
    if (px_fleet_client_call(c, "GET", "/v1/nodes", NULL, NULL, &r, NULL) == PX_OK) {
        size_t k;
        json_t *v;
        json_array_foreach(json_object_get(r, "nodes"), k, v)
        {
            const char *st = json_string_value(json_object_get(v, "state"));
            n += st && !strcmp(st, "online");
        }
    }
    json_decref(r);
    return n;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 20;
    if (rounds < 1 || rounds > 10000) {
        fprintf(stderr, "usage: bench_fleet_deploy [ROUNDS 1..10000]\n");
        return 2;
    }
    px_log_set_level(PX_LOG_ERROR);
    char model[600];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", PX_SHARED_DIR);
    if (access(model, R_OK) != 0) {
        printf("bench_fleet_deploy: skipped: %s is absent\n", model);
        return 0;
    }
    char plexus[PATH_MAX];
    if (!bench_plexus_bin(plexus, sizeof plexus)) {
        fprintf(stderr, "bench_fleet_deploy: cannot name the plexus binary; set PLEXUS_BIN\n");
        return 1;
    }
    char dir[] = "/tmp/plexus-bench-deploy-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    chmod(dir, 0755);
    char data[600], join[600];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(join, sizeof join, "%s/join", dir);
    const char *ctok = "bench-cluster-token-0123456789", *utok = "bench-user-token-0123456789";
    px_err err;
    if (px_write_file(join, ctok, strlen(ctok), &err) != PX_OK || chmod(join, 0600) != 0) {
        fprintf(stderr, "bench_fleet_deploy: %s\n", err.msg);
        return 1;
    }
    px_fleet_server_options opt = {
        .listen = "127.0.0.1:0", .data_dir = data, .cluster_token = ctok, .api_token = utok};
    px_fleet_server *srv;
    if (px_fleet_server_start(&opt, &srv, &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_deploy: %s\n", err.msg);
        return 1;
    }
    pid_t agents[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        char name[32], inv[640], work[640], log[640];
        snprintf(name, sizeof name, "node-%d", i);
        snprintf(inv, sizeof inv, "%s/%s.json", dir, name);
        snprintf(work, sizeof work, "%s/work-%d", dir, i);
        snprintf(log, sizeof log, "%s/agent-%d.log", dir, i);
        char *text = px_asprintf(
            "{\"schema\": \"plexus.inventory/1\", \"emulated\": true, \"nodes\": [{\"id\": \"%s\", "
            "\"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"64 GiB\", "
            "\"bandwidth\": \"100 GB/s\"}], \"devices\": [{\"id\": \"gpu0\", \"class\": \"gpu\", "
            "\"vendor\": \"nvidia\", \"model\": \"tiny\", \"backend\": \"emu\", \"emu\": "
            "{\"compute_slowdown\": 1, \"memory_slowdown\": 1, \"jitter\": 0, \"seed\": 1}, "
            "\"compute\": "
            "{\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": \"hbm\", \"kind\": \"hbm\", "
            "\"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}]}]}",
            name);
        if (!text || px_write_file(inv, text, strlen(text), &err) != PX_OK) {
            fprintf(stderr, "bench_fleet_deploy: %s\n", inv);
            return 1;
        }
        free(text);
        agents[i] =
            bench_start_agent(plexus, px_fleet_server_url(srv), join, NULL, inv, name, work, log);
    }
    int rc = 1;
    px_fleet_client *c = NULL;
    double *plan_ms = calloc((size_t)rounds, sizeof *plan_ms);
    double *ready_ms = calloc((size_t)rounds, sizeof *ready_ms);
    double *token_ms = calloc((size_t)rounds, sizeof *token_ms);
    json_t *up = NULL;
    if (!plan_ms || !ready_ms || !token_ms ||
        px_fleet_client_new(px_fleet_server_url(srv), utok, &c, &err) != PX_OK)
        goto done;
    for (int i = 0; i < 600 && online(c) < N_AGENTS; i++)
        bench_sleep_ms(50);
    if (online(c) < N_AGENTS) {
        fprintf(stderr, "bench_fleet_deploy: the agents did not come online\n");
        goto done;
    }
    if (px_fleet_client_send_file(c, "POST", "/v1/blobs", model, NULL, &up, &err) != PX_OK) {
        fprintf(stderr, "bench_fleet_deploy: upload: %s\n", err.msg);
        goto done;
    }
    const char *digest = json_string_value(json_object_get(up, "digest"));
    long n = 0;
    uint64_t t_begin = px_now_ns();
    for (; n < rounds && px_now_ns() - t_begin < (uint64_t)LIMIT_S * 1000000000ull; n++) {
        char name[32], path[96];
        snprintf(name, sizeof name, "bench-%ld", n);
        json_t *body =
            json_pack("{s:s, s:s, s:s}", "name", name, "model", digest, "policy", "llamacpp");
        uint64_t t0 = px_now_ns();
        json_t *r = NULL;
        px_status st = px_fleet_client_call(c, "POST", "/v1/deployments", body, NULL, &r, &err);
        json_decref(body);
        json_decref(r);
        if (st != PX_OK) {
            fprintf(stderr, "bench_fleet_deploy: deploy: %s\n", err.msg);
            goto done;
        }
        plan_ms[n] = (double)(px_now_ns() - t0) / 1e6;
        if ((ready_ms[n] = wait_state(c, name, "resident", t0)) < 0) {
            fprintf(stderr, "bench_fleet_deploy: %s never became resident\n", name);
            goto done;
        }
        if ((token_ms[n] = first_token(c, name, t0)) < 0) {
            fprintf(stderr, "bench_fleet_deploy: %s never answered a completion\n", name);
            goto done;
        }
        /* Each round ends its deployment; the one before stays while
         * the next starts, so the model stays held and later rounds are
         * warm. */
        if (n > 0) {
            snprintf(path, sizeof path, "/v1/deployments/bench-%ld", n - 1);
            if (px_fleet_client_call(c, "DELETE", path, NULL, NULL, NULL, &err) != PX_OK) {
                fprintf(stderr, "bench_fleet_deploy: undeploy: %s\n", err.msg);
                goto done;
            }
        }
    }
    printf("deploy across %d agents on loopback (tiny model, llamacpp split: a stage per node)\n",
           N_AGENTS);
    printf("  cold (each agent fetches and verifies the model): request %.2f ms, resident on "
           "every node after %.1f ms\n"
           "    (of which up to a heartbeat of 2.5 s until an agent learns of the model; it "
           "reports it at once when held)\n",
           plan_ms[0], ready_ms[0]);
    if (n > 1) {
        qsort(plan_ms + 1, (size_t)(n - 1), sizeof *plan_ms, bench_cmp_double);
        qsort(ready_ms + 1, (size_t)(n - 1), sizeof *ready_ms, bench_cmp_double);
        printf("  warm, %ld deployments: request p50 %.2f ms (max %.2f), resident p50 %.2f ms "
               "(max %.2f)\n",
               n - 1, plan_ms[1 + (n - 1) / 2], plan_ms[n - 1], ready_ms[1 + (n - 1) / 2],
               ready_ms[n - 1]);
        printf("  ratio cold/warm to resident: %.1fx\n", ready_ms[0] / ready_ms[1 + (n - 1) / 2]);
    }
    printf("  deploy to first token (stage workers started on the agents, a completion "
           "through the server's route): cold %.1f ms",
           token_ms[0]);
    if (n > 1) {
        qsort(token_ms + 1, (size_t)(n - 1), sizeof *token_ms, bench_cmp_double);
        printf(", warm p50 %.1f ms (max %.1f)", token_ms[1 + (n - 1) / 2], token_ms[n - 1]);
    }
    printf("\n");
    /* A node lost mid-completion: the agent of stage 1 of the last
     * deployment is killed. */
    char last[32], path[96];
    snprintf(last, sizeof last, "bench-%ld", n - 1);
    snprintf(path, sizeof path, "/v1/deployments/%s", last);
    json_t *d = NULL;
    const char *victim = NULL;
    if (px_fleet_client_call(c, "GET", path, NULL, NULL, &d, &err) == PX_OK) {
        size_t k;
        json_t *w;
        json_array_foreach(json_object_get(json_object_get(d, "serving"), "stage_workers"), k, w)
        {
            if (json_integer_value(json_object_get(w, "stage")) == 1)
                victim = json_string_value(json_object_get(w, "node"));
        }
    }
    int vi = victim ? (int)strtol(victim + 5, NULL, 10) : -1;
    px_fleet_client *c2 = NULL;
    if (vi >= 0 && vi < N_AGENTS &&
        px_fleet_client_new(px_fleet_server_url(srv), utok, &c2, &err) == PX_OK) {
        long_call l = {c2, last, PX_OK, 0};
        pthread_t th;
        if (pthread_create(&th, NULL, long_main, &l) == 0) {
            bench_sleep_ms(30);
            uint64_t t_kill = px_now_ns();
            kill(agents[vi], SIGKILL);
            waitpid(agents[vi], NULL, 0);
            agents[vi] = -1;
            pthread_join(th, NULL);
            /* A completion that ended before the kill left the ring idle:
             * the next one meets the loss and heals it. */
            double next_ms = first_token(c, last, t_kill);
            double rto = -1;
            for (int tries = 0; tries < 100 && rto < 0; tries++) {
                json_t *d2 = NULL;
                if (px_fleet_client_call(c, "GET", path, NULL, NULL, &d2, NULL) == PX_OK) {
                    const json_t *inc = json_array_get(json_object_get(d2, "incidents"), 0);
                    if (json_is_number(json_object_get(inc, "rto_s")))
                        rto = json_number_value(json_object_get(inc, "rto_s"));
                }
                json_decref(d2);
                if (rto < 0)
                    bench_sleep_ms(50);
            }
            if (l.st == PX_OK && rto >= 0)
                printf("  node loss (%s killed %s): RTO %.1f ms (the incident's: detection to "
                       "the first token on the new stages), the long completion returned %.1f "
                       "ms after the kill, the next one-token completion %.1f ms after the kill\n",
                       victim, l.end_ns > t_kill ? "mid-completion" : "after the completion",
                       rto * 1e3, (double)(l.end_ns - t_kill) / 1e6, next_ms);
            else
                printf("  node loss: not measured (%s)\n",
                       l.st != PX_OK ? "the completion failed" : "no incident recorded");
        }
        px_fleet_client_free(c2);
    }
    json_decref(d);
    rc = 0;
done:
    json_decref(up);
    free(plan_ms);
    free(ready_ms);
    free(token_ms);
    px_fleet_client_free(c);
    for (int i = 0; i < N_AGENTS; i++)
        if (agents[i] > 0)
            kill(-agents[i], SIGTERM);
    for (int i = 0; i < N_AGENTS; i++)
        if (agents[i] > 0) {
            for (int k = 0; k < 100 && waitpid(agents[i], NULL, WNOHANG) == 0; k++)
                bench_sleep_ms(20);
            kill(-agents[i], SIGKILL);
            waitpid(agents[i], NULL, WNOHANG);
        }
    px_fleet_server_stop(srv);
    bench_rm_tree(dir);
    return rc;
}
