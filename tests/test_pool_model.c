/* Random sequences of alloc, free, trim and attribute calls against a
 * reference model: one thread with used, high-water and reserved checked
 * after every step (the release threshold changing among them); then several threads and streams, with used and the live
 * count exact once they stop; then a fault sweep where pinning a chunk fails
 * at the k-th time, for k = 1, 2, 3, ... */
#include <pthread.h>
#include <stdint.h>

#include "pool/classes.h"
#include "pool/pool_internal.h"
#include "pool_util.h"

enum { slots = 256 };

typedef struct model {
    void *p[slots];
    size_t size[slots];
    uint64_t used, used_high;
} model;

static size_t rounded(size_t n)
{
    if (n <= PM__POOL_SMALL_MAX)
        return pm__class_size(pm__class_of(n));
    return (n + PM__POOL_PAGE - 1) / PM__POOL_PAGE * PM__POOL_PAGE;
}

static size_t random_size(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    unsigned shift = (unsigned)(*rng >> 59) % 24; /* up to 16 MiB */
    return 1 + (size_t)((*rng >> 16) % ((size_t)1 << (shift + 1)));
}

/* The largest request when up to live requests may be held at once: all
 * that random_size gives, unless a memlock limit allows less. */
static size_t largest_request(size_t most, size_t live)
{
    size_t fit = pinnable() / 4 / live;
    return fit < most ? (fit < 64 ? 64 : fit) : most;
}

static void single_thread(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    const size_t largest = largest_request((size_t)16 << 20, slots);
    model m = {0};
    uint64_t rng = 7;
    for (int step = 0; step < 20000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t i = (size_t)(rng >> 40) % slots;
        unsigned op = (unsigned)(rng >> 20) % 16;
        if (op < 7 && !m.p[i]) {
            size_t n = (random_size(&rng) - 1) % largest + 1;
            pm_result r = pm_mem_alloc_from_pool(&m.p[i], n, pool);
            CHECK_RESULT(r, PM_SUCCESS);
            if (r != PM_SUCCESS)
                break;
            m.size[i] = n;
            m.used += rounded(n);
            if (m.used > m.used_high)
                m.used_high = m.used;
        } else if (op < 14 && m.p[i]) {
            CHECK_RESULT(pm_mem_free(m.p[i]), PM_SUCCESS);
            m.used -= rounded(m.size[i]);
            m.p[i] = NULL;
        } else if (op == 14) {
            CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
            /* What is left is what live allocations need, in whole chunks. */
            CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) % PM__POOL_PAGE == 0);
        } else if (op == 15 && (rng >> 10) % 2) {
            uint64_t zero = 0;
            CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
                         PM_SUCCESS);
            m.used_high = m.used;
        } else if (op == 15) {
            /* Chunks pinned before and after change kind on CUDA; above a
             * threshold, idle granules go back as frees make them. */
            static const uint64_t thresholds[] = {0, 8u << 20, PM_MEMPOOL_DEFAULT_RELEASE_THRESHOLD};
            uint64_t t = thresholds[(rng >> 11) % 3];
            CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t),
                         PM_SUCCESS);
        }
        uint64_t used = pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT);
        uint64_t high = pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH);
        uint64_t reserved = pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        if (used != m.used || high != m.used_high || reserved < used) {
            fprintf(stderr, "step %d: used %llu (model %llu), high %llu (model %llu), reserved %llu\n",
                    step, (unsigned long long)used, (unsigned long long)m.used,
                    (unsigned long long)high, (unsigned long long)m.used_high,
                    (unsigned long long)reserved);
            check_failures++;
            break;
        }
    }
    for (size_t i = 0; i < slots; i++)
        if (m.p[i])
            CHECK_RESULT(pm_mem_free(m.p[i]), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

typedef struct worker {
    pm_mem_pool_t pool;
    pm_stream_t stream;
    uint64_t rng;
    size_t largest;
    model m;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    for (int step = 0; step < 20000; step++) {
        w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t i = (size_t)(w->rng >> 40) % 64;
        unsigned op = (unsigned)(w->rng >> 20) % 10;
        if (op < 5 && !w->m.p[i]) {
            size_t n = random_size(&w->rng) % w->largest + 1;
            pm_result r = op % 2 ? pm_mem_alloc_from_pool_async(&w->m.p[i], n, w->pool, w->stream)
                                 : pm_mem_alloc_from_pool(&w->m.p[i], n, w->pool);
            CHECK_RESULT(r, PM_SUCCESS);
            if (r != PM_SUCCESS)
                break; /* the model stays true to what was allocated */
            w->m.size[i] = n;
            w->m.used += rounded(n);
        } else if (op < 9 && w->m.p[i]) {
            pm_result r = op % 2 ? pm_mem_free_async(w->m.p[i], w->stream) : pm_mem_free(w->m.p[i]);
            CHECK_RESULT(r, PM_SUCCESS);
            w->m.used -= rounded(w->m.size[i]);
            w->m.p[i] = NULL;
        } else if (op == 9) {
            CHECK_RESULT(pm_mem_pool_trim_to(w->pool, 0), PM_SUCCESS);
        }
    }
    return NULL;
}

static void many_threads(void)
{
    enum { n = 8 };
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    static worker workers[n];
    pthread_t tids[n];
    for (int t = 0; t < n; t++) {
        workers[t] = (worker){.pool = pool, .rng = 1000 + (uint64_t)t,
                              .largest = largest_request(256u << 10, n * 64)};
        REQUIRE_RESULT(pm_stream_create(&workers[t].stream), PM_SUCCESS);
        REQUIRE(pthread_create(&tids[t], NULL, work, &workers[t]) == 0);
    }
    uint64_t used = 0, live = 0;
    for (int t = 0; t < n; t++) {
        pthread_join(tids[t], NULL);
        used += workers[t].m.used;
        for (int i = 0; i < 64; i++)
            live += workers[t].m.p[i] != NULL;
    }
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == used);
    CHECK(st.live == live && st.used == used && st.allocs - st.frees == live);
    printf("8 threads: %llu allocs, %llu live, used %llu, reserved %llu\n", st.allocs, st.live,
           st.used, st.reserved);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < 64; i++)
            if (workers[t].m.p[i])
                CHECK_RESULT(pm_mem_free_async(workers[t].m.p[i], workers[t].stream), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(workers[t].stream), PM_SUCCESS);
    }
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* USED_MEM_HIGH with the allocations made on other threads: four threads
 * each hold 100 blocks of 10,000 bytes at once, then free them. The mark
 * is never below what they held together, and above it by no more than
 * their caches can hold (128 KiB a class); read while the threads still
 * live, and after they ended. Threads that take turns leave it exact. */
enum { holders = 4, held_blocks = 100, held_size = 10000 };
static pthread_barrier_t holding, freed, leave;
static pm_mem_pool_t held_pool;

static void *hold_blocks(void *together)
{
    void *p[held_blocks] = {0};
    int got = 0;
    for (; got < held_blocks; got++)
        if (pm_mem_alloc_from_pool(&p[got], held_size, held_pool) != PM_SUCCESS)
            break;
    CHECK(got == held_blocks);
    if (together)
        pthread_barrier_wait(&holding);
    for (int i = 0; i < got; i++)
        CHECK_RESULT(pm_mem_free(p[i]), PM_SUCCESS);
    if (together) {
        pthread_barrier_wait(&freed);
        pthread_barrier_wait(&leave);
    }
    return NULL;
}

static void used_high_threads(void)
{
    NEED_PINNABLE((size_t)16 << 20);
    const uint64_t block = rounded(held_size), each = held_blocks * block;
    const uint64_t together = holders * each, slack = holders * (128u << 10);
    held_pool = make_pool(0);
    REQUIRE(held_pool != NULL);
    pthread_barrier_init(&holding, NULL, holders);
    pthread_barrier_init(&freed, NULL, holders + 1);
    pthread_barrier_init(&leave, NULL, holders + 1);
    pthread_t tids[holders];
    for (int t = 0; t < holders; t++)
        REQUIRE(pthread_create(&tids[t], NULL, hold_blocks, (void *)1) == 0);
    pthread_barrier_wait(&freed);
    uint64_t alive = pool_attr(held_pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH);
    pthread_barrier_wait(&leave);
    for (int t = 0; t < holders; t++)
        pthread_join(tids[t], NULL);
    uint64_t ended = pool_attr(held_pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(held_pool, &st), PM_SUCCESS);
    printf("USED_MEM_HIGH with %d threads holding %llu bytes together: %llu while they live, "
           "%llu after\n",
           holders, (unsigned long long)together, (unsigned long long)alive,
           (unsigned long long)ended);
    CHECK(alive >= together && alive <= together + slack);
    CHECK(ended >= together && ended <= together + slack);
    CHECK(st.used_high == ended && st.used == 0);
    CHECK(pool_attr(held_pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);

    /* One thread after another: each alone, so the mark is exact. */
    uint64_t zero = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(held_pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
                 PM_SUCCESS);
    CHECK(pool_attr(held_pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);
    for (int t = 0; t < holders; t++) {
        REQUIRE(pthread_create(&tids[t], NULL, hold_blocks, NULL) == 0);
        pthread_join(tids[t], NULL);
    }
    CHECK(pool_attr(held_pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH) == each);
    pthread_barrier_destroy(&holding);
    pthread_barrier_destroy(&freed);
    pthread_barrier_destroy(&leave);
    CHECK_RESULT(pm_mem_pool_destroy(held_pool), PM_SUCCESS);
}

/* Pinning fails at the k-th commit of pool memory: a clean OUT_OF_MEMORY,
 * counters that add up, and everything given back. With the default release
 * threshold and with 0, whose pools give granules back as they go idle (and
 * on CUDA pin VMM granules instead of registered chunks). */
static void fault_sweep(void)
{
    const size_t big = 20u << 20; /* more than the pool holds free: it commits more */
    NEED_PINNABLE((size_t)256 << 20);
    unsigned long long locked_before = locked_kib();
    for (int k = 1; k <= 12; k++) {
        pm_mem_pool_t pool = make_pool(0);
        REQUIRE(pool != NULL);
        uint64_t zero = 0;
        if (k > 6)
            CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                         PM_SUCCESS);
        ((pm__pool *)pool)->fail_pin_countdown = k > 6 ? k - 6 : k;
        void *p[32] = {0};
        int got = 0;
        pm_result r = PM_SUCCESS;
        for (int i = 0; i < 32 && r == PM_SUCCESS; i++) {
            /* Empty caches, so that the failing call has none to empty and
             * try again with (which would find the one-off fault gone). */
            CHECK_RESULT(pm_mem_pool_trim_to(pool, SIZE_MAX), PM_SUCCESS);
            r = pm_mem_alloc_from_pool(&p[i], i % 2 ? big : 1000, pool);
            got += r == PM_SUCCESS;
        }
        CHECK_RESULT(r, PM_ERROR_OUT_OF_MEMORY);
        CHECK(strstr(pm_last_error_detail(), "injected") != NULL);
        pm_pool_stats st = {.struct_size = sizeof st};
        CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
        CHECK(st.live == (unsigned long long)got);
        /* every granule pinned and not given back is reserved, and no more */
        unsigned long long granule = st.granule ? st.granule : 32u << 20;
        CHECK(st.reserved == (st.granules_pinned - st.granules_released) * granule);
        CHECK((st.granules_pinned > 0) == (k != 1 && k != 7));
        CHECK(st.used <= st.reserved);
        for (int i = 0; i < got; i++)
            CHECK_RESULT(pm_mem_free(p[i]), PM_SUCCESS);
        /* After the fault, the pool works again. */
        void *again = NULL;
        CHECK_RESULT(pm_mem_alloc_from_pool(&again, big, pool), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(again), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
    CHECK(locked_kib() <= locked_before);
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    single_thread();
    many_threads();
    used_high_threads();
    fault_sweep();
    return check_finish("pool_model");
}
