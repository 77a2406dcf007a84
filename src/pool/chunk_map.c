/* Address -> pool chunk, for every 32 MiB of the 48-bit user address space:
 * two levels, leaves made on first use and never freed, so readers need no
 * lock. Part of the process-wide instance's state. */
#include <stdlib.h>

#include "pool_internal.h"

typedef pm__chunk_map_leaf leaf;
#define top pm__chunk_map_top

_Atomic(pm__chunk_map_leaf *) pm__chunk_map_top[1u << PM__CHUNK_MAP_TOP_BITS];
#define LEAF_BITS PM__CHUNK_MAP_LEAF_BITS

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
