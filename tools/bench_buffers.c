/* The buffers the copy benchmarks share: pageable, page-locked and device
 * memory of the same size, filled so that every page is touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

bool copy_buffers_open(copy_buffers *cb, const char *who, bool quick)
{
    *cb = (copy_buffers){.max = quick ? (size_t)64 << 20 : (size_t)1 << 30};
    cb->bl = baseline_open(who);
    if (!cb->bl)
        return false;
    cb->pageable = malloc(cb->max);
    if (!cb->pageable || pm_mem_alloc_host((void **)&cb->pinned, cb->max) != PM_SUCCESS ||
        pm_device_alloc(&cb->dev, cb->max) != PM_SUCCESS) {
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
