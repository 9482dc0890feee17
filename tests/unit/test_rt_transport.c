/* The pipeline's framed transport: frames round trip over Unix and TCP
 * sockets; truncated frames, corrupted checksums, oversized lengths, wrong
 * magic and version each give a clear error; a silent peer times out
 * within the limit; the hello refuses another model; the fault hooks add
 * latency and cut the link. */
#include "px_test.h"

#include <stddef.h>
#include <math.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plexus/rt.h"
#include "rt/worker_fault.h"

/* A listener, a raw client socket connected to it (to write anything at
 * all), and the accepted end as a px_rt_conn. */
typedef struct pair {
    px_rt_listener *l;
    int raw;
    px_rt_conn *server;
} pair;

static void pair_open(pair *p, int timeout_ms)
{
    char *addr = px_asprintf("unix:%s/t-%d.sock", px_test_tmpdir(), (int)getpid());
    px_err err;
    px_assert_ok(px_rt_listener_new(addr, &p->l, &err), &err);
    p->raw = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof un.sun_path, "%s", addr + 5);
    assert_int_equal(connect(p->raw, (struct sockaddr *)&un, sizeof un), 0);
    px_assert_ok(px_rt_listener_accept(p->l, 2000, "the test peer", &p->server, &err), &err);
    px_rt_conn_set_timeout(p->server, timeout_ms);
    free(addr);
}

static void pair_close(pair *p)
{
    if (p->raw >= 0)
        close(p->raw);
    px_rt_conn_free(p->server);
    px_rt_listener_free(p->l);
}

static void raw_frame(int fd, uint32_t magic, uint16_t version, uint8_t type, const void *payload,
                      uint32_t len, uint32_t claimed_len, uint32_t crc)
{
    px_rt_frame_header h = {.magic = magic,
                            .version = version,
                            .type = type,
                            .seq = 7,
                            .length = claimed_len,
                            .checksum = crc};
    uint8_t hb[PX_RT_FRAME_HEADER_BYTES];
    px_rt_frame_header_encode(&h, hb);
    assert_int_equal(write(fd, hb, sizeof hb), (ssize_t)sizeof hb);
    if (len)
        assert_int_equal(write(fd, payload, len), (ssize_t)len);
}

static void test_crc32_matches_the_standard_check_value(void **state)
{
    (void)state;
    assert_int_equal(px_rt_crc32(0, "123456789", 9), 0xCBF43926u);
    /* Incremental equals one shot. */
    uint32_t a = px_rt_crc32(px_rt_crc32(0, "1234", 4), "56789", 5);
    assert_int_equal(a, 0xCBF43926u);
}

static void test_frames_round_trip_over_unix_and_tcp(void **state)
{
    (void)state;
    const char *addrs[2];
    char *unix_addr = px_asprintf("unix:%s/rt.sock", px_test_tmpdir());
    addrs[0] = unix_addr;
    addrs[1] = "tcp:127.0.0.1:0";
    for (int k = 0; k < 2; k++) {
        px_err err;
        px_rt_listener *l;
        px_assert_ok(px_rt_listener_new(addrs[k], &l, &err), &err);
        px_rt_conn *c, *s;
        px_assert_ok(px_rt_conn_connect(px_rt_listener_address(l), 2000, "server", &c, &err), &err);
        px_assert_ok(px_rt_listener_accept(l, 2000, "client", &s, &err), &err);
        size_t big = 3u << 20;
        uint8_t *data = malloc(big);
        for (size_t i = 0; i < big; i++)
            data[i] = (uint8_t)(i * 31 + 7);
        uint32_t sizes[] = {0, 1, 24, 4096, (uint32_t)big};
        for (size_t i = 0; i < PX_ARRAY_LEN(sizes); i++) {
            /* A large frame does not fit the socket buffer: send it from
             * a child while this side reads. */
            pid_t pid = fork();
            if (pid == 0) {
                px_status st = px_rt_conn_send(c, PX_RT_FRAME_STEP, 3, data, sizes[i], NULL);
                _exit(st == PX_OK ? 0 : 1);
            }
            px_rt_frame_header h;
            const uint8_t *p;
            px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
            assert_int_equal(h.type, PX_RT_FRAME_STEP);
            assert_int_equal(h.flags, 3);
            assert_int_equal(h.length, sizes[i]);
            if (sizes[i])
                assert_memory_equal(p, data, sizes[i]);
            int status;
            waitpid(pid, &status, 0);
            assert_int_equal(WEXITSTATUS(status), 0);
        }
        /* Parts are concatenated; sequence numbers count up. */
        const void *parts[3] = {"ab", "", "cde"};
        uint32_t lens[3] = {2, 0, 3};
        px_assert_ok(px_rt_conn_sendv(s, PX_RT_FRAME_SEQ, 0, parts, lens, 3, &err), &err);
        px_assert_ok(px_rt_conn_sendv(s, PX_RT_FRAME_SEQ, 0, parts, lens, 3, &err), &err);
        px_rt_frame_header h;
        const uint8_t *p;
        px_assert_ok(px_rt_conn_recv(c, &h, &p, &err), &err);
        assert_int_equal(h.length, 5);
        assert_memory_equal(p, "abcde", 5);
        uint64_t first = h.seq;
        px_assert_ok(px_rt_conn_recv(c, &h, &p, &err), &err);
        assert_int_equal(h.seq, first + 1);
        uint64_t fo, bo, fi, bi;
        px_rt_conn_counters(c, &fo, &bo, &fi, &bi);
        assert_int_equal(fi, 2);
        assert_int_equal(bi, 2 * (5 + PX_RT_FRAME_HEADER_BYTES));
        free(data);
        px_rt_conn_free(c);
        px_rt_conn_free(s);
        px_rt_listener_free(l);
    }
    free(unix_addr);
}

static void expect_recv_error(pair *p, px_status code, const char *needle)
{
    px_err err;
    px_rt_frame_header h;
    const uint8_t *payload;
    px_status st = px_rt_conn_recv(p->server, &h, &payload, &err);
    if (st != code)
        fail_msg("expected %s, got %s: %s", px_status_name(code), px_status_name(st), err.msg);
    px_assert_contains(err.msg, needle);
    px_assert_contains(err.msg, "the test peer");
}

static void test_truncated_frame_is_an_error(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 2000);
    uint8_t payload[10] = {0};
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, payload, 10, 100, 0);
    close(p.raw);
    p.raw = -1;
    expect_recv_error(&p, PX_EPEER, "truncated frame");
    pair_close(&p);

    /* Cut inside the header. */
    pair_open(&p, 2000);
    assert_int_equal(write(p.raw, "PXFR\1", 5), 5);
    close(p.raw);
    p.raw = -1;
    expect_recv_error(&p, PX_EPEER, "5 of the header's 24 bytes");
    pair_close(&p);
}

static void test_corrupted_checksum_is_an_error(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 2000);
    const char payload[] = "hidden states";
    uint32_t crc = px_rt_crc32(0, payload, sizeof payload);
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, payload,
              sizeof payload, sizeof payload, crc ^ 0x10);
    expect_recv_error(&p, PX_EPARSE, "corrupted");
    pair_close(&p);
}

static void test_oversized_length_is_refused_before_reading(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 2000);
    px_rt_conn_set_max_payload(p.server, 1024);
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, NULL, 0, 0xFFFFFFF0u,
              0);
    expect_recv_error(&p, PX_ELIMIT, "exceeds the 1024 agreed");
    pair_close(&p);
}

static void test_wrong_magic_and_version_are_refused(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 2000);
    raw_frame(p.raw, 0x54544548u /* "HETT" */, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, NULL, 0, 0,
              0);
    expect_recv_error(&p, PX_EPARSE, "wrong magic");
    pair_close(&p);

    pair_open(&p, 2000);
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, 9, PX_RT_FRAME_STEP, NULL, 0, 0, 0);
    expect_recv_error(&p, PX_EUNSUPPORTED, "transport version 9");
    pair_close(&p);

    pair_open(&p, 2000);
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, 77, NULL, 0, 0, 0);
    expect_recv_error(&p, PX_EPARSE, "unknown type 77");
    pair_close(&p);
}

static void test_silent_peer_times_out_within_the_limit(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 300);
    uint64_t t0 = px_now_ns();
    expect_recv_error(&p, PX_ETIMEOUT, "sent nothing for 300 ms");
    double s = (double)(px_now_ns() - t0) / 1e9;
    assert_true(s >= 0.29 && s < 2.0);

    /* A peer that stops mid-frame times out too. */
    uint8_t payload[8] = {0};
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, payload, 8, 64, 0);
    t0 = px_now_ns();
    expect_recv_error(&p, PX_ETIMEOUT, "stopped mid-frame");
    s = (double)(px_now_ns() - t0) / 1e9;
    assert_true(s < 2.0);
    pair_close(&p);
}

static void test_connect_to_nobody_times_out(void **state)
{
    (void)state;
    char *addr = px_asprintf("unix:%s/nobody.sock", px_test_tmpdir());
    px_rt_conn *c = NULL;
    px_err err;
    uint64_t t0 = px_now_ns();
    assert_int_equal(px_rt_conn_connect(addr, 200, "stage 3", &c, &err), PX_ETIMEOUT);
    assert_true((double)(px_now_ns() - t0) / 1e9 < 2.0);
    px_assert_contains(err.msg, "stage 3 is not listening");
    assert_null(c);
    free(addr);
}

static void test_addresses_outside_this_machine_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {
        "tcp:10.0.0.1:80",  "tcp:127.0.0.1", "tcp:127.0.0.1:99999", "udp:x", "unix:", "",
        "tcp:127.0.0.1:12x"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        px_rt_listener *l = NULL;
        px_err err;
        assert_int_equal(px_rt_listener_new(bad[i], &l, &err), PX_EINVAL);
        px_assert_contains(err.msg, "address \"");
        if (strcmp(bad[i], "unix:"))
            px_assert_contains(err.msg, "unix:PATH or tcp:127.0.0.1:PORT");
        assert_null(l);
    }
}

static void test_hello_agrees_on_payload_and_refuses_another_model(void **state)
{
    (void)state;
    char *addr = px_asprintf("unix:%s/hello.sock", px_test_tmpdir());
    for (int k = 0; k < 2; k++) {
        px_err err;
        px_rt_listener *l;
        px_assert_ok(px_rt_listener_new(addr, &l, &err), &err);
        pid_t pid = fork();
        if (pid == 0) {
            px_rt_conn *s;
            if (px_rt_listener_accept(l, 2000, "client", &s, NULL))
                _exit(2);
            px_rt_hello mine = {
                .stage = 1, .layer_begin = 2, .layer_end = 4, .dim = 64, .max_payload = 4096};
            px_strlcpy(mine.model, k ? "sha256:other" : "sha256:same", sizeof mine.model);
            px_rt_hello theirs;
            px_status st = px_rt_hello_server(s, &mine, &theirs, NULL);
            px_rt_conn_free(s);
            _exit(st == PX_OK ? 0 : 1);
        }
        px_rt_conn *c;
        px_assert_ok(px_rt_conn_connect(addr, 2000, "stage 1", &c, &err), &err);
        px_rt_hello mine = {.stage = UINT32_MAX, .dim = 64, .max_payload = 1u << 20};
        px_strlcpy(mine.model, "sha256:same", sizeof mine.model);
        px_rt_hello theirs;
        px_status st = px_rt_hello_client(c, &mine, &theirs, &err);
        if (k == 0) {
            px_assert_ok(st, &err);
            assert_int_equal(theirs.stage, 1);
            assert_int_equal(theirs.layer_begin, 2);
            assert_int_equal(px_rt_conn_max_payload(c), 4096);
        } else {
            assert_int_equal(st, PX_EPEER);
            px_assert_contains(err.msg, "runs model sha256:same, this side sha256:other");
        }
        int status;
        waitpid(pid, &status, 0);
        assert_int_equal(WEXITSTATUS(status), k ? 1 : 0);
        px_rt_conn_free(c);
        px_rt_listener_free(l);
    }
    free(addr);
}

static void test_fault_hooks_delay_and_cut_a_link(void **state)
{
    (void)state;
    char *addr = px_asprintf("unix:%s/faults.sock", px_test_tmpdir());
    px_err err;
    px_rt_listener *l;
    px_assert_ok(px_rt_listener_new(addr, &l, &err), &err);
    px_rt_conn *c, *s;
    px_assert_ok(px_rt_conn_connect(addr, 2000, "server", &c, &err), &err);
    px_assert_ok(px_rt_listener_accept(l, 2000, "client", &s, &err), &err);
    /* 20 ms of latency plus 10 KB at 1 MB/s = 10 ms. */
    px_rt_link_faults f = {.latency_ns = 20000000, .bandwidth_bps = 1e6};
    px_rt_conn_set_faults(c, &f);
    static uint8_t data[10000];
    uint64_t t0 = px_now_ns();
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
    double ms = (double)(px_now_ns() - t0) / 1e6;
    assert_true(ms >= 29 && ms < 1000);
    px_rt_frame_header h;
    const uint8_t *p;
    px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);

    /* Cut after one more frame: the second send fails, the reader sees
     * the link close. */
    f = (px_rt_link_faults){.cut_after = 2};
    px_rt_conn_set_faults(c, &f);
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, 8, &err), &err);
    assert_int_equal(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, 8, &err), PX_EPEER);
    px_assert_contains(err.msg, "cut");
    px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
    assert_int_equal(px_rt_conn_recv(s, &h, &p, &err), PX_EPEER);
    px_assert_contains(err.msg, "closed the connection");
    px_rt_conn_free(c);
    px_rt_conn_free(s);

    /* Cut mid-frame: the reader sees a truncated frame. */
    px_assert_ok(px_rt_conn_connect(addr, 2000, "server", &c, &err), &err);
    px_assert_ok(px_rt_listener_accept(l, 2000, "client", &s, &err), &err);
    f = (px_rt_link_faults){.cut_mid_frame = true};
    px_rt_conn_set_faults(c, &f);
    assert_int_equal(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, 1000, &err), PX_EPEER);
    assert_int_equal(px_rt_conn_recv(s, &h, &p, &err), PX_EPEER);
    px_assert_contains(err.msg, "truncated frame from client");
    px_assert_contains(err.msg, "500 of 1000 payload bytes");
    px_rt_conn_free(c);
    px_rt_conn_free(s);
    px_rt_listener_free(l);
    free(addr);
}

/* A connected pair over a Unix socket for the fault tests. */
static void fault_pair(const char *name, px_rt_listener **l, px_rt_conn **c, px_rt_conn **s)
{
    char *addr = px_asprintf("unix:%s/%s.sock", px_test_tmpdir(), name);
    px_err err;
    px_assert_ok(px_rt_listener_new(addr, l, &err), &err);
    px_assert_ok(px_rt_conn_connect(addr, 2000, "server", c, &err), &err);
    px_assert_ok(px_rt_listener_accept(*l, 2000, "client", s, &err), &err);
    free(addr);
}

static void test_flipped_byte_is_refused_by_the_receivers_checksum(void **state)
{
    (void)state;
    px_rt_listener *l;
    px_rt_conn *c, *s;
    fault_pair("flip", &l, &c, &s);
    px_err err;
    px_rt_link_faults f = {.flip = 1, .seed = 9};
    px_rt_conn_set_faults(c, &f);
    static uint8_t data[4096];
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
    px_rt_frame_header h;
    const uint8_t *p;
    assert_int_equal(px_rt_conn_recv(s, &h, &p, &err), PX_EPARSE);
    px_assert_contains(err.msg, "frame from client");
    px_assert_contains(err.msg, "checksum");
    px_rt_conn_free(s);
    px_rt_conn_free(c);

    /* Without the fault (flip 0) the same frame arrives whole. */
    px_rt_listener_free(l);
    fault_pair("flip", &l, &c, &s);
    px_rt_conn_set_faults(c, &(px_rt_link_faults){.flip = 0, .seed = 9});
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
    px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
    assert_int_equal(h.length, sizeof data);
    px_rt_conn_free(s);
    px_rt_conn_free(c);
    px_rt_listener_free(l);
}

/* Sends n frames and marks those delayed by a retransmission. */
static uint32_t lossy_sends(px_rt_conn *c, px_rt_conn *s, bool *resent, uint32_t n)
{
    px_err err;
    uint8_t data[64] = {1};
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t t0 = px_now_ns();
        px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
        double ms = (double)(px_now_ns() - t0) / 1e6;
        resent[i] = ms >= 15;
        k += resent[i];
        assert_true(ms < 15 || ms >= 20); /* either sent at once or after resend_ns */
        px_rt_frame_header h;
        const uint8_t *p;
        px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
    }
    return k;
}

static void test_lost_frames_arrive_after_the_resend_delay_with_seeded_choice(void **state)
{
    (void)state;
    px_rt_listener *l;
    px_rt_conn *c, *s;
    fault_pair("loss", &l, &c, &s);
    px_rt_link_faults f = {.loss = 0.5, .resend_ns = 20000000, .seed = 42};
    bool first[12], second[12];
    px_rt_conn_set_faults(c, &f);
    uint32_t k1 = lossy_sends(c, s, first, 12);
    /* The same seed loses the same frames. */
    px_rt_conn_set_faults(c, &f);
    uint32_t k2 = lossy_sends(c, s, second, 12);
    assert_int_equal(k1, k2);
    assert_memory_equal(first, second, sizeof first);
    assert_true(k1 > 0 && k1 < 12);
    /* Loss 1 resends every frame; the default delay is 200 ms. */
    px_rt_conn_set_faults(c, &(px_rt_link_faults){.loss = 1, .seed = 1});
    px_err err;
    uint64_t t0 = px_now_ns();
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, "x", 1, &err), &err);
    assert_true(px_now_ns() - t0 >= 200000000u);
    px_rt_conn_free(s);
    px_rt_conn_free(c);
    px_rt_listener_free(l);
}

static double timed_send_ms(px_rt_conn *c, px_rt_conn *s)
{
    px_err err;
    uint64_t t0 = px_now_ns();
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, "abc", 3, &err), &err);
    double ms = (double)(px_now_ns() - t0) / 1e6;
    px_rt_frame_header h;
    const uint8_t *p;
    px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
    return ms;
}

static void sleep_until(uint64_t t)
{
    uint64_t now = px_now_ns();
    if (now < t) {
        struct timespec ts = {(time_t)((t - now) / 1000000000u), (long)((t - now) % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

static void test_intermittent_link_is_degraded_only_in_its_on_phase(void **state)
{
    (void)state;
    px_rt_listener *l;
    px_rt_conn *c, *s;
    fault_pair("intermittent", &l, &c, &s);
    /* 30 ms of latency during the first 150 ms of every 300 ms. */
    px_rt_link_faults f = {.latency_ns = 30000000, .period_s = 0.3, .duty = 0.5};
    uint64_t t0 = px_now_ns();
    px_rt_conn_set_faults(c, &f);
    assert_true(timed_send_ms(c, s) >= 30); /* on */
    sleep_until(t0 + 180000000u);
    assert_true(timed_send_ms(c, s) < 25); /* off */
    sleep_until(t0 + 305000000u);
    assert_true(timed_send_ms(c, s) >= 30); /* on again */
    px_rt_conn_free(s);
    px_rt_conn_free(c);
    px_rt_listener_free(l);
}

/* A worker checks a FAULT frame it cannot trust: its length, its kind
 * (signals never travel as frames), its booleans and every field. */
static void test_malformed_fault_frames_are_refused(void **state)
{
    (void)state;
    px_rt_fault f, got;
    px_err err;
    memset(&f, 0, sizeof f);
    f.kind = PX_RT_FAULT_SLOW;
    f.stage = 1;
    f.factor = 3;
    px_assert_ok(px__rt_wfault_parse((const uint8_t *)&f, sizeof f, "stage 0", &got, &err), &err);
    assert_int_equal(got.kind, PX_RT_FAULT_SLOW);
    assert_true(got.factor == 3);

    assert_int_equal(px__rt_wfault_parse((const uint8_t *)&f, sizeof f - 1, "stage 0", &got, &err),
                     PX_EPARSE);
    px_assert_contains(err.msg, "malformed fault frame from stage 0");

    px_rt_fault bad = f;
    bad.factor = NAN;
    assert_int_equal(px__rt_wfault_parse((const uint8_t *)&bad, sizeof bad, "stage 0", &got, &err),
                     PX_EPARSE);
    px_assert_contains(err.msg, "factor");

    bad = f;
    bad.stage = 99;
    assert_int_equal(px__rt_wfault_parse((const uint8_t *)&bad, sizeof bad, "stage 0", &got, &err),
                     PX_EPARSE);
    px_assert_contains(err.msg, "stage 99");

    uint8_t raw[sizeof f];
    memcpy(raw, &f, sizeof f);
    uint32_t kill_kind = PX_RT_FAULT_KILL;
    memcpy(raw + offsetof(px_rt_fault, kind), &kill_kind, sizeof kill_kind);
    assert_int_equal(px__rt_wfault_parse(raw, sizeof raw, "stage 0", &got, &err), PX_EPARSE);
    px_assert_contains(err.msg, "kind 6");
    uint32_t huge = 0xfffffff0u;
    memcpy(raw + offsetof(px_rt_fault, kind), &huge, sizeof huge);
    assert_int_equal(px__rt_wfault_parse(raw, sizeof raw, "stage 0", &got, &err), PX_EPARSE);

    memcpy(raw, &f, sizeof f);
    raw[offsetof(px_rt_fault, link) + offsetof(px_rt_link_faults, cut)] = 7;
    assert_int_equal(px__rt_wfault_parse(raw, sizeof raw, "stage 0", &got, &err), PX_EPARSE);
    px_assert_contains(err.msg, "boolean");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32_matches_the_standard_check_value),
        cmocka_unit_test(test_frames_round_trip_over_unix_and_tcp),
        cmocka_unit_test(test_truncated_frame_is_an_error),
        cmocka_unit_test(test_corrupted_checksum_is_an_error),
        cmocka_unit_test(test_oversized_length_is_refused_before_reading),
        cmocka_unit_test(test_wrong_magic_and_version_are_refused),
        cmocka_unit_test(test_silent_peer_times_out_within_the_limit),
        cmocka_unit_test(test_connect_to_nobody_times_out),
        cmocka_unit_test(test_addresses_outside_this_machine_are_refused),
        cmocka_unit_test(test_hello_agrees_on_payload_and_refuses_another_model),
        cmocka_unit_test(test_fault_hooks_delay_and_cut_a_link),
        cmocka_unit_test(test_flipped_byte_is_refused_by_the_receivers_checksum),
        cmocka_unit_test(test_lost_frames_arrive_after_the_resend_delay_with_seeded_choice),
        cmocka_unit_test(test_intermittent_link_is_degraded_only_in_its_on_phase),
        cmocka_unit_test(test_malformed_fault_frames_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
