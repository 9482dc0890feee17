/* A bump allocator over a list of blocks. */
#include "base/common.h"

#define ARENA_ALIGN         16
#define ARENA_DEFAULT_BLOCK (64 * 1024)

typedef struct arena_block {
    struct arena_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} arena_block;

struct px_arena {
    arena_block *head;
    size_t block_size;
    size_t used;
    size_t reserved;
    size_t limit;
};

px_status px_arena_new(size_t block_size, px_arena **out, px_err *err)
{
    px_arena *a = calloc(1, sizeof *a);
    if (!a)
        return px_err_set(err, PX_ENOMEM, "out of memory creating an arena");
    a->block_size = block_size ? block_size : ARENA_DEFAULT_BLOCK;
    *out = a;
    return PX_OK;
}

void px_arena_free(px_arena *a)
{
    if (!a)
        return;
    arena_block *b = a->head;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(a);
}

void *px_arena_alloc(px_arena *a, size_t size)
{
    size_t need;
    if (!px__add_size(size, ARENA_ALIGN - 1, &need))
        return NULL;
    need &= ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0)
        need = ARENA_ALIGN;
    arena_block *b = a->head;
    if (!b || b->size - b->used < need) {
        size_t bsize = a->block_size;
        if (need > bsize)
            bsize = need;
        size_t total;
        if (!px__add_size(sizeof(arena_block), bsize, &total))
            return NULL;
        if (a->limit && a->reserved + total > a->limit)
            return NULL;
        arena_block *nb = malloc(total);
        if (!nb)
            return NULL;
        nb->size = bsize;
        nb->used = 0;
        /* A large one-off allocation goes behind the current block so the
         * current block's free space is not wasted. */
        if (b && need > a->block_size) {
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        a->reserved += total;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += need;
    a->used += need;
    return p;
}

void *px_arena_calloc(px_arena *a, size_t count, size_t size)
{
    size_t total;
    if (!px__mul_size(count, size, &total))
        return NULL;
    void *p = px_arena_alloc(a, total);
    if (p)
        memset(p, 0, total);
    return p;
}

char *px_arena_strndup(px_arena *a, const char *s, size_t n)
{
    char *p = px_arena_alloc(a, n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *px_arena_strdup(px_arena *a, const char *s)
{
    return s ? px_arena_strndup(a, s, strlen(s)) : NULL;
}

char *px_arena_printf(px_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return NULL;
    }
    char *p = px_arena_alloc(a, (size_t)n + 1);
    if (p)
        vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

size_t px_arena_used(const px_arena *a)
{
    return a->used;
}

size_t px_arena_reserved(const px_arena *a)
{
    return a->reserved;
}

void px_arena_set_limit(px_arena *a, size_t max_reserved)
{
    a->limit = max_reserved;
}

void px_arena_reset(px_arena *a)
{
    arena_block *b = a->head;
    if (!b)
        return;
    /* Keep the last block in the list (the oldest, default-sized one). */
    arena_block *keep = b;
    while (keep->next)
        keep = keep->next;
    while (b != keep) {
        arena_block *next = b->next;
        a->reserved -= sizeof(arena_block) + b->size;
        free(b);
        b = next;
    }
    keep->used = 0;
    a->head = keep;
    a->used = 0;
}
