/*
 * The built-in chat template renderers.  Each one writes, for a
 * conversation that passed px_serve_chat_template_check, the text its
 * template's Jinja renders (with Hugging Face's trim_blocks and
 * lstrip_blocks), less the BOS text at the very start (the tokenizer adds
 * the BOS id; see serve.h).  The Jinja each follows is quoted in
 * docs/formats/openai-api.md; the tests compare the output with the
 * templates of real GGUF files rendered by a Jinja engine.
 */
#include "serve/serve_impl.h"

/* ------------------------------------------------------------------ */
/* ChatML and its relatives                                            */
/* ------------------------------------------------------------------ */

/* Offset of what follows the last "</think>" in s (0 when none). */
static size_t after_think(const char *s, size_t n)
{
    size_t off = 0;
    for (const char *p = s;
         n - (size_t)(p - s) >= 8 && (p = memmem(p, n - (size_t)(p - s), "</think>", 8)); p += 8)
        off = (size_t)(p - s) + 8;
    return off;
}

/* Bounds of s[a..b) without leading (lead) and trailing (trail) newlines:
 * Python's lstrip('\n') and rstrip('\n'). */
static void strip_nl(const char *s, size_t *a, size_t *b, bool lead, bool trail)
{
    while (lead && *a < *b && s[*a] == '\n')
        (*a)++;
    while (trail && *b > *a && s[*b - 1] == '\n')
        (*b)--;
}

static void chatml_turn(px__chat_writer *w, const char *role, const char *s, size_t n)
{
    w_puts(w, "<|im_start|>");
    w_puts(w, role);
    w_puts(w, "\n");
    w_put(w, s, n);
    w_puts(w, "<|im_end|>\n");
}

static void chatml_default_system(px__chat_writer *w, const px_serve_chat_template *t,
                                  const px_serve_chat_msg *m, size_t n)
{
    if (t->default_system && !w_has_system(m, n))
        chatml_turn(w, "system", t->default_system, strlen(t->default_system));
}

static void chatml_generation(px__chat_writer *w, const px_serve_chat_template *t,
                              const px_serve_chat_render_opts *o)
{
    if (o->add_generation_prompt)
        w_puts(w, t->variant & PX__CHAT_THINK ? "<|im_start|>assistant\n<think>\n"
                                              : "<|im_start|>assistant\n");
}

/* {'<|im_start|>' + message['role'] + '\n' + message['content'] +
 * '<|im_end|>' + '\n'} for each message, with the template's default system
 * turn when the conversation starts without one.  QwQ drops the reasoning
 * of answers before the last message and opens <think> for the next. */
static void render_chatml(px__chat_writer *w, const px_serve_chat_template *t,
                          const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    chatml_default_system(w, t, m, n);
    for (size_t i = 0; i < n; i++) {
        size_t a = 0, b = m[i].len;
        if ((t->variant & PX__CHAT_THINK_SPLIT) && m[i].role == PX_SERVE_ROLE_ASSISTANT &&
            i + 1 < n) {
            a = after_think(m[i].content, m[i].len);
            strip_nl(m[i].content, &a, &b, true, false);
        }
        if ((t->variant & PX__CHAT_OPEN_LAST) && i + 1 == n && !o->add_generation_prompt) {
            /* Qwen 1.5 leaves the last turn open for the model to go on. */
            w_puts(w, "<|im_start|>");
            w_puts(w, px_serve_role_name(m[i].role));
            w_puts(w, "\n");
            w_put(w, m[i].content, m[i].len);
            return;
        }
        chatml_turn(w, px_serve_role_name(m[i].role), m[i].content + a, b - a);
    }
    if ((t->variant & PX__CHAT_OPEN_LAST) && n > 0 && m[n - 1].role == PX_SERVE_ROLE_ASSISTANT)
        return;
    chatml_generation(w, t, o);
}

/* Qwen 3: ChatML where an answer after the last user message keeps its
 * reasoning in <think> (an empty one when it has none and ends the
 * conversation), and earlier answers lose theirs. */
static void qwen3_assistant(px__chat_writer *w, const px_serve_chat_msg *msg, bool after_query,
                            bool last)
{
    const char *c = msg->content;
    size_t ca = 0, cb = msg->len, ra = 0, rb = 0;
    const char *end_think = msg->len >= 8 ? memmem(c, msg->len, "</think>", 8) : NULL;
    if (end_think) {
        ca = after_think(c, msg->len);
        strip_nl(c, &ca, &cb, true, false);
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
         * .lstrip('\n'), then .strip('\n') where it is written. */
        rb = (size_t)(end_think - c);
        strip_nl(c, &ra, &rb, false, true);
        for (const char *p = c;
             rb - (size_t)(p - c) >= 7 && (p = memmem(p, rb - (size_t)(p - c), "<think>", 7));
             p += 7)
            ra = (size_t)(p - c) + 7;
        strip_nl(c, &ra, &rb, true, true);
    }
    w_puts(w, "<|im_start|>assistant\n");
    if (after_query && (last || rb > ra)) {
        w_puts(w, "<think>\n");
        w_put(w, c + ra, rb - ra);
        w_puts(w, "\n</think>\n\n");
        strip_nl(c, &ca, &cb, true, false);
    }
    w_put(w, c + ca, cb - ca);
    w_puts(w, "<|im_end|>\n");
}

static void render_qwen3(px__chat_writer *w, const px_serve_chat_template *t,
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;)
        if (m[i].role == PX_SERVE_ROLE_USER) {
            last_query = i;
            break;
        }
    chatml_default_system(w, t, m, n);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role != PX_SERVE_ROLE_ASSISTANT) {
            chatml_turn(w, px_serve_role_name(m[i].role), m[i].content, m[i].len);
            continue;
        }
        qwen3_assistant(w, &m[i], i > last_query, i + 1 == n);
    }
    chatml_generation(w, t, o);
}

/* Phi-4: the user turn opens the assistant's; add_generation_prompt has no
 * effect in its Jinja. */
static void render_phi4(px__chat_writer *w, const px_serve_chat_template *t,
                        const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)t;
    (void)o;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_SYSTEM)
            w_puts(w, "<|im_start|>system<|im_sep|>");
        else if (m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "<|im_start|>user<|im_sep|>");
        w_content(w, &m[i]);
        w_puts(w, "<|im_end|>");
        if (m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "<|im_start|>assistant<|im_sep|>");
    }
}

/* ------------------------------------------------------------------ */
/* Gemma, Phi-3, Zephyr                                                */
/* ------------------------------------------------------------------ */

/* Gemma: '<start_of_turn>' + role ('model' for the assistant) + '\n' +
 * content|trim + '<end_of_turn>\n'.  Gemma 2's Jinja refuses a system
 * message; Gemma 3's puts it, and a blank line, at the start of the first
 * user turn, which is what is done here. */
static void render_gemma(px__chat_writer *w, const px_serve_chat_template *t,
                         const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)t;
    size_t first = w_has_system(m, n) ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        w_puts(w, "<start_of_turn>");
        w_puts(w, m[i].role == PX_SERVE_ROLE_ASSISTANT ? "model" : px_serve_role_name(m[i].role));
        w_puts(w, "\n");
        if (i == first && first) {
            w_content(w, &m[0]);
            w_puts(w, "\n\n");
        }
        w_content_stripped(w, &m[i]);
        w_puts(w, "<end_of_turn>\n");
    }
    if (o->add_generation_prompt)
        w_puts(w, "<start_of_turn>model\n");
}

/* Phi-3: '<|' + role + '|>\n' + content + '<|end|>\n'; eos_token ends a
 * prompt without a generation prompt.  Older Phi-3 templates open the
 * assistant's turn after each user turn and have no system role (the
 * system message then opens the first user message). */
static void render_phi3(px__chat_writer *w, const px_serve_chat_template *t,
                        const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    bool opens = t->variant & PX__CHAT_USER_OPENS;
    size_t first = (t->variant & PX__CHAT_NO_SYSTEM) && w_has_system(m, n) ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_SYSTEM && m[i].len == 0 &&
            (t->variant & PX__CHAT_SKIP_EMPTY_SYSTEM))
            continue;
        if (!opens || m[i].role != PX_SERVE_ROLE_ASSISTANT) {
            w_puts(w, "<|");
            w_puts(w, px_serve_role_name(m[i].role));
            w_puts(w, "|>\n");
        }
        if (first && i == first) {
            w_content(w, &m[0]);
            w_puts(w, "\n\n");
        }
        w_content(w, &m[i]);
        w_puts(w, "<|end|>\n");
        if (opens && m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "<|assistant|>\n");
    }
    if (opens)
        return;
    if (o->add_generation_prompt)
        w_puts(w, "<|assistant|>\n");
    else if (!(t->variant & PX__CHAT_NO_EOS_TAIL))
        w_puts(w, t->eos);
}

/* Phi-4-mini: '<|' + role + '|>' + content + '<|end|>', no newlines. */
static void render_phi4_mini(px__chat_writer *w, const px_serve_chat_template *t,
                             const px_serve_chat_msg *m, size_t n,
                             const px_serve_chat_render_opts *o)
{
    for (size_t i = 0; i < n; i++) {
        w_puts(w, "<|");
        w_puts(w, px_serve_role_name(m[i].role));
        w_puts(w, "|>");
        w_content(w, &m[i]);
        w_puts(w, "<|end|>");
    }
    w_puts(w, o->add_generation_prompt ? "<|assistant|>" : t->eos);
}

/* Tulu (OLMo 2, Tulu 3): '<|' + role + '|>\n' + content + '\n', the
 * assistant's content followed by eos_token (and the newline, unless it
 * ends the conversation). */
static void render_tulu(px__chat_writer *w, const px_serve_chat_template *t,
                        const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    for (size_t i = 0; i < n; i++) {
        w_puts(w, "<|");
        w_puts(w, px_serve_role_name(m[i].role));
        w_puts(w, "|>\n");
        w_content(w, &m[i]);
        if (m[i].role == PX_SERVE_ROLE_ASSISTANT)
            w_puts(w, t->eos);
        if (m[i].role != PX_SERVE_ROLE_ASSISTANT || i + 1 < n)
            w_puts(w, "\n");
    }
    if (o->add_generation_prompt && n > 0)
        w_puts(w, "<|assistant|>\n");
}

/* Zephyr (and TinyLlama chat): '<|' + role + '|>\n' + content + eos_token,
 * each followed by a newline. */
static void render_zephyr(px__chat_writer *w, const px_serve_chat_template *t,
                          const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    for (size_t i = 0; i < n; i++) {
        w_puts(w, "<|");
        w_puts(w, px_serve_role_name(m[i].role));
        w_puts(w, "|>\n");
        w_content(w, &m[i]);
        w_puts(w, t->eos);
        w_puts(w, "\n");
    }
    if (o->add_generation_prompt && n > 0)
        w_puts(w, "<|assistant|>\n");
}

/* ------------------------------------------------------------------ */
/* Vicuna, DeepSeek, Command R, OpenChat                               */
/* ------------------------------------------------------------------ */

static void vicuna(px__chat_writer *w, const px_serve_chat_msg *m, size_t n,
                   const px_serve_chat_render_opts *o, bool orca)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_SYSTEM) {
            w_puts(w, orca ? "SYSTEM: " : "");
            w_content(w, &m[i]);
            w_puts(w, orca ? "\n" : "\n\n");
        } else if (m[i].role == PX_SERVE_ROLE_USER) {
            w_puts(w, "USER: ");
            w_content(w, &m[i]);
            w_puts(w, "\n");
        } else {
            w_puts(w, "ASSISTANT: ");
            w_content(w, &m[i]);
            w_puts(w, "</s>\n");
        }
    }
    if (o->add_generation_prompt)
        w_puts(w, "ASSISTANT:");
}

/* Vicuna 1.1: the system message, a blank line, then 'USER: ' and
 * 'ASSISTANT: ' lines. */
static void render_vicuna(px__chat_writer *w, const px_serve_chat_template *t,
                          const px_serve_chat_msg *m, size_t n, const px_serve_chat_render_opts *o)
{
    (void)t;
    vicuna(w, m, n, o, false);
}

/* Orca-Vicuna: as Vicuna with a 'SYSTEM: ' line. */
static void render_vicuna_orca(px__chat_writer *w, const px_serve_chat_template *t,
                               const px_serve_chat_msg *m, size_t n,
                               const px_serve_chat_render_opts *o)
{
    (void)t;
    vicuna(w, m, n, o, true);
}

/* DeepSeek Coder: the system message as is (or the template's default),
 * '### Instruction:\n' + content + '\n', '### Response:\n' + content +
 * '\n<|EOT|>\n'. */
static void render_deepseek(px__chat_writer *w, const px_serve_chat_template *t,
                            const px_serve_chat_msg *m, size_t n,
                            const px_serve_chat_render_opts *o)
{
    if (t->default_system && !w_has_system(m, n))
        w_puts(w, t->default_system);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "### Instruction:\n");
        else if (m[i].role == PX_SERVE_ROLE_ASSISTANT)
            w_puts(w, "### Response:\n");
        w_content(w, &m[i]);
        if (m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "\n");
        else if (m[i].role == PX_SERVE_ROLE_ASSISTANT)
            w_puts(w, "\n<|EOT|>\n");
    }
    if (o->add_generation_prompt)
        w_puts(w, "### Response:\n");
}

/* DeepSeek V2 and Coder V2: the system message and a blank line, 'User: '
 * + content + '\n\n', 'Assistant: ' + content + eos_token. */
static void render_deepseek2(px__chat_writer *w, const px_serve_chat_template *t,
                             const px_serve_chat_msg *m, size_t n,
                             const px_serve_chat_render_opts *o)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_USER)
            w_puts(w, "User: ");
        else if (m[i].role == PX_SERVE_ROLE_ASSISTANT)
            w_puts(w, "Assistant: ");
        w_content(w, &m[i]);
        w_puts(w, m[i].role == PX_SERVE_ROLE_ASSISTANT ? t->eos : "\n\n");
    }
    if (o->add_generation_prompt)
        w_puts(w, "Assistant:");
}

#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT \
    "<\xef\xbd\x9c"  \
    "Assistant\xef\xbd\x9c>"
#define DS_EOS      \
    "<\xef\xbd\x9c" \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_BOS      \
    "<\xef\xbd\x9c" \
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

/* DeepSeek V3 and R1: the system message first, '<｜User｜>' + content,
 * '<｜Assistant｜>' + content (what follows the last </think>) +
 * '<｜end▁of▁sentence｜>'.  R1-0528 opens the assistant's turn in the
 * user's; V3.1 opens it with </think> (thinking off). */
static void render_deepseek3(px__chat_writer *w, const px_serve_chat_template *t,
                             const px_serve_chat_msg *m, size_t n,
                             const px_serve_chat_render_opts *o)
{
    bool opens = t->variant & PX__CHAT_USER_OPENS;
    const char *header = t->variant & PX__CHAT_THINK_OFF ? DS_ASSISTANT "</think>" : DS_ASSISTANT;
    size_t first = w_has_system(m, n) ? 1 : 0;
    if (first)
        w_content(w, &m[0]);
    for (size_t i = first; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_USER) {
            w_puts(w, DS_USER);
            w_content(w, &m[i]);
            if (opens)
                w_puts(w, header);
            continue;
        }
        size_t off = after_think(m[i].content, m[i].len);
        if (!opens)
            w_puts(w, header);
        w_put(w, m[i].content + off, m[i].len - off);
        w_puts(w, DS_EOS);
    }
    bool last_user = n > 0 && m[n - 1].role == PX_SERVE_ROLE_USER;
    /* R1-0528 has opened it already; V3.1 opens it only after a user. */
    if (o->add_generation_prompt && !(opens && last_user) &&
        !((t->variant & PX__CHAT_THINK_OFF) && !last_user))
        w_puts(w, t->variant & PX__CHAT_THINK ? DS_ASSISTANT "<think>\n" : header);
}

/* Command R: turns in <|START_OF_TURN_TOKEN|>, the user's and the
 * chatbot's content stripped, the system message as is. */
static void render_command_r(px__chat_writer *w, const px_serve_chat_template *t,
                             const px_serve_chat_msg *m, size_t n,
                             const px_serve_chat_render_opts *o)
{
    (void)t;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == PX_SERVE_ROLE_SYSTEM) {
            w_puts(w, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>");
            w_content(w, &m[i]);
        } else {
            w_puts(w, m[i].role == PX_SERVE_ROLE_USER ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
                                                      : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
            w_content_stripped(w, &m[i]);
        }
        w_puts(w, "<|END_OF_TURN_TOKEN|>");
    }
    if (o->add_generation_prompt)
        w_puts(w, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
}

/* OpenChat 3.5: 'GPT4 Correct ' + role.title() + ': ' + content +
 * '<|end_of_turn|>'. */
static void render_openchat(px__chat_writer *w, const px_serve_chat_template *t,
                            const px_serve_chat_msg *m, size_t n,
                            const px_serve_chat_render_opts *o)
{
    (void)t;
    static const char *const titles[PX_SERVE_ROLE_COUNT_] = {"System", "User", "Assistant"};
    for (size_t i = 0; i < n; i++) {
        w_puts(w, "GPT4 Correct ");
        w_puts(w, titles[m[i].role]);
        w_puts(w, ": ");
        w_content(w, &m[i]);
        w_puts(w, "<|end_of_turn|>");
    }
    if (o->add_generation_prompt)
        w_puts(w, "GPT4 Correct Assistant:");
}

/* ------------------------------------------------------------------ */
/* The table                                                           */
/* ------------------------------------------------------------------ */

#define ALT (PX__CHAT_SYSTEM_FIRST | PX__CHAT_ALTERNATE)
#define EOS PX__CHAT_EOS

const px__chat_builtin px__chat_builtins[] = {
    {"chatml",
     NULL,
     "ChatML (Qwen 2 and 2.5, QwQ, Hermes, SmolLM, Dolphin, InternLM 2)",
     render_chatml,
     0,
     false,
     "",
     "<|im_end|>",
     {"<|im_end|>"}},
    {"qwen3",
     NULL,
     "Qwen 3 (ChatML keeping the last answer's <think>)",
     render_qwen3,
     0,
     false,
     "",
     "<|im_end|>",
     {"<|im_end|>"}},
    {"llama-2",
     "llama2",
     "Llama 2 chat ([INST] with <<SYS>>)",
     px__chat_llama2,
     ALT,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"llama-3",
     "llama3",
     "Llama 3 instruct",
     px__chat_llama3,
     0,
     true,
     "<|begin_of_text|>",
     "<|eot_id|>",
     {"<|eot_id|>"}},
    {"llama-3.1",
     NULL,
     "Llama 3.1 and 3.2 instruct (knowledge cutoff and date in the system turn)",
     px__chat_llama31,
     0,
     true,
     "<|begin_of_text|>",
     "<|eot_id|>",
     {"<|eot_id|>", "<|eom_id|>"}},
    {"mistral",
     NULL,
     "Mistral 7B Instruct v0.1/v0.2 ([INST] ... [/INST])",
     px__chat_mistral,
     ALT,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"mistral-v1",
     NULL,
     "Mistral v1 ( [INST] ... [/INST]; Mixtral 8x7B)",
     px__chat_mistral_v1,
     ALT,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"mistral-v3",
     NULL,
     "Mistral v3 ([INST] ...[/INST]; Mistral 7B v0.3, Large 2407)",
     px__chat_mistral_v3,
     ALT,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"mistral-v3-tekken",
     NULL,
     "Mistral v3 Tekken ([INST]...[/INST]; Nemo)",
     px__chat_mistral_v3_tekken,
     ALT,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"mistral-v7",
     NULL,
     "Mistral v7 ([SYSTEM_PROMPT]; Large 2411)",
     px__chat_mistral_v7,
     0,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"mistral-v7-tekken",
     NULL,
     "Mistral v7 Tekken ([SYSTEM_PROMPT]; Small 3)",
     px__chat_mistral_v7_tekken,
     0,
     true,
     "<s>",
     "</s>",
     {EOS}},
    {"gemma",
     NULL,
     "Gemma, Gemma 2 and 3 (<start_of_turn>)",
     render_gemma,
     ALT,
     true,
     "<bos>",
     "<eos>",
     {"<end_of_turn>"}},
    {"phi-3",
     "phi3",
     "Phi-3 and 3.5 (<|user|> ... <|end|>)",
     render_phi3,
     0,
     false,
     "<s>",
     "<|endoftext|>",
     {"<|end|>"}},
    {"phi-4",
     "phi4",
     "Phi-4 (<|im_start|> ... <|im_sep|>)",
     render_phi4,
     0,
     false,
     "",
     "<|im_end|>",
     {"<|im_end|>"}},
    {"phi-4-mini",
     NULL,
     "Phi-4-mini (<|user|> ... <|end|>, no newlines)",
     render_phi4_mini,
     0,
     false,
     "",
     "<|endoftext|>",
     {"<|end|>"}},
    {"zephyr",
     NULL,
     "Zephyr and TinyLlama chat (<|user|> ... eos)",
     render_zephyr,
     0,
     false,
     "<s>",
     "</s>",
     {EOS}},
    {"tulu",
     NULL,
     "Tulu 3 and OLMo 2 (<|user|> ... , eos after answers)",
     render_tulu,
     0,
     false,
     "<|endoftext|>",
     "<|endoftext|>",
     {EOS}},
    {"vicuna",
     NULL,
     "Vicuna 1.1 (USER: / ASSISTANT:)",
     render_vicuna,
     0,
     false,
     "<s>",
     "</s>",
     {"</s>"}},
    {"vicuna-orca",
     NULL,
     "Orca-Vicuna (SYSTEM: / USER: / ASSISTANT:)",
     render_vicuna_orca,
     0,
     false,
     "<s>",
     "</s>",
     {"</s>"}},
    {"deepseek",
     NULL,
     "DeepSeek Coder (### Instruction: / ### Response:)",
     render_deepseek,
     0,
     true,
     DS_BOS,
     "<|EOT|>",
     {"<|EOT|>"}},
    {"deepseek2",
     NULL,
     "DeepSeek V2 and Coder V2 (User: / Assistant:)",
     render_deepseek2,
     0,
     true,
     DS_BOS,
     DS_EOS,
     {EOS}},
    {"deepseek3",
     NULL,
     "DeepSeek V3 and R1, R1 distills (" DS_USER ")",
     render_deepseek3,
     PX__CHAT_SYSTEM_FIRST,
     true,
     DS_BOS,
     DS_EOS,
     {DS_EOS}},
    {"command-r",
     NULL,
     "Command R and R+ (<|START_OF_TURN_TOKEN|>)",
     render_command_r,
     ALT,
     true,
     "<BOS_TOKEN>",
     "<|END_OF_TURN_TOKEN|>",
     {"<|END_OF_TURN_TOKEN|>"}},
    {"openchat",
     NULL,
     "OpenChat 3.5 (GPT4 Correct User:)",
     render_openchat,
     0,
     true,
     "<s>",
     "<|end_of_turn|>",
     {"<|end_of_turn|>"}},
};

const size_t px__chat_n_builtins = PX_ARRAY_LEN(px__chat_builtins);

px_status px_serve_chat_template_render(const px_serve_chat_template *t,
                                        const px_serve_chat_msg *msgs, size_t n,
                                        const px_serve_chat_render_opts *opts, char **text,
                                        size_t *len, px_err *err)
{
    *text = NULL;
    *len = 0;
    px_status st = px_serve_chat_template_check(t, msgs, n, NULL, err);
    if (st != PX_OK)
        return st;
    /* Renderers take every content as bytes; an empty message may come
     * without a pointer. */
    px_serve_chat_msg *copy = NULL;
    for (size_t i = 0; i < n && !copy; i++) {
        if (msgs[i].content)
            continue;
        if (!(copy = malloc(n * sizeof *copy)))
            return px_err_set(err, PX_ENOMEM, "chat template: out of memory");
        for (size_t k = 0; k < n; k++)
            copy[k] = (px_serve_chat_msg){msgs[k].role, msgs[k].content ? msgs[k].content : "",
                                          msgs[k].len};
    }
    px_serve_chat_render_opts none = {0};
    px__chat_writer w = {PX_STRBUF_INIT, false};
    t->b->render(&w, t, copy ? copy : msgs, n, opts ? opts : &none);
    free(copy);
    if (w.oom || px_strbuf_grow(&w.sb, 1) != PX_OK) {
        px_strbuf_release(&w.sb);
        return px_err_set(err, PX_ENOMEM, "chat template: out of memory rendering %zu messages", n);
    }
    /* A template that starts with the BOS text without writing bos_token
     * (SmolLM 2's "<|im_start|>") would get a second BOS from the
     * tokenizer: drop the text, as llama.cpp does. */
    size_t bos_len = strlen(t->bos);
    if (t->info.add_bos && bos_len && w.sb.len >= bos_len && !memcmp(w.sb.buf, t->bos, bos_len)) {
        memmove(w.sb.buf, w.sb.buf + bos_len, w.sb.len - bos_len + 1);
        w.sb.len -= bos_len;
    }
    *text = px_strbuf_detach(&w.sb, len);
    return PX_OK;
}
