/* The devices the backend sees: pm_device_count and pm_device_get_info. */
#include <string.h>

#include "errors.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "versioned.h"

pm_result pm_device_count(int *count)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_device_count");
    PM__INSTANCE_OR_RETURN(inst);
    if (!count)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_device_count: count is NULL");
    *count = inst->backend.device_count;
    return PM_SUCCESS;
}

pm_result pm_device_get_info(int ordinal, pm_device_info *info)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_device_get_info");
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_device_get_info", info);
    if (r != PM_SUCCESS)
        return r;
    const pm__backend *b = &inst->backend;
    if (ordinal < 0 || ordinal >= b->device_count)
        return pm__fail(PM_ERROR_INVALID_DEVICE,
                        "pm_device_get_info: %d is not a device ordinal: the %s backend has %d "
                        "device%s (ordinals 0 to %d)",
                        ordinal, b->name, b->device_count, b->device_count == 1 ? "" : "s",
                        b->device_count - 1);
    pm_device_info full;
    full.struct_size = sizeof full;
    r = b->device_info(ordinal, &full);
    if (r != PM_SUCCESS)
        return r;
    full.struct_size = info->struct_size;
    memcpy(info, &full, info->struct_size);
    return PM_SUCCESS;
}
