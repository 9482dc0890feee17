/*
 * One assignment, from start to report, in its own thread: the job's
 * folder (owned by the job user), its cgroup, its model from the cache,
 * its command (or Python function, or launcher), its output streamed to
 * the server in order (within the job's log quota), a service's health
 * checks, its time limit, its artifacts (streamed from disk) and its
 * exit.  Every report names the attempt; a 409 ("stale attempt") or a 403
 * (not this node's work) means the server gave the work to someone else,
 * so the process is stopped and nothing more is reported.  So does the
 * fencing deadline: past 3/4 of a lease without a renewal the job stops,
 * before the server can give it to another node.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_FLUSH_BYTES (64u << 10)
#define LOG_FLUSH_NS    (100u * 1000000u)
#define LOG_KEEP_MAX    (4u << 20) /* output kept while the server is unreachable */
#define RESULT_MAX      (16u << 20)

typedef struct job_run {
    px__agent_job *j;
    px__agent *a;
    px_fleet_client *c;
    unsigned gen;    /* credential generation c holds */
    char *cgroup;    /* the job's cgroup, or NULL */
    bool log_closed; /* the server's log quota is reached: output is dropped */
    bool fenced;     /* stopped because the lease may have lapsed */
    double time_limit_s;
    const json_t *spec;
    char *dir;
    char *model_digest; /* held in the cache while the job runs */
    px_strbuf out[3];   /* pending stdout [1], stderr [2] */
    uint64_t first_pending_ns[3];
    size_t dropped[3];
    px_strbuf result;
    bool stale; /* the server refused a report as stale: stop, report nothing */
    char error[1024];
} job_run;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool stopping(const job_run *r)
{
    return atomic_load(&r->j->stop_requested) || atomic_load(&r->a->stopping);
}

/* Whether a refusal means the work is no longer this node's. */
static bool gone(long code)
{
    return code == 409 || code == 404 || code == 403;
}

/* A report the server must get: retried while the server is unreachable
 * (a restart loses nothing), given up on a refusal. */
static px_status report(job_run *r, const char *path, const json_t *body, px_err *err)
{
    int delay = 100;
    for (;;) {
        long code = 0;
        px__agent_sync(r->a, r->c, &r->gen);
        px_status st = px_fleet_client_call(r->c, "POST", path, body, &code, NULL, err);
        if (st == PX_OK)
            return PX_OK;
        if (gone(code)) {
            r->stale = true;
            return st;
        }
        if (code >= 400 && code < 500)
            return st;
        if (atomic_load(&r->a->stopping))
            return st;
        px_log_info("agent: %s: %s; retrying", path, err ? err->msg : "");
        sleep_ms(delay);
        delay = PX_MIN(delay * 2, 2000);
    }
}

static void flush_stream(job_run *r, int s)
{
    px_strbuf *b = &r->out[s];
    if (r->dropped[s]) {
        char note[160];
        snprintf(note, sizeof note,
                 "\n[plexus: %zu bytes of output were dropped while the server was "
                 "unreachable]\n",
                 r->dropped[s]);
        px_strbuf_adds(b, note);
        r->dropped[s] = 0;
    }
    if (r->log_closed) {
        b->len = 0; /* past the job's log quota: the server keeps no more */
        return;
    }
    if (!b->len || r->stale)
        return;
    char *path = px_asprintf("/v1/agent/jobs/%s/logs?attempt=%d&rank=%d&stream=%s", r->j->job,
                             r->j->attempt, r->j->rank, s == 1 ? "stdout" : "stderr");
    if (!path)
        return;
    /* Chunks go at most 1 MiB at a time (the server's limit). */
    size_t off = 0;
    while (off < b->len) {
        size_t n = PX_MIN(b->len - off, (size_t)1 << 20);
        long code = 0;
        px_err err;
        json_t *reply = NULL;
        px__agent_sync(r->a, r->c, &r->gen);
        px_status st =
            px_fleet_client_send(r->c, "POST", path, b->buf + off, n, &code, &reply, &err);
        bool truncated = json_is_true(json_object_get(reply, "truncated"));
        json_decref(reply);
        if (st != PX_OK) {
            if (gone(code))
                r->stale = true;
            else
                px_log_info("agent: job %s: cannot send output: %s", r->j->job, err.msg);
            break;
        }
        off += n;
        if (truncated) {
            r->log_closed = true;
            off = b->len;
            break;
        }
    }
    free(path);
    /* Keep what did not go out, within a bound. */
    if (off > 0) {
        memmove(b->buf, b->buf + off, b->len - off);
        b->len -= off;
        b->buf[b->len] = '\0';
    }
    if (b->len > LOG_KEEP_MAX) {
        size_t cut = b->len - LOG_KEEP_MAX;
        memmove(b->buf, b->buf + cut, LOG_KEEP_MAX);
        b->len = LOG_KEEP_MAX;
        b->buf[b->len] = '\0';
        r->dropped[s] += cut;
    }
    r->first_pending_ns[s] = b->len ? px_now_ns() : 0;
}

static void flush_due(job_run *r, bool force)
{
    uint64_t now = px_now_ns();
    for (int s = 1; s <= 2; s++)
        if (r->out[s].len && (force || r->out[s].len >= LOG_FLUSH_BYTES ||
                              now - r->first_pending_ns[s] >= LOG_FLUSH_NS))
            flush_stream(r, s);
}

static void on_output(px__proc_stream s, const char *data, size_t len, void *ud)
{
    job_run *r = ud;
    if (s == PX__PROC_RESULT) {
        if (r->result.len + len <= RESULT_MAX)
            px_strbuf_add(&r->result, data, len);
        return;
    }
    if (!r->out[s].len)
        r->first_pending_ns[s] = px_now_ns();
    px_strbuf_add(&r->out[s], data, len);
}

/* Adds a line of the agent's own to the job's stderr. */
static void note(job_run *r, const char *fmt, ...) PX_PRINTF(2, 3);
static void note(job_run *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_strbuf_adds(&r->out[2], "[plexus agent] ");
    px_strbuf_vaddf(&r->out[2], fmt, ap);
    px_strbuf_addch(&r->out[2], '\n');
    va_end(ap);
    if (!r->first_pending_ns[2])
        r->first_pending_ns[2] = px_now_ns();
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Fetches the job's model into the cache (when not resident) and holds
 * it; exports its path to the job. */
static px_status fetch_model(job_run *r, const json_t *model, px_strbuf *env_model, px_err *err)
{
    const char *digest = json_string_value(json_object_get(model, "digest"));
    const char *url = json_string_value(json_object_get(model, "url"));
    if (!digest)
        return px_err_set(err, PX_EINVAL, "assignment: /model/digest is missing");
    if (!r->a->cache)
        return px_err_set(err, PX_EUNSUPPORTED, "the job needs a model but the agent has no cache");
    if (!px_fleet_cache_contains(r->a->cache, digest)) {
        px__agent_sync(r->a, r->c, &r->gen);
        char *path = url ? px_strdup(url) : px_asprintf("/v1/blobs/%s", digest);
        char *tmp = px_asprintf("%s/.download-%s-%s-%d-%d", px_fleet_cache_dir(r->a->cache), digest,
                                r->j->job, r->j->attempt, r->j->rank);
        px_status st = path && tmp ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
        if (st == PX_OK && (st = px_fleet_client_download(r->c, path, tmp, NULL, err)) == PX_OK) {
            const json_t *spec_model = json_object_get(r->spec, "model");
            st = px_fleet_cache_put_file(r->a->cache, tmp,
                                         json_string_value(json_object_get(spec_model, "name")),
                                         digest, NULL, err);
        }
        if (tmp)
            unlink(tmp);
        free(tmp);
        free(path);
        if (st != PX_OK)
            return px_err_prefix(err, st, "fetching model %.12s: ", digest);
        note(r, "model %.12s fetched into the cache", digest);
    } else {
        note(r, "model %.12s resident in the cache", digest);
    }
    char *path;
    px_status st = px_fleet_cache_acquire(r->a->cache, digest, &path, err);
    if (st != PX_OK)
        return st;
    r->model_digest = px_strdup(digest);
    px_strbuf_addf(env_model, "PLEXUS_MODEL=%s", path);
    free(path);
    return PX_OK;
}

/* A file name for the Python source: its base name when harmless. */
static char *python_file_name(const char *given)
{
    const char *base = given ? strrchr(given, '/') : NULL;
    base = base ? base + 1 : given;
    bool ok =
        base && base[0] && base[0] != '.' && strlen(base) < 100 && px_str_ends_with(base, ".py");
    for (const char *c = base; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
             *c == '_' || *c == '-' || *c == '.';
    return px_strdup(ok ? base : "job.py");
}

typedef struct argv_list {
    char **v;
    size_t n, cap;
} argv_list;

static bool argv_push(argv_list *l, const char *s)
{
    if (l->n + 2 > l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 16;
        char **nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv)
            return false;
        l->v = nv;
        l->cap = ncap;
    }
    if (!(l->v[l->n] = px_strdup(s)))
        return false;
    l->v[++l->n] = NULL;
    return true;
}

static void argv_release(argv_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static bool env_push(argv_list *l, const char *k, const char *v)
{
    char *kv = px_asprintf("%s=%s", k, v);
    bool ok = kv && argv_push(l, kv);
    free(kv);
    return ok;
}

/* The vendor of one of the node's devices by local id ("" if unknown). */
static const char *device_vendor(px__agent *a, const char *id)
{
    const json_t *devs = json_object_get(json_object_get(a->registration, "node"), "devices");
    size_t i;
    json_t *d;
    json_array_foreach(devs, i, d)
    {
        const char *did = json_string_value(json_object_get(d, "id"));
        const char *vendor = json_string_value(json_object_get(d, "vendor"));
        if (id && did && vendor && !strcmp(id, did))
            return vendor;
    }
    return "";
}

/* Builds argv, the environment and the visible devices of the job
 * (visible[0..2]: NVIDIA, AMD, Intel ordinals). */
static px_status prepare(job_run *r, argv_list *argv, argv_list *env, char **shell,
                         char *visible[3], px_err *err)
{
    const json_t *as = r->j->assignment;
    const json_t *spec = r->spec;
    px_status st = PX_OK;
    char num[32];
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(spec, "env"), k, v)
    {
        if (json_is_string(v) && !env_push(env, k, json_string_value(v)))
            goto oom;
    }
    json_object_foreach((json_t *)json_object_get(as, "env"), k, v)
    {
        if (json_is_string(v) && !env_push(env, k, json_string_value(v)))
            goto oom;
    }
    if (!env_push(env, "PLEXUS_JOB_ID", r->j->job) || !env_push(env, "PLEXUS_JOB_DIR", r->dir))
        goto oom;
    /* Under a job user, the agent's HOME and TMPDIR are not the job's to
     * use: both are the job's own folder. */
    if (r->a->set_user && (!env_push(env, "HOME", r->dir) || !env_push(env, "TMPDIR", r->dir)))
        goto oom;
    snprintf(num, sizeof num, "%d", r->j->attempt);
    if (!env_push(env, "PLEXUS_ATTEMPT", num))
        goto oom;
    snprintf(num, sizeof num, "%d", r->j->rank);
    if (!env_push(env, "PLEXUS_RANK", num))
        goto oom;
    const json_t *service = json_object_get(spec, "service");
    if (service && json_integer_value(json_object_get(service, "port")) > 0) {
        snprintf(num, sizeof num, "%lld",
                 (long long)json_integer_value(json_object_get(service, "port")));
        if (!env_push(env, "PORT", num))
            goto oom;
    }
    const json_t *model = json_object_get(as, "model");
    if (!model || json_is_null(model))
        model = json_object_get(spec, "model");
    if (model && json_is_object(model)) {
        px_strbuf kv = PX_STRBUF_INIT;
        if ((st = fetch_model(r, model, &kv, err)) != PX_OK) {
            px_strbuf_release(&kv);
            return st;
        }
        bool ok = argv_push(env, kv.buf);
        px_strbuf_release(&kv);
        if (!ok || !env_push(env, "PLEXUS_MODEL_DIGEST", r->model_digest))
            goto oom;
    }

    /* Devices: ordinals among the node's devices of the same vendor, one
     * list per vendor; every other accelerator stays hidden. */
    px_strbuf vis[3] = {PX_STRBUF_INIT, PX_STRBUF_INIT, PX_STRBUF_INIT};
    size_t i;
    const json_t *ids = json_object_get(as, "devices");
    json_array_foreach(json_object_get(as, "device_indices"), i, v)
    {
        const char *vendor = device_vendor(r->a, json_string_value(json_array_get(ids, i)));
        int which = !strcmp(vendor, "amd") ? 1 : !strcmp(vendor, "intel") ? 2 : 0;
        px_strbuf_addf(&vis[which], "%s%lld", vis[which].len ? "," : "",
                       (long long)json_integer_value(v));
    }
    for (int which = 0; which < 3; which++)
        visible[which] = px_strbuf_detach(&vis[which], NULL);

    const json_t *python = json_object_get(spec, "python");
    const char *launcher = json_string_value(json_object_get(as, "launcher"));
    if (!launcher)
        launcher = json_string_value(json_object_get(spec, "launcher"));
    if (python && json_is_object(python)) {
        const char *source = json_string_value(json_object_get(python, "source"));
        const char *function = json_string_value(json_object_get(python, "function"));
        if (!source || !function)
            return px_err_set(err, PX_EINVAL,
                              "job spec: /python needs \"source\" and \"function\"");
        char *fname = python_file_name(json_string_value(json_object_get(python, "filename")));
        char *script = fname ? px_asprintf("%s/%s", r->dir, fname) : NULL;
        free(fname);
        char *args_path = px_asprintf("%s/.plexus-args.json", r->dir);
        if (!script || !args_path) {
            free(script);
            free(args_path);
            goto oom;
        }
        st = px_write_file(script, source, strlen(source), err);
        const json_t *args = json_object_get(python, "args");
        bool has_args = args != NULL;
        if (st == PX_OK && has_args) {
            char *text = json_dumps(args, JSON_ENCODE_ANY | JSON_COMPACT);
            st = text ? px_write_file(args_path, text, strlen(text), err)
                      : px_err_set(err, PX_ENOMEM, "out of memory");
            free(text);
        }
        /* A python3 under root's home (pyenv) is the agent's, not the
         * job user's: the one the job user reaches on PATH, or an error
         * that says so, rather than "permission denied". */
        char *interp = NULL;
        if (st == PX_OK)
            st = px__agent_job_user_may_run(r->a, r->a->python, "the Python interpreter", &interp,
                                            err);
        const char *pv[8];
        px__python_argv(interp ? interp : r->a->python, script, function,
                        has_args ? args_path : "-", pv);
        for (int n = 0; st == PX_OK && pv[n]; n++)
            if (!argv_push(argv, pv[n]))
                st = px_err_set(err, PX_ENOMEM, "out of memory");
        free(interp);
        free(script);
        free(args_path);
        return st;
    }
    const json_t *command = json_object_get(spec, "command");
    if (!json_is_array(command) || json_array_size(command) == 0)
        return px_err_set(err, PX_EINVAL, "job spec: /command must be a non-empty array");
    if (json_is_true(json_object_get(spec, "shell"))) {
        const char *line = json_string_value(json_array_get(command, 0));
        if (!line || json_array_size(command) != 1)
            return px_err_set(err, PX_EINVAL,
                              "job spec: /command with \"shell\": true must hold one string");
        if (!(*shell = px_strdup(line)))
            goto oom;
        return PX_OK;
    }
    if (launcher && !strcmp(launcher, "torchrun")) {
        /* torchrun runs the command as given (--no-python) with its rank
         * arguments from the server. */
        if (!argv_push(argv, "torchrun"))
            goto oom;
        json_array_foreach(json_object_get(as, "torchrun_args"), i,
                           v) if (json_is_string(v) &&
                                  !argv_push(argv, json_string_value(v))) goto oom;
        if (!argv_push(argv, "--no-python"))
            goto oom;
    } else if (launcher && !strcmp(launcher, "mpi")) {
        px_strbuf hf = PX_STRBUF_INIT;
        json_array_foreach(json_object_get(as, "hosts"), i, v)
            px_strbuf_addf(&hf, "%s slots=1\n", json_string_value(v) ? json_string_value(v) : "");
        char *hpath = px_asprintf("%s/hostfile", r->dir);
        st = hpath ? px_write_file(hpath, hf.buf, hf.len, err) : px_err_set(err, PX_ENOMEM, "oom");
        px_strbuf_release(&hf);
        if (st == PX_OK && !env_push(env, "PLEXUS_MPI_HOSTFILE", hpath))
            st = px_err_set(err, PX_ENOMEM, "out of memory");
        free(hpath);
        if (st != PX_OK)
            return st;
    }
    json_array_foreach(command, i, v)
    {
        if (!json_is_string(v))
            return px_err_set(err, PX_EINVAL, "job spec: /command/%zu must be a string", i);
        if (!argv_push(argv, json_string_value(v)))
            goto oom;
    }
    return PX_OK;
oom:
    return px_err_set(err, PX_ENOMEM, "out of memory preparing the job");
}

int px__agent_open_artifact(int dir_fd, const char *name, size_t name_len, px_err *err)
{
    if (!name || !name[0] || strlen(name) != name_len || name_len > 1024)
        return px_err_set(err, PX_EINVAL, "artifact name is empty, too long or holds NUL"), -1;
    if (name[0] == '/' || strchr(name, '\\'))
        return px_err_set(err, PX_EINVAL,
                          "artifact \"%s\": must be a relative path without backslashes", name),
               -1;
    char *copy = px_strdup(name);
    if (!copy)
        return px_err_set(err, PX_ENOMEM, "out of memory"), -1;
    int cur = dup(dir_fd);
    char *save = NULL;
    char *part = strtok_r(copy, "/", &save);
    int result = -1;
    while (part && cur >= 0) {
        char *next = strtok_r(NULL, "/", &save);
        if (!strcmp(part, "..") || !strcmp(part, ".")) {
            px_err_set(err, PX_EINVAL, "artifact \"%s\": \"%s\" components are not allowed", name,
                       part);
            break;
        }
        if (!next) {
            int fd = openat(cur, part, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            struct stat sb;
            if (fd < 0)
                px_err_set(
                    err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "artifact \"%s\": %s", name,
                    errno == ELOOP ? "is a symbolic link, which is not followed" : strerror(errno));
            else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                px_err_set(err, PX_EINVAL, "artifact \"%s\": not a regular file", name);
                close(fd);
            } else
                result = fd;
            break;
        }
        int sub = openat(cur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "artifact \"%s\": %s: %s",
                       name, part,
                       errno == ELOOP || errno == ENOTDIR ? "not a folder (links are not followed)"
                                                          : strerror(errno));
            break;
        }
        close(cur);
        cur = sub;
        part = next;
    }
    if (cur >= 0)
        close(cur);
    free(copy);
    return result;
}

static void upload_artifacts(job_run *r)
{
    const json_t *list = json_object_get(r->spec, "artifacts");
    if (!json_is_array(list) || !json_array_size(list))
        return;
    int dfd = open(r->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        if (r->stale)
            break;
        const char *name = json_string_value(v);
        px_err err;
        int fd = px__agent_open_artifact(dfd, name, json_string_length(v), &err);
        if (fd < 0) {
            note(r, "artifact not uploaded: %s", err.msg);
            continue;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            close(fd);
            continue;
        }
        char *esc = px_fleet_url_escape(name);
        char *path = esc ? px_asprintf("/v1/agent/jobs/%s/artifacts/%s?attempt=%d&rank=%d",
                                       r->j->job, esc, r->j->attempt, r->j->rank)
                         : NULL;
        int delay = 100;
        for (int tries = 0; path && tries < 50; tries++) {
            long code = 0;
            px__agent_sync(r->a, r->c, &r->gen);
            /* Streamed from the file: an artifact of any size costs no memory. */
            px_status st =
                px__client_send_fd(r->c, "PUT", path, fd, (uint64_t)sb.st_size, &code, NULL, &err);
            if (st == PX_OK)
                break;
            if (code == 409 || code == 404) {
                r->stale = true;
                break;
            }
            if ((code >= 400 && code < 500) || atomic_load(&r->a->stopping)) {
                note(r, "artifact \"%s\" refused: %s", name, err.msg);
                break;
            }
            sleep_ms(delay);
            delay = PX_MIN(delay * 2, 2000);
        }
        close(fd);
        free(path);
        free(esc);
    }
    close(dfd);
}

/* The loop while the process runs: output, stop requests, health. */
static void supervise(job_run *r, px__proc *p, px__proc_exit *ex, bool *stopped_by_us)
{
    const json_t *service = json_object_get(r->spec, "service");
    bool is_service =
        service && json_is_object(service) &&
        (json_object_get(service, "health_path") || json_object_get(service, "health_command"));
    double interval = r->a->cfg->health_interval_s > 0 ? r->a->cfg->health_interval_s : 1.0;
    int max_fail = r->a->cfg->health_failures > 0 ? r->a->cfg->health_failures : 3;
    uint64_t started = px_now_ns(), next_check = started + (uint64_t)(interval * 1e9);
    /* A service that has never answered gets a start-up grace of five
     * check intervals before failures count. */
    uint64_t grace_ns = (uint64_t)(5 * interval * 1e9);
    int failures = 0;
    bool healthy_once = false, open = true;
    px__proc_spec as = {.cwd = r->dir};
    px__agent_as_job_user(r->a, &as);
    uint64_t limit_ns = r->time_limit_s > 0 ? (uint64_t)(r->time_limit_s * 1e9) : 0;
    for (;;) {
        if (open)
            open = px__proc_pump(p, 20, on_output, r);
        else
            sleep_ms(10);
        flush_due(r, false);
        if (px__proc_done(p, ex)) {
            /* Gather what the pipes still hold; a descendant that keeps
             * them open gets half a second, then goes with the group. */
            uint64_t until = px_now_ns() + 500ull * 1000000ull;
            while (open && px_now_ns() < until)
                open = px__proc_pump(p, 50, on_output, r);
            break;
        }
        if (px__agent_fence_passed(r->a)) {
            /* The lease may be lapsing on the server, which then gives this
             * work to another node: it must be gone before that. */
            atomic_store(&r->j->stop_requested, 1);
            atomic_store(&r->a->fenced, 1);
            r->fenced = true;
            px_log_warn("agent: job %s attempt %d: no lease renewal for %.0f%% of the lease; "
                        "stopping it before the server gives it to another node",
                        r->j->job, r->j->attempt, PX__AGENT_FENCE_SHARE * 100);
            *stopped_by_us = true;
            px__proc_stop(p, 0);
            px__proc_done(p, ex);
            break;
        }
        if (stopping(r) || r->stale) {
            *stopped_by_us = true;
            px__proc_stop(p, 2000);
            px__proc_done(p, ex);
            break;
        }
        if (limit_ns && px_now_ns() - started > limit_ns) {
            snprintf(r->error, sizeof r->error, "time limit of %g s exceeded", r->time_limit_s);
            note(r, "%s; stopping the job", r->error);
            px__proc_stop(p, 2000);
            px__proc_done(p, ex);
            break;
        }
        if (is_service && px_now_ns() >= next_check) {
            char why[256];
            if (px__agent_health_check(service, &as, why, sizeof why)) {
                healthy_once = true;
                failures = 0;
            } else if (healthy_once || px_now_ns() - started > grace_ns) {
                failures++;
                if (failures >= max_fail) {
                    snprintf(r->error, sizeof r->error, "health check failed %d times in a row: %s",
                             failures, why);
                    note(r, "%s; stopping the service", r->error);
                    px__proc_stop(p, 2000);
                    px__proc_done(p, ex);
                    break;
                }
            }
            next_check = px_now_ns() + (uint64_t)(interval * 1e9);
        }
    }
}

static void finish_report(job_run *r, const px__proc_exit *ex)
{
    json_t *result = json_null();
    if (r->result.len) {
        json_t *doc = json_loadb(r->result.buf, r->result.len, 0, NULL);
        if (doc && json_is_true(json_object_get(doc, "ok"))) {
            json_decref(result);
            result = json_incref(json_object_get(doc, "result"));
        } else if (doc) {
            const char *e = json_string_value(json_object_get(doc, "error"));
            const char *tb = json_string_value(json_object_get(doc, "traceback"));
            if (!e)
                e = "the Python function failed";
            /* The traceback when it fits, else the exception and the log. */
            if (tb && strlen(tb) < sizeof r->error)
                px_strlcpy(r->error, tb, sizeof r->error);
            else
                snprintf(r->error, sizeof r->error, "%s%s", e,
                         tb ? " (the traceback is in the job's log)" : "");
            note(r, "%s", tb ? tb : e);
        }
        json_decref(doc);
        if (!result)
            result = json_null();
    }
    json_t *body =
        json_pack("{s:s, s:i, s:i, s:i, s:i, s:o, s:o}", "node", r->a->node_id, "attempt",
                  r->j->attempt, "rank", r->j->rank, "exit_code", ex->code, "signal", ex->signal,
                  "result", result, "error", r->error[0] ? json_string(r->error) : json_null());
    flush_due(r, true);
    char *path = px_asprintf("/v1/agent/jobs/%s/finish", r->j->job);
    px_err err;
    if (body && path && report(r, path, body, &err) != PX_OK && !atomic_load(&r->a->stopping))
        px_log_warn("agent: job %s attempt %d: finish not accepted: %s", r->j->job, r->j->attempt,
                    err.msg);
    free(path);
    json_decref(body);
}

static void run(job_run *r)
{
    px__agent *a = r->a;
    px_err err;
    px_status st;
    char *path;
    argv_list argv = {0}, env = {0};
    char *shell = NULL, *visible[3] = {NULL, NULL, NULL};
    json_t *body;
    px__proc *p = NULL;
    px__proc_exit ex = {.code = -1, .signal = 0};

    char key[200];
    snprintf(key, sizeof key, "%s-a%d-r%d", r->j->job, r->j->attempt, r->j->rank);
    r->dir = px_asprintf("%s/jobs/%s", a->work_dir, key);
    if (!r->dir) {
        px_err_set(&err, PX_ENOMEM, "out of memory");
        goto fail_start;
    }
    if (px__agent_job_dir(a, r->dir, &err) != PX_OK ||
        px__agent_job_cgroup(a, key, &r->cgroup, &err) != PX_OK)
        goto fail_start;
    double own = json_number_value(json_object_get(r->j->assignment, "time_limit_s"));
    double cap = a->cfg->max_job_time_s;
    r->time_limit_s = own > 0 && cap > 0 ? PX_MIN(own, cap) : own > 0 ? own : cap;
    if ((st = prepare(r, &argv, &env, &shell, visible, &err)) != PX_OK)
        goto fail_start;
    px__proc_spec spec = {.argv = argv.v,
                          .shell = shell,
                          .env = env.v,
                          .n_env = env.n,
                          .visible_devices = "",
                          .visible_nvidia = visible[0],
                          .visible_amd = visible[1],
                          .visible_intel = visible[2],
                          .cwd = r->dir,
                          .result_fd = json_object_get(r->spec, "python") != NULL,
                          .cgroup = r->cgroup};
    px__agent_as_job_user(a, &spec);
    if ((st = px__proc_spawn(&spec, &p, &err)) != PX_OK)
        goto fail_start;
    body = json_pack("{s:s, s:i, s:i, s:I, s:I}", "node", a->node_id, "attempt", r->j->attempt,
                     "rank", r->j->rank, "pid", (json_int_t)px__proc_pid(p), "listed",
                     (json_int_t)r->j->listed);
    path = px_asprintf("/v1/agent/jobs/%s/start", r->j->job);
    st = body && path ? report(r, path, body, &err) : PX_ENOMEM;
    free(path);
    json_decref(body);
    if (st != PX_OK) {
        px_log_info("agent: job %s attempt %d not started: %s", r->j->job, r->j->attempt, err.msg);
        goto done;
    }
    r->j->started = true;
    bool stopped_by_us = false;
    supervise(r, p, &ex, &stopped_by_us);
    px__proc_free(p);
    p = NULL;
    if (stopped_by_us || r->stale) {
        /* Cancelled, stale or the agent stopping: the server decides what
         * happens to the job; a finish would be refused anyway. */
        flush_due(r, true);
        goto done;
    }
    flush_due(r, true);
    upload_artifacts(r);
    finish_report(r, &ex);
    goto done;

fail_start:
    /* The job could not start: say so in its log and as its error, after
     * a start report so that the server counts the attempt. */
    snprintf(r->error, sizeof r->error, "%s", err.msg);
    note(r, "cannot start the job: %s", err.msg);
    body = json_pack("{s:s, s:i, s:i, s:i, s:I}", "node", a->node_id, "attempt", r->j->attempt,
                     "rank", r->j->rank, "pid", 0, "listed", (json_int_t)r->j->listed);
    path = px_asprintf("/v1/agent/jobs/%s/start", r->j->job);
    st = body && path ? report(r, path, body, &err) : PX_ENOMEM;
    free(path);
    json_decref(body);
    if (st == PX_OK) {
        r->j->started = true;
        ex.code = 127;
        finish_report(r, &ex);
    }
done:
    px__proc_free(p);
    argv_release(&argv);
    argv_release(&env);
    free(shell);
    for (int k = 0; k < 3; k++)
        free(visible[k]);
}

void *px__agent_job_main(void *arg)
{
    px__agent_job *j = arg;
    px__agent *a = j->agent;
    job_run r = {.j = j, .a = a, .spec = json_object_get(j->assignment, "spec")};
    for (int s = 0; s < 3; s++)
        px_strbuf_init(&r.out[s]);
    px_strbuf_init(&r.result);
    px_err err;
    if (px__agent_job_client(a, &r.c, &r.gen, &err) != PX_OK) {
        px_log_error("agent: job %s: %s", j->job, err.msg);
    } else {
        px_fleet_client_set_timeout(r.c, 30000);
        run(&r);
    }
    if (!j->started) {
        /* The server never counted this attempt (it did not know the node
         * yet, or could not be reached): it repeats the assignment, and
         * the work must then be taken again rather than ignored. */
        char key[160];
        px__agent_job_key(j->job, j->attempt, j->rank, key, sizeof key);
        pthread_mutex_lock(&a->mu);
        px__agent_forget(a, key);
        pthread_mutex_unlock(&a->mu);
    }
    if (r.model_digest)
        px_fleet_cache_release(a->cache, r.model_digest);
    if (r.dir)
        nftw(r.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(r.dir);
    free(r.cgroup);
    free(r.model_digest);
    for (int s = 0; s < 3; s++)
        px_strbuf_release(&r.out[s]);
    px_strbuf_release(&r.result);
    px__agent_job_client_done(a, r.c, r.gen);
    atomic_store(&j->done, 1);
    return NULL;
}
