/* The deployments API: POST /v1/deployments (deploy), GET /v1/deployments
 * (the caller's; an admin sees all), GET and DELETE
 * /v1/deployments/NAME.  Another user's deployment is "not found", so
 * that its existence says nothing; only deploying a taken name says that
 * the name is taken, since names route requests fleet-wide. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

static bool may_see(const px__api_req *rq, const px__deploy_row *row)
{
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
        px__api_json(rs, 200, json_pack("{s:s, s:s}", "name", name, "state", "undeployed"));
    }
    px__deploy_row_release(&row);
}

bool px__api_deploy_route(px__api_req *rq, px__api_resp *rs)
{
    const char *u = rq->url;
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
