/*
 * The one seam every allocation of the library passes through.
 * src/base/common.h includes this header, so malloc, calloc, realloc,
 * strdup and strndup in every plexus source file call the px__ versions
 * below; memory from them is released with free() as usual.
 *
 * Tests fail the Nth allocation on purpose (SQLite's way of reaching its
 * out-of-memory paths): px__alloc_fault_set(n, persistent) arms the
 * fault, every later allocation counts, the Nth returns NULL (and every
 * one after it too when persistent).  While armed, jansson's allocations
 * go through the seam as well, so the JSON parsers are covered.  Unarmed
 * the seam costs one relaxed atomic load per allocation.
 */
#ifndef PX_BASE_ALLOC_H
#define PX_BASE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

void *px__malloc(size_t n);
void *px__calloc(size_t count, size_t size);
void *px__realloc(void *p, size_t n);
char *px__strdup(const char *s);
char *px__strndup(const char *s, size_t n);

/* How many allocations through the seam returned NULL on this thread so
 * far (injected or real): a caller compares it before and after a call
 * that cannot tell out of memory from other failures (jansson's lexer
 * reports a failed allocation as a syntax error). */
unsigned long px__alloc_failures(void);

/* Marks the calls into jansson's parser on this thread (px_json_parse).
 * While armed, an allocation jansson makes there that the fault would
 * refuse is counted as failed (px__alloc_failures) but served: jansson
 * 2.14's lexer drops a byte of the token it is saving when an allocation
 * fails and then asserts, or reads past the token, on what is left.  The
 * caller sees the count and reports PX_ENOMEM, as for a refusal. */
void px__alloc_json_parsing(bool on);

/* Arms the fault at the nth allocation from now (1 is the next one); 0
 * disarms it and restores jansson's allocator.  Resets the counters. */
void px__alloc_fault_set(unsigned long nth, bool persistent);
/* How many allocations failed on purpose, and how many were counted, since
 * the last px__alloc_fault_set (counting happens only while armed). */
unsigned long px__alloc_fault_fired(void);
unsigned long px__alloc_fault_seen(void);

/* Tests that only drive the fault define PX_ALLOC_NO_MACROS first. */
#ifndef PX_ALLOC_NO_MACROS
#define malloc(n)     px__malloc(n)
#define calloc(c, n)  px__calloc(c, n)
#define realloc(p, n) px__realloc(p, n)
#define strdup(s)     px__strdup(s)
#define strndup(s, n) px__strndup(s, n)
#endif

#endif
