/* Legacy-stream frees and allocations by threads in a context the user made
 * (cuCtxCreate) on the CUDA backend: each context has a legacy stream of its
 * own, so a block freed on one must not wait in a thread cache for another's,
 * nor be handed to an allocation on another's before its work is done. And
 * the flag words that serve as markers in such a context: many released
 * before their values arrive, and waited for from a thread with no context. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "context_util.h"
#include "pool_util.h"
#include "stream_util.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
/* The legacy streams' work waits here until the case opens the gate, or 3 s
 * pass, so that a case whose check fails still ends. */
static void wait_gate_a_while(void *arg)
{
    (void)arg;
    for (int waited_ms = 0; !atomic_load(&gate_open) && waited_ms < 3000; waited_ms++)
        usleep(1000);
}

typedef struct elsewhere {
    pm_mem_pool_t pool;
    void *block;
    bool pushed, block_seen;
} elsewhere;

/* In the user's context: an event recorded on the legacy stream, which
 * sends every block cached for that handle, this thread's or not, behind a
 * marker; then the pool's free blocks are looked through. */
static void *flush_in_their_context(void *arg)
{
    elsewhere *e = arg;
    e->pushed = api.push(theirs) == CUDA_SUCCESS;
    if (!e->pushed)
        return NULL;
    pm_event_t ev = NULL;
    CHECK_RESULT(pm_event_create(&ev), PM_SUCCESS);
    if (ev) {
        CHECK_RESULT(pm_event_record(ev, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_event_destroy(ev), PM_SUCCESS);
    }
    e->block_seen = among(e->block, 4096, e->pool, false, NULL);
    CUcontext popped;
    api.pop(&popped);
    return NULL;
}

/* A block freed on the legacy stream of pinmem's context (this thread has
 * none) while that stream waits at the gate stays out of reach when a
 * thread in the user's context flushes the cache it waits in: its marker is
 * recorded on the stream it was freed on, not on the flushing thread's.
 * (Had the block come free, a trim could unpin its page while the stream
 * waits: that hung until the gate opened.) */
static void flushed_from_their_context(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    elsewhere e = {.pool = pool};
    atomic_store(&gate_open, 0);
    if (pm_mem_alloc_from_pool(&e.block, 4096, pool) == PM_SUCCESS &&
        pm_stream_launch_host_func(NULL, wait_gate_a_while, NULL) == PM_SUCCESS) {
        CHECK_RESULT(pm_mem_free_async(e.block, NULL), PM_SUCCESS);
        pthread_t t;
        if (pthread_create(&t, NULL, flush_in_their_context, &e) == 0)
            pthread_join(t, NULL);
        CHECK(e.pushed);
        CHECK(!e.block_seen);
    } else {
        CHECK(!"a block and a gate on the legacy stream");
    }
    atomic_store(&gate_open, 1);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK(among(e.block, 4096, pool, false, NULL));
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A block freed on the user's context's legacy stream while that stream
 * waits at the gate is not handed to this thread's next allocation on the
 * legacy stream once it has left that context: that is pinmem's context's
 * legacy stream, which did not wait. */
static void freed_in_their_context(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *block = NULL, *got = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&block, 4096, pool), PM_SUCCESS);
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    atomic_store(&gate_open, 0);
    CUcontext popped;
    if (pm_stream_launch_host_func(NULL, wait_gate_a_while, NULL) == PM_SUCCESS) {
        CHECK_RESULT(pm_mem_free_async(block, NULL), PM_SUCCESS);
        CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
        CHECK_RESULT(pm_mem_alloc_from_pool_async(&got, 4096, pool, NULL), PM_SUCCESS);
        CHECK(got != block);
        CHECK(!among(block, 4096, pool, true, NULL));
        if (got)
            CHECK_RESULT(pm_mem_free_async(got, NULL), PM_SUCCESS);
        CHECK(api.push(theirs) == CUDA_SUCCESS);
    } else {
        CHECK(!"a gate on the user's context's legacy stream");
    }
    atomic_store(&gate_open, 1);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    api.pop(&popped);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK(among(block, 4096, pool, false, NULL));
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Blocks freed on a stream of a context the user then destroys, with that
 * stream's work never waited for, hold nothing of the context: allocations,
 * a trim and the pool's destruction in pinmem's context go on, and the
 * blocks come back. Before markers there were flags, the pool queried the
 * context's dead events and crashed (3 runs of 3 on an H200). */
static void frees_in_a_context_destroyed_at_once(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    pm_capabilities caps = {.struct_size = sizeof caps};
    CUdevice device;
    CHECK_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    CHECK(api.device_get(&device, caps.device_ordinal) == CUDA_SUCCESS);
    for (unsigned round = 0; round < 8; round++) {
        CUcontext brief = NULL;
        if (api.create(&brief, 0, device) != CUDA_SUCCESS) {
            CHECK(!"a context");
            break;
        }
        pm_stream_t s = NULL;
        void *blocks[64] = {0};
        CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
        for (unsigned i = 0; s && i < 64; i++) {
            CHECK_RESULT(pm_mem_alloc_from_pool(&blocks[i], 65536, pool), PM_SUCCESS);
            if (blocks[i])
                CHECK_RESULT(pm_mem_free_async(blocks[i], s), PM_SUCCESS);
        }
        pm_event_t ev = NULL; /* its record sends the cached frees behind a marker */
        CHECK_RESULT(pm_event_create(&ev), PM_SUCCESS);
        if (ev && s) {
            CHECK_RESULT(pm_event_record(ev, s), PM_SUCCESS);
            CHECK_RESULT(pm_event_destroy(ev), PM_SUCCESS);
        }
        CUcontext popped;
        CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == brief);
        CHECK(api.destroy(brief) == CUDA_SUCCESS); /* its streams with it */
        void *again[64] = {0};
        for (unsigned i = 0; i < 64; i++)
            CHECK_RESULT(pm_mem_alloc_from_pool(&again[i], 65536, pool), PM_SUCCESS);
        for (unsigned i = 0; i < 64; i++)
            if (again[i])
                CHECK_RESULT(pm_mem_free(again[i]), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}
#endif

#ifdef PINMEM_HAVE_CUDA_HEADERS
/* Whether the driver, asked in the device's primary context (pinmem's),
 * knows p as pinned. */
static bool pinned_to_the_driver(void *p, CUdevice device)
{
    CUcontext primary = NULL, popped = NULL;
    unsigned flags = 0;
    if (api.primary_retain(&primary, device) != CUDA_SUCCESS)
        return false;
    const bool pushed = api.push(primary) == CUDA_SUCCESS;
    const bool pinned = pushed && api.mem_host_get_flags(&flags, p) == CUDA_SUCCESS;
    if (pushed)
        api.pop(&popped);
    api.primary_release(device);
    return pinned;
}

/* Memory pinned while a context the user made was current (a host
 * allocation, a write-combined one the driver makes, a pool's chunk) stays
 * pinned once that context is destroyed: the driver frees or unregisters what was pinned
 * in a context with it (docs/driver-behavior.md), so pinmem pins in its own. */
static void kept_memory_outlives_their_context(void)
{
    pm_capabilities caps = {.struct_size = sizeof caps};
    CUdevice device;
    CUcontext brief = NULL;
    CHECK_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    REQUIRE(api.device_get(&device, caps.device_ordinal) == CUDA_SUCCESS);
    REQUIRE(api.create(&brief, 0, device) == CUDA_SUCCESS);
    pm_mem_pool_t pool = make_pool(0);
    void *host = NULL, *combined = NULL, *block = NULL;
    CHECK_RESULT(pm_mem_host_alloc(&host, 1 << 20, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_alloc(&combined, 1 << 16, PM_MEMHOSTALLOC_WRITECOMBINED), PM_SUCCESS);
    if (pool)
        CHECK_RESULT(pm_mem_alloc_from_pool(&block, 1 << 16, pool), PM_SUCCESS);
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == brief);
    CHECK(api.destroy(brief) == CUDA_SUCCESS);
    void *kept[] = {host, combined, block};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (kept[i] && !pinned_to_the_driver(kept[i], device))
            CHECK(!"memory pinmem pinned in the user's context is still pinned");
    if (host)
        memset(host, 1, 1 << 20); /* still mapped */
    if (block)
        CHECK_RESULT(pm_mem_free(block), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(host), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(combined), PM_SUCCESS);
    if (pool)
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

enum { many_events = 2500 }; /* flag words on more than two pages */

/* Events recorded on the user's context's legacy stream, first with it
 * running (pinning pages enough for them all), then while it waits at the
 * gate: each a flag word whose value has not arrived, all destroyed before
 * the gate opens, so every word is released before it drains. Events and
 * pages are made while no host function runs: making either can wait for
 * one running on another stream (docs/driver-behavior.md). */
static void many_flags_released_early(void)
{
    static pm_event_t events[many_events];
    for (int round = 0; round < 2; round++) {
        int made = 0;
        while (made < many_events && pm_event_create(&events[made]) == PM_SUCCESS)
            made++;
        CHECK(made == many_events);
        const bool pushed = api.push(theirs) == CUDA_SUCCESS;
        CHECK(pushed);
        const bool gated = round == 1;
        atomic_store(&gate_open, gated ? 0 : 1);
        if (pushed)
            CHECK_RESULT(pm_stream_launch_host_func(NULL, wait_gate_a_while, NULL), PM_SUCCESS);
        int recorded = 0, slowest = 0;
        double slowest_ms = 0;
        while (pushed && recorded < made) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (pm_event_record(events[recorded], NULL) != PM_SUCCESS)
                break;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            const double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
            if (ms > slowest_ms) {
                slowest_ms = ms;
                slowest = recorded;
            }
            recorded++;
        }
        CHECK(recorded == made);
        int waiting = 0;
        for (int i = 0; gated && i < recorded; i++)
            waiting += pm_event_query(events[i]) == PM_ERROR_NOT_READY;
        if (gated)
            printf("flags: %d of %d events destroyed before their value arrived; the slowest "
                   "record, number %d, took %.3f ms\n", waiting, recorded, slowest + 1, slowest_ms);
        for (int i = 0; i < made; i++)
            CHECK_RESULT(pm_event_destroy(events[i]), PM_SUCCESS);
        atomic_store(&gate_open, 1);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
        CUcontext popped;
        if (pushed)
            CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
    }
}

static void *wait_without_context(void *event)
{
    CHECK_RESULT(pm_stream_wait_event(NULL, event), PM_SUCCESS);
    CHECK_RESULT(pm_stream_wait_event(PM_STREAM_PER_THREAD, event), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    return NULL;
}

/* A thread with no current context makes its legacy and own streams wait
 * for an event of the user's context (a flag word): pinmem's context
 * serves them, as it does for an event of its own. */
static void flag_waited_without_context(void)
{
    pm_event_t ev = NULL;
    REQUIRE_RESULT(pm_event_create(&ev), PM_SUCCESS);
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    CHECK_RESULT(pm_event_record(ev, NULL), PM_SUCCESS);
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
    pthread_t t;
    if (pthread_create(&t, NULL, wait_without_context, ev) == 0)
        pthread_join(t, NULL);
    else
        CHECK(!"a thread with no context");
    CHECK_RESULT(pm_event_synchronize(ev), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(ev), PM_SUCCESS);
}
#endif

int main(void)
{
#ifdef PINMEM_HAVE_CUDA_HEADERS
    static const context_case cases[] = {flushed_from_their_context, freed_in_their_context,
                                         many_flags_released_early, flag_waited_without_context,
                                         kept_memory_outlives_their_context,
                                         frees_in_a_context_destroyed_at_once};
    return their_context_main("pool_contexts", cases, sizeof cases / sizeof cases[0]);
#else
    return their_context_main("pool_contexts", NULL, 0);
#endif
}
