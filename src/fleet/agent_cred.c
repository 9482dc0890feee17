/*
 * The node's identity.  The first time, the agent makes a credential of
 * its own (256 random bits), writes it to STATE/credential (0600, in a
 * 0700 folder) and joins with the join token, sending the credential
 * once; the server keeps its hash, bound to the node's name.  From then
 * on every call of the agent carries that credential, and the join token
 * is not needed.  A join whose reply was lost is repeated with the same
 * credential, which the server accepts again.  A rotation (asked by an
 * admin, `plexus nodes rotate`) makes the next credential the same way;
 * the server drops the old one at the first use of the new.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"
#include "fleet/secret_impl.h"

#include <unistd.h>

#define CRED_MAGIC "plexus-node-credential/1"

static char *cred_path(const px__agent *a, const char *suffix)
{
    return px_asprintf("%s/credential%s", a->state_dir, suffix);
}

px_status px__agent_cred_setup(px__agent *a, px_err *err)
{
    const px_fleet_agent_config *cfg = a->cfg;
    a->state_dir =
        cfg->state_dir ? px_strdup(cfg->state_dir) : px_asprintf("%s/state", a->work_dir);
    if (!a->state_dir)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = px__private_dir(a->state_dir, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "--state: ");
    /* A rotation that a crash interrupted: the current credential is still
     * the one the server knows. */
    char *next = cred_path(a, ".next");
    if (next)
        unlink(next);
    free(next);
    char *path = cred_path(a, "");
    if (!path)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    st = px__secret_read_file(path, "node credential", 4096, &text, &len, err);
    if (st == PX_ENOTFOUND) {
        free(path);
        return PX_OK; /* not joined yet */
    }
    if (st != PX_OK) {
        free(path);
        return st;
    }
    char magic[40] = "", name[80] = "", secret[300] = "";
    int got = sscanf(text, "%39s %79s %299s", magic, name, secret);
    px__secret_wipe(text, len);
    free(text);
    if (got != 3 || strcmp(magic, CRED_MAGIC) != 0 || !px__token_valid(secret))
        st = px_err_set(err, PX_EINVAL,
                        "%s: not a node credential; delete it to join again (an admin then "
                        "revokes and admits the node)",
                        path);
    else if (strcmp(name, a->node_id) != 0)
        st = px_err_set(err, PX_EINVAL,
                        "%s holds the credential of node \"%s\", and this agent is \"%s\": give "
                        "--name %s, or another --state folder",
                        path, name, a->node_id, name);
    else
        px_strlcpy(a->cred, secret, sizeof a->cred);
    px__secret_wipe(secret, sizeof secret);
    free(path);
    return st;
}

/* Makes a credential and writes it to STATE/credential<suffix>. */
static px_status make_credential(px__agent *a, const char *suffix, char *out, size_t n, px_err *err)
{
    px_status st = px__secret_new("plexus-node-", out, n, err);
    if (st != PX_OK)
        return st;
    char *path = cred_path(a, suffix);
    char *text = path ? px_asprintf("%s %s %s\n", CRED_MAGIC, a->node_id, out) : NULL;
    st = text ? px__secret_write_file(path, text, strlen(text), err)
              : px_err_set(err, PX_ENOMEM, "out of memory");
    if (text)
        px__secret_wipe(text, 0);
    free(text);
    free(path);
    return st;
}

px_status px__agent_client(px__agent *a, px_fleet_client **out, unsigned *gen, px_err *err)
{
    pthread_mutex_lock(&a->cred_mu);
    const char *token = a->cred[0] ? a->cred : a->cfg->token;
    px_status st = px_fleet_client_new(a->cfg->server, token, out, err);
    if (st == PX_OK && a->server_hint[0])
        px__client_start_at(*out, a->server_hint);
    *gen = atomic_load(&a->cred_gen);
    pthread_mutex_unlock(&a->cred_mu);
    if (st == PX_OK && a->cfg->ca_file &&
        (st = px_fleet_client_set_ca(*out, a->cfg->ca_file, err)) != PX_OK) {
        px_fleet_client_free(*out);
        *out = NULL;
    }
    return st;
}

px_status px__agent_job_client(px__agent *a, px_fleet_client **out, unsigned *gen, px_err *err)
{
    pthread_mutex_lock(&a->cred_mu);
    px_fleet_client *c = a->n_idle > 0 ? a->idle[--a->n_idle] : NULL;
    unsigned g = c ? a->idle_gen[a->n_idle] : 0;
    if (c && a->server_hint[0])
        px__client_start_at(c, a->server_hint);
    pthread_mutex_unlock(&a->cred_mu);
    if (!c)
        return px__agent_client(a, out, gen, err);
    *gen = g;
    px__agent_sync(a, c, gen);
    *out = c;
    return PX_OK;
}

void px__agent_job_client_done(px__agent *a, px_fleet_client *c, unsigned gen)
{
    if (!c)
        return;
    pthread_mutex_lock(&a->cred_mu);
    if (a->n_idle < PX__AGENT_IDLE_CLIENTS) {
        a->idle[a->n_idle] = c;
        a->idle_gen[a->n_idle++] = gen;
        c = NULL;
    }
    pthread_mutex_unlock(&a->cred_mu);
    px_fleet_client_free(c);
}

void px__agent_idle_clients_free(px__agent *a)
{
    pthread_mutex_lock(&a->cred_mu);
    for (int i = 0; i < a->n_idle; i++)
        px_fleet_client_free(a->idle[i]);
    a->n_idle = 0;
    pthread_mutex_unlock(&a->cred_mu);
}

void px__agent_sync(px__agent *a, px_fleet_client *c, unsigned *gen)
{
    if (atomic_load(&a->cred_gen) == *gen)
        return;
    pthread_mutex_lock(&a->cred_mu);
    px_err e;
    /* The credential was checked when it was stored; a refusal here is
     * out of memory, and the next call tries again (gen is not taken). */
    if (a->cred[0] && px_fleet_client_set_token(c, a->cred, &e) != PX_OK) {
        pthread_mutex_unlock(&a->cred_mu);
        px_log_error("agent: node %s: the credential is not in use: %s", a->node_id, e.msg);
        return;
    }
    *gen = atomic_load(&a->cred_gen);
    pthread_mutex_unlock(&a->cred_mu);
}

void px__agent_renewed(px__agent *a, uint64_t sent_ns)
{
    uint64_t until = sent_ns + (uint64_t)(PX__AGENT_FENCE_SHARE * a->lease_s * 1e9);
    uint64_t cur = atomic_load(&a->fence_ns);
    while (until > cur && !atomic_compare_exchange_weak(&a->fence_ns, &cur, until))
        ;
}

bool px__agent_fence_passed(px__agent *a)
{
    uint64_t f = atomic_load(&a->fence_ns);
    return f != 0 && px_now_ns() > f;
}

json_t *px__agent_resident(px__agent *a)
{
    json_t *arr = json_array();
    json_t *list = a->cache ? px_fleet_cache_list(a->cache) : NULL;
    size_t i;
    json_t *it;
    json_array_foreach(list, i, it) json_array_append(arr, json_object_get(it, "digest"));
    json_decref(list);
    return arr;
}

/* POSTs the registration to path with token; *code gets the HTTP status. */
static px_status send_registration(px__agent *a, px_fleet_client *c, const char *path,
                                   const char *token, bool with_credential, long *code,
                                   json_t **reply, px_err *err)
{
    pthread_mutex_lock(&a->mu);
    json_t *body = json_deep_copy(a->registration);
    pthread_mutex_unlock(&a->mu);
    if (!body)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    json_object_set_new(body, "resident", px__agent_resident(a));
    json_object_set_new(body, "running", px__agent_running(a, NULL));
    if (with_credential)
        json_object_set_new(body, "credential", json_string(a->cred));
    px_status st = px_fleet_client_set_token(c, token, err);
    if (st == PX_OK)
        st = px_fleet_client_call(c, "POST", path, body, code, reply, err);
    json_t *cred = json_object_get(body, "credential");
    if (cred)
        px__secret_wipe((char *)json_string_value(cred), 0);
    json_decref(body);
    return st;
}

static px_status join(px__agent *a, px_fleet_client *c, long *code, json_t **reply, px_err *err)
{
    if (!a->cfg->token)
        return px_err_set(err, PX_EAUTH,
                          "node %s has no credential the server accepts and no join token was "
                          "given: give the join token once (--join-token-file FILE) so that the "
                          "node can join",
                          a->node_id);
    px_status st = PX_OK;
    if (!a->cred[0]) {
        char secret[300];
        if ((st = make_credential(a, "", secret, sizeof secret, err)) != PX_OK)
            return px_err_prefix(err, st, "saving the node credential: ");
        pthread_mutex_lock(&a->cred_mu);
        px_strlcpy(a->cred, secret, sizeof a->cred);
        atomic_fetch_add(&a->cred_gen, 1);
        pthread_mutex_unlock(&a->cred_mu);
        px__secret_wipe(secret, sizeof secret);
    }
    st = send_registration(a, c, "/v1/agent/join", a->cfg->token, true, code, reply, err);
    if (st == PX_OK)
        px_log_info("agent: node %s joined; its credential is in %s/credential", a->node_id,
                    a->state_dir);
    return st;
}

px_status px__agent_register(px__agent *a, px_fleet_client *c, json_t **stop, px_err *err)
{
    if (stop)
        *stop = NULL;
    json_t *reply = NULL;
    long code = 0;
    uint64_t sent = px_now_ns();
    px_status st;
    if (!a->cred[0]) {
        st = join(a, c, &code, &reply, err);
    } else {
        pthread_mutex_lock(&a->cred_mu);
        char cred[sizeof a->cred];
        px_strlcpy(cred, a->cred, sizeof cred);
        pthread_mutex_unlock(&a->cred_mu);
        st = send_registration(a, c, "/v1/agent/register", cred, false, &code, &reply, err);
        px__secret_wipe(cred, sizeof cred);
        /* The server does not know this credential: its data was reset, or
         * an admin revoked the node.  Joining again tells which. */
        if (st != PX_OK && code == 401 && a->cfg->token) {
            json_decref(reply);
            reply = NULL;
            px_log_info("agent: the server does not know node %s's credential; joining again",
                        a->node_id);
            st = join(a, c, &code, &reply, err);
        }
    }
    if (st != PX_OK) {
        json_decref(reply);
        if (code == 401 || code == 403)
            return px_err_prefix(err, PX_EAUTH, "node %s: ", a->node_id);
        if (code == 409)
            return px_err_prefix(err, PX_EEXIST, "node %s: ", a->node_id);
        return st;
    }
    pthread_mutex_lock(&a->cred_mu);
    st = px_fleet_client_set_token(c, a->cred, err);
    pthread_mutex_unlock(&a->cred_mu);
    if (st != PX_OK) {
        json_decref(reply);
        return px_err_prefix(err, st, "node %s: the credential in use: ", a->node_id);
    }
    double hb = json_number_value(json_object_get(reply, "heartbeat_s"));
    double lease = json_number_value(json_object_get(reply, "lease_s"));
    pthread_mutex_lock(&a->mu);
    if (hb > 0)
        a->heartbeat_s = hb;
    if (lease > 0)
        a->lease_s = lease;
    pthread_mutex_unlock(&a->mu);
    px__agent_renewed(a, sent);
    if (stop)
        *stop = json_incref(json_object_get(reply, "stop"));
    json_decref(reply);
    return PX_OK;
}

px_status px__agent_rotate(px__agent *a, px_fleet_client *c, px_err *err)
{
    char next[300];
    px_status st = make_credential(a, ".next", next, sizeof next, err);
    if (st != PX_OK)
        return st;
    json_t *body = json_pack("{s:s}", "credential", next);
    st = body ? px_fleet_client_call(c, "POST", "/v1/agent/credential", body, NULL, NULL, err)
              : px_err_set(err, PX_ENOMEM, "out of memory");
    if (body)
        px__secret_wipe((char *)json_string_value(json_object_get(body, "credential")), 0);
    json_decref(body);
    char *from = cred_path(a, ".next"), *to = cred_path(a, "");
    if (st == PX_OK && (!from || !to || rename(from, to) != 0))
        st = px_err_set(err, PX_EIO, "%s/credential: cannot replace: %s", a->state_dir,
                        strerror(errno));
    if (st != PX_OK && from)
        unlink(from);
    free(from);
    free(to);
    if (st == PX_OK) {
        pthread_mutex_lock(&a->cred_mu);
        px_strlcpy(a->cred, next, sizeof a->cred);
        atomic_fetch_add(&a->cred_gen, 1);
        /* The new credential is saved and other clients take it up by
         * cred_gen; this client's copy can fail only for memory. */
        st = px_fleet_client_set_token(c, a->cred, err);
        pthread_mutex_unlock(&a->cred_mu);
        px_log_info("agent: node %s rotated its credential", a->node_id);
    }
    px__secret_wipe(next, sizeof next);
    return st;
}
