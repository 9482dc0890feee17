/* Helpers shared by the fleet client commands. */
#include "cli/fleet_cli.h"

#include "cli/cli_config.h"

#include <unistd.h>

extern char **environ;

px_status px__fleet_cli_refuse_token(const char *value, void *dest, px_err *err)
{
    (void)value;
    (void)dest;
    return px_err_set(err, PX_EINVAL,
                      "is refused: a token on the command line is visible to every user of this "
                      "machine (ps); put it in a file only you can read (chmod 600) and give "
                      "--token-file FILE, set PLEXUS_TOKEN, or name the file in a context "
                      "(plexus config set-context)");
}

int px__fleet_cli_print(const px__fleet_cli *o, const json_t *reply)
{
    return px__cli_print_doc(reply, o->format);
}

/* Fills what the options left unset: the context --context names, the
 * environment, the current context, the defaults (fleet_cli.h). */
static bool resolve(px__fleet_cli *o)
{
    px__cli_context ctx;
    px_err err;
    px_err_clear(&err);
    bool named = o->context != NULL;
    px_status st = px__cli_config_context(o->context, &ctx, &err);
    if (st != PX_OK && (named || st != PX_ENOTFOUND)) {
        px__cli_fail(o->cmd, &err);
        return false;
    }
    bool have = st == PX_OK;
    px_strlcpy(o->ctx_server, have ? ctx.server : "", sizeof o->ctx_server);
    px_strlcpy(o->ctx_ca, have ? ctx.ca : "", sizeof o->ctx_ca);
    px_strlcpy(o->ctx_token_file, have ? ctx.token_file : "", sizeof o->ctx_token_file);
    const char *env_server = getenv("PLEXUS_SERVER"), *env_ca = getenv("PLEXUS_CA");
    if (!o->server && named && o->ctx_server[0])
        o->server = o->ctx_server;
    if (!o->server && env_server && env_server[0])
        o->server = env_server;
    if (!o->server && o->ctx_server[0])
        o->server = o->ctx_server;
    if (!o->server)
        o->server = "http://127.0.0.1:7070";
    if (!o->ca && named && o->ctx_ca[0])
        o->ca = o->ctx_ca;
    if (!o->ca && env_ca && env_ca[0])
        o->ca = env_ca;
    if (!o->ca && o->ctx_ca[0])
        o->ca = o->ctx_ca;
    const char *env_token = getenv("PLEXUS_TOKEN");
    if (!o->token_file && o->ctx_token_file[0] && (named || !env_token || !env_token[0]))
        o->token_file = o->ctx_token_file;
    return true;
}

px_fleet_client *px__fleet_cli_connect(px__fleet_cli *o)
{
    if (!resolve(o))
        return NULL;
    px_err err;
    if (o->token_file && !o->token[0]) {
        char *t;
        if (px_fleet_secret_read(o->token_file, "--token-file", &t, &err) != PX_OK) {
            px__cli_fail(o->cmd, &err);
            return NULL;
        }
        px_strlcpy(o->token, t, sizeof o->token);
        for (volatile char *p = t; *p; p++)
            *p = 0;
        free(t);
    }
    const char *token = o->token[0] ? o->token : getenv("PLEXUS_TOKEN");
    px_fleet_client *c;
    if (px_fleet_client_new(o->server, token, &c, &err) != PX_OK ||
        (o->ca && px_fleet_client_set_ca(c, o->ca, &err) != PX_OK)) {
        px__cli_fail(o->cmd, &err);
        return NULL;
    }
    if (px_str_starts_with(o->server, "https://") && !o->ca)
        px_log_debug("%s: no --ca: the server's certificate is checked against the system's "
                     "store",
                     o->cmd);
    return c;
}

void px__fleet_cli_release(px__fleet_cli *o)
{
    for (size_t i = 0; i < sizeof o->token; i++)
        ((volatile char *)o->token)[i] = 0;
}

json_t *px__fleet_cli_get(px__fleet_cli *o, px_fleet_client *c, const char *method,
                          const char *path, const json_t *body)
{
    json_t *reply = NULL;
    px_err err;
    long code = 0;
    if (px_fleet_client_call(c, method, path, body, &code, &reply, &err) != PX_OK) {
        px__cli_fail(o->cmd, &err);
        if (code == 401 && !o->token[0] && !getenv("PLEXUS_TOKEN"))
            fprintf(stderr,
                    "plexus %s: no API token was given: use --token-file FILE or set "
                    "PLEXUS_TOKEN\n",
                    o->cmd);
        return NULL;
    }
    return reply;
}

const char *px__fleet_cli_bytes(double bytes, char *buf, size_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t u = 0;
    while (bytes >= 1024 && u + 1 < PX_ARRAY_LEN(units)) {
        bytes /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.*f %s", bytes < 10 ? 1 : 0, bytes, units[u]);
    return buf;
}

bool px__fleet_cli_valid_id(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 128)
        return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return false;
    return true;
}

const char *px__fleet_cli_str(const json_t *obj, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : def;
}

const char *px__fleet_cli_clean(const char *text, char *buf, size_t n)
{
    size_t w = 0;
    const unsigned char *t = (const unsigned char *)(text ? text : "");
    for (size_t i = 0; t[i] && w + 1 < n; i++) {
        unsigned char c = t[i];
        /* C0 controls, DEL and the C1 controls (U+0080..U+009F, 0xC2 0x80..0x9F). */
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            buf[w++] = '?';
        } else if (c == 0xc2 && t[i + 1] >= 0x80 && t[i + 1] <= 0x9f) {
            buf[w++] = '?';
            i++;
        } else {
            buf[w++] = (char)c;
        }
    }
    buf[w] = '\0';
    return buf;
}

void px__cli_scrub_env(const char *name)
{
    size_t n = strlen(name);
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') {
            /* The bytes live in the environment block /proc/PID/environ
             * reads: overwrite them before unsetting the variable. */
            for (char *v = *e + n + 1; *v; v++)
                *(volatile char *)v = 'x';
        }
    unsetenv(name);
}

static bool is_digest(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return false;
    return true;
}

static void upload_progress(void *ud, uint64_t done, uint64_t total)
{
    const px__fleet_cli *o = ud;
    char a[32], b[32];
    if (total > 0)
        px__cli_progress(o->cmd, "uploading the model: %s of %s (%.0f%%)",
                         px__fleet_cli_bytes((double)done, a, sizeof a),
                         px__fleet_cli_bytes((double)total, b, sizeof b),
                         100.0 * (double)done / (double)total);
}

json_t *px__fleet_cli_model(px__fleet_cli *o, px_fleet_client *c, const char *model)
{
    if (is_digest(model) && access(model, F_OK) != 0)
        return json_pack("{s:s}", "digest", model);
    if (access(model, R_OK) != 0) {
        fprintf(stderr,
                "plexus %s: --model \"%s\": no such file, and not a SHA-256 digest (64 "
                "lowercase hex digits)\n",
                o->cmd, model);
        return NULL;
    }
    json_t *reply = NULL;
    px_err err;
    /* A model may take minutes to send: say how far it is (on a terminal). */
    px_fleet_client_set_progress(c, upload_progress, o);
    px_status st = px_fleet_client_send_file(c, "POST", "/v1/blobs", model, NULL, &reply, &err);
    px_fleet_client_set_progress(c, NULL, NULL);
    px__cli_progress_done();
    if (st != PX_OK) {
        px_err_prefix(&err, err.code, "uploading --model %s: ", model);
        px__cli_fail(o->cmd, &err);
        return NULL;
    }
    const char *digest = json_string_value(json_object_get(reply, "digest"));
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    json_t *m = digest ? json_pack("{s:s, s:s, s:O}", "digest", digest, "name", base, "size",
                                   json_object_get(reply, "size"))
                       : NULL;
    if (!m)
        fprintf(stderr, "plexus %s: the server's reply to the model upload has no digest\n",
                o->cmd);
    json_decref(reply);
    return m;
}

const char *px__fleet_cli_join(const json_t *arr, px_strbuf *out)
{
    size_t k;
    json_t *v;
    json_array_foreach(arr, k, v) px_strbuf_addf(out, "%s%s", k ? "," : "",
                                                 json_string_value(v) ? json_string_value(v) : "?");
    return out->len ? out->buf : "-";
}
