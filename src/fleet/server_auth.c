/* Who may call the server.  Three kinds of principal, each known only by
 * the SHA-256 of its secret:
 *
 *   - users, from the token file (or the API token option), each with a
 *     name and a role (user, or admin who sees every job);
 *   - join tokens, which let an agent join a new node and nothing else;
 *   - node credentials, made by the agent itself and sent once when it
 *     joins (or rotates), stored by hash, each bound to one node.
 *
 * Revoking a node drops its credentials and keeps its name from joining
 * again until an admin admits it. */
#include "base/common.h"

#include "fleet/fleet_impl.h"
#include "fleet/secret_impl.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <strings.h>
#include <unistd.h>

bool px__name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > PX__NAME_MAX)
        return false;
    for (const char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_.@-", *c))
            return false;
    return true;
}

/* Adds a principal (auth_lock held for writing, or before serving). */
static px_status add(px_fleet_server *srv, px__who_kind kind, const char *name, bool admin,
                     const px_digest *hash, bool pending, px_err *err)
{
    if (srv->n_principals == srv->cap_principals) {
        size_t cap = srv->cap_principals ? srv->cap_principals * 2 : 16;
        px__principal *p = realloc(srv->principals, cap * sizeof *p);
        if (!p)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        srv->principals = p;
        srv->cap_principals = cap;
    }
    px__principal *p = &srv->principals[srv->n_principals++];
    memset(p, 0, sizeof *p);
    p->hash = *hash;
    p->kind = kind;
    p->admin = admin;
    p->pending = pending;
    px_strlcpy(p->name, name, sizeof p->name);
    return PX_OK;
}

static px_status add_token(px_fleet_server *srv, px__who_kind kind, const char *name, bool admin,
                           const char *token, const char *where, px_err *err)
{
    if (!px__token_valid(token))
        return px_err_set(err, PX_EINVAL,
                          "%s: a token must have 16 to 256 printable characters without spaces",
                          where);
    px_digest d;
    px_sha256(token, strlen(token), &d);
    for (size_t i = 0; i < srv->n_principals; i++)
        if (!memcmp(srv->principals[i].hash.bytes, d.bytes, sizeof d.bytes))
            return px_err_set(err, PX_EINVAL, "%s: the same token is given twice", where);
    return add(srv, kind, name, admin, &d, false, err);
}

/* One line: "agent TOKEN" or "user TOKEN [NAME [ROLE]]". */
static px_status parse_line(px_fleet_server *srv, char *line, const char *where, px_err *err)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    char *save = NULL, *kind = strtok_r(line, " \t\r", &save);
    if (!kind)
        return PX_OK;
    char *token = strtok_r(NULL, " \t\r", &save);
    char *name = token ? strtok_r(NULL, " \t\r", &save) : NULL;
    char *role = name ? strtok_r(NULL, " \t\r", &save) : NULL;
    char *extra = role ? strtok_r(NULL, " \t\r", &save) : NULL;
    px_status st;
    if (!token || extra)
        st =
            px_err_set(err, PX_EINVAL,
                       "%s: expected \"agent TOKEN\" or \"user TOKEN [NAME [user|admin]]\"", where);
    else if (!strcmp(kind, "agent") || !strcmp(kind, "join"))
        st = name ? px_err_set(err, PX_EINVAL, "%s: an agent (join) token takes no name", where)
                  : add_token(srv, PX__WHO_JOIN, "join", false, token, where, err);
    else if (strcmp(kind, "user") != 0)
        st = px_err_set(err, PX_EINVAL, "%s: unknown token kind \"%.16s\"; use agent or user",
                        where, kind);
    else if (name && !px__name_valid(name))
        st = px_err_set(err, PX_EINVAL, "%s: a user name is 1 to %d of A-Z a-z 0-9 _ . @ -", where,
                        PX__NAME_MAX);
    else if (role && strcmp(role, "user") != 0 && strcmp(role, "admin") != 0)
        st = px_err_set(err, PX_EINVAL, "%s: role \"%.16s\": expected user or admin", where, role);
    else
        st = add_token(srv, PX__WHO_USER, name ? name : "user", role && !strcmp(role, "admin"),
                       token, where, err);
    return st;
}

px_status px__auth_parse_text(px_fleet_server *srv, char *text, const char *path, px_err *err)
{
    px_status st = PX_OK;
    int line = 0;
    for (char *p = text; st == PX_OK && p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        char where[PATH_MAX + 32];
        snprintf(where, sizeof where, "%s:%d", path, ++line);
        st = parse_line(srv, p, where, err);
        p = nl ? nl + 1 : NULL;
    }
    return st;
}

static px_status read_token_file(px_fleet_server *srv, const char *path, px_err *err)
{
    char *text;
    size_t len;
    px_status st = px__secret_read_file(path, "token file", 1 << 20, &text, &len, err);
    if (st != PX_OK)
        return st;
    if (strlen(text) != len)
        st = px_err_set(err, PX_EINVAL, "%s: holds a NUL byte; a token file is text", path);
    else
        st = px__auth_parse_text(srv, text, path, err);
    px__secret_wipe(text, len);
    free(text);
    return st;
}

/* DATA/tokens on first start: a join token and an admin. */
static px_status generate_tokens(const char *path, px_err *err)
{
    char join[80], admin[80];
    px_status st = px__secret_new("plexus-join-", join, sizeof join, err);
    if (st == PX_OK)
        st = px__secret_new("plexus-user-", admin, sizeof admin, err);
    if (st != PX_OK)
        return st;
    char *text = px_asprintf("# plexus tokens: keep this file private (chmod 600)\n"
                             "# agent TOKEN                  the join token agents join with\n"
                             "# user TOKEN [NAME [ROLE]]     a user; ROLE user or admin\n"
                             "agent %s\nuser %s admin admin\n",
                             join, admin);
    px__secret_wipe(join, 0);
    px__secret_wipe(admin, 0);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    st = px__secret_write_file(path, text, strlen(text), err);
    px__secret_wipe(text, 0);
    free(text);
    if (st == PX_OK)
        px_log_info("fleet: generated a join token and an admin token in %s", path);
    return st;
}

typedef struct load_ctx {
    px_fleet_server *srv;
    px_status st;
    px_err *err;
} load_ctx;

static void load_credential(const char *node, const char *hex, void *ud)
{
    load_ctx *c = ud;
    px_digest d;
    if (c->st != PX_OK || !node || !hex || px_digest_parse(hex, &d) != PX_OK)
        return;
    /* After a restart every stored credential is as good as current: a
     * rotation the agent had not finished settles at its first use. */
    c->st = add(c->srv, PX__WHO_NODE, node, false, &d, false, c->err);
}

static void load_revoked(const char *node, void *ud)
{
    load_ctx *c = ud;
    if (node)
        json_object_set_new(c->srv->revoked, node, json_true());
}

px_status px__auth_load(px_fleet_server *srv, px_err *err)
{
    const px_fleet_server_options *o = &srv->opt;
    srv->revoked = json_object();
    srv->rotate = json_object();
    if (!srv->revoked || !srv->rotate)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = PX_OK;
    if (o->cluster_token)
        st = add_token(srv, PX__WHO_JOIN, "join", false, o->cluster_token, "cluster token", err);
    if (st == PX_OK && o->api_token)
        st = add_token(srv, PX__WHO_USER, "admin", true, o->api_token, "API token", err);
    if (st == PX_OK && o->token_file)
        st = read_token_file(srv, o->token_file, err);
    if (st == PX_OK && !o->token_file && !o->cluster_token && !o->api_token) {
        char *path = px_asprintf("%s/tokens", srv->data_dir);
        if (!path)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        if (access(path, F_OK) != 0)
            st = generate_tokens(path, err);
        if (st == PX_OK)
            st = read_token_file(srv, path, err);
        free(path);
    }
    if (st != PX_OK)
        return st;
    /* Replicas on a shared store read the nodes' credentials when they
     * take the scheduler lease: they may change until then. */
    return srv->store.ops->lease ? PX_OK : px__auth_load_store(srv, err);
}

px_status px__auth_load_store(px_fleet_server *srv, px_err *err)
{
    load_ctx c = {srv, PX_OK, err};
    px_status st = srv->store.ops->list_credentials(srv->store.self, load_credential, &c, err);
    if (st == PX_OK)
        st = c.st;
    if (st == PX_OK)
        st = srv->store.ops->list_revoked(srv->store.self, load_revoked, &c, err);
    return st;
}

void px__auth_free(px_fleet_server *srv)
{
    if (srv->principals)
        px__secret_wipe(srv->principals, srv->cap_principals * sizeof *srv->principals);
    free(srv->principals);
    srv->principals = NULL;
    srv->n_principals = srv->cap_principals = 0;
    json_decref(srv->revoked);
    json_decref(srv->rotate);
    srv->revoked = srv->rotate = NULL;
}

bool px__auth_identify(px_fleet_server *srv, const char *h, px__who *who)
{
    memset(who, 0, sizeof *who);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    const char *tok = h + 7;
    while (*tok == ' ')
        tok++;
    size_t n = strnlen(tok, 512);
    px_digest d;
    px_sha256(tok, n, &d);
    pthread_rwlock_rdlock(&srv->auth_lock);
    /* Compare against every principal without stopping early, so the time
     * taken says nothing about which secret came close. */
    size_t found = SIZE_MAX;
    for (size_t i = 0; i < srv->n_principals; i++) {
        bool eq = CRYPTO_memcmp(d.bytes, srv->principals[i].hash.bytes, sizeof d.bytes) == 0;
        if (eq)
            found = i;
    }
    if (found != SIZE_MAX) {
        const px__principal *p = &srv->principals[found];
        who->kind = p->kind;
        who->admin = p->admin;
        who->fresh = p->pending;
        who->hash = d;
        px_strlcpy(who->name, p->name, sizeof who->name);
    }
    pthread_rwlock_unlock(&srv->auth_lock);
    return found != SIZE_MAX;
}

bool px__auth_is_revoked(px_fleet_server *srv, const char *node)
{
    return json_object_get(srv->revoked, node) != NULL;
}

bool px__auth_has_node(px_fleet_server *srv, const char *node)
{
    bool has = false;
    pthread_rwlock_rdlock(&srv->auth_lock);
    for (size_t i = 0; i < srv->n_principals && !has; i++)
        has = srv->principals[i].kind == PX__WHO_NODE && !strcmp(srv->principals[i].name, node);
    pthread_rwlock_unlock(&srv->auth_lock);
    return has;
}

static px_status credential_hash(const char *credential, px_digest *d, char hex[65], px_err *err)
{
    if (!px__token_valid(credential) || strlen(credential) < 32)
        return px_err_set(err, PX_EINVAL,
                          "/credential: a node credential is 32 to 256 printable characters "
                          "without spaces");
    px_sha256(credential, strlen(credential), d);
    px_digest_hex(d, hex);
    return PX_OK;
}

/* Removes the node's principals except the one with hash keep (NULL:
 * all); auth_lock held for writing. */
static void drop_locked(px_fleet_server *srv, const char *node, const px_digest *keep)
{
    size_t w = 0;
    for (size_t i = 0; i < srv->n_principals; i++) {
        px__principal *p = &srv->principals[i];
        bool gone = p->kind == PX__WHO_NODE && !strcmp(p->name, node) &&
                    !(keep && !memcmp(p->hash.bytes, keep->bytes, sizeof keep->bytes));
        if (!gone) {
            if (keep && p->kind == PX__WHO_NODE && !strcmp(p->name, node))
                p->pending = false;
            srv->principals[w++] = *p;
        }
    }
    px__secret_wipe(srv->principals + w, (srv->n_principals - w) * sizeof *srv->principals);
    srv->n_principals = w;
}

px_status px__auth_join(px_fleet_server *srv, const char *node, const char *credential, px_err *err)
{
    if (px__auth_is_revoked(srv, node))
        return px_err_set(err, PX_EAUTH,
                          "node \"%s\" was revoked by an admin; it can join again once an admin "
                          "runs `plexus nodes admit %s`",
                          node, node);
    px_digest d;
    char hex[65];
    px_status st = credential_hash(credential, &d, hex, err);
    if (st != PX_OK)
        return st;
    bool same = false, other = false;
    pthread_rwlock_rdlock(&srv->auth_lock);
    for (size_t i = 0; i < srv->n_principals; i++) {
        const px__principal *p = &srv->principals[i];
        if (p->kind == PX__WHO_NODE && !strcmp(p->name, node)) {
            if (!memcmp(p->hash.bytes, d.bytes, sizeof d.bytes))
                same = true;
            else
                other = true;
        }
        if (p->kind != PX__WHO_NODE && !memcmp(p->hash.bytes, d.bytes, sizeof d.bytes))
            other = true; /* never accept a user's or the join token as a credential */
    }
    pthread_rwlock_unlock(&srv->auth_lock);
    if (same)
        return PX_OK; /* the reply to a join was lost and the agent asks again */
    if (other)
        return px_err_set(err, PX_EEXIST,
                          "node \"%s\" has already joined with another credential; if that "
                          "credential is lost, an admin runs `plexus nodes revoke %s` and then "
                          "`plexus nodes admit %s`",
                          node, node, node);
    if ((st = srv->store.ops->put_credential(srv->store.self, node, hex, err)) != PX_OK)
        return st;
    pthread_rwlock_wrlock(&srv->auth_lock);
    st = add(srv, PX__WHO_NODE, node, false, &d, false, err);
    pthread_rwlock_unlock(&srv->auth_lock);
    return st;
}

px_status px__auth_add_pending(px_fleet_server *srv, const char *node, const char *credential,
                               px_err *err)
{
    px_digest d;
    char hex[65];
    px_status st = credential_hash(credential, &d, hex, err);
    if (st != PX_OK)
        return st;
    bool known = false;
    pthread_rwlock_rdlock(&srv->auth_lock);
    for (size_t i = 0; i < srv->n_principals; i++)
        if (!memcmp(srv->principals[i].hash.bytes, d.bytes, sizeof d.bytes))
            known = true;
    pthread_rwlock_unlock(&srv->auth_lock);
    if (known)
        return PX_OK; /* a repeated request */
    if ((st = srv->store.ops->put_credential(srv->store.self, node, hex, err)) != PX_OK)
        return st;
    pthread_rwlock_wrlock(&srv->auth_lock);
    st = add(srv, PX__WHO_NODE, node, false, &d, true, err);
    pthread_rwlock_unlock(&srv->auth_lock);
    return st;
}

px_status px__auth_settle(px_fleet_server *srv, const px__who *who, px_err *err)
{
    char hex[65];
    px_digest_hex(&who->hash, hex);
    px_status st = srv->store.ops->drop_credentials(srv->store.self, who->name, hex, err);
    if (st != PX_OK)
        return st;
    pthread_rwlock_wrlock(&srv->auth_lock);
    drop_locked(srv, who->name, &who->hash);
    pthread_rwlock_unlock(&srv->auth_lock);
    json_object_del(srv->rotate, who->name);
    px_log_info("fleet: node %s now uses its rotated credential; the old one is dropped",
                who->name);
    return PX_OK;
}

px_status px__auth_revoke(px_fleet_server *srv, const char *node, px_err *err)
{
    px_status st = srv->store.ops->set_revoked(srv->store.self, node, true, err);
    if (st == PX_OK)
        st = srv->store.ops->drop_credentials(srv->store.self, node, NULL, err);
    if (st != PX_OK)
        return st;
    json_object_set_new(srv->revoked, node, json_true());
    json_object_del(srv->rotate, node);
    pthread_rwlock_wrlock(&srv->auth_lock);
    drop_locked(srv, node, NULL);
    pthread_rwlock_unlock(&srv->auth_lock);
    px_log_warn("fleet: node %s revoked: its credentials no longer work", node);
    return PX_OK;
}

px_status px__auth_admit(px_fleet_server *srv, const char *node, px_err *err)
{
    px_status st = srv->store.ops->set_revoked(srv->store.self, node, false, err);
    if (st == PX_OK)
        json_object_del(srv->revoked, node);
    return st;
}
