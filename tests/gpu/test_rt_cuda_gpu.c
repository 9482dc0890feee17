/* The cuda backend on a real GPU (label gpu, `make check-gpu`): greedy
 * tokens identical to the cpu backend for stories260K and aidreams260K in
 * f32 (decode through the matrix-vector kernels and CUDA graphs, prefill
 * through cuBLAS); for every quantized model of ../shared/models/quant/,
 * top-1 agreement and the largest logit difference against the cpu on
 * the same weights dequantized, and against the cpu on the quantized file;
 * the discovery cross-check; and a pipeline of a cuda and a cpu stage
 * whose GPU worker is killed, re-planned onto the cpu with identical
 * greedy tokens.  Every figure is printed.  Without a GPU the whole suite
 * skips (exit 77) saying why. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/hw.h"
#include "plexus/rt.h"

static px_rt_session *session(const px_rt_model *m, const char *backend, uint32_t rows)
{
    px_err err;
    px_rt_session *s = NULL;
    px_rt_session_opts so = {.backend = backend, .max_batch_tokens = rows, .max_logit_rows = rows};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    return s;
}

/* Greedy continuation of prompt[0..n_prompt) to n tokens; one token per
 * step after the prompt.  out has n entries. */
static void greedy(px_rt_session *s, const int32_t *prompt, uint32_t n_prompt, uint32_t n,
                   int32_t *out, uint32_t vocab)
{
    px_err err;
    int32_t seq;
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    memcpy(out, prompt, n_prompt * sizeof *out);
    uint32_t pos = 0, len = n_prompt;
    while (len < n) {
        px_rt_seq_step st = {.seq = seq, .pos = pos, .n_tokens = len - pos, .tokens = out + pos};
        px_rt_batch b = {.n_seqs = 1, .seqs = &st};
        px_rt_output o;
        px_assert_ok(px_rt_forward(s, &b, NULL, &o, &err), &err);
        pos = len;
        out[len++] = px_rt_argmax(o.data, vocab);
    }
    px_assert_ok(px_rt_seq_remove(s, seq, &err), &err);
}

/* Logits of every row of tokens[0..n) in one step (rows > 8: cuBLAS),
 * into out[n * vocab]. */
static void logits_all(px_rt_session *s, const int32_t *tokens, uint32_t n, float *out,
                       const px_ir_hparams *hp)
{
    px_err err;
    int32_t seq;
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = n, .tokens = tokens};
    px_rt_batch b = {.n_seqs = 1, .seqs = &st};
    px_rt_forward_opts fo = {
        .layer_begin = 0, .layer_end = hp->n_layers, .output = PX_RT_OUTPUT_LOGITS_ALL};
    px_rt_output o;
    px_assert_ok(px_rt_forward(s, &b, &fo, &o, &err), &err);
    memcpy(out, o.data, (size_t)n * hp->vocab_size * sizeof *out);
    px_assert_ok(px_rt_seq_remove(s, seq, &err), &err);
}

/* Logits of tokens[0..n) one step per token (the decode path). */
static void logits_steps(px_rt_session *s, const int32_t *tokens, uint32_t n, float *out,
                         uint32_t vocab)
{
    px_err err;
    int32_t seq;
    px_assert_ok(px_rt_seq_add(s, &seq, &err), &err);
    for (uint32_t i = 0; i < n; i++) {
        px_rt_seq_step st = {.seq = seq, .pos = i, .n_tokens = 1, .tokens = tokens + i};
        px_rt_batch b = {.n_seqs = 1, .seqs = &st};
        px_rt_output o;
        px_assert_ok(px_rt_forward(s, &b, NULL, &o, &err), &err);
        memcpy(out + (size_t)i * vocab, o.data, vocab * sizeof *out);
    }
    px_assert_ok(px_rt_seq_remove(s, seq, &err), &err);
}

typedef struct agreement {
    uint32_t top1, rows;
    double max_diff, max_abs;
} agreement;

static agreement compare(const float *a, const float *b, uint32_t rows, uint32_t vocab)
{
    agreement g = {.rows = rows};
    for (uint32_t r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * vocab, *y = b + (size_t)r * vocab;
        g.top1 += px_rt_argmax(x, vocab) == px_rt_argmax(y, vocab);
        for (uint32_t i = 0; i < vocab; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            g.max_diff = isnan(d) ? INFINITY : fmax(g.max_diff, d);
            g.max_abs = fmax(g.max_abs, fabs((double)y[i]));
        }
    }
    return g;
}

static px_rt_model *open_model(const char *rel)
{
    char *path = px_test_shared_model(rel);
    if (!path)
        return NULL;
    px_err err;
    px_rt_model *m = NULL;
    px_status st = px_rt_model_open(path, &m, &err);
    free(path);
    return st == PX_OK ? m : NULL;
}

static void check_greedy(const char *rel)
{
    px_rt_model *m = open_model(rel);
    if (!m)
        fail_msg("%s is missing from ../shared/models", rel);
    const px_ir_hparams *hp = px_rt_model_hparams(m);
    uint32_t vocab = hp->vocab_size, n = PX_MIN(hp->context_length, 120u);
    static const int32_t prompt[] = {1, 403, 407, 261, 378};
    int32_t *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    px_rt_session *cpu = session(m, "cpu", 64), *gpu = session(m, "cuda", 64);
    greedy(cpu, prompt, 5, n, a, vocab);
    greedy(gpu, prompt, 5, n, b, vocab);
    uint32_t same = 0;
    while (same < n && a[same] == b[same])
        same++;
    /* Prefill of the first 40 tokens in one step: the cuBLAS path. */
    uint32_t p = 40;
    float *la = malloc((size_t)p * vocab * sizeof *la),
          *lb = malloc((size_t)p * vocab * sizeof *lb);
    logits_all(cpu, a, p, la, hp);
    logits_all(gpu, a, p, lb, hp);
    agreement g = compare(lb, la, p, vocab);
    printf("gpu: %s f32: greedy %u/%u tokens identical to the cpu; prefill of %u rows: top-1 "
           "%u/%u, max logit diff %.3g (largest logit %.3g)\n",
           rel, same, n, p, g.top1, g.rows, g.max_diff, g.max_abs);
    assert_int_equal(same, n);
    assert_int_equal(g.top1, g.rows);
    assert_true(g.max_diff < 1e-3 * fmax(1.0, g.max_abs));
    px_rt_session_free(cpu);
    px_rt_session_free(gpu);
    px_rt_model_free(m);
    free(a);
    free(b);
    free(la);
    free(lb);
}

static void test_greedy_stories260k_f32(void **state)
{
    (void)state;
    check_greedy("stories260K.bin");
}

static void test_greedy_aidreams260k_f32(void **state)
{
    (void)state;
    check_greedy("aidreams260K/aidreams260K.bin");
}

/* One quantized file against the cpu on its dequantized twin (same
 * weight values in f32: only summation order differs) or, when twin is
 * false, on the f32 model it was quantized from (the weights differ by
 * the quantization), and on itself (the cpu also quantizes activations
 * to 8 bits). */
static void check_format(const char *file, const char *deq, bool twin)
{
    px_rt_model *q = open_model(file), *d = deq ? open_model(deq) : NULL;
    if (!q)
        fail_msg("%s is missing from ../shared/models", file);
    const px_ir_hparams *hp = px_rt_model_hparams(q);
    uint32_t vocab = hp->vocab_size, n = PX_MIN(hp->context_length, 48u);
    int32_t *tokens = calloc(n, sizeof *tokens);
    uint64_t x = 12345;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((x >> 33) % vocab);
    }
    size_t sz = (size_t)n * vocab * sizeof(float);
    float *gpu_all = malloc(sz), *gpu_step = malloc(sz), *cpu_q = malloc(sz), *cpu_d = malloc(sz);
    px_rt_session *g = session(q, "cuda", n), *cq = session(q, "cpu", n);
    logits_all(g, tokens, n, gpu_all, hp);
    logits_steps(g, tokens, n, gpu_step, vocab);
    logits_all(cq, tokens, n, cpu_q, hp);
    agreement vq = compare(gpu_step, cpu_q, n, vocab), self = compare(gpu_all, gpu_step, n, vocab);
    agreement vd = {0};
    if (d) {
        px_rt_session *cd = session(d, "cpu", n);
        logits_all(cd, tokens, n, cpu_d, px_rt_model_hparams(d));
        vd = compare(gpu_step, cpu_d, n, vocab);
        px_rt_session_free(cd);
    }
    printf("gpu: %-26s decode vs cpu on %s: top-1 %u/%u, max logit diff %.3g; vs cpu "
           "on the file: top-1 %u/%u, max diff %.3g; prefill vs decode on the GPU: top-1 %u/%u, "
           "max diff %.3g (largest logit %.3g)\n",
           file, twin ? "dequantized" : "the f32 original", vd.top1, vd.rows, vd.max_diff, vq.top1,
           vq.rows, vq.max_diff, self.top1, self.rows, self.max_diff, vq.max_abs);
    double scale = fmax(1.0, vq.max_abs);
    if (d && twin) {
        /* Same weights, f32 sums: agreement but for near-ties. */
        assert_true(vd.top1 * 20 >= vd.rows * 19);
        assert_true(vd.max_diff < 1e-2 * scale);
    } else if (d) {
        assert_true(vd.top1 * 10 >= vd.rows * 8);
    }
    assert_true(self.top1 * 20 >= self.rows * 19);
    assert_true(self.max_diff < 1e-2 * scale);
    /* The cpu's 8-bit activations move logits further. */
    assert_true(vq.top1 * 10 >= vq.rows * 8);
    px_rt_session_free(g);
    px_rt_session_free(cq);
    px_rt_model_free(q);
    px_rt_model_free(d);
    free(tokens);
    free(gpu_all);
    free(gpu_step);
    free(cpu_q);
    free(cpu_d);
}

static void test_quantized_formats(void **state)
{
    (void)state;
    static const char *const formats[] = {"q2_k", "q3_k_m", "q4_0", "q4_k_m",
                                          "q5_0", "q5_k_m", "q6_k"};
    char file[64], deq[64];
    check_format("quant/synth-f32.gguf", NULL, false);
    check_format("stories260K-q8_0.gguf", "stories260K.gguf", false);
    for (size_t i = 0; i < PX_ARRAY_LEN(formats); i++) {
        snprintf(file, sizeof file, "quant/synth-%s.gguf", formats[i]);
        snprintf(deq, sizeof deq, "quant/synth-%s.deq.gguf", formats[i]);
        check_format(file, deq, true);
    }
}

static void test_device_and_discovery_agree(void **state)
{
    (void)state;
    px_err err;
    px_rt_cuda_info rt;
    px_assert_ok(px_rt_cuda_query(0, &rt, &err), &err);
    char *out = NULL;
    char *const argv[] = {"nvidia-smi", "--query-gpu=" PX_HW_NVIDIA_SMI_QUERY,
                          "--format=csv,noheader,nounits", NULL};
    if (px_test_run(argv, 60, &out, NULL) != 0) {
        printf("gpu: nvidia-smi did not run: cross-check skipped\n");
        free(out);
        return;
    }
    px_hw_nvidia_gpu gpus[16];
    size_t n = 0;
    px_assert_ok(px_hw_parse_nvidia_smi(out, strlen(out), gpus, 16, &n, NULL, &err), &err);
    assert_true(n >= 1);
    px_rt_cuda_info smi = {.memory_total = gpus[0].memory_total,
                           .clock_max_sm = gpus[0].clock_max_sm};
    px_strlcpy(smi.name, gpus[0].name, sizeof smi.name);
    px_strlcpy(smi.capability, gpus[0].capability, sizeof smi.capability);
    px_diags w;
    px_diags_init(&w);
    size_t k = px_rt_cuda_crosscheck(&smi, &rt, 0, &w);
    char *text = px_diags_format(&w, "discovery");
    printf("gpu: %s, %s, %.0f MiB, %d SMs, %.0f MHz (runtime); nvidia-smi: %s, %.0f MiB, %.0f "
           "MHz; %zu mismatch(es)\n%s",
           rt.name, rt.capability, rt.memory_total / 1048576, rt.multiprocessors,
           rt.clock_max_sm / 1e6, smi.name, smi.memory_total / 1048576, smi.clock_max_sm / 1e6, k,
           text ? text : "");
    assert_int_equal(k, 0);
    free(text);
    px_diags_release(&w);
    free(out);

    /* Memory accounting: a session's buffers are what the device holds. */
    px_rt_model *m = open_model("stories260K.bin");
    px_rt_device *dev = NULL;
    px_assert_ok(px_rt_device_open("cuda", NULL, &dev, &err), &err);
    px_rt_session *s = NULL;
    px_rt_session_opts so = {.device = dev};
    px_assert_ok(px_rt_session_new(m, &so, &s, &err), &err);
    px_rt_session_info info;
    px_rt_session_info_get(s, &info);
    uint64_t held = info.weight_bytes + info.kv_bytes + info.scratch_bytes;
    printf("gpu: stories260K session: %llu weight + %llu KV + %llu scratch bytes; the device "
           "accounts %llu (peak %llu), %llu free of %llu\n",
           (unsigned long long)info.weight_bytes, (unsigned long long)info.kv_bytes,
           (unsigned long long)info.scratch_bytes, (unsigned long long)info.device.memory_used,
           (unsigned long long)info.device.memory_peak, (unsigned long long)info.device.memory_free,
           (unsigned long long)info.device.memory_total);
    assert_true(info.weights_copied);
    assert_true(info.device.memory_used >= held);
    assert_true(info.device.memory_used < held + 256ull * 64);
    px_rt_session_free(s);
    px_rt_device_free(dev);
    px_rt_model_free(m);
}

static int run_plexus(const char *const *args, char **out, char **errs)
{
    const char *argv[40];
    size_t n = 0;
    argv[n++] = px_test_plexus_bin();
    for (size_t i = 0; args[i] && n + 1 < PX_ARRAY_LEN(argv); i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return px_test_run((char *const *)argv, 300, out, errs);
}

static char *run_text(const char *const *args)
{
    char *out = NULL, *errs = NULL;
    int rc = run_plexus(args, &out, &errs);
    if (rc != 0)
        fail_msg("plexus exited %d:\n%s\n%s", rc, out ? out : "", errs ? errs : "");
    json_t *j = NULL;
    px_err err;
    px_assert_ok(px_json_parse(out, strlen(out), "run", NULL, &j, &err), &err);
    const json_t *r = json_array_get(json_object_get(j, "results"), 0);
    char *text = strdup(json_string_value(json_object_get(r, "text")));
    json_decref(j);
    free(out);
    free(errs);
    return text;
}

static void test_mixed_pipeline_heals_onto_the_cpu(void **state)
{
    (void)state;
    char *model = px_test_shared_model("stories260K.gguf");
    char *inventory = px_test_source_path("data/scenarios/h200-local.json");
    char *plan = px_asprintf("%s/mixed.json", px_test_tmpdir());
    const char *doc =
        "{\"schema\": \"plexus.plan/1\", \"stages\": ["
        "{\"layers\": {\"first\": 0, \"last\": 2}, \"devices\": [\"local.gpu0\"],"
        " \"backend\": \"cuda\"},"
        "{\"layers\": {\"first\": 3, \"last\": 4}, \"devices\": [\"local.cpu0\"],"
        " \"backend\": \"cpu\"}],"
        /* What healing sizes its checks from (as measured there). */
        " \"predictions\": {\"tpot_s\": {\"p50\": 0.002}, \"ttft_s\": {\"p50\": 0.1}}}";
    /* The same cut with both stages on the cpu: the tokens to match. */
    char *cpu_plan = px_asprintf("%s/cpu.json", px_test_tmpdir());
    const char *cpu_doc = "{\"schema\": \"plexus.plan/1\", \"stages\": ["
                          "{\"layers\": {\"first\": 0, \"last\": 2}, \"devices\": [\"local.cpu0\"],"
                          " \"backend\": \"cpu\"},"
                          "{\"layers\": {\"first\": 3, \"last\": 4}, \"devices\": [\"local.cpu0\"],"
                          " \"backend\": \"cpu\"}]}";
    px_err err;
    px_assert_ok(px_write_file(plan, doc, strlen(doc), &err), &err);
    px_assert_ok(px_write_file(cpu_plan, cpu_doc, strlen(cpu_doc), &err), &err);
    const char *cpu[] = {"run",    "--model", model, "--inventory", inventory,          "--plan",
                         cpu_plan, "-n",      "32",  "--prompt",    "Once upon a time", "-o",
                         "json",   NULL};
    const char *mixed[] = {"run",  "--model", model, "--inventory", inventory,          "--plan",
                           plan,   "-n",      "32",  "--prompt",    "Once upon a time", "-o",
                           "json", NULL};
    const char *healed[] = {"run",
                            "--model",
                            model,
                            "--inventory",
                            inventory,
                            "--plan",
                            plan,
                            "-n",
                            "32",
                            "--prompt",
                            "Once upon a time",
                            "--inject",
                            "kill:stage0@token12",
                            "-o",
                            "json",
                            NULL};
    char *a = run_text(cpu), *b = run_text(mixed), *c = run_text(healed);
    printf("gpu: cpu only:      %s\ngpu: cuda + cpu:    %s\ngpu: GPU killed at token 12, "
           "healed: %s\n",
           a, b, c);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    free(a);
    free(b);
    free(c);
    free(cpu_plan);
    free(plan);
    free(inventory);
    free(model);
}

int main(void)
{
    px_err err;
    if (!px_rt_cuda_built()) {
        printf("gpu suite skipped: this build has no cuda backend (nvcc was not found at "
               "configure time)\n");
        return 77;
    }
    px_rt_cuda_info info;
    if (px_rt_cuda_query(0, &info, &err) != PX_OK) {
        printf("gpu suite skipped: %s\n", err.msg);
        return 77;
    }
    char *probe = px_test_shared_model("stories260K.bin");
    if (!probe) {
        printf("gpu suite skipped: ../shared/models is absent\n");
        return 77;
    }
    free(probe);
    printf("gpu: running on %s (compute capability %s)\n", info.name, info.capability);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_and_discovery_agree),
        cmocka_unit_test(test_greedy_stories260k_f32),
        cmocka_unit_test(test_greedy_aidreams260k_f32),
        cmocka_unit_test(test_quantized_formats),
        cmocka_unit_test(test_mixed_pipeline_heals_onto_the_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
