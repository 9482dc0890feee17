/* Agent endpoints on a replica that does not schedule, answered from the
 * store (px__store_serves_agents): registration, heartbeat, assignments
 * (a long poll; one read of the database every 250 ms serves every poll
 * waiting on the replica) and the reports of
 * each member (start, finish: queued for the scheduler; log chunks:
 * stored at once).  Each call is bound to the node whose credential made
 * it, as on the scheduling replica, and reports for work that is not the
 * node's current attempt are refused (409).  Joining, credential
 * rotation, stage workers and artifact uploads need the scheduler's
 * memory and answer 503 "standby".  Called with the server lock held
 * (released while a poll waits). */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#define POLL_READ_NS   250000000ull /* a poll reads the database this often */
#define JOB_ID_MAX     63
#define REPORT_INT_MAX 1000000

bool px__api_agent_standby_serves(const char *method, const char *url)
{
    bool post = strcmp(method, "POST") == 0;
    if (post && (strcmp(url, "/v1/agent/register") == 0 || strcmp(url, "/v1/agent/heartbeat") == 0))
        return true;
    if (strcmp(method, "GET") == 0)
        return strcmp(url, "/v1/agent/assignments") == 0;
    if (!post || !px_str_starts_with(url, "/v1/agent/jobs/"))
        return false;
    const char *sub = strrchr(url, '/');
    return sub && sub > url + strlen("/v1/agent/jobs/") &&
           (strcmp(sub, "/start") == 0 || strcmp(sub, "/finish") == 0 || strcmp(sub, "/logs") == 0);
}

bool px__auth_identify_stored(px_fleet_server *srv, const char *h, px__who *who)
{
    memset(who, 0, sizeof *who);
    if (!px__store_serves_agents(&srv->store) || !h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    const char *tok = h + 7;
    while (*tok == ' ')
        tok++;
    px_digest d;
    px_sha256(tok, strnlen(tok, 512), &d);
    char hex[65], name[65];
    px_digest_hex(&d, hex);
    px_err err;
    if (srv->store.ops->node_of_credential(srv->store.self, hex, name, &err) != PX_OK)
        return false;
    who->kind = PX__WHO_NODE;
    who->hash = d;
    px_strlcpy(who->name, name, sizeof who->name);
    return true;
}

char *px__standby_running_text(const json_t *running)
{
    json_t *arr = json_array();
    for (size_t k = 0;
         arr && json_is_array(running) && k < json_array_size(running) && k < PX__RUNNING_MAX;
         k++) {
        const json_t *r = json_array_get(running, k);
        const char *id = json_string_value(json_object_get(r, "job"));
        const json_t *att = json_object_get(r, "attempt");
        const json_t *rank = json_object_get(r, "rank");
        json_int_t rk = json_is_integer(rank) ? json_integer_value(rank) : 0;
        if (!id || !id[0] || strlen(id) > JOB_ID_MAX || !json_is_integer(att) ||
            json_integer_value(att) < 0 || json_integer_value(att) > REPORT_INT_MAX || rk < 0 ||
            rk > REPORT_INT_MAX)
            continue;
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "job", id, "attempt",
                                             json_integer_value(att), "rank", rk));
    }
    char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return text;
}

/* What the node must stop of what it says it runs; NULL (reply set) when
 * the store cannot say. */
static json_t *stops(px__api_req *rq, px__api_resp *rs, const json_t *running)
{
    px_fleet_server *srv = rq->srv;
    char *text = px__standby_running_text(running), *out = NULL;
    px_err err;
    px_status st = text
                       ? srv->store.ops->node_stops(srv->store.self, rq->who.name, text, &out, &err)
                       : px_err_set(&err, PX_ENOMEM, "out of memory");
    free(text);
    json_t *stop = st == PX_OK ? json_loads(out, 0, NULL) : NULL;
    free(out);
    if (!stop)
        px__api_error(rs, 503, "the work node %s must stop cannot be read: %s; retry", rq->who.name,
                      st == PX_OK ? "unreadable answer" : err.msg);
    return stop;
}

/* The heartbeat's and registration's reply: the lease and what to stop. */
static void lease_reply(px__api_req *rq, px__api_resp *rs, const json_t *running, bool with_node)
{
    json_t *stop = stops(rq, rs, running);
    if (!stop)
        return;
    json_t *o = json_pack("{s:f, s:f, s:o}", "lease_s", rq->srv->opt.lease_s, "heartbeat_s",
                          rq->srv->opt.heartbeat_s, "stop", stop);
    if (with_node)
        json_object_set_new(o, "node", json_string(rq->who.name));
    px__api_json(rs, 200, o);
}

/* A "node" the caller names must be its own. */
static bool own_name(px__api_req *rq, px__api_resp *rs, const char *named)
{
    if (!named || strcmp(named, rq->who.name) == 0)
        return true;
    px__api_error(rs, 403,
                  "this credential belongs to node \"%s\", not \"%.64s\"; a node speaks only for "
                  "itself",
                  rq->who.name, named);
    return false;
}

/* Records a call of the caller's node; false (reply set) when refused. */
static bool note(px__api_req *rq, px__api_resp *rs, const char *kind, const json_t *body)
{
    px_fleet_server *srv = rq->srv;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    px_err err;
    px_status st = body && !text
                       ? px_err_set(&err, PX_ENOMEM, "out of memory")
                       : srv->store.ops->note_node(srv->store.self, rq->who.name, kind, text, &err);
    free(text);
    if (st == PX_ENOTFOUND)
        px__api_error(rs, 404, "unknown node \"%s\": register again", rq->who.name);
    else if (st != PX_OK)
        px__api_error(rs, 503, "node %s: %s not stored: %s; retry", rq->who.name, kind, err.msg);
    if (st == PX_OK)
        srv->metrics.agent_calls_stored++;
    return st == PX_OK;
}

static void do_register(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    px_fleet_sched *scratch = NULL;
    size_t i;
    px_err err;
    if (name && strcmp(name, rq->who.name) != 0) {
        px__api_error(rs, 403,
                      "this credential belongs to node \"%s\"; it cannot register \"%.64s\"",
                      rq->who.name, name);
    } else {
        json_object_set_new(body, "name", json_string(rq->who.name));
        json_object_del(body, "credential");
        /* Checked as the scheduler will check it, so that the agent hears
         * of a malformed registration now rather than never. */
        if (px_fleet_sched_new(&scratch, &err) != PX_OK ||
            px_fleet_sched_add_node(scratch, body, &i, &err) != PX_OK)
            px__api_fail(rs, &err);
        else if (note(rq, rs, "register", body)) {
            px_log_info("fleet: node %s registered (to be applied by the scheduling replica)",
                        rq->who.name);
            lease_reply(rq, rs, json_object_get(body, "running"), true);
        }
    }
    px_fleet_sched_free(scratch);
    json_decref(body);
}

static void heartbeat(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    if (own_name(rq, rs, json_string_value(json_object_get(body, "node"))) &&
        note(rq, rs, "heartbeat", body))
        lease_reply(rq, rs, json_object_get(body, "running"), false);
    json_decref(body);
}

static void add_assignment(const char *text, void *ud)
{
    json_t *a = json_loads(text, 0, NULL);
    if (a)
        json_array_append_new(ud, a);
}

/* The waiting polls' board: each poll waiting on this replica puts its
 * node there, and one read per tick (POLL_READ_NS) of every waiting node's
 * assignments, by whichever poll finds it due, serves them all: thousands
 * of agents waiting on a standby cost one statement a tick, not one each.
 * A poll that arrives between two reads is answered by the next (within a
 * tick).  Server lock held, released while reading. */
static void found_one(const char *node, const char *text, void *ud)
{
    json_t *found = ud, *a = json_loads(text, 0, NULL);
    json_t *arr = json_object_get(found, node);
    if (!arr && (arr = json_array()))
        json_object_set_new(found, node, arr);
    if (a && arr)
        json_array_append_new(arr, a);
    else
        json_decref(a);
}

static void read_board(px_fleet_server *srv)
{
    struct px__poll_board *b = &srv->polls;
    b->reading = true;
    b->read_ns = px_now_ns();
    json_t *names = json_array(), *found = json_object();
    const char *key;
    json_t *count;
    json_object_foreach(b->waiting, key, count)
    {
        (void)count;
        json_array_append_new(names, json_string(key));
    }
    char *nodes = names ? json_dumps(names, JSON_COMPACT) : NULL;
    pthread_mutex_unlock(&srv->lock);
    px_err err = {0};
    px_status st = PX_OK;
    const px__store_ops *o = srv->store.ops;
    if (!nodes || !found)
        st = px_err_set(&err, PX_ENOMEM, "out of memory");
    else if (o->version >= 13 && o->nodes_assignments)
        st = o->nodes_assignments(srv->store.self, nodes, found_one, found, &err);
    else
        /* A store without the slot: one read per waiting node, still once
         * a tick whatever the number of polls of each. */
        for (size_t i = 0; st == PX_OK && i < json_array_size(names); i++) {
            const char *node = json_string_value(json_array_get(names, i));
            json_t *arr = json_array();
            st = arr ? o->node_assignments(srv->store.self, node, add_assignment, arr, &err)
                     : px_err_set(&err, PX_ENOMEM, "out of memory");
            if (st == PX_OK)
                json_object_set_new(found, node, arr);
            else
                json_decref(arr);
        }
    pthread_mutex_lock(&srv->lock);
    free(nodes);
    json_decref(names);
    srv->metrics.poll_reads++;
    json_decref(b->found);
    b->found = st == PX_OK ? found : NULL;
    if (st != PX_OK)
        json_decref(found);
    px_textf(b->error, sizeof b->error, "%s", st == PX_OK ? "" : err.msg);
    b->epoch++;
    b->reading = false;
    pthread_cond_broadcast(&srv->changed);
}

static void board_leave(px_fleet_server *srv, const char *node)
{
    json_t *n = json_object_get(srv->polls.waiting, node);
    if (json_integer_value(n) > 1)
        json_integer_set(n, json_integer_value(n) - 1);
    else
        json_object_del(srv->polls.waiting, node);
}

static void assignments(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    double wait;
    if (!px__api_agent_wait(rq, rs, &wait))
        return;
    if (!own_name(rq, rs, px__api_query(rq, "node")) || !note(rq, rs, "poll", NULL))
        return;
    struct px__poll_board *b = &srv->polls;
    const char *name = rq->who.name;
    if (!b->waiting && !(b->waiting = json_object())) {
        px__api_error(rs, 503, "out of memory");
        return;
    }
    json_t *n = json_object_get(b->waiting, name);
    if (n)
        json_integer_set(n, json_integer_value(n) + 1);
    else
        json_object_set_new(b->waiting, name, json_integer(1));
    uint64_t deadline = px_now_ns() + (uint64_t)(wait * 1e9);
    uint64_t seen = b->epoch; /* a read begun before this poll came may miss it */
    if (b->reading)
        seen++;
    for (;;) {
        uint64_t now = px_now_ns();
        if (b->epoch > seen) {
            if (b->error[0]) {
                px__api_error(rs, 503, "node %s: its assignments cannot be read: %s; retry", name,
                              b->error);
                break;
            }
            json_t *arr = json_object_get(b->found, name);
            if (json_array_size(arr) > 0) {
                px__api_json(rs, 200, json_pack("{s:O, s:[]}", "assignments", arr, "stages"));
                break;
            }
        }
        if (now >= deadline || srv->stopping) {
            px__api_json(rs, 200, json_pack("{s:[], s:[]}", "assignments", "stages"));
            break;
        }
        if (!b->reading && now >= b->read_ns + POLL_READ_NS) {
            seen = b->epoch;
            read_board(srv);
            continue;
        }
        /* Woken by the read's end (changed), or at the next read's time. */
        px__srv_wait(srv, PX_MIN(deadline, b->reading ? deadline : b->read_ns + POLL_READ_NS));
    }
    board_leave(srv, name);
}

/* An integer of the body, or of the query when body is NULL; false (reply
 * set) when missing or out of range. */
static bool int_arg(px__api_req *rq, px__api_resp *rs, const json_t *body, const char *key,
                    int *out)
{
    json_int_t v;
    if (body) {
        const json_t *x = json_object_get(body, key);
        v = json_integer_value(x);
        if (!json_is_integer(x) || v < 0 || v > REPORT_INT_MAX) {
            px__api_error(rs, 400, "/%s: expected a non-negative integer", key);
            return false;
        }
    } else {
        const char *q = px__api_query(rq, key);
        char *end;
        if (!q || (v = strtoll(q, &end, 10), *end) || end == q || v < 0 || v > REPORT_INT_MAX) {
            px__api_error(rs, 400, "?%s=: expected a non-negative integer", key);
            return false;
        }
    }
    *out = (int)v;
    return true;
}

/* Whether (job, attempt, rank) is the caller's current work; false
 * (reply set: 409 when it is not) otherwise. */
static bool current_work(px__api_req *rq, px__api_resp *rs, const char *id, int attempt, int rank)
{
    json_t *one = json_pack("[{s:s, s:i, s:i}]", "job", id, "attempt", attempt, "rank", rank);
    json_t *stop = one ? stops(rq, rs, one) : NULL;
    json_decref(one);
    if (!stop) {
        if (!one)
            px__api_error(rs, 503, "out of memory");
        return false;
    }
    bool current = json_array_size(stop) == 0;
    json_decref(stop);
    if (!current)
        px__api_error(rs, 409,
                      "stale attempt: job %s attempt %d rank %d is not node %s's current work "
                      "(it ended, moved or was requeued); stop this work",
                      id, attempt, rank, rq->who.name);
    return current;
}

static void report(px__api_req *rq, px__api_resp *rs, const char *id, const char *what)
{
    px_fleet_server *srv = rq->srv;
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    int attempt, rank = 0;
    const json_t *e = json_object_get(body, "error");
    if (!int_arg(rq, rs, body, "attempt", &attempt) ||
        (json_object_get(body, "rank") && !int_arg(rq, rs, body, "rank", &rank)) ||
        !own_name(rq, rs, json_string_value(json_object_get(body, "node")))) {
        json_decref(body);
        return;
    }
    if (e && !json_is_string(e) && !json_is_null(e)) {
        px__api_error(rs, 400, "/error: expected a string or null");
    } else if (current_work(rq, rs, id, attempt, rank)) {
        char *text = json_dumps(body, JSON_COMPACT);
        px_err err;
        px_status st = text ? srv->store.ops->put_member_report(srv->store.self, rq->who.name, id,
                                                                what, text, &err)
                            : px_err_set(&err, PX_ENOMEM, "out of memory");
        free(text);
        if (st != PX_OK)
            px__api_error(rs, 503, "job %s: the %s report not stored: %s; retry", id, what,
                          err.msg);
        else {
            srv->metrics.agent_calls_stored++;
            px__api_json(rs, 200, json_object());
        }
    }
    json_decref(body);
}

/* A chunk of output, stored at once within the job's log quota (what the
 * store holds of the job: every replica's chunks count). */
static void upload_log(px__api_req *rq, px__api_resp *rs, const char *id)
{
    px_fleet_server *srv = rq->srv;
    int attempt, rank;
    if (!int_arg(rq, rs, NULL, "attempt", &attempt) || !int_arg(rq, rs, NULL, "rank", &rank))
        return;
    const char *stream = px__api_query(rq, "stream");
    if (!stream || (strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0)) {
        px__api_error(rs, 400, "?stream=: expected stdout or stderr");
        return;
    }
    if (!current_work(rq, rs, id, attempt, rank))
        return;
    px_err err;
    int64_t log_bytes = 0, artifact_bytes = 0, seq = 0;
    size_t take = 0;
    bool cut = false;
    /* A store that counts the quota itself needs no count first. */
    const px__store_ops *o = srv->store.ops;
    px_status st = o->version >= 13 && o->append_log_quota
                       ? PX_OK
                       : o->job_usage(srv->store.self, id, &log_bytes, &artifact_bytes, &err);
    if (st == PX_OK)
        st = px__api_append_output(srv, id, attempt, rank, stream, rq->body, rq->body_len,
                                   log_bytes, &take, &cut, &seq, &err);
    if (st != PX_OK) {
        px__api_error(rs, 503, "job %s: output not stored: %s; the agent sends it again", id,
                      err.msg);
        return;
    }
    srv->metrics.agent_calls_stored++;
    pthread_cond_broadcast(&srv->changed);
    px__api_json(rs, 200, json_pack("{s:I, s:b}", "seq", (json_int_t)seq, "truncated", cut));
}

bool px__api_agent_standby_route(px__api_req *rq, px__api_resp *rs)
{
    const char *u = rq->url;
    if (!px__api_agent_standby_serves(rq->method, u))
        return false;
    if (strcmp(u, "/v1/agent/register") == 0)
        do_register(rq, rs);
    else if (strcmp(u, "/v1/agent/heartbeat") == 0)
        heartbeat(rq, rs);
    else if (strcmp(u, "/v1/agent/assignments") == 0)
        assignments(rq, rs);
    else {
        const char *rest = u + strlen("/v1/agent/jobs/"), *slash = strchr(rest, '/');
        char id[JOB_ID_MAX + 1];
        size_t n = slash ? (size_t)(slash - rest) : 0;
        if (!slash || n == 0 || n >= sizeof id || strchr(slash + 1, '/')) {
            px__api_error(rs, 404, "%s: no such endpoint", u);
            return true;
        }
        memcpy(id, rest, n);
        id[n] = '\0';
        if (strcmp(slash + 1, "logs") == 0)
            upload_log(rq, rs, id);
        else
            report(rq, rs, id, slash + 1);
    }
    return true;
}
