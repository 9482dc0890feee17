/*
 * YAML for `-o yaml`: the same tree `-o json` prints, written as a YAML
 * block document.  Only what JSON holds is written (mappings, sequences,
 * strings, numbers, booleans, null), so no YAML feature beyond the JSON
 * schema is needed, and any string YAML could read as something else is
 * double-quoted with JSON's escapes, which YAML's double-quoted style
 * shares.
 */
#include "cli/cli.h"

#include <ctype.h>

/* Words a YAML reader (1.1 or 1.2) takes for a boolean or null. */
static const char *const reserved[] = {"true", "false", "null", "yes", "no", "on",
                                       "off",  "y",     "n",    "~",   NULL};

/* Whether s can be written as a plain scalar and read back as the same
 * string. */
static bool plain_ok(const char *s, size_t len)
{
    if (len == 0 || len > 200 || strlen(s) != len)
        return false;
    if (isspace((unsigned char)s[0]) || isspace((unsigned char)s[len - 1]))
        return false;
    if (strchr("-?:,[]{}#&*!|>'\"%@`", s[0]))
        return false;
    for (const char *const *r = reserved; *r; r++)
        if (!strcasecmp(s, *r))
            return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c >= 0x80)
            return false;
        /* s[0] is neither (above), so s[i - 1] exists. */
        if ((c == ':' && (i + 1 == len || s[i + 1] == ' ')) || (c == '#' && s[i - 1] == ' '))
            return false;
    }
    /* Anything a reader may take for a number (1, 0x1f, 1e3, .5, .inf,
     * 1_000) stays a string only when quoted. */
    char *end;
    errno = 0;
    (void)strtod(s, &end);
    if (end != s)
        return false;
    if (s[0] == '.' || s[0] == '+')
        return false;
    return true;
}

static void scalar(const json_t *v, FILE *f)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        if (plain_ok(s, len)) {
            fputs(s, f);
            return;
        }
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY);
    fputs(text ? text : "null", f);
    free(text);
}

static bool is_block(const json_t *v)
{
    return (json_is_object(v) && json_object_size(v) > 0) ||
           (json_is_array(v) && json_array_size(v) > 0);
}

static void value(const json_t *v, int indent, FILE *f);

/* A mapping's entries, each at `indent`; the first one's indentation is
 * already written when `first_inline` (an entry of a sequence: "- key:"). */
static void mapping(const json_t *obj, int indent, bool first_inline, FILE *f)
{
    const char *key;
    json_t *member;
    bool first = true;
    json_object_foreach((json_t *)obj, key, member)
    {
        if (!(first && first_inline))
            fprintf(f, "%*s", indent, "");
        first = false;
        json_t *k = json_string(key);
        scalar(k, f);
        json_decref(k);
        fputc(':', f);
        if (is_block(member)) {
            fputc('\n', f);
            value(member, indent + 2, f);
        } else {
            fputc(' ', f);
            scalar(member, f);
            fputc('\n', f);
        }
    }
}

static void sequence(const json_t *arr, int indent, FILE *f)
{
    size_t i;
    json_t *item;
    json_array_foreach(arr, i, item)
    {
        fprintf(f, "%*s-", indent, "");
        if (json_is_object(item) && json_object_size(item) > 0) {
            fputc(' ', f);
            mapping(item, indent + 2, true, f);
        } else if (is_block(item)) {
            fputc('\n', f);
            sequence(item, indent + 2, f);
        } else {
            fputc(' ', f);
            scalar(item, f);
            fputc('\n', f);
        }
    }
}

static void value(const json_t *v, int indent, FILE *f)
{
    if (json_is_object(v) && json_object_size(v) > 0)
        mapping(v, indent, false, f);
    else if (json_is_array(v) && json_array_size(v) > 0)
        sequence(v, indent, f);
    else if (json_is_object(v))
        fprintf(f, "%*s{}\n", indent, "");
    else if (json_is_array(v))
        fprintf(f, "%*s[]\n", indent, "");
    else {
        fprintf(f, "%*s", indent, "");
        scalar(v, f);
        fputc('\n', f);
    }
}

void px__cli_yaml_write(const json_t *v, FILE *f)
{
    value(v, 0, f);
}
