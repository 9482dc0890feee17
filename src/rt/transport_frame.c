/*
 * The transport's frames: the CRC-32 of payloads, the fixed header, and
 * the hello exchange that opens every connection.
 */
#include "base/common.h"

#include <pthread.h>
#include <zlib.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "rt/pipeline_impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the transport writes little-endian frames with memcpy: port the encoders first"
#endif

/* ------------------------------------------------------------------ */
/* CRC-32 (IEEE): zlib's, which is sliced and thread-safe              */
/* ------------------------------------------------------------------ */

uint32_t px_rt_crc32(uint32_t crc, const void *data, size_t n)
{
    return (uint32_t)crc32_z(crc, data, n);
}

/* ------------------------------------------------------------------ */
/* Header                                                              */
/* ------------------------------------------------------------------ */

void px_rt_frame_header_encode(const px_rt_frame_header *h, uint8_t out[PX_RT_FRAME_HEADER_BYTES])
{
    memcpy(out + 0, &h->magic, 4);
    memcpy(out + 4, &h->version, 2);
    out[6] = h->type;
    out[7] = h->flags;
    memcpy(out + 8, &h->seq, 8);
    memcpy(out + 16, &h->length, 4);
    memcpy(out + 20, &h->checksum, 4);
}

px_status px_rt_frame_header_decode(const uint8_t in[PX_RT_FRAME_HEADER_BYTES],
                                    uint32_t max_payload, const char *peer, px_rt_frame_header *out,
                                    px_err *err)
{
    const char *who = peer ? peer : "peer";
    memcpy(&out->magic, in + 0, 4);
    memcpy(&out->version, in + 4, 2);
    out->type = in[6];
    out->flags = in[7];
    memcpy(&out->seq, in + 8, 8);
    memcpy(&out->length, in + 16, 4);
    memcpy(&out->checksum, in + 20, 4);
    if (out->magic != PX_RT_FRAME_MAGIC)
        return px_err_set(err, PX_EPARSE,
                          "frame from %s: wrong magic 0x%08x (expected 0x%08x "
                          "\"PXFR\"): the peer does not speak the plexus transport, or the "
                          "stream lost its framing",
                          who, out->magic, PX_RT_FRAME_MAGIC);
    if (out->version != PX_RT_FRAME_VERSION)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "frame from %s: transport version %u; this "
                          "build speaks %u: run the same plexus binary on both ends",
                          who, out->version, PX_RT_FRAME_VERSION);
    if (out->type < PX_RT_FRAME_HELLO || out->type > PX_RT_FRAME_AUTH)
        return px_err_set(err, PX_EPARSE,
                          "frame from %s (sequence %" PRIu64 "): unknown type "
                          "%u",
                          who, out->seq, out->type);
    if (out->length > max_payload)
        return px_err_set(err, PX_ELIMIT,
                          "frame from %s (sequence %" PRIu64 "): payload of %u "
                          "bytes exceeds the %u agreed for the connection",
                          who, out->seq, out->length, max_payload);
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Hello                                                               */
/* ------------------------------------------------------------------ */

/* With a secret: each side sends a nonce of NONCE_BYTES random bytes (hex
 * in its hello); the server's HELLO_ACK carries HMAC(secret, "plexus rt
 * hello server\n" || the client's hello || the server's nonce) and the
 * client's AUTH frame HMAC(secret, "plexus rt hello client\n" || the
 * server's hello).  Each proof covers the other side's whole hello as
 * it arrived, so a hello changed on the way fails it too. */
#define NONCE_BYTES 32
#define PROOF_BYTES 32

typedef struct hello_msg {
    px_rt_hello h;
    char nonce[2 * NONCE_BYTES + 1]; /* "" when absent */
    char proof[2 * PROOF_BYTES + 1];
    char *text; /* the payload as sent or received (owned) */
    uint32_t len;
} hello_msg;

static void to_hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

static bool from_hex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] |= (uint8_t)v;
    }
    return true;
}

static px_status hmac(const uint8_t *key, size_t key_len, const char *label, const void *a,
                      size_t a_len, const void *b, size_t b_len, uint8_t out[PROOF_BYTES],
                      px_err *err)
{
    size_t l_len = strlen(label), n = l_len + a_len + b_len, got = 0;
    uint8_t *data = malloc(n ? n : 1);
    if (!data)
        return px_err_set(err, PX_ENOMEM, "hello: out of memory");
    memcpy(data, label, l_len);
    if (a_len)
        memcpy(data + l_len, a, a_len);
    if (b_len)
        memcpy(data + l_len + a_len, b, b_len);
    unsigned char *r = EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, key_len, data, n, out,
                                 PROOF_BYTES, &got);
    free(data);
    if (!r || got != PROOF_BYTES)
        return px_err_set(err, PX_EINTERNAL, "hello: OpenSSL could not compute HMAC-SHA256");
    return PX_OK;
}

static const char server_label[] = "plexus rt hello server\n";
static const char client_label[] = "plexus rt hello client\n";

static px_status send_hello(px_rt_conn *c, px_rt_frame_type type, hello_msg *m, px_err *err)
{
    const px_rt_hello *h = &m->h;
    json_t *o =
        json_pack("{s:i, s:I, s:i, s:i, s:i, s:I, s:s}", "protocol", (int)PX_RT_FRAME_VERSION,
                  "stage", (json_int_t)(h->stage == UINT32_MAX ? -1 : (json_int_t)h->stage),
                  "layer_begin", (int)h->layer_begin, "layer_end", (int)h->layer_end, "dim",
                  (int)h->dim, "max_payload", (json_int_t)h->max_payload, "model", h->model);
    if (o && m->nonce[0])
        json_object_set_new(o, "nonce", json_string(m->nonce));
    if (o && m->proof[0])
        json_object_set_new(o, "proof", json_string(m->proof));
    char *text = o ? px_json_dump_line(o) : NULL;
    json_decref(o);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "hello: out of memory");
    m->text = text;
    m->len = (uint32_t)strlen(text);
    return px_rt_conn_send(c, type, 0, text, m->len, err);
}

static px_status recv_hello(px_rt_conn *c, px_rt_frame_type want, hello_msg *m, px_err *err)
{
    px_rt_frame_header fh;
    const uint8_t *payload;
    px_status st = px_rt_conn_recv(c, &fh, &payload, err);
    if (st)
        return st;
    const char *peer = px__rt_conn_peer(c);
    if (fh.type == PX_RT_FRAME_ERROR)
        return px_err_set(err, PX_EPEER, "%.*s", (int)PX_MIN(fh.length, 400u),
                          (const char *)payload);
    if (fh.type != want)
        return px_err_set(err, PX_EPARSE, "%s: expected a hello, got a frame of type %u", peer,
                          fh.type);
    px_json_limits lim = {.max_bytes = 4096, .max_depth = 2, .max_string = 128};
    json_t *doc = NULL;
    if ((st = px_json_parse((const char *)payload, fh.length, "hello", &lim, &doc, err)))
        return px_err_prefix(err, st, "%s: ", peer);
    px_rt_hello *h = &m->h;
    memset(h, 0, sizeof *h);
    json_int_t proto = json_integer_value(json_object_get(doc, "protocol"));
    json_int_t stage = json_integer_value(json_object_get(doc, "stage"));
    json_int_t lb = json_integer_value(json_object_get(doc, "layer_begin"));
    json_int_t le = json_integer_value(json_object_get(doc, "layer_end"));
    json_int_t dim = json_integer_value(json_object_get(doc, "dim"));
    json_int_t mp = json_integer_value(json_object_get(doc, "max_payload"));
    const char *model = json_string_value(json_object_get(doc, "model"));
    json_t *nonce = json_object_get(doc, "nonce"), *proof = json_object_get(doc, "proof");
    const char *nonce_s = json_string_value(nonce), *proof_s = json_string_value(proof);
    if (proto != PX_RT_FRAME_VERSION) {
        st = px_err_set(err, PX_EUNSUPPORTED,
                        "%s speaks transport protocol %" JSON_INTEGER_FORMAT
                        ", this side %u: run the same plexus binary on both ends",
                        peer, proto, PX_RT_FRAME_VERSION);
    } else if (stage < -1 || stage >= PX_RT_MAX_STAGES || lb < 0 || le < lb || le > 1000000 ||
               dim <= 0 || dim > (1 << 20) || mp <= 0 || mp > PX_RT_FRAME_MAX_PAYLOAD || !model) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: malformed hello (stage, layers, dim, max_payload "
                        "and model are required and bounded)",
                        peer);
    } else if ((nonce && (!nonce_s || strlen(nonce_s) != 2 * NONCE_BYTES)) ||
               (proof && (!proof_s || strlen(proof_s) != 2 * PROOF_BYTES))) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: malformed hello: \"nonce\" and \"proof\" must be %d hex digits", peer,
                        2 * NONCE_BYTES);
    } else {
        h->stage = stage < 0 ? UINT32_MAX : (uint32_t)stage;
        h->layer_begin = (uint32_t)lb;
        h->layer_end = (uint32_t)le;
        h->dim = (uint32_t)dim;
        h->max_payload = (uint32_t)mp;
        px_strlcpy(h->model, model, sizeof h->model);
        px_strlcpy(m->nonce, nonce_s ? nonce_s : "", sizeof m->nonce);
        px_strlcpy(m->proof, proof_s ? proof_s : "", sizeof m->proof);
        m->text = malloc(fh.length ? fh.length : 1);
        if (!m->text)
            st = px_err_set(err, PX_ENOMEM, "hello: out of memory");
        else
            memcpy(m->text, payload, fh.length);
        m->len = fh.length;
    }
    json_decref(doc);
    return st;
}

static void hello_msg_release(hello_msg *m)
{
    free(m->text);
    m->text = NULL;
}

static px_status agree(px_rt_conn *c, const px_rt_hello *mine, const px_rt_hello *theirs,
                       px_err *err)
{
    const char *peer = px__rt_conn_peer(c);
    if (strcmp(mine->model, theirs->model))
        return px_err_set(err, PX_EVALIDATE,
                          "%s runs model %s, this side %s: every stage must "
                          "open the same model file",
                          peer, theirs->model, mine->model);
    if (mine->dim != theirs->dim)
        return px_err_set(err, PX_EVALIDATE, "%s has hidden size %u, this side %u", peer,
                          theirs->dim, mine->dim);
    px_rt_conn_set_max_payload(c, PX_MIN(mine->max_payload, theirs->max_payload));
    return PX_OK;
}

/* Whether the peer's side of the secret matches this side's: both have
 * one or neither.  PX_EAUTH naming the side that lacks it. */
static px_status auth_presence(px_rt_conn *c, bool mine, bool theirs, px_err *err)
{
    const char *peer = px__rt_conn_peer(c);
    if (mine && !theirs)
        return px_err_set(err, PX_EAUTH,
                          "%s did not authenticate: this side requires the deployment's secret "
                          "and the peer was started without one",
                          peer);
    if (!mine && theirs)
        return px_err_set(err, PX_EAUTH,
                          "%s requires the deployment's secret and this side has none: start "
                          "it with the deployment's secret (plexus worker --secret-stdin)",
                          peer);
    return PX_OK;
}

/* Compares a proof in hex against the expected bytes, in constant time. */
static bool proof_matches(const char *hex, const uint8_t want[PROOF_BYTES])
{
    uint8_t got[PROOF_BYTES];
    if (!from_hex(hex, got, sizeof got))
        return false;
    return CRYPTO_memcmp(got, want, PROOF_BYTES) == 0;
}

static void refuse(px_rt_conn *c, const char *why)
{
    (void)px_rt_conn_send(c, PX_RT_FRAME_ERROR, 0, why, (uint32_t)strlen(why), NULL);
}

px_status px_rt_hello_client(px_rt_conn *c, const px_rt_hello *mine, px_rt_hello *theirs,
                             px_err *err)
{
    size_t key_len;
    const uint8_t *key = px__rt_conn_secret(c, &key_len);
    hello_msg out = {.h = *mine}, in = {0};
    px_status st = PX_OK;
    if (key) {
        uint8_t nonce[NONCE_BYTES];
        if (RAND_bytes(nonce, sizeof nonce) != 1)
            return px_err_set(err, PX_EINTERNAL, "hello: OpenSSL could not draw a nonce");
        to_hex(nonce, sizeof nonce, out.nonce);
    }
    st = send_hello(c, PX_RT_FRAME_HELLO, &out, err);
    if (st == PX_OK)
        st = recv_hello(c, PX_RT_FRAME_HELLO_ACK, &in, err);
    if (st == PX_OK)
        st = auth_presence(c, key != NULL, in.proof[0] != 0, err);
    if (st == PX_OK && key) {
        uint8_t want[PROOF_BYTES], mine_proof[PROOF_BYTES];
        st = hmac(key, key_len, server_label, out.text, out.len, in.nonce, strlen(in.nonce), want,
                  err);
        if (st == PX_OK && (!in.nonce[0] || !proof_matches(in.proof, want))) {
            refuse(c, "authentication failed: the hello's proof does not match this side's "
                      "secret");
            st = px_err_set(err, PX_EAUTH,
                            "%s failed authentication: its proof does not match this side's "
                            "secret (it holds another deployment's secret, or the hello was "
                            "changed on the way)",
                            px__rt_conn_peer(c));
        }
        if (st == PX_OK)
            st = hmac(key, key_len, client_label, in.text, in.len, NULL, 0, mine_proof, err);
        if (st == PX_OK)
            st = px_rt_conn_send(c, PX_RT_FRAME_AUTH, 0, mine_proof, sizeof mine_proof, err);
        OPENSSL_cleanse(want, sizeof want);
    }
    if (st == PX_OK) {
        *theirs = in.h;
        st = agree(c, mine, theirs, err);
    }
    hello_msg_release(&out);
    hello_msg_release(&in);
    return st;
}

px_status px_rt_hello_server(px_rt_conn *c, const px_rt_hello *mine, px_rt_hello *theirs,
                             px_err *err)
{
    size_t key_len;
    const uint8_t *key = px__rt_conn_secret(c, &key_len);
    hello_msg in = {0}, out = {.h = *mine};
    px_status st = recv_hello(c, PX_RT_FRAME_HELLO, &in, err);
    if (st)
        return st;
    /* Answer even on a mismatch, so that the peer learns why. */
    px_err why;
    px_status ag = auth_presence(c, key != NULL, in.nonce[0] != 0, &why);
    if (ag == PX_OK)
        ag = agree(c, mine, &in.h, &why);
    if (ag) {
        refuse(c, why.msg);
        hello_msg_release(&in);
        return px_err_set(err, ag, "%s", why.msg);
    }
    *theirs = in.h;
    uint8_t proof[PROOF_BYTES];
    if (key) {
        uint8_t nonce[NONCE_BYTES];
        if (RAND_bytes(nonce, sizeof nonce) != 1)
            st = px_err_set(err, PX_EINTERNAL, "hello: OpenSSL could not draw a nonce");
        else
            to_hex(nonce, sizeof nonce, out.nonce);
        if (st == PX_OK)
            st = hmac(key, key_len, server_label, in.text, in.len, out.nonce, strlen(out.nonce),
                      proof, err);
        if (st == PX_OK)
            to_hex(proof, sizeof proof, out.proof);
    }
    if (st == PX_OK)
        st = send_hello(c, PX_RT_FRAME_HELLO_ACK, &out, err);
    if (st == PX_OK && key) {
        px_rt_frame_header fh = {0};
        const uint8_t *p = NULL;
        st = px_rt_conn_recv(c, &fh, &p, err);
        if (st == PX_OK && fh.type == PX_RT_FRAME_ERROR)
            st = px_err_set(err, PX_EAUTH, "%s refused this side's hello: %.*s",
                            px__rt_conn_peer(c), (int)PX_MIN(fh.length, 300u), (const char *)p);
        else if (st == PX_OK && fh.type != PX_RT_FRAME_AUTH)
            st = px_err_set(err, PX_EAUTH,
                            "%s did not authenticate: a frame of type %u came where its proof "
                            "of the secret belongs",
                            px__rt_conn_peer(c), fh.type);
        uint8_t want[PROOF_BYTES];
        if (st == PX_OK)
            st = hmac(key, key_len, client_label, out.text, out.len, NULL, 0, want, err);
        if (st == PX_OK && (fh.length != PROOF_BYTES || CRYPTO_memcmp(p, want, PROOF_BYTES) != 0)) {
            refuse(c, "authentication failed: the proof does not match this side's secret");
            st = px_err_set(err, PX_EAUTH,
                            "%s failed authentication: its proof does not match this side's "
                            "secret (it holds another deployment's secret, or the hello was "
                            "changed on the way)",
                            px__rt_conn_peer(c));
        }
        OPENSSL_cleanse(want, sizeof want);
    }
    hello_msg_release(&in);
    hello_msg_release(&out);
    return st;
}
