/* Chat templates: every built-in renders the reference conversation as its
 * Jinja does; the tokenizer.chat_template strings of real GGUF files are
 * recognized as the right built-in (or refused, naming the markers) and
 * render exactly what a Jinja engine renders from them
 * (tests/data/chat_templates: manifest.json, expected.json); whitespace is
 * stripped as Python strips it; conversations are checked against each
 * template's rules and bounds; templates come from a model's metadata. */
#include "px_test.h"

#include <string.h>

#include "plexus/ir.h"
#include "plexus/serve.h"
#include "serve/serve_impl.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

#define MSG(role, text)                             \
    {                                               \
        PX_SERVE_ROLE_##role, text, sizeof text - 1 \
    }

static const px_serve_chat_msg reference[] = {
    MSG(SYSTEM, "You are a helpful assistant."),
    MSG(USER, "Hello"),
    MSG(ASSISTANT, "Hi there"),
    MSG(USER, "Who are you?"),
};

static px_serve_chat_template *by_name(const char *name)
{
    px_serve_chat_template *t;
    px_err err;
    px_assert_ok(px_serve_chat_template_by_name(name, &t, &err), &err);
    return t;
}

static char *render(const px_serve_chat_template *t, const px_serve_chat_msg *m, size_t n, bool gen,
                    const char *date)
{
    px_serve_chat_render_opts o = {.add_generation_prompt = gen, .date = date};
    char *text;
    size_t len;
    px_err err;
    px_assert_ok(px_serve_chat_template_render(t, m, n, &o, &text, &len, &err), &err);
    assert_int_equal(strlen(text), len);
    return text;
}

static void assert_text(const char *what, const char *got, const char *want)
{
    if (strcmp(got, want))
        fail_msg("%s:\n--- got\n%s\n--- want\n%s\n---", what, got, want);
}

static char *slurp(const char *rel, size_t *len)
{
    char *path = px_test_source_path(rel), *text;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 22, &text, len, &err), &err);
    free(path);
    return text;
}

static json_t *load_json(const char *rel)
{
    char *path = px_test_source_path(rel);
    json_t *v;
    px_err err;
    px_assert_ok(px_json_load_file(path, NULL, &v, &err), &err);
    free(path);
    return v;
}

static px_serve_chat_template *detect_file(const char *file)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/chat_templates/%s", file);
    size_t len;
    char *jinja = slurp(rel, &len);
    px_serve_chat_template *t = NULL;
    px_err err;
    px_status st = px_serve_chat_template_detect(jinja, len, &t, NULL, &err);
    free(jinja);
    if (st != PX_OK && st != PX_ENOTFOUND)
        fail_msg("%s: %s", file, err.msg);
    return t;
}

/* ------------------------------------------------------------------ */
/* Every built-in, on the reference conversation                       */
/* ------------------------------------------------------------------ */

/* System, user, assistant, user, with the generation prompt, as each
 * template's Jinja renders it (less the leading BOS).  Where the Jinja has
 * no system role (mistral, gemma), the system message opens the first
 * user message, followed by a blank line. */
static const struct {
    const char *name;
    const char *text;
} rendered[] = {
    {"chatml", "<|im_start|>system\n"
               "You are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\n"
               "Hello<|im_end|>\n"
               "<|im_start|>assistant\n"
               "Hi there<|im_end|>\n"
               "<|im_start|>user\n"
               "Who are you?<|im_end|>\n"
               "<|im_start|>assistant\n"},
    {"qwen3", "<|im_start|>system\n"
              "You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\n"
              "Hello<|im_end|>\n"
              "<|im_start|>assistant\n"
              "Hi there<|im_end|>\n"
              "<|im_start|>user\n"
              "Who are you?<|im_end|>\n"
              "<|im_start|>assistant\n"},
    {"llama-2", "[INST] <<SYS>>\n"
                "You are a helpful assistant.\n"
                "<</SYS>>\n"
                "\n"
                "Hello [/INST] Hi there </s><s>[INST] Who are you? [/INST]"},
    {"llama-3", "<|start_header_id|>system<|end_header_id|>\n"
                "\n"
                "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                "\n"
                "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                "\n"
                "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                "\n"
                "Who are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                "\n"},
    {"llama-3.1", "<|start_header_id|>system<|end_header_id|>\n"
                  "\n"
                  "Cutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n"
                  "\n"
                  "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"
                  "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Who are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"},
    {"mistral", "[INST] You are a helpful assistant.\n"
                "\n"
                "Hello [/INST]Hi there</s>[INST] Who are you? [/INST]"},
    {"mistral-v1", " [INST] You are a helpful assistant.\n"
                   "\n"
                   "Hello [/INST] Hi there</s> [INST] Who are you? [/INST]"},
    {"mistral-v3", "[INST] Hello[/INST] Hi there</s>[INST] You are a helpful assistant.\n"
                   "\n"
                   "Who are you?[/INST]"},
    {"mistral-v3-tekken", "[INST]Hello[/INST]Hi there</s>[INST]You are a helpful assistant.\n"
                          "\n"
                          "Who are you?[/INST]"},
    {"mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant.[/SYSTEM_PROMPT][INST] "
                   "Hello[/INST] Hi there</s>[INST] Who are you?[/INST]"},
    {"mistral-v7-tekken",
     "[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi "
     "there</s>[INST]Who are you?[/INST]"},
    {"gemma", "<start_of_turn>user\n"
              "You are a helpful assistant.\n"
              "\n"
              "Hello<end_of_turn>\n"
              "<start_of_turn>model\n"
              "Hi there<end_of_turn>\n"
              "<start_of_turn>user\n"
              "Who are you?<end_of_turn>\n"
              "<start_of_turn>model\n"},
    {"phi-3", "<|system|>\n"
              "You are a helpful assistant.<|end|>\n"
              "<|user|>\n"
              "Hello<|end|>\n"
              "<|assistant|>\n"
              "Hi there<|end|>\n"
              "<|user|>\n"
              "Who are you?<|end|>\n"
              "<|assistant|>\n"},
    {"phi-4", "<|im_start|>system<|im_sep|>You are a helpful "
              "assistant.<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|"
              "im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are "
              "you?<|im_end|><|im_start|>assistant<|im_sep|>"},
    {"phi-4-mini",
     "<|system|>You are a helpful assistant.<|end|><|user|>Hello<|end|><|assistant|>Hi "
     "there<|end|><|user|>Who are you?<|end|><|assistant|>"},
    {"zephyr", "<|system|>\n"
               "You are a helpful assistant.</s>\n"
               "<|user|>\n"
               "Hello</s>\n"
               "<|assistant|>\n"
               "Hi there</s>\n"
               "<|user|>\n"
               "Who are you?</s>\n"
               "<|assistant|>\n"},
    {"tulu", "<|system|>\n"
             "You are a helpful assistant.\n"
             "<|user|>\n"
             "Hello\n"
             "<|assistant|>\n"
             "Hi there<|endoftext|>\n"
             "<|user|>\n"
             "Who are you?\n"
             "<|assistant|>\n"},
    {"vicuna", "You are a helpful assistant.\n"
               "\n"
               "USER: Hello\n"
               "ASSISTANT: Hi there</s>\n"
               "USER: Who are you?\n"
               "ASSISTANT:"},
    {"vicuna-orca", "SYSTEM: You are a helpful assistant.\n"
                    "USER: Hello\n"
                    "ASSISTANT: Hi there</s>\n"
                    "USER: Who are you?\n"
                    "ASSISTANT:"},
    {"deepseek", "You are a helpful assistant.### Instruction:\n"
                 "Hello\n"
                 "### Response:\n"
                 "Hi there\n"
                 "<|EOT|>\n"
                 "### Instruction:\n"
                 "Who are you?\n"
                 "### Response:\n"},
    {"deepseek2", "You are a helpful assistant.\n"
                  "\n"
                  "User: Hello\n"
                  "\n"
                  "Assistant: Hi there<\xef\xbd\x9c"
                  "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>User: Who are you?\n"
                  "\n"
                  "Assistant:"},
    {"deepseek3", "You are a helpful assistant.<\xef\xbd\x9cUser\xef\xbd\x9c>Hello<\xef\xbd\x9c"
                  "Assistant\xef\xbd\x9c>Hi there<\xef\xbd\x9c"
                  "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>"
                  "Who are you?<\xef\xbd\x9c"
                  "Assistant\xef\xbd\x9c>"},
    {"command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful "
                  "assistant.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_"
                  "OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi "
                  "there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are "
                  "you?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"openchat", "GPT4 Correct System: You are a helpful assistant.<|end_of_turn|>GPT4 Correct "
                 "User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 "
                 "Correct User: Who are you?<|end_of_turn|>GPT4 Correct Assistant:"},
};

static void test_every_builtin_renders_the_reference_conversation(void **state)
{
    (void)state;
    assert_int_equal(PX_ARRAY_LEN(rendered), px__chat_n_builtins);
    for (size_t i = 0; i < PX_ARRAY_LEN(rendered); i++) {
        px_serve_chat_template *t = by_name(rendered[i].name);
        assert_string_equal(px_serve_chat_template_info_get(t)->name, rendered[i].name);
        char *text = render(t, reference, 4, true, NULL);
        assert_text(rendered[i].name, text, rendered[i].text);
        free(text);
        px_serve_chat_template_free(t);
        /* Every built-in is listed by name. */
        assert_non_null(strstr(px_serve_chat_template_names(), rendered[i].name));
    }
}

/* ------------------------------------------------------------------ */
/* Real GGUF templates                                                 */
/* ------------------------------------------------------------------ */

static void test_real_gguf_templates_are_recognized(void **state)
{
    (void)state;
    json_t *manifest = load_json("tests/data/chat_templates/manifest.json");
    const char *file;
    json_t *entry;
    size_t n_known = 0, n_unknown = 0;
    json_object_foreach(json_object_get(manifest, "files"), file, entry)
    {
        const char *want = json_string_value(json_object_get(entry, "template"));
        px_serve_chat_template *t = detect_file(file);
        if (!want) {
            if (t)
                fail_msg("%s: recognized as %s; it renders differently (%s)", file,
                         px_serve_chat_template_info_get(t)->name,
                         json_string_value(json_object_get(entry, "why")));
            n_unknown++;
            continue;
        }
        if (!t)
            fail_msg("%s: not recognized; want %s", file, want);
        if (strcmp(px_serve_chat_template_info_get(t)->name, want))
            fail_msg("%s: recognized as %s; want %s", file,
                     px_serve_chat_template_info_get(t)->name, want);
        n_known++;
        px_serve_chat_template_free(t);
    }
    assert_true(n_known >= 40);
    assert_true(n_unknown >= 8);
    json_decref(manifest);
}

/* The conversation named in expected.json, as messages. */
static px_serve_chat_msg *conversation(const json_t *doc, const char *name, size_t *n)
{
    const json_t *arr = json_object_get(json_object_get(doc, "conversations"), name);
    assert_non_null(arr);
    *n = json_array_size(arr);
    px_serve_chat_msg *m = calloc(*n, sizeof *m);
    for (size_t i = 0; i < *n; i++) {
        const json_t *msg = json_array_get(arr, i);
        const char *role = json_string_value(json_object_get(msg, "role"));
        m[i].role = !strcmp(role, "system") ? PX_SERVE_ROLE_SYSTEM
                    : !strcmp(role, "user") ? PX_SERVE_ROLE_USER
                                            : PX_SERVE_ROLE_ASSISTANT;
        m[i].content = json_string_value(json_object_get(msg, "content"));
        m[i].len = json_string_length(json_object_get(msg, "content"));
    }
    return m;
}

static void test_real_gguf_templates_render_as_their_jinja(void **state)
{
    (void)state;
    json_t *manifest = load_json("tests/data/chat_templates/manifest.json");
    json_t *expected = load_json("tests/data/chat_templates/expected.json");
    json_t *renders = json_object_get(expected, "renders");
    assert_true(json_array_size(renders) >= 300);
    size_t i;
    json_t *r;
    json_array_foreach(renders, i, r)
    {
        const char *file = json_string_value(json_object_get(r, "file"));
        const json_t *entry = json_object_get(json_object_get(manifest, "files"), file);
        px_serve_chat_template *t = detect_file(file);
        assert_non_null(t);
        /* The model's vocabulary supplies these texts in a real run. */
        const char *bos = json_string_value(json_object_get(entry, "bos"));
        const char *eos = json_string_value(json_object_get(entry, "eos"));
        px_assert_ok(px__chat_template_set(t, &t->bos, bos, strlen(bos)), NULL);
        px_assert_ok(px__chat_template_set(t, &t->eos, eos, strlen(eos)), NULL);
        size_t n;
        const char *conv = json_string_value(json_object_get(r, "conversation"));
        px_serve_chat_msg *m = conversation(expected, conv, &n);
        bool gen = json_is_true(json_object_get(r, "add_generation_prompt"));
        char *text = render(t, m, n, gen, json_string_value(json_object_get(entry, "date")));
        char what[256];
        snprintf(what, sizeof what, "%s, %s, add_generation_prompt %d", file, conv, gen);
        assert_text(what, text, json_string_value(json_object_get(r, "text")));
        free(text);
        free(m);
        px_serve_chat_template_free(t);
    }
    json_decref(expected);
    json_decref(manifest);
}

static void test_unknown_template_names_markers_and_builtins(void **state)
{
    (void)state;
    size_t len;
    char *jinja = slurp("tests/data/chat_templates/yi-6b.jinja", &len);
    px_serve_chat_template *t;
    px_err err;
    px_strbuf detail = PX_STRBUF_INIT;
    assert_int_equal(px_serve_chat_template_detect(jinja, len, &t, &detail, &err), PX_ENOTFOUND);
    assert_null(t);
    px_assert_contains(err.msg, "\"<|im_start|>\"");
    px_assert_contains(err.msg, "--chat-template NAME");
    /* The whole list, which err's 256 bytes may cut, is in detail. */
    px_assert_contains(detail.buf, "\"<|im_start|>\"");
    px_assert_contains(detail.buf, px_serve_chat_template_names());
    px_strbuf_release(&detail);
    free(jinja);
    /* Nothing at all, and text that is no template. */
    assert_int_equal(px_serve_chat_template_detect("", 0, &t, NULL, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "markers found: none");
    assert_int_equal(px_serve_chat_template_detect(NULL, 5, &t, NULL, &err), PX_ENOTFOUND);
    const char *raw = "<|im_start|>user\n{{ messages }}";
    assert_int_equal(px_serve_chat_template_detect(raw, strlen(raw), &t, NULL, &err), PX_ENOTFOUND);
    /* Over 1 MiB is refused before any search. */
    size_t big = ((size_t)1 << 20) + 1;
    char *huge = malloc(big);
    memset(huge, '{', big);
    assert_int_equal(px_serve_chat_template_detect(huge, big, &t, NULL, &err), PX_ELIMIT);
    free(huge);
}

static void test_names_and_aliases(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"llama2", "llama-2"}, {"llama3", "llama-3"}, {"phi3", "phi-3"}, {"phi4", "phi-4"}};
    for (size_t i = 0; i < PX_ARRAY_LEN(pairs); i++) {
        px_serve_chat_template *t = by_name(pairs[i][0]);
        assert_string_equal(px_serve_chat_template_info_get(t)->name, pairs[i][1]);
        px_serve_chat_template_free(t);
    }
    px_serve_chat_template *t;
    px_err err;
    assert_int_equal(px_serve_chat_template_by_name("alpaca", &t, &err), PX_ENOTFOUND);
    assert_null(t);
    px_assert_contains(err.msg, "\"alpaca\"");
    px_assert_contains(err.msg, "chatml");
    assert_int_equal(px_serve_chat_template_by_name(NULL, &t, &err), PX_ENOTFOUND);
}

/* ------------------------------------------------------------------ */
/* What templates say about themselves                                 */
/* ------------------------------------------------------------------ */

static void test_info_stops_bos_and_default_system(void **state)
{
    (void)state;
    px_serve_chat_template *t = by_name("chatml");
    const px_serve_chat_template_info *in = px_serve_chat_template_info_get(t);
    assert_false(in->add_bos);
    assert_int_equal(in->n_stops, 1);
    assert_string_equal(in->stops[0], "<|im_end|>");
    assert_null(in->order_rule);
    assert_null(in->default_system);
    px_serve_chat_template_free(t);

    t = by_name("llama-3.1");
    in = px_serve_chat_template_info_get(t);
    assert_true(in->add_bos);
    assert_int_equal(in->n_stops, 2);
    assert_string_equal(in->stops[1], "<|eom_id|>");
    px_serve_chat_template_free(t);

    /* Templates that end turns with EOS stop on the vocabulary's EOS. */
    t = by_name("zephyr");
    px_assert_ok(px__chat_template_set(t, &t->eos, "<|endoftext|>", 13), NULL);
    in = px_serve_chat_template_info_get(t);
    assert_int_equal(in->n_stops, 1);
    assert_string_equal(in->stops[0], "<|endoftext|>");
    px_serve_chat_template_free(t);

    t = by_name("gemma");
    in = px_serve_chat_template_info_get(t);
    assert_string_equal(in->stops[0], "<end_of_turn>");
    px_assert_contains(in->order_rule, "alternate");
    px_serve_chat_template_free(t);

    t = detect_file("qwen2.5-0.5b.jinja");
    in = px_serve_chat_template_info_get(t);
    assert_string_equal(in->default_system,
                        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    assert_false(in->add_bos);
    px_serve_chat_template_free(t);

    t = detect_file("deepseek-coder-1.3b.jinja");
    in = px_serve_chat_template_info_get(t);
    px_assert_contains(in->default_system, "You are an AI programming assistant");
    assert_int_equal(in->default_system[strlen(in->default_system) - 1], '\n');
    px_serve_chat_template_free(t);
}

/* ------------------------------------------------------------------ */
/* Whitespace                                                          */
/* ------------------------------------------------------------------ */

static void test_whitespace_is_stripped_as_python_strips_it(void **state)
{
    (void)state;
    /* U+3000 and U+00A0 are whitespace to Python's str.strip(); U+200B
     * (zero width space) is not. */
    static const px_serve_chat_msg spaced[] = {
        MSG(SYSTEM, "  Be brief.  "),
        MSG(USER, "\xe3\x80\x80 Hello\xc2\xa0\t"),
        MSG(ASSISTANT, "   Hi \xe2\x80\x8b  "),
        MSG(USER, "\nBye\n"),
    };
    static const struct {
        const char *name, *text;
    } cases[] = {
        {"llama-2", "[INST] <<SYS>>\n  Be brief.  \n<</SYS>>\n\n\xe3\x80\x80 Hello [/INST] Hi "
                    "\xe2\x80\x8b </s><s>[INST] Bye [/INST]"},
        {"llama-3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nHi \xe2\x80\x8b<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"},
        {"gemma", "<start_of_turn>user\n  Be brief.  \n\nHello<end_of_turn>\n"
                  "<start_of_turn>model\nHi \xe2\x80\x8b<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n"},
        {"command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>  Be brief.  <|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi \xe2\x80\x8b"
                      "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye"
                      "<|END_OF_TURN_TOKEN|>"},
        /* ChatML keeps content as it is. */
        {"chatml", "<|im_start|>system\n  Be brief.  <|im_end|>\n<|im_start|>user\n\xe3\x80\x80 "
                   "Hello\xc2\xa0\t<|im_end|>\n<|im_start|>assistant\n   Hi \xe2\x80\x8b  "
                   "<|im_end|>\n<|im_start|>user\n\nBye\n<|im_end|>\n"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        px_serve_chat_template *t = by_name(cases[i].name);
        char *text = render(t, spaced, 4, false, NULL);
        assert_text(cases[i].name, text, cases[i].text);
        free(text);
        px_serve_chat_template_free(t);
    }
    /* Content that is all whitespace strips to nothing; llama-2 strips the
     * joined <<SYS>> block with it. */
    static const px_serve_chat_msg blank[] = {MSG(SYSTEM, "S"), MSG(USER, " \n ")};
    px_serve_chat_template *t = by_name("llama-2");
    char *text = render(t, blank, 2, true, NULL);
    assert_text("llama-2 blank", text, "[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
    free(text);
    px_serve_chat_template_free(t);
}

static void test_thinking_templates_drop_or_keep_reasoning(void **state)
{
    (void)state;
    static const px_serve_chat_msg think[] = {
        MSG(USER, "2+2?"),
        MSG(ASSISTANT, "<think>\nadd\n</think>\n\n4"),
        MSG(USER, "3+3?"),
        MSG(ASSISTANT, "<think>\nadd again\n</think>\n\n6"),
    };
    /* Qwen 3 keeps the reasoning of the answer after the last question
     * only; DeepSeek R1 keeps none. */
    px_serve_chat_template *t = by_name("qwen3");
    char *text = render(t, think, 4, false, NULL);
    assert_text("qwen3", text,
                "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
                "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nadd again\n"
                "</think>\n\n6<|im_end|>\n");
    free(text);
    px_serve_chat_template_free(t);
    t = by_name("deepseek3");
    text = render(t, think, 4, false, NULL);
    assert_text("deepseek3", text,
                "<\xef\xbd\x9cUser\xef\xbd\x9c>2+2?<\xef\xbd\x9c"
                "Assistant\xef\xbd\x9c>\n\n4<\xef\xbd\x9c"
                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>"
                "3+3?<\xef\xbd\x9c"
                "Assistant\xef\xbd\x9c>\n\n6<\xef\xbd\x9c"
                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    free(text);
    px_serve_chat_template_free(t);
}

static void test_llama32_prints_the_date_it_is_given_or_today(void **state)
{
    (void)state;
    px_serve_chat_template *t = detect_file("llama3.2-3b.jinja");
    static const px_serve_chat_msg hi[] = {MSG(USER, "Hi")};
    char *text = render(t, hi, 1, true, "01 Feb 2027");
    px_assert_contains(text, "Today Date: 01 Feb 2027\n");
    free(text);
    /* Without a date: today's, in strftime("%d %b %Y") form. */
    text = render(t, hi, 1, true, NULL);
    const char *d = strstr(text, "Today Date: ");
    assert_non_null(d);
    d += 12;
    assert_true(d[0] >= '0' && d[0] <= '3' && d[1] >= '0' && d[1] <= '9' && d[2] == ' ');
    assert_true(d[3] >= 'A' && d[3] <= 'Z' && d[6] == ' ' && d[7] == '2' && d[11] == '\n');
    free(text);
    px_serve_chat_template_free(t);
    /* Llama 3.1 prints its fixed date whatever it is given. */
    t = by_name("llama-3.1");
    text = render(t, hi, 1, true, "01 Feb 2027");
    px_assert_contains(text, "Today Date: 26 Jul 2024\n");
    free(text);
    px_serve_chat_template_free(t);
}

/* ------------------------------------------------------------------ */
/* Checking conversations                                              */
/* ------------------------------------------------------------------ */

static void expect_refused(const char *name, const px_serve_chat_msg *m, size_t n, px_status st,
                           size_t bad_want, const char *needle)
{
    px_serve_chat_template *t = by_name(name);
    size_t bad = 0;
    px_err err;
    assert_int_equal(px_serve_chat_template_check(t, m, n, &bad, &err), st);
    assert_int_equal(bad, bad_want);
    px_assert_contains(err.msg, needle);
    /* Render refuses the same way and returns nothing. */
    char *text = (char *)1;
    size_t len = 1;
    assert_int_equal(px_serve_chat_template_render(t, m, n, NULL, &text, &len, &err), st);
    assert_null(text);
    assert_int_equal(len, 0);
    px_serve_chat_template_free(t);
}

static void test_conversations_are_checked_against_the_template(void **state)
{
    (void)state;
    expect_refused("chatml", reference, 0, PX_EINVAL, SIZE_MAX, "at least one message");
    static const px_serve_chat_msg late_system[] = {MSG(USER, "a"), MSG(SYSTEM, "b")};
    expect_refused("llama-2", late_system, 2, PX_EINVAL, 1, "only as the first message");
    expect_refused("deepseek3", late_system, 2, PX_EINVAL, 1, "deepseek3");
    static const px_serve_chat_msg two_users[] = {MSG(SYSTEM, "s"), MSG(USER, "a"), MSG(USER, "b")};
    expect_refused("gemma", two_users, 3, PX_EINVAL, 2, "a user message where the gemma");
    static const px_serve_chat_msg assistant_first[] = {MSG(ASSISTANT, "a"), MSG(USER, "b")};
    expect_refused("mistral-v3", assistant_first, 2, PX_EINVAL, 0, "needs a user one");
    expect_refused("command-r", assistant_first, 2, PX_EINVAL, 0, "alternate");
    px_serve_chat_msg odd = {(px_serve_role)7, "x", 1};
    expect_refused("chatml", &odd, 1, PX_EINVAL, 0, "unknown role 7");
    px_serve_chat_msg missing = {PX_SERVE_ROLE_USER, NULL, 3};
    expect_refused("chatml", &missing, 1, PX_EINVAL, 0, "messages[0].content");

    /* Empty messages, with or without a pointer, render in every
     * template. */
    px_serve_chat_msg empty[] = {{PX_SERVE_ROLE_USER, NULL, 0},
                                 {PX_SERVE_ROLE_ASSISTANT, "", 0},
                                 {PX_SERVE_ROLE_USER, NULL, 0}};
    for (size_t i = 0; i < px__chat_n_builtins; i++) {
        px_serve_chat_template *e = by_name(px__chat_builtins[i].name);
        free(render(e, empty, 3, true, "01 Jan 2030"));
        px_serve_chat_template_free(e);
    }

    /* Templates without these rules take any order. */
    px_serve_chat_template *t = by_name("chatml");
    px_err err;
    px_assert_ok(px_serve_chat_template_check(t, late_system, 2, NULL, &err), &err);
    px_assert_ok(px_serve_chat_template_check(t, two_users, 3, NULL, &err), &err);
    px_serve_chat_template_free(t);
}

static void test_conversation_bounds(void **state)
{
    (void)state;
    size_t n = PX_SERVE_CHAT_MAX_MESSAGES + 1;
    px_serve_chat_msg *m = calloc(n, sizeof *m);
    for (size_t i = 0; i < n; i++)
        m[i] = (px_serve_chat_msg){i % 2 ? PX_SERVE_ROLE_ASSISTANT : PX_SERVE_ROLE_USER, "x", 1};
    expect_refused("chatml", m, n, PX_ELIMIT, SIZE_MAX, "more than the limit of 1024");
    px_serve_chat_template *t = by_name("chatml");
    px_err err;
    px_assert_ok(px_serve_chat_template_check(t, m, n - 1, NULL, &err), &err);
    px_serve_chat_template_free(t);
    /* Content past PX_SERVE_CHAT_MAX_BYTES in all, even when each message
     * is small enough and the lengths would wrap. */
    px_serve_chat_msg big[2] = {{PX_SERVE_ROLE_USER, "x", PX_SERVE_CHAT_MAX_BYTES},
                                {PX_SERVE_ROLE_ASSISTANT, "y", SIZE_MAX}};
    expect_refused("chatml", big, 2, PX_ELIMIT, 1, "bytes of content");
    free(m);
}

/* ------------------------------------------------------------------ */
/* A model's template                                                  */
/* ------------------------------------------------------------------ */

/* A one-block llama model of zeros whose vocabulary has "<s>" and "</s>"
 * (ids 1, 2; BOS is bos_id), with the given chat template (NULL: none) and
 * add_bos_token (-1: absent). */
static char *write_model(const char *name, const char *chat_template, int add_bos, uint32_t bos_id)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_err err;
    px_ir_gguf_writer *w;
    px_assert_ok(px_ir_gguf_writer_new(path, &w, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str(w, "general.architecture", "llama", &err), &err);
    static const struct {
        const char *key;
        uint32_t v;
    } hp[] = {{"llama.embedding_length", 8},
              {"llama.feed_forward_length", 16},
              {"llama.block_count", 1},
              {"llama.attention.head_count", 2},
              {"llama.attention.head_count_kv", 1},
              {"llama.context_length", 32}};
    for (size_t i = 0; i < PX_ARRAY_LEN(hp); i++)
        px_assert_ok(px_ir_gguf_writer_add_u32(w, hp[i].key, hp[i].v, &err), &err);
    const char *tokens[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "a"};
    int32_t types[] = {PX_TOKEN_UNKNOWN, PX_TOKEN_CONTROL, PX_TOKEN_CONTROL,
                       PX_TOKEN_CONTROL, PX_TOKEN_CONTROL, PX_TOKEN_NORMAL};
    px_assert_ok(px_ir_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", tokens, NULL, 6, &err),
                 &err);
    px_assert_ok(
        px_ir_gguf_writer_add_array(w, "tokenizer.ggml.token_type", PX_GGUF_I32, types, 6, &err),
        &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", bos_id, &err), &err);
    px_assert_ok(px_ir_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2, &err), &err);
    if (add_bos >= 0)
        px_assert_ok(px_ir_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos, &err),
                     &err);
    if (chat_template)
        px_assert_ok(px_ir_gguf_writer_add_str(w, "tokenizer.chat_template", chat_template, &err),
                     &err);
    const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
    } ts[] = {
        {"token_embd.weight", 2, {8, 6}},        {"output_norm.weight", 1, {8, 1}},
        {"blk.0.attn_norm.weight", 1, {8, 1}},   {"blk.0.attn_q.weight", 2, {8, 8}},
        {"blk.0.attn_k.weight", 2, {8, 4}},      {"blk.0.attn_v.weight", 2, {8, 4}},
        {"blk.0.attn_output.weight", 2, {8, 8}}, {"blk.0.ffn_norm.weight", 1, {8, 1}},
        {"blk.0.ffn_gate.weight", 2, {8, 16}},   {"blk.0.ffn_down.weight", 2, {16, 8}},
        {"blk.0.ffn_up.weight", 2, {8, 16}},
    };
    size_t bytes = 0;
    for (size_t i = 0; i < PX_ARRAY_LEN(ts); i++) {
        px_assert_ok(
            px_ir_gguf_writer_add_tensor(w, ts[i].name, PX_DTYPE_F32, ts[i].n_dims, ts[i].ne, &err),
            &err);
        bytes += 4 * ts[i].ne[0] * (ts[i].n_dims > 1 ? ts[i].ne[1] : 1);
    }
    px_assert_ok(px_ir_gguf_writer_begin_data(w, &err), &err);
    char *zeros = calloc(1, bytes);
    px_assert_ok(px_ir_gguf_writer_write(w, zeros, bytes, &err), &err);
    free(zeros);
    px_assert_ok(px_ir_gguf_writer_finish(w, &err), &err);
    return path;
}

static px_ir_model *open_model(const char *path)
{
    px_ir_model *m;
    px_err err;
    px_assert_ok(px_ir_model_open(path, NULL, &m, &err), &err);
    return m;
}

static void test_a_models_template_comes_from_its_metadata(void **state)
{
    (void)state;
    size_t len;
    char *jinja = slurp("tests/data/chat_templates/tinyllama-1.1b.jinja", &len);
    char *path = write_model("zephyr.gguf", jinja, -1, 1);
    free(jinja);
    px_ir_model *m = open_model(path);
    px_serve_chat_template *t;
    px_err err;
    px_assert_ok(px_serve_chat_template_for_model(m, NULL, &t, &err), &err);
    const px_serve_chat_template_info *in = px_serve_chat_template_info_get(t);
    assert_string_equal(in->name, "zephyr");
    assert_string_equal(in->eos_text, "</s>");
    assert_string_equal(in->stops[0], "</s>");
    /* No bos_token in the Jinja, but a llama vocabulary adds BOS unless
     * tokenizer.ggml.add_bos_token says otherwise (llama.cpp's rule). */
    assert_true(in->add_bos);
    px_serve_chat_template_free(t);
    /* --chat-template NAME wins over the metadata. */
    px_assert_ok(px_serve_chat_template_for_model(m, "chatml", &t, &err), &err);
    assert_string_equal(px_serve_chat_template_info_get(t)->name, "chatml");
    assert_true(px_serve_chat_template_info_get(t)->add_bos);
    px_serve_chat_template_free(t);
    assert_int_equal(px_serve_chat_template_for_model(m, "nope", &t, &err), PX_ENOTFOUND);
    px_ir_model_free(m);
    free(path);

    /* add_bos_token false is obeyed unless the Jinja writes bos_token. */
    path = write_model("nobos.gguf",
                       "{% for message in messages %}{{'<|im_start|>' + "
                       "message['role'] + '\\n' + message['content'] + "
                       "'<|im_end|>' + '\\n'}}{% endfor %}",
                       0, 1);
    m = open_model(path);
    px_assert_ok(px_serve_chat_template_for_model(m, NULL, &t, &err), &err);
    assert_false(px_serve_chat_template_info_get(t)->add_bos);
    px_serve_chat_template_free(t);
    px_assert_ok(px_serve_chat_template_for_model(m, "llama-3", &t, &err), &err);
    assert_true(px_serve_chat_template_info_get(t)->add_bos);
    assert_string_equal(px_serve_chat_template_info_get(t)->bos_text, "<s>");
    px_serve_chat_template_free(t);
    px_ir_model_free(m);
    free(path);

    /* A vocabulary whose BOS is "<|im_start|>" (SmolLM 2) and that adds
     * it: the prompt's leading "<|im_start|>" text is left to the
     * tokenizer's BOS id, so it is not doubled. */
    path = write_model("smol.gguf", NULL, 1, 3);
    m = open_model(path);
    px_assert_ok(px_serve_chat_template_for_model(m, "chatml", &t, &err), &err);
    assert_true(px_serve_chat_template_info_get(t)->add_bos);
    static const px_serve_chat_msg hi[] = {MSG(USER, "Hi")};
    char *text = render(t, hi, 1, true, NULL);
    assert_text("chatml, BOS <|im_start|>", text, "user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(text);
    px_serve_chat_template_free(t);
    px_ir_model_free(m);
    free(path);

    /* No template in the file: the fix is --chat-template. */
    path = write_model("none.gguf", NULL, 1, 1);
    m = open_model(path);
    assert_int_equal(px_serve_chat_template_for_model(m, NULL, &t, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "no tokenizer.chat_template");
    px_assert_contains(err.msg, "--chat-template NAME");
    px_ir_model_free(m);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_builtin_renders_the_reference_conversation),
        cmocka_unit_test(test_real_gguf_templates_are_recognized),
        cmocka_unit_test(test_real_gguf_templates_render_as_their_jinja),
        cmocka_unit_test(test_unknown_template_names_markers_and_builtins),
        cmocka_unit_test(test_names_and_aliases),
        cmocka_unit_test(test_info_stops_bos_and_default_system),
        cmocka_unit_test(test_whitespace_is_stripped_as_python_strips_it),
        cmocka_unit_test(test_thinking_templates_drop_or_keep_reasoning),
        cmocka_unit_test(test_llama32_prints_the_date_it_is_given_or_today),
        cmocka_unit_test(test_conversations_are_checked_against_the_template),
        cmocka_unit_test(test_conversation_bounds),
        cmocka_unit_test(test_a_models_template_comes_from_its_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
