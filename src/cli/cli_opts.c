/*
 * The declarative option parser of the subcommands, and the help and man
 * pages generated from the same tables (cli.h explains the tables).
 */
#include "cli/cli.h"

#include <ctype.h>

#define HELP_COLUMN 28

/* ------------------------------------------------------------------ */
/* Near misses                                                         */
/* ------------------------------------------------------------------ */

/* Edit distance with transpositions (optimal string alignment), capped:
 * anything past 8 reads as far. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 48 || lb > 48)
        return SIZE_MAX;
    size_t d[50][50];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t v = PX_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
            v = PX_MIN(v, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                v = PX_MIN(v, d[i - 2][j - 2] + 1);
            d[i][j] = v;
        }
    return d[la][lb];
}

const char *px__cli_nearest(const char *s, const char *const *words)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX, n = strlen(s);
    for (const char *const *w = words; *w; w++) {
        size_t d = distance(s, *w);
        /* A prefix of a longer word counts as near ("--rep" for
         * "--replications"). */
        if (n >= 3 && !strncmp(*w, s, n))
            d = PX_MIN(d, 1);
        if (d < best_d) {
            best_d = d;
            best = *w;
        }
    }
    size_t limit = n <= 4 ? 1 : n <= 8 ? 2 : 3;
    return best_d <= limit ? best : NULL;
}

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

static const char *kind_arg(const px_cli_opt *o)
{
    if (o->arg)
        return o->arg;
    switch (o->kind) {
    case PX_CLI_U32:
    case PX_CLI_U64:
        return "N";
    case PX_CLI_NUM:
        return "X";
    case PX_CLI_TIME:
        return "TIME";
    case PX_CLI_SIZE:
        return "SIZE";
    case PX_CLI_FORMAT:
        return "FORMAT";
    default:
        return "VALUE";
    }
}

/* Whether v is one of the '|'-separated choices. */
static bool in_choices(const char *v, const char *choices)
{
    size_t n = strlen(v);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && !strncmp(c, v, n))
            return true;
        if (!bar)
            break;
        c = bar + 1;
    }
    return false;
}

/* The choices as "a, b or c". */
static void choices_text(const char *choices, char *buf, size_t cap)
{
    buf[0] = 0;
    size_t n_bars = 0, used = 0;
    for (const char *c = choices; *c; c++)
        n_bars += *c == '|';
    size_t k = 0;
    for (const char *c = choices; *c && used + 8 < cap;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        const char *sep = k == 0 ? "" : k == n_bars ? " or " : ", ";
        int w = snprintf(buf + used, cap - used, "%s%.*s", sep, (int)len, c);
        if (w < 0)
            break;
        used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
        k++;
        if (!bar)
            break;
        c = bar + 1;
    }
}

static bool whole(const char *v, uint64_t *out)
{
    if (!v[0] || v[0] == '-' || v[0] == '+' || isspace((unsigned char)v[0]))
        return false;
    char *end;
    errno = 0;
    unsigned long long u = strtoull(v, &end, 10);
    if (errno || *end)
        return false;
    *out = u;
    return true;
}

/* Reads v into o->dest; on failure writes the reason (after "--name takes")
 * into why. */
static bool read_value(const px_cli_opt *o, const char *v, char *why, size_t cap)
{
    uint64_t u;
    px_qty q;
    switch (o->kind) {
    case PX_CLI_FLAG:
        return false;
    case PX_CLI_STR:
        if (!v[0]) {
            snprintf(why, cap, "takes a non-empty %s", kind_arg(o));
            return false;
        }
        *(const char **)o->dest = v;
        return true;
    case PX_CLI_LIST: {
        px_cli_list *l = o->dest;
        if (l->n == PX_CLI_LIST_MAX) {
            snprintf(why, cap, "may be given at most %d times", PX_CLI_LIST_MAX);
            return false;
        }
        l->v[l->n++] = v;
        return true;
    }
    case PX_CLI_U32:
    case PX_CLI_U64: {
        double hi = o->hi > 0 ? o->hi : o->kind == PX_CLI_U32 ? (double)UINT32_MAX : 0;
        if (!whole(v, &u) || (double)u < o->lo || (hi > 0 && (double)u > hi)) {
            if (hi > 0)
                snprintf(why, cap, "takes a whole number from %.0f to %.0f, not \"%s\"", o->lo, hi,
                         v);
            else
                snprintf(why, cap, "takes a whole number of at least %.0f, not \"%s\"", o->lo, v);
            return false;
        }
        if (o->kind == PX_CLI_U32)
            *(uint32_t *)o->dest = (uint32_t)u;
        else
            *(uint64_t *)o->dest = u;
        return true;
    }
    case PX_CLI_NUM: {
        char *end;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || x < o->lo || (o->hi > o->lo && x > o->hi)) {
            if (o->hi > o->lo)
                snprintf(why, cap, "takes a number from %g to %g, not \"%s\"", o->lo, o->hi, v);
            else
                snprintf(why, cap, "takes a number of at least %g, not \"%s\"", o->lo, v);
            return false;
        }
        *(double *)o->dest = x;
        return true;
    }
    case PX_CLI_TIME:
    case PX_CLI_SIZE: {
        bool time = o->kind == PX_CLI_TIME;
        /* A time may also be a bare number of seconds ("--timeout 60"). */
        char *end = NULL;
        double secs = time ? strtod(v, &end) : 0;
        if (time && end != v && *end == '\0' && isfinite(secs)) {
            q.value = secs;
        } else if (px_qty_parse(v, time ? PX_DIM_TIME : PX_DIM_BYTES, &q, NULL) != PX_OK) {
            q.value = NAN;
        }
        if (!(q.value >= o->lo) || (o->hi > o->lo && q.value > o->hi)) {
            snprintf(why, cap, "takes %s, not \"%s\"",
                     time ? "a time such as 90s, 2min or 30 (seconds)"
                          : "a size with its unit such as 512MiB or 16GiB",
                     v);
            return false;
        }
        *(double *)o->dest = q.value;
        return true;
    }
    case PX_CLI_FORMAT: {
        const char *choices = o->choices ? o->choices : "text|json";
        if (!in_choices(v, choices)) {
            char list[128];
            choices_text(choices, list, sizeof list);
            snprintf(why, cap, "takes %s, not \"%s\"%s", list, v,
                     strchr(v, '.') || strchr(v, '/') ? " (a file goes with --out FILE)" : "");
            return false;
        }
        *(px_cli_format *)o->dest = !strcmp(v, "json")   ? PX_CLI_JSON
                                    : !strcmp(v, "yaml") ? PX_CLI_YAML
                                                         : PX_CLI_TEXT;
        return true;
    }
    case PX_CLI_CHOICE:
        if (!in_choices(v, o->choices)) {
            char list[256];
            choices_text(o->choices, list, sizeof list);
            snprintf(why, cap, "takes %s, not \"%s\"", list, v);
            return false;
        }
        *(const char **)o->dest = v;
        return true;
    case PX_CLI_CALL: {
        px_err err;
        px_err_clear(&err);
        if (o->parse(v, o->dest, &err) != PX_OK) {
            px_textf(why, cap, "%s", err.msg[0] ? err.msg : "is not valid here");
            return false;
        }
        return true;
    }
    }
    return false;
}

/* ------------------------------------------------------------------ */
/* Parsing                                                             */
/* ------------------------------------------------------------------ */

static const px_cli_opt *find_long(const px_cli_spec *spec, const char *name, size_t len)
{
    for (const px_cli_opt *o = spec->opts; o && o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len))
            return o;
    return NULL;
}

static const px_cli_opt *find_short(const px_cli_spec *spec, char c)
{
    for (const px_cli_opt *o = spec->opts; o && o->name; o++)
        if (o->short_name == c)
            return o;
    return NULL;
}

/* "unknown option" with the nearest long option, if any. */
static int unknown_option(const px_cli_spec *spec, const char *given, size_t len)
{
    const char *names[128];
    char buf[128][48];
    size_t n = 0;
    for (const px_cli_opt *o = spec->opts; o && o->name && n + 2 < PX_ARRAY_LEN(names); o++) {
        if (o->flags & PX_CLI_HIDDEN)
            continue;
        snprintf(buf[n], sizeof buf[n], "--%s", o->name);
        names[n] = buf[n];
        n++;
    }
    names[n++] = "--help";
    names[n] = NULL;
    char opt[80];
    snprintf(opt, sizeof opt, "%.*s", (int)PX_MIN(len, sizeof opt - 1), given);
    if ((!strcmp(opt, "-o") || !strcmp(opt, "--output")) && find_long(spec, "out", 3))
        return px__cli_usage_error(spec->name,
                                   "unknown option \"%s\": -o is a report format in plexus; a "
                                   "file goes with --out FILE",
                                   opt);
    const char *near = px__cli_nearest(opt, names);
    if (near)
        return px__cli_usage_error(spec->name, "unknown option \"%s\"; did you mean %s?", opt,
                                   near);
    return px__cli_usage_error(spec->name, "unknown option \"%s\"", opt);
}

static int value_error(const px_cli_spec *spec, const px_cli_opt *o, const char *why)
{
    char name[64];
    if (o->short_name)
        snprintf(name, sizeof name, "-%c/--%s", o->short_name, o->name);
    else
        snprintf(name, sizeof name, "--%s", o->name);
    return px__cli_usage_error(spec->name, "%s %s", name, why);
}

bool px__cli_parse(const px_cli_spec *spec, int argc, char **argv, px_cli_args *args, int *rc)
{
    *rc = PX_EXIT_OK;
    args->v = argv + argc;
    args->n = 0;
    /* Operands are gathered in order into ops, then copied to the end of
     * argv, after the options. */
    char **ops = calloc((size_t)argc + 1, sizeof *ops);
    bool *seen = calloc(64 + 1, sizeof *seen);
    if (!ops || !seen) {
        free(ops);
        free(seen);
        fprintf(stderr, "plexus %s: out of memory\n", spec->name);
        *rc = PX_EXIT_FAIL;
        return false;
    }
    int n_ops = 0;
    bool options_end = false;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (options_end || a[0] != '-' || !a[1]) {
            ops[n_ops++] = a;
            if (spec->flags & PX_CLI_OPERANDS_END)
                options_end = true;
            continue;
        }
        if (!strcmp(a, "--")) {
            options_end = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            px__cli_help(spec, stdout);
            goto stop;
        }
        const px_cli_opt *o;
        const char *value = NULL;
        if (a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            if (!(o = find_long(spec, name, len))) {
                *rc = unknown_option(spec, a, (size_t)(eq ? eq - a : (ptrdiff_t)strlen(a)));
                goto stop;
            }
            if (eq)
                value = eq + 1;
        } else {
            if (!(o = find_short(spec, a[1]))) {
                char opt[3] = {'-', a[1], 0};
                *rc = unknown_option(spec, opt, 2);
                goto stop;
            }
            if (a[2])
                value = a + 2;
        }
        if (o->kind == PX_CLI_FLAG) {
            if (value) {
                *rc = value_error(spec, o, "takes no value");
                goto stop;
            }
            *(bool *)o->dest = true;
        } else {
            if (!value) {
                if (i + 1 >= argc) {
                    char why[128];
                    snprintf(why, sizeof why, "needs a value (%s)", kind_arg(o));
                    *rc = value_error(spec, o, why);
                    goto stop;
                }
                value = argv[++i];
            }
            char why[400];
            if (!read_value(o, value, why, sizeof why)) {
                *rc = value_error(spec, o, why);
                goto stop;
            }
        }
        if (o->seen)
            *o->seen = true;
        size_t k = (size_t)(o - spec->opts);
        if (k < 64)
            seen[k] = true;
    }
    for (const px_cli_opt *o = spec->opts; o && o->name; o++) {
        size_t k = (size_t)(o - spec->opts);
        if ((o->flags & PX_CLI_REQUIRED) && k < 64 && !seen[k]) {
            *rc = px__cli_usage_error(spec->name, "--%s %s is required", o->name, kind_arg(o));
            goto stop;
        }
    }
    if (!spec->operands && n_ops > 0) {
        *rc = px__cli_usage_error(spec->name, "unexpected argument \"%s\"", ops[0]);
        goto stop;
    }
    if (n_ops < spec->min_operands) {
        *rc = px__cli_usage_error(spec->name, "%s is required", spec->operands);
        goto stop;
    }
    if (spec->max_operands >= 0 && n_ops > spec->max_operands) {
        *rc = px__cli_usage_error(spec->name, "unexpected argument \"%s\" (%d %s at most)",
                                  ops[spec->max_operands], spec->max_operands, spec->operands);
        goto stop;
    }
    /* The operands go last, in order: argv[argc - n_ops .. argc - 1]. */
    for (int i = 0; i < n_ops; i++)
        argv[argc - n_ops + i] = ops[i];
    args->v = argv + argc - n_ops;
    args->n = n_ops;
    free(ops);
    free(seen);
    return true;
stop:
    free(ops);
    free(seen);
    return false;
}

static void append(char *buf, const char *s, size_t cap)
{
    size_t used = strlen(buf);
    if (used < cap)
        px_strlcpy(buf + used, s, cap - used);
}

const px_cli_spec *px__cli_action(const char *cmd, const px_cli_spec *const *specs, int argc,
                                  char **argv, int *rc)
{
    const char *names[64];
    size_t n = 0;
    for (const px_cli_spec *const *s = specs; *s && n + 1 < PX_ARRAY_LEN(names); s++) {
        const char *sp = strrchr((*s)->name, ' ');
        names[n++] = sp ? sp + 1 : (*s)->name;
    }
    names[n] = NULL;
    char list[256] = "";
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            append(list, i + 1 == n ? " or " : ", ", sizeof list);
        append(list, names[i], sizeof list);
    }
    if (argc < 2) {
        *rc = px__cli_usage_error(cmd, "name an action: %s", list);
        return NULL;
    }
    const char *a = argv[1];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        printf("usage:\n");
        for (size_t i = 0; specs[i]; i++)
            printf("  plexus %s %s\n", specs[i]->name,
                   specs[i]->synopsis ? specs[i]->synopsis : "");
        printf("\n");
        int width = 10;
        for (size_t i = 0; i < n; i++)
            width = PX_MAX(width, (int)strlen(names[i]));
        for (size_t i = 0; specs[i]; i++)
            printf("  %-*s  %s\n", width, names[i], specs[i]->summary ? specs[i]->summary : "");
        /* The first example of each action. */
        printf("\nexamples:\n");
        for (size_t i = 0; specs[i]; i++) {
            const char *ex = specs[i]->examples;
            if (ex && *ex)
                printf("  %.*s\n", (int)strcspn(ex, "\n"), ex);
        }
        printf("\nrun 'plexus %s ACTION --help' for an action's options.\n", cmd);
        *rc = PX_EXIT_OK;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], a))
            return specs[i];
    const char *near = px__cli_nearest(a, names);
    if (near)
        *rc = px__cli_usage_error(cmd, "unknown action \"%s\"; did you mean %s?", a, near);
    else
        *rc = px__cli_usage_error(cmd, "unknown action \"%s\"; use %s", a, list);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Help and man pages                                                  */
/* ------------------------------------------------------------------ */

/* "-o, --output FORMAT" or "    --model FILE". */
static void opt_label(const px_cli_opt *o, char *buf, size_t cap)
{
    char value[64] = "";
    if (o->kind != PX_CLI_FLAG)
        snprintf(value, sizeof value, " %s", kind_arg(o));
    if (o->short_name)
        snprintf(buf, cap, "-%c, --%s%s", o->short_name, o->name, value);
    else
        snprintf(buf, cap, "    --%s%s", o->name, value);
}

/* Prints text with every line indented by `indent` spaces. */
static void indented(FILE *f, const char *text, int indent)
{
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        fprintf(f, "%*s%.*s\n", len ? indent : 0, "", (int)len, line);
        if (!nl)
            break;
        line = nl + 1;
    }
}

void px__cli_help(const px_cli_spec *spec, FILE *f)
{
    fprintf(f, "usage: plexus %s %s\n", spec->name, spec->synopsis ? spec->synopsis : "");
    if (spec->about) {
        fputc('\n', f);
        indented(f, spec->about, 0);
    }
    fprintf(f, "\noptions:\n");
    for (const px_cli_opt *o = spec->opts; o && o->name; o++) {
        if (o->flags & PX_CLI_HIDDEN)
            continue;
        char label[96];
        opt_label(o, label, sizeof label);
        const char *help = o->help ? o->help : "";
        const char *nl = strchr(help, '\n');
        int len = nl ? (int)(nl - help) : (int)strlen(help);
        if ((int)strlen(label) + 4 > HELP_COLUMN) {
            fprintf(f, "  %s\n%*s%.*s\n", label, HELP_COLUMN, "", len, help);
        } else {
            fprintf(f, "  %-*s%.*s\n", HELP_COLUMN - 2, label, len, help);
        }
        if (nl)
            indented(f, nl + 1, HELP_COLUMN);
    }
    fprintf(f, "  %-*s%s\n", HELP_COLUMN - 2, "-h, --help", "this help");
    if (spec->more) {
        fputc('\n', f);
        indented(f, spec->more, 0);
    }
    if (spec->examples) {
        fprintf(f, "\nexamples:\n");
        indented(f, spec->examples, 2);
    }
}

/* Text for roff: a leading '.' or '\'' is escaped, and backslashes. */
static void roff(FILE *f, const char *text, size_t len)
{
    bool line_start = true;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (line_start && (c == '.' || c == '\''))
            fputs("\\&", f);
        if (c == '\\')
            fputs("\\e", f);
        else if (c == '-')
            fputs("\\-", f);
        else
            fputc(c, f);
        line_start = c == '\n';
    }
}

static void roff_str(FILE *f, const char *text)
{
    roff(f, text, strlen(text));
}

void px__cli_man(const px_cli_spec *spec, const char *summary, FILE *f)
{
    char title[96];
    snprintf(title, sizeof title, "plexus-%s", spec->name);
    for (char *p = title; *p; p++)
        *p = *p == ' ' ? '-' : (char)toupper((unsigned char)*p);
    fprintf(f, ".TH %s 1 \"\" \"plexus %s\" \"plexus manual\"\n", title, px_version());
    fprintf(f, ".SH NAME\nplexus\\-");
    for (const char *p = spec->name; *p; p++)
        fputs(*p == ' ' ? "\\-" : (char[]){*p, 0}, f);
    fputs(" \\- ", f);
    roff_str(f, summary ? summary : spec->summary ? spec->summary : "");
    fprintf(f, "\n.SH SYNOPSIS\n.B plexus %s\n", spec->name);
    if (spec->synopsis) {
        roff_str(f, spec->synopsis);
        fputc('\n', f);
    }
    if (spec->about) {
        fprintf(f, ".SH DESCRIPTION\n");
        for (const char *p = spec->about; *p;) {
            const char *end = strstr(p, "\n\n");
            size_t len = end ? (size_t)(end - p) : strlen(p);
            fprintf(f, ".PP\n");
            roff(f, p, len);
            fputc('\n', f);
            if (!end)
                break;
            p = end + 2;
        }
    }
    fprintf(f, ".SH OPTIONS\n");
    for (const px_cli_opt *o = spec->opts; o && o->name; o++) {
        if (o->flags & PX_CLI_HIDDEN)
            continue;
        fprintf(f, ".TP\n");
        if (o->short_name)
            fprintf(f, "\\fB\\-%c\\fR, ", o->short_name);
        fprintf(f, "\\fB\\-\\-");
        roff_str(f, o->name);
        fprintf(f, "\\fR");
        if (o->kind != PX_CLI_FLAG) {
            fprintf(f, " \\fI");
            roff_str(f, kind_arg(o));
            fprintf(f, "\\fR");
        }
        fputc('\n', f);
        roff_str(f, o->help ? o->help : "");
        fputc('\n', f);
    }
    fprintf(f, ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nthis help\n");
    if (spec->more) {
        fprintf(f, ".SH NOTES\n.nf\n");
        roff_str(f, spec->more);
        fprintf(f, "\n.fi\n");
    }
    if (spec->examples) {
        fprintf(f, ".SH EXAMPLES\n.nf\n");
        roff_str(f, spec->examples);
        fprintf(f, "\n.fi\n");
    }
    fprintf(f, ".SH EXIT STATUS\n0 success; 1 an error (a file unreadable or malformed, a server "
               "unreachable, the work failed); 2 bad usage; 3 a verdict: the work ran and its "
               "answer is no (forbidden, diverged, refused).\n"
               ".SH SEE ALSO\n.BR plexus (1)\n");
}
