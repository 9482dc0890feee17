/*
 * What `plexus completion` and `plexus man` need to know of every
 * subcommand: its option tables when it has them, else what its own
 * --help prints.
 */
#include "cli/cli_meta.h"

#include <ctype.h>

#include <fcntl.h>
#include <unistd.h>

char *px__cli_capture_help(int (*run)(int, char **), const char *name, const char *action)
{
    char *argv[4] = {(char *)name, NULL, NULL, NULL};
    int argc = 1;
    if (action)
        argv[argc++] = (char *)action;
    argv[argc++] = "--help";
    fflush(stdout);
    FILE *tmp = tmpfile();
    int saved = dup(STDOUT_FILENO);
    if (!tmp || saved < 0 || dup2(fileno(tmp), STDOUT_FILENO) < 0) {
        if (tmp)
            fclose(tmp);
        if (saved >= 0)
            close(saved);
        return NULL;
    }
    run(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    long len = ftell(tmp);
    char *text = len >= 0 && len < (1 << 20) ? malloc((size_t)len + 1) : NULL;
    if (text) {
        rewind(tmp);
        size_t got = fread(text, 1, (size_t)len, tmp);
        text[got] = 0;
    }
    fclose(tmp);
    return text;
}

void px__cli_words_add(px__cli_words *w, const char *word, size_t len)
{
    if (len == 0 || len >= sizeof w->v[0] || w->n == PX_ARRAY_LEN(w->v))
        return;
    for (size_t i = 0; i < w->n; i++)
        if (strlen(w->v[i]) == len && !strncmp(w->v[i], word, len))
            return;
    memcpy(w->v[w->n], word, len);
    w->v[w->n][len] = 0;
    w->n++;
}

void px__cli_words_from_spec(px__cli_words *w, const px_cli_spec *spec)
{
    char buf[64];
    for (const px_cli_opt *o = spec->opts; o && o->name; o++) {
        if (o->flags & PX_CLI_HIDDEN)
            continue;
        int n = snprintf(buf, sizeof buf, "--%s", o->name);
        px__cli_words_add(w, buf, (size_t)n);
        if (o->short_name) {
            n = snprintf(buf, sizeof buf, "-%c", o->short_name);
            px__cli_words_add(w, buf, (size_t)n);
        }
    }
    px__cli_words_add(w, "--help", 6);
}

void px__cli_words_from_help(px__cli_words *w, const char *text)
{
    for (const char *p = text; p && *p; p++) {
        if (p[0] != '-' || (p != text && !isspace((unsigned char)p[-1]) && p[-1] != '[' &&
                            p[-1] != '|' && p[-1] != ','))
            continue;
        const char *q = p + 1;
        if (*q == '-')
            q++;
        if (!isalpha((unsigned char)*q))
            continue;
        while (isalnum((unsigned char)*q) || *q == '-')
            q++;
        if (q[-1] == '-')
            continue;
        if (p[1] != '-' && q - p != 2)
            continue; /* a short option is one letter */
        px__cli_words_add(w, p, (size_t)(q - p));
        p = q - 1;
    }
}
