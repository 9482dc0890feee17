/* `plexus generate`, run as a command: the reference continuation of the
 * real tiny models, JSON output, batches of prompts, seeded sampling on a
 * synthetic model, tokenizer discovery for llama2.c checkpoints, and the
 * refusals (presets, prompts longer than the context, bad usage). */
#include "px_test.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "plexus/ir.h"

#define REFERENCE_TEXT                                                                        \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the " \
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."

typedef struct result {
    int rc;
    char *out, *err;
} result;

static result run(char **argv)
{
    result r;
    r.rc = px_test_run(argv, 120, &r.out, &r.err);
    return r;
}

static void release(result *r)
{
    free(r->out);
    free(r->err);
}

#define PLEXUS (char *)px_test_plexus_bin()

/* A synthetic GGUF model (byte-level vocabulary) in the temporary folder. */
static char *synthetic(uint32_t context)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.context_length = context;
    o.vocab_size = 300;
    char *path = px_asprintf("%s/synth%u.gguf", px_test_tmpdir(), context);
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, path, &err), &err);
    return path;
}

static void test_generate_reproduces_reference_text_from_a_llama2c_checkpoint(void **state)
{
    (void)state;
    /* tok512.bin lies next to the checkpoint: no --tokenizer needed. */
    char *model = px_test_require_shared_model("stories260K.bin");
    char *argv[] = {PLEXUS,   "generate", "--model", model, "--prompt",  "Once upon a time",
                    "--temp", "0",        "-n",      "60",  "--threads", "2",
                    NULL};
    result r = run(argv);
    if (r.rc != 0)
        fail_msg("exit %d: %s", r.rc, r.err);
    if (!px_str_starts_with(r.out, REFERENCE_TEXT))
        fail_msg("expected the reference continuation, got:\n%s", r.out);
    px_assert_contains(r.err, "prefill: 5 tokens");
    px_assert_contains(r.err, "tokens/s");
    release(&r);
    free(model);
}

static void test_generate_prints_json_for_a_gguf_model(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *argv[] = {PLEXUS,   "generate", "--model", model, "--prompt", "Once upon a time",
                    "--temp", "0",        "-n",      "20",  "-o",       "json",
                    NULL};
    result r = run(argv);
    if (r.rc != 0)
        fail_msg("exit %d: %s", r.rc, r.err);
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(r.out, strlen(r.out), "stdout", NULL, &doc, &err), &err);
    assert_string_equal(json_string_value(json_object_get(doc, "schema")), "plexus.generate/1");
    json_t *res = json_array_get(json_object_get(doc, "results"), 0);
    assert_true(px_str_starts_with(json_string_value(json_object_get(res, "text")),
                                   ", there was a little girl named Lily."));
    assert_int_equal(json_array_size(json_object_get(res, "tokens")), 20);
    json_t *decode = json_object_get(doc, "decode"), *prefill = json_object_get(doc, "prefill");
    assert_int_equal(json_integer_value(json_object_get(prefill, "tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(decode, "tokens")), 19);
    assert_true(json_real_value(json_object_get(decode, "tokens_per_second")) > 0);
    json_decref(doc);
    release(&r);
    free(model);
}

static void test_generate_decodes_several_prompts_as_one_batch(void **state)
{
    (void)state;
    char *model = px_test_require_shared_model("stories260K.gguf");
    char *one[] = {PLEXUS,   "generate", "--model", model, "--prompt", "Once upon a time",
                   "--temp", "0",        "-n",      "30",  NULL};
    char *two[] = {PLEXUS,     "generate", "--model", model, "--prompt", "Once upon a time",
                   "--prompt", "The dog",  "--temp",  "0",   "-n",       "30",
                   NULL};
    result a = run(one), b = run(two);
    assert_int_equal(a.rc, 0);
    assert_int_equal(b.rc, 0);
    px_assert_contains(b.out, "--- prompt 1 ---\nOnce upon a time");
    px_assert_contains(b.out, "--- prompt 2 ---\nThe dog");
    /* Batched with another prompt, the first continues exactly as alone. */
    char *first = strstr(b.out, "--- prompt 1 ---\n") + strlen("--- prompt 1 ---\n");
    assert_memory_equal(first, a.out, strlen(a.out) - 1);
    px_assert_contains(b.err, "prefill: 9 tokens");
    release(&a);
    release(&b);
    free(model);
}

static void test_generate_samples_reproducibly_with_a_seed(void **state)
{
    (void)state;
    char *model = synthetic(128);
    char *argv[] = {PLEXUS,   "generate", "--model", model,  "--prompt", "hello",
                    "--seed", "7",        "--temp",  "1.0",  "--top-p",  "0.95",
                    "-n",     "24",       "-o",      "json", NULL};
    result a = run(argv), b = run(argv);
    assert_int_equal(a.rc, 0);
    assert_int_equal(b.rc, 0);
    json_t *ja, *jb;
    px_assert_ok(px_json_parse(a.out, strlen(a.out), "a", NULL, &ja, NULL), (px_err *)NULL);
    px_assert_ok(px_json_parse(b.out, strlen(b.out), "b", NULL, &jb, NULL), (px_err *)NULL);
    json_t *ta = json_object_get(json_array_get(json_object_get(ja, "results"), 0), "tokens");
    json_t *tb = json_object_get(json_array_get(json_object_get(jb, "results"), 0), "tokens");
    assert_true(json_array_size(ta) > 0);
    assert_true(json_equal(ta, tb));
    json_decref(ja);
    json_decref(jb);
    argv[7] = "8";
    result c = run(argv);
    assert_int_equal(c.rc, 0);
    assert_string_not_equal(c.out, a.out);
    release(&a);
    release(&b);
    release(&c);
    free(model);
}

static void test_generate_json_holds_invalid_utf8_as_replacement_characters(void **state)
{
    (void)state;
    char *model = synthetic(128);
    char *argv[] = {PLEXUS, "generate", "--model", model, "--prompt", "ok \xff\xc3", "-n",
                    "40",   "--temp",   "2",       "-o",  "json",     NULL};
    result r = run(argv);
    assert_int_equal(r.rc, 0);
    json_t *doc;
    px_err err;
    px_assert_ok(px_json_parse(r.out, strlen(r.out), "stdout", NULL, &doc, &err), &err);
    json_t *res = json_array_get(json_object_get(doc, "results"), 0);
    assert_string_equal(json_string_value(json_object_get(res, "prompt")),
                        "ok \xef\xbf\xbd\xef\xbf\xbd");
    assert_non_null(json_string_value(json_object_get(res, "text")));
    json_decref(doc);
    release(&r);
    free(model);
}

static void test_generate_refuses_presets_and_prompts_longer_than_the_context(void **state)
{
    (void)state;
    char *preset = (char *)px_ir_preset_at(0)->name;
    char *argv[] = {PLEXUS, "generate", "--model", preset, "--prompt", "hi", NULL};
    result r = run(argv);
    assert_int_equal(r.rc, 1);
    px_assert_contains(r.err, "preset");
    px_assert_contains(r.err, "no weights");
    release(&r);

    char *model = synthetic(16);
    char *long_prompt[] = {PLEXUS, "generate", "--model",
                           model,  "--prompt", "this prompt is far longer than sixteen tokens",
                           NULL};
    r = run(long_prompt);
    assert_int_equal(r.rc, 1);
    px_assert_contains(r.err, "the context holds 16");
    assert_string_equal(r.out, "");
    release(&r);
    free(model);
}

/* A llama2.c checkpoint of zeros (norms of one) with a byte vocabulary. */
static void write_llama2c(const char *dir)
{
    enum { DIM = 8, HID = 16, LAYERS = 1, HEADS = 2, KV = 2, VOC = 259, SEQ = 16 };
    int32_t hdr[7] = {DIM, HID, LAYERS, HEADS, KV, VOC, SEQ};
    size_t n = (size_t)VOC * DIM + LAYERS * (DIM + 4 * DIM * DIM + DIM + 3 * DIM * HID) + DIM +
               SEQ * (DIM / HEADS);
    float *w = calloc(n, sizeof *w);
    /* rms_att and rms_ffn weights of one, and the final norm. */
    for (size_t i = 0; i < DIM; i++) {
        w[VOC * DIM + i] = 1;
        w[VOC * DIM + DIM + 4 * DIM * DIM + i] = 1;
        w[VOC * DIM + 2 * DIM + 4 * DIM * DIM + 3 * DIM * HID + i] = 1;
    }
    char *path = px_asprintf("%s/zero.bin", dir);
    FILE *f = fopen(path, "wb");
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(w, sizeof *w, n, f);
    fclose(f);
    free(path);
    free(w);
}

static void write_tokenizer(const char *path)
{
    FILE *f = fopen(path, "wb");
    int32_t max_len = 7;
    fwrite(&max_len, 4, 1, f);
    for (int i = 0; i < 259; i++) {
        char s[16];
        if (i < 3)
            snprintf(s, sizeof s, "%s", i == 0 ? "<unk>" : i == 1 ? "\n<s>\n" : "\n</s>\n");
        else
            snprintf(s, sizeof s, "<0x%02X>", i - 3);
        float score = 0;
        int32_t len = (int32_t)strlen(s);
        fwrite(&score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(s, 1, (size_t)len, f);
    }
    fclose(f);
}

static void test_generate_finds_or_asks_for_a_llama2c_tokenizer(void **state)
{
    (void)state;
    char *dir = px_asprintf("%s/l2c", px_test_tmpdir());
    mkdir(dir, 0700);
    write_llama2c(dir);
    char *model = px_asprintf("%s/zero.bin", dir);
    char *argv[] = {PLEXUS, "generate", "--model", model, "--prompt", "ab", "-n", "3", NULL};
    result r = run(argv);
    assert_int_equal(r.rc, 1);
    px_assert_contains(r.err, "pass --tokenizer FILE");
    release(&r);

    char *tok = px_asprintf("%s/other-tokenizer.bin", px_test_tmpdir());
    write_tokenizer(tok);
    char *with[] = {PLEXUS, "generate", "--model", model,    "--tokenizer", tok, "--prompt",
                    "ab",   "-n",       "3",       "--temp", "0",           NULL};
    r = run(with);
    if (r.rc != 0)
        fail_msg("exit %d: %s", r.rc, r.err);
    px_assert_contains(r.out, "ab");
    release(&r);

    char *beside = px_asprintf("%s/tok512.bin", dir);
    write_tokenizer(beside);
    r = run(argv);
    if (r.rc != 0)
        fail_msg("exit %d: %s", r.rc, r.err);
    release(&r);
    free(beside);
    free(tok);
    free(model);
    free(dir);
}

static void test_generate_reports_usage_errors(void **state)
{
    (void)state;
    char *help[] = {PLEXUS, "generate", "--help", NULL};
    result r = run(help);
    assert_int_equal(r.rc, 0);
    px_assert_contains(r.out, "usage: plexus generate --model FILE");
    release(&r);
    char *cases[][8] = {
        {PLEXUS, "generate", "--prompt", "x", NULL},
        {PLEXUS, "generate", "--model", "m.gguf", NULL},
        {PLEXUS, "generate", "--model", "m.gguf", "--prompt", "x", "--temp", "-1"},
        {PLEXUS, "generate", "--model", "m.gguf", "--prompt", "x", "--top-p", "2"},
        {PLEXUS, "generate", "--model", "m.gguf", "--prompt", "x", "-n", "ten"},
        {PLEXUS, "generate", "--model", "m.gguf", "--prompt", "x", "--bogus", NULL},
        {PLEXUS, "generate", "--model", "m.gguf", "--prompt", NULL},
    };
    static const char *needles[] = {"--model FILE is required",
                                    "--prompt TEXT is required",
                                    "--temp takes",
                                    "--top-p takes",
                                    "-n/--tokens takes",
                                    "unknown option \"--bogus\"",
                                    "--prompt needs a value"};
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        char *argv[9] = {0};
        memcpy(argv, cases[i], sizeof cases[i]);
        r = run(argv);
        assert_int_equal(r.rc, 2);
        px_assert_contains(r.err, needles[i]);
        release(&r);
    }
    char *missing[] = {PLEXUS, "generate", "--model", "/nonexistent/m.gguf", "--prompt", "x", NULL};
    r = run(missing);
    assert_int_equal(r.rc, 1);
    px_assert_contains(r.err, "/nonexistent/m.gguf");
    release(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_reproduces_reference_text_from_a_llama2c_checkpoint),
        cmocka_unit_test(test_generate_prints_json_for_a_gguf_model),
        cmocka_unit_test(test_generate_decodes_several_prompts_as_one_batch),
        cmocka_unit_test(test_generate_samples_reproducibly_with_a_seed),
        cmocka_unit_test(test_generate_json_holds_invalid_utf8_as_replacement_characters),
        cmocka_unit_test(test_generate_refuses_presets_and_prompts_longer_than_the_context),
        cmocka_unit_test(test_generate_finds_or_asks_for_a_llama2c_tokenizer),
        cmocka_unit_test(test_generate_reports_usage_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
