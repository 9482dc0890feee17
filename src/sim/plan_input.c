/*
 * The simulator's view of a plan document (`plexus.plan/1`) and, when
 * given, the inventory it was made on.  The simulator reads the document
 * rather than the planner's internals, so a plan written to a file yesterday
 * simulates the same as one made now.
 */
#include "base/common.h"

#include "sim/sim_impl.h"

/* Figures assumed when neither the plan nor the inventory gives them;
 * docs/formats/faults.md lists them. */
#define ASSUMED_POWER_W         300.0
#define ASSUMED_IDLE_FRACTION   0.25
#define ASSUMED_THERMAL_LIMIT_K 358.15 /* 85 C */
#define ASSUMED_THERMAL_TAU_S   60.0
#define ASSUMED_LINK_EFFICIENCY 0.85
#define NOMINAL_PRIVATE_BW      1e9 /* B/s of a hop known only by its transfer time */

uint32_t px__sim_find_device(const px_sim_plan *plan, const char *id)
{
    for (size_t i = 0; i < plan->n_devices; i++)
        if (!strcmp(plan->devices[i].id, id))
            return (uint32_t)i;
    return PX_SIM_NONE;
}

uint32_t px__sim_find_domain(const px_sim_plan *plan, const char *id)
{
    for (size_t i = 0; i < plan->n_domains; i++)
        if (!strcmp(plan->domains[i].id, id))
            return (uint32_t)i;
    return PX_SIM_NONE;
}

static double num_at(const json_t *o, const char *k1, const char *k2, double dflt)
{
    const json_t *v = json_object_get(o, k1);
    if (k2)
        v = json_object_get(v, k2);
    double x = json_number_value(v);
    return json_is_number(v) && isfinite(x) ? x : dflt;
}

typedef struct builder {
    px_sim_plan *plan;
    const px_hw_graph *graph;
    size_t cap_devices, cap_links;
    px_err *err;
} builder;

static px_status add_device_named(builder *b, const char *id, const char *where, uint32_t *out)
{
    px_sim_plan *p = b->plan;
    uint32_t i = px__sim_find_device(p, id);
    if (i != PX_SIM_NONE) {
        *out = i;
        return PX_OK;
    }
    if (b->graph)
        return px_err_set(b->err, PX_ENOTFOUND,
                          "plan: %s: device \"%.80s\" is not in the inventory; simulate with the "
                          "inventory the plan was made on",
                          where, id);
    if (strlen(id) >= PX_SIM_ID_LEN)
        return px_err_set(b->err, PX_ELIMIT, "plan: %s: device id longer than %d bytes", where,
                          PX_SIM_ID_LEN - 1);
    if (p->n_devices == b->cap_devices)
        return px_err_set(b->err, PX_ELIMIT, "plan: more than %zu devices", b->cap_devices);
    px_sim_device *d = &p->devices[p->n_devices];
    memset(d, 0, sizeof *d);
    px_strlcpy(d->id, id, sizeof d->id);
    *out = (uint32_t)p->n_devices++;
    return PX_OK;
}

static px_status devices_from_graph(builder *b)
{
    const px_hw_view *v = px_hw_graph_view(b->graph);
    px_sim_plan *p = b->plan;
    p->domains = px_arena_calloc(p->arena, v->n_domains ? v->n_domains : 1, sizeof *p->domains);
    if (!p->domains)
        return px_err_set(b->err, PX_ENOMEM, "plan: out of memory");
    for (size_t k = 0; k < v->n_domains; k++) {
        px_strlcpy(p->domains[k].id, v->domains[k].id, sizeof p->domains[k].id);
        p->domains[k].mtbf_s = px_hw_has(v->domains[k].mtbf) ? v->domains[k].mtbf.value : 0;
        if (v->domains[k].parent != PX_HW_NONE && v->domains[k].parent < v->n_domains)
            px_strlcpy(p->domains[k].parent, v->domains[v->domains[k].parent].id,
                       sizeof p->domains[k].parent);
    }
    p->n_domains = v->n_domains;
    for (size_t i = 0; i < v->n_devices; i++) {
        const px_hw_device *hd = &v->devices[i];
        px_sim_device *d = &p->devices[i];
        px_strlcpy(d->id, hd->global_id, sizeof d->id);
        d->power_active_w = px_hw_has(hd->power_tdp) ? hd->power_tdp.value : ASSUMED_POWER_W;
        d->power_idle_w = px_hw_has(hd->power_idle) ? hd->power_idle.value
                                                    : ASSUMED_IDLE_FRACTION * d->power_active_w;
        d->thermal_limit_k =
            px_hw_has(hd->thermal_limit) ? hd->thermal_limit.value : ASSUMED_THERMAL_LIMIT_K;
        d->thermal_tau_s = px_hw_has(hd->thermal_time_constant) ? hd->thermal_time_constant.value
                                                                : ASSUMED_THERMAL_TAU_S;
        d->mtbf_s = px_hw_has(hd->mtbf) ? hd->mtbf.value : 0;
        d->usd_per_hour = px_hw_has(hd->cost) ? hd->cost.value : 0;
        d->mem_capacity = px_hw_device_memory_capacity(hd);
        for (size_t k = 0; k < hd->n_domains && d->n_domains < PX_SIM_MAX_DOMAINS; k++)
            d->domains[d->n_domains++] = hd->domains[k];
    }
    p->n_devices = v->n_devices;
    return PX_OK;
}

/* Finds or adds the contention domain a hop's bytes cross. */
static px_status hop_link(builder *b, uint32_t from, uint32_t to, double xfer_s, px_sim_stage *st)
{
    px_sim_plan *p = b->plan;
    char id[2 * PX_SIM_ID_LEN + 16];
    double bw = NOMINAL_PRIVATE_BW, latency = 0;
    snprintf(id, sizeof id, "%s>%s", p->devices[from].id, p->devices[to].id);
    if (b->graph) {
        const px_hw_view *v = px_hw_graph_view(b->graph);
        px_hw_path path;
        px_err e;
        if (px_hw_graph_path(b->graph, v->devices[from].endpoint, v->devices[to].endpoint,
                             PX_HW_PATH_WIDEST, 0, &path, &e) == PX_OK) {
            uint32_t bottleneck = PX_SIM_NONE;
            for (size_t i = 0; i < path.n_links; i++)
                if (bottleneck == PX_SIM_NONE ||
                    v->links[path.links[i]].bandwidth.value < v->links[bottleneck].bandwidth.value)
                    bottleneck = path.links[i];
            if (bottleneck != PX_SIM_NONE && isfinite(path.bandwidth) && path.bandwidth > 0) {
                bw = path.bandwidth * ASSUMED_LINK_EFFICIENCY;
                latency = path.latency;
                uint32_t c = v->links[bottleneck].contention;
                if (c != PX_HW_NONE)
                    snprintf(id, sizeof id, "contention:%s", v->contention[c]);
            }
            px_hw_path_release(&path);
        }
    }
    st->xfer_latency_s = latency < xfer_s ? latency : xfer_s;
    st->xfer_bytes = (xfer_s - st->xfer_latency_s) * bw;
    st->next_device = to;
    for (size_t i = 0; i < p->n_links; i++)
        if (!strcmp(p->links[i].id, id)) {
            st->link = (uint32_t)i;
            return PX_OK;
        }
    if (p->n_links == b->cap_links)
        return px_err_set(b->err, PX_ELIMIT, "plan: more than %zu hops", b->cap_links);
    px_strlcpy(p->links[p->n_links].id, id, sizeof p->links[p->n_links].id);
    p->links[p->n_links].bandwidth = bw;
    st->link = (uint32_t)p->n_links++;
    return PX_OK;
}

static px_status read_stage(builder *b, const json_t *js, const json_t *detail, double scale,
                            const char *where, px_sim_stage *st)
{
    const json_t *devs = json_object_get(js, "devices");
    size_t nd = json_array_size(devs);
    if (!json_is_array(devs) || nd == 0 || nd > PX_SIM_MAX_TP)
        return px_err_set(b->err, PX_EPARSE, "plan: %s/devices: expected 1 to %d device ids", where,
                          PX_SIM_MAX_TP);
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(devs, i);
        if (!json_is_string(d))
            return px_err_set(b->err, PX_EPARSE, "plan: %s/devices/%zu: expected a device id",
                              where, i);
        char w[160];
        snprintf(w, sizeof w, "%s/devices/%zu", where, i);
        px_status s = add_device_named(b, json_string_value(d), w, &st->devices[i]);
        if (s != PX_OK)
            return s;
    }
    st->n_devices = (uint32_t)nd;
    const json_t *pred = json_object_get(detail, "predicted");
    st->decode_s = num_at(pred, "decode_s_per_token", "p50", 0) * scale;
    st->decode_p99_s = num_at(pred, "decode_s_per_token", "p99", 0) * scale;
    st->prefill_s = num_at(pred, "prefill_s", "p50", 0) * scale;
    st->prefill_p99_s = num_at(pred, "prefill_s", "p99", 0) * scale;
    /* A stage that holds no block (only the embedding or only the head,
     * as llama.cpp-style placements make) may take no measurable time. */
    const json_t *layers = json_object_get(js, "layers");
    if (!layers)
        layers = json_object_get(detail, "layers");
    bool empty = json_integer_value(json_object_get(layers, "last")) <
                 json_integer_value(json_object_get(layers, "first"));
    if (!(st->decode_s > 0) && !(empty && st->decode_s == 0))
        return px_err_set(b->err, PX_EPARSE,
                          "plan: %s: no predicted decode time (predicted/decode_s_per_token/p50); "
                          "simulate a plan written by plexus plan",
                          where);
    const json_t *mem = json_object_get(detail, "memory_per_device");
    double w = num_at(mem, "weights", NULL, 0), kv = num_at(mem, "kv", NULL, 0);
    st->weight_fraction = w + kv > 0 ? w / (w + kv) : 0.5;
    for (size_t i = 0; i < nd; i++)
        b->plan->devices[st->devices[i]].mem_kv_reserved += kv;
    st->link = PX_SIM_NONE;
    st->next_device = PX_SIM_NONE;
    return PX_OK;
}

px_status px_sim_plan_from_json(const json_t *doc, const px_hw_graph *graph, px_sim_plan *out,
                                px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(doc))
        return px_err_set(err, PX_EPARSE, "plan: expected a plexus.plan/1 object");
    const json_t *schema = json_object_get(doc, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "plexus.plan/1"))
        return px_err_set(err, PX_EPARSE, "plan: /schema: expected \"plexus.plan/1\"");
    const json_t *stages = json_object_get(doc, "stages");
    const json_t *replicas = json_object_get(doc, "replicas");
    size_t n_rep = json_array_size(replicas);
    if (!json_is_array(stages) || json_array_size(stages) == 0)
        return px_err_set(err, PX_EPARSE, "plan: /stages: missing or empty");
    if (!json_is_array(replicas) || n_rep == 0 || n_rep > 4096)
        return px_err_set(err, PX_EPARSE, "plan: /replicas: expected 1 to 4096 replicas");
    size_t n_stage_total = 0;
    for (size_t r = 0; r < n_rep; r++) {
        size_t ns = json_array_size(json_object_get(json_array_get(replicas, r), "stages"));
        if (ns == 0 || ns > 64)
            return px_err_set(err, PX_EPARSE, "plan: /replicas/%zu/stages: expected 1 to 64", r);
        n_stage_total += ns;
    }
    px_status st = px_arena_new(0, &out->arena, err);
    if (st != PX_OK)
        return st;
    builder b = {.plan = out, .graph = graph, .err = err};
    b.cap_devices = graph ? px_hw_graph_view(graph)->n_devices : n_stage_total * PX_SIM_MAX_TP;
    b.cap_links = n_stage_total;
    out->devices =
        px_arena_calloc(out->arena, b.cap_devices ? b.cap_devices : 1, sizeof *out->devices);
    out->links = px_arena_calloc(out->arena, b.cap_links, sizeof *out->links);
    out->replicas = px_arena_calloc(out->arena, n_rep, sizeof *out->replicas);
    if (!out->devices || !out->links || !out->replicas) {
        st = px_err_set(err, PX_ENOMEM, "plan: out of memory");
        goto fail;
    }
    if (graph && (st = devices_from_graph(&b)) != PX_OK)
        goto fail;
    const json_t *id = json_object_get(doc, "id");
    px_strlcpy(out->id, json_is_string(id) ? json_string_value(id) : "", sizeof out->id);
    out->emulated = json_is_true(json_object_get(doc, "emulated"));
    const json_t *wl = json_object_get(doc, "workload");
    out->context = (uint32_t)num_at(wl, "context", NULL, 4096);
    out->prompt_tokens = (uint32_t)num_at(wl, "prompt_tokens", NULL, 512);
    out->gen_tokens = (uint32_t)num_at(wl, "gen_tokens", NULL, 256);
    double batch = num_at(doc, "batching", "batch_per_replica", num_at(wl, "batch", NULL, 1));
    double micro = num_at(doc, "batching", "micro_batches", num_at(wl, "micro_batches", NULL, 1));
    if (!(batch >= 1 && batch <= 65536) || !(micro >= 1 && micro <= batch) || out->context < 1 ||
        out->prompt_tokens < 1) {
        st = px_err_set(err, PX_EPARSE,
                        "plan: /batching or /workload: batch %g, micro-batches "
                        "%g, context %u, prompt %u are out of range",
                        batch, micro, out->context, out->prompt_tokens);
        goto fail;
    }
    out->predicted_throughput =
        num_at(json_object_get(doc, "predictions"), "throughput_tokens_per_s", "p50", 0);
    double tpot0 = num_at(json_array_get(replicas, 0), "tpot_s", NULL, 0);
    for (size_t r = 0; r < n_rep; r++) {
        const json_t *rj = json_array_get(replicas, r);
        const json_t *rs = json_object_get(rj, "stages");
        px_sim_replica *rep = &out->replicas[r];
        rep->n_stages = (uint32_t)json_array_size(rs);
        /* A replica's own batch where the plan gives one. */
        double rb = num_at(rj, "batch", NULL, batch);
        double rm = num_at(rj, "micro_batches", NULL, micro);
        if (!(rb >= 1 && rb <= 65536) || !(rm >= 1 && rm <= rb)) {
            st = px_err_set(err, PX_EPARSE,
                            "plan: /replicas/%zu: batch %g, micro-batches %g are out of range "
                            "(batch 1..65536, micro-batches 1..batch)",
                            r, rb, rm);
            goto fail;
        }
        rep->batch = (uint32_t)rb;
        rep->micro_batches = (uint32_t)rm;
        rep->stages = px_arena_calloc(out->arena, rep->n_stages, sizeof *rep->stages);
        if (!rep->stages) {
            st = px_err_set(err, PX_ENOMEM, "plan: out of memory");
            goto fail;
        }
        /* Only replica 0's stages carry predictions in the document; a
         * replica laid out alike takes them, scaled by its own predicted
         * time per token. */
        double tpot = num_at(rj, "tpot_s", NULL, 0);
        double scale = r > 0 && tpot0 > 0 && tpot > 0 ? tpot / tpot0 : 1.0;
        for (uint32_t i = 0; i < rep->n_stages; i++) {
            size_t di = i < json_array_size(stages) ? i : json_array_size(stages) - 1;
            char where[64];
            snprintf(where, sizeof where, "/replicas/%zu/stages/%u", r, i);
            st = read_stage(&b, json_array_get(rs, i), json_array_get(stages, di), scale, where,
                            &rep->stages[i]);
            if (st != PX_OK)
                goto fail;
        }
        for (uint32_t i = 0; i + 1 < rep->n_stages; i++) {
            double xfer = num_at(json_object_get(
                                     json_array_get(stages, PX_MIN(i, json_array_size(stages) - 1)),
                                     "predicted"),
                                 "transfer_s_per_token", NULL, 0) *
                          scale;
            st = hop_link(&b, rep->stages[i].devices[0], rep->stages[i + 1].devices[0], xfer,
                          &rep->stages[i]);
            if (st != PX_OK)
                goto fail;
        }
    }
    out->n_replicas = n_rep;
    if (!graph) {
        /* Without an inventory: the plan's own power and price spread over
         * its devices; no thermal model and no random failures. */
        double power = num_at(json_object_get(doc, "predictions"), "power_w", NULL, 0);
        double usd = num_at(json_object_get(doc, "predictions"), "usd_per_hour", NULL, 0);
        for (size_t i = 0; i < out->n_devices; i++) {
            px_sim_device *d = &out->devices[i];
            d->power_active_w = power > 0 ? power / out->n_devices : ASSUMED_POWER_W;
            d->power_idle_w = ASSUMED_IDLE_FRACTION * d->power_active_w;
            d->usd_per_hour = usd / out->n_devices;
        }
    }
    return PX_OK;
fail:
    px_sim_plan_release(out);
    return st;
}

void px_sim_plan_release(px_sim_plan *plan)
{
    if (!plan)
        return;
    px_arena_free(plan->arena);
    memset(plan, 0, sizeof *plan);
}

px_status px_sim_plan_check(const px_sim_plan *p, px_err *err)
{
    if (!p || p->n_replicas == 0 || !p->replicas || p->n_devices == 0 || !p->devices)
        return px_err_set(err, PX_EINVAL, "plan: no replicas or no devices");
    if (p->context == 0 || p->prompt_tokens == 0)
        return px_err_set(err, PX_EINVAL, "plan: context and prompt_tokens must be at least 1");
    for (size_t i = 0; i < p->n_devices; i++) {
        const px_sim_device *d = &p->devices[i];
        if (d->n_domains > PX_SIM_MAX_DOMAINS || !(d->power_active_w >= 0) ||
            !(d->power_idle_w >= 0) || !(d->thermal_tau_s >= 0) || !(d->mtbf_s >= 0))
            return px_err_set(err, PX_EINVAL,
                              "plan: devices[%zu] (%.40s): negative or invalid "
                              "figure",
                              i, d->id);
        for (uint32_t k = 0; k < d->n_domains; k++)
            if (d->domains[k] >= p->n_domains)
                return px_err_set(err, PX_EINVAL, "plan: devices[%zu].domains[%u] out of range", i,
                                  k);
    }
    for (size_t l = 0; l < p->n_links; l++)
        if (!(p->links[l].bandwidth > 0) || !isfinite(p->links[l].bandwidth))
            return px_err_set(err, PX_EINVAL, "plan: links[%zu].bandwidth must be positive", l);
    for (size_t r = 0; r < p->n_replicas; r++) {
        const px_sim_replica *rep = &p->replicas[r];
        if (rep->n_stages == 0 || rep->n_stages > 64 || !rep->stages || rep->batch == 0 ||
            rep->batch > 65536 || rep->micro_batches > rep->batch)
            return px_err_set(err, PX_EINVAL,
                              "plan: replicas[%zu]: needs 1..64 stages, batch "
                              "1..65536 and micro_batches <= batch",
                              r);
        for (uint32_t i = 0; i < rep->n_stages; i++) {
            const px_sim_stage *s = &rep->stages[i];
            if (s->n_devices == 0 || s->n_devices > PX_SIM_MAX_TP || !(s->decode_s >= 0) ||
                !(s->prefill_s >= 0) || !(s->weight_fraction >= 0 && s->weight_fraction <= 1) ||
                !isfinite(s->decode_s) || !isfinite(s->prefill_s) || !(s->xfer_bytes >= 0) ||
                !(s->xfer_latency_s >= 0))
                return px_err_set(err, PX_EINVAL,
                                  "plan: replicas[%zu].stages[%u]: figures out "
                                  "of range",
                                  r, i);
            for (uint32_t j = 0; j < s->n_devices; j++)
                if (s->devices[j] >= p->n_devices)
                    return px_err_set(err, PX_EINVAL,
                                      "plan: replicas[%zu].stages[%u]: device "
                                      "index out of range",
                                      r, i);
            if (i + 1 < rep->n_stages && s->link != PX_SIM_NONE && s->link >= p->n_links)
                return px_err_set(err, PX_EINVAL,
                                  "plan: replicas[%zu].stages[%u].link out of "
                                  "range",
                                  r, i);
        }
    }
    return PX_OK;
}

px_status px_sim_plan_check_inventory(const json_t *plan_doc, const px_hw_graph *graph,
                                      const char *inv_name, px_err *err)
{
    const json_t *inv = json_object_get(plan_doc, "inventory");
    const char *want = json_string_value(json_object_get(inv, "digest"));
    if (!graph || !want)
        return PX_OK;
    char got[65];
    px_status st = px_hw_graph_digest(graph, got, err);
    if (st != PX_OK)
        return st;
    if (!strcmp(want, got))
        return PX_OK;
    const char *name = json_string_value(json_object_get(inv, "name"));
    return px_err_set(err, PX_EINVAL,
                      "the plan was made on the inventory \"%.48s\", not on %.64s: a device of "
                      "the same name may differ; plan on this inventory (plexus plan "
                      "--inventory ... --out FILE) or pass the plan's own",
                      name ? name : "?", inv_name);
}
