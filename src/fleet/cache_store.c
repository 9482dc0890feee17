/*
 * The agent's content-addressed cache of models and artifacts.  Each
 * object is a file named by the SHA-256 of its content under objects/; an
 * index (index.json) remembers sizes, names and the order of last use.
 * Adding an object past the size budget evicts the least recently used
 * objects that no running job holds.  The index is rebuilt from the
 * objects folder when it is missing or damaged, so a crash loses at most
 * the order of use, never an object or the budget.
 */
#include "base/common.h"

#include "plexus/fleet.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_MAX_BYTES   (16u << 20)
#define CACHE_MAX_ENTRIES 100000u

typedef struct cache_entry {
    char digest[65];
    char *name;
    uint64_t size;
    uint64_t seq; /* order of last use; larger is more recent */
    int pins;
} cache_entry;

struct px_fleet_cache {
    char *dir;
    char *objects;
    uint64_t budget;
    uint64_t used;
    uint64_t seq;
    cache_entry *entries;
    size_t n, cap;
    json_t *evictions; /* recent evictions not yet taken, oldest first */
    pthread_mutex_t mu;
};

/* Evictions remembered until taken (px_fleet_cache_evictions_take). */
#define EVICTIONS_MAX 64

static bool is_hex_digest(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static cache_entry *find(px_fleet_cache *c, const char *digest)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->entries[i].digest, digest))
            return &c->entries[i];
    return NULL;
}

static px_status add_entry(px_fleet_cache *c, const char *digest, const char *name, uint64_t size,
                           uint64_t seq, px_err *err)
{
    if (c->n == c->cap) {
        if (c->cap >= CACHE_MAX_ENTRIES)
            return px_err_set(err, PX_ELIMIT, "%s: more than %u cached objects", c->dir,
                              CACHE_MAX_ENTRIES);
        size_t ncap = c->cap ? c->cap * 2 : 16;
        cache_entry *ne = realloc(c->entries, ncap * sizeof *ne);
        if (!ne)
            return px_err_set(err, PX_ENOMEM, "out of memory growing the cache index");
        c->entries = ne;
        c->cap = ncap;
    }
    cache_entry *e = &c->entries[c->n];
    memset(e, 0, sizeof *e);
    memcpy(e->digest, digest, 65);
    e->name = px_strdup(name ? name : "");
    if (!e->name)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    e->size = size;
    e->seq = seq;
    c->n++;
    c->used += size;
    if (seq > c->seq)
        c->seq = seq;
    return PX_OK;
}

static void remove_at(px_fleet_cache *c, size_t i)
{
    c->used -= c->entries[i].size;
    free(c->entries[i].name);
    c->entries[i] = c->entries[c->n - 1];
    c->n--;
}

static char *object_path(const px_fleet_cache *c, const char *digest)
{
    return px_asprintf("%s/%s", c->objects, digest);
}

static px_status save_index(px_fleet_cache *c, px_err *err)
{
    json_t *doc = json_object(), *arr = json_array();
    if (!doc || !arr) {
        json_decref(doc);
        json_decref(arr);
        return px_err_set(err, PX_ENOMEM, "out of memory writing the cache index");
    }
    json_object_set_new(doc, "schema", json_string("plexus.cache/1"));
    json_object_set_new(doc, "entries", arr);
    for (size_t i = 0; i < c->n; i++) {
        const cache_entry *e = &c->entries[i];
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:I}", "digest", e->digest, "name",
                                             e->name, "size", (json_int_t)e->size, "seq",
                                             (json_int_t)e->seq));
    }
    char *text = px_json_dump_line(doc);
    json_decref(doc);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "out of memory writing the cache index");
    char *path = px_asprintf("%s/index.json", c->dir);
    px_status st = path ? px_write_file(path, text, strlen(text), err)
                        : px_err_set(err, PX_ENOMEM, "out of memory");
    free(path);
    free(text);
    return st;
}

/* Reads what the index says, keeping only entries whose object is present
 * with the recorded size; a damaged index is ignored (with a warning). */
static void load_index(px_fleet_cache *c)
{
    char *path = px_asprintf("%s/index.json", c->dir);
    json_t *doc = NULL;
    px_err err;
    px_json_limits lim = {.max_bytes = INDEX_MAX_BYTES, .max_elements = CACHE_MAX_ENTRIES};
    if (!path || access(path, F_OK) != 0 || px_json_load_file(path, &lim, &doc, &err) != PX_OK) {
        if (path && access(path, F_OK) == 0)
            px_log_warn("%s: cache index is unreadable (%s); rebuilding it", path, err.msg);
        free(path);
        return;
    }
    free(path);
    json_t *arr = json_object_get(doc, "entries");
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it)
    {
        const char *digest = json_string_value(json_object_get(it, "digest"));
        const char *name = json_string_value(json_object_get(it, "name"));
        json_int_t seq = json_integer_value(json_object_get(it, "seq"));
        if (!is_hex_digest(digest) || find(c, digest) || seq < 0)
            continue;
        char *op = object_path(c, digest);
        struct stat sb;
        if (op && stat(op, &sb) == 0 && S_ISREG(sb.st_mode) &&
            json_integer_value(json_object_get(it, "size")) == (json_int_t)sb.st_size)
            add_entry(c, digest, name, (uint64_t)sb.st_size, (uint64_t)seq, NULL);
        free(op);
    }
    json_decref(doc);
}

/* Adopts objects the index does not know (a crash between rename and index
 * write) and removes temporary files and foreign names. */
static void scan_objects(px_fleet_cache *c)
{
    DIR *d = opendir(c->objects);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *op = object_path(c, de->d_name);
        if (!op)
            continue;
        struct stat sb;
        if (!is_hex_digest(de->d_name)) {
            if (lstat(op, &sb) == 0 && S_ISREG(sb.st_mode))
                unlink(op);
        } else if (!find(c, de->d_name) && lstat(op, &sb) == 0 && S_ISREG(sb.st_mode)) {
            add_entry(c, de->d_name, "", (uint64_t)sb.st_size, 0, NULL);
        }
        free(op);
    }
    closedir(d);
}

static px_status mkdir_p(const char *path, px_err *err)
{
    char *p = px_strdup(path);
    if (!p)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", p, strerror(errno));
            free(p);
            return st;
        }
        *s = '/';
    }
    px_status st = PX_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        st = px_err_set(err, PX_EIO, "%s: cannot create: %s", p, strerror(errno));
    /* Models are read by jobs, which may run as another user: the cache
     * folder is open to them whatever the umask. */
    struct stat sb;
    if (st == PX_OK && stat(p, &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & 0755) != 0755)
        chmod(p, 0755);
    free(p);
    return st;
}

/* Evicts least recently used unpinned objects until `need` more bytes fit.
 * Called with the lock held. */
static px_status make_room(px_fleet_cache *c, uint64_t need, const char *keep, const char *incoming,
                           px_err *err)
{
    while (c->used + need > c->budget) {
        size_t victim = SIZE_MAX;
        for (size_t i = 0; i < c->n; i++) {
            const cache_entry *e = &c->entries[i];
            if (e->pins > 0 || (keep && !strcmp(e->digest, keep)))
                continue;
            if (victim == SIZE_MAX || e->seq < c->entries[victim].seq)
                victim = i;
        }
        if (victim == SIZE_MAX)
            return px_err_set(err, PX_ELIMIT,
                              "%s: %llu bytes do not fit the cache budget of %llu bytes (%llu "
                              "held by running jobs); raise --cache-budget",
                              c->dir, (unsigned long long)need, (unsigned long long)c->budget,
                              (unsigned long long)c->used);
        char *op = object_path(c, c->entries[victim].digest);
        if (op)
            unlink(op);
        free(op);
        px_log_info("cache: evicted %s (%llu bytes)", c->entries[victim].digest,
                    (unsigned long long)c->entries[victim].size);
        if (!c->evictions)
            c->evictions = json_array();
        if (json_array_size(c->evictions) >= EVICTIONS_MAX)
            json_array_remove(c->evictions, 0);
        json_array_append_new(c->evictions,
                              json_pack("{s:s, s:s?, s:I, s:s?, s:I, s:I, s:I}", "digest",
                                        c->entries[victim].digest, "name", c->entries[victim].name,
                                        "size", (json_int_t)c->entries[victim].size, "for",
                                        incoming, "incoming_size", (json_int_t)need, "budget",
                                        (json_int_t)c->budget, "at", (json_int_t)px_wall_time()));
        remove_at(c, victim);
    }
    return PX_OK;
}

px_status px_fleet_cache_open(const char *dir, uint64_t budget_bytes, px_fleet_cache **out,
                              px_err *err)
{
    *out = NULL;
    if (!dir || !dir[0])
        return px_err_set(err, PX_EINVAL, "cache folder is empty: give --cache DIR");
    if (budget_bytes == 0)
        return px_err_set(err, PX_EINVAL, "cache budget is zero: give --cache-budget, e.g. 10GiB");
    px_fleet_cache *c = calloc(1, sizeof *c);
    if (!c)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    c->budget = budget_bytes;
    c->dir = px_strdup(dir);
    c->objects = px_asprintf("%s/objects", dir);
    px_status st;
    if (!c->dir || !c->objects) {
        st = px_err_set(err, PX_ENOMEM, "out of memory");
        goto fail;
    }
    if ((st = mkdir_p(c->objects, err)) != PX_OK)
        goto fail;
    load_index(c);
    scan_objects(c);
    /* A smaller budget than last time applies at once. */
    if ((st = make_room(c, 0, NULL, NULL, err)) != PX_OK)
        goto fail;
    if ((st = save_index(c, err)) != PX_OK)
        goto fail;
    *out = c;
    return PX_OK;
fail:
    px_fleet_cache_free(c);
    return st;
}

void px_fleet_cache_free(px_fleet_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->entries[i].name);
    free(c->entries);
    free(c->dir);
    free(c->objects);
    json_decref(c->evictions);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

json_t *px_fleet_cache_evictions_take(px_fleet_cache *c)
{
    pthread_mutex_lock(&c->mu);
    json_t *e = c->evictions ? c->evictions : json_array();
    c->evictions = NULL;
    pthread_mutex_unlock(&c->mu);
    return e;
}

/* Copies src to a temporary file in the objects folder while hashing. */
static px_status copy_hashing(const char *src, const char *tmp, uint64_t *size, char hex[65],
                              px_err *err)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s: cannot open: %s", src,
                          strerror(errno));
    int outfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (outfd >= 0)
        fchmod(outfd, 0644); /* readable by jobs whatever the umask */
    if (outfd < 0) {
        px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        close(in);
        return st;
    }
    px_sha256_ctx *h;
    px_status st = px_sha256_new(&h, err);
    if (st != PX_OK)
        goto done;
    char buf[65536];
    *size = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = px_err_set(err, PX_EIO, "%s: cannot read: %s", src, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        px_sha256_update(h, buf, (size_t)r);
        *size += (uint64_t)r;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(outfd, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                st = px_err_set(err, PX_EIO, "%s: cannot write: %s", tmp, strerror(errno));
                break;
            }
            off += w;
        }
        if (st != PX_OK)
            break;
    }
    px_digest d;
    px_sha256_final(h, &d);
    px_digest_hex(&d, hex);
    if (st == PX_OK && fsync(outfd) != 0)
        st = px_err_set(err, PX_EIO, "%s: cannot sync: %s", tmp, strerror(errno));
done:
    close(in);
    close(outfd);
    return st;
}

px_status px_fleet_cache_put_file(px_fleet_cache *c, const char *src_path, const char *name,
                                  const char *expect_digest, char digest_out[65], px_err *err)
{
    if (expect_digest && !is_hex_digest(expect_digest))
        return px_err_set(err, PX_EINVAL,
                          "\"%s\" is not a SHA-256 digest (64 lowercase hex digits)",
                          expect_digest);
    static unsigned long counter;
    pthread_mutex_lock(&c->mu);
    unsigned long id = ++counter;
    pthread_mutex_unlock(&c->mu);
    char *tmp = px_asprintf("%s/.tmp-%ld-%lu", c->objects, (long)getpid(), id);
    if (!tmp)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    char hex[65];
    uint64_t size = 0;
    px_status st = copy_hashing(src_path, tmp, &size, hex, err);
    if (st != PX_OK)
        goto fail_tmp;
    if (expect_digest && strcmp(hex, expect_digest)) {
        st = px_err_set(err, PX_EVALIDATE,
                        "%s: content has digest %s, not the expected %s; the transfer was "
                        "damaged or the file changed",
                        src_path, hex, expect_digest);
        goto fail_tmp;
    }
    pthread_mutex_lock(&c->mu);
    cache_entry *e = find(c, hex);
    if (e) {
        e->seq = ++c->seq;
        unlink(tmp);
    } else {
        if (size > c->budget) {
            st = px_err_set(err, PX_ELIMIT,
                            "%s: %llu bytes are more than the whole cache budget of %llu "
                            "bytes; raise --cache-budget",
                            src_path, (unsigned long long)size, (unsigned long long)c->budget);
            goto fail_locked;
        }
        if ((st = make_room(c, size, NULL, hex, err)) != PX_OK)
            goto fail_locked;
        char *op = object_path(c, hex);
        if (!op || rename(tmp, op) != 0) {
            st =
                px_err_set(err, PX_EIO, "%s: cannot move into the cache: %s", tmp, strerror(errno));
            free(op);
            goto fail_locked;
        }
        free(op);
        if ((st = add_entry(c, hex, name, size, ++c->seq, err)) != PX_OK)
            goto fail_locked;
    }
    st = save_index(c, err);
    pthread_mutex_unlock(&c->mu);
    free(tmp);
    if (digest_out)
        memcpy(digest_out, hex, 65);
    return st;

fail_locked:
    pthread_mutex_unlock(&c->mu);
fail_tmp:
    unlink(tmp);
    free(tmp);
    return st;
}

px_status px_fleet_cache_acquire(px_fleet_cache *c, const char *digest, char **path, px_err *err)
{
    *path = NULL;
    if (!is_hex_digest(digest))
        return px_err_set(err, PX_EINVAL, "\"%s\" is not a SHA-256 digest", digest ? digest : "");
    pthread_mutex_lock(&c->mu);
    cache_entry *e = find(c, digest);
    px_status st = PX_OK;
    if (!e) {
        st = px_err_set(err, PX_ENOTFOUND, "%s is not in the cache at %s", digest, c->dir);
    } else if (!(*path = object_path(c, digest))) {
        st = px_err_set(err, PX_ENOMEM, "out of memory");
    } else {
        e->pins++;
        e->seq = ++c->seq;
        save_index(c, NULL);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

void px_fleet_cache_release(px_fleet_cache *c, const char *digest)
{
    pthread_mutex_lock(&c->mu);
    cache_entry *e = digest ? find(c, digest) : NULL;
    if (e && e->pins > 0)
        e->pins--;
    pthread_mutex_unlock(&c->mu);
}

bool px_fleet_cache_contains(px_fleet_cache *c, const char *digest)
{
    pthread_mutex_lock(&c->mu);
    bool r = digest && find(c, digest) != NULL;
    pthread_mutex_unlock(&c->mu);
    return r;
}

json_t *px_fleet_cache_list(px_fleet_cache *c)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        const cache_entry *e = &c->entries[i];
        json_t *o = json_pack("{s:s, s:s, s:I}", "digest", e->digest, "name", e->name, "size",
                              (json_int_t)e->size);
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            arr = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return arr;
}

uint64_t px_fleet_cache_used(px_fleet_cache *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t u = c->used;
    pthread_mutex_unlock(&c->mu);
    return u;
}

const char *px_fleet_cache_dir(const px_fleet_cache *c)
{
    return c->dir;
}
