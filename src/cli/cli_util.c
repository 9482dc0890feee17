/* Helpers shared by the subcommands. */
#include "cli/cli.h"

#include <unistd.h>

void px__cli_wrote(const char *cmd, const char *path, const char *what)
{
    fprintf(stderr, "plexus %s: wrote %s (%s)\n", cmd, path, what);
}

px_status px__cli_load_inventory(const char *cmd, const char *path, const px_hw_read_options *opt,
                                 px_hw_graph **out, px_diags *diags, px_err *err)
{
    px_status st = px_hw_graph_load(path, opt, out, diags, err);
    if (st == PX_OK)
        return st;
    fprintf(stderr, "plexus %s: refusing the inventory %s:\n", cmd, path);
    char *text = px_diags_format(diags, path);
    if (text && text[0])
        fputs(text, stderr);
    else
        fprintf(stderr, "%s\n", err && err->msg[0] ? err->msg : px_status_str(st));
    free(text);
    return st;
}

px_status px__cli_open_model(const char *cmd, const char *spec, const px_ir_open_opts *opts,
                             px_ir_model **out, px_err *err)
{
    px_status st = px_ir_model_open_any(spec, opts, out, err);
    if (st != PX_OK)
        px__cli_fail(cmd, err);
    return st;
}

px_status px__cli_parse_kv_dtype(const char *v, void *dest, px_err *err)
{
    px_ir_open_opts *opts = dest;
    px_status st = px_dtype_parse(v, &opts->kv_dtype, err);
    if (st == PX_OK)
        opts->kv_dtype_given = true;
    return st;
}

static bool progress_shown;

void px__cli_progress(const char *cmd, const char *fmt, ...)
{
    if (!isatty(STDERR_FILENO))
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r\033[Kplexus %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
    progress_shown = true;
}

void px__cli_progress_done(void)
{
    if (progress_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        progress_shown = false;
    }
}

int px__cli_fail(const char *cmd, const px_err *err)
{
    fprintf(stderr, "plexus %s: %s\n", cmd,
            err && err->msg[0] ? err->msg : px_status_str(err ? err->code : PX_EINTERNAL));
    return PX_EXIT_FAIL;
}

int px__cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "plexus %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nrun 'plexus %s --help' for usage\n", cmd);
    va_end(ap);
    return PX_EXIT_USAGE;
}

int px__cli_print_json(const json_t *v)
{
    char *s = px_json_dump_canonical(v);
    if (!s) {
        fprintf(stderr, "plexus: out of memory printing JSON\n");
        return PX_EXIT_FAIL;
    }
    fputs(s, stdout);
    free(s);
    return PX_EXIT_OK;
}

int px__cli_print_doc(const json_t *v, px_cli_format fmt)
{
    if (fmt != PX_CLI_YAML)
        return px__cli_print_json(v);
    px__cli_yaml_write(v, stdout);
    return fflush(stdout) == 0 ? PX_EXIT_OK : PX_EXIT_FAIL;
}

bool px__cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            return false;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return true;
    }
    return false;
}

/* The vocabulary to tokenize with: the --tokenizer file, the model's, or
 * tok512.bin beside a llama2.c checkpoint. */
px_status px__cli_find_vocab(const char *model, const char *tokenizer, const px_ir_model *ir,
                             px_arena *arena, px_ir_vocab *out, const px_ir_vocab **vocab,
                             px_err *err)
{
    uint32_t n = px_ir_model_hparams(ir)->vocab_size;
    if (tokenizer) {
        *vocab = out;
        return px_ir_vocab_read_llama2c(tokenizer, n, arena, out, err);
    }
    if ((*vocab = px_ir_model_vocab(ir)) != NULL)
        return PX_OK;
    const char *slash = strrchr(model, '/');
    char *path = slash ? px_asprintf("%.*s/tok512.bin", (int)(slash - model), model)
                       : px_strdup("tok512.bin");
    if (!path)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status st = PX_ENOTFOUND;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        *vocab = out;
        st = px_ir_vocab_read_llama2c(path, n, arena, out, err);
    } else {
        st = px_err_set(err, PX_ENOTFOUND,
                        "%s carries no vocabulary and %s does not exist: "
                        "pass --tokenizer FILE (a llama2.c tokenizer such as tok512.bin)",
                        model, path);
    }
    free(path);
    return st;
}

px_status px__cli_parse_transport(const char *v, void *dest, px_err *err)
{
    px__cli_transport *t = dest;
    if (!strcmp(v, "unix")) {
        *t = (px__cli_transport){.kind = PX_RT_TRANSPORT_UNIX};
    } else if (!strcmp(v, "tcp")) {
        *t = (px__cli_transport){.kind = PX_RT_TRANSPORT_TCP};
    } else if (px_str_starts_with(v, "tcp:") && v[4]) {
        *t = (px__cli_transport){.kind = PX_RT_TRANSPORT_TCP, .host = v + 4};
    } else {
        return px_err_set(err, PX_EINVAL, "takes unix, tcp or tcp:A.B.C.D, not \"%s\"", v);
    }
    return PX_OK;
}

bool px__cli_parse_injects(const char *cmd, const px_cli_list *list, px_heal_inject *out,
                           uint32_t max, uint32_t *n)
{
    *n = 0;
    for (size_t i = 0; i < list->n; i++) {
        px_err e;
        if (*n == max) {
            px__cli_usage_error(cmd, "at most %u --inject", max);
            return false;
        }
        if (px_heal_inject_parse(list->v[i], &out[*n], &e) != PX_OK) {
            px__cli_usage_error(cmd, "%s", e.msg);
            return false;
        }
        (*n)++;
    }
    return true;
}
