/*
 * plexus/base.h: the ground every other module stands on.
 *
 * Status codes and error messages, arenas, growable strings, JSON helpers
 * over jansson, quantities with units, provenance, uncertainty and
 * validity, a deterministic random number generator, SHA-256 content ids,
 * logging and a few file and clock helpers.
 *
 * Errors.  Every fallible function returns a px_status (0 is PX_OK, every
 * failure is negative) and takes a `px_err *err` last, which may be NULL.
 * On failure the message names the input, the place in it and the fix:
 *
 *     px_err err;
 *     px_qty q;
 *     if (px_qty_parse("3.35 TB/s", PX_DIM_BANDWIDTH, &q, &err) != PX_OK)
 *         fprintf(stderr, "plexus: %s\n", err.msg);
 *     char text[64];
 *     px_qty_format(q.value, q.dim, text, sizeof text);   // "3.35 TB/s"
 *
 * A caller that drops a returned px_status gets a compiler warning
 * (PX_NODISCARD); one that means to, casts it to void.
 *
 * Lifecycles.  Every px_*_free and px_*_release in every plexus header
 * accepts NULL and then does nothing, as free() does.
 *
 * Unless a function says otherwise it is thread-safe for distinct objects
 * and not for one object shared between threads.
 */
#ifndef PLEXUS_BASE_H
#define PLEXUS_BASE_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PX_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PX_PRINTF(fmt, args)
#endif

/* PX_NODISCARD marks every public function that returns a px_status: a
 * caller that drops the status gets a warning (an error under -Werror).
 * A caller that means to ignore one says so with a cast to void.  GCC's
 * warn_unused_result cannot be silenced by that cast, so the C23
 * attribute is preferred where the compiler has it. */
#if defined(__has_c_attribute)
#if __has_c_attribute(nodiscard)
#define PX_NODISCARD [[nodiscard]]
#endif
#endif
#if !defined(PX_NODISCARD) && defined(__GNUC__)
#define PX_NODISCARD __attribute__((warn_unused_result))
#endif
#ifndef PX_NODISCARD
#define PX_NODISCARD
#endif

#define PX_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PX_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define PX_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* ------------------------------------------------------------------ */
/* Status codes and errors                                             */
/* ------------------------------------------------------------------ */

/* X(name, value, description).  Values only ever get added at the end. */
#define PX_STATUS_LIST(X)                               \
    X(PX_OK, 0, "ok")                                   \
    X(PX_EINVAL, -1, "invalid argument")                \
    X(PX_ENOMEM, -2, "out of memory")                   \
    X(PX_EIO, -3, "input/output error")                 \
    X(PX_EPARSE, -4, "malformed input")                 \
    X(PX_ERANGE, -5, "value out of range")              \
    X(PX_ENOTFOUND, -6, "not found")                    \
    X(PX_EEXIST, -7, "already exists")                  \
    X(PX_ELIMIT, -8, "limit exceeded")                  \
    X(PX_EUNSUPPORTED, -9, "not supported")             \
    X(PX_EINFEASIBLE, -10, "infeasible")                \
    X(PX_ETIMEOUT, -11, "timed out")                    \
    X(PX_ECONTRACT, -12, "numerical contract violated") \
    X(PX_EAUTH, -13, "not authorized")                  \
    X(PX_ESTATE, -14, "invalid state")                  \
    X(PX_EPEER, -15, "peer failed")                     \
    X(PX_EINTERNAL, -16, "internal error")              \
    X(PX_EVALIDATE, -17, "validation failed")           \
    X(PX_EDIVERGED, -18, "replay diverged")

typedef enum px_status {
#define PX__STATUS_ENUM(name, value, text) name = value,
    PX_STATUS_LIST(PX__STATUS_ENUM)
#undef PX__STATUS_ENUM
} px_status;

/* Returns a static description ("malformed input"); never NULL. */
const char *px_status_str(px_status code);
/* Returns the symbolic name ("PX_EPARSE"); never NULL. */
const char *px_status_name(px_status code);

#define PX_ERR_MSG_MAX 1024 /* bytes of a px_err message, with its NUL */

typedef struct px_err {
    px_status code;
    char msg[PX_ERR_MSG_MAX];
} px_err;

/* Records `code` and a printf-style message in err (which may be NULL) and
 * returns code, so that `return px_err_set(err, PX_EPARSE, "...")` reads
 * naturally.  The message is always well-formed UTF-8: bytes that are not
 * become '?', and a message longer than the buffer is cut at a character
 * boundary and ends in "...". */
px_status px_err_set(px_err *err, px_status code, const char *fmt, ...) PX_PRINTF(3, 4);
px_status px_err_setv(px_err *err, px_status code, const char *fmt, va_list ap);
/* Prepends context ("inventory.json: ") to err's message and returns code
 * (the status the failed call returned).  err may be NULL. */
px_status px_err_prefix(px_err *err, px_status code, const char *fmt, ...) PX_PRINTF(3, 4);
/* Sets err to PX_OK with an empty message.  err may be NULL. */
void px_err_clear(px_err *err);

/* Always-on assertion for programmer errors.  Bad input never reaches one. */
#define PX_ASSERT(cond)                                 \
    do {                                                \
        if (!(cond))                                    \
            px__assert_fail(#cond, __FILE__, __LINE__); \
    } while (0)
_Noreturn void px__assert_fail(const char *expr, const char *file, int line);

/* ------------------------------------------------------------------ */
/* Diagnostics: every problem of an input, not only the first          */
/* ------------------------------------------------------------------ */

typedef enum px_severity {
    PX_SEV_ERROR = 0,
    PX_SEV_WARNING = 1,
    PX_SEV_NOTE = 2,
} px_severity;

typedef struct px_diag {
    px_severity severity;
    char *pointer; /* RFC 6901 JSON pointer into the input, "" for the root */
    char *message; /* what is wrong */
    char *fix;     /* how to fix it; may be NULL */
} px_diag;

/* A list of diagnostics.  Value struct: px_diags_init / px_diags_release.
 * At most `max` entries are kept (default 1000); n_dropped counts the rest,
 * so hostile inputs cannot make a report grow without bound. */
typedef struct px_diags {
    px_diag *items;
    size_t n, cap, max;
    size_t n_errors, n_warnings, n_dropped;
} px_diags;

void px_diags_init(px_diags *d);
void px_diags_release(px_diags *d); /* NULL is a no-op */
/* Adds a diagnostic; fix may be NULL.  Returns PX_ENOMEM on allocation
 * failure (the diagnostic is then counted as dropped). */
px_status px_diags_add(px_diags *d, px_severity sev, const char *pointer, const char *fix,
                       const char *fmt, ...) PX_PRINTF(5, 6);
/* Writes "file: /pointer: message (fix: ...)" lines to a string.
 * Returns owned memory (free()) or NULL on allocation failure. */
char *px_diags_format(const px_diags *d, const char *input_name);
/* Returns a JSON array [{"severity","pointer","message","fix"}] (new ref). */
json_t *px_diags_to_json(const px_diags *d);

/* ------------------------------------------------------------------ */
/* Arenas                                                              */
/* ------------------------------------------------------------------ */

/* A bump allocator: many allocations, one free.  Used for parsing, graph
 * building and search.  Not thread-safe. */
typedef struct px_arena px_arena;

/* Creates an arena whose blocks are at least block_size bytes (0 picks a
 * default of 64 KiB).  Returns owned memory (px_arena_free). */
PX_NODISCARD px_status px_arena_new(size_t block_size, px_arena **out, px_err *err);
/* Frees the arena and everything allocated from it.  NULL is a no-op. */
void px_arena_free(px_arena *a);
/* Returns size bytes aligned to 16, or NULL when memory runs out or the
 * arena's limit would be passed. */
void *px_arena_alloc(px_arena *a, size_t size);
/* Like px_arena_alloc, zero-filled; count*size overflow returns NULL. */
void *px_arena_calloc(px_arena *a, size_t count, size_t size);
char *px_arena_strdup(px_arena *a, const char *s);
char *px_arena_strndup(px_arena *a, const char *s, size_t n);
char *px_arena_printf(px_arena *a, const char *fmt, ...) PX_PRINTF(2, 3);
/* Bytes handed out so far, and bytes reserved from the system. */
size_t px_arena_used(const px_arena *a);
size_t px_arena_reserved(const px_arena *a);
/* Caps what the arena may reserve (0: no cap).  Allocation past it fails. */
void px_arena_set_limit(px_arena *a, size_t max_reserved);
/* Forgets every allocation but keeps the first block for reuse. */
void px_arena_reset(px_arena *a);

/* ------------------------------------------------------------------ */
/* Growable strings (after git's strbuf)                               */
/* ------------------------------------------------------------------ */

/* buf is always NUL-terminated, also when empty (it then points at a
 * static empty string and cap is 0).  Value struct: init / release. */
typedef struct px_strbuf {
    char *buf;
    size_t len, cap;
} px_strbuf;

extern char px__strbuf_empty[];
#define PX_STRBUF_INIT         \
    {                          \
        px__strbuf_empty, 0, 0 \
    }

void px_strbuf_init(px_strbuf *sb);
void px_strbuf_release(px_strbuf *sb); /* NULL is a no-op */
void px_strbuf_reset(px_strbuf *sb);   /* length 0, keeps memory */
PX_NODISCARD px_status px_strbuf_grow(px_strbuf *sb, size_t extra);
/* The appenders return PX_ENOMEM when the buffer cannot grow (the text is
 * then left as it was).  They are not PX_NODISCARD: a report is written
 * by hundreds of appends in a row, and its writer checks once, through
 * px_strbuf_grow or its own status (docs/adr/0014-code-health.md). */
px_status px_strbuf_add(px_strbuf *sb, const void *data, size_t len);
px_status px_strbuf_adds(px_strbuf *sb, const char *s);
px_status px_strbuf_addch(px_strbuf *sb, char c);
px_status px_strbuf_addf(px_strbuf *sb, const char *fmt, ...) PX_PRINTF(2, 3);
px_status px_strbuf_vaddf(px_strbuf *sb, const char *fmt, va_list ap);
/* Appends s with JSON pointer escaping (~ -> ~0, / -> ~1). */
px_status px_strbuf_add_pointer_token(px_strbuf *sb, const char *s);
/* Hands the buffer to the caller (free()) and resets sb. */
char *px_strbuf_detach(px_strbuf *sb, size_t *len);

/* ------------------------------------------------------------------ */
/* UTF-8 of generated text                                             */
/* ------------------------------------------------------------------ */

/* Length of the well-formed UTF-8 sequence at s (n bytes available), or 0
 * when the bytes there are not one (invalid, overlong, surrogate, or cut
 * short). */
size_t px_utf8_seq_len(const unsigned char *s, size_t n);
/* Number of bytes at the end of s that start a well-formed sequence but
 * are cut short (0 to 3): text held back until the next token completes
 * the character. */
size_t px_utf8_incomplete_tail(const char *s, size_t n);
/* Whether the bytes at s[0..n) split no character at n: s[n] (when n < len)
 * is not a continuation byte. */
bool px_utf8_boundary(const char *s, size_t len, size_t n);
/* Appends s with each ill-formed sequence replaced by U+FFFD, so that the
 * result is valid UTF-8 (what JSON strings need). */
px_status px_utf8_add_sanitized(px_strbuf *out, const char *s, size_t n);

/* malloc'd copies; return NULL on allocation failure. */
char *px_strdup(const char *s);
char *px_strndup(const char *s, size_t n);
char *px_asprintf(const char *fmt, ...) PX_PRINTF(1, 2);
bool px_str_starts_with(const char *s, const char *prefix);
bool px_str_ends_with(const char *s, const char *suffix);
/* Copies at most n-1 bytes and terminates; returns strlen(src). */
size_t px_strlcpy(char *dst, const char *src, size_t n);
/* snprintf into buf for text that people read: the result is well-formed
 * UTF-8 (other bytes become '?') and, when it does not fit, is cut at a
 * character boundary and ends in "...".  cap may be 0. */
void px_textf(char *buf, size_t cap, const char *fmt, ...) PX_PRINTF(3, 4);
void px_textfv(char *buf, size_t cap, const char *fmt, va_list ap);

/* ------------------------------------------------------------------ */
/* Files and clocks                                                    */
/* ------------------------------------------------------------------ */

/* Reads a whole file of at most max_bytes into malloc'd memory (NUL
 * appended, not counted in *len).  Larger files fail with PX_ELIMIT. */
PX_NODISCARD px_status px_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                                    px_err *err);
/* Writes data to path atomically (temporary file, fsync, rename). */
PX_NODISCARD px_status px_write_file(const char *path, const void *data, size_t len, px_err *err);
/* Monotonic clock in nanoseconds. */
uint64_t px_now_ns(void);
/* Wall clock, Unix seconds. */
int64_t px_wall_time(void);
/* Formats Unix seconds as RFC 3339 UTC ("2026-11-29T16:25:10Z"). */
void px_time_format(int64_t unix_seconds, char out[32]);
/* Parses RFC 3339 UTC with a 'Z' suffix. */
PX_NODISCARD px_status px_time_parse(const char *text, int64_t *out, px_err *err);

/* ------------------------------------------------------------------ */
/* JSON helpers over jansson                                           */
/* ------------------------------------------------------------------ */

/* Bounds applied to untrusted JSON.  Zero fields take the defaults. */
typedef struct px_json_limits {
    size_t max_bytes;    /* whole document; default 64 MiB */
    size_t max_depth;    /* nesting; default 64 */
    size_t max_string;   /* one string; default 64 KiB */
    size_t max_elements; /* one array or object; default 1,000,000 */
} px_json_limits;

/* Parses a document and checks it against the limits.  name is used in
 * messages ("inventory.json:3:14: ...").  Returns a new reference. */
PX_NODISCARD px_status px_json_parse(const char *text, size_t len, const char *name,
                                     const px_json_limits *lim, json_t **out, px_err *err);
PX_NODISCARD px_status px_json_load_file(const char *path, const px_json_limits *lim, json_t **out,
                                         px_err *err);
/* Serializes with sorted keys and two-space indentation, the canonical
 * form used for content ids and exports.  Returns owned memory (free()). */
char *px_json_dump_canonical(const json_t *v);
/* Compact, sorted keys, one line (JSON Lines). */
char *px_json_dump_line(const json_t *v);
/* SHA-256 of the canonical form, as 64 lowercase hex digits.  PX_ENOMEM
 * (out untouched) when the form cannot be written: a digest of less than
 * the whole document is never returned. */
PX_NODISCARD px_status px_json_digest_hex(const json_t *v, char out[65]);
/* Returns a human name for a JSON type ("string", "array", ...). */
const char *px_json_type_name(const json_t *v);
/* Sets or appends a value, stealing the reference (jansson's _new calls);
 * return PX_ENOMEM when v is NULL or the call fails.  Builders, like the
 * strbuf appenders: not PX_NODISCARD (docs/adr/0014-code-health.md). */
px_status px_json_set(json_t *obj, const char *key, json_t *v);
px_status px_json_push(json_t *arr, json_t *v);
/* A JSON string of the n bytes at s, each ill-formed UTF-8 sequence
 * replaced by U+FFFD (a model's text may hold any bytes); NULL when
 * memory runs out. */
json_t *px_json_text(const char *s, size_t n);

/* ------------------------------------------------------------------ */
/* Quantities                                                          */
/* ------------------------------------------------------------------ */

/* Dimensions and the SI unit each value is stored in. */
typedef enum px_dim {
    PX_DIM_NONE = 0,    /* a plain number */
    PX_DIM_BYTES,       /* B */
    PX_DIM_BANDWIDTH,   /* B/s */
    PX_DIM_FLOPS,       /* FLOP/s */
    PX_DIM_TIME,        /* s */
    PX_DIM_POWER,       /* W */
    PX_DIM_ENERGY,      /* J */
    PX_DIM_TEMPERATURE, /* K */
    PX_DIM_MONEY_RATE,  /* $/h */
    PX_DIM_FREQUENCY,   /* Hz */
    PX_DIM_COUNT_
} px_dim;

/* Returns "bytes", "bandwidth", ... */
const char *px_dim_name(px_dim dim);
/* Returns the SI unit text ("B/s"). */
const char *px_dim_unit(px_dim dim);

typedef enum px_prov_kind {
    PX_PROV_UNSPECIFIED = 0,
    PX_PROV_DATASHEET,
    PX_PROV_DISCOVERED,
    PX_PROV_MEASURED,
    PX_PROV_CALIBRATED,
    PX_PROV_ASSUMED,
    PX_PROV_COUNT_
} px_prov_kind;

const char *px_prov_kind_name(px_prov_kind kind);
PX_NODISCARD px_status px_prov_kind_parse(const char *text, px_prov_kind *out);

/* Where a number came from.  source is a citation ("NVIDIA H100 Tensor
 * Core GPU datasheet") or the command that produced it; it is borrowed
 * (usually from an arena).  at is Unix seconds, 0 when unknown. */
typedef struct px_provenance {
    px_prov_kind kind;
    const char *source;
    int64_t at;
} px_provenance;

typedef enum px_unc_kind {
    PX_UNC_NONE = 0,
    PX_UNC_RELATIVE, /* value +- rel * value */
    PX_UNC_INTERVAL, /* [lo, hi] in the value's SI unit */
} px_unc_kind;

typedef struct px_uncertainty {
    px_unc_kind kind;
    double rel;
    double lo, hi;
} px_uncertainty;

/* The conditions under which a number holds, as a range of one parameter,
 * e.g. bandwidth valid for transfer sizes of at least 1 MiB:
 * {param = "transfer_size", dim = PX_DIM_BYTES, min = 1048576, max = NAN}. */
typedef struct px_validity {
    const char *param; /* NULL: no validity range */
    px_dim dim;
    double min, max; /* NAN: unbounded on that side */
} px_validity;

typedef struct px_qty {
    double value; /* in the dimension's SI unit */
    px_dim dim;
    px_provenance prov;
    px_uncertainty unc;
    px_validity valid;
} px_qty;

/* A quantity of `value` in dim, with no provenance or uncertainty. */
px_qty px_qty_make(double value, px_dim dim);
/* Parses "3.35 TB/s", "80GiB", "1.5 ms", "25 C", "2.1 $/h".  When expect
 * is not PX_DIM_NONE the unit must be of that dimension.  A plain number
 * is accepted only for PX_DIM_NONE.  Rejects NaN, infinities, empty and
 * over-long text, unknown units (the message lists the known ones). */
PX_NODISCARD px_status px_qty_parse(const char *text, px_dim expect, px_qty *out, px_err *err);
/* Reads a quantity in JSON form: a string ("3.35 TB/s") or an object
 * {"value": "3.35 TB/s", "provenance": "datasheet", "source": "...",
 *  "at": "2026-01-01T00:00:00Z", "uncertainty": 0.05 | ["3 TB/s","3.4 TB/s"],
 *  "valid": {"param": "transfer_size", "min": "1 MiB", "max": "1 GiB"}}.
 * Strings are copied into arena.  `where` names the place for messages
 * ("inventory.json: /nodes/0/devices/1/memory/0/bandwidth"). */
PX_NODISCARD px_status px_qty_from_json(const json_t *v, px_dim expect, px_arena *arena,
                                        const char *where, px_qty *out, px_err *err);
/* Returns the JSON form: a bare string when the quantity has nothing but a
 * value, else the object form.  New reference; NULL on allocation failure. */
json_t *px_qty_to_json(const px_qty *q);
/* Prints value in dim with the largest unit that keeps the number >= 1 and
 * the fewest digits that parse back to the same double ("3.35 TB/s").
 * Returns the length it needed (like snprintf). */
size_t px_qty_format(double value, px_dim dim, char *buf, size_t n);
/* Prints a duration for people, three significant digits in s, ms or us
 * ("2.21 ms"); "-" for NaN (unknown), "inf" for infinity.  Reports use it;
 * px_qty_format is the exact form. */
void px_format_seconds(double s, char *buf, size_t n);
/* The interval the uncertainty implies: [value, value] when there is none. */
double px_qty_lo(const px_qty *q);
double px_qty_hi(const px_qty *q);
/* Whether x (in the validity's dimension) is inside the validity range;
 * true when the quantity has none. */
bool px_qty_valid_at(const px_qty *q, double x);

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

/* The p-quantile (p in (0.5, 1); 0 for p <= 0.5) of Student's t with df
 * degrees of freedom (df > 0, need not be whole; INFINITY otherwise),
 * from the regularized incomplete beta function, within 1e-9.  A 95%
 * two-sided interval uses p = 0.975.  Pure: thread-safe. */
double px_stat_t_quantile(double p, double df);

/* ------------------------------------------------------------------ */
/* Deterministic random numbers                                        */
/* ------------------------------------------------------------------ */

/* xoshiro256** seeded through splitmix64: the same integer stream on every
 * machine for the same seed. */
typedef struct px_rng {
    uint64_t s[4];
} px_rng;

void px_rng_seed(px_rng *r, uint64_t seed);
/* A generator for a named sub-stream, independent of the parent's use. */
px_rng px_rng_derive(uint64_t seed, uint64_t stream);
uint64_t px_rng_next(px_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double px_rng_uniform(px_rng *r);
/* Uniform integer in [0, n); n > 0; unbiased. */
uint64_t px_rng_below(px_rng *r, uint64_t n);
/* Standard normal (Box-Muller, one value per call). */
double px_rng_normal(px_rng *r);
/* Exponential with the given rate. */
double px_rng_exponential(px_rng *r, double rate);

/* ------------------------------------------------------------------ */
/* Hashing and content ids                                             */
/* ------------------------------------------------------------------ */

typedef struct px_digest {
    uint8_t bytes[32];
} px_digest;

typedef struct px_sha256_ctx px_sha256_ctx; /* incremental hasher, opaque */

PX_NODISCARD px_status px_sha256_new(px_sha256_ctx **out, px_err *err);
void px_sha256_update(px_sha256_ctx *h, const void *data, size_t len);
void px_sha256_final(px_sha256_ctx *h, px_digest *out); /* frees h */
void px_sha256(const void *data, size_t len, px_digest *out);
PX_NODISCARD px_status px_sha256_file(const char *path, px_digest *out, px_err *err);
/* 64 lowercase hex digits and a NUL. */
void px_digest_hex(const px_digest *d, char out[65]);
PX_NODISCARD px_status px_digest_parse(const char *hex, px_digest *out);
/* 64-bit FNV-1a, for hash tables (not for content ids). */
uint64_t px_hash64(const void *data, size_t len);

/* ------------------------------------------------------------------ */
/* Logging                                                             */
/* ------------------------------------------------------------------ */

typedef enum px_log_level {
    PX_LOG_ERROR = 0,
    PX_LOG_WARN,
    PX_LOG_INFO,
    PX_LOG_DEBUG,
} px_log_level;

/* Messages at or below the level are written to stderr (or the sink).
 * The default is PX_LOG_WARN, or PLEXUS_LOG=error|warn|info|debug. */
void px_log_set_level(px_log_level level);
px_log_level px_log_get_level(void);
typedef void (*px_log_sink)(px_log_level level, const char *msg, void *ud);
void px_log_set_sink(px_log_sink sink, void *ud);
void px_log(px_log_level level, const char *fmt, ...) PX_PRINTF(2, 3);

#define px_log_error(...) px_log(PX_LOG_ERROR, __VA_ARGS__)
#define px_log_warn(...)  px_log(PX_LOG_WARN, __VA_ARGS__)
#define px_log_info(...)  px_log(PX_LOG_INFO, __VA_ARGS__)
#define px_log_debug(...) px_log(PX_LOG_DEBUG, __VA_ARGS__)

/* The library's version ("0.1.0"). */
const char *px_version(void);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_BASE_H */
