/* The copy engine: pm_memcpy_* split a host range into page-locked and
 * pageable pieces and send each the cheapest way (copy.c); pageable pieces go
 * through a ring of pinned staging buffers filled by worker threads
 * (staging.c), or through a cached registration (regcache.c). All of it is
 * part of the lazily created process-wide instance.
 *
 * The files call downwards only, in this order (docs/design.md, checked by
 * tests/check_layers.sh):
 *   memcopy, counters, trace, backend_copy,         CPU copies, counters, the engine's trace,
 *   store_choice                                    the backend's copy calls
 *   settings                                        the settings in effect and their gate
 *   plan                                            how a staged job is cut into pieces
 *   staging_*, staging, regcache                    the staging engines, the registration cache
 *   copy                                            pm_memcpy_htod/dtoh[_async]: the front end
 *   memcpy                                          pm_memcpy[_async], pm_device_alloc/free
 *   batch_overlap, batch_run, batch                 pm_memcpy_batch_async (batch.h)
 *   config, stats                                   pm_copy_get/set_config, pm_copy_get_stats */
#ifndef PINMEM_COPY_H
#define PINMEM_COPY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../instance.h"
#include "../ranges.h"
#include "pinmem.h"

typedef enum { PM__HTOD, PM__DTOH } pm__direction;

/* The settings in effect (pm_copy_config with the defaults filled in). */
typedef struct pm__copy_settings {
    unsigned workers;
    unsigned htod_workers; /* of them, the most that fill buffers for host-to-device copies (0: all) */
    size_t chunk_bytes; /* one buffer, one DMA */
    size_t slice_bytes; /* one CPU copy */
    size_t dtoh_slice_bytes; /* one CPU copy out of the ring (plan.c says when) */
    unsigned buffers;
    size_t direct_max, dtoh_direct_max; /* to the device, from it; 0: none */
    bool registration_cache;
    size_t cache_min_bytes, cache_max_bytes;
    pm_copy_stores stores;
    bool cpu_demotes; /* the CPU has cldemote (memcopy.c) */
    size_t first_piece;          /* a staged copy's first piece to the device (plan.c) */
    size_t dtoh_first_piece;     /* the same from the device */
    unsigned pieces;             /* at least this many pieces a staged copy */
    unsigned long long spin_ns;  /* a worker looks for work this long before it sleeps */
    bool ring_split;             /* both ways at once: at most half the ring each */
    pm_copy_batch batch;         /* GATHER, EACH, DRIVER or KERNEL */
    size_t kernel_max;           /* KERNEL: the largest element the kernel moves (0: none) */
    bool kernel_staged;          /* KERNEL: staged blocks move by launches too */
} pm__copy_settings;

/* The largest ring that demoting stores are used for by default: the ring
 * must stay in the CPU's last-level cache while the source streams through
 * that cache too, and larger rings do not. */
#define PM__DEMOTING_RING_MAX ((size_t)32 << 20)
/* The smallest host-to-device copy that may use demoting stores by default
 * (pm__copy_may_demote). */
#define PM__DEMOTING_MIN ((size_t)64 << 20)

/* The most workers that may fill buffers for host-to-device copies. */
static inline unsigned pm__copy_htod_workers(const pm__copy_settings *set)
{
    return set->htod_workers && set->htod_workers < set->workers ? set->htod_workers
                                                                 : set->workers;
}

/* Whether a staged copy of bytes in direction dir may use demoting stores:
 * into the ring, from 64 MiB, wherever the CPU has them and the ring fits its
 * cache with room to spare (memcopy.c says why), unless the configuration
 * names the stores. Whether it does is learnt per machine (store_choice.h):
 * they cost each thread about twice the time a piece (cached stores read
 * each ring line first), which a host with threads to spare wins back in the
 * DMA engine's rate and a busy host does not. Small copies feel that cost
 * most, so they never demote. */
static inline bool pm__copy_may_demote(const pm__copy_settings *set, pm__direction dir,
                                       size_t bytes)
{
    return set->stores == PM_COPY_STORES_DEFAULT && dir == PM__HTOD && set->cpu_demotes &&
           bytes >= PM__DEMOTING_MIN &&
           (size_t)set->buffers * set->chunk_bytes <= PM__DEMOTING_RING_MAX;
}

/* How the CPU copies of a staged copy of bytes in direction dir store when
 * they do not demote, by default (docs/design.md, "Copies"):
 * - into the ring, streaming stores below 256 MiB, which leave memory to the
 *   DMA engine reading the ring, and cached stores from there, as a copy
 *   that long lets the DMA find part of the bytes in the CPU's cache;
 * - out of the ring into the user's memory, cached stores: with the DMAs
 *   queued ahead of the threads, streaming ones were the slower there. */
static inline pm_copy_stores pm__copy_stores_for(const pm__copy_settings *set,
                                                 pm__direction dir, size_t bytes)
{
    if (set->stores != PM_COPY_STORES_DEFAULT)
        return set->stores;
    if (dir == PM__DTOH)
        return PM_COPY_STORES_CACHED;
    return bytes < ((size_t)256 << 20) ? PM_COPY_STORES_STREAMING : PM_COPY_STORES_CACHED;
}

/* One stretch of a staged job: host bytes and the device bytes they go to or
 * come from. A pm_memcpy_* copy is one; the pageable blocks of a batch are
 * many, staged as if they lay end to end (at: where one starts in that). */
typedef struct pm__segment {
    uint8_t *host;
    pm_deviceptr dev;
    size_t bytes, at;
    bool kernel; /* the batch kernel may move it between the ring and dev */
} pm__segment;

/* plan.c: how a staged job of bytes is cut into pieces, each one buffer and
 * one DMA (or one driver call for the DMAs of the segments in it). The
 * first piece is first bytes (its direction's), each next one twice the one
 * before up to target, so the first DMA starts after little copying and the
 * later ones run the DMA engine at its large-piece rate; target is the job's
 * bytes / pieces, from first up to a whole buffer (chunk). A thread copies
 * one slice of a piece at a time: slice_bytes, or dtoh_slice_bytes for
 * copies from the device larger than slice_bytes and up to
 * PM__DTOH_SLICES_MAX, which wake workers anyway and whose buffers more
 * threads then empty as each DMA lands (larger ones gained nothing from it,
 * docs/performance.md); above PM__DTOH_FINE_MAX twice dtoh_slice_bytes, as
 * such copies have buffers enough for every thread. A job of many ranges (a
 * batch's blocks) keeps slice_bytes as its first piece and dtoh_slice_bytes
 * at every size: each of its blocks is a DMA of its own, which the DMA
 * engine runs at a fraction of a large DMA's rate, and such batches lost
 * with the larger first piece (docs/performance.md, "Changes"). */
#define PM__DTOH_SLICES_MAX ((size_t)64 << 20)
#define PM__DTOH_FINE_MAX ((size_t)4 << 20)
typedef struct pm__piece_plan {
    size_t bytes, chunk, first, target, slice;
} pm__piece_plan;
pm__piece_plan pm__plan_pieces(const pm__copy_settings *set, pm__direction dir, size_t chunk,
                               size_t bytes, bool one_range);
/* The size of piece k, which starts at offset. */
size_t pm__plan_piece(const pm__piece_plan *p, unsigned k, size_t offset);
/* The slices of the whole job. */
size_t pm__plan_slices(const pm__piece_plan *p);
/* The index of the segment that holds byte at of a job (segs sorted by at,
 * none empty). */
size_t pm__segment_at(const pm__segment *segs, size_t n, size_t at);

/* counters.c */
typedef struct pm__copy_counters {
    _Atomic unsigned long long direct_bytes, staged_bytes, driver_bytes, cached_bytes;
    _Atomic unsigned long long cache_registrations, cache_hits, cache_invalidations;
    _Atomic unsigned long long staged_pieces, staging_copy_ns, staging_wait_ns, staging_queue_ns;
    _Atomic unsigned long long demoted_bytes;
    _Atomic unsigned long long batch_calls, batch_copies, dma_batch_calls;
    _Atomic unsigned long long kernel_launches, kernel_bytes;
} pm__copy_counters;

extern pm__copy_counters pm__copy_count;

/* Adds n to one of pm__copy_count's counters (statistics only: relaxed). */
static inline void pm__count(_Atomic unsigned long long *counter, unsigned long long n)
{
    atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

/* settings.c. Copies hold the gate for reading while they run, so that
 * pm_copy_set_config (which takes it for writing) never changes the engine
 * under them. Both take the defaults on first use; pm__copy_leave leaves
 * either. */
const pm__copy_settings *pm__copy_enter(void);
pm__copy_settings *pm__copy_enter_to_change(void);
void pm__copy_leave(void);
/* The one check of a configuration, from code or the environment: each
 * field against the options table, then every 0 resolved to the
 * environment's value or else the machine's default, into *out (every field
 * set) and *s. who names the caller in a failure's detail. */
pm_result pm__copy_resolve(const pm_copy_config *c, const char *who, pm_copy_config *out,
                           pm__copy_settings *s);
/* For pm_get_setting: the values in effect (c), set by code where they
 * differ from the defaults and by_code. */
void pm__copy_publish(const pm_copy_config *c, bool by_code);

/* staging*.c. *no_ring: the failure was that no staging buffer could be
 * pinned (nothing was copied; the caller may take another way). sync: the
 * caller waits for the stream next (the engine may then time the copy). */
pm_result pm__staged_copy(const pm__copy_settings *set, pm__direction dir, uint8_t *host,
                          pm_deviceptr dev, size_t bytes, pm_stream_t stream, bool sync,
                          bool *no_ring);
/* The same for n segments of bytes in all (at set, in order, none empty),
 * as one job: host to device returns once every segment has been read,
 * device to host once every segment holds its bytes. kernel: some segments
 * may move by the batch kernel (the backend is ready for it on stream); a
 * buffer whose segments all may then moves by one launch, with the list of
 * its blocks kept at the buffer's end. */
pm_result pm__staged_segments(const pm__copy_settings *set, pm__direction dir,
                              const pm__segment *segs, size_t n, size_t bytes, pm_stream_t stream,
                              bool kernel, bool *no_ring);
/* Queues n block copies (page-locked host memory and device memory, checked)
 * on stream as launches of the batch kernel, each list written into a
 * staging buffer that is reused only once its launch is done. */
pm_result pm__staged_blocks(const pm__copy_settings *set, const pm__block_copy *blocks, size_t n,
                            pm_stream_t stream, bool *no_ring);
/* The staging ring: its shape (as configured, or smaller to fit what may be
 * pinned), whether it fits at all, whether it is pinned now (and where), and
 * a note saying why it is not as configured ("" when it is). */
typedef struct pm__ring_plan {
    unsigned buffers;
    size_t chunk;
    bool fits, pinned;
    void *base;
    char note[224];
} pm__ring_plan;
/* The first device's engine's ring pinned now, or the one the next staged
 * copy would pin. */
pm__ring_plan pm__staging_ring(const pm__copy_settings *set);
/* The workers that take host-to-device slices now (0 before the engine starts). */
unsigned pm__staging_fillers(void);
/* The worker threads running now. */
unsigned pm__staging_threads(void);
/* Stops the workers and frees the ring (the gate held for writing). */
void pm__staging_stop(void);

/* memcopy.c: memcpy, or with streaming or demoting stores where the machine
 * has them. */
void pm__copy_bytes(void *dst, const void *src, size_t n, pm_copy_stores stores);
bool pm__copy_cpu_demotes(void);

/* regcache.c */
typedef struct pm__regcache_entry pm__regcache_entry;
/* A cached registration covering [p, p + bytes), with a reference taken;
 * NULL when the cache is off, does not hear unmaps, or cannot register it. */
pm__regcache_entry *pm__regcache_acquire(const pm__copy_settings *set, const void *p, size_t bytes);
void pm__regcache_release(pm__regcache_entry *e);
/* Whether any registration of the cache, live or waiting to be undone, shares
 * a page with [p, p + bytes): the driver would then read through it. */
bool pm__regcache_overlaps(const void *p, size_t bytes);
/* The kind the copy engine gives [p, p + bytes), which the backend called
 * kind: memory the driver holds pinned for one of the cache's own
 * registrations is the user's pageable memory, whose copies must pass the
 * cache (that registration may be doomed and still hold the old pages). */
pm__memory_kind pm__regcache_kind(const void *p, size_t bytes, pm__memory_kind kind);
/* Drops cached registrations in [lo, hi) (pm_mem_invalidate, and before a
 * user's own registration of those pages, which waits for the unregistering). */
void pm__regcache_invalidate(uintptr_t lo, uintptr_t hi, bool wait);
static inline void pm__regcache_evict(uintptr_t lo, uintptr_t hi)
{
    pm__regcache_invalidate(lo, hi, true);
}
bool pm__regcache_listening(void);

/* copy.c. The pinned bytes [*piece_lo, *piece_hi) of r that hold at and
 * that one DMA may cover: all of r's, or of the registration piece at lies
 * in (backend.h). false where at is not in r's pinned bytes. */
bool pm__copy_pinned_piece(const pm__range *r, size_t registration_piece, uintptr_t at,
                           uintptr_t *piece_lo, uintptr_t *piece_hi);

/* The longest piece of a host range from at (before end) that is all
 * page-locked in one registration (and one registration piece), or all
 * pageable: a DMA never crosses where they meet. */
typedef struct pm__piece {
    uintptr_t end;
    bool pinned;
    bool read_only; /* pinned by a READ_ONLY registration: no copy writes it */
} pm__piece;
pm__piece pm__copy_next_piece(pm__ranges *ranges, size_t registration_piece, uintptr_t at,
                              uintptr_t end);
/* The same piece, where at lies in r's extent (found by the caller). */
pm__piece pm__copy_piece_within(const pm__range *r, size_t registration_piece, uintptr_t at,
                                uintptr_t end);

/* PM_SUCCESS where no byte of [start, start + bytes) lies in a READ_ONLY
 * registration; else INVALID_VALUE, as the driver refuses every copy into
 * such memory (docs/driver-behavior.md), with name and role in the detail. */
pm_result pm__copy_writable(pm__instance *inst, const char *name, const char *role,
                            uintptr_t start, size_t bytes);
/* The failure pm__copy_writable returns, for callers that walk the pieces
 * themselves. */
pm_result pm__copy_read_only_fail(const char *name, const char *role, uintptr_t at);

/* Whether the stream of a copy captures a graph: not known yet (the copy
 * asks when it must), or known to the caller. */
typedef enum { PM__CAPTURE_ASK, PM__CAPTURE_NONE, PM__CAPTURE_ACTIVE } pm__capture;
/* pm_memcpy_htod and friends, with the name its errors give. */
pm_result pm__copy(const char *name, pm__direction dir, uint8_t *host, pm_deviceptr dev,
                   size_t bytes, pm_stream_t s, bool sync, pm__capture capture);
/* PM_SUCCESS when all of [start, start + bytes) is page-locked host memory
 * (pinmem's, or the driver's own), as a copy on a capturing stream needs;
 * otherwise PM_ERROR_STREAM_CAPTURE_UNSUPPORTED. */
pm_result pm__copy_capturable(pm__instance *inst, const char *name, uintptr_t start, size_t bytes);

/* How a piece reaches the backend: queued on the stream with the host side
 * page-locked or pageable, or through the driver's synchronous call. */
typedef enum { PM__VIA_PINNED, PM__VIA_PAGEABLE, PM__VIA_SYNC } pm__copy_via;
/* backend_copy.c: the backend's copy calls, with the test fault point in front. */
pm_result pm__copy_backend(const pm__backend *b, pm__direction dir, void *host, pm_deviceptr dev,
                           size_t n, pm_stream_t s, pm__copy_via via);
/* The backend's block_copy_async, with its own fault point; counts launches.
 * blocks is read here; the kernel reads kernel_reads, a copy of it in
 * device memory queued before (NULL: blocks itself). */
pm_result pm__copy_backend_blocks(const pm__backend *b, const pm__block_copy *blocks, size_t count,
                                  const pm__block_copy *kernel_reads,
                                  pm_stream_t s);
/* The backend's copy_batch_async, with the same fault point (one pass a call). */
pm_result pm__copy_backend_batch(const pm__backend *b, const pm_deviceptr *dsts,
                                 const pm_deviceptr *srcs, const size_t *sizes, size_t count,
                                 size_t read_now, pm_stream_t s, bool one_call);

#endif
