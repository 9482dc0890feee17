/* The GGUF writer and synthetic models: files read back identically,
 * deterministic weights, dtypes, and the writer's refusals. */
#include "px_test.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "plexus/ir.h"

static char *tmp(const char *name)
{
    return px_asprintf("%s/%s", px_test_tmpdir(), name);
}

static px_ir_model *open_file(const char *path)
{
    px_ir_model *m = NULL;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    return m;
}

static void synth(const px_ir_synth_opts *o, const char *path)
{
    px_err err;
    px_assert_ok(px_ir_synth_write(o, path, &err), &err);
}

static char *slurp(const char *path, size_t *len)
{
    char *buf;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 26, &buf, len, &err), &err);
    return buf;
}

static void test_writer_round_trips_metadata_and_tensor_bytes(void **state)
{
    (void)state;
    char *path = tmp("rt.gguf");
    px_err err;
    px_ir_gguf_writer *w;
    px_assert_ok(px_ir_gguf_writer_new(path, &w, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str(w, "general.architecture", "llama", &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "llama.embedding_length", 32, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "llama.feed_forward_length", 64, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "llama.block_count", 1, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "llama.attention.head_count", 4, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "llama.context_length", 16, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u64(w, "x.u64", UINT64_C(1) << 40, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_i32(w, "x.i32", -7, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_f32(w, "x.f32", 0.25f, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_bool(w, "x.bool", true, &err), &err);
    int16_t arr[3] = {-1, 2, 300};
    px_assert_ok(px_ir_gguf_writer_add_array(w, "x.arr", PX_GGUF_I16, arr, 3, &err), &err);
    const char *strs[2] = {"a", "bc"};
    px_assert_ok(px_ir_gguf_writer_add_str_array(w, "x.strs", strs, NULL, 2, &err), &err);
    assert_int_equal(px_ir_gguf_writer_add_u32(w, "x.i32", 1, &err), PX_EEXIST);
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
    } ts[] = {
        {"token_embd.weight", 2, {32, 8}},         {"output_norm.weight", 1, {32, 1}},
        {"blk.0.attn_norm.weight", 1, {32, 1}},    {"blk.0.attn_q.weight", 2, {32, 32}},
        {"blk.0.attn_k.weight", 2, {32, 32}},      {"blk.0.attn_v.weight", 2, {32, 32}},
        {"blk.0.attn_output.weight", 2, {32, 32}}, {"blk.0.ffn_norm.weight", 1, {32, 1}},
        {"blk.0.ffn_gate.weight", 2, {32, 64}},    {"blk.0.ffn_down.weight", 2, {64, 32}},
        {"blk.0.ffn_up.weight", 2, {32, 64}},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++)
        px_assert_ok(
            px_ir_gguf_writer_add_tensor(w, ts[i].name, PX_DTYPE_F32, ts[i].n_dims, ts[i].ne, &err),
            &err);
    assert_int_equal(
        px_ir_gguf_writer_add_tensor(w, "output_norm.weight", PX_DTYPE_F32, 1, ts[1].ne, &err),
        PX_EEXIST);
    px_assert_ok(px_ir_gguf_writer_begin_data(w, &err), &err);
    assert_int_equal(px_ir_gguf_writer_add_u32(w, "late", 1, &err), PX_ESTATE);
    /* Write all bytes in odd-sized pieces: tensor boundaries and padding
     * are the writer's business. */
    uint64_t total = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++)
        total += ts[i].ne[0] * ts[i].ne[1] * 4;
    uint8_t *bytes = malloc(total);
    for (uint64_t i = 0; i < total; i++)
        bytes[i] = (uint8_t)(i * 31 + 7);
    for (uint64_t off = 0; off < total; off += 77) {
        size_t n = (size_t)PX_MIN(77, total - off);
        px_assert_ok(px_ir_gguf_writer_write(w, bytes + off, n, &err), &err);
    }
    assert_int_equal(px_ir_gguf_writer_write(w, bytes, 1, &err), PX_EINVAL);
    px_assert_ok(px_ir_gguf_writer_finish(w, &err), &err);

    px_ir_model *m = open_file(path);
    uint64_t u;
    double f;
    const char *s;
    assert_true(px_ir_model_meta_u64(m, "x.u64", &u));
    assert_true(u == UINT64_C(1) << 40);
    assert_false(px_ir_model_meta_u64(m, "x.i32", &u)); /* negative */
    assert_true(px_ir_model_meta_f64(m, "x.i32", &f) && f == -7.0);
    assert_true(px_ir_model_meta_f64(m, "x.f32", &f) && f == 0.25);
    assert_true(px_ir_model_meta_u64(m, "x.bool", &u) && u == 1);
    assert_true(px_ir_model_meta_str(m, "general.architecture", &s));
    assert_string_equal(s, "llama");
    assert_int_equal(px_ir_model_n_meta(m), 12);
    const char *key, *text;
    px_ir_model_meta_at(m, 10, &key, &text);
    assert_string_equal(key, "x.arr");
    assert_string_equal(text, "array<i16>[3]");
    px_ir_model_meta_at(m, 11, &key, &text);
    assert_string_equal(text, "array<string>[2]");
    uint64_t off = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++) {
        const px_ir_tensor *t = px_ir_model_tensor(m, i);
        assert_string_equal(t->name, ts[i].name);
        assert_int_equal(t->n_bytes, ts[i].ne[0] * ts[i].ne[1] * 4);
        assert_int_equal(t->offset % 32, 0);
        assert_memory_equal(t->data, bytes + off, t->n_bytes);
        off += t->n_bytes;
    }
    px_ir_model_free(m);
    free(bytes);
    free(path);
}

static void test_writer_refuses_short_data_and_leaves_no_file(void **state)
{
    (void)state;
    char *path = tmp("short.gguf");
    px_err err;
    px_ir_gguf_writer *w;
    px_assert_ok(px_ir_gguf_writer_new(path, &w, &err), &err);
    uint64_t ne[2] = {32, 2};
    px_assert_ok(px_ir_gguf_writer_add_tensor(w, "a", PX_DTYPE_F32, 2, ne, &err), &err);
    assert_int_equal(px_ir_gguf_writer_add_tensor(w, "b", PX_DTYPE_Q8_0, 1, (uint64_t[]){31}, &err),
                     PX_EINVAL);
    assert_int_equal(px_ir_gguf_writer_write(w, "x", 1, &err), PX_ESTATE);
    px_assert_ok(px_ir_gguf_writer_begin_data(w, &err), &err);
    uint8_t data[100] = {0};
    px_assert_ok(px_ir_gguf_writer_write(w, data, sizeof data, &err), &err);
    assert_int_equal(px_ir_gguf_writer_finish(w, &err), PX_ESTATE);
    px_assert_contains(err.msg, "got 100 of its 256 bytes");
    assert_int_equal(access(path, F_OK), -1);
    px_ir_gguf_writer_abort(NULL);
    free(path);
}

static void test_synth_is_deterministic_and_reads_back(void **state)
{
    (void)state;
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.seed = 42;
    char *a = tmp("a.gguf"), *b = tmp("b.gguf"), *c = tmp("c.gguf");
    synth(&o, a);
    synth(&o, b);
    o.seed = 43;
    synth(&o, c);
    size_t la, lb, lc;
    char *fa = slurp(a, &la), *fb = slurp(b, &lb), *fc = slurp(c, &lc);
    assert_int_equal(la, lb);
    assert_memory_equal(fa, fb, la);
    assert_int_equal(la, lc);
    assert_true(memcmp(fa, fc, la) != 0);
    free(fa);
    free(fb);
    free(fc);

    px_ir_model *m = open_file(a);
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    assert_int_equal(hp->dim, 64);
    assert_int_equal(hp->hidden_dim, 172);
    assert_int_equal(hp->n_layers, 2);
    assert_int_equal(hp->n_heads, 8);
    assert_int_equal(hp->n_kv_heads, 4);
    assert_int_equal(hp->vocab_size, 512);
    assert_int_equal(hp->context_length, 256);
    assert_false(hp->tied_classifier);
    const px_ir_vocab *v = px_ir_model_vocab(m);
    assert_non_null(v);
    assert_int_equal(v->n_tokens, 512);
    assert_string_equal(v->text[1], "<s>");
    assert_string_equal(v->text[3 + 'A'], "<0x41>");
    assert_int_equal(v->types[3 + 'A'], PX_TOKEN_BYTE);
    assert_int_equal(v->bos_id, 1);
    assert_int_equal(v->eos_id, 2);
    uint64_t seed;
    assert_true(px_ir_model_meta_u64(m, "plexus.synth.seed", &seed) && seed == 42);
    /* Norms are 1; matrices N(0, 0.02). */
    const px_ir_tensor *norm = px_ir_model_weight(m, 1, PX_IR_ROLE_FFN_NORM);
    const float *nv = norm->data;
    for (uint64_t i = 0; i < norm->n_elems; i++)
        assert_true(nv[i] == 1.0f);
    const px_ir_tensor *emb = px_ir_model_weight(m, 0, PX_IR_ROLE_TOKEN_EMBD);
    const float *ev = emb->data;
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < emb->n_elems; i++) {
        sum += ev[i];
        sq += (double)ev[i] * ev[i];
    }
    double mean = sum / (double)emb->n_elems;
    double sd = sqrt(sq / (double)emb->n_elems - mean * mean);
    assert_true(fabs(mean) < 0.001);
    assert_true(sd > 0.019 && sd < 0.021);
    px_ir_model_free(m);
    free(a);
    free(b);
    free(c);
}

static void test_synth_dtypes_and_architectures(void **state)
{
    (void)state;
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    char *path = tmp("q.gguf");
    o.dtype = PX_DTYPE_Q8_0;
    synth(&o, path);
    px_ir_model *m = open_file(path);
    assert_int_equal(px_ir_model_weight(m, 0, PX_IR_ROLE_WQ)->dtype, PX_DTYPE_Q8_0);
    /* Rows of 172 do not fill Q8_0 blocks: f16, as llama.cpp does. */
    assert_int_equal(px_ir_model_weight(m, 0, PX_IR_ROLE_W2_DOWN)->dtype, PX_DTYPE_F16);
    assert_int_equal(px_ir_model_weight(m, 0, PX_IR_ROLE_ATTN_NORM)->dtype, PX_DTYPE_F32);
    /* Dequantized values keep the distribution: scale * int8. */
    const px_ir_tensor *wq = px_ir_model_weight(m, 0, PX_IR_ROLE_WQ);
    const uint8_t *blk = wq->data;
    double sq = 0;
    for (uint64_t b = 0; b < wq->n_elems / 32; b++, blk += 34) {
        float d = px_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
        for (int i = 0; i < 32; i++) {
            float x = d * (float)(int8_t)blk[2 + i];
            sq += (double)x * x;
        }
    }
    double sd = sqrt(sq / (double)wq->n_elems);
    assert_true(sd > 0.018 && sd < 0.022);
    px_ir_model_free(m);

    o.dtype = PX_DTYPE_F16;
    o.arch = PX_IR_ARCH_QWEN2;
    o.tied_classifier = true;
    synth(&o, path);
    m = open_file(path);
    assert_int_equal(px_ir_model_hparams(m)->arch, PX_IR_ARCH_QWEN2);
    assert_int_equal(px_ir_model_hparams(m)->rope_style, PX_IR_ROPE_HALVES);
    assert_true(px_ir_model_hparams(m)->qkv_bias);
    assert_true(px_ir_model_hparams(m)->tied_classifier);
    assert_non_null(px_ir_model_weight(m, 1, PX_IR_ROLE_BV));
    assert_int_equal(px_ir_model_weight(m, 1, PX_IR_ROLE_WV)->dtype, PX_DTYPE_F16);
    px_ir_model_free(m);

    px_ir_synth_defaults(&o);
    o.arch = PX_IR_ARCH_MIXTRAL;
    o.n_experts = 4;
    o.n_experts_used = 2;
    synth(&o, path);
    m = open_file(path);
    assert_int_equal(px_ir_model_hparams(m)->arch, PX_IR_ARCH_MIXTRAL);
    const px_ir_tensor *ex = px_ir_model_weight(m, 0, PX_IR_ROLE_MOE_DOWN_EXPS);
    assert_int_equal(ex->n_dims, 3);
    assert_int_equal(ex->ne[2], 4);
    px_ir_layer_cost c;
    assert_int_equal(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(0), &c), PX_OK);
    assert_int_equal(c.expert_bytes, 3 * 64 * 172 * 4);
    px_ir_model_free(m);
    free(path);
}

static void test_synth_refuses_bad_options_with_the_fix(void **state)
{
    (void)state;
    char *path = tmp("bad.gguf");
    px_ir_synth_opts o;
    px_err err;
    px_ir_synth_defaults(&o);
    o.n_heads = 3;
    assert_int_equal(px_ir_synth_write(&o, path, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--heads 3 must divide --dim 64");
    px_ir_synth_defaults(&o);
    o.vocab_size = 100;
    assert_int_equal(px_ir_synth_write(&o, path, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--vocab 100");
    px_ir_synth_defaults(&o);
    o.dtype = PX_DTYPE_Q4_K;
    assert_int_equal(px_ir_synth_write(&o, path, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--dtype");
    px_ir_synth_defaults(&o);
    o.arch = PX_IR_ARCH_MIXTRAL;
    assert_int_equal(px_ir_synth_write(&o, path, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--experts");
    assert_int_equal(access(path, F_OK), -1);
    /* Without the tokenizer any vocabulary size goes, and none is stored. */
    px_ir_synth_defaults(&o);
    o.vocab_size = 16;
    o.no_tokenizer = true;
    synth(&o, path);
    px_ir_model *m = open_file(path);
    assert_null(px_ir_model_vocab(m));
    assert_int_equal(px_ir_model_hparams(m)->vocab_size, 16);
    px_ir_model_free(m);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_round_trips_metadata_and_tensor_bytes),
        cmocka_unit_test(test_writer_refuses_short_data_and_leaves_no_file),
        cmocka_unit_test(test_synth_is_deterministic_and_reads_back),
        cmocka_unit_test(test_synth_dtypes_and_architectures),
        cmocka_unit_test(test_synth_refuses_bad_options_with_the_fix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
