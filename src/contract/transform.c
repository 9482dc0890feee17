/*
 * Names of the module's enums, the dtype vocabulary, and the parsers of the
 * command-line forms of transformations and devices.
 */
#include "contract/contract_impl.h"

static const char *const req_names[PX_CONTRACT_REQ_COUNT] = {
    "bitwise", "deterministic", "tolerance", "divergence", "agreement", "exact_logits",
};

const char *px_contract_req_name(px_contract_req req)
{
    for (int i = 0; i < PX_CONTRACT_REQ_COUNT; i++)
        if ((unsigned)req == (1u << i))
            return req_names[i];
    return "unknown";
}

static const char *const kind_names[PX_TRANSFORM_COUNT_] = {
    [PX_TRANSFORM_PRECISION] = "precision",       [PX_TRANSFORM_QUANTIZE] = "quantize",
    [PX_TRANSFORM_ALT_KERNEL] = "alt-kernel",     [PX_TRANSFORM_REORDER] = "reorder",
    [PX_TRANSFORM_PLACEMENT] = "placement",       [PX_TRANSFORM_PIPELINE_CUT] = "pipeline-cut",
    [PX_TRANSFORM_TENSOR_SPLIT] = "tensor-split", [PX_TRANSFORM_RECOMPUTE] = "recompute",
    [PX_TRANSFORM_KV_OFFLOAD] = "kv-offload",     [PX_TRANSFORM_FUSION] = "fusion",
};

const char *px_transform_kind_name(px_transform_kind kind)
{
    if ((unsigned)kind >= PX_TRANSFORM_COUNT_)
        return "unknown";
    return kind_names[kind];
}

px_status px_transform_kind_parse(const char *name, px_transform_kind *out)
{
    for (int i = 0; i < PX_TRANSFORM_COUNT_; i++) {
        const char *k = kind_names[i];
        size_t n = strlen(k);
        if (strlen(name) != n)
            continue;
        /* "alt_kernel" and "alt-kernel" are the same name. */
        bool same = true;
        for (size_t j = 0; j < n && same; j++)
            same = name[j] == k[j] || (name[j] == '_' && k[j] == '-');
        if (same) {
            *out = (px_transform_kind)i;
            return PX_OK;
        }
    }
    return PX_ENOTFOUND;
}

const char *px_verdict_name(px_verdict v)
{
    switch (v) {
    case PX_VERDICT_ALLOWED:
        return "allowed";
    case PX_VERDICT_ALLOWED_AFTER_VALIDATION:
        return "allowed-after-validation";
    case PX_VERDICT_FORBIDDEN:
        return "forbidden";
    }
    return "unknown";
}

static const char *const proof_names[PX_PROOF_COUNT_] = {
    [PX_PROOF_NONE] = "none",
    [PX_PROOF_NO_CHANGE] = "no-change",
    [PX_PROOF_IDENTICAL_KERNELS] = "identical-kernels",
    [PX_PROOF_EXACT_TRANSFER] = "exact-transfer",
    [PX_PROOF_OUTPUT_SPLIT] = "output-split",
    [PX_PROOF_SAME_KERNEL_RECOMPUTE] = "same-kernel-recompute",
    [PX_PROOF_EXACT_COPY] = "exact-copy",
    [PX_PROOF_RECORDED_EQUIVALENCE] = "recorded-equivalence",
    [PX_PROOF_DETERMINISTIC_KERNELS] = "deterministic-kernels",
};

const char *px_contract_proof_name(px_contract_proof p)
{
    if ((unsigned)p >= PX_PROOF_COUNT_)
        return "unknown";
    return proof_names[p];
}

static const char *const reason_names[PX_REASON_COUNT_] = {
    [PX_REASON_NONE] = "none",
    [PX_REASON_BITWISE_PRECISION] = "bitwise-precision",
    [PX_REASON_BITWISE_KERNEL] = "bitwise-kernel",
    [PX_REASON_BITWISE_REORDER] = "bitwise-reorder",
    [PX_REASON_BITWISE_NONDETERMINISTIC] = "bitwise-nondeterministic",
    [PX_REASON_NONDETERMINISTIC_KERNEL] = "nondeterministic-kernel",
    [PX_REASON_NONDETERMINISTIC_ORDER] = "nondeterministic-order",
    [PX_REASON_PRECISION_UNBOUNDED] = "precision-unbounded",
};

const char *px_contract_reason_name(px_contract_reason r)
{
    if ((unsigned)r >= PX_REASON_COUNT_)
        return "unknown";
    return reason_names[r];
}

/* ---- Dtypes -------------------------------------------------------- */

static const struct {
    const char *name;
    const char *canonical;
} dtypes[] = {
    {"f64", "f64"},
    {"f32", "f32"},
    {"f16", "f16"},
    {"bf16", "bf16"},
    {"fp8_e4m3", "fp8_e4m3"},
    {"fp8_e5m2", "fp8_e5m2"},
    {"int8", "int8"},
    {"int4", "int4"},
    {"q8_0", "q8_0"},
    {"q8_1", "q8_1"},
    {"q4_0", "q4_0"},
    {"q4_1", "q4_1"},
    {"q5_0", "q5_0"},
    {"q5_1", "q5_1"},
    {"q2_k", "q2_k"},
    {"q3_k", "q3_k"},
    {"q4_k", "q4_k"},
    {"q5_k", "q5_k"},
    {"q6_k", "q6_k"},
    {"q8_k", "q8_k"},
    /* Spellings in common use. */
    {"fp64", "f64"},
    {"fp32", "f32"},
    {"float32", "f32"},
    {"fp16", "f16"},
    {"float16", "f16"},
    {"half", "f16"},
    {"bfloat16", "bf16"},
    {"fp8", "fp8_e4m3"},
    {"e4m3", "fp8_e4m3"},
    {"e5m2", "fp8_e5m2"},
    {"i8", "int8"},
    {"i4", "int4"},
};

const char *px__dtype_canonical(const char *dtype)
{
    if (!dtype)
        return NULL;
    size_t n = strlen(dtype);
    if (n == 0 || n > 16)
        return NULL;
    char lower[17];
    for (size_t i = 0; i <= n; i++) {
        char ch = dtype[i];
        lower[i] = (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
    }
    for (size_t i = 0; i < PX_ARRAY_LEN(dtypes); i++)
        if (!strcmp(dtypes[i].name, lower))
            return dtypes[i].canonical;
    return NULL;
}

bool px_contract_dtype_known(const char *dtype)
{
    return px__dtype_canonical(dtype) != NULL;
}

/* ---- Command-line forms -------------------------------------------- */

static px_status parse_tensors(char *value, unsigned *out, px_err *err)
{
    unsigned t = 0;
    for (char *save = NULL, *part = strtok_r(value, "+", &save); part;
         part = strtok_r(NULL, "+", &save)) {
        if (!strcmp(part, "weights"))
            t |= PX_TENSORS_WEIGHTS;
        else if (!strcmp(part, "activations"))
            t |= PX_TENSORS_ACTIVATIONS;
        else if (!strcmp(part, "kv"))
            t |= PX_TENSORS_KV;
        else
            return px_err_set(err, PX_EINVAL,
                              "targets: unknown tensors \"%.32s\"; use weights, activations and "
                              "kv joined by '+'",
                              part);
    }
    if (!t)
        return px_err_set(err, PX_EINVAL, "targets: name weights, activations or kv");
    *out = t;
    return PX_OK;
}

static px_status parse_dtype_arg(const char *what, const char *value, const char **out, px_err *err)
{
    if (!px__dtype_canonical(value))
        return px_err_set(err, PX_EINVAL,
                          "%s: unknown dtype \"%.32s\"; use f32, f16, bf16, fp8_e4m3, fp8_e5m2, "
                          "int8, int4, q8_0, q4_0, q4_k, ...",
                          what, value);
    *out = value;
    return PX_OK;
}

px_status px_transform_parse(char *spec, px_transform *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    char *save = NULL;
    char *head = strtok_r(spec, ",", &save);
    if (!head)
        return px_err_set(err, PX_EINVAL,
                          "empty transformation; write KIND[:ARG], e.g. quantize:q4_0");
    char *arg = strchr(head, ':');
    if (arg)
        *arg++ = '\0';
    if (px_transform_kind_parse(head, &out->kind) != PX_OK)
        return px_err_set(err, PX_EINVAL,
                          "unknown transformation \"%.32s\"; use precision, quantize, alt-kernel, "
                          "reorder, placement, pipeline-cut, tensor-split, recompute, kv-offload "
                          "or fusion",
                          head);
    px_status st = PX_OK;
    switch (out->kind) {
    case PX_TRANSFORM_PRECISION:
    case PX_TRANSFORM_QUANTIZE:
        if (!arg || !*arg)
            return px_err_set(err, PX_EINVAL, "%s needs the new dtype, e.g. %s:%s", head, head,
                              out->kind == PX_TRANSFORM_QUANTIZE ? "q4_0" : "f16");
        st = parse_dtype_arg(head, arg, &out->to_dtype, err);
        out->tensors = PX_TENSORS_WEIGHTS;
        break;
    case PX_TRANSFORM_PIPELINE_CUT:
    case PX_TRANSFORM_KV_OFFLOAD:
        if (arg && *arg)
            st = parse_dtype_arg(head, arg, &out->to_dtype, err);
        break;
    case PX_TRANSFORM_ALT_KERNEL:
    case PX_TRANSFORM_FUSION:
        if (arg && *arg)
            out->kernel = arg;
        break;
    case PX_TRANSFORM_TENSOR_SPLIT:
        if (!arg || !*arg)
            out->split = PX_SPLIT_UNSPECIFIED;
        else if (!strcmp(arg, "output"))
            out->split = PX_SPLIT_OUTPUT;
        else if (!strcmp(arg, "reduction"))
            out->split = PX_SPLIT_REDUCTION;
        else
            return px_err_set(err, PX_EINVAL,
                              "tensor-split: \"%.32s\" is not a dimension; use output or "
                              "reduction",
                              arg);
        break;
    default:
        if (arg)
            return px_err_set(err, PX_EINVAL, "%s takes no argument (got \"%.32s\")", head, arg);
        break;
    }
    if (st != PX_OK)
        return st;
    for (char *kv = strtok_r(NULL, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *value = strchr(kv, '=');
        if (!value)
            return px_err_set(err, PX_EINVAL,
                              "\"%.32s\": write key=value (targets=, from=, order=)", kv);
        *value++ = '\0';
        if (!strcmp(kv, "targets"))
            st = parse_tensors(value, &out->tensors, err);
        else if (!strcmp(kv, "from"))
            st = parse_dtype_arg("from", value, &out->from_dtype, err);
        else if (!strcmp(kv, "order") && !strcmp(value, "dynamic"))
            out->dynamic_order = true;
        else if (!strcmp(kv, "order") && !strcmp(value, "static"))
            out->dynamic_order = false;
        else if (!strcmp(kv, "order"))
            st = px_err_set(err, PX_EINVAL, "order: use static or dynamic, not \"%.32s\"", value);
        else
            st = px_err_set(err, PX_EINVAL,
                            "unknown key \"%.32s\"; a transformation takes targets=, from= and "
                            "order=",
                            kv);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}

static px_status parse_flag(const char *key, const char *value, bool *out, px_err *err)
{
    if (!value || !strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "1"))
        *out = true;
    else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "0"))
        *out = false;
    else
        return px_err_set(err, PX_EINVAL, "%s: use yes or no, not \"%.32s\"", key, value);
    return PX_OK;
}

px_status px_contract_device_parse(char *spec, px_contract_device *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    char *save = NULL;
    char *id = strtok_r(spec, ",", &save);
    if (!id || strchr(id, '='))
        return px_err_set(err, PX_EINVAL,
                          "a device starts with its id, e.g. gpu0,backend=cuda,arch=sm_90");
    out->id = id;
    for (char *kv = strtok_r(NULL, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *value = strchr(kv, '=');
        if (value)
            *value++ = '\0';
        px_status st = PX_OK;
        if (!strcmp(kv, "backend") && value && *value)
            out->backend = value;
        else if (!strcmp(kv, "vendor") && value && *value)
            out->vendor = value;
        else if (!strcmp(kv, "arch") && value && *value)
            out->arch = value;
        else if (!strcmp(kv, "deterministic"))
            st = parse_flag(kv, value, &out->deterministic, err);
        else if (!strcmp(kv, "emulated"))
            st = parse_flag(kv, value, &out->emulated, err);
        else
            st = px_err_set(err, PX_EINVAL,
                            "device %.32s: \"%.32s\" is not a device property; use backend=, "
                            "vendor=, arch=, deterministic, emulated",
                            id, kv);
        if (st != PX_OK)
            return st;
    }
    return PX_OK;
}
