/* Measuring and fitting SVG text (see svg.h). */
#include "base/common.h"

#include "base/svg.h"

/* Advance widths of DejaVu Sans Book for ' '..'~', in units of 1/2048 em
 * (its hmtx table). */
static const uint16_t dejavu_sans[95] = {
    651,  821,  942,  1716, 1303, 1946, 1597, 563,  799,  799,  1024, 1716, 651,  739,  651,  690,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690,  690,  1716, 1716, 1716, 1087,
    2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604,  604,  1343, 1141, 1767, 1532, 1612,
    1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799,  690,  799,  1716, 1024,
    1024, 1255, 1300, 1126, 1300, 1260, 721,  1300, 1298, 569,  569,  1186, 569,  1995, 1298, 1253,
    1300, 1300, 842,  1067, 803,  1298, 1212, 1675, 1212, 1212, 1075, 1303, 690,  1303, 1716};

/* One character's advance: a whole em for anything outside ASCII (wider
 * than most), nothing for the continuation bytes of UTF-8. */
static unsigned advance(unsigned char c)
{
    if (c >= 0x20 && c < 0x7f)
        return dejavu_sans[c - 0x20];
    if (c >= 0x80 && c < 0xc0)
        return 0;
    return 2048;
}

double px_svg_text_width(const char *s, double px)
{
    unsigned long units = 0;
    for (; s && *s; s++)
        units += advance((unsigned char)*s);
    /* 3% more, for hinting and renderers that round each glyph up. */
    return (double)units / 2048.0 * px * 1.03;
}

void px_svg_escape(px_strbuf *sb, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&':
            px_strbuf_adds(sb, "&amp;");
            break;
        case '<':
            px_strbuf_adds(sb, "&lt;");
            break;
        case '>':
            px_strbuf_adds(sb, "&gt;");
            break;
        case '"':
            px_strbuf_adds(sb, "&quot;");
            break;
        case '\'':
            px_strbuf_adds(sb, "&apos;");
            break;
        default:
            /* Control characters are not allowed in XML 1.0 text. */
            px_strbuf_addch(sb, (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s);
        }
    }
}

bool px_svg_fit(const char *s, double px, double max_w, char *out, size_t n)
{
    if (!n)
        return false;
    if (!s)
        s = "";
    size_t len = strlen(s);
    if (px_svg_text_width(s, px) <= max_w && len < n) {
        memcpy(out, s, len + 1);
        return false;
    }
    /* Keep the longest prefix that fits with the dots, cut where a
     * character starts. */
    double dots = px_svg_text_width("...", px), w = 0;
    size_t keep = 0;
    for (size_t i = 0; i < len && i + 4 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80 || c >= 0xc0) {
            if (w + dots > max_w)
                break;
            keep = i;
        }
        w += (double)advance(c) / 2048.0 * px * 1.03;
    }
    /* The last character fits when the whole prefix up to len does. */
    if (w + dots <= max_w && len + 4 <= n)
        keep = len;
    memcpy(out, s, keep);
    memcpy(out + keep, "...", 4);
    return true;
}

void px_svg_add_text(px_strbuf *sb, int x, int y, int size, int base_size, const char *in,
                     double max_w, const char *s)
{
    char buf[600];
    px_svg_fit(s, size, max_w, buf, sizeof buf);
    px_strbuf_addf(sb, "<text x=\"%d\" y=\"%d\"", x, y);
    if (size != base_size)
        px_strbuf_addf(sb, " font-size=\"%d\"", size);
    px_strbuf_adds(sb, " data-in=\"");
    px_svg_escape(sb, in);
    px_strbuf_adds(sb, "\">");
    px_svg_escape(sb, buf);
    px_strbuf_adds(sb, "</text>\n");
}
