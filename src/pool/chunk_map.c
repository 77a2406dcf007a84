/* Address -> pool chunk, for every 32 MiB of the 48-bit user address space:
 * two levels, leaves made on first use and never freed, so readers need no
 * lock. Part of the process-wide instance's state. */
#include <stdlib.h>

#include "pool_internal.h"

#define LEAF_BITS 12
#define TOP_BITS (48 - 25 - LEAF_BITS)

typedef struct leaf {
    _Atomic(pm__chunk *) slot[1u << LEAF_BITS];
} leaf;

static _Atomic(leaf *) top[1u << TOP_BITS];

static leaf *leaf_for(size_t index, bool create)
{
    leaf *l = atomic_load_explicit(&top[index >> LEAF_BITS], memory_order_acquire);
    if (l || !create)
        return l;
    leaf *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    leaf *expected = NULL;
    if (!atomic_compare_exchange_strong(&top[index >> LEAF_BITS], &expected, fresh)) {
        free(fresh);
        return expected;
    }
    return fresh;
}

bool pm__chunk_map_set(uintptr_t base, size_t len, pm__chunk *chunk)
{
    if ((base + len - 1) >> 48)
        return false;
    for (uintptr_t a = base; a < base + len; a += PM__CHUNK_STEP) {
        size_t index = a >> 25;
        leaf *l = leaf_for(index, chunk != NULL);
        if (!l)
            return chunk == NULL;
        atomic_store_explicit(&l->slot[index & ((1u << LEAF_BITS) - 1)], chunk,
                              memory_order_release);
    }
    return true;
}

pm__chunk *pm__chunk_map_get(uintptr_t addr)
{
    if (addr >> 48)
        return NULL;
    size_t index = addr >> 25;
    leaf *l = leaf_for(index, false);
    return l ? atomic_load_explicit(&l->slot[index & ((1u << LEAF_BITS) - 1)],
                                    memory_order_acquire)
             : NULL;
}
