/* Every CUDA device the driver lists, as pm_device_get_info reports it. */
#ifndef PINMEM_CUDA_DEVICES_H
#define PINMEM_CUDA_DEVICES_H

#include "cuda_loader.h"

/* Called once, when the backend opens, before any other call here. */
void pm__cuda_devices_open(const pm__cuda_api *api, int in_use);
/* Fills *info for ordinal (below the driver's device count) with the
 * driver's answers and sysfs's; struct_size is left as it is. */
pm_result pm__cuda_device_info(int ordinal, pm_device_info *info);

#endif
