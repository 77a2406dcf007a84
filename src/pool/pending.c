/* Blocks freed on a stream wait here, behind a marker recorded on that
 * stream, until the stream's work before the free is done; then they are
 * ordinary free blocks again. (Same-stream reuse before then happens in the
 * freeing thread's cache, which hands them only to that stream.)
 * Everything here runs under pool->lock. */
#include <stdlib.h>
#include <string.h>

#include "../errors.h"
#include "../stream_order.h"
#include "pool_internal.h"

pm_result pm__pending_add(pm__pool *pool, pm_stream_t s, void **blocks, size_t n)
{
    pm__pending *p = malloc(sizeof *p);
    void **copy = malloc(n * sizeof *copy);
    pm_result r = PM_ERROR_OUT_OF_MEMORY;
    if (p && copy)
        r = pool->backend->marker_record(s, &p->marker);
    else
        pm__fail(r, "out of memory for a pending free");
    if (r != PM_SUCCESS) {
        free(p);
        free(copy);
        return r;
    }
    memcpy(copy, blocks, n * sizeof *copy);
    for (size_t i = 0; i < n; i++) { /* free now, though not yet reusable */
        pm__chunk *chunk;
        pm__span *span = pm__span_of((uintptr_t)blocks[i], &chunk);
        pm__pool_handed_add(pool, -(long long)pm__block_bytes(span));
    }
    p->stream = s;
    p->id_known = pool->backend->stream_id(s, &p->stream_id) == PM_SUCCESS;
    p->tick = pm__order_now();
    p->n = p->cap = n;
    p->blocks = copy;
    p->next = pool->pending;
    pool->pending = p;
    return PM_SUCCESS;
}

static void give_back(pm__pool *pool, pm__pending *p)
{
    for (size_t i = 0; i < p->n; i++) {
        pm__chunk *chunk;
        pm__span *span = pm__span_of((uintptr_t)p->blocks[i], &chunk);
        pm__pool_handed_add(pool, (long long)pm__block_bytes(span)); /* counted free already */
        if (span->kind == SPAN_LARGE)
            pm__central_free_large(pool, span);
        else
            pm__central_free_block(pool, span, p->blocks[i]);
    }
    pool->backend->marker_release(&p->marker);
    free(p->blocks);
    free(p);
}

size_t pm__pending_reclaim(pm__pool *pool, pm_stream_t s, bool async)
{
    const pm__backend *b = pool->backend;
    size_t reclaimed = 0;
    for (pm__pending **link = &pool->pending; *link;) {
        pm__pending *p = *link;
        /* Without opportunistic reuse, an asynchronous allocation takes only
         * what its own stream freed. */
        bool allowed = !async || pool->reuse_opportunistic || p->stream == s;
        if (allowed && b->marker_done(&p->marker)) {
            *link = p->next;
            reclaimed += p->n;
            give_back(pool, p);
        } else {
            link = &p->next;
        }
    }
    return reclaimed;
}

/* Whether block (pending, so still allocated in its run or span) serves
 * bytesize of class cls: the same class, or a large span rounded up by no
 * more than an allocation of its own would be, plus 1/8. */
static bool serves(void *block, size_t bytesize, unsigned cls)
{
    pm__chunk *chunk;
    pm__span *span = pm__span_of((uintptr_t)block, &chunk);
    if (cls < PM__POOL_CLASSES)
        return span->kind == SPAN_RUN && span->cls == cls;
    size_t have = span->npages * PM__POOL_PAGE;
    return span->kind == SPAN_LARGE && have >= bytesize && have - bytesize <= bytesize / 8 + PM__POOL_PAGE;
}

/* Block i of the batch at *link, taken out of it (and the batch freed when
 * it was its last). */
static void *take_block(pm__pool *pool, pm__pending **link, size_t i)
{
    pm__pending *p = *link;
    void *block = p->blocks[i];
    pm__chunk *chunk;
    pm__pool_handed_add(pool, (long long)pm__block_bytes(pm__span_of((uintptr_t)block, &chunk)));
    p->blocks[i] = p->blocks[--p->n];
    if (p->n == 0) {
        *link = p->next;
        pool->backend->marker_release(&p->marker);
        free(p->blocks);
        free(p);
    }
    return block;
}

/* The first block of another stream's batch that serves the request and
 * that usable(batch) allows: where it is, as a link and an index. */
static bool find_serving(pm__pool *pool, pm_stream_t s, size_t bytesize, unsigned cls,
                         bool (*usable)(const pm__pending *p, const void *arg), const void *arg,
                         pm__pending ***at, size_t *index)
{
    for (pm__pending **link = &pool->pending; *link; link = &(*link)->next) {
        pm__pending *p = *link;
        if (p->stream == s || !usable(p, arg))
            continue;
        for (size_t i = 0; i < p->n; i++) {
            if (serves(p->blocks[i], bytesize, cls)) {
                *at = link;
                *index = i;
                return true;
            }
        }
    }
    return false;
}

static bool any_batch(const pm__pending *p, const void *unused)
{
    (void)p;
    (void)unused;
    return true;
}

void *pm__pending_take_ordered(pm__pool *pool, pm_stream_t s, size_t bytesize, unsigned cls)
{
    pm__pending **link;
    size_t i;
    if (!find_serving(pool, s, bytesize, cls, any_batch, NULL, &link, &i))
        return NULL;
    if (pool->backend->marker_wait(s, &(*link)->marker) != PM_SUCCESS)
        return NULL; /* no dependency, no reuse */
    return take_block(pool, link, i);
}

/* Whether the batch was freed before a point that the stream whose id is
 * *arg waits for. */
static bool followed(const pm__pending *p, const void *arg)
{
    return p->id_known && pm__order_follows(*(const unsigned long long *)arg, p->stream_id, p->tick);
}

void *pm__pending_take_followed(pm__pool *pool, pm_stream_t s, size_t bytesize, unsigned cls)
{
    unsigned long long id;
    pm__pending **link;
    size_t i;
    if (pool->backend->stream_id(s, &id) != PM_SUCCESS ||
        !find_serving(pool, s, bytesize, cls, followed, &id, &link, &i))
        return NULL;
    return take_block(pool, link, i); /* s's work already waits for the free */
}

void pm__pending_release_all(pm__pool *pool)
{
    while (pool->pending) {
        pm__pending *p = pool->pending;
        pool->pending = p->next;
        give_back(pool, p);
    }
}
