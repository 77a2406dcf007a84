/* A staging engine's ring: planned to fit what may still be pinned, pinned
 * in one range with its page of flags, its device twin for kernel jobs, and
 * the engine's start (the ring and the workers) and stop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../budget.h"
#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "staging_engine.h"

/* The page of flags pinned at the end of a ring of n buffers: none where
 * the backend cannot write flags (the engine then waits on markers alone).
 * One pinned range with the ring, as a page of its own would lie beside the
 * program's mappings, where the driver would answer for it. */
static size_t flags_bytes(unsigned n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return pm__instance_backend()->stream_write_flag && n * FLAG_STRIDE * sizeof(uint32_t) <= page
               ? page
               : 0;
}

/* lock held, the ring just pinned: its flags, where it has them. */
static void start_flags(engine *eng)
{
    const pm__backend *be = pm__instance_backend();
    const size_t bytes = flags_bytes(eng->n_buffers);
    uint8_t *p = (uint8_t *)eng->ring_base + (size_t)eng->n_buffers * eng->chunk;
    pm_deviceptr dev = 0;
    pm__detail_saved before; /* no flags is no failure */
    pm__detail_save(&before);
    if (bytes && be->device_pointer(&dev, p, NULL) == PM_SUCCESS) {
        memset(p, 0, bytes);
        eng->flags = (_Atomic uint32_t *)(void *)p;
        eng->flags_dev = dev;
    }
    pm__detail_restore(&before);
}

/* Waits for the last DMA of every buffer; false where a wait failed, and a
 * DMA may then still read or write the ring. */
static bool ring_settled(engine *eng, const pm__backend *be)
{
    bool settled = true;
    for (unsigned i = 0; eng->ring && i < eng->n_buffers; i++)
        if (eng->ring[i].pending && (PM__TEST_FAULT(pm__fault_marker_wait) ||
                                     be->marker_synchronize(&eng->ring[i].mark) != PM_SUCCESS))
            settled = false;
    return settled;
}

/* Frees whatever the ring holds (gate held for writing, or during start).
 * Its waits are relaxed, as a copy's are: the thread that stops the engine
 * (a new configuration) may run beside another thread's graph capture. A
 * ring whose DMAs could not be waited for stays pinned, lost to the process,
 * rather than be unmapped under them. */
static void free_ring(engine *eng)
{
    const pm__backend *be = pm__instance_backend();
    const int mode = be->captures_relax();
    const bool settled = ring_settled(eng, be);
    for (unsigned i = 0; eng->ring && i < eng->n_buffers; i++)
        if (eng->ring[i].mark.handle)
            be->marker_release(&eng->ring[i].mark);
    if (eng->ring_base && settled) {
        be->host_free(eng->ring_base, eng->ring_pin_len, eng->ring_tag);
        pm__budget_give(eng->ring_pin_len);
    }
    /* Freed with the ring: its last writes lie behind the markers waited for above. */
    eng->flags = NULL;
    if (!settled)
        eng->scratch = 0; /* the twin too may still be read by a queued DMA */
    pm__staging_release_twin(eng);
    pm__staging_release_lanes(eng);
    be->captures_restore(mode);
    free(eng->ring);
    free(eng->queue);
    eng->ring = NULL;
    eng->queue = NULL;
    eng->ring_base = NULL;
    eng->ring_pin_len = 0;
    eng->n_buffers = eng->queue_count = eng->queue_head = 0;
}

/* The largest ring, whatever the settings ask (buffers of up to 256 MiB, up
 * to 1024 of them): more than this pins memory for no copy's gain. */
#define RING_MAX ((size_t)2 << 30)
/* The smallest: two buffers (one filled while the other's DMA runs) of 64
 * KiB. */
#define RING_MIN_CHUNK ((size_t)64 << 10)
enum { RING_MIN_BUFFERS = 2 };
/* A ring takes at most this share of what the system's limit or the pinned
 * budget lets the process still pin, so that the program's own pinned
 * memory fits beside it. */
enum { RING_SHARE = 4 };
/* After a refusal, how long before a staged copy looks again (unless pinned
 * memory was given back meanwhile): looking reads /proc. */
#define RING_RETRY_NS 100000000ull

static size_t page_floor(size_t n, size_t page) { return n / page * page; }

static void size_text(size_t n, char *buf, size_t cap)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    while (n >= 1024 && n % 1024 == 0 && u < 4) {
        n /= 1024;
        u++;
    }
    snprintf(buf, cap, "%zu %s", n, units[u]);
}

/* The ring to pin for set now: as configured where it fits, else smaller
 * (buffers halved down to the slice size, then fewer of them, then smaller
 * again down to 64 KiB), else none, with the reason in note. Reads how
 * much may still be pinned; pins nothing. */
static pm__ring_plan plan_ring(const pm__copy_settings *set)
{
    pm__ring_plan p = {.buffers = set->buffers, .chunk = set->chunk_bytes, .fits = true};
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t room = pm__instance_backend()->pinnable_bytes();
    const char *bound = "RLIMIT_MEMLOCK";
    unsigned long long cap = pm__budget_cap(), pinned = pm__budget_pinned();
    if (cap && cap - (pinned < cap ? pinned : cap) < room) {
        room = (size_t)(cap - (pinned < cap ? pinned : cap));
        bound = "the pinned budget";
    }
    size_t allow = room == SIZE_MAX ? SIZE_MAX : room / RING_SHARE;
    if (allow > RING_MAX) {
        allow = RING_MAX;
        bound = NULL; /* the ring's own limit binds */
    }
    if ((size_t)p.buffers * p.chunk <= allow)
        return p;
    size_t floor = set->slice_bytes < p.chunk ? set->slice_bytes : p.chunk;
    floor = floor > RING_MIN_CHUNK ? floor : RING_MIN_CHUNK;
    while ((size_t)p.buffers * p.chunk > allow && page_floor(p.chunk / 2, page) >= floor)
        p.chunk = page_floor(p.chunk / 2, page);
    unsigned fewest = set->buffers < RING_MIN_BUFFERS ? set->buffers : RING_MIN_BUFFERS;
    if ((size_t)p.buffers * p.chunk > allow)
        p.buffers = allow / p.chunk > fewest ? (unsigned)(allow / p.chunk) : fewest;
    while ((size_t)p.buffers * p.chunk > allow && page_floor(p.chunk / 2, page) >= RING_MIN_CHUNK)
        p.chunk = page_floor(p.chunk / 2, page);
    char want[32], left[32];
    size_text(set->chunk_bytes, want, sizeof want);
    size_text(room, left, sizeof left);
    if ((size_t)p.buffers * p.chunk > allow) {
        p.fits = false;
        snprintf(p.note, sizeof p.note,
                 "no staging ring: %s leaves %s to pin, and a ring takes at most a quarter; "
                 "pageable copies take the backend's own path",
                 bound, left);
    } else if (!bound) {
        snprintf(p.note, sizeof p.note,
                 "smaller than the %u x %s configured: a ring pins at most 2 GiB", set->buffers,
                 want);
    } else {
        snprintf(p.note, sizeof p.note,
                 "smaller than the %u x %s configured: %s leaves %s to pin, and a ring takes "
                 "at most a quarter",
                 set->buffers, want, bound, left);
    }
    return p;
}

pm__ring_plan pm__staging_ring(const pm__copy_settings *set)
{
    engine *eng = &pm__staging_engines[0];
    pthread_mutex_lock(&eng->lock);
    /* The ring pinned, or the last refusal until a copy tries again, or
     * what a copy would pin now. */
    pm__ring_plan p = eng->started || eng->retry_after_ns ? eng->plan : plan_ring(set);
    p.pinned = eng->started;
    p.base = eng->started ? eng->ring_base : NULL;
    pthread_mutex_unlock(&eng->lock);
    return p;
}

/* Where the machine has several NUMA nodes, the one nearest the engine's
 * device, so that the device's DMAs and the workers' copies meet in that
 * node's memory; else -1 (where the process's policy puts it). */
static int ring_node(const engine *eng)
{
    const pm__backend *be = pm__instance_backend();
    const int ordinal = (int)(eng - pm__staging_engines);
    pm_device_info info = {.struct_size = sizeof info};
    if ((pm__only_numa_node() >= 0 && !PM__TEST_RING_ON_NODE()) || ordinal >= be->device_count)
        return -1;
    pm__detail_saved before; /* an unknown node leaves the ring unbound: no failure */
    pm__detail_save(&before);
    const int node = be->device_info(ordinal, &info) == PM_SUCCESS ? info.host_numa_node : -1;
    pm__detail_restore(&before);
    return node;
}

/* lock held: pins the ring planned, or fails (nothing pinned, nothing
 * touched where the plan says it cannot fit). */
static pm_result pin_ring(engine *eng, const pm__copy_settings *set)
{
    unsigned long long now = pm__now_ns();
    if (now < eng->retry_after_ns && pm__budget_pinned() >= eng->pinned_at_refusal)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s", eng->plan.note);
    eng->plan = plan_ring(set);
    pm_result r = PM_SUCCESS;
    size_t bytes = (size_t)eng->plan.buffers * eng->plan.chunk + flags_bytes(eng->plan.buffers);
    if (!eng->plan.fits)
        r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s", eng->plan.note);
    else if (PM__TEST_FAULT(pm__fault_stage_pin))
        r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "pinning the staging ring failed (injected fault)");
    else
        r = pm__budget_take(bytes, "copy engine's staging ring");
    if (r == PM_SUCCESS) {
        const pm__backend *be = pm__instance_backend();
        const int node = ring_node(eng);
        pm__detail_saved before;
        pm__detail_save(&before);
        r = be->host_alloc(bytes, 0, node, &eng->ring_base, &eng->ring_pin_len, &eng->ring_tag);
        if (r != PM_SUCCESS && node >= 0) { /* a binding refused costs the placement alone */
            r = be->host_alloc(bytes, 0, -1, &eng->ring_base, &eng->ring_pin_len, &eng->ring_tag);
            if (r == PM_SUCCESS)
                pm__detail_restore(&before);
        }
        if (r == PM_SUCCESS && eng->ring_pin_len != bytes) { /* the backend pinned more: count it */
            pm_result more =
                pm__budget_take(eng->ring_pin_len - bytes, "copy engine's staging ring");
            if (more != PM_SUCCESS) {
                be->host_free(eng->ring_base, eng->ring_pin_len, eng->ring_tag);
                eng->ring_base = NULL;
                r = more;
            }
        }
        if (r != PM_SUCCESS)
            pm__budget_give(bytes);
    }
    if (r != PM_SUCCESS) {
        eng->ring_base = NULL;
        eng->ring_pin_len = 0;
        if (eng->plan.fits) /* the reason is the failure's */
            snprintf(eng->plan.note, sizeof eng->plan.note,
                     "no staging ring: %s; pageable copies take the backend's own path",
                     pm_last_error_detail());
        eng->plan.fits = false;
        eng->retry_after_ns = now + RING_RETRY_NS;
        eng->pinned_at_refusal = pm__budget_pinned();
        return pm__fail(r, "%s", eng->plan.note);
    }
    eng->retry_after_ns = 0;
    return PM_SUCCESS;
}

static void stop(engine *eng)
{
    pthread_mutex_lock(&eng->lock);
    eng->stopping = true;
    atomic_store(&eng->stop_spinning, true);
    note_event(eng); /* for the workers that spin */
    pthread_cond_broadcast(&eng->has_work);
    pthread_cond_broadcast(&eng->dtoh_work);
    pthread_cond_broadcast(&eng->buffer_freed);
    pthread_mutex_unlock(&eng->lock);
    for (unsigned i = 0; i < eng->n_threads; i++)
        pthread_join(eng->threads[i], NULL);
    free(eng->threads);
    free(eng->starts);
    eng->threads = NULL;
    eng->starts = NULL;
    free_ring(eng);
    pthread_mutex_lock(&eng->lock);
    /* Under the lock: the statistics count the threads without the gate. */
    eng->n_threads = eng->want_threads = 0;
    eng->stopping = false;
    atomic_store(&eng->stop_spinning, false);
    eng->started = false;
    eng->retry_after_ns = 0; /* a new shape of ring may fit where the old did not */
    pthread_mutex_unlock(&eng->lock);
}

void pm__staging_stop(void)
{
    for (unsigned e = 0; e < PM__ENGINES_MAX; e++)
        stop(&pm__staging_engines[e]);
}

/* The ring and the workers, made on the first staged copy. The ring is
 * pinned in one piece, as large as configured where the system's limit and
 * the pinned budget leave room for it, else smaller (plan_ring); where none
 * fits, the staged copy fails and the caller falls back to the backend's
 * own path. lock held. */
static pm_result start_locked(engine *eng, const pm__copy_settings *set)
{
    pm_result r = pin_ring(eng, set);
    if (r != PM_SUCCESS)
        return r;
    unsigned n = eng->plan.buffers;
    eng->ring = calloc(n, sizeof *eng->ring);
    eng->queue = calloc(n, sizeof *eng->queue);
    if (!eng->ring || !eng->queue) {
        free_ring(eng);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "copy engine: out of memory");
    }
    for (unsigned i = 0; i < n; i++) {
        eng->ring[i].p = (uint8_t *)eng->ring_base + (size_t)i * eng->plan.chunk;
        eng->queue[i] = i;
    }
    eng->n_buffers = eng->queue_count = n;
    eng->chunk = eng->plan.chunk;
    start_flags(eng);
    /* Half the ring: enough that the DMA engine never waits for a thread to
     * come back from copying out; the other half is left for other callers'
     * copies. */
    eng->dtoh_ahead = eng->n_buffers / 2 < AHEAD_MAX ? eng->n_buffers / 2 : AHEAD_MAX;
    eng->htod_workers = pm__copy_htod_workers(set);
    eng->fillers = eng->htod_workers / 2 + 1; /* steered from the middle */
    if (eng->fillers > eng->htod_workers)
        eng->fillers = eng->htod_workers;
    /* A new shape of engine learns afresh. */
    memset(&eng->store_choice, 0, sizeof eng->store_choice);
    memset(eng->fillers_of, 0, sizeof eng->fillers_of);
    eng->want_threads = set->workers;
    pm__staging_start_workers_locked(eng);
    eng->trace = pm__trace_get();
    eng->started = true;
    return PM_SUCCESS;
}

pm_result pm__staging_ensure_started_locked(engine *eng, const pm__copy_settings *set)
{
    if (!eng->started)
        return start_locked(eng, set);
    if (eng->n_threads < eng->want_threads)
        pm__staging_start_workers_locked(eng);
    return PM_SUCCESS;
}
