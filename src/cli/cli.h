/*
 * Private helpers shared by the plexus subcommands.  Each subcommand lives
 * in cmd_<name>.c and defines
 *
 *     const char px__cmd_<name>_summary[] = "one line for `plexus --help`";
 *     int px__cmd_<name>(int argc, char **argv);   // argv[0] is "<name>"
 *
 * and returns a process exit status (PX_EXIT_*): 0 success; 1 an error
 * (a file unreadable or malformed, a server unreachable, the work failed);
 * 2 bad usage; 3 a verdict: the work ran and its answer is no (a contract
 * forbids, a replay diverged, an inventory or contract is refused).
 * Subcommands hold no logic a library user would need.
 */
#ifndef PX_CLI_H
#define PX_CLI_H

#include "base/common.h"

#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/rt.h"

enum { PX_EXIT_OK = 0, PX_EXIT_FAIL = 1, PX_EXIT_USAGE = 2, PX_EXIT_VERDICT = 3 };

typedef enum px_cli_format {
    PX_CLI_TEXT = 0,
    PX_CLI_JSON = 1,
    PX_CLI_YAML = 2, /* the JSON document's tree written as YAML */
} px_cli_format;

/* ------------------------------------------------------------------ */
/* Declarative options                                                 */
/* ------------------------------------------------------------------ */
/*
 * A subcommand states its options once, as a table, and one parser reads
 * argv from it; help (`plexus CMD --help`, `plexus help CMD`), the man
 * pages (`plexus man`) and shell completion (`plexus completion bash|zsh`)
 * are generated from the same table, so they cannot drift apart.
 *
 * The parser accepts --name VALUE, --name=VALUE, -x VALUE and -xVALUE; a
 * flag takes no value; "--" ends the options.  Options and operands may
 * mix (unless PX_CLI_OPERANDS_END).  Every error is uniform: it names the
 * option, what it takes and what it got, suggests the nearest option for a
 * misspelling ("did you mean --model?") and points at --help.
 *
 * Adopting it in a subcommand (cmd_<name>.c):
 *
 *     static const char *model, *inv;
 *     static uint32_t n = 64;
 *     static const px_cli_opt opts[] = {
 *         PX_CLI_OPT("model", 'm', PX_CLI_STR, &model, "FILE", "the model",
 *                    .flags = PX_CLI_REQUIRED),
 *         PX_CLI_OPT("inventory", 0, PX_CLI_STR, &inv, "FILE", "plexus.inventory/1 JSON"),
 *         PX_CLI_OPT("tokens", 'n', PX_CLI_U32, &n, "N", "tokens to make (default 64)",
 *                    .lo = 1, .hi = 1e6),
 *         {0},
 *     };
 *     static const px_cli_spec spec = {
 *         .name = "thing", .synopsis = "--model FILE [options]",
 *         .about = "What it does, in a paragraph.", .opts = opts,
 *         .examples = "plexus thing --model m.gguf -n 8   # eight tokens\n",
 *     };
 *     const px_cli_spec *const px__cmd_thing_specs[] = {&spec, NULL};
 *
 *     int px__cmd_thing(int argc, char **argv)
 *     {
 *         px_cli_args args;
 *         int rc;
 *         if (!px__cli_parse(&spec, argc, argv, &args, &rc))
 *             return rc; // help printed (0) or a usage error (2)
 *         ...
 *     }
 *
 * Destinations hold their defaults before the call; the parser writes only
 * what is given.  A command with actions ("inventory show", "model synth")
 * has one spec per action, named "inventory show", all listed in
 * px__cmd_<name>_specs; px__cli_action picks the action with "did you
 * mean" for a misspelled one.
 */

#define PX_CLI_LIST_MAX 64

/* What an option's value is, and the type its dest points to. */
typedef enum px_cli_opt_kind {
    PX_CLI_FLAG = 0, /* bool: set true; takes no value */
    PX_CLI_STR,      /* const char *: the value as given */
    PX_CLI_LIST,     /* px_cli_list: repeatable, each value appended */
    PX_CLI_U32,      /* uint32_t: a whole number in [lo, hi] */
    PX_CLI_U64,      /* uint64_t: a whole number in [lo, hi] (hi 0: any) */
    PX_CLI_NUM,      /* double: a finite number in [lo, hi] */
    PX_CLI_TIME,     /* double: seconds, from a time with a unit ("90s", "2 min") */
    PX_CLI_SIZE,     /* double: bytes, from a size with a unit ("16GiB") */
    PX_CLI_FORMAT,   /* px_cli_format: one of `choices` (default "text|json") */
    PX_CLI_CHOICE,   /* const char *: one of `choices` ("a|b|c") */
    PX_CLI_CALL,     /* anything: parse(value, dest, err) */
} px_cli_opt_kind;

typedef struct px_cli_list {
    const char *v[PX_CLI_LIST_MAX];
    size_t n;
} px_cli_list;

enum {
    PX_CLI_REQUIRED = 1 << 0, /* an option that must be given */
    PX_CLI_HIDDEN = 1 << 1,   /* parsed, but left out of help and completion */
};

typedef struct px_cli_opt {
    const char *name;     /* the long name without "--"; NULL ends a table */
    char short_name;      /* 'o' for -o; 0 for none */
    px_cli_opt_kind kind; /* what dest points to */
    void *dest;           /* where the value goes (borrowed) */
    const char *arg;      /* the value's name in help ("FILE"); NULL for flags */
    const char *help;     /* one or more lines, "\n"-separated */
    double lo, hi;        /* numeric bounds */
    const char *choices;  /* PX_CLI_CHOICE and PX_CLI_FORMAT: "a|b|c" */
    /* PX_CLI_CALL: reads value into dest; an error message without the
     * option's name (the parser adds it). */
    px_status (*parse)(const char *value, void *dest, px_err *err);
    unsigned flags; /* PX_CLI_REQUIRED, PX_CLI_HIDDEN */
    bool *seen;     /* set true when given (may be NULL) */
} px_cli_opt;

/* One row of an option table, every field designated (so that rows may
 * leave out the ones they do not need):
 *     PX_CLI_OPT("seed", 0, PX_CLI_U64, &seed, "S", "base seed", .lo = 0) */
#define PX_CLI_OPT(long_name, short_opt, opt_kind, where, arg_name, help_text, ...)          \
    {                                                                                        \
        .name = (long_name), .short_name = (short_opt), .kind = (opt_kind), .dest = (where), \
        .arg = (arg_name), .help = (help_text), __VA_ARGS__                                  \
    }

enum {
    PX_CLI_OPERANDS_END = 1 << 0, /* options end at the first operand (a command line follows) */
};

/* One command, or one action of a command. */
typedef struct px_cli_spec {
    const char *name;     /* "plan", "inventory show" */
    const char *synopsis; /* what follows "plexus NAME" in the usage line */
    const char *summary;  /* one line (actions; a command has px__cmd_<name>_summary) */
    const char *about;    /* paragraphs of what it does */
    const px_cli_opt *opts;
    const char *operands; /* the operands' name in messages ("FILE"); NULL: none */
    int min_operands;     /* operands required */
    int max_operands;     /* -1: any number */
    const char *examples; /* lines "plexus ...   # what it shows" */
    const char *more;     /* text after the options: exit status, notes */
    unsigned flags;       /* PX_CLI_OPERANDS_END */
} px_cli_spec;

/* The operands left after the options, in order (pointers into argv). */
typedef struct px_cli_args {
    char **v;
    int n;
} px_cli_args;

/* Reads argv (argv[0] is the command's name) by spec.  Returns true when
 * the command should go on, with its operands in *args; false when it
 * should exit with *rc: PX_EXIT_OK after -h/--help printed the help,
 * PX_EXIT_USAGE after a usage error was printed.  Reorders argv so that
 * the operands come last. */
bool px__cli_parse(const px_cli_spec *spec, int argc, char **argv, px_cli_args *args, int *rc);
/* Prints the help generated from spec (usage, about, options, examples). */
void px__cli_help(const px_cli_spec *spec, FILE *f);
/* Writes spec as a man page section 1 (roff) to f. */
void px__cli_man(const px_cli_spec *spec, const char *summary, FILE *f);
/* The action of a command with actions: the spec among specs (NULL-ended)
 * whose name's last word is argv[1].  Prints "did you mean" and returns
 * NULL for an unknown or missing action (*rc PX_EXIT_USAGE), or after
 * printing the command's help for -h (*rc PX_EXIT_OK). */
const px_cli_spec *px__cli_action(const char *cmd, const px_cli_spec *const *specs, int argc,
                                  char **argv, int *rc);
/* The word of words (NULL-ended) nearest to s by edit distance, when near
 * enough to be a likely misspelling; NULL otherwise. */
const char *px__cli_nearest(const char *s, const char *const *words);

/* Prints "plexus <cmd>: <message>" to stderr and returns PX_EXIT_FAIL. */
int px__cli_fail(const char *cmd, const px_err *err);
/* Prints a usage error with a pointer to --help and returns PX_EXIT_USAGE. */
int px__cli_usage_error(const char *cmd, const char *fmt, ...) PX_PRINTF(2, 3);
/* Prints v in canonical form to stdout; returns PX_EXIT_OK or PX_EXIT_FAIL. */
int px__cli_print_json(const json_t *v);
/* Prints v to stdout as JSON (canonical form) or, for PX_CLI_YAML, as
 * YAML (src/cli/cli_yaml.c); PX_CLI_TEXT prints JSON too.  Returns
 * PX_EXIT_OK or PX_EXIT_FAIL. */
int px__cli_print_doc(const json_t *v, px_cli_format fmt);
/* Writes v to f as a YAML 1.2 block document: objects as mappings in
 * their key order, arrays as sequences, strings plain where YAML reads
 * them back as the same string and double-quoted (JSON escapes) where
 * not.  Loading the output with any YAML 1.2 reader gives v back. */
void px__cli_yaml_write(const json_t *v, FILE *f);
/* Whether argv holds -h or --help before a "--". */
bool px__cli_wants_help(int argc, char **argv);
/* The vocabulary of `plexus generate` and `plexus run`: the tokenizer
 * file when given, the model's own, or tok512.bin beside a llama2.c
 * checkpoint (read into out, from arena).  Errors name the model and say
 * to pass --tokenizer FILE. */
px_status px__cli_find_vocab(const char *model, const char *tokenizer, const px_ir_model *ir,
                             px_arena *arena, px_ir_vocab *out, const px_ir_vocab **vocab,
                             px_err *err);
/* Announces on stderr a file written: "plexus CMD: wrote PATH (WHAT)". */
void px__cli_wrote(const char *cmd, const char *path, const char *what);
/* Reads an inventory; on failure prints "refusing the inventory" with
 * every diagnostic (or the error) on stderr.  opt may be NULL. */
px_status px__cli_load_inventory(const char *cmd, const char *path, const px_hw_read_options *opt,
                                 px_hw_graph **out, px_diags *diags, px_err *err);
/* Opens a model file or preset with opts (may be NULL); prints the error
 * on failure. */
px_status px__cli_open_model(const char *cmd, const char *spec, const px_ir_open_opts *opts,
                             px_ir_model **out, px_err *err);
/* PX_CLI_CALL parser of --kv-dtype into a px_ir_open_opts (dest): sets
 * kv_dtype and kv_dtype_given, so that f32 overrides a preset's cache. */
px_status px__cli_parse_kv_dtype(const char *v, void *dest, px_err *err);
/* Progress of long work on stderr, only when stderr is a terminal: a
 * line rewritten in place ("plexus simulate: replication 3/200"), ended
 * by px__cli_progress_done. */
void px__cli_progress(const char *cmd, const char *fmt, ...) PX_PRINTF(2, 3);
void px__cli_progress_done(void);
/* What `plexus generate` and `plexus run` share: the prompts, the
 * tokenizer and the sampling, with one set of defaults (greedy, 64 new
 * tokens, top-p 0.9, seed 42) so that the same command line gives the
 * same text on one machine and across stage workers. */
typedef struct px__cli_sampling {
    const char *tokenizer;
    px_cli_list prompts;
    uint32_t n_new;
    double temp, top_p;
    uint64_t seed;
} px__cli_sampling;

#define PX__CLI_SAMPLING_DEFAULTS                        \
    (px__cli_sampling)                                   \
    {                                                    \
        .n_new = 64, .temp = 0, .top_p = 0.9, .seed = 42 \
    }

/* The rows of those options, for a command's table. */
#define PX__CLI_SAMPLING_OPTS(s)                                                              \
    PX_CLI_OPT("prompt", 0, PX_CLI_LIST, &(s).prompts, "TEXT",                                \
               "text to continue (repeat: the prompts decode together)"),                     \
        PX_CLI_OPT("tokens", 'n', PX_CLI_U32, &(s).n_new, "N",                                \
                   "new tokens per prompt (default 64; stops early at EOS\n"                  \
                   "or at the end of the context)",                                           \
                   .lo = 1, .hi = 1u << 24),                                                  \
        PX_CLI_OPT("temp", 0, PX_CLI_NUM, &(s).temp, "T",                                     \
                   "temperature, 0 for greedy decoding (default 0)", .lo = 0, .hi = 100),     \
        PX_CLI_OPT("top-p", 0, PX_CLI_NUM, &(s).top_p, "P",                                   \
                   "nucleus sampling threshold, 1 for none (default 0.9)", .lo = 0, .hi = 1), \
        PX_CLI_OPT("seed", 0, PX_CLI_U64, &(s).seed, "S",                                     \
                   "random seed; prompt i uses S + i (default 42)"),                          \
        PX_CLI_OPT("tokenizer", 0, PX_CLI_STR, &(s).tokenizer, "FILE",                        \
                   "llama2.c tokenizer (tok512.bin); default: the model's\n"                  \
                   "own vocabulary, or tok512.bin next to a .bin checkpoint")

/* --transport of `plexus run` and `plexus serve`: unix, tcp, or
 * tcp:A.B.C.D (workers a launcher starts on that address). */
typedef struct px__cli_transport {
    px_rt_transport kind;
    const char *host; /* tcp:A.B.C.D; NULL otherwise */
} px__cli_transport;
/* PX_CLI_CALL parser of --transport into a px__cli_transport. */
px_status px__cli_parse_transport(const char *v, void *dest, px_err *err);
/* Parses every --inject SPEC of list into out (at most max); prints a
 * usage error naming the spec and returns false on a malformed one. */
bool px__cli_parse_injects(const char *cmd, const px_cli_list *list, px_heal_inject *out,
                           uint32_t max, uint32_t *n);

/* `plexus model quantize` (src/cli/model_quantize.c). */
int px__cmd_model_quantize(const char *in, const char *out, const char *type, px_cli_format fmt);
/* `plexus inventory discover` (src/cli/inventory_discover.c). */
int px__cmd_inventory_discover(int argc, char **argv);

#endif
