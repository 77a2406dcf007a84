/* The copy engine's settings in effect: the defaults the machine and the
 * environment give, the one check and resolution of a pm_copy_config
 * wherever it comes from (the environment's values arrive as one), and the
 * gate that copies hold while they read the settings. The public calls that
 * change them (config.c) sit above the engine; this file sits below it, so
 * that a copy never reaches up for its settings. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "../options.h"
#include "copy.h"

static pthread_rwlock_t gate = PTHREAD_RWLOCK_INITIALIZER;
/* Held by a thread waiting to change the settings, and passed by every copy
 * that starts while change_waiting is set: a change waits for the copies in
 * flight only, not for each copy that starts meanwhile, as readers of the
 * gate (preferred by glibc) would keep it out for as long as they overlap.
 * Copies read the flag alone otherwise, so the mutex stays off their path. */
static pthread_mutex_t turnstile = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool change_waiting;
/* How many times the calling thread holds the gate for reading: one that
 * enters again (the statistics, read from inside a copy) must not wait at
 * the turnstile behind a change that waits for it. */
static _Thread_local unsigned gate_depth;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;
static pm__copy_settings settings;
/* The environment's values (0 where it names none), and the configuration
 * in effect before any call changes it. */
static pm_copy_config from_env, defaults;

/* One worker per CPU the process may use but the caller's, which works on
 * its own copy as well, up to 15; any of them may fill buffers for
 * host-to-device copies (the engine steers how many do). */
static unsigned machine_workers(void)
{
    unsigned cpus = pm__usable_cpus();
    return cpus > 16 ? 15 : cpus > 2 ? cpus - 1 : 1;
}

/* Enough buffers for every thread to fill a slice while as many again wait
 * in the DMA queue (at most 518, within the limit of 1024). */
static unsigned machine_buffers(unsigned workers, size_t slice, size_t chunk)
{
    size_t per_thread = slice < chunk ? slice : chunk; /* a slice never spans buffers */
    size_t filling = ((workers + 1) * per_thread + chunk - 1) / chunk;
    return (unsigned)(2 * filling + 4);
}

/* A quarter of the memory the process may use (a cgroup's limit binds,
 * where it sets one), at most 8 GiB, in whole MiB. */
static size_t machine_cache_max(void)
{
    unsigned long long memory = pm__usable_memory();
    size_t quarter = memory ? (size_t)(memory / 4) : (size_t)1 << 30;
    quarter = quarter < ((size_t)8 << 30) ? quarter : (size_t)8 << 30;
    return quarter > ((size_t)1 << 20) ? quarter & ~(((size_t)1 << 20) - 1) : (size_t)1 << 20;
}

/* The environment's spin time as the options table reads it (0: unset). */
static unsigned long long spin_env(const pm_copy_config *e)
{
    return e->spin_us == UINT_MAX ? PM__OPT_NONE : e->spin_us;
}

/* The largest batch element the kernel moves (PINMEM_COPY_KERNEL_MAX; its
 * -1, none, is 0 here). */
static size_t kernel_max(void)
{
    unsigned long long v = pm__option_value(PM__OPT_COPY_KERNEL_MAX);
    return v == PM__OPT_NONE ? 0 : (size_t)v;
}

/* A value given (not 0), else the environment's, else the machine's. */
static unsigned long long pick(unsigned long long given, unsigned long long env,
                               unsigned long long machine)
{
    return given ? given : env ? env : machine;
}

/* The engine's settings for a resolved configuration c. */
static pm__copy_settings settings_of(const pm_copy_config *c)
{
    return (pm__copy_settings){
        .workers = c->workers,
        .htod_workers = c->htod_workers,
        .chunk_bytes = c->chunk_bytes,
        .slice_bytes = c->slice_bytes,
        .dtoh_slice_bytes = c->dtoh_slice_bytes,
        .buffers = c->buffers,
        .direct_max = c->direct_max == (size_t)-1 ? 0 : c->direct_max,
        .dtoh_direct_max = c->dtoh_direct_max == (size_t)-1 ? 0 : c->dtoh_direct_max,
        .registration_cache = c->registration_cache == 1,
        .cache_min_bytes = c->cache_min_bytes,
        .cache_max_bytes = c->cache_max_bytes,
        .stores = c->staging_stores,
        .cpu_demotes = pm__copy_cpu_demotes(),
        .first_piece = c->first_piece_bytes,
        .dtoh_first_piece = c->dtoh_first_piece_bytes,
        .pieces = c->pieces,
        .spin_ns = c->spin_us == UINT_MAX ? 0 : 1000ull * c->spin_us,
        .ring_split = c->ring == PM_COPY_RING_SPLIT,
        .batch = c->batch,
        .kernel_max = kernel_max(),
        .kernel_staged = pm__option_value(PM__OPT_COPY_KERNEL_STAGED) == 1,
    };
}

/* The one check of a configuration, from code or the environment: each
 * field against the options table (options.h: the same limits as the
 * PINMEM_* variables), then every 0 resolved to the environment's value or
 * else the machine's default: into *out (every field set) and *s. The
 * machine's defaults: buffers of 4 MiB, one DMA each, as DMAs that large
 * keep the copy engine near its peak; CPU copies of 512 KiB slices, so that
 * a buffer fills from several cores at once and the first DMA starts early
 * (128 KiB out of the ring for copies from the device of up to 64 MiB, plan.c);
 * pageable copies up to 512 KiB to the device and 32 KiB from it take the
 * backend's own path, which is cheaper than staging for them. */
/* The fields of pm_copy_config that the options table checks. */
enum {
    F_WORKERS,
    F_HTOD_WORKERS,
    F_CHUNK,
    F_SLICE,
    F_BUFFERS,
    F_DIRECT,
    F_DTOH_DIRECT,
    F_STORES,
    F_CACHE,
    F_CACHE_MIN,
    F_CACHE_MAX,
    F_BUDGET,
    F_FIRST,
    F_PIECES,
    F_SPIN,
    F_RING,
    F_BATCH,
    F_DTOH_SLICE,
    F_DTOH_FIRST,
    F_COUNT
};

/* Every field of out: its checked value, or where that is 0 the
 * environment's, or else the machine's default. */
static void fill_config(const unsigned long long v[F_COUNT], pm_copy_config *out)
{
    const pm_copy_config *e = &from_env;
    *out = (pm_copy_config){.struct_size = sizeof *out};
    out->workers = (unsigned)pick(v[F_WORKERS], e->workers, machine_workers());
    out->htod_workers = (unsigned)pick(v[F_HTOD_WORKERS], e->htod_workers, 0); /* 0: all */
    out->chunk_bytes = pick(v[F_CHUNK], e->chunk_bytes, (size_t)4 << 20);
    out->slice_bytes = pick(v[F_SLICE], e->slice_bytes, (size_t)512 << 10);
    out->dtoh_slice_bytes = pick(v[F_DTOH_SLICE], e->dtoh_slice_bytes, (size_t)128 << 10);
    unsigned buffers = machine_buffers(out->workers, out->slice_bytes, out->chunk_bytes);
    out->buffers = (unsigned)pick(v[F_BUFFERS], e->buffers, buffers);
    out->direct_max = pick(v[F_DIRECT], e->direct_max, (size_t)512 << 10); /* -1: none */
    /* From the device, the staging engine beats the driver's own path from
     * 64 KiB on the H100 (docs/performance.md), where to the device it does
     * only above 512 KiB; a smaller direct_max (-1 included) binds both. */
    const size_t dtoh_own = (size_t)32 << 10;
    const size_t dtoh_default =
        out->direct_max == (size_t)-1 || out->direct_max < dtoh_own ? out->direct_max : dtoh_own;
    out->dtoh_direct_max = pick(v[F_DTOH_DIRECT], e->dtoh_direct_max, dtoh_default);
    out->staging_stores = (pm_copy_stores)pick(v[F_STORES], e->staging_stores, 0);
    out->registration_cache = (int)v[F_CACHE];
    out->cache_min_bytes = pick(v[F_CACHE_MIN], e->cache_min_bytes, (size_t)64 << 20);
    out->cache_max_bytes = pick(v[F_CACHE_MAX], e->cache_max_bytes, machine_cache_max());
    out->pinned_budget = pick(v[F_BUDGET], e->pinned_budget, 0);
    out->first_piece_bytes = pick(v[F_FIRST], e->first_piece_bytes, out->slice_bytes);
    /* A copy from the device queues its first DMA at once, so a large first
     * piece keeps the DMA engine busy while the workers wake, and the finer
     * slices let many of them empty it (docs/performance.md, "Changes"). */
    out->dtoh_first_piece_bytes = pick(v[F_DTOH_FIRST], e->dtoh_first_piece_bytes, (size_t)2 << 20);
    out->pieces = (unsigned)pick(v[F_PIECES], e->pieces, 1);
    /* No spinning unless asked: where the hypervisor shares the host's CPUs,
     * spinning workers take time from the threads that hold slices
     * (docs/design.md, "Workers kept awake"). */
    unsigned long long spin = pick(v[F_SPIN], spin_env(e), PM__OPT_NONE);
    out->spin_us = spin == PM__OPT_NONE ? UINT_MAX : (unsigned)spin;
    out->ring = (pm_copy_ring)pick(v[F_RING], e->ring, PM_COPY_RING_SPLIT);
    out->batch = (pm_copy_batch)pick(v[F_BATCH], e->batch, PM_COPY_BATCH_KERNEL);
}

/* Whether a field's value reads right as signed in a detail: enums, and the
 * -1 that means "none"; a size is shown unsigned, however large. */
static bool shown_signed(int field, long long shown)
{
    switch (field) {
    case F_STORES:
    case F_CACHE:
    case F_RING:
    case F_BATCH:
        return true;
    case F_DIRECT:
    case F_DTOH_DIRECT:
    case F_SPIN:
        return shown >= -1;
    default:
        return shown >= 0;
    }
}

pm_result pm__copy_resolve(const pm_copy_config *c, const char *who, pm_copy_config *out,
                           pm__copy_settings *s)
{
    const struct {
        pm__option id;
        long long shown; /* the value as given, for the detail */
        unsigned long long given;
    } f[F_COUNT] = {
        [F_WORKERS] = {PM__OPT_COPY_WORKERS, c->workers, c->workers},
        [F_HTOD_WORKERS] = {PM__OPT_COPY_HTOD_WORKERS, c->htod_workers, c->htod_workers},
        [F_CHUNK] = {PM__OPT_COPY_CHUNK, (long long)c->chunk_bytes, c->chunk_bytes},
        [F_SLICE] = {PM__OPT_COPY_SLICE, (long long)c->slice_bytes, c->slice_bytes},
        [F_BUFFERS] = {PM__OPT_COPY_BUFFERS, c->buffers, c->buffers},
        [F_DIRECT] = {PM__OPT_COPY_DIRECT_MAX, (long long)c->direct_max, c->direct_max},
        [F_DTOH_DIRECT] = {PM__OPT_COPY_DTOH_DIRECT_MAX, (long long)c->dtoh_direct_max,
                           c->dtoh_direct_max},
        [F_STORES] = {PM__OPT_COPY_STORES, c->staging_stores,
                      (unsigned long long)(long long)c->staging_stores},
        [F_CACHE] = {PM__OPT_REGISTRATION_CACHE, c->registration_cache,
                     (unsigned long long)(long long)c->registration_cache},
        [F_CACHE_MIN] = {PM__OPT_REGISTRATION_CACHE_MIN, (long long)c->cache_min_bytes,
                         c->cache_min_bytes},
        [F_CACHE_MAX] = {PM__OPT_REGISTRATION_CACHE_MAX, (long long)c->cache_max_bytes,
                         c->cache_max_bytes},
        [F_BUDGET] = {PM__OPT_PINNED_BUDGET, (long long)c->pinned_budget, c->pinned_budget},
        [F_FIRST] = {PM__OPT_COPY_FIRST_PIECE, (long long)c->first_piece_bytes,
                     c->first_piece_bytes},
        [F_PIECES] = {PM__OPT_COPY_PIECES, c->pieces, c->pieces},
        [F_SPIN] = {PM__OPT_COPY_SPIN_US, c->spin_us == UINT_MAX ? -1 : (long long)c->spin_us,
                    c->spin_us == UINT_MAX ? PM__OPT_NONE : c->spin_us},
        [F_RING] = {PM__OPT_COPY_RING, c->ring, (unsigned long long)(long long)c->ring},
        [F_BATCH] = {PM__OPT_COPY_BATCH, c->batch, (unsigned long long)(long long)c->batch},
        [F_DTOH_SLICE] = {PM__OPT_COPY_DTOH_SLICE, (long long)c->dtoh_slice_bytes,
                          c->dtoh_slice_bytes},
        [F_DTOH_FIRST] = {PM__OPT_COPY_DTOH_FIRST_PIECE, (long long)c->dtoh_first_piece_bytes,
                          c->dtoh_first_piece_bytes},
    };
    unsigned long long checked[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        char name[128];
        if (shown_signed(i, f[i].shown))
            snprintf(name, sizeof name, "%s: %s = %lld", who, pm__option_field(f[i].id),
                     f[i].shown);
        else
            snprintf(name, sizeof name, "%s: %s = %llu", who, pm__option_field(f[i].id),
                     f[i].given);
        pm_result r = pm__option_check(f[i].id, f[i].given, name, &checked[i]);
        if (r != PM_SUCCESS)
            return r;
    }
    fill_config(checked, out);
    *s = settings_of(out);
    return PM_SUCCESS;
}

/* The workers copies to the device take, as the engine counts them (at most all). */
static unsigned htod_workers_of(const pm_copy_config *c)
{
    return c->htod_workers && c->htod_workers < c->workers ? c->htod_workers : c->workers;
}

/* For pm_get_setting: the values in effect, set by code where they differ
 * from the defaults. */
void pm__copy_publish(const pm_copy_config *c, bool by_code)
{
    const pm_copy_config *d = &defaults;
    pm__option_publish(PM__OPT_COPY_WORKERS, c->workers, d->workers, by_code);
    pm__option_publish(PM__OPT_COPY_HTOD_WORKERS, htod_workers_of(c), htod_workers_of(d), by_code);
    pm__option_publish(PM__OPT_COPY_CHUNK, c->chunk_bytes, d->chunk_bytes, by_code);
    pm__option_publish(PM__OPT_COPY_SLICE, c->slice_bytes, d->slice_bytes, by_code);
    pm__option_publish(PM__OPT_COPY_DTOH_SLICE, c->dtoh_slice_bytes, d->dtoh_slice_bytes, by_code);
    pm__option_publish(PM__OPT_COPY_BUFFERS, c->buffers, d->buffers, by_code);
    pm__option_publish(PM__OPT_COPY_DIRECT_MAX,
                       c->direct_max == (size_t)-1 ? PM__OPT_NONE : c->direct_max,
                       d->direct_max == (size_t)-1 ? PM__OPT_NONE : d->direct_max, by_code);
    pm__option_publish(PM__OPT_COPY_DTOH_DIRECT_MAX,
                       c->dtoh_direct_max == (size_t)-1 ? PM__OPT_NONE : c->dtoh_direct_max,
                       d->dtoh_direct_max == (size_t)-1 ? PM__OPT_NONE : d->dtoh_direct_max,
                       by_code);
    pm__option_publish(PM__OPT_COPY_STORES, (unsigned long long)c->staging_stores,
                       (unsigned long long)d->staging_stores, by_code);
    pm__option_publish(PM__OPT_REGISTRATION_CACHE, (unsigned long long)c->registration_cache,
                       (unsigned long long)d->registration_cache, by_code);
    pm__option_publish(PM__OPT_REGISTRATION_CACHE_MIN, c->cache_min_bytes, d->cache_min_bytes,
                       by_code);
    pm__option_publish(PM__OPT_REGISTRATION_CACHE_MAX, c->cache_max_bytes, d->cache_max_bytes,
                       by_code);
    pm__option_publish(PM__OPT_COPY_FIRST_PIECE, c->first_piece_bytes, d->first_piece_bytes,
                       by_code);
    pm__option_publish(PM__OPT_COPY_DTOH_FIRST_PIECE, c->dtoh_first_piece_bytes,
                       d->dtoh_first_piece_bytes, by_code);
    pm__option_publish(PM__OPT_COPY_PIECES, c->pieces, d->pieces, by_code);
    pm__option_publish(PM__OPT_COPY_SPIN_US, c->spin_us == UINT_MAX ? PM__OPT_NONE : c->spin_us,
                       d->spin_us == UINT_MAX ? PM__OPT_NONE : d->spin_us, by_code);
    pm__option_publish(PM__OPT_COPY_RING, (unsigned long long)c->ring,
                       (unsigned long long)d->ring, by_code);
    pm__option_publish(PM__OPT_COPY_BATCH, (unsigned long long)c->batch,
                       (unsigned long long)d->batch, by_code);
}

static void choose_defaults(void)
{
    unsigned long long v;
    pm_copy_config *e = &from_env;
    *e = (pm_copy_config){.struct_size = sizeof *e};
    /* The environment was checked as the instance was made. */
    e->workers = pm__option_env(PM__OPT_COPY_WORKERS, &v) ? (unsigned)v : 0;
    e->htod_workers = pm__option_env(PM__OPT_COPY_HTOD_WORKERS, &v) ? (unsigned)v : 0;
    e->chunk_bytes = pm__option_env(PM__OPT_COPY_CHUNK, &v) ? (size_t)v : 0;
    e->slice_bytes = pm__option_env(PM__OPT_COPY_SLICE, &v) ? (size_t)v : 0;
    e->dtoh_slice_bytes = pm__option_env(PM__OPT_COPY_DTOH_SLICE, &v) ? (size_t)v : 0;
    e->buffers = pm__option_env(PM__OPT_COPY_BUFFERS, &v) ? (unsigned)v : 0;
    e->direct_max = pm__option_env(PM__OPT_COPY_DIRECT_MAX, &v) ? (size_t)v : 0;
    e->dtoh_direct_max = pm__option_env(PM__OPT_COPY_DTOH_DIRECT_MAX, &v) ? (size_t)v : 0;
    e->staging_stores = (pm_copy_stores)pm__option_value(PM__OPT_COPY_STORES);
    e->registration_cache = (int)pm__option_value(PM__OPT_REGISTRATION_CACHE);
    e->cache_min_bytes = pm__option_env(PM__OPT_REGISTRATION_CACHE_MIN, &v) ? (size_t)v : 0;
    e->cache_max_bytes = pm__option_env(PM__OPT_REGISTRATION_CACHE_MAX, &v) ? (size_t)v : 0;
    e->pinned_budget = pm__option_env(PM__OPT_PINNED_BUDGET, &v) ? v : 0;
    e->first_piece_bytes = pm__option_env(PM__OPT_COPY_FIRST_PIECE, &v) ? (size_t)v : 0;
    e->dtoh_first_piece_bytes =
        pm__option_env(PM__OPT_COPY_DTOH_FIRST_PIECE, &v) ? (size_t)v : 0;
    e->pieces = pm__option_env(PM__OPT_COPY_PIECES, &v) ? (unsigned)v : 0;
    e->spin_us = pm__option_env(PM__OPT_COPY_SPIN_US, &v)
                     ? (v == PM__OPT_NONE ? UINT_MAX : (unsigned)v)
                     : 0;
    e->ring = (pm_copy_ring)(pm__option_env(PM__OPT_COPY_RING, &v) ? v : 0);
    e->batch = (pm_copy_batch)(pm__option_env(PM__OPT_COPY_BATCH, &v) ? v : 0);
    pm_copy_config asked = {.struct_size = sizeof asked,
                            .registration_cache = e->registration_cache};
    if (pm__copy_resolve(&asked, "PINMEM_COPY_*", &defaults, &settings) != PM_SUCCESS) {
        /* Cannot be (the same values passed the same check at pm_init);
         * the machine's defaults, should it ever be. */
        *e = (pm_copy_config){.struct_size = sizeof *e};
        asked.registration_cache = 0;
        pm__copy_resolve(&asked, "PINMEM_COPY_*", &defaults, &settings);
    }
    pm__copy_publish(&defaults, false);
}

const pm__copy_settings *pm__copy_enter(void)
{
    pthread_once(&defaults_once, choose_defaults);
    if (gate_depth++ == 0 && atomic_load_explicit(&change_waiting, memory_order_acquire)) {
        pthread_mutex_lock(&turnstile);
        pthread_mutex_unlock(&turnstile);
    }
    pthread_rwlock_rdlock(&gate);
    return &settings;
}

pm__copy_settings *pm__copy_enter_to_change(void)
{
    pthread_once(&defaults_once, choose_defaults);
    pthread_mutex_lock(&turnstile);
    atomic_store_explicit(&change_waiting, true, memory_order_release);
    pthread_rwlock_wrlock(&gate);
    atomic_store_explicit(&change_waiting, false, memory_order_relaxed);
    pthread_mutex_unlock(&turnstile);
    return &settings;
}

void pm__copy_leave(void)
{
    if (gate_depth) /* 0 for the thread that changed the settings */
        gate_depth--;
    pthread_rwlock_unlock(&gate);
}
