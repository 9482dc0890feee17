/* The server's life cycle: options, data folder, tokens, the store, the
 * scheduler thread (placement passes and lease checks) and start/stop. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <ctype.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 100000000ull /* lease checks and backoff timers: every 100 ms */

/* ---- tokens ---- */

static px_status add_token(px_fleet_server *srv, const char *kind, const char *name,
                           const char *token, const char *where, px_err *err)
{
    size_t n = strlen(token);
    if (n < 16 || n > 256)
        return px_err_set(err, PX_EINVAL, "%s: a token must have 16 to 256 characters", where);
    for (size_t i = 0; i < n; i++)
        if (!isgraph((unsigned char)token[i]))
            return px_err_set(err, PX_EINVAL, "%s: a token must be printable ASCII without spaces",
                              where);
    px__token *t = realloc(srv->tokens, (srv->n_tokens + 1) * sizeof *t);
    if (!t)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    srv->tokens = t;
    px__token *nt = &srv->tokens[srv->n_tokens++];
    px_sha256(token, n, &nt->hash);
    nt->agent = strcmp(kind, "agent") == 0;
    char hex[65];
    px_digest_hex(&nt->hash, hex);
    return srv->store.ops->put_token(srv->store.self, kind, name, hex, err);
}

static px_status read_token_file(px_fleet_server *srv, const char *path, px_err *err)
{
    char *text;
    size_t len;
    px_status st = px_read_file(path, 1 << 20, &text, &len, err);
    if (st != PX_OK)
        return st;
    int line = 0;
    char *save = text;
    for (char *p = text; st == PX_OK && p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        line++;
        char *hash = strchr(p, '#');
        if (hash)
            *hash = '\0';
        char kind[16] = "", token[300] = "", name[80] = "";
        int got = sscanf(p, "%15s %299s %79s", kind, token, name);
        char where[PATH_MAX + 32];
        snprintf(where, sizeof where, "%s:%d", path, line);
        if (got >= 1 && got < 2)
            st = px_err_set(err, PX_EINVAL, "%s: expected \"agent TOKEN\" or \"user TOKEN [name]\"",
                            where);
        else if (got >= 2 && strcmp(kind, "agent") != 0 && strcmp(kind, "user") != 0)
            st = px_err_set(err, PX_EINVAL, "%s: unknown token kind \"%s\"; use agent or user",
                            where, kind);
        else if (got >= 2)
            st = add_token(srv, kind, got == 3 ? name : kind, token, where, err);
        p = nl ? nl + 1 : NULL;
    }
    free(save);
    return st;
}

static px_status random_token(char out[49], px_err *err)
{
    unsigned char b[24];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
        if (fd >= 0)
            close(fd);
        return px_err_set(err, PX_EIO, "/dev/urandom: cannot read random bytes for a token");
    }
    close(fd);
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return PX_OK;
}

static px_status setup_tokens(px_fleet_server *srv, px_err *err)
{
    const px_fleet_server_options *o = &srv->opt;
    px_status st = srv->store.ops->clear_tokens(srv->store.self, err);
    if (st == PX_OK && o->cluster_token)
        st = add_token(srv, "agent", "agent", o->cluster_token, "cluster token", err);
    if (st == PX_OK && o->api_token)
        st = add_token(srv, "user", "user", o->api_token, "API token", err);
    if (st != PX_OK)
        return st;
    if (o->token_file)
        return read_token_file(srv, o->token_file, err);
    if (o->cluster_token || o->api_token)
        return PX_OK;
    char *path = px_asprintf("%s/tokens", srv->data_dir);
    if (!path)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    if (access(path, F_OK) != 0) {
        char a[49], u[49];
        if ((st = random_token(a, err)) != PX_OK || (st = random_token(u, err)) != PX_OK) {
            free(path);
            return st;
        }
        char *text =
            px_asprintf("# plexus tokens: keep this file private\nagent %s\nuser %s\n", a, u);
        int fd = text ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
        size_t n = text ? strlen(text) : 0;
        bool ok = fd >= 0 && write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
        if (fd >= 0)
            close(fd);
        free(text);
        if (!ok) {
            st = px_err_set(err, PX_EIO, "%s: cannot write the generated tokens: %s", path,
                            strerror(errno));
            free(path);
            return st;
        }
        px_log_info("fleet: generated an agent and a user token in %s", path);
    }
    st = read_token_file(srv, path, err);
    free(path);
    return st;
}

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

/* ---- the scheduler thread ---- */

static void *sched_main(void *arg)
{
    px_fleet_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        px__srv_check_leases(srv);
        bool timers = false;
        double now = (double)px_now_ns();
        for (px__job *j = srv->jobs; j && !timers; j = j->next)
            timers = j->state == PX__JOB_QUEUED && j->not_before_ns > 0 && j->not_before_ns <= now;
        if (srv->dirty || timers)
            px__srv_schedule_pass(srv);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + TICK_NS;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        if (!srv->dirty)
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

static px_status make_dirs(const char *data, px_err *err)
{
    const char *subs[] = {"", "/artifacts", "/blobs"};
    for (size_t i = 0; i < PX_ARRAY_LEN(subs); i++) {
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s%s", data, subs[i]) >= sizeof path)
            return px_err_set(err, PX_EINVAL, "--data: path too long");
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return px_err_set(err, PX_EIO, "%s: cannot create the folder: %s", path,
                              strerror(errno));
    }
    return PX_OK;
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
        o->max_upload = 64u << 20;
    if (!o->max_connections)
        o->max_connections = 512;
    pthread_mutex_init(&srv->lock, NULL);
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
    char db[PATH_MAX];
    snprintf(db, sizeof db, "%s/fleet.db", srv->data_dir);
    if ((st = px__store_sqlite_open(db, &srv->store, err)) != PX_OK)
        goto fail;
    if ((st = setup_tokens(srv, err)) != PX_OK)
        goto fail;
    o->token_file = o->cluster_token = o->api_token = NULL; /* borrowed: not kept */
    o->data_dir = NULL;
    if ((st = px_fleet_sched_new(&srv->sched, err)) != PX_OK)
        goto fail;
    if ((st = srv->store.ops->list_nodes(srv->store.self, load_node, srv, err)) != PX_OK)
        goto fail;
    if ((st = px__srv_load(srv, err)) != PX_OK)
        goto fail;
    if ((st = px__api_start(srv, host, srv->port, err)) != PX_OK)
        goto fail;
    snprintf(srv->url, sizeof srv->url, "http://%s:%u", host, (unsigned)srv->port);
    if (pthread_create(&srv->sched_thread, NULL, sched_main, srv) != 0) {
        st = px_err_set(err, PX_EINTERNAL, "cannot start the scheduler thread");
        goto fail;
    }
    srv->sched_thread_started = true;
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
    if (srv->sched_thread_started)
        pthread_join(srv->sched_thread, NULL);
    px__srv_free_jobs(srv);
    px_fleet_sched_free(srv->sched);
    if (srv->store.ops)
        srv->store.ops->close(srv->store.self);
    free(srv->last_seen_ns);
    free(srv->hb_written_ns);
    free(srv->tokens);
    free(srv->data_dir);
    pthread_cond_destroy(&srv->kick);
    pthread_cond_destroy(&srv->changed);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
}
