/* plexus model: inspect model files and presets, write synthetic models. */
#include "cli/cli.h"
#include "plexus/ir.h"

const char px__cmd_model_summary[] =
    "inspect a model (GGUF, llama2.c, preset), write a synthetic one or quantize one";

static px_status parse_dtype(const char *v, void *dest, px_err *err)
{
    return px_dtype_parse(v, dest, err);
}

static px_status parse_arch(const char *v, void *dest, px_err *err)
{
    px_ir_arch *arch = dest;
    if (!strcmp(v, "llama"))
        *arch = PX_IR_ARCH_LLAMA;
    else if (!strcmp(v, "qwen2"))
        *arch = PX_IR_ARCH_QWEN2;
    else if (!strcmp(v, "mixtral"))
        *arch = PX_IR_ARCH_MIXTRAL;
    else
        return px_err_set(err, PX_EINVAL, "takes llama, qwen2 or mixtral, not \"%s\"", v);
    return PX_OK;
}

/* The options of every action; each resets them before parsing. */
typedef struct model_args {
    px_cli_format fmt;
    uint64_t context, batch;
    px_ir_open_opts open;
    px_ir_describe_opts describe;
    px_dtype preset_dtype;
    px_ir_synth_opts synth;
    const char *out, *type;
} model_args;

static model_args M;

#define FORMAT_ROW                                             \
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &M.fmt, "FORMAT", \
               "report format: text (default), json or yaml", .choices = "text|json|yaml")

static const px_cli_opt inspect_opts[] = {
    FORMAT_ROW,
    PX_CLI_OPT("context", 0, PX_CLI_U64, &M.context, "T",
               "context the FLOPs are counted at (default: the model's)", .lo = 1,
               .hi = UINT32_MAX),
    PX_CLI_OPT("batch", 0, PX_CLI_U64, &M.batch, "B", "batch the FLOPs are counted at (default 1)",
               .lo = 1, .hi = 1u << 20),
    PX_CLI_OPT("tokenizer", 0, PX_CLI_STR, &M.open.tokenizer_path, "FILE",
               "attach a llama2.c tokenizer to a llama2.c checkpoint"),
    PX_CLI_OPT("kv-dtype", 0, PX_CLI_CALL, &M.open, "DTYPE",
               "cost the KV cache in another dtype (default: f32 for\n"
               "files, the weights' 16-bit dtype for presets)",
               .parse = px__cli_parse_kv_dtype),
    PX_CLI_OPT("dtype", 0, PX_CLI_CALL, &M.preset_dtype, "DTYPE",
               "store a preset's matrices in another dtype (default\nbf16)", .parse = parse_dtype),
    PX_CLI_OPT("ops", 0, PX_CLI_FLAG, &M.describe.with_ops, NULL,
               "every op with its cost expressions"),
    PX_CLI_OPT("tensors", 0, PX_CLI_FLAG, &M.describe.with_tensors, NULL,
               "every stored tensor (json and yaml only)"),
    {0},
};

#define SYNTH_U32(name, field, what) \
    PX_CLI_OPT(name, 0, PX_CLI_U32, &M.synth.field, "N", what, .lo = 1)
static const px_cli_opt synth_opts[] = {
    PX_CLI_OPT("out", 0, PX_CLI_STR, &M.out, "FILE", "the GGUF file to write",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("arch", 0, PX_CLI_CALL, &M.synth.arch, "ARCH", "llama (default), qwen2 or mixtral",
               .parse = parse_arch),
    SYNTH_U32("dim", dim, "model width (default 64)"),
    SYNTH_U32("hidden", hidden_dim, "feed-forward width (default 172)"),
    SYNTH_U32("layers", n_layers, "layers (default 2)"),
    SYNTH_U32("heads", n_heads, "attention heads (default 8)"),
    SYNTH_U32("kv-heads", n_kv_heads, "key/value heads (default 4)"),
    SYNTH_U32("vocab", vocab_size, "vocabulary size (default 512)"),
    SYNTH_U32("context", context_length, "context length (default 256)"),
    SYNTH_U32("experts", n_experts, "experts (mixtral)"),
    SYNTH_U32("experts-used", n_experts_used, "experts used per token (mixtral)"),
    PX_CLI_OPT("dtype", 0, PX_CLI_CALL, &M.synth.dtype, "DTYPE", "f32 (default), f16, bf16, q8_0",
               .parse = parse_dtype),
    PX_CLI_OPT("tied", 0, PX_CLI_FLAG, &M.synth.tied_classifier, NULL, "omit output.weight"),
    PX_CLI_OPT("no-tokenizer", 0, PX_CLI_FLAG, &M.synth.no_tokenizer, NULL,
               "omit the vocabulary (and allow --vocab below 259)"),
    PX_CLI_OPT("seed", 0, PX_CLI_U64, &M.synth.seed, "S", "weights' seed (default 1)"),
    {0},
};
static const px_cli_opt quantize_opts[] = {
    PX_CLI_OPT("type", 't', PX_CLI_STR, &M.type, "RECIPE", "q8_0, q4_0, q4_k_m, q5_k_m or q6_k",
               .flags = PX_CLI_REQUIRED),
    FORMAT_ROW,
    {0},
};
static const px_cli_opt presets_opts[] = {FORMAT_ROW, {0}};

static const px_cli_spec inspect_spec = {
    .name = "model inspect",
    .summary = "architecture, parameters, bytes, FLOPs, KV cache and regions",
    .synopsis = "FILE|PRESET [options]",
    .about = "Prints the architecture and hyper-parameters; parameters and bytes by dtype;\n"
             "per-layer weight bytes; FLOPs per token for prefill and decode at context T and\n"
             "batch B; KV-cache bytes per token; activation bytes crossing each layer\n"
             "boundary; the regions.  FLOPs count 2 per multiply-add; docs/formats/model-ir.md\n"
             "has the conventions.",
    .opts = inspect_opts,
    .operands = "FILE|PRESET",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus model inspect llama-3-8b\n"
                "plexus model inspect stories260K.gguf -o json --ops\n",
};
static const px_cli_spec synth_spec = {
    .name = "model synth",
    .summary = "write a synthetic llama-family GGUF model",
    .synopsis = "--out FILE [--arch llama|qwen2|mixtral] [options]",
    .about = "Writes a llama-family GGUF model with deterministic random weights (N(0, 0.02),\n"
             "norms 1) and a byte-level vocabulary.",
    .opts = synth_opts,
    .examples = "plexus model synth --out tiny.gguf\n"
                "plexus model synth --out moe.gguf --arch mixtral --experts 4 --experts-used 2\n",
};
static const px_cli_spec quantize_spec = {
    .name = "model quantize",
    .summary = "quantize a GGUF model by llama.cpp's recipes",
    .synopsis = "IN OUT --type q8_0|q4_0|q4_k_m|q5_k_m|q6_k [-o text|json|yaml]",
    .about = "Writes the GGUF model IN (f32, f16 or bf16) to OUT with its matrices quantized by\n"
             "llama.cpp's recipe, blocks made as ggml's reference quantizer makes them; prints\n"
             "the tensors per dtype, the sizes and the RMS error of the quantized values.",
    .opts = quantize_opts,
    .operands = "IN OUT",
    .min_operands = 2,
    .max_operands = 2,
    .examples = "plexus model quantize tiny.gguf tiny-q8.gguf --type q8_0\n",
};
static const px_cli_spec presets_spec = {
    .name = "model presets",
    .summary = "the models known by hyper-parameters alone",
    .synopsis = "[-o text|json|yaml]",
    .about = "Lists the presets: models known by their hyper-parameters alone, for planning\n"
             "without a file.",
    .opts = presets_opts,
    .examples = "plexus model presets\n",
};
const px_cli_spec *const px__cmd_model_specs[] = {&inspect_spec, &synth_spec, &quantize_spec,
                                                  &presets_spec, NULL};

/* "1.18 M", "61.4 G": three significant digits with an SI prefix. */
static void si(uint64_t v, char *buf, size_t n)
{
    static const char *const prefix[] = {"", " k", " M", " G", " T", " P", " E"};
    double x = (double)v;
    int p = 0;
    while (x >= 1000.0 && p < 6) {
        x /= 1000.0;
        p++;
    }
    if (p == 0)
        snprintf(buf, n, "%" PRIu64, v);
    else
        snprintf(buf, n, "%.3g%s", x, prefix[p]);
}

static void bytes(uint64_t v, char *buf, size_t n)
{
    if (v == UINT64_MAX) {
        snprintf(buf, n, "-");
        return;
    }
    si(v, buf, n - 1);
    size_t len = strlen(buf);
    if (len + 2 < n) {
        if (v < 1000)
            buf[len++] = ' ';
        buf[len++] = 'B';
        buf[len] = '\0';
    }
}

static const char *row_label(const px_ir_hparams *hp, uint32_t r, char *buf, size_t n)
{
    if (r == PX_IR_ROW_EMBEDDING)
        return "embedding";
    if (r == PX_IR_ROW_HEAD(hp->n_layers))
        return "head";
    snprintf(buf, n, "layer.%u", r - 1);
    return buf;
}

static bool same_row(const px_ir_layer_cost *a, const px_ir_layer_cost *b)
{
    return a->n_params == b->n_params && a->weight_bytes == b->weight_bytes &&
           a->flops_token == b->flops_token && a->flops_pair == b->flops_pair &&
           a->flops_seq == b->flops_seq && a->kv_bytes_token == b->kv_bytes_token &&
           a->act_bytes_token == b->act_bytes_token;
}

static void print_text(const px_ir_model *m, uint64_t T, uint64_t B)
{
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    bool dit = hp->arch == PX_IR_ARCH_DIT;
    char a[32], b[32], c[32], d[32];
    const char *src = px_ir_model_source(m) == PX_IR_SOURCE_GGUF      ? "gguf"
                      : px_ir_model_source(m) == PX_IR_SOURCE_LLAMA2C ? "llama2.c"
                                                                      : "preset";
    printf("model     %s (%s", px_ir_model_path(m), src);
    if (px_ir_model_gguf_version(m))
        printf(" v%u", px_ir_model_gguf_version(m));
    printf(", %s%s%s)%s\n", px_ir_arch_name(hp->arch), hp->name[0] ? ", " : "", hp->name,
           px_ir_model_has_weights(m) ? "" : " - no weights: plan and simulate only");
    if (dit) {
        printf("shape     dim %u, hidden %u, %u blocks, %u heads (head %u), latent %ux%ux%u, "
               "patch %u, %u classes, %u steps\n",
               hp->dim, hp->hidden_dim, hp->n_layers, hp->n_heads, hp->head_dim, hp->dit_input_size,
               hp->dit_input_size, hp->dit_in_channels, hp->dit_patch_size, hp->dit_n_classes,
               hp->dit_steps);
    } else {
        printf("shape     dim %u, hidden %u, %u layers, %u heads (%u kv, head %u), vocab %u, "
               "context %u\n",
               hp->dim, hp->hidden_dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim,
               hp->vocab_size, hp->context_length);
        printf("details   rope theta %g (%s pairs), rms eps %g, classifier %s%s",
               (double)hp->rope_theta, hp->rope_style == PX_IR_ROPE_HALVES ? "halves" : "adjacent",
               (double)hp->rms_eps, hp->tied_classifier ? "tied" : "untied",
               hp->qkv_bias ? ", q/k/v biases" : "");
        if (hp->sliding_window)
            printf(", window %u", hp->sliding_window);
        if (hp->n_experts)
            printf(", %u experts (%u per token)", hp->n_experts, hp->n_experts_used);
        printf("\n");
    }
    px_ir_totals tot;
    px_ir_model_totals(m, &tot);
    si(tot.n_params, a, sizeof a);
    bytes(tot.weight_bytes, b, sizeof b);
    printf("params    %s (%" PRIu64 ") in %s:", a, tot.n_params, b);
    for (int t = 0; t < PX_DTYPE_COUNT_; t++) {
        if (!tot.params_by_dtype[t])
            continue;
        si(tot.params_by_dtype[t], a, sizeof a);
        bytes(tot.bytes_by_dtype[t], b, sizeof b);
        printf(" %s %s (%s)", px_dtype_name((px_dtype)t), a, b);
    }
    printf("\n");
    const px_ir_layer_cost *rows = px_ir_model_layer_costs(m);
    uint32_t n_rows = px_ir_model_n_rows(m);
    uint64_t dec = 0, pre = 0;
    uint64_t S = dit ? px_ir_model_phase_dims(m, PX_IR_PHASE_DENOISE, 1, 0).S : T;
    for (uint32_t r = 0; r < n_rows; r++) {
        dec += px_ir_decode_flops(&rows[r], T);
        pre += px_ir_prefill_flops(&rows[r], S);
    }
    if (dit) {
        si(pre, a, sizeof a);
        si(pre * hp->dit_steps, b, sizeof b);
        printf("flops     %sFLOP per denoising step over %" PRIu64 " latent tokens, %sFLOP "
               "per sample (%u steps), batch 1\n",
               a, S, b, hp->dit_steps);
    } else {
        /* The dtype the model keeps its cache in: --kv-dtype when given,
         * else the file's or the preset's own. */
        px_dtype kv_dtype = px_ir_model_n_kv(m) ? px_ir_model_kv(m, 0)->dtype : PX_DTYPE_F32;
        uint64_t kv = px_ir_model_kv_bytes_per_token(m, kv_dtype);
        bytes(kv, a, sizeof a);
        bytes(kv == UINT64_MAX ? kv : kv * T * B, b, sizeof b);
        printf("kv cache  %s per token in %s (%u layers); %s at T=%" PRIu64 ", B=%" PRIu64 "\n", a,
               px_dtype_name(kv_dtype), hp->n_layers, b, T, B);
        si(dec, a, sizeof a);
        si(pre, b, sizeof b);
        si(pre / T, c, sizeof c);
        printf("flops     decode %sFLOP per token at T=%" PRIu64 "; prefill of %" PRIu64
               " tokens %sFLOP (%sFLOP per token)\n",
               a, T, T, b, c);
    }
    printf("regions   %zu: ", px_ir_model_n_regions(m));
    size_t nr = px_ir_model_n_regions(m);
    for (size_t i = 0; i < nr; i++) {
        if (nr > 8 && i == 4) {
            printf(", ...");
            i = nr - 3;
        }
        printf("%s%s", i ? ", " : "", px_ir_model_region(m, i)->name);
    }
    printf("\n\n%-20s %12s %10s %14s %14s %10s %10s\n", "row", "params", "weights",
           dit ? "step FLOP" : "decode FLOP", dit ? "" : "prefill FLOP", dit ? "" : "KV B/tok",
           "act B/tok");
    for (uint32_t r = 0; r < n_rows;) {
        uint32_t end = r + 1;
        if (r >= 1)
            while (end < n_rows - 1 && same_row(&rows[r], &rows[end]))
                end++;
        char label[64], l1[32], l2[32];
        if (end - r > 1)
            snprintf(label, sizeof label, "%s..%u (each)", row_label(hp, r, l1, sizeof l1),
                     end - 2);
        else
            snprintf(label, sizeof label, "%s", row_label(hp, r, l2, sizeof l2));
        si(rows[r].n_params, a, sizeof a);
        bytes(rows[r].weight_bytes, b, sizeof b);
        if (dit) {
            si(px_ir_prefill_flops(&rows[r], S), c, sizeof c);
            printf("%-20s %12s %10s %14s %14s %10s %10" PRIu64 "\n", label, a, b, c, "", "",
                   rows[r].act_bytes_token);
        } else {
            si(px_ir_decode_flops(&rows[r], T), c, sizeof c);
            si(px_ir_prefill_flops(&rows[r], T), d, sizeof d);
            printf("%-20s %12s %10s %14s %14s %10" PRIu64 " %10" PRIu64 "\n", label, a, b, c, d,
                   rows[r].kv_bytes_token, rows[r].act_bytes_token);
        }
        r = end;
    }
}

static int cmd_inspect(const char *spec)
{
    const char *cmd = "model inspect";
    px_cli_format fmt = M.fmt;
    uint64_t T = M.context, B = M.batch;
    px_ir_open_opts opts = M.open;
    px_ir_describe_opts dopts = M.describe;
    px_dtype preset_dtype = M.preset_dtype;
    px_err err;
    px_ir_model *m;
    px_status st;
    bool is_preset = false;
    for (size_t i = 0; i < px_ir_preset_count(); i++)
        if (!strcmp(px_ir_preset_at(i)->name, spec))
            is_preset = true;
    if (is_preset)
        st = px_ir_preset_new(spec, preset_dtype, &opts, &m, &err);
    else if (preset_dtype != PX_DTYPE_COUNT_)
        return px__cli_usage_error(cmd, "--dtype applies to presets; \"%s\" is not one", spec);
    else /* a file, or a misspelled preset: the presets, the nearest first */
        st = px_ir_model_open_any(spec, &opts, &m, &err);
    if (st != PX_OK)
        return px__cli_fail("model", &err);
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    if (!T)
        T = hp->context_length;
    int rc = PX_EXIT_OK;
    if (fmt != PX_CLI_TEXT) {
        dopts.context = T;
        dopts.batch = B;
        json_t *j = px_ir_model_describe(m, &dopts);
        if (!j) {
            fprintf(stderr, "plexus model: out of memory describing the model\n");
            rc = PX_EXIT_FAIL;
        } else {
            rc = px__cli_print_doc(j, fmt);
            json_decref(j);
        }
    } else {
        print_text(m, T, B);
    }
    px_ir_model_free(m);
    return rc;
}

static int cmd_synth(void)
{
    px_ir_synth_opts o = M.synth;
    const char *out = M.out;
    px_err err;
    px__cli_progress("model synth", "writing %s", out);
    px_status st = px_ir_synth_write(&o, out, &err);
    px__cli_progress_done();
    if (st != PX_OK)
        return px__cli_fail("model", &err);
    px__cli_wrote("model synth", out, "a synthetic GGUF model");
    return PX_EXIT_OK;
}

static int cmd_presets(void)
{
    px_cli_format fmt = M.fmt;
    if (fmt != PX_CLI_TEXT) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < px_ir_preset_count(); i++) {
            const px_ir_preset_info *p = px_ir_preset_at(i);
            json_t *e = json_object();
            px_json_set(e, "name", json_string(p->name));
            px_json_set(e, "title", json_string(p->title));
            px_json_set(e, "architecture", json_string(px_ir_arch_name(p->arch)));
            px_json_set(e, "source", json_string(p->source));
            px_json_push(a, e);
        }
        if (!a)
            return PX_EXIT_FAIL;
        int rc = px__cli_print_doc(a, fmt);
        json_decref(a);
        return rc;
    }
    printf("%-14s %-8s %-40s %s\n", "preset", "arch", "model", "source");
    for (size_t i = 0; i < px_ir_preset_count(); i++) {
        const px_ir_preset_info *p = px_ir_preset_at(i);
        printf("%-14s %-8s %-40s %s\n", p->name, px_ir_arch_name(p->arch), p->title, p->source);
    }
    return PX_EXIT_OK;
}

int px__cmd_model(int argc, char **argv)
{
    memset(&M, 0, sizeof M);
    M.batch = 1;
    M.preset_dtype = PX_DTYPE_COUNT_;
    px_ir_synth_defaults(&M.synth);
    int rc;
    const px_cli_spec *spec = px__cli_action("model", px__cmd_model_specs, argc, argv, &rc);
    if (!spec)
        return rc;
    px_cli_args args;
    if (!px__cli_parse(spec, argc - 1, argv + 1, &args, &rc))
        return rc;
    if (spec == &inspect_spec)
        return cmd_inspect(args.v[0]);
    if (spec == &synth_spec)
        return cmd_synth();
    if (spec == &quantize_spec)
        return px__cmd_model_quantize(args.v[0], args.v[1], M.type, M.fmt);
    return cmd_presets();
}
