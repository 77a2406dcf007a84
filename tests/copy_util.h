/* Helpers shared by the copy tests: device memory (on the POSIX backend,
 * ordinary memory) and byte patterns. */
#ifndef PINMEM_TEST_COPY_UTIL_H
#define PINMEM_TEST_COPY_UTIL_H

#include <stdint.h>

#include "check.h"
#include "instance.h"

static inline const pm__backend *test_backend(void)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    return inst ? &inst->backend : NULL;
}

static inline pm_deviceptr device_alloc(size_t bytes)
{
    pm_deviceptr d = 0;
    CHECK_RESULT(test_backend()->device_alloc(&d, bytes), PM_SUCCESS);
    return d;
}

static inline void device_free(pm_deviceptr d) { pm_device_free(d); }

/* A byte that depends on position and seed, so shifted or stale data shows. */
static inline uint8_t pattern_byte(size_t i, unsigned seed)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)seed * 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(x >> 56);
}

static inline void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern_byte(i, seed);
}

/* Index of the first byte that differs from the pattern, or n. */
static inline size_t first_mismatch(const uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
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
    c.direct_max = 4 << 10;
    c.registration_cache = registration_cache;
    c.cache_min_bytes = 1 << 20;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

#endif
