/* The real tiny models: hyper-parameters, exact counts by hand, tensors
 * byte for byte between GGUF and llama2.c, vocabularies. */
#include "px_test.h"

#include <string.h>

#include "plexus/ir.h"

static px_ir_model *open_shared(const char *name, const char *tokenizer)
{
    char *path = px_test_require_shared_model(name);
    char *tok = tokenizer ? px_test_shared_model(tokenizer) : NULL;
    px_ir_open_opts opts = {.tokenizer_path = tok};
    px_err err;
    px_ir_model *m = NULL;
    px_assert_ok(px_ir_model_open(path, &opts, &m, &err), &err);
    free(path);
    free(tok);
    return m;
}

/* stories260K: dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512. */
enum { D = 64, H = 172, L = 5, NH = 8, NKV = 4, HD = 8, V = 512 };

static uint64_t layer_params(void)
{
    uint64_t attn = D + D * (NH * HD) + 2 * D * (NKV * HD) + (NH * HD) * D;
    uint64_t ffn = D + 3 * (uint64_t)D * H;
    return attn + ffn;
}

static void test_stories_gguf_hparams_and_counts_by_hand(void **state)
{
    (void)state;
    px_ir_model *m = open_shared("stories260K.gguf", NULL);
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    assert_int_equal(px_ir_model_gguf_version(m), 3);
    assert_int_equal(hp->arch, PX_IR_ARCH_LLAMA);
    assert_int_equal(hp->dim, D);
    assert_int_equal(hp->hidden_dim, H);
    assert_int_equal(hp->n_layers, L);
    assert_int_equal(hp->n_heads, NH);
    assert_int_equal(hp->n_kv_heads, NKV);
    assert_int_equal(hp->head_dim, HD);
    assert_int_equal(hp->vocab_size, V);
    /* The converter wrote 128, not the checkpoint's seq_len of 512. */
    assert_int_equal(hp->context_length, 128);
    assert_true(hp->rope_theta == 10000.0f);
    assert_true(hp->rms_eps > 0.99e-5f && hp->rms_eps < 1.01e-5f);
    assert_int_equal(hp->rope_style, PX_IR_ROPE_ADJACENT);
    /* output.weight is present (a copy of the embedding): not tied. */
    assert_false(hp->tied_classifier);
    assert_false(hp->qkv_bias);

    px_ir_totals t;
    px_ir_model_totals(m, &t);
    uint64_t params = 2 * (uint64_t)V * D + D + L * layer_params();
    assert_int_equal(params, 292800);
    assert_int_equal(t.n_params, params);
    assert_int_equal(t.weight_bytes, params * 4);
    assert_int_equal(t.params_by_dtype[PX_DTYPE_F32], params);
    assert_int_equal(px_ir_model_n_tensors(m), 48);
    /* KV per token: 2 (K and V) * layers * kv heads * head size * 4 bytes. */
    assert_int_equal(t.kv_bytes_token, 2 * L * NKV * HD * 4);
    assert_int_equal(px_ir_model_kv_bytes_per_token(m, PX_DTYPE_F16), 2 * L * NKV * HD * 2);

    /* Rows: embedding, 5 layers, head. */
    assert_int_equal(px_ir_model_n_rows(m), L + 2);
    px_ir_layer_cost c;
    px_assert_ok(px_ir_model_layer_cost(m, PX_IR_ROW_EMBEDDING, &c), (px_err *)NULL);
    assert_int_equal(c.n_params, V * D);
    assert_int_equal(c.act_bytes_token, D * 4);
    px_assert_ok(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(2), &c), (px_err *)NULL);
    assert_int_equal(c.n_params, layer_params());
    assert_int_equal(c.weight_bytes, layer_params() * 4);
    assert_int_equal(c.kv_bytes_token, 2 * NKV * HD * 4);
    /* Decode FLOPs per token at context T, by hand (2 per multiply-add):
     * norms 4*D each, q/k/v/o projections, RoPE 3 per rotated value,
     * attention H*(4*HD+5) per attended position, SwiGLU 5*H, residuals D. */
    uint64_t fixed = 4 * D + 2 * D * D + 2 * (2 * D * NKV * HD) + 3 * (NH + NKV) * HD + 2 * D * D +
                     D + 4 * D + 3 * (2 * D * H) + 5 * H + D;
    assert_int_equal(fixed, 92412);
    assert_int_equal(px_ir_decode_flops(&c, 128), fixed + 128 * NH * (4 * HD + 5));
    /* Prefill of S tokens: S * fixed + pairs S(S+1)/2 per head. */
    assert_int_equal(px_ir_prefill_flops(&c, 100),
                     100 * fixed + (uint64_t)(100 * 101 / 2) * NH * (4 * HD + 5));
    px_assert_ok(px_ir_model_layer_cost(m, PX_IR_ROW_HEAD(L), &c), (px_err *)NULL);
    assert_int_equal(c.n_params, D + V * D);
    assert_int_equal(px_ir_decode_flops(&c, 128), 4 * D + 2 * D * V + 5 * V);
    assert_int_equal(px_ir_model_layer_cost(m, L + 2, &c), PX_EINVAL);
    px_ir_model_free(m);
}

static void test_q8_0_file_counts_blocks_and_f16_fallback(void **state)
{
    (void)state;
    px_ir_model *m = open_shared("stories260K-q8_0.gguf", NULL);
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    /* Norms stay f32; ffn_down (rows of 172, not a multiple of 32) fell
     * back to f16; everything else is Q8_0: 34 bytes per 32 values. */
    uint64_t f32 = D + L * 2 * D, f16 = L * (uint64_t)H * D;
    uint64_t q8 = 2 * (uint64_t)V * D + L * layer_params() - L * 2 * D - f16;
    assert_int_equal(t.params_by_dtype[PX_DTYPE_F32], f32);
    assert_int_equal(t.params_by_dtype[PX_DTYPE_F16], f16);
    assert_int_equal(t.params_by_dtype[PX_DTYPE_Q8_0], q8);
    assert_int_equal(t.bytes_by_dtype[PX_DTYPE_Q8_0], q8 / 32 * 34);
    assert_int_equal(t.weight_bytes, f32 * 4 + f16 * 2 + q8 / 32 * 34);
    const px_ir_tensor *wq = px_ir_model_weight(m, 0, PX_IR_ROLE_WQ);
    assert_int_equal(wq->dtype, PX_DTYPE_Q8_0);
    assert_int_equal(wq->nb[0], 34);
    assert_int_equal(wq->nb[1], 2 * 34);
    assert_int_equal(px_ir_model_weight(m, 3, PX_IR_ROLE_W2_DOWN)->dtype, PX_DTYPE_F16);
    /* The layer row's bytes at other dtypes: its matrices re-encoded. */
    px_ir_layer_cost c;
    assert_int_equal(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(0), &c), PX_OK);
    assert_int_equal(c.weight_bytes_at[PX_DTYPE_F32], layer_params() * 4);
    /* Q4_K blocks of 256 do not divide rows of 64. */
    assert_true(c.weight_bytes_at[PX_DTYPE_Q4_K] == UINT64_MAX);
    px_ir_model_free(m);
}

static void test_gguf_tensors_equal_llama2c_byte_for_byte(void **state)
{
    (void)state;
    /* The finding documented in plexus/ir.h: the GGUF conversion did not
     * permute wq/wk, so both files use adjacent-pair RoPE. */
    const char *pairs[][2] = {{"stories260K.gguf", "stories260K.bin"},
                              {"aidreams260K/aidreams260K.gguf", "aidreams260K/aidreams260K.bin"}};
    for (size_t p = 0; p < 2; p++) {
        px_ir_model *g = open_shared(pairs[p][0], NULL);
        px_ir_model *b = open_shared(pairs[p][1], NULL);
        const px_ir_hparams *hg = px_ir_model_hparams(g), *hb = px_ir_model_hparams(b);
        assert_int_equal(hg->n_layers, hb->n_layers);
        assert_int_equal(hg->dim, hb->dim);
        assert_true(hb->tied_classifier);
        assert_int_equal(hb->rope_style, hg->rope_style);
        for (int r = 0; r < PX_IR_ROLE_COUNT_; r++) {
            uint32_t layers = px_ir_role_is_per_layer((px_ir_role)r) ? hg->n_layers : 1;
            for (uint32_t l = 0; l < layers; l++) {
                const px_ir_tensor *tg = px_ir_model_weight(g, l, (px_ir_role)r);
                const px_ir_tensor *tb = px_ir_model_weight(b, l, (px_ir_role)r);
                assert_true((tg == NULL) == (tb == NULL));
                if (!tg)
                    continue;
                assert_int_equal(tg->n_bytes, tb->n_bytes);
                assert_int_equal(tg->ne[0], tb->ne[0]);
                assert_int_equal(tg->ne[1], tb->ne[1]);
                if (memcmp(tg->data, tb->data, tg->n_bytes) != 0)
                    fail_msg("%s: %s differs from the checkpoint", pairs[p][0], tg->name);
            }
        }
        /* The tied checkpoint's classifier is its embedding table. */
        assert_ptr_equal(px_ir_model_weight(b, 0, PX_IR_ROLE_OUTPUT),
                         px_ir_model_weight(b, 0, PX_IR_ROLE_TOKEN_EMBD));
        px_ir_model_free(g);
        px_ir_model_free(b);
    }
}

static void test_aidreams_hparams(void **state)
{
    (void)state;
    px_ir_model *m = open_shared("aidreams260K/aidreams260K.bin", "aidreams260K/tok512.bin");
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    assert_int_equal(hp->n_layers, 4);
    assert_int_equal(hp->n_heads, 4);
    assert_int_equal(hp->n_kv_heads, 4);
    assert_int_equal(hp->head_dim, 16);
    assert_int_equal(hp->context_length, 128);
    assert_int_equal(px_ir_model_source(m), PX_IR_SOURCE_LLAMA2C);
    const px_ir_vocab *v = px_ir_model_vocab(m);
    assert_non_null(v);
    assert_int_equal(v->n_tokens, 512);
    px_ir_model_free(m);
}

/* GGUF "llama" vocabularies spell a space as U+2581 (SentencePiece's
 * "\xe2\x96\x81"); llama2.c tokenizer files use a plain space. */
static void spaces_from_sentencepiece(const char *s, char *out, size_t n)
{
    size_t o = 0;
    while (*s && o + 1 < n) {
        if (!strncmp(s, "\xe2\x96\x81", 3)) {
            out[o++] = ' ';
            s += 3;
        } else {
            out[o++] = *s++;
        }
    }
    out[o] = '\0';
}

static void test_vocab_from_gguf_matches_tok512(void **state)
{
    (void)state;
    px_ir_model *m = open_shared("stories260K.gguf", NULL);
    const px_ir_vocab *g = px_ir_model_vocab(m);
    assert_non_null(g);
    assert_int_equal(g->n_tokens, 512);
    assert_int_equal(g->bos_id, 1);
    assert_int_equal(g->eos_id, 2);
    assert_int_equal(g->unk_id, 0);
    assert_int_equal(g->pad_id, -1);
    assert_string_equal(g->model, "llama");
    assert_string_equal(g->text[0], "<unk>");
    assert_string_equal(g->text[3], "<0x00>");
    assert_int_equal(g->types[3], PX_TOKEN_BYTE);
    assert_int_equal(g->types[1], PX_TOKEN_CONTROL);

    char *tok = px_test_require_shared_model("tok512.bin");
    px_arena *a;
    px_assert_ok(px_arena_new(0, &a, NULL), (px_err *)NULL);
    px_ir_vocab b;
    px_err err;
    px_assert_ok(px_ir_vocab_read_llama2c(tok, 512, a, &b, &err), &err);
    assert_int_equal(b.n_tokens, 512);
    assert_int_equal(b.bos_id, 1);
    /* llama2.c's exporter wrote BOS and EOS as "\n<s>\n" and "\n</s>\n";
     * the GGUF has the plain names.  Every other token is the same once
     * the GGUF's U+2581 is read as a space. */
    assert_string_equal(b.text[1], "\n<s>\n");
    assert_string_equal(g->text[1], "<s>");
    assert_string_equal(b.text[2], "\n</s>\n");
    for (uint32_t i = 0; i < 512; i++) {
        if (i == 1 || i == 2)
            continue;
        char plain[64];
        spaces_from_sentencepiece(g->text[i], plain, sizeof plain);
        assert_string_equal(plain, b.text[i]);
        assert_true(g->scores[i] == b.scores[i]);
        assert_int_equal(g->types[i], b.types[i]);
    }
    /* A wrong vocabulary size is caught by the exact end of the file. */
    assert_int_equal(px_ir_vocab_read_llama2c(tok, 511, a, &b, &err), PX_EPARSE);
    px_assert_contains(err.msg, "follow the last of 511 tokens");
    assert_int_equal(px_ir_vocab_read_llama2c(tok, 513, a, &b, &err), PX_EPARSE);
    px_assert_contains(err.msg, "token 512 of 513 is cut off");
    px_arena_free(a);
    free(tok);
    px_ir_model_free(m);
}

static void test_describe_is_canonical_and_complete(void **state)
{
    (void)state;
    px_ir_model *m = open_shared("stories260K.gguf", NULL);
    px_ir_describe_opts o = {.context = 64, .batch = 2, .with_ops = true, .with_tensors = true};
    json_t *j = px_ir_model_describe(m, &o);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "schema")), "plexus.model/1");
    assert_int_equal(json_integer_value(json_object_get(j, "params")), 292800);
    json_t *kv = json_object_get(j, "kv_cache");
    assert_int_equal(json_integer_value(json_object_get(kv, "bytes_at_context")), 1280 * 64 * 2);
    json_t *regions = json_object_get(j, "regions");
    assert_int_equal(json_array_size(regions), 2 + 2 * L);
    assert_string_equal(json_string_value(json_object_get(json_array_get(regions, 0), "name")),
                        "embedding");
    assert_string_equal(json_string_value(json_object_get(json_array_get(regions, 1), "name")),
                        "layer.0.attention");
    assert_string_equal(json_string_value(json_object_get(json_array_get(regions, 2), "name")),
                        "layer.0.ffn");
    assert_string_equal(json_string_value(json_object_get(json_array_get(regions, 11), "name")),
                        "head");
    assert_int_equal(json_array_size(json_object_get(j, "tensors")), 48);
    char *a = px_json_dump_canonical(j), *b = px_json_dump_canonical(j);
    assert_string_equal(a, b);
    free(a);
    free(b);
    json_decref(j);
    px_ir_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_gguf_hparams_and_counts_by_hand),
        cmocka_unit_test(test_q8_0_file_counts_blocks_and_f16_fallback),
        cmocka_unit_test(test_gguf_tensors_equal_llama2c_byte_for_byte),
        cmocka_unit_test(test_aidreams_hparams),
        cmocka_unit_test(test_vocab_from_gguf_matches_tok512),
        cmocka_unit_test(test_describe_is_canonical_and_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
