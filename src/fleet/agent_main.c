/*
 * The agent: describes its node, joins the server (or registers with its
 * node credential), heartbeats in a thread of its own, long polls for
 * assignments and runs each in a thread (agent_job.c).  A server that
 * cannot be reached is retried with backoff, never fatal: the agent
 * outlives server restarts, and its reports get through once the server
 * is back.  But its jobs do not outlive its lease: when no heartbeat got
 * through for 3/4 of the lease, every job is stopped (fencing), because
 * the server may give the work to another node once the lease is over;
 * the agent registers again when it reaches the server.  An unknown-node
 * answer (the server lost the node) registers again, listing the work
 * still running.  A refused credential (the node was revoked) stops
 * everything.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"
#include "fleet/secret_impl.h"

#include <signal.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sleeps up to ms, returning early when the agent stops. */
static void nap(px__agent *a, int ms)
{
    while (ms > 0 && !atomic_load(&a->stopping)) {
        int step = PX_MIN(ms, 50);
        sleep_ms(step);
        ms -= step;
        if (a->cfg->stop && atomic_load(a->cfg->stop))
            atomic_store(&a->stopping, 1);
    }
}

json_t *px__agent_running(px__agent *a, int64_t *seq)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    pthread_mutex_lock(&a->mu);
    if (seq)
        *seq = a->running_seq;
    for (px__agent_job *j = a->jobs; j; j = j->next)
        if (!atomic_load(&j->done) && !atomic_load(&j->stop_requested))
            json_array_append_new(arr, json_pack("{s:s, s:i, s:i}", "job", j->job, "attempt",
                                                 j->attempt, "rank", j->rank));
    pthread_mutex_unlock(&a->mu);
    return arr;
}

void px__agent_apply_stop(px__agent *a, const json_t *stop)
{
    size_t i;
    json_t *it;
    json_array_foreach(stop, i, it)
    {
        const char *job = json_string_value(json_object_get(it, "job"));
        json_int_t attempt = json_integer_value(json_object_get(it, "attempt"));
        json_t *rank_v = json_object_get(it, "rank");
        if (!job)
            continue;
        pthread_mutex_lock(&a->mu);
        for (px__agent_job *j = a->jobs; j; j = j->next)
            if (!strcmp(j->job, job) && j->attempt == attempt &&
                (!rank_v || json_integer_value(rank_v) == j->rank)) {
                if (!atomic_exchange(&j->stop_requested, 1))
                    px_log_info("agent: stopping job %s attempt %d rank %d as the server asked",
                                j->job, j->attempt, j->rank);
            }
        pthread_mutex_unlock(&a->mu);
    }
}

void px__agent_job_key(const char *job, long long attempt, long long rank, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%lld/%lld", job, attempt, rank);
}

void px__agent_forget(px__agent *a, const char *key)
{
    for (size_t i = 0; i < PX_MIN(a->n_recent, (size_t)PX__AGENT_RECENT); i++)
        if (!strcmp(a->recent[i], key))
            a->recent[i][0] = '\0';
}

bool px__agent_seen(px__agent *a, const char *key)
{
    for (size_t i = 0; i < PX_MIN(a->n_recent, (size_t)PX__AGENT_RECENT); i++)
        if (!strcmp(a->recent[i], key))
            return true;
    px_strlcpy(a->recent[a->n_recent % PX__AGENT_RECENT], key, sizeof a->recent[0]);
    a->n_recent++;
    return false;
}

/* What a heartbeat thread does with a refusal of the node's credential:
 * the node was revoked; every job stops and the agent exits. */
static void revoked(px__agent *a, const px_err *err)
{
    if (!atomic_exchange(&a->revoked, 1))
        px_log_error("agent: %s; stopping every job", err->msg);
    atomic_store(&a->stopping, 1);
}

/* Sleeps up to ms like nap, and also returns when another thread asks for
 * a heartbeat at once (a model came into the cache). */
static void nap_heartbeat(px__agent *a, int ms)
{
    while (ms > 0 && !atomic_load(&a->stopping) && !atomic_exchange(&a->heartbeat_now, 0)) {
        int step = PX_MIN(ms, 50);
        sleep_ms(step);
        ms -= step;
        if (a->cfg->stop && atomic_load(a->cfg->stop))
            atomic_store(&a->stopping, 1);
    }
}

static void *heartbeat_main(void *arg)
{
    px__agent *a = arg;
    px_fleet_client *c;
    unsigned gen;
    px_err err;
    if (px__agent_client(a, &c, &gen, &err) != PX_OK) {
        px_log_error("agent: heartbeat: %s", err.msg);
        return NULL;
    }
    px_fleet_client_set_abort(c, &a->stopping);
    while (!atomic_load(&a->stopping)) {
        px__agent_sync(a, c, &gen);
        /* Work that fencing stopped: registering again lets the server
         * requeue it now rather than wait for the lease. */
        if (atomic_load(&a->fenced)) {
            json_t *stop = NULL;
            if (px__agent_register(a, c, &stop, &err) == PX_OK) {
                atomic_store(&a->fenced, 0);
                px__agent_apply_stop(a, stop);
                px_log_info("agent: node %s registered again after stopping its work", a->node_id);
            } else if (err.code == PX_EAUTH) {
                revoked(a, &err);
            }
            json_decref(stop);
            nap(a, (int)(a->heartbeat_s * 1000));
            continue;
        }
        json_t *ended = px__agent_stages_ended(a);
        int64_t seq = 0;
        json_t *running = px__agent_running(a, &seq);
        json_t *body =
            json_pack("{s:s, s:o, s:o, s:o, s:I, s:O, s:o}", "node", a->node_id, "live",
                      px__agent_live(a), "resident", px__agent_resident(a), "running", running,
                      "running_seq", (json_int_t)seq, "stages", ended, "evictions",
                      a->cache ? px_fleet_cache_evictions_take(a->cache) : json_array());
        /* A heartbeat waits at most a quarter of the lease: one stuck on a
         * dead connection must not hold back the next. */
        px_fleet_client_set_timeout(c, (int)(PX_MAX(a->lease_s / 4, 0.5) * 1000));
        json_t *reply = NULL;
        long code = 0;
        uint64_t sent = px_now_ns();
        px_status st =
            body ? px_fleet_client_call(c, "POST", "/v1/agent/heartbeat", body, &code, &reply, &err)
                 : PX_ENOMEM;
        json_decref(body);
        if (st == PX_OK)
            px__agent_stages_acked(a, ended);
        json_decref(ended);
        if (st == PX_OK) {
            px__agent_renewed(a, sent);
            px__agent_apply_stop(a, json_object_get(reply, "stop"));
            px__agent_models_want(a, json_object_get(reply, "models"));
            double hb = json_number_value(json_object_get(reply, "heartbeat_s"));
            if (hb > 0)
                a->heartbeat_s = hb;
            if (json_is_true(json_object_get(reply, "rotate_credential")) &&
                px__agent_rotate(a, c, &err) != PX_OK)
                px_log_warn("agent: rotating the node credential: %s", err.msg);
            gen = atomic_load(&a->cred_gen);
        } else if (code == 404) {
            json_t *stop = NULL;
            px_log_info("agent: the server does not know node %s; registering again", a->node_id);
            if (px__agent_register(a, c, &stop, &err) == PX_OK)
                px__agent_apply_stop(a, stop);
            else if (err.code == PX_EAUTH)
                revoked(a, &err);
            json_decref(stop);
        } else if (code == 401) {
            revoked(a, &err);
        } else if (!atomic_load(&a->stopping)) {
            px_log_info("agent: heartbeat: %s", err.msg);
        }
        json_decref(reply);
        /* Processes that escaped a supervisor come to the agent: end them. */
        size_t swept = px__proc_sweep();
        if (swept)
            px_log_warn("agent: ended %zu process(es) that had escaped their job", swept);
        nap_heartbeat(a, (int)(a->heartbeat_s * 1000));
    }
    px_fleet_client_free(c);
    return NULL;
}

/* Joins and drops the threads of finished work. */
static void reap_jobs(px__agent *a, bool all)
{
    for (;;) {
        px__agent_job *found = NULL;
        pthread_mutex_lock(&a->mu);
        for (px__agent_job **pp = &a->jobs; *pp; pp = &(*pp)->next)
            if (atomic_load(&(*pp)->done) || (all && !(*pp)->thread_started)) {
                found = *pp;
                *pp = found->next;
                break;
            }
        if (!found && all && a->jobs) {
            found = a->jobs;
            a->jobs = found->next;
        }
        pthread_mutex_unlock(&a->mu);
        if (!found)
            return;
        if (found->thread_started)
            pthread_join(found->thread, NULL);
        json_decref(found->assignment);
        free(found);
    }
}

/* Starts the work of an assignment; returns false when it was seen before. */
static bool take(px__agent *a, const json_t *as)
{
    const char *job = json_string_value(json_object_get(as, "job"));
    json_int_t attempt = json_integer_value(json_object_get(as, "attempt"));
    json_int_t rank = json_integer_value(json_object_get(as, "rank"));
    if (!job || strlen(job) >= 100 || !json_is_object(json_object_get(as, "spec"))) {
        px_log_warn("agent: ignoring a malformed assignment");
        return false;
    }
    /* Past the fencing deadline the server may already have given this
     * work to another node: start nothing until the lease is renewed. */
    if (px__agent_fence_passed(a))
        return false;
    char key[160];
    px__agent_job_key(job, (long long)attempt, (long long)rank, key, sizeof key);
    pthread_mutex_lock(&a->mu);
    bool seen = px__agent_seen(a, key);
    pthread_mutex_unlock(&a->mu);
    if (seen)
        return false;
    px__agent_job *j = calloc(1, sizeof *j);
    if (!j)
        return false;
    j->agent = a;
    px_strlcpy(j->job, job, sizeof j->job);
    j->attempt = (int)attempt;
    j->rank = (int)rank;
    j->assignment = json_deep_copy(as);
    px_log_info("agent: running job %s attempt %d rank %d", j->job, j->attempt, j->rank);
    pthread_mutex_lock(&a->mu);
    j->next = a->jobs;
    a->jobs = j;
    j->listed = ++a->running_seq;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1u << 20);
    j->thread_started =
        j->assignment && pthread_create(&j->thread, &attr, px__agent_job_main, j) == 0;
    pthread_attr_destroy(&attr);
    if (!j->thread_started) {
        px_log_warn("agent: job %s attempt %d rank %d: cannot start a thread for it; taking it "
                    "again when the server repeats the assignment",
                    j->job, j->attempt, j->rank);
        px__agent_forget(a, key);
        atomic_store(&j->done, 1);
    }
    pthread_mutex_unlock(&a->mu);
    return true;
}

/* path made absolute against the working directory: the model path a job
 * gets ($PLEXUS_MODEL) and its folder must hold from the job's own
 * folder, not only from where the agent started.  Returns owned memory,
 * NULL when out of memory or the working directory is unknown. */
static char *absolute(const char *path)
{
    if (path[0] == '/')
        return px_strdup(path);
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    return px_asprintf("%s/%s", cwd, path);
}

static px_status setup(px__agent *a, const px_fleet_agent_config *cfg, px_err *err)
{
    a->cfg = cfg;
    a->heartbeat_s = 2;
    a->lease_s = 10;
    a->running_seq = px_wall_time() * 1000;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->cred_mu, NULL);
    if (cfg->token && !px__token_valid(cfg->token))
        return px_err_set(err, PX_EINVAL,
                          "the join token must be 16 to 256 printable characters without spaces");
    px_status st = px__agent_describe(a, err);
    if (st != PX_OK)
        return st;
    if (cfg->work_dir) {
        a->work_dir = absolute(cfg->work_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        a->work_dir = px_asprintf("%s/plexus-agent-%s", tmp && tmp[0] ? tmp : "/tmp", a->node_id);
    }
    if (!a->work_dir)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    if ((st = px__agent_contain_setup(a, err)) != PX_OK)
        return st;
    /* Say at once when Python jobs cannot run, or run another python3
     * than the one the node's frameworks were read from. */
    px_err py_err;
    char *interp = NULL;
    if (px__agent_job_user_may_run(a, a->python, "the Python interpreter", &interp, &py_err) !=
        PX_OK)
        px_log_warn("agent: %s; Python jobs (plexus submit --python) fail until then", py_err.msg);
    else if (interp && strcmp(interp, a->python) != 0)
        px_log_info("agent: Python jobs run %s, the first %s on PATH the job user can run", interp,
                    a->python);
    free(interp);
    if ((st = px__agent_cred_setup(a, err)) != PX_OK)
        return st;
    char *cache_dir =
        cfg->cache_dir ? absolute(cfg->cache_dir) : px_asprintf("%s/cache", a->work_dir);
    if (!cache_dir)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    st = px_fleet_cache_open(cache_dir, cfg->cache_budget ? cfg->cache_budget : (uint64_t)10 << 30,
                             &a->cache, err);
    free(cache_dir);
    return st;
}

px_status px_fleet_agent_run(const px_fleet_agent_config *cfg, px_err *err)
{
    px__agent *a = calloc(1, sizeof *a);
    if (!a)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_fleet_client *c = NULL;
    unsigned gen = 0;
    pthread_t hb, models, stages;
    bool hb_started = false, models_started = false, stages_started = false;
    /* A server that goes away mid-request must not kill the agent. */
    signal(SIGPIPE, SIG_IGN);
    px_status st = setup(a, cfg, err);
    if (st != PX_OK)
        goto done;
    if ((st = px__agent_client(a, &c, &gen, err)) != PX_OK)
        goto done;
    px_fleet_client_set_abort(c, &a->stopping);
    px_fleet_client_set_timeout(c, 5000);
    /* Join or register, waiting for the server to come up. */
    int delay = 100;
    for (;;) {
        json_t *stop = NULL;
        st = px__agent_register(a, c, &stop, err);
        json_decref(stop);
        if (st == PX_OK)
            break;
        if (st == PX_EAUTH || st == PX_EINVAL || st == PX_EEXIST) {
            px_err_prefix(err, st, "joining the server: ");
            goto done;
        }
        if (atomic_load(&a->stopping) || (cfg->stop && atomic_load(cfg->stop))) {
            st = PX_OK;
            goto done;
        }
        px_log_info("agent: cannot register yet: %s", err ? err->msg : "");
        nap(a, delay);
        delay = PX_MIN(delay * 2, 2000);
    }
    gen = atomic_load(&a->cred_gen);
    px_log_info("agent: node %s registered with %s", a->node_id, px_fleet_client_server(c));
    if (pthread_create(&hb, NULL, heartbeat_main, a) == 0)
        hb_started = true;
    if (pthread_create(&models, NULL, px__agent_models_main, a) == 0)
        models_started = true;
    if (pthread_create(&stages, NULL, px__agent_stages_main, a) == 0)
        stages_started = true;
    delay = 100;
    while (!atomic_load(&a->stopping)) {
        if (cfg->stop && atomic_load(cfg->stop)) {
            atomic_store(&a->stopping, 1);
            break;
        }
        reap_jobs(a, false);
        px__agent_sync(a, c, &gen);
        /* A long poll never outlives half the lease: a poll still open on
         * the server after this agent died must not look like a live node. */
        double wait_s = PX_MIN(10.0, PX_MAX(0.5, a->lease_s / 2));
        char *path = px_asprintf("/v1/agent/assignments?wait=%g", wait_s);
        px_fleet_client_set_timeout(c, (int)(wait_s * 1000) + 5000);
        json_t *reply = NULL;
        long code = 0;
        px_err e2;
        st = path ? px_fleet_client_call(c, "GET", path, NULL, &code, &reply, &e2) : PX_ENOMEM;
        free(path);
        if (st == PX_OK) {
            delay = 100;
            pthread_mutex_lock(&a->cred_mu);
            px_strlcpy(a->server_hint, px_fleet_client_server(c), sizeof a->server_hint);
            pthread_mutex_unlock(&a->cred_mu);
            size_t i, n_new = 0;
            json_t *as, *list = json_object_get(reply, "assignments");
            json_array_foreach(list, i, as) n_new += take(a, as);
            px__agent_stages_order(a, json_object_get(reply, "stages"));
            /* The server repeats an assignment until its start is reported;
             * while only those come back, poll gently instead of spinning. */
            if (json_array_size(list) > 0 && n_new == 0)
                nap(a, 20);
        } else if (code == 404) {
            /* The heartbeat thread registers again. */
            nap(a, 200);
        } else if (code == 401 || code == 403) {
            if (!atomic_load(&a->stopping))
                px_log_error("agent: %s", e2.msg);
            nap(a, 2000);
        } else if (!atomic_load(&a->stopping)) {
            px_log_info("agent: assignments: %s", e2.msg);
            nap(a, delay);
            delay = PX_MIN(delay * 2, 2000);
        }
        json_decref(reply);
    }
    st = atomic_load(&a->revoked)
             ? px_err_set(err, PX_EAUTH,
                          "the server refused node %s's credential (an admin revoked the "
                          "node); its jobs were stopped",
                          a->node_id)
             : PX_OK;
done:
    atomic_store(&a->stopping, 1);
    if (hb_started)
        pthread_join(hb, NULL);
    if (models_started)
        pthread_join(models, NULL);
    if (stages_started)
        pthread_join(stages, NULL);
    reap_jobs(a, true);
    px__agent_idle_clients_free(a);
    px_fleet_client_free(c);
    px_fleet_cache_free(a->cache);
    json_decref(a->registration);
    json_decref(a->models_wanted);
    json_decref(a->stage_orders);
    json_decref(a->stage_ended);
    px__agent_contain_release(a);
    px__secret_wipe(a->cred, sizeof a->cred);
    free(a->node_id);
    free(a->work_dir);
    free(a->state_dir);
    free(a->python);
    pthread_mutex_destroy(&a->cred_mu);
    pthread_mutex_destroy(&a->mu);
    free(a);
    return st;
}
