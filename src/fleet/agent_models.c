/* Models the server asks this node to hold for the deployments planned on
 * it (the "models" of each heartbeat's reply): fetched from the server's
 * blob store into the content-addressed cache once, verified against
 * their digest (a blob that does not match is not kept), and held (never
 * evicted) until the server stops asking, when they become evictable
 * again.  The cache's contents go out with every heartbeat, so the server
 * sees where each model is resident. */
#include "fleet/agent_impl.h"

#include <unistd.h>

void px__agent_models_want(px__agent *a, const json_t *models)
{
    if (!json_is_array(models))
        return;
    json_t *copy = json_deep_copy(models);
    if (!copy)
        return;
    pthread_mutex_lock(&a->mu);
    bool same = a->models_wanted && json_equal(a->models_wanted, copy);
    json_decref(a->models_wanted);
    a->models_wanted = copy;
    pthread_mutex_unlock(&a->mu);
    if (!same)
        atomic_fetch_add(&a->models_gen, 1);
}

/* Fetches one model into the cache unless it is there, verifying its
 * digest, and holds it. */
px_status px__agent_fetch_and_hold(px__agent *a, px_fleet_client *c, const char *digest,
                                   const char *name, px_err *err)
{
    if (!px_fleet_cache_contains(a->cache, digest)) {
        char *path = px_asprintf("/v1/blobs/%s", digest);
        char *tmp = px_asprintf("%s/.download-%s-deployment", px_fleet_cache_dir(a->cache), digest);
        px_status st = path && tmp ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
        if (st == PX_OK && (st = px_fleet_client_download(c, path, tmp, NULL, err)) == PX_OK)
            st = px_fleet_cache_put_file(a->cache, tmp, name, digest, NULL, err);
        if (tmp)
            unlink(tmp);
        free(tmp);
        free(path);
        if (st != PX_OK)
            return px_err_prefix(err, st, "fetching model %.12s for a deployment: ", digest);
        px_log_info("agent: model %.12s fetched into the cache for a deployment", digest);
        /* The server learns of it now, not a heartbeat later. */
        atomic_store(&a->heartbeat_now, 1);
    }
    char *held;
    px_status st = px_fleet_cache_acquire(a->cache, digest, &held, err);
    free(held);
    return st;
}

static bool listed(const json_t *models, const char *digest)
{
    for (size_t k = 0; k < json_array_size(models); k++) {
        const char *d = json_string_value(json_object_get(json_array_get(models, k), "digest"));
        if (d && !strcmp(d, digest))
            return true;
    }
    return false;
}

void *px__agent_models_main(void *arg)
{
    px__agent *a = arg;
    px_fleet_client *c;
    unsigned gen;
    px_err err;
    if (!a->cache || px__agent_client(a, &c, &gen, &err) != PX_OK) {
        if (a->cache)
            px_log_error("agent: deployment models: %s", err.msg);
        return NULL;
    }
    px_fleet_client_set_abort(c, &a->stopping);
    json_t *held = json_object(); /* digest -> true */
    unsigned seen = 0;
    uint64_t retry_at = 0;
    while (!atomic_load(&a->stopping)) {
        unsigned now_gen = atomic_load(&a->models_gen);
        if (now_gen == seen && px_now_ns() < retry_at) {
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        seen = now_gen;
        retry_at = UINT64_MAX;
        /* A copy of this thread's own, not a reference: jansson reads a
         * reference count without an atomic before it drops one, so a
         * document must not be released on two threads at once. */
        pthread_mutex_lock(&a->mu);
        json_t *wanted = a->models_wanted ? json_deep_copy(a->models_wanted) : NULL;
        bool lost = a->models_wanted && !wanted;
        pthread_mutex_unlock(&a->mu);
        if (lost) {
            px_log_warn("agent: deployment models: out of memory; trying again in 2 s");
            retry_at = px_now_ns() + 2000000000ull;
            continue;
        }
        px__agent_sync(a, c, &gen);
        size_t i;
        json_t *m;
        json_array_foreach(wanted, i, m)
        {
            const char *digest = json_string_value(json_object_get(m, "digest"));
            if (!digest || json_object_get(held, digest) || atomic_load(&a->stopping))
                continue;
            if (px__agent_fetch_and_hold(
                    a, c, digest, json_string_value(json_object_get(m, "name")), &err) == PX_OK) {
                json_object_set_new(held, digest, json_true());
            } else {
                px_log_warn("agent: %s", err.msg);
                retry_at = px_now_ns() + 2000000000ull; /* tried again in 2 s */
            }
        }
        /* Models no deployment here needs any more become evictable. */
        const char *digest;
        json_t *v, *tmp;
        json_object_foreach_safe(held, tmp, digest, v)
        {
            if (!listed(wanted, digest)) {
                /* digest is the key: it goes with the member. */
                px_log_info("agent: model %.12s released: no deployment here needs it", digest);
                px_fleet_cache_release(a->cache, digest);
                json_object_del(held, digest);
            }
        }
        json_decref(wanted);
    }
    const char *digest;
    json_t *v;
    json_object_foreach(held, digest, v) px_fleet_cache_release(a->cache, digest);
    json_decref(held);
    px_fleet_client_free(c);
    return NULL;
}
