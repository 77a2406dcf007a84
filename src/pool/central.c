/* Runs of small blocks (one size class per run, free blocks kept as an index
 * stack beside the memory) and large allocations (one span each). A run whose
 * blocks are all free goes back to the page allocator, so trim can give whole
 * chunks back. Everything here runs under pool->lock. */
#include <stdlib.h>

#include "../errors.h"
#include "pool_internal.h"

static bool ensure_capacity(pm__pool *pool, pm__span *s, uint32_t n, uint32_t stride)
{
    s->req_stride = stride;
    if (s->cap_blocks >= n * stride)
        return true;
    /* Room to bury the old arrays, made first so that nothing leaks. */
    if (s->requested && !pm__graveyard_room(pool, 1))
        return false;
    _Atomic uint64_t *requested = calloc((size_t)n * stride, sizeof *requested);
    uint32_t *free_idx = malloc((size_t)n * stride * sizeof *free_idx);
    if (!requested || !free_idx) {
        free(requested);
        free(free_idx);
        return false;
    }
    /* The old arrays may still be read by a racing query: keep them. */
    if (s->requested)
        pm__keep_until_pool_dies(pool, (void *)s->requested);
    free(s->free_idx);
    s->requested = requested;
    s->free_idx = free_idx;
    s->cap_blocks = n * stride;
    return true;
}

static void partial_add(pm__pool *pool, pm__span *run)
{
    run->partial_prev = NULL;
    run->partial_next = pool->partial[run->cls];
    if (run->partial_next)
        run->partial_next->partial_prev = run;
    pool->partial[run->cls] = run;
    run->in_partial = true;
}

static void partial_remove(pm__pool *pool, pm__span *run)
{
    if (run->partial_prev)
        run->partial_prev->partial_next = run->partial_next;
    else
        pool->partial[run->cls] = run->partial_next;
    if (run->partial_next)
        run->partial_next->partial_prev = run->partial_prev;
    run->in_partial = false;
}

static pm__span *new_run(pm__pool *pool, unsigned cls, pm_result *why)
{
    size_t pages = pm__class_run_pages(cls);
    pm__span *run = pm__pages_alloc(pool, pages, why);
    if (!run)
        return NULL;
    uint32_t n = (uint32_t)(pages * PM__POOL_PAGE / pm__class_size(cls));
    if (!ensure_capacity(pool, run, n, pm__class_size(cls) >= 1024 ? 8 : 1)) {
        pm__pages_free(pool, run);
        *why = pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
        return NULL;
    }
    run->kind = SPAN_RUN;
    run->cls = cls;
    run->nblocks = run->nfree = n;
    run->run_hot.base = run->chunk->base + run->first * PM__POOL_PAGE;
    run->run_hot.div_magic = pm__classes[cls].div_magic;
    run->run_hot.size = (uint32_t)pm__class_size(cls);
    run->run_hot.bytes = (size_t)n * pm__class_size(cls);
    run->run_hot.nblocks = n;
    run->run_hot.requested = run->requested;
    run->run_hot.req_stride = run->req_stride;
    run->run_hot.cls = (uint16_t)cls;
    run->run_hot.pool_slot = (uint16_t)pool->slot;
    run->run_hot.pool = pool;
    run->run_hot.pool_generation = pool->generation;
    for (uint32_t i = 0; i < n; i++) {
        run->free_idx[i] = n - 1 - i; /* lowest addresses first */
        atomic_store_explicit(pm__requested(run, i), 0, memory_order_relaxed);
    }
    partial_add(pool, run);
    return run;
}

size_t pm__central_take(pm__pool *pool, unsigned cls, void **out, _Atomic uint64_t **req,
                        size_t want, pm_result *why)
{
    const size_t size = pm__class_size(cls);
    size_t got = 0;
    while (got < want) {
        pm__span *run = pool->partial[cls];
        if (!run && !(run = new_run(pool, cls, why)))
            break;
        uint8_t *base = run->chunk->base + run->first * PM__POOL_PAGE;
        while (got < want && run->nfree > 0) {
            uint32_t index = run->free_idx[--run->nfree];
            if (req)
                req[got] = pm__requested(run, index);
            out[got++] = base + (size_t)index * size;
            pm__pool_handed_add(pool, (long long)size);
        }
        if (run->nfree == 0)
            partial_remove(pool, run);
    }
    return got;
}

void pm__central_free_block(pm__pool *pool, pm__span *run, void *block)
{
    pm__pool_handed_add(pool, -(long long)pm__class_size(run->cls));
    uint8_t *base = run->chunk->base + run->first * PM__POOL_PAGE;
    run->free_idx[run->nfree++] = (uint32_t)pm__class_index(run->cls, (size_t)((uint8_t *)block - base));
    if (!run->in_partial)
        partial_add(pool, run);
    /* An empty run goes back to the pages, unless it is a one-page run and
     * the class's only one (alloc/free around one small block must not carve
     * and return a run each time). */
    if (run->nfree == run->nblocks &&
        (run->npages > 1 || run->partial_prev || run->partial_next)) {
        partial_remove(pool, run);
        pm__pages_free(pool, run);
    }
}

bool pm__central_fits(pm__pool *pool, size_t bytesize, unsigned cls)
{
    if (cls < PM__POOL_CLASSES)
        return pool->partial[cls] || pm__pages_fit(pool, pm__class_run_pages(cls));
    return pm__pages_fit(pool, (bytesize + PM__POOL_PAGE - 1) / PM__POOL_PAGE);
}

void *pm__central_alloc(pm__pool *pool, size_t bytesize, unsigned cls, pm_result *why)
{
    if (cls < PM__POOL_CLASSES) {
        void *block = NULL;
        if (pm__central_take(pool, cls, &block, NULL, 1, why) != 1)
            return NULL;
        return block;
    }
    size_t pages = (bytesize + PM__POOL_PAGE - 1) / PM__POOL_PAGE;
    pm__span *s = pm__pages_alloc(pool, pages, why);
    if (!s)
        return NULL;
    if (!ensure_capacity(pool, s, 1, 1)) {
        pm__pages_free(pool, s);
        *why = pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
        return NULL;
    }
    s->kind = SPAN_LARGE;
    s->nblocks = 1;
    atomic_store_explicit(pm__requested(s, 0), 0, memory_order_relaxed);
    pm__pool_handed_add(pool, (long long)(pages * PM__POOL_PAGE));
    return s->chunk->base + s->first * PM__POOL_PAGE;
}

void pm__central_free_large(pm__pool *pool, pm__span *span)
{
    pm__pool_handed_add(pool, -(long long)(span->npages * PM__POOL_PAGE));
    pm__pages_free(pool, span);
}

void pm__central_release_empty_runs(pm__pool *pool)
{
    for (unsigned k = 0; k < PM__POOL_CLASSES; k++) {
        for (pm__span *run = pool->partial[k], *next; run; run = next) {
            next = run->partial_next;
            if (run->nfree == run->nblocks) {
                partial_remove(pool, run);
                pm__pages_free(pool, run);
            }
        }
    }
}
