/* plexus model: inspect model files and presets, write synthetic models. */
#include "cli/cli.h"
#include "plexus/ir.h"

const char px__cmd_model_summary[] =
    "inspect a model (GGUF, llama2.c, preset), write a synthetic one or quantize one";

static const char k_usage[] =
    "usage: plexus model inspect FILE|PRESET [-o text|json] [--context T] [--batch B]\n"
    "                            [--tokenizer FILE] [--kv-dtype D] [--dtype D]\n"
    "                            [--ops] [--tensors]\n"
    "       plexus model synth --out FILE [--arch llama|qwen2|mixtral] [--dim N]\n"
    "                          [--hidden N] [--layers N] [--heads N] [--kv-heads N]\n"
    "                          [--vocab N] [--context N] [--dtype f32|f16|bf16|q8_0]\n"
    "                          [--experts N --experts-used K] [--tied]\n"
    "                          [--no-tokenizer] [--seed N]\n"
    "       plexus model quantize IN OUT --type q8_0|q4_0|q4_k_m|q5_k_m|q6_k\n"
    "                             [-o text|json]\n"
    "       plexus model presets [-o text|json]\n"
    "\n"
    "inspect   architecture and hyper-parameters; parameters and bytes by dtype;\n"
    "          per-layer weight bytes; FLOPs per token for prefill and decode at\n"
    "          context T (default: the model's context) and batch B (default 1);\n"
    "          KV-cache bytes per token; activation bytes crossing each layer\n"
    "          boundary; the regions.  --ops adds every op with its cost\n"
    "          expressions, --tensors every stored tensor (JSON only).\n"
    "          --tokenizer attaches a llama2.c tokenizer to a llama2.c checkpoint;\n"
    "          --kv-dtype costs the KV cache in another dtype; --dtype stores a\n"
    "          preset's matrices in another dtype (default bf16).\n"
    "synth     writes a llama-family GGUF model with deterministic random weights\n"
    "          (N(0, 0.02), norms 1) and a byte-level vocabulary.  Defaults: llama,\n"
    "          dim 64, hidden 172, 2 layers, 8 heads, 4 kv heads, vocab 512,\n"
    "          context 256, f32, seed 1.  --tied omits output.weight;\n"
    "          --no-tokenizer omits the vocabulary (and allows --vocab below 259).\n"
    "quantize  writes the GGUF model IN (f32, f16 or bf16) to OUT with its\n"
    "          matrices quantized by llama.cpp's recipe T, blocks made as\n"
    "          ggml's reference quantizer makes them; prints the tensors per\n"
    "          dtype, the sizes and the RMS error of the quantized values.\n"
    "presets   lists the models known by hyper-parameters alone.\n"
    "\n"
    "FLOPs count 2 per multiply-add; docs/formats/model-ir.md has the conventions.\n";

static bool parse_u64(const char *cmd, const char *opt, const char *arg, uint64_t max,
                      uint64_t *out)
{
    char *end;
    errno = 0;
    if (!arg || !*arg || *arg == '-') {
        px__cli_usage_error(cmd, "%s needs a positive number", opt);
        return false;
    }
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || *end || v == 0 || v > max) {
        px__cli_usage_error(cmd, "%s takes a number from 1 to %" PRIu64 ", not \"%s\"", opt, max,
                            arg);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_u32(const char *cmd, const char *opt, const char *arg, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(cmd, opt, arg, UINT32_MAX, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool parse_dtype(const char *cmd, const char *opt, const char *arg, px_dtype *out)
{
    px_err err;
    if (!arg) {
        px__cli_usage_error(cmd, "%s needs a dtype", opt);
        return false;
    }
    if (px_dtype_parse(arg, out, &err) != PX_OK) {
        px__cli_usage_error(cmd, "%s: %s", opt, err.msg);
        return false;
    }
    return true;
}

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

static void print_text(const px_ir_model *m, uint64_t T, uint64_t B, px_dtype kv_dtype)
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

static int cmd_inspect(int argc, char **argv)
{
    const char *cmd = "model inspect";
    const char *spec = NULL;
    px_cli_format fmt = PX_CLI_TEXT;
    uint64_t T = 0, B = 1;
    px_ir_open_opts opts = {0};
    px_ir_describe_opts dopts = {0};
    px_dtype preset_dtype = PX_DTYPE_COUNT_;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!v)
                return px__cli_usage_error(cmd, "-o needs text or json");
            if (!px__cli_parse_format(cmd, v, &fmt))
                return PX_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--context")) {
            if (!parse_u64(cmd, a, v, UINT32_MAX, &T))
                return PX_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--batch")) {
            if (!parse_u64(cmd, a, v, 1u << 20, &B))
                return PX_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!v)
                return px__cli_usage_error(cmd, "--tokenizer needs a file");
            opts.tokenizer_path = v;
            i++;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!parse_dtype(cmd, a, v, &opts.kv_dtype))
                return PX_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_dtype(cmd, a, v, &preset_dtype))
                return PX_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--ops")) {
            dopts.with_ops = true;
        } else if (!strcmp(a, "--tensors")) {
            dopts.with_tensors = true;
        } else if (a[0] == '-' && a[1]) {
            return px__cli_usage_error(cmd, "unknown option \"%s\"", a);
        } else if (!spec) {
            spec = a;
        } else {
            return px__cli_usage_error(cmd, "unexpected argument \"%s\"", a);
        }
    }
    if (!spec)
        return px__cli_usage_error(cmd, "name a model file or a preset (plexus model presets)");
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
    else
        st = px_ir_model_open(spec, &opts, &m, &err);
    if (st != PX_OK)
        return px__cli_fail("model", &err);
    const px_ir_hparams *hp = px_ir_model_hparams(m);
    if (!T)
        T = hp->context_length;
    int rc = PX_EXIT_OK;
    if (fmt == PX_CLI_JSON) {
        dopts.context = T;
        dopts.batch = B;
        json_t *j = px_ir_model_describe(m, &dopts);
        if (!j) {
            fprintf(stderr, "plexus model: out of memory describing the model\n");
            rc = PX_EXIT_FAIL;
        } else {
            rc = px__cli_print_json(j);
            json_decref(j);
        }
    } else {
        print_text(m, T, B, opts.kv_dtype);
    }
    px_ir_model_free(m);
    return rc;
}

static int cmd_synth(int argc, char **argv)
{
    const char *cmd = "model synth";
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *u32 = NULL;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            return px__cli_usage_error(cmd,
                                       "%s is a report format in plexus; write the model "
                                       "with --out FILE",
                                       a);
        } else if (px_str_starts_with(a, "--out=")) {
            out = a + 6;
            continue;
        } else if (!strcmp(a, "--out")) {
            if (!v)
                return px__cli_usage_error(cmd, "--out needs the file to write");
            out = v;
            i++;
            continue;
        } else if (!strcmp(a, "--arch")) {
            if (!v)
                return px__cli_usage_error(cmd, "--arch needs llama, qwen2 or mixtral");
            if (!strcmp(v, "llama"))
                o.arch = PX_IR_ARCH_LLAMA;
            else if (!strcmp(v, "qwen2"))
                o.arch = PX_IR_ARCH_QWEN2;
            else if (!strcmp(v, "mixtral"))
                o.arch = PX_IR_ARCH_MIXTRAL;
            else
                return px__cli_usage_error(cmd,
                                           "--arch takes llama, qwen2 or mixtral, not "
                                           "\"%s\"",
                                           v);
            i++;
            continue;
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_dtype(cmd, a, v, &o.dtype))
                return PX_EXIT_USAGE;
            i++;
            continue;
        } else if (!strcmp(a, "--seed")) {
            uint64_t s;
            if (!v)
                return px__cli_usage_error(cmd, "--seed needs a number");
            char *end;
            errno = 0;
            s = strtoull(v, &end, 10);
            if (errno || *end || !*v || *v == '-')
                return px__cli_usage_error(cmd,
                                           "--seed takes a non-negative integer, not "
                                           "\"%s\"",
                                           v);
            o.seed = s;
            i++;
            continue;
        } else if (!strcmp(a, "--tied")) {
            o.tied_classifier = true;
            continue;
        } else if (!strcmp(a, "--no-tokenizer")) {
            o.no_tokenizer = true;
            continue;
        } else if (!strcmp(a, "--dim")) {
            u32 = &o.dim;
        } else if (!strcmp(a, "--hidden")) {
            u32 = &o.hidden_dim;
        } else if (!strcmp(a, "--layers")) {
            u32 = &o.n_layers;
        } else if (!strcmp(a, "--heads")) {
            u32 = &o.n_heads;
        } else if (!strcmp(a, "--kv-heads")) {
            u32 = &o.n_kv_heads;
        } else if (!strcmp(a, "--vocab")) {
            u32 = &o.vocab_size;
        } else if (!strcmp(a, "--context")) {
            u32 = &o.context_length;
        } else if (!strcmp(a, "--experts")) {
            u32 = &o.n_experts;
        } else if (!strcmp(a, "--experts-used")) {
            u32 = &o.n_experts_used;
        } else {
            return px__cli_usage_error(cmd, "unknown argument \"%s\"", a);
        }
        if (!parse_u32(cmd, a, v, u32))
            return PX_EXIT_USAGE;
        i++;
    }
    if (!out)
        return px__cli_usage_error(cmd, "name the file to write with --out FILE");
    px_err err;
    px__cli_progress("model synth", "writing %s", out);
    px_status st = px_ir_synth_write(&o, out, &err);
    px__cli_progress_done();
    if (st != PX_OK)
        return px__cli_fail("model", &err);
    px__cli_wrote("model synth", out, "a synthetic GGUF model");
    return PX_EXIT_OK;
}

static int cmd_presets(int argc, char **argv)
{
    const char *cmd = "model presets";
    px_cli_format fmt = PX_CLI_TEXT;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
            if (!px__cli_parse_format(cmd, argv[++i], &fmt))
                return PX_EXIT_USAGE;
        } else {
            return px__cli_usage_error(cmd, "unexpected argument \"%s\"", argv[i]);
        }
    }
    if (fmt == PX_CLI_JSON) {
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
        int rc = px__cli_print_json(a);
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
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        fputs(k_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? PX_EXIT_USAGE : PX_EXIT_OK;
    }
    if (px__cli_wants_help(argc - 1, argv + 1)) {
        fputs(k_usage, stdout);
        return PX_EXIT_OK;
    }
    if (!strcmp(argv[1], "inspect"))
        return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "synth"))
        return cmd_synth(argc - 1, argv + 1);
    if (!strcmp(argv[1], "presets"))
        return cmd_presets(argc - 1, argv + 1);
    if (!strcmp(argv[1], "quantize"))
        return px__cmd_model_quantize(argc - 1, argv + 1);
    return px__cli_usage_error("model",
                               "unknown subcommand \"%s\"; use inspect, synth, quantize or "
                               "presets",
                               argv[1]);
}
