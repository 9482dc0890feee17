/* plexus submit: send a command, a Python function, a distributed job or a
 * service to the fleet. */
#include "cli/fleet_cli.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

const char px__cmd_submit_summary[] =
    "submit a command, Python function, distributed job or service to the fleet";

#define PYTHON_SOURCE_MAX (1u << 20)

static void usage(FILE *f)
{
    fprintf(f, "usage: plexus submit [options] -- CMD [ARGS...]\n"
               "       plexus submit [options] --python FILE.py:FUNCTION [--args JSON]\n"
               "\n"
               "resources (per member):\n"
               "  --cpus N                 CPU cores (default 1)\n"
               "  --mem SIZE               host memory, e.g. 8GiB\n"
               "  --gpus N                 whole GPUs\n"
               "  --gpu-mem SIZE           free memory each GPU must have, e.g. 16GiB\n"
               "  --vendor V               GPU vendor (nvidia, amd, intel, ...)\n"
               "  --capability SPEC        GPU capability, e.g. '>=8.0'\n"
               "  --framework F            required framework with an optional PEP 440\n"
               "                           specifier: 'torch>=2.1', 'torch.cuda' (repeatable)\n"
               "inputs and outputs:\n"
               "  --model FILE|DIGEST      a model the job reads; a file is uploaded first;\n"
               "                           the job finds it at $PLEXUS_MODEL\n"
               "  --plan auto              ask the planner for a plan for --model\n"
               "  --artifact PATH          a file (relative to the job's folder) to keep\n"
               "                           when the job ends (repeatable)\n"
               "  --env K=V                an environment variable (repeatable)\n"
               "  --name N                 a name shown in listings\n"
               "  --shell                  run CMD (one string) with /bin/sh -c\n"
               "  --args JSON              with --python: an object is the keyword\n"
               "                           arguments, an array the positional ones\n"
               "                           ('[2, 3]' calls FUNCTION(2, 3)), else one\n"
               "                           argument\n"
               "distributed jobs:\n"
               "  --nodes N                members, placed all or nothing\n"
               "  --launcher env|torchrun|mpi\n"
               "  --on-member-failure fail|restart\n"
               "services:\n"
               "  --service --port N [--health /PATH | --health 'CMD']\n"
               "  --max-attempts N         attempts when a node is lost (default 3)\n"
               "  --time-limit T           stop the job after T (90, 90s, 15m, 2h)\n"
               "  --idempotency-key K      a retried submit with the same K returns the\n"
               "                           same job (default: a fresh key, retried on\n"
               "                           network errors)\n"
               "output:\n"
               "  --wait                   wait for the job to end; print its result;\n"
               "                           exit 0 only when it succeeded\n"
               "  --timeout S              with --wait, give up after S seconds (default 600)\n"
               "  --server URL --token-file F --ca F -o text|json\n");
}

typedef struct submit_opts {
    px__fleet_cli o;
    json_t *spec;
    json_t *resources;
    const char *model;
    const char *python;
    const char *args;
    const char *health;
    long port;
    bool service;
    bool wait;
    double timeout_s;
    const char *idem_key;
} submit_opts;

/* "90", "90s", "15m", "2h" in seconds; 0 when malformed. */
static double parse_duration(const char *v)
{
    char *end;
    double x = strtod(v, &end);
    double unit = !strcmp(end, "") || !strcmp(end, "s") ? 1
                  : !strcmp(end, "m")                   ? 60
                  : !strcmp(end, "h")                   ? 3600
                  : !strcmp(end, "d")                   ? 86400
                                                        : 0;
    return end == v || !(x > 0) ? 0 : x * unit;
}

static bool parse_count(const char *cmd, const char *opt, const char *v, long lo, long hi,
                        long *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) {
        px__cli_usage_error(cmd, "%s takes a whole number from %ld to %ld, not \"%s\"", opt, lo, hi,
                            v);
        return false;
    }
    *out = n;
    return true;
}

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

static bool add_quantity(submit_opts *s, const char *key, const char *opt, const char *v)
{
    px_qty q;
    px_err err;
    if (px_qty_parse(v, PX_DIM_BYTES, &q, &err) != PX_OK) {
        px__cli_usage_error("submit", "%s \"%s\": %s (e.g. 8GiB)", opt, v, err.msg);
        return false;
    }
    json_object_set_new(s->resources, key, json_string(v));
    return true;
}

static int parse(submit_opts *s, int argc, char **argv, int *cmd_start)
{
    json_t *spec = s->spec, *res = s->resources;
    json_t *frameworks = json_array(), *artifacts = json_array(), *env = json_object();
    json_object_set_new(spec, "frameworks", frameworks);
    json_object_set_new(spec, "artifacts", artifacts);
    json_object_set_new(spec, "env", env);
    *cmd_start = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = px__fleet_cli_common(&s->o, argc, argv, &i);
        if (r < 0)
            return PX_EXIT_USAGE;
        if (r > 0)
            continue;
        if (!strcmp(a, "--")) {
            *cmd_start = i + 1;
            break;
        }
        if (!strcmp(a, "--shell")) {
            json_object_set_new(spec, "shell", json_true());
            continue;
        }
        if (!strcmp(a, "--service")) {
            s->service = true;
            continue;
        }
        if (!strcmp(a, "--wait")) {
            s->wait = true;
            continue;
        }
        if (a[0] != '-')
            return px__cli_usage_error(
                "submit", "unexpected argument \"%s\"; put the command after \"--\"", a);
        const char *v = px__fleet_cli_value(&s->o, argc, argv, &i);
        if (!v)
            return PX_EXIT_USAGE;
        long n;
        if (!strcmp(a, "--cpus")) {
            char *end;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0) || d > 4096)
                return px__cli_usage_error("submit", "--cpus takes a number > 0, not \"%s\"", v);
            json_object_set_new(res, "cpus", json_real(d));
        } else if (!strcmp(a, "--mem") || !strcmp(a, "--memory")) {
            if (!add_quantity(s, "memory", a, v))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--gpus")) {
            if (!parse_count("submit", a, v, 0, 64, &n))
                return PX_EXIT_USAGE;
            json_object_set_new(res, "gpus", json_integer(n));
        } else if (!strcmp(a, "--gpu-mem")) {
            if (!add_quantity(s, "gpu_memory", a, v))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--vendor")) {
            json_object_set_new(res, "vendor", json_string(v));
        } else if (!strcmp(a, "--capability")) {
            json_object_set_new(res, "capability", json_string(v));
        } else if (!strcmp(a, "--framework")) {
            json_array_append_new(frameworks, json_string(v));
        } else if (!strcmp(a, "--model")) {
            s->model = v;
        } else if (!strcmp(a, "--plan")) {
            if (strcmp(v, "auto"))
                return px__cli_usage_error("submit", "--plan takes \"auto\", not \"%s\"", v);
            json_object_set_new(spec, "plan", json_string(v));
        } else if (!strcmp(a, "--artifact")) {
            json_array_append_new(artifacts, json_string(v));
        } else if (!strcmp(a, "--env")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v)
                return px__cli_usage_error("submit", "--env takes K=V, not \"%s\"", v);
            char *k = px_strndup(v, (size_t)(eq - v));
            json_object_set_new(env, k, json_string(eq + 1));
            free(k);
        } else if (!strcmp(a, "--name")) {
            json_object_set_new(spec, "name", json_string(v));
        } else if (!strcmp(a, "--python")) {
            s->python = v;
        } else if (!strcmp(a, "--args")) {
            s->args = v;
        } else if (!strcmp(a, "--nodes")) {
            if (!parse_count("submit", a, v, 1, 1024, &n))
                return PX_EXIT_USAGE;
            json_object_set_new(spec, "nodes", json_integer(n));
        } else if (!strcmp(a, "--launcher")) {
            if (strcmp(v, "env") && strcmp(v, "torchrun") && strcmp(v, "mpi"))
                return px__cli_usage_error("submit", "--launcher takes env, torchrun or mpi");
            json_object_set_new(spec, "launcher", json_string(v));
        } else if (!strcmp(a, "--on-member-failure")) {
            if (strcmp(v, "fail") && strcmp(v, "restart"))
                return px__cli_usage_error("submit", "--on-member-failure takes fail or restart");
            json_object_set_new(spec, "on_member_failure", json_string(v));
        } else if (!strcmp(a, "--port")) {
            if (!parse_count("submit", a, v, 1, 65535, &s->port))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--health")) {
            s->health = v;
        } else if (!strcmp(a, "--max-attempts")) {
            if (!parse_count("submit", a, v, 1, 100, &n))
                return PX_EXIT_USAGE;
            json_object_set_new(spec, "max_attempts", json_integer(n));
        } else if (!strcmp(a, "--time-limit")) {
            double t = parse_duration(v);
            if (!(t >= 1) || t > 30 * 86400.0)
                return px__cli_usage_error("submit",
                                           "--time-limit takes 1s to 30d (90, 90s, 15m, 2h), not "
                                           "\"%s\"",
                                           v);
            json_object_set_new(spec, "time_limit_s", json_real(t));
        } else if (!strcmp(a, "--idempotency-key")) {
            s->idem_key = v;
        } else if (!strcmp(a, "--timeout")) {
            char *end;
            s->timeout_s = strtod(v, &end);
            if (end == v || *end || !(s->timeout_s > 0))
                return px__cli_usage_error("submit", "--timeout takes seconds > 0");
        } else {
            return px__cli_usage_error("submit", "unknown option \"%s\"", a);
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
            if (s->o.format == PX_CLI_JSON) {
                px__cli_print_json(job);
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
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    submit_opts s = {.o = {.cmd = "submit"}, .spec = json_object(), .resources = json_object()};
    px_fleet_client *c = NULL;
    json_t *reply = NULL;
    int cmd_start, rc = parse(&s, argc, argv, &cmd_start);
    if (rc != PX_EXIT_OK)
        goto done;
    rc = PX_EXIT_USAGE;
    int n_cmd = argc - cmd_start;
    if (s.python && n_cmd > 0) {
        px__cli_usage_error("submit", "give either --python or a command after \"--\", not both");
        goto done;
    }
    if (!s.python && n_cmd == 0) {
        px__cli_usage_error("submit", "nothing to run: give a command after \"--\" or --python");
        goto done;
    }
    if (s.args && !s.python) {
        px__cli_usage_error("submit", "--args goes with --python FILE.py:FUNCTION");
        goto done;
    }
    if (json_is_true(json_object_get(s.spec, "shell")) && n_cmd != 1) {
        px__cli_usage_error("submit", "--shell takes the command as one string after \"--\"");
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
        for (int i = cmd_start; i < argc; i++)
            json_array_append_new(cmd, json_string(argv[i]));
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
        if (s.o.format != PX_CLI_JSON)
            printf("submitted %s\n", id);
        fflush(stdout);
        rc = wait_for(&s, c, id);
        goto done;
    }
    if (s.o.format == PX_CLI_JSON)
        rc = px__cli_print_json(reply);
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
    return rc;
}
