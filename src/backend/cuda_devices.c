/* The driver's devices: names and capabilities from the driver, nearest NUMA
 * node from the driver where it knows it (HOST_NUMA_ID, CUDA 12.2 and
 * later) and from sysfs otherwise, the PCIe link from sysfs. None of these
 * calls needs a context. */
#include "cuda_devices.h"

#include <stdio.h>
#include <string.h>

#include "../errors.h"
#include "backend.h"

/* Set once by pm__cuda_devices_open; read-only after. */
static const pm__cuda_api *cu;
static int device_in_use;

void pm__cuda_devices_open(const pm__cuda_api *api, int in_use)
{
    cu = api;
    device_in_use = in_use;
}

static int attribute(CUdevice dev, CUdevice_attribute a, int fallback)
{
    int v = 0;
    return cu->device_get_attribute(&v, a, dev) == CUDA_SUCCESS ? v : fallback;
}

pm_result pm__cuda_device_info(int ordinal, pm_device_info *info)
{
    CUdevice dev;
    CUresult rc = cu->device_get(&dev, ordinal);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuDeviceGet");
    size_t keep = info->struct_size;
    memset(info, 0, sizeof *info);
    info->struct_size = keep;
    info->ordinal = ordinal;
    info->in_use = ordinal == device_in_use;
    if (cu->device_get_name(info->name, (int)sizeof info->name, dev) != CUDA_SUCCESS)
        snprintf(info->name, sizeof info->name, "unknown");
    char bus_id[64] = "";
    if (!cu->device_get_pci_bus_id ||
        cu->device_get_pci_bus_id(bus_id, (int)sizeof bus_id, dev) != CUDA_SUCCESS ||
        !pm__pci_bus_id_normalize(bus_id, info->pci_bus_id, sizeof info->pci_bus_id))
        info->pci_bus_id[0] = '\0';
    /* The driver answers -1 where the system has no NUMA; sysfs may still
     * know the node (and answers -1 itself when it does not). */
    int node = attribute(dev, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
    if (node < 0 && info->pci_bus_id[0])
        node = pm__pci_numa_node(info->pci_bus_id);
    info->host_numa_node = node >= 0 ? node : -1;
    if (info->pci_bus_id[0])
        pm__pci_link(info->pci_bus_id, &info->pcie_generation, &info->pcie_width);
    info->can_map_host_memory = attribute(dev, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0);
    info->unified_addressing = attribute(dev, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0);
    info->can_use_host_pointer_for_registered_mem =
        attribute(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0);
    info->read_only_host_register_supported =
        attribute(dev, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    info->pageable_memory_access_uses_host_page_tables =
        attribute(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
    return PM_SUCCESS;
}
