/* A string -> index hash map for ids: open addressing with linear probing,
 * sized once, so building it is linear in the number of ids. */
#include "hw/hw_impl.h"

static _Thread_local unsigned long probes;

unsigned long px__hw_index_probes(void)
{
    return probes;
}

px_status px__hw_index_init(px__hw_index *ix, px_arena *arena, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n) {
        if (cap > SIZE_MAX / 4)
            return PX_ENOMEM;
        cap *= 2;
    }
    ix->keys = px_arena_calloc(arena, cap, sizeof *ix->keys);
    ix->values = px_arena_calloc(arena, cap, sizeof *ix->values);
    ix->cap = cap;
    ix->n = 0;
    return ix->keys && ix->values ? PX_OK : PX_ENOMEM;
}

static size_t slot_of(const px__hw_index *ix, const char *key)
{
    /* FNV-1a, then a final avalanche step so that the low bits the mask
     * keeps depend on every byte of the id (ids such as "gpu0".."gpu9"
     * differ only in their last byte). */
    uint64_t h = px_hash64(key, strlen(key));
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h & (ix->cap - 1);
}

bool px__hw_index_put(px__hw_index *ix, const char *key, uint32_t value, uint32_t *existing)
{
    PX_ASSERT(ix->n < ix->cap / 2 + 1);
    size_t i = slot_of(ix, key);
    probes++;
    while (ix->keys[i]) {
        if (!strcmp(ix->keys[i], key)) {
            if (existing)
                *existing = ix->values[i];
            return false;
        }
        i = (i + 1) & (ix->cap - 1);
        probes++;
    }
    ix->keys[i] = key;
    ix->values[i] = value;
    ix->n++;
    return true;
}

bool px__hw_index_get(const px__hw_index *ix, const char *key, uint32_t *value)
{
    if (!ix->cap || !key)
        return false;
    size_t i = slot_of(ix, key);
    probes++;
    while (ix->keys[i]) {
        if (!strcmp(ix->keys[i], key)) {
            if (value)
                *value = ix->values[i];
            return true;
        }
        i = (i + 1) & (ix->cap - 1);
        probes++;
    }
    return false;
}
