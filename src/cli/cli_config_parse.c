/* The config file's document: parsing with bounds, and writing it back
 * (cli_config.h).  Kept apart from the file handling so that the fuzz
 * target exercises the parser alone. */
#include "cli/cli_config.h"

#include <ctype.h>

bool px__cli_context_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > PX_CLI_CONTEXT_NAME_MAX)
        return false;
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_.@-", *c))
            return false;
    return true;
}

/* Copies the string member `key` of ctx (when present) into dst. */
static px_status member(const json_t *ctx, const char *key, size_t i, const char *path, char *dst,
                        size_t cap, px_err *err)
{
    const json_t *v = json_object_get(ctx, key);
    if (!v)
        return PX_OK;
    if (!json_is_string(v) || json_string_length(v) >= cap ||
        strlen(json_string_value(v)) != json_string_length(v))
        return px_err_set(err, PX_EINVAL,
                          "%s: contexts[%zu].%s: give a string of at most %zu bytes", path, i, key,
                          cap - 1);
    const char *s = json_string_value(v);
    if (strcmp(key, "server") && s[0] && s[0] != '/')
        return px_err_set(err, PX_EINVAL,
                          "%s: contexts[%zu].%s: \"%s\" is not an absolute path: give the "
                          "whole path (plexus config set-context makes it absolute)",
                          path, i, key, s);
    if (!strcmp(key, "server") && s[0] && !px_str_starts_with(s, "http://") &&
        !px_str_starts_with(s, "https://"))
        return px_err_set(err, PX_EINVAL,
                          "%s: contexts[%zu].server: \"%s\" is not a URL: give "
                          "http://HOST:PORT or https://HOST:PORT",
                          path, i, s);
    px_strlcpy(dst, s, cap);
    return PX_OK;
}

static px_status parse_context(const json_t *ctx, size_t i, const char *path, px__cli_context *out,
                               px_err *err)
{
    if (!json_is_object(ctx))
        return px_err_set(err, PX_EINVAL,
                          "%s: contexts[%zu]: give an object with name, server, "
                          "ca and token_file",
                          path, i);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ctx, key, v)
    {
        if (!strcmp(key, "token"))
            return px_err_set(err, PX_EINVAL,
                              "%s: contexts[%zu].token: a token is never kept in the config; "
                              "put it in a file only you can read (chmod 600) and name that "
                              "file with token_file",
                              path, i);
        if (strcmp(key, "name") && strcmp(key, "server") && strcmp(key, "ca") &&
            strcmp(key, "token_file"))
            return px_err_set(err, PX_EINVAL,
                              "%s: contexts[%zu]: unknown member \"%.64s\" (a context has name, "
                              "server, ca and token_file)",
                              path, i, key);
    }
    const char *name = json_string_value(json_object_get(ctx, "name"));
    if (!name || !px__cli_context_name_valid(name))
        return px_err_set(err, PX_EINVAL,
                          "%s: contexts[%zu].name: give a name of 1 to %d letters, digits and "
                          "_.@-",
                          path, i, PX_CLI_CONTEXT_NAME_MAX);
    px_strlcpy(out->name, name, sizeof out->name);
    px_status st;
    if ((st = member(ctx, "server", i, path, out->server, sizeof out->server, err)) != PX_OK ||
        (st = member(ctx, "ca", i, path, out->ca, sizeof out->ca, err)) != PX_OK ||
        (st = member(ctx, "token_file", i, path, out->token_file, sizeof out->token_file, err)) !=
            PX_OK)
        return st;
    return PX_OK;
}

px_status px__cli_config_parse(const char *text, size_t len, const char *path, px__cli_config *out,
                               px_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc)
        return px_err_set(err, PX_EPARSE, "%s:%d:%d: %s: fix the JSON syntax", path, jerr.line,
                          jerr.column, jerr.text);
    px_status st = PX_OK;
    const char *schema = json_string_value(json_object_get(doc, "schema"));
    const json_t *contexts = json_object_get(doc, "contexts");
    const json_t *current = json_object_get(doc, "current_context");
    if (!json_is_object(doc) || !schema || strcmp(schema, "plexus.config/1")) {
        st = px_err_set(err, PX_EINVAL,
                        "%s: not a plexus config: give an object with \"schema\": "
                        "\"plexus.config/1\" (plexus config set-context writes one)",
                        path);
        goto done;
    }
    if (contexts && !json_is_array(contexts)) {
        st = px_err_set(err, PX_EINVAL, "%s: contexts: give an array of contexts", path);
        goto done;
    }
    if (json_array_size(contexts) > PX_CLI_CONTEXTS_MAX) {
        st = px_err_set(err, PX_ELIMIT, "%s: contexts: %zu contexts, more than %d: delete some",
                        path, json_array_size(contexts), PX_CLI_CONTEXTS_MAX);
        goto done;
    }
    size_t i;
    json_t *ctx;
    json_array_foreach(contexts, i, ctx)
    {
        if ((st = parse_context(ctx, i, path, &out->v[i], err)) != PX_OK)
            goto done;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(out->v[k].name, out->v[i].name)) {
                st = px_err_set(err, PX_EINVAL,
                                "%s: contexts[%zu].name: \"%s\" is also contexts[%zu]: give "
                                "each context a name of its own",
                                path, i, out->v[i].name, k);
                goto done;
            }
        out->n = i + 1;
    }
    if (current && !json_is_null(current)) {
        const char *c = json_string_value(current);
        if (!c || !px__cli_context_name_valid(c) || !px__cli_config_find(out, c)) {
            st = px_err_set(err, PX_EINVAL,
                            "%s: current_context: not one of the contexts: pick one with plexus "
                            "config use-context NAME",
                            path);
            goto done;
        }
        px_strlcpy(out->current, c, sizeof out->current);
    }
done:
    json_decref(doc);
    if (st != PX_OK)
        memset(out, 0, sizeof *out);
    return st;
}

px__cli_context *px__cli_config_find(px__cli_config *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->v[i].name, name))
            return &c->v[i];
    return NULL;
}

json_t *px__cli_config_to_json(const px__cli_config *c)
{
    json_t *doc = json_object(), *arr = json_array();
    if (!doc || !arr)
        goto fail;
    if (json_object_set_new(doc, "schema", json_string("plexus.config/1")) ||
        json_object_set_new(doc, "current_context",
                            c->current[0] ? json_string(c->current) : json_null()))
        goto fail;
    for (size_t i = 0; i < c->n; i++) {
        const px__cli_context *x = &c->v[i];
        json_t *o = json_object();
        if (!o || json_array_append_new(arr, o) ||
            json_object_set_new(o, "name", json_string(x->name)))
            goto fail;
        if ((x->server[0] && json_object_set_new(o, "server", json_string(x->server))) ||
            (x->ca[0] && json_object_set_new(o, "ca", json_string(x->ca))) ||
            (x->token_file[0] && json_object_set_new(o, "token_file", json_string(x->token_file))))
            goto fail;
    }
    if (json_object_set_new(doc, "contexts", arr) == 0)
        return doc;
    arr = NULL;
fail:
    json_decref(arr);
    json_decref(doc);
    return NULL;
}
