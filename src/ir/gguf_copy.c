/* Copying a GGUF model's metadata into a writer, value bytes as stored
 * (a rewritten file, e.g. a quantized one, keeps every key it had). */
#include "ir/ir_impl.h"

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Bytes of a serialized value of type t at p (avail bytes there), or
 * false when it overruns (the reader checked the file; this guards the
 * walk anyway).  Nested arrays recurse, at most `depth` deep. */
static bool value_len(const uint8_t *p, size_t avail, px_gguf_type t, int depth, size_t *len)
{
    size_t n = px__gguf_scalar_size(t);
    if (n) {
        *len = n;
        return n <= avail;
    }
    if (t == PX_GGUF_STRING) {
        if (avail < 8 || le64(p) > avail - 8)
            return false;
        *len = 8 + (size_t)le64(p);
        return true;
    }
    if (t != PX_GGUF_ARRAY || depth == 0 || avail < 12)
        return false;
    px_gguf_type et = (px_gguf_type)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24);
    uint64_t count = le64(p + 4);
    size_t at = 12, es = px__gguf_scalar_size(et);
    if (es) {
        if (count > (avail - at) / es)
            return false;
        *len = at + (size_t)count * es;
        return true;
    }
    for (uint64_t i = 0; i < count; i++) {
        size_t l;
        if (!value_len(p + at, avail - at, et, depth - 1, &l))
            return false;
        at += l;
    }
    *len = at;
    return true;
}

px_status px_ir_gguf_writer_copy_meta(px_ir_gguf_writer *w, const px_ir_model *m,
                                      const char *const *skip, size_t n_skip, px_err *err)
{
    if (m->source != PX_IR_SOURCE_GGUF || !m->image)
        return px_err_set(err, PX_EINVAL, "%s: not a GGUF file: no metadata to copy", m->path);
    for (size_t i = 0; i < m->n_kvs; i++) {
        const px__gguf_kv *kv = &m->kvs[i];
        bool skipped = false;
        for (size_t s = 0; s < n_skip && !skipped; s++)
            skipped = !strcmp(kv->key, skip[s]);
        if (skipped)
            continue;
        size_t len;
        if (kv->offset > m->image_len ||
            !value_len(m->image + kv->offset, m->image_len - kv->offset, kv->type, 4, &len))
            return px_err_set(err, PX_EPARSE, "%s: metadata \"%s\": value overruns the file",
                              m->path, kv->key);
        px_status st =
            px__ir_gguf_writer_add_raw(w, kv->key, kv->type, m->image + kv->offset, len, err);
        if (st)
            return st;
    }
    return PX_OK;
}
