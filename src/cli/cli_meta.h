/*
 * What `plexus completion` and `plexus man` learn of each subcommand
 * (src/cli/cli_meta.c).
 */
#ifndef PX_CLI_META_H
#define PX_CLI_META_H

#include "cli/cli.h"

/* A set of words (option names, actions, choices), kept in order. */
typedef struct px__cli_words {
    char v[160][48];
    size_t n;
} px__cli_words;

/* What run(name [action] --help) prints on stdout, captured (returns
 * owned: free()); NULL on failure. */
char *px__cli_capture_help(int (*run)(int, char **), const char *name, const char *action);
/* Adds word[0..len) unless present or too long. */
void px__cli_words_add(px__cli_words *w, const char *word, size_t len);
/* The options of a spec: --name and -x. */
void px__cli_words_from_spec(px__cli_words *w, const px_cli_spec *spec);
/* The options a help text mentions: every --word and -x. */
void px__cli_words_from_help(px__cli_words *w, const char *text);

#endif
