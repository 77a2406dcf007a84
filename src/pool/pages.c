/* Pool chunks and the page allocator: free spans of 64 KiB pages in size
 * bins (eight per doubling, with a bitmap), so finding a span costs the same
 * however many holes there are; freed spans merge with free neighbours.
 * Everything here runs under pool->lock. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../budget.h"
#include "../clock.h"
#include "../errors.h"
#include "pool_internal.h"

#ifdef PINMEM_TEST_HOOKS
_Atomic bool pm__pool_whole_chunks;
static pthread_mutex_t whole_lock = PTHREAD_MUTEX_INITIALIZER;
static pm__chunk_ops whole_keep, whole_give_back; /* made once, from the first pool's backend */
static bool whole_made;

/* ops, or with pm__pool_whole_chunks the same pinned whole, where they
 * take chunks of any length. */
static const pm__chunk_ops *test_chunk_ops(const pm__backend *b, const pm__chunk_ops *ops)
{
    if (!atomic_load(&pm__pool_whole_chunks) || ops->granule_min != 0)
        return ops;
    pthread_mutex_lock(&whole_lock);
    if (!whole_made) {
        whole_keep = b->pool_keep;
        whole_give_back = b->pool_give_back;
        whole_keep.granule = whole_give_back.granule = 0;
        whole_keep.give_back_waits = whole_give_back.give_back_waits = true;
        whole_made = true;
    }
    pthread_mutex_unlock(&whole_lock);
    return ops == &b->pool_keep ? &whole_keep : &whole_give_back;
}
#else
#define test_chunk_ops(b, ops) (ops)
#endif

const pm__chunk_ops *pm__pages_chunk_ops(const pm__pool *pool)
{
    bool keep = pool->release_threshold == PM_MEMPOOL_DEFAULT_RELEASE_THRESHOLD;
    return test_chunk_ops(pool->backend, keep ? pool->keep_ops : pool->give_back_ops);
}

static unsigned bin_floor(size_t n)
{
    if (n <= 8)
        return (unsigned)n - 1;
    unsigned k = 63 - (unsigned)__builtin_clzll(n);
    unsigned b = 8 + (k - 3) * 8 + (unsigned)((n - ((size_t)1 << k)) >> (k - 3));
    return b < PM__SPAN_BINS ? b : PM__SPAN_BINS - 1;
}

static size_t bin_min(unsigned b)
{
    if (b < 8)
        return (size_t)b + 1;
    unsigned k = 3 + (b - 8) / 8;
    return ((size_t)1 << k) + (size_t)((b - 8) % 8) * ((size_t)1 << (k - 3));
}

/* The first bin whose every span has at least n pages. */
static unsigned bin_ceil(size_t n)
{
    unsigned b = bin_floor(n);
    return bin_min(b) == n ? b : b + 1;
}

static void bin_insert(pm__pool *pool, pm__span *s)
{
    unsigned b = bin_floor(s->npages);
    s->bin_prev = NULL;
    s->bin_next = pool->bins[b];
    if (s->bin_next)
        s->bin_next->bin_prev = s;
    pool->bins[b] = s;
    pool->bin_mask[b / 64] |= 1ull << (b % 64);
}

static void bin_remove(pm__pool *pool, pm__span *s)
{
    unsigned b = bin_floor(s->npages);
    if (s->bin_prev)
        s->bin_prev->bin_next = s->bin_next;
    else
        pool->bins[b] = s->bin_next;
    if (s->bin_next)
        s->bin_next->bin_prev = s->bin_prev;
    if (!pool->bins[b])
        pool->bin_mask[b / 64] &= ~(1ull << (b % 64));
}

static uintptr_t span_address(const pm__span *s)
{
    return (uintptr_t)s->chunk->base + s->first * PM__POOL_PAGE;
}

/* Where a request of n pages would go in a free span: at its start or its
 * end, whichever needs fewer bytes committed, and how many. */
typedef struct placement {
    pm__span *span;
    bool at_end;
    size_t missing;
} placement;

static placement place(pm__span *s, size_t n)
{
    placement p = {s, false, pm__granules_missing(s->chunk, s->first, n)};
    if (p.missing && s->npages > n) {
        size_t at_end = pm__granules_missing(s->chunk, s->first + s->npages - n, n);
        if (at_end < p.missing) {
            p.at_end = true;
            p.missing = at_end;
        }
    }
    return p;
}

/* Whether a is the better of two placements: pinned memory is what the pool
 * spends, address space is free, so first the fewer bytes to commit; then
 * the smaller span, and of equal ones the lower. Best fit keeps large holes
 * whole for large requests, and filling low addresses first lets high ones
 * merge and empty whole chunks. */
static bool better_fit(const placement *a, const placement *b)
{
    if (a->missing != b->missing)
        return a->missing < b->missing;
    return a->span->npages < b->span->npages ||
           (a->span->npages == b->span->npages && span_address(a->span) < span_address(b->span));
}

/* Folds the first FIT_LOOK spans of bin b that hold n pages into best.
 * Looking at a bounded number keeps the cost flat with many holes. */
enum { FIT_LOOK = 32, FIT_BINS = 4 };
static void best_in_bin(pm__pool *pool, unsigned b, size_t n, placement *best)
{
    int looked = 0;
    for (pm__span *s = pool->bins[b]; s && looked < FIT_LOOK; s = s->bin_next, looked++)
        if (s->npages >= n) {
            placement p = place(s, n);
            if (!best->span || better_fit(&p, best))
                *best = p;
        }
}

/* The request's own bin may hold spans that fit closely; then the non-empty
 * bins above it, whose every span fits, until a placement needs nothing
 * committed or FIT_BINS bins were looked at. */
static placement bin_find(pm__pool *pool, size_t n)
{
    placement best = {0};
    best_in_bin(pool, bin_floor(n), n, &best);
    int bins = 0;
    for (unsigned b = bin_ceil(n); b < PM__SPAN_BINS && bins < FIT_BINS &&
                                   (!best.span || best.missing > 0);) {
        uint64_t bits = pool->bin_mask[b / 64] & (~0ull << (b % 64));
        if (!bits) {
            b = (b | 63) + 1;
            continue;
        }
        unsigned found = (b & ~63u) + (unsigned)__builtin_ctzll(bits);
        best_in_bin(pool, found, n, &best);
        bins++;
        b = found + 1;
    }
    return best;
}

bool pm__graveyard_room(pm__pool *pool, size_t extra)
{
    const size_t want = pool->n_graveyard + pool->n_chunks + extra;
    if (want <= pool->cap_graveyard)
        return true;
    size_t cap = pool->cap_graveyard ? 2 * pool->cap_graveyard : 16;
    while (cap < want)
        cap *= 2;
    void **bigger = realloc(pool->graveyard, cap * sizeof *bigger);
    if (!bigger)
        return false;
    pool->graveyard = bigger;
    pool->cap_graveyard = cap;
    return true;
}

void pm__keep_until_pool_dies(pm__pool *pool, void *p)
{
    /* Room was made beforehand (pm__graveyard_room); this is a last resort. */
    if (pool->n_graveyard == pool->cap_graveyard && !pm__graveyard_room(pool, 1))
        return; /* leaks p rather than risk a reader following it */
    pool->graveyard[pool->n_graveyard++] = p;
}

static pm__span *new_span(pm__pool *pool)
{
    pm__span *s = pool->spare_spans;
    if (s) {
        pool->spare_spans = s->bin_next;
        _Atomic uint64_t *requested = s->requested;
        uint32_t *free_idx = s->free_idx;
        uint32_t cap = s->cap_blocks;
        uint32_t incarnation = atomic_load_explicit(&s->run_hot.incarnation, memory_order_relaxed);
        memset(s, 0, sizeof *s);
        atomic_store_explicit(&s->run_hot.incarnation, incarnation, memory_order_relaxed);
        s->requested = requested;
        s->free_idx = free_idx;
        s->cap_blocks = cap;
        return s;
    }
    return calloc(1, sizeof *s);
}

/* Spans are reused, never freed, while the pool lives: a free of a stale
 * pointer then reads a span that exists, not freed memory. */
static void retire_span(pm__pool *pool, pm__span *s)
{
    s->bin_next = pool->spare_spans;
    pool->spare_spans = s;
}

static void set_pages(pm__span *s)
{
    for (size_t i = 0; i < s->npages; i++)
        atomic_store_explicit(&s->chunk->pages[s->first + i], s, memory_order_release);
}

static void release_chunk(pm__pool *pool, size_t index);

/* The bytes max_size still lets the pool commit in a new chunk of ops:
 * besides what is free of it, the idle granules that committing there
 * would move (pm__granules_commit). */
static size_t room_left(const pm__pool *pool, const pm__chunk_ops *ops)
{
    if (!pool->props.max_size)
        return SIZE_MAX;
    unsigned long long held = pool->reserved;
    if (!ops->give_back_waits)
        for (size_t i = 0; i < pool->n_chunks; i++) {
            const pm__chunk *c = pool->chunks[i];
            if (!c->ops->give_back_waits)
                held -= c->idle_granules * c->granule_pages * PM__POOL_PAGE;
        }
    return held < pool->props.max_size ? pool->props.max_size - held : 0;
}

/* The length of a new chunk for need bytes: whole steps of address space,
 * except that a chunk pinned whole is never larger than room (nor than
 * half of what may still be pinned), so that a small max_size or memlock
 * limit leaves the pool usable. */
static size_t chunk_length(size_t need, size_t granule, size_t room, size_t pinnable)
{
    size_t len = (need + PM__CHUNK_STEP - 1) / PM__CHUNK_STEP * PM__CHUNK_STEP;
    if (granule != 0)
        return len;
    size_t cap = room < pinnable / 2 ? room : pinnable / 2;
    cap -= cap % PM__POOL_PAGE;
    if (cap < len)
        len = cap > need ? cap : need;
    return len;
}

/* Frees a chunk's bookkeeping before the chunk is published, and its span. */
static void drop_new_chunk(pm__pool *pool, pm__chunk *chunk, pm__span *span)
{
    if (chunk)
        free(chunk->granules);
    free(chunk);
    if (span)
        retire_span(pool, span);
}

/* The bookkeeping of a chunk of len bytes, a span for it and room for it in
 * the pool's list of chunks; NULL, leaving nothing behind, where memory for
 * any of them runs out. */
static pm__chunk *new_chunk(pm__pool *pool, const pm__chunk_ops *ops, size_t len, size_t granule,
                            pm__span **span_out)
{
    pm__chunk *chunk = calloc(1, sizeof *chunk + (len / PM__POOL_PAGE) * sizeof chunk->pages[0]);
    pm__span *span = new_span(pool);
    if (pool->n_chunks == pool->cap_chunks) {
        size_t cap = pool->cap_chunks ? 2 * pool->cap_chunks : 8;
        pm__chunk **bigger = realloc(pool->chunks, cap * sizeof *bigger);
        if (bigger) {
            pool->chunks = bigger;
            pool->cap_chunks = cap;
        }
    }
    if (chunk) {
        chunk->ops = ops; /* before lock-free readers can find the chunk */
        chunk->len = len;
        chunk->npages = chunk->free_pages = len / PM__POOL_PAGE;
    }
    /* The chunk's grave is made now: releasing it (release_chunk) cannot fail. */
    if (!chunk || !span || pool->n_chunks == pool->cap_chunks || !pm__graveyard_room(pool, 1) ||
        pm__granules_init(chunk, granule) != PM_SUCCESS) {
        drop_new_chunk(pool, chunk, span);
        return NULL;
    }
    *span_out = span;
    return chunk;
}

/* Reserves address space for a chunk that holds npages_needed pages. */
static pm_result add_chunk(pm__pool *pool, size_t npages_needed, pm__chunk **out)
{
    size_t need = npages_needed * PM__POOL_PAGE;
    const pm__chunk_ops *ops = pm__pages_chunk_ops(pool);
    size_t room = room_left(pool, ops);
    if (need > room)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                        "the pool's max_size (%zu bytes) leaves no room: %llu reserved, "
                        "%zu more needed",
                        pool->props.max_size, pool->reserved, need);

    const size_t pinnable = pm__pool_pinnable(pool);
    const size_t granule = pm__granule_to_fit(ops, pinnable, pool->props.max_size);
    const size_t len = chunk_length(need, granule, room, pinnable);
    pm__span *span = NULL;
    pm__chunk *chunk = new_chunk(pool, ops, len, granule, &span);
    if (!chunk)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
    void *base = NULL;
    pm_result r = ops->reserve(len, PM__CHUNK_STEP, pool->numa_node, &base);
    if (r != PM_SUCCESS) {
        drop_new_chunk(pool, chunk, span);
        return r;
    }
    pm__range range = {.base = (uintptr_t)base, .size = len, .pin_base = (uintptr_t)base,
                       .pin_len = len, .flags = PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP,
                       .kind = PM__RANGE_POOL};
    pm__range conflict = {0};
    if (!pm__chunk_map_set((uintptr_t)base, len, chunk) ||
        !pm__ranges_claim(pool->ranges, &range, &conflict)) {
        pm__chunk_map_set((uintptr_t)base, len, NULL);
        ops->unreserve(base, len);
        drop_new_chunk(pool, chunk, span);
        /* Below the map's 48 bits and with nothing in the way, what failed
         * was memory for the map's leaf or the claim's node. */
        if (((uintptr_t)base + len - 1) >> 48 == 0 && conflict.kind == 0)
            return pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
        return pm__fail(PM_ERROR_NOT_SUPPORTED, "a pool chunk landed where pinmem cannot track it");
    }
    pm__ranges_publish(pool->ranges, &range);
    chunk->pool = pool;
    chunk->base = base;
    span->chunk = chunk;
    span->first = 0;
    span->npages = chunk->npages;
    span->kind = SPAN_FREE;
    set_pages(span);
    bin_insert(pool, span);
    pool->chunks[pool->n_chunks++] = chunk;
    pool->chunks_pinned++;
    /* A pool's first memory comes as a whole chunk, as the driver's pools
     * reserve, unless max_size or what may still be pinned leaves no room
     * for it; later growth commits only what allocations touch. */
    if (pool->reserved == 0) {
        size_t fits = room < pinnable / 2 ? room : pinnable / 2; /* leave the rest for others */
        size_t whole = fits < len ? npages_needed : chunk->npages;
        r = pm__granules_commit(pool, chunk, 0, whole, false);
        if (r != PM_SUCCESS) {
            release_chunk(pool, pool->n_chunks - 1);
            return r;
        }
    }
    *out = chunk;
    return PM_SUCCESS;
}

bool pm__pages_fit(pm__pool *pool, size_t npages)
{
    /* Moving idle granules pins too (and where giving back waits, cannot happen). */
    placement p = bin_find(pool, npages);
    return p.span && p.missing == 0;
}

pm__span *pm__pages_alloc(pm__pool *pool, size_t npages, pm_result *why)
{
    placement p = bin_find(pool, npages);
    if (!p.span) {
        pm__chunk *added = NULL;
        *why = add_chunk(pool, npages, &added);
        if (*why != PM_SUCCESS)
            return NULL;
        p.span = atomic_load_explicit(&added->pages[0], memory_order_relaxed);
    }
    pm__span *s = p.span;
    bin_remove(pool, s);
    if (s->npages > npages) {
        pm__span *rest = new_span(pool);
        if (!rest) {
            bin_insert(pool, s);
            *why = pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for pool bookkeeping");
            return NULL;
        }
        rest->chunk = s->chunk;
        rest->npages = s->npages - npages;
        rest->kind = SPAN_FREE;
        if (p.at_end) {
            rest->first = s->first;
            s->first += rest->npages;
        } else {
            rest->first = s->first + npages;
        }
        set_pages(rest);
        bin_insert(pool, rest);
        s->npages = npages;
    }
    s->chunk->free_pages -= npages;
    pm__granules_mark(pool, s->chunk, s->first, npages, true);
    *why = pm__granules_commit(pool, s->chunk, s->first, npages, true);
    if (*why != PM_SUCCESS) {
        pm__chunk *c = s->chunk;
        pm__pages_free(pool, s);
        /* A chunk left free and unpinned (one added for this request) goes
         * back now rather than hold address space until a trim. */
        if (c->free_pages == c->npages && c->committed_granules == 0)
            for (size_t i = 0; i < pool->n_chunks; i++)
                if (pool->chunks[i] == c) {
                    release_chunk(pool, i);
                    break;
                }
        return NULL;
    }
    return s;
}

void pm__pages_free(pm__pool *pool, pm__span *s)
{
    pm__chunk *c = s->chunk;
    c->free_pages += s->npages;
    pm__granules_mark(pool, c, s->first, s->npages, false);
    if (s->kind == SPAN_RUN)
        atomic_fetch_add_explicit(&s->run_hot.incarnation, 1, memory_order_release);
    s->kind = SPAN_FREE;
    if (s->first > 0) {
        pm__span *left = atomic_load_explicit(&c->pages[s->first - 1], memory_order_relaxed);
        if (left->kind == SPAN_FREE) {
            bin_remove(pool, left);
            left->npages += s->npages;
            retire_span(pool, s);
            s = left;
        }
    }
    if (s->first + s->npages < c->npages) {
        pm__span *right = atomic_load_explicit(&c->pages[s->first + s->npages], memory_order_relaxed);
        if (right->kind == SPAN_FREE) {
            bin_remove(pool, right);
            s->npages += right->npages;
            retire_span(pool, right);
        }
    }
    set_pages(s);
    bin_insert(pool, s);
    pm__granules_after_free(pool, c);
}

static void release_chunk(pm__pool *pool, size_t index)
{
    pm__chunk *c = pool->chunks[index];
    pm__granules_give_back(pool, c, 0, ULLONG_MAX);
    pm__span *whole = atomic_load_explicit(&c->pages[0], memory_order_relaxed);
    bin_remove(pool, whole);
    retire_span(pool, whole);
    pm__range r;
    if (pm__ranges_retire(pool->ranges, (uintptr_t)c->base, PM__RANGE_POOL, &r) == PM__RETIRED)
        pm__ranges_withdraw(pool->ranges, r.pin_base);
    pm__chunk_map_set((uintptr_t)c->base, c->len, NULL);
    c->ops->unreserve(c->base, c->len);
    pool->chunks_released++;
    pool->chunks[index] = pool->chunks[--pool->n_chunks];
    free(c->granules);
    c->granules = NULL;
    pm__keep_until_pool_dies(pool, c);
}

void pm__pages_release(pm__pool *pool, unsigned long long keep)
{
    for (int wholly_free = 1; wholly_free >= 0; wholly_free--)
        for (size_t i = pool->n_chunks; i-- > 0 && pool->reserved > keep;) {
            pm__chunk *c = pool->chunks[i];
            if ((c->free_pages == c->npages) == wholly_free)
                pm__granules_give_back(pool, c, keep, ULLONG_MAX);
        }
    for (size_t i = pool->n_chunks; i-- > 0;) {
        pm__chunk *c = pool->chunks[i];
        if (c->free_pages == c->npages && c->committed_granules == 0)
            release_chunk(pool, i);
    }
}

void pm__pages_release_all(pm__pool *pool) { pm__pages_release(pool, 0); }

void pm__pages_free_bytes(pm__pool *pool, unsigned long long *in_empty_chunks,
                          unsigned long long *in_holes)
{
    for (size_t i = 0; i < pool->n_chunks; i++) {
        const pm__chunk *c = pool->chunks[i];
        unsigned long long free_bytes = pm__granules_free_committed(c);
        if (c->free_pages == c->npages)
            *in_empty_chunks += free_bytes;
        else
            *in_holes += free_bytes;
    }
}
