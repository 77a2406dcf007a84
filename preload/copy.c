/* Copies: cudaMemcpy and cudaMemcpyAsync (and their per-thread default
 * stream forms) between pageable host memory and device memory go through
 * pinmem's copy engine; every other copy is the runtime's.
 *
 * The semantics are the runtime's: a pageable source may be changed once the
 * call returns, a pageable destination holds the bytes when it returns, and
 * the copy is ordered on the stream as the runtime orders it. pinmem serves
 * a copy only when the runtime would accept it as it stands: a valid kind
 * that agrees with what the pointers are (the runtime's own pointer
 * attributes say), both ends of the host range pageable, the device side on
 * pinmem's device, and a stream that is not capturing (a capture gets the
 * runtime's own copy node). Copies pinmem would leave to the driver anyway
 * (up to its direct_max, or dtoh_direct_max from the device) go to the
 * runtime at once. The waits the preload
 * itself makes on the caller's thread run in relaxed capture mode, so that
 * another thread's capture survives them. */
#include <stdint.h>

#include "preload.h"

static bool attributes(pm__runtime runtime, const void *p, struct cudaPointerAttributes *attr)
{
    *attr = (struct cudaPointerAttributes){0};
    return PM__REAL_CALL(runtime, cudaPointerGetAttributes, attr, p) == cudaSuccess;
}

static bool pageable(pm__runtime runtime, const void *p, size_t count)
{
    struct cudaPointerAttributes first, last;
    return attributes(runtime, p, &first) && first.type == cudaMemoryTypeUnregistered &&
           attributes(runtime, (const char *)p + (count - 1), &last) &&
           last.type == cudaMemoryTypeUnregistered;
}

static bool on_device(pm__runtime runtime, const pm__pinmem_api *pm, const void *p)
{
    struct cudaPointerAttributes attr;
    return attributes(runtime, p, &attr) && attr.type == cudaMemoryTypeDevice &&
           (pm->device_ordinal < 0 || attr.device == pm->device_ordinal);
}

/* Which side is the host one: the kind names the direction, or (Default)
 * the pointers do. false: a copy pinmem does not take. */
static bool host_to_device(pm__runtime rt, const pm__pinmem_api *pm, void *dst, const void *src,
                           size_t count, enum cudaMemcpyKind kind, bool *htod)
{
    switch (kind) {
    case cudaMemcpyHostToDevice:
        *htod = true;
        return pageable(rt, src, count) && on_device(rt, pm, dst);
    case cudaMemcpyDeviceToHost:
        *htod = false;
        return pageable(rt, dst, count) && on_device(rt, pm, src);
    case cudaMemcpyDefault:
        if (on_device(rt, pm, dst) && pageable(rt, src, count))
            return *htod = true;
        *htod = false;
        return on_device(rt, pm, src) && pageable(rt, dst, count);
    default:
        return false;
    }
}

/* The legacy default stream is the current device's: pinmem's device must be
 * current for pinmem's threads to queue on the same one. */
static bool stream_serves(pm__runtime runtime, const pm__pinmem_api *pm, cudaStream_t stream,
                          bool per_thread)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStream_t asked = stream ? stream : per_thread ? cudaStreamPerThread : cudaStreamLegacy;
    if (PM__REAL_CALL(runtime, cudaStreamIsCapturing, asked, &status) != cudaSuccess ||
        status != cudaStreamCaptureStatusNone)
        return false;
    if (pm->device_ordinal < 0 || (asked != cudaStreamLegacy && asked != cudaStreamPerThread))
        return true;
    int current = -1;
    return PM__REAL_CALL(runtime, cudaGetDevice, &current) == cudaSuccess && current == pm->device_ordinal;
}

/* The calling thread's per-thread default stream, named or implied. */
static bool on_thread_stream(cudaStream_t stream, bool per_thread)
{
    return stream == cudaStreamPerThread || (stream == NULL && per_thread);
}

/* Moves a copy pinmem takes; false: the runtime's own copy must serve it. */
static bool move(pm__attempt *a, const pm__pinmem_api *pm, void *dst, const void *src,
                 size_t count, cudaStream_t stream, bool sync, bool htod, bool per_thread)
{
    const pm_deviceptr to = (pm_deviceptr)(uintptr_t)dst, from = (pm_deviceptr)(uintptr_t)src;
    const bool thread_stream = on_thread_stream(stream, per_thread);
    pm_result r;
    /* The runtime's synchronous copy from pageable memory waits for the
     * stream's earlier work first. */
    if (sync && htod &&
        PM__REAL_CALL(a->runtime, cudaStreamSynchronize,
                      thread_stream ? cudaStreamPerThread : stream) != cudaSuccess)
        return false;
    if (thread_stream) {
        /* pinmem keeps the copy in the per-thread stream's order (the
         * runtime's handle is pinmem's PM_STREAM_PER_THREAD). Should the
         * wait after a synchronous one fail, the runtime's own copy does the
         * copy again, in its order. */
        r = pm->pm_memcpy_async(to, from, count, PM_STREAM_PER_THREAD);
        if (r == PM_SUCCESS && sync &&
            PM__REAL_CALL(a->runtime, cudaStreamSynchronize, cudaStreamPerThread) != cudaSuccess)
            return false;
    } else if (sync && stream == NULL)
        r = pm->pm_memcpy(to, from, count);
    else
        r = pm->pm_memcpy_async(to, from, count, stream == cudaStreamLegacy ? NULL : stream);
    if (r != PM_SUCCESS) {
        pm__attempt_failed(a, pm, r);
        return false;
    }
    return true;
}

static bool try_copy(pm__attempt *a, void *dst, const void *src, size_t count,
                     enum cudaMemcpyKind kind, cudaStream_t stream, bool sync, bool per_thread)
{
    pm__preload_stats_arm();
    const pm__pinmem_api *pm = NULL;
    bool htod = false;
    if (count == 0 || !dst || !src || !pm__preload_wants(PM__PRELOAD_COPY) ||
        !(pm = pm__pinmem()) || (count <= pm->direct_max && count <= pm->dtoh_direct_max) ||
        !host_to_device(a->runtime, pm, dst, src, count, kind, &htod) ||
        count <= (htod ? pm->direct_max : pm->dtoh_direct_max) ||
        !stream_serves(a->runtime, pm, stream, per_thread))
        return false;
    /* A synchronous copy waits on this thread for the stream before it
     * (from the host) or for the per-thread stream after it: in
     * relaxed mode, so that neither disturbs another thread's capture. */
    enum cudaStreamCaptureMode mode;
    const bool relaxed =
        sync && (htod || on_thread_stream(stream, per_thread)) && pm__capture_relax(a->runtime, &mode);
    const bool served = move(a, pm, dst, src, count, stream, sync, htod, per_thread);
    if (relaxed)
        pm__capture_restore(a->runtime, mode);
    if (served)
        pm__preload_count_served(a->fn, count);
    return served;
}

/* The four entries: pinmem serves the copy, else the runtime's own function
 * (the per-thread stream's form where the caller used it). */
static cudaError_t copy_sync(pm__runtime runtime, bool per_thread, void *dst, const void *src,
                             size_t count, enum cudaMemcpyKind kind)
{
    pm__attempt a = {.fn = per_thread ? PM__FN_cudaMemcpy_ptds : PM__FN_cudaMemcpy,
                     .runtime = runtime, .feature = PM__PRELOAD_COPY};
    if (try_copy(&a, dst, src, count, kind, NULL, true, per_thread))
        return cudaSuccess;
    return pm__attempt_settle(&a, per_thread
                                      ? PM__REAL_CALL(runtime, cudaMemcpy_ptds, dst, src, count, kind)
                                      : PM__REAL_CALL(runtime, cudaMemcpy, dst, src, count, kind));
}

static cudaError_t copy_async(pm__runtime runtime, bool per_thread, void *dst, const void *src,
                              size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    pm__attempt a = {.fn = per_thread ? PM__FN_cudaMemcpyAsync_ptsz : PM__FN_cudaMemcpyAsync,
                     .runtime = runtime, .feature = PM__PRELOAD_COPY};
    if (try_copy(&a, dst, src, count, kind, stream, false, per_thread))
        return cudaSuccess;
    return pm__attempt_settle(
        &a, per_thread
                ? PM__REAL_CALL(runtime, cudaMemcpyAsync_ptsz, dst, src, count, kind, stream)
                : PM__REAL_CALL(runtime, cudaMemcpyAsync, dst, src, count, kind, stream));
}

#define PM__COPY_SYNC_PARAMS (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
#define PM__COPY_ASYNC_PARAMS                                                    \
    (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
PM__PRELOAD_ENTRIES(cudaMemcpy, copy_sync, PM__COPY_SYNC_PARAMS, (false, dst, src, count, kind))
PM__PRELOAD_ENTRIES(cudaMemcpy_ptds, copy_sync, PM__COPY_SYNC_PARAMS, (true, dst, src, count, kind))
PM__PRELOAD_ENTRIES(cudaMemcpyAsync, copy_async, PM__COPY_ASYNC_PARAMS,
                    (false, dst, src, count, kind, stream))
PM__PRELOAD_ENTRIES(cudaMemcpyAsync_ptsz, copy_async, PM__COPY_ASYNC_PARAMS,
                    (true, dst, src, count, kind, stream))
