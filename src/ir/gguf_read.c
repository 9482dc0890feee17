/*
 * GGUF v2/v3 reader: header, metadata, tensor table, data offsets.
 *
 * The layout (ggml's docs/gguf.md), all little-endian:
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type,
 *                 u64 offset (relative to the data section) },
 *   padding to general.alignment (default 32), then the data section.
 * A string is a u64 length and that many bytes (no NUL); an array is a u32
 * element type, a u64 count and the elements.
 *
 * Every count, length, dimension and offset is bounded and checked against
 * the bytes that remain before it is used, so no input can make the reader
 * allocate without bound or read past the image.
 */
#include "ir/ir_impl.h"

typedef struct cur {
    const uint8_t *base;
    size_t len;
    size_t off;
    const char *name;
    px_err *err;
} cur;

static px_status truncated(cur *c, uint64_t need, const char *what)
{
    return px_err_set(c->err, PX_EPARSE,
                      "%s: byte %zu: %s needs %" PRIu64 " bytes but only %zu remain; "
                      "the file is truncated or the count before it is wrong",
                      c->name, c->off, what, need, c->len - c->off);
}

static px_status need(cur *c, uint64_t n, const char *what)
{
    if (n > c->len - c->off)
        return truncated(c, n, what);
    return PX_OK;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static px_status rd_u32(cur *c, uint32_t *v, const char *what)
{
    px_status st = need(c, 4, what);
    if (st == PX_OK) {
        *v = get_u32(c->base + c->off);
        c->off += 4;
    }
    return st;
}

static px_status rd_u64(cur *c, uint64_t *v, const char *what)
{
    px_status st = need(c, 8, what);
    if (st == PX_OK) {
        *v = get_u64(c->base + c->off);
        c->off += 8;
    }
    return st;
}

/* A string in place: its bytes stay in the image. */
static px_status rd_str(cur *c, uint64_t max, const char *what, const uint8_t **p, uint64_t *n)
{
    size_t at = c->off;
    px_status st = rd_u64(c, n, what);
    if (st != PX_OK)
        return st;
    if (*n > max) {
        c->off = at;
        return px_err_set(c->err, PX_ELIMIT,
                          "%s: byte %zu: %s is %" PRIu64 " bytes long, more than the "
                          "limit of %" PRIu64,
                          c->name, at, what, *n, max);
    }
    if ((st = need(c, *n, what)) != PX_OK)
        return st;
    *p = c->base + c->off;
    c->off += (size_t)*n;
    return PX_OK;
}

static const char *type_name(uint32_t t)
{
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < PX_ARRAY_LEN(names) ? names[t] : "?";
}

uint32_t px__gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case PX_GGUF_U8:
    case PX_GGUF_I8:
    case PX_GGUF_BOOL:
        return 1;
    case PX_GGUF_U16:
    case PX_GGUF_I16:
        return 2;
    case PX_GGUF_U32:
    case PX_GGUF_I32:
    case PX_GGUF_F32:
        return 4;
    case PX_GGUF_U64:
    case PX_GGUF_I64:
    case PX_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

/* Reads a scalar into kv->v. */
static void decode_scalar(uint32_t t, const uint8_t *p, px__gguf_kv *kv)
{
    switch (t) {
    case PX_GGUF_U8:
        kv->v.u = p[0];
        break;
    case PX_GGUF_BOOL:
        kv->v.u = p[0];
        break;
    case PX_GGUF_I8:
        kv->v.i = (int8_t)p[0];
        break;
    case PX_GGUF_U16:
        kv->v.u = (uint16_t)(p[0] | p[1] << 8);
        break;
    case PX_GGUF_I16:
        kv->v.i = (int16_t)(uint16_t)(p[0] | p[1] << 8);
        break;
    case PX_GGUF_U32:
        kv->v.u = get_u32(p);
        break;
    case PX_GGUF_I32:
        kv->v.i = (int32_t)get_u32(p);
        break;
    case PX_GGUF_U64:
        kv->v.u = get_u64(p);
        break;
    case PX_GGUF_I64:
        kv->v.i = (int64_t)get_u64(p);
        break;
    case PX_GGUF_F32: {
        uint32_t u = get_u32(p);
        float f;
        memcpy(&f, &u, sizeof f);
        kv->v.f = f;
        break;
    }
    case PX_GGUF_F64: {
        uint64_t u = get_u64(p);
        memcpy(&kv->v.f, &u, sizeof kv->v.f);
        break;
    }
    default:
        break;
    }
}

/* Skips over an array's elements, checking every length. */
static px_status skip_array(cur *c, uint32_t et, uint64_t n, int depth, const char *key)
{
    if (et == PX_GGUF_STRING) {
        /* Each string has at least its 8-byte length. */
        if (n > (c->len - c->off) / 8)
            return truncated(c, n * 8, "array of strings");
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *p = NULL;
            uint64_t len;
            px_status st = rd_str(c, PX__IR_MAX_STRING, "array string", &p, &len);
            if (st != PX_OK)
                return px_err_prefix(c->err, st, "key \"%s\"[%" PRIu64 "]: ", key, i);
        }
        return PX_OK;
    }
    if (et == PX_GGUF_ARRAY) {
        if (depth >= PX__IR_MAX_ARRAY_DEPTH)
            return px_err_set(c->err, PX_ELIMIT,
                              "%s: byte %zu: key \"%s\": arrays nested deeper than %d", c->name,
                              c->off, key, PX__IR_MAX_ARRAY_DEPTH);
        if (n > (c->len - c->off) / 12)
            return truncated(c, n * 12, "array of arrays");
        for (uint64_t i = 0; i < n; i++) {
            uint32_t it;
            uint64_t in;
            px_status st;
            if ((st = rd_u32(c, &it, "nested array type")) != PX_OK ||
                (st = rd_u64(c, &in, "nested array length")) != PX_OK)
                return st;
            if (in > PX__IR_MAX_ARRAY)
                return px_err_set(c->err, PX_ELIMIT,
                                  "%s: byte %zu: key \"%s\": nested array of %" PRIu64
                                  " elements, more than the limit of %u",
                                  c->name, c->off, key, in, PX__IR_MAX_ARRAY);
            if (it != PX_GGUF_STRING && it != PX_GGUF_ARRAY && !px__gguf_scalar_size(it))
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %zu: key \"%s\": unknown array element type %u",
                                  c->name, c->off - 12, key, it);
            if ((st = skip_array(c, it, in, depth + 1, key)) != PX_OK)
                return st;
        }
        return PX_OK;
    }
    uint64_t size = px__gguf_scalar_size(et);
    px_status st = need(c, n * size, "array elements");
    if (st == PX_OK)
        c->off += (size_t)(n * size);
    return st;
}

static uint64_t str_hash(const char *s)
{
    return px_hash64(s, strlen(s));
}

static char *render(px_arena *a, const px__gguf_kv *kv)
{
    switch (kv->type) {
    case PX_GGUF_STRING:
        return px_arena_printf(a, "string \"%.48s%s\"", kv->str, kv->str_len > 48 ? "..." : "");
    case PX_GGUF_ARRAY:
        return px_arena_printf(a, "array<%s>[%" PRIu64 "]", type_name(kv->elem_type), kv->n);
    case PX_GGUF_BOOL:
        return px_arena_printf(a, "bool %s", kv->v.u ? "true" : "false");
    case PX_GGUF_F32:
    case PX_GGUF_F64:
        return px_arena_printf(a, "%s %.9g", type_name(kv->type), kv->v.f);
    case PX_GGUF_I8:
    case PX_GGUF_I16:
    case PX_GGUF_I32:
    case PX_GGUF_I64:
        return px_arena_printf(a, "%s %" PRId64, type_name(kv->type), kv->v.i);
    default:
        return px_arena_printf(a, "%s %" PRIu64, type_name(kv->type), kv->v.u);
    }
}

static px_status parse_kvs(px_ir_model *m, cur *c, uint64_t n_kv, uint32_t *alignment)
{
    m->kvs = px_arena_calloc(m->arena, n_kv ? n_kv : 1, sizeof *m->kvs);
    size_t cap = 16;
    while (cap < n_kv * 2)
        cap *= 2;
    uint32_t *index = px_arena_alloc(m->arena, cap * sizeof *index);
    if (!m->kvs || !index)
        return px_err_set(c->err, PX_ENOMEM, "%s: out of memory reading metadata", c->name);
    memset(index, 0xff, cap * sizeof *index);
    for (uint64_t i = 0; i < n_kv; i++) {
        px__gguf_kv *kv = &m->kvs[i];
        size_t at = c->off;
        const uint8_t *kp = NULL;
        uint64_t klen;
        px_status st = rd_str(c, PX__IR_MAX_KEY_LEN, "metadata key", &kp, &klen);
        if (st != PX_OK)
            return px_err_prefix(c->err, st, "metadata %" PRIu64 ": ", i);
        if (klen == 0 || memchr(kp, 0, (size_t)klen))
            return px_err_set(c->err, PX_EPARSE,
                              "%s: byte %zu: metadata %" PRIu64 ": the key is empty or holds "
                              "a NUL byte; keys are dotted ASCII names",
                              c->name, at, i);
        kv->key = px_arena_strndup(m->arena, (const char *)kp, (size_t)klen);
        if (!kv->key)
            return px_err_set(c->err, PX_ENOMEM, "%s: out of memory", c->name);
        size_t h = (size_t)str_hash(kv->key) & (cap - 1);
        while (index[h] != UINT32_MAX) {
            if (!strcmp(m->kvs[index[h]].key, kv->key))
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %zu: metadata key \"%.80s\" appears twice; "
                                  "each key may appear once",
                                  c->name, at, kv->key);
            h = (h + 1) & (cap - 1);
        }
        index[h] = (uint32_t)i;
        uint32_t t;
        if ((st = rd_u32(c, &t, "metadata value type")) != PX_OK)
            return st;
        kv->type = (px_gguf_type)t;
        kv->offset = c->off;
        if (t == PX_GGUF_STRING) {
            const uint8_t *sp = NULL;
            if ((st = rd_str(c, PX__IR_MAX_STRING, "metadata string", &sp, &kv->str_len)) != PX_OK)
                return px_err_prefix(c->err, st, "key \"%.80s\": ", kv->key);
            kv->str = px_arena_strndup(m->arena, (const char *)sp, (size_t)kv->str_len);
            if (!kv->str)
                return px_err_set(c->err, PX_ENOMEM, "%s: out of memory", c->name);
        } else if (t == PX_GGUF_ARRAY) {
            uint32_t et;
            if ((st = rd_u32(c, &et, "array element type")) != PX_OK ||
                (st = rd_u64(c, &kv->n, "array length")) != PX_OK)
                return st;
            if (et != PX_GGUF_STRING && et != PX_GGUF_ARRAY && !px__gguf_scalar_size(et))
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %zu: key \"%.80s\": unknown array element type "
                                  "%u; known types are 0..12",
                                  c->name, c->off - 12, kv->key, et);
            if (kv->n > PX__IR_MAX_ARRAY)
                return px_err_set(c->err, PX_ELIMIT,
                                  "%s: byte %zu: key \"%.80s\": array of %" PRIu64
                                  " elements, more than the limit of %u",
                                  c->name, c->off - 8, kv->key, kv->n, PX__IR_MAX_ARRAY);
            kv->elem_type = (px_gguf_type)et;
            kv->arr = c->base + c->off;
            if ((st = skip_array(c, et, kv->n, 1, kv->key)) != PX_OK)
                return st;
        } else {
            uint64_t size = px__gguf_scalar_size(t);
            if (!size)
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %zu: key \"%.80s\": unknown value type %u; "
                                  "known types are 0..12",
                                  c->name, c->off - 4, kv->key, t);
            if ((st = need(c, size, "metadata value")) != PX_OK)
                return px_err_prefix(c->err, st, "key \"%.80s\": ", kv->key);
            decode_scalar(t, c->base + c->off, kv);
            if (t == PX_GGUF_BOOL && kv->v.u > 1)
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %zu: key \"%.80s\": bool value %" PRIu64
                                  " is neither 0 nor 1",
                                  c->name, c->off, kv->key, kv->v.u);
            c->off += (size_t)size;
        }
        kv->text = render(m->arena, kv);
        if (!kv->text)
            return px_err_set(c->err, PX_ENOMEM, "%s: out of memory", c->name);
        m->n_kvs = (size_t)i + 1;
        if (!strcmp(kv->key, "general.alignment")) {
            bool is_int = t == PX_GGUF_U32 || t == PX_GGUF_U64 || t == PX_GGUF_I32 ||
                          t == PX_GGUF_U16 || t == PX_GGUF_U8;
            uint64_t v = kv->v.u;
            if (!is_int || (t == PX_GGUF_I32 && kv->v.i < 0) || v == 0 ||
                v > PX__IR_MAX_ALIGNMENT || (v & (v - 1)))
                return px_err_set(c->err, PX_EPARSE,
                                  "%s: byte %" PRIu64 ": general.alignment (%s) must be a "
                                  "power of two between 1 and %u",
                                  c->name, kv->offset, kv->text, PX__IR_MAX_ALIGNMENT);
            *alignment = (uint32_t)v;
        }
    }
    return PX_OK;
}

typedef struct span {
    uint64_t offset, size;
    uint32_t id;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static px_status parse_tensor_info(px_ir_model *m, cur *c, uint64_t i)
{
    px_ir_tensor *t = &m->tensors[i];
    size_t at = c->off;
    const uint8_t *np = NULL;
    uint64_t nlen;
    px_status st = rd_str(c, 256, "tensor name", &np, &nlen);
    if (st != PX_OK)
        return px_err_prefix(c->err, st, "tensor %" PRIu64 ": ", i);
    if (nlen == 0 || memchr(np, 0, (size_t)nlen))
        return px_err_set(c->err, PX_EPARSE,
                          "%s: byte %zu: tensor %" PRIu64 ": the name is empty or holds a "
                          "NUL byte",
                          c->name, at, i);
    t->name = px_arena_strndup(m->arena, (const char *)np, (size_t)nlen);
    if (!t->name)
        return px_err_set(c->err, PX_ENOMEM, "%s: out of memory", c->name);
    if ((st = rd_u32(c, &t->n_dims, "tensor dimension count")) != PX_OK)
        return st;
    if (t->n_dims < 1 || t->n_dims > PX_IR_MAX_DIMS)
        return px_err_set(c->err, PX_EPARSE,
                          "%s: byte %zu: tensor \"%s\": %u dimensions; GGUF tensors have 1 "
                          "to %d",
                          c->name, c->off - 4, t->name, t->n_dims, PX_IR_MAX_DIMS);
    uint64_t n = 1;
    for (uint32_t d = 0; d < PX_IR_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((st = rd_u64(c, &t->ne[d], "tensor dimension")) != PX_OK)
            return st;
        if (t->ne[d] == 0 || __builtin_mul_overflow(n, t->ne[d], &n) || n > PX__IR_MAX_ELEMS)
            return px_err_set(c->err, PX_EPARSE,
                              "%s: byte %zu: tensor \"%s\": dimension %u is %" PRIu64
                              ", which is zero or makes the element count overflow",
                              c->name, c->off - 8, t->name, d, t->ne[d]);
    }
    t->n_elems = n;
    uint32_t ggml;
    if ((st = rd_u32(c, &ggml, "tensor type")) != PX_OK)
        return st;
    if (!px_dtype_from_ggml(ggml, &t->dtype))
        return px_err_set(c->err, PX_EUNSUPPORTED,
                          "%s: byte %zu: tensor \"%s\": unknown or unsupported type id %u", c->name,
                          c->off - 4, t->name, ggml);
    uint32_t be = px_dtype_block_elems(t->dtype);
    if (t->ne[0] % be)
        return px_err_set(c->err, PX_EPARSE,
                          "%s: tensor \"%s\": row length %" PRIu64 " is not a multiple of "
                          "%s's block of %u values",
                          c->name, t->name, t->ne[0], px_dtype_name(t->dtype), be);
    if (!px_dtype_nbytes(t->dtype, n, &t->n_bytes))
        return px_err_set(c->err, PX_EPARSE, "%s: tensor \"%s\": byte size overflows", c->name,
                          t->name);
    t->nb[0] = px_dtype_block_bytes(t->dtype);
    t->nb[1] = t->nb[0] * (t->ne[0] / be);
    for (int d = 2; d < PX_IR_MAX_DIMS; d++)
        t->nb[d] = t->nb[d - 1] * t->ne[d - 1];
    return rd_u64(c, &t->offset, "tensor offset");
}

static px_status place_tensors(px_ir_model *m, cur *c, uint32_t alignment)
{
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data_start = ((uint64_t)c->off + alignment - 1) / alignment * alignment;
    uint64_t data_size = data_start <= c->len ? c->len - data_start : 0;
    span *spans = NULL;
    if (m->n_tensors) {
        spans = calloc(m->n_tensors, sizeof *spans);
        if (!spans)
            return px_err_set(c->err, PX_ENOMEM, "%s: out of memory", c->name);
    }
    px_status st = PX_OK;
    for (size_t i = 0; i < m->n_tensors; i++) {
        px_ir_tensor *t = &m->tensors[i];
        if (t->offset % alignment) {
            st = px_err_set(c->err, PX_EPARSE,
                            "%s: tensor \"%s\": data offset %" PRIu64 " is not a multiple of "
                            "the alignment %u",
                            c->name, t->name, t->offset, alignment);
            goto done;
        }
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            st =
                px_err_set(c->err, PX_EPARSE,
                           "%s: tensor \"%s\": its %" PRIu64 " bytes at data offset %" PRIu64
                           " (file byte %" PRIu64 ") run past the end of the file (%zu "
                           "bytes); the file is truncated or the offset is wrong",
                           c->name, t->name, t->n_bytes, t->offset, data_start + t->offset, c->len);
            goto done;
        }
        t->offset += data_start;
        t->data = c->base + t->offset;
        spans[i] = (span){t->offset, t->n_bytes, (uint32_t)i};
    }
    if (m->n_tensors > 1)
        qsort(spans, m->n_tensors, sizeof *spans, span_cmp);
    for (size_t i = 1; i < m->n_tensors; i++) {
        const span *a = &spans[i - 1], *b = &spans[i];
        if (b->offset < a->offset + a->size) {
            st = px_err_set(c->err, PX_EPARSE,
                            "%s: tensors \"%s\" and \"%s\" overlap (file bytes %" PRIu64
                            "..%" PRIu64 " and %" PRIu64 "..); each tensor needs its own bytes",
                            c->name, m->tensors[a->id].name, m->tensors[b->id].name, a->offset,
                            a->offset + a->size, b->offset);
            goto done;
        }
    }
done:
    free(spans);
    return st;
}

/* ---- hyper-parameters from the metadata ---- */

static px_status meta_u32(px_ir_model *m, const char *key, bool required, uint32_t dflt,
                          uint32_t *out, px_err *err)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    if (!kv) {
        if (required)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: metadata key \"%s\" is missing; the architecture needs it",
                              m->path, key);
        *out = dflt;
        return PX_OK;
    }
    uint64_t v;
    if (!px_ir_model_meta_u64(m, key, &v) || kv->type == PX_GGUF_BOOL || v > UINT32_MAX)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: byte %" PRIu64 ": metadata \"%s\" is %s; expected a "
                          "non-negative integer below 2^32",
                          m->path, kv->offset, key, kv->text);
    *out = (uint32_t)v;
    return PX_OK;
}

static px_status meta_f32(px_ir_model *m, const char *key, float dflt, float *out, px_err *err)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    if (!kv) {
        *out = dflt;
        return PX_OK;
    }
    double v;
    if (!px_ir_model_meta_f64(m, key, &v) || kv->type == PX_GGUF_BOOL)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: byte %" PRIu64 ": metadata \"%s\" is %s; expected a number", m->path,
                          kv->offset, key, kv->text);
    *out = (float)v;
    return PX_OK;
}

static px_status read_hparams(px_ir_model *m, px_err *err)
{
    px_ir_hparams *hp = &m->hp;
    const char *arch;
    if (!px_ir_model_meta_str(m, "general.architecture", &arch))
        return px_err_set(err, PX_EVALIDATE,
                          "%s: metadata key \"general.architecture\" is missing or not a "
                          "string; GGUF models name their architecture there",
                          m->path);
    if (!strcmp(arch, "llama"))
        hp->arch = PX_IR_ARCH_LLAMA;
    else if (!strcmp(arch, "mistral"))
        hp->arch = PX_IR_ARCH_MISTRAL;
    else if (!strcmp(arch, "qwen2"))
        hp->arch = PX_IR_ARCH_QWEN2;
    else if (!strcmp(arch, "mixtral"))
        hp->arch = PX_IR_ARCH_MIXTRAL;
    else
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: architecture \"%.40s\" is not supported; supported: llama "
                          "(also Mistral and Mixtral files), mistral, qwen2",
                          m->path, arch);
    px_strlcpy(hp->arch_name, arch, sizeof hp->arch_name);
    const char *name;
    if (px_ir_model_meta_str(m, "general.name", &name))
        px_strlcpy(hp->name, name, sizeof hp->name);

    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", hp->arch_name, suffix), key)
    px_status st;
    if ((st = meta_u32(m, KEY("embedding_length"), true, 0, &hp->dim, err)) ||
        (st = meta_u32(m, KEY("feed_forward_length"), true, 0, &hp->hidden_dim, err)) ||
        (st = meta_u32(m, KEY("block_count"), true, 0, &hp->n_layers, err)) ||
        (st = meta_u32(m, KEY("attention.head_count"), true, 0, &hp->n_heads, err)) ||
        (st = meta_u32(m, KEY("attention.head_count_kv"), false, hp->n_heads, &hp->n_kv_heads,
                       err)) ||
        (st = meta_u32(m, KEY("context_length"), true, 0, &hp->context_length, err)) ||
        (st = meta_u32(m, KEY("expert_count"), false, 0, &hp->n_experts, err)) ||
        (st = meta_u32(m, KEY("expert_used_count"), false, 0, &hp->n_experts_used, err)) ||
        (st = meta_u32(m, KEY("attention.sliding_window"), false, 0, &hp->sliding_window, err)) ||
        (st = meta_f32(m, KEY("rope.freq_base"), 10000.0f, &hp->rope_theta, err)) ||
        (st = meta_f32(m, KEY("attention.layer_norm_rms_epsilon"), 1e-5f, &hp->rms_eps, err)))
        return st;
    uint32_t key_len = 0;
    if ((st = meta_u32(m, KEY("attention.key_length"), false, 0, &key_len, err)))
        return st;
    if (key_len)
        hp->head_dim = key_len;
    else if (hp->n_heads && hp->dim % hp->n_heads == 0)
        hp->head_dim = hp->dim / hp->n_heads;
    else
        return px_err_set(err, PX_EVALIDATE,
                          "%s: embedding width %u is not a multiple of the %u heads; set "
                          "%s.attention.key_length or fix the head count",
                          m->path, hp->dim, hp->n_heads, hp->arch_name);
    if ((st = meta_u32(m, KEY("rope.dimension_count"), false, hp->head_dim, &hp->rope_dim, err)))
        return st;
    /* The vocabulary: the explicit key, else the embedding's rows, else the
     * token list. */
    uint32_t vocab = 0;
    if ((st = meta_u32(m, KEY("vocab_size"), false, 0, &vocab, err)))
        return st;
#undef KEY
    if (!vocab) {
        const px_ir_tensor *emb = px_ir_model_find_tensor(m, "token_embd.weight");
        const px__gguf_kv *toks = px__ir_meta_find(m, "tokenizer.ggml.tokens");
        if (emb && emb->n_dims >= 2 && emb->ne[1] <= UINT32_MAX)
            vocab = (uint32_t)emb->ne[1];
        else if (toks && toks->type == PX_GGUF_ARRAY && toks->n <= UINT32_MAX)
            vocab = (uint32_t)toks->n;
    }
    hp->vocab_size = vocab;
    if (hp->n_experts > 0 && hp->arch == PX_IR_ARCH_LLAMA)
        hp->arch = PX_IR_ARCH_MIXTRAL;
    hp->rope_style = hp->arch == PX_IR_ARCH_QWEN2 ? PX_IR_ROPE_HALVES : PX_IR_ROPE_ADJACENT;
    return PX_OK;
}

px_status px__ir_gguf_parse(px_ir_model *m, const px_ir_open_opts *opts, px_err *err)
{
    (void)opts;
    cur c = {m->image, m->image_len, 0, m->path, err};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    px_status st;
    if ((st = need(&c, 4, "the GGUF magic")) != PX_OK)
        return st;
    magic = get_u32(c.base);
    if (magic != 0x46554747u)
        return px_err_set(err, PX_EPARSE,
                          "%s: byte 0: not a GGUF file (the magic is not "
                          "\"GGUF\")",
                          m->path);
    c.off = 4;
    if ((st = rd_u32(&c, &version, "the GGUF version")) != PX_OK)
        return st;
    if (version == 0x02000000u || version == 0x03000000u)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: byte 4: a big-endian GGUF file; plexus reads little-endian "
                          "files only (convert it with the little-endian default)",
                          m->path);
    if (version == 1)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: byte 4: GGUF version 1 is not supported (32-bit counts); "
                          "convert the file to version 3 with a current llama.cpp",
                          m->path);
    if (version != 2 && version != 3)
        return px_err_set(err, PX_EUNSUPPORTED,
                          "%s: byte 4: unknown GGUF version %u; versions 2 and 3 are read", m->path,
                          version);
    m->gguf_version = version;
    if ((st = rd_u64(&c, &n_tensors, "the tensor count")) != PX_OK ||
        (st = rd_u64(&c, &n_kv, "the metadata count")) != PX_OK)
        return st;
    if (n_tensors > PX__IR_MAX_TENSORS)
        return px_err_set(err, PX_ELIMIT,
                          "%s: byte 8: %" PRIu64 " tensors, more than the "
                          "limit of %u",
                          m->path, n_tensors, PX__IR_MAX_TENSORS);
    if (n_kv > PX__IR_MAX_KV)
        return px_err_set(err, PX_ELIMIT,
                          "%s: byte 16: %" PRIu64 " metadata pairs, more "
                          "than the limit of %u",
                          m->path, n_kv, PX__IR_MAX_KV);
    /* Each pair is at least a key length and a type (12 bytes); each tensor
     * info at least 8 + 4 + 8 + 4 + 8 bytes: counts larger than the file
     * can hold are refused before anything is allocated for them. */
    uint64_t left = c.len - c.off;
    if (n_kv > left / 12 || n_tensors > (left - n_kv * 12) / 32)
        return px_err_set(err, PX_EPARSE,
                          "%s: byte 8: %" PRIu64 " tensors and %" PRIu64 " metadata pairs "
                          "cannot fit in the %zu bytes of the file",
                          m->path, n_tensors, n_kv, c.len);
    uint32_t alignment = 32;
    if ((st = parse_kvs(m, &c, n_kv, &alignment)) != PX_OK)
        return st;
    m->n_tensors = (size_t)n_tensors;
    m->tensors = px_arena_calloc(m->arena, n_tensors ? n_tensors : 1, sizeof *m->tensors);
    if (!m->tensors)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((st = parse_tensor_info(m, &c, i)) != PX_OK)
            return st;
    if ((st = px__ir_index_tensors(m, err)) != PX_OK ||
        (st = place_tensors(m, &c, alignment)) != PX_OK || (st = read_hparams(m, err)) != PX_OK)
        return st;
    return px__ir_gguf_read_vocab(m, err);
}
