/*
 * Private helpers shared by the plexus subcommands.  Each subcommand lives
 * in cmd_<name>.c and defines
 *
 *     const char px__cmd_<name>_summary[] = "one line for `plexus --help`";
 *     int px__cmd_<name>(int argc, char **argv);   // argv[0] is "<name>"
 *
 * and returns a process exit status: 0 success, 1 failure of the work,
 * 2 bad usage.  Subcommands hold no logic a library user would need.
 */
#ifndef PX_CLI_H
#define PX_CLI_H

#include "base/common.h"

#include "plexus/ir.h"

enum { PX_EXIT_OK = 0, PX_EXIT_FAIL = 1, PX_EXIT_USAGE = 2 };

typedef enum px_cli_format {
    PX_CLI_TEXT = 0,
    PX_CLI_JSON = 1,
} px_cli_format;

/* Parses the argument of -o/--output.  Prints a usage error and returns
 * false for anything but "text" or "json". */
bool px__cli_parse_format(const char *cmd, const char *arg, px_cli_format *out);
/* Prints "plexus <cmd>: <message>" to stderr and returns PX_EXIT_FAIL. */
int px__cli_fail(const char *cmd, const px_err *err);
/* Prints a usage error with a pointer to --help and returns PX_EXIT_USAGE. */
int px__cli_usage_error(const char *cmd, const char *fmt, ...) PX_PRINTF(2, 3);
/* Prints v in canonical form to stdout; returns PX_EXIT_OK or PX_EXIT_FAIL. */
int px__cli_print_json(const json_t *v);
/* Whether argv holds -h or --help before a "--". */
bool px__cli_wants_help(int argc, char **argv);
/* The vocabulary of `plexus generate` and `plexus run`: the tokenizer
 * file when given, the model's own, or tok512.bin beside a llama2.c
 * checkpoint (read into out, from arena).  Errors name the model and say
 * to pass --tokenizer FILE. */
px_status px__cli_find_vocab(const char *model, const char *tokenizer, const px_ir_model *ir,
                             px_arena *arena, px_ir_vocab *out, const px_ir_vocab **vocab,
                             px_err *err);
/* `plexus model quantize` (src/cli/model_quantize.c). */
int px__cmd_model_quantize(int argc, char **argv);
/* `plexus inventory discover` (src/cli/inventory_discover.c). */
int px__cmd_inventory_discover(int argc, char **argv);

#endif
