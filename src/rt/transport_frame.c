/*
 * The transport's frames: the CRC-32 of payloads, the fixed header, and
 * the hello exchange that opens every connection.
 */
#include "base/common.h"

#include <pthread.h>
#include <zlib.h>

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
    if (out->type < PX_RT_FRAME_HELLO || out->type > PX_RT_FRAME_FAULT)
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

static px_status send_hello(px_rt_conn *c, px_rt_frame_type type, const px_rt_hello *h, px_err *err)
{
    json_t *o =
        json_pack("{s:i, s:I, s:i, s:i, s:i, s:I, s:s}", "protocol", (int)PX_RT_FRAME_VERSION,
                  "stage", (json_int_t)(h->stage == UINT32_MAX ? -1 : (json_int_t)h->stage),
                  "layer_begin", (int)h->layer_begin, "layer_end", (int)h->layer_end, "dim",
                  (int)h->dim, "max_payload", (json_int_t)h->max_payload, "model", h->model);
    char *text = o ? px_json_dump_line(o) : NULL;
    json_decref(o);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "hello: out of memory");
    px_status st = px_rt_conn_send(c, type, 0, text, (uint32_t)strlen(text), err);
    free(text);
    return st;
}

static px_status recv_hello(px_rt_conn *c, px_rt_frame_type want, px_rt_hello *h, px_err *err)
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
    memset(h, 0, sizeof *h);
    json_int_t proto = json_integer_value(json_object_get(doc, "protocol"));
    json_int_t stage = json_integer_value(json_object_get(doc, "stage"));
    json_int_t lb = json_integer_value(json_object_get(doc, "layer_begin"));
    json_int_t le = json_integer_value(json_object_get(doc, "layer_end"));
    json_int_t dim = json_integer_value(json_object_get(doc, "dim"));
    json_int_t mp = json_integer_value(json_object_get(doc, "max_payload"));
    const char *model = json_string_value(json_object_get(doc, "model"));
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
    } else {
        h->stage = stage < 0 ? UINT32_MAX : (uint32_t)stage;
        h->layer_begin = (uint32_t)lb;
        h->layer_end = (uint32_t)le;
        h->dim = (uint32_t)dim;
        h->max_payload = (uint32_t)mp;
        px_strlcpy(h->model, model, sizeof h->model);
    }
    json_decref(doc);
    return st;
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

px_status px_rt_hello_client(px_rt_conn *c, const px_rt_hello *mine, px_rt_hello *theirs,
                             px_err *err)
{
    px_status st = send_hello(c, PX_RT_FRAME_HELLO, mine, err);
    if (st == PX_OK)
        st = recv_hello(c, PX_RT_FRAME_HELLO_ACK, theirs, err);
    if (st == PX_OK)
        st = agree(c, mine, theirs, err);
    return st;
}

px_status px_rt_hello_server(px_rt_conn *c, const px_rt_hello *mine, px_rt_hello *theirs,
                             px_err *err)
{
    px_status st = recv_hello(c, PX_RT_FRAME_HELLO, theirs, err);
    if (st)
        return st;
    /* Answer even on a mismatch, so that the peer learns why. */
    px_err why;
    px_status ag = agree(c, mine, theirs, &why);
    if (ag) {
        (void)px_rt_conn_send(c, PX_RT_FRAME_ERROR, 0, why.msg, (uint32_t)strlen(why.msg), NULL);
        return px_err_set(err, ag, "%s", why.msg);
    }
    return send_hello(c, PX_RT_FRAME_HELLO_ACK, mine, err);
}
