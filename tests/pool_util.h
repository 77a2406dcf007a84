/* Helpers shared by the pool tests. */
#ifndef PINMEM_TEST_POOL_UTIL_H
#define PINMEM_TEST_POOL_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "instance.h"

/* A pool, or NULL (the failure counted): callers REQUIRE it. */
static inline pm_mem_pool_t make_pool(size_t max_size)
{
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}, .max_size = max_size};
    pm_mem_pool_t pool = NULL;
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    return pool;
}

static inline uint64_t pool_attr(pm_mem_pool_t pool, pm_mem_pool_attribute attr)
{
    uint64_t v = 0;
    CHECK_RESULT(pm_mem_pool_get_attribute(pool, attr, &v), PM_SUCCESS);
    return v;
}

/* Bytes this process may still pin: SIZE_MAX unless a limit binds (an
 * ordinary user's RLIMIT_MEMLOCK on POSIX). */
static inline size_t pinnable(void)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    return inst ? inst->backend.pinnable_bytes() : SIZE_MAX;
}

/* Ends the current case as skipped when less than bytes may still be pinned
 * here: cases that check whole chunks or fill large pools ask for twice
 * what they pin, so that the pools size themselves as without a limit. */
#define NEED_PINNABLE(bytes)                                                              \
    do {                                                                                  \
        size_t need_ = (bytes), have_ = pinnable();                                       \
        if (have_ < need_) {                                                              \
            char why_[160];                                                               \
            snprintf(why_, sizeof why_, "needs %zu MiB of pinnable memory, %zu MiB left", \
                     need_ >> 20, have_ >> 20);                                           \
            SKIP_CASE(why_);                                                              \
        }                                                                                 \
    } while (0)

/* Whether p is among the next 64 blocks of size the pool hands out (on s
 * where async); they are freed again. */
static inline bool among(void *p, size_t size, pm_mem_pool_t pool, bool async, pm_stream_t s)
{
    void *got[64];
    bool found = false;
    int n = 0;
    for (; n < 64; n++) {
        pm_result r = async ? pm_mem_alloc_from_pool_async(&got[n], size, pool, s)
                            : pm_mem_alloc_from_pool(&got[n], size, pool);
        CHECK_RESULT(r, PM_SUCCESS);
        if (r != PM_SUCCESS)
            break;
        found |= got[n] == p;
    }
    for (int i = 0; i < n; i++)
        CHECK_RESULT(pm_mem_free(got[i]), PM_SUCCESS);
    return found;
}

#endif
