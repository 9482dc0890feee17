/*
 * One HTTP request of a test to a server on 127.0.0.1 (static; libcurl):
 * the status, the body and the body as JSON (NULL when it is not JSON).
 * A request that gets no answer has status 0 and the transport's error as
 * its body; the helper never fails the test itself, so that a thread of
 * the test may call it.
 *
 *     px_test_reply r = px_test_http(url, "GET", "/v1/jobs", token, NULL, 0, 20);
 *     assert_int_equal(r.status, 200);
 *     px_test_reply_drop(&r);
 */
#ifndef PX_TEST_HTTP_REPLY_H
#define PX_TEST_HTTP_REPLY_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"

typedef struct px_test_reply {
    long status;
    char *body;
    json_t *json;
} px_test_reply;

static inline size_t px_test_reply_data(char *p, size_t size, size_t n, void *ud)
{
    px_strbuf_add(ud, p, size * n);
    return size * n;
}

/* method base + path with a bearer token (NULL: none) and len bytes of
 * body (NULL: none), within timeout_s seconds.  As the fleet's client
 * does, a body of 1 MiB or more waits for the server's "100 Continue", so
 * that a refusal (413) arrives as an answer, not as a reset in the middle
 * of the body on a busy machine. */
static inline px_test_reply px_test_http(const char *base, const char *method, const char *path,
                                         const char *token, const char *body, size_t len,
                                         long timeout_s)
{
    px_test_reply r = {0};
    CURL *c = curl_easy_init();
    if (!c) {
        r.body = px_strdup("cannot start a libcurl handle");
        return r;
    }
    char url[512], auth[300];
    snprintf(url, sizeof url, "%s%s", base, path);
    px_strbuf out = PX_STRBUF_INIT;
    struct curl_slist *h = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    h = curl_slist_append(h, len < (1u << 20) ? "Expect:" : "Expect: 100-continue");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, px_test_reply_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        px_strbuf_release(&out);
        r.body = px_strdup(curl_easy_strerror(rc));
        return r;
    }
    r.body = px_strbuf_detach(&out, NULL);
    r.json = r.body ? json_loads(r.body, JSON_DECODE_ANY, NULL) : NULL;
    return r;
}

static inline void px_test_reply_drop(px_test_reply *r)
{
    free(r->body);
    json_decref(r->json);
    *r = (px_test_reply){0};
}

#endif
