#include "handle_set.h"

#include <stdint.h>
#include <stdlib.h>

/* Handles are heap addresses: their low bits carry little, so mix them all. */
static size_t home_of(const void *h, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

/* The slot holding h, or the empty slot where it would go. */
static size_t probe(const pm__handle_set *set, const void *h)
{
    size_t i = home_of(h, set->cap);
    while (set->slots[i] && set->slots[i] != h)
        i = (i + 1) & (set->cap - 1);
    return i;
}

static bool grow(pm__handle_set *set)
{
    size_t cap = set->cap ? 2 * set->cap : 16;
    const void **old = set->slots, **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    size_t old_cap = set->cap;
    set->slots = slots;
    set->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            set->slots[probe(set, old[i])] = old[i];
    free(old);
    return true;
}

bool pm__handle_set_add(pm__handle_set *set, const void *h)
{
    if (!h) /* NULL marks an empty slot */
        return false;
    pthread_mutex_lock(&set->lock);
    /* At most half full, so that probe runs stay short. */
    bool ok = 2 * (set->count + 1) <= set->cap || grow(set);
    if (ok) {
        size_t i = probe(set, h);
        if (!set->slots[i]) {
            set->slots[i] = h;
            set->count++;
        }
    }
    pthread_mutex_unlock(&set->lock);
    return ok;
}

bool pm__handle_set_contains_then(pm__handle_set *set, const void *h, void (*then)(const void *h))
{
    pthread_mutex_lock(&set->lock);
    bool found = h && set->cap && set->slots[probe(set, h)] == h;
    if (found && then)
        then(h);
    pthread_mutex_unlock(&set->lock);
    return found;
}

bool pm__handle_set_contains(pm__handle_set *set, const void *h)
{
    return pm__handle_set_contains_then(set, h, NULL);
}

/* Empties slot i and moves later members of its probe run back, so that
 * every member stays reachable from its home slot without tombstones. */
static void vacate(pm__handle_set *set, size_t i)
{
    size_t mask = set->cap - 1;
    for (size_t j = (i + 1) & mask; set->slots[j]; j = (j + 1) & mask) {
        size_t home = home_of(set->slots[j], set->cap);
        /* j's member may move to i when i lies on its way from home to j. */
        bool i_between = ((j - home) & mask) >= ((j - i) & mask);
        if (i_between) {
            set->slots[i] = set->slots[j];
            i = j;
        }
    }
    set->slots[i] = NULL;
}

bool pm__handle_set_remove(pm__handle_set *set, const void *h)
{
    pthread_mutex_lock(&set->lock);
    size_t i = h && set->cap ? probe(set, h) : 0;
    bool found = h && set->cap && set->slots[i] == h;
    if (found) {
        vacate(set, i);
        set->count--;
        atomic_fetch_add_explicit(&set->generation, 1, memory_order_release);
    }
    pthread_mutex_unlock(&set->lock);
    return found;
}

unsigned long long pm__handle_set_generation(pm__handle_set *set)
{
    return atomic_load_explicit(&set->generation, memory_order_acquire);
}

void pm__handle_set_for_each(pm__handle_set *set, void (*visit)(void *h, void *arg), void *arg)
{
    pthread_mutex_lock(&set->lock);
    for (size_t i = 0; i < set->cap; i++)
        if (set->slots[i])
            visit((void *)set->slots[i], arg);
    pthread_mutex_unlock(&set->lock);
}
