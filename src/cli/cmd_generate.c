/* plexus generate: text from a model file on the local cpu backend. */
#include "cli/cli.h"

#include "plexus/ir.h"
#include "plexus/rt.h"

const char px__cmd_generate_summary[] = "generate text with a model on this machine's cpu";

#define MAX_PROMPTS PX_CLI_LIST_MAX

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

static px__cli_sampling G;
static uint32_t g_threads;
static const char *g_model;
static px_cli_format g_format;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &g_model, "FILE",
               ".gguf or llama2.c .bin (presets have no weights to run)", .flags = PX_CLI_REQUIRED),
    PX__CLI_SAMPLING_OPTS(G),
    PX_CLI_OPT("threads", 0, PX_CLI_U32, &g_threads, "N",
               "cpu threads (default: the online CPUs, fewer for small\n"
               "models: one per 16 MiB of weights)",
               .hi = 1024),
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &g_format, "FORMAT",
               "text streams tokens; json prints one document at the end"),
    {0},
};

static const px_cli_spec spec = {
    .name = "generate",
    .synopsis = "--model FILE --prompt TEXT [--prompt TEXT ...] [options]",
    .about = "Runs a model (GGUF, or a llama2.c checkpoint) in this process on the cpu backend\n"
             "and prints the prompt's continuation as it is produced, then prefill and decode\n"
             "speeds on stderr.  Several --prompt options decode together as one batch; each\n"
             "text is then printed whole when its generation ends.  The prompts and sampling\n"
             "options, and their defaults, are those of plexus run.",
    .opts = opts,
    .examples = "plexus generate -m stories260K.gguf --prompt \"Once upon a time\" -n 60\n"
                "plexus generate -m model.gguf --prompt hello --temp 0.8 --seed 7 -o json\n",
};
const px_cli_spec *const px__cmd_generate_specs[] = {&spec, NULL};

static int parse_args(int argc, char **argv, gen_opts *o)
{
    G = PX__CLI_SAMPLING_DEFAULTS;
    g_threads = 0;
    g_model = NULL;
    g_format = PX_CLI_TEXT;
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc == PX_EXIT_OK ? -1 : rc;
    if (G.prompts.n == 0)
        return px__cli_usage_error("generate", "--prompt TEXT is required");
    *o = (gen_opts){.model = g_model,
                    .tokenizer = G.tokenizer,
                    .n_new = G.n_new,
                    .threads = g_threads,
                    .temp = G.temp,
                    .top_p = G.top_p,
                    .seed = G.seed,
                    .format = g_format};
    for (size_t i = 0; i < G.prompts.n; i++)
        o->prompts[o->n_prompts++] = G.prompts.v[i];
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
        char repacked[64] = "";
        if (info->weights_repacked)
            snprintf(repacked, sizeof repacked, "; %u matrices repacked for its kernels",
                     info->weights_repacked);
        fprintf(stderr,
                "prefill: %" PRIu64 " tokens in %.1f ms (%.1f tokens/s); decode: %" PRIu64
                " tokens in %.1f ms (%.1f tokens/s); %s%s\n",
                st->prompt_tokens, (double)st->prefill_ns / 1e6, pf, st->decode_tokens,
                (double)st->decode_ns / 1e6, dc, info->device.description, repacked);
        return PX_EXIT_OK;
    }
    json_t *doc = json_object(), *results = json_array();
    px_json_set(doc, "schema", json_string("plexus.generate/1"));
    px_json_set(doc, "model", json_string(o->model));
    px_json_set(doc, "device", json_string(info->device.description));
    px_json_set(doc, "threads", json_integer(info->n_threads));
    px_json_set(doc, "weights_repacked", json_integer(info->weights_repacked));
    json_t *samp = json_object();
    px_json_set(samp, "temperature", json_real(o->temp));
    px_json_set(samp, "top_p", json_real(o->top_p));
    px_json_set(samp, "seed", json_integer((json_int_t)o->seed));
    px_json_set(doc, "sampling", samp);
    for (uint32_t i = 0; i < o->n_prompts; i++) {
        json_t *r = json_object();
        px_json_set(r, "prompt", px_json_text(o->prompts[i], strlen(o->prompts[i])));
        px_json_set(r, "text", px_json_text(g->text[i].buf, g->text[i].len));
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
    gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0)
        return PX_EXIT_OK; /* --help */
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
