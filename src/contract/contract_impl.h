/*
 * Private declarations shared by the files of the contract module.
 */
#ifndef PX_CONTRACT_IMPL_H
#define PX_CONTRACT_IMPL_H

#include "base/common.h"
#include "plexus/contract.h"

/* Defaults of the contract-wide settings. */
#define PX__CONTRACT_DEFAULT_REFERENCE  "scalar-reference"
#define PX__CONTRACT_DEFAULT_PROMPT_SET "default"
#define PX__CONTRACT_DEFAULT_PROMPTS    16
#define PX__CONTRACT_DEFAULT_TOKENS     2048
#define PX__CONTRACT_MAX_PROMPTS        1000000
#define PX__CONTRACT_MAX_TOKENS         1000000000

/* Formats into a fixed buffer, cutting long text.  Messages are meant to be
 * cut when an input is absurdly long, so this is not an error (and, unlike
 * snprintf, does not draw truncation warnings). */
static inline void px__fmt(char *buf, size_t n, const char *fmt, ...) PX_PRINTF(3, 4);
static inline void px__fmt(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

/* ---- Region patterns (pattern.c) ---------------------------------- */

typedef enum px__seg_kind {
    PX__SEG_LITERAL = 0,
    PX__SEG_STAR,  /* "*": any one segment */
    PX__SEG_RANGE, /* "lo-hi": a decimal integer in [lo, hi] */
} px__seg_kind;

typedef struct px__segment {
    px__seg_kind kind;
    const char *text; /* LITERAL: the segment (not NUL-terminated) */
    size_t len;
    uint32_t lo, hi; /* RANGE */
} px__segment;

/* A region pattern split at dots.  Specificity: fewer stars first, then
 * fewer ranges; equal (n_star, n_range) is a tie. */
typedef struct px__pattern {
    px__segment seg[PX_CONTRACT_MAX_SEGMENTS];
    size_t n_seg;
    unsigned n_star, n_range;
} px__pattern;

/* Parses a pattern (or, with allow_wild false, a plain region name).  On
 * failure returns PX_EINVAL and writes the reason and a fix (static
 * strings or text in why[]) for the caller's diagnostic.  The segments
 * borrow from text, which must outlive the pattern. */
px_status px__pattern_parse(const char *text, bool allow_wild, px__pattern *out, char *why,
                            size_t why_len);
/* Whether the region name (already split with px__pattern_parse, no
 * wildcards) matches the pattern. */
bool px__pattern_matches(const px__pattern *p, const px__pattern *name);
/* Whether some region name matches both patterns; if so writes one such
 * name to witness. */
bool px__pattern_intersect(const px__pattern *a, const px__pattern *b, char *witness,
                           size_t witness_len);
/* Compares specificity: < 0 when a is more specific, 0 on a tie. */
int px__pattern_cmp_specificity(const px__pattern *a, const px__pattern *b);
/* Whether s is a canonical decimal integer of at most 10 digits (no sign,
 * no leading zero unless "0"); stores its value. */
bool px__parse_index(const char *s, size_t len, uint64_t *out);

/* ---- The contract ------------------------------------------------- */

typedef struct px__region {
    const char *key; /* the pattern as written (canonical: sorted by key) */
    px__pattern pattern;
    px_contract_clause clause;
} px__region;

struct px_contract {
    px_arena *arena; /* everything below lives in it */
    const char *name;
    const char *description;
    const char *reference;
    const char *prompt_set;
    uint64_t prompts, tokens;
    px_contract_clause default_clause;
    px__region *regions; /* sorted by key */
    size_t n_regions;
    /* Indices of the entries with a wildcard.  An exact entry is found by
     * binary search on the sorted keys and always wins, so only these
     * need the pattern-by-pattern scan. */
    size_t *wild;
    size_t n_wild;
};

/* Finds the entry for a region name (text, and its parse): the most
 * specific match, NULL for the default.  *tie is set when two entries tie
 * (never for a validated contract). */
const px__region *px__contract_match(const px_contract *c, const char *text,
                                     const px__pattern *name, bool *tie);

/* ---- Transformations (transform.c) -------------------------------- */

/* Canonical spelling of a dtype ("fp8" -> "fp8_e4m3"), or NULL when
 * unknown. */
const char *px__dtype_canonical(const char *dtype);

#endif
