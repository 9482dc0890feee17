/* The cpu backend against the scalar reference on synthetic models
 * (written with the ir module's GGUF writer into a temporary folder):
 * several shapes and dtypes, grouped-query attention, biases and both
 * rotary pairings, sliding windows, batches of sequences at different
 * positions, long contexts, and thread counts that never change a bit. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/rt.h"

/* ------------------------------------------------------------------ */
/* Synthetic models                                                    */
/* ------------------------------------------------------------------ */

#define VOCAB 300

static px_rt_model *synth(const char *name, px_ir_arch arch, uint32_t dim, uint32_t hidden,
                          uint32_t layers, uint32_t heads, uint32_t kv_heads, px_dtype dtype,
                          bool tied, uint32_t context)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.arch = arch;
    o.dim = dim;
    o.hidden_dim = hidden;
    o.n_layers = layers;
    o.n_heads = heads;
    o.n_kv_heads = kv_heads;
    o.dtype = dtype;
    o.tied_classifier = tied;
    o.context_length = context;
    o.vocab_size = 300;
    o.seed = 7;
    char *path = px_asprintf("%s/%s.gguf", px_test_tmpdir(), name);
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    free(path);
    return m;
}

/* A model whose weights are large enough (matrices of standard deviation
 * scale/sqrt(rows)) that attention is sharp and every part of the block
 * moves the logits, so that comparisons against the reference would catch
 * a wrong rotation, mask or head mapping.  The ir module's synthetic
 * models (N(0, 0.02) weights) leave attention almost uniform. */
typedef struct spec {
    const char *arch; /* "llama", "qwen2" (biases, halves rope), "mistral" */
    uint32_t dim, hidden, layers, heads, kv_heads, context, window;
    px_dtype dtype;
    bool tied, zero_bias;
    uint64_t seed;
} spec;

static void encode_row(px_dtype t, const float *v, uint32_t n, uint8_t *out, size_t *len)
{
    size_t k = 0;
    if (t == PX_DTYPE_Q8_0) {
        for (uint32_t b = 0; b < n / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(v[b * 32 + j]));
            uint16_t dh = px_f32_to_f16(amax / 127.0f);
            float d = px_f16_to_f32(dh);
            memcpy(out + k, &dh, 2);
            for (int j = 0; j < 32; j++)
                out[k + 2 + j] = (uint8_t)(int8_t)(d > 0 ? lrintf(v[b * 32 + j] / d) : 0);
            k += 34;
        }
    } else {
        for (uint32_t j = 0; j < n; j++) {
            if (t == PX_DTYPE_F32) {
                memcpy(out + k, &v[j], 4);
                k += 4;
            } else {
                uint16_t h = t == PX_DTYPE_F16 ? px_f32_to_f16(v[j]) : px_f32_to_bf16(v[j]);
                memcpy(out + k, &h, 2);
                k += 2;
            }
        }
    }
    *len = k;
}

static px_rt_model *write_model(const char *name, const spec *sp)
{
    char *path = px_asprintf("%s/%s.gguf", px_test_tmpdir(), name);
    px_err err;
    px_ir_gguf_writer *w;
    px_assert_ok(px_ir_gguf_writer_new(path, &w, &err), &err);
    const char *a = sp->arch;
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", a, s), key)
    uint32_t hd = sp->dim / sp->heads, kv = sp->kv_heads * hd;
    px_assert_ok(px_ir_gguf_writer_add_str(w, "general.architecture", a, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("context_length"), sp->context, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("embedding_length"), sp->dim, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("feed_forward_length"), sp->hidden, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("block_count"), sp->layers, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("attention.head_count"), sp->heads, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), sp->kv_heads, &err),
                 &err);
    px_assert_ok(px_ir_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f, &err),
                 &err);
    if (sp->window)
        px_assert_ok(
            px_ir_gguf_writer_add_u32(w, KEY("attention.sliding_window"), sp->window, &err), &err);
#undef KEY
    /* Tensors: name, rows, row length, kind (0 matrix, 1 norm, 2 bias). */
    struct {
        char name[48];
        uint32_t rows, cols, kind;
    } ts[64];
    size_t n = 0;
#define ADD(nm, r, c, k)                               \
    do {                                               \
        px_strlcpy(ts[n].name, nm, sizeof ts[n].name); \
        ts[n].rows = (r);                              \
        ts[n].cols = (c);                              \
        ts[n++].kind = (k);                            \
    } while (0)
    ADD("token_embd.weight", VOCAB, sp->dim, 0);
    ADD("output_norm.weight", 1, sp->dim, 1);
    if (!sp->tied)
        ADD("output.weight", VOCAB, sp->dim, 0);
    for (uint32_t l = 0; l < sp->layers; l++) {
        char nm[48];
#define LADD(suffix, r, c, k)                         \
    do {                                              \
        snprintf(nm, sizeof nm, "blk.%u." suffix, l); \
        ADD(nm, r, c, k);                             \
    } while (0)
        LADD("attn_norm.weight", 1, sp->dim, 1);
        LADD("attn_q.weight", sp->dim, sp->dim, 0);
        LADD("attn_k.weight", kv, sp->dim, 0);
        LADD("attn_v.weight", kv, sp->dim, 0);
        if (!strcmp(a, "qwen2")) {
            LADD("attn_q.bias", 1, sp->dim, 2);
            LADD("attn_k.bias", 1, kv, 2);
            LADD("attn_v.bias", 1, kv, 2);
        }
        LADD("attn_output.weight", sp->dim, sp->dim, 0);
        LADD("ffn_norm.weight", 1, sp->dim, 1);
        LADD("ffn_gate.weight", sp->hidden, sp->dim, 0);
        LADD("ffn_down.weight", sp->dim, sp->hidden, 0);
        LADD("ffn_up.weight", sp->hidden, sp->dim, 0);
#undef LADD
    }
#undef ADD
    for (size_t i = 0; i < n; i++) {
        px_dtype t = ts[i].kind ? PX_DTYPE_F32 : sp->dtype;
        if (t == PX_DTYPE_Q8_0 && ts[i].cols % 32)
            t = PX_DTYPE_F16;
        uint64_t ne[2] = {ts[i].cols, ts[i].rows};
        px_assert_ok(
            px_ir_gguf_writer_add_tensor(w, ts[i].name, t, ts[i].rows > 1 ? 2 : 1, ne, &err), &err);
    }
    px_assert_ok(px_ir_gguf_writer_begin_data(w, &err), &err);
    px_rng rng;
    px_rng_seed(&rng, sp->seed);
    float *row = malloc(1024 * sizeof(float));
    uint8_t *enc = malloc(1024 * 4);
    for (size_t i = 0; i < n; i++) {
        px_dtype t = ts[i].kind ? PX_DTYPE_F32 : sp->dtype;
        if (t == PX_DTYPE_Q8_0 && ts[i].cols % 32)
            t = PX_DTYPE_F16;
        bool embd = !strcmp(ts[i].name, "token_embd.weight");
        double sd = embd ? 0.5 : 1.5 / sqrt((double)ts[i].cols);
        for (uint32_t r = 0; r < ts[i].rows; r++) {
            for (uint32_t c = 0; c < ts[i].cols; c++) {
                /* Zero biases draw nothing, so the other weights match a
                 * model without biases of the same seed. */
                double x = ts[i].kind == 2 && sp->zero_bias ? 0.0 : px_rng_normal(&rng);
                row[c] = (float)(ts[i].kind == 1   ? 1.0 + 0.2 * x
                                 : ts[i].kind == 2 ? (sp->zero_bias ? 0.0 : 0.5 * x)
                                                   : sd * x);
            }
            size_t len;
            encode_row(t, row, ts[i].cols, enc, &len);
            px_assert_ok(px_ir_gguf_writer_write(w, enc, len, &err), &err);
        }
    }
    free(row);
    free(enc);
    px_assert_ok(px_ir_gguf_writer_finish(w, &err), &err);
    px_rt_model *m;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    free(path);
    return m;
}

static px_rt_model *sharp(const char *name, const char *arch, uint32_t dim, uint32_t hidden,
                          uint32_t layers, uint32_t heads, uint32_t kv_heads, px_dtype dtype,
                          bool tied)
{
    spec sp = {.arch = arch,
               .dim = dim,
               .hidden = hidden,
               .layers = layers,
               .heads = heads,
               .kv_heads = kv_heads,
               .context = 512,
               .dtype = dtype,
               .tied = tied,
               .seed = 3};
    return write_model(name, &sp);
}

static int32_t random_token(px_rng *r)
{
    return (int32_t)px_rng_below(r, 300);
}

/* ------------------------------------------------------------------ */
/* cpu against the reference                                           */
/* ------------------------------------------------------------------ */

#define N_SEQS   3
#define N_DECODE 5

/* Runs a batch of three sequences (prefill of 7, 1 and 3 tokens in one
 * step, then N_DECODE decode steps of all three) on the cpu with
 * `threads` threads, checks every logit row against the sequence's own
 * reference pass, and stores the logits of the last step in `last`. */
static double batch_against_reference(const px_rt_model *m, uint32_t threads, bool portable,
                                      float last[N_SEQS][VOCAB])
{
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {
        .n_threads = threads, .portable_kernels = portable, .max_seqs = N_SEQS, .context = 64};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    px_rt_ref *ref[N_SEQS];
    int32_t seq[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        px_assert_ok(px_rt_ref_new(m, 64, &ref[i], &err), &err);
        px_assert_ok(px_rt_seq_add(s, &seq[i], &err), &err);
        assert_int_equal(seq[i], i);
    }
    px_rng rng;
    px_rng_seed(&rng, 11);
    static const uint32_t prompt_len[N_SEQS] = {7, 1, 3};
    int32_t tokens[N_SEQS][8];
    float ref_logits[VOCAB];
    double max_diff = 0;
    px_rt_seq_step steps[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        for (uint32_t t = 0; t < prompt_len[i]; t++)
            tokens[i][t] = random_token(&rng);
        steps[i] = (px_rt_seq_step){
            .seq = seq[i], .pos = 0, .n_tokens = prompt_len[i], .tokens = tokens[i]};
    }
    uint32_t pos[N_SEQS] = {0};
    for (int step = 0; step <= N_DECODE; step++) {
        px_rt_batch b = {.n_seqs = N_SEQS, .seqs = steps};
        px_rt_output out;
        px_assert_ok(px_rt_forward(s, &b, NULL, &out, &err), &err);
        assert_int_equal(out.n_rows, N_SEQS);
        assert_int_equal(out.row_len, VOCAB);
        for (int i = 0; i < N_SEQS; i++) {
            for (uint32_t t = 0; t < steps[i].n_tokens; t++)
                px_assert_ok(
                    px_rt_ref_forward(ref[i], steps[i].tokens[t], pos[i]++, ref_logits, &err),
                    &err);
            const float *row = out.data + (size_t)i * VOCAB;
            for (int v = 0; v < VOCAB; v++)
                max_diff = fmax(max_diff, fabs((double)row[v] - ref_logits[v]));
            assert_int_equal(px_rt_seq_len(s, seq[i]), pos[i]);
            if (last)
                memcpy(last[i], row, sizeof last[i]);
            /* Next step: one new token per sequence, at its own position. */
            tokens[i][0] = random_token(&rng);
            steps[i] =
                (px_rt_seq_step){.seq = seq[i], .pos = pos[i], .n_tokens = 1, .tokens = tokens[i]};
        }
    }
    for (int i = 0; i < N_SEQS; i++)
        px_rt_ref_free(ref[i]);
    px_rt_session_free(s);
    return max_diff;
}

/* tol: 1e-4, float rounding against double.  q8_0 models get more: the
 * kernels multiply activations quantized to q8_0, and the reference
 * quantizes its double activations the same way, but a value within
 * float rounding of a rounding boundary may land one step of its block's
 * scale apart (a few 1e-3 in the logits). */
static void check_model_tol(px_rt_model *m, const char *what, double tol)
{
    float bits[3][N_SEQS][VOCAB];
    for (uint32_t threads = 1; threads <= 3; threads++) {
        double d = batch_against_reference(m, threads, false, bits[threads - 1]);
        print_message("%s, %u thread(s): max |cpu - reference| = %.3g\n", what, threads, d);
        if (!(d <= tol))
            fail_msg("%s, %u threads: logits differ from the reference by %g", what, threads, d);
    }
    /* Work is split by output rows: the thread count never changes a bit. */
    assert_memory_equal(bits[0], bits[1], sizeof bits[0]);
    assert_memory_equal(bits[0], bits[2], sizeof bits[0]);
    double d = batch_against_reference(m, 2, true, NULL);
    print_message("%s, portable kernels: max |cpu - reference| = %.3g\n", what, d);
    assert_true(d <= tol);
    px_rt_model_free(m);
}

static void check_model_against_reference(px_rt_model *m, const char *what)
{
    check_model_tol(m, what, 1e-4);
}

static void test_forward_matches_reference_with_grouped_query_attention(void **state)
{
    (void)state;
    check_model_against_reference(sharp("gqa", "llama", 64, 96, 2, 8, 4, PX_DTYPE_F32, false),
                                  "llama dim 64, 8 heads, 4 kv heads");
}

static void test_forward_matches_reference_with_odd_sizes(void **state)
{
    (void)state;
    /* Head size 12, three query heads per kv head, rows that fill no
     * vector exactly. */
    check_model_against_reference(sharp("odd", "llama", 72, 200, 3, 6, 2, PX_DTYPE_F32, true),
                                  "llama dim 72, hidden 200, 6 heads, 2 kv heads, tied");
}

static void test_forward_matches_reference_with_biases_and_halves_rope(void **state)
{
    (void)state;
    px_rt_model *m = sharp("qwen", "qwen2", 64, 96, 2, 4, 1, PX_DTYPE_F32, false);
    assert_int_equal(px_rt_model_hparams(m)->rope_style, PX_IR_ROPE_HALVES);
    assert_true(px_rt_model_hparams(m)->qkv_bias);
    check_model_against_reference(m, "qwen2 dim 64, 1 kv head, biases, neox rope");
}

static void test_forward_matches_reference_on_f16_bf16_q8_0_weights(void **state)
{
    (void)state;
    check_model_against_reference(sharp("f16", "llama", 64, 96, 2, 4, 2, PX_DTYPE_F16, false),
                                  "f16");
    check_model_against_reference(sharp("bf16", "llama", 64, 96, 2, 4, 2, PX_DTYPE_BF16, false),
                                  "bf16");
    check_model_tol(sharp("q8", "llama", 64, 128, 2, 4, 2, PX_DTYPE_Q8_0, false), "q8_0", 1e-2);
    /* The ir module's own synthetic model too. */
    check_model_tol(
        synth("synth_q8", PX_IR_ARCH_LLAMA, 64, 128, 2, 8, 4, PX_DTYPE_Q8_0, false, 512),
        "ir synthetic q8_0", 1e-2);
}

static void test_forward_matches_reference_with_a_sliding_window(void **state)
{
    (void)state;
    spec sp = {.arch = "mistral",
               .dim = 64,
               .hidden = 96,
               .layers = 2,
               .heads = 4,
               .kv_heads = 2,
               .context = 512,
               .window = 4,
               .dtype = PX_DTYPE_F32,
               .seed = 3};
    px_rt_model *m = write_model("window", &sp);
    assert_int_equal(px_rt_model_hparams(m)->sliding_window, 4);
    check_model_against_reference(m, "mistral, window of 4");
}

/* Logits of the last of n tokens, one sequence, on the cpu. */
static void last_logits(const px_rt_model *m, const int32_t *tokens, uint32_t n, float *out)
{
    px_err err;
    px_rt_session *s;
    px_assert_ok(
        px_rt_session_new(m, &(px_rt_session_opts){.n_threads = 1, .context = 32}, &s, &err), &err);
    int32_t seq;
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = n, .tokens = tokens};
    px_rt_output o;
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &o, &err), &err);
    memcpy(out, o.data, VOCAB * sizeof(float));
    px_rt_session_free(s);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* The 1e-4 bound against the reference means something: the rotation
 * pairing and the attention window each move these models' logits by far
 * more. */
static void test_rope_pairing_and_window_change_logits_far_beyond_the_bound(void **state)
{
    (void)state;
    spec sp = {.arch = "llama",
               .dim = 64,
               .hidden = 96,
               .layers = 2,
               .heads = 4,
               .kv_heads = 2,
               .context = 512,
               .dtype = PX_DTYPE_F32,
               .seed = 9};
    px_rt_model *adjacent = write_model("pair_adjacent", &sp);
    sp.arch = "qwen2";
    sp.zero_bias = true;
    px_rt_model *halves = write_model("pair_halves", &sp);
    sp.arch = "mistral";
    sp.zero_bias = false;
    sp.window = 4;
    px_rt_model *window = write_model("pair_window", &sp);
    int32_t toks[8] = {17, 200, 3, 99, 45, 250, 8, 120};
    float a[VOCAB], b[VOCAB], c[VOCAB];
    last_logits(adjacent, toks, 8, a);
    last_logits(halves, toks, 8, b);
    last_logits(window, toks, 8, c);
    print_message("adjacent vs halves pairing: %.3g; window 4 vs none: %.3g\n",
                  max_abs_diff(a, b, VOCAB), max_abs_diff(a, c, VOCAB));
    assert_true(max_abs_diff(a, b, VOCAB) > 1e-2);
    assert_true(max_abs_diff(a, c, VOCAB) > 1e-2);
    /* Within the window the two agree exactly. */
    last_logits(adjacent, toks, 4, a);
    last_logits(window, toks, 4, c);
    assert_memory_equal(a, c, sizeof a);
    px_rt_model_free(adjacent);
    px_rt_model_free(halves);
    px_rt_model_free(window);
}

static void test_forward_matches_reference_over_a_long_context(void **state)
{
    (void)state;
    px_rt_model *m = sharp("long", "llama", 64, 96, 2, 8, 4, PX_DTYPE_F32, false);
    px_err err;
    px_rt_session *s;
    /* 300 tokens prefilled in micro-batches of 64, then decoded. */
    px_rt_session_opts so = {.n_threads = 2, .context = 320, .max_batch_tokens = 64};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    px_rt_ref *ref;
    px_assert_ok(px_rt_ref_new(m, 320, &ref, &err), &err);
    int32_t seq;
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    px_rng rng;
    px_rng_seed(&rng, 5);
    int32_t tokens[310];
    for (int i = 0; i < 310; i++)
        tokens[i] = random_token(&rng);
    float ref_logits[VOCAB];
    double max_diff = 0;
    uint32_t pos = 0;
    while (pos < 310) {
        uint32_t n = pos < 300 ? PX_MIN(64u, 300 - pos) : 1;
        px_rt_seq_step step = {.seq = seq, .pos = pos, .n_tokens = n, .tokens = tokens + pos};
        px_rt_batch b = {.n_seqs = 1, .seqs = &step};
        px_rt_output out;
        px_assert_ok(px_rt_forward(s, &b, NULL, &out, &err), &err);
        for (uint32_t t = 0; t < n; t++)
            px_assert_ok(px_rt_ref_forward(ref, tokens[pos + t], pos + t, ref_logits, &err), &err);
        pos += n;
        for (int v = 0; v < VOCAB; v++)
            max_diff = fmax(max_diff, fabs((double)out.data[v] - ref_logits[v]));
    }
    print_message("310 positions: max |cpu - reference| = %.3g\n", max_diff);
    assert_true(max_diff <= 1e-4);
    px_rt_ref_free(ref);
    px_rt_session_free(s);
    px_rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_reference_with_grouped_query_attention),
        cmocka_unit_test(test_forward_matches_reference_with_odd_sizes),
        cmocka_unit_test(test_forward_matches_reference_with_biases_and_halves_rope),
        cmocka_unit_test(test_forward_matches_reference_on_f16_bf16_q8_0_weights),
        cmocka_unit_test(test_forward_matches_reference_with_a_sliding_window),
        cmocka_unit_test(test_rope_pairing_and_window_change_logits_far_beyond_the_bound),
        cmocka_unit_test(test_forward_matches_reference_over_a_long_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
