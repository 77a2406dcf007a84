/* Destroying a pool while its memory is still in use: frees from many
 * threads racing the destroy, frees racing each other into a destroyed
 * pool, and a destroy that must not wait for streams' work. The cases run
 * with pools pinned as the backend pins them, and again in whole chunks
 * whose giving back waits for the device, as CUDA pins pools that keep
 * their memory, where the backend does not already. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "pool/pool_internal.h"
#include "pool_util.h"
#include "stream_util.h"

static const size_t MiB = 1u << 20;

/* Rounds of the races: enough to catch the old faults most runs, few enough
 * for ThreadSanitizer's pace on two cores. */
#if UNDER_TSAN
enum { racing_rounds = 150, pair_rounds = 1000 };
#else
enum { racing_rounds = 600, pair_rounds = 3000 };
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* What the pools pinned goes back to what it was, soon (a destroyed pool
 * may wait for the reaper). */
static void check_released(unsigned long long pinned_before)
{
    double deadline = now() + 10;
    while (pm__budget_pinned() > pinned_before && now() < deadline)
        usleep(1000);
    CHECK(pm__budget_pinned() <= pinned_before);
}

/* Under a memlock limit (an ordinary user's 8 MiB), waits for destroyed
 * pools to go back before the next round makes more: in whole chunks they
 * wait for the reaper, and a few rounds ahead of it fill the limit. Where
 * nothing limits pinning (CUDA, root), rounds run as fast as they can. */
static void keep_up_with_reaper(unsigned long long pinned_before)
{
    if (pinnable() == SIZE_MAX)
        return;
    double deadline = now() + 10;
    while (pm__budget_pinned() > pinned_before && now() < deadline)
        usleep(100);
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
    atomic_store(&race.stop, 0); /* a case may run more than once */
    pthread_t tids[racers];
    for (uintptr_t t = 0; t < racers; t++)
        REQUIRE(pthread_create(&tids[t], NULL, hold_and_free, (void *)t) == 0);
    unsigned long long pinned_before = pm__budget_pinned();
    for (int round = 0; round < rounds; round++) {
        race.pool = make_pool(4 * MiB);
        spin_wait(&race.start);
        spin_wait(&race.allocated);
        CHECK_RESULT(pm_mem_pool_destroy(race.pool), PM_SUCCESS);
        spin_wait(&race.done);
        keep_up_with_reaper(pinned_before);
    }
    atomic_store(&race.stop, 1);
    spin_wait(&race.start);
    for (int t = 0; t < racers; t++)
        pthread_join(tids[t], NULL);
    CHECK(atomic_load(&race.alloc_failures) == 0);
    check_released(pinned_before); /* every pool went back */
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
    atomic_store(&pair.stop, 0);
    pthread_t tids[2];
    for (uintptr_t t = 0; t < 2; t++)
        REQUIRE(pthread_create(&tids[t], NULL, free_one, (void *)t) == 0);
    int failures = 0;
    unsigned long long pinned_before = pm__budget_pinned();
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
        keep_up_with_reaper(pinned_before);
    }
    atomic_store(&pair.stop, 1);
    spin_wait(&pair.go);
    for (int t = 0; t < 2; t++)
        pthread_join(tids[t], NULL);
    CHECK(failures == 0);
    check_released(pinned_before); /* the reaper's backlog is not the next case's */
}

/* ------------------------------------------ destroy never waits for streams */


/* Blocks freed on a stream whose work waits for the gate: destroying the
 * pool (cached blocks; a large one) or freeing its last block into it after
 * the destroy returns at once, as cuMemPoolDestroy does. */
static void destroy_does_not_wait(void)
{
    for (int last_free_after = 0; last_free_after <= 1; last_free_after++) {
        unsigned long long pinned_before = pm__budget_pinned();
        pm_stream_t s = NULL;
        REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
        pm_mem_pool_t pool = make_pool(4 * MiB);
        REQUIRE(pool != NULL);
        void *small = NULL, *large = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&small, 4096, pool, s), PM_SUCCESS);
        REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&large, 2 * MiB, pool, s), PM_SUCCESS);
        reset_gate();
        REQUIRE_RESULT(pm_stream_launch_host_func(s, wait_gate, NULL), PM_SUCCESS);
        pthread_t opener;
        REQUIRE(pthread_create(&opener, NULL, open_gate_if_stuck, NULL) == 0);
        double t0 = now();
        if (last_free_after) {
            CHECK_RESULT(pm_mem_free_async(small, s), PM_SUCCESS);
            CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
            CHECK_RESULT(pm_mem_free_async(large, s), PM_SUCCESS); /* the last */
        } else {
            CHECK_RESULT(pm_mem_free_async(small, s), PM_SUCCESS);
            CHECK_RESULT(pm_mem_free_async(large, s), PM_SUCCESS);
            CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        }
        double took = now() - t0;
        if (took >= 1.0)
            fprintf(stderr, "%s waited %.2f s for the stream\n",
                    last_free_after ? "the last pm_mem_free_async" : "pm_mem_pool_destroy", took);
        CHECK(took < 1.0);
        atomic_store(&gate_open, 1);
        pthread_join(opener, NULL);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
        check_released(pinned_before);
    }
}

/* The reaper cannot be started (once; always): a destroy still returns at
 * once, and the memory still goes back, by the reaper started at the next
 * synchronization or, failing that, by the synchronization itself. */
static void reaper_start_fails(void)
{
    for (int fail_always = 0; fail_always <= 1; fail_always++) {
        /* A reaper still running from before takes the pool, so no start fails. */
        double running_until = now() + 10;
        while (pm__retire_reaper_running() && now() < running_until)
            usleep(1000);
        REQUIRE(!pm__retire_reaper_running());
        unsigned long long pinned_before = pm__budget_pinned();
        pm_stream_t s = NULL;
        REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
        pm_mem_pool_t pool = make_pool(4 * MiB);
        REQUIRE(pool != NULL);
        void *p = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 2 * MiB, pool), PM_SUCCESS);
        reset_gate();
        REQUIRE_RESULT(pm_stream_launch_host_func(s, wait_gate, NULL), PM_SUCCESS);
        pthread_t opener;
        REQUIRE(pthread_create(&opener, NULL, open_gate_if_stuck, NULL) == 0);
        pm__retire_fail_starts = fail_always ? 1000000 : 1;
        double t0 = now();
        CHECK_RESULT(pm_mem_free_async(p, s), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        CHECK(now() - t0 < 1.0);
        atomic_store(&gate_open, 1);
        pthread_join(opener, NULL);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        if (fail_always) /* given back by the synchronization, which waits anyway */
            CHECK(pm__budget_pinned() <= pinned_before);
        check_released(pinned_before);
        pm__retire_fail_starts = 0;
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    }
}

/* The reaper starts as every thread of pinmem's own that may call the
 * driver does (backend.h: own_thread_start; on CUDA it makes the context
 * current and leaves other threads' graph captures alone). Runs before any
 * other case, so that this pool's teardown starts the reaper. */
static void (*backend_own_thread_start)(void);
static atomic_int own_thread_starts;

static void count_own_thread_start(void)
{
    atomic_fetch_add(&own_thread_starts, 1);
    backend_own_thread_start();
}

static void reaper_starts_as_own_thread(void)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    REQUIRE(inst != NULL);
    unsigned long long pinned_before = pm__budget_pinned();
    backend_own_thread_start = inst->backend.own_thread_start;
    inst->backend.own_thread_start = count_own_thread_start; /* before any thread starts */
    pm_mem_pool_t pool = make_pool(4 * MiB);
    REQUIRE(pool != NULL);
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 4096, pool), PM_SUCCESS);
    pm_stream_t s = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    reset_gate();
    CHECK_RESULT(pm_stream_launch_host_func(s, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(p, s), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS); /* to the reaper: s still works */
    atomic_store(&gate_open, 1);
    check_released(pinned_before);
    CHECK(atomic_load(&own_thread_starts) >= 1);
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

/* A process may end with a destroyed pool still waiting for a stream whose
 * work never finishes: exit neither hangs nor crashes. Runs in a child
 * started before this process uses pinmem. */
static int exit_with_pool_waiting(bool whole_chunks)
{
    pid_t child = fork();
    if (child < 0)
        return -1;
    if (child == 0) {
        atomic_store(&pm__pool_whole_chunks, whole_chunks);
        pm_stream_t s = NULL;
        pm_mem_pool_t pool = NULL;
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}, .max_size = 4 * MiB};
        void *p = NULL;
        atomic_store(&gate_open, 0);
        if (pm_stream_create(&s) != PM_SUCCESS || pm_mem_pool_create(&pool, &props) != PM_SUCCESS ||
            pm_mem_alloc_from_pool(&p, 4096, pool) != PM_SUCCESS ||
            pm_stream_launch_host_func(s, wait_gate, NULL) != PM_SUCCESS ||
            pm_mem_free_async(p, s) != PM_SUCCESS || pm_mem_pool_destroy(pool) != PM_SUCCESS)
            _exit(3);
        exit(0); /* atexit handlers run; the stream's work still waits */
    }
    double deadline = now() + 20;
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(child, &status, WNOHANG)) == 0 && now() < deadline)
        usleep(10000);
    if (done == 0) {
        fprintf(stderr, "a process ending with a destroyed pool waiting did not end\n");
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        return 0;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "a process ending with a destroyed pool waiting%s: status 0x%x\n",
                whole_chunks ? " (whole chunks)" : "", status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"racing_frees", destroy_racing_frees},
    {"two_frees", two_frees_into_destroyed_pool},
    {"does_not_wait", destroy_does_not_wait},
    {"reaper_start_fails", reaper_start_fails},
};

/* Whether pools that keep their memory are pinned in whole chunks here
 * without being told to. */
static bool kept_pools_whole(void)
{
    pm_mem_pool_t pool = make_pool(0);
    pm_pool_stats st = {.struct_size = sizeof st};
    bool whole = pool && pm_mem_pool_get_stats(pool, &st) == PM_SUCCESS && st.granule == 0;
    if (pool)
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    return whole;
}

/* With an argument, only the cases it names. */
int main(int argc, char **argv)
{
    /* First, while this process has no threads and has not used pinmem. */
    if (argc <= 1 || strstr(argv[1], "exit_waiting")) {
        CHECK(exit_with_pool_waiting(false) == 1);
        CHECK(exit_with_pool_waiting(true) == 1);
    }
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    /* A pool torn down under a thread may leave it waiting on a freed lock. */
    alarm(240);
    if (argc <= 1 || strstr(argv[1], "reaper_starts"))
        reaper_starts_as_own_thread();
    const bool already_whole = kept_pools_whole();
    for (int whole = 0; whole <= !already_whole; whole++) {
        atomic_store(&pm__pool_whole_chunks, whole);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (argc > 1 && !strstr(argv[1], cases[i].name))
                continue;
            double t0 = now();
            cases[i].run();
            printf("%s%s: %.2f s\n", cases[i].name, whole ? " (whole chunks)" : "",
                   now() - t0);
        }
    }
    atomic_store(&pm__pool_whole_chunks, false);
    return check_finish("pool_destroy");
}
