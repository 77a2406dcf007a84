/* What the driver answers when a copy would write into memory registered
 * with CU_MEMHOSTREGISTER_READ_ONLY, and whether the bytes change: for a
 * writable buffer registered read-only and for pages made read-only
 * (PROT_READ) before their registration, by each copy call that can write
 * host memory; and, as a control, a copy that reads such memory. The pages
 * are written before they are made read-only, so none is the kernel's
 * shared zero page.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/read_only_copy.c -lcuda
 * ./probe_read_only_copy */
#include <string.h>
#include <sys/mman.h>

#include "probe.h"

enum { BYTES = 1 << 16 };

static const char *name_of(CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

/* Says what came of a copy that would have written value into host
 * (registered read-only). */
static void row(const char *memory, const char *call, CUresult r, const unsigned char *host,
                unsigned char value)
{
    printf("%-28s %-22s %-34s bytes %s\n", memory, call, name_of(r),
           host[0] == value ? "WRITTEN" : "unchanged");
}

/* The device's bytes set to value, for the next copy to bring. */
static unsigned char next_value(CUdeviceptr dev)
{
    static unsigned char value = 0x10;
    TRY(cuMemsetD8(dev, ++value, BYTES));
    return value;
}

/* cpu_writable: whether the process may write the pages (a host-to-host
 * copy into PROT_READ pages would fault in the driver's own memcpy). */
static void probe(const char *memory, unsigned char *host, CUdeviceptr dev, CUstream s,
                  int cpu_writable)
{
    TRY(cuMemHostRegister(host, BYTES, CU_MEMHOSTREGISTER_READ_ONLY));
    unsigned char v = next_value(dev);
    row(memory, "cuMemcpyDtoH", cuMemcpyDtoH(host, dev, BYTES), host, v);
    v = next_value(dev);
    CUresult r = cuMemcpyDtoHAsync(host, dev, BYTES, s);
    if (r == CUDA_SUCCESS)
        r = cuStreamSynchronize(s);
    row(memory, "cuMemcpyDtoHAsync", r, host, v);
    v = next_value(dev);
    row(memory, "cuMemcpy (unified)", cuMemcpy((CUdeviceptr)(uintptr_t)host, dev, BYTES), host, v);
    row(memory, "cuMemcpyHtoD (reads)", cuMemcpyHtoD(dev + BYTES, host, BYTES), host, 0);
    if (cpu_writable) {
        unsigned char source[64];
        memset(source, 0x7E, sizeof source);
        row(memory, "cuMemcpy host to host",
            cuMemcpy((CUdeviceptr)(uintptr_t)host, (CUdeviceptr)(uintptr_t)source, sizeof source),
            host, 0x7E);
    }
    TRY(cuMemHostUnregister(host));
}

int main(void)
{
    probe_context();
    CUdeviceptr dev;
    CUstream s;
    TRY(cuMemAlloc(&dev, 2 * BYTES));
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int supported = 0;
    CUdevice d;
    TRY(cuCtxGetDevice(&d));
    TRY(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, d));
    printf("read-only host registration supported: %d\n", supported);
    unsigned char *pages[2];
    for (int i = 0; i < 2; i++) {
        pages[i] = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages[i] == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset(pages[i], 0xAB, BYTES);
    }
    probe("writable, registered RO", pages[0], dev, s, 1);
    mprotect(pages[1], BYTES, PROT_READ);
    probe("PROT_READ, registered RO", pages[1], dev, s, 0);
    return 0;
}
