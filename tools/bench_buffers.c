/* The buffers the copy benchmarks share: pageable, page-locked and device
 * memory of the same size, filled so that every page is touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "instance.h"

bool copy_buffers_open(copy_buffers *cb, const char *who, bool quick)
{
    *cb = (copy_buffers){.max = quick ? (size_t)64 << 20 : (size_t)1 << 30};
    pm_result r = PM_SUCCESS;
    pm__instance *inst = pm__instance_get(&r);
    if (!inst) {
        printf("%s: no backend: %s\n", who, pm_last_error_detail());
        return false;
    }
    cb->b = &inst->backend;
    cb->pageable = malloc(cb->max);
    if (!cb->pageable || pm_mem_alloc_host((void **)&cb->pinned, cb->max) != PM_SUCCESS ||
        cb->b->device_alloc(&cb->dev, cb->max) != PM_SUCCESS) {
        printf("%s: setup failed: %s\n", who, pm_last_error_detail());
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
        cb->b->device_free(cb->dev);
    if (cb->pinned)
        pm_mem_free_host(cb->pinned);
    free(cb->pageable);
    *cb = (copy_buffers){0};
}
