/* The cuda baseline: the driver's own calls, loaded here with dlopen and
 * cuGetProcAddress (each symbol at the ABI version its pointer type has), in
 * the primary context of the device pinmem uses, pushed around each call
 * where the thread has no context current, as pinmem does. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "baseline.h"

typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult *);

/* Member names avoid the driver's own, which cuda.h turns into macros. */
typedef struct driver {
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned int);
    CUresult (*mem_free_host)(void *);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_destroy)(CUevent);
    CUresult (*mem_pool_create)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*mem_pool_destroy)(CUmemoryPool);
    CUresult (*mem_pool_set_access)(CUmemoryPool, const CUmemAccessDesc *, size_t);
    CUresult (*mem_pool_set_attribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
} driver;
static driver cu;

#define SYM(member, name, version) {name, version, offsetof(driver, member)}
static const struct symbol {
    const char *name;
    int abi_version;
    size_t offset;
} symbols[] = {
    SYM(get_error_name, "cuGetErrorName", 6000),
    SYM(device_get, "cuDeviceGet", 2000),
    SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain", 7000),
    SYM(ctx_get_current, "cuCtxGetCurrent", 4000),
    SYM(ctx_push, "cuCtxPushCurrent", 4000),
    SYM(ctx_pop, "cuCtxPopCurrent", 4000),
    SYM(ctx_synchronize, "cuCtxSynchronize", 2000),
    SYM(mem_host_alloc, "cuMemHostAlloc", 2020),
    SYM(mem_free_host, "cuMemFreeHost", 2000),
    SYM(memcpy_htod, "cuMemcpyHtoD", 3020),
    SYM(memcpy_dtoh, "cuMemcpyDtoH", 3020),
    SYM(memcpy_htod_async, "cuMemcpyHtoDAsync", 3020),
    SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync", 3020),
    SYM(memcpy_async, "cuMemcpyAsync", 4000),
    SYM(stream_synchronize, "cuStreamSynchronize", 2000),
    SYM(event_create, "cuEventCreate", 2000),
    SYM(event_record, "cuEventRecord", 2000),
    SYM(event_destroy, "cuEventDestroy", 4000),
    SYM(mem_pool_create, "cuMemPoolCreate", 11020),
    SYM(mem_pool_destroy, "cuMemPoolDestroy", 11020),
    SYM(mem_pool_set_access, "cuMemPoolSetAccess", 11020),
    SYM(mem_pool_set_attribute, "cuMemPoolSetAttribute", 11020),
    SYM(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync", 11020),
    SYM(mem_free_async, "cuMemFreeAsync", 11020),
};
#undef SYM

static CUdevice device;
static CUcontext primary;

static pm_result driver_fail(CUresult rc, const char *call)
{
    const char *name = NULL;
    if (cu.get_error_name(rc, &name) != CUDA_SUCCESS || !name)
        name = "an unnamed error";
    return baseline_fail(rc == CUDA_ERROR_OUT_OF_MEMORY ? PM_ERROR_OUT_OF_MEMORY : PM_ERROR_UNKNOWN,
                         "%s failed: %s (%d)", call, name, (int)rc);
}

/* Pushes the primary context when the thread has none current; *pushed
 * says whether to pop it. */
static CUresult enter(int *pushed)
{
    CUcontext current = NULL;
    *pushed = 0;
    CUresult rc = cu.ctx_get_current(&current);
    if (rc != CUDA_SUCCESS || current)
        return rc;
    rc = cu.ctx_push(primary);
    *pushed = rc == CUDA_SUCCESS;
    return rc;
}

static void leave(int pushed)
{
    CUcontext popped;
    if (pushed)
        cu.ctx_pop(&popped);
}

#define IN_CONTEXT(name, expr)                                             \
    do {                                                                   \
        int pushed_;                                                       \
        CUresult rc_ = enter(&pushed_);                                    \
        if (rc_ == CUDA_SUCCESS)                                           \
            rc_ = (expr);                                                  \
        leave(pushed_);                                                    \
        return rc_ == CUDA_SUCCESS ? PM_SUCCESS : driver_fail(rc_, name);  \
    } while (0)

static pm_result pin(void **p, size_t bytes)
{
    IN_CONTEXT("cuMemHostAlloc", cu.mem_host_alloc(p, bytes, 0));
}

static pm_result unpin(void *p, size_t bytes)
{
    (void)bytes;
    IN_CONTEXT("cuMemFreeHost", cu.mem_free_host(p));
}

/* Fair to the driver: device access granted, nothing given back. */
static CUresult make_pool(CUmemoryPool *out)
{
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemoryPool p = NULL;
    CUresult rc = cu.mem_pool_create(&p, &props);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuuint64_t keep = UINT64_MAX;
    rc = cu.mem_pool_set_access(p, &access, 1);
    if (rc == CUDA_SUCCESS)
        rc = cu.mem_pool_set_attribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    if (rc != CUDA_SUCCESS)
        cu.mem_pool_destroy(p);
    else
        *out = p;
    return rc;
}

static pm_result pool_open(void **pool)
{
    IN_CONTEXT("cuMemPoolCreate (host)", make_pool((CUmemoryPool *)pool));
}

/* Host pool memory: its device pointer is its host address. */
static CUresult alloc_from_pool(CUmemoryPool pool, void **p, size_t bytes, CUstream s)
{
    CUdeviceptr d = 0;
    CUresult rc = cu.mem_alloc_from_pool_async(&d, bytes, pool, s);
    if (rc == CUDA_SUCCESS)
        *p = (void *)(uintptr_t)d;
    return rc;
}

/* pm_stream_t is a CUstream on the cuda backend. */
static pm_result pool_alloc(void *pool, void **p, size_t bytes, pm_stream_t s)
{
    IN_CONTEXT("cuMemAllocFromPoolAsync",
               alloc_from_pool((CUmemoryPool)pool, p, bytes, (CUstream)s));
}

static pm_result pool_free(void *pool, void *p, pm_stream_t s)
{
    (void)pool;
    IN_CONTEXT("cuMemFreeAsync", cu.mem_free_async((CUdeviceptr)(uintptr_t)p, (CUstream)s));
}

static CUresult drain_and_destroy(CUmemoryPool pool)
{
    CUresult rc = cu.ctx_synchronize();
    CUresult destroyed = cu.mem_pool_destroy(pool);
    return rc == CUDA_SUCCESS ? destroyed : rc;
}

static pm_result close_pool(void *pool)
{
    IN_CONTEXT("cuMemPoolDestroy", drain_and_destroy((CUmemoryPool)pool));
}

static void pool_close(void *pool) { close_pool(pool); }

static pm_result copy_htod(pm_deviceptr d, const void *src, size_t bytes)
{
    IN_CONTEXT("cuMemcpyHtoD", cu.memcpy_htod((CUdeviceptr)d, src, bytes));
}

static pm_result copy_dtoh(void *dst, pm_deviceptr d, size_t bytes)
{
    IN_CONTEXT("cuMemcpyDtoH", cu.memcpy_dtoh(dst, (CUdeviceptr)d, bytes));
}

static pm_result synchronize(void)
{
    IN_CONTEXT("cuStreamSynchronize", cu.stream_synchronize(NULL));
}

static pm_result copy_htod_queued(pm_deviceptr d, const void *src, size_t bytes)
{
    IN_CONTEXT("cuMemcpyHtoDAsync", cu.memcpy_htod_async((CUdeviceptr)d, src, bytes, NULL));
}

static pm_result copy_dtoh_queued(void *dst, pm_deviceptr d, size_t bytes)
{
    IN_CONTEXT("cuMemcpyDtoHAsync", cu.memcpy_dtoh_async(dst, (CUdeviceptr)d, bytes, NULL));
}

static pm_result copy_async(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s)
{
    IN_CONTEXT("cuMemcpyAsync",
               cu.memcpy_async((CUdeviceptr)dst, (CUdeviceptr)src, bytes, (CUstream)s));
}

static pm_result stream_synchronize(pm_stream_t s)
{
    IN_CONTEXT("cuStreamSynchronize", cu.stream_synchronize((CUstream)s));
}

/* Without timing, as the staging ring's markers. */
static pm_result marker_open(void **m)
{
    IN_CONTEXT("cuEventCreate", cu.event_create((CUevent *)m, CU_EVENT_DISABLE_TIMING));
}

static pm_result marker_record(void *m)
{
    IN_CONTEXT("cuEventRecord", cu.event_record((CUevent)m, NULL));
}

static pm_result destroy_marker(void *m)
{
    IN_CONTEXT("cuEventDestroy", cu.event_destroy((CUevent)m));
}

static void marker_close(void *m) { destroy_marker(m); }

static const baseline table = {
    .pin_name = "cuMemHostAlloc",
    .pin = pin,
    .unpin = unpin,
    .pool_name = "driver host pool",
    .pool_open = pool_open,
    .pool_alloc = pool_alloc,
    .pool_free = pool_free,
    .pool_close = pool_close,
    .copy_name = "cuMemcpyHtoD/DtoH",
    .copy_htod = copy_htod,
    .copy_dtoh = copy_dtoh,
    .synchronize = synchronize,
    .queued_name = "cuMemcpyHtoDAsync / DtoHAsync",
    .copy_htod_queued = copy_htod_queued,
    .marker_open = marker_open,
    .marker_record = marker_record,
    .marker_close = marker_close,
    .copy_dtoh_queued = copy_dtoh_queued,
    .async_name = "cuMemcpyAsync",
    .copy_async = copy_async,
    .stream_synchronize = stream_synchronize,
    .meaning = NULL,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int wanted_ordinal;
static const baseline *loaded;
static pm_result load_result;
static char load_detail[256];

/* Keeps the detail for every thread that asks, not only the loading one. */
static void load_failed(pm_result r)
{
    load_result = r;
    snprintf(load_detail, sizeof load_detail, "%s", baseline_detail());
}

/* The driver pinmem already loaded: dlopen gives the same library. */
static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_address_fn get = lib ? (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (!get) {
        load_failed(baseline_fail(PM_ERROR_NO_DEVICE, "no usable libcuda.so.1: %s",
                                  lib ? "no cuGetProcAddress_v2" : dlerror()));
        return;
    }
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult rc = get(symbols[i].name, &fn, symbols[i].abi_version, CU_GET_PROC_ADDRESS_DEFAULT,
                          &status);
        if (rc != CUDA_SUCCESS || !fn || status != CU_GET_PROC_ADDRESS_SUCCESS) {
            load_failed(baseline_fail(PM_ERROR_NOT_SUPPORTED, "the driver lacks %s (ABI %d)",
                                      symbols[i].name, symbols[i].abi_version));
            return;
        }
        memcpy((char *)&cu + symbols[i].offset, &fn, sizeof fn);
    }
    CUresult rc = cu.device_get(&device, wanted_ordinal);
    if (rc == CUDA_SUCCESS)
        rc = cu.primary_ctx_retain(&primary, device); /* kept: the process ends with it */
    if (rc != CUDA_SUCCESS) {
        load_failed(driver_fail(rc, "cuDevicePrimaryCtxRetain"));
        return;
    }
    loaded = &table;
}

/* One device a process: the first call's. */
const baseline *baseline_cuda(int device_ordinal)
{
    static pthread_mutex_t first = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&first);
    wanted_ordinal = device_ordinal;
    pthread_once(&once, load);
    pthread_mutex_unlock(&first);
    if (!loaded)
        baseline_fail(load_result, "%s", load_detail);
    return loaded;
}
