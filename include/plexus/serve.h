/*
 * plexus/serve.h: serving a model behind an OpenAI-compatible HTTP API.
 *
 * `plexus serve` answers GET /v1/models, POST /v1/completions and POST
 * /v1/chat/completions (docs/formats/openai-api.md).  This header holds the
 * pieces of the front end that need no model running:
 *
 *   - chat templates: a conversation (system, user and assistant messages)
 *     rendered into the prompt text the model was trained on, with the
 *     template recognized from the GGUF's tokenizer.chat_template or chosen
 *     by name;
 *   - the OpenAI API: request bodies parsed into a plain struct (bounded,
 *     with every refusal in OpenAI's error shape), and the response bodies
 *     and server-sent event chunks built from a stream of token events.
 *
 *     px_serve_request req;
 *     px_serve_error e;
 *     if (px_serve_request_parse(PX_SERVE_API_CHAT, body, len, NULL, &req, &e) != PX_OK)
 *         return reply(e.http_status, px_serve_error_json(&e));
 *     char *prompt;
 *     size_t prompt_len;
 *     px_serve_chat_render_opts ro = {.add_generation_prompt = true};
 *     px_serve_chat_template_render(tmpl, req.messages, req.n_messages, &ro, &prompt,
 *                                   &prompt_len, &err);
 *     // encode with PX_RT_ENCODE_SPECIAL (and PX_RT_ENCODE_BOS when
 *     // px_serve_chat_template_info(tmpl)->add_bos), generate, and for
 *     // each token: px_serve_response_token(resp, &event, &sse, &stopped, &err)
 *
 * Thread safety: templates are immutable once made and may be shared by
 * threads; a request or a response belongs to one thread at a time.
 */
#ifndef PLEXUS_SERVE_H
#define PLEXUS_SERVE_H

#include "plexus/base.h"
#include "plexus/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== */
/* Chat templates                                                      */
/* ================================================================== */
/*
 * Built-in renderers, written in C, for the chat templates found in
 * common GGUF files (there is no Jinja engine).  Each reproduces its
 * template's Jinja byte for byte for conversations of system, user and
 * assistant messages: chatml, llama-2, llama-3, llama-3.1, mistral and its
 * versions (mistral-v1, -v3, -v3-tekken, -v7, -v7-tekken), gemma, phi-3,
 * phi-4, zephyr, vicuna, vicuna-orca, deepseek, deepseek3, command-r,
 * openchat.  px_serve_chat_template_names lists them; docs/formats/
 * openai-api.md says what each renders and how it is recognized.
 *
 * BOS: a renderer never writes the BOS text at the start of the prompt.
 * Where the template's Jinja starts with bos_token, or the model asks for
 * a BOS (tokenizer.ggml.add_bos_token, llama.cpp's rule), info->add_bos
 * is true and the caller encodes with PX_RT_ENCODE_BOS, so the BOS is the
 * tokenizer's id and never doubled.  BOS and EOS texts inside the
 * conversation (llama-2's "</s><s>[INST]") are written as text and become
 * their ids when encoded with PX_RT_ENCODE_SPECIAL.
 */

/* Bounds on a conversation; requests beyond them are refused. */
#define PX_SERVE_CHAT_MAX_MESSAGES 1024
#define PX_SERVE_CHAT_MAX_BYTES    ((size_t)8 << 20) /* content of all messages */

typedef enum px_serve_role {
    PX_SERVE_ROLE_SYSTEM = 0, /* also OpenAI's "developer" */
    PX_SERVE_ROLE_USER,
    PX_SERVE_ROLE_ASSISTANT,
    PX_SERVE_ROLE_COUNT_
} px_serve_role;

/* "system", "user", "assistant"; "?" out of range. */
const char *px_serve_role_name(px_serve_role role);

/* One message.  content is len bytes of UTF-8 (not necessarily
 * NUL-terminated), borrowed. */
typedef struct px_serve_chat_msg {
    px_serve_role role;
    const char *content;
    size_t len;
} px_serve_chat_msg;

/* A template chosen for a model: a built-in renderer and what it takes
 * from the model (BOS and EOS texts, a default system message). */
typedef struct px_serve_chat_template px_serve_chat_template;

/* Recognizes which built-in a GGUF's tokenizer.chat_template (the Jinja
 * source, len bytes) is, from markers ("<|im_start|>", "[INST]",
 * "<start_of_turn>", ...; docs/formats/openai-api.md has the table).  A
 * default system message the Jinja writes when the conversation has none
 * (Qwen's, DeepSeek Coder's) is taken from it.  detail may be NULL;
 * on PX_ENOTFOUND it receives the whole explanation (err's message is cut
 * at 255 bytes).  Returns an owned template (px_serve_chat_template_free)
 * with the built-in's usual BOS and EOS texts.
 * Errors: PX_ENOTFOUND when no built-in matches: the message names the
 * markers found and the built-in names, the fix being --chat-template
 * NAME; PX_ELIMIT for a template over 1 MiB; PX_ENOMEM. */
px_status px_serve_chat_template_detect(const char *jinja, size_t len, px_serve_chat_template **out,
                                        px_strbuf *detail, px_err *err);
/* The built-in called name (as listed, or llama.cpp's spelling: "llama2",
 * "llama3", "phi3", "phi4").  Returns owned.  Errors: PX_ENOTFOUND
 * listing the names. */
px_status px_serve_chat_template_by_name(const char *name, px_serve_chat_template **out,
                                         px_err *err);
/* The template for a model: the built-in called name when name is not
 * NULL, else the one recognized from the model's tokenizer.chat_template.
 * BOS and EOS texts come from the model's vocabulary, and add_bos from the
 * template and tokenizer.ggml.add_bos_token.  m is borrowed.  Errors:
 * PX_ENOTFOUND (no tokenizer.chat_template: pass --chat-template NAME; or
 * as detect and by_name), PX_ENOMEM. */
px_status px_serve_chat_template_for_model(const px_ir_model *m, const char *name,
                                           px_serve_chat_template **out, px_err *err);
void px_serve_chat_template_free(px_serve_chat_template *t); /* NULL is a no-op */

/* The built-in names, space-separated (static). */
const char *px_serve_chat_template_names(void);

typedef struct px_serve_chat_template_info {
    const char *name;        /* "chatml" */
    const char *description; /* "ChatML (Qwen 2 and 2.5, Hermes, SmolLM, ...)" */
    /* Encode the prompt with PX_RT_ENCODE_BOS. */
    bool add_bos;
    /* Texts that end the assistant's turn ("<|im_end|>"; the EOS text for
     * templates that end turns with it): stop tokens where the vocabulary
     * has them (px_rt_tokenizer_find), stop strings otherwise. */
    const char *const *stops;
    size_t n_stops;
    /* What the alternation rule and the system rule require, in words
     * ("user and assistant alternate, user first, after an optional
     * system message"); NULL when the template takes any order. */
    const char *order_rule;
    const char *bos_text, *eos_text;
    const char *default_system; /* NULL: none */
} px_serve_chat_template_info;

/* Owned by the template. */
const px_serve_chat_template_info *px_serve_chat_template_info_get(const px_serve_chat_template *t);

/* Checks a conversation against the bounds and the template's rules: at
 * least one message, at most PX_SERVE_CHAT_MAX_MESSAGES and
 * PX_SERVE_CHAT_MAX_BYTES of content, known roles, a system message only
 * first where the template places it so (most do), and user/assistant
 * alternation, user first, where the template's Jinja raises an exception
 * otherwise (llama-2, mistral*, gemma, command-r).  *bad (may be NULL)
 * receives the index of the offending message, or SIZE_MAX when the
 * problem is the whole list.  Errors: PX_EINVAL, PX_ELIMIT, with messages
 * starting "messages[i]: ". */
px_status px_serve_chat_template_check(const px_serve_chat_template *t,
                                       const px_serve_chat_msg *msgs, size_t n, size_t *bad,
                                       px_err *err);

typedef struct px_serve_chat_render_opts {
    /* Append the start of an assistant turn ("<|im_start|>assistant\n"). */
    bool add_generation_prompt;
    /* "26 Jul 2024": the date for templates that print today's date
     * (Llama 3.2); NULL takes today's UTC date.  Llama 3.1 prints its
     * fixed "26 Jul 2024" whatever this says, as its Jinja does. */
    const char *date;
} px_serve_chat_render_opts;

/* Renders the conversation (checked first, as px_serve_chat_template_check)
 * into *text (owned: free(); NUL-terminated, *len bytes).  opts may be
 * NULL (no generation prompt).  Errors: those of check, PX_ENOMEM. */
px_status px_serve_chat_template_render(const px_serve_chat_template *t,
                                        const px_serve_chat_msg *msgs, size_t n,
                                        const px_serve_chat_render_opts *opts, char **text,
                                        size_t *len, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_SERVE_H */
