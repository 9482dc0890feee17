/* Hostile inventories: mutated bytes and values of every wrong type.  None
 * may crash or leak; whatever is accepted must export and read back.
 * (Inputs shaped to make a reader slow are in test_hw_limits.c.) */
#include "px_test.h"

#include <string.h>

#include "plexus/hw.h"

static char *read_pack(const char *rel, size_t *len)
{
    char *path = px_test_source_path(rel);
    char *text;
    px_err err;
    px_assert_ok(px_read_file(path, 1 << 20, &text, len, &err), &err);
    free(path);
    return text;
}

/* Reads bytes; when accepted, the export must read back to itself. */
static px_status read_and_check(const char *bytes, size_t len)
{
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_status st = px_hw_graph_from_json(bytes, len, "hostile.json", NULL, &g, &diags, NULL);
    if (st == PX_OK) {
        json_t *doc;
        px_assert_ok(px_hw_graph_to_json(g, &doc, NULL), (px_err *)NULL);
        char *a = px_json_dump_canonical(doc);
        json_decref(doc);
        px_hw_graph *h = NULL;
        px_err err;
        if (px_hw_graph_from_json(a, strlen(a), "again.json", NULL, &h, NULL, &err) != PX_OK)
            fail_msg("an accepted input's export was refused: %s\n%s", err.msg, a);
        px_assert_ok(px_hw_graph_to_json(h, &doc, NULL), (px_err *)NULL);
        char *b = px_json_dump_canonical(doc);
        json_decref(doc);
        assert_string_equal(a, b);
        free(a);
        free(b);
        px_hw_graph_free(h);
    } else {
        assert_null(g);
        assert_true(diags.n > 0 || st == PX_ENOMEM);
    }
    px_hw_graph_free(g);
    px_diags_release(&diags);
    return st;
}

static void test_hostile_mutated_bytes_never_crash(void **state)
{
    (void)state;
    static const char *const packs[] = {"data/scenarios/hetero-pair-h100-l4.json",
                                        "data/scenarios/emu-small.json",
                                        "data/scenarios/faulted-cluster.json"};
    px_rng rng;
    px_rng_seed(&rng, 20261129);
    static const char alphabet[] = "{}[]\",:0123456789.-eE \\/tfnu\x01\xff";
    size_t accepted = 0;
    for (size_t p = 0; p < PX_ARRAY_LEN(packs); p++) {
        size_t len;
        char *orig = read_pack(packs[p], &len);
        char *buf = malloc(len + 64);
        for (int round = 0; round < 80; round++) {
            memcpy(buf, orig, len);
            size_t n = len;
            int edits = 1 + (int)px_rng_below(&rng, 4);
            for (int e = 0; e < edits && n > 1; e++) {
                size_t at = (size_t)px_rng_below(&rng, n);
                switch (px_rng_below(&rng, 3)) {
                case 0: /* overwrite */
                    buf[at] = alphabet[px_rng_below(&rng, sizeof alphabet - 1)];
                    break;
                case 1: /* delete */
                    memmove(buf + at, buf + at + 1, n - at - 1);
                    n--;
                    break;
                default: /* insert */
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = alphabet[px_rng_below(&rng, sizeof alphabet - 1)];
                    n++;
                }
            }
            accepted += read_and_check(buf, n) == PX_OK;
        }
        free(buf);
        free(orig);
    }
    /* Some mutations land in free text and keep the file valid. */
    assert_true(accepted > 0);
}

/* Replaces the value at each place in turn by a value of each other JSON
 * type, and reads the result. */
static void confuse(json_t *root, json_t *v, size_t *count)
{
    static const char *const replacements[] = {"null", "7",    "-1.5",      "\"x\"",      "[]",
                                               "{}",   "true", "\"-5 GB\"", "\"1e999 W\""};
    if (json_is_object(v)) {
        const char *key;
        json_t *child;
        void *tmp;
        json_object_foreach_safe(v, tmp, key, child)
        {
            json_incref(child);
            for (size_t r = 0; r < PX_ARRAY_LEN(replacements); r++) {
                json_t *bad = json_loads(replacements[r], JSON_DECODE_ANY, NULL);
                json_object_set_new(v, key, bad);
                char *text = json_dumps(root, JSON_COMPACT);
                read_and_check(text, strlen(text));
                free(text);
                (*count)++;
            }
            json_object_set(v, key, child);
            confuse(root, child, count);
            json_decref(child);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *child = json_array_get(v, i);
            json_incref(child);
            for (size_t r = 0; r < PX_ARRAY_LEN(replacements); r++) {
                json_array_set_new(v, i, json_loads(replacements[r], JSON_DECODE_ANY, NULL));
                char *text = json_dumps(root, JSON_COMPACT);
                read_and_check(text, strlen(text));
                free(text);
                (*count)++;
            }
            json_array_set(v, i, child);
            confuse(root, child, count);
            json_decref(child);
        }
    }
}

static void test_hostile_values_of_every_wrong_type(void **state)
{
    (void)state;
    size_t len;
    char *text = read_pack("data/scenarios/hetero-pair-h100-l4.json", &len);
    json_t *doc = json_loadb(text, len, 0, NULL);
    assert_non_null(doc);
    size_t count = 0;
    confuse(doc, doc, &count);
    assert_true(count > 300);
    json_decref(doc);
    free(text);
}

static void test_hostile_text_is_bounded_not_trusted(void **state)
{
    (void)state;
    /* NUL bytes, control characters and invalid UTF-8 in names. */
    static const char nul[] = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\","
                              " \"hostname\": \"a\\u0000b\"}]}";
    assert_int_equal(read_and_check(nul, strlen(nul)), PX_EPARSE);
    static const char ctl[] = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\","
                              " \"hostname\": \"\\u001b[31mred\"}]}";
    assert_int_equal(read_and_check(ctl, strlen(ctl)), PX_OK);
    static const char utf[] = "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\","
                              " \"hostname\": \"\xc3\x28\"}]}";
    assert_int_equal(read_and_check(utf, strlen(utf)), PX_EPARSE);
    assert_int_equal(read_and_check("", 0), PX_EPARSE);
    assert_int_equal(read_and_check("{", 1), PX_EPARSE);
    /* Bytes after the document. */
    static const char tail[] =
        "{\"schema\": \"plexus.inventory/1\", \"nodes\": [{\"id\": \"n\"}]} x";
    assert_int_equal(read_and_check(tail, strlen(tail)), PX_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_mutated_bytes_never_crash),
        cmocka_unit_test(test_hostile_values_of_every_wrong_type),
        cmocka_unit_test(test_hostile_text_is_bounded_not_trusted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
