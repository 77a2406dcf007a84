/* Host memory pools: the structures behind pm_mem_pool_t.
 *
 * Locks, in the order they may be taken:
 *   0. live_pools's lock (live.c): the set of live pools, held by walks over
 *      it; likewise the list of destroyed pools still in use (retire.c)
 *   1. a thread cache (its owner's entry, or anyone's taking it over)
 *   2. pool->lock: chunks, spans, runs, pending batches, counters, the list
 *      of thread caches
 *   3. the stream-order lock (stream_order.c), taken last: it never waits
 *      for another
 * Nothing here takes a process-wide lock on the allocation fast path.
 *
 * pinmem never writes into pool memory: free blocks are tracked in side
 * arrays, because the device may still be reading a block freed on a stream.
 */
#ifndef PINMEM_POOL_INTERNAL_H
#define PINMEM_POOL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../ranges.h"
#include "../test_hooks.h"
#include "classes.h"
#include "ownership.h"
#include "pinmem.h"
#include "pool.h"

#define PM__CHUNK_STEP ((size_t)32 << 20) /* address reservation step and chunk alignment */
#define PM__MAX_CACHED_POOLS 64           /* pools with thread caches; more work uncached */
#define PM__SPAN_BINS 256

typedef struct pm__chunk pm__chunk;
typedef struct pm__pool pm__pool;

typedef enum { SPAN_FREE = 0, SPAN_RUN, SPAN_LARGE } pm__span_kind;

/* A stretch of whole pages in one chunk: free, a run of small blocks of one
 * class, or one large allocation. */
typedef struct pm__span {
    /* A run's facts the free fast path needs, copied here when the run is
     * made so that a free reads one cache line of the span and none of the
     * chunk, the pool or the class table: fewer loads that wait on each other. */
    struct {
        uint8_t *base;          /* the run's first block */
        size_t bytes;           /* from base to the end of its last block */
        /* Changes whenever the span stops being a run (kept across reuse of
         * the struct), so that a thread's memo of it can tell it is stale. */
        _Atomic uint32_t incarnation;
        uint64_t div_magic;     /* its class's, for offset / size */
        uint32_t size;          /* its class's block size */
        uint32_t nblocks;
        _Atomic uint64_t *requested;
        uint32_t req_stride;
        uint16_t cls;
        uint16_t pool_slot;     /* its pool's thread-cache slot */
        pm__pool *pool;
        unsigned long long pool_generation;
    } run_hot;
    pm__chunk *chunk;
    size_t first, npages;
    pm__span_kind kind;
    struct pm__span *bin_prev, *bin_next; /* free spans, in their size bin */
    /* runs */
    unsigned cls;
    uint32_t nblocks, nfree;   /* nfree: in the run's own stack, not in caches */
    uint32_t cap_blocks;       /* capacity of the two arrays below, kept across reuse */
    uint32_t *free_idx;        /* stack of free block indices */
    struct pm__span *partial_prev, *partial_next; /* runs with nfree > 0 */
    bool in_partial;
    /* requested bytes of each live block, 0 when free; large: [0] only.
     * Blocks of 1 KiB and more keep their entry on a cache line of its own
     * (stride 8), since neighbouring blocks often live in different threads'
     * caches; smaller blocks share lines, as their memory does. */
    _Atomic uint64_t *requested;
    uint32_t req_stride;
} pm__span;

/* The unit in which a chunk's memory is pinned and given back. */
typedef struct pm__granule {
    uint32_t busy;  /* its pages in spans that are not free */
    bool committed; /* pinned and mapped */
} pm__granule;

/* An address range the pool reserved. Its memory is pinned granule by
 * granule (granules.c): a granule is committed while any of its pages is in
 * use, and one with none in use may be given back or moved. */
struct pm__chunk {
    pm__pool *pool;
    const pm__chunk_ops *ops; /* how its memory is pinned (pm__pages_chunk_ops when added) */
    uint8_t *base;
    size_t len, npages, free_pages;
    size_t granule_pages, ngranules;
    size_t committed_granules, idle_granules; /* idle: committed, none of its pages busy */
    pm__granule *granules;
    _Atomic(pm__span *) pages[]; /* the span holding each page */
};

/* Blocks freed on a stream, reusable by others once marker is done. */
typedef struct pm__pending {
    pm__marker marker;
    pm_stream_t stream;
    /* for REUSE_FOLLOW_EVENT_DEPENDENCIES (stream_order.h): the stream's id
     * (when known) and the order counter when the batch was made */
    bool id_known;
    unsigned long long stream_id, tick;
    size_t n, cap;
    void **blocks;
    struct pm__pending *next;
} pm__pending;

/* Cached blocks of one class, each with its requested-size entry, so that
 * an allocation from the cache needs no lookup. */
typedef struct pm__bin {
    uint32_t n;
    void *slots[32];
    _Atomic uint64_t *req[32];
} pm__bin;

/* One thread's cache for one pool. Its owner enters it on every operation
 * with plain stores (ownership.h); trim, destroy, statistics and stream
 * synchronization take it over to flush it from other threads. Cache structs
 * are recycled, never freed, so a pointer to one stays safe to enter; once
 * inside, `pool` says whether it still serves that pool. */
typedef struct pm__cache {
    pm__ownership guard;
    pm__pool *pool;
    unsigned long long pool_generation;
    /* the stream the tagged bins were freed on; atomics so that a stream's
     * synchronization can skip caches that hold nothing of it unentered */
    _Atomic(pm_stream_t) tag;
    _Atomic bool tagged;
    /* bytes of the blocks in its bins (ready and tagged): handed out by the
     * pool, not in use; only its holder writes it */
    _Atomic long long held;
    /* counters since the cache was attached, folded into the pool on flush;
     * atomics because statistics read them without the lock */
    _Atomic long long requested, allocs, frees; /* live = allocs - frees */
    /* The highest use this cache's allocations saw: the pool's handed less
     * its own held. That counts what other caches hold as used, so it is
     * never below the true use at that moment, and exact with one cache. */
    _Atomic long long used_peak;
    struct pm__cache *pool_prev, *pool_next, *spare_next;
    pm__bin ready[PM__POOL_CLASSES];
    pm__bin tagged_bins[PM__POOL_CLASSES];
} pm__cache;

struct pm__pool {
    pthread_mutex_t lock;
    /* The instance's parts the pool's files use, set as it is made, so that
     * they take them from the pool and never reach up for the instance. */
    const pm__backend *backend;
    pm__ranges *ranges; /* where its chunks are registered */
    pm_mem_pool_props props;
    /* How it pins chunks: with the default release threshold, and with any
     * other (pm__pages_chunk_ops); chosen as it is made, by its max_size. */
    const pm__chunk_ops *keep_ops, *give_back_ops;
    int numa_node;                 /* -1: anywhere */
    unsigned slot;                 /* thread-cache slot, or PM__MAX_CACHED_POOLS */
    unsigned long long generation; /* tells a reused slot from its old pool */
    bool is_default;
    unsigned long long stats_ticket; /* the all-pools statistics walk that counted it last (lock) */
    /* guarded by lock (as everything below) */
    bool destroyed;
    bool destroying; /* the destroy is still flushing thread caches */
    bool finishing;  /* claimed by whoever tears it down (pm__retire_claim) */
    /* retire.c, under its locks: in the list of destroyed pools still in
     * use, and in the reaper's */
    struct pm__pool *listed_prev, *listed_next;
    bool listed;
    struct pm__pool *reap_next;

    pm__chunk **chunks;
    size_t n_chunks, cap_chunks;
    pm__span *bins[PM__SPAN_BINS];
    uint64_t bin_mask[PM__SPAN_BINS / 64];
    pm__span *partial[PM__POOL_CLASSES];
    pm__pending *pending;
    pm__cache *caches;
    unsigned long long reserved, reserved_high; /* reserved: committed bytes */
    /* the highest use seen on the slow paths and in flushed caches (the
     * attribute adds the caches' used_peak) */
    unsigned long long used_high;
    unsigned long long idle_bytes; /* committed bytes in granules with no page in use */
    /* Bytes of blocks out of the pool's runs, spans and pending batches: in
     * use, or in thread caches. Used is handed less what caches hold.
     * Written under the lock; caches read it without. */
    _Atomic long long handed;
    long long requested, allocs, frees, live; /* not counting caches' own */
    unsigned long long chunks_pinned, chunks_released, pin_ns;
    unsigned long long granules_pinned, granules_released, granules_moved;
    uint64_t release_threshold;
    int reuse_follow_event_deps, reuse_opportunistic, reuse_internal_deps;
    pm__span *spare_spans;      /* retired span structs, reused: never freed while the pool lives */
    void **graveyard;           /* chunk structs and arrays freed with the pool */
    size_t n_graveyard, cap_graveyard;
#ifdef PINMEM_TEST_HOOKS
    pm__countdown fail_pin_countdown; /* the n-th commit of granules fails (0: never) */
#endif
};

/* What each file offers the others, in the order of their layers, lowest
 * first (tests/layers.txt); lifecycle.c, on top, has only public calls. */

/* chunk_map.c: address -> chunk for every 32 MiB, lock-free for readers. */
#define PM__CHUNK_MAP_LEAF_BITS 12
#define PM__CHUNK_MAP_TOP_BITS (48 - 25 - PM__CHUNK_MAP_LEAF_BITS)
typedef struct pm__chunk_map_leaf {
    _Atomic(pm__chunk *) slot[1u << PM__CHUNK_MAP_LEAF_BITS];
} pm__chunk_map_leaf;
extern _Atomic(pm__chunk_map_leaf *) pm__chunk_map_top[1u << PM__CHUNK_MAP_TOP_BITS];

bool pm__chunk_map_set(uintptr_t base, size_t len, pm__chunk *chunk);

static inline pm__chunk *pm__chunk_map_get(uintptr_t addr)
{
    if (addr >> 48)
        return NULL;
    size_t index = addr >> 25;
    pm__chunk_map_leaf *l = atomic_load_explicit(
        &pm__chunk_map_top[index >> PM__CHUNK_MAP_LEAF_BITS], memory_order_acquire);
    return l ? atomic_load_explicit(&l->slot[index & ((1u << PM__CHUNK_MAP_LEAF_BITS) - 1)],
                                    memory_order_acquire)
             : NULL;
}

/* Helpers every file of the pools uses. */
static inline _Atomic uint64_t *pm__requested(pm__span *s, size_t index)
{
    return &s->requested[index * s->req_stride];
}

/* The span holding addr, and its chunk; NULL outside every pool. */
static inline pm__span *pm__span_of(uintptr_t addr, pm__chunk **chunk)
{
    pm__chunk *c = pm__chunk_map_get(addr);
    if (!c || addr < (uintptr_t)c->base || addr - (uintptr_t)c->base >= c->len)
        return NULL;
    *chunk = c;
    return atomic_load_explicit(&c->pages[(addr - (uintptr_t)c->base) / PM__POOL_PAGE],
                                memory_order_acquire);
}

/* pool->lock held: bytes handed out; a free block going back, or coming out
 * of, the pool's runs, spans or pending batches. */
static inline void pm__pool_handed_add(pm__pool *pool, long long bytes)
{
    atomic_store_explicit(&pool->handed,
                          atomic_load_explicit(&pool->handed, memory_order_relaxed) + bytes,
                          memory_order_relaxed);
}

/* The bytes a block of span (a run's block, or a large span) counts for. */
static inline size_t pm__block_bytes(const pm__span *span)
{
    return span->kind == SPAN_RUN ? pm__class_size(span->cls) : span->npages * PM__POOL_PAGE;
}

/* live.c: which pools live. */
/* Bumped when a pool is destroyed and when it is torn down: what a thread
 * checked or remembered of pools before is then checked again. Hidden, so
 * that the fast paths read it as directly as a variable of their own. */
extern _Atomic unsigned long long pm__pools_epoch __attribute__((visibility("hidden")));
/* Gives the pool a thread-cache slot (none when all are taken) and a new
 * generation, and lists it as live; false when out of memory. */
bool pm__pools_add(pm__pool *pool);
/* Unlists the pool, once any walk over the live pools is done, frees its
 * slot and bumps the epoch; false when it was not listed. */
bool pm__pools_remove(pm__pool *pool);
bool pm__pools_contains(const pm__pool *pool);
/* Calls visit on every live pool; none can be unlisted meanwhile, and no
 * cache or pool lock may be held when calling this. */
void pm__pools_for_each(void (*visit)(void *pool, void *arg), void *arg);

/* granules.c: committing and giving back chunk memory (pool->lock held). */
/* What the pool may still pin: the backend's limit (the memlock headroom on
 * POSIX) or what the pinned budget leaves, whichever is less. */
size_t pm__pool_pinnable(const pm__pool *pool);
/* The granule for a new chunk of ops in a pool of max_size (0: none) when
 * pinnable bytes can still be pinned: the ops' own, or where they take
 * smaller ones (granule_min) and a memlock limit or max_size leaves less
 * room, a smaller one, down to a pool page; 0: the chunk is pinned whole. */
size_t pm__granule_to_fit(const pm__chunk_ops *ops, size_t pinnable, size_t max_size);
pm_result pm__granules_init(pm__chunk *c, size_t granule_bytes);
/* Counts [first, first + npages) of c as busy or free again. */
void pm__granules_mark(pm__pool *pool, pm__chunk *c, size_t first, size_t npages, bool busy);
/* Bytes of the granules [first, first + npages) touches that are not committed. */
size_t pm__granules_missing(const pm__chunk *c, size_t first, size_t npages);
/* Commits the granules [first, first + npages) touches. With move, idle
 * granules elsewhere worth up to the bytes to commit are given back first,
 * so that the pool's memory moves where it is needed instead of growing. */
pm_result pm__granules_commit(pm__pool *pool, pm__chunk *c, size_t first, size_t npages, bool move);
/* After pages of c were freed: where giving back does not wait for the
 * device, idle granules above the release threshold go back now. */
void pm__granules_after_free(pm__pool *pool, pm__chunk *c);
/* Gives back idle granules of c (high addresses first) while reserved stays
 * at or above keep and at most budget bytes go; the bytes given back. */
unsigned long long pm__granules_give_back(pm__pool *pool, pm__chunk *c, unsigned long long keep,
                                          unsigned long long budget);
/* Committed bytes of c on free pages. */
unsigned long long pm__granules_free_committed(const pm__chunk *c);

/* pages.c: chunks and the page allocator (pool->lock held). */
/* How the pool pins the chunks it adds now: by its release threshold.
 * Chunks keep the way they were pinned. */
const pm__chunk_ops *pm__pages_chunk_ops(const pm__pool *pool);
#ifdef PINMEM_TEST_HOOKS
/* Tests: pools pin new chunks whole and give them back only when asked, as
 * the CUDA backend pins pools that keep their memory, wherever the backend's
 * chunk ops take any length (set while no pool is being added to). */
extern _Atomic bool pm__pool_whole_chunks;
#endif
pm__span *pm__pages_alloc(pm__pool *pool, size_t npages, pm_result *why);
void pm__pages_free(pm__pool *pool, pm__span *span);
/* Whether npages free pages in a row are there without pinning more. */
bool pm__pages_fit(pm__pool *pool, size_t npages);
/* Gives back committed granules with no page in use, those of wholly free
 * chunks first, while reserved stays at or above keep; then releases the
 * address ranges of chunks left wholly free and uncommitted. */
void pm__pages_release(pm__pool *pool, unsigned long long keep);
void pm__pages_release_all(pm__pool *pool);
/* Committed bytes on no allocation's pages, in wholly free chunks and in
 * chunks in use. */
void pm__pages_free_bytes(pm__pool *pool, unsigned long long *in_empty_chunks,
                          unsigned long long *in_holes);
/* Frees p with the pool, not before: lock-free readers may still hold it. */
void pm__keep_until_pool_dies(pm__pool *pool, void *p);
/* Makes the graveyard hold every live chunk and extra more besides what it
 * holds, so that burying them later needs no memory; false when out of it. */
bool pm__graveyard_room(pm__pool *pool, size_t extra);

/* central.c: runs of small blocks and large spans (pool->lock held). */
/* One block of class cls, or a large span for bytesize (cls == PM__POOL_CLASSES). */
void *pm__central_alloc(pm__pool *pool, size_t bytesize, unsigned cls, pm_result *why);
void pm__central_free_block(pm__pool *pool, pm__span *run, void *block);
/* A large allocation's span back to the pages. */
void pm__central_free_large(pm__pool *pool, pm__span *span);
/* Whether pm__central_alloc of bytesize (class cls) would be served without
 * pinning a new chunk. */
bool pm__central_fits(pm__pool *pool, size_t bytesize, unsigned cls);
/* Gives runs with no block in use back to the pages (trim, teardown). */
void pm__central_release_empty_runs(pm__pool *pool);
/* Up to want blocks of class cls into out, and their requested-size entries
 * into req (NULL: not wanted). */
size_t pm__central_take(pm__pool *pool, unsigned cls, void **out, _Atomic uint64_t **req,
                        size_t want, pm_result *why);

/* pending.c: blocks freed on streams (pool->lock held). */
pm_result pm__pending_add(pm__pool *pool, pm_stream_t s, void **blocks, size_t n);
/* Returns blocks whose stream work is done to their runs; how many. */
size_t pm__pending_reclaim(pm__pool *pool, pm_stream_t s, bool async);
/* REUSE_ALLOW_INTERNAL_DEPENDENCIES: a block for bytesize (class cls) freed
 * on another stream whose work may still run, taken out of its batch after
 * making s wait for that work; NULL when there is none. */
void *pm__pending_take_ordered(pm__pool *pool, pm_stream_t s, size_t bytesize, unsigned cls);
/* REUSE_FOLLOW_EVENT_DEPENDENCIES: a block for bytesize (class cls) freed on
 * another stream before an event that s's work waits for; NULL when none. */
void *pm__pending_take_followed(pm__pool *pool, pm_stream_t s, size_t bytesize, unsigned cls);
/* Returns every pending block, done or not: only for a pool being torn down
 * after its streams were synchronized. */
void pm__pending_release_all(pm__pool *pool);

/* retire.c: the end of a destroyed pool. */
/* pool->lock held, after a free into a destroyed pool or its destroy: true
 * when the pool is finished (destroyed, nothing live, its destroy done) and
 * nobody else has claimed it; the caller then calls pm__retire_finish once
 * the lock is released. Deciding under the lock that counted the last free
 * down lets only one thread ever see the pool's end. */
bool pm__retire_claim(pm__pool *pool);
/* Lists a pool being destroyed until it is finished, so that statistics of
 * all pools still count the memory its live allocations hold. */
void pm__retire_list(pm__pool *pool);
/* Calls visit on every listed pool, with the list's lock held (no pool
 * lock may be held when calling this). */
void pm__retire_for_each_listed(void (*visit)(void *pool, void *arg), void *arg);
/* The end of a claimed pool: unlisted, then torn down now or by the reaper. */
void pm__retire_finish(pm__pool *pool);
/* Starts the reaper again if its start failed, and meanwhile tears down
 * here what no longer waits for streams, and with may_wait (the caller
 * synchronizes) even where giving memory back waits for the device. Cheap
 * when no pool waits. */
void pm__retire_poll(bool may_wait);
/* Tears down here the waiting pools whose teardown no longer waits (for
 * callers short of memory); whether there were any. */
bool pm__retire_reap_here(void);
/* Tests: this many of the next reaper starts fail (set before any starts). */
extern int pm__retire_fail_starts;
/* Tests: whether a reaper runs (one that finished its last pool has not yet
 * ended). */
bool pm__retire_reaper_running(void);

/* cache.c: per-thread caches and the allocation paths. */
/* Empties every cache of the pool into it; detach also unhooks them.
 * Whether any held a block. */
bool pm__caches_flush_pool(pm__pool *pool, bool detach);
/* Forgets the highest use each cache of the pool saw (USED_MEM_HIGH reset). */
void pm__caches_reset_peaks(pm__pool *pool);
/* Moves blocks freed on s out of every cache of the pool into pending. */
void pm__caches_flush_stream(pm__pool *pool, pm_stream_t s);
pm_result pm__pool_alloc(pm__pool *pool, void **pp, size_t bytesize, bool async, pm_stream_t s);
pm_result pm__pool_free(void *p, bool async, pm_stream_t s);

/* pool.c: handles, allocation and free, attributes, statistics (and pool.h). */
/* A public call's first steps on one pool: the instance, then whether the
 * handle is a live pool (PM_ERROR_INVALID_VALUE with a detail when not);
 * *pool is set when both are there. */
pm_result pm__pool_of_handle(pm_mem_pool_t handle, pm__pool **pool);

#endif
