/* Agents through every replica, the scheduling replica's side: what
 * agents told replicas that do not schedule reaches the scheduler through
 * the database.  Each node's last call there (a registration, a heartbeat,
 * a poll) bumps the node's change number; the scheduler reads the nodes
 * changed since the last number it applied (when the database notifies a
 * registration or a report, and every 250 ms for heartbeats, which notify
 * nobody) and applies each as if the agent had called it.  Members'
 * reports (start, finish) wait in a queue the scheduler empties after.
 * Everything here runs under the server lock, outside a pass. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#define NODE_READ_NS   250000000ull  /* heartbeats are read at least this often */
#define HOLDER_READ_NS 1000000000ull /* a standby reads the scheduler's URL */
#define CHANGES_MAX    2000          /* node changes applied at a time */
#define REPORTS_MAX    1000          /* members' reports taken at a time */

bool px__store_serves_agents(const px__store *store)
{
    const px__store_ops *o = store->ops;
    return o->version >= 11 && o->node_of_credential && o->note_node && o->node_mark &&
           o->changed_nodes && o->node_assignments && o->node_stops && o->put_member_report &&
           o->take_member_reports && o->set_holder && o->get_holder;
}

/* Whether the URL names a host others can reach (not a wildcard). */
static bool reachable(const char *url)
{
    return !strstr(url, "://0.0.0.0:") && !strstr(url, "://[::]:") && !strstr(url, "://:");
}

px_status px__srv_node_calls_begin(px_fleet_server *srv, px_err *err)
{
    if (!px__store_serves_agents(&srv->store))
        return PX_OK;
    /* The mark first: a change made while the nodes are read is applied
     * again afterwards, never missed. */
    px_status st = srv->store.ops->node_mark(srv->store.self, &srv->node_mark, err);
    if (st == PX_OK)
        st = srv->store.ops->set_holder(srv->store.self, reachable(srv->url) ? srv->url : "", err);
    srv->node_read_ns = 0;
    srv->node_calls_on = st == PX_OK;
    return st;
}

static void bring_online(px_fleet_server *srv, size_t i, const char *name)
{
    if (px_fleet_sched_state(srv->sched, i) != PX_FLEET_NODE_OFFLINE)
        return;
    px_err err;
    px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_ONLINE);
    if (srv->store.ops->put_node(srv->store.self, name, NULL, "online", px_wall_time(), &err) !=
        PX_OK)
        px_log_error("fleet: node %s: %s", name, err.msg);
    srv->dirty = true;
}

typedef struct changes_ctx {
    px_fleet_server *srv;
    int n;
} changes_ctx;

/* One node's change, applied as its call would have been here. */
static void apply_change(const px__node_change *c, void *ud)
{
    changes_ctx *x = ud;
    px_fleet_server *srv = x->srv;
    x->n++;
    srv->node_mark = PX_MAX(srv->node_mark, c->change);
    json_t *body = c->body ? json_loads(c->body, 0, NULL) : NULL;
    size_t i;
    px_err err;
    if (c->registered && c->registration) {
        json_t *reg = json_loads(c->registration, 0, NULL);
        px_status st = reg ? px_fleet_sched_add_node(srv->sched, reg, &i, &err)
                           : px_err_set(&err, PX_EINVAL, "not JSON");
        json_decref(reg);
        if (st != PX_OK) {
            px_log_warn("fleet: node %s: registration through another replica refused: %s", c->name,
                        err.msg);
            json_decref(body);
            return;
        }
        px__srv_touch_node(srv, i);
        if (px__srv_reconcile_node(srv, i, json_object_get(body, "running"), -1, &err) != PX_OK)
            px_log_error("fleet: node %s: its lost work not yet requeued: %s", c->name, err.msg);
        px_log_info("fleet: node %s registered (through another replica)", c->name);
        srv->dirty = true;
    } else if (px_fleet_sched_find_node(srv->sched, c->name, &i, NULL) != PX_OK) {
        json_decref(body);
        return; /* never registered here: its next call registers it */
    }
    px__srv_touch_node(srv, i);
    bring_online(srv, i, c->name);
    if (body && strcmp(c->kind, "heartbeat") == 0) {
        px_fleet_sched_update_live(srv->sched, i, body);
        px__srv_stages_report(srv, c->name, json_object_get(body, "stages"));
        px__srv_deploy_evictions(srv, c->name, json_object_get(body, "evictions"));
        srv->dirty = true;
    }
    json_decref(body);
}

static int int_of(const json_t *body, const char *key, int def)
{
    const json_t *v = json_object_get(body, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

/* A member's report another replica accepted: the agent was answered
 * already, so a refusal (a stale attempt) is only logged; the next
 * heartbeat's stop list tells the agent. */
static void apply_report(const char *node, const char *id, const char *kind, const char *text,
                         void *ud)
{
    px_fleet_server *srv = ud;
    px__job *job = px__srv_find_job(srv, id);
    size_t i;
    json_t *body = json_loads(text, 0, NULL);
    if (!job || !body || px_fleet_sched_find_node(srv->sched, node, &i, NULL) != PX_OK) {
        json_decref(body);
        return;
    }
    px__srv_touch_node(srv, i);
    int attempt = int_of(body, "attempt", -1), rank = int_of(body, "rank", 0);
    px_err err;
    px_status st;
    if (strcmp(kind, "start") == 0)
        st = px__srv_member_start(srv, job, attempt, rank, (int)i, &err);
    else {
        const json_t *e = json_object_get(body, "error");
        st = px__srv_member_finish(srv, job, attempt, rank, (int)i, int_of(body, "exit_code", -1),
                                   int_of(body, "signal", 0), json_object_get(body, "result"),
                                   json_string_value(e), &err);
    }
    if (st != PX_OK)
        px_log_warn("fleet: job %s: %s report of node %s (through another replica): %s", id, kind,
                    node, err.msg);
    json_decref(body);
}

void px__srv_node_calls_tick(px_fleet_server *srv, bool due)
{
    if (!srv->node_calls_on)
        return;
    uint64_t now = px_now_ns();
    if (!due && now - srv->node_read_ns < NODE_READ_NS)
        return;
    srv->node_read_ns = now;
    px_err err;
    changes_ctx x = {srv, 0};
    /* Reports first: an agent's finish report is queued before any later
     * call of its that no longer lists the work, so a registration read
     * after it never requeues work that has ended. */
    if (srv->store.ops->take_member_reports(srv->store.self, REPORTS_MAX, apply_report, srv,
                                            &err) != PX_OK)
        px_log_warn("server: %s", err.msg);
    if (srv->store.ops->changed_nodes(srv->store.self, srv->node_mark, CHANGES_MAX, apply_change,
                                      &x, &err) != PX_OK) {
        px_log_warn("server: %s", err.msg);
        return;
    }
    /* A full hand: there may be more, read on the next tick. */
    if (x.n >= CHANGES_MAX)
        srv->node_read_ns = 0;
    pthread_cond_broadcast(&srv->changed);
}

const char *px__srv_holder_url(px_fleet_server *srv)
{
    if (!px__store_serves_agents(&srv->store))
        return "";
    uint64_t now = px_now_ns();
    if (srv->holder_read_ns == 0 || now - srv->holder_read_ns >= HOLDER_READ_NS) {
        px_err err;
        srv->holder_read_ns = now;
        if (srv->store.ops->get_holder(srv->store.self, srv->holder_url, &err) != PX_OK)
            srv->holder_url[0] = '\0';
    }
    return srv->holder_url;
}
