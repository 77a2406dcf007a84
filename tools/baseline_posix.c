/* The posix baseline: mmap + mlock, glibc malloc + free, and memcpy where the
 * cuda baseline has the driver's copy. "Device" memory is host memory there
 * (pm_device_alloc), so its copies are plain memcpy. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "baseline.h"

/* The system call itself: sanitizer runtimes turn mlock into a no-op. */
static pm_result pin(void **p, size_t bytes)
{
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return baseline_fail(PM_ERROR_OUT_OF_MEMORY, "mmap of %zu bytes: %s", bytes,
                             strerror(errno));
    if (syscall(SYS_mlock, m, bytes) != 0) {
        int err = errno;
        munmap(m, bytes);
        return baseline_fail(PM_ERROR_OUT_OF_MEMORY, "mlock of %zu bytes: %s%s", bytes,
                             strerror(err),
                             err == ENOMEM || err == EPERM ? " (RLIMIT_MEMLOCK; see ulimit -l)"
                                                           : "");
    }
    *p = m;
    return PM_SUCCESS;
}

static pm_result unpin(void *p, size_t bytes)
{
    munmap(p, bytes);
    return PM_SUCCESS;
}

static pm_result pool_open(void **pool)
{
    *pool = NULL;
    return PM_SUCCESS;
}

static pm_result pool_alloc(void *pool, void **p, size_t bytes, pm_stream_t s)
{
    (void)pool;
    (void)s;
    *p = malloc(bytes);
    return *p ? PM_SUCCESS : baseline_fail(PM_ERROR_OUT_OF_MEMORY, "malloc of %zu bytes failed", bytes);
}

static pm_result pool_free(void *pool, void *p, pm_stream_t s)
{
    (void)pool;
    (void)s;
    free(p);
    return PM_SUCCESS;
}

static void pool_close(void *pool) { (void)pool; }

static pm_result synchronize(void) { return pm_stream_synchronize(NULL); }

/* Ordered on the default stream, as the driver's synchronous copies are. */
static pm_result copy_htod(pm_deviceptr d, const void *src, size_t bytes)
{
    pm_result r = synchronize();
    if (r == PM_SUCCESS)
        memcpy((void *)(uintptr_t)d, src, bytes);
    return r;
}

static pm_result copy_dtoh(void *dst, pm_deviceptr d, size_t bytes)
{
    pm_result r = synchronize();
    if (r == PM_SUCCESS)
        memcpy(dst, (const void *)(uintptr_t)d, bytes);
    return r;
}

/* From page-locked memory pinmem queues the copy on the stream, whose thread
 * plays the DMA engine: the backend's own queued copy. */
static pm_result copy_htod_queued(pm_deviceptr d, const void *src, size_t bytes)
{
    return pm_memcpy_htod_async(d, src, bytes, NULL);
}

static pm_result copy_dtoh_queued(void *dst, pm_deviceptr d, size_t bytes)
{
    return pm_memcpy_dtoh_async(dst, d, bytes, NULL);
}

/* Whether p is host memory pinmem page-locked. */
static int page_locked(pm_deviceptr p)
{
    unsigned flags;
    return pm_mem_host_get_flags(&flags, (void *)(uintptr_t)p) == PM_SUCCESS;
}

static pm_result copy_async(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s)
{
    if (page_locked(dst) || page_locked(src))
        return pm_memcpy_async(dst, src, bytes, s);
    pm_result r = pm_stream_synchronize(s);
    if (r == PM_SUCCESS)
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return r;
}

static pm_result marker_open(void **m) { return pm_event_create((pm_event_t *)m); }
static pm_result marker_record(void *m) { return pm_event_record(m, NULL); }
static void marker_close(void *m) { pm_event_destroy(m); }

const baseline *baseline_posix(void)
{
    static const baseline b = {
        .pin_name = "mmap+mlock",
        .pin = pin,
        .unpin = unpin,
        .pool_name = "glibc malloc+free",
        .pool_open = pool_open,
        .pool_alloc = pool_alloc,
        .pool_free = pool_free,
        .pool_close = pool_close,
        .copy_name = "memcpy",
        .copy_htod = copy_htod,
        .copy_dtoh = copy_dtoh,
        .synchronize = synchronize,
        .queued_name = "pm_memcpy_htod_async / dtoh_async with page-locked memory",
        .copy_htod_queued = copy_htod_queued,
        .marker_open = marker_open,
        .marker_record = marker_record,
        .marker_close = marker_close,
        .copy_dtoh_queued = copy_dtoh_queued,
        .async_name = "memcpy after the stream's work (queued from page-locked memory)",
        .copy_async = copy_async,
        .stream_synchronize = pm_stream_synchronize,
        .meaning = "posix backend: \"device\" memory is host memory the backend simulates "
                   "device memory with (pm_device_alloc), and \"driver\" is the backend's own "
                   "copy, a memcpy after the default stream's work; the figures measure this "
                   "CPU's copies, not a GPU's",
    };
    return &b;
}
