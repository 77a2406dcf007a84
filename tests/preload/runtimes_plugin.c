/* A plugin of another CUDA runtime (the stand-in built as libcudart.so.12),
 * which test_preload_loader (a program of libcudart.so.13) loads with
 * RTLD_LOCAL: its calls are its runtime's, and so must reach that runtime,
 * preload or not. It hands its runtime's functions to the program. */
#include "cudart.h"

#define EXPORT __attribute__((visibility("default")))

cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaGetLastError(void);
int fake_calls(const char *name);

EXPORT cudaError_t plugin_malloc_host(void **p, size_t size)
{
    return cudaMallocHost(p, size);
}

EXPORT cudaError_t plugin_free_host(void *p)
{
    return cudaFreeHost(p);
}

EXPORT cudaError_t plugin_get_last_error(void)
{
    return cudaGetLastError();
}

EXPORT int plugin_fake_calls(const char *name)
{
    return fake_calls(name);
}
