/* Committing chunk memory granule by granule, and giving it back.
 *
 * A chunk is reserved address space; its memory is pinned in granules (the
 * driver's VMM host granule, 2 MiB, or the whole chunk where the backend
 * cannot do better). A granule holding any busy page stays committed. A
 * granule with none is idle: it is reused in place when an allocation lands
 * on it, and when an allocation lands on granules that are not committed
 * while others sit idle, the idle ones are given back first, so the pool's
 * pinned memory follows its allocations instead of growing around holes.
 * Everything here runs under pool->lock. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "../budget.h"
#include "../clock.h"
#include "../errors.h"
#include "pool_internal.h"

static size_t granule_bytes(const pm__chunk *c) { return c->granule_pages * PM__POOL_PAGE; }

size_t pm__pool_pinnable(const pm__pool *pool)
{
    size_t can = pool->backend->pinnable_bytes();
    const unsigned long long cap = pm__budget_cap(), pinned = pm__budget_pinned();
    if (cap != 0) {
        const unsigned long long left = pinned < cap ? cap - pinned : 0;
        if (left < can)
            can = (size_t)left;
    }
    return can;
}

size_t pm__granule_to_fit(const pm__chunk_ops *ops, size_t pinnable, size_t max_size)
{
    size_t granule = ops->granule;
    size_t least = ops->granule_min > PM__POOL_PAGE ? ops->granule_min : PM__POOL_PAGE;
    size_t usable = max_size - max_size % PM__POOL_PAGE;
    /* A quarter of the headroom, so that small pools fit under the limit;
     * a divisor of max_size, so that all of it can be pinned. */
    while (granule > least && ((pinnable != SIZE_MAX && granule > pinnable / 4) ||
                               (max_size && usable % granule != 0)))
        granule /= 2;
    return granule;
}

pm_result pm__granules_init(pm__chunk *c, size_t granule)
{
    c->granule_pages = granule && granule < c->len ? granule / PM__POOL_PAGE : c->npages;
    c->ngranules = (c->npages + c->granule_pages - 1) / c->granule_pages;
    c->granules = calloc(c->ngranules, sizeof *c->granules);
    return c->granules ? PM_SUCCESS
                       : pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
}

void pm__granules_mark(pm__pool *pool, pm__chunk *c, size_t first, size_t npages, bool busy)
{
    size_t end = first + npages;
    for (size_t g = first / c->granule_pages; g * c->granule_pages < end; g++) {
        size_t lo = g * c->granule_pages, hi = lo + c->granule_pages;
        uint32_t n = (uint32_t)((hi < end ? hi : end) - (lo > first ? lo : first));
        pm__granule *gr = &c->granules[g];
        bool was_idle = gr->committed && gr->busy == 0;
        gr->busy = busy ? gr->busy + n : gr->busy - n;
        bool idle = gr->committed && gr->busy == 0;
        if (idle != was_idle) {
            c->idle_granules += idle ? 1 : (size_t)-1;
            pool->idle_bytes += idle ? granule_bytes(c) : -granule_bytes(c);
        }
    }
}

size_t pm__granules_missing(const pm__chunk *c, size_t first, size_t npages)
{
    size_t missing = 0;
    for (size_t g = first / c->granule_pages; g * c->granule_pages < first + npages; g++)
        if (!c->granules[g].committed)
            missing += granule_bytes(c);
    return missing;
}

static void decommit(pm__pool *pool, pm__chunk *c, size_t g)
{
    size_t len = granule_bytes(c);
    unsigned long long t0 = pm__now_ns();
    c->ops->decommit(c->base + g * len, len);
    pool->pin_ns += pm__now_ns() - t0;
    pm__budget_give(len);
    c->granules[g].committed = false;
    c->committed_granules--;
    c->idle_granules--;
    pool->idle_bytes -= len;
    pool->reserved -= len;
    pool->granules_released++;
}

unsigned long long pm__granules_give_back(pm__pool *pool, pm__chunk *c, unsigned long long keep,
                                          unsigned long long budget)
{
    unsigned long long given = 0, len = granule_bytes(c);
    /* reserved - len cannot wrap while c has an idle granule; keep + len could */
    for (size_t g = c->ngranules; g-- > 0 && c->idle_granules > 0;) {
        if (given + len > budget || pool->reserved - len < keep)
            break;
        if (c->granules[g].committed && c->granules[g].busy == 0) {
            decommit(pool, c, g);
            given += len;
        }
    }
    return given;
}

void pm__granules_after_free(pm__pool *pool, pm__chunk *c)
{
    if (c->idle_granules > 0 && !c->ops->give_back_waits && pool->reserved > pool->release_threshold)
        pm__granules_give_back(pool, c, pool->release_threshold, ULLONG_MAX);
}

/* Gives back idle granules anywhere in the pool, up to bytes, so that
 * committing as much elsewhere does not grow it. */
static void move_idle(pm__pool *pool, size_t bytes)
{
    unsigned long long given = 0;
    for (size_t i = pool->n_chunks; i-- > 0 && given < bytes && pool->idle_bytes > 0;)
        if (pool->chunks[i]->idle_granules > 0 && !pool->chunks[i]->ops->give_back_waits) {
            unsigned long long got = pm__granules_give_back(pool, pool->chunks[i], 0, bytes - given);
            given += got;
            pool->granules_moved += got / granule_bytes(pool->chunks[i]);
        }
}

/* Commits granules [g, g + n) of c, none of them committed. */
static pm_result commit(pm__pool *pool, pm__chunk *c, size_t g, size_t n)
{
    size_t len = n * granule_bytes(c);
    if (pool->props.max_size && pool->reserved + len > pool->props.max_size)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                        "the pool's max_size (%zu bytes) leaves no room: %llu reserved, "
                        "%zu more needed",
                        pool->props.max_size, pool->reserved, len);
    if (PM__TEST_FAULT(pool->fail_pin_countdown))
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pinning pool memory failed (injected fault)");
    unsigned long long t0 = pm__now_ns();
    pm_result r = pm__budget_take(len, "memory pool");
    if (r == PM_SUCCESS) {
        r = c->ops->commit(c->base + g * granule_bytes(c), len, pool->numa_node);
        if (r != PM_SUCCESS)
            pm__budget_give(len);
    }
    pool->pin_ns += pm__now_ns() - t0;
    if (r != PM_SUCCESS)
        return r;
    for (size_t i = g; i < g + n; i++) {
        c->granules[i].committed = true;
        if (c->granules[i].busy == 0) {
            c->idle_granules++;
            pool->idle_bytes += granule_bytes(c);
        }
    }
    c->committed_granules += n;
    pool->reserved += len;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    pool->granules_pinned += n;
    return PM_SUCCESS;
}

/* Whether bytes more can be pinned (after movable bytes are given back):
 * asked before pinning anything, so that a request the system's limit
 * dooms fails at once, with nothing locked and no page touched. */
static pm_result check_pinnable(const pm__backend *b, size_t bytes, size_t movable)
{
    size_t can = b->pinnable_bytes();
    if (can == SIZE_MAX || bytes <= can || bytes - can <= movable)
        return PM_SUCCESS;
    struct rlimit rl;
    if (b->caps.pinning_limited_by_memlock_rlimit &&
        getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                        "pool memory: pinning %zu more bytes would pass RLIMIT_MEMLOCK "
                        "(%llu KiB, %zu KiB of it left); raise it with 'ulimit -l' or memlock "
                        "in /etc/security/limits.conf, or grant CAP_IPC_LOCK",
                        bytes, (unsigned long long)rl.rlim_cur / 1024, can / 1024);
    return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                    "pool memory: pinning %zu more bytes would pass the system's limit "
                    "(%zu bytes left)",
                    bytes, can);
}

pm_result pm__granules_commit(pm__pool *pool, pm__chunk *c, size_t first, size_t npages, bool move)
{
    size_t missing = pm__granules_missing(c, first, npages);
    if (missing == 0)
        return PM_SUCCESS;
    move = move && !c->ops->give_back_waits;
    /* One granule's pinning fails before touching a page when it cannot
     * pass the limit; more may be pinned in several runs, or touched by
     * many threads first (backend.h). */
    if (missing > granule_bytes(c)) {
        pm_result r = check_pinnable(pool->backend, missing, move ? pool->idle_bytes : 0);
        if (r != PM_SUCCESS)
            return r;
    }
    if (move)
        move_idle(pool, missing);
    size_t g = first / c->granule_pages, end = (first + npages + c->granule_pages - 1) / c->granule_pages;
    while (g < end) {
        if (c->granules[g].committed) {
            g++;
            continue;
        }
        size_t n = 1;
        while (g + n < end && !c->granules[g + n].committed)
            n++;
        pm_result r = commit(pool, c, g, n);
        if (r != PM_SUCCESS)
            return r;
        g += n;
    }
    return PM_SUCCESS;
}

unsigned long long pm__granules_free_committed(const pm__chunk *c)
{
    unsigned long long pages = 0;
    for (size_t g = 0; g < c->ngranules; g++)
        if (c->granules[g].committed) {
            size_t lo = g * c->granule_pages;
            size_t span = lo + c->granule_pages <= c->npages ? c->granule_pages : c->npages - lo;
            pages += span - c->granules[g].busy;
        }
    return pages * PM__POOL_PAGE;
}
