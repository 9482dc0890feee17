/* Deployments: a model served across the fleet under a name.  The server
 * checks the request, plans the model over the online nodes' devices (the
 * planner's report and the node of each stage are kept with the
 * deployment) and stores it; a deployment the planner cannot place is
 * refused with the planner's reason, never stored as if it could run. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/contract.h"
#include "plexus/plan.h"

#include <ctype.h>
#include <strings.h>
#include <unistd.h>

void px__deploy_row_release(px__deploy_row *r)
{
    if (!r)
        return;
    free(r->name);
    free(r->owner);
    free(r->model);
    free(r->spec);
    free(r->state);
    free(r->plan);
    free(r->incidents);
    memset(r, 0, sizeof *r);
}

bool px__deploy_name_valid(const char *name)
{
    if (!px__name_valid(name))
        return false;
    /* "j-" and digits is a job's id: `plexus explain` tells them apart. */
    if (name[0] == 'j' && name[1] == '-' && name[2]) {
        const char *c = name + 2;
        while (isdigit((unsigned char)*c))
            c++;
        if (!*c)
            return false;
    }
    return true;
}

static bool is_digest(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (const char *c = s; *c; c++)
        if (!isdigit((unsigned char)*c) && !(*c >= 'a' && *c <= 'f'))
            return false;
    return true;
}

#define REPLICAS_MAX 64

json_t *px__deploy_request_check(const json_t *body, px_err *err)
{
    static const char *const known[] = {"name",     "model",    "objective",
                                        "contract", "replicas", "policy"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v)
    {
        size_t k = 0;
        while (k < PX_ARRAY_LEN(known) && strcmp(key, known[k]) != 0)
            k++;
        if (k == PX_ARRAY_LEN(known)) {
            px_err_set(err, PX_EINVAL,
                       "deployment: unknown member \"%.32s\"; expected name, model, objective, "
                       "contract, policy or replicas",
                       key);
            return NULL;
        }
    }
    const char *name = json_string_value(json_object_get(body, "name"));
    if (!px__deploy_name_valid(name)) {
        px_err_set(err, PX_EINVAL,
                   "deployment: \"name\" must be 1 to %d of A-Z a-z 0-9 _ . @ - (and not a job "
                   "id such as j-000012)",
                   PX__NAME_MAX);
        return NULL;
    }
    const json_t *model = json_object_get(body, "model");
    const char *digest = json_is_string(model)
                             ? json_string_value(model)
                             : json_string_value(json_object_get(model, "digest"));
    if (!is_digest(digest)) {
        px_err_set(err, PX_EINVAL,
                   "deployment %s: \"model\" must be a blob's SHA-256 (64 lowercase hex digits) "
                   "or {\"digest\": ...}; upload the file with POST /v1/blobs (plexus deploy "
                   "--model FILE does)",
                   name);
        return NULL;
    }
    const json_t *objective = json_object_get(body, "objective");
    px_plan_objective obj;
    if (objective && (!json_is_string(objective) ||
                      px_plan_objective_parse(json_string_value(objective), &obj, err) != PX_OK)) {
        if (!json_is_string(objective))
            px_err_set(err, PX_EINVAL, "deployment %s: \"objective\" must be a name", name);
        else
            px_err_prefix(err, PX_EINVAL, "deployment %s: objective: ", name);
        return NULL;
    }
    const json_t *contract = json_object_get(body, "contract");
    if (contract && !json_is_string(contract) && !json_is_object(contract)) {
        px_err_set(err, PX_EINVAL,
                   "deployment %s: \"contract\" must be a built-in name (strict, deterministic, "
                   "relaxed) or a plexus.contract/1 document",
                   name);
        return NULL;
    }
    if (contract) {
        px_contract *c = NULL;
        px_status st = json_is_string(contract)
                           ? px_contract_builtin(json_string_value(contract), &c, err)
                           : px_contract_from_json(contract, "contract", NULL, &c, err);
        px_contract_free(c);
        if (st != PX_OK) {
            px_err_prefix(err, PX_EINVAL, "deployment %s: contract: ", name);
            return NULL;
        }
    }
    const json_t *policy = json_object_get(body, "policy");
    if (policy && (!json_is_string(policy) || !px_plan_policy_exists(json_string_value(policy)))) {
        px_err_set(err, PX_EINVAL,
                   "deployment %s: \"policy\" must be plexus, llamacpp, exo, gpustack or "
                   "single-type",
                   name);
        return NULL;
    }
    const json_t *replicas = json_object_get(body, "replicas");
    json_int_t n = replicas ? (json_is_integer(replicas) ? json_integer_value(replicas) : 0) : 1;
    if (n < 1 || n > REPLICAS_MAX) {
        px_err_set(err, PX_EINVAL,
                   "deployment %s: \"replicas\" must be a whole number from 1 to %d", name,
                   REPLICAS_MAX);
        return NULL;
    }
    json_t *spec =
        json_pack("{s:s, s:{s:s}, s:I}", "name", name, "model", "digest", digest, "replicas", n);
    if (spec && json_is_object(model) && json_is_string(json_object_get(model, "name")))
        json_object_set(json_object_get(spec, "model"), "name", json_object_get(model, "name"));
    if (spec && objective)
        json_object_set(spec, "objective", (json_t *)objective);
    if (spec && contract)
        json_object_set(spec, "contract", (json_t *)contract);
    if (spec && policy)
        json_object_set(spec, "policy", (json_t *)policy);
    if (!spec)
        px_err_set(err, PX_ENOMEM, "out of memory");
    return spec;
}

/* Takes the JSON text of v (stolen); NULL when out of memory. */
static char *dump_steal(json_t *v)
{
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return text;
}

px_status px__srv_deploy(px_fleet_server *srv, const json_t *body, const char *owner,
                         px__deploy_row *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    json_t *spec = px__deploy_request_check(body, err);
    if (!spec)
        return err->code;
    const char *name = json_string_value(json_object_get(spec, "name"));
    const char *digest =
        json_string_value(json_object_get(json_object_get(spec, "model"), "digest"));
    px__deploy_row taken;
    px_status st = srv->store.ops->get_deployment(srv->store.self, name, &taken, err);
    px__deploy_row_release(&taken);
    if (st == PX_OK)
        st = px_err_set(err, PX_EEXIST,
                        "a deployment named \"%s\" exists; undeploy it first or choose another "
                        "name",
                        name);
    if (st != PX_ENOTFOUND) {
        json_decref(spec); /* name lived in spec: err is already written */
        return st;
    }
    json_t *plan = px__srv_plan_model(srv, digest, spec);
    const char *status = json_string_value(json_object_get(plan, "status"));
    if (!status || strcmp(status, "planned") != 0) {
        st = px_err_set(err, PX_ESTATE, "deployment %s cannot be placed: %s", name,
                        json_string_value(json_object_get(plan, "detail"))
                            ? json_string_value(json_object_get(plan, "detail"))
                            : "the planner gave no reason");
        json_decref(plan);
        json_decref(spec);
        return st;
    }
    json_int_t want = json_integer_value(json_object_get(spec, "replicas"));
    json_int_t have =
        (json_int_t)json_array_size(json_object_get(json_object_get(plan, "plan"), "replicas"));
    if (have < want) {
        st = px_err_set(err, PX_ESTATE,
                        "deployment %s cannot be placed: %lld replicas asked for, and the "
                        "planner's plan over the online nodes has %lld; ask for --replicas %lld "
                        "or fewer, or add nodes",
                        name, (long long)want, (long long)have, (long long)have);
        json_decref(plan);
        json_decref(spec);
        return st;
    }
    int64_t now = px_wall_time();
    px__deploy_row row = {
        .name = px_strdup(name),
        .owner = owner ? px_strdup(owner) : NULL,
        .model = px_strdup(digest),
        .spec = dump_steal(spec),
        .state = px_strdup("planned"),
        .plan = dump_steal(plan),
        .incidents = px_strdup("[]"),
        .created = now,
        .updated = now,
    };
    if (!row.name || (owner && !row.owner) || !row.model || !row.spec || !row.state || !row.plan ||
        !row.incidents) {
        px__deploy_row_release(&row);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    if ((st = srv->store.ops->put_deployment(srv->store.self, &row, false, err)) != PX_OK) {
        px__deploy_row_release(&row);
        return st;
    }
    px__srv_deploy_changed(srv);
    *out = row;
    return PX_OK;
}

static json_t *parse_or_null(const char *text)
{
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;
    return v ? v : json_null();
}

/* Whether the node (by name) is online and reports the model resident. */
static bool resident_on(px_fleet_server *srv, const char *node, const px_digest *d)
{
    size_t i;
    return px_fleet_sched_find_node(srv->sched, node, &i, NULL) == PX_OK &&
           srv->sched->nodes[i].state == PX_FLEET_NODE_ONLINE &&
           px__sched_node_resident(&srv->sched->nodes[i], d);
}

json_t *px__srv_deploy_json(px_fleet_server *srv, const px__deploy_row *row, bool detail)
{
    json_t *plan = parse_or_null(row->plan);
    json_t *spec = parse_or_null(row->spec);
    json_t *nodes = json_array(), *resident = json_array();
    json_t *assignment = json_object_get(plan, "assignment");
    px_digest d;
    bool digest_ok = px_digest_parse(row->model, &d) == PX_OK;
    size_t i;
    json_t *a;
    int n_stages = 0;
    json_array_foreach(assignment, i, a)
    {
        json_t *node = json_object_get(a, "node");
        bool seen = false;
        for (size_t k = 0; k < json_array_size(nodes); k++)
            seen = seen || json_equal(json_array_get(nodes, k), node);
        if (!seen && json_is_string(node)) {
            json_array_append(nodes, node);
            if (digest_ok && resident_on(srv, json_string_value(node), &d))
                json_array_append(resident, node);
        }
        if (json_integer_value(json_object_get(a, "replica")) == 0)
            n_stages++;
    }
    /* A planned deployment's nodes fetch its model from the blob store;
     * the state says how far they got (stage workers are not started). */
    const char *state = row->state;
    if (!strcmp(state, "planned") && json_array_size(nodes) > 0)
        state = json_array_size(resident) == json_array_size(nodes) ? "resident" : "fetching";
    json_t *o = json_pack("{s:s, s:s?, s:s, s:s, s:O?, s:i, s:o, s:o, s:I, s:I}", "name", row->name,
                          "owner", row->owner, "model", row->model, "state", state, "replicas",
                          json_object_get(spec, "replicas"), "stages", n_stages, "nodes", nodes,
                          "model_resident_on", resident, "created", (json_int_t)row->created,
                          "updated", (json_int_t)row->updated);
    if (o)
        json_object_set_new(o, "reported", px__srv_deploy_reported(srv, row->name));
    if (o && detail) {
        json_object_set(o, "spec", spec);
        json_object_set(o, "plan", plan);
        json_object_set_new(o, "incidents",
                            row->incidents ? parse_or_null(row->incidents) : json_array());
        /* What the nodes of the plan evicted from their caches to make
         * room for this model, and why. */
        json_t *ev = json_array();
        for (size_t k = 0; ev && k < json_array_size(nodes); k++) {
            const char *node = json_string_value(json_array_get(nodes, k));
            size_t e;
            json_t *x;
            json_array_foreach(json_object_get(srv->evictions, node), e, x)
            {
                const char *incoming = json_string_value(json_object_get(x, "for"));
                if (!incoming || strcmp(incoming, row->model) != 0)
                    continue;
                char why[320];
                snprintf(why, sizeof why,
                         "node %s evicted %s (%lld bytes, least recently used, held by no job "
                         "or deployment) so that this model (%lld bytes) fits its cache budget "
                         "of %lld bytes",
                         node,
                         json_string_value(json_object_get(x, "name"))
                             ? json_string_value(json_object_get(x, "name"))
                             : json_string_value(json_object_get(x, "digest")),
                         (long long)json_integer_value(json_object_get(x, "size")),
                         (long long)json_integer_value(json_object_get(x, "incoming_size")),
                         (long long)json_integer_value(json_object_get(x, "budget")));
                json_t *copy = json_deep_copy(x);
                if (copy) {
                    json_object_set_new(copy, "node", json_string(node));
                    json_object_set_new(copy, "why", json_string(why));
                    json_array_append_new(ev, copy);
                }
            }
        }
        json_object_set_new(o, "evictions", ev ? ev : json_array());
        /* The front end and the stage workers as they run now. */
        json_t *serving = px__serving_json(srv, row->name);
        if (serving)
            json_object_set_new(o, "serving", serving);
    }
    json_decref(plan);
    json_decref(spec);
    return o;
}

/* Adds the deployment's model to each node of its plan (by_node: node
 * name -> [{"digest", "name"}]). */
static void collect_models(const px__deploy_row *row, void *ud)
{
    json_t *by_node = ud;
    json_t *plan = row->plan ? json_loads(row->plan, 0, NULL) : NULL;
    json_t *spec = row->spec ? json_loads(row->spec, 0, NULL) : NULL;
    const char *file = json_string_value(json_object_get(json_object_get(spec, "model"), "name"));
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(plan, "assignment"), i, a)
    {
        const char *node = json_string_value(json_object_get(a, "node"));
        if (!node)
            continue;
        json_t *list = json_object_get(by_node, node);
        if (!list) {
            list = json_array();
            json_object_set_new(by_node, node, list);
        }
        bool seen = false;
        for (size_t k = 0; k < json_array_size(list) && !seen; k++)
            seen = !strcmp(json_string_value(json_object_get(json_array_get(list, k), "digest")),
                           row->model);
        if (!seen)
            json_array_append_new(list,
                                  json_pack("{s:s, s:s?}", "digest", row->model, "name", file));
    }
    json_decref(spec);
    json_decref(plan);
}

/* The models each node holds for deployments, built from the store when
 * a deployment changed; NULL when the store cannot be read now. */
static const json_t *models_by_node(px_fleet_server *srv)
{
    if (srv->deploy_models)
        return srv->deploy_models;
    json_t *by_node = json_object();
    px_err err;
    if (!by_node || srv->store.ops->list_deployments(srv->store.self, NULL, collect_models, by_node,
                                                     &err) != PX_OK) {
        json_decref(by_node);
        return NULL;
    }
    srv->deploy_models = by_node;
    return by_node;
}

json_t *px__srv_deploy_models(px_fleet_server *srv, const char *node)
{
    const json_t *list = json_object_get(models_by_node(srv), node);
    return list ? json_deep_copy(list) : json_array();
}

bool px__srv_deploy_wants(px_fleet_server *srv, const char *node, const char *digest)
{
    const json_t *list = json_object_get(models_by_node(srv), node);
    for (size_t k = 0; k < json_array_size(list); k++)
        if (!strcasecmp(json_string_value(json_object_get(json_array_get(list, k), "digest")),
                        digest))
            return true;
    return false;
}

void px__srv_deploy_changed(px_fleet_server *srv)
{
    json_decref(srv->deploy_models);
    srv->deploy_models = NULL;
}

#define EVICTIONS_PER_NODE 32

void px__srv_deploy_evictions(px_fleet_server *srv, const char *node, const json_t *evictions)
{
    if (!json_array_size(evictions) || !node)
        return;
    if (!srv->evictions && !(srv->evictions = json_object()))
        return;
    json_t *list = json_object_get(srv->evictions, node);
    if (!list) {
        list = json_array();
        if (!list || json_object_set_new(srv->evictions, node, list) != 0)
            return;
    }
    size_t i;
    json_t *x;
    json_array_foreach(evictions, i, x)
    {
        /* Untrusted: only the members shown, of the types shown. */
        const char *digest = json_string_value(json_object_get(x, "digest"));
        const char *name = json_string_value(json_object_get(x, "name"));
        const char *incoming = json_string_value(json_object_get(x, "for"));
        if (!is_digest(digest) || (incoming && !is_digest(incoming)) ||
            (name && strlen(name) > 255))
            continue;
        if (json_array_size(list) >= EVICTIONS_PER_NODE)
            json_array_remove(list, 0);
        json_array_append_new(
            list,
            json_pack("{s:s, s:s?, s:I, s:s?, s:I, s:I, s:I}", "digest", digest, "name", name,
                      "size", json_integer_value(json_object_get(x, "size")), "for", incoming,
                      "incoming_size", json_integer_value(json_object_get(x, "incoming_size")),
                      "budget", json_integer_value(json_object_get(x, "budget")), "at",
                      json_integer_value(json_object_get(x, "at"))));
    }
}
