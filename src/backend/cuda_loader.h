/* The CUDA driver, loaded at run time: dlopen("libcuda.so.1"), then
 * cuGetProcAddress for every symbol at the ABI version this code was written
 * against. No link-time dependency on libcuda or libcudart. Loaded once
 * (pthread_once) and never unloaded: other libraries may share the driver. */
#ifndef PINMEM_CUDA_LOADER_H
#define PINMEM_CUDA_LOADER_H

#include <cuda.h>

#include "pinmem.h"

/* Member names avoid the driver's own names, which cuda.h turns into macros. */
typedef struct pm__cuda_api {
    CUresult (*init)(unsigned int);
    CUresult (*driver_get_version)(int *);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc_host)(void **, size_t);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned int);
    CUresult (*mem_free_host)(void *);
    CUresult (*mem_host_register)(void *, size_t, unsigned int);
    CUresult (*mem_host_unregister)(void *);
    CUresult (*mem_host_get_flags)(unsigned int *, void *);
    CUresult (*mem_host_get_device_pointer)(CUdeviceptr *, void *, unsigned int);
    CUresult (*mem_get_address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_query)(CUstream);
    CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int);
    CUresult (*stream_get_id)(CUstream, unsigned long long *);
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_destroy)(CUevent);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*event_synchronize)(CUevent);
    /* Virtual memory management, for pool chunks: NULL where the driver lacks them. */
    CUresult (*mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*mem_address_free)(CUdeviceptr, size_t);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*mem_get_allocation_granularity)(size_t *, const CUmemAllocationProp *,
                                               CUmemAllocationGranularity_flags);
    /* pm_memcpy: copies in the direction their pointers give, what a pointer
     * is, and whether a stream is capturing. */
    CUresult (*memcpy_unified)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*memcpy_unified_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*pointer_get_attributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*thread_exchange_capture_mode)(CUstreamCaptureMode *);
    /* Many copies in one call (CUDA 13.0's form, then 12.8's with failIdx):
     * NULL where the driver lacks them. */
    CUresult (*memcpy_batch_async)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                   CUmemcpyAttributes *, size_t *, size_t, CUstream);
    CUresult (*memcpy_batch_async_12080)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                         CUmemcpyAttributes *, size_t *, size_t, size_t *,
                                         CUstream);
    /* Where a device sits on the PCI bus, for its NUMA node and link: NULL
     * where the driver lacks it. */
    CUresult (*device_get_pci_bus_id)(char *, int, CUdevice);
    /* The batch kernel (cuda_kernel.c): NULL where the driver lacks them. */
    CUresult (*module_load_data)(CUmodule *, const void *);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*module_unload)(CUmodule);
    CUresult (*launch_kernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
    CUresult (*stream_get_ctx)(CUstream, CUcontext *);
    /* A flag written in stream order, read by the staging engine's threads
     * instead of asking about an event: NULL where the driver lacks it. */
    CUresult (*stream_write_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    /* Work on a stream that waits for such a flag (cuda_flags.c). */
    CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
} pm__cuda_api;

/* The loaded driver, or NULL (and a detail, with the result in *why) when
 * there is none or it is too old. */
const pm__cuda_api *pm__cuda_api_load(pm_result *why);

/* Translates a driver code at the boundary, recording the raw code and a
 * detail naming the call. */
pm_result pm__cuda_fail(CUresult rc, const char *call);

#endif
