/* The pointers the preload handed out or registered through pinmem, so that
 * cudaFreeHost, cudaHostUnregister and the queries go to pinmem for exactly
 * those, and to the runtime for everything else (memory the runtime pinned
 * before, or after a fallback). A chained hash table under one lock: these
 * calls are rare next to copies, and pinning itself costs far more. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "preload.h"

typedef struct entry {
    struct entry *next;
    uintptr_t p;
    size_t bytes;
    pm__owned_kind kind;
} entry;

enum { BUCKETS = 4096 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *buckets[BUCKETS];
static atomic_size_t count;

/* A child forked while another thread held the lock would wait for it in its
 * first call here for ever: fork takes the lock, so both sides get it free. */
static void lock_for_fork(void)
{
    pthread_mutex_lock(&lock);
}

static void unlock_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}

/* At load, before any thread can take the lock: a registration racing a fork
 * may miss that fork's prepare step yet run its child step. */
__attribute__((constructor)) static void guard_fork(void)
{
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static entry **bucket(uintptr_t p)
{
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;
    return &buckets[h >> 52];
}

bool pm__owned_add(void *p, size_t bytes, pm__owned_kind kind)
{
    entry *e = malloc(sizeof *e);
    if (!e)
        return false;
    *e = (entry){.p = (uintptr_t)p, .bytes = bytes, .kind = kind};
    pthread_mutex_lock(&lock);
    entry **b = bucket(e->p);
    e->next = *b;
    *b = e;
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    pthread_mutex_unlock(&lock);
    return true;
}

bool pm__owned_take(void *p, pm__owned_kind kind, size_t *bytes)
{
    entry *found = NULL;
    pthread_mutex_lock(&lock);
    for (entry **at = bucket((uintptr_t)p); *at; at = &(*at)->next)
        if ((*at)->p == (uintptr_t)p && (*at)->kind == kind) {
            found = *at;
            *at = found->next;
            atomic_fetch_sub_explicit(&count, 1, memory_order_relaxed);
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!found)
        return false;
    if (bytes)
        *bytes = found->bytes;
    free(found);
    return true;
}

bool pm__owned_overlaps(const void *p, size_t bytes, pm__owned_kind kind)
{
    const uintptr_t lo = (uintptr_t)p, n = bytes;
    bool hit = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < BUCKETS && !hit; i++)
        for (entry *e = buckets[i]; e && !hit; e = e->next)
            hit = e->kind == kind && lo < e->p + e->bytes && (e->p < lo || e->p - lo < n);
    pthread_mutex_unlock(&lock);
    return hit;
}

bool pm__owned_any(void)
{
    return atomic_load_explicit(&count, memory_order_relaxed) != 0;
}

/* pinmem's registry knows where the allocation or registration around p
 * starts; the table says whether the preload made it. */
pm__owned_kind pm__owned_find(const pm__pinmem_api *pm, const void *p)
{
    pm_deviceptr base = 0;
    if (!pm__owned_any() || pm->pm_mem_get_address_range(&base, NULL, (pm_deviceptr)(uintptr_t)p) !=
                                PM_SUCCESS)
        return 0;
    pm__owned_kind kind = 0;
    pthread_mutex_lock(&lock);
    for (entry *e = *bucket((uintptr_t)base); e && !kind; e = e->next)
        if (e->p == (uintptr_t)base)
            kind = e->kind;
    pthread_mutex_unlock(&lock);
    return kind;
}
