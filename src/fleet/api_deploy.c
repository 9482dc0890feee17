/* The deployments API: POST /v1/deployments (deploy), GET /v1/deployments
 * (the caller's; an admin sees all), GET and DELETE
 * /v1/deployments/NAME, and what its front end reports: POST and GET
 * /v1/deployments/NAME/observations and /incidents.  Another user's
 * deployment is "not found", so that its existence says nothing; only
 * deploying a taken name says that the name is taken, since names route
 * requests fleet-wide.  A node reports for the deployments its plan puts
 * on it, and reads nothing here. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

/* Whether the deployment's plan puts a stage on the node. */
static bool assigned_to(const px__deploy_row *row, const char *node)
{
    json_t *plan = row->plan ? json_loads(row->plan, 0, NULL) : NULL;
    size_t i;
    json_t *a;
    bool yes = false;
    json_array_foreach(json_object_get(plan, "assignment"), i, a)
    {
        const char *n = json_string_value(json_object_get(a, "node"));
        yes = yes || (n && !strcmp(n, node));
    }
    json_decref(plan);
    return yes;
}

static bool may_see(const px__api_req *rq, const px__deploy_row *row)
{
    if (rq->who.kind == PX__WHO_NODE)
        return assigned_to(row, rq->who.name);
    return rq->who.admin || (row->owner && !strcmp(row->owner, rq->who.name));
}

static void deploy(px__api_req *rq, px__api_resp *rs)
{
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    px__deploy_row row;
    px_err err;
    if (px__srv_deploy(rq->srv, body, rq->who.name, &row, &err) != PX_OK)
        px__api_fail(rs, &err);
    else
        px__api_json(rs, 201, px__srv_deploy_json(rq->srv, &row, true));
    px__deploy_row_release(&row);
    json_decref(body);
}

typedef struct list_ctx {
    px_fleet_server *srv;
    json_t *arr;
} list_ctx;

static void list_one(const px__deploy_row *row, void *ud)
{
    list_ctx *c = ud;
    json_array_append_new(c->arr, px__srv_deploy_json(c->srv, row, false));
}

static void list(px__api_req *rq, px__api_resp *rs)
{
    list_ctx c = {rq->srv, json_array()};
    json_t *arr = c.arr;
    px_err err;
    if (rq->srv->store.ops->list_deployments(rq->srv->store.self,
                                             rq->who.admin ? NULL : rq->who.name, list_one, &c,
                                             &err) != PX_OK) {
        json_decref(arr);
        px__api_fail(rs, &err);
        return;
    }
    px__api_json(rs, 200, json_pack("{s:o}", "deployments", arr));
}

/* Loads the row when the caller may see it; else sets a 404 reply. */
static bool load(px__api_req *rq, px__api_resp *rs, const char *name, px__deploy_row *row)
{
    px_err err;
    if (!px__deploy_name_valid(name)) {
        px__api_error(rs, 404, "no deployment \"%.64s\"", name);
        return false;
    }
    if (rq->srv->store.ops->get_deployment(rq->srv->store.self, name, row, &err) != PX_OK) {
        px__api_fail(rs, &err);
        return false;
    }
    if (!may_see(rq, row)) {
        px__deploy_row_release(row);
        px__api_error(rs, 404, "no deployment \"%.64s\"", name);
        return false;
    }
    return true;
}

static void one(px__api_req *rq, px__api_resp *rs, const char *name)
{
    bool get = strcmp(rq->method, "GET") == 0, del = strcmp(rq->method, "DELETE") == 0;
    if (!get && !del) {
        px__api_error(rs, 405, "%s /v1/deployments/NAME: use GET or DELETE", rq->method);
        return;
    }
    px__deploy_row row;
    if (!load(rq, rs, name, &row))
        return;
    px_err err;
    if (get)
        px__api_json(rs, 200, px__srv_deploy_json(rq->srv, &row, true));
    else if (rq->srv->store.ops->delete_deployment(rq->srv->store.self, name, &err) != PX_OK)
        px__api_fail(rs, &err);
    else {
        /* Its nodes are told at their next heartbeat to let the model go. */
        px__srv_deploy_changed(rq->srv);
        px__srv_deploy_forget(rq->srv, name);
        px__api_json(rs, 200, json_pack("{s:s, s:s}", "name", name, "state", "undeployed"));
    }
    px__deploy_row_release(&row);
}

/* ?NAME=N: a whole number from 0 to max, or def when absent; -1 (reply
 * set) when malformed. */
static int64_t query_count(px__api_req *rq, px__api_resp *rs, const char *key, int64_t def,
                           int64_t max)
{
    const char *v = px__api_query(rq, key);
    if (!v)
        return def;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < 0 || n > max) {
        px__api_error(rs, 400, "?%s=%.32s: expected a whole number from 0 to %lld", key, v,
                      (long long)max);
        return -1;
    }
    return n;
}

static void report(px__api_req *rq, px__api_resp *rs, const px__deploy_row *row,
                   px__deploy_record_kind kind)
{
    size_t max =
        kind == PX__RECORD_OBSERVATION ? PX__DEPLOY_OBSERVATION_MAX : PX__DEPLOY_INCIDENT_MAX;
    if (rq->body_len > max) {
        px__api_error(rs, 413, "%s %s: a body of %zu bytes is over the limit of %zu bytes",
                      rq->method, rq->url, rq->body_len, max);
        return;
    }
    json_t *body = px__api_body_json(rq, rs);
    if (!body)
        return;
    px_err err;
    json_t *rec = kind == PX__RECORD_OBSERVATION ? px__deploy_observation_check(body, &err)
                                                 : px__deploy_incident_check(body, &err);
    json_decref(body);
    int64_t seq = 0;
    if (!rec || px__srv_deploy_record(rq->srv, row->name, kind, rec, &rq->who, &seq, &err) != PX_OK)
        px__api_fail(rs, &err);
    else
        px__api_json(rs, 201,
                     json_pack("{s:s, s:I}", "deployment", row->name, "seq", (json_int_t)seq));
    json_decref(rec);
}

static void records(px__api_req *rq, px__api_resp *rs, const px__deploy_row *row,
                    px__deploy_record_kind kind)
{
    int64_t keep =
        kind == PX__RECORD_OBSERVATION ? PX__DEPLOY_OBSERVATIONS_KEPT : PX__DEPLOY_INCIDENTS_KEPT;
    int64_t after = query_count(rq, rs, "after", 0, INT64_MAX / 2);
    int64_t limit = after < 0 ? -1 : query_count(rq, rs, "limit", keep, keep);
    if (limit < 0)
        return;
    px_err err;
    json_t *list = px__srv_deploy_records(rq->srv, row->name, kind, after, (int)limit, &err);
    if (!list) {
        px__api_fail(rs, &err);
        return;
    }
    json_t *o = json_pack("{s:s, s:o, s:I}", "deployment", row->name,
                          kind == PX__RECORD_OBSERVATION ? "observations" : "incidents", list,
                          "kept", (json_int_t)keep);
    if (o && kind == PX__RECORD_OBSERVATION) {
        json_t *plan = row->plan ? json_loads(row->plan, 0, NULL) : NULL;
        json_object_set_new(o, "predicted", px__deploy_predicted(plan));
        json_decref(plan);
    }
    px__api_json(rs, 200, o);
}

/* NAME/observations and NAME/incidents. */
static void reports_route(px__api_req *rq, px__api_resp *rs, const char *name, size_t name_len,
                          const char *what)
{
    px__deploy_record_kind kind;
    if (!strcmp(what, "observations"))
        kind = PX__RECORD_OBSERVATION;
    else if (!strcmp(what, "incidents"))
        kind = PX__RECORD_INCIDENT;
    else {
        px__api_error(rs, 404, "%s %s: no such endpoint (observations or incidents)", rq->method,
                      rq->url);
        return;
    }
    bool get = !strcmp(rq->method, "GET"), post = !strcmp(rq->method, "POST");
    if (!get && !post) {
        px__api_error(rs, 405, "%s /v1/deployments/NAME/%s: use GET or POST", rq->method, what);
        return;
    }
    if (get && rq->who.kind == PX__WHO_NODE) {
        px__api_error(rs, 403,
                      "a node reports a deployment's %s; reading them takes the owner's "
                      "token",
                      what);
        return;
    }
    char buf[PX__NAME_MAX + 1];
    if (name_len > PX__NAME_MAX) {
        px__api_error(rs, 404, "no deployment \"%.64s\"", name);
        return;
    }
    memcpy(buf, name, name_len);
    buf[name_len] = '\0';
    px__deploy_row row;
    if (!load(rq, rs, buf, &row))
        return;
    if (get)
        records(rq, rs, &row, kind);
    else
        report(rq, rs, &row, kind);
    px__deploy_row_release(&row);
}

bool px__api_deploy_node_may(const char *method, const char *url)
{
    (void)method;
    if (!px_str_starts_with(url, "/v1/deployments/"))
        return false;
    const char *slash = strchr(url + strlen("/v1/deployments/"), '/');
    return slash && (!strcmp(slash, "/observations") || !strcmp(slash, "/incidents"));
}

bool px__api_deploy_route(px__api_req *rq, px__api_resp *rs)
{
    const char *u = rq->url;
    if (px__api_deploy_node_may(rq->method, u)) {
        const char *name = u + strlen("/v1/deployments/");
        const char *slash = strchr(name, '/');
        reports_route(rq, rs, name, (size_t)(slash - name), slash + 1);
        return true;
    }
    if (rq->who.kind == PX__WHO_NODE)
        return false;
    if (strcmp(u, "/v1/deployments") == 0) {
        if (strcmp(rq->method, "POST") == 0)
            deploy(rq, rs);
        else if (strcmp(rq->method, "GET") == 0)
            list(rq, rs);
        else
            px__api_error(rs, 405, "%s /v1/deployments: use GET or POST", rq->method);
        return true;
    }
    if (px_str_starts_with(u, "/v1/deployments/")) {
        one(rq, rs, u + strlen("/v1/deployments/"));
        return true;
    }
    return false;
}
