/*
 * Chat template renderers of the Llama and Mistral families: Llama 2's
 * [INST] with <<SYS>>, Llama 3's headers, Llama 3.1's dated system turn,
 * and the versions of Mistral's [INST] (where the spaces go, where the
 * system message goes).  The table of built-ins is in chat_render.c.
 */
#include "serve/serve_impl.h"

/* ------------------------------------------------------------------ */
/* Llama                                                               */
/* ------------------------------------------------------------------ */

/* Llama 2: the system message is folded into the first user turn inside
 * <<SYS>>; '[INST] ' + content.strip() + ' [/INST]', then ' ' +
 * content.strip() + ' ' + eos_token, each later user turn opening with
 * bos_token. */
void px__chat_llama2(px__chat_writer *w, const px_serve_chat_template *t,
                     const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)o;
    size_t first = w_has_system(m, n) ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        px_strbuf c = PX_STRBUF_INIT;
        if (i == first && first == 1) {
            /* strip() applies to the joined text, <<SYS>> block included. */
            if (px_strbuf_adds(&c, "<<SYS>>\n") || px_strbuf_add(&c, m[0].content, m[0].len) ||
                px_strbuf_adds(&c, "\n<</SYS>>\n\n") || px_strbuf_add(&c, m[i].content, m[i].len))
                w->oom = true;
        } else if (px_strbuf_add(&c, m[i].content, m[i].len)) {
            w->oom = true;
        }
        if (m[i].role == PX_SERVE_ROLE_USER) {
            if (i != first)
                w_puts(w, t->bos);
            w_puts(w, "[INST] ");
            w_stripped(w, c.buf, c.len);
            w_puts(w, " [/INST]");
        } else {
            w_puts(w, " ");
            w_stripped(w, c.buf, c.len);
            w_puts(w, " ");
            w_puts(w, t->eos);
        }
        px_strbuf_release(&c);
    }
}

static void llama3_turn(px__chat_writer *w, const char *role, const px_serve_chat_msg *msg)
{
    w_puts(w, "<|start_header_id|>");
    w_puts(w, role);
    w_puts(w, "<|end_header_id|>\n\n");
    w_content_stripped(w, msg);
    w_puts(w, "<|eot_id|>");
}

/* Llama 3: '<|start_header_id|>' + role + '<|end_header_id|>\n\n' +
 * content|trim + '<|eot_id|>' for each message. */
void px__chat_llama3(px__chat_writer *w, const px_serve_chat_template *t,
                     const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    for (size_t i = 0; i < n; i++)
        llama3_turn(w, px_serve_role_name(m[i].role), &m[i]);
    if (o->add_generation_prompt || (t->variant & PX__CHAT_ALWAYS_GEN))
        w_puts(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Today's UTC date as strftime("%d %b %Y") writes it in the C locale. */
static void today(char out[16])
{
    static const char *const months[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char iso[32];
    px_time_format(px_wall_time(), iso); /* "2026-11-29T16:25:10Z" */
    int month = (iso[5] - '0') * 10 + (iso[6] - '0');
    snprintf(out, 16, "%c%c %s %.4s", iso[8], iso[9], months[(month + 11) % 12], iso);
}

/* Llama 3.1 and 3.2 (no tools): a system turn always, with the knowledge
 * cutoff and the date before the system message (trimmed), then the other
 * messages as Llama 3 writes them. */
void px__chat_llama31(px__chat_writer *w, const px_serve_chat_template *t,
                      const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    char date[16];
    if (!(t->variant & PX__CHAT_DATE_TODAY))
        px_strlcpy(date, "26 Jul 2024", sizeof date);
    else if (o->date)
        px_strlcpy(date, o->date, sizeof date);
    else
        today(date);
    w_puts(w, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (!(t->variant & PX__CHAT_NO_DATE)) {
        w_puts(w, "Cutting Knowledge Date: December 2023\nToday Date: ");
        w_puts(w, date);
        w_puts(w, "\n\n");
    }
    size_t first = w_has_system(m, n) ? 1 : 0;
    if (first)
        w_content_stripped(w, &m[0]);
    w_puts(w, "<|eot_id|>");
    for (size_t i = first; i < n; i++)
        llama3_turn(w, px_serve_role_name(m[i].role), &m[i]);
    if (o->add_generation_prompt)
        w_puts(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ------------------------------------------------------------------ */
/* Mistral: the [INST] family                                          */
/* ------------------------------------------------------------------ */

typedef enum mistral_system {
    SYSTEM_FIRST_USER, /* system + '\n\n' opens the first user message */
    SYSTEM_LAST_USER,  /* ... the last message, when it is a user message */
    SYSTEM_TAGGED,     /* [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT] in place */
} mistral_system;

typedef struct mistral_style {
    const char *inst_open, *inst_close;
    const char *assistant_open; /* before the assistant's content */
    mistral_system system;
    const char *system_open; /* SYSTEM_TAGGED */
} mistral_style;

static void mistral(px__chat_writer *w, const px_serve_chat_template *t, const px_serve_chat_msg *m,
                    size_t n, const mistral_style *s)
{
    size_t first = s->system != SYSTEM_TAGGED && w_has_system(m, n) ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_SYSTEM) {
            w_puts(w, s->system_open);
            w_content(w, &m[i]);
            w_puts(w, "[/SYSTEM_PROMPT]");
        } else if (m[i].role == PX_SERVE_ROLE_USER) {
            w_puts(w, s->inst_open);
            if (first && ((s->system == SYSTEM_FIRST_USER && i == first) ||
                          (s->system == SYSTEM_LAST_USER && i == n - 1))) {
                w_content(w, &m[0]);
                w_puts(w, "\n\n");
            }
            w_content(w, &m[i]);
            w_puts(w, s->inst_close);
        } else {
            w_puts(w, s->assistant_open);
            if (t->variant & PX__CHAT_TRIM_ASSISTANT)
                w_content_stripped(w, &m[i]);
            else
                w_content(w, &m[i]);
            w_puts(w, t->eos);
            if (t->variant & PX__CHAT_EOS_SPACE)
                w_puts(w, " ");
        }
    }
}

/* Mistral 7B Instruct v0.1/v0.2: '[INST] ' + content + ' [/INST]', then
 * content + eos_token.  Its Jinja refuses a system message; here it opens
 * the first user message, followed by a blank line, as Mistral's later
 * templates place it. */
void px__chat_mistral(px__chat_writer *w, const px_serve_chat_template *t,
                      const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {"[INST] ", " [/INST]", "", SYSTEM_FIRST_USER, NULL};
    mistral(w, t, m, n, &s);
}

/* Mistral's "v1" template (Mixtral 8x7B): ' [INST] ' + content +
 * ' [/INST]', then ' ' + content + eos_token. */
void px__chat_mistral_v1(px__chat_writer *w, const px_serve_chat_template *t,
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {" [INST] ", " [/INST]", " ", SYSTEM_FIRST_USER, NULL};
    mistral(w, t, m, n, &s);
}

/* "v3" (Mistral 7B v0.3, Large 2407): '[INST] ' + content + '[/INST]',
 * the system message opening the last user message. */
void px__chat_mistral_v3(px__chat_writer *w, const px_serve_chat_template *t,
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {"[INST] ", "[/INST]", " ", SYSTEM_LAST_USER, NULL};
    mistral(w, t, m, n, &s);
}

/* "v3-tekken" (Mistral Nemo): as v3 without the spaces. */
void px__chat_mistral_v3_tekken(px__chat_writer *w, const px_serve_chat_template *t,
                                const px_serve_chat_msg *m, size_t n,
                                const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {"[INST]", "[/INST]", "", SYSTEM_LAST_USER, NULL};
    mistral(w, t, m, n, &s);
}

/* "v7" (Large 2411): system messages in [SYSTEM_PROMPT] tags, in place. */
void px__chat_mistral_v7(px__chat_writer *w, const px_serve_chat_template *t,
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {"[INST] ", "[/INST]", " ", SYSTEM_TAGGED, "[SYSTEM_PROMPT] "};
    mistral(w, t, m, n, &s);
}

/* "v7-tekken" (Small 3): as v7 without the spaces. */
void px__chat_mistral_v7_tekken(px__chat_writer *w, const px_serve_chat_template *t,
                                const px_serve_chat_msg *m, size_t n,
                                const px_serve_chat_render_opts *o)
{
    (void)o;
    mistral_style s = {"[INST]", "[/INST]", "", SYSTEM_TAGGED, "[SYSTEM_PROMPT]"};
    mistral(w, t, m, n, &s);
}
