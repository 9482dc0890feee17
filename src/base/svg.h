/* Text in hand-written SVG: escaped, measured and fitted to a width, so
 * that pictures keep every label inside its box.  Widths are those of
 * DejaVu Sans (the font the pictures name first); Verdana, the next
 * named, is no wider, and the common fallbacks are narrower. */
#ifndef PX_BASE_SVG_H
#define PX_BASE_SVG_H

#include "plexus/base.h"

/* The font-family attribute value the measurements hold for. */
#define PX_SVG_FONT "DejaVu Sans, Verdana, sans-serif"

/* Width in pixels of s (UTF-8) at font size px, rounded up a little. */
double px_svg_text_width(const char *s, double px);

/* Appends s escaped for XML text or attributes; control characters
 * become '?'. */
void px_svg_escape(px_strbuf *sb, const char *s);

/* Copies s into out (n bytes), cut at a character boundary and ended
 * with "..." when it is wider than max_w at font size px.  Returns
 * true when it was cut. */
bool px_svg_fit(const char *s, double px, double max_w, char *out, size_t n);

/* Appends <text> at (x, y) (the baseline) holding s fitted to max_w,
 * with font-size when size differs from the document's base_size, and
 * data-in naming the id of the box that holds it. */
void px_svg_add_text(px_strbuf *sb, int x, int y, int size, int base_size, const char *in,
                     double max_w, const char *s);

#endif
