/*
 * A small writer of canonical JSON text, for exports too large to build as
 * a jansson tree first.  It prints exactly what px_json_dump_canonical
 * prints for the same document (sorted keys, two-space indentation,
 * jansson's escapes and number format); the caller writes each object's
 * members in sorted order, which the writer checks.
 */
#ifndef PX_HW_JSON_WRITER_H
#define PX_HW_JSON_WRITER_H

#include "hw/hw_impl.h"

#define PX__JW_MAX_DEPTH 16

typedef struct px__jw_memo px__jw_memo;

typedef struct px__jw {
    px_strbuf *out;
    int depth;
    bool first[PX__JW_MAX_DEPTH + 1]; /* nothing written yet at this depth */
    const char *last_key[PX__JW_MAX_DEPTH + 1];
    px__jw_memo *memo; /* formatted numbers, reused (may be NULL) */
    bool oom;
} px__jw;

/* Starts writing into out at the given depth (0 for a document). */
void px__jw_init(px__jw *w, px_strbuf *out, int depth);
/* Frees the writer's number cache. */
void px__jw_release(px__jw *w);

void px__jw_begin_object(px__jw *w);
void px__jw_begin_array(px__jw *w);
void px__jw_end_object(px__jw *w);
void px__jw_end_array(px__jw *w);
/* Starts a member: keys of one object must come in strcmp order. */
void px__jw_key(px__jw *w, const char *key);
/* Starts an array element. */
void px__jw_item(px__jw *w);

void px__jw_string(px__jw *w, const char *s);
void px__jw_bool(px__jw *w, bool b);
/* A real as jansson prints it with 17 digits of precision. */
void px__jw_real(px__jw *w, double v);
/* A quantity as px_qty_to_json would give it. */
void px__jw_qty(px__jw *w, const px_qty *q);

/* Convenience: key + value, skipped when the value is absent (NULL
 * string, absent quantity). */
void px__jw_kstr(px__jw *w, const char *key, const char *s);
void px__jw_kqty(px__jw *w, const char *key, const px_qty *q);

#endif
