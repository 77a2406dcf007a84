/* Pinned host memory: cudaHostAlloc, cudaMallocHost and cudaHostRegister
 * pin through pinmem (cold pinning several times faster than the driver's),
 * memory the driver knows as pinned, so every other runtime and driver call
 * answers for it as it would. The frees, unregistrations and queries of
 * that memory go to pinmem; of any other memory, to the runtime.
 *
 * pinmem serves only calls the runtime would let succeed: arguments the
 * runtime refuses go to the runtime for its answer. Write-combined memory
 * goes to the runtime too: pinmem would get it from the driver's own
 * allocation anyway, at the driver's speed. */
#include <stdint.h>

#include "preload.h"

static const unsigned alloc_flags = cudaHostAllocPortable | cudaHostAllocMapped;
static const unsigned register_flags =
    cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly;

/* Memory the preload allocated, which the driver knows as a registration of
 * pinmem's: the runtime's answers for it are those for its own allocations. */
static bool in_allocation(const void *p)
{
    const pm__pinmem_api *pm = pm__owned_any() ? pm__pinmem() : NULL;
    return pm && p && pm__owned_find(pm, p) == PM__OWNED_ALLOC;
}

/* The runtime's cudaErrorInvalidValue for such memory, produced by the same
 * runtime function with arguments it refuses that way (the driver's table:
 * NULL to cudaHostRegister or cudaHostUnregister, ordinary memory to
 * cudaFreeHost), so that the runtime records it as its last error. */
static char not_pinned;

static const pm__pinmem_api *serving(void)
{
    pm__preload_stats_arm();
    return pm__preload_wants(PM__PRELOAD_ALLOC) ? pm__pinmem() : NULL;
}

/* Serves an allocation the runtime would let succeed; false when the
 * runtime's own call must answer (a says whether pinmem tried). */
static bool try_alloc(pm__attempt *a, void **p, size_t size, unsigned flags)
{
    const pm__pinmem_api *pm = NULL;
    if (!p || size == 0 || (flags & ~alloc_flags) || !(pm = serving()))
        return false;
    void *got = NULL;
    pm_result r = pm->pm_mem_host_alloc(&got, size, flags);
    if (r == PM_SUCCESS && !pm__owned_add(got, size, PM__OWNED_ALLOC)) {
        pm->pm_mem_free_host(got);
        r = PM_ERROR_OUT_OF_MEMORY;
    }
    if (r != PM_SUCCESS) {
        pm__attempt_failed(a, pm, r);
        return false;
    }
    *p = got;
    pm__preload_count_served(a->fn, size);
    return true;
}

static cudaError_t host_alloc(pm__runtime runtime, void **pHost, size_t size, unsigned flags)
{
    pm__attempt a = {.fn = PM__FN_cudaHostAlloc, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    if (try_alloc(&a, pHost, size, flags))
        return cudaSuccess;
    return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaHostAlloc, pHost, size, flags));
}
PM__PRELOAD_ENTRIES(cudaHostAlloc, host_alloc, (void **pHost, size_t size, unsigned flags),
                    (pHost, size, flags))

static cudaError_t malloc_host(pm__runtime runtime, void **ptr, size_t size)
{
    pm__attempt a = {.fn = PM__FN_cudaMallocHost, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    if (try_alloc(&a, ptr, size, 0))
        return cudaSuccess;
    return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaMallocHost, ptr, size));
}
PM__PRELOAD_ENTRIES(cudaMallocHost, malloc_host, (void **ptr, size_t size), (ptr, size))

static bool try_register(pm__attempt *a, void *ptr, size_t size, unsigned flags)
{
    const pm__pinmem_api *pm = NULL;
    if (!ptr || size == 0 || (flags & ~register_flags) || !(pm = serving()))
        return false;
    pm_result r = pm->pm_mem_host_register(ptr, size, flags);
    if (r == PM_SUCCESS && !pm__owned_add(ptr, size, PM__OWNED_REGISTERED)) {
        pm->pm_mem_host_unregister(ptr);
        r = PM_ERROR_OUT_OF_MEMORY;
    }
    if (r != PM_SUCCESS) {
        pm__attempt_failed(a, pm, r);
        return false;
    }
    pm__preload_count_served(a->fn, size);
    return true;
}

static cudaError_t host_register(pm__runtime runtime, void *ptr, size_t size, unsigned flags)
{
    pm__attempt a = {.fn = PM__FN_cudaHostRegister, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    if (ptr && size && pm__owned_any() && pm__owned_overlaps(ptr, size, PM__OWNED_ALLOC))
        return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaHostRegister, NULL, 0, 0));
    if (try_register(&a, ptr, size, flags))
        return cudaSuccess;
    return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaHostRegister, ptr, size, flags));
}
PM__PRELOAD_ENTRIES(cudaHostRegister, host_register, (void *ptr, size_t size, unsigned flags),
                    (ptr, size, flags))

/* Memory pinmem pinned here goes back to pinmem, whatever the mode says now
 * (a feature turned off keeps serving what it handed out). Should pinmem
 * fail (the driver reporting an earlier error), the runtime's own call on
 * the same pointer gives the error the program sees, and records it as the
 * runtime's last error. */
static bool try_give_back(pm__attempt *a, void *p, pm__owned_kind kind)
{
    pm__preload_stats_arm();
    const pm__pinmem_api *pm = pm__owned_any() ? pm__pinmem() : NULL;
    size_t bytes = 0;
    if (!pm || !p || !pm__owned_take(p, kind, &bytes))
        return false;
    pm_result r = kind == PM__OWNED_ALLOC ? pm->pm_mem_free_host(p) : pm->pm_mem_host_unregister(p);
    if (r != PM_SUCCESS) {
        /* Refused inside a host function, pinmem freed nothing: the
         * program's free after it must find the memory still pinmem's. */
        if (r == PM_ERROR_NOT_PERMITTED)
            pm__owned_add(p, bytes, kind);
        pm__attempt_failed(a, pm, r);
        return false;
    }
    pm__preload_count_served(a->fn, bytes);
    return true;
}

static cudaError_t free_host(pm__runtime runtime, void *ptr)
{
    pm__attempt a = {.fn = PM__FN_cudaFreeHost, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    if (try_give_back(&a, ptr, PM__OWNED_ALLOC))
        return cudaSuccess;
    if (!a.tried && in_allocation(ptr)) /* inside one, not its start */
        return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaFreeHost, &not_pinned));
    return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaFreeHost, ptr));
}
PM__PRELOAD_ENTRIES(cudaFreeHost, free_host, (void *ptr), (ptr))

static cudaError_t host_unregister(pm__runtime runtime, void *ptr)
{
    pm__attempt a = {.fn = PM__FN_cudaHostUnregister, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    if (try_give_back(&a, ptr, PM__OWNED_REGISTERED))
        return cudaSuccess;
    if (!a.tried && in_allocation(ptr))
        return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaHostUnregister, NULL));
    return pm__attempt_settle(&a, PM__REAL_CALL(runtime, cudaHostUnregister, ptr));
}
PM__PRELOAD_ENTRIES(cudaHostUnregister, host_unregister, (void *ptr), (ptr))

/* The queries, for memory pinmem pinned here: the runtime answers first,
 * so that an error it must give (the context's sticky error) is the one the
 * program sees; for memory the preload allocated, pinmem then answers as
 * the driver does for the allocation the program asked for (its flags, not
 * those of pinmem's registration). Anything else the runtime answers. */
static const pm__pinmem_api *owner_of(const void *p)
{
    pm__preload_stats_arm();
    const pm__pinmem_api *pm = pm__owned_any() ? pm__pinmem() : NULL;
    return pm && pm__owned_find(pm, p) ? pm : NULL;
}

static cudaError_t host_get_flags(pm__runtime runtime, unsigned *pFlags, void *pHost)
{
    pm__attempt a = {.fn = PM__FN_cudaHostGetFlags, .runtime = runtime, .feature = PM__PRELOAD_ALLOC};
    const cudaError_t rc = PM__REAL_CALL(runtime, cudaHostGetFlags, pFlags, pHost);
    const pm__pinmem_api *pm = rc == cudaSuccess ? owner_of(pHost) : NULL;
    unsigned flags = 0;
    if (pm && pm->pm_mem_host_get_flags(&flags, pHost) == PM_SUCCESS) {
        *pFlags = flags;
        pm__preload_count_served(a.fn, 0);
        return cudaSuccess;
    }
    return pm__attempt_settle(&a, rc);
}
PM__PRELOAD_ENTRIES(cudaHostGetFlags, host_get_flags, (unsigned *pFlags, void *pHost),
                    (pFlags, pHost))

static cudaError_t host_get_device_pointer(pm__runtime runtime, void **pDevice, void *pHost,
                                           unsigned flags)
{
    pm__attempt a = {.fn = PM__FN_cudaHostGetDevicePointer, .runtime = runtime,
                     .feature = PM__PRELOAD_ALLOC};
    const cudaError_t rc = PM__REAL_CALL(runtime, cudaHostGetDevicePointer, pDevice, pHost, flags);
    const pm__pinmem_api *pm = rc == cudaSuccess ? owner_of(pHost) : NULL;
    pm_deviceptr d = 0;
    if (pm && pm->pm_mem_host_get_device_pointer(&d, pHost, 0) == PM_SUCCESS) {
        *pDevice = (void *)(uintptr_t)d;
        pm__preload_count_served(a.fn, 0);
        return cudaSuccess;
    }
    return pm__attempt_settle(&a, rc);
}
PM__PRELOAD_ENTRIES(cudaHostGetDevicePointer, host_get_device_pointer,
                    (void **pDevice, void *pHost, unsigned flags), (pDevice, pHost, flags))
