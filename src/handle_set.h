/* A set of live handles (pointers the library gave out), so that a call on a
 * stale or made-up handle is refused rather than followed. Pools, events and
 * POSIX streams each keep one. Lookups are constant time however many handles
 * live: a program may hold thousands of events.
 *
 * Every operation takes the set's own mutex. The generation changes whenever
 * a handle leaves the set, so a thread may remember "h was live at generation
 * g" and skip the lookup while the generation stays g. */
#ifndef PINMEM_HANDLE_SET_H
#define PINMEM_HANDLE_SET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct pm__handle_set {
    pthread_mutex_t lock;
    const void **slots; /* open addressing, linear probing; NULL is empty */
    size_t cap;         /* a power of two, or 0 before the first add */
    size_t count;
    _Atomic unsigned long long generation;
} pm__handle_set;

#define PM__HANDLE_SET_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 1}

/* Adds h (a no-op when it is already there); false when h is NULL or memory
 * runs out. */
bool pm__handle_set_add(pm__handle_set *set, const void *h);
bool pm__handle_set_contains(pm__handle_set *set, const void *h);
/* As contains, and where h is there, calls then(h) with the set's mutex held,
 * so that h cannot leave the set (and be freed) before then has run: then
 * takes a hold on h that its remover respects. */
bool pm__handle_set_contains_then(pm__handle_set *set, const void *h, void (*then)(const void *h));
/* Removes h and moves the generation on; false when h was not in the set. */
bool pm__handle_set_remove(pm__handle_set *set, const void *h);
unsigned long long pm__handle_set_generation(pm__handle_set *set);

/* Calls visit on every handle with the set's mutex held, so that no handle
 * can leave the set during the walk; visit must not call back into the set. */
void pm__handle_set_for_each(pm__handle_set *set, void (*visit)(void *h, void *arg), void *arg);

#endif
