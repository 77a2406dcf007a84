/* Calls that run out of heap memory: each fails with PM_ERROR_OUT_OF_MEMORY
 * and leaves nothing behind that makes the next call fail, and what cannot
 * fail (giving a pool's chunks back) needs no memory. The program is linked
 * with --wrap for malloc, calloc and realloc (tests/CMakeLists.txt), so that
 * the calling thread can make its k-th allocation fail; the library's own
 * threads allocate as usual. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "copy_util.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

/* k: the k-th allocation of this thread from now fails (0: none). */
static _Thread_local int countdown;
/* k: from the k-th allocation of this thread on, every one fails, and is
 * counted in refused (0: none). */
static _Thread_local int refuse_from;
static _Thread_local int refused;

static bool fails(void)
{
    if (refuse_from > 0 && --refuse_from == 0) {
        refuse_from = 1;
        refused++;
        return true;
    }
    return countdown > 0 && --countdown == 0;
}

void *__wrap_malloc(size_t n)
{
    if (fails()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (fails()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (fails()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

/* The first device allocation of the process, whose registry of device
 * memory is made then (posix), fails; the next one succeeds. */
static void device_registry_retried(void)
{
    if (strcmp(pm_backend_name(), "posix") != 0)
        SKIP_CASE("the driver keeps device memory");
    pm_deviceptr d = 0;
    countdown = 1;
    pm_result r = pm_device_alloc(&d, 4096);
    bool fired = countdown == 0;
    countdown = 0;
    CHECK(fired);
    CHECK_RESULT(r, PM_ERROR_OUT_OF_MEMORY);
    CHECK_RESULT(pm_device_alloc(&d, 4096), PM_SUCCESS);
    CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
}

/* The default pool, whose creation failed, is created by the next call. */
static void default_pool_retried(void)
{
    pm_mem_pool_t pool = NULL;
    countdown = 1;
    pm_result r = pm_mem_get_default_pool(&pool);
    bool fired = countdown == 0;
    countdown = 0;
    CHECK(fired);
    CHECK_RESULT(r, PM_ERROR_OUT_OF_MEMORY);
    REQUIRE_RESULT(pm_mem_get_default_pool(&pool), PM_SUCCESS);
    void *p = NULL;
    REQUIRE_PINNED(pm_mem_alloc_from_pool(&p, 100, pool), "a default pool block");
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
}

/* Each allocation in turn of a pool's first block fails, in a pool of its
 * own each time (a new chunk: its bookkeeping, its place in the chunk map
 * and in the registry of ranges): the call answers PM_ERROR_OUT_OF_MEMORY,
 * and the same call then succeeds. */
static void pool_growth_fails_each_step(size_t bytes)
{
    for (int k = 1; k < 100; k++) {
        pm_mem_pool_t pool = NULL;
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
        REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
        void *p = NULL;
        countdown = k;
        pm_result r = pm_mem_alloc_from_pool(&p, bytes, pool);
        bool fired = countdown == 0;
        countdown = 0;
        /* Success is fine where what failed was optional (a thread's cache). */
        if (fired && r != PM_ERROR_OUT_OF_MEMORY && r != PM_SUCCESS && check_failed_())
            fprintf(stderr, "%s: allocation %d of %zu bytes failing gave %s (%s)\n", __func__, k,
                    bytes, pm_result_name(r), pm_last_error_detail());
        if (fired && r == PM_ERROR_OUT_OF_MEMORY)
            r = pm_mem_alloc_from_pool(&p, bytes, pool);
        if (r == PM_ERROR_OUT_OF_MEMORY && memlock_binds()) {
            pm_mem_pool_destroy(pool);
            SKIP_CASE("RLIMIT_MEMLOCK leaves no room for the pool");
        }
        CHECK_RESULT(r, PM_SUCCESS);
        if (r == PM_SUCCESS)
            CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        if (!fired)
            return; /* the call made fewer than k allocations: every one was tried */
    }
    CHECK(!"a pool's first block made 100 allocations or more");
}

/* Giving back a pool's free chunk needs no memory: its bookkeeping is kept
 * with the pool, in room made when the chunk came, so none of it is lost
 * where memory has run out. A large block (no thread cache keeps it) and a
 * trim that may take its one snapshot of the caches, and nothing more. */
static void trim_needs_no_memory(void)
{
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    void *p = NULL;
    pm_result r = pm_mem_alloc_from_pool(&p, 2 << 20, pool);
    if (r == PM_ERROR_OUT_OF_MEMORY && memlock_binds()) {
        pm_mem_pool_destroy(pool);
        SKIP_CASE("RLIMIT_MEMLOCK leaves no room for the pool");
    }
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    refused = 0;
    refuse_from = 2;
    r = pm_mem_pool_trim_to(pool, 0);
    refuse_from = 0;
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK(refused == 0);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    CHECK(st.chunks_released == 1);
    CHECK(st.reserved == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A trim whose snapshot of the thread caches cannot be allocated still
 * takes back what this thread's cache holds, and gives the chunk back. */
static void trim_without_a_snapshot(void)
{
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    void *p = NULL;
    pm_result r = pm_mem_alloc_from_pool(&p, 4096, pool);
    if (r == PM_ERROR_OUT_OF_MEMORY && memlock_binds()) {
        pm_mem_pool_destroy(pool);
        SKIP_CASE("RLIMIT_MEMLOCK leaves no room for the pool");
    }
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS); /* kept by this thread's cache */
    countdown = 1;
    r = pm_mem_pool_trim_to(pool, 0);
    countdown = 0;
    CHECK_RESULT(r, PM_SUCCESS);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    CHECK(st.reserved == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* The process's cgroup limits, whose first read ran short of memory, are
 * read again by the next call, and kept once a read is whole. */
static void limits_read_again(void)
{
    countdown = 1;
    (void)pm__usable_cpus();
    CHECK(countdown == 0);
    countdown = 1;
    (void)pm__usable_memory();
    bool again = countdown == 0;
    countdown = 0;
    CHECK(again);
    const unsigned cpus = pm__usable_cpus();
    countdown = 1;
    CHECK(pm__usable_cpus() == cpus);
    bool kept = countdown == 1;
    countdown = 0;
    CHECK(kept);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    /* First: each makes what it fails for on the process's first use. */
    limits_read_again();
    device_registry_retried();
    default_pool_retried();
    pool_growth_fails_each_step(100);
    pool_growth_fails_each_step(256 << 10);
    trim_needs_no_memory();
    trim_without_a_snapshot();
    return check_finish("test_alloc_faults");
}
