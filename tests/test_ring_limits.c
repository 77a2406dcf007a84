/* The staging ring works within the pinning the process may do: under an
 * 8 MiB RLIMIT_MEMLOCK (an ordinary user's) it shrinks and copies are
 * staged through it; where not even the smallest ring fits, copies take
 * the backend's own path, pm_copy_get_stats says why, and nothing was
 * mapped or touched for a ring the limit dooms; the pinned budget bounds
 * it the same way; and no ring pins more than 2 GiB.
 *
 * Each case runs in a child of its own (the ring is process-wide), which
 * drops CAP_IPC_LOCK where it has it, so that the limit binds as it does
 * for an ordinary user. */
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "copy_util.h"

#define MIB ((size_t)1 << 20)

static pm_copy_stats stats(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st;
}

/* Pinning bound by RLIMIT_MEMLOCK at bytes, as for a user without
 * CAP_IPC_LOCK; false if it cannot be arranged. */
static bool limit_memlock(rlim_t bytes)
{
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &head, data) != 0)
        return false;
    data[0].effective &= ~(1u << CAP_IPC_LOCK);
    data[0].permitted &= ~(1u << CAP_IPC_LOCK);
    data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
    if (syscall(SYS_capset, &head, data) != 0)
        return false;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return false;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < bytes)
        bytes = rl.rlim_max;
    rl.rlim_cur = bytes;
    return setrlimit(RLIMIT_MEMLOCK, &rl) == 0;
}

static long max_rss_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A round trip of n pageable bytes, checked; false when a step failed. */
static bool round_trip(size_t n, unsigned seed)
{
    uint8_t *src = malloc(n), *dst = malloc(n);
    pm_deviceptr dev = 0;
    bool ok = src && dst && pm_device_alloc(&dev, n) == PM_SUCCESS;
    CHECK(ok);
    if (ok) {
        fill(src, n, seed);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
        ok = first_mismatch(dst, n, seed) == n;
        CHECK(ok);
    }
    if (dev)
        pm_device_free(dev);
    free(src);
    free(dst);
    return ok;
}

/* Under 8 MiB the default ring (24 MiB or more) shrinks to a quarter of
 * what is left, and pageable copies are staged through it. */
static void shrinks_under_the_limit(void)
{
    if (!limit_memlock(8 * MIB))
        SKIP_CASE("cannot lower RLIMIT_MEMLOCK");
    REQUIRE_RESULT(pm_init(0), PM_SUCCESS);
    if (strcmp(pm_backend_name(), "posix") != 0)
        SKIP_CASE("the driver's pinning ignores RLIMIT_MEMLOCK");
    pm_copy_stats st = stats();
    CHECK(st.ring_pinned == 0);
    CHECK(st.ring_buffers >= 1 && st.ring_buffers * st.ring_buffer_bytes <= 2 * MIB);
    CHECK(strstr(st.ring_note, "RLIMIT_MEMLOCK") != NULL);
    round_trip(16 * MIB, 1);
    pm_copy_stats after = stats();
    CHECK(after.ring_pinned == 1);
    CHECK(after.staged_bytes - st.staged_bytes == 32 * MIB); /* both ways, through the ring */
    CHECK(after.driver_bytes == st.driver_bytes);
    CHECK(locked_kib() <= 8 * 1024);
    /* the program's own pinned memory still fits beside it */
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, 4 * MIB), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
}

/* Where a quarter of what is left cannot hold two 64 KiB buffers, there is
 * no ring: copies take the backend's own path, the stats say why, and the
 * refusal is cheap: a ring of 8 x 64 MiB asked for is never mapped. */
static void none_fits(void)
{
    if (!limit_memlock(64 << 10))
        SKIP_CASE("cannot lower RLIMIT_MEMLOCK");
    REQUIRE_RESULT(pm_init(0), PM_SUCCESS);
    if (strcmp(pm_backend_name(), "posix") != 0)
        SKIP_CASE("the driver's pinning ignores RLIMIT_MEMLOCK");
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.chunk_bytes = 64 * MIB;
    c.buffers = 8;
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    const size_t n = 16 * MIB;
    uint8_t *src = malloc(n), *dst = malloc(n);
    pm_deviceptr dev = 0;
    if (!src || !dst || pm_device_alloc(&dev, n) != PM_SUCCESS) {
        CHECK(!"allocating the buffers failed");
        free(src);
        free(dst);
        return;
    }
    fill(src, n, 2);
    memset(dst, 0, n);
    CHECK_RESULT(test_backend()->copy_htod(dev, dst, n), PM_SUCCESS); /* device memory touched */
    long rss = max_rss_kib();
    pm_copy_stats before = stats();
    double t0 = now_s();
    CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
    double took = now_s() - t0;
    CHECK(first_mismatch(dst, n, 2) == n);
    pm_copy_stats after = stats();
    CHECK(after.ring_pinned == 0 && after.ring_buffers == 0);
    CHECK(strstr(after.ring_note, "no staging ring") != NULL);
    CHECK(strstr(after.ring_note, "RLIMIT_MEMLOCK") != NULL);
    CHECK(after.driver_bytes - before.driver_bytes == 2 * n);
    CHECK(after.staged_bytes == before.staged_bytes);
    long grown = max_rss_kib() - rss;
    if (grown > 32 * 1024 || took > 2.0)
        fprintf(stderr, "the refusal took %.3f s and grew the resident set by %ld KiB\n", took,
                grown);
    CHECK(grown <= 16 * 1024); /* nothing of the 512 MiB ring was touched */
    CHECK(took <= 2.0);
    pm_device_free(dev);
    free(src);
    free(dst);
}

/* The pinned budget bounds the ring as the limit does. */
static void budget_bounds_it(void)
{
    REQUIRE_RESULT(pm_init(0), PM_SUCCESS);
    pm_copy_stats st = stats();
    REQUIRE_RESULT(pm_set_pinned_budget(st.pinned_bytes + 4 * MIB), PM_SUCCESS);
    st = stats();
    CHECK(st.ring_buffers >= 1 && st.ring_buffers * st.ring_buffer_bytes <= 1 * MIB);
    CHECK(strstr(st.ring_note, "pinned budget") != NULL);
    round_trip(8 * MIB, 3);
    pm_copy_stats after = stats();
    CHECK(after.ring_pinned == 1);
    CHECK(after.staged_bytes - st.staged_bytes == 16 * MIB);
    /* No room beside what is pinned but the ring: the ring stays; a new one
     * (a new shape) finds no room, and copies go on. */
    REQUIRE_RESULT(pm_set_pinned_budget(after.pinned_bytes + 4096 - /* + 4096: not 0, none */
                                        after.ring_buffers * after.ring_buffer_bytes),
                   PM_SUCCESS);
    round_trip(8 * MIB, 5);
    CHECK(stats().ring_pinned == 1);
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.buffers = c.buffers + 1;
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    round_trip(8 * MIB, 4);
    after = stats();
    CHECK(after.ring_pinned == 0 && strstr(after.ring_note, "pinned budget") != NULL);
}

/* However large the settings, a ring pins at most 2 GiB (checked on the
 * plan: nothing is pinned). */
static void at_most_2_gib(void)
{
    REQUIRE_RESULT(pm_init(0), PM_SUCCESS);
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.chunk_bytes = 256 * MIB;
    c.buffers = 1024;
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    pm_copy_stats st = stats();
    CHECK(st.ring_pinned == 0);
    CHECK(st.ring_buffers * st.ring_buffer_bytes <= 2048 * MIB);
    CHECK(st.ring_note[0] != '\0');
}

static void in_child(void (*body)(void), const char *name)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = 0;
        body();
        fflush(stdout);
        fflush(stderr);
        _exit(check_failures ? 1 : 0);
    }
    int status = 0;
    REQUIRE(pid > 0 && waitpid(pid, &status, 0) == pid);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok)
        fprintf(stderr, "%s failed\n", name);
    CHECK(ok);
}

int main(void)
{
    in_child(shrinks_under_the_limit, "shrinks_under_the_limit");
    in_child(none_fits, "none_fits");
    in_child(budget_bounds_it, "budget_bounds_it");
    in_child(at_most_2_gib, "at_most_2_gib");
    return check_finish("test_ring_limits");
}
