/* Discovery: reading Python package metadata as text (METADATA, PKG-INFO,
 * torch/version.py), bounded, for untrusted files. */
#include "hw/discover_impl.h"

#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

enum { META_MAX_BYTES = 64 * 1024 };

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

static bool version_char(char c)
{
    return name_char(c) || c == '+' || c == '!';
}

static bool header_is(const char *line, size_t n, const char *key, const char **val, size_t *vl)
{
    size_t k = strlen(key);
    if (n <= k || line[k] != ':' || strncasecmp(line, key, k))
        return false;
    *val = line + k + 1;
    *vl = n - k - 1;
    px__trim(val, vl);
    return true;
}

void px__py_normalize(const char *s, size_t n, char *out, size_t cap)
{
    /* PEP 503: lower case, runs of '-', '_' and '.' become one '-'. */
    size_t k = 0;
    bool sep = false;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        char c = s[i];
        if (c == '-' || c == '_' || c == '.') {
            sep = true;
            continue;
        }
        if (sep && k && k + 2 < cap)
            out[k++] = '-';
        sep = false;
        out[k++] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    out[k] = '\0';
}

/* "12.1.105" -> "12.1". */
static bool major_minor(const char *s, size_t n, char *out, size_t cap)
{
    size_t i = 0, dots = 0;
    while (i < n && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && dots == 0))) {
        if (s[i] == '.')
            dots++;
        i++;
    }
    if (i && s[i - 1] == '.')
        i--;
    if (!i || i >= cap)
        return false;
    px__copy_text(out, cap, s, i);
    return true;
}

/* Requires-Dist: nvidia-cuda-runtime-cu12 (==12.1.105) ; platform_system == "Linux" */
static void read_cuda_requirement(const char *v, size_t vl, px_hw_dist_metadata *out)
{
    size_t nl = 0;
    while (nl < vl && name_char(v[nl]))
        nl++;
    char norm[96];
    px__py_normalize(v, PX_MIN(nl, (size_t)90), norm, sizeof norm);
    static const char stem[] = "nvidia-cuda-runtime-cu";
    if (strncmp(norm, stem, sizeof stem - 1) || out->cuda_runtime[0])
        return;
    const char *eq = NULL;
    for (size_t i = nl; i + 1 < vl; i++)
        if (v[i] == '=' && v[i + 1] == '=') {
            eq = v + i + 2;
            break;
        }
    if (eq && major_minor(eq, vl - (size_t)(eq - v), out->cuda_runtime, sizeof out->cuda_runtime))
        return;
    /* No exact pin: the package name still says the major version. */
    const char *major = norm + sizeof stem - 1;
    if (major[0] >= '0' && major[0] <= '9' && strlen(major) < sizeof out->cuda_runtime)
        px_strlcpy(out->cuda_runtime, major, sizeof out->cuda_runtime);
}

px_status px_hw_parse_dist_metadata(const char *text, size_t len, px_hw_dist_metadata *out,
                                    px_err *err)
{
    memset(out, 0, sizeof *out);
    if (len > META_MAX_BYTES)
        len = META_MAX_BYTES; /* the header block is at the top */
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t n;
    size_t name_line = 0, version_line = 0;
    while (px__lines_next(&it, &line, &n)) {
        if (n == 0)
            break; /* the end of the header block; the description follows */
        if (line[0] == ' ' || line[0] == '\t')
            continue; /* a folded continuation of the previous header */
        const char *v;
        size_t vl;
        if (header_is(line, n, "Name", &v, &vl)) {
            if (name_line)
                continue;
            name_line = it.lineno;
            bool ok = vl > 0 && vl < sizeof out->name;
            for (size_t i = 0; ok && i < vl; i++)
                ok = name_char(v[i]);
            if (!ok)
                return px_err_set(err, PX_EPARSE,
                                  "line %zu: Name is not 1 to %zu letters, digits, '.', '_' "
                                  "or '-'",
                                  it.lineno, sizeof out->name - 1);
            px__copy_text(out->name, sizeof out->name, v, vl);
        } else if (header_is(line, n, "Version", &v, &vl)) {
            if (version_line)
                continue;
            version_line = it.lineno;
            bool ok = vl > 0 && vl < sizeof out->version;
            for (size_t i = 0; ok && i < vl; i++)
                ok = version_char(v[i]);
            if (!ok)
                return px_err_set(err, PX_EPARSE,
                                  "line %zu: Version is not 1 to %zu characters of a PEP 440 "
                                  "version",
                                  it.lineno, sizeof out->version - 1);
            px__copy_text(out->version, sizeof out->version, v, vl);
        } else if (header_is(line, n, "Requires-Dist", &v, &vl)) {
            read_cuda_requirement(v, vl, out);
        }
    }
    if (!name_line)
        return px_err_set(err, PX_EPARSE,
                          "no Name header in the header block (lines 1 to %zu); is this a "
                          "METADATA or PKG-INFO file?",
                          it.lineno);
    if (!version_line)
        return px_err_set(err, PX_EPARSE, "no Version header in the header block (lines 1 to %zu)",
                          it.lineno);
    return PX_OK;
}

px_status px__py_read_head(const char *path, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? PX_ENOTFOUND : PX_EIO;
    char *buf = malloc(META_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        return PX_ENOMEM;
    }
    size_t n = 0;
    while (n < META_MAX_BYTES) {
        ssize_t r = read(fd, buf + n, META_MAX_BYTES - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return PX_OK;
}

bool px__py_cuda_from_local_version(const char *version, char *out, size_t cap)
{
    /* "2.3.1+cu121" -> "12.1"; "+cu118" -> "11.8"; "+cu102" -> "10.2". */
    const char *plus = strchr(version, '+');
    if (!plus || strncmp(plus + 1, "cu", 2))
        return false;
    const char *digits = plus + 3;
    size_t n = 0;
    while (digits[n] >= '0' && digits[n] <= '9')
        n++;
    if (n < 2 || n > 4 || (digits[n] && digits[n] != '.'))
        return false;
    return snprintf(out, cap, "%.*s.%c", (int)(n - 1), digits, digits[n - 1]) < (int)cap;
}

bool px__py_cuda_from_version_py(const char *site, char *out, size_t cap, bool *cpu_only)
{
    *cpu_only = false;
    char *path = px_asprintf("%s/torch/version.py", site);
    char *text = NULL;
    size_t len = 0;
    bool found = false;
    if (path && px__py_read_head(path, &text, &len) == PX_OK) {
        px__lines it;
        px__lines_init(&it, text, len);
        const char *line;
        size_t n;
        while (!found && !*cpu_only && px__lines_next(&it, &line, &n)) {
            /* cuda = '12.1'   or   cuda: Optional[str] = '12.1'   or  = None */
            if (n < 5 || memcmp(line, "cuda", 4) ||
                (line[4] != ' ' && line[4] != ':' && line[4] != '='))
                continue;
            const char *eq = memchr(line, '=', n);
            if (!eq)
                continue;
            const char *v = eq + 1;
            size_t vl = n - (size_t)(v - line);
            px__trim(&v, &vl);
            if (vl == 4 && !memcmp(v, "None", 4)) {
                *cpu_only = true;
                break;
            }
            if (vl >= 3 && (v[0] == '\'' || v[0] == '"') && v[vl - 1] == v[0])
                found = major_minor(v + 1, vl - 2, out, cap);
        }
    }
    free(text);
    free(path);
    return found;
}
