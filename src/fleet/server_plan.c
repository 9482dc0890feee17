/* Model workloads with `plan: "auto"`: ask the planner for a plan across
 * the fleet's online devices.  When it cannot (the model file is not on
 * the server, the registered nodes do not form a valid inventory, the
 * planner finds no feasible plan) the job records why, in words, and is
 * placed by the filter-and-score matcher alone: never a pretended plan. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

#include <unistd.h>

typedef struct inv_ctx {
    px_fleet_server *srv;
    json_t *nodes;
} inv_ctx;

static void add_node(const char *name, const char *reg, const char *state, int64_t last_seen,
                     void *ud)
{
    (void)state;
    (void)last_seen;
    inv_ctx *c = ud;
    size_t i;
    if (px_fleet_sched_find_node(c->srv->sched, name, &i, NULL) != PX_OK ||
        px_fleet_sched_state(c->srv->sched, i) != PX_FLEET_NODE_ONLINE)
        return;
    json_t *r = reg ? json_loads(reg, 0, NULL) : NULL;
    json_t *node = json_object_get(r, "node");
    if (json_is_object(node)) {
        json_t *copy = json_deep_copy(node);
        json_object_set_new(copy, "id", json_string(name));
        json_array_append_new(c->nodes, copy);
    }
    json_decref(r);
}

static json_t *unavailable(const char *fmt, ...) PX_PRINTF(1, 2);
static json_t *unavailable(const char *fmt, ...)
{
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return json_pack("{s:s, s:s}", "status", "planner unavailable", "detail", detail);
}

json_t *px__srv_plan(px_fleet_server *srv, const px__job *job)
{
    const char *digest =
        json_string_value(json_object_get(json_object_get(job->req->spec, "model"), "digest"));
    char path[PATH_MAX];
    px_err err;
    if (!digest || px__blob_path(srv->data_dir, digest, path, sizeof path, &err) != PX_OK ||
        access(path, R_OK) != 0)
        return unavailable("the model %.64s is not on the server; upload it with POST /v1/blobs "
                           "(plexus submit --model FILE does) to get a plan",
                           digest ? digest : "?");
    inv_ctx c = {srv, json_array()};
    srv->store.ops->list_nodes(srv->store.self, add_node, &c, NULL);
    if (json_array_size(c.nodes) == 0) {
        json_decref(c.nodes);
        return unavailable("no online node describes its devices");
    }
    json_t *doc = json_pack("{s:s, s:s, s:o}", "schema", "plexus.inventory/1", "name", "fleet",
                            "nodes", c.nodes);
    px_hw_graph *g = NULL;
    px_ir_model *m = NULL;
    px_plan *plan = NULL;
    json_t *out = NULL;
    if (px_hw_graph_from_value(doc, "fleet inventory", NULL, &g, NULL, &err) != PX_OK) {
        out = unavailable("the fleet's registered nodes are not a valid inventory: %s", err.msg);
        goto done;
    }
    if (px_ir_model_open(path, NULL, &m, &err) != PX_OK) {
        out = unavailable("the model could not be read: %s", err.msg);
        goto done;
    }
    px_plan_request req;
    px_plan_request_default(&req);
    req.graph = g;
    req.model = m;
    if (px_plan_search(&req, &plan, &err) != PX_OK) {
        out = unavailable("the planner found no plan: %s", err.msg);
        goto done;
    }
    json_t *p = px_plan_to_json(plan);
    out =
        p ? json_pack("{s:s, s:o}", "status", "planned", "plan", p) : unavailable("out of memory");
done:
    px_plan_free(plan);
    px_ir_model_free(m);
    px_hw_graph_free(g);
    json_decref(doc);
    return out;
}
