/* Contracts: the obligation API.  Every transformation kind under every
 * requirement kind, equivalence records, combined verdicts, and the rule
 * that nothing that may change bits is ever allowed under bitwise. */
#include "px_test.h"

#include <string.h>

#include "plexus/contract.h"

/* Devices: two CPUs running identical kernels (an emu device runs the cpu
 * kernels), a GPU with deterministic kernels and one without. */
#define CPU0                                                                    \
    {                                                                           \
        .id = "cpu0", .backend = "cpu", .vendor = "amd", .arch = "x86_64-avx2", \
        .deterministic = true                                                   \
    }
#define EMU1                                                                    \
    {                                                                           \
        .id = "emu1", .backend = "emu", .vendor = "amd", .arch = "x86_64-avx2", \
        .deterministic = true, .emulated = true                                 \
    }
#define GPU0                                                                  \
    {                                                                         \
        .id = "gpu0", .backend = "cuda", .vendor = "nvidia", .arch = "sm_90", \
        .deterministic = true                                                 \
    }
#define GPU1                                                                  \
    {                                                                         \
        .id = "gpu1", .backend = "cuda", .vendor = "nvidia", .arch = "sm_90", \
        .deterministic = false                                                \
    }

static const px_contract_device cpu0 = CPU0;
static const px_contract_device emu1 = EMU1;
static const px_contract_device gpu0 = GPU0;
static const px_contract_device gpu1 = GPU1;

static const px_contract_device dev_cpu0[] = {CPU0};
static const px_contract_device dev_gpu0[] = {GPU0};
static const px_contract_device dev_gpu1[] = {GPU1};
static const px_contract_device dev_cpu0_emu1[] = {CPU0, EMU1};
static const px_contract_device dev_cpu0_gpu0[] = {CPU0, GPU0};

/* One contract per requirement kind, each a lone default clause. */
enum { K_BITWISE, K_DETERMINISTIC, K_TOLERANCE, K_DIVERGENCE, K_AGREEMENT, K_EXACT, K_COUNT };
static const char *const contract_texts[K_COUNT] = {
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true}}",
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"deterministic\": true}}",
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"tolerance\": {\"atol\": 0.001, \"rtol\": "
    "0.01}}}",
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"divergence\": {\"kl_max\": 0.02}}}",
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"agreement\": {\"top1_min\": 0.97}}}",
    "{\"schema\": \"plexus.contract/1\", \"default\": {\"exact_logits\": [{\"tokens\": [1, 403, "
    "407]}]}}",
};
static const px_contract_req contract_reqs[K_COUNT] = {
    PX_CONTRACT_BITWISE,    PX_CONTRACT_DETERMINISTIC, PX_CONTRACT_TOLERANCE,
    PX_CONTRACT_DIVERGENCE, PX_CONTRACT_AGREEMENT,     PX_CONTRACT_EXACT_LOGITS,
};

static px_contract *contracts[K_COUNT];

static int setup(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        px_err err;
        if (px_contract_parse(contract_texts[k], strlen(contract_texts[k]), "k.json", NULL,
                              &contracts[k], &err) != PX_OK) {
            print_error("%s\n", err.msg);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++)
        px_contract_free(contracts[k]);
    return 0;
}

/* A cell: the verdict, and the proof (allowed) or reason (forbidden). */
typedef struct cell {
    px_verdict v;
    int code; /* px_contract_proof or px_contract_reason; unused after validation */
} cell;

#define A(p)                             \
    {                                    \
        PX_VERDICT_ALLOWED, PX_PROOF_##p \
    }
#define AV                                     \
    {                                          \
        PX_VERDICT_ALLOWED_AFTER_VALIDATION, 0 \
    }
#define F(r)                                \
    {                                       \
        PX_VERDICT_FORBIDDEN, PX_REASON_##r \
    }

typedef struct row {
    const char *name;
    px_transform t;
    cell cells[K_COUNT]; /* bitwise, deterministic, tolerance, divergence, agreement, exact */
} row;

#define DEVS(a) .devices = (a), .n_devices = PX_ARRAY_LEN(a)

static const row matrix[] = {
    {"precision f32->fp8 weights",
     {.kind = PX_TRANSFORM_PRECISION,
      .tensors = PX_TENSORS_WEIGHTS,
      .from_dtype = "f32",
      .to_dtype = "fp8_e4m3",
      DEVS(dev_gpu0)},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"precision f16->bf16 activations",
     {.kind = PX_TRANSFORM_PRECISION,
      .tensors = PX_TENSORS_ACTIVATIONS,
      .from_dtype = "f16",
      .to_dtype = "bf16",
      DEVS(dev_cpu0)},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"precision without a stated source dtype",
     {.kind = PX_TRANSFORM_PRECISION,
      .tensors = PX_TENSORS_WEIGHTS,
      .to_dtype = "f32",
      DEVS(dev_cpu0)},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"precision that changes nothing",
     {.kind = PX_TRANSFORM_PRECISION,
      .tensors = PX_TENSORS_WEIGHTS,
      .from_dtype = "fp16",
      .to_dtype = "f16",
      DEVS(dev_gpu1)},
     {A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE)}},
    {"quantize int8",
     {.kind = PX_TRANSFORM_QUANTIZE,
      .tensors = PX_TENSORS_WEIGHTS,
      .from_dtype = "f32",
      .to_dtype = "int8",
      DEVS(dev_cpu0)},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"quantize q4_k on a nondeterministic device",
     {.kind = PX_TRANSFORM_QUANTIZE,
      .tensors = PX_TENSORS_WEIGHTS,
      .to_dtype = "q4_k",
      DEVS(dev_gpu1)},
     {F(BITWISE_PRECISION), F(NONDETERMINISTIC_KERNEL), AV, AV, AV, F(NONDETERMINISTIC_KERNEL)}},
    {"quantize q8_0 of an already q8_0 file",
     {.kind = PX_TRANSFORM_QUANTIZE,
      .tensors = PX_TENSORS_WEIGHTS,
      .from_dtype = "Q8_0",
      .to_dtype = "q8_0",
      DEVS(dev_cpu0)},
     {A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE), A(NO_CHANGE)}},
    {"alternative kernel",
     {.kind = PX_TRANSFORM_ALT_KERNEL, .kernel = "openblas-sgemm", DEVS(dev_cpu0)},
     {F(BITWISE_KERNEL), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"alternative kernel with a runtime-chosen order",
     {.kind = PX_TRANSFORM_ALT_KERNEL, .kernel = "splitk", .dynamic_order = true, DEVS(dev_gpu0)},
     {F(BITWISE_NONDETERMINISTIC), F(NONDETERMINISTIC_ORDER), AV, AV, AV,
      F(NONDETERMINISTIC_ORDER)}},
    {"reorder with a fixed order",
     {.kind = PX_TRANSFORM_REORDER, DEVS(dev_cpu0)},
     {F(BITWISE_REORDER), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"reorder chosen at run time",
     {.kind = PX_TRANSFORM_REORDER, .dynamic_order = true, DEVS(dev_cpu0)},
     {F(BITWISE_NONDETERMINISTIC), F(NONDETERMINISTIC_ORDER), AV, AV, AV,
      F(NONDETERMINISTIC_ORDER)}},
    {"placement between identical kernels (cpu -> emu)",
     {.kind = PX_TRANSFORM_PLACEMENT, DEVS(dev_cpu0_emu1)},
     {A(IDENTICAL_KERNELS), A(IDENTICAL_KERNELS), A(IDENTICAL_KERNELS), A(IDENTICAL_KERNELS),
      A(IDENTICAL_KERNELS), A(IDENTICAL_KERNELS)}},
    {"placement onto other kernels (cpu -> cuda)",
     {.kind = PX_TRANSFORM_PLACEMENT, DEVS(dev_cpu0_gpu0)},
     {F(BITWISE_KERNEL), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"pipeline cut, f32 copy, identical kernels",
     {.kind = PX_TRANSFORM_PIPELINE_CUT,
      .from_dtype = "f32",
      .to_dtype = "f32",
      DEVS(dev_cpu0_emu1)},
     {A(EXACT_TRANSFER), A(EXACT_TRANSFER), A(EXACT_TRANSFER), A(EXACT_TRANSFER), A(EXACT_TRANSFER),
      A(EXACT_TRANSFER)}},
    {"pipeline cut sending f16 activations",
     {.kind = PX_TRANSFORM_PIPELINE_CUT,
      .from_dtype = "f32",
      .to_dtype = "f16",
      DEVS(dev_cpu0_emu1)},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"pipeline cut onto other kernels",
     {.kind = PX_TRANSFORM_PIPELINE_CUT, DEVS(dev_cpu0_gpu0)},
     {F(BITWISE_KERNEL), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"tensor split of the outputs, identical kernels",
     {.kind = PX_TRANSFORM_TENSOR_SPLIT, .split = PX_SPLIT_OUTPUT, DEVS(dev_cpu0_emu1)},
     {A(OUTPUT_SPLIT), A(OUTPUT_SPLIT), A(OUTPUT_SPLIT), A(OUTPUT_SPLIT), A(OUTPUT_SPLIT),
      A(OUTPUT_SPLIT)}},
    {"tensor split of the reduction",
     {.kind = PX_TRANSFORM_TENSOR_SPLIT, .split = PX_SPLIT_REDUCTION, DEVS(dev_cpu0_emu1)},
     {F(BITWISE_REORDER), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"tensor split of an unspecified dimension",
     {.kind = PX_TRANSFORM_TENSOR_SPLIT, DEVS(dev_cpu0_emu1)},
     {F(BITWISE_REORDER), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"recompute with the same kernel",
     {.kind = PX_TRANSFORM_RECOMPUTE, DEVS(dev_cpu0)},
     {A(SAME_KERNEL_RECOMPUTE), A(SAME_KERNEL_RECOMPUTE), A(SAME_KERNEL_RECOMPUTE),
      A(SAME_KERNEL_RECOMPUTE), A(SAME_KERNEL_RECOMPUTE), A(SAME_KERNEL_RECOMPUTE)}},
    {"recompute on a nondeterministic device",
     {.kind = PX_TRANSFORM_RECOMPUTE, DEVS(dev_gpu1)},
     {F(BITWISE_NONDETERMINISTIC), F(NONDETERMINISTIC_KERNEL), AV, AV, AV,
      F(NONDETERMINISTIC_KERNEL)}},
    {"recompute on other kernels",
     {.kind = PX_TRANSFORM_RECOMPUTE, DEVS(dev_cpu0_gpu0)},
     {F(BITWISE_KERNEL), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"KV offload keeping the dtype",
     {.kind = PX_TRANSFORM_KV_OFFLOAD, .from_dtype = "f16", DEVS(dev_gpu1)},
     {A(EXACT_COPY), A(EXACT_COPY), A(EXACT_COPY), A(EXACT_COPY), A(EXACT_COPY), A(EXACT_COPY)}},
    {"KV offload to q8_0",
     {.kind = PX_TRANSFORM_KV_OFFLOAD, .from_dtype = "f16", .to_dtype = "q8_0"},
     {F(BITWISE_PRECISION), F(PRECISION_UNBOUNDED), AV, AV, AV, AV}},
    {"fusion",
     {.kind = PX_TRANSFORM_FUSION, .kernel = "matmul+silu", DEVS(dev_gpu0)},
     {F(BITWISE_KERNEL), A(DETERMINISTIC_KERNELS), AV, AV, AV, AV}},
    {"fusion on a nondeterministic device",
     {.kind = PX_TRANSFORM_FUSION, DEVS(dev_gpu1)},
     {F(BITWISE_NONDETERMINISTIC), F(NONDETERMINISTIC_KERNEL), AV, AV, AV,
      F(NONDETERMINISTIC_KERNEL)}},
};

static void check_cell(const row *r, int k, const px_contract_decision *d)
{
    const cell *want = &r->cells[k];
    const char *kname = px_contract_req_name(contract_reqs[k]);
    if (d->verdict != want->v)
        fail_msg("%s under %s: verdict %s, want %s (%s)", r->name, kname,
                 px_verdict_name(d->verdict), px_verdict_name(want->v), d->message);
    assert_true(strstr(d->message, "layer.3.ffn: ") == d->message);
    switch (want->v) {
    case PX_VERDICT_ALLOWED:
        if ((int)d->proof != want->code)
            fail_msg("%s under %s: proof %s, want %s", r->name, kname,
                     px_contract_proof_name(d->proof),
                     px_contract_proof_name((px_contract_proof)want->code));
        px_assert_contains(d->message, px_contract_proof_name(d->proof));
        assert_int_equal(d->n_obligations, 0);
        assert_int_equal(d->reason, PX_REASON_NONE);
        break;
    case PX_VERDICT_FORBIDDEN:
        if ((int)d->reason != want->code)
            fail_msg("%s under %s: reason %s, want %s (%s)", r->name, kname,
                     px_contract_reason_name(d->reason),
                     px_contract_reason_name((px_contract_reason)want->code), d->message);
        px_assert_contains(d->message, px_contract_reason_name(d->reason));
        px_assert_contains(d->message, "the contract requires");
        assert_int_equal(d->n_obligations, 0);
        assert_int_equal(d->proof, PX_PROOF_NONE);
        break;
    case PX_VERDICT_ALLOWED_AFTER_VALIDATION: {
        /* The obligation spells out metric, bound, inputs and reference. */
        assert_int_equal(d->n_obligations, 1);
        const px_obligation *o = &d->obligations[0];
        assert_int_equal(o->req, contract_reqs[k]);
        assert_int_equal(d->req, contract_reqs[k]);
        assert_string_equal(o->region, "layer.3.ffn");
        assert_string_equal(o->pattern, "default");
        assert_string_equal(o->reference, "scalar-reference");
        px_assert_contains(o->text, "run the reference \"scalar-reference\"");
        switch (contract_reqs[k]) {
        case PX_CONTRACT_TOLERANCE:
            assert_true(o->atol == 0.001 && o->rtol == 0.01);
            assert_int_equal(o->prompts, 16);
            assert_int_equal(o->tokens, 2048);
            px_assert_contains(o->text, "|x - r| <= 0.001 + 0.01 |r|");
            break;
        case PX_CONTRACT_DIVERGENCE:
            assert_true(o->threshold == 0.02);
            px_assert_contains(o->text, "at most 0.02 nats");
            break;
        case PX_CONTRACT_AGREEMENT:
            assert_true(o->threshold == 0.97);
            assert_string_equal(o->prompt_set, "default");
            px_assert_contains(o->text, "16 prompts (2048 token positions)");
            break;
        case PX_CONTRACT_EXACT_LOGITS:
            assert_int_equal(o->n_paths, 1);
            assert_int_equal(o->paths[0].tokens[1], 403);
            assert_int_equal(o->tokens, 3);
            px_assert_contains(o->text, "on the 1 listed path;");
            break;
        default:
            fail_msg("validation under %s", kname);
        }
        break;
    }
    }
}

static void test_every_transformation_under_every_requirement(void **state)
{
    (void)state;
    size_t cells = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(matrix); i++) {
        for (int k = 0; k < K_COUNT; k++) {
            px_contract_decision d;
            px_err err;
            px_assert_ok(
                px_contract_evaluate(contracts[k], "layer.3.ffn", &matrix[i].t, NULL, 0, &d, &err),
                &err);
            check_cell(&matrix[i], k, &d);
            px_contract_decision_release(&d);
            cells++;
        }
    }
    /* Every kind appears in the table. */
    bool seen[PX_TRANSFORM_COUNT_] = {false};
    for (size_t i = 0; i < PX_ARRAY_LEN(matrix); i++)
        seen[matrix[i].t.kind] = true;
    for (int k = 0; k < PX_TRANSFORM_COUNT_; k++)
        if (!seen[k])
            fail_msg("transformation %s has no row", px_transform_kind_name((px_transform_kind)k));
    assert_int_equal(cells, PX_ARRAY_LEN(matrix) * K_COUNT);
}

static void test_bitwise_rejects_fp8_without_proof(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                      .tensors = PX_TENSORS_WEIGHTS | PX_TENSORS_ACTIVATIONS,
                      .from_dtype = "f32",
                      .to_dtype = "fp8",
                      DEVS(dev_gpu0)};
    px_contract_decision d;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.3.attention", &t, NULL, 0, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_string_equal(px_contract_reason_name(d.reason), "bitwise-precision");
    assert_int_equal(d.req, PX_CONTRACT_BITWISE);
    px_assert_contains(d.message, "layer.3.attention: precision change of weights+activations from "
                                  "f32 to fp8 changes bits; the contract requires bitwise");
    px_contract_decision_release(&d);
}

static void test_bitwise_accepts_pipeline_cut_with_identical_kernels(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_PIPELINE_CUT, DEVS(dev_cpu0_emu1)};
    px_contract_decision d;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.2.attention", &t, NULL, 0, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED);
    assert_int_equal(d.proof, PX_PROOF_EXACT_TRANSFER);
    px_assert_contains(d.message, "moves activations bit-exactly");
    px_contract_decision_release(&d);
    /* The same cut is not proven when one side's arch is unknown. */
    px_contract_device unknown[] = {cpu0, emu1};
    unknown[1].arch = NULL;
    t.devices = unknown;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.2.attention", &t, NULL, 0, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_int_equal(d.reason, PX_REASON_BITWISE_KERNEL);
    px_contract_decision_release(&d);
    /* Nor when a side is nondeterministic. */
    unknown[1] = emu1;
    unknown[1].deterministic = false;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.2.attention", &t, NULL, 0, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.reason, PX_REASON_BITWISE_NONDETERMINISTIC);
    px_assert_contains(d.message, "emu1, whose kernels are not deterministic");
    px_contract_decision_release(&d);
}

static void test_tolerance_requires_validation_for_int8(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_QUANTIZE,
                      .tensors = PX_TENSORS_WEIGHTS,
                      .to_dtype = "int8",
                      DEVS(dev_gpu0)};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate(contracts[K_TOLERANCE], "layer.0.ffn", &t, NULL, 0, &d, NULL),
                 (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED_AFTER_VALIDATION);
    assert_int_equal(d.n_obligations, 1);
    assert_int_equal(d.obligations[0].req, PX_CONTRACT_TOLERANCE);
    px_assert_contains(d.message, "is allowed after validation");
    px_assert_contains(d.obligations[0].text,
                       "layer.0.ffn: run the reference \"scalar-reference\" and the candidate on "
                       "16 prompts (2048 token positions) of the set \"default\"");
    px_contract_decision_release(&d);
}

static void test_recorded_equivalence_allows_alternative_kernel_under_bitwise(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_ALT_KERNEL, .kernel = "openblas-sgemm", DEVS(dev_cpu0)};
    /* The record names the device by id only; the other fields of its
     * device entry do not matter. */
    px_contract_device rec_dev = {.id = "cpu0"};
    px_equivalence eq = {.transform = {.kind = PX_TRANSFORM_ALT_KERNEL,
                                       .kernel = "openblas-sgemm",
                                       .devices = &rec_dev,
                                       .n_devices = 1},
                         .region = "layer.*.ffn",
                         .evidence = "trace:7f3a9c"};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate(contracts[K_BITWISE], "layer.3.ffn", &t, &eq, 1, &d, NULL),
                 (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED);
    assert_int_equal(d.proof, PX_PROOF_RECORDED_EQUIVALENCE);
    px_assert_contains(d.message, "evidence trace:7f3a9c");
    px_contract_decision_release(&d);

    /* The record is for ffn regions only. */
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.3.attention", &t, &eq, 1, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    px_contract_decision_release(&d);

    /* Another kernel, another device or another kind is not covered. */
    px_transform other = t;
    other.kernel = "mkl-sgemm";
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.3.ffn", &other, &eq, 1, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    px_contract_decision_release(&d);
    other = t;
    px_contract_device cpu9 = cpu0;
    cpu9.id = "cpu9";
    other.devices = &cpu9;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.3.ffn", &other, &eq, 1, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    px_contract_decision_release(&d);

    /* A record on a nondeterministic device proves nothing about the next
     * run, even with matching ids. */
    px_transform nondet = {
        .kind = PX_TRANSFORM_ALT_KERNEL, .kernel = "openblas-sgemm", DEVS(dev_gpu1)};
    px_contract_device rec_gpu1 = {.id = "gpu1"};
    eq.transform.devices = &rec_gpu1;
    px_assert_ok(
        px_contract_evaluate(contracts[K_BITWISE], "layer.3.ffn", &nondet, &eq, 1, &d, NULL),
        (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_int_equal(d.reason, PX_REASON_BITWISE_NONDETERMINISTIC);
    px_contract_decision_release(&d);

    /* Recorded equivalence also lets fp8 through a bitwise clause. */
    px_transform fp8 = {.kind = PX_TRANSFORM_PRECISION,
                        .tensors = PX_TENSORS_WEIGHTS,
                        .from_dtype = "f32",
                        .to_dtype = "fp8_e4m3",
                        DEVS(dev_gpu0)};
    px_contract_device rec_gpu0 = {.id = "gpu0"};
    px_equivalence eq8 = {.transform = {.kind = PX_TRANSFORM_PRECISION,
                                        .tensors = PX_TENSORS_WEIGHTS,
                                        .from_dtype = "fp32",
                                        .to_dtype = "fp8",
                                        .devices = &rec_gpu0,
                                        .n_devices = 1},
                          .evidence = "report:1"};
    px_assert_ok(px_contract_evaluate(contracts[K_BITWISE], "head", &fp8, &eq8, 1, &d, NULL),
                 (px_err *)NULL);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED);
    assert_int_equal(d.proof, PX_PROOF_RECORDED_EQUIVALENCE);
    px_contract_decision_release(&d);
}

static void test_equivalence_without_evidence_is_refused(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_ALT_KERNEL, DEVS(dev_cpu0)};
    px_equivalence eq = {.transform = t, .evidence = ""};
    px_contract_decision d;
    px_err err;
    assert_int_equal(px_contract_evaluate(contracts[K_BITWISE], "head", &t, &eq, 1, &d, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "has no evidence id");
    eq.evidence = "e1";
    eq.region = "layer..x";
    assert_int_equal(px_contract_evaluate(contracts[K_BITWISE], "head", &t, &eq, 1, &d, &err),
                     PX_EINVAL);
    px_assert_contains(err.msg, "equivalence #0: region");
}

static void test_malformed_transformations_are_refused(void **state)
{
    (void)state;
    static const struct {
        px_transform t;
        const char *region;
        const char *needle;
    } bad[] = {
        {{.kind = PX_TRANSFORM_PRECISION,
          .tensors = PX_TENSORS_WEIGHTS,
          .to_dtype = "f12",
          DEVS(dev_cpu0)},
         "head",
         "unknown dtype \"f12\""},
        {{.kind = PX_TRANSFORM_PRECISION, .tensors = PX_TENSORS_WEIGHTS, DEVS(dev_cpu0)},
         "head",
         "to_dtype is required"},
        {{.kind = PX_TRANSFORM_QUANTIZE, .to_dtype = "q4_0", DEVS(dev_cpu0)},
         "head",
         "say which tensors"},
        {{.kind = PX_TRANSFORM_PLACEMENT, DEVS(dev_cpu0)}, "head", "exactly two devices"},
        {{.kind = PX_TRANSFORM_PIPELINE_CUT, DEVS(dev_cpu0)}, "head", "exactly two devices"},
        {{.kind = PX_TRANSFORM_TENSOR_SPLIT, DEVS(dev_cpu0)}, "head", "at least 2"},
        {{.kind = PX_TRANSFORM_REORDER}, "head", "give the device that runs it"},
        {{.kind = PX_TRANSFORM_COUNT_, DEVS(dev_cpu0)}, "head", "unknown transformation kind"},
        {{.kind = PX_TRANSFORM_REORDER, .n_devices = 2}, "head", "devices is NULL"},
        {{.kind = PX_TRANSFORM_REORDER, DEVS(dev_cpu0)}, "layer.*.ffn", "region name"},
        {{.kind = PX_TRANSFORM_PLACEMENT, .to_dtype = "f16", DEVS(dev_cpu0_emu1)},
         "head",
         "placement: to_dtype has no meaning here"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        px_contract_decision d;
        px_err err;
        assert_int_equal(px_contract_evaluate(contracts[K_TOLERANCE], bad[i].region, &bad[i].t,
                                              NULL, 0, &d, &err),
                         PX_EINVAL);
        px_assert_contains(err.msg, bad[i].needle);
        assert_int_equal(d.n_obligations, 0);
        assert_null(d.obligations);
    }
}

/* Randomized: whatever the transformation, a bitwise clause answers
 * ALLOWED only with a proof, and never for a dtype change, a reduction
 * reorder, another kernel or a nondeterministic device. */
static void test_bitwise_never_allows_a_change_of_bits(void **state)
{
    (void)state;
    const char *dtypes[] = {NULL, "f32", "f16", "bf16", "fp8", "int8", "q4_0", "q8_0"};
    const px_contract_device pool[] = {cpu0, emu1, gpu0, gpu1};
    px_rng rng;
    px_rng_seed(&rng, 7);
    size_t n_allowed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        px_contract_device devs[3];
        size_t n = px_rng_below(&rng, 4);
        for (size_t i = 0; i < n; i++)
            devs[i] = pool[px_rng_below(&rng, PX_ARRAY_LEN(pool))];
        px_transform t = {
            .kind = (px_transform_kind)px_rng_below(&rng, PX_TRANSFORM_COUNT_),
            .tensors = 1u + (unsigned)px_rng_below(&rng, 7),
            .from_dtype = dtypes[px_rng_below(&rng, PX_ARRAY_LEN(dtypes))],
            .to_dtype = dtypes[px_rng_below(&rng, PX_ARRAY_LEN(dtypes))],
            .split = (px_split_dim)px_rng_below(&rng, 3),
            .dynamic_order = px_rng_below(&rng, 4) == 0,
            .devices = n ? devs : NULL,
            .n_devices = n,
        };
        for (int k = 0; k < 2; k++) {
            px_contract_decision d;
            px_err err;
            px_status st = px_contract_evaluate(contracts[k], "layer.1.ffn", &t, NULL, 0, &d, &err);
            if (st != PX_OK) {
                assert_int_equal(st, PX_EINVAL);
                continue;
            }
            bool allowed = d.verdict == PX_VERDICT_ALLOWED;
            px_contract_proof proof = d.proof;
            /* Neither requirement can be validated empirically. */
            assert_true(d.verdict != PX_VERDICT_ALLOWED_AFTER_VALIDATION);
            px_contract_decision_release(&d);
            if (!allowed)
                continue;
            assert_int_not_equal(proof, PX_PROOF_NONE);
            bool same_dtype = t.to_dtype && t.from_dtype && !strcmp(t.to_dtype, t.from_dtype);
            bool nondet = t.dynamic_order;
            for (size_t i = 0; i < n; i++)
                nondet |= !devs[i].deterministic;
            if (k == K_DETERMINISTIC) {
                /* No error bound: no dtype may change. */
                if ((t.kind == PX_TRANSFORM_PRECISION || t.kind == PX_TRANSFORM_QUANTIZE) &&
                    !same_dtype)
                    fail_msg("deterministic allowed a dtype change");
                if (t.kind != PX_TRANSFORM_PRECISION && t.kind != PX_TRANSFORM_QUANTIZE &&
                    t.to_dtype && !same_dtype)
                    fail_msg("deterministic allowed %s to %s", px_transform_kind_name(t.kind),
                             t.to_dtype);
                /* Repeatability: no nondeterminism unless nothing runs. */
                if (nondet &&
                    !(t.kind == PX_TRANSFORM_KV_OFFLOAD ||
                      ((t.kind == PX_TRANSFORM_PRECISION || t.kind == PX_TRANSFORM_QUANTIZE) &&
                       same_dtype)))
                    fail_msg("deterministic allowed %s with nondeterminism",
                             px_transform_kind_name(t.kind));
                continue;
            }
            n_allowed++;
            switch (t.kind) {
            case PX_TRANSFORM_PRECISION:
            case PX_TRANSFORM_QUANTIZE:
                assert_true(same_dtype);
                break;
            case PX_TRANSFORM_KV_OFFLOAD:
                assert_true(!t.to_dtype || same_dtype);
                break;
            case PX_TRANSFORM_ALT_KERNEL:
            case PX_TRANSFORM_REORDER:
            case PX_TRANSFORM_FUSION:
                fail_msg("bitwise allowed %s", px_transform_kind_name(t.kind));
                break;
            default:
                assert_false(nondet);
                assert_true(!t.to_dtype || same_dtype);
                for (size_t i = 1; i < n; i++)
                    assert_string_equal(devs[i].arch, devs[0].arch);
                if (t.kind == PX_TRANSFORM_TENSOR_SPLIT)
                    assert_int_equal(t.split, PX_SPLIT_OUTPUT);
                break;
            }
        }
    }
    assert_true(n_allowed > 100);
}

static void test_mixed_contract_judges_each_region_by_its_clause(void **state)
{
    (void)state;
    const char *text =
        "{\"schema\": \"plexus.contract/1\", \"validation\": {\"prompt_set\": \"stories\","
        " \"prompts\": 4, \"tokens\": 256},"
        " \"default\": {\"deterministic\": true, \"tolerance\": {\"atol\": 1e-5, \"rtol\": 1e-4}},"
        " \"regions\": {\"layer.*.ffn\": {\"divergence\": {\"kl_max\": 0.01}},"
        "  \"head\": {\"bitwise\": true},"
        "  \"embedding\": {\"agreement\": {\"top1_min\": 0.99, \"prompt_set\": \"golden\"}}}}";
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_parse(text, strlen(text), "mixed.json", NULL, &c, &err), &err);
    px_transform q = {.kind = PX_TRANSFORM_QUANTIZE,
                      .tensors = PX_TENSORS_WEIGHTS,
                      .to_dtype = "q4_0",
                      DEVS(dev_gpu0)};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate(c, "layer.5.ffn", &q, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED_AFTER_VALIDATION);
    assert_int_equal(d.obligations[0].req, PX_CONTRACT_DIVERGENCE);
    assert_string_equal(d.obligations[0].pattern, "layer.*.ffn");
    assert_string_equal(d.obligations[0].prompt_set, "stories");
    assert_int_equal(d.obligations[0].prompts, 4);
    px_contract_decision_release(&d);

    px_assert_ok(px_contract_evaluate(c, "head", &q, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    px_assert_contains(d.message, "(clause \"head\")");
    px_contract_decision_release(&d);

    /* deterministic + tolerance: deterministic kernels pass the first,
     * the second needs validation. */
    px_assert_ok(px_contract_evaluate(c, "layer.5.attention", &q, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED_AFTER_VALIDATION);
    assert_int_equal(d.n_obligations, 1);
    assert_int_equal(d.obligations[0].req, PX_CONTRACT_TOLERANCE);
    px_contract_decision_release(&d);
    /* ... and on a nondeterministic device the first forbids it. */
    q.devices = dev_gpu1;
    px_assert_ok(px_contract_evaluate(c, "layer.5.attention", &q, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_int_equal(d.reason, PX_REASON_NONDETERMINISTIC_KERNEL);
    assert_int_equal(d.req, PX_CONTRACT_DETERMINISTIC);
    assert_null(d.obligations);
    px_contract_decision_release(&d);

    /* The agreement clause names its own prompt set. */
    q.devices = dev_gpu0;
    px_assert_ok(px_contract_evaluate(c, "embedding", &q, NULL, 0, &d, &err), &err);
    assert_string_equal(d.obligations[0].prompt_set, "golden");
    px_contract_decision_release(&d);
    px_contract_free(c);
}

static void test_combined_verdict_takes_the_most_restrictive_and_merges_obligations(void **state)
{
    (void)state;
    const char *text =
        "{\"schema\": \"plexus.contract/1\", \"default\": {\"divergence\": {\"kl_max\": 0.05}},"
        " \"regions\": {\"layer.*.attention\": {\"agreement\": {\"top1_min\": 0.9}},"
        "  \"head\": {\"bitwise\": true}}}";
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_parse(text, strlen(text), "comb.json", NULL, &c, &err), &err);
    px_transform ts[] = {
        {.kind = PX_TRANSFORM_QUANTIZE,
         .tensors = PX_TENSORS_WEIGHTS,
         .to_dtype = "q8_0",
         DEVS(dev_gpu0)},
        {.kind = PX_TRANSFORM_PRECISION,
         .tensors = PX_TENSORS_ACTIVATIONS,
         .to_dtype = "f16",
         DEVS(dev_gpu0)},
        {.kind = PX_TRANSFORM_KV_OFFLOAD},
    };
    const char *const regions[] = {"layer.0.ffn", "layer.0.attention", "layer.1.ffn"};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate_all(c, regions, 3, ts, 3, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED_AFTER_VALIDATION);
    /* One obligation per region and requirement, not per transformation. */
    assert_int_equal(d.n_obligations, 3);
    assert_string_equal(d.obligations[0].region, "layer.0.ffn");
    assert_int_equal(d.obligations[0].req, PX_CONTRACT_DIVERGENCE);
    assert_string_equal(d.obligations[1].region, "layer.0.attention");
    assert_int_equal(d.obligations[1].req, PX_CONTRACT_AGREEMENT);
    assert_string_equal(d.obligations[2].region, "layer.1.ffn");
    px_assert_contains(d.message, "3 of 9 transformation-region pairs proven, 3 obligations");
    px_contract_decision_release(&d);

    /* Adding the head makes it forbidden, naming the pair that decided. */
    const char *const with_head[] = {"layer.0.ffn", "head"};
    px_assert_ok(px_contract_evaluate_all(c, with_head, 2, ts, 3, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_int_equal(d.reason, PX_REASON_BITWISE_PRECISION);
    px_assert_contains(d.message, "head: quantization of weights to q8_0 changes bits");
    assert_int_equal(d.n_obligations, 0);
    px_contract_decision_release(&d);

    /* Only proven transformations: allowed, with the first proof. */
    px_assert_ok(px_contract_evaluate_all(c, with_head, 2, &ts[2], 1, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_ALLOWED);
    assert_int_equal(d.proof, PX_PROOF_EXACT_COPY);
    px_contract_decision_release(&d);

    /* A malformed transformation anywhere fails the whole evaluation. */
    px_transform bad = {.kind = PX_TRANSFORM_PLACEMENT};
    px_transform mixed[] = {ts[0], bad};
    assert_int_equal(px_contract_evaluate_all(c, regions, 3, mixed, 2, NULL, 0, &d, &err),
                     PX_EINVAL);
    assert_null(d.obligations);
    px_contract_free(c);
}

static void test_decision_json_names_verdict_proof_reason_and_obligations(void **state)
{
    (void)state;
    px_transform t = {.kind = PX_TRANSFORM_QUANTIZE,
                      .tensors = PX_TENSORS_WEIGHTS,
                      .to_dtype = "q4_0",
                      DEVS(dev_cpu0)};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate(contracts[K_EXACT], "head", &t, NULL, 0, &d, NULL),
                 (px_err *)NULL);
    json_t *j = px_contract_decision_to_json(&d);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "verdict")),
                        "allowed-after-validation");
    json_t *o = json_array_get(json_object_get(j, "obligations"), 0);
    assert_string_equal(json_string_value(json_object_get(o, "requirement")), "exact_logits");
    json_t *path = json_array_get(json_object_get(o, "paths"), 0);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(path, "tokens"), 2)), 407);
    json_decref(j);
    px_contract_decision_release(&d);

    px_assert_ok(px_contract_evaluate(contracts[K_BITWISE], "head", &t, NULL, 0, &d, NULL),
                 (px_err *)NULL);
    j = px_contract_decision_to_json(&d);
    assert_string_equal(json_string_value(json_object_get(j, "reason")), "bitwise-precision");
    assert_string_equal(json_string_value(json_object_get(j, "requirement")), "bitwise");
    assert_null(json_object_get(j, "proof"));
    json_decref(j);
    px_contract_decision_release(&d);

    t = (px_transform){.kind = PX_TRANSFORM_RECOMPUTE, DEVS(dev_cpu0)};
    px_assert_ok(px_contract_evaluate(contracts[K_BITWISE], "head", &t, NULL, 0, &d, NULL),
                 (px_err *)NULL);
    j = px_contract_decision_to_json(&d);
    assert_string_equal(json_string_value(json_object_get(j, "proof")), "same-kernel-recompute");
    assert_int_equal(json_array_size(json_object_get(j, "obligations")), 0);
    json_decref(j);
    px_contract_decision_release(&d);
    px_contract_decision_release(NULL);
}

static void test_implied_deterministic_contract_never_lowers_precision(void **state)
{
    (void)state;
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_builtin("deterministic", &c, &err), &err);
    px_transform t = {.kind = PX_TRANSFORM_PRECISION,
                      .tensors = PX_TENSORS_KV,
                      .from_dtype = "f32",
                      .to_dtype = "f16",
                      DEVS(dev_gpu0)};
    px_contract_decision d;
    px_assert_ok(px_contract_evaluate(c, "layer.0.attention", &t, NULL, 0, &d, &err), &err);
    assert_int_equal(d.verdict, PX_VERDICT_FORBIDDEN);
    assert_string_equal(px_contract_reason_name(d.reason), "precision-unbounded");
    px_assert_contains(d.message, "no requirement of the clause bounds the error");
    px_contract_decision_release(&d);
    px_contract_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_transformation_under_every_requirement),
        cmocka_unit_test(test_bitwise_rejects_fp8_without_proof),
        cmocka_unit_test(test_bitwise_accepts_pipeline_cut_with_identical_kernels),
        cmocka_unit_test(test_tolerance_requires_validation_for_int8),
        cmocka_unit_test(test_implied_deterministic_contract_never_lowers_precision),
        cmocka_unit_test(test_recorded_equivalence_allows_alternative_kernel_under_bitwise),
        cmocka_unit_test(test_equivalence_without_evidence_is_refused),
        cmocka_unit_test(test_malformed_transformations_are_refused),
        cmocka_unit_test(test_bitwise_never_allows_a_change_of_bits),
        cmocka_unit_test(test_mixed_contract_judges_each_region_by_its_clause),
        cmocka_unit_test(test_combined_verdict_takes_the_most_restrictive_and_merges_obligations),
        cmocka_unit_test(test_decision_json_names_verdict_proof_reason_and_obligations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
