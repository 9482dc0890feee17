/* Special tokens in the tokenizer: with PX_RT_ENCODE_SPECIAL the texts of
 * control and user-defined tokens become their ids (as llama.cpp's
 * parse_special does), without it nothing changes; lookups by text; control
 * tokens hidden from decoded text but shown by token_text.  The vocabulary
 * is written to a GGUF file and read back, so the token types travel the
 * same path as a real model's. */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"

/* ------------------------------------------------------------------ */
/* A vocabulary with special tokens, in a GGUF file                    */
/* ------------------------------------------------------------------ */

enum {
    ID_UNK = 0,
    ID_BOS = 1,
    ID_EOS = 2,
    ID_BYTE0 = 3, /* <0x00> .. <0xFF> are 3 .. 258 */
    ID_IM_START = 259,
    ID_IM_END = 260,
    ID_INST = 261,          /* user-defined */
    ID_IM = 262,            /* "<|im": an ordinary token, never special */
    ID_IM_START_ASST = 263, /* "<|im_start|>assistant": user-defined, longer */
    ID_EOT_NORMAL = 264,    /* "<|eot|>" as an ordinary token ... */
    ID_EOT_CONTROL = 265,   /* ... and as a control token */
    ID_SPACE = 266,         /* U+2581 */
    ID_FIRST_MERGE = 267,
};

/* Ordinary tokens after the specials: single letters, then merges. */
static const char *const merges[] = {
    "a",
    "e",
    "h",
    "l",
    "o",
    "r",
    "s",
    "t",
    "u",
    "H",
    "\n",
    "\xe2\x96\x81H",
    "el",
    "lo",
    "llo",
    "\xe2\x96\x81Hello",
    "us",
    "er",
    "\xe2\x96\x81us",
    "\xe2\x96\x81user",
    "<",
    "|",
    "i",
    "m",
    "<|",
    "<|i",
};

typedef struct vocab_file {
    char *text[400];
    int32_t types[400];
    float scores[400];
    uint32_t n;
} vocab_file;

static void add(vocab_file *f, const char *s, int32_t type, float score)
{
    f->text[f->n] = px_strdup(s);
    f->types[f->n] = type;
    f->scores[f->n] = score;
    f->n++;
}

static void build(vocab_file *f)
{
    memset(f, 0, sizeof *f);
    add(f, "<unk>", PX_TOKEN_UNKNOWN, 0);
    add(f, "<s>", PX_TOKEN_CONTROL, 0);
    add(f, "</s>", PX_TOKEN_CONTROL, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        add(f, s, PX_TOKEN_BYTE, 0);
    }
    add(f, "<|im_start|>", PX_TOKEN_CONTROL, 0);
    add(f, "<|im_end|>", PX_TOKEN_CONTROL, 0);
    add(f, "[INST]", PX_TOKEN_USER_DEFINED, 0);
    add(f, "<|im", PX_TOKEN_NORMAL, -1);
    add(f, "<|im_start|>assistant", PX_TOKEN_USER_DEFINED, 0);
    add(f, "<|eot|>", PX_TOKEN_NORMAL, -1e12f);
    add(f, "<|eot|>", PX_TOKEN_CONTROL, 0);
    add(f, "\xe2\x96\x81", PX_TOKEN_NORMAL, -1);
    for (size_t i = 0; i < PX_ARRAY_LEN(merges); i++)
        add(f, merges[i], PX_TOKEN_NORMAL, -(float)(i + 2));
}

static void release(vocab_file *f)
{
    for (uint32_t i = 0; i < f->n; i++)
        free(f->text[i]);
}

/* Writes a one-block llama model of zeros (dim 8) carrying the
 * vocabulary, so that px_ir_model_open reads it as it reads any GGUF. */
static char *write_model(const vocab_file *f, const char *name)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_err err;
    px_ir_gguf_writer *w;
    px_assert_ok(px_ir_gguf_writer_new(path, &w, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str(w, "general.architecture", "llama", &err), &err);
    static const struct {
        const char *key;
        uint32_t v;
    } hp[] = {{"llama.embedding_length", 8},
              {"llama.feed_forward_length", 16},
              {"llama.block_count", 1},
              {"llama.attention.head_count", 2},
              {"llama.attention.head_count_kv", 1},
              {"llama.context_length", 32}};
    for (size_t i = 0; i < PX_ARRAY_LEN(hp); i++)
        px_assert_ok(px_ir_gguf_writer_add_u32(w, hp[i].key, hp[i].v, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens",
                                                 (const char *const *)f->text, NULL, f->n, &err),
                 &err);
    px_assert_ok(
        px_ir_gguf_writer_add_array(w, "tokenizer.ggml.scores", PX_GGUF_F32, f->scores, f->n, &err),
        &err);
    px_assert_ok(px_ir_gguf_writer_add_array(w, "tokenizer.ggml.token_type", PX_GGUF_I32, f->types,
                                             f->n, &err),
                 &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", ID_UNK, &err),
                 &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", ID_BOS, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", ID_EOS, &err), &err);
    const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
    } ts[] = {
        {"token_embd.weight", 2, {8, f->n}},     {"output_norm.weight", 1, {8, 1}},
        {"blk.0.attn_norm.weight", 1, {8, 1}},   {"blk.0.attn_q.weight", 2, {8, 8}},
        {"blk.0.attn_k.weight", 2, {8, 4}},      {"blk.0.attn_v.weight", 2, {8, 4}},
        {"blk.0.attn_output.weight", 2, {8, 8}}, {"blk.0.ffn_norm.weight", 1, {8, 1}},
        {"blk.0.ffn_gate.weight", 2, {8, 16}},   {"blk.0.ffn_down.weight", 2, {16, 8}},
        {"blk.0.ffn_up.weight", 2, {8, 16}},
    };
    size_t bytes = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++) {
        px_assert_ok(
            px_ir_gguf_writer_add_tensor(w, ts[i].name, PX_DTYPE_F32, ts[i].n_dims, ts[i].ne, &err),
            &err);
        bytes += 4 * ts[i].ne[0] * (ts[i].n_dims > 1 ? ts[i].ne[1] : 1);
    }
    px_assert_ok(px_ir_gguf_writer_begin_data(w, &err), &err);
    char *zeros = calloc(1, bytes);
    assert_non_null(zeros);
    px_assert_ok(px_ir_gguf_writer_write(w, zeros, bytes, &err), &err);
    free(zeros);
    px_assert_ok(px_ir_gguf_writer_finish(w, &err), &err);
    return path;
}

typedef struct fixture {
    vocab_file f;
    px_ir_model *model;
    px_rt_tokenizer *t;
} fixture;

static int setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    build(&fx->f);
    char *path = write_model(&fx->f, "special.gguf");
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &fx->model, &err), &err);
    free(path);
    const px_ir_vocab *v = px_ir_model_vocab(fx->model);
    assert_non_null(v);
    assert_int_equal(v->types[ID_IM_END], PX_TOKEN_CONTROL);
    px_assert_ok(px_rt_tokenizer_new(v, &fx->t, &err), &err);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    px_rt_tokenizer_free(fx->t);
    px_ir_model_free(fx->model);
    release(&fx->f);
    free(fx);
    return 0;
}

static size_t encode(const px_rt_tokenizer *t, const char *text, unsigned flags, int32_t *ids,
                     size_t cap)
{
    size_t n;
    px_err err;
    px_assert_ok(px_rt_tokenizer_encode(t, text, strlen(text), flags, ids, cap, &n, &err), &err);
    return n;
}

static size_t count(const int32_t *ids, size_t n, int32_t id)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ids[i] == id;
    return k;
}

static void assert_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want)
{
    px_strbuf a = PX_STRBUF_INIT, b = PX_STRBUF_INIT;
    for (size_t i = 0; i < n_got; i++)
        px_strbuf_addf(&a, " %d", got[i]);
    for (size_t i = 0; i < n_want; i++)
        px_strbuf_addf(&b, " %d", want[i]);
    if (strcmp(a.buf, b.buf))
        fail_msg("ids:%s\nwant:%s", a.buf, b.buf);
    px_strbuf_release(&a);
    px_strbuf_release(&b);
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static int32_t tok(const fixture *fx, const char *text)
{
    int32_t id = px_rt_tokenizer_find(fx->t, text, strlen(text));
    if (id < 0)
        fail_msg("no token \"%s\"", text);
    return id;
}

static void test_special_texts_become_single_ids(void **state)
{
    fixture *fx = *state;
    int32_t ids[64];
    size_t n = encode(fx->t, "<|im_start|>user\nHello<|im_end|>\n",
                      PX_RT_ENCODE_BOS | PX_RT_ENCODE_SPECIAL, ids, 64);
    /* Each ordinary piece gets its own dummy prefix: " user\nHello" and
     * " \n", as llama.cpp tokenizes a rendered chatml prompt. */
    int32_t want[] = {ID_BOS,        ID_IM_START,  tok(fx, "\xe2\x96\x81user"),
                      tok(fx, "\n"), tok(fx, "H"), tok(fx, "el"),
                      tok(fx, "lo"), ID_IM_END,    ID_SPACE,
                      tok(fx, "\n")};
    assert_ids(ids, n, want, PX_ARRAY_LEN(want));
}

static void test_without_the_flag_special_texts_stay_ordinary_text(void **state)
{
    fixture *fx = *state;
    int32_t ids[128];
    const char *text = "<|im_start|>user [INST] <|eot|></s>";
    size_t n = encode(fx->t, text, PX_RT_ENCODE_BOS, ids, 128);
    assert_int_equal(count(ids, n, ID_IM_START), 0);
    assert_int_equal(count(ids, n, ID_INST), 0);
    assert_int_equal(count(ids, n, ID_EOT_CONTROL), 0);
    assert_int_equal(count(ids, n, ID_EOS), 0);
    /* ... and decode back to the same text. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_err err;
    for (size_t i = 1; i < n; i++) {
        const char *piece;
        size_t len;
        px_assert_ok(px_rt_tokenizer_decode(fx->t, ids[i - 1], ids[i], &piece, &len, &err), &err);
        px_strbuf_add(&sb, piece, len);
    }
    assert_string_equal(sb.buf, text);
    px_strbuf_release(&sb);
}

static void test_user_defined_and_longest_match(void **state)
{
    fixture *fx = *state;
    int32_t ids[64];
    /* "<|im_start|>assistant" is one user-defined token, longer than the
     * control token "<|im_start|>" at the same place. */
    size_t n =
        encode(fx->t, "[INST]<|im_start|>assistant<|im_start|>", PX_RT_ENCODE_SPECIAL, ids, 64);
    int32_t want[] = {ID_INST, ID_IM_START_ASST, ID_IM_START};
    assert_ids(ids, n, want, PX_ARRAY_LEN(want));
    /* An unfinished special text and an ordinary token's text stay
     * ordinary: "<|im" is a normal token, "<|im_end" matches nothing. */
    n = encode(fx->t, "<|im_end", PX_RT_ENCODE_SPECIAL, ids, 64);
    assert_int_equal(count(ids, n, ID_IM_END), 0);
    assert_int_equal(count(ids, n, ID_IM), 1);
    /* Of two tokens with the text "<|eot|>", the control one is meant. */
    n = encode(fx->t, "<|eot|>", PX_RT_ENCODE_SPECIAL, ids, 64);
    int32_t want_eot[] = {ID_EOT_CONTROL};
    assert_ids(ids, n, want_eot, 1);
}

static void test_find_prefers_special_tokens(void **state)
{
    fixture *fx = *state;
    assert_int_equal(px_rt_tokenizer_find(fx->t, "<|im_end|>", 10), ID_IM_END);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "</s>", 4), ID_EOS);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "[INST]", 6), ID_INST);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "<|eot|>", 7), ID_EOT_CONTROL);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "<|im", 4), ID_IM);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "<|eot_id|>", 10), -1);
    assert_int_equal(px_rt_tokenizer_find(fx->t, "", 0), -1);
    assert_int_equal(px_rt_tokenizer_find(fx->t, NULL, 3), -1);
}

static void test_control_tokens_decode_to_nothing_but_show_their_text(void **state)
{
    fixture *fx = *state;
    px_err err;
    const char *piece;
    size_t len;
    px_assert_ok(px_rt_tokenizer_decode(fx->t, 100, ID_IM_END, &piece, &len, &err), &err);
    assert_int_equal(len, 0);
    px_assert_ok(px_rt_tokenizer_token_text(fx->t, ID_IM_END, &piece, &len, &err), &err);
    assert_int_equal(len, 10);
    assert_memory_equal(piece, "<|im_end|>", 10);
    /* User-defined tokens are text the model writes: both show it. */
    px_assert_ok(px_rt_tokenizer_decode(fx->t, 100, ID_INST, &piece, &len, &err), &err);
    assert_int_equal(len, 6);
    assert_memory_equal(piece, "[INST]", 6);
    /* token_text turns U+2581 into a space like decode, bytes into bytes. */
    int32_t hello = tok(fx, "\xe2\x96\x81Hello");
    px_assert_ok(px_rt_tokenizer_token_text(fx->t, hello, &piece, &len, &err), &err);
    assert_int_equal(len, 6);
    assert_memory_equal(piece, " Hello", 6);
    px_assert_ok(px_rt_tokenizer_token_text(fx->t, ID_BYTE0 + 0x41, &piece, &len, &err), &err);
    assert_int_equal(len, 1);
    assert_int_equal(piece[0], 'A');
    assert_int_equal(px_rt_tokenizer_token_text(fx->t, -1, &piece, &len, &err), PX_EINVAL);
    assert_int_equal(px_rt_tokenizer_token_text(fx->t, 100000, &piece, &len, &err), PX_EINVAL);
    assert_int_equal(px_rt_tokenizer_token_type(fx->t, ID_IM_END), PX_TOKEN_CONTROL);
    assert_int_equal(px_rt_tokenizer_token_type(fx->t, ID_INST), PX_TOKEN_USER_DEFINED);
    assert_int_equal(px_rt_tokenizer_token_type(fx->t, hello), PX_TOKEN_NORMAL);
    assert_int_equal(px_rt_tokenizer_token_type(fx->t, -3), PX_TOKEN_UNDEFINED);
}

static void test_special_encoding_bounds_and_hostile_text(void **state)
{
    fixture *fx = *state;
    px_err err;
    int32_t ids[8];
    size_t n;
    /* Too little room: the count needed comes back with PX_ELIMIT. */
    const char *text = "<|im_start|>user<|im_end|><|im_start|>user<|im_end|>";
    assert_int_equal(
        px_rt_tokenizer_encode(fx->t, text, strlen(text), PX_RT_ENCODE_SPECIAL, ids, 2, &n, &err),
        PX_ELIMIT);
    assert_int_equal(n, 6);
    /* Empty text, a text made only of specials, specials at both ends. */
    assert_int_equal(encode(fx->t, "", PX_RT_ENCODE_SPECIAL, ids, 8), 0);
    assert_int_equal(encode(fx->t, "", PX_RT_ENCODE_SPECIAL | PX_RT_ENCODE_BOS, ids, 8), 1);
    n = encode(fx->t, "<|im_end|><|im_end|>", PX_RT_ENCODE_SPECIAL, ids, 8);
    int32_t two[] = {ID_IM_END, ID_IM_END};
    assert_ids(ids, n, two, 2);
    /* A long run of bytes that begin special texts without completing one,
     * with embedded NULs and a truncated UTF-8 sequence. */
    size_t len = 200000;
    char *junk = malloc(len);
    for (size_t i = 0; i < len; i++)
        junk[i] = "<|im_sta\0[INST\xe2"[i % 16];
    size_t cap = 3 * len + 8;
    int32_t *many = malloc(cap * sizeof *many);
    px_assert_ok(
        px_rt_tokenizer_encode(fx->t, junk, len, PX_RT_ENCODE_SPECIAL, many, cap, &n, &err), &err);
    assert_true(n > 0);
    assert_int_equal(count(many, n, ID_IM_START), 0);
    assert_int_equal(count(many, n, ID_INST), 0);
    free(many);
    free(junk);
}

static void test_vocabulary_without_specials_ignores_the_flag(void **state)
{
    (void)state;
    /* Same tokens, every one typed NORMAL or BYTE. */
    vocab_file f;
    build(&f);
    for (uint32_t i = 0; i < f.n; i++)
        if (f.types[i] == PX_TOKEN_CONTROL || f.types[i] == PX_TOKEN_USER_DEFINED)
            f.types[i] = PX_TOKEN_NORMAL;
    char *path = write_model(&f, "plain.gguf");
    px_ir_model *m;
    px_rt_tokenizer *t;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(m), &t, &err), &err);
    int32_t a[64], b[64];
    const char *text = "<|im_start|>user\nHello<|im_end|>";
    size_t na = encode(t, text, PX_RT_ENCODE_SPECIAL, a, 64);
    size_t nb = encode(t, text, 0, b, 64);
    assert_ids(a, na, b, nb);
    assert_int_equal(count(a, na, ID_IM_START), 0);
    /* With no special tokens, find still finds ordinary ones. */
    assert_int_equal(px_rt_tokenizer_find(t, "<|im_start|>", 12), ID_IM_START);
    px_rt_tokenizer_free(t);
    px_ir_model_free(m);
    release(&f);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_special_texts_become_single_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_the_flag_special_texts_stay_ordinary_text,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_user_defined_and_longest_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_prefers_special_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_control_tokens_decode_to_nothing_but_show_their_text,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_encoding_bounds_and_hostile_text, setup,
                                        teardown),
        cmocka_unit_test(test_vocabulary_without_specials_ignores_the_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
