/*
 * A deployment served across real agents on 127.0.0.1: the server plans
 * the tiny model over three nodes (emulated GPUs), the agents fetch it,
 * start the stage workers the server orders (linked over TCP with the
 * deployment's secret) and the server routes the OpenAI API of the
 * deployment's name to its front end.  Eight clients stream completions
 * at once through the server; one agent is killed mid-stream; every
 * stream completes with the tokens of the fault-free run, the incident
 * (with its RTO) and the stage workers on the remaining nodes show in
 * `plexus explain`, and a second deployment of the model lands on the
 * warm nodes.  Another user sees none of it.
 */
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

static void test_deployment_serves_streams_and_heals_across_nodes(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fh_fleet f = {0};
    fh_fleet_start(&f, "deploy-serve", 5);
    const char *names[] = {"n1", "n2", "n3"};
    for (int i = 0; i < 3; i++) {
        char *inv = fh_inventory(&f, names[i], SMALL_GPU("gpu0"), "");
        fh_start_agent(&f, names[i], inv);
        free(inv);
    }
    fh_wait_nodes_online(&f, names, 3, 30);

    char *out = NULL, *err = NULL;
    int rc = fh_plexus(&out, &err, "deploy", "--model", model, "--name", "chat", "--objective",
                       "throughput", "--policy", "llamacpp", NULL);
    if (rc != 0) {
        fh_print_log(f.server.log);
        fail_msg("plexus deploy: exit %d: %s%s", rc, out, err);
    }
    px_assert_contains(out, "3 stages on 3 nodes");
    free(out);
    free(err);
    json_t *d = wait_state(&f, "chat", "serving", 120);
    assert_int_equal(
        json_array_size(json_object_get(json_object_get(d, "serving"), "stage_workers")), 3);
    json_decref(d);

    /* The route: the caller's deployments, and nobody else's. */
    px_fleet_client *c = fh_client(&f, FH_USER_TOKEN);
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
    c = fh_client(&f, FH_OTHER_TOKEN);
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
    clients_run(ref, &f, false, true);
    for (int i = 0; i < N_CLIENTS; i++) {
        if (ref[i].status != 200 || ref[i].text.len == 0) {
            fh_print_log(f.server.log);
            for (int a = 0; a < f.n_agents; a++)
                fh_print_log(f.agents[a].log);
            fail_msg("client %d: status %ld: %s", i, ref[i].status,
                     ref[i].raw.buf ? ref[i].raw.buf : "");
        }
    }

    /* Eight streams; the agent of the middle stage is killed once every
     * stream has begun. */
    d = deployment(&f, "chat");
    char victim[64] = "";
    if (stage_node(d, 1))
        px_strlcpy(victim, stage_node(d, 1), sizeof victim);
    if (!victim[0]) {
        char *text = json_dumps(json_object_get(d, "serving"), JSON_INDENT(1));
        fail_msg("no stage 1 runs: %s", text ? text : "?");
    }
    int k = 0;
    while (k < f.n_agents && strcmp(f.agents[k].name, victim) != 0)
        k++;
    assert_true(k < f.n_agents);
    json_decref(d);
    clients_run(live, &f, true, false);
    uint64_t deadline = px_now_ns() + 120000000000ull;
    for (int i = 0; i < N_CLIENTS; i++)
        while (atomic_load(&live[i].chunks) < 2) {
            if (px_now_ns() > deadline)
                fail_msg("stream %d did not begin within 120 s", i);
            fh_sleep_ms(5);
        }
    int done_before = 0;
    for (int i = 0; i < N_CLIENTS; i++)
        done_before += atomic_load(&live[i].chunks) > MAX_TOKENS;
    kill(f.agents[k].pid, SIGKILL);
    for (int i = 0; i < N_CLIENTS; i++)
        pthread_join(live[i].thread, NULL);
    if (done_before == N_CLIENTS)
        fail_msg("every stream had ended before the agent was killed: nothing was tested");
    for (int i = 0; i < N_CLIENTS; i++) {
        if (live[i].status != 200 || strcmp(live[i].text.buf ?: "", ref[i].text.buf ?: "") != 0) {
            fh_print_log(f.server.log);
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
        d = deployment(&f, "chat");
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
            fh_print_log(f.server.log);
            char *text = json_dumps(json_object_get(d, "incidents"), JSON_INDENT(1));
            fail_msg("no device-loss incident with an RTO at node %s: %s", victim, text);
        }
        json_decref(d);
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
        fh_print_log(f.server.log);
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
        json_t *node = fh_node(&f, victim);
        const char *st = json_string_value(json_object_get(node, "state"));
        bool offline = st && strcmp(st, "online") != 0;
        json_decref(node);
        if (offline)
            break;
        if (px_now_ns() > until)
            fail_msg("node %s still online 60 s after its agent was killed", victim);
        fh_sleep_ms(200);
    }
    fh_wait_nodes_online(&f, alive, 2, 10);
    char *digest = NULL;
    d = deployment(&f, "chat");
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
    free(model);
    fh_fleet_stop(&f);
    curl_global_cleanup();
}

/* A node whose cache budget holds one model at a time: deploying a
 * second model evicts the first (no longer deployed) and the deployment
 * says which and why. */
static void test_eviction_for_a_deployment_is_explained(void **state)
{
    (void)state;
    char *big = px_test_require_shared_model("stories260K.gguf");
    char *small = px_test_require_shared_model("stories260K-q8_0.gguf");
    fh_fleet f = {0};
    fh_fleet_start(&f, "deploy-evict", 10);
    char *inv = fh_inventory(&f, "n1", SMALL_GPU("gpu0"), "");
    const char *extra[] = {"--cache-budget", "1400KiB", NULL};
    fh_start_agent_via(&f, "n1", inv, NULL, extra);
    free(inv);
    const char *names[] = {"n1"};
    fh_wait_nodes_online(&f, names, 1, 30);
    char *out = NULL, *err = NULL;
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", small, "--name", "first", NULL), 0);
    free(out);
    free(err);
    json_decref(wait_state(&f, "first", "serving", 120));
    assert_int_equal(fh_plexus(&out, &err, "undeploy", "first", NULL), 0);
    free(out);
    free(err);
    assert_int_equal(fh_plexus(&out, &err, "deploy", "--model", big, "--name", "second", NULL), 0);
    free(out);
    free(err);
    json_t *d = wait_state(&f, "second", "serving", 120);
    const json_t *ev = json_array_get(json_object_get(d, "evictions"), 0);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "node")), "n1");
    assert_string_equal(json_string_value(json_object_get(ev, "name")), "stories260K-q8_0.gguf");
    json_decref(d);
    assert_int_equal(fh_plexus(&out, &err, "explain", "second", NULL), 0);
    px_assert_contains(out, "cache evictions for this model:");
    px_assert_contains(out, "node n1 evicted stories260K-q8_0.gguf");
    px_assert_contains(out, "cache budget of 1433600 bytes");
    free(out);
    free(err);
    /* Hostile reports from a node, and hostile requests on the route. */
    char path[700], *cred = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/work-n1/state/credential", f.dir);
    assert_int_equal(px_read_file(path, 4096, &cred, &len, NULL), PX_OK);
    /* "MAGIC NAME SECRET" */
    char secret[300] = "";
    assert_int_equal(sscanf(cred, "%*s %*s %299s", secret), 1);
    static const struct {
        const char *body;
        long status;
    } reports[] = {
        {"not json", 400},
        {"{\"reports\": 5}", 400},
        {"{\"reports\": [7, null, {\"id\": \"x\"}, {\"id\": 999999, \"address\": "
         "\"tcp:1.2.3.4:5\"}, {\"id\": -1, \"state\": \"killed\"}]}",
         200},
    };
    px_fleet_client *node = fh_client(&f, secret);
    for (size_t i = 0; i < PX_ARRAY_LEN(reports); i++) {
        long code = 0;
        px_err perr;
        (void)px_fleet_client_send(node, "POST", "/v1/agent/stages", reports[i].body,
                                   strlen(reports[i].body), &code, NULL, &perr);
        assert_int_equal(code, reports[i].status);
    }
    px_fleet_client_free(node);
    free(cred);
    px_fleet_client *user = fh_client(&f, FH_USER_TOKEN);
    static const struct {
        const char *body;
        long status;
    } calls[] = {
        {"not json", 400},
        {"{\"prompt\": \"x\"}", 400},
        {"{\"model\": 5, \"prompt\": \"x\"}", 400},
        {"{\"model\": \"nope\", \"prompt\": \"x\"}", 404},
        {"{\"model\": \"first\", \"prompt\": \"x\"}", 404},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(calls); i++) {
        long code = 0;
        px_err perr;
        (void)px_fleet_client_send(user, "POST", "/v1/chat/completions", calls[i].body,
                                   strlen(calls[i].body), &code, NULL, &perr);
        assert_int_equal(code, calls[i].status);
    }
    long code = 0;
    px_err perr;
    (void)px_fleet_client_send(user, "POST", "/v1/agent/stages", "{\"reports\": []}", 15, &code,
                               NULL, &perr);
    assert_int_equal(code, 403);
    px_fleet_client_free(user);
    px_fleet_client *anon = fh_client(&f, NULL);
    (void)px_fleet_client_send(anon, "POST", "/v1/completions", "{}", 2, &code, NULL, &perr);
    assert_int_equal(code, 401);
    px_fleet_client_free(anon);
    /* The deployment still serves. */
    json_decref(wait_state(&f, "second", "serving", 10));
    free(big);
    free(small);
    fh_fleet_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deployment_serves_streams_and_heals_across_nodes),
        cmocka_unit_test(test_eviction_for_a_deployment_is_explained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
