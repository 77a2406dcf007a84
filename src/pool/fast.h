/* The pool fast paths, inlined into pm_mem_alloc_from_pool and pm_mem_free:
 * a small block from, or back to, the calling thread's cache for a pool it
 * used before. Each either completes, or changes nothing and answers false,
 * and the caller takes the general path (which also reports any error). */
#ifndef PINMEM_POOL_FAST_H
#define PINMEM_POOL_FAST_H

#include "pool_internal.h"

/* cache.c; initial-exec: the fast path must not call __tls_get_addr. */
extern _Thread_local pm__cache *pm__thread_caches[PM__MAX_CACHED_POOLS + 1]
    __attribute__((tls_model("initial-exec")));

/* Only the holder of a cache writes its counters: no read-modify-write. */
static inline void pm__cache_add(_Atomic long long *v, long long d)
{
    atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

/* Takes the top block of bin (not empty) for bytesize, counted in c (entered). */
static inline void *pm__cache_pop(pm__pool *pool, pm__cache *c, pm__bin *bin, unsigned cls,
                                  size_t bytesize)
{
    uint32_t top = --bin->n;
    atomic_store_explicit(bin->req[top], bytesize, memory_order_release);
    long long held = atomic_load_explicit(&c->held, memory_order_relaxed) -
                     (long long)pm__class_size(cls);
    atomic_store_explicit(&c->held, held, memory_order_relaxed);
    pm__cache_add(&c->requested, (long long)bytesize);
    pm__cache_add(&c->allocs, 1);
    /* Use only grows here and on the slow paths, so the highest of these is
     * USED_MEM_HIGH; blocks other caches hold count as used (see used_peak). */
    long long in_use = atomic_load_explicit(&pool->handed, memory_order_relaxed) - held;
    if (in_use > atomic_load_explicit(&c->used_peak, memory_order_relaxed))
        atomic_store_explicit(&c->used_peak, in_use, memory_order_relaxed);
    return bin->slots[top];
}

/* Puts freed block p (bytes requested; its entry req) on bin (not full). */
static inline void pm__cache_push(pm__cache *c, pm__bin *bin, unsigned cls, void *p,
                                  _Atomic uint64_t *req, uint64_t bytes)
{
    bin->req[bin->n] = req;
    bin->slots[bin->n++] = p;
    pm__cache_add(&c->held, (long long)pm__class_size(cls));
    pm__cache_add(&c->requested, -(long long)bytes);
    pm__cache_add(&c->frees, 1);
}

/* The bin an allocation takes from: for one on stream s (same_stream),
 * blocks freed on s itself first, reusable at once in stream order. */
static inline pm__bin *pm__alloc_bin(pm__cache *c, unsigned cls, bool same_stream, pm_stream_t s)
{
    if (same_stream && atomic_load_explicit(&c->tagged, memory_order_relaxed) &&
        atomic_load_explicit(&c->tag, memory_order_relaxed) == s && c->tagged_bins[cls].n)
        return &c->tagged_bins[cls];
    return &c->ready[cls];
}

/* pool: a live pool (checked by the caller); 1 <= bytesize <= PM__POOL_SMALL_MAX;
 * s: a checked stream when async, the same stream on every thread
 * (pm__stream_varies_by_thread). */
static inline __attribute__((always_inline)) bool
pm__pool_try_alloc_fast(pm__pool *pool, size_t bytesize, void **pp, bool async, pm_stream_t s)
{
    pm__cache *c = pm__thread_caches[pool->slot]; /* the extra slot is always NULL */
    if (!c || !pm__owner_enter(&c->guard))
        return false;
    const unsigned cls = pm__class_of(bytesize);
    pm__bin *bin = pm__alloc_bin(c, cls, async, s);
    if (c->pool != pool || c->pool_generation != pool->generation || bin->n == 0) {
        pm__owner_leave(&c->guard);
        return false;
    }
    void *block = pm__cache_pop(pool, c, bin, cls, bytesize);
    pm__owner_leave(&c->guard);
    *pp = block;
    return true;
}

/* s: a checked stream when async. A free on a stream other than the one the
 * cache's tagged bins hold goes the general way, which flushes them. */
static inline __attribute__((always_inline)) bool pm__pool_try_free_fast(void *p, bool async,
                                                                         pm_stream_t s,
                                                                         pm__span *run)
{
    size_t offset = (size_t)((uint8_t *)p - run->run_hot.base);
    size_t index = (size_t)((offset * run->run_hot.div_magic) >> PM__CLASS_DIV_SHIFT);
    if (index >= run->run_hot.nblocks || index * run->run_hot.size != offset)
        return false;
    pm__cache *c = pm__thread_caches[run->run_hot.pool_slot];
    if (!c || !pm__owner_enter(&c->guard))
        return false;
    const unsigned cls = run->run_hot.cls;
    bool tagged = atomic_load_explicit(&c->tagged, memory_order_relaxed);
    pm__bin *bin = async ? &c->tagged_bins[cls] : &c->ready[cls];
    if (c->pool != run->run_hot.pool || c->pool_generation != run->run_hot.pool_generation ||
        bin->n == pm__class_cache_cap(cls) ||
        (async && tagged && atomic_load_explicit(&c->tag, memory_order_relaxed) != s)) {
        pm__owner_leave(&c->guard);
        return false;
    }
    _Atomic uint64_t *req = &run->run_hot.requested[index * run->run_hot.req_stride];
    uint64_t bytes = atomic_exchange_explicit(req, 0, memory_order_acq_rel);
    if (bytes == 0) { /* not allocated: the general path says so */
        pm__owner_leave(&c->guard);
        return false;
    }
    if (async && !tagged) {
        atomic_store_explicit(&c->tag, s, memory_order_relaxed);
        atomic_store_explicit(&c->tagged, true, memory_order_relaxed);
    }
    pm__cache_push(c, bin, cls, p, req, bytes);
    pm__owner_leave(&c->guard);
    return true;
}

#endif
