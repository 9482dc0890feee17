/*
 * The transport's connections: Unix or loopback TCP sockets, every read
 * and write bounded by poll, frames checked on arrival, and the fault
 * hooks (latency, bandwidth, intermittent degradation, loss with
 * retransmission, bit flips, cut) applied on the sending side.
 */
#include "base/common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "rt/pipeline_impl.h"

#define DEFAULT_TIMEOUT_MS 10000

struct px_rt_listener {
    int fd;
    bool is_unix;
    char path[108];
    char address[128];
};

struct px_rt_conn {
    int fd;
    int timeout_ms;
    uint32_t max_payload;
    char peer[160];
    uint64_t next_seq;
    uint8_t *buf;
    size_t cap;
    px_rt_link_faults faults;
    uint64_t faults_t0;        /* when the faults were set: the intermittent clock */
    const px__rt_clock *clock; /* NULL: the real one (px__rt_conn_set_clock) */
    px_rng fault_rng;          /* loss and flip draws */
    bool broken;
    uint8_t secret[PX_RT_SECRET_MAX]; /* the deployment's; the hello proves it */
    size_t secret_len;
    uint64_t frames_out, bytes_out, frames_in, bytes_in;
};

/* ------------------------------------------------------------------ */
/* Addresses                                                           */
/* ------------------------------------------------------------------ */

typedef struct parsed_addr {
    bool is_unix;
    struct sockaddr_un un;
    struct sockaddr_in in;
} parsed_addr;

static px_status parse_addr(const char *addr, parsed_addr *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!addr)
        addr = "";
    if (px_str_starts_with(addr, "unix:")) {
        const char *path = addr + 5;
        if (!path[0] || strlen(path) >= sizeof out->un.sun_path)
            return px_err_set(err, PX_EINVAL,
                              "address \"%.200s\": the socket path must be 1 to "
                              "%zu bytes",
                              addr, sizeof out->un.sun_path - 1);
        out->is_unix = true;
        out->un.sun_family = AF_UNIX;
        px_strlcpy(out->un.sun_path, path, sizeof out->un.sun_path);
        return PX_OK;
    }
    if (px_str_starts_with(addr, "tcp:")) {
        const char *host = addr + 4;
        const char *colon = strrchr(host, ':');
        char h[64];
        if (colon && (size_t)(colon - host) < sizeof h) {
            memcpy(h, host, (size_t)(colon - host));
            h[colon - host] = 0;
            char *end;
            errno = 0;
            unsigned long port = strtoul(colon + 1, &end, 10);
            bool port_ok = !errno && end != colon + 1 && !*end && colon[1] >= '0' &&
                           colon[1] <= '9' && port <= 65535;
            struct in_addr ia;
            /* inet_pton takes exactly four dotted decimals: no names, no
             * shorthand forms, nothing after. */
            bool host_ok = !strcmp(h, "localhost") || inet_pton(AF_INET, h, &ia) == 1;
            if (port_ok && host_ok) {
                out->in.sin_family = AF_INET;
                out->in.sin_port = htons((uint16_t)port);
                out->in.sin_addr.s_addr =
                    strcmp(h, "localhost") ? ia.s_addr : htonl(INADDR_LOOPBACK);
                return PX_OK;
            }
        }
    }
    return px_err_set(err, PX_EINVAL,
                      "address \"%.200s\": use unix:PATH or tcp:A.B.C.D:PORT (a numeric "
                      "IPv4 address and a port from 0 to 65535)",
                      addr);
}

px_status px_rt_addr_check(const char *addr, px_err *err)
{
    parsed_addr pa;
    return parse_addr(addr, &pa, err);
}

bool px_rt_addr_is_local(const char *addr)
{
    parsed_addr pa;
    if (parse_addr(addr, &pa, NULL) != PX_OK)
        return false;
    return pa.is_unix || (ntohl(pa.in.sin_addr.s_addr) >> 24) == 127;
}

static void socket_options(int fd, bool is_unix)
{
    int one = 1;
    if (!is_unix)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* A peer that vanished must give EPIPE, not kill the process. */
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* ------------------------------------------------------------------ */
/* Listeners                                                           */
/* ------------------------------------------------------------------ */

px_status px_rt_listener_new(const char *addr, px_rt_listener **out, px_err *err)
{
    *out = NULL;
    parsed_addr pa;
    px_status st = parse_addr(addr, &pa, err);
    if (st)
        return st;
    px_rt_listener *l = calloc(1, sizeof *l);
    if (!l)
        return px_err_set(err, PX_ENOMEM, "listener: out of memory");
    l->is_unix = pa.is_unix;
    l->fd = socket(pa.is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        st = px_err_set(err, PX_EIO, "listen on %s: socket: %s", addr, strerror(errno));
        goto fail;
    }
    int rc;
    if (pa.is_unix) {
        (void)unlink(pa.un.sun_path);
        px_strlcpy(l->path, pa.un.sun_path, sizeof l->path);
        rc = bind(l->fd, (struct sockaddr *)&pa.un, sizeof pa.un);
    } else {
        int one = 1;
        (void)setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        rc = bind(l->fd, (struct sockaddr *)&pa.in, sizeof pa.in);
    }
    if (rc != 0 || listen(l->fd, 16) != 0) {
        st = px_err_set(err, PX_EIO, "listen on %s: %s", addr, strerror(errno));
        l->path[0] = 0;
        goto fail;
    }
    if (pa.is_unix) {
        snprintf(l->address, sizeof l->address, "unix:%s", l->path);
    } else {
        struct sockaddr_in got;
        socklen_t n = sizeof got;
        getsockname(l->fd, (struct sockaddr *)&got, &n);
        char ip[INET_ADDRSTRLEN] = "0.0.0.0";
        (void)inet_ntop(AF_INET, &got.sin_addr, ip, sizeof ip);
        snprintf(l->address, sizeof l->address, "tcp:%s:%u", ip, ntohs(got.sin_port));
    }
    socket_options(l->fd, true);
    *out = l;
    return PX_OK;
fail:
    px_rt_listener_free(l);
    return st;
}

void px_rt_listener_free(px_rt_listener *l)
{
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    if (l->is_unix && l->path[0])
        (void)unlink(l->path);
    free(l);
}

const char *px_rt_listener_address(const px_rt_listener *l)
{
    return l->address;
}

static px_status conn_wrap(int fd, bool is_unix, const char *peer, px_rt_conn **out, px_err *err)
{
    px_rt_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return px_err_set(err, PX_ENOMEM, "connection: out of memory");
    }
    socket_options(fd, is_unix);
    c->fd = fd;
    c->timeout_ms = DEFAULT_TIMEOUT_MS;
    c->max_payload = PX_RT_FRAME_MAX_PAYLOAD;
    px_strlcpy(c->peer, peer ? peer : "peer", sizeof c->peer);
    *out = c;
    return PX_OK;
}

static uint64_t conn_now(const px_rt_conn *c)
{
    return c->clock ? c->clock->now_ns(c->clock->ud) : px_now_ns();
}

/* Milliseconds left until deadline (now read by the caller's clock). */
static int ms_left(uint64_t now, uint64_t deadline)
{
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

px_status px_rt_listener_accept(px_rt_listener *l, int timeout_ms, const char *peer,
                                px_rt_conn **out, px_err *err)
{
    *out = NULL;
    uint64_t deadline = px_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            return conn_wrap(fd, l->is_unix, peer, out, err);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return px_err_set(err, PX_EIO, "accept on %s: %s", l->address, strerror(errno));
        int ms = ms_left(px_now_ns(), deadline);
        if (ms == 0)
            return px_err_set(err, PX_ETIMEOUT, "%s did not connect to %s within %d ms",
                              peer ? peer : "the peer", l->address, timeout_ms);
        struct pollfd p = {.fd = l->fd, .events = POLLIN};
        (void)poll(&p, 1, ms);
    }
}

px_status px_rt_conn_connect(const char *addr, int timeout_ms, const char *peer, px_rt_conn **out,
                             px_err *err)
{
    *out = NULL;
    parsed_addr pa;
    px_status st = parse_addr(addr, &pa, err);
    if (st)
        return st;
    uint64_t deadline = px_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    for (;;) {
        int fd = socket(pa.is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return px_err_set(err, PX_EIO, "connect to %s: socket: %s", addr, strerror(errno));
        int rc = pa.is_unix ? connect(fd, (struct sockaddr *)&pa.un, sizeof pa.un)
                            : connect(fd, (struct sockaddr *)&pa.in, sizeof pa.in);
        if (rc == 0)
            return conn_wrap(fd, pa.is_unix, peer, out, err);
        int e = errno;
        close(fd);
        if (e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != EINTR)
            return px_err_set(err, PX_EIO, "connect to %s (%s): %s", peer ? peer : "peer", addr,
                              strerror(e));
        /* Nobody listens yet: the peer may still be starting. */
        if (ms_left(px_now_ns(), deadline) == 0)
            return px_err_set(err, PX_ETIMEOUT, "%s is not listening on %s after %d ms (%s)",
                              peer ? peer : "the peer", addr, timeout_ms, strerror(e));
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
}

void px_rt_conn_free(px_rt_conn *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    OPENSSL_cleanse(c->secret, sizeof c->secret);
    free(c->buf);
    free(c);
}

px_status px_rt_conn_set_secret(px_rt_conn *c, const uint8_t *secret, size_t len, px_err *err)
{
    if (len == 0) {
        OPENSSL_cleanse(c->secret, sizeof c->secret);
        c->secret_len = 0;
        return PX_OK;
    }
    if (!secret || len < PX_RT_SECRET_MIN || len > PX_RT_SECRET_MAX)
        return px_err_set(err, PX_EINVAL,
                          "connection to %s: a secret of %zu bytes; it must hold %d to %d bytes",
                          c->peer, len, PX_RT_SECRET_MIN, PX_RT_SECRET_MAX);
    memcpy(c->secret, secret, len);
    c->secret_len = len;
    return PX_OK;
}

const uint8_t *px__rt_conn_secret(const px_rt_conn *c, size_t *len)
{
    *len = c->secret_len;
    return c->secret_len ? c->secret : NULL;
}

void px_rt_conn_set_timeout(px_rt_conn *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
}

void px_rt_conn_set_max_payload(px_rt_conn *c, uint32_t max_payload)
{
    c->max_payload =
        PX_MIN(max_payload ? max_payload : PX_RT_FRAME_MAX_PAYLOAD, PX_RT_FRAME_MAX_PAYLOAD);
}

uint32_t px_rt_conn_max_payload(const px_rt_conn *c)
{
    return c->max_payload;
}

void px_rt_conn_set_peer(px_rt_conn *c, const char *peer)
{
    px_strlcpy(c->peer, peer ? peer : "peer", sizeof c->peer);
}

const char *px__rt_conn_peer(const px_rt_conn *c)
{
    return c->peer;
}

void px_rt_conn_set_faults(px_rt_conn *c, const px_rt_link_faults *f)
{
    if (f)
        c->faults = *f;
    else
        memset(&c->faults, 0, sizeof c->faults);
    c->faults_t0 = conn_now(c);
    px_rng_seed(&c->fault_rng, c->faults.seed);
}

void px__rt_conn_set_clock(px_rt_conn *c, const px__rt_clock *clock)
{
    c->clock = clock;
    c->faults_t0 = conn_now(c);
}

void px_rt_conn_counters(const px_rt_conn *c, uint64_t *frames_out, uint64_t *bytes_out,
                         uint64_t *frames_in, uint64_t *bytes_in)
{
    if (frames_out)
        *frames_out = c->frames_out;
    if (bytes_out)
        *bytes_out = c->bytes_out;
    if (frames_in)
        *frames_in = c->frames_in;
    if (bytes_in)
        *bytes_in = c->bytes_in;
}

/* ------------------------------------------------------------------ */
/* Bounded reads and writes                                            */
/* ------------------------------------------------------------------ */

static px_status write_all(px_rt_conn *c, const void *data, size_t n, uint64_t deadline,
                           px_err *err)
{
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->broken = true;
            return px_err_set(err, PX_EPEER, "%s closed the connection (%s)", c->peer,
                              strerror(errno));
        }
        int ms = ms_left(conn_now(c), deadline);
        struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
        if (ms == 0 || poll(&pf, 1, ms) == 0)
            return px_err_set(err, PX_ETIMEOUT,
                              "%s did not take data for %d ms: it is stuck "
                              "or overloaded",
                              c->peer, c->timeout_ms);
    }
    return PX_OK;
}

/* Reads exactly n bytes.  *got says how many arrived before a failure. */
static px_status read_all(px_rt_conn *c, void *data, size_t n, uint64_t deadline, size_t *got,
                          px_err *err)
{
    uint8_t *p = data;
    *got = 0;
    while (*got < n) {
        ssize_t r = recv(c->fd, p + *got, n - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0)
            return PX_EPEER; /* the caller words it */
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->broken = true;
            return px_err_set(err, PX_EPEER, "%s: connection failed (%s)", c->peer,
                              strerror(errno));
        }
        int ms = ms_left(conn_now(c), deadline);
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        if (ms == 0 || poll(&pf, 1, ms) == 0)
            return PX_ETIMEOUT;
    }
    return PX_OK;
}

static void sleep_ns(const px_rt_conn *c, uint64_t ns)
{
    if (c->clock) {
        c->clock->sleep_ns(c->clock->ud, ns);
        return;
    }
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Whether an intermittent fault is in its on-phase: the first duty *
 * period of every period since the faults were set. */
static bool degraded_now(const px_rt_conn *c)
{
    double period = c->faults.period_s;
    if (!(period > 0))
        return true;
    double t = (double)(conn_now(c) - c->faults_t0) / 1e9;
    double phase = fmod(t, period);
    return phase < c->faults.duty * period;
}

static void pace(px_rt_conn *c, size_t bytes)
{
    uint64_t wait = 0;
    if (degraded_now(c)) {
        wait = c->faults.latency_ns;
        if (c->faults.bandwidth_bps > 0)
            wait += (uint64_t)((double)bytes / c->faults.bandwidth_bps * 1e9);
    }
    /* A lost frame is noticed by the sender's retransmission timer and
     * sent again: the receiver sees it resend_ns later. */
    if (c->faults.loss > 0 && px_rng_uniform(&c->fault_rng) < c->faults.loss)
        wait += c->faults.resend_ns ? c->faults.resend_ns : 200000000u;
    if (wait)
        sleep_ns(c, wait);
}

/* Writes the parts, the byte at `flip_at` (UINT64_MAX: none) inverted. */
static px_status write_parts(px_rt_conn *c, const void *const *parts, const uint32_t *lens,
                             uint32_t n, uint64_t flip_at, uint64_t deadline, px_err *err)
{
    px_status st = PX_OK;
    uint64_t at = 0;
    for (uint32_t i = 0; st == PX_OK && i < n; i++) {
        const uint8_t *p = parts[i];
        if (flip_at >= at && flip_at < at + lens[i]) {
            size_t k = (size_t)(flip_at - at);
            uint8_t b = (uint8_t)~p[k];
            st = write_all(c, p, k, deadline, err);
            if (st == PX_OK)
                st = write_all(c, &b, 1, deadline, err);
            if (st == PX_OK)
                st = write_all(c, p + k + 1, lens[i] - k - 1, deadline, err);
        } else {
            st = write_all(c, p, lens[i], deadline, err);
        }
        at += lens[i];
    }
    return st;
}

px_status px_rt_conn_sendv(px_rt_conn *c, px_rt_frame_type type, uint8_t flags,
                           const void *const *parts, const uint32_t *lens, uint32_t n, px_err *err)
{
    if (c->faults.cut_after && c->frames_out >= c->faults.cut_after)
        c->faults.cut = true;
    if (c->faults.cut && !c->broken) {
        shutdown(c->fd, SHUT_RDWR);
        c->broken = true;
    }
    if (c->broken)
        return px_err_set(err, PX_EPEER, "the connection to %s is closed (cut)", c->peer);
    uint64_t total = 0;
    uint32_t crc = 0;
    for (uint32_t i = 0; i < n; i++) {
        total += lens[i];
        crc = px_rt_crc32(crc, parts[i], lens[i]);
    }
    if (total > c->max_payload)
        return px_err_set(err, PX_ELIMIT,
                          "frame to %s: payload of %" PRIu64 " bytes exceeds the "
                          "%u agreed for the connection",
                          c->peer, total, c->max_payload);
    pace(c, (size_t)total + PX_RT_FRAME_HEADER_BYTES);
    px_rt_frame_header h = {.magic = PX_RT_FRAME_MAGIC,
                            .version = PX_RT_FRAME_VERSION,
                            .type = (uint8_t)type,
                            .flags = flags,
                            .seq = c->next_seq++,
                            .length = (uint32_t)total,
                            .checksum = crc};
    uint8_t hb[PX_RT_FRAME_HEADER_BYTES];
    px_rt_frame_header_encode(&h, hb);
    uint64_t deadline = conn_now(c) + (uint64_t)c->timeout_ms * 1000000u;
    px_status st = write_all(c, hb, sizeof hb, deadline, err);
    if (c->faults.cut_mid_frame) {
        /* Half the payload, then the link goes away. */
        uint64_t left = total / 2;
        for (uint32_t i = 0; st == PX_OK && i < n && left > 0; i++) {
            uint32_t k = (uint32_t)PX_MIN((uint64_t)lens[i], left);
            st = write_all(c, parts[i], k, deadline, err);
            left -= k;
        }
        shutdown(c->fd, SHUT_RDWR);
        c->broken = true;
        return st ? st
                  : px_err_set(err, PX_EPEER,
                               "the connection to %s was cut mid-frame "
                               "(fault injected)",
                               c->peer);
    }
    /* A flip happens on the wire, after the checksum was computed. */
    uint64_t flip_at = UINT64_MAX;
    if (c->faults.flip > 0 && total > 0 && px_rng_uniform(&c->fault_rng) < c->faults.flip)
        flip_at = px_rng_below(&c->fault_rng, total);
    if (st == PX_OK)
        st = write_parts(c, parts, lens, n, flip_at, deadline, err);
    if (st == PX_OK) {
        c->frames_out++;
        c->bytes_out += total + PX_RT_FRAME_HEADER_BYTES;
    }
    return st;
}

px_status px_rt_conn_send(px_rt_conn *c, px_rt_frame_type type, uint8_t flags, const void *payload,
                          uint32_t len, px_err *err)
{
    const void *parts[1] = {payload};
    return px_rt_conn_sendv(c, type, flags, parts, &len, len ? 1 : 0, err);
}

px_status px_rt_conn_recv(px_rt_conn *c, px_rt_frame_header *h, const uint8_t **payload,
                          px_err *err)
{
    *payload = NULL;
    if (c->broken)
        return px_err_set(err, PX_EPEER, "the connection to %s is closed", c->peer);
    uint8_t hb[PX_RT_FRAME_HEADER_BYTES];
    uint64_t deadline = conn_now(c) + (uint64_t)c->timeout_ms * 1000000u;
    size_t got = 0;
    px_status st = read_all(c, hb, sizeof hb, deadline, &got, err);
    if (st == PX_ETIMEOUT)
        return px_err_set(err, PX_ETIMEOUT, "%s sent nothing for %d ms: it is stuck or dead%s",
                          c->peer, c->timeout_ms, got ? " (a frame header was cut short)" : "");
    if (st == PX_EPEER && got == 0 && !c->broken) {
        c->broken = true;
        return px_err_set(err, PX_EPEER, "%s closed the connection", c->peer);
    }
    if (st == PX_EPEER && !c->broken) {
        c->broken = true;
        return px_err_set(err, PX_EPEER,
                          "truncated frame from %s: the connection closed after "
                          "%zu of the header's %u bytes",
                          c->peer, got, PX_RT_FRAME_HEADER_BYTES);
    }
    if (st)
        return st;
    if ((st = px_rt_frame_header_decode(hb, c->max_payload, c->peer, h, err)) != PX_OK) {
        c->broken = true;
        return st;
    }
    if (h->length > c->cap) {
        uint8_t *nb = realloc(c->buf, h->length);
        if (!nb)
            return px_err_set(err, PX_ENOMEM, "frame from %s: cannot hold %u bytes", c->peer,
                              h->length);
        c->buf = nb;
        c->cap = h->length;
    }
    st = read_all(c, c->buf, h->length, deadline, &got, err);
    if (st == PX_ETIMEOUT)
        return px_err_set(err, PX_ETIMEOUT,
                          "%s stopped mid-frame: %zu of %u payload bytes "
                          "arrived within %d ms",
                          c->peer, got, h->length, c->timeout_ms);
    if (st == PX_EPEER && !c->broken) {
        c->broken = true;
        return px_err_set(err, PX_EPEER,
                          "truncated frame from %s (sequence %" PRIu64 "): the "
                          "connection closed after %zu of %u payload bytes",
                          c->peer, h->seq, got, h->length);
    }
    if (st)
        return st;
    uint32_t crc = px_rt_crc32(0, c->buf, h->length);
    if (crc != h->checksum) {
        c->broken = true;
        return px_err_set(err, PX_EPARSE,
                          "frame from %s (sequence %" PRIu64 ", %u bytes): "
                          "checksum 0x%08x does not match the header's 0x%08x: the payload was "
                          "corrupted",
                          c->peer, h->seq, h->length, crc, h->checksum);
    }
    c->frames_in++;
    c->bytes_in += h->length + PX_RT_FRAME_HEADER_BYTES;
    *payload = c->buf;
    return PX_OK;
}

void px__rt_conn_shutdown(px_rt_conn *c)
{
    if (c && c->fd >= 0)
        (void)shutdown(c->fd, SHUT_RDWR);
}
