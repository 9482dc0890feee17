/* Fuzz target: chat templates.  Any bytes as a GGUF's tokenizer.chat_template
 * are recognized or refused cleanly (never a crash, an unbounded read or a
 * wrong status), and a recognized template renders a conversation; any
 * conversation (roles and contents from the input, with a built-in chosen by
 * the first byte) is rendered or refused, and check and render agree. */
#include "base/common.h"

#include "plexus/serve.h"
#include "serve/serve_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const px_serve_chat_msg hello[] = {
    {PX_SERVE_ROLE_SYSTEM, "s", 1},
    {PX_SERVE_ROLE_USER, "u", 1},
};

static void recognize(const char *text, size_t size)
{
    px_err err;
    px_serve_chat_template *t = NULL;
    px_strbuf detail = PX_STRBUF_INIT;
    px_status st = px_serve_chat_template_detect(text, size, &t, &detail, &err);
    if (st == PX_OK) {
        const px_serve_chat_template_info *in = px_serve_chat_template_info_get(t);
        px_serve_chat_template *same = NULL;
        if (px_serve_chat_template_by_name(in->name, &same, &err) != PX_OK)
            __builtin_trap();
        px_serve_chat_template_free(same);
        char *out = NULL;
        size_t len;
        px_serve_chat_render_opts o = {.add_generation_prompt = true, .date = "01 Jan 2030"};
        st = px_serve_chat_template_render(t, hello, 2, &o, &out, &len, &err);
        if (st != PX_OK && st != PX_EINVAL)
            __builtin_trap();
        free(out);
    } else if ((st != PX_ENOTFOUND || !detail.len) && st != PX_ELIMIT) {
        __builtin_trap();
    }
    px_strbuf_release(&detail);
    px_serve_chat_template_free(t);
}

/* Messages separated by 0x1e; the first byte of each picks its role (3:
 * an invalid one). */
static void converse(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    const char *name = px__chat_builtins[data[0] % px__chat_n_builtins].name;
    px_serve_chat_template *t;
    px_err err;
    if (px_serve_chat_template_by_name(name, &t, &err) != PX_OK)
        __builtin_trap();
    px_serve_chat_msg m[64];
    size_t n = 0, start = 1;
    for (size_t i = 1; i <= size && n < PX_ARRAY_LEN(m); i++) {
        if (i < size && data[i] != 0x1e)
            continue;
        if (i > start)
            m[n++] = (px_serve_chat_msg){(px_serve_role)(data[start] % 4),
                                         (const char *)data + start + 1, i - start - 1};
        start = i + 1;
    }
    size_t bad;
    px_status checked = px_serve_chat_template_check(t, m, n, &bad, &err);
    char *out = NULL;
    size_t len = 0;
    px_serve_chat_render_opts o = {.add_generation_prompt = data[0] & 0x80, .date = NULL};
    px_status st = px_serve_chat_template_render(t, m, n, &o, &out, &len, &err);
    if (st != checked || (st == PX_OK) != (out != NULL))
        __builtin_trap();
    if (st != PX_OK && st != PX_EINVAL && st != PX_ELIMIT)
        __builtin_trap();
    if (st != PX_OK && bad != SIZE_MAX && bad >= n)
        __builtin_trap();
    free(out);
    px_serve_chat_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    recognize((const char *)data, size);
    converse(data, size);
    return 0;
}
