/*
 * The server's life: the model, its tokenizer and chat template; one
 * replica per replica of the plan (or one cpu session), each a generation
 * engine stepping on a thread of its own; then HTTP (server_http.c).  A
 * replica over stage workers runs under a healing supervisor, so a fault
 * while serving is detected and mitigated by the same loop as in
 * `plexus run`.
 */
#include "serve/server_impl.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "plexus/hw.h"

/* ------------------------------------------------------------------ */
/* Replicas                                                            */
/* ------------------------------------------------------------------ */

/* The stages that run now, for /health: read on the engine thread, where
 * the executor may change. */
static json_t *stages_of(px__srv_replica *r)
{
    json_t *a = json_array();
    if (!a)
        return NULL;
    if (r->session) {
        px_rt_session_info info;
        px_rt_session_info_get(r->session, &info);
        json_array_append_new(
            a, json_pack("{s:s, s:s, s:b, s:i, s:i, s:I}", "device", info.device.name, "backend",
                         "cpu", "emulated", info.device.emulated, "layers", (int)info.layer_end,
                         "threads", (int)info.n_threads, "pid", (json_int_t)getpid()));
        return a;
    }
    px_rt_executor *ex = px_rt_engine_executor(r->engine);
    const px_rt_pipeline_spec *spec = ex ? px_rt_executor_spec(ex) : NULL;
    for (uint32_t i = 0; spec && i < spec->n_stages; i++) {
        const px_rt_stage_spec *st = &spec->stages[i];
        json_array_append_new(a, json_pack("{s:i, s:s, s:s, s:b, s:[i,i], s:i}", "stage", (int)i,
                                           "device", st->device[0] ? st->device : st->backend,
                                           "backend", st->backend, "emulated", st->emulated,
                                           "layers", (int)st->layer_begin, (int)st->layer_end,
                                           "pid", px_rt_executor_stage_pid(ex, i)));
    }
    return a;
}

/* Says on stderr what the healing loop did, one line a record from the
 * `seen`th on: what was found, where, and what was done about it. */
static void log_incidents(const px__srv_replica *r, const json_t *inc, uint32_t seen)
{
    for (size_t i = seen; i < json_array_size(inc); i++) {
        const json_t *o = json_array_get(inc, i);
        const json_t *sig = json_object_get(o, "signature");
        const json_t *choice = json_object_get(o, "choice");
        const json_t *rto = json_object_get(o, "rto_s");
        char rto_text[48] = "not restored yet";
        if (json_is_number(rto))
            snprintf(rto_text, sizeof rto_text, "RTO %.3f s", json_number_value(rto));
        const char *label = json_string_value(json_object_get(choice, "label"));
        fprintf(stderr, "plexus serve: replica %u: incident %s (%s, %s): %s; %s%s; %s\n", r->index,
                json_string_value(json_object_get(o, "id")),
                json_string_value(json_object_get(o, "kind")),
                json_string_value(json_object_get(sig, "class")),
                json_string_value(json_object_get(sig, "evidence")), label ? "chose: " : "",
                label ? label : "no change", rto_text);
    }
}

/* Copies what /health, /metrics and /incidents show, under the lock. */
static void refresh(px__srv_replica *r, bool stages)
{
    px_rt_engine_metrics em;
    px_rt_engine_metrics_get(r->engine, &em);
    px_heal_run_summary hs = {0};
    if (r->heal)
        px_heal_run_get_summary(r->heal, &hs);
    json_t *st = stages ? stages_of(r) : NULL;
    json_t *inc = NULL;
    if (r->heal && hs.recorded != r->heal_sum.recorded) {
        inc = px_heal_run_incidents(r->heal);
        log_incidents(r, inc, r->heal_sum.recorded);
    }
    /* The steps by rows only when a window starts or closes (t_window is
     * written on this thread alone). */
    uint64_t now = px_now_ns();
    bool window = stages || now - r->t_window >= PX__SRV_WINDOW_NS;
    px_rt_engine_decode_timing by_rows[PX_RT_ENGINE_ROW_CLASSES];
    if (window)
        px_rt_engine_decode_timing_get(r->engine, by_rows);
    pthread_mutex_lock(&r->srv->mu);
    r->em = em;
    r->heal_sum = hs;
    if (window && !stages) {
        px__srv_window_since(r->windows[r->n_windows % PX__SRV_WINDOWS], by_rows, r->win_base);
        r->n_windows++;
    } else if (stages) {
        r->n_windows = 0;
    }
    if (window) {
        memcpy(r->win_base, by_rows, sizeof r->win_base);
        r->t_window = now;
    }
    if (st) {
        json_decref(r->stages);
        r->stages = st;
    }
    if (inc) {
        json_decref(r->incidents);
        r->incidents = inc;
    }
    pthread_mutex_unlock(&r->srv->mu);
}

static void *replica_main(void *arg)
{
    px__srv_replica *r = arg;
    px_rt_executor *seen = NULL;
    while (!atomic_load(&r->srv->stopping)) {
        bool busy = false;
        px_err err;
        px_status st = px_rt_engine_step(r->engine, &busy, &err);
        if (st) {
            px_log_error("serve: replica %u failed: %s", r->index, err.msg);
            pthread_mutex_lock(&r->srv->mu);
            px_strlcpy(r->failure, err.msg, sizeof r->failure);
            pthread_mutex_unlock(&r->srv->mu);
            atomic_store(&r->failed, true);
            refresh(r, true);
            return NULL;
        }
        px_rt_executor *now = px_rt_engine_executor(r->engine);
        /* Between requests no step comes to judge a change: its incident
         * is recorded now, not when the next request runs. */
        if (!busy && r->heal)
            px_heal_run_idle(r->heal);
        refresh(r, now != seen);
        seen = now;
        if (!busy)
            px_rt_engine_wait(r->engine, 200);
    }
    return NULL;
}

px__srv_replica *px__srv_pick(px_serve *s)
{
    /* The fewest requests given and not finished for the sequences it
     * runs at once (replicas of a plan may batch differently): a burst of
     * requests is spread in proportion before any engine has stepped. */
    px__srv_replica *best = NULL;
    double best_load = INFINITY;
    for (uint32_t i = 0; i < s->n_reps; i++) {
        px__srv_replica *r = &s->reps[i];
        double load = (double)atomic_load(&r->active) / PX_MAX(r->max_seqs, 1u);
        if (!atomic_load(&r->failed) && load < best_load) {
            best = r;
            best_load = load;
        }
    }
    if (best)
        atomic_fetch_add(&best->active, 1);
    return best;
}

void px__srv_release(px__srv_replica *r)
{
    atomic_fetch_sub(&r->active, 1);
}

static px_status start_session(px_serve *s, px__srv_replica *r, px_err *err)
{
    const px_serve_opts *o = &s->o;
    px_rt_session_opts so = {.n_threads = o->n_threads,
                             .max_seqs = r->max_seqs,
                             .context = s->context,
                             .max_batch_tokens = o->step_tokens,
                             .kv_blocks = o->kv_blocks};
    return px_rt_session_new(s->model, &so, &r->session, err);
}

static px_status start_pipeline(px_serve *s, px__srv_replica *r, px_err *err)
{
    const px_serve_opts *o = &s->o;
    px_heal_run_opts ho;
    px_heal_run_opts_default(&ho);
    ho.graph = o->graph;
    ho.inventory_doc = o->inventory_doc;
    ho.model = px_rt_model_ir(s->model);
    ho.model_path = s->model_path;
    ho.request = o->request;
    ho.plan = o->plan;
    ho.replica = r->index;
    ho.executor = o->executor;
    ho.executor.model_path = s->model_path;
    ho.executor.max_seqs = r->max_seqs;
    ho.executor.context = s->context;
    ho.executor.max_batch_tokens = o->step_tokens;
    ho.executor.kv_blocks = o->kv_blocks;
    if (r->index == 0) {
        ho.injects = o->injects;
        ho.n_injects = o->n_injects;
    }
    ho.heal = o->heal;
    ho.detector.host_stretch = r->host_stretch;
    return px_heal_run_new(&ho, &r->heal, err);
}

/* The cores a node's stage workers share: the inventory's figure, else,
 * where this process starts the workers itself, the cores it may run on;
 * 0 when not known. */
static double node_cores(const px_serve *s, const px_hw_node *node)
{
    if (node->cpu_cores.value >= 1)
        return node->cpu_cores.value;
    cpu_set_t set;
    if (s->o.executor.launcher || sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    return CPU_COUNT(&set);
}

/* Each replica's host_stretch: the replicas' stages on a node's cores
 * (px_rt_stage_on_host_cores) and this process (the executors, the
 * server) share them, so a stage runs up to (its node's stages + 1) / its
 * node's cores slower than alone as the load moves between them; the
 * largest over the replica's nodes, 1 where the cores are not known. */
static px_status host_stretch(px_serve *s, px_err *err)
{
    for (uint32_t i = 0; i < s->n_reps; i++)
        s->reps[i].host_stretch = 1;
    if (!s->o.plan || !s->o.graph)
        return PX_OK;
    const px_hw_view *v = px_hw_graph_view(s->o.graph);
    px_rt_pipeline_spec *spec = malloc(sizeof *spec);
    uint32_t *busy = calloc(v->n_nodes ? v->n_nodes : 1, sizeof *busy);
    /* Each replica's stages' nodes (UINT32_MAX: off the host's cores). */
    uint32_t(*node)[PX_RT_MAX_STAGES] = malloc(s->n_reps * sizeof *node);
    px_status st =
        spec && busy && node ? PX_OK : px_err_set(err, PX_ENOMEM, "serve: out of memory");
    for (uint32_t i = 0; i < s->n_reps && st == PX_OK; i++) {
        st = px_rt_pipeline_spec_from_plan_replica(s->o.plan, s->o.graph, "plan", i, spec, err);
        for (uint32_t k = 0; st == PX_OK && k < PX_RT_MAX_STAGES; k++) {
            uint32_t d;
            node[i][k] = UINT32_MAX;
            if (k < spec->n_stages && px_rt_stage_on_host_cores(&spec->stages[k]) &&
                px_hw_graph_find_device(s->o.graph, spec->stages[k].device, &d) &&
                v->devices[d].node < v->n_nodes)
                busy[node[i][k] = v->devices[d].node]++;
        }
    }
    for (uint32_t i = 0; i < s->n_reps && st == PX_OK; i++) {
        for (uint32_t k = 0; k < PX_RT_MAX_STAGES; k++) {
            double cores = node[i][k] < v->n_nodes ? node_cores(s, &v->nodes[node[i][k]]) : 0;
            if (cores >= 1)
                s->reps[i].host_stretch =
                    PX_MIN(PX_MAX(s->reps[i].host_stretch, (busy[node[i][k]] + 1) / cores), 64.0);
        }
    }
    free(node);
    free(spec);
    free(busy);
    return st;
}

static px_status start_replica(px_serve *s, px__srv_replica *r, px_err *err)
{
    px_status st = s->o.plan ? start_pipeline(s, r, err) : start_session(s, r, err);
    if (st)
        return px_err_prefix(err, st, "replica %u: ", r->index);
    px_rt_engine_opts eo = {.tokenizer = s->tok, .max_waiting = s->o.max_queue};
    if (r->session) {
        eo.session = r->session;
    } else {
        eo.executor = px_heal_run_executor(r->heal);
        eo.supervisor = px_heal_run_supervisor(r->heal);
        s->emulated |= px_rt_executor_spec(eo.executor)->emulated;
    }
    if ((st = px_rt_engine_new(&eo, &r->engine, err)) != PX_OK)
        return px_err_prefix(err, st, "replica %u: ", r->index);
    refresh(r, true);
    if (pthread_create(&r->thread, NULL, replica_main, r) != 0)
        return px_err_set(err, PX_EIO, "replica %u: cannot start its engine thread", r->index);
    r->started = true;
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* The model and its chat template                                     */
/* ------------------------------------------------------------------ */

static px_status load_model(px_serve *s, px_err *err)
{
    px_status st = px_rt_model_open(s->model_path, &s->model, err);
    if (st)
        return st;
    const px_ir_model *ir = px_rt_model_ir(s->model);
    const px_ir_vocab *v = px_ir_model_vocab(ir);
    if (!v)
        return px_err_set(err, PX_EINVAL,
                          "%s carries no tokenizer vocabulary; the server needs one to read "
                          "prompts and write text",
                          s->model_path);
    if ((st = px_rt_tokenizer_new(v, &s->tok, err)) != PX_OK)
        return st;
    const px_ir_hparams *hp = px_rt_model_hparams(s->model);
    uint32_t model_ctx = hp->context_length ? hp->context_length : 2048;
    s->context = s->o.context ? PX_MIN(s->o.context, model_ctx) : model_ctx;
    /* The chat template: asked for by name (an unknown name is an error
     * now), else recognized from the model (when it has none or an
     * unknown one, chat requests get the explanation). */
    px_err terr;
    st = px_serve_chat_template_for_model(ir, s->o.chat_template, &s->tmpl, &terr);
    if (st && s->o.chat_template) {
        if (err)
            *err = terr;
        return st;
    }
    if (st) {
        px_strlcpy(s->tmpl_error, terr.msg, sizeof s->tmpl_error);
        return PX_OK;
    }
    const px_serve_chat_template_info *ti = px_serve_chat_template_info_get(s->tmpl);
    for (size_t i = 0; i < ti->n_stops && s->n_stop_ids < PX_ARRAY_LEN(s->stop_ids); i++) {
        int32_t id = px_rt_tokenizer_find(s->tok, ti->stops[i], strlen(ti->stops[i]));
        if (id >= 0)
            s->stop_ids[s->n_stop_ids++] = id;
    }
    return PX_OK;
}

static void model_name_of(px_serve *s)
{
    if (s->o.model_name) {
        px_strlcpy(s->model_name, s->o.model_name, sizeof s->model_name);
        return;
    }
    const char *base = strrchr(s->model_path, '/');
    px_strlcpy(s->model_name, base ? base + 1 : s->model_path, sizeof s->model_name);
}

static uint64_t random_salt(void)
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
            v = 0;
        close(fd);
    }
    return v ? v : px_now_ns();
}

/* ------------------------------------------------------------------ */
/* Public                                                              */
/* ------------------------------------------------------------------ */

static px_status check_opts(const px_serve_opts *o, px_err *err)
{
    if (!o || !o->model_path)
        return px_err_set(err, PX_EINVAL, "serve: --model FILE is required");
    if (o->api_key && strlen(o->api_key) < 8)
        return px_err_set(err, PX_EINVAL,
                          "serve: the API key is %zu characters; use at least 8 (better 32 "
                          "random ones)",
                          strlen(o->api_key));
    if (o->max_seqs > 4096)
        return px_err_set(err, PX_EINVAL, "serve: --max-seqs %u; at most 4096", o->max_seqs);
    return PX_OK;
}

px_status px_serve_new(const px_serve_opts *o, px_serve **out, px_err *err)
{
    *out = NULL;
    px_status st = check_opts(o, err);
    if (st)
        return st;
    px_serve *s = calloc(1, sizeof *s);
    if (!s)
        return px_err_set(err, PX_ENOMEM, "serve: out of memory");
    s->o = *o;
    s->o.max_queue = o->max_queue ? o->max_queue : 64;
    s->o.step_tokens = o->step_tokens ? o->step_tokens : 512;
    pthread_mutex_init(&s->mu, NULL);
    s->model_path = px_strdup(o->model_path);
    if (o->api_key) {
        s->api_key = px_strdup(o->api_key);
        s->api_key_len = s->api_key ? strlen(s->api_key) : 0;
    }
    if (!s->model_path || (o->api_key && !s->api_key)) {
        st = px_err_set(err, PX_ENOMEM, "serve: out of memory");
        goto fail;
    }
    /* Borrowed strings the server keeps reading are copied or not kept. */
    s->o.model_path = s->model_path;
    s->o.api_key = NULL;
    s->o.listen = NULL;
    s->o.chat_template = NULL;
    model_name_of(s);
    s->o.model_name = NULL;
    s->salt = random_salt();
    s->created = (int64_t)time(NULL);
    s->t_start = px_now_ns();
    s->o.chat_template = o->chat_template;
    if ((st = load_model(s, err)) != PX_OK)
        goto fail;
    s->o.chat_template = NULL;
    s->n_reps = o->plan ? px_rt_plan_replicas(o->plan) : 1;
    s->reps = calloc(s->n_reps, sizeof *s->reps);
    if (!s->reps) {
        st = px_err_set(err, PX_ENOMEM, "serve: out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < s->n_reps; i++) {
        /* --max-seqs for every replica; else each replica's batch in the
         * plan (a slow replica batches fewer sequences than a fast one). */
        uint32_t b = o->max_seqs ? o->max_seqs : o->plan ? px_rt_plan_replica_batch(o->plan, i) : 0;
        s->reps[i].max_seqs = b ? PX_MIN(b, 4096u) : 16;
        s->reps[i].index = i;
        s->reps[i].srv = s;
    }
    if ((st = host_stretch(s, err)) != PX_OK)
        goto fail;
    for (uint32_t i = 0; i < s->n_reps; i++)
        if ((st = start_replica(s, &s->reps[i], err)) != PX_OK)
            goto fail;
    s->o.listen = o->listen;
    st = px__srv_http_start(s, err);
    s->o.listen = NULL;
    if (st)
        goto fail;
    *out = s;
    return PX_OK;
fail:
    px_serve_free(s);
    return st;
}

const char *px_serve_address(const px_serve *s)
{
    return s->address;
}

void px_serve_stop(px_serve *s)
{
    atomic_store(&s->closing, true);
}

void px_serve_free(px_serve *s)
{
    if (!s)
        return;
    /* Requests in progress end (cancelled, their streams closed) while
     * the engines still run; then the engines stop. */
    px_serve_stop(s);
    px__srv_http_stop(s);
    atomic_store(&s->stopping, true);
    for (uint32_t i = 0; i < s->n_reps; i++)
        if (s->reps[i].engine)
            px_rt_engine_wake(s->reps[i].engine);
    for (uint32_t i = 0; i < s->n_reps; i++) {
        px__srv_replica *r = &s->reps[i];
        if (r->started)
            pthread_join(r->thread, NULL);
        /* Requests still running end here, as cancelled. */
        px_rt_engine_free(r->engine);
        px_heal_run_free(r->heal);
        px_rt_session_free(r->session);
        json_decref(r->stages);
        json_decref(r->incidents);
    }
    free(s->reps);
    px_serve_chat_template_free(s->tmpl);
    px_rt_tokenizer_free(s->tok);
    px_rt_model_free(s->model);
    if (s->api_key)
        explicit_bzero(s->api_key, s->api_key_len);
    free(s->api_key);
    free(s->model_path);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

json_t *px__srv_incidents_json(px_serve *s)
{
    json_t *data = json_array();
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_reps && data; i++) {
        const json_t *inc = s->reps[i].incidents;
        for (size_t k = 0; k < json_array_size(inc); k++) {
            json_t *o = json_deep_copy(json_array_get(inc, k));
            if (o && !json_object_set_new(o, "replica", json_integer(i)))
                json_array_append_new(data, o);
            else
                json_decref(o);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL;
}

json_t *px__srv_status_json(px_serve *s)
{
    json_t *reps = json_array();
    bool all_ok = true, any_ok = false;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_reps && reps; i++) {
        px__srv_replica *r = &s->reps[i];
        bool failed = atomic_load(&r->failed);
        all_ok &= !failed;
        any_ok |= !failed;
        json_t *o = json_pack(
            "{s:i, s:s, s:O, s:i, s:i, s:i, s:i, s:i, s:I, s:I}", "index", (int)i, "state",
            failed ? "failed" : "serving", "stages", r->stages ? r->stages : json_null(),
            "max_seqs", (int)r->max_seqs, "running", (int)r->em.running, "waiting",
            (int)r->em.waiting, "kv_blocks", (int)r->em.kv_blocks, "kv_blocks_used",
            (int)r->em.kv_blocks_used, "incidents", (json_int_t)r->heal_sum.incidents, "recoveries",
            (json_int_t)r->em.recoveries);
        if (o && failed)
            json_object_set_new(o, "failure", json_string(r->failure));
        if (o && r->heal)
            json_object_set_new(o, "host_stretch", json_real(r->host_stretch));
        json_array_append_new(reps, o);
    }
    pthread_mutex_unlock(&s->mu);
    return json_pack("{s:s, s:s, s:b, s:o, s:f}", "status",
                     all_ok   ? "ok"
                     : any_ok ? "degraded"
                              : "failed",
                     "model", s->model_name, "emulated", s->emulated, "replicas",
                     reps ? reps : json_array(), "uptime_s",
                     (double)(px_now_ns() - s->t_start) / 1e9);
}
