/* Blocks freed on a stream wait here, behind a marker recorded on that
 * stream, until the stream's work before the free is done; then they are
 * ordinary free blocks again. (Same-stream reuse before then happens in the
 * freeing thread's cache, which hands them only to that stream.)
 * Everything here runs under pool->lock. */
#include <stdlib.h>
#include <string.h>

#include "../errors.h"
#include "pool_internal.h"

pm_result pm__pending_add(pm__pool *pool, pm_stream_t s, void **blocks, size_t n)
{
    pm__pending *p = malloc(sizeof *p);
    void **copy = malloc(n * sizeof *copy);
    pm_result r = PM_ERROR_OUT_OF_MEMORY;
    if (p && copy)
        r = pm__pool_backend()->marker_record(s, &p->marker);
    else
        pm__fail(r, "out of memory for a pending free");
    if (r != PM_SUCCESS) {
        free(p);
        free(copy);
        return r;
    }
    memcpy(copy, blocks, n * sizeof *copy);
    p->stream = s;
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
        if (span->kind == SPAN_LARGE)
            pm__pages_free(pool, span);
        else
            pm__central_free_block(pool, span, p->blocks[i]);
    }
    pm__pool_backend()->marker_release(&p->marker);
    free(p->blocks);
    free(p);
}

size_t pm__pending_reclaim(pm__pool *pool, pm_stream_t s, bool async)
{
    const pm__backend *b = pm__pool_backend();
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

void pm__pending_release_all(pm__pool *pool)
{
    while (pool->pending) {
        pm__pending *p = pool->pending;
        pool->pending = p->next;
        give_back(pool, p);
    }
}
