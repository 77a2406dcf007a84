/* The CUDA backend: the real driver, through cuda_loader. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../errors.h"
#include "../options.h"
#include "backend.h"
#include "cuda_devices.h"
#include "cuda_events.h"
#include "cuda_flags.h"
#include "cuda_kernel.h"
#include "cuda_loader.h"
#include "cuda_places.h"
#include "cuda_streams.h"
#include "cuda_vmm.h"

/* How a host allocation was pinned, kept in the range's backend_tag. */
enum { TAG_DRIVER_ALLOC = 1, TAG_MAPPED_REGISTERED = 2 };

/* One cuMemHostRegister call covers at most this much: R580 drivers refuse
 * single registrations of 512 GiB and more. */
static const size_t max_single_registration = (size_t)256 << 30;

static const pm__cuda_api *cu;
static CUdevice device;
static CUcontext primary;
static int device_count;

static CUresult register_in_pieces(void *p, size_t len, unsigned flags)
{
    uint8_t *base = p;
    size_t done = 0;
    CUresult rc = CUDA_SUCCESS;
    while (done < len && rc == CUDA_SUCCESS) {
        size_t piece = len - done < max_single_registration ? len - done : max_single_registration;
        rc = cu->mem_host_register(base + done, piece, flags);
        if (rc == CUDA_SUCCESS)
            done += piece;
    }
    if (rc != CUDA_SUCCESS)
        for (size_t undone = 0; undone < done; undone += max_single_registration)
            cu->mem_host_unregister(base + undone);
    return rc;
}

static void unregister_in_pieces(void *p, size_t len)
{
    for (size_t off = 0; off < len; off += max_single_registration)
        cu->mem_host_unregister((uint8_t *)p + off);
}

static pm_result driver_host_alloc(size_t bytesize, unsigned flags, void **base, size_t *pin_len,
                                   unsigned *tag)
{
    void *p = NULL;
    pm__place_scope scope;
    pm_result r = pm__cuda_own_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = cu->mem_host_alloc(&p, bytesize, flags);
    pm__cuda_place_leave(&scope);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuMemHostAlloc");
    /* The driver packs small allocations more tightly than pages, so the
     * extent pinmem claims is exactly the bytes it was given. */
    *base = p;
    *pin_len = bytesize;
    *tag = TAG_DRIVER_ALLOC;
    return PM_SUCCESS;
}

/* Map, bind to a NUMA node (unless -1), fault the pages in with several
 * threads (huge pages where the kernel gives them), then one registration of
 * pages that are all present. The driver's own cuMemHostAlloc does it all on
 * one thread. On failure nothing stays mapped; *rc says what the driver
 * answered (CUDA_SUCCESS when the failure came before it). */
static pm_result map_and_register(size_t bytesize, size_t align, int numa_node, void **base,
                                  size_t *len, CUresult *rc)
{
    *rc = CUDA_SUCCESS;
    void *p = pm__map_anonymous_aligned(bytesize, align, len);
    if (!p)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "mmap of %zu bytes failed: %s", bytesize,
                        strerror(errno));
    pm__place_scope scope;
    pm_result r = numa_node >= 0 ? pm__bind_to_node(p, *len, numa_node) : PM_SUCCESS;
    if (r == PM_SUCCESS)
        r = pm__cuda_own_enter(&scope);
    if (r != PM_SUCCESS) {
        munmap(p, *len);
        return r;
    }
    pm__prefault(p, *len, numa_node);
    *rc = register_in_pieces(p, *len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    pm__cuda_place_leave(&scope);
    if (*rc != CUDA_SUCCESS) {
        munmap(p, *len);
        return pm__cuda_fail(*rc, "cuMemHostRegister");
    }
    *base = p;
    return PM_SUCCESS;
}

static pm_result cuda_host_alloc(size_t bytesize, unsigned flags, int numa_node, void **base,
                                 size_t *pin_len, unsigned *tag)
{
    if (flags & PM_MEMHOSTALLOC_WRITECOMBINED)
        return driver_host_alloc(bytesize, flags, base, pin_len, tag);
    CUresult rc;
    pm__detail_saved before;
    pm__detail_save(&before);
    pm_result r = map_and_register(bytesize, 0, numa_node, base, pin_len, &rc);
    /* A stale registration the user never undid can sit at the address the
     * kernel just handed out; the driver picks its own address instead.
     * PORTABLE, as map_and_register pins: the staging ring comes from here,
     * and every device's context may use it (the caller's flags are what
     * pinmem answers for the memory, not what the driver was asked). */
    if (rc == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        r = driver_host_alloc(bytesize, flags | CU_MEMHOSTALLOC_PORTABLE, base, pin_len, tag);
        if (r == PM_SUCCESS)
            pm__detail_restore(&before);
        return r;
    }
    if (r == PM_SUCCESS)
        *tag = TAG_MAPPED_REGISTERED;
    return r;
}

/* What pinmem pins it keeps in its own context, which a context the user
 * made cannot take with it when destroyed (the driver frees or unregisters
 * what was pinned in a context with it). Freeing still waits for the device
 * work of the caller's context, as the driver's free does there. */
static void wait_as_a_free_would(void)
{
    CUcontext current = NULL;
    if (cu->ctx_get_current(&current) == CUDA_SUCCESS && current && current != primary)
        cu->ctx_synchronize();
}

static pm_result cuda_host_free(void *base, size_t pin_len, unsigned tag)
{
    wait_as_a_free_would();
    if (tag == TAG_DRIVER_ALLOC)
        PM__CUDA_CALL_IN(pm__cuda_own_enter, "cuMemFreeHost", cu->mem_free_host(base));
    pm__place_scope scope;
    pm_result r = pm__cuda_own_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    unregister_in_pieces(base, pin_len);
    pm__cuda_place_leave(&scope);
    munmap(base, pin_len);
    return PM_SUCCESS;
}

static pm_result cuda_host_register(void *p, size_t bytesize, unsigned flags)
{
    PM__CUDA_CALL("cuMemHostRegister", cu->mem_host_register(p, bytesize, flags));
}

static pm_result cuda_host_unregister(void *p, size_t bytesize)
{
    (void)bytesize;
    PM__CUDA_CALL("cuMemHostUnregister", cu->mem_host_unregister(p));
}

static pm_result cuda_foreign_get_device_pointer(pm_deviceptr *out, void *p)
{
    PM__CUDA_CALL("cuMemHostGetDevicePointer",
                  cu->mem_host_get_device_pointer((CUdeviceptr *)out, p, 0));
}

static pm_result vmm_chunk_commit(void *p, size_t len, int numa_node);

/* VMM host granules are mapped for every device at their host address,
 * where cuMemHostGetDevicePointer answers something else for VMM memory;
 * all else pinmem pinned is the driver's to answer. */
static pm_result cuda_device_pointer(pm_deviceptr *out, void *p, const pm__chunk_ops *pool_chunk)
{
    if (pool_chunk && pool_chunk->commit == vmm_chunk_commit) {
        *out = (pm_deviceptr)(uintptr_t)p;
        return PM_SUCCESS;
    }
    return cuda_foreign_get_device_pointer(out, p);
}

static pm_result cuda_foreign_free_host(void *p)
{
    PM__CUDA_CALL("cuMemFreeHost", cu->mem_free_host(p));
}

static pm_result cuda_foreign_unregister(void *p)
{
    PM__CUDA_CALL("cuMemHostUnregister", cu->mem_host_unregister(p));
}

static pm_result cuda_foreign_get_flags(unsigned *pflags, void *p)
{
    PM__CUDA_CALL("cuMemHostGetFlags", cu->mem_host_get_flags(pflags, p));
}

static pm_result cuda_foreign_get_address_range(pm_deviceptr *pbase, size_t *psize,
                                                pm_deviceptr dptr)
{
    CUdeviceptr base = 0;
    size_t size = 0;
    pm__place_scope scope;
    pm_result r = pm__cuda_home_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = cu->mem_get_address_range(pbase ? &base : NULL, psize ? &size : NULL,
                                            (CUdeviceptr)dptr);
    pm__cuda_place_leave(&scope);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuMemGetAddressRange");
    if (pbase)
        *pbase = (pm_deviceptr)base;
    if (psize)
        *psize = size;
    return PM_SUCCESS;
}

/* Pool chunks in VMM host granules (cuda_vmm.c), inside a context scope. */
static pm_result vmm_chunk_reserve(size_t len, size_t align, int numa_node, void **base)
{
    (void)numa_node; /* chosen per granule, when committed */
    pm__place_scope scope;
    pm_result r = pm__cuda_home_enter(&scope);
    if (r == PM_SUCCESS) {
        r = pm__cuda_vmm_reserve(len, align, base);
        pm__cuda_place_leave(&scope);
    }
    return r;
}

static pm_result vmm_chunk_commit(void *p, size_t len, int numa_node)
{
    pm__place_scope scope;
    pm_result r = pm__cuda_home_enter(&scope);
    if (r == PM_SUCCESS) {
        r = pm__cuda_vmm_commit(p, len, numa_node);
        pm__cuda_place_leave(&scope);
    }
    return r;
}

/* Runs fn(p, len) in a context, for calls that cannot fail usefully. */
static void in_context(void (*fn)(void *, size_t), void *p, size_t len)
{
    pm__place_scope scope;
    if (pm__cuda_own_enter(&scope) == PM_SUCCESS) {
        fn(p, len);
        pm__cuda_place_leave(&scope);
    }
}

static void vmm_chunk_decommit(void *p, size_t len) { in_context(pm__cuda_vmm_decommit, p, len); }

static void vmm_chunk_unreserve(void *base, size_t len)
{
    in_context(pm__cuda_vmm_unreserve, base, len);
}

/* Where the driver cannot do VMM host memory: a chunk is mapped, then pinned
 * whole with one registration, and given back whole (unregistering waits for
 * all device work). */
static pm_result registered_chunk_commit(void *p, size_t len, int numa_node)
{
    pm__place_scope scope;
    pm_result r = pm__cuda_own_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    pm__prefault(p, len, numa_node); /* bound when reserved, or placed by this touch */
    CUresult rc =
        register_in_pieces(p, len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    pm__cuda_place_leave(&scope);
    if (rc != CUDA_SUCCESS) {
        madvise(p, len, MADV_DONTNEED);
        return pm__cuda_fail(rc, "cuMemHostRegister");
    }
    return PM_SUCCESS;
}

static void registered_chunk_decommit(void *p, size_t len)
{
    in_context(unregister_in_pieces, p, len);
    madvise(p, len, MADV_DONTNEED);
}

static void registered_chunk_unreserve(void *base, size_t len) { munmap(base, len); }

/* Pools that keep their memory pin it in whole registered chunks: mapping,
 * faulting with all CPUs and one registration pin several times faster than
 * the driver commits VMM host granules, which it does on one thread at a time
 * (docs/design.md, "Trade-offs"; docs/performance.md). Pools with a release
 * threshold pin VMM host granules, where the driver has them: a granule goes
 * back without waiting for the device (giving back a registration waits for
 * all of it), and the pages of holes go back too. PINMEM_POOL_VMM=1 asks for
 * granules for every pool, =0 for registered chunks for every pool. */
static void pick_pool_chunks(pm__backend *out)
{
    static const pm__chunk_ops registered = {"registered chunks", 0, true,
                                             pm__reserve_chunk_range, registered_chunk_commit,
                                             registered_chunk_decommit, registered_chunk_unreserve,
                                             0};
    unsigned long long choice = pm__option_value(PM__OPT_POOL_VMM);
    bool never = choice == PM__POOL_VMM_NEVER, always = choice == PM__POOL_VMM_ALWAYS;
    size_t granule = never ? 0 : pm__cuda_vmm_open(cu);
    /* cuMemCreate takes whole granules only: they cannot shrink. */
    pm__chunk_ops vmm = {"VMM host granules", granule, false, vmm_chunk_reserve,
                         vmm_chunk_commit, vmm_chunk_decommit, vmm_chunk_unreserve, granule};
    out->pool_give_back = granule ? vmm : registered;
    out->pool_keep = always && granule ? vmm : registered;
}

_Static_assert(sizeof(pm_deviceptr) == sizeof(CUdeviceptr), "pm_deviceptr mirrors CUdeviceptr");

static pm_result cuda_device_alloc(pm_deviceptr *d, size_t bytesize)
{
    PM__CUDA_CALL("cuMemAlloc", cu->mem_alloc((CUdeviceptr *)d, bytesize));
}

/* The driver pins past RLIMIT_MEMLOCK (docs/driver-behavior.md). */
static size_t cuda_pinnable_bytes(void) { return SIZE_MAX; }

static pm_result cuda_copy_htod(pm_deviceptr d, const void *src, size_t bytesize)
{
    PM__CUDA_CALL("cuMemcpyHtoD", cu->memcpy_htod((CUdeviceptr)d, src, bytesize));
}

static pm_result cuda_copy_dtoh(void *dst, pm_deviceptr d, size_t bytesize)
{
    PM__CUDA_CALL("cuMemcpyDtoH", cu->memcpy_dtoh(dst, (CUdeviceptr)d, bytesize));
}

/* The driver itself returns early only for page-locked host memory. */
static pm_result cuda_copy_htod_async(pm_deviceptr d, const void *src, size_t bytesize,
                                      pm_stream_t s, bool host_pinned)
{
    (void)host_pinned;
    PM__CUDA_CALL("cuMemcpyHtoDAsync",
                  cu->memcpy_htod_async((CUdeviceptr)d, src, bytesize, (CUstream)s));
}

static pm_result cuda_copy_dtoh_async(void *dst, pm_deviceptr d, size_t bytesize, pm_stream_t s,
                                      bool host_pinned)
{
    (void)host_pinned;
    PM__CUDA_CALL("cuMemcpyDtoHAsync",
                  cu->memcpy_dtoh_async(dst, (CUdeviceptr)d, bytesize, (CUstream)s));
}

/* Pointer attributes belong to the process (unified addressing), so they are
 * asked without a context first: a batch asks about each of its pointers, and
 * finding or pushing a context would double the cost of each question. A
 * driver that wants a context for them gets pinmem's. */
static CUresult pointer_attributes(unsigned n, CUpointer_attribute *attrs, void **data,
                                   pm_deviceptr p)
{
    CUresult rc = cu->pointer_get_attributes(n, attrs, data, (CUdeviceptr)p);
    if (rc != CUDA_ERROR_INVALID_CONTEXT)
        return rc;
    pm__place_scope scope;
    if (pm__cuda_home_enter(&scope) != PM_SUCCESS)
        return rc;
    rc = cu->pointer_get_attributes(n, attrs, data, (CUdeviceptr)p);
    pm__cuda_place_leave(&scope);
    return rc;
}

/* The memory type, then (for memory the driver knows) the extent it knows:
 * host memory it pinned is copied by the driver only when the whole copy
 * lies in one such extent (it refuses copies that run past a registration's
 * end). Pageable memory gets the default answers (type 0), not an error, and
 * is most of what a batch asks about: the type alone costs the driver half
 * as much. Device memory answers the same from the start of its allocation
 * to its end. */
static pm_result cuda_pointer_extent(pm_deviceptr p, size_t bytes, pm__memory_kind *kind,
                                     pm_deviceptr *lo, pm_deviceptr *hi)
{
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned int type = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *data[3] = {&type, &start, &size};
    CUresult rc = pointer_attributes(1, attrs, data, p);
    if (rc == CUDA_SUCCESS && type != 0)
        rc = pointer_attributes(3, attrs, data, p);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuPointerGetAttributes");
    *lo = *hi = 0;
    if (type == 0) {
        *kind = PM__MEMORY_HOST;
    } else if (type == CU_MEMORYTYPE_HOST) {
        *kind = p >= start && p - start < size && bytes <= size - (p - start)
                    ? PM__MEMORY_HOST_DRIVER_PINNED
                    : PM__MEMORY_HOST;
    } else {
        *kind = PM__MEMORY_DEVICE;
        if (p >= start && p - start < size) {
            *lo = start;
            *hi = start + size;
        }
    }
    return PM_SUCCESS;
}

static pm_result cuda_pointer_kind(pm_deviceptr p, size_t bytes, pm__memory_kind *kind)
{
    pm_deviceptr lo, hi;
    return cuda_pointer_extent(p, bytes, kind, &lo, &hi);
}

/* The driver's batch copy refuses the legacy stream (NULL, or its handle). */
static bool takes_batches(pm_stream_t s)
{
    return (cu->memcpy_batch_async || cu->memcpy_batch_async_12080) && s != NULL &&
           (CUstream)s != CU_STREAM_LEGACY;
}

/* One cuMemcpyBatchAsync: a source access order for the copies that read
 * pageable memory during the call (the first read_now) and stream order for
 * the rest, no hints, no flags. */
static CUresult batch_call(const pm_deviceptr *dsts, const pm_deviceptr *srcs, const size_t *sizes,
                           size_t count, size_t read_now, CUstream s)
{
    CUmemcpyAttributes attrs[2];
    size_t first[2], n = 0;
    memset(attrs, 0, sizeof attrs);
    if (read_now > 0) {
        attrs[n].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
        first[n++] = 0;
    }
    if (read_now < count) {
        attrs[n].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        first[n++] = read_now;
    }
    /* The driver reads the arrays and writes none of them. */
    CUdeviceptr *d = (CUdeviceptr *)(uintptr_t)dsts, *f = (CUdeviceptr *)(uintptr_t)srcs;
    size_t *z = (size_t *)(uintptr_t)sizes;
    if (cu->memcpy_batch_async)
        return cu->memcpy_batch_async(d, f, z, count, attrs, first, n, s);
    size_t failed = SIZE_MAX;
    return cu->memcpy_batch_async_12080(d, f, z, count, attrs, first, n, &failed, s);
}

static pm_result cuda_copy_batch_async(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                       const size_t *sizes, size_t count, size_t read_now,
                                       pm_stream_t s, bool one_call, bool *batched)
{
    *batched = false;
    pm__place_scope scope;
    pm_result r = pm__cuda_home_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = CUDA_SUCCESS;
    const char *call = "cuMemcpyAsync";
    if (one_call && count > 1 && takes_batches(s)) {
        call = "cuMemcpyBatchAsync";
        rc = batch_call(dsts, srcs, sizes, count, read_now, (CUstream)s);
        *batched = rc == CUDA_SUCCESS;
    } else {
        for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++)
            rc = cu->memcpy_unified_async((CUdeviceptr)dsts[i], (CUdeviceptr)srcs[i], sizes[i],
                                          (CUstream)s);
    }
    pm__cuda_place_leave(&scope);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, call);
}

static pm_result cuda_copy_any(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s,
                               bool sync, bool device_only)
{
    (void)device_only; /* the driver knows */
    if (sync)
        PM__CUDA_CALL("cuMemcpy", cu->memcpy_unified((CUdeviceptr)dst, (CUdeviceptr)src, bytes));
    PM__CUDA_CALL("cuMemcpyAsync",
                  cu->memcpy_unified_async((CUdeviceptr)dst, (CUdeviceptr)src, bytes, (CUstream)s));
}

/* Pinned, not locked: the user may still unmap or discard the memory (the
 * cache hears of it and unregisters). */
static pm_result cuda_cache_register(void *p, size_t bytesize)
{
    PM__CUDA_CALL_IN(pm__cuda_own_enter, "cuMemHostRegister",
                     register_in_pieces(p, bytesize, CU_MEMHOSTREGISTER_PORTABLE |
                                                         CU_MEMHOSTREGISTER_DEVICEMAP));
}

static void cuda_cache_unregister(void *p, size_t bytesize)
{
    pm__place_scope scope;
    if (pm__cuda_own_enter(&scope) != PM_SUCCESS)
        return;
    unregister_in_pieces(p, bytesize);
    pm__cuda_place_leave(&scope);
}

/* The device the allocation behind p belongs to (its context's device). */
static pm_result cuda_pointer_device(pm_deviceptr p, int *ordinal)
{
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned int type = 0;
    int dev = -1;
    void *data[2] = {&type, &dev};
    CUresult rc = pointer_attributes(2, attrs, data, p);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuPointerGetAttributes");
    /* Type 0: memory the driver does not know; HOST: page-locked host memory. */
    if (type == 0 || type == CU_MEMORYTYPE_HOST || dev < 0 || dev >= device_count)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "%#llx is not device memory (memory type %u, device ordinal %d)",
                        (unsigned long long)p, type, dev);
    *ordinal = dev;
    return PM_SUCCESS;
}

/* The batch kernel runs in pinmem's primary context only: the calling
 * thread's context must be that one (or none, which pm__cuda_home_enter makes it),
 * and so must s's, for a launch on s to be legal. The legacy and
 * per-thread handles are the calling thread's context's. */
static bool cuda_block_copy_ready(pm_stream_t s)
{
    CUcontext current = NULL, of_stream = NULL;
    if (cu->ctx_get_current(&current) != CUDA_SUCCESS || (current && current != primary))
        return false;
    if (s && (CUstream)s != CU_STREAM_LEGACY && (CUstream)s != CU_STREAM_PER_THREAD &&
        (!cu->stream_get_ctx || cu->stream_get_ctx((CUstream)s, &of_stream) != CUDA_SUCCESS ||
         of_stream != primary))
        return false;
    return pm__cuda_kernel_loaded();
}

/* Device memory of pinmem's device, allocated in its primary context (or in
 * none, as VMM memory is), all of [p, p + bytes) in one allocation; host
 * memory pinned for every context, or in the primary one. Anything else may
 * not be mapped where the kernel runs, and a kernel that touches unmapped
 * memory breaks the whole context, where a DMA would only fail. */
static bool cuda_block_copy_reaches(pm_deviceptr p, size_t bytes)
{
    CUpointer_attribute attrs[5] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                    CU_POINTER_ATTRIBUTE_CONTEXT,
                                    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned int type = 0;
    int ordinal = -1;
    CUcontext ctx = NULL;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *data[5] = {&type, &ordinal, &ctx, &start, &size};
    CUresult rc = pointer_attributes(5, attrs, data, p);
    if (rc != CUDA_SUCCESS)
        return false;
    if (type == CU_MEMORYTYPE_DEVICE)
        return p >= start && p - start < size && bytes <= size - (p - start) &&
               ordinal == (int)pm__option_value(PM__OPT_DEVICE) && (!ctx || ctx == primary);
    if (type == CU_MEMORYTYPE_HOST) {
        unsigned flags = 0;
        if (ctx == primary)
            return true;
        pm__place_scope in;
        if (pm__cuda_home_enter(&in) != PM_SUCCESS)
            return false;
        rc = cu->mem_host_get_flags(&flags, (void *)(uintptr_t)p);
        pm__cuda_place_leave(&in);
        return rc == CUDA_SUCCESS && (flags & CU_MEMHOSTALLOC_PORTABLE);
    }
    return false;
}

static pm_result cuda_block_copy_async(const pm__block_copy *blocks, size_t count,
                                       unsigned long long largest, pm_stream_t s)
{
    PM__CUDA_CALL("cuLaunchKernel", pm__cuda_kernel_launch(blocks, count, largest, (CUstream)s));
}

static pm_result cuda_device_info(int ordinal, pm_device_info *info)
{
    return pm__cuda_device_info(ordinal, info);
}

static int attribute(CUdevice_attribute a, int fallback)
{
    int v = 0;
    return cu->device_get_attribute(&v, a, device) == CUDA_SUCCESS ? v : fallback;
}

static pm_result pick_device(void)
{
    int count = 0, ordinal = 0;
    CUresult rc = cu->device_get_count(&count);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuDeviceGetCount");
    if (count == 0)
        return pm__fail(PM_ERROR_NO_DEVICE, "the CUDA driver reports no device");
    unsigned long long v = pm__option_value(PM__OPT_DEVICE); /* 0 to INT_MAX */
    if (v >= (unsigned long long)count)
        return pm__fail(PM_ERROR_INVALID_DEVICE,
                        "PINMEM_DEVICE=%llu is not a device ordinal below %d", v, count);
    ordinal = (int)v;
    device_count = count;
    rc = cu->device_get(&device, ordinal);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuDeviceGet");
    rc = cu->primary_ctx_retain(&primary, device);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuDevicePrimaryCtxRetain");
    return PM_SUCCESS;
}

pm_result pm__backend_cuda_open(pm__backend *out)
{
    pm_result r = PM_SUCCESS;
    cu = pm__cuda_api_load(&r);
    if (!cu)
        return r;
    r = pick_device();
    if (r != PM_SUCCESS)
        return r;

    memset(out, 0, sizeof *out);
    out->name = "cuda";
    pm_capabilities *c = &out->caps;
    c->struct_size = sizeof *c;
    snprintf(c->backend, sizeof c->backend, "cuda");
    cu->driver_get_version(&c->driver_version);
    c->device_ordinal = (int)device;
    if (cu->device_get_name(c->device_name, (int)sizeof c->device_name, device) != CUDA_SUCCESS)
        snprintf(c->device_name, sizeof c->device_name, "unknown");
    pm__system_fill_caps(c);
    c->can_map_host_memory = attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0);
    c->unified_addressing = attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0);
    c->can_use_host_pointer_for_registered_mem =
        attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0);
    c->read_only_host_register_supported =
        attribute(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    c->pageable_memory_access_uses_host_page_tables =
        attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
    c->pinning_limited_by_memlock_rlimit = 0;
    c->host_numa_node = attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, c->host_numa_node);

    out->host_alloc = cuda_host_alloc;
    out->host_free = cuda_host_free;
    out->host_register = cuda_host_register;
    out->host_unregister = cuda_host_unregister;
    out->device_pointer = cuda_device_pointer;
    out->foreign_free_host = cuda_foreign_free_host;
    out->foreign_unregister = cuda_foreign_unregister;
    out->foreign_get_flags = cuda_foreign_get_flags;
    out->foreign_get_device_pointer = cuda_foreign_get_device_pointer;
    out->foreign_get_address_range = cuda_foreign_get_address_range;
    out->legacy_is_home = pm__cuda_legacy_is_home;
    out->thread_runs_host_funcs = pm__cuda_thread_runs_host_funcs;
    out->home.context = primary;
    pm__cuda_streams_open(cu, primary, out);
    pick_pool_chunks(out);
    out->device_alloc = cuda_device_alloc;
    out->pinnable_bytes = cuda_pinnable_bytes;
    out->copy_htod = cuda_copy_htod;
    out->copy_dtoh = cuda_copy_dtoh;
    out->cache_register = cuda_cache_register;
    out->registration_piece = max_single_registration;
    out->cache_unregister = cuda_cache_unregister;
    out->copy_htod_async = cuda_copy_htod_async;
    out->copy_dtoh_async = cuda_copy_dtoh_async;
    out->pointer_kind = cuda_pointer_kind;
    out->device_release = pm__cuda_device_free;
    out->device_alloc_on = pm__cuda_device_alloc_on;
    out->copy_any = cuda_copy_any;
    out->copy_batch_async = cuda_copy_batch_async;
    out->pointer_extent = cuda_pointer_extent;
    out->device_count = device_count;
    out->device_in_use = (int)pm__option_value(PM__OPT_DEVICE);
    out->device_info = cuda_device_info;
    out->pointer_device = cuda_pointer_device;
    out->copy_place = pm__cuda_copy_place;
    out->place_enter = pm__cuda_place_enter;
    out->place_lasts = pm__cuda_place_lasts;
    out->memory_place = pm__cuda_memory_place;
    out->place_leave = pm__cuda_place_leave;
    pm__cuda_devices_open(cu, out->device_in_use);
    pm__cuda_events_open(cu);
    pm__cuda_flags_open(cu, primary);
    r = pm__cuda_places_open(cu, primary, device_count);
    if (r != PM_SUCCESS)
        return r;
    pm__cuda_kernel_open(cu, device, primary,
                         c->unified_addressing && c->can_use_host_pointer_for_registered_mem);
    out->block_copy_ready = cuda_block_copy_ready;
    out->block_copy_reaches = cuda_block_copy_reaches;
    out->block_copy_async = cuda_block_copy_async;
    return PM_SUCCESS;
}
