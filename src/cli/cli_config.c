/* The config file on disk: where it is, reading it only when private,
 * writing it with mode 0600 (cli_config.h). */
#include "cli/cli_config.h"

#include "fleet/secret_impl.h"

#include "cli/cli.h"

px_status px__cli_config_path(char *buf, size_t n, px_err *err)
{
    const char *env = getenv("PLEXUS_CONFIG"), *xdg = getenv("XDG_CONFIG_HOME"),
               *home = getenv("HOME");
    int w;
    if (env && env[0])
        w = snprintf(buf, n, "%s", env);
    else if (xdg && xdg[0] == '/')
        w = snprintf(buf, n, "%s/plexus/config.json", xdg);
    else if (home && home[0])
        w = snprintf(buf, n, "%s/.config/plexus/config.json", home);
    else
        return px_err_set(err, PX_ENOTFOUND,
                          "no config file: neither PLEXUS_CONFIG, XDG_CONFIG_HOME nor HOME is set");
    if (w < 0 || (size_t)w >= n)
        return px_err_set(err, PX_ELIMIT, "the config file's path is longer than %zu bytes", n - 1);
    return PX_OK;
}

px_status px__cli_config_load(px__cli_config *out, bool *exists, char *path, size_t path_n,
                              px_err *err)
{
    memset(out, 0, sizeof *out);
    *exists = false;
    px_status st = px__cli_config_path(path, path_n, err);
    if (st != PX_OK)
        return st;
    char *text = NULL;
    size_t len = 0;
    st = px__secret_read_file(path, "config", 1u << 20, &text, &len, err);
    if (st == PX_ENOTFOUND) {
        px_err_clear(err);
        return PX_OK;
    }
    if (st == PX_OK) {
        *exists = true;
        st = px__cli_config_parse(text, len, path, out, err);
    }
    free(text);
    return st;
}

px_status px__cli_config_save(const px__cli_config *c, px_err *err)
{
    char path[1024];
    px_status st = px__cli_config_path(path, sizeof path, err);
    if (st != PX_OK)
        return st;
    /* The folder of the default place may not exist yet (~/.config/plexus). */
    char *slash = strrchr(path, '/');
    if (slash && slash != path && !getenv("PLEXUS_CONFIG")) {
        *slash = 0;
        char *parent = strrchr(path, '/');
        if (parent && parent != path) {
            *parent = 0;
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                return px_err_set(err, PX_EIO, "%s: cannot create the folder: %s", path,
                                  strerror(errno));
            *parent = '/';
        }
        if ((st = px__private_dir(path, err)) != PX_OK)
            return st;
        *slash = '/';
    }
    json_t *doc = px__cli_config_to_json(c);
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_strbuf sb = PX_STRBUF_INIT;
    if (px_strbuf_addf(&sb, "%s\n", text) != PX_OK)
        st = px_err_set(err, PX_ENOMEM, "out of memory");
    else
        st = px__secret_write_file(path, sb.buf, sb.len, err);
    px_strbuf_release(&sb);
    free(text);
    return st;
}

px_status px__cli_config_context(const char *name, px__cli_context *out, px_err *err)
{
    px__cli_config *c = calloc(1, sizeof *c);
    if (!c)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    char path[1024];
    bool exists;
    px_status st = px__cli_config_load(c, &exists, path, sizeof path, err);
    if (st != PX_OK)
        goto done;
    const char *want = name ? name : c->current;
    if (!want[0]) {
        st = px_err_set(err, PX_ENOTFOUND,
                        "%s: no current context: pick one with plexus config "
                        "use-context NAME",
                        path);
        goto done;
    }
    px__cli_context *x = px__cli_config_find(c, want);
    if (!x) {
        px_strbuf names = PX_STRBUF_INIT;
        for (size_t i = 0; i < c->n; i++)
            px_strbuf_addf(&names, "%s%s", i ? ", " : " (it has ", c->v[i].name);
        st = px_err_set(err, PX_ENOTFOUND,
                        "no context \"%s\" in %s%s%s: make it with plexus config set-context %s "
                        "--server URL",
                        want, path, names.len ? names.buf : "", names.len ? ")" : "", want);
        px_strbuf_release(&names);
        goto done;
    }
    *out = *x;
done:
    free(c);
    return st;
}
