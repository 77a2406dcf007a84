/* What host-memory calls answer once the context holds a sticky error (a
 * kernel stored to an address no allocation covers): the driver's calls
 * beside pinmem's, each on memory made before the fault and on fresh
 * memory, including allocations from pools that kept their memory. The
 * faulting kernel is PTX, compiled by the driver, so no nvcc is needed.
 * gcc -O2 -Ibench/probe -Iinclude -I/usr/local/cuda/include
 *     bench/probe/sticky_error.c -lpinmem -lcuda
 * ./probe_sticky_error */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pinmem.h"
#include "probe.h"
#include "fault_ptx.h"

enum { BYTES = 1 << 20 };

static void driver_row(const char *call, CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    printf("%-44s %s\n", call, n);
}

static void pinmem_row(const char *call, pm_result r)
{
    printf("%-44s %s\n", call, pm_result_name(r));
}

static CUresult fault(void)
{
    CUmodule module;
    CUfunction fn;
    TRY(cuModuleLoadData(&module, fault_ptx));
    TRY(cuModuleGetFunction(&fn, module, "store_one"));
    CUdeviceptr where = 8;
    void *params[] = {&where};
    TRY(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    return cuCtxSynchronize();
}

int main(void)
{
    probe_context();
    /* Before the fault: memory of each kind, and pools that hold memory. */
    void *drv_alloc, *pm_alloc, *spare_pm;
    TRY(cuMemHostAlloc(&drv_alloc, BYTES, 0));
    if (pm_mem_host_alloc(&pm_alloc, BYTES, 0) != PM_SUCCESS ||
        pm_mem_host_alloc(&spare_pm, BYTES, 0) != PM_SUCCESS) {
        printf("pm_mem_host_alloc: %s\n", pm_last_error_detail());
        return 1;
    }
    char *pageable = aligned_alloc(4096, 4 * BYTES);
    memset(pageable, 1, 4 * BYTES);
    TRY(cuMemHostRegister(pageable, BYTES, 0));
    if (pm_mem_host_register(pageable + BYTES, BYTES, 0) != PM_SUCCESS) {
        printf("pm_mem_host_register: %s\n", pm_last_error_detail());
        return 1;
    }
    CUmemoryPool drv_pool;
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_HOST}};
    TRY(cuMemPoolCreate(&drv_pool, &props));
    cuuint64_t keep = UINT64_MAX;
    TRY(cuMemPoolSetAttribute(drv_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUdeviceptr block;
    TRY(cuMemAllocFromPoolAsync(&block, BYTES, drv_pool, NULL));
    TRY(cuMemFreeAsync(block, NULL));
    TRY(cuCtxSynchronize());
    pm_mem_pool_t pm_pool;
    void *pm_block;
    if (pm_mem_get_default_pool(&pm_pool) != PM_SUCCESS ||
        pm_mem_alloc_from_pool(&pm_block, BYTES, pm_pool) != PM_SUCCESS ||
        pm_mem_free(pm_block) != PM_SUCCESS) {
        printf("default pool: %s\n", pm_last_error_detail());
        return 1;
    }
    CUdeviceptr dev;
    TRY(cuMemAlloc(&dev, BYTES));
    /* Events whose work was done before the fault. */
    CUevent drv_event;
    pm_event_t pm_event;
    TRY(cuEventCreate(&drv_event, CU_EVENT_DISABLE_TIMING));
    TRY(cuEventRecord(drv_event, NULL));
    if (pm_event_create(&pm_event) != PM_SUCCESS || pm_event_record(pm_event, NULL) != PM_SUCCESS) {
        printf("pm_event_record: %s\n", pm_last_error_detail());
        return 1;
    }
    TRY(cuCtxSynchronize());

    driver_row("the faulting kernel (cuCtxSynchronize)", fault());
    driver_row("cuCtxSynchronize again", cuCtxSynchronize());

    void *p = NULL;
    unsigned flags = 0;
    driver_row("cuMemHostAlloc", cuMemHostAlloc(&p, BYTES, 0));
    driver_row("cuMemHostRegister", cuMemHostRegister(pageable + 2 * BYTES, BYTES, 0));
    driver_row("cuMemHostGetFlags (made before)", cuMemHostGetFlags(&flags, drv_alloc));
    driver_row("cuMemAllocFromPoolAsync (pool kept memory)",
               cuMemAllocFromPoolAsync(&block, BYTES, drv_pool, NULL));
    driver_row("cuMemcpyHtoD pageable", cuMemcpyHtoD(dev, pageable + 3 * BYTES, 4096));
    driver_row("cuMemFreeHost (made before)", cuMemFreeHost(drv_alloc));
    driver_row("cuMemHostUnregister (made before)", cuMemHostUnregister(pageable));
    driver_row("cuEventQuery (done before)", cuEventQuery(drv_event));
    driver_row("cuEventSynchronize (done before)", cuEventSynchronize(drv_event));

    pinmem_row("pm_mem_host_alloc", pm_mem_host_alloc(&p, BYTES, 0));
    pinmem_row("pm_mem_host_register",
               pm_mem_host_register(pageable + 3 * BYTES, BYTES, 0));
    pinmem_row("pm_mem_host_get_flags (made before)", pm_mem_host_get_flags(&flags, pm_alloc));
    pinmem_row("pm_mem_alloc_from_pool (pool kept memory)",
               pm_mem_alloc_from_pool(&pm_block, BYTES, pm_pool));
    pinmem_row("pm_memcpy_htod pageable", pm_memcpy_htod(dev, pageable + 3 * BYTES, 4096));
    pinmem_row("pm_memcpy host to host",
               pm_memcpy((pm_deviceptr)(uintptr_t)spare_pm, (pm_deviceptr)(uintptr_t)pm_alloc,
                         4096));
    pinmem_row("pm_mem_free_host (made before)", pm_mem_free_host(pm_alloc));
    pinmem_row("pm_mem_host_unregister (made before)",
               pm_mem_host_unregister(pageable + BYTES));
    pinmem_row("pm_event_query (done before)", pm_event_query(pm_event));
    pinmem_row("pm_event_synchronize (done before)", pm_event_synchronize(pm_event));
    return 0;
}
