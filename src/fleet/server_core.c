/* The server's life cycle: options, the data folder (private whatever
 * the umask), principals, the store, the scheduler thread (placement
 * passes, lease checks, retries of failed writes) and start/stop. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "fleet/ui_impl.h"
#include "fleet/secret_impl.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 100000000ull /* lease checks and backoff timers: every 100 ms */

/* ---- nodes from the store ---- */

static void load_node(const char *name, const char *reg, const char *state, int64_t last_seen,
                      void *ud)
{
    (void)last_seen;
    px_fleet_server *srv = ud;
    json_t *j = reg ? json_loads(reg, 0, NULL) : NULL;
    size_t i;
    px_err err;
    if (!j || px_fleet_sched_add_node(srv->sched, j, &i, &err) != PX_OK) {
        px_log_warn("fleet: node %s: stored registration unreadable; it must register again", name);
        json_decref(j);
        return;
    }
    json_decref(j);
    /* A node gets a full lease after a restart to send its next heartbeat. */
    px__srv_touch_node(srv, i);
    if (state && strcmp(state, "draining") == 0)
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_DRAINING);
    else if (state && strcmp(state, "offline") == 0)
        px_fleet_sched_set_state(srv->sched, i, PX_FLEET_NODE_OFFLINE);
}

void px__srv_touch_node(px_fleet_server *srv, size_t node)
{
    if (node >= srv->cap_last_seen) {
        size_t cap = PX_MAX(node + 1, srv->cap_last_seen * 2);
        double *l = realloc(srv->last_seen_ns, cap * sizeof *l);
        if (l)
            srv->last_seen_ns = l;
        double *w = realloc(srv->hb_written_ns, cap * sizeof *w);
        if (w)
            srv->hb_written_ns = w;
        if (!l || !w)
            return;
        for (size_t k = srv->cap_last_seen; k < cap; k++) {
            l[k] = (double)px_now_ns();
            w[k] = 0;
        }
        srv->cap_last_seen = cap;
    }
    srv->last_seen_ns[node] = (double)px_now_ns();
}

bool px__srv_wait(px_fleet_server *srv, uint64_t deadline_ns)
{
    uint64_t now = px_now_ns();
    if (srv->stopping || now >= deadline_ns)
        return false;
    uint64_t left = deadline_ns - now;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + left % 1000000000ull;
    ts.tv_sec += (time_t)(left / 1000000000ull + ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(&srv->changed, &srv->lock, &ts);
    return !srv->stopping;
}

/* ---- the scheduler lease (replicas on a shared store) ---- */

#define LEASE_POLL_NS  250000000ull /* a standby tries for the lease this often */
#define LEASE_CHECK_NS 500000000ull /* the holder checks it still holds it */

static void take_in_job(const px__job_row *row, void *ud);

/* Stops serving for good: the lease is gone, so another replica may be
 * scheduling already, and nothing this one holds in memory may be acted
 * on.  The process is expected to exit and be restarted (plexus server
 * does, with status 75), coming back as a standby. */
void px__srv_fence(px_fleet_server *srv, const char *why)
{
    atomic_store(&srv->active, false);
    if (!srv->failed[0]) {
        snprintf(srv->failed, sizeof srv->failed, "%.600s; this server stops serving", why);
        px_log_error("server: %s", srv->failed);
    }
}

/* Becomes the scheduling replica: reads the state the last holder left
 * (credentials, nodes, active jobs), then serves.  Server lock held. */
static px_status take_over(px_fleet_server *srv, px_err *err)
{
    uint64_t t0 = px_now_ns();
    pthread_rwlock_wrlock(&srv->auth_lock);
    px_status st = px__auth_load_store(srv, err);
    pthread_rwlock_unlock(&srv->auth_lock);
    if (st == PX_OK)
        st = px__srv_node_calls_begin(srv, err);
    if (st == PX_OK)
        st = srv->store.ops->list_nodes(srv->store.self, load_node, srv, err);
    if (st == PX_OK)
        st = px__srv_load(srv, err);
    if (st != PX_OK)
        return st;
    /* What the last holder left unclaimed is ours now too. */
    if (srv->store.ops->claim_jobs)
        srv->store.ops->claim_jobs(srv->store.self, 1000000, take_in_job, srv, err);
    srv->dirty = true;
    atomic_store(&srv->active, true);
    pthread_cond_broadcast(&srv->changed);
    px_log_info("server: took the scheduler lease; serving (%zu nodes, state read in %.0f ms)",
                srv->sched->n_nodes, (double)(px_now_ns() - t0) / 1e6);
    return PX_OK;
}

/* Stands by until the lease is ours, then takes over; checks it is still
 * held while serving.  False once this replica must stop serving.  Server
 * lock held (released while waiting). */
static bool lease_tick(px_fleet_server *srv)
{
    if (!srv->store.ops->lease)
        return true;
    if (srv->failed[0])
        return false;
    uint64_t now = px_now_ns();
    bool active = atomic_load(&srv->active);
    if (active && now - srv->lease_checked_ns < LEASE_CHECK_NS)
        return true;
    srv->lease_checked_ns = now;
    bool held = false;
    px_err err = {0};
    px_status st = srv->store.ops->lease(srv->store.self, &held, &err);
    if (active) {
        if (st != PX_OK || !held)
            px__srv_fence(srv, st != PX_OK ? err.msg : "lost the scheduler lease");
        return !srv->failed[0];
    }
    if (st != PX_OK)
        px_log_warn("server: standing by: %s", err.msg);
    else if (held && take_over(srv, &err) != PX_OK)
        px__srv_fence(srv, err.msg);
    return atomic_load(&srv->active);
}

/* A job another replica accepted: into the queue, as if submitted here. */
static void take_in_job(const px__job_row *row, void *ud)
{
    px_fleet_server *srv = ud;
    if (px__srv_find_job(srv, row->id))
        return;
    json_t *spec = json_loads(row->spec, 0, NULL);
    px_fleet_request *req = NULL;
    px_err err;
    px__job_row copy;
    if (!spec || px_fleet_request_compile(spec, &req, &err) != PX_OK ||
        px__job_row_copy(row, &copy, &err) != PX_OK) {
        px_log_error("fleet: job %s: stored specification unreadable; left queued", row->id);
        json_decref(spec);
        px_fleet_request_free(req);
        return;
    }
    json_decref(spec);
    px__job *job = px__srv_job_new(srv, &copy, req);
    if (!job) {
        px_fleet_request_free(req);
        px__job_row_release(&copy);
        return;
    }
    job->state = PX__JOB_QUEUED;
    px__srv_append_job(srv, job);
    srv->metrics.claimed++;
    srv->dirty = true;
}

/* ---- jobs other replicas accepted ---- */

#define CLAIM_BACKSTOP_NS 2000000000ull /* while listening: look anyway this often */
#define CLAIM_MAX         1000          /* jobs taken in at a time */
#define LISTEN_WAIT_MS    250           /* a wait of the listener; stop waits as long */
#define LISTEN_RETRY_NS   1000000000ull /* after a failed connection */

/* Waits (on its own connection) for the store's notification that another
 * replica accepted a job, and wakes the scheduler thread to claim it; only
 * while this replica schedules.  Without it (or while it cannot connect)
 * the scheduler looks on every tick. */
static void *listen_main(void *arg)
{
    px_fleet_server *srv = arg;
    uint64_t retry_at = 0;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        uint64_t now = px_now_ns();
        if (!atomic_load(&srv->active) || now < retry_at) {
            px__srv_wait(srv, now + LISTEN_WAIT_MS * 1000000ull);
            continue;
        }
        pthread_mutex_unlock(&srv->lock);
        bool woken = false;
        px_err err = {0};
        px_status st = srv->store.ops->wait_jobs(srv->store.self, LISTEN_WAIT_MS, &woken, &err);
        pthread_mutex_lock(&srv->lock);
        if (st != PX_OK) {
            if (srv->listening)
                px_log_warn("server: %s; looking for jobs on every tick until it connects again",
                            err.msg);
            srv->listening = false;
            retry_at = px_now_ns() + LISTEN_RETRY_NS;
            continue;
        }
        /* The first wait after connecting always wakes (for what came
         * before the LISTEN); only the later ones are notifications. */
        bool counted = srv->listening;
        srv->listening = true;
        if (woken) {
            if (counted)
                srv->metrics.notifications++;
            srv->claim_due = true;
            pthread_cond_signal(&srv->kick);
        }
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

/* A cancellation another replica recorded.  Taken only after a claim
 * that left no job behind, so that a job cancelled as soon as it was
 * accepted is in memory by then; one that has ended has nothing to stop.
 * A write the store refuses is said in the log (the user's replica
 * answered "requested", and the user may ask again). */
static void take_cancel(const char *id, void *ud)
{
    px_fleet_server *srv = ud;
    if (!px__srv_find_job(srv, id))
        return;
    px_err err;
    if (px__srv_cancel(srv, id, &err) != PX_OK)
        px_log_error("fleet: job %s: cancellation requested through another replica: %s", id,
                     err.msg);
    else
        px_log_info("fleet: job %s: cancelled (requested through another replica)", id);
}

/* Takes in the jobs other replicas accepted: when the listener says there
 * are some, else on every tick while nobody listens, and every
 * CLAIM_BACKSTOP_NS in any case; then the cancellations they recorded.
 * Server lock held. */
static void claim_tick(px_fleet_server *srv)
{
    if (!srv->store.ops->claim_jobs)
        return;
    /* What agents told other replicas: on a notification, else on a
     * timer of its own (heartbeats notify nobody). */
    px__srv_node_calls_tick(srv, srv->claim_due || !srv->listening);
    uint64_t now = px_now_ns();
    if (!srv->claim_due && srv->listening && now - srv->claimed_ns < CLAIM_BACKSTOP_NS)
        return;
    srv->claim_due = false;
    srv->claimed_ns = now;
    px_err err;
    uint64_t before = srv->metrics.claimed;
    if (srv->store.ops->claim_jobs(srv->store.self, CLAIM_MAX, take_in_job, srv, &err) != PX_OK) {
        px_log_warn("server: %s", err.msg);
        srv->claim_due = true; /* again on the next tick */
        return;
    }
    /* A full hand: there may be more; the next round takes them after
     * this pass has placed these. */
    if (srv->metrics.claimed - before >= CLAIM_MAX) {
        srv->claim_due = true;
        return;
    }
    if (srv->store.ops->version >= 9 && srv->store.ops->take_cancels &&
        srv->store.ops->take_cancels(srv->store.self, CLAIM_MAX, take_cancel, srv, &err) != PX_OK) {
        px_log_warn("server: %s", err.msg);
        srv->claim_due = true;
    }
}

/* ---- the scheduler thread ---- */

static void *sched_main(void *arg)
{
    px_fleet_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        bool serving = lease_tick(srv);
        if (serving) {
            px__srv_check_leases(srv);
            claim_tick(srv);
        }
        bool timers = false;
        double now = (double)px_now_ns();
        for (px__job *j = srv->jobs; serving && j && !timers; j = j->next)
            timers = j->state == PX__JOB_QUEUED && j->not_before_ns > 0 && j->not_before_ns <= now;
        if (serving && (srv->dirty || timers))
            px__srv_schedule_pass(srv);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (serving ? TICK_NS : LEASE_POLL_NS);
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        if (!serving || (!srv->dirty && !srv->claim_due))
            pthread_cond_timedwait(&srv->kick, &srv->lock, &ts);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

/* ---- start and stop ---- */

static px_status parse_listen(const char *listen, char *host, size_t n_host, uint16_t *port,
                              px_err *err)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= n_host)
        return px_err_set(err, PX_EINVAL,
                          "--listen \"%.64s\": expected HOST:PORT such as "
                          "127.0.0.1:7070",
                          listen);
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || p < 0 || p > 65535)
        return px_err_set(err, PX_EINVAL, "--listen \"%.64s\": the port must be 0..65535", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    *port = (uint16_t)p;
    return PX_OK;
}

/* DATA and its folders, 0700 whatever the umask: the database and its
 * WAL hold jobs' environments, artifacts and blobs are users' data. */
static px_status make_dirs(const char *data, px_err *err)
{
    const char *subs[] = {"", "/artifacts", "/blobs", "/tmp"};
    for (size_t i = 0; i < PX_ARRAY_LEN(subs); i++) {
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s%s", data, subs[i]) >= sizeof path)
            return px_err_set(err, PX_EINVAL, "--data: path too long");
        px_status st = px__private_dir(path, err);
        if (st != PX_OK)
            return px_err_prefix(err, st, "--data: ");
    }
    return PX_OK;
}

/* DATA/tmp, or with replicas on a shared store (and so, as a rule, a
 * data folder they share) DATA/tmp/HOST-PORT: the uploads in flight of
 * this replica alone, so that one starting does not clean up another's.
 * The name stays the same when the replica is restarted on the same
 * address, which then cleans up what it left. */
static px_status make_tmp_dir(px_fleet_server *srv, const px_fleet_server_options *o, px_err *err)
{
    char host[64] = "";
    if (o->store && px__store_is_pg(o->store)) {
        if (gethostname(host, sizeof host) != 0 || !host[0])
            snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        for (char *c = host; *c; c++)
            if (!isalnum((unsigned char)*c) && *c != '-' && *c != '.')
                *c = '_';
    }
    srv->tmp_dir = host[0] ? px_asprintf("%s/tmp/%s-%u", srv->data_dir, host, (unsigned)srv->port)
                           : px_asprintf("%s/tmp", srv->data_dir);
    if (!srv->tmp_dir)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = host[0] ? px__private_dir(srv->tmp_dir, err) : PX_OK;
    return st == PX_OK ? PX_OK : px_err_prefix(err, st, "--data: ");
}

/* Uploads a crash interrupted: nothing refers to them. */
static void clean_tmp(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (px_str_starts_with(e->d_name, "upload-"))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

int64_t px__srv_disk_headroom(px_fleet_server *srv)
{
    struct statvfs v;
    if (statvfs(srv->data_dir, &v) != 0)
        return INT64_MAX; /* cannot tell: let the write itself fail */
    double avail = (double)v.f_bavail * (double)v.f_frsize;
    double left = avail - (double)srv->opt.disk_reserve;
    return left > 9e18 ? INT64_MAX : (int64_t)left;
}

/* Each connection holds a socket and a thread: let the process have as
 * many descriptors as the system allows it. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

px_status px_fleet_server_start(const px_fleet_server_options *opt, px_fleet_server **out,
                                px_err *err)
{
    *out = NULL;
    px_fleet_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    srv->opt = *opt;
    px_fleet_server_options *o = &srv->opt;
    if (!o->listen)
        o->listen = "127.0.0.1:7070";
    if (!(o->lease_s > 0))
        o->lease_s = 10;
    if (!(o->heartbeat_s > 0))
        o->heartbeat_s = o->lease_s / 4;
    if (!(o->restart_backoff_s > 0))
        o->restart_backoff_s = 1;
    if (!o->max_body)
        o->max_body = 1 << 20;
    if (!o->max_upload)
        o->max_upload = (size_t)1 << 40;
    if (!o->max_connections)
        o->max_connections = 1024;
    if (!o->max_connections_per_address)
        o->max_connections_per_address = 64;
    if (!(o->header_timeout_s > 0))
        o->header_timeout_s = 10;
    if (!o->disk_reserve)
        o->disk_reserve = 512u << 20;
    if (!o->log_quota)
        o->log_quota = 256u << 20;
    if (!o->artifact_quota)
        o->artifact_quota = (uint64_t)16 << 30;
    if (!(o->max_job_time_s >= 0))
        o->max_job_time_s = 0;
    pthread_mutex_init(&srv->lock, NULL);
    pthread_rwlock_init(&srv->auth_lock, NULL);
    pthread_cond_init(&srv->changed, NULL);
    pthread_cond_init(&srv->kick, NULL);
    char host[64];
    px_status st = parse_listen(o->listen, host, sizeof host, &srv->port, err);
    if (st != PX_OK)
        goto fail;
    srv->data_dir = px_strdup(o->data_dir ? o->data_dir : "./plexus-data");
    if (!srv->data_dir) {
        st = px_err_set(err, PX_ENOMEM, "out of memory");
        goto fail;
    }
    if ((st = make_dirs(srv->data_dir, err)) != PX_OK)
        goto fail;
    if ((st = make_tmp_dir(srv, o, err)) != PX_OK)
        goto fail;
    clean_tmp(srv->tmp_dir);
    char db[PATH_MAX];
    snprintf(db, sizeof db, "%s/fleet.db", srv->data_dir);
    if (o->store && !px__store_is_pg(o->store)) {
        st = px_err_set(err, PX_EINVAL,
                        "--store: expected postgres://USER@HOST:PORT/DATABASE (or leave "
                        "--store out for SQLite in DATA/fleet.db)");
        goto fail;
    }
    if ((st = o->store ? px__store_pg_open(o->store, &srv->store, err)
                       : px__store_sqlite_open(db, &srv->store, err)) != PX_OK ||
        (st = px__store_wrap_faults(&srv->store, err)) != PX_OK)
        goto fail;
    if ((st = px__auth_load(srv, err)) != PX_OK)
        goto fail;
    if (!o->tls_cert != !o->tls_key) {
        st = px_err_set(err, PX_EINVAL,
                        "TLS needs both a certificate and its key (--tls-cert and "
                        "--tls-key)");
        goto fail;
    }
    srv->tls = o->tls_cert != NULL;
    raise_fd_limit();
    o->token_file = o->cluster_token = o->api_token = NULL; /* borrowed: not kept */
    o->data_dir = o->store = NULL;
    if ((st = px_fleet_sched_new(&srv->sched, err)) != PX_OK)
        goto fail;
    /* One server on its own store serves at once; a replica on a shared
     * store serves once it holds the scheduler lease (sched_main). */
    if (!srv->store.ops->lease) {
        if ((st = srv->store.ops->list_nodes(srv->store.self, load_node, srv, err)) != PX_OK)
            goto fail;
        if ((st = px__srv_load(srv, err)) != PX_OK)
            goto fail;
        atomic_store(&srv->active, true);
    }
    if ((st = px__api_start(srv, host, srv->port, err)) != PX_OK)
        goto fail;
    o->tls_cert = o->tls_key = NULL;
    snprintf(srv->url, sizeof srv->url, "%s://%s:%u", srv->tls ? "https" : "http", host,
             (unsigned)srv->port);
    if (pthread_create(&srv->sched_thread, NULL, sched_main, srv) != 0) {
        st = px_err_set(err, PX_EINTERNAL, "cannot start the scheduler thread");
        goto fail;
    }
    srv->sched_thread_started = true;
    if (srv->store.ops->version >= 4 && srv->store.ops->wait_jobs) {
        if (pthread_create(&srv->listen_thread, NULL, listen_main, srv) != 0) {
            st = px_err_set(err, PX_EINTERNAL, "cannot start the thread that listens for jobs");
            goto fail;
        }
        srv->listen_thread_started = true;
    }
    if ((st = px__srv_collect_start(srv, err)) != PX_OK)
        goto fail;
    px__serving_start(srv);
    *out = srv;
    return PX_OK;
fail:
    px_fleet_server_stop(srv);
    return st;
}

uint16_t px_fleet_server_port(const px_fleet_server *srv)
{
    return srv->port;
}

const char *px_fleet_server_failed(px_fleet_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    const char *why = srv->failed[0] ? srv->failed : NULL;
    pthread_mutex_unlock(&srv->lock);
    return why;
}

bool px_fleet_server_serving(const px_fleet_server *srv)
{
    return atomic_load(&srv->active);
}

const char *px_fleet_server_url(const px_fleet_server *srv)
{
    return srv->url;
}

void px_fleet_server_stop(px_fleet_server *srv)
{
    if (!srv)
        return;
    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    pthread_cond_broadcast(&srv->kick);
    pthread_cond_broadcast(&srv->changed);
    pthread_mutex_unlock(&srv->lock);
    /* Long polls wake on `changed` and see `stopping`; then the daemon can
     * join its connection threads. */
    px__api_stop(srv);
    px__serving_stop(srv);
    px__srv_stages_free(srv);
    if (srv->sched_thread_started)
        pthread_join(srv->sched_thread, NULL);
    if (srv->listen_thread_started)
        pthread_join(srv->listen_thread, NULL);
    px__srv_collect_stop(srv);
    px__srv_free_jobs(srv);
    px__incidents_free(srv);
    px__srv_deploy_changed(srv);
    json_decref(srv->evictions);
    json_decref(srv->polls.waiting);
    json_decref(srv->polls.found);
    json_decref(srv->deploy_reported);
    px_fleet_sched_free(srv->sched);
    if (srv->store.ops)
        srv->store.ops->close(srv->store.self);
    free(srv->last_seen_ns);
    free(srv->hb_written_ns);
    px__auth_free(srv);
    free(srv->tmp_dir);
    free(srv->deferred);
    free(srv->data_dir);
    pthread_rwlock_destroy(&srv->auth_lock);
    pthread_cond_destroy(&srv->kick);
    pthread_cond_destroy(&srv->changed);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
}
