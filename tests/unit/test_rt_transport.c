/* The pipeline's framed transport: frames round trip over Unix and TCP
 * sockets; truncated frames, corrupted checksums, oversized lengths, wrong
 * magic and version each give a clear error; a silent peer times out
 * within the limit; the hello refuses another model and, with a secret,
 * a peer without the same secret; addresses are numeric IPv4 or Unix
 * paths and listeners report what they bound; the worker's command line
 * round trips; the fault hooks add latency and cut the link.  Deadlines
 * and injected latencies are read off a clock the test moves, never off
 * the wall clock of a machine others share. */
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
#include "rt/pipeline_impl.h"
#include "rt/worker_fault.h"

/* A clock the test moves (px__rt_conn_set_clock): every read after the
 * first returns `now_ns` moved on by `step_ns`; a sleep moves it on and
 * is added up in `slept_ns`, so that a test reads what the connection
 * waited instead of timing it on a machine others share. */
typedef struct fake_clock {
    px__rt_clock clock;
    uint64_t now_ns, step_ns, slept_ns;
    uint32_t reads;
} fake_clock;

static uint64_t fake_now(void *ud)
{
    fake_clock *f = ud;
    if (f->reads++ > 0)
        f->now_ns += f->step_ns;
    return f->now_ns;
}

static void fake_sleep(void *ud, uint64_t ns)
{
    fake_clock *f = ud;
    f->now_ns += ns;
    f->slept_ns += ns;
}

static void fake_clock_init(fake_clock *f, uint64_t now_ns, uint64_t step_ns)
{
    *f = (fake_clock){.clock = {.now_ns = fake_now, .sleep_ns = fake_sleep, .ud = f},
                      .now_ns = now_ns,
                      .step_ns = step_ns};
}

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
    /* On the real clock it waits the whole limit (never less; how much
     * more depends on the machine's load, so it is not asserted). */
    uint64_t t0 = px_now_ns();
    expect_recv_error(&p, PX_ETIMEOUT, "sent nothing for 300 ms");
    assert_true(px_now_ns() - t0 >= 290000000u);

    /* A limit of a minute, and a clock that passes it on its next read:
     * the connection gives up at once (were the deadline not the clock's,
     * the test would wait out the minute and its own timeout). */
    fake_clock fc;
    fake_clock_init(&fc, 1000000000u, 61000000000u);
    px__rt_conn_set_clock(p.server, &fc.clock);
    px_rt_conn_set_timeout(p.server, 60000);
    expect_recv_error(&p, PX_ETIMEOUT, "sent nothing for 60000 ms");

    /* A peer that stops mid-frame times out too, with the frame's one
     * deadline: the header came, 8 of the 64 payload bytes did. */
    uint8_t payload[8] = {0};
    raw_frame(p.raw, PX_RT_FRAME_MAGIC, PX_RT_FRAME_VERSION, PX_RT_FRAME_STEP, payload, 8, 64, 0);
    fake_clock_init(&fc, 1000000000u, 61000000000u);
    expect_recv_error(&p, PX_ETIMEOUT,
                      "stopped mid-frame: 8 of 64 payload bytes arrived within 60000 ms");
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
    /* It tried for the whole limit (an upper bound would time the
     * machine's load, not the code). */
    assert_true(px_now_ns() - t0 >= 200000000u);
    px_assert_contains(err.msg, "stage 3 is not listening");
    px_assert_contains(err.msg, "after 200 ms");
    assert_null(c);
    free(addr);
}

static void test_malformed_addresses_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {"tcp:127.0.0.1",
                         "tcp:127.0.0.1:99999",
                         "udp:x",
                         "unix:",
                         "",
                         "tcp:127.0.0.1:12x",
                         "tcp:10.0.0:80",
                         "tcp:10.0.0.1.5:80",
                         "tcp:256.0.0.1:80",
                         "tcp:host.lan:80",
                         "tcp::80",
                         "tcp:10.0.0.1:",
                         "tcp:10.0.0.1:-1",
                         "tcp:10.0.0.1:+80",
                         "tcp:0x7f.0.0.1:80",
                         "tcp:[::1]:80",
                         "tcp:10.0.0.1:80 ",
                         "tcp: 10.0.0.1:80"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        px_rt_listener *l = NULL;
        px_rt_conn *c = NULL;
        px_err err;
        assert_int_equal(px_rt_listener_new(bad[i], &l, &err), PX_EINVAL);
        px_assert_contains(err.msg, "address \"");
        if (strcmp(bad[i], "unix:"))
            px_assert_contains(err.msg, "unix:PATH or tcp:A.B.C.D:PORT");
        assert_null(l);
        assert_int_equal(px_rt_conn_connect(bad[i], 100, "stage 1", &c, &err), PX_EINVAL);
        assert_null(c);
        assert_int_equal(px_rt_addr_check(bad[i], &err), PX_EINVAL);
        assert_false(px_rt_addr_is_local(bad[i]));
    }
    /* Any numeric IPv4 address is well formed; only 127/8 and Unix
     * sockets stay on the machine. */
    px_err err;
    px_assert_ok(px_rt_addr_check("tcp:10.0.0.1:80", &err), &err);
    px_assert_ok(px_rt_addr_check("tcp:0.0.0.0:0", &err), &err);
    assert_false(px_rt_addr_is_local("tcp:10.0.0.1:80"));
    assert_false(px_rt_addr_is_local("tcp:0.0.0.0:80"));
    assert_true(px_rt_addr_is_local("tcp:127.0.0.1:80"));
    assert_true(px_rt_addr_is_local("tcp:127.3.2.1:80"));
    assert_true(px_rt_addr_is_local("tcp:localhost:80"));
    assert_true(px_rt_addr_is_local("unix:/tmp/x.sock"));
}

static void test_listener_reports_the_address_it_bound(void **state)
{
    (void)state;
    const char *asked[] = {"tcp:127.0.0.2:0", "tcp:0.0.0.0:0", "tcp:localhost:0"};
    const char *prefix[] = {"tcp:127.0.0.2:", "tcp:0.0.0.0:", "tcp:127.0.0.1:"};
    for (size_t i = 0; i < PX_ARRAY_LEN(asked); i++) {
        px_rt_listener *l;
        px_err err;
        px_assert_ok(px_rt_listener_new(asked[i], &l, &err), &err);
        const char *got = px_rt_listener_address(l);
        assert_true(px_str_starts_with(got, prefix[i]));
        unsigned port = (unsigned)strtoul(got + strlen(prefix[i]), NULL, 10);
        assert_true(port > 0 && port <= 65535);
        /* A peer reaches it at that address (0.0.0.0: through loopback). */
        char *reach = px_asprintf("tcp:%s:%u", i == 1 ? "127.0.0.1" : prefix[i] + 4, port);
        if (i != 1) {
            free(reach);
            reach = px_strdup(got);
        }
        px_rt_conn *c, *s;
        px_assert_ok(px_rt_conn_connect(reach, 2000, "listener", &c, &err), &err);
        px_assert_ok(px_rt_listener_accept(l, 2000, "client", &s, &err), &err);
        px_rt_conn_free(c);
        px_rt_conn_free(s);
        px_rt_listener_free(l);
        free(reach);
    }
}

/* Runs a hello between this process (the client) and a forked server,
 * each with its secret (NULL: none).  The server's status comes back as
 * its exit code (the status negated). */
static px_status hello_pair(const char *client_secret, const char *server_secret,
                            px_status *server_st, px_err *err)
{
    char *addr = px_asprintf("unix:%s/auth.sock", px_test_tmpdir());
    px_rt_listener *l;
    px_assert_ok(px_rt_listener_new(addr, &l, err), err);
    pid_t pid = fork();
    if (pid == 0) {
        px_rt_conn *s;
        if (px_rt_listener_accept(l, 2000, "the executor", &s, NULL))
            _exit(100);
        if (server_secret &&
            px_rt_conn_set_secret(s, (const uint8_t *)server_secret, strlen(server_secret), NULL))
            _exit(101);
        px_rt_hello mine = {.stage = 0, .layer_end = 2, .dim = 64, .max_payload = 4096};
        px_strlcpy(mine.model, "sha256:same", sizeof mine.model);
        px_rt_hello theirs;
        px_err serr;
        px_status st = px_rt_hello_server(s, &mine, &theirs, &serr);
        /* An accepted peer then exchanges frames normally. */
        if (st == PX_OK) {
            px_rt_frame_header h;
            const uint8_t *p;
            st = px_rt_conn_recv(s, &h, &p, &serr);
            if (st == PX_OK &&
                (h.type != PX_RT_FRAME_INFO || h.length != 5 || memcmp(p, "hello", 5)))
                st = PX_EINTERNAL;
        }
        px_rt_conn_free(s);
        _exit(-st);
    }
    px_rt_conn *c;
    px_assert_ok(px_rt_conn_connect(addr, 2000, "stage 0", &c, err), err);
    if (client_secret)
        px_assert_ok(
            px_rt_conn_set_secret(c, (const uint8_t *)client_secret, strlen(client_secret), err),
            err);
    px_rt_hello mine = {.stage = UINT32_MAX, .dim = 64, .max_payload = 1u << 20};
    px_strlcpy(mine.model, "sha256:same", sizeof mine.model);
    px_rt_hello theirs;
    px_status st = px_rt_hello_client(c, &mine, &theirs, err);
    if (st == PX_OK)
        st = px_rt_conn_send(c, PX_RT_FRAME_INFO, 0, "hello", 5, err);
    int status;
    waitpid(pid, &status, 0);
    *server_st = WIFEXITED(status) ? -(px_status)WEXITSTATUS(status) : PX_EINTERNAL;
    px_rt_conn_free(c);
    px_rt_listener_free(l);
    free(addr);
    return st;
}

static void test_hello_with_a_secret_authenticates_both_sides(void **state)
{
    (void)state;
    const char *key = "0123456789abcdef0123456789abcdef";
    const char *other = "fedcba9876543210fedcba9876543210";
    px_err err;
    px_status sst;
    /* The same secret: both sides accept, and frames flow. */
    px_assert_ok(hello_pair(key, key, &sst, &err), &err);
    assert_int_equal(sst, PX_OK);
    /* Another deployment's secret: refused on both sides. */
    assert_int_equal(hello_pair(key, other, &sst, &err), PX_EAUTH);
    px_assert_contains(err.msg, "failed authentication");
    px_assert_contains(err.msg, "another deployment's secret");
    assert_int_equal(sst, PX_EAUTH);
    /* A server that requires a secret refuses a client without one. */
    assert_int_equal(hello_pair(NULL, key, &sst, &err), PX_EPEER);
    px_assert_contains(err.msg, "did not authenticate");
    assert_int_equal(sst, PX_EAUTH);
    /* A client with a secret refuses a server without one. */
    assert_int_equal(hello_pair(key, NULL, &sst, &err), PX_EPEER);
    px_assert_contains(err.msg, "requires the deployment's secret");
    assert_int_equal(sst, PX_EAUTH);
    /* Neither: the plain hello still works. */
    px_assert_ok(hello_pair(NULL, NULL, &sst, &err), &err);
    assert_int_equal(sst, PX_OK);
}

static void test_secrets_have_bounded_lengths(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, 1000);
    px_err err;
    uint8_t key[PX_RT_SECRET_MAX + 1] = {0};
    assert_int_equal(px_rt_conn_set_secret(p.server, key, PX_RT_SECRET_MIN - 1, &err), PX_EINVAL);
    px_assert_contains(err.msg, "16 to 64 bytes");
    assert_int_equal(px_rt_conn_set_secret(p.server, key, PX_RT_SECRET_MAX + 1, &err), PX_EINVAL);
    px_assert_ok(px_rt_conn_set_secret(p.server, key, PX_RT_SECRET_MIN, &err), &err);
    px_assert_ok(px_rt_conn_set_secret(p.server, NULL, 0, &err), &err);
    pair_close(&p);

    /* Secrets read from a file descriptor: hex on one line. */
    struct {
        const char *text;
        px_status want;
        size_t len;
    } cases[] = {
        {"00112233445566778899aabbccddeeff\n", PX_OK, 16},
        {"00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff", PX_OK, 32},
        {"0011223344556677\n", PX_EINVAL, 0},
        {"00112233445566778899aabbccddeefg\n", PX_EINVAL, 0},
        {"00112233445566778899aabbccddeef\n", PX_EINVAL, 0},
        {"", PX_EINVAL, 0},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        size_t n = strlen(cases[i].text);
        assert_int_equal(write(fds[1], cases[i].text, n), (ssize_t)n);
        close(fds[1]);
        uint8_t out[PX_RT_SECRET_MAX];
        size_t len = 99;
        assert_int_equal(px_rt_secret_read_fd(fds[0], out, &len, &err), cases[i].want);
        assert_int_equal(len, cases[i].len);
        if (cases[i].want == PX_OK)
            assert_int_equal(out[15], 0xff);
        else
            px_assert_contains(err.msg, "secret on standard input");
        close(fds[0]);
    }
}

static void test_worker_command_line_round_trips_and_refuses_bad_input(void **state)
{
    (void)state;
    uint8_t key[PX_RT_SECRET_BYTES] = {1};
    px_rt_worker_opts o = {.stage = 2,
                           .model_path = "/m/model.gguf",
                           .layer_begin = 3,
                           .layer_end = 6,
                           .head = true,
                           .backend = "emu",
                           .emu_profile = "{\"compute_slowdown\": 2}",
                           .device_name = "n1.emu-a",
                           .n_threads = 2,
                           .listen = "tcp:10.1.0.2:0",
                           .next = "tcp:10.1.0.1:4000",
                           .timeout_ms = 5000,
                           .max_seqs = 8,
                           .context = 256,
                           .max_batch_tokens = 64,
                           .kv_blocks = 20,
                           .kv_block_size = 16,
                           .secret = key,
                           .secret_len = sizeof key,
                           .announce = true};
    px_rt_worker_argv av;
    px_err err;
    px_assert_ok(px_rt_worker_args_build(&o, "/usr/bin/plexus", &av, &err), &err);
    assert_string_equal(av.argv[0], "/usr/bin/plexus");
    assert_string_equal(av.argv[1], "worker");
    assert_null(av.argv[av.argc]);
    /* The secret is never on the command line. */
    for (int i = 0; i < av.argc; i++)
        assert_null(strstr(av.argv[i], "0100000000"));
    px_rt_worker_opts back;
    bool secret_stdin;
    px_assert_ok(px_rt_worker_args_parse(av.argc - 2, av.argv + 2, &back, &secret_stdin, &err),
                 &err);
    assert_true(secret_stdin);
    assert_int_equal(back.stage, 2);
    assert_string_equal(back.model_path, o.model_path);
    assert_int_equal(back.layer_begin, 3);
    assert_int_equal(back.layer_end, 6);
    assert_true(back.head && !back.embedding && back.announce);
    assert_string_equal(back.backend, "emu");
    assert_string_equal(back.emu_profile, o.emu_profile);
    assert_string_equal(back.device_name, o.device_name);
    assert_string_equal(back.listen, o.listen);
    assert_string_equal(back.next, o.next);
    assert_int_equal(back.timeout_ms, 5000);
    assert_int_equal(back.max_seqs, 8);
    assert_int_equal(back.context, 256);
    assert_int_equal(back.max_batch_tokens, 64);
    assert_int_equal(back.kv_blocks, 20);
    assert_int_equal(back.kv_block_size, 16);
    assert_int_equal(back.secret_len, 0);
    px_rt_worker_args_release(&av);

    struct {
        const char *args[8];
        const char *msg;
    } bad[] = {
        {{"--stage", "0", "--model", "m", "--layers", "0-1", "--listen", NULL},
         "--listen needs a value"},
        {{"--stage", "99", NULL}, "--stage takes a whole number from 0 to 15"},
        {{"--layers", "3-1", NULL}, "--layers takes A-B"},
        {{"--layers", "-1-2", NULL}, "--layers takes A-B"},
        {{"--threads", "-2", NULL}, "--threads takes a whole number"},
        {{"--exec", "/bin/sh", NULL}, "unexpected argument \"--exec\""},
        {{"--stage", "0", "--model", "m", "--layers", "0-1", NULL}, "are required"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        int n = 0;
        while (n < 8 && bad[i].args[n])
            n++;
        assert_int_not_equal(
            px_rt_worker_args_parse(n, (char *const *)bad[i].args, &back, &secret_stdin, &err),
            PX_OK);
        px_assert_contains(err.msg, bad[i].msg);
    }
    char *args[] = {"--stage", "0",        "--model",     "m",      "--layers",
                    "0-1",     "--listen", "tcp:1.2.3:0", "--next", "unix:/x"};
    assert_int_equal(px_rt_worker_args_parse(10, args, &back, &secret_stdin, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--listen: address \"tcp:1.2.3:0\"");
    char *args2[] = {"--stage",  "0",       "--model", "m",       "--layers",  "0-1",
                     "--listen", "unix:/y", "--next",  "unix:/x", "--backend", "rocm"};
    assert_int_equal(px_rt_worker_args_parse(12, args2, &back, &secret_stdin, &err), PX_EINVAL);
    px_assert_contains(err.msg, "cpu, emu or cuda");
}

static void test_worker_refuses_to_listen_beyond_the_machine_without_a_secret(void **state)
{
    (void)state;
    px_rt_worker_opts o = {.model_path = "/nonexistent.gguf",
                           .layer_end = 1,
                           .embedding = true,
                           .head = true,
                           .backend = "cpu",
                           .listen = "tcp:0.0.0.0:0",
                           .next = "tcp:127.0.0.1:1"};
    px_err err;
    assert_int_equal(px_rt_worker_run(&o, &err), PX_EAUTH);
    px_assert_contains(err.msg, "refusing to listen on tcp:0.0.0.0:0 without a secret");
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
    /* 20 ms of latency plus the frame (10,000 bytes and its header) at
     * 1 MB/s: 10.024 ms. */
    fake_clock fc;
    fake_clock_init(&fc, 1000000000u, 0);
    px__rt_conn_set_clock(c, &fc.clock);
    px_rt_link_faults f = {.latency_ns = 20000000, .bandwidth_bps = 1e6};
    px_rt_conn_set_faults(c, &f);
    static uint8_t data[10000];
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
    assert_int_equal(fc.slept_ns, 20000000u + (sizeof data + PX_RT_FRAME_HEADER_BYTES) * 1000u);
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

/* Sends n frames on c (whose clock is fc) and marks those delayed by a
 * retransmission. */
static uint32_t lossy_sends(px_rt_conn *c, fake_clock *fc, px_rt_conn *s, bool *resent, uint32_t n)
{
    px_err err;
    uint8_t data[64] = {1};
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t before = fc->slept_ns;
        px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, data, sizeof data, &err), &err);
        uint64_t waited = fc->slept_ns - before;
        /* Either sent at once or after resend_ns. */
        if (waited != 0 && waited != 20000000u)
            fail_msg("frame %u waited %" PRIu64 " ns: neither 0 nor the resend delay", i, waited);
        resent[i] = waited != 0;
        k += resent[i];
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
    fake_clock fc;
    fake_clock_init(&fc, 1000000000u, 0);
    px__rt_conn_set_clock(c, &fc.clock);
    px_rt_link_faults f = {.loss = 0.5, .resend_ns = 20000000, .seed = 42};
    bool first[12], second[12];
    px_rt_conn_set_faults(c, &f);
    uint32_t k1 = lossy_sends(c, &fc, s, first, 12);
    /* The same seed loses the same frames. */
    px_rt_conn_set_faults(c, &f);
    uint32_t k2 = lossy_sends(c, &fc, s, second, 12);
    assert_int_equal(k1, k2);
    assert_memory_equal(first, second, sizeof first);
    assert_true(k1 > 0 && k1 < 12);
    /* Loss 1 resends every frame; the default delay is 200 ms. */
    px_rt_conn_set_faults(c, &(px_rt_link_faults){.loss = 1, .seed = 1});
    px_err err;
    uint64_t before = fc.slept_ns;
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, "x", 1, &err), &err);
    assert_int_equal(fc.slept_ns - before, 200000000u);
    px_rt_conn_free(s);
    px_rt_conn_free(c);
    px_rt_listener_free(l);
}

/* How long the connection waited (on its clock fc) to send a frame. */
static uint64_t send_wait_ns(px_rt_conn *c, fake_clock *fc, px_rt_conn *s)
{
    px_err err;
    uint64_t before = fc->slept_ns;
    px_assert_ok(px_rt_conn_send(c, PX_RT_FRAME_STEP, 0, "abc", 3, &err), &err);
    px_rt_frame_header h;
    const uint8_t *p;
    px_assert_ok(px_rt_conn_recv(s, &h, &p, &err), &err);
    return fc->slept_ns - before;
}

static void test_intermittent_link_is_degraded_only_in_its_on_phase(void **state)
{
    (void)state;
    px_rt_listener *l;
    px_rt_conn *c, *s;
    fault_pair("intermittent", &l, &c, &s);
    /* 30 ms of latency during the first 150 ms of every 300 ms, on a
     * clock the test sets to each phase. */
    const uint64_t t0 = 1000000000u;
    fake_clock fc;
    fake_clock_init(&fc, t0, 0);
    px__rt_conn_set_clock(c, &fc.clock);
    px_rt_link_faults f = {.latency_ns = 30000000, .period_s = 0.3, .duty = 0.5};
    px_rt_conn_set_faults(c, &f);
    assert_int_equal(send_wait_ns(c, &fc, s), 30000000u); /* on */
    fc.now_ns = t0 + 180000000u;
    assert_int_equal(send_wait_ns(c, &fc, s), 0); /* off */
    fc.now_ns = t0 + 295000000u;
    assert_int_equal(send_wait_ns(c, &fc, s), 0); /* still off */
    fc.now_ns = t0 + 305000000u;
    assert_int_equal(send_wait_ns(c, &fc, s), 30000000u); /* on again */
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
        cmocka_unit_test(test_malformed_addresses_are_refused),
        cmocka_unit_test(test_listener_reports_the_address_it_bound),
        cmocka_unit_test(test_hello_with_a_secret_authenticates_both_sides),
        cmocka_unit_test(test_secrets_have_bounded_lengths),
        cmocka_unit_test(test_worker_command_line_round_trips_and_refuses_bad_input),
        cmocka_unit_test(test_worker_refuses_to_listen_beyond_the_machine_without_a_secret),
        cmocka_unit_test(test_hello_agrees_on_payload_and_refuses_another_model),
        cmocka_unit_test(test_fault_hooks_delay_and_cut_a_link),
        cmocka_unit_test(test_flipped_byte_is_refused_by_the_receivers_checksum),
        cmocka_unit_test(test_lost_frames_arrive_after_the_resend_delay_with_seeded_choice),
        cmocka_unit_test(test_intermittent_link_is_degraded_only_in_its_on_phase),
        cmocka_unit_test(test_malformed_fault_frames_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
