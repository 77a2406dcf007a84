/* One rule for the public structs that carry their size (pm_capabilities,
 * pm_pool_stats, pm_copy_config, pm_copy_stats, pm_setting): struct_size may
 * name this version of the struct or an older, smaller one, which is read or
 * filled as far as it goes; a larger one (a header newer than the library)
 * is refused with PM_ERROR_INVALID_VALUE, as is one too small to hold
 * struct_size. */
#ifndef PINMEM_VERSIONED_H
#define PINMEM_VERSIONED_H

#include <stddef.h>

#include "errors.h"

static inline pm_result pm__struct_size_check(const char *call, const void *s, size_t given,
                                              size_t ours)
{
    if (s && given >= sizeof(size_t) && given <= ours)
        return PM_SUCCESS;
    if (!s)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: the struct pointer is NULL", call);
    return pm__fail(PM_ERROR_INVALID_VALUE,
                    "%s: struct_size is %zu; it must be this library's sizeof (%zu) or an "
                    "older, smaller version's (at least %zu)",
                    call, given, ours, sizeof(size_t));
}

/* PM__STRUCT_SIZE_CHECK("pm_copy_get_stats", stats) */
#define PM__STRUCT_SIZE_CHECK(call, s) \
    pm__struct_size_check(call, (s), (s) ? (s)->struct_size : 0, sizeof *(s))

#endif
