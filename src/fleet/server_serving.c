/* The serving front end of each deployment, on the server.
 *
 * Once a deployment's model is resident on every node of its plan, the
 * server starts `plexus serve`'s front end for it (px_serve: the
 * generation engine, its sequence scheduler and the healing supervisor)
 * over stage workers that the fleet launcher (server_stages.c) has the
 * agents start, linked over TCP across the nodes with the deployment's
 * secret.  The front end listens on 127.0.0.1 with a key of its own that
 * only the server knows; the server routes the OpenAI API to it by the
 * request's "model" (the deployment's name), for the deployment's owner
 * (and admins) only, streaming server-sent events through as they come.
 * A thread of the server keeps the deployments' state, stages and
 * incidents in the store as the front end reports them. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>
#include <openssl/crypto.h>

#define TICK_MS 200
/* A front end that did not start is tried again after this long. */
#define RETRY_NS 5000000000ull
/* The front end's figures are read this often. */
#define STATUS_NS 500000000ull

struct px__serving {
    struct px__serving *next;
    char name[PX__NAME_MAX + 1];
    char owner[PX__NAME_MAX + 1];
    char digest[72];
    char state[32]; /* starting, serving, degraded, failed */
    char detail[512];
    char key[2 * PX_RT_SECRET_BYTES + 1];
    char addr[64];                      /* the front end's HOST:PORT */
    char back[80];                      /* where its executors listen for their last stage */
    uint8_t secret[PX_RT_SECRET_BYTES]; /* the deployment's: its stage workers' */
    px_serve *serve;
    px__fleet_launcher *launcher;
    px_hw_graph *graph;
    json_t *inventory, *plan, *spec; /* spec: the request (its strings live in `request`) */
    px_ir_model *model;
    px_contract *contract;
    json_t *incidents; /* the front end's, last read */
    json_t *stages;    /* the front end's replicas, last read */
    uint64_t retry_ns, status_ns, observed_ns;
    px_serve_figures served;   /* the front end's figures at the last observation */
    uint64_t served_ns;        /* when they were read; 0 not yet */
    size_t incidents_recorded; /* the front end's incidents already stored as records */
    int refs;                  /* requests being routed to it */
    bool gone;
    bool busy;    /* its front end is being started */
    bool polling; /* its figures are being read */
};

static void serving_release(px__serving *s)
{
    px_serve_free(s->serve);
    px__fleet_launcher_free(s->launcher);
    px_hw_graph_free(s->graph);
    json_decref(s->inventory);
    json_decref(s->plan);
    json_decref(s->spec);
    px_ir_model_free(s->model);
    px_contract_free(s->contract);
    json_decref(s->incidents);
    json_decref(s->stages);
    OPENSSL_cleanse(s->key, sizeof s->key);
    OPENSSL_cleanse(s->secret, sizeof s->secret);
    s->serve = NULL;
    s->launcher = NULL;
    s->graph = NULL;
    s->inventory = s->plan = s->spec = s->incidents = s->stages = NULL;
    s->model = NULL;
    s->contract = NULL;
}

static px__serving *find(px_fleet_server *srv, const char *name)
{
    for (px__serving *s = srv->serving; s; s = s->next)
        if (!strcmp(s->name, name) && !s->gone)
            return s;
    return NULL;
}

/* ---- starting a front end (outside the server lock) ---- */

/* Starts s's front end: the plan of the record, the fleet's inventory
 * (inventory: new reference, taken), the model file of the blob store. */
static px_status start_front(px_fleet_server *srv, px__serving *s, json_t *spec, json_t *inventory,
                             const char *host, px_err *err)
{
    char path[PATH_MAX];
    s->inventory = inventory;
    s->spec = spec;
    px_status st = px__blob_path(srv->data_dir, s->digest, path, sizeof path, err);
    if (st == PX_OK)
        st = px_hw_graph_from_value(inventory, "fleet inventory", NULL, &s->graph, NULL, err);
    if (st == PX_OK)
        st = px_ir_model_open(path, NULL, &s->model, err);
    if (st == PX_OK)
        st = px__srv_open_contract(json_object_get(spec, "contract"), &s->contract, err);
    if (st == PX_OK)
        st = px__fleet_launcher_new(srv, s->name, s->digest, inventory, &s->launcher, err);
    uint8_t key[PX_RT_SECRET_BYTES];
    if (st == PX_OK && (st = px_rt_secret_new(s->secret, err)) == PX_OK &&
        (st = px_rt_secret_new(key, err)) == PX_OK)
        px_rt_secret_hex(key, sizeof key, s->key);
    if (st == PX_OK) {
        px_plan_request req;
        px_plan_request_default(&req);
        /* The heal loop plans with it: its stage workers run one device
         * per stage, as the deployment's plan (server_plan.c). */
        req.max_tp = 1;
        req.graph = s->graph;
        req.model = s->model;
        req.contract = s->contract;
        const char *objective = json_string_value(json_object_get(spec, "objective"));
        const char *policy = json_string_value(json_object_get(spec, "policy"));
        if (policy)
            req.policy = policy;
        if (objective)
            st = px_plan_objective_parse(objective, &req.objective, err);
        px_serve_opts so = {
            .model_path = path,
            .model_name = s->name,
            .listen = "127.0.0.1:0",
            .api_key = s->key,
            .plan = json_object_get(s->plan, "plan"),
            .graph = s->graph,
            .inventory_doc = inventory,
            .request = req,
            .heal = true,
        };
        /* The last stage connects back to the server where the agents
         * reach it. */
        snprintf(s->back, sizeof s->back, "tcp:%s:0", host);
        so.executor.listen = s->back; /* kept: every executor of the heal loop reads it */
        so.executor.launcher = px__fleet_launcher_iface(s->launcher);
        so.executor.transport = PX_RT_TRANSPORT_TCP;
        /* Kept: the heal loop's later executors use it too. */
        so.executor.secret = s->secret;
        so.executor.secret_len = sizeof s->secret;
        if (st == PX_OK)
            st = px_serve_new(&so, &s->serve, err);
        if (st == PX_OK)
            px_strlcpy(s->addr, px_serve_address(s->serve), sizeof s->addr);
    }
    OPENSSL_cleanse(key, sizeof key);
    return st;
}

/* ---- the thread ---- */

typedef struct wanted {
    json_t *rows; /* [{"name", "owner", "model", "state", "spec", "plan"}] */
} wanted;

static void collect_row(const px__deploy_row *row, void *ud)
{
    wanted *w = ud;
    json_array_append_new(w->rows, json_pack("{s:s, s:s?, s:s, s:s, s:s?, s:s?}", "name", row->name,
                                             "owner", row->owner, "model", row->model, "state",
                                             row->state, "spec", row->spec, "plan", row->plan));
}

/* Writes the front end's state and incidents into the deployment's row
 * when they changed.  Server lock held. */
static void store_state(px_fleet_server *srv, px__serving *s)
{
    px__deploy_row row;
    px_err err;
    if (srv->store.ops->get_deployment(srv->store.self, s->name, &row, &err) != PX_OK)
        return;
    char *inc = s->incidents ? json_dumps(s->incidents, JSON_COMPACT) : NULL;
    bool same =
        !strcmp(row.state, s->state) && (!inc || (row.incidents && !strcmp(row.incidents, inc)));
    if (!same) {
        free(row.state);
        row.state = px_strdup(s->state);
        if (inc) {
            free(row.incidents);
            row.incidents = inc;
            inc = NULL;
        }
        row.updated = px_wall_time();
        if (row.state && srv->store.ops->put_deployment(srv->store.self, &row, true, &err) != PX_OK)
            px_log_warn("fleet: deployment %s: state not stored: %s", s->name, err.msg);
    }
    free(inc);
    px__deploy_row_release(&row);
}

/* Reads the front end's health (replicas, stages) and incidents. */
static void read_status(px__serving *s, json_t **status, json_t **incidents)
{
    *status = *incidents = NULL;
    char url[96];
    snprintf(url, sizeof url, "http://%s", s->addr);
    px_fleet_client *c;
    px_err err;
    if (px_fleet_client_new(url, s->key, &c, &err) != PX_OK)
        return;
    px_fleet_client_set_timeout(c, 2000);
    long code = 0;
    if (px_fleet_client_call(c, "GET", "/health", NULL, &code, status, &err) != PX_OK) {
        json_decref(*status);
        *status = NULL;
    }
    if (px_fleet_client_call(c, "GET", "/incidents", NULL, &code, incidents, &err) != PX_OK) {
        json_decref(*incidents);
        *incidents = NULL;
    }
    px_fleet_client_free(c);
}

static json_t *quantiles(const px_serve_figures *now, const uint64_t *was, const uint64_t *is)
{
    uint64_t d[PX_SERVE_BUCKETS + 1];
    for (size_t i = 0; i <= PX_SERVE_BUCKETS; i++)
        d[i] = is[i] - was[i];
    double p50 = px_serve_figures_quantile(now->bounds, d, 0.50);
    double p99 = px_serve_figures_quantile(now->bounds, d, 0.99);
    return isnan(p50) ? NULL : json_pack("{s:f, s:f}", "p50", p50, "p99", p99);
}

/* The whole front end's figures over the window since the last reading:
 * tokens/s, and TTFT and TPOT of the requests that finished in it (from
 * /metrics' histograms, so quantiles within a bucket are interpolated). */
static void report_served(px_fleet_server *srv, px__serving *s, const px__who *self)
{
    if (!s->serve)
        return;
    px_serve_figures now;
    px_serve_figures_get(s->serve, &now);
    uint64_t t = px_now_ns();
    px_serve_figures was = s->served;
    uint64_t since = s->served_ns;
    s->served = now;
    s->served_ns = t;
    bool fresh = now.completion_tokens < was.completion_tokens || now.completions < was.completions;
    for (size_t i = 0; i <= PX_SERVE_BUCKETS; i++)
        fresh = fresh || now.ttft[i] < was.ttft[i] || now.tpot[i] < was.tpot[i];
    if (!since || t <= since || fresh) /* a first reading, or a front end started again */
        return;
    double window = (double)(t - since) / 1e9;
    json_t *obs = json_pack("{s:f, s:f, s:I}", "window_s", window, "tokens_per_s",
                            (double)(now.completion_tokens - was.completion_tokens) / window,
                            "requests", (json_int_t)(now.completions - was.completions));
    json_t *ttft = quantiles(&now, was.ttft, now.ttft);
    json_t *tpot = quantiles(&now, was.tpot, now.tpot);
    if (obs && ttft)
        json_object_set_new(obs, "ttft_s", ttft);
    else
        json_decref(ttft);
    if (obs && tpot)
        json_object_set_new(obs, "tpot_s", tpot);
    else
        json_decref(tpot);
    px_err err;
    int64_t seq;
    json_t *checked = obs ? px__deploy_observation_check(obs, &err) : NULL;
    if (!checked || px__srv_deploy_record(srv, s->name, PX__RECORD_OBSERVATION, checked, self, &seq,
                                          &err) != PX_OK)
        px_log_warn("fleet: deployment %s: observation not recorded: %s", s->name,
                    obs ? err.msg : "out of memory");
    json_decref(checked);
    json_decref(obs);
}

/* Stores what the front end reported as the deployment's records (the
 * dashboard's): each new incident, and every OBSERVE_NS the running batch
 * and the queue of each replica.  Server lock held. */
#define OBSERVE_NS 5000000000ull
static void report_records(px_fleet_server *srv, px__serving *s)
{
    px__who self = {.kind = PX__WHO_USER};
    px_strlcpy(self.name, "plexus-server", sizeof self.name);
    px_err err;
    int64_t seq;
    for (; s->incidents_recorded < json_array_size(s->incidents); s->incidents_recorded++) {
        json_t *inc = json_deep_copy(json_array_get(s->incidents, s->incidents_recorded));
        json_object_del(inc, "replica"); /* the front end's numbering, not the record's */
        json_t *checked = inc ? px__deploy_incident_check(inc, &err) : NULL;
        if (!checked || px__srv_deploy_record(srv, s->name, PX__RECORD_INCIDENT, checked, &self,
                                              &seq, &err) != PX_OK)
            px_log_warn("fleet: deployment %s: incident not recorded: %s", s->name, err.msg);
        json_decref(checked);
        json_decref(inc);
    }
    if (px_now_ns() < s->observed_ns)
        return;
    s->observed_ns = px_now_ns() + OBSERVE_NS;
    report_served(srv, s, &self);
    size_t i;
    json_t *r;
    json_array_foreach(s->stages, i, r)
    {
        json_t *obs = json_pack("{s:I, s:f, s:I, s:I}", "replica",
                                json_integer_value(json_object_get(r, "index")), "window_s",
                                (double)OBSERVE_NS / 1e9, "running",
                                json_integer_value(json_object_get(r, "running")), "queued",
                                json_integer_value(json_object_get(r, "waiting")));
        json_t *checked = obs ? px__deploy_observation_check(obs, &err) : NULL;
        if (!checked || px__srv_deploy_record(srv, s->name, PX__RECORD_OBSERVATION, checked, &self,
                                              &seq, &err) != PX_OK)
            px_log_warn("fleet: deployment %s: observation not recorded: %s", s->name, err.msg);
        json_decref(checked);
        json_decref(obs);
    }
}

static void tick(px_fleet_server *srv)
{
    wanted w = {json_array()};
    px_err err;
    pthread_mutex_lock(&srv->lock);
    bool ok = w.rows && srv->store.ops->list_deployments(srv->store.self, NULL, collect_row, &w,
                                                         &err) == PX_OK;
    /* Undeployed: the front end goes (once no request is routed to it). */
    for (px__serving *s = srv->serving; ok && s; s = s->next) {
        bool listed = false;
        for (size_t k = 0; k < json_array_size(w.rows) && !listed; k++)
            listed = !strcmp(json_string_value(json_object_get(json_array_get(w.rows, k), "name")),
                             s->name);
        if (!listed)
            s->gone = true;
    }
    px__serving *drop = NULL;
    for (px__serving **p = &srv->serving; *p;) {
        px__serving *s = *p;
        if (s->gone && s->refs == 0 && !s->busy && !s->polling) {
            *p = s->next;
            s->next = drop;
            drop = s;
        } else {
            p = &s->next;
        }
    }
    /* A deployment whose model is resident on every node of its plan
     * gets its front end. */
    px__serving *start = NULL;
    json_t *start_spec = NULL, *inventory = NULL;
    char host[48] = "127.0.0.1";
    size_t k;
    json_t *r;
    json_array_foreach(w.rows, k, r)
    {
        const char *name = json_string_value(json_object_get(r, "name"));
        px__serving *s = find(srv, name);
        if (s && (s->serve || s->busy || px_now_ns() < s->retry_ns))
            continue;
        /* Residency alone decides, whatever state the row was left in. */
        px__deploy_row row = {.name = (char *)name,
                              .owner = (char *)json_string_value(json_object_get(r, "owner")),
                              .model = (char *)json_string_value(json_object_get(r, "model")),
                              .state = (char *)"planned",
                              .spec = (char *)json_string_value(json_object_get(r, "spec")),
                              .plan = (char *)json_string_value(json_object_get(r, "plan"))};
        json_t *shown = px__srv_deploy_json(srv, &row, false);
        const char *st = json_string_value(json_object_get(shown, "state"));
        bool resident = st && !strcmp(st, "resident");
        json_decref(shown);
        if (!resident || start)
            continue;
        if (!s) {
            s = calloc(1, sizeof *s);
            if (!s)
                continue;
            px_strlcpy(s->name, name, sizeof s->name);
            px_strlcpy(s->owner, row.owner ? row.owner : "", sizeof s->owner);
            px_strlcpy(s->digest, row.model, sizeof s->digest);
            s->next = srv->serving;
            srv->serving = s;
        }
        s->plan = row.plan ? json_loads(row.plan, 0, NULL) : NULL;
        start_spec = row.spec ? json_loads(row.spec, 0, NULL) : NULL;
        inventory = px__srv_fleet_inventory(srv);
        px_strlcpy(host, srv->stage_host[0] ? srv->stage_host : "127.0.0.1", sizeof host);
        px_strlcpy(s->state, "starting", sizeof s->state);
        s->busy = true;
        start = s;
        store_state(srv, s);
    }
    /* Front ends whose figures are due. */
    px__serving *poll_list[16];
    size_t n_poll = 0;
    for (px__serving *s = srv->serving; s; s = s->next)
        if (s->serve && !s->busy && !s->gone && px_now_ns() >= s->status_ns &&
            n_poll < PX_ARRAY_LEN(poll_list)) {
            s->polling = true;
            poll_list[n_poll++] = s;
        }
    pthread_mutex_unlock(&srv->lock);
    json_decref(w.rows);

    while (drop) {
        px__serving *s = drop;
        drop = s->next;
        px_log_info("fleet: deployment %s undeployed: its front end and stage workers stop",
                    s->name);
        serving_release(s);
        free(s);
    }
    if (start) {
        uint64_t t0 = px_now_ns();
        px_status st = start_front(srv, start, start_spec, inventory, host, &err);
        pthread_mutex_lock(&srv->lock);
        start->busy = false;
        if (st == PX_OK) {
            px_strlcpy(start->state, "serving", sizeof start->state);
            start->detail[0] = 0;
            px_log_info("fleet: deployment %s serving (front end at %s, started in %.2f s)",
                        start->name, start->addr, (double)(px_now_ns() - t0) / 1e9);
        } else {
            px_strlcpy(start->state, "failed", sizeof start->state);
            px_textf(start->detail, sizeof start->detail, "%s", err.msg);
            start->retry_ns = px_now_ns() + RETRY_NS;
            px_log_warn("fleet: deployment %s: the front end did not start: %s", start->name,
                        err.msg);
        }
        store_state(srv, start);
        pthread_mutex_unlock(&srv->lock);
        if (st != PX_OK)
            serving_release(start);
    }
    for (size_t i = 0; i < n_poll; i++) {
        px__serving *s = poll_list[i];
        json_t *status, *incidents;
        read_status(s, &status, &incidents);
        pthread_mutex_lock(&srv->lock);
        s->polling = false;
        s->status_ns = px_now_ns() + STATUS_NS;
        const char *health = json_string_value(json_object_get(status, "status"));
        if (health)
            px_strlcpy(s->state,
                       !strcmp(health, "ok")         ? "serving"
                       : !strcmp(health, "degraded") ? "degraded"
                                                     : "failed",
                       sizeof s->state);
        if (status) {
            json_decref(s->stages);
            s->stages = json_incref(json_object_get(status, "replicas"));
        }
        if (json_is_array(json_object_get(incidents, "data"))) {
            json_decref(s->incidents);
            s->incidents = json_incref(json_object_get(incidents, "data"));
        }
        if (!s->gone) {
            store_state(srv, s);
            report_records(srv, s);
        }
        pthread_mutex_unlock(&srv->lock);
        json_decref(status);
        json_decref(incidents);
    }
}

static void *serving_main(void *arg)
{
    px_fleet_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        pthread_mutex_unlock(&srv->lock);
        if (atomic_load(&srv->active))
            tick(srv);
        pthread_mutex_lock(&srv->lock);
        if (!srv->stopping)
            px__srv_wait(srv, px_now_ns() + (uint64_t)TICK_MS * 1000000u);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

void px__serving_start(px_fleet_server *srv)
{
    srv->serving_thread_started =
        pthread_create(&srv->serving_thread, NULL, serving_main, srv) == 0;
    if (!srv->serving_thread_started)
        px_log_error("fleet: cannot start the deployments' front ends");
}

void px__serving_stop(px_fleet_server *srv)
{
    if (srv->serving_thread_started)
        pthread_join(srv->serving_thread, NULL);
    srv->serving_thread_started = false;
    /* Front ends end before the stage orders they use are freed. */
    while (srv->serving) {
        px__serving *s = srv->serving;
        srv->serving = s->next;
        serving_release(s);
        free(s);
    }
}

json_t *px__serving_json(px_fleet_server *srv, const char *name)
{
    px__serving *s = find(srv, name);
    if (!s)
        return NULL;
    return json_pack("{s:s, s:s, s:O?, s:o}", "state", s->state, "detail", s->detail, "replicas",
                     s->stages, "stage_workers", px__srv_stages_json(srv, name));
}

/* ---- the OpenAI route ---- */

bool px__serving_is_route(const char *method, const char *url)
{
    return (!strcmp(method, "POST") &&
            (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions"))) ||
           (!strcmp(method, "GET") && !strcmp(url, "/v1/models"));
}

/* An OpenAI-style error reply. */
static enum MHD_Result openai_error(struct MHD_Connection *conn, unsigned status, const char *type,
                                    const char *fmt, ...) PX_PRINTF(4, 5);
static enum MHD_Result openai_error(struct MHD_Connection *conn, unsigned status, const char *type,
                                    const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *v = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type", type,
                          "param", "code");
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text ? text : (char *)"",
                                        text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

typedef struct names {
    const char *owner;
    bool admin;
    json_t *list;
} names;

static void collect_name(const px__deploy_row *row, void *ud)
{
    names *n = ud;
    json_array_append_new(n->list, json_string(row->name));
}

static enum MHD_Result models(px_fleet_server *srv, struct MHD_Connection *conn, const px__who *who)
{
    names n = {who->name, who->admin, json_array()};
    px_err err;
    pthread_mutex_lock(&srv->lock);
    px_status st =
        n.list ? srv->store.ops->list_deployments(srv->store.self, who->admin ? NULL : who->name,
                                                  collect_name, &n, &err)
               : PX_ENOMEM;
    pthread_mutex_unlock(&srv->lock);
    if (st != PX_OK) {
        json_decref(n.list);
        return openai_error(conn, 503, "server_error", "the deployments cannot be read now");
    }
    size_t count = json_array_size(n.list);
    const char **ids = calloc(count ? count : 1, sizeof *ids);
    for (size_t k = 0; ids && k < count; k++)
        ids[k] = json_string_value(json_array_get(n.list, k));
    char *text = ids ? px_serve_models_json(ids, count, px_wall_time(), "plexus") : NULL;
    free(ids);
    json_decref(n.list);
    if (!text)
        return openai_error(conn, 500, "server_error", "out of memory");
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* A response streamed from the front end's socket. */
typedef struct relay {
    px_fleet_server *srv;
    px__serving *s;
    int fd;
    char *pending; /* body bytes read with the headers */
    size_t n_pending, off;
} relay;

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    relay *r = cls;
    if (r->off < r->n_pending) {
        size_t n = PX_MIN(max, r->n_pending - r->off);
        memcpy(buf, r->pending + r->off, n);
        r->off += n;
        return (ssize_t)n;
    }
    for (;;) {
        ssize_t n = recv(r->fd, buf, max, 0);
        if (n > 0)
            return n;
        if (n < 0 && errno == EINTR)
            continue;
        return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void relay_free(void *cls)
{
    relay *r = cls;
    if (r->fd >= 0)
        close(r->fd);
    pthread_mutex_lock(&r->srv->lock);
    r->s->refs--;
    pthread_mutex_unlock(&r->srv->lock);
    free(r->pending);
    free(r);
}

static int connect_to(const char *addr)
{
    char host[64];
    px_strlcpy(host, addr, sizeof host);
    char *colon = strrchr(host, ':');
    if (!colon)
        return -1;
    *colon = 0;
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || port == 0 || port > 65535)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads the front end's status line and headers (at most 16 KiB);
 * *status and *ctype from them, the bytes past them into r->pending. */
static bool read_head(relay *r, int *status, char *ctype, size_t cap)
{
    char *buf = malloc(16384);
    size_t n = 0;
    char *end = NULL;
    while (buf && !end && n < 16383) {
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, 600000) <= 0)
            break;
        ssize_t got = recv(r->fd, buf + n, 16383 - n, 0);
        if (got <= 0)
            break;
        n += (size_t)got;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end || sscanf(buf, "HTTP/1.%*d %d", status) != 1) {
        free(buf);
        return false;
    }
    *end = 0;
    ctype[0] = 0;
    for (char *line = strstr(buf, "\r\n"); line; line = strstr(line + 2, "\r\n"))
        if (!strncasecmp(line + 2, "Content-Type:", 13)) {
            const char *v = line + 15;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r");
            snprintf(ctype, cap, "%.*s", (int)PX_MIN(len, cap - 1), v);
        }
    size_t body = (size_t)(end + 4 - buf);
    r->n_pending = n - body;
    r->pending = malloc(r->n_pending ? r->n_pending : 1);
    if (r->pending)
        memcpy(r->pending, buf + body, r->n_pending);
    free(buf);
    return r->pending != NULL;
}

int px__serving_route(px_fleet_server *srv, void *conn_v, const char *method, const char *url,
                      const char *body, size_t len, const px__who *who)
{
    struct MHD_Connection *conn = conn_v;
    if (!strcmp(method, "GET"))
        return models(srv, conn, who);
    px_json_limits lim = {.max_bytes = srv->opt.max_body,
                          .max_depth = 32,
                          .max_string = 1 << 20,
                          .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse(body ? body : "", len, "request body", &lim, &v, &err) != PX_OK ||
        !json_is_object(v)) {
        json_decref(v);
        return openai_error(conn, 400, "invalid_request_error",
                            "%s: expected a JSON object with \"model\" naming a deployment", url);
    }
    const char *model = json_string_value(json_object_get(v, "model"));
    char name[PX__NAME_MAX + 1] = "";
    if (model)
        px_strlcpy(name, model, sizeof name);
    json_decref(v);
    if (!name[0])
        return openai_error(conn, 400, "invalid_request_error",
                            "%s: \"model\" must name one of your deployments (GET /v1/models "
                            "lists them)",
                            url);
    pthread_mutex_lock(&srv->lock);
    px__serving *s = find(srv, name);
    bool mine = s && (who->admin || !strcmp(s->owner, who->name));
    bool up = mine && s->serve && !s->busy && !s->gone;
    char state[32], addr[64], key[sizeof s->key];
    if (mine) {
        px_strlcpy(state, s->state, sizeof state);
        px_strlcpy(addr, s->addr, sizeof addr);
        memcpy(key, s->key, sizeof key);
    }
    if (up)
        s->refs++;
    pthread_mutex_unlock(&srv->lock);
    if (!mine)
        return openai_error(conn, 404, "invalid_request_error",
                            "no deployment \"%s\" of yours is serving; plexus deployments lists "
                            "yours (plexus deploy starts one)",
                            name);
    if (!up)
        return openai_error(conn, 503, "server_error",
                            "deployment %s is %s: its stage workers are not serving yet; retry "
                            "shortly (plexus explain %s says why)",
                            name, state[0] ? state : "starting", name);
    relay *r = calloc(1, sizeof *r);
    int fd = connect_to(addr);
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      url, addr, key, len);
    OPENSSL_cleanse(key, sizeof key);
    bool sent = r && fd >= 0 && hl > 0 && (size_t)hl < sizeof head &&
                send_all(fd, head, (size_t)hl) && send_all(fd, body ? body : "", len);
    OPENSSL_cleanse(head, sizeof head);
    int status = 0;
    char ctype[128];
    if (r) {
        r->srv = srv;
        r->s = s;
        r->fd = fd;
    }
    if (!sent || !read_head(r, &status, ctype, sizeof ctype)) {
        if (r)
            relay_free(r);
        else {
            if (fd >= 0)
                close(fd);
            pthread_mutex_lock(&srv->lock);
            s->refs--;
            pthread_mutex_unlock(&srv->lock);
        }
        return openai_error(conn, 502, "server_error",
                            "deployment %s: its front end did not answer", name);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, relay_read, r, relay_free);
    if (!resp) {
        relay_free(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype[0] ? ctype : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}
