/* Explanations as JSON: each requirement with how many nodes meet it, each
 * rejected node with its reason in words and numbers, the best nodes with
 * their score terms, and the decision. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

static void fmt_bytes(double v, char *buf, size_t n)
{
    px_qty_format(v, PX_DIM_BYTES, buf, n);
}

static const px__sched_framework *node_fw(const px__sched_node *n, const char *name)
{
    for (int k = 0; k < n->n_fws; k++)
        if (strcmp(n->fws[k].name, name) == 0)
            return &n->fws[k];
    return NULL;
}

static char *reason_detail(const px_fleet_sched *s, const px_fleet_request *r,
                           const px__rejected *x)
{
    const px__sched_node *n = &s->nodes[x->node];
    char a[48], b[48];
    switch ((px__reason)x->reason) {
    case PX__R_OFFLINE:
        return px_strdup("node is offline (no heartbeat within its lease)");
    case PX__R_DRAINING:
        return px_strdup("node is draining (it takes no new work)");
    case PX__R_FRAMEWORK:
        return px_asprintf("framework %s is not installed (job needs %s)", r->fws[x->fw].name,
                           r->fws[x->fw].text);
    case PX__R_FRAMEWORK_VERSION: {
        const px__sched_framework *f = node_fw(n, r->fws[x->fw].name);
        return px_asprintf("%s %s installed, job needs %s", r->fws[x->fw].name,
                           f ? f->version : "?", r->fws[x->fw].spec);
    }
    case PX__R_VENDOR: {
        px_strbuf sb = PX_STRBUF_INIT;
        px_strbuf_addf(&sb, "no %s GPU (node has", r->vendor ? r->vendor : "");
        int shown = 0;
        for (int d = 0; d < n->n_devs; d++)
            if (n->devs[d].gpu)
                px_strbuf_addf(&sb, "%s %s %s", shown++ ? "," : "", n->devs[d].vendor,
                               n->devs[d].model);
        px_strbuf_adds(&sb, shown ? ")" : " no GPUs)");
        return px_strbuf_detach(&sb, NULL);
    }
    case PX__R_CAPABILITY: {
        px_strbuf sb = PX_STRBUF_INIT;
        px_strbuf_addf(&sb, "no GPU with capability %s (node has", r->capability);
        int shown = 0;
        for (int d = 0; d < n->n_devs; d++)
            if (n->devs[d].gpu && (!r->vendor || strcmp(n->devs[d].vendor, r->vendor) == 0))
                px_strbuf_addf(&sb, "%s %s", shown++ ? "," : "",
                               n->devs[d].capability[0] ? n->devs[d].capability : "unknown");
        px_strbuf_adds(&sb, ")");
        return px_strbuf_detach(&sb, NULL);
    }
    case PX__R_GPU_MEMORY:
        fmt_bytes(x->have, a, sizeof a);
        fmt_bytes(x->need, b, sizeof b);
        return px_asprintf(x->fw ? "not enough free GPU memory: %s free on the best free GPU, "
                                   "job needs %s per GPU"
                                 : "not enough GPU memory: largest GPU has %s, job needs %s "
                                   "per GPU",
                           a, b);
    case PX__R_GPUS:
        return px_asprintf("not enough GPUs: %.0f free that qualify, job needs %.0f", x->have,
                           x->need);
    case PX__R_CPUS:
        return px_asprintf("not enough CPUs: %g free, job needs %g", x->have, x->need);
    case PX__R_MEMORY:
        fmt_bytes(x->have, a, sizeof a);
        fmt_bytes(x->need, b, sizeof b);
        return px_asprintf("not enough memory: %s free, job needs %s", a, b);
    case PX__R_COUNT_:
        break;
    }
    return px_strdup("unknown");
}

static px_status add_req(json_t *arr, const char *text, uint32_t meeting)
{
    json_t *o = json_pack("{s:s, s:I}", "requirement", text, "nodes_meeting", (json_int_t)meeting);
    return px_json_push(arr, o);
}

static json_t *requirements_json(const px_fleet_explanation *e, const px_fleet_request *r)
{
    json_t *arr = json_array();
    char a[48], b[48], text[256];
    add_req(arr, "online and not draining", e->req_meeting[PX__Q_STATE]);
    snprintf(text, sizeof text, "cpus >= %g", r->cpus);
    add_req(arr, text, e->req_meeting[PX__Q_CPUS]);
    if (r->memory > 0) {
        fmt_bytes(r->memory, a, sizeof a);
        snprintf(text, sizeof text, "memory >= %s", a);
        add_req(arr, text, e->req_meeting[PX__Q_MEMORY]);
    }
    if (r->vendor) {
        snprintf(text, sizeof text, "GPU vendor %s", r->vendor);
        add_req(arr, text, e->req_meeting[PX__Q_VENDOR]);
    }
    if (r->capability) {
        snprintf(text, sizeof text, "GPU capability %s", r->capability);
        add_req(arr, text, e->req_meeting[PX__Q_CAPABILITY]);
    }
    if (r->gpus > 0) {
        if (r->gpu_memory > 0) {
            fmt_bytes(r->gpu_memory, b, sizeof b);
            snprintf(text, sizeof text, "%d free GPU(s) with >= %s each", r->gpus, b);
        } else
            snprintf(text, sizeof text, "%d free GPU(s)", r->gpus);
        add_req(arr, text, e->req_meeting[PX__Q_GPUS]);
    }
    for (int j = 0; j < r->n_fws; j++) {
        snprintf(text, sizeof text, "framework %s", r->fws[j].text);
        add_req(arr, text, e->req_meeting[PX__Q_FRAMEWORK0 + j]);
    }
    return arr;
}

static json_t *scored_json(const px_fleet_sched *s, const px__scored *sc)
{
    const px__sched_node *n = &s->nodes[sc->node];
    json_t *devs = json_array();
    for (int d = 0; d < n->n_devs; d++)
        if (sc->devices >> d & 1)
            json_array_append_new(devs, json_string(n->devs[d].id));
    return json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:o}", "node", n->name, "score",
                     round(sc->score * 1000) / 1000, "headroom", round(sc->headroom * 1000) / 1000,
                     "locality", round(sc->locality * 1000) / 1000, "load",
                     round(sc->load * 1000) / 1000, "topology", round(sc->topology * 1000) / 1000,
                     "devices", devs);
}

static char *decision_summary(const px_fleet_explanation *e, const px_fleet_sched *s,
                              const px_fleet_request *r)
{
    px_strbuf sb = PX_STRBUF_INIT;
    if (e->placed) {
        px_strbuf_adds(&sb, "placed on ");
        for (uint32_t m = 0; m < e->n_members; m++)
            px_strbuf_addf(&sb, "%s%s", m ? ", " : "", s->nodes[e->members[m].node].name);
        const px__scored *b = &e->members[0];
        px_strbuf_addf(&sb, ": headroom %.2f", b->headroom);
        if (r->n_inputs)
            px_strbuf_adds(&sb, b->locality > 0 ? ", model resident" : ", model not resident");
        if (e->n_top > 1 && e->n_members == 1) {
            const px__scored *c = &e->top[1];
            const char *why = b->headroom > c->headroom + 0.1 ? "more memory headroom"
                              : b->locality > c->locality     ? "model resident"
                              : b->load > c->load             ? "less load"
                              : b->topology > c->topology     ? "faster links"
                                                              : "tie, lower index";
            px_strbuf_addf(&sb, "; beat %s by %s", s->nodes[c->node].name, why);
        }
        if (e->n_scored < e->n_feasible)
            px_strbuf_addf(&sb,
                           "; scored %u of %u feasible nodes (a rotating window plus every "
                           "node holding the model)",
                           e->n_scored, e->n_feasible);
        return px_strbuf_detach(&sb, NULL);
    }
    if (e->n_considered == 0) {
        px_strbuf_adds(&sb, "not placed: no nodes are registered");
        return px_strbuf_detach(&sb, NULL);
    }
    if (r->members > 1 && e->n_feasible > 0)
        px_strbuf_addf(&sb,
                       "not placed: %u of %d nodes fit; a distributed job starts on all "
                       "its nodes or none; ",
                       e->n_feasible, r->members);
    else
        px_strbuf_addf(&sb, "not placed: 0/%u nodes fit: ", e->n_considered);
    int shown = 0;
    for (int k = 0; k < PX__R_COUNT_; k++)
        if (e->reason_count[k])
            px_strbuf_addf(&sb, "%s%u %s", shown++ ? ", " : "", e->reason_count[k],
                           px__reason_name((px__reason)k));
    return px_strbuf_detach(&sb, NULL);
}

/* Adds {reason, detail} for x to arr unless arr already names that reason
 * (and framework). */
static void add_failing(json_t *arr, const px_fleet_sched *s, const px_fleet_request *r,
                        const px__rejected *x)
{
    size_t i;
    json_t *it;
    const char *name = px__reason_name((px__reason)x->reason);
    json_array_foreach(arr, i, it)
    {
        if (strcmp(json_string_value(json_object_get(it, "reason")), name) == 0 &&
            json_integer_value(json_object_get(it, "fw")) == x->fw)
            return;
    }
    char *detail = reason_detail(s, r, x);
    px_json_push(arr, json_pack("{s:s, s:s, s:I}", "reason", name, "detail", detail ? detail : "",
                                "fw", (json_int_t)x->fw));
    free(detail);
}

/* Every requirement the node fails, not only the one that rejected it:
 * the rejection's own first, then each framework, the vendor, the
 * capability, the GPU memory and the GPU count, as the node's devices
 * (not their live use) decide them.  Computed when an explanation is
 * read, never while scheduling. */
static json_t *failing_json(const px_fleet_sched *s, const px_fleet_request *r,
                            const px__rejected *x)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    add_failing(arr, s, r, x);
    if (x->reason == PX__R_OFFLINE || x->reason == PX__R_DRAINING)
        goto done;
    const px__sched_node *n = &s->nodes[x->node];
    for (int j = 0; j < r->n_fws; j++) {
        const px__sched_framework *have = node_fw(n, r->fws[j].name);
        bool ok = false;
        if (have && px_fleet_version_match(have->version, r->fws[j].spec, &ok, NULL) != PX_OK)
            ok = false;
        if (!ok)
            add_failing(arr, s, r,
                        &(px__rejected){x->node, have ? PX__R_FRAMEWORK_VERSION : PX__R_FRAMEWORK,
                                        (uint8_t)j, 0, 0});
    }
    if (r->gpus > 0) {
        int n_gpu = 0, n_vendor = 0, n_cap = 0, n_mem = 0;
        float best_mem = 0;
        for (int d = 0; d < n->n_devs; d++) {
            const px__sched_device *dv = &n->devs[d];
            if (!dv->gpu)
                continue;
            n_gpu++;
            if (r->vendor && strcmp(dv->vendor, r->vendor) != 0)
                continue;
            n_vendor++;
            bool ok = true;
            if (r->capability &&
                (px_fleet_version_match(dv->capability, r->capability, &ok, NULL) != PX_OK || !ok))
                continue;
            n_cap++;
            best_mem = PX_MAX(best_mem, (float)dv->mem_total);
            if (r->gpu_memory <= 0 || dv->mem_total >= r->gpu_memory)
                n_mem++;
        }
        if (r->vendor && n_vendor == 0)
            add_failing(arr, s, r, &(px__rejected){x->node, PX__R_VENDOR, 0, (float)n_gpu, 0});
        if (n_vendor > 0 && n_cap == 0)
            add_failing(arr, s, r, &(px__rejected){x->node, PX__R_CAPABILITY, 0, 0, 0});
        if (n_cap > 0 && n_mem < (int)r->gpus && r->gpu_memory > 0)
            add_failing(
                arr, s, r,
                &(px__rejected){x->node, PX__R_GPU_MEMORY, 0, best_mem, (float)r->gpu_memory});
        if (n_cap < (int)r->gpus)
            add_failing(arr, s, r,
                        &(px__rejected){x->node, PX__R_GPUS, 0, (float)n_cap, (float)r->gpus});
    }
done:;
    /* The framework index served to tell requirements apart only. */
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it) json_object_del(it, "fw");
    return arr;
}

json_t *px_fleet_explanation_to_json(const px_fleet_explanation *e, const px_fleet_sched *s)
{
    const px_fleet_request *r = e->req;
    json_t *out = json_object();
    json_t *rejected = json_array();
    json_t *scored = json_array();
    json_t *counts = json_object();
    json_t *nodes = json_array();
    if (!out || !rejected || !scored || !counts || !nodes)
        goto fail;
    for (uint32_t k = 0; k < e->n_rejected; k++) {
        const px__rejected *x = &e->rejected[k];
        char *detail = reason_detail(s, r, x);
        json_t *o = json_pack("{s:s, s:s, s:s, s:o*}", "node", s->nodes[x->node].name, "reason",
                              px__reason_name((px__reason)x->reason), "detail",
                              detail ? detail : "", "failing", failing_json(s, r, x));
        free(detail);
        if (px_json_push(rejected, o) != PX_OK)
            goto fail;
    }
    for (uint32_t k = 0; k < e->n_top; k++)
        if (px_json_push(scored, scored_json(s, &e->top[k])) != PX_OK)
            goto fail;
    for (int k = 0; k < PX__R_COUNT_; k++)
        if (e->reason_count[k])
            json_object_set_new(counts, px__reason_name((px__reason)k),
                                json_integer(e->reason_count[k]));
    for (uint32_t m = 0; m < e->n_members; m++)
        json_array_append_new(nodes, json_string(s->nodes[e->members[m].node].name));
    char *summary = decision_summary(e, s, r);
    json_t *decision = json_pack("{s:b, s:o, s:s}", "placed", e->placed, "nodes", nodes, "summary",
                                 summary ? summary : "");
    nodes = NULL;
    free(summary);
    if (px_json_set(out, "nodes_considered", json_integer(e->n_considered)) != PX_OK ||
        px_json_set(out, "nodes_feasible", json_integer(e->n_feasible)) != PX_OK ||
        px_json_set(out, "nodes_scored", json_integer(e->n_scored)) != PX_OK ||
        px_json_set(out, "requirements", requirements_json(e, r)) != PX_OK ||
        px_json_set(out, "rejected", rejected) != PX_OK ||
        px_json_set(out, "rejected_more", json_integer(e->n_rejected_total - e->n_rejected)) !=
            PX_OK ||
        px_json_set(out, "rejected_by_reason", counts) != PX_OK ||
        px_json_set(out, "scored", scored) != PX_OK ||
        px_json_set(out, "decision", decision) != PX_OK) {
        rejected = scored = counts = NULL; /* px_json_set stole them */
        goto fail;
    }
    return out;
fail:
    json_decref(out);
    json_decref(rejected);
    json_decref(scored);
    json_decref(counts);
    json_decref(nodes);
    return NULL;
}
