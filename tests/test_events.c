/* Events, and the stream order pools learn from them: with
 * REUSE_FOLLOW_EVENT_DEPENDENCIES, memory freed on stream A before an event
 * recorded on A serves stream B at once once B waits for the event, and
 * never otherwise. Runs on POSIX streams in CI and CUstreams on a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pool_util.h"
#include "stream_order.h"
#include "stream_util.h"
#include "test_hooks.h"

static void bad_arguments(void)
{
    pm_event_t e = NULL;
    CHECK_RESULT(pm_event_create(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_event_destroy(NULL), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_event_record(NULL, NULL), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_event_query(NULL), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_event_synchronize(NULL), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_stream_wait_event(NULL, NULL), PM_ERROR_INVALID_HANDLE);
    int not_an_event = 0;
    CHECK_RESULT(pm_event_query((pm_event_t)&not_an_event), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_event_create(&e), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(e), PM_ERROR_INVALID_HANDLE); /* destroyed already */
    CHECK_RESULT(pm_event_record(e, NULL), PM_ERROR_INVALID_HANDLE);
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_get_capabilities(&caps);
    if (strcmp(caps.backend, "posix") == 0) { /* the driver trusts CUstream handles */
        pm_stream_t bogus = (pm_stream_t)(uintptr_t)0x4321, gone = NULL;
        CHECK_RESULT(pm_stream_create(&gone), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(gone), PM_SUCCESS);
        CHECK_RESULT(pm_event_create(&e), PM_SUCCESS);
        CHECK_RESULT(pm_event_record(e, bogus), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_event_record(e, gone), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_stream_wait_event(bogus, e), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_stream_wait_event(gone, e), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_event_query(e), PM_SUCCESS); /* still never recorded */
        CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    }
}

/* An event captures its stream's work when recorded: not ready while that
 * work is held up, ready after; never recorded counts as done. */
static void capture(void)
{
    pm_stream_t a = NULL, b = NULL;
    pm_event_t e = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&e), PM_SUCCESS);
    CHECK_RESULT(pm_event_query(e), PM_SUCCESS);
    CHECK_RESULT(pm_event_synchronize(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_wait_event(b, e), PM_SUCCESS); /* nothing to wait for */
    reset_gate();
    CHECK_RESULT(pm_stream_launch_host_func(a, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(a, mark_a_done, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
    CHECK_RESULT(pm_event_query(e), PM_ERROR_NOT_READY);
    CHECK_RESULT(pm_stream_wait_event(b, e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(b, look_for_a, NULL), PM_SUCCESS);
    usleep(20000);
    CHECK(atomic_load(&b_saw_a) == 0); /* b waits behind a's gate */
    atomic_store(&gate_open, 1);
    CHECK_RESULT(pm_event_synchronize(e), PM_SUCCESS);
    CHECK(atomic_load(&a_done) == 1);
    CHECK_RESULT(pm_event_query(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK(atomic_load(&b_saw_a) == 1);
    /* Destroying an event whose work is pending is allowed. */
    atomic_store(&gate_open, 0);
    CHECK_RESULT(pm_stream_launch_host_func(a, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    atomic_store(&gate_open, 1);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
}

typedef enum {
    FREE_THEN_RECORD, /* a: free, record; b waits: reuse */
    RECORD_THEN_FREE, /* the event comes before the free: no reuse */
    NO_WAIT,          /* b never waits for the event: no reuse */
    THROUGH_C,        /* b waits for c, which waited for a: reuse */
    /* While the event is being recorded on a (the test hook between its
     * steps), another call queues work on a and frees the block there; or a
     * waits for an event f of c, on which the block was freed. Neither may be
     * taken as before the event: no reuse. */
    FREE_WHILE_RECORDING,
    WAIT_WHILE_RECORDING,
} scenario;

/* What the record hook does on a, for the two scenarios above. */
static pm_stream_t midway_stream;
static pm_event_t midway_event;
static void *midway_block;

static void free_midway(void)
{
    atomic_store(&pm__test_record_midway, NULL);
    CHECK_RESULT(pm_stream_launch_host_func(midway_stream, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(midway_stream, mark_a_done, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(midway_block, midway_stream), PM_SUCCESS);
}

static void wait_midway(void)
{
    atomic_store(&pm__test_record_midway, NULL);
    CHECK_RESULT(pm_stream_wait_event(midway_stream, midway_event), PM_SUCCESS);
}

/* Queues the free of p and the event e on a in the order sc gives (on c and
 * f for WAIT_WHILE_RECORDING), with work before the free that holds a (or c)
 * until the gate opens. */
static void free_and_record(scenario sc, void *p, pm_stream_t a, pm_stream_t c, pm_event_t e,
                            pm_event_t f)
{
    midway_stream = a;
    midway_event = f;
    midway_block = p;
    if (sc == FREE_WHILE_RECORDING) {
        atomic_store(&pm__test_record_midway, free_midway);
        CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
        return;
    }
    pm_stream_t holder = sc == WAIT_WHILE_RECORDING ? c : a;
    CHECK_RESULT(pm_stream_launch_host_func(holder, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(holder, mark_a_done, NULL), PM_SUCCESS);
    if (sc == WAIT_WHILE_RECORDING) {
        CHECK_RESULT(pm_mem_free_async(p, c), PM_SUCCESS);
        CHECK_RESULT(pm_event_record(f, c), PM_SUCCESS);
        atomic_store(&pm__test_record_midway, wait_midway);
        CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
        return;
    }
    if (sc == RECORD_THEN_FREE)
        CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(p, a), PM_SUCCESS);
    if (sc != RECORD_THEN_FREE)
        CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
}

/* A pool that holds one block of `size` and room for nothing more (a
 * `filler` takes the rest), so that an allocation on b is served either by
 * the block a freed or not at all. Small sizes go through the thread caches,
 * large ones straight to the pool. */
static void follow(scenario sc, int follow_on, size_t size)
{
    const size_t max = (size_t)32 << 20;
    pm_mem_pool_t pool = make_pool(max);
    REQUIRE(pool != NULL);
    int off = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                                           &off),
                 PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                           &follow_on),
                 PM_SUCCESS);
    pm_stream_t a = NULL, b = NULL, c = NULL;
    pm_event_t e = NULL, f = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&c), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&e), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&f), PM_SUCCESS);
    void *p = NULL, *filler = NULL, *q = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&p, size, pool, a), PM_SUCCESS);
    size_t room = max - pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&filler, room, pool), PM_SUCCESS);
    reset_gate();
    free_and_record(sc, p, a, c, e, f);
    if (sc == THROUGH_C) {
        CHECK_RESULT(pm_stream_wait_event(c, e), PM_SUCCESS);
        CHECK_RESULT(pm_event_record(f, c), PM_SUCCESS);
        CHECK_RESULT(pm_stream_wait_event(b, f), PM_SUCCESS);
    } else if (sc != NO_WAIT) {
        CHECK_RESULT(pm_stream_wait_event(b, e), PM_SUCCESS);
    }
    pm_result r = pm_mem_alloc_from_pool_async(&q, size, pool, b);
    bool reuse = follow_on && (sc == FREE_THEN_RECORD || sc == THROUGH_C);
    if (reuse) {
        CHECK_RESULT(r, PM_SUCCESS);
        CHECK(q == p);
        if (r != PM_SUCCESS) {
            atomic_store(&gate_open, 1); /* lets a's work end before the case does */
            CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
            return;
        }
        /* b's work after the allocation still runs after a's work before the free. */
        CHECK_RESULT(pm_stream_launch_host_func(b, look_for_a, NULL), PM_SUCCESS);
        usleep(20000);
        CHECK(atomic_load(&b_saw_a) == 0);
        atomic_store(&gate_open, 1);
        CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
        CHECK(atomic_load(&b_saw_a) == 1);
        CHECK_RESULT(pm_mem_free_async(q, b), PM_SUCCESS);
    } else {
        CHECK_RESULT(r, PM_ERROR_OUT_OF_MEMORY);
        CHECK(atomic_load(&a_done) == 0); /* and the free's work still runs */
        if (r == PM_SUCCESS)
            CHECK_RESULT(pm_mem_free_async(q, b), PM_SUCCESS);
        atomic_store(&gate_open, 1);
    }
    CHECK_RESULT(pm_mem_free(filler), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(c), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(f), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(c), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* ------------------------------------------------------------- the race */

/* Threads share a pool too small to grow into, each frees on its own stream,
 * records its event, and makes its stream wait for another thread's event;
 * an allocation the pool cannot serve otherwise may then take a block another
 * stream freed before that event. Work on each stream checks that its blocks
 * were never handed on while it still used them. */
enum { racers = 8, race_iterations = 400 };
static atomic_long retries;
static pm_event_t race_events[racers];

static void *race(void *arg)
{
    racer *me = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (me->id + 1);
    for (uint32_t i = 0; i < race_iterations; i++) {
        rng = rng * 6364136223846793005ull + 1;
        size_t size = (rng >> 40) & 1 ? (size_t)1 << 20 : (size_t)3 << 20; /* cached, large */
        void *p = NULL;
        pm_result r = pm_mem_alloc_from_pool_async(&p, size, me->pool, me->stream);
        /* The pool is full: wait for other streams' events (their frees may
         * then serve this stream), and at last for this stream's own frees. */
        for (uint32_t k = 1; r == PM_ERROR_OUT_OF_MEMORY && k < racers; k++) {
            CHECK_RESULT(pm_stream_wait_event(me->stream, race_events[(me->id + k) % racers]),
                         PM_SUCCESS);
            r = pm_mem_alloc_from_pool_async(&p, size, me->pool, me->stream);
        }
        if (r == PM_ERROR_OUT_OF_MEMORY) {
            atomic_fetch_add(&retries, 1);
            CHECK_RESULT(pm_stream_synchronize(me->stream), PM_SUCCESS);
            continue;
        }
        CHECK_RESULT(r, PM_SUCCESS);
        use *u = malloc(sizeof *u);
        *u = (use){p, size / 4, (me->id << 24) | (i & 0xFFFFFF), (unsigned)((rng >> 45) % 200),
                   .stride = 64};
        CHECK_RESULT(pm_stream_launch_host_func(me->stream, fill_use, u), PM_SUCCESS);
        CHECK_RESULT(pm_stream_launch_host_func(me->stream, verify_and_release, u), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_async(p, me->stream), PM_SUCCESS);
        CHECK_RESULT(pm_event_record(race_events[me->id], me->stream), PM_SUCCESS);
        uint32_t other = (me->id + 1 + (uint32_t)((rng >> 20) % (racers - 1))) % racers;
        CHECK_RESULT(pm_stream_wait_event(me->stream, race_events[other]), PM_SUCCESS);
    }
    CHECK_RESULT(pm_stream_synchronize(me->stream), PM_SUCCESS);
    return NULL;
}

static void event_race(void)
{
    NEED_PINNABLE((size_t)64 << 20); /* a pool of 32 MiB, full */
    pm_mem_pool_t pool = make_pool((size_t)32 << 20);
    REQUIRE(pool != NULL);
    int off = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                                           &off),
                 PM_SUCCESS);
    racer rs[racers];
    pthread_t tids[racers];
    for (uint32_t t = 0; t < racers; t++) {
        rs[t] = (racer){pool, NULL, t};
        REQUIRE_RESULT(pm_stream_create(&rs[t].stream), PM_SUCCESS);
        REQUIRE_RESULT(pm_event_create(&race_events[t]), PM_SUCCESS);
    }
    uint32_t started = 0;
    while (started < racers && pthread_create(&tids[started], NULL, race, &rs[started]) == 0)
        started++;
    for (uint32_t t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    CHECK(started == racers);
    for (int t = 0; t < racers; t++) {
        CHECK_RESULT(pm_stream_destroy(rs[t].stream), PM_SUCCESS);
        CHECK_RESULT(pm_event_destroy(race_events[t]), PM_SUCCESS);
    }
    printf("race: %d threads x %d uses, %ld violations, %ld waits for a full pool\n", racers,
           race_iterations, atomic_load(&violations), atomic_load(&retries));
    CHECK(atomic_load(&violations) == 0);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* ----------------------------------------- calls beside a synchronization */

static void *synchronize_event(void *event)
{
    CHECK_RESULT(pm_event_synchronize(event), PM_SUCCESS);
    return NULL;
}

/* While one thread waits in pm_event_synchronize, a query of the same event
 * answers NOT_READY at once and a wait on it is queued at once, as the
 * driver's do: the thread asking may be the one that would end the work. */
/* A new stream a whose work waits at the gate, a new event e recorded behind
 * it, and a thread synchronizing e (with one that opens the gate should the
 * case wait for the work); false where they could not be made. */
static bool start_synchronizing(pm_stream_t *a, pm_event_t *e, pthread_t *syncer,
                                pthread_t *opener)
{
    if (pm_stream_create(a) != PM_SUCCESS || pm_event_create(e) != PM_SUCCESS)
        return false;
    reset_gate();
    CHECK_RESULT(pm_stream_launch_host_func(*a, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(*e, *a), PM_SUCCESS);
    if (pthread_create(opener, NULL, open_gate_if_stuck, NULL) != 0)
        return false;
    if (pthread_create(syncer, NULL, synchronize_event, *e) != 0) {
        atomic_store(&gate_open, 1);
        pthread_join(*opener, NULL);
        return false;
    }
    usleep(50000); /* the synchronization waits by now */
    return true;
}

/* Lets the work start_synchronizing held up run, and the synchronization end. */
static void stop_synchronizing(pthread_t syncer, pthread_t opener)
{
    atomic_store(&gate_open, 1);
    pthread_join(syncer, NULL);
    pthread_join(opener, NULL);
}

static void query_while_synchronizing(void)
{
    pm_stream_t a = NULL, b = NULL;
    pm_event_t e = NULL;
    pthread_t syncer, opener;
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE(start_synchronizing(&a, &e, &syncer, &opener));
    CHECK_RESULT(pm_event_query(e), PM_ERROR_NOT_READY);
    CHECK_RESULT(pm_stream_wait_event(b, e), PM_SUCCESS);
    CHECK(atomic_load(&gate_open) == 0); /* neither waited for the work */
    stop_synchronizing(syncer, opener);
    CHECK_RESULT(pm_event_query(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
}

/* A destroy while another thread synchronizes the event returns at once;
 * the synchronization still waits for the work and succeeds, and the event
 * is refused from then on. */
static void destroy_while_synchronizing(void)
{
    pm_stream_t a = NULL;
    pm_event_t e = NULL;
    pthread_t syncer, opener;
    REQUIRE(start_synchronizing(&a, &e, &syncer, &opener));
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK(atomic_load(&gate_open) == 0); /* the destroy did not wait for the work */
    CHECK_RESULT(pm_event_query(e), PM_ERROR_INVALID_HANDLE);
    stop_synchronizing(syncer, opener);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
}

/* A record while another thread synchronizes the event returns at once, as
 * the driver's does (it had waited for the synchronization, which a host
 * function behind the event could never let end); the event then stands
 * for the new point, and the synchronization still ends. */
static void record_while_synchronizing(void)
{
    pm_stream_t a = NULL, b = NULL;
    pm_event_t e = NULL;
    pthread_t syncer, opener;
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE(start_synchronizing(&a, &e, &syncer, &opener));
    CHECK_RESULT(pm_event_record(e, b), PM_SUCCESS);
    CHECK(atomic_load(&gate_open) == 0); /* the record did not wait for the work */
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK_RESULT(pm_event_query(e), PM_SUCCESS); /* b's point, done */
    stop_synchronizing(syncer, opener);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
}

/* Threads record, query, wait for and synchronize whichever event is current
 * while another replaces it and destroys the old one: each call answers
 * SUCCESS (or NOT_READY) or INVALID_HANDLE, and none touches freed memory
 * (the sanitizer builds see that). */
enum { handle_users = 4, handle_swaps = 3000 };
static _Atomic(pm_event_t) current_event;
static atomic_int swapping_done;

static void *use_current_events(void *stream)
{
    for (unsigned i = 0; !atomic_load(&swapping_done); i++) {
        pm_event_t e = atomic_load(&current_event);
        pm_result r = i % 4 == 0   ? pm_event_record(e, stream)
                      : i % 4 == 1 ? pm_event_query(e)
                      : i % 4 == 2 ? pm_stream_wait_event(stream, e)
                                   : pm_event_synchronize(e);
        if (r != PM_SUCCESS && r != PM_ERROR_NOT_READY && r != PM_ERROR_INVALID_HANDLE) {
            CHECK_RESULT(r, PM_SUCCESS);
            break;
        }
    }
    return NULL;
}

static void destroy_while_used(void)
{
    pm_stream_t streams[handle_users] = {0};
    pthread_t users[handle_users];
    pm_event_t e = NULL;
    REQUIRE_RESULT(pm_event_create(&e), PM_SUCCESS);
    atomic_store(&current_event, e);
    atomic_store(&swapping_done, 0);
    unsigned started = 0;
    for (; started < handle_users; started++)
        if (pm_stream_create(&streams[started]) != PM_SUCCESS ||
            pthread_create(&users[started], NULL, use_current_events, streams[started]) != 0)
            break;
    CHECK(started == handle_users);
    for (unsigned i = 0; i < handle_swaps && started == handle_users; i++) {
        pm_event_t next = NULL;
        if (pm_event_create(&next) != PM_SUCCESS) {
            CHECK(!"an event");
            break;
        }
        CHECK_RESULT(pm_event_destroy(atomic_exchange(&current_event, next)), PM_SUCCESS);
    }
    atomic_store(&swapping_done, 1);
    for (unsigned t = 0; t < started; t++)
        pthread_join(users[t], NULL);
    for (unsigned t = 0; t < handle_users; t++)
        if (streams[t])
            CHECK_RESULT(pm_stream_destroy(streams[t]), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(atomic_load(&current_event)), PM_SUCCESS);
}

/* -------------------------------------------- threads' own streams' order */

static void *wait_on_own_stream(void *event)
{
    CHECK_RESULT(pm_stream_wait_event(PM_STREAM_PER_THREAD, event), PM_SUCCESS);
    return NULL;
}

/* What a thread's own stream learned goes with the thread, as what a stream
 * the user made learned goes with pm_stream_destroy. */
static void own_streams_forgotten(void)
{
    enum { threads = 32 };
    pm_stream_t a = NULL;
    pm_event_t e = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&e), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(e, a), PM_SUCCESS);
    size_t before = pm__order_known_streams();
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, wait_on_own_stream, e) == 0);
        pthread_join(t, NULL);
    }
    CHECK(pm__order_known_streams() == before);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
}

static void *record_on_own_stream(void *waiter)
{
    pm_event_t e = NULL;
    CHECK_RESULT(pm_event_create(&e), PM_SUCCESS);
    if (!e)
        return NULL;
    CHECK_RESULT(pm_event_record(e, PM_STREAM_PER_THREAD), PM_SUCCESS);
    CHECK_RESULT(pm_stream_wait_event(waiter, e), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(e), PM_SUCCESS);
    return NULL;
}

/* What other streams learned of a thread's own stream goes with the thread
 * too: a stream that waits for events of many short-lived threads would
 * otherwise keep a point for each of them for good. */
static void own_streams_forgotten_by_waiters(void)
{
    enum { threads = 32 };
    pm_stream_t a = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    size_t before = pm__order_known_points();
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, record_on_own_stream, a) == 0);
        pthread_join(t, NULL);
    }
    CHECK(pm__order_known_points() == before);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
}

/* ------------------------------- the legacy stream and threads' own ones */

static atomic_int own_queued;

/* A thread's own stream: the gate then the mark, or a look for the mark. */
static void *own_gated_work(void *arg)
{
    (void)arg;
    CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, mark_a_done, NULL),
                 PM_SUCCESS);
    atomic_store(&own_queued, 1);
    return NULL;
}

static void *own_look(void *arg)
{
    (void)arg;
    CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, look_for_a, NULL), PM_SUCCESS);
    atomic_store(&own_queued, 1);
    return NULL;
}

/* Runs own's body on a thread and b's work on the legacy stream (or, with
 * legacy_first, a's on the legacy stream before own's body); true when b's
 * look found a's mark. The thread's exit waits for its stream on POSIX,
 * so the gate opens before the join. */
static int legacy_and_own(void *(*own)(void *), bool legacy_first)
{
    reset_gate();
    atomic_store(&own_queued, 0);
    if (legacy_first) {
        CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_LEGACY, wait_gate, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_LEGACY, mark_a_done, NULL), PM_SUCCESS);
    }
    pthread_t thread, opener;
    if (pthread_create(&opener, NULL, open_gate_if_stuck, NULL) != 0) {
        atomic_store(&gate_open, 1);
        return 0;
    }
    const bool started = pthread_create(&thread, NULL, own, NULL) == 0;
    while (started && !atomic_load(&own_queued))
        usleep(100);
    if (!legacy_first)
        CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_LEGACY, look_for_a, NULL), PM_SUCCESS);
    usleep(20000); /* work not ordered behind the gate has run by now */
    atomic_store(&gate_open, 1);
    if (started)
        pthread_join(thread, NULL);
    pthread_join(opener, NULL);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_LEGACY), PM_SUCCESS);
    return atomic_load(&b_saw_a);
}

/* The driver orders the legacy stream with blocking streams, and a
 * thread's own stream is one: work on either waits for the other's. */
static void legacy_orders_own_streams(void)
{
    CHECK(legacy_and_own(own_gated_work, false) == 1);
    CHECK(legacy_and_own(own_look, true) == 1);
}

/* ------------------------------------------------------ frees wait for work */

static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(100000);
    atomic_store(&gate_open, 1);
    return NULL;
}

/* A free of host, registered or device memory waits for the work queued
 * before it, as the driver's frees wait for the device: work still queued
 * that uses the memory runs before it goes. */
static void frees_wait_for_queued_work(void)
{
    enum { BYTES = 1 << 16 };
    pm_stream_t s = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    const char *const names[] = {"pm_mem_free_host", "pm_mem_host_unregister", "pm_device_free"};
    for (int which = 0; which < 3; which++) {
        void *host = NULL, *pageable = NULL;
        pm_deviceptr dev = 0;
        pm_result made = which == 0   ? pm_mem_host_alloc(&host, BYTES, 0)
                         : which == 1 ? ((pageable = aligned_alloc(4096, BYTES))
                                             ? pm_mem_host_register(pageable, BYTES, 0)
                                             : PM_ERROR_OUT_OF_MEMORY)
                                      : pm_device_alloc(&dev, BYTES);
        if (made != PM_SUCCESS) {
            CHECK_RESULT(made, PM_SUCCESS);
            free(pageable);
            continue;
        }
        reset_gate();
        pthread_t opener;
        REQUIRE(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
        CHECK_RESULT(pm_stream_launch_host_func(s, wait_gate, NULL), PM_SUCCESS);
        const pm_result freed = which == 0   ? pm_mem_free_host(host)
                                : which == 1 ? pm_mem_host_unregister(pageable)
                                             : pm_device_free(dev);
        const bool waited = atomic_load(&gate_open);
        CHECK_RESULT(freed, PM_SUCCESS);
        if (!waited)
            printf("%s returned before the work queued before it ran\n", names[which]);
        CHECK(waited);
        pthread_join(opener, NULL);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        free(pageable);
    }
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

static void follow_scenarios(void)
{
    NEED_PINNABLE((size_t)64 << 20); /* pools of 32 MiB, full */
    static const size_t sizes[] = {(size_t)1 << 20, (size_t)8 << 20}; /* cached, large */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int on = 1; on >= 0; on--) {
            follow(FREE_THEN_RECORD, on, sizes[i]);
            follow(THROUGH_C, on, sizes[i]);
        }
        follow(RECORD_THEN_FREE, 1, sizes[i]);
        follow(NO_WAIT, 1, sizes[i]);
        follow(FREE_WHILE_RECORDING, 1, sizes[i]);
        follow(WAIT_WHILE_RECORDING, 1, sizes[i]);
    }
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    bad_arguments();
    capture();
    follow_scenarios();
    query_while_synchronizing();
    destroy_while_synchronizing();
    record_while_synchronizing();
    destroy_while_used();
    own_streams_forgotten();
    own_streams_forgotten_by_waiters();
    legacy_orders_own_streams();
    frees_wait_for_queued_work();
    event_race();
    return check_finish("events");
}
