/* Whether driver VMM host allocations could back the pools: physical host
 * memory in granules (cuMemCreate with a HOST location) mapped into one
 * address range, so that free granules in holes could be unmapped and mapped
 * again where a large request needs them. Measures, beside cuMemHostAlloc and
 * cuMemHostRegister: the granule, the cost of create + map + access per
 * granule, CPU writes, copy speed to the device from the first byte, what the
 * host-memory queries answer, and whether unmapping or unregistering waits
 * for unrelated device work.
 * gcc -O2 -I/usr/local/cuda/include vmm_host.c -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

/* Prints a failing call that the probe goes on after. */
static CUresult report(const char *what, CUresult r)
{
    const char *name = NULL;
    cuGetErrorName(r, &name);
    if (r != CUDA_SUCCESS)
        printf("  %s: %s\n", what, name ? name : "?");
    return r;
}

static double copy_gbps(CUdeviceptr d, const void *src, size_t bytes)
{
    double best = 1e30;
    for (int k = 0; k < 5; k++) {
        double t0 = now_ms();
        if (cuMemcpyHtoD(d, src, bytes) != CUDA_SUCCESS)
            return 0;
        double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    return bytes / best / 1e6;
}

int main(void)
{
    enum { granules = 512 };
    CUstream stream;
    probe_context();
    TRY(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    size_t gran = 0, recommended = 0;
    TRY(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    TRY(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("vmm host: granularity %zu KiB (recommended %zu KiB)\n", gran >> 10, recommended >> 10);
    const size_t total = granules * gran;

    CUdeviceptr va = 0, d = 0;
    TRY(cuMemAddressReserve(&va, 2 * total, 0, 0, 0));
    TRY(cuMemAlloc(&d, total));
    CUmemAccessDesc access[2] = {
        {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
        {.location = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
    };
    CUmemGenericAllocationHandle handles[granules];
    double t_create = 0, t_map = 0, t_access = 0;
    for (int g = 0; g < granules; g++) {
        double t0 = now_ms();
        TRY(cuMemCreate(&handles[g], gran, &prop, 0));
        double t1 = now_ms();
        TRY(cuMemMap(va + g * gran, gran, 0, handles[g], 0));
        double t2 = now_ms();
        if (report("cuMemSetAccess(device + host)", cuMemSetAccess(va + g * gran, gran, access, 2)) !=
            CUDA_SUCCESS) {
            TRY(cuMemSetAccess(va + g * gran, gran, access, 1));
            if (g == 0)
                printf("  (device access only)\n");
        }
        double t3 = now_ms();
        t_create += t1 - t0, t_map += t2 - t1, t_access += t3 - t2;
    }
    printf("vmm host: %d granules (%zu MiB): create %.1f ms, map %.1f ms, set access %.1f ms "
           "(%.1f us a granule in all)\n",
           granules, total >> 20, t_create, t_map, t_access,
           (t_create + t_map + t_access) * 1e3 / granules);

    double t0 = now_ms();
    memset((void *)va, 1, total);
    double t_touch = now_ms() - t0;
    t0 = now_ms();
    memset((void *)va, 2, total);
    printf("vmm host: CPU memset %.1f ms first, %.1f ms again\n", t_touch, now_ms() - t0);

    void *pinned = NULL;
    t0 = now_ms();
    TRY(cuMemHostAlloc(&pinned, total, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    printf("cuMemHostAlloc of the same size: %.1f ms\n", now_ms() - t0);
    memset(pinned, 1, total);
    printf("H2D of %zu MiB: from vmm host memory %.1f GB/s, from cuMemHostAlloc memory %.1f GB/s\n",
           total >> 20, copy_gbps(d, (void *)va, total), copy_gbps(d, pinned, total));
    /* A copy that spans two granules mapped from different handles. */
    printf("H2D across a granule boundary: %s\n",
           cuMemcpyHtoD(d, (void *)(va + gran - 4096), 8192) == CUDA_SUCCESS ? "ok" : "failed");

    unsigned flags = 0;
    CUresult r = cuMemHostGetFlags(&flags, (void *)va);
    const char *name = NULL;
    cuGetErrorName(r, &name);
    printf("cuMemHostGetFlags on vmm host memory: %s\n", name);
    CUdeviceptr dp = 0;
    r = cuMemHostGetDevicePointer(&dp, (void *)va, 0);
    cuGetErrorName(r, &name);
    printf("cuMemHostGetDevicePointer: %s\n", name);
    unsigned memtype = 0;
    r = cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va);
    cuGetErrorName(r, &name);
    printf("CU_POINTER_ATTRIBUTE_MEMORY_TYPE: %s, %u (host %d, device %d)\n", name, memtype,
           CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE);

    /* Unmap, release and map again one granule while the device is busy with
     * unrelated work (a 1 GiB copy from the cuMemHostAlloc buffer, ~20 ms). */
    TRY(cuCtxSynchronize());
    TRY(cuMemcpyHtoDAsync(d, pinned, total, stream));
    t0 = now_ms();
    TRY(cuMemUnmap(va + 7 * gran, gran));
    double t_unmap = now_ms() - t0;
    t0 = now_ms();
    TRY(cuMemRelease(handles[7]));
    double t_release = now_ms() - t0;
    printf("while the device copies: unmap %.3f ms, release %.3f ms, copy still running: %s\n",
           t_unmap, t_release, cuStreamQuery(stream) == CUDA_ERROR_NOT_READY ? "yes" : "no");
    t0 = now_ms();
    TRY(cuMemMap(va + total + 3 * gran, gran, 0, handles[8], 0)); /* a second mapping of one handle */
    TRY(cuMemSetAccess(va + total + 3 * gran, gran, access, 2));
    printf("a second mapping of a granule elsewhere: %.3f ms; its bytes are the same: %s\n",
           now_ms() - t0,
           memcmp((void *)(va + total + 3 * gran), (void *)(va + 8 * gran), gran) == 0 ? "yes" : "no");
    TRY(cuStreamSynchronize(stream));

    void *user = aligned_alloc(4096, gran);
    memset(user, 3, gran);
    TRY(cuMemHostRegister(user, gran, CU_MEMHOSTREGISTER_PORTABLE));
    TRY(cuMemcpyHtoDAsync(d, pinned, total, stream));
    t0 = now_ms();
    TRY(cuMemHostUnregister(user));
    printf("while the device copies: cuMemHostUnregister of %zu KiB %.3f ms, copy still running: %s\n",
           gran >> 10, now_ms() - t0, cuStreamQuery(stream) == CUDA_ERROR_NOT_READY ? "yes" : "no");
    TRY(cuStreamSynchronize(stream));
    return 0;
}
