/* Helpers shared by the copy tests: device memory (on the POSIX backend,
 * ordinary memory), byte patterns, what a case holds released however it
 * ends, and steps that pin memory an ordinary user's RLIMIT_MEMLOCK may not
 * hold. */
#ifndef PINMEM_TEST_COPY_UTIL_H
#define PINMEM_TEST_COPY_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>

#include "check.h"
#include "instance.h"

static inline const pm__backend *test_backend(void)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    return inst ? &inst->backend : NULL;
}

/* Device memory, or 0 (a failed check) when there is none. */
static inline pm_deviceptr device_alloc(size_t bytes)
{
    pm_deviceptr d = 0;
    CHECK_RESULT(pm_device_alloc(&d, bytes), PM_SUCCESS);
    return d;
}

static inline void device_free(pm_deviceptr d)
{
    if (d)
        pm_device_free(d);
}

/* Variables released when their scope ends, on every path out of a case
 * (REQUIRE and SKIP_CASE return early). */
static inline void release_malloc_(void *p) { free(*(void **)p); }
static inline void release_device_(pm_deviceptr *d) { device_free(*d); }
static inline void release_host_(void *p)
{
    if (*(void **)p)
        pm_mem_free_host(*(void **)p);
}
static inline void release_stream_(pm_stream_t *s)
{
    if (*s)
        pm_stream_destroy(*s);
}
#define SCOPED_MALLOC __attribute__((cleanup(release_malloc_)))
#define SCOPED_DEVICE __attribute__((cleanup(release_device_)))
#define SCOPED_HOST __attribute__((cleanup(release_host_)))
#define SCOPED_STREAM __attribute__((cleanup(release_stream_)))

/* Whether RLIMIT_MEMLOCK binds this process: a finite limit, and no
 * CAP_IPC_LOCK to lift it. */
static inline bool memlock_binds(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return false;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long caps = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &caps) == 1)
            break;
    if (f)
        fclose(f);
    return !((caps >> 14) & 1);
}

/* A step that pins memory: the case goes on when it succeeded; it is
 * skipped, saying why, when it ran out of memory where RLIMIT_MEMLOCK binds
 * (an ordinary user's limit may not hold what the case pins); any other
 * outcome fails the case. */
#define REQUIRE_PINNED(call, what)                                                           \
    do {                                                                                     \
        pm_result pinned_r_ = (call);                                                        \
        if (pinned_r_ == PM_ERROR_OUT_OF_MEMORY && memlock_binds()) {                        \
            printf("skipped: %s: pinning %s needs more than RLIMIT_MEMLOCK leaves (%s)\n",  \
                   __func__, what, pm_last_error_detail());                                  \
            return;                                                                          \
        }                                                                                    \
        if (pinned_r_ != PM_SUCCESS) {                                                       \
            if (check_failed_())                                                             \
                fprintf(stderr, "%s:%d: %s gave %s (%s)\n", __FILE__, __LINE__, #call,       \
                        pm_result_name(pinned_r_), pm_last_error_detail());                  \
            return;                                                                          \
        }                                                                                    \
    } while (0)

/* A byte that depends on position and seed, so shifted or stale data shows. */
static inline uint8_t pattern_byte(size_t i, unsigned seed)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)seed * 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(x >> 56);
}

/* The pattern's bytes [i, i + 8), in memory order. Fill and compare move
 * eight bytes at a time: byte by byte, ThreadSanitizer's check of every access
 * made the 64 MiB cases take minutes. */
static inline uint64_t pattern_word(size_t i, unsigned seed)
{
    uint64_t word = 0;
    for (size_t k = 0; k < 8; k++)
        word |= (uint64_t)pattern_byte(i + k, seed) << (8 * k);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    word = __builtin_bswap64(word);
#endif
    return word;
}

static inline void fill(uint8_t *p, size_t n, unsigned seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word = pattern_word(i, seed);
        memcpy(p + i, &word, 8);
    }
    for (; i < n; i++)
        p[i] = pattern_byte(i, seed);
}

/* Index of the first byte that differs from the pattern, or n. */
static inline size_t first_mismatch(const uint8_t *p, size_t n, unsigned seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        if (word != pattern_word(i, seed))
            break;
    }
    for (; i < n; i++)
        if (p[i] != pattern_byte(i, seed))
            return i;
    return n;
}

/* Small pieces, so that every path (several chunks, several workers, the
 * driver's own path, the cache) runs on small buffers. */
static inline void small_copy_config(int registration_cache)
{
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.workers = 3;
    c.htod_workers = 2; /* one worker serves device-to-host copies only */
    c.chunk_bytes = 64 << 10;
    c.slice_bytes = 16 << 10; /* four threads fill a buffer */
    c.buffers = 6;
    c.direct_max = c.dtoh_direct_max = 4 << 10;
    c.registration_cache = registration_cache;
    c.cache_min_bytes = 1 << 20;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

#endif
