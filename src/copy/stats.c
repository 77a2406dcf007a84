/* pm_copy_get_stats: the engine's counters (counters.c) with what the
 * staging engine and the registration cache say of themselves now. */
#include <stdio.h>
#include <string.h>

#include "../budget.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "../versioned.h"
#include "copy.h"

pm_result pm_copy_get_stats(pm_copy_stats *stats)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_copy_get_stats");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_copy_get_stats", stats);
    if (r != PM_SUCCESS)
        return r;
    pm__copy_counters *c = &pm__copy_count;
    const pm__copy_settings *set = pm__copy_enter();
    pm__ring_plan ring = pm__staging_ring(set);
    const bool cache_on = set->registration_cache;
    pm__copy_leave();
    pm_copy_stats full = {
        .struct_size = stats->struct_size,
        .direct_bytes = atomic_load(&c->direct_bytes),
        .staged_bytes = atomic_load(&c->staged_bytes),
        .driver_bytes = atomic_load(&c->driver_bytes),
        .cached_bytes = atomic_load(&c->cached_bytes),
        .cache_registrations = atomic_load(&c->cache_registrations),
        .cache_hits = atomic_load(&c->cache_hits),
        .cache_invalidations = atomic_load(&c->cache_invalidations),
        .pinned_bytes = pm__budget_pinned(),
        /* Only a cache that is on listens: asking must not start its monitor. */
        .cache_listening = cache_on && pm__regcache_listening(),
        .staged_pieces = atomic_load(&c->staged_pieces),
        .staging_copy_ns = atomic_load(&c->staging_copy_ns),
        .staging_wait_ns = atomic_load(&c->staging_wait_ns),
        .staging_queue_ns = atomic_load(&c->staging_queue_ns),
        .htod_fillers = pm__staging_fillers(),
        .demoted_bytes = atomic_load(&c->demoted_bytes),
        .staging_threads = pm__staging_threads(),
        .ring_pinned = ring.pinned,
        .ring_buffers = ring.fits ? ring.buffers : 0,
        .ring_buffer_bytes = ring.fits ? ring.chunk : 0,
        .batch_calls = atomic_load(&c->batch_calls),
        .batch_copies = atomic_load(&c->batch_copies),
        .dma_batch_calls = atomic_load(&c->dma_batch_calls),
        .kernel_launches = atomic_load(&c->kernel_launches),
        .kernel_bytes = atomic_load(&c->kernel_bytes),
    };
    snprintf(full.ring_note, sizeof full.ring_note, "%s", ring.note);
    memcpy(stats, &full, stats->struct_size);
    return PM_SUCCESS;
}
