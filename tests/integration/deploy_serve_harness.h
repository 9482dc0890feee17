/*
 * The scenario of a deployment served across three agents, shared by the
 * loopback and the network-namespace tests: deploy the tiny model with a
 * stage on each node, the fault-free tokens of eight completions through
 * the server's route, eight streams at once with the node of the middle
 * stage killed mid-stream (every stream must end with the fault-free
 * tokens), the incident with its RTO and the new stages in `plexus
 * explain`, and a second deployment on the warm nodes once the lost node
 * is offline.  Included by tests/integration/test_fleet_deploy_*.c.
 */
#ifndef PX_DEPLOY_SERVE_HARNESS_H
#define PX_DEPLOY_SERVE_HARNESS_H

#include "fleet_harness.h"

#include <curl/curl.h>

/* An emulated accelerator (with its emulation profile: the stage workers
 * run on the emu backend). */
#define SMALL_GPU(id)                                                                             \
    "{\"id\": \"" id "\", \"class\": \"gpu\", \"vendor\": \"nvidia\", \"model\": \"tiny\", "      \
    "\"backend\": \"emu\", \"emu\": {\"compute_slowdown\": 1, \"memory_slowdown\": 1, "           \
    "\"jitter\": 0, \"seed\": 1}, \"compute\": {\"f32\": \"10 TFLOP/s\"}, \"memory\": [{\"id\": " \
    "\"hbm\", \"kind\": \"hbm\", \"capacity\": \"512 MiB\", \"bandwidth\": \"100 GB/s\"}]}"

#define N_CLIENTS  8
#define MAX_TOKENS 160

/* One client's completion through the server's route. */
typedef struct client {
    const char *url;
    const char *token;
    char body[512];
    bool stream;
    long status;
    px_strbuf raw;  /* what came back */
    px_strbuf text; /* the completion's text (the streamed pieces joined) */
    atomic_int chunks;
    bool done;      /* the stream's last event came */
    char tail[600]; /* the last bytes that came, for messages */
    pthread_t thread;
} client;

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
    client *c = ud;
    if (px_strbuf_add(&c->raw, p, size * n) != PX_OK)
        return 0;
    for (size_t k = 0; k < size * n; k++)
        if (p[k] == '\n' && k > 0 && p[k - 1] == '\n')
            atomic_fetch_add(&c->chunks, 1);
    return size * n;
}

static void *client_main(void *arg)
{
    client *c = arg;
    CURL *h = curl_easy_init();
    char auth[128], url[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
    snprintf(url, sizeof url, "%s/v1/completions", c->url);
    struct curl_slist *hdr = curl_slist_append(NULL, auth);
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 240L);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    /* The text: each event's choices[0].text, or the whole reply's. */
    if (!c->stream) {
        json_t *v = c->raw.buf ? json_loads(c->raw.buf, 0, NULL) : NULL;
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(v, "choices"), 0), "text"));
        if (t)
            px_strbuf_adds(&c->text, t);
        json_decref(v);
        return NULL;
    }
    c->done = c->raw.buf && strstr(c->raw.buf, "data: [DONE]") != NULL;
    if (c->raw.buf)
        px_strlcpy(c->tail, c->raw.buf + (c->raw.len > 599 ? c->raw.len - 599 : 0), sizeof c->tail);
    for (char *line = c->raw.buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (px_str_starts_with(line, "data: {")) {
            json_t *v = json_loads(line + 6, 0, NULL);
            const char *t = json_string_value(
                json_object_get(json_array_get(json_object_get(v, "choices"), 0), "text"));
            if (t)
                px_strbuf_adds(&c->text, t);
            json_decref(v);
        }
        line = nl ? nl + 1 : NULL;
    }
    return NULL;
}

static void clients_run(client *cs, fh_fleet *f, bool stream, bool wait)
{
    static const char *const prompts[N_CLIENTS] = {
        "Once upon a time", "The little dog", "Lily wanted to", "One day, a boy",
        "The sun was",      "Tom and Sue",    "A big red ball", "Mom said"};
    for (int i = 0; i < N_CLIENTS; i++) {
        client *c = &cs[i];
        memset(c, 0, sizeof *c);
        c->url = f->url;
        c->token = FH_USER_TOKEN;
        c->stream = stream;
        snprintf(c->body, sizeof c->body,
                 "{\"model\": \"chat\", \"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": "
                 "0, \"ignore_eos\": true, \"stream\": %s}",
                 prompts[i], MAX_TOKENS, stream ? "true" : "false");
        assert_int_equal(pthread_create(&c->thread, NULL, client_main, c), 0);
    }
    for (int i = 0; wait && i < N_CLIENTS; i++)
        pthread_join(cs[i].thread, NULL);
}

static void clients_release(client *cs)
{
    for (int i = 0; i < N_CLIENTS; i++) {
        px_strbuf_release(&cs[i].raw);
        px_strbuf_release(&cs[i].text);
    }
}

static json_t *deployment(fh_fleet *f, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/deployments/%s", name);
    return fh_api(f, "GET", path, NULL);
}

/* Waits until the deployment's state is `want`; returns its record. */
static json_t *wait_state(fh_fleet *f, const char *name, const char *want, int timeout_s)
{
    uint64_t deadline = px_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    for (;;) {
        json_t *d = deployment(f, name);
        const char *st = json_string_value(json_object_get(d, "state"));
        if (st && !strcmp(st, want))
            return d;
        if (px_now_ns() > deadline) {
            fh_print_log(f->server.log);
            for (int i = 0; i < f->n_agents; i++)
                fh_print_log(f->agents[i].log);
            fail_msg("deployment %s is %s, not %s, after %d s", name, st ? st : "?", want,
                     timeout_s);
        }
        json_decref(d);
        fh_sleep_ms(100);
    }
}

/* The node that runs stage `stage` of the deployment now. */
static const char *stage_node(const json_t *d, int stage)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(json_object_get(d, "serving"), "stage_workers"), i, w)
    {
        if (json_integer_value(json_object_get(w, "stage")) == stage &&
            !strcmp(json_string_value(json_object_get(w, "state")) ?: "", "running"))
            return json_string_value(json_object_get(w, "node"));
    }
    return NULL;
}

/* Runs the scenario on a fleet whose three nodes (names) are online;
 * kill_node(ud, NAME) kills a node's agent and what it started.  Stage
 * workers must listen on addresses starting with addr_prefix. */
static void dsh_scenario(fh_fleet *f, const char *const names[3], const char *model,
                         const char *addr_prefix, void (*kill_node)(void *ud, const char *node),
                         void *ud)
{
    const char *want_stages = "3 stages on 3 nodes";
    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "deploy", "--model", model, "--name", "chat", "--objective",
                       "throughput", "--policy", "llamacpp", NULL);
    if (rc != 0) {
        fh_print_log(f->server.log);
        fail_msg("plexus deploy: exit %d: %s%s", rc, out, err);
    }
    px_assert_contains(out, want_stages);
    free(out);
    free(err);
    json_t *d = wait_state(f, "chat", "serving", 120);
    size_t w_i;
    json_t *w;
    json_array_foreach(json_object_get(json_object_get(d, "serving"), "stage_workers"), w_i, w)
    {
        const char *addr = json_string_value(json_object_get(w, "address"));
        if (!addr || !px_str_starts_with(addr, addr_prefix))
            fail_msg("stage worker at \"%s\", not on %s...", addr ? addr : "?", addr_prefix);
    }
    assert_int_equal(
        json_array_size(json_object_get(json_object_get(d, "serving"), "stage_workers")), 3);
    json_decref(d);

    /* The route: the caller's deployments, and nobody else's. */
    px_fleet_client *c = fh_client(f, FH_USER_TOKEN);
    json_t *list = NULL;
    long code = 0;
    px_err perr;
    assert_int_equal(px_fleet_client_call(c, "GET", "/v1/models", NULL, &code, &list, &perr),
                     PX_OK);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(list, "data"), 0), "id")),
        "chat");
    json_decref(list);
    px_fleet_client_free(c);
    c = fh_client(f, FH_OTHER_TOKEN);
    json_t *body = json_pack("{s:s, s:s, s:i}", "model", "chat", "prompt", "x", "max_tokens", 2);
    assert_int_not_equal(
        px_fleet_client_call(c, "POST", "/v1/completions", body, &code, NULL, &perr), PX_OK);
    assert_int_equal(code, 404);
    assert_int_equal(px_fleet_client_call(c, "GET", "/v1/models", NULL, &code, &list, &perr),
                     PX_OK);
    assert_int_equal(json_array_size(json_object_get(list, "data")), 0);
    json_decref(list);
    json_decref(body);
    px_fleet_client_free(c);

    /* The fault-free tokens. */
    client ref[N_CLIENTS], live[N_CLIENTS];
    clients_run(ref, f, false, true);
    for (int i = 0; i < N_CLIENTS; i++) {
        if (ref[i].status != 200 || ref[i].text.len == 0) {
            fh_print_log(f->server.log);
            for (int a = 0; a < f->n_agents; a++)
                fh_print_log(f->agents[a].log);
            fail_msg("client %d: status %ld: %s", i, ref[i].status,
                     ref[i].raw.buf ? ref[i].raw.buf : "");
        }
    }

    /* Eight streams; the agent of the middle stage is killed once every
     * stream has begun. */
    d = deployment(f, "chat");
    char victim[64] = "";
    if (stage_node(d, 1))
        px_strlcpy(victim, stage_node(d, 1), sizeof victim);
    if (!victim[0]) {
        char *text = json_dumps(json_object_get(d, "serving"), JSON_INDENT(1));
        fail_msg("no stage 1 runs: %s", text ? text : "?");
    }
    json_decref(d);
    clients_run(live, f, true, false);
    uint64_t deadline = px_now_ns() + 120000000000ull;
    for (int i = 0; i < N_CLIENTS; i++)
        while (atomic_load(&live[i].chunks) < 2) {
            if (px_now_ns() > deadline)
                fail_msg("stream %d did not begin within 120 s", i);
            fh_sleep_ms(5);
        }
    /* The node of stage 1 now: under load the heal loop may have adapted
     * the plan (a slow step read as a slow link) and a failed canary
     * rolled it back meanwhile, so the node read before the streams may
     * run nothing any more. */
    d = deployment(f, "chat");
    if (stage_node(d, 1))
        px_strlcpy(victim, stage_node(d, 1), sizeof victim);
    json_decref(d);
    int done_before = 0;
    for (int i = 0; i < N_CLIENTS; i++)
        done_before += atomic_load(&live[i].chunks) > MAX_TOKENS;
    kill_node(ud, victim);
    for (int i = 0; i < N_CLIENTS; i++)
        pthread_join(live[i].thread, NULL);
    if (done_before == N_CLIENTS)
        fail_msg("every stream had ended before the agent was killed: nothing was tested");
    for (int i = 0; i < N_CLIENTS; i++) {
        if (live[i].status != 200 || strcmp(live[i].text.buf ?: "", ref[i].text.buf ?: "") != 0) {
            fh_print_log(f->server.log);
            fail_msg("stream %d (status %ld) differs from the fault-free run:\n%s\n---\n%s\n"
                     "--- its last bytes:\n%s",
                     i, live[i].status, live[i].text.buf ?: "", ref[i].text.buf ?: "",
                     live[i].tail);
        }
        assert_true(live[i].done);
    }
    clients_release(ref);
    clients_release(live);

    /* The incident with its RTO (under load the detector may also have
     * adapted to slow steps: the loss of the node's device must be among
     * them), and the stages on the remaining nodes. */
    uint64_t until = px_now_ns() + 30000000000ull;
    for (;;) {
        d = deployment(f, "chat");
        bool found = false;
        size_t n_inc;
        json_t *inc;
        json_array_foreach(json_object_get(d, "incidents"), n_inc, inc)
        {
            const char *cls =
                json_string_value(json_object_get(json_object_get(inc, "signature"), "class"));
            const char *dev =
                json_string_value(json_object_get(json_object_get(inc, "localization"), "device"));
            if (cls && !strcmp(cls, "device-loss") && dev && px_str_starts_with(dev, victim) &&
                dev[strlen(victim)] == '.' && json_is_number(json_object_get(inc, "rto_s")))
                found = true;
        }
        if (found)
            break;
        if (px_now_ns() > until) {
            fh_print_log(f->server.log);
            char *text = json_dumps(json_object_get(d, "incidents"), JSON_INDENT(1));
            fail_msg("no device-loss incident with an RTO at node %s: %s", victim, text);
        }
        json_decref(d);
        fh_sleep_ms(100);
    }
    /* The front end's incidents and figures are the deployment's records
     * too (the dashboard's). */
    until = px_now_ns() + 30000000000ull;
    for (;;) {
        json_t *inc = fh_api(f, "GET", "/v1/deployments/chat/incidents", NULL);
        json_t *obs = fh_api(f, "GET", "/v1/deployments/chat/observations", NULL);
        /* Some window saw the streams: tokens/s and their latencies. */
        bool served = false;
        size_t k;
        json_t *o;
        json_array_foreach(json_object_get(obs, "observations"), k, o)
        {
            const json_t *x = json_object_get(o, "observation");
            served = served ||
                     (json_number_value(json_object_get(x, "tokens_per_s")) > 0 &&
                      json_number_value(json_object_get(json_object_get(x, "ttft_s"), "p50")) > 0);
        }
        bool both = json_array_size(json_object_get(inc, "incidents")) > 0 && served;
        json_decref(inc);
        json_decref(obs);
        if (both)
            break;
        if (px_now_ns() > until) {
            fh_print_log(f->server.log);
            fail_msg("the deployment's incident and observed serving figures did not come");
        }
        fh_sleep_ms(100);
    }
    for (int s = 0; s < 3; s++) {
        const char *node = stage_node(d, s);
        assert_true(!node || strcmp(node, victim) != 0);
    }
    json_decref(d);
    assert_int_equal(fh_plexus(&out, &err, "explain", "chat", NULL), 0);
    char want[96];
    snprintf(want, sizeof want, "recovery: device-loss at %s.gpu0", victim);
    if (!strstr(out, want) || !strstr(out, "front end: serving")) {
        fh_print_log(f->server.log);
        fail_msg("plexus explain chat does not say \"%s\":\n%s", want,
                 strstr(out, "front end") ? strstr(out, "front end") : out);
    }
    px_assert_contains(out, "RTO ");
    free(out);
    free(err);

    /* Once the lost node is offline, a second deployment of the model
     * lands on the warm nodes. */
    const char *alive[2];
    int n_alive = 0;
    for (int i = 0; i < 3; i++)
        if (strcmp(names[i], victim) != 0)
            alive[n_alive++] = names[i];
    until = px_now_ns() + 60000000000ull;
    for (;;) {
        json_t *node = fh_node(f, victim);
        const char *st = json_string_value(json_object_get(node, "state"));
        bool offline = st && strcmp(st, "online") != 0;
        json_decref(node);
        if (offline)
            break;
        if (px_now_ns() > until)
            fail_msg("node %s still online 60 s after its agent was killed", victim);
        fh_sleep_ms(200);
    }
    fh_wait_nodes_online(f, alive, 2, 10);
    char *digest = NULL;
    d = deployment(f, "chat");
    digest = px_strdup(json_string_value(json_object_get(d, "model")));
    json_decref(d);
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", digest, "--name", "chat2",
                               "--policy", "llamacpp", NULL),
                     0);
    px_assert_contains(out, "the model is resident on every node of the plan");
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "undeploy", "chat2", NULL), 0);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "undeploy", "chat", NULL), 0);
    free(out);
    free(err);
    free(digest);
}

#endif
