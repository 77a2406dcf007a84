/* Ownership of a thread cache: its owner enters and leaves it on every
 * allocation and free with plain stores, and other threads (trim, destroy,
 * statistics, stream synchronization, thread exit) take it over rarely, at a
 * higher price.
 *
 * This is Dekker's protocol with the cost moved to the rare side. The owner
 * stores busy = 1 and then reads foreign; another thread stores foreign = 1
 * and then reads busy. Each side needs its store visible before its load. The
 * foreign side issues a full fence; the owner's fence is supplied by the
 * foreign side's membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes
 * every running thread of the process execute one. Where the kernel lacks
 * membarrier the owner fences too (an atomic exchange), as a spin lock would. */
#ifndef PINMEM_POOL_OWNERSHIP_H
#define PINMEM_POOL_OWNERSHIP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct pm__ownership {
    _Atomic int busy;    /* the owner is inside */
    _Atomic int foreign; /* another thread holds, or waits for, the cache */
    pthread_mutex_t foreign_lock; /* one foreign holder at a time */
} pm__ownership;

/* Whether owners may skip their fence (membarrier works here); set once. */
extern bool pm__owner_fence_free;

/* Registers the process for the membarrier owners rely on, once. Where the
 * process already runs several threads the kernel first waits out an RCU
 * grace period (5-26 ms on the GPU machines), so pools do it as the first of
 * them is created rather than in an allocation. */
void pm__ownership_prepare(void);

void pm__ownership_init(pm__ownership *o);

/* The owner's entry: false when another thread holds the cache, and the
 * owner must then use pm__foreign_enter like anyone else. */
static inline bool pm__owner_enter(pm__ownership *o)
{
    if (pm__owner_fence_free) {
        atomic_store_explicit(&o->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        atomic_exchange_explicit(&o->busy, 1, memory_order_seq_cst);
    }
    if (!atomic_load_explicit(&o->foreign, memory_order_acquire))
        return true;
    atomic_store_explicit(&o->busy, 0, memory_order_release);
    return false;
}

static inline void pm__owner_leave(pm__ownership *o)
{
    atomic_store_explicit(&o->busy, 0, memory_order_release);
}

/* Anyone's entry (the owner's too, on its slow paths): waits until the owner
 * is outside, and keeps it out until pm__foreign_leave. */
void pm__foreign_enter(pm__ownership *o);
void pm__foreign_leave(pm__ownership *o);

#endif
