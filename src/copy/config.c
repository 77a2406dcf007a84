/* Copy settings: defaults from the machine and the environment, changed by
 * pm_copy_set_config between copies; the engine's counters; the backend's
 * copy calls. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../budget.h"
#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "../versioned.h"
#include "copy.h"

pm__copy_counters pm__copy_count;

static pthread_rwlock_t gate = PTHREAD_RWLOCK_INITIALIZER;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;
static pm__copy_settings settings;

static size_t env_size(const char *name, size_t fallback)
{
    unsigned long long v;
    return pm__parse_size(getenv(name), &v) && v > 0 ? (size_t)v : fallback;
}

/* One worker per core but the caller's, which works on its own copy as
 * well, up to 15; any of them may fill buffers for host-to-device copies (the
 * engine steers how many do). Buffers of 4 MiB, one DMA each: on
 * the H100, DMAs queued back to back reach 47 GB/s at 1 MiB, 51 at 2 MiB and
 * 53 at 4 MiB. CPU copies of 512 KiB slices, so that a buffer fills from
 * several cores at once and the first DMA starts early. Enough buffers for
 * every thread to fill a slice while as many again wait in the DMA queue. */
static void choose_defaults(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned workers = cpus > 16 ? 15 : cpus > 2 ? (unsigned)cpus - 1 : 1;
    settings.workers = (unsigned)env_size("PINMEM_COPY_WORKERS", workers);
    settings.htod_workers = (unsigned)env_size("PINMEM_COPY_HTOD_WORKERS", 0) /* 0: all */;
    settings.chunk_bytes = env_size("PINMEM_COPY_CHUNK", (size_t)4 << 20);
    settings.slice_bytes = env_size("PINMEM_COPY_SLICE", (size_t)512 << 10);
    size_t filling = ((settings.workers + 1) * settings.slice_bytes + settings.chunk_bytes - 1) /
                     settings.chunk_bytes;
    settings.buffers = (unsigned)env_size("PINMEM_COPY_BUFFERS", 2 * filling + 4);
    /* Measured on the H100: staged copies take 1.3x the driver's time at 1 MiB
     * and 0.56x at 4 MiB. */
    settings.direct_max = env_size("PINMEM_COPY_DIRECT_MAX", (size_t)2 << 20);
    const char *stores = getenv("PINMEM_COPY_STORES");
    settings.default_stores = !stores                           ? PM_COPY_STORES_DEFAULT
                              : strcmp(stores, "cached") == 0    ? PM_COPY_STORES_CACHED
                              : strcmp(stores, "streaming") == 0 ? PM_COPY_STORES_STREAMING
                              : strcmp(stores, "demoting") == 0  ? PM_COPY_STORES_DEMOTING
                                                                 : PM_COPY_STORES_DEFAULT;
    settings.stores = settings.default_stores;
    settings.cpu_demotes = pm__copy_cpu_demotes();
    const char *cache = getenv("PINMEM_REGISTRATION_CACHE");
    settings.registration_cache = cache && strcmp(cache, "1") == 0;
    settings.cache_min_bytes = (size_t)64 << 20;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t quarter = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 4 : (size_t)1 << 30;
    settings.cache_max_bytes = quarter < ((size_t)8 << 30) ? quarter : (size_t)8 << 30;
}

const pm__copy_settings *pm__copy_enter(void)
{
    pthread_once(&defaults_once, choose_defaults);
    pthread_rwlock_rdlock(&gate);
    return &settings;
}

void pm__copy_leave(void) { pthread_rwlock_unlock(&gate); }

/* The configuration in effect, every field filled (gate held). */
static pm_copy_config config_of(const pm__copy_settings *s)
{
    return (pm_copy_config){
        .struct_size = sizeof(pm_copy_config),
        .workers = s->workers,
        .htod_workers = pm__copy_htod_workers(s),
        .chunk_bytes = s->chunk_bytes,
        .buffers = s->buffers,
        .direct_max = s->direct_max,
        .registration_cache = s->registration_cache,
        .cache_min_bytes = s->cache_min_bytes,
        .cache_max_bytes = s->cache_max_bytes,
        .pinned_budget = pm__budget_cap(),
        .staging_stores = s->stores,
        .slice_bytes = s->slice_bytes,
    };
}

pm_result pm_copy_get_config(pm_copy_config *config)
{
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
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_copy_set_config", given);
    if (r != PM_SUCCESS)
        return r;
    /* An older, smaller struct leaves the fields it lacks as they are. */
    pm_copy_config whole = config_of(pm__copy_enter());
    pm__copy_leave();
    memcpy(&whole, given, given->struct_size);
    const pm_copy_config *config = &whole;
    if (config->registration_cache < 0 || config->registration_cache > 1)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_copy_set_config: registration_cache is 0 or 1");
    if (config->staging_stores < PM_COPY_STORES_DEFAULT ||
        config->staging_stores > PM_COPY_STORES_DEMOTING)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_copy_set_config: staging_stores is not a pm_copy_stores value");
    if (config->workers > 256 || config->htod_workers > 256 || config->buffers > 4096 ||
        config->chunk_bytes > ((size_t)1 << 30) || config->slice_bytes > ((size_t)1 << 30))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_copy_set_config: at most 256 workers, 4096 buffers of 1 GiB each");
    pthread_once(&defaults_once, choose_defaults);
    pthread_rwlock_wrlock(&gate);
    pm__copy_settings fresh = settings;
    if (config->workers)
        fresh.workers = config->workers;
    if (config->htod_workers)
        fresh.htod_workers = config->htod_workers;
    if (config->chunk_bytes)
        fresh.chunk_bytes = (config->chunk_bytes + 4095) & ~(size_t)4095;
    if (config->buffers)
        fresh.buffers = config->buffers;
    if (config->direct_max)
        fresh.direct_max = config->direct_max == (size_t)-1 ? 0 : config->direct_max;
    fresh.registration_cache = config->registration_cache == 1;
    /* DEFAULT goes back to the default (the environment's, if it names one). */
    fresh.stores = config->staging_stores != PM_COPY_STORES_DEFAULT ? config->staging_stores
                                                                    : settings.default_stores;
    if (config->slice_bytes)
        fresh.slice_bytes = (config->slice_bytes + 4095) & ~(size_t)4095;
    if (config->cache_min_bytes)
        fresh.cache_min_bytes = config->cache_min_bytes;
    if (config->cache_max_bytes)
        fresh.cache_max_bytes = config->cache_max_bytes;
    /* A new shape of engine starts with the next staged copy; otherwise the
     * ring stays (it keeps staged copies working under a new budget). */
    if (fresh.workers != settings.workers || fresh.htod_workers != settings.htod_workers ||
        fresh.chunk_bytes != settings.chunk_bytes ||
        fresh.buffers != settings.buffers)
        pm__staging_stop();
    settings = fresh;
    pm__budget_set_cap(config->pinned_budget);
    pthread_rwlock_unlock(&gate);
    if (!fresh.registration_cache)
        pm__regcache_invalidate(0, UINTPTR_MAX, false);
    return PM_SUCCESS;
}

pm_result pm_copy_get_stats(pm_copy_stats *stats)
{
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_copy_get_stats", stats);
    if (r != PM_SUCCESS)
        return r;
    pm__copy_counters *c = &pm__copy_count;
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
        .cache_listening = pm__regcache_listening(),
        .staged_pieces = atomic_load(&c->staged_pieces),
        .staging_copy_ns = atomic_load(&c->staging_copy_ns),
        .staging_wait_ns = atomic_load(&c->staging_wait_ns),
        .staging_queue_ns = atomic_load(&c->staging_queue_ns),
        .htod_fillers = pm__staging_fillers(),
        .demoted_bytes = atomic_load(&c->demoted_bytes),
        .staging_threads = pm__staging_threads(),
    };
    memcpy(stats, &full, stats->struct_size);
    return PM_SUCCESS;
}

pm_result pm__copy_backend(const pm__backend *b, pm__direction dir, void *host, pm_deviceptr dev,
                           size_t n, pm_stream_t s, pm__copy_via via)
{
    if (PM__TEST_FAULT(pm__fault_backend_copy))
        return pm__fail(PM_ERROR_UNKNOWN, "%s copy failed (injected fault)",
                        dir == PM__HTOD ? "host-to-device" : "device-to-host");
    if (via == PM__VIA_SYNC)
        return dir == PM__HTOD ? b->copy_htod(dev, host, n) : b->copy_dtoh(host, dev, n);
    bool pinned = via == PM__VIA_PINNED;
    return dir == PM__HTOD ? b->copy_htod_async(dev, host, n, s, pinned)
                           : b->copy_dtoh_async(host, dev, n, s, pinned);
}
