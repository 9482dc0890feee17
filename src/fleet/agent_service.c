/*
 * Health checks of services: an HTTP GET on 127.0.0.1:PORT/PATH that must
 * answer 2xx within a second, or a command that must exit 0 within five.
 * Only the loopback address is ever contacted.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <curl/curl.h>

static size_t discard(char *ptr, size_t size, size_t nmemb, void *ud)
{
    (void)ptr, (void)ud;
    return size * nmemb;
}

static bool http_check(long port, const char *path, char *why, size_t n)
{
    if (port < 1 || port > 65535) {
        snprintf(why, n, "service port %ld is out of range", port);
        return false;
    }
    char url[2300];
    snprintf(url, sizeof url, "http://127.0.0.1:%ld%s%s", port, path[0] == '/' ? "" : "/", path);
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(why, n, "cannot start an HTTP client");
        return false;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        snprintf(why, n, "GET %s: %s", url, curl_easy_strerror(rc));
        return false;
    }
    if (code < 200 || code >= 300) {
        snprintf(why, n, "GET %s answered %ld", url, code);
        return false;
    }
    return true;
}

static bool command_check(const json_t *argv_json, const px__proc_spec *as, char *why, size_t n)
{
    size_t count = json_array_size(argv_json);
    if (count == 0 || count > 64) {
        snprintf(why, n, "health_command must hold 1 to 64 strings");
        return false;
    }
    char *argv[65];
    for (size_t i = 0; i < count; i++) {
        argv[i] = (char *)json_string_value(json_array_get(argv_json, i));
        if (!argv[i]) {
            snprintf(why, n, "health_command/%zu is not a string", i);
            return false;
        }
    }
    argv[count] = NULL;
    /* The job's command, so the job's user and folder: never the agent's. */
    px__proc_spec spec = as ? *as : (px__proc_spec){0};
    spec.argv = argv;
    spec.shell = NULL;
    px__proc_exit ex = {0};
    px_err err;
    if (px__proc_run_capture(&spec, 5000, 0, NULL, &ex, &err) != PX_OK) {
        snprintf(why, n, "health command: %s", err.msg);
        return false;
    }
    if (ex.code != 0) {
        if (ex.signal)
            snprintf(why, n, "health command \"%s\" was killed by signal %d", argv[0], ex.signal);
        else
            snprintf(why, n, "health command \"%s\" exited %d", argv[0], ex.code);
        return false;
    }
    return true;
}

bool px__agent_health_check(const json_t *service, const px__proc_spec *as, char *why, size_t n)
{
    why[0] = '\0';
    const char *path = json_string_value(json_object_get(service, "health_path"));
    if (path)
        return http_check((long)json_integer_value(json_object_get(service, "port")), path, why, n);
    const json_t *cmd = json_object_get(service, "health_command");
    if (cmd)
        return command_check(cmd, as, why, n);
    return true;
}
