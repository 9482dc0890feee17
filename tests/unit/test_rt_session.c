/* Sessions and steps: layer ranges that compose into the whole model bit
 * for bit (pipeline stages), rewinding a sequence, prompts packed into
 * micro-batches by px_rt_generate, hostile batches and options, sequence
 * slots, and a forward step that allocates nothing. */
#include "px_test.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "plexus/rt.h"

/* ------------------------------------------------------------------ */
/* Counting allocations                                                */
/* ------------------------------------------------------------------ */

static atomic_bool counting;
static atomic_long n_allocs;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PX_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PX_TEST_ASAN 1
#endif
#endif

#ifdef PX_TEST_ASAN
/* A sanitizer (address or thread) owns malloc; it reports each
 * allocation to a hook. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static void on_malloc(const volatile void *p, size_t n)
{
    (void)p;
    (void)n;
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
}
static void on_free(const volatile void *p)
{
    (void)p;
}
static void count_allocations_setup(void)
{
    __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
/* glibc: this executable's allocation functions take precedence over the
 * C library's for every caller, and forward to the C library's own. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);
static void counted(void)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
}
void *malloc(size_t n)
{
    counted();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size)
{
    counted();
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n)
{
    counted();
    return __libc_realloc(p, n);
}
void free(void *p)
{
    __libc_free(p);
}
void *memalign(size_t align, size_t n)
{
    counted();
    return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n)
{
    counted();
    return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    counted();
    *out = __libc_memalign(align, n);
    return *out ? 0 : ENOMEM;
}
static void count_allocations_setup(void)
{
}
#endif

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

static px_rt_model *small_llama(void)
{
    return synth("small", PX_IR_ARCH_LLAMA, 64, 96, 2, 8, 4, PX_DTYPE_F32, false, 512);
}

/* ------------------------------------------------------------------ */
/* Layer ranges, rewinding                                             */
/* ------------------------------------------------------------------ */

static void test_forward_layer_ranges_compose_bit_for_bit(void **state)
{
    (void)state;
    px_rt_model *m = synth("deep", PX_IR_ARCH_LLAMA, 64, 96, 4, 8, 4, PX_DTYPE_F32, false, 512);
    px_err err;
    /* The whole model, and three stages: [0, 1), [1, 3), [3, 4). */
    px_rt_session *whole, *st[3];
    uint32_t cuts[4] = {0, 1, 3, 4};
    px_rt_session_opts so = {.n_threads = 2, .max_seqs = 2, .context = 32};
    px_assert_ok(px_rt_session_new(m, &so, &whole, &err), &err);
    for (int i = 0; i < 3; i++) {
        so.layer_begin = cuts[i];
        so.layer_end = cuts[i + 1];
        px_assert_ok(px_rt_session_new(m, &so, &st[i], &err), &err);
        px_rt_session_info info;
        px_rt_session_info_get(st[i], &info);
        assert_int_equal(info.layer_begin, cuts[i]);
        assert_false(info.weights_copied);
    }
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
    for (int step = 0; step < 3; step++) {
        uint32_t na = step == 0 ? 6 : 1, nb = step == 0 ? 2 : 1;
        uint32_t pa = step == 0 ? 0 : 5 + (uint32_t)step, pb = step == 0 ? 0 : 1 + (uint32_t)step;
        px_rt_seq_step steps[2] = {{.seq = 0, .pos = pa, .n_tokens = na, .tokens = a},
                                   {.seq = 1, .pos = pb, .n_tokens = nb, .tokens = b}};
        if (step == 0) {
            int32_t id;
            px_assert_ok(px_rt_seq_add(whole, &id, &err), &err);
            px_assert_ok(px_rt_seq_add(whole, &id, &err), &err);
            for (int i = 0; i < 3; i++) {
                px_assert_ok(px_rt_seq_add(st[i], &id, &err), &err);
                px_assert_ok(px_rt_seq_add(st[i], &id, &err), &err);
            }
        }
        px_rt_batch batch = {.n_seqs = 2, .seqs = steps};
        px_rt_output want, got;
        px_assert_ok(px_rt_forward(whole, &batch, NULL, &want, &err), &err);
        float *copy = malloc(want.n_rows * want.row_len * sizeof(float));
        memcpy(copy, want.data, want.n_rows * want.row_len * sizeof(float));
        /* Stage 1 embeds and hands on hidden states; stage 3 ends in logits. */
        px_assert_ok(px_rt_forward(st[0], &batch, NULL, &got, &err), &err);
        assert_int_equal(got.row_len, 64);
        assert_int_equal(got.n_rows, na + nb);
        px_rt_seq_step hs[2] = {steps[0], steps[1]};
        hs[0].tokens = hs[1].tokens = NULL;
        for (int i = 1; i < 3; i++) {
            float *hidden = malloc(got.n_rows * got.row_len * sizeof(float));
            memcpy(hidden, got.data, got.n_rows * got.row_len * sizeof(float));
            px_rt_batch hb = {.n_seqs = 2, .seqs = hs, .hidden = hidden};
            px_assert_ok(px_rt_forward(st[i], &hb, NULL, &got, &err), &err);
            free(hidden);
        }
        assert_int_equal(got.n_rows, 2);
        assert_int_equal(got.row_len, 300);
        assert_memory_equal(got.data, copy, 2 * 300 * sizeof(float));
        free(copy);
        a[0] = 9 + step;
        b[0] = 20 + step;
    }
    px_rt_session_free(whole);
    for (int i = 0; i < 3; i++)
        px_rt_session_free(st[i]);
    px_rt_model_free(m);
}

static void test_forward_rewinding_recomputes_the_same_logits(void **state)
{
    (void)state;
    px_rt_model *m = small_llama();
    px_err err;
    px_rt_session *s;
    px_assert_ok(
        px_rt_session_new(m, &(px_rt_session_opts){.n_threads = 2, .context = 16}, &s, &err), &err);
    int32_t seq, toks[6] = {5, 6, 7, 8, 9, 10};
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    float at3[VOCAB];
    for (uint32_t p = 0; p < 6; p++) {
        px_rt_seq_step st = {.seq = seq, .pos = p, .n_tokens = 1, .tokens = &toks[p]};
        px_rt_output out;
        px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err),
                     &err);
        if (p == 3)
            memcpy(at3, out.data, sizeof at3);
    }
    assert_int_equal(px_rt_seq_len(s, seq), 6);
    px_rt_seq_step st = {.seq = seq, .pos = 3, .n_tokens = 1, .tokens = &toks[3]};
    px_rt_output out;
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = &st}, NULL, &out, &err),
                 &err);
    assert_memory_equal(out.data, at3, sizeof at3);
    assert_int_equal(px_rt_seq_len(s, seq), 4);
    px_rt_session_free(s);
    px_rt_model_free(m);
}

/* ------------------------------------------------------------------ */
/* Generation                                                          */
/* ------------------------------------------------------------------ */

typedef struct produced {
    int32_t ids[3][16];
    uint32_t n[3];
} produced;

static void record(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    (void)piece;
    (void)len;
    produced *p = ud;
    if (p->n[prompt] < 16)
        p->ids[prompt][p->n[prompt]++] = token;
}

static void generate_with(const px_rt_model *m, uint32_t max_batch_tokens, produced *p,
                          px_rt_generate_stats *st)
{
    px_err err;
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(px_rt_model_ir(m)), &t, &err), &err);
    px_rt_session *s;
    px_rt_session_opts so = {
        .n_threads = 2, .max_seqs = 3, .context = 64, .max_batch_tokens = max_batch_tokens};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    static const char *const prompts[] = {"hello there", "a", "the quick brown fox"};
    memset(p, 0, sizeof *p);
    px_rt_generate_opts go = {.prompts = prompts,
                              .n_prompts = 3,
                              .max_new_tokens = 12,
                              .ignore_eos = true,
                              .on_token = record,
                              .ud = p};
    px_assert_ok(px_rt_generate(s, t, &go, st, &err), &err);
    /* The session is left without sequences. */
    for (int32_t i = 0; i < 3; i++)
        assert_int_equal(px_rt_seq_len(s, i), -1);
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
}

static void test_generate_packs_prompts_into_micro_batches(void **state)
{
    (void)state;
    px_rt_model *m = small_llama();
    produced wide, narrow;
    px_rt_generate_stats sw, sn;
    /* Steps of up to 512 rows (one prefill step), and of 3 rows (prompts
     * split across steps and sharing steps). */
    generate_with(m, 512, &wide, &sw);
    generate_with(m, 3, &narrow, &sn);
    /* BOS + one token per byte of the byte-level vocabulary. */
    assert_int_equal(sw.prompt_tokens, (1 + 11) + (1 + 1) + (1 + 19));
    assert_int_equal(sn.prompt_tokens, sw.prompt_tokens);
    assert_int_equal(sw.new_tokens, 36);
    assert_int_equal(sw.decode_tokens, 33);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wide.n[i], 12);
        assert_int_equal(narrow.n[i], 12);
        assert_memory_equal(wide.ids[i], narrow.ids[i], 12 * sizeof(int32_t));
    }
    /* More prompts than slots wait their turn: the second runs when the
     * first is done. */
    px_err err;
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(px_rt_model_ir(m)), &t, &err), &err);
    px_rt_session *s;
    px_assert_ok(px_rt_session_new(m, &(px_rt_session_opts){.max_seqs = 1, .context = 8}, &s, &err),
                 &err);
    const char *two[] = {"a", "b"};
    px_rt_generate_stats s2;
    px_rt_generate_opts go = {
        .prompts = two, .n_prompts = 2, .max_new_tokens = 4, .ignore_eos = true};
    px_assert_ok(px_rt_generate(s, t, &go, &s2, &err), &err);
    assert_int_equal(s2.new_tokens, 8);
    /* A prompt past the context is refused. */
    const char *longer[] = {"far more than eight"};
    go = (px_rt_generate_opts){.prompts = longer, .n_prompts = 1, .max_new_tokens = 4};
    assert_int_equal(px_rt_generate(s, t, &go, NULL, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "the context holds 8");
    /* A prompt that fills the context still yields one token, then stops. */
    produced p = {0};
    const char *full[] = {"abcdefg"};
    px_rt_generate_stats st;
    go = (px_rt_generate_opts){.prompts = full,
                               .n_prompts = 1,
                               .max_new_tokens = 4,
                               .ignore_eos = true,
                               .on_token = record,
                               .ud = &p};
    px_assert_ok(px_rt_generate(s, t, &go, &st, &err), &err);
    assert_int_equal(st.new_tokens, 1);
    assert_int_equal(st.n_stopped_at_context, 1);
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
}

/* Prompts the caller has encoded are generated from as given, not encoded
 * again: the texts beside them here say something else. */
static void test_generate_uses_the_prompt_tokens_given(void **state)
{
    (void)state;
    px_rt_model *m = small_llama();
    produced from_text;
    px_rt_generate_stats st;
    generate_with(m, 512, &from_text, &st);
    px_err err;
    px_rt_tokenizer *t;
    px_assert_ok(px_rt_tokenizer_new(px_ir_model_vocab(px_rt_model_ir(m)), &t, &err), &err);
    static const char *const texts[] = {"hello there", "a", "the quick brown fox"};
    static const char *const other[] = {"zzz", "q", "not this one"};
    int32_t ids[3][32];
    size_t n_ids[3];
    const int32_t *tokens[3];
    for (int i = 0; i < 3; i++) {
        px_assert_ok(px_rt_tokenizer_encode(t, texts[i], strlen(texts[i]), PX_RT_ENCODE_BOS, ids[i],
                                            32, &n_ids[i], &err),
                     &err);
        tokens[i] = ids[i];
    }
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = 2, .max_seqs = 3, .context = 64};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    produced p = {0};
    px_rt_generate_opts go = {.prompts = other,
                              .n_prompts = 3,
                              .prompt_tokens = tokens,
                              .n_prompt_tokens = n_ids,
                              .max_new_tokens = 12,
                              .ignore_eos = true,
                              .on_token = record,
                              .ud = &p};
    px_rt_generate_stats sg;
    px_assert_ok(px_rt_generate(s, t, &go, &sg, &err), &err);
    assert_int_equal(sg.prompt_tokens, st.prompt_tokens);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(p.n[i], 12);
        assert_memory_equal(p.ids[i], from_text.ids[i], 12 * sizeof(int32_t));
    }
    /* Given tokens longer than the context are refused as text is. */
    px_rt_session_free(s);
    px_assert_ok(px_rt_session_new(m, &(px_rt_session_opts){.max_seqs = 3, .context = 8}, &s, &err),
                 &err);
    go.on_token = NULL;
    assert_int_equal(px_rt_generate(s, t, &go, NULL, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "the context holds 8");
    /* Tokens without their counts are refused, naming both fields. */
    go.n_prompt_tokens = NULL;
    assert_int_equal(px_rt_generate(s, t, &go, NULL, &err), PX_EINVAL);
    px_assert_contains(err.msg, "n_prompt_tokens");
    px_rt_session_free(s);
    px_rt_tokenizer_free(t);
    px_rt_model_free(m);
}

/* ------------------------------------------------------------------ */
/* Hostile input                                                       */
/* ------------------------------------------------------------------ */

static void expect_forward_error(px_rt_session *s, const px_rt_batch *b,
                                 const px_rt_forward_opts *o, px_status code, const char *needle)
{
    px_err err;
    px_rt_output out;
    px_status st = px_rt_forward(s, b, o, &out, &err);
    if (st != code)
        fail_msg("expected %s, got %s: %s", px_status_name(code), px_status_name(st), err.msg);
    px_assert_contains(err.msg, needle);
}

static void test_forward_rejects_bad_batches_with_clear_errors(void **state)
{
    (void)state;
    px_rt_model *m = small_llama();
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = 2, .max_seqs = 2, .context = 16, .max_batch_tokens = 8};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    int32_t a, b;
    px_assert_ok(px_rt_seq_add(s, &a, &err), &err);
    px_assert_ok(px_rt_seq_add(s, &b, &err), &err);
    int32_t toks[20] = {0}, bad = 300, neg = -1;
    px_rt_seq_step st[2] = {{.seq = a, .n_tokens = 1, .tokens = toks},
                            {.seq = a, .n_tokens = 1, .tokens = toks}};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 2, .seqs = st}, NULL, PX_EINVAL,
                         "appears twice");
    st[0].seq = 7;
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL,
                         "no sequence 7");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 3, .n_tokens = 1, .tokens = toks};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL, "gap");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 1, .tokens = &bad};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL,
                         "outside the vocabulary");
    st[0].tokens = &neg;
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL,
                         "outside the vocabulary");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 9, .tokens = toks};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_ELIMIT,
                         "max_batch_tokens");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 0, .tokens = toks};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL,
                         "n_tokens is 0");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 1, .tokens = NULL};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_EINVAL,
                         "neither tokens nor hidden");
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 0, .seqs = st}, NULL, PX_EINVAL,
                         "no sequences");
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 1, .tokens = toks};
    px_rt_forward_opts fo = {.layer_begin = 0, .layer_end = 1, .output = PX_RT_OUTPUT_LOGITS_LAST};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, &fo, PX_EINVAL,
                         "logits need the layers up to the last");
    fo = (px_rt_forward_opts){.layer_begin = 1, .layer_end = 2, .output = PX_RT_OUTPUT_HIDDEN};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, &fo, PX_EINVAL,
                         "takes hidden states, not tokens");
    fo = (px_rt_forward_opts){.layer_begin = 0, .layer_end = 5, .output = PX_RT_OUTPUT_HIDDEN};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, &fo, PX_EINVAL,
                         "outside the session");
    fo = (px_rt_forward_opts){.layer_begin = 0, .layer_end = 2, .output = PX_RT_OUTPUT_LOGITS_ALL};
    st[0].n_tokens = 3;
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, &fo, PX_ELIMIT,
                         "max_logit_rows");
    /* Past the context: fill 14 positions, then ask for 3 more. */
    st[0] = (px_rt_seq_step){.seq = a, .pos = 0, .n_tokens = 8, .tokens = toks};
    px_rt_output out;
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, &out, &err), &err);
    st[0] = (px_rt_seq_step){.seq = a, .pos = 8, .n_tokens = 6, .tokens = toks};
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, &out, &err), &err);
    st[0] = (px_rt_seq_step){.seq = a, .pos = 14, .n_tokens = 3, .tokens = toks};
    expect_forward_error(s, &(px_rt_batch){.n_seqs = 1, .seqs = st}, NULL, PX_ELIMIT,
                         "pass the context of 16");
    /* Failed steps leave lengths alone; sequences still work. */
    assert_int_equal(px_rt_seq_len(s, a), 14);
    assert_int_equal(px_rt_seq_len(s, b), 0);
    st[0] = (px_rt_seq_step){.seq = b, .pos = 0, .n_tokens = 2, .tokens = toks};
    st[1] = (px_rt_seq_step){.seq = a, .pos = 14, .n_tokens = 2, .tokens = toks};
    px_assert_ok(px_rt_forward(s, &(px_rt_batch){.n_seqs = 2, .seqs = st}, NULL, &out, &err), &err);
    assert_int_equal(out.n_rows, 2);
    px_rt_session_free(s);
    px_rt_model_free(m);
}

static void test_session_rejects_presets_unsupported_models_and_bad_options(void **state)
{
    (void)state;
    px_err err;
    px_ir_model *preset;
    px_assert_ok(px_ir_preset_new(px_ir_preset_at(0)->name, PX_DTYPE_COUNT_, NULL, &preset, &err),
                 &err);
    px_rt_model *m;
    assert_int_equal(px_rt_model_new(preset, &m, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "preset");
    px_ir_model_free(preset);

    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.arch = PX_IR_ARCH_MIXTRAL;
    o.n_experts = 4;
    o.n_experts_used = 2;
    char *path = px_asprintf("%s/moe.gguf", px_test_tmpdir());
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    assert_int_equal(px_rt_model_open(path, &m, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "mixtral");
    free(path);

    m = small_llama();
    px_rt_session *s;
    assert_int_equal(
        px_rt_session_new(m, &(px_rt_session_opts){.layer_begin = 2, .layer_end = 1}, &s, &err),
        PX_EINVAL);
    px_assert_contains(err.msg, "layers [2, 1)");
    assert_null(s);
    assert_int_equal(px_rt_session_new(m, &(px_rt_session_opts){.layer_end = 3}, &s, &err),
                     PX_EINVAL);
    assert_int_equal(px_rt_session_new(m, &(px_rt_session_opts){.context = 4096}, &s, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "exceeds the model's 512");
    assert_int_equal(px_rt_session_new(m, &(px_rt_session_opts){.backend = "tpu"}, &s, &err),
                     PX_ENOTFOUND);
    px_assert_contains(err.msg, "registered: cpu");
    assert_int_equal(
        px_rt_session_new(m, &(px_rt_session_opts){.max_seqs = 4, .max_logit_rows = 2}, &s, &err),
        PX_EINVAL);

    /* Slots: the lowest free one, a clear error when all are taken. */
    px_assert_ok(px_rt_session_new(m, &(px_rt_session_opts){.max_seqs = 2, .context = 8}, &s, &err),
                 &err);
    int32_t a, b, c;
    px_assert_ok(px_rt_seq_add(s, &a, &err), &err);
    px_assert_ok(px_rt_seq_add(s, &b, &err), &err);
    assert_int_equal(px_rt_seq_add(s, &c, &err), PX_ELIMIT);
    px_assert_ok(px_rt_seq_remove(s, a, &err), &err);
    assert_int_equal(px_rt_seq_remove(s, a, &err), PX_ENOTFOUND);
    assert_int_equal(px_rt_seq_len(s, a), -1);
    px_assert_ok(px_rt_seq_add(s, &c, &err), &err);
    assert_int_equal(c, a);
    px_rt_session_free(s);
    px_rt_session_free(NULL);
    px_rt_model_free(m);
}

/* ------------------------------------------------------------------ */
/* No allocation in the forward pass                                   */
/* ------------------------------------------------------------------ */

static void test_forward_allocates_nothing(void **state)
{
    (void)state;
    count_allocations_setup();
    px_rt_model *m =
        synth("q8alloc", PX_IR_ARCH_LLAMA, 64, 128, 2, 4, 2, PX_DTYPE_Q8_0, false, 512);
    px_err err;
    px_rt_session *s;
    px_rt_session_opts so = {.n_threads = 2, .max_seqs = 3, .context = 200, .max_batch_tokens = 32};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    /* The counter must see allocations at all. */
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, true);
    void *volatile probe = malloc(16); /* volatile: an optimizer may drop the pair */
    free(probe);
    atomic_store(&counting, false);
    assert_int_equal(atomic_load(&n_allocs), 1);

    int32_t seq[3], toks[32];
    for (int i = 0; i < 32; i++)
        toks[i] = i + 3;
    for (int i = 0; i < 3; i++)
        px_assert_ok(px_rt_seq_add(s, &seq[i], &err), &err);
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, true);
    /* Prefill micro-batches (sgemm over dequantised chunks), then batched
     * and single decode steps: 150 steps in all. */
    uint32_t pos[3] = {0};
    for (int step = 0; step < 150; step++) {
        px_rt_seq_step st[3];
        uint32_t n = 0;
        for (int i = 0; i < 3; i++) {
            if (step > 100 && i > 0)
                continue;
            uint32_t k = step < 3 ? 10 : 1;
            st[n++] = (px_rt_seq_step){.seq = seq[i], .pos = pos[i], .n_tokens = k, .tokens = toks};
            pos[i] += k;
        }
        px_rt_output out;
        px_status rc = px_rt_forward(s, &(px_rt_batch){.n_seqs = n, .seqs = st}, NULL, &out, &err);
        if (rc != PX_OK) {
            atomic_store(&counting, false);
            fail_msg("step %d: %s", step, err.msg);
        }
    }
    atomic_store(&counting, false);
    assert_int_equal(atomic_load(&n_allocs), 0);
    px_rt_session_free(s);
    px_rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_layer_ranges_compose_bit_for_bit),
        cmocka_unit_test(test_forward_rewinding_recomputes_the_same_logits),
        cmocka_unit_test(test_generate_packs_prompts_into_micro_batches),
        cmocka_unit_test(test_generate_uses_the_prompt_tokens_given),
        cmocka_unit_test(test_forward_rejects_bad_batches_with_clear_errors),
        cmocka_unit_test(test_session_rejects_presets_unsupported_models_and_bad_options),
        cmocka_unit_test(test_forward_allocates_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
