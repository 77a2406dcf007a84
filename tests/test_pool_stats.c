/* Statistics of all pools: the user's pools, including destroyed ones whose
 * allocations still live, and not the staging ring; the same
 * for PINMEM_STATS=1 at exit. Pools of 4 MiB, pinned as the backend pins
 * them and in whole chunks (as CUDA pins pools that keep their memory). */
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "copy_util.h"
#include "pool/pool_internal.h"
#include "pool_util.h"
#include "test_hooks.h"

static pm_pool_stats all_pools(void)
{
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(NULL, &st), PM_SUCCESS);
    return st;
}

/* The staging ring the copies pin is the library's, not a user pool. */
static void staging_pool_left_out(void)
{
    small_copy_config(0);
    const size_t bytes = 1 << 20;
    uint8_t *src = malloc(bytes);
    pm_deviceptr d = device_alloc(bytes);
    REQUIRE(src && d);
    fill(src, bytes, 1);
    pm_pool_stats before = all_pools();
    CHECK_RESULT(pm_memcpy_htod(d, src, bytes), PM_SUCCESS);
    pm_copy_stats cs = {.struct_size = sizeof cs};
    CHECK_RESULT(pm_copy_get_stats(&cs), PM_SUCCESS);
    device_free(d);
    free(src);
    if (cs.staged_bytes == 0)
        SKIP_CASE("no copy was staged here");
    pm_pool_stats after = all_pools();
    CHECK(after.reserved == before.reserved && after.live == before.live &&
          after.used == before.used && after.allocs == before.allocs);
    if (after.reserved != before.reserved || after.live != before.live)
        fprintf(stderr, "all pools: reserved %llu -> %llu, live %llu -> %llu after a staged copy\n",
                before.reserved, after.reserved, before.live, after.live);
}

/* A destroyed pool's live allocations still hold its memory. */
static void destroyed_pool_counted(void)
{
    pm_pool_stats before = all_pools();
    pm_mem_pool_t pool = make_pool(4u << 20);
    REQUIRE(pool != NULL);
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 1000, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    pm_pool_stats during = all_pools();
    CHECK(during.live == before.live + 1 && during.used == before.used + 1024);
    CHECK(during.reserved > before.reserved);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    pm_pool_stats after = all_pools();
    CHECK(after.live == before.live && after.reserved == before.reserved);
}

static pm_pool_stats midway;

static void read_all_pools(void) { midway = all_pools(); }

/* A pool that a destroy has listed and not yet taken out of the live set is
 * counted once by the statistics of all pools, not twice. */
static void destroy_midway_counted_once(void)
{
    const pm_pool_stats before = all_pools();
    pm_mem_pool_t pool = make_pool(4u << 20);
    REQUIRE(pool != NULL);
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 1000, pool), PM_SUCCESS);
    atomic_store(&pm__test_destroy_midway, read_all_pools);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    atomic_store(&pm__test_destroy_midway, NULL);
    printf("all pools while one is destroyed: live %llu, used %llu (before %llu, %llu)\n",
           midway.live, midway.used, before.live, before.used);
    CHECK(midway.live == before.live + 1 && midway.used == before.used + 1024);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    const pm_pool_stats after = all_pools();
    CHECK(after.live == before.live && after.reserved == before.reserved);
}

/* PINMEM_STATS=1 prints at exit what a destroyed pool's live allocation
 * holds. Runs in a child that has not used pinmem, with stderr in a pipe. */
static int exit_stats_count_destroyed(bool whole_chunks)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t child = fork();
    if (child < 0)
        return 0;
    if (child == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        setenv("PINMEM_STATS", "1", 1);
        atomic_store(&pm__pool_whole_chunks, whole_chunks);
        pm_mem_pool_t pool = make_pool(4u << 20);
        void *p = NULL;
        if (!pool || pm_mem_alloc_from_pool(&p, 1000, pool) != PM_SUCCESS ||
            pm_mem_pool_destroy(pool) != PM_SUCCESS)
            _exit(3);
        exit(0);
    }
    close(fds[1]);
    char out[4096];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof out - 1 && (got = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)got;
    out[n] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && strstr(out, "\"live\":1,") &&
             strstr(out, "\"used\":1024,");
    if (!ok)
        fprintf(stderr, "PINMEM_STATS with a destroyed pool in use%s (status 0x%x): %s\n",
                whole_chunks ? ", whole chunks" : "", status, out);
    return ok;
}

int main(void)
{
    /* First, while this process has not used pinmem. */
    CHECK(exit_stats_count_destroyed(false));
    CHECK(exit_stats_count_destroyed(true));
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    staging_pool_left_out();
    destroyed_pool_counted();
    atomic_store(&pm__pool_whole_chunks, true);
    destroyed_pool_counted();
    atomic_store(&pm__pool_whole_chunks, false);
    destroy_midway_counted_once();
    return check_finish("pool_stats");
}
