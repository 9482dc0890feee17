/* Tokenizer vocabularies: GGUF tokenizer.ggml.* keys and llama2.c files. */
#include "ir/ir_impl.h"

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static float lef32(const uint8_t *p)
{
    uint32_t u = le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Arrays of strings were bounds-checked by the parser; this walks one
 * again, copying each string NUL-terminated into the arena. */
static px_status copy_strings(px_ir_model *m, const px__gguf_kv *kv, const char ***out,
                              uint32_t **lens, uint32_t *max_len, px_err *err)
{
    const char **text = px_arena_calloc(m->arena, kv->n ? kv->n : 1, sizeof *text);
    uint32_t *len = lens ? px_arena_calloc(m->arena, kv->n ? kv->n : 1, sizeof *len) : NULL;
    if (!text || (lens && !len))
        return px_err_set(err, PX_ENOMEM, "%s: out of memory reading \"%s\"", m->path, kv->key);
    const uint8_t *p = kv->arr;
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t n = le64(p);
        if (n > PX__IR_MAX_TOKEN_LEN)
            return px_err_set(err, PX_ELIMIT,
                              "%s: \"%s\"[%" PRIu64 "] is %" PRIu64 " bytes long, more than "
                              "the limit of %u",
                              m->path, kv->key, i, n, PX__IR_MAX_TOKEN_LEN);
        text[i] = px_arena_strndup(m->arena, (const char *)p + 8, (size_t)n);
        if (!text[i])
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
        if (len)
            len[i] = (uint32_t)n;
        if (max_len && n > *max_len)
            *max_len = (uint32_t)n;
        p += 8 + n;
    }
    *out = text;
    if (lens)
        *lens = len;
    return PX_OK;
}

static px_status token_id(px_ir_model *m, const char *key, int32_t *out, px_err *err)
{
    const px__gguf_kv *kv = px__ir_meta_find(m, key);
    uint64_t v;
    if (!kv)
        return PX_OK;
    if (!px_ir_model_meta_u64(m, key, &v))
        return px_err_set(err, PX_EVALIDATE, "%s: metadata \"%s\" is %s; expected a token id",
                          m->path, key, kv->text);
    if (v == UINT32_MAX || v == UINT64_MAX)
        return PX_OK; /* "none" */
    if (v >= m->vocab.n_tokens)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: metadata \"%s\" is %" PRIu64 " but the vocabulary has only %u "
                          "tokens",
                          m->path, key, v, m->vocab.n_tokens);
    *out = (int32_t)v;
    return PX_OK;
}

px_status px__ir_gguf_read_vocab(px_ir_model *m, px_err *err)
{
    const px__gguf_kv *toks = px__ir_meta_find(m, "tokenizer.ggml.tokens");
    if (!toks)
        return PX_OK;
    if (toks->type != PX_GGUF_ARRAY || toks->elem_type != PX_GGUF_STRING)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: \"tokenizer.ggml.tokens\" is %s; expected an array of strings",
                          m->path, toks->text);
    if (toks->n == 0 || toks->n > PX__IR_MAX_VOCAB)
        return px_err_set(err, PX_ELIMIT,
                          "%s: \"tokenizer.ggml.tokens\" has %" PRIu64 " tokens; expected 1 "
                          "to %u",
                          m->path, toks->n, PX__IR_MAX_VOCAB);
    px_ir_vocab *v = &m->vocab;
    uint32_t n = (uint32_t)toks->n;
    v->n_tokens = n;
    uint32_t *lens;
    const char **text;
    px_status st = copy_strings(m, toks, &text, &lens, &v->max_token_len, err);
    if (st != PX_OK)
        return st;
    v->text = text;
    v->len = lens;
    float *scores = px_arena_calloc(m->arena, n, sizeof *scores);
    uint8_t *types = px_arena_alloc(m->arena, n);
    if (!scores || !types)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", m->path);
    memset(types, PX_TOKEN_NORMAL, n);
    const px__gguf_kv *kv = px__ir_meta_find(m, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != PX_GGUF_ARRAY || kv->elem_type != PX_GGUF_F32 || kv->n != n)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: \"tokenizer.ggml.scores\" is %s; expected array<f32>[%u], "
                              "one score per token",
                              m->path, kv->text, n);
        for (uint32_t i = 0; i < n; i++)
            scores[i] = lef32(kv->arr + 4 * (size_t)i);
    }
    kv = px__ir_meta_find(m, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != PX_GGUF_ARRAY ||
            (kv->elem_type != PX_GGUF_I32 && kv->elem_type != PX_GGUF_U32) || kv->n != n)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: \"tokenizer.ggml.token_type\" is %s; expected "
                              "array<i32>[%u], one type per token",
                              m->path, kv->text, n);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t t = le32(kv->arr + 4 * (size_t)i);
            if (t > PX_TOKEN_BYTE)
                return px_err_set(err, PX_EVALIDATE,
                                  "%s: \"tokenizer.ggml.token_type\"[%u] is %u; token types "
                                  "are 0 to 6",
                                  m->path, i, t);
            types[i] = (uint8_t)t;
        }
    }
    v->scores = scores;
    v->types = types;
    const char *model;
    px_strlcpy(v->model, px_ir_model_meta_str(m, "tokenizer.ggml.model", &model) ? model : "",
               sizeof v->model);
    kv = px__ir_meta_find(m, "tokenizer.ggml.merges");
    if (kv) {
        if (kv->type != PX_GGUF_ARRAY || kv->elem_type != PX_GGUF_STRING)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: \"tokenizer.ggml.merges\" is %s; expected an array of "
                              "strings",
                              m->path, kv->text);
        const char **merges;
        if ((st = copy_strings(m, kv, &merges, NULL, NULL, err)) != PX_OK)
            return st;
        v->merges = merges;
        v->n_merges = (uint32_t)kv->n;
    }
    if ((st = token_id(m, "tokenizer.ggml.bos_token_id", &v->bos_id, err)) ||
        (st = token_id(m, "tokenizer.ggml.eos_token_id", &v->eos_id, err)) ||
        (st = token_id(m, "tokenizer.ggml.unknown_token_id", &v->unk_id, err)) ||
        (st = token_id(m, "tokenizer.ggml.padding_token_id", &v->pad_id, err)))
        return st;
    m->has_vocab = true;
    return PX_OK;
}

static bool is_byte_token(const char *s, uint32_t len)
{
    return len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

px_status px_ir_vocab_read_llama2c(const char *path, uint32_t n_tokens, px_arena *arena,
                                   px_ir_vocab *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (n_tokens == 0 || n_tokens > PX__IR_MAX_VOCAB)
        return px_err_set(err, PX_ELIMIT, "%s: a vocabulary of %u tokens; expected 1 to %u", path,
                          n_tokens, PX__IR_MAX_VOCAB);
    char *buf;
    size_t len;
    /* Each token takes at least 8 bytes plus its text of at most 64 KiB. */
    size_t max = 4 + (size_t)n_tokens * (8 + PX__IR_MAX_TOKEN_LEN);
    px_status st = px_read_file(path, max, &buf, &len, err);
    if (st != PX_OK)
        return st;
    const uint8_t *p = (const uint8_t *)buf;
    const char **text = px_arena_calloc(arena, n_tokens, sizeof *text);
    uint32_t *lens = px_arena_calloc(arena, n_tokens, sizeof *lens);
    float *scores = px_arena_calloc(arena, n_tokens, sizeof *scores);
    uint8_t *types = px_arena_alloc(arena, n_tokens);
    if (!text || !lens || !scores || !types) {
        st = px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    if (len < 4) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: byte 0: the file is %zu bytes; a llama2.c "
                        "tokenizer starts with a 4-byte max_token_length",
                        path, len);
        goto done;
    }
    uint32_t max_len = le32(p);
    if (max_len == 0 || max_len > PX__IR_MAX_TOKEN_LEN || (int32_t)max_len < 0) {
        st = px_err_set(err, PX_EPARSE, "%s: byte 0: max_token_length %d is not in 1..%u", path,
                        (int32_t)max_len, PX__IR_MAX_TOKEN_LEN);
        goto done;
    }
    size_t off = 4;
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (len - off < 8) {
            st = px_err_set(err, PX_EPARSE,
                            "%s: byte %zu: token %u of %u is cut off (score and length need 8 "
                            "bytes); the file is truncated or the vocabulary size is wrong",
                            path, off, i, n_tokens);
            goto done;
        }
        scores[i] = lef32(p + off);
        int32_t n = (int32_t)le32(p + off + 4);
        if (n < 0 || (uint32_t)n > max_len || (size_t)n > len - off - 8) {
            st = px_err_set(err, PX_EPARSE,
                            "%s: byte %zu: token %u has length %d, outside 0..%u or past the "
                            "end of the file",
                            path, off + 4, i, n, max_len);
            goto done;
        }
        off += 8;
        text[i] = px_arena_strndup(arena, (const char *)p + off, (size_t)n);
        if (!text[i]) {
            st = px_err_set(err, PX_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        lens[i] = (uint32_t)n;
        types[i] = i == 0                            ? PX_TOKEN_UNKNOWN
                   : (i == 1 || i == 2)              ? PX_TOKEN_CONTROL
                   : is_byte_token(text[i], lens[i]) ? PX_TOKEN_BYTE
                                                     : PX_TOKEN_NORMAL;
        off += (size_t)n;
    }
    if (off != len) {
        st = px_err_set(err, PX_EPARSE,
                        "%s: byte %zu: %zu bytes follow the last of %u tokens; the vocabulary "
                        "size does not match this tokenizer",
                        path, off, len - off, n_tokens);
        goto done;
    }
    out->n_tokens = n_tokens;
    out->text = text;
    out->len = lens;
    out->scores = scores;
    out->types = types;
    out->max_token_len = max_len;
    out->unk_id = 0;
    out->bos_id = n_tokens > 1 ? 1 : -1;
    out->eos_id = n_tokens > 2 ? 2 : -1;
    out->pad_id = -1;
    px_strlcpy(out->model, "llama", sizeof out->model);
done:
    free(buf);
    return st;
}
