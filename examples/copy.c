/* Copies between plain malloc memory and device memory, at close to pinned speed. */
#include <pinmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(pm_result r, const char *what)
{
    if (r != PM_SUCCESS) {
        fprintf(stderr, "%s: %s: %s\n", what, pm_result_name(r), pm_last_error_detail());
        exit(1);
    }
}

int main(void)
{
    size_t bytes = 4 << 20;
    char *src = malloc(bytes), *back = calloc(1, bytes);
    void *target;
    pm_deviceptr dev;
    pm_stream_t stream;
    if (!src || !back)
        return 1;
    memset(src, 7, bytes);
    /* In a GPU program dev comes from cuMemAlloc or cudaMalloc. Here it is pinned host
     * memory seen through its device pointer, so that this runs on every backend. */
    check(pm_mem_alloc_host(&target, bytes), "pm_mem_alloc_host");
    check(pm_mem_host_get_device_pointer(&dev, target, 0), "pm_mem_host_get_device_pointer");
    check(pm_stream_create(&stream), "pm_stream_create");
    check(pm_memcpy_htod_async(dev, src, bytes, stream), "htod"); /* src reusable at once */
    check(pm_stream_synchronize(stream), "pm_stream_synchronize");
    check(pm_memcpy_dtoh(back, dev, bytes), "pm_memcpy_dtoh");
    int same = memcmp(src, back, bytes) == 0;
    printf("4 MiB to the device and back, %s backend: %s\n", pm_backend_name(),
           same ? "equal" : "DIFFERENT");
    check(pm_stream_destroy(stream), "pm_stream_destroy");
    check(pm_mem_free_host(target), "pm_mem_free_host");
    free(src);
    free(back);
    return same ? 0 : 1;
}
