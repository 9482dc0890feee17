/*
 * A streaming GGUF v3 writer.  Metadata and the tensor table are kept in
 * memory (they are small); tensor data goes straight to the file as the
 * caller produces it, so files of any size can be written.
 */
#include "ir/ir_impl.h"

#include <unistd.h>

#define ALIGNMENT 32u

typedef struct wtensor {
    char *name;
    px_dtype dtype;
    uint32_t n_dims;
    uint64_t ne[PX_IR_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset; /* relative to the data section */
} wtensor;

struct px_ir_gguf_writer {
    char *path, *tmp;
    FILE *f;
    px_strbuf kv; /* serialized metadata pairs */
    uint64_t n_kv;
    char **keys;
    size_t n_keys, cap_keys;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    uint64_t data_size; /* sum of aligned tensor sizes */
    bool started;
    size_t cur;           /* tensor being written */
    uint64_t cur_written; /* its bytes so far */
    px_status failed;     /* sticky error */
    bool oom;             /* an append to kv ran out of memory */
};

/* Serializers append to a buffer and remember a failed allocation in
 * *oom, so that a series of appends is checked once. */
static void put_bytes(px_strbuf *sb, const void *p, size_t n, bool *oom)
{
    if (px_strbuf_add(sb, p, n) != PX_OK)
        *oom = true;
}

static void put_u32(px_strbuf *sb, uint32_t v, bool *oom)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put_bytes(sb, b, 4, oom);
}

static void put_u64(px_strbuf *sb, uint64_t v, bool *oom)
{
    put_u32(sb, (uint32_t)v, oom);
    put_u32(sb, (uint32_t)(v >> 32), oom);
}

static void put_str(px_strbuf *sb, const char *s, size_t len, bool *oom)
{
    put_u64(sb, len, oom);
    put_bytes(sb, s, len, oom);
}

px_status px_ir_gguf_writer_new(const char *path, px_ir_gguf_writer **out, px_err *err)
{
    *out = NULL;
    px_ir_gguf_writer *w = calloc(1, sizeof *w);
    if (!w)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    px_strbuf_init(&w->kv);
    w->path = px_strdup(path);
    w->tmp = px_asprintf("%s.tmp.%ld", path, (long)getpid());
    if (!w->path || !w->tmp) {
        px_ir_gguf_writer_abort(w);
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
    }
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", path, strerror(errno));
        px_ir_gguf_writer_abort(w);
        return st;
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    *out = w;
    return PX_OK;
}

void px_ir_gguf_writer_abort(px_ir_gguf_writer *w)
{
    if (!w)
        return;
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
    }
    for (size_t i = 0; i < w->n_keys; i++)
        free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    px_strbuf_release(&w->kv);
    free(w->path);
    free(w->tmp);
    free(w);
}

/* Starts a pair: checks the state and the key's uniqueness, writes the key
 * and the type. */
static px_status begin_kv(px_ir_gguf_writer *w, const char *key, px_gguf_type t, px_err *err)
{
    if (w->started)
        return px_err_set(err, PX_ESTATE, "%s: metadata \"%s\" added after the data began", w->path,
                          key);
    size_t klen = strlen(key);
    if (klen == 0 || klen > PX__IR_MAX_KEY_LEN)
        return px_err_set(err, PX_EINVAL, "%s: metadata key of %zu bytes", w->path, klen);
    for (size_t i = 0; i < w->n_keys; i++)
        if (!strcmp(w->keys[i], key))
            return px_err_set(err, PX_EEXIST, "%s: metadata key \"%s\" added twice", w->path, key);
    if (w->n_keys == w->cap_keys) {
        size_t ncap = w->cap_keys ? 2 * w->cap_keys : 16;
        char **nk = realloc(w->keys, ncap * sizeof *nk);
        if (!nk)
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", w->path);
        w->keys = nk;
        w->cap_keys = ncap;
    }
    if (!(w->keys[w->n_keys] = px_strdup(key)))
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", w->path);
    w->n_keys++;
    w->n_kv++;
    put_str(&w->kv, key, klen, &w->oom);
    put_u32(&w->kv, (uint32_t)t, &w->oom);
    return PX_OK;
}

px_status px_ir_gguf_writer_add_u32(px_ir_gguf_writer *w, const char *key, uint32_t v, px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_U32, err);
    if (st == PX_OK)
        put_u32(&w->kv, v, &w->oom);
    return st;
}

px_status px_ir_gguf_writer_add_u64(px_ir_gguf_writer *w, const char *key, uint64_t v, px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_U64, err);
    if (st == PX_OK)
        put_u64(&w->kv, v, &w->oom);
    return st;
}

px_status px_ir_gguf_writer_add_i32(px_ir_gguf_writer *w, const char *key, int32_t v, px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_I32, err);
    if (st == PX_OK)
        put_u32(&w->kv, (uint32_t)v, &w->oom);
    return st;
}

px_status px_ir_gguf_writer_add_f32(px_ir_gguf_writer *w, const char *key, float v, px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_F32, err);
    if (st == PX_OK) {
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        put_u32(&w->kv, u, &w->oom);
    }
    return st;
}

px_status px_ir_gguf_writer_add_bool(px_ir_gguf_writer *w, const char *key, bool v, px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_BOOL, err);
    if (st == PX_OK)
        put_bytes(&w->kv, v ? "\1" : "", 1, &w->oom);
    return st;
}

px_status px_ir_gguf_writer_add_str(px_ir_gguf_writer *w, const char *key, const char *v,
                                    px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_STRING, err);
    if (st == PX_OK)
        put_str(&w->kv, v, strlen(v), &w->oom);
    return st;
}

px_status px__ir_gguf_writer_add_raw(px_ir_gguf_writer *w, const char *key, px_gguf_type t,
                                     const void *value, size_t len, px_err *err)
{
    px_status st = begin_kv(w, key, t, err);
    if (st == PX_OK)
        put_bytes(&w->kv, value, len, &w->oom);
    return st;
}

px_status px_ir_gguf_writer_add_array(px_ir_gguf_writer *w, const char *key, px_gguf_type t,
                                      const void *values, size_t n, px_err *err)
{
    uint32_t size = px__gguf_scalar_size(t);
    if (!size)
        return px_err_set(err, PX_EINVAL,
                          "%s: key \"%s\": arrays of type %d are written with "
                          "px_ir_gguf_writer_add_str_array",
                          w->path, key, (int)t);
    px_status st = begin_kv(w, key, PX_GGUF_ARRAY, err);
    if (st != PX_OK)
        return st;
    put_u32(&w->kv, (uint32_t)t, &w->oom);
    put_u64(&w->kv, n, &w->oom);
    /* plexus runs on little-endian hosts, so values are already in file order. */
    put_bytes(&w->kv, values, n * size, &w->oom);
    return PX_OK;
}

px_status px_ir_gguf_writer_add_str_array(px_ir_gguf_writer *w, const char *key,
                                          const char *const *values, const uint32_t *lens, size_t n,
                                          px_err *err)
{
    px_status st = begin_kv(w, key, PX_GGUF_ARRAY, err);
    if (st != PX_OK)
        return st;
    put_u32(&w->kv, PX_GGUF_STRING, &w->oom);
    put_u64(&w->kv, n, &w->oom);
    for (size_t i = 0; i < n; i++)
        put_str(&w->kv, values[i], lens ? lens[i] : strlen(values[i]), &w->oom);
    return PX_OK;
}

px_status px_ir_gguf_writer_add_tensor(px_ir_gguf_writer *w, const char *name, px_dtype t,
                                       uint32_t n_dims, const uint64_t *ne, px_err *err)
{
    if (w->started)
        return px_err_set(err, PX_ESTATE, "%s: tensor \"%s\" declared after the data began",
                          w->path, name);
    if (n_dims < 1 || n_dims > PX_IR_MAX_DIMS || px_dtype_to_ggml(t) < 0)
        return px_err_set(err, PX_EINVAL,
                          "%s: tensor \"%s\": %u dimensions of %s cannot be "
                          "stored in GGUF",
                          w->path, name, n_dims, px_dtype_name(t));
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return px_err_set(err, PX_EEXIST, "%s: tensor \"%s\" declared twice", w->path, name);
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++)
        if (ne[i] == 0 || __builtin_mul_overflow(n, ne[i], &n))
            return px_err_set(err, PX_EINVAL, "%s: tensor \"%s\": bad dimension %u", w->path, name,
                              i);
    wtensor wt = {0};
    if (ne[0] % px_dtype_block_elems(t) || !px_dtype_nbytes(t, n, &wt.n_bytes))
        return px_err_set(err, PX_EINVAL,
                          "%s: tensor \"%s\": rows of %" PRIu64 " values do "
                          "not fill %s blocks of %u",
                          w->path, name, ne[0], px_dtype_name(t), px_dtype_block_elems(t));
    if (w->n_tensors == w->cap_tensors) {
        size_t ncap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        wtensor *nt = realloc(w->tensors, ncap * sizeof *nt);
        if (!nt)
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", w->path);
        w->tensors = nt;
        w->cap_tensors = ncap;
    }
    wt.name = px_strdup(name);
    if (!wt.name)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", w->path);
    wt.dtype = t;
    wt.n_dims = n_dims;
    for (uint32_t i = 0; i < PX_IR_MAX_DIMS; i++)
        wt.ne[i] = i < n_dims ? ne[i] : 1;
    wt.offset = w->data_size;
    w->data_size += (wt.n_bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    w->tensors[w->n_tensors++] = wt;
    return PX_OK;
}

static px_status write_all(px_ir_gguf_writer *w, const void *p, size_t n, px_err *err)
{
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->failed = PX_EIO;
        return px_err_set(err, PX_EIO, "%s: write failed: %s", w->path, strerror(errno));
    }
    return PX_OK;
}

static px_status pad(px_ir_gguf_writer *w, uint64_t n, px_err *err)
{
    static const uint8_t zeros[ALIGNMENT];
    return write_all(w, zeros, (size_t)n, err);
}

px_status px_ir_gguf_writer_begin_data(px_ir_gguf_writer *w, px_err *err)
{
    if (w->started)
        return px_err_set(err, PX_ESTATE, "%s: data already begun", w->path);
    px_strbuf head = PX_STRBUF_INIT;
    bool oom = w->oom;
    put_bytes(&head, "GGUF", 4, &oom);
    put_u32(&head, 3, &oom);
    put_u64(&head, w->n_tensors, &oom);
    put_u64(&head, w->n_kv, &oom);
    put_bytes(&head, w->kv.buf, w->kv.len, &oom);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(&head, t->name, strlen(t->name), &oom);
        put_u32(&head, t->n_dims, &oom);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(&head, t->ne[d], &oom);
        put_u32(&head, (uint32_t)px_dtype_to_ggml(t->dtype), &oom);
        put_u64(&head, t->offset, &oom);
    }
    while (!oom && head.len % ALIGNMENT)
        put_bytes(&head, "", 1, &oom);
    px_status st = oom ? px_err_set(err, PX_ENOMEM, "%s: out of memory", w->path)
                       : write_all(w, head.buf, head.len, err);
    px_strbuf_release(&head);
    if (st != PX_OK)
        return st;
    w->started = true;
    w->cur = 0;
    w->cur_written = 0;
    return PX_OK;
}

px_status px_ir_gguf_writer_write(px_ir_gguf_writer *w, const void *data, size_t len, px_err *err)
{
    if (!w->started)
        return px_err_set(err, PX_ESTATE, "%s: tensor data written before begin_data", w->path);
    if (w->failed)
        return px_err_set(err, w->failed, "%s: an earlier write failed", w->path);
    const uint8_t *p = data;
    while (len) {
        /* Skip to the next tensor with room, padding the one just filled. */
        while (w->cur < w->n_tensors && w->cur_written == w->tensors[w->cur].n_bytes) {
            uint64_t n = w->tensors[w->cur].n_bytes;
            px_status st = pad(w, (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT, err);
            if (st != PX_OK)
                return st;
            w->cur++;
            w->cur_written = 0;
        }
        if (w->cur >= w->n_tensors)
            return px_err_set(err, PX_EINVAL, "%s: %zu bytes written past the last tensor", w->path,
                              len);
        uint64_t room = w->tensors[w->cur].n_bytes - w->cur_written;
        size_t n = room < len ? (size_t)room : len;
        px_status st = write_all(w, p, n, err);
        if (st != PX_OK)
            return st;
        w->cur_written += n;
        p += n;
        len -= n;
    }
    return PX_OK;
}

px_status px_ir_gguf_writer_finish(px_ir_gguf_writer *w, px_err *err)
{
    px_status st = PX_OK;
    if (!w->started)
        st = px_ir_gguf_writer_begin_data(w, err);
    if (st == PX_OK && w->n_tensors) {
        /* The last tensor must be complete; earlier ones were completed as
         * writing moved past them. */
        size_t last = w->n_tensors - 1;
        if (w->cur < last || (w->cur == last && w->cur_written != w->tensors[last].n_bytes))
            st = px_err_set(err, PX_ESTATE,
                            "%s: tensor \"%s\" got %" PRIu64 " of its %" PRIu64 " bytes", w->path,
                            w->tensors[w->cur].name, w->cur_written, w->tensors[w->cur].n_bytes);
        else
            st = pad(w, (ALIGNMENT - w->tensors[last].n_bytes % ALIGNMENT) % ALIGNMENT, err);
    }
    if (st == PX_OK && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = px_err_set(err, PX_EIO, "%s: cannot write: %s", w->path, strerror(errno));
    if (st == PX_OK) {
        int rc = fclose(w->f);
        w->f = NULL;
        if (rc != 0 || rename(w->tmp, w->path) != 0) {
            st = px_err_set(err, PX_EIO, "%s: cannot write: %s", w->path, strerror(errno));
            unlink(w->tmp);
        }
    }
    px_ir_gguf_writer_abort(w);
    return st;
}
