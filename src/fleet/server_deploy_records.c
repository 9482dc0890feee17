/* What a deployment's front end reports: its serving figures observed
 * over time (tokens/s, TTFT, TPOT, the running batch, the queue, each
 * stage's step time) and its incidents (plexus.incident/1 records).
 * Both arrive from outside (untrusted) and are checked here before the
 * store keeps them, each kind as a ring per deployment. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "plexus/heal.h"

#include <math.h>
#include <time.h>

#define FIGURE_MAX  1e9 /* tokens/s, seconds: anything above is a unit error */
#define REPLICA_MAX 63
#define STAGE_MAX   1023
#define COUNT_MAX   1000000000LL

/* A number in [0, FIGURE_MAX] at obj[key] into *out; absent leaves it. */
static bool figure(const json_t *obj, const char *key, const char *where, double *out, bool *seen,
                   px_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return true;
    double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d < 0 || d > FIGURE_MAX) {
        px_err_set(err, PX_EINVAL, "%s%s: expected a number from 0 to %g, got %s", where, key,
                   FIGURE_MAX, json_is_number(v) ? "one out of range" : px_json_type_name(v));
        return false;
    }
    *out = d;
    if (seen)
        *seen = true;
    return true;
}

/* Refuses members not in known (a NULL-ended list). */
static bool only(const json_t *obj, const char *const *known, const char *where, px_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        size_t k = 0;
        while (known[k] && strcmp(key, known[k]) != 0)
            k++;
        if (!known[k]) {
            px_strbuf sb = PX_STRBUF_INIT;
            for (k = 0; known[k]; k++)
                px_strbuf_addf(&sb, "%s%s", k ? ", " : "", known[k]);
            px_err_set(err, PX_EINVAL, "%sunknown member \"%.32s\"; expected %s", where, key,
                       sb.buf ? sb.buf : "");
            px_strbuf_release(&sb);
            return false;
        }
    }
    return true;
}

/* {"p50": s, "p99": s} (p99 optional, never below p50) as a new object
 * into *out; absent leaves *out NULL. */
static bool quantiles(const json_t *obj, const char *key, const char *where, json_t **out,
                      px_err *err)
{
    static const char *const known[] = {"p50", "p99", NULL};
    const json_t *q = json_object_get(obj, key);
    *out = NULL;
    if (!q)
        return true;
    char at[96];
    snprintf(at, sizeof at, "%s%s.", where, key);
    if (!json_is_object(q)) {
        px_err_set(err, PX_EINVAL, "%s%s: expected {\"p50\": seconds, \"p99\": seconds}, got %s",
                   where, key, px_json_type_name(q));
        return false;
    }
    double p50 = -1, p99 = -1;
    if (!only(q, known, at, err) || !figure(q, "p50", at, &p50, NULL, err) ||
        !figure(q, "p99", at, &p99, NULL, err))
        return false;
    if (p50 < 0) {
        px_err_set(err, PX_EINVAL, "%s%s: \"p50\" is missing (seconds)", where, key);
        return false;
    }
    if (p99 >= 0 && p99 < p50) {
        px_err_set(err, PX_EINVAL,
                   "%s%s: p99 (%g s) is below p50 (%g s); send the quantiles in "
                   "that order",
                   where, key, p99, p50);
        return false;
    }
    *out =
        p99 >= 0 ? json_pack("{s:f, s:f}", "p50", p50, "p99", p99) : json_pack("{s:f}", "p50", p50);
    if (!*out) {
        px_err_set(err, PX_ENOMEM, "out of memory");
        return false;
    }
    return true;
}

/* An integer in [lo, hi] at obj[key]; absent leaves *out. */
static bool whole(const json_t *obj, const char *key, const char *where, json_int_t lo,
                  json_int_t hi, json_int_t *out, bool *seen, px_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        px_err_set(err, PX_EINVAL, "%s%s: expected a whole number from %lld to %lld", where, key,
                   (long long)lo, (long long)hi);
        return false;
    }
    *out = json_integer_value(v);
    if (seen)
        *seen = true;
    return true;
}

static json_t *stage_check(const json_t *s, size_t i, px_err *err)
{
    static const char *const known[] = {"stage", "replica", "step_s", NULL};
    char where[48];
    snprintf(where, sizeof where, "observation: stages[%zu].", i);
    if (!json_is_object(s)) {
        px_err_set(err, PX_EINVAL, "%s expected {\"stage\", \"step_s\"}, got %s", where,
                   px_json_type_name(s));
        return NULL;
    }
    json_int_t stage = -1, replica = 0;
    json_t *step = NULL;
    if (!only(s, known, where, err) || !whole(s, "stage", where, 0, STAGE_MAX, &stage, NULL, err) ||
        !whole(s, "replica", where, 0, REPLICA_MAX, &replica, NULL, err) ||
        !quantiles(s, "step_s", where, &step, err))
        return NULL;
    if (stage < 0 || !step) {
        json_decref(step);
        px_err_set(err, PX_EINVAL, "%s\"%s\" is missing", where, stage < 0 ? "stage" : "step_s");
        return NULL;
    }
    return json_pack("{s:I, s:I, s:o}", "stage", stage, "replica", replica, "step_s", step);
}

json_t *px__deploy_observation_check(const json_t *body, px_err *err)
{
    static const char *const known[] = {"replica", "window_s", "tokens_per_s", "ttft_s", "tpot_s",
                                        "running", "queued",   "requests",     "stages", NULL};
    const char *where = "observation: ";
    if (!json_is_object(body)) {
        px_err_set(err, PX_EINVAL, "observation: expected a JSON object, got %s",
                   px_json_type_name(body));
        return NULL;
    }
    if (!only(body, known, where, err))
        return NULL;
    json_t *o = json_object();
    if (!o) {
        px_err_set(err, PX_ENOMEM, "out of memory");
        return NULL;
    }
    bool any = false;
    double window = -1, tps = -1;
    json_int_t replica = -1, running = -1, queued = -1, requests = -1;
    json_t *ttft = NULL, *tpot = NULL;
    if (!whole(body, "replica", where, 0, REPLICA_MAX, &replica, NULL, err) ||
        !figure(body, "window_s", where, &window, NULL, err) ||
        !figure(body, "tokens_per_s", where, &tps, &any, err) ||
        !whole(body, "running", where, 0, COUNT_MAX, &running, &any, err) ||
        !whole(body, "queued", where, 0, COUNT_MAX, &queued, &any, err) ||
        !whole(body, "requests", where, 0, COUNT_MAX, &requests, &any, err) ||
        !quantiles(body, "ttft_s", where, &ttft, err) ||
        !quantiles(body, "tpot_s", where, &tpot, err))
        goto fail;
    if (replica >= 0)
        json_object_set_new(o, "replica", json_integer(replica));
    if (window >= 0)
        json_object_set_new(o, "window_s", json_real(window));
    if (tps >= 0)
        json_object_set_new(o, "tokens_per_s", json_real(tps));
    any = any || ttft || tpot;
    if (ttft)
        json_object_set_new(o, "ttft_s", ttft);
    if (tpot)
        json_object_set_new(o, "tpot_s", tpot);
    ttft = tpot = NULL;
    if (running >= 0)
        json_object_set_new(o, "running", json_integer(running));
    if (queued >= 0)
        json_object_set_new(o, "queued", json_integer(queued));
    if (requests >= 0)
        json_object_set_new(o, "requests", json_integer(requests));
    const json_t *stages = json_object_get(body, "stages");
    if (stages) {
        if (!json_is_array(stages) || json_array_size(stages) > PX__DEPLOY_STAGES_MAX) {
            px_err_set(err, PX_EINVAL,
                       "observation: stages: expected an array of at most %d "
                       "{\"stage\", \"replica\", \"step_s\"}",
                       PX__DEPLOY_STAGES_MAX);
            goto fail;
        }
        json_t *arr = json_array();
        json_object_set_new(o, "stages", arr);
        size_t i;
        json_t *s;
        json_array_foreach(stages, i, s)
        {
            json_t *one = stage_check(s, i, err);
            if (!one)
                goto fail;
            json_array_append_new(arr, one);
            any = true;
        }
    }
    if (!any) {
        px_err_set(err, PX_EINVAL,
                   "observation: no figure; send at least one of tokens_per_s, ttft_s, tpot_s, "
                   "running, queued, requests or stages (docs/formats/fleet-api.md)");
        goto fail;
    }
    return o;
fail:
    json_decref(ttft);
    json_decref(tpot);
    json_decref(o);
    return NULL;
}

json_t *px__deploy_incident_check(const json_t *body, px_err *err)
{
    if (!json_is_object(body)) {
        px_err_set(err, PX_EINVAL, "incident: expected a plexus.incident/1 record, got %s",
                   px_json_type_name(body));
        return NULL;
    }
    if (!px_heal_incident_complete(body, err))
        return NULL;
    if (json_array_size(json_object_get(body, "candidates")) > PX__DEPLOY_CANDIDATES_MAX ||
        json_array_size(json_object_get(body, "timeline")) > PX__DEPLOY_TIMELINE_MAX) {
        px_err_set(err, PX_EINVAL,
                   "incident: at most %d candidates and %d timeline entries are kept; send the "
                   "rest in the trace the reproducer names",
                   PX__DEPLOY_CANDIDATES_MAX, PX__DEPLOY_TIMELINE_MAX);
        return NULL;
    }
    json_t *copy = json_deep_copy(body);
    if (!copy)
        px_err_set(err, PX_ENOMEM, "out of memory");
    return copy;
}

/* ---- the server side ---- */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *kind_name(px__deploy_record_kind kind)
{
    return kind == PX__RECORD_OBSERVATION ? "observation" : "incident";
}

static const char *kind_plural(px__deploy_record_kind kind)
{
    return kind == PX__RECORD_OBSERVATION ? "observations" : "incidents";
}

px_status px__srv_deploy_record(px_fleet_server *srv, const char *deployment,
                                px__deploy_record_kind kind, const json_t *record,
                                const px__who *reporter, int64_t *seq, px_err *err)
{
    int64_t now_ms = wall_ms();
    json_t *o = json_pack("{s:O, s:{s:s}}", kind_name(kind), record, "reporter",
                          reporter->kind == PX__WHO_NODE ? "node" : "user", reporter->name);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = srv->store.ops->append_deploy_record(
        srv->store.self, deployment, kind_name(kind), now_ms, text,
        kind == PX__RECORD_OBSERVATION ? PX__DEPLOY_OBSERVATIONS_KEPT : PX__DEPLOY_INCIDENTS_KEPT,
        seq, err);
    free(text);
    if (st != PX_OK)
        return st;
    /* The dashboard's pages learn of it from the next snapshot. */
    if (!srv->deploy_reported)
        srv->deploy_reported = json_object();
    json_t *entry = json_object_get(srv->deploy_reported, deployment);
    if (!entry && srv->deploy_reported) {
        entry = json_object();
        json_object_set_new(srv->deploy_reported, deployment, entry);
    }
    json_object_set_new(entry, kind_plural(kind), json_integer(*seq));
    pthread_cond_broadcast(&srv->changed);
    return PX_OK;
}

void px__srv_deploy_forget(px_fleet_server *srv, const char *deployment)
{
    json_object_del(srv->deploy_reported, deployment);
}

json_t *px__srv_deploy_reported(px_fleet_server *srv, const char *deployment)
{
    const json_t *entry = json_object_get(srv->deploy_reported, deployment);
    json_int_t obs = json_integer_value(json_object_get(entry, "observations"));
    json_int_t inc = json_integer_value(json_object_get(entry, "incidents"));
    return json_pack("{s:I, s:I}", "observations", obs, "incidents", inc);
}

typedef struct list_ctx {
    json_t *arr;
    const char *member;
} list_ctx;

static void list_one(int64_t seq, int64_t at_ms, const char *body, void *ud)
{
    list_ctx *c = ud;
    json_t *v = body ? json_loads(body, 0, NULL) : NULL;
    if (!json_is_object(v)) {
        json_decref(v);
        return;
    }
    json_object_set_new(v, "seq", json_integer(seq));
    json_object_set_new(v, "at", json_real((double)at_ms / 1000.0));
    json_array_append_new(c->arr, v);
}

json_t *px__srv_deploy_records(px_fleet_server *srv, const char *deployment,
                               px__deploy_record_kind kind, int64_t after, int limit, px_err *err)
{
    list_ctx c = {json_array(), kind_name(kind)};
    if (!c.arr) {
        px_err_set(err, PX_ENOMEM, "out of memory");
        return NULL;
    }
    if (srv->store.ops->list_deploy_records(srv->store.self, deployment, kind_name(kind), after,
                                            limit, list_one, &c, err) != PX_OK) {
        json_decref(c.arr);
        return NULL;
    }
    return c.arr;
}

/* The plan's predictions the observations answer to: the service's and
 * each stage's step time (the decode time per token), per replica. */
json_t *px__deploy_predicted(const json_t *plan_record)
{
    const json_t *plan = json_object_get(plan_record, "plan");
    const json_t *pred = json_object_get(plan, "predictions");
    json_t *stages = json_array();
    size_t r;
    json_t *rep;
    const json_t *replicas = json_object_get(plan, "replicas");
    json_array_foreach(replicas, r, rep)
    {
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(rep, "stages"), i, s)
        {
            /* The first replica's stages carry the full predictions. */
            const json_t *full = json_array_get(json_object_get(plan, "stages"), i);
            const json_t *step = json_object_get(
                json_object_get(r == 0 && full ? full : s, "predicted"), "decode_s_per_token");
            json_array_append_new(stages, json_pack("{s:I, s:I, s:O?}", "replica", (json_int_t)r,
                                                    "stage", (json_int_t)i, "step_s", step));
        }
    }
    if (!json_array_size(replicas)) {
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(plan, "stages"), i, s) json_array_append_new(
            stages,
            json_pack("{s:i, s:I, s:O?}", "replica", 0, "stage", (json_int_t)i, "step_s",
                      json_object_get(json_object_get(s, "predicted"), "decode_s_per_token")));
    }
    return json_pack("{s:O?, s:O?, s:O?, s:o}", "tokens_per_s",
                     json_object_get(pred, "throughput_tokens_per_s"), "ttft_s",
                     json_object_get(pred, "ttft_s"), "tpot_s", json_object_get(pred, "tpot_s"),
                     "stages", stages);
}
