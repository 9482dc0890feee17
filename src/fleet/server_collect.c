/* Artifacts' bytes that no artifact row names.  An upload stores the bytes
 * of an artifact (store slot put_artifact_data) before it writes the row
 * that names them, so that a row always has its bytes; bytes whose row
 * never came (the job moved on while they arrived, the replica died
 * between the two) are named by nothing.  The replica that schedules
 * removes them, when it takes the lease and then every
 * PX__COLLECT_EVERY_S, once they are older than PX__COLLECT_GRACE_S: an
 * upload in flight has stored its bytes and is about to write its row, and
 * the grace period (an hour, for a gap of milliseconds to seconds) keeps
 * them.  The store's own connection is never used, nor the server lock held,
 * while the database deletes. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#define COLLECT_MAX 256 /* rows deleted per statement (each its own transaction) */

static bool has_collector(const px_fleet_server *srv)
{
    const px__store_ops *o = srv->store.ops;
    return o->version >= 13 && o->collect_artifact_data;
}

px_status px__srv_collect_artifacts(px_fleet_server *srv, int64_t now, int64_t grace,
                                    int64_t *removed, int64_t *bytes, px_err *err)
{
    *removed = *bytes = 0;
    if (!has_collector(srv))
        return PX_OK;
    for (;;) {
        int64_t n = 0, size = 0;
        px_status st = srv->store.ops->collect_artifact_data(srv->store.self, now - grace,
                                                             COLLECT_MAX, &n, &size, err);
        if (st != PX_OK)
            return st;
        *removed += n;
        *bytes += size;
        if (n < COLLECT_MAX)
            return PX_OK;
    }
}

/* Collects while this replica schedules; a failure is said in the log and
 * tried again at the next period (what it would remove stays unused, and
 * nothing depends on it being gone). */
static void *collect_main(void *arg)
{
    px_fleet_server *srv = arg;
    uint64_t due = 0; /* at once, on taking the lease */
    bool was_active = false;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        uint64_t now = px_now_ns();
        bool active = atomic_load(&srv->active);
        if (active && !was_active)
            due = now;
        was_active = active;
        if (!active || now < due) {
            px__srv_wait(srv, active ? due : now + 1000000000ull);
            continue;
        }
        pthread_mutex_unlock(&srv->lock);
        int64_t removed = 0, bytes = 0;
        px_err err = {0};
        px_status st = px__srv_collect_artifacts(srv, px_wall_time(), PX__COLLECT_GRACE_S, &removed,
                                                 &bytes, &err);
        if (st != PX_OK)
            px_log_warn("server: collecting artifacts' bytes that no artifact names: %s; "
                        "tried again in %d s",
                        err.msg, PX__COLLECT_EVERY_S);
        else if (removed > 0)
            px_log_info("server: removed the bytes of %" PRId64 " artifacts that no artifact "
                        "names (%" PRId64 " bytes; uploads refused or cut off before their row)",
                        removed, bytes);
        pthread_mutex_lock(&srv->lock);
        due = px_now_ns() + (uint64_t)PX__COLLECT_EVERY_S * 1000000000ull;
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

px_status px__srv_collect_start(px_fleet_server *srv, px_err *err)
{
    if (!has_collector(srv))
        return PX_OK;
    if (pthread_create(&srv->collect_thread, NULL, collect_main, srv) != 0)
        return px_err_set(err, PX_EINTERNAL,
                          "cannot start the thread that collects artifacts' unused bytes");
    srv->collect_thread_started = true;
    return PX_OK;
}

void px__srv_collect_stop(px_fleet_server *srv)
{
    if (srv->collect_thread_started)
        pthread_join(srv->collect_thread, NULL);
    srv->collect_thread_started = false;
}
