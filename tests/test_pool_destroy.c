/* Destroying a pool while its memory is still in use: frees from many
 * threads racing the destroy, frees racing each other into a destroyed
 * pool, and a destroy that must not wait for streams' work. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "pool_util.h"
#include "stream_util.h"

static const size_t MiB = 1u << 20;

/* Rounds of the races: enough to catch the old faults most runs, few enough
 * for ThreadSanitizer's pace on two cores. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifdef UNDER_TSAN
enum { racing_rounds = 150, pair_rounds = 2000 };
#else
enum { racing_rounds = 1000, pair_rounds = 4000 };
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A barrier that releases its threads as close together as it can, so that
 * what they do next races. */
typedef struct spin_barrier {
    atomic_int arrived;
    atomic_int round;
    int n;
} spin_barrier;

static void spin_wait(spin_barrier *b)
{
    int round = atomic_load(&b->round);
    if (atomic_fetch_add(&b->arrived, 1) + 1 == b->n) {
        atomic_store(&b->arrived, 0);
        atomic_fetch_add(&b->round, 1);
        return;
    }
    for (unsigned spins = 0; atomic_load(&b->round) == round; spins++)
        if (spins > 1000)
            sched_yield(); /* 2 cores, many threads: let the others run */
}

/* ------------------------------------------ destroy racing many threads' frees */

enum { racers = 16, blocks_each = 8 };

static struct {
    spin_barrier start, allocated, done;
    pm_mem_pool_t pool;
    atomic_int stop;
    atomic_int alloc_failures;
} race;

static void *hold_and_free(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    for (;;) {
        spin_wait(&race.start);
        if (atomic_load(&race.stop))
            return NULL;
        void *mine[blocks_each] = {0};
        for (int i = 0; i < blocks_each; i++) {
            size_t size = (size_t)64 << ((id + (uintptr_t)i) % 7); /* 64 B - 4 KiB: cached */
            if (pm_mem_alloc_from_pool(&mine[i], size, race.pool) != PM_SUCCESS) {
                atomic_fetch_add(&race.alloc_failures, 1);
                mine[i] = NULL;
            }
        }
        /* Give some back before the destroy, so caches hold free blocks too. */
        pm_mem_free(mine[0]);
        mine[0] = NULL;
        spin_wait(&race.allocated); /* the destroy starts here too */
        for (int i = 1; i < blocks_each; i++)
            CHECK_RESULT(pm_mem_free(mine[i]), PM_SUCCESS);
        spin_wait(&race.done);
    }
}

/* Every thread holds blocks from its own cache; the pool is destroyed while
 * they free them. A free that lands between the destroy's flushes of the
 * threads' caches must not tear the pool down under the destroy, nor any
 * block another thread still uses. */
static void destroy_racing_frees(void)
{
    const int rounds = racing_rounds;
    race.start.n = race.allocated.n = race.done.n = racers + 1;
    pthread_t tids[racers];
    for (uintptr_t t = 0; t < racers; t++)
        REQUIRE(pthread_create(&tids[t], NULL, hold_and_free, (void *)t) == 0);
    unsigned long long locked_before = locked_kib();
    for (int round = 0; round < rounds; round++) {
        race.pool = make_pool(4 * MiB);
        spin_wait(&race.start);
        spin_wait(&race.allocated);
        CHECK_RESULT(pm_mem_pool_destroy(race.pool), PM_SUCCESS);
        spin_wait(&race.done);
    }
    atomic_store(&race.stop, 1);
    spin_wait(&race.start);
    for (int t = 0; t < racers; t++)
        pthread_join(tids[t], NULL);
    CHECK(atomic_load(&race.alloc_failures) == 0);
    CHECK(locked_kib() <= locked_before); /* every pool went back */
}

/* ------------------------------------------ two frees into a destroyed pool */

static struct {
    spin_barrier go, done;
    void *block[2];
    atomic_int stop;
} pair;

static void *free_one(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    for (;;) {
        spin_wait(&pair.go);
        if (atomic_load(&pair.stop))
            return NULL;
        CHECK_RESULT(pm_mem_free(pair.block[id]), PM_SUCCESS);
        spin_wait(&pair.done);
    }
}

/* A pool destroyed with two allocations live, freed by two threads at once:
 * exactly one of the frees finishes the pool, and the other never touches
 * it afterwards. */
static void two_frees_into_destroyed_pool(void)
{
    const int rounds = pair_rounds;
    pair.go.n = pair.done.n = 3;
    pthread_t tids[2];
    for (uintptr_t t = 0; t < 2; t++)
        REQUIRE(pthread_create(&tids[t], NULL, free_one, (void *)t) == 0);
    int failures = 0;
    for (int round = 0; round < rounds && !failures; round++) {
        pm_mem_pool_t pool = make_pool(4 * MiB);
        /* one large, one small: each freed without any thread cache */
        if (pm_mem_alloc_from_pool(&pair.block[0], 2 * MiB, pool) != PM_SUCCESS ||
            pm_mem_alloc_from_pool(&pair.block[1], 100, pool) != PM_SUCCESS) {
            failures++;
            break;
        }
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        spin_wait(&pair.go);
        spin_wait(&pair.done);
    }
    atomic_store(&pair.stop, 1);
    spin_wait(&pair.go);
    for (int t = 0; t < 2; t++)
        pthread_join(tids[t], NULL);
    CHECK(failures == 0);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"racing_frees", destroy_racing_frees},
    {"two_frees", two_frees_into_destroyed_pool},
};

/* With an argument, only the cases it names. */
int main(int argc, char **argv)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    /* A pool torn down under a thread may leave it waiting on a freed lock. */
    alarm(120);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && !strstr(argv[1], cases[i].name))
            continue;
        double t0 = now();
        cases[i].run();
        printf("%s: %.2f s\n", cases[i].name, now() - t0);
    }
    return check_finish("pool_destroy");
}
