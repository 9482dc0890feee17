/* Stage workers of deployments on this node: the server orders them
 * (the "stages" of an assignments poll's reply: start with the worker's
 * command line and the deployment's secret, or stop), this thread runs
 * them through the local launcher, listening on the node's address, and
 * answers with the address each worker bound, or why it did not start.
 * The model comes from the cache (fetched and verified first when it is
 * not there), never from the server's path in the command line.  The
 * secret goes to the worker's standard input and is wiped here at once.
 * Workers are forked by this long-lived thread, so that they die with the
 * agent (their parent-death signal follows the thread that forked them);
 * their ends go to the server with the next heartbeat. */
#include "fleet/agent_impl.h"
#include "plexus/rt.h"

#include <openssl/crypto.h>

typedef struct stage_run {
    struct stage_run *next;
    json_int_t id;
    char digest[72];
    void *handle;
    bool ended;
} stage_run;

void px__agent_stages_order(px__agent *a, const json_t *orders)
{
    if (!json_array_size(orders))
        return;
    pthread_mutex_lock(&a->mu);
    if (!a->stage_orders)
        a->stage_orders = json_array();
    size_t i;
    json_t *o;
    json_array_foreach(orders, i, o) json_array_append(a->stage_orders, o);
    pthread_mutex_unlock(&a->mu);
}

json_t *px__agent_stages_ended(px__agent *a)
{
    pthread_mutex_lock(&a->mu);
    json_t *r = a->stage_ended ? json_deep_copy(a->stage_ended) : json_array();
    pthread_mutex_unlock(&a->mu);
    return r;
}

void px__agent_stages_acked(px__agent *a, const json_t *sent)
{
    pthread_mutex_lock(&a->mu);
    for (size_t k = 0; k < json_array_size(sent); k++) {
        json_int_t id = json_integer_value(json_object_get(json_array_get(sent, k), "id"));
        for (size_t j = 0; j < json_array_size(a->stage_ended); j++)
            if (json_integer_value(json_object_get(json_array_get(a->stage_ended, j), "id")) ==
                id) {
                json_array_remove(a->stage_ended, j);
                break;
            }
    }
    pthread_mutex_unlock(&a->mu);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Reads the hex secret of an order; false when it is malformed. */
static bool secret_of(const char *hex, uint8_t out[PX_RT_SECRET_MAX], size_t *len)
{
    size_t n = hex ? strlen(hex) : 0;
    if (n % 2 || n / 2 < PX_RT_SECRET_MIN || n / 2 > PX_RT_SECRET_MAX)
        return false;
    for (size_t k = 0; k < n / 2; k++) {
        int hi = hexval(hex[2 * k]), lo = hexval(hex[2 * k + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[k] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return true;
}

static void post_report(px__agent *a, px_fleet_client *c, unsigned *gen, json_t *report)
{
    json_t *body = json_pack("{s:[o]}", "reports", report);
    long code = 0;
    json_t *reply = NULL;
    px_err err;
    px__agent_sync(a, c, gen);
    if (!body ||
        px_fleet_client_call(c, "POST", "/v1/agent/stages", body, &code, &reply, &err) != PX_OK)
        px_log_warn("agent: stage report: %s", body ? err.msg : "out of memory");
    json_decref(reply);
    json_decref(body);
}

/* Starts the worker of one order; returns its run (NULL when it failed,
 * after telling the server why). */
static stage_run *start_one(px__agent *a, px_fleet_client *c, unsigned *gen,
                            px_rt_local_launcher *l, const json_t *o)
{
    json_int_t id = json_integer_value(json_object_get(o, "id"));
    const char *digest = json_string_value(json_object_get(o, "digest"));
    const char *dep = json_string_value(json_object_get(o, "deployment"));
    const json_t *argv = json_object_get(o, "argv");
    json_t *secret_v = json_object_get(o, "secret");
    uint8_t secret[PX_RT_SECRET_MAX];
    size_t secret_len = 0;
    bool secret_ok = secret_of(json_string_value(secret_v), secret, &secret_len);
    px_err err;
    px_err_clear(&err);
    px_status st = PX_OK;
    px_rt_worker_argv av = {0};
    char *model = NULL;
    stage_run *run = NULL;
    if (!digest || !dep || !secret_ok || !json_is_array(argv) ||
        json_array_size(argv) > PX_RT_WORKER_MAX_ARGS) {
        st = px_err_set(&err, PX_EINVAL, "malformed stage order");
    } else if ((st = px__agent_fetch_and_hold(a, c, digest, NULL, &err)) == PX_OK) {
        st = px_fleet_cache_acquire(a->cache, digest, &model, &err);
        px_fleet_cache_release(a->cache, digest); /* the hold of fetch_and_hold */
    }
    for (size_t k = 0; st == PX_OK && k < json_array_size(argv); k++) {
        const char *s = json_string_value(json_array_get(argv, k));
        /* The model is this node's copy, whatever path the server has. */
        const char *prev = k > 0 ? json_string_value(json_array_get(argv, k - 1)) : NULL;
        if (prev && !strcmp(prev, "--model"))
            s = model;
        char *d = s ? px_strdup(s) : NULL;
        if (!d) {
            st = px_err_set(&err, PX_EINVAL, "malformed stage order");
            break;
        }
        av.argv[av.argc++] = d;
    }
    char addr[128] = "";
    void *handle = NULL;
    if (st == PX_OK) {
        /* The worker is the agent's own child, not a job's: the sweep of
         * escaped processes must leave it alone. */
        const px_rt_launcher *li = px_rt_local_launcher_iface(l);
        px__proc_sweep_pause(true);
        st = li->start(li->ctx, (uint32_t)json_integer_value(json_object_get(o, "stage")), &av,
                       secret, secret_len, addr, sizeof addr, &handle, &err);
        if (st == PX_OK)
            px__proc_keep((pid_t)px_rt_local_launcher_pid(l, handle), true);
        px__proc_sweep_pause(false);
    }
    OPENSSL_cleanse(secret, sizeof secret);
    px_rt_worker_args_release(&av);
    if (st == PX_OK && (run = calloc(1, sizeof *run)) != NULL) {
        run->id = id;
        run->handle = handle;
        px_strlcpy(run->digest, digest, sizeof run->digest);
        px_log_info("agent: deployment %s: stage %lld listens at %s", dep,
                    (long long)json_integer_value(json_object_get(o, "stage")), addr);
        post_report(a, c, gen, json_pack("{s:I, s:s}", "id", id, "address", addr));
    } else {
        if (st == PX_OK) {
            const px_rt_launcher *li = px_rt_local_launcher_iface(l);
            li->stop(li->ctx, handle);
            px_err_set(&err, PX_ENOMEM, "out of memory");
        }
        if (model && digest)
            px_fleet_cache_release(a->cache, digest);
        px_log_warn("agent: deployment %s: stage not started: %s", dep ? dep : "?", err.msg);
        post_report(a, c, gen, json_pack("{s:I, s:s}", "id", id, "error", err.msg));
    }
    free(model);
    return run;
}

static void end_run(px__agent *a, px_rt_local_launcher *l, stage_run *r, px_rt_stage_state s,
                    int code, const char *detail)
{
    const px_rt_launcher *li = px_rt_local_launcher_iface(l);
    px__proc_keep((pid_t)px_rt_local_launcher_pid(l, r->handle), false);
    li->stop(li->ctx, r->handle);
    r->handle = NULL;
    r->ended = true;
    px_fleet_cache_release(a->cache, r->digest);
    json_t *rep =
        json_pack("{s:I, s:s, s:i, s:s}", "id", r->id, "state",
                  s == PX_RT_STAGE_KILLED ? "killed" : "exited", "code", code, "detail", detail);
    pthread_mutex_lock(&a->mu);
    if (!a->stage_ended)
        a->stage_ended = json_array();
    json_array_append_new(a->stage_ended, rep);
    pthread_mutex_unlock(&a->mu);
}

void *px__agent_stages_main(void *arg)
{
    px__agent *a = arg;
    px_fleet_client *c;
    unsigned gen;
    px_err err;
    px_rt_local_launcher *l = NULL;
    const char *host = a->cfg->address ? a->cfg->address : "127.0.0.1";
    if (!a->cache || px__agent_client(a, &c, &gen, &err) != PX_OK) {
        if (a->cache)
            px_log_error("agent: stage workers: %s", err.msg);
        return NULL;
    }
    if (px_rt_local_launcher_new(NULL, host, 0, &l, &err) != PX_OK) {
        px_log_error("agent: stage workers cannot start here: %s", err.msg);
        px_fleet_client_free(c);
        return NULL;
    }
    px_fleet_client_set_abort(c, &a->stopping);
    stage_run *runs = NULL;
    const px_rt_launcher *li = px_rt_local_launcher_iface(l);
    while (!atomic_load(&a->stopping)) {
        pthread_mutex_lock(&a->mu);
        json_t *orders = a->stage_orders;
        a->stage_orders = NULL;
        pthread_mutex_unlock(&a->mu);
        size_t i;
        json_t *o;
        json_array_foreach(orders, i, o)
        {
            const char *op = json_string_value(json_object_get(o, "op"));
            json_int_t id = json_integer_value(json_object_get(o, "id"));
            if (op && !strcmp(op, "start")) {
                stage_run *r = start_one(a, c, &gen, l, o);
                if (r) {
                    r->next = runs;
                    runs = r;
                }
            } else if (op && !strcmp(op, "stop")) {
                for (stage_run *r = runs; r; r = r->next)
                    if (r->id == id && !r->ended)
                        end_run(a, l, r, PX_RT_STAGE_EXITED, 0, "stopped by the server");
            }
        }
        /* Scrub the secrets of the orders before they are freed. */
        json_array_foreach(orders, i, o)
        {
            json_t *s = json_object_get(o, "secret");
            if (json_is_string(s))
                OPENSSL_cleanse((char *)json_string_value(s), json_string_length(s));
        }
        json_decref(orders);
        for (stage_run **p = &runs; *p;) {
            stage_run *r = *p;
            if (!r->ended) {
                int code = 0;
                char detail[384];
                px_rt_stage_state s = li->health(li->ctx, r->handle, &code, detail, sizeof detail);
                if (s == PX_RT_STAGE_KILLED || s == PX_RT_STAGE_EXITED) {
                    px_log_info("agent: stage worker %lld %s", (long long)r->id, detail);
                    end_run(a, l, r, s, code, detail);
                }
            }
            if (r->ended) {
                *p = r->next;
                free(r);
            } else {
                p = &r->next;
            }
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    while (runs) {
        stage_run *r = runs;
        runs = r->next;
        if (!r->ended)
            px_fleet_cache_release(a->cache, r->digest);
        free(r);
    }
    px_rt_local_launcher_free(l);
    px_fleet_client_free(c);
    return NULL;
}
