/* plexus submit: send a command, a Python function, a distributed job or a
 * service to the fleet. */
#include "cli/fleet_cli.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

const char px__cmd_submit_summary[] =
    "submit a command, Python function, distributed job or service to the fleet";

#define PYTHON_SOURCE_MAX (1u << 20)

typedef struct submit_opts {
    px__fleet_cli o;
    json_t *spec;
    json_t *resources;
    const char *file; /* -f spec.json */
    const char *model;
    const char *python;
    const char *args;
    const char *health;
    uint32_t port;
    bool service;
    bool wait;
    double timeout_s;
    const char *idem_key;
    char *model_owned; /* the spec file's model path */
    /* What the table reads, before it goes into spec. */
    double cpus;
    const char *mem, *gpu_mem, *vendor, *capability, *plan, *name, *launcher, *on_failure;
    uint32_t gpus, nodes, max_attempts;
    bool shell;
    double time_limit_s;
    bool seen_gpus, seen_nodes, seen_attempts;
    px_cli_list frameworks, artifacts, env;
} submit_opts;

static submit_opts S;

/* "90", "90s", "15m", "2h", "1d" in seconds, from 1s to 30 days. */
static px_status parse_duration(const char *v, void *dest, px_err *err)
{
    char *end;
    double x = strtod(v, &end);
    double unit = !strcmp(end, "") || !strcmp(end, "s") ? 1
                  : !strcmp(end, "m")                   ? 60
                  : !strcmp(end, "h")                   ? 3600
                  : !strcmp(end, "d")                   ? 86400
                                                        : 0;
    double t = end == v || !(x > 0) ? 0 : x * unit;
    if (!(t >= 1) || t > 30 * 86400.0)
        return px_err_set(err, PX_EINVAL, "takes 1s to 30d (90, 90s, 15m, 2h), not \"%s\"", v);
    *(double *)dest = t;
    return PX_OK;
}

/* A size with its unit, kept as written (the server reads quantities). */
static px_status parse_size_text(const char *v, void *dest, px_err *err)
{
    px_qty q;
    if (px_qty_parse(v, PX_DIM_BYTES, &q, NULL) != PX_OK)
        return px_err_set(err, PX_EINVAL, "takes a size with its unit such as 8GiB, not \"%s\"", v);
    *(const char **)dest = v;
    return PX_OK;
}

static const px_cli_opt opts[] = {
    PX_CLI_OPT("file", 'f', PX_CLI_STR, &S.file, "FILE",
               "the job specification, a JSON file (docs/formats/fleet-api.md);\n"
               "options given beside it add to it or replace its members"),
    PX_CLI_OPT("name", 0, PX_CLI_STR, &S.name, "NAME", "a name shown in listings"),
    PX_CLI_OPT("cpus", 0, PX_CLI_NUM, &S.cpus, "N", "CPU cores per member (default 1)", .lo = 0.01,
               .hi = 4096),
    PX_CLI_OPT("mem", 0, PX_CLI_CALL, &S.mem, "SIZE", "host memory per member, e.g. 8GiB",
               .parse = parse_size_text),
    PX_CLI_OPT("gpus", 0, PX_CLI_U32, &S.gpus, "N", "whole GPUs per member", .hi = 64,
               .seen = &S.seen_gpus),
    PX_CLI_OPT("gpu-mem", 0, PX_CLI_CALL, &S.gpu_mem, "SIZE",
               "free memory each GPU must have, e.g. 16GiB", .parse = parse_size_text),
    PX_CLI_OPT("vendor", 0, PX_CLI_STR, &S.vendor, "NAME", "GPU vendor (nvidia, amd, intel, ...)"),
    PX_CLI_OPT("capability", 0, PX_CLI_STR, &S.capability, "SPEC", "GPU capability, e.g. '>=8.0'"),
    PX_CLI_OPT("framework", 0, PX_CLI_LIST, &S.frameworks, "SPEC",
               "a framework with an optional PEP 440 specifier:\n"
               "'torch>=2.1', 'torch.cuda' (repeatable)"),
    PX_CLI_OPT("model", 0, PX_CLI_STR, &S.model, "FILE|DIGEST",
               "a model the job reads; a file is uploaded first; the\n"
               "job finds its absolute path in $PLEXUS_MODEL"),
    PX_CLI_OPT("plan", 0, PX_CLI_CHOICE, &S.plan, "auto", "ask the planner for a plan for --model",
               .choices = "auto"),
    PX_CLI_OPT("artifact", 0, PX_CLI_LIST, &S.artifacts, "PATH",
               "a file (relative to the job's folder) to keep when\nthe job ends (repeatable)"),
    PX_CLI_OPT("env", 0, PX_CLI_LIST, &S.env, "K=V", "an environment variable (repeatable)"),
    PX_CLI_OPT("shell", 0, PX_CLI_FLAG, &S.shell, NULL, "run CMD (one string) with /bin/sh -c"),
    PX_CLI_OPT("python", 0, PX_CLI_STR, &S.python, "FILE.py:FUNCTION",
               "run a Python function instead of a command"),
    PX_CLI_OPT("args", 0, PX_CLI_STR, &S.args, "JSON",
               "with --python: an array is the positional arguments\n"
               "('[2, 3]' calls FUNCTION(2, 3)), an object the keyword\n"
               "arguments, anything else one argument"),
    PX_CLI_OPT("nodes", 0, PX_CLI_U32, &S.nodes, "N", "members, placed all or nothing", .lo = 1,
               .hi = 1024, .seen = &S.seen_nodes),
    PX_CLI_OPT("launcher", 0, PX_CLI_CHOICE, &S.launcher, "NAME",
               "how members find each other: env, torchrun or mpi", .choices = "env|torchrun|mpi"),
    PX_CLI_OPT("on-member-failure", 0, PX_CLI_CHOICE, &S.on_failure, "WHAT", "fail or restart",
               .choices = "fail|restart"),
    PX_CLI_OPT("service", 0, PX_CLI_FLAG, &S.service, NULL,
               "a service: kept running, with --port and --health"),
    PX_CLI_OPT("port", 0, PX_CLI_U32, &S.port, "N", "the service's port", .lo = 1, .hi = 65535),
    PX_CLI_OPT("health", 0, PX_CLI_STR, &S.health, "/PATH|CMD",
               "the service's health check: an HTTP path or a command"),
    PX_CLI_OPT("max-attempts", 0, PX_CLI_U32, &S.max_attempts, "N",
               "attempts when a node is lost (default 3)", .lo = 1, .hi = 100,
               .seen = &S.seen_attempts),
    PX_CLI_OPT("time-limit", 0, PX_CLI_CALL, &S.time_limit_s, "TIME",
               "stop the job after TIME (90, 90s, 15m, 2h)", .parse = parse_duration),
    PX_CLI_OPT("idempotency-key", 0, PX_CLI_STR, &S.idem_key, "KEY",
               "a retried submit with the same KEY returns the same job\n"
               "(default: a fresh key, retried on network errors)"),
    PX_CLI_OPT("wait", 0, PX_CLI_FLAG, &S.wait, NULL,
               "wait for the job to end and print its result; exit 0\nonly when it succeeded"),
    PX_CLI_OPT("timeout", 0, PX_CLI_TIME, &S.timeout_s, "TIME",
               "with --wait, give up after TIME (default 10min)", .lo = 0.001),
    PX__FLEET_CLI_OPTS(S.o),
    {0},
};

static const px_cli_spec submit_spec = {
    .name = "submit",
    .synopsis = "[options] [--] CMD [ARGS...] | --python FILE.py:FUNCTION | -f SPEC.json",
    .about = "Sends a job to the fleet: a command, a Python function, a distributed job\n"
             "(--nodes) or a service, described by options or by a job specification file\n"
             "(-f).  The options end at the command: everything after it is its arguments.",
    .opts = opts,
    .operands = "CMD",
    .min_operands = 0,
    .max_operands = -1,
    .flags = PX_CLI_OPERANDS_END,
    .examples =
        "plexus submit --cpus 2 --mem 4GiB -- python3 train.py --epochs 1\n"
        "plexus submit -f job.json --wait            # the spec from a file\n"
        "plexus submit --python fn.py:add --args '[2, 3]' --wait\n"
        "plexus submit --gpus 1 --gpu-mem 16GiB --model tiny.gguf --plan auto -- ./serve.sh\n",
};
const px_cli_spec *const px__cmd_submit_specs[] = {&submit_spec, NULL};

static json_t *python_member(submit_opts *s)
{
    char *file, *function;
    px_err err;
    if (px_fleet_python_target_parse(s->python, &file, &function, &err) != PX_OK) {
        px__cli_usage_error("submit", "%s", err.msg);
        return NULL;
    }
    char *source = NULL;
    size_t len;
    json_t *py = NULL;
    if (px_read_file(file, PYTHON_SOURCE_MAX, &source, &len, &err) != PX_OK) {
        px__cli_fail("submit", &err);
        goto done;
    }
    const char *base = strrchr(file, '/');
    json_t *src = json_stringn(source, len);
    if (!src) {
        fprintf(stderr, "plexus submit: %s is not UTF-8 text\n", file);
        goto done;
    }
    py = json_pack("{s:s, s:o, s:s}", "filename", base ? base + 1 : file, "source", src, "function",
                   function);
    if (py && s->args) {
        json_error_t je;
        json_t *args = json_loads(s->args, JSON_DECODE_ANY, &je);
        if (!args) {
            px__cli_usage_error("submit", "--args is not JSON: %s (column %d)", je.text, je.column);
            json_decref(py);
            py = NULL;
            goto done;
        }
        json_object_set_new(py, "args", args);
    }
done:
    free(source);
    free(file);
    free(function);
    return py;
}

/* Reads -f FILE into s->spec: a JSON object, the job specification. */
static int read_spec_file(submit_opts *s)
{
    char *text = NULL;
    size_t len;
    px_err err;
    if (px_read_file(s->file, 4u << 20, &text, &len, &err) != PX_OK)
        return px__cli_fail("submit", &err);
    json_error_t je;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!doc) {
        fprintf(stderr, "plexus submit: %s:%d:%d: %s: fix the JSON syntax\n", s->file, je.line,
                je.column, je.text);
        return PX_EXIT_FAIL;
    }
    if (!json_is_object(doc)) {
        fprintf(stderr,
                "plexus submit: %s: not a job specification: give a JSON object with "
                "\"command\" or \"python\" (docs/formats/fleet-api.md)\n",
                s->file);
        json_decref(doc);
        return PX_EXIT_FAIL;
    }
    /* A model named by its path is uploaded, as --model FILE is. */
    const char *model = json_string_value(json_object_get(doc, "model"));
    if (model && !s->model) {
        s->model = px_strdup(model);
        s->model_owned = (char *)s->model;
    }
    if (model)
        json_object_del(doc, "model");
    json_t *res = json_object_get(doc, "resources");
    if (res && !json_is_object(res)) {
        fprintf(stderr, "plexus submit: %s: resources: give an object (cpus, memory, gpus, ...)\n",
                s->file);
        json_decref(doc);
        return PX_EXIT_FAIL;
    }
    if (res)
        json_object_update(s->resources, res);
    json_object_del(doc, "resources");
    json_object_update(s->spec, doc);
    json_decref(doc);
    return PX_EXIT_OK;
}

/* Appends the list's values to the array member `key` (made when missing). */
static int add_list(json_t *spec, const char *key, const px_cli_list *l)
{
    if (!l->n)
        return PX_EXIT_OK;
    json_t *arr = json_object_get(spec, key);
    if (arr && !json_is_array(arr))
        return px__cli_usage_error("submit", "the specification's %s is not an array", key);
    if (!arr)
        json_object_set_new(spec, key, arr = json_array());
    for (size_t i = 0; i < l->n; i++)
        json_array_append_new(arr, json_string(l->v[i]));
    return PX_EXIT_OK;
}

/* Puts what the options say into the spec, over what -f gave. */
static int build(submit_opts *s)
{
    json_t *spec = s->spec, *res = s->resources;
    int rc;
    if (s->file && (rc = read_spec_file(s)) != PX_EXIT_OK)
        return rc;
    if (s->cpus > 0)
        json_object_set_new(res, "cpus", json_real(s->cpus));
    if (s->mem)
        json_object_set_new(res, "memory", json_string(s->mem));
    if (s->seen_gpus)
        json_object_set_new(res, "gpus", json_integer(s->gpus));
    if (s->gpu_mem)
        json_object_set_new(res, "gpu_memory", json_string(s->gpu_mem));
    if (s->vendor)
        json_object_set_new(res, "vendor", json_string(s->vendor));
    if (s->capability)
        json_object_set_new(res, "capability", json_string(s->capability));
    if (s->name)
        json_object_set_new(spec, "name", json_string(s->name));
    if (s->shell)
        json_object_set_new(spec, "shell", json_true());
    if (s->plan)
        json_object_set_new(spec, "plan", json_string(s->plan));
    if (s->seen_nodes)
        json_object_set_new(spec, "nodes", json_integer(s->nodes));
    if (s->launcher)
        json_object_set_new(spec, "launcher", json_string(s->launcher));
    if (s->on_failure)
        json_object_set_new(spec, "on_member_failure", json_string(s->on_failure));
    if (s->seen_attempts)
        json_object_set_new(spec, "max_attempts", json_integer(s->max_attempts));
    if (s->time_limit_s > 0)
        json_object_set_new(spec, "time_limit_s", json_real(s->time_limit_s));
    if ((rc = add_list(spec, "frameworks", &s->frameworks)) != PX_EXIT_OK ||
        (rc = add_list(spec, "artifacts", &s->artifacts)) != PX_EXIT_OK)
        return rc;
    if (s->env.n) {
        json_t *env = json_object_get(spec, "env");
        if (env && !json_is_object(env))
            return px__cli_usage_error("submit", "the specification's env is not an object");
        if (!env)
            json_object_set_new(spec, "env", env = json_object());
        for (size_t i = 0; i < s->env.n; i++) {
            const char *v = s->env.v[i], *eq = strchr(v, '=');
            if (!eq || eq == v)
                return px__cli_usage_error("submit", "--env takes K=V, not \"%s\"", v);
            char *k = px_strndup(v, (size_t)(eq - v));
            if (!k)
                return px__cli_usage_error("submit", "out of memory");
            json_object_set_new(env, k, json_string(eq + 1));
            free(k);
        }
    }
    return PX_EXIT_OK;
}

static const char *terminal_states[] = {"succeeded", "failed", "cancelled"};

static bool is_terminal(const char *state)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(terminal_states); i++)
        if (state && !strcmp(state, terminal_states[i]))
            return true;
    return false;
}

/* Polls the job until it ends; prints the outcome. */
static int wait_for(submit_opts *s, px_fleet_client *c, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    uint64_t deadline = px_now_ns() + (uint64_t)((s->timeout_s > 0 ? s->timeout_s : 600) * 1e9);
    int delay_ms = 20;
    for (;;) {
        json_t *job = px__fleet_cli_get(&s->o, c, "GET", path, NULL);
        if (!job)
            return PX_EXIT_FAIL;
        const char *state = px__fleet_cli_str(job, "state", "?");
        if (is_terminal(state)) {
            int rc = strcmp(state, "succeeded") ? PX_EXIT_FAIL : PX_EXIT_OK;
            if (s->o.format != PX_CLI_TEXT) {
                px__fleet_cli_print(&s->o, job);
            } else {
                printf("%s %s", id, state);
                json_t *ec = json_object_get(job, "exit_code");
                if (json_is_integer(ec))
                    printf(" (exit %lld)", (long long)json_integer_value(ec));
                printf("\n");
                json_t *result = json_object_get(job, "result");
                if (result && !json_is_null(result)) {
                    char *text = json_dumps(result, JSON_ENCODE_ANY | JSON_COMPACT);
                    printf("result: %s\n", text ? text : "?");
                    free(text);
                }
                const char *e = px__fleet_cli_str(job, "error", NULL);
                if (e)
                    printf("error: %s\n", e);
            }
            json_decref(job);
            return rc;
        }
        if (px_now_ns() > deadline) {
            /* state points into job: print before letting it go. */
            fprintf(stderr, "plexus submit: %s is still %s after the --timeout; it keeps running\n",
                    id, state);
            json_decref(job);
            return PX_EXIT_FAIL;
        }
        json_decref(job);
        struct timespec ts = {0, (long)delay_ms * 1000000L};
        nanosleep(&ts, NULL);
        delay_ms = PX_MIN(delay_ms * 2, 500);
    }
}

/* POSTs the job with an idempotency key, retrying while the server cannot
 * be reached or answers that it cannot store now: a retry that reaches a
 * server which had already taken the job returns that job, never a
 * second one. */
static json_t *post_job(submit_opts *s, px_fleet_client *c)
{
    char key[80];
    px_err err;
    if (s->idem_key) {
        px_strlcpy(key, s->idem_key, sizeof key);
    } else {
        unsigned char b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
            fprintf(stderr, "plexus submit: cannot read random bytes: %s\n", strerror(errno));
            return NULL;
        }
        memcpy(key, "submit-", 8);
        for (size_t i = 0; i < sizeof b; i++)
            snprintf(key + 7 + 2 * i, 3, "%02x", b[i]);
    }
    if (px_fleet_client_set_idempotency_key(c, key, &err) != PX_OK) {
        px__cli_usage_error("submit", "--idempotency-key: %s", err.msg);
        return NULL;
    }
    json_t *reply = NULL;
    int delay_ms = 200;
    for (int attempt = 0;; attempt++) {
        long code = 0;
        px_status st = px_fleet_client_call(c, "POST", "/v1/jobs", s->spec, &code, &reply, &err);
        if (st == PX_OK)
            break;
        bool again = code == 0 || code == 500 || code == 502 || code == 503 || code == 504;
        if (!again || attempt >= 6) {
            px__cli_fail("submit", &err);
            if (code == 401 && !s->o.token[0] && !getenv("PLEXUS_TOKEN"))
                fprintf(stderr, "plexus submit: no API token was given: use --token-file FILE or "
                                "set PLEXUS_TOKEN\n");
            reply = NULL;
            break;
        }
        struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        delay_ms *= 2;
    }
    (void)px_fleet_client_set_idempotency_key(c, NULL, NULL); /* clearing cannot fail */
    return reply;
}

int px__cmd_submit(int argc, char **argv)
{
    S = (submit_opts){.o = {.cmd = "submit"}};
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&submit_spec, argc, argv, &args, &rc))
        return rc;
    submit_opts s = S;
    s.spec = json_object();
    s.resources = json_object();
    px_fleet_client *c = NULL;
    json_t *reply = NULL;
    if (!s.spec || !s.resources) {
        fprintf(stderr, "plexus submit: out of memory\n");
        rc = PX_EXIT_FAIL;
        goto done;
    }
    if ((rc = build(&s)) != PX_EXIT_OK)
        goto done;
    rc = PX_EXIT_USAGE;
    int n_cmd = args.n;
    bool file_cmd = json_object_get(s.spec, "command") != NULL,
         file_py = json_object_get(s.spec, "python") != NULL;
    if ((s.python || file_py) && (n_cmd > 0 || file_cmd)) {
        px__cli_usage_error("submit", "give either --python or a command, not both");
        goto done;
    }
    if (!s.python && !file_py && n_cmd == 0 && !file_cmd) {
        px__cli_usage_error("submit", "nothing to run: give a command (after the options or "
                                      "\"--\"), --python, or -f SPEC.json");
        goto done;
    }
    if (s.args && !s.python) {
        px__cli_usage_error("submit", "--args goes with --python FILE.py:FUNCTION");
        goto done;
    }
    if (json_is_true(json_object_get(s.spec, "shell")) && n_cmd > 1) {
        px__cli_usage_error("submit", "--shell takes the command as one string");
        goto done;
    }
    if ((s.port || s.health) && !s.service) {
        px__cli_usage_error("submit", "--port and --health go with --service");
        goto done;
    }
    if (s.service && !s.port) {
        px__cli_usage_error("submit", "--service needs --port N");
        goto done;
    }
    if (json_object_size(s.resources))
        json_object_set(s.spec, "resources", s.resources);
    if (n_cmd > 0) {
        json_t *cmd = json_array();
        for (int i = 0; i < args.n; i++)
            json_array_append_new(cmd, json_string(args.v[i]));
        json_object_set_new(s.spec, "command", cmd);
    }
    if (s.service) {
        json_t *svc = json_pack("{s:i}", "port", (int)s.port);
        if (s.health && s.health[0] == '/')
            json_object_set_new(svc, "health_path", json_string(s.health));
        else if (s.health)
            json_object_set_new(svc, "health_command",
                                json_pack("[s, s, s]", "/bin/sh", "-c", s.health));
        json_object_set_new(s.spec, "service", svc);
    }
    rc = PX_EXIT_FAIL;
    if (s.python) {
        json_t *py = python_member(&s);
        if (!py)
            goto done;
        json_object_set_new(s.spec, "python", py);
    }
    if (!(c = px__fleet_cli_connect(&s.o)))
        goto done;
    if (s.model) {
        json_t *m = px__fleet_cli_model(&s.o, c, s.model);
        if (!m)
            goto done;
        json_object_set_new(s.spec, "model", m);
    }
    if (!(reply = post_job(&s, c)))
        goto done;
    /* Warnings (a gang larger than the fleet, ...) go to stderr. */
    size_t wi;
    json_t *w;
    json_array_foreach(json_object_get(reply, "warnings"), wi, w) fprintf(
        stderr, "plexus submit: warning: %s\n", json_string_value(w) ? json_string_value(w) : "?");
    const char *id = px__fleet_cli_str(reply, "id", NULL);
    if (!id || !px__fleet_cli_valid_id(id)) {
        fprintf(stderr, "plexus submit: the server's reply has no job id\n");
        goto done;
    }
    if (s.wait) {
        if (s.o.format == PX_CLI_TEXT)
            printf("submitted %s\n", id);
        fflush(stdout);
        rc = wait_for(&s, c, id);
        goto done;
    }
    if (s.o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&s.o, reply);
    else {
        printf("submitted %s (%s, attempt %lld)\n", id, px__fleet_cli_str(reply, "state", "?"),
               (long long)json_integer_value(json_object_get(reply, "attempt")));
        rc = PX_EXIT_OK;
    }
done:
    json_decref(reply);
    px_fleet_client_free(c);
    px__fleet_cli_release(&s.o);
    json_decref(s.spec);
    json_decref(s.resources);
    free(s.model_owned);
    return rc;
}
