/* Pool chunks in the driver's virtual memory management: address space from
 * cuMemAddressReserve, host memory in granules from cuMemCreate with a HOST
 * (or HOST_NUMA) location, each mapped into it and readable and writable by
 * the CPU and every device. A granule is its own allocation, so one can be
 * unmapped (which frees it: its handle is released once mapped) without
 * touching its neighbours and without waiting for device work, unlike
 * cuMemHostUnregister. Copies that cross granules work, and the driver's
 * host-memory queries answer for this memory. */
#include "cuda_vmm.h"

#include <string.h>

#include "../errors.h"

enum { max_access = 65 }; /* 64 devices and the host */

/* Set once by pm__cuda_vmm_open, when the backend opens; read-only after. */
static const pm__cuda_api *cu;
static size_t granule;
static CUmemAccessDesc access[max_access];
static size_t n_access;

static bool have_symbols(const pm__cuda_api *api)
{
    return api->mem_address_reserve && api->mem_address_free && api->mem_create &&
           api->mem_release && api->mem_map && api->mem_unmap && api->mem_set_access &&
           api->mem_get_allocation_granularity;
}

static CUmemAllocationProp host_prop(int numa_node)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = numa_node >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
    prop.location.id = numa_node >= 0 ? numa_node : 0;
    return prop;
}

size_t pm__cuda_vmm_open(const pm__cuda_api *api)
{
    int devices = 0;
    if (!have_symbols(api) || api->device_get_count(&devices) != CUDA_SUCCESS || devices < 1 ||
        devices >= max_access)
        return 0;
    CUmemAllocationProp prop = host_prop(-1);
    size_t g = 0;
    if (api->mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
            CUDA_SUCCESS ||
        g == 0 || (g & (g - 1)) != 0 || g > ((size_t)32 << 20))
        return 0;
    for (int d = 0; d < devices; d++) {
        access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[d].location.id = d;
        access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    access[devices].location.type = CU_MEM_LOCATION_TYPE_HOST;
    access[devices].location.id = 0;
    access[devices].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    n_access = (size_t)devices + 1;
    cu = api;
    granule = g;
    return g;
}

pm_result pm__cuda_vmm_reserve(size_t len, size_t align, void **base)
{
    CUdeviceptr va = 0;
    CUresult rc = cu->mem_address_reserve(&va, len, align, 0, 0);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuMemAddressReserve");
    *base = (void *)(uintptr_t)va;
    return PM_SUCCESS;
}

static void unmap_granules(CUdeviceptr va, size_t len)
{
    for (size_t off = 0; off < len; off += granule)
        cu->mem_unmap(va + off, granule);
}

pm_result pm__cuda_vmm_commit(void *p, size_t len, int numa_node)
{
    CUmemAllocationProp prop = host_prop(numa_node);
    CUdeviceptr va = (CUdeviceptr)(uintptr_t)p;
    size_t mapped = 0;
    CUresult rc = CUDA_SUCCESS;
    const char *call = "cuMemCreate";
    while (mapped < len) {
        CUmemGenericAllocationHandle h;
        rc = cu->mem_create(&h, granule, &prop, 0);
        if (rc != CUDA_SUCCESS)
            break;
        rc = cu->mem_map(va + mapped, granule, 0, h, 0);
        cu->mem_release(h); /* the mapping holds it from here on */
        if (rc != CUDA_SUCCESS) {
            call = "cuMemMap";
            break;
        }
        mapped += granule;
    }
    if (rc == CUDA_SUCCESS) {
        call = "cuMemSetAccess";
        rc = cu->mem_set_access(va, len, access, n_access);
    }
    if (rc != CUDA_SUCCESS) {
        unmap_granules(va, mapped);
        return pm__cuda_fail(rc, call);
    }
    return PM_SUCCESS;
}

void pm__cuda_vmm_decommit(void *p, size_t len) { unmap_granules((CUdeviceptr)(uintptr_t)p, len); }

void pm__cuda_vmm_unreserve(void *base, size_t len)
{
    cu->mem_address_free((CUdeviceptr)(uintptr_t)base, len);
}
