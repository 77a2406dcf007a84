/* Contexts for streams and copies on hosts with several devices. */
#include "cuda_places.h"

#include <pthread.h>
#include <stdlib.h>

#include "../errors.h"
#include "../host_func.h"

static const pm__cuda_api *cu;
static CUcontext primary;
static int devices;
/* The primary context of each device, retained on first use by a copy and
 * kept until the process ends, as the driver keeps its own. */
static CUcontext *primaries;
static pthread_mutex_t primaries_lock = PTHREAD_MUTEX_INITIALIZER;

pm_result pm__cuda_places_open(const pm__cuda_api *api, CUcontext in_use, int device_count)
{
    cu = api;
    primary = in_use;
    devices = device_count;
    if (device_count > 1 && !primaries) {
        primaries = calloc((size_t)device_count, sizeof *primaries);
        if (!primaries)
            return pm__fail(PM_ERROR_OUT_OF_MEMORY, "the contexts of %d devices", device_count);
    }
    return PM_SUCCESS;
}

bool pm__cuda_legacy_is_home(void)
{
    CUcontext ctx = NULL;
    return cu->ctx_get_current(&ctx) == CUDA_SUCCESS && (!ctx || ctx == primary);
}

static bool is_stream_handle(pm_stream_t s)
{
    return s && (CUstream)s != CU_STREAM_LEGACY && (CUstream)s != CU_STREAM_PER_THREAD;
}

CUcontext pm__cuda_stream_context(pm_stream_t s)
{
    CUcontext ctx = NULL;
    if (is_stream_handle(s)) {
        if (cu->stream_get_ctx && cu->stream_get_ctx((CUstream)s, &ctx) == CUDA_SUCCESS && ctx)
            return ctx;
        return primary;
    }
    if (cu->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx)
        return ctx;
    return primary;
}

bool pm__cuda_context_held(CUcontext ctx)
{
    if (ctx == primary)
        return true;
    bool held = false;
    pthread_mutex_lock(&primaries_lock);
    for (int i = 0; primaries && i < devices && !held; i++)
        held = primaries[i] == ctx;
    pthread_mutex_unlock(&primaries_lock);
    return held && ctx;
}

bool pm__cuda_place_lasts(const pm__place *p) { return pm__cuda_context_held(p->context); }

void pm__cuda_memory_place(pm_deviceptr a, pm__place *out)
{
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_CONTEXT;
    CUcontext owner = NULL;
    void *data = &owner;
    out->context = NULL;
    if (cu->pointer_get_attributes(1, &attr, &data, (CUdeviceptr)a) == CUDA_SUCCESS && owner &&
        pm__cuda_context_held(owner))
        out->context = owner;
}

/* The primary context of device ordinal, retained once. */
static pm_result primary_of(int ordinal, CUcontext *out)
{
    pthread_mutex_lock(&primaries_lock);
    CUresult rc = CUDA_SUCCESS;
    if (!primaries[ordinal]) {
        CUdevice dev;
        rc = cu->device_get(&dev, ordinal);
        if (rc == CUDA_SUCCESS)
            rc = cu->primary_ctx_retain(&primaries[ordinal], dev);
    }
    *out = primaries[ordinal];
    pthread_mutex_unlock(&primaries_lock);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuDevicePrimaryCtxRetain");
}

/* The device whose memory dev is, or -1 where it is not device memory. */
static int device_of(pm_deviceptr dev)
{
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned int type = 0;
    int ordinal = -1;
    void *data[2] = {&type, &ordinal};
    if (cu->pointer_get_attributes(2, attrs, data, (CUdeviceptr)dev) != CUDA_SUCCESS)
        return -1;
    if (type != CU_MEMORYTYPE_DEVICE || ordinal < 0 || ordinal >= devices)
        return -1;
    return ordinal;
}

pm_result pm__cuda_copy_place(pm_stream_t s, pm_deviceptr a, pm_deviceptr b, pm__place *out)
{
    CUcontext ctx = NULL;
    if (is_stream_handle(s)) {
        ctx = pm__cuda_stream_context(s);
    } else if (cu->ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) {
        /* A thread without a context copies in the memory's device's. */
        int ordinal = devices > 1 ? device_of(a) : -1;
        if (ordinal < 0 && devices > 1 && b)
            ordinal = device_of(b);
        ctx = primary;
        if (ordinal >= 0) {
            pm_result r = primary_of(ordinal, &ctx);
            if (r != PM_SUCCESS)
                return r;
        }
    }
    out->context = ctx;
    return PM_SUCCESS;
}

/* The driver's thread that runs host functions may neither ask for nor
 * change its context (NOT_PERMITTED). Inside a host function, pinmem's or
 * another library's, the calls that reach here (host_func.h refused the
 * rest) are bound to a stream or event, so they go to the driver as they
 * are. */
static bool context_calls_refused(CUresult rc)
{
    return rc == CUDA_ERROR_NOT_PERMITTED && !pm__thread_calls_free();
}

bool pm__cuda_thread_runs_host_funcs(void)
{
    CUcontext current = NULL;
    return cu->ctx_get_current(&current) == CUDA_ERROR_NOT_PERMITTED;
}

pm_result pm__cuda_home_enter(pm__place_scope *scope)
{
    scope->pushed = false;
    CUcontext current = NULL;
    CUresult rc = cu->ctx_get_current(&current);
    if (context_calls_refused(rc))
        return PM_SUCCESS;
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuCtxGetCurrent");
    if (current)
        return PM_SUCCESS;
    rc = cu->ctx_push(primary);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuCtxPushCurrent");
    scope->pushed = true;
    return PM_SUCCESS;
}

pm_result pm__cuda_own_enter(pm__place_scope *scope)
{
    const pm__place own = {.context = primary};
    return pm__cuda_place_enter(&own, scope);
}

pm_result pm__cuda_place_enter(const pm__place *p, pm__place_scope *scope)
{
    scope->pushed = false;
    CUcontext current = NULL;
    if (!p->context)
        return PM_SUCCESS;
    CUresult rc = cu->ctx_get_current(&current);
    if (context_calls_refused(rc) || (rc == CUDA_SUCCESS && current == (CUcontext)p->context))
        return PM_SUCCESS;
    rc = cu->ctx_push((CUcontext)p->context);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuCtxPushCurrent");
    scope->pushed = true;
    return PM_SUCCESS;
}

void pm__cuda_place_leave(pm__place_scope *scope)
{
    CUcontext popped;
    if (scope->pushed)
        cu->ctx_pop(&popped);
    scope->pushed = false;
}

pm_result pm__cuda_device_alloc_on(pm_deviceptr *d, size_t bytesize, int ordinal)
{
    pm__place place = {.context = primary};
    if (devices > 1) {
        pm_result r = primary_of(ordinal, (CUcontext *)&place.context);
        if (r != PM_SUCCESS)
            return r;
    }
    pm__place_scope scope;
    pm_result r = pm__cuda_place_enter(&place, &scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = cu->mem_alloc((CUdeviceptr *)d, bytesize);
    pm__cuda_place_leave(&scope);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuMemAlloc");
}

pm_result pm__cuda_device_free(pm_deviceptr d)
{
    /* Freed in the context it was allocated in, whichever is current. */
    pm__place place = {.context = primary};
    CUcontext current = NULL;
    if (devices > 1) {
        CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_CONTEXT;
        CUcontext owner = NULL;
        void *data = &owner;
        if (cu->pointer_get_attributes(1, &attr, &data, (CUdeviceptr)d) == CUDA_SUCCESS && owner)
            place.context = owner;
    } else if (cu->ctx_get_current(&current) == CUDA_SUCCESS && current) {
        place.context = current;
    }
    pm__place_scope scope;
    pm_result r = pm__cuda_place_enter(&place, &scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = cu->mem_free((CUdeviceptr)d);
    pm__cuda_place_leave(&scope);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuMemFree");
}
