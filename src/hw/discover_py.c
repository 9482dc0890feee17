/* Discovery: the Python frameworks installed for python3 on PATH and for
 * the prefixes the caller names.  Nothing is imported: the interpreter is
 * asked only for sys.path, and each folder's package metadata is read as
 * text.  Pseudo-frameworks (torch.cuda, jax.cuda, cupy.cuda) say that a
 * framework was built for CUDA and an NVIDIA driver is present. */
#include "hw/discover_impl.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    MAX_SITES = 64,       /* folders scanned per interpreter or prefix */
    MAX_SEEN = 256,       /* folders scanned per discovery */
    MAX_ENTRIES = 100000, /* directory entries read per folder */
    MAX_FOUND = 64,       /* distributions kept per interpreter or prefix */
};

/* Distributions discovery reports, by PEP 503 name, and the framework
 * each belongs to.  A NULL framework is read only for the pseudo
 * frameworks.  prefix: the name only starts with dist. */
static const struct {
    const char *dist;
    const char *framework;
    bool prefix;
} tracked[] = {
    {"torch", "torch", false},
    {"jax", "jax", false},
    {"jaxlib", "jaxlib", false},
    {"tensorflow", "tensorflow", false},
    {"tensorflow-cpu", "tensorflow", false},
    {"tensorflow-gpu", "tensorflow", false},
    {"tensorflow-intel", "tensorflow", false},
    {"tf-nightly", "tensorflow", false},
    {"mlx", "mlx", false},
    {"cupy", "cupy", false},
    {"cupy-cuda", "cupy", true},
    {"cupy-rocm", "cupy", true},
    {"onnxruntime", "onnxruntime", false},
    {"onnxruntime-gpu", "onnxruntime", false},
    {"onnxruntime-directml", "onnxruntime", false},
    {"onnxruntime-openvino", "onnxruntime", false},
    {"tensorrt", "tensorrt", false},
    {"tensorrt-cu11", "tensorrt", false},
    {"tensorrt-cu12", "tensorrt", false},
    {"triton", "triton", false},
    {"pytorch-triton", "triton", false},
    {"vllm", "vllm", false},
    {"transformers", "transformers", false},
    {"numpy", "numpy", false},
    {"jax-cuda11-plugin", NULL, false},
    {"jax-cuda12-plugin", NULL, false},
    {"jax-cuda12-pjrt", NULL, false},
    {"jax-cuda13-plugin", NULL, false},
};

static int tracked_index(const char *norm)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(tracked); i++) {
        size_t n = strlen(tracked[i].dist);
        if (tracked[i].prefix ? !strncmp(norm, tracked[i].dist, n) : !strcmp(norm, tracked[i].dist))
            return (int)i;
    }
    return -1;
}

typedef struct found {
    const char *framework; /* NULL for helper distributions */
    char dist[128];        /* normalized distribution name */
    char version[64];
    char cuda_runtime[16];
    char site[PATH_MAX];
} found;

/* One interpreter or prefix: where it looks, and what it holds. */
typedef struct env {
    char python[PATH_MAX]; /* interpreter path, "" when unknown */
    char version[32];      /* "3.11.7", "" when unknown */
    char *sites[MAX_SITES];
    size_t n_sites;
    found items[MAX_FOUND];
    size_t n_items;
} env;

typedef struct scan {
    px__disc *d;
    char *seen[MAX_SEEN];
    size_t n_seen;
    unsigned n_problems;
    char notes[512]; /* what went wrong, said in the probe's message */
    char info[512];  /* what else the message says */
} scan;

static void env_release(env *e)
{
    for (size_t i = 0; i < e->n_sites; i++)
        free(e->sites[i]);
    e->n_sites = 0;
}

static px_status env_add_site(env *e, const char *path)
{
    if (e->n_sites >= MAX_SITES)
        return PX_OK;
    char *c = px_strdup(path);
    if (!c)
        return PX_ENOMEM;
    e->sites[e->n_sites++] = c;
    return PX_OK;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void append(char *buf, size_t cap, const char *fmt, va_list ap)
{
    size_t k = strlen(buf);
    if (k + 3 >= cap)
        return;
    if (k)
        k += (size_t)snprintf(buf + k, cap - k, "; ");
    vsnprintf(buf + k, cap - k, fmt, ap);
}

static void note(scan *s, const char *fmt, ...) PX_PRINTF(2, 3);
static void note(scan *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    append(s->notes, sizeof s->notes, fmt, ap);
    va_end(ap);
}

static void info(scan *s, const char *fmt, ...) PX_PRINTF(2, 3);
static void info(scan *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    append(s->info, sizeof s->info, fmt, ap);
    va_end(ap);
}

/* Reads one .dist-info or .egg-info entry of site if it is tracked. */
static px_status read_entry(scan *s, env *e, const char *site, const char *entry)
{
    size_t n = strlen(entry);
    bool dist_info = px_str_ends_with(entry, ".dist-info");
    if (!dist_info && !px_str_ends_with(entry, ".egg-info"))
        return PX_OK;
    /* "{name}-{version}.dist-info": the name ends at the first '-'. */
    size_t nl = strcspn(entry, "-");
    if (nl == n)
        nl = n - (dist_info ? 10 : 9);
    char norm[128];
    px__py_normalize(entry, PX_MIN(nl, (size_t)120), norm, sizeof norm);
    if (tracked_index(norm) < 0)
        return PX_OK;
    char *path = px_asprintf("%s/%s", site, entry);
    if (!path)
        return PX_ENOMEM;
    char *meta = NULL;
    if (dist_info)
        meta = px_asprintf("%s/METADATA", path);
    else
        meta = is_dir(path) ? px_asprintf("%s/PKG-INFO", path) : px_strdup(path);
    free(path);
    if (!meta)
        return PX_ENOMEM;
    char *text = NULL;
    size_t len = 0;
    px_status st = px__py_read_head(meta, &text, &len);
    if (st == PX_ENOMEM) {
        free(meta);
        return st;
    }
    px_hw_dist_metadata md;
    px_err err;
    if (st != PX_OK) {
        st = px__disc_warn(s->d, "python", NULL, "%s: cannot be read", meta);
        s->n_problems++;
        goto done;
    }
    if (px_hw_parse_dist_metadata(text, len, &md, &err) != PX_OK) {
        st = px__disc_warn(s->d, "python", "reinstall the package", "%s: %s", meta, err.msg);
        s->n_problems++;
        goto done;
    }
    px__py_normalize(md.name, strlen(md.name), norm, sizeof norm);
    int t = tracked_index(norm);
    if (t < 0)
        goto done;
    for (size_t i = 0; i < e->n_items; i++) {
        if (strcmp(e->items[i].dist, norm))
            continue;
        /* Python imports the first on sys.path; later copies are shadowed.
         * Two in one folder is a broken installation worth a word. */
        if (!strcmp(e->items[i].site, site)) {
            st = px__disc_warn(s->d, "python", "uninstall the stale copy",
                               "%s: two metadata folders for %s (%s and %s)", site, md.name,
                               e->items[i].version, md.version);
            s->n_problems++;
        }
        goto done;
    }
    if (e->n_items < MAX_FOUND) {
        found *f = &e->items[e->n_items++];
        f->framework = tracked[t].framework;
        px_strlcpy(f->dist, norm, sizeof f->dist);
        px_strlcpy(f->version, md.version, sizeof f->version);
        px_strlcpy(f->cuda_runtime, md.cuda_runtime, sizeof f->cuda_runtime);
        px_strlcpy(f->site, site, sizeof f->site);
    }
done:
    free(text);
    free(meta);
    return st;
}

/* Scans every site folder of e once per discovery. */
static px_status scan_env(scan *s, env *e)
{
    for (size_t i = 0; i < e->n_sites; i++) {
        char real[PATH_MAX];
        if (!realpath(e->sites[i], real) || !is_dir(real))
            continue;
        bool seen = false;
        for (size_t j = 0; j < s->n_seen && !seen; j++)
            seen = !strcmp(s->seen[j], real);
        if (seen || s->n_seen >= MAX_SEEN)
            continue;
        if (!(s->seen[s->n_seen] = px_strdup(real)))
            return PX_ENOMEM;
        s->n_seen++;
        DIR *dir = opendir(real);
        if (!dir)
            continue;
        struct dirent *de;
        size_t count = 0;
        px_status st = PX_OK;
        while (st == PX_OK && (de = readdir(dir)) && count++ < MAX_ENTRIES)
            if (de->d_name[0] != '.')
                st = read_entry(s, e, real, de->d_name);
        closedir(dir);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* The interpreter and the prefixes                                    */
/* ------------------------------------------------------------------ */

static const char python_code[] =
    "import sys, json, sysconfig\n"
    "p = [x for x in sys.path if x]\n"
    "for k in ('purelib', 'platlib'):\n"
    "    try: p.append(sysconfig.get_paths()[k])\n"
    "    except Exception: pass\n"
    "print(json.dumps({'executable': sys.executable, 'version': '%d.%d.%d' % "
    "sys.version_info[:3], 'path': p}))\n";

static bool clean_text(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n >= max)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

/* Asks the interpreter for its sys.path.  Problems are recorded as notes
 * and warnings; only PX_ENOMEM fails. */
static px_status interpreter_env(scan *s, const char *want, env *e, bool *ok)
{
    *ok = false;
    char *py = NULL;
    px_status st = px__disc_find_program(want ? want : "python3", &py);
    if (st == PX_ENOMEM)
        return st;
    if (st != PX_OK) {
        if (want)
            note(s, "%s is not an executable file", want);
        else
            note(s, "python3: not found on PATH");
        s->n_problems++;
        return PX_OK;
    }
    char *argv[] = {py, "-c", (char *)python_code, NULL};
    px__cmd_result res;
    px_err err;
    st = px__disc_run(argv, s->d->timeout, PX__DISC_MAX_OUTPUT, &res, &err);
    json_t *doc = NULL;
    if (st == PX_ENOMEM)
        goto done;
    if (st != PX_OK || res.exit_code != 0) {
        char how[256];
        px__cmd_describe(&res, how, sizeof how);
        note(s, "%s: %s", py, st != PX_OK ? err.msg : how);
        s->n_problems++;
        st = PX_OK;
        goto done;
    }
    px_json_limits lim = {.max_bytes = PX__DISC_MAX_OUTPUT,
                          .max_depth = 4,
                          .max_string = PATH_MAX,
                          .max_elements = 1024};
    if (px_json_parse(res.out, res.len, "python3 sys.path", &lim, &doc, &err) != PX_OK) {
        note(s, "%s printed no usable sys.path: %s", py, err.msg);
        s->n_problems++;
        goto done;
    }
    const char *exe = json_string_value(json_object_get(doc, "executable"));
    const char *ver = json_string_value(json_object_get(doc, "version"));
    px_strlcpy(e->python, exe && clean_text(exe, sizeof e->python) ? exe : py, sizeof e->python);
    if (ver && clean_text(ver, sizeof e->version))
        px_strlcpy(e->version, ver, sizeof e->version);
    json_t *path = json_object_get(doc, "path");
    size_t i;
    json_t *v;
    json_array_foreach(path, i, v)
    {
        const char *p = json_string_value(v);
        if (p && p[0] == '/' && clean_text(p, PATH_MAX) && (st = env_add_site(e, p)) != PX_OK)
            goto done;
    }
    *ok = true;
done:
    json_decref(doc);
    px__cmd_result_release(&res);
    free(py);
    return st;
}

/* The site folders of a prefix: the prefix itself when it holds package
 * metadata, else lib[64]/pythonX.Y/{site,dist}-packages and
 * local/lib/pythonX.Y/dist-packages under it. */
static px_status prefix_env(scan *s, const char *prefix, env *e)
{
    static const char *const libs[] = {"lib", "lib64", "local/lib"};
    static const char *const kinds[] = {"site-packages", "dist-packages"};
    DIR *dir = opendir(prefix);
    if (!dir) {
        note(s, "--python %s: %s", prefix, strerror(errno));
        s->n_problems++;
        return PX_OK;
    }
    struct dirent *de;
    bool holds_metadata = false;
    size_t count = 0;
    while (!holds_metadata && (de = readdir(dir)) && count++ < MAX_ENTRIES)
        holds_metadata =
            px_str_ends_with(de->d_name, ".dist-info") || px_str_ends_with(de->d_name, ".egg-info");
    closedir(dir);
    if (holds_metadata)
        return env_add_site(e, prefix);
    for (size_t i = 0; i < PX_ARRAY_LEN(libs); i++) {
        char *lib = px_asprintf("%s/%s", prefix, libs[i]);
        if (!lib)
            return PX_ENOMEM;
        DIR *ld = opendir(lib);
        count = 0;
        while (ld && (de = readdir(ld)) && count++ < MAX_ENTRIES) {
            if (strncmp(de->d_name, "python3", 7))
                continue;
            for (size_t k = 0; k < PX_ARRAY_LEN(kinds); k++) {
                char *site = px_asprintf("%s/%s/%s", lib, de->d_name, kinds[k]);
                if (!site) {
                    closedir(ld);
                    free(lib);
                    return PX_ENOMEM;
                }
                px_status st = is_dir(site) ? env_add_site(e, site) : PX_OK;
                if (st == PX_OK && is_dir(site) && !e->version[0] && clean_text(de->d_name + 6, 16))
                    px_strlcpy(e->version, de->d_name + 6, sizeof e->version);
                free(site);
                if (st != PX_OK) {
                    closedir(ld);
                    free(lib);
                    return st;
                }
            }
        }
        if (ld)
            closedir(ld);
        free(lib);
    }
    if (!e->n_sites) {
        note(s, "--python %s: no site-packages folder under it", prefix);
        s->n_problems++;
        return PX_OK;
    }
    char *bin = px_asprintf("%s/bin/python3", prefix);
    if (!bin)
        return PX_ENOMEM;
    if (access(bin, X_OK) == 0)
        px_strlcpy(e->python, bin, sizeof e->python);
    free(bin);
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Frameworks into the document                                        */
/* ------------------------------------------------------------------ */

static const found *find(const env *e, const char *dist, bool prefix)
{
    for (size_t i = 0; i < e->n_items; i++)
        if (prefix ? px_str_starts_with(e->items[i].dist, dist) : !strcmp(e->items[i].dist, dist))
            return &e->items[i];
    return NULL;
}

static px_status push_framework(json_t *list, const env *e, const char *name, const char *version,
                                const char *site, const char *package, const char *evidence)
{
    json_t *fw = json_pack("{s:s}", "name", name);
    if (!fw || px_json_push(list, fw) != PX_OK)
        return PX_ENOMEM;
    if ((version && version[0] && px_json_set(fw, "version", json_string(version))) ||
        (e->python[0] && px_json_set(fw, "python", json_string(e->python))) ||
        (site && px_json_set(fw, "x-site", json_string(site))) ||
        (package && px_json_set(fw, "x-package", json_string(package))) ||
        (evidence && px_json_set(fw, "x-evidence", json_string(evidence))))
        return PX_ENOMEM;
    return PX_OK;
}

static int cmp_found(const void *a, const void *b)
{
    const found *x = a, *y = b;
    return strcmp(x->dist, y->dist);
}

/* "cupy-cuda12x" -> "12", "cupy-cuda117" -> "11.7", "cupy-cuda102" -> "10.2". */
static bool cupy_cuda(const char *dist, char *out, size_t cap)
{
    const char *v = dist + strlen("cupy-cuda");
    size_t n = strspn(v, "0123456789");
    if (n == 2 && v[2] == 'x' && !v[3])
        return snprintf(out, cap, "%.2s", v) < (int)cap;
    if (n == 3 && !v[3])
        return snprintf(out, cap, "%.2s.%c", v, v[2]) < (int)cap;
    return false;
}

static px_status pseudo(scan *s, json_t *list, const env *e)
{
    px__disc *d = s->d;
    char cuda[16], why[PATH_MAX + 128];
    const found *f = find(e, "torch", false);
    if (f) {
        bool cpu_only = false;
        bool built = px__py_cuda_from_local_version(f->version, cuda, sizeof cuda);
        if (built)
            snprintf(why, sizeof why, "torch %s local version", f->version);
        if (!built && (built = px__py_cuda_from_version_py(f->site, cuda, sizeof cuda, &cpu_only)))
            snprintf(why, sizeof why, "%s/torch/version.py", f->site);
        if (!built && !cpu_only && f->cuda_runtime[0]) {
            built = true;
            px_strlcpy(cuda, f->cuda_runtime, sizeof cuda);
            snprintf(why, sizeof why, "torch %s requires nvidia-cuda-runtime %s", f->version,
                     f->cuda_runtime);
        }
        if (built && d->nvidia_driver) {
            if (push_framework(list, e, "torch.cuda", cuda, NULL, NULL, why) != PX_OK)
                return PX_ENOMEM;
        } else if (built) {
            info(s, "torch %s is built for CUDA %s but no NVIDIA driver was found", f->version,
                 cuda);
        }
    }
    const found *plugin = find(e, "jax-cuda", true);
    const found *jaxlib = find(e, "jaxlib", false);
    bool jax_cuda = false;
    if (plugin && sscanf(plugin->dist, "jax-cuda%2[0-9]", cuda) == 1) {
        jax_cuda = true;
        snprintf(why, sizeof why, "%s %s installed", plugin->dist, plugin->version);
    } else if (jaxlib && strstr(jaxlib->version, "+cuda") &&
               sscanf(strstr(jaxlib->version, "+cuda"), "+cuda%2[0-9]", cuda) == 1) {
        jax_cuda = true;
        snprintf(why, sizeof why, "jaxlib %s local version", jaxlib->version);
    }
    if (jax_cuda && find(e, "jax", false)) {
        if (d->nvidia_driver && push_framework(list, e, "jax.cuda", cuda, NULL, NULL, why))
            return PX_ENOMEM;
        if (!d->nvidia_driver)
            info(s, "jax is built for CUDA %s but no NVIDIA driver was found", cuda);
    }
    f = find(e, "cupy-cuda", true);
    if (f && cupy_cuda(f->dist, cuda, sizeof cuda)) {
        snprintf(why, sizeof why, "%s %s installed", f->dist, f->version);
        if (d->nvidia_driver && push_framework(list, e, "cupy.cuda", cuda, NULL, NULL, why))
            return PX_ENOMEM;
        if (!d->nvidia_driver)
            info(s, "cupy is built for CUDA %s but no NVIDIA driver was found", cuda);
    }
    return PX_OK;
}

static px_status emit(scan *s, env *e, size_t *n_frameworks)
{
    json_t *list = json_object_get(s->d->node, "frameworks");
    if (!list) {
        list = json_array();
        if (px_json_set(s->d->node, "frameworks", list) != PX_OK)
            return PX_ENOMEM;
    }
    qsort(e->items, e->n_items, sizeof e->items[0], cmp_found);
    for (size_t i = 0; i < e->n_items; i++) {
        const found *f = &e->items[i];
        if (!f->framework)
            continue;
        const char *pkg = strcmp(f->dist, f->framework) ? f->dist : NULL;
        if (push_framework(list, e, f->framework, f->version, f->site, pkg, NULL) != PX_OK)
            return PX_ENOMEM;
        (*n_frameworks)++;
    }
    size_t before = json_array_size(list);
    if (pseudo(s, list, e) != PX_OK)
        return PX_ENOMEM;
    *n_frameworks += json_array_size(list) - before;
    return PX_OK;
}

px_status px__disc_probe_python(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    const px_hw_discover_options *o = d->opt;
    bool want_interp = !(o->python && !o->python[0]);
    if (!want_interp && !o->n_python_prefixes)
        return px__disc_record(d, "python", PX__PROBE_SKIPPED, NULL, t0, NULL,
                               "no interpreter or prefix requested");
    scan s = {.d = d};
    env *e = calloc(1, sizeof *e);
    if (!e)
        return PX_ENOMEM;
    px_status st = PX_OK;
    size_t n_frameworks = 0, n_envs = 0;
    bool interp_ok = false;
    if (want_interp) {
        st = interpreter_env(&s, o->python, e, &interp_ok);
        if (st == PX_OK && interp_ok) {
            n_envs++;
            json_t *py = json_pack("{s:s}", "path", e->python);
            if (!py || px_json_set(d->node, "python", py) != PX_OK ||
                (e->version[0] && px_json_set(py, "version", json_string(e->version))))
                st = PX_ENOMEM;
        }
        if (st == PX_OK && interp_ok && (st = scan_env(&s, e)) == PX_OK)
            st = emit(&s, e, &n_frameworks);
    }
    for (size_t i = 0; st == PX_OK && i < o->n_python_prefixes; i++) {
        env_release(e);
        memset(e, 0, sizeof *e);
        st = prefix_env(&s, o->python_prefixes[i], e);
        if (st != PX_OK || !e->n_sites)
            continue;
        n_envs++;
        if ((st = scan_env(&s, e)) == PX_OK)
            st = emit(&s, e, &n_frameworks);
    }
    env_release(e);
    free(e);
    for (size_t i = 0; i < s.n_seen; i++)
        free(s.seen[i]);
    if (st != PX_OK)
        return st;
    /* A failed probe's record carries its own warning; a partial one
     * warns here about what its notes say went wrong. */
    if (n_envs && s.notes[0] &&
        px__disc_warn(d, "python", "install python3 or pass --python PREFIX", "%s", s.notes) !=
            PX_OK)
        return PX_ENOMEM;
    px__probe_status ps = !n_envs        ? PX__PROBE_FAILED
                          : s.n_problems ? PX__PROBE_PARTIAL
                                         : PX__PROBE_OK;
    return px__disc_record(d, "python", ps, "sys.path, *.dist-info/METADATA, *.egg-info", t0,
                           n_envs ? NULL : "install python3 or pass --python PREFIX",
                           "%zu framework%s in %zu environment%s%s%s%s%s", n_frameworks,
                           n_frameworks == 1 ? "" : "s", n_envs, n_envs == 1 ? "" : "s",
                           s.notes[0] ? "; " : "", s.notes, s.info[0] ? "; " : "", s.info);
}
