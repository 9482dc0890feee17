/* Helpers shared by the fleet client commands. */
#include "cli/fleet_cli.h"

int px__fleet_cli_common(px__fleet_cli *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--server")) {
        if (!(o->server = px__fleet_cli_value(o, argc, argv, i)))
            return -1;
        return 1;
    }
    if (!strcmp(a, "--token")) {
        if (!(o->token = px__fleet_cli_value(o, argc, argv, i)))
            return -1;
        return 1;
    }
    if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
        const char *v = px__fleet_cli_value(o, argc, argv, i);
        if (!v || !px__cli_parse_format(o->cmd, v, &o->format))
            return -1;
        o->format_given = true;
        return 1;
    }
    return 0;
}

const char *px__fleet_cli_value(const px__fleet_cli *o, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        px__cli_usage_error(o->cmd, "%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

px_fleet_client *px__fleet_cli_connect(px__fleet_cli *o)
{
    if (!o->server)
        o->server = getenv("PLEXUS_SERVER");
    if (!o->server || !o->server[0])
        o->server = "http://127.0.0.1:7070";
    if (!o->token)
        o->token = getenv("PLEXUS_TOKEN");
    px_fleet_client *c;
    px_err err;
    if (px_fleet_client_new(o->server, o->token, &c, &err) != PX_OK) {
        px__cli_fail(o->cmd, &err);
        return NULL;
    }
    return c;
}

json_t *px__fleet_cli_get(px__fleet_cli *o, px_fleet_client *c, const char *method,
                          const char *path, const json_t *body)
{
    json_t *reply = NULL;
    px_err err;
    long code = 0;
    if (px_fleet_client_call(c, method, path, body, &code, &reply, &err) != PX_OK) {
        px__cli_fail(o->cmd, &err);
        if (code == 401 && !o->token)
            fprintf(stderr, "plexus %s: no API token was given: use --token or set PLEXUS_TOKEN\n",
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
