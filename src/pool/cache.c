/* Per-thread caches over the size classes: the allocation fast path takes
 * only the calling thread's own cache lock, never the pool's, and never calls
 * the driver. Blocks freed on a stream stay in "tagged" bins that serve only
 * that stream until they are flushed to the pool behind a marker. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../errors.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "fast.h"

/* Process-wide (part of the lazily created instance): spare caches, and the
 * key whose destructor flushes a thread's caches when it exits. */
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static pm__cache *spare_caches;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
/* One slot per cached pool, and one always NULL for pools without caches. */
_Thread_local pm__cache *pm__thread_caches[PM__MAX_CACHED_POOLS + 1]
    __attribute__((tls_model("initial-exec")));

static void lock_cache(pm__cache *c) { pm__foreign_enter(&c->guard); }
static void unlock_cache(pm__cache *c) { pm__foreign_leave(&c->guard); }

/* A cache entered by its owner's fast entry, or taken over (slow paths). */
static void leave_cache(pm__cache *c, bool taken)
{
    if (taken)
        unlock_cache(c);
    else
        pm__owner_leave(&c->guard);
}

static bool is_tagged(pm__cache *c) { return atomic_load_explicit(&c->tagged, memory_order_relaxed); }
static pm_stream_t tag_of(pm__cache *c) { return atomic_load_explicit(&c->tag, memory_order_relaxed); }
static void set_tag(pm__cache *c, bool tagged, pm_stream_t s)
{
    atomic_store_explicit(&c->tag, s, memory_order_relaxed);
    atomic_store_explicit(&c->tagged, tagged, memory_order_relaxed);
}

static long long load(_Atomic long long *v) { return atomic_load_explicit(v, memory_order_relaxed); }
/* Only the holder of a counter's cache, or of its pool's lock, writes it. */
static void add(_Atomic long long *v, long long d) { pm__cache_add(v, d); }

/* c->lock and pool->lock held: the blocks freed on the cache's stream go to
 * a pending batch behind a marker. */
static void flush_tagged_locked(pm__pool *pool, pm__cache *c)
{
    void *blocks[PM__POOL_CLASSES * 32];
    size_t n = 0;
    long long bytes = 0;
    for (unsigned k = 0; k < PM__POOL_CLASSES; k++) {
        pm__bin *bin = &c->tagged_bins[k];
        memcpy(blocks + n, bin->slots, bin->n * sizeof *blocks);
        n += bin->n;
        bytes += (long long)(bin->n * pm__class_size(k));
        bin->n = 0;
    }
    add(&c->held, -bytes);
    /* Cached legacy-stream frees are all of threads in the home place, and
     * whichever thread flushes them records their marker there. */
    const pm__backend *b = pool->backend;
    pm__place_scope scope;
    const bool home = n && pm__stream_is_legacy(tag_of(c)) &&
                      b->place_enter(&b->home, &scope) == PM_SUCCESS;
    if (n && pm__pending_add(pool, tag_of(c), blocks, n) != PM_SUCCESS) {
        /* No marker could be recorded: wait for the stream instead, and the
         * blocks are free at once. */
        b->stream_synchronize(tag_of(c));
        for (size_t i = 0; i < n; i++) {
            pm__chunk *chunk;
            pm__central_free_block(pool, pm__span_of((uintptr_t)blocks[i], &chunk), blocks[i]);
        }
    }
    if (home)
        b->place_leave(&scope);
    set_tag(c, false, tag_of(c));
}

/* c->lock held; takes pool->lock. Everything cached goes back to the pool,
 * the counters and the peak into the pool's. */
static void flush_locked(pm__pool *pool, pm__cache *c)
{
    pthread_mutex_lock(&pool->lock);
    for (unsigned k = 0; k < PM__POOL_CLASSES; k++) {
        pm__bin *bin = &c->ready[k];
        for (uint32_t i = 0; i < bin->n; i++) {
            pm__chunk *chunk;
            pm__central_free_block(pool, pm__span_of((uintptr_t)bin->slots[i], &chunk),
                                   bin->slots[i]);
        }
        add(&c->held, -(long long)(bin->n * pm__class_size(k)));
        bin->n = 0;
    }
    if (is_tagged(c))
        flush_tagged_locked(pool, c);
    pool->requested += load(&c->requested);
    pool->allocs += load(&c->allocs);
    pool->frees += load(&c->frees);
    pool->live += load(&c->allocs) - load(&c->frees);
    long long peak = load(&c->used_peak);
    if (peak > 0 && (unsigned long long)peak > pool->used_high)
        pool->used_high = (unsigned long long)peak;
    atomic_store(&c->held, 0); /* every bin is empty */
    atomic_store(&c->requested, 0);
    atomic_store(&c->allocs, 0);
    atomic_store(&c->frees, 0);
    atomic_store(&c->used_peak, 0);
    pthread_mutex_unlock(&pool->lock);
}

static void detach_locked(pm__pool *pool, pm__cache *c)
{
    flush_locked(pool, c);
    pthread_mutex_lock(&pool->lock);
    if (c->pool_prev)
        c->pool_prev->pool_next = c->pool_next;
    else
        pool->caches = c->pool_next;
    if (c->pool_next)
        c->pool_next->pool_prev = c->pool_prev;
    pthread_mutex_unlock(&pool->lock);
    c->pool = NULL;
}

static void on_thread_exit(void *unused)
{
    (void)unused;
    for (unsigned i = 0; i < PM__MAX_CACHED_POOLS; i++) {
        pm__cache *c = pm__thread_caches[i];
        if (!c)
            continue;
        pm__thread_caches[i] = NULL;
        lock_cache(c);
        if (c->pool)
            detach_locked(c->pool, c);
        unlock_cache(c);
        pthread_mutex_lock(&spare_lock);
        c->spare_next = spare_caches;
        spare_caches = c;
        pthread_mutex_unlock(&spare_lock);
    }
}

static void make_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

/* The slow way in: the calling thread's cache for pool, taken over (as any
 * other thread would), attached to pool first if need be; NULL when the pool
 * has none. */
static __attribute__((noinline)) pm__cache *take_own_cache(pm__pool *pool)
{
    pm__cache *c = pm__thread_caches[pool->slot];
    if (c) {
        lock_cache(c);
        if (c->pool == pool && c->pool_generation == pool->generation)
            return c;
        if (c->pool)
            detach_locked(c->pool, c); /* the slot's earlier pool */
    } else {
        pthread_once(&key_once, make_key);
        pthread_mutex_lock(&spare_lock);
        c = spare_caches;
        if (c)
            spare_caches = c->spare_next;
        pthread_mutex_unlock(&spare_lock);
        if (!c) {
            if (!(c = calloc(1, sizeof *c)))
                return NULL;
            pm__ownership_init(&c->guard);
        }
        pthread_setspecific(exit_key, c); /* any non-NULL value arms the destructor */
        pm__thread_caches[pool->slot] = c;
        lock_cache(c);
    }
    pthread_mutex_lock(&pool->lock);
    if (pool->destroyed) {
        pthread_mutex_unlock(&pool->lock);
        unlock_cache(c);
        return NULL;
    }
    c->pool = pool;
    c->pool_generation = pool->generation;
    set_tag(c, false, NULL);
    c->pool_prev = NULL;
    c->pool_next = pool->caches;
    if (c->pool_next)
        c->pool_next->pool_prev = c;
    pool->caches = c;
    pthread_mutex_unlock(&pool->lock);
    return c;
}

/* The calling thread's cache for pool, entered; *taken says which way (for
 * leave_cache). NULL when the pool has none. */
static inline pm__cache *enter_cache(pm__pool *pool, bool *taken)
{
    if (pool->slot >= PM__MAX_CACHED_POOLS)
        return NULL;
    pm__cache *c = pm__thread_caches[pool->slot];
    if (c && pm__owner_enter(&c->guard)) {
        if (c->pool == pool && c->pool_generation == pool->generation) {
            *taken = false;
            return c;
        }
        pm__owner_leave(&c->guard);
    }
    *taken = true;
    return take_own_cache(pool);
}

static pm__cache **snapshot_caches(pm__pool *pool, size_t *n)
{
    pthread_mutex_lock(&pool->lock);
    size_t count = 0;
    for (pm__cache *c = pool->caches; c; c = c->pool_next)
        count++;
    pm__cache **all = malloc((count ? count : 1) * sizeof *all);
    count = 0;
    for (pm__cache *c = pool->caches; all && c; c = c->pool_next)
        all[count++] = c;
    pthread_mutex_unlock(&pool->lock);
    *n = count;
    return all;
}

bool pm__caches_flush_pool(pm__pool *pool, bool detach)
{
    bool held = false;
    if (detach) {
        /* No snapshot, which could fail: each detach unlinks its cache. */
        for (;;) {
            pthread_mutex_lock(&pool->lock);
            pm__cache *c = pool->caches;
            pthread_mutex_unlock(&pool->lock);
            if (!c)
                return held;
            lock_cache(c);
            if (c->pool == pool)
                detach_locked(pool, c);
            unlock_cache(c);
        }
    }
    size_t n;
    pm__cache **all = snapshot_caches(pool, &n);
    for (size_t i = 0; all && i < n; i++) {
        lock_cache(all[i]);
        if (all[i]->pool == pool) {
            held |= load(&all[i]->held) != 0;
            flush_locked(pool, all[i]);
        }
        unlock_cache(all[i]);
    }
    free(all);
    /* No memory for the snapshot: each cache in turn, found again from the
     * head (caches are reused, never freed); a cache that joins or leaves
     * meanwhile may be missed, as it may be by a snapshot. */
    for (size_t k = 0; !all; k++) {
        pthread_mutex_lock(&pool->lock);
        pm__cache *c = pool->caches;
        for (size_t i = 0; c && i < k; i++)
            c = c->pool_next;
        pthread_mutex_unlock(&pool->lock);
        if (!c)
            break;
        lock_cache(c);
        if (c->pool == pool) {
            held |= load(&c->held) != 0;
            flush_locked(pool, c);
        }
        unlock_cache(c);
    }
    return held;
}

void pm__caches_reset_peaks(pm__pool *pool)
{
    size_t n;
    pm__cache **all = snapshot_caches(pool, &n);
    for (size_t i = 0; all && i < n; i++) {
        /* Taken over, so that no allocation of its owner's is lost between
         * the owner's read of the peak and its store. */
        lock_cache(all[i]);
        if (all[i]->pool == pool)
            atomic_store_explicit(&all[i]->used_peak, 0, memory_order_relaxed);
        unlock_cache(all[i]);
    }
    free(all);
}

/* Whether c holds frees on s (the legacy stream by either of its handles). */
static bool holds_frees_on(pm__cache *c, pm_stream_t s)
{
    return is_tagged(c) &&
           (tag_of(c) == s || (pm__stream_is_legacy(tag_of(c)) && pm__stream_is_legacy(s)));
}

void pm__caches_flush_stream(pm__pool *pool, pm_stream_t s)
{
    size_t n;
    pm__cache **all = snapshot_caches(pool, &n);
    for (size_t i = 0; all && i < n; i++) {
        pm__cache *c = all[i];
        if (!holds_frees_on(c, s))
            continue; /* nothing of s: the owner's own frees on s are already seen here */
        lock_cache(c);
        if (c->pool == pool && holds_frees_on(c, s)) {
            pthread_mutex_lock(&pool->lock);
            flush_tagged_locked(pool, c);
            pthread_mutex_unlock(&pool->lock);
        }
        unlock_cache(c);
    }
    free(all);
}

static void note_allocated(pm__span *span, size_t index, size_t bytesize)
{
    atomic_store_explicit(pm__requested(span, index), bytesize, memory_order_release);
}

/* pool->lock held. An asynchronous allocation on s may take a block freed on
 * another stream whose work may still run, in the driver's order: before
 * pinning more, with REUSE_FOLLOW_EVENT_DEPENDENCIES, one freed before an
 * event s already waits for, at no cost (followed); only once pinning more
 * failed, with REUSE_ALLOW_INTERNAL_DEPENDENCIES, any, after making s wait
 * for its free (earlier, s would wait for work the driver leaves apart). */
static void *take_followed(pm__pool *pool, size_t bytesize, unsigned cls, bool async,
                           pm_stream_t s)
{
    if (!async || !pool->pending || !pool->reuse_follow_event_deps ||
        pm__central_fits(pool, bytesize, cls))
        return NULL;
    return pm__pending_take_followed(pool, s, bytesize, cls);
}

static void *take_with_dependency(pm__pool *pool, size_t bytesize, unsigned cls, bool async,
                                  pm_stream_t s)
{
    if (!async || !pool->pending || !pool->reuse_internal_deps)
        return NULL;
    return pm__pending_take_ordered(pool, s, bytesize, cls);
}

/* Refills a bin of c from the pool: completed stream frees first, then runs. */
static pm_result refill(pm__pool *pool, pm__cache *c, pm__bin *bin, unsigned cls, bool async,
                        pm_stream_t s)
{
    pm_result why = PM_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&pool->lock);
    if (pool->pending)
        pm__pending_reclaim(pool, s, async);
    void *ordered = take_followed(pool, pm__class_size(cls), cls, async, s);
    if (!ordered) {
        bin->n = (uint32_t)pm__central_take(pool, cls, bin->slots, bin->req,
                                            pm__class_cache_cap(cls) / 2 + 1, &why);
        if (bin->n == 0 && why == PM_ERROR_OUT_OF_MEMORY)
            ordered = take_with_dependency(pool, pm__class_size(cls), cls, async, s);
    }
    if (ordered) { /* for this allocation only: popped at once */
        pm__chunk *chunk;
        pm__span *run = pm__span_of((uintptr_t)ordered, &chunk);
        bin->slots[0] = ordered;
        bin->req[0] = pm__requested(
            run, pm__class_index(cls, (size_t)((uint8_t *)ordered -
                                               (chunk->base + run->first * PM__POOL_PAGE))));
        bin->n = 1;
        add(&c->held, (long long)pm__class_size(cls));
        pthread_mutex_unlock(&pool->lock);
        return PM_SUCCESS;
    }
    add(&c->held, (long long)(bin->n * pm__class_size(cls)));
    pthread_mutex_unlock(&pool->lock);
    return bin->n ? PM_SUCCESS : why;
}

/* pool->lock held, after an allocation on the slow path by a thread whose
 * cache for the pool holds held bytes (0: none): the pool's USED_MEM_HIGH
 * (see pool.c's used_high_now). */
static void note_high(pm__pool *pool, long long held)
{
    long long in_use = atomic_load_explicit(&pool->handed, memory_order_relaxed) - held;
    if (in_use > 0 && (unsigned long long)in_use > pool->used_high)
        pool->used_high = (unsigned long long)in_use;
}

static pm_result alloc_once(pm__pool *pool, void **pp, size_t bytesize, bool async, pm_stream_t s)
{
    if (bytesize > ((size_t)1 << 46))
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%zu bytes is more than a pool can hold", bytesize);
    const unsigned cls = bytesize <= PM__POOL_SMALL_MAX ? pm__class_of(bytesize) : PM__POOL_CLASSES;
    bool taken = false;
    pm__cache *c = enter_cache(pool, &taken);
    if (c && cls < PM__POOL_CLASSES) {
        /* Where s names another stream on each thread, the blocks the cache
         * holds for s may be of another thread's. */
        const bool same_stream = async && !pm__stream_varies_by_thread(pool->backend, s);
        pm__bin *bin = pm__alloc_bin(c, cls, same_stream, s);
        if (bin->n == 0) {
            pm_result r = refill(pool, c, bin, cls, async, s);
            if (r != PM_SUCCESS) {
                leave_cache(c, taken);
                return r;
            }
        }
        void *block = pm__cache_pop(pool, c, bin, cls, bytesize);
        leave_cache(c, taken);
        *pp = block;
        return PM_SUCCESS;
    }
    /* Large requests, and pools past the thread-cache slots. The caller's
     * cache stays entered, so that what it holds is known exactly. */
    pm_result why = PM_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&pool->lock);
    if (pool->pending)
        pm__pending_reclaim(pool, s, async);
    void *block = take_followed(pool, bytesize, cls, async, s);
    if (!block)
        block = pm__central_alloc(pool, bytesize, cls, &why);
    if (!block && why == PM_ERROR_OUT_OF_MEMORY)
        block = take_with_dependency(pool, bytesize, cls, async, s);
    if (block) {
        pm__chunk *chunk = NULL;
        pm__span *span = pm__span_of((uintptr_t)block, &chunk);
        size_t index = cls < PM__POOL_CLASSES
                           ? pm__class_index(cls, (size_t)((uint8_t *)block -
                                                           (chunk->base + span->first * PM__POOL_PAGE)))
                           : 0;
        note_allocated(span, index, bytesize);
        pool->requested += (long long)bytesize;
        pool->allocs++;
        pool->live++;
        note_high(pool, c ? load(&c->held) : 0);
    }
    pthread_mutex_unlock(&pool->lock);
    if (c)
        leave_cache(c, taken);
    if (!block)
        return why;
    *pp = block;
    return PM_SUCCESS;
}

/* pm_mem_free of memory outside every pool: when pinmem pinned it another
 * way, the detail names the call that gives it back. */
static pm_result not_pool_memory(const char *name, void *p)
{
    pm_result ignored;
    pm__range r;
    pm__instance *inst = pm__instance_get(&ignored);
    if (inst && (pm__ranges_find(inst->ranges, (uintptr_t)p, &r) ||
                 pm__ranges_find_extent(inst->ranges, (uintptr_t)p, &r))) {
        const char *where = r.base == (uintptr_t)p ? "is" : "lies inside";
        if (r.kind == PM__RANGE_ALLOC)
            return pm__fail(PM_ERROR_INVALID_VALUE,
                            "%s: %p is not pool memory: it %s a host allocation "
                            "(pm_mem_host_alloc); free it with pm_mem_free_host(%p)",
                            name, p, where, (void *)r.base);
        if (r.kind == PM__RANGE_REGISTERED)
            return pm__fail(PM_ERROR_INVALID_VALUE,
                            "%s: %p is not pool memory: it %s a registration "
                            "(pm_mem_host_register); release it with pm_mem_host_unregister(%p)",
                            name, p, where, (void *)r.base);
    }
    return pm__fail(PM_ERROR_INVALID_VALUE,
                    "%s: %p is not pool memory (%s takes only what "
                    "pm_mem_alloc_from_pool gave)",
                    name, p, name);
}

pm_result pm__pool_alloc(pm__pool *pool, void **pp, size_t bytesize, bool async, pm_stream_t s)
{
    PM__NO_CANCEL;
    pm__detail_saved before; /* an allocation that succeeds leaves it as it was */
    pm__detail_save(&before);
    pm_result r = alloc_once(pool, pp, bytesize, async, s);
    /* Free blocks may sit in threads' caches (this one's too): back to the
     * pool, where this allocation can take them, and try again. */
    if (r == PM_ERROR_OUT_OF_MEMORY && pool->slot < PM__MAX_CACHED_POOLS &&
        pm__caches_flush_pool(pool, false))
        r = alloc_once(pool, pp, bytesize, async, s);
    /* Destroyed pools waiting for the reaper may hold the memory it needs. */
    if (r == PM_ERROR_OUT_OF_MEMORY && pm__retire_reap_here())
        r = alloc_once(pool, pp, bytesize, async, s);
    /* A way that failed before one succeeded (the max_size, then a block
     * another stream freed) may have written the detail. */
    if (r == PM_SUCCESS)
        pm__detail_restore(&before);
    return r;
}

/* The span and block index of a live pool allocation starting at p, with its
 * requested size taken (so a second free of p fails). */
static pm_result claim_free(const char *name, void *p, pm__span **out_span, _Atomic uint64_t **out_req,
                            size_t *out_bytes)
{
    pm__chunk *chunk;
    pm__span *span = pm__span_of((uintptr_t)p, &chunk);
    if (!span)
        return not_pool_memory(name, p);
    uint8_t *base = chunk->base + span->first * PM__POOL_PAGE;
    size_t index = 0;
    if (span->kind == SPAN_RUN) {
        size_t size = pm__class_size(span->cls);
        index = pm__class_index(span->cls, (size_t)((uint8_t *)p - base));
        if (index >= span->nblocks || base + index * size != (uint8_t *)p)
            return pm__fail(PM_ERROR_INVALID_VALUE,
                            "%s: %p is inside a pool allocation, not its start", name, p);
    } else if (span->kind != SPAN_LARGE || base != (uint8_t *)p) {
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %p is not a pool allocation", name, p);
    }
    _Atomic uint64_t *req = pm__requested(span, index);
    uint64_t bytes = atomic_exchange_explicit(req, 0, memory_order_acq_rel);
    if (bytes == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %p is not allocated (double free?)", name,
                        p);
    *out_span = span;
    *out_req = req;
    *out_bytes = bytes;
    return PM_SUCCESS;
}

pm_result pm__pool_free(void *p, bool async, pm_stream_t s)
{
    PM__NO_CANCEL;
    pm__span *span = NULL;
    _Atomic uint64_t *req = NULL;
    size_t bytes = 0;
    pm_result r = claim_free(async ? "pm_mem_free_async" : "pm_mem_free", p, &span, &req, &bytes);
    if (r != PM_SUCCESS)
        return r;
    pm__pool *pool = span->chunk->pool;
    bool taken = false;
    /* A block freed on a stream whose handle names another stream on another
     * thread (the thread's own; the legacy one of its context) goes behind a
     * marker now: a cache's blocks may be flushed by another thread. */
    const bool cacheable = span->kind == SPAN_RUN &&
                           !(async && pm__stream_varies_by_thread(pool->backend, s));
    pm__cache *c = cacheable ? enter_cache(pool, &taken) : NULL;
    if (c) {
        const unsigned cls = span->cls;
        const unsigned cap = pm__class_cache_cap(cls);
        if (async && is_tagged(c) && tag_of(c) != s) {
            pthread_mutex_lock(&pool->lock);
            flush_tagged_locked(pool, c);
            pthread_mutex_unlock(&pool->lock);
        }
        if (async && (!is_tagged(c) || tag_of(c) != s))
            set_tag(c, true, s);
        pm__bin *bin = async ? &c->tagged_bins[cls] : &c->ready[cls];
        if (bin->n == cap) {
            pthread_mutex_lock(&pool->lock);
            if (async) {
                flush_tagged_locked(pool, c);
                set_tag(c, true, s);
            } else {
                for (uint32_t i = cap / 2; i < cap; i++) {
                    pm__chunk *chunk;
                    pm__central_free_block(pool, pm__span_of((uintptr_t)bin->slots[i], &chunk),
                                           bin->slots[i]);
                }
                add(&c->held, -(long long)((cap - cap / 2) * pm__class_size(cls)));
                bin->n = cap / 2;
            }
            pthread_mutex_unlock(&pool->lock);
        }
        pm__cache_push(c, bin, cls, p, req, bytes);
        leave_cache(c, taken);
        return PM_SUCCESS;
    }
    pthread_mutex_lock(&pool->lock);
    pm_result added = PM_ERROR_UNKNOWN;
    if (async)
        added = pm__pending_add(pool, s, &p, 1);
    if (added != PM_SUCCESS) {
        if (async) /* no marker: wait for the stream, then it is free */
            pool->backend->stream_synchronize(s);
        if (span->kind == SPAN_RUN)
            pm__central_free_block(pool, span, p);
        else
            pm__central_free_large(pool, span);
    }
    pool->requested -= (long long)bytes;
    pool->frees++;
    pool->live--;
    bool finish = pm__retire_claim(pool);
    pthread_mutex_unlock(&pool->lock);
    if (finish)
        pm__retire_finish(pool);
    return PM_SUCCESS;
}
