/* Agent endpoints: join, register, heartbeat, assignments (long poll),
 * credential rotation, and the reports of each member: start, log chunks,
 * finish (artifacts are streamed uploads, api_upload.c).  Every call is
 * bound to the node whose credential made it: a node names no other node,
 * and reports only members assigned to it; reports for an attempt that is
 * not the job's current one are refused (409) and change nothing.  Called
 * with the server lock held. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <ctype.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MAX_WAIT_S 30
/* A poll of a node running stage workers looks at its connection this
 * often. */

static const char *const node_states[] = {"online", "offline", "draining"};

/* Work the agent says it runs that it must stop: ended or unknown jobs,
 * stale attempts, members no longer assigned to this node. */
static json_t *stop_list(px_fleet_server *srv, size_t node, const json_t *running)
{
    json_t *stop = json_array();
    for (size_t k = 0; json_is_array(running) && k < json_array_size(running) && k < 4096; k++) {
        const json_t *r = json_array_get(running, k);
        const char *id = json_string_value(json_object_get(r, "job"));
        const json_t *att = json_object_get(r, "attempt");
        const json_t *rank = json_object_get(r, "rank");
        if (!id || !json_is_integer(att))
            continue;
        px__job *j = px__srv_find_job(srv, id);
        /* Its assignment is being committed: a replica that serves agents
         * from the database may have handed it out already. */
        if (j && j->committing)
            continue;
        json_int_t rk = json_is_integer(rank) ? json_integer_value(rank) : 0;
        bool keep = j && json_integer_value(att) == j->row.attempt && rk >= 0 &&
                    rk < j->n_members && j->members[rk].node == (int)node &&
                    j->state != PX__JOB_QUEUED;
        if (!keep)
            json_array_append_new(
                stop, json_pack("{s:s, s:O, s:I}", "job", id, "attempt", att, "rank", rk));
    }
    return stop;
}

/* The caller's node in the scheduler; a "node" the caller names (in the
 * body or the query) must be its own. */
static bool own_node(px__api_req *rq, px__api_resp *rs, const char *named, size_t *i)
{
    if (named && strcmp(named, rq->who.name) != 0) {
        px__api_error(rs, 403,
                      "this credential belongs to node \"%s\", not \"%.64s\"; a node speaks "
                      "only for itself",
                      rq->who.name, named);
        return false;
    }
    if (px_fleet_sched_find_node(rq->srv->sched, rq->who.name, i, NULL) != PX_OK) {
        px__api_error(rs, 404, "unknown node \"%s\": register again", rq->who.name);
        return false;
    }
    return true;
}

static void lease_reply(px_fleet_server *srv, px__api_resp *rs, size_t node, const json_t *running,
                        bool with_node)
{
    const char *name = px_fleet_sched_node_name(srv->sched, node);
    json_t *o = json_pack("{s:f, s:f, s:o}", "lease_s", srv->opt.lease_s, "heartbeat_s",
                          srv->opt.heartbeat_s, "stop", stop_list(srv, node, running));
    if (with_node)
        json_object_set_new(o, "node", json_string(name));
    if (json_object_get(srv->rotate, name))
        json_object_set_new(o, "rotate_credential", json_true());
    /* The models this node is to hold for deployments planned on it. */
    json_object_set_new(o, "models", px__srv_deploy_models(srv, name));
    px__api_json(rs, 200, o);
}

static void bring_online(px_fleet_server *srv, size_t i)
{
    px__srv_touch_node(srv, i);
    if (px_fleet_sched_state(srv->sched, i) == PX_FLEET_NODE_OFFLINE) {
        px_err err;
        const char *name = px_fleet_sched_node_name(srv->sched, i);
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_ONLINE);
        if (srv->store.ops->put_node(srv->store.self, name, NULL, "online", px_wall_time(), &err) !=
            PX_OK)
            px_log_error("fleet: node %s: %s", name, err.msg);
        srv->dirty = true;
        pthread_cond_signal(&srv->kick);
    }
}

/* Registration of the caller's node (a join or a register), body borrowed. */
static void accept_registration(px__api_req *rq, px__api_resp *rs, json_t *body)
{
    px_fleet_server *srv = rq->srv;
    size_t i;
    px_err err;
    if (px_fleet_sched_add_node(srv->sched, body, &i, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return;
    }
    /* The registration minus its volatile parts is what a restart reloads. */
    json_t *keep = json_deep_copy(body);
    json_object_del(keep, "running");
    char *text = keep ? json_dumps(keep, JSON_COMPACT) : NULL;
    json_decref(keep);
    px__srv_touch_node(srv, i);
    if (!text || srv->store.ops->put_node(srv->store.self, px_fleet_sched_node_name(srv->sched, i),
                                          text, node_states[px_fleet_sched_state(srv->sched, i)],
                                          px_wall_time(), &err) != PX_OK) {
        free(text);
        px__api_error(rs, 503, "node registered but not stored: %s; retry",
                      text ? err.msg : "out of memory");
        return;
    }
    free(text);
    if (px__srv_reconcile_node(srv, i, json_object_get(body, "running"), -1, &err) != PX_OK) {
        px__api_error(rs, 503, "node registered, its lost work not yet requeued: %s; retry",
                      err.msg);
        return;
    }
    px_log_info("fleet: node %s registered", px_fleet_sched_node_name(srv->sched, i));
    srv->dirty = true;
    pthread_cond_signal(&srv->kick);
    lease_reply(srv, rs, i, json_object_get(body, "running"), true);
}

static void do_join(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    char *credential = px_strdup(json_string_value(json_object_get(body, "credential")));
    json_object_del(body, "credential"); /* never stored with the registration */
    px_err err;
    bool valid = name && strlen(name) <= 64 && name[0];
    for (const char *c = name; valid && *c; c++)
        valid = isalnum((unsigned char)*c) || strchr("_.-", *c);
    if (!name || !credential)
        px__api_error(rs, 400, "join: the body needs \"name\" and the node's \"credential\"");
    else if (!valid)
        px__api_error(rs, 400, "/name: a node name is 1 to 64 of A-Z a-z 0-9 _ . -");
    else if (px__auth_join(rq->srv, name, credential, &err) != PX_OK)
        px__api_fail(rs, &err);
    else {
        px_strlcpy(rq->who.name, name, sizeof rq->who.name);
        accept_registration(rq, rs, body);
        if (rs->status == 200)
            px_log_info("fleet: node %s joined", name);
    }
    if (credential) {
        memset(credential, 0, strlen(credential));
        free(credential);
    }
    json_decref(body);
}

static void do_register(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    if (name && strcmp(name, rq->who.name) != 0)
        px__api_error(rs, 403,
                      "this credential belongs to node \"%s\"; it cannot register \"%.64s\"",
                      rq->who.name, name);
    else {
        json_object_set_new(body, "name", json_string(rq->who.name));
        json_object_del(body, "credential");
        accept_registration(rq, rs, body);
    }
    json_decref(body);
}

static void rotate_credential(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    const char *cred = json_string_value(json_object_get(body, "credential"));
    px_err err;
    if (!cred)
        px__api_error(rs, 400, "/credential: expected the node's next credential");
    else if (px__auth_add_pending(rq->srv, rq->who.name, cred, &err) != PX_OK)
        px__api_fail(rs, &err);
    else
        px__api_json(rs, 200, json_pack("{s:s}", "node", rq->who.name));
    json_decref(body);
}

static void heartbeat(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    size_t i;
    if (own_node(rq, rs, json_string_value(json_object_get(body, "node")), &i)) {
        bring_online(srv, i);
        px_fleet_sched_update_live(srv->sched, i, body);
        px__srv_stages_report(srv, rq->who.name, json_object_get(body, "stages"));
        px__srv_deploy_evictions(srv, rq->who.name, json_object_get(body, "evictions"));
        double now = (double)px_now_ns();
        if (i < srv->cap_last_seen && now - srv->hb_written_ns[i] > 30e9) {
            srv->hb_written_ns[i] = now;
            char *live = json_dumps(json_object_get(body, "live") ? json_object_get(body, "live")
                                                                  : json_null(),
                                    JSON_COMPACT | JSON_ENCODE_ANY);
            px_err err;
            if (srv->store.ops->put_heartbeat(srv->store.self, rq->who.name, px_wall_time(), live,
                                              &err) != PX_OK)
                px_log_warn("fleet: node %s: live report not stored: %s", rq->who.name, err.msg);
            free(live);
        }
        /* A numbered list (agents that keep listing work until its end is
         * acknowledged) loses the members it no longer holds at once.  Not
         * where standbys serve agents: a finish report a standby queued may
         * not be applied yet, and the member would be run twice. */
        const json_t *seq = json_object_get(body, "running_seq");
        px_err err;
        if (!srv->node_calls_on && json_is_integer(seq) && json_integer_value(seq) >= 0 &&
            json_is_array(json_object_get(body, "running")) &&
            px__srv_reconcile_node(srv, i, json_object_get(body, "running"),
                                   json_integer_value(seq), &err) != PX_OK)
            px_log_warn("fleet: node %s: work it no longer runs not yet requeued: %s", rq->who.name,
                        err.msg);
        bool queued = false;
        for (px__job *j = srv->jobs; j && !queued; j = j->next)
            queued = j->state == PX__JOB_QUEUED;
        if (queued) {
            srv->dirty = true;
            pthread_cond_signal(&srv->kick);
        }
        lease_reply(srv, rs, i, json_object_get(body, "running"), false);
    }
    json_decref(body);
}

json_t *px__srv_assignment_json(px_fleet_server *srv, px__job *job, int rank)
{
    const px__sched_node *n = &srv->sched->nodes[job->members[rank].node];
    const px__sched_node *master = &srv->sched->nodes[job->members[0].node];
    json_t *idx = json_array(), *hosts = json_array();
    const json_t *devs = job->members[rank].devices;
    for (size_t k = 0; json_is_array(devs) && k < json_array_size(devs); k++) {
        const char *id = json_string_value(json_array_get(devs, k));
        for (int d = 0; id && d < n->n_devs; d++)
            if (strcmp(n->devs[d].id, id) == 0)
                json_array_append_new(idx, json_integer(n->devs[d].vendor_ordinal));
    }
    for (int m = 0; m < job->n_members; m++)
        json_array_append_new(hosts, json_string(srv->sched->nodes[job->members[m].node].address));
    char rk[16], ws[16], port[16];
    snprintf(rk, sizeof rk, "%d", rank);
    snprintf(ws, sizeof ws, "%d", job->n_members);
    snprintf(port, sizeof port, "%d", job->master_port);
    json_t *env = json_pack("{s:s, s:s, s:s, s:s, s:s}", "RANK", rk, "WORLD_SIZE", ws, "LOCAL_RANK",
                            "0", "MASTER_ADDR", master->address, "MASTER_PORT", port);
    const char *launcher = json_string_value(json_object_get(job->req->spec, "launcher"));
    launcher = launcher ? launcher : "env";
    json_t *dv = devs ? json_incref((json_t *)devs) : json_array();
    json_t *a = json_pack("{s:s, s:i, s:i, s:i, s:O, s:o, s:o, s:o, s:o, s:s}", "job", job->row.id,
                          "attempt", job->row.attempt, "rank", rank, "world_size", job->n_members,
                          "spec", job->req->spec, "devices", dv, "device_indices", idx, "env", env,
                          "hosts", hosts, "launcher", launcher);
    if (strcmp(launcher, "torchrun") == 0) {
        json_t *args = json_array();
        char buf[300];
        snprintf(buf, sizeof buf, "--nnodes=%d", job->n_members);
        json_array_append_new(args, json_string(buf));
        snprintf(buf, sizeof buf, "--node_rank=%d", rank);
        json_array_append_new(args, json_string(buf));
        json_array_append_new(args, json_string("--nproc_per_node=1"));
        snprintf(buf, sizeof buf, "--master_addr=%s", master->address);
        json_array_append_new(args, json_string(buf));
        snprintf(buf, sizeof buf, "--master_port=%d", job->master_port);
        json_array_append_new(args, json_string(buf));
        json_object_set_new(a, "torchrun_args", args);
    }
    const json_t *model = json_object_get(job->req->spec, "model");
    const char *digest = json_string_value(json_object_get(model, "digest"));
    if (digest) {
        char url[120];
        snprintf(url, sizeof url, "/v1/blobs/%s", digest);
        json_object_set_new(a, "model", json_pack("{s:s, s:s}", "digest", digest, "url", url));
    }
    if (job->time_limit_s > 0)
        json_object_set_new(a, "time_limit_s", json_real(job->time_limit_s));
    return a;
}

static json_t *pending_for(px_fleet_server *srv, size_t node)
{
    json_t *arr = json_array();
    for (px__job *j = srv->jobs; j; j = j->next) {
        if (j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING)
            continue;
        for (int m = 0; m < j->n_members; m++)
            if (j->members[m].node == (int)node && j->members[m].state == PX__MEM_PENDING)
                json_array_append_new(arr, px__srv_assignment_json(srv, j, m));
    }
    return arr;
}

bool px__api_agent_wait(px__api_req *rq, px__api_resp *rs, double *wait)
{
    const char *w = px__api_query(rq, "wait");
    *wait = 10;
    if (!w)
        return true;
    char *end;
    *wait = strtod(w, &end);
    if (*end || end == w || !(*wait >= 0 && *wait <= MAX_WAIT_S)) {
        px__api_error(rs, 400, "wait \"%.16s\": expected 0..%d seconds", w, MAX_WAIT_S);
        return false;
    }
    return true;
}

static void assignments(px__api_req *rq, px__api_resp *rs)
{
    px_fleet_server *srv = rq->srv;
    double wait;
    if (!px__api_agent_wait(rq, rs, &wait))
        return;
    size_t i;
    if (!own_node(rq, rs, px__api_query(rq, "node"), &i))
        return;
    uint64_t deadline = px_now_ns() + (uint64_t)(wait * 1e9);
    /* The agent is alive when it asks, not each time this poll wakes: a
     * poll still open when its agent died must not revive a lost node. */
    bring_online(srv, i);
    const char *name = rq->who.name;
    /* A node that runs stage workers is watched through this poll: when
     * its agent dies, the connection closes, and its workers died with it
     * (the executors using them are told at once, not a lease later). */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    struct sockaddr_in local;
    socklen_t local_len = sizeof local;
    if (fd >= 0 && getsockname(fd, (struct sockaddr *)&local, &local_len) == 0 &&
        local.sin_family == AF_INET)
        inet_ntop(AF_INET, &local.sin_addr, srv->stage_host, sizeof srv->stage_host);
    px__srv_stages_poll(srv, name, true);
    for (;;) {
        json_t *arr = pending_for(srv, i);
        bool stages = px__srv_stages_pending(srv, name);
        bool watch = !stages && px__srv_stages_watch(srv, name);
        uint64_t until = watch ? PX_MIN(deadline, px_now_ns() + PX__WATCH_SLICE_NS) : deadline;
        if (json_array_size(arr) > 0 || stages ||
            (!px__srv_wait(srv, until) && (!watch || px_now_ns() >= deadline || srv->stopping))) {
            px__srv_stages_poll(srv, name, false);
            px__api_json(rs, 200,
                         json_pack("{s:o, s:o}", "assignments", arr, "stages",
                                   px__srv_stages_for(srv, name)));
            return;
        }
        json_decref(arr);
        if (watch && px__srv_stages_conn_closed(fd)) {
            px__srv_stages_poll(srv, name, false);
            px__srv_stages_node_lost(srv, name, "its agent's connection to the server closed");
            px__api_error(rs, 410, "node %s: the connection closed", name);
            return;
        }
        /* Revoked while waiting: the credential no longer names a node. */
        if (px__auth_is_revoked(srv, rq->who.name)) {
            px__srv_stages_poll(srv, name, false);
            px__api_error(rs, 401, "node %s was revoked", rq->who.name);
            return;
        }
    }
}

/* Finds an active job, answering 409 for an ended one and 404 otherwise;
 * one whose assignment is being committed once the commit is settled (a
 * replica serving agents from the database may hand it out first). */
static px__job *active_job(px__api_req *rq, px__api_resp *rs, const char *id)
{
    px__job *j = px__srv_find_job_settled(rq->srv, id);
    if (j)
        return j;
    px__job_row row;
    px_err err;
    if (rq->srv->store.ops->get_job(rq->srv->store.self, id, &row, &err) == PX_OK) {
        px__api_error(rs, 409, "stale attempt: job %s has ended (%s); stop this work", id,
                      row.state);
        px__job_row_release(&row);
    } else
        px__api_fail(rs, &err);
    return NULL;
}

static bool int_arg(px__api_req *rq, px__api_resp *rs, const json_t *body, const char *key,
                    int *out)
{
    long v;
    if (body) {
        const json_t *x = json_object_get(body, key);
        if (!json_is_integer(x) || json_integer_value(x) < -1000000 ||
            json_integer_value(x) > 1000000) {
            px__api_error(rs, 400, "/%s: expected an integer", key);
            return false;
        }
        *out = (int)json_integer_value(x);
        return true;
    }
    const char *q = px__api_query(rq, key);
    char *end;
    if (!q || (v = strtol(q, &end, 10), *end) || v < 0 || v > 1000000) {
        px__api_error(rs, 400, "?%s=: expected a non-negative integer", key);
        return false;
    }
    *out = (int)v;
    return true;
}

static void report(px__api_req *rq, px__api_resp *rs, px__job *job, const char *what)
{
    px_fleet_server *srv = rq->srv;
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    int attempt, rank = 0;
    size_t node;
    if (!int_arg(rq, rs, body, "attempt", &attempt) ||
        (json_object_get(body, "rank") && !int_arg(rq, rs, body, "rank", &rank)) ||
        !own_node(rq, rs, json_string_value(json_object_get(body, "node")), &node)) {
        json_decref(body);
        return;
    }
    px__srv_touch_node(srv, node);
    px_err err;
    px_status st;
    if (strcmp(what, "start") == 0) {
        st = px__srv_member_start(srv, job, attempt, rank, (int)node, &err);
        /* From which of its running lists the agent lists this member (0:
         * it does not say, and its heartbeats never lose the member). */
        const json_t *l = json_object_get(body, "listed");
        if (st == PX_OK)
            job->members[rank].listed =
                json_is_integer(l) && json_integer_value(l) > 0 ? json_integer_value(l) : 0;
    } else {
        int code = -1, sig = 0;
        const json_t *c = json_object_get(body, "exit_code");
        const json_t *s = json_object_get(body, "signal");
        const json_t *e = json_object_get(body, "error");
        if (json_is_integer(c))
            code = (int)json_integer_value(c);
        if (json_is_integer(s))
            sig = (int)json_integer_value(s);
        if (e && !json_is_string(e) && !json_is_null(e)) {
            px__api_error(rs, 400, "/error: expected a string or null");
            json_decref(body);
            return;
        }
        st = px__srv_member_finish(srv, job, attempt, rank, (int)node, code, sig,
                                   json_object_get(body, "result"), json_string_value(e), &err);
    }
    json_decref(body);
    if (st != PX_OK) {
        px__api_fail(rs, &err);
        return;
    }
    px__api_json(rs, 200, json_object());
}

px_status px__api_append_output(px_fleet_server *srv, const char *job, int attempt, int rank,
                                const char *stream, const void *data, size_t len, int64_t used,
                                size_t *taken, bool *cut, int64_t *seq, px_err *err)
{
    uint64_t quota = srv->opt.log_quota;
    char note[200];
    snprintf(note, sizeof note,
             "\n[plexus: output truncated: the job's log quota of %llu bytes is "
             "reached; the rest is dropped]\n",
             (unsigned long long)quota);
    const px__store_ops *o = srv->store.ops;
    if (o->version >= 13 && o->append_log_quota)
        return o->append_log_quota(srv->store.self, job, attempt, rank, stream, data, len,
                                   (int64_t)PX_MIN(quota, (uint64_t)INT64_MAX), note, taken, cut,
                                   seq, err);
    uint64_t u = (uint64_t)PX_MAX(used, 0);
    size_t take = u >= quota ? 0 : (size_t)PX_MIN((uint64_t)len, quota - u);
    *taken = 0;
    *cut = take < len;
    *seq = 0;
    px_status st = PX_OK;
    if (take > 0)
        st = o->append_log(srv->store.self, job, attempt, rank, stream, data, take, seq, err);
    if (st == PX_OK && *cut && u <= quota)
        st = o->append_log(srv->store.self, job, attempt, rank, "stderr", note, strlen(note), seq,
                           err);
    if (st == PX_OK)
        *taken = take;
    return st;
}

/* Appends a chunk of output within the job's log quota: the part past the
 * quota is dropped, once, with a line that says so, and the reply tells
 * the agent to send no more. */
static void upload_log(px__api_req *rq, px__api_resp *rs, px__job *job)
{
    px_fleet_server *srv = rq->srv;
    int attempt, rank;
    size_t node;
    if (!int_arg(rq, rs, NULL, "attempt", &attempt) || !int_arg(rq, rs, NULL, "rank", &rank) ||
        !own_node(rq, rs, NULL, &node))
        return;
    const char *stream = px__api_query(rq, "stream");
    if (!stream || (strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0)) {
        px__api_error(rs, 400, "?stream=: expected stdout or stderr");
        return;
    }
    px_err err;
    if (px__srv_check_member(job, attempt, rank, (int)node, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return;
    }
    if (job->log_truncated) {
        px__api_json(rs, 200, json_pack("{s:I, s:b}", "seq", (json_int_t)0, "truncated", 1));
        return;
    }
    if (px__srv_disk_headroom(srv) < (int64_t)rq->body_len) {
        px__api_error(rs, 507,
                      "the server's data folder is below its free-space reserve; the agent "
                      "keeps the output and sends it later");
        return;
    }
    uint64_t quota = srv->opt.log_quota;
    size_t take = 0;
    bool cut = false;
    int64_t seq = 0;
    px_status st = px__api_append_output(srv, job->row.id, attempt, rank, stream, rq->body,
                                         rq->body_len, job->log_bytes, &take, &cut, &seq, &err);
    if (st != PX_OK) {
        px__api_fail(rs, &err);
        return;
    }
    job->log_bytes += (int64_t)take;
    job->log_truncated = cut;
    if (cut)
        px_log_warn("fleet: job %s: log quota of %llu bytes reached; output truncated", job->row.id,
                    (unsigned long long)quota);
    pthread_cond_broadcast(&srv->changed);
    px__api_json(rs, 200, json_pack("{s:I, s:b}", "seq", (json_int_t)seq, "truncated", cut));
}

static void job_report_route(px__api_req *rq, px__api_resp *rs, const char *rest)
{
    char id[64];
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : 0;
    if (!slash || n == 0 || n >= sizeof id) {
        px__api_error(rs, 404, "%s: no such endpoint", rq->url);
        return;
    }
    memcpy(id, rest, n);
    id[n] = '\0';
    const char *sub = slash + 1;
    bool post = strcmp(rq->method, "POST") == 0;
    px__job *job = active_job(rq, rs, id);
    if (!job)
        return;
    if ((strcmp(sub, "start") == 0 || strcmp(sub, "finish") == 0) && post)
        report(rq, rs, job, sub);
    else if (strcmp(sub, "logs") == 0 && post)
        upload_log(rq, rs, job);
    else
        px__api_error(rs, 405, "%s %s: method or path not supported", rq->method, rq->url);
}

/* POST /v1/agent/stages {"reports": [...]}: the agent's answers to stage
 * orders (listening, or why not) and the ends of its workers. */
static void stage_reports(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    const json_t *reports = json_object_get(body, "reports");
    if (!json_is_array(reports)) {
        px__api_error(rs, 400, "stage reports: expected {\"reports\": [...]}");
    } else {
        px__srv_stages_report(rq->srv, rq->who.name, reports);
        px__api_json(rs, 200, json_pack("{s:b}", "ok", 1));
    }
    json_decref(body);
}

bool px__api_agent_route(px__api_req *rq, px__api_resp *rs)
{
    const char *u = rq->url;
    bool post = strcmp(rq->method, "POST") == 0;
    /* Another replica schedules: what the store answers, from it. */
    if (!atomic_load(&rq->srv->active))
        return px__api_agent_standby_route(rq, rs);
    if (strcmp(u, "/v1/agent/join") == 0 && post)
        do_join(rq, rs);
    else if (strcmp(u, "/v1/agent/register") == 0 && post)
        do_register(rq, rs);
    else if (strcmp(u, "/v1/agent/credential") == 0 && post)
        rotate_credential(rq, rs);
    else if (strcmp(u, "/v1/agent/stages") == 0 && post)
        stage_reports(rq, rs);
    else if (strcmp(u, "/v1/agent/heartbeat") == 0 && post)
        heartbeat(rq, rs);
    else if (strcmp(u, "/v1/agent/assignments") == 0 && strcmp(rq->method, "GET") == 0)
        assignments(rq, rs);
    else if (px_str_starts_with(u, "/v1/agent/jobs/"))
        job_report_route(rq, rs, u + strlen("/v1/agent/jobs/"));
    else
        return false;
    return true;
}
