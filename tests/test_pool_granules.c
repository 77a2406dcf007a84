/* Pool memory is pinned in granules: the pages of a hole go back to the
 * system while the rest of its chunk stays in use, a pool that needs memory
 * elsewhere moves idle granules there instead of growing, and a pool with a
 * release threshold gives back what goes idle above it at once. Runs
 * wherever a pool with a release threshold gets 2 MiB granules (POSIX; CUDA
 * drivers with VMM host memory), so that the arithmetic below is exact. */
#include <stdint.h>
#include <string.h>

#include "pool_util.h"

static const size_t MiB = 1u << 20;

static pm_pool_stats pool_stats(pm_mem_pool_t pool)
{
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    return st;
}

/* Fills p with a pattern and reads it back: committed memory is usable. */
static void touch(void *p, size_t bytes, unsigned char v)
{
    memset(p, v, bytes);
    const unsigned char *b = p;
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i += 4096)
        bad += b[i] != v;
    CHECK(bad == 0 && b[bytes - 1] == v);
}

/* A pool in granules that gives nothing back before trim: its threshold is
 * as high as can be without being the default, which keeps everything and
 * on CUDA pins whole registered chunks. */
static pm_mem_pool_t granule_pool(size_t max_size)
{
    pm_mem_pool_t pool = make_pool(max_size);
    uint64_t high = UINT64_MAX - 1;
    if (pool)
        CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &high),
                     PM_SUCCESS);
    return pool;
}

/* A 24 MiB block and a small one behind it fill one 32 MiB chunk; once the
 * big one is freed, trim gives back every granule but the small block's. */
static void trim_gives_back_holes(void)
{
    NEED_PINNABLE(64 * MiB); /* the first chunk, pinned whole */
    pm_mem_pool_t pool = granule_pool(0);
    REQUIRE(pool != NULL);
    void *big = NULL, *small = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&big, 24 * MiB, pool), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 1000, pool), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * MiB);
    touch(small, 1000, 7);
    CHECK_RESULT(pm_mem_free(big), PM_SUCCESS);
    pm_pool_stats st = pool_stats(pool);
    CHECK(st.idle_granules == 30 * MiB && st.free_in_holes >= 30 * MiB);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    st = pool_stats(pool);
    CHECK(st.reserved == 2 * MiB && st.idle_granules == 0);
    CHECK(st.granules_released == 15 && st.chunks_released == 0);
    CHECK(st.free_in_holes < 2 * MiB);
    const unsigned char *b = small;
    CHECK(b[0] == 7 && b[999] == 7);
    /* The hole commits again when an allocation lands on it. */
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&big, 24 * MiB, pool), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 26 * MiB);
    touch(big, 24 * MiB, 9);
    uintptr_t base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_get_address_range((pm_deviceptr *)&base, &size, (pm_deviceptr)(uintptr_t)big + MiB),
                 PM_SUCCESS);
    CHECK(base == (uintptr_t)big && size == 24 * MiB);
    CHECK_RESULT(pm_mem_free(big), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    st = pool_stats(pool);
    CHECK(st.reserved == 0 && st.chunks_released == st.chunks_pinned);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Twenty idle granules and a request for 40 MiB that fits in no free span:
 * the idle ones are given back before 20 granules are committed for it. */
static void moves_instead_of_growing(void)
{
    NEED_PINNABLE(96 * MiB);
    pm_mem_pool_t pool = granule_pool(0);
    REQUIRE(pool != NULL);
    void *a = NULL, *small = NULL, *c = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 20 * MiB, pool), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 1000, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
    pm_pool_stats st = pool_stats(pool);
    CHECK(st.reserved == 32 * MiB && st.idle_granules == 30 * MiB);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&c, 40 * MiB, pool), PM_SUCCESS);
    st = pool_stats(pool);
    /* 15 idle granules moved, 20 committed: the small block's and c's, no more */
    CHECK(st.granules_moved == 15 && st.idle_granules == 0);
    CHECK(st.reserved == 42 * MiB && st.used == 40 * MiB + 1024);
    touch(c, 40 * MiB, 3);
    CHECK_RESULT(pm_mem_free(c), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* max_size counts committed bytes: moving lets a pool at its limit serve a
 * request that a growing pool could not. */
static void max_size_counts_committed(void)
{
    NEED_PINNABLE(64 * MiB);
    pm_mem_pool_t pool = granule_pool(32 * MiB);
    REQUIRE(pool != NULL);
    void *a = NULL, *small = NULL, *c = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 20 * MiB, pool), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 1000, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&c, 26 * MiB, pool), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) <= 32 * MiB);
    void *d = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&d, 8 * MiB, pool), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "max_size") != NULL);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) <= 32 * MiB);
    CHECK_RESULT(pm_mem_free(c), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Above the release threshold, granules go back as soon as nothing uses
 * them, with no synchronization or trim; down to it, they stay. */
static void threshold_gives_back_at_once(void)
{
    NEED_PINNABLE(64 * MiB); /* the first chunk, pinned whole */
    uint64_t thresholds[] = {0, 6 * MiB};
    for (int i = 0; i < 2; i++) {
        pm_mem_pool_t pool = make_pool(0);
        REQUIRE(pool != NULL);
        CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                               &thresholds[i]),
                     PM_SUCCESS);
        void *a = NULL, *small = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 20 * MiB, pool), PM_SUCCESS);
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 1000, pool), PM_SUCCESS);
        /* a fresh pool's first chunk is pinned whole, as the driver's are */
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * MiB);
        CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
        pm_pool_stats st = pool_stats(pool);
        CHECK(st.reserved == (i == 0 ? 2 * MiB : 6 * MiB));
        CHECK(st.granules_moved == 0);
        /* and come back when an allocation needs them */
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 10 * MiB, pool), PM_SUCCESS);
        touch(a, 10 * MiB, 5);
        st = pool_stats(pool);
        CHECK(st.reserved >= 12 * MiB && st.reserved <= 14 * MiB);
        CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
        /* the small block waits in this thread's cache, its run in its granule */
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == (i == 0 ? 2 * MiB : 6 * MiB));
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
    /* The default threshold keeps what went idle. */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *a = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 20 * MiB, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 32 * MiB);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    pm_mem_pool_t pool = granule_pool(0);
    if (!pool)
        return check_finish("pool_granules");
    pm_pool_stats st = pool_stats(pool);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    if (st.granule != 2 * MiB) {
        printf("skipped: pools with a release threshold pin memory in granules of %llu bytes "
               "here, not 2 MiB\n",
               st.granule);
        return 77;
    }
    trim_gives_back_holes();
    moves_instead_of_growing();
    max_size_counts_committed();
    threshold_gives_back_at_once();
    return check_finish("pool_granules");
}
