/* The buffers the copy benchmarks share: pageable, page-locked and device
 * memory of the same size, filled so that every page is touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

/* The page-locked buffer, as large as max or else the largest half of it that
 * can be pinned: an ordinary user's RLIMIT_MEMLOCK may hold far less than the
 * largest row, and the rows above what it holds are left out, not failed. */
static pm_result pin_largest(copy_buffers *cb, const char *who)
{
    const size_t wanted = cb->max, least = (size_t)1 << 20;
    pm_result r;
    while ((r = pm_mem_alloc_host((void **)&cb->pinned, cb->max)) == PM_ERROR_OUT_OF_MEMORY &&
           cb->max / 2 >= least)
        cb->max /= 2;
    if (r == PM_SUCCESS && cb->max < wanted && cb->max / 2 >= least) {
        /* Half of what the limit holds, so that the staging ring fits beside it. */
        pm_mem_free_host(cb->pinned);
        cb->max /= 2;
        r = pm_mem_alloc_host((void **)&cb->pinned, cb->max);
    }
    if (r == PM_SUCCESS && cb->max < wanted) {
        char got[32], want[32];
        printf("(%s: page-locked memory for %s, not %s, under the limit: rows above it are "
               "left out)\n",
               who, human_size(cb->max, got, sizeof got), human_size(wanted, want, sizeof want));
    }
    return r;
}

bool copy_buffers_open(copy_buffers *cb, const char *who, bool quick)
{
    *cb = (copy_buffers){.max = quick ? (size_t)64 << 20 : (size_t)1 << 30};
    cb->bl = baseline_open(who);
    if (!cb->bl)
        return false;
    pm_result pinned = pin_largest(cb, who);
    cb->pageable = malloc(cb->max);
    if (!cb->pageable || pinned != PM_SUCCESS || pm_device_alloc(&cb->dev, cb->max) != PM_SUCCESS) {
        printf("%s: setup failed: %s\n", who,
               cb->pageable ? pm_last_error_detail() : "malloc failed");
        copy_buffers_close(cb);
        return false;
    }
    memset(cb->pageable, 1, cb->max);
    memset(cb->pinned, 2, cb->max);
    return true;
}

void copy_buffers_close(copy_buffers *cb)
{
    if (cb->dev)
        pm_device_free(cb->dev);
    if (cb->pinned)
        pm_mem_free_host(cb->pinned);
    free(cb->pageable);
    *cb = (copy_buffers){0};
}
