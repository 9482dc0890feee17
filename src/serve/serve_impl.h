/*
 * Private declarations shared by the serve module's files: the table of
 * built-in chat templates, the text writer the renderers use, and UTF-8
 * helpers.
 */
#ifndef PX_SERVE_IMPL_H
#define PX_SERVE_IMPL_H

#include "base/common.h"

#include "plexus/serve.h"

/* ------------------------------------------------------------------ */
/* Chat templates                                                      */
/* ------------------------------------------------------------------ */

/* Rules a template's Jinja enforces (it raises an exception otherwise). */
enum {
    PX__CHAT_SYSTEM_FIRST = 1 << 0, /* a system message only as the first message */
    PX__CHAT_ALTERNATE = 1 << 1,    /* then user, assistant, user, ... */
};

/* Variations within a built-in, read from the model's Jinja. */
enum {
    PX__CHAT_EOS_SPACE = 1 << 0,         /* mistral: assistant turns end with eos + ' ' */
    PX__CHAT_TRIM_ASSISTANT = 1 << 1,    /* mistral-v3: assistant content |trim */
    PX__CHAT_SKIP_EMPTY_SYSTEM = 1 << 2, /* phi-3.5: an empty system message is left out */
    PX__CHAT_DATE_TODAY = 1 << 3,        /* llama-3.2: "Today Date" is strftime_now */
    PX__CHAT_THINK = 1 << 4,             /* the generation prompt opens <think> */
    PX__CHAT_THINK_SPLIT = 1 << 5,       /* chatml (QwQ): earlier answers lose their reasoning */
    PX__CHAT_THINK_OFF = 1 << 6,         /* deepseek3 (V3.1): assistant turns open </think> */
    PX__CHAT_USER_OPENS = 1 << 7,        /* the user turn opens the assistant's */
    PX__CHAT_NO_SYSTEM = 1 << 8,         /* no system role: it opens the first user message */
    PX__CHAT_NO_EOS_TAIL = 1 << 9,       /* phi-3: no eos_token without a generation prompt */
    PX__CHAT_NO_DATE = 1 << 10,          /* llama-3.1 layout without the dates (Nemotron) */
    PX__CHAT_ALWAYS_GEN = 1 << 11,       /* llama-3: the assistant header always ends it */
    PX__CHAT_OPEN_LAST = 1 << 12,        /* chatml (Qwen 1.5): the last turn stays open */
};

/* Stands for the EOS text in a built-in's list of end-of-turn texts. */
#define PX__CHAT_EOS "\x01eos"

typedef struct px__chat_writer px__chat_writer;

typedef void (*px__chat_render_fn)(px__chat_writer *w, const px_serve_chat_template *t,
                                   const px_serve_chat_msg *m, size_t n,
                                   const px_serve_chat_render_opts *o);

typedef struct px__chat_builtin {
    const char *name;
    const char *alias; /* llama.cpp's spelling, or NULL */
    const char *description;
    px__chat_render_fn render;
    unsigned rules;
    bool leading_bos; /* the Jinja starts the prompt with bos_token */
    const char *bos, *eos;
    const char *stops[3]; /* end-of-turn texts; PX__CHAT_EOS for the EOS text */
} px__chat_builtin;

extern const px__chat_builtin px__chat_builtins[];
extern const size_t px__chat_n_builtins;

/* The built-in called name, or NULL. */
const px__chat_builtin *px__chat_builtin_find(const char *name);

struct px_serve_chat_template {
    const px__chat_builtin *b;
    unsigned variant;
    char *bos, *eos, *default_system;
    const char *stops[4];
    px_serve_chat_template_info info;
};

/* Makes a template of b with its usual texts.  Returns NULL when memory
 * runs out. */
px_serve_chat_template *px__chat_template_new(const px__chat_builtin *b);
/* Replaces a text (bos, eos or default system) with a copy of s (NULL
 * clears it) and refreshes info.  Returns PX_ENOMEM or PX_OK. */
px_status px__chat_template_set(px_serve_chat_template *t, char **field, const char *s, size_t n);

/* Which built-in the Jinja source is, and its variant bits; NULL when
 * none.  markers (may be NULL) receives the known markers found. */
const px__chat_builtin *px__chat_recognize(const char *jinja, size_t len, unsigned *variant,
                                           px_strbuf *markers);
/* The default system message the Jinja writes when a conversation has
 * none, for builtin b: *out is malloc'd text, or NULL when there is none.
 * Returns PX_ENOMEM or PX_OK. */
px_status px__chat_default_system(const px__chat_builtin *b, const char *jinja, size_t len,
                                  char **out);
/* Whether the Jinja's output starts with bos_token. */
bool px__chat_jinja_leading_bos(const char *jinja, size_t len);

/* ------------------------------------------------------------------ */
/* UTF-8                                                               */
/* ------------------------------------------------------------------ */

/* Python's str.strip(): the bounds of s without leading and trailing
 * whitespace (ASCII whitespace, \x1c-\x1f, U+0085, U+00A0, U+1680,
 * U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). */
void px__utf8_strip(const char *s, size_t n, size_t *start, size_t *end);

/* The renderers' output: text, and whether memory ran out (checked once
 * at the end, so that renderers stay plain sequences of writes). */
struct px__chat_writer {
    px_strbuf sb;
    bool oom;
};

static inline void w_put(px__chat_writer *w, const char *s, size_t n)
{
    if (n > 0 && !w->oom && px_strbuf_add(&w->sb, s, n) != PX_OK)
        w->oom = true;
}

static inline void w_puts(px__chat_writer *w, const char *s)
{
    w_put(w, s, strlen(s));
}

static inline void w_content(px__chat_writer *w, const px_serve_chat_msg *m)
{
    w_put(w, m->content, m->len);
}

/* s with Python's str.strip() (Jinja's |trim and .strip()). */
static inline void w_stripped(px__chat_writer *w, const char *s, size_t n)
{
    size_t a, b;
    px__utf8_strip(s, n, &a, &b);
    w_put(w, s + a, b - a);
}

static inline void w_content_stripped(px__chat_writer *w, const px_serve_chat_msg *m)
{
    w_stripped(w, m->content, m->len);
}

static inline bool w_has_system(const px_serve_chat_msg *m, size_t n)
{
    return n > 0 && m[0].role == PX_SERVE_ROLE_SYSTEM;
}

/* Renderers of chat_render_inst.c (the Llama and Mistral families). */
#define PX__CHAT_RENDERER(name)                                               \
    void px__chat_##name(px__chat_writer *w, const px_serve_chat_template *t, \
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
PX__CHAT_RENDERER(llama2);
PX__CHAT_RENDERER(llama3);
PX__CHAT_RENDERER(llama31);
PX__CHAT_RENDERER(mistral);
PX__CHAT_RENDERER(mistral_v1);
PX__CHAT_RENDERER(mistral_v3);
PX__CHAT_RENDERER(mistral_v3_tekken);
PX__CHAT_RENDERER(mistral_v7);
PX__CHAT_RENDERER(mistral_v7_tekken);

#endif
