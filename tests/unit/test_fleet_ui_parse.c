/* The dashboard's parsers of what a browser sends: the login form's body
 * and the session cookie's value, with hostile inputs (bad escapes,
 * NULs, overlong values, control characters) refused without a crash. */
#include "px_test.h"

#include "fleet/ui_impl.h"

static bool form(const char *body, char *out, size_t cap)
{
    return px__ui_form_token(body, strlen(body), out, cap);
}

static void test_form_token_is_decoded_and_trimmed(void **state)
{
    (void)state;
    char out[300];
    assert_true(form("token=abc", out, sizeof out));
    assert_string_equal(out, "abc");
    assert_true(form("x=1&token=a%2Bb%3D%26c&y=2", out, sizeof out));
    assert_string_equal(out, "a+b=&c");
    assert_true(form("token=+%20pasted%0A%0D", out, sizeof out));
    assert_string_equal(out, "pasted");
    /* Only the field named exactly token. */
    assert_false(form("xtoken=abc", out, sizeof out));
    assert_true(form("xtoken=abc&token=def", out, sizeof out));
    assert_string_equal(out, "def");
}

static void test_form_token_refuses_hostile_bodies(void **state)
{
    (void)state;
    char out[300];
    const char *bad[] = {"",          "token",     "token=",      "token=%",
                         "token=%4",  "token=%zz", "token=a%00b", "token=%%",
                         "token=+++", "&&&&",      "token=%0a",   "tok%65n=abc"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++)
        if (form(bad[i], out, sizeof out))
            fail_msg("accepted \"%s\" as \"%s\"", bad[i], out);
    /* Longer than the buffer: refused, nothing written past it. */
    char body[700] = "token=";
    memset(body + 6, 'a', 600);
    char small[17];
    memset(small, 'Z', sizeof small);
    assert_false(px__ui_form_token(body, strlen(body), small, sizeof small - 1));
    assert_int_equal(small[16], 'Z');
    assert_false(px__ui_form_token("token=abc", 9, out, 0));
    /* The length counts, not a NUL: a body is not a C string. */
    assert_true(px__ui_form_token("token=abcdef", 9, out, sizeof out));
    assert_string_equal(out, "abc");
}

static void test_cookie_token_round_trips_and_refuses_the_rest(void **state)
{
    (void)state;
    char out[PX__UI_TOKEN_MAX + 1];
    assert_true(px__ui_cookie_token("616263", out, sizeof out));
    assert_string_equal(out, "abc");
    const char *bad[] = {"",       "6",      "61626", "zz", "6g",     "20",
                         "0a6162", "616200", "7f",    "ff", "6162 3", "ABCD"};
    for (size_t i = 0; i < PX_ARRAY_LEN(bad); i++)
        if (px__ui_cookie_token(bad[i], out, sizeof out))
            fail_msg("accepted cookie \"%s\"", bad[i]);
    char hex[2 * PX__UI_TOKEN_MAX + 3];
    for (size_t i = 0; i < PX__UI_TOKEN_MAX; i++)
        memcpy(hex + 2 * i, "61", 2);
    hex[2 * PX__UI_TOKEN_MAX] = '\0';
    assert_true(px__ui_cookie_token(hex, out, sizeof out));
    assert_int_equal(strlen(out), PX__UI_TOKEN_MAX);
    memcpy(hex + 2 * PX__UI_TOKEN_MAX, "61", 3); /* one more: over the limit */
    assert_false(px__ui_cookie_token(hex, out, sizeof out));
    char small[4];
    assert_false(px__ui_cookie_token("61626364", small, sizeof small));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_form_token_is_decoded_and_trimmed),
        cmocka_unit_test(test_form_token_refuses_hostile_bodies),
        cmocka_unit_test(test_cookie_token_round_trips_and_refuses_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
