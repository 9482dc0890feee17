/* The BPE tokenizer: known ids for the reference prompt, round trips,
 * agreement with llama2.c's quadratic merge loop (re-implemented here as
 * the yardstick), sentencepiece's U+2581 spaces, and hostile input. */
#include "px_test.h"

#include <stdio.h>
#include <string.h>

#include "plexus/rt.h"

/* ------------------------------------------------------------------ */
/* A vocabulary built in the test                                      */
/* ------------------------------------------------------------------ */

typedef struct test_vocab {
    px_ir_vocab v;
    char *text[400];
    uint32_t len[400];
    float scores[400];
    uint8_t types[400];
    uint32_t n;
} test_vocab;

static void add_token(test_vocab *tv, const char *s, float score, uint8_t type)
{
    tv->text[tv->n] = px_strdup(s);
    tv->len[tv->n] = (uint32_t)strlen(s);
    tv->scores[tv->n] = score;
    tv->types[tv->n] = type;
    tv->n++;
}

/* <unk>, <s>, </s>, the 256 byte tokens, then the given merges.  With
 * spm, spaces are written as U+2581. */
static void make_vocab(test_vocab *tv, const char *const *merges, size_t n_merges)
{
    memset(tv, 0, sizeof *tv);
    add_token(tv, "<unk>", 0, PX_TOKEN_UNKNOWN);
    add_token(tv, "<s>", 0, PX_TOKEN_CONTROL);
    add_token(tv, "</s>", 0, PX_TOKEN_CONTROL);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        add_token(tv, s, 0, PX_TOKEN_BYTE);
    }
    for (size_t i = 0; i < n_merges; i++)
        add_token(tv, merges[i], -(float)i, PX_TOKEN_NORMAL);
    tv->v.n_tokens = tv->n;
    tv->v.text = (const char *const *)tv->text;
    tv->v.len = tv->len;
    tv->v.scores = tv->scores;
    tv->v.types = tv->types;
    tv->v.bos_id = 1;
    tv->v.eos_id = 2;
    tv->v.unk_id = 0;
    tv->v.pad_id = -1;
    px_strlcpy(tv->v.model, "llama", sizeof tv->v.model);
}

static void free_vocab(test_vocab *tv)
{
    for (uint32_t i = 0; i < tv->n; i++)
        free(tv->text[i]);
}

static const char *const plain_merges[] = {
    " ",  "a",  "b",  "c",    "d",   "e",    " a", "ab",  "bc", "abc",          " ab",
    "ca", "de", "ed", " abc", "cab", "dede", "aa", "aaa", "é",  "\xe6\x97\xa5", "ba",
    "cd", "ec", " e", "bcd"};

/* ------------------------------------------------------------------ */
/* llama2.c's encode(), quadratic, as the yardstick                    */
/* ------------------------------------------------------------------ */

static int32_t lin_lookup(const px_ir_vocab *v, const char *s, size_t n)
{
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (v->len[i] == n && !memcmp(v->text[i], s, n))
            return (int32_t)i;
    return -1;
}

static size_t llama2c_encode(const px_ir_vocab *v, const char *text, int32_t *ids)
{
    size_t n = 0, len = strlen(text);
    ids[n++] = 1;
    if (len)
        ids[n++] = lin_lookup(v, " ", 1);
    char buf[8];
    size_t bl = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80)
            bl = 0;
        buf[bl++] = *c;
        if ((c[1] & 0xC0) == 0x80 && bl < 4)
            continue;
        int32_t id = lin_lookup(v, buf, bl);
        if (id >= 0) {
            ids[n++] = id;
        } else {
            for (size_t i = 0; i < bl; i++) {
                char b[8];
                snprintf(b, sizeof b, "<0x%02X>", (unsigned char)buf[i]);
                ids[n++] = lin_lookup(v, b, 6);
            }
        }
        bl = 0;
    }
    char cat[512];
    for (;;) {
        float best = -1e10f;
        int32_t best_id = -1;
        size_t best_i = 0;
        for (size_t i = 1; i + 1 < n; i++) {
            size_t la = v->len[ids[i]], lb = v->len[ids[i + 1]];
            memcpy(cat, v->text[ids[i]], la);
            memcpy(cat + la, v->text[ids[i + 1]], lb);
            int32_t id = lin_lookup(v, cat, la + lb);
            if (id >= 0 && v->scores[id] > best) {
                best = v->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0)
            break;
        ids[best_i] = best_id;
        memmove(ids + best_i + 1, ids + best_i + 2, (n - best_i - 2) * sizeof *ids);
        n--;
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* Decodes ids (BOS first) back to text. */
static char *decode_all(const px_rt_tokenizer *t, const int32_t *ids, size_t n)
{
    px_strbuf sb = PX_STRBUF_INIT;
    px_err err;
    for (size_t i = 1; i < n; i++) {
        const char *piece;
        size_t len;
        px_assert_ok(px_rt_tokenizer_decode(t, ids[i - 1], ids[i], &piece, &len, &err), &err);
        px_strbuf_add(&sb, piece, len);
    }
    return px_strbuf_detach(&sb, NULL);
}

static void check_round_trip(const px_rt_tokenizer *t, const char *text)
{
    int32_t ids[1024];
    size_t n;
    px_err err;
    px_assert_ok(
        px_rt_tokenizer_encode(t, text, strlen(text), PX_RT_ENCODE_BOS, ids, 1024, &n, &err), &err);
    char *back = decode_all(t, ids, n);
    assert_string_equal(back, text);
    free(back);
}

static void random_text(px_rng *r, char *out, size_t n, const char *alphabet)
{
    size_t k = strlen(alphabet);
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[px_rng_below(r, k)];
    out[n] = '\0';
}

static void check_against_llama2c(const px_ir_vocab *v, const px_rt_tokenizer *t,
                                  const char *alphabet, int rounds)
{
    px_rng r;
    px_rng_seed(&r, 99);
    char text[200];
    int32_t want[512], got[512];
    for (int i = 0; i < rounds; i++) {
        random_text(&r, text, 1 + px_rng_below(&r, 120), alphabet);
        size_t nw = llama2c_encode(v, text, want), ng;
        px_err err;
        px_assert_ok(
            px_rt_tokenizer_encode(t, text, strlen(text), PX_RT_ENCODE_BOS, got, 512, &ng, &err),
            &err);
        if (nw != ng || memcmp(want, got, nw * sizeof *want))
            fail_msg("\"%s\": %zu tokens from llama2.c's merge loop, %zu here", text, nw, ng);
    }
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_tokenizer_matches_llama2c_merges_on_random_text(void **state)
{
    (void)state;
    test_vocab tv;
    make_vocab(&tv, plain_merges, PX_ARRAY_LEN(plain_merges));
    px_rt_tokenizer *t;
    px_err err;
    px_assert_ok(px_rt_tokenizer_new(&tv.v, &t, &err), &err);
    check_against_llama2c(&tv.v, t, "abcde a", 300);
    check_against_llama2c(&tv.v, t, "aab cx\xc3\xa9\n", 100);
    px_rt_tokenizer_free(t);
    free_vocab(&tv);
}

static void test_tokenizer_round_trips_text_bytes_and_utf8(void **state)
{
    (void)state;
    test_vocab tv;
    make_vocab(&tv, plain_merges, PX_ARRAY_LEN(plain_merges));
    px_rt_tokenizer *t;
    px_err err;
    px_assert_ok(px_rt_tokenizer_new(&tv.v, &t, &err), &err);
    check_round_trip(t, "abc cab dede");
    check_round_trip(t, "  leading and  double spaces ");
    check_round_trip(t, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 tabs\tand\nlines");
    check_round_trip(t, "\x01\x7f\xff\xfe invalid \x80\x80 utf-8");
    int32_t ids[8];
    size_t n;
    px_assert_ok(
        px_rt_tokenizer_encode(t, "", 0, PX_RT_ENCODE_BOS | PX_RT_ENCODE_EOS, ids, 8, &n, &err),
        &err);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    /* Bytes the text holds are kept, NUL included. */
    px_assert_ok(px_rt_tokenizer_encode(t, "a\0b", 3, PX_RT_ENCODE_BOS, ids, 8, &n, &err), &err);
    char *back = decode_all(t, ids, n);
    assert_memory_equal(back, "a\0b", 3);
    free(back);
    px_rt_tokenizer_free(t);
    free_vocab(&tv);
}

static void test_tokenizer_handles_sentencepiece_spaces(void **state)
{
    (void)state;
    static const char *const spm[] = {"\xe2\x96\x81",
                                      "a",
                                      "b",
                                      "\xe2\x96\x81"
                                      "a",
                                      "\xe2\x96\x81"
                                      "ab",
                                      "ab"};
    test_vocab tv;
    make_vocab(&tv, spm, PX_ARRAY_LEN(spm));
    px_rt_tokenizer *t;
    px_err err;
    px_assert_ok(px_rt_tokenizer_new(&tv.v, &t, &err), &err);
    int32_t ids[16];
    size_t n;
    px_assert_ok(px_rt_tokenizer_encode(t, "ab ab", 5, PX_RT_ENCODE_BOS, ids, 16, &n, &err), &err);
    /* BOS, "▁ab" (dummy prefix merged), "▁ab". */
    int32_t want_ab = 259 + 4;
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], want_ab);
    assert_int_equal(ids[2], want_ab);
    check_round_trip(t, "ab ab");
    check_round_trip(t, "b a  ba");
    const char *piece;
    size_t len;
    px_assert_ok(px_rt_tokenizer_decode(t, 5, want_ab, &piece, &len, &err), &err);
    assert_int_equal(len, 3);
    assert_memory_equal(piece, " ab", 3);
    px_rt_tokenizer_free(t);
    free_vocab(&tv);
}

static void test_tokenizer_rejects_hostile_input(void **state)
{
    (void)state;
    test_vocab tv;
    make_vocab(&tv, plain_merges, PX_ARRAY_LEN(plain_merges));
    px_rt_tokenizer *t;
    px_err err;
    px_assert_ok(px_rt_tokenizer_new(&tv.v, &t, &err), &err);
    int32_t ids[4];
    size_t n;
    assert_int_equal(px_rt_tokenizer_encode(t, "xyzw xyzw", 9, PX_RT_ENCODE_BOS, ids, 4, &n, &err),
                     PX_ELIMIT);
    assert_true(n > 4);
    px_assert_contains(err.msg, "room for 4");
    const char *piece;
    size_t len;
    assert_int_equal(px_rt_tokenizer_decode(t, 1, (int32_t)tv.n, &piece, &len, &err), PX_EINVAL);
    assert_int_equal(px_rt_tokenizer_decode(t, 1, -3, &piece, &len, &err), PX_EINVAL);
    /* Control tokens decode to nothing. */
    px_assert_ok(px_rt_tokenizer_decode(t, 0, 2, &piece, &len, &err), &err);
    assert_int_equal(len, 0);
    px_rt_tokenizer_free(t);

    /* A vocabulary without byte tokens cannot encode what it lacks. */
    test_vocab small = tv;
    small.v.n_tokens = 3;
    small.v.unk_id = -1;
    px_assert_ok(px_rt_tokenizer_new(&small.v, &t, &err), &err);
    assert_int_equal(px_rt_tokenizer_encode(t, "q", 1, 0, ids, 4, &n, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "byte 0x");
    px_rt_tokenizer_free(t);

    test_vocab gpt2 = tv;
    px_strlcpy(gpt2.v.model, "gpt2", sizeof gpt2.v.model);
    assert_int_equal(px_rt_tokenizer_new(&gpt2.v, &t, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "gpt2");
    px_ir_vocab empty = {0};
    assert_int_equal(px_rt_tokenizer_new(&empty, &t, &err), PX_EINVAL);
    assert_int_equal(px_rt_tokenizer_new(NULL, &t, &err), PX_EINVAL);
    px_rt_tokenizer_free(NULL);
    free_vocab(&tv);
}

static void test_tokenizer_encodes_reference_prompt_with_tok512(void **state)
{
    (void)state;
    char *path = px_test_require_shared_model("tok512.bin");
    px_arena *arena;
    px_err err;
    px_assert_ok(px_arena_new(0, &arena, &err), &err);
    px_ir_vocab v;
    px_assert_ok(px_ir_vocab_read_llama2c(path, 512, arena, &v, &err), &err);
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(&v, &t, &err), &err);
    int32_t ids[64];
    size_t n;
    px_assert_ok(
        px_rt_tokenizer_encode(t, "Once upon a time", 16, PX_RT_ENCODE_BOS, ids, 64, &n, &err),
        &err);
    int32_t want[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, PX_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof want);
    check_round_trip(t, "Once upon a time, there was a little girl named Lily.");
    check_round_trip(t, "Caf\xc3\xa9 \xe2\x82\xac 42!\n\"Hi,\" she said.");
    check_against_llama2c(&v, t, "abcdefghijklmnop .,!", 40);
    check_against_llama2c(&v, t, "the cat sat on a mat. ", 40);
    px_rt_tokenizer_free(t);
    px_arena_free(arena);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_matches_llama2c_merges_on_random_text),
        cmocka_unit_test(test_tokenizer_round_trips_text_bytes_and_utf8),
        cmocka_unit_test(test_tokenizer_handles_sentencepiece_spaces),
        cmocka_unit_test(test_tokenizer_rejects_hostile_input),
        cmocka_unit_test(test_tokenizer_encodes_reference_prompt_with_tok512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
