/* pm_memcpy / pm_memcpy_async (cuMemcpy, cuMemcpyAsync): the direction from
 * the pointers. Host memory on one side and device memory on the other goes
 * through the copy engine (copy.c), which cuts the host side into
 * page-locked and pageable pieces; everything else is the backend's own
 * copy, as the driver does it. pm_device_alloc / pm_device_free give the
 * device memory both backends recognise. */
#include <stdint.h>
#include <stdio.h>

#include "../errors.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "copy.h"

pm_result pm_device_alloc(pm_deviceptr *dptr, size_t bytes)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_device_alloc");
    PM__INSTANCE_OR_RETURN(inst);
    if (!dptr)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_device_alloc: dptr is NULL");
    if (bytes == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_device_alloc: bytes is 0");
    return inst->backend.device_alloc(dptr, bytes);
}

pm_result pm_device_alloc_on(pm_deviceptr *dptr, size_t bytes, int ordinal)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_device_alloc_on");
    PM__INSTANCE_OR_RETURN(inst);
    const pm__backend *b = &inst->backend;
    if (!dptr)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_device_alloc_on: dptr is NULL");
    if (bytes == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_device_alloc_on: bytes is 0");
    if (ordinal < 0 || ordinal >= b->device_count)
        return pm__fail(PM_ERROR_INVALID_DEVICE,
                        "pm_device_alloc_on: %d is not a device ordinal: the %s backend has %d "
                        "device%s",
                        ordinal, b->name, b->device_count, b->device_count == 1 ? "" : "s");
    return b->device_alloc_on(dptr, bytes, ordinal);
}

pm_result pm_device_free(pm_deviceptr dptr)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_device_free");
    PM__INSTANCE_OR_RETURN(inst);
    if (dptr == 0)
        return PM_SUCCESS;
    if (inst->backend.free_wait)
        inst->backend.free_wait();
    return inst->backend.device_release(dptr);
}

/* Memory pinmem pinned is host memory for the engine, whatever the
 * backend's pointer_kind would call it (the driver may call some pool
 * memory device memory), and so is memory pinned only by the registration
 * cache (pm__regcache_kind). */
static pm_result kind_of(pm__instance *inst, pm_deviceptr p, size_t bytes, pm__memory_kind *kind)
{
    pm__range r;
    if (pm__ranges_find_extent(inst->ranges, (uintptr_t)p, &r)) {
        *kind = PM__MEMORY_HOST;
        return PM_SUCCESS;
    }
    pm_result res = inst->backend.pointer_kind(p, bytes, kind);
    if (res == PM_SUCCESS)
        *kind = pm__regcache_kind((const void *)(uintptr_t)p, bytes, *kind);
    return res;
}

static pm_result copy_any_direction(const char *name, pm_deviceptr dst, pm_deviceptr src,
                                    size_t bytes, pm_stream_t s, bool sync)
{
    PM__INSTANCE_OR_RETURN(inst);
    if (bytes == 0)
        return PM_SUCCESS;
    if (!dst || !src)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: the %s pointer is NULL", name,
                        dst ? "source" : "destination");
    if (bytes > UINT64_MAX - dst || bytes > UINT64_MAX - src || bytes > UINTPTR_MAX)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %zu bytes from 0x%llx or 0x%llx wrap around",
                        name, bytes, dst, src);
    /* memcpy's rule: the driver gives no defined result for overlap, so it is refused. */
    if (dst < src + bytes && src < dst + bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "%s: the ranges overlap (destination 0x%llx, source 0x%llx, %zu bytes)",
                        name, dst, src, bytes);
    const pm__backend *b = &inst->backend;
    pm_result r = b->stream_check(s);
    if (r != PM_SUCCESS)
        return r;
    bool capturing = false;
    if ((r = b->stream_capture_status(s, &capturing)) != PM_SUCCESS)
        return r;
    pm__memory_kind to, from;
    if ((r = kind_of(inst, dst, bytes, &to)) != PM_SUCCESS ||
        (r = kind_of(inst, src, bytes, &from)) != PM_SUCCESS) {
        char why[512];
        snprintf(why, sizeof why, "%s", pm_last_error_detail());
        return pm__fail_driver(r, pm_last_driver_error(), "%s: %s", name, why);
    }
    /* A capture takes page-locked host memory only (copy.c says why), and
     * says so before anything is captured. */
    if (capturing && ((to == PM__MEMORY_HOST &&
                       (r = pm__copy_capturable(inst, name, dst, bytes)) != PM_SUCCESS) ||
                      (from == PM__MEMORY_HOST &&
                       (r = pm__copy_capturable(inst, name, src, bytes)) != PM_SUCCESS)))
        return r;
    const pm__capture capture = capturing ? PM__CAPTURE_ACTIVE : PM__CAPTURE_NONE;
    uint8_t *dst_host = (uint8_t *)(uintptr_t)dst, *src_host = (uint8_t *)(uintptr_t)src;
    if (to == PM__MEMORY_DEVICE && from == PM__MEMORY_HOST)
        return pm__copy(name, PM__HTOD, src_host, dst, bytes, s, sync, capture);
    if (to == PM__MEMORY_HOST && from == PM__MEMORY_DEVICE)
        return pm__copy(name, PM__DTOH, dst_host, src, bytes, s, sync, capture);
    if (to == PM__MEMORY_HOST && (r = pm__copy_writable(inst, name, "destination",
                                                        (uintptr_t)dst, bytes)) != PM_SUCCESS)
        return r;
    return b->copy_any(dst, src, bytes, s, sync,
                       to == PM__MEMORY_DEVICE && from == PM__MEMORY_DEVICE);
}

pm_result pm_memcpy(pm_deviceptr dst, pm_deviceptr src, size_t bytes)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy");
    return copy_any_direction("pm_memcpy", dst, src, bytes, NULL, true);
}

pm_result pm_memcpy_async(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_async");
    return copy_any_direction("pm_memcpy_async", dst, src, bytes, stream, false);
}
