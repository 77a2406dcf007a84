/* Whether host memory pinned while a context the user made is current
 * outlives that context: memory registered there and memory the driver
 * allocated there, PORTABLE or not, asked about in the primary context once
 * the user's context is destroyed (still registered? still mapped?).
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/context_lifetime.c -lcuda
 * ./probe_context_lifetime */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe.h"

enum { BYTES = 1 << 21 };

static const char *name_of(CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

static const char *mapped(void *p)
{
    unsigned char v;
    const long page = sysconf(_SC_PAGESIZE);
    void *start = (void *)((uintptr_t)p & ~(uintptr_t)(page - 1));
    return mincore(start, (size_t)page, &v) == 0 ? "mapped" : "unmapped";
}

static void ask(const char *what, void *p)
{
    unsigned flags = 0;
    CUresult r = cuMemHostGetFlags(&flags, p);
    printf("%-36s cuMemHostGetFlags %-24s flags 0x%x, %s\n", what, name_of(r),
           r == CUDA_SUCCESS ? flags : 0, mapped(p));
}

int main(void)
{
    CUcontext primary = probe_context();
    CUdevice dev;
    TRY(cuCtxGetDevice(&dev));
    static const struct {
        const char *name;
        unsigned flags;
    } kinds[] = {{"portable", 1}, {"not portable", 0}};
    for (int k = 0; k < 2; k++) {
        CUcontext theirs;
        CUctxCreateParams params = {0};
        TRY(cuCtxCreate(&theirs, &params, 0, dev));
        void *registered = aligned_alloc(4096, BYTES), *allocated = NULL;
        TRY(cuMemHostRegister(registered, BYTES, kinds[k].flags | CU_MEMHOSTREGISTER_DEVICEMAP));
        TRY(cuMemHostAlloc(&allocated, BYTES, kinds[k].flags | CU_MEMHOSTALLOC_DEVICEMAP));
        TRY(cuCtxDestroy(theirs));
        TRY(cuCtxSetCurrent(primary));
        printf("%s, the user's context destroyed:\n", kinds[k].name);
        ask("  registered there", registered);
        ask("  allocated there", allocated);
        CUresult again = cuMemHostRegister(registered, BYTES, CU_MEMHOSTREGISTER_PORTABLE);
        printf("  registering the first again          %s\n", name_of(again));
        if (again == CUDA_SUCCESS)
            cuMemHostUnregister(registered);
    }
    return 0;
}
