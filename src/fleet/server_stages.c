/* Stage workers of deployments, started on the agents of their nodes.
 *
 * The server runs a deployment's executor (inside its serving front end)
 * with a launcher of its own: starting a stage queues an order for the
 * node that holds the stage's device, which the node's agent receives in
 * its next assignments poll (woken at once), runs through its local
 * launcher and answers with the address the worker bound.  The
 * deployment's secret travels in that order, over the agent's
 * authenticated channel, and from the agent to the worker on its
 * standard input; it is never in a command line, an environment or a
 * log.
 *
 * Health of a worker on another machine: its agent reports the worker's
 * end with its heartbeats, and a node whose agent is gone is seen at once
 * through the agent's long poll (its connection to the server closes; or
 * no poll follows the last one), so every worker of that node is then
 * taken as killed, which is what the agent's death did to them. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <poll.h>
#include <signal.h>

#include <openssl/crypto.h>

/* How long a node may be without an open assignments poll while it runs
 * stage workers before they are taken as lost: an agent polls again at
 * once after each reply. */
#define POLL_GAP_NS 5000000000ull
/* How long a stage start waits for its agent. */
#define START_WAIT_NS 90000000000ull

typedef enum order_state {
    ORDER_PENDING = 0, /* queued for the agent */
    ORDER_SENT,        /* in a poll's reply */
    ORDER_LISTENING,   /* the worker listens */
    ORDER_FAILED,      /* it did not start */
    ORDER_ENDED,       /* it ended (or its node was lost) */
} order_state;

struct px__stage_order {
    struct px__stage_order *next;
    uint64_t id;
    char node[PX__NAME_MAX + 1];
    char deployment[PX__NAME_MAX + 1];
    char digest[72];
    uint32_t stage;
    json_t *argv; /* the worker's command line, checked again by the agent */
    char secret[2 * PX_RT_SECRET_MAX + 1];
    order_state state;
    bool stopping, stop_sent, released;
    px_rt_stage_state end;
    int code;
    char addr[128];
    char detail[448];
};

/* Per node: whether its agent has an assignments poll open, and when the
 * last one ended (monotonic ns). */
typedef struct px__stage_poll {
    struct px__stage_poll *next;
    char node[PX__NAME_MAX + 1];
    int open;
    uint64_t closed_ns;
} node_poll;

static node_poll *poll_of(px_fleet_server *srv, const char *node, bool make)
{
    for (node_poll *p = srv->stage_polls; p; p = p->next)
        if (!strcmp(p->node, node))
            return p;
    if (!make)
        return NULL;
    node_poll *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    px_strlcpy(p->node, node, sizeof p->node);
    p->closed_ns = px_now_ns();
    p->next = srv->stage_polls;
    srv->stage_polls = p;
    return p;
}

static void order_free(px__stage_order *o)
{
    if (!o)
        return;
    json_decref(o->argv);
    OPENSSL_cleanse(o->secret, sizeof o->secret);
    free(o);
}

static void unlink_order(px_fleet_server *srv, px__stage_order *o)
{
    for (px__stage_order **p = &srv->stage_orders; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
    order_free(o);
}

/* Orders whose worker is gone and that nobody holds any more. */
static void collect(px_fleet_server *srv)
{
    px__stage_order **p = &srv->stage_orders;
    while (*p) {
        px__stage_order *o = *p;
        if (o->released && (o->state == ORDER_ENDED || o->state == ORDER_FAILED)) {
            *p = o->next;
            order_free(o);
        } else {
            p = &o->next;
        }
    }
}

static bool node_runs_stages(px_fleet_server *srv, const char *node)
{
    for (px__stage_order *o = srv->stage_orders; o; o = o->next)
        if (!strcmp(o->node, node) && o->state != ORDER_ENDED && o->state != ORDER_FAILED)
            return true;
    return false;
}

void px__srv_stages_node_lost(px_fleet_server *srv, const char *node, const char *why)
{
    bool any = false;
    for (px__stage_order *o = srv->stage_orders; o; o = o->next) {
        if (strcmp(o->node, node) != 0 || o->state == ORDER_ENDED || o->state == ORDER_FAILED)
            continue;
        if (o->state == ORDER_LISTENING) {
            o->state = ORDER_ENDED;
            o->end = PX_RT_STAGE_KILLED;
            o->code = SIGKILL;
            snprintf(o->detail, sizeof o->detail,
                     "killed by signal 9 (Killed): node %s was lost (%s), and its workers with it",
                     node, why);
        } else {
            o->state = ORDER_FAILED;
            snprintf(o->detail, sizeof o->detail, "node %s was lost (%s)", node, why);
        }
        any = true;
    }
    if (any) {
        px_log_warn("fleet: node %s lost (%s): its stage workers are taken as killed", node, why);
        pthread_cond_broadcast(&srv->changed);
    }
    collect(srv);
}

/* A node whose agent has no poll open for POLL_GAP_NS, or that the
 * scheduler took offline, is lost. */
static void check_node(px_fleet_server *srv, const char *node)
{
    node_poll *p = poll_of(srv, node, false);
    size_t i;
    bool offline = px_fleet_sched_find_node(srv->sched, node, &i, NULL) != PX_OK ||
                   px_fleet_sched_state(srv->sched, i) != PX_FLEET_NODE_ONLINE;
    if (offline)
        px__srv_stages_node_lost(srv, node, "no heartbeat within its lease");
    else if (p && !p->open && px_now_ns() - p->closed_ns > POLL_GAP_NS)
        px__srv_stages_node_lost(srv, node, "its agent stopped polling the server");
}

/* ---- the agent's side of the orders (server lock held) ---- */

json_t *px__srv_stages_for(px_fleet_server *srv, const char *node)
{
    json_t *arr = json_array();
    for (px__stage_order *o = srv->stage_orders; arr && o; o = o->next) {
        if (strcmp(o->node, node) != 0)
            continue;
        if (o->state == ORDER_PENDING && !o->stopping) {
            json_array_append_new(
                arr, json_pack("{s:s, s:I, s:s, s:s, s:i, s:O, s:s}", "op", "start", "id",
                               (json_int_t)o->id, "deployment", o->deployment, "digest", o->digest,
                               "stage", (int)o->stage, "argv", o->argv, "secret", o->secret));
            o->state = ORDER_SENT;
            /* Delivered: the server keeps no copy it does not need. */
            OPENSSL_cleanse(o->secret, sizeof o->secret);
        } else if (o->stopping && !o->stop_sent && o->state != ORDER_ENDED &&
                   o->state != ORDER_FAILED) {
            json_array_append_new(arr,
                                  json_pack("{s:s, s:I}", "op", "stop", "id", (json_int_t)o->id));
            o->stop_sent = true;
        }
    }
    return arr;
}

bool px__srv_stages_pending(px_fleet_server *srv, const char *node)
{
    for (px__stage_order *o = srv->stage_orders; o; o = o->next)
        if (!strcmp(o->node, node) &&
            ((o->state == ORDER_PENDING && !o->stopping) ||
             (o->stopping && !o->stop_sent && o->state != ORDER_ENDED && o->state != ORDER_FAILED)))
            return true;
    return false;
}

void px__srv_stages_poll(px_fleet_server *srv, const char *node, bool open)
{
    node_poll *p = poll_of(srv, node, true);
    if (!p)
        return;
    p->open += open ? 1 : -1;
    if (p->open < 0)
        p->open = 0;
    if (!open)
        p->closed_ns = px_now_ns();
}

bool px__srv_stages_watch(px_fleet_server *srv, const char *node)
{
    return node_runs_stages(srv, node);
}

bool px__srv_stages_conn_closed(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* One report of the agent: {"id", "address"} (listening), {"id",
 * "error"} (did not start) or {"id", "state": "killed"|"exited", "code",
 * "detail"} (ended).  Reports of another node's orders are ignored. */
static void report_one(px_fleet_server *srv, const char *node, const json_t *r)
{
    json_int_t id = json_integer_value(json_object_get(r, "id"));
    px__stage_order *o = srv->stage_orders;
    while (o && (o->id != (uint64_t)id || strcmp(o->node, node) != 0))
        o = o->next;
    if (!o || o->state == ORDER_ENDED || o->state == ORDER_FAILED)
        return;
    const char *addr = json_string_value(json_object_get(r, "address"));
    const char *error = json_string_value(json_object_get(r, "error"));
    const char *state = json_string_value(json_object_get(r, "state"));
    if (addr && o->state == ORDER_SENT && px_rt_addr_check(addr, NULL) == PX_OK &&
        strlen(addr) < sizeof o->addr) {
        px_strlcpy(o->addr, addr, sizeof o->addr);
        o->state = ORDER_LISTENING;
    } else if (error) {
        o->state = ORDER_FAILED;
        snprintf(o->detail, sizeof o->detail, "%.400s", error);
    } else if (state) {
        o->state = ORDER_ENDED;
        o->end = !strcmp(state, "killed") ? PX_RT_STAGE_KILLED : PX_RT_STAGE_EXITED;
        o->code = (int)json_integer_value(json_object_get(r, "code"));
        const char *d = json_string_value(json_object_get(r, "detail"));
        snprintf(o->detail, sizeof o->detail, "%.380s (on node %s)", d ? d : state, node);
    }
}

void px__srv_stages_report(px_fleet_server *srv, const char *node, const json_t *reports)
{
    size_t i;
    json_t *r;
    json_array_foreach(reports, i, r) report_one(srv, node, r);
    if (json_array_size(reports)) {
        pthread_cond_broadcast(&srv->changed);
        collect(srv);
    }
}

px__stage_order *px__srv_stages_queue(px_fleet_server *srv, const char *node,
                                      const char *deployment, const char *digest, uint32_t stage,
                                      json_t *argv, const char *secret_hex)
{
    px__stage_order *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    px_strlcpy(o->node, node, sizeof o->node);
    px_strlcpy(o->deployment, deployment, sizeof o->deployment);
    px_strlcpy(o->digest, digest, sizeof o->digest);
    px_strlcpy(o->secret, secret_hex, sizeof o->secret);
    o->stage = stage;
    o->argv = json_incref(argv);
    o->id = ++srv->stage_seq;
    o->next = srv->stage_orders;
    srv->stage_orders = o;
    return o;
}

/* ---- the launcher (px_rt_launcher) ---- */

struct px__fleet_launcher {
    px_rt_launcher iface;
    px_fleet_server *srv;
    char deployment[PX__NAME_MAX + 1];
    char digest[72];
    json_t *device_node; /* device global id -> node name */
};

/* The value of option opt in argv, or NULL. */
static const char *arg_of(const px_rt_worker_argv *argv, const char *opt)
{
    for (int k = 0; k + 1 < argv->argc; k++)
        if (!strcmp(argv->argv[k], opt))
            return argv->argv[k + 1];
    return NULL;
}

static px_status fl_start(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                          const uint8_t *secret, size_t secret_len, char *addr, size_t addr_cap,
                          void **handle, px_err *err)
{
    px__fleet_launcher *l = ctx;
    px_fleet_server *srv = l->srv;
    *handle = NULL;
    const char *device = arg_of(argv, "--device");
    const char *node = device ? json_string_value(json_object_get(l->device_node, device)) : NULL;
    if (!node)
        return px_err_set(err, PX_EINVAL,
                          "deployment %s: stage %u's device \"%.64s\" is on no node of the fleet",
                          l->deployment, stage, device ? device : "");
    if (secret_len == 0 || secret_len > PX_RT_SECRET_MAX)
        return px_err_set(err, PX_EINVAL,
                          "deployment %s: stage workers need the deployment's "
                          "secret",
                          l->deployment);
    json_t *av = json_array();
    for (int k = 0; av && k < argv->argc; k++)
        json_array_append_new(av, json_string(argv->argv[k]));
    char hex[2 * PX_RT_SECRET_MAX + 1];
    px_rt_secret_hex(secret, secret_len, hex);
    pthread_mutex_lock(&srv->lock);
    px__stage_order *o =
        av ? px__srv_stages_queue(srv, node, l->deployment, l->digest, stage, av, hex) : NULL;
    OPENSSL_cleanse(hex, sizeof hex);
    json_decref(av);
    if (!o) {
        pthread_mutex_unlock(&srv->lock);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    check_node(srv, node);
    pthread_cond_broadcast(&srv->changed);
    uint64_t deadline = px_now_ns() + START_WAIT_NS;
    while ((o->state == ORDER_PENDING || o->state == ORDER_SENT) && px__srv_wait(srv, deadline))
        check_node(srv, node);
    px_status st = PX_OK;
    if (o->state == ORDER_LISTENING && strlen(o->addr) < addr_cap) {
        px_strlcpy(addr, o->addr, addr_cap);
        *handle = o;
        px_log_info("fleet: deployment %s: stage %u listens on node %s at %s", l->deployment, stage,
                    node, o->addr);
    } else {
        st = px_err_set(
            err, o->state == ORDER_FAILED ? PX_EPEER : PX_ETIMEOUT,
            "node %s did not start stage %u of deployment %s: %s", node, stage, l->deployment,
            o->state == ORDER_FAILED ? o->detail : "its agent did not answer within 90 s");
        o->stopping = true;
        o->released = true;
        if (o->state == ORDER_PENDING)
            unlink_order(srv, o);
        else
            pthread_cond_broadcast(&srv->changed);
    }
    pthread_mutex_unlock(&srv->lock);
    return st;
}

static px_rt_stage_state fl_health(void *ctx, void *handle, int *code, char *detail, size_t cap)
{
    px__fleet_launcher *l = ctx;
    px__stage_order *o = handle;
    *code = 0;
    if (cap)
        detail[0] = 0;
    if (!o)
        return PX_RT_STAGE_RUNNING;
    pthread_mutex_lock(&l->srv->lock);
    if (o->state == ORDER_LISTENING)
        check_node(l->srv, o->node);
    px_rt_stage_state s = PX_RT_STAGE_RUNNING;
    if (o->state == ORDER_ENDED || o->state == ORDER_FAILED) {
        s = o->state == ORDER_FAILED ? PX_RT_STAGE_EXITED : o->end;
        *code = o->code;
        if (cap)
            px_strlcpy(detail, o->detail, cap);
    }
    pthread_mutex_unlock(&l->srv->lock);
    return s;
}

/* A worker's end shows in fl_health once its node is found lost: at once
 * when the agent's watched poll closes (within a few watch slices), else
 * when its poll has been closed for POLL_GAP_NS. */
static uint64_t fl_lag_ns(void *ctx, void *handle)
{
    px__fleet_launcher *l = ctx;
    px__stage_order *o = handle;
    if (!o)
        return 0;
    pthread_mutex_lock(&l->srv->lock);
    uint64_t lag = 0;
    if (o->state == ORDER_LISTENING) {
        node_poll *p = poll_of(l->srv, o->node, false);
        uint64_t now = px_now_ns();
        if (!p)
            lag = POLL_GAP_NS; /* never polled: only the scheduler's lease tells */
        else if (p->open)
            lag = 4 * PX__WATCH_SLICE_NS;
        else if (now - p->closed_ns < POLL_GAP_NS)
            lag = p->closed_ns + POLL_GAP_NS - now + PX__WATCH_SLICE_NS;
        else
            lag = PX__WATCH_SLICE_NS; /* the next fl_health finds it lost */
    }
    pthread_mutex_unlock(&l->srv->lock);
    return lag;
}

static void fl_stop(void *ctx, void *handle)
{
    px__fleet_launcher *l = ctx;
    px__stage_order *o = handle;
    if (!o)
        return;
    pthread_mutex_lock(&l->srv->lock);
    o->stopping = true;
    o->released = true;
    pthread_cond_broadcast(&l->srv->changed);
    collect(l->srv);
    pthread_mutex_unlock(&l->srv->lock);
}

px_status px__fleet_launcher_new(px_fleet_server *srv, const char *deployment, const char *digest,
                                 const json_t *inventory, px__fleet_launcher **out, px_err *err)
{
    *out = NULL;
    px__fleet_launcher *l = calloc(1, sizeof *l);
    if (!l || !(l->device_node = json_object())) {
        free(l);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    l->srv = srv;
    px_strlcpy(l->deployment, deployment, sizeof l->deployment);
    px_strlcpy(l->digest, digest, sizeof l->digest);
    size_t i, k;
    json_t *n, *d;
    json_array_foreach(json_object_get(inventory, "nodes"), i, n)
    {
        const char *node = json_string_value(json_object_get(n, "id"));
        json_array_foreach(json_object_get(n, "devices"), k, d)
        {
            const char *dev = json_string_value(json_object_get(d, "id"));
            if (!node || !dev)
                continue;
            char *gid = px_asprintf("%s.%s", node, dev);
            if (gid)
                json_object_set_new(l->device_node, gid, json_string(node));
            free(gid);
        }
    }
    l->iface = (px_rt_launcher){.ctx = l,
                                .start = fl_start,
                                .health = fl_health,
                                .signal = NULL,
                                .stop = fl_stop,
                                .lag_ns = fl_lag_ns};
    *out = l;
    return PX_OK;
}

const px_rt_launcher *px__fleet_launcher_iface(px__fleet_launcher *l)
{
    return &l->iface;
}

void px__fleet_launcher_free(px__fleet_launcher *l)
{
    if (!l)
        return;
    json_decref(l->device_node);
    free(l);
}

json_t *px__srv_stages_json(px_fleet_server *srv, const char *deployment)
{
    json_t *arr = json_array();
    static const char *const names[] = {"starting", "starting", "running", "failed", "ended"};
    for (px__stage_order *o = srv->stage_orders; arr && o; o = o->next)
        if (!strcmp(o->deployment, deployment) && !o->released)
            json_array_append_new(
                arr, json_pack("{s:i, s:s, s:s, s:s, s:s}", "stage", (int)o->stage, "node", o->node,
                               "state", names[o->state], "address", o->addr, "detail", o->detail));
    return arr;
}

void px__srv_stages_free(px_fleet_server *srv)
{
    while (srv->stage_orders) {
        px__stage_order *o = srv->stage_orders;
        srv->stage_orders = o->next;
        order_free(o);
    }
    while (srv->stage_polls) {
        node_poll *p = srv->stage_polls;
        srv->stage_polls = p->next;
        free(p);
    }
}
