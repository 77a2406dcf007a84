/* What the driver answers to calls made inside a host function
 * (cuLaunchHostFunc), which its documentation says must make none and "may"
 * answer CUDA_ERROR_NOT_PERMITTED: synchronizing the function's own stream,
 * an event recorded behind it, the legacy stream, the context, another idle
 * stream; queries; allocating, registering and freeing page-locked memory,
 * host pools' calls, streams and events made and destroyed, device memory;
 * synchronous and asynchronous copies; default pools and device queries;
 * exit() from inside the function. Each call runs in a child of its
 * own, on a stream of its own and on the legacy stream, and a watchdog tells
 * a call that never returns.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/host_func_calls.c -lcuda
 * ./probe_host_func_calls */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

typedef struct place {
    CUstream stream; /* the one the function runs on */
    CUstream idle;   /* another, with nothing queued */
    CUevent behind;  /* recorded on stream after the function */
    CUevent done;    /* recorded and complete before it */
    CUdeviceptr device;
    void *pinned;
    CUmemoryPool host_pool;
} place;

static CUresult own_stream_sync(place *p) { return cuStreamSynchronize(p->stream); }
static CUresult own_stream_query(place *p) { return cuStreamQuery(p->stream); }
static CUresult event_behind_sync(place *p) { return cuEventSynchronize(p->behind); }
static CUresult event_behind_query(place *p) { return cuEventQuery(p->behind); }
static CUresult event_done_sync(place *p) { return cuEventSynchronize(p->done); }
static CUresult idle_stream_sync(place *p) { return cuStreamSynchronize(p->idle); }
static CUresult legacy_sync(place *p)
{
    (void)p;
    return cuStreamSynchronize(CU_STREAM_LEGACY);
}
static CUresult context_sync(place *p)
{
    (void)p;
    return cuCtxSynchronize();
}
static CUresult event_record(place *p) { return cuEventRecord(p->done, p->stream); }
static CUresult host_alloc_free(place *p)
{
    (void)p;
    void *h = NULL;
    CUresult r = cuMemHostAlloc(&h, 1 << 20, 0);
    return r != CUDA_SUCCESS ? r : cuMemFreeHost(h);
}
static CUresult free_host(place *p) { return cuMemFreeHost(p->pinned); }
static CUresult host_register(place *p)
{
    (void)p;
    static char buf[1 << 20] __attribute__((aligned(4096)));
    CUresult r = cuMemHostRegister(buf, sizeof buf, 0);
    return r != CUDA_SUCCESS ? r : cuMemHostUnregister(buf);
}
static CUresult host_flags(place *p)
{
    unsigned f;
    return cuMemHostGetFlags(&f, p->pinned);
}
static CUresult copy_sync_pageable(place *p)
{
    static char buf[4096];
    return cuMemcpyHtoD(p->device, buf, sizeof buf);
}
static CUresult copy_sync_pinned(place *p) { return cuMemcpyHtoD(p->device, p->pinned, 4096); }
static CUresult copy_async_pageable(place *p)
{
    static char buf[1 << 20];
    return cuMemcpyHtoDAsync(p->device, buf, sizeof buf, p->stream);
}
static CUresult copy_async_idle(place *p)
{
    static char buf[1 << 20];
    return cuMemcpyHtoDAsync(p->device, buf, sizeof buf, p->idle);
}

static CUresult address_range(place *p)
{
    CUdeviceptr base;
    size_t size;
    return cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p->pinned);
}
static CUresult device_pointer(place *p)
{
    CUdeviceptr d;
    return cuMemHostGetDevicePointer(&d, p->pinned, 0);
}
static CUresult pointer_attribute(place *p)
{
    unsigned type = 0;
    return cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 (CUdeviceptr)(uintptr_t)p->pinned);
}
static CUresult pool_pair_own(place *p)
{
    CUdeviceptr d;
    CUresult r = cuMemAllocFromPoolAsync(&d, 4096, p->host_pool, p->stream);
    return r != CUDA_SUCCESS ? r : cuMemFreeAsync(d, p->stream);
}
static CUresult pool_pair_idle(place *p)
{
    CUdeviceptr d;
    CUresult r = cuMemAllocFromPoolAsync(&d, 4096, p->host_pool, p->idle);
    return r != CUDA_SUCCESS ? r : cuMemFreeAsync(d, p->idle);
}
static CUmemPoolProps host_pool_props(void)
{
    CUmemPoolProps props = {0};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_HOST;
    return props;
}
static CUresult pool_create_destroy(place *p)
{
    (void)p;
    CUmemoryPool pool;
    CUmemPoolProps props = host_pool_props();
    CUresult r = cuMemPoolCreate(&pool, &props);
    return r != CUDA_SUCCESS ? r : cuMemPoolDestroy(pool);
}
static CUresult pool_trim(place *p) { return cuMemPoolTrimTo(p->host_pool, 0); }
static CUresult stream_create_destroy(place *p)
{
    (void)p;
    CUstream s;
    CUresult r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    return r != CUDA_SUCCESS ? r : cuStreamDestroy(s);
}
static CUresult event_create_destroy(place *p)
{
    (void)p;
    CUevent e;
    CUresult r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    return r != CUDA_SUCCESS ? r : cuEventDestroy(e);
}
static CUresult wait_event(place *p) { return cuStreamWaitEvent(p->idle, p->done, 0); }
static void CUDA_CB nothing(void *arg) { (void)arg; }
static CUresult launch_nested(place *p) { return cuLaunchHostFunc(p->idle, nothing, NULL); }
static CUresult device_alloc_free(place *p)
{
    (void)p;
    CUdeviceptr d;
    CUresult r = cuMemAlloc(&d, 1 << 20);
    return r != CUDA_SUCCESS ? r : cuMemFree(d);
}
static CUresult copy_dtoh_pageable(place *p)
{
    static char buf[4096];
    return cuMemcpyDtoH(buf, p->device, sizeof buf);
}

static CUresult per_thread_sync(place *p)
{
    (void)p;
    return cuStreamSynchronize(CU_STREAM_PER_THREAD);
}
static CUresult per_thread_record(place *p) { return cuEventRecord(p->done, CU_STREAM_PER_THREAD); }
static CUresult legacy_wait_event(place *p)
{
    return cuStreamWaitEvent(CU_STREAM_LEGACY, p->done, 0);
}
static CUresult legacy_launch(place *p)
{
    (void)p;
    return cuLaunchHostFunc(CU_STREAM_LEGACY, nothing, NULL);
}
static CUresult pool_attributes(place *p)
{
    cuuint64_t threshold = 0;
    CUresult r = cuMemPoolGetAttribute(p->host_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    return r != CUDA_SUCCESS
               ? r
               : cuMemPoolSetAttribute(p->host_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
}

static CUresult host_default_pool(place *p)
{
    (void)p;
    CUmemoryPool pool;
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    return cuMemGetDefaultMemPool(&pool, &where, CU_MEM_ALLOCATION_TYPE_PINNED);
}
static CUresult host_current_pool(place *p)
{
    (void)p;
    CUmemoryPool pool;
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    return cuMemGetMemPool(&pool, &where, CU_MEM_ALLOCATION_TYPE_PINNED);
}
static CUresult device_default_pool(place *p)
{
    (void)p;
    CUmemoryPool pool;
    return cuDeviceGetDefaultMemPool(&pool, 0);
}
static CUresult device_count(place *p)
{
    (void)p;
    int n = 0;
    return cuDeviceGetCount(&n);
}
static CUresult device_attribute(place *p)
{
    (void)p;
    int v = 0;
    return cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
}
static CUresult device_memory_info(place *p)
{
    (void)p;
    size_t free_bytes, total;
    return cuMemGetInfo(&free_bytes, &total);
}
/* Ends the process from inside the function: the status tells whether exit
 * ran to its end. */
static CUresult exit_process(place *p)
{
    (void)p;
    exit(7);
}

static const struct {
    const char *name;
    CUresult (*call)(place *);
} calls[] = {
    {"cuMemGetDefaultMemPool(host)", host_default_pool},
    {"cuMemGetMemPool(host)", host_current_pool},
    {"cuDeviceGetDefaultMemPool", device_default_pool},
    {"cuDeviceGetCount", device_count},
    {"cuDeviceGetAttribute", device_attribute},
    {"cuMemGetInfo", device_memory_info},
    {"exit(7)", exit_process},
    {"cuStreamSynchronize(per-thread)", per_thread_sync},
    {"cuEventRecord(per-thread)", per_thread_record},
    {"cuStreamWaitEvent(legacy, done event)", legacy_wait_event},
    {"cuLaunchHostFunc(legacy)", legacy_launch},
    {"cuMemPoolGet + SetAttribute", pool_attributes},
    {"cuMemGetAddressRange(pinned)", address_range},
    {"cuMemHostGetDevicePointer", device_pointer},
    {"cuPointerGetAttribute(memory type)", pointer_attribute},
    {"host pool alloc + free async, own", pool_pair_own},
    {"host pool alloc + free async, idle", pool_pair_idle},
    {"cuMemPoolCreate + Destroy (host)", pool_create_destroy},
    {"cuMemPoolTrimTo", pool_trim},
    {"cuStreamCreate + Destroy", stream_create_destroy},
    {"cuEventCreate + Destroy", event_create_destroy},
    {"cuStreamWaitEvent(idle, done event)", wait_event},
    {"cuLaunchHostFunc(idle)", launch_nested},
    {"cuMemAlloc + cuMemFree", device_alloc_free},
    {"cuMemcpyDtoH 4 KiB pageable", copy_dtoh_pageable},
    {"cuStreamSynchronize(own stream)", own_stream_sync},
    {"cuStreamQuery(own stream)", own_stream_query},
    {"cuEventSynchronize(event behind it)", event_behind_sync},
    {"cuEventQuery(event behind it)", event_behind_query},
    {"cuEventSynchronize(event done before)", event_done_sync},
    {"cuStreamSynchronize(idle stream)", idle_stream_sync},
    {"cuStreamSynchronize(legacy)", legacy_sync},
    {"cuCtxSynchronize", context_sync},
    {"cuEventRecord(own stream)", event_record},
    {"cuMemHostAlloc + cuMemFreeHost", host_alloc_free},
    {"cuMemFreeHost(made before)", free_host},
    {"cuMemHostRegister + Unregister", host_register},
    {"cuMemHostGetFlags", host_flags},
    {"cuMemcpyHtoD 4 KiB pageable", copy_sync_pageable},
    {"cuMemcpyHtoD 4 KiB pinned", copy_sync_pinned},
    {"cuMemcpyHtoDAsync 1 MiB pageable, own", copy_async_pageable},
    {"cuMemcpyHtoDAsync 1 MiB pageable, idle", copy_async_idle},
};

typedef struct job {
    place *p;
    unsigned which;
} job;

static void CUDA_CB run_call(void *arg)
{
    job *j = arg;
    CUresult r = calls[j->which].call(j->p);
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("%s", name);
    fflush(stdout);
}

/* A child: the call inside a host function on a stream of its own (or the
 * legacy stream), then the caller waits for that stream. */
static void child(unsigned which, int legacy)
{
    probe_context();
    place p = {0};
    job j = {&p, which};
    if (legacy)
        p.stream = CU_STREAM_LEGACY;
    else
        TRY(cuStreamCreate(&p.stream, CU_STREAM_NON_BLOCKING));
    TRY(cuStreamCreate(&p.idle, CU_STREAM_NON_BLOCKING));
    TRY(cuEventCreate(&p.behind, CU_EVENT_DISABLE_TIMING));
    TRY(cuEventCreate(&p.done, CU_EVENT_DISABLE_TIMING));
    TRY(cuMemAlloc(&p.device, 1 << 20));
    TRY(cuMemHostAlloc(&p.pinned, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP));
    CUmemPoolProps props = host_pool_props();
    TRY(cuMemPoolCreate(&p.host_pool, &props));
    TRY(cuEventRecord(p.done, p.stream));
    TRY(cuStreamSynchronize(p.stream));
    TRY(cuLaunchHostFunc(p.stream, run_call, &j));
    TRY(cuEventRecord(p.behind, p.stream));
    CUresult r = cuStreamSynchronize(p.stream);
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("; the caller's wait then: %s\n", name);
    fflush(stdout);
    _exit(0);
}

int main(void)
{
    for (int legacy = 0; legacy < 2; legacy++)
        for (unsigned i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            printf("%-8s %-40s ", legacy ? "legacy" : "own", calls[i].name);
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                alarm(5);
                child(i, legacy);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (WIFSIGNALED(status))
                printf("%s\n", WTERMSIG(status) == SIGALRM ? " ... did not return in 5 s"
                                                            : strsignal(WTERMSIG(status)));
            else if (WEXITSTATUS(status) != 0)
                printf("process ended with status %d\n", WEXITSTATUS(status));
        }
    return 0;
}
