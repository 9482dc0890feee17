/*
 * The executor's reading of a plan: the stages of replica 0 (layers,
 * embedding and head, devices, backend, emulation, predictions) and the
 * emu profiles of their devices from the inventory.
 */
#include "base/common.h"

#include "plexus/hw.h"
#include "rt/pipeline_impl.h"

static void interval_from(const json_t *v, px_rt_interval *out)
{
    out->p50 = out->lo = out->hi = NAN;
    if (!json_is_object(v))
        return;
    json_t *p50 = json_object_get(v, "p50"), *lo = json_object_get(v, "lo"),
           *hi = json_object_get(v, "hi");
    if (json_is_number(p50))
        out->p50 = json_number_value(p50);
    if (json_is_number(lo))
        out->lo = json_number_value(lo);
    if (json_is_number(hi))
        out->hi = json_number_value(hi);
}

static px_status bad(px_err *err, const char *name, const char *ptr, const char *fmt, ...)
    PX_PRINTF(4, 5);

static px_status bad(px_err *err, const char *name, const char *ptr, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return px_err_set(err, PX_EVALIDATE, "%s: %s: %s", name, ptr, msg);
}

static px_status stage_layers(const json_t *st, const char *name, uint32_t i, px_rt_stage_spec *s,
                              px_err *err)
{
    char ptr[64];
    snprintf(ptr, sizeof ptr, "/stages/%u/layers", i);
    json_t *l = json_object_get(st, "layers");
    json_t *first = json_object_get(l, "first"), *last = json_object_get(l, "last");
    if (!json_is_integer(first) || !json_is_integer(last))
        return bad(err, name, ptr, "expected {\"first\": F, \"last\": L} (inclusive blocks)");
    json_int_t f = json_integer_value(first), la = json_integer_value(last);
    /* last = first - 1: the stage runs no block (it holds only the
     * embedding or the head, which the caller checks). */
    if (f < 0 || f >= 1000000 || la < f - 1 || la >= 1000000)
        return bad(err, name, ptr,
                   "blocks %" JSON_INTEGER_FORMAT " to %" JSON_INTEGER_FORMAT
                   " are not a range (first <= last, both >= 0; or last = first - 1 "
                   "for a stage with no block)",
                   f, la);
    s->layer_begin = (uint32_t)f;
    s->layer_end = (uint32_t)la + 1;
    return PX_OK;
}

/* The emu profile of a stage's device: the inventory's, else the
 * stage's own "emu" member (else none, for a stand-in below). */
static px_status stage_profile(const json_t *st, const px_hw_graph *g, const char *name, uint32_t i,
                               px_rt_stage_spec *s, px_err *err)
{
    char ptr[64];
    snprintf(ptr, sizeof ptr, "/stages/%u/devices/0", i);
    const px_hw_device *d = NULL;
    if (g && s->device[0]) {
        uint32_t idx;
        if (!px_hw_graph_find_device(g, s->device, &idx))
            return bad(err, name, ptr,
                       "device \"%s\" is not in the inventory %s: pass the "
                       "inventory the plan was made for",
                       s->device, px_hw_graph_source(g));
        d = &px_hw_graph_view(g)->devices[idx];
        if (d->backend)
            px_strlcpy(s->backend, d->backend, sizeof s->backend);
        s->emulated |= d->emulated;
    }
    /* An emulated device is not this machine's hardware: a stage on one whose backend needs
     * the real thing (cuda) runs on the emu backend, as the emulated devices of an inventory
     * with profiles do, with the device's profile or, lacking one, a profile that adds no
     * slowdown; every output names the stage emulated. */
    bool stand_in = s->emulated && strcmp(s->backend, "cpu") && strcmp(s->backend, "emu");
    if (stand_in)
        px_strlcpy(s->backend, "emu", sizeof s->backend);
    if (strcmp(s->backend, "emu"))
        return PX_OK;
    s->emulated = true;
    if (d && d->emu.present) {
        s->emu.compute_slowdown = d->emu.compute_slowdown;
        s->emu.memory_slowdown = d->emu.memory_slowdown;
        s->emu.jitter = d->emu.jitter;
        s->emu.seed = d->emu.seed;
        double cap = px_hw_device_memory_capacity(d);
        s->emu.memory_bytes = cap > 0 && cap < 1e18 ? (uint64_t)cap : 0;
    } else if (json_object_get(st, "emu")) {
        char *text = px_json_dump_line(json_object_get(st, "emu"));
        if (!text)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        px_status rc = px_rt_emu_profile_parse(text, &s->emu, err);
        free(text);
        if (rc)
            return px_err_prefix(err, PX_EVALIDATE, "%s: /stages/%u/emu: ", name, i);
    } else if (stand_in) {
        s->emu = (px_rt_emu_profile){.compute_slowdown = 1, .memory_slowdown = 1};
        double cap = d ? px_hw_device_memory_capacity(d) : 0;
        s->emu.memory_bytes = cap > 0 && cap < 1e18 ? (uint64_t)cap : 0;
    } else {
        return bad(err, name, ptr,
                   "device \"%s\" runs on the emu backend but has no emulation "
                   "profile: pass --inventory with its \"emu\" member, or give the stage an "
                   "\"emu\" object",
                   s->device[0] ? s->device : "(unnamed)");
    }
    px_strlcpy(s->emu.name, s->device[0] ? s->device : "emu", sizeof s->emu.name);
    return PX_OK;
}

/* The micro-batches replica `replica` of a plan was priced with: its own
 * "micro_batches", else the plan's "batching"."micro_batches"; 0 when
 * neither says or the value lies outside 1..PX_RT_MAX_STAGES (the steps
 * the engine can keep in flight). */
static uint32_t plan_micro_batches(const json_t *plan, uint32_t replica)
{
    json_t *m = json_object_get(json_array_get(json_object_get(plan, "replicas"), replica),
                                "micro_batches");
    if (!json_is_integer(m))
        m = json_object_get(json_object_get(plan, "batching"), "micro_batches");
    json_int_t v = json_is_integer(m) ? json_integer_value(m) : 0;
    return v >= 1 && v <= PX_RT_MAX_STAGES ? (uint32_t)v : 0;
}

bool px_rt_stage_on_host_cores(const px_rt_stage_spec *s)
{
    return !strcmp(s->backend, "cpu") || !strcmp(s->backend, "emu");
}

px_status px_rt_pipeline_spec_from_plan(const json_t *plan, const px_hw_graph *g, const char *name,
                                        px_rt_pipeline_spec *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "plan";
    if (!json_is_object(plan))
        return bad(err, name, "(root)", "a plan is a JSON object (plexus.plan/1)");
    const char *schema = json_string_value(json_object_get(plan, "schema"));
    if (schema && strcmp(schema, "plexus.plan/1"))
        return bad(err, name, "/schema", "\"%.40s\" is not plexus.plan/1", schema);
    const char *id = json_string_value(json_object_get(plan, "id"));
    if (id)
        px_strlcpy(out->plan_id, id, sizeof out->plan_id);
    json_t *model = json_object_get(plan, "model");
    const char *mid = json_string_value(json_object_get(model, "id"));
    if (mid)
        px_strlcpy(out->model_id, mid, sizeof out->model_id);
    json_t *blocks = json_object_get(model, "blocks");
    if (json_is_integer(blocks) && json_integer_value(blocks) > 0 &&
        json_integer_value(blocks) < 1000000)
        out->model_blocks = (uint32_t)json_integer_value(blocks);
    json_t *pt = json_object_get(json_object_get(plan, "workload"), "prompt_tokens");
    if (json_is_integer(pt) && json_integer_value(pt) > 0 && json_integer_value(pt) < (1 << 30))
        out->plan_prompt_tokens = (uint32_t)json_integer_value(pt);
    out->micro_batches = plan_micro_batches(plan, 0);
    json_t *pred = json_object_get(plan, "predictions");
    interval_from(json_object_get(pred, "tpot_s"), &out->pred_tpot_s);
    interval_from(json_object_get(pred, "ttft_s"), &out->pred_ttft_s);
    out->emulated = json_is_true(json_object_get(plan, "emulated"));

    json_t *stages = json_object_get(plan, "stages");
    if (!json_is_array(stages) || json_array_size(stages) == 0)
        return bad(err, name, "/stages", "the plan has no stages");
    if (json_array_size(stages) > PX_RT_MAX_STAGES)
        return bad(err, name, "/stages", "%zu stages; the executor runs at most %d",
                   json_array_size(stages), PX_RT_MAX_STAGES);
    out->n_stages = (uint32_t)json_array_size(stages);
    for (uint32_t i = 0; i < out->n_stages; i++) {
        json_t *st = json_array_get(stages, i);
        px_rt_stage_spec *s = &out->stages[i];
        char ptr[64];
        snprintf(ptr, sizeof ptr, "/stages/%u", i);
        if (!json_is_object(st))
            return bad(err, name, ptr, "a stage is an object");
        px_status rc = stage_layers(st, name, i, s, err);
        if (rc)
            return rc;
        if (i == 0 && s->layer_begin != 0)
            return bad(err, name, ptr, "the first stage starts at block %u; it must start at 0",
                       s->layer_begin);
        if (i > 0 && s->layer_begin != out->stages[i - 1].layer_end)
            return bad(err, name, ptr,
                       "starts at block %u but stage %u ends at block %" PRId64 ": the "
                       "stages must cover the blocks in order without gaps or overlaps",
                       s->layer_begin, i - 1, (int64_t)out->stages[i - 1].layer_end - 1);
        bool embd = json_is_true(json_object_get(st, "embedding"));
        if (embd && i > 0)
            return bad(err, name, ptr,
                       "holds the embedding but is not the first stage: the first "
                       "stage embeds the tokens");
        s->embedding = i == 0;
        s->head = json_is_true(json_object_get(st, "head")) || i + 1 == out->n_stages;
        if (s->layer_begin == s->layer_end && !s->embedding && !s->head)
            return bad(err, name, ptr,
                       "runs no block (layers first %u, last %" PRId64 ") and holds "
                       "neither the embedding nor the head: drop the stage",
                       s->layer_begin, (int64_t)s->layer_begin - 1);
        json_t *tp = json_object_get(st, "tensor_parallel");
        if (json_is_integer(tp) && json_integer_value(tp) > 1)
            return bad(err, name, ptr,
                       "tensor_parallel %" JSON_INTEGER_FORMAT ": the executor "
                       "runs one device per stage; plan with `plexus plan --max-tp 1`",
                       json_integer_value(tp));
        const char *dev = json_string_value(json_array_get(json_object_get(st, "devices"), 0));
        if (dev)
            px_strlcpy(s->device, dev, sizeof s->device);
        const char *be = json_string_value(json_object_get(st, "backend"));
        px_strlcpy(s->backend, be ? be : "cpu", sizeof s->backend);
        s->emulated = json_is_true(json_object_get(st, "emulated"));
        if ((rc = stage_profile(st, g, name, i, s, err)) != PX_OK)
            return rc;
        if (strcmp(s->backend, "cpu") && strcmp(s->backend, "emu") && strcmp(s->backend, "cuda"))
            return bad(err, name, ptr, "backend \"%s\": the executor runs cpu, emu and cuda stages",
                       s->backend);
        json_t *p = json_object_get(st, "predicted");
        interval_from(json_object_get(p, "decode_s_per_token"), &s->pred_decode_s);
        interval_from(json_object_get(p, "prefill_s"), &s->pred_prefill_s);
        json_t *att = json_object_get(p, "attention_s_per_position");
        double a = json_is_number(att) ? json_number_value(att) : NAN;
        if (att && !(a >= 0 && a < 1)) {
            snprintf(ptr, sizeof ptr, "/stages/%u/predicted/attention_s_per_position", i);
            return bad(err, name, ptr,
                       "must be a number of seconds from 0 to 1 (what one attended position "
                       "adds to a step): write the plan again with `plexus plan`");
        }
        s->pred_attention_pos_s = att ? a : NAN;
        out->emulated |= s->emulated;
    }
    px_rt_stage_spec *last = &out->stages[out->n_stages - 1];
    if (out->model_blocks && last->layer_end != out->model_blocks)
        return bad(err, name, "/stages", "the stages end at block %" PRId64 " but the model has %u",
                   (int64_t)last->layer_end - 1, out->model_blocks);
    for (uint32_t i = 0; i + 1 < out->n_stages; i++)
        if (out->stages[i].head)
            return bad(err, name, "/stages", "stage %u holds the head but is not the last", i);
    return PX_OK;
}

uint32_t px_rt_plan_replicas(const json_t *plan)
{
    json_t *r = json_object_get(plan, "replicas");
    size_t n = json_is_array(r) ? json_array_size(r) : 0;
    return n ? (uint32_t)PX_MIN(n, (size_t)UINT32_MAX) : 1;
}

uint32_t px_rt_plan_replica_batch(const json_t *plan, uint32_t replica)
{
    json_t *b =
        json_object_get(json_array_get(json_object_get(plan, "replicas"), replica), "batch");
    if (!json_is_integer(b))
        b = json_object_get(json_object_get(plan, "batching"), "batch_per_replica");
    json_int_t v = json_is_integer(b) ? json_integer_value(b) : 0;
    return v >= 1 && v <= 65536 ? (uint32_t)v : 0;
}

px_status px_rt_pipeline_spec_from_plan_replica(const json_t *plan, const px_hw_graph *g,
                                                const char *name, uint32_t replica,
                                                px_rt_pipeline_spec *out, px_err *err)
{
    if (replica == 0)
        return px_rt_pipeline_spec_from_plan(plan, g, name, out, err);
    memset(out, 0, sizeof *out);
    json_t *reps = json_object_get(plan, "replicas");
    json_t *rep = json_array_get(reps, replica);
    json_t *stages = json_object_get(rep, "stages");
    if (!json_is_object(rep) || !json_is_array(stages))
        return bad(err, name ? name : "plan", "/replicas",
                   "replica %u does not exist or has no stages (the plan has %u replicas)", replica,
                   px_rt_plan_replicas(plan));
    /* The replica's stages in place of the first replica's: the same
     * reading, devices and backends from the inventory, no per-stage
     * predictions. */
    json_t *copy = json_copy((json_t *)plan);
    if (!copy)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = PX_OK;
    if (json_object_set(copy, "stages", stages) != 0)
        st = px_err_set(err, PX_ENOMEM, "out of memory");
    char label[96];
    snprintf(label, sizeof label, "%s (replica %u)", name ? name : "plan", replica);
    if (st == PX_OK)
        st = px_rt_pipeline_spec_from_plan(copy, g, label, out, err);
    json_decref(copy);
    if (st == PX_OK)
        out->micro_batches = plan_micro_batches(plan, replica);
    return st;
}
