/* pm_copy_get_config and pm_copy_set_config: the copy engine's settings read
 * and changed between copies. The settings themselves, their defaults and
 * their check live below the engine (settings.c); a change that reshapes the
 * engine stops it here, above it, so that the next staged copy starts the
 * new one. */
#include <limits.h>
#include <string.h>

#include "../budget.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "../versioned.h"
#include "copy.h"

/* The configuration in effect, every field filled (gate held). */
static pm_copy_config config_of(const pm__copy_settings *s)
{
    return (pm_copy_config){
        .struct_size = sizeof(pm_copy_config),
        .workers = s->workers,
        .htod_workers = pm__copy_htod_workers(s),
        .chunk_bytes = s->chunk_bytes,
        .buffers = s->buffers,
        .direct_max = s->direct_max ? s->direct_max : (size_t)-1,
        .dtoh_direct_max = s->dtoh_direct_max ? s->dtoh_direct_max : (size_t)-1,
        .registration_cache = s->registration_cache,
        .cache_min_bytes = s->cache_min_bytes,
        .cache_max_bytes = s->cache_max_bytes,
        .pinned_budget = pm__budget_cap(),
        .staging_stores = s->stores,
        .slice_bytes = s->slice_bytes,
        .dtoh_slice_bytes = s->dtoh_slice_bytes,
        .first_piece_bytes = s->first_piece,
        .dtoh_first_piece_bytes = s->dtoh_first_piece,
        .pieces = s->pieces,
        .spin_us = s->spin_ns ? (unsigned)(s->spin_ns / 1000) : UINT_MAX,
        .ring = s->ring_split ? PM_COPY_RING_SPLIT : PM_COPY_RING_SHARED,
        .batch = s->batch,
    };
}

pm_result pm_copy_get_config(pm_copy_config *config)
{
    PM__NO_CANCEL;
    /* Reading the settings waits behind a change, which waits for copies
     * that may wait for the host function. */
    PM__REFUSED_IN_HOST_FUNC("pm_copy_get_config");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_copy_get_config", config);
    if (r != PM_SUCCESS)
        return r;
    pm_copy_config full = config_of(pm__copy_enter());
    pm__copy_leave();
    full.struct_size = config->struct_size;
    memcpy(config, &full, config->struct_size);
    return PM_SUCCESS;
}

pm_result pm_copy_set_config(const pm_copy_config *given)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_copy_set_config");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_copy_set_config", given);
    if (r != PM_SUCCESS)
        return r;
    pm__copy_settings *settings = pm__copy_enter_to_change();
    /* An older, smaller struct leaves the fields it lacks as they are. */
    pm_copy_config whole = config_of(settings), resolved;
    memcpy(&whole, given, given->struct_size);
    pm__copy_settings fresh;
    r = pm__copy_resolve(&whole, "pm_copy_set_config", &resolved, &fresh);
    if (r != PM_SUCCESS) {
        pm__copy_leave();
        return r;
    }
    /* A new shape of engine starts with the next staged copy; otherwise the
     * ring stays (it keeps staged copies working under a new budget). The
     * filling workers compare as counts: all of them is reported as their
     * number, which a round trip gives back. */
    if (fresh.workers != settings->workers ||
        pm__copy_htod_workers(&fresh) != pm__copy_htod_workers(settings) ||
        fresh.chunk_bytes != settings->chunk_bytes || fresh.buffers != settings->buffers)
        pm__staging_stop();
    *settings = fresh;
    /* The budget as it is stays so, even where it is 0 by pm_set_pinned_budget
     * and 0 here would mean PINMEM_PINNED_BUDGET's. */
    if (whole.pinned_budget != pm__budget_cap())
        pm__budget_set_cap(resolved.pinned_budget, true);
    pm__copy_publish(&resolved, true);
    pm__copy_leave();
    if (!fresh.registration_cache)
        pm__regcache_invalidate(0, UINTPTR_MAX, false);
    return PM_SUCCESS;
}
