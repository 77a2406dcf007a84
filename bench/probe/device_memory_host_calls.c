/* What the driver's host-memory calls answer for device memory (cuMemAlloc):
 * registering it whole, in part and from inside, unregistering it, and its
 * flags and device pointer as host memory; and what /proc/self/maps says of
 * the pages (the POSIX backend must answer as the driver does here).
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/device_memory_host_calls.c -lcuda
 * ./probe_device_memory_host_calls */
#include <stdint.h>
#include <string.h>

#include "probe.h"

enum { BYTES = 1 << 21 };

static const char *name_of(CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

static void row(const char *call, CUresult r)
{
    printf("%-52s %s\n", call, name_of(r));
}

/* A registration row; one that succeeds is undone, so that the next row
 * starts from the same state. */
static void register_row(const char *call, void *p, size_t n, unsigned flags)
{
    CUresult r = cuMemHostRegister(p, n, flags);
    row(call, r);
    if (r == CUDA_SUCCESS)
        row("... cuMemHostUnregister of it", cuMemHostUnregister(p));
}

/* The line of /proc/self/maps that holds p, or a note that none does. */
static void mapping_of(uintptr_t p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= p && p < hi) {
            printf("mapping of the device memory: %s", line);
            fclose(f);
            return;
        }
    }
    printf("mapping of the device memory: none\n");
    if (f)
        fclose(f);
}

int main(void)
{
    probe_context();
    CUdeviceptr dev;
    TRY(cuMemAlloc(&dev, BYTES));
    void *p = (void *)(uintptr_t)dev;
    mapping_of((uintptr_t)dev);
    register_row("cuMemHostRegister(device, 2 MiB, 0)", p, BYTES, 0);
    register_row("cuMemHostRegister(device + 100, 1000, 0)", (char *)p + 100, 1000, 0);
    register_row("cuMemHostRegister(device, 4096, PORTABLE)", p, 4096,
                 CU_MEMHOSTREGISTER_PORTABLE);
    register_row("cuMemHostRegister(device, 4096, READ_ONLY)", p, 4096,
                 CU_MEMHOSTREGISTER_READ_ONLY);
    row("cuMemHostUnregister(device)", cuMemHostUnregister(p));
    unsigned flags = 0;
    row("cuMemHostGetFlags(device)", cuMemHostGetFlags(&flags, p));
    CUdeviceptr d2 = 0;
    row("cuMemHostGetDevicePointer(device)", cuMemHostGetDevicePointer(&d2, p, 0));
    row("cuMemFreeHost(device)", cuMemFreeHost(p));
    TRY(cuMemFree(dev));
    printf("after cuMemFree:\n");
    mapping_of((uintptr_t)dev);
    register_row("cuMemHostRegister(freed device memory, 4096, 0)", p, 4096, 0);
    return 0;
}
