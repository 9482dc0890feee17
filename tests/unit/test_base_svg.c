/* Measuring, fitting and escaping SVG text (base/svg.h). */
#include "px_test.h"

#include <string.h>

#include "base/svg.h"

static void test_svg_width_follows_the_font(void **state)
{
    (void)state;
    /* DejaVu Sans: 'i' is narrow, 'W' wide; a size scales the width. */
    assert_true(px_svg_text_width("iiii", 12) < px_svg_text_width("WWWW", 12));
    assert_true(px_svg_text_width("abc", 24) > 1.99 * px_svg_text_width("abc", 12));
    assert_true(px_svg_text_width("", 12) == 0);
    /* Outside ASCII: a whole em per character, whatever its length in bytes. */
    double e = px_svg_text_width("\xc3\xa9", 10), cjk = px_svg_text_width("\xe4\xb8\xad", 10);
    assert_true(e > 10 && e < 10.5);
    assert_true(cjk > 10 && cjk < 10.5);
}

static void test_svg_fit_cuts_at_a_character(void **state)
{
    (void)state;
    char out[64];
    assert_false(px_svg_fit("short", 12, 200, out, sizeof out));
    assert_string_equal(out, "short");
    const char *longer = "a-device-model-name-far-too-long-for-its-box";
    assert_true(px_svg_fit(longer, 12, 100, out, sizeof out));
    assert_true(px_svg_text_width(out, 12) <= 100);
    assert_true(strlen(out) > 3 && !strcmp(out + strlen(out) - 3, "..."));
    assert_true(!strncmp(out, longer, strlen(out) - 3));
    /* Multi-byte characters are kept whole. */
    const char *accents = "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9";
    assert_true(px_svg_fit(accents, 12, 40, out, sizeof out));
    size_t kept = strlen(out) - 3;
    assert_int_equal(kept % 2, 0);
    assert_true(px_svg_text_width(out, 12) <= 40);
    /* A buffer smaller than the text: cut to fit it, still ended. */
    char small[8];
    assert_true(px_svg_fit(longer, 12, 1000, small, sizeof small));
    assert_true(strlen(small) < sizeof small);
    assert_true(!strcmp(small + strlen(small) - 3, "..."));
}

static void test_svg_escape_makes_hostile_text_inert(void **state)
{
    (void)state;
    px_strbuf sb = PX_STRBUF_INIT;
    px_svg_escape(&sb, "<script>\"a\" & 'b'\x1b[31m\x7f</script>");
    assert_string_equal(sb.buf, "&lt;script&gt;&quot;a&quot; &amp; &apos;b&apos;?[31m?&lt;/"
                                "script&gt;");
    px_strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svg_width_follows_the_font),
        cmocka_unit_test(test_svg_fit_cuts_at_a_character),
        cmocka_unit_test(test_svg_escape_makes_hostile_text_inert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
