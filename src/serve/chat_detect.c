/*
 * Recognizing a GGUF's chat template (tokenizer.chat_template, Jinja
 * source) as one of the built-ins, by markers: the special texts a
 * template writes ("<|im_start|>", "[INST]", "<start_of_turn>") and, within
 * a family, the literal strings that tell its versions apart (where the
 * spaces around "[INST]" go).  The order and the markers follow what tells
 * the templates of common GGUF files apart; a template that carries a
 * family's markers but renders differently (Yi's system message outside any
 * turn, Llama Guard's classification prompt) is refused rather than
 * rendered wrong, and the user names a template with --chat-template.
 */
#include "serve/serve_impl.h"

typedef struct source {
    const char *s;
    size_t n;
} source;

static const char *find(source j, const char *needle)
{
    size_t k = strlen(needle);
    return k <= j.n ? memmem(j.s, j.n, needle, k) : NULL;
}

static bool has(source j, const char *needle)
{
    return find(j, needle) != NULL;
}

/* Whether the Jinja holds needle, its newlines written either as newlines
 * or as the escape \n inside a string literal (templates do both). */
static bool has_nl(source j, const char *needle)
{
    if (has(j, needle))
        return true;
    char buf[160];
    size_t k = 0;
    for (const char *p = needle; *p && k + 2 < sizeof buf; p++) {
        if (*p == '\n')
            buf[k++] = '\\', buf[k++] = 'n';
        else
            buf[k++] = *p;
    }
    buf[k] = '\0';
    return has(j, buf);
}

/* Markers reported when no built-in matches, so that the user sees what
 * the template looks like. */
static const char *const known_markers[] = {
    "<|im_start|>",
    "<|im_sep|>",
    "[INST]",
    "[SYSTEM_PROMPT]",
    "<<SYS>>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|START_OF_TURN_TOKEN|>",
    "<|START_RESPONSE|>",
    "<\xef\xbd\x9cUser\xef\xbd\x9c>",
    "### Instruction:",
    "<|EOT|>",
    "GPT4 Correct ",
    "USER: ",
    "ASSISTANT: ",
    "[gMASK]",
    "<|header_start|>",
    "<|start_of_role|>",
    "<end_of_utterance>",
    "<think>",
    "bos_token",
    "eos_token",
};

static void list_markers(source j, px_strbuf *out)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(known_markers); i++) {
        if (!has(j, known_markers[i]))
            continue;
        px_strbuf_addf(out, "%s\"%s\"", out->len ? ", " : "", known_markers[i]);
    }
}

/* ChatML proper writes each message's role into one <|im_start|> header;
 * relatives that only share the tokens (Yi, SmolVLM, ...) do not. */
static const char *recognize_chatml(source j, unsigned *variant)
{
    if (has(j, "<|im_sep|>"))
        return "phi-4";
    bool generic = has(j, "'<|im_start|>' + message") || has(j, "\"<|im_start|>\" + message") ||
                   has(j, "<|im_start|>{{ message") || has(j, "<|im_start|>{{message");
    /* DBRX starts each turn with a newline instead of ending it with one;
     * SmolVLM only borrows the tokens. */
    if (!generic || has(j, "<end_of_utterance>") || has_nl(j, "'\n' + '<|im_start|>'"))
        return NULL;
    if (has(j, "(loop.last and add_generation_prompt) or not loop.last"))
        *variant |= PX__CHAT_OPEN_LAST;
    if (has_nl(j, "'<|im_start|>assistant\n<think>\n'"))
        *variant |= PX__CHAT_THINK;
    if (has(j, "reasoning_content"))
        return "qwen3";
    if (has(j, "split('</think>')"))
        *variant |= PX__CHAT_THINK_SPLIT;
    return "chatml";
}

static const char *recognize_inst(source j, unsigned *variant)
{
    if (has(j, "eos_token + ' '") || has(j, "eos_token + \" \""))
        *variant |= PX__CHAT_EOS_SPACE;
    if (has(j, "|trim + eos_token") || has(j, "| trim + eos_token"))
        *variant |= PX__CHAT_TRIM_ASSISTANT;
    if (has(j, "[SYSTEM_PROMPT]")) {
        /* Devstral and Small 3.1 write a long default system prompt with
         * today's date, which is not reproduced here. */
        if (has(j, "default_system_message"))
            return NULL;
        return has(j, "[SYSTEM_PROMPT] ") ? "mistral-v7" : "mistral-v7-tekken";
    }
    if (has(j, "<<SYS>>"))
        return "llama-2";
    if (has(j, "' [INST] '") || has(j, "\" [INST] \""))
        return "mistral-v1";
    if (has(j, " [/INST]"))
        return "mistral";
    if (has(j, "[INST]'") || has(j, "[INST]\""))
        return "mistral-v3-tekken";
    return "mistral-v3";
}

static const char *recognize_llama3(source j, unsigned *variant)
{
    /* Llama 3 writes each message's role into its header; Llama Guard and
     * other classifiers built on the tokens do not. */
    if (!has(j, "'<|start_header_id|>' + message") && !has(j, "\"<|start_header_id|>\" + message"))
        return NULL;
    if (has(j, "Cutting Knowledge Date")) {
        if (has(j, "strftime_now"))
            *variant |= PX__CHAT_DATE_TODAY;
        return "llama-3.1";
    }
    /* Meta's 3.1 layout (a system turn always) without the dates
     * (Nemotron 70B). */
    if (has(j, "System message + builtin tools")) {
        *variant |= PX__CHAT_NO_DATE;
        return "llama-3.1";
    }
    /* The first Llama 3 template always ends with the assistant header. */
    if (!has(j, "add_generation_prompt"))
        *variant |= PX__CHAT_ALWAYS_GEN;
    return "llama-3";
}

/* Phi-3's family: <|user|> ... <|end|>. */
static const char *recognize_phi(source j, unsigned *variant)
{
    /* A system literal carrying text of its own is a fixed preamble
     * (Phi-4-mini-reasoning), not reproduced here. */
    const char *p = find(j, "'<|system|>");
    if (p && p + 11 < j.s + j.n && p[11] != '\'' && p[11] != '\\' && p[11] != '\n')
        return NULL;
    if (has(j, "'<|' + message['role'] + '|>' + message['content']"))
        return "phi-4-mini";
    if (has(j, "'system' and message['content']"))
        *variant |= PX__CHAT_SKIP_EMPTY_SYSTEM;
    if (has_nl(j, "'<|end|>' + '\n' + '<|assistant|>'") || has_nl(j, "'<|end|>\n<|assistant|>\n'"))
        *variant |= PX__CHAT_USER_OPENS;
    if (!has(j, "'system'") && !has(j, "\"system\"") && !has(j, "'<|' + message['role']"))
        *variant |= PX__CHAT_NO_SYSTEM;
    if (!has(j, "eos_token"))
        *variant |= PX__CHAT_NO_EOS_TAIL;
    return "phi-3";
}

/* <|user|> and <|assistant|> without <|end|>: Zephyr ends every turn with
 * eos_token, Tulu only the assistant's. */
static const char *recognize_zephyr(source j)
{
    if (has_nl(j, "'<|user|>\n' + message['content'] + eos_token"))
        return "zephyr";
    if (has_nl(j, "'<|user|>\n' + message['content'] + '\n'") &&
        has_nl(j, "'<|assistant|>\n'  + message['content'] + eos_token"))
        return "tulu";
    return NULL;
}

static const char *recognize_deepseek3(source j, unsigned *variant)
{
    if (has(j, "<\xef\xbd\x9c"
               "Assistant\xef\xbd\x9c><think>"))
        *variant |= PX__CHAT_THINK;
    if (has(j, "<\xef\xbd\x9c"
               "Assistant\xef\xbd\x9c></think>"))
        *variant |= PX__CHAT_THINK_OFF;
    if (has(j, "content + '<\xef\xbd\x9c"
               "Assistant\xef\xbd\x9c>'"))
        *variant |= PX__CHAT_USER_OPENS;
    return "deepseek3";
}

static const char *recognize_name(source j, unsigned *variant)
{
    /* Templates that open with raw text write a fixed preamble. */
    size_t i = 0;
    while (i < j.n && (j.s[i] == ' ' || j.s[i] == '\n' || j.s[i] == '\t' || j.s[i] == '\r'))
        i++;
    if (i == j.n || j.s[i] != '{')
        return NULL;
    if (has(j, "<|im_start|>"))
        return recognize_chatml(j, variant);
    if (has(j, "[INST]"))
        return recognize_inst(j, variant);
    if (has(j, "<|start_header_id|>") && has(j, "<|end_header_id|>"))
        return recognize_llama3(j, variant);
    if (has(j, "<start_of_turn>"))
        /* Gemma calls the assistant "model"; classifiers that only quote
         * the tokens (Granite Guardian, ShieldGemma) do not. */
        return (has(j, "'model'") || has(j, "\"model\"")) && !has(j, "<|start_of_role|>") &&
                       !has(j, "safety policy")
                   ? "gemma"
                   : NULL;
    if (has(j, "[gMASK]"))
        return NULL; /* ChatGLM writes <|user|> and <|assistant|> too */
    if (has(j, "<|assistant|>") && has(j, "<|end|>"))
        return recognize_phi(j, variant);
    if (has(j, "<|user|>") && has(j, "<|assistant|>"))
        return recognize_zephyr(j);
    if (has(j, "<|START_OF_TURN_TOKEN|>") && has(j, "<|USER_TOKEN|>"))
        /* Command R7B and Command A answer inside <|START_RESPONSE|>. */
        return has(j, "<|START_RESPONSE|>") ? NULL : "command-r";
    if (has(j, "<\xef\xbd\x9cUser\xef\xbd\x9c>") && has(j, "<\xef\xbd\x9c"
                                                           "Assistant\xef\xbd\x9c>"))
        return recognize_deepseek3(j, variant);
    if (has(j, "### Instruction:") && has(j, "<|EOT|>"))
        return "deepseek";
    if (has(j, "'Assistant: ' + message['content'] + eos_token"))
        return "deepseek2";
    if (has(j, "GPT4 Correct "))
        return "openchat";
    if (has(j, "USER: ") && has(j, "ASSISTANT: "))
        return has(j, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
    return NULL;
}

const px__chat_builtin *px__chat_recognize(const char *jinja, size_t len, unsigned *variant,
                                           px_strbuf *markers)
{
    source j = {jinja ? jinja : "", jinja ? len : 0};
    *variant = 0;
    const char *name = recognize_name(j, variant);
    if (!name) {
        *variant = 0;
        if (markers)
            list_markers(j, markers);
        return NULL;
    }
    return px__chat_builtin_find(name);
}

/* ------------------------------------------------------------------ */
/* What the Jinja says beyond its family                               */
/* ------------------------------------------------------------------ */

/* Python string escapes in a Jinja literal: \n, \t, \\, \' and \". */
static char *unescape(const char *s, size_t n)
{
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            out[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
            out[k++] = s[i];
        }
    }
    out[k] = '\0';
    return out;
}

/* A piece of the Jinja source: a string literal inside a {{ }} or {% %}
 * tag (raw bytes, escapes not undone; tag is where its tag starts), or raw
 * text between tags (tag NULL). */
typedef bool (*piece_fn)(void *ud, const char *s, size_t n, const char *tag);

/* Skips a literal opened at s[*i - 1]; false when it never closes. */
static bool skip_literal(source j, size_t *i, char quote)
{
    while (*i < j.n && j.s[*i] != quote)
        *i += j.s[*i] == '\\' && *i + 1 < j.n ? 2 : 1;
    return *i < j.n;
}

/* Calls fn for each piece in order until it returns true. */
static void each_piece(source j, piece_fn fn, void *ud)
{
    size_t i = 0;
    while (i < j.n) {
        size_t r = i;
        while (r + 1 < j.n && !(j.s[r] == '{' && j.s[r + 1] && memchr("{%#", j.s[r + 1], 3)))
            r++;
        if (r + 1 >= j.n)
            r = j.n;
        if (r > i && fn(ud, j.s + i, r - i, NULL))
            return;
        if (r >= j.n)
            return;
        char kind = j.s[r + 1];
        size_t tag = r;
        i = r + 2;
        if (kind == '#') {
            const char *e = memmem(j.s + i, j.n - i, "#}", 2);
            if (!e)
                return;
            i = (size_t)(e - j.s) + 2;
            continue;
        }
        char close = kind == '{' ? '}' : '%';
        while (i < j.n) {
            char c = j.s[i];
            if (c == '\'' || c == '"') {
                size_t a = ++i;
                if (!skip_literal(j, &i, c) || fn(ud, j.s + a, i - a, j.s + tag))
                    return;
                i++;
            } else if (c == close && i + 1 < j.n && j.s[i + 1] == '}') {
                i += 2;
                break;
            } else {
                i++;
            }
        }
    }
}

typedef struct default_search {
    const char *after; /* only pieces past this point count */
    char *text;        /* the default found */
    bool found;
} default_search;

/* The text between "<|im_start|>system\n" and "<|im_end|>\n" when s is
 * exactly one such turn. */
static bool system_turn(const char *s, size_t n, size_t *a, size_t *b)
{
    static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>\n";
    size_t h = sizeof head - 1, t = sizeof tail - 1;
    if (n <= h + t || memcmp(s, head, h) || memcmp(s + n - t, tail, t))
        return false;
    if (memmem(s + h, n - h - t, "<|im_", 5))
        return false;
    *a = h;
    *b = n - t;
    return true;
}

/* ChatML's default system message, written when the first message is not
 * a system message: a whole turn as a literal (Qwen 2 and 2.5, SmolLM 2)
 * or as raw text (Qwen 2.5 VL), or `set system_message = '...'` (DBRX,
 * StableCode). */
static bool chatml_piece(void *ud, const char *s, size_t n, const char *tag)
{
    default_search *d = ud;
    size_t a, b;
    if (!tag) {
        if (!system_turn(s, n, &a, &b))
            return false;
        d->found = true;
        d->text = px_strndup(s + a, b - a);
        return true;
    }
    static const char set[] = "system_message = ";
    size_t k = sizeof set - 1;
    char *text = unescape(s, n);
    if (!text) {
        d->found = true;
        return true;
    }
    size_t len = strlen(text);
    if ((size_t)(s - 1 - tag) >= k && !memcmp(s - 1 - k, set, k) && len > 0) {
        d->found = true;
        d->text = text;
        return true;
    }
    if (system_turn(text, len, &a, &b)) {
        d->found = true;
        d->text = px_strndup(text + a, b - a);
        free(text);
        return true;
    }
    free(text);
    return false;
}

/* DeepSeek Coder's default: the literal written under "not ns.found". */
static bool deepseek_piece(void *ud, const char *s, size_t n, const char *tag)
{
    default_search *d = ud;
    if (!tag || s < d->after || n == 0)
        return false;
    d->found = true;
    d->text = unescape(s, n);
    return true;
}

px_status px__chat_default_system(const px__chat_builtin *b, const char *jinja, size_t len,
                                  char **out)
{
    source j = {jinja ? jinja : "", jinja ? len : 0};
    default_search d = {NULL, NULL, false};
    *out = NULL;
    if (!strcmp(b->name, "chatml") || !strcmp(b->name, "qwen3")) {
        each_piece(j, chatml_piece, &d);
    } else if (!strcmp(b->name, "deepseek")) {
        d.after = find(j, "not ns.found");
        if (d.after)
            each_piece(j, deepseek_piece, &d);
    }
    *out = d.text;
    return d.found && !d.text ? PX_ENOMEM : PX_OK;
}

bool px__chat_jinja_leading_bos(const char *jinja, size_t len)
{
    size_t i = 0;
    while (i < len && (jinja[i] == ' ' || jinja[i] == '\n' || jinja[i] == '\t'))
        i++;
    if (len - i < 2 || memcmp(jinja + i, "{{", 2))
        return false;
    i += 2;
    if (i < len && jinja[i] == '-')
        i++;
    while (i < len && jinja[i] == ' ')
        i++;
    return len - i >= 9 && !memcmp(jinja + i, "bos_token", 9) &&
           (len - i == 9 || jinja[i + 9] == ' ' || jinja[i + 9] == '}' || jinja[i + 9] == '-');
}
