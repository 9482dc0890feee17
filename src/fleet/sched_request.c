/* Validates a job specification and compiles it into the scheduler's
 * request: numbers parsed, framework requirements split, model digest read. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

#include <ctype.h>

#define SPEC_ERR(err, ptr, ...) spec_err(err, ptr, __VA_ARGS__)

static px_status spec_err(px_err *err, const char *ptr, const char *fmt, ...) PX_PRINTF(3, 4);
static px_status spec_err(px_err *err, const char *ptr, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return px_err_set(err, PX_EINVAL, "job spec: %s: %s", ptr, msg);
}

/* A byte quantity: a number of bytes or text with a unit ("8 GiB"). */
static px_status get_bytes(const json_t *v, const char *ptr, double *out, px_err *err)
{
    if (json_is_integer(v) || json_is_real(v)) {
        double x = json_number_value(v);
        if (!(x >= 0) || x > 1e18)
            return SPEC_ERR(err, ptr, "expected a non-negative number of bytes");
        *out = x;
        return PX_OK;
    }
    if (!json_is_string(v))
        return SPEC_ERR(err, ptr, "expected a size such as \"8 GiB\", got %s",
                        px_json_type_name(v));
    px_qty q;
    px_err qe;
    if (px_qty_parse(json_string_value(v), PX_DIM_BYTES, &q, &qe) != PX_OK)
        return SPEC_ERR(err, ptr, "%s", qe.msg);
    if (q.value < 0)
        return SPEC_ERR(err, ptr, "a size cannot be negative");
    *out = q.value;
    return PX_OK;
}

static px_status check_string_array(const json_t *v, const char *ptr, size_t min, size_t max,
                                    px_err *err)
{
    if (!json_is_array(v))
        return SPEC_ERR(err, ptr, "expected an array of strings, got %s", px_json_type_name(v));
    size_t n = json_array_size(v);
    if (n < min || n > max)
        return SPEC_ERR(err, ptr, "expected %zu to %zu strings, got %zu", min, max, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s))
            return SPEC_ERR(err, ptr, "item %zu: expected a string, got %s", i,
                            px_json_type_name(s));
        if (strlen(json_string_value(s)) != json_string_length(s))
            return SPEC_ERR(err, ptr, "item %zu: contains a NUL character", i);
    }
    return PX_OK;
}

static bool check_members(const json_t *obj, const char *ptr, const char *const *allowed,
                          size_t n_allowed, px_err *err)
{
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        if (px_str_starts_with(key, "x-"))
            continue;
        bool ok = false;
        for (size_t i = 0; i < n_allowed && !ok; i++)
            ok = strcmp(key, allowed[i]) == 0;
        if (!ok) {
            SPEC_ERR(err, ptr,
                     "unknown member \"%.64s\"; known members: see "
                     "docs/formats/fleet-api.md (names starting with x- are ignored)",
                     key);
            return false;
        }
    }
    return true;
}

static px_status get_int(const json_t *obj, const char *key, const char *ptr, long lo, long hi,
                         long dflt, long *out, px_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = dflt;
        return PX_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return SPEC_ERR(err, ptr, "expected an integer %ld..%ld", lo, hi);
    *out = (long)json_integer_value(v);
    return PX_OK;
}

/* Splits "torch>=2.1,<3" into its name and specifier and checks both. */
static px_status parse_fw_req(const char *text, size_t i, px__fw_req *out, px_err *err)
{
    char ptr[48];
    snprintf(ptr, sizeof ptr, "/frameworks/%zu", i);
    size_t n = 0;
    while (text[n] && (isalnum((unsigned char)text[n]) || strchr("._-", text[n])))
        n++;
    if (n == 0 || n > 64)
        return SPEC_ERR(err, ptr,
                        "\"%.64s\" does not start with a framework name "
                        "(write \"torch>=2.1\" or \"torch.cuda\")",
                        text);
    out->name = px_strndup(text, n);
    const char *spec = text + n;
    while (isspace((unsigned char)*spec))
        spec++;
    out->spec = px_strdup(spec);
    out->text = px_strdup(text);
    if (!out->name || !out->spec || !out->text)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    bool ignored;
    px_err ve;
    if (px_fleet_version_match("0", out->spec, &ignored, &ve) != PX_OK)
        return SPEC_ERR(err, ptr, "%s", ve.msg);
    return PX_OK;
}

static px_status compile_resources(const json_t *res, px_fleet_request *r, px_err *err)
{
    static const char *const known[] = {"cpus",       "memory", "gpus",
                                        "gpu_memory", "vendor", "capability"};
    if (!json_is_object(res))
        return SPEC_ERR(err, "/resources", "expected an object, got %s", px_json_type_name(res));
    if (!check_members(res, "/resources", known, PX_ARRAY_LEN(known), err))
        return PX_EINVAL;
    const json_t *v;
    if ((v = json_object_get(res, "cpus"))) {
        /* A floor, so that no job can ask for so little that a node takes
         * an unbounded number of them. */
        if (!json_is_number(v) || !(json_number_value(v) >= 0.01) || json_number_value(v) > 100000)
            return SPEC_ERR(err, "/resources/cpus",
                            "expected a number of cores from 0.01 to 100000");
        r->cpus = json_number_value(v);
    }
    if ((v = json_object_get(res, "memory")) &&
        get_bytes(v, "/resources/memory", &r->memory, err) != PX_OK)
        return PX_EINVAL;
    long gpus = 0;
    if (get_int(res, "gpus", "/resources/gpus", 0, PX__SCHED_MAX_DEVICES, 0, &gpus, err) != PX_OK)
        return PX_EINVAL;
    r->gpus = (int)gpus;
    if ((v = json_object_get(res, "gpu_memory"))) {
        if (get_bytes(v, "/resources/gpu_memory", &r->gpu_memory, err) != PX_OK)
            return PX_EINVAL;
        if (r->gpus == 0)
            r->gpus = 1;
    }
    if ((v = json_object_get(res, "vendor"))) {
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 32)
            return SPEC_ERR(err, "/resources/vendor", "expected a vendor name such as \"nvidia\"");
        r->vendor = px_strdup(json_string_value(v));
        for (char *c = r->vendor; c && *c; c++)
            *c = (char)tolower((unsigned char)*c);
        if (r->gpus == 0)
            r->gpus = 1;
    }
    if ((v = json_object_get(res, "capability"))) {
        if (!json_is_string(v) || json_string_length(v) > 64)
            return SPEC_ERR(err, "/resources/capability", "expected a specifier such as \">=8.0\"");
        bool ignored;
        px_err ve;
        if (px_fleet_version_match("0", json_string_value(v), &ignored, &ve) != PX_OK)
            return SPEC_ERR(err, "/resources/capability", "%s", ve.msg);
        r->capability = px_strdup(json_string_value(v));
        if (r->gpus == 0)
            r->gpus = 1;
    }
    return PX_OK;
}

static px_status compile_service(const json_t *svc, px_err *err)
{
    static const char *const known[] = {"port", "health_path", "health_command"};
    if (!json_is_object(svc))
        return SPEC_ERR(err, "/service", "expected an object, got %s", px_json_type_name(svc));
    if (!check_members(svc, "/service", known, PX_ARRAY_LEN(known), err))
        return PX_EINVAL;
    long port = 0;
    if (!json_object_get(svc, "port"))
        return SPEC_ERR(err, "/service/port", "a service needs the port it listens on");
    if (get_int(svc, "port", "/service/port", 1, 65535, 0, &port, err) != PX_OK)
        return PX_EINVAL;
    const json_t *hp = json_object_get(svc, "health_path");
    const json_t *hc = json_object_get(svc, "health_command");
    if (hp && hc)
        return SPEC_ERR(err, "/service", "give health_path or health_command, not both");
    if (hp &&
        (!json_is_string(hp) || json_string_value(hp)[0] != '/' || json_string_length(hp) > 1024))
        return SPEC_ERR(err, "/service/health_path", "expected a path starting with /");
    if (hc && check_string_array(hc, "/service/health_command", 1, 256, err) != PX_OK)
        return PX_EINVAL;
    return PX_OK;
}

static px_status compile_python(const json_t *py, px_err *err)
{
    static const char *const known[] = {"filename", "source", "function", "args"};
    if (!json_is_object(py))
        return SPEC_ERR(err, "/python", "expected an object, got %s", px_json_type_name(py));
    if (!check_members(py, "/python", known, PX_ARRAY_LEN(known), err))
        return PX_EINVAL;
    const json_t *src = json_object_get(py, "source");
    const json_t *fn = json_object_get(py, "function");
    if (!json_is_string(src))
        return SPEC_ERR(err, "/python/source", "expected the text of the Python file");
    if (!json_is_string(fn) || json_string_length(fn) == 0 || json_string_length(fn) > 256)
        return SPEC_ERR(err, "/python/function", "expected the name of a function");
    for (const char *c = json_string_value(fn); *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '.')
            return SPEC_ERR(err, "/python/function", "\"%.64s\" is not a Python name",
                            json_string_value(fn));
    const json_t *fname = json_object_get(py, "filename");
    if (fname && (!json_is_string(fname) || json_string_length(fname) > 255 ||
                  strchr(json_string_value(fname), '/')))
        return SPEC_ERR(err, "/python/filename", "expected a file name without folders");
    return PX_OK;
}

static px_status compile(const json_t *spec, px_fleet_request *r, px_err *err)
{
    static const char *const known[] = {"name",
                                        "command",
                                        "shell",
                                        "python",
                                        "env",
                                        "resources",
                                        "frameworks",
                                        "model",
                                        "plan",
                                        "artifacts",
                                        "nodes",
                                        "launcher",
                                        "on_member_failure",
                                        "service",
                                        "max_attempts",
                                        "time_limit_s"};
    if (!json_is_object(spec))
        return SPEC_ERR(err, "/", "expected an object, got %s", px_json_type_name(spec));
    if (!check_members(spec, "top level", known, PX_ARRAY_LEN(known), err))
        return PX_EINVAL;
    const json_t *v;
    if ((v = json_object_get(spec, "name"))) {
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 128)
            return SPEC_ERR(err, "/name", "expected a string of 1 to 128 characters");
        /* Listings print names on terminals: no control characters (C0,
         * DEL or C1), so a name cannot carry escape sequences. */
        const unsigned char *c = (const unsigned char *)json_string_value(v);
        for (size_t i = 0; i < json_string_length(v); i++)
            if (c[i] < 0x20 || c[i] == 0x7f ||
                (c[i] == 0xc2 && c[i + 1] >= 0x80 && c[i + 1] <= 0x9f))
                return SPEC_ERR(err, "/name",
                                "byte %zu is a control character; a name is printable text", i);
    }
    const json_t *cmd = json_object_get(spec, "command");
    const json_t *py = json_object_get(spec, "python");
    if (!cmd && !py)
        return SPEC_ERR(err, "/command", "a job needs a command (argv array) or python");
    if (cmd && py)
        return SPEC_ERR(err, "/python", "give command or python, not both");
    if (cmd && check_string_array(cmd, "/command", 1, 4096, err) != PX_OK)
        return PX_EINVAL;
    if ((v = json_object_get(spec, "shell"))) {
        if (!json_is_boolean(v))
            return SPEC_ERR(err, "/shell", "expected true or false");
        if (json_is_true(v) && (!cmd || json_array_size(cmd) != 1))
            return SPEC_ERR(err, "/command",
                            "with shell: true the command is one string "
                            "for /bin/sh -c");
    }
    if (py && compile_python(py, err) != PX_OK)
        return PX_EINVAL;
    if ((v = json_object_get(spec, "env"))) {
        if (!json_is_object(v) || json_object_size(v) > 1024)
            return SPEC_ERR(err, "/env", "expected an object of at most 1024 strings");
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)v, key, val)
        {
            if (!json_is_string(val) || key[0] == '\0' || strchr(key, '=') ||
                strlen(json_string_value(val)) != json_string_length(val))
                return SPEC_ERR(err, "/env",
                                "\"%.64s\": names must be non-empty without '=', "
                                "values strings without NUL",
                                key);
        }
    }
    r->cpus = 1;
    if ((v = json_object_get(spec, "resources")) && compile_resources(v, r, err) != PX_OK)
        return PX_EINVAL;
    if ((v = json_object_get(spec, "frameworks"))) {
        if (check_string_array(v, "/frameworks", 0, PX__SCHED_MAX_FRAMEWORKS, err) != PX_OK)
            return PX_EINVAL;
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (parse_fw_req(json_string_value(json_array_get(v, i)), i, &r->fws[i], err) != PX_OK)
                return err ? err->code : PX_EINVAL;
            r->n_fws++;
        }
    }
    if ((v = json_object_get(spec, "model"))) {
        const json_t *d = json_is_object(v) ? json_object_get(v, "digest") : NULL;
        if (!json_is_string(d) || px_digest_parse(json_string_value(d), &r->inputs[0]) != PX_OK)
            return SPEC_ERR(err, "/model/digest", "expected the model's SHA-256 as 64 hex digits");
        r->n_inputs = 1;
    }
    if ((v = json_object_get(spec, "plan"))) {
        if (!json_is_string(v) || strcmp(json_string_value(v), "auto") != 0)
            return SPEC_ERR(err, "/plan", "the only plan request is \"auto\"");
        if (!r->n_inputs)
            return SPEC_ERR(err, "/plan", "plan \"auto\" needs a model");
        r->plan_auto = true;
    }
    if ((v = json_object_get(spec, "artifacts"))) {
        if (check_string_array(v, "/artifacts", 0, 256, err) != PX_OK)
            return PX_EINVAL;
        /* Refused here, at submission, rather than when the agent uploads. */
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *a = json_array_get(v, i);
            px_err ae;
            char ptr[32];
            snprintf(ptr, sizeof ptr, "/artifacts/%zu", i);
            if (px__artifact_name_check(json_string_value(a), json_string_length(a), &ae) != PX_OK)
                return SPEC_ERR(err, ptr, "%s", ae.msg);
            for (size_t k = 0; k < i; k++)
                if (json_equal(a, json_array_get(v, k)))
                    return SPEC_ERR(err, ptr, "\"%.64s\" is listed twice", json_string_value(a));
        }
    }
    long n = 1;
    if (get_int(spec, "nodes", "/nodes", 1, 1024, 1, &n, err) != PX_OK)
        return PX_EINVAL;
    r->members = (int)n;
    if ((v = json_object_get(spec, "launcher"))) {
        const char *l = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(l, "env") && strcmp(l, "torchrun") && strcmp(l, "mpi"))
            return SPEC_ERR(err, "/launcher", "expected \"env\", \"torchrun\" or \"mpi\"");
    }
    if ((v = json_object_get(spec, "on_member_failure"))) {
        const char *l = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(l, "fail") && strcmp(l, "restart"))
            return SPEC_ERR(err, "/on_member_failure", "expected \"fail\" or \"restart\"");
    }
    if ((v = json_object_get(spec, "service"))) {
        if (compile_service(v, err) != PX_OK)
            return PX_EINVAL;
        r->service = true;
    }
    if (get_int(spec, "max_attempts", "/max_attempts", 1, 100, 3, &n, err) != PX_OK)
        return PX_EINVAL;
    r->max_attempts = (int)n;
    if ((v = json_object_get(spec, "time_limit_s"))) {
        if (!json_is_number(v) || !(json_number_value(v) >= 1) ||
            json_number_value(v) > 30 * 86400.0)
            return SPEC_ERR(err, "/time_limit_s", "expected seconds from 1 to 2592000 (30 days)");
        r->time_limit_s = json_number_value(v);
    }
    return PX_OK;
}

px_status px_fleet_request_compile(const json_t *spec, px_fleet_request **out, px_err *err)
{
    *out = NULL;
    px_fleet_request *r = calloc(1, sizeof *r);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    r->refs = 1;
    px_status st = compile(spec, r, err);
    if (st != PX_OK) {
        px_fleet_request_free(r);
        return st;
    }
    r->spec = json_deep_copy(spec);
    if (!r->spec) {
        px_fleet_request_free(r);
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    *out = r;
    return PX_OK;
}

void px_fleet_request_free(px_fleet_request *r)
{
    if (!r || --r->refs > 0)
        return;
    json_decref(r->spec);
    free(r->vendor);
    free(r->capability);
    for (int i = 0; i < PX__SCHED_MAX_FRAMEWORKS; i++) {
        free(r->fws[i].name);
        free(r->fws[i].spec);
        free(r->fws[i].text);
    }
    free(r);
}

int px_fleet_request_members(const px_fleet_request *r)
{
    return r->members;
}
