/*
 * Denial of service by clients without a token, on 127.0.0.1 with a real
 * server: bodies are refused before they are read (eleven unauthenticated
 * uploads of 50 MB hold nothing), one address cannot take every
 * connection (530 half-open connections from 127.0.0.2 leave room for a
 * client on 127.0.0.1), and a connection that trickles its headers is
 * closed after the header timeout.  The assertions are that the
 * legitimate client is served at all while the hostile connections are
 * held, not how fast: the figures are in bench/bench_fleet_api.c.
 */
#include "fleet_harness.h"

#include <sys/resource.h>

static fh_fleet fleet;

static int setup(void **state)
{
    (void)state;
    /* Room for the hostile sockets of this test in this process. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096 && rl.rlim_max >= 4096) {
        rl.rlim_cur = 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    fleet.extra_server_args[0] = "--header-timeout";
    fleet.extra_server_args[1] = "2";
    fleet.extra_server_args[2] = NULL;
    fh_fleet_start(&fleet, "dos", 10);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fh_fleet_stop(&fleet);
    return 0;
}

/* A connection to the server from a source address of the loopback
 * network (127.0.0.2 is another client as far as the server knows). */
static int connect_from(const char *source)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, source, &src.sin_addr);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fleet.port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (bind(s, (struct sockaddr *)&src, sizeof src) != 0 ||
        connect(s, (struct sockaddr *)&dst, sizeof dst) != 0) {
        close(s);
        return -1;
    }
    return s;
}

/* The legitimate client: a user's call must be answered. */
static void served(const char *what)
{
    px_fleet_client *c = fh_client(&fleet, FH_USER_TOKEN);
    px_fleet_client_set_timeout(c, 30000);
    json_t *spec = json_pack("{s:[s]}", "command", "/bin/true"), *reply = NULL;
    long code = 0;
    px_err err;
    if (px_fleet_client_call(c, "POST", "/v1/jobs", spec, &code, &reply, &err) != PX_OK)
        fail_msg("%s: a legitimate submission was not served: %s", what, err.msg);
    assert_int_equal(code, 201);
    json_decref(reply);
    json_decref(spec);
    px_fleet_client_free(c);
}

static void test_unauthenticated_bodies_are_refused_before_they_are_read(void **state)
{
    (void)state;
    const size_t per = (size_t)50 << 20;
    char *chunk = calloc(1, 1 << 20);
    int socks[11];
    size_t sent_total = 0;
    for (int i = 0; i < 11; i++) {
        socks[i] = connect_from("127.0.0.1");
        assert_true(socks[i] >= 0);
        char head[256];
        int n = snprintf(head, sizeof head,
                         "POST /v1/blobs HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         "application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
                         per + (1u << 20));
        assert_int_equal(write(socks[i], head, (size_t)n), n);
        /* Write what the server takes: nothing, once it has answered 401. */
        for (size_t sent = 0; sent < per;) {
            ssize_t w = write(socks[i], chunk, 1 << 20);
            if (w <= 0)
                break;
            sent += (size_t)w;
            sent_total += (size_t)w;
        }
    }
    /* Refused at once: far less than the 550 MB reached the server. */
    print_message("hostile clients managed to send %zu bytes\n", sent_total);
    assert_true(sent_total < ((size_t)11 * per) / 4);
    served("eleven unauthenticated uploads");
    char buf[512];
    ssize_t got = read(socks[0], buf, sizeof buf - 1);
    if (got > 0) {
        buf[got] = '\0';
        px_assert_contains(buf, "401");
    }
    for (int i = 0; i < 11; i++)
        close(socks[i]);
    free(chunk);
}

static void test_half_open_connections_of_one_address_leave_room_for_others(void **state)
{
    (void)state;
    int socks[530];
    int open = 0;
    const char *partial = "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 530; i++) {
        socks[i] = connect_from("127.0.0.2");
        if (socks[i] >= 0 && write(socks[i], partial, strlen(partial)) > 0)
            open++;
    }
    print_message("%d hostile connections from 127.0.0.2 wrote half a request\n", open);
    served("530 half-open connections");
    /* The connections the server kept are closed after the header timeout
     * (2 s here): each reads an end of file, or a reset. */
    uint64_t deadline = px_now_ns() + 60ull * 1000000000ull;
    int still = 0;
    for (int i = 0; i < 530; i++) {
        if (socks[i] < 0)
            continue;
        char buf[256];
        for (;;) {
            ssize_t r = read(socks[i], buf, sizeof buf);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                break; /* closed by the server */
            if (r < 0 && px_now_ns() > deadline) {
                still++;
                break;
            }
        }
        close(socks[i]);
    }
    if (still)
        fail_msg("%d half-open connections were still open after a minute", still);
    served("after the hostile connections");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unauthenticated_bodies_are_refused_before_they_are_read),
        cmocka_unit_test(test_half_open_connections_of_one_address_leave_room_for_others),
    };
    signal(SIGPIPE, SIG_IGN);
    alarm(FH_SECONDS(200));
    if (getenv("PX_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
