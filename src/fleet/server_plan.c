/* Model workloads: ask the planner for a plan across the fleet's online
 * devices, for `plan: "auto"` jobs and for deployments.  When it cannot
 * (the model file is not on the server, the registered nodes do not form
 * a valid inventory, the planner finds no feasible plan) the record says
 * why, in words: a job is then placed by the filter-and-score matcher
 * alone, a deployment refused; never a pretended plan.  A deployment
 * prefers the nodes where its model is already resident (warm) when the
 * plan over them alone is nearly as good as the plan over every node, and
 * says which it chose and why. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/contract.h"
#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"

#include <math.h>
#include <unistd.h>

/* A plan over warm nodes is kept when its objective's figure is at most
 * this factor worse than the plan over every online node: fetching the
 * model and loading it cold costs more than a small loss at steady
 * state, and a large loss is never worth it. */
#define WARM_SLACK 1.25

typedef struct inv_ctx {
    px_fleet_server *srv;
    json_t *nodes;
    json_t *links;              /* the links inside each node, as inventory links */
    const px_digest *warm_only; /* only the nodes where this model is resident; NULL: all */
} inv_ctx;

/* The device of node (its description) that a registered link end names:
 * its local id, or the node's id as the agent knew it, a dot and the
 * local id.  NULL when it names none (the host, another node). */
static const char *local_device(const json_t *node, const char *orig_id, const char *end)
{
    if (!end)
        return NULL;
    size_t n = orig_id ? strlen(orig_id) : 0;
    const char *local = n && !strncmp(end, orig_id, n) && end[n] == '.' ? end + n + 1 : end;
    size_t i;
    const json_t *d;
    json_array_foreach(json_object_get(node, "devices"), i, d)
    {
        const char *id = json_string_value(json_object_get(d, "id"));
        if (id && !strcmp(id, local))
            return id;
    }
    return NULL;
}

/* The links an agent registered between its node's devices, as inventory
 * links between "NAME.DEVICE" ends (the node is known by its registered
 * name).  The agent says what it measured or read: bandwidth, and from
 * newer agents the kind, the latency and whether the link goes both
 * ways; a link without a kind is "other".  Links to the host or to
 * devices the node does not describe join no devices and are left out. */
static void add_node_links(json_t *out, const char *name, const json_t *node, const char *orig_id,
                           const json_t *links)
{
    size_t i;
    const json_t *l;
    json_array_foreach(links, i, l)
    {
        const char *a = local_device(node, orig_id, json_string_value(json_object_get(l, "from")));
        const char *b = local_device(node, orig_id, json_string_value(json_object_get(l, "to")));
        const json_t *bw = json_object_get(l, "bandwidth");
        if (!a || !b || !strcmp(a, b) || !json_is_string(bw))
            continue;
        const char *kind = json_string_value(json_object_get(l, "kind"));
        char *from = px_asprintf("%s.%s", name, a), *to = px_asprintf("%s.%s", name, b);
        json_t *link = from && to ? json_pack("{s:s, s:s, s:s, s:O}", "from", from, "to", to,
                                              "kind", kind ? kind : "other", "bandwidth", bw)
                                  : NULL;
        free(from);
        free(to);
        if (!link)
            continue;
        const json_t *lat = json_object_get(l, "latency"),
                     *bidi = json_object_get(l, "bidirectional");
        if (json_is_string(lat))
            json_object_set(link, "latency", (json_t *)lat);
        if (json_is_boolean(bidi))
            json_object_set(link, "bidirectional", (json_t *)bidi);
        json_array_append_new(out, link);
    }
}

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
    if (c->warm_only && !px__sched_node_resident(&c->srv->sched->nodes[i], c->warm_only))
        return;
    json_t *r = reg ? json_loads(reg, 0, NULL) : NULL;
    json_t *node = json_object_get(r, "node");
    if (json_is_object(node)) {
        json_t *copy = json_deep_copy(node);
        add_node_links(c->links, name, node, json_string_value(json_object_get(node, "id")),
                       json_object_get(r, "links"));
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

/* The contract a request names: a built-in by name, or a document. */
px_status px__srv_open_contract(const json_t *spec, px_contract **out, px_err *err)
{
    *out = NULL;
    if (!spec || json_is_null(spec))
        return PX_OK;
    if (json_is_string(spec))
        return px_contract_builtin(json_string_value(spec), out, err);
    if (json_is_object(spec))
        return px_contract_from_json(spec, "contract", NULL, out, err);
    return px_err_set(err, PX_EINVAL,
                      "contract: expected a built-in name (strict, deterministic, relaxed) or a "
                      "plexus.contract/1 document");
}

/* The text report of the plan, as `plexus plan` prints it. */
static json_t *report_of(const px_plan *plan)
{
    px_strbuf sb = PX_STRBUF_INIT;
    json_t *v = px_plan_report(plan, &sb) == PX_OK ? json_string(sb.buf ? sb.buf : "") : NULL;
    px_strbuf_release(&sb);
    return v;
}

/* Which node each stage of each replica runs on, from the plan's fleet. */
static json_t *assignment_of(const px_plan *plan)
{
    px_plan_summary sum;
    px_plan_get_summary(plan, &sum);
    const px_cost_fleet *fleet = px_plan_fleet(plan);
    json_t *arr = json_array();
    for (uint32_t r = 0; arr && r < sum.n_replicas; r++) {
        const px_cost_pipeline *p = px_plan_pipeline(plan, r);
        for (uint32_t s = 0; p && s < p->n_stages; s++) {
            const px_cost_device *d = &fleet->devices[p->stages[s].devices[0]];
            json_t *devs = json_array();
            for (uint32_t k = 0; devs && k < p->stages[s].tp; k++)
                json_array_append_new(devs,
                                      json_string(fleet->devices[p->stages[s].devices[k]].id));
            json_t *o = json_pack("{s:i, s:i, s:s, s:o, s:i, s:i}", "replica", (json_int_t)r,
                                  "stage", (json_int_t)s, "node", d->node_id ? d->node_id : "?",
                                  "devices", devs, "first_layer", (json_int_t)p->stages[s].first,
                                  "last_layer", (json_int_t)p->stages[s].last);
            if (!o || json_array_append_new(arr, o) != 0) {
                json_decref(arr);
                return NULL;
            }
        }
    }
    return arr;
}

/* Links between the nodes: what the agents report describes each node
 * from inside, and nothing yet measures the network between them, so
 * every pair is joined by an Ethernet link whose figures are marked
 * assumed (the plan's report shows them as such).  Without these the
 * planner could never cut a model across nodes. */
#define NET_BANDWIDTH "1.25 GB/s"
#define NET_LATENCY   "50 us"

static json_t *assumed_network(const json_t *nodes)
{
    json_t *links = json_array();
    size_t n = json_array_size(nodes);
    for (size_t i = 0; links && i < n; i++)
        for (size_t k = i + 1; k < n; k++) {
            const char *a = json_string_value(json_object_get(json_array_get(nodes, i), "id"));
            const char *b = json_string_value(json_object_get(json_array_get(nodes, k), "id"));
            json_t *l = json_pack("{s:s, s:s, s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}}", "from",
                                  a, "to", b, "kind", "ethernet", "bandwidth", "value",
                                  NET_BANDWIDTH, "provenance", "assumed", "source",
                                  "not measured: the fleet's nodes are assumed joined by 10 GbE",
                                  "latency", "value", NET_LATENCY, "provenance", "assumed",
                                  "source", "not measured: a switched Ethernet hop");
            if (!l || json_array_append_new(links, l) != 0) {
                json_decref(links);
                return NULL;
            }
        }
    return links;
}

/* One planning run and what its plan borrows (released by run_release). */
typedef struct plan_run {
    px_hw_graph *graph;
    px_ir_model *model;
    px_contract *contract;
    px_plan *plan;
    size_t n_nodes;
} plan_run;

static void run_release(plan_run *r)
{
    px_plan_free(r->plan);
    px_contract_free(r->contract);
    px_ir_model_free(r->model);
    px_hw_graph_free(r->graph);
    memset(r, 0, sizeof *r);
}

/* The inventory of the online nodes (only those where the model is
 * resident with warm_only): their descriptions, the links inside each
 * and the assumed network between them; new reference, NULL when out of
 * memory.  Server lock held. */
static json_t *online_nodes(px_fleet_server *srv, const px_digest *warm_only)
{
    inv_ctx c = {srv, json_array(), json_array(), warm_only};
    if (c.nodes && c.links)
        srv->store.ops->list_nodes(srv->store.self, add_node, &c, NULL);
    json_t *net = c.nodes ? assumed_network(c.nodes) : NULL;
    json_t *doc = NULL;
    if (net && c.links && json_array_extend(net, c.links) == 0)
        doc = json_pack("{s:s, s:s, s:O, s:O}", "schema", "plexus.inventory/1", "name", "fleet",
                        "links", net, "nodes", c.nodes);
    json_decref(net);
    json_decref(c.links);
    json_decref(c.nodes);
    return doc;
}

/* Plans the model file over doc (borrowed: online_nodes' inventory);
 * reads nothing of the server, so it may run without its lock.  On
 * failure returns the "planner unavailable" record (new reference) and
 * leaves r empty; on success NULL. */
static json_t *plan_over(const char *path, const json_t *spec, const json_t *doc, plan_run *r)
{
    memset(r, 0, sizeof *r);
    px_err err;
    if (!doc)
        return unavailable("out of memory describing the fleet's nodes");
    r->n_nodes = json_array_size(json_object_get(doc, "nodes"));
    if (r->n_nodes == 0)
        return unavailable("no online node describes its devices");
    json_t *out = NULL;
    px_plan_request req;
    px_plan_request_default(&req);
    /* A deployment runs on the stage workers, one device per stage, as
     * `plexus serve` does: a tensor-parallel stage could not start. */
    if (spec)
        req.max_tp = 1;
    const char *objective = json_string_value(json_object_get(spec, "objective"));
    const char *policy = json_string_value(json_object_get(spec, "policy"));
    if (policy)
        req.policy = policy;
    if (objective && px_plan_objective_parse(objective, &req.objective, &err) != PX_OK)
        out = unavailable("objective: %s", err.msg);
    else if (px__srv_open_contract(json_object_get(spec, "contract"), &r->contract, &err) != PX_OK)
        out = unavailable("contract: %s", err.msg);
    else if (px_hw_graph_from_value(doc, "fleet inventory", NULL, &r->graph, NULL, &err) != PX_OK)
        out = unavailable("the fleet's registered nodes are not a valid inventory: %s", err.msg);
    else if (px_ir_model_open(path, NULL, &r->model, &err) != PX_OK)
        out = unavailable("the model could not be read: %s", err.msg);
    if (!out) {
        req.graph = r->graph;
        req.model = r->model;
        req.contract = r->contract;
        if (px_plan_search(&req, &r->plan, &err) != PX_OK)
            out = unavailable("the planner found no plan: %s", err.msg);
    }
    if (out) {
        size_t n = r->n_nodes;
        run_release(r);
        r->n_nodes = n;
    }
    return out;
}

/* The plan's figure for its objective, lower is better. */
static double figure(const px_plan *p, const char **what)
{
    px_plan_summary s;
    px_plan_get_summary(p, &s);
    switch (s.objective) {
    case PX_PLAN_OBJ_TTFT:
        *what = "s to the first token (p50)";
        return s.ttft_s.p50;
    case PX_PLAN_OBJ_THROUGHPUT:
        *what = "s per token of throughput";
        return s.throughput_point > 0 ? 1.0 / s.throughput_point : INFINITY;
    case PX_PLAN_OBJ_TOKENS_PER_DOLLAR:
        *what = "$ per token";
        return s.tokens_per_usd > 0 ? 1.0 / s.tokens_per_usd : INFINITY;
    case PX_PLAN_OBJ_JOULES_PER_TOKEN:
        *what = "J per token";
        return s.joules_per_token;
    default:
        *what = "s per output token";
        return s.tpot_point_s;
    }
}

/* The online nodes where the model is resident (a JSON array of names). */
static json_t *warm_nodes(px_fleet_server *srv, const px_digest *d, size_t *n_online)
{
    json_t *arr = json_array();
    *n_online = 0;
    for (size_t i = 0; i < srv->sched->n_nodes; i++) {
        if (srv->sched->nodes[i].state != PX_FLEET_NODE_ONLINE)
            continue;
        ++*n_online;
        if (px__sched_node_resident(&srv->sched->nodes[i], d))
            json_array_append_new(arr, json_string(srv->sched->nodes[i].name));
    }
    return arr;
}

/* Plans a deployment: over every online node (every), and over the warm
 * ones alone (warm_inv; warm: their names, n_online: how many are online)
 * when some but not all are; keeps the warm plan when it is within
 * WARM_SLACK of the other.  *choice gets the residency record (it takes
 * warm).  Runs without the server lock. */
static json_t *plan_deployment(const char *path, const json_t *spec, const json_t *every,
                               json_t *warm, const json_t *warm_inv, size_t n_online,
                               plan_run *chosen, json_t **choice)
{
    char why[400];
    plan_run all;
    json_t *failed = plan_over(path, spec, every, &all);
    if (failed) {
        json_decref(warm);
        return failed;
    }
    size_t n_warm = json_array_size(warm);
    const char *placed = "every online node";
    if (n_warm == 0) {
        snprintf(why, sizeof why,
                 "the model is resident on no online node: every node is a "
                 "candidate and the chosen ones fetch it");
    } else if (n_warm == n_online) {
        snprintf(why, sizeof why, "the model is resident on every online node");
    } else {
        plan_run w;
        json_t *wf = plan_over(path, spec, warm_inv, &w);
        if (wf) {
            snprintf(why, sizeof why,
                     "the model is resident on %zu of %zu online nodes, but no plan fits them "
                     "alone (%s): planned over every node",
                     n_warm, n_online,
                     json_string_value(json_object_get(wf, "detail"))
                         ? json_string_value(json_object_get(wf, "detail"))
                         : "?");
            json_decref(wf);
        } else {
            const char *what;
            double fw = figure(w.plan, &what), fa = figure(all.plan, &what);
            if (fw <= fa * WARM_SLACK) {
                snprintf(why, sizeof why,
                         "the model is resident on %zu of %zu online nodes and the plan over them "
                         "alone predicts %.4g %s against %.4g over every node (within %.0f%%): "
                         "placed on the warm nodes, nothing to fetch",
                         n_warm, n_online, fw, what, fa, (WARM_SLACK - 1) * 100);
                run_release(&all);
                all = w;
                placed = "warm nodes";
            } else {
                snprintf(why, sizeof why,
                         "the model is resident on %zu of %zu online nodes, but the plan over them "
                         "alone predicts %.4g %s against %.4g over every node (more than %.0f%% "
                         "worse): planned over every node",
                         n_warm, n_online, fw, what, fa, (WARM_SLACK - 1) * 100);
                run_release(&w);
            }
        }
    }
    *chosen = all;
    *choice = json_pack("{s:o, s:s, s:s}", "warm_nodes", warm, "placed_on", placed, "why", why);
    return NULL;
}

json_t *px__srv_fleet_inventory(px_fleet_server *srv)
{
    return online_nodes(srv, NULL);
}

void (*px__srv_plan_hook)(px_fleet_server *srv);

/* The plan, from the model file at path over the nodes gathered under the
 * lock; runs without it.  New reference. */
static json_t *plan_unlocked(const json_t *spec, const json_t *every, json_t *warm,
                             const json_t *warm_inv, size_t n_online, const char *path)
{
    plan_run r;
    json_t *residency = NULL;
    json_t *failed =
        spec ? plan_deployment(path, spec, every, warm, warm_inv, n_online, &r, &residency)
             : plan_over(path, NULL, every, &r);
    if (!spec)
        json_decref(warm);
    if (failed)
        return failed;
    json_t *p = px_plan_to_json(r.plan);
    json_t *out = p ? json_pack("{s:s, s:o}", "status", "planned", "plan", p) : NULL;
    if (out && spec) {
        /* Deployments keep the report, which node runs each stage, and why
         * these nodes. */
        json_t *report = report_of(r.plan), *assignment = assignment_of(r.plan);
        if (!report || !assignment || !residency ||
            json_object_set_new(out, "report", report) != 0 ||
            json_object_set_new(out, "assignment", assignment) != 0 ||
            json_object_set(out, "residency", residency) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    json_decref(residency);
    run_release(&r);
    return out ? out : unavailable("out of memory");
}

json_t *px__srv_plan_model(px_fleet_server *srv, const char *digest, const json_t *spec)
{
    /* What the planner needs of the server's memory is copied under the
     * lock; the lock is then released while the model is fetched (with
     * replicas it may have been uploaded to another, and is copied from
     * the store once) and while the planner runs (it may take long on a
     * large fleet, and the API and heartbeats must not wait for it). */
    char digest_copy[80]; /* digest may live in a job that ends meanwhile */
    if (digest) {
        px_strlcpy(digest_copy, digest, sizeof digest_copy);
        digest = digest_copy;
    }
    px_digest d;
    size_t n_online = 0;
    bool digest_ok = digest && px_digest_parse(digest, &d) == PX_OK;
    json_t *every = online_nodes(srv, NULL), *warm = NULL, *warm_inv = NULL;
    if (spec) {
        warm = digest_ok ? warm_nodes(srv, &d, &n_online) : json_array();
        warm_inv = digest_ok && json_array_size(warm) ? online_nodes(srv, &d) : json_array();
    }
    pthread_mutex_unlock(&srv->lock);
    if (px__srv_plan_hook)
        px__srv_plan_hook(srv);
    char path[PATH_MAX];
    px_err err;
    if (digest && px__store_has_blobs(&srv->store) && px__blob_fetch(srv, digest, &err) != PX_OK &&
        err.code != PX_ENOTFOUND)
        px_log_warn("fleet: model %.16s...: %s", digest, err.msg);
    json_t *out;
    if (!digest || px__blob_path(srv->data_dir, digest, path, sizeof path, &err) != PX_OK ||
        access(path, R_OK) != 0) {
        json_decref(warm);
        out = unavailable("the model %.64s is not on the server; upload it with POST /v1/blobs "
                          "(plexus submit --model FILE does) to get a plan",
                          digest ? digest : "?");
    } else
        out = plan_unlocked(spec, every, warm, warm_inv, n_online, path);
    pthread_mutex_lock(&srv->lock);
    json_decref(every);
    json_decref(warm_inv);
    return out;
}

json_t *px__srv_plan(px_fleet_server *srv, const px__job *job)
{
    return px__srv_plan_model(
        srv, json_string_value(json_object_get(json_object_get(job->req->spec, "model"), "digest")),
        NULL);
}
