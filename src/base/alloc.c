/* The allocation seam and its fault injection (see alloc.h).  The calls
 * to the C library are parenthesized so that alloc.h's macros do not
 * apply to them. */
#include "base/common.h"

#include <stdatomic.h>

static atomic_ulong fault_nth;  /* 0: disarmed */
static atomic_ulong fault_seen; /* allocations counted since armed */
static atomic_ulong fault_fired;
static atomic_bool fault_persistent;
static json_malloc_t saved_json_malloc;
static json_free_t saved_json_free;
/* Allocations that returned NULL on this thread, injected or not. */
static _Thread_local unsigned long failed_here;
/* jansson is parsing on this thread (px__alloc_json_parsing). */
static _Thread_local bool json_parsing;

static bool fail_now(void)
{
    unsigned long nth = atomic_load_explicit(&fault_nth, memory_order_relaxed);
    if (!nth)
        return false;
    unsigned long k = atomic_fetch_add(&fault_seen, 1) + 1;
    if (k == nth || (k > nth && atomic_load(&fault_persistent))) {
        atomic_fetch_add(&fault_fired, 1);
        return true;
    }
    return false;
}

static void *counted(void *p)
{
    failed_here += !p;
    return p;
}

void *px__malloc(size_t n)
{
    return counted(fail_now() ? NULL : (malloc)(n));
}

void *px__calloc(size_t count, size_t size)
{
    return counted(fail_now() ? NULL : (calloc)(count, size));
}

void *px__realloc(void *p, size_t n)
{
    return counted(fail_now() ? NULL : (realloc)(p, n));
}

unsigned long px__alloc_failures(void)
{
    return failed_here;
}

char *px__strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = px__malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

char *px__strdup(const char *s)
{
    return px__strndup(s, SIZE_MAX);
}

void px__alloc_json_parsing(bool on)
{
    json_parsing = on;
}

static void *json_malloc(size_t n)
{
    if (!json_parsing)
        return px__malloc(n);
    /* Counted once, here: refused in name only (alloc.h). */
    if (fail_now())
        failed_here++;
    return counted((malloc)(n));
}

static void json_free(void *p)
{
    free(p);
}

void px__alloc_fault_set(unsigned long nth, bool persistent)
{
    if (nth && !atomic_load(&fault_nth)) {
        json_get_alloc_funcs(&saved_json_malloc, &saved_json_free);
        json_set_alloc_funcs(json_malloc, json_free);
    } else if (!nth && atomic_load(&fault_nth)) {
        json_set_alloc_funcs(saved_json_malloc, saved_json_free);
    }
    atomic_store(&fault_seen, 0);
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_persistent, persistent);
    atomic_store(&fault_nth, nth);
}

unsigned long px__alloc_fault_fired(void)
{
    return atomic_load(&fault_fired);
}

unsigned long px__alloc_fault_seen(void)
{
    return atomic_load(&fault_seen);
}
