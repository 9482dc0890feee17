/*
 * Chat templates: choosing a built-in (by name, from a GGUF's Jinja, for a
 * model), what it says about itself, and checking a conversation against
 * its rules before it is rendered (chat_render.c).
 */
#include "serve/serve_impl.h"

#include <pthread.h>

#include "plexus/ir.h"

#define MAX_JINJA ((size_t)1 << 20)

const char *px_serve_role_name(px_serve_role role)
{
    static const char *const names[PX_SERVE_ROLE_COUNT_] = {"system", "user", "assistant"};
    return (unsigned)role < PX_SERVE_ROLE_COUNT_ ? names[role] : "?";
}

static char names[512];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void)
{
    size_t k = 0;
    for (size_t i = 0; i < px__chat_n_builtins && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? " " : "",
                              px__chat_builtins[i].name);
}

const char *px_serve_chat_template_names(void)
{
    pthread_once(&names_once, build_names);
    return names;
}

const px__chat_builtin *px__chat_builtin_find(const char *name)
{
    for (size_t i = 0; i < px__chat_n_builtins; i++) {
        const px__chat_builtin *b = &px__chat_builtins[i];
        if (!strcmp(name, b->name) || (b->alias && !strcmp(name, b->alias)))
            return b;
    }
    return NULL;
}

/* Rebuilds info and the list of end-of-turn texts from the fields. */
static void refresh(px_serve_chat_template *t)
{
    size_t n = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(t->b->stops) && t->b->stops[i]; i++) {
        const char *s = strcmp(t->b->stops[i], PX__CHAT_EOS) ? t->b->stops[i] : t->eos;
        if (s && s[0])
            t->stops[n++] = s;
    }
    t->stops[n] = NULL;
    t->info.name = t->b->name;
    t->info.description = t->b->description;
    t->info.stops = t->stops;
    t->info.n_stops = n;
    t->info.bos_text = t->bos;
    t->info.eos_text = t->eos;
    t->info.default_system = t->default_system;
    if (t->b->rules & PX__CHAT_ALTERNATE)
        t->info.order_rule = "user and assistant messages alternate, user first, after an "
                             "optional system message that comes first";
    else if (t->b->rules & PX__CHAT_SYSTEM_FIRST)
        t->info.order_rule = "a system message only as the first message";
    else
        t->info.order_rule = NULL;
}

px_status px__chat_template_set(px_serve_chat_template *t, char **field, const char *s, size_t n)
{
    char *copy = NULL;
    if (s && !(copy = px_strndup(s, n)))
        return PX_ENOMEM;
    free(*field);
    *field = copy;
    refresh(t);
    return PX_OK;
}

px_serve_chat_template *px__chat_template_new(const px__chat_builtin *b)
{
    px_serve_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->b = b;
    t->bos = px_strdup(b->bos);
    t->eos = px_strdup(b->eos);
    if (!t->bos || !t->eos) {
        px_serve_chat_template_free(t);
        return NULL;
    }
    t->info.add_bos = b->leading_bos;
    refresh(t);
    return t;
}

void px_serve_chat_template_free(px_serve_chat_template *t)
{
    if (!t)
        return;
    free(t->bos);
    free(t->eos);
    free(t->default_system);
    free(t);
}

const px_serve_chat_template_info *px_serve_chat_template_info_get(const px_serve_chat_template *t)
{
    return &t->info;
}

px_status px_serve_chat_template_by_name(const char *name, px_serve_chat_template **out,
                                         px_err *err)
{
    *out = NULL;
    const px__chat_builtin *b = name ? px__chat_builtin_find(name) : NULL;
    if (!b)
        return px_err_set(err, PX_ENOTFOUND,
                          "chat template: no built-in template \"%.40s\"; the names are: %s",
                          name ? name : "(null)", px_serve_chat_template_names());
    if (!(*out = px__chat_template_new(b)))
        return px_err_set(err, PX_ENOMEM, "chat template: out of memory");
    return PX_OK;
}

px_status px_serve_chat_template_detect(const char *jinja, size_t len, px_serve_chat_template **out,
                                        px_strbuf *detail, px_err *err)
{
    *out = NULL;
    if (!jinja)
        len = 0;
    if (len > MAX_JINJA)
        return px_err_set(err, PX_ELIMIT,
                          "chat template: tokenizer.chat_template is %zu bytes (at most %zu); "
                          "pass --chat-template NAME",
                          len, MAX_JINJA);
    unsigned variant = 0;
    px_strbuf markers = PX_STRBUF_INIT;
    const px__chat_builtin *b = px__chat_recognize(jinja, len, &variant, &markers);
    if (!b) {
        px_strbuf msg = PX_STRBUF_INIT;
        px_strbuf_addf(&msg,
                       "chat template: tokenizer.chat_template is none of the built-in templates "
                       "(markers found: %s); pass --chat-template NAME, NAME one of: %s",
                       markers.len ? markers.buf : "none", px_serve_chat_template_names());
        if (detail)
            px_strbuf_add(detail, msg.buf, msg.len);
        px_err_set(err, PX_ENOTFOUND, "%s", msg.buf);
        px_strbuf_release(&msg);
        px_strbuf_release(&markers);
        return PX_ENOTFOUND;
    }
    px_strbuf_release(&markers);
    px_serve_chat_template *t = px__chat_template_new(b);
    if (!t)
        return px_err_set(err, PX_ENOMEM, "chat template: out of memory");
    t->variant = variant;
    t->info.add_bos = b->leading_bos || px__chat_jinja_leading_bos(jinja, len);
    if (px__chat_default_system(b, jinja, len, &t->default_system) != PX_OK) {
        px_serve_chat_template_free(t);
        return px_err_set(err, PX_ENOMEM, "chat template: out of memory");
    }
    refresh(t);
    *out = t;
    return PX_OK;
}

/* The text of token id in the vocabulary, or NULL. */
static const char *vocab_text(const px_ir_vocab *v, int32_t id, size_t *len)
{
    if (!v || id < 0 || (uint32_t)id >= v->n_tokens)
        return NULL;
    *len = v->len[id];
    return v->text[id];
}

/* Takes the BOS and EOS texts of the model's vocabulary and decides
 * whether prompts start with the BOS id: when the template's Jinja writes
 * bos_token first, or when tokenizer.ggml.add_bos_token says so (default:
 * yes for sentencepiece "llama" vocabularies, as llama.cpp does). */
static px_status adopt_vocab(px_serve_chat_template *t, const px_ir_model *m)
{
    const px_ir_vocab *v = px_ir_model_vocab(m);
    size_t len = 0;
    const char *s;
    if ((s = vocab_text(v, v ? v->bos_id : -1, &len)) &&
        px__chat_template_set(t, &t->bos, s, len) != PX_OK)
        return PX_ENOMEM;
    if ((s = vocab_text(v, v ? v->eos_id : -1, &len)) &&
        px__chat_template_set(t, &t->eos, s, len) != PX_OK)
        return PX_ENOMEM;
    uint64_t add_bos;
    bool model_bos = px_ir_model_meta_u64(m, "tokenizer.ggml.add_bos_token", &add_bos)
                         ? add_bos != 0
                         : v && !strcmp(v->model, "llama");
    t->info.add_bos = (t->info.add_bos || model_bos) && v && v->bos_id >= 0;
    return PX_OK;
}

px_status px_serve_chat_template_for_model(const px_ir_model *m, const char *name,
                                           px_serve_chat_template **out, px_err *err)
{
    *out = NULL;
    px_status st;
    if (name) {
        st = px_serve_chat_template_by_name(name, out, err);
    } else {
        const char *jinja;
        if (!px_ir_model_meta_str(m, "tokenizer.chat_template", &jinja))
            return px_err_set(err, PX_ENOTFOUND,
                              "chat template: %s has no tokenizer.chat_template; pass "
                              "--chat-template NAME, NAME one of: %s",
                              px_ir_model_path(m), px_serve_chat_template_names());
        st = px_serve_chat_template_detect(jinja, strlen(jinja), out, NULL, err);
    }
    if (st != PX_OK)
        return st;
    if (adopt_vocab(*out, m) != PX_OK) {
        px_serve_chat_template_free(*out);
        *out = NULL;
        return px_err_set(err, PX_ENOMEM, "chat template: out of memory");
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Checking a conversation                                             */
/* ------------------------------------------------------------------ */

static px_status bad_at(size_t *bad, size_t i, px_err *err, px_status st, const char *fmt, ...)
    PX_PRINTF(5, 6);

static px_status bad_at(size_t *bad, size_t i, px_err *err, px_status st, const char *fmt, ...)
{
    if (bad)
        *bad = i;
    va_list ap;
    va_start(ap, fmt);
    px_err_setv(err, st, fmt, ap);
    va_end(ap);
    return st;
}

px_status px_serve_chat_template_check(const px_serve_chat_template *t,
                                       const px_serve_chat_msg *msgs, size_t n, size_t *bad,
                                       px_err *err)
{
    if (bad)
        *bad = SIZE_MAX;
    if (n == 0 || !msgs)
        return bad_at(bad, SIZE_MAX, err, PX_EINVAL,
                      "messages: the conversation is empty; give at least one message");
    if (n > PX_SERVE_CHAT_MAX_MESSAGES)
        return bad_at(bad, SIZE_MAX, err, PX_ELIMIT,
                      "messages: %zu messages, more than the limit of %d", n,
                      PX_SERVE_CHAT_MAX_MESSAGES);
    size_t total = 0;
    unsigned rules = t->b->rules;
    size_t first = msgs[0].role == PX_SERVE_ROLE_SYSTEM ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        const px_serve_chat_msg *m = &msgs[i];
        if ((unsigned)m->role >= PX_SERVE_ROLE_COUNT_)
            return bad_at(bad, i, err, PX_EINVAL,
                          "messages[%zu].role: unknown role %d (system, user or assistant)", i,
                          (int)m->role);
        if (!m->content && m->len)
            return bad_at(bad, i, err, PX_EINVAL, "messages[%zu].content: missing", i);
        if (m->len > PX_SERVE_CHAT_MAX_BYTES - total)
            return bad_at(bad, i, err, PX_ELIMIT,
                          "messages[%zu]: the conversation passes %zu bytes of content; "
                          "shorten it",
                          i, PX_SERVE_CHAT_MAX_BYTES);
        total += m->len;
        if (i > 0 && m->role == PX_SERVE_ROLE_SYSTEM && (rules & PX__CHAT_SYSTEM_FIRST))
            return bad_at(bad, i, err, PX_EINVAL,
                          "messages[%zu]: the %s template takes a system message only as "
                          "the first message; merge it into that one",
                          i, t->b->name);
        px_serve_role want = (i - first) % 2 ? PX_SERVE_ROLE_ASSISTANT : PX_SERVE_ROLE_USER;
        if (i >= first && (rules & PX__CHAT_ALTERNATE) && m->role != want)
            return bad_at(bad, i, err, PX_EINVAL,
                          "messages[%zu]: a %s message where the %s template needs a %s one "
                          "(user and assistant messages alternate, user first, after an "
                          "optional first system message)",
                          i, px_serve_role_name(m->role), t->b->name, px_serve_role_name(want));
    }
    return PX_OK;
}
