/* Stream-ordered reuse: a block freed on stream A goes back to A at once, to
 * anyone else only after A's earlier work is done; and a race test where
 * every block's use is checked by work on its stream, which must never see
 * another party's writes. Runs on POSIX streams in CI and CUstreams on a GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "pool_util.h"
#include "stream_util.h"

typedef struct other_thread {
    pm_mem_pool_t pool;
    void *forbidden;
    bool saw_it;
} other_thread;

static void *alloc_elsewhere(void *arg)
{
    other_thread *o = arg;
    o->saw_it = among(o->forbidden, 4096, o->pool, false, NULL);
    return NULL;
}

static void reuse_rules(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    pm_stream_t a = NULL, b = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    void *p = NULL, *q = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 4096, pool), PM_SUCCESS);
    atomic_store(&gate_open, 0);
    CHECK_RESULT(pm_stream_launch_host_func(a, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(p, a), PM_SUCCESS);
    /* Same stream: at once. */
    CHECK_RESULT(pm_mem_alloc_from_pool_async(&q, 4096, pool, a), PM_SUCCESS);
    CHECK(q == p);
    CHECK_RESULT(pm_mem_free_async(q, a), PM_SUCCESS);
    /* Anyone else: not while a is still busy. */
    CHECK(!among(p, 4096, pool, false, NULL));
    CHECK(!among(p, 4096, pool, true, b));
    other_thread o = {pool, p, true};
    pthread_t t;
    if (pthread_create(&t, NULL, alloc_elsewhere, &o) == 0)
        pthread_join(t, NULL);
    CHECK(!o.saw_it);
    /* Freeing on another stream moves a's blocks to the pool behind a marker. */
    void *r = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&r, 4096, pool), PM_SUCCESS);
    if (r)
        CHECK_RESULT(pm_mem_free_async(r, b), PM_SUCCESS);
    CHECK(!among(p, 4096, pool, false, NULL));
    atomic_store(&gate_open, 1);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK(among(p, 4096, pool, false, NULL));
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Each thread's own stream (PM_STREAM_PER_THREAD) is its own: a block
 * freed on thread A's while A's stream waits at the gate stays A's when
 * thread B synchronizes its own stream and allocates, though both name
 * theirs by the same handle. */
static struct {
    pm_mem_pool_t pool;
    void *block;
    atomic_int freed, finish;
} own;

static void *free_on_own_stream(void *arg)
{
    (void)arg;
    if (pm_mem_alloc_from_pool(&own.block, 4096, own.pool) == PM_SUCCESS) {
        CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, wait_gate, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_async(own.block, PM_STREAM_PER_THREAD), PM_SUCCESS);
    }
    atomic_store(&own.freed, 1);
    while (!atomic_load(&own.finish))
        usleep(100);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_PER_THREAD), PM_SUCCESS);
    return NULL;
}

static void threads_own_streams(void)
{
    own.pool = make_pool(0);
    REQUIRE(own.pool != NULL);
    own.block = NULL;
    atomic_store(&own.freed, 0);
    atomic_store(&own.finish, 0);
    atomic_store(&gate_open, 0);
    pthread_t a;
    REQUIRE(pthread_create(&a, NULL, free_on_own_stream, NULL) == 0);
    while (!atomic_load(&own.freed))
        usleep(100);
    CHECK(own.block != NULL);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_PER_THREAD), PM_SUCCESS);
    CHECK(!among(own.block, 4096, own.pool, false, NULL));
    CHECK(!among(own.block, 4096, own.pool, true, PM_STREAM_PER_THREAD));
    atomic_store(&gate_open, 1);
    atomic_store(&own.finish, 1);
    pthread_join(a, NULL);
    CHECK(among(own.block, 4096, own.pool, false, NULL)); /* A's stream is done */
    CHECK(pool_attr(own.pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(own.pool), PM_SUCCESS);
}

/* Without opportunistic reuse, an asynchronous allocation on b does not take
 * blocks freed on a, even once a is idle; a synchronous caller may. */
static void no_opportunistic_reuse(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    int off = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off),
                 PM_SUCCESS);
    pm_stream_t a = NULL, b = NULL;
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    void *p = NULL, *x = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 8192, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(p, a), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&x, 64, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(x, b), PM_SUCCESS); /* a's block goes to the pool */
    CHECK_RESULT(pm_stream_launch_host_func(a, wait_gate, NULL), PM_SUCCESS); /* gate is open */
    usleep(20000);
    CHECK(!among(p, 8192, pool, true, b));
    CHECK(among(p, 8192, pool, false, NULL));
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* With REUSE_ALLOW_INTERNAL_DEPENDENCIES (on by default), an allocation on b
 * that the pool could serve only by growing past max_size takes the block
 * freed on a while a is still busy, and b's later work runs after a's;
 * without it, the allocation fails. */
static void internal_dependencies(void)
{
    const size_t big = (size_t)24 << 20;
    NEED_PINNABLE((size_t)64 << 20); /* a pool of 32 MiB, pinned whole */
    for (int allowed = 1; allowed >= 0; allowed--) {
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0},
                                   .max_size = (size_t)32 << 20};
        pm_mem_pool_t pool = NULL;
        REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_set_attribute(
                         pool, PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &allowed),
                     PM_SUCCESS);
        pm_stream_t a = NULL, b = NULL;
        REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
        REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
        void *p = NULL, *q = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&p, big, pool, a), PM_SUCCESS);
        reset_gate();
        CHECK_RESULT(pm_stream_launch_host_func(a, wait_gate, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_stream_launch_host_func(a, mark_a_done, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_async(p, a), PM_SUCCESS);
        pm_result r = pm_mem_alloc_from_pool_async(&q, big, pool, b);
        if (allowed) {
            CHECK_RESULT(r, PM_SUCCESS);
            CHECK(q == p);
            if (r != PM_SUCCESS) {
                atomic_store(&gate_open, 1); /* lets a's work end before the case does */
                CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
                return;
            }
            CHECK_RESULT(pm_stream_launch_host_func(b, look_for_a, NULL), PM_SUCCESS);
            usleep(20000);
            CHECK(atomic_load(&b_saw_a) == 0); /* b waits behind a's gate */
            atomic_store(&gate_open, 1);
            CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
            CHECK(atomic_load(&b_saw_a) == 1);
            CHECK_RESULT(pm_mem_free_async(q, b), PM_SUCCESS);
        } else {
            CHECK_RESULT(r, PM_ERROR_OUT_OF_MEMORY);
            atomic_store(&gate_open, 1);
        }
        CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
        CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
}

/* ---------------------------------------------------------------- the race */

enum { n_threads = 8, iterations = 1500 };

static void *race(void *arg)
{
    racer *me = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (me->id + 1);
    static const size_t sizes[] = {256, 4096, 65536};
    for (uint32_t i = 0; i < iterations; i++) {
        rng = rng * 6364136223846793005ull + 1;
        size_t size = sizes[(rng >> 33) % 3];
        bool async = (rng >> 40) & 1;
        void *p = NULL;
        pm_result r = async ? pm_mem_alloc_from_pool_async(&p, size, me->pool, me->stream)
                            : pm_mem_alloc_from_pool(&p, size, me->pool);
        CHECK_RESULT(r, PM_SUCCESS);
        if (r != PM_SUCCESS)
            break;
        use *u = malloc(sizeof *u);
        u->p = p;
        u->words = size / 4;
        u->tag = (me->id << 24) | (i & 0xFFFFFF);
        u->pause_us = (unsigned)((rng >> 45) % 50);
        if (async)
            pm_stream_launch_host_func(me->stream, fill_use, u); /* in stream order */
        else
            fill_use(u); /* a synchronous block is the caller's at once */
        pm_stream_launch_host_func(me->stream, verify_and_release, u);
        CHECK_RESULT(pm_mem_free_async(p, me->stream), PM_SUCCESS);
    }
    CHECK_RESULT(pm_stream_synchronize(me->stream), PM_SUCCESS);
    return NULL;
}

static void reuse_race(void)
{
    NEED_PINNABLE((size_t)128 << 20); /* it pins about 48 MiB */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    racer racers[n_threads];
    pthread_t tids[n_threads];
    int started = 0;
    for (uint32_t t = 0; t < n_threads; t++) {
        racers[t] = (racer){pool, NULL, t};
        CHECK_RESULT(pm_stream_create(&racers[t].stream), PM_SUCCESS);
        if (!racers[t].stream || pthread_create(&tids[t], NULL, race, &racers[t]) != 0)
            break;
        started++;
    }
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    for (int t = 0; t < n_threads; t++)
        if (racers[t].stream)
            CHECK_RESULT(pm_stream_destroy(racers[t].stream), PM_SUCCESS);
    REQUIRE(started == n_threads);
    printf("race: %d threads x %d uses, %ld violations, %llu MiB reserved\n", n_threads,
           iterations, atomic_load(&violations),
           (unsigned long long)pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >> 20);
    CHECK(atomic_load(&violations) == 0);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Synchronizing streams walks every pool: pools destroyed meanwhile must not
 * be torn down under that walk. */
static atomic_int churning;

static void *sync_loop(void *arg)
{
    pm_stream_t s = arg;
    while (atomic_load(&churning))
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    return NULL;
}

static void sync_while_destroying(void)
{
    pm_stream_t s = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    atomic_store(&churning, 1);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, sync_loop, s) == 0);
    for (int i = 0; i < 200; i++) {
        pm_mem_pool_t pool = make_pool(0);
        if (!pool)
            break;
        void *p = NULL;
        pm_result r = pm_mem_alloc_from_pool_async(&p, 4096, pool, s);
        CHECK_RESULT(r, PM_SUCCESS);
        if (r == PM_SUCCESS)
            CHECK_RESULT(pm_mem_free_async(p, s), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
    atomic_store(&churning, 0);
    pthread_join(t, NULL);
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

static void bad_streams(void)
{
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_get_capabilities(&caps);
    CHECK_RESULT(pm_stream_create(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_stream_destroy(NULL), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_stream_destroy(PM_STREAM_LEGACY), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_stream_destroy(PM_STREAM_PER_THREAD), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_LEGACY), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_PER_THREAD), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(NULL, NULL, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    if (strcmp(caps.backend, "posix") == 0) { /* the driver trusts CUstream handles */
        pm_stream_t bogus = (pm_stream_t)(uintptr_t)0x4321;
        pm_mem_pool_t pool = make_pool(0);
        REQUIRE(pool != NULL);
        void *p = NULL;
        CHECK_RESULT(pm_stream_synchronize(bogus), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_stream_destroy(bogus), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_mem_alloc_from_pool_async(&p, 64, pool, bogus), PM_ERROR_INVALID_HANDLE);
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 64, pool), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_async(p, bogus), PM_ERROR_INVALID_HANDLE);
        pm_stream_t s = NULL;
        CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(s), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_mem_free_async(p, s), PM_ERROR_INVALID_HANDLE);
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    reuse_rules();
    no_opportunistic_reuse();
    threads_own_streams();
    internal_dependencies();
    reuse_race();
    sync_while_destroying();
    bad_streams();
    return check_finish("pool_streams");
}
