#include "cuda_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "../errors.h"
#include "backend.h"

/* cuGetProcAddress (driver 12.0+) is the only symbol taken with dlsym. */
typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult *);

enum { minimum_driver_version = 12000 };

typedef struct symbol {
    const char *name;
    int abi_version; /* the CUDA version whose ABI the pointer type matches */
    size_t offset;
} symbol;

#define SYM(member, name, version) {name, version, offsetof(pm__cuda_api, member)}
static const symbol required[] = {
    SYM(init, "cuInit", 2000),
    SYM(driver_get_version, "cuDriverGetVersion", 2020),
    SYM(get_error_name, "cuGetErrorName", 6000),
    SYM(device_get_count, "cuDeviceGetCount", 2000),
    SYM(device_get, "cuDeviceGet", 2000),
    SYM(device_get_name, "cuDeviceGetName", 2000),
    SYM(device_get_attribute, "cuDeviceGetAttribute", 2000),
    SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain", 7000),
    SYM(primary_ctx_release, "cuDevicePrimaryCtxRelease", 11000),
    SYM(ctx_get_current, "cuCtxGetCurrent", 4000),
    SYM(ctx_push, "cuCtxPushCurrent", 4000),
    SYM(ctx_pop, "cuCtxPopCurrent", 4000),
    SYM(ctx_synchronize, "cuCtxSynchronize", 2000),
    SYM(mem_alloc_host, "cuMemAllocHost", 3020),
    SYM(mem_host_alloc, "cuMemHostAlloc", 2020),
    SYM(mem_free_host, "cuMemFreeHost", 2000),
    SYM(mem_host_register, "cuMemHostRegister", 6050),
    SYM(mem_host_unregister, "cuMemHostUnregister", 4000),
    SYM(mem_host_get_flags, "cuMemHostGetFlags", 2030),
    SYM(mem_host_get_device_pointer, "cuMemHostGetDevicePointer", 3020),
    SYM(mem_get_address_range, "cuMemGetAddressRange", 3020),
    SYM(stream_create, "cuStreamCreate", 2000),
    SYM(stream_destroy, "cuStreamDestroy", 4000),
    SYM(stream_synchronize, "cuStreamSynchronize", 2000),
    SYM(stream_query, "cuStreamQuery", 2000),
    SYM(stream_wait_event, "cuStreamWaitEvent", 3020),
    SYM(stream_get_id, "cuStreamGetId", 12000),
    SYM(launch_host_func, "cuLaunchHostFunc", 10000),
    SYM(event_create, "cuEventCreate", 2000),
    SYM(event_record, "cuEventRecord", 2000),
    SYM(event_query, "cuEventQuery", 2000),
    SYM(event_destroy, "cuEventDestroy", 4000),
    SYM(mem_alloc, "cuMemAlloc", 3020),
    SYM(mem_free, "cuMemFree", 3020),
    SYM(memcpy_htod, "cuMemcpyHtoD", 3020),
    SYM(memcpy_dtoh, "cuMemcpyDtoH", 3020),
    SYM(memcpy_htod_async, "cuMemcpyHtoDAsync", 3020),
    SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync", 3020),
    SYM(event_synchronize, "cuEventSynchronize", 2000),
    SYM(memcpy_unified, "cuMemcpy", 4000),
    SYM(memcpy_unified_async, "cuMemcpyAsync", 4000),
    SYM(pointer_get_attributes, "cuPointerGetAttributes", 7000),
    SYM(stream_is_capturing, "cuStreamIsCapturing", 10000),
    SYM(thread_exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", 10010),
};

/* Left NULL when missing: the pools then pin whole chunks, batches of
 * copies take one driver call a copy and no kernel, and devices have no PCI
 * facts. */
static const symbol optional[] = {
    SYM(memcpy_batch_async, "cuMemcpyBatchAsync", 13000),
    SYM(memcpy_batch_async_12080, "cuMemcpyBatchAsync", 12080),
    SYM(mem_address_reserve, "cuMemAddressReserve", 10020),
    SYM(mem_address_free, "cuMemAddressFree", 10020),
    SYM(mem_create, "cuMemCreate", 10020),
    SYM(mem_release, "cuMemRelease", 10020),
    SYM(mem_map, "cuMemMap", 10020),
    SYM(mem_unmap, "cuMemUnmap", 10020),
    SYM(mem_set_access, "cuMemSetAccess", 10020),
    SYM(mem_get_allocation_granularity, "cuMemGetAllocationGranularity", 10020),
    SYM(device_get_pci_bus_id, "cuDeviceGetPCIBusId", 4010),
    SYM(module_load_data, "cuModuleLoadData", 2000),
    SYM(module_get_function, "cuModuleGetFunction", 2000),
    SYM(module_unload, "cuModuleUnload", 2000),
    SYM(launch_kernel, "cuLaunchKernel", 4000),
    SYM(stream_get_ctx, "cuStreamGetCtx", 9020),
    SYM(stream_write_value32, "cuStreamWriteValue32", 12000),
    SYM(stream_wait_value32, "cuStreamWaitValue32", 12000),
};
#undef SYM

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pm__cuda_api api;
static const pm__cuda_api *loaded;
static pm_result load_result = PM_ERROR_NO_DEVICE;
static char load_detail[256] = "the CUDA driver was not loaded";

/* Sets sym's member of api; CUDA_ERROR_NOT_FOUND (or the driver's error)
 * when the driver lacks it. */
static CUresult take(get_proc_address_fn get, const symbol *sym,
                     CUdriverProcAddressQueryResult *status)
{
    void *fn = NULL;
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = get(sym->name, &fn, sym->abi_version, CU_GET_PROC_ADDRESS_DEFAULT, status);
    if (rc == CUDA_SUCCESS && (!fn || *status != CU_GET_PROC_ADDRESS_SUCCESS))
        rc = CUDA_ERROR_NOT_FOUND;
    if (rc == CUDA_SUCCESS)
        *(void **)((char *)&api + sym->offset) = fn;
    return rc;
}

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_detail, sizeof load_detail, "no CUDA driver: %s", dlerror());
        return;
    }
    get_proc_address_fn get = (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get) {
        load_result = PM_ERROR_NOT_SUPPORTED;
        snprintf(load_detail, sizeof load_detail,
                 "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
        return; /* the library stays loaded: unloading a driver is never safe */
    }
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        CUdriverProcAddressQueryResult status;
        CUresult rc = take(get, &required[i], &status);
        if (rc != CUDA_SUCCESS) {
            load_result = PM_ERROR_NOT_SUPPORTED;
            snprintf(load_detail, sizeof load_detail,
                     "the CUDA driver lacks %s (ABI %d): error %d, status %d", required[i].name,
                     required[i].abi_version, (int)rc, (int)status);
            return;
        }
    }
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) {
        CUdriverProcAddressQueryResult status;
        take(get, &optional[i], &status);
    }
    int version = 0;
    CUresult rc = api.init(0);
    if (rc == CUDA_SUCCESS)
        rc = api.driver_get_version(&version);
    if (rc != CUDA_SUCCESS) {
        load_result = rc == CUDA_ERROR_STUB_LIBRARY ? PM_ERROR_STUB_LIBRARY : PM_ERROR_NO_DEVICE;
        snprintf(load_detail, sizeof load_detail, "cuInit failed with CUDA error %d", (int)rc);
        return;
    }
    if (version < minimum_driver_version) {
        load_result = PM_ERROR_NOT_SUPPORTED;
        snprintf(load_detail, sizeof load_detail, "CUDA driver %d is older than the %d needed",
                 version, minimum_driver_version);
        return;
    }
    load_result = PM_SUCCESS;
    loaded = &api;
}

bool pm__backend_cuda_in_host_func(void)
{
    /* Only the driver's own thread running host functions is refused
     * cuCtxGetCurrent; before cuInit every thread gets NOT_INITIALIZED. */
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib)
        return false;
    CUresult (*get_current)(CUcontext *) = (CUresult(*)(CUcontext *))dlsym(lib, "cuCtxGetCurrent");
    CUcontext current = NULL;
    bool refused = get_current && get_current(&current) == CUDA_ERROR_NOT_PERMITTED;
    dlclose(lib);
    return refused;
}

const pm__cuda_api *pm__cuda_api_load(pm_result *why)
{
    pthread_once(&load_once, load);
    if (!loaded) {
        *why = pm__fail(load_result, "%s", load_detail);
    }
    return loaded;
}

static pm_result known_result(CUresult rc)
{
    switch ((int)rc) {
#define PM_KNOWN_(name, value, text) \
    case value:                      \
        return name;
        PM_RESULT_LIST(PM_KNOWN_)
#undef PM_KNOWN_
    }
    return PM_ERROR_UNKNOWN;
}

pm_result pm__cuda_fail(CUresult rc, const char *call)
{
    const char *name = NULL;
    if (!loaded || loaded->get_error_name(rc, &name) != CUDA_SUCCESS || !name)
        name = "an unnamed error";
    return pm__fail_driver(known_result(rc), (int)rc, "%s failed: %s (%d)", call, name, (int)rc);
}
