/* plexus generate: text from a model file on the local cpu backend. */
#include "cli/cli.h"

#include "plexus/ir.h"
#include "plexus/rt.h"

const char px__cmd_generate_summary[] = "generate text with a model on this machine's cpu";

static const char usage_text[] =
    "usage: plexus generate --model FILE [--tokenizer FILE] --prompt TEXT [--prompt TEXT ...]\n"
    "                       [-n N] [--temp T] [--top-p P] [--seed S] [--threads N]\n"
    "                       [-o text|json]\n"
    "\n"
    "Runs a model (GGUF, or a llama2.c checkpoint) in this process on the cpu backend\n"
    "and prints the prompt's continuation as it is produced, then prefill and decode\n"
    "speeds on stderr.  Several --prompt options decode together as one batch; each\n"
    "text is then printed whole when its generation ends.\n"
    "\n"
    "options:\n"
    "  --model FILE       .gguf or llama2.c .bin (presets have no weights to run)\n"
    "  --tokenizer FILE   llama2.c tokenizer (tok512.bin); default: the model's own\n"
    "                     vocabulary, or tok512.bin next to a .bin checkpoint\n"
    "  --prompt TEXT      text to continue (repeat for a batch)\n"
    "  -n N               new tokens per prompt (default 128; stops early at EOS or\n"
    "                     at the end of the context)\n"
    "  --temp T           temperature, 0 for greedy decoding (default 1.0)\n"
    "  --top-p P          nucleus sampling threshold in (0, 1), 1 for none (default 0.9)\n"
    "  --seed S           random seed; prompt i uses S + i (default 42)\n"
    "  --threads N        cpu threads (default: the online CPUs, fewer for small\n"
    "                     models: one per 16 MiB of weights)\n"
    "  -o text|json       text streams tokens; json prints one document at the end\n";

#define MAX_PROMPTS 256

typedef struct gen_opts {
    const char *model, *tokenizer;
    const char *prompts[MAX_PROMPTS];
    uint32_t n_prompts;
    uint32_t n_new, threads;
    double temp, top_p;
    uint64_t seed;
    px_cli_format format;
} gen_opts;

/* What each prompt produced. */
typedef struct gen_out {
    const gen_opts *o;
    px_strbuf *text;
    json_t **ids;
    bool echoed; /* the prompt was printed before its continuation */
} gen_out;

/* With one prompt in text mode, the prompt is printed just before its
 * first token, so that errors found before generation starts stay clean. */
static void echo_prompt(gen_out *g)
{
    if (g->o->format == PX_CLI_TEXT && g->o->n_prompts == 1 && !g->echoed) {
        fputs(g->o->prompts[0], stdout);
        g->echoed = true;
    }
}

static bool parse_u32(const char *arg, const char *opt, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v > max) {
        px__cli_usage_error("generate", "%s takes a whole number from 0 to %u, not \"%s\"", opt,
                            max, arg);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static bool parse_real(const char *arg, const char *opt, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= lo && v <= hi)) {
        px__cli_usage_error("generate", "%s takes a number from %g to %g, not \"%s\"", opt, lo, hi,
                            arg);
        return false;
    }
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, gen_opts *o)
{
    *o = (gen_opts){.n_new = 128, .temp = 1.0, .top_p = 0.9, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        const char *v = has_value ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--tokenizer")) {
            o->tokenizer = v;
        } else if (!strcmp(a, "--prompt")) {
            if (has_value && o->n_prompts == MAX_PROMPTS)
                return px__cli_usage_error("generate", "at most %d prompts", MAX_PROMPTS);
            if (has_value)
                o->prompts[o->n_prompts++] = v;
        } else if (!strcmp(a, "-n")) {
            if (has_value && !parse_u32(v, a, 1u << 24, &o->n_new))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--temp")) {
            if (has_value && !parse_real(v, a, 0, 100, &o->temp))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--top-p")) {
            if (has_value && !parse_real(v, a, 0, 1, &o->top_p))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = has_value ? strtoull(v, &end, 10) : 0;
            if (has_value && (errno || end == v || *end || v[0] == '-'))
                return px__cli_usage_error("generate", "--seed takes a whole number, not \"%s\"",
                                           v);
            o->seed = s;
        } else if (!strcmp(a, "--threads")) {
            if (has_value && !parse_u32(v, a, 1024, &o->threads))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (has_value && !px__cli_parse_format("generate", v, &o->format))
                return PX_EXIT_USAGE;
        } else {
            return px__cli_usage_error("generate", "unexpected argument \"%s\"", a);
        }
        if (!has_value)
            return px__cli_usage_error("generate", "%s needs a value", a);
        i++;
    }
    if (!o->model)
        return px__cli_usage_error("generate", "--model FILE is required");
    if (o->n_prompts == 0)
        return px__cli_usage_error("generate", "--prompt TEXT is required");
    return PX_EXIT_OK;
}

static void on_token(uint32_t prompt, int32_t token, const char *piece, size_t len, void *ud)
{
    gen_out *g = ud;
    /* Control bytes other than whitespace would garble a terminal. */
    if (len == 1 && (unsigned char)piece[0] < 0x20 && piece[0] != '\n' && piece[0] != '\t' &&
        piece[0] != '\r')
        len = 0;
    px_strbuf_add(&g->text[prompt], piece, len);
    json_array_append_new(g->ids[prompt], json_integer(token));
    if (g->o->format == PX_CLI_TEXT && g->o->n_prompts == 1) {
        echo_prompt(g);
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
    }
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if none:
 * no overlong forms, surrogates or values past U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t len = (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    uint32_t cp = s[0] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* A JSON string of generated bytes: a model may produce invalid UTF-8
 * (byte tokens, a sequence cut by the token limit), which JSON cannot
 * hold; such bytes become U+FFFD. */
static json_t *text_json(const char *text, size_t n)
{
    px_strbuf sb = PX_STRBUF_INIT;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len((const unsigned char *)text + i, n - i);
        if (len) {
            px_strbuf_add(&sb, text + i, len);
            i += len;
        } else {
            px_strbuf_adds(&sb, "\xef\xbf\xbd");
            i++;
        }
    }
    json_t *j = json_stringn(sb.buf, sb.len);
    px_strbuf_release(&sb);
    return j;
}

static json_t *speed_json(uint64_t tokens, uint64_t ns)
{
    json_t *j = json_object();
    px_json_set(j, "tokens", json_integer((json_int_t)tokens));
    px_json_set(j, "seconds", json_real((double)ns / 1e9));
    px_json_set(j, "tokens_per_second", json_real(ns ? (double)tokens / ((double)ns / 1e9) : 0));
    return j;
}

static int report(const gen_opts *o, gen_out *g, const px_rt_generate_stats *st,
                  const px_rt_session_info *info)
{
    double pf = st->prefill_ns ? (double)st->prompt_tokens / ((double)st->prefill_ns / 1e9) : 0;
    double dc = st->decode_ns ? (double)st->decode_tokens / ((double)st->decode_ns / 1e9) : 0;
    if (o->format == PX_CLI_TEXT) {
        if (o->n_prompts == 1) {
            echo_prompt(g);
            printf("\n");
        } else {
            for (uint32_t i = 0; i < o->n_prompts; i++)
                printf("--- prompt %u ---\n%s%s\n", i + 1, o->prompts[i], g->text[i].buf);
        }
        fflush(stdout);
        fprintf(stderr,
                "prefill: %" PRIu64 " tokens in %.1f ms (%.1f tokens/s); decode: %" PRIu64
                " tokens in %.1f ms (%.1f tokens/s); %s\n",
                st->prompt_tokens, (double)st->prefill_ns / 1e6, pf, st->decode_tokens,
                (double)st->decode_ns / 1e6, dc, info->device.description);
        return PX_EXIT_OK;
    }
    json_t *doc = json_object(), *results = json_array();
    px_json_set(doc, "schema", json_string("plexus.generate/1"));
    px_json_set(doc, "model", json_string(o->model));
    px_json_set(doc, "device", json_string(info->device.description));
    px_json_set(doc, "threads", json_integer(info->n_threads));
    json_t *samp = json_object();
    px_json_set(samp, "temperature", json_real(o->temp));
    px_json_set(samp, "top_p", json_real(o->top_p));
    px_json_set(samp, "seed", json_integer((json_int_t)o->seed));
    px_json_set(doc, "sampling", samp);
    for (uint32_t i = 0; i < o->n_prompts; i++) {
        json_t *r = json_object();
        px_json_set(r, "prompt", text_json(o->prompts[i], strlen(o->prompts[i])));
        px_json_set(r, "text", text_json(g->text[i].buf, g->text[i].len));
        px_json_set(r, "tokens", json_incref(g->ids[i]));
        px_json_push(results, r);
    }
    px_json_set(doc, "results", results);
    px_json_set(doc, "prefill", speed_json(st->prompt_tokens, st->prefill_ns));
    px_json_set(doc, "decode", speed_json(st->decode_tokens, st->decode_ns));
    int rc = px__cli_print_json(doc);
    json_decref(doc);
    return rc;
}

int px__cmd_generate(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return PX_EXIT_OK;
    }
    gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != PX_EXIT_OK)
        return rc;
    px_err err;
    px_err_clear(&err);
    px_ir_model *ir = NULL;
    px_rt_model *model = NULL;
    px_arena *arena = NULL;
    px_rt_tokenizer *tok = NULL;
    px_rt_session *s = NULL;
    px_strbuf text[MAX_PROMPTS];
    json_t *ids[MAX_PROMPTS] = {0};
    for (uint32_t i = 0; i < o.n_prompts; i++) {
        px_strbuf_init(&text[i]);
        ids[i] = json_array();
    }
    gen_out g = {.o = &o, .text = text, .ids = ids};
    px_ir_vocab vocab_file;
    const px_ir_vocab *vocab = NULL;
    px_rt_generate_stats st;
    px_rt_session_info info;
    rc = PX_EXIT_FAIL;
    if (px_ir_model_open_any(o.model, NULL, &ir, &err) != PX_OK ||
        px_rt_model_new(ir, &model, &err) != PX_OK || px_arena_new(0, &arena, &err) != PX_OK ||
        px__cli_find_vocab(o.model, o.tokenizer, ir, arena, &vocab_file, &vocab, &err) != PX_OK ||
        px_rt_tokenizer_new(vocab, &tok, &err) != PX_OK) {
        px__cli_fail("generate", &err);
        goto done;
    }
    px_rt_session_opts so = {.n_threads = o.threads, .max_seqs = o.n_prompts};
    if (px_rt_session_new(model, &so, &s, &err) != PX_OK) {
        px__cli_fail("generate", &err);
        goto done;
    }
    px_rt_session_info_get(s, &info);
    px_rt_generate_opts go = {
        .prompts = o.prompts,
        .n_prompts = o.n_prompts,
        .max_new_tokens = o.n_new,
        .sampling = {.temperature = (float)o.temp, .top_p = (float)o.top_p, .seed = o.seed},
        .on_token = on_token,
        .ud = &g,
    };
    if (px_rt_generate(s, tok, &go, &st, &err) != PX_OK) {
        if (g.echoed)
            printf("\n");
        px__cli_fail("generate", &err);
        goto done;
    }
    rc = report(&o, &g, &st, &info);
done:
    px_rt_session_free(s);
    px_rt_tokenizer_free(tok);
    px_arena_free(arena);
    px_rt_model_free(model);
    px_ir_model_free(ir);
    for (uint32_t i = 0; i < o.n_prompts; i++) {
        px_strbuf_release(&text[i]);
        json_decref(ids[i]);
    }
    return rc;
}
