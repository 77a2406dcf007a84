/* Pools under the limit an ordinary user has: RLIMIT_MEMLOCK of 8 MiB and
 * no CAP_IPC_LOCK (this test lowers the limit and drops the capability for
 * itself, so it means the same run as root). Small pools fit; what the
 * limit dooms fails at once, naming the limit, with nothing locked and no
 * memory touched. */
#include <linux/capability.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "instance.h"
#include "pool_util.h"

static const size_t MiB = 1u << 20;
static size_t limit;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The most memory this process has had resident (VmHWM), in KiB. */
static unsigned long long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* An ordinary user's limit: 8 MiB (or less, if the hard limit is lower),
 * and CAP_IPC_LOCK, which would lift it, out of the effective set. */
static int become_ordinary(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2];
    if (syscall(SYS_capget, &hdr, caps) == 0 &&
        (caps[CAP_IPC_LOCK / 32].effective >> (CAP_IPC_LOCK % 32)) & 1) {
        caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
        if (syscall(SYS_capset, &hdr, caps) != 0)
            return 0;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return 0;
    limit = 8 * MiB;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < limit)
        limit = rl.rlim_max;
    rl.rlim_cur = limit;
    return setrlimit(RLIMIT_MEMLOCK, &rl) == 0;
}

/* A 100-byte allocation, in several pools at once, with the default release
 * threshold and with 0. */
static void small_allocations_fit(void)
{
    for (int threshold_zero = 0; threshold_zero <= 1; threshold_zero++) {
        enum { pools = 4 };
        pm_mem_pool_t pool[pools] = {0};
        void *p[pools] = {0};
        int made = 0;
        for (; made < pools; made++) {
            pool[made] = make_pool(0);
            REQUIRE(pool[made] != NULL);
            uint64_t zero = 0;
            if (threshold_zero)
                CHECK_RESULT(pm_mem_pool_set_attribute(pool[made],
                                                       PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                             PM_SUCCESS);
            pm_result r = pm_mem_alloc_from_pool(&p[made], 100, pool[made]);
            CHECK_RESULT(r, PM_SUCCESS);
            if (r != PM_SUCCESS)
                break;
            memset(p[made], 0x5A, 100);
            CHECK(pool_attr(pool[made], PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) <= limit / 2);
        }
        CHECK(locked_kib() * 1024 <= limit);
        for (int i = 0; i < pools; i++) {
            if (p[i])
                CHECK_RESULT(pm_mem_free(p[i]), PM_SUCCESS);
            if (pool[i])
                CHECK_RESULT(pm_mem_pool_destroy(pool[i]), PM_SUCCESS);
        }
    }
}

/* More than the limit: OUT_OF_MEMORY naming it; the pool works afterwards. */
static void beyond_limit_fails(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 2 * limit, pool), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 100, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 2 * limit, pool), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A 2 GiB allocation the limit dooms fails within a second, locks nothing
 * and touches no memory: from a fresh pool, and from one that has memory.
 * The bounds are loose (a sanitizer build on a busy machine took 0.23 s);
 * refusing after touching the pages takes seconds and the whole size in RSS. */
static void refusal_is_cheap(void)
{
    for (int has_memory = 0; has_memory <= 1; has_memory++) {
        pm_mem_pool_t pool = make_pool(0);
        REQUIRE(pool != NULL);
        void *small = NULL, *p = NULL;
        if (has_memory)
            REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 100, pool), PM_SUCCESS);
        unsigned long long rss = peak_rss_kib(), locked = locked_kib();
        double t0 = now();
        CHECK_RESULT(pm_mem_alloc_from_pool(&p, (size_t)2 << 30, pool), PM_ERROR_OUT_OF_MEMORY);
        double took = now() - t0;
        unsigned long long rss_after = peak_rss_kib(), locked_after = locked_kib();
        if (took >= 1.0 || rss_after > rss + 32 * 1024 || locked_after > locked)
            fprintf(stderr, "refusing 2 GiB took %.3f s, peak RSS %llu -> %llu KiB, locked %llu -> "
                            "%llu KiB\n",
                    took, rss, rss_after, locked, locked_after);
        CHECK(took < 1.0);
        CHECK(rss_after <= rss + 32 * 1024);
        CHECK(locked_after <= locked);
        if (small)
            CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
}

int main(void)
{
    if (!become_ordinary())
        SKIP("cannot lower RLIMIT_MEMLOCK here");
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s; RLIMIT_MEMLOCK %zu KiB\n", pm_backend_name(), limit / 1024);
    if (pm__instance_backend()->pinnable_bytes() == SIZE_MAX)
        SKIP("pinning here is not bound by RLIMIT_MEMLOCK");
    small_allocations_fit();
    beyond_limit_fails();
    refusal_is_cheap();
    return check_finish("pool_limits");
}
