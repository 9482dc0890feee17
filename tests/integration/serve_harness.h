/*
 * A real `plexus serve` for integration tests: started on 127.0.0.1 with
 * an ephemeral port and an API key file, stopped with SIGTERM (killed,
 * with its process group, when it does not stop); requests through the
 * curl command and the official OpenAI client (node, tests/node).
 * Included by tests/integration/test_serve_*.c (static helpers).
 */
#ifndef PX_SERVE_HARNESS_H
#define PX_SERVE_HARNESS_H

#include "px_test.h"

#include "base/common.h"

#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SH_KEY "serve-test-key-0123456789abcdef"

typedef struct sh_server {
    pid_t pid;
    char addr[64]; /* 127.0.0.1:PORT */
    char url[96];  /* http://127.0.0.1:PORT/v1 */
    char *log;     /* its stderr, a file */
    char *key_file;
} sh_server;

static char *sh_key_file(void)
{
    char *path = px_asprintf("%s/api.key", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_write_file(path, SH_KEY "\n", strlen(SH_KEY) + 1, &err), &err);
    chmod(path, 0600);
    return path;
}

/* Starts `plexus serve ARGS --listen 127.0.0.1:0 --api-key-file K` and
 * waits for its "listening on" line. */
static void sh_start(sh_server *s, const char *const *args)
{
    memset(s, 0, sizeof *s);
    s->key_file = sh_key_file();
    static int n_logs;
    s->log = px_asprintf("%s/serve-%d.log", px_test_tmpdir(), ++n_logs);
    const char *argv[64];
    size_t n = 0;
    argv[n++] = px_test_plexus_bin();
    argv[n++] = "serve";
    for (size_t i = 0; args[i] && n < 56; i++)
        argv[n++] = args[i];
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--api-key-file";
    argv[n++] = s->key_file;
    argv[n] = NULL;
    int out[2];
    assert_int_equal(pipe(out), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        int log = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(out[1], 1);
        if (log >= 0)
            dup2(log, 2);
        close(out[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    s->pid = pid;
    char buf[4096];
    size_t len = 0;
    uint64_t deadline = px_now_ns() + 120ull * 1000000000ull;
    for (;;) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        int left = (int)((deadline - px_now_ns()) / 1000000);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t r = read(out[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = 0;
        const char *at = strstr(buf, "listening on ");
        const char *nl = at ? strchr(at, '\n') : NULL;
        if (nl) {
            size_t k = (size_t)(nl - at - 13);
            memcpy(s->addr, at + 13, PX_MIN(k, sizeof s->addr - 1));
            break;
        }
    }
    close(out[0]);
    if (!s->addr[0]) {
        char *log = NULL;
        size_t ll;
        (void)px_read_file(s->log, 1 << 20, &log, &ll, NULL); /* the log may be absent */
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("plexus serve did not start:\n%s", log ? log : "(no log)");
    }
    snprintf(s->url, sizeof s->url, "http://%s/v1", s->addr);
}

/* Stops the server: SIGTERM, then the process group is killed. */
static int sh_stop(sh_server *s)
{
    int status = -1;
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 1500; i++) {
            if (waitpid(s->pid, &status, WNOHANG) == s->pid)
                break;
            usleep(20000);
            if (i == 1499) {
                kill(-s->pid, SIGKILL);
                waitpid(s->pid, &status, 0);
            }
        }
        kill(-s->pid, SIGKILL);
    }
    s->pid = 0;
    free(s->log);
    free(s->key_file);
    return status;
}

/* curl: returns the body (owned) and *status; extra are more curl
 * arguments (NULL-terminated).  path is under the server ("/v1/models"). */
static inline char *sh_curl(const sh_server *s, const char *method, const char *path,
                            const char *body, bool with_key, int *status, const char *const *extra)
{
    char url[256], auth[128];
    snprintf(url, sizeof url, "http://%s%s", s->addr, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", SH_KEY);
    const char *argv[40];
    size_t n = 0;
    argv[n++] = "curl";
    argv[n++] = "-sS";
    argv[n++] = "-N";
    argv[n++] = "-X";
    argv[n++] = method;
    argv[n++] = "-w";
    argv[n++] = "\n%{http_code}";
    if (with_key)
        argv[n++] = "-H", argv[n++] = auth;
    if (body) {
        argv[n++] = "-H";
        argv[n++] = "Content-Type: application/json";
        argv[n++] = "--data-binary";
        argv[n++] = body;
    }
    for (size_t i = 0; extra && extra[i] && n < 36; i++)
        argv[n++] = extra[i];
    argv[n++] = url;
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = px_test_run((char *const *)argv, 120, &out, &err);
    if (rc != 0 && rc != 28)
        fail_msg("curl %s %s exited %d: %s", method, path, rc, err ? err : "");
    free(err);
    char *nl = out ? strrchr(out, '\n') : NULL;
    *status = nl ? (int)strtol(nl + 1, NULL, 10) : 0;
    if (nl)
        *nl = 0;
    return out;
}

static json_t *sh_json(const char *text)
{
    json_t *v = NULL;
    px_err err;
    if (!text || px_json_parse(text, strlen(text), "response", NULL, &v, &err) != PX_OK)
        fail_msg("not JSON (%s):\n%s", err.msg, text ? text : "(null)");
    return v;
}

/* Whether the OpenAI client is installed (scripts/install-deps). */
static inline bool sh_have_node_client(void)
{
    char *mod = px_test_source_path("tests/node/node_modules/openai/package.json");
    bool ok = access(mod, R_OK) == 0;
    free(mod);
    return ok;
}

/* Runs tests/node/serve_client.mjs MODE ARGS against the server; returns
 * its JSON document. */
static inline json_t *sh_node(const sh_server *s, const char *const *args, const char *prompts)
{
    char *script = px_test_source_path("tests/node/serve_client.mjs");
    const char *argv[16];
    size_t n = 0;
    argv[n++] = "node";
    argv[n++] = script;
    for (size_t i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    setenv("PLEXUS_URL", s->url, 1);
    setenv("PLEXUS_KEY", SH_KEY, 1);
    if (prompts)
        setenv("PLEXUS_PROMPTS", prompts, 1);
    else
        unsetenv("PLEXUS_PROMPTS");
    char *out = NULL, *err = NULL;
    int rc = px_test_run((char *const *)argv, 300, &out, &err);
    if (rc != 0)
        fail_msg("node serve_client.mjs %s exited %d:\n%s\n%s", args[0], rc, err ? err : "",
                 out ? out : "");
    free(err);
    free(script);
    json_t *v = sh_json(out);
    free(out);
    return v;
}

static inline const char *sh_str(const json_t *o, const char *path)
{
    const json_t *v = o;
    char key[64];
    while (path && *path && v) {
        const char *dot = strchr(path, '.');
        size_t k = dot ? (size_t)(dot - path) : strlen(path);
        memcpy(key, path, PX_MIN(k, sizeof key - 1));
        key[PX_MIN(k, sizeof key - 1)] = 0;
        v = json_object_get(v, key);
        path = dot ? dot + 1 : NULL;
    }
    return json_string_value(v);
}

static inline json_int_t sh_int(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    return json_integer_value(v);
}

/* A metric's value from Prometheus text (the first line naming it), NAN
 * when absent. */
static inline double sh_metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = text; line && *line;) {
        if (!strncmp(line, name, n) && (line[n] == ' ' || line[n] == '{')) {
            const char *sp = strchr(line, ' ');
            return sp ? strtod(sp + 1, NULL) : NAN;
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return NAN;
}

#endif
