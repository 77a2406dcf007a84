/* What the benchmarks compare pinmem with, on the backend pinmem runs on:
 * on cuda, the driver's own calls (libcuda.so.1, loaded by the benchmarks
 * themselves); on posix, the system's plain ways, with a memcpy standing in
 * for the driver's copy. The library uses none of it. */
#ifndef PINMEM_TOOL_BASELINE_H
#define PINMEM_TOOL_BASELINE_H

#include <stddef.h>

#include "pinmem.h"

typedef struct baseline {
    /* The plain way to pin memory: cuMemHostAlloc / cuMemFreeHost, or mmap + mlock. */
    const char *pin_name;
    pm_result (*pin)(void **p, size_t bytes);
    pm_result (*unpin)(void *p, size_t bytes);

    /* The pool benchmark's: the driver's host pool, device access granted and
     * nothing released (cuda), or glibc malloc + free (posix). */
    const char *pool_name;
    pm_result (*pool_open)(void **pool);
    pm_result (*pool_alloc)(void *pool, void **p, size_t bytes, pm_stream_t s);
    pm_result (*pool_free)(void *pool, void *p, pm_stream_t s);
    void (*pool_close)(void *pool);

    /* The driver's own synchronous copies between any host memory and device
     * memory from pm_device_alloc (cuMemcpyHtoD / cuMemcpyDtoH; posix: a
     * memcpy after the default stream's work, as the backend's own copy). */
    const char *copy_name;
    pm_result (*copy_htod)(pm_deviceptr d, const void *src, size_t bytes);
    pm_result (*copy_dtoh)(void *dst, pm_deviceptr d, size_t bytes);
    /* Waits for the default stream's work. */
    pm_result (*synchronize)(void);

    /* What the staging ring does for each piece: a copy from page-locked
     * memory queued on the default stream, and a marker (an event) recorded
     * again behind it. */
    const char *queued_name;
    pm_result (*copy_htod_queued)(pm_deviceptr d, const void *src, size_t bytes);
    pm_result (*marker_open)(void **m);
    pm_result (*marker_record)(void *m);
    void (*marker_close)(void *m);

    /* The DMA the other way: a copy into page-locked memory queued on the
     * default stream. */
    pm_result (*copy_dtoh_queued)(void *dst, pm_deviceptr d, size_t bytes);

    /* The driver's copy on a stream, direction from the pointers
     * (cuMemcpyAsync; posix: the backend's own copy, queued on the stream
     * where a host side is page-locked, else a memcpy after the stream's
     * work), and the wait for a stream (cuStreamSynchronize). pm_stream_t is
     * a CUstream on cuda. */
    const char *async_name;
    pm_result (*copy_async)(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s);
    pm_result (*stream_synchronize)(pm_stream_t s);

    /* What "device" and "driver" mean in the tables where it is not what the
     * words say (posix); NULL on cuda. */
    const char *meaning;
} baseline;

/* The baseline for the backend pinmem runs on; NULL after printing why,
 * prefixed by who. */
const baseline *baseline_open(const char *who);

/* Why the calling thread's last failing baseline call failed. */
const char *baseline_detail(void);
/* Records the detail and returns r. */
pm_result baseline_fail(pm_result r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Each backend's, NULL (with baseline_detail set) when it cannot run:
 * baseline_cuda.c (or baseline_cuda_absent.c) and baseline_posix.c. */
const baseline *baseline_cuda(int device_ordinal);
const baseline *baseline_posix(void);

#endif
