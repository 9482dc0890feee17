/* The GGUF reader on files built by hand in memory: a valid tiny model,
 * then one defect at a time.  Each must be refused with a message that
 * names the place and the problem, never read out of bounds. */
#include "px_test.h"

#include <string.h>

#include "plexus/ir.h"

/* ---- a GGUF builder for tests ---- */

enum { KV_U32, KV_I32, KV_F32, KV_STR, KV_RAW };

typedef struct kvspec {
    const char *key;
    int kind;
    uint64_t u;
    float f;
    const char *s;
    const uint8_t *raw; /* KV_RAW: type and value bytes as they go in the file */
    size_t raw_len;
} kvspec;

typedef struct tspec {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    int64_t offset; /* -1: next aligned offset */
} tspec;

typedef struct mspec {
    uint32_t version;
    int64_t n_tensors, n_kv; /* -1: the real counts */
    kvspec kvs[40];
    size_t n_kvs;
    tspec ts[40];
    size_t n_ts;
} mspec;

static void set_kv(mspec *s, kvspec kv)
{
    for (size_t i = 0; i < s->n_kvs; i++)
        if (!strcmp(s->kvs[i].key, kv.key)) {
            s->kvs[i] = kv;
            return;
        }
    s->kvs[s->n_kvs++] = kv;
}

static void drop_kv(mspec *s, const char *key)
{
    for (size_t i = 0; i < s->n_kvs; i++)
        if (!strcmp(s->kvs[i].key, key)) {
            memmove(&s->kvs[i], &s->kvs[i + 1], (s->n_kvs - i - 1) * sizeof *s->kvs);
            s->n_kvs--;
            return;
        }
}

static tspec *tensor(mspec *s, const char *name)
{
    for (size_t i = 0; i < s->n_ts; i++)
        if (!strcmp(s->ts[i].name, name))
            return &s->ts[i];
    fail_msg("no tensor %s in the spec", name);
    return NULL;
}

static void drop_tensor(mspec *s, const char *name)
{
    tspec *t = tensor(s, name);
    size_t i = (size_t)(t - s->ts);
    memmove(&s->ts[i], &s->ts[i + 1], (s->n_ts - i - 1) * sizeof *s->ts);
    s->n_ts--;
}

static void add_tensor(mspec *s, const char *name, uint32_t n_dims, uint64_t a, uint64_t b)
{
    s->ts[s->n_ts++] = (tspec){name, n_dims, {a, b, 1, 1, 1}, 0, -1};
}

/* A valid llama model: dim 8, hidden 16, 1 block, 2 heads of 4, 1 kv
 * head, vocab 4, f32, tied classifier. */
static void spec_default(mspec *s)
{
    memset(s, 0, sizeof *s);
    s->version = 3;
    s->n_tensors = s->n_kv = -1;
    set_kv(s, (kvspec){.key = "general.architecture", .kind = KV_STR, .s = "llama"});
    set_kv(s, (kvspec){.key = "llama.embedding_length", .kind = KV_U32, .u = 8});
    set_kv(s, (kvspec){.key = "llama.feed_forward_length", .kind = KV_U32, .u = 16});
    set_kv(s, (kvspec){.key = "llama.block_count", .kind = KV_U32, .u = 1});
    set_kv(s, (kvspec){.key = "llama.attention.head_count", .kind = KV_U32, .u = 2});
    set_kv(s, (kvspec){.key = "llama.attention.head_count_kv", .kind = KV_U32, .u = 1});
    set_kv(s, (kvspec){.key = "llama.context_length", .kind = KV_U32, .u = 32});
    set_kv(s,
           (kvspec){.key = "llama.attention.layer_norm_rms_epsilon", .kind = KV_F32, .f = 1e-5f});
    add_tensor(s, "token_embd.weight", 2, 8, 4);
    add_tensor(s, "output_norm.weight", 1, 8, 1);
    add_tensor(s, "blk.0.attn_norm.weight", 1, 8, 1);
    add_tensor(s, "blk.0.attn_q.weight", 2, 8, 8);
    add_tensor(s, "blk.0.attn_k.weight", 2, 8, 4);
    add_tensor(s, "blk.0.attn_v.weight", 2, 8, 4);
    add_tensor(s, "blk.0.attn_output.weight", 2, 8, 8);
    add_tensor(s, "blk.0.ffn_norm.weight", 1, 8, 1);
    add_tensor(s, "blk.0.ffn_gate.weight", 2, 8, 16);
    add_tensor(s, "blk.0.ffn_down.weight", 2, 16, 8);
    add_tensor(s, "blk.0.ffn_up.weight", 2, 8, 16);
}

static void put(px_strbuf *b, const void *p, size_t n)
{
    px_strbuf_add(b, p, n);
}
static void u32(px_strbuf *b, uint32_t v)
{
    put(b, &v, 4);
}
static void u64(px_strbuf *b, uint64_t v)
{
    put(b, &v, 8);
}
static void str(px_strbuf *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* Builds the file into exactly-sized malloc'd memory, so that AddressSanitizer
 * sees any read past its end. */
static uint8_t *build(const mspec *s, size_t *len)
{
    px_strbuf b = PX_STRBUF_INIT;
    put(&b, "GGUF", 4);
    u32(&b, s->version);
    u64(&b, s->n_tensors >= 0 ? (uint64_t)s->n_tensors : s->n_ts);
    u64(&b, s->n_kv >= 0 ? (uint64_t)s->n_kv : s->n_kvs);
    for (size_t i = 0; i < s->n_kvs; i++) {
        const kvspec *kv = &s->kvs[i];
        str(&b, kv->key);
        switch (kv->kind) {
        case KV_U32:
            u32(&b, 4);
            u32(&b, (uint32_t)kv->u);
            break;
        case KV_I32:
            u32(&b, 5);
            u32(&b, (uint32_t)kv->u);
            break;
        case KV_F32:
            u32(&b, 6);
            put(&b, &kv->f, 4);
            break;
        case KV_STR:
            u32(&b, 8);
            str(&b, kv->s);
            break;
        default:
            put(&b, kv->raw, kv->raw_len);
            break;
        }
    }
    uint64_t next = 0, ends[40];
    for (size_t i = 0; i < s->n_ts; i++) {
        const tspec *t = &s->ts[i];
        str(&b, t->name);
        u32(&b, t->n_dims);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < 5; d++) {
            u64(&b, t->ne[d]);
            n *= t->ne[d];
        }
        u32(&b, t->type);
        uint64_t off = t->offset >= 0 ? (uint64_t)t->offset : next;
        u64(&b, off);
        ends[i] = off + n * 4;
        if (t->offset < 0 && n < (1u << 20))
            next = (ends[i] + 31) / 32 * 32;
    }
    while (b.len % 32)
        px_strbuf_addch(&b, 0);
    for (uint64_t i = 0; i < next; i++)
        px_strbuf_addch(&b, (char)(i * 7));
    *len = b.len;
    uint8_t *out = malloc(b.len ? b.len : 1);
    memcpy(out, b.buf, b.len);
    px_strbuf_release(&b);
    return out;
}

static px_status open_spec(const mspec *s, px_ir_model **m, px_err *err)
{
    size_t len;
    uint8_t *img = build(s, &len);
    px_status st = px_ir_gguf_open_memory(img, len, "t.gguf", NULL, m, err);
    /* The model points into the image: check it, then free both. */
    if (st == PX_OK) {
        const px_ir_tensor *t = px_ir_model_find_tensor(*m, "blk.0.ffn_up.weight");
        if (t)
            assert_true((const uint8_t *)t->data + t->n_bytes <= img + len);
        px_ir_model_free(*m);
        *m = NULL;
    }
    free(img);
    return st;
}

static void expect_refused(const mspec *s, px_status code, const char *needle)
{
    px_ir_model *m = NULL;
    px_err err = {0};
    px_status st = open_spec(s, &m, &err);
    if (st != code)
        fail_msg("expected %s (\"%s\"), got %s: %s", px_status_name(code), needle,
                 px_status_name(st), err.msg);
    assert_null(m);
    px_assert_contains(err.msg, "t.gguf");
    px_assert_contains(err.msg, needle);
}

/* ---- tests ---- */

static void test_gguf_reads_valid_tiny_model(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    size_t len;
    uint8_t *img = build(&s, &len);
    px_ir_model *m;
    px_err err;
    px_assert_ok(px_ir_gguf_open_memory(img, len, "t.gguf", NULL, &m, &err), &err);
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    assert_int_equal(hp->dim, 8);
    assert_int_equal(hp->head_dim, 4);
    assert_int_equal(hp->vocab_size, 4); /* from token_embd, no key, no tokens */
    assert_true(hp->tied_classifier);
    assert_true(hp->rope_theta == 10000.0f);
    assert_null(px_ir_model_vocab(m));
    const px_ir_tensor *q = px_ir_model_weight(m, 0, PX_IR_ROLE_WQ);
    assert_string_equal(q->name, "blk.0.attn_q.weight");
    assert_int_equal(q->offset % 32, 0);
    assert_int_equal(q->n_bytes, 8 * 8 * 4);
    assert_int_equal(q->nb[1], 32);
    assert_ptr_equal(q->data, img + q->offset);
    assert_ptr_equal(px_ir_model_weight(m, 0, PX_IR_ROLE_OUTPUT),
                     px_ir_model_weight(m, 0, PX_IR_ROLE_TOKEN_EMBD));
    assert_null(px_ir_model_weight(m, 0, PX_IR_ROLE_BQ));
    assert_null(px_ir_model_weight(m, 1, PX_IR_ROLE_WQ));
    uint64_t u;
    assert_true(px_ir_model_meta_u64(m, "llama.block_count", &u));
    assert_int_equal(u, 1);
    assert_false(px_ir_model_meta_u64(m, "general.architecture", &u));
    const char *text;
    assert_true(px_ir_model_meta_str(m, "general.architecture", &text));
    assert_string_equal(text, "llama");
    px_ir_model_free(m);
    free(img);
}

static void test_gguf_refuses_every_truncation(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    size_t len;
    uint8_t *img = build(&s, &len);
    /* Every prefix of the file is refused, each from its own exactly-sized
     * copy so that an over-read is caught. */
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, img, n);
        px_ir_model *m = NULL;
        px_err err = {0};
        px_status st = px_ir_gguf_open_memory(cut, n, "t.gguf", NULL, &m, &err);
        if (st == PX_OK)
            fail_msg("a file cut to %zu of %zu bytes was accepted", n, len);
        assert_null(m);
        assert_true(err.msg[0] != '\0');
        free(cut);
    }
    free(img);
}

static void test_gguf_refuses_bad_headers(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    s.version = 1;
    expect_refused(&s, PX_EUNSUPPORTED, "version 1 is not supported");
    s.version = 0x03000000u;
    expect_refused(&s, PX_EUNSUPPORTED, "big-endian");
    s.version = 7;
    expect_refused(&s, PX_EUNSUPPORTED, "unknown GGUF version 7");
    spec_default(&s);
    s.n_tensors = 1000000;
    expect_refused(&s, PX_EPARSE, "cannot fit");
    spec_default(&s);
    s.n_tensors = (int64_t)1 << 40;
    expect_refused(&s, PX_ELIMIT, "tensors, more than the limit");
    spec_default(&s);
    s.n_kv = 1 << 20;
    expect_refused(&s, PX_ELIMIT, "metadata pairs, more than the limit");
    spec_default(&s);
    s.n_kv = 5000;
    expect_refused(&s, PX_EPARSE, "cannot fit");
    uint8_t not_gguf[8] = "GGUX";
    px_ir_model *m;
    px_err err;
    assert_int_equal(px_ir_gguf_open_memory(not_gguf, sizeof not_gguf, "t.gguf", NULL, &m, &err),
                     PX_EPARSE);
    px_assert_contains(err.msg, "not a GGUF file");
}

static void test_gguf_refuses_bad_metadata(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    /* A string whose length runs past the end of the file. */
    static const uint8_t long_str[] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0};
    set_kv(&s,
           (kvspec){
               .key = "general.name", .kind = KV_RAW, .raw = long_str, .raw_len = sizeof long_str});
    expect_refused(&s, PX_ELIMIT, "more than the limit");
    static const uint8_t long_str2[] = {8, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0};
    set_kv(&s, (kvspec){.key = "general.name",
                        .kind = KV_RAW,
                        .raw = long_str2,
                        .raw_len = sizeof long_str2});
    expect_refused(&s, PX_EPARSE, "metadata string needs 4096 bytes");

    spec_default(&s);
    s.kvs[s.n_kvs++] = (kvspec){.key = "llama.block_count", .kind = KV_U32, .u = 1};
    expect_refused(&s, PX_EPARSE, "\"llama.block_count\" appears twice");

    spec_default(&s);
    static const uint8_t bad_type[] = {13, 0, 0, 0, 1, 2, 3, 4};
    set_kv(&s, (kvspec){.key = "x.y", .kind = KV_RAW, .raw = bad_type, .raw_len = sizeof bad_type});
    expect_refused(&s, PX_EPARSE, "unknown value type 13");

    spec_default(&s);
    static const uint8_t bad_bool[] = {7, 0, 0, 0, 2};
    set_kv(&s, (kvspec){.key = "x.flag", .kind = KV_RAW, .raw = bad_bool, .raw_len = 5});
    expect_refused(&s, PX_EPARSE, "neither 0 nor 1");

    spec_default(&s);
    /* array<array<array<array<array<u8>>>>> nested five deep. */
    uint8_t nested[5 * 12 + 12];
    size_t o = 0;
    for (int i = 0; i < 5; i++) {
        uint32_t t = 9;
        memcpy(nested + o, &t, 4);
        if (i == 0) {
            o += 4; /* the value type of the pair */
            memcpy(nested + o, &t, 4);
        }
        o += 4;
        uint64_t one = 1;
        memcpy(nested + o, &one, 8);
        o += 8;
    }
    set_kv(&s, (kvspec){.key = "x.nested", .kind = KV_RAW, .raw = nested, .raw_len = o});
    expect_refused(&s, PX_ELIMIT, "nested deeper than");

    spec_default(&s);
    /* An array claiming more u32 elements than the file holds. */
    static const uint8_t big_arr[] = {9, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
    set_kv(&s, (kvspec){.key = "x.arr", .kind = KV_RAW, .raw = big_arr, .raw_len = sizeof big_arr});
    expect_refused(&s, PX_EPARSE, "array elements needs");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "general.alignment", .kind = KV_U32, .u = 48});
    expect_refused(&s, PX_EPARSE, "power of two");

    spec_default(&s);
    s.kvs[0].key = "";
    expect_refused(&s, PX_EPARSE, "key is empty");
}

static void test_gguf_refuses_bad_tensor_table(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    tensor(&s, "blk.0.attn_v.weight")->type = 99;
    expect_refused(&s, PX_EUNSUPPORTED,
                   "\"blk.0.attn_v.weight\": unknown or unsupported type id 99");

    spec_default(&s);
    tensor(&s, "blk.0.attn_v.weight")->n_dims = 5;
    expect_refused(&s, PX_EPARSE, "5 dimensions");

    spec_default(&s);
    tensor(&s, "blk.0.attn_v.weight")->ne[1] = 0;
    expect_refused(&s, PX_EPARSE, "dimension 1 is 0");

    spec_default(&s);
    tspec *t = tensor(&s, "blk.0.attn_v.weight");
    t->ne[0] = (uint64_t)1 << 40;
    t->ne[1] = (uint64_t)1 << 40;
    expect_refused(&s, PX_EPARSE, "overflow");

    spec_default(&s);
    tensor(&s, "blk.0.attn_v.weight")->type = 8; /* Q8_0 rows of 8: not a block */
    expect_refused(&s, PX_EPARSE, "not a multiple of q8_0's block of 32");

    /* The block formats the runtime runs: rows of 8 fill no block. */
    static const struct {
        uint32_t ggml;
        const char *msg;
    } blocks[] = {{2, "q4_0's block of 32"},   {6, "q5_0's block of 32"},
                  {10, "q2_k's block of 256"}, {11, "q3_k's block of 256"},
                  {12, "q4_k's block of 256"}, {13, "q5_k's block of 256"},
                  {14, "q6_k's block of 256"}};
    for (size_t i = 0; i < PX_ARRAY_LEN(blocks); i++) {
        spec_default(&s);
        tensor(&s, "blk.0.attn_v.weight")->type = blocks[i].ggml;
        expect_refused(&s, PX_EPARSE, blocks[i].msg);
    }

    spec_default(&s);
    s.ts[1].name = s.ts[0].name;
    expect_refused(&s, PX_EPARSE, "\"token_embd.weight\" is used twice");

    spec_default(&s);
    tensor(&s, "blk.0.ffn_up.weight")->offset = 4;
    expect_refused(&s, PX_EPARSE, "\"blk.0.ffn_up.weight\": data offset 4 is not a multiple");

    spec_default(&s);
    tensor(&s, "blk.0.ffn_up.weight")->offset = 1 << 20;
    expect_refused(&s, PX_EPARSE, "run past the end of the file");

    spec_default(&s);
    tensor(&s, "blk.0.ffn_up.weight")->offset = 0;
    expect_refused(&s, PX_EPARSE, "overlap");

    spec_default(&s);
    s.ts[0].name = "";
    expect_refused(&s, PX_EPARSE, "name is empty");
}

static void test_gguf_refuses_models_that_do_not_fit_their_hparams(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    drop_tensor(&s, "blk.0.attn_k.weight");
    expect_refused(&s, PX_EVALIDATE, "tensor \"blk.0.attn_k.weight\" is missing");

    spec_default(&s);
    tensor(&s, "blk.0.attn_q.weight")->ne[1] = 7;
    expect_refused(&s, PX_EVALIDATE, "\"blk.0.attn_q.weight\" has shape [8 x 7]");

    spec_default(&s);
    add_tensor(&s, "blk.5.attn_q.weight", 2, 8, 8);
    expect_refused(&s, PX_EVALIDATE, "belongs to block 5 but the model declares 1 blocks");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.attention.head_count", .kind = KV_U32, .u = 0});
    expect_refused(&s, PX_EVALIDATE, "head");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.attention.head_count", .kind = KV_U32, .u = 3});
    expect_refused(&s, PX_EVALIDATE, "not a multiple of the 3 heads");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.attention.head_count_kv", .kind = KV_U32, .u = 3});
    expect_refused(&s, PX_EVALIDATE, "do not divide");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.block_count", .kind = KV_U32, .u = 100000});
    expect_refused(&s, PX_EVALIDATE, "block count 100000 is outside");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.context_length", .kind = KV_U32, .u = 0});
    expect_refused(&s, PX_EVALIDATE, "context length 0");

    spec_default(&s);
    set_kv(&s,
           (kvspec){.key = "llama.attention.layer_norm_rms_epsilon", .kind = KV_F32, .f = -1.0f});
    expect_refused(&s, PX_EVALIDATE, "epsilon");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.rope.freq_base", .kind = KV_F32, .f = 0.0f});
    expect_refused(&s, PX_EVALIDATE, "rope frequency base");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.block_count", .kind = KV_STR, .s = "one"});
    expect_refused(&s, PX_EVALIDATE, "\"llama.block_count\" is string \"one\"");

    spec_default(&s);
    drop_kv(&s, "llama.embedding_length");
    expect_refused(&s, PX_EVALIDATE, "\"llama.embedding_length\" is missing");

    spec_default(&s);
    drop_kv(&s, "general.architecture");
    expect_refused(&s, PX_EVALIDATE, "general.architecture");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "general.architecture", .kind = KV_STR, .s = "gpt9"});
    expect_refused(&s, PX_EUNSUPPORTED, "\"gpt9\" is not supported");

    spec_default(&s);
    set_kv(&s, (kvspec){.key = "llama.expert_count", .kind = KV_U32, .u = 4});
    set_kv(&s, (kvspec){.key = "llama.expert_used_count", .kind = KV_U32, .u = 5});
    expect_refused(&s, PX_EVALIDATE, "4 experts with 5 used");
}

static void test_gguf_refuses_inconsistent_vocabulary(void **state)
{
    (void)state;
    mspec s;
    spec_default(&s);
    /* Five tokens for an embedding of four rows. */
    uint8_t toks[4 + 4 + 8 + 5 * 9];
    size_t o = 0;
    uint32_t t = 9, et = 8;
    uint64_t n = 5;
    memcpy(toks + o, &t, 4), o += 4;
    memcpy(toks + o, &et, 4), o += 4;
    memcpy(toks + o, &n, 8), o += 8;
    for (int i = 0; i < 5; i++) {
        uint64_t one = 1;
        memcpy(toks + o, &one, 8), o += 8;
        toks[o++] = (uint8_t)('a' + i);
    }
    set_kv(&s, (kvspec){.key = "tokenizer.ggml.tokens", .kind = KV_RAW, .raw = toks, .raw_len = o});
    expect_refused(&s, PX_EVALIDATE, "the tokenizer has 5 tokens but the embedding has only 4");

    /* Four tokens fit; a BOS id past them does not. */
    n = 4;
    memcpy(toks + 8, &n, 8);
    set_kv(&s,
           (kvspec){.key = "tokenizer.ggml.tokens", .kind = KV_RAW, .raw = toks, .raw_len = o - 9});
    set_kv(&s, (kvspec){.key = "tokenizer.ggml.bos_token_id", .kind = KV_U32, .u = 9});
    expect_refused(&s, PX_EVALIDATE, "\"tokenizer.ggml.bos_token_id\" is 9");

    set_kv(&s, (kvspec){.key = "tokenizer.ggml.bos_token_id", .kind = KV_U32, .u = 1});
    set_kv(&s, (kvspec){.key = "tokenizer.ggml.scores", .kind = KV_U32, .u = 1});
    expect_refused(&s, PX_EVALIDATE, "tokenizer.ggml.scores");

    drop_kv(&s, "tokenizer.ggml.scores");
    px_ir_model *m;
    px_err err;
    size_t len;
    uint8_t *img = build(&s, &len);
    px_assert_ok(px_ir_gguf_open_memory(img, len, "t.gguf", NULL, &m, &err), &err);
    const px_ir_vocab *v = px_ir_model_vocab(m);
    assert_non_null(v);
    assert_int_equal(v->n_tokens, 4);
    assert_string_equal(v->text[3], "d");
    assert_int_equal(v->bos_id, 1);
    assert_int_equal(v->eos_id, -1);
    px_ir_model_free(m);
    free(img);
}

static void test_llama2c_refuses_wrong_sizes(void **state)
{
    (void)state;
    const char *dir = px_test_tmpdir();
    char *path = px_asprintf("%s/m.bin", dir);
    /* A valid legacy checkpoint: dim 8, hidden 16, 1 layer, 2 heads, 2 kv
     * heads, vocab 4 shared, seq_len 4. */
    int32_t hdr[7] = {8, 16, 1, 2, 2, 4, 4};
    size_t floats = 4 * 8 + 8 + 8 * 8 * 4 + 8 + 3 * 8 * 16 + 8 + 4 * 2 * 2;
    size_t len = 28 + 4 * floats;
    uint8_t *buf = calloc(1, len + 4);
    memcpy(buf, hdr, sizeof hdr);
    px_err err;
    px_ir_model *m;
    px_assert_ok(px_write_file(path, buf, len, &err), &err);
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    assert_true(px_ir_model_hparams(m)->tied_classifier);
    assert_int_equal(px_ir_model_n_tensors(m), 2 + 9);
    px_ir_model_free(m);

    px_assert_ok(px_write_file(path, buf, len + 4, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    px_assert_contains(err.msg, "implies");
    px_assert_ok(px_write_file(path, buf, len - 1, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    hdr[3] = 0;
    memcpy(buf, hdr, sizeof hdr);
    px_assert_ok(px_write_file(path, buf, len, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    px_assert_contains(err.msg, "n_heads is 0");
    hdr[3] = 2;
    hdr[0] = 1 << 30;
    memcpy(buf, hdr, sizeof hdr);
    px_assert_ok(px_write_file(path, buf, len, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "embedding width");
    px_assert_ok(px_write_file(path, buf, 3, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    px_assert_ok(px_write_file(path, buf, 0, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    px_assert_contains(err.msg, "empty");
    /* Version 1 ("ak42"): 256-byte header, norms first, no freq_cis, and
     * an explicit shared-classifier flag (0 here: wcls follows). */
    size_t floats1 = 3 * 8 + 4 * 8 + 8 * 8 * 4 + 3 * 8 * 16 + 4 * 8;
    size_t len1 = 256 + 4 * floats1;
    uint8_t *v1 = calloc(1, len1);
    uint32_t magic = 0x616b3432;
    int32_t version = 1, hdr1[7] = {8, 16, 1, 2, 2, 4, 4};
    memcpy(v1, &magic, 4);
    memcpy(v1 + 4, &version, 4);
    memcpy(v1 + 8, hdr1, sizeof hdr1);
    float *f = (float *)(v1 + 256);
    for (size_t i = 0; i < floats1; i++)
        f[i] = (float)i;
    px_assert_ok(px_write_file(path, v1, len1, &err), &err);
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    assert_false(px_ir_model_hparams(m)->tied_classifier);
    /* Order: attention norms, FFN norms, final norm, embedding, ... */
    const float *ffn_norm = px_ir_model_weight(m, 0, PX_IR_ROLE_FFN_NORM)->data;
    const float *emb = px_ir_model_weight(m, 0, PX_IR_ROLE_TOKEN_EMBD)->data;
    const float *cls = px_ir_model_weight(m, 0, PX_IR_ROLE_OUTPUT)->data;
    assert_true(ffn_norm[0] == 8.0f);
    assert_true(emb[0] == 24.0f);
    assert_true(cls[0] == (float)(floats1 - 32));
    px_ir_model_free(m);
    v1[36] = 2; /* the flag must be 0 or 1 */
    px_assert_ok(px_write_file(path, v1, len1, &err), &err);
    assert_int_equal(px_ir_model_open(path, NULL, &m, &err), PX_EPARSE);
    px_assert_contains(err.msg, "shared_classifier flag 2");
    free(v1);

    char *missing = px_asprintf("%s/none.gguf", dir);
    assert_int_equal(px_ir_model_open(missing, NULL, &m, &err), PX_ENOTFOUND);
    free(missing);
    free(buf);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_reads_valid_tiny_model),
        cmocka_unit_test(test_gguf_refuses_every_truncation),
        cmocka_unit_test(test_gguf_refuses_bad_headers),
        cmocka_unit_test(test_gguf_refuses_bad_metadata),
        cmocka_unit_test(test_gguf_refuses_bad_tensor_table),
        cmocka_unit_test(test_gguf_refuses_models_that_do_not_fit_their_hparams),
        cmocka_unit_test(test_gguf_refuses_inconsistent_vocabulary),
        cmocka_unit_test(test_llama2c_refuses_wrong_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
