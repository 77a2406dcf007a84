/* pm_mem_pool_t once made: handle checks, allocation and free, trim,
 * attributes and statistics, and what stream synchronization asks of every
 * pool. Creation and destruction: lifecycle.c. */
#include <stdio.h>
#include <string.h>

#include "../errors.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "../versioned.h"
#include "fast.h"

/* The pool this thread checked last, and the epoch it checked it in. */
static _Thread_local pm__pool *checked_pool __attribute__((tls_model("initial-exec")));
static _Thread_local unsigned long long checked_epoch __attribute__((tls_model("initial-exec")));

const pm__chunk_ops *pm__pool_chunk_ops_at(uintptr_t addr)
{
    pm__chunk *c = NULL;
    return pm__span_of(addr, &c) && c ? c->ops : NULL;
}

bool pm__pool_find(uintptr_t addr, uintptr_t *base, size_t *size)
{
    pm__chunk *chunk;
    pm__span *span = pm__span_of(addr, &chunk);
    if (!span || span->kind == SPAN_FREE)
        return false;
    uintptr_t start = (uintptr_t)(chunk->base + span->first * PM__POOL_PAGE);
    size_t index = 0;
    if (span->kind == SPAN_RUN) {
        size_t block = pm__class_size(span->cls);
        index = pm__class_index(span->cls, addr - start);
        if (index >= span->nblocks)
            return false;
        start += index * block;
    }
    uint64_t requested = atomic_load_explicit(pm__requested(span, index), memory_order_acquire);
    if (requested == 0 || addr - start >= requested)
        return false;
    *base = start;
    *size = (size_t)requested;
    return true;
}

/* A handle is a live pool: checked against the list, remembered per thread
 * until any pool is destroyed. */
static pm_result check_pool(pm_mem_pool_t handle)
{
    pm__pool *pool = (pm__pool *)handle;
    unsigned long long epoch = atomic_load_explicit(&pm__pools_epoch, memory_order_acquire);
    if (pool && pool == checked_pool && epoch == checked_epoch)
        return PM_SUCCESS; /* as checked_recently */
    if (!pm__pools_contains(pool))
        return pm__fail(PM_ERROR_INVALID_VALUE, "%p is not a live memory pool", (void *)pool);
    checked_pool = pool;
    checked_epoch = epoch;
    return PM_SUCCESS;
}

pm_result pm__pool_of_handle(pm_mem_pool_t handle, pm__pool **pool)
{
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = check_pool(handle);
    if (r == PM_SUCCESS)
        *pool = (pm__pool *)handle;
    return r;
}

static pm_result check_alloc_args(const char *name, void **pp, pm_mem_pool_t pool)
{
    if (!pp)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: pp is NULL", name);
    if (!pool)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: pool is NULL", name);
    return check_pool(pool);
}

/* The handle check's first step: the pool this thread last checked, with no
 * pool destroyed since. */
static inline bool checked_recently(pm_mem_pool_t pool)
{
    return pool && (pm__pool *)pool == checked_pool &&
           atomic_load_explicit(&pm__pools_epoch, memory_order_acquire) == checked_epoch;
}

/* Kept out of line, so that the fast paths need no stack frame. */
static __attribute__((noinline)) pm_result alloc_general(void **pp, size_t bytesize,
                                                        pm_mem_pool_t pool)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_alloc_from_pool");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = check_alloc_args("pm_mem_alloc_from_pool", pp, pool);
    if (r != PM_SUCCESS)
        return r;
    if (bytesize == 0) {
        *pp = NULL;
        return PM_SUCCESS;
    }
    return pm__pool_alloc((pm__pool *)pool, pp, bytesize, false, NULL);
}

pm_result pm_mem_alloc_from_pool(void **pp, size_t bytesize, pm_mem_pool_t pool)
{
    if (pp && bytesize - 1 < PM__POOL_SMALL_MAX && checked_recently(pool) &&
        pm__thread_calls_free() && pm__pool_try_alloc_fast((pm__pool *)pool, bytesize, pp, false, NULL))
        return PM_SUCCESS;
    return alloc_general(pp, bytesize, pool);
}

pm_result pm_mem_alloc_from_pool_async(void **pp, size_t bytesize, pm_mem_pool_t pool,
                                       pm_stream_t stream)
{
    PM__REFUSED_IN_HOST_FUNC("pm_mem_alloc_from_pool_async");
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = check_alloc_args("pm_mem_alloc_from_pool_async", pp, pool);
    if (r == PM_SUCCESS)
        r = inst->backend.stream_check(stream);
    if (r != PM_SUCCESS)
        return r;
    if (bytesize == 0) {
        *pp = NULL;
        return PM_SUCCESS;
    }
    if (bytesize <= PM__POOL_SMALL_MAX && !pm__stream_varies_by_thread(&inst->backend, stream) &&
        pm__pool_try_alloc_fast((pm__pool *)pool, bytesize, pp, true, stream))
        return PM_SUCCESS;
    return pm__pool_alloc((pm__pool *)pool, pp, bytesize, true, stream);
}

static __attribute__((noinline)) pm_result free_general(void *p)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_free");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    if (!p)
        return PM_SUCCESS;
    return pm__pool_free(p, false, NULL);
}

/* The run this thread freed into last: consecutive frees often land in one
 * run, and then skip the walk through the chunk map. The memo holds the run's
 * range, so that checking it reads nothing shared but two words: the pools'
 * epoch (span structs live as long as their pool) and the run's incarnation
 * (which changes when the span stops being that run). */
typedef struct run_memo {
    pm__span *run;
    uintptr_t base;
    size_t bytes;
    uint32_t incarnation;
    unsigned long long epoch;
} run_memo;
static _Thread_local run_memo last_run __attribute__((tls_model("initial-exec")));

static inline __attribute__((always_inline)) pm__span *run_of(void *p)
{
    unsigned long long epoch = atomic_load_explicit(&pm__pools_epoch, memory_order_acquire);
    pm__span *run = last_run.run;
    if (run && (uintptr_t)p - last_run.base < last_run.bytes && last_run.epoch == epoch &&
        atomic_load_explicit(&run->run_hot.incarnation, memory_order_acquire) ==
            last_run.incarnation)
        return run;
    pm__chunk *chunk;
    run = pm__span_of((uintptr_t)p, &chunk);
    if (!run || run->kind != SPAN_RUN)
        return NULL;
    last_run = (run_memo){
        .run = run,
        .base = (uintptr_t)run->run_hot.base,
        .bytes = run->run_hot.bytes,
        .incarnation = atomic_load_explicit(&run->run_hot.incarnation, memory_order_acquire),
        .epoch = epoch,
    };
    return run;
}

pm_result pm_mem_free(void *p)
{
    pm__span *run;
    if (p && pm__thread_calls_free() && (run = run_of(p)) &&
        pm__pool_try_free_fast(p, false, NULL, run))
        return PM_SUCCESS;
    return free_general(p);
}

pm_result pm_mem_free_async(void *p, pm_stream_t stream)
{
    PM__REFUSED_IN_HOST_FUNC("pm_mem_free_async");
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = inst->backend.stream_check(stream);
    if (r != PM_SUCCESS)
        return r;
    if (!p)
        return PM_SUCCESS;
    pm__span *run = run_of(p);
    if (run && !pm__stream_varies_by_thread(&inst->backend, stream) &&
        pm__pool_try_free_fast(p, true, stream, run))
        return PM_SUCCESS;
    return pm__pool_free(p, true, stream);
}

/* pool->lock held: gives back free memory down to, and not below, keep bytes. */
static void release_down_to(pm__pool *pool, unsigned long long keep)
{
    pm__pending_reclaim(pool, NULL, false);
    pm__central_release_empty_runs(pool);
    pm__pages_release(pool, keep);
}

pm_result pm_mem_pool_trim_to(pm_mem_pool_t handle, size_t min_bytes_to_keep)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_trim_to");
    pm__pool *pool = NULL;
    pm_result r = pm__pool_of_handle(handle, &pool);
    if (r != PM_SUCCESS)
        return r;
    pm__retire_poll(false);
    pm__caches_flush_pool(pool, false);
    pthread_mutex_lock(&pool->lock);
    release_down_to(pool, min_bytes_to_keep);
    pthread_mutex_unlock(&pool->lock);
    return PM_SUCCESS;
}

/* Used now: what the pool handed out less what threads' caches hold; and
 * the highest use any attached cache saw. pool->lock held. */
static unsigned long long used_now(pm__pool *pool, unsigned long long *cache_peak)
{
    long long used = atomic_load_explicit(&pool->handed, memory_order_relaxed), peak = 0;
    for (pm__cache *c = pool->caches; c; c = c->pool_next) {
        used -= atomic_load_explicit(&c->held, memory_order_relaxed);
        long long p = atomic_load_explicit(&c->used_peak, memory_order_relaxed);
        peak = p > peak ? p : peak;
    }
    if (cache_peak)
        *cache_peak = (unsigned long long)peak;
    return used > 0 ? (unsigned long long)used : 0;
}

/* USED_MEM_HIGH. Use grows only when an allocation takes a block; each
 * notes the pool's handed bytes less what its own thread's cache holds
 * (here, or as its cache's used_peak). That is exact when one thread uses
 * the pool. With several it may count blocks other threads' caches hold
 * free as used, so the answer is never below the true use at any moment,
 * and above it by at most what the caches held then; no allocation pays
 * for a shared counter. */
static unsigned long long used_high_now(pm__pool *pool)
{
    unsigned long long peaks = 0;
    used_now(pool, &peaks);
    return pool->used_high > peaks ? pool->used_high : peaks;
}

static pm_result set_int_attr(int *field, void *value)
{
    *field = *(int *)value != 0;
    return PM_SUCCESS;
}

static pm_result check_attribute_call(pm_mem_pool_t handle, pm__pool **pool, void *value,
                                      const char *call)
{
    pm_result r = pm__pool_of_handle(handle, pool);
    if (r == PM_SUCCESS && !value)
        r = pm__fail(PM_ERROR_INVALID_VALUE, "%s: value is NULL", call);
    return r;
}

pm_result pm_mem_pool_set_attribute(pm_mem_pool_t handle, pm_mem_pool_attribute attr, void *value)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_set_attribute");
    pm__pool *pool = NULL;
    pm_result r = check_attribute_call(handle, &pool, value, "pm_mem_pool_set_attribute");
    if (r != PM_SUCCESS)
        return r;
    bool reset_used_high = attr == PM_MEMPOOL_ATTR_USED_MEM_HIGH && *(uint64_t *)value == 0;
    if (reset_used_high)
        pm__caches_reset_peaks(pool); /* takes caches, so before the pool's lock */
    pthread_mutex_lock(&pool->lock);
    switch (attr) {
    case PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        r = set_int_attr(&pool->reuse_follow_event_deps, value);
        break;
    case PM_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        r = set_int_attr(&pool->reuse_opportunistic, value);
        break;
    case PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        r = set_int_attr(&pool->reuse_internal_deps, value);
        break;
    case PM_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = *(uint64_t *)value;
        break;
    case PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case PM_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(uint64_t *)value != 0) {
            r = pm__fail(PM_ERROR_INVALID_VALUE,
                         "pm_mem_pool_set_attribute: a high-water mark can only be reset to 0");
        } else if (attr == PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
            pool->reserved_high = pool->reserved;
        } else {
            pool->used_high = used_now(pool, NULL);
        }
        break;
    default:
        r = pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_set_attribute: attribute %d cannot be set",
                     (int)attr);
    }
    pthread_mutex_unlock(&pool->lock);
    return r;
}

pm_result pm_mem_pool_get_attribute(pm_mem_pool_t handle, pm_mem_pool_attribute attr, void *value)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_get_attribute");
    pm__pool *pool = NULL;
    pm_result r = check_attribute_call(handle, &pool, value, "pm_mem_pool_get_attribute");
    if (r != PM_SUCCESS)
        return r;
    pthread_mutex_lock(&pool->lock);
    unsigned long long used = used_now(pool, NULL);
    switch (attr) {
    case PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        *(int *)value = pool->reuse_follow_event_deps;
        break;
    case PM_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        *(int *)value = pool->reuse_opportunistic;
        break;
    case PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse_internal_deps;
        break;
    case PM_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(uint64_t *)value = pool->release_threshold;
        break;
    case PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(uint64_t *)value = pool->reserved;
        break;
    case PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(uint64_t *)value = pool->reserved_high;
        break;
    case PM_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(uint64_t *)value = used;
        break;
    case PM_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(uint64_t *)value = used_high_now(pool);
        break;
    default:
        r = pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_get_attribute: no attribute %d", (int)attr);
    }
    pthread_mutex_unlock(&pool->lock);
    return r;
}

static void flush_stream_of(void *handle, void *stream)
{
    pm__pool *pool = handle;
    pthread_mutex_lock(&pool->lock);
    bool follows = pool->reuse_follow_event_deps;
    pthread_mutex_unlock(&pool->lock);
    if (follows)
        pm__caches_flush_stream(pool, (pm_stream_t)stream);
}

/* Inside a host function no marker may be made (cuda: the driver refuses to
 * make events there), and a flush that cannot record one waits for the
 * stream instead, which may be the function's own: such blocks stay cached. */
static bool may_record_here(void)
{
    return pm__thread_calls_free() || !pm__host_func_thread_check();
}

void pm__pools_flush_stream(pm_stream_t s)
{
    if (may_record_here())
        pm__pools_for_each(flush_stream_of, (void *)s); /* as below */
}

static void flush_frees_on(void *handle, void *stream)
{
    pm_stream_t s = stream;
    pm__caches_flush_stream(handle, s);
    /* Work on a thread's own stream waits for the legacy stream's first, as
     * the driver orders them: frees cached on the legacy stream too. */
    if (pm__stream_is_threads_own(s))
        pm__caches_flush_stream(handle, PM_STREAM_LEGACY);
}

void pm__pools_flush_frees_on(pm_stream_t s)
{
    if (may_record_here())
        pm__pools_for_each(flush_frees_on, (void *)s);
}

static void settle_after_sync(void *handle, void *stream)
{
    pm__pool *pool = handle;
    pm_stream_t s = (pm_stream_t)stream;
    pm__caches_flush_stream(pool, s);
    pthread_mutex_lock(&pool->lock);
    if (pool->reserved > pool->release_threshold) {
        pthread_mutex_unlock(&pool->lock);
        pm__caches_flush_pool(pool, false);
        pthread_mutex_lock(&pool->lock);
        release_down_to(pool, pool->release_threshold);
    } else {
        pm__pending_reclaim(pool, s, false);
    }
    pthread_mutex_unlock(&pool->lock);
}

void pm__pools_after_sync(pm_stream_t s)
{
    if (!may_record_here()) /* its flushes would record markers: later, outside */
        return;
    /* The walk holds the set's lock throughout, so no pool in it can be
     * destroyed and torn down under it. That lock is the outermost: nothing
     * takes it while holding a cache's or a pool's lock. */
    pm__pools_for_each(settle_after_sync, (void *)s);
    pm__retire_poll(true);
}

static void add_stats(void *handle, void *stats)
{
    pm__pool *pool = handle;
    pm_pool_stats *st = stats;
    pthread_mutex_lock(&pool->lock);
    st->used += used_now(pool, NULL);
    long long requested = pool->requested, allocs = pool->allocs, frees = pool->frees,
              live = pool->live;
    for (pm__cache *c = pool->caches; c; c = c->pool_next) {
        requested += atomic_load_explicit(&c->requested, memory_order_relaxed);
        allocs += atomic_load_explicit(&c->allocs, memory_order_relaxed);
        frees += atomic_load_explicit(&c->frees, memory_order_relaxed);
        live += atomic_load_explicit(&c->allocs, memory_order_relaxed) -
                atomic_load_explicit(&c->frees, memory_order_relaxed);
    }
    st->requested += requested > 0 ? (unsigned long long)requested : 0;
    st->allocs += (unsigned long long)allocs;
    st->frees += (unsigned long long)frees;
    st->live += live > 0 ? (unsigned long long)live : 0;
    st->reserved += pool->reserved;
    st->reserved_high += pool->reserved_high;
    st->used_high += used_high_now(pool);
    st->chunks_pinned += pool->chunks_pinned;
    st->chunks_released += pool->chunks_released;
    st->pin_ns += pool->pin_ns;
    st->granule = pm__granule_to_fit(pm__pages_chunk_ops(pool), pm__pool_pinnable(pool),
                                     pool->props.max_size);
    st->granules_pinned += pool->granules_pinned;
    st->granules_released += pool->granules_released;
    st->granules_moved += pool->granules_moved;
    st->idle_granules += pool->idle_bytes;
    pm__pages_free_bytes(pool, &st->free_in_empty_chunks, &st->free_in_holes);
    pthread_mutex_unlock(&pool->lock);
}

/* All pools: a destroyed pool is listed before it leaves the live set, so
 * each walk finds it in one set or both; each walk's ticket counts it once.
 * Walks take turns, so that no other walk's ticket replaces one mid-walk. */
typedef struct stats_walk {
    pm_pool_stats *st;
    unsigned long long ticket;
} stats_walk;
static pthread_mutex_t stats_walk_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long stats_tickets; /* stats_walk_lock */

static void add_stats_once(void *handle, void *arg)
{
    pm__pool *pool = handle;
    stats_walk *w = arg;
    pthread_mutex_lock(&pool->lock);
    bool seen = pool->stats_ticket == w->ticket;
    pool->stats_ticket = w->ticket;
    pthread_mutex_unlock(&pool->lock);
    if (!seen)
        add_stats(pool, w->st);
}

pm_result pm_mem_pool_get_stats(pm_mem_pool_t handle, pm_pool_stats *stats)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_get_stats");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r0 = PM__STRUCT_SIZE_CHECK("pm_mem_pool_get_stats", stats);
    if (r0 != PM_SUCCESS)
        return r0;
    pm_pool_stats st = {.struct_size = sizeof st};
    if (handle) {
        pm_result r = check_pool(handle);
        if (r != PM_SUCCESS)
            return r;
        add_stats(handle, &st);
    } else {
        /* Pools are only torn down after leaving the set, which waits for
         * this walk, and the list of destroyed ones still in use, whose walk
         * holds its lock. Between the walks a destroy may move a pool. */
        pthread_mutex_lock(&stats_walk_lock);
        stats_walk w = {&st, ++stats_tickets};
        pm__pools_for_each(add_stats_once, &w);
        pm__retire_for_each_listed(add_stats_once, &w);
        pthread_mutex_unlock(&stats_walk_lock);
    }
    size_t n = stats->struct_size;
    st.struct_size = n;
    memcpy(stats, &st, n);
    return PM_SUCCESS;
}

pm_result pm_mem_pool_stats_json(pm_mem_pool_t pool, char *buf, size_t cap, size_t *needed)
{
    PM__NO_CANCEL;
    pm_pool_stats st = {.struct_size = sizeof st};
    pm_result r = pm_mem_pool_get_stats(pool, &st);
    if (r != PM_SUCCESS)
        return r;
    int len = snprintf(buf, buf ? cap : 0,
                       "{\"requested\":%llu,\"used\":%llu,\"reserved\":%llu,\"used_high\":%llu,"
                       "\"reserved_high\":%llu,\"allocs\":%llu,\"frees\":%llu,\"live\":%llu,"
                       "\"chunks_pinned\":%llu,\"chunks_released\":%llu,\"pin_ns\":%llu,"
                       "\"free_in_empty_chunks\":%llu,\"free_in_holes\":%llu,\"granule\":%llu,"
                       "\"granules_pinned\":%llu,\"granules_released\":%llu,"
                       "\"granules_moved\":%llu,\"idle_granules\":%llu}",
                       st.requested, st.used, st.reserved, st.used_high, st.reserved_high,
                       st.allocs, st.frees, st.live, st.chunks_pinned, st.chunks_released,
                       st.pin_ns, st.free_in_empty_chunks, st.free_in_holes, st.granule,
                       st.granules_pinned, st.granules_released, st.granules_moved,
                       st.idle_granules);
    if (needed)
        *needed = (size_t)len;
    if (!buf || (size_t)len >= cap)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_stats_json: needs %d bytes", len + 1);
    return PM_SUCCESS;
}
