/* Errors, arenas, strings, JSON limits, RNG streams and hashing. */
#include "px_test.h"

#include <math.h>
#include <string.h>

static void test_err_messages_and_prefix(void **state)
{
    (void)state;
    px_err err;
    assert_int_equal(px_err_set(&err, PX_EPARSE, "links[%d]: bad", 3), PX_EPARSE);
    assert_string_equal(err.msg, "links[3]: bad");
    px_err_prefix(&err, PX_EPARSE, "%s: ", "inventory.json");
    assert_string_equal(err.msg, "inventory.json: links[3]: bad");
    assert_string_equal(px_status_name(PX_ELIMIT), "PX_ELIMIT");
    assert_string_equal(px_status_str(PX_OK), "ok");
    assert_int_equal(px_err_set(NULL, PX_EIO, "ignored"), PX_EIO);
}

/* Every message is well-formed UTF-8, whatever bytes were quoted into it and
 * wherever a long one was cut, so that it can go into a JSON reply. */
static void test_err_messages_are_always_utf8(void **state)
{
    (void)state;
    px_err err;
    px_err_set(&err, PX_EPARSE, "name \"%s\": bad", "a\xff\xc3(\xe2\x82z\xed\xa0\x80");
    assert_string_equal(err.msg, "name \"a?"
                                 "?(?"
                                 "?z???\": bad");
    px_err_set(&err, PX_EPARSE, "caf\xc3\xa9 \xf0\x9f\x98\x80 ok");
    assert_string_equal(err.msg, "caf\xc3\xa9 \xf0\x9f\x98\x80 ok");

    /* A long message of two-byte characters is cut on a boundary. */
    char big[3000];
    for (size_t i = 0; i + 1 < sizeof big; i += 2)
        memcpy(big + i, "\xc3\xa9", 2);
    big[sizeof big - 1] = '\0';
    px_err_set(&err, PX_EPARSE, "x%s", big);
    size_t n = strlen(err.msg);
    assert_true(n < sizeof err.msg);
    assert_memory_equal(err.msg + n - 3, "...", 3);
    assert_int_equal((n - 4) % 2, 0); /* "x", whole characters, "..." */
    assert_memory_equal(err.msg + n - 5, "\xc3\xa9", 2);

    px_err_set(&err, PX_EPARSE, "%s", big);
    px_err_prefix(&err, PX_EPARSE, "model.gguf: ");
    n = strlen(err.msg);
    assert_memory_equal(err.msg, "model.gguf: ", 12);
    assert_memory_equal(err.msg + n - 3, "...", 3);
    assert_memory_equal(err.msg + n - 5, "\xc3\xa9", 2);
}

static void test_arena_alignment_limit_and_reset(void **state)
{
    (void)state;
    px_arena *a;
    px_assert_ok(px_arena_new(128, &a, NULL), (px_err *)NULL);
    for (int i = 1; i < 100; i++) {
        void *p = px_arena_alloc(a, (size_t)i);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, (size_t)i);
    }
    assert_non_null(px_arena_alloc(a, 100000)); /* bigger than a block */
    assert_null(px_arena_calloc(a, SIZE_MAX / 2, 4));
    char *s = px_arena_printf(a, "%s-%d", "gpu", 7);
    assert_string_equal(s, "gpu-7");
    px_arena_reset(a);
    assert_int_equal(px_arena_used(a), 0);
    px_arena_set_limit(a, px_arena_reserved(a) + 1000);
    assert_null(px_arena_alloc(a, 1 << 20));
    px_arena_free(a);
    px_arena_free(NULL);
}

static void test_strbuf_grows_and_escapes(void **state)
{
    (void)state;
    px_strbuf sb = PX_STRBUF_INIT;
    assert_string_equal(sb.buf, "");
    for (int i = 0; i < 1000; i++)
        px_strbuf_addf(&sb, "%d,", i);
    assert_true(px_str_starts_with(sb.buf, "0,1,2,"));
    assert_true(px_str_ends_with(sb.buf, "999,"));
    px_strbuf_reset(&sb);
    px_strbuf_add_pointer_token(&sb, "a/b~c");
    assert_string_equal(sb.buf, "a~1b~0c");
    size_t len;
    char *d = px_strbuf_detach(&sb, &len);
    assert_int_equal(len, 7);
    free(d);
    assert_string_equal(sb.buf, "");
    px_strbuf_release(&sb);
    char small[4];
    assert_int_equal(px_strlcpy(small, "abcdef", sizeof small), 6);
    assert_string_equal(small, "abc");
}

static void test_json_limits_refuse_hostile_documents(void **state)
{
    (void)state;
    px_err err;
    json_t *v;
    px_json_limits lim = {.max_bytes = 1000, .max_depth = 4, .max_string = 8, .max_elements = 3};
    const char *ok = "{\"a\": [1, 2, {\"b\": \"short\"}]}";
    px_assert_ok(px_json_parse(ok, strlen(ok), "doc", &lim, &v, &err), &err);
    json_decref(v);
    struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"[[[[[[1]]]]]]", "nesting deeper"},
        {"{\"a\": \"this string is long\"}", "/a: string of"},
        {"[1, 2, 3, 4]", "array of 4"},
        {"{\"a\": 1, \"a\": 2}", "duplicate"},
        {"{\"a\": ", "doc:1:"},
        {"\"\\u0000\"", "doc:"},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++) {
        if (px_json_parse(bad[i].text, strlen(bad[i].text), "doc", &lim, &v, &err) == PX_OK)
            fail_msg("accepted %s", bad[i].text);
        px_assert_contains(err.msg, bad[i].needle);
    }
    char big[2000];
    memset(big, ' ', sizeof big);
    big[0] = '1';
    assert_int_equal(px_json_parse(big, sizeof big, "doc", &lim, &v, &err), PX_ELIMIT);
}

static void test_json_canonical_is_sorted_and_stable(void **state)
{
    (void)state;
    json_t *a = json_pack("{s:i, s:s, s:[i,i]}", "zeta", 1, "alpha", "x", "mid", 1, 2);
    json_t *b = json_pack("{s:[i,i], s:s, s:i}", "mid", 1, 2, "alpha", "x", "zeta", 1);
    char *sa = px_json_dump_canonical(a), *sb = px_json_dump_canonical(b);
    assert_string_equal(sa, sb);
    assert_true(strstr(sa, "alpha") < strstr(sa, "zeta"));
    char ha[65], hb[65];
    assert_int_equal(px_json_digest_hex(a, ha), PX_OK);
    assert_int_equal(px_json_digest_hex(b, hb), PX_OK);
    assert_string_equal(ha, hb);
    free(sa);
    free(sb);
    json_decref(a);
    json_decref(b);
}

static void test_rng_streams_are_fixed(void **state)
{
    (void)state;
    px_rng r;
    px_rng_seed(&r, 42);
    /* The stream for seed 42 is part of the trace format: it must never
     * change between versions or machines. */
    uint64_t first = px_rng_next(&r);
    px_rng r2;
    px_rng_seed(&r2, 42);
    assert_int_equal(first, px_rng_next(&r2));
    px_rng_seed(&r, 0);
    assert_int_equal(px_rng_next(&r), 0x99ec5f36cb75f2b4ULL);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = px_rng_uniform(&r);
        assert_true(u >= 0 && u < 1);
        sum += u;
    }
    assert_true(sum / 100000 > 0.49 && sum / 100000 < 0.51);
    for (int i = 0; i < 1000; i++)
        assert_true(px_rng_below(&r, 7) < 7);
    px_rng d1 = px_rng_derive(1, 2), d2 = px_rng_derive(1, 3);
    assert_int_not_equal(px_rng_next(&d1), px_rng_next(&d2));
}

static void test_sha256_known_answers(void **state)
{
    (void)state;
    px_digest d;
    char hex[65];
    px_sha256("abc", 3, &d);
    px_digest_hex(&d, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    px_digest back;
    assert_int_equal(px_digest_parse(hex, &back), PX_OK);
    assert_memory_equal(back.bytes, d.bytes, 32);
    assert_int_equal(px_digest_parse("zz", &back), PX_EPARSE);
    px_sha256_ctx *h;
    px_assert_ok(px_sha256_new(&h, NULL), (px_err *)NULL);
    px_sha256_update(h, "a", 1);
    px_sha256_update(h, "bc", 2);
    px_digest d2;
    px_sha256_final(h, &d2);
    assert_memory_equal(d2.bytes, d.bytes, 32);
}

static void test_files_read_write_and_bounds(void **state)
{
    (void)state;
    char *path = px_asprintf("%s/f.txt", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_write_file(path, "hello", 5, &err), &err);
    char *buf;
    size_t len;
    px_assert_ok(px_read_file(path, 100, &buf, &len, &err), &err);
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello");
    free(buf);
    assert_int_equal(px_read_file(path, 3, &buf, &len, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "limit");
    assert_int_equal(px_read_file("/nonexistent/x", 3, &buf, &len, &err), PX_ENOTFOUND);
    int64_t t;
    px_assert_ok(px_time_parse("2000-03-01T00:00:00Z", &t, &err), &err);
    assert_int_equal(t, 951868800);
    assert_int_not_equal(px_time_parse("2000-13-01T00:00:00Z", &t, &err), PX_OK);
    free(path);
}

static void test_diags_keep_every_problem_up_to_a_bound(void **state)
{
    (void)state;
    px_diags d;
    px_diags_init(&d);
    d.max = 3;
    for (int i = 0; i < 5; i++)
        px_diags_add(&d, PX_SEV_ERROR, "/links/0", "define it", "problem %d", i);
    assert_int_equal(d.n, 3);
    assert_int_equal(d.n_errors, 5);
    assert_int_equal(d.n_dropped, 2);
    char *s = px_diags_format(&d, "inv.json");
    px_assert_contains(s, "inv.json: error: /links/0: problem 0");
    px_assert_contains(s, "fix: define it");
    px_assert_contains(s, "2 more problems");
    free(s);
    json_t *j = px_diags_to_json(&d);
    assert_int_equal(json_array_size(j), 3);
    json_decref(j);
    px_diags_release(&d);
}

/* Student's t quantiles against published values (R's qt). */
static void test_student_t_quantiles_match_published_values(void **state)
{
    (void)state;
    assert_float_equal(px_stat_t_quantile(0.975, 1), 12.7062047362, 1e-8);
    assert_float_equal(px_stat_t_quantile(0.975, 2), 4.3026527297, 1e-8);
    assert_float_equal(px_stat_t_quantile(0.975, 10), 2.2281388520, 1e-8);
    assert_float_equal(px_stat_t_quantile(0.95, 5), 2.0150483733, 1e-8);
    assert_float_equal(px_stat_t_quantile(0.975, 1000), 1.9623390808, 1e-8);
    assert_float_equal(px_stat_t_quantile(0.975, 2.5), 3.5746548, 1e-6);
    assert_float_equal(px_stat_t_quantile(0.5, 4), 0, 0);
    assert_true(isinf(px_stat_t_quantile(0.975, 0)));
    assert_true(isinf(px_stat_t_quantile(0.975, NAN)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_messages_and_prefix),
        cmocka_unit_test(test_err_messages_are_always_utf8),
        cmocka_unit_test(test_arena_alignment_limit_and_reset),
        cmocka_unit_test(test_strbuf_grows_and_escapes),
        cmocka_unit_test(test_json_limits_refuse_hostile_documents),
        cmocka_unit_test(test_json_canonical_is_sorted_and_stable),
        cmocka_unit_test(test_rng_streams_are_fixed),
        cmocka_unit_test(test_sha256_known_answers),
        cmocka_unit_test(test_files_read_write_and_bounds),
        cmocka_unit_test(test_diags_keep_every_problem_up_to_a_bound),
        cmocka_unit_test(test_student_t_quantiles_match_published_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
