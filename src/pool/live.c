/* Which pools live: the set behind handle checks and the walks over every
 * pool (stream synchronization, statistics), the thread-cache slots they
 * hold, and the epoch that tells threads to check again what they
 * remembered of pools. */
#include <pthread.h>

#include "../handle_set.h"
#include "pool_internal.h"

/* Process-wide (part of the instance). */
static pm__handle_set live_pools = PM__HANDLE_SET_INIT;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER; /* the two below */
static bool slot_taken[PM__MAX_CACHED_POOLS];
static unsigned long long next_generation = 1;
_Atomic unsigned long long pm__pools_epoch = 1;

static void release_slot(const pm__pool *pool)
{
    pthread_mutex_lock(&slots_lock);
    if (pool->slot < PM__MAX_CACHED_POOLS)
        slot_taken[pool->slot] = false;
    pthread_mutex_unlock(&slots_lock);
}

bool pm__pools_add(pm__pool *pool)
{
    pthread_mutex_lock(&slots_lock);
    pool->slot = PM__MAX_CACHED_POOLS;
    for (unsigned i = 0; i < PM__MAX_CACHED_POOLS && pool->slot == PM__MAX_CACHED_POOLS; i++)
        if (!slot_taken[i])
            slot_taken[pool->slot = i] = true;
    pool->generation = next_generation++;
    pthread_mutex_unlock(&slots_lock);
    if (pm__handle_set_add(&live_pools, pool))
        return true;
    release_slot(pool);
    return false;
}

bool pm__pools_remove(pm__pool *pool)
{
    /* Waits out any walk over the pools; the next ones will not see it. */
    if (!pm__handle_set_remove(&live_pools, pool))
        return false;
    release_slot(pool);
    atomic_fetch_add(&pm__pools_epoch, 1);
    return true;
}

bool pm__pools_contains(const pm__pool *pool) { return pm__handle_set_contains(&live_pools, pool); }

void pm__pools_for_each(void (*visit)(void *pool, void *arg), void *arg)
{
    pm__handle_set_for_each(&live_pools, visit, arg);
}
