/*
 * The dashboard of a real `plexus server` (2 s lease) on 127.0.0.1 with
 * real agents: first over plain HTTP (the login, the session cookie and
 * its flags, CSRF refusals, the security headers, an unauthenticated
 * browser seeing only the login page, bounded bodies), then in headless
 * Chromium driven over the DevTools protocol by tests/node/ui_browser.mjs:
 * log in, a node appearing when its agent starts, a job named like markup
 * rendered as text finishing with its log, a killed agent followed into
 * its incident, a deployment of the shared tiny model drawn on its node
 * and undeployed through the page, one planned over three nodes with its
 * observed figures charted and a reported incident, every page at
 * 1280x800 and on a narrow
 * screen, actions with confirmation, no console errors.  Screenshots go to
 * build/test-artifacts/ui/.  The browser part skips, saying so, when
 * Chromium or puppeteer-core is not installed (scripts/install-deps).
 */
#include "fleet_harness.h"

#include <curl/curl.h>

static fh_fleet fleet;

static int setup(void **state)
{
    (void)state;
    fh_fleet_start(&fleet, "ui", 2);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    return 0;
}

/* ---- plain HTTP ---- */

typedef struct http_reply {
    long status;
    px_strbuf headers, body;
} http_reply;

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
    px_strbuf_add(ud, p, size * n);
    return size * n;
}

/* One request; headers NULL-ended; no redirects followed. */
static void http(const char *method, const char *path, const char *const *headers, const char *body,
                 http_reply *r)
{
    memset(r, 0, sizeof *r);
    px_strbuf_init(&r->headers);
    px_strbuf_init(&r->body);
    CURL *c = curl_easy_init();
    char url[400];
    snprintf(url, sizeof url, "%s%s", fleet.url, path);
    struct curl_slist *hl = NULL;
    for (size_t i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK)
        fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
}

static void http_release(http_reply *r)
{
    px_strbuf_release(&r->headers);
    px_strbuf_release(&r->body);
}

/* The value of a response header (case-insensitive name), or "". */
static void header(const http_reply *r, const char *name, char *out, size_t n)
{
    out[0] = '\0';
    size_t len = strlen(name);
    for (const char *p = r->headers.buf; p && *p;) {
        const char *end = strstr(p, "\r\n");
        if (!end)
            break;
        if (strncasecmp(p, name, len) == 0 && p[len] == ':') {
            const char *v = p + len + 1;
            while (*v == ' ')
                v++;
            snprintf(out, n, "%.*s", (int)(end - v), v);
            return;
        }
        p = end + 2;
    }
}

/* Logs in with a token; returns the Cookie header to send ("" when
 * refused) and the status. */
static long login(const char *token, char *cookie, size_t n)
{
    char body[400];
    snprintf(body, sizeof body, "token=%s", token);
    const char *hdrs[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
    http_reply r;
    http("POST", "/ui/login", hdrs, body, &r);
    char set[1200];
    header(&r, "Set-Cookie", set, sizeof set);
    cookie[0] = '\0';
    if (set[0]) {
        assert_non_null(strstr(set, "HttpOnly"));
        assert_non_null(strstr(set, "SameSite=Strict"));
        assert_non_null(strstr(set, "Path=/"));
        assert_null(strstr(set, token)); /* the token itself is not in the cookie as text */
        char *semi = strchr(set, ';');
        snprintf(cookie, n, "Cookie: %.*s", (int)(semi ? semi - set : (ptrdiff_t)strlen(set)), set);
    }
    long status = r.status;
    http_release(&r);
    return status;
}

static void test_unauthenticated_browser_sees_only_the_login_page(void **state)
{
    (void)state;
    const char *paths[] = {"/ui", "/ui/", "/ui/index.html", "/ui/app.js", "/ui/#/jobs"};
    for (size_t i = 0; i < PX_ARRAY_LEN(paths); i++) {
        http_reply r;
        http("GET", paths[i], NULL, NULL, &r);
        char loc[200];
        header(&r, "Location", loc, sizeof loc);
        if (r.status != 303 || strcmp(loc, "/ui/login") != 0)
            fail_msg("GET %s without a session: %ld to \"%s\"", paths[i], r.status, loc);
        assert_null(strstr(r.body.buf, "app.js"));
        http_release(&r);
    }
    http_reply r;
    http("GET", "/ui/login", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.buf, "name=\"token\""));
    char csp[400];
    header(&r, "Content-Security-Policy", csp, sizeof csp);
    assert_non_null(strstr(csp, "default-src 'none'"));
    assert_non_null(strstr(csp, "script-src 'self'"));
    assert_null(strstr(csp, "unsafe-inline"));
    assert_null(strstr(r.body.buf, "<script>")); /* no inline script to allow */
    char nosniff[64];
    header(&r, "X-Content-Type-Options", nosniff, sizeof nosniff);
    assert_string_equal(nosniff, "nosniff");
    http_release(&r);
    http("GET", "/ui/events", NULL, NULL, &r);
    assert_int_equal(r.status, 401);
    http_release(&r);
    http("GET", "/ui/api/incidents", NULL, NULL, &r);
    assert_int_equal(r.status, 401);
    http_release(&r);
    /* The API refuses a cookieless call as before. */
    http("GET", "/v1/jobs", NULL, NULL, &r);
    assert_int_equal(r.status, 401);
    http_release(&r);
}

static void test_login_takes_only_a_user_token_and_sets_a_strict_cookie(void **state)
{
    (void)state;
    char cookie[1200];
    /* Refused: the form again with the reason, and no cookie. */
    assert_int_equal(login("wrong-token-0123456789abcdef", cookie, sizeof cookie), 200);
    assert_string_equal(cookie, "");
    /* The join token joins nodes; it does not log in. */
    assert_int_equal(login(FH_CLUSTER_TOKEN, cookie, sizeof cookie), 200);
    assert_string_equal(cookie, "");
    assert_int_equal(login(FH_USER_TOKEN, cookie, sizeof cookie), 303);
    assert_true(cookie[0] != '\0');
    const char *with[] = {cookie, NULL};
    http_reply r;
    http("GET", "/ui/", with, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.buf, "/ui/app.js"));
    http_release(&r);
    http("GET", "/v1/jobs", with, NULL, &r);
    assert_int_equal(r.status, 200);
    http_release(&r);
    /* A forged cookie is no session. */
    const char *forged[] = {"Cookie: plexus_session=6162636465666768696a6b6c6d6e6f70", NULL};
    http("GET", "/v1/jobs", forged, NULL, &r);
    assert_int_equal(r.status, 401);
    http_release(&r);
    http("GET", "/ui/", forged, NULL, &r);
    assert_int_equal(r.status, 303);
    http_release(&r);
    /* A login from another site's page is refused. */
    const char *cross[] = {"Content-Type: application/x-www-form-urlencoded",
                           "Origin: http://evil.example", NULL};
    char body[128];
    snprintf(body, sizeof body, "token=%s", FH_USER_TOKEN);
    http("POST", "/ui/login", cross, body, &r);
    assert_int_equal(r.status, 403);
    http_release(&r);
    /* The form is bounded: a huge body is refused before it is read. */
    char *big = calloc(1, 10001);
    memset(big, 'a', 10000);
    http("POST", "/ui/login", NULL, big, &r);
    assert_int_equal(r.status, 413);
    http_release(&r);
    free(big);
}

static void test_cookie_changes_need_the_csrf_header_and_same_origin(void **state)
{
    (void)state;
    char cookie[1200];
    assert_int_equal(login(FH_USER_TOKEN, cookie, sizeof cookie), 303);
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sleep\", \"30\"], \"resources\": "
                                 "{\"cpus\": 100000}}");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    http_reply r;
    const char *no_header[] = {cookie, NULL};
    http("POST", path, no_header, NULL, &r);
    assert_int_equal(r.status, 403);
    assert_non_null(strstr(r.body.buf, "X-Plexus-CSRF"));
    http_release(&r);
    const char *cross[] = {cookie, "X-Plexus-CSRF: 1", "Origin: http://evil.example", NULL};
    http("POST", path, cross, NULL, &r);
    assert_int_equal(r.status, 403);
    http_release(&r);
    const char *site[] = {cookie, "X-Plexus-CSRF: 1", "Sec-Fetch-Site: cross-site", NULL};
    http("POST", path, site, NULL, &r);
    assert_int_equal(r.status, 403);
    http_release(&r);
    json_t *job = fh_job(&fleet, id);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "queued");
    json_decref(job);
    char origin[300];
    snprintf(origin, sizeof origin, "Origin: %s", fleet.url);
    const char *same[] = {cookie, "X-Plexus-CSRF: 1", origin, NULL};
    http("POST", path, same, NULL, &r);
    assert_int_equal(r.status, 200);
    http_release(&r);
    /* Another user's session does not reach this user's job. */
    char other[1200];
    assert_int_equal(login(FH_OTHER_TOKEN, other, sizeof other), 303);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    const char *as_other[] = {other, NULL};
    http("GET", path, as_other, NULL, &r);
    assert_int_equal(r.status, 404);
    http_release(&r);
    /* Logging out clears the cookie. */
    const char *out_hdrs[] = {cookie, origin, NULL};
    http("POST", "/ui/logout", out_hdrs, "", &r);
    assert_int_equal(r.status, 303);
    char set[300];
    header(&r, "Set-Cookie", set, sizeof set);
    assert_non_null(strstr(set, "Max-Age=0"));
    http_release(&r);
    free(id);
}

static void test_event_stream_sends_a_snapshot_of_what_the_user_may_see(void **state)
{
    (void)state;
    char cookie[1200];
    assert_int_equal(login(FH_OTHER_TOKEN, cookie, sizeof cookie), 303);
    /* Read the stream's first events with a short timeout. */
    CURL *c = curl_easy_init();
    char url[400];
    snprintf(url, sizeof url, "%s/ui/events", fleet.url);
    struct curl_slist *hl = curl_slist_append(NULL, cookie);
    px_strbuf body = PX_STRBUF_INIT;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1500L);
    CURLcode rc = curl_easy_perform(c);
    assert_int_equal(rc, CURLE_OPERATION_TIMEDOUT); /* a stream does not end by itself */
    char *ctype = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ctype);
    assert_non_null(ctype);
    assert_non_null(strstr(ctype, "text/event-stream"));
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    const char *ev = strstr(body.buf, "event: snapshot\ndata: ");
    assert_non_null(ev);
    const char *data = ev + strlen("event: snapshot\ndata: ");
    const char *end = strchr(data, '\n');
    assert_non_null(end);
    json_error_t je;
    json_t *snap = json_loadb(data, (size_t)(end - data), 0, &je);
    if (!snap)
        fail_msg("snapshot: %s", je.text);
    assert_string_equal(json_string_value(json_object_get(json_object_get(snap, "user"), "name")),
                        "other");
    assert_true(json_is_array(json_object_get(snap, "nodes")));
    /* The user "other" submitted nothing: the tester's jobs are not listed. */
    assert_int_equal(json_array_size(json_object_get(snap, "jobs")), 0);
    assert_true(json_is_array(json_object_get(snap, "deployments")));
    json_decref(snap);
    px_strbuf_release(&body);
}

/* The first 1.5 s of /ui/events?job=ID with the cookie and optional
 * headers. */
static void read_stream(const char *cookie, const char *job, const char *extra, px_strbuf *body)
{
    CURL *c = curl_easy_init();
    char url[400];
    snprintf(url, sizeof url, "%s/ui/events?job=%s", fleet.url, job);
    struct curl_slist *hl = curl_slist_append(NULL, cookie);
    if (extra)
        hl = curl_slist_append(hl, extra);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1500L);
    assert_int_equal(curl_easy_perform(c), CURLE_OPERATION_TIMEDOUT);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
}

static void test_event_stream_resumes_a_job_log_after_last_event_id(void **state)
{
    (void)state;
    fh_start_agent(&fleet, "c", NULL);
    const char *names[] = {"c"};
    fh_wait_nodes_online(&fleet, names, 1, 30);
    char *id = fh_submit(&fleet, "{\"command\": [\"/bin/sh\", \"-c\", \"echo one; sleep 0.5; "
                                 "echo two; sleep 0.5; echo three\"]}");
    json_decref(fh_wait_job(&fleet, id, "succeeded", 60));
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after=0", id);
    json_t *logs = fh_api(&fleet, "GET", path, NULL);
    json_t *chunks = json_object_get(logs, "chunks");
    assert_true(json_array_size(chunks) >= 2);
    json_int_t first = json_integer_value(json_object_get(json_array_get(chunks, 0), "seq"));
    json_decref(logs);
    char cookie[1200];
    assert_int_equal(login(FH_USER_TOKEN, cookie, sizeof cookie), 303);
    px_strbuf all = PX_STRBUF_INIT, rest = PX_STRBUF_INIT;
    read_stream(cookie, id, NULL, &all);
    px_assert_contains(all.buf, "event: log\n");
    px_assert_contains(all.buf, "one");
    px_assert_contains(all.buf, "three");
    px_assert_contains(all.buf, "event: logend\n");
    /* Reconnecting after the first chunk resumes after it. */
    char last[64], first_id[64];
    snprintf(last, sizeof last, "Last-Event-ID: %lld", (long long)first);
    snprintf(first_id, sizeof first_id, "id: %lld\n", (long long)first);
    read_stream(cookie, id, last, &rest);
    assert_null(strstr(rest.buf, first_id));
    assert_null(strstr(rest.buf, "\"one\\n\""));
    px_assert_contains(rest.buf, "three");
    px_assert_contains(rest.buf, "event: logend\n");
    /* Another user's stream of this job carries none of it. */
    char other[1200];
    assert_int_equal(login(FH_OTHER_TOKEN, other, sizeof other), 303);
    px_strbuf theirs = PX_STRBUF_INIT;
    read_stream(other, id, NULL, &theirs);
    assert_null(strstr(theirs.buf, "event: log\n"));
    assert_null(strstr(theirs.buf, "three"));
    px_assert_contains(theirs.buf, "no such job");
    px_strbuf_release(&all);
    px_strbuf_release(&rest);
    px_strbuf_release(&theirs);
    free(id);
}

/* ---- in a real browser ---- */

static const char *chromium(void)
{
    static const char *const paths[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser"};
    const char *env = getenv("CHROMIUM");
    if (env && access(env, X_OK) == 0)
        return env;
    for (size_t i = 0; i < PX_ARRAY_LEN(paths); i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

static int agent_index(const char *name)
{
    for (int i = 0; i < fleet.n_agents; i++)
        if (!strcmp(fleet.agents[i].name, name))
            return i;
    return -1;
}

static void test_dashboard_in_headless_chromium(void **state)
{
    (void)state;
    const char *browser = chromium();
    char *mod = px_test_source_path("tests/node/node_modules/puppeteer-core/package.json");
    bool have_puppeteer = access(mod, R_OK) == 0;
    free(mod);
    if (!browser) {
        print_message("skipped: chromium is not installed (apt-get install chromium; "
                      "scripts/install-deps installs it)\n");
        skip();
    }
    if (!have_puppeteer) {
        print_message(
            "skipped: puppeteer-core is not installed in tests/node (scripts/install-deps "
            "runs npm ci there)\n");
        skip();
    }
    char shots[700];
    snprintf(shots, sizeof shots, "%s/test-artifacts/ui", PX_BINARY_DIR);
    char *script = px_test_source_path("tests/node/ui_browser.mjs");
    setenv("PLEXUS_URL", fleet.url, 1);
    setenv("PLEXUS_TOKEN", FH_ADMIN_TOKEN, 1);
    setenv("PLEXUS_OTHER_TOKEN", FH_OTHER_TOKEN, 1);
    setenv("CHROMIUM", browser, 1);
    setenv("UI_SHOTS", shots, 1);
    /* With the shared tiny model, a job planned across the fleet and a
     * deployment, undeployed through the page, too. */
    char *model = px_test_shared_model("stories260K.gguf");
    bool have_model = model && access(model, R_OK) == 0;
    if (have_model) {
        setenv("PLEXUS_MODEL", model, 1);
        setenv("PLEXUS_INCIDENT", PX_SOURCE_DIR "/tests/data/fleet/incident-recovery.json", 1);
    } else {
        unsetenv("PLEXUS_MODEL");
        print_message("note: the shared model stories260K.gguf is absent: the planned job and "
                      "the deployment are not shown (../shared/models)\n");
    }
    free(model);
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    char errlog[700];
    snprintf(errlog, sizeof errlog, "%s/ui-browser.log", fleet.dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        int fd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0)
            dup2(fd, 2);
        close(to_child[1]);
        close(from_child[0]);
        execlp("node", "node", script, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    if (fh_n_pids < (int)PX_ARRAY_LEN(fh_all_pids))
        fh_all_pids[fh_n_pids++] = pid;
    close(to_child[0]);
    close(from_child[1]);
    FILE *in = fdopen(from_child[0], "r");
    char line[8192];
    char *result = NULL;
    while (fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        const char *reply = "ok\n";
        if (px_str_starts_with(line, "start-agent ")) {
            /* A node with one emulated L4 (the dashboard shows it as
             * emulated). */
            char name[32];
            snprintf(name, sizeof name, "%.31s", line + 12);
            char *inv = fh_inventory(&fleet, name, FH_L4("gpu0"), "");
            fh_start_agent(&fleet, name, inv);
            free(inv);
        } else if (px_str_starts_with(line, "kill-agent ")) {
            int k = agent_index(line + 11);
            if (k < 0)
                reply = "no-such-agent\n";
            else {
                /* The node's loss: the agent and its jobs, with no
                 * chance to say goodbye. */
                kill(-fleet.agents[k].pid, SIGKILL);
                waitpid(fleet.agents[k].pid, NULL, 0);
                fh_forget(fleet.agents[k].pid);
                fleet.agents[k].pid = 0;
            }
        } else if (px_str_starts_with(line, "result ")) {
            free(result);
            result = px_strdup(line + 7);
            continue;
        } else {
            continue;
        }
        if (write(to_child[1], reply, strlen(reply)) < 0)
            break;
    }
    fclose(in);
    close(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    fh_forget(pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fh_print_log(errlog);
        fh_print_log(fleet.server.log);
        fail_msg("the browser test failed (status %d); screenshots in %s", status, shots);
    }
    assert_non_null(result);
    print_message("browser: %s\nscreenshots: %s\n", result, shots);
    json_t *seen = json_loads(result, 0, NULL);
    assert_non_null(seen);
    assert_true(json_array_size(json_object_get(seen, "nodes")) >= 2);
    assert_true(json_array_size(json_object_get(json_object_get(seen, "incident"), "timeline")) >=
                3);
    if (have_model) {
        json_t *dep = json_object_get(seen, "deployment");
        assert_true(json_integer_value(json_object_get(dep, "stages")) >= 1);
        assert_true(json_is_true(json_object_get(seen, "undeployed")));
        json_t *multi = json_object_get(seen, "multi");
        assert_true(json_array_size(json_object_get(multi, "nodes")) >= 3);
        assert_true(json_array_size(json_object_get(multi, "observed")) >= 1);
    }
    json_decref(seen);
    free(result);
    free(script);
    char png[800];
    snprintf(png, sizeof png, "%s/incident-1280.png", shots);
    assert_int_equal(access(png, R_OK), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unauthenticated_browser_sees_only_the_login_page),
        cmocka_unit_test(test_login_takes_only_a_user_token_and_sets_a_strict_cookie),
        cmocka_unit_test(test_cookie_changes_need_the_csrf_header_and_same_origin),
        cmocka_unit_test(test_event_stream_sends_a_snapshot_of_what_the_user_may_see),
        cmocka_unit_test(test_dashboard_in_headless_chromium),
        cmocka_unit_test(test_event_stream_resumes_a_job_log_after_last_event_id),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
