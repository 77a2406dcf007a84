/* Helpers shared by the pool tests. */
#ifndef PINMEM_TEST_POOL_UTIL_H
#define PINMEM_TEST_POOL_UTIL_H

#include <stdint.h>

#include "check.h"

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

#endif
